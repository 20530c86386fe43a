//! End-to-end tests of workspaces syncing through a git remote (issue 12): two homes
//! (A and B, each with its own daemon) play two machines; the remote is a bare
//! repository reached through `file://` or a `git daemon` on 127.0.0.1.

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use alexandria_tests::{Env, call, error_code, git, git_output, text_of, wait_until};
use serde_json::{Value, json};

/// Background sync off (a day), except where a test turns it on.
const QUIET_CONFIG: &str = "[sync]\ninterval_secs = 86400\nquiet_secs = 86400\ntimeout_secs = 30\n";

/// A home whose config is `config`, initialised, with its daemon running.
fn machine(config: &str) -> Env {
    let env = Env::new();
    std::fs::create_dir_all(&env.home).expect("home");
    std::fs::write(env.home.join("config.toml"), config).expect("config");
    env.ok(&["init"]);
    env
}

/// A bare repository (branch main) under `dir`.
fn bare_remote(dir: &Path) -> PathBuf {
    let path = dir.join("remote.git");
    git(
        dir,
        &[
            "init",
            "--bare",
            "-q",
            "-b",
            "main",
            path.to_str().expect("utf8"),
        ],
    );
    path
}

fn file_url(path: &Path) -> String {
    format!("file://{}", path.display())
}

/// `git daemon` serving `base` on 127.0.0.1 with push enabled; killed on drop.
struct GitDaemon {
    child: Child,
    port: u16,
}

impl GitDaemon {
    fn start(base: &Path) -> GitDaemon {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        // git-daemon itself, not `git daemon`: `git` would run it as a child that a kill
        // of `git` leaves running (holding whatever file descriptors it inherited).
        let exec_path = git(Path::new("/"), &["--exec-path"]);
        let child = Command::new(Path::new(exec_path.trim()).join("git-daemon"))
            .args([
                "--listen=127.0.0.1",
                &format!("--port={port}"),
                &format!("--base-path={}", base.display()),
                "--export-all",
                "--enable=receive-pack",
                "--reuseaddr",
                "--informative-errors",
            ])
            .arg(base)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Its own process group, so that the children serving connections go too.
            .process_group(0)
            .spawn()
            .expect("git daemon");
        assert!(
            wait_until(Duration::from_secs(10), || std::net::TcpStream::connect((
                "127.0.0.1",
                port
            ))
            .is_ok()),
            "git daemon did not start"
        );
        GitDaemon { child, port }
    }

    fn url(&self, name: &str) -> String {
        format!("git://127.0.0.1:{}/{name}", self.port)
    }
}

impl Drop for GitDaemon {
    fn drop(&mut self) {
        alexandria_tests::signal_group(self.child.id(), rustix::process::Signal::KILL);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn write(
    client: &rmcp::service::RunningService<rmcp::RoleClient, ()>,
    arguments: Value,
) -> anyhow::Result<Value> {
    let result = call(client, "write", arguments).await?;
    assert_eq!(error_code(&result), None, "write failed: {result}");
    Ok(result)
}

async fn search(
    client: &rmcp::service::RunningService<rmcp::RoleClient, ()>,
    workspace: &str,
    query: &str,
) -> anyhow::Result<String> {
    let result = call(
        client,
        "search",
        json!({"workspace": workspace, "query": query, "layer": "all", "limit": 50}),
    )
    .await?;
    Ok(format!("{}", result["structuredContent"]))
}

fn status(env: &Env, slug: &str) -> Value {
    let out = env.ok(&["workspace", "status", slug, "--json"]);
    serde_json::from_str(&out).expect("status json")
}

/// `git fsck` is clean, no lock files are left, and nothing in raw/ or wiki/ is
/// uncommitted.
fn repository_is_sound(root: &Path) {
    let fsck = git_output(root, &["fsck", "--no-progress"]);
    assert!(
        fsck.status.success(),
        "git fsck: {}",
        String::from_utf8_lossy(&fsck.stderr)
    );
    assert!(!root.join(".git/index.lock").exists(), "index.lock left");
    assert!(
        !root.join(".git/alexandria-sync.json").exists(),
        "journal left"
    );
    let dirty = git(root, &["status", "--porcelain", "--", "raw", "wiki"]);
    assert!(dirty.trim().is_empty(), "uncommitted: {dirty}");
    let markers = git_output(root, &["grep", "-I", "-q", "-e", "^<<<<<<< ", "HEAD"]);
    assert_eq!(markers.status.code(), Some(1), "conflict markers committed");
}

fn page(root: &Path, path: &str) -> String {
    std::fs::read_to_string(root.join(path)).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writes_and_syncs_b_clones_and_finds_the_pages() -> anyhow::Result<()> {
    let a = machine(QUIET_CONFIG);
    let b = machine(QUIET_CONFIG);
    let remote = bare_remote(a.dir.path());
    a.ok(&["workspace", "create", "notes"]);
    let client = a.client(None).await?;
    write(
        &client,
        json!({"workspace": "notes", "command": "create", "path": "wiki/fish/zebrafish.md",
               "content": "# Zebrafish\n\nZebrafish regrow their fins.\n"}),
    )
    .await?;
    // No remote yet: sync says so and exits 1.
    let refused = a.run(&["sync", "notes"]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("no git remote"));

    let said = a.ok(&["workspace", "remote", "notes", &file_url(&remote)]);
    assert!(said.contains("syncs with"), "{said}");
    a.ok(&["sync", "notes"]);
    let state = status(&a, "notes");
    assert_eq!(state["ahead"], 0, "{state}");
    assert_eq!(state["behind"], 0, "{state}");
    assert!(state["last_sync"].is_string(), "{state}");
    assert_eq!(state["last_error"], Value::Null);
    // The remote survives a lost state.db: it is in the repository's git config.
    let config = git(
        &a.workspace_dir("notes"),
        &["config", "--get", "remote.origin.url"],
    );
    assert_eq!(config.trim(), file_url(&remote));

    b.ok(&["workspace", "clone", &file_url(&remote), "notes"]);
    let b_client = b.client(None).await?;
    let found = search(&b_client, "notes", "regrow fins").await?;
    assert!(found.contains("wiki/fish/zebrafish.md"), "{found}");
    // A's write is in B's history, with its run.
    let history = call(&b_client, "history", json!({"workspace": "notes"})).await?;
    assert!(
        text_of(&history).contains("wiki/fish/zebrafish.md"),
        "{history}"
    );
    let b_state = status(&b, "notes");
    assert_eq!(b_state["branch"], "main");
    assert_eq!(b_state["behind"], 0, "{b_state}");

    // B writes, syncs; A syncs and finds it.
    write(
        &b_client,
        json!({"workspace": "notes", "command": "create", "path": "wiki/fish/medaka.md",
               "content": "# Medaka\n\nMedaka tolerate brackish water.\n"}),
    )
    .await?;
    b.ok(&["sync", "notes"]);
    a.ok(&["sync", "notes"]);
    let found = search(&client, "notes", "brackish").await?;
    assert!(found.contains("wiki/fish/medaka.md"), "{found}");
    repository_is_sound(&a.workspace_dir("notes"));
    repository_is_sound(&b.workspace_dir("notes"));

    // --unset forgets the remote.
    a.ok(&["workspace", "remote", "notes", "--unset"]);
    assert_eq!(status(&a, "notes")["remote"], Value::Null);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edits_merge_line_by_line_and_overlapping_edits_are_kept_side_by_side() -> anyhow::Result<()>
{
    let a = machine(QUIET_CONFIG);
    let b = machine(QUIET_CONFIG);
    let base = a.dir.path().join("served");
    std::fs::create_dir_all(&base)?;
    bare_remote(&base);
    let daemon = GitDaemon::start(&base);
    let url = daemon.url("remote.git");
    a.ok(&["workspace", "create", "notes"]);
    let a_client = a.client(None).await?;
    let lines: String = (1..=12).map(|n| format!("line {n} plain\n")).collect();
    write(
        &a_client,
        json!({"workspace": "notes", "command": "create", "path": "wiki/shared.md",
               "content": format!("# Shared\n\n{lines}")}),
    )
    .await?;
    a.ok(&["workspace", "remote", "notes", &url]);
    a.ok(&["sync", "notes"]);
    b.ok(&["workspace", "clone", &url, "notes"]);
    let b_client = b.client(None).await?;

    // Different parts of one page: both edits on both machines.
    write(
        &a_client,
        json!({"workspace": "notes", "command": "str_replace", "path": "wiki/shared.md",
               "old_str": "line 2 plain", "new_str": "line 2 edited on A"}),
    )
    .await?;
    write(
        &b_client,
        json!({"workspace": "notes", "command": "str_replace", "path": "wiki/shared.md",
               "old_str": "line 11 plain", "new_str": "line 11 edited on B"}),
    )
    .await?;
    a.ok(&["sync", "notes"]);
    b.ok(&["sync", "notes"]);
    a.ok(&["sync", "notes"]);
    for env in [&a, &b] {
        let text = page(&env.workspace_dir("notes"), "wiki/shared.md");
        assert!(text.contains("line 2 edited on A"), "{text}");
        assert!(text.contains("line 11 edited on B"), "{text}");
        assert!(!text.contains("<<<<<<<"), "{text}");
    }
    assert!(
        std::fs::read_dir(a.workspace_dir("notes").join("wiki"))?
            .flatten()
            .all(|e| !e.file_name().to_string_lossy().contains(".conflict-")),
        "no conflict for separate edits"
    );

    // Both append to the log: both sides' lines are kept.
    write(
        &a_client,
        json!({"workspace": "notes", "command": "append", "path": "wiki/log.md",
               "content": "- A appended a log line"}),
    )
    .await?;
    write(
        &b_client,
        json!({"workspace": "notes", "command": "append", "path": "wiki/log.md",
               "content": "- B appended a log line"}),
    )
    .await?;

    // The same line on both: one version at the path, the other beside it.
    write(
        &a_client,
        json!({"workspace": "notes", "command": "str_replace", "path": "wiki/shared.md",
               "old_str": "line 6 plain", "new_str": "line 6 says axolotl (A)"}),
    )
    .await?;
    write(
        &b_client,
        json!({"workspace": "notes", "command": "str_replace", "path": "wiki/shared.md",
               "old_str": "line 6 plain", "new_str": "line 6 says narwhal (B)"}),
    )
    .await?;
    a.ok(&["sync", "notes"]);
    let said = b.ok(&["sync", "notes", "--json"]);
    let report: Value = serde_json::from_str(&said)?;
    let conflicts = report["conflicts"].as_array().cloned().unwrap_or_default();
    assert_eq!(conflicts.len(), 1, "{report}");
    let kept_as = conflicts[0]["kept_as"].as_str().unwrap_or("").to_string();
    assert!(
        kept_as.starts_with("wiki/shared.conflict-") && kept_as.ends_with(".md"),
        "{kept_as}"
    );
    a.ok(&["sync", "notes"]);
    for env in [&a, &b] {
        let root = env.workspace_dir("notes");
        // The remote's version (A pushed first) at the path, B's beside it.
        let at_path = page(&root, "wiki/shared.md");
        assert!(at_path.contains("axolotl (A)"), "{at_path}");
        assert!(at_path.contains("line 2 edited on A") && at_path.contains("line 11 edited on B"));
        let beside = page(&root, &kept_as);
        assert!(beside.contains("narwhal (B)"), "{beside}");
        let log = page(&root, "wiki/log.md");
        assert!(
            log.contains("A appended") && log.contains("B appended"),
            "{log}"
        );
        repository_is_sound(&root);
    }
    for (env, client) in [(&a, &a_client), (&b, &b_client)] {
        let found = search(client, "notes", "narwhal").await?;
        assert!(found.contains(&kept_as), "{found}");
        let found = search(client, "notes", "axolotl").await?;
        assert!(found.contains("wiki/shared.md"), "{found}");
        let guide = call(client, "guide", json!({"workspace": "notes"})).await?;
        assert!(text_of(&guide).contains(&kept_as), "{}", text_of(&guide));
        assert_eq!(status(env, "notes")["conflicts"][0], kept_as.as_str());
    }
    let history = call(
        &b_client,
        "history",
        json!({"workspace": "notes", "op": "sync_conflict"}),
    )
    .await?;
    assert!(text_of(&history).contains(&kept_as), "{history}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_on_a_during_syncs_lose_nothing_and_every_blob_reaches_the_remote()
-> anyhow::Result<()> {
    let a = machine(QUIET_CONFIG);
    let b = machine(QUIET_CONFIG);
    let remote = bare_remote(a.dir.path());
    let url = file_url(&remote);
    a.ok(&["workspace", "create", "notes"]);
    a.ok(&["workspace", "remote", "notes", &url]);
    a.ok(&["sync", "notes"]);
    b.ok(&["workspace", "clone", &url, "notes"]);
    let b_client = b.client(None).await?;

    // Three writers on A while A syncs again and again with B's changes coming in.
    let mut writers = Vec::new();
    for w in 0..3 {
        let client = a.client(None).await?;
        writers.push(tokio::spawn(async move {
            let mut revs = Vec::new();
            for n in 0..8 {
                let result = call(
                    &client,
                    "write",
                    json!({"workspace": "notes", "command": "create",
                           "path": format!("wiki/w{w}/p{n}.md"),
                           "content": format!("# W{w} P{n}\n\nwriter {w} page {n} quokka\n")}),
                )
                .await
                .expect("call");
                assert_eq!(error_code(&result), None, "{result}");
                revs.push(
                    result["structuredContent"]["rev"]
                        .as_str()
                        .unwrap_or("")
                        .to_string(),
                );
            }
            revs
        }));
    }
    let mut b_revs = Vec::new();
    for round in 0..4 {
        let result = call(
            &b_client,
            "write",
            json!({"workspace": "notes", "command": "create",
                   "path": format!("wiki/b/r{round}.md"),
                   "content": format!("# B {round}\n\nfrom B round {round}\n")}),
        )
        .await?;
        assert_eq!(error_code(&result), None, "{result}");
        b_revs.push(
            result["structuredContent"]["rev"]
                .as_str()
                .unwrap_or("")
                .to_string(),
        );
        b.ok(&["sync", "notes"]);
        a.ok(&["sync", "notes"]);
    }
    let mut a_revs = Vec::new();
    for writer in writers {
        a_revs.extend(writer.await?);
    }
    a.ok(&["sync", "notes"]);
    b.ok(&["sync", "notes"]);
    for w in 0..3 {
        for n in 0..8 {
            let path = format!("wiki/w{w}/p{n}.md");
            for env in [&a, &b] {
                assert!(
                    page(&env.workspace_dir("notes"), &path).contains("quokka"),
                    "{path} missing"
                );
            }
        }
    }
    for round in 0..4 {
        assert!(page(&a.workspace_dir("notes"), &format!("wiki/b/r{round}.md")).contains("from B"));
    }
    // Every acknowledged write's blob is reachable from the remote's branch.
    let reachable = git(&remote, &["rev-list", "--objects", "main"]);
    for rev in a_revs.iter().chain(&b_revs) {
        assert!(!rev.is_empty());
        assert!(
            reachable.contains(rev.as_str()),
            "blob {rev} not on the remote"
        );
    }
    repository_is_sound(&a.workspace_dir("notes"));
    repository_is_sound(&b.workspace_dir("notes"));
    // B's index has A's pages.
    let found = search(&b_client, "notes", "quokka").await?;
    assert!(found.contains("wiki/w2/p7.md"), "{found}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_killed_mid_sync_completes_it_on_restart() -> anyhow::Result<()> {
    let mut a = machine(QUIET_CONFIG);
    let b = machine(QUIET_CONFIG);
    let remote = bare_remote(a.dir.path());
    let url = file_url(&remote);
    a.ok(&["workspace", "create", "notes"]);
    a.ok(&["workspace", "remote", "notes", &url]);
    // No background sync on A (it runs at every start): the sync that meets the fault
    // point must be the CLI's, not one the restarted daemon began by itself (which
    // crashed, was completed by the next start, and left the CLI's nothing to do).
    let unset = git_output(
        &a.workspace_dir("notes"),
        &["config", "--unset", "alexandria.syncbranch"],
    );
    assert!(unset.status.success(), "{unset:?}");
    a.ok(&["sync", "notes"]);
    b.ok(&["workspace", "clone", &url, "notes"]);
    let points = [
        "sync_after_fetch",
        "sync_locked",
        "sync_journal",
        "sync_first_file",
        "sync_applied",
        "sync_after_merge",
        "sync_after_push",
    ];
    for (n, point) in points.iter().enumerate() {
        // Both machines have something new: the sync merges.
        {
            let b_client = b.client(None).await?;
            write(
                &b_client,
                json!({"workspace": "notes", "command": "create", "path": format!("wiki/b{n}.md"),
                       "content": format!("# B{n}\n\nfrom B before {point}\n")}),
            )
            .await?;
        }
        b.ok(&["sync", "notes"]);
        {
            let a_client = a.client(None).await?;
            write(
                &a_client,
                json!({"workspace": "notes", "command": "create", "path": format!("wiki/a{n}.md"),
                       "content": format!("# A{n}\n\nfrom A before {point}\n")}),
            )
            .await?;
        }
        a.ok(&["daemon", "stop"]);
        a.faults = Some(format!("crash:{point}"));
        let crashed = a.run(&["sync", "notes"]);
        assert!(
            !crashed.status.success(),
            "{point}: the sync should have died"
        );
        a.kill_daemon();
        a.faults = None;
        a.ok(&["sync", "notes"]);
        b.ok(&["sync", "notes"]);
        let root = a.workspace_dir("notes");
        repository_is_sound(&root);
        repository_is_sound(&b.workspace_dir("notes"));
        for m in 0..=n {
            for env in [&a, &b] {
                let dir = env.workspace_dir("notes");
                assert!(
                    page(&dir, &format!("wiki/a{m}.md")).contains("from A"),
                    "{point}: a{m}"
                );
                assert!(
                    page(&dir, &format!("wiki/b{m}.md")).contains("from B"),
                    "{point}: b{m}"
                );
            }
        }
        let a_client = a.client(None).await?;
        let found = search(&a_client, "notes", &format!("B{n}")).await?;
        assert!(found.contains(&format!("wiki/b{n}.md")), "{point}: {found}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_remote_never_blocks_writes_and_shows_in_status() -> anyhow::Result<()> {
    let a = machine("[sync]\ninterval_secs = 86400\nquiet_secs = 0.2\ntimeout_secs = 10\n");
    // Nothing listens on this port.
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    a.ok(&["workspace", "create", "notes"]);
    a.ok(&[
        "workspace",
        "remote",
        "notes",
        &format!("git://127.0.0.1:{port}/gone.git"),
    ]);
    let client = a.client(None).await?;
    for n in 0..5 {
        let started = std::time::Instant::now();
        write(
            &client,
            json!({"workspace": "notes", "command": "create", "path": format!("wiki/n{n}.md"),
                   "content": format!("# N{n}\n\nstill written\n")}),
        )
        .await?;
        assert!(started.elapsed() < Duration::from_secs(5));
    }
    let failed = a.run(&["sync", "notes"]);
    assert_eq!(failed.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&failed.stderr);
    assert!(stderr.contains("sync_failed"), "{stderr}");
    let state = status(&a, "notes");
    assert!(state["last_error"].is_string(), "{state}");
    assert!(state["failures"].as_i64().unwrap_or(0) >= 1, "{state}");
    let guide = call(&client, "guide", json!({"workspace": "notes"})).await?;
    assert!(
        text_of(&guide).contains("last sync failed"),
        "{}",
        text_of(&guide)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_pushes_on_its_own_once_writes_stop() -> anyhow::Result<()> {
    let a = machine("[sync]\ninterval_secs = 86400\nquiet_secs = 0.3\ntimeout_secs = 30\n");
    let remote = bare_remote(a.dir.path());
    a.ok(&["workspace", "create", "notes"]);
    a.ok(&["workspace", "remote", "notes", &file_url(&remote)]);
    let client = a.client(None).await?;
    write(
        &client,
        json!({"workspace": "notes", "command": "create", "path": "wiki/auto.md",
               "content": "# Auto\n\npushed by the daemon\n"}),
    )
    .await?;
    let pushed = wait_until(Duration::from_secs(30), || {
        let out = git_output(&remote, &["ls-tree", "-r", "--name-only", "main"]);
        String::from_utf8_lossy(&out.stdout).contains("wiki/auto.md")
    });
    assert!(pushed, "the background sync did not push the write");
    Ok(())
}
