//! git's index (`.git/index`) rewritten by the daemon itself (issue 15): the entries of
//! the paths a git session committed are replaced, every other byte is copied as it was.
//!
//! libgit2 parses the whole index into memory, verifies its SHA-1 trailer with its
//! collision-detecting SHA-1 and computes it again when it writes: at 10k pages (an
//! 880 KB index) that was about half of a write's CPU time. Here the file is read in
//! one call, its entries are located without being decoded, the changed entries are
//! spliced in, and the trailer is computed with the `sha1` crate (SHA-NI when the CPU
//! has it), or left null as git's `index.skipHash` leaves it (`skips_hash`: what the
//! repository's config says, and when it says nothing, for an index of 1 MiB or more,
//! about 10k pages: at 100k pages the SHA-1 was a quarter of a write's CPU time). The
//! trailer of an index the daemon wrote itself is not verified again while
//! the file at `.git/index` is still that file (same inode, size, times and trailer);
//! any other index (a person's `git add`, `git commit`, `git status`) is verified, as
//! git does. Between sessions the daemon keeps that identity and, until it goes quiet
//! (`release_cached`), the bytes it wrote: a session whose `.git/index` is still that
//! file (identity and the trailer read back from the disk) uses them instead of reading
//! and checking the file again (at 100k pages a 10 MB index: reading and parsing it was
//! a sixth of a write's CPU time). Any other index is read as it is on disk, so what a
//! person staged is always seen.
//!
//! A rewrite is written into the file `.git/index` was two rewrites back (`Spare`),
//! and only where the new index differs from it: the daemon knows where each rewrite
//! changed the one before (`Dirty`). A page changed in place (an append, an edit)
//! changes one entry, so at 100k pages a few hundred bytes are written and flushed
//! instead of 10 MB; a page created or removed moves the entries after it, which are
//! written from there on. Anything the daemon cannot vouch for (the spare is another
//! file, or its bytes were not kept) is written whole.
//!
//! Handled: index versions 2 and 3, the cache tree (`TREE`: the directories of the
//! changed paths are invalidated, as git and libgit2 do) and resolve-undo (`REUC`,
//! kept). Other optional extensions are dropped, as libgit2 drops them (untracked
//! cache, fsmonitor, end-of-index offsets: git rebuilds them). Anything else (no index,
//! version 4, a split or sparse index, a trailer that does not match) is left to
//! libgit2: `Outcome::Unsupported`.

use std::collections::BTreeMap;
use std::fs::{self, File, Metadata, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use git2::Oid;
use sha1::{Digest, Sha1};

/// The index entry a committed path gets.
pub struct Update<'a> {
    /// Repository-relative, `/`-separated.
    pub path: &'a str,
    /// The blob the entry names; None removes the path's entries (every stage).
    pub blob: Option<Oid>,
    /// Stat data of the file the daemon wrote (zeros without: git then re-checks the
    /// file's content once).
    pub stat: Option<&'a Metadata>,
}

/// What `write_next` did.
pub enum Outcome {
    /// The new index is complete in the next file; rename it over `.git/index`, then
    /// call `Written::installed`.
    Written(Written),
    /// Left to libgit2, for this reason.
    Unsupported(&'static str),
}

/// A new index written next to `.git/index`.
pub struct Written {
    file: File,
    current: PathBuf,
    bytes: Arc<Vec<u8>>,
    table: Arc<Table>,
    /// Where `bytes` differ from the index they were made from, when that was the one
    /// the daemon kept (its bytes in memory): for the rewrite after next.
    dirty: Option<Dirty>,
    /// Bytes written to the file.
    #[cfg_attr(not(test), allow(dead_code))]
    wrote: usize,
}

impl Written {
    /// The new index was renamed over `current`: remember it as the daemon's own, so
    /// the next session does not verify its trailer again.
    pub fn installed(self) {
        // fstat of the moved file itself: a rename changes its ctime.
        if let Ok(metadata) = self.file.metadata() {
            let identity = Identity::of(&metadata, trailer_of(&self.bytes));
            let mut known = known();
            // The buffers of the index this one replaced, for the next rewrite.
            let spare = known.remove(&self.current).and_then(Known::into_spare);
            known.insert(
                self.current,
                Known {
                    identity,
                    bytes: Some(self.bytes),
                    table: Some(self.table),
                    spare,
                    dirty: self.dirty,
                },
            );
        }
    }
}

const HASH: usize = 20;
const HEADER: usize = 12;
/// ctime, mtime (8 bytes each), dev, ino, mode, uid, gid, size (4 each), id, flags.
const FIXED: usize = 16 + 24 + HASH + 2;
const EXTENDED: u16 = 0x4000;
const NAME_MASK: u16 = 0x0fff;

/// The file at `.git/index`, as the daemon last wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Identity {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    trailer: [u8; HASH],
}

impl Identity {
    /// Who the file is and when it was last written (not its ctime: a link or a
    /// rename changes that, not what it holds).
    fn file(&self) -> FileId {
        FileId {
            dev: self.dev,
            ino: self.ino,
            size: self.size,
            mtime: self.mtime,
        }
    }

    fn of(metadata: &Metadata, trailer: [u8; HASH]) -> Identity {
        Identity {
            dev: metadata.dev(),
            ino: metadata.ino(),
            size: metadata.size(),
            mtime: (metadata.mtime(), metadata.mtime_nsec()),
            ctime: (metadata.ctime(), metadata.ctime_nsec()),
            trailer,
        }
    }
}

/// A file's identity and when its content last changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileId {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
}

impl FileId {
    fn of(metadata: &Metadata) -> FileId {
        FileId {
            dev: metadata.dev(),
            ino: metadata.ino(),
            size: metadata.size(),
            mtime: (metadata.mtime(), metadata.mtime_nsec()),
        }
    }
}

/// An index the daemon wrote, and its bytes while they are kept.
struct Known {
    identity: Identity,
    bytes: Option<Arc<Vec<u8>>>,
    /// Where the parts of those bytes are (kept and let go with them).
    table: Option<Arc<Table>>,
    /// The buffers of the index before it, for the next rewrite to fill.
    spare: Option<Spare>,
    /// Where `bytes` differ from what the spare holds (when it holds the index these
    /// bytes were made from).
    dirty: Option<Dirty>,
}

/// Buffers a rewrite fills: allocated afresh, the 10 MB of a 100k-page index and its
/// 1.6 MB table cost a page fault per 4 KiB each time (a tenth of a write's CPU time
/// at 100k pages), as malloc handed them back to the system when they were freed.
///
/// They hold the index two rewrites back, and its spans (`file`: the file it was
/// written to): the rewrite after next writes only where its index differs from that
/// one, in memory and, when the file is still that one, in the file. At 100k pages
/// rewriting the 10 MB and flushing them was a third of a write's CPU time and most of
/// the rest of its time; a page appended to changes one entry.
#[derive(Debug, Default)]
struct Spare {
    bytes: Vec<u8>,
    entries: Vec<Span>,
    /// The file the bytes were written to, when they are an index the daemon wrote
    /// (None: what they hold means nothing).
    file: Option<FileId>,
}

/// Where an index differs from the one it was made from, at the same offsets.
#[derive(Debug, Clone, Default)]
struct Dirty {
    /// Byte ranges, in order, not touching.
    ranges: Vec<(usize, usize)>,
    /// The leading entries whose spans are the same in both.
    same_entries: usize,
}

impl Known {
    /// This index's buffers once nothing else holds them (else the spare it kept,
    /// emptied).
    fn into_spare(self) -> Option<Spare> {
        let bytes = self.bytes.and_then(|bytes| Arc::try_unwrap(bytes).ok());
        let entries = self
            .table
            .and_then(|table| Arc::try_unwrap(table).ok())
            .map(|table| table.entries);
        match (bytes, entries) {
            (Some(bytes), Some(entries)) => Some(Spare {
                bytes,
                entries,
                file: Some(self.identity.file()),
            }),
            _ => self.spare.map(|spare| Spare {
                file: None,
                ..spare
            }),
        }
    }
}

static KNOWN: Mutex<BTreeMap<PathBuf, Known>> = Mutex::new(BTreeMap::new());

fn known() -> std::sync::MutexGuard<'static, BTreeMap<PathBuf, Known>> {
    KNOWN.lock().unwrap_or_else(|p| p.into_inner())
}

/// Let go of the bytes of the indexes the daemon wrote (the daemon has gone quiet):
/// the next session reads its index from the disk again.
pub fn release_cached() {
    for known in known().values_mut() {
        known.bytes = None;
        known.table = None;
        known.spare = None;
        known.dirty = None;
    }
}

/// Read `current` (`.git/index`), apply `updates` and write the result to `next`
/// (replaced if it exists). The caller holds `.git/index.lock`.
/// `skip_hash`: the new index gets a null trailer (git's `index.skipHash`; see
/// `skips_hash`) instead of its SHA-1.
pub fn write_next(
    current: &Path,
    next: &Path,
    updates: &[Update<'_>],
    skip_hash: bool,
) -> std::io::Result<Outcome> {
    write_next_reusing(current, next, None, updates, skip_hash)
}

/// `write_next`, writing into the file at `spare` (an index this daemon replaced
/// earlier, see `Session::finish`) when no one else has it open: it is renamed to
/// `next` and overwritten. At 100k pages, writing a new 10 MB file cost 2.0 ms against
/// 0.7 ms for overwriting one whose pages and blocks are already there (and freeing
/// the old one as much again).
pub fn write_next_reusing(
    current: &Path,
    next: &Path,
    spare_file: Option<&Path>,
    updates: &[Update<'_>],
    skip_hash: bool,
) -> std::io::Result<Outcome> {
    let Loaded {
        bytes,
        metadata,
        ours,
        table,
    } = match load(current) {
        Ok(loaded) => loaded,
        Err(e) if e.kind() == ErrorKind::NotFound => {
            return Ok(Outcome::Unsupported("there is no index"));
        }
        Err(e) => return Err(e),
    };
    let mtime = metadata.mtime();
    // The bytes the daemon kept: what its spare and `dirty` are relative to.
    let kept = table.is_some();
    let table = match table {
        // Every entry left out of its candidates is older than `since`: only if the
        // index is not older than that (a clock set back) are they not racy now.
        Some(table) if table.since <= mtime => table,
        // The daemon's own index is in order: it wrote it so.
        _ => match parse(&bytes, !ours, Some(mtime)) {
            Ok(table) => Arc::new(table),
            Err(why) => return Ok(Outcome::Unsupported(why)),
        },
    };
    let trailer = trailer_of(&bytes);
    // A null trailer is git's `index.skipHash`: nothing to verify.
    if !ours && trailer != [0; HASH] && sha1(&bytes[..bytes.len() - HASH]) != trailer {
        return Ok(Outcome::Unsupported("the index's checksum does not match"));
    }
    let racy: Vec<usize> = table
        .candidates
        .iter()
        .map(|&i| i as usize)
        .filter(|&i| maybe_racy(table.entries[i].entry(&bytes), mtime))
        .collect();
    // The working tree, for the racily clean entries (`smudged`).
    let workdir = current.parent().and_then(Path::parent);
    let (spare, prior) = known()
        .get_mut(current)
        .map(|known| (known.spare.take(), known.dirty.take()))
        .unwrap_or_default();
    let spare = spare.unwrap_or_default();
    // The spare holds the index before the one kept, and `prior` says where they differ.
    let prior = prior.filter(|_| kept && spare.file.is_some());
    let spare_file_id = spare.file.filter(|_| prior.is_some());
    let recheck = Recheck {
        racy: &racy,
        mtime,
        workdir,
    };
    let built = build(
        &bytes,
        &table,
        &recheck,
        updates,
        skip_hash,
        spare,
        prior.as_ref(),
    );
    let (built, table, dirty) = match built {
        Ok(built) => built,
        Err(why) => return Ok(Outcome::Unsupported(why)),
    };
    let mut wrote = built.len();
    let file = match spare_file.and_then(|spare| reuse(spare, next)) {
        Some(file) => {
            // Still the file the spare's bytes were written to: only what differs.
            let same_file = file
                .metadata()
                .is_ok_and(|m| spare_file_id == Some(FileId::of(&m)));
            let ranges = match (&prior, same_file) {
                (Some(prior), true) => merged(&prior.ranges, &dirty.ranges),
                _ => vec![(0, built.len())],
            };
            wrote = ranges
                .iter()
                .map(|&(from, to)| to.min(built.len()).saturating_sub(from))
                .sum();
            let written = write_ranges(&file, &built, &ranges)
                .and_then(|()| file.set_len(built.len() as u64));
            // Released before the file is named `.git/index`: a lease there would
            // make every `git status` wait for it.
            unlease(&file);
            written?;
            file
        }
        None => {
            match fs::remove_file(next) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            let mut file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o666)
                .open(next)?;
            file.write_all(&built)?;
            file
        }
    };
    Ok(Outcome::Written(Written {
        file,
        current: current.to_path_buf(),
        bytes: Arc::new(built),
        table: Arc::new(table),
        dirty: kept.then_some(dirty),
        wrote,
    }))
}

/// Write `bytes[from..to]` at `from` for each range (cut to `bytes`).
fn write_ranges(file: &File, bytes: &[u8], ranges: &[(usize, usize)]) -> std::io::Result<()> {
    for &(from, to) in ranges {
        let to = to.min(bytes.len());
        if from < to {
            file.write_all_at(&bytes[from..to], from as u64)?;
        }
    }
    Ok(())
}

/// The union of two lists of ranges (each in order), in order, touching ones joined.
fn merged(a: &[(usize, usize)], b: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let mut all: Vec<(usize, usize)> = a.iter().chain(b).copied().collect();
    all.sort_unstable();
    let mut out: Vec<(usize, usize)> = Vec::with_capacity(all.len());
    for (from, to) in all {
        match out.last_mut() {
            Some(last) if from <= last.1 => last.1 = last.1.max(to),
            _ => out.push((from, to)),
        }
    }
    out
}

/// Whether `write_next_reusing` can write into a spare (write leases: Linux only).
pub const REUSES_SPARE: bool = cfg!(target_os = "linux");

/// The file at `spare`, renamed to `next` and open for writing, when it has no other
/// name and no process (this one included) has it open or mapped: a `git status` that
/// opened it while it was `.git/index` may still be reading it, and must not see it
/// change. A write
/// lease (`F_SETLEASE`) is granted only then, and makes anyone opening it meanwhile
/// wait until `unlease`. None (and `spare` left for the caller to free) otherwise, or
/// where leases do not exist.
#[cfg(target_os = "linux")]
fn reuse(spare: &Path, next: &Path) -> Option<File> {
    use std::os::fd::AsRawFd;
    // A lease broken by someone opening the file signals its holder with SIGIO, whose
    // default action ends the process: ignored (nothing here uses it), as the lease
    // is let go within milliseconds anyway.
    static IGNORE_SIGIO: std::sync::Once = std::sync::Once::new();
    IGNORE_SIGIO.call_once(|| {
        // SAFETY: setting a signal's disposition to SIG_IGN has no preconditions.
        #[allow(unsafe_code)]
        unsafe {
            libc::signal(libc::SIGIO, libc::SIG_IGN)
        };
    });
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(spare)
        .ok()?;
    // Another name for the same file (a backup made with hard links, `cp -al`, holds
    // what was `.git/index` under its own name) would see it change: never written into.
    let metadata = file.metadata().ok()?;
    if !metadata.is_file() || metadata.nlink() != 1 {
        return None;
    }
    // SAFETY: fcntl on a descriptor this function owns.
    #[allow(unsafe_code)]
    let leased = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLEASE, libc::F_WRLCK) };
    if leased != 0 {
        return None;
    }
    if fs::rename(spare, next).is_err() {
        unlease(&file);
        return None;
    }
    Some(file)
}

#[cfg(not(target_os = "linux"))]
fn reuse(_spare: &Path, _next: &Path) -> Option<File> {
    None
}

#[cfg(target_os = "linux")]
fn unlease(file: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: fcntl on a descriptor the caller owns.
    #[allow(unsafe_code)]
    unsafe {
        libc::fcntl(file.as_raw_fd(), libc::F_SETLEASE, libc::F_UNLCK)
    };
}

#[cfg(not(target_os = "linux"))]
fn unlease(_file: &File) {}

/// An index read for a rewrite.
struct Loaded {
    bytes: Arc<Vec<u8>>,
    metadata: Metadata,
    /// The file the daemon last wrote there.
    ours: bool,
    /// Where its parts are, when the daemon kept that (its own index, bytes from memory).
    table: Option<Arc<Table>>,
}

/// The bytes of the index at `path`, its metadata, and whether it is the file the
/// daemon last wrote there (same identity, and the trailer on disk is the one it
/// wrote): then its bytes come from memory when they are still kept.
fn load(path: &Path) -> std::io::Result<Loaded> {
    let mut file = File::open(path)?;
    let metadata = file.metadata()?;
    let known = known()
        .get(path)
        .map(|known| (known.identity, known.bytes.clone(), known.table.clone()));
    if let Some((identity, Some(bytes), table)) = &known
        && metadata.size() == bytes.len() as u64
        && bytes.len() >= HASH
    {
        let mut trailer = [0; HASH];
        file.read_exact_at(&mut trailer, metadata.size() - HASH as u64)?;
        if *identity == Identity::of(&metadata, trailer) && trailer == trailer_of(bytes) {
            return Ok(Loaded {
                bytes: Arc::clone(bytes),
                metadata,
                ours: true,
                table: table.clone(),
            });
        }
    }
    let mut bytes = Vec::with_capacity(metadata.len() as usize + 1);
    file.read_to_end(&mut bytes)?;
    let ours = known
        .is_some_and(|(identity, _, _)| identity == Identity::of(&metadata, trailer_of(&bytes)));
    Ok(Loaded {
        bytes: Arc::new(bytes),
        metadata,
        ours,
        table: None,
    })
}

/// An index from this size on gets a null trailer unless the repository's git
/// configuration says otherwise: at 100k pages (a 10 MB index) its SHA-1 was a quarter
/// of a write's CPU time.
pub const SKIP_HASH_FROM: u64 = 1 << 20;

/// Whether the daemon writes the index of `config`'s repository, now `index_size`
/// bytes, with a null trailer, as git does with `index.skipHash` (git reads such an
/// index since 2.13, libgit2 since 1.8): what `index.skipHash` says when it is set,
/// true under `feature.manyFiles` (as in git), and otherwise true for an index of
/// `SKIP_HASH_FROM` bytes or more. `index.skipHash = false` keeps the hash at any size
/// (for a tool that cannot read a null trailer).
pub fn skips_hash(config: Option<&git2::Config>, index_size: u64) -> bool {
    let setting = |name: &str| config.and_then(|c| c.get_bool(name).ok());
    match setting("index.skipHash") {
        Some(value) => value,
        None => setting("feature.manyFiles") == Some(true) || index_size >= SKIP_HASH_FROM,
    }
}

fn sha1(bytes: &[u8]) -> [u8; HASH] {
    Sha1::digest(bytes).into()
}

fn trailer_of(bytes: &[u8]) -> [u8; HASH] {
    let mut trailer = [0; HASH];
    if bytes.len() >= HASH {
        trailer.copy_from_slice(&bytes[bytes.len() - HASH..]);
    }
    trailer
}

/// Where one entry lies in the index's bytes: the entry, and its path within it.
#[derive(Debug, Clone, Copy)]
struct Span {
    start: u32,
    end: u32,
    path_start: u32,
    path_end: u32,
}

impl Span {
    /// The same entry copied `by` bytes further (or back).
    fn moved(self, by: i64) -> Span {
        let at = |offset: u32| (i64::from(offset) + by) as u32;
        Span {
            start: at(self.start),
            end: at(self.end),
            path_start: at(self.path_start),
            path_end: at(self.path_end),
        }
    }

    fn entry(self, bytes: &[u8]) -> &[u8] {
        &bytes[self.start as usize..self.end as usize]
    }

    fn path(self, bytes: &[u8]) -> &[u8] {
        &bytes[self.path_start as usize..self.path_end as usize]
    }
}

/// Where the parts of an index are, by offset. Kept with the bytes of the index the
/// daemon wrote (`Known`), so the next session neither walks nor checks its 100k entries
/// again (at 100k pages that walk was a tenth of a write's CPU time).
#[derive(Debug)]
struct Table {
    version: u32,
    /// Each entry, in the index's order (path, then stage).
    entries: Vec<Span>,
    /// The cache tree's data (`TREE`, without its header).
    tree: Option<(usize, usize)>,
    /// Extensions kept as they are (header included).
    kept: Vec<(usize, usize)>,
    /// The entries that may be racily clean, in order: every entry whose file's mtime
    /// is older than `since` (seconds) is left out. Filtered with `maybe_racy` against
    /// the index file's mtime when used.
    candidates: Vec<u32>,
    since: i64,
}

/// The largest index handled (offsets are kept as u32).
const MAX_INDEX: usize = u32::MAX as usize;

fn be32(bytes: &[u8], at: usize) -> Option<u32> {
    let four = bytes.get(at..at + 4)?;
    Some(u32::from_be_bytes([four[0], four[1], four[2], four[3]]))
}

/// Where the parts of the index `bytes` are; `check_order`: that its entries are in
/// git's order (an index the daemon did not write); `racy_from`: the index file's
/// mtime, for `Table::candidates` (None: no candidates).
fn parse(bytes: &[u8], check_order: bool, racy_from: Option<i64>) -> Result<Table, &'static str> {
    const BAD: &str = "the index is malformed";
    if bytes.len() < HEADER + HASH || &bytes[..4] != b"DIRC" {
        return Err(BAD);
    }
    if bytes.len() > MAX_INDEX {
        return Err("an index of 4 GiB or more");
    }
    let version = be32(bytes, 4).ok_or(BAD)?;
    if version == 4 {
        return Err("index version 4 (compressed paths)");
    }
    if version != 2 && version != 3 {
        return Err("an index version other than 2, 3 or 4");
    }
    let count = be32(bytes, 8).ok_or(BAD)? as usize;
    let body = bytes.len() - HASH;
    let mut entries = Vec::with_capacity(count.min(body / (FIXED + 2)));
    let mut candidates = Vec::new();
    let mut at = HEADER;
    for _ in 0..count {
        let flags_at = at + FIXED - 2;
        let flags = bytes
            .get(flags_at..flags_at + 2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]))
            .ok_or(BAD)?;
        let extended = flags & EXTENDED != 0;
        if extended && version < 3 {
            return Err(BAD);
        }
        let start = at + FIXED + if extended { 2 } else { 0 };
        let rest = bytes.get(start..body).ok_or(BAD)?;
        let length = match flags & NAME_MASK {
            NAME_MASK => rest.iter().position(|&b| b == 0).ok_or(BAD)?,
            length => usize::from(length),
        };
        if rest.get(length) != Some(&0) {
            return Err(BAD);
        }
        let end = at + ((start - at + length + 8) & !7);
        if end > body {
            return Err(BAD);
        }
        if racy_from.is_some_and(|mtime| maybe_racy(&bytes[at..end], mtime)) {
            candidates.push(entries.len() as u32);
        }
        entries.push(Span {
            start: at as u32,
            end: end as u32,
            path_start: start as u32,
            path_end: (start + length) as u32,
        });
        at = end;
    }
    if check_order
        && entries
            .windows(2)
            .any(|pair| pair[0].path(bytes) > pair[1].path(bytes))
    {
        return Err("the index's entries are out of order");
    }
    let mut tree = None;
    let mut kept = Vec::new();
    while at < body {
        let size = be32(bytes, at + 4).ok_or(BAD)? as usize;
        let end = (at + 8)
            .checked_add(size)
            .filter(|&e| e <= body)
            .ok_or(BAD)?;
        match &bytes[at..at + 4] {
            b"TREE" => tree = Some((at + 8, end)),
            b"REUC" => kept.push((at, end)),
            signature if signature[0].is_ascii_uppercase() => {}
            _ => return Err("a required index extension (split or sparse index)"),
        }
        at = end;
    }
    Ok(Table {
        version,
        entries,
        tree,
        kept,
        candidates,
        since: racy_from.unwrap_or(i64::MAX),
    })
}
/// An entry copied from an index whose file was modified at `index_mtime` (seconds),
/// smudged as git smudges it when it writes an index: an entry whose file changed in
/// that same second without changing size may look unchanged by its stat data (git
/// compares whole seconds), and only the old index's own mtime (at least the entry's)
/// told git to look at its content. The new index has a later mtime, so such an entry
/// whose file's content differs gets size 0: git then reads the content again. Without
/// this, `git status` showed clean a page a person had changed, and `git commit -a`,
/// `git stash` and a checkout overlooked their change.
///
/// The content is read only when the stat data differs below the second: a file whose
/// ctime and mtime (to the nanosecond), inode and size are still those the entry
/// records has not been written since they were taken (a write sets the ctime, which
/// no one can set back; since Linux 6.13 a write after a stat that read the ctime gets
/// a later one even within a clock tick, and the daemon stats what it wrote). Reading
/// and hashing every page written in the current second again at each rewrite cost a
/// burst of writes time in proportion to its length: 7 % of the daemon's CPU time per
/// write at 10k pages, about 190 writes a second.
fn smudged<'e>(
    entry: &'e [u8],
    path: &[u8],
    workdir: &Path,
    index_mtime: i64,
) -> std::borrow::Cow<'e, [u8]> {
    use std::borrow::Cow;
    let field = |at: usize| be32(entry, at).map(i64::from);
    let (Some(mtime), Some(size)) = (field(8), field(36)) else {
        return Cow::Borrowed(entry);
    };
    if !maybe_racy(entry, index_mtime) {
        return Cow::Borrowed(entry);
    }
    let Some(relative) = std::str::from_utf8(path).ok() else {
        return Cow::Borrowed(entry);
    };
    let file = workdir.join(relative);
    let Ok(metadata) = fs::symlink_metadata(&file) else {
        return Cow::Borrowed(entry);
    };
    // A stat that differs tells git by itself.
    if !metadata.is_file() || metadata.size() as i64 != size || metadata.mtime() != mtime {
        return Cow::Borrowed(entry);
    }
    if unchanged_since_stat(entry, &metadata) {
        return Cow::Borrowed(entry);
    }
    let same = fs::read(&file)
        .ok()
        .and_then(|content| Oid::hash_object(git2::ObjectType::Blob, &content).ok())
        .is_some_and(|id| entry.get(40..60) == Some(id.as_bytes()));
    if same {
        return Cow::Borrowed(entry);
    }
    let mut copy = entry.to_vec();
    copy[36..40].copy_from_slice(&[0; 4]);
    Cow::Owned(copy)
}

/// Whether the entry's stat data is the file's to the nanosecond: ctime and mtime
/// (seconds and nanoseconds), inode and size, as git truncates them to 32 bits. An
/// entry without nanoseconds (a git built without them writes zeros) never matches a
/// file that has them, and is checked by content.
fn unchanged_since_stat(entry: &[u8], metadata: &Metadata) -> bool {
    let recorded = |at: usize| be32(entry, at);
    [
        (0, metadata.ctime() as u32),
        (4, metadata.ctime_nsec() as u32),
        (8, metadata.mtime() as u32),
        (12, metadata.mtime_nsec() as u32),
        (20, metadata.ino() as u32),
        (36, metadata.size() as u32),
    ]
    .iter()
    .all(|&(at, value)| recorded(at) == Some(value))
}

/// Whether `entry` could be racily clean in an index modified at `index_mtime`: its
/// file's mtime is not older than the index and its size is known (`smudged` then
/// looks at the file).
fn maybe_racy(entry: &[u8], index_mtime: i64) -> bool {
    match (be32(entry, 8), be32(entry, 36)) {
        (Some(mtime), Some(size)) => i64::from(mtime) >= index_mtime && size != 0,
        _ => false,
    }
}

/// The new index's bytes, trailer included, and where its parts are. `racy`: the
/// entries that may be racily clean against `mtime`, the old index file's mtime (in
/// order); `workdir`: the working tree, for `smudged`; `skip_hash`: a null trailer.
///
/// Only the entries around an update and the racy ones are looked at one by one: the
/// others are copied in runs, and their places in the new index are their old ones
/// moved by what was inserted or removed before them.
/// The entries of a rewrite that may be racily clean, and what checking them needs.
struct Recheck<'a> {
    racy: &'a [usize],
    /// The index file's mtime (seconds).
    mtime: i64,
    /// The working tree.
    workdir: Option<&'a Path>,
}

fn build(
    bytes: &[u8],
    index: &Table,
    recheck: &Recheck<'_>,
    updates: &[Update<'_>],
    skip_hash: bool,
    spare: Spare,
    prior: Option<&Dirty>,
) -> Result<(Vec<u8>, Table, Dirty), &'static str> {
    let Recheck {
        racy,
        mtime,
        workdir,
    } = *recheck;
    let mut updates: Vec<&Update<'_>> = updates.iter().collect();
    updates.sort_by(|a, b| a.path.as_bytes().cmp(b.path.as_bytes()));
    updates.dedup_by(|later, earlier| {
        // Keep the last update of a path.
        if later.path == earlier.path {
            std::mem::swap(later, earlier);
            true
        } else {
            false
        }
    });
    let entries = &index.entries;
    let path_of = |i: usize| entries[i].path(bytes);
    let first_at_or_after = |path: &[u8]| entries.partition_point(|s| s.path(bytes) < path);
    let mut removed: Vec<usize> = Vec::new();
    let mut inserted: Vec<(usize, Vec<u8>)> = Vec::new();
    let mut invalid: Vec<&[u8]> = Vec::new();
    for update in &updates {
        let path = update.path.as_bytes();
        if path.is_empty() || path.len() > 0x7fff_ffff {
            return Err("an empty or oversized path");
        }
        invalid.push(path);
        let from = first_at_or_after(path);
        let to = entries.partition_point(|s| s.path(bytes) <= path);
        removed.extend(from..to);
        let Some(id) = update.blob else {
            continue;
        };
        // A file replaces a file of the same name at any of its directories, and
        // everything under a directory of its own name (as `git add` does).
        for (i, _) in path.iter().enumerate().filter(|(_, b)| **b == b'/') {
            let dir = &path[..i];
            let at = first_at_or_after(dir);
            removed.extend((at..entries.len()).take_while(|&j| path_of(j) == dir));
        }
        let mut below = path.to_vec();
        below.push(b'/');
        let at = first_at_or_after(&below);
        for j in (at..entries.len()).take_while(|&j| path_of(j).starts_with(&below)) {
            removed.push(j);
            invalid.push(path_of(j));
        }
        let mut entry = Vec::with_capacity(FIXED + path.len() + 8);
        encode_entry(&mut entry, path, id, update.stat);
        inserted.push((from, entry));
    }
    removed.sort_unstable();
    removed.dedup();
    // Where something other than a copy happens, in order.
    let mut stops: Vec<usize> = removed.clone();
    stops.extend_from_slice(racy);
    stops.extend(inserted.iter().map(|(at, _)| *at));
    stops.sort_unstable();
    stops.dedup();

    let inserted_bytes: usize = inserted.iter().map(|(_, e)| e.len()).sum();
    let Spare {
        bytes: mut buffer,
        entries: mut spans,
        ..
    } = spare;
    // The leading entries whose spans (and bytes) are those of the index in the spare
    // buffers (two rewrites back): neither this rewrite nor the one before touched them.
    let first_stop = stops.first().copied().unwrap_or(entries.len());
    let same = match prior {
        Some(prior) => prior.same_entries.min(first_stop).min(spans.len()),
        None => {
            buffer.clear();
            0
        }
    };
    spans.truncate(same);
    spans.reserve((entries.len() + inserted.len()).saturating_sub(same));
    buffer.reserve((bytes.len() + inserted_bytes + HASH).saturating_sub(buffer.len()));
    let mut out = Out::new(buffer, bytes, prior.map_or(&[][..], |p| &p.ranges[..]));
    // The header with the old count (set at the end).
    out.copy(0, HEADER.min(bytes.len()));
    let mut table = Table {
        version: index.version,
        entries: spans,
        tree: None,
        kept: Vec::new(),
        candidates: Vec::new(),
        since: mtime,
    };
    let entry_start = |i: usize| {
        entries.get(i).map_or_else(
            || entries.last().map_or(HEADER, |s| s.end as usize),
            |s| s.start as usize,
        )
    };
    out.copy(HEADER, entry_start(same));
    // Entries `from..to` copied as they are, in one run.
    let copy = |from: usize, to: usize, out: &mut Out<'_>, table: &mut Table| {
        if from < to {
            let (start, end) = (entries[from].start as usize, entries[to - 1].end as usize);
            let by = out.at as i64 - start as i64;
            out.copy(start, end);
            table
                .entries
                .extend(entries[from..to].iter().map(|s| s.moved(by)));
        }
    };
    // One entry's bytes appended, `path_at` bytes into it; a racy candidate if `racy`.
    let push = |entry: &[u8],
                path_at: usize,
                path_len: usize,
                racy: bool,
                out: &mut Out<'_>,
                table: &mut Table| {
        let start = out.at;
        if racy {
            table.candidates.push(table.entries.len() as u32);
        }
        table.entries.push(Span {
            start: start as u32,
            end: (start + entry.len()) as u32,
            path_start: (start + path_at) as u32,
            path_end: (start + path_at + path_len) as u32,
        });
        out.put(entry);
    };
    let mut next_insert = inserted.iter().peekable();
    let mut next_removed = removed.iter().copied().peekable();
    let mut next_racy = racy.iter().copied().peekable();
    let mut cursor = same;
    for &stop in &stops {
        copy(cursor, stop.min(entries.len()), &mut out, &mut table);
        cursor = stop;
        while let Some((_, new)) = next_insert.next_if(|(at, _)| *at == stop) {
            let path_len = new.len() - FIXED;
            let path_len = new[FIXED..FIXED + path_len]
                .iter()
                .position(|&b| b == 0)
                .unwrap_or(path_len);
            // What the daemon just wrote is as new as the index: racy until later.
            push(new, FIXED, path_len, true, &mut out, &mut table);
        }
        if stop >= entries.len() {
            continue;
        }
        cursor = stop + 1;
        let maybe = next_racy.next_if_eq(&stop).is_some();
        if next_removed.next_if_eq(&stop).is_some() {
            continue;
        }
        let span = entries[stop];
        let entry = span.entry(bytes);
        let path_at = (span.path_start - span.start) as usize;
        let path_len = (span.path_end - span.path_start) as usize;
        match workdir {
            Some(workdir) if maybe => {
                let written = smudged(entry, span.path(bytes), workdir, mtime);
                let still = maybe_racy(&written, mtime);
                push(&written, path_at, path_len, still, &mut out, &mut table);
            }
            _ => push(entry, path_at, path_len, maybe, &mut out, &mut table),
        }
    }
    copy(cursor, entries.len(), &mut out, &mut table);
    let count = u32::try_from(table.entries.len()).map_err(|_| "too many entries")?;
    out.set(8, &count.to_be_bytes());
    if let Some((from, to)) = index.tree {
        let tree = &bytes[from..to];
        let mut nodes = parse_tree(tree).ok_or("the index's cache tree is malformed")?;
        for path in invalid {
            invalidate(&mut nodes, path);
        }
        let mut data = Vec::with_capacity(tree.len() + 8);
        data.extend_from_slice(b"TREE");
        data.extend_from_slice(&[0; 4]);
        for node in &nodes {
            data.extend_from_slice(node.name);
            data.push(0);
            data.extend_from_slice(format!("{} {}\n", node.count, node.subtrees).as_bytes());
            if let (true, Some(id)) = (node.count >= 0, node.id) {
                data.extend_from_slice(id);
            }
        }
        let size = (data.len() - 8) as u32;
        data[4..8].copy_from_slice(&size.to_be_bytes());
        let at = out.at + 8;
        out.put(&data);
        table.tree = Some((at, out.at));
    }
    for &(from, to) in &index.kept {
        let at = out.at;
        out.copy(from, to);
        table.kept.push((at, out.at));
    }
    if out.at + HASH > MAX_INDEX {
        return Err("an index of 4 GiB or more");
    }
    let trailer = if skip_hash {
        [0; HASH]
    } else {
        sha1(&out.buffer[..out.at])
    };
    out.put(&trailer);
    let (out, ranges) = out.finish();
    let dirty = Dirty {
        ranges,
        same_entries: first_stop,
    };
    Ok((out, table, dirty))
}

/// The new index's bytes, written over the buffer of an older index (the spare's)
/// only where they differ from it, and where they differ from the index they are made
/// from (`base`).
struct Out<'a> {
    /// The new bytes up to `at`; past it, what the buffer held.
    buffer: Vec<u8>,
    /// How much of the buffer the older index fills.
    held: usize,
    /// Where the older index differs from `base` (in order); everywhere else below
    /// `held` it has `base`'s bytes.
    stale: &'a [(usize, usize)],
    base: &'a [u8],
    at: usize,
    /// Where the new bytes differ from `base` at the same offsets.
    dirty: Vec<(usize, usize)>,
    /// The header's count differs.
    count_changed: bool,
}

impl<'a> Out<'a> {
    fn new(buffer: Vec<u8>, base: &'a [u8], stale: &'a [(usize, usize)]) -> Out<'a> {
        Out {
            held: buffer.len(),
            buffer,
            stale,
            base,
            at: 0,
            dirty: Vec::new(),
            count_changed: false,
        }
    }

    /// `bytes` at `at`, over what the buffer holds.
    fn write_at(&mut self, at: usize, bytes: &[u8]) {
        let end = at + bytes.len();
        let over = end.min(self.buffer.len()).max(at);
        self.buffer[at..over].copy_from_slice(&bytes[..over - at]);
        self.buffer.extend_from_slice(&bytes[over - at..]);
    }

    fn mark(&mut self, from: usize, to: usize) {
        match self.dirty.last_mut() {
            Some(last) if from <= last.1 => last.1 = last.1.max(to),
            _ => self.dirty.push((from, to)),
        }
    }

    /// `base[from..to]` next.
    fn copy(&mut self, from: usize, to: usize) {
        if from >= to {
            return;
        }
        if self.at != from {
            let at = self.at;
            // Not reborrowed from `self.base`'s lifetime: `write_at` takes `&mut self`.
            let base = self.base;
            self.write_at(at, &base[from..to]);
            self.mark(at, at + (to - from));
            self.at = at + (to - from);
            return;
        }
        // In place: the buffer already has `base`'s bytes except where stale, or past
        // what it held.
        let base = self.base;
        let held = self.held.min(to);
        let first = self.stale.partition_point(|&(_, end)| end <= from);
        for &(a, b) in &self.stale[first..] {
            if a >= held {
                break;
            }
            let (a, b) = (a.max(from), b.min(held));
            if a < b {
                self.write_at(a, &base[a..b]);
            }
        }
        if held < to {
            let start = held.max(from);
            self.write_at(start, &base[start..to]);
        }
        self.at = to;
    }

    /// `bytes` next: a copy in place where `base` has them at the same offset.
    fn put(&mut self, bytes: &[u8]) {
        let (from, to) = (self.at, self.at + bytes.len());
        if self.base.get(from..to) == Some(bytes) {
            self.copy(from, to);
        } else {
            self.write_at(from, bytes);
            self.mark(from, to);
            self.at = to;
        }
    }

    /// `bytes` at `at`, already written past.
    fn set(&mut self, at: usize, bytes: &[u8]) {
        self.buffer[at..at + bytes.len()].copy_from_slice(bytes);
        if self.base.get(at..at + bytes.len()) != Some(bytes) {
            self.count_changed = true;
        }
    }

    /// The new index, and where it differs from `base`.
    fn finish(mut self) -> (Vec<u8>, Vec<(usize, usize)>) {
        self.buffer.truncate(self.at);
        if self.count_changed {
            self.dirty.insert(0, (8, HEADER));
        }
        (self.buffer, self.dirty)
    }
}
/// An entry as git writes it (what libgit2's `Index::add` wrote for the same values).
fn encode_entry(out: &mut Vec<u8>, path: &[u8], id: Oid, stat: Option<&Metadata>) {
    let fields: [u32; 10] = match stat {
        Some(m) => [
            m.ctime() as u32,
            m.ctime_nsec() as u32,
            m.mtime() as u32,
            m.mtime_nsec() as u32,
            m.dev() as u32,
            m.ino() as u32,
            0o100644,
            m.uid(),
            m.gid(),
            m.size() as u32,
        ],
        None => [0, 0, 0, 0, 0, 0, 0o100644, 0, 0, 0],
    };
    let start = out.len();
    for field in fields {
        out.extend_from_slice(&field.to_be_bytes());
    }
    out.extend_from_slice(id.as_bytes());
    let flags = path.len().min(usize::from(NAME_MASK)) as u16;
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(path);
    let padded = (FIXED + path.len() + 8) & !7;
    out.resize(start + padded, 0);
}

/// One directory of the cache tree, in the extension's order (depth first).
struct Node<'b> {
    name: &'b [u8],
    /// Entries covered; -1 once invalidated.
    count: i64,
    subtrees: usize,
    id: Option<&'b [u8]>,
}

fn parse_tree(data: &[u8]) -> Option<Vec<Node<'_>>> {
    let mut nodes = Vec::new();
    let mut at = 0;
    while at < data.len() {
        let start = at;
        let nul = at + data[at..].iter().position(|&b| b == 0)?;
        let line_end = nul + 1 + data[nul + 1..].iter().position(|&b| b == b'\n')?;
        let line = std::str::from_utf8(&data[nul + 1..line_end]).ok()?;
        let (count, subtrees) = line.split_once(' ')?;
        let count: i64 = count.parse().ok()?;
        let subtrees: usize = subtrees.parse().ok()?;
        at = line_end + 1;
        let id = if count >= 0 {
            let id = data.get(at..at + HASH)?;
            at += HASH;
            Some(id)
        } else {
            None
        };
        nodes.push(Node {
            name: &data[start..nul],
            count,
            subtrees,
            id,
        });
    }
    // Every node's subtrees must be there.
    let mut end = 0;
    while end < nodes.len() {
        end = extent(&nodes, end)?;
    }
    Some(nodes)
}

/// Index just past the subtree of the node at `i`.
fn extent(nodes: &[Node<'_>], i: usize) -> Option<usize> {
    let node = nodes.get(i)?;
    let mut next = i + 1;
    for _ in 0..node.subtrees {
        next = extent(nodes, next)?;
    }
    Some(next)
}

/// Invalidate the cache tree's directories along `path` (a file's path): the root and
/// each directory of the path that the tree has.
fn invalidate(nodes: &mut [Node<'_>], path: &[u8]) {
    let mut i = 0;
    let mut rest = path;
    loop {
        let Some(node) = nodes.get_mut(i) else {
            return;
        };
        node.count = -1;
        node.id = None;
        let subtrees = node.subtrees;
        let Some(slash) = rest.iter().position(|&b| b == b'/') else {
            return;
        };
        let (dir, after) = (&rest[..slash], &rest[slash + 1..]);
        let mut child = i + 1;
        let mut found = None;
        for _ in 0..subtrees {
            if nodes.get(child).map(|n| n.name) == Some(dir) {
                found = Some(child);
                break;
            }
            match extent(nodes, child) {
                Some(next) => child = next,
                None => return,
            }
        }
        match found {
            Some(found) => {
                i = found;
                rest = after;
            }
            None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{git, git_with};
    use std::borrow::Cow;

    /// A repository with pages in a few directories, committed by git (so its index has
    /// a cache tree), and a file a person staged.
    fn repo(root: &Path) -> git2::Repository {
        git(root, &["init", "-q", "-b", "main"]);
        for path in [
            "wiki/a/x.md",
            "wiki/a/y.md",
            "wiki/b/z.md",
            "wiki/file",
            "old.md",
            "raw/r.txt",
        ] {
            let file = root.join(path);
            fs::create_dir_all(file.parent().expect("parent")).expect("dir");
            fs::write(&file, format!("{path}\n")).expect("write");
        }
        git(root, &["add", "-A"]);
        git(root, &["commit", "-q", "-m", "init"]);
        fs::write(root.join("mine.txt"), "mine\n").expect("write");
        git(root, &["add", "mine.txt"]);
        git2::Repository::open(root).expect("open")
    }

    /// Write `path` in the work tree and return its blob and stat data.
    fn page(repo: &git2::Repository, path: &str, text: &str) -> (Oid, Metadata) {
        let file = repo.workdir().expect("workdir").join(path);
        fs::create_dir_all(file.parent().expect("parent")).expect("dir");
        fs::write(&file, text).expect("write");
        let id = repo.blob(text.as_bytes()).expect("blob");
        (id, fs::metadata(&file).expect("stat"))
    }

    /// What the daemon did before this module: libgit2's `Index::add` / `remove_path`.
    fn with_libgit2(index: &Path, updates: &[Update<'_>]) {
        let mut libgit2 = git2::Index::open(index).expect("open index");
        for update in updates {
            match update.blob {
                Some(id) => {
                    let m = update.stat.expect("stat");
                    let time = |s: i64, ns: i64| git2::IndexTime::new(s as i32, ns as u32);
                    libgit2
                        .add(&git2::IndexEntry {
                            ctime: time(m.ctime(), m.ctime_nsec()),
                            mtime: time(m.mtime(), m.mtime_nsec()),
                            dev: m.dev() as u32,
                            ino: m.ino() as u32,
                            mode: 0o100644,
                            uid: m.uid(),
                            gid: m.gid(),
                            file_size: m.size() as u32,
                            id,
                            flags: 0,
                            flags_extended: 0,
                            path: update.path.as_bytes().to_vec(),
                        })
                        .expect("add");
                }
                None => libgit2.remove_path(Path::new(update.path)).expect("remove"),
            }
        }
        libgit2.write().expect("write index");
    }

    /// The daemon writes `path` and rewrites `index` with it; its blob and stat data.
    fn daemon_writes(
        repo: &git2::Repository,
        index: &Path,
        path: &str,
        text: &str,
    ) -> (Oid, Metadata) {
        let (id, stat) = page(repo, path, text);
        ours(
            index,
            &[Update {
                path,
                blob: Some(id),
                stat: Some(&stat),
            }],
        );
        (id, stat)
    }

    /// The folder `wiki/b` becomes a file and the file `wiki/file` a folder, written by
    /// the daemon in one rewrite.
    fn file_and_folder_swap_places(repo: &git2::Repository, root: &Path) {
        fs::remove_dir_all(root.join("wiki/b")).expect("rm");
        let (file, file_stat) = page(repo, "wiki/b", "now a file\n");
        fs::remove_file(root.join("wiki/file")).expect("rm");
        let (under, under_stat) = page(repo, "wiki/file/under.md", "under\n");
        ours(
            &root.join(".git/index"),
            &[
                Update {
                    path: "wiki/b",
                    blob: Some(file),
                    stat: Some(&file_stat),
                },
                Update {
                    path: "wiki/file/under.md",
                    blob: Some(under),
                    stat: Some(&under_stat),
                },
            ],
        );
    }

    fn ours(index: &Path, updates: &[Update<'_>]) {
        ours_with(index, updates, false);
    }

    fn ours_with(index: &Path, updates: &[Update<'_>], skip_hash: bool) {
        let next = index.with_extension("next");
        match write_next(index, &next, updates, skip_hash).expect("write_next") {
            Outcome::Written(written) => {
                fs::rename(&next, index).expect("rename");
                written.installed();
            }
            Outcome::Unsupported(why) => panic!("unsupported: {why}"),
        }
    }

    /// What git reads from `index`: every entry with its stat data, the status, and
    /// the cache tree as git would use it (`write-tree` from the index).
    fn as_git_sees_it(root: &Path, index: &Path) -> (String, String, String) {
        (
            git_with(root, &["ls-files", "--stage", "--debug"], Some(index)),
            git_with(root, &["status", "--porcelain=v1", "-uno"], Some(index)),
            git_with(root, &["write-tree"], Some(index)),
        )
    }

    fn compare(root: &Path, updates: &[Update<'_>]) {
        compare_with(root, updates, false);
    }

    /// `skip_hash`: the daemon's index has a null trailer, the rest is libgit2's bytes,
    /// and `git fsck` accepts it.
    fn compare_with(root: &Path, updates: &[Update<'_>], skip_hash: bool) {
        let index = root.join(".git/index");
        let theirs = root.join(".git/index-libgit2");
        fs::copy(&index, &theirs).expect("copy");
        with_libgit2(&theirs, updates);
        ours_with(&index, updates, skip_hash);
        let expected = fs::read(&theirs).expect("read");
        let got = fs::read(&index).expect("read");
        assert_eq!(
            as_git_sees_it(root, &theirs),
            as_git_sees_it(root, &index),
            "git reads the same index"
        );
        if skip_hash {
            assert_eq!(got.len(), expected.len());
            let body = got.len() - HASH;
            assert!(got[..body] == expected[..body], "libgit2's bytes");
            assert_eq!(trailer_of(&got), [0; HASH], "a null trailer");
            git(root, &["fsck", "--no-dangling"]);
        } else {
            assert!(got == expected, "byte for byte what libgit2 wrote");
        }
        // libgit2 reads it (and verifies the checksum).
        let reread = git2::Index::open(&index).expect("libgit2 reads it");
        assert_eq!(
            reread.len(),
            git2::Index::open(&theirs).expect("open").len()
        );
    }

    #[test]
    fn the_index_written_is_the_one_libgit2_wrote() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        let repo = repo(root);
        let (changed, changed_stat) = page(&repo, "wiki/a/x.md", "changed\n");
        let (new, new_stat) = page(&repo, "wiki/c/new.md", "new\n");
        let (last, last_stat) = page(&repo, "zzz.md", "last\n");
        fs::remove_file(root.join("old.md")).expect("rm");
        compare(
            root,
            &[
                Update {
                    path: "wiki/a/x.md",
                    blob: Some(changed),
                    stat: Some(&changed_stat),
                },
                Update {
                    path: "wiki/c/new.md",
                    blob: Some(new),
                    stat: Some(&new_stat),
                },
                Update {
                    path: "old.md",
                    blob: None,
                    stat: None,
                },
                Update {
                    path: "never-there.md",
                    blob: None,
                    stat: None,
                },
                Update {
                    path: "zzz.md",
                    blob: Some(last),
                    stat: Some(&last_stat),
                },
            ],
        );
        // A file where a directory was, and a directory where a file was: the entries
        // in the way go, as `git add` does (libgit2 left both, an index git cannot
        // make a tree of).
        file_and_folder_swap_places(&repo, root);
        assert_eq!(
            git(root, &["ls-files"]),
            "mine.txt\nraw/r.txt\nwiki/a/x.md\nwiki/a/y.md\nwiki/b\nwiki/c/new.md\nwiki/file/under.md\nzzz.md\n"
        );
        git(root, &["write-tree"]);
        assert_eq!(
            git(root, &["status", "--porcelain=v1"])
                .lines()
                .filter(|l| !l.starts_with("A ") && !l.starts_with("M ") && !l.starts_with("D "))
                .count(),
            0
        );
    }

    /// The same index with a null trailer (`index.skipHash`): byte for byte libgit2's
    /// but the trailer; git reads the same entries, status and tree from it and `git
    /// fsck` does not complain; libgit2 reads it; the next rewrite reads it back.
    #[test]
    fn an_index_without_its_hash_is_read_by_git_and_libgit2() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        let repo = repo(root);
        let (new, new_stat) = page(&repo, "wiki/c/new.md", "new\n");
        fs::remove_file(root.join("old.md")).expect("rm");
        let mut updates = vec![Update {
            path: "wiki/c/new.md",
            blob: Some(new),
            stat: Some(&new_stat),
        }];
        updates.push(Update {
            path: "old.md",
            blob: None,
            stat: None,
        });
        compare_with(root, &updates, true);
        let index = root.join(".git/index");
        // Read back from the disk (not the daemon's own), then with the hash again.
        known().remove(&index);
        let (again, again_stat) = page(&repo, "wiki/a/x.md", "again\n");
        let next = [Update {
            path: "wiki/a/x.md",
            blob: Some(again),
            stat: Some(&again_stat),
        }];
        ours_with(&index, &next, false);
        let bytes = fs::read(&index).expect("read");
        assert_eq!(trailer_of(&bytes), sha1(&bytes[..bytes.len() - HASH]));
        assert!(git(root, &["ls-files", "--stage", "wiki/a/x.md"]).contains(&again.to_string()));
    }

    #[test]
    fn the_hash_is_skipped_as_git_would_or_for_a_large_index() {
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = git2::Repository::init(dir.path()).expect("init");
        let config = || repo.config().expect("config");
        let small = 4096;
        let large = SKIP_HASH_FROM;
        assert!(!skips_hash(Some(&config()), small));
        assert!(skips_hash(Some(&config()), large));
        assert!(!skips_hash(None, small));
        assert!(skips_hash(None, large));
        config().set_bool("feature.manyFiles", true).expect("set");
        assert!(skips_hash(Some(&config()), small));
        config().set_bool("index.skipHash", false).expect("set");
        assert!(!skips_hash(Some(&config()), small));
        assert!(
            !skips_hash(Some(&config()), large),
            "an explicit false wins"
        );
        config().set_bool("index.skipHash", true).expect("set");
        config().set_bool("feature.manyFiles", false).expect("set");
        assert!(skips_hash(Some(&config()), small));
        config().set_str("index.skipHash", "maybe").expect("set");
        assert!(!skips_hash(Some(&config()), small), "unreadable: as unset");
    }

    /// A person changes a file in the second git last wrote the index, keeping its size
    /// (stat data alone cannot tell); git notices (the index is as new as the entry).
    /// After the daemon rewrites the index, a later file, git must notice still.
    #[test]
    fn a_change_git_could_only_see_by_content_stays_visible() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        let repo = repo(root);
        drop(repo);
        let mine = root.join("raw/r.txt");
        let committed = fs::metadata(&mine).expect("stat");
        let mtime = committed.modified().expect("mtime");
        // Same size, same mtime as the entry (as within one second), other content.
        let old = fs::read(&mine).expect("read");
        let mut changed = old.clone();
        changed[0] = if changed[0] == b'X' { b'Y' } else { b'X' };
        fs::write(&mine, &changed).expect("write");
        fs::File::options()
            .write(true)
            .open(&mine)
            .and_then(|f| f.set_modified(mtime))
            .expect("set mtime");
        let index = root.join(".git/index");
        fs::File::options()
            .write(true)
            .open(&index)
            .and_then(|f| f.set_modified(mtime))
            .expect("set the index's mtime");
        // diff-files: never writes the index (status may, smudging it itself).
        assert_eq!(
            git(root, &["diff-files", "--name-only"]),
            "raw/r.txt\n",
            "git sees it before"
        );
        std::thread::sleep(std::time::Duration::from_millis(1100));
        let (other, other_stat) = page(
            &git2::Repository::open(root).expect("repo"),
            "wiki/other.md",
            "o\n",
        );
        ours(
            &index,
            &[Update {
                path: "wiki/other.md",
                blob: Some(other),
                stat: Some(&other_stat),
            }],
        );
        assert_eq!(
            git(root, &["diff-files", "--name-only"]),
            "raw/r.txt\n",
            "git must see the change after the daemon wrote the index"
        );
    }

    #[test]
    fn git_commits_what_the_index_holds_after_a_rewrite() {
        // A cache tree left valid for a changed directory would make `git commit`
        // record the old tree.
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        let repo = repo(root);
        git(root, &["commit", "-q", "-m", "mine"]);
        let (changed, changed_stat) = page(&repo, "wiki/a/x.md", "changed\n");
        let (new, new_stat) = page(&repo, "wiki/a/deep/new.md", "new\n");
        ours(
            &root.join(".git/index"),
            &[
                Update {
                    path: "wiki/a/x.md",
                    blob: Some(changed),
                    stat: Some(&changed_stat),
                },
                Update {
                    path: "wiki/a/deep/new.md",
                    blob: Some(new),
                    stat: Some(&new_stat),
                },
            ],
        );
        assert_eq!(
            git(root, &["status", "--porcelain=v1"]),
            "A  wiki/a/deep/new.md\nM  wiki/a/x.md\n"
        );
        git(root, &["commit", "-q", "-m", "by hand"]);
        let tree = git(root, &["ls-tree", "-r", "HEAD"]);
        assert!(tree.contains(&format!("{changed}\twiki/a/x.md")), "{tree}");
        assert!(
            tree.contains(&format!("{new}\twiki/a/deep/new.md")),
            "{tree}"
        );
        assert_eq!(git(root, &["status", "--porcelain=v1"]), "");
        git(root, &["fsck", "--no-progress"]);
    }

    #[test]
    fn what_a_person_staged_between_rewrites_is_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        let repo = repo(root);
        let index = root.join(".git/index");
        daemon_writes(&repo, &index, "wiki/one.md", "one\n");
        // `git add -N` makes a version 3 index (an entry with extended flags).
        fs::write(root.join("later.txt"), "later\n").expect("write");
        git(root, &["add", "-N", "later.txt"]);
        fs::write(root.join("wiki/a/y.md"), "edited by hand\n").expect("write");
        git(root, &["add", "wiki/a/y.md"]);
        let (two, two_stat) = page(&repo, "wiki/two.md", "two\n");
        compare(
            root,
            &[Update {
                path: "wiki/two.md",
                blob: Some(two),
                stat: Some(&two_stat),
            }],
        );
        assert_eq!(
            git(root, &["status", "--porcelain=v1"]),
            " A later.txt\nA  mine.txt\nM  wiki/a/y.md\nA  wiki/one.md\nA  wiki/two.md\n"
        );
    }

    #[test]
    fn an_index_changed_in_place_after_the_daemons_write_is_read_from_the_disk() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        let repo = repo(root);
        let index = root.join(".git/index");
        daemon_writes(&repo, &index, "wiki/one.md", "one\n");
        // Same file, same size: `mine.txt`'s staged blob becomes another, the trailer
        // is computed again (what a tool writing the index in place would leave).
        let mut bytes = fs::read(&index).expect("read");
        let other = repo.blob(b"other\n").expect("blob");
        let parsed = parse(&bytes, true, None).expect("parse");
        let at = parsed
            .entries
            .iter()
            .find(|span| span.path(&bytes) == b"mine.txt")
            .map(|span| span.start as usize)
            .expect("mine.txt is staged");
        bytes[at + 40..at + 60].copy_from_slice(other.as_bytes());
        let body = bytes.len() - HASH;
        let trailer = sha1(&bytes[..body]);
        bytes[body..].copy_from_slice(&trailer);
        let mut file = OpenOptions::new().write(true).open(&index).expect("open");
        file.write_all(&bytes).expect("write in place");
        drop(file);
        daemon_writes(&repo, &index, "wiki/two.md", "two\n");
        let staged = git(root, &["ls-files", "--stage", "mine.txt"]);
        assert!(staged.contains(&other.to_string()), "{staged}");
        assert!(git(root, &["ls-files"]).contains("wiki/two.md"));
    }

    /// Whether the daemon kept where the parts of `index` are (the next rewrite does
    /// not parse it).
    fn table_kept(index: &Path) -> bool {
        known().get(index).is_some_and(|k| k.table.is_some())
    }

    /// Rewrites in a row, each from the table the last one kept, give byte for byte the
    /// index libgit2 makes with the same updates one after the other: entries inserted
    /// before the first, between others and after the last, replaced, removed, a
    /// directory replaced by a file and a file by a directory, in several rewrites.
    #[test]
    fn rewrites_from_the_kept_table_are_what_libgit2_writes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        let repo = repo(root);
        // Files older than the index: most entries are copied in runs, not one by one.
        let past = std::time::SystemTime::now() - std::time::Duration::from_secs(60);
        for path in [
            "wiki/a/x.md",
            "wiki/a/y.md",
            "wiki/b/z.md",
            "wiki/file",
            "raw/r.txt",
        ] {
            fs::File::options()
                .write(true)
                .open(root.join(path))
                .and_then(|f| f.set_modified(past))
                .expect("set mtime");
        }
        git(root, &["update-index", "--refresh"]);
        let index = root.join(".git/index");
        let theirs = root.join(".git/index-libgit2");
        fs::copy(&index, &theirs).expect("copy");
        let steps: Vec<Vec<(&str, Option<&str>)>> = vec![
            vec![
                ("wiki/c/new.md", Some("new\n")),
                ("aaa.md", Some("first\n")),
            ],
            vec![
                ("wiki/a/x.md", Some("changed\n")),
                ("zzz.md", Some("last\n")),
                ("old.md", None),
            ],
            vec![("wiki/a/w.md", Some("w\n")), ("wiki/c/new.md", None)],
            vec![("wiki/c/new.md", Some("again\n")), ("aaa.md", None)],
        ];
        for (n, step) in steps.iter().enumerate() {
            let mut pages = Vec::new();
            for (path, text) in step {
                match text {
                    Some(text) => {
                        let (id, stat) = page(&repo, path, text);
                        pages.push((*path, Some(id), Some(stat)));
                    }
                    None => {
                        let _ = fs::remove_file(root.join(path));
                        pages.push((*path, None, None));
                    }
                }
            }
            let updates: Vec<Update<'_>> = pages
                .iter()
                .map(|(path, blob, stat)| Update {
                    path,
                    blob: *blob,
                    stat: stat.as_ref(),
                })
                .collect();
            assert_eq!(table_kept(&index), n > 0, "step {n}: the table is kept");
            if n > 0 {
                assert!(
                    load(&index).expect("load").table.is_some(),
                    "step {n}: and used"
                );
            }
            // From the third rewrite on, the buffers of the index two rewrites back
            // are written over where the new index differs from what they hold.
            assert_eq!(
                known().get(&index).is_some_and(|k| k.spare.is_some()),
                n > 1,
                "step {n}: spare buffers"
            );
            with_libgit2(&theirs, &updates);
            ours(&index, &updates);
            assert!(
                fs::read(&index).expect("read") == fs::read(&theirs).expect("read"),
                "step {n}: byte for byte what libgit2 wrote"
            );
            // On copies: `git status` may write the index it reads.
            let seen = |file: &Path| {
                let probe = root.join(".git/index-probe");
                fs::copy(file, &probe).expect("copy");
                as_git_sees_it(root, &probe)
            };
            assert_eq!(seen(&theirs), seen(&index), "step {n}");
        }
        // A file where a directory was and a directory where a file was, from the table.
        assert!(table_kept(&root.join(".git/index")));
        file_and_folder_swap_places(&repo, root);
        // The table kept is the one of the bytes kept: read back (before
        // `git write-tree` rewrites the index), it is the same.
        let bytes = fs::read(&index).expect("read");
        let parsed = parse(&bytes, true, None).expect("parse");
        let kept = known()
            .get(&index)
            .and_then(|k| k.table.clone())
            .expect("kept");
        let spans = |t: &Table| -> Vec<(u32, u32, u32, u32)> {
            t.entries
                .iter()
                .map(|s| (s.start, s.end, s.path_start, s.path_end))
                .collect()
        };
        assert_eq!(spans(&kept), spans(&parsed));
        assert_eq!((kept.tree, &kept.kept), (parsed.tree, &parsed.kept));
        assert_eq!(
            git(root, &["ls-files"]),
            "mine.txt\nraw/r.txt\nwiki/a/w.md\nwiki/a/x.md\nwiki/a/y.md\nwiki/b\nwiki/c/new.md\nwiki/file/under.md\nzzz.md\n"
        );
        git(root, &["write-tree"]);
    }

    /// A page the daemon wrote in the second it wrote the index is racy for git; a
    /// person changes it in that second, keeping its size. The next rewrite, from the
    /// kept table and in a later second, must still let git see the change (the
    /// entry carried from one rewrite to the next as a candidate, and smudged).
    #[test]
    fn a_racy_entry_the_daemon_wrote_is_checked_at_the_next_rewrite() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        let repo = repo(root);
        let index = root.join(".git/index");
        // Just after a second begins: the page and the index are written in that second.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock");
        std::thread::sleep(
            std::time::Duration::from_millis(1010)
                - std::time::Duration::from_nanos(u64::from(now.subsec_nanos())),
        );
        let (_, one_stat) = daemon_writes(&repo, &index, "wiki/one.md", "one\n");
        assert!(table_kept(&index));
        let file = root.join("wiki/one.md");
        let mtime = one_stat.modified().expect("mtime");
        fs::write(&file, "ONE\n").expect("write");
        fs::File::options()
            .write(true)
            .open(&file)
            .and_then(|f| f.set_modified(mtime))
            .expect("set mtime");
        // The index's own mtime is that second too (git would check the entry).
        let index_mtime = fs::metadata(&index).expect("stat").mtime();
        assert!(one_stat.mtime() >= index_mtime, "the entry is racy");
        std::thread::sleep(std::time::Duration::from_millis(1100));
        daemon_writes(&repo, &index, "wiki/two.md", "two\n");
        assert!(
            fs::metadata(&index).expect("stat").mtime() > one_stat.mtime(),
            "the new index is later than the entry"
        );
        assert_eq!(
            git(root, &["diff-files", "--name-only"]),
            "wiki/one.md\n",
            "git must see the change after the daemon wrote the index again"
        );
    }

    /// Whether this file system grants write leases (tmpfs, ext4, overlayfs do; NFS
    /// does not): the spare index is reused only where it does.
    fn leases_work(dir: &Path) -> bool {
        let probe = dir.join("lease-probe");
        fs::write(&probe, "x").expect("probe");
        match reuse(&probe, &dir.join("lease-probe-next")) {
            Some(file) => {
                unlease(&file);
                true
            }
            None => false,
        }
    }

    /// `repo` in a temporary folder whose file system grants write leases (None, and a
    /// word on stderr, where it does not: the spare is never written into there).
    fn repo_with_leases() -> Option<(tempfile::TempDir, git2::Repository)> {
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = repo(dir.path());
        if !leases_work(&dir.path().join(".git")) {
            eprintln!("no write leases on this file system: nothing to check");
            return None;
        }
        Some((dir, repo))
    }

    /// The daemon writes `wiki/new.md` (`text`) and rewrites the index of `root`'s
    /// repository with it, through `spare`: where the next index is, and its `Written`.
    fn rewrite_through_spare(
        repo: &git2::Repository,
        root: &Path,
        spare: &Path,
        text: &str,
    ) -> (PathBuf, Written) {
        let (id, stat) = page(repo, "wiki/new.md", text);
        let next = root.join(".git/next");
        let update = [Update {
            path: "wiki/new.md",
            blob: Some(id),
            stat: Some(&stat),
        }];
        let index = root.join(".git/index");
        match write_next_reusing(&index, &next, Some(spare), &update, false).expect("write") {
            Outcome::Written(written) => (next, written),
            Outcome::Unsupported(why) => panic!("unsupported: {why}"),
        }
    }

    /// The index a session replaced is written into by the next one when no one has
    /// it open: the new index is that file (same inode), and git reads it whole.
    #[test]
    fn an_index_replaced_earlier_is_written_into_when_no_one_holds_it() {
        let Some((dir, repo)) = repo_with_leases() else {
            return;
        };
        let root = dir.path();
        let index = root.join(".git/index");
        let listed = git(root, &["ls-files"]);
        let spare = root.join(".git/spare");
        // A longer file than the index will be: the rewrite must cut it to size.
        fs::write(&spare, vec![b'x'; 1 << 20]).expect("spare");
        let spare_ino = fs::metadata(&spare).expect("stat").ino();
        let (next, written) = rewrite_through_spare(&repo, root, &spare, "new\n");
        assert!(!spare.exists(), "the spare became the next index");
        assert_eq!(fs::metadata(&next).expect("stat").ino(), spare_ino);
        fs::rename(&next, &index).expect("rename");
        written.installed();
        let mut expected: Vec<&str> = listed.lines().chain(["wiki/new.md"]).collect();
        expected.sort_unstable();
        assert_eq!(git(root, &["ls-files"]), expected.join("\n") + "\n");
        git(root, &["fsck", "--no-dangling"]);
        assert_eq!(git(root, &["diff-files", "--name-only"]), "");
    }

    /// One session's rewrite as `Session::finish` makes it: written into the spare,
    /// renamed over `.git/index`, and the index it replaced kept as the next spare.
    /// The bytes written to the file.
    fn session_through_spare(root: &Path, updates: &[Update<'_>], skip_hash: bool) -> usize {
        let git_dir = root.join(".git");
        let (index, next) = (git_dir.join("index"), git_dir.join("next"));
        let (spare, previous) = (git_dir.join("spare"), git_dir.join("previous"));
        let written = match write_next_reusing(&index, &next, Some(&spare), updates, skip_hash)
            .expect("write")
        {
            Outcome::Written(written) => written,
            Outcome::Unsupported(why) => panic!("unsupported: {why}"),
        };
        let wrote = written.wrote;
        let _ = fs::remove_file(&previous);
        fs::hard_link(&index, &previous).expect("link");
        fs::rename(&next, &index).expect("rename");
        written.installed();
        let _ = fs::remove_file(&spare);
        fs::rename(&previous, &spare).expect("spare");
        wrote
    }

    /// Rewrites through the spare, each written only where the new index differs from
    /// the one the spare held (two rewrites back), give byte for byte what libgit2
    /// writes with the same updates: random creates, changes (same path: same length)
    /// and removals, in folders of the cache tree; an index written by someone else
    /// (libgit2) in between, and the kept bytes let go, now and then.
    #[test]
    fn rewrites_written_only_where_they_differ_are_what_libgit2_writes() {
        for skip_hash in [false, true] {
            let Some((dir, repo)) = repo_with_leases() else {
                return;
            };
            let root = dir.path();
            let index = root.join(".git/index");
            let theirs = root.join(".git/index-libgit2");
            // Enough entries that a change in one place leaves most of the file as it was.
            let mut pages = Vec::new();
            for n in 0..120 {
                let path = format!("wiki/f{}/page-{n:03}.md", n % 6);
                let (id, stat) = page(&repo, &path, &format!("{path}\n"));
                pages.push((path, id, stat));
            }
            let updates: Vec<Update<'_>> = pages
                .iter()
                .map(|(path, id, stat)| Update {
                    path,
                    blob: Some(*id),
                    stat: Some(stat),
                })
                .collect();
            with_libgit2(&index, &updates);
            git(root, &["commit", "-q", "-m", "pages"]);
            fs::copy(&index, &theirs).expect("copy");
            let mut random = crate::testing::Xorshift(0x1dec_0de5 ^ u64::from(skip_hash));
            let (mut wrote, mut sizes, mut in_place) = (0usize, 0usize, 0usize);
            // Whether the last round only changed pages that were there.
            let mut changed_only_before = false;
            for round in 0..160 {
                let mut step: Vec<(String, Option<(Oid, Metadata)>)> = Vec::new();
                let mut changed_only = true;
                for _ in 0..=random.below(2) {
                    let folder = random.below(7);
                    let path = match random.below(5) {
                        0 => format!("wiki/f{folder}/new-{}.md", random.below(40)),
                        _ => {
                            let n = random.below(130);
                            format!("wiki/f{}/page-{n:03}.md", n % 6)
                        }
                    };
                    if step.iter().any(|(p, _)| *p == path) {
                        continue;
                    }
                    let there = root.join(&path).exists();
                    // Only what is there is removed (libgit2 leaves the cache tree as
                    // it is for an absent path; the daemon never removes one).
                    let page = if random.below(6) == 0 && there {
                        fs::remove_file(root.join(&path)).expect("remove");
                        changed_only = false;
                        None
                    } else {
                        changed_only &= there;
                        Some(page(&repo, &path, &format!("{path} {round}\n")))
                    };
                    step.push((path, page));
                }
                let updates: Vec<Update<'_>> = step
                    .iter()
                    .map(|(path, page)| Update {
                        path,
                        blob: page.as_ref().map(|(id, _)| *id),
                        stat: page.as_ref().map(|(_, stat)| stat),
                    })
                    .collect();
                let outside = round % 29 == 11 || round % 37 == 19;
                if round % 29 == 11 {
                    // Someone else writes the index (a person's `git add`).
                    let (id, stat) = page(&repo, "theirs.md", &format!("theirs {round}\n"));
                    let staged = [Update {
                        path: "theirs.md",
                        blob: Some(id),
                        stat: Some(&stat),
                    }];
                    with_libgit2(&index, &staged);
                    with_libgit2(&theirs, &staged);
                }
                if round % 37 == 19 {
                    release_cached();
                }
                let bytes = session_through_spare(root, &updates, skip_hash);
                with_libgit2(&theirs, &updates);
                let got = fs::read(&index).expect("read");
                let expected = fs::read(&theirs).expect("read");
                let body = expected.len() - HASH;
                assert_eq!(got.len(), expected.len(), "round {round}: the size");
                assert!(
                    got[..body] == expected[..body],
                    "round {round}: libgit2's bytes"
                );
                let trailer = if skip_hash {
                    [0; HASH]
                } else {
                    trailer_of(&expected)
                };
                assert_eq!(trailer_of(&got), trailer, "round {round}: the trailer");
                // What the daemon kept is what the file holds.
                let kept = known().get(&index).and_then(|k| k.bytes.clone());
                assert!(kept.is_some_and(|k| *k == got), "round {round}: bytes kept");
                wrote += bytes;
                sizes += got.len();
                // Pages changed in place this round and the last: a few entries, the
                // cache tree and the header are written, not the whole file.
                if changed_only && changed_only_before && !outside {
                    in_place += 1;
                    assert!(
                        bytes < got.len() / 8,
                        "round {round}: {bytes} of {} bytes written",
                        got.len()
                    );
                }
                changed_only_before = changed_only && !outside;
            }
            assert!(in_place > 20, "{in_place} rounds changed pages in place");
            assert!(wrote < sizes * 9 / 10, "written: {wrote} of {sizes} bytes");
            git(root, &["fsck", "--no-dangling"]);
            assert_eq!(git(root, &["diff-files", "--name-only"]), "");
        }
    }

    /// A spare someone still has open (a `git status` that opened it while it was
    /// `.git/index`), or that has another name (a backup made with hard links holds
    /// the old `.git/index` as its own), is not written into: what they read stays
    /// what it was.
    #[test]
    fn a_spare_index_held_open_or_with_another_name_is_left_as_it_is() {
        for linked in [false, true] {
            let dir = tempfile::tempdir().expect("tempdir");
            let root = dir.path();
            let repo = repo(root);
            let spare = root.join(".git/spare");
            fs::copy(root.join(".git/index"), &spare).expect("spare");
            let before = fs::read(&spare).expect("read");
            let other = root.join("backup-index");
            let reader = if linked {
                fs::hard_link(&spare, &other).expect("link");
                None
            } else {
                Some(File::open(&spare).expect("open"))
            };
            let (next, _) =
                rewrite_through_spare(&repo, root, &spare, "new, a longer page than the rest\n");
            assert!(
                spare.exists(),
                "linked {linked}: left for the caller to free"
            );
            let seen = match reader {
                Some(mut file) => {
                    let mut seen = Vec::new();
                    file.read_to_end(&mut seen).expect("read");
                    seen
                }
                None => fs::read(&other).expect("read"),
            };
            assert_eq!(
                seen, before,
                "linked {linked}: what they read did not change"
            );
            assert_ne!(fs::read(&next).expect("read next"), before);
        }
    }

    /// A racy entry whose file still has the stat data it records, to the
    /// nanosecond, is not read again (its content is what was hashed when the stat
    /// was taken); one whose ctime moved is read and smudged when its content differs.
    /// The entry here names a blob other than the file's content, which only a read
    /// can tell.
    #[test]
    fn a_racy_entry_is_read_again_only_when_its_stat_moved_below_the_second() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        let file = root.join("page.md");
        fs::write(&file, "one\n").expect("write");
        let stat = fs::metadata(&file).expect("stat");
        let other = Oid::hash_object(git2::ObjectType::Blob, b"ONE\n").expect("hash");
        let mut entry = Vec::new();
        encode_entry(&mut entry, b"page.md", other, Some(&stat));
        let index_mtime = stat.mtime();
        assert!(maybe_racy(&entry, index_mtime));
        let path = &entry[FIXED..FIXED + "page.md".len()];
        assert!(
            matches!(smudged(&entry, path, root, index_mtime), Cow::Borrowed(_)),
            "the stat is the file's to the nanosecond: not read"
        );
        // Same content, mtime set back to the recorded one: only the ctime moved.
        fs::write(&file, "one\n").expect("write again");
        fs::File::options()
            .write(true)
            .open(&file)
            .and_then(|f| f.set_modified(stat.modified().expect("mtime")))
            .expect("set mtime");
        let again = fs::metadata(&file).expect("stat");
        assert_eq!(
            (again.mtime(), again.mtime_nsec(), again.size()),
            (stat.mtime(), stat.mtime_nsec(), stat.size())
        );
        let smudge = smudged(&entry, path, root, index_mtime);
        assert!(
            matches!(&smudge, Cow::Owned(e) if be32(e, 36) == Some(0)),
            "the ctime moved: read, and the content is not the entry's blob"
        );
    }

    #[test]
    fn what_this_module_does_not_handle_is_left_to_libgit2() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        let repo = repo(root);
        let index = root.join(".git/index");
        let next = root.join(".git/next");
        let (one, one_stat) = page(&repo, "wiki/one.md", "one\n");
        let updates = [Update {
            path: "wiki/one.md",
            blob: Some(one),
            stat: Some(&one_stat),
        }];
        let unsupported = |expected: &str| match write_next(&index, &next, &updates, false) {
            Ok(Outcome::Unsupported(why)) => assert!(why.contains(expected), "{why}"),
            Ok(Outcome::Written(_)) => panic!("written, expected {expected}"),
            Err(e) => panic!("{e}"),
        };
        // A byte changed: the checksum does not match.
        let good = fs::read(&index).expect("read");
        let mut bad = good.clone();
        bad[HEADER + 30] ^= 1;
        fs::write(&index, &bad).expect("write");
        unsupported("checksum");
        fs::write(&index, &good).expect("write");
        git(root, &["update-index", "--index-version", "4"]);
        unsupported("version 4");
        git(root, &["update-index", "--index-version", "2"]);
        git(root, &["update-index", "--split-index"]);
        unsupported("required index extension");
        git(root, &["update-index", "--no-split-index"]);
        fs::remove_file(&index).expect("rm");
        unsupported("no index");
    }
}
