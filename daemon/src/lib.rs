//! alexandriad: the daemon that owns every workspace and serves them over MCP.
//!
//! Folders by concern; arrows point down only (ARCHITECTURE.md has the map):
//!
//! `lifecycle` → `transport` (socket, HTTP, control) → `mcp` (rmcp handler, sessions,
//! call log) → `tools` (tool logic, MCP-free) → `sources` (adapters, scheduler) and `sync`
//! (git remote; it borrows `sources::redact_url`) → `commit` (the write path, recovery, outside edits) → `index` (catalogue, full-text search, extraction) → `workspace`
//! (files, git, lock) → `db`, `config`, `error`. `context` (state shared by the
//! transports) and `auth` sit beside `transport`, below `lifecycle`; `web` (the web
//! view) is a transport too: `transport/http.rs` hands it its paths.

pub mod auth;
pub mod blocking;
pub mod commit;
pub mod config;
pub mod context;
pub mod db;
pub mod error;
pub mod faults;
pub mod index;
pub mod lifecycle;
pub mod mcp;
pub mod memory;
pub mod sources;
pub mod sync;
#[cfg(test)]
mod testing;
pub mod tools;
pub mod transport;
pub mod web;
pub mod workspace;

pub use lifecycle::{DaemonOptions, run};
