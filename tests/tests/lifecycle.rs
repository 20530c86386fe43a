//! End-to-end tests of the daemon's life cycle: `daemon stop` / `daemon start` while the
//! daemon is busy (it must never be refused as "already running", and no acknowledged
//! write may be lost), and homes whose path is too long for a Unix socket address.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use alexandria_tests::{Env, process_alive, short_tempdir, wait_until};
use serde_json::{Value, json};

/// What a start refused because of a daemon that is still stopping says.
const REFUSED: &str = "another alexandriad is already running";

fn all_output(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The number after the first "(pid " in `text`.
fn pid_in(text: &str) -> Option<u32> {
    let rest = &text[text.find("(pid ")? + 5..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// `path -> blob id` for every file in HEAD of the git repository at `root`.
fn head_blobs(root: &Path) -> HashMap<String, String> {
    let output = Command::new("git")
        .args(["ls-tree", "-r", "HEAD"])
        .current_dir(root)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .expect("git ls-tree");
    assert!(output.status.success(), "{}", all_output(&output));
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| {
            let (meta, path) = line.split_once('\t')?;
            Some((
                path.to_string(),
                meta.split_whitespace().nth(2)?.to_string(),
            ))
        })
        .collect()
}

fn lab(env: &Env) {
    env.ok(&["init"]);
    env.ok(&["workspace", "create", "lab"]);
}

/// Start the daemon with `daemon start`; it must not be refused.
fn start(env: &Env) -> String {
    let output = env.run(&["daemon", "start", "--port", "0"]);
    let text = all_output(&output);
    assert!(
        output.status.success() && !text.contains(REFUSED),
        "daemon start failed: {text}"
    );
    text
}

/// `daemon stop`: it must succeed, and when it returns the process is gone.
fn stop(env: &Env) -> String {
    let output = env.run(&["daemon", "stop"]);
    let text = all_output(&output);
    assert!(output.status.success(), "daemon stop failed: {text}");
    if let Some(pid) = pid_in(&text) {
        assert!(
            !process_alive(pid),
            "daemon stop returned while alexandriad {pid} still runs: {text}"
        );
    }
    text
}

#[test]
fn stop_and_start_under_load_never_see_already_running() {
    let rounds: usize = std::env::var("ALEXANDRIA_RESTART_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(9);
    let env = Env::new();
    lab(&env);
    start(&env);
    let finished = AtomicBool::new(false);
    let progress = AtomicUsize::new(0);
    let (acknowledged, refusals) = std::thread::scope(|scope| {
        let mut writers = Vec::new();
        for w in 0..2 {
            let mut shim = env.raw_shim(Some("lab"));
            shim.initialize("2025-06-18");
            let (finished, progress) = (&finished, &progress);
            writers.push(scope.spawn(move || {
                let mut acknowledged = Vec::new();
                let mut refusals = Vec::new();
                let mut n = 0;
                while !finished.load(Ordering::SeqCst) {
                    n += 1;
                    let path = format!("wiki/w{w}/p{n}.md");
                    let reply = shim.request(
                        n,
                        "tools/call",
                        json!({"name": "write", "arguments": {"command": "create", "path": path, "content": format!("# W {w} {n}\n\nrestart{w}x{n}mark\n")}}),
                    );
                    let result = &reply["result"];
                    match result["structuredContent"]["rev"].as_str() {
                        Some(rev) if result["isError"] != Value::Bool(true) => {
                            acknowledged.push((path, rev.to_string()));
                            progress.fetch_add(1, Ordering::SeqCst);
                        }
                        // A call in flight when the daemon stops gets an error; the
                        // next one reconnects. Only a refused start is a failure.
                        _ if reply.to_string().contains(REFUSED) => {
                            refusals.push(reply.to_string());
                        }
                        _ => {}
                    }
                }
                (acknowledged, refusals)
            }));
        }
        let ingester = scope.spawn(|| {
            let scratch = env.dir.path().join("scratch");
            std::fs::create_dir_all(&scratch).expect("scratch");
            let mut refusals = Vec::new();
            let mut n = 0;
            while !finished.load(Ordering::SeqCst) {
                n += 1;
                let mut files = Vec::new();
                for f in 0..2 {
                    let file = scratch.join(format!("source-{n}-{f}.md"));
                    let body = format!("# Source {n} {f}\n\n{}\n", "ingested text ".repeat(500));
                    std::fs::write(&file, body).expect("write source");
                    files.push(file.display().to_string());
                }
                let mut args = vec!["ingest", "lab"];
                args.extend(files.iter().map(String::as_str));
                let text = all_output(&env.run(&args));
                if text.contains(REFUSED) {
                    refusals.push(text);
                }
            }
            refusals
        });
        // Stops the writers and the ingester when this thread ends, even by a panic
        // (a scope waits for its threads before it reports the panic).
        struct Finish<'a>(&'a AtomicBool);
        impl Drop for Finish<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let finish = Finish(&finished);
        let mut refusals = Vec::new();
        for round in 0..rounds {
            // Act only while the daemon is busy: writes keep landing.
            let before = progress.load(Ordering::SeqCst);
            assert!(
                wait_until(Duration::from_secs(30), || progress.load(Ordering::SeqCst)
                    >= before + 5),
                "round {round}: the writers made no progress"
            );
            if round % 3 == 2 {
                env.kill_daemon();
            } else {
                stop(&env);
            }
            let text = start(&env);
            assert!(text.contains("is running"), "{text}");
        }
        drop(finish);
        let mut acknowledged = Vec::new();
        for writer in writers {
            let (acked, refused) = writer.join().expect("writer");
            acknowledged.extend(acked);
            refusals.extend(refused);
        }
        refusals.extend(ingester.join().expect("ingester"));
        (acknowledged, refusals)
    });
    assert!(
        refusals.is_empty(),
        "starts refused while a daemon was stopping: {refusals:#?}"
    );
    let blobs = head_blobs(&env.workspace_dir("lab"));
    let lost: Vec<_> = acknowledged
        .iter()
        .filter(|(path, rev)| blobs.get(path) != Some(rev))
        .collect();
    assert!(
        lost.is_empty(),
        "{} of {} acknowledged writes lost: {lost:?}",
        lost.len(),
        acknowledged.len()
    );
    eprintln!(
        "{rounds} restarts under load; {} acknowledged writes all in git",
        acknowledged.len()
    );
}

/// The HTTP address (`127.0.0.1:port`) from `daemon status --json`.
fn http_address(env: &Env) -> String {
    let status: Value =
        serde_json::from_str(&env.ok(&["daemon", "status", "--json"])).expect("status json");
    let url = status["http"].as_str().expect("http is on");
    let rest = url.strip_prefix("http://").expect("http url");
    rest.split('/').next().expect("host:port").to_string()
}

/// An HTTP request in flight (its body not sent yet): it keeps the daemon's shutdown
/// busy for its HTTP grace period (3 s).
fn slow_http_request(env: &Env) -> std::net::TcpStream {
    let address = http_address(env);
    let mut slow = std::net::TcpStream::connect(&address).expect("connect http");
    write!(
        slow,
        "POST /mcp HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: 1000\r\n\r\n{{\"jsonrpc\""
    )
    .expect("send a partial request");
    slow.flush().expect("flush");
    slow
}

#[test]
fn stop_waits_for_a_slow_shutdown_and_start_follows() {
    let env = Env::new();
    lab(&env);
    start(&env);
    let _slow = slow_http_request(&env);
    let old = env.daemon_pid().expect("pid");
    let began = Instant::now();
    let text = stop(&env);
    let stopped_in = began.elapsed();
    assert_eq!(pid_in(&text), Some(old), "{text}");
    assert!(!process_alive(old));
    let text = start(&env);
    assert_ne!(pid_in(&text), Some(old), "{text}");
    eprintln!("stop with an HTTP request in flight took {stopped_in:?}");
}

#[test]
fn start_waits_for_a_daemon_that_is_stopping() {
    let env = Env::new();
    lab(&env);
    start(&env);
    let _slow = slow_http_request(&env);
    let old = env.daemon_pid().expect("pid");
    // Ask it to stop without waiting (what a script racing `daemon stop` sees).
    request_stop(&env);
    // `daemon start` and a shim that needs a daemon both wait for it to go.
    let mut shim = env.raw_shim(Some("lab"));
    let text = start(&env);
    assert!(!process_alive(old), "{text}");
    assert_ne!(pid_in(&text), Some(old), "{text}");
    let reply = shim.initialize("2025-06-18");
    assert_eq!(
        reply["result"]["serverInfo"]["name"], "alexandria",
        "{reply}"
    );
    // A healthy daemon is still reported as running, not waited for.
    let again = env.run(&["daemon", "start"]);
    assert!(again.status.success(), "{}", all_output(&again));
    assert!(all_output(&again).contains("is running"));
}

/// A path of exactly `length` bytes under `base`, with spaces and non-ASCII letters.
fn long_home(base: &Path, length: usize) -> PathBuf {
    let mut home = base.join("Application Support/Alexandria Wïkï 📚");
    while home.as_os_str().len() + "/deep folder ü".len() < length {
        home.push("deep folder ü");
    }
    let fill = length - home.as_os_str().len() - 1;
    home.push("é".repeat(fill / 2) + &"x".repeat(fill % 2));
    assert_eq!(home.as_os_str().len(), length, "{}", home.display());
    home
}

/// Everything a user does on day one, in a home at a long path.
fn day_one(env: &Env) -> Value {
    lab(env);
    let scratch = env.dir.path().join("my sources");
    std::fs::create_dir_all(&scratch).expect("scratch");
    let source = scratch.join("notes ü.md");
    std::fs::write(&source, "# Notes\n\nthe vermilion flycatcher\n").expect("source");
    env.ok(&["ingest", "lab", &source.display().to_string()]);
    let mut shim = env.raw_shim(Some("lab"));
    shim.initialize("2025-06-18");
    let reply = shim.request(
        1,
        "tools/call",
        json!({"name": "write", "arguments": {"command": "create", "path": "wiki/long.md", "content": "# Long\n\nthe crimson rosella\n"}}),
    );
    assert_eq!(reply["result"]["isError"], Value::Bool(false), "{reply}");
    let reply = shim.request(
        2,
        "tools/call",
        json!({"name": "search", "arguments": {"query": "rosella"}}),
    );
    assert_eq!(
        reply["result"]["structuredContent"]["hits"][0]["path"], "wiki/long.md",
        "{reply}"
    );
    let status: Value =
        serde_json::from_str(&env.ok(&["daemon", "status", "--json"])).expect("status");
    let text = env.ok(&["daemon", "status"]);
    let socket = status["socket"].as_str().expect("socket");
    assert!(text.contains(socket), "status names the socket: {text}");
    assert!(socket.len() < 104, "{socket}");
    let meta = std::fs::metadata(socket).expect("the socket exists");
    assert_eq!(meta.mode() & 0o777, 0o600, "{socket}");
    let dir = Path::new(socket).parent().expect("socket dir");
    assert_eq!(
        std::fs::metadata(dir).expect("dir").mode() & 0o077,
        0,
        "{}",
        dir.display()
    );
    stop(env);
    assert!(!Path::new(socket).exists(), "{socket} removed at stop");
    status
}

#[test]
fn a_home_with_a_long_path_works() {
    let dir = short_tempdir();
    let home = long_home(dir.path(), 150);
    let runtime = dir.path().join("xdg");
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&runtime)
        .expect("runtime dir");
    let mut env = Env::at(dir, home);

    // With XDG_RUNTIME_DIR: the socket is there.
    env.vars = vec![(
        "XDG_RUNTIME_DIR".into(),
        Some(runtime.display().to_string()),
    )];
    let status = day_one(&env);
    let socket = status["socket"].as_str().expect("socket");
    assert!(socket.starts_with(&format!("{}/alexandria-", runtime.display())));

    // A client without XDG_RUNTIME_DIR (an MCP client's scrubbed environment) still
    // finds a daemon started with it, through the path in its pidfile.
    start(&env);
    let pid = env.daemon_pid().expect("pid");
    env.vars = vec![("XDG_RUNTIME_DIR".into(), None)];
    let text = env.ok(&["daemon", "status"]);
    assert!(text.contains(&format!("(pid {pid})")), "{text}");
    let text = stop(&env);
    assert_eq!(pid_in(&text), Some(pid), "{text}");

    // Without it: /tmp/alexandria-<uid>/, created 0700.
    env.vars = vec![("XDG_RUNTIME_DIR".into(), None)];
    start(&env);
    let status: Value =
        serde_json::from_str(&env.ok(&["daemon", "status", "--json"])).expect("status");
    let uid = std::fs::metadata(env.dir.path()).expect("meta").uid();
    let socket = status["socket"].as_str().expect("socket").to_string();
    assert!(
        socket.starts_with(&format!("/tmp/alexandria-{uid}/")),
        "{socket}"
    );
    let listed = env.ok(&["workspace", "list"]);
    assert!(listed.contains("lab"), "{listed}");
    stop(&env);

    // A runtime directory open to others is refused, with a reason.
    let open = env.dir.path().join("open");
    std::fs::DirBuilder::new()
        .mode(0o755)
        .create(&open)
        .expect("open dir");
    std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    env.vars = vec![("XDG_RUNTIME_DIR".into(), Some(open.display().to_string()))];
    let output = env
        .command()
        .args(["workspace", "list"])
        .stdin(Stdio::null())
        .output()
        .expect("run");
    let text = all_output(&output);
    assert!(!output.status.success(), "{text}");
    assert!(
        text.contains("refusing the socket directory") && text.contains("0755"),
        "{text}"
    );
}

/// Send `Stop` over the socket and return once the daemon has answered (it is then
/// stopping), without waiting for it to exit.
fn request_stop(env: &Env) {
    let mut stream =
        std::os::unix::net::UnixStream::connect(env.home.join("run/daemon.sock")).expect("connect");
    let hello = alexandria_proto::Hello {
        protocol: alexandria_proto::PROTOCOL_VERSION,
        build: "test".into(),
        kind: alexandria_proto::ConnectionKind::Control,
    };
    stream
        .write_all(&alexandria_proto::to_line(&hello))
        .and_then(|()| {
            stream.write_all(&alexandria_proto::to_line(
                &alexandria_proto::ControlRequest::Stop,
            ))
        })
        .expect("send stop");
    let mut reader = std::io::BufReader::new(&stream);
    let mut line = String::new();
    while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
        if line.contains("\"done\"") {
            return;
        }
        line.clear();
    }
    panic!("no answer to stop: {line}");
}

#[test]
fn stop_says_when_a_daemon_is_still_stopping() {
    // The last step of shutdown (pidfile still locked) takes 3 s.
    let env = Env::with_faults("delay:shutdown:3000");
    lab(&env);
    let pid = env.daemon_pid().expect("pid");
    let output = env.run(&["daemon", "stop", "--timeout", "1"]);
    let text = all_output(&output);
    assert!(!output.status.success(), "{text}");
    assert!(
        text.contains(&format!(
            "alexandriad (pid {pid}) is still stopping after 1s"
        )) && text.contains(&format!("kill {pid}")),
        "{text}"
    );
    let status = env.run(&["daemon", "status", "--json"]);
    assert_eq!(status.status.code(), Some(3), "{}", all_output(&status));
    let status: Value = serde_json::from_slice(&status.stdout).expect("status json");
    assert_eq!(status["stopping"], true, "{status}");
    assert_eq!(status["pid"], pid, "{status}");
    // Stopping it again waits for the exit.
    let text = stop(&env);
    assert!(text.contains("stopped"), "{text}");
    assert!(!process_alive(pid));
}

#[test]
fn step_down_and_service_manager_start_wait_for_the_old_daemon() {
    let env = Env::with_faults("delay:shutdown:1500");
    lab(&env);
    // A newer client makes the daemon step down; a shim started right then waits for
    // the old daemon to exit and starts a new one.
    let old = env.daemon_pid().expect("pid");
    let mut stream =
        std::os::unix::net::UnixStream::connect(env.home.join("run/daemon.sock")).expect("connect");
    stream
        .write_all(b"{\"protocol\":999,\"build\":\"9.9.9\",\"kind\":\"control\"}\n")
        .expect("hello");
    let mut line = String::new();
    std::io::BufReader::new(&stream)
        .read_line(&mut line)
        .expect("reply");
    assert!(line.contains("\"restarting\":true"), "{line}");
    let mut shim = env.raw_shim(Some("lab"));
    let reply = shim.initialize("2025-06-18");
    assert_eq!(
        reply["result"]["serverInfo"]["name"], "alexandria",
        "{reply}"
    );
    assert!(!process_alive(old));
    let spawned = env.daemon_pid().expect("new pid");
    assert_ne!(spawned, old);

    // A service manager restarts the daemon right after a stop: the foreground daemon
    // waits for the stopping one instead of failing.
    request_stop(&env);
    let mut command = Command::new(alexandria_tests::bin_path("alexandriad"));
    alexandria_tests::isolate(&mut command, &env.home);
    command.env("ALEXANDRIA_FAULTS", "delay:shutdown:1500");
    let mut foreground = command
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("alexandriad");
    let mut line = String::new();
    std::io::BufReader::new(foreground.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("startup notice");
    assert!(line.contains("\"ready\""), "{line}");
    assert!(!process_alive(spawned));
    assert_eq!(env.daemon_pid(), Some(foreground.id()));
    let tools = shim.request(5, "tools/list", json!({}));
    assert!(tools["result"]["tools"].is_array(), "{tools}");
    let _ = foreground.kill();
    let _ = foreground.wait();
}
