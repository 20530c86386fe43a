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

use std::fs::{self, OpenOptions};
use std::io::{self, ErrorKind, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

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

/// Write `data` as a loose object of `kind` into `objects` (a repository's
/// `.git/objects`); its id, which is git's (`git hash-object`).
pub fn write(objects: &Path, kind: ObjectType, data: &[u8]) -> io::Result<Oid> {
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
    let header = format!("{name} {}\0", data.len());
    let id = match kind {
        ObjectType::Tree | ObjectType::Commit => composed_id(header.as_bytes(), data)?,
        _ => Oid::hash_object(kind, data).map_err(io::Error::other)?,
    };
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
