//! End-to-end tests of the write path: concurrency, optimistic concurrency, the
//! workspace lock, crash recovery at every fault point, citations, protected paths,
//! outside edits.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use alexandria_tests::{Env, call, error_code, make_pdf, text_of, wait_until};
use serde_json::{Value, json};

fn git(dir: &Path, args: &[&str]) -> String {
    let output = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .expect("git");
    assert!(
        output.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// `git status` is clean: git's index is updated with every commit, before the write
/// is acknowledged (issue 16), so there is nothing to wait for.
fn git_status_settles(root: &Path) -> bool {
    alexandria_tests::wait_index_written(root);
    git(root, &["status", "--porcelain"]).trim().is_empty()
}

fn commit_count(env: &Env, workspace: &str) -> usize {
    git(
        &env.workspace_dir(workspace),
        &["rev-list", "--count", "HEAD"],
    )
    .trim()
    .parse()
    .expect("count")
}

/// A workspace `lab` with a 3-page PDF and a note to cite.
fn lab_env(env: Env) -> Env {
    env.ok(&["init"]);
    env.ok(&["workspace", "create", "lab"]);
    env.ingest(
        "lab",
        &[
            ("paper.pdf", &make_pdf(&["one", "two", "three"])),
            ("notes.md", b"# Notes\n"),
        ],
    );
    env
}

fn history_entries(result: &Value) -> Vec<Value> {
    result["structuredContent"]["entries"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_sessions_fifty_creates_each() -> anyhow::Result<()> {
    let env = lab_env(Env::new());
    let before = commit_count(&env, "lab");
    let mut tasks = Vec::new();
    for writer in 0..8 {
        let client = env.client(Some("lab")).await?;
        tasks.push(tokio::spawn(async move {
            for n in 0..50 {
                let content = format!(
                    "# Page {writer}-{n}\n\nUnique marker w{writer}n{n}marker. Source[^1].\n\n[^1]: raw/paper.pdf, p.2\n"
                );
                let result = call(
                    &client,
                    "write",
                    json!({"command": "create", "path": format!("wiki/w{writer}/p{n}.md"), "content": content}),
                )
                .await?;
                anyhow::ensure!(error_code(&result).is_none(), "write failed: {result}");
            }
            client.cancel().await?;
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let root = env.workspace_dir("lab");
    let pages = walk_count(&root.join("wiki"), "p");
    assert_eq!(pages, 400);
    let commits = commit_count(&env, "lab") - before;
    assert!((1..=400).contains(&commits), "{commits} commits");
    git(&root, &["fsck", "--strict"]);
    assert!(git_status_settles(&root));
    let client = env.client(Some("lab")).await?;
    let history = call(&client, "history", json!({"op": "create", "limit": 500})).await?;
    assert_eq!(history_entries(&history).len(), 400);
    for (writer, n) in [(0, 0), (3, 17), (7, 49)] {
        let hits = call(
            &client,
            "search",
            json!({"query": format!("w{writer}n{n}marker")}),
        )
        .await?;
        let found = hits["structuredContent"]["hits"].as_array().expect("hits");
        assert_eq!(found.len(), 1, "w{writer}n{n}");
        assert_eq!(found[0]["path"], format!("wiki/w{writer}/p{n}.md"));
    }
    let listed = call(
        &client,
        "search",
        json!({"mode": "list", "path": "wiki/w*/*.md", "limit": 1000}),
    )
    .await?;
    assert_eq!(listed["structuredContent"]["total"], 400);
    client.cancel().await?;
    Ok(())
}

/// Agent writes while other parts of the daemon write to state.db too (the rescanner
/// indexing pages saved by an editor, the search indexer): no write may fail because
/// state.db was busy. A deferred SQLite transaction that read before it wrote failed
/// at once with SQLITE_BUSY when another connection had committed since its read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_never_fail_on_a_busy_state_db_while_outside_edits_are_indexed() -> anyhow::Result<()>
{
    let env = lab_env(Env::new());
    let root = env.workspace_dir("lab");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let outside = {
        let root = root.clone();
        let stop = std::sync::Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut n = 0;
            std::fs::create_dir_all(root.join("wiki/outside")).expect("dir");
            while !stop.load(std::sync::atomic::Ordering::Acquire) {
                std::fs::write(
                    root.join(format!("wiki/outside/o{n}.md")),
                    format!("# Outside {n}\n\nsaved by an editor o{n}mark\n"),
                )
                .expect("outside write");
                n += 1;
                std::thread::sleep(Duration::from_millis(3));
            }
            n
        })
    };
    let mut tasks = Vec::new();
    for writer in 0..4 {
        let client = env.client(Some("lab")).await?;
        tasks.push(tokio::spawn(async move {
            let mut failures = Vec::new();
            for n in 0..40 {
                let result = call(
                    &client,
                    "write",
                    json!({"command": "create", "path": format!("wiki/b{writer}/p{n}.md"), "content": format!("# Busy {writer} {n}\n")}),
                )
                .await?;
                if let Some(code) = error_code(&result) {
                    failures.push(format!("{code}: {}", text_of(&result)));
                }
            }
            client.cancel().await?;
            anyhow::Ok(failures)
        }));
    }
    let mut failures = Vec::new();
    for task in tasks {
        failures.extend(task.await??);
    }
    stop.store(true, std::sync::atomic::Ordering::Release);
    let saved = outside.join().expect("outside thread");
    assert!(
        failures.is_empty(),
        "{} writes failed: {failures:?}",
        failures.len()
    );
    assert_eq!(walk_count(&root.join("wiki"), "p"), 160);
    // Every outside page is indexed in the end.
    let client = env.client(Some("lab")).await?;
    let mut listed = 0;
    wait_until(Duration::from_secs(20), || {
        let client = &client;
        listed = listed_count(client, "wiki/outside/*.md");
        listed == saved
    });
    assert_eq!(listed, saved, "outside pages indexed");
    client.cancel().await?;
    Ok(())
}

/// How many files `search(mode=list)` lists for `glob` (blocking, for `wait_until`).
fn listed_count(client: &rmcp::service::RunningService<rmcp::RoleClient, ()>, glob: &str) -> usize {
    let listed = tokio::task::block_in_place(|| {
        tokio::runtime::Handle::current().block_on(call(
            client,
            "search",
            json!({"mode": "list", "path": glob, "limit": 1000}),
        ))
    });
    listed
        .ok()
        .and_then(|l| l["structuredContent"]["total"].as_u64())
        .unwrap_or(0) as usize
}

fn walk_count(dir: &Path, prefix: &str) -> usize {
    let mut count = 0;
    for entry in std::fs::read_dir(dir).expect("dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            count += walk_count(&path, prefix);
        } else if path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(prefix))
        {
            count += 1;
        }
    }
    count
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appends_to_one_page_all_land_once() -> anyhow::Result<()> {
    let env = lab_env(Env::new());
    let client = env.client(Some("lab")).await?;
    let created = call(
        &client,
        "write",
        json!({"command": "create", "path": "wiki/log-of-birds.md", "content": "# Birds\n"}),
    )
    .await?;
    assert!(error_code(&created).is_none(), "{created}");
    let mut tasks = Vec::new();
    for writer in 0..8 {
        let client = env.client(Some("lab")).await?;
        tasks.push(tokio::spawn(async move {
            for n in 0..15 {
                let result = call(
                    &client,
                    "write",
                    json!({"command": "append", "path": "wiki/log-of-birds.md", "content": format!("- sighting s{writer}x{n}end")}),
                )
                .await?;
                anyhow::ensure!(error_code(&result).is_none(), "append failed: {result}");
            }
            client.cancel().await?;
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let text = std::fs::read_to_string(env.workspace_dir("lab").join("wiki/log-of-birds.md"))?;
    for writer in 0..8 {
        for n in 0..15 {
            let marker = format!("s{writer}x{n}end");
            assert_eq!(text.matches(&marker).count(), 1, "{marker}");
        }
    }
    assert_eq!(text.lines().count(), 1 + 8 * 15);
    let read = call(&client, "read", json!({"path": "wiki/log-of-birds.md"})).await?;
    let rev = read["structuredContent"]["rev"].as_str().expect("rev");
    assert_eq!(
        rev,
        git(
            &env.workspace_dir("lab"),
            &["rev-parse", "HEAD:wiki/log-of-birds.md"]
        )
        .trim()
    );
    client.cancel().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn str_replace_with_base_rev_one_wins_one_is_stale() -> anyhow::Result<()> {
    let env = lab_env(Env::new());
    let a = env.client(Some("lab")).await?;
    let b = env.client(Some("lab")).await?;
    let created = call(&a, "write", json!({"command": "create", "path": "wiki/plan.md", "content": "# Plan\n\nStatus: draft\n"})).await?;
    let rev = created["structuredContent"]["rev"]
        .as_str()
        .expect("rev")
        .to_string();
    let read = call(&b, "read", json!({"path": "wiki/plan.md"})).await?;
    assert_eq!(read["structuredContent"]["rev"], rev.as_str());
    let (ra, rb) = tokio::join!(
        call(
            &a,
            "write",
            json!({"command": "str_replace", "path": "wiki/plan.md", "old_str": "Status: draft", "new_str": "Status: approved", "base_rev": rev})
        ),
        call(
            &b,
            "write",
            json!({"command": "str_replace", "path": "wiki/plan.md", "old_str": "Status: draft", "new_str": "Status: rejected", "base_rev": rev})
        ),
    );
    let (ra, rb) = (ra?, rb?);
    let codes = [error_code(&ra), error_code(&rb)];
    assert!(
        codes.contains(&None) && codes.contains(&Some("stale_plan")),
        "{ra}\n{rb}"
    );
    let stale = if error_code(&ra).is_some() { &ra } else { &rb };
    assert!(
        stale["structuredContent"]["error"]["current_rev"]
            .as_str()
            .is_some()
    );
    // Without base_rev, the second writer's old_str is gone: no_match.
    let again = call(&b, "write", json!({"command": "str_replace", "path": "wiki/plan.md", "old_str": "Status: draft", "new_str": "x"})).await?;
    assert_eq!(error_code(&again), Some("no_match"));
    a.cancel().await?;
    b.cancel().await?;
    Ok(())
}

#[tokio::test]
async fn a_lock_held_by_another_process_gives_workspace_busy() -> anyhow::Result<()> {
    let env = Env::new();
    std::fs::create_dir_all(&env.home)?;
    std::fs::write(
        env.home.join("config.toml"),
        "[write]\nlock_timeout_secs = 0.5\n",
    )?;
    let env = lab_env(env);
    let lock_path = env.workspace_dir("lab").join(".lock");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&lock_path)?;
    rustix::fs::fcntl_lock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive)?;
    // Write through the same descriptor: closing any descriptor of the file would drop
    // this process's fcntl lock.
    std::io::Write::write_all(&mut &file, b"run-held-by-test")?;
    let client = env.client(Some("lab")).await?;
    let started = std::time::Instant::now();
    let result = call(
        &client,
        "write",
        json!({"command": "create", "path": "wiki/x.md", "content": "# X\n"}),
    )
    .await?;
    assert_eq!(error_code(&result), Some("workspace_busy"), "{result}");
    assert_eq!(
        result["structuredContent"]["error"]["holder_run_id"],
        "run-held-by-test"
    );
    assert!(started.elapsed() >= Duration::from_millis(450));
    assert!(!env.workspace_dir("lab").join("wiki/x.md").exists());
    assert_eq!(
        std::fs::read_dir(env.workspace_dir("lab").join("runs"))?.count(),
        0
    );
    rustix::fs::fcntl_lock(&file, rustix::fs::FlockOperation::Unlock)?;
    let result = call(
        &client,
        "write",
        json!({"command": "create", "path": "wiki/x.md", "content": "# X\n"}),
    )
    .await?;
    assert!(error_code(&result).is_none(), "{result}");
    client.cancel().await?;
    Ok(())
}

#[tokio::test]
async fn citations_protected_paths_and_commands() -> anyhow::Result<()> {
    let env = lab_env(Env::new());
    let client = env.client(Some("lab")).await?;
    let write = |args: Value| call(&client, "write", args);
    let bad = write(json!({"command": "create", "path": "wiki/c.md",
        "content": "# C\n\nA[^1] B[^2] C[^3] [n](raw/missing.md) [ok](raw/notes.md)\n\n[^1]: raw/paper.pdf, p.4\n[^2]: raw/nope.pdf, p.1\n[^3]: raw/notes.md, p.2\n"})).await?;
    assert_eq!(error_code(&bad), Some("citation_invalid"));
    let listed = bad["structuredContent"]["error"]["citations"]
        .as_array()
        .expect("citations");
    let targets: Vec<&str> = listed
        .iter()
        .filter_map(|c| c["citation"].as_str())
        .collect();
    assert_eq!(
        targets,
        vec![
            "raw/paper.pdf",
            "raw/nope.pdf",
            "raw/notes.md",
            "raw/missing.md"
        ]
    );
    assert!(!env.workspace_dir("lab").join("wiki/c.md").exists());
    let good = write(json!({"command": "create", "path": "wiki/c.md",
        "content": "# C\n\nA[^1] [ok](raw/notes.md)\n\n[^1]: raw/paper.pdf, p.2-3\n"}))
    .await?;
    assert!(error_code(&good).is_none(), "{good}");
    // The uncited list shrinks.
    let guide = call(&client, "guide", json!({})).await?;
    assert_eq!(guide["structuredContent"]["uncited_sources"], json!([]));

    let cases = [
        (
            json!({"command": "create", "path": "raw/new.md", "content": "x"}),
            "raw_readonly",
        ),
        (
            json!({"command": "append", "path": "raw/notes.md", "content": "x"}),
            "raw_readonly",
        ),
        (
            json!({"command": "create", "path": "wiki/c.md", "content": "x"}),
            "invalid_argument",
        ),
        (
            json!({"command": "create", "path": "wiki/x.txt", "content": "x"}),
            "invalid_argument",
        ),
        (
            json!({"command": "create", "path": "../x.md", "content": "x"}),
            "invalid_path",
        ),
        (
            json!({"command": "create", "path": "wiki/../../x.md", "content": "x"}),
            "invalid_path",
        ),
        (
            json!({"command": "append", "path": "wiki/missing.md", "content": "x"}),
            "not_found",
        ),
        (
            json!({"command": "str_replace", "path": "wiki/c.md", "old_str": "nothing like this", "new_str": "y"}),
            "no_match",
        ),
        (
            json!({"command": "append", "path": "wiki/c.md"}),
            "invalid_argument",
        ),
        (
            json!({"command": "rewrite", "path": "wiki/c.md", "content": "x"}),
            "invalid_argument",
        ),
    ];
    for (args, code) in cases {
        let result = write(args.clone()).await?;
        assert_eq!(error_code(&result), Some(code), "{args}: {result}");
    }
    write(json!({"command": "append", "path": "wiki/c.md", "content": "twin\ntwin\n"})).await?;
    let ambiguous = write(
        json!({"command": "str_replace", "path": "wiki/c.md", "old_str": "twin", "new_str": "one"}),
    )
    .await?;
    assert_eq!(error_code(&ambiguous), Some("ambiguous_match"));

    for path in [
        "wiki/index.md",
        "wiki/log.md",
        "wiki/SCHEMA.md",
        "raw/notes.md",
    ] {
        let result = call(&client, "delete", json!({"path": path})).await?;
        assert_eq!(error_code(&result), Some("protected_path"), "{path}");
    }
    let deleted = call(&client, "delete", json!({"path": "wiki/c.md"})).await?;
    assert!(error_code(&deleted).is_none(), "{deleted}");
    let trash = deleted["structuredContent"]["trash_path"]
        .as_str()
        .expect("trash");
    assert!(env.workspace_dir("lab").join(trash).is_file());
    assert!(!env.workspace_dir("lab").join("wiki/c.md").exists());
    let gone = call(&client, "read", json!({"path": "wiki/c.md"})).await?;
    assert_eq!(error_code(&gone), Some("not_found"));
    let again = call(&client, "delete", json!({"path": "wiki/c.md"})).await?;
    assert_eq!(error_code(&again), Some("not_found"));
    let history = call(&client, "history", json!({"path": "wiki/c.md"})).await?;
    let ops: Vec<String> = history_entries(&history)
        .iter()
        .filter_map(|e| e["op"].as_str().map(String::from))
        .collect();
    assert_eq!(ops, vec!["delete", "append", "create"]);
    let by_run = call(
        &client,
        "history",
        json!({"run_id": deleted["structuredContent"]["run_id"]}),
    )
    .await?;
    assert_eq!(history_entries(&by_run).len(), 1);
    let recent = call(&client, "history", json!({"since": "1h", "limit": 1})).await?;
    assert_eq!(history_entries(&recent).len(), 1);
    assert!(
        recent["structuredContent"]["next_cursor"]
            .as_str()
            .is_some()
    );
    let bad_time = call(&client, "history", json!({"since": "last tuesday"})).await?;
    assert_eq!(error_code(&bad_time), Some("invalid_argument"));
    git(&env.workspace_dir("lab"), &["fsck"]);
    assert!(git_status_settles(&env.workspace_dir("lab")));
    client.cancel().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outside_edits_are_picked_up_and_make_plans_stale() -> anyhow::Result<()> {
    let env = lab_env(Env::new());
    let client = env.client(Some("lab")).await?;
    let created = call(
        &client,
        "write",
        json!({"command": "create", "path": "wiki/o.md", "content": "# O\n\nfirst\n"}),
    )
    .await?;
    let rev = created["structuredContent"]["rev"]
        .as_str()
        .expect("rev")
        .to_string();
    std::fs::write(
        env.workspace_dir("lab").join("wiki/o.md"),
        "# O\n\nedited in vim: quetzalcoatl\n",
    )?;
    let mut hit = false;
    for _ in 0..40 {
        let result = call(&client, "search", json!({"query": "quetzalcoatl"})).await?;
        if result["structuredContent"]["hits"]
            .as_array()
            .is_some_and(|h| h.len() == 1)
        {
            hit = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(hit, "the outside edit was not indexed within 4 s");
    let history = call(&client, "history", json!({"op": "outside_edit"})).await?;
    assert_eq!(history_entries(&history)[0]["path"], "wiki/o.md");
    let stale = call(
        &client,
        "write",
        json!({"command": "append", "path": "wiki/o.md", "content": "x", "base_rev": rev}),
    )
    .await?;
    assert_eq!(error_code(&stale), Some("stale_plan"));
    client.cancel().await?;
    Ok(())
}

/// Crash the daemon at `point` during a create, restart it, and check that files, git,
/// the index and history agree. Returns whether the write survived.
async fn crash_at(point: &str) -> anyhow::Result<bool> {
    let env = lab_env(Env::new());
    // Same home; the shim (and so the daemon it starts) runs with the fault.
    let crashing = env.same_home_with_faults(&format!("crash:{point}"));
    env.ok(&["daemon", "stop"]);
    let client = crashing.client(Some("lab")).await?;
    let result = call(&client, "write", json!({"command": "create", "path": "wiki/crash.md", "content": "# Crash\n\nmarker zanzibarite\n"})).await;
    assert!(
        result.is_err(),
        "{point}: the write must not be acknowledged: {result:?}"
    );
    drop(client);
    assert!(wait_until(Duration::from_secs(10), || {
        crashing
            .daemon_pid()
            .is_none_or(|p| !alexandria_tests::process_alive(p))
    }));
    // Restart without faults: recovery runs before serving.
    let client = env.client(Some("lab")).await?;
    let root = env.workspace_dir("lab");
    let exists = root.join("wiki/crash.md").exists();
    let in_git = Command::new("git")
        .args(["cat-file", "-e", "HEAD:wiki/crash.md"])
        .current_dir(&root)
        .status()?
        .success();
    let hits = call(&client, "search", json!({"query": "zanzibarite"})).await?;
    let indexed = hits["structuredContent"]["hits"]
        .as_array()
        .map_or(0, Vec::len);
    let history = call(&client, "history", json!({"path": "wiki/crash.md"})).await?;
    let logged = history_entries(&history).len();
    assert_eq!(
        (in_git, indexed, logged),
        (exists, usize::from(exists), usize::from(exists)),
        "{point}"
    );
    assert!(git_status_settles(&root), "{point}: dirty tree");
    git(&root, &["fsck"]);
    assert_eq!(
        std::fs::read_dir(root.join("runs"))?.count(),
        0,
        "{point}: runs left"
    );
    // The workspace still takes writes.
    let after = call(
        &client,
        "write",
        json!({"command": "create", "path": "wiki/after.md", "content": "# After\n"}),
    )
    .await?;
    assert!(error_code(&after).is_none(), "{point}: {after}");
    client.cancel().await?;
    drop(crashing);
    Ok(exists)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_at_every_fault_point_keeps_state_consistent() -> anyhow::Result<()> {
    let mut outcomes = HashMap::new();
    for point in [
        "after_stage",
        "after_lock",
        "after_prepare",
        "after_move",
        "after_commit",
        "after_index",
    ] {
        outcomes.insert(point, crash_at(point).await?);
    }
    // Before the run is prepared it is dropped; from prepared on it is completed.
    assert!(!outcomes["after_stage"]);
    assert!(!outcomes["after_lock"]);
    for point in ["after_prepare", "after_move", "after_commit", "after_index"] {
        assert!(outcomes[point], "{point}: a prepared run must be completed");
    }
    Ok(())
}

/// A prepared run an older daemon left keeps the page's text in `final` and what an
/// `append` added in `staged/payload` (today both are in `prepared.json`): the next
/// daemon completes it from there, and applies the append again on top of a save an
/// editor made to the page meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_run_in_the_older_layout_is_completed() -> anyhow::Result<()> {
    let env = lab_env(Env::new());
    let root = env.workspace_dir("lab");
    let client = env.client(Some("lab")).await?;
    let created = call(
        &client,
        "write",
        json!({"command": "create", "path": "wiki/old.md", "content": "# Old\n\nfirst line\n"}),
    )
    .await?;
    assert!(error_code(&created).is_none(), "{created}");
    client.cancel().await?;
    env.ok(&["daemon", "stop"]);
    let crashing = env.same_home_with_faults("crash:after_prepare");
    let client = crashing.client(Some("lab")).await?;
    let result = call(
        &client,
        "write",
        json!({"command": "append", "path": "wiki/old.md", "content": "agent line quillwort"}),
    )
    .await;
    assert!(result.is_err(), "acknowledged: {result:?}");
    drop(client);
    assert!(wait_until(Duration::from_secs(10), || {
        crashing
            .daemon_pid()
            .is_none_or(|p| !alexandria_tests::process_alive(p))
    }));
    // Rewrite the run as an older daemon laid it out.
    let run = std::fs::read_dir(root.join("runs"))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.join("prepared.json").exists())
        .expect("a prepared run");
    let mut manifest: Value = serde_json::from_slice(&std::fs::read(run.join("prepared.json"))?)?;
    let text = manifest["text"].as_str().expect("text").to_string();
    let payload = manifest["payload"].as_str().expect("payload").to_string();
    assert!(text.ends_with("agent line quillwort\n"), "{text}");
    let fields = manifest.as_object_mut().expect("object");
    fields.remove("text");
    fields.remove("payload");
    std::fs::write(
        run.join("prepared.json"),
        serde_json::to_vec_pretty(&manifest)?,
    )?;
    std::fs::write(run.join("final"), &text)?;
    std::fs::create_dir_all(run.join("staged"))?;
    std::fs::write(run.join("staged").join("payload"), &payload)?;
    // An editor saves the page before the next start.
    let page = root.join("wiki/old.md");
    std::fs::write(&page, "# Old\n\nfirst line\neditor line marram\n")?;

    let client = env.client(Some("lab")).await?;
    let on_disk = std::fs::read_to_string(&page)?;
    assert!(on_disk.contains("editor line marram"), "{on_disk}");
    assert!(on_disk.contains("agent line quillwort"), "{on_disk}");
    assert_eq!(git(&root, &["show", "HEAD:wiki/old.md"]), on_disk);
    assert!(git_status_settles(&root), "dirty tree");
    assert_eq!(
        std::fs::read_dir(root.join("runs"))?.count(),
        0,
        "runs left"
    );
    client.cancel().await?;
    drop(crashing);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_kills_never_lose_an_acknowledged_write() -> anyhow::Result<()> {
    let rounds: usize = std::env::var("ALEXANDRIA_KILL_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    let env = lab_env(Env::new());
    let mut acknowledged: Vec<(String, String)> = Vec::new();
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for round in 0..rounds {
        // Three sessions write at once, so that kills land in the middle of a group
        // commit (issue 15) too.
        let mut writers = Vec::new();
        for w in 0..3 {
            let client = client_after_kill(&env).await?;
            writers.push(tokio::spawn(async move {
                let mut done = Vec::new();
                for n in 0..1000 {
                    let path = format!("wiki/k{round}/w{w}p{n}.md");
                    let content = format!("# K {round} {w} {n}\n\nkill{round}x{w}x{n}mark\n");
                    match call(
                        &client,
                        "write",
                        json!({"command": "create", "path": path, "content": content}),
                    )
                    .await
                    {
                        Ok(result) if error_code(&result).is_none() => {
                            done.push((
                                path,
                                result["structuredContent"]["rev"]
                                    .as_str()
                                    .unwrap_or("")
                                    .to_string(),
                            ));
                        }
                        _ => break,
                    }
                }
                done
            }));
        }
        tokio::time::sleep(Duration::from_millis(30 + next() % 150)).await;
        // A person commits a file by hand while the agent writes (issue 16).
        let root = env.workspace_dir("lab");
        std::fs::write(root.join(format!("wiki/hand{round}.md")), "by hand\n")?;
        hand_git(&root, &["add", &format!("wiki/hand{round}.md")]);
        hand_git(&root, &["commit", "-q", "-m", &format!("hand {round}")]);
        env.kill_daemon();
        for writer in writers {
            acknowledged.extend(writer.await?);
        }
    }
    let client = client_after_kill(&env).await?;
    let root = env.workspace_dir("lab");
    let mut lost = 0;
    let mut report = String::new();
    for (path, rev) in &acknowledged {
        let on_disk = std::fs::read(root.join(path)).ok();
        let in_git = git_rev(&root, path);
        if on_disk.is_none() || in_git.as_deref() != Some(rev.as_str()) {
            lost += 1;
            report.push_str(&format!(
                "lost {path}: acknowledged rev {rev}, on disk {}, in HEAD {in_git:?}\n{}",
                on_disk.is_some(),
                git(
                    &root,
                    &["log", "--all", "--format=  %h %an: %s", "--", path]
                )
            ));
        }
    }
    let deleted = git(
        &root,
        &["log", "--diff-filter=D", "--name-only", "--format=%h %s"],
    );
    let status = git(&root, &["status", "--porcelain"]);
    if lost > 0 || !alexandria_tests::unrestored_deletions(&root).is_empty() || !status.is_empty() {
        // Keep the home for a look at the daemon's log and the run directories.
        let keep = std::path::PathBuf::from(format!(
            "/tmp/alx-kill-loop-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis())
                .unwrap_or(0)
        ));
        let _ = Command::new("cp")
            .args(["-a"])
            .arg(env.dir.path())
            .arg(&keep)
            .status();
        eprintln!(
            "kill loop failed; home kept in {}\n{report}deleted:\n{deleted}\nstatus:\n{status}\nlog:\n{}",
            keep.display(),
            git(&root, &["log", "-n", "40", "--format=%h %an: %s"])
        );
    }
    // Every page of history (it is paged: 500 entries at most per call).
    let mut logged = std::collections::HashSet::new();
    let mut cursor = Value::Null;
    let mut history: Value;
    loop {
        history = call(
            &client,
            "history",
            json!({"op": "create", "limit": 500, "path": "wiki/k*/**", "cursor": cursor}),
        )
        .await?;
        for entry in history_entries(&history) {
            if let Some(path) = entry["path"].as_str() {
                assert!(logged.insert(path.to_string()), "{path} logged twice");
            }
        }
        cursor = history["structuredContent"]["next_cursor"].clone();
        if cursor.is_null() {
            break;
        }
    }
    for (path, _) in &acknowledged {
        assert!(logged.contains(path), "{path} missing from history");
    }
    assert_eq!(
        lost,
        0,
        "{lost} of {} acknowledged writes lost",
        acknowledged.len()
    );
    for round in 0..rounds {
        let path = format!("wiki/hand{round}.md");
        assert!(
            git_rev(&root, &path).is_some(),
            "{path} (hand commit) not in HEAD"
        );
    }
    let unrestored = alexandria_tests::unrestored_deletions(&root);
    assert!(
        unrestored.is_empty(),
        "commits deleted paths that were not put back:\n{unrestored}\nall deletions:\n{deleted}"
    );
    assert_eq!(status, "");
    fsck_after_auto_gc(&root);
    let restores = git(
        &root,
        &["log", "--oneline", "--grep=^Alexandria-Op: restore$"],
    );
    eprintln!(
        "kill loop: {rounds} kills, {} acknowledged writes checked, {lost} lost; pages a hand commit dropped put back by {} commit(s)",
        acknowledged.len(),
        restores.lines().count()
    );
    assert!(!acknowledged.is_empty());
    let _ = text_of(&history);
    client.cancel().await?;
    Ok(())
}

/// `git fsck`, once a `git gc --auto` that a hand commit started in the background is
/// done: fsck lists loose objects that gc then packs and deletes ("unable to mmap
/// … No such file or directory"), which is not damage.
fn fsck_after_auto_gc(root: &Path) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let gc_running = root.join(".git/gc.pid").exists();
        let output = Command::new("git")
            .arg("fsck")
            .current_dir(root)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .output()
            .expect("git");
        if output.status.success() {
            return;
        }
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            (gc_running || stderr.contains("unable to mmap"))
                && std::time::Instant::now() < deadline,
            "git fsck: {stderr}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// A client of `env`'s daemon, started after a kill: tried again (up to 3 times) when the
/// shim gives up waiting for the daemon to be ready (5 s: on a loaded machine, recovery
/// after a kill can take longer). A slow start is not what the kill loop checks, and it
/// gets no retry from nextest (a lost write must never pass on a second try).
async fn client_after_kill(
    env: &Env,
) -> anyhow::Result<rmcp::service::RunningService<rmcp::RoleClient, ()>> {
    let mut attempt = 0;
    loop {
        match env.client(Some("lab")).await {
            Ok(client) => return Ok(client),
            Err(error) if attempt < 3 => {
                attempt += 1;
                eprintln!("connecting after a kill failed ({error}); trying again");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(error) => return Err(error),
        }
    }
}

/// Run git as a person would: retry while the daemon briefly holds `.git/index.lock`.
fn hand_git(dir: &Path, args: &[&str]) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let output = Command::new("git")
            .args(["-c", "user.name=Hand", "-c", "user.email=hand@example.com"])
            .args(args)
            .current_dir(dir)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .output()
            .expect("git");
        if output.status.success() {
            return;
        }
        let stderr = String::from_utf8_lossy(&output.stderr);
        let retry = stderr.contains("index.lock")
            || stderr.contains("could not write index")
            || stderr.contains("cannot lock ref");
        if !retry || std::time::Instant::now() >= deadline {
            // What the daemon did with git's index meanwhile, for whoever looks.
            let home = dir.parent().and_then(Path::parent).and_then(Path::parent);
            let mut log = String::new();
            for entry in home
                .and_then(|h| std::fs::read_dir(h.join("logs")).ok())
                .into_iter()
                .flatten()
                .flatten()
            {
                if entry.file_name().to_string_lossy().starts_with("daemon") {
                    log.push_str(&std::fs::read_to_string(entry.path()).unwrap_or_default());
                }
            }
            let tail: Vec<&str> = log
                .lines()
                .filter(|l| !l.contains("rmcp::"))
                .rev()
                .take(40)
                .collect();
            panic!(
                "git {args:?}: {stderr}\ndaemon log, newest first:\n{}",
                tail.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn git_rev(root: &Path, path: &str) -> Option<String> {
    let output = Command::new("git")
        .args(["rev-parse", &format!("HEAD:{path}")])
        .current_dir(root)
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_string())
}

#[tokio::test]
async fn a_locked_state_db_gives_workspace_busy_and_nothing_is_half_applied() -> anyhow::Result<()>
{
    let env = Env::new();
    std::fs::create_dir_all(&env.home)?;
    std::fs::write(
        env.home.join("config.toml"),
        "[write]\nlock_timeout_secs = 0.5\n",
    )?;
    let env = lab_env(env);
    let client = env.client(Some("lab")).await?;
    let root = env.workspace_dir("lab");
    let head = git(&root, &["rev-parse", "HEAD"]);
    // Another process holds a write transaction on state.db.
    let other = rusqlite::Connection::open(env.home.join("state.db"))?;
    other
        .execute_batch("BEGIN IMMEDIATE; INSERT INTO events(ts, kind) VALUES (0, 'test-lock');")?;
    let result = call(
        &client,
        "write",
        json!({"command": "create", "path": "wiki/s.md", "content": "# S\n\nsesquipedalian\n"}),
    )
    .await?;
    assert_eq!(error_code(&result), Some("workspace_busy"), "{result}");
    assert!(text_of(&result).contains("state.db"));
    assert!(!root.join("wiki/s.md").exists());
    assert_eq!(git(&root, &["rev-parse", "HEAD"]), head);
    other.execute_batch("ROLLBACK;")?;
    drop(other);
    assert!(git_status_settles(&root));
    let history = call(&client, "history", json!({"path": "wiki/s.md"})).await?;
    assert!(history_entries(&history).is_empty());
    let result = call(
        &client,
        "write",
        json!({"command": "create", "path": "wiki/s.md", "content": "# S\n\nsesquipedalian\n"}),
    )
    .await?;
    assert!(error_code(&result).is_none(), "{result}");
    let hits = call(&client, "search", json!({"query": "sesquipedalian"})).await?;
    assert_eq!(
        hits["structuredContent"]["hits"].as_array().map(Vec::len),
        Some(1)
    );
    client.cancel().await?;
    Ok(())
}

/// A tmpfs mounted for one test; unmounted on drop.
struct Mount(std::path::PathBuf);

impl Mount {
    fn tmpfs(path: &Path, size: &str) -> Option<Mount> {
        std::fs::create_dir_all(path).ok()?;
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(path)
            .status()
            .ok()?;
        status.success().then(|| Mount(path.to_path_buf()))
    }

    fn remount(&self, option: &str) {
        let status = Command::new("mount")
            .args(["-o", &format!("remount,{option}")])
            .arg(&self.0)
            .status()
            .expect("mount");
        assert!(status.success(), "remount {option}");
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[tokio::test]
async fn disk_full_and_read_only_file_system() -> anyhow::Result<()> {
    // The workspace lives on its own small tmpfs; state.db stays on the big disk.
    let env = Env::new();
    env.ok(&["init"]);
    let root = env.workspace_dir("lab");
    let Some(mount) = Mount::tmpfs(&root, "16m") else {
        // Mounting needs root (CI runs as root); elsewhere this cannot be tested.
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must be able to mount a tmpfs"
        );
        eprintln!("skipped: cannot mount a tmpfs here");
        return Ok(());
    };
    env.ok(&["workspace", "create", "lab"]);
    let client = env.client(Some("lab")).await?;
    let before = git(&root, &["rev-parse", "HEAD"]);

    // Fill the disk.
    let filler = root.join("raw/filler.bin");
    {
        use std::io::Write;
        let mut file = std::fs::File::create(&filler)?;
        let block = vec![b'x'; 64 * 1024];
        while file.write_all(&block).is_ok() {}
    }
    let content = format!("# Full\n\n{}\n", "words ".repeat(20_000));
    let result = call(
        &client,
        "write",
        json!({"command": "create", "path": "wiki/full.md", "content": content}),
    )
    .await?;
    assert!(
        error_code(&result).is_some(),
        "a write on a full disk must fail: {result}"
    );
    assert!(text_of(&result).contains("disk is full"), "{result}");
    assert!(!root.join("wiki/full.md").exists());
    assert_eq!(git(&root, &["rev-parse", "HEAD"]), before);
    let guide = call(&client, "guide", json!({})).await?;
    assert!(error_code(&guide).is_none(), "reads go on: {guide}");
    std::fs::remove_file(&filler)?;
    // The daemon's watcher may still be reading the filler to index it; its blocks are
    // freed only when that read closes the file. Wait for the space, not for a guess.
    assert!(
        wait_until(Duration::from_secs(10), || {
            rustix::fs::statvfs(&root)
                .is_ok_and(|s| s.f_bavail.saturating_mul(s.f_frsize) > 8 * 1024 * 1024)
        }),
        "the filler's space was not freed"
    );
    let result = call(
        &client,
        "write",
        json!({"command": "create", "path": "wiki/full.md", "content": content}),
    )
    .await?;
    assert!(error_code(&result).is_none(), "{result}");

    // Read-only file system.
    mount.remount("ro");
    let result = call(
        &client,
        "write",
        json!({"command": "append", "path": "wiki/full.md", "content": "more"}),
    )
    .await?;
    assert!(error_code(&result).is_some(), "{result}");
    assert!(text_of(&result).contains("read-only"), "{result}");
    let read = call(
        &client,
        "read",
        json!({"path": "wiki/full.md", "max_chars": 200}),
    )
    .await?;
    assert!(error_code(&read).is_none(), "{read}");
    mount.remount("rw");
    let result = call(
        &client,
        "write",
        json!({"command": "append", "path": "wiki/full.md", "content": "more"}),
    )
    .await?;
    assert!(error_code(&result).is_none(), "{result}");
    assert!(git_status_settles(&root));
    client.cancel().await?;
    drop(env);
    drop(mount);
    Ok(())
}

#[test]
fn a_fifty_megabyte_page_is_refused_as_too_large() {
    let env = lab_env(Env::new());
    let mut shim = env.raw_shim(Some("lab"));
    shim.initialize("2025-06-18");
    let content = "a".repeat(50 * 1024 * 1024);
    let reply = shim.request(
        5,
        "tools/call",
        json!({"name": "write", "arguments": {"command": "create", "path": "wiki/huge.md", "content": content}}),
    );
    assert_eq!(
        reply["result"]["structuredContent"]["error"]["code"],
        "too_large",
        "{}",
        reply.to_string().chars().take(300).collect::<String>()
    );
    assert!(!env.workspace_dir("lab").join("wiki/huge.md").exists());
    // A page just over the per-page limit but under the frame limit: too_large too.
    let content = "b".repeat(9 * 1024 * 1024);
    let reply = shim.request(
        6,
        "tools/call",
        json!({"name": "write", "arguments": {"command": "create", "path": "wiki/big.md", "content": content}}),
    );
    assert_eq!(
        reply["result"]["structuredContent"]["error"]["code"],
        "too_large"
    );
    let ok = shim.request(7, "tools/call", json!({"name": "guide", "arguments": {}}));
    assert_eq!(ok["result"]["isError"], false);
}
