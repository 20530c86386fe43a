//! Careful file I/O for config edits: read what is there (refusing what we could not write
//! back safely), keep a backup, replace atomically, and notice a concurrent writer.
//!
//! Symlinked config files (dotfile managers) are edited at their target, so the link stays.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// Suffix of the copy of a file as it was before our last change.
pub const BACKUP_SUFFIX: &str = ".alexandria-backup";

/// A config file as we found it.
#[derive(Debug)]
pub struct Found {
    /// Where to write: the file itself, or a symlink's target.
    pub path: PathBuf,
    /// `None` when the file does not exist yet.
    pub text: Option<String>,
}

/// Read a config file if it exists. Refuses a directory, a dangling symlink, a file we may not
/// write (read-only, or not writable by us) and a file that is not UTF-8.
pub fn read(path: &Path) -> Result<Found> {
    let path = match fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_symlink() => fs::canonicalize(path).with_context(|| {
            format!(
                "{} is a symlink to a missing file; fix or remove the link, then re-run",
                path.display()
            )
        })?,
        Ok(_) => path.to_path_buf(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Found {
                path: path.to_path_buf(),
                text: None,
            });
        }
        Err(e) => return Err(e).with_context(|| format!("cannot inspect {}", path.display())),
    };
    let meta = fs::metadata(&path).with_context(|| format!("cannot inspect {}", path.display()))?;
    if !meta.is_file() {
        bail!(
            "{} is not a regular file; move it away, then re-run",
            path.display()
        );
    }
    if meta.permissions().readonly() {
        bail!(
            "{} is read-only, so alexandria leaves it alone; make it writable (chmod u+w) or add the entry by hand",
            path.display()
        );
    }
    // Opening for writing (without truncating) modifies nothing and tells whether we may.
    fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .with_context(|| format!("{} is not writable by you", path.display()))?;
    let bytes = fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let text = String::from_utf8(bytes).map_err(|_| {
        anyhow::anyhow!(
            "{} is not UTF-8 text; fix the file or move it away, then re-run",
            path.display()
        )
    })?;
    Ok(Found {
        path,
        text: Some(text),
    })
}

pub fn backup_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(BACKUP_SUFFIX);
    PathBuf::from(name)
}

/// Replace `found` with `text`: back up the old file, write a temp file in the same directory
/// with the old file's permissions, and rename it over. Returns the backup path, if any.
///
/// If the file changed since it was read (say, a running Claude Code rewrote it), nothing is
/// written and the error says to re-run.
pub fn write(found: &Found, text: &str) -> Result<Option<PathBuf>> {
    let path = &found.path;
    let dir = parent(path)?;
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut temp = tempfile::Builder::new()
        .prefix(".alexandria-")
        .suffix(".tmp")
        .tempfile_in(dir)
        .with_context(|| format!("cannot create a temporary file in {}", dir.display()))?;
    temp.write_all(text.as_bytes())
        .and_then(|()| temp.as_file().sync_all())
        .with_context(|| format!("cannot write a temporary file in {}", dir.display()))?;
    let permissions = match &found.text {
        Some(_) => Some(
            fs::metadata(path)
                .with_context(|| format!("cannot inspect {}", path.display()))?
                .permissions(),
        ),
        None => new_file_permissions(),
    };
    if let Some(permissions) = permissions {
        fs::set_permissions(temp.path(), permissions)
            .with_context(|| format!("cannot set permissions on {}", temp.path().display()))?;
    }
    let backup = backup_unchanged(found)?;
    temp.persist(path)
        .with_context(|| format!("cannot replace {}", path.display()))?;
    Ok(backup)
}

/// Delete a file we own, keeping a backup. Returns the backup path.
pub fn remove(found: &Found) -> Result<Option<PathBuf>> {
    let backup = backup_unchanged(found)?;
    fs::remove_file(&found.path)
        .with_context(|| format!("cannot remove {}", found.path.display()))?;
    Ok(backup)
}

/// Keep a copy of an existing file before someone else (the `claude` CLI) rewrites it.
pub fn backup(found: &Found) -> Result<PathBuf> {
    backup_unchanged(found)?.with_context(|| format!("{} does not exist", found.path.display()))
}

/// Copy the current file to the backup path after checking it still holds what we read.
fn backup_unchanged(found: &Found) -> Result<Option<PathBuf>> {
    let path = &found.path;
    let current = match fs::read(path) {
        Ok(bytes) => Some(bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    if current.as_deref() != found.text.as_deref().map(str::as_bytes) {
        bail!(
            "{} changed while alexandria was editing it (is the client running and rewriting it?); nothing was written, re-run the command",
            path.display()
        );
    }
    if current.is_none() {
        return Ok(None);
    }
    let backup = backup_path(path);
    fs::copy(path, &backup).with_context(|| format!("cannot write {}", backup.display()))?;
    Ok(Some(backup))
}

fn parent(path: &Path) -> Result<&Path> {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .with_context(|| format!("{} has no parent directory", path.display()))
}

/// New config files are readable by the user's other tools (the temp file starts at 0600).
#[cfg(unix)]
fn new_file_permissions() -> Option<fs::Permissions> {
    use std::os::unix::fs::PermissionsExt;
    Some(fs::Permissions::from_mode(0o644))
}

#[cfg(not(unix))]
fn new_file_permissions() -> Option<fs::Permissions> {
    None
}
