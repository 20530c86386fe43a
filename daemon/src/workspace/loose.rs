//! Loose objects written by the daemon (issue 15): the blobs, trees and commits of its
//! commits, as libgit2's loose backend writes them (zlib at its fastest level, mode
//! 0444, a temporary file renamed into place), without what `git_odb_write` does
//! around a write: it tries to "freshen" an existing copy (a `utime` that fails for
//! every new object), then re-reads the pack directory (open, list,
//! `multi-pack-index`) because the object was in no pack it knew. With 8 writers at
//! 10k pages `git_odb_write` was a fifth of the daemon's CPU time.
//!
//! A blob's id is libgit2's hash (`Oid::hash_object`): its SHA-1 detects the collision
//! attacks (SHAttered), so two crafted pages can never pass for one object, as in git.
//! A tree's or a commit's id is the same SHA-1 from the `sha1` crate (SHA-NI where the
//! CPU has it): the daemon composes those bytes itself, from names that hold no NUL
//! and from ids that are hashes, so no attack's near-random blocks can be in them, and
//! for anything else the detecting SHA-1 gives the same id. Hashing the trees with the
//! detecting one was a third of the daemon's samples with 8 writers into a folder of
//! 4,000 pages: each commit hashes the whole tree of every folder above its page.
//!
//! A tree of `STORE_FROM` bytes or more (a folder of some 30 pages) is written in zlib's
//! stored blocks, uncompressed: compressing the 86 KB tree of a folder of 2,000 pages
//! took 0.26 ms at zlib's fastest level, about a sixth of a write's CPU with 8 writers,
//! and saved only 40 % of its size (its ids do not compress). Storing it takes 20 µs.
//! A small tree costs the compressor's reset more than its bytes: a folder of 100 pages
//! (3.2 KB) took 18-22 µs and saved a quarter, and a write makes two or three such trees
//! (its folder's parents). git and libgit2 read any zlib stream, and `git gc` packs and
//! delta-compresses the trees as it would have.
//!
//! An object found loose already is not written again (its time is freshened, as git
//! does). One that exists only in a pack is written loose once more: the same content
//! under the same name, which the next repack drops (`pack`).

use std::collections::HashSet;
use std::fs::{self, OpenOptions};
use std::io::{self, ErrorKind, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, LazyLock, Mutex, mpsc};

use flate2::{Compress, Compression, FlushCompress, Status};
use git2::{ObjectType, Oid};

/// Trees of this many bytes or more are written uncompressed (see the module's note).
const STORE_FROM: usize = 1 << 10;

/// Set the modification time of `path` to now.
fn freshen(path: &Path) -> io::Result<()> {
    use rustix::fs::{AtFlags, CWD, Timespec, Timestamps, UTIME_NOW};
    let now = Timespec {
        tv_sec: 0,
        tv_nsec: UTIME_NOW,
    };
    rustix::fs::utimensat(
        CWD,
        path,
        &Timestamps {
            last_access: now,
            last_modification: now,
        },
        AtFlags::empty(),
    )
    .map_err(io::Error::from)
}

/// `header` then `data` as one zlib stream of stored (uncompressed) blocks.
fn stored(header: &[u8], data: &[u8]) -> Vec<u8> {
    const BLOCK: usize = u16::MAX as usize;
    let total = header.len() + data.len();
    let mut out = Vec::with_capacity(total + 6 + 5 * (total / BLOCK + 1));
    // CMF: deflate, 32 KiB window; FLG: fastest level, and the check bits.
    out.extend_from_slice(&[0x78, 0x01]);
    let mut rest = [header, data]
        .into_iter()
        .flat_map(|part| part.chunks(BLOCK));
    let mut pending: Vec<&[u8]> = Vec::new();
    let mut left = total;
    loop {
        // One block: up to BLOCK bytes, taken from the chunks in order.
        let size = left.min(BLOCK);
        left -= size;
        out.push(u8::from(left == 0));
        out.extend_from_slice(&(size as u16).to_le_bytes());
        out.extend_from_slice(&(!(size as u16)).to_le_bytes());
        let mut need = size;
        while need > 0 {
            let Some(chunk) = pending.pop().or_else(|| rest.next()) else {
                break;
            };
            let take = chunk.len().min(need);
            out.extend_from_slice(&chunk[..take]);
            if take < chunk.len() {
                pending.push(&chunk[take..]);
            }
            need -= take;
        }
        if left == 0 {
            break;
        }
    }
    let mut adler = adler2::Adler32::new();
    adler.write_slice(header);
    adler.write_slice(data);
    out.extend_from_slice(&adler.checksum().to_be_bytes());
    out
}

/// Compressors kept for the next objects (at most `KEPT_COMPRESSORS`). A new one
/// allocates and zeroes about 300 KB of tables, and flate2's `ZlibEncoder` writer
/// compressed through a buffer of its own: for the 86 KB tree of a folder of 2,000
/// pages that was 0.40 ms against 0.26 ms with a compressor kept and compressing into
/// the output directly.
static COMPRESSORS: Mutex<Vec<Compress>> = Mutex::new(Vec::new());
const KEPT_COMPRESSORS: usize = 2;

/// Let go of the kept compressors (the daemon has gone quiet).
pub fn release_cached() {
    COMPRESSORS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clear();
}

/// `header` then `data` as one zlib stream, at zlib's fastest level (what libgit2's
/// loose backend writes).
fn deflate(header: &[u8], data: &[u8]) -> io::Result<Vec<u8>> {
    let kept = COMPRESSORS.lock().unwrap_or_else(|p| p.into_inner()).pop();
    let mut compressor = match kept {
        Some(mut compressor) => {
            compressor.reset();
            compressor
        }
        None => Compress::new(Compression::fast(), true),
    };
    let mut out = Vec::with_capacity((header.len() + data.len()) / 2 + 128);
    let result = feed(&mut compressor, header, &mut out, FlushCompress::None)
        .and_then(|()| feed(&mut compressor, data, &mut out, FlushCompress::Finish));
    if result.is_ok() {
        let mut kept = COMPRESSORS.lock().unwrap_or_else(|p| p.into_inner());
        if kept.len() < KEPT_COMPRESSORS {
            kept.push(compressor);
        }
    }
    result.map(|()| out)
}

/// Compress all of `input` into `out` (growing it as needed); with `Finish`, until the
/// stream ends.
fn feed(
    compressor: &mut Compress,
    mut input: &[u8],
    out: &mut Vec<u8>,
    flush: FlushCompress,
) -> io::Result<()> {
    loop {
        if out.capacity() - out.len() < 64 {
            out.reserve(out.capacity().max(4096));
        }
        let before = compressor.total_in();
        let status = compressor
            .compress_vec(input, out, flush)
            .map_err(io::Error::other)?;
        let consumed = usize::try_from(compressor.total_in() - before).map_err(io::Error::other)?;
        input = &input[consumed.min(input.len())..];
        match status {
            Status::StreamEnd => return Ok(()),
            _ if flush == FlushCompress::None && input.is_empty() => return Ok(()),
            // Out of room (BufError), or more to come: grow and go on.
            _ => {
                if out.capacity() - out.len() < 4096 {
                    out.reserve(out.capacity().max(4096));
                }
            }
        }
    }
}

/// git's id of an object the daemon composed (a tree, a commit): SHA-1 of its header
/// and bytes, without collision detection (see the module's note).
fn composed_id(header: &[u8], data: &[u8]) -> io::Result<Oid> {
    use sha1::{Digest, Sha1};
    let mut hasher = Sha1::new();
    hasher.update(header);
    hasher.update(data);
    Oid::from_bytes(&hasher.finalize()).map_err(io::Error::other)
}

/// git's id of `data` as an object of `kind` (`git hash-object`).
fn object_id(kind: ObjectType, data: &[u8]) -> io::Result<Oid> {
    let header = header_of(kind, data.len())?;
    match kind {
        ObjectType::Tree | ObjectType::Commit => composed_id(header.as_bytes(), data),
        _ => Oid::hash_object(kind, data).map_err(io::Error::other),
    }
}

/// An object's header: `<kind> <size>\0`.
fn header_of(kind: ObjectType, size: usize) -> io::Result<String> {
    let name = match kind {
        ObjectType::Blob => "blob",
        ObjectType::Tree => "tree",
        ObjectType::Commit => "commit",
        ObjectType::Tag => "tag",
        _ => {
            return Err(io::Error::new(
                ErrorKind::InvalidInput,
                "not an object type",
            ));
        }
    };
    Ok(format!("{name} {size}\0"))
}

/// Write `data` as a loose object of `kind` into `objects` (a repository's
/// `.git/objects`); its id, which is git's (`git hash-object`).
pub fn write(objects: &Path, kind: ObjectType, data: &[u8]) -> io::Result<Oid> {
    let id = object_id(kind, data)?;
    write_known(objects, kind, id, data)
}

/// Write `data`, whose id is `id`, as a loose object of `kind` into `objects`.
fn write_known(objects: &Path, kind: ObjectType, id: Oid, data: &[u8]) -> io::Result<Oid> {
    let header = header_of(kind, data.len())?;
    let hex = id.to_string();
    let dir = objects.join(&hex[..2]);
    let path = dir.join(&hex[2..]);
    // Found loose: freshened, as git does, so that a `git gc` run by hand meanwhile
    // does not prune it as old and unreachable before the commit refers to it. One that
    // cannot be freshened is written again.
    if fs::symlink_metadata(&path).is_ok() && freshen(&path).is_ok() {
        return Ok(id);
    }
    let compressed = if kind == ObjectType::Tree && data.len() >= STORE_FROM {
        stored(header.as_bytes(), data)
    } else {
        deflate(header.as_bytes(), data)?
    };
    match fs::create_dir(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let temporary = dir.join(format!(
        "tmp_obj_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let written = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o444)
        .open(&temporary)
        .and_then(|mut file| file.write_all(&compressed))
        .and_then(|()| fs::rename(&temporary, &path));
    if let Err(error) = written {
        let _ = fs::remove_file(&temporary);
        return Err(error);
    }
    Ok(id)
}

/// Bytes an object is written from, shared with whoever else holds them (a kept tree).
pub type Shared = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// A git session's objects. In a group of writes (`Session::write_objects_later`), the
/// objects of every write but the last are written on the `git-objects` thread while
/// the leader composes the next commit: with 8 writers the leader's thread no longer
/// creates the 40-odd object files of a group one after the other while the other core
/// waits. Otherwise (and for objects of 1 MiB or more) each is written at once, after
/// what is queued. One thread writes them in the order they were made, so a commit's
/// file never appears before the blobs and trees it names (what recovery relies on
/// when it publishes a pending commit it finds). Every object is written before
/// anything reads it from the repository: the session waits (`settle`, `wait`) before
/// libgit2 reads and before its branch moves, a read of a tree the kept trees lack
/// waits for every queued object (`drain`), and a blob the session queued counts as
/// present (`queued`). A write that fails fails the session at `finish` (its commits
/// are never published, and the group is rolled back). Dropping it waits for what it
/// queued.
pub struct Objects {
    path: PathBuf,
    pending: Arc<Pending>,
    queued: Mutex<HashSet<Oid>>,
    /// Queue the objects (`later`); otherwise each is written at once, after those
    /// queued before it, so files appear in the order they were made: a commit's
    /// objects never before the blobs and trees it names.
    later: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
struct Pending {
    state: Mutex<PendingState>,
    done: Condvar,
}

#[derive(Default)]
struct PendingState {
    count: usize,
    /// The first write that failed: (kind, message).
    error: Option<(ErrorKind, String)>,
}

impl Pending {
    fn add(&self) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).count += 1;
    }

    fn done(&self, result: io::Result<()>) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.count = state.count.saturating_sub(1);
        if let Err(error) = result
            && state.error.is_none()
        {
            state.error = Some((error.kind(), error.to_string()));
        }
        if state.count == 0 {
            self.done.notify_all();
        }
    }

    fn wait(&self) -> io::Result<()> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        while state.count > 0 {
            state = self.done.wait(state).unwrap_or_else(|p| p.into_inner());
        }
        match &state.error {
            None => Ok(()),
            Some((kind, message)) => Err(io::Error::new(*kind, message.clone())),
        }
    }
}

/// Every object queued, whatever its session: what a read of an object the kept trees
/// lack waits for.
static ALL: LazyLock<Pending> = LazyLock::new(Pending::default);

impl Objects {
    pub fn new(path: PathBuf) -> Objects {
        Objects {
            path,
            pending: Arc::default(),
            queued: Mutex::new(HashSet::new()),
            later: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Queue the objects written from now on for the `git-objects` thread (`true`:
    /// there is more to do meanwhile, the next write of a group) or write them on the
    /// caller's thread (the default: a lone write would only wait for the thread).
    pub fn set_later(&self, later: bool) {
        self.later.store(later, Ordering::Relaxed);
    }

    /// Wait until every object this session queued is written; the first that could
    /// not be (it stays failed).
    pub fn settle(&self) -> io::Result<()> {
        self.pending.wait()
    }

    /// Wait for the objects queued, whether or not they were written (a failed one
    /// fails a read of it, and the session at `finish`).
    pub fn wait(&self) {
        let _ = self.pending.wait();
    }

    /// Whether this session queued (or wrote) the object `id`.
    pub fn queued(&self, id: Oid) -> bool {
        self.queued
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&id)
    }
}

impl Drop for Objects {
    fn drop(&mut self) {
        self.wait();
    }
}

/// Wait until every object queued by any session is written (before a read of one
/// the kept trees lack).
pub fn drain() {
    let _ = ALL.wait();
}

struct Job {
    objects: PathBuf,
    kind: ObjectType,
    id: Oid,
    data: Shared,
    pending: Arc<Pending>,
}

/// The `git-objects` thread's queue; None where the thread could not start (objects
/// are then written on the caller's thread).
static WRITER: LazyLock<Option<Mutex<mpsc::Sender<Job>>>> = LazyLock::new(|| {
    let (send, receive) = mpsc::channel::<Job>();
    std::thread::Builder::new()
        .name("git-objects".into())
        .spawn(move || {
            for job in receive {
                let result = write_known(&job.objects, job.kind, job.id, (*job.data).as_ref());
                job.pending.done(result.map(drop));
                ALL.done(Ok(()));
            }
        })
        .ok()
        .map(|_| Mutex::new(send))
});

/// Objects of this size or more are written on the caller's thread (a big page is not
/// copied to be queued).
const QUEUE_BELOW: usize = 1 << 20;

/// The id of `data` as an object of `kind`, written into `objects` on the
/// `git-objects` thread when the session asked for it (`Objects::set_later`), else at
/// once (see `Objects`).
pub fn write_later(objects: &Objects, kind: ObjectType, data: Shared) -> io::Result<Oid> {
    let bytes = (*data).as_ref();
    if bytes.len() >= QUEUE_BELOW || !objects.later.load(Ordering::Relaxed) {
        // After what is queued, so that files appear in the order they were made.
        objects.settle()?;
        let id = write(&objects.path, kind, bytes)?;
        objects
            .queued
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id);
        return Ok(id);
    }
    let id = object_id(kind, bytes)?;
    let sender = WRITER
        .as_ref()
        .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).clone());
    objects.pending.add();
    ALL.add();
    let job = Job {
        objects: objects.path.clone(),
        kind,
        id,
        data,
        pending: Arc::clone(&objects.pending),
    };
    // Written here when the thread is gone.
    let unsent = match sender {
        Some(sender) => sender.send(job).err().map(|mpsc::SendError(job)| job),
        None => Some(job),
    };
    if let Some(job) = unsent {
        let result = write_known(&job.objects, job.kind, job.id, (*job.data).as_ref());
        job.pending.done(result.map(drop));
        ALL.done(Ok(()));
    }
    objects
        .queued
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(id);
    Ok(id)
}

/// The bytes of a commit object, as libgit2's `git_commit_create_buffer` prints them
/// (no encoding header, the message as given), from ids the caller knows: libgit2's
/// needs the tree and the parents as objects, read from the repository, though it
/// prints only their ids.
pub fn commit_bytes(
    tree: Oid,
    parents: &[Oid],
    author: &git2::Signature<'_>,
    committer: &git2::Signature<'_>,
    message: &str,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(256 + message.len());
    let mut line = |field: &str, value: &[u8]| {
        out.extend_from_slice(field.as_bytes());
        out.push(b' ');
        out.extend_from_slice(value);
        out.push(b'\n');
    };
    line("tree", tree.to_string().as_bytes());
    for parent in parents {
        line("parent", parent.to_string().as_bytes());
    }
    for (field, signature) in [("author", author), ("committer", committer)] {
        let when = signature.when();
        let offset = when.offset_minutes();
        let sign = if offset < 0 || when.sign() == '-' {
            '-'
        } else {
            '+'
        };
        let offset = offset.unsigned_abs();
        let mut value = signature.name_bytes().to_vec();
        value.extend_from_slice(b" <");
        value.extend_from_slice(signature.email_bytes());
        // libgit2 prints the time as an unsigned 32-bit number.
        value.extend_from_slice(
            format!(
                "> {} {sign}{:02}{:02}",
                when.seconds() as u32,
                offset / 60,
                offset % 60
            )
            .as_bytes(),
        );
        line(field, &value);
    }
    out.push(b'\n');
    out.extend_from_slice(message.as_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// Big trees are written in stored blocks: around the 64 KiB block boundaries (the
    /// object's header counts), libgit2 reads each back with its entries, the file is
    /// not compressed, and `git fsck --strict` accepts them.
    #[test]
    fn big_trees_are_stored_as_git_reads_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = git2::Repository::init(dir.path()).expect("init");
        let objects = repo.path().join("objects");
        let blob = write(&objects, ObjectType::Blob, b"page\n").expect("blob");
        // 37 bytes an entry: "100644 f00000.md\0" and the id.
        let tree_of = |entries: usize| -> Vec<u8> {
            let mut bytes = Vec::new();
            for i in 0..entries {
                bytes.extend_from_slice(format!("100644 f{i:05}.md\0").as_bytes());
                bytes.extend_from_slice(blob.as_bytes());
            }
            bytes
        };
        let mut stored_trees = 0;
        for entries in [1, 442, 443, 1770, 1771, 1772, 3541, 3542, 3543, 5000] {
            let bytes = tree_of(entries);
            let id = write(&objects, ObjectType::Tree, &bytes).expect("write");
            assert_eq!(
                id,
                Oid::hash_object(ObjectType::Tree, &bytes).expect("hash")
            );
            let tree = repo.find_tree(id).expect("libgit2 reads it");
            assert_eq!(tree.len(), entries);
            let hex = id.to_string();
            let size = fs::metadata(objects.join(&hex[..2]).join(&hex[2..]))
                .expect("stat")
                .len() as usize;
            if bytes.len() >= STORE_FROM {
                assert!(
                    size > bytes.len(),
                    "{entries} entries: stored, {size} bytes"
                );
                stored_trees += 1;
            } else if entries > 100 {
                assert!(size < bytes.len(), "{entries} entries: compressed");
            }
        }
        assert!(stored_trees >= 8);
        assert_eq!(
            stored(b"", b""),
            [0x78, 0x01, 1, 0, 0, 0xff, 0xff, 0, 0, 0, 1]
        );
        crate::testing::git(dir.path(), &["fsck", "--strict", "--no-dangling"]);
    }

    /// A commit's bytes are libgit2's for the same tree, parents, signatures and
    /// message (time zones either side of UTC, several parents or none).
    #[test]
    fn commit_bytes_are_libgit2s() {
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = git2::Repository::init(dir.path()).expect("init");
        let tree = repo
            .find_tree(
                repo.treebuilder(None)
                    .expect("builder")
                    .write()
                    .expect("tree"),
            )
            .expect("tree");
        let first = git2::Signature::new("a", "a@x", &git2::Time::new(1_700_000_000, 0))
            .expect("signature");
        let parent = repo
            .find_commit(
                repo.commit(None, &first, &first, "first\n", &tree, &[])
                    .expect("commit"),
            )
            .expect("commit");
        let other = repo
            .find_commit(
                repo.commit(None, &first, &first, "other", &tree, &[&parent])
                    .expect("commit"),
            )
            .expect("commit");
        // name, email, seconds, offset (minutes), message, parents
        type Case<'c> = (
            &'c str,
            &'c str,
            i64,
            i32,
            &'c str,
            Vec<&'c git2::Commit<'c>>,
        );
        let cases: [Case<'_>; 5] = [
            (
                "alexandria",
                "alexandria@localhost",
                1_764_000_000,
                0,
                "one\n",
                vec![&parent],
            ),
            (
                "Claude Code (agent)",
                "agent@alexandria.local",
                1_764_000_123,
                60,
                "t\n\nbody",
                vec![&other],
            ),
            ("x", "y@z", 12, -330, "", vec![]),
            (
                "É l'auteur",
                "e@x",
                2_000_000_000,
                -60,
                "merge\n",
                vec![&parent, &other],
            ),
            ("n", "e", 1_764_000_000, 765, "no newline", vec![&parent]),
        ];
        // An author read from a commit written as `-0000` (git's "time zone unknown").
        let raw = format!(
            "tree {}\nauthor u <u@x> 1764000000 -0000\ncommitter u <u@x> 1764000000 -0000\n\nm\n",
            tree.id()
        );
        let unknown = repo
            .odb()
            .expect("odb")
            .write(ObjectType::Commit, raw.as_bytes())
            .expect("commit");
        let unknown = repo.find_commit(unknown).expect("commit");
        assert_eq!(unknown.author().when().sign(), '-');
        let mut authors: Vec<git2::Signature<'_>> = cases
            .iter()
            .map(|&(name, email, seconds, offset, ..)| {
                git2::Signature::new(name, email, &git2::Time::new(seconds, offset))
                    .expect("signature")
            })
            .collect();
        authors[4] = unknown.author().to_owned();
        for ((name, _, _, offset, message, parents), author) in cases.into_iter().zip(authors) {
            let committer =
                git2::Signature::now("alexandria", "alexandria@localhost").expect("signature");
            let expected = repo
                .commit_create_buffer(&author, &committer, message, &tree, &parents)
                .expect("libgit2's buffer");
            let ids: Vec<Oid> = parents.iter().map(|p| p.id()).collect();
            assert_eq!(
                String::from_utf8_lossy(&commit_bytes(
                    tree.id(),
                    &ids,
                    &author,
                    &committer,
                    message
                )),
                String::from_utf8_lossy(&expected),
                "{name} {offset}"
            );
            // Its id, hashed without collision detection, is git's.
            let bytes = commit_bytes(tree.id(), &ids, &author, &committer, message);
            let id =
                write(&repo.path().join("objects"), ObjectType::Commit, &bytes).expect("write");
            assert_eq!(
                id,
                Oid::hash_object(ObjectType::Commit, &bytes).expect("hash")
            );
            assert_eq!(
                repo.find_commit(id).expect("read").message().ok(),
                Some(message)
            );
        }
    }

    /// Blobs and trees of every size come out with git's ids, readable by libgit2 with
    /// their content, as files git accepts (`git fsck`); written again, nothing changes.
    #[test]
    fn objects_are_what_git_and_libgit2_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = git2::Repository::init(dir.path()).expect("init");
        let objects = repo.path().join("objects");
        let mut random = crate::testing::Xorshift(0x00b1_ec75);
        let mut blobs = Vec::new();
        for size in [0usize, 1, 63, 64, 1000, 70_000, 300_000] {
            let data: Vec<u8> = (0..size)
                .map(|i| {
                    if i % 7 == 0 {
                        random.below(256) as u8
                    } else {
                        b'a' + (i % 26) as u8
                    }
                })
                .collect();
            let id = write(&objects, ObjectType::Blob, &data).expect("write");
            assert_eq!(
                id,
                Oid::hash_object(ObjectType::Blob, &data).expect("hash"),
                "{size} bytes"
            );
            assert_eq!(
                repo.find_blob(id).expect("libgit2 reads it").content(),
                &data[..]
            );
            let file = objects
                .join(&id.to_string()[..2])
                .join(&id.to_string()[2..]);
            let mode = fs::metadata(&file).expect("stat").permissions().mode() & 0o777;
            assert_eq!(mode, 0o444, "read-only, as git makes them");
            let before = fs::metadata(&file).expect("stat");
            // Made old, as an object a `git gc` would prune if nothing refers to it.
            let old = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1);
            fs::File::open(&file)
                .and_then(|f| f.set_modified(old))
                .expect("set mtime");
            assert_eq!(write(&objects, ObjectType::Blob, &data).expect("again"), id);
            let after = fs::metadata(&file).expect("stat");
            assert_eq!(
                std::os::unix::fs::MetadataExt::ino(&after),
                std::os::unix::fs::MetadataExt::ino(&before),
                "not written again"
            );
            assert!(
                after.modified().expect("mtime") >= before.modified().expect("mtime"),
                "freshened, as git does"
            );
            blobs.push(id);
        }
        // Incompressible data (the stream outgrows the room first given to it), from
        // threads at once (they share the kept compressors), some after letting the
        // kept ones go.
        let written: Vec<(Oid, Vec<u8>)> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..4u64)
                .map(|t| {
                    let objects = &objects;
                    scope.spawn(move || {
                        let mut random = crate::testing::Xorshift(0x5eed + t);
                        (0..12)
                            .map(|i| {
                                if i == 6 {
                                    release_cached();
                                }
                                let size = [10, 5_000, 70_000, 2_000_000][random.below(4)];
                                let data: Vec<u8> =
                                    (0..size).map(|_| random.below(256) as u8).collect();
                                let id = write(objects, ObjectType::Blob, &data).expect("write");
                                (id, data)
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            workers
                .into_iter()
                .flat_map(|w| w.join().expect("thread"))
                .collect()
        });
        for (id, data) in &written {
            assert_eq!(
                repo.find_blob(*id).expect("libgit2 reads it").content(),
                &data[..]
            );
        }
        // A tree naming them, as libgit2 would make it.
        let mut builder = repo.treebuilder(None).expect("builder");
        for (n, id) in blobs.iter().enumerate() {
            builder
                .insert(format!("f{n}.md"), *id, 0o100644)
                .expect("insert");
        }
        let theirs = builder.write().expect("libgit2's tree");
        let bytes = repo
            .find_object(theirs, None)
            .expect("tree")
            .as_tree()
            .map(|t| {
                repo.odb()
                    .expect("odb")
                    .read(t.id())
                    .expect("read")
                    .data()
                    .to_vec()
            });
        let bytes = bytes.expect("a tree");
        fs::remove_file(
            objects
                .join(&theirs.to_string()[..2])
                .join(&theirs.to_string()[2..]),
        )
        .expect("rm");
        let ours = write(&objects, ObjectType::Tree, &bytes).expect("write tree");
        assert_eq!(ours, theirs);
        assert_eq!(repo.find_tree(ours).expect("tree").len(), blobs.len());
        // No temporary file left behind; git checks every object.
        let left: Vec<_> = walk(&objects)
            .into_iter()
            .filter(|p| p.to_string_lossy().contains("tmp_obj"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
        crate::testing::git(
            dir.path(),
            &["fsck", "--strict", "--unreachable", "--no-dangling"],
        );
        assert!(write(&objects, ObjectType::Any, b"x").is_err());
    }

    /// Objects queued on the `git-objects` thread: their ids are git's, each is
    /// counted as present at once and readable once the session settles; one that
    /// cannot be written fails `settle` (and keeps failing it), not the call that
    /// queued it.
    #[test]
    fn queued_objects_are_written_before_settle_returns() {
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = git2::Repository::init(dir.path()).expect("init");
        let objects = Objects::new(repo.path().join("objects"));
        objects.set_later(true);
        let mut ids = Vec::new();
        for i in 0..200u32 {
            let data = format!("page {i}\n")
                .repeat(1 + i as usize * 7)
                .into_bytes();
            let id =
                write_later(&objects, ObjectType::Blob, Arc::new(data.clone())).expect("queued");
            assert_eq!(id, Oid::hash_object(ObjectType::Blob, &data).expect("hash"));
            assert!(objects.queued(id));
            ids.push((id, data));
        }
        objects.settle().expect("written");
        for (id, data) in &ids {
            assert_eq!(repo.find_blob(*id).expect("read").content(), &data[..]);
        }
        // A page of 1 MiB or more is written at once, not copied into the queue.
        let big = vec![b'x'; QUEUE_BELOW];
        let id = write_later(&objects, ObjectType::Blob, Arc::new(big)).expect("big");
        assert!(repo.find_blob(id).is_ok());

        // An objects folder that cannot be made: queued fine, failed at settle.
        let file = dir.path().join("not-a-folder");
        fs::write(&file, "x").expect("file");
        let broken = Objects::new(file.join("objects"));
        broken.set_later(true);
        let id =
            write_later(&broken, ObjectType::Blob, Arc::new(b"lost".to_vec())).expect("queued");
        assert!(broken.queued(id));
        assert!(broken.settle().is_err());
        assert!(broken.settle().is_err(), "stays failed");
        // Written at once from then on: it fails there.
        broken.set_later(false);
        assert!(write_later(&broken, ObjectType::Blob, Arc::new(b"x".to_vec())).is_err());
        // Other sessions are not affected.
        let after =
            write_later(&objects, ObjectType::Blob, Arc::new(b"fine".to_vec())).expect("queued");
        objects.settle().expect("written");
        assert!(repo.find_blob(after).is_ok());
    }

    fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
        let mut found = Vec::new();
        for entry in fs::read_dir(dir).expect("read_dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                found.extend(walk(&path));
            } else {
                found.push(path);
            }
        }
        found
    }
}
