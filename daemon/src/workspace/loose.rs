//! Loose objects written by the daemon (issue 15): the blobs, trees and commits of its
//! commits, as libgit2's loose backend writes them (zlib at its fastest level, mode
//! 0444, a temporary file renamed into place), without what `git_odb_write` does
//! around a write: it tries to "freshen" an existing copy (a `utime` that fails for
//! every new object), then re-reads the pack directory (open, list,
//! `multi-pack-index`) because the object was in no pack it knew. With 8 writers at
//! 10k pages `git_odb_write` was a fifth of the daemon's CPU time.
//!
//! The id is libgit2's hash (`Oid::hash_object`): its SHA-1 detects the collision
//! attacks (SHAttered), so two crafted pages can never pass for one object, as in git.
//!
//! An object found loose already is not written again. One that exists only in a pack
//! is written loose once more: the same content under the same name, which git's next
//! `gc` drops.

use std::fs::{self, OpenOptions};
use std::io::{self, ErrorKind, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use flate2::Compression;
use flate2::write::ZlibEncoder;
use git2::{ObjectType, Oid};

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
    let id = Oid::hash_object(kind, data).map_err(io::Error::other)?;
    let hex = id.to_string();
    let dir = objects.join(&hex[..2]);
    let path = dir.join(&hex[2..]);
    if fs::symlink_metadata(&path).is_ok() {
        return Ok(id);
    }
    let mut encoder =
        ZlibEncoder::new(Vec::with_capacity(data.len() / 2 + 64), Compression::fast());
    encoder.write_all(header.as_bytes())?;
    encoder.write_all(data)?;
    let compressed = encoder.finish()?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

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
            let modified = fs::metadata(&file)
                .and_then(|m| m.modified())
                .expect("mtime");
            assert_eq!(write(&objects, ObjectType::Blob, &data).expect("again"), id);
            assert_eq!(
                fs::metadata(&file)
                    .and_then(|m| m.modified())
                    .expect("mtime"),
                modified,
                "not written again"
            );
            blobs.push(id);
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
