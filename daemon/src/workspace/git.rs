//! Commits to workspace repositories, with git's index kept in step.
//!
//! People use git by hand in a workspace (commit, stash, `commit -a`, tools that commit
//! on a timer), so every commit the daemon makes follows git's own protocol: it holds
//! `.git/index.lock` (waiting a little if someone else holds it, never taking it from
//! them) while it moves HEAD's branch and rewrites the index entries of the paths it
//! committed; every other entry, the user's staged changes included, is left as it
//! was. A commit builds its tree from HEAD's tree with only the changed paths replaced,
//! and its blobs from the bytes the daemon wrote (never re-read from the disk, where an
//! editor may have saved meanwhile).
//!
//! The daemon does not write into a repository a person is in the middle of using: a
//! detached HEAD, or a merge, rebase, cherry-pick, revert, `am` or bisect in progress
//! (`Session::begin` refuses with `GitError::InUse`).

use std::collections::BTreeMap;
use std::fs::{self, File, Metadata, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use git2::{FileMode, IndexEntry, IndexTime, Oid, Repository, RepositoryState, Signature};

use super::Durable;

/// What a person is doing in a repository, as far as writes are concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GitState {
    /// On a branch, nothing in progress: writes go on.
    Clean,
    DetachedHead,
    UnbornBranch,
    Merge,
    Rebase,
    CherryPick,
    Revert,
    Bisect,
    Am,
}

impl GitState {
    /// Of `repo`, now.
    pub fn of(repo: &Repository) -> GitState {
        match repo.state() {
            RepositoryState::Clean => {}
            RepositoryState::Merge => return GitState::Merge,
            RepositoryState::Revert | RepositoryState::RevertSequence => return GitState::Revert,
            RepositoryState::CherryPick | RepositoryState::CherryPickSequence => {
                return GitState::CherryPick;
            }
            RepositoryState::Bisect => return GitState::Bisect,
            RepositoryState::Rebase
            | RepositoryState::RebaseInteractive
            | RepositoryState::RebaseMerge => return GitState::Rebase,
            RepositoryState::ApplyMailbox | RepositoryState::ApplyMailboxOrRebase => {
                return GitState::Am;
            }
        }
        if repo.head_detached().unwrap_or(false) {
            return GitState::DetachedHead;
        }
        match repo.head() {
            Err(e) if e.code() == git2::ErrorCode::UnbornBranch => GitState::UnbornBranch,
            _ => GitState::Clean,
        }
    }

    /// Stable name, for `details.git_state` and `guide`.
    pub fn name(self) -> &'static str {
        match self {
            GitState::Clean => "clean",
            GitState::DetachedHead => "detached_head",
            GitState::UnbornBranch => "unborn_branch",
            GitState::Merge => "merge",
            GitState::Rebase => "rebase",
            GitState::CherryPick => "cherry_pick",
            GitState::Revert => "revert",
            GitState::Bisect => "bisect",
            GitState::Am => "am",
        }
    }

    /// What is going on, as a sentence fragment.
    pub fn describe(self) -> &'static str {
        match self {
            GitState::Clean => "the repository is on a branch with nothing in progress",
            GitState::DetachedHead => "HEAD is detached (an old commit is checked out)",
            GitState::UnbornBranch => "the checked-out branch has no commit yet",
            GitState::Merge => "a merge is in progress",
            GitState::Rebase => "a rebase is in progress",
            GitState::CherryPick => "a cherry-pick is in progress",
            GitState::Revert => "a revert is in progress",
            GitState::Bisect => "a bisect is in progress",
            GitState::Am => "`git am` is in progress",
        }
    }

    /// How the person finishes it.
    pub fn how_to_finish(self) -> &'static str {
        match self {
            GitState::Clean => "",
            GitState::DetachedHead => {
                "go back to a branch with `git switch main` (or `git switch <branch>`)"
            }
            GitState::UnbornBranch => "switch to a branch that has commits (`git switch main`)",
            GitState::Merge => {
                "resolve the conflicts and run `git merge --continue`, or `git merge --abort`"
            }
            GitState::Rebase => "finish with `git rebase --continue`, or `git rebase --abort`",
            GitState::CherryPick => {
                "finish with `git cherry-pick --continue`, or `git cherry-pick --abort`"
            }
            GitState::Revert => "finish with `git revert --continue`, or `git revert --abort`",
            GitState::Bisect => "end it with `git bisect reset`",
            GitState::Am => "finish with `git am --continue`, or `git am --abort`",
        }
    }
}

/// The checked-out branch (`main` for `refs/heads/main`), if HEAD names one.
pub fn branch(repo: &Repository) -> Option<String> {
    let head = repo.find_reference("HEAD").ok()?;
    let target = head.symbolic_target().ok()??;
    Some(
        target
            .strip_prefix("refs/heads/")
            .unwrap_or(target)
            .to_string(),
    )
}

#[derive(Debug, thiserror::Error)]
pub enum GitError {
    #[error("git's index is locked by another git process ({}) and was not released within {:.1}s", .path.display(), .waited.as_secs_f32())]
    Locked { path: PathBuf, waited: Duration },
    #[error("{}", .0.describe())]
    InUse(GitState),
    #[error("git: {0}")]
    Git(#[from] git2::Error),
    #[error("{context}: {source}")]
    Io {
        context: &'static str,
        source: std::io::Error,
    },
}

fn io(context: &'static str) -> impl FnOnce(std::io::Error) -> GitError {
    move |source| GitError::Io { context, source }
}

/// Where alexandria records which `index.lock` is its own (inode and ctime), so that
/// after a crash it removes only its own lock, never a person's.
const OWNER_FILE: &str = "alexandria-index-lock";
/// The index being rewritten, before it is renamed over `.git/index`.
const NEXT_INDEX: &str = "alexandria-index";

fn owner_record(metadata: &Metadata) -> String {
    let mut record = format!(
        "{} {} {}",
        metadata.ino(),
        metadata.ctime(),
        metadata.ctime_nsec()
    );
    record.push_str(&" ".repeat(63usize.saturating_sub(record.len())));
    record.push('\n');
    record
}

/// `.git/index.lock`, held by alexandria; removed on drop (leaving the index as it was)
/// unless `Session::finish` put a new index in place first.
pub struct IndexLock {
    git_dir: PathBuf,
}

impl IndexLock {
    /// Create `.git/index.lock` exclusively, retrying for up to `timeout` while someone
    /// else holds it.
    pub fn acquire(git_dir: &Path, timeout: Duration) -> Result<IndexLock, GitError> {
        let path = git_dir.join("index.lock");
        let started = Instant::now();
        let mut pause = Duration::from_millis(1);
        let file = loop {
            match OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .open(&path)
            {
                Ok(file) => break file,
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                    if started.elapsed() >= timeout {
                        return Err(GitError::Locked {
                            path,
                            waited: started.elapsed(),
                        });
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(20));
                }
                Err(e) => return Err(io("creating .git/index.lock")(e)),
            }
        };
        let lock = IndexLock {
            git_dir: git_dir.to_path_buf(),
        };
        // Fixed size, written in place: no truncation (ext4 would flush on close).
        let metadata = file.metadata().map_err(io("reading .git/index.lock"))?;
        let owner = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(git_dir.join(OWNER_FILE))
            .map_err(io("recording the owner of .git/index.lock"))?;
        rustix::io::pwrite(&owner, owner_record(&metadata).as_bytes(), 0)
            .map_err(|e| io("recording the owner of .git/index.lock")(e.into()))?;
        Ok(lock)
    }
}

impl Drop for IndexLock {
    fn drop(&mut self) {
        let _ = fs::remove_file(self.git_dir.join("index.lock"));
    }
}

/// After a crash: remove `.git/index.lock` if alexandria created it (a person's lock is
/// left alone). Returns whether it did.
pub fn remove_own_stale_lock(git_dir: &Path) -> bool {
    let lock = git_dir.join("index.lock");
    let (Ok(metadata), Ok(owner)) = (
        fs::symlink_metadata(&lock),
        fs::read_to_string(git_dir.join(OWNER_FILE)),
    ) else {
        return false;
    };
    if owner.trim() != owner_record(&metadata).trim() {
        return false;
    }
    let _ = fs::remove_file(git_dir.join(NEXT_INDEX));
    fs::remove_file(&lock).is_ok()
}

/// After a crash inside a commit (alexandria's own `index.lock` was left behind): make
/// the index entries of the paths HEAD's commit changed HEAD's version, if alexandria
/// made that commit. Returns how many paths.
pub fn stage_last_commit(repo: &Repository, timeout: Duration) -> Result<usize, GitError> {
    let mut session = Session::begin(repo, timeout)?;
    let head = repo.head()?.peel_to_commit()?;
    if head.committer().name().ok() != Some("alexandria") {
        return Ok(0);
    }
    let parent = head.parent(0).ok().map(|p| p.tree()).transpose()?;
    let diff = repo.diff_tree_to_tree(parent.as_ref(), Some(&head.tree()?), None)?;
    let mut paths = Vec::new();
    for delta in diff.deltas() {
        for file in [delta.old_file(), delta.new_file()] {
            if let Some(path) = file.path().and_then(|p| p.to_str()) {
                paths.push(path.to_string());
            }
        }
    }
    paths.sort();
    paths.dedup();
    for path in &paths {
        session.stage_head_version(path)?;
    }
    session.finish()?;
    Ok(paths.len())
}

/// One path changed by a commit: its new content (with the stat data of the file the
/// daemon wrote, for git's index), or gone.
pub struct Change<'a> {
    pub path: &'a str,
    pub content: Content<'a>,
    pub stat: Option<&'a Metadata>,
}

/// The content of a changed path.
pub enum Content<'a> {
    /// These bytes (a blob is made of them).
    Bytes(&'a [u8]),
    /// A blob already written (`Repository::blob`).
    Blob(Oid),
    /// The path is gone.
    Gone,
}

impl<'a> Content<'a> {
    /// `Bytes`, or `Gone` for None.
    pub fn of(bytes: Option<&'a [u8]>) -> Content<'a> {
        bytes.map_or(Content::Gone, Content::Bytes)
    }
}

/// What the index entry of a touched path becomes.
enum Entry {
    Blob { id: Oid, stat: Option<Metadata> },
    Gone,
}

/// The daemon at work in a repository: holds git's index lock; commits move HEAD's
/// branch; `finish` writes the index entries of every path committed, then releases
/// the lock. Dropped without `finish`, the index is left as it was.
pub struct Session<'r> {
    repo: &'r Repository,
    lock: IndexLock,
    timeout: Duration,
    touched: BTreeMap<String, Entry>,
    /// Object files, refs and the index this session wrote: what must be flushed.
    written: Durable,
}

impl<'r> Session<'r> {
    /// Take git's index lock (waiting up to `timeout`) and check that nobody is in the
    /// middle of something in the repository.
    pub fn begin(repo: &'r Repository, timeout: Duration) -> Result<Session<'r>, GitError> {
        let lock = IndexLock::acquire(repo.path(), timeout)?;
        match GitState::of(repo) {
            GitState::Clean => Ok(Session {
                repo,
                lock,
                timeout,
                touched: BTreeMap::new(),
                written: Durable::default(),
            }),
            state => Err(GitError::InUse(state)),
        }
    }

    pub fn repo(&self) -> &'r Repository {
        self.repo
    }

    /// Commit `changes` on top of HEAD (its branch moves). Returns the commit id.
    pub fn commit(
        &mut self,
        changes: &[Change<'_>],
        message: &str,
        author: &Signature<'_>,
    ) -> Result<Oid, GitError> {
        let repo = self.repo;
        let mut entries = Vec::with_capacity(changes.len());
        for change in changes {
            let entry = match change.content {
                Content::Bytes(bytes) => Entry::Blob {
                    id: repo.blob(bytes)?,
                    stat: change.stat.cloned(),
                },
                Content::Blob(id) => Entry::Blob {
                    id,
                    stat: change.stat.cloned(),
                },
                Content::Gone => Entry::Gone,
            };
            entries.push((change.path.to_string(), entry));
        }
        let committer = Signature::now("alexandria", "alexandria@localhost")?;
        // git commands that move a ref after releasing the index lock (`reset`, `stash`)
        // may hold the branch's ref lock, or move HEAD, for a moment: wait, then build
        // on the new HEAD.
        let started = Instant::now();
        let mut pause = Duration::from_millis(1);
        loop {
            let head = repo.head()?.peel_to_commit()?;
            let mut update = git2::build::TreeUpdateBuilder::new();
            for (path, entry) in &entries {
                match entry {
                    Entry::Blob { id, .. } => {
                        update.upsert(path.as_str(), *id, FileMode::Blob);
                    }
                    Entry::Gone => {
                        update.remove(path.as_str());
                    }
                }
            }
            let tree = repo.find_tree(update.create_updated(repo, &head.tree()?)?)?;
            match repo.commit(Some("HEAD"), author, &committer, message, &tree, &[&head]) {
                Ok(id) => {
                    self.record_written(id, &entries)?;
                    self.touched.extend(entries);
                    return Ok(id);
                }
                Err(e)
                    if matches!(
                        e.code(),
                        git2::ErrorCode::Locked | git2::ErrorCode::Modified
                    ) && started.elapsed() < self.timeout =>
                {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(20));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Remember the files commit `id` wrote: its loose objects (the commit, the trees
    /// along each changed path, the blobs) and the branch's ref.
    fn record_written(&mut self, id: Oid, entries: &[(String, Entry)]) -> Result<(), GitError> {
        let repo = self.repo;
        let objects = repo.path().join("objects");
        let mut ids = vec![id];
        let commit = repo.find_commit(id)?;
        let tree = commit.tree()?;
        ids.push(tree.id());
        for (path, entry) in entries {
            if let Entry::Blob { id, .. } = entry {
                ids.push(*id);
            }
            let mut prefix = Path::new(path.as_str()).parent();
            while let Some(dir) = prefix.filter(|d| !d.as_os_str().is_empty()) {
                if let Ok(found) = tree.get_path(dir) {
                    ids.push(found.id());
                }
                prefix = dir.parent();
            }
        }
        for id in ids {
            let hex = id.to_string();
            // Already packed (or written by someone else): no loose file, nothing to do.
            self.written.file(objects.join(&hex[..2]).join(&hex[2..]));
        }
        self.written.dir(objects);
        let head = repo.find_reference("HEAD")?;
        if let Some(name) = head.symbolic_target()? {
            let git_dir = repo.path();
            let file = git_dir.join(name);
            self.written.parents_up_to(&file, &git_dir.join("refs"));
            self.written.file(file);
        }
        Ok(())
    }

    /// Make the index entry of `path` HEAD's version (after a commit made by an earlier
    /// session that crashed before its index was written, or a roll-back).
    pub fn stage_head_version(&mut self, path: &str) -> Result<(), GitError> {
        let tree = self.repo.head()?.peel_to_tree()?;
        let entry = match tree.get_path(Path::new(path)) {
            Ok(entry) => Entry::Blob {
                id: entry.id(),
                stat: None,
            },
            Err(e) if e.code() == git2::ErrorCode::NotFound => Entry::Gone,
            Err(e) => return Err(e.into()),
        };
        self.touched.insert(path.to_string(), entry);
        Ok(())
    }

    /// Move HEAD's branch from `from` to `target` (a merge or fast-forward made by sync,
    /// whose files are in place already) and make the index entries of `paths` the
    /// target's versions (with the stat data of the files written, when known).
    pub fn advance(
        &mut self,
        from: Oid,
        target: Oid,
        paths: &[(String, Option<Metadata>)],
    ) -> Result<(), GitError> {
        let repo = self.repo;
        let name = repo
            .head()?
            .name()
            .map(str::to_string)
            .map_err(|_| git2::Error::from_str("HEAD names no branch"))?;
        let started = Instant::now();
        let mut pause = Duration::from_millis(1);
        loop {
            let current = repo.refname_to_id(&name)?;
            if current == target {
                break;
            }
            match repo.reference_matching(&name, target, true, from, "alexandria: sync") {
                Ok(_) => break,
                Err(e)
                    if matches!(
                        e.code(),
                        git2::ErrorCode::Locked | git2::ErrorCode::Modified
                    ) && started.elapsed() < self.timeout =>
                {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(20));
                }
                Err(e) => return Err(e.into()),
            }
        }
        let tree = repo.find_commit(target)?.tree()?;
        for (path, stat) in paths {
            let entry = match tree.get_path(Path::new(path)) {
                Ok(entry) => Entry::Blob {
                    id: entry.id(),
                    stat: stat.clone(),
                },
                Err(e) if e.code() == git2::ErrorCode::NotFound => Entry::Gone,
                Err(e) => return Err(e.into()),
            };
            self.touched.insert(path.clone(), entry);
        }
        Ok(())
    }

    /// Move HEAD's branch back to `target` (a roll-back of the daemon's own commit).
    pub fn reset_soft(&mut self, target: &git2::Commit<'_>) -> Result<(), GitError> {
        self.repo
            .reset(target.as_object(), git2::ResetType::Soft, None)?;
        Ok(())
    }

    /// Write the index entries of every path committed in this session (the rest of the
    /// index untouched), put the new index in place and release the lock. Returns what
    /// the session wrote, for the flush before the write is acknowledged.
    pub fn finish(self) -> Result<Durable, GitError> {
        if self.touched.is_empty() {
            return Ok(self.written);
        }
        let git_dir = self.repo.path();
        let current = git_dir.join("index");
        let next = git_dir.join(NEXT_INDEX);
        let _ = fs::remove_file(&next);
        let mut index = match fs::hard_link(&current, &next) {
            Ok(()) => git2::Index::open(&next)?,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                // No index at all (deleted by hand): start from HEAD's tree.
                let mut index = git2::Index::open(&next)?;
                index.read_tree(&self.repo.head()?.peel_to_tree()?)?;
                index
            }
            Err(e) => return Err(io("reading git's index")(e)),
        };
        for (path, entry) in &self.touched {
            match entry {
                Entry::Blob { id, stat } => index.add(&index_entry(path, *id, stat.as_ref()))?,
                Entry::Gone => match index.remove_path(Path::new(path)) {
                    Ok(()) => {}
                    Err(e) if e.code() == git2::ErrorCode::NotFound => {}
                    Err(e) => return Err(e.into()),
                },
            }
        }
        // Written to `alexandria-index.lock`, renamed to `alexandria-index`.
        index.write()?;
        fs::rename(&next, &current).map_err(io("replacing git's index"))?;
        drop(self.lock);
        let mut written = self.written;
        written.file(current);
        Ok(written)
    }
}

fn index_entry(path: &str, id: Oid, stat: Option<&Metadata>) -> IndexEntry {
    // Stat data of the file the daemon wrote lets `git status` trust the entry without
    // hashing the file; without it (zeros) git re-checks the file's content.
    let (ctime, mtime, dev, ino, uid, gid, size) = match stat {
        Some(m) => (
            IndexTime::new(m.ctime() as i32, m.ctime_nsec() as u32),
            IndexTime::new(m.mtime() as i32, m.mtime_nsec() as u32),
            m.dev() as u32,
            m.ino() as u32,
            m.uid(),
            m.gid(),
            m.size() as u32,
        ),
        None => (IndexTime::new(0, 0), IndexTime::new(0, 0), 0, 0, 0, 0, 0),
    };
    IndexEntry {
        ctime,
        mtime,
        dev,
        ino,
        mode: u32::from(FileMode::Blob),
        uid,
        gid,
        file_size: size,
        id,
        flags: 0,
        flags_extended: 0,
        path: path.as_bytes().to_vec(),
    }
}

/// The stat data of an open file (for `Change::stat`).
pub fn stat_of(file: &File) -> Option<Metadata> {
    file.metadata().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo_with_one_commit(root: &Path) -> Repository {
        let repo = Repository::init(root).expect("init");
        std::fs::write(root.join("a.md"), "a").expect("write");
        let mut index = repo.index().expect("index");
        index.add_path(Path::new("a.md")).expect("add");
        index.write().expect("write index");
        {
            let tree = repo
                .find_tree(index.write_tree().expect("tree"))
                .expect("tree");
            let me = Signature::now("t", "t@t").expect("sig");
            repo.commit(Some("HEAD"), &me, &me, "init", &tree, &[])
                .expect("commit");
        }
        repo
    }

    #[test]
    fn commits_keep_the_index_in_step_and_leave_staged_entries_alone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        let repo = repo_with_one_commit(root);
        // A person stages a file of their own.
        std::fs::write(root.join("mine.txt"), "mine").expect("write");
        let mut index = repo.index().expect("index");
        index.add_path(Path::new("mine.txt")).expect("add");
        index.write().expect("write index");

        std::fs::create_dir_all(root.join("wiki/deep")).expect("dir");
        std::fs::write(root.join("wiki/deep/b.md"), "b").expect("write");
        let stat = std::fs::metadata(root.join("wiki/deep/b.md")).expect("stat");
        std::fs::remove_file(root.join("a.md")).expect("rm");
        let me = Signature::now("t", "t@t").expect("sig");
        let mut session = Session::begin(&repo, Duration::from_millis(10)).expect("begin");
        session
            .commit(
                &[
                    Change {
                        path: "wiki/deep/b.md",
                        content: Content::Bytes(b"b"),
                        stat: Some(&stat),
                    },
                    Change {
                        path: "a.md",
                        content: Content::Gone,
                        stat: None,
                    },
                ],
                "change",
                &me,
            )
            .expect("commit");
        session.finish().expect("finish");
        assert!(!root.join(".git/index.lock").exists());
        let head = repo.head().expect("head").peel_to_tree().expect("tree");
        assert!(head.get_path(Path::new("wiki/deep/b.md")).is_ok());
        assert!(head.get_path(Path::new("a.md")).is_err());
        let statuses = repo.statuses(None).expect("status");
        let dirty: Vec<String> = statuses
            .iter()
            .map(|s| format!("{:?} {}", s.status(), s.path().unwrap_or("")))
            .collect();
        assert_eq!(dirty, vec!["Status(INDEX_NEW) mine.txt".to_string()]);
    }

    #[test]
    fn someone_elses_lock_is_left_alone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = repo_with_one_commit(dir.path());
        let lock = repo.path().join("index.lock");
        std::fs::write(&lock, "theirs").expect("lock");
        match Session::begin(&repo, Duration::from_millis(30)) {
            Err(GitError::Locked { .. }) => {}
            other => panic!("expected Locked, got {:?}", other.err()),
        }
        assert!(!remove_own_stale_lock(repo.path()));
        assert_eq!(std::fs::read_to_string(&lock).expect("lock"), "theirs");
        std::fs::remove_file(&lock).expect("rm");
        // Our own lock, left by a crash, is recognised.
        let own = IndexLock::acquire(repo.path(), Duration::from_millis(10)).expect("lock");
        std::mem::forget(own);
        assert!(remove_own_stale_lock(repo.path()));
        assert!(!lock.exists());
    }
}
