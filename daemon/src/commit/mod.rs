//! The write path (SPEC §5): stage → lock → check → commit → index, crash-safe.
//!
//! 1. Stage (no lock): validate the path and the citations of the new text, write the
//!    payload and a manifest under `runs/<run_id>/`.
//! 2. Lock: the workspace's in-process lock, then an `fcntl` lock on `<ws>/.lock` (so
//!    other processes are excluded too), waiting up to the configured timeout; past it,
//!    `workspace_busy` with the holder's run id (written into the lock file).
//! 3. Check and compute against the current page: `base_rev` → `stale_plan`,
//!    `str_replace` uniqueness, `create` on an existing page.
//! 4. Commit: the final text goes to `runs/<id>/final` and the manifest becomes
//!    `prepared` (fsynced); the file is renamed into `wiki/`; one git commit; one SQLite
//!    transaction (runs, wiki_log_entries, events, index); the run directory is removed;
//!    the lock is released; only then is the write acknowledged.
//!
//! Recovery (`recover`, at start before serving): a run still `staged` was never
//! acknowledged and is dropped; a `prepared` run is completed step by step, each step
//! being idempotent (file at the new rev? commit in HEAD? `runs` row present?).
//!
//! May import: `index`, `workspace`, `db`, `error`, `faults`. Tools call it; it never
//! calls a tool.

pub mod ingest;
pub mod recover;
pub mod watch;

pub use recover::recover;

use std::fs::{self, File};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use alexandria_proto::ErrorCode;
use rusqlite::{OptionalExtension, params};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::db::now_ms;
use crate::error::{ToolError, ToolResult};
use crate::faults::crash_point;
use crate::index;
use crate::workspace::{LockGuard, Store, revision};

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

/// Marker in the names of temporary files; recovery deletes leftovers.
pub(crate) const TEMP_MARKER: &str = ".alx-tmp-";

/// Replace `path` atomically with `bytes` (temp file + rename). Durability against
/// power loss comes from one `syncfs` per write before it is acknowledged (see
/// `flush_to_disk`), not from an fsync per file.
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
pub(crate) fn manifest_file(dir: &Path, state: RunState) -> PathBuf {
    match state {
        RunState::Staged => dir.join("run.json"),
        RunState::Prepared => dir.join("prepared.json"),
    }
}

pub(crate) fn save_manifest(dir: &Path, manifest: &Manifest) -> ToolResult<()> {
    let bytes =
        serde_json::to_vec_pretty(manifest).map_err(|e| ToolError::internal("manifest", e))?;
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
    match error.raw_os_error() {
        Some(28) => ToolError::new(
            ErrorCode::TooLarge,
            format!("{context}: the disk is full"),
            "free disk space, then retry; nothing was changed",
        ),
        Some(30) => ToolError::new(
            ErrorCode::Internal,
            format!("{context}: the file system is read-only"),
            "make the alexandria home writable, then retry; nothing was changed",
        ),
        _ => ToolError::internal(context, error),
    }
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

/// Carry a prepared run to the end: file in place, git commit, SQLite, run dir gone.
/// Every step checks whether it already happened, so recovery can call this again.
/// Returns the commit id.
pub(crate) fn complete(store: &Store, manifest: &Manifest) -> ToolResult<String> {
    let workspace = &manifest.workspace;
    let root = store.workspace_dir(workspace);
    let dir = run_dir(store, workspace, &manifest.run_id);
    let target = root.join(&manifest.path);
    let state = store.state(workspace);
    let index_guard = state.index_lock.lock().unwrap_or_else(|p| p.into_inner());

    // 0. Already recorded? Then only the run directory is left to remove.
    {
        let connection = store.pool.get()?;
        let recorded: Option<Option<String>> = connection
            .query_row(
                "SELECT commit_id FROM runs WHERE run_id = ?1",
                params![manifest.run_id],
                |r| r.get(0),
            )
            .optional()?;
        if let Some(commit) = recorded {
            let _ = fs::remove_dir_all(&dir);
            return Ok(commit.unwrap_or_default());
        }
    }

    // 1. The file, unless someone else changed it meanwhile.
    let on_disk = fs::read(&target).ok().map(|b| revision(&b));
    let conflict = || {
        ToolError::new(
            ErrorCode::StalePlan,
            format!(
                "{} changed outside alexandria while the write was in progress",
                manifest.path
            ),
            "read the page again and re-plan the edit",
        )
    };
    match (&manifest.new_rev, &manifest.trash_path) {
        (Some(new_rev), _) => {
            if on_disk.as_ref() != Some(new_rev) {
                if on_disk != manifest.old_rev {
                    return Err(conflict());
                }
                let final_text = fs::read(dir.join("final"))
                    .map_err(|e| io_error("reading the prepared page", e))?;
                write_durably(&target, &final_text).map_err(|e| io_error("writing the page", e))?;
            }
        }
        (None, Some(trash)) => {
            if target.exists() {
                if on_disk != manifest.old_rev {
                    return Err(conflict());
                }
                let trash = root.join(trash);
                if let Some(parent) = trash.parent() {
                    fs::create_dir_all(parent)
                        .map_err(|e| io_error("creating the trash folder", e))?;
                }
                fs::rename(&target, &trash)
                    .map_err(|e| io_error("moving the page to .trash", e))?;
            }
        }
        (None, None) => return Err(ToolError::internal("run manifest", "nothing to do")),
    }
    crash_point("after_move");

    // 2. The commit.
    let commit = commit_run(store, manifest).map_err(git_error)?;
    state.index_pending(&manifest.path);
    crash_point("after_commit");

    // 3. State and index, in one transaction.
    let mut connection = store.pool.get()?;
    let transaction = connection.transaction()?;
    let already: bool = transaction
        .query_row(
            "SELECT count(*) FROM runs WHERE run_id = ?1",
            params![manifest.run_id],
            |r| r.get::<_, i64>(0),
        )
        .map(|n| n > 0)?;
    if !already {
        let now = now_ms();
        transaction.execute(
            "INSERT INTO runs(run_id, workspace, tool, client, session, state, started_at, finished_at, commit_id)
             VALUES (?1, ?2, ?3, ?4, ?5, 'committed', ?6, ?7, ?8)",
            params![manifest.run_id, workspace, manifest.tool, manifest.client, manifest.session, manifest.started_at, now, commit],
        )?;
        transaction.execute(
            "INSERT INTO wiki_log_entries(ts, workspace, run_id, op, path, summary, origin) VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'agent')",
            params![now, workspace, manifest.run_id, manifest.op, manifest.path, manifest.summary],
        )?;
        transaction.execute(
            "INSERT INTO events(ts, workspace, kind, data) VALUES (?1, ?2, 'run_committed', ?3)",
            params![now, workspace, json!({"run_id": manifest.run_id, "op": manifest.op, "path": manifest.path, "commit": commit, "client": manifest.client}).to_string()],
        )?;
        if manifest.new_rev.is_some() {
            index::index_file(&transaction, workspace, &manifest.path, &target)?;
        } else {
            index::remove_file(&transaction, workspace, &manifest.path)?;
        }
    }
    transaction.commit()?;
    drop(index_guard);
    crash_point("after_index");
    let _ = fs::remove_dir_all(&dir);
    store.changed(workspace, &manifest.path);
    Ok(commit)
}

pub(crate) fn git_error(error: git2::Error) -> ToolError {
    if error.code() == git2::ErrorCode::Locked {
        return ToolError::new(
            ErrorCode::WorkspaceBusy,
            format!(
                "the workspace's git repository is locked by another git process: {}",
                error.message()
            ),
            "wait for that git command to finish and retry; if none is running, remove .git/index.lock in the workspace",
        );
    }
    ToolError::internal("committing to git", error)
}

/// One git commit for the run, unless HEAD already has it. Returns the commit id.
pub(crate) fn commit_run(store: &Store, manifest: &Manifest) -> Result<String, git2::Error> {
    let root = store.workspace_dir(&manifest.workspace);
    store
        .state(&manifest.workspace)
        .with_repo(&root, |repo| commit_in(repo, &root, manifest))
}

fn commit_in(
    repo: &git2::Repository,
    root: &Path,
    manifest: &Manifest,
) -> Result<String, git2::Error> {
    let head = repo.head()?.peel_to_commit()?;
    let marker = format!("run: {}", manifest.run_id);
    if head.message().is_ok_and(|m| m.contains(&marker)) {
        return Ok(head.id().to_string());
    }
    let client = manifest
        .client
        .clone()
        .unwrap_or_else(|| "unknown client".into());
    let author = git2::Signature::now(&client, "agent@alexandria.local")?;
    let message = format!(
        "{} via alexandria\n\n{marker}\ntool: {} {}\nclient: {client}\nsession: {}\n",
        manifest.summary,
        manifest.tool,
        manifest.op,
        manifest.session.as_deref().unwrap_or("-")
    );
    let change = crate::workspace::git::Change {
        path: &manifest.path,
        present: manifest.new_rev.is_some(),
    };
    let id = crate::workspace::git::commit_changes(repo, root, &[change], &message, &author)?;
    Ok(id.to_string())
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

/// The common end of a write and a delete whose run is prepared: complete it (or roll
/// it back), drop the run directory, release the lock, flush to disk. Only then may
/// the caller acknowledge.
pub(crate) fn finish(
    store: &Store,
    manifest: &Manifest,
    lock: LockGuard<'_>,
    cleanup: RunDirCleanup,
) -> ToolResult<String> {
    crash_point("after_prepare");
    let commit = complete_or_roll_back(store, manifest)?;
    drop(cleanup);
    drop(lock);
    crash_point("before_flush");
    flush_to_disk(store, &manifest.workspace)?;
    crash_point("after_flush");
    Ok(commit)
}

/// Make everything written so far durable (page, git objects and refs, SQLite WAL)
/// with one `syncfs` of the home's file system, outside the workspace lock so that
/// concurrent writers share the flush. Called before a write is acknowledged.
pub(crate) fn flush_to_disk(store: &Store, workspace: &str) -> ToolResult<()> {
    let dir =
        File::open(store.workspace_dir(workspace)).map_err(|e| io_error("flushing to disk", e))?;
    rustix::fs::syncfs(&dir).map_err(|e| io_error("flushing to disk", e.into()))
}

/// Complete a prepared run; if that fails (disk full, read-only file system …), undo
/// whatever part of it happened so that nothing is half-applied.
pub(crate) fn complete_or_roll_back(store: &Store, manifest: &Manifest) -> ToolResult<String> {
    match complete(store, manifest) {
        Ok(commit) => Ok(commit),
        Err(error) if error.code == ErrorCode::StalePlan => {
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
    let target = root.join(&manifest.path);
    let result = (|| -> Result<(), git2::Error> {
        let repo = git2::Repository::open(&root)?;
        let mut head = repo.head()?.peel_to_commit()?;
        let marker = format!("run: {}", manifest.run_id);
        let committed = head.message().is_ok_and(|m| m.contains(&marker));
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
            return Ok(());
        }
        if committed {
            let parent = head.parent(0)?;
            repo.reset(parent.as_object(), git2::ResetType::Soft, None)?;
            head = parent;
        }
        let tree = head.tree()?;
        let mut index = repo.index()?;
        match tree.get_path(Path::new(&manifest.path)) {
            Ok(entry) => {
                let blob = repo.find_blob(entry.id())?;
                let _ = write_durably(&target, blob.content());
                let _ = index.add_path(Path::new(&manifest.path));
            }
            Err(_) => {
                let _ = fs::remove_file(&target);
                let _ = index.remove_path(Path::new(&manifest.path));
            }
        }
        index.write()?;
        Ok(())
    })();
    if let Err(error) = result {
        tracing::error!(run = %manifest.run_id, %error, "roll back failed");
    }
    if let Some(trash) = &manifest.trash_path {
        let _ = fs::remove_file(root.join(trash));
    }
    let _ = fs::remove_dir_all(run_dir(store, &manifest.workspace, &manifest.run_id));
}
