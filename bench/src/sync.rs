//! `alexandria-bench --sync <BACKLOG>`: workspaces syncing through a git remote
//! (issue 12). Two homes play two machines around a bare repository (`file://`):
//! A pushes a generated corpus (first `alexandria sync`), B clones it (`alexandria
//! workspace clone`: clone, history from git, index), then the remote gets `BACKLOG`
//! commits (one new page each, written with `git fast-import`) while B makes one agent
//! write of its own, and B's `alexandria sync` is timed: fetch, a real merge (both sides
//! moved), the new pages indexed, their history recorded, the merge pushed. Every step
//! is checked (search finds the pages, the remote has B's write).

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use serde_json::json;

use crate::client::Mcp;
use crate::corpus;
use crate::procs::{Binaries, Home};
use crate::report::{Figure, Row};
use crate::run::{SLUG, size_label};
use crate::stats::format_duration;

/// Background sync off: every sync here is the one being timed.
const CONFIG: &str = "[sync]\ninterval_secs = 86400\nquiet_secs = 86400\ntimeout_secs = 3600\n";

fn home(binaries: &Binaries) -> Result<Home> {
    let home = Home::new(binaries)?;
    std::fs::create_dir_all(&home.root)?;
    std::fs::write(home.root.join("config.toml"), CONFIG)?;
    home.cli(&["init"])?;
    Ok(home)
}

/// Rows for a corpus of `pages` pages and a backlog of `backlog` commits.
pub fn run(binaries: &Binaries, seed: u64, pages: usize, backlog: usize) -> Result<Vec<Row>> {
    let label = size_label(pages);
    let mut a = home(binaries)?;
    a.cli(&["workspace", "create", SLUG])?;
    a.stop_daemon()?;
    let workspace = a.workspace_dir(SLUG);
    eprintln!("[{label}] generating {pages} pages");
    let corpus = corpus::generate(seed, pages, &workspace)?;
    crate::rebuild::commit_corpus(&workspace)?;
    let remote = a.scratch().join("remote.git");
    std::fs::create_dir_all(a.scratch())?;
    git(
        &a.scratch(),
        &["init", "--bare", "-q", "-b", "main", "remote.git"],
        None,
    )?;
    let url = format!("file://{}", remote.display());
    a.start_daemon()?;
    a.cli(&["workspace", "remote", SLUG, &url])?;
    let started = Instant::now();
    a.cli(&["sync", SLUG])?;
    let first_push = started.elapsed();
    eprintln!(
        "[{label}] first sync (push) {}",
        format_duration(first_push)
    );

    let mut b = home(binaries)?;
    // Baseline: git alone (clone, no index, no history).
    let plain = b.scratch().join("plain");
    std::fs::create_dir_all(b.scratch())?;
    let started = Instant::now();
    git(
        &b.scratch(),
        &["clone", "-q", "--no-tags", &url, "plain"],
        None,
    )?;
    let plain_clone = started.elapsed();
    let started = Instant::now();
    b.cli(&["workspace", "clone", &url, SLUG])?;
    let clone = started.elapsed();
    eprintln!("[{label}] clone {}", format_duration(clone));
    let marker = corpus
        .markers
        .iter()
        .filter(|m| m.pages <= 1000)
        .max_by_key(|m| m.pages)
        .ok_or_else(|| anyhow!("the corpus has no marker word"))?;
    let mut direct = b.direct(SLUG)?;
    let hits = search_hits(&mut direct, &marker.word)?;
    if hits != marker.pages {
        bail!(
            "after the clone, search found {hits} pages with {}, expected {}",
            marker.word,
            marker.pages
        );
    }

    eprintln!("[{label}] {backlog} commits on the remote, one write on B");
    fast_import(&remote, backlog)?;
    let result = direct.call_tool(
        "write",
        json!({"command": "create", "path": "wiki/from-b.md",
               "content": "# From B\n\nwritten on B while the remote moved on\n"}),
    )?;
    if result["isError"] == true {
        bail!("the write on B failed: {result}");
    }
    // Baseline: git alone on a plain clone with one local commit (pull = fetch + merge).
    std::fs::write(plain.join("wiki/from-plain.md"), "# Plain\n")?;
    git(&plain, &["add", "wiki/from-plain.md"], None)?;
    git(&plain, &["commit", "-q", "-m", "local"], None)?;
    let started = Instant::now();
    git(
        &plain,
        &["pull", "-q", "--no-rebase", "--no-edit", "origin", "main"],
        None,
    )?;
    let plain_pull = started.elapsed();
    let started = Instant::now();
    b.cli(&["sync", SLUG])?;
    let backlog_sync = started.elapsed();
    eprintln!(
        "[{label}] sync of the backlog {}",
        format_duration(backlog_sync)
    );
    let found = direct.call_tool("search", json!({"query": "backlogmarker", "limit": 5}))?;
    if found["structuredContent"]["hits"]
        .as_array()
        .is_none_or(Vec::is_empty)
    {
        bail!("after the sync, search finds no backlog page: {found}");
    }
    let on_remote = git(&remote, &["ls-tree", "-r", "--name-only", "main"], None)?;
    if !on_remote.contains("wiki/from-b.md") {
        bail!("B's write did not reach the remote");
    }
    drop(direct);
    a.stop_daemon()?;
    b.stop_daemon()?;
    let note = format!("{pages} pages, file:// remote, debug or release as built");
    Ok(vec![
        Row::new(
            "sync: first push of the workspace",
            &label,
            "CLI",
            Figure::Once(first_push),
        )
        .note(note.clone()),
        Row::new(
            "sync: workspace clone (clone, history, index)",
            &label,
            "CLI",
            Figure::Once(clone),
        )
        .floor("git clone", plain_clone)
        .note(note.clone()),
        Row::new(
            &format!("sync: {backlog}-commit backlog + 1 local write (fetch, merge, index, history, push)"),
            &label,
            "CLI",
            Figure::Once(backlog_sync),
        )
        .floor("git pull (no push, no index)", plain_pull)
        .note(note),
    ])
}

/// `backlog` commits on `main` of the bare repository, one new page each.
fn fast_import(remote: &Path, backlog: usize) -> Result<()> {
    let mut stream = String::new();
    for n in 0..backlog {
        let page = format!("# Backlog {n}\n\nbacklogmarker page {n} written on another machine\n");
        let message = format!("backlog {n}\n");
        stream.push_str("commit refs/heads/main\n");
        stream.push_str(&format!(
            "committer other <other@localhost> {} +0000\n",
            1_764_000_000 + n
        ));
        stream.push_str(&format!("data {}\n{message}", message.len()));
        if n == 0 {
            stream.push_str("from refs/heads/main^0\n");
        }
        stream.push_str(&format!("M 100644 inline wiki/backlog/n{n}.md\n"));
        stream.push_str(&format!("data {}\n{page}\n", page.len()));
    }
    git(remote, &["fast-import", "--quiet"], Some(stream.as_bytes()))?;
    Ok(())
}

fn search_hits(client: &mut dyn Mcp, word: &str) -> Result<usize> {
    let result = client.call_tool("search", json!({"query": word, "limit": 1000}))?;
    result["structuredContent"]["hits"]
        .as_array()
        .map(Vec::len)
        .ok_or_else(|| anyhow!("search returned no hits array: {result}"))
}

fn git(dir: &Path, args: &[&str], input: Option<&[u8]>) -> Result<String> {
    let mut child = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", "bench")
        .env("GIT_AUTHOR_EMAIL", "bench@localhost")
        .env("GIT_COMMITTER_NAME", "bench")
        .env("GIT_COMMITTER_EMAIL", "bench@localhost")
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot run git")?;
    if let (Some(bytes), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin.write_all(bytes).context("writing to git")?;
    }
    let output = child.wait_with_output().context("waiting for git")?;
    if !output.status.success() {
        bail!(
            "git {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}
