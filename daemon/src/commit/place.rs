//! Putting a page in place without losing what was there (issue 20).
//!
//! An editor may save the page at any moment (a temp file renamed over it, or a write
//! in place), so the daemon swaps its new file in atomically and looks at what it
//! replaced: on Linux `renameat2(RENAME_EXCHANGE)` hands the previous file back under
//! the name the new one had, in the run's directory (`runs/<id>/swap-…`), where it stays
//! until the commit that records it is done, so a crash cannot lose it (recovery commits
//! it); macOS has the same (`RENAME_SWAP`); on a file system without either, the page is
//! moved aside and the new file linked in (`without_exchange`). The replaced file
//! stays open, so that a save that lands in it after it was read (an editor writing in
//! place into the file it opened earlier) is noticed too, also after the write
//! (`commit/late.rs`).

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

impl Replaced {
    /// A replaced file kept at `path` (by a swap before a crash), opened again.
    pub fn open(path: &Path) -> std::io::Result<Replaced> {
        let mut file = File::open(path)?;
        let seen = stamp(&file.metadata()?);
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        Ok(Replaced {
            bytes: Some(bytes),
            file: Some(file),
            seen: Some(seen),
        })
    }

    /// Whether the replaced file is still open (there was one, and it is watched).
    pub fn is_open(&self) -> bool {
        self.file.is_some()
    }

    /// Whether its size or modification time changed since it was read (one `fstat`).
    pub fn touched(&self) -> bool {
        self.file
            .as_ref()
            .and_then(|f| f.metadata().ok())
            .is_some_and(|m| Some(stamp(&m)) != self.seen)
    }

    /// Read it again and compare the bytes (a save of the same size within the file
    /// system's timestamp granularity changes neither size nor mtime); returns whether
    /// they changed.
    pub fn reread(&mut self) -> std::io::Result<bool> {
        let Some(file) = self.file.as_mut() else {
            return Ok(false);
        };
        let now = stamp(&file.metadata()?);
        let mut bytes = Vec::new();
        file.seek(SeekFrom::Start(0))?;
        file.read_to_end(&mut bytes)?;
        self.seen = Some(now);
        if self.bytes.as_deref() == Some(bytes.as_slice()) {
            return Ok(false);
        }
        self.bytes = Some(bytes);
        Ok(true)
    }
}

/// Replace `target` with `bytes` in one atomic step and hand back what it replaced.
///
/// The new file is written at `keep` (in the run's directory, on the page's file
/// system) and exchanged with the page, so from that instant `keep` names the replaced
/// file: if the daemon dies before the version is committed, recovery finds it there
/// (`commit/recover.rs` walks `runs/`). Where `keep` is on another file system than the
/// page, the page is swapped from a temporary file beside it and the replaced bytes are
/// written to `keep` right after (a crash in that instant loses them: the remaining
/// window there).
/// Durability comes from the flush before a write is acknowledged (`Durable`).
pub fn swap_in(target: &Path, bytes: &[u8], keep: &Path) -> std::io::Result<Swapped> {
    if let Some(dir) = target.parent() {
        fs::create_dir_all(dir)?;
    }
    if let Some(dir) = keep.parent() {
        fs::create_dir_all(dir)?;
    }
    // Written under a temporary name and renamed to `keep` whole: recovery takes a
    // kept file whose bytes are not the run's text for a version the swap replaced, so
    // it must never see one half written (a crash between create and write).
    let fresh = keep.with_file_name(format!(
        ".new-{}",
        keep.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    ));
    let mut file = File::create(&fresh)?;
    if let Err(e) = file
        .write_all(bytes)
        .and_then(|()| fs::rename(&fresh, keep))
    {
        let _ = fs::remove_file(&fresh);
        return Err(e);
    }
    let (replaced, stat, named) = match exchange(keep, target) {
        // Stat data after the move (a rename changes the ctime), for git's index.
        Ok((replaced, named)) => (replaced, file.metadata().ok(), named),
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::XDEV.raw_os_error()) => {
            let temp = temp_path(target)?;
            let result = (|| {
                let mut file = File::create(&temp)?;
                file.write_all(bytes)?;
                let (replaced, _) = exchange(&temp, target)?;
                Ok::<_, std::io::Error>((replaced, file.metadata().ok()))
            })();
            let _ = fs::remove_file(&temp);
            let (replaced, stat) = result?;
            (replaced, stat, false)
        }
        Err(e) => {
            let _ = fs::remove_file(keep);
            return Err(e);
        }
    };
    if !named {
        match &replaced.bytes {
            Some(bytes) => fs::write(keep, bytes)?,
            None => {
                let _ = fs::remove_file(keep);
            }
        }
    }
    Ok(Swapped { stat, replaced })
}

/// Whether a rename failed because the file system (or the OS) cannot do that kind of
/// rename at all.
fn unsupported(error: rustix::io::Errno) -> bool {
    use rustix::io::Errno;
    [Errno::INVAL, Errno::NOSYS, Errno::OPNOTSUPP, Errno::NOTSUP].contains(&error)
}

/// A replaced file now named `path`, opened and read.
fn open_replaced(path: &Path) -> std::io::Result<Replaced> {
    let mut file = File::open(path)?;
    let seen = stamp(&file.metadata()?);
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(Replaced {
        bytes: Some(bytes),
        file: Some(file),
        seen: Some(seen),
    })
}

fn nothing_replaced() -> Replaced {
    Replaced {
        bytes: None,
        file: None,
        seen: None,
    }
}

/// Put `temp` in place of `target` in one atomic step: `renameat2(RENAME_EXCHANGE)` on
/// Linux, `renameatx_np(RENAME_SWAP)` on macOS. Returns what was replaced and whether
/// `temp` names it now.
#[cfg(any(target_os = "linux", target_vendor = "apple"))]
fn exchange(temp: &Path, target: &Path) -> std::io::Result<(Replaced, bool)> {
    use rustix::fs::{CWD, RenameFlags, renameat_with};
    use rustix::io::Errno;
    if crate::faults::is_off("exchange") {
        return without_exchange(temp, target);
    }
    loop {
        match renameat_with(CWD, temp, CWD, target, RenameFlags::EXCHANGE) {
            // `temp` now names the replaced file.
            Ok(()) => return Ok((open_replaced(temp)?, true)),
            Err(Errno::NOENT) => {
                match renameat_with(CWD, temp, CWD, target, RenameFlags::NOREPLACE) {
                    Ok(()) => return Ok((nothing_replaced(), true)),
                    // Created meanwhile: exchange with it.
                    Err(Errno::EXIST) => continue,
                    Err(e) if unsupported(e) => return without_exchange(temp, target),
                    Err(e) => return Err(e.into()),
                }
            }
            Err(e) if unsupported(e) => return without_exchange(temp, target),
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(not(any(target_os = "linux", target_vendor = "apple")))]
fn exchange(temp: &Path, target: &Path) -> std::io::Result<(Replaced, bool)> {
    without_exchange(temp, target)
}

/// Without an atomic exchange (a network or FUSE file system): move the page aside
/// first (a rename takes whatever is there at that instant, an editor's newest save
/// included), then link the new file in under the page's name, which fails if a file
/// appeared there meanwhile: that newer save is moved aside in turn (it supersedes the
/// one before, as the editor's own save did). No version is lost; the page is missing
/// for that instant. `temp` names the replaced file afterwards. Where hard links are
/// not supported either, the new file is renamed in after the page was moved aside (a
/// save in that instant is the remaining window).
fn without_exchange(temp: &Path, target: &Path) -> std::io::Result<(Replaced, bool)> {
    let name = temp
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let aside = temp.with_file_name(format!(".old-{name}"));
    let mut moved = false;
    loop {
        match fs::rename(target, &aside) {
            Ok(()) => moved = true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        match fs::hard_link(temp, target) {
            Ok(()) => {
                fs::remove_file(temp)?;
                break;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) if rustix::io::Errno::from_io_error(&e).is_some_and(unsupported_link) => {
                fs::rename(temp, target)?;
                break;
            }
            Err(e) => {
                if moved {
                    let _ = restore(&aside, target);
                }
                return Err(e);
            }
        }
    }
    if !moved {
        return Ok((nothing_replaced(), true));
    }
    fs::rename(&aside, temp)?;
    Ok((open_replaced(temp)?, true))
}

/// Whether `link` failed because the file system has no hard links.
fn unsupported_link(error: rustix::io::Errno) -> bool {
    use rustix::io::Errno;
    unsupported(error) || error == Errno::PERM || error == Errno::MLINK
}

/// Undo a `swap_in` whose `keep` still names what it replaced: that file goes back in
/// place (and `keep` names what the swap had put there).
pub fn swap_back(keep: &Path, target: &Path) -> std::io::Result<()> {
    exchange(keep, target).map(drop)
}

/// Move `target` away to `keep` (in the run's directory, so that what it held is
/// found after a crash) and return its bytes (None: there was none).
pub fn take_away(target: &Path, keep: &Path) -> std::io::Result<Option<Vec<u8>>> {
    if let Some(dir) = keep.parent() {
        fs::create_dir_all(dir)?;
    }
    match fs::rename(target, keep) {
        Ok(()) => fs::read(keep).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::XDEV.raw_os_error()) => {
            let temp = temp_path(target)?;
            match fs::rename(target, &temp) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(e),
            }
            let bytes = fs::read(&temp)?;
            fs::write(keep, &bytes)?;
            let _ = fs::remove_file(&temp);
            Ok(Some(bytes))
        }
        Err(e) => Err(e),
    }
}

/// Move `from` back to `target` unless a file is there again (a newer save, which
/// wins; `from` then stays where it is). Returns whether it moved.
pub fn restore(from: &Path, target: &Path) -> std::io::Result<bool> {
    #[cfg(any(target_os = "linux", target_vendor = "apple"))]
    if !crate::faults::is_off("exchange") {
        use rustix::fs::{CWD, RenameFlags, renameat_with};
        match renameat_with(CWD, from, CWD, target, RenameFlags::NOREPLACE) {
            Ok(()) => return Ok(true),
            Err(rustix::io::Errno::EXIST) => return Ok(false),
            Err(e) if unsupported(e) => {}
            Err(e) => return Err(e.into()),
        }
    }
    // A hard link never replaces a file; where there are none, look just before.
    match fs::hard_link(from, target) {
        Ok(()) => {
            fs::remove_file(from)?;
            return Ok(true);
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(false),
        Err(e) if rustix::io::Errno::from_io_error(&e).is_some_and(unsupported_link) => {}
        Err(e) => return Err(e),
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
        let page = dir.path().join("wiki/p.md");
        let run = dir.path().join("runs/r");
        let first = swap_in(&page, b"one", &run.join("swap-0")).expect("create");
        assert!(first.replaced.bytes.is_none());
        assert!(
            !run.join("swap-0").exists(),
            "nothing replaced, nothing kept"
        );
        let mut second = swap_in(&page, b"two", &run.join("swap-1")).expect("replace");
        assert_eq!(second.replaced.bytes.as_deref(), Some(&b"one"[..]));
        assert_eq!(fs::read(&page).expect("read"), b"two");
        assert_eq!(
            fs::read(run.join("swap-1")).expect("kept"),
            b"one",
            "the replaced file is kept in the run's directory"
        );
        assert!(!second.replaced.refresh(false).expect("refresh"));
        let leftovers = fs::read_dir(page.parent().expect("wiki"))
            .expect("dir")
            .count();
        assert_eq!(leftovers, 1, "no temporary file left beside the page");
        let taken = take_away(&page, &run.join("back-2")).expect("take away");
        assert_eq!(taken.as_deref(), Some(&b"two"[..]));
        assert!(!page.exists());
        assert_eq!(fs::read(run.join("back-2")).expect("kept"), b"two");
    }

    #[test]
    fn without_an_exchange_nothing_is_replaced_unseen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let page = dir.path().join("p.md");
        let new = dir.path().join("swap-0");
        fs::write(&new, b"one").expect("write");
        let (nothing, named) = without_exchange(&new, &page).expect("create");
        assert!(nothing.bytes.is_none() && named);
        assert_eq!(fs::read(&page).expect("read"), b"one");
        assert!(!new.exists());
        fs::write(&new, b"two").expect("write");
        let (mut replaced, named) = without_exchange(&new, &page).expect("replace");
        assert!(named);
        assert_eq!(replaced.bytes.as_deref(), Some(&b"one"[..]));
        assert_eq!(fs::read(&page).expect("read"), b"two");
        assert_eq!(
            fs::read(&new).expect("kept"),
            b"one",
            "the replaced file is named"
        );
        // A save in place into the replaced file after the swap is seen through it.
        fs::write(&new, b"one, saved late").expect("late save");
        assert!(replaced.reread().expect("reread"));
        let names: Vec<String> = fs::read_dir(dir.path())
            .expect("dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 2, "no file left aside: {names:?}");
        // `restore` never replaces a file that is there.
        let back = dir.path().join("back");
        fs::write(&back, b"back").expect("write");
        assert!(!restore(&back, &page).expect("restore"));
        assert_eq!(fs::read(&page).expect("read"), b"two");
        fs::remove_file(&page).expect("remove");
        assert!(restore(&back, &page).expect("restore"));
        assert_eq!(fs::read(&page).expect("read"), b"back");
    }
}
