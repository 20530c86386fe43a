//! What a write must flush before it is acknowledged: the files it wrote and the
//! directories whose entries it changed, each fsynced once (issue 15), instead of a
//! `syncfs` of the whole file system (which also flushes everything every other
//! program on the machine has written).

use std::collections::BTreeSet;
use std::fs::File;
use std::path::{Path, PathBuf};

/// Files and directories to flush; a set, so a group of writes flushes each once.
#[derive(Debug, Default)]
pub struct Durable {
    files: BTreeSet<PathBuf>,
    dirs: BTreeSet<PathBuf>,
}

impl Durable {
    /// A file written (or renamed into place): its data and its directory entry.
    pub fn file(&mut self, path: impl Into<PathBuf>) {
        let path = path.into();
        if let Some(parent) = path.parent() {
            self.dirs.insert(parent.to_path_buf());
        }
        self.files.insert(path);
    }

    /// A directory whose entries changed (a file created, renamed or removed in it).
    pub fn dir(&mut self, path: impl Into<PathBuf>) {
        self.dirs.insert(path.into());
    }

    /// `path`'s parent directories up to and including `top` (new folders made for a
    /// page need their own entries flushed too).
    pub fn parents_up_to(&mut self, path: &Path, top: &Path) {
        let mut current = path.parent();
        while let Some(dir) = current {
            if !dir.starts_with(top) {
                break;
            }
            self.dirs.insert(dir.to_path_buf());
            if dir == top {
                break;
            }
            current = dir.parent();
        }
    }

    pub fn extend(&mut self, other: Durable) {
        self.files.extend(other.files);
        self.dirs.extend(other.dirs);
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty() && self.dirs.is_empty()
    }

    /// fdatasync every file, then fsync every directory. The calls are made from a few
    /// threads at once: the file system commits its journal once for all the calls
    /// waiting at that moment, instead of once per call in turn. A file gone meanwhile
    /// (an editor replaced the page) has nothing left to flush.
    pub fn flush(&self) -> std::io::Result<()> {
        let files: Vec<&PathBuf> = self.files.iter().collect();
        sync_all_of(&files, false)?;
        let dirs: Vec<&PathBuf> = self.dirs.iter().collect();
        sync_all_of(&dirs, true)
    }
}

/// Most threads one flush uses.
const FLUSH_THREADS: usize = 8;

fn sync_all_of(paths: &[&PathBuf], dirs: bool) -> std::io::Result<()> {
    if paths.len() <= 1 {
        return paths.iter().try_for_each(|path| sync_one(path, dirs));
    }
    let threads = paths.len().min(FLUSH_THREADS);
    let chunk = paths.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let handles: Vec<_> = paths
            .chunks(chunk)
            .map(|part| scope.spawn(move || part.iter().try_for_each(|p| sync_one(p, dirs))))
            .collect();
        handles.into_iter().try_for_each(|handle| {
            handle
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("a flush thread panicked")))
        })
    })
}

fn sync_one(path: &Path, dir: bool) -> std::io::Result<()> {
    match File::open(path) {
        Ok(handle) if dir => handle.sync_all(),
        Ok(handle) => handle.sync_data(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parents_stop_at_the_top() {
        let mut durable = Durable::default();
        durable.parents_up_to(Path::new("/w/wiki/a/b/p.md"), Path::new("/w/wiki"));
        let dirs: Vec<_> = durable
            .dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect();
        assert_eq!(dirs, ["/w/wiki", "/w/wiki/a", "/w/wiki/a/b"]);
    }

    #[test]
    fn flush_skips_files_gone_meanwhile() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut durable = Durable::default();
        std::fs::write(dir.path().join("a"), "a").expect("write");
        durable.file(dir.path().join("a"));
        durable.file(dir.path().join("gone"));
        durable.flush().expect("flush");
    }
}
