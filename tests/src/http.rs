//! Raw HTTP for the end-to-end tests: a daemon on a free port, one request per
//! connection written by hand (so every header is exactly what the test says), the
//! CLI as JSON, and small MCP-over-HTTP helpers.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::{alexandria, bin_path, isolate};

/// A daemon started for one test, killed when dropped.
pub struct Daemon {
    pub child: Child,
    /// `127.0.0.1:port`
    pub address: String,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Run `alexandriad` with `args`; its first stdout line is the startup notice.
pub fn start_daemon(home: &Path, args: &[&str]) -> Result<Daemon, String> {
    start_daemon_with(home, args, &[])
}

/// `start_daemon` with more environment (`ALEXANDRIA_FAULTS`, …).
pub fn start_daemon_with(
    home: &Path,
    args: &[&str],
    vars: &[(&str, &str)],
) -> Result<Daemon, String> {
    let mut command = Command::new(bin_path("alexandriad"));
    isolate(&mut command, home);
    command.envs(vars.iter().copied());
    let mut child = command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn alexandriad");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read the startup notice");
    let notice: Value = serde_json::from_str(line.trim()).unwrap_or(Value::Null);
    if notice["daemon"] != "ready" {
        let _ = child.wait();
        return Err(notice["message"].as_str().unwrap_or(&line).to_string());
    }
    let mut daemon = Daemon {
        child,
        address: String::new(),
    };
    let status = cli_json(home, &["daemon", "status", "--json"]);
    let url = status["http"]
        .as_str()
        .expect("status reports the HTTP url");
    daemon.address = url
        .strip_prefix("http://")
        .expect("http url")
        .replace("0.0.0.0", "127.0.0.1");
    Ok(daemon)
}

pub fn cli(home: &Path, args: &[&str]) -> std::process::Output {
    alexandria(home)
        .args(args)
        .output()
        .expect("run alexandria")
}

pub fn cli_json(home: &Path, args: &[&str]) -> Value {
    let output = cli(home, args);
    assert!(
        output.status.success(),
        "alexandria {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("json output")
}

pub fn mint(home: &Path, args: &[&str]) -> String {
    let mut all = vec!["daemon", "auth", "token"];
    all.extend_from_slice(args);
    let output = cli(home, &all);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let token = String::from_utf8(output.stdout).expect("utf8");
    let token = token.trim().to_string();
    assert_eq!(token.matches('.').count(), 2, "a JWT on stdout: {token}");
    token
}

pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The JSON-RPC message in a JSON body or in the SSE `data:` lines.
    pub fn message(&self) -> Value {
        if let Ok(value) = serde_json::from_str::<Value>(&self.body) {
            return value;
        }
        self.body
            .lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
            .find(|value| value.get("id").is_some())
            .unwrap_or_else(|| panic!("no JSON-RPC message in {:?}", self.body))
    }
}

/// One HTTP/1.1 request with `Connection: close`. `Host` defaults to the address.
pub fn http(
    address: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Reply {
    let mut stream = TcpStream::connect(address).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let mut request = format!("{method} {path} HTTP/1.1\r\n");
    if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("host")) {
        request.push_str(&format!("Host: {address}\r\n"));
    }
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ));
    stream.write_all(request.as_bytes()).expect("send");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("read reply");
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, rest) = text.split_once("\r\n\r\n").expect("header block");
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .expect("status line");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
        .collect();
    let chunked = headers.iter().any(|(n, v)| {
        n.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
    });
    let body = if chunked {
        dechunk(rest)
    } else {
        rest.to_string()
    };
    Reply {
        status,
        headers,
        body,
    }
}

pub fn dechunk(mut rest: &str) -> String {
    let mut body = String::new();
    while let Some((size, tail)) = rest.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).expect("chunk size");
        if size == 0 {
            break;
        }
        body.push_str(&tail[..size]);
        rest = &tail[size + 2..];
    }
    body
}

pub const MCP_ACCEPT: (&str, &str) = ("Accept", "application/json, text/event-stream");
pub const JSON: (&str, &str) = ("Content-Type", "application/json");

pub fn initialize_body() -> String {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "http-test", "version": "9.9"}
    }})
    .to_string()
}

/// Initialize on `path` and return the session id.
pub fn open_session(address: &str, path: &str, auth: Option<&str>) -> String {
    let bearer = auth.map(|t| format!("Bearer {t}"));
    let mut headers = vec![MCP_ACCEPT, JSON];
    if let Some(bearer) = &bearer {
        headers.push(("Authorization", bearer));
    }
    let reply = http(address, "POST", path, &headers, &initialize_body());
    assert_eq!(reply.status, 200, "{}", reply.body);
    let message = reply.message();
    assert_eq!(message["result"]["serverInfo"]["name"], "alexandria");
    assert_eq!(message["result"]["protocolVersion"], "2025-11-25");
    let session = reply
        .header("mcp-session-id")
        .expect("a session id")
        .to_string();
    let mut headers = vec![
        MCP_ACCEPT,
        JSON,
        ("Mcp-Session-Id", session.as_str()),
        ("MCP-Protocol-Version", "2025-11-25"),
    ];
    if let Some(bearer) = &bearer {
        headers.push(("Authorization", bearer));
    }
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string();
    assert_eq!(
        http(address, "POST", path, &headers, &initialized).status,
        202
    );
    session
}

/// `tools/call` in a session; returns (HTTP status, JSON-RPC message or Null).
pub fn call_tool(
    address: &str,
    path: &str,
    session: &str,
    auth: Option<&str>,
    tool: &str,
    arguments: Value,
) -> (u16, Value) {
    let bearer = auth.map(|t| format!("Bearer {t}"));
    let mut headers = vec![
        MCP_ACCEPT,
        JSON,
        ("Mcp-Session-Id", session),
        ("MCP-Protocol-Version", "2025-11-25"),
    ];
    if let Some(bearer) = &bearer {
        headers.push(("Authorization", bearer));
    }
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {"name": tool, "arguments": arguments}})
    .to_string();
    let reply = http(address, "POST", path, &headers, &body);
    let message = if reply.status == 200 {
        reply.message()
    } else {
        Value::Null
    };
    (reply.status, message)
}
