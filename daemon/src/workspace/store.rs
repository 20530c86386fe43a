//! The workspace store: the home layout on disk, workspaces as git repositories, and
//! path confinement (every path a tool names is resolved here, and only here).

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use alexandria_proto::paths::{self, Layer, WorkspacePath};
use alexandria_proto::{ErrorCode, Home};

use crate::config::{Config, DEFAULT_CONFIG};
use crate::db::{self, Pool};
use crate::error::{ToolError, ToolResult};

/// Structural pages every workspace has; `delete` refuses them.
pub const STRUCTURAL_PAGES: [&str; 3] = ["wiki/index.md", "wiki/log.md", "wiki/SCHEMA.md"];

const TEMPLATES: [(&str, &str); 3] = [
    ("index.md", include_str!("../../templates/index.md")),
    ("log.md", include_str!("../../templates/log.md")),
    ("SCHEMA.md", include_str!("../../templates/SCHEMA.md")),
];

const WORKSPACE_GITIGNORE: &str =
    "# alexandria: working state, not content\n/runs/\n/.trash/\n/.lock\n";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot create {path}: {source}")]
    Create {
        path: String,
        source: std::io::Error,
    },
    #[error("git: {0}")]
    Git(#[from] git2::Error),
    #[error(transparent)]
    Db(#[from] db::DbError),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
}

/// Per-workspace in-process state.
#[derive(Default)]
pub struct WorkspaceState {
    /// Held while the index of this workspace is being changed (catch-up, writes), so
    /// that a scanner never mistakes a write in progress for an outside edit.
    pub index_lock: Mutex<()>,
    /// Serializes changes to the workspace's files and git repository (in-process
    /// condvar + fcntl on `.lock`).
    pub lock: crate::workspace::WorkspaceLock,
    /// Set once the index has caught up with the disk since the daemon started.
    pub caught_up: std::sync::atomic::AtomicBool,
    /// Progress of the catch-up under way (files indexed of those found changed).
    pub indexing: IndexProgress,
    /// Set once `state.db` holds this workspace's history (imported from git if it
    /// did not: `commit::rebuild`).
    pub history_ready: std::sync::atomic::AtomicBool,
    /// Held while the history is imported, so that it is imported once.
    pub history_import: Mutex<()>,
    /// The workspace's repository, opened once (opening re-reads git's config files).
    repo: Mutex<Option<git2::Repository>>,
}

impl WorkspaceState {
    /// Run `f` with the workspace's open repository.
    pub fn with_repo<T, E: From<git2::Error>>(
        &self,
        root: &Path,
        f: impl FnOnce(&git2::Repository) -> Result<T, E>,
    ) -> Result<T, E> {
        // A write group holds the repository for its whole commit: inside a quick
        // call, wait for it with the worker's tasks handed off.
        let mut slot = match self.repo.try_lock() {
            Ok(slot) => slot,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                crate::blocking::section(|| self.repo.lock().unwrap_or_else(|p| p.into_inner()))
            }
        };
        if slot.is_none() {
            *slot = Some(git2::Repository::open(root)?);
        }
        let repo = slot.as_ref().expect("just opened");
        let result = f(repo);
        if result.is_err() {
            // Start from a fresh handle next time (e.g. after a lock or I/O error).
            *slot = None;
        }
        result
    }
}

/// A file of a workspace that changed: written, deleted, edited outside alexandria or
/// ingested. Sent after the change is committed and indexed (resource subscriptions).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathChange {
    pub workspace: String,
    /// Workspace-relative (`wiki/topics/x.md`).
    pub path: String,
}

/// How many changes a slow listener may fall behind before it misses some.
const CHANGE_BACKLOG: usize = 1024;

/// Progress of a workspace's catch-up with the disk, for `guide` and `workspace list`.
#[derive(Default)]
pub struct IndexProgress {
    pub running: std::sync::atomic::AtomicBool,
    pub done: std::sync::atomic::AtomicU64,
    pub total: std::sync::atomic::AtomicU64,
}

impl WorkspaceState {
    /// "indexing, N of M" while the first catch-up since start (or a large one) runs;
    /// None when the index is current.
    pub fn indexing_note(&self) -> Option<String> {
        use std::sync::atomic::Ordering::Acquire;
        let running = self.indexing.running.load(Acquire);
        let (done, total) = (
            self.indexing.done.load(Acquire),
            self.indexing.total.load(Acquire),
        );
        if running && total > 0 {
            return Some(format!("indexing, {done} of {total}"));
        }
        if !self.caught_up.load(Acquire) {
            return Some("indexing, starting".into());
        }
        None
    }
}

/// Everything the tools need: the home, the config, the database.
pub struct Store {
    pub home: Home,
    pub config: Config,
    pub pool: Pool,
    /// What opening `state.db` found (damaged and moved aside, missing, sound).
    pub db_report: db::OpenReport,
    states: Mutex<HashMap<String, Arc<WorkspaceState>>>,
    changes: tokio::sync::broadcast::Sender<PathChange>,
    /// Workspaces renamed or archived while this daemon runs: old slug → what became
    /// of it, so a session still pinned to the old name is told, not just "not found".
    moved: Mutex<HashMap<String, Moved>>,
    /// The workspaces' directory with every link resolved (`resolve_plain`).
    real_workspaces: std::sync::OnceLock<Option<PathBuf>>,
}

/// A caller's path, checked and resolved for reading (`Store::checked_path_for_read`).
#[derive(Debug)]
pub struct CheckedForRead {
    pub path: WorkspacePath,
    pub absolute: PathBuf,
    /// The file's stat, when the check read it (no link on the way).
    pub stat: Option<fs::Metadata>,
    /// The file, opened by the check itself; `stat` is then this file's.
    pub file: Option<fs::File>,
}

/// What became of a workspace that is gone.
#[derive(Debug, Clone)]
pub enum Moved {
    Renamed { to: String, at: i64 },
    Archived { archive: String, at: i64 },
}

impl Store {
    /// Create the home layout if needed, open `state.db` and make sure the `global`
    /// workspace exists.
    pub fn open(home: Home) -> Result<Arc<Store>, StoreError> {
        ensure_layout(&home)?;
        let config = Config::load(&home.config_file())?;
        let busy = std::time::Duration::from_secs_f64(config.write.lock_timeout_secs.max(0.1));
        let (pool, db_report) = db::open_checked(&home.state_db(), busy)?;
        let store = Arc::new(Store {
            home,
            config,
            pool,
            db_report,
            states: Mutex::new(HashMap::new()),
            changes: tokio::sync::broadcast::channel(CHANGE_BACKLOG).0,
            moved: Mutex::new(HashMap::new()),
            real_workspaces: std::sync::OnceLock::new(),
        });
        store.log_db_report();
        if !store.workspace_dir("global").join(".git").is_dir() {
            store
                .create_workspace("global")
                .map_err(|e| StoreError::Create {
                    path: "workspaces/global".into(),
                    source: std::io::Error::other(e.to_string()),
                })?;
        }
        Ok(store)
    }

    /// Tell listeners that `path` of `workspace` changed (no-op without listeners).
    pub fn changed(&self, workspace: &str, path: &str) {
        if self.changes.receiver_count() > 0 {
            let _ = self.changes.send(PathChange {
                workspace: workspace.to_string(),
                path: path.to_string(),
            });
        }
    }

    /// Every change from now on.
    pub fn subscribe_changes(&self) -> tokio::sync::broadcast::Receiver<PathChange> {
        self.changes.subscribe()
    }

    /// Say in the log what opening state.db did and, after a rebuild, what is rebuilt
    /// from the workspaces and what is not.
    fn log_db_report(&self) {
        let report = &self.db_report;
        let existing = self.list_workspaces();
        if !report.rebuilt || (report.moved_to.is_none() && existing.is_empty()) {
            tracing::info!(check_ms = report.check_ms, "state.db opened and checked");
            return;
        }
        tracing::warn!(
            reason = report.reason.as_deref().unwrap_or(""),
            moved_to = report.moved_to.as_deref().unwrap_or("-"),
            workspaces = existing.len(),
            "state.db rebuilt: a new state.db was started; the catalogue and search index are being rebuilt from the files and history from each workspace's git commits"
        );
        tracing::warn!(
            "state.db rebuilt: not rebuilt (kept only in the old state.db): the events log, configured sources with their sync state and items (add them again; items already captured in raw/sources/ stay), and OAuth clients and grants (remote clients pair again); live sessions reconnect by themselves; HTTP tokens keep working (their key is in secrets/)"
        );
    }

    pub fn workspace_dir(&self, slug: &str) -> PathBuf {
        self.home.workspace(slug)
    }

    pub fn state(&self, slug: &str) -> Arc<WorkspaceState> {
        let mut states = self.states.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(states.entry(slug.to_string()).or_default())
    }

    /// Close every workspace's open repository that nothing is using (the daemon has
    /// gone quiet): libgit2's object cache (up to 4 MiB each), its pack indexes and
    /// pack windows go with it. The next use opens the repository again (about a
    /// millisecond: git's config files are read).
    pub fn release_repositories(&self) -> usize {
        let states: Vec<Arc<WorkspaceState>> = self
            .states
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        let mut closed = 0;
        for state in states {
            if let Ok(mut slot) = state.repo.try_lock()
                && slot.take().is_some()
            {
                closed += 1;
            }
        }
        closed
    }

    /// Drop the cached state of `slug` (after a rename or archive moved its directory),
    /// so the next use opens the repository at its current place.
    pub fn forget_state(&self, slug: &str) {
        let mut states = self.states.lock().unwrap_or_else(|p| p.into_inner());
        states.remove(slug);
    }

    /// Slugs of every workspace (directories under `workspaces/` holding a git repo).
    pub fn list_workspaces(&self) -> Vec<String> {
        let mut slugs: Vec<String> = fs::read_dir(self.home.workspaces_dir())
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| entry.file_name().into_string().ok())
            .filter(|slug| paths::validate_slug(slug).is_ok())
            .filter(|slug| self.workspace_dir(slug).join(".git").is_dir())
            .collect();
        slugs.sort();
        slugs
    }

    pub fn workspace_exists(&self, slug: &str) -> bool {
        paths::validate_slug(slug).is_ok() && self.workspace_dir(slug).join(".git").is_dir()
    }

    /// Check that `slug` names an existing workspace.
    /// Remember what became of `slug` (rename, archive), for sessions pinned to it.
    pub fn note_moved(&self, slug: &str, moved: Moved) {
        self.moved
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(slug.to_string(), moved);
    }

    fn moved(&self, slug: &str) -> Option<Moved> {
        self.moved
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(slug)
            .cloned()
    }

    pub fn require_workspace(&self, slug: &str) -> ToolResult<()> {
        if let Err(e) = paths::validate_slug(slug) {
            return Err(ToolError::new(
                ErrorCode::WorkspaceNotFound,
                e.message,
                "call guide() to list the workspaces",
            )
            .with_person_hint("`alexandria workspace list` shows the workspaces"));
        }
        if !self.workspace_exists(slug) {
            match self.moved(slug) {
                Some(Moved::Renamed { to, at }) => {
                    return Err(ToolError::new(
                        ErrorCode::WorkspaceNotFound,
                        format!("workspace '{slug}' was renamed to '{to}' at {}", crate::db::iso_time(at)),
                        format!("a session pinned to '{slug}' cannot follow the rename: tell the user to re-run `alexandria mcp install <client> --workspace {to}` and restart this client; an open session passes workspace=\"{to}\""),
                    )
                    .with_person_hint(format!(
                        "re-run `alexandria mcp install <client> --workspace {to}` for each client entry that pinned '{slug}', then restart those clients"
                    ))
                    .with_detail("workspace", slug)
                    .with_detail("renamed_to", to.as_str()));
                }
                Some(Moved::Archived { archive, at }) => {
                    return Err(ToolError::new(
                        ErrorCode::WorkspaceNotFound,
                        format!("workspace '{slug}' was archived at {}", crate::db::iso_time(at)),
                        format!("nothing was deleted: the user can bring it back with `alexandria workspace restore {archive}`"),
                    )
                    .with_person_hint(format!("`alexandria workspace restore {archive}` brings it back"))
                    .with_detail("workspace", slug)
                    .with_detail("archive", archive.as_str()));
                }
                None => {}
            }
            return Err(ToolError::new(
                ErrorCode::WorkspaceNotFound,
                format!("there is no workspace '{slug}'"),
                "call guide() to list the workspaces; the user creates new ones with `alexandria workspace create <slug>`",
            )
            .with_person_hint(format!(
                "`alexandria workspace list` shows the workspaces; `alexandria workspace create {slug}` makes this one"
            ))
            .with_detail("workspace", slug));
        }
        Ok(())
    }

    /// Create a workspace: a git repository with `raw/`, `wiki/` and the structural
    /// pages, committed.
    pub fn create_workspace(&self, slug: &str) -> ToolResult<PathBuf> {
        paths::validate_slug(slug).map_err(|e| {
            ToolError::invalid_argument(e.message, "slugs look like `customer-acme`")
        })?;
        let dir = self.workspace_dir(slug);
        if dir.join(".git").exists() {
            return Err(ToolError::new(
                ErrorCode::WorkspaceExists,
                format!("workspace '{slug}' already exists"),
                "pick another slug, or use the existing workspace",
            ));
        }
        let result = create_workspace_at(
            &dir,
            &self.home.templates_dir(),
            &self.config.git.default_branch,
        );
        if let Err(error) = result {
            // Leave nothing half-made behind.
            let _ = fs::remove_dir_all(&dir);
            return Err(ToolError::internal("creating the workspace", error));
        }
        let connection = self.pool.get()?;
        connection.execute(
            "INSERT OR IGNORE INTO workspaces(slug, created_at) VALUES (?1, ?2)",
            rusqlite::params![slug, db::now_ms()],
        )?;
        Ok(dir)
    }

    /// Resolve a checked workspace path to an absolute path inside the workspace,
    /// refusing symlinks that lead outside its layer.
    pub fn resolve(&self, slug: &str, path: &WorkspacePath) -> ToolResult<PathBuf> {
        if let Some((plain, _)) = self.resolve_plain(slug, path) {
            return Ok(plain);
        }
        let workspace = self.workspace_dir(slug);
        let layer_dir = workspace.join(path.layer.as_str());
        let candidate = workspace.join(&path.path);
        let layer_real = fs::canonicalize(&layer_dir)
            .map_err(|e| ToolError::internal("resolving the layer directory", e))?;
        // Canonicalize the longest existing prefix, then check containment.
        let mut existing = candidate.clone();
        let mut tail = Vec::new();
        while !existing.exists() && existing.symlink_metadata().is_err() {
            match (existing.file_name(), existing.parent()) {
                (Some(name), Some(parent)) => {
                    tail.push(name.to_os_string());
                    existing = parent.to_path_buf();
                }
                _ => break,
            }
        }
        let real = match fs::canonicalize(&existing) {
            Ok(real) => real,
            // A dangling symlink: refuse, whatever it points at.
            Err(_) => {
                return Err(ToolError::invalid_path(format!(
                    "{} is a broken link",
                    path.path
                )));
            }
        };
        if !real.starts_with(&layer_real) {
            return Err(ToolError::invalid_path(format!(
                "{} leads outside {}/ (through a symbolic link)",
                path.path,
                path.layer.as_str()
            )));
        }
        let mut resolved = real;
        for component in tail.into_iter().rev() {
            resolved.push(component);
        }
        Ok(resolved)
    }

    /// `resolve` without `canonicalize` (issue 15: its `readlink` of every component
    /// from `/` down was a fifth of a `read`'s system calls): when neither the
    /// workspace's directory nor any component of the path below it is a symbolic link
    /// (one `lstat` each, up to the first that does not exist), the path is its own real
    /// path under the workspaces' directory, canonicalized once. None: something is a
    /// link (or cannot be looked at), and the full check decides.
    fn resolve_plain(
        &self,
        slug: &str,
        path: &WorkspacePath,
    ) -> Option<(PathBuf, Option<fs::Metadata>)> {
        let base = self
            .real_workspaces
            .get_or_init(|| fs::canonicalize(self.home.workspaces_dir()).ok())
            .as_ref()?;
        let mut real = base.join(slug);
        let mut missing = false;
        let mut last = None;
        let components = std::iter::once(None).chain(Path::new(&path.path).components().map(Some));
        for (depth, component) in components.enumerate() {
            if let Some(component) = component {
                let std::path::Component::Normal(name) = component else {
                    return None;
                };
                real.push(name);
            }
            if missing {
                continue;
            }
            match fs::symlink_metadata(&real) {
                Ok(metadata) if metadata.file_type().is_symlink() => return None,
                Ok(metadata) => last = Some(metadata),
                // The workspace and its layer must be there (else the full check says
                // what is wrong); below them, the rest of a new page's path may not be.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && depth >= 2 => missing = true,
                Err(_) => return None,
            }
        }
        // The lstat of the path itself (not a link, so its stat), when it exists.
        Some((real, if missing { None } else { last }))
    }

    /// Validate a caller-given path (not a glob) and resolve it.
    pub fn checked_path(&self, slug: &str, raw: &str) -> ToolResult<(WorkspacePath, PathBuf)> {
        let path = paths::validate_workspace_path(raw, false)
            .map_err(|e| ToolError::invalid_path(e.message).with_detail("path", raw))?;
        let absolute = self.resolve(slug, &path)?;
        Ok((path, absolute))
    }

    /// Validate a caller-given path (not a glob) for a caller that reads the file next: on Linux the
    /// plain check is one `openat2` that refuses a symbolic link anywhere below the
    /// workspaces' real directory (`RESOLVE_NO_SYMLINKS`), and the stat is the open
    /// file's, so what is read is what was checked and stat'ed (issue 15: the `lstat`
    /// of each component and the `open` were a fifth of a glob batch's time). The file
    /// is None when that check did not decide (a link, something missing, not a regular
    /// file, an older kernel): the plain `lstat` walk (`resolve_plain`) or the full check decides.
    pub fn checked_path_for_read(&self, slug: &str, raw: &str) -> ToolResult<CheckedForRead> {
        let path = paths::validate_workspace_path(raw, false)
            .map_err(|e| ToolError::invalid_path(e.message).with_detail("path", raw))?;
        if let Some((absolute, file, stat)) = self.open_plain(slug, &path) {
            return Ok(CheckedForRead {
                path,
                absolute,
                stat: Some(stat),
                file: Some(file),
            });
        }
        if let Some((absolute, stat)) = self.resolve_plain(slug, &path) {
            return Ok(CheckedForRead {
                path,
                absolute,
                stat,
                file: None,
            });
        }
        let absolute = self.resolve(slug, &path)?;
        Ok(CheckedForRead {
            path,
            absolute,
            stat: None,
            file: None,
        })
    }

    #[cfg(target_os = "linux")]
    fn open_plain(
        &self,
        slug: &str,
        path: &WorkspacePath,
    ) -> Option<(PathBuf, fs::File, fs::Metadata)> {
        use rustix::fs::{CWD, Mode, OFlags, ResolveFlags, openat2};
        use std::sync::atomic::{AtomicBool, Ordering};
        /// Set once the kernel (or a seccomp filter) refuses openat2 itself.
        static UNSUPPORTED: AtomicBool = AtomicBool::new(false);
        if UNSUPPORTED.load(Ordering::Relaxed) {
            return None;
        }
        let base = self
            .real_workspaces
            .get_or_init(|| fs::canonicalize(self.home.workspaces_dir()).ok())
            .as_ref()?;
        let relative = Path::new(&path.path);
        if !relative
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)))
        {
            return None;
        }
        let real = base.join(slug).join(relative);
        // Never blocks on a FIFO; for a regular file O_NONBLOCK changes nothing.
        let flags = OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK;
        let resolve = ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
        let fd = match openat2(CWD, &real, flags, Mode::empty(), resolve) {
            Ok(fd) => fd,
            // Too old a kernel, or a seccomp filter that refuses the call (some
            // container runtimes answer EPERM rather than ENOSYS).
            Err(rustix::io::Errno::NOSYS | rustix::io::Errno::PERM) => {
                UNSUPPORTED.store(true, Ordering::Relaxed);
                return None;
            }
            Err(_) => return None,
        };
        let file = fs::File::from(fd);
        let stat = file.metadata().ok()?;
        stat.is_file().then_some((real, file, stat))
    }

    #[cfg(not(target_os = "linux"))]
    fn open_plain(
        &self,
        _slug: &str,
        _path: &WorkspacePath,
    ) -> Option<(PathBuf, fs::File, fs::Metadata)> {
        None
    }

    pub fn layer_dir(&self, slug: &str, layer: Layer) -> PathBuf {
        self.workspace_dir(slug).join(layer.as_str())
    }
}

fn create_dir(path: &Path, mode: u32) -> Result<(), StoreError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(path)
        .map_err(|source| StoreError::Create {
            path: path.display().to_string(),
            source,
        })?;
    // `mode` only applies to newly created directories; tighten existing ones too.
    if mode == 0o700 {
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(|source| {
            StoreError::Create {
                path: path.display().to_string(),
                source,
            }
        })?;
    }
    Ok(())
}

fn write_new(path: &Path, contents: &str) -> Result<(), StoreError> {
    if path.exists() {
        return Ok(());
    }
    fs::write(path, contents).map_err(|source| StoreError::Create {
        path: path.display().to_string(),
        source,
    })
}

/// Create the directories and default files of SPEC §2 that are missing.
pub fn ensure_layout(home: &Home) -> Result<(), StoreError> {
    create_dir(home.root(), 0o755)?;
    create_dir(&home.run_dir(), 0o700)?;
    create_dir(&home.secrets_dir(), 0o700)?;
    create_dir(&home.logs_dir(), 0o755)?;
    create_dir(&home.workspaces_dir(), 0o755)?;
    create_dir(&home.templates_dir(), 0o755)?;
    for (name, contents) in TEMPLATES {
        write_new(&home.templates_dir().join(name), contents)?;
    }
    write_new(&home.config_file(), DEFAULT_CONFIG)?;
    Ok(())
}

fn create_workspace_at(dir: &Path, templates: &Path, branch: &str) -> Result<(), StoreError> {
    let head = format!("refs/heads/{branch}");
    if !git2::Reference::is_valid_name(&head) {
        return Err(StoreError::Git(git2::Error::from_str(&format!(
            "config.toml [git] default_branch = {branch:?} is not a valid branch name"
        ))));
    }
    for sub in ["raw", "wiki", "runs", ".trash"] {
        create_dir(&dir.join(sub), 0o755)?;
    }
    for (name, embedded) in TEMPLATES {
        let contents =
            fs::read_to_string(templates.join(name)).unwrap_or_else(|_| embedded.to_string());
        write_new(&dir.join("wiki").join(name), &contents)?;
    }
    write_new(&dir.join("raw/.gitkeep"), "")?;
    write_new(&dir.join(".gitignore"), WORKSPACE_GITIGNORE)?;
    let repo =
        git2::Repository::init_opts(dir, git2::RepositoryInitOptions::new().initial_head(branch))?;
    let mut index = repo.index()?;
    index.add_all(["*"].iter(), git2::IndexAddOption::DEFAULT, None)?;
    index.write()?;
    let tree = repo.find_tree(index.write_tree()?)?;
    let signature = git2::Signature::now("alexandria", "alexandria@localhost")?;
    repo.commit(
        Some("HEAD"),
        &signature,
        &signature,
        &super::message::internal(
            super::message::OP_CREATE_WORKSPACE,
            "alexandria: create workspace",
        ),
        &tree,
        &[],
    )?;
    Ok(())
}

/// The git blob id of `bytes`: a page's revision (`rev`).
pub fn revision(bytes: &[u8]) -> String {
    // git's blob id, SHA-1 of "blob <length>\0" and the bytes, with the sha1 crate
    // (SHA-NI where the CPU has it): libgit2's collision-detecting SHA-1 was about a
    // tenth of a cold index's catch-up (issue 15). The same id, for any file.
    use sha1::{Digest, Sha1};
    let mut hasher = Sha1::new();
    hasher.update(format!("blob {}\0", bytes.len()).as_bytes());
    hasher.update(bytes);
    let digest = hasher.finalize();
    let mut hex = String::with_capacity(40);
    for byte in digest {
        use std::fmt::Write as _;
        let _ = write!(hex, "{byte:02x}");
    }
    hex
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revision_is_git_s_blob_id() {
        for bytes in [
            &b""[..],
            b"hello\n",
            &[0u8, 255, 10, 13][..],
            &[b'x'; 100_000][..],
        ] {
            let expected = git2::Oid::hash_object(git2::ObjectType::Blob, bytes)
                .expect("hash")
                .to_string();
            assert_eq!(revision(bytes), expected);
        }
    }

    fn store() -> (tempfile::TempDir, Arc<Store>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(Home::new(dir.path())).expect("open store");
        (dir, store)
    }

    #[test]
    fn layout_and_global_workspace() {
        let (dir, store) = store();
        assert_eq!(store.list_workspaces(), vec!["global".to_string()]);
        let mode = fs::metadata(dir.path().join("run"))
            .expect("run")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        for page in STRUCTURAL_PAGES {
            assert!(store.workspace_dir("global").join(page).is_file(), "{page}");
        }
        let error = store.create_workspace("global").expect_err("exists");
        assert_eq!(error.code, ErrorCode::WorkspaceExists);
    }

    #[test]
    fn symlinks_out_of_the_layer_are_refused() {
        let (dir, store) = store();
        let outside = dir.path().join("secrets");
        let wiki = store.layer_dir("global", Layer::Wiki);
        std::os::unix::fs::symlink(&outside, wiki.join("escape")).expect("symlink");
        std::os::unix::fs::symlink(dir.path().join("config.toml"), wiki.join("cfg.md"))
            .expect("symlink");
        for path in ["wiki/escape/token", "wiki/cfg.md"] {
            let error = store.checked_path("global", path).expect_err(path);
            assert_eq!(error.code, ErrorCode::InvalidPath, "{path}");
        }
        let (_, ok) = store
            .checked_path("global", "wiki/new/page.md")
            .expect("new page ok");
        assert!(ok.ends_with("wiki/new/page.md"));
    }

    #[test]
    fn repositories_closed_when_quiet_are_opened_again_on_use() {
        let (_dir, store) = store();
        let root = store.workspace_dir("global");
        let state = store.state("global");
        let head = |state: &WorkspaceState| {
            state
                .with_repo(&root, |repo| repo.head().map(|h| h.target()))
                .expect("head")
        };
        let before = head(&state);
        assert!(before.is_some());
        assert_eq!(store.release_repositories(), 1);
        assert_eq!(store.release_repositories(), 0, "nothing left open");
        assert_eq!(head(&state), before);
        // One in use is left alone.
        let held = state.repo.lock().expect("lock");
        assert_eq!(store.release_repositories(), 0);
        drop(held);
        assert_eq!(store.release_repositories(), 1);
    }

    #[test]
    fn a_path_checked_for_reading_is_opened_only_when_no_link_is_on_the_way() {
        use std::io::Read as _;
        let (dir, store) = store();
        let wiki = store.layer_dir("global", Layer::Wiki);
        fs::create_dir_all(wiki.join("topics")).expect("folder");
        fs::write(wiki.join("topics/real.md"), "real text").expect("page");
        fs::write(dir.path().join("secret.txt"), "secret").expect("secret");
        std::os::unix::fs::symlink(wiki.join("topics/real.md"), wiki.join("alias.md"))
            .expect("symlink");
        std::os::unix::fs::symlink(wiki.join("topics"), wiki.join("linked")).expect("symlink");
        std::os::unix::fs::symlink(dir.path().join("secret.txt"), wiki.join("out.md"))
            .expect("symlink");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            wiki.join("pipe.md"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
            0,
        )
        .expect("fifo");

        // A plain page: opened, and the stat is that file's.
        let checked = store
            .checked_path_for_read("global", "wiki/topics/real.md")
            .expect("plain");
        let mut file = checked.file.expect("opened");
        assert_eq!(checked.stat.expect("stat").len(), 9);
        let mut text = String::new();
        file.read_to_string(&mut text).expect("read");
        assert_eq!(text, "real text");
        assert!(checked.absolute.ends_with("wiki/topics/real.md"));

        // A link within the layer (to the file, or a folder on the way) is followed by
        // the full check, not opened by the plain one.
        for path in ["wiki/alias.md", "wiki/linked/real.md"] {
            let checked = store.checked_path_for_read("global", path).expect(path);
            assert!(checked.file.is_none(), "{path}");
            assert!(checked.absolute.ends_with("wiki/topics/real.md"), "{path}");
        }
        // A link out of the layer is refused.
        let error = store
            .checked_path_for_read("global", "wiki/out.md")
            .expect_err("escape");
        assert_eq!(error.code, ErrorCode::InvalidPath);
        // A folder, a FIFO (opening it must not block) and a missing page are left to
        // the caller, unopened.
        for path in ["wiki/topics", "wiki/pipe.md", "wiki/missing.md"] {
            let checked = store.checked_path_for_read("global", path).expect(path);
            assert!(checked.file.is_none(), "{path}");
        }
    }
}
