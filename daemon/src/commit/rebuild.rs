//! History from git. `state.db` is a cache: when it holds no history for a workspace (a
//! new state.db after a damaged one was moved aside, or a workspace copied or cloned
//! into `workspaces/` by hand), the workspace is adopted: its `runs` and
//! `wiki_log_entries` are rebuilt from its commits, read through the commit message
//! contract (`workspace::message`). Agent commits give back their run, op, path, tool,
//! client and session; commits by anyone else give outside entries for the wiki paths
//! they change. Importing twice records nothing twice (runs are keyed by workspace and
//! run id, entries by workspace, commit and path).

use std::path::Path;
use std::sync::atomic::Ordering;

use rusqlite::params;

use crate::db::now_ms;
use crate::error::{ToolError, ToolResult};
use crate::workspace::Store;
use crate::workspace::message::{self, Parsed};

/// What an import found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Imported {
    pub commits: usize,
    pub agent_entries: usize,
    pub outside_entries: usize,
}

/// One history entry read from a commit.
pub(crate) struct Entry {
    ts: i64,
    commit: String,
    op: String,
    path: String,
    summary: String,
    agent: Option<message::AgentCommit>,
}

/// Make sure `slug`'s history is in `state.db`, importing it from git once if the
/// workspace is not known there yet. Cheap once done; concurrent callers wait for the
/// one import.
pub fn ensure_history(store: &Store, slug: &str) -> ToolResult<()> {
    let state = store.state(slug);
    if state.history_ready.load(Ordering::Acquire) {
        return Ok(());
    }
    let _importing = state
        .history_import
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if state.history_ready.load(Ordering::Acquire) {
        return Ok(());
    }
    if !known(store, slug)? {
        let started = std::time::Instant::now();
        let imported = import(store, slug)?;
        tracing::info!(
            workspace = slug,
            commits = imported.commits,
            agent = imported.agent_entries,
            outside = imported.outside_entries,
            ms = started.elapsed().as_millis() as u64,
            "history rebuilt from git"
        );
    }
    state.history_ready.store(true, Ordering::Release);
    Ok(())
}

/// Whether a workspace's repository is at rest, so that it can be adopted: not in the
/// middle of a `git clone` (HEAD not written yet, or the checkout still writing git's
/// index under `index.lock`). A lock older than a minute is taken as stale, and the
/// lock this daemon keeps between group commits (`git::index_held_since`) as ours:
/// under a steady stream of writes it is there nearly all the time, and the watch of
/// the workspace would never begin.
pub fn settled(root: &Path) -> bool {
    let git = root.join(".git");
    if crate::workspace::git::index_held_since(&git).is_none()
        && let Ok(metadata) = std::fs::metadata(git.join("index.lock"))
    {
        let age = metadata
            .modified()
            .ok()
            .and_then(|at| at.elapsed().ok())
            .unwrap_or_default();
        if age < std::time::Duration::from_secs(60) {
            return false;
        }
    }
    let Ok(repo) = git2::Repository::open(root) else {
        return false;
    };
    match repo.head() {
        Ok(_) => git.join("index").exists(),
        // Unborn, truly (no objects), or refs not copied yet.
        Err(error) if error.code() == git2::ErrorCode::UnbornBranch => {
            std::fs::read_dir(git.join("objects"))
                .into_iter()
                .flatten()
                .flatten()
                .all(|entry| matches!(entry.file_name().to_str(), Some("info" | "pack")))
        }
        Err(_) => false,
    }
}

/// Whether `state.db` records `slug` (so its history is there).
pub fn known(store: &Store, slug: &str) -> ToolResult<bool> {
    let count: i64 = store.pool.get()?.query_row(
        "SELECT count(*) FROM workspaces WHERE slug = ?1",
        params![slug],
        |row| row.get(0),
    )?;
    Ok(count > 0)
}

/// A summary of a workspace folder's shape (git's files and the layers' file count and
/// bytes): equal twice in a row, a folder being copied in by hand is done.
pub fn fingerprint(root: &Path) -> String {
    let mut parts = Vec::new();
    for dir in [
        root.to_path_buf(),
        root.join(".git"),
        root.join(".git/objects"),
        root.join(".git/objects/pack"),
        root.join(".git/refs/heads"),
    ] {
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|entry| {
                let len = entry.metadata().map(|m| m.len()).unwrap_or(0);
                format!("{}:{len}", entry.file_name().to_string_lossy())
            })
            .collect();
        names.sort();
        parts.push(names.join(","));
    }
    for layer in ["raw", "wiki"] {
        let (mut files, mut bytes) = (0u64, 0u64);
        for entry in walkdir::WalkDir::new(root.join(layer))
            .into_iter()
            .flatten()
        {
            if entry.file_type().is_file() {
                files += 1;
                bytes += entry.metadata().map(|m| m.len()).unwrap_or(0);
            }
        }
        parts.push(format!("{layer}:{files}:{bytes}"));
    }
    parts.join("|")
}

/// Adopt `slug`: read its history from git and record it, then record the workspace.
/// Nothing is written into the workspace (it may still be being copied).
pub fn import(store: &Store, slug: &str) -> ToolResult<Imported> {
    let root = store.workspace_dir(slug);
    let state = store.state(slug);
    // Writes commit and record under the index lock: holding it, every agent commit
    // in the walk is either fully recorded already (and ignored below) or not made yet.
    let _index = state.index_lock.lock().unwrap_or_else(|p| p.into_inner());
    let (entries, commits) = read_history(&root)
        .map_err(|e| ToolError::internal("reading the workspace's git history", e))?;
    let mut connection = store.pool.get()?;
    // Immediate: a rename or restore that records this workspace meanwhile (under
    // another lock) commits first, and then there is nothing to import.
    let transaction =
        connection.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let known: i64 = transaction.query_row(
        "SELECT count(*) FROM workspaces WHERE slug = ?1",
        params![slug],
        |row| row.get(0),
    )?;
    if known > 0 {
        return Ok(Imported::default());
    }
    let mut imported = record(&transaction, slug, &entries)?;
    imported.commits = commits;
    transaction.execute(
        "INSERT OR IGNORE INTO workspaces(slug, created_at) VALUES (?1, ?2)",
        params![slug, now_ms()],
    )?;
    transaction.commit()?;
    Ok(imported)
}

/// Record history entries read from commits (runs of agent commits, one entry per
/// commit and path); entries already recorded are skipped. Used by the import and by
/// sync (the commits a merge brought in).
pub(crate) fn record(
    transaction: &rusqlite::Transaction<'_>,
    slug: &str,
    entries: &[Entry],
) -> ToolResult<Imported> {
    let mut imported = Imported::default();
    let mut insert_run = transaction.prepare_cached(
        "INSERT OR IGNORE INTO runs(workspace, run_id, tool, client, session, state, started_at, finished_at, commit_id)
         VALUES (?1, ?2, ?3, ?4, ?5, 'committed', ?6, ?6, ?7)",
    )?;
    let mut insert_entry = transaction.prepare_cached(
        "INSERT OR IGNORE INTO wiki_log_entries(ts, workspace, run_id, op, path, summary, origin, commit_id)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?;
    for entry in entries {
        let (run_id, origin) = match &entry.agent {
            Some(agent) => {
                insert_run.execute(params![
                    slug,
                    agent.run_id,
                    agent.tool,
                    agent.client,
                    agent.session,
                    entry.ts,
                    entry.commit
                ])?;
                (Some(agent.run_id.as_str()), "agent")
            }
            None => (None, "outside"),
        };
        let added = insert_entry.execute(params![
            entry.ts,
            slug,
            run_id,
            entry.op,
            entry.path,
            entry.summary,
            origin,
            entry.commit
        ])?;
        if added > 0 {
            if entry.agent.is_some() {
                imported.agent_entries += 1;
            } else {
                imported.outside_entries += 1;
            }
        }
    }
    Ok(imported)
}

/// Every history entry of the commits reachable from HEAD, oldest first, and the
/// number of commits read. An unborn HEAD (an empty repository) has none.
fn read_history(root: &Path) -> Result<(Vec<Entry>, usize), git2::Error> {
    let repo = git2::Repository::open(root)?;
    let head = match repo.head() {
        Ok(head) => head.peel_to_commit()?.id(),
        Err(error) if error.code() == git2::ErrorCode::UnbornBranch => {
            return Ok((Vec::new(), 0));
        }
        Err(error) => return Err(error),
    };
    read_commits(&repo, head, None)
}

/// Every history entry of the commits reachable from `tip` but not from `hide`,
/// oldest first, and the number of commits read.
pub(crate) fn read_commits(
    repo: &git2::Repository,
    tip: git2::Oid,
    hide: Option<git2::Oid>,
) -> Result<(Vec<Entry>, usize), git2::Error> {
    let mut walk = repo.revwalk()?;
    walk.push(tip)?;
    if let Some(hide) = hide {
        walk.hide(hide)?;
    }
    walk.set_sorting(git2::Sort::TOPOLOGICAL | git2::Sort::REVERSE)?;
    let mut entries = Vec::new();
    let mut commits = 0;
    for oid in walk {
        let commit = repo.find_commit(oid?)?;
        commits += 1;
        let ts = commit.time().seconds() * 1000;
        let text = String::from_utf8_lossy(commit.message_bytes()).into_owned();
        match message::parse(&text) {
            Parsed::Agent(agent) => entries.push(Entry {
                ts,
                commit: commit.id().to_string(),
                op: agent.op.clone(),
                path: agent.path.clone(),
                summary: agent.summary.clone(),
                agent: Some(agent),
            }),
            Parsed::Internal { .. } => {}
            // A merge brings changes that its other parents already recorded.
            Parsed::Outside if commit.parent_count() > 1 => {}
            Parsed::Outside => {
                let subject = text.lines().next().unwrap_or("").trim();
                let subject: String = subject.chars().take(120).collect();
                let tree = commit.tree()?;
                let parent_tree = match commit.parent(0) {
                    Ok(parent) => Some(parent.tree()?),
                    Err(_) => None,
                };
                let mut options = git2::DiffOptions::new();
                options.pathspec("wiki/");
                let diff =
                    repo.diff_tree_to_tree(parent_tree.as_ref(), Some(&tree), Some(&mut options))?;
                for delta in diff.deltas() {
                    let (op, file) = match delta.status() {
                        git2::Delta::Added => ("outside_create", delta.new_file()),
                        git2::Delta::Deleted => ("outside_delete", delta.old_file()),
                        _ => ("outside_edit", delta.new_file()),
                    };
                    let Some(path) = file.path().and_then(|p| p.to_str()) else {
                        continue;
                    };
                    if !path.starts_with("wiki/")
                        || path.split('/').any(|part| part.starts_with('.'))
                    {
                        continue;
                    }
                    entries.push(Entry {
                        ts,
                        commit: commit.id().to_string(),
                        op: op.into(),
                        path: path.to_string(),
                        summary: format!("committed outside alexandria: {subject}"),
                        agent: None,
                    });
                }
            }
        }
    }
    Ok((entries, commits))
}
