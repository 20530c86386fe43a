//! Which command a client entry runs to start `alexandria`: normally the absolute path of
//! this executable, but not when that path lives in a cache that can vanish.
//!
//! `uvx alexandria …` runs alexandria from uv's cache (`<cache>/archive-v0/<id>/bin/`),
//! which `uv cache clean` or uv's own pruning removes; an entry naming that path would
//! stop working. For such a run the entry says `uvx alexandria mcp serve …` instead, which
//! re-creates the environment when it is gone. `pip`, `pipx install` and `uv tool install`
//! put alexandria in a directory that lasts, so their path is written as it is.

use std::path::{Path, PathBuf};

/// The command of an entry: `command` followed by `prefix`, then `mcp serve …`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launcher {
    pub command: String,
    /// Arguments before `mcp serve` (`["alexandria"]` for uvx).
    pub prefix: Vec<String>,
    /// Why the entry does not name this executable; `None` when it does.
    pub reason: Option<String>,
}

impl Launcher {
    /// `prefix` followed by `args`.
    pub fn args(&self, args: &[String]) -> Vec<String> {
        self.prefix.iter().chain(args).cloned().collect()
    }
}

/// Where the running executable came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A directory that lasts (a venv, pipx or uv tool environment, ~/.local/bin, …).
    Stable,
    /// An environment inside uv's cache: this is a `uvx` run. Holds the cache root.
    UvCache(PathBuf),
}

/// Classify `exe` (absolute, symlink-free): inside a uv cache when one of its ancestors is
/// an `archive-v<N>` directory whose parent is a cache root (holds `CACHEDIR.TAG`, which uv
/// writes at the root of every cache, wherever `UV_CACHE_DIR` puts it).
pub fn origin(exe: &Path) -> Origin {
    for dir in exe.ancestors().skip(1) {
        let is_archive = dir
            .file_name()
            .and_then(|name| name.to_str())
            .and_then(|name| name.strip_prefix("archive-v"))
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        if is_archive
            && let Some(root) = dir.parent()
            && root.join("CACHEDIR.TAG").is_file()
        {
            return Origin::UvCache(root.to_path_buf());
        }
    }
    Origin::Stable
}

/// The launcher for an executable at `exe` (absolute, UTF-8). `uv` is `$UV` (uv sets it
/// for the processes it starts) and `path` is `$PATH`, used to find `uvx`.
pub fn choose(exe: &str, uv: Option<&Path>, path: Option<&std::ffi::OsStr>) -> Launcher {
    match origin(Path::new(exe)) {
        Origin::Stable => Launcher {
            command: exe.to_string(),
            prefix: Vec::new(),
            reason: None,
        },
        Origin::UvCache(cache) => Launcher {
            command: find_uvx(uv, path).unwrap_or_else(|| "uvx".to_string()),
            prefix: vec!["alexandria".to_string()],
            reason: Some(format!(
                "this alexandria runs from uv's cache ({}), which `uv cache clean` removes; the entry runs `uvx alexandria`, which fetches it again when needed (for a fixed path: `uv tool install alexandria` or `pipx install alexandria`, then re-run mcp install)",
                cache.display()
            )),
        },
    }
}

/// `uvx` next to the uv that started us, else the first `uvx` on PATH; only UTF-8 paths,
/// since config files cannot hold others. Not canonicalized: a symlink such as
/// `~/.local/bin/uvx` survives uv upgrades that a versioned target would not.
fn find_uvx(uv: Option<&Path>, path: Option<&std::ffi::OsStr>) -> Option<String> {
    let beside_uv = uv.and_then(Path::parent).map(|dir| dir.join("uvx"));
    let on_path = path
        .into_iter()
        .flat_map(std::env::split_paths)
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join("uvx"));
    beside_uv
        .into_iter()
        .chain(on_path)
        .find(|candidate| candidate.is_file())
        .and_then(|found| found.to_str().map(str::to_string))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn touch(path: &Path) {
        fs::create_dir_all(path.parent().expect("has a parent")).expect("mkdir");
        fs::write(path, "").expect("write");
    }

    #[test]
    fn origins() {
        let root = tempfile::tempdir().expect("tempdir");
        let cache = root.path().join("cache/uv");
        touch(&cache.join("CACHEDIR.TAG"));
        let in_cache = cache.join("archive-v0/Ab12/bin/alexandria");
        assert_eq!(origin(&in_cache), Origin::UvCache(cache.clone()));
        // An archive-v directory outside a cache root, or a name that only looks alike.
        let untagged = root.path().join("other/archive-v0/Ab12/bin/alexandria");
        assert_eq!(origin(&untagged), Origin::Stable);
        let lookalike = cache.join("archive-vx/Ab12/bin/alexandria");
        assert_eq!(origin(&lookalike), Origin::Stable);
        let venv = root.path().join("venvs/alexandria/bin/alexandria");
        assert_eq!(origin(&venv), Origin::Stable);
    }

    #[test]
    fn uvx_launcher_prefers_the_uvx_beside_uv() {
        let root = tempfile::tempdir().expect("tempdir");
        let cache = root.path().join("uv-cache");
        touch(&cache.join("CACHEDIR.TAG"));
        let exe = cache.join("archive-v0/x/bin/alexandria");
        let exe = exe.to_str().expect("utf-8");
        let tools = root.path().join("tools");
        touch(&tools.join("uv"));
        touch(&tools.join("uvx"));
        let elsewhere = root.path().join("elsewhere");
        touch(&elsewhere.join("uvx"));
        let path = std::env::join_paths([&elsewhere]).expect("join");

        let beside = choose(exe, Some(&tools.join("uv")), Some(&path));
        assert_eq!(beside.command, tools.join("uvx").to_str().expect("utf-8"));
        assert_eq!(
            beside.args(&["mcp".into(), "serve".into()]),
            ["alexandria", "mcp", "serve"]
        );
        assert!(beside.reason.is_some());

        let on_path = choose(exe, None, Some(&path));
        assert_eq!(
            on_path.command,
            elsewhere.join("uvx").to_str().expect("utf-8")
        );
        let bare = choose(exe, None, None);
        assert_eq!(bare.command, "uvx");
    }

    #[test]
    fn stable_launcher_is_the_executable() {
        let launcher = choose("/opt/venv/bin/alexandria", None, None);
        assert_eq!(launcher.command, "/opt/venv/bin/alexandria");
        assert_eq!(launcher.args(&["mcp".into()]), ["mcp"]);
        assert_eq!(launcher.reason, None);
    }
}
