//! Names that one file system keeps apart and another merges. `wiki/Topic.md` and
//! `wiki/topic.md`, or `café.md` typed as NFC (Linux) and as NFD (macOS), are two files
//! here but one on macOS and Windows: a clone of the workspace there would silently
//! lose one. `conflicting_path` is the one check for every way a path comes into
//! being (a page created, a source ingested, a rename brought by sync).

use std::fs;
use std::io;
use std::path::Path;

use unicode_normalization::UnicodeNormalization as _;

/// The key two names share when a case- and normalization-insensitive file system
/// sees them as one: lowercase, then NFC (so `É`, `é` and `e\u{301}` agree).
pub fn fold(name: &str) -> String {
    name.chars().flat_map(char::to_lowercase).nfc().collect()
}

/// True when `a` and `b` differ but fold to the same key.
pub fn same_when_folded(a: &str, b: &str) -> bool {
    if a == b {
        return false;
    }
    if a.is_ascii() && b.is_ascii() {
        return a.eq_ignore_ascii_case(b);
    }
    fold(a) == fold(b)
}

/// The existing path that `relative` (`/`-separated, under `root`) would collide
/// with on a case- or normalization-insensitive file system: the first component
/// that has a sibling spelled differently but folding the same, e.g. `wiki/People`
/// for `wiki/people/ada.md`. An exact match is not a conflict; `None` when there is
/// none. Reads only the directories along the path (a big one from what `kept`
/// keeps of it, on Linux).
pub fn conflicting_path(root: &Path, relative: &str) -> io::Result<Option<String>> {
    let mut dir = root.to_path_buf();
    let mut prefix = String::new();
    let components: Vec<&str> = relative.split('/').filter(|c| !c.is_empty()).collect();
    for (i, component) in components.iter().copied().enumerate() {
        // The folders above the page's own are read by every write below them (the
        // workspace's root, `wiki`): kept whatever their size.
        let above = i + 1 < components.len();
        let Some((exact, other)) = beside(&dir, component, above)? else {
            return Ok(None);
        };
        if let Some(other) = other {
            return Ok(Some(format!("{prefix}{other}")));
        }
        if !exact {
            return Ok(None);
        }
        prefix.push_str(component);
        prefix.push('/');
        dir.push(component);
    }
    Ok(None)
}

/// Let go of the names kept of big folders (the daemon has gone quiet): two strings
/// per entry of each, which grew with every page a long run of writes added. The next
/// write into one reads it again.
pub fn release_cached() {
    #[cfg(target_os = "linux")]
    kept::release();
}

/// Whether `dir` holds `component` exactly, and a name that differs from it but folds
/// the same. None when `dir` does not exist. `keep`: keep its names whatever its size.
fn beside(dir: &Path, component: &str, keep: bool) -> io::Result<Option<(bool, Option<String>)>> {
    #[cfg(target_os = "linux")]
    if let Some(found) = kept::beside(dir, component) {
        return Ok(Some(found));
    }
    let (found, entries) = match read_beside(dir, component) {
        Ok(read) => read,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    #[cfg(target_os = "linux")]
    if entries >= kept::KEEP_FROM || keep {
        kept::keep(dir);
    }
    let _ = (entries, keep);
    Ok(Some(found))
}

/// `beside` by reading the folder; and how many entries it has.
fn read_beside(dir: &Path, component: &str) -> io::Result<((bool, Option<String>), usize)> {
    let mut exact = false;
    let mut other = None;
    let mut entries = 0;
    for entry in fs::read_dir(dir)? {
        entries += 1;
        let name = entry?.file_name();
        let Some(name) = name.to_str() else {
            continue;
        };
        if name == component {
            exact = true;
        } else if other.is_none() && same_when_folded(name, component) {
            other = Some(name.to_string());
        }
    }
    Ok(((exact, other), entries))
}

/// The names of big folders, kept between checks (issue 15): reading a folder of
/// thousands of pages for every new page was a fifth of the daemon's CPU with 8
/// writers. A kept folder is exact: an inotify watch on it, added before it is read,
/// queues every change made to it in the system call that makes it, and the queue is
/// read and applied before each answer. A folder replaced (its inode changed), moved,
/// deleted or unmounted, a queue that overflowed, or a file system where inotify may
/// not see every change (network and FUSE file systems: only local ones are kept) is
/// read again as before.
#[cfg(target_os = "linux")]
mod kept {
    use std::collections::HashMap;
    use std::mem::MaybeUninit;
    use std::os::fd::OwnedFd;
    use std::os::unix::fs::MetadataExt;
    use std::path::{Path, PathBuf};
    use std::sync::{LazyLock, Mutex};

    use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
    use rustix::io::Errno;

    use super::fold;

    /// Folders of this many entries or more are kept.
    pub const KEEP_FROM: usize = 256;
    /// Most folders kept at once.
    const MAX_KEPT: usize = 64;

    struct Folder {
        wd: i32,
        dev: u64,
        ino: u64,
        /// Folded name → the names that fold to it.
        names: HashMap<String, Vec<String>>,
    }

    impl Folder {
        fn add(&mut self, name: &str) {
            let same = self.names.entry(fold(name)).or_default();
            if !same.iter().any(|n| n == name) {
                same.push(name.to_string());
            }
        }

        fn remove(&mut self, name: &str) {
            let key = fold(name);
            if let Some(same) = self.names.get_mut(&key) {
                same.retain(|n| n != name);
                if same.is_empty() {
                    self.names.remove(&key);
                }
            }
        }
    }

    struct Folders {
        inotify: OwnedFd,
        dirs: HashMap<PathBuf, Folder>,
        by_wd: HashMap<i32, PathBuf>,
    }

    static FOLDERS: LazyLock<Mutex<Option<Folders>>> = LazyLock::new(|| {
        let inotify = inotify::init(CreateFlags::NONBLOCK | CreateFlags::CLOEXEC).ok();
        Mutex::new(inotify.map(|inotify| Folders {
            inotify,
            dirs: HashMap::new(),
            by_wd: HashMap::new(),
        }))
    });

    fn folders() -> std::sync::MutexGuard<'static, Option<Folders>> {
        FOLDERS.lock().unwrap_or_else(|p| p.into_inner())
    }

    impl Folders {
        fn forget(&mut self, dir: &Path) {
            if let Some(folder) = self.dirs.remove(dir) {
                self.by_wd.remove(&folder.wd);
                let _ = inotify::remove_watch(&self.inotify, folder.wd);
            }
        }

        fn forget_all(&mut self) {
            let dirs: Vec<PathBuf> = self.dirs.keys().cloned().collect();
            for dir in dirs {
                self.forget(&dir);
            }
        }

        /// Apply every change queued so far.
        fn drain(&mut self) {
            let mut buffer = vec![MaybeUninit::<u8>::uninit(); 16 << 10];
            let mut events: Vec<(i32, ReadFlags, Option<String>)> = Vec::new();
            let mut lost = false;
            {
                let mut reader = inotify::Reader::new(&self.inotify, &mut buffer);
                loop {
                    match reader.next() {
                        Ok(event) => events.push((
                            event.wd(),
                            event.events(),
                            event
                                .file_name()
                                .and_then(|n| n.to_str().ok())
                                .map(str::to_string),
                        )),
                        Err(Errno::AGAIN) => break,
                        Err(Errno::INTR) => continue,
                        Err(_) => {
                            lost = true;
                            break;
                        }
                    }
                }
            }
            for (wd, flags, name) in events {
                if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
                    lost = true;
                    continue;
                }
                let Some(dir) = self.by_wd.get(&wd).cloned() else {
                    continue;
                };
                if flags.intersects(
                    ReadFlags::IGNORED
                        | ReadFlags::DELETE_SELF
                        | ReadFlags::MOVE_SELF
                        | ReadFlags::UNMOUNT,
                ) {
                    self.forget(&dir);
                    continue;
                }
                // Names that are not UTF-8 are not compared (as when reading).
                let (Some(name), Some(folder)) = (name, self.dirs.get_mut(&dir)) else {
                    continue;
                };
                if flags.intersects(ReadFlags::CREATE | ReadFlags::MOVED_TO) {
                    folder.add(&name);
                } else if flags.intersects(ReadFlags::DELETE | ReadFlags::MOVED_FROM) {
                    folder.remove(&name);
                }
            }
            if lost {
                self.forget_all();
            }
        }
    }

    /// `super::beside` from the kept names of `dir`, if it is kept.
    pub fn beside(dir: &Path, component: &str) -> Option<(bool, Option<String>)> {
        let mut guard = folders();
        let folders = guard.as_mut()?;
        if folders.dirs.is_empty() {
            return None;
        }
        folders.drain();
        let (dev, ino) = {
            let folder = folders.dirs.get(dir)?;
            (folder.dev, folder.ino)
        };
        match std::fs::metadata(dir) {
            Ok(m) if m.dev() == dev && m.ino() == ino => {}
            _ => {
                folders.forget(dir);
                return None;
            }
        }
        let folder = folders.dirs.get(dir)?;
        let same = folder.names.get(&fold(component));
        let exact = same.is_some_and(|s| s.iter().any(|n| n == component));
        let other = same.and_then(|s| s.iter().find(|n| *n != component).cloned());
        Some((exact, other))
    }

    /// Keep `dir`'s names: watch it, then read it (so every change from the read on is
    /// queued).
    pub fn keep(dir: &Path) {
        let mut guard = folders();
        let Some(folders) = guard.as_mut() else {
            return;
        };
        if folders.dirs.contains_key(dir) || !local(dir) {
            return;
        }
        if folders.dirs.len() >= MAX_KEPT {
            folders.forget_all();
        }
        let flags = WatchFlags::CREATE
            | WatchFlags::DELETE
            | WatchFlags::MOVED_FROM
            | WatchFlags::MOVED_TO
            | WatchFlags::DELETE_SELF
            | WatchFlags::MOVE_SELF
            | WatchFlags::ONLYDIR
            | WatchFlags::DONT_FOLLOW;
        let Ok(wd) = inotify::add_watch(&folders.inotify, dir, flags) else {
            return;
        };
        // A watch on a folder kept under another path (a link) is the same watch.
        if let Some(other) = folders.by_wd.get(&wd).cloned() {
            folders.forget(&other);
            return;
        }
        let read = || -> std::io::Result<Folder> {
            let meta = std::fs::metadata(dir)?;
            let mut folder = Folder {
                wd,
                dev: meta.dev(),
                ino: meta.ino(),
                names: HashMap::new(),
            };
            for entry in std::fs::read_dir(dir)? {
                if let Some(name) = entry?.file_name().to_str() {
                    folder.add(name);
                }
            }
            Ok(folder)
        };
        match read() {
            Ok(folder) => {
                folders.by_wd.insert(wd, dir.to_path_buf());
                folders.dirs.insert(dir.to_path_buf(), folder);
            }
            Err(_) => {
                let _ = inotify::remove_watch(&folders.inotify, wd);
            }
        }
    }

    /// A local file system, where inotify sees every change (not NFS, SMB or FUSE,
    /// whose other clients' changes it never hears of).
    fn local(dir: &Path) -> bool {
        const LOCAL: [i64; 6] = [
            0xEF53,      // ext2/3/4
            0x5846_5342, // xfs
            0x9123_683E, // btrfs
            0x0102_1994, // tmpfs
            0xF2F5_2010, // f2fs
            0x2FC1_2FC1, // zfs
        ];
        // `f_type`'s width differs between targets.
        #[allow(clippy::unnecessary_cast)]
        let local = rustix::fs::statfs(dir).is_ok_and(|s| LOCAL.contains(&(s.f_type as i64)));
        local
    }

    /// Forget every kept folder, and the room their maps took.
    pub fn release() {
        if let Some(folders) = folders().as_mut() {
            folders.forget_all();
            folders.dirs.shrink_to_fit();
            folders.by_wd.shrink_to_fit();
        }
    }

    /// How many folders are kept (tests).
    #[cfg(test)]
    pub fn count() -> usize {
        folders().as_ref().map_or(0, |f| f.dirs.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folding() {
        for (a, b) in [
            ("Topic.md", "topic.md"),
            ("caf\u{e9}.md", "cafe\u{301}.md"),
            ("CAF\u{c9}.md", "cafe\u{301}.md"),
            ("\u{212a}elvin", "kelvin"),
        ] {
            assert!(same_when_folded(a, b), "{a} {b}");
        }
        for (a, b) in [
            ("a.md", "a.md"),
            ("a.md", "b.md"),
            ("cafe.md", "caf\u{e9}.md"),
        ] {
            assert!(!same_when_folded(a, b), "{a} {b}");
        }
    }

    #[test]
    fn conflicts_along_the_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        fs::create_dir_all(root.join("wiki/People")).expect("mkdir");
        fs::write(root.join("wiki/People/Ada.md"), "a").expect("write");
        fs::write(root.join("wiki/caf\u{e9}.md"), "c").expect("write");
        let conflict = |p: &str| conflicting_path(root, p).expect("read");
        assert_eq!(
            conflict("wiki/people/Ada.md").as_deref(),
            Some("wiki/People")
        );
        assert_eq!(
            conflict("wiki/People/ADA.md").as_deref(),
            Some("wiki/People/Ada.md")
        );
        assert_eq!(
            conflict("wiki/cafe\u{301}.md").as_deref(),
            Some("wiki/caf\u{e9}.md")
        );
        assert_eq!(conflict("wiki/People/Ada.md"), None);
        assert_eq!(conflict("wiki/People/Grace.md"), None);
        assert_eq!(conflict("wiki/new/deep/x.md"), None);
    }

    /// The answer without what `kept` keeps: the folder read now.
    fn read_now(root: &Path, relative: &str) -> Option<String> {
        let mut dir = root.to_path_buf();
        let mut prefix = String::new();
        for component in relative.split('/') {
            let ((exact, other), _) = read_beside(&dir, component).ok()?;
            if let Some(other) = other {
                return Some(format!("{prefix}{other}"));
            }
            if !exact {
                return None;
            }
            prefix.push_str(component);
            prefix.push('/');
            dir.push(component);
        }
        None
    }

    /// A kept big folder answers as reading it would, after every kind of change made
    /// beside the daemon: files created, removed and renamed (in, out and within), the
    /// folder itself replaced by another at its path.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_kept_folder_answers_as_reading_it_would() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        let big = root.join("wiki/big");
        fs::create_dir_all(&big).expect("mkdir");
        fs::create_dir_all(root.join("elsewhere")).expect("mkdir");
        for i in 0..kept::KEEP_FROM + 10 {
            fs::write(big.join(format!("page-{i}.md")), "x").expect("write");
        }
        let before = kept::count();
        assert_eq!(
            conflicting_path(root, "wiki/big/new.md").expect("check"),
            None
        );
        assert_eq!(
            kept::count(),
            before + 3,
            "the big folder is kept, and the two above it"
        );
        // A small folder is kept only above a page.
        fs::create_dir_all(root.join("wiki/small")).expect("mkdir");
        conflicting_path(root, "wiki/small/x.md").expect("check");
        assert_eq!(
            kept::count(),
            before + 3,
            "a small folder of pages is not kept"
        );
        let names = [
            "Ada.md",
            "ada.md",
            "caf\u{e9}.md",
            "cafe\u{301}.md",
            "B.md",
            "b.md",
        ];
        let mut rng = crate::testing::Xorshift(0x2545_f491_4f6c_dd1d);
        let mut below = |n: usize| rng.below(n);
        for round in 0..400 {
            let name = names[below(names.len())];
            let other = names[below(names.len())];
            match below(7) {
                0 | 1 => fs::write(big.join(name), "x").expect("create"),
                2 => {
                    let _ = fs::remove_file(big.join(name));
                }
                3 => {
                    let _ = fs::rename(big.join(name), big.join(other));
                }
                4 => {
                    let _ = fs::rename(big.join(name), root.join("elsewhere").join(name));
                    let _ = fs::rename(root.join("elsewhere").join(other), big.join(other));
                }
                // Folders beside the kept ones above: `wiki/BIG`, `Wiki`.
                5 => {
                    if fs::create_dir(root.join("wiki/BIG")).is_err() {
                        let _ = fs::remove_dir(root.join("wiki/BIG"));
                    }
                }
                _ => {
                    if fs::create_dir(root.join("Wiki")).is_err() {
                        let _ = fs::rename(root.join("Wiki"), root.join("elsewhere/Wiki"));
                        let _ = fs::remove_dir(root.join("elsewhere/Wiki"));
                    }
                }
            }
            for asked in names {
                for folder in ["wiki/big", "wiki/Big", "WIKI/big"] {
                    let path = format!("{folder}/{asked}");
                    let kept = conflicting_path(root, &path).expect("check");
                    let now = read_now(root, &path);
                    assert_eq!(kept.is_some(), now.is_some(), "round {round}: {path}");
                    // Of several siblings that fold the same, either may be named.
                    if let Some(found) = kept {
                        let depth = found.split('/').count();
                        let asked: Vec<&str> = path.split('/').take(depth).collect();
                        assert!(root.join(&found).exists(), "round {round}: {found}");
                        assert_eq!(fold(&found), fold(&asked.join("/")), "round {round}");
                        assert_ne!(found, asked.join("/"), "round {round}");
                    }
                }
            }
        }
        let _ = fs::remove_dir(root.join("wiki/BIG"));
        let _ = fs::remove_dir(root.join("Wiki"));
        // The folder replaced by another at its path.
        fs::rename(&big, root.join("wiki/old")).expect("move away");
        fs::create_dir_all(&big).expect("mkdir");
        fs::write(big.join("Grace.md"), "x").expect("write");
        assert_eq!(
            conflicting_path(root, "wiki/big/grace.md")
                .expect("check")
                .as_deref(),
            Some("wiki/big/Grace.md")
        );
        assert_eq!(
            conflicting_path(root, "wiki/big/ada.md").expect("check"),
            None
        );
        // Let go when the daemon goes quiet: read again, the same answers.
        release_cached();
        assert_eq!(kept::count(), 0, "nothing kept");
        assert_eq!(
            conflicting_path(root, "wiki/big/grace.md")
                .expect("check")
                .as_deref(),
            Some("wiki/big/Grace.md")
        );
    }
}
