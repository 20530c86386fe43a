//! Pages a `git commit` made by hand dropped from HEAD or from git's index (issue 20).
//!
//! `git commit` reads `.git/index` before it takes `.git/index.lock`, and then writes the
//! copy it read back into the index (it does whenever the index's cache of trees is not
//! complete, which it never is after another program or `git add` changed the index).
//! When the daemon commits in between, that copy lacks the daemon's newest pages:
//! - the commit then usually fails ("cannot lock ref 'HEAD'": HEAD moved since it read
//!   it), but git's index no longer has the pages (`git status`: `D` and `??`);
//! - the person's next `git commit` (or a commit that read HEAD late enough) records a
//!   tree without them on top of the daemon's commit: it deletes them from HEAD.
//!
//! Nothing the daemon does can keep git from writing that copy (two `git` processes do
//! the same to each other), so the daemon looks for the damage and repairs it: a page
//! that a recent commit of alexandria's set, that the disk still holds exactly as
//! alexandria committed it, but that HEAD (after a commit by someone else, at most
//! `RACE_SECS` after alexandria's) or git's index no longer has. HEAD gets it back by a
//! new commit (`commit::restore`), the index by restaging it. A person who removes or
//! changes such a page changes the disk too (`git rm`, an edit, a checkout), so their
//! change is never undone.
//!
//! The check reads HEAD's recent history and the index only when either changed since
//! the daemon last saw them consistent (`Seen`, remembered per repository).

use std::collections::{HashMap, HashSet};
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{LazyLock, Mutex};

use git2::{ObjectType, Oid, Repository};

/// How far below HEAD the check looks for alexandria's commits (at most; it stops at
/// commits older than the index's last write by more than `RACE_SECS`).
const DEPTH: usize = 256;
/// A commit by someone else this long after alexandria's commit of a page can have been
/// made from an index read before alexandria's commit.
pub const RACE_SECS: i64 = 120;

/// HEAD's branch value and the index file's identity: what the daemon last saw
/// consistent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    head: Option<Oid>,
    index: Option<(u64, u64, i64, i64, i64, i64)>,
}

static SEEN: LazyLock<Mutex<HashMap<PathBuf, Seen>>> = LazyLock::new(Mutex::default);

/// HEAD and the index of `repo` now.
pub fn seen_now(repo: &Repository) -> Seen {
    seen_at(repo, repo.head().ok().and_then(|h| h.target()))
}

/// `seen_now` with HEAD's commit as the caller just read or wrote it (under git's
/// index lock): only the index is looked at.
pub fn seen_at(repo: &Repository, head: Option<Oid>) -> Seen {
    let index = fs::metadata(repo.path().join("index")).ok().map(|m| {
        (
            m.ino(),
            m.size(),
            m.mtime(),
            m.mtime_nsec(),
            m.ctime(),
            m.ctime_nsec(),
        )
    });
    Seen { head, index }
}

/// Whether `seen` is what the daemon last saw consistent in `repo`. Before this process
/// saw `repo` consistent itself, what the last clean stop kept (`persist`) counts.
pub fn is_known(repo: &Repository, seen: &Seen) -> bool {
    let mut known = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(known) = known.get(repo.path()) {
        return known == seen;
    }
    let kept = fs::read_to_string(repo.path().join(SEEN_FILE))
        .ok()
        .and_then(|text| Seen::parse(&text));
    if kept.as_ref() == Some(seen) {
        known.insert(repo.path().to_path_buf(), seen.clone());
        return true;
    }
    false
}

/// Where a clean stop keeps what the daemon last saw consistent, for the next start:
/// with HEAD and git's index (the file itself: inode, size, times) still as they were,
/// no hand commit has dropped anything since, and the start-up check need not walk the
/// last 256 commits (1.7 s at 100k pages after a stream of writes).
const SEEN_FILE: &str = "alexandria-seen";

impl Seen {
    fn to_text(&self) -> String {
        let head = self
            .head
            .map_or_else(|| "-".to_string(), |id| id.to_string());
        match self.index {
            Some((ino, size, mtime, mtime_ns, ctime, ctime_ns)) => {
                format!("{head} {ino} {size} {mtime} {mtime_ns} {ctime} {ctime_ns}\n")
            }
            None => format!("{head} -\n"),
        }
    }

    fn parse(text: &str) -> Option<Seen> {
        let mut parts = text.split_whitespace();
        let head = match parts.next()? {
            "-" => None,
            id => Some(Oid::from_str(id).ok()?),
        };
        let rest: Vec<&str> = parts.collect();
        let index = match rest.as_slice() {
            ["-"] => None,
            [ino, size, mtime, mtime_ns, ctime, ctime_ns] => Some((
                ino.parse().ok()?,
                size.parse().ok()?,
                mtime.parse().ok()?,
                mtime_ns.parse().ok()?,
                ctime.parse().ok()?,
                ctime_ns.parse().ok()?,
            )),
            _ => return None,
        };
        Some(Seen { head, index })
    }
}

/// At a clean stop (git's indexes written): keep what the daemon last saw consistent in
/// `repo` for the next start when HEAD and the index are still that; otherwise remove
/// what an earlier stop kept. Best effort: without the file the next start checks.
pub fn persist(repo: &Repository) {
    let path = repo.path().join(SEEN_FILE);
    let now = seen_now(repo);
    let consistent = SEEN
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(repo.path())
        .is_some_and(|known| *known == now);
    if !consistent {
        let _ = fs::remove_file(&path);
        return;
    }
    let temp = path.with_extension("tmp");
    let written = fs::write(&temp, now.to_text()).and_then(|()| fs::rename(&temp, &path));
    if let Err(error) = written {
        tracing::debug!(%error, "cannot keep what the daemon saw consistent");
        let _ = fs::remove_file(&temp);
    }
}

/// Remember `seen` as consistent (nothing dropped).
pub fn remember(repo: &Repository, seen: Seen) {
    SEEN.lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(repo.path().to_path_buf(), seen);
}

/// A page alexandria committed that HEAD or the index lost while the disk kept it.
#[derive(Debug, Clone)]
pub struct Dropped {
    pub path: String,
    /// Its version as alexandria committed it (None: alexandria deleted it).
    pub blob: Option<Oid>,
    /// alexandria's commit that holds that version.
    pub commit: Oid,
    /// The commit by someone else that dropped it from HEAD (None: HEAD has it, only
    /// the index lost it).
    pub by: Option<Oid>,
}

impl Dropped {
    /// HEAD lacks the version (not only the index).
    pub fn from_head(&self) -> bool {
        self.by.is_some()
    }
}

/// The blob id of the file at `path` (None: no file).
fn on_disk(path: &Path) -> Option<Oid> {
    let bytes = fs::read(path).ok()?;
    Oid::hash_object(ObjectType::Blob, &bytes).ok()
}

/// The pages alexandria committed lately that HEAD or git's index dropped while the disk
/// still holds them as committed. Reads only; the caller repairs under the locks.
pub fn find(repo: &Repository, root: &Path) -> Result<Vec<Dropped>, git2::Error> {
    let Ok(head) = repo.head().and_then(|h| h.peel_to_commit()) else {
        return Ok(Vec::new());
    };
    let head_tree = head.tree()?;
    // An index of its own, freed on return: `repo.index()` is the repository's, which
    // libgit2 keeps for the repository's life, and the daemon keeps each workspace's
    // repository open (at 100k pages that index held about 15 MB).
    let index = git2::Index::open(&repo.path().join("index"))?;
    let mut decided: HashSet<String> = HashSet::new();
    let mut found = Vec::new();
    // The nearest commit above by someone else, with its time.
    let mut foreign: Option<(Oid, i64)> = None;
    // Pages are dropped by a commit racing the daemon; whoever dropped them wrote the
    // index, so nothing older than that write's race window is looked at.
    let index_time = fs::metadata(repo.path().join("index"))
        .ok()
        .map(|m| m.mtime());
    let mut cursor = head;
    for _ in 0..DEPTH {
        let time = cursor.time().seconds();
        if index_time.is_some_and(|at| time < at - RACE_SECS)
            && foreign.is_none_or(|(_, at)| time < at - RACE_SECS)
        {
            break;
        }
        let parent = cursor.parent(0).ok();
        let ours = cursor.committer().name().ok() == Some("alexandria");
        if !ours {
            foreign = Some((cursor.id(), cursor.time().seconds()));
        } else {
            let tree = cursor.tree()?;
            let before = parent.as_ref().map(|p| p.tree()).transpose()?;
            let diff = repo.diff_tree_to_tree(before.as_ref(), Some(&tree), None)?;
            for delta in diff.deltas() {
                let Some(path) = delta.new_file().path().or(delta.old_file().path()) else {
                    continue;
                };
                let Some(path) = path.to_str().map(str::to_string) else {
                    continue;
                };
                // The newest commit of alexandria's that touched the page decides.
                if !decided.insert(path.clone()) {
                    continue;
                }
                let blob = tree.get_path(Path::new(&path)).ok().map(|e| e.id());
                if on_disk(&root.join(&path)) != blob {
                    // Changed on disk since (an editor, a person): not ours to repair.
                    continue;
                }
                let in_head = head_tree.get_path(Path::new(&path)).ok().map(|e| e.id());
                if in_head != blob {
                    // Someone else's commit above changed it while the disk kept
                    // alexandria's version: dropped, if that commit came soon after.
                    if let Some((by, at)) = foreign
                        && at - cursor.time().seconds() <= RACE_SECS
                    {
                        found.push(Dropped {
                            path,
                            blob,
                            commit: cursor.id(),
                            by: Some(by),
                        });
                    }
                    continue;
                }
                let staged = index.get_path(Path::new(&path), 0).map(|e| e.id);
                if staged != blob {
                    found.push(Dropped {
                        path,
                        blob,
                        commit: cursor.id(),
                        by: None,
                    });
                }
            }
        }
        match parent {
            Some(parent) => cursor = parent,
            None => break,
        }
    }
    Ok(found)
}

/// How long after it happened a branch rewound by a racing `git reset` is repaired.
const REWIND_SECS: i64 = 3600;

/// alexandria's commits that a `git reset` racing them dropped from HEAD's branch.
///
/// `git reset` (and `git stash`, which runs `git reset --hard`) resolves its target,
/// `HEAD`, when it starts, and moves the branch to it at the end without checking that
/// the branch still is where it was (git's own reset reads the branch again just
/// before its update). When the daemon commits in between, the branch goes back below
/// the daemon's commits ("reset: moving to HEAD", yet it moved) and a hard reset also
/// puts the files back as they were before them: acknowledged writes gone from HEAD
/// and from disk. A reset to `HEAD` never means to move the branch, so its reflog entry
/// is the proof of the race.
#[derive(Debug, Clone)]
pub struct Rewound {
    /// The branch before the reset: the newest dropped commit.
    pub from: Oid,
    /// Where the reset moved it (what `HEAD` was when the reset started).
    pub to: Oid,
    /// The dropped commits, newest first (all alexandria's).
    pub commits: Vec<Oid>,
}

/// The rewinds of HEAD's branch in its reflog (the last hour) that are not repaired:
/// the dropped commits are neither in HEAD's history nor named by a restore commit
/// there (`message::REWOUND`).
pub fn rewound(repo: &Repository) -> Result<Vec<Rewound>, git2::Error> {
    let Ok(head) = repo.head() else {
        return Ok(Vec::new());
    };
    let (Ok(branch), Some(tip)) = (head.name().map(str::to_string), head.target()) else {
        return Ok(Vec::new());
    };
    let Ok(reflog) = repo.reflog(&branch) else {
        return Ok(Vec::new());
    };
    let now = chrono::Utc::now().timestamp();
    let mut found = Vec::new();
    for entry in reflog.iter().take(DEPTH) {
        if entry.committer().when().seconds() < now - REWIND_SECS {
            break;
        }
        if !matches!(entry.message(), Ok(Some("reset: moving to HEAD"))) {
            continue;
        }
        let (from, to) = (entry.id_old(), entry.id_new());
        if from == to || from.is_zero() || to.is_zero() {
            continue;
        }
        // The commits between: alexandria's only, down to where the reset went.
        let mut commits = Vec::new();
        let mut cursor = repo.find_commit(from)?;
        let mut reached = false;
        for _ in 0..DEPTH {
            if cursor.id() == to {
                reached = true;
                break;
            }
            if cursor.committer().name().ok() != Some("alexandria") {
                break;
            }
            commits.push(cursor.id());
            match cursor.parent(0) {
                Ok(parent) => cursor = parent,
                Err(_) => break,
            }
        }
        if !reached || commits.is_empty() {
            continue;
        }
        // Back in HEAD's history (a reset to ORIG_HEAD, or repaired): nothing to do.
        if tip == from || repo.graph_descendant_of(tip, from).unwrap_or(false) {
            continue;
        }
        found.push(Rewound { from, to, commits });
    }
    if found.is_empty() {
        return Ok(found);
    }
    // Repaired already: a restore commit in HEAD's recent history names the tip.
    let mut repaired = HashSet::new();
    let mut cursor = repo.find_commit(tip)?;
    for _ in 0..DEPTH {
        if let Some(named) = crate::workspace::message::rewound_tip(cursor.message().unwrap_or(""))
        {
            repaired.insert(named);
        }
        match cursor.parent(0) {
            Ok(parent) => cursor = parent,
            Err(_) => break,
        }
    }
    found.retain(|r| !repaired.contains(&r.from.to_string()));
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use git2::Signature;

    fn commit(repo: &Repository, who: &str, files: &[(&str, Option<&str>)]) -> Oid {
        let root = repo.workdir().expect("workdir").to_path_buf();
        let mut index = repo.index().expect("index");
        index.read(true).expect("read");
        for (path, content) in files {
            match content {
                Some(text) => {
                    let file = root.join(path);
                    fs::create_dir_all(file.parent().expect("parent")).expect("dir");
                    fs::write(&file, text).expect("write");
                    index.add_path(Path::new(path)).expect("add");
                }
                None => {
                    index.remove_path(Path::new(path)).expect("remove");
                }
            }
        }
        index.write().expect("write index");
        let tree = repo
            .find_tree(index.write_tree().expect("tree"))
            .expect("tree");
        let me = Signature::now(who, "x@x").expect("sig");
        let parents: Vec<git2::Commit<'_>> = repo
            .head()
            .ok()
            .and_then(|h| h.peel_to_commit().ok())
            .into_iter()
            .collect();
        let parents: Vec<&git2::Commit<'_>> = parents.iter().collect();
        repo.commit(Some("HEAD"), &me, &me, "c", &tree, &parents)
            .expect("commit")
    }

    /// What a clean stop keeps counts at the next start (a process that never saw the
    /// repository), and only while HEAD and the index are still as they were.
    #[test]
    fn what_a_clean_stop_kept_counts_until_head_or_the_index_changes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = Repository::init(dir.path()).expect("init");
        commit(&repo, "alexandria", &[("wiki/p.md", Some("p"))]);
        let forget = |repo: &Repository| {
            SEEN.lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(repo.path());
        };
        // Never seen consistent: nothing kept.
        persist(&repo);
        assert!(!repo.path().join(SEEN_FILE).exists());
        remember(&repo, seen_now(&repo));
        persist(&repo);
        forget(&repo);
        assert!(is_known(&repo, &seen_now(&repo)), "kept by the stop");
        // A hand commit while the daemon was stopped: checked again.
        forget(&repo);
        commit(&repo, "Hand", &[("wiki/h.md", Some("h"))]);
        assert!(!is_known(&repo, &seen_now(&repo)));
        // An index written again (same HEAD): checked again.
        remember(&repo, seen_now(&repo));
        persist(&repo);
        forget(&repo);
        std::thread::sleep(std::time::Duration::from_millis(20));
        let mut index = repo.index().expect("index");
        index.read(true).expect("read");
        index.write().expect("write");
        assert!(!is_known(&repo, &seen_now(&repo)));
        // A stop that finds them changed since removes what an earlier one kept.
        persist(&repo);
        assert!(!repo.path().join(SEEN_FILE).exists());
        assert_eq!(Seen::parse("junk"), None);
    }

    #[test]
    fn a_hand_commit_from_a_stale_index_is_found_and_a_deliberate_one_is_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = Repository::init(dir.path()).expect("init");
        commit(&repo, "Hand", &[("wiki/a.md", Some("a"))]);
        let ours = commit(&repo, "alexandria", &[("wiki/p.md", Some("p"))]);
        commit(&repo, "alexandria", &[("wiki/q.md", Some("q"))]);
        assert!(find(&repo, dir.path()).expect("find").is_empty());
        // A stale index: the person's commit drops p.md from HEAD and the index; the
        // file stays on disk.
        let mut index = repo.index().expect("index");
        index.remove_path(Path::new("wiki/p.md")).expect("rm");
        index.write().expect("write");
        let hand = commit(&repo, "Hand", &[("wiki/h.md", Some("h"))]);
        let found = find(&repo, dir.path()).expect("find");
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].path, "wiki/p.md");
        assert_eq!(found[0].commit, ours);
        assert_eq!(found[0].by, Some(hand));
        // A person who removes the page removes the file too: theirs to decide.
        fs::remove_file(dir.path().join("wiki/p.md")).expect("rm");
        assert!(find(&repo, dir.path()).expect("find").is_empty());
        // Only the index lost q.md (a failed `git commit` wrote its old copy back).
        let mut index = repo.index().expect("index");
        index.read(true).expect("read");
        index.remove_path(Path::new("wiki/q.md")).expect("rm");
        index.write().expect("write");
        let found = find(&repo, dir.path()).expect("find");
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].path, "wiki/q.md");
        assert!(!found[0].from_head());
    }
}
