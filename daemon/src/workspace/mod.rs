//! Workspaces on disk: the home layout, each workspace's git repository, path
//! confinement (`store`), the workspace lock (`lock`), git primitives (`git`), and
//! names that collide on case-insensitive file systems (`names`).
//!
//! May import: `db`, `config`, `error`. Nothing above it: the index, the commit path
//! and the tools build on this.

pub mod git;
pub mod lock;
pub mod message;
pub mod names;
pub mod store;

pub use lock::{LockGuard, WorkspaceLock};
pub use store::*;
