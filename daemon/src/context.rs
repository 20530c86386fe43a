//! `DaemonContext`: the state every connection shares (store, sessions, auth, the HTTP
//! address, the shutdown signal, the requests in flight). It lives here, below the transports, so that the
//! socket, HTTP and control code depend on it and not on the life cycle that builds it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
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
/// the moment a request is read until its answer is written. Shutdown first closes the
/// count (`close`): from then on `try_begin` refuses, and the request is answered
/// `daemon_stopping` (not started, safe to send again) instead of being run. It then
/// waits for the count to reach zero, so a call that was admitted is answered, never cut
/// off, and no call can slip in after the wait saw zero.
#[derive(Debug)]
pub struct Inflight {
    /// The number of requests, with `CLOSED` set once shutdown began.
    count: AtomicUsize,
    idle: Notify,
    /// Set once closed and drained: every request admitted was answered and none will be
    /// admitted any more, so whatever a client still waits for was never started.
    settled: watch::Sender<bool>,
    /// MCP connections that still have to write their closing notification.
    writers: AtomicUsize,
    writers_done: Notify,
    /// Requests answered since start (for the memory trim: has anything happened?).
    finished: AtomicU64,
}

const CLOSED: usize = 1 << (usize::BITS - 1);

impl Default for Inflight {
    fn default() -> Self {
        Inflight {
            count: AtomicUsize::new(0),
            idle: Notify::new(),
            settled: watch::channel(false).0,
            writers: AtomicUsize::new(0),
            writers_done: Notify::new(),
            finished: AtomicU64::new(0),
        }
    }
}

impl Inflight {
    /// One request more until the guard is dropped, or `None` once shutdown began.
    pub fn try_begin(self: &Arc<Self>) -> Option<InflightGuard> {
        self.count
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |count| {
                (count & CLOSED == 0).then_some(count + 1)
            })
            .ok()
            .map(|_| InflightGuard(Arc::clone(self)))
    }

    /// Admit no more requests (`try_begin` refuses from now on).
    pub fn close(&self) {
        self.count.fetch_or(CLOSED, Ordering::SeqCst);
    }

    pub fn is_closed(&self) -> bool {
        self.count.load(Ordering::SeqCst) & CLOSED != 0
    }

    pub fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst) & !CLOSED
    }

    /// Requests answered since start.
    pub fn finished(&self) -> u64 {
        self.finished.load(Ordering::Relaxed)
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

    /// Closed and drained: tell the connections, which tell their clients that nothing
    /// they still wait for was started (`alexandria_proto::CLOSING_NOTIFICATION`).
    pub fn settle(&self) {
        let _ = self.settled.send(true);
    }

    pub fn settled(&self) -> watch::Receiver<bool> {
        self.settled.subscribe()
    }

    /// One MCP connection's writer, until the guard is dropped.
    pub fn writer(self: &Arc<Self>) -> WriterGuard {
        self.writers.fetch_add(1, Ordering::SeqCst);
        WriterGuard(Arc::clone(self))
    }

    /// Returns once every MCP connection's writer has finished.
    pub async fn writers_closed(&self) {
        loop {
            let done = self.writers_done.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            if self.writers.load(Ordering::SeqCst) == 0 {
                return;
            }
            done.await;
        }
    }
}

/// Ends one writer of `Inflight::writer` when dropped.
#[derive(Debug)]
pub struct WriterGuard(Arc<Inflight>);

impl Drop for WriterGuard {
    fn drop(&mut self) {
        if self.0.writers.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.writers_done.notify_waiters();
        }
    }
}

/// Ends one request of an `Inflight` count when dropped.
#[derive(Debug)]
pub struct InflightGuard(Arc<Inflight>);

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.0.finished.fetch_add(1, Ordering::Relaxed);
        if self.0.count.fetch_sub(1, Ordering::SeqCst) & !CLOSED == 1 {
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
        let first = inflight.try_begin().expect("open");
        let second = inflight.try_begin().expect("open");
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

    #[tokio::test]
    async fn a_closed_count_admits_nothing_and_still_drains() {
        let inflight = Arc::new(Inflight::default());
        let running = inflight.try_begin().expect("open");
        inflight.close();
        assert!(inflight.is_closed());
        assert!(inflight.try_begin().is_none());
        assert_eq!(inflight.count(), 1);
        drop(running);
        tokio::time::timeout(std::time::Duration::from_secs(5), inflight.drained())
            .await
            .expect("drained");
        assert_eq!(inflight.count(), 0);
        assert!(inflight.try_begin().is_none());
    }
}
