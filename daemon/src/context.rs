//! `DaemonContext`: the state every connection shares (store, sessions, auth, the HTTP
//! address, the shutdown signal, the requests in flight). It lives here, below the transports, so that the
//! socket, HTTP and control code depend on it and not on the life cycle that builds it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use alexandria_proto::{BUILD, PROTOCOL_VERSION};
use serde_json::{Value, json};
use tokio::sync::{Notify, watch};

use crate::auth::Auth;
use crate::auth::oauth::OAuthServer;
use crate::auth::web::WebLogins;
use crate::mcp::sessions::Sessions;
use crate::workspace::Store;

/// Where and how HTTP is served, once bound.
#[derive(Debug, Clone)]
pub struct HttpInfo {
    pub address: SocketAddr,
    /// The port was 0 (any free port), so it differs at every start.
    pub ephemeral: bool,
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
    /// One-time login tokens and sessions of the web view.
    pub web: Arc<WebLogins>,
    /// Remote access: the OAuth server and its settings.
    pub oauth: Arc<OAuthServer>,
    /// `None` when HTTP could not be bound.
    pub http: Option<HttpInfo>,
    /// Socket requests being worked on, so that shutdown lets them finish.
    pub inflight: Arc<Inflight>,
    /// Why HTTP is not served (a busy port, …), for `daemon status`.
    pub http_error: Option<String>,
    pub(crate) shutdown: watch::Sender<bool>,
}

impl DaemonContext {
    pub fn shutdown(&self) {
        let _ = self.shutdown.send(true);
    }

    pub fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.shutdown.subscribe()
    }

    pub fn is_shutting_down(&self) -> bool {
        *self.shutdown.borrow()
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
            "socket_note": self.store.home.socket_place().reason(),
            "http": self.http.as_ref().map(HttpInfo::url),
            "http_error": self.http_error,
            // Asked for port 0: the port changes at every start, and so do URLs.
            "http_ephemeral": self.http.as_ref().map(|h| h.ephemeral),
            "remote": self.oauth.remote().map(|r| r.origin),
            "http_tokens": self.auth.tokens_enabled(),
            "sessions": self.sessions.snapshot(),
            "workspaces": self.store.list_workspaces(),
            "state_db": self.store.db_report,
        })
    }
}

/// Requests in flight on the Unix socket (MCP calls and control requests): counted from
/// the moment a request is read until its answer is written. Shutdown waits for the
/// count to reach zero before it closes connections, so a call that was accepted is
/// answered, not cut off.
#[derive(Debug, Default)]
pub struct Inflight {
    count: AtomicUsize,
    idle: Notify,
}

impl Inflight {
    /// One request more until the guard is dropped.
    pub fn begin(self: &Arc<Self>) -> InflightGuard {
        self.count.fetch_add(1, Ordering::SeqCst);
        InflightGuard(Arc::clone(self))
    }

    pub fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    /// Returns once no request is in flight.
    pub async fn drained(&self) {
        loop {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            // Register before checking, so a drop in between is not missed.
            idle.as_mut().enable();
            if self.count() == 0 {
                return;
            }
            idle.await;
        }
    }
}

/// Ends one request of an `Inflight` count when dropped.
#[derive(Debug)]
pub struct InflightGuard(Arc<Inflight>);

impl Drop for InflightGuard {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn drained_waits_for_the_last_guard() {
        let inflight = Arc::new(Inflight::default());
        inflight.drained().await;
        let first = inflight.begin();
        let second = inflight.begin();
        let waiter = tokio::spawn({
            let inflight = Arc::clone(&inflight);
            async move { inflight.drained().await }
        });
        drop(first);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(second);
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("drained after the last guard")
            .expect("join");
        assert_eq!(inflight.count(), 0);
    }
}
