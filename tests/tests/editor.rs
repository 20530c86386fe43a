//! End-to-end tests of an editor saving a page while agents write it (issue 20): no
//! `internal` errors, no editor save and no acknowledged agent line missing from git,
//! and history explains every acknowledged line the editor's saves removed.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use alexandria_tests::{Env, call, error_code};
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
    /// Truncate the page and write it in place.
    InPlace,
}

/// An editor that, every 10 ms, reads the page, adds a line and saves it, until told
/// to stop. Returns the lines it saved.
fn editor(root: &Path, save: Save, stop: Arc<AtomicBool>) -> Vec<String> {
    let page = root.join(PAGE);
    let temp = root.join("wiki/.race.md.swp");
    let mut saved = Vec::new();
    let mut n = 0;
    while !stop.load(Ordering::Acquire) {
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
            Save::InPlace => std::fs::write(&page, &text).expect("editor write"),
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

async fn editor_against_agents(save: Save) -> anyhow::Result<()> {
    let env = Env::new();
    env.ok(&["init"]);
    env.ok(&["workspace", "create", "lab"]);
    let root = env.workspace_dir("lab");
    let client = env.client(Some("lab")).await?;
    let created = call(
        &client,
        "write",
        json!({"command": "create", "path": PAGE, "content": "# Race\n"}),
    )
    .await?;
    assert!(error_code(&created).is_none(), "{created}");

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

    let in_git = added_lines(&root, PAGE);
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
    let history = call(
        &client,
        "history",
        json!({"path": PAGE, "limit": 500, "op": "outside_edit"}),
    )
    .await?;
    let mut before: Vec<String> = Vec::new();
    for entry in history_entries(&history) {
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
        "editor: {} saves; agents: {} acknowledged, errors {errors:?}; {} lines gone from the page, all explained",
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
    editor_against_agents(Save::Rename).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_editor_saving_in_place_while_agents_write_loses_nothing() -> anyhow::Result<()> {
    editor_against_agents(Save::InPlace).await
}
