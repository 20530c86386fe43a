//! Putting a page in place without losing what was there (issue 20).
//!
//! An editor may save the page at any moment (a temp file renamed over it, or a write
//! in place), so the daemon swaps its new file in atomically and looks at what it
//! replaced: on Linux `renameat2(RENAME_EXCHANGE)` hands the previous file back under
//! the temporary name; elsewhere the page is read just before an ordinary rename. The
//! replaced file stays open, so that a save that lands in it after it was read (an
//! editor writing in place into the file it opened earlier) is noticed too.

use std::fs::{self, File, Metadata};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Marker in the names of temporary files; recovery deletes leftovers.
pub const TEMP_MARKER: &str = ".alx-tmp-";

/// A temporary name next to `path`.
pub fn temp_path(path: &Path) -> std::io::Result<PathBuf> {
    let dir = path
        .parent()
        .ok_or_else(|| std::io::Error::other("no parent directory"))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(dir.join(format!(
        ".{name}{TEMP_MARKER}{}",
        uuid::Uuid::new_v4().simple()
    )))
}

/// What a swap replaced.
pub struct Replaced {
    /// Its bytes when read (None: there was no file).
    pub bytes: Option<Vec<u8>>,
    file: Option<File>,
    seen: Option<(u64, i64, i64)>,
}

fn stamp(metadata: &Metadata) -> (u64, i64, i64) {
    use std::os::unix::fs::MetadataExt;
    (metadata.len(), metadata.mtime(), metadata.mtime_nsec())
}

impl Replaced {
    /// If the replaced file changed since it was read (a write in place into the file
    /// an editor opened before the swap), read it again; returns whether it changed.
    /// Waits until it stops changing; an empty file (an editor that truncated it and
    /// has not written yet) is waited for up to 250 ms when `expect_content`.
    pub fn refresh(&mut self, expect_content: bool) -> std::io::Result<bool> {
        let Some(file) = self.file.as_mut() else {
            return Ok(false);
        };
        let started = std::time::Instant::now();
        let mut changed = false;
        while started.elapsed() < Duration::from_millis(250) {
            let now = stamp(&file.metadata()?);
            if Some(now) != self.seen {
                let mut bytes = Vec::new();
                file.seek(SeekFrom::Start(0))?;
                file.read_to_end(&mut bytes)?;
                self.bytes = Some(bytes);
                self.seen = Some(now);
                changed = true;
            } else if !(expect_content && now.0 == 0) {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(changed)
    }
}

/// The page after a swap.
pub struct Swapped {
    /// Stat data of the file now in place, for git's index.
    pub stat: Option<Metadata>,
    pub replaced: Replaced,
}

/// Replace `target` with `bytes` in one atomic step and hand back what it replaced.
/// Durability comes from the flush before a write is acknowledged (`Durable`).
pub fn swap_in(target: &Path, bytes: &[u8]) -> std::io::Result<Swapped> {
    if let Some(dir) = target.parent() {
        fs::create_dir_all(dir)?;
    }
    let temp = temp_path(target)?;
    let result = (|| {
        let mut file = File::create(&temp)?;
        file.write_all(bytes)?;
        let replaced = exchange(&temp, target)?;
        Ok(Swapped {
            stat: file.metadata().ok(),
            replaced,
        })
    })();
    let _ = fs::remove_file(&temp);
    result
}

#[cfg(target_os = "linux")]
fn exchange(temp: &Path, target: &Path) -> std::io::Result<Replaced> {
    use rustix::fs::{CWD, RenameFlags, renameat_with};
    use rustix::io::Errno;
    loop {
        match renameat_with(CWD, temp, CWD, target, RenameFlags::EXCHANGE) {
            Ok(()) => {
                // `temp` now names the replaced file.
                let mut file = File::open(temp)?;
                let seen = stamp(&file.metadata()?);
                let mut bytes = Vec::new();
                file.read_to_end(&mut bytes)?;
                return Ok(Replaced {
                    bytes: Some(bytes),
                    file: Some(file),
                    seen: Some(seen),
                });
            }
            Err(Errno::NOENT) => {
                match renameat_with(CWD, temp, CWD, target, RenameFlags::NOREPLACE) {
                    Ok(()) => {
                        return Ok(Replaced {
                            bytes: None,
                            file: None,
                            seen: None,
                        });
                    }
                    // Created meanwhile: exchange with it.
                    Err(Errno::EXIST) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            // A file system without RENAME_EXCHANGE.
            Err(Errno::INVAL | Errno::NOSYS | Errno::OPNOTSUPP) => {
                return compare_and_rename(temp, target);
            }
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn exchange(temp: &Path, target: &Path) -> std::io::Result<Replaced> {
    compare_and_rename(temp, target)
}

/// Without an atomic exchange: read the page (and keep it open) right before an
/// ordinary rename over it. A save in the instant between is the remaining window.
fn compare_and_rename(temp: &Path, target: &Path) -> std::io::Result<Replaced> {
    let replaced = match File::open(target) {
        Ok(mut file) => {
            let seen = stamp(&file.metadata()?);
            let mut bytes = Vec::new();
            file.read_to_end(&mut bytes)?;
            Replaced {
                bytes: Some(bytes),
                file: Some(file),
                seen: Some(seen),
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Replaced {
            bytes: None,
            file: None,
            seen: None,
        },
        Err(e) => return Err(e),
    };
    fs::rename(temp, target)?;
    Ok(replaced)
}

/// Move `target` away and return its bytes (None: there was none).
pub fn take_away(target: &Path) -> std::io::Result<Option<Vec<u8>>> {
    let temp = temp_path(target)?;
    match fs::rename(target, &temp) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    }
    let bytes = fs::read(&temp);
    let _ = fs::remove_file(&temp);
    bytes.map(Some)
}

/// Move `from` back to `target` unless a file is there again (a newer save, which
/// wins; `from` then stays where it is). Returns whether it moved.
pub fn restore(from: &Path, target: &Path) -> std::io::Result<bool> {
    #[cfg(target_os = "linux")]
    {
        use rustix::fs::{CWD, RenameFlags, renameat_with};
        match renameat_with(CWD, from, CWD, target, RenameFlags::NOREPLACE) {
            Ok(()) => return Ok(true),
            Err(rustix::io::Errno::EXIST) => return Ok(false),
            Err(rustix::io::Errno::INVAL | rustix::io::Errno::NOSYS) => {}
            Err(e) => return Err(e.into()),
        }
    }
    if target.symlink_metadata().is_ok() {
        return Ok(false);
    }
    fs::rename(from, target)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swap_hands_back_what_it_replaced() {
        let dir = tempfile::tempdir().expect("tempdir");
        let page = dir.path().join("p.md");
        let first = swap_in(&page, b"one").expect("create");
        assert!(first.replaced.bytes.is_none());
        let mut second = swap_in(&page, b"two").expect("replace");
        assert_eq!(second.replaced.bytes.as_deref(), Some(&b"one"[..]));
        assert_eq!(fs::read(&page).expect("read"), b"two");
        assert!(!second.replaced.refresh(false).expect("refresh"));
        let leftovers = fs::read_dir(dir.path()).expect("dir").count();
        assert_eq!(leftovers, 1, "no temporary file left");
    }
}
