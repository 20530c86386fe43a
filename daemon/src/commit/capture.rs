//! Captures from source adapters: new files under `raw/sources/<name>/`, one git commit
//! for the whole batch, the items marked `captured`, crash-safe like a write.
//!
//! 1. Stage (no lock): every file's bytes go to `runs/<run_id>/f<n>`, with a manifest
//!    (`capture.json`, state `staged`).
//! 2. Lock the workspace; choose each file's final name (never overwriting anything:
//!    `raw/` is immutable); the manifest becomes `prepared` (`capture-prepared.json`).
//! 3. Complete: store each staged file's bytes as a git blob, then rename it into `raw/`
//!    (a rename is atomic, so a crash never leaves a half-written raw file; it never
//!    replaces a file that appeared there meanwhile: the capture is undone instead), one
//!    git commit of those blobs (the bytes captured, never re-read from `raw/`, where
//!    someone may edit the file already; `run: <id>` in the message), one
//!    SQLite transaction (`runs`, the items, the index, an event), remove the run
//!    directory. Release the lock, flush to disk, and only then report success.
//!
//! Recovery (`recover`) completes a `prepared` capture step by step (each step checks
//! whether it already happened) and drops a `staged` one (it was never reported).

use std::fs;
use std::path::{Path, PathBuf};

use rusqlite::{OptionalExtension, params};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{RunState, flush_to_disk, git_error, io_error, lock_workspace, run_dir, write_durably};
use crate::db::now_ms;
use crate::error::{ToolError, ToolResult};
use crate::faults::crash_point;
use crate::index;
use crate::workspace::{Store, git, revision};

/// One file to capture.
pub struct CaptureFile {
    /// The `source_items` row it records.
    pub item_id: i64,
    /// The preferred path (`raw/sources/<name>/…`); made unique under the lock.
    pub path: String,
    pub bytes: Vec<u8>,
}

/// What a capture run directory records, for recovery.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CaptureManifest {
    pub run_id: String,
    pub workspace: String,
    pub state: RunState,
    /// The commit's first line.
    pub summary: String,
    pub started_at: i64,
    pub files: Vec<StagedFile>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StagedFile {
    pub item_id: i64,
    /// File name inside the run directory.
    pub staged: String,
    /// Final workspace-relative path (decided under the lock).
    pub path: String,
    pub rev: String,
    /// The same bytes were already in `raw/` at `path`: nothing to move or commit.
    #[serde(default)]
    pub existing: bool,
}

/// Where one item ended up.
#[derive(Debug, Clone)]
pub struct Captured {
    pub item_id: i64,
    pub path: String,
}

fn manifest_file(dir: &Path, state: RunState) -> PathBuf {
    match state {
        RunState::Staged => dir.join("capture.json"),
        RunState::Prepared => dir.join("capture-prepared.json"),
    }
}

fn save(dir: &Path, manifest: &CaptureManifest) -> ToolResult<()> {
    let bytes =
        serde_json::to_vec_pretty(manifest).map_err(|e| ToolError::internal("manifest", e))?;
    write_durably(&manifest_file(dir, manifest.state), &bytes)
        .map_err(|e| io_error("writing the capture manifest", e))
}

/// The capture manifest of a run directory, if it is a capture run.
pub fn load(dir: &Path) -> Option<CaptureManifest> {
    [RunState::Prepared, RunState::Staged]
        .into_iter()
        .find_map(|state| fs::read(manifest_file(dir, state)).ok())
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
}

/// Removes the run directory when the capture ends unless it reached `prepared` and
/// failed (then recovery must see it).
struct Cleanup(PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let prepared = load(&self.0).is_some_and(|m| m.state == RunState::Prepared);
        if !prepared {
            let _ = fs::remove_dir_all(&self.0);
        }
    }
}

/// Capture `files` into `workspace` as one commit whose message starts with
/// `summary`. Returns where each item went. Nothing is reported before the files, the
/// commit and the database agree and are flushed.
pub fn capture(
    store: &Store,
    workspace: &str,
    summary: &str,
    files: Vec<CaptureFile>,
) -> ToolResult<Vec<Captured>> {
    if files.is_empty() {
        return Ok(Vec::new());
    }
    let run_id = format!("capture-{}", &super::new_run_id()[4..]);
    let dir = run_dir(store, workspace, &run_id);
    fs::create_dir_all(&dir).map_err(|e| io_error("creating the run directory", e))?;
    let cleanup = Cleanup(dir.clone());
    let mut manifest = CaptureManifest {
        run_id: run_id.clone(),
        workspace: workspace.to_string(),
        state: RunState::Staged,
        summary: summary.to_string(),
        started_at: now_ms(),
        files: Vec::with_capacity(files.len()),
    };
    for (n, file) in files.iter().enumerate() {
        let staged = format!("f{n}");
        write_durably(&dir.join(&staged), &file.bytes)
            .map_err(|e| io_error("staging a captured file", e))?;
        manifest.files.push(StagedFile {
            item_id: file.item_id,
            staged,
            path: file.path.clone(),
            rev: revision(&file.bytes),
            existing: false,
        });
    }
    save(&dir, &manifest)?;
    drop(files);

    let state = store.state(workspace);
    let lock = lock_workspace(store, &state, workspace, &run_id)?;
    let root = store.workspace_dir(workspace);
    let mut taken = std::collections::HashSet::new();
    for file in &mut manifest.files {
        let (path, existing) = free_path(&root, &file.path, &file.rev, &taken);
        taken.insert(path.clone());
        file.path = path;
        file.existing = existing;
    }
    manifest.state = RunState::Prepared;
    save(&dir, &manifest)?;
    crash_point("capture_prepared");
    if let Some(delay) = crate::faults::delay_for("capture") {
        std::thread::sleep(delay);
    }
    let result = complete_or_roll_back(store, &manifest);
    drop(cleanup);
    drop(lock);
    let captured = result?;
    flush_to_disk(store, workspace)?;
    Ok(captured)
}

/// `wanted`, or `stem-2.ext`, `stem-3.ext`, … : the first name that is free (or holds
/// exactly these bytes already, then `true`).
fn free_path(
    root: &Path,
    wanted: &str,
    rev: &str,
    taken: &std::collections::HashSet<String>,
) -> (String, bool) {
    let (stem, extension) = match wanted.rsplit_once('.') {
        Some((stem, ext)) if !stem.is_empty() && !ext.contains('/') && !stem.ends_with('/') => {
            (stem.to_string(), format!(".{ext}"))
        }
        _ => (wanted.to_string(), String::new()),
    };
    for n in 1.. {
        let candidate = if n == 1 {
            wanted.to_string()
        } else {
            format!("{stem}-{n}{extension}")
        };
        if taken.contains(&candidate) {
            continue;
        }
        match fs::read(root.join(&candidate)) {
            Ok(bytes) if revision(&bytes) == rev => return (candidate, true),
            Ok(_) => continue,
            Err(_) if root.join(&candidate).symlink_metadata().is_ok() => continue,
            Err(_) => return (candidate, false),
        }
    }
    unreachable!("some name is free")
}

/// Complete a prepared capture, or roll it back, under the workspace's `index_lock`
/// (the rescanner must not index files of a capture that is being undone).
fn complete_or_roll_back(store: &Store, manifest: &CaptureManifest) -> ToolResult<Vec<Captured>> {
    let state = store.state(&manifest.workspace);
    let index = state.index_lock.lock().unwrap_or_else(|p| p.into_inner());
    let result = complete(store, manifest, &index);
    if result.is_err() {
        roll_back(store, manifest);
    }
    result
}

/// Carry a prepared capture to the end; every step checks whether it already happened.
fn complete(
    store: &Store,
    manifest: &CaptureManifest,
    _index: &std::sync::MutexGuard<'_, ()>,
) -> ToolResult<Vec<Captured>> {
    let workspace = &manifest.workspace;
    let root = store.workspace_dir(workspace);
    let dir = run_dir(store, workspace, &manifest.run_id);
    let state = store.state(workspace);
    let captured: Vec<Captured> = manifest
        .files
        .iter()
        .map(|f| Captured {
            item_id: f.item_id,
            path: f.path.clone(),
        })
        .collect();
    {
        let connection = store.pool.get()?;
        let recorded: Option<String> = connection
            .query_row(
                "SELECT run_id FROM runs WHERE run_id = ?1",
                params![manifest.run_id],
                |r| r.get(0),
            )
            .optional()?;
        if recorded.is_some() {
            let _ = fs::remove_dir_all(&dir);
            return Ok(captured);
        }
    }

    // 1. The files.
    let mut moved = Vec::new();
    for file in manifest.files.iter().filter(|f| !f.existing) {
        let target = root.join(&file.path);
        let on_disk = fs::read(&target).ok().map(|b| revision(&b));
        if on_disk.as_deref() != Some(file.rev.as_str()) {
            if on_disk.is_some() {
                return Err(ToolError::internal(
                    "capturing",
                    format!("{} appeared while the capture ran", file.path),
                ));
            }
            if let Some(parent) = target.parent() {
                fs::create_dir_all(parent).map_err(|e| io_error("creating raw/sources", e))?;
            }
            let staged = dir.join(&file.staged);
            let bytes = fs::read(&staged).map_err(|e| io_error("reading a staged file", e))?;
            store_blob(store, workspace, &bytes, &file.rev)?;
            // Never over a file that appeared meanwhile (someone else's).
            if !super::place::restore(&staged, &target)
                .map_err(|e| io_error("moving a captured file into raw/", e))?
            {
                return Err(ToolError::internal(
                    "capturing",
                    format!("{} appeared while the capture ran", file.path),
                ));
            }
        } else {
            // Moved before a crash: its blob was stored before the move.
            let stored = state
                .with_repo(&root, |repo| {
                    git2::Oid::from_str(&file.rev).map(|id| repo.odb().is_ok_and(|o| o.exists(id)))
                })
                .unwrap_or(false);
            if !stored {
                let bytes =
                    fs::read(&target).map_err(|e| io_error("reading a captured file", e))?;
                store_blob(store, workspace, &bytes, &file.rev)?;
            }
        }
        moved.push(file.path.as_str());
        crash_point("capture_after_move");
    }

    if let Some(delay) = crate::faults::delay_for("capture_commit") {
        std::thread::sleep(delay);
    }
    // 2. One commit.
    let commit = if moved.is_empty() {
        None
    } else {
        let marker = format!("run: {}", manifest.run_id);
        let message = format!(
            "{}\n\n{marker}\ntool: source capture\nfiles:\n{}\n",
            manifest.summary,
            moved
                .iter()
                .map(|p| format!("  {p}"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        let timeout = super::git_lock_timeout(store);
        let id = state.with_repo(&root, |repo| -> ToolResult<git2::Oid> {
            let head = repo.head()?.peel_to_commit()?;
            if head.message().is_ok_and(|m| m.contains(&marker)) {
                return Ok(head.id());
            }
            let blobs: Vec<git2::Oid> = manifest
                .files
                .iter()
                .filter(|f| !f.existing)
                .map(|f| git2::Oid::from_str(&f.rev))
                .collect::<Result<_, _>>()?;
            let changes: Vec<git::Change<'_>> = moved
                .iter()
                .zip(&blobs)
                .map(|(path, blob)| git::Change {
                    path,
                    content: git::Content::Blob(*blob),
                    stat: None,
                })
                .collect();
            let author = git2::Signature::now("alexandria sources", "sources@alexandria.local")?;
            let mut session = git::Session::begin(repo, timeout).map_err(git_error)?;
            let id = session
                .commit(&changes, &message, &author)
                .map_err(git_error)?;
            let finished = session.finish().map_err(git_error)?;
            Ok(git2::Oid::from_str(&finished.id(&id.to_string()))?)
        })?;
        Some(id.to_string())
    };
    crash_point("capture_after_commit");

    // 3. Items, index and history in one transaction.
    let mut connection = store.pool.get()?;
    let transaction = crate::db::write_transaction(&mut connection)?;
    let now = now_ms();
    transaction.execute(
        "INSERT INTO runs(run_id, workspace, tool, client, session, state, started_at, finished_at, commit_id)
         VALUES (?1, ?2, 'source capture', NULL, NULL, 'committed', ?3, ?4, ?5)",
        params![manifest.run_id, workspace, manifest.started_at, now, commit],
    )?;
    for file in &manifest.files {
        transaction.execute(
            "UPDATE source_items SET state = 'captured', raw_path = ?2, error = NULL, changed_at = ?3 WHERE id = ?1",
            params![file.item_id, file.path, now],
        )?;
        index::index_or_forget(&transaction, workspace, &file.path, &root.join(&file.path))?;
    }
    transaction.execute(
        "INSERT INTO events(ts, workspace, kind, data) VALUES (?1, ?2, 'source_captured', ?3)",
        params![
            now,
            workspace,
            json!({"run_id": manifest.run_id, "commit": commit, "paths": moved}).to_string()
        ],
    )?;
    transaction.commit()?;
    let _ = fs::remove_dir_all(&dir);
    Ok(captured)
}

/// Store `bytes` (a captured file, rev `rev`) as a blob of the workspace's repository.
fn store_blob(store: &Store, workspace: &str, bytes: &[u8], rev: &str) -> ToolResult<()> {
    let blob = super::store_blob(store, workspace, bytes)?;
    if blob.to_string() != rev {
        return Err(ToolError::internal(
            "capturing",
            "a staged file does not hold the bytes captured",
        ));
    }
    Ok(())
}

/// Undo a capture that cannot be completed, so that files, git and SQLite agree on
/// the state before it. Called with the workspace lock held, or before serving.
fn roll_back(store: &Store, manifest: &CaptureManifest) {
    let root = store.workspace_dir(&manifest.workspace);
    let recorded = store
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
    if recorded {
        return;
    }
    let result = (|| -> Result<(), git2::Error> {
        let repo = git2::Repository::open(&root)?;
        let head = repo.head()?.peel_to_commit()?;
        let marker = format!("run: {}", manifest.run_id);
        if head.message().is_ok_and(|m| m.contains(&marker)) {
            let parent = head.parent(0)?;
            repo.reset(parent.as_object(), git2::ResetType::Soft, None)?;
        }
        Ok(())
    })();
    if let Err(error) = result {
        tracing::error!(run = %manifest.run_id, %error, "capture roll back failed");
    }
    // The names were free when chosen under the lock: whatever holds this run's bytes
    // there now was put there by this run.
    for file in manifest.files.iter().filter(|f| !f.existing) {
        let target = root.join(&file.path);
        if fs::read(&target).is_ok_and(|b| revision(&b) == file.rev) {
            let _ = fs::remove_file(&target);
        }
    }
    let _ = fs::remove_dir_all(run_dir(store, &manifest.workspace, &manifest.run_id));
}

/// Recovery: complete a prepared capture (or roll it back), drop a staged one.
pub fn recover(store: &Store, dir: &Path, manifest: CaptureManifest, report: &mut Vec<String>) {
    let workspace = manifest.workspace.clone();
    if manifest.state != RunState::Prepared {
        let _ = fs::remove_dir_all(dir);
        report.push(format!("{workspace}: dropped {}", dir.display()));
        return;
    }
    match complete_or_roll_back(store, &manifest) {
        Ok(_) => {
            tracing::warn!(workspace, run = %manifest.run_id, "completed an interrupted capture");
            report.push(format!("{workspace}: completed {}", manifest.run_id));
        }
        Err(error) => {
            tracing::error!(workspace, run = %manifest.run_id, %error, "could not complete an interrupted capture; rolled back");
            report.push(format!("{workspace}: rolled back {}", manifest.run_id));
        }
    }
}
