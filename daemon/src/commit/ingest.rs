//! `alexandria ingest`: copy files and folders into a workspace's `raw/` as one git
//! commit, then index them.
//!
//! A file keeps its name (made unique with `-2`, `-3` … unless the same content is
//! already there). A folder keeps its layout under `raw/<folder name>/`; hidden
//! entries (`.git/`, `.DS_Store`, `.cache/`) and whatever is not a plain file or folder
//! (symbolic links, sockets) are skipped and reported. Nothing is half-applied: every
//! file is staged beside its destination first, and on any error before the commit
//! the staged and placed files (and folders made for them) are removed.
//!
//! May import: `index`, `workspace`, `db`, `error`. The control transport calls it.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};

use alexandria_proto::ErrorCode;

use super::{
    Source, check_writable, commit_sources, flush_to_disk, io_error, lock_workspace, store_blob,
};
use crate::error::{ToolError, ToolResult};
use crate::index;
use crate::workspace::{Store, revision};

/// What an ingest did.
#[derive(Debug, Default)]
pub struct Ingested {
    /// Workspace-relative paths of the new files, e.g. `raw/notes/a.md`.
    pub added: Vec<String>,
    /// Sources whose content was already in `raw/` under their name.
    pub unchanged: Vec<String>,
    /// Sources left out, with why (`hidden`, `symbolic link`, …), relative to the
    /// folder given (its name included).
    pub skipped: Vec<(String, &'static str)>,
    /// Files added with a problem worth knowing (a PDF with no readable pages).
    pub problems: Vec<String>,
}

/// One file to copy: where it is, and its path under `raw/` before de-duplication.
struct Item {
    source: PathBuf,
    /// `/`-separated components under `raw/`, the last one the file name.
    components: Vec<String>,
}

/// Copy `sources` (absolute paths of files or folders) into `workspace`'s `raw/`.
pub fn ingest(
    store: &Store,
    workspace: &str,
    sources: &[String],
    progress: &dyn Fn(u64, u64, &str),
) -> ToolResult<Ingested> {
    store.require_workspace(workspace)?;
    let state = store.state(workspace);
    let run_id = format!("ingest-{}", uuid::Uuid::new_v4().simple());
    let lock = lock_workspace(store, &state, workspace, &run_id)?;
    check_writable(store, workspace)?;
    let mut report = Ingested::default();
    let added = place_and_commit(store, workspace, sources, progress, &mut report).map_err(
        |mut error| {
            error.message.push_str("; nothing was ingested");
            error
        },
    )?;
    {
        let connection = store.pool.get()?;
        let _index = state.index_lock.lock().unwrap_or_else(|p| p.into_inner());
        for (path, absolute) in &added {
            let record = index::index_file(&connection, workspace, path, absolute)?;
            if record.kind == "pdf" && record.pages.unwrap_or(0) == 0 {
                report.problems.push(format!("{path}: no readable pages"));
            }
        }
    }
    drop(lock);
    for (path, _) in &added {
        store.changed(workspace, path);
    }
    flush_to_disk(store, workspace)?;
    report.added = added.into_iter().map(|(path, _)| path).collect();
    Ok(report)
}

/// Everything up to the commit, undone on any error. Returns (relative, absolute)
/// of each file added.
fn place_and_commit(
    store: &Store,
    workspace: &str,
    sources: &[String],
    progress: &dyn Fn(u64, u64, &str),
    report: &mut Ingested,
) -> ToolResult<Vec<(String, PathBuf)>> {
    let mut items = Vec::new();
    for source in sources {
        collect(Path::new(source), &mut items, &mut report.skipped)?;
    }
    let root = store.workspace_dir(workspace);
    let mut staging = Staging::default();
    // Destinations chosen in this run, with the content's revision.
    let mut chosen: HashMap<PathBuf, String> = HashMap::new();
    // The blob of each destination, made of the bytes copied (never re-read from raw/).
    let mut blobs: HashMap<PathBuf, git2::Oid> = HashMap::new();
    let total = items.len() as u64;
    for (n, item) in items.iter().enumerate() {
        let shown = item.source.display().to_string();
        let bytes = fs::read(&item.source).map_err(|e| {
            ToolError::new(
                ErrorCode::NotFound,
                format!("cannot read {shown}: {e}"),
                "check the path and its permissions",
            )
        })?;
        let rev = revision(&bytes);
        match destination(&root, &item.components, &bytes, &rev, &chosen)? {
            None => report.unchanged.push(shown.clone()),
            Some(destination) => {
                staging.stage(&root, &destination, &bytes)?;
                blobs.insert(destination.clone(), store_blob(store, workspace, &bytes)?);
                chosen.insert(destination, rev);
            }
        }
        progress(n as u64 + 1, total, &shown);
    }
    let placed = staging.place()?;
    let added: Vec<(String, PathBuf)> = placed
        .iter()
        .filter_map(|absolute| {
            let relative = absolute.strip_prefix(&root).ok()?.to_str()?.to_string();
            Some((relative, absolute.clone()))
        })
        .collect();
    let sources: Vec<Source> = added
        .iter()
        .filter_map(|(path, absolute)| {
            Some(Source {
                path: path.clone(),
                blob: *blobs.get(absolute)?,
                stat: fs::symlink_metadata(absolute).ok(),
            })
        })
        .collect();
    if !sources.is_empty() {
        commit_sources(
            store,
            workspace,
            &sources,
            &crate::workspace::message::internal(
                crate::workspace::message::OP_INGEST,
                &format!("alexandria: ingest {} source(s)", sources.len()),
            ),
        )?;
    }
    staging.keep();
    Ok(added)
}

/// The files under `source` (itself, if a file), in a stable order.
fn collect(
    source: &Path,
    items: &mut Vec<Item>,
    skipped: &mut Vec<(String, &'static str)>,
) -> ToolResult<()> {
    let unreadable = |e: &dyn std::fmt::Display| {
        ToolError::new(
            ErrorCode::NotFound,
            format!("cannot read {}: {e}", source.display()),
            "check the path and its permissions",
        )
    };
    let metadata = fs::metadata(source).map_err(|e| unreadable(&e))?;
    let top = usable_name(source.file_name(), source)?;
    if metadata.is_file() {
        items.push(Item {
            source: source.to_path_buf(),
            components: vec![top],
        });
        return Ok(());
    }
    if !metadata.is_dir() {
        return Err(ToolError::invalid_argument(
            format!("{} is neither a file nor a folder", source.display()),
            "ingest files and folders of files",
        ));
    }
    let mut walk = walkdir::WalkDir::new(source)
        .follow_links(false)
        .sort_by_file_name()
        .into_iter();
    while let Some(entry) = walk.next() {
        let entry = entry.map_err(|e| unreadable(&e))?;
        if entry.depth() == 0 {
            continue;
        }
        let relative = entry.path().strip_prefix(source).unwrap_or(entry.path());
        let shown = Path::new(&top).join(relative).display().to_string();
        let file_type = entry.file_type();
        if entry.file_name().to_string_lossy().starts_with('.') {
            skipped.push((shown, "hidden"));
            if file_type.is_dir() {
                walk.skip_current_dir();
            }
            continue;
        }
        if file_type.is_dir() {
            continue;
        }
        if file_type.is_symlink() {
            skipped.push((shown, "symbolic link"));
            continue;
        }
        if !file_type.is_file() {
            skipped.push((shown, "not a regular file"));
            continue;
        }
        let mut components = vec![top.clone()];
        for component in relative.iter() {
            components.push(usable_name(Some(component), entry.path())?);
        }
        items.push(Item {
            source: entry.path().to_path_buf(),
            components,
        });
    }
    Ok(())
}

/// The name a component of `path` gets in `raw/`: without leading dots, with `\` and
/// `%` (which paths may not hold) replaced.
fn usable_name(name: Option<&OsStr>, path: &Path) -> ToolResult<String> {
    let unusable = |hint: &str| {
        ToolError::invalid_argument(
            format!("{} has no usable file name", path.display()),
            hint.to_string(),
        )
    };
    let name = name
        .and_then(OsStr::to_str)
        .ok_or_else(|| unusable("rename it to a UTF-8 name (or move it out of the folder)"))?;
    let name = name.trim_start_matches('.').replace(['\\', '%'], "_");
    if name.is_empty() {
        return Err(unusable("rename it"));
    }
    Ok(name)
}

/// Where a file goes under `root`/raw: its path, made unique unless the same content
/// is already there (on disk, or chosen earlier in this run): then `None`.
fn destination(
    root: &Path,
    components: &[String],
    bytes: &[u8],
    rev: &str,
    chosen: &HashMap<PathBuf, String>,
) -> ToolResult<Option<PathBuf>> {
    let Some((name, folders)) = components.split_last() else {
        return Err(ToolError::internal("ingest", "a file with no name"));
    };
    let mut dir = root.join("raw");
    dir.extend(folders);
    let (stem, extension) = match name.rsplit_once('.') {
        Some((stem, extension)) if !stem.is_empty() => (stem, format!(".{extension}")),
        _ => (name.as_str(), String::new()),
    };
    for n in 1..10_000 {
        let candidate = if n == 1 {
            dir.join(name)
        } else {
            dir.join(format!("{stem}-{n}{extension}"))
        };
        if let Some(other) = chosen.get(&candidate) {
            if other == rev {
                return Ok(None);
            }
            continue;
        }
        match fs::read(&candidate) {
            Ok(existing) if existing == bytes => return Ok(None),
            Ok(_) => continue,
            // Free; or a file stands where a folder should be: staging says so.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
            {
                return Ok(Some(candidate));
            }
            // A folder of that name, or unreadable: take another name.
            Err(_) => continue,
        }
    }
    Err(ToolError::invalid_argument(
        format!("too many files named like {name}"),
        "rename the file",
    ))
}

/// Files staged beside their destinations, then placed; removed again (with the
/// folders made for them) unless `keep` is called.
#[derive(Default)]
struct Staging {
    /// (temporary file, destination)
    staged: Vec<(PathBuf, PathBuf)>,
    placed: Vec<PathBuf>,
    /// Folders this run created, outermost first.
    created: Vec<PathBuf>,
    kept: bool,
}

impl Staging {
    /// Write `bytes` next to `destination` (under the workspace `root`), making the
    /// folders it needs.
    fn stage(&mut self, root: &Path, destination: &Path, bytes: &[u8]) -> ToolResult<()> {
        let dir = destination
            .parent()
            .ok_or_else(|| ToolError::internal("ingest", "a destination with no folder"))?;
        let mut missing = Vec::new();
        let mut ancestor = dir;
        while fs::symlink_metadata(ancestor).is_err() {
            missing.push(ancestor.to_path_buf());
            match ancestor.parent() {
                Some(parent) => ancestor = parent,
                None => break,
            }
        }
        if !ancestor.is_dir() {
            let name = ancestor.strip_prefix(root).unwrap_or(ancestor);
            return Err(ToolError::invalid_argument(
                format!(
                    "{} is a file, so {} cannot go in a folder of that name",
                    name.display(),
                    destination
                        .strip_prefix(root)
                        .unwrap_or(destination)
                        .display()
                ),
                "rename the folder you ingest (or the file in raw/), then ingest again",
            ));
        }
        for folder in missing.into_iter().rev() {
            fs::create_dir(&folder).map_err(|e| io_error("making a folder in raw/", e))?;
            self.created.push(folder);
        }
        let temp = dir.join(format!(".ingest-{}", uuid::Uuid::new_v4().simple()));
        // Recorded first, so that a failed write is cleaned up too.
        self.staged.push((temp.clone(), destination.to_path_buf()));
        fs::write(&temp, bytes).map_err(|e| io_error("copying into raw/", e))
    }

    /// Rename every staged file into place; returns the destinations.
    fn place(&mut self) -> ToolResult<Vec<PathBuf>> {
        for (temp, destination) in &self.staged {
            // Never over a file that appeared there meanwhile (an editor's, a sync's).
            if !super::place::restore(temp, destination)
                .map_err(|e| io_error("copying into raw/", e))?
            {
                return Err(ToolError::new(
                    alexandria_proto::ErrorCode::StalePlan,
                    format!(
                        "{} appeared while ingesting; nothing was changed",
                        destination.display()
                    ),
                    "ingest again (it picks another name)",
                ));
            }
            self.placed.push(destination.clone());
        }
        Ok(self.placed.clone())
    }

    fn keep(mut self) {
        self.kept = true;
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if self.kept {
            return;
        }
        for (temp, _) in &self.staged {
            let _ = fs::remove_file(temp);
        }
        for placed in &self.placed {
            let _ = fs::remove_file(placed);
        }
        for folder in self.created.iter().rev() {
            let _ = fs::remove_dir(folder);
        }
    }
}
