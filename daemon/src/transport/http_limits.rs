//! What a stranger can make the HTTP listener do before they hold a token, bounded: once
//! a tunnel is on (`alexandria remote enable`), anyone on the internet reaches it.
//!
//! - request headers must arrive within `[http] header_timeout_secs` (slowloris), a
//!   request body within `[http] body_timeout_secs`;
//! - a connection with no request in flight is closed after `[http] idle_timeout_secs`;
//! - at most `[http] max_connections` connections: when full, the oldest connection
//!   with no request in flight is closed to make room (a flood of idle connections
//!   cannot lock a client out); with none idle the new one gets 503 + `Retry-After`;
//! - failed bearer tokens are counted per source (`FailedAuth`): past the budget, a
//!   request with a bad token gets 429 + `Retry-After` without being looked at further.
//!   Behind a tunnel every request comes from 127.0.0.1, so loopback peers share one
//!   budget: a flood of bad tokens then delays other clients' *bad* tokens too, never a
//!   valid token or a request without one (the OAuth discovery step).
//!
//! The accept loop is ours (hyper's HTTP/1.1 connection builder) rather than
//! `axum::serve`, which has no header timeout or connection cap.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Request, Response};
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tower_service::Service;

use crate::config::HttpConfig;

/// The listener's limits, from `[http]`.
#[derive(Debug, Clone)]
pub struct Limits {
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
}

impl Limits {
    pub fn from_config(config: &HttpConfig) -> Limits {
        let secs = |s: f64| Duration::from_secs_f64(s.max(0.05));
        Limits {
            header_timeout: secs(config.header_timeout_secs),
            body_timeout: secs(config.body_timeout_secs),
            idle_timeout: secs(config.idle_timeout_secs),
            max_connections: config.max_connections.max(1),
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One live connection.
struct Conn {
    /// Requests being answered on it (until the response body ends).
    busy: Arc<AtomicUsize>,
    /// When it last became idle (ms since the table's epoch).
    idle_since: Arc<AtomicU64>,
    close: CancellationToken,
}

/// Live connections, oldest first.
#[derive(Default)]
struct Table {
    next: u64,
    conns: BTreeMap<u64, Conn>,
}

/// Serve `router` on `listener` until `shutdown`; then stop accepting, let requests in
/// flight finish (the caller bounds how long) and close idle connections.
/// `drained` returns once the tool calls in flight are answered (bounded by the caller):
/// only then are the SSE streams ended, so no answer is cut off.
pub async fn serve(
    listener: TcpListener,
    router: axum::Router,
    limits: Limits,
    mut shutdown: watch::Receiver<bool>,
    stop_streams: CancellationToken,
    drained: impl std::future::Future<Output = ()>,
) {
    let table: Arc<Mutex<Table>> = Arc::default();
    let epoch = Instant::now();
    let stopping = CancellationToken::new();
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        let (mut stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "HTTP accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = async { let _ = shutdown.wait_for(|stopping| *stopping).await; } => break,
        };
        while tasks.try_join_next().is_some() {}
        let _ = stream.set_nodelay(true);
        let (id, close, busy, idle_since) = {
            let mut table = lock(&table);
            if table.conns.len() >= limits.max_connections {
                // Make room by closing the oldest connection that is not answering
                // anything (a flood of idle or half-sent connections goes first).
                let idle = table
                    .conns
                    .iter()
                    .find(|(_, c)| c.busy.load(Ordering::SeqCst) == 0)
                    .map(|(id, _)| *id);
                match idle.and_then(|id| table.conns.remove(&id)) {
                    Some(evicted) => evicted.close.cancel(),
                    None => {
                        drop(table);
                        tracing::warn!(%peer, "HTTP connection refused: too many connections");
                        tasks.spawn(async move {
                            let _ = stream
                                .write_all(b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 5\r\nContent-Type: text/plain\r\nContent-Length: 52\r\nConnection: close\r\n\r\ntoo many connections ([http] max_connections); retry")
                                .await;
                            let _ = stream.shutdown().await;
                        });
                        continue;
                    }
                }
            }
            table.next += 1;
            let id = table.next;
            let conn = Conn {
                busy: Arc::new(AtomicUsize::new(0)),
                idle_since: Arc::new(AtomicU64::new(epoch.elapsed().as_millis() as u64)),
                close: stopping.child_token(),
            };
            let handles = (
                id,
                conn.close.clone(),
                Arc::clone(&conn.busy),
                Arc::clone(&conn.idle_since),
            );
            table.conns.insert(id, conn);
            handles
        };
        let router = router.clone();
        let table = Arc::clone(&table);
        let limits = limits.clone();
        tasks.spawn(async move {
            serve_connection(
                stream, peer, router, &limits, &close, busy, idle_since, epoch,
            )
            .await;
            lock(&table).conns.remove(&id);
        });
    }
    // Stopping: no new connections; idle ones close now, busy ones after their
    // response. The calls in flight are answered first, then the SSE streams (a
    // session's standalone stream, a call's stream) are ended by `stop_streams`.
    drop(listener);
    stopping.cancel();
    drained.await;
    stop_streams.cancel();
    while tasks.join_next().await.is_some() {}
}

#[allow(clippy::too_many_arguments)]
async fn serve_connection(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    router: axum::Router,
    limits: &Limits,
    close: &CancellationToken,
    busy: Arc<AtomicUsize>,
    idle_since: Arc<AtomicU64>,
    epoch: Instant,
) {
    let body_timeout = limits.body_timeout;
    let service_busy = Arc::clone(&busy);
    let service_idle = Arc::clone(&idle_since);
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let mut router = router.clone();
        let guard = BusyGuard::new(Arc::clone(&service_busy), Arc::clone(&service_idle), epoch);
        async move {
            let (mut parts, body) = request.into_parts();
            parts.extensions.insert(ConnectInfo(peer));
            let timed_out = Arc::new(AtomicBool::new(false));
            let body = Body::new(TimedBody::new(body, body_timeout, Arc::clone(&timed_out)));
            let response = match router.call(Request::from_parts(parts, body)).await {
                Ok(response) => response,
                Err(never) => match never {},
            };
            // Whatever the handler made of a body cut off (rmcp: 500), say what it was.
            let response = if timed_out.load(Ordering::SeqCst) {
                body_timed_out()
            } else {
                response
            };
            // Busy until the response body ends (a tool call answered over SSE).
            let (parts, body) = response.into_parts();
            Ok::<_, Infallible>(Response::from_parts(
                parts,
                Body::new(GuardedBody::new(body, guard)),
            ))
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    let mut shutting_down = false;
    let mut tick = tokio::time::interval(Duration::from_millis(
        (limits.idle_timeout.as_millis() as u64 / 4).clamp(10, 5_000),
    ));
    loop {
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(error) = result {
                    tracing::debug!(%peer, %error, "HTTP connection ended");
                }
                return;
            }
            () = close.cancelled(), if !shutting_down => {
                if busy.load(Ordering::SeqCst) == 0 {
                    // Nothing being answered: a half-sent request or keep-alive idle.
                    return;
                }
                shutting_down = true;
                connection.as_mut().graceful_shutdown();
            }
            _ = tick.tick() => {
                let idle_for = (epoch.elapsed().as_millis() as u64)
                    .saturating_sub(idle_since.load(Ordering::SeqCst));
                if busy.load(Ordering::SeqCst) == 0
                    && Duration::from_millis(idle_for) >= limits.idle_timeout
                {
                    tracing::debug!(%peer, "closing an idle HTTP connection");
                    return;
                }
            }
        }
    }
}

/// Counts a request as in flight on its connection until dropped.
struct BusyGuard {
    busy: Arc<AtomicUsize>,
    idle_since: Arc<AtomicU64>,
    epoch: Instant,
}

impl BusyGuard {
    fn new(busy: Arc<AtomicUsize>, idle_since: Arc<AtomicU64>, epoch: Instant) -> BusyGuard {
        busy.fetch_add(1, Ordering::SeqCst);
        BusyGuard {
            busy,
            idle_since,
            epoch,
        }
    }
}

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.idle_since
            .store(self.epoch.elapsed().as_millis() as u64, Ordering::SeqCst);
        self.busy.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A response body that keeps its request counted (by `G`, dropped with the body)
/// until it ends.
pub struct GuardedBody<G> {
    inner: Body,
    _guard: G,
}

impl<G> GuardedBody<G> {
    pub fn new(inner: Body, guard: G) -> GuardedBody<G> {
        GuardedBody {
            inner,
            _guard: guard,
        }
    }
}

impl<G: Send + Unpin + 'static> HttpBody for GuardedBody<G> {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// 408 for a request body that did not arrive in time; the connection closes.
fn body_timed_out() -> Response<Body> {
    let body = serde_json::json!({
        "error": "request_timeout",
        "message": "the request body did not arrive in time",
        "hint": "send the whole request at once; [http] body_timeout_secs in config.toml sets the limit",
    });
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = axum::http::StatusCode::REQUEST_TIMEOUT;
    let headers = response.headers_mut();
    headers.insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json"),
    );
    headers.insert(
        axum::http::header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
    response
}

/// A request body that must arrive whole within a deadline.
struct TimedBody {
    inner: Incoming,
    deadline: Pin<Box<tokio::time::Sleep>>,
    timed_out: Arc<AtomicBool>,
}

impl TimedBody {
    fn new(inner: Incoming, timeout: Duration, timed_out: Arc<AtomicBool>) -> TimedBody {
        TimedBody {
            inner,
            deadline: Box::pin(tokio::time::sleep(timeout)),
            timed_out,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("the request body did not arrive in time ([http] body_timeout_secs)")]
    TimedOut,
    #[error(transparent)]
    Read(#[from] hyper::Error),
}

impl HttpBody for TimedBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(BodyError::from)));
        }
        if self.deadline.as_mut().poll(cx).is_ready() {
            self.timed_out.store(true, Ordering::SeqCst);
            return Poll::Ready(Some(Err(BodyError::TimedOut)));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Failed bearer tokens per source in a sliding window of fixed slots.
pub struct FailedAuth {
    budget: u32,
    window: Duration,
    sources: Mutex<HashMap<String, (Instant, u32)>>,
}

/// How many sources `FailedAuth` remembers (it forgets the oldest beyond that).
const MAX_SOURCES: usize = 4096;

impl FailedAuth {
    pub fn new(budget: u32, window: Duration) -> FailedAuth {
        FailedAuth {
            budget: budget.max(1),
            window,
            sources: Mutex::new(HashMap::new()),
        }
    }

    /// The key a peer's failures count against: loopback peers (a tunnel forwards
    /// every client from there) share one, others count by address.
    pub fn key(peer: SocketAddr) -> String {
        if peer.ip().is_loopback() {
            "loopback".into()
        } else {
            peer.ip().to_string()
        }
    }

    /// `Some(retry after)` while `key` has used up its budget.
    pub fn blocked(&self, key: &str) -> Option<Duration> {
        let sources = lock(&self.sources);
        let (started, count) = sources.get(key)?;
        let elapsed = started.elapsed();
        (elapsed < self.window && *count >= self.budget).then(|| self.window - elapsed)
    }

    pub fn record(&self, key: &str) {
        let mut sources = lock(&self.sources);
        if sources.len() >= MAX_SOURCES && !sources.contains_key(key) {
            let window = self.window;
            sources.retain(|_, (started, _)| started.elapsed() < window);
            if sources.len() >= MAX_SOURCES {
                sources.clear();
            }
        }
        let entry = sources
            .entry(key.to_string())
            .or_insert((Instant::now(), 0));
        if entry.0.elapsed() >= self.window {
            *entry = (Instant::now(), 0);
        }
        entry.1 += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_auth_blocks_past_the_budget_and_forgets_after_the_window() {
        let limiter = FailedAuth::new(3, Duration::from_millis(200));
        let key = FailedAuth::key("127.0.0.1:5000".parse().expect("addr"));
        assert_eq!(
            key,
            FailedAuth::key("127.0.0.1:6000".parse().expect("addr"))
        );
        for _ in 0..3 {
            assert!(limiter.blocked(&key).is_none());
            limiter.record(&key);
        }
        assert!(limiter.blocked(&key).is_some());
        assert!(limiter.blocked("192.0.2.1").is_none());
        std::thread::sleep(Duration::from_millis(250));
        assert!(limiter.blocked(&key).is_none());
    }
}
