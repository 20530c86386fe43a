//! Crash recovery at start: finish or drop every run a dead daemon left behind.

use std::fs::{self};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::*;
use crate::workspace::Store;

/// Delete what a killed writer can leave behind: temporary files in the layers, and
/// git's lock files (only alexandria writes to a workspace repository, and this runs
/// before the daemon serves anything).
fn remove_leftovers(root: &Path, report: &mut Vec<String>) {
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
    for lock in ["index.lock", "HEAD.lock"] {
        let path = root.join(".git").join(lock);
        if path.exists() {
            let _ = fs::remove_file(&path);
            report.push(format!("removed stale {}", path.display()));
        }
    }
    for entry in walkdir::WalkDir::new(root.join(".git/refs"))
        .into_iter()
        .flatten()
    {
        if entry.file_type().is_file() && entry.file_name().to_string_lossy().ends_with(".lock") {
            let _ = fs::remove_file(entry.path());
            report.push(format!("removed stale {}", entry.path().display()));
        }
    }
}

/// Finish or drop every run left by a daemon that died. Runs before serving.
pub fn recover(store: &Arc<Store>) -> Vec<String> {
    let mut report = Vec::new();
    for workspace in store.list_workspaces() {
        let root = store.workspace_dir(&workspace);
        remove_leftovers(&root, &mut report);
        // Commits reach git's index lazily; catch up with what a crash left behind.
        match git2::Repository::open(&root)
            .and_then(|repo| crate::workspace::git::sync_index_with_head(&repo, &root))
        {
            Ok(0) => {}
            Ok(n) => report.push(format!("{workspace}: updated {n} path(s) in git's index")),
            Err(error) => report.push(format!("{workspace}: cannot update git's index: {error}")),
        }
        let runs = store.workspace_dir(&workspace).join("runs");
        let Ok(entries) = fs::read_dir(&runs) else {
            continue;
        };
        let mut dirs: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_dir())
            .collect();
        dirs.sort();
        for dir in dirs {
            let manifest = load_manifest(&dir);
            match manifest {
                Some(manifest) if manifest.state == RunState::Prepared => {
                    match complete_or_roll_back(store, &manifest) {
                        Ok(commit) => {
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
    }
    report
}
