//! End-to-end tests of an editor saving a page while agents write it (issue 20): no
//! `internal` errors, no editor save and no acknowledged agent line missing from git,
//! and history explains every acknowledged line the editor's saves removed.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use alexandria_tests::{Env, call, error_code, wait_until};
use serde_json::{Value, json};

const PAGE: &str = "wiki/race.md";

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

/// Every file under `dir`.
fn walkdir(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(walkdir(&path));
        } else {
            files.push(path);
        }
    }
    files
}

/// Every line any commit of HEAD's history added to `path`.
fn added_lines(root: &Path, path: &str) -> HashSet<String> {
    git(root, &["log", "-p", "--format=", "--", path])
        .lines()
        .filter(|l| l.starts_with('+') && !l.starts_with("+++"))
        .map(|l| l[1..].to_string())
        .collect()
}

#[derive(Clone, Copy)]
enum Save {
    /// Write a temporary file and rename it over the page (most editors).
    Rename,
    /// Open the page, then truncate it and write in place. The open comes 15 ms before
    /// the write (a slow editor, or a large page), so that a write's swap often falls
    /// between them and the save lands in the file the swap replaced, after the write.
    InPlace,
}

/// An editor that, every 10 ms, reads the page, adds a line and saves it, until told
/// to stop (and it saved 25 times). Returns the lines it saved.
fn editor(root: &Path, save: Save, stop: Arc<AtomicBool>) -> Vec<String> {
    let page = root.join(PAGE);
    let temp = root.join("wiki/.race.md.swp");
    let mut saved = Vec::new();
    let mut n = 0;
    // At least 25 saves, however fast the agents are done.
    while !stop.load(Ordering::Acquire) || saved.len() < 25 {
        let Ok(mut text) = std::fs::read_to_string(&page) else {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        if !text.ends_with('\n') {
            text.push('\n');
        }
        let line = format!("editor save e{n}z");
        text.push_str(&line);
        text.push('\n');
        match save {
            Save::Rename => {
                std::fs::write(&temp, &text).expect("editor temp");
                std::fs::rename(&temp, &page).expect("editor rename");
            }
            Save::InPlace => {
                use std::io::Write as _;
                let Ok(mut file) = std::fs::OpenOptions::new().write(true).open(&page) else {
                    continue;
                };
                std::thread::sleep(Duration::from_millis(15));
                file.set_len(0).expect("editor truncate");
                file.write_all(text.as_bytes()).expect("editor write");
            }
        }
        saved.push(line);
        n += 1;
        std::thread::sleep(Duration::from_millis(10));
    }
    saved
}

fn history_entries(result: &Value) -> Vec<Value> {
    result["structuredContent"]["entries"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// `faults`: `off:exchange` swaps pages in as on a file system without an atomic
/// exchange (network and FUSE file systems).
async fn editor_against_agents(save: Save, faults: Option<&str>) -> anyhow::Result<()> {
    let env = faults.map_or_else(Env::new, Env::with_faults);
    let root = env.workspace_dir("lab");
    let client = lab_with_the_page(&env).await?;

    let stop = Arc::new(AtomicBool::new(false));
    let editor_root = root.clone();
    let editor_stop = Arc::clone(&stop);
    let editor = std::thread::spawn(move || editor(&editor_root, save, editor_stop));

    // One agent appends; another appends a slot and then str_replaces it.
    let appender = env.client(Some("lab")).await?;
    let appends = tokio::spawn(async move {
        let mut outcomes = Vec::new();
        for n in 0..60 {
            let line = format!("agent append a{n}x");
            let result = call(
                &appender,
                "write",
                json!({"command": "append", "path": PAGE, "content": line}),
            )
            .await?;
            outcomes.push((line, error_code(&result).map(str::to_string)));
        }
        appender.cancel().await?;
        anyhow::Ok(outcomes)
    });
    let replacer = env.client(Some("lab")).await?;
    let replaces = tokio::spawn(async move {
        let mut outcomes = Vec::new();
        for n in 0..30 {
            let slot = format!("agent slot b{n}q");
            let result = call(
                &replacer,
                "write",
                json!({"command": "append", "path": PAGE, "content": slot}),
            )
            .await?;
            outcomes.push((slot.clone(), error_code(&result).map(str::to_string)));
            if error_code(&result).is_some() {
                continue;
            }
            let filled = format!("agent filled b{n}q");
            let result = call(
                &replacer,
                "write",
                json!({"command": "str_replace", "path": PAGE, "old_str": slot, "new_str": filled}),
            )
            .await?;
            outcomes.push((filled, error_code(&result).map(str::to_string)));
        }
        replacer.cancel().await?;
        anyhow::Ok(outcomes)
    });
    let mut outcomes = appends.await??;
    outcomes.extend(replaces.await??);
    stop.store(true, Ordering::Release);
    let saved = editor.join().expect("editor thread");

    // The editor's last saves reach git with the next write.
    let last = call(
        &client,
        "write",
        json!({"command": "append", "path": PAGE, "content": "agent last line"}),
    )
    .await?;
    assert!(error_code(&last).is_none(), "{last}");

    let mut errors: HashMap<String, usize> = HashMap::new();
    for (_, code) in &outcomes {
        if let Some(code) = code {
            *errors.entry(code.clone()).or_default() += 1;
        }
    }
    assert_eq!(errors.get("internal"), None, "internal errors: {errors:?}");
    let acknowledged: Vec<&String> = outcomes
        .iter()
        .filter(|(_, code)| code.is_none())
        .map(|(line, _)| line)
        .collect();
    assert!(acknowledged.len() > 20, "too few acknowledged: {errors:?}");
    assert!(
        saved.len() > 20,
        "the editor saved only {} times",
        saved.len()
    );

    // A save into a file a write replaced is found within a few seconds after it.
    let mut in_git = added_lines(&root, PAGE);
    wait_until(Duration::from_secs(10), || {
        in_git = added_lines(&root, PAGE);
        saved.iter().all(|l| in_git.contains(l))
    });
    let lost_saves: Vec<&String> = saved.iter().filter(|l| !in_git.contains(*l)).collect();
    assert!(
        lost_saves.is_empty(),
        "{} of {} editor saves are not in git: {lost_saves:?}",
        lost_saves.len(),
        saved.len()
    );
    let lost_writes: Vec<&&String> = acknowledged
        .iter()
        .filter(|l| !in_git.contains(**l))
        .collect();
    assert!(
        lost_writes.is_empty(),
        "{} acknowledged agent lines are not in git: {lost_writes:?}",
        lost_writes.len()
    );

    // Every acknowledged line gone from the page is explained: an outside edit in
    // history names a commit whose page still holds it.
    let final_text = std::fs::read_to_string(root.join(PAGE))?;
    // Every outside edit (a loaded machine gives the editor hundreds of saves).
    let mut entries = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut arguments = json!({"path": PAGE, "limit": 500, "op": "outside_edit"});
        if let Some(cursor) = &cursor {
            arguments["cursor"] = json!(cursor);
        }
        let history = call(&client, "history", arguments).await?;
        entries.extend(history_entries(&history));
        match history["structuredContent"]["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => break,
        }
    }
    let mut before: Vec<String> = Vec::new();
    let late = entries
        .iter()
        .filter(|e| {
            e["summary"]
                .as_str()
                .is_some_and(|s| s.contains("after that write"))
        })
        .count();
    for entry in &entries {
        if let Some(commit) = entry["previous_commit"].as_str() {
            before.push(git(&root, &["show", &format!("{commit}:{PAGE}")]));
        }
    }
    let mut unexplained = Vec::new();
    for line in &acknowledged {
        // A filled slot replaced its slot line: the slot is meant to be gone.
        let filled = line.replace("agent slot", "agent filled");
        if line.starts_with("agent slot") && acknowledged.iter().any(|l| **l == filled) {
            continue;
        }
        if !final_text.contains(line.as_str()) && !before.iter().any(|t| t.contains(line.as_str()))
        {
            unexplained.push(line.to_string());
        }
    }
    assert!(
        unexplained.is_empty(),
        "{} removed agent lines with no outside edit in history that names them: {unexplained:?}",
        unexplained.len()
    );
    eprintln!(
        "editor: {} saves ({late} found after the write in the file it replaced); agents: {} acknowledged, errors {errors:?}; {} lines gone from the page, all explained",
        saved.len(),
        acknowledged.len(),
        acknowledged
            .iter()
            .filter(|l| !final_text.contains(l.as_str()))
            .count()
    );
    git(&root, &["fsck", "--no-progress"]);
    client.cancel().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_editor_saving_by_rename_while_agents_write_loses_nothing() -> anyhow::Result<()> {
    editor_against_agents(Save::Rename, None).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_editor_saving_in_place_while_agents_write_loses_nothing() -> anyhow::Result<()> {
    editor_against_agents(Save::InPlace, None).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_atomic_exchange_an_editor_saving_by_rename_loses_nothing() -> anyhow::Result<()>
{
    editor_against_agents(Save::Rename, Some("off:exchange")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_atomic_exchange_an_editor_saving_in_place_loses_nothing() -> anyhow::Result<()>
{
    editor_against_agents(Save::InPlace, Some("off:exchange")).await
}

/// A daemon killed right after its swap replaced an editor's save (before it could
/// commit that version): started again, it commits the save as an outside edit whose
/// history entry names the commit before it; no acknowledged write is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_right_after_the_swap_keeps_the_editors_save() -> anyhow::Result<()> {
    let env = Env::new();
    let root = env.workspace_dir("lab");
    let client = lab_with_the_page(&env).await?;
    let acknowledged: Vec<String> = (0..3).map(|n| format!("acknowledged k{n}")).collect();
    for line in &acknowledged {
        let result = call(
            &client,
            "write",
            json!({"command": "append", "path": PAGE, "content": line}),
        )
        .await?;
        assert!(error_code(&result).is_none(), "{result}");
    }
    client.cancel().await?;
    env.ok(&["daemon", "stop"]);

    // The next daemon waits 3 s between planning a write and swapping it in, and dies
    // right after the swap.
    let crashing = env.same_home_with_faults("delay:swap:3000,crash:after_swap");
    let client = crashing.client(Some("lab")).await?;
    let write = tokio::spawn(async move {
        let result = call(
            &client,
            "write",
            json!({"command": "append", "path": PAGE, "content": "agent line never acknowledged"}),
        )
        .await;
        drop(client);
        result
    });
    let runs = root.join("runs");
    let prepared = wait_until(Duration::from_secs(20), || {
        std::fs::read_dir(&runs).is_ok_and(|entries| {
            entries
                .flatten()
                .any(|e| e.path().join("prepared.json").exists())
        })
    });
    assert!(prepared, "the write was never prepared");
    // The editor saves now, between the plan and the swap (by rename, as most do).
    let page = root.join(PAGE);
    let mut text = std::fs::read_to_string(&page)?;
    text.push_str("editor save swapped out by the crashed write\n");
    std::fs::write(root.join("wiki/.race.md.swp"), &text)?;
    std::fs::rename(root.join("wiki/.race.md.swp"), &page)?;
    let result = write.await?;
    assert!(
        result.is_err(),
        "the write must not be acknowledged: {result:?}"
    );
    assert!(wait_until(Duration::from_secs(10), || {
        crashing
            .daemon_pid()
            .is_none_or(|p| !alexandria_tests::process_alive(p))
    }));

    // Started again without faults: recovery runs before serving.
    let client = env.client(Some("lab")).await?;
    let in_git = added_lines(&root, PAGE);
    assert!(
        in_git.contains("editor save swapped out by the crashed write"),
        "the editor's save is not in git"
    );
    let final_text = std::fs::read_to_string(&page)?;
    assert!(
        final_text.contains("editor save swapped out by the crashed write"),
        "the editor's save is not on the page: {final_text}"
    );
    for line in &acknowledged {
        assert!(in_git.contains(line), "{line} is not in git");
        assert!(
            final_text.contains(line.as_str()),
            "{line} is not on the page"
        );
    }
    let history = call(
        &client,
        "history",
        json!({"path": PAGE, "limit": 50, "op": "outside_edit"}),
    )
    .await?;
    let explained = history_entries(&history).iter().any(|entry| {
        let (Some(commit), Some(previous)) =
            (entry["commit"].as_str(), entry["previous_commit"].as_str())
        else {
            return false;
        };
        git(&root, &["show", &format!("{commit}:{PAGE}")])
            .contains("editor save swapped out by the crashed write")
            && git(&root, &["show", &format!("{previous}:{PAGE}")]).contains("acknowledged k2")
    });
    assert!(
        explained,
        "no outside edit in history holds the editor's save: {history}"
    );
    assert_eq!(runs_left_after_the_grace(&runs).await?, 0, "runs left");
    git(&root, &["fsck", "--no-progress"]);
    client.cancel().await?;
    drop(crashing);
    Ok(())
}

/// An editor that opened the page before an agent's write and saves into that file in
/// place after the write was acknowledged: its save lands in the file the write
/// replaced. A daemon killed before it noticed (its watcher is slowed down here) finds
/// the save when it starts again: committed as an outside edit whose history entry
/// names the commit that holds the agent's line, and put in place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_save_into_a_replaced_file_survives_a_crash_after_the_write() -> anyhow::Result<()> {
    let env = Env::with_faults("delay:late:60000");
    let root = env.workspace_dir("lab");
    let page = root.join(PAGE);
    let (client, held, editor_text) = page_held_open_across_a_write(&env).await?;
    // Now the editor saves in place, into the file it holds: no longer the page.
    save_in_place(held, &editor_text)?;
    assert!(
        !std::fs::read_to_string(&page)?.contains("editor save"),
        "the save went into the replaced file, not the page"
    );
    client.cancel().await?;
    env.kill_daemon();

    // Started again (without the slowed watcher): recovery commits the late save.
    let restarted = without_faults(&env);
    let client = restarted.client(Some("lab")).await?;
    late_save_kept(&root)?;
    let history = call(
        &client,
        "history",
        json!({"path": PAGE, "limit": 50, "op": "outside_edit"}),
    )
    .await?;
    let explained = history_entries(&history).iter().any(|entry| {
        entry["summary"]
            .as_str()
            .is_some_and(|s| s.contains("after that write"))
            && entry["previous_commit"].as_str().is_some_and(|previous| {
                git(&root, &["show", &format!("{previous}:{PAGE}")])
                    .contains("agent line acknowledged")
            })
    });
    assert!(
        explained,
        "no outside edit in history explains the agent line's removal: {history}"
    );
    assert_eq!(
        runs_left_after_the_grace(&root.join("runs")).await?,
        0,
        "runs left after recovery and the grace period"
    );
    git(&root, &["fsck", "--no-progress"]);
    client.cancel().await?;
    Ok(())
}

/// The same late save, but the daemon dies inside the commit of it: the watcher
/// found it and wrote its blob to git, not yet its commit. That blob is in git's
/// object store, unreachable, and the save is nowhere else but the kept file:
/// recovery commits it all the same (it took any blob in the object store for a
/// committed one and let the save go: 1 run in 40 of the kill loop with an editor).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_save_whose_commit_a_kill_cut_short_is_kept() -> anyhow::Result<()> {
    let env = Env::with_faults("crash:late.commit_objects");
    let root = env.workspace_dir("lab");
    let (client, held, editor_text) = page_held_open_across_a_write(&env).await?;
    let daemon = env.daemon_pid();
    save_in_place(held, &editor_text)?;
    // The watcher finds the save and dies inside its commit.
    let deadline = Instant::now() + Duration::from_secs(10);
    while daemon.is_some() && env.daemon_pid() == daemon && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_ne!(
        env.daemon_pid(),
        daemon,
        "the daemon did not die committing the late save"
    );
    let _ = client.cancel().await;
    // What the kill left: the save's blob in git's object store, in no commit.
    let saved = env.dir.path().join("saved");
    std::fs::write(&saved, &editor_text)?;
    let blob = git(&root, &["hash-object", &saved.to_string_lossy()]);
    git(&root, &["cat-file", "-e", blob.trim()]);
    assert!(
        !added_lines(&root, PAGE).contains("editor save into the file it had open"),
        "the save was committed before the kill"
    );
    let restarted = without_faults(&env);
    let client = restarted.client(Some("lab")).await?;
    late_save_kept(&root)?;
    git(&root, &["fsck", "--no-progress"]);
    client.cancel().await?;
    Ok(())
}

/// After the restart: the editor's late save and the agent's line are in git, and the
/// save is on the page (`page_held_open_across_a_write`'s texts).
fn late_save_kept(root: &Path) -> anyhow::Result<()> {
    let in_git = added_lines(root, PAGE);
    assert!(
        in_git.contains("editor save into the file it had open"),
        "the editor's late save is not in git after the restart"
    );
    assert!(in_git.contains("agent line acknowledged"));
    let final_text = std::fs::read_to_string(root.join(PAGE))?;
    assert!(
        final_text.contains("editor save into the file it had open"),
        "the late save is not on the page: {final_text}"
    );
    Ok(())
}

/// A workspace `lab` with the page created, held open by an editor that read it,
/// then replaced by an agent's acknowledged append. Returns the client, the editor's
/// file and the text it will save (what it read and a line of its own).
async fn page_held_open_across_a_write(
    env: &Env,
) -> anyhow::Result<(
    rmcp::service::RunningService<rmcp::RoleClient, ()>,
    std::fs::File,
    String,
)> {
    let page = env.workspace_dir("lab").join(PAGE);
    let client = lab_with_the_page(env).await?;
    // The editor opens the page and reads it; the agent's write replaces the page.
    let held = std::fs::OpenOptions::new().write(true).open(&page)?;
    let editor_text = format!(
        "{}editor save into the file it had open\n",
        std::fs::read_to_string(&page)?
    );
    let appended = call(
        &client,
        "write",
        json!({"command": "append", "path": PAGE, "content": "agent line acknowledged"}),
    )
    .await?;
    assert!(error_code(&appended).is_none(), "{appended}");
    Ok((client, held, editor_text))
}

/// How many run directories `runs` holds once they are gone or 10 s passed: after a
/// restart, the files the runs replaced are watched for the grace period (3 s) before
/// their kept directories go.
async fn runs_left_after_the_grace(runs: &Path) -> std::io::Result<usize> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = std::fs::read_dir(runs)?.count();
        if left == 0 || Instant::now() >= deadline {
            return Ok(left);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `init`, the workspace `lab`, a client bound to it and the page `PAGE` created.
async fn lab_with_the_page(
    env: &Env,
) -> anyhow::Result<rmcp::service::RunningService<rmcp::RoleClient, ()>> {
    env.ok(&["init"]);
    env.ok(&["workspace", "create", "lab"]);
    let client = env.client(Some("lab")).await?;
    let created = call(
        &client,
        "write",
        json!({"command": "create", "path": PAGE, "content": "# Race\n"}),
    )
    .await?;
    assert!(error_code(&created).is_none(), "{created}");
    Ok(client)
}

/// The same home, for a daemon started again without the faults `env` had.
fn without_faults(env: &Env) -> Env {
    Env {
        dir: alexandria_tests::short_tempdir(),
        home: env.home.clone(),
        faults: None,
        vars: Vec::new(),
    }
}

/// The editor's save in place: truncate the file it holds and write its text.
fn save_in_place(mut held: std::fs::File, text: &str) -> std::io::Result<()> {
    use std::io::{Seek, Write};
    held.set_len(0)?;
    held.rewind()?;
    held.write_all(text.as_bytes())?;
    held.sync_all()
}

/// The same editor, but the daemon is killed right after the write and the editor
/// saves only once it has started again and recovered: the replaced file is watched
/// after recovery as it would have been, so the save is committed (recovery used to
/// remove the file's last name at once, and the save went into a deleted file).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_save_into_a_replaced_file_after_a_restart_is_kept() -> anyhow::Result<()> {
    let env = Env::with_faults("delay:late:60000");
    let root = env.workspace_dir("lab");
    let (client, held, editor_text) = page_held_open_across_a_write(&env).await?;
    client.cancel().await?;
    env.kill_daemon();
    let restarted = without_faults(&env);
    let client = restarted.client(Some("lab")).await?;
    // Recovered and serving; only now does the editor save.
    assert!(!added_lines(&root, PAGE).contains("editor save into the file it had open"));
    save_in_place(held, &editor_text)?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut in_git = added_lines(&root, PAGE);
    while !in_git.contains("editor save into the file it had open") && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        in_git = added_lines(&root, PAGE);
    }
    assert!(
        in_git.contains("editor save into the file it had open"),
        "the editor's save after the restart is not in git"
    );
    assert!(in_git.contains("agent line acknowledged"));
    assert!(
        std::fs::read_to_string(root.join(PAGE))?.contains("editor save into the file it had open"),
        "the late save is not on the page"
    );
    git(&root, &["fsck", "--no-progress"]);
    client.cancel().await?;
    Ok(())
}

/// The editor and the kill loop at once: two agents append to three pages while an
/// editor saves one of them (by rename and in place, in turns) every 10 ms, and the
/// daemon is killed with SIGKILL at a random moment, round after round. Afterwards
/// every acknowledged agent line and every line the editor saved is in git
/// (`ALEXANDRIA_KILL_ROUNDS` sets the number of rounds; 4 by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_kills_while_an_editor_saves_lose_no_line() -> anyhow::Result<()> {
    use std::io::Write as _;
    let rounds: usize = std::env::var("ALEXANDRIA_KILL_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let env = Env::new();
    env.ok(&["init"]);
    env.ok(&["workspace", "create", "lab"]);
    let root = env.workspace_dir("lab");
    let pages: Vec<String> = (0..3).map(|n| format!("wiki/shared{n}.md")).collect();
    let client = env.client(Some("lab")).await?;
    for page in &pages {
        let created = call(
            &client,
            "write",
            json!({"command": "create", "path": page, "content": format!("# {page}\n")}),
        )
        .await?;
        assert!(error_code(&created).is_none(), "{created}");
    }
    client.cancel().await?;
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut acknowledged: Vec<(String, String)> = Vec::new();
    let mut saved: Vec<String> = Vec::new();
    for round in 0..rounds {
        let mut agents = Vec::new();
        for a in 0..2 {
            let client = loop {
                match env.client(Some("lab")).await {
                    Ok(client) => break client,
                    Err(error) => eprintln!("connecting after a kill failed ({error}); again"),
                }
            };
            let pages = pages.clone();
            let start = next();
            agents.push(tokio::spawn(async move {
                let mut done = Vec::new();
                for n in 0..1000u64 {
                    let page = &pages[((start + n) % 3) as usize];
                    let line = format!("agent r{round}a{a}n{n}z");
                    match call(
                        &client,
                        "write",
                        json!({"command": "append", "path": page, "content": line}),
                    )
                    .await
                    {
                        Ok(result) if error_code(&result).is_none() => {
                            done.push((page.clone(), line));
                        }
                        Ok(result) if error_code(&result) == Some("stale_plan") => {}
                        Ok(result) => panic!("{result}"),
                        Err(_) => break,
                    }
                }
                done
            }));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let editor = {
            let page = root.join(&pages[0]);
            let temp = root.join("wiki/.shared0.md.swp");
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut lines = Vec::new();
                let mut n = 0;
                while !stop.load(Ordering::Acquire) {
                    let Ok(mut text) = std::fs::read_to_string(&page) else {
                        continue;
                    };
                    if !text.ends_with('\n') {
                        text.push('\n');
                    }
                    let line = format!("editor r{round}e{n}z");
                    text.push_str(&line);
                    text.push('\n');
                    if n % 2 == 0 {
                        std::fs::write(&temp, &text).expect("editor temp");
                        std::fs::rename(&temp, &page).expect("editor rename");
                    } else {
                        let Ok(mut file) = std::fs::OpenOptions::new().write(true).open(&page)
                        else {
                            continue;
                        };
                        std::thread::sleep(Duration::from_millis(5));
                        file.set_len(0).expect("editor truncate");
                        file.write_all(text.as_bytes()).expect("editor write");
                    }
                    lines.push(line);
                    n += 1;
                    std::thread::sleep(Duration::from_millis(10));
                }
                lines
            })
        };
        tokio::time::sleep(Duration::from_millis(100 + next() % 400)).await;
        env.kill_daemon();
        for agent in agents {
            acknowledged.extend(agent.await?);
        }
        stop.store(true, Ordering::Release);
        saved.extend(editor.join().expect("editor thread"));
    }
    // Started again: recovery; then one more write per page commits what is on disk.
    let client = env.client(Some("lab")).await?;
    for page in &pages {
        let last = call(
            &client,
            "write",
            json!({"command": "append", "path": page, "content": "agent last line"}),
        )
        .await?;
        assert!(error_code(&last).is_none(), "{last}");
    }
    // Each page's history read once (once per line was thousands of `git log -p`).
    let in_git: std::collections::HashMap<&String, HashSet<String>> = pages
        .iter()
        .map(|page| (page, added_lines(&root, page)))
        .collect();
    let mut lost = Vec::new();
    for (page, line) in &acknowledged {
        if !in_git.get(page).is_some_and(|lines| lines.contains(line)) {
            lost.push(format!("{page}: {line}"));
        }
    }
    let edited = added_lines(&root, &pages[0]);
    let lost_saves: Vec<&String> = saved.iter().filter(|l| !edited.contains(*l)).collect();
    if !lost_saves.is_empty() || !lost.is_empty() {
        // What the daemons did about replaced files and recovery, for whoever looks.
        let mut log = String::new();
        for entry in std::fs::read_dir(env.home.join("logs"))?.flatten() {
            if entry.file_name().to_string_lossy().starts_with("daemon") {
                log.push_str(&std::fs::read_to_string(entry.path()).unwrap_or_default());
            }
        }
        let relevant: Vec<&str> = log
            .lines()
            .filter(|l| {
                [
                    "recover",
                    "late",
                    "replaced",
                    "outside",
                    "rolled",
                    "completed",
                    "interrupted",
                ]
                .iter()
                .any(|w| l.contains(w))
            })
            .collect();
        eprintln!(
            "daemon log (recovery, replaced files, outside saves):\n{}\nruns: {:?}",
            relevant.join("\n"),
            std::fs::read_dir(root.join("runs"))?
                .flatten()
                .map(|e| e.file_name())
                .collect::<Vec<_>>()
        );
    }
    // Where each lost save is left, if anywhere: a run's kept file, and whether git's
    // object store has its blob (unreachable) — what found the last loss of this kind.
    for save in &lost_saves {
        for entry in walkdir(&root.join("runs")) {
            let Ok(bytes) = std::fs::read(&entry) else {
                continue;
            };
            if String::from_utf8_lossy(&bytes).contains(save.as_str()) {
                let blob = git(&root, &["hash-object", &entry.to_string_lossy()]);
                let stored = Command::new("git")
                    .args(["cat-file", "-e", blob.trim()])
                    .current_dir(&root)
                    .status()
                    .is_ok_and(|s| s.success());
                eprintln!(
                    "{save} is in {} (blob {}, in git's object store: {stored})",
                    entry.display(),
                    blob.trim()
                );
            }
        }
    }
    eprintln!(
        "kills while editing: {rounds} kills, {} acknowledged agent lines, {} editor saves; {} lines and {} saves missing from git",
        acknowledged.len(),
        saved.len(),
        lost.len(),
        lost_saves.len()
    );
    assert!(acknowledged.len() > rounds, "too few acknowledged writes");
    assert!(lost.is_empty(), "acknowledged lines not in git: {lost:?}");
    assert!(
        lost_saves.is_empty(),
        "editor saves not in git: {lost_saves:?}"
    );
    git(&root, &["fsck", "--no-progress"]);
    client.cancel().await?;
    Ok(())
}

/// A write that fails after its swap (here: committing the editor's save it found in
/// place fails) is rolled back, and the roll back puts the editor's save back on the
/// page, not HEAD's older version: it was in neither git nor any file but the run's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_failing_after_its_swap_puts_the_editors_save_back() -> anyhow::Result<()> {
    let env = Env::new();
    let root = env.workspace_dir("lab");
    let page = root.join(PAGE);
    let client = lab_with_the_page(&env).await?;
    client.cancel().await?;
    env.ok(&["daemon", "stop"]);

    let failing = env.same_home_with_faults("delay:swap:2000,fail:commit_outside");
    let client = failing.client(Some("lab")).await?;
    let write = tokio::spawn(async move {
        let result = call(
            &client,
            "write",
            json!({"command": "append", "path": PAGE, "content": "agent line that fails"}),
        )
        .await;
        let _ = client.cancel().await;
        result
    });
    let runs = root.join("runs");
    assert!(
        wait_until(Duration::from_secs(20), || {
            std::fs::read_dir(&runs).is_ok_and(|entries| {
                entries
                    .flatten()
                    .any(|e| e.path().join("prepared.json").exists())
            })
        }),
        "the write was never prepared"
    );
    // The editor saves between the plan and the swap.
    std::fs::write(
        root.join("wiki/.race.md.swp"),
        "# Race\neditor save the roll back must keep\n",
    )?;
    std::fs::rename(root.join("wiki/.race.md.swp"), &page)?;
    let result = write.await??;
    assert!(
        error_code(&result).is_some(),
        "the write cannot succeed: {result}"
    );
    assert_eq!(
        std::fs::read_to_string(&page)?,
        "# Race\neditor save the roll back must keep\n",
        "the roll back did not put the editor's save back"
    );
    failing.ok(&["daemon", "stop"]);

    // Without the fault, the next write commits the save first.
    let client = env.client(Some("lab")).await?;
    let next = call(
        &client,
        "write",
        json!({"command": "append", "path": PAGE, "content": "agent line after"}),
    )
    .await?;
    assert!(error_code(&next).is_none(), "{next}");
    let in_git = added_lines(&root, PAGE);
    assert!(in_git.contains("editor save the roll back must keep"));
    assert!(std::fs::read_to_string(&page)?.contains("editor save the roll back must keep"));
    client.cancel().await?;
    Ok(())
}
