//! The HTTP listener facing the internet (issue 19, "Facing the internet"): a client that
//! never finishes its headers or body is cut off, bad tokens get 429 after a budget,
//! oversized bodies 413 before they are read, and a flood of idle connections does not
//! lock an authorized client out. Limits come from `[http]` in config.toml, set small
//! here.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use alexandria_tests::http::{
    JSON, MCP_ACCEPT, call_tool, http, initialize_body, mint, open_session, start_daemon,
};
use alexandria_tests::short_tempdir;
use serde_json::json;

fn configure(home: &Path, http: &str) {
    std::fs::create_dir_all(home).expect("home");
    std::fs::write(home.join("config.toml"), format!("[http]\n{http}\n")).expect("config");
}

/// Read until the server closes the connection; how long that took (`None`: still open
/// after `limit`).
fn closed_within(stream: &mut TcpStream, limit: Duration) -> Option<(Duration, String)> {
    let began = Instant::now();
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    let mut seen = Vec::new();
    let mut buffer = [0u8; 4096];
    while began.elapsed() < limit {
        match stream.read(&mut buffer) {
            Ok(0) => return Some((began.elapsed(), String::from_utf8_lossy(&seen).into())),
            Ok(n) => seen.extend_from_slice(&buffer[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return Some((began.elapsed(), String::from_utf8_lossy(&seen).into())),
        }
    }
    None
}

#[test]
fn slow_headers_and_slow_bodies_are_cut_off() {
    let home = short_tempdir();
    configure(
        home.path(),
        "header_timeout_secs = 1.0\nbody_timeout_secs = 1.0\nidle_timeout_secs = 2.0",
    );
    let daemon = start_daemon(home.path(), &["--port", "0"]).expect("daemon starts");
    let address = daemon.address.as_str();

    // Slowloris: headers begun, never finished.
    let mut slow = TcpStream::connect(address).expect("connect");
    write!(
        slow,
        "GET /health HTTP/1.1\r\nHost: {address}\r\nX-Slow: 1\r\n"
    )
    .expect("send");
    let (took, _) =
        closed_within(&mut slow, Duration::from_secs(8)).expect("slow headers were not cut off");
    assert!(took < Duration::from_secs(4), "cut off after {took:?}");

    // A body that never arrives whole.
    let mut slow = TcpStream::connect(address).expect("connect");
    write!(
        slow,
        "POST /mcp HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: 1000\r\n\r\n{{\"jsonrpc\""
    )
    .expect("send");
    let (took, reply) =
        closed_within(&mut slow, Duration::from_secs(8)).expect("a slow body was not cut off");
    assert!(took < Duration::from_secs(5), "cut off after {took:?}");
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    assert!(reply.contains("body_timeout_secs"), "{reply}");

    // An idle keep-alive connection is closed too.
    let mut idle = TcpStream::connect(address).expect("connect");
    write!(idle, "GET /health HTTP/1.1\r\nHost: {address}\r\n\r\n").expect("send");
    let (took, reply) =
        closed_within(&mut idle, Duration::from_secs(8)).expect("an idle connection stayed open");
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(took < Duration::from_secs(5), "closed after {took:?}");

    // The daemon still serves.
    assert_eq!(http(address, "GET", "/health", &[], "").status, 200);
}

#[test]
fn bad_tokens_get_429_after_the_budget_and_good_ones_still_work() {
    let home = short_tempdir();
    configure(home.path(), "failed_auth_per_minute = 5");
    let daemon = start_daemon(home.path(), &["--port", "0"]).expect("daemon starts");
    let address = daemon.address.as_str();
    let token = mint(home.path(), &[]);
    let forged = format!("Bearer {}x", &token[..token.len() - 1]);
    let bad = |n: usize| {
        let reply = http(
            address,
            "POST",
            "/mcp",
            &[MCP_ACCEPT, JSON, ("Authorization", &forged)],
            &initialize_body(),
        );
        (n, reply)
    };
    for n in 0..5 {
        let (_, reply) = bad(n);
        assert_eq!(reply.status, 401, "attempt {n}: {}", reply.body);
    }
    let (_, limited) = bad(5);
    assert_eq!(limited.status, 429, "{}", limited.body);
    let retry: u64 = limited
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .expect("seconds");
    assert!((1..=60).contains(&retry), "{retry}");
    assert!(limited.body.contains("too_many_failed_attempts"));

    // A valid token is not held up, nor is a request with none (discovery: 401).
    let session = open_session(address, "/mcp", Some(&token));
    let (status, message) = call_tool(address, "/mcp", &session, Some(&token), "guide", json!({}));
    assert_eq!(status, 200);
    assert_ne!(message["result"]["isError"], json!(true), "{message}");
    let missing = http(
        address,
        "POST",
        "/mcp",
        &[MCP_ACCEPT, JSON],
        &initialize_body(),
    );
    assert_eq!(missing.status, 401);
}

#[test]
fn an_oversized_body_gets_413_before_it_is_sent() {
    let home = short_tempdir();
    let daemon = start_daemon(home.path(), &["--port", "0"]).expect("daemon starts");
    let address = daemon.address.as_str();
    let mut stream = TcpStream::connect(address).expect("connect");
    // Only the headers: the answer must not wait for 17 MiB.
    write!(
        stream,
        "POST /mcp HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\n\r\n",
        17 * 1024 * 1024
    )
    .expect("send");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut reply = vec![0u8; 4096];
    let n = stream.read(&mut reply).expect("an answer before the body");
    let reply = String::from_utf8_lossy(&reply[..n]);
    assert!(reply.starts_with("HTTP/1.1 413"), "{reply}");
    assert!(reply.contains("too_large"), "{reply}");
}

#[test]
fn a_flood_of_idle_connections_does_not_lock_out_a_client() {
    let home = short_tempdir();
    // Long header timeout: only making room (closing the oldest idle connection) can
    // let the client in.
    configure(
        home.path(),
        "max_connections = 16\nheader_timeout_secs = 60.0\nidle_timeout_secs = 60.0",
    );
    let daemon = start_daemon(home.path(), &["--port", "0"]).expect("daemon starts");
    let address = daemon.address.as_str();
    let token = mint(home.path(), &[]);
    let session = open_session(address, "/mcp", Some(&token));
    let began = Instant::now();
    let (status, _) = call_tool(address, "/mcp", &session, Some(&token), "guide", json!({}));
    assert_eq!(status, 200);
    let usual = began.elapsed();

    // 60 connections that say nothing, and 20 that never finish their headers.
    let mut flood = Vec::new();
    for n in 0..80 {
        let mut stream = TcpStream::connect(address).expect("connect");
        if n % 4 == 0 {
            let _ = write!(stream, "GET /health HTTP/1.1\r\nHost: {address}\r\n");
        }
        flood.push(stream);
    }
    for _ in 0..5 {
        let began = Instant::now();
        let (status, message) =
            call_tool(address, "/mcp", &session, Some(&token), "guide", json!({}));
        let took = began.elapsed();
        assert_eq!(status, 200, "{message}");
        assert_ne!(message["result"]["isError"], json!(true), "{message}");
        assert!(
            took < usual + Duration::from_secs(2),
            "a call took {took:?} during the flood (usual {usual:?})"
        );
    }
    // Most of the flood was closed to make room.
    let mut closed = 0;
    for stream in &mut flood {
        if closed_within(stream, Duration::from_millis(300)).is_some() {
            closed += 1;
        }
    }
    assert!(closed >= 60, "only {closed} of 80 idle connections closed");
    drop(flood);
}
