//! End-to-end tests of people using git by hand in a workspace while agents write
//! (issue 16): hand commits, `git add`, stash, `commit -a`, a detached HEAD, a merge
//! left in progress, a branch switched by hand, someone else's `index.lock`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use alexandria_tests::{Env, call, error_code, text_of};
use serde_json::json;

/// Run git in `dir` as a person would (own name, no user or system config).
fn git_output(dir: &Path, args: &[&str]) -> Output {
    Command::new("git")
        .args(["-c", "user.name=Hand", "-c", "user.email=hand@example.com"])
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env_remove("GIT_DIR")
        .env_remove("GIT_INDEX_FILE")
        .output()
        .expect("git")
}

/// Run git; it must succeed. A person whose command meets the daemon's brief hold on
/// `.git/index.lock` (git says so; `stash` says "could not write index"), or whose
/// `commit` finds that HEAD moved since it started ("cannot lock ref"), runs it again,
/// and so does this (for up to 10 s). Nothing is lost either way.
fn git(dir: &Path, args: &[&str]) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let output = git_output(dir, args);
        if output.status.success() {
            return String::from_utf8_lossy(&output.stdout).into_owned();
        }
        let stderr = String::from_utf8_lossy(&output.stderr);
        // git stash says "could not write index" when it meets the lock.
        let locked = stderr.contains("index.lock")
            || stderr.contains("could not write index")
            || stderr.contains("cannot lock ref");
        if locked && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        }
        panic!("git {args:?}: {stderr}");
    }
}

/// Create `path` through the `write` tool; its rev.
async fn create_page(
    client: &rmcp::service::RunningService<rmcp::RoleClient, ()>,
    path: &str,
    content: &str,
) -> anyhow::Result<String> {
    let result = call(
        client,
        "write",
        json!({"command": "create", "path": path, "content": content}),
    )
    .await?;
    anyhow::ensure!(error_code(&result).is_none(), "create failed: {result}");
    Ok(result["structuredContent"]["rev"]
        .as_str()
        .unwrap_or_default()
        .to_string())
}

fn lab_env(env: Env) -> Env {
    env.ok(&["init"]);
    env.ok(&["workspace", "create", "lab"]);
    env.ingest(
        "lab",
        &[
            ("zephyr-notes.md", b"# Zephyr\n\nwind notes\n"),
            ("tide.md", b"# Tide\n"),
            ("moon.md", b"# Moon\n"),
            ("red-square.png", alexandria_tests::TINY_PNG),
        ],
    );
    env
}

/// Paths a commit deleted, over the whole history of HEAD.
fn deletions(root: &Path) -> String {
    git(
        root,
        &[
            "log",
            "--diff-filter=D",
            "--name-only",
            "--format=commit %h %s",
        ],
    )
}

/// The blob id of `path` in HEAD.
fn head_rev(root: &Path, path: &str) -> Option<String> {
    let output = git_output(root, &["rev-parse", &format!("HEAD:{path}")]);
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_string())
}

/// Every page in `created` is in HEAD at the rev its write answered.
fn assert_in_head(root: &Path, created: &[(String, String)]) {
    for (path, rev) in created {
        assert_eq!(
            head_rev(root, path).as_deref(),
            Some(rev.as_str()),
            "{path}"
        );
    }
}

fn porcelain(root: &Path) -> BTreeSet<String> {
    alexandria_tests::wait_index_written(root);
    git(root, &["status", "--porcelain", "--untracked-files=all"])
        .lines()
        .map(str::to_string)
        .collect()
}

/// `git stash pop` as a person runs it. When the stash captured an agent's page (the
/// daemon wrote it between stash reading HEAD and reading the index) and the page moved
/// on since, the pop conflicts on it and keeps the stash (nothing is lost); the person
/// then keeps HEAD's version of the conflicting pages and drops the stash (the rest of
/// it was applied).
fn stash_pop(root: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let output = git_output(root, &["stash", "pop", "-q"]);
        if output.status.success() {
            return;
        }
        let stderr = String::from_utf8_lossy(&output.stderr);
        if (stderr.contains("index.lock") || stderr.contains("could not write index"))
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        }
        let unmerged = git(root, &["diff", "--name-only", "--diff-filter=U"]);
        assert!(
            !unmerged.trim().is_empty(),
            "git stash pop failed without a conflict: {stderr}{}",
            String::from_utf8_lossy(&output.stdout)
        );
        for path in unmerged.lines() {
            git(root, &["checkout", "HEAD", "--", path]);
        }
        git(root, &["stash", "drop", "-q"]);
        return;
    }
}

/// Whether HEAD holds every acknowledged page and line (`check_head` without asserting).
fn head_holds(root: &Path, created: &[(String, String)], appended: &[String]) -> bool {
    let shared = git_output(root, &["show", "HEAD:wiki/shared.md"]);
    let shared = String::from_utf8_lossy(&shared.stdout);
    created
        .iter()
        .all(|(path, rev)| head_rev(root, path).as_deref() == Some(rev.as_str()))
        && appended.iter().all(|line| shared.contains(line.as_str()))
}

/// Every acknowledged page is in HEAD at its acknowledged rev (or, for the shared page,
/// holds every acknowledged line), and every raw source is in HEAD.
fn check_head(root: &Path, created: &[(String, String)], appended: &[String]) {
    let mut missing = Vec::new();
    for (path, rev) in created {
        if head_rev(root, path).as_deref() != Some(rev.as_str()) {
            missing.push(path.clone());
        }
    }
    assert!(
        missing.is_empty(),
        "{} of {} acknowledged pages not in HEAD: {missing:?}",
        missing.len(),
        created.len()
    );
    let shared = git(root, &["show", "HEAD:wiki/shared.md"]);
    for line in appended {
        assert!(shared.contains(line.as_str()), "{line} missing from HEAD");
    }
    for raw in [
        "raw/zephyr-notes.md",
        "raw/tide.md",
        "raw/moon.md",
        "raw/red-square.png",
    ] {
        assert!(head_rev(root, raw).is_some(), "{raw} missing from HEAD");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_commits_stash_and_commit_all_between_agent_writes_lose_nothing() -> anyhow::Result<()>
{
    hand_work_between_agent_writes(false).await
}

/// The same with `index.skipHash` (what the daemon does by itself from a 1 MiB index,
/// about 10k pages): git and the daemon both write the index with a null trailer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_commits_between_agent_writes_lose_nothing_with_the_index_hash_skipped()
-> anyhow::Result<()> {
    hand_work_between_agent_writes(true).await
}

/// A `git reset --hard` (or `git stash`) by hand that resolved HEAD before a write's
/// commit and ends between the commit and the write's record in state.db: the page
/// leaves the disk and HEAD. The write is acknowledged (it failed with
/// `not_found`, and so did every write of its group), and the daemon puts the page back
/// on disk and in HEAD by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_page_a_reset_took_away_before_its_record_is_kept() -> anyhow::Result<()> {
    let env = lab_env(Env::with_faults("delay:record:1500"));
    let root = env.workspace_dir("lab");
    let client = env.client(Some("lab")).await?;
    let before = git(&root, &["rev-parse", "HEAD"]).trim().to_string();
    let text = "# Raced\n\nkept by the daemon\n";
    let resetter = {
        let (root, before) = (root.clone(), before.clone());
        std::thread::spawn(move || {
            // Once the page is committed (HEAD moved), what a `git reset --hard` that
            // resolved HEAD before the commit does when it ends: the branch back to
            // that HEAD ("reset: moving to HEAD"), the index and files as it has them.
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if git(&root, &["rev-parse", "HEAD"]).trim() != before {
                    git(
                        &root,
                        &["update-ref", "-m", "reset: moving to HEAD", "HEAD", &before],
                    );
                    git(&root, &["read-tree", "-u", "--reset", &before]);
                    return !root.join("wiki/raced.md").exists();
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            false
        })
    };
    let created = call(
        &client,
        "write",
        json!({"command": "create", "path": "wiki/raced.md", "content": text}),
    )
    .await?;
    let reset = resetter.join().expect("the reset thread");
    assert!(reset, "the reset took the page away before its record");
    assert!(error_code(&created).is_none(), "acknowledged: {created}");
    let page = root.join("wiki/raced.md");
    let back = alexandria_tests::wait_until(Duration::from_secs(10), || {
        std::fs::read_to_string(&page).is_ok_and(|t| t == text)
            && git_output(&root, &["show", "HEAD:wiki/raced.md"])
                .stdout
                .as_slice()
                == text.as_bytes()
    });
    assert!(back, "put back on disk and in HEAD");
    // Another write goes through as usual.
    let next = call(
        &client,
        "write",
        json!({"command": "append", "path": "wiki/raced.md", "content": "more"}),
    )
    .await?;
    assert!(error_code(&next).is_none(), "{next}");
    Ok(())
}

async fn hand_work_between_agent_writes(skip_hash: bool) -> anyhow::Result<()> {
    let env = lab_env(Env::new());
    let root = env.workspace_dir("lab");
    if skip_hash {
        git(&root, &["config", "index.skipHash", "true"]);
    }
    let client = env.client(Some("lab")).await?;
    let shared = call(
        &client,
        "write",
        json!({"command": "create", "path": "wiki/shared.md", "content": "# Shared\n"}),
    )
    .await?;
    assert!(error_code(&shared).is_none(), "{shared}");

    // Three agent sessions write at once: creates, and appends to one shared page.
    let mut writers = Vec::new();
    for session in 0..3 {
        let client = env.client(Some("lab")).await?;
        writers.push(tokio::spawn(async move {
            let mut created = Vec::new();
            let mut appended = Vec::new();
            for n in 0..20 {
                let path = format!("wiki/ag{session}/{n}.md");
                let rev = create_page(&client, &path, &format!("# A {session} {n}\n")).await?;
                created.push((path, rev));
                let line = format!("- line s{session}n{n}end");
                let result = call(
                    &client,
                    "write",
                    json!({"command": "append", "path": "wiki/shared.md", "content": line}),
                )
                .await?;
                anyhow::ensure!(error_code(&result).is_none(), "append failed: {result}");
                appended.push(line);
            }
            client.cancel().await?;
            anyhow::Ok((created, appended))
        }));
    }

    // Meanwhile, a person works in the repository.
    let person_root = root.clone();
    let person = tokio::task::spawn_blocking(move || {
        let root = person_root;
        for n in 0..6 {
            // A commit by hand of one new file.
            std::fs::write(root.join(format!("wiki/hand{n}.md")), format!("hand {n}\n"))?;
            git(&root, &["add", &format!("wiki/hand{n}.md")]);
            git(&root, &["commit", "-q", "-m", &format!("hand {n}")]);
            // Stash an edit of their own page and bring it back.
            std::fs::write(root.join("wiki/hand0.md"), format!("hand 0, edit {n}\n"))?;
            git(&root, &["stash", "-q"]);
            stash_pop(&root);
            // Commit everything tracked that they changed.
            git(
                &root,
                &["commit", "-q", "-a", "-m", &format!("commit -a {n}")],
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // Something unrelated staged and left uncommitted, and an untracked file.
        std::fs::write(root.join("notes.txt"), "my notes\n")?;
        git(&root, &["add", "notes.txt"]);
        std::fs::write(root.join("scratch.txt"), "scratch\n")?;
        anyhow::Ok(())
    });

    let mut created = Vec::new();
    let mut appended = Vec::new();
    for writer in writers {
        let (c, a) = writer.await??;
        created.extend(c);
        appended.extend(a);
    }
    person.await??;

    // A reset racing the last writes is repaired within about a second (the watcher).
    alexandria_tests::wait_until(Duration::from_secs(10), || {
        head_holds(&root, &created, &appended)
    });
    check_head(&root, &created, &appended);
    // Only the person's own changes show, at once (no waiting for a background sync).
    assert_eq!(
        porcelain(&root),
        BTreeSet::from(["A  notes.txt".to_string(), "?? scratch.txt".to_string()])
    );
    // A plain commit by hand now records exactly the staged file.
    git(&root, &["commit", "-q", "-m", "my notes"]);
    let stat = git(&root, &["show", "--name-status", "--format=", "HEAD"]);
    assert_eq!(stat.trim(), "A\tnotes.txt");
    check_head(&root, &created, &appended);
    // A hand commit that raced a daemon commit may drop a page; the daemon commits it
    // again (`restore`). No other deletion.
    let deleted = alexandria_tests::unrestored_deletions(&root);
    assert!(
        deleted.trim().is_empty(),
        "commits deleted paths:\n{deleted}"
    );
    git(&root, &["fsck", "--no-progress"]);
    // The daemon writes the index last.
    let last = call(
        &client,
        "write",
        json!({"command": "create", "path": "wiki/last.md", "content": "# Last\n"}),
    )
    .await?;
    assert!(error_code(&last).is_none(), "{last}");
    // Read before `git status`, which may write the index again.
    let index = std::fs::read(root.join(".git/index"))?;
    let trailer = &index[index.len() - 20..];
    assert_eq!(
        trailer.iter().all(|&b| b == 0),
        skip_hash,
        "the index's trailer is null exactly when its hash is skipped"
    );
    assert_eq!(
        porcelain(&root),
        BTreeSet::from(["?? scratch.txt".to_string()])
    );
    client.cancel().await?;
    Ok(())
}

/// A person commits by hand in a tight loop (`git add` + `git commit`, and `commit -a`)
/// while three agent sessions write. `git commit` reads HEAD and git's index before it
/// takes `.git/index.lock`: if the daemon moved HEAD before it rewrote the index, such a
/// commit recorded a tree without the daemon's newest pages on top of the daemon's
/// commit, deleting them (found by the kill loop under load).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_commits_in_a_tight_loop_never_delete_an_agent_page() -> anyhow::Result<()> {
    let env = Env::new();
    env.ok(&["init"]);
    env.ok(&["workspace", "create", "lab"]);
    let root = env.workspace_dir("lab");
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));

    let person_root = root.clone();
    let person_done = std::sync::Arc::clone(&done);
    let person = tokio::task::spawn_blocking(move || {
        let root = person_root;
        let mut n = 0;
        while !person_done.load(std::sync::atomic::Ordering::SeqCst) {
            let path = format!("wiki/hand{n}.md");
            std::fs::write(root.join(&path), format!("hand {n}\n"))?;
            git(&root, &["add", &path]);
            git(&root, &["commit", "-q", "-m", &format!("hand {n}")]);
            std::fs::write(root.join(&path), format!("hand {n}, edited\n"))?;
            git(
                &root,
                &["commit", "-q", "-a", "-m", &format!("hand {n} -a")],
            );
            n += 1;
        }
        anyhow::Ok(n)
    });

    let mut writers = Vec::new();
    for session in 0..3 {
        let client = env.client(Some("lab")).await?;
        writers.push(tokio::spawn(async move {
            let mut created = Vec::new();
            for n in 0..50 {
                let path = format!("wiki/ag{session}/{n}.md");
                let rev = create_page(&client, &path, &format!("# A {session} {n}\n")).await?;
                created.push((path, rev));
            }
            client.cancel().await?;
            anyhow::Ok(created)
        }));
    }
    let mut created = Vec::new();
    for writer in writers {
        created.extend(writer.await??);
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let hand = person.await??;
    assert!(hand > 0);

    // A hand commit made from a copy of git's index read before a daemon commit drops
    // that commit's pages (`git commit` writes its copy back); the daemon commits them
    // again, at the latest within about a second (the watcher), and stages them again.
    let settled = alexandria_tests::wait_until(Duration::from_secs(15), || {
        created
            .iter()
            .all(|(path, rev)| head_rev(&root, path).as_deref() == Some(rev.as_str()))
            && porcelain(&root).is_empty()
    });
    let unrestored = alexandria_tests::unrestored_deletions(&root);
    assert!(
        unrestored.is_empty(),
        "commits deleted paths that were not put back:\n{unrestored}\nall deletions:\n{}",
        deletions(&root)
    );
    eprintln!(
        "hand commits: {hand}; deletions put back: {}",
        deletions(&root)
            .lines()
            .filter(|l| l.starts_with("wiki/"))
            .count()
    );
    assert!(settled, "HEAD or git's index did not get every page back");
    let missing: Vec<&String> = created
        .iter()
        .filter(|(path, rev)| head_rev(&root, path).as_deref() != Some(rev.as_str()))
        .map(|(path, _)| path)
        .collect();
    assert!(
        missing.is_empty(),
        "{} of {} acknowledged pages not in HEAD: {missing:?}",
        missing.len(),
        created.len()
    );
    for n in 0..hand {
        assert!(
            head_rev(&root, &format!("wiki/hand{n}.md")).is_some(),
            "hand{n} not in HEAD"
        );
    }
    assert_eq!(porcelain(&root), BTreeSet::new());
    Ok(())
}

/// Under a steady stream of agent writes the daemon keeps `.git/index.lock` between
/// writes and lets it go once a second (after it wrote git's index); the next write
/// then waits a little before it takes it again, so that a person's git command, run
/// again when it meets the lock (as git tells them to), gets in. Without that gap the
/// next write took the lock again within microseconds, and a `git add` retried for
/// 10 s could fail (the kill loop, 1 round in about 400). Here the person is a probe
/// that takes the lock as git does (`O_CREAT | O_EXCL`) every few ms and lets it go at
/// once, so the stream stays as it is; it must get in at least once a second or so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn git_by_hand_gets_in_under_a_steady_stream_of_writes() -> anyhow::Result<()> {
    /// Longest the probe may find the lock taken, with the stream steady.
    const SHUT_AT_MOST: Duration = Duration::from_millis(1_800);
    let env = Env::new();
    env.ok(&["init"]);
    env.ok(&["workspace", "create", "lab"]);
    let root = env.workspace_dir("lab");
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = Vec::new();
    for session in 0..3 {
        let client = env.client(Some("lab")).await?;
        let done = std::sync::Arc::clone(&done);
        writers.push(tokio::spawn(async move {
            let mut created = Vec::new();
            let mut n = 0;
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                let path = format!("wiki/s{session}/{n}.md");
                let rev = create_page(&client, &path, &format!("# S {session} {n}\n")).await?;
                created.push((path, rev));
                n += 1;
            }
            client.cancel().await?;
            anyhow::Ok(created)
        }));
    }
    let lock = root.join(".git/index.lock");
    let probe = tokio::task::spawn_blocking(move || {
        let began = Instant::now();
        let mut last_in = Instant::now();
        let mut longest = Duration::ZERO;
        let mut got_in = 0;
        while began.elapsed() < Duration::from_secs(4) {
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&lock)
            {
                Ok(_) => {
                    std::fs::remove_file(&lock)?;
                    got_in += 1;
                    last_in = Instant::now();
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    longest = longest.max(last_in.elapsed());
                }
                Err(e) => return Err(e.into()),
            }
            // About as often as a person's git, run again at once, takes the lock.
            std::thread::sleep(Duration::from_millis(5));
        }
        anyhow::Ok((longest, got_in))
    });
    let probed = probe.await?;
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut created = Vec::new();
    for writer in writers {
        created.extend(writer.await??);
    }
    let (longest, got_in) = probed?;
    eprintln!(
        "the lock was taken for at most {longest:?} at a time; got in {got_in} times, under a stream of {} writes",
        created.len()
    );
    assert!(
        longest <= SHUT_AT_MOST,
        "git's index lock stayed taken for {longest:?} under a stream of writes"
    );
    assert!(
        created.len() > 100,
        "the stream was not steady: {} writes",
        created.len()
    );
    assert_in_head(&root, &created);
    Ok(())
}

/// `git commit` reads git's index before it takes `.git/index.lock` and writes the copy it
/// read back; a commit that raced a daemon write therefore leaves an index without the
/// write's page, and the person's next commit (or one that read HEAD late enough) drops
/// the page from HEAD. Both are set up here without a race: a commit made from a copy of
/// the index taken before the agent's write (`GIT_INDEX_FILE`), and that copy written back
/// as git writes it. The daemon puts the page back in HEAD (with a `restore` history entry
/// naming the hand commit) and in the index; the page was on disk all along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_commit_from_an_old_copy_of_the_index_does_not_drop_a_page() -> anyhow::Result<()> {
    let env = lab_env(Env::new());
    let root = env.workspace_dir("lab");
    let client = env.client(Some("lab")).await?;
    let create = |path: &str| json!({"command": "create", "path": path, "content": format!("# {path}\n\nagent text\n")});
    let result = call(&client, "write", create("wiki/first.md")).await?;
    assert!(error_code(&result).is_none(), "{result}");
    // What a `git commit` starting now reads.
    let old_copy = root.join(".git/old-index");
    std::fs::copy(root.join(".git/index"), &old_copy)?;
    let result = call(&client, "write", create("wiki/agent.md")).await?;
    assert!(error_code(&result).is_none(), "{result}");
    let rev = result["structuredContent"]["rev"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    // The person's commit, made from that copy: it drops wiki/agent.md from HEAD.
    std::fs::write(root.join("wiki/hand.md"), "by hand\n")?;
    for args in [
        &["add", "wiki/hand.md"][..],
        &["commit", "-q", "-m", "hand, from an old index"][..],
    ] {
        let output = Command::new("git")
            .args(["-c", "user.name=Hand", "-c", "user.email=hand@example.com"])
            .args(args)
            .current_dir(&root)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_INDEX_FILE", &old_copy)
            .output()?;
        assert!(output.status.success(), "git {args:?}: {output:?}");
    }
    // git writes the copy it committed from back as git's index.
    // (The daemon may hold the lock a moment, repairing what the commit dropped: git
    // then says so, and the person runs it again.)
    let write_back = |copy: &Path| -> anyhow::Result<()> {
        let lock = root.join(".git/index.lock");
        let deadline = Instant::now() + Duration::from_secs(10);
        while let Err(error) = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&lock)
        {
            anyhow::ensure!(
                error.kind() == std::io::ErrorKind::AlreadyExists && Instant::now() < deadline,
                "cannot take .git/index.lock: {error}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        std::fs::copy(copy, &lock)?;
        std::fs::rename(&lock, root.join(".git/index"))?;
        Ok(())
    };
    write_back(&old_copy)?;
    // (Not HEAD: the daemon may have put the page back on top already.)
    let hand = git(
        &root,
        &["log", "--format=%h", "--grep=^hand, from an old index$"],
    )
    .trim()
    .to_string();
    assert!(!hand.is_empty());
    let put_back = alexandria_tests::wait_until(Duration::from_secs(10), || {
        head_rev(&root, "wiki/agent.md").as_deref() == Some(rev.as_str())
    });
    assert!(
        put_back,
        "the page the hand commit dropped is not back in HEAD:\n{}",
        git(&root, &["log", "--format=%h %cn: %s", "-n", "5"])
    );
    assert!(
        head_rev(&root, "wiki/hand.md").is_some(),
        "the hand commit stays"
    );
    assert!(alexandria_tests::unrestored_deletions(&root).is_empty());
    let history = call(&client, "history", json!({"path": "wiki/agent.md"})).await?;
    let restore = history["structuredContent"]["entries"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["op"] == "restore")
        .cloned()
        .unwrap_or_default();
    assert!(
        restore["summary"]
            .as_str()
            .is_some_and(|s| s.contains(&hand)),
        "a restore entry names the hand commit {hand}: {history}"
    );
    assert!(
        alexandria_tests::wait_until(Duration::from_secs(10), || porcelain(&root).is_empty()),
        "{:?}",
        porcelain(&root)
    );

    // A failed `git commit` only writes its old copy back: git's index loses the page
    // (`D` + `??`) while HEAD has it. The daemon stages it again.
    std::fs::copy(root.join(".git/index"), &old_copy)?;
    let result = call(&client, "write", create("wiki/second.md")).await?;
    assert!(error_code(&result).is_none(), "{result}");
    write_back(&old_copy)?;
    let staged = alexandria_tests::wait_until(Duration::from_secs(10), || {
        git(&root, &["ls-files", "wiki/second.md"]).trim() == "wiki/second.md"
            && porcelain(&root).is_empty()
    });
    assert!(staged, "not staged again: {:?}", porcelain(&root));
    std::fs::remove_file(&old_copy)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_workspaces_start_on_main_and_a_switched_branch_is_followed() -> anyhow::Result<()> {
    let env = lab_env(Env::new());
    let root = env.workspace_dir("lab");
    assert_eq!(
        git(&root, &["symbolic-ref", "HEAD"]).trim(),
        "refs/heads/main"
    );
    let client = env.client(Some("lab")).await?;
    git(&root, &["switch", "-q", "-c", "topic"]);
    let result = call(
        &client,
        "write",
        json!({"command": "create", "path": "wiki/on-topic.md", "content": "# T\n"}),
    )
    .await?;
    assert!(error_code(&result).is_none(), "{result}");
    let rev = result["structuredContent"]["rev"].as_str().unwrap_or("");
    assert_eq!(
        git(&root, &["rev-parse", "topic:wiki/on-topic.md"]).trim(),
        rev
    );
    assert!(
        !git_output(&root, &["rev-parse", "main:wiki/on-topic.md"])
            .status
            .success()
    );
    let guide = call(&client, "guide", json!({})).await?;
    assert!(text_of(&guide).contains("topic"), "{}", text_of(&guide));
    assert_eq!(guide["structuredContent"]["git"]["branch"], "topic");
    client.cancel().await?;

    // The branch of new workspaces is configurable.
    let other = Env::new();
    std::fs::create_dir_all(&other.home)?;
    std::fs::write(
        other.home.join("config.toml"),
        "[git]\ndefault_branch = \"trunk\"\n",
    )?;
    other.ok(&["init"]);
    other.ok(&["workspace", "create", "t"]);
    assert_eq!(
        git(&other.workspace_dir("t"), &["symbolic-ref", "HEAD"]).trim(),
        "refs/heads/trunk"
    );
    Ok(())
}

/// A write and an ingest are refused naming `state` and `how`; reads and guide work.
async fn refused_while(
    env: &Env,
    client: &rmcp::service::RunningService<rmcp::RoleClient, ()>,
    state: &str,
    how: &str,
) -> anyhow::Result<()> {
    let root = env.workspace_dir("lab");
    let head_before = git(&root, &["rev-parse", "HEAD"]);
    let result = call(
        client,
        "write",
        json!({"command": "create", "path": "wiki/refused.md", "content": "# R\n"}),
    )
    .await?;
    assert_eq!(error_code(&result), Some("repository_in_use"), "{result}");
    let error = &result["structuredContent"]["error"];
    assert_eq!(error["git_state"], state, "{result}");
    let message = format!("{} {}", error["message"], error["hint"]);
    assert!(message.contains(how), "{how} not in {message}");
    assert!(!root.join("wiki/refused.md").exists());
    let append = call(
        client,
        "write",
        json!({"command": "append", "path": "wiki/index.md", "content": "x"}),
    )
    .await?;
    assert_eq!(error_code(&append), Some("repository_in_use"), "{append}");
    let delete = call(client, "delete", json!({"path": "wiki/keep.md"})).await?;
    assert_eq!(error_code(&delete), Some("repository_in_use"), "{delete}");
    assert_eq!(git(&root, &["rev-parse", "HEAD"]), head_before);

    let read = call(client, "read", json!({"path": "wiki/keep.md"})).await?;
    assert!(error_code(&read).is_none(), "{read}");
    let guide = call(client, "guide", json!({})).await?;
    assert!(error_code(&guide).is_none(), "{guide}");
    assert_eq!(guide["structuredContent"]["git"]["state"], state, "{guide}");
    assert!(text_of(&guide).contains(how), "{}", text_of(&guide));

    let scratch = env.dir.path().join("new-source.md");
    std::fs::write(&scratch, "# New\n")?;
    let ingest = env.run(&["ingest", "lab", &scratch.display().to_string()]);
    assert!(!ingest.status.success());
    let said = String::from_utf8_lossy(&ingest.stderr);
    assert!(
        said.contains("repository_in_use") || said.contains(how),
        "{said}"
    );
    assert!(!root.join("raw/new-source.md").exists());
    Ok(())
}

/// Create `wiki/held/{n}.md` for each `n`, with git's index left unwritten
/// (`delay:settle`), and check that the daemon holds it: the lock is there, a hand
/// commit is refused, and `git status` shows the index behind HEAD. Returns HEAD
/// before the writes.
async fn writes_with_the_index_held(env: &Env, pages: usize) -> anyhow::Result<String> {
    let root = env.workspace_dir("lab");
    let before = git(&root, &["rev-parse", "HEAD"]).trim().to_string();
    let client = env.client(Some("lab")).await?;
    for n in 0..pages {
        create_page(
            &client,
            &format!("wiki/held/{n}.md"),
            &format!("# Held {n}\n"),
        )
        .await?;
    }
    client.cancel().await?;
    assert!(
        root.join(".git/index.lock").exists(),
        "the daemon holds git's index"
    );
    let record = std::fs::read_to_string(root.join(".git/alexandria-index-base"))?;
    assert_eq!(
        record.trim(),
        before,
        "the index on disk matches HEAD before the writes"
    );
    std::fs::write(root.join("wiki/hand.md"), "by hand\n")?;
    let refused = git_output(&root, &["commit", "-q", "-a", "-m", "hand"]);
    assert!(
        !refused.status.success(),
        "a hand commit must wait for the index"
    );
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("index.lock"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let status =
        String::from_utf8_lossy(&git_output(&root, &["status", "--porcelain"]).stdout).into_owned();
    assert!(status.contains("D  wiki/held/0.md"), "{status}");
    assert_eq!(
        git(&root, &["rev-parse", "HEAD~1"]).trim() != before,
        pages > 1
    );
    Ok(before)
}

/// Check that git's index has every held page again, that no lock or record is left,
/// and that a hand commit keeps the pages.
fn index_caught_up(root: &Path, pages: usize) {
    assert!(
        !root.join(".git/index.lock").exists(),
        "the lock is released"
    );
    let record =
        std::fs::read_to_string(root.join(".git/alexandria-index-base")).unwrap_or_default();
    assert!(record.trim().is_empty(), "record left: {record:?}");
    assert_eq!(
        porcelain(root),
        BTreeSet::from(["?? wiki/hand.md".to_string()])
    );
    let staged = git(root, &["ls-files", "wiki/held"]);
    assert_eq!(staged.lines().count(), pages, "{staged}");
    git(root, &["add", "wiki/hand.md"]);
    git(root, &["commit", "-q", "-m", "hand"]);
    let tree = git(root, &["ls-tree", "-r", "--name-only", "HEAD", "wiki/held"]);
    assert_eq!(tree.lines().count(), pages, "{tree}");
    assert!(porcelain(root).is_empty(), "{:?}", porcelain(root));
    git(root, &["fsck", "--no-progress"]);
}

/// Group commits leave git's index unwritten until writes pause (issue 15), holding
/// its lock. A daemon killed meanwhile leaves the index behind HEAD: the next daemon
/// stages every page written since the commit the index matched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_left_unwritten_by_a_killed_daemon_is_caught_up_at_start() -> anyhow::Result<()> {
    let env = lab_env(Env::with_faults("delay:settle:600000"));
    let root = env.workspace_dir("lab");
    writes_with_the_index_held(&env, 300).await?;
    env.kill_daemon();
    assert!(
        root.join(".git/index.lock").exists(),
        "a kill leaves the lock"
    );
    let client = env.client(Some("lab")).await?;
    index_caught_up(&root, 300);
    client.cancel().await?;
    Ok(())
}

/// A daemon that stops writes the index it held, and releases its lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_daemon_writes_the_index_it_held() -> anyhow::Result<()> {
    let env = lab_env(Env::with_faults("delay:settle:600000"));
    let root = env.workspace_dir("lab");
    writes_with_the_index_held(&env, 3).await?;
    env.ok(&["daemon", "stop"]);
    index_caught_up(&root, 3);
    Ok(())
}

/// The stop writes the index it held before it stamps state.db clean (from then on it
/// keeps state.db's write lock until it exits). A re-index of the watcher that holds
/// the workspace's index guard meanwhile and then waits for that lock held the stop
/// up for state.db's busy timeout (30 s: `daemon stop` gave up), one run in ten of the
/// benchmark's write rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reindex_in_progress_does_not_hold_up_the_stop() -> anyhow::Result<()> {
    let env = lab_env(Env::with_faults("delay:settle:600000,delay:refresh:3000"));
    let root = env.workspace_dir("lab");
    writes_with_the_index_held(&env, 3).await?;
    // Saved by hand again once the watcher surely watches (it looks for new
    // workspaces every second): it re-indexes the page, holding the index guard for
    // 3 s first.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    std::fs::write(root.join("wiki/hand.md"), "by hand, again\n")?;
    tokio::time::sleep(Duration::from_millis(700)).await;
    let started = std::time::Instant::now();
    env.ok(&["daemon", "stop"]);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(15), "the stop took {took:?}");
    index_caught_up(&root, 3);
    Ok(())
}

/// The watch of a workspace begins while the daemon holds its git index between
/// writes (the lock a `git clone` would hold looks the same): it never began under a
/// steady stream of writes, and edits by hand went unseen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edits_by_hand_are_seen_while_the_index_is_held() -> anyhow::Result<()> {
    let env = lab_env(Env::with_faults("delay:settle:600000"));
    let root = env.workspace_dir("lab");
    writes_with_the_index_held(&env, 3).await?;
    std::fs::write(root.join("wiki/hand.md"), "# Hand\n\nquokkafern by hand\n")?;
    let client = env.client(Some("lab")).await?;
    let mut found = String::new();
    for _ in 0..100 {
        let result = call(&client, "search", json!({"query": "quokkafern"})).await?;
        found = result.to_string();
        if found.contains("wiki/hand.md") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        found.contains("wiki/hand.md"),
        "the edit by hand is never seen: {found}"
    );
    assert!(
        root.join(".git/index.lock").exists(),
        "the index is still held"
    );
    client.cancel().await?;
    Ok(())
}

/// Without the test's delay, the index is written once writes pause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_index_is_written_once_writes_pause() -> anyhow::Result<()> {
    let env = lab_env(Env::new());
    let root = env.workspace_dir("lab");
    let client = env.client(Some("lab")).await?;
    for n in 0..3 {
        create_page(
            &client,
            &format!("wiki/held/{n}.md"),
            &format!("# Held {n}\n"),
        )
        .await?;
    }
    std::fs::write(root.join("wiki/hand.md"), "by hand\n")?;
    assert!(
        alexandria_tests::wait_until(Duration::from_secs(5), || !root
            .join(".git/index.lock")
            .exists()),
        "the index is written and its lock released"
    );
    index_caught_up(&root, 3);
    client.cancel().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_are_refused_on_a_detached_head_and_in_a_merge() -> anyhow::Result<()> {
    let env = lab_env(Env::new());
    let root = env.workspace_dir("lab");
    let client = env.client(Some("lab")).await?;
    for (path, content) in [
        ("wiki/keep.md", "# Keep\n"),
        ("wiki/conf.md", "# Conf\n\nbase\n"),
    ] {
        let result = call(
            &client,
            "write",
            json!({"command": "create", "path": path, "content": content}),
        )
        .await?;
        assert!(error_code(&result).is_none(), "{result}");
    }

    // Looking at an old state.
    git(&root, &["checkout", "-q", "HEAD~1"]);
    refused_while(&env, &client, "detached_head", "git switch").await?;
    git(&root, &["switch", "-q", "main"]);
    let ok = call(
        &client,
        "write",
        json!({"command": "append", "path": "wiki/keep.md", "content": "after detach"}),
    )
    .await?;
    assert!(error_code(&ok).is_none(), "{ok}");

    // A merge with a conflict, left in progress.
    git(&root, &["switch", "-q", "-c", "side"]);
    std::fs::write(root.join("wiki/conf.md"), "# Conf\n\nside\n")?;
    git(&root, &["commit", "-q", "-am", "side"]);
    git(&root, &["switch", "-q", "main"]);
    std::fs::write(root.join("wiki/conf.md"), "# Conf\n\nmain\n")?;
    git(&root, &["commit", "-q", "-am", "main"]);
    let merge = git_output(&root, &["merge", "side"]);
    assert!(!merge.status.success(), "the merge must stop on a conflict");
    assert!(root.join(".git/MERGE_HEAD").exists());
    refused_while(&env, &client, "merge", "git merge --continue").await?;
    git(&root, &["merge", "--abort"]);
    let ok = call(
        &client,
        "write",
        json!({"command": "append", "path": "wiki/keep.md", "content": "after merge"}),
    )
    .await?;
    assert!(error_code(&ok).is_none(), "{ok}");
    let guide = call(&client, "guide", json!({})).await?;
    assert_eq!(guide["structuredContent"]["git"]["state"], "clean");
    assert_eq!(guide["structuredContent"]["git"]["branch"], "main");
    assert!(porcelain(&root).is_empty(), "{:?}", porcelain(&root));
    client.cancel().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn someone_elses_index_lock_is_waited_for_and_never_clobbered() -> anyhow::Result<()> {
    let env = Env::new();
    std::fs::create_dir_all(&env.home)?;
    std::fs::write(
        env.home.join("config.toml"),
        "[write]\nlock_timeout_secs = 1.0\n",
    )?;
    let env = lab_env(env);
    let root = env.workspace_dir("lab");
    let client = env.client(Some("lab")).await?;
    let lock = root.join(".git/index.lock");

    // Held for a moment: the write waits and goes through.
    std::fs::write(&lock, "someone else's")?;
    let release: PathBuf = lock.clone();
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        let _ = std::fs::remove_file(release);
    });
    let result = call(
        &client,
        "write",
        json!({"command": "create", "path": "wiki/g.md", "content": "# G\n"}),
    )
    .await?;
    releaser.join().expect("releaser");
    assert!(error_code(&result).is_none(), "{result}");
    assert!(porcelain(&root).is_empty(), "{:?}", porcelain(&root));

    // Held for good (a stuck git): workspace_busy naming the lock; nothing changed,
    // and the lock is left alone.
    std::fs::write(&lock, "someone else's")?;
    let head = git_output(&root, &["rev-parse", "HEAD"]).stdout;
    let result = call(
        &client,
        "write",
        json!({"command": "create", "path": "wiki/h.md", "content": "# H\n"}),
    )
    .await?;
    assert_eq!(error_code(&result), Some("workspace_busy"), "{result}");
    assert!(text_of(&result).contains("index.lock"), "{result}");
    assert!(!root.join("wiki/h.md").exists());
    assert_eq!(git_output(&root, &["rev-parse", "HEAD"]).stdout, head);
    assert_eq!(std::fs::read_to_string(&lock)?, "someone else's");
    std::fs::remove_file(&lock)?;
    let result = call(
        &client,
        "write",
        json!({"command": "create", "path": "wiki/h.md", "content": "# H\n"}),
    )
    .await?;
    assert!(error_code(&result).is_none(), "{result}");
    assert!(porcelain(&root).is_empty(), "{:?}", porcelain(&root));
    client.cancel().await?;
    Ok(())
}

/// What a person staged by hand (and nothing else) shows after each agent write, and git
/// trusts the daemon's index entries without re-reading the files: `git diff-files`
/// compares only stat data, so an entry whose recorded stat does not match its file
/// shows there. The person's index changes go through every form git writes: a
/// version 3 index (`add -N`), a version 4 one (left to libgit2), `git status`
/// refreshing it, `rm --cached`, a commit (issue 15: the daemon writes git's index
/// itself).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_index_changes_between_agent_writes_are_kept_and_nothing_is_staged_falsely()
-> anyhow::Result<()> {
    let env = lab_env(Env::new());
    let root = env.workspace_dir("lab");
    let client = env.client(Some("lab")).await?;
    std::fs::create_dir_all(root.join("notes"))?;
    let mut expected: BTreeSet<String> = BTreeSet::new();
    let mut created = Vec::new();
    for n in 0..9 {
        match n {
            1 => {
                std::fs::write(root.join("notes/a.txt"), "a\n")?;
                git(&root, &["add", "notes/a.txt"]);
                expected.insert("A  notes/a.txt".into());
            }
            2 => {
                std::fs::write(root.join("notes/later.txt"), "later\n")?;
                git(&root, &["add", "-N", "notes/later.txt"]);
                expected.insert(" A notes/later.txt".into());
            }
            3 => {
                git(&root, &["update-index", "--index-version", "4"]);
            }
            5 => {
                git(&root, &["update-index", "--index-version", "2"]);
                std::fs::write(root.join("notes/b.txt"), "b\n")?;
                git(&root, &["add", "notes/b.txt"]);
                expected.insert("A  notes/b.txt".into());
            }
            6 => {
                git(&root, &["rm", "-q", "--cached", "notes/b.txt"]);
                expected.remove("A  notes/b.txt");
                expected.insert("?? notes/b.txt".into());
            }
            7 => {
                git(&root, &["commit", "-q", "-m", "my notes"]);
                // An intent-to-add entry is not committed; it stays as it was.
                expected.remove("A  notes/a.txt");
            }
            _ => {}
        }
        let path = format!("wiki/idx/{n}.md");
        let rev = create_page(&client, &path, &format!("# Page {n}\n")).await?;
        created.push((path, rev));
        alexandria_tests::wait_index_written(&root);
        let stat_dirty = git(&root, &["diff-files", "--name-only"]);
        assert!(
            stat_dirty.lines().all(|l| l == "notes/later.txt"),
            "after write {n}, entries whose stat data does not match their file: {stat_dirty}"
        );
        assert_eq!(porcelain(&root), expected, "after write {n}");
        assert_in_head(&root, &created);
    }
    // A plain commit by hand records exactly what the person staged.
    git(&root, &["add", "notes/later.txt"]);
    git(&root, &["commit", "-q", "-m", "later"]);
    let stat = git(&root, &["show", "--name-status", "--format=", "HEAD"]);
    assert_eq!(stat.trim(), "A\tnotes/later.txt");
    assert_eq!(
        porcelain(&root),
        BTreeSet::from(["?? notes/b.txt".to_string()])
    );
    let deleted = deletions(&root);
    assert!(
        deleted.trim().is_empty(),
        "commits deleted paths:\n{deleted}"
    );
    git(&root, &["fsck", "--no-progress"]);
    client.cancel().await?;
    Ok(())
}

/// The index a write replaced is kept as `.git/alexandria-index-spare`, and the next
/// write puts its index into that file (same inode) when no one has it open. A person's
/// process holding it (a `git status` that opened it while it was `.git/index`) keeps
/// reading what it opened: the next index is a new file then. Either way git reads an
/// index holding every page the agent wrote.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replaced_index_is_written_into_only_when_no_one_holds_it() -> anyhow::Result<()> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let env = lab_env(Env::new());
    let root = env.workspace_dir("lab");
    let client = env.client(Some("lab")).await?;
    let index = root.join(".git/index");
    let spare = root.join(".git/alexandria-index-spare");
    let ino = |path: &Path| std::fs::metadata(path).map(|m| m.ino());
    let mut created = Vec::new();
    for n in 0..4 {
        if n == 2 {
            assert!(spare.exists(), "the replaced index is kept");
        }
        let spare_before = ino(&spare).ok();
        let held = if n == 3 {
            let mut file = std::fs::File::open(&spare)?;
            let mut bytes = Vec::new();
            file.read_to_end(&mut bytes)?;
            Some((file, bytes))
        } else {
            None
        };
        let path = format!("wiki/spare/{n}.md");
        let rev = create_page(&client, &path, &format!("# Spare {n}\n")).await?;
        created.push((path, rev));
        alexandria_tests::wait_index_written(&root);
        let now = ino(&index)?;
        match (n, held) {
            (2, _) => assert_eq!(Some(now), spare_before, "write 2 used the spare"),
            (3, Some((mut file, bytes))) => {
                assert_ne!(Some(now), spare_before, "a held spare is not written into");
                use std::io::Seek;
                file.rewind()?;
                let mut again = Vec::new();
                file.read_to_end(&mut again)?;
                assert_eq!(again, bytes, "what the holder reads did not change");
            }
            _ => {}
        }
        assert_eq!(
            git(&root, &["diff-files", "--name-only"]),
            "",
            "after write {n}"
        );
        assert_eq!(
            git(&root, &["diff", "--cached", "--name-only"]),
            "",
            "after write {n}"
        );
        assert_in_head(&root, &created);
    }
    git(&root, &["fsck", "--no-dangling"]);
    Ok(())
}

/// Loose objects and packs in `root`'s object store.
fn object_counts(root: &Path) -> (usize, usize) {
    let text = git(root, &["count-objects", "-v"]);
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    (field("count:"), field("packs:"))
}

/// Writes leave loose objects (a big folder's tree per write); once the daemon goes
/// quiet they are packed, and nothing any commit refers to goes: pages written after,
/// one of them with the text of a packed page (its blob only in the pack), commit and
/// read back, and `git fsck` finds every object. The daemon is started as a git hook
/// would start it, with git's repository variables pointing at another repository:
/// the `git` it runs must pack the workspace and leave that one alone, at the lowest
/// priority (a `git` first on `PATH` notes its nice value, then runs the real one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loose_objects_are_packed_once_the_daemon_goes_quiet_and_nothing_is_lost()
-> anyhow::Result<()> {
    let mut env = Env::new();
    env.vars
        .push(("ALEXANDRIA_PACK_LOOSE_FROM".into(), Some("40".into())));
    let bin_dir = tempfile::tempdir()?;
    let niceness = bin_dir.path().join("repack-nice.txt");
    let path = std::env::var("PATH").unwrap_or_default();
    let real_git = std::env::split_paths(&path)
        .map(|dir| dir.join("git"))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| anyhow::anyhow!("no git on PATH"))?;
    let wrapper = bin_dir.path().join("git");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\ncase \" $* \" in *\" repack \"*) nice >> '{}' ;; esac\nexec '{}' \"$@\"\n",
            niceness.display(),
            real_git.display()
        ),
    )?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))?;
    let mut dirs = vec![bin_dir.path().to_path_buf()];
    dirs.extend(std::env::split_paths(&path));
    let wrapped = std::env::join_paths(dirs)?;
    env.vars
        .push(("PATH".into(), Some(wrapped.to_string_lossy().into_owned())));
    let decoy_dir = tempfile::tempdir()?;
    let decoy = decoy_dir.path();
    git(decoy, &["init", "-q"]);
    std::fs::write(decoy.join("hook.txt"), "a hook's repository\n")?;
    git(decoy, &["add", "hook.txt"]);
    let decoy_git = decoy.join(".git");
    for (name, value) in [
        ("GIT_DIR", decoy_git.clone()),
        ("GIT_WORK_TREE", decoy.to_path_buf()),
        ("GIT_INDEX_FILE", decoy_git.join("index")),
        ("GIT_OBJECT_DIRECTORY", decoy_git.join("objects")),
    ] {
        env.vars
            .push((name.into(), Some(value.to_string_lossy().into_owned())));
    }
    let decoy_before = object_counts(decoy);
    env.ok(&["init"]);
    env.ok(&["workspace", "create", "lab"]);
    let root = env.workspace_dir("lab");
    let client = env.client(Some("lab")).await?;
    let mut created = Vec::new();
    for n in 0..20 {
        let path = format!("wiki/pack/page-{n}.md");
        let content = format!("# Page {n}\n\nbody of page {n}\n");
        let rev = create_page(&client, &path, &content).await?;
        created.push((path, rev));
    }
    let (loose, packs) = object_counts(&root);
    assert!(loose >= 40, "{loose} loose objects after 20 writes");
    assert!(
        alexandria_tests::wait_until(Duration::from_secs(60), || {
            let (now_loose, now_packs) = object_counts(&root);
            now_packs > packs && now_loose < 20
        }),
        "not packed within 60 s of going quiet: {:?}",
        object_counts(&root)
    );
    assert_in_head(&root, &created);
    git(&root, &["fsck", "--no-progress", "--strict"]);
    let nice = std::fs::read_to_string(&niceness)?;
    assert!(
        !nice.trim().is_empty() && nice.lines().all(|l| l.trim() == "19"),
        "git repack ran at nice {nice:?}, not 19"
    );
    assert_eq!(
        object_counts(decoy),
        decoy_before,
        "the hook's repository was packed or written to"
    );
    assert_eq!(
        git(decoy, &["diff", "--cached", "--name-only"]).trim(),
        "hook.txt"
    );

    // A page with the text of a packed one: its blob is only in the pack.
    let again = create_page(&client, "wiki/again.md", "# Page 3\n\nbody of page 3\n").await?;
    assert_eq!(again, created[3].1, "same text, same blob");
    let appended = call(
        &client,
        "write",
        json!({"command": "append", "path": "wiki/pack/page-5.md", "content": "after the pack"}),
    )
    .await?;
    assert!(error_code(&appended).is_none(), "{appended}");
    let read = call(&client, "read", json!({"path": "wiki/pack/page-5.md"})).await?;
    assert!(text_of(&read).contains("after the pack"), "{read}");
    let history = call(&client, "history", json!({"path": "wiki/pack/page-5.md"})).await?;
    assert!(error_code(&history).is_none(), "{history}");
    git(&root, &["fsck", "--no-progress", "--strict"]);
    assert_eq!(
        git(&root, &["show", "HEAD:wiki/again.md"]),
        "# Page 3\n\nbody of page 3\n"
    );
    alexandria_tests::wait_index_written(&root);
    assert_eq!(
        git(&root, &["status", "--porcelain"]).trim(),
        "",
        "dirty tree after packing"
    );
    client.cancel().await?;
    Ok(())
}
