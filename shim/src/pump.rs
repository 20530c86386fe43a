//! `alexandria mcp serve`: the byte pump between an MCP client's stdio and the daemon.
//!
//! Frames are newline-delimited JSON-RPC and pass through unchanged. The pump peeks at
//! each frame only to remember which requests are in flight and the client's
//! `initialize`, so that when the daemon goes away every in-flight request gets a
//! JSON-RPC error at once, and the next frame reconnects (starting a daemon if needed)
//! and replays the handshake before it is forwarded. Nothing but MCP frames is ever
//! written to stdout.
//!
//! A stopping daemon answers a request it will not start with `daemon_stopping`, and
//! once it has answered everything it started it says so (`CLOSING_NOTIFICATION`).
//! Those requests were never run: the pump sends them again to the next daemon (which
//! it starts if needed) instead of failing them, so a `daemon stop`, a signal or an
//! upgrade costs the client a short wait, not an error.

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::thread;
use std::time::Duration;

use alexandria_proto::{Binding, CLOSING_NOTIFICATION, ConnectionKind, ErrorCode, McpHello};
use anyhow::{Context, Result, anyhow};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::connect::{Connection, Connector};

/// JSON-RPC error code for "the daemon went away before answering".
const DAEMON_LOST: i64 = -32000;
const REPLAY_ID_PREFIX: &str = "alexandria-shim-replay-";
/// How a replayed request's id begins in a frame (a JSON string).
const REPLAY_ID_PREFIX_QUOTED: &str = "\"alexandria-shim-replay-";
/// How many times one request is sent again to a new daemon after a stopping one
/// said it never started it.
const MAX_RESENDS: u32 = 3;

/// The parts of a JSON-RPC frame the pump looks at.
#[derive(Deserialize)]
struct Peek<'a> {
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    method: Option<Cow<'a, str>>,
    #[serde(default)]
    error: Option<PeekError>,
}

#[derive(Deserialize)]
struct PeekError {
    #[serde(default)]
    data: Option<PeekErrorData>,
}

#[derive(Deserialize)]
struct PeekErrorData {
    #[serde(default)]
    code: Option<String>,
}

impl Peek<'_> {
    /// A stopping daemon's answer to a request it did not start.
    fn is_stopping_refusal(&self) -> bool {
        self.error
            .as_ref()
            .and_then(|e| e.data.as_ref())
            .and_then(|d| d.code.as_deref())
            == Some(ErrorCode::DaemonStopping.as_str())
    }
}

struct Link {
    writer: Option<UnixStream>,
    generation: u64,
}

/// A client request the daemon has not answered.
struct Pending {
    /// The connection it was sent on.
    generation: u64,
    /// In the order the client sent it, for sending again.
    seq: u64,
    /// The frame as the client sent it, to send again when a stopping daemon did not
    /// start it.
    frame: Vec<u8>,
    /// The daemon answered `daemon_stopping`: not started.
    refused: bool,
    resends: u32,
}

/// A request id with its pending state.
type Unanswered = (String, Pending);

/// What the pump must replay after reconnecting.
#[derive(Default)]
struct Session {
    initialize: Option<Vec<u8>>,
    initialized: Option<Vec<u8>>,
    replays: u64,
}

struct Shared {
    link: Mutex<Link>,
    /// Raw JSON id of each client request the daemon has not answered.
    inflight: Mutex<HashMap<String, Pending>>,
    session: Mutex<Session>,
    connector: Connector,
    binding: Binding,
    /// Fires when the reader of the latest connection finishes.
    reader_done: Mutex<Option<mpsc::Receiver<()>>>,
    next_seq: AtomicU64,
}

impl Shared {
    fn hello(&self, resumed: bool) -> ConnectionKind {
        ConnectionKind::Mcp(McpHello {
            binding: self.binding.clone(),
            parent_pid: std::os::unix::process::parent_id(),
            cwd: std::env::current_dir()
                .map(|d| d.display().to_string())
                .unwrap_or_default(),
            resumed,
        })
    }
}

pub struct PumpConfig {
    pub binding: Binding,
}

pub fn serve(connector: Connector, config: PumpConfig) -> Result<()> {
    let shared = Arc::new(Shared {
        link: Mutex::new(Link {
            writer: None,
            generation: 0,
        }),
        inflight: Mutex::new(HashMap::new()),
        session: Mutex::new(Session::default()),
        connector,
        binding: config.binding,
        reader_done: Mutex::new(None),
        next_seq: AtomicU64::new(0),
    });
    let connection = shared
        .connector
        .connect(shared.hello(false))
        .context("alexandria mcp serve could not reach the daemon")?;
    {
        let mut link = lock(&shared.link);
        install(&shared, &mut link, connection)?;
    }

    let stdin = io::stdin();
    let mut input = BufReader::with_capacity(64 * 1024, stdin.lock());
    let mut line = Vec::with_capacity(4096);
    loop {
        line.clear();
        let n = input
            .read_until(b'\n', &mut line)
            .context("reading stdin")?;
        if n == 0 {
            break;
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        if line.last() != Some(&b'\n') {
            line.push(b'\n');
        }
        let (request_id, method) = match serde_json::from_slice::<Peek>(&line) {
            Ok(peek) => (
                peek.id
                    .filter(|_| peek.method.is_some())
                    .map(|id| id.get().to_string()),
                peek.method.map(Cow::into_owned),
            ),
            // Not JSON: forward it anyway so the daemon answers with a parse error.
            Err(_) => (None, None),
        };
        match method.as_deref() {
            Some("initialize") => lock(&shared.session).initialize = Some(line.clone()),
            Some("notifications/initialized") => {
                lock(&shared.session).initialized = Some(line.clone());
            }
            _ => {}
        }
        let sent = forward(&shared, &line, request_id.as_deref());
        if let (Err(error), Some(id)) = (sent, request_id) {
            lock(&shared.inflight).remove(&id);
            write_stdout(&error_frame(
                &id,
                &format!("alexandria daemon unavailable: {error:#}"),
            ));
        }
    }

    // stdin closed: tell the daemon we are done and give it a moment to answer
    // what is still in flight.
    if let Some(writer) = lock(&shared.link).writer.as_ref() {
        let _ = writer.shutdown(Shutdown::Write);
    }
    let done = lock(&shared.reader_done).take();
    if let Some(done) = done {
        let _ = done.recv_timeout(Duration::from_secs(2));
    }
    Ok(())
}

/// Send one frame, reconnecting once if the link is down or breaks on write.
fn forward(shared: &Arc<Shared>, line: &[u8], request_id: Option<&str>) -> Result<()> {
    let mut link = lock(&shared.link);
    for attempt in 0..2 {
        connect_if_down(shared, &mut link)?;
        if let Some(id) = request_id {
            let seq = shared.next_seq.fetch_add(1, Ordering::SeqCst);
            lock(&shared.inflight).insert(
                id.to_string(),
                Pending {
                    generation: link.generation,
                    seq,
                    frame: line.to_vec(),
                    refused: false,
                    resends: 0,
                },
            );
        }
        let writer = link.writer.as_mut().expect("link was just established");
        match writer.write_all(line) {
            Ok(()) => return Ok(()),
            Err(e) => {
                if let Some(id) = request_id {
                    lock(&shared.inflight).remove(id);
                }
                link.writer = None;
                link.generation += 1;
                if attempt == 1 {
                    return Err(e).context("writing to the daemon");
                }
            }
        }
    }
    Err(anyhow!("could not deliver the frame"))
}

/// Connect (starting a daemon if needed) and replay the handshake, unless the link is up.
fn connect_if_down(shared: &Arc<Shared>, link: &mut Link) -> Result<()> {
    if link.writer.is_none() {
        let connection = shared.connector.connect(shared.hello(true))?;
        let connection = replay(connection, &mut lock(&shared.session))?;
        install(shared, link, connection)?;
    }
    Ok(())
}

/// Replay the client's handshake on a fresh connection so the daemon-side session
/// matches what the client believes.
fn replay(mut connection: Connection, session: &mut Session) -> Result<Connection> {
    let Some(initialize) = session.initialize.as_ref() else {
        return Ok(connection);
    };
    let mut frame: serde_json::Value =
        serde_json::from_slice(initialize).context("stored initialize frame")?;
    session.replays += 1;
    let replay_id = format!("{REPLAY_ID_PREFIX}{}", session.replays);
    frame["id"] = serde_json::Value::String(replay_id.clone());
    let mut bytes = serde_json::to_vec(&frame)?;
    bytes.push(b'\n');
    connection.stream.write_all(&bytes)?;
    connection
        .reader
        .get_ref()
        .set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut line = Vec::new();
    loop {
        line.clear();
        if connection.reader.read_until(b'\n', &mut line)? == 0 {
            return Err(anyhow!("the daemon closed the connection during replay"));
        }
        let peek: Peek = match serde_json::from_slice(&line) {
            Ok(peek) => peek,
            Err(_) => continue,
        };
        if peek.id.map(|id| id.get()) == Some(&format!("\"{replay_id}\"")) {
            break;
        }
    }
    connection.reader.get_ref().set_read_timeout(None)?;
    if let Some(initialized) = session.initialized.as_ref() {
        connection.stream.write_all(initialized)?;
    }
    Ok(connection)
}

/// Make `connection` the live link and start its reader thread.
fn install(shared: &Arc<Shared>, link: &mut Link, connection: Connection) -> Result<()> {
    link.generation += 1;
    let generation = link.generation;
    link.writer = Some(connection.stream);
    let (done_tx, done_rx) = mpsc::channel();
    let reader = connection.reader;
    let thread_shared = Arc::clone(shared);
    thread::Builder::new()
        .name("daemon-reader".into())
        .spawn(move || {
            let settled = pump_daemon_to_stdout(reader, &thread_shared, generation);
            connection_lost(&thread_shared, generation, settled);
            let _ = done_tx.send(());
        })
        .context("spawning the reader thread")?;
    *lock(&shared.reader_done) = Some(done_rx);
    Ok(())
}

/// Copy the daemon's frames to stdout until the connection ends. Returns whether the
/// daemon said it was closing with every request it started answered.
fn pump_daemon_to_stdout<R: Read>(
    mut reader: BufReader<R>,
    shared: &Shared,
    generation: u64,
) -> bool {
    let mut line = Vec::with_capacity(4096);
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return false,
            Ok(_) => {}
        }
        if line.last() != Some(&b'\n') {
            // A partial frame at EOF: the daemon died mid-write; drop it.
            return false;
        }
        if let Some(id) = result_id(&line) {
            // An answer (not an error, not a notification): parsing all of it to find
            // that out took about 40 µs for a 90 KB answer (a glob read), per call.
            if id.starts_with(REPLAY_ID_PREFIX_QUOTED.as_bytes()) {
                continue;
            }
            if let Ok(id) = std::str::from_utf8(id) {
                lock(&shared.inflight).remove(id);
            }
        } else if let Ok(peek) = serde_json::from_slice::<Peek>(&line) {
            if peek.id.is_none() && peek.method.as_deref() == Some(CLOSING_NOTIFICATION) {
                return true;
            }
            if peek.method.is_none()
                && let Some(id) = peek.id
            {
                if id.get().starts_with(REPLAY_ID_PREFIX_QUOTED) {
                    continue;
                }
                let mut inflight = lock(&shared.inflight);
                if peek.is_stopping_refusal()
                    && let Some(pending) = inflight.get_mut(id.get())
                    && pending.generation == generation
                    && pending.resends < MAX_RESENDS
                {
                    // Not started: it goes to the next daemon once this one is gone.
                    pending.refused = true;
                    continue;
                }
                inflight.remove(id.get());
            }
        }
        write_stdout(&line);
    }
}

/// The id of a JSON-RPC answer as the daemon writes it, `{"jsonrpc":"2.0","id":ID,"result":`
/// (ID a number or a string without escapes), exactly as it is in the frame; None for
/// anything else (errors, notifications, another layout), which is parsed as `Peek`.
fn result_id(frame: &[u8]) -> Option<&[u8]> {
    const HEAD: &[u8] = br#"{"jsonrpc":"2.0","id":"#;
    const RESULT: &[u8] = br#","result":"#;
    let rest = frame.strip_prefix(HEAD)?;
    let end = match rest.first()? {
        b'"' => {
            let close = rest[1..].iter().position(|b| *b == b'"')? + 1;
            if rest[1..close].contains(&b'\\') {
                return None;
            }
            close + 1
        }
        b'-' | b'0'..=b'9' => rest
            .iter()
            .position(|b| !matches!(b, b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9'))?,
        _ => return None,
    };
    rest[end..].starts_with(RESULT).then(|| &rest[..end])
}

/// The connection of `generation` is gone. Requests the daemon said it never started
/// (refused as stopping, or everything unanswered when it closed `settled`) go to the
/// next daemon; the others fail, since they may have been applied.
fn connection_lost(shared: &Arc<Shared>, generation: u64, settled: bool) {
    let mut link = lock(&shared.link);
    if link.generation == generation {
        link.writer = None;
    }
    let (mut again, lost): (Vec<Unanswered>, Vec<Unanswered>) = {
        let mut inflight = lock(&shared.inflight);
        let ids: Vec<String> = inflight
            .iter()
            .filter(|(_, p)| p.generation == generation)
            .map(|(id, _)| id.clone())
            .collect();
        ids.into_iter()
            .filter_map(|id| inflight.remove(&id).map(|p| (id, p)))
            .partition(|(_, p)| (settled || p.refused) && p.resends < MAX_RESENDS)
    };
    again.sort_by_key(|(_, p)| p.seq);
    let mut failed: Vec<(String, String)> = lost
        .into_iter()
        .map(|(id, _)| {
            (
                id,
                "the alexandria daemon stopped before answering this request; the shim will reconnect on the next request (a write may or may not have been applied: check with read or history before retrying)".to_string(),
            )
        })
        .collect();
    if !again.is_empty() {
        match connect_if_down(shared, &mut link) {
            Ok(()) => {
                let mut inflight = lock(&shared.inflight);
                for (id, mut pending) in again {
                    pending.generation = link.generation;
                    pending.refused = false;
                    pending.resends += 1;
                    let frame = pending.frame.clone();
                    inflight.insert(id.clone(), pending);
                    let written = link.writer.as_mut().map(|writer| writer.write_all(&frame));
                    if !matches!(written, Some(Ok(()))) {
                        // The new connection broke at once: its reader reports what
                        // was sent on it; this one was not.
                        inflight.remove(&id);
                        failed.push((
                            id,
                            "the alexandria daemon stopped before starting this request, and the next one could not be reached; send it again".into(),
                        ));
                    }
                }
            }
            Err(error) => {
                for (id, _) in again {
                    failed.push((
                        id,
                        format!(
                            "the alexandria daemon stopped before starting this request, and the next one could not be reached ({error:#}); send it again"
                        ),
                    ));
                }
            }
        }
    }
    drop(link);
    for (id, message) in failed {
        write_stdout(&error_frame(&id, &message));
    }
}

fn error_frame(raw_id: &str, message: &str) -> Vec<u8> {
    let id: serde_json::Value = serde_json::from_str(raw_id).unwrap_or(serde_json::Value::Null);
    let frame = serde_json::json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": DAEMON_LOST, "message": message, "data": {"code": "daemon_unavailable"}},
    });
    let mut bytes = serde_json::to_vec(&frame).expect("json value serializes");
    bytes.push(b'\n');
    bytes
}

fn write_stdout(frame: &[u8]) {
    let stdout = io::stdout();
    let mut out = stdout.lock();
    if out.write_all(frame).and_then(|()| out.flush()).is_err() {
        // The client closed our stdout: nobody is listening any more.
        std::process::exit(0);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The id the fast path finds is the one `Peek` finds, and it takes only answers.
    #[test]
    fn an_answer_s_id_is_found_without_parsing_the_answer() {
        let answers = [
            r#"{"jsonrpc":"2.0","id":69,"result":{"content":[]}}"#,
            r#"{"jsonrpc":"2.0","id":-3,"result":{}}"#,
            r#"{"jsonrpc":"2.0","id":"abc-1","result":{"isError":false}}"#,
            r#"{"jsonrpc":"2.0","id":"alexandria-shim-replay-7","result":{}}"#,
        ];
        for frame in answers {
            let peek: Peek = serde_json::from_str(frame).expect("valid");
            let id = peek.id.expect("an id").get();
            assert_eq!(result_id(frame.as_bytes()), Some(id.as_bytes()), "{frame}");
            assert!(peek.error.is_none() && peek.method.is_none());
        }
        let others = [
            // Errors, notifications, requests and other layouts go to `Peek`.
            r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32000,"message":"x"}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/alexandria/closing"}"#,
            r#"{"jsonrpc":"2.0","id":2,"method":"roots/list"}"#,
            r#"{"id":1,"jsonrpc":"2.0","result":{}}"#,
            r#"{"jsonrpc":"2.0","id":"a\"b","result":{}}"#,
            r#"{"jsonrpc":"2.0","id":null,"result":{}}"#,
            r#"{"jsonrpc":"2.0","id":12"#,
            r#"{"jsonrpc":"2.0","id":"unterminated"#,
        ];
        for frame in others {
            assert_eq!(result_id(frame.as_bytes()), None, "{frame}");
        }
    }
}
