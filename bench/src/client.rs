//! Minimal MCP clients for the three ways in: the stdio shim (a child process), the
//! daemon's Unix socket spoken directly (the `Hello` handshake from `proto`, then
//! MCP frames), and Streamable HTTP on loopback. All speak raw JSON-RPC so the
//! client's own cost is the same small, constant amount on every transport.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use alexandria_proto::{BUILD, Binding, ConnectionKind, Hello, HelloReply, McpHello};
use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Value, json};

/// The MCP revision the benchmark's clients negotiate.
pub const PROTOCOL: &str = "2025-06-18";
/// Frames that are not the awaited answer (notifications) tolerated per request.
const MAX_SKIPPED_FRAMES: usize = 1000;

/// A JSON-RPC request/response channel to an MCP server.
pub trait Mcp {
    /// Send a request; the whole response frame.
    fn request(&mut self, method: &str, params: Value) -> Result<Value>;
    fn notify(&mut self, method: &str, params: Value) -> Result<()>;

    /// `initialize` + `notifications/initialized`; the initialize result.
    fn initialize(&mut self) -> Result<Value> {
        let reply = self.request(
            "initialize",
            json!({"protocolVersion": PROTOCOL, "capabilities": {},
                   "clientInfo": {"name": "alexandria-bench", "version": BUILD}}),
        )?;
        let result = reply
            .get("result")
            .cloned()
            .ok_or_else(|| anyhow!("initialize failed: {reply}"))?;
        self.notify("notifications/initialized", json!({}))?;
        Ok(result)
    }

    /// `tools/call`; the tool result, which must not be an error.
    fn call_tool(&mut self, name: &str, arguments: Value) -> Result<Value> {
        let reply = self.request("tools/call", json!({"name": name, "arguments": arguments}))?;
        let result = reply
            .get("result")
            .cloned()
            .ok_or_else(|| anyhow!("{name} failed: {reply}"))?;
        if result.get("isError") == Some(&Value::Bool(true)) {
            bail!(
                "{name} {arguments} returned an error: {}",
                result["content"][0]["text"]
            );
        }
        Ok(result)
    }

    fn ping(&mut self) -> Result<()> {
        let reply = self.request("ping", json!({}))?;
        if reply.get("result").is_none() {
            bail!("ping failed: {reply}");
        }
        Ok(())
    }
}

/// Newline-delimited JSON-RPC over any byte stream.
pub struct LineChannel<W: Write, R: BufRead> {
    writer: W,
    reader: R,
    next_id: i64,
    line: String,
    out: Vec<u8>,
}

impl<W: Write, R: BufRead> LineChannel<W, R> {
    pub fn new(writer: W, reader: R) -> LineChannel<W, R> {
        LineChannel {
            writer,
            reader,
            next_id: 1,
            line: String::new(),
            out: Vec::with_capacity(4096),
        }
    }

    fn send(&mut self, frame: &Value) -> Result<()> {
        self.out.clear();
        serde_json::to_writer(&mut self.out, frame)?;
        self.out.push(b'\n');
        self.writer
            .write_all(&self.out)
            .context("cannot send a frame")?;
        self.writer.flush().context("cannot send a frame")
    }

    fn receive(&mut self) -> Result<Value> {
        self.line.clear();
        if self.reader.read_line(&mut self.line)? == 0 {
            bail!("the server closed the connection");
        }
        serde_json::from_str(&self.line)
            .with_context(|| format!("not a JSON line: {:?}", self.line))
    }

    /// Send a request frame and return the first frame carrying its id (an echo
    /// server returns the request itself, which is fine for a floor).
    pub fn round_trip(&mut self, method: &str, params: Value, echo: bool) -> Result<Value> {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))?;
        for _ in 0..MAX_SKIPPED_FRAMES {
            let frame = self.receive()?;
            if frame.get("id") == Some(&json!(id)) && (echo || frame.get("method").is_none()) {
                return Ok(frame);
            }
        }
        bail!("no answer to request {id} among {MAX_SKIPPED_FRAMES} frames")
    }
}

impl<W: Write, R: BufRead> Mcp for LineChannel<W, R> {
    fn request(&mut self, method: &str, params: Value) -> Result<Value> {
        self.round_trip(method, params, false)
    }

    fn notify(&mut self, method: &str, params: Value) -> Result<()> {
        self.send(&json!({"jsonrpc": "2.0", "method": method, "params": params}))
    }
}

/// `alexandria mcp serve` as a child process.
pub struct Shim {
    pub child: Child,
    /// `None` once closed.
    channel: Option<LineChannel<ChildStdin, BufReader<ChildStdout>>>,
}

impl Shim {
    /// Spawn the shim from a prepared command (environment already set).
    pub fn spawn(mut command: Command) -> Result<Shim> {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("cannot spawn alexandria mcp serve")?;
        let stdin = child.stdin.take().context("shim stdin")?;
        let stdout = child.stdout.take().context("shim stdout")?;
        Ok(Shim {
            child,
            channel: Some(LineChannel::new(stdin, BufReader::new(stdout))),
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Close stdin and wait for the shim to exit (it must, on EOF).
    pub fn close(mut self) -> Result<()> {
        drop(self.channel.take());
        self.child.wait().context("waiting for the shim")?;
        Ok(())
    }

    fn channel(&mut self) -> Result<&mut LineChannel<ChildStdin, BufReader<ChildStdout>>> {
        self.channel
            .as_mut()
            .ok_or_else(|| anyhow!("the shim was closed"))
    }
}

impl Mcp for Shim {
    fn request(&mut self, method: &str, params: Value) -> Result<Value> {
        self.channel()?.request(method, params)
    }
    fn notify(&mut self, method: &str, params: Value) -> Result<()> {
        self.channel()?.notify(method, params)
    }
}

impl Drop for Shim {
    fn drop(&mut self) {
        if self.channel.is_some() {
            // Not closed: an error path. Do not leave the process behind.
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// How long a client waits for one answer. A cold index of 100k pages answers its first
/// call only after the catch-up: over 120 s on a loaded 2-core machine with FTS5 alone
/// (the read then failed with EAGAIN, os error 11, and the run was lost).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(900);

/// A client on the daemon's socket that does the shim's handshake itself.
pub type Direct = LineChannel<UnixStream, BufReader<UnixStream>>;

/// Connect to the daemon's socket and greet it as an MCP connection pinned to `slug`.
pub fn connect_direct(socket: &Path, slug: &str) -> Result<Direct> {
    let stream = UnixStream::connect(socket)
        .with_context(|| format!("cannot connect to {}", socket.display()))?;
    stream.set_read_timeout(Some(ANSWER_TIMEOUT))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut writer = stream;
    let hello = Hello {
        protocol: alexandria_proto::PROTOCOL_VERSION,
        build: BUILD.to_string(),
        kind: ConnectionKind::Mcp(McpHello {
            binding: Binding::Pinned {
                workspace: slug.to_string(),
            },
            parent_pid: std::process::id(),
            cwd: std::env::current_dir()
                .map(|d| d.display().to_string())
                .unwrap_or_default(),
            resumed: false,
        }),
    };
    writer.write_all(&alexandria_proto::to_line(&hello))?;
    let mut line = String::new();
    reader.read_line(&mut line)?;
    match serde_json::from_str::<HelloReply>(line.trim()) {
        Ok(HelloReply::Ready { .. }) => Ok(LineChannel::new(writer, reader)),
        Ok(other) => bail!("the daemon refused the handshake: {other:?}"),
        Err(e) => bail!("unexpected handshake reply {line:?}: {e}"),
    }
}

/// A bare line echo server on a Unix socket, in a thread: the transport floor.
pub struct Echo {
    pub path: std::path::PathBuf,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Echo {
    pub fn start(path: &Path) -> Result<Echo> {
        let _ = std::fs::remove_file(path);
        let listener = std::os::unix::net::UnixListener::bind(path)
            .with_context(|| format!("cannot bind {}", path.display()))?;
        let thread = std::thread::spawn(move || {
            // One client, served until it hangs up.
            if let Ok((stream, _)) = listener.accept() {
                let Ok(write_half) = stream.try_clone() else {
                    return;
                };
                let mut writer = write_half;
                let mut reader = BufReader::new(stream);
                let mut line = Vec::new();
                loop {
                    line.clear();
                    match reader.read_until(b'\n', &mut line) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {
                            if writer.write_all(&line).is_err() {
                                break;
                            }
                        }
                    }
                }
            }
        });
        Ok(Echo {
            path: path.to_path_buf(),
            thread: Some(thread),
        })
    }

    pub fn connect(&self) -> Result<LineChannel<UnixStream, BufReader<UnixStream>>> {
        let stream = UnixStream::connect(&self.path)
            .with_context(|| format!("cannot connect to {}", self.path.display()))?;
        let reader = BufReader::new(stream.try_clone()?);
        Ok(LineChannel::new(stream, reader))
    }

    /// Wait for the server thread (the client must be dropped first).
    pub fn join(mut self) {
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// An HTTP response: status, headers (lowercased names), body.
struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Streamable HTTP (MCP 2025-06-18) over one keep-alive loopback connection.
pub struct Http {
    host: String,
    path: String,
    stream: BufReader<TcpStream>,
    session: Option<String>,
    next_id: i64,
    request: Vec<u8>,
}

impl Http {
    /// `base` is the daemon's reported address (`http://127.0.0.1:port` or
    /// `127.0.0.1:port`); only loopback addresses are accepted.
    pub fn connect(base: &str, slug: &str) -> Result<Http> {
        let host = base
            .trim()
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string();
        let address: std::net::SocketAddr = host
            .parse()
            .with_context(|| format!("the daemon's HTTP address {base:?} is not ip:port"))?;
        if !address.ip().is_loopback() {
            bail!("the benchmark only talks to loopback, not {address}");
        }
        let stream =
            TcpStream::connect(address).with_context(|| format!("cannot connect to {address}"))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(ANSWER_TIMEOUT))?;
        Ok(Http {
            host,
            path: format!("/mcp/{slug}"),
            stream: BufReader::new(stream),
            session: None,
            next_id: 1,
            request: Vec::with_capacity(4096),
        })
    }

    /// POST one JSON-RPC message.
    fn post(&mut self, body: &Value) -> Result<Response> {
        let payload = serde_json::to_vec(body)?;
        self.request.clear();
        write!(
            self.request,
            "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\n",
            self.path,
            self.host,
            payload.len()
        )?;
        if let Some(session) = &self.session {
            write!(
                self.request,
                "Mcp-Session-Id: {session}\r\nMCP-Protocol-Version: {PROTOCOL}\r\n"
            )?;
        }
        self.request.extend_from_slice(b"\r\n");
        self.request.extend_from_slice(&payload);
        self.stream
            .get_mut()
            .write_all(&self.request)
            .context("cannot send an HTTP request")?;
        read_response(&mut self.stream)
    }
}

impl Mcp for Http {
    fn request(&mut self, method: &str, params: Value) -> Result<Value> {
        let id = self.next_id;
        self.next_id += 1;
        let response =
            self.post(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))?;
        if response.status != 200 {
            bail!(
                "HTTP {} for {method}: {}",
                response.status,
                String::from_utf8_lossy(&response.body)
            );
        }
        if let Some(session) = response.header("mcp-session-id") {
            self.session = Some(session.to_string());
        }
        let is_sse = response
            .header("content-type")
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let frames: Vec<Value> = if is_sse {
            let text = String::from_utf8_lossy(&response.body);
            let mut frames = Vec::new();
            for event in text.split("\n\n") {
                let data: Vec<&str> = event
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(str::trim_start)
                    .collect();
                if !data.is_empty()
                    && let Ok(frame) = serde_json::from_str::<Value>(&data.join("\n"))
                {
                    frames.push(frame);
                }
            }
            frames
        } else {
            vec![serde_json::from_slice(&response.body).context("the HTTP answer is not JSON")?]
        };
        frames
            .into_iter()
            .find(|f| f.get("id") == Some(&json!(id)) && f.get("method").is_none())
            .ok_or_else(|| anyhow!("no answer to {method} in the HTTP response"))
    }

    fn notify(&mut self, method: &str, params: Value) -> Result<()> {
        let response = self.post(&json!({"jsonrpc": "2.0", "method": method, "params": params}))?;
        if !(200..300).contains(&response.status) {
            bail!(
                "HTTP {} for {method}: {}",
                response.status,
                String::from_utf8_lossy(&response.body)
            );
        }
        Ok(())
    }
}

/// Read one HTTP/1.1 response: fixed length, chunked, or (without either) none.
fn read_response(reader: &mut BufReader<TcpStream>) -> Result<Response> {
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("bad HTTP status line {line:?}"))?;
    let mut headers = Vec::new();
    for _ in 0..200 {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            bail!("the connection closed inside the headers");
        }
        let trimmed = line.trim_end();
        if trimmed.is_empty() {
            break;
        }
        if let Some((name, value)) = trimmed.split_once(':') {
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
        }
    }
    let mut response = Response {
        status,
        headers,
        body: Vec::new(),
    };
    let body = &mut response.body;
    if response_header(&response.headers, "transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
    {
        for _ in 0..1_000_000 {
            line.clear();
            reader.read_line(&mut line)?;
            let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                .with_context(|| format!("bad chunk size {line:?}"))?;
            if size == 0 {
                line.clear();
                reader.read_line(&mut line)?; // the CRLF after the last chunk
                break;
            }
            let start = body.len();
            body.resize(start + size, 0);
            reader.read_exact(&mut body[start..])?;
            let mut crlf = [0u8; 2];
            reader.read_exact(&mut crlf)?;
        }
    } else if let Some(length) = response_header(&response.headers, "content-length") {
        let length: usize = length.parse().context("bad content-length")?;
        body.resize(length, 0);
        reader.read_exact(body)?;
    }
    Ok(response)
}

fn response_header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}
