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
use std::path::Path;

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
        let mut seen = dropped::seen_now(repo);
        if dropped::is_known(repo, &seen) {
            return Ok(false);
        }
        if crate::workspace::git::index_held_since(repo.path()).is_some() {
            // git's index is behind HEAD until the daemon writes it (`settle`): written
            // first under the locks, looked at next time without them.
            if !locked || !super::settle::now_locked(repo) {
                return Ok(false);
            }
            seen = dropped::seen_now(repo);
            if dropped::is_known(repo, &seen) {
                return Ok(false);
            }
        }
        if dropped::find(repo, &root)?.is_empty() && unhandled_rewinds(repo)?.is_empty() {
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

/// Rewinds looked at already whose dropped commits needed nothing (their pages are as
/// they left them), by dropped tip: not looked at again.
static HANDLED: std::sync::LazyLock<std::sync::Mutex<std::collections::HashSet<git2::Oid>>> =
    std::sync::LazyLock::new(Default::default);

fn unhandled_rewinds(repo: &git2::Repository) -> Result<Vec<dropped::Rewound>, git2::Error> {
    let handled = HANDLED.lock().unwrap_or_else(|p| p.into_inner());
    let mut found = dropped::rewound(repo)?;
    found.retain(|r| !handled.contains(&r.from));
    Ok(found)
}

/// A page a racing `git reset` took back, and what it gets again.
struct Rewind {
    path: String,
    /// The version it gets (None: no page), as a blob.
    blob: Option<git2::Oid>,
    /// The dropped commit whose version it is (the newest that touched it).
    commit: git2::Oid,
    /// The reset's reflog entry: where it moved the branch from and to.
    from: git2::Oid,
}

/// What to do with one path a rewind dropped: the version it should have now, given
/// `base` (the reset's target), `theirs` (the dropped tip) and `ours` (HEAD now), or
/// None when it is as it should be or cannot be decided without a person (both changed
/// it differently: the dropped version stays in its commit, and history says so).
fn rewound_version(
    repo: &git2::Repository,
    path: &str,
    base: Option<git2::Oid>,
    theirs: Option<git2::Oid>,
    ours: Option<git2::Oid>,
) -> Result<Option<Option<git2::Oid>>, git2::Error> {
    if ours == theirs {
        return Ok(None);
    }
    if ours == base {
        return Ok(Some(theirs));
    }
    // Changed since the reset (a write planned on the reverted page): both changes, if
    // the lines merge cleanly.
    let (Some(base), Some(theirs), Some(ours)) = (base, theirs, ours) else {
        return Ok(None);
    };
    let text = |id| repo.find_blob(id).map(|b| b.content().to_vec());
    let (base, theirs, ours) = (text(base)?, text(theirs)?, text(ours)?);
    // Both only appended (the common case for a page agents append to).
    if theirs.starts_with(&base) && ours.starts_with(&base) {
        let mut merged = ours.clone();
        if !merged.is_empty() && !merged.ends_with(b"\n") {
            merged.push(b'\n');
        }
        let added = &theirs[base.len()..];
        merged.extend_from_slice(added);
        return repo.blob(&merged).map(|id| Some(Some(id)));
    }
    let mut options = git2::MergeFileOptions::new();
    options.style_standard(true);
    let (mut base_in, mut ours_in, mut theirs_in) = (
        git2::MergeFileInput::new(),
        git2::MergeFileInput::new(),
        git2::MergeFileInput::new(),
    );
    base_in.path(path).content(&base);
    ours_in.path(path).content(&ours);
    theirs_in.path(path).content(&theirs);
    let merged = git2::merge_file(&base_in, &ours_in, &theirs_in, Some(&mut options))?;
    if !merged.is_automergeable() {
        return Ok(None);
    }
    repo.blob(merged.content()).map(|id| Some(Some(id)))
}

/// Under the workspace's locks and in `session`: the pages racing resets took back get
/// their versions again, on disk and in one commit per rewind. A page changed on disk
/// since (not as HEAD has it) is left to the person. Returns what was put back.
fn put_back_rewinds(
    session: &mut git::Session<'_>,
    root: &Path,
) -> ToolResult<Vec<(Rewind, String)>> {
    let repo = session.repo();
    let rewinds = unhandled_rewinds(repo).map_err(git2_error)?;
    let mut done = Vec::new();
    for rewind in rewinds {
        let tree_of = |id: git2::Oid| repo.find_commit(id).and_then(|c| c.tree());
        let (from, to) = (
            tree_of(rewind.from).map_err(git2_error)?,
            tree_of(rewind.to).map_err(git2_error)?,
        );
        let head = session
            .tip()
            .map_err(git_error)?
            .tree()
            .map_err(git2_error)?;
        let blob_at =
            |tree: &git2::Tree<'_>, path: &str| tree.get_path(Path::new(path)).ok().map(|e| e.id());
        // Paths the dropped commits touched, each with the newest commit that did.
        let mut paths: Vec<(String, git2::Oid)> = Vec::new();
        for &id in &rewind.commits {
            let commit = repo.find_commit(id).map_err(git2_error)?;
            let tree = commit.tree().map_err(git2_error)?;
            let parent = commit.parent(0).and_then(|p| p.tree()).ok();
            let diff = repo
                .diff_tree_to_tree(parent.as_ref(), Some(&tree), None)
                .map_err(git2_error)?;
            for delta in diff.deltas() {
                let path = delta.new_file().path().or(delta.old_file().path());
                if let Some(path) = path.and_then(|p| p.to_str())
                    && !paths.iter().any(|(p, _)| p == path)
                {
                    paths.push((path.to_string(), id));
                }
            }
        }
        let keep_dir = root
            .join("runs")
            .join(format!("restore-{}", uuid::Uuid::new_v4().simple()));
        let mut wanted: Vec<(
            String,
            Option<git2::Oid>,
            git2::Oid,
            Option<std::fs::Metadata>,
        )> = Vec::new();
        for (path, commit) in paths {
            let ours = blob_at(&head, &path);
            let version = rewound_version(
                repo,
                &path,
                blob_at(&to, &path),
                blob_at(&from, &path),
                ours,
            )
            .map_err(git2_error)?;
            let Some(version) = version else {
                continue;
            };
            let target = root.join(&path);
            let disk = fs::read(&target).ok();
            let disk_rev = disk
                .as_deref()
                .map(|b| git2::Oid::hash_object(git2::ObjectType::Blob, b).ok());
            let disk_rev = disk_rev.flatten();
            if disk_rev == version {
                // On disk already (a `git stash pop` brought it back).
                wanted.push((path, version, commit, fs::metadata(&target).ok()));
                continue;
            }
            if disk_rev != ours {
                tracing::warn!(%path, dropped = %commit, "a git reset dropped alexandria's version of a page that has changed on disk since; left as it is");
                continue;
            }
            // Swapped in, and what it replaced looked at: a save in between stays.
            let keep = keep_dir.join(format!("{}", wanted.len()));
            let placed = match version {
                Some(id) => {
                    let blob = repo.find_blob(id).map_err(git2_error)?;
                    let swapped = place::swap_in(&target, blob.content(), &keep)
                        .map_err(|e| io_error("putting back a page a git reset dropped", e))?;
                    let replaced = swapped.replaced.bytes.as_deref().map(revision);
                    if replaced.as_deref() != disk_rev.map(|r| r.to_string()).as_deref() {
                        let _ = place::swap_back(&keep, &target);
                        continue;
                    }
                    swapped.stat
                }
                None => {
                    let taken = place::take_away(&target, &keep)
                        .map_err(|e| io_error("putting back a page a git reset dropped", e))?;
                    if taken.as_deref().map(revision) != disk_rev.map(|r| r.to_string()) {
                        let _ = place::restore(&keep, &target);
                        continue;
                    }
                    None
                }
            };
            wanted.push((path, version, commit, placed));
        }
        let _ = fs::remove_dir_all(&keep_dir);
        if wanted.is_empty() {
            HANDLED
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(rewind.from);
            continue;
        }
        let changes: Vec<git::Change<'_>> = wanted
            .iter()
            .map(|(path, version, _, stat)| git::Change {
                path,
                content: version.map_or(git::Content::Gone, git::Content::Blob),
                stat: stat.as_ref(),
            })
            .collect();
        let list: Vec<String> = wanted.iter().map(|(p, ..)| p.clone()).collect();
        let text = message::restore_rewound(
            &format!("restore {} page(s) a git reset dropped", wanted.len()),
            &format!(
                "A `git reset` to HEAD (or a `git stash`) resolved HEAD before alexandria's \
                 commits {}..{} and moved the branch back below them when it ended, putting \
                 the files back as they were before: {}. Their versions are committed again \
                 (merged with what was written since, where it was).",
                short(&rewind.to.to_string()),
                short(&rewind.from.to_string()),
                list.join(", ")
            ),
            &rewind.from.to_string(),
        );
        let author =
            git2::Signature::now("alexandria", "alexandria@localhost").map_err(git2_error)?;
        let id = session
            .commit(&changes, &text, &author)
            .map_err(git_error)?;
        for (path, version, commit, _) in wanted {
            done.push((
                Rewind {
                    path,
                    blob: version,
                    commit,
                    from: rewind.from,
                },
                id.to_string(),
            ));
        }
    }
    Ok(done)
}

/// Put back, under the workspace's locks, what `dropped::find` finds now.
fn put_back(store: &Store, workspace: &str) -> ToolResult<()> {
    let root = store.workspace_dir(workspace);
    let timeout = git_lock_timeout(store);
    type Found = (Vec<dropped::Dropped>, Option<String>, Vec<(Rewind, String)>);
    let (lost, commit, rewound) = store.state(workspace).with_repo(
        &root,
        |repo| -> ToolResult<Found> {
            // Pages are looked for in git's index: written first.
            super::settle::now_locked(repo);
            let mut session = git::Session::begin(repo, timeout).map_err(git_error)?;
            let rewound = put_back_rewinds(&mut session, &root)?;
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
            let rewound = rewound
                .into_iter()
                .map(|(rewind, commit)| {
                    let commit = finished.id(&commit);
                    (rewind, commit)
                })
                .collect();
            Ok((lost, commit.map(|c| finished.id(&c)), rewound))
        },
    )?;
    if commit.is_none() && rewound.is_empty() {
        return Ok(());
    }
    let mut connection = store.pool.get()?;
    let transaction = crate::db::write_transaction(&mut connection)?;
    let now = now_ms();
    for (rewind, commit) in &rewound {
        tracing::warn!(workspace, path = %rewind.path, dropped = %rewind.commit, %commit, "a git reset racing alexandria's commits dropped a page from HEAD and the disk; committed again");
        let run_id = store
            .state(workspace)
            .with_repo(&root, |repo| {
                repo.find_commit(rewind.commit)
                    .map(|c| message::parse(c.message().unwrap_or("")))
            })
            .ok()
            .and_then(|parsed| match parsed {
                message::Parsed::Agent(agent) => Some(agent.run_id),
                _ => None,
            });
        transaction.execute(
            "INSERT OR IGNORE INTO wiki_log_entries(ts, workspace, run_id, op, path, summary, origin, commit_id, previous_commit)
             VALUES (?1, ?2, ?3, 'restore', ?4, ?5, 'agent', ?6, ?7)",
            params![
                now,
                workspace,
                run_id,
                rewind.path,
                format!(
                    "committed again: a git reset to HEAD racing alexandria's commits moved the branch back below commit {} and {} the page; its version is {}",
                    short(&rewind.commit.to_string()),
                    if rewind.blob.is_some() { "reverted" } else { "brought back" },
                    rewind.blob.map_or_else(|| "deleted, as alexandria deleted it".to_string(), |b| format!("blob {}", short(&b.to_string()))),
                ),
                commit,
                rewind.from.to_string(),
            ],
        )?;
    }
    let Some(commit) = commit else {
        transaction.execute(
            "INSERT INTO events(ts, workspace, kind, data) VALUES (?1, ?2, 'pages_restored', ?3)",
            params![
                now,
                workspace,
                json!({"paths": rewound.iter().map(|(r, _)| r.path.clone()).collect::<Vec<_>>()})
                    .to_string()
            ],
        )?;
        transaction.commit()?;
        return flush_to_disk(store, workspace);
    };
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
