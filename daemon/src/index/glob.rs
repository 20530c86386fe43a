//! Path globs of the tools (`wiki/**/*.md`, `raw/*.{pdf,md}`): globset's syntax (with
//! `*` never crossing `/`), matched by a lazy DFA that is built as it is used.
//!
//! globset's matcher compiles a full regex engine per glob (about 80 µs here: more than
//! the rest of a glob read of 10 pages), and agents rarely repeat a glob; a forward
//! lazy DFA over the same regex builds in under 10 µs and matches a path in tens of
//! nanoseconds. A glob of literal characters and single `*`s (`wiki/d1/p*.md`, most
//! of what agents send) needs no automaton at all: it is matched segment by segment
//! (building the lazy DFA was still 14 % of a glob read of 10 pages at 10k).

use std::cell::{OnceCell, RefCell};
use std::sync::Arc;

use regex_automata::hybrid::dfa::{Cache, DFA};
use regex_automata::nfa::thompson;
use regex_automata::util::syntax;
use regex_automata::{Anchored, Input};

/// A compiled path glob.
pub struct PathGlob {
    /// The pattern, when it has no wildcard but single `*`s (`simple`).
    simple: Option<Arc<str>>,
    /// None: the regex did not build as a lazy DFA, or the glob is simple (globset's
    /// matcher answers if neither holds).
    dfa: Option<Arc<DFA>>,
    cache: RefCell<Option<Cache>>,
    /// globset's form of the glob; None for a simple one, which globset never sees
    /// (building it was most of compiling a glob: a glob batch of the benchmark, each
    /// call in another folder, spent 4.4 % of the daemon's samples in it).
    glob: Option<globset::Glob>,
    /// globset's own matcher, built only if the lazy DFA gives up on a path.
    fallback: OnceCell<globset::GlobMatcher>,
}

impl PathGlob {
    /// Compile `pattern`; `*` and `?` never match `/`.
    pub fn new(pattern: &str) -> Result<PathGlob, globset::Error> {
        // Without `?`, classes, alternatives, escapes or `**`, globset has nothing to
        // refuse: its errors are about those.
        if is_simple(pattern) {
            return Ok(PathGlob {
                simple: Some(Arc::from(pattern)),
                dfa: None,
                cache: RefCell::new(None),
                glob: None,
                fallback: OnceCell::new(),
            });
        }
        let glob = globset::GlobBuilder::new(pattern)
            .literal_separator(true)
            .build()?;
        let dfa = DFA::builder()
            .syntax(syntax::Config::new().utf8(false))
            .thompson(thompson::Config::new().utf8(false).shrink(false))
            .build(glob.regex());
        let dfa = dfa.ok().map(Arc::new);
        let cache = RefCell::new(dfa.as_ref().map(|d| d.create_cache()));
        let built = PathGlob {
            simple: None,
            dfa,
            cache,
            glob: Some(glob),
            fallback: OnceCell::new(),
        };
        Ok(built)
    }

    /// Whether `path` (workspace-relative) matches the whole glob.
    pub fn is_match(&self, path: &str) -> bool {
        if let Some(pattern) = &self.simple {
            return simple_match(pattern, path);
        }
        let input = Input::new(path.as_bytes()).anchored(Anchored::Yes);
        let found = match (&self.dfa, self.cache.try_borrow_mut()) {
            (Some(dfa), Ok(mut cache)) => match cache.as_mut() {
                Some(cache) => dfa.try_search_fwd(cache, &input),
                None => return self.fallback_match(path),
            },
            _ => return self.fallback_match(path),
        };
        match found {
            Ok(found) => found.is_some(),
            Err(_) => self.fallback_match(path),
        }
    }

    /// globset's own matcher (every glob that is not simple has globset's form).
    fn fallback_match(&self, path: &str) -> bool {
        self.glob.as_ref().is_some_and(|glob| {
            self.fallback
                .get_or_init(|| glob.compile_matcher())
                .is_match(path)
        })
    }
}

impl Clone for PathGlob {
    fn clone(&self) -> PathGlob {
        PathGlob {
            simple: self.simple.clone(),
            dfa: self.dfa.clone(),
            cache: RefCell::new(self.dfa.as_ref().map(|d| d.create_cache())),
            glob: self.glob.clone(),
            fallback: OnceCell::new(),
        }
    }
}

/// Whether `pattern` has no wildcard but single `*`s (no `**`, `?`, classes,
/// alternatives or escapes).
fn is_simple(pattern: &str) -> bool {
    !pattern.contains("**") && !pattern.contains(['?', '[', ']', '{', '}', '\\'])
}

/// A simple glob against `path`: as many segments, each matched with `*` standing for
/// any run of characters (never `/`: the segments have none).
fn simple_match(pattern: &str, path: &str) -> bool {
    let mut patterns = pattern.split('/');
    let mut paths = path.split('/');
    loop {
        match (patterns.next(), paths.next()) {
            (None, None) => return true,
            (Some(p), Some(s)) if segment_match(p.as_bytes(), s.as_bytes()) => {}
            _ => return false,
        }
    }
}

/// One segment: literal bytes and `*` (any run of bytes), by the usual greedy match
/// that goes back to the last `*` on a mismatch.
fn segment_match(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, t));
            p += 1;
        } else if p < pattern.len() && pattern[p] == text[t] {
            p += 1;
            t += 1;
        } else if let Some((star_p, star_t)) = star {
            p = star_p + 1;
            t = star_t + 1;
            star = Some((star_p, star_t + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&b| b == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lazy DFA says what globset's own matcher says.
    #[test]
    fn matches_as_globset_does() {
        let patterns = [
            "wiki/**",
            "wiki/*.md",
            "wiki/**/*.md",
            "wiki/d1/*.md",
            "raw/*.{pdf,md}",
            "wiki/p?.md",
            "wiki/[ab]*.md",
            "wiki/[!a]*.md",
            "raw/sources/**/notes*",
            "wiki/caf\u{e9}/*.md",
            "wiki/exact.md",
        ];
        let paths = [
            "wiki/index.md",
            "wiki/d1/p1.md",
            "wiki/d1/sub/p2.md",
            "wiki/p1.md",
            "wiki/pp.md",
            "wiki/a.md",
            "wiki/b.md",
            "wiki/c.md",
            "raw/paper.pdf",
            "raw/notes.md",
            "raw/x/paper.pdf",
            "raw/sources/feed/notes-1.md",
            "wiki/caf\u{e9}/x.md",
            "wiki/exact.md",
            "wiki/exact.mdx",
            "wiki",
        ];
        for pattern in patterns {
            let ours = PathGlob::new(pattern).expect("glob");
            let theirs = globset::GlobBuilder::new(pattern)
                .literal_separator(true)
                .build()
                .expect("glob")
                .compile_matcher();
            for path in paths {
                assert_eq!(
                    ours.is_match(path),
                    theirs.is_match(path),
                    "{pattern} against {path}"
                );
                assert_eq!(ours.clone().is_match(path), theirs.is_match(path));
            }
        }
        assert!(PathGlob::new("wiki/[").is_err());
    }

    /// Simple globs (literals and single `*`s), matched without an automaton, say what
    /// globset says, over patterns and paths made from a small alphabet (every
    /// combination up to a few characters, `/` included).
    #[test]
    fn simple_globs_match_as_globset_does() {
        let alphabet = ["a", "b", "*", "/", ".", "\u{e9}"];
        let words = |max: usize, with_star: bool| {
            let mut all = vec![String::new()];
            let mut last = vec![String::new()];
            for _ in 0..max {
                let mut next = Vec::new();
                for word in &last {
                    for piece in alphabet {
                        if piece != "*" || with_star {
                            next.push(format!("{word}{piece}"));
                        }
                    }
                }
                all.extend(next.iter().cloned());
                last = next;
            }
            all
        };
        let patterns: Vec<String> = words(4, true)
            .into_iter()
            .filter(|p| !p.is_empty() && is_simple(p))
            .collect();
        let paths = words(4, false);
        let mut checked = 0;
        for pattern in &patterns {
            let ours = PathGlob::new(pattern).expect("glob");
            assert!(ours.simple.is_some(), "{pattern}");
            let theirs = globset::GlobBuilder::new(pattern)
                .literal_separator(true)
                .build()
                .expect("glob")
                .compile_matcher();
            for path in &paths {
                assert_eq!(
                    ours.is_match(path),
                    theirs.is_match(path),
                    "{pattern:?} against {path:?}"
                );
                checked += 1;
            }
        }
        assert!(checked > 1_000_000, "{checked}");
        for pattern in [
            "wiki/**",
            "wiki/p?.md",
            "raw/*.{pdf,md}",
            "wiki/[ab]*",
            "a\\*",
        ] {
            assert!(
                PathGlob::new(pattern).expect("glob").simple.is_none(),
                "{pattern}"
            );
        }
    }
}
