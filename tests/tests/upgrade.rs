//! Upgrades: a client of a newer build (same protocol) makes the running daemon step down,
//! while a live MCP session keeps writing: every acknowledged write is kept, no call
//! hangs, and the session goes on with the daemon that replaces the old one.

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

    // Every acknowledged write is on disk and in history; a call that was in flight when
    // the daemon stepped down may have failed, but then it is whole or absent: history
    // and the disk agree.
    let mut acknowledged = 0;
    for (id, reply) in &replies {
        let page = env.workspace_dir("global").join(format!("wiki/p{id}.md"));
        match reply.get("result") {
            Some(result) if result["isError"] != json!(true) => {
                acknowledged += 1;
                assert!(page.is_file(), "acknowledged write {id} is missing");
            }
            Some(result) => panic!("write {id} failed as a tool: {}", text_of(result)),
            // In flight when the old daemon exited: applied whole or not at all (below).
            None => assert!(reply.get("error").is_some(), "{reply}"),
        }
    }
    assert!(
        acknowledged >= 58,
        "only {acknowledged} of 60 writes acknowledged"
    );
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
