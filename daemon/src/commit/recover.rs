//! Crash recovery at start: finish or drop every run a dead daemon left behind.

use std::fs::{self};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::*;
use crate::workspace::Store;

/// Delete what a killed writer can leave behind: temporary files in the layers, and
/// git's lock files if alexandria left them (people use git in workspaces too: their
/// locks are never touched). Returns whether alexandria's own `index.lock` was found,
/// i.e. a commit was interrupted.
fn remove_leftovers(root: &Path, report: &mut Vec<String>) -> bool {
    for layer in ["wiki", "raw"] {
        for entry in walkdir::WalkDir::new(root.join(layer))
            .into_iter()
            .flatten()
        {
            let name = entry.file_name().to_string_lossy();
            if entry.file_type().is_file()
                && (name.contains(TEMP_MARKER) || name.starts_with(".ingest-"))
            {
                let _ = fs::remove_file(entry.path());
                report.push(format!("removed leftover {}", entry.path().display()));
            }
        }
    }
    let git_dir = root.join(".git");
    if !git::remove_own_stale_lock(&git_dir) {
        return false;
    }
    report.push(format!(
        "removed stale {}",
        git_dir.join("index.lock").display()
    ));
    // Ref locks taken by that commit, under the index lock.
    let mut ref_locks = vec![git_dir.join("HEAD.lock")];
    ref_locks.extend(
        walkdir::WalkDir::new(git_dir.join("refs"))
            .into_iter()
            .flatten()
            .filter(|e| {
                e.file_type().is_file() && e.file_name().to_string_lossy().ends_with(".lock")
            })
            .map(|e| e.path().to_path_buf()),
    );
    for lock in ref_locks {
        if fs::remove_file(&lock).is_ok() {
            report.push(format!("removed stale {}", lock.display()));
        }
    }
    true
}

/// Finish or drop every run left by a daemon that died. Runs before serving.
pub fn recover(store: &Arc<Store>) -> Vec<String> {
    let mut report = Vec::new();
    for workspace in store.list_workspaces() {
        let root = store.workspace_dir(&workspace);
        if remove_leftovers(&root, &mut report) {
            // A commit was interrupted between moving HEAD and writing git's index.
            let timeout = git_lock_timeout(store);
            let staged = git2::Repository::open(&root)
                .map_err(git::GitError::from)
                .and_then(|repo| git::stage_last_commit(&repo, timeout));
            match staged {
                Ok(0) => {}
                Ok(n) => report.push(format!("{workspace}: updated {n} path(s) in git's index")),
                Err(error) => {
                    report.push(format!("{workspace}: cannot update git's index: {error}"));
                }
            }
        }
        // Pages a hand `git commit` dropped (maybe just before the daemon died) go back
        // before the runs are completed on top.
        restore::check(store, &workspace, false);
        let runs = store.workspace_dir(&workspace).join("runs");
        let Ok(entries) = fs::read_dir(&runs) else {
            continue;
        };
        let mut dirs: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_dir())
            .filter(|p| {
                !p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(late::KEPT_PREFIX))
            })
            .collect();
        dirs.sort();
        for dir in dirs {
            if let Some(capture) = capture::load(&dir) {
                capture::recover(store, &dir, capture, &mut report);
                continue;
            }
            let manifest = load_manifest(&dir);
            match manifest {
                Some(manifest) if manifest.state == RunState::Prepared => {
                    match complete_or_roll_back(store, &manifest) {
                        Ok(completed) => {
                            let commit = completed.commit;
                            tracing::warn!(workspace, run = %manifest.run_id, %commit, "completed an interrupted run");
                            report.push(format!("{workspace}: completed {}", manifest.run_id));
                        }
                        Err(error) => {
                            tracing::error!(workspace, run = %manifest.run_id, %error, "could not complete an interrupted run; it was rolled back");
                            report.push(format!("{workspace}: rolled back {}", manifest.run_id));
                        }
                    }
                }
                _ => {
                    // Staged only (never acknowledged) or unreadable: drop it.
                    let _ = fs::remove_dir_all(&dir);
                    report.push(format!("{workspace}: dropped {}", dir.display()));
                }
            }
        }
        // Saves that landed in the files runs had replaced, after their writes.
        late::recover(store, &workspace, &mut report);
    }
    report
}
