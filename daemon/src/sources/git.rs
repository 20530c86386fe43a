//! The `git` adapter: a local repository (read with libgit2) or a clone URL (mirrored
//! under `cache/sources/` with the `git` command, which fetches outside any lock). One
//! item is a file added or changed on the branch since the last synced commit
//! (matching `--include`); dedup on path + blob id. If the last synced commit is no
//! longer an ancestor (a force-push), every file is compared instead.

use std::path::{Path, PathBuf};

use git2::{Oid, Repository};
use serde_json::json;

use super::folder::{included, matcher};
use super::{Fetch, Found, Item, SyncContext, SyncError};

fn is_remote(target: &str) -> bool {
    target.contains("://") || (target.contains('@') && target.contains(':'))
}

fn mirror_dir(context: &SyncContext<'_>) -> PathBuf {
    context
        .store
        .home
        .root()
        .join("cache/sources")
        .join(format!(
            "{}-{}.git",
            context.source.workspace, context.source.name
        ))
}

fn git_command(args: &[&str], dir: Option<&Path>) -> Result<(), SyncError> {
    let mut command = crate::workspace::git_cli();
    command.args(args);
    if let Some(dir) = dir {
        command.current_dir(dir);
    }
    let output = command
        .output()
        .map_err(|e| SyncError::new(format!("cannot run git: {e}")))?;
    if !output.status.success() {
        return Err(SyncError::new(format!(
            "git {}: {}",
            args.first().unwrap_or(&""),
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(())
}

/// Open the repository to read: the local one, or the mirror (fetched first when
/// `update`).
fn open(context: &SyncContext<'_>, update: bool) -> Result<Repository, SyncError> {
    let target = context
        .source
        .config
        .targets
        .first()
        .ok_or_else(|| SyncError::new("the source has no repository"))?;
    if !is_remote(target) {
        return Repository::open(target).map_err(|e| {
            SyncError::new(format!(
                "cannot open the repository {target}: {}",
                e.message()
            ))
        });
    }
    let mirror = mirror_dir(context);
    if update {
        if mirror.join("HEAD").is_file() {
            git_command(
                &[
                    "fetch",
                    "--prune",
                    "--force",
                    "origin",
                    "+refs/heads/*:refs/heads/*",
                ],
                Some(&mirror),
            )?;
        } else {
            if let Some(parent) = mirror.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(|e| SyncError::new(format!("cannot create the mirror folder: {e}")))?;
            }
            let mirror_text = mirror.display().to_string();
            git_command(&["clone", "--bare", "--quiet", target, &mirror_text], None)?;
        }
    }
    Repository::open_bare(&mirror)
        .map_err(|e| SyncError::new(format!("cannot open the mirror: {}", e.message())))
}

fn branch_commit(repo: &Repository, branch: Option<&str>) -> Result<Oid, SyncError> {
    let reference = match branch {
        Some(branch) => repo
            .find_reference(&format!("refs/heads/{branch}"))
            .or_else(|_| repo.find_reference(&format!("refs/remotes/origin/{branch}")))
            .map_err(|_| SyncError::new(format!("the repository has no branch '{branch}'")))?,
        None => repo
            .head()
            .map_err(|e| SyncError::new(format!("the repository has no HEAD: {}", e.message())))?,
    };
    reference
        .peel_to_commit()
        .map(|c| c.id())
        .map_err(|e| SyncError::new(format!("cannot read the branch: {}", e.message())))
}

pub fn fetch(context: &SyncContext<'_>) -> Result<Fetch, SyncError> {
    let source = context.source;
    let repo = open(context, true)?;
    let head = branch_commit(&repo, source.config.branch.as_deref())?;
    let mut outcome = Fetch {
        cursor: Some(head.to_string()),
        ..Default::default()
    };
    let last = source.cursor.as_deref().and_then(|c| Oid::from_str(c).ok());
    if last == Some(head) {
        return Ok(outcome);
    }
    let matcher = matcher(source.config.include.as_deref())?;
    let git = |e: git2::Error| SyncError::new(format!("reading the repository: {}", e.message()));
    let new_tree = repo.find_commit(head).and_then(|c| c.tree()).map_err(git)?;
    let summary = repo
        .find_commit(head)
        .ok()
        .and_then(|c| c.summary().ok().flatten().map(str::to_string))
        .unwrap_or_default();
    let short = &head.to_string()[..10];
    let mut changed: Vec<(String, Oid)> = Vec::new();
    let incremental = last.filter(|old| repo.graph_descendant_of(head, *old).unwrap_or(false));
    match incremental {
        Some(old) => {
            let old_tree = repo.find_commit(old).and_then(|c| c.tree()).map_err(git)?;
            let diff = repo
                .diff_tree_to_tree(Some(&old_tree), Some(&new_tree), None)
                .map_err(git)?;
            for delta in diff.deltas() {
                if matches!(
                    delta.status(),
                    git2::Delta::Added
                        | git2::Delta::Modified
                        | git2::Delta::Renamed
                        | git2::Delta::Copied
                ) && let Some(path) = delta.new_file().path().and_then(Path::to_str)
                {
                    changed.push((path.to_string(), delta.new_file().id()));
                }
            }
        }
        None => {
            // First sync or history rewritten: every file; dedup drops what is known.
            new_tree
                .walk(git2::TreeWalkMode::PreOrder, |dir, entry| {
                    if entry.kind() == Some(git2::ObjectType::Blob)
                        && let Ok(name) = entry.name()
                    {
                        changed.push((format!("{dir}{name}"), entry.id()));
                    }
                    git2::TreeWalkResult::Ok
                })
                .map_err(git)?;
        }
    }
    for (path, blob) in changed {
        if !included(matcher.as_ref(), &path) {
            continue;
        }
        outcome.found.push(Found {
            dedup_key: format!("path:{path}"),
            revision: blob.to_string(),
            title: path.clone(),
            url: None,
            published: None,
            excerpt: format!("{short} {summary}"),
            payload: json!({"path": path, "blob": blob.to_string(), "commit": head.to_string()}),
        });
    }
    Ok(outcome)
}

pub fn materialize(
    context: &SyncContext<'_>,
    item: &Item,
) -> Result<Option<(String, Vec<u8>)>, SyncError> {
    let (Some(path), Some(blob)) = (item.payload["path"].as_str(), item.payload["blob"].as_str())
    else {
        return Err(SyncError::new("the item has no path or blob"));
    };
    let repo = open(context, false)?;
    let oid = Oid::from_str(blob).map_err(|e| SyncError::new(e.message().to_string()))?;
    match repo.find_blob(oid) {
        Ok(found) => Ok(Some((path.to_string(), found.content().to_vec()))),
        Err(_) => Ok(None),
    }
}
