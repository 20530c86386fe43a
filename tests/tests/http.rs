//! The Streamable HTTP transport against a real `alexandriad` on a free port: health,
//! sessions scoped to their endpoint, DNS-rebinding checks, tokens and their limits.
//!
//! Requests are written by hand over a `TcpStream` so that every header (a forged
//! `Host`, a missing `Accept`) is exactly what the test says.

use std::path::Path;
use std::time::Duration;

use alexandria_tests::http::{
    JSON, MCP_ACCEPT, call_tool, cli, cli_json, http, initialize_body, mint, open_session,
    start_daemon, start_daemon_with,
};
use alexandria_tests::{short_tempdir, wait_until};
use serde_json::{Value, json};

fn seed(home: &Path) {
    let notes = home.join("notes.md");
    std::fs::write(
        &notes,
        "# Lighthouses\n\nThe Fresnel lens made lighthouses visible for miles.\n",
    )
    .expect("write notes");
    let output = cli(home, &["ingest", "global", notes.to_str().expect("utf8")]);
    assert!(output.status.success(), "{output:?}");
    let output = cli(home, &["workspace", "create", "b"]);
    assert!(output.status.success(), "{output:?}");
}

#[test]
fn health_sessions_and_status() {
    let home = short_tempdir();
    let daemon = start_daemon(home.path(), &["--port", "0"]).expect("daemon starts");
    let address = daemon.address.as_str();
    seed(home.path());

    let health = http(address, "GET", "/health", &[], "");
    assert_eq!(health.status, 200);
    let health: Value = serde_json::from_str(&health.body).expect("json");
    assert_eq!(health["status"], "ok");
    assert_eq!(health["tokens"], false);
    assert_eq!(
        http(address, "GET", "/mcp/global/health", &[], "").status,
        200
    );
    assert_eq!(
        http(address, "GET", "/mcp/nope/health", &[], "").status,
        404
    );
    assert_eq!(
        http(
            address,
            "POST",
            "/mcp/nope",
            &[MCP_ACCEPT, JSON],
            &initialize_body()
        )
        .status,
        404
    );
    assert_eq!(http(address, "GET", "/elsewhere", &[], "").status, 404);

    // A pinned session: search defaults to the pin, another slug is refused.
    let session = open_session(address, "/mcp/global", None);
    let (status, message) = call_tool(
        address,
        "/mcp/global",
        &session,
        None,
        "search",
        json!({"query": "Fresnel"}),
    );
    assert_eq!(status, 200);
    assert_eq!(message["result"]["isError"], false, "{message}");
    assert!(
        message["result"]["content"][0]["text"]
            .as_str()
            .expect("text")
            .contains("notes.md")
    );
    let (_, message) = call_tool(
        address,
        "/mcp/global",
        &session,
        None,
        "search",
        json!({"query": "Fresnel", "workspace": "b"}),
    );
    assert_eq!(
        message["result"]["structuredContent"]["error"]["code"],
        "workspace_not_accessible"
    );

    // Sessions do not cross endpoints; unknown ones get 404 so clients re-initialize.
    let (status, _) = call_tool(address, "/mcp", &session, None, "guide", json!({}));
    assert_eq!(status, 404);
    let (status, _) = call_tool(address, "/mcp/b", &session, None, "guide", json!({}));
    assert_eq!(status, 404);
    let (status, _) = call_tool(
        address,
        "/mcp/global",
        "0123456789abcdef",
        None,
        "guide",
        json!({}),
    );
    assert_eq!(status, 404);

    // The live session is listed with its client; the call is in the jsonl log.
    let status = cli_json(home.path(), &["mcp", "status", "--json"]);
    let sessions = status["sessions"].as_array().expect("sessions");
    let listed = sessions
        .iter()
        .find(|s| s["transport"] == "http")
        .unwrap_or_else(|| panic!("an http session in {status}"));
    assert_eq!(listed["client_name"], "http-test");
    assert_eq!(listed["binding"], "pinned");
    assert_eq!(listed["workspace"], "global");
    assert_eq!(listed["calls"], 2);
    assert!(
        status["http"]
            .as_str()
            .expect("url")
            .starts_with("http://127.0.0.1:")
    );
    let logs: String = std::fs::read_dir(home.path().join("logs"))
        .expect("logs dir")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("mcp-"))
        .map(|e| std::fs::read_to_string(e.path()).expect("log"))
        .collect();
    let line: Value = logs
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("json line"))
        .find(|l| l["transport"] == "http" && l["tool"] == "search")
        .unwrap_or_else(|| panic!("an http search line in {logs}"));
    assert_eq!(line["workspace"], "global");
    assert_eq!(line["result"], "ok");
    assert!(
        !logs.contains("Fresnel"),
        "arguments are hashed, not logged"
    );

    // DELETE ends the session: it leaves `mcp status` and its id is then unknown.
    let deleted = http(
        address,
        "DELETE",
        "/mcp/global",
        &[
            ("Mcp-Session-Id", session.as_str()),
            ("MCP-Protocol-Version", "2025-11-25"),
        ],
        "",
    );
    assert_eq!(deleted.status, 204);
    let (status, _) = call_tool(address, "/mcp/global", &session, None, "guide", json!({}));
    assert_eq!(status, 404);
    let again = http(
        address,
        "DELETE",
        "/mcp/global",
        &[("Mcp-Session-Id", session.as_str())],
        "",
    );
    assert_eq!(again.status, 404);
    let mut remaining = usize::MAX;
    for _ in 0..100 {
        let status = cli_json(home.path(), &["mcp", "status", "--json"]);
        remaining = status["sessions"]
            .as_array()
            .map_or(0, |s| s.iter().filter(|s| s["transport"] == "http").count());
        if remaining == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(remaining, 0, "the deleted session is unlisted");
}

#[test]
fn lenient_accept_and_open_mode() {
    let home = short_tempdir();
    let daemon = start_daemon(home.path(), &["--port", "0"]).expect("daemon starts");
    let address = daemon.address.as_str();
    // No Accept header at all: served rather than 406.
    let reply = http(address, "POST", "/mcp", &[JSON], &initialize_body());
    assert_eq!(reply.status, 200, "{}", reply.body);
    let session = reply.header("mcp-session-id").expect("session").to_string();
    let (_, message) = call_tool(
        address,
        "/mcp",
        &session,
        None,
        "search",
        json!({"query": "x"}),
    );
    assert_eq!(
        message["result"]["structuredContent"]["error"]["code"],
        "workspace_required"
    );
    // An explicit JSON-only Accept is honoured: rmcp answers with SSE, so 406.
    let reply = http(
        address,
        "POST",
        "/mcp",
        &[("Accept", "application/json"), JSON],
        &initialize_body(),
    );
    assert_eq!(reply.status, 406);
}

#[test]
fn dns_rebinding_is_refused() {
    let home = short_tempdir();
    let daemon = start_daemon(home.path(), &["--port", "0"]).expect("daemon starts");
    let address = daemon.address.as_str();
    let port = address.rsplit(':').next().expect("port");
    let evil_host = format!("evil.example:{port}");
    let localhost = format!("localhost:{port}");
    for path in ["/health", "/mcp", "/mcp/global", "/mcp/global/health"] {
        let method = if path.ends_with("health") {
            "GET"
        } else {
            "POST"
        };
        let body = if method == "POST" {
            initialize_body()
        } else {
            String::new()
        };
        let evil = http(
            address,
            method,
            path,
            &[("Host", &evil_host), MCP_ACCEPT, JSON],
            &body,
        );
        assert_eq!(evil.status, 403, "evil Host on {path}");
        let evil = http(
            address,
            method,
            path,
            &[("Origin", "http://evil.example"), MCP_ACCEPT, JSON],
            &body,
        );
        assert_eq!(evil.status, 403, "evil Origin on {path}");
        let good = http(
            address,
            method,
            path,
            &[
                ("Host", &localhost),
                ("Origin", "http://localhost:6274"),
                MCP_ACCEPT,
                JSON,
            ],
            &body,
        );
        assert_eq!(good.status, 200, "local Origin on {path}: {}", good.body);
    }
}

#[test]
fn tokens_limit_workspaces_and_revoke() {
    let home = short_tempdir();
    let daemon = start_daemon(home.path(), &["--port", "0"]).expect("daemon starts");
    let address = daemon.address.as_str();
    seed(home.path());
    let limited = mint(home.path(), &["--workspace", "global", "--ttl", "1h"]);
    let full = mint(home.path(), &[]);
    let limited_bearer = format!("Bearer {limited}");
    let full_bearer = format!("Bearer {full}");

    // Tokens are on: no token or a bad one gets 401 with a Bearer challenge.
    let missing = http(
        address,
        "POST",
        "/mcp",
        &[MCP_ACCEPT, JSON],
        &initialize_body(),
    );
    assert_eq!(missing.status, 401);
    assert!(
        missing
            .header("www-authenticate")
            .expect("challenge")
            .starts_with("Bearer ")
    );
    let forged = format!("Bearer {}x", &full[..full.len() - 1]);
    let bad = http(
        address,
        "GET",
        "/mcp/global/health",
        &[("Authorization", &forged)],
        "",
    );
    assert_eq!(bad.status, 401);
    assert!(
        bad.header("www-authenticate")
            .expect("challenge")
            .contains("invalid_token")
    );
    assert_eq!(http(address, "GET", "/health", &[], "").status, 200);
    assert_eq!(
        http(
            address,
            "GET",
            "/mcp/global/health",
            &[("Authorization", &limited_bearer)],
            ""
        )
        .status,
        200
    );

    // The global-only token cannot reach /mcp/b …
    assert_eq!(
        http(
            address,
            "GET",
            "/mcp/b/health",
            &[("Authorization", &limited_bearer)],
            ""
        )
        .status,
        403
    );
    let denied = http(
        address,
        "POST",
        "/mcp/b",
        &[MCP_ACCEPT, JSON, ("Authorization", &limited_bearer)],
        &initialize_body(),
    );
    assert_eq!(denied.status, 403);
    // … nor workspace "b" through the open endpoint, which it sees pinned to global.
    let session = open_session(address, "/mcp", Some(&limited));
    let (_, message) = call_tool(
        address,
        "/mcp",
        &session,
        Some(&limited),
        "search",
        json!({"query": "Fresnel", "workspace": "b"}),
    );
    assert_eq!(
        message["result"]["structuredContent"]["error"]["code"], "workspace_not_accessible",
        "{message}"
    );
    let (_, message) = call_tool(
        address,
        "/mcp",
        &session,
        Some(&limited),
        "guide",
        json!({}),
    );
    let guide = message["result"]["content"][0]["text"]
        .as_str()
        .expect("text");
    assert!(
        guide.contains("Workspace 'global' (pinned session)"),
        "only the pinned workspace: {guide}"
    );

    // The unrestricted token reaches b.
    let session_b = open_session(address, "/mcp/b", Some(&full));
    let (status, _) = call_tool(
        address,
        "/mcp/b",
        &session_b,
        Some(&full),
        "guide",
        json!({}),
    );
    assert_eq!(status, 200);
    // A session opened with one token cannot be used with the other's scope.
    let (status, _) = call_tool(
        address,
        "/mcp",
        &session_b,
        Some(&limited),
        "guide",
        json!({}),
    );
    assert_eq!(status, 404);

    // Revocation invalidates both, immediately, even inside a live session.
    let revoked = cli(home.path(), &["daemon", "auth", "revoke"]);
    assert!(revoked.status.success());
    let (status, _) = call_tool(
        address,
        "/mcp/b",
        &session_b,
        Some(&full),
        "guide",
        json!({}),
    );
    assert_eq!(status, 401);
    assert_eq!(
        http(
            address,
            "GET",
            "/mcp/global/health",
            &[("Authorization", &limited_bearer)],
            ""
        )
        .status,
        401
    );
    assert_eq!(
        http(
            address,
            "GET",
            "/mcp/global/health",
            &[("Authorization", &full_bearer)],
            ""
        )
        .status,
        401
    );
    // Tokens stay on after a restart.
    drop(daemon);
    let daemon = start_daemon(home.path(), &["--port", "0"]).expect("restart");
    assert_eq!(
        http(&daemon.address, "GET", "/mcp/global/health", &[], "").status,
        401
    );
    let fresh = format!("Bearer {}", mint(home.path(), &[]));
    assert_eq!(
        http(
            &daemon.address,
            "GET",
            "/mcp/global/health",
            &[("Authorization", &fresh)],
            ""
        )
        .status,
        200
    );
}

#[test]
fn non_loopback_bind_needs_tokens() {
    let home = short_tempdir();
    let refused = start_daemon(home.path(), &["--bind", "0.0.0.0", "--port", "0"])
        .err()
        .expect("refuses to start");
    assert!(refused.contains("without tokens"), "{refused}");
    // Through the CLI too, with the reason shown.
    let output = cli(
        home.path(),
        &["daemon", "start", "--bind", "0.0.0.0", "--port", "0"],
    );
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--token-required"), "{stderr}");

    let daemon = start_daemon(
        home.path(),
        &["--bind", "0.0.0.0", "--port", "0", "--token-required"],
    )
    .expect("starts with tokens required");
    let status = cli_json(home.path(), &["daemon", "status", "--json"]);
    assert!(
        status["http"]
            .as_str()
            .expect("url")
            .starts_with("http://0.0.0.0:")
    );
    assert_eq!(status["http_tokens"], true);
    assert_eq!(
        http(&daemon.address, "GET", "/mcp/global/health", &[], "").status,
        401
    );
}

/// A tool call over HTTP that is running when the daemon is told to stop is finished and
/// answered before the daemon exits (as on the Unix socket), and a request that arrives
/// on an open connection after the stop began is refused as not started (503), never
/// cut off half-way.
#[test]
fn an_http_call_in_flight_is_answered_at_a_stop() {
    let home = short_tempdir();
    seed(home.path());
    let mut daemon = start_daemon_with(
        home.path(),
        &["--port", "0"],
        &[("ALEXANDRIA_FAULTS", "delay:write:1500")],
    )
    .expect("daemon starts");
    let session = open_session(&daemon.address, "/mcp", None);
    let address = daemon.address.clone();
    let call = std::thread::spawn(move || {
        call_tool(
            &address,
            "/mcp",
            &session,
            None,
            "write",
            json!({"workspace": "global", "command": "create", "path": "wiki/inflight.md",
                "content": "# In flight\n\nWritten while the daemon stopped.\n"}),
        )
    });
    // The write has reached the tool (it sleeps there for the fault's 1.5 s).
    assert!(
        wait_until(Duration::from_secs(10), || {
            let status = cli_json(home.path(), &["daemon", "status", "--json"]);
            status["sessions"]
                .as_array()
                .is_some_and(|s| s.iter().any(|s| s["calls"].as_u64() >= Some(1)))
        }),
        "the write never reached the daemon"
    );
    let pid = daemon.child.id();
    alexandria_tests::send_signal(pid, rustix::process::Signal::TERM);

    let (code, message) = call.join().expect("the call thread");
    assert_eq!(code, 200, "the write's HTTP status");
    assert_eq!(
        message["result"]["isError"],
        Value::Bool(false),
        "the write in flight was not answered: {message}"
    );
    let exited = daemon.child.wait().expect("the daemon exits");
    assert!(exited.success(), "{exited:?}");
    // It was committed, not only answered.
    let log = std::process::Command::new("git")
        .args(["log", "--format=%s", "--", "wiki/inflight.md"])
        .current_dir(home.path().join("workspaces/global"))
        .output()
        .expect("git log");
    assert!(
        !String::from_utf8_lossy(&log.stdout).trim().is_empty(),
        "the acknowledged write is not in git"
    );
}
