//! The trees of the daemon's commits, written by the daemon (issue 15).
//!
//! libgit2's `git_tree_create_updated` builds every tree along a changed path from
//! scratch at each commit: it inflates and parses the tree, allocates an entry per name,
//! sorts them all, prints each one and hashes the result. With thousands of pages in a
//! folder that was a third of a write's CPU with 8 writers, most of it for entries the
//! commit did not touch. Here a tree is its serialized bytes with where each entry lies;
//! an update splices the changed entries into those bytes (unchanged entries are copied
//! in runs), and the trees a commit wrote are kept, by id, for the next commit, whose
//! base they are. Ids name contents, so what is kept never goes stale: a kept tree is
//! used only when the new commit's base refers to it by id.
//!
//! The result is exactly libgit2's (a test compares the two on random updates). Anything
//! this does not handle the way libgit2 does (a conflict between a file and a folder, a
//! path given twice or removed while absent, a mode written with a leading zero, a name
//! libgit2 would refuse) makes `update` answer `None`, and the caller lets libgit2 do the
//! commit's trees, with libgit2's errors.

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use git2::{ObjectType, Oid, Repository};

use super::loose;

/// Trees kept per repository, in bytes, before they are all let go.
const KEPT_BYTES: usize = 16 << 20;
const HASH: usize = 20;
const TREE_MODE: u32 = 0o040000;
const BLOB_MODE: u32 = 0o100644;

/// A tree as git stores it, with its entries located.
struct Tree {
    bytes: Vec<u8>,
    entries: Vec<Span>,
}

impl AsRef<[u8]> for Tree {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

/// One entry of `Tree::bytes`: `<mode> <name>\0<id>`.
#[derive(Clone, Copy)]
struct Span {
    start: u32,
    name: u32,
    /// Where the name ends (its NUL); the id follows.
    name_end: u32,
    dir: bool,
}

impl Span {
    fn name<'a>(&self, bytes: &'a [u8]) -> &'a [u8] {
        &bytes[self.name as usize..self.name_end as usize]
    }

    fn end(&self) -> usize {
        self.name_end as usize + 1 + HASH
    }

    fn id(&self, bytes: &[u8]) -> Option<Oid> {
        let at = self.name_end as usize + 1;
        Oid::from_bytes(&bytes[at..at + HASH]).ok()
    }
}

impl Tree {
    /// The entries of a tree object, or None when one is not as libgit2 would write it
    /// again (a mode with a leading zero or not octal, an empty name, a name with `/`).
    fn parse(bytes: Vec<u8>) -> Option<Tree> {
        let mut entries = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let space = at + bytes[at..].iter().position(|&b| b == b' ')?;
            let mode = &bytes[at..space];
            if mode.is_empty() || mode.len() > 6 || mode[0] == b'0' {
                return None;
            }
            let mut value = 0u32;
            for &digit in mode {
                if !(b'0'..=b'7').contains(&digit) {
                    return None;
                }
                value = value * 8 + u32::from(digit - b'0');
            }
            let name = space + 1;
            let name_end = name + bytes[name..].iter().position(|&b| b == 0)?;
            if name_end == name || bytes[name..name_end].contains(&b'/') {
                return None;
            }
            let end = name_end + 1 + HASH;
            if end > bytes.len() {
                return None;
            }
            entries.push(Span {
                start: u32::try_from(at).ok()?,
                name: u32::try_from(name).ok()?,
                name_end: u32::try_from(name_end).ok()?,
                dir: value & 0o170000 == TREE_MODE,
            });
            at = end;
        }
        Some(Tree { bytes, entries })
    }

    /// The entry named `name`, if any.
    fn find(&self, name: &[u8]) -> Option<usize> {
        // Its place depends on whether it is a folder: look at both.
        [false, true].into_iter().find_map(|dir| {
            let at = self.place(name, dir);
            (at < self.entries.len() && self.entries[at].name(&self.bytes) == name).then_some(at)
        })
    }

    /// Where an entry `name` (a folder if `dir`) goes among the entries.
    fn place(&self, name: &[u8], dir: bool) -> usize {
        self.entries.partition_point(|span| {
            git_order(span.name(&self.bytes), span.dir, name, dir) == Ordering::Less
        })
    }
}

/// Git's order of tree entries: names compared as bytes, a folder's as if it ended in
/// `/`.
fn git_order(a: &[u8], a_dir: bool, b: &[u8], b_dir: bool) -> Ordering {
    let n = a.len().min(b.len());
    match a[..n].cmp(&b[..n]) {
        Ordering::Equal => {}
        other => return other,
    }
    let next = |name: &[u8], dir: bool| match name.get(n) {
        Some(&byte) => byte,
        None if dir => b'/',
        None => 0,
    };
    next(a, a_dir).cmp(&next(b, b_dir))
}

/// A name libgit2's tree builder surely takes. Every path is checked more strictly
/// before it reaches a commit; this only keeps the two builders in agreement, leaving to
/// libgit2 every name its `.git` rules (NTFS short names like `GIT~1`, HFS's ignored
/// characters) could be about: those that start with a dot or hold a `~`.
fn plain_name(name: &[u8]) -> bool {
    !name.is_empty()
        && name[0] != b'.'
        && !name.contains(&0)
        && !name.contains(&b'/')
        && !name.contains(&b'~')
}

/// The trees kept for one repository.
#[derive(Default)]
struct Kept {
    trees: HashMap<Oid, Arc<Tree>>,
    bytes: usize,
    /// The daemon's last commit and its tree (the next session's base, usually).
    commit: Option<(Oid, Oid)>,
}

impl Kept {
    fn keep(&mut self, id: Oid, tree: Arc<Tree>) {
        let size = tree.bytes.len() + tree.entries.len() * std::mem::size_of::<Span>();
        if self.bytes + size > KEPT_BYTES {
            self.trees.clear();
            self.bytes = 0;
        }
        if self.trees.insert(id, tree).is_none() {
            self.bytes += size;
        }
    }

    fn tree(&mut self, repo: &Repository, id: Oid) -> Result<Option<Arc<Tree>>, git2::Error> {
        if let Some(tree) = self.trees.get(&id) {
            return Ok(Some(Arc::clone(tree)));
        }
        // Not kept: read from the repository, once every queued object is written.
        loose::drain();
        let odb = repo.odb()?;
        let object = odb.read(id)?;
        if object.kind() != ObjectType::Tree {
            return Ok(None);
        }
        let Some(tree) = Tree::parse(object.data().to_vec()) else {
            return Ok(None);
        };
        let tree = Arc::new(tree);
        self.keep(id, Arc::clone(&tree));
        Ok(Some(tree))
    }
}

static KEPT: Mutex<BTreeMap<PathBuf, Kept>> = Mutex::new(BTreeMap::new());

/// Remember that `commit`'s tree is `tree` (a commit the daemon just made).
pub fn remember_commit(repo: &Repository, commit: Oid, tree: Oid) {
    KEPT.lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(repo.path().to_path_buf())
        .or_default()
        .commit = Some((commit, tree));
}

/// The tree of `commit` if it is the last one `remember_commit` was told of.
pub fn remembered_tree(repo: &Repository, commit: Oid) -> Option<Oid> {
    KEPT.lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(repo.path())
        .and_then(|kept| kept.commit)
        .and_then(|(made, tree)| (made == commit).then_some(tree))
}

/// Let go of every kept tree (the daemon has gone quiet).
pub fn release_cached() {
    KEPT.lock().unwrap_or_else(|p| p.into_inner()).clear();
}

/// The id of what `path` names in the tree `root` (`Tree::get_path`'s entry id), read
/// through the kept trees: the trees of the daemon's last commits are kept parsed, so a
/// write's look-up of its page's committed version reads no object (libgit2 inflated
/// and parsed every tree along the path, the big folder's too: 5 % of a write's CPU with
/// 8 writers at 10k pages). Some(None): nothing there. None for libgit2 to answer (a
/// name `update` leaves to it, a tree it cannot parse).
pub fn entry_at(
    repo: &Repository,
    root: Oid,
    path: &str,
) -> Result<Option<Option<Oid>>, git2::Error> {
    let parts: Vec<&[u8]> = path.split('/').map(str::as_bytes).collect();
    if !parts.iter().all(|p| plain_name(p)) {
        return Ok(None);
    }
    with_kept(repo, |kept| {
        let mut at = root;
        for (depth, name) in parts.iter().enumerate() {
            let Some(tree) = kept.tree(repo, at)? else {
                return Ok(None);
            };
            let Some(i) = tree.find(name) else {
                return Ok(Some(None));
            };
            let span = tree.entries[i];
            let Some(id) = span.id(&tree.bytes) else {
                return Ok(None);
            };
            if depth + 1 == parts.len() {
                return Ok(Some(Some(id)));
            }
            if !span.dir {
                // A file where the path goes on: nothing there.
                return Ok(Some(None));
            }
            at = id;
        }
        Ok(None)
    })
}

/// `f` with the repository's kept trees, taken out of the map meanwhile (the map's lock
/// is not held while trees are read or written) and put back after.
fn with_kept<T>(repo: &Repository, f: impl FnOnce(&mut Kept) -> T) -> T {
    let key = repo.path().to_path_buf();
    let mut kept = KEPT
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&key)
        .unwrap_or_default();
    let result = f(&mut kept);
    KEPT.lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key, kept);
    result
}

/// What a commit changes at one path: a blob (mode 100644) put there, or removed.
pub type Change<'a> = (&'a str, Option<Oid>);

/// The tree `base` with `changes` applied, as libgit2's `git_tree_create_updated` makes
/// it (folders left empty are removed, the root stays), and every tree written for it
/// (the root and the folders along the changed paths). None when libgit2 has to do it
/// (see the module's note).
pub fn update(
    objects: &loose::Objects,
    repo: &Repository,
    base: Oid,
    changes: &[Change<'_>],
) -> Result<Option<(Oid, Vec<Oid>)>, git2::Error> {
    let mut paths = Vec::with_capacity(changes.len());
    for &(path, blob) in changes {
        let parts: Vec<&[u8]> = path.split('/').map(str::as_bytes).collect();
        if !parts.iter().all(|p| plain_name(p)) {
            return Ok(None);
        }
        paths.push((parts, blob));
    }
    let paths: Vec<Path<'_>> = paths
        .iter()
        .map(|(parts, blob)| (parts.as_slice(), *blob))
        .collect();
    let mut written = Vec::new();
    let result = with_kept(repo, |kept| {
        Writer {
            repo,
            objects,
            kept,
            written: &mut written,
        }
        .level(Some(base), &paths, 0)
    });
    Ok(match result? {
        Some(Some(id)) => Some((id, written)),
        // Everything removed: an empty root, as libgit2 writes it.
        Some(None) => {
            let id = loose::write(&repo.path().join("objects"), ObjectType::Tree, b"")
                .map_err(|e| git2::Error::from_str(&format!("writing a tree: {e}")))?;
            written.push(id);
            Some((id, written))
        }
        None => None,
    })
}

struct Writer<'r, 'k> {
    repo: &'r Repository,
    objects: &'k loose::Objects,
    kept: &'k mut Kept,
    written: &'k mut Vec<Oid>,
}

/// A changed path as its components, and the blob put there (None: removed).
type Path<'p> = (&'p [&'p [u8]], Option<Oid>);

/// What happens to one name of a folder.
enum Op<'p> {
    /// A blob put there, or the entry removed.
    Leaf(Option<Oid>),
    /// Changes below it.
    Below(Vec<Path<'p>>),
}

impl Writer<'_, '_> {
    /// The folder `base` with the changes at `depth` of `paths` applied: Some(Some(id))
    /// written, Some(None) left empty, None for libgit2 to do.
    fn level<'p>(
        &mut self,
        base: Option<Oid>,
        paths: &[Path<'p>],
        depth: usize,
    ) -> Result<Option<Option<Oid>>, git2::Error> {
        let mut ops: BTreeMap<&[u8], Op<'p>> = BTreeMap::new();
        for &(parts, blob) in paths {
            let name = parts[depth];
            let leaf = depth + 1 == parts.len();
            match (ops.get_mut(name), leaf) {
                (None, true) => {
                    ops.insert(name, Op::Leaf(blob));
                }
                (None, false) => {
                    ops.insert(name, Op::Below(vec![(parts, blob)]));
                }
                (Some(Op::Below(below)), false) => below.push((parts, blob)),
                // A path twice, or a file and a folder of one name: libgit2's to refuse.
                _ => return Ok(None),
            }
        }
        let tree = match base {
            Some(id) => match self.kept.tree(self.repo, id)? {
                Some(tree) => tree,
                None => return Ok(None),
            },
            None => Arc::new(Tree {
                bytes: Vec::new(),
                entries: Vec::new(),
            }),
        };
        // The entries replaced or removed, and the new ones with where they go.
        let mut removed: Vec<usize> = Vec::new();
        let mut added: Vec<(usize, &[u8], bool, Vec<u8>)> = Vec::new();
        for (name, op) in ops {
            let existing = tree.find(name);
            let existing_dir = existing.map(|i| tree.entries[i].dir);
            let new = match op {
                Op::Leaf(Some(blob)) => {
                    // libgit2 refuses an entry for an object the repository lacks.
                    if existing_dir == Some(true)
                        || !(self.objects.queued(blob) || self.repo.odb()?.exists(blob))
                    {
                        return Ok(None);
                    }
                    Some((BLOB_MODE, blob))
                }
                Op::Leaf(None) => {
                    if existing.is_none() {
                        return Ok(None);
                    }
                    None
                }
                Op::Below(below) => {
                    if existing_dir == Some(false) {
                        return Ok(None);
                    }
                    let sub = existing.and_then(|i| tree.entries[i].id(&tree.bytes));
                    match self.level(sub, &below, depth + 1)? {
                        None => return Ok(None),
                        Some(Some(id)) => Some((TREE_MODE, id)),
                        Some(None) if existing.is_some() => None,
                        Some(None) => return Ok(None),
                    }
                }
            };
            if let Some(i) = existing {
                removed.push(i);
            }
            if let Some((mode, id)) = new {
                let mut entry = format!("{mode:o} ").into_bytes();
                entry.extend_from_slice(name);
                entry.push(0);
                entry.extend_from_slice(id.as_bytes());
                let dir = mode == TREE_MODE;
                added.push((tree.place(name, dir), name, dir, entry));
            }
        }
        removed.sort_unstable();
        // New entries that go to one place are in git's order among themselves (`a.md`
        // before the folder `a`), not in their names' order.
        added.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| git_order(a.1, a.2, b.1, b.2)));
        let count = tree.entries.len() - removed.len() + added.len();
        if count == 0 {
            return Ok(Some(None));
        }
        let mut out = Tree {
            bytes: Vec::with_capacity(
                tree.bytes.len() + added.iter().map(|a| a.3.len()).sum::<usize>(),
            ),
            entries: Vec::with_capacity(count),
        };
        let copy = |from: usize, to: usize, out: &mut Tree| {
            if from < to {
                let start = tree.entries[from].start as usize;
                let end = tree.entries[to - 1].end();
                let by = out.bytes.len() as i64 - start as i64;
                out.bytes.extend_from_slice(&tree.bytes[start..end]);
                out.entries
                    .extend(tree.entries[from..to].iter().map(|s| Span {
                        start: (i64::from(s.start) + by) as u32,
                        name: (i64::from(s.name) + by) as u32,
                        name_end: (i64::from(s.name_end) + by) as u32,
                        dir: s.dir,
                    }));
            }
        };
        let mut stops: Vec<usize> = removed.clone();
        stops.extend(added.iter().map(|a| a.0));
        stops.sort_unstable();
        stops.dedup();
        let mut next_added = added.iter().peekable();
        let mut cursor = 0;
        for stop in stops {
            copy(cursor, stop, &mut out);
            cursor = stop;
            while let Some((_, _, dir, entry)) = next_added.next_if(|a| a.0 == stop) {
                let start = out.bytes.len();
                let name = start + entry.iter().position(|&b| b == b' ').unwrap_or(0) + 1;
                let name_end = start + entry.len() - 1 - HASH;
                out.bytes.extend_from_slice(entry);
                out.entries.push(Span {
                    start: start as u32,
                    name: name as u32,
                    name_end: name_end as u32,
                    dir: *dir,
                });
            }
            if removed.binary_search(&stop).is_ok() {
                cursor = stop + 1;
            }
        }
        copy(cursor, tree.entries.len(), &mut out);
        let out = Arc::new(out);
        let id = loose::write_later(self.objects, ObjectType::Tree, Arc::clone(&out) as _)
            .map_err(|e| git2::Error::from_str(&format!("writing a tree: {e}")))?;
        self.written.push(id);
        self.kept.keep(id, out);
        Ok(Some(Some(id)))
    }
}

/// The root of a repository's kept trees (tests).
#[cfg(test)]
fn kept_count(repo: &Repository) -> usize {
    KEPT.lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(repo.path())
        .map_or(0, |k| k.trees.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use git2::FileMode;

    /// libgit2's tree for the same update, or its error.
    fn libgit2(repo: &Repository, base: Oid, changes: &[Change<'_>]) -> Result<Oid, git2::Error> {
        let mut update = git2::build::TreeUpdateBuilder::new();
        for &(path, blob) in changes {
            match blob {
                Some(id) => update.upsert(path, id, FileMode::Blob),
                None => update.remove(path),
            };
        }
        update.create_updated(repo, &repo.find_tree(base)?)
    }

    #[test]
    fn updates_make_the_trees_libgit2_makes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = Repository::init(dir.path()).expect("init");
        let objects = loose::Objects::new(repo.path().join("objects"));
        // Names whose order differs between bytes and git's folder rule; `a` is both a
        // file and a folder name, for some conflicts.
        let folders = ["a", "a-b", "a0", "B", "é", "a b", "ab.d"];
        let files = ["a.md", "b.md", "z", "ab", "a_", "é.md", "a"];
        let blobs: Vec<Oid> = (0..8)
            .map(|i| repo.blob(format!("blob {i}\n").as_bytes()).expect("blob"))
            .collect();
        let mut base = repo
            .odb()
            .expect("odb")
            .write(ObjectType::Tree, b"")
            .expect("empty tree");
        let mut rng = crate::testing::Xorshift(0x9e37_79b9_7f4a_7c15);
        let (mut ours, mut refused, mut looked) = (0, 0, 0);
        for round in 0..1500 {
            let mut paths: Vec<String> = Vec::new();
            for _ in 0..1 + rng.below(4) {
                let depth = 1 + rng.below(3);
                let mut parts: Vec<&str> = (1..depth)
                    .map(|_| folders[rng.below(folders.len())])
                    .collect();
                parts.push(files[rng.below(files.len())]);
                paths.push(parts.join("/"));
            }
            let changes: Vec<Change<'_>> = paths
                .iter()
                .map(|p| {
                    let blob = (rng.below(4) != 0).then(|| blobs[rng.below(blobs.len())]);
                    (p.as_str(), blob)
                })
                .collect();
            let expected = libgit2(&repo, base, &changes);
            match update(&objects, &repo, base, &changes).expect("update") {
                Some((id, written)) => {
                    ours += 1;
                    let expected = expected.unwrap_or_else(|e| {
                        panic!("round {round}: {changes:?}: libgit2 refused ({e}), ours made {id}")
                    });
                    assert_eq!(id, expected, "round {round}: {changes:?}");
                    assert_eq!(written.last(), Some(&id), "the root is written last");
                    // Look-ups through the kept trees answer what libgit2's do, for
                    // the paths changed and their folders.
                    let tree = repo.find_tree(id).expect("tree");
                    for path in &paths {
                        let mut prefix = path.as_str();
                        loop {
                            let expected = tree
                                .get_path(std::path::Path::new(prefix))
                                .ok()
                                .map(|e| e.id());
                            assert_eq!(
                                entry_at(&repo, id, prefix).expect("entry_at"),
                                Some(expected),
                                "round {round}: {prefix}"
                            );
                            looked += 1;
                            match prefix.rfind('/') {
                                Some(at) => prefix = &prefix[..at],
                                None => break,
                            }
                        }
                        // Below a file, or nothing there.
                        let below = format!("{path}/below.md");
                        assert!(tree.get_path(std::path::Path::new(&below)).is_err());
                        assert_eq!(
                            entry_at(&repo, id, &below).expect("entry_at"),
                            Some(None),
                            "round {round}: {below}"
                        );
                    }
                    for tree in &written {
                        assert!(repo.find_tree(*tree).is_ok(), "{tree} was written");
                    }
                    base = id;
                }
                None => {
                    // Left to libgit2 only what libgit2 refuses too (plain names here).
                    refused += 1;
                    // A path that is another's folder in one update (libgit2 goes on
                    // in its own way; the daemon never asks for that).
                    let overlap = changes
                        .iter()
                        .any(|(a, _)| changes.iter().any(|(b, _)| b.starts_with(&format!("{a}/"))));
                    if let (Ok(id), false) = (expected, overlap) {
                        panic!("round {round}: {changes:?}: libgit2 made {id}, ours left it");
                    }
                }
            }
        }
        // Most updates are ours; the rest are the conflicts left to libgit2.
        assert!(ours > 500, "ours {ours}, refused {refused}");
        assert!(looked > 1000, "{looked} look-ups");
        assert!(refused > 0, "the conflicts were exercised");
        assert!(kept_count(&repo) > 0);
    }

    #[test]
    fn trees_libgit2_would_write_otherwise_are_left_to_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = Repository::init(dir.path()).expect("init");
        let objects = loose::Objects::new(repo.path().join("objects"));
        let blob = repo.blob(b"x\n").expect("blob");
        let odb = repo.odb().expect("odb");
        // A mode with a leading zero, as some old tools wrote trees.
        let mut padded = b"0100644 a.md\0".to_vec();
        padded.extend_from_slice(blob.as_bytes());
        let base = odb.write(ObjectType::Tree, &padded).expect("tree");
        assert!(
            update(&objects, &repo, base, &[("b.md", Some(blob))])
                .expect("update")
                .is_none()
        );
        let mut plain = b"100644 a.md\0".to_vec();
        plain.extend_from_slice(blob.as_bytes());
        let base = odb.write(ObjectType::Tree, &plain).expect("tree");
        for changes in [
            vec![("a.md/b.md", Some(blob))],
            vec![("gone.md", None)],
            vec![("b.md", Some(blob)), ("b.md", None)],
            vec![(".git/config", Some(blob))],
            vec![("x//y.md", Some(blob))],
        ] {
            assert!(
                update(&objects, &repo, base, &changes)
                    .expect("update")
                    .is_none(),
                "{changes:?}"
            );
        }
        let (id, _) = update(&objects, &repo, base, &[("a.md", None)])
            .expect("update")
            .expect("ours");
        assert_eq!(
            id,
            libgit2(&repo, base, &[("a.md", None)]).expect("libgit2")
        );
        assert_eq!(repo.find_tree(id).expect("tree").len(), 0);
    }
}
