//! Upgrades: a client of a newer build (same protocol) makes the running daemon step down,
//! while a live MCP session keeps writing: every write is acknowledged and kept, no call
//! hangs, and the session goes on with the daemon that replaces the old one. The same
//! holds for `daemon stop` and SIGTERM with a write in flight.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::sync::mpsc;
use std::time::Duration;

use alexandria_tests::{Env, process_alive, text_of, wait_until};
use serde_json::{Value, json};

/// Greet the daemon as a CLI of `build` (the protocol of this build) and return its reply.
fn hello_as(env: &Env, build: &str) -> Value {
    let mut stream = UnixStream::connect(env.home.join("run/daemon.sock")).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let hello =
        json!({"protocol": alexandria_proto::PROTOCOL_VERSION, "build": build, "kind": "control"});
    writeln!(stream, "{hello}").expect("send hello");
    let mut line = String::new();
    BufReader::new(&stream)
        .read_line(&mut line)
        .expect("read reply");
    serde_json::from_str(&line).expect("reply is JSON")
}

fn write_page(shim: &mut alexandria_tests::RawShim, id: i64) -> Value {
    shim.request(
        id,
        "tools/call",
        json!({"name": "write", "arguments": {
            "command": "create",
            "path": format!("wiki/p{id}.md"),
            "content": format!("# Page {id}\n\nWritten during an upgrade.\n"),
        }}),
    )
}

#[test]
fn a_newer_build_replaces_the_daemon_under_a_live_session() {
    let env = Env::new();
    env.ok(&["init"]);
    let old_pid = env.daemon_pid().expect("daemon running");
    let mut shim = env.raw_shim(Some("global"));
    shim.initialize("2025-06-18");

    // The session writes continuously (one call in flight at a time, as an agent does)
    // in a thread; each answer comes back over a channel so a hang fails the test.
    let (answers, answered) = mpsc::channel();
    let writer = std::thread::spawn(move || {
        for id in 1..=60 {
            let reply = write_page(&mut shim, id);
            if answers.send((id, reply)).is_err() {
                break;
            }
        }
        shim
    });
    let mut replies = Vec::new();
    for _ in 0..10 {
        replies.push(
            answered
                .recv_timeout(Duration::from_secs(30))
                .expect("a write hung"),
        );
    }

    // A newer alexandria (same protocol, higher build) greets the daemon.
    let reply = hello_as(&env, "999.0.0");
    assert_eq!(reply["status"], "superseded", "{reply}");
    assert_eq!(reply["pid"], old_pid, "{reply}");
    assert!(
        wait_until(Duration::from_secs(10), || !process_alive(old_pid)),
        "the old daemon did not step down"
    );

    while replies.len() < 60 {
        replies.push(
            answered
                .recv_timeout(Duration::from_secs(30))
                .expect("a write hung across the upgrade"),
        );
    }
    let mut shim = writer.join().expect("writer thread");
    let new_pid = env.daemon_pid().expect("a new daemon runs");
    assert_ne!(new_pid, old_pid);

    // Every write is acknowledged (one in flight at the step-down is finished by the old
    // daemon, or refused as not started and sent to the new one by the shim), on disk
    // and in history.
    for (id, reply) in &replies {
        let page = env.workspace_dir("global").join(format!("wiki/p{id}.md"));
        match reply.get("result") {
            Some(result) if result["isError"] != json!(true) => {
                assert!(page.is_file(), "acknowledged write {id} is missing");
            }
            Some(result) => panic!("write {id} failed as a tool: {}", text_of(result)),
            None => panic!("write {id} failed across the upgrade: {reply}"),
        }
    }
    let history = shim.request(
        1000,
        "tools/call",
        json!({"name": "history", "arguments": {"op": "create", "limit": 500}}),
    );
    let logged = history["result"]["structuredContent"]["entries"]
        .as_array()
        .map(Vec::len)
        .unwrap_or(0);
    let on_disk = (1..=60)
        .filter(|id| {
            env.workspace_dir("global")
                .join(format!("wiki/p{id}.md"))
                .is_file()
        })
        .count();
    assert_eq!(logged, on_disk, "history and disk disagree: {history}");

    // The same session goes on with the new daemon.
    let guide = shim.request(
        1001,
        "tools/call",
        json!({"name": "guide", "arguments": {}}),
    );
    assert_ne!(guide["result"]["isError"], json!(true), "{guide}");
}

#[test]
fn the_same_or_an_older_build_leaves_the_daemon_running() {
    let env = Env::new();
    env.ok(&["init"]);
    let pid = env.daemon_pid().expect("daemon running");
    for build in [
        alexandria_proto::BUILD,
        "0.0.1",
        "0.1.0-rc.1",
        "not a version",
    ] {
        let reply = hello_as(&env, build);
        assert_eq!(reply["status"], "ready", "{build}: {reply}");
    }
    assert!(process_alive(pid));
    assert_eq!(env.daemon_pid(), Some(pid));
}

/// What makes the daemon stop while a write is in flight.
#[derive(Clone, Copy, Debug)]
enum Trigger {
    /// A client of a newer build greets it (an upgrade).
    NewerBuild,
    /// `alexandria daemon stop`.
    DaemonStop,
    /// SIGTERM (a service manager, `kill`).
    Sigterm,
}

fn is_acknowledged(reply: &Value) -> bool {
    reply
        .get("result")
        .is_some_and(|r| r["isError"] != json!(true))
}

/// A write is running (slowed by a fault) when the daemon is told to stop, and a second
/// one arrives on the same session while it drains. The first must be finished and
/// acknowledged by the old daemon; the second must not be lost in between: the old
/// daemon refuses it as not started and the shim sends it to the next daemon, so the
/// client sees both acknowledged, never an `internal` error or a "may or may not have
/// been applied".
fn writes_survive_a_stop(trigger: Trigger) {
    let env = Env::with_faults("delay:write:1500");
    env.ok(&["init"]);
    let old_pid = env.daemon_pid().expect("daemon running");
    let socket = env.home.join("run/daemon.sock");
    let mut shim = env.raw_shim(Some("global"));
    shim.initialize("2025-06-18");

    shim.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "write", "arguments": {
        "command": "create", "path": "wiki/first.md", "content": "# First\n\nIn flight at the stop.\n"}}}));
    // The write has reached the tool (it sleeps there for the fault's 1.5 s).
    assert!(
        wait_until(Duration::from_secs(10), || {
            let status: Value = serde_json::from_str(&env.ok(&["daemon", "status", "--json"]))
                .expect("status json");
            status["sessions"]
                .as_array()
                .is_some_and(|s| s.iter().any(|s| s["calls"].as_u64() >= Some(1)))
        }),
        "the write never reached the daemon"
    );

    let stopper = match trigger {
        Trigger::NewerBuild => {
            let reply = hello_as(&env, "999.0.0");
            assert_eq!(reply["status"], "superseded", "{reply}");
            None
        }
        Trigger::DaemonStop => {
            let mut stop = env.command();
            stop.args(["daemon", "stop"])
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            Some(stop.spawn().expect("spawn daemon stop"))
        }
        Trigger::Sigterm => {
            alexandria_tests::send_signal(old_pid, rustix::process::Signal::TERM);
            None
        }
    };
    // The old daemon has begun to stop (its socket is gone) and still drains the first
    // write: a second request arrives on the same session now.
    assert!(
        wait_until(Duration::from_secs(10), || !socket.exists()),
        "{trigger:?}: the daemon did not begin to stop"
    );
    assert!(process_alive(old_pid), "{trigger:?}: gone before the drain");
    shim.send(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "write", "arguments": {
        "command": "create", "path": "wiki/second.md", "content": "# Second\n\nSent while the daemon stopped.\n"}}}));

    let mut replies = std::collections::HashMap::new();
    while replies.len() < 2 {
        let frame = shim.recv().expect("the shim answers");
        if let Some(id) = frame.get("id").and_then(Value::as_i64) {
            replies.insert(id, frame);
        }
    }
    for id in [1, 2] {
        assert!(
            is_acknowledged(&replies[&id]),
            "{trigger:?}: write {id} was not acknowledged: {}",
            replies[&id]
        );
    }
    assert!(
        wait_until(Duration::from_secs(10), || !process_alive(old_pid)),
        "{trigger:?}: the old daemon did not exit"
    );
    if let Some(stopper) = stopper {
        let output = stopper.wait_with_output().expect("daemon stop");
        assert!(output.status.success(), "{trigger:?}: daemon stop failed");
    }
    let global = env.workspace_dir("global");
    assert!(global.join("wiki/first.md").is_file());
    assert!(global.join("wiki/second.md").is_file());
    let new_pid = env.daemon_pid().expect("the shim started a new daemon");
    assert_ne!(new_pid, old_pid);
    // Each write is one commit in history, none twice.
    let history = shim.request(
        3,
        "tools/call",
        json!({"name": "history", "arguments": {"op": "create", "limit": 50}}),
    );
    let paths: Vec<&str> = history["result"]["structuredContent"]["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter_map(|e| e["path"].as_str())
        .collect();
    assert_eq!(
        paths.iter().filter(|p| **p == "wiki/first.md").count(),
        1,
        "{history}"
    );
    assert_eq!(
        paths.iter().filter(|p| **p == "wiki/second.md").count(),
        1,
        "{history}"
    );
}

#[test]
fn a_write_in_flight_survives_a_step_down() {
    writes_survive_a_stop(Trigger::NewerBuild);
}

#[test]
fn a_write_in_flight_survives_daemon_stop() {
    writes_survive_a_stop(Trigger::DaemonStop);
}

#[test]
fn a_write_in_flight_survives_sigterm() {
    writes_survive_a_stop(Trigger::Sigterm);
}
