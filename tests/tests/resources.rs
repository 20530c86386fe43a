//! Wiki pages and raw files as MCP resources through the real shim and daemon:
//! `resources/list` (paged), `resources/read`, templates, `resources/subscribe` with
//! `notifications/resources/updated` after a write and after an outside edit, pinned
//! sessions and confinement. (The Python and TypeScript SDKs run the same over stdio and
//! HTTP in scripts/interop.sh.)

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use alexandria_tests::{Env, RawShim};
use serde_json::{Value, json};

/// Kills the shim if the test waits for a frame longer than `limit`, so a missing
/// notification fails the test instead of hanging it.
struct Watchdog(Arc<AtomicBool>);

impl Watchdog {
    fn arm(shim: &RawShim, limit: Duration) -> Watchdog {
        let done = Arc::new(AtomicBool::new(false));
        let pid = shim.child.id();
        let flag = Arc::clone(&done);
        std::thread::spawn(move || {
            let deadline = std::time::Instant::now() + limit;
            while std::time::Instant::now() < deadline {
                if flag.load(Ordering::Acquire) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            alexandria_tests::send_signal(pid, rustix::process::Signal::KILL);
        });
        Watchdog(done)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Frames until a `notifications/resources/updated` for `uri`.
fn wait_updated(shim: &mut RawShim, uri: &str) -> Vec<Value> {
    let _watchdog = Watchdog::arm(shim, Duration::from_secs(20));
    let mut seen = Vec::new();
    loop {
        let frame = shim
            .recv()
            .unwrap_or_else(|e| panic!("no update for {uri} (frames so far: {seen:?}): {e}"));
        if frame["method"] == "notifications/resources/updated" && frame["params"]["uri"] == uri {
            return seen;
        }
        seen.push(frame);
    }
}

fn request(shim: &mut RawShim, id: i64, method: &str, params: Value) -> Value {
    let _watchdog = Watchdog::arm(shim, Duration::from_secs(20));
    shim.request(id, method, params)
}

fn uris(page: &Value) -> Vec<String> {
    page["result"]["resources"]
        .as_array()
        .unwrap_or_else(|| panic!("no resources: {page}"))
        .iter()
        .map(|r| r["uri"].as_str().expect("uri").to_string())
        .collect()
}

fn write_page(shim: &mut RawShim, id: i64, arguments: Value) {
    let reply = request(
        shim,
        id,
        "tools/call",
        json!({"name": "write", "arguments": arguments}),
    );
    assert_ne!(reply["result"]["isError"], true, "{reply}");
}

#[test]
fn pages_are_resources_with_reads_templates_and_update_notifications() {
    let env = Env::new();
    env.ok(&["init"]);
    env.ok(&["workspace", "create", "acme"]);
    env.ingest(
        "acme",
        &[(
            "notes.md",
            b"# Field notes\n\nAnemones close at low tide.\n",
        )],
    );
    let mut shim = env.raw_shim(None);
    let init = shim.initialize("2025-11-25");
    assert_eq!(
        init["result"]["capabilities"]["resources"]["subscribe"], true,
        "{init}"
    );
    write_page(
        &mut shim,
        1,
        json!({"workspace": "acme", "command": "create", "path": "wiki/tide-pools.md",
               "content": "# Tide pools\n\nAnemones [^1].\n\n[^1]: raw/notes.md\n"}),
    );

    // list: every workspace, wiki and raw, with titles and mime types.
    let page = request(&mut shim, 2, "resources/list", json!({}));
    let listed = page["result"]["resources"].as_array().expect("resources");
    let tide = listed
        .iter()
        .find(|r| r["uri"] == "alexandria://acme/wiki/tide-pools.md")
        .unwrap_or_else(|| panic!("page not listed: {page}"));
    assert_eq!(tide["name"], "wiki/tide-pools.md");
    assert_eq!(tide["title"], "Tide pools (acme)");
    assert_eq!(tide["mimeType"], "text/markdown");
    let all = uris(&page);
    assert!(
        all.contains(&"alexandria://acme/raw/notes.md".to_string()),
        "{all:?}"
    );
    assert!(
        all.contains(&"alexandria://global/wiki/index.md".to_string()),
        "{all:?}"
    );

    // read
    let read = request(
        &mut shim,
        3,
        "resources/read",
        json!({"uri": "alexandria://acme/wiki/tide-pools.md"}),
    );
    let contents = &read["result"]["contents"][0];
    assert_eq!(contents["mimeType"], "text/markdown", "{read}");
    assert!(
        contents["text"].as_str().unwrap_or("").contains("Anemones"),
        "{read}"
    );

    // templates
    let templates = request(&mut shim, 4, "resources/templates/list", json!({}));
    let patterns: Vec<&str> = templates["result"]["resourceTemplates"]
        .as_array()
        .expect("templates")
        .iter()
        .map(|t| t["uriTemplate"].as_str().expect("template"))
        .collect();
    assert_eq!(
        patterns,
        [
            "alexandria://{workspace}/wiki/{path}",
            "alexandria://{workspace}/raw/{path}"
        ]
    );

    // confinement, as for read
    for (id, uri, code) in [
        (
            5,
            "alexandria://acme/wiki/../../global/wiki/index.md",
            -32602,
        ),
        (6, "alexandria://acme/config.toml", -32602),
        (7, "alexandria://acme/wiki/missing.md", -32002),
        (8, "alexandria://nope/wiki/index.md", -32002),
        (9, "file:///etc/passwd", -32602),
    ] {
        let reply = request(&mut shim, id, "resources/read", json!({"uri": uri}));
        assert_eq!(reply["error"]["code"], code, "{uri}: {reply}");
    }

    // subscribe, then a write through another session: an update notification.
    let uri = "alexandria://acme/wiki/tide-pools.md";
    let reply = request(&mut shim, 10, "resources/subscribe", json!({"uri": uri}));
    assert!(reply.get("error").is_none(), "{reply}");
    let mut writer = env.raw_shim(Some("acme"));
    writer.initialize("2025-11-25");
    write_page(
        &mut writer,
        1,
        json!({"command": "append", "path": "wiki/tide-pools.md", "content": "\nStarfish too.\n"}),
    );
    wait_updated(&mut shim, uri);

    // An outside edit (an editor) is a change too.
    let file = env.workspace_dir("acme").join("wiki/tide-pools.md");
    let mut text = std::fs::read_to_string(&file).expect("page");
    text.push_str("\nEdited in an editor.\n");
    std::fs::write(&file, text).expect("outside edit");
    wait_updated(&mut shim, uri);

    // Unsubscribed: a later write to the page sends nothing to this session, while a
    // subscribed page still does.
    let reply = request(&mut shim, 11, "resources/unsubscribe", json!({"uri": uri}));
    assert!(reply.get("error").is_none(), "{reply}");
    let other = "alexandria://acme/wiki/other.md";
    request(&mut shim, 12, "resources/subscribe", json!({"uri": other}));
    write_page(
        &mut writer,
        2,
        json!({"command": "append", "path": "wiki/tide-pools.md", "content": "\nMussels.\n"}),
    );
    write_page(
        &mut writer,
        3,
        json!({"command": "create", "path": "wiki/other.md", "content": "# Other\n"}),
    );
    let before = wait_updated(&mut shim, other);
    assert!(
        !before
            .iter()
            .any(|f| f["method"] == "notifications/resources/updated" && f["params"]["uri"] == uri),
        "{before:?}"
    );
}

#[test]
fn pinned_sessions_list_and_read_only_their_workspace_and_pages_are_paged() {
    let env = Env::new();
    env.ok(&["init"]);
    env.ok(&["workspace", "create", "acme"]);
    // More files than one page holds.
    let files: Vec<(String, Vec<u8>)> = (0..230)
        .map(|i| (format!("n{i:03}.md"), format!("# Note {i}\n").into_bytes()))
        .collect();
    let borrowed: Vec<(&str, &[u8])> = files
        .iter()
        .map(|(name, bytes)| (name.as_str(), bytes.as_slice()))
        .collect();
    env.ingest("acme", &borrowed);

    let mut pinned = env.raw_shim(Some("acme"));
    pinned.initialize("2025-11-25");
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let params = match &cursor {
            Some(c) => json!({"cursor": c}),
            None => json!({}),
        };
        let page = request(&mut pinned, 100 + pages, "resources/list", params);
        pages += 1;
        seen.extend(uris(&page));
        match page["result"]["nextCursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => break,
        }
    }
    assert!(pages >= 2, "{pages} page(s)");
    assert!(
        seen.iter().all(|u| u.starts_with("alexandria://acme/")),
        "{seen:?}"
    );
    let unique: std::collections::HashSet<&String> = seen.iter().collect();
    assert_eq!(unique.len(), seen.len(), "no resource twice");
    // 230 notes + index, log, SCHEMA (+ raw/.gitkeep if listed)
    assert!(seen.len() >= 233, "{}", seen.len());
    assert!(seen.contains(&"alexandria://acme/raw/n229.md".to_string()));

    let templates = request(&mut pinned, 1, "resources/templates/list", json!({}));
    assert_eq!(
        templates["result"]["resourceTemplates"][0]["uriTemplate"],
        "alexandria://acme/wiki/{path}"
    );
    let refused = request(
        &mut pinned,
        2,
        "resources/read",
        json!({"uri": "alexandria://global/wiki/index.md"}),
    );
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap_or("")
            .starts_with("workspace_not_accessible"),
        "{refused}"
    );
    let refused = request(
        &mut pinned,
        3,
        "resources/subscribe",
        json!({"uri": "alexandria://global/wiki/index.md"}),
    );
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    let bad_cursor = request(&mut pinned, 4, "resources/list", json!({"cursor": "x"}));
    assert_eq!(bad_cursor["error"]["code"], -32602, "{bad_cursor}");
}
