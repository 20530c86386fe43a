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
/// none. Reads only the directories along the path.
pub fn conflicting_path(root: &Path, relative: &str) -> io::Result<Option<String>> {
    let mut dir = root.to_path_buf();
    let mut prefix = String::new();
    for component in relative.split('/').filter(|c| !c.is_empty()) {
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut exact = false;
        let mut other = None;
        for entry in entries {
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
}
