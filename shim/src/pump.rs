//! `alexandria mcp serve`: the byte pump between an MCP client's stdio and the daemon.
//!
//! Frames are newline-delimited JSON-RPC and pass through unchanged. The pump peeks at
//! each frame only to remember which requests are in flight and the client's
//! `initialize`, so that when the daemon goes away every in-flight request gets a
//! JSON-RPC error at once, and the next frame reconnects (starting a daemon if needed)
//! and replays the handshake before it is forwarded. Nothing but MCP frames is ever
//! written to stdout.

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::thread;
use std::time::Duration;

use alexandria_proto::{Binding, ConnectionKind, McpHello};
use anyhow::{Context, Result, anyhow};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::connect::{Connection, Connector};

/// JSON-RPC error code for "the daemon went away before answering".
const DAEMON_LOST: i64 = -32000;
const REPLAY_ID_PREFIX: &str = "alexandria-shim-replay-";

/// The parts of a JSON-RPC frame the pump looks at.
#[derive(Deserialize)]
struct Peek<'a> {
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    method: Option<Cow<'a, str>>,
}

struct Link {
    writer: Option<UnixStream>,
    generation: u64,
}

struct Shared {
    link: Mutex<Link>,
    /// Raw JSON id of each client request the daemon has not answered, with the
    /// connection generation it was sent on.
    inflight: Mutex<HashMap<String, u64>>,
}

/// What the pump must replay after reconnecting.
#[derive(Default)]
struct Session {
    initialize: Option<Vec<u8>>,
    initialized: Option<Vec<u8>>,
    replays: u64,
}

pub struct PumpConfig {
    pub binding: Binding,
}

pub fn serve(connector: Connector, config: PumpConfig) -> Result<()> {
    let hello = |resumed| {
        ConnectionKind::Mcp(McpHello {
            binding: config.binding.clone(),
            parent_pid: std::os::unix::process::parent_id(),
            cwd: std::env::current_dir()
                .map(|d| d.display().to_string())
                .unwrap_or_default(),
            resumed,
        })
    };
    let connection = connector
        .connect(hello(false))
        .context("alexandria mcp serve could not reach the daemon")?;
    let shared = Arc::new(Shared {
        link: Mutex::new(Link {
            writer: None,
            generation: 0,
        }),
        inflight: Mutex::new(HashMap::new()),
    });
    let mut reader_done = {
        let mut link = lock(&shared.link);
        install(&shared, &mut link, connection)?
    };

    let mut session = Session::default();
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
            Some("initialize") => session.initialize = Some(line.clone()),
            Some("notifications/initialized") => session.initialized = Some(line.clone()),
            _ => {}
        }
        let sent = forward(
            &shared,
            &connector,
            &hello,
            &mut session,
            &line,
            request_id.as_deref(),
            &mut reader_done,
        );
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
    let _ = reader_done.recv_timeout(Duration::from_secs(2));
    Ok(())
}

type HelloFn<'a> = dyn Fn(bool) -> ConnectionKind + 'a;

/// Send one frame, reconnecting once if the link is down or breaks on write.
fn forward(
    shared: &Arc<Shared>,
    connector: &Connector,
    hello: &HelloFn<'_>,
    session: &mut Session,
    line: &[u8],
    request_id: Option<&str>,
    reader_done: &mut mpsc::Receiver<()>,
) -> Result<()> {
    let mut link = lock(&shared.link);
    for attempt in 0..2 {
        if link.writer.is_none() {
            let connection = connector.connect(hello(true))?;
            let connection = replay(connection, session)?;
            *reader_done = install(shared, &mut link, connection)?;
        }
        if let Some(id) = request_id {
            lock(&shared.inflight).insert(id.to_string(), link.generation);
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

/// Make `connection` the live link and start its reader thread. The returned channel
/// fires when that reader finishes.
fn install(
    shared: &Arc<Shared>,
    link: &mut Link,
    connection: Connection,
) -> Result<mpsc::Receiver<()>> {
    link.generation += 1;
    let generation = link.generation;
    link.writer = Some(connection.stream);
    let (done_tx, done_rx) = mpsc::channel();
    let shared = Arc::clone(shared);
    let reader = connection.reader;
    thread::Builder::new()
        .name("daemon-reader".into())
        .spawn(move || {
            pump_daemon_to_stdout(reader, &shared);
            connection_lost(&shared, generation);
            let _ = done_tx.send(());
        })
        .context("spawning the reader thread")?;
    Ok(done_rx)
}

fn pump_daemon_to_stdout<R: Read>(mut reader: BufReader<R>, shared: &Shared) {
    let mut line = Vec::with_capacity(4096);
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if line.last() != Some(&b'\n') {
            // A partial frame at EOF: the daemon died mid-write; drop it.
            return;
        }
        if let Ok(peek) = serde_json::from_slice::<Peek>(&line)
            && peek.method.is_none()
            && let Some(id) = peek.id
        {
            if id.get().starts_with(&format!("\"{REPLAY_ID_PREFIX}")) {
                continue;
            }
            lock(&shared.inflight).remove(id.get());
        }
        write_stdout(&line);
    }
}

/// The connection of `generation` is gone: fail every request sent on it.
fn connection_lost(shared: &Arc<Shared>, generation: u64) {
    let mut link = lock(&shared.link);
    if link.generation == generation {
        link.writer = None;
    }
    let lost: Vec<String> = {
        let mut inflight = lock(&shared.inflight);
        let lost: Vec<String> = inflight
            .iter()
            .filter(|(_, g)| **g == generation)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &lost {
            inflight.remove(id);
        }
        lost
    };
    drop(link);
    for id in lost {
        write_stdout(&error_frame(
            &id,
            "the alexandria daemon stopped before answering this request; the shim will reconnect on the next request (a write may or may not have been applied: check with read or history before retrying)",
        ));
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
