//! End-to-end tests of `state.db` as a cache of the workspaces (issue 18): deleted,
//! corrupted, truncated, of a wrong or newer schema, with the daemon stopped or under a
//! live daemon's feet, it is moved aside (never deleted) and rebuilt from the files and
//! git: search finds every page, `history` keeps every acknowledged write with its run
//! id and client, and no start is refused or slow. Workspaces copied or cloned into
//! `workspaces/` by hand are adopted with their history.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use alexandria_tests::{Env, RawShim, git, process_alive, wait_until};
use serde_json::{Value, json};

/// The client name the raw shim announces, as history reports it.
const CLIENT: &str = "raw-test 1";

/// One acknowledged write: what history must list and search must find afterwards.
#[derive(Debug, Clone)]
struct Acked {
    run_id: String,
    op: String,
    path: String,
}

/// What a workspace must show after any rebuild.
#[derive(Debug, Default)]
struct Expected {
    acked: Vec<Acked>,
    /// (search word, path that must be found)
    findable: Vec<(String, String)>,
    /// Words that must find nothing (deleted pages).
    gone: Vec<String>,
    /// Paths committed by hand, which history lists as outside entries.
    outside: Vec<String>,
}

struct Session {
    shim: RawShim,
    next_id: i64,
}

impl Session {
    fn open(env: &Env, workspace: &str) -> Session {
        let mut shim = env.raw_shim(Some(workspace));
        let reply = shim.initialize("2025-06-18");
        assert!(reply.get("result").is_some(), "initialize: {reply}");
        Session { shim, next_id: 1 }
    }

    fn call(&mut self, tool: &str, arguments: Value) -> Value {
        self.next_id += 1;
        let reply = self.shim.request(
            self.next_id,
            "tools/call",
            json!({"name": tool, "arguments": arguments}),
        );
        reply["result"].clone()
    }

    /// A write that must succeed; returns its run id.
    fn write(&mut self, expected: &mut Expected, arguments: Value) -> String {
        let result = self.call("write", arguments.clone());
        assert_eq!(result["isError"], false, "write {arguments}: {result}");
        let run_id = result["structuredContent"]["run_id"]
            .as_str()
            .expect("run_id")
            .to_string();
        expected.acked.push(Acked {
            run_id: run_id.clone(),
            op: arguments["command"].as_str().expect("command").to_string(),
            path: arguments["path"].as_str().expect("path").to_string(),
        });
        run_id
    }

    fn history(&mut self) -> Vec<Value> {
        let result = self.call("history", json!({"limit": 500}));
        assert_eq!(result["isError"], false, "history: {result}");
        result["structuredContent"]["entries"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    fn search(&mut self, word: &str) -> Vec<String> {
        let result = self.call("search", json!({"query": word, "limit": 50}));
        assert_eq!(result["isError"], false, "search {word}: {result}");
        result["structuredContent"]["hits"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|hit| hit["path"].as_str().map(str::to_string))
            .collect()
    }
}

/// A home with workspace `lab`: agent creates, an append, a str_replace, a delete, a
/// raw source, and a page committed by hand.
fn populate(env: &Env) -> Expected {
    env.ok(&["init"]);
    env.ok(&["workspace", "create", "lab"]);
    env.ingest("lab", &[("notes.md", b"# Notes\n\nrawsourcemarker here\n")]);
    let mut expected = Expected::default();
    let mut session = Session::open(env, "lab");
    for n in 0..6 {
        session.write(
            &mut expected,
            json!({"command": "create", "path": format!("wiki/p{n}.md"),
                   "content": format!("# Page {n}\n\nword zq{n}marker[^1]\n\n[^1]: raw/notes.md\n")}),
        );
    }
    session.write(
        &mut expected,
        json!({"command": "append", "path": "wiki/p0.md", "content": "appended appmarker\n"}),
    );
    session.write(
        &mut expected,
        json!({"command": "str_replace", "path": "wiki/p1.md", "old_str": "zq1marker", "new_str": "zq1marker replmarker"}),
    );
    let deleted = session.call("delete", json!({"path": "wiki/p5.md"}));
    assert_eq!(deleted["isError"], false, "delete: {deleted}");
    expected.acked.push(Acked {
        run_id: deleted["structuredContent"]["run_id"]
            .as_str()
            .expect("run_id")
            .to_string(),
        op: "delete".into(),
        path: "wiki/p5.md".into(),
    });
    for n in 0..5 {
        expected
            .findable
            .push((format!("zq{n}marker"), format!("wiki/p{n}.md")));
    }
    expected
        .findable
        .push(("appmarker".into(), "wiki/p0.md".into()));
    expected
        .findable
        .push(("replmarker".into(), "wiki/p1.md".into()));
    expected
        .findable
        .push(("rawsourcemarker".into(), "raw/notes.md".into()));
    expected.gone.push("zq5marker".into());
    // A page committed by hand, as people do in a plain git repository (once git's
    // index has caught up with the agent's commits: issue 16 is another matter).
    let root = env.workspace_dir("lab");
    assert!(
        wait_until(Duration::from_secs(5), || git(
            &root,
            &["status", "--porcelain"]
        )
        .trim()
        .is_empty()),
        "git status settles"
    );
    std::fs::write(root.join("wiki/hand.md"), "# By hand\n\nhandmarker\n").expect("write");
    git(&root, &["add", "wiki/hand.md"]);
    git(&root, &["commit", "-q", "-m", "a page written by hand"]);
    expected
        .findable
        .push(("handmarker".into(), "wiki/hand.md".into()));
    expected.outside.push("wiki/hand.md".into());
    // The daemon has seen the hand page (it is a live outside edit too).
    assert!(
        wait_until(Duration::from_secs(10), || session
            .search("handmarker")
            .contains(&"wiki/hand.md".to_string())),
        "the hand page is indexed"
    );
    drop(session);
    expected
}

/// Stop the daemon and wait until its process is gone (so the pidfile is free).
fn stop_daemon(env: &Env) {
    let pid = env.daemon_pid();
    env.ok(&["daemon", "stop"]);
    if let Some(pid) = pid {
        assert!(
            wait_until(Duration::from_secs(10), || !process_alive(pid)),
            "the daemon exits after stop"
        );
    }
}

fn state_db(env: &Env) -> PathBuf {
    env.home.join("state.db")
}

/// Databases moved aside: files in the home named `state.db.corrupt-<time>` (their
/// `-wal`/`-shm` companions, when SQLite left any, go with them and are not counted).
fn moved_aside(env: &Env) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(&env.home)
        .expect("home")
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|name| {
            name.starts_with("state.db.corrupt-")
                && !name.ends_with("-wal")
                && !name.ends_with("-shm")
        })
        .collect();
    names.sort();
    names
}

/// Pseudo-random bytes (xorshift), so the test needs no RNG crate.
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Damage {
    Delete,
    RandomBytes,
    Truncate,
    WrongSchema,
    NewerSchema,
}

impl Damage {
    const ALL: [Damage; 5] = [
        Damage::Delete,
        Damage::RandomBytes,
        Damage::Truncate,
        Damage::WrongSchema,
        Damage::NewerSchema,
    ];

    /// Whether the old file is expected to be moved aside (deleting leaves nothing).
    fn moves_aside(self) -> bool {
        self != Damage::Delete
    }

    fn apply(self, env: &Env) {
        let path = state_db(env);
        match self {
            Damage::Delete => {
                for suffix in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
                }
            }
            Damage::RandomBytes => std::fs::write(&path, noise(4096, 7)).expect("write noise"),
            Damage::Truncate => {
                let len = std::fs::metadata(&path).expect("state.db").len();
                let file = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .expect("open state.db");
                file.set_len((len / 3).max(1024)).expect("truncate");
            }
            Damage::WrongSchema | Damage::NewerSchema => {
                for suffix in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
                }
                let connection = rusqlite::Connection::open(&path).expect("create sqlite");
                if self == Damage::WrongSchema {
                    // A plausible but foreign schema, at a version this build knows.
                    connection
                        .execute_batch(
                            "CREATE TABLE files (name TEXT);
                             CREATE TABLE runs (x INTEGER);
                             PRAGMA user_version = 2;",
                        )
                        .expect("schema");
                } else {
                    connection
                        .execute_batch("CREATE TABLE future (x); PRAGMA user_version = 9999;")
                        .expect("schema");
                }
            }
        }
    }
}

/// `alexandria daemon start` must succeed, quickly, and not as "already running".
fn start_daemon(env: &Env) {
    let started = Instant::now();
    let output = env.run(&["daemon", "start"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "daemon start failed after {:?}: {stderr}",
        started.elapsed()
    );
    assert!(!stderr.contains("already running"), "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "daemon start took {:?}",
        started.elapsed()
    );
}

/// Wait until `workspace list` no longer says a workspace is being indexed.
fn wait_for_index(env: &Env) {
    let done = wait_until(Duration::from_secs(60), || {
        let output = env.run(&["workspace", "list"]);
        output.status.success() && !String::from_utf8_lossy(&output.stdout).contains("indexing")
    });
    assert!(
        done,
        "indexing did not finish: {}",
        env.ok(&["workspace", "list"])
    );
}

/// After a rebuild: every acknowledged write in history, once, with its run id and
/// client; the hand commit as an outside entry; every page found by search.
fn check_workspace(env: &Env, workspace: &str, expected: &Expected, context: &str) {
    let mut session = Session::open(env, workspace);
    let history = session.history();
    let mut by_run: HashMap<&str, Vec<&Value>> = HashMap::new();
    for entry in &history {
        if let Some(run) = entry["run_id"].as_str() {
            by_run.entry(run).or_default().push(entry);
        }
    }
    for acked in &expected.acked {
        let entries = by_run
            .get(acked.run_id.as_str())
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            entries.len(),
            1,
            "{context}: run {} ({} {}) must be in history once: {history:#?}",
            acked.run_id,
            acked.op,
            acked.path
        );
        let entry = entries[0];
        assert_eq!(entry["op"], acked.op.as_str(), "{context}: {entry}");
        assert_eq!(entry["path"], acked.path.as_str(), "{context}: {entry}");
        assert_eq!(entry["origin"], "agent", "{context}: {entry}");
        assert_eq!(entry["client"], CLIENT, "{context}: {entry}");
    }
    for path in &expected.outside {
        assert!(
            history
                .iter()
                .any(|e| e["path"] == path.as_str() && e["origin"] == "outside"),
            "{context}: {path} must be in history as an outside entry: {history:#?}"
        );
    }
    for (word, path) in &expected.findable {
        let hits = session.search(word);
        assert!(
            hits.contains(path),
            "{context}: search {word} must find {path}, found {hits:?}\n{}\n{}",
            env.ok(&["workspace", "list"]),
            daemon_log(env)
        );
    }
    for word in &expected.gone {
        let hits = session.search(word);
        assert!(hits.is_empty(), "{context}: {word} found {hits:?}");
    }
}

/// The daemon says what happened to state.db: status and the log.
fn check_reported(env: &Env, damage: Damage, context: &str) {
    let status = env.ok(&["daemon", "status"]);
    assert!(
        status.contains("state.db"),
        "{context}: daemon status must say what happened to state.db:\n{status}"
    );
    let json: Value =
        serde_json::from_str(&env.ok(&["daemon", "status", "--json"])).expect("status json");
    let state = &json["state_db"];
    assert_eq!(state["rebuilt"], true, "{context}: {json}");
    if damage.moves_aside() {
        let moved = state["moved_to"].as_str().unwrap_or_default();
        assert!(
            moved.contains("state.db.corrupt-"),
            "{context}: moved_to in {json}"
        );
        assert!(Path::new(moved).is_file(), "{context}: {moved} is kept");
    }
    if damage.moves_aside() {
        let doctor = env.run(&["doctor"]);
        let text = String::from_utf8_lossy(&doctor.stdout);
        assert!(
            text.contains("state.db") && text.contains("state.db.corrupt-"),
            "{context}: doctor names the moved-aside file:\n{text}"
        );
    }
    let log = daemon_log(env);
    assert!(
        log.contains("state.db") && log.contains("rebuil"),
        "{context}: the daemon log must say state.db was rebuilt:\n{log}"
    );
    assert!(
        log.contains("not rebuilt") || log.contains("cannot be rebuilt"),
        "{context}: the log names what cannot be rebuilt:\n{log}"
    );
}

fn daemon_log(env: &Env) -> String {
    let mut text = String::new();
    for entry in std::fs::read_dir(env.home.join("logs"))
        .expect("logs")
        .flatten()
    {
        if entry.file_name().to_string_lossy().starts_with("daemon") {
            text.push_str(&std::fs::read_to_string(entry.path()).unwrap_or_default());
        }
    }
    text
}

#[test]
fn damaged_state_db_with_the_daemon_stopped_is_rebuilt() {
    for damage in Damage::ALL {
        let env = Env::new();
        let expected = populate(&env);
        stop_daemon(&env);
        damage.apply(&env);
        start_daemon(&env);
        let context = format!("{damage:?} while stopped");
        wait_for_index(&env);
        check_workspace(&env, "lab", &expected, &context);
        check_reported(&env, damage, &context);
        assert_eq!(
            moved_aside(&env).len(),
            usize::from(damage.moves_aside()),
            "{context}: {:?}",
            moved_aside(&env)
        );
        // Nothing but the rebuild happened: a restart finds a sound state.db and
        // rebuilds nothing twice.
        stop_daemon(&env);
        start_daemon(&env);
        wait_for_index(&env);
        check_workspace(&env, "lab", &expected, &format!("{context}, restarted"));
        let json: Value =
            serde_json::from_str(&env.ok(&["daemon", "status", "--json"])).expect("json");
        assert_eq!(json["state_db"]["rebuilt"], false, "{context}: {json}");
    }
}

#[test]
fn damaged_state_db_under_a_live_daemon_is_rebuilt_on_restart() {
    for damage in Damage::ALL {
        let env = Env::new();
        let mut expected = populate(&env);
        damage.apply(&env);
        // The daemon goes on as well as it can; whatever it acknowledges now must
        // survive too.
        let mut session = Session::open(&env, "lab");
        let result = session.call(
            "write",
            json!({"command": "create", "path": "wiki/late.md", "content": "# Late\n\nlatemarker\n"}),
        );
        if result["isError"] == false {
            expected.acked.push(Acked {
                run_id: result["structuredContent"]["run_id"]
                    .as_str()
                    .expect("run_id")
                    .into(),
                op: "create".into(),
                path: "wiki/late.md".into(),
            });
            expected
                .findable
                .push(("latemarker".into(), "wiki/late.md".into()));
        }
        drop(session);
        stop_daemon(&env);
        start_daemon(&env);
        let context = format!("{damage:?} under a live daemon");
        wait_for_index(&env);
        check_workspace(&env, "lab", &expected, &context);
    }
}

#[test]
fn a_second_rebuild_adds_no_duplicates() {
    let env = Env::new();
    let expected = populate(&env);
    for round in 0..2 {
        stop_daemon(&env);
        Damage::Delete.apply(&env);
        start_daemon(&env);
        wait_for_index(&env);
        check_workspace(&env, "lab", &expected, &format!("rebuild {round}"));
    }
    // The history is the same size after a plain restart.
    let mut session = Session::open(&env, "lab");
    let before = session.history().len();
    drop(session);
    stop_daemon(&env);
    start_daemon(&env);
    wait_for_index(&env);
    let mut session = Session::open(&env, "lab");
    assert_eq!(session.history().len(), before);
}

#[test]
fn workspaces_copied_or_cloned_by_hand_are_adopted_with_their_history() {
    let env = Env::new();
    let expected = populate(&env);
    let workspaces = env.home.join("workspaces");
    // While the daemon runs: a copy and a clone appear in workspaces/.
    let copied = Command::new("cp")
        .args(["-a"])
        .arg(workspaces.join("lab"))
        .arg(workspaces.join("copied"))
        .status()
        .expect("cp");
    assert!(copied.success());
    let _ = std::fs::remove_dir_all(workspaces.join("copied/runs"));
    git(
        &workspaces,
        &[
            "clone",
            "-q",
            workspaces.join("lab").to_str().expect("utf-8"),
            "cloned",
        ],
    );
    for slug in ["copied", "cloned"] {
        assert!(
            wait_until(Duration::from_secs(20), || env
                .ok(&["workspace", "list"])
                .contains(slug)),
            "{slug} is listed"
        );
    }
    wait_for_index(&env);
    for slug in ["lab", "copied", "cloned"] {
        check_workspace(&env, slug, &expected, &format!("adopted {slug}"));
    }
}

#[test]
fn a_failing_open_fails_fast_and_frees_the_pidfile() {
    // state.db is a directory: it cannot be opened, and it is not ours to move. The
    // daemon must say so at once and exit, so that the next start is not refused.
    let env = Env::new();
    env.ok(&["init"]);
    stop_daemon(&env);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", state_db(&env).display()));
    }
    std::fs::create_dir(state_db(&env)).expect("mkdir");
    std::fs::write(state_db(&env).join("keep"), "x").expect("write");
    let started = Instant::now();
    let output = env.run(&["daemon", "start"]);
    let elapsed = started.elapsed();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "start must fail: {stderr}");
    assert!(
        stderr.contains("state.db"),
        "the error names state.db: {stderr}"
    );
    assert!(!stderr.contains("did not report ready"), "{stderr}");
    assert!(elapsed < Duration::from_secs(3), "took {elapsed:?}");
    // Nothing lingers holding the pidfile.
    let pidfile_free = wait_until(Duration::from_secs(2), || {
        std::fs::File::open(env.home.join("run/daemon.pid"))
            .map(|file| file.try_lock().is_ok())
            .unwrap_or(true)
    });
    assert!(pidfile_free, "a failed daemon still holds the pidfile");
    // Fix it, and the next start works at once.
    std::fs::remove_dir_all(state_db(&env)).expect("rm");
    start_daemon(&env);
}

#[test]
fn guide_and_workspace_list_say_indexing_while_a_rebuild_runs() {
    // Enough pages that indexing them takes a while after the daemon is ready.
    let env = Env::new();
    env.ok(&["init"]);
    env.ok(&["workspace", "create", "big"]);
    stop_daemon(&env);
    let wiki = env.workspace_dir("big").join("wiki");
    for n in 0..6000 {
        let dir = wiki.join(format!("d{}", n / 500));
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(
            dir.join(format!("p{n}.md")),
            format!("# Page {n}\n\nbody of page {n}, word w{n}x and some more text\n"),
        )
        .expect("write page");
    }
    Damage::Delete.apply(&env);
    start_daemon(&env);
    let listed = env.ok(&["workspace", "list"]);
    let line = listed
        .lines()
        .find(|l| l.starts_with("big "))
        .unwrap_or_default();
    assert!(line.contains("indexing"), "{listed}");
    let mut session = Session::open(&env, "big");
    let started = Instant::now();
    let guide = session.call("guide", json!({}));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "guide must not wait for the index: {:?}",
        started.elapsed()
    );
    let text = guide["content"][0]["text"].as_str().unwrap_or_default();
    let indexing = guide["structuredContent"]["indexing"].as_str();
    assert!(
        indexing.is_some_and(|i| i.starts_with("indexing")) && text.contains("indexing"),
        "{guide}"
    );
    // search waits for the index, then finds the last page.
    let hits = session.search("w5999x");
    assert_eq!(hits, vec!["wiki/d11/p5999.md".to_string()]);
    wait_for_index(&env);
    let guide = session.call("guide", json!({}));
    assert!(guide["structuredContent"]["indexing"].is_null(), "{guide}");
    assert!(
        guide["structuredContent"]["wiki_pages"]
            .as_i64()
            .is_some_and(|n| n >= 6000),
        "{guide}"
    );
}

/// The sources a user set up, what they captured and what they dismissed survive
/// losing state.db: the sources come back from the workspace's ledger, captured files
/// are recognised in raw/sources/ (not captured twice), dismissed items stay dismissed.
#[test]
fn sources_captures_and_dismissals_survive_losing_state_db() {
    let env = Env::new();
    env.ok(&["init"]);
    env.ok(&["workspace", "create", "lab"]);
    let inbox = tempfile::tempdir().expect("inbox");
    for (name, text) in [
        ("keep.md", "# Keep\n\nsaved\n"),
        ("drop.md", "# Drop\n\nnoise\n"),
        ("later.md", "# Later\n\nundecided\n"),
    ] {
        std::fs::write(inbox.path().join(name), text).expect("write");
    }
    // A file counts once it has been unchanged for a second.
    std::thread::sleep(Duration::from_millis(1100));
    let folder = inbox.path().to_str().expect("utf8");
    env.ok(&[
        "source",
        "add",
        "lab",
        "folder",
        folder,
        "--name",
        "inbox",
        "--no-auto",
    ]);
    env.ok(&["source", "sync", "lab", "inbox"]);
    let items = |state: &str| -> Vec<Value> {
        let out = env.ok(&["subscription", "list", "lab", "--state", state, "--json"]);
        serde_json::from_str::<Value>(&out)
            .expect("json")
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    let id_of = |title: &str| {
        items("pending")
            .iter()
            .find(|i| i["title"] == title)
            .and_then(|i| i["id"].as_i64())
            .expect("a pending item")
            .to_string()
    };
    let (keep, drop) = (id_of("keep.md"), id_of("drop.md"));
    env.ok(&["subscription", "ingest", "lab", &keep]);
    env.ok(&["subscription", "dismiss", "lab", &drop]);
    let captured_dir = env.workspace_dir("lab").join("raw/sources/inbox");
    assert!(captured_dir.join("keep.md").is_file());

    stop_daemon(&env);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(env.home.join(format!("state.db{suffix}")));
    }

    let listed: Value =
        serde_json::from_str(&env.ok(&["source", "list", "lab", "--json"])).expect("json");
    assert_eq!(listed[0]["name"], "inbox", "the source is back: {listed}");
    assert_eq!(listed[0]["kind"], "folder");
    assert_eq!(listed[0]["auto"], false);
    env.ok(&["source", "sync", "lab", "inbox"]);
    let pending: Vec<String> = items("pending")
        .iter()
        .map(|i| i["title"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(
        pending,
        vec!["later.md".to_string()],
        "only the undecided item is pending again"
    );
    let captured = items("captured");
    assert_eq!(captured.len(), 1, "{captured:?}");
    assert_eq!(captured[0]["raw_path"], "raw/sources/inbox/keep.md");
    assert_eq!(items("dismissed").len(), 1);
    let files: Vec<_> = std::fs::read_dir(&captured_dir)
        .expect("captured dir")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(files.len(), 1, "nothing captured twice: {files:?}");
}

/// A clean stop lets the next start skip `PRAGMA quick_check` (seconds at 10k+ pages),
/// but only for the file exactly as that daemon left it: after a kill -9, or when the
/// file was touched while the daemon was stopped, the next start checks in full, and a
/// damaged file is still moved aside.
#[test]
fn a_clean_stop_skips_the_full_check_only_for_an_untouched_file() {
    let env = Env::new();
    env.ok(&["init"]);
    env.ok(&["workspace", "create", "lab"]);
    let stamp = env.home.join("state.db.clean");
    // Any command but `daemon status` starts the daemon.
    let status = |env: &Env| {
        env.ok(&["workspace", "list"]);
        env.ok(&["daemon", "status"])
    };

    stop_daemon(&env);
    assert!(stamp.is_file(), "a clean stop leaves its stamp");
    let text = status(&env);
    assert!(text.contains("full check was skipped"), "{text}");
    assert!(!stamp.exists(), "a stamp counts once");

    // Killed: no stamp, a full check.
    env.kill_daemon();
    assert!(!stamp.exists());
    let text = status(&env);
    assert!(text.contains("checked at start, sound"), "{text}");

    // Stopped cleanly, then the file is damaged while nothing runs: checked, moved aside.
    stop_daemon(&env);
    assert!(stamp.is_file());
    let path = state_db(&env);
    let mut bytes = std::fs::read(&path).expect("state.db");
    let len = bytes.len();
    bytes[100..len.min(4096)].fill(0xA5);
    std::fs::write(&path, &bytes).expect("damage state.db");
    let text = status(&env);
    assert!(
        !text.contains("full check was skipped") && text.contains("rebuilt"),
        "{text}"
    );
    assert_eq!(moved_aside(&env).len(), 1, "the damaged file is kept aside");
}
