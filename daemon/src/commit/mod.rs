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

use std::fs::{self, File, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use alexandria_proto::paths::{self, Layer};
use alexandria_proto::{Binding, ErrorCode};
use rusqlite::{OptionalExtension, params};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::db::now_ms;
use crate::error::{ToolError, ToolResult};
use crate::extract::Kind;
use crate::faults::crash_point;
use crate::index;
use crate::markdown;
use crate::store::{STRUCTURAL_PAGES, Store, revision};
use crate::tools::{ToolOutput, resolve_workspace};

/// Largest page a write may produce.
pub const MAX_PAGE_BYTES: usize = 8 * 1024 * 1024;

// ---------------------------------------------------------------------------------
// parameters

#[derive(Debug, Clone, Copy, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum WriteCommand {
    /// Create a new page with `content` (fails if it exists).
    Create,
    /// Replace the one occurrence of `old_str` with `new_str`.
    StrReplace,
    /// Append `content` to the end of an existing page.
    Append,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteParams {
    /// Workspace slug. Required in open sessions; defaults to the pinned workspace.
    pub workspace: Option<String>,
    /// `create`, `str_replace` or `append`.
    pub command: WriteCommand,
    /// The page, under wiki/ (e.g. `wiki/topics/sea-stars.md`).
    pub path: String,
    /// Page text for `create`, text to add for `append`.
    pub content: Option<String>,
    /// For `str_replace`: the exact text to replace; must occur exactly once.
    pub old_str: Option<String>,
    /// For `str_replace`: the replacement text.
    pub new_str: Option<String>,
    /// The `rev` you read; if the page changed since, the write is refused with
    /// `stale_plan` so you can re-read and re-plan.
    pub base_rev: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeleteParams {
    /// Workspace slug. Required in open sessions; defaults to the pinned workspace.
    pub workspace: Option<String>,
    /// The page to soft-delete, under wiki/.
    pub path: String,
}

/// Who asks for a write: for commit messages, `runs` and history.
#[derive(Debug, Clone, Default)]
pub struct Caller {
    pub client: Option<String>,
    pub session: Option<String>,
}

// ---------------------------------------------------------------------------------
// the workspace lock

/// In-process half of the workspace lock, with the holder's run id.
#[derive(Default)]
pub struct WorkspaceLock {
    holder: Mutex<Option<String>>,
    released: Condvar,
}

/// Both halves held; released on drop.
pub struct LockGuard<'a> {
    lock: &'a WorkspaceLock,
    file: Option<File>,
}

impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        if let Some(file) = self.file.take() {
            let _ = rustix::fs::fcntl_lock(&file, rustix::fs::FlockOperation::Unlock);
        }
        let mut holder = self.lock.holder.lock().unwrap_or_else(|p| p.into_inner());
        *holder = None;
        self.lock.released.notify_one();
    }
}

fn busy(holder: &str, timeout: Duration) -> ToolError {
    ToolError::new(
        ErrorCode::WorkspaceBusy,
        format!(
            "the workspace is locked by run {holder} and did not become free within {}s",
            timeout.as_secs_f32()
        ),
        "retry in a moment; if it persists, another alexandria process may be stuck (`alexandria mcp status`)",
    )
    .with_detail("holder_run_id", holder)
}

impl WorkspaceLock {
    /// Take the in-process lock, then the fcntl lock on `lock_path`, within `timeout`.
    pub fn acquire(
        &self,
        lock_path: &Path,
        run_id: &str,
        timeout: Duration,
    ) -> ToolResult<LockGuard<'_>> {
        let deadline = Instant::now() + timeout;
        {
            let mut holder = self.holder.lock().unwrap_or_else(|p| p.into_inner());
            while let Some(current) = holder.as_ref() {
                let now = Instant::now();
                if now >= deadline {
                    return Err(busy(current, timeout));
                }
                holder = self
                    .released
                    .wait_timeout(holder, deadline - now)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            *holder = Some(run_id.to_string());
        }
        let mut guard = LockGuard {
            lock: self,
            file: None,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(lock_path)
            .map_err(|e| ToolError::internal("opening the workspace lock", e))?;
        let mut pause = Duration::from_micros(200);
        loop {
            match rustix::fs::fcntl_lock(
                &file,
                rustix::fs::FlockOperation::NonBlockingLockExclusive,
            ) {
                Ok(()) => break,
                Err(e) if e == rustix::io::Errno::AGAIN || e == rustix::io::Errno::ACCESS => {
                    if Instant::now() >= deadline {
                        let holder = fs::read_to_string(lock_path).unwrap_or_default();
                        let holder = holder.trim();
                        return Err(busy(
                            if holder.is_empty() { "unknown" } else { holder },
                            timeout,
                        ));
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(20));
                }
                Err(e) => return Err(ToolError::internal("locking the workspace", e)),
            }
        }
        // Record the holder in place, at a fixed size: truncating (or growing and
        // shrinking) the file would make ext4 flush it on close (auto_da_alloc), ~10 ms.
        let mut record = format!("{run_id:<63}").into_bytes();
        record.truncate(63);
        record.push(b'\n');
        let _ = rustix::io::pwrite(&file, &record, 0);
        guard.file = Some(file);
        Ok(guard)
    }
}

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

fn new_run_id() -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("run-{}-{}", now_ms(), &id[..8])
}

fn run_dir(store: &Store, workspace: &str, run_id: &str) -> PathBuf {
    store.workspace_dir(workspace).join("runs").join(run_id)
}

/// Marker in the names of temporary files; recovery deletes leftovers.
const TEMP_MARKER: &str = ".alx-tmp-";

/// Replace `path` atomically with `bytes` (temp file + rename). Durability against
/// power loss comes from one `syncfs` per write before it is acknowledged (see
/// `flush_to_disk`), not from an fsync per file.
fn write_durably(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
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
fn manifest_file(dir: &Path, state: RunState) -> PathBuf {
    match state {
        RunState::Staged => dir.join("run.json"),
        RunState::Prepared => dir.join("prepared.json"),
    }
}

fn save_manifest(dir: &Path, manifest: &Manifest) -> ToolResult<()> {
    let bytes =
        serde_json::to_vec_pretty(manifest).map_err(|e| ToolError::internal("manifest", e))?;
    write_durably(&manifest_file(dir, manifest.state), &bytes)
        .map_err(|e| io_error("writing the run manifest", e))
}

/// The latest manifest of a run directory.
fn load_manifest(dir: &Path) -> Option<Manifest> {
    [RunState::Prepared, RunState::Staged]
        .into_iter()
        .find_map(|state| fs::read(manifest_file(dir, state)).ok())
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
}

fn io_error(context: &str, error: std::io::Error) -> ToolError {
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

// ---------------------------------------------------------------------------------
// citations

/// Every citation in `text` that names a missing raw file or a page past the end.
pub fn check_citations(store: &Store, workspace: &str, text: &str) -> ToolResult<()> {
    let mut problems = Vec::new();
    for citation in markdown::citations(text) {
        let target = &citation.target;
        let checked = match paths::validate_workspace_path(target, false) {
            Ok(p) if p.layer == Layer::Raw => p,
            _ => {
                problems.push(json!({"citation": target, "problem": "not a valid raw/ path"}));
                continue;
            }
        };
        let absolute = match store.resolve(workspace, &checked) {
            Ok(path) if path.is_file() => path,
            _ => {
                problems.push(json!({"citation": target, "problem": "no such file in raw/"}));
                continue;
            }
        };
        if let Some((from, to)) = citation.pages {
            if Kind::of(&absolute) != Kind::Pdf {
                problems.push(json!({"citation": target, "problem": format!("p.{from}: page numbers apply to PDFs only")}));
                continue;
            }
            let record = index::ensure_fresh(store, workspace, &checked.path, &absolute)?;
            let count = record.pages.unwrap_or(0);
            if from == 0 || i64::from(to) > count {
                problems.push(json!({
                    "citation": target,
                    "problem": format!("p.{from}-{to} is beyond the document's {count} pages"),
                    "page_count": count,
                }));
            }
        }
    }
    if problems.is_empty() {
        return Ok(());
    }
    let listing: Vec<String> = problems
        .iter()
        .map(|p| {
            format!(
                "{} ({})",
                p["citation"].as_str().unwrap_or(""),
                p["problem"].as_str().unwrap_or("")
            )
        })
        .collect();
    Err(ToolError::new(
        ErrorCode::CitationInvalid,
        format!("{} citation(s) are invalid: {}", problems.len(), listing.join("; ")),
        "cite files that exist in raw/ (search with layer=\"raw\" or mode=\"list\") and PDF pages within their page count; nothing was written",
    )
    .with_detail("citations", problems))
}

// ---------------------------------------------------------------------------------
// write and delete

fn wiki_target(
    store: &Store,
    workspace: &str,
    raw_path: &str,
    for_delete: bool,
) -> ToolResult<(String, PathBuf)> {
    let checked = paths::validate_workspace_path(raw_path, false)
        .map_err(|e| ToolError::invalid_path(e.message).with_detail("path", raw_path))?;
    if checked.layer == Layer::Raw {
        return Err(if for_delete {
            ToolError::new(
                ErrorCode::ProtectedPath,
                format!("{raw_path} is a source in raw/, which is immutable"),
                "sources cannot be deleted through MCP; the user manages raw/",
            )
        } else {
            ToolError::new(
                ErrorCode::RawReadonly,
                format!("{raw_path} is in raw/, which agents may read and cite but not write"),
                "write your page under wiki/ and cite the source from it",
            )
        });
    }
    let extension = Path::new(&checked.path)
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    if !for_delete && !matches!(extension.as_deref(), Some("md" | "markdown")) {
        return Err(ToolError::invalid_argument(
            format!("{raw_path}: wiki pages are markdown files ending in .md"),
            "name the page like wiki/topics/sea-stars.md",
        ));
    }
    let absolute = store.resolve(workspace, &checked)?;
    Ok((checked.path, absolute))
}

fn read_current(absolute: &Path) -> ToolResult<Option<Vec<u8>>> {
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

fn require_arg<'a>(value: &'a Option<String>, name: &str, command: &str) -> ToolResult<&'a str> {
    value.as_deref().ok_or_else(|| {
        ToolError::invalid_argument(
            format!("{command} needs {name}"),
            format!("pass {name}=\"…\""),
        )
    })
}

/// The `write` tool.
pub fn write(
    store: &Store,
    binding: &Binding,
    caller: &Caller,
    params: WriteParams,
) -> ToolResult<ToolOutput> {
    let workspace = resolve_workspace(store, binding, params.workspace.as_deref())?;
    let (path, absolute) = wiki_target(store, &workspace, &params.path, false)?;
    let command = params.command;
    let command_name = match command {
        WriteCommand::Create => "create",
        WriteCommand::StrReplace => "str_replace",
        WriteCommand::Append => "append",
    };
    // Stage: the payload, validated, before any lock.
    let payload = match command {
        WriteCommand::Create | WriteCommand::Append => {
            require_arg(&params.content, "content", command_name)?.to_string()
        }
        WriteCommand::StrReplace => {
            let old = require_arg(&params.old_str, "old_str", command_name)?;
            if old.is_empty() {
                return Err(ToolError::invalid_argument(
                    "old_str is empty",
                    "pass the exact text to replace",
                ));
            }
            require_arg(&params.new_str, "new_str", command_name)?.to_string()
        }
    };
    if payload.len() > MAX_PAGE_BYTES {
        return Err(ToolError::new(
            ErrorCode::TooLarge,
            format!(
                "the text is {} bytes; a page may have at most {MAX_PAGE_BYTES}",
                payload.len()
            ),
            "split it into several pages",
        ));
    }
    check_citations(store, &workspace, &payload)?;
    let run_id = new_run_id();
    let dir = run_dir(store, &workspace, &run_id);
    let mut manifest = Manifest {
        run_id: run_id.clone(),
        workspace: workspace.clone(),
        tool: "write".into(),
        op: command_name.into(),
        path: path.clone(),
        state: RunState::Staged,
        client: caller.client.clone(),
        session: caller.session.clone(),
        started_at: now_ms(),
        old_rev: None,
        new_rev: None,
        trash_path: None,
        summary: String::new(),
    };
    fs::create_dir_all(dir.join("staged")).map_err(|e| io_error("staging the write", e))?;
    let cleanup = RunDirCleanup(dir.clone());
    write_durably(&dir.join("staged").join("payload"), payload.as_bytes())
        .map_err(|e| io_error("staging the write", e))?;
    save_manifest(&dir, &manifest)?;
    crash_point("after_stage");

    // Lock, check, commit.
    let state = store.state(&workspace);
    let lock = lock_workspace(store, &state, &workspace, &run_id)?;
    crash_point("after_lock");
    let current = read_current(&absolute)?;
    let current_rev = current.as_deref().map(revision);
    if let Some(base) = params
        .base_rev
        .as_deref()
        .map(str::trim)
        .filter(|b| !b.is_empty())
        && current_rev.as_deref() != Some(base)
        && !current_rev
            .as_deref()
            .is_some_and(|r| r.starts_with(base) && base.len() >= 7)
    {
        return Err(ToolError::new(
            ErrorCode::StalePlan,
            format!(
                "{path} changed since rev {base}: it is now {}",
                current_rev.as_deref().unwrap_or("deleted")
            ),
            "read the page again and re-plan the edit against its current text",
        )
        .with_detail("current_rev", current_rev.clone()));
    }
    let current_text = current.as_deref().map(String::from_utf8_lossy);
    let new_text = match (command, current_text) {
        (WriteCommand::Create, Some(_)) => {
            return Err(ToolError::invalid_argument(
                format!("{path} already exists"),
                "read it, then use str_replace or append to change it (create never overwrites)",
            )
            .with_detail("rev", current_rev.clone()));
        }
        (WriteCommand::Create, None) => payload.clone(),
        (_, None) => return Err(ToolError::not_found(&path)),
        (WriteCommand::Append, Some(text)) => {
            let mut text = text.into_owned();
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&payload);
            if !text.ends_with('\n') {
                text.push('\n');
            }
            text
        }
        (WriteCommand::StrReplace, Some(text)) => {
            let old = params.old_str.as_deref().unwrap_or_default();
            let count = text.matches(old).count();
            match count {
                0 => {
                    return Err(ToolError::new(
                        ErrorCode::NoMatch,
                        format!("old_str does not occur in {path}"),
                        "read the page again and copy the exact text (whitespace included)",
                    ));
                }
                1 => text.replacen(old, &payload, 1),
                n => {
                    return Err(ToolError::new(
                        ErrorCode::AmbiguousMatch,
                        format!("old_str occurs {n} times in {path}"),
                        "include more surrounding text in old_str so it occurs exactly once",
                    )
                    .with_detail("occurrences", n));
                }
            }
        }
    };
    if new_text.len() > MAX_PAGE_BYTES {
        return Err(ToolError::new(
            ErrorCode::TooLarge,
            format!(
                "the page would be {} bytes; a page may have at most {MAX_PAGE_BYTES}",
                new_text.len()
            ),
            "split it into several pages",
        ));
    }
    let new_rev = revision(new_text.as_bytes());
    write_durably(&dir.join("final"), new_text.as_bytes())
        .map_err(|e| io_error("preparing the write", e))?;
    manifest.state = RunState::Prepared;
    manifest.old_rev = current_rev;
    manifest.new_rev = Some(new_rev.clone());
    manifest.summary = format!("{command_name} {path}");
    save_manifest(&dir, &manifest)?;
    let commit = finish(store, &manifest, lock, cleanup)?;
    let title = markdown::title(&new_text);
    Ok(ToolOutput {
        text: format!(
            "{command_name}: {path} is now at rev {new_rev} (run {run_id}, commit {})",
            &commit[..commit.len().min(12)]
        ),
        structured: json!({
            "workspace": workspace,
            "path": path,
            "command": command_name,
            "rev": new_rev,
            "run_id": run_id,
            "commit": commit,
            "title": title,
        }),
        images: Vec::new(),
    })
}

/// The `delete` tool: soft delete into `.trash/`.
pub fn delete(
    store: &Store,
    binding: &Binding,
    caller: &Caller,
    params: DeleteParams,
) -> ToolResult<ToolOutput> {
    let workspace = resolve_workspace(store, binding, params.workspace.as_deref())?;
    let (path, absolute) = wiki_target(store, &workspace, &params.path, true)?;
    if STRUCTURAL_PAGES.contains(&path.as_str()) {
        return Err(ToolError::new(
            ErrorCode::ProtectedPath,
            format!("{path} is a structural page of the wiki"),
            "edit it with write(command=\"str_replace\") instead of deleting it",
        ));
    }
    let run_id = new_run_id();
    let dir = run_dir(store, &workspace, &run_id);
    let stamp = crate::tools::iso_time(now_ms()).replace(':', "-");
    let trash_path = format!(".trash/{stamp}_{}/{path}", &run_id[run_id.len() - 8..]);
    let mut manifest = Manifest {
        run_id: run_id.clone(),
        workspace: workspace.clone(),
        tool: "delete".into(),
        op: "delete".into(),
        path: path.clone(),
        state: RunState::Staged,
        client: caller.client.clone(),
        session: caller.session.clone(),
        started_at: now_ms(),
        old_rev: None,
        new_rev: None,
        trash_path: Some(trash_path.clone()),
        summary: format!("delete {path} (kept in {trash_path})"),
    };
    fs::create_dir_all(&dir).map_err(|e| io_error("staging the delete", e))?;
    let cleanup = RunDirCleanup(dir.clone());
    save_manifest(&dir, &manifest)?;
    let state = store.state(&workspace);
    let lock = lock_workspace(store, &state, &workspace, &run_id)?;
    let Some(current) = read_current(&absolute)? else {
        return Err(ToolError::not_found(&path));
    };
    manifest.old_rev = Some(revision(&current));
    manifest.state = RunState::Prepared;
    save_manifest(&dir, &manifest)?;
    let commit = finish(store, &manifest, lock, cleanup)?;
    Ok(ToolOutput {
        text: format!("deleted {path}; a copy is kept in {trash_path} (run {run_id})"),
        structured: json!({
            "workspace": workspace,
            "path": path,
            "trash_path": trash_path,
            "run_id": run_id,
            "commit": commit,
        }),
        images: Vec::new(),
    })
}

/// Removes a run directory when the run ends, however it ends, unless it reached
/// `prepared` and failed (recovery must see it then).
struct RunDirCleanup(PathBuf);

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
fn complete(store: &Store, manifest: &Manifest) -> ToolResult<String> {
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
    Ok(commit)
}

fn git_error(error: git2::Error) -> ToolError {
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
fn commit_run(store: &Store, manifest: &Manifest) -> Result<String, git2::Error> {
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
    let change = crate::git::Change {
        path: &manifest.path,
        present: manifest.new_rev.is_some(),
    };
    let id = crate::git::commit_changes(repo, root, &[change], &message, &author)?;
    Ok(id.to_string())
}

/// Take the workspace lock for `run_id`, waiting up to `[write] lock_timeout_secs`.
pub fn lock_workspace<'a>(
    store: &Store,
    state: &'a crate::store::WorkspaceState,
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
fn finish(
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
fn flush_to_disk(store: &Store, workspace: &str) -> ToolResult<()> {
    let dir =
        File::open(store.workspace_dir(workspace)).map_err(|e| io_error("flushing to disk", e))?;
    rustix::fs::syncfs(&dir).map_err(|e| io_error("flushing to disk", e.into()))
}

/// Complete a prepared run; if that fails (disk full, read-only file system …), undo
/// whatever part of it happened so that nothing is half-applied.
fn complete_or_roll_back(store: &Store, manifest: &Manifest) -> ToolResult<String> {
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
            .and_then(|repo| crate::git::sync_index_with_head(&repo, &root))
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

/// Undo a run that cannot be completed, whatever steps it got through, so that files,
/// git and SQLite agree on the state before the run. Called with the workspace lock
/// held (or before serving), so HEAD can only hold this run's commit on top.
fn roll_back(store: &Store, manifest: &Manifest) {
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

// ---------------------------------------------------------------------------------
// history

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HistoryParams {
    /// Workspace slug. Required in open sessions; defaults to the pinned workspace.
    pub workspace: Option<String>,
    /// Only entries at or after this time: RFC 3339 (`2026-11-30T08:00:00Z`), a date
    /// (`2026-11-30`), or an age (`30m`, `24h`, `7d`).
    pub since: Option<String>,
    /// Only entries before this time (same formats as `since`).
    pub until: Option<String>,
    /// Only this operation: create, str_replace, append, delete, outside_create,
    /// outside_edit, outside_delete.
    pub op: Option<String>,
    /// Only paths matching this glob (e.g. `wiki/topics/**`).
    pub path: Option<String>,
    /// Only this run.
    pub run_id: Option<String>,
    /// Maximum entries (default 50, at most 500), newest first.
    pub limit: Option<u32>,
    /// `next_cursor` from a previous call.
    pub cursor: Option<String>,
}

/// Parse a time bound into epoch milliseconds.
pub fn parse_time(text: &str, now: i64) -> Option<i64> {
    let text = text.trim();
    if let Some(unit) = text.chars().last().filter(|c| c.is_ascii_alphabetic())
        && let Ok(amount) = text[..text.len() - 1].parse::<i64>()
    {
        let ms = match unit {
            's' => 1000,
            'm' => 60_000,
            'h' => 3_600_000,
            'd' => 86_400_000,
            'w' => 604_800_000,
            _ => return None,
        };
        return Some(now - amount * ms);
    }
    let bytes = text.as_bytes();
    let number = |range: std::ops::Range<usize>| -> Option<i64> { text.get(range)?.parse().ok() };
    if bytes.len() < 10 || bytes[4] != b'-' || bytes[7] != b'-' {
        return None;
    }
    let (y, m, d) = (number(0..4)?, number(5..7)?, number(8..10)?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    let (mut hh, mut mm, mut ss) = (0, 0, 0);
    if bytes.len() >= 19 && matches!(bytes[10], b'T' | b' ') {
        hh = number(11..13)?;
        mm = number(14..16)?;
        ss = number(17..19)?;
    } else if bytes.len() != 10 {
        return None;
    }
    // Days from civil (Howard Hinnant).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 86_400) + hh * 3600 + mm * 60 + ss) * 1000)
}

pub fn history(store: &Store, binding: &Binding, params: HistoryParams) -> ToolResult<ToolOutput> {
    let workspace = resolve_workspace(store, binding, params.workspace.as_deref())?;
    let now = now_ms();
    let bound = |value: &Option<String>, name: &str| -> ToolResult<Option<i64>> {
        match value.as_deref().map(str::trim).filter(|v| !v.is_empty()) {
            None => Ok(None),
            Some(v) => parse_time(v, now).map(Some).ok_or_else(|| {
                ToolError::invalid_argument(
                    format!("{name}={v:?} is not a time"),
                    "use 2026-11-30, 2026-11-30T08:00:00Z, or an age like 30m, 24h, 7d",
                )
            }),
        }
    };
    let since = bound(&params.since, "since")?;
    let until = bound(&params.until, "until")?;
    let scope = params
        .path
        .as_deref()
        .map(crate::tools::scope)
        .transpose()?;
    let matcher = scope.map(|s| s.matcher);
    let limit = params.limit.unwrap_or(50).clamp(1, 500) as usize;
    let offset = crate::tools::parse_cursor(params.cursor.as_deref())?;
    let connection = store.pool.get()?;
    let mut statement = connection.prepare_cached(
        "SELECT ts, op, path, run_id, summary, origin FROM wiki_log_entries
         WHERE workspace = ?1 AND (?2 IS NULL OR ts >= ?2) AND (?3 IS NULL OR ts < ?3)
           AND (?4 IS NULL OR op = ?4) AND (?5 IS NULL OR run_id = ?5)
         ORDER BY ts DESC, id DESC",
    )?;
    let mut rows = statement.query(params![workspace, since, until, params.op, params.run_id])?;
    let mut entries = Vec::new();
    let mut skipped = 0;
    let mut more = false;
    while let Some(row) = rows.next()? {
        let path: String = row.get(2)?;
        if matcher.as_ref().is_some_and(|m| !m.is_match(&path)) {
            continue;
        }
        if skipped < offset {
            skipped += 1;
            continue;
        }
        if entries.len() == limit {
            more = true;
            break;
        }
        entries.push(json!({
            "ts": crate::tools::iso_time(row.get(0)?),
            "op": row.get::<_, String>(1)?,
            "path": path,
            "run_id": row.get::<_, Option<String>>(3)?,
            "summary": row.get::<_, Option<String>>(4)?,
            "origin": row.get::<_, String>(5)?,
        }));
    }
    let next_cursor = more.then(|| (offset + entries.len()).to_string());
    let mut text = format!(
        "{} history entries in '{workspace}' (newest first):\n",
        entries.len()
    );
    for entry in &entries {
        text.push_str(&format!(
            "- {} {} {} [{}{}]\n",
            entry["ts"].as_str().unwrap_or(""),
            entry["op"].as_str().unwrap_or(""),
            entry["path"].as_str().unwrap_or(""),
            entry["origin"].as_str().unwrap_or(""),
            entry["run_id"]
                .as_str()
                .map(|r| format!(", {r}"))
                .unwrap_or_default(),
        ));
    }
    if let Some(cursor) = &next_cursor {
        text.push_str(&format!("More: call again with cursor=\"{cursor}\".\n"));
    }
    Ok(ToolOutput {
        text,
        structured: json!({"workspace": workspace, "entries": entries, "next_cursor": next_cursor}),
        images: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse() {
        let now = 1_000_000_000_000;
        assert_eq!(parse_time("24h", now), Some(now - 86_400_000));
        assert_eq!(
            parse_time("2023-11-14T22:13:20Z", now),
            Some(1_700_000_000_000)
        );
        assert_eq!(parse_time("2000-02-29", now), Some(951_782_400_000));
        for bad in ["yesterday", "2023-13-01", "2023-11-14T", "5x", ""] {
            assert_eq!(parse_time(bad, now), None, "{bad}");
        }
    }

    #[test]
    fn lock_reports_the_holder_after_the_timeout() {
        let dir = tempfile::tempdir().expect("tempdir");
        let lock = WorkspaceLock::default();
        let path = dir.path().join(".lock");
        let held = lock
            .acquire(&path, "run-a", Duration::from_millis(10))
            .expect("first");
        let error = match lock.acquire(&path, "run-b", Duration::from_millis(50)) {
            Ok(_) => panic!("second acquire must time out"),
            Err(error) => error,
        };
        assert_eq!(error.code, ErrorCode::WorkspaceBusy);
        assert_eq!(error.details["holder_run_id"], "run-a");
        drop(held);
        assert!(
            lock.acquire(&path, "run-c", Duration::from_millis(10))
                .is_ok()
        );
    }
}
