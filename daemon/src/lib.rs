//! alexandriad: the daemon that owns every workspace and serves them over MCP.
//!
//! Dependencies point inward: transports (`socket`, `http`) → `mcp` (tool
//! registration and MCP results) → `tools` (tool logic, blocking) → `store`
//! (workspaces on disk, git) and `index`/`db` (SQLite state and full-text index).

pub mod auth;
pub mod calllog;
pub mod config;
pub mod control;
pub mod daemon;
pub mod db;
pub mod error;
pub mod extract;
pub mod faults;
pub mod git;
pub mod http;
pub mod index;
pub mod markdown;
pub mod mcp;
pub mod sessions;
pub mod socket;
pub mod store;
pub mod tools;
pub mod watch;
pub mod write;

pub use daemon::{DaemonOptions, run};
