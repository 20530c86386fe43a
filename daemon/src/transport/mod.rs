//! How requests reach the daemon: the Unix socket (`socket`: peer check, handshake,
//! frames to rmcp; `jsonline` writes its outgoing frames), Streamable HTTP (`http`), and
//! the CLI's control requests (`control`).
//!
//! May import: `context`, `mcp`, `tools`, `commit`, `index`, `workspace`, `auth`. Only
//! this folder knows sockets and HTTP. The life cycle (`lifecycle`) sits above it.

pub mod control;
pub mod http;
pub mod http_limits;
pub mod http_oauth;
pub mod jsonline;
pub mod remote_doctor;
pub mod socket;
