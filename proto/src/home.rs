//! Where alexandria keeps its state: `$ALEXANDRIA_HOME`, default `~/.alexandria`.

use std::path::{Path, PathBuf};

/// The environment variable that overrides the home directory (tests always set it).
pub const HOME_ENV: &str = "ALEXANDRIA_HOME";

/// Paths inside the alexandria home (SPEC §2). Pure path arithmetic: nothing here
/// touches the file system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Home {
    root: PathBuf,
}

impl Home {
    pub fn new(root: impl Into<PathBuf>) -> Home {
        Home { root: root.into() }
    }

    /// `$ALEXANDRIA_HOME`, else `$HOME/.alexandria`. `None` when neither is set.
    pub fn from_env() -> Option<Home> {
        if let Some(dir) = std::env::var_os(HOME_ENV).filter(|v| !v.is_empty()) {
            let dir = PathBuf::from(dir);
            let dir = if dir.is_absolute() {
                dir
            } else {
                std::env::current_dir().ok()?.join(dir)
            };
            return Some(Home::new(dir));
        }
        let home = std::env::var_os("HOME").filter(|v| !v.is_empty())?;
        Some(Home::new(PathBuf::from(home).join(".alexandria")))
    }

    pub fn root(&self) -> &Path {
        &self.root
    }
    pub fn config_file(&self) -> PathBuf {
        self.root.join("config.toml")
    }
    pub fn state_db(&self) -> PathBuf {
        self.root.join("state.db")
    }
    pub fn secrets_dir(&self) -> PathBuf {
        self.root.join("secrets")
    }
    pub fn logs_dir(&self) -> PathBuf {
        self.root.join("logs")
    }
    pub fn run_dir(&self) -> PathBuf {
        self.root.join("run")
    }
    pub fn socket(&self) -> PathBuf {
        self.run_dir().join("daemon.sock")
    }
    pub fn pid_file(&self) -> PathBuf {
        self.run_dir().join("daemon.pid")
    }
    /// Held by whoever is starting a daemon, so parallel shims start exactly one.
    pub fn start_lock(&self) -> PathBuf {
        self.run_dir().join("start.lock")
    }
    pub fn templates_dir(&self) -> PathBuf {
        self.root.join("templates")
    }
    pub fn workspaces_dir(&self) -> PathBuf {
        self.root.join("workspaces")
    }
    pub fn workspace(&self, slug: &str) -> PathBuf {
        self.workspaces_dir().join(slug)
    }
}
