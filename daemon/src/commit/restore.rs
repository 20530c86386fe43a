//! Pages a hand `git commit` dropped from HEAD or git's index are put back (issue 20).
//!
//! Why it happens and how a dropped page is recognised: `workspace::dropped`. Here:
//! HEAD gets the pages back by one commit on top (`Alexandria-Op: restore`, a `restore`
//! history entry per page naming the commit that dropped it), the index by restaging
//! them. Checked before every group of writes, at start (before the runs a dead daemon
//! left are completed) and by the watcher about once a second; each check costs a
//! `stat` and a ref read unless HEAD or the index changed since the daemon last saw
//! them consistent.

use std::fs;

use rusqlite::params;

use super::*;
use crate::workspace::dropped;

/// Look for pages a hand commit dropped in `workspace` and put them back. `locked`: the
/// caller holds the workspace lock and its index lock (a group's leader); otherwise
/// they are taken only when something was dropped.
pub(crate) fn check(store: &Store, workspace: &str, locked: bool) {
    let root = store.workspace_dir(workspace);
    let state = store.state(workspace);
    let found = state.with_repo(&root, |repo| -> Result<bool, git2::Error> {
        let seen = dropped::seen_now(repo);
        if dropped::is_known(repo, &seen) {
            return Ok(false);
        }
        if dropped::find(repo, &root)?.is_empty() {
            dropped::remember(repo, seen);
            return Ok(false);
        }
        Ok(true)
    });
    match found {
        Ok(true) => {}
        Ok(false) => return,
        Err(error) => {
            // A workspace being renamed or removed: looked at again next time.
            tracing::debug!(workspace, %error, "cannot look for pages a hand commit dropped");
            return;
        }
    }
    let result = if locked {
        put_back(store, workspace)
    } else {
        lock_workspace(store, &state, workspace, "restore").and_then(|_lock| {
            let _index = state.index_lock.lock().unwrap_or_else(|p| p.into_inner());
            put_back(store, workspace)
        })
    };
    if let Err(error) = result {
        tracing::warn!(workspace, %error, "cannot put back pages a hand commit dropped");
    }
}

/// Put back, under the workspace's locks, what `dropped::find` finds now.
fn put_back(store: &Store, workspace: &str) -> ToolResult<()> {
    let root = store.workspace_dir(workspace);
    let timeout = git_lock_timeout(store);
    let (lost, commit) = store.state(workspace).with_repo(
        &root,
        |repo| -> ToolResult<(Vec<dropped::Dropped>, Option<String>)> {
            let mut session = git::Session::begin(repo, timeout).map_err(git_error)?;
            let found = dropped::find(repo, &root).map_err(git2_error)?;
            let (lost, unstaged): (Vec<_>, Vec<_>) =
                found.into_iter().partition(dropped::Dropped::from_head);
            let mut commit = None;
            if !lost.is_empty() {
                let stats: Vec<Option<fs::Metadata>> = lost
                    .iter()
                    .map(|d| fs::metadata(root.join(&d.path)).ok())
                    .collect();
                let changes: Vec<git::Change<'_>> = lost
                    .iter()
                    .zip(&stats)
                    .map(|(d, stat)| git::Change {
                        path: &d.path,
                        content: d.blob.map_or(git::Content::Gone, git::Content::Blob),
                        stat: stat.as_ref(),
                    })
                    .collect();
                let by: Vec<String> = lost
                    .iter()
                    .filter_map(|d| d.by.map(|by| short(&by.to_string()).to_string()))
                    .collect::<std::collections::BTreeSet<_>>()
                    .into_iter()
                    .collect();
                let list: Vec<String> = lost
                    .iter()
                    .map(|d| format!("{} (as in {})", d.path, short(&d.commit.to_string())))
                    .collect();
                let text = message::restore(
                    &format!(
                        "restore {} page(s) dropped by commit {}",
                        lost.len(),
                        by.join(", ")
                    ),
                    &format!(
                        "Commit {} was made outside alexandria from a copy of git's index read \
                         before alexandria's commits of these pages, so it dropped them while \
                         they stayed on disk: {}. They are committed again as they are on disk.",
                        by.join(", "),
                        list.join(", ")
                    ),
                );
                let author =
                    git2::Signature::now("alexandria", "alexandria@localhost").map_err(git2_error)?;
                let id = session
                    .commit(&changes, &text, &author)
                    .map_err(git_error)?;
                commit = Some(id.to_string());
            }
            for d in &unstaged {
                tracing::warn!(path = %d.path, "git's index lost a page alexandria committed (a hand `git commit` wrote back an old copy of the index); staged again");
                session.stage(&d.path, d.blob, fs::metadata(root.join(&d.path)).ok());
            }
            session.mark_verified();
            let finished = session.finish().map_err(git_error)?;
            Ok((lost, commit.map(|c| finished.id(&c))))
        },
    )?;
    let Some(commit) = commit else {
        return Ok(());
    };
    let mut connection = store.pool.get()?;
    let transaction = crate::db::write_transaction(&mut connection)?;
    let now = now_ms();
    for d in &lost {
        tracing::warn!(workspace, path = %d.path, by = ?d.by, %commit, "a hand commit dropped a page alexandria committed (made from an old copy of git's index); committed again");
        let run_id = store
            .state(workspace)
            .with_repo(&root, |repo| {
                repo.find_commit(d.commit)
                    .map(|c| message::parse(c.message().unwrap_or("")))
            })
            .ok()
            .and_then(|parsed| match parsed {
                message::Parsed::Agent(agent) => Some(agent.run_id),
                _ => None,
            });
        let by = d.by.map(|b| b.to_string()).unwrap_or_default();
        transaction.execute(
            "INSERT OR IGNORE INTO wiki_log_entries(ts, workspace, run_id, op, path, summary, origin, commit_id, previous_commit)
             VALUES (?1, ?2, ?3, 'restore', ?4, ?5, 'agent', ?6, ?7)",
            params![
                now,
                workspace,
                run_id,
                d.path,
                format!(
                    "committed again: commit {} (made outside alexandria from an old copy of git's index) dropped it; the version is the one of commit {}",
                    short(&by),
                    short(&d.commit.to_string())
                ),
                commit,
                by,
            ],
        )?;
    }
    transaction.execute(
        "INSERT INTO events(ts, workspace, kind, data) VALUES (?1, ?2, 'pages_restored', ?3)",
        params![
            now,
            workspace,
            json!({"commit": commit, "paths": lost.iter().map(|d| d.path.clone()).collect::<Vec<_>>()}).to_string()
        ],
    )?;
    transaction.commit()?;
    flush_to_disk(store, workspace)
}
