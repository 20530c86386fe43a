//! The ranked search index (issue 15): a write is found by the next search, before and
//! after the index commits it; deletes drop out at once; a lost or damaged index is
//! rebuilt from state.db (at start, or when its directory is deleted while the daemon
//! runs); a search during a build waits for it, or says the results are incomplete;
//! the query language is FTS5's, as before the index.

use std::time::{Duration, Instant};

use alexandria_tests::{Env, RawShim, error_code, process_alive, wait_until};
use serde_json::{Value, json};

struct Session {
    shim: RawShim,
    id: i64,
}

impl Session {
    fn open(env: &Env) -> Session {
        let mut shim = env.raw_shim(Some("lab"));
        shim.initialize("2025-06-18");
        Session { shim, id: 1 }
    }

    fn call(&mut self, name: &str, arguments: Value) -> Value {
        self.id += 1;
        let reply = self.shim.request(
            self.id,
            "tools/call",
            json!({"name": name, "arguments": arguments}),
        );
        let result = reply["result"].clone();
        assert_eq!(result["isError"], false, "{name} {arguments}: {reply}");
        result
    }

    /// Paths found for `query`, sorted, with every snippet checked for a highlight.
    fn found(&mut self, query: &str) -> Vec<String> {
        let result = self.call("search", json!({"query": query, "limit": 50}));
        let hits = result["structuredContent"]["hits"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for hit in &hits {
            assert!(
                hit["snippet"].as_str().is_some_and(|s| s.contains("**")),
                "{query}: {hit}"
            );
        }
        let mut paths: Vec<String> = hits
            .iter()
            .filter_map(|h| h["path"].as_str().map(str::to_string))
            .collect();
        paths.sort();
        paths
    }

    /// Every path found for `query` (up to the largest limit), sorted.
    fn found_all(&mut self, query: &str) -> Vec<String> {
        let result = self.call("search", json!({"query": query, "limit": 1000}));
        let mut paths: Vec<String> = result["structuredContent"]["hits"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .filter_map(|h| h["path"].as_str().map(str::to_string))
            .collect();
        paths.sort();
        paths.dedup();
        paths
    }

    fn index_status(&mut self) -> Value {
        self.call("guide", json!({}))["structuredContent"]["search_index"].clone()
    }

    /// Wait until the index is open and has committed everything queued.
    fn wait_for_index(&mut self) {
        let mut status = Value::Null;
        let ready = wait_until(Duration::from_secs(60), || {
            status = self.call("guide", json!({}))["structuredContent"]["search_index"].clone();
            status["ready"] == true && status["queued"] == 0
        });
        assert!(ready, "search index not ready: {status}");
    }

    /// A search whose result is an error: its code.
    fn error(&mut self, query: &str) -> String {
        self.id += 1;
        let reply = self.shim.request(
            self.id,
            "tools/call",
            json!({"name": "search", "arguments": {"query": query}}),
        );
        error_code(&reply["result"]).unwrap_or_default().to_string()
    }

    fn write(&mut self, path: &str, content: &str) {
        self.call(
            "write",
            json!({"command": "create", "path": path, "content": content}),
        );
    }
}

fn paths(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| format!("wiki/{n}")).collect()
}

/// The same answers while a change is only in the overlay, once the index committed
/// it, after a restart, and after the index was deleted or damaged.
#[test]
fn search_index_follows_writes_restarts_and_losses() {
    let env = lab_home();
    let mut session = Session::open(&env);
    session.wait_for_index();
    session.write(
        "wiki/a.md",
        "# A\n\nThe wombats were digging a big burrow.\n",
    );
    session.write(
        "wiki/b.md",
        "# B\n\n## Holes\nA big burrow and a small one.\n",
    );
    session.write("wiki/c.md", "# C\n\nNothing here but kelp.\n");
    let expect = |session: &mut Session| {
        assert_eq!(session.found("burrow"), paths(&["a.md", "b.md"]));
        assert_eq!(session.found("\"big burrow\""), paths(&["a.md", "b.md"]));
        assert_eq!(session.found("wombat digging"), paths(&["a.md"]));
        assert_eq!(session.found("\"burrow big\""), Vec::<String>::new());
    };
    // At once (the writes may still be queued), then once committed.
    expect(&mut session);
    session.wait_for_index();
    expect(&mut session);

    // Cursors page through the same ranked list.
    let first = session.call("search", json!({"query": "burrow", "limit": 1}));
    let cursor = first["structuredContent"]["next_cursor"]
        .as_str()
        .expect("a cursor")
        .to_string();
    let second = session.call(
        "search",
        json!({"query": "burrow", "limit": 1, "cursor": cursor}),
    );
    let mut both = vec![
        first["structuredContent"]["hits"][0]["path"].clone(),
        second["structuredContent"]["hits"][0]["path"].clone(),
    ];
    both.sort_by_key(|p| p.to_string());
    assert_eq!(both, vec![json!("wiki/a.md"), json!("wiki/b.md")]);
    assert!(second["structuredContent"]["next_cursor"].is_null());

    // A delete drops out of the next search, committed or not.
    session.call("delete", json!({"path": "wiki/b.md"}));
    assert_eq!(session.found("burrow"), paths(&["a.md"]));
    session.wait_for_index();
    assert_eq!(session.found("burrow"), paths(&["a.md"]));
    drop(session);

    // The index is deleted and a page edited by hand while the daemon is stopped.
    env.ok(&["daemon", "stop"]);
    std::fs::remove_dir_all(env.home.join("search-index")).expect("remove the index");
    std::fs::write(
        env.workspace_dir("lab").join("wiki/e.md"),
        "# E\n\nAnother burrow, dug by hand.\n",
    )
    .expect("hand edit");
    let mut session = Session::open(&env);
    assert_eq!(session.found("burrow"), paths(&["a.md", "e.md"]));
    session.wait_for_index();
    assert_eq!(session.found("burrow"), paths(&["a.md", "e.md"]));
    drop(session);

    // A damaged index is rebuilt too.
    env.ok(&["daemon", "stop"]);
    std::fs::write(env.home.join("search-index/meta.json"), "{ not json").expect("damage");
    let mut session = Session::open(&env);
    assert_eq!(session.found("burrow"), paths(&["a.md", "e.md"]));
    session.wait_for_index();
    assert_eq!(session.found("burrow"), paths(&["a.md", "e.md"]));
    assert_eq!(session.found("kelp"), paths(&["c.md"]));
}

/// The index stays right when the daemon is killed with changes handed to the index
/// but not committed, and when state.db is lost (a new database: the index made from
/// the old one is rebuilt, not trusted).
#[test]
fn search_index_survives_a_kill_and_a_lost_state_db() {
    let env = lab_home();
    let mut session = Session::open(&env);
    session.wait_for_index();
    session.write("wiki/a.md", "# A\n\nA burrow of wombats.\n");
    session.write("wiki/gone.md", "# Gone\n\nA burrow to delete.\n");
    session.wait_for_index();
    // Killed right after these: the index has not committed them (it commits at most
    // once a second), and may have begun to.
    session.write("wiki/b.md", "# B\n\nA second burrow.\n");
    session.call("delete", json!({"path": "wiki/gone.md"}));
    session.write("wiki/c.md", "# C\n\nA third burrow, and kelp.\n");
    drop(session);
    env.kill_daemon();
    let expected = paths(&["a.md", "b.md", "c.md"]);
    let mut session = Session::open(&env);
    assert_eq!(session.found("burrow"), expected);
    session.wait_for_index();
    assert_eq!(session.found("burrow"), expected);
    assert_eq!(session.found("\"third burrow\""), paths(&["c.md"]));
    drop(session);

    // state.db lost: rebuilt from the files; the index follows the new database.
    env.ok(&["daemon", "stop"]);
    for name in ["state.db", "state.db-wal", "state.db-shm"] {
        let _ = std::fs::remove_file(env.home.join(name));
    }
    std::fs::remove_file(env.workspace_dir("lab").join("wiki/a.md")).expect("rm a.md");
    let mut session = Session::open(&env);
    let expected = paths(&["b.md", "c.md"]);
    assert_eq!(session.found("burrow"), expected);
    session.wait_for_index();
    assert_eq!(session.found("burrow"), expected);
    assert_eq!(session.found("kelp"), paths(&["c.md"]));
}

/// A new home with the workspace `lab` (its daemon running).
fn lab_home() -> Env {
    let env = Env::new();
    env.ok(&["init"]);
    env.ok(&["workspace", "create", "lab"]);
    env
}

/// Pages for a cold build: every 7th holds "quokka", every 11th the phrase "red kelp
/// forest", the page after it both of its word pairs but never the phrase.
fn write_pages(env: &Env, pages: usize) -> (Vec<String>, Vec<String>) {
    let wiki = env.workspace_dir("lab").join("wiki");
    let (mut quokkas, mut phrases) = (Vec::new(), Vec::new());
    for i in 0..pages {
        let mut text = format!("# Page {i}\n\nSome words about burrows and the sea, page {i}.\n");
        if i % 7 == 0 {
            text.push_str("A quokka lives here.\n");
            quokkas.push(format!("wiki/p{i}.md"));
        }
        if i % 11 == 0 {
            text.push_str("Under the red kelp forest.\n");
            phrases.push(format!("wiki/p{i}.md"));
        } else if i % 11 == 1 {
            text.push_str("The red kelp, and a kelp forest.\n");
        }
        std::fs::write(wiki.join(format!("p{i}.md")), text).expect("write page");
    }
    quokkas.sort();
    phrases.sort();
    (quokkas, phrases)
}

/// A daemon killed in the middle of its first build (right before it commits the bulk
/// load) answers the same after a restart, before and after the index has caught up;
/// a phrase whose word pairs are all in a page, but not together, is not found.
#[test]
fn search_index_killed_mid_build_catches_up() {
    let mut env = lab_home();
    env.ok(&["daemon", "stop"]);
    let (quokkas, phrases) = write_pages(&env, 1_500);
    // No index: the next daemon's first build is one bulk load of all 1,500 pages.
    // (Left in place, what the last daemon committed of it decided the path: under load
    // it had committed few pages, the next daemon committed the rest as usual, and only
    // then rebuilt it in bulk because it had grown.)
    std::fs::remove_dir_all(env.home.join("search-index")).expect("remove the index");
    // The segments committed to the index (none when it is not there).
    let committed = || -> usize {
        std::fs::read_to_string(env.home.join("search-index/meta.json"))
            .ok()
            .and_then(|text| serde_json::from_str::<Value>(&text).ok())
            .and_then(|meta| meta["segments"].as_array().map(Vec::len))
            .unwrap_or(0)
    };
    let check = |session: &mut Session, when: &str| {
        assert_eq!(session.found_all("quokka"), quokkas, "{when}");
        assert_eq!(session.found_all("\"red kelp forest\""), phrases, "{when}");
        assert_eq!(
            session.found_all("\"forest kelp red\""),
            Vec::<String>::new(),
            "{when}"
        );
    };

    env.faults = Some("crash:search-index-bulk-commit".into());
    let mut shim = env.raw_shim(Some("lab"));
    shim.initialize("2025-06-18");
    let mut pid = None;
    assert!(
        wait_until(Duration::from_secs(30), || {
            pid = env.daemon_pid();
            pid.is_some()
        }),
        "no daemon"
    );
    let pid = pid.expect("pid");
    assert!(
        wait_until(Duration::from_secs(60), || !process_alive(pid)),
        "the daemon never reached the commit of its first build"
    );
    drop(shim);
    assert_eq!(committed(), 0, "the build was committed before the kill");

    env.faults = None;
    let mut session = Session::open(&env);
    // The first search waits for the build.
    check(&mut session, "after the kill");
    session.wait_for_index();
    check(&mut session, "once the index caught up");
    drop(session);

    // Restarted with the index whole: it is used at once, and is right.
    env.ok(&["daemon", "stop"]);
    let mut session = Session::open(&env);
    session.wait_for_index();
    check(&mut session, "after a restart");
}

/// A home whose daemon is stopped, with `pages` new pages and no search index: the
/// next daemon builds it from scratch.
fn home_to_build(pages: usize) -> (Env, Vec<String>) {
    let env = lab_home();
    env.ok(&["daemon", "stop"]);
    let (quokkas, _) = write_pages(&env, pages);
    std::fs::remove_dir_all(env.home.join("search-index")).expect("remove the index");
    (env, quokkas)
}

/// A home whose next daemon builds the index from scratch with its commit held back
/// `held_ms`, and a session checked to see it not ready yet.
fn building_for(held_ms: u64) -> (Env, Vec<String>, Session) {
    let (mut env, quokkas) = home_to_build(1_200);
    env.faults = Some(format!("delay:search-index-commit:{held_ms}"));
    let mut session = Session::open(&env);
    let status = session.index_status();
    assert_eq!(status["ready"], false, "{status}");
    (env, quokkas, session)
}

/// A search that comes while the index is being built waits for it and answers in
/// full (the build's commit is held back 1.5 s).
#[test]
fn a_search_during_the_cold_build_waits_for_the_index() {
    let (_env, quokkas, mut session) = building_for(1_500);
    let started = Instant::now();
    let result = session.call("search", json!({"query": "quokka", "limit": 1000}));
    let waited = started.elapsed();
    let mut found: Vec<String> = result["structuredContent"]["hits"]
        .as_array()
        .expect("hits")
        .iter()
        .map(|h| h["path"].as_str().expect("path").to_string())
        .collect();
    found.sort();
    assert_eq!(found, quokkas);
    assert!(
        result["structuredContent"]["indexing"].is_null(),
        "{}",
        result["structuredContent"]
    );
    assert!(
        waited >= Duration::from_millis(500),
        "answered after {waited:?}: before the index was built?"
    );
}

/// A search that waits for the index never holds up the daemon (issue 15, part 3):
/// with more searches waiting for the cold build than the daemon has async workers
/// (two), another session's `guide` and `read` still answer at once. Quick tools run
/// inline on the worker and hand its tasks off where they wait (`blocking::section`):
/// without that, or when a section after a short one (whose core tokio gave back) did
/// not hand off again, these calls waited for the whole build (held back 8 s).
#[test]
fn searches_waiting_for_the_build_do_not_hold_up_other_calls() {
    let (env, quokkas, mut other) = building_for(8_000);
    // A read waits for the workspace's catch-up (in a section of its own), so the
    // searches below go straight to their wait for the index.
    other.call("read", json!({"path": &quokkas[0]}));
    let waiting: Vec<_> = (0..3)
        .map(|_| {
            let mut session = Session::open(&env);
            std::thread::spawn(move || {
                let result = session.call("search", json!({"query": "quokka", "limit": 1000}));
                result["structuredContent"]["hits"]
                    .as_array()
                    .map_or(0, Vec::len)
            })
        })
        .collect();
    // Let the searches reach their wait.
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..3 {
        let started = Instant::now();
        other.call("guide", json!({}));
        other.call("read", json!({"path": &quokkas[0]}));
        let took = started.elapsed();
        assert!(
            took < Duration::from_millis(1_000),
            "guide and read took {took:?} while searches waited for the index"
        );
    }
    assert_eq!(
        other.index_status()["ready"],
        false,
        "the build ended too soon"
    );
    for search in waiting {
        assert_eq!(search.join().expect("search thread"), quokkas.len());
    }
}

/// A search that waits longer than it may (here 0.3 s, while the build's commit is held
/// back 4 s) answers from what the index holds and says the results are incomplete;
/// once the index is built, in full.
#[test]
fn a_search_that_cannot_wait_says_its_results_are_incomplete() {
    let (mut env, quokkas) = home_to_build(1_200);
    env.faults = Some("delay:search-index-commit:4000,delay:search-wait:300".into());
    let mut session = Session::open(&env);
    let result = session.call("search", json!({"query": "quokka", "limit": 1000}));
    assert_eq!(
        result["structuredContent"]["indexing"], true,
        "{}",
        result["structuredContent"]
    );
    let text = result["content"][0]["text"].as_str().expect("text");
    assert!(text.contains("still being built"), "{text}");
    session.wait_for_index();
    assert_eq!(session.found_all("quokka"), quokkas);
}

/// The index directory deleted while the daemon runs: a write is still found at once,
/// and the index is rebuilt from state.db (the indexer finds it gone at its next
/// commit), here and after a restart.
#[test]
fn an_index_deleted_while_the_daemon_runs_is_rebuilt() {
    let env = lab_home();
    let mut session = Session::open(&env);
    session.wait_for_index();
    session.write("wiki/a.md", "# A\n\nA burrow of wombats.\n");
    session.wait_for_index();
    std::fs::remove_dir_all(env.home.join("search-index")).expect("remove the index");
    session.write("wiki/b.md", "# B\n\nA second burrow.\n");
    let expected = paths(&["a.md", "b.md"]);
    assert_eq!(session.found("burrow"), expected);
    session.wait_for_index();
    assert!(env.home.join("search-index/meta.json").exists());
    assert_eq!(session.found("burrow"), expected);
    session.write("wiki/c.md", "# C\n\nA third burrow.\n");
    session.wait_for_index();
    let expected = paths(&["a.md", "b.md", "c.md"]);
    assert_eq!(session.found("burrow"), expected);
    drop(session);
    env.ok(&["daemon", "stop"]);
    let mut session = Session::open(&env);
    assert_eq!(session.found("burrow"), expected);
}

/// The query language is FTS5's, as before the index: phrases, prefixes, OR, NOT,
/// NEAR, column filters; malformed input is `invalid_query`.
#[test]
fn search_takes_the_query_language_as_before() {
    let env = lab_home();
    let mut session = Session::open(&env);
    session.write(
        "wiki/a.md",
        "# A\n\nThe wombats were running through the big burrow.\n",
    );
    session.write(
        "wiki/b.md",
        "# B\n\nA burrow, big and deep, and kelp nearby.\n",
    );
    session.write("wiki/c.md", "# C\n\nKelp forests. Running water.\n");
    for when in ["at once", "once committed"] {
        if when != "at once" {
            session.wait_for_index();
        }
        for (query, expected) in [
            ("burrow", &["a.md", "b.md"][..]),
            ("\"big burrow\"", &["a.md"]),
            ("\"burrow big\"", &["b.md"]),
            ("run*", &["a.md", "c.md"]),
            ("\"the big bur\" *", &["a.md"]),
            ("kelp OR wombat", &["a.md", "b.md", "c.md"]),
            ("burrow NOT kelp", &["a.md"]),
            ("(kelp OR wombat) NOT running", &["b.md"]),
            ("NEAR(burrow kelp, 5)", &["b.md"]),
            ("NEAR(burrow kelp, 1)", &[]),
            ("body:(kelp)", &["b.md", "c.md"]),
            ("-heading:(kelp)", &["b.md", "c.md"]),
            ("heading:(kelp)", &[]),
            // No syntax: the words of "body:kelp", as before.
            ("body:kelp", &[]),
            ("wombats + were", &["a.md"]),
            ("\"+++\" kelp", &["b.md", "c.md"]),
        ] {
            assert_eq!(session.found(query), paths(expected), "{query} ({when})");
        }
        for query in ["\"unbalanced", "burrow AND", "nosuchcolumn:(kelp)", "(kelp"] {
            assert_eq!(session.error(query), "invalid_query", "{query} ({when})");
        }
    }
}

/// A prefix that begins many terms (past the few that are scored one by one) still
/// finds every page with any of them, alone, with other words, under NOT, and page by
/// page through the cursor with no page twice.
#[test]
fn a_prefix_of_many_terms_finds_every_page() {
    let env = lab_home();
    let mut session = Session::open(&env);
    let mut expected = Vec::new();
    for i in 0..24 {
        // zeba, zebb, … : 24 terms that begin "zeb"; every third page also has kelp.
        let word = format!("zeb{}", char::from(b'a' + i));
        let kelp = if i % 3 == 0 { " and kelp" } else { "" };
        let name = format!("p{i:02}.md");
        session.write(
            &format!("wiki/{name}"),
            &format!("# P\n\nThe {word} grazed{kelp}.\n"),
        );
        expected.push(name);
    }
    session.write("wiki/other.md", "# O\n\nZoo-free kelp.\n");
    let all: Vec<&str> = expected.iter().map(String::as_str).collect();
    let with_kelp: Vec<&str> = all.iter().copied().step_by(3).collect();
    let without: Vec<&str> = all
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 3 != 0)
        .map(|(_, n)| *n)
        .collect();
    for when in ["at once", "once committed"] {
        if when != "at once" {
            session.wait_for_index();
        }
        assert_eq!(session.found("zeb*"), paths(&all), "zeb* ({when})");
        assert_eq!(session.found("zeb* kelp"), paths(&with_kelp), "({when})");
        assert_eq!(session.found("zeb* NOT kelp"), paths(&without), "({when})");
        let mut seen = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut arguments = json!({"query": "zeb*", "limit": 5});
            if let Some(cursor) = &cursor {
                arguments["cursor"] = json!(cursor);
            }
            let page = session.call("search", arguments);
            for hit in page["structuredContent"]["hits"].as_array().expect("hits") {
                seen.push(hit["path"].as_str().expect("a path").to_string());
            }
            match page["structuredContent"]["next_cursor"].as_str() {
                Some(next) => cursor = Some(next.to_string()),
                None => break,
            }
        }
        let count = seen.len();
        seen.sort();
        seen.dedup();
        assert_eq!(
            seen.len(),
            count,
            "a page twice through the cursor ({when})"
        );
        assert_eq!(seen, paths(&all), "through the cursor ({when})");
    }
}

/// Folders changed by hand while the daemon runs: one made elsewhere and moved in at
/// once (no event comes for its pages), renamed in place, moved out, and a deep one
/// made and written into. Each is caught up where it is (not by a walk of the whole
/// workspace), and search follows.
#[test]
fn folders_moved_in_renamed_and_moved_out_by_hand_are_followed() {
    let env = lab_home();
    let mut session = Session::open(&env);
    session.write("wiki/seed.md", "# Seed\n\nnothing to find here\n");
    let root = env.workspace_dir("lab");
    // Outside the workspaces, on the same file system (a rename, not a copy).
    let scratch = env.home.join("scratch");
    std::fs::create_dir_all(scratch.join("trip/days")).expect("mkdir");
    for n in 0..3 {
        std::fs::write(
            scratch.join(format!("trip/days/d{n}.md")),
            format!("# Day {n}\n\nA wombatfolder day.\n"),
        )
        .expect("write");
    }
    let under = |folder: &str| -> Vec<String> {
        (0..3)
            .map(|n| format!("wiki/{folder}/days/d{n}.md"))
            .collect()
    };
    // Search, and the catalogue's count of pages (those there now and these).
    let before = session.call("guide", json!({}))["structuredContent"]["wiki_pages"]
        .as_u64()
        .expect("wiki_pages");
    let follows = |session: &mut Session, expected: &[String], what: &str| {
        let mut seen = (Vec::new(), Value::Null);
        let followed = wait_until(Duration::from_secs(15), || {
            seen = (
                session.found("wombatfolder"),
                session.call("guide", json!({}))["structuredContent"]["wiki_pages"].clone(),
            );
            seen == (expected.to_vec(), json!(before as usize + expected.len()))
        });
        assert!(
            followed,
            "{what}: {seen:?}, expected {before} + {expected:?}"
        );
    };
    std::fs::rename(scratch.join("trip"), root.join("wiki/trip")).expect("move in");
    follows(&mut session, &under("trip"), "moved in");
    std::fs::rename(root.join("wiki/trip"), root.join("wiki/journey")).expect("rename");
    follows(&mut session, &under("journey"), "renamed");
    std::fs::rename(root.join("wiki/journey"), scratch.join("journey")).expect("move out");
    follows(&mut session, &[], "moved out");
    std::fs::create_dir_all(root.join("wiki/x/y/z")).expect("mkdir");
    std::fs::write(root.join("wiki/x/y/z/p.md"), "# P\n\nwombatfolder deep\n").expect("write");
    follows(&mut session, &["wiki/x/y/z/p.md".to_string()], "made deep");
    // The catalogue agrees: `read` of an old path is not found.
    session.id += 1;
    let reply = session.shim.request(
        session.id,
        "tools/call",
        json!({"name": "read", "arguments": {"path": "wiki/trip/days/d0.md"}}),
    );
    assert_eq!(error_code(&reply["result"]), Some("not_found"), "{reply}");
}
