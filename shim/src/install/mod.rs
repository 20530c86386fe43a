//! `alexandria mcp install|uninstall` and `alexandria daemon install-service|uninstall-service`:
//! put one `alexandria` entry into an MCP client's real config file, or a service file into
//! the user's service manager, without disturbing anything else.
//!
//! The edit functions (`json`, `codex`, `continue_block`, `service` rendering) are pure: text
//! in, text out. `files` does the careful file I/O (refuse what it cannot edit safely, back up,
//! write atomically) and `cli` is the only module that prints.

mod claude_cli;
mod cli;
pub(crate) mod clients;
pub(crate) mod codex;
pub(crate) mod continue_block;
mod entry;
mod files;
pub(crate) mod json;
mod launcher;
pub(crate) mod service;

pub use claude_cli::find_on_path;
pub use cli::{
    McpInstallArgs, ServiceArgs, init_command, install_service, mcp_install, mcp_uninstall,
    uninstall_service,
};
pub use files::BACKUP_SUFFIX;

/// The one server name alexandria owns in every client's config.
pub const SERVER_NAME: &str = "alexandria";

/// What an edit function decided. `Unchanged` means the file already says what we want (or,
/// for a removal, has no entry to remove); nothing is written then.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Edit {
    Unchanged,
    Changed { change: Change, text: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Added,
    Updated,
    Removed,
}

impl Change {
    pub fn past_tense(self) -> &'static str {
        match self {
            Change::Added => "added",
            Change::Updated => "updated",
            Change::Removed => "removed",
        }
    }
    /// How to report the change: what would happen on a dry run, what happened otherwise.
    pub fn verb(self, dry_run: bool) -> &'static str {
        if dry_run {
            self.conditional()
        } else {
            self.past_tense()
        }
    }

    pub fn conditional(self) -> &'static str {
        match self {
            Change::Added => "would add",
            Change::Updated => "would update",
            Change::Removed => "would remove",
        }
    }
}

/// Why a config file cannot be edited. The caller adds the path and what to do.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EditError {
    #[error("it is not valid {format}: {message}")]
    Invalid {
        format: &'static str,
        message: String,
    },
    #[error("{at} should be {expected}, but it is {found}")]
    WrongType {
        at: String,
        expected: &'static str,
        found: &'static str,
    },
    #[error("{0}")]
    NotOurs(String),
}
