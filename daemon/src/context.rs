//! `DaemonContext`: the state every connection shares (store, sessions, auth, the HTTP
//! address, the shutdown signal). It lives here, below the transports, so that the
//! socket, HTTP and control code depend on it and not on the life cycle that builds it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use alexandria_proto::{BUILD, PROTOCOL_VERSION};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::auth::Auth;
use crate::mcp::sessions::Sessions;
use crate::workspace::Store;

/// Where and how HTTP is served, once bound.
#[derive(Debug, Clone)]
pub struct HttpInfo {
    pub address: SocketAddr,
}

impl HttpInfo {
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }
}

/// State shared by every connection.
pub struct DaemonContext {
    pub store: Arc<Store>,
    pub sessions: Arc<Sessions>,
    pub started: Instant,
    pub auth: Arc<Auth>,
    /// `None` when HTTP could not be bound (the reason is in the daemon log).
    pub http: Option<HttpInfo>,
    pub(crate) shutdown: watch::Sender<bool>,
}

impl DaemonContext {
    pub fn shutdown(&self) {
        let _ = self.shutdown.send(true);
    }

    pub fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.shutdown.subscribe()
    }

    pub fn status(&self) -> Value {
        json!({
            "running": true,
            "pid": std::process::id(),
            "version": BUILD,
            "protocol": PROTOCOL_VERSION,
            "uptime_secs": self.started.elapsed().as_secs(),
            "home": self.store.home.root().display().to_string(),
            "socket": self.store.home.socket().display().to_string(),
            "http": self.http.as_ref().map(HttpInfo::url),
            "http_tokens": self.auth.tokens_enabled(),
            "sessions": self.sessions.snapshot(),
            "workspaces": self.store.list_workspaces(),
        })
    }
}
