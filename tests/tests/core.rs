//! End-to-end tests of the core: real `alexandria` and `alexandriad` processes, a temp
//! home per test, MCP through the real shim.

use std::time::{Duration, Instant};

use alexandria_tests::{
    Env, TINY_PNG, call, error_code, make_pdf, process_alive, text_of, wait_until,
};
use serde_json::{Value, json};

/// A workspace `lab` with a markdown note, a 3-page PDF, a transcript and an image.
fn lab() -> Env {
    let env = Env::new();
    env.ok(&["init"]);
    env.ok(&["workspace", "create", "lab"]);
    let pdf = make_pdf(&[
        "Page one talks about nothing special.",
        "Page two mentions the quixotic heron.\nA second line on page two.",
        "Page three closes the paper.",
    ]);
    let note = "# Field notes\n\nIntro.\n\n## Birds\n\nThe zyzzyva beetle was seen near the pond.\n\n## Weather\n\nRain all day.\n";
    env.ingest(
        "lab",
        &[
            ("notes.md", note.as_bytes()),
            ("paper.pdf", &pdf),
            (
                "transcript.txt",
                b"speaker one: hello there\nspeaker two: general remarks\n",
            ),
            ("heron.png", TINY_PNG),
        ],
    );
    env
}

#[tokio::test]
async fn mcp_session_through_the_shim() -> anyhow::Result<()> {
    let env = lab();
    let client = env.client(None).await?;
    let info = client.peer_info().expect("server info");
    assert_eq!(
        info.server_info.as_ref().map(|s| s.name.as_str()),
        Some("alexandria")
    );

    let tools = client.list_all_tools().await?;
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    for expected in ["guide", "search", "read"] {
        assert!(names.contains(&expected), "{names:?}");
    }
    for tool in &tools {
        assert!(tool.input_schema["properties"].get("workspace").is_some());
        let read_only = !matches!(tool.name.as_ref(), "write" | "delete");
        assert_eq!(
            tool.annotations.as_ref().and_then(|a| a.read_only_hint),
            Some(read_only)
        );
    }

    let guide = call(&client, "guide", json!({})).await?;
    let listed: Vec<&str> = guide["structuredContent"]["workspaces"]
        .as_array()
        .expect("workspaces")
        .iter()
        .filter_map(|w| w["workspace"].as_str())
        .collect();
    assert_eq!(listed, vec!["global", "lab"]);
    assert!(text_of(&guide).contains("raw/"));

    let guide_lab = call(&client, "guide", json!({"workspace": "lab"})).await?;
    assert_eq!(guide_lab["structuredContent"]["raw_sources"], 4);
    let uncited = guide_lab["structuredContent"]["uncited_sources"]
        .as_array()
        .expect("uncited");
    assert_eq!(uncited.len(), 4);

    // A word in exactly one file, on page 2 of the PDF.
    let hits = call(
        &client,
        "search",
        json!({"workspace": "lab", "query": "quixotic"}),
    )
    .await?;
    let found = hits["structuredContent"]["hits"].as_array().expect("hits");
    assert_eq!(found.len(), 1, "{hits}");
    assert_eq!(found[0]["path"], "raw/paper.pdf");
    assert_eq!(found[0]["page"], 2);
    assert!(
        found[0]["snippet"]
            .as_str()
            .expect("snippet")
            .contains("**quixotic**")
    );

    let hits = call(
        &client,
        "search",
        json!({"workspace": "lab", "query": "zyzzyva"}),
    )
    .await?;
    let found = hits["structuredContent"]["hits"].as_array().expect("hits");
    assert_eq!(found.len(), 1);
    assert_eq!(found[0]["path"], "raw/notes.md");
    assert_eq!(found[0]["heading"], "Field notes > Birds");

    // Layer and scope filters.
    let none = call(
        &client,
        "search",
        json!({"workspace": "lab", "query": "zyzzyva", "layer": "wiki"}),
    )
    .await?;
    assert_eq!(
        none["structuredContent"]["hits"].as_array().map(Vec::len),
        Some(0)
    );
    let listed = call(
        &client,
        "search",
        json!({"workspace": "lab", "mode": "list", "path": "raw/*.pdf"}),
    )
    .await?;
    assert_eq!(listed["structuredContent"]["total"], 1);
    assert_eq!(listed["structuredContent"]["files"][0]["pages"], 3);

    // Page range of the PDF.
    let pages = call(
        &client,
        "read",
        json!({"workspace": "lab", "path": "raw/paper.pdf", "pages": "2-3"}),
    )
    .await?;
    let content = pages["structuredContent"]["content"]
        .as_str()
        .expect("content");
    assert!(content.contains("quixotic heron"));
    assert!(content.contains("closes the paper"));
    assert!(!content.contains("nothing special"));
    assert_eq!(pages["structuredContent"]["pages"], json!([2, 3]));
    assert!(
        pages["structuredContent"]["rev"]
            .as_str()
            .is_some_and(|r| r.len() == 40)
    );
    let bad_pages = call(
        &client,
        "read",
        json!({"workspace": "lab", "path": "raw/paper.pdf", "pages": "4"}),
    )
    .await?;
    assert_eq!(error_code(&bad_pages), Some("invalid_argument"));

    // Sections of a markdown file.
    let section = call(
        &client,
        "read",
        json!({"workspace": "lab", "path": "raw/notes.md", "sections": ["weather"]}),
    )
    .await?;
    let content = section["structuredContent"]["content"]
        .as_str()
        .expect("content");
    assert!(
        content.starts_with("## Weather") && !content.contains("zyzzyva"),
        "{content}"
    );

    // Glob batch within a budget: the first file fits, the rest is listed as remaining.
    let batch = call(
        &client,
        "read",
        json!({"workspace": "lab", "path": "raw/*"}),
    )
    .await?;
    let files = batch["structuredContent"]["files"]
        .as_array()
        .expect("files");
    assert_eq!(files.len(), 4, "{batch}");
    let small = call(
        &client,
        "read",
        json!({"workspace": "lab", "path": "raw/*", "max_chars": 150}),
    )
    .await?;
    let remaining = small["structuredContent"]["remaining"]
        .as_array()
        .expect("remaining");
    assert!(!remaining.is_empty(), "{small}");
    assert!(text_of(&small).contains("more files not shown"));

    // Images only on request.
    let image = call(
        &client,
        "read",
        json!({"workspace": "lab", "path": "raw/heron.png", "include_images": true}),
    )
    .await?;
    assert_eq!(image["content"][1]["type"], "image");
    assert_eq!(image["content"][1]["mimeType"], "image/png");
    let no_image = call(
        &client,
        "read",
        json!({"workspace": "lab", "path": "raw/heron.png"}),
    )
    .await?;
    assert_eq!(no_image["content"].as_array().map(Vec::len), Some(1));

    // Errors are tool results with codes; malformed queries too.
    let missing = call(
        &client,
        "read",
        json!({"workspace": "lab", "path": "wiki/nope.md"}),
    )
    .await?;
    assert_eq!(error_code(&missing), Some("not_found"));
    assert!(text_of(&missing).starts_with("not_found"));
    let bad_query = call(
        &client,
        "search",
        json!({"workspace": "lab", "query": "\"unbalanced"}),
    )
    .await?;
    assert_eq!(error_code(&bad_query), Some("invalid_query"));
    let unknown_ws = call(
        &client,
        "search",
        json!({"workspace": "nope", "query": "x"}),
    )
    .await?;
    assert_eq!(error_code(&unknown_ws), Some("workspace_not_found"));
    let bad_arg = call(&client, "search", json!({"workspace": "lab", "qury": "x"})).await?;
    assert_eq!(error_code(&bad_arg), Some("invalid_argument"));
    client.cancel().await?;
    Ok(())
}

#[tokio::test]
async fn open_and_pinned_binding() -> anyhow::Result<()> {
    let env = lab();
    let open = env.client(None).await?;
    for (tool, args) in [
        ("search", json!({"query": "heron"})),
        ("read", json!({"path": "wiki/index.md"})),
    ] {
        let result = call(&open, tool, args).await?;
        assert_eq!(error_code(&result), Some("workspace_required"), "{tool}");
    }
    open.cancel().await?;

    let pinned = env.client(Some("lab")).await?;
    let other = call(
        &pinned,
        "search",
        json!({"workspace": "global", "query": "heron"}),
    )
    .await?;
    assert_eq!(error_code(&other), Some("workspace_not_accessible"));
    let other = call(&pinned, "guide", json!({"workspace": "global"})).await?;
    assert_eq!(error_code(&other), Some("workspace_not_accessible"));
    let implicit = call(&pinned, "search", json!({"query": "quixotic"})).await?;
    assert_eq!(
        implicit["structuredContent"]["hits"][0]["path"],
        "raw/paper.pdf"
    );
    let explicit = call(
        &pinned,
        "read",
        json!({"workspace": "lab", "path": "wiki/index.md"}),
    )
    .await?;
    assert!(error_code(&explicit).is_none());
    let guide = call(&pinned, "guide", json!({})).await?;
    assert_eq!(guide["structuredContent"]["workspace"], "lab");
    assert_eq!(guide["structuredContent"]["mode"], "pinned");
    assert!(guide["structuredContent"].get("workspaces").is_none());
    assert!(!text_of(&guide).contains("global"), "{}", text_of(&guide));
    pinned.cancel().await?;

    // A bad pin is refused at launch.
    let output = env.run(&["mcp", "serve", "--workspace", "Not_A_Slug"]);
    assert!(!output.status.success());
    Ok(())
}

#[tokio::test]
async fn path_escapes_are_refused() -> anyhow::Result<()> {
    let env = lab();
    // Symlinks planted inside the wiki that lead out of it.
    let wiki = env.workspace_dir("lab").join("wiki");
    std::os::unix::fs::symlink(env.home.join("secrets"), wiki.join("escape"))?;
    std::os::unix::fs::symlink(
        env.workspace_dir("global").join("wiki/index.md"),
        wiki.join("other.md"),
    )?;
    std::os::unix::fs::symlink(env.home.join("config.toml"), wiki.join("config.md"))?;
    let client = env.client(None).await?;
    let escapes = [
        "../../secrets",
        "../global/wiki/index.md",
        "wiki/../../global/wiki/index.md",
        "wiki/../raw/notes.md",
        "/etc/passwd",
        "wiki\\..\\..\\secrets",
        "wiki/%2e%2e/%2e%2e/state.db",
        "wiki/a\u{0}b.md",
        "secrets/signing.key",
        "state.db",
        "config.toml",
        ".git/config",
        "runs/x/staged/a.md",
        ".trash/a.md",
        "templates/index.md",
        "wiki/escape/anything",
        "wiki/other.md",
        "wiki/config.md",
    ];
    for path in escapes {
        let result = call(&client, "read", json!({"workspace": "lab", "path": path})).await?;
        assert_eq!(
            error_code(&result),
            Some("invalid_path"),
            "{path}: {result}"
        );
    }
    for glob in ["../*", "/etc/*", "secrets/*", "wiki/../../*"] {
        let result = call(
            &client,
            "search",
            json!({"workspace": "lab", "mode": "list", "path": glob}),
        )
        .await?;
        assert_eq!(error_code(&result), Some("invalid_path"), "{glob}");
    }
    // Globs never surface hidden or out-of-layer files.
    let all = call(
        &client,
        "search",
        json!({"workspace": "lab", "mode": "list", "path": "wiki/**"}),
    )
    .await?;
    for file in all["structuredContent"]["files"].as_array().expect("files") {
        let path = file["path"].as_str().expect("path");
        assert!(
            path.starts_with("wiki/") && !path.contains("escape"),
            "{path}"
        );
    }
    client.cancel().await?;
    Ok(())
}

#[test]
fn five_shims_start_exactly_one_daemon() {
    let env = Env::new();
    env.set_up_home();
    let mut shims: Vec<_> = (0..5).map(|_| env.raw_shim(None)).collect();
    for shim in &mut shims {
        let reply = shim.initialize("2025-06-18");
        assert_eq!(
            reply["result"]["serverInfo"]["name"], "alexandria",
            "{reply}"
        );
    }
    let pid = env.daemon_pid().expect("a daemon wrote its pid");
    let daemons: Vec<u32> = std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            let cmdline = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
            let environ = std::fs::read(format!("/proc/{p}/environ")).unwrap_or_default();
            let home = format!("ALEXANDRIA_HOME={}", env.home.display());
            String::from_utf8_lossy(&cmdline).contains("alexandriad")
                && environ.split(|b| *b == 0).any(|kv| kv == home.as_bytes())
                && process_alive(*p)
        })
        .collect();
    assert_eq!(daemons, vec![pid]);
    for shim in shims {
        assert!(shim.close().success());
    }
}

#[test]
fn a_stale_socket_is_recovered() {
    let env = Env::new();
    env.set_up_home();
    let run = env.home.join("run");
    std::fs::create_dir_all(&run).expect("run dir");
    let socket = run.join("daemon.sock");
    // A socket file nobody listens on, as left by a daemon that died.
    drop(std::os::unix::net::UnixListener::bind(&socket).expect("bind"));
    assert!(socket.exists());
    std::fs::write(run.join("daemon.pid"), "999999 0.0.0\n").expect("stale pidfile");
    let mut shim = env.raw_shim(None);
    let reply = shim.initialize("2025-11-25");
    assert_eq!(reply["result"]["protocolVersion"], "2025-11-25");
    assert!(process_alive(env.daemon_pid().expect("pid")));
}

/// Where glibc can be linked statically (its `libc.a` is installed), the shim is a
/// static-pie binary (shim/build.rs): a running shim maps no shared library.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[test]
fn the_shim_maps_no_shared_library_where_glibc_links_statically() {
    let libc = std::process::Command::new("cc")
        .arg("-print-file-name=libc.a")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let static_glibc = std::path::Path::new(&libc).is_absolute()
        && std::path::Path::new(&libc).exists()
        && std::env::var_os("ALEXANDRIA_SHIM_DYNAMIC").is_none();
    let env = Env::new();
    env.ok(&["init"]);
    let mut shim = env.raw_shim(Some("global"));
    let reply = shim.initialize("2025-11-25");
    assert_eq!(reply["result"]["protocolVersion"], "2025-11-25");
    let guide = shim.request(1, "tools/call", json!({"name": "guide", "arguments": {}}));
    assert!(guide["result"]["structuredContent"].is_object(), "{guide}");
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", shim.child.id())).expect("maps");
    let libraries: Vec<&str> = maps
        .lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .filter(|path| path.ends_with(".so") || path.contains(".so."))
        .collect();
    if static_glibc {
        assert!(libraries.is_empty(), "the shim maps {libraries:?}");
    } else {
        eprintln!("no static glibc here ({libc:?}): the shim is linked dynamically");
    }
    assert!(shim.close().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_call_errors_fast_and_the_next_call_works() -> anyhow::Result<()> {
    let env = Env::with_faults("delay:read:5000");
    env.ok(&["init"]);
    let client = env.client(None).await?;
    let before = env.daemon_pid().expect("daemon pid");
    let slow = tokio::spawn({
        let peer = client.peer().clone();
        async move {
            let params = rmcp::model::CallToolRequestParams::new("read").with_arguments(
                json!({"workspace": "global", "path": "wiki/index.md"})
                    .as_object()
                    .cloned()
                    .unwrap_or_default(),
            );
            let result = peer.call_tool(params).await;
            (Instant::now(), result)
        }
    });
    // Wait until the daemon has the call in flight.
    assert!(wait_until(Duration::from_secs(10), || {
        let status = env.run(&["mcp", "status", "--json"]);
        let status: Value = serde_json::from_slice(&status.stdout).unwrap_or_default();
        status["sessions"]
            .as_array()
            .is_some_and(|s| s.iter().any(|s| s["calls"] == 1))
    }));
    let killed_at = Instant::now();
    env.kill_daemon();
    let (answered_at, result) = slow.await?;
    assert!(result.is_err(), "the in-flight call must fail: {result:?}");
    assert!(
        answered_at.duration_since(killed_at) < Duration::from_secs(1),
        "took {:?}",
        answered_at.duration_since(killed_at)
    );
    let guide = call(&client, "guide", json!({"workspace": "global"})).await?;
    assert!(error_code(&guide).is_none(), "{guide}");
    let after = env.daemon_pid().expect("a new daemon");
    assert_ne!(before, after);
    // The replayed session is the same MCP session to the client: more calls work.
    let tools = client.list_all_tools().await?;
    assert!(!tools.is_empty());
    client.cancel().await?;
    Ok(())
}

#[test]
fn malformed_oversized_and_unknown_frames_get_errors() {
    let env = Env::new();
    env.set_up_home();
    let mut shim = env.raw_shim(None);
    shim.initialize("2025-06-18");
    shim.send_raw(b"{this is not json");
    let parse_error = shim.recv().expect("parse error");
    assert_eq!(parse_error["error"]["code"], -32700, "{parse_error}");

    let mut big = br#"{"jsonrpc":"2.0","id":77,"method":"tools/call","params":{"name":"guide","arguments":{"workspace":""#.to_vec();
    big.extend(std::iter::repeat_n(b'a', 17 * 1024 * 1024));
    big.extend_from_slice(br#""}}}"#);
    shim.send_raw(&big);
    let too_large = shim.recv_id(&json!(77)).expect("too large").0;
    assert_eq!(
        too_large["result"]["structuredContent"]["error"]["code"],
        "too_large",
        "{}",
        too_large.to_string().chars().take(300).collect::<String>()
    );
    assert_eq!(too_large["result"]["isError"], true);

    let unknown = shim.request(9, "nope/nothing", json!({}));
    assert_eq!(unknown["error"]["code"], -32601, "{unknown}");
    shim.send_raw(br#"[{"jsonrpc":"2.0","id":10,"method":"ping"}]"#);
    let batch = shim.recv().expect("batch error");
    assert_eq!(batch["error"]["code"], -32600, "{batch}");
    let unknown_tool = shim.request(11, "tools/call", json!({"name": "rm_rf", "arguments": {}}));
    assert!(unknown_tool.get("error").is_some(), "{unknown_tool}");

    // The session goes on, and other sessions are unaffected.
    let tools = shim.request(12, "tools/list", json!({}));
    assert!(
        tools["result"]["tools"]
            .as_array()
            .is_some_and(|t| t.len() >= 3)
    );
    let mut other = env.raw_shim(None);
    other.initialize("2025-11-25");
    let guide = other.request(1, "tools/call", json!({"name": "guide", "arguments": {}}));
    assert_eq!(guide["result"]["isError"], false, "{guide}");
    assert!(shim.close().success());
}

#[test]
fn protocol_eras() {
    let env = Env::new();
    env.set_up_home();
    for version in ["2025-06-18", "2025-11-25"] {
        let mut shim = env.raw_shim(None);
        let reply = shim.initialize(version);
        assert_eq!(reply["result"]["protocolVersion"], version);
        assert!(reply["result"]["instructions"].as_str().is_some());
        let listed = shim.request(1, "tools/list", json!({}));
        assert!(
            listed["result"]["tools"]
                .as_array()
                .is_some_and(|t| !t.is_empty())
        );
    }
    // A 2026-07-28 client probes with server/discover before anything else: it must
    // get an answer at once (a result, or an error it can fall back from).
    let mut shim = env.raw_shim(None);
    let started = Instant::now();
    let reply = shim.request(
        1,
        "server/discover",
        json!({"_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "modern", "version": "1"}
        }}),
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(
        reply.get("result").is_some() || reply.get("error").is_some(),
        "{reply}"
    );
    if let Some(result) = reply.get("result") {
        let versions = result["supportedVersions"].to_string();
        assert!(versions.contains("2025-11-25"), "{reply}");
    }
}

#[test]
fn cli_workspaces_and_errors() {
    let env = Env::new();
    let init = env.ok(&["init"]);
    assert!(init.contains("global"));
    assert!(env.home.join("workspaces/global/wiki/SCHEMA.md").is_file());
    assert!(env.home.join("workspaces/global/.git").is_dir());
    env.ok(&["workspace", "create", "acme"]);
    let again = env.run(&["workspace", "create", "acme"]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("workspace_exists"));
    let bad = env.run(&["workspace", "create", "Bad_Slug"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("not a valid workspace slug"));
    let list: Value =
        serde_json::from_str(&env.ok(&["workspace", "list", "--json"])).expect("json");
    let slugs: Vec<&str> = list
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|w| w["workspace"].as_str())
        .collect();
    assert_eq!(slugs, vec!["acme", "global"]);
    let missing = env.run(&["ingest", "nope", "/etc/hostname"]);
    assert!(String::from_utf8_lossy(&missing.stderr).contains("workspace_not_found"));
    // Ingesting the same file twice keeps one copy.
    let once = env.ingest("acme", &[("a.md", b"# A\n")]);
    assert!(once.contains("raw/a.md"));
    let twice = env.ingest("acme", &[("a.md", b"# A\n")]);
    assert!(twice.contains("1 already present"), "{twice}");
    let status: Value =
        serde_json::from_str(&env.ok(&["daemon", "status", "--json"])).expect("json");
    assert_eq!(status["pid"].as_u64(), env.daemon_pid().map(u64::from));
    assert!(
        status["socket"]
            .as_str()
            .is_some_and(|s| s.ends_with("run/daemon.sock"))
    );
    env.ok(&["daemon", "stop"]);
    let stopped = env.run(&["daemon", "status"]);
    assert_eq!(stopped.status.code(), Some(3));
    // Socket and run dir permissions.
    env.ok(&["daemon", "start"]);
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &str| {
        std::fs::metadata(env.home.join(p))
            .expect(p)
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(mode("run"), 0o700);
    assert_eq!(mode("run/daemon.sock"), 0o600);
    assert_eq!(mode("secrets"), 0o700);
}

#[test]
fn files_changed_while_the_daemon_was_down_are_caught_up() {
    let env = Env::new();
    env.ok(&["init"]);
    env.ok(&["daemon", "stop"]);
    let page = env.workspace_dir("global").join("wiki/offline.md");
    std::fs::write(
        &page,
        "# Offline\n\nWritten with an editor: the word is xylophonic.\n",
    )
    .expect("write");
    let mut shim = env.raw_shim(Some("global"));
    shim.initialize("2025-06-18");
    let reply = shim.request(
        1,
        "tools/call",
        json!({"name": "search", "arguments": {"query": "xylophonic"}}),
    );
    assert_eq!(
        reply["result"]["structuredContent"]["hits"][0]["path"], "wiki/offline.md",
        "{reply}"
    );
}

#[test]
fn a_newer_protocol_client_replaces_the_daemon() {
    use std::io::{BufRead, Write};
    let env = Env::new();
    env.ok(&["init"]);
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
    let reply: Value = serde_json::from_str(&line).expect("json");
    assert_eq!(reply["status"], "protocol_mismatch");
    assert_eq!(reply["restarting"], true);
    assert!(wait_until(Duration::from_secs(5), || !process_alive(old)));
    let mut shim = env.raw_shim(None);
    shim.initialize("2025-06-18");
    assert_ne!(env.daemon_pid(), Some(old));
}

#[test]
fn a_foreground_daemon_takes_over_from_a_spawned_one() {
    use std::io::BufRead;
    let env = Env::new();
    env.set_up_home();
    let mut shim = env.raw_shim(None);
    shim.initialize("2025-06-18");
    let spawned = env.daemon_pid().expect("spawned daemon");
    // What a service manager runs: alexandriad in the foreground.
    let mut command = std::process::Command::new(alexandria_tests::bin_path("alexandriad"));
    alexandria_tests::isolate(&mut command, &env.home);
    let mut foreground = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("alexandriad");
    let mut line = String::new();
    std::io::BufReader::new(foreground.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("startup notice");
    let notice: Value = serde_json::from_str(&line).expect("json notice");
    assert_eq!(notice["daemon"], "ready", "{line}");
    assert!(wait_until(Duration::from_secs(5), || !process_alive(
        spawned
    )));
    assert_eq!(env.daemon_pid(), Some(foreground.id()));
    // The live session carries on against the new daemon.
    let tools = shim.request(5, "tools/list", json!({}));
    assert!(
        tools["result"]["tools"]
            .as_array()
            .is_some_and(|t| !t.is_empty()),
        "{tools}"
    );
    assert_eq!(env.daemon_pid(), Some(foreground.id()));
    let _ = foreground.kill();
    let _ = foreground.wait();
}

#[tokio::test]
async fn a_panic_in_a_tool_is_an_error_and_the_daemon_goes_on() -> anyhow::Result<()> {
    let env = Env::with_faults("panic:search");
    env.ok(&["init"]);
    let pid = env.daemon_pid().expect("pid");
    let client = env.client(Some("global")).await?;
    let result = call(&client, "search", json!({"query": "anything"})).await?;
    assert_eq!(error_code(&result), Some("internal"), "{result}");
    let guide = call(&client, "guide", json!({})).await?;
    assert!(error_code(&guide).is_none(), "{guide}");
    assert_eq!(env.daemon_pid(), Some(pid));
    assert!(process_alive(pid));
    client.cancel().await?;
    Ok(())
}
