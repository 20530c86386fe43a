//! The in-process half of sync: with the workspace lock and git's index lock held,
//! commit outside edits, merge the fetched branch (never rebase), put the merged
//! files in place, move HEAD's branch, and bring `state.db` (index and history) in
//! line; all while no network is touched.
//!
//! Conflicts: pages changed on both sides merge line by line (libgit2) where the
//! changes do not overlap; both sides appending to the same page keep both sides'
//! lines; otherwise the remote's version stays at the path and ours is committed
//! beside it as `<name>.conflict-<host>-<UTC time>.<ext>`. Conflict markers are never
//! written. A change beats a delete. The same holds in `raw/`: nothing there is
//! overwritten by a conflicting version.
//!
//! Crash safety: before the first file is touched, `.git/alexandria-sync.json`
//! records the commit before and the merge commit (already written as an object).
//! A start that finds it rolls forward: every file of the diff is put at the merge's
//! version (again), the branch is moved, git's index and `state.db` catch up, and the
//! journal goes. The merge commit is in the object store before the journal is, so
//! there is never a half merge, and nothing is lost: the pre-merge commit is a parent.

use std::fs;
use std::path::Path;

use git2::{IndexEntry, Oid, Repository};
use rusqlite::params;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::commit::{self, TEMP_MARKER, git_error, git2_error, write_durably};
use crate::db::now_ms;
use crate::error::{ToolError, ToolResult};
use crate::faults::crash_point;
use crate::index;
use crate::workspace::{Store, git, message};

/// The journal of a merge being put in place (in `.git/`).
const JOURNAL: &str = "alexandria-sync.json";

/// A page changed on both sides: the remote's version is at `path`, ours at `kept_as`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Conflict {
    pub path: String,
    pub kept_as: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct Journal {
    old: String,
    new: String,
    conflicts: Vec<Conflict>,
}

/// What merging the fetched branch did.
#[derive(Debug, Default)]
pub struct Merged {
    /// Commits the remote had that we did not.
    pub commits: usize,
    pub conflicts: Vec<Conflict>,
    /// Paths whose content changed here.
    pub changed: Vec<String>,
    /// Outside edits committed first.
    pub outside: usize,
}

/// Merge `remote_ref` (fetched) into the workspace's branch. Takes the workspace lock
/// for the duration (never held while the network is used).
pub fn integrate(store: &Store, slug: &str, remote_ref: &str) -> ToolResult<Merged> {
    let state = store.state(slug);
    let _lock = commit::lock_workspace(store, &state, slug, "sync")?;
    crash_point("sync_locked");
    let root = store.workspace_dir(slug);
    let timeout = commit::git_lock_timeout(store);
    let _index = state.index_lock.lock().unwrap_or_else(|p| p.into_inner());
    let mut merged = Merged::default();
    let journal = state.with_repo(&root, |repo| -> ToolResult<Option<Journal>> {
        // Outside edits are found against git's index: written first.
        commit::settle::now_locked(repo);
        let mut session = git::Session::begin(repo, timeout).map_err(git_error)?;
        merged.outside = commit_outside_edits(repo, &root, &mut session)?;
        let theirs = match repo.refname_to_id(remote_ref) {
            Ok(id) => id,
            Err(e) if e.code() == git2::ErrorCode::NotFound => {
                session.finish().map_err(git_error)?;
                return Ok(None);
            }
            Err(e) => return Err(git2_error(e)),
        };
        // Outside edits were committed on top of HEAD in the session.
        let local = session.tip().map_err(git_error)?.id();
        if local == theirs
            || repo
                .graph_descendant_of(local, theirs)
                .map_err(git2_error)?
        {
            session.finish().map_err(git_error)?;
            return Ok(None);
        }
        let (new, conflicts) = if repo
            .graph_descendant_of(theirs, local)
            .map_err(git2_error)?
        {
            (theirs, Vec::new())
        } else {
            merge(repo, local, theirs, remote_ref)?
        };
        let journal = Journal {
            old: local.to_string(),
            new: new.to_string(),
            conflicts,
        };
        write_journal(repo.path(), &journal)?;
        crash_point("sync_journal");
        merged.changed = apply(repo, &root, local, new, &mut session)?;
        session.finish().map_err(git_error)?;
        crash_point("sync_applied");
        Ok(Some(journal))
    })?;
    let Some(journal) = journal else {
        return Ok(merged);
    };
    merged.commits = record(store, slug, &journal, &merged.changed)?;
    let _ = fs::remove_file(root.join(".git").join(JOURNAL));
    merged.conflicts = journal.conflicts;
    for path in &merged.changed {
        store.changed(slug, path);
    }
    Ok(merged)
}

/// At start (before serving): finish a merge a killed daemon was putting in place.
pub fn recover(store: &Store, slug: &str) -> ToolResult<Option<String>> {
    let root = store.workspace_dir(slug);
    let path = root.join(".git").join(JOURNAL);
    let Ok(bytes) = fs::read(&path) else {
        return Ok(None);
    };
    let Ok(journal) = serde_json::from_slice::<Journal>(&bytes) else {
        let _ = fs::remove_file(&path);
        return Ok(Some(format!("{slug}: dropped an unreadable sync journal")));
    };
    let (Ok(old), Ok(new)) = (Oid::from_str(&journal.old), Oid::from_str(&journal.new)) else {
        let _ = fs::remove_file(&path);
        return Ok(Some(format!("{slug}: dropped an unreadable sync journal")));
    };
    let state = store.state(slug);
    let timeout = commit::git_lock_timeout(store);
    let _index = state.index_lock.lock().unwrap_or_else(|p| p.into_inner());
    let changed = state.with_repo(&root, |repo| -> ToolResult<Option<Vec<String>>> {
        let head = repo
            .head()
            .map_err(git2_error)?
            .peel_to_commit()
            .map_err(git2_error)?
            .id();
        if head != old && head != new {
            return Ok(None);
        }
        let mut session = git::Session::begin(repo, timeout).map_err(git_error)?;
        let changed = apply(repo, &root, old, new, &mut session)?;
        session.finish().map_err(git_error)?;
        Ok(Some(changed))
    })?;
    let Some(changed) = changed else {
        let _ = fs::remove_file(&path);
        return Ok(Some(format!(
            "{slug}: dropped a sync journal (the branch moved since)"
        )));
    };
    record(store, slug, &journal, &changed)?;
    let _ = fs::remove_file(&path);
    Ok(Some(format!(
        "{slug}: completed an interrupted sync merge ({} path(s))",
        changed.len()
    )))
}

fn write_journal(git_dir: &Path, journal: &Journal) -> ToolResult<()> {
    let bytes = serde_json::to_vec(journal).map_err(|e| ToolError::internal("sync journal", e))?;
    let path = git_dir.join(JOURNAL);
    write_durably(&path, &bytes).map_err(|e| commit::io_error("writing the sync journal", e))?;
    // The merge commit's objects and the journal reach the disk before any file moves.
    if let Ok(dir) = fs::File::open(git_dir) {
        let _ = rustix::fs::syncfs(&dir);
    }
    Ok(())
}

/// Whether a repository path may be written by sync: inside `raw/`, `wiki/` or a
/// top-level file, no `..`, no `.git`, no absolute path.
fn safe_path(path: &str) -> bool {
    !path.is_empty()
        && !path.starts_with('/')
        && path.split('/').all(|part| {
            !part.is_empty() && part != "." && part != ".." && !part.eq_ignore_ascii_case(".git")
        })
        && !path.contains('\\')
}

/// Commit what differs on disk from HEAD in `raw/` and `wiki/` (an editor's save, a
/// file copied in) as one outside edit, so that the merge never overwrites it.
fn commit_outside_edits(
    repo: &Repository,
    root: &Path,
    session: &mut git::Session<'_>,
) -> ToolResult<usize> {
    let mut options = git2::StatusOptions::new();
    options
        .include_untracked(true)
        .recurse_untracked_dirs(true)
        .include_ignored(false)
        .exclude_submodules(true)
        .pathspec("raw")
        .pathspec("wiki");
    let statuses = repo.statuses(Some(&mut options)).map_err(git2_error)?;
    let mut paths = Vec::new();
    for entry in statuses.iter() {
        let Ok(path) = entry.path() else { continue };
        if path
            .split('/')
            .any(|c| c.starts_with('.') || c.ends_with('~') || c.contains(TEMP_MARKER))
        {
            continue;
        }
        if entry.status().intersects(
            git2::Status::WT_NEW
                | git2::Status::WT_MODIFIED
                | git2::Status::WT_DELETED
                | git2::Status::WT_TYPECHANGE
                | git2::Status::INDEX_NEW
                | git2::Status::INDEX_MODIFIED
                | git2::Status::INDEX_DELETED,
        ) {
            paths.push(path.to_string());
        }
    }
    if paths.is_empty() {
        return Ok(0);
    }
    let head_tree = repo
        .head()
        .map_err(git2_error)?
        .peel_to_tree()
        .map_err(git2_error)?;
    let mut contents = Vec::new();
    for path in &paths {
        let absolute = root.join(path);
        let bytes = match fs::symlink_metadata(&absolute) {
            Ok(m) if m.is_file() => Some(
                fs::read(&absolute).map_err(|e| commit::io_error("reading an outside edit", e))?,
            ),
            Ok(_) => continue,
            Err(_) => None,
        };
        if bytes.is_none() && head_tree.get_path(Path::new(path)).is_err() {
            continue;
        }
        let stat = fs::metadata(&absolute).ok();
        contents.push((path.clone(), bytes, stat));
    }
    if contents.is_empty() {
        return Ok(0);
    }
    let changes: Vec<git::Change<'_>> = contents
        .iter()
        .map(|(path, bytes, stat)| git::Change {
            path,
            content: git::Content::of(bytes.as_deref()),
            stat: stat.as_ref(),
        })
        .collect();
    let text = message::outside(
        "outside_edit",
        &format!(
            "outside edits: {} path(s), committed before a sync",
            changes.len()
        ),
        "Changed outside alexandria (an editor, a copy); committed as found before merging \
         with the remote, so that no version is lost.",
    );
    let author = git2::Signature::now("outside alexandria", "outside@alexandria.local")
        .map_err(git2_error)?;
    session
        .commit(&changes, &text, &author)
        .map_err(git_error)?;
    Ok(changes.len())
}

/// A stage-0 index entry for `path` at blob `id`.
fn entry(path: &str, id: Oid, mode: u32) -> IndexEntry {
    IndexEntry {
        ctime: git2::IndexTime::new(0, 0),
        mtime: git2::IndexTime::new(0, 0),
        dev: 0,
        ino: 0,
        mode,
        uid: 0,
        gid: 0,
        file_size: 0,
        id,
        flags: 0,
        flags_extended: 0,
        path: path.as_bytes().to_vec(),
    }
}

/// This machine's name for conflict files: lowercase letters, digits and dashes.
pub fn host_name() -> String {
    let raw = std::env::var("ALEXANDRIA_HOST_NAME")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| {
            rustix::system::uname()
                .nodename()
                .to_string_lossy()
                .into_owned()
        });
    let cleaned: String = raw
        .split('.')
        .next()
        .unwrap_or("")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(40)
        .collect();
    let cleaned = cleaned.trim_matches('-').to_string();
    if cleaned.is_empty() {
        "host".into()
    } else {
        cleaned
    }
}

/// `wiki/a/b.md` → `wiki/a/b.conflict-<host>-<stamp>.md` (a number added if taken).
fn conflict_name(index: &git2::Index, path: &str, host: &str, stamp: &str) -> String {
    let (dir, file) = match path.rsplit_once('/') {
        Some((dir, file)) => (format!("{dir}/"), file),
        None => (String::new(), path),
    };
    let (stem, ext) = match file.rfind('.') {
        Some(i) if i > 0 => (&file[..i], &file[i..]),
        _ => (file, ""),
    };
    let mut n = 1;
    loop {
        let suffix = if n == 1 {
            String::new()
        } else {
            format!("-{n}")
        };
        let candidate = format!("{dir}{stem}.conflict-{host}-{stamp}{suffix}{ext}");
        if index.get_path(Path::new(&candidate), 0).is_none() {
            return candidate;
        }
        n += 1;
    }
}

/// Both sides only appended to a wiki page: the remote's text, then our lines.
fn both_appended(
    repo: &Repository,
    path: &str,
    ancestor: Option<&IndexEntry>,
    ours: &IndexEntry,
    theirs: &IndexEntry,
) -> Result<Option<Vec<u8>>, git2::Error> {
    if !path.starts_with("wiki/") || !path.ends_with(".md") {
        return Ok(None);
    }
    let Some(ancestor) = ancestor else {
        return Ok(None);
    };
    let base = repo.find_blob(ancestor.id)?.content().to_vec();
    let ours = repo.find_blob(ours.id)?.content().to_vec();
    let theirs = repo.find_blob(theirs.id)?.content().to_vec();
    if !(ours.starts_with(&base) && theirs.starts_with(&base)) {
        return Ok(None);
    }
    let mut merged = theirs;
    if !merged.is_empty() && !merged.ends_with(b"\n") {
        merged.push(b'\n');
    }
    merged.extend_from_slice(&ours[base.len()..]);
    Ok(Some(merged))
}

/// The merge commit of `local` and `theirs` (both parents), conflicts resolved as the
/// module says. No ref moves.
fn merge(
    repo: &Repository,
    local: Oid,
    theirs: Oid,
    remote_ref: &str,
) -> ToolResult<(Oid, Vec<Conflict>)> {
    let ours_commit = repo.find_commit(local).map_err(git2_error)?;
    let theirs_commit = repo.find_commit(theirs).map_err(git2_error)?;
    let ancestor = match repo.merge_base(local, theirs) {
        Ok(base) => repo
            .find_commit(base)
            .and_then(|c| c.tree())
            .map_err(git2_error)?,
        // Unrelated histories: everything counts as added on both sides.
        Err(e) if e.code() == git2::ErrorCode::NotFound => {
            let empty = repo
                .treebuilder(None)
                .and_then(|b| b.write())
                .map_err(git2_error)?;
            repo.find_tree(empty).map_err(git2_error)?
        }
        Err(e) => return Err(git2_error(e)),
    };
    let mut index = repo
        .merge_trees(
            &ancestor,
            &ours_commit.tree().map_err(git2_error)?,
            &theirs_commit.tree().map_err(git2_error)?,
            None,
        )
        .map_err(git2_error)?;
    let mut conflicts = Vec::new();
    if index.has_conflicts() {
        let found: Vec<git2::IndexConflict> = index
            .conflicts()
            .map_err(git2_error)?
            .collect::<Result<_, _>>()
            .map_err(git2_error)?;
        let host = host_name();
        let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%SZ").to_string();
        for conflict in found {
            for side in [&conflict.ancestor, &conflict.our, &conflict.their]
                .into_iter()
                .flatten()
            {
                let path = String::from_utf8_lossy(&side.path).into_owned();
                let _ = index.conflict_remove(Path::new(&path));
            }
            let path_of = |e: &IndexEntry| String::from_utf8_lossy(&e.path).into_owned();
            match (&conflict.our, &conflict.their) {
                (Some(ours), Some(theirs)) => {
                    let path = path_of(theirs);
                    if ours.id == theirs.id {
                        index
                            .add(&entry(&path, theirs.id, theirs.mode))
                            .map_err(git2_error)?;
                    } else if let Some(bytes) =
                        both_appended(repo, &path, conflict.ancestor.as_ref(), ours, theirs)
                            .map_err(git2_error)?
                    {
                        let id = repo.blob(&bytes).map_err(git2_error)?;
                        index
                            .add(&entry(&path, id, theirs.mode))
                            .map_err(git2_error)?;
                    } else {
                        index
                            .add(&entry(&path, theirs.id, theirs.mode))
                            .map_err(git2_error)?;
                        let kept_as = conflict_name(&index, &path_of(ours), &host, &stamp);
                        index
                            .add(&entry(&kept_as, ours.id, ours.mode))
                            .map_err(git2_error)?;
                        conflicts.push(Conflict { path, kept_as });
                    }
                }
                // A change beats a delete.
                (Some(kept), None) | (None, Some(kept)) => {
                    index
                        .add(&entry(&path_of(kept), kept.id, kept.mode))
                        .map_err(git2_error)?;
                }
                (None, None) => {}
            }
        }
    }
    let tree = index.write_tree_to(repo).map_err(git2_error)?;
    let tree = repo.find_tree(tree).map_err(git2_error)?;
    let signature =
        git2::Signature::now("alexandria", "alexandria@localhost").map_err(git2_error)?;
    let remote = remote_ref
        .strip_prefix("refs/remotes/")
        .unwrap_or(remote_ref);
    let subject = if conflicts.is_empty() {
        format!("sync: merge {remote}")
    } else {
        format!(
            "sync: merge {remote} ({} conflict(s) kept side by side)",
            conflicts.len()
        )
    };
    let id = repo
        .commit(
            None,
            &signature,
            &signature,
            &message::internal("sync", &subject),
            &tree,
            &[&ours_commit, &theirs_commit],
        )
        .map_err(git2_error)?;
    Ok((id, conflicts))
}

/// Put every path that differs between `old` and `new` at its version in `new` (files
/// already right are left alone, so this can run again after a crash), then move the
/// branch to `new` with git's index entries of those paths. Returns the paths.
fn apply(
    repo: &Repository,
    root: &Path,
    old: Oid,
    new: Oid,
    session: &mut git::Session<'_>,
) -> ToolResult<Vec<String>> {
    let old_tree = repo
        .find_commit(old)
        .and_then(|c| c.tree())
        .map_err(git2_error)?;
    let new_tree = repo
        .find_commit(new)
        .and_then(|c| c.tree())
        .map_err(git2_error)?;
    let diff = repo
        .diff_tree_to_tree(Some(&old_tree), Some(&new_tree), None)
        .map_err(git2_error)?;
    let mut paths: Vec<String> = Vec::new();
    for delta in diff.deltas() {
        for file in [delta.old_file(), delta.new_file()] {
            if let Some(path) = file.path().and_then(|p| p.to_str()) {
                paths.push(path.to_string());
            }
        }
    }
    paths.sort();
    paths.dedup();
    let mut done = Vec::with_capacity(paths.len());
    for (n, path) in paths.into_iter().enumerate() {
        if !safe_path(&path) {
            tracing::warn!(path, "sync: refusing a path from the remote");
            continue;
        }
        let target = root.join(&path);
        match new_tree.get_path(Path::new(&path)) {
            Ok(item) if item.kind() == Some(git2::ObjectType::Blob) => {
                if item.filemode() == i32::from(git2::FileMode::Link) {
                    tracing::warn!(path, "sync: not writing a symbolic link from the remote");
                    continue;
                }
                let blob = repo.find_blob(item.id()).map_err(git2_error)?;
                if fs::read(&target).ok().as_deref() != Some(blob.content()) {
                    write_durably(&target, blob.content())
                        .map_err(|e| commit::io_error("writing a synced file", e))?;
                }
                done.push((path, fs::metadata(&target).ok()));
            }
            Ok(_) => continue,
            Err(e) if e.code() == git2::ErrorCode::NotFound => {
                match fs::remove_file(&target) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(commit::io_error("removing a synced file", e)),
                }
                done.push((path, None));
            }
            Err(e) => return Err(git2_error(e)),
        }
        if n == 0 {
            crash_point("sync_first_file");
        }
    }
    let head = session.tip().map_err(git_error)?.id();
    session.advance(head, new, &done).map_err(git_error)?;
    Ok(done.into_iter().map(|(path, _)| path).collect())
}

/// Bring `state.db` in line with a merge put in place: index the changed paths, record
/// the history of the commits it brought in (agent writes made on the other machine
/// keep their run, client and session) and a `sync_conflict` entry per conflict.
/// Returns how many commits came in.
fn record(store: &Store, slug: &str, journal: &Journal, changed: &[String]) -> ToolResult<usize> {
    let root = store.workspace_dir(slug);
    let (old, new) = match (Oid::from_str(&journal.old), Oid::from_str(&journal.new)) {
        (Ok(old), Ok(new)) => (old, new),
        _ => return Ok(0),
    };
    let (entries, commits) = store
        .state(slug)
        .with_repo(&root, |repo| {
            crate::commit::rebuild::read_commits(repo, new, Some(old))
        })
        .map_err(git2_error)?;
    let mut connection = store.pool.get()?;
    let transaction = crate::db::write_transaction(&mut connection)?;
    for path in changed {
        if !(path.starts_with("raw/") || path.starts_with("wiki/"))
            || path.split('/').any(|c| c.starts_with('.'))
        {
            continue;
        }
        let absolute = root.join(path);
        if absolute.is_file() {
            if let Err(error) = index::index_file(&transaction, slug, path, &absolute) {
                tracing::warn!(workspace = slug, path, %error, "cannot index a synced file");
            }
        } else {
            index::remove_file(&transaction, slug, path)?;
        }
    }
    crate::commit::rebuild::record(&transaction, slug, &entries)?;
    let now = now_ms();
    for conflict in &journal.conflicts {
        transaction.execute(
            "INSERT OR IGNORE INTO wiki_log_entries(ts, workspace, run_id, op, path, summary, origin, commit_id)
             VALUES (?1, ?2, NULL, 'sync_conflict', ?3, ?4, 'sync', ?5)",
            params![
                now,
                slug,
                conflict.kept_as,
                format!(
                    "{} was changed on both machines; the remote's version is at {}, this machine's is kept as {} (merge them, then delete the conflict page)",
                    conflict.path, conflict.path, conflict.kept_as
                ),
                journal.new,
            ],
        )?;
    }
    transaction.execute(
        "INSERT INTO events(ts, workspace, kind, data) VALUES (?1, ?2, 'sync_merged', ?3)",
        params![
            now,
            slug,
            json!({"old": journal.old, "new": journal.new, "commits": commits, "conflicts": journal.conflicts}).to_string()
        ],
    )?;
    transaction.commit()?;
    Ok(commits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflict_names_and_safe_paths() {
        let index = git2::Index::new().expect("index");
        assert_eq!(
            conflict_name(&index, "wiki/a/b.md", "laptop", "20261130T120000Z"),
            "wiki/a/b.conflict-laptop-20261130T120000Z.md"
        );
        assert_eq!(
            conflict_name(&index, "raw/data", "h", "T"),
            "raw/data.conflict-h-T"
        );
        assert!(safe_path("wiki/a.md"));
        for bad in [
            "../x",
            "wiki/../../x",
            ".git/hooks/x",
            "wiki/.GIT/x",
            "/etc/x",
            "",
        ] {
            assert!(!safe_path(bad), "{bad}");
        }
    }
}
