//! Workspaces on disk: the home layout, each workspace's git repository, path
//! confinement (`store`), the workspace lock (`lock`), git primitives (`git`), git's index file rewritten
//! in place of libgit2's (`gitindex`), pages a
//! hand `git commit` dropped from HEAD or git's index (`dropped`), names
//! that collide on case-insensitive file systems (`names`), and what a write flushes
//! before it is acknowledged (`durable`).
//!
//! May import: `db`, `config`, `error`. Nothing above it: the index, the commit path
//! and the tools build on this.

pub mod dropped;
pub mod durable;
pub mod git;
pub mod gitindex;
pub mod lock;
pub mod message;
pub mod names;
pub mod store;

pub use durable::Durable;
pub use lock::{LockGuard, WorkspaceLock};
pub use store::*;
