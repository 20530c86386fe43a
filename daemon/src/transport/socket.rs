//! The Unix-socket transport: accept, check the peer's uid, handshake, then either an
//! MCP session (newline-delimited JSON-RPC relayed by the shim) or a control request.
//!
//! Frames are read here, not by rmcp, so that a malformed or oversized frame gets a
//! JSON-RPC error and the session goes on.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use alexandria_proto::{
    BUILD, ConnectionKind, Hello, HelloReply, MAX_FRAME_BYTES, McpHello, PROTOCOL_VERSION,
};
use futures::{SinkExt, StreamExt};
use rmcp::model::{ErrorData, JsonRpcError, JsonRpcMessage, RequestId};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::{RoleServer, ServiceExt};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use crate::context::{DaemonContext, InflightGuard};
use crate::mcp::AlexandriaServer;
use crate::mcp::sessions::SessionInfo;
use crate::transport::control;

const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
const HELLO_MAX_BYTES: usize = 64 * 1024;

/// Accept connections until the daemon shuts down.
pub async fn serve(listener: UnixListener, context: Arc<DaemonContext>) {
    let mut shutdown = context.shutdown_signal();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let context = Arc::clone(&context);
                    tokio::spawn(async move {
                        if let Err(error) = handle(stream, context).await {
                            tracing::debug!(%error, "connection ended with an error");
                        }
                    });
                }
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            _ = shutdown.changed() => break,
        }
    }
}

/// One frame read from a connection.
pub enum Frame {
    Line,
    TooLarge,
    Eof,
}

/// Read one `\n`-terminated frame into `buffer` (without the newline), refusing
/// frames over `max` bytes without buffering them.
pub async fn read_frame<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    buffer: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Frame> {
    let mut tail = Vec::new();
    read_frame_keeping_ends(reader, buffer, &mut tail, max).await
}

/// How much of an oversized frame's start and end is kept to find its id and method.
const KEEP_HEAD: usize = 64 * 1024;
const KEEP_TAIL: usize = 4 * 1024;

/// Like `read_frame`, but for an oversized frame `buffer` keeps its first bytes and
/// `tail` its last ones, so the request can still be answered by id.
pub async fn read_frame_keeping_ends<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    buffer: &mut Vec<u8>,
    tail: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Frame> {
    buffer.clear();
    tail.clear();
    let mut too_large = false;
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            return Ok(if too_large {
                Frame::TooLarge
            } else if buffer.is_empty() {
                Frame::Eof
            } else {
                Frame::Line
            });
        }
        let (take, done) = match available.iter().position(|b| *b == b'\n') {
            Some(i) => (i, true),
            None => (available.len(), false),
        };
        let chunk = &available[..take];
        if !too_large && buffer.len() + take > max {
            too_large = true;
            buffer.truncate(KEEP_HEAD);
        }
        if too_large {
            tail.extend_from_slice(chunk);
            if tail.len() > KEEP_TAIL {
                tail.drain(..tail.len() - KEEP_TAIL);
            }
        } else {
            buffer.extend_from_slice(chunk);
        }
        reader.consume(if done { take + 1 } else { take });
        if done {
            return Ok(if too_large {
                Frame::TooLarge
            } else {
                Frame::Line
            });
        }
    }
}

/// Find `"key": <scalar>` in a fragment of JSON: the value of the first occurrence
/// (in the head) or of the last one (in the tail).
fn sniff(fragment: &[u8], key: &str, last: bool) -> Option<serde_json::Value> {
    let text = String::from_utf8_lossy(fragment);
    let needle = format!("\"{key}\"");
    let position = if last {
        text.rfind(&needle)
    } else {
        text.find(&needle)
    }?;
    let rest = text[position + needle.len()..]
        .trim_start()
        .strip_prefix(':')?
        .trim_start();
    let end = if let Some(body) = rest.strip_prefix('"') {
        body.find('"')? + 2
    } else {
        rest.find(|c: char| !(c.is_ascii_digit() || c == '-'))
            .unwrap_or(rest.len())
    };
    serde_json::from_str(&rest[..end]).ok()
}

/// The answer to an oversized frame: a `too_large` tool error for `tools/call`, a
/// JSON-RPC error otherwise, addressed to the request's id when it can be found.
pub fn frame_too_large(head: &[u8], tail: &[u8]) -> TxJsonRpcMessage<RoleServer> {
    // Clients put "id" either before "params" (found in the head) or last (the tail).
    let params_at = String::from_utf8_lossy(head)
        .find("\"params\"")
        .unwrap_or(head.len());
    let id = sniff(&head[..params_at], "id", false).or_else(|| sniff(tail, "id", true));
    let method = sniff(&head[..params_at], "method", false).or_else(|| sniff(tail, "method", true));
    let message = format!("the message is larger than {MAX_FRAME_BYTES} bytes and was discarded");
    if let Some(id) = id.clone()
        && method.as_ref().and_then(|m| m.as_str()) == Some("tools/call")
    {
        let reply = serde_json::json!({
            "jsonrpc": "2.0",
            "id": id,
            "result": {
                "content": [{"type": "text", "text": format!("too_large: {message}\nhint: split the content into several smaller pages or calls")}],
                "structuredContent": {"error": {"code": "too_large", "message": message, "hint": "split the content into several smaller pages or calls", "limit_bytes": MAX_FRAME_BYTES}},
                "isError": true
            }
        });
        if let Ok(reply) = serde_json::from_value(reply) {
            return reply;
        }
    }
    let id = id.and_then(|id| serde_json::from_value::<RequestId>(id).ok());
    JsonRpcMessage::Error(JsonRpcError::new(
        id,
        ErrorData::invalid_request(message, None),
    ))
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

async fn write_line<W: AsyncWrite + Unpin>(writer: &mut W, line: &[u8]) -> std::io::Result<()> {
    writer.write_all(line).await?;
    writer.flush().await
}

async fn handle(stream: UnixStream, context: Arc<DaemonContext>) -> anyhow::Result<()> {
    // Trust is the OS user: only our own uid may talk to the daemon.
    let peer_uid = stream.peer_cred()?.uid();
    let own_uid = rustix::process::geteuid().as_raw();
    if peer_uid != own_uid {
        tracing::warn!(peer_uid, "refused a connection from another user");
        return Ok(());
    }
    let (read_half, mut write_half) = stream.into_split();
    let mut reader = BufReader::with_capacity(64 * 1024, read_half);
    let mut buffer = Vec::new();
    let frame = tokio::time::timeout(
        HELLO_TIMEOUT,
        read_frame(&mut reader, &mut buffer, HELLO_MAX_BYTES),
    )
    .await??;
    if !matches!(frame, Frame::Line) {
        return Ok(());
    }
    let refuse = |message: String| HelloReply::Refused {
        code: "bad_handshake".into(),
        message,
        hint: "the client and the daemon are different builds: reinstall alexandria".into(),
    };
    let value: serde_json::Value = match serde_json::from_slice(&buffer) {
        Ok(value) => value,
        Err(e) => {
            let reply = refuse(format!("the handshake is not JSON: {e}"));
            write_line(&mut write_half, &alexandria_proto::to_line(&reply)).await?;
            return Ok(());
        }
    };
    let peer_protocol = value.get("protocol").and_then(|p| p.as_u64()).unwrap_or(0);
    if peer_protocol != u64::from(PROTOCOL_VERSION) {
        let restarting = peer_protocol > u64::from(PROTOCOL_VERSION);
        let reply = HelloReply::ProtocolMismatch {
            protocol: PROTOCOL_VERSION,
            build: BUILD.into(),
            pid: std::process::id(),
            restarting,
        };
        write_line(&mut write_half, &alexandria_proto::to_line(&reply)).await?;
        if restarting {
            tracing::info!(peer_protocol, "a newer client asked; stepping down");
            context.shutdown();
        }
        return Ok(());
    }
    let hello: Hello = match serde_json::from_value(value) {
        Ok(hello) => hello,
        Err(e) => {
            let reply = refuse(format!("unexpected handshake: {e}"));
            write_line(&mut write_half, &alexandria_proto::to_line(&reply)).await?;
            return Ok(());
        }
    };
    // Same protocol, newer build: an upgrade was installed while we ran. Step down like
    // for a newer protocol, so the client (and every later one) gets the new daemon.
    if alexandria_proto::is_newer_build(&hello.build, BUILD) {
        let reply = HelloReply::Superseded {
            build: BUILD.into(),
            pid: std::process::id(),
        };
        write_line(&mut write_half, &alexandria_proto::to_line(&reply)).await?;
        tracing::info!(client_build = %hello.build, "a newer build asked; stepping down");
        context.shutdown();
        return Ok(());
    }
    let ready = HelloReply::Ready {
        protocol: PROTOCOL_VERSION,
        build: BUILD.into(),
        pid: std::process::id(),
    };
    write_line(&mut write_half, &alexandria_proto::to_line(&ready)).await?;
    match hello.kind {
        ConnectionKind::Control => control::handle(reader, write_half, context).await,
        ConnectionKind::Mcp(mcp) => serve_mcp(reader, write_half, context, mcp).await,
    }
}

/// The answer to a request read after the daemon began to stop: not started, send it
/// again (`daemon_stopping`; the shim does so itself, to the next daemon).
pub fn stopping_error(id: RequestId) -> TxJsonRpcMessage<RoleServer> {
    let code = alexandria_proto::ErrorCode::DaemonStopping.as_str();
    let message = "the alexandria daemon is stopping (daemon stop, a signal, or an upgrade) and did not start this request";
    let hint = "send the request again: the next daemon serves it (alexandria mcp serve reconnects by itself)";
    JsonRpcMessage::Error(JsonRpcError::new(
        Some(id),
        ErrorData::new(
            rmcp::model::ErrorCode(-32000),
            format!("{code}: {message}"),
            Some(
                serde_json::json!({"code": code, "message": message, "hint": hint, "retryable": true}),
            ),
        ),
    ))
}

/// The JSON-RPC error answering a frame that could not be parsed as MCP.
pub fn frame_error(bytes: &[u8], error: &serde_json::Error) -> TxJsonRpcMessage<RoleServer> {
    let error_data = if error.is_syntax() || error.is_eof() {
        return JsonRpcMessage::Error(JsonRpcError::new(
            None,
            ErrorData::parse_error(format!("parse error: {error}"), None),
        ));
    } else {
        error
    };
    let value: serde_json::Value = serde_json::from_slice(bytes).unwrap_or_default();
    if value.is_array() {
        return JsonRpcMessage::Error(JsonRpcError::new(
            None,
            ErrorData::invalid_request(
                "batches are not supported (JSON-RPC batching was removed in MCP 2025-06-18): send one message per line",
                None,
            ),
        ));
    }
    let id = value
        .get("id")
        .and_then(|id| serde_json::from_value::<RequestId>(id.clone()).ok());
    let data = if value.get("method").is_some() && id.is_some() {
        ErrorData::invalid_params(format!("invalid request: {error_data}"), None)
    } else {
        ErrorData::invalid_request(format!("invalid message: {error_data}"), None)
    };
    JsonRpcMessage::Error(JsonRpcError::new(id, data))
}

/// Largest buffer a connection keeps for its next frame (a larger answer's is freed).
const FRAME_BUFFER_KEPT: usize = 1 << 20;

async fn serve_mcp(
    mut reader: BufReader<tokio::net::unix::OwnedReadHalf>,
    mut writer: tokio::net::unix::OwnedWriteHalf,
    context: Arc<DaemonContext>,
    hello: McpHello,
) -> anyhow::Result<()> {
    let session = Arc::new(SessionInfo::new(
        "stdio",
        hello.binding,
        Some(hello.parent_pid),
        Some(hello.cwd),
        hello.resumed,
    ));
    context.sessions.register(Arc::clone(&session));
    let (mut to_server, from_client) =
        futures::channel::mpsc::channel::<RxJsonRpcMessage<RoleServer>>(64);
    let (to_client, mut outgoing) =
        futures::channel::mpsc::channel::<TxJsonRpcMessage<RoleServer>>(64);
    // Requests read and not yet answered: each holds one count of `context.inflight`
    // until its answer is written, so shutdown waits for it.
    let pending: Arc<Mutex<HashMap<RequestId, InflightGuard>>> = Arc::default();

    let answered = Arc::clone(&pending);
    let mut settled = context.inflight.settled();
    let writer_open = context.inflight.writer();
    let writer_task = tokio::spawn(async move {
        let _writer_open = writer_open;
        // Kept between frames: a 90 KB answer is not grown from nothing each time.
        let mut bytes = Vec::new();
        loop {
            let message = tokio::select! {
                biased;
                message = outgoing.next() => match message {
                    Some(message) => message,
                    None => break,
                },
                // Stopping, and every request admitted on this connection is answered:
                // say so, so the shim sends what it still waits for to the next daemon.
                () = async { let _ = settled.wait_for(|settled| *settled).await; } => {
                    let closing = serde_json::json!({
                        "jsonrpc": "2.0",
                        "method": alexandria_proto::CLOSING_NOTIFICATION,
                    });
                    let _ = write_line(&mut writer, &alexandria_proto::to_line(&closing)).await;
                    break;
                }
            };
            if let Err(error) = super::jsonline::write_line(&message, &mut bytes) {
                tracing::error!(%error, "cannot serialize an outgoing message");
                continue;
            }
            let written = writer.write_all(&bytes).await;
            if bytes.capacity() > FRAME_BUFFER_KEPT {
                bytes = Vec::new();
            }
            let id = match &message {
                JsonRpcMessage::Response(response) => Some(&response.id),
                JsonRpcMessage::Error(error) => error.id.as_ref(),
                _ => None,
            };
            if let Some(id) = id {
                lock(&answered).remove(id);
            }
            if written.is_err() {
                break;
            }
        }
        let _ = writer.shutdown().await;
    });

    let mut errors = to_client.clone();
    let inflight = Arc::clone(&context.inflight);
    let reader_task = tokio::spawn(async move {
        let mut buffer = Vec::with_capacity(4096);
        let mut tail = Vec::new();
        loop {
            // Frames are read until the connection closes, also while the daemon
            // stops: a request read then is answered `daemon_stopping` (not started),
            // so the shim knows it may send it again, instead of waiting for an answer
            // that never comes.
            let frame =
                read_frame_keeping_ends(&mut reader, &mut buffer, &mut tail, MAX_FRAME_BYTES).await;
            match frame {
                Ok(Frame::Eof) | Err(_) => break,
                Ok(Frame::TooLarge) => {
                    let message = frame_too_large(&buffer, &tail);
                    if errors.send(message).await.is_err() {
                        break;
                    }
                }
                Ok(Frame::Line) => {
                    if buffer.iter().all(u8::is_ascii_whitespace) {
                        continue;
                    }
                    match serde_json::from_slice::<RxJsonRpcMessage<RoleServer>>(&buffer) {
                        Ok(message) => {
                            if let JsonRpcMessage::Request(request) = &message {
                                // Admitted (counted until answered) or refused, in one
                                // step: shutdown's drain never misses a call.
                                let Some(guard) = inflight.try_begin() else {
                                    let refusal = stopping_error(request.id.clone());
                                    if errors.send(refusal).await.is_err() {
                                        break;
                                    }
                                    continue;
                                };
                                lock(&pending).insert(request.id.clone(), guard);
                            }
                            if to_server.send(message).await.is_err() {
                                break;
                            }
                        }
                        Err(error) => {
                            tracing::debug!(%error, "malformed frame");
                            if errors.send(frame_error(&buffer, &error)).await.is_err() {
                                break;
                            }
                        }
                    }
                }
            }
        }
        // The client is gone. While stopping, keep rmcp's input open (it quits when
        // its input ends) so the calls it runs finish; they are counted until then.
        if inflight.is_closed() {
            std::future::pending::<()>().await;
        }
    });

    let server = AlexandriaServer::new(Arc::clone(&context.store), Arc::clone(&session));
    match server.serve((to_client, from_client)).await {
        Ok(running) => {
            let _ = running.waiting().await;
        }
        Err(error) => tracing::debug!(%error, "mcp session did not start"),
    }
    reader_task.abort();
    let _ = writer_task.await;
    context.sessions.remove(&session.id);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_are_split_and_bounded() {
        let input: &[u8] = b"{\"a\":1}\nxxxxxxxxxxxxxxxxxxxx\n\nlast";
        let mut reader = BufReader::with_capacity(4, input);
        let mut buffer = Vec::new();
        assert!(matches!(
            read_frame(&mut reader, &mut buffer, 10).await,
            Ok(Frame::Line)
        ));
        assert_eq!(buffer, b"{\"a\":1}");
        assert!(matches!(
            read_frame(&mut reader, &mut buffer, 10).await,
            Ok(Frame::TooLarge)
        ));
        assert!(matches!(
            read_frame(&mut reader, &mut buffer, 10).await,
            Ok(Frame::Line)
        ));
        assert!(buffer.is_empty());
        assert!(matches!(
            read_frame(&mut reader, &mut buffer, 10).await,
            Ok(Frame::Line)
        ));
        assert_eq!(buffer, b"last");
        assert!(matches!(
            read_frame(&mut reader, &mut buffer, 10).await,
            Ok(Frame::Eof)
        ));
    }

    #[test]
    fn oversized_frames_are_answered_by_id() {
        let head = br#"{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"name":"write","arguments":{"content":"aaaa"#;
        let json = serde_json::to_value(frame_too_large(head, b"aaaa\"}}}")).expect("json");
        assert_eq!(json["id"], 42);
        assert_eq!(
            json["result"]["structuredContent"]["error"]["code"],
            "too_large"
        );
        let head = br#"{"method":"ping","params":{"x":"aaa"#;
        let json = serde_json::to_value(frame_too_large(
            head,
            br#"aaa"},"jsonrpc":"2.0","id":"abc"}"#,
        ))
        .expect("json");
        assert_eq!(json["id"], "abc");
        assert_eq!(json["error"]["code"], -32600);
        let json = serde_json::to_value(frame_too_large(b"garbage", b"")).expect("json");
        assert!(json.get("id").is_none());
    }

    #[test]
    fn malformed_frames_get_json_rpc_errors() {
        let cases: [(&[u8], i32, bool); 3] = [
            (b"{not json", -32700, false),
            (
                b"[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}]",
                -32600,
                false,
            ),
            (
                b"{\"jsonrpc\":\"2.0\",\"id\":7,\"nothing\":1}",
                -32600,
                true,
            ),
        ];
        for (bytes, code, has_id) in cases {
            let error = serde_json::from_slice::<RxJsonRpcMessage<RoleServer>>(bytes)
                .expect_err("malformed");
            let message = frame_error(bytes, &error);
            let json = serde_json::to_value(&message).expect("json");
            assert_eq!(json["error"]["code"], code, "{json}");
            assert_eq!(json.get("id").is_some(), has_id, "{json}");
        }
    }
}
