//! Workspaces on disk: the home layout, each workspace's git repository, path
//! confinement (`store`), the workspace lock (`lock`), git primitives (`git`), git's index file rewritten
//! in place of libgit2's (`gitindex`), the trees of its commits (`gittree`) and their
//! loose objects (`loose`), packed when the daemon goes quiet (`pack`), pages a
//! hand `git commit` dropped from HEAD or git's index (`dropped`), names
//! that collide on case-insensitive file systems (`names`), and what a write flushes
//! before it is acknowledged (`durable`), and the file watcher every watch of a
//! folder uses (`watcher`).
//!
//! May import: `db`, `config`, `error`. Nothing above it: the index, the commit path
//! and the tools build on this.

pub mod dropped;
pub mod durable;
pub mod git;
pub mod gitindex;
pub mod gittree;
pub mod lock;
pub mod loose;
pub mod message;
pub mod names;
pub mod pack;
pub mod store;

pub use durable::Durable;
pub use lock::{LockGuard, WorkspaceLock};
pub use store::*;

/// The `git` command line for the daemon's own use (packing, sync, git sources): never
/// through the repository git's environment names (a daemon started from a git hook
/// inherits `GIT_DIR`, and a fetch or repack would go to that repository), no prompts
/// (there is no terminal), nothing on stdin.
pub fn git_cli() -> std::process::Command {
    let mut command = std::process::Command::new("git");
    command
        .env("GIT_TERMINAL_PROMPT", "0")
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .env_remove("GIT_INDEX_FILE")
        .env_remove("GIT_OBJECT_DIRECTORY")
        .env_remove("GIT_ALTERNATE_OBJECT_DIRECTORIES")
        .env_remove("GIT_COMMON_DIR")
        // A server-side hook's: refs under a namespace, objects held in quarantine.
        .env_remove("GIT_NAMESPACE")
        .env_remove("GIT_QUARANTINE_PATH")
        .stdin(std::process::Stdio::null());
    command
}

/// A file watcher (inotify, FSEvents, …) that reports changes only: creating,
/// removing, writing, renaming, attributes. Opening a file is not reported: with
/// inotify every `open` of a file in a watched folder was an event, the daemon's own
/// reads included, so each `read` of a page woke the notification thread and the
/// watcher (a fifth of the daemon's CPU in a glob read of 10 pages).
pub fn watcher(handler: impl notify::EventHandler) -> notify::Result<notify::RecommendedWatcher> {
    use notify::Watcher;
    notify::RecommendedWatcher::new(
        handler,
        notify::Config::default().with_event_kinds(notify::EventKindMask::CORE),
    )
}
