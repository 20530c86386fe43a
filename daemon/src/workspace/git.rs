//! Commits to workspace repositories.
//!
//! A commit builds its tree from HEAD's tree with only the changed paths replaced
//! (O(depth), whatever the size of the wiki) instead of going through git's index
//! file, which would be rewritten whole on every commit (about 10 MB at 100k pages,
//! plus a forced flush on ext4). The index, which only matters to people running
//! `git status` in the workspace, is brought up to date in the background
//! (`sync_index`) and at start (`sync_index_with_head`).

use std::path::Path;

use git2::{FileMode, Oid, Repository, Signature};

/// One path changed by a commit: its new content is the file on disk, or it is gone.
pub struct Change<'a> {
    pub path: &'a str,
    pub present: bool,
}

/// Commit `changes` (read from the working tree under `root`) on top of HEAD.
pub fn commit_changes(
    repo: &Repository,
    root: &Path,
    changes: &[Change<'_>],
    message: &str,
    author: &Signature<'_>,
) -> Result<Oid, git2::Error> {
    let head = repo.head()?.peel_to_commit()?;
    let base = head.tree()?;
    let mut update = git2::build::TreeUpdateBuilder::new();
    for change in changes {
        if change.present {
            let blob = repo.blob_path(&root.join(change.path))?;
            update.upsert(change.path, blob, FileMode::Blob);
        } else {
            update.remove(change.path);
        }
    }
    let tree = repo.find_tree(update.create_updated(repo, &base)?)?;
    let committer = Signature::now("alexandria", "alexandria@localhost")?;
    repo.commit(Some("HEAD"), author, &committer, message, &tree, &[&head])
}

/// Update git's index for `paths` from the working tree, keeping the stat data of every
/// other entry (so `git status` stays fast).
pub fn sync_index(repo: &Repository, root: &Path, paths: &[String]) -> Result<(), git2::Error> {
    let mut index = repo.index()?;
    for path in paths {
        if root.join(path).is_file() {
            index.add_path(Path::new(path))?;
        } else {
            let _ = index.remove_path(Path::new(path));
        }
    }
    index.write()
}

/// Bring the index in line with HEAD for every path where they differ (after a crash
/// between a commit and the background index update). Returns how many paths.
pub fn sync_index_with_head(repo: &Repository, root: &Path) -> Result<usize, git2::Error> {
    let head = repo.head()?.peel_to_tree()?;
    let index = repo.index()?;
    let diff = repo.diff_tree_to_index(Some(&head), Some(&index), None)?;
    let mut paths = Vec::new();
    for delta in diff.deltas() {
        let file = if delta.new_file().exists() {
            delta.new_file()
        } else {
            delta.old_file()
        };
        if let Some(path) = file.path().and_then(|p| p.to_str()) {
            paths.push(path.to_string());
        }
    }
    drop(index);
    if !paths.is_empty() {
        sync_index(repo, root, &paths)?;
    }
    Ok(paths.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commits_without_the_index_and_syncs_it_later() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        let repo = Repository::init(root).expect("init");
        std::fs::write(root.join("a.md"), "a").expect("write");
        let mut index = repo.index().expect("index");
        index.add_path(Path::new("a.md")).expect("add");
        index.write().expect("write index");
        let tree = repo
            .find_tree(index.write_tree().expect("tree"))
            .expect("tree");
        let me = Signature::now("t", "t@t").expect("sig");
        repo.commit(Some("HEAD"), &me, &me, "init", &tree, &[])
            .expect("commit");

        std::fs::create_dir_all(root.join("wiki/deep")).expect("dir");
        std::fs::write(root.join("wiki/deep/b.md"), "b").expect("write");
        std::fs::remove_file(root.join("a.md")).expect("rm");
        let changes = [
            Change {
                path: "wiki/deep/b.md",
                present: true,
            },
            Change {
                path: "a.md",
                present: false,
            },
        ];
        commit_changes(&repo, root, &changes, "change", &me).expect("commit");
        let head = repo.head().expect("head").peel_to_tree().expect("tree");
        assert!(head.get_path(Path::new("wiki/deep/b.md")).is_ok());
        assert!(head.get_path(Path::new("a.md")).is_err());
        // The index still has the old state until it is synced.
        assert_eq!(sync_index_with_head(&repo, root).expect("sync"), 2);
        assert_eq!(sync_index_with_head(&repo, root).expect("sync"), 0);
        let statuses = repo.statuses(None).expect("status");
        assert!(statuses.is_empty(), "clean after sync");
    }
}
