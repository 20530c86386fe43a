//! Path globs of the tools (`wiki/**/*.md`, `raw/*.{pdf,md}`): globset's syntax (with
//! `*` never crossing `/`), matched by a lazy DFA that is built as it is used.
//!
//! globset's matcher compiles a full regex engine per glob (about 80 µs here: more than
//! the rest of a glob read of 10 pages), and agents rarely repeat a glob; a forward
//! lazy DFA over the same regex builds in under 10 µs and matches a path in tens of
//! nanoseconds.

use std::cell::{OnceCell, RefCell};
use std::sync::Arc;

use regex_automata::hybrid::dfa::{Cache, DFA};
use regex_automata::nfa::thompson;
use regex_automata::util::syntax;
use regex_automata::{Anchored, Input};

/// A compiled path glob.
pub struct PathGlob {
    /// None: the regex did not build as a lazy DFA (globset's matcher answers).
    dfa: Option<Arc<DFA>>,
    cache: RefCell<Option<Cache>>,
    glob: globset::Glob,
    /// globset's own matcher, built only if the lazy DFA gives up on a path.
    fallback: OnceCell<globset::GlobMatcher>,
}

impl PathGlob {
    /// Compile `pattern`; `*` and `?` never match `/`.
    pub fn new(pattern: &str) -> Result<PathGlob, globset::Error> {
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
            dfa,
            cache,
            glob,
            fallback: OnceCell::new(),
        };
        Ok(built)
    }

    /// Whether `path` (workspace-relative) matches the whole glob.
    pub fn is_match(&self, path: &str) -> bool {
        let input = Input::new(path.as_bytes()).anchored(Anchored::Yes);
        let found = match (&self.dfa, self.cache.try_borrow_mut()) {
            (Some(dfa), Ok(mut cache)) => match cache.as_mut() {
                Some(cache) => dfa.try_search_fwd(cache, &input),
                None => return self.fallback().is_match(path),
            },
            _ => return self.fallback().is_match(path),
        };
        match found {
            Ok(found) => found.is_some(),
            Err(_) => self.fallback().is_match(path),
        }
    }

    fn fallback(&self) -> &globset::GlobMatcher {
        self.fallback.get_or_init(|| self.glob.compile_matcher())
    }
}

impl Clone for PathGlob {
    fn clone(&self) -> PathGlob {
        PathGlob {
            dfa: self.dfa.clone(),
            cache: RefCell::new(self.dfa.as_ref().map(|d| d.create_cache())),
            glob: self.glob.clone(),
            fallback: OnceCell::new(),
        }
    }
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
}
