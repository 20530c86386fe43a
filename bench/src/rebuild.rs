//! `alexandria-bench --rebuild`: how long the daemon takes to rebuild `state.db` from
//! the workspace (issue 18). A generated corpus committed in one commit (by hand, so its
//! pages come back as outside entries) plus agent writes through the daemon; then the
//! daemon is restarted three ways: state.db sound (the baseline), deleted, and
//! overwritten with random bytes. Each restart is timed from spawn to the ready notice,
//! to the first `guide` answer (history is back: guide waits for the import from git,
//! not for the index), and to the first `search` answer (search waits for the index).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use serde_json::json;

use crate::client::Mcp;
use crate::corpus;
use crate::procs::{Binaries, Home};
use crate::report::{Figure, Row};
use crate::run::{SLUG, size_label};
use crate::stats::format_duration;

/// How `state.db` is treated before a timed restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Damage {
    None,
    Deleted,
    RandomBytes,
}

impl Damage {
    fn label(self) -> &'static str {
        match self {
            Damage::None => "state.db sound",
            Damage::Deleted => "state.db deleted",
            Damage::RandomBytes => "state.db overwritten with random bytes",
        }
    }
}

/// Rows for one corpus of `pages` pages and `writes` agent writes.
pub fn run(binaries: &Binaries, seed: u64, pages: usize, writes: usize) -> Result<Vec<Row>> {
    let label = size_label(pages);
    let mut home = Home::new(binaries)?;
    home.cli(&["init"])?;
    home.cli(&["workspace", "create", SLUG])?;
    home.stop_daemon()?;
    let workspace = home.workspace_dir(SLUG);
    eprintln!("[{label}] generating {pages} pages");
    let corpus = corpus::generate(seed, pages, &workspace)?;
    commit_corpus(&workspace)?;
    let marker = corpus
        .markers
        .iter()
        .filter(|m| m.pages <= 1000)
        .max_by_key(|m| m.pages)
        .ok_or_else(|| anyhow!("the corpus has no marker word"))?;
    let (marker_word, marker_pages) = (marker.word.clone(), marker.pages);

    eprintln!("[{label}] cold index, then {writes} agent writes");
    home.start_daemon()?;
    let mut direct = home.direct(SLUG)?;
    search_hits(&mut direct, &marker_word)?;
    let mut last_run = String::new();
    for n in 0..writes {
        let result = direct.call_tool(
            "write",
            json!({"command": "create", "path": format!("wiki/rebuild/n{n}.md"),
                   "content": format!("# Note {n}\n\nwritten by the rebuild benchmark\n")}),
        )?;
        if result["isError"] == true {
            bail!("write {n} failed: {result}");
        }
        last_run = result["structuredContent"]["run_id"]
            .as_str()
            .unwrap_or_default()
            .to_string();
    }
    drop(direct);
    home.stop_daemon()?;
    let commits = git_output(&workspace, &["rev-list", "--count", "HEAD"])?;

    let mut rows = Vec::new();
    let mut baseline = None;
    for damage in [Damage::None, Damage::Deleted, Damage::RandomBytes] {
        let state_db = home.root.join("state.db");
        match damage {
            Damage::None => {}
            Damage::Deleted => {
                for suffix in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{}{suffix}", state_db.display()));
                }
            }
            Damage::RandomBytes => {
                let mut state = seed | 1;
                let noise: Vec<u8> = (0..4096)
                    .map(|_| {
                        state ^= state << 13;
                        state ^= state >> 7;
                        state ^= state << 17;
                        (state >> 24) as u8
                    })
                    .collect();
                std::fs::write(&state_db, noise).context("cannot overwrite state.db")?;
            }
        }
        eprintln!("[{label}] restart, {}", damage.label());
        let started = Instant::now();
        let ready = home.start_daemon()?;
        let mut direct = home.direct(SLUG)?;
        direct.call_tool("guide", json!({}))?;
        let history_back = started.elapsed();
        let hits = search_hits(&mut direct, &marker_word)?;
        let index_back = started.elapsed();
        if hits != marker_pages {
            bail!(
                "{}: search found {hits} pages with {marker_word}, expected {marker_pages}",
                damage.label(),
            );
        }
        let history = direct.call_tool("history", json!({"run_id": last_run}))?;
        let found = history["structuredContent"]["entries"]
            .as_array()
            .map_or(0, Vec::len);
        if found != 1 {
            bail!(
                "{}: history has {found} entries for the last write {last_run}",
                damage.label()
            );
        }
        let status = home.status()?;
        let check = Duration::from_millis(status["state_db"]["check_ms"].as_u64().unwrap_or(0));
        let db_bytes = std::fs::metadata(&state_db).map(|m| m.len()).unwrap_or(0);
        let rebuilt = status["state_db"]["rebuilt"] == true;
        if rebuilt != (damage != Damage::None) {
            bail!(
                "{}: daemon status says {}",
                damage.label(),
                status["state_db"]
            );
        }
        drop(direct);
        home.stop_daemon()?;
        eprintln!(
            "[{label}] {}: ready {}, history {}, index {}",
            damage.label(),
            format_duration(ready),
            format_duration(history_back),
            format_duration(index_back)
        );
        rows.push(
            Row::new(
                &format!(
                    "restart, {}: open and check state.db (quick_check, schema; move aside)",
                    damage.label()
                ),
                &label,
                "-",
                Figure::Once(check),
            )
            .note(format!(
                "state.db {} MiB after the restart",
                db_bytes / (1024 * 1024)
            )),
        );
        let note = format!(
            "{pages} pages, {writes} agent writes, {} commits",
            commits.trim()
        );
        let mut add = |what: &str, value: Duration, floor: Option<Duration>| {
            let mut row = Row::new(
                &format!("restart, {}: spawn → {what}", damage.label()),
                &label,
                "socket",
                Figure::Once(value),
            )
            .note(note.clone());
            if let Some(floor) = floor {
                row = row.floor("sound restart", floor);
            }
            rows.push(row);
        };
        let floors = baseline.unwrap_or((ready, history_back, index_back));
        let floor = |value: Duration| (damage != Damage::None).then_some(value);
        add("ready notice", ready, floor(floors.0));
        add(
            "history back (first guide answer)",
            history_back,
            floor(floors.1),
        );
        add(
            "index back (first search answer)",
            index_back,
            floor(floors.2),
        );
        if damage == Damage::None {
            baseline = Some((ready, history_back, index_back));
        }
    }
    Ok(rows)
}

/// Number of hits of a search (which waits for the index to catch up).
fn search_hits(client: &mut dyn Mcp, word: &str) -> Result<usize> {
    let result = client.call_tool("search", json!({"query": word, "limit": 1000}))?;
    result["structuredContent"]["hits"]
        .as_array()
        .map(Vec::len)
        .ok_or_else(|| anyhow!("search returned no hits array: {result}"))
}

/// Commit the generated corpus and pack it, as the history of a long-lived wiki is, with
/// git's automatic gc held off. Left to itself, a commit of 100k loose objects starts
/// `git maintenance run --auto --detach`, whose `pack-objects` takes a core for tens of
/// seconds in the background, while the daemon's cold index is being measured: at 100k
/// pages that doubled the cold index (30 s against 15 s from a settled copy of the
/// same home). The `gc` here runs in the foreground, before any daemon starts.
pub(crate) fn commit_corpus(dir: &Path) -> Result<()> {
    const QUIET: [&str; 4] = ["-c", "gc.auto=0", "-c", "maintenance.auto=false"];
    git_output(dir, &["add", "-A"])?;
    git_output(
        dir,
        &[&QUIET[..], &["commit", "-q", "-m", "benchmark corpus"]].concat(),
    )?;
    git_output(dir, &[&QUIET[..], &["gc", "--quiet"]].concat())?;
    Ok(())
}

/// `git args` in `dir` with a fixed identity and no user/system config; its stdout.
pub(crate) fn git_output(dir: &Path, args: &[&str]) -> Result<String> {
    let output = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", "bench")
        .env("GIT_AUTHOR_EMAIL", "bench@localhost")
        .env("GIT_COMMITTER_NAME", "bench")
        .env("GIT_COMMITTER_EMAIL", "bench@localhost")
        .output()
        .context("cannot run git")?;
    if !output.status.success() {
        bail!(
            "git {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}
