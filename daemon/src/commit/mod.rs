//! The write path (SPEC §5): stage → lock → check → commit → index, crash-safe.
//!
//! 1. Stage (no lock): validate the path and the citations of the new text; nothing
//!    goes to disk yet (a run that never reached `prepared` is dropped by recovery, so
//!    the files a write makes and removes are as few as they can be: each new inode on
//!    ext4 without a journal scans past those freed in the last minute).
//! 2. Lock: the workspace's in-process lock, then an `fcntl` lock on `<ws>/.lock` (so
//!    other processes are excluded too), waiting up to the configured timeout; past it,
//!    `workspace_busy` with the holder's run id (written into the lock file).
//! 3. Check and compute against the current page: `base_rev` → `stale_plan`,
//!    `str_replace` uniqueness, `create` on an existing page.
//! 4. Commit: the manifest, with the final text (and what an `append` or
//!    `str_replace` added) in it, goes to `runs/<id>/prepared.json`; the text is
//!    swapped into `wiki/`; one git commit; one SQLite transaction (runs,
//!    wiki_log_entries, events, index); the run directory is removed; the lock is
//!    released; only then is the write acknowledged.
//!
//! Recovery (`recover`, at start before serving): a run still `staged` was never
//! acknowledged and is dropped; a `prepared` run is completed step by step, each step
//! being idempotent (file at the new rev? commit in HEAD? `runs` row present?).
//!
//! May import: `index`, `workspace`, `db`, `error`, `faults`. Tools call it; it never
//! calls a tool.

pub mod capture;
mod group;
pub mod ingest;
pub mod late;
pub mod place;
pub mod rebuild;
pub mod recover;
mod restore;
pub mod settle;
pub mod watch;

pub(crate) use group::submit;
pub use recover::recover;

use std::cell::Cell;
use std::fs::{self, File};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::MutexGuard;
use std::time::Duration;

use alexandria_proto::ErrorCode;
use rusqlite::{OptionalExtension, params};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::db::now_ms;
use crate::error::{ToolError, ToolResult};
use crate::faults::crash_point;
use crate::index;
use crate::workspace::git;
use crate::workspace::{Durable, LockGuard, Store, message, revision};

/// Largest page a write may produce.
pub const MAX_PAGE_BYTES: usize = 8 * 1024 * 1024;

// ---------------------------------------------------------------------------------
// runs on disk

/// What a run directory records, for recovery.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    pub run_id: String,
    pub workspace: String,
    pub tool: String,
    pub op: String,
    pub path: String,
    pub state: RunState,
    pub client: Option<String>,
    pub session: Option<String>,
    pub started_at: i64,
    /// Rev of the page before (None: did not exist).
    pub old_rev: Option<String>,
    /// Rev of the page after (None: deleted).
    pub new_rev: Option<String>,
    /// For deletes: where the page goes, relative to the workspace.
    pub trash_path: Option<String>,
    pub summary: String,
    /// For `str_replace`: the text replaced, so that the write can be applied again on
    /// top of an outside save found when the page is swapped in.
    #[serde(default)]
    pub old_str: Option<String>,
    /// The caller named the rev it planned against: the write is never applied on top
    /// of another version.
    #[serde(default)]
    pub pinned_base: bool,
    /// The page's text after a write, put in place by the commit (and by recovery).
    /// In the manifest's own file, so a write makes and removes one file fewer (a
    /// daemon before 2026-12-04 kept it in `final`, still read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// What an `append` or `str_replace` added, to apply it again on top of an outside
    /// save found when the page is swapped in (a daemon before 2026-12-04 kept it in
    /// `staged/payload`, still read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    Staged,
    Prepared,
}

pub(crate) fn new_run_id() -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("run-{}-{}", now_ms(), &id[..8])
}

pub(crate) fn run_dir(store: &Store, workspace: &str, run_id: &str) -> PathBuf {
    store.workspace_dir(workspace).join("runs").join(run_id)
}

pub(crate) use place::TEMP_MARKER;

/// Replace `path` atomically with `bytes` (temp file + rename). Durability against
/// power loss comes from the flush before a write is acknowledged (`Durable`), not
/// from an fsync here.
pub(crate) fn write_durably(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| std::io::Error::other("no parent directory"))?;
    fs::create_dir_all(dir)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temp = dir.join(format!(
        ".{name}{TEMP_MARKER}{}",
        uuid::Uuid::new_v4().simple()
    ));
    let result = (|| {
        let mut file = File::create(&temp)?;
        file.write_all(bytes)?;
        fs::rename(&temp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&temp);
    }
    result
}

/// The manifest of each state goes to its own file (`run.json`, then `prepared.json`):
/// replacing a file by rename makes ext4 flush it first (auto_da_alloc), a few ms.
/// Writes and deletes save only `prepared.json` (recovery drops a run without one);
/// `run.json` is still read, from runs an earlier daemon left.
pub(crate) fn manifest_file(dir: &Path, state: RunState) -> PathBuf {
    match state {
        RunState::Staged => dir.join("run.json"),
        RunState::Prepared => dir.join("prepared.json"),
    }
}

pub(crate) fn save_manifest(dir: &Path, manifest: &Manifest) -> ToolResult<()> {
    let bytes = serde_json::to_vec(manifest).map_err(|e| ToolError::internal("manifest", e))?;
    write_durably(&manifest_file(dir, manifest.state), &bytes)
        .map_err(|e| io_error("writing the run manifest", e))
}

/// The latest manifest of a run directory.
pub(crate) fn load_manifest(dir: &Path) -> Option<Manifest> {
    [RunState::Prepared, RunState::Staged]
        .into_iter()
        .find_map(|state| fs::read(manifest_file(dir, state)).ok())
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
}

pub(crate) fn io_error(context: &str, error: std::io::Error) -> ToolError {
    ToolError::io(context, error)
}

pub(crate) fn read_current(absolute: &Path) -> ToolResult<Option<Vec<u8>>> {
    match fs::read(absolute) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::IsADirectory => Err(ToolError::invalid_argument(
            "that path is a directory",
            "name a page file",
        )),
        Err(e) => Err(io_error("reading the page", e)),
    }
}

/// Longest a write waits for a page missing while someone else's git command holds
/// `.git/index.lock` (`read_settled`).
const MISSING_WAIT: Duration = Duration::from_secs(2);

/// The page as `read_current` reads it, except that a page found missing while someone
/// else's git command holds `.git/index.lock` is read again until that lock is gone
/// (at most `MISSING_WAIT`): `git stash` and `git reset --hard` rewrite each file they
/// check out by removing it first, and an append in that instant answered `not_found`
/// (seen under load in the hand-commit tests). alexandria's own lock (a group's open
/// git session) holds a token starting `alexandria `, and is not waited for.
pub(crate) fn read_settled(absolute: &Path, git_dir: &Path) -> ToolResult<Option<Vec<u8>>> {
    let mut current = read_current(absolute)?;
    if current.is_some() {
        return Ok(current);
    }
    let lock = git_dir.join("index.lock");
    let someone_elses = || {
        let mut head = [0u8; 11];
        File::open(&lock)
            .and_then(|mut f| std::io::Read::read(&mut f, &mut head))
            .is_ok_and(|n| &head[..n] != b"alexandria ")
    };
    let deadline = std::time::Instant::now() + MISSING_WAIT;
    while current.is_none() && someone_elses() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
        current = read_current(absolute)?;
    }
    // The lock may have gone between the read and the look at it.
    if current.is_none() {
        current = read_current(absolute)?;
    }
    Ok(current)
}

/// The page text after `op` (`create`, `append`, `str_replace`) with `payload` (the
/// content, or `new_str`) on `current` (None: no page).
pub fn apply_command(
    op: &str,
    path: &str,
    current: Option<&str>,
    payload: &str,
    old_str: Option<&str>,
) -> ToolResult<String> {
    match (op, current) {
        ("create", Some(_)) => Err(ToolError::invalid_argument(
            format!("{path} already exists"),
            "read it, then use str_replace or append to change it (create never overwrites)",
        )),
        ("create", None) => Ok(payload.to_string()),
        (_, None) => Err(ToolError::not_found(path)),
        ("append", Some(text)) => {
            let mut text = text.to_string();
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(payload);
            if !text.ends_with('\n') {
                text.push('\n');
            }
            Ok(text)
        }
        ("str_replace", Some(text)) => {
            let old = old_str.unwrap_or_default();
            match text.matches(old).count() {
                0 => Err(ToolError::new(
                    ErrorCode::NoMatch,
                    format!("old_str does not occur in {path}"),
                    "read the page again and copy the exact text (whitespace included)",
                )),
                1 => Ok(text.replacen(old, payload, 1)),
                n => Err(ToolError::new(
                    ErrorCode::AmbiguousMatch,
                    format!("old_str occurs {n} times in {path}"),
                    "include more surrounding text in old_str so it occurs exactly once",
                )
                .with_detail("occurrences", n)),
            }
        }
        (other, _) => Err(ToolError::internal("write command", other.to_string())),
    }
}

/// Removes a run directory when the run ends, however it ends, unless it reached
/// `prepared` and failed (recovery must see it then).
pub(crate) struct RunDirCleanup(pub(crate) PathBuf);

impl Drop for RunDirCleanup {
    fn drop(&mut self) {
        let prepared = load_manifest(&self.0).is_some_and(|m| m.state == RunState::Prepared);
        if !prepared {
            let _ = fs::remove_dir_all(&self.0);
        }
    }
}

/// What a completed run produced.
pub struct Completed {
    pub commit: String,
    /// Rev of the page after the run (None: deleted). Differs from the manifest's when
    /// the write was applied again on top of an outside save.
    pub rev: Option<String>,
    /// What the run wrote, to be flushed before it is acknowledged.
    pub durable: Durable,
}

/// A version of the page that the daemon found in place of the one it planned against
/// (an editor's save), committed before the run's own commit.
struct OutsideVersion {
    op: &'static str,
    commit: String,
    previous_commit: String,
    /// The history entry's text.
    summary: String,
}

/// Carry a prepared run to the end: file in place, git commit(s), SQLite, run dir gone.
/// Every step checks whether it already happened, so recovery can call this again.
/// `changed` is set once the page or the repository was touched (from then on a
/// failure is rolled back).
/// Runs under the workspace's `index_lock` (`_index`), which the caller keeps through
/// a roll-back, so the rescanner never sees the page of a run that is being undone.
fn complete(
    store: &Store,
    manifest: &Manifest,
    changed: &Cell<bool>,
    _index: &MutexGuard<'_, ()>,
) -> ToolResult<Completed> {
    let workspace = &manifest.workspace;
    let root = store.workspace_dir(workspace);
    let dir = run_dir(store, workspace, &manifest.run_id);
    let state = store.state(workspace);

    // 0. Already recorded? Then only the run directory is left to remove.
    {
        let connection = store.pool.get()?;
        let recorded: Option<Option<String>> = connection
            .query_row(
                "SELECT commit_id FROM runs WHERE workspace = ?1 AND run_id = ?2",
                params![workspace, manifest.run_id],
                |r| r.get(0),
            )
            .optional()?;
        if let Some(commit) = recorded {
            // The files its swaps replaced may have received a save after the commit
            // (a crash came before the directory was kept for the watch): recovery
            // looks at them as at a kept directory (`late::recover`).
            late::keep_for_recovery(&dir);
            return Ok(Completed {
                commit: commit.unwrap_or_default(),
                rev: manifest.new_rev.clone(),
                durable: Durable::default(),
            });
        }
    }

    // 1 and 2. The page and the commit(s), under git's index lock.
    let timeout = git_lock_timeout(store);
    let (done, outside, mut durable) = state.with_repo(&root, |repo| -> ToolResult<_> {
        let mut session = git::Session::begin(repo, timeout).map_err(git_error)?;
        let (done, outside, _) = commit_page(&mut session, &root, manifest, &dir, changed, true);
        // Whatever was committed (outside versions too) reaches git's index, also
        // when the write itself ends in `stale_plan`.
        let finished = session.finish().map_err(git_error);
        match (done, finished) {
            (Ok((commit, rev)), Ok(finished)) => Ok((
                Ok((finished.id(&commit), rev)),
                follow(outside, &finished),
                finished.durable,
            )),
            (Err(error), Ok(finished)) if error.code == ErrorCode::StalePlan => {
                Ok((Err(error), follow(outside, &finished), Durable::default()))
            }
            (Err(error), _) | (Ok(_), Err(error)) => Err(error),
        }
    })?;
    crash_point("after_commit");

    // 3. State and index, in one transaction.
    let mut connection = store.pool.get()?;
    let transaction = crate::db::write_transaction(&mut connection)?;
    let now = now_ms();
    let recorded = record(
        &transaction,
        &root,
        manifest,
        done.as_ref().ok(),
        &outside,
        now,
    );
    let (commit, rev) = match (done, recorded) {
        (_, Err(error)) => return Err(error),
        (Ok(done), Ok(())) => done,
        (Err(error), Ok(())) => {
            transaction.commit()?;
            return Err(error);
        }
    };
    transaction.commit()?;
    crash_point("after_index");
    let _ = fs::remove_dir_all(&dir);
    store.changed(workspace, &manifest.path);
    page_written(&mut durable, &root, manifest);
    durable.file(wal_file(store));
    Ok(Completed {
        commit,
        rev,
        durable,
    })
}

/// What `commit_page` hands back: the run's commit and rev (or why not), the outside
/// versions committed before it, and the replaced files to watch after the write.
type PageDone = (
    ToolResult<(String, Option<String>)>,
    Vec<OutsideVersion>,
    Vec<late::Watch>,
);

/// The outside versions' commits as they ended (made again on top of a branch someone
/// moved during the session: `git::Finished::id`).
fn follow(outside: Vec<OutsideVersion>, finished: &git::Finished) -> Vec<OutsideVersion> {
    outside
        .into_iter()
        .map(|version| OutsideVersion {
            commit: finished.id(&version.commit),
            previous_commit: finished.id(&version.previous_commit),
            ..version
        })
        .collect()
}

/// Put a prepared run's page in place (or in the trash) and commit it in `session`.
/// Returns the commit and the page's rev, and the outside versions committed before
/// it (kept also when the run ends in `stale_plan`).
fn commit_page(
    session: &mut git::Session<'_>,
    root: &Path,
    manifest: &Manifest,
    dir: &Path,
    changed: &Cell<bool>,
    recovering: bool,
) -> PageDone {
    let target = root.join(&manifest.path);
    let mut page = Page::new(session, manifest, root, &target, dir, changed, recovering);
    let done = page.commit_run(dir);
    // Every file a swap replaced may be open in an editor that saves into it later.
    let placed = match &done {
        Ok((_, rev)) => rev.clone(),
        Err(_) => fs::read(&target).ok().map(|b| revision(&b)),
    };
    let watches = std::mem::take(&mut page.late)
        .into_iter()
        .filter(place::Replaced::is_open)
        .map(|replaced| late::Watch::new(manifest, placed.clone(), replaced))
        .collect();
    (done, page.outside, watches)
}

/// The SQLite rows of a run: its outside versions, and when it was committed
/// (`done`) the run, its history entry, its event and the page's index entries.
fn record(
    transaction: &rusqlite::Transaction<'_>,
    root: &Path,
    manifest: &Manifest,
    done: Option<&(String, Option<String>)>,
    outside: &[OutsideVersion],
    now: i64,
) -> ToolResult<()> {
    let workspace = &manifest.workspace;
    for version in outside {
        transaction.prepare_cached(
            "INSERT OR IGNORE INTO wiki_log_entries(ts, workspace, run_id, op, path, summary, origin, commit_id, previous_commit)
             VALUES (?1, ?2, NULL, ?3, ?4, ?5, 'outside', ?6, ?7)")?
            .execute(params![
                now,
                workspace,
                version.op,
                manifest.path,
                version.summary,
                version.commit,
                version.previous_commit,
            ],
        )?;
    }
    let Some((commit, _)) = done else {
        return Ok(());
    };
    record_run(transaction, root, manifest, commit, now)
}

/// The run's own rows (see `record`).
fn record_run(
    transaction: &rusqlite::Transaction<'_>,
    root: &Path,
    manifest: &Manifest,
    commit: &str,
    now: i64,
) -> ToolResult<()> {
    let workspace = &manifest.workspace;
    let already: bool = transaction
        .prepare_cached("SELECT count(*) FROM runs WHERE workspace = ?1 AND run_id = ?2")?
        .query_row(params![workspace, manifest.run_id], |r| r.get::<_, i64>(0))
        .map(|n| n > 0)?;
    if already {
        return Ok(());
    }
    transaction.prepare_cached(
        "INSERT INTO runs(run_id, workspace, tool, client, session, state, started_at, finished_at, commit_id)
         VALUES (?1, ?2, ?3, ?4, ?5, 'committed', ?6, ?7, ?8)")?
        .execute(params![manifest.run_id, workspace, manifest.tool, manifest.client, manifest.session, manifest.started_at, now, commit],
    )?;
    // OR IGNORE: a history import from git may have recorded this commit already.
    transaction.prepare_cached(
        "INSERT OR IGNORE INTO wiki_log_entries(ts, workspace, run_id, op, path, summary, origin, commit_id)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'agent', ?7)")?
        .execute(params![now, workspace, manifest.run_id, manifest.op, manifest.path, manifest.summary, commit],
    )?;
    transaction.prepare_cached(
        "INSERT INTO events(ts, workspace, kind, data) VALUES (?1, ?2, 'run_committed', ?3)")?
        .execute(params![now, workspace, json!({"run_id": manifest.run_id, "op": manifest.op, "path": manifest.path, "commit": commit, "client": manifest.client}).to_string()],
    )?;
    if manifest.new_rev.is_some() {
        // Not an error when a racing `git reset` took it off the disk: the write is
        // committed (failing here failed every write of the group, and rolled them back).
        index::index_or_forget(
            transaction,
            workspace,
            &manifest.path,
            &root.join(&manifest.path),
        )?;
    } else {
        index::remove_file(transaction, workspace, &manifest.path)?;
    }
    Ok(())
}

/// The page files a run wrote (or moved to the trash), for the flush.
fn page_written(durable: &mut Durable, root: &Path, manifest: &Manifest) {
    let target = root.join(&manifest.path);
    let layer = root.join(manifest.path.split('/').next().unwrap_or("wiki"));
    if manifest.new_rev.is_some() {
        durable.parents_up_to(&target, &layer);
        durable.file(target);
    } else {
        if let Some(parent) = target.parent() {
            durable.dir(parent);
        }
        if let Some(trash) = &manifest.trash_path {
            let trash = root.join(trash);
            durable.parents_up_to(&trash, &root.join(".trash"));
            durable.file(trash);
        }
    }
}

/// `state.db`'s write-ahead log: committed transactions live there until a checkpoint
/// (`synchronous = NORMAL` does not flush them at commit).
fn wal_file(store: &Store) -> PathBuf {
    let mut name = store.home.state_db().into_os_string();
    name.push("-wal");
    PathBuf::from(name)
}

fn short(commit: &str) -> &str {
    &commit[..commit.len().min(12)]
}

/// Where recovery finds a run's page (`Page::resume`).
enum Resume {
    /// Nothing swapped yet (or saved over since): swap the run's text in.
    Fresh,
    /// The run's text is in place and replaced what it was planned against.
    InPlace(Vec<u8>),
    /// The run was being undone: it ends with `stale_plan`.
    Stale,
    /// The run's `content` is in place; the swap's result was not looked at yet.
    Swapped {
        content: Vec<u8>,
        expected: Option<String>,
        ours: bool,
        swapped: Box<place::Swapped>,
    },
}

/// A page being put in place (or in the trash) by a run, with git's index lock held.
struct Page<'a, 'r> {
    session: &'a mut git::Session<'r>,
    manifest: &'a Manifest,
    root: &'a Path,
    target: &'a Path,
    /// Rev of the page in HEAD now.
    committed: Option<String>,
    outside: Vec<OutsideVersion>,
    changed: &'a Cell<bool>,
    /// Completing a run a dead daemon left: its commit may be below HEAD.
    recovering: bool,
    /// The run's directory: every swap keeps what it replaced there (`Kept`).
    dir: &'a Path,
    /// Swaps so far (numbers the kept files).
    swaps: usize,
    /// Files kept by the swaps of a run a dead daemon left (recovery only).
    kept: Vec<Kept>,
    /// What the swaps replaced, still open, to be watched after the write.
    late: Vec<place::Replaced>,
    /// The history text of the outside versions committed now.
    reason: Reason,
}

/// Why an outside version is committed (its history entry says so).
#[derive(Clone, Copy)]
enum Reason {
    /// Found by the swap of a write.
    During,
    /// Saved into the file a write replaced, after the write.
    Late,
    /// Found by recovery in the run directory of a write the daemon did not finish.
    Recovered,
    /// The page's current version, committed again on top of a late save.
    Newer,
}

/// A file a swap left in the run's directory: `swap-NNN-<rev>` (the run's text, rev
/// `<rev>`, was put in place) or `back-NNN-<rev>` (an outside version was put back;
/// `none`: the page was taken away). Once the swap happened it holds what the page was
/// before; it stays until the run's directory goes, after its commit.
struct Kept {
    n: usize,
    back: bool,
    placed: String,
    path: PathBuf,
    bytes: Vec<u8>,
}

impl Kept {
    /// Whether the swap happened (it holds what was replaced, not what was placed).
    fn swapped(&self) -> bool {
        revision(&self.bytes) != self.placed
    }
}

/// The files the swaps of a run kept, oldest first.
fn kept_versions(dir: &Path) -> Vec<Kept> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut kept: Vec<Kept> = entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let (kind, rest) = name.split_once('-')?;
            let back = match kind {
                "swap" => false,
                "back" => true,
                _ => return None,
            };
            let (n, placed) = rest.split_once('-')?;
            Some(Kept {
                n: n.parse().ok()?,
                back,
                placed: placed.to_string(),
                bytes: fs::read(entry.path()).ok()?,
                path: entry.path(),
            })
        })
        .collect();
    kept.sort_by_key(|k| k.n);
    kept
}

/// How far below HEAD recovery looks for a run's commit: a group commits up to 64
/// runs, each maybe after outside versions of its page.
const RECOVERY_DEPTH: usize = 512;

/// The commit naming `run_id` among the `depth` newest first-parent commits from `head`.
fn run_commit(head: &git2::Commit<'_>, run_id: &str, depth: usize) -> Option<git2::Oid> {
    let mut cursor = head.clone();
    for _ in 0..depth {
        if cursor
            .message()
            .is_ok_and(|m| message::names_run(m, run_id))
        {
            return Some(cursor.id());
        }
        cursor = cursor.parent(0).ok()?;
    }
    None
}

fn rev_of(bytes: Option<&[u8]>) -> Option<String> {
    bytes.map(revision)
}

fn stale(path: &str, why: &str) -> ToolError {
    ToolError::new(
        ErrorCode::StalePlan,
        format!("{path} {why} while the write was in progress"),
        "read the page again and re-plan the edit; the other version is kept in git (see history)",
    )
}

impl<'a, 'r> Page<'a, 'r> {
    fn new(
        session: &'a mut git::Session<'r>,
        manifest: &'a Manifest,
        root: &'a Path,
        target: &'a Path,
        dir: &'a Path,
        changed: &'a Cell<bool>,
        recovering: bool,
    ) -> Self {
        let kept = if recovering {
            kept_versions(dir)
        } else {
            Vec::new()
        };
        Page {
            session,
            manifest,
            root,
            target,
            committed: None,
            outside: Vec::new(),
            changed,
            recovering,
            dir,
            swaps: kept.last().map_or(0, |k| k.n + 1),
            kept,
            late: Vec::new(),
            reason: Reason::During,
        }
    }
}

impl Page<'_, '_> {
    /// Put the page in place (or in the trash) and commit the run, unless HEAD has it
    /// already (a crash after the commit). Returns the commit and the page's rev.
    fn commit_run(&mut self, dir: &Path) -> ToolResult<(String, Option<String>)> {
        let manifest = self.manifest;
        // The session's newest commit (earlier writes of the group are on it; HEAD's
        // branch moves when the session finishes).
        self.committed = self
            .session
            .tip_entry(&manifest.path)
            .ok()
            .flatten()
            .map(|id| id.to_string());
        // Versions the swaps of a dead daemon replaced, that git does not have yet.
        let recovered = self.commit_kept()?;
        // Committed before a crash (on top, or below later runs of its group); the
        // index may not have followed. The newest commit, when this session made it,
        // is known without reading it.
        let depth = if self.recovering { RECOVERY_DEPTH } else { 1 };
        let found = match self.session.tip_message() {
            Some(message) if depth == 1 => {
                message::names_run(message, &manifest.run_id).then(|| self.session.tip_id())
            }
            _ => run_commit(
                &self.session.tip().map_err(git_error)?,
                &manifest.run_id,
                depth,
            ),
        };
        if let Some(found) = found {
            self.changed.set(true);
            self.session
                .stage_head_version(&manifest.path)
                .map_err(git_error)?;
            let rev = fs::read(self.target).ok().map(|b| revision(&b));
            // A save that landed in the file the run replaced, after its commit: put
            // it in place unless the page changed since.
            if let Some(version) = recovered
                && rev.as_ref().is_some_and(|r| self.ours(r))
            {
                self.put_back(Some(version), rev.clone())?;
            }
            return Ok((found.to_string(), rev));
        }
        let mut late = None;
        let (bytes, stat) = match (&manifest.new_rev, &manifest.trash_path) {
            (Some(_), _) => {
                let final_text = match &manifest.text {
                    Some(text) => text.clone().into_bytes(),
                    None => fs::read(dir.join("final"))
                        .map_err(|e| io_error("reading the prepared page", e))?,
                };
                let (bytes, stat, replaced) = self.put(final_text, dir)?;
                late = replaced;
                (Some(bytes), stat)
            }
            (None, Some(trash)) => {
                let trash = self.root.join(trash);
                self.trash(&trash)?;
                (None, None)
            }
            (None, None) => return Err(ToolError::internal("run manifest", "nothing to do")),
        };
        crash_point("after_move");
        let author = git2::Signature::now(
            &message::author_name(manifest.client.as_deref()),
            "agent@alexandria.local",
        )
        .map_err(git2_error)?;
        let message = message::agent(&message::AgentCommit {
            run_id: manifest.run_id.clone(),
            op: manifest.op.clone(),
            path: manifest.path.clone(),
            tool: manifest.tool.clone(),
            client: manifest.client.clone(),
            session: manifest.session.clone(),
            summary: manifest.summary.clone(),
        });
        let change = git::Change {
            path: &manifest.path,
            content: git::Content::of(bytes.as_deref()),
            stat: stat.as_ref(),
        };
        let id = self
            .session
            .commit(&[change], &message, &author)
            .map_err(git_error)?;
        let rev = bytes.as_deref().map(revision);
        // An editor that opened the page before the swap and saved into it in place
        // only now: its save went into the file this write replaced. Keep it: commit it
        // as an outside edit (history then names this run's commit as holding the text
        // it removed) and put it back in place.
        if let Some(mut replaced) = late {
            if replaced
                .refresh(false)
                .map_err(|e| io_error("reading the replaced page", e))?
            {
                self.reason = Reason::Late;
                self.commit_outside(replaced.bytes.as_deref())?;
                self.put_back(replaced.bytes.clone(), rev.clone())?;
            }
            // Watched a little longer, after the write (`late.rs`).
            self.late.push(replaced);
        }
        Ok((id.to_string(), rev))
    }

    /// Whether `rev` is a text this run put in place.
    fn ours(&self, rev: &str) -> bool {
        self.manifest.new_rev.as_deref() == Some(rev)
            || self.kept.iter().any(|k| !k.back && k.placed == rev)
    }

    /// Recovery: commit, oldest first, every version the swaps of this run replaced
    /// (kept in its directory) that HEAD's recent history does not hold; for one it
    /// holds, make sure its history entry is there. Returns the newest committed now.
    fn commit_kept(&mut self) -> ToolResult<Option<Vec<u8>>> {
        let placed: std::collections::HashSet<String> = self
            .kept
            .iter()
            .map(|k| k.placed.clone())
            .chain(self.manifest.new_rev.clone())
            .collect();
        let versions: Vec<Vec<u8>> = self
            .kept
            .iter()
            .filter(|k| k.swapped() && !placed.contains(&revision(&k.bytes)))
            .map(|k| k.bytes.clone())
            .collect();
        let mut newest = None;
        let reason = std::mem::replace(&mut self.reason, Reason::Recovered);
        for bytes in versions {
            if self.explain(&revision(&bytes))? {
                continue;
            }
            tracing::warn!(path = %self.manifest.path, run = %self.manifest.run_id, "recovery found a version of the page that a swap replaced and git does not have; committing it");
            self.commit_outside(Some(&bytes))?;
            newest = Some(bytes);
        }
        self.reason = reason;
        Ok(newest)
    }

    /// Whether a recent commit of HEAD's first-parent history holds `rev` at the
    /// page's path. If an outside commit of alexandria brought it there, its history
    /// entry is recorded (again: the daemon may have died before it was).
    fn explain(&mut self, rev: &str) -> ToolResult<bool> {
        let path = Path::new(&self.manifest.path);
        let blob_at = |commit: &git2::Commit<'_>| {
            commit
                .tree()
                .ok()
                .and_then(|t| t.get_path(path).ok())
                .map(|e| e.id().to_string())
        };
        let mut cursor = self.session.tip().map_err(git_error)?;
        for _ in 0..RECOVERY_DEPTH {
            let parent = cursor.parent(0).ok();
            if blob_at(&cursor).as_deref() == Some(rev) {
                let before = parent.as_ref().and_then(blob_at);
                if before.as_deref() == Some(rev) {
                    // Brought further down.
                } else {
                    if cursor.author().name() == Ok("outside alexandria") {
                        let previous = parent.map(|p| p.id().to_string()).unwrap_or_default();
                        self.outside.push(OutsideVersion {
                            op: if before.is_none() {
                                "outside_create"
                            } else {
                                "outside_edit"
                            },
                            commit: cursor.id().to_string(),
                            summary: self.summary(&previous),
                            previous_commit: previous,
                        });
                    }
                    return Ok(true);
                }
            }
            match parent {
                Some(parent) => cursor = parent,
                None => break,
            }
        }
        Ok(false)
    }

    /// The history text of an outside version committed now.
    fn summary(&self, previous: &str) -> String {
        let run = &self.manifest.run_id;
        let previous = short(previous);
        match self.reason {
            Reason::During => format!(
                "saved outside alexandria while run {run} was writing the page; committed as found; the text before is in commit {previous}"
            ),
            Reason::Late => format!(
                "saved outside alexandria into the file that run {run} replaced, after that write (an editor that had the page open); committed as found; the text before is in commit {previous}"
            ),
            Reason::Newer => format!(
                "the page had changed since run {run} when a save into the file that run replaced was found; that save is in commit {previous}; the page's current version stays in place and is committed again"
            ),
            Reason::Recovered => format!(
                "saved outside alexandria while run {run} was writing the page, found by recovery after the daemon stopped; committed as found; the text before is in commit {previous}"
            ),
        }
    }

    /// Commit a version found on disk that HEAD does not have (an outside save).
    fn commit_outside(&mut self, bytes: Option<&[u8]>) -> ToolResult<()> {
        let rev = rev_of(bytes);
        if rev == self.committed {
            return Ok(());
        }
        crate::faults::fail_point("commit_outside")
            .map_err(|e| io_error("committing a version saved outside alexandria", e))?;
        let op = match (&self.committed, bytes) {
            (None, _) => "outside_create",
            (Some(_), None) => "outside_delete",
            (Some(_), Some(_)) => "outside_edit",
        };
        self.commit_version(
            bytes,
            op,
            "Saved outside alexandria (an editor, a sync tool) while an agent was writing \
             the page; committed as found, before the agent's write, so that no version is lost.",
        )
    }

    /// Commit `bytes` (None: no page) as the page's version, authored "outside
    /// alexandria", with history entry `op`.
    fn commit_version(
        &mut self,
        bytes: Option<&[u8]>,
        op: &'static str,
        body: &str,
    ) -> ToolResult<()> {
        let rev = rev_of(bytes);
        let previous = self.session.tip().map_err(git_error)?.id().to_string();
        let path = &self.manifest.path;
        let message = message::outside(op, &format!("{op} {path}"), body);
        let author = git2::Signature::now("outside alexandria", "outside@alexandria.local")
            .map_err(git2_error)?;
        let change = git::Change {
            path,
            content: git::Content::of(bytes),
            stat: None,
        };
        let commit = self
            .session
            .commit(&[change], &message, &author)
            .map_err(git_error)?;
        tracing::info!(path = %path, run = %self.manifest.run_id, "committed an outside save found during a write");
        self.committed = rev;
        self.outside.push(OutsideVersion {
            op,
            commit: commit.to_string(),
            summary: self.summary(&previous),
            previous_commit: previous,
        });
        Ok(())
    }

    /// Swap `bytes` in; returns what was replaced, which stays in the run's directory
    /// (`kind`: `swap` for the run's text, `back` for an outside version put back).
    fn swap(&mut self, bytes: &[u8], kind: &str) -> ToolResult<place::Swapped> {
        let keep = self.keep_path(kind, &revision(bytes));
        place::swap_in(self.target, bytes, &keep).map_err(|e| io_error("writing the page", e))
    }

    fn keep_path(&mut self, kind: &str, placed: &str) -> PathBuf {
        self.swaps += 1;
        self.dir
            .join(format!("{kind}-{:03}-{placed}", self.swaps - 1))
    }

    /// Put the run's page in place. If what it replaced is not what the write was
    /// planned against, that version is committed first, then the write is applied
    /// again on top of it (append; str_replace while `old_str` is unique) or undone
    /// (`stale_plan`). Returns the bytes in place and their stat data.
    fn put(
        &mut self,
        final_text: Vec<u8>,
        dir: &Path,
    ) -> ToolResult<(Vec<u8>, Option<std::fs::Metadata>, Option<place::Replaced>)> {
        let mut content = final_text;
        // What the swap should replace: the plan's page, later our own earlier bytes.
        let mut expected = self.manifest.old_rev.clone();
        let mut ours = false;
        // A swap a dead daemon made and did not get to look at.
        let mut pending = None;
        match self.resume()? {
            Resume::Fresh => {}
            Resume::InPlace(bytes) => {
                let stat = fs::metadata(self.target).ok();
                return Ok((bytes, stat, None));
            }
            Resume::Stale => {
                return Err(stale(
                    &self.manifest.path,
                    "was changed outside alexandria (the other version is committed)",
                ));
            }
            Resume::Swapped {
                content: placed,
                expected: then,
                ours: after_ours,
                swapped,
            } => {
                content = placed;
                expected = then;
                ours = after_ours;
                pending = Some(*swapped);
            }
        }
        self.changed.set(true);
        // An empty page where HEAD has text is most likely an editor's save in place,
        // caught between truncating and writing.
        let empty = revision(b"");
        for _ in 0..8 {
            let expect_content = self.committed.as_ref().is_some_and(|c| *c != empty);
            let swapped = match pending.take() {
                Some(swapped) => swapped,
                None => {
                    if let Some(delay) = crate::faults::delay_for("swap") {
                        std::thread::sleep(delay);
                    }
                    let swapped = self.swap(&content, "swap")?;
                    crash_point("after_swap");
                    swapped
                }
            };
            let mut replaced = swapped.replaced;
            let mut found = rev_of(replaced.bytes.as_deref());
            if found != expected || found.as_deref() == Some(empty.as_str()) {
                // Let an editor writing in place finish.
                replaced
                    .refresh(expect_content)
                    .map_err(|e| io_error("reading the replaced page", e))?;
                found = rev_of(replaced.bytes.as_deref());
            }
            if !(ours && found == expected) {
                self.commit_outside(replaced.bytes.as_deref())?;
            }
            if found == expected {
                // A late write in place into the file just replaced?
                let late = replaced
                    .refresh(false)
                    .map_err(|e| io_error("reading the replaced page", e))?;
                if !late {
                    return Ok((content, swapped.stat, Some(replaced)));
                }
                self.commit_outside(replaced.bytes.as_deref())?;
            }
            // Not what the write was planned against.
            let again = self.reapply(replaced.bytes.as_deref(), dir);
            let bytes = replaced.bytes.clone();
            self.late.push(replaced);
            match again {
                Some(again) => {
                    expected = Some(revision(&content));
                    ours = true;
                    content = again;
                }
                None => {
                    self.put_back(bytes, Some(revision(&content)))?;
                    return Err(stale(
                        &self.manifest.path,
                        "was changed outside alexandria (the other version is committed)",
                    ));
                }
            }
        }
        Err(stale(
            &self.manifest.path,
            "kept changing outside alexandria",
        ))
    }

    /// Where a run a dead daemon left stands (recovery; otherwise `Fresh`, or
    /// `InPlace` when the page already holds the run's text).
    fn resume(&mut self) -> ToolResult<Resume> {
        let on_disk = fs::read(self.target).ok();
        let disk = rev_of(on_disk.as_deref());
        // The last swap that happened, what it was expected to replace, and whether
        // that was the run's own earlier text.
        let mut expected = self.manifest.old_rev.clone();
        let mut ours = false;
        let mut last: Option<(usize, Option<String>, bool)> = None;
        for (i, kept) in self.kept.iter().enumerate() {
            if kept.swapped() {
                last = Some((i, expected.clone(), ours));
            }
            if !kept.back {
                expected = Some(kept.placed.clone());
                ours = true;
            }
        }
        let Some((i, expected, ours)) = last else {
            return Ok(match on_disk {
                // In place before a crash: whatever it replaced was checked then.
                Some(bytes) if disk == self.manifest.new_rev => Resume::InPlace(bytes),
                _ => Resume::Fresh,
            });
        };
        let kept = &self.kept[i];
        let placed_there = disk.as_deref() == Some(kept.placed.as_str());
        if kept.back {
            // The run was being undone (`stale_plan`): what that swap replaced, if
            // not the run's text, is newer than what it put back, and belongs there.
            let replaced = revision(&kept.bytes);
            if placed_there && !self.ours(&replaced) {
                let version = (kept.placed != "none").then(|| kept.bytes.clone());
                self.changed.set(true);
                self.put_back(version, disk)?;
            }
            return Ok(Resume::Stale);
        }
        let Some(content) = on_disk.filter(|_| placed_there) else {
            // Saved over since: a new swap finds that save.
            return Ok(Resume::Fresh);
        };
        if Some(revision(&kept.bytes)) == expected {
            return Ok(Resume::InPlace(content));
        }
        let replaced =
            place::Replaced::open(&kept.path).map_err(|e| io_error("reading a kept page", e))?;
        Ok(Resume::Swapped {
            content,
            expected,
            ours,
            swapped: Box::new(place::Swapped {
                stat: fs::metadata(self.target).ok(),
                replaced,
            }),
        })
    }

    /// The run's write applied to `current` (an outside version), if it still applies.
    fn reapply(&self, current: Option<&[u8]>, dir: &Path) -> Option<Vec<u8>> {
        if self.manifest.pinned_base {
            return None;
        }
        let current = String::from_utf8(current?.to_vec()).ok()?;
        if !matches!(self.manifest.op.as_str(), "append" | "str_replace") {
            return None;
        }
        let payload = match &self.manifest.payload {
            Some(payload) => payload.clone(),
            None => fs::read_to_string(dir.join("staged").join("payload")).ok()?,
        };
        apply_command(
            &self.manifest.op,
            &self.manifest.path,
            Some(&current),
            &payload,
            self.manifest.old_str.as_deref(),
        )
        .ok()
        .filter(|t| t.len() <= MAX_PAGE_BYTES)
        .map(String::into_bytes)
    }

    /// Undo: put `version` (the newest outside version; None: no page) back where the
    /// run's bytes (`ours`) are. A save over ours meanwhile is newer still: it is
    /// committed and put back instead.
    fn put_back(
        &mut self,
        mut version: Option<Vec<u8>>,
        mut ours: Option<String>,
    ) -> ToolResult<()> {
        for _ in 0..8 {
            let replaced = match &version {
                Some(bytes) => {
                    let swapped = self.swap(bytes, "back")?;
                    let bytes = swapped.replaced.bytes.clone();
                    self.late.push(swapped.replaced);
                    bytes
                }
                None => {
                    let keep = self.keep_path("back", "none");
                    place::take_away(self.target, &keep)
                        .map_err(|e| io_error("removing the page", e))?
                }
            };
            let found = rev_of(replaced.as_deref());
            if found == ours {
                return Ok(());
            }
            self.commit_outside(replaced.as_deref())?;
            ours = rev_of(version.as_deref());
            version = replaced;
        }
        Ok(())
    }

    /// Move the page to the trash. A version the delete was not planned against is
    /// committed, put back, and the delete answered with `stale_plan`.
    fn trash(&mut self, trash: &Path) -> ToolResult<()> {
        if let Some(parent) = trash.parent() {
            fs::create_dir_all(parent).map_err(|e| io_error("creating the trash folder", e))?;
        }
        self.changed.set(true);
        match fs::rename(self.target, trash) {
            Ok(()) => {}
            // Gone already (moved before a crash, or deleted outside).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io_error("moving the page to .trash", e)),
        }
        let bytes = fs::read(trash).map_err(|e| io_error("reading the trashed page", e))?;
        let found = Some(revision(&bytes));
        self.commit_outside(Some(&bytes))?;
        if found != self.manifest.old_rev {
            place::restore(trash, self.target).map_err(|e| io_error("putting the page back", e))?;
            return Err(stale(
                &self.manifest.path,
                "was changed outside alexandria (the other version is committed)",
            ));
        }
        Ok(())
    }
}

/// How long a commit waits for someone else's `.git/index.lock`.
pub(crate) fn git_lock_timeout(store: &Store) -> Duration {
    Duration::from_secs_f64(store.config.write.lock_timeout_secs.clamp(0.05, 5.0))
}

/// The error for a repository a person is in the middle of using.
pub fn repository_in_use(state: git::GitState) -> ToolError {
    ToolError::new(
        ErrorCode::RepositoryInUse,
        format!(
            "the workspace's git repository is in use: {}; alexandria writes nothing into it until that is finished (reads keep working)",
            state.describe()
        ),
        format!(
            "ask the user to {} in the workspace, then retry",
            state.how_to_finish()
        ),
    )
    .with_detail("git_state", state.name())
}

pub(crate) fn git_error(error: git::GitError) -> ToolError {
    match error {
        git::GitError::Locked { path, waited } => ToolError::new(
            ErrorCode::WorkspaceBusy,
            format!(
                "the workspace's git index is locked by another git process ({}); waited {:.1}s",
                path.display(),
                waited.as_secs_f32()
            ),
            "wait for that git command to finish and retry; if no git command is running, remove .git/index.lock in the workspace",
        ),
        git::GitError::InUse(state) => repository_in_use(state),
        git::GitError::Moved => ToolError::new(
            ErrorCode::WorkspaceBusy,
            "another git command moved the workspace's branch while alexandria was committing; nothing was changed",
            "retry",
        ),
        git::GitError::Git(error) => git2_error(error),
        git::GitError::Io { context, source } => io_error(context, source),
    }
}

pub(crate) fn git2_error(error: git2::Error) -> ToolError {
    if error.code() == git2::ErrorCode::Locked {
        return ToolError::new(
            ErrorCode::WorkspaceBusy,
            format!(
                "the workspace's git repository is locked by another git process: {}",
                error.message()
            ),
            "wait for that git command to finish and retry",
        );
    }
    ToolError::internal("committing to git", error)
}

/// Refuse to write into a repository a person is in the middle of using.
pub fn check_writable(store: &Store, workspace: &str) -> ToolResult<()> {
    let root = store.workspace_dir(workspace);
    match store
        .state(workspace)
        .with_repo(&root, |repo| Ok::<_, git2::Error>(git::GitState::of(repo)))
        .map_err(git2_error)?
    {
        git::GitState::Clean => Ok(()),
        state => Err(repository_in_use(state)),
    }
}

/// A source copied into `raw/`: its path, the blob of the bytes copied, the file's stat.
pub struct Source {
    pub path: String,
    pub blob: git2::Oid,
    pub stat: Option<std::fs::Metadata>,
}

/// Store `bytes` as a git blob of the workspace (before they are committed).
pub fn store_blob(store: &Store, workspace: &str, bytes: &[u8]) -> ToolResult<git2::Oid> {
    let root = store.workspace_dir(workspace);
    store
        .state(workspace)
        .with_repo(&root, |repo| repo.blob(bytes))
        .map_err(git2_error)
}

/// Commit sources copied into `raw/` (with the workspace lock held), git's index kept
/// in step. Returns the commit id.
pub fn commit_sources(
    store: &Store,
    workspace: &str,
    sources: &[Source],
    message: &str,
) -> ToolResult<String> {
    let root = store.workspace_dir(workspace);
    let timeout = git_lock_timeout(store);
    store.state(workspace).with_repo(&root, |repo| {
        let mut session = git::Session::begin(repo, timeout).map_err(git_error)?;
        let changes: Vec<git::Change<'_>> = sources
            .iter()
            .map(|source| git::Change {
                path: &source.path,
                content: git::Content::Blob(source.blob),
                stat: source.stat.as_ref(),
            })
            .collect();
        let author =
            git2::Signature::now("alexandria", "alexandria@localhost").map_err(git2_error)?;
        let id = session
            .commit(&changes, message, &author)
            .map_err(git_error)?;
        let finished = session.finish().map_err(git_error)?;
        Ok(finished.id(&id.to_string()))
    })
}

/// Take the workspace lock for `run_id`, waiting up to `[write] lock_timeout_secs`.
pub fn lock_workspace<'a>(
    store: &Store,
    state: &'a crate::workspace::WorkspaceState,
    workspace: &str,
    run_id: &str,
) -> ToolResult<LockGuard<'a>> {
    let timeout = Duration::from_secs_f64(store.config.write.lock_timeout_secs);
    state.lock.acquire(
        &store.workspace_dir(workspace).join(".lock"),
        run_id,
        timeout,
    )
}

/// Make everything written so far durable with one `syncfs` of the home's file system
/// (a group of writes, unless `[write] flush_files`; ingest; source captures).
pub(crate) fn flush_to_disk(store: &Store, workspace: &str) -> ToolResult<()> {
    let dir =
        File::open(store.workspace_dir(workspace)).map_err(|e| io_error("flushing to disk", e))?;
    rustix::fs::syncfs(&dir).map_err(|e| io_error("flushing to disk", e.into()))
}

/// Complete a prepared run; if that fails (disk full, read-only file system …), undo
/// whatever part of it happened so that nothing is half-applied. A run refused before
/// it changed anything (git's index locked by someone else, a merge in progress) or
/// answered `stale_plan` (the page was put back) has nothing to undo.
///
/// Both happen under the workspace's `index_lock`: a failed run's page is on disk (and
/// its commit in HEAD) until the roll-back undoes it, and the rescanner, which takes
/// only that lock, must not index it or log it as an outside edit meanwhile.
pub(crate) fn complete_or_roll_back(store: &Store, manifest: &Manifest) -> ToolResult<Completed> {
    let changed = Cell::new(false);
    let state = store.state(&manifest.workspace);
    let index = state.index_lock.lock().unwrap_or_else(|p| p.into_inner());
    match complete(store, manifest, &changed, &index) {
        Ok(completed) => Ok(completed),
        Err(error) if !changed.get() || error.code == ErrorCode::StalePlan => {
            let _ = fs::remove_dir_all(run_dir(store, &manifest.workspace, &manifest.run_id));
            Err(error)
        }
        Err(error) => {
            tracing::error!(run = %manifest.run_id, %error, "write failed; rolling back");
            roll_back(store, manifest);
            Err(error)
        }
    }
}

/// Undo a run that cannot be completed, whatever steps it got through, so that files,
/// git and SQLite agree on the state before the run. Called with the workspace lock
/// held (or before serving), so HEAD can only hold this run's commit on top.
pub(crate) fn roll_back(store: &Store, manifest: &Manifest) {
    let root = store.workspace_dir(&manifest.workspace);
    let connection_has_run = store
        .pool
        .get()
        .ok()
        .and_then(|c| {
            c.query_row(
                "SELECT count(*) FROM runs WHERE run_id = ?1",
                params![manifest.run_id],
                |r| r.get::<_, i64>(0),
            )
            .ok()
        })
        .is_some_and(|n| n > 0);
    if connection_has_run {
        // Fully committed after all: nothing to undo.
        let _ = fs::remove_dir_all(run_dir(store, &manifest.workspace, &manifest.run_id));
        return;
    }
    let timeout = git_lock_timeout(store);
    let result = store.state(&manifest.workspace).with_repo(&root, |repo| {
        let mut session = git::Session::begin(repo, timeout)?;
        undo(&mut session, &root, manifest)?;
        session.finish().map(drop)
    });
    if let Err(error) = result {
        tracing::error!(run = %manifest.run_id, %error, "roll back failed");
    }
    if let Some(trash) = &manifest.trash_path {
        let _ = fs::remove_file(root.join(trash));
    }
    let _ = fs::remove_dir_all(run_dir(store, &manifest.workspace, &manifest.run_id));
}

/// The git and file part of a roll back, in an open session: HEAD's branch moves back
/// over the run's commit if it is on top, the page becomes HEAD's version again, and
/// so does its index entry.
fn undo(
    session: &mut git::Session<'_>,
    root: &Path,
    manifest: &Manifest,
) -> Result<(), git::GitError> {
    let repo = session.repo();
    let mut head = session.tip()?;
    if head
        .message()
        .is_ok_and(|m| message::names_run(m, &manifest.run_id))
    {
        let parent = head.parent(0)?;
        session.reset_soft(&parent)?;
        head = parent;
    }
    match head.tree()?.get_path(Path::new(&manifest.path)) {
        Ok(entry) => {
            let blob = repo.find_blob(entry.id())?;
            put_back_before(root, manifest, Some(blob.content()));
        }
        Err(_) => put_back_before(root, manifest, None),
    }
    session.stage_head_version(&manifest.path)
}

/// Make the page `before` again (None: no page) in place of a text the run put there.
/// What is there is swapped out and looked at: a version the run did not put there (an
/// editor's save since) is newer than `before` and goes back in place, to be committed
/// as an outside edit like any other.
fn put_back_before(root: &Path, manifest: &Manifest, before: Option<&[u8]>) {
    let target = root.join(&manifest.path);
    let dir = root.join("runs").join(&manifest.run_id);
    let ours = |rev: &str| {
        manifest.new_rev.as_deref() == Some(rev)
            || kept_versions(&dir)
                .iter()
                .any(|k| !k.back && k.placed == rev)
    };
    // The newest version a swap of the run replaced that is not the run's own text (an
    // editor's save, maybe not committed: the failure may be its commit's) is what the
    // page held last; it goes back rather than HEAD's older one.
    let replaced = kept_versions(&dir)
        .into_iter()
        .rev()
        .find(|k| k.swapped() && !ours(&revision(&k.bytes)));
    let before = match &replaced {
        Some(kept) => Some(kept.bytes.as_slice()),
        None => before,
    };
    let keep = dir.join(format!("undo-{}", uuid::Uuid::new_v4().simple()));
    let result = match before {
        Some(bytes) => place::swap_in(&target, bytes, &keep).and_then(|swapped| {
            let found = rev_of(swapped.replaced.bytes.as_deref());
            if found
                .as_deref()
                .is_some_and(|rev| !ours(rev) && rev != revision(bytes))
            {
                place::swap_back(&keep, &target)?;
            }
            Ok(())
        }),
        None => place::take_away(&target, &keep).and_then(|taken| {
            if taken
                .as_deref()
                .is_some_and(|bytes| !ours(&revision(bytes)))
            {
                place::restore(&keep, &target)?;
            }
            Ok(())
        }),
    };
    if let Err(error) = result {
        tracing::error!(path = %manifest.path, run = %manifest.run_id, %error, "cannot put the page back as it was before the run");
    }
    let _ = fs::remove_file(&keep);
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    /// A folder with an empty `.git/` and where its page would be (not made).
    fn workspace() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        let git_dir = dir.path().join(".git");
        fs::create_dir_all(&git_dir).expect("git dir");
        let page = dir.path().join("page.md");
        (dir, git_dir, page)
    }

    #[test]
    fn a_page_missing_while_someone_elses_git_holds_the_index_lock_is_read_once_it_is_back() {
        let (_dir, git_dir, page) = workspace();
        // `git reset --hard` at work: its lock (an index being written), the page
        // removed, written again, then the lock renamed away.
        fs::write(git_dir.join("index.lock"), b"DIRC\0\0\0\x02").expect("lock");
        let (page2, git_dir2) = (page.clone(), git_dir.clone());
        let git = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            fs::write(&page2, b"back\n").expect("page");
            fs::remove_file(git_dir2.join("index.lock")).expect("unlock");
        });
        let read = read_settled(&page, &git_dir).expect("read");
        git.join().expect("git thread");
        assert_eq!(read.as_deref(), Some(&b"back\n"[..]));
    }

    #[test]
    fn a_missing_page_is_not_waited_for_under_alexandrias_own_lock_or_none() {
        let (_dir, git_dir, page) = workspace();
        let started = Instant::now();
        assert_eq!(read_settled(&page, &git_dir).expect("read"), None);
        fs::write(git_dir.join("index.lock"), b"alexandria 1 2 3").expect("lock");
        assert_eq!(read_settled(&page, &git_dir).expect("read"), None);
        assert!(
            started.elapsed() < MISSING_WAIT / 2,
            "{:?}",
            started.elapsed()
        );
        // Someone else's lock that stays: given up after MISSING_WAIT.
        fs::write(git_dir.join("index.lock"), b"").expect("lock");
        let started = Instant::now();
        assert_eq!(read_settled(&page, &git_dir).expect("read"), None);
        assert!(started.elapsed() >= MISSING_WAIT, "{:?}", started.elapsed());
    }
}
