//! Commits to workspace repositories, with git's index kept in step.
//!
//! People use git by hand in a workspace (commit, stash, `commit -a`, tools that commit
//! on a timer), so every commit the daemon makes follows git's own protocol: it holds
//! `.git/index.lock` (waiting a little if someone else holds it, never taking it from
//! them) while it rewrites the index entries of the paths it committed (every other
//! entry, the user's staged changes included, is left as it was) and then moves HEAD's
//! branch, once per session, with a compare-and-swap (see `Session` for why in that
//! order). A commit builds its tree from HEAD's tree with only the changed paths replaced,
//! and its blobs from the bytes the daemon wrote (never re-read from the disk, where an
//! editor may have saved meanwhile).
//!
//! A group commit leaves git's index unwritten (`Session::defer_index`): the session's
//! entries and `.git/index.lock` are kept (`Held`) for the next session, which goes on
//! from them without taking the lock again, and the index is written once the
//! workspace's writes pause (`settle`, from `commit::group`'s settler). Nobody else can
//! read the index meanwhile: the daemon holds its lock, as it does during a session;
//! `git status` (which does not need the lock) shows the daemon's newest pages as staged
//! the other way for that moment. The commit the index on disk still matches is
//! recorded in `.git/alexandria-index-base` before HEAD's branch moves past it, so that
//! after a crash recovery stages every path changed since (`stage_last_commit`).
//!
//! The daemon does not write into a repository a person is in the middle of using: a
//! detached HEAD, or a merge, rebase, cherry-pick, revert, `am` or bisect in progress
//! (`Session::begin` refuses with `GitError::InUse`).

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::fs::{self, File, Metadata, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

use git2::{FileMode, IndexEntry, IndexTime, Oid, Repository, RepositoryState, Signature};

use super::{Durable, dropped, gitindex, gittree};

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
        match GitState::in_progress(repo) {
            GitState::Clean => {}
            state => return state,
        }
        if repo.head_detached().unwrap_or(false) {
            return GitState::DetachedHead;
        }
        match repo.head() {
            Err(e) if e.code() == git2::ErrorCode::UnbornBranch => GitState::UnbornBranch,
            _ => GitState::Clean,
        }
    }

    /// What git says is in progress (a merge, a rebase...), HEAD left aside.
    fn in_progress(repo: &Repository) -> GitState {
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
        GitState::Clean
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
    #[error("HEAD's branch was moved by another git command while alexandria was committing")]
    Moved,
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

/// Where alexandria records which `index.lock` is its own (the token its lock holds), so
/// that after a crash it removes only its own lock, never a person's.
const OWNER_FILE: &str = "alexandria-index-lock";
/// The lock's content before it becomes `index.lock` (linked there, never renamed):
/// `alexandria-index-lock.new-<pid>-<n>`.
const LOCK_TEMP: &str = "alexandria-index-lock.new";
/// The index being rewritten, before it is renamed over `.git/index`.
const NEXT_INDEX: &str = "alexandria-index";
/// libgit2's lock file while it writes `NEXT_INDEX`.
const NEXT_INDEX_LOCK: &str = "alexandria-index.lock";

/// A token no other lock file holds (process, time, counter), and the name of the file
/// the lock is written under before it is linked to `index.lock` (one per attempt, so
/// that two threads never share it).
fn lock_token() -> (String, String) {
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let pid = std::process::id();
    (
        format!("alexandria {pid} {now} {n}"),
        format!("{LOCK_TEMP}-{pid}-{n}"),
    )
}

/// `.git/index.lock`, held by alexandria; removed on drop (leaving the index as it was)
/// unless `Session::finish` put a new index in place first.
pub struct IndexLock {
    git_dir: PathBuf,
}

impl IndexLock {
    /// Create `.git/index.lock` exclusively, retrying for up to `timeout` while someone
    /// else holds it.
    ///
    /// The lock's token is recorded in `alexandria-index-lock` before the lock exists,
    /// and the lock appears with the token in it (a file written under a name of our own,
    /// then hard-linked to `index.lock`, which fails if it exists): whenever the daemon
    /// dies, a lock it leaves holds the recorded token, and recovery removes it. (Before,
    /// a kill between creating the lock and recording it left a lock recovery took for
    /// someone else's: the workspace refused every write until a person removed it.)
    pub fn acquire(git_dir: &Path, timeout: Duration) -> Result<IndexLock, GitError> {
        let path = git_dir.join("index.lock");
        let (token, temp) = lock_token();
        let record = |what: &str| -> Result<(), GitError> {
            let mut text = what.to_string();
            text.push_str(&" ".repeat(127usize.saturating_sub(text.len())));
            text.push('\n');
            // Fixed size, written in place: no truncation (ext4 would flush on close).
            let owner = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o644)
                .open(git_dir.join(OWNER_FILE))
                .map_err(io("recording the owner of .git/index.lock"))?;
            rustix::io::pwrite(&owner, text.as_bytes(), 0)
                .map_err(|e| io("recording the owner of .git/index.lock")(e.into()))?;
            Ok(())
        };
        let temp = git_dir.join(temp);
        let started = Instant::now();
        let mut pause = Duration::from_millis(1);
        let mut linked = true;
        loop {
            let taken = if linked {
                record(&token)?;
                fs::write(&temp, &token)
                    .map_err(io("creating .git/index.lock"))
                    .map(|()| fs::hard_link(&temp, &path))
            } else {
                // A file system without hard links: create it and write the token
                // (a kill in between leaves a lock recovery does not recognise).
                Ok(OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o644)
                    .open(&path)
                    .and_then(|mut file| {
                        record(&token).map_err(|e| std::io::Error::other(e.to_string()))?;
                        std::io::Write::write_all(&mut file, token.as_bytes())
                    }))
            };
            match taken? {
                Ok(()) => break,
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                    if started.elapsed() >= timeout {
                        let _ = fs::remove_file(&temp);
                        return Err(GitError::Locked {
                            path,
                            waited: started.elapsed(),
                        });
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(20));
                }
                Err(e) if linked && e.kind() != ErrorKind::NotFound => {
                    linked = false;
                }
                Err(e) => {
                    let _ = fs::remove_file(&temp);
                    return Err(io("creating .git/index.lock")(e));
                }
            }
        }
        let _ = fs::remove_file(&temp);
        Ok(IndexLock {
            git_dir: git_dir.to_path_buf(),
        })
    }
}

impl Drop for IndexLock {
    fn drop(&mut self) {
        let _ = fs::remove_file(self.git_dir.join("index.lock"));
    }
}

/// After a crash: remove `.git/index.lock` if alexandria created it (it holds the token
/// alexandria recorded; a person's lock is left alone). Returns whether it did.
pub fn remove_own_stale_lock(git_dir: &Path) -> bool {
    if let Ok(entries) = fs::read_dir(git_dir) {
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with(LOCK_TEMP) {
                let _ = fs::remove_file(entry.path());
            }
        }
    }
    let lock = git_dir.join("index.lock");
    let (Ok(content), Ok(owner)) = (
        fs::read(&lock),
        fs::read_to_string(git_dir.join(OWNER_FILE)),
    ) else {
        return false;
    };
    let owner = owner.trim();
    if owner.is_empty() || content != owner.as_bytes() {
        return false;
    }
    let _ = fs::remove_file(git_dir.join(NEXT_INDEX));
    let _ = fs::remove_file(git_dir.join(NEXT_INDEX_LOCK));
    fs::remove_file(&lock).is_ok()
}

/// After a crash inside a commit (alexandria's own `index.lock` was left behind).
///
/// A session that died after making commits but before moving HEAD's branch left its
/// newest commit in `.git/alexandria-pending`: if the branch has not moved since (it is
/// below that commit), it moves there now (the chain may hold versions of pages found
/// on disk that exist nowhere else), and the index entries of the paths those commits
/// changed become their versions. Otherwise (a daemon from before that order moved HEAD
/// first and died before writing the index) the index entries of the paths HEAD's
/// commit changed become HEAD's versions, if alexandria made that commit. Sessions that
/// left git's index unwritten (`Session::defer_index`) recorded the commit it matches:
/// then every path changed since gets its version.
/// Returns how many paths.
pub fn stage_last_commit(repo: &Repository, timeout: Duration) -> Result<usize, GitError> {
    let pending = read_pending(repo.path());
    let _ = fs::remove_file(repo.path().join(PENDING_FILE));
    // Sessions that left git's index unwritten (`Held`): it matches this commit.
    let index_base = read_record(&repo.path().join(INDEX_BASE_FILE))
        .and_then(|id| repo.find_commit(id).ok())
        .map(|commit| commit.tree())
        .transpose()?;
    let mut session = Session::begin(repo, timeout)?;
    let head = session.tip()?;
    let descends = match pending {
        Some(id) if id != head.id() && repo.find_commit(id).is_ok() => {
            repo.graph_descendant_of(id, head.id())?
        }
        _ => false,
    };
    let (from, to) = match pending {
        Some(id) if descends => {
            session.chain.push(Link::Moved { id });
            session.moved_to(id)?;
            (Some(head.tree()?), repo.find_commit(id)?.tree()?)
        }
        _ => {
            if index_base.is_none() && head.committer().name().ok() != Some("alexandria") {
                return Ok(0);
            }
            let parent = head.parent(0).ok().map(|p| p.tree()).transpose()?;
            (parent, head.tree()?)
        }
    };
    let from = index_base.or(from);
    let diff = repo.diff_tree_to_tree(from.as_ref(), Some(&to), None)?;
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
    let _ = fs::remove_file(repo.path().join(INDEX_BASE_FILE));
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
#[derive(Clone)]
enum Entry {
    Blob { id: Oid, stat: Option<Metadata> },
    Gone,
}

/// How a commit of the session's chain was made.
enum Link {
    /// Committed by this session on top of the previous link: made again on top of a
    /// new HEAD if someone moves the branch before the session publishes it.
    Commit {
        /// The id it was first made with (the one callers were given).
        first: Oid,
        id: Oid,
        entries: Vec<(String, Entry)>,
        message: String,
        author: Signature<'static>,
        committer: Signature<'static>,
    },
    /// A commit made elsewhere that the branch moves to (sync's merge, a roll-back):
    /// it cannot be made again on top of a moved branch.
    Moved { id: Oid },
}

impl Link {
    fn id(&self) -> Oid {
        match self {
            Link::Commit { id, .. } | Link::Moved { id } => *id,
        }
    }
}

/// The daemon at work in a repository: holds git's index lock; commits are made as
/// objects chained on HEAD (no ref moves while the session runs); `finish` writes the
/// index entries of every path committed, renames the new index into place, and only
/// then moves HEAD's branch once, from the value it had when the session began to the
/// session's newest commit. Dropped without `finish`, the index and HEAD are left as
/// they were.
///
/// Why that order: `git commit` (and `status`, `stash`) read HEAD and then the index
/// without any lock. Whoever reads them sees either the old HEAD (a commit made from
/// it then fails to move the branch: "cannot lock ref") or the new HEAD with the new
/// index, never the new HEAD with an index that does not have the session's pages
/// (committing that would delete them).
pub struct Session<'r> {
    repo: &'r Repository,
    /// Released when the session is dropped (after `finish`, or without it), unless
    /// it is handed on (`Held`).
    lock: Option<IndexLock>,
    /// What the sessions before this one left unwritten in git's index (`Held`): put
    /// back if this session is dropped without `finish`.
    inherited: Option<Inherited>,
    /// Leave git's index unwritten at `finish` (`defer_index`).
    defer: bool,
    /// Flush the new index before it replaces the old one (`settle`: nothing else
    /// flushes it before the writes it holds are acknowledged, since they already are).
    sync_index: bool,
    /// The branch's value when the session began: what git's index on disk matches
    /// when no earlier session left it unwritten.
    began: Oid,
    timeout: Duration,
    /// The branch's value when the session began (or, after someone moved the branch
    /// meanwhile, the value the chain was made again on).
    base: Oid,
    /// The session's commits, oldest first.
    chain: Vec<Link>,
    /// The newest commit: what HEAD's branch becomes at `finish`.
    tip: Oid,
    touched: BTreeMap<String, Entry>,
    /// `.git/alexandria-pending`, open once the session made a commit.
    pending: Option<File>,
    /// Object files, refs and the index this session wrote: what must be flushed.
    written: Durable,
    /// The session's objects, written on the `git-objects` thread (`loose::Objects`):
    /// waited for before libgit2 reads from the repository and before the branch moves.
    objects: super::loose::Objects,
    /// The last commit the session made, and its tree (read without reading the
    /// commit).
    made: Option<(Oid, Oid)>,
    /// HEAD and the index were as the daemon last saw them consistent when the session
    /// began (or were checked since): what `finish` leaves is consistent too
    /// (`dropped`).
    verified: bool,
}

/// What a finished session did.
pub struct Finished {
    /// What it wrote, for the flush before the writes are acknowledged.
    pub durable: Durable,
    /// Commits made again on top of a branch someone moved meanwhile: first id → id.
    renamed: BTreeMap<Oid, Oid>,
    /// Where HEAD's branch now points, if the session moved it.
    pub published: Option<Oid>,
}

impl Finished {
    /// The id the commit first made as `id` ended with.
    pub fn id(&self, id: &str) -> String {
        Oid::from_str(id)
            .ok()
            .and_then(|oid| self.renamed.get(&oid))
            .map_or_else(|| id.to_string(), Oid::to_string)
    }
}

/// Where a session records its newest commit before HEAD's branch moves, so that after
/// a crash recovery can move the branch there (the chain may hold versions of pages
/// found on disk that exist nowhere else).
const PENDING_FILE: &str = "alexandria-pending";
/// Its record's size: a commit id padded with spaces, and a newline (all spaces once
/// the session is over).
const PENDING_RECORD: usize = 72;
/// The previous index, kept until HEAD's branch has moved (put back if it cannot).
const PREVIOUS_INDEX: &str = "alexandria-index-previous";
/// The index before the current one, once HEAD's branch has moved: the next session
/// writes its index into this file instead of a new one (`gitindex::write_next_reusing`).
const SPARE_INDEX: &str = "alexandria-index-spare";

/// Where the commit git's index on disk still matches is recorded while sessions leave
/// the index unwritten (`Held`): a commit id padded with spaces and a newline, all
/// spaces once the index is written.
const INDEX_BASE_FILE: &str = "alexandria-index-base";

/// git's index as the sessions that deferred it left it: the entries they committed,
/// not yet written, and `.git/index.lock`, kept so that nobody reads the index meanwhile.
struct Held {
    lock: IndexLock,
    inherited: Inherited,
}

/// The part of `Held` a session carries.
struct Inherited {
    touched: BTreeMap<String, Entry>,
    /// When the first session deferred the index (and wrote `INDEX_BASE_FILE`; not
    /// kept open, so that nothing holds a file open for writing between writes).
    since: Instant,
}

/// By git directory.
static HELD: LazyLock<Mutex<HashMap<PathBuf, Held>>> = LazyLock::new(Mutex::default);

fn held_map() -> std::sync::MutexGuard<'static, HashMap<PathBuf, Held>> {
    HELD.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether sessions in the repository at `git_dir` left git's index unwritten, and
/// since when.
pub fn index_held_since(git_dir: &Path) -> Option<Instant> {
    held_map().get(git_dir).map(|h| h.inherited.since)
}

/// Write git's index that sessions left unwritten (`Session::defer_index`), flushed, and
/// release its lock. Call under the workspace's index guard. Returns whether there was
/// one.
pub fn settle(repo: &Repository) -> Result<bool, GitError> {
    let Some(held) = held_map().remove(repo.path()) else {
        return Ok(false);
    };
    let base = match head_branch(repo).and_then(|b| Ok(repo.refname_to_id(&b)?)) {
        Ok(id) => id,
        // A HEAD detached meanwhile (`git update-ref` needs no index lock).
        Err(_) => match repo.head().ok().and_then(|h| h.target()) {
            Some(id) => id,
            None => {
                let git_dir = repo.path().to_path_buf();
                held_map().insert(git_dir, held);
                return Err(GitError::InUse(GitState::UnbornBranch));
            }
        },
    };
    let verified = dropped::is_known(repo, &dropped::seen_at(repo, Some(base)));
    let mut session = Session::start(repo, held.lock, Some(held.inherited), base, verified);
    session.sync_index = true;
    session.finish()?;
    Ok(true)
}

/// Blank the record file at `path` (`.git/alexandria-index-base`) in place; remove it
/// if that fails.
fn blank_record_at(path: &Path) {
    match OpenOptions::new().write(true).open(path) {
        Ok(file) => blank_record(&file, path),
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(_) => {
            let _ = fs::remove_file(path);
        }
    }
}

/// Blank a record file (`.git/alexandria-pending`) in place; remove it if that fails.
fn blank_record(file: &File, path: &Path) {
    let blank = format!("{}\n", " ".repeat(PENDING_RECORD - 1));
    if rustix::io::pwrite(file, blank.as_bytes(), 0).is_err() {
        let _ = fs::remove_file(path);
    }
}

/// The commit named in a record file (None: none, or blank).
fn read_record(path: &Path) -> Option<Oid> {
    let text = fs::read_to_string(path).ok()?;
    Oid::from_str(text.trim()).ok()
}

/// The commit a session that died left in `.git/alexandria-pending`.
fn read_pending(git_dir: &Path) -> Option<Oid> {
    read_record(&git_dir.join(PENDING_FILE))
}

/// libgit2's object cache, per repository (raw object bytes; the heap it takes is
/// about 2.5 times that).
const GIT_CACHE_BYTES: isize = 4 << 20;

/// libgit2's process-wide settings for the daemon (issue 15). Call before any thread
/// uses libgit2.
///
/// - Objects are read without hashing them again (git itself does not either; `git
///   fsck` is the check), and trees and commits are built without looking up every
///   object they name (the daemon writes the blobs it names first, and names trees it
///   read from the repository): per write, these checks were a tenth of its CPU time.
/// - The object cache of a repository (the daemon keeps each workspace's open) is
///   bounded: by default it keeps every commit and tree under 4 KB up to 256 MiB, and
///   every write makes new ones, so after a 3-minute mixed load at 10k pages it held
///   about 110 MiB of the daemon's memory, kept while idle.
pub fn configure_libgit2() {
    git2::opts::strict_hash_verification(false);
    git2::opts::strict_object_creation(false);
    // SAFETY: libgit2's settings are C globals written without a lock; this runs at
    // start-up, before any thread of the daemon opens a repository (the only thread
    // already running is the log writer's, which does not use libgit2).
    #[allow(unsafe_code)]
    let bounded = unsafe { git2::opts::set_cache_max_size(GIT_CACHE_BYTES) };
    if let Err(error) = bounded {
        tracing::warn!(%error, "cannot bound libgit2's object cache");
    }
}

/// HEAD's branch (`refs/heads/…`), or why there is none.
fn head_branch(repo: &Repository) -> Result<String, GitError> {
    let head = repo.find_reference("HEAD")?;
    match head.symbolic_target()? {
        Some(name) => Ok(name.to_string()),
        None => Err(GitError::InUse(GitState::DetachedHead)),
    }
}

impl<'r> Session<'r> {
    /// Take git's index lock (waiting up to `timeout`) and check that nobody is in the
    /// middle of something in the repository.
    /// A session that goes on from sessions that left git's index unwritten (`Held`)
    /// takes their lock and entries over instead.
    pub fn begin(repo: &'r Repository, timeout: Duration) -> Result<Session<'r>, GitError> {
        let taken = held_map().remove(repo.path());
        let (lock, inherited) = match taken {
            Some(held) => (held.lock, Some(held.inherited)),
            None => (IndexLock::acquire(repo.path(), timeout)?, None),
        };
        let hand_back = |lock: IndexLock, inherited: Option<Inherited>| {
            if let Some(inherited) = inherited {
                held_map().insert(repo.path().to_path_buf(), Held { lock, inherited });
            }
        };
        // `GitState::of`, reading HEAD and its branch once each (they were read seven
        // times per write).
        let state = GitState::in_progress(repo);
        let branch = match state {
            GitState::Clean => head_branch(repo),
            state => Err(GitError::InUse(state)),
        };
        let base = branch.and_then(|branch| match repo.refname_to_id(&branch) {
            Ok(base) => Ok(base),
            Err(e) if e.code() == git2::ErrorCode::NotFound => {
                Err(GitError::InUse(GitState::UnbornBranch))
            }
            Err(e) => Err(e.into()),
        });
        let base = match base {
            Ok(base) => base,
            Err(error) => {
                hand_back(lock, inherited);
                return Err(error);
            }
        };
        let verified = dropped::is_known(repo, &dropped::seen_at(repo, Some(base)));
        let mut session = Session::start(repo, lock, inherited, base, verified);
        session.timeout = timeout;
        Ok(session)
    }

    fn start(
        repo: &'r Repository,
        lock: IndexLock,
        inherited: Option<Inherited>,
        base: Oid,
        verified: bool,
    ) -> Session<'r> {
        Session {
            repo,
            lock: Some(lock),
            inherited,
            defer: false,
            sync_index: false,
            began: base,
            timeout: Duration::from_secs(5),
            base,
            chain: Vec::new(),
            tip: base,
            touched: BTreeMap::new(),
            pending: None,
            written: Durable::default(),
            objects: super::loose::Objects::new(repo.path().join("objects")),
            made: None,
            verified,
        }
    }

    /// Leave git's index unwritten at `finish`, and its lock held, for the next session
    /// to go on from; `settle` writes it. For group commits, whose writers come in
    /// streams (issue 15): each group skipped rewriting and flushing the whole index.
    pub fn defer_index(&mut self) {
        self.defer = true;
    }

    /// HEAD and the index were checked for pages a hand commit dropped, under this
    /// session's lock (`dropped::find`), and repaired in it.
    pub fn mark_verified(&mut self) {
        self.verified = true;
    }

    /// Make the index entry of `path` the blob `id` (None: no entry), with the stat data
    /// of the file on disk when it is known.
    pub fn stage(&mut self, path: &str, id: Option<Oid>, stat: Option<Metadata>) {
        let entry = match id {
            Some(id) => Entry::Blob { id, stat },
            None => Entry::Gone,
        };
        self.touched.insert(path.to_string(), entry);
    }

    /// Write the objects of the commits made from now on on the `git-objects` thread
    /// (`loose::Objects`): for a group's writes but its last, which has nothing left to
    /// overlap them with.
    pub fn write_objects_later(&self, later: bool) {
        self.objects.set_later(later);
    }

    pub fn repo(&self) -> &'r Repository {
        self.objects.wait();
        self.repo
    }

    /// The session's newest commit: what HEAD will be once the session finishes (HEAD
    /// itself does not move before).
    pub fn tip(&self) -> Result<git2::Commit<'r>, GitError> {
        self.objects.wait();
        Ok(self.repo.find_commit(self.tip)?)
    }

    /// The id of the session's newest commit.
    pub fn tip_id(&self) -> Oid {
        self.tip
    }

    /// The tree of `commit`.
    fn tree_of(&self, commit: Oid) -> Result<Oid, GitError> {
        match self.made {
            Some((made, tree)) if made == commit => Ok(tree),
            _ => match gittree::remembered_tree(self.repo, commit) {
                Some(tree) => Ok(tree),
                None => {
                    self.objects.wait();
                    Ok(self.repo.find_commit(commit)?.tree_id())
                }
            },
        }
    }

    /// The id of what `path` names in the session's newest commit (None: nothing, or
    /// not a path there).
    pub fn tip_entry(&self, path: &str) -> Result<Option<Oid>, GitError> {
        let root = self.tree_of(self.tip)?;
        if let Some(found) = gittree::entry_at(self.repo, root, path)? {
            return Ok(found);
        }
        self.objects.wait();
        match self.repo.find_tree(root)?.get_path(Path::new(path)) {
            Ok(entry) => Ok(Some(entry.id())),
            Err(e) if e.code() == git2::ErrorCode::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The message of the session's newest commit when the session made it (None: the
    /// branch's own commit, or one moved to: read it with `tip`).
    pub fn tip_message(&self) -> Option<&str> {
        match self.chain.last() {
            Some(Link::Commit { id, message, .. }) if *id == self.tip => Some(message),
            _ => None,
        }
    }

    /// Commit `changes` on top of the session's newest commit. Returns the commit id
    /// (a commit made again on top of a branch moved meanwhile gets another id: see
    /// `Finished::id`).
    pub fn commit(
        &mut self,
        changes: &[Change<'_>],
        message: &str,
        author: &Signature<'_>,
    ) -> Result<Oid, GitError> {
        let mut entries = Vec::with_capacity(changes.len());
        for change in changes {
            let entry = match change.content {
                Content::Bytes(bytes) => Entry::Blob {
                    id: super::loose::write_later(
                        &self.objects,
                        git2::ObjectType::Blob,
                        Arc::new(bytes.to_vec()),
                    )
                    .map_err(io("writing a page to git"))?,
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
        // Blobs written, the commit not yet: a kill here leaves them unreachable.
        crate::faults::crash_point("commit_objects");
        let committer = Signature::now("alexandria", "alexandria@localhost")?;
        let id = self.make(self.tip, &entries, message, author, &committer)?;
        self.touched.extend(entries.iter().cloned());
        self.chain.push(Link::Commit {
            first: id,
            id,
            entries,
            message: message.to_string(),
            author: author.to_owned(),
            committer: committer.to_owned(),
        });
        self.moved_to(id)?;
        Ok(id)
    }

    /// A commit of `entries` on top of `parent` (no ref moves); its files recorded.
    fn make(
        &mut self,
        parent: Oid,
        entries: &[(String, Entry)],
        message: &str,
        author: &Signature<'_>,
        committer: &Signature<'_>,
    ) -> Result<Oid, GitError> {
        let repo = self.repo;
        let base = self.tree_of(parent)?;
        let changes: Vec<gittree::Change<'_>> = entries
            .iter()
            .map(|(path, entry)| match entry {
                Entry::Blob { id, .. } => (path.as_str(), Some(*id)),
                Entry::Gone => (path.as_str(), None),
            })
            .collect();
        let (tree, trees) = match gittree::update(&self.objects, repo, base, &changes)? {
            Some((tree, trees)) => (tree, Some(trees)),
            // What the daemon's tree writer leaves to libgit2 (and its errors).
            None => {
                self.objects.wait();
                let mut update = git2::build::TreeUpdateBuilder::new();
                for &(path, blob) in &changes {
                    match blob {
                        Some(id) => update.upsert(path, id, FileMode::Blob),
                        None => update.remove(path),
                    };
                }
                (update.create_updated(repo, &repo.find_tree(base)?)?, None)
            }
        };
        // The bytes `repo.commit` would write, written by `loose` (no freshening or pack
        // rescan), without reading the parent and the tree back as libgit2 does.
        let commit = super::loose::commit_bytes(tree, &[parent], author, committer, message);
        let id =
            super::loose::write_later(&self.objects, git2::ObjectType::Commit, Arc::new(commit))
                .map_err(io("writing a commit"))?;
        self.made = Some((id, tree));
        gittree::remember_commit(repo, id, tree);
        self.record_objects(id, entries, trees)?;
        Ok(id)
    }

    /// The session's tip is now `id`: record it in `.git/alexandria-pending` (a fixed
    /// size record written in place: no truncation, no flush).
    fn moved_to(&mut self, id: Oid) -> Result<(), GitError> {
        self.tip = id;
        if self.pending.is_none() {
            let file = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o644)
                .open(self.repo.path().join(PENDING_FILE))
                .map_err(io("recording alexandria's pending commit"))?;
            self.pending = Some(file);
        }
        if let Some(file) = &self.pending {
            let mut record = id.to_string();
            record.push_str(&" ".repeat((PENDING_RECORD - 1).saturating_sub(record.len())));
            record.push('\n');
            rustix::io::pwrite(file, record.as_bytes(), 0)
                .map_err(|e| io("recording alexandria's pending commit")(e.into()))?;
        }
        Ok(())
    }

    /// Remember the files commit `id` wrote: its loose objects (the commit, the trees
    /// along each changed path (`trees` when the daemon wrote them), the blobs).
    fn record_objects(
        &mut self,
        id: Oid,
        entries: &[(String, Entry)],
        trees: Option<Vec<Oid>>,
    ) -> Result<(), GitError> {
        let repo = self.repo;
        let objects = repo.path().join("objects");
        let mut ids = vec![id];
        for (_, entry) in entries {
            if let Entry::Blob { id, .. } = entry {
                ids.push(*id);
            }
        }
        if let Some(trees) = trees {
            ids.extend(trees);
        } else {
            self.objects.wait();
            let tree = repo.find_commit(id)?.tree()?;
            ids.push(tree.id());
            for (path, _) in entries {
                let mut prefix = Path::new(path.as_str()).parent();
                while let Some(dir) = prefix.filter(|d| !d.as_os_str().is_empty()) {
                    if let Ok(found) = tree.get_path(dir) {
                        ids.push(found.id());
                    }
                    prefix = dir.parent();
                }
            }
        }
        for id in ids {
            let hex = id.to_string();
            // Already packed (or written by someone else): no loose file, nothing to do.
            self.written.file(objects.join(&hex[..2]).join(&hex[2..]));
        }
        self.written.dir(objects);
        Ok(())
    }

    /// Make the index entry of `path` the session's newest commit's version (after a
    /// commit made by an earlier session that crashed before its index was written, or
    /// a roll-back).
    pub fn stage_head_version(&mut self, path: &str) -> Result<(), GitError> {
        let entry = match self.tip_entry(path)? {
            Some(id) => Entry::Blob { id, stat: None },
            None => Entry::Gone,
        };
        self.touched.insert(path.to_string(), entry);
        Ok(())
    }

    /// Move to `target` (a merge or fast-forward made by sync on top of `from`, the
    /// session's newest commit, whose files are in place already) and make the index
    /// entries of `paths` the target's versions (with the stat data of the files
    /// written, when known).
    pub fn advance(
        &mut self,
        from: Oid,
        target: Oid,
        paths: &[(String, Option<Metadata>)],
    ) -> Result<(), GitError> {
        if from != self.tip {
            return Err(GitError::Moved);
        }
        if target != self.tip {
            self.chain.push(Link::Moved { id: target });
            self.moved_to(target)?;
        }
        self.objects.wait();
        let tree = self.repo.find_commit(target)?.tree()?;
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

    /// Go back to `target` (a roll-back of the daemon's own commits): a commit of this
    /// session's chain, or one below it.
    pub fn reset_soft(&mut self, target: &git2::Commit<'_>) -> Result<(), GitError> {
        let target = target.id();
        if target == self.tip {
            return Ok(());
        }
        if let Some(at) = self.chain.iter().position(|link| link.id() == target) {
            self.chain.truncate(at + 1);
        } else if target == self.base {
            self.chain.clear();
        } else {
            self.chain.clear();
            self.chain.push(Link::Moved { id: target });
        }
        self.moved_to(target)
    }

    /// Make the chain again on top of `base` (someone moved HEAD's branch there since
    /// the session began: a `git reset`, or a `git commit` that released the index lock
    /// before moving the branch).
    fn rebuild_on(&mut self, base: Oid) -> Result<(), GitError> {
        let mut parent = base;
        let mut chain = std::mem::take(&mut self.chain);
        let result = (|| {
            for link in &mut chain {
                let Link::Commit {
                    id,
                    entries,
                    message,
                    author,
                    committer,
                    ..
                } = link
                else {
                    return Err(GitError::Moved);
                };
                *id = self.make(parent, entries, message, author, committer)?;
                parent = *id;
            }
            Ok(())
        })();
        self.chain = chain;
        result?;
        // The commits made again are written before the branch names them.
        self.objects
            .settle()
            .map_err(io("writing the commits' objects"))?;
        self.base = base;
        self.moved_to(parent)
    }

    /// Move HEAD's branch from the session's base to its tip (compare and swap); if
    /// someone moved the branch meanwhile, make the chain again on top of where it is.
    fn publish(&mut self) -> Result<(), GitError> {
        let repo = self.repo;
        let message = match self.chain.last() {
            Some(Link::Commit { message, .. }) => {
                format!("commit: {}", message.lines().next().unwrap_or("alexandria"))
            }
            _ => "alexandria: move".to_string(),
        };
        let started = Instant::now();
        let mut pause = Duration::from_millis(1);
        loop {
            // A branch switched by hand (`git switch` moves HEAD after it released
            // the index lock) is followed.
            let branch = head_branch(repo)?;
            let current = repo.refname_to_id(&branch)?;
            if current == self.tip {
                return self.record_ref(&branch);
            }
            if current != self.base {
                tracing::info!(
                    from = %self.base,
                    to = %current,
                    "HEAD's branch moved during a commit; making it again on top"
                );
                self.rebuild_on(current)?;
            }
            match repo.reference_matching(&branch, self.tip, true, self.base, &message) {
                Ok(_) => return self.record_ref(&branch),
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

    fn record_ref(&mut self, branch: &str) -> Result<(), GitError> {
        let git_dir = self.repo.path();
        let file = git_dir.join(branch);
        self.written.parents_up_to(&file, &git_dir.join("refs"));
        self.written.file(file);
        Ok(())
    }

    /// The index with the entries of every path committed in this session, written to
    /// `next` (the rest of the index untouched): by `gitindex`, or by libgit2 for what
    /// `gitindex` leaves to it (no index, version 4, a split or sparse index). The
    /// `gitindex::Written` to call `installed` on once `next` is renamed over `current`.
    fn write_next_index(
        &self,
        current: &Path,
        next: &Path,
    ) -> Result<Option<gitindex::Written>, GitError> {
        let touched = self.all_touched();
        let updates: Vec<gitindex::Update<'_>> = touched
            .iter()
            .map(|&(path, entry)| match entry {
                Entry::Blob { id, stat } => gitindex::Update {
                    path,
                    blob: Some(*id),
                    stat: stat.as_ref(),
                },
                Entry::Gone => gitindex::Update {
                    path,
                    blob: None,
                    stat: None,
                },
            })
            .collect();
        let size = fs::metadata(current).map(|m| m.len()).unwrap_or(0);
        let skip_hash = gitindex::skips_hash(self.repo.config().ok().as_ref(), size);
        let spare = current.with_file_name(SPARE_INDEX);
        match gitindex::write_next_reusing(current, next, Some(&spare), &updates, skip_hash)
            .map_err(io("writing git's index"))?
        {
            gitindex::Outcome::Written(written) => return Ok(Some(written)),
            gitindex::Outcome::Unsupported(why) => {
                tracing::debug!(why, "git's index is rewritten by libgit2");
            }
        }
        let _ = fs::remove_file(next);
        // libgit2 writes it through `alexandria-index.lock`: one a killed daemon left
        // would fail every later write ("the index is locked"). Only alexandria writes
        // that file, and only under `index.lock`, which this session holds.
        if let Some(dir) = next.parent() {
            let _ = fs::remove_file(dir.join(NEXT_INDEX_LOCK));
        }
        let mut index = match fs::hard_link(current, next) {
            Ok(()) => git2::Index::open(next)?,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                // No index at all (deleted by hand): start from HEAD's tree.
                let mut index = git2::Index::open(next)?;
                index.read_tree(&self.repo.find_commit(self.base)?.tree()?)?;
                index
            }
            Err(e) => return Err(io("reading git's index")(e)),
        };
        for &(path, entry) in &touched {
            match entry {
                Entry::Blob { id, stat } => {
                    index.add(&index_entry(path, *id, stat.as_ref()))?;
                }
                Entry::Gone => match index.remove_path(Path::new(path)) {
                    Ok(()) => {}
                    Err(e) if e.code() == git2::ErrorCode::NotFound => {}
                    Err(e) => return Err(e.into()),
                },
            }
        }
        // Written to `alexandria-index.lock`, renamed to `alexandria-index`.
        index.write()?;
        Ok(None)
    }

    /// The index entries of every path committed in this session and in the sessions
    /// that left the index unwritten before it (this session's win), by path.
    fn all_touched(&self) -> Vec<(&str, &Entry)> {
        let mut all: BTreeMap<&str, &Entry> = BTreeMap::new();
        if let Some(inherited) = &self.inherited {
            all.extend(inherited.touched.iter().map(|(p, e)| (p.as_str(), e)));
        }
        all.extend(self.touched.iter().map(|(p, e)| (p.as_str(), e)));
        all.into_iter().collect()
    }

    /// Record, before HEAD's branch moves, the commit git's index on disk matches
    /// (when no earlier session left it unwritten, it matches the branch as this
    /// session found it).
    fn record_index_base(&mut self) -> std::io::Result<()> {
        if self.inherited.is_some() {
            return Ok(());
        }
        let path = self.repo.path().join(INDEX_BASE_FILE);
        let record = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(&path)?;
        let mut text = self.began.to_string();
        text.push_str(&" ".repeat(PENDING_RECORD - 1 - text.len()));
        text.push('\n');
        rustix::io::pwrite(&record, text.as_bytes(), 0).map_err(std::io::Error::from)?;
        self.written.file(path);
        self.inherited = Some(Inherited {
            touched: BTreeMap::new(),
            since: Instant::now(),
        });
        Ok(())
    }

    /// `finish` for a session that leaves git's index unwritten: HEAD's branch moves,
    /// and the lock and the entries are kept for the next session (`Held`).
    fn finish_deferred(mut self) -> Result<Finished, GitError> {
        self.publish()?;
        let mut renamed = BTreeMap::new();
        for link in &self.chain {
            if let Link::Commit { first, id, .. } = link
                && first != id
            {
                renamed.insert(*first, *id);
            }
        }
        if self.verified {
            // The index file is the one the daemon last saw consistent, and stays so
            // under the lock it keeps.
            dropped::remember(self.repo, dropped::seen_at(self.repo, Some(self.tip)));
        }
        let durable = std::mem::take(&mut self.written);
        let (Some(lock), Some(mut inherited)) = (self.lock.take(), self.inherited.take()) else {
            return Err(GitError::Moved);
        };
        inherited.touched.append(&mut self.touched);
        held_map().insert(self.repo.path().to_path_buf(), Held { lock, inherited });
        let published = Some(self.tip);
        // Blanks `.git/alexandria-pending`.
        drop(self);
        Ok(Finished {
            durable,
            renamed,
            published,
        })
    }

    /// Write the index entries of every path committed in this session (the rest of the
    /// index untouched) and put the new index in place, then move HEAD's branch to the
    /// session's newest commit, then release the lock. Returns what the session wrote,
    /// for the flush before the writes are acknowledged.
    pub fn finish(mut self) -> Result<Finished, GitError> {
        // Every object written before git's index or HEAD's branch names one.
        self.objects
            .settle()
            .map_err(io("writing the commits' objects"))?;
        if self.defer && !self.chain.is_empty() {
            match self.record_index_base() {
                Ok(()) => return self.finish_deferred(),
                Err(error) => {
                    tracing::warn!(%error, "cannot record the base of git's index; writing it now");
                }
            }
        }
        let git_dir = self.repo.path().to_path_buf();
        let current = git_dir.join("index");
        let previous = git_dir.join(PREVIOUS_INDEX);
        let moves = !self.chain.is_empty();
        let indexed = !self.touched.is_empty()
            || self
                .inherited
                .as_ref()
                .is_some_and(|i| !i.touched.is_empty());
        if indexed {
            let next = git_dir.join(NEXT_INDEX);
            let ours = self.write_next_index(&current, &next)?;
            if self.sync_index {
                File::open(&next)
                    .and_then(|f| f.sync_all())
                    .map_err(io("flushing git's index"))?;
            }
            // Kept until the branch has moved, to be put back if it cannot, then as the
            // spare.
            let _ = fs::remove_file(&previous);
            let _ = fs::hard_link(&current, &previous);
            fs::rename(&next, &current).map_err(io("replacing git's index"))?;
            if let Some(ours) = ours {
                ours.installed();
            }
            self.written.file(current.clone());
        }
        if moves && let Err(error) = self.publish() {
            if indexed {
                let _ = fs::rename(&previous, &current);
            }
            return Err(error);
        }
        if indexed {
            // The index it replaced, for the next session to write into (when no one
            // has it open then); one left unused is freed off this thread.
            let spare = git_dir.join(SPARE_INDEX);
            if spare.exists() {
                remove_later(&spare);
            }
            if !gitindex::REUSES_SPARE || fs::rename(&previous, &spare).is_err() {
                remove_later(&previous);
            }
        }
        let mut renamed = BTreeMap::new();
        for link in &self.chain {
            if let Link::Commit { first, id, .. } = link
                && first != id
            {
                renamed.insert(*first, *id);
            }
        }
        if self.inherited.take().is_some() {
            // The index is written (and HEAD's branch moved): nothing is held any more.
            blank_record_at(&git_dir.join(INDEX_BASE_FILE));
        }
        let published = moves.then_some(self.tip);
        if self.verified {
            // Still under the index lock: nobody else changed them since.
            // HEAD's branch is where this session left it (or began, if it made no
            // commit): published under the lock.
            let head = published.unwrap_or(self.base);
            dropped::remember(self.repo, dropped::seen_at(self.repo, Some(head)));
        }
        let durable = std::mem::take(&mut self.written);
        // Blanks `.git/alexandria-pending`, then releases the index lock.
        drop(self);
        Ok(Finished {
            durable,
            renamed,
            published,
        })
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        // Blanked in place, not removed: the next session writes the same file again
        // instead of creating one (each file created and removed per write cost ext4
        // without a journal a scan past the inodes it freed in the last seconds).
        if let Some(file) = self.pending.take() {
            blank_record(&file, &self.repo.path().join(PENDING_FILE));
        }
        // Dropped without `finish` (or it failed): what earlier sessions left unwritten
        // is held again, with the lock (this session's own entries are of commits HEAD
        // does not have).
        if let (Some(lock), Some(inherited)) = (self.lock.take(), self.inherited.take()) {
            held_map().insert(self.repo.path().to_path_buf(), Held { lock, inherited });
        }
    }
}

/// Remove `path` now, and free what it held later: its last name goes at once (so the
/// next session can make it again), but the file is kept open and closed on a thread
/// of its own. Closing the last hold on the index a session replaced frees its pages
/// and blocks (ext4's `evict`): 4% of the daemon's CPU time per write at 100k pages
/// (a 10 MB index), which the writer need not wait for.
fn remove_later(path: &Path) {
    static CLOSER: OnceLock<Option<mpsc::Sender<File>>> = OnceLock::new();
    let closer = CLOSER.get_or_init(|| {
        let (sender, receiver) = mpsc::channel::<File>();
        std::thread::Builder::new()
            .name("close-later".into())
            .spawn(move || receiver.into_iter().for_each(drop))
            .ok()
            .map(|_| sender)
    });
    let held = File::open(path).ok();
    let _ = fs::remove_file(path);
    if let (Some(file), Some(closer)) = (held, closer) {
        // The thread is gone only if it panicked: then the file is closed here.
        let _ = closer.send(file);
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

    /// A session reads HEAD and its branch once: on a detached HEAD, an unborn branch
    /// or in a merge it is refused with what is going on, as `GitState::of` says.
    #[test]
    fn a_session_is_refused_where_head_is_not_a_branch_with_commits() {
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = repo_with_one_commit(dir.path());
        let branch = repo.head().expect("head").name().expect("name").to_string();
        let tip = repo.refname_to_id(&branch).expect("tip");
        let refused = |repo: &Repository| match Session::begin(repo, Duration::from_secs(1)) {
            Err(GitError::InUse(state)) => {
                assert_eq!(state, GitState::of(repo), "as GitState::of says");
                Some(state)
            }
            Err(other) => panic!("{other}"),
            Ok(_) => None,
        };
        assert_eq!(refused(&repo), None, "on {branch}");
        repo.set_head_detached(tip).expect("detach");
        assert_eq!(refused(&repo), Some(GitState::DetachedHead));
        repo.set_head("refs/heads/not-yet").expect("unborn");
        assert_eq!(refused(&repo), Some(GitState::UnbornBranch));
        repo.set_head(&branch).expect("back");
        std::fs::write(repo.path().join("MERGE_HEAD"), format!("{tip}\n")).expect("merge");
        assert_eq!(refused(&repo), Some(GitState::Merge));
        std::fs::remove_file(repo.path().join("MERGE_HEAD")).expect("rm");
        assert_eq!(refused(&repo), None, "on {branch} again");
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

    fn page(path: &'static str, bytes: &'static [u8]) -> Change<'static> {
        Change {
            path,
            content: Content::Bytes(bytes),
            stat: None,
        }
    }

    fn index_blob(repo: &Repository, path: &str) -> Option<Oid> {
        let mut index = repo.index().expect("index");
        index.read(true).expect("read index");
        index.get_path(Path::new(path), 0).map(|e| e.id)
    }

    #[test]
    fn the_branch_moves_once_after_the_index_is_written() {
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = repo_with_one_commit(dir.path());
        let start = repo.head().expect("head").target().expect("target");
        let me = Signature::now("t", "t@t").expect("sig");
        let mut session = Session::begin(&repo, Duration::from_millis(10)).expect("begin");
        let first = session
            .commit(&[page("wiki/one.md", b"one")], "one", &me)
            .expect("commit");
        let second = session
            .commit(&[page("wiki/two.md", b"two")], "two", &me)
            .expect("commit");
        // Nothing a lock-free reader can see has moved yet.
        assert_eq!(repo.head().expect("head").target(), Some(start));
        assert_eq!(index_blob(&repo, "wiki/one.md"), None);
        assert_eq!(session.tip().expect("tip").id(), second);
        assert_eq!(
            read_pending(repo.path()),
            Some(second),
            "the chain is recorded for recovery"
        );
        let finished = session.finish().expect("finish");
        assert_eq!(finished.published, Some(second));
        assert_eq!(finished.id(&first.to_string()), first.to_string());
        let head = repo.head().expect("head").peel_to_commit().expect("commit");
        assert_eq!(head.id(), second);
        assert_eq!(head.parent_id(0).expect("parent"), first);
        assert!(index_blob(&repo, "wiki/one.md").is_some());
        assert!(index_blob(&repo, "wiki/two.md").is_some());
        assert_eq!(read_pending(repo.path()), None);
        assert!(!repo.path().join("index.lock").exists());
        // The record is blanked, not removed: the next session writes the same file.
        let pending = repo.path().join(PENDING_FILE);
        let inode = fs::metadata(&pending).expect("kept").ino();
        assert_eq!(
            fs::read(&pending).expect("read"),
            [&[b' '; 71][..], b"\n"].concat()
        );
        let mut again = Session::begin(&repo, Duration::from_millis(10)).expect("begin");
        let third = again
            .commit(&[page("wiki/three.md", b"three")], "three", &me)
            .expect("commit");
        assert_eq!(read_pending(repo.path()), Some(third));
        assert_eq!(fs::metadata(&pending).expect("kept").ino(), inode);
        again.finish().expect("finish");
        assert_eq!(read_pending(repo.path()), None);
    }

    #[test]
    fn a_branch_moved_during_the_session_gets_the_chain_on_top() {
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = repo_with_one_commit(dir.path());
        let me = Signature::now("t", "t@t").expect("sig");
        let mut session = Session::begin(&repo, Duration::from_millis(10)).expect("begin");
        let ours = session
            .commit(&[page("wiki/ours.md", b"ours")], "ours", &me)
            .expect("commit");
        // Someone moves the branch without the index lock (`git reset --soft`, or a
        // `git commit` that released the lock before it moved the ref).
        let other = Repository::open(dir.path()).expect("open");
        let theirs = {
            let head = other
                .head()
                .expect("head")
                .peel_to_commit()
                .expect("commit");
            let mut update = git2::build::TreeUpdateBuilder::new();
            let blob = other.blob(b"theirs").expect("blob");
            update.upsert("theirs.md", blob, FileMode::Blob);
            let tree = other
                .find_tree(
                    update
                        .create_updated(&other, &head.tree().expect("tree"))
                        .expect("tree"),
                )
                .expect("tree");
            other
                .commit(Some("HEAD"), &me, &me, "theirs", &tree, &[&head])
                .expect("commit")
        };
        let finished = session.finish().expect("finish");
        let head = repo.head().expect("head").peel_to_commit().expect("commit");
        assert_eq!(head.parent_id(0).expect("parent"), theirs);
        assert_eq!(finished.id(&ours.to_string()), head.id().to_string());
        assert_ne!(head.id(), ours);
        let tree = head.tree().expect("tree");
        assert!(tree.get_path(Path::new("theirs.md")).is_ok());
        assert!(tree.get_path(Path::new("wiki/ours.md")).is_ok());
        assert_eq!(head.message().ok(), Some("ours"));
    }

    #[test]
    fn a_session_killed_before_the_branch_moved_is_published_by_recovery() {
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = repo_with_one_commit(dir.path());
        let start = repo.head().expect("head").target().expect("target");
        let me = Signature::now("t", "t@t").expect("sig");
        let mut session = Session::begin(&repo, Duration::from_millis(10)).expect("begin");
        let tip = session
            .commit(
                &[page("wiki/found.md", b"an editor's save")],
                "outside",
                &me,
            )
            .expect("commit");
        // The process dies once the commit's objects are written (they are written on
        // the `git-objects` thread): no drop, the lock and the pending record stay.
        super::super::loose::drain();
        std::mem::forget(session);
        assert_eq!(repo.head().expect("head").target(), Some(start));
        assert!(remove_own_stale_lock(repo.path()));
        assert_eq!(
            stage_last_commit(&repo, Duration::from_millis(10)).expect("recover"),
            1
        );
        assert_eq!(repo.head().expect("head").target(), Some(tip));
        assert!(index_blob(&repo, "wiki/found.md").is_some());
        assert_eq!(read_pending(repo.path()), None);
    }

    #[test]
    fn a_lock_of_the_next_index_a_kill_left_does_not_stop_commits() {
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = repo_with_one_commit(dir.path());
        std::fs::write(repo.path().join(NEXT_INDEX_LOCK), "left by a kill").expect("lock");
        let me = Signature::now("t", "t@t").expect("sig");
        let mut session = Session::begin(&repo, Duration::from_millis(10)).expect("begin");
        session
            .commit(
                &[Change {
                    path: "b.md",
                    content: Content::Bytes(b"b"),
                    stat: None,
                }],
                "b",
                &me,
            )
            .expect("commit");
        session.finish().expect("finish");
        let head = repo.head().expect("head").peel_to_tree().expect("tree");
        assert!(head.get_path(Path::new("b.md")).is_ok());
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
