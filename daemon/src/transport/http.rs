//! The Streamable HTTP transport: `/mcp` (open), `/mcp/{slug}` (pinned), `/health`
//! and `/mcp/{slug}/health`, served by axum over rmcp's `StreamableHttpService`.
//!
//! Every request passes, in order: the `Host`/`Origin` check (DNS rebinding → 403),
//! the bearer token when tokens are on (→ 401), the token's workspace limit (→ 403),
//! the workspace's existence (→ 404). Then it goes to the MCP service of its binding:
//! one service for `/mcp` and one per workspace, so a session id minted under one
//! slug is unknown (404) under any other. A workspace-limited token on `/mcp` is
//! served by that workspace's pinned service.
//!
//! With remote access on (`alexandria remote enable`), every `/mcp` request needs a
//! token: a CLI token, or an OAuth access token whose issuer is the public origin and
//! whose audience is exactly this endpoint's URL. A missing or bad token gets a 401
//! pointing at the endpoint's Protected Resource Metadata; a write or delete with a
//! read-only token gets 403 `insufficient_scope`. The OAuth endpoints themselves are in
//! `http_oauth.rs`.
//!
//! This folder is the only one that knows HTTP.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use alexandria_proto::{BUILD, Binding};
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use rmcp::transport::streamable_http_server::SessionManager;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::auth::oauth::{Remote, SCOPE_READ, SCOPE_WRITE};
use crate::auth::{Auth, Grant, Refusal};
use crate::config::HttpConfig;
use crate::context::DaemonContext;
use crate::mcp::AlexandriaServer;
use crate::mcp::sessions::{SessionInfo, SessionListing};
use crate::transport::http_limits::{self, FailedAuth, Limits};
use crate::transport::http_oauth;

/// An HTTP session with no traffic for this long is closed (its id then gets 404
/// and the client re-initializes). rmcp's default is 5 minutes, which drops the
/// sessions of clients that merely sit idle in a conversation; a day still reclaims
/// the sessions of clients that vanished without a DELETE.
pub const SESSION_IDLE_TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);
/// SSE comment lines keep idle streams (and proxies) alive.
const SSE_KEEP_ALIVE: Duration = Duration::from_secs(15);
/// Largest POST body accepted (one JSON-RPC message).
const MAX_BODY_BYTES: usize = alexandria_proto::MAX_FRAME_BYTES;

/// One MCP endpoint: rmcp's service and its session table.
#[derive(Clone)]
struct McpService {
    service: StreamableHttpService<AlexandriaServer, LocalSessionManager>,
    sessions: Arc<LocalSessionManager>,
}

/// Command-line overrides of `config.toml [http]`.
#[derive(Debug, Clone, Default)]
pub struct HttpOverrides {
    pub bind: Option<String>,
    pub port: Option<u16>,
    pub token_required: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("the HTTP bind address {0:?} is not an IP address (use 127.0.0.1, ::1 or 0.0.0.0)")]
    BadBind(String),
    #[error(
        "refusing to serve HTTP on {0} without tokens: anyone on the network could read the wiki. Start with --token-required (then mint a token with `alexandria daemon auth token`), or bind 127.0.0.1"
    )]
    OpenNetwork(SocketAddr),
    #[error("cannot listen for HTTP on {address}: {source}")]
    Listen {
        address: SocketAddr,
        source: std::io::Error,
    },
}

/// The address to bind: config, then overrides.
pub fn bind_address(
    config: &HttpConfig,
    overrides: &HttpOverrides,
) -> Result<SocketAddr, HttpError> {
    let bind = overrides.bind.as_deref().unwrap_or(&config.bind);
    let ip: IpAddr = if bind.eq_ignore_ascii_case("localhost") {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    } else {
        bind.trim_matches(['[', ']'])
            .parse()
            .map_err(|_| HttpError::BadBind(bind.to_string()))?
    };
    Ok(SocketAddr::new(ip, overrides.port.unwrap_or(config.port)))
}

/// Bind the listener, refusing a non-loopback address unless tokens are on.
pub async fn bind(address: SocketAddr, auth: &Auth) -> Result<TcpListener, HttpError> {
    if !address.ip().is_loopback() && !auth.tokens_enabled() {
        return Err(HttpError::OpenNetwork(address));
    }
    TcpListener::bind(address)
        .await
        .map_err(|source| HttpError::Listen { address, source })
}

/// Serve until the daemon shuts down, within the limits of `http_limits` (timeouts,
/// connection cap). Open SSE streams are ended by cancelling the services' token, so
/// shutdown never waits on them.
pub async fn serve(listener: TcpListener, context: Arc<DaemonContext>, config: &HttpConfig) {
    let cancel = CancellationToken::new();
    let local = listener.local_addr().ok();
    let app = Arc::new(App::new(
        Arc::clone(&context),
        config,
        local,
        cancel.clone(),
    ));
    let router = axum::Router::new().fallback(entry).with_state(app);
    let inflight = Arc::clone(&context.inflight);
    http_limits::serve(
        listener,
        router,
        Limits::from_config(config),
        context.shutdown_signal(),
        cancel,
        async move {
            // Bounded by the daemon's own drain (`lifecycle`), which aborts us after it.
            inflight.drained().await;
        },
    )
    .await;
}

/// Which `Host` (and `Origin` host) names are ours.
#[derive(Debug, Clone)]
struct HostRule {
    names: Vec<String>,
    /// Bound to 0.0.0.0 / ::: any Host reaches us (tokens are mandatory there);
    /// an `Origin` must then name the same host as `Host`.
    any: bool,
    /// `[http] cors_origins`: browser origins allowed in `Origin` (and preflights).
    cors_origins: Vec<String>,
}

impl HostRule {
    fn new(config: &HttpConfig, local: Option<SocketAddr>) -> HostRule {
        let mut names: Vec<String> = ["localhost", "127.0.0.1", "::1"]
            .into_iter()
            .map(String::from)
            .chain(config.allowed_hosts.iter().map(|h| normalize_host(h)))
            .collect();
        let mut any = false;
        if let Some(local) = local {
            let ip = local.ip();
            if ip.is_unspecified() {
                any = true;
            } else if !ip.is_loopback() {
                names.push(ip.to_string());
            }
        }
        let cors_origins = config
            .cors_origins
            .iter()
            .map(|o| o.trim().trim_end_matches('/').to_string())
            .collect();
        HostRule {
            names,
            any,
            cors_origins,
        }
    }

    fn allows(&self, host: &str, remote_host: Option<&str>) -> bool {
        self.names.iter().any(|name| name == host) || remote_host == Some(host)
    }

    /// `Err(reason)` when the request must be refused with 403. `remote_host` is the
    /// public URL's host while remote access is on.
    fn check(&self, headers: &HeaderMap, remote_host: Option<&str>) -> Result<(), &'static str> {
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .and_then(host_of_authority)
            .ok_or("the Host header is missing or malformed")?;
        if !self.any && !self.allows(&host, remote_host) {
            return Err("the Host header names another server (DNS rebinding protection)");
        }
        let Some(origin) = headers.get(header::ORIGIN) else {
            return Ok(());
        };
        if origin.to_str().is_ok_and(|o| {
            self.cors_origins
                .iter()
                .any(|c| c == o.trim_end_matches('/'))
        }) {
            return Ok(());
        }
        let origin_host = origin
            .to_str()
            .ok()
            .and_then(|o| o.split_once("://"))
            .filter(|(scheme, _)| {
                scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https")
            })
            .and_then(|(_, rest)| host_of_authority(rest.trim_end_matches('/')))
            .ok_or("the Origin header is not an http(s) origin")?;
        if self.allows(&origin_host, remote_host) || (self.any && origin_host == host) {
            Ok(())
        } else {
            Err("requests from this Origin are not allowed (DNS rebinding protection)")
        }
    }
}

fn normalize_host(host: &str) -> String {
    host.trim().trim_matches(['[', ']']).to_ascii_lowercase()
}

/// The host of `host[:port]` / `[v6]:port`, lowercased, without brackets.
fn host_of_authority(authority: &str) -> Option<String> {
    let authority: axum::http::uri::Authority = authority.trim().parse().ok()?;
    if authority.as_str().contains('@') {
        return None;
    }
    Some(normalize_host(authority.host()))
}

struct App {
    context: Arc<DaemonContext>,
    /// The listener's port (names the web view's cookie).
    local_port: u16,
    hosts: HostRule,
    cancel: CancellationToken,
    open: McpService,
    pinned: Mutex<HashMap<String, McpService>>,
    /// Bad bearer tokens per source (429 past `[http] failed_auth_per_minute`).
    failed_auth: FailedAuth,
}

impl App {
    fn new(
        context: Arc<DaemonContext>,
        config: &HttpConfig,
        local: Option<SocketAddr>,
        cancel: CancellationToken,
    ) -> App {
        let open = mcp_service(&context, Binding::Open, &cancel);
        App {
            hosts: HostRule::new(config, local),
            local_port: local.map_or(0, |a| a.port()),
            context,
            cancel,
            open,
            pinned: Mutex::new(HashMap::new()),
            failed_auth: FailedAuth::new(config.failed_auth_per_minute, Duration::from_secs(60)),
        }
    }

    fn pinned_service(&self, slug: &str) -> McpService {
        let mut pinned = self.pinned.lock().unwrap_or_else(|p| p.into_inner());
        pinned
            .entry(slug.to_string())
            .or_insert_with(|| {
                mcp_service(
                    &self.context,
                    Binding::Pinned {
                        workspace: slug.to_string(),
                    },
                    &self.cancel,
                )
            })
            .clone()
    }

    /// The token's grant for `endpoint` (`None`: `/mcp`), or an unlimited grant when
    /// tokens are off. Remote access turns tokens on; an OAuth token must name our
    /// issuer, exactly this endpoint as audience, and a live grant.
    fn authenticate(&self, headers: &HeaderMap, endpoint: Option<&str>) -> Result<Grant, Denial> {
        let auth: &Auth = &self.context.auth;
        let remote = self.context.oauth.remote();
        let challenge = |refusal| Denial::Unauthorized {
            refusal,
            remote: remote
                .as_ref()
                .map(|r| r.metadata_url(endpoint.filter(|_| r.serves(endpoint)))),
        };
        if !auth.tokens_enabled() && remote.is_none() {
            return Ok(Grant::everything());
        }
        let token = headers
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| {
                let (scheme, token) = value.trim().split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            });
        let Some(token) = token else {
            return Err(challenge(Refusal::Missing));
        };
        let grant = auth.verify(token).map_err(challenge)?;
        if let Some(claims) = &grant.oauth {
            let Some(remote) = &remote else {
                return Err(challenge(Refusal::Invalid));
            };
            if claims.iss != remote.issuer()
                || claims.aud != remote.resource(endpoint)
                || !remote.serves(endpoint)
                || !self.context.oauth.grant_live(&claims.grant_id)
            {
                return Err(challenge(Refusal::Invalid));
            }
        }
        Ok(grant)
    }
}

/// Why a request does not reach MCP.
enum Denial {
    /// `remote`: the Protected Resource Metadata URL to point at, with remote access on.
    Unauthorized {
        refusal: Refusal,
        remote: Option<String>,
    },
    /// A token limited to this other workspace.
    OutOfScope(String),
    NoSuchWorkspace,
}

impl Denial {
    fn into_response(self) -> Response {
        match self {
            Denial::Unauthorized { refusal, remote } => unauthorized(refusal, remote.as_deref()),
            Denial::OutOfScope(limit) => insufficient_scope(&limit),
            Denial::NoSuchWorkspace => plain(
                StatusCode::NOT_FOUND,
                "no such workspace: `alexandria workspace list` shows them",
            ),
        }
    }
}

fn mcp_service(
    context: &Arc<DaemonContext>,
    binding: Binding,
    cancel: &CancellationToken,
) -> McpService {
    let mut sessions = LocalSessionManager::default();
    sessions.session_config.keep_alive = Some(SESSION_IDLE_TIMEOUT);
    let config = StreamableHttpServerConfig::default()
        // Host and Origin are checked in `entry` for every route, with our rules.
        .disable_allowed_hosts()
        .with_sse_keep_alive(Some(SSE_KEEP_ALIVE))
        .with_max_request_body_bytes(MAX_BODY_BYTES)
        .with_cancellation_token(cancel.child_token());
    let context = Arc::clone(context);
    let sessions = Arc::new(sessions);
    let service = StreamableHttpService::new(
        move || {
            // Runs per session, and also for one-off uses (2026-07-28 stateless
            // requests, schema look-ups): the session is listed only once it
            // initializes, and unlisted when the server is dropped.
            let session = Arc::new(SessionInfo::new("http", binding.clone(), None, None, false));
            let listing = Arc::new(SessionListing::new(
                Arc::clone(&context.sessions),
                Arc::clone(&session),
            ));
            Ok(AlexandriaServer::new(Arc::clone(&context.store), session).with_listing(listing))
        },
        Arc::clone(&sessions),
        config,
    );
    McpService { service, sessions }
}

enum Route<'a> {
    Health,
    Open,
    Pinned(&'a str),
    WorkspaceHealth(&'a str),
    /// The web view (`crate::web`).
    Web,
    Unknown,
}

fn route(path: &str) -> Route<'_> {
    let path = path
        .strip_suffix('/')
        .filter(|p| !p.is_empty())
        .unwrap_or(path);
    match path {
        "/health" => Route::Health,
        "/mcp" => Route::Open,
        _ => match path.strip_prefix("/mcp/").map(|rest| rest.split_once('/')) {
            Some(None) => Route::Pinned(&path["/mcp/".len()..]),
            Some(Some((slug, "health"))) => Route::WorkspaceHealth(slug),
            _ if crate::web::is_web_path(path) => Route::Web,
            _ => Route::Unknown,
        },
    }
}

async fn entry(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
) -> Response {
    let remote = app.context.oauth.remote();
    if let Err(reason) = app
        .hosts
        .check(request.headers(), remote.as_ref().map(|r| r.host.as_str()))
    {
        tracing::warn!(
            reason,
            path = request.uri().path(),
            "refused an HTTP request"
        );
        return plain(StatusCode::FORBIDDEN, reason);
    }
    let origin = request
        .headers()
        .get(header::ORIGIN)
        .and_then(|o| o.to_str().ok())
        .map(|o| o.trim_end_matches('/').to_string())
        .filter(|o| app.hosts.cors_origins.iter().any(|c| c == o));
    if request.method() == Method::OPTIONS {
        return preflight(&request, origin.as_deref());
    }
    if let Some(length) = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        && length > MAX_BODY_BYTES as u64
    {
        return too_large();
    }
    // Bad bearer tokens are counted per source; past the budget one is refused before
    // anything else looks at it. A valid token, or none, always goes on.
    let failure_key = FailedAuth::key(peer);
    let bearer = bearer_of(request.headers()).map(str::to_owned);
    if let Some(token) = &bearer
        && let Some(retry) = app.failed_auth.blocked(&failure_key)
        && app.context.auth.verify(token).is_err()
    {
        tracing::warn!(%peer, "too many bad bearer tokens: 429");
        return too_many_failures(retry);
    }
    let mut response = route_request(&app, request, source_of(peer, remote.as_ref())).await;
    if bearer.is_some() && response.status() == StatusCode::UNAUTHORIZED {
        app.failed_auth.record(&failure_key);
    }
    if let Some(origin) = origin
        && let Ok(value) = HeaderValue::from_str(&origin)
    {
        let headers = response.headers_mut();
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, value);
        headers.insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static("Mcp-Session-Id, WWW-Authenticate"),
        );
        headers.append(header::VARY, HeaderValue::from_static("Origin"));
    }
    response
}

/// The bearer token of `Authorization`, if any.
fn bearer_of(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| {
            let (scheme, token) = value.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        })
}

/// 413 for a body over `MAX_BODY_BYTES`, said before any of it is read.
fn too_large() -> Response {
    json_response(
        StatusCode::PAYLOAD_TOO_LARGE,
        json!({
            "error": "too_large",
            "message": format!("the request body is larger than {MAX_BODY_BYTES} bytes"),
            "hint": "split the content into several smaller pages or calls",
        }),
    )
}

/// 429 once a source sent too many bad bearer tokens.
fn too_many_failures(retry: Duration) -> Response {
    let secs = retry.as_secs().max(1);
    let mut response = json_response(
        StatusCode::TOO_MANY_REQUESTS,
        json!({
            "error": "too_many_failed_attempts",
            "message": "too many requests with a bad token",
            "hint": format!("wait {secs}s; then get a new token (re-authorize the client, or `alexandria daemon auth token`)"),
        }),
    );
    if let Ok(value) = HeaderValue::from_str(&secs.to_string()) {
        response.headers_mut().insert(header::RETRY_AFTER, value);
    }
    response
}

/// The address rate limits count against: the peer, or with remote access on (the
/// tunnel connects from loopback) the client address the tunnel reports.
fn source_of(peer: SocketAddr, remote: Option<&Remote>) -> String {
    let _ = remote;
    peer.ip().to_string()
}

/// Answer a CORS preflight: the metadata documents for anyone, the MCP endpoints for
/// `[http] cors_origins`.
fn preflight(request: &Request, origin: Option<&str>) -> Response {
    let path = request.uri().path();
    let public = path.starts_with("/.well-known/");
    let allow_origin = match (public, origin) {
        (true, _) => "*".to_string(),
        (false, Some(origin)) => origin.to_string(),
        (false, None) => {
            return plain(
                StatusCode::FORBIDDEN,
                "this Origin is not allowed: add it to [http] cors_origins in config.toml",
            );
        }
    };
    Response::builder()
        .status(StatusCode::NO_CONTENT)
        .header(header::ACCESS_CONTROL_ALLOW_ORIGIN, allow_origin)
        .header(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            "GET, POST, DELETE, OPTIONS",
        )
        .header(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            "Content-Type, Authorization, Mcp-Session-Id, MCP-Protocol-Version, Last-Event-ID, Accept",
        )
        .header(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            "Mcp-Session-Id, WWW-Authenticate",
        )
        .header(header::ACCESS_CONTROL_MAX_AGE, "600")
        .header(header::VARY, "Origin")
        .body(Body::empty())
        .expect("static response parts are valid")
}

async fn route_request(app: &Arc<App>, request: Request, source: String) -> Response {
    let path = request.uri().path().to_string();
    if http_oauth::is_oauth_path(&path) {
        return http_oauth::handle(&app.context, request, source).await;
    }
    match route(&path) {
        Route::Health => {
            if request.method() != Method::GET {
                return method_not_allowed("GET");
            }
            json_response(
                StatusCode::OK,
                json!({"status": "ok", "version": BUILD, "tokens": app.context.auth.tokens_enabled()}),
            )
        }
        Route::Open => {
            let grant = match app.authenticate(request.headers(), None) {
                Ok(grant) => grant,
                Err(denial) => return denial.into_response(),
            };
            let service = match &grant.workspace {
                // A workspace-limited token turns the open endpoint into that pin.
                Some(slug) => match workspace_exists(app, slug) {
                    Ok(()) => app.pinned_service(slug),
                    Err(denial) => return denial.into_response(),
                },
                None => app.open.clone(),
            };
            let request = match check_scope(app, &grant, None, request).await {
                Ok(request) => request,
                Err(response) => return response,
            };
            forward(&app.context, &service, request).await
        }
        Route::Pinned(slug) => {
            let grant = match admit_to_workspace(app, request.headers(), slug) {
                Ok(grant) => grant,
                Err(denial) => return denial.into_response(),
            };
            let request = match check_scope(app, &grant, Some(slug), request).await {
                Ok(request) => request,
                Err(response) => return response,
            };
            let service = app.pinned_service(slug);
            forward(&app.context, &service, request).await
        }
        Route::WorkspaceHealth(slug) => {
            if let Err(denial) = admit_to_workspace(app, request.headers(), slug) {
                return denial.into_response();
            }
            if request.method() != Method::GET {
                return method_not_allowed("GET");
            }
            json_response(
                StatusCode::OK,
                json!({"status": "ok", "version": BUILD, "workspace": slug}),
            )
        }
        Route::Web => {
            // A bearer token (when tokens are on) admits scripts; browsers use the
            // web view's session cookie.
            let access = if app.context.auth.tokens_enabled()
                && request.headers().contains_key(header::AUTHORIZATION)
            {
                // OAuth access tokens are for MCP endpoints only (their audience).
                match app.authenticate(request.headers(), None) {
                    Ok(grant) if grant.oauth.is_none() => crate::web::Access::Bearer {
                        workspace: grant.workspace,
                    },
                    Ok(_) => {
                        return plain(
                            StatusCode::FORBIDDEN,
                            "an OAuth access token does not open the web view",
                        );
                    }
                    Err(denial) => return denial.into_response(),
                }
            } else {
                crate::web::Access::Cookie
            };
            let port = app.local_port;
            crate::web::handle(Arc::clone(&app.context), request, access, port).await
        }
        Route::Unknown => plain(
            StatusCode::NOT_FOUND,
            "not found: alexandria serves /mcp, /mcp/<workspace> and /health",
        ),
    }
}

/// Tools that change a workspace; an OAuth token needs `wiki:write` for them.
const WRITING_TOOLS: [&str; 2] = ["write", "delete"];

/// For OAuth tokens: read the POST body, log its tool calls with the client id, and
/// refuse `write`/`delete` without `wiki:write` (403 `insufficient_scope`, which makes
/// clients ask for more). Other requests pass untouched.
async fn check_scope(
    app: &App,
    grant: &Grant,
    endpoint: Option<&str>,
    request: Request,
) -> Result<Request, Response> {
    let Some(claims) = &grant.oauth else {
        return Ok(request);
    };
    if request.method() != Method::POST {
        return Ok(request);
    }
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, MAX_BODY_BYTES)
        .await
        .map_err(|_| {
            plain(
                StatusCode::PAYLOAD_TOO_LARGE,
                "the request body is too large",
            )
        })?;
    let message: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    let messages = match &message {
        serde_json::Value::Array(batch) => batch.iter().collect(),
        single => vec![single],
    };
    for message in messages {
        if message["method"] != "tools/call" {
            continue;
        }
        let tool = message["params"]["name"].as_str().unwrap_or("");
        tracing::info!(
            client_id = %claims.client_id,
            tool,
            workspace = endpoint.or(message["params"]["arguments"]["workspace"].as_str()).unwrap_or("*"),
            "oauth tool call"
        );
        if WRITING_TOOLS.contains(&tool) && !claims.has_scope(SCOPE_WRITE) {
            let metadata = app
                .context
                .oauth
                .remote()
                .map(|r| r.metadata_url(endpoint))
                .unwrap_or_default();
            return Err(write_scope_needed(&metadata));
        }
    }
    Ok(Request::from_parts(parts, Body::from(bytes)))
}

/// Token, then the token's limit, then existence.
fn admit_to_workspace(app: &App, headers: &HeaderMap, slug: &str) -> Result<Grant, Denial> {
    let grant = app.authenticate(headers, Some(slug))?;
    match &grant.workspace {
        Some(limit) if limit != slug => Err(Denial::OutOfScope(limit.clone())),
        _ => workspace_exists(app, slug).map(|()| grant),
    }
}

fn workspace_exists(app: &App, slug: &str) -> Result<(), Denial> {
    match app.context.store.require_workspace(slug) {
        Ok(()) => Ok(()),
        Err(_) => Err(Denial::NoSuchWorkspace),
    }
}

async fn forward(context: &DaemonContext, endpoint: &McpService, mut request: Request) -> Response {
    let method = request.method().clone();
    // A POST (a tool call, above all) counts as in flight from the moment its body has
    // arrived whole until its answer is sent, as on the Unix socket: a stop waits for
    // it. Once the stop began it is refused as never started. (A body still arriving
    // is not started: a stop does not wait for a slow sender.)
    let guard = if method == Method::POST {
        let (parts, body) = request.into_parts();
        let bytes = match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
            Ok(bytes) => bytes,
            Err(_) => {
                return plain(
                    StatusCode::BAD_REQUEST,
                    "the request body could not be read (too large, or cut off)",
                );
            }
        };
        request = Request::from_parts(parts, Body::from(bytes));
        match context.inflight.try_begin() {
            Some(guard) => Some(guard),
            None => return daemon_stopping(),
        }
    } else {
        None
    };
    if method == Method::DELETE
        && let Some(id) = request
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
        && !endpoint
            .sessions
            .has_session(&id.to_string().into())
            .await
            .unwrap_or(true)
    {
        // rmcp would accept the DELETE of a session it does not know.
        return plain(StatusCode::NOT_FOUND, "Not Found: Session not found");
    }
    lenient_accept(method.clone(), request.headers_mut());
    let mut response = endpoint.service.handle(request).await.map(Body::new);
    // rmcp answers a DELETE with 202, but the session is already closed by then;
    // 204 says so, and the Python SDK warns on anything but 200/204.
    if method == Method::DELETE && response.status() == StatusCode::ACCEPTED {
        *response.status_mut() = StatusCode::NO_CONTENT;
    }
    match guard {
        Some(guard) => {
            let (parts, body) = response.into_parts();
            Response::from_parts(parts, Body::new(http_limits::GuardedBody::new(body, guard)))
        }
        None => response,
    }
}

/// 503 for a request that arrived after the daemon began to stop: it was not started.
fn daemon_stopping() -> Response {
    let mut response = json_response(
        StatusCode::SERVICE_UNAVAILABLE,
        json!({
            "error": "daemon_stopping",
            "message": "alexandriad is stopping; this request was not started",
            "hint": "send it again in a moment (the daemon restarts on the next connection)",
        }),
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    response
}

/// Clients that send no `Accept`, or only `*/*`, accept what we send; rmcp would
/// answer them 406. Explicit lists are left as they are.
fn lenient_accept(method: Method, headers: &mut HeaderMap) {
    let accepts_anything = match headers.get(header::ACCEPT).map(|v| v.to_str()) {
        None => true,
        Some(Ok(value)) => value.split(',').all(|entry| {
            let essence = entry.split(';').next().unwrap_or("").trim();
            essence == "*/*" || essence.is_empty()
        }),
        Some(Err(_)) => false,
    };
    if !accepts_anything {
        return;
    }
    let value = if method == Method::GET {
        HeaderValue::from_static("text/event-stream")
    } else {
        HeaderValue::from_static("application/json, text/event-stream")
    };
    headers.insert(header::ACCEPT, value);
}

fn plain(status: StatusCode, message: &'static str) -> Response {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Body::from(message))
        .expect("static response parts are valid")
}

fn json_response(status: StatusCode, value: serde_json::Value) -> Response {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(value.to_string()))
        .expect("static response parts are valid")
}

fn method_not_allowed(allow: &'static str) -> Response {
    Response::builder()
        .status(StatusCode::METHOD_NOT_ALLOWED)
        .header(header::ALLOW, allow)
        .body(Body::from("method not allowed"))
        .expect("static response parts are valid")
}

/// 401 with an RFC 6750 challenge (the scheme the MCP authorization spec uses). With
/// remote access on it names the endpoint's Protected Resource Metadata and the scope
/// to ask for, which is how OAuth clients discover the authorization server.
fn unauthorized(refusal: Refusal, resource_metadata: Option<&str>) -> Response {
    let mut challenge = match resource_metadata {
        Some(url) => format!("Bearer resource_metadata=\"{url}\", scope=\"{SCOPE_READ}\""),
        None => String::from("Bearer realm=\"alexandria\""),
    };
    if !refusal.error_code().is_empty() {
        challenge.push_str(&format!(
            ", error=\"{}\", error_description=\"{}\"",
            refusal.error_code(),
            refusal.description()
        ));
    }
    let body = json!({"error": "unauthorized", "message": refusal.description()});
    Response::builder()
        .status(StatusCode::UNAUTHORIZED)
        .header(header::WWW_AUTHENTICATE, challenge)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .expect("challenge parts are valid")
}

/// 403 for a write or delete with a read-only OAuth token.
fn write_scope_needed(resource_metadata: &str) -> Response {
    let body = json!({
        "error": "insufficient_scope",
        "message": "writing needs the wiki:write scope: approve the client again with write access",
    });
    Response::builder()
        .status(StatusCode::FORBIDDEN)
        .header(
            header::WWW_AUTHENTICATE,
            format!(
                "Bearer error=\"insufficient_scope\", scope=\"{SCOPE_READ} {SCOPE_WRITE}\", resource_metadata=\"{resource_metadata}\", error_description=\"writing needs wiki:write\""
            ),
        )
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap_or_else(|_| plain(StatusCode::FORBIDDEN, "writing needs the wiki:write scope"))
}

/// 403 for a workspace-limited token used on another workspace.
fn insufficient_scope(limit: &str) -> Response {
    let body = json!({
        "error": "insufficient_scope",
        "message": "this token is limited to one workspace",
        "workspace": limit,
    });
    Response::builder()
        .status(StatusCode::FORBIDDEN)
        .header(
            header::WWW_AUTHENTICATE,
            "Bearer realm=\"alexandria\", error=\"insufficient_scope\", error_description=\"this token is limited to another workspace\"",
        )
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .expect("static response parts are valid")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_static(value));
        }
        map
    }

    #[test]
    fn host_and_origin_rules() {
        let loopback = HostRule::new(&HttpConfig::default(), "127.0.0.1:7000".parse().ok());
        let cases: [(&[(&'static str, &'static str)], bool); 11] = [
            (&[("host", "127.0.0.1:7000")], true),
            (&[("host", "localhost:7000")], true),
            (&[("host", "LOCALHOST")], true),
            (&[("host", "[::1]:7000")], true),
            (&[("host", "evil.example:7000")], false),
            (&[("host", "127.0.0.1.evil.example")], false),
            (&[], false),
            (
                &[
                    ("host", "localhost:7000"),
                    ("origin", "http://localhost:6274"),
                ],
                true,
            ),
            (
                &[
                    ("host", "localhost:7000"),
                    ("origin", "http://evil.example"),
                ],
                false,
            ),
            (&[("host", "localhost:7000"), ("origin", "null")], false),
            (&[("host", "user@localhost:7000")], false),
        ];
        for (pairs, allowed) in cases {
            assert_eq!(
                loopback.check(&headers(pairs), None).is_ok(),
                allowed,
                "{pairs:?}"
            );
        }
        let config = HttpConfig {
            allowed_hosts: vec!["Wiki.Example.org".into()],
            ..HttpConfig::default()
        };
        let tunnel = HostRule::new(&config, "127.0.0.1:7000".parse().ok());
        assert!(
            tunnel
                .check(&headers(&[("host", "wiki.example.org")]), None)
                .is_ok()
        );
        let everywhere = HostRule::new(&HttpConfig::default(), "0.0.0.0:7000".parse().ok());
        assert!(
            everywhere
                .check(&headers(&[("host", "10.1.2.3:7000")]), None)
                .is_ok()
        );
        assert!(
            everywhere
                .check(
                    &headers(&[
                        ("host", "10.1.2.3:7000"),
                        ("origin", "http://10.1.2.3:7000")
                    ]),
                    None
                )
                .is_ok()
        );
        assert!(
            everywhere
                .check(
                    &headers(&[("host", "10.1.2.3:7000"), ("origin", "http://evil.example")]),
                    None
                )
                .is_err()
        );
    }

    #[test]
    fn routes() {
        assert!(matches!(route("/health"), Route::Health));
        assert!(matches!(route("/mcp"), Route::Open));
        assert!(matches!(route("/mcp/"), Route::Open));
        assert!(matches!(route("/mcp/acme"), Route::Pinned("acme")));
        assert!(matches!(route("/mcp/acme/"), Route::Pinned("acme")));
        assert!(matches!(
            route("/mcp/acme/health"),
            Route::WorkspaceHealth("acme")
        ));
        assert!(matches!(route("/mcp/acme/other"), Route::Unknown));
        assert!(matches!(route("/"), Route::Web));
        assert!(matches!(route("/w/acme/wiki/a.md"), Route::Web));
        assert!(matches!(route("/nowhere"), Route::Unknown));
        assert!(matches!(route("/mcpx"), Route::Unknown));
    }

    #[test]
    fn bind_addresses() {
        let config = HttpConfig::default();
        let none = HttpOverrides::default();
        assert_eq!(
            bind_address(&config, &none).expect("default").to_string(),
            format!("127.0.0.1:{}", alexandria_proto::DEFAULT_HTTP_PORT)
        );
        let over = HttpOverrides {
            bind: Some("::1".into()),
            port: Some(8080),
            token_required: false,
        };
        assert_eq!(
            bind_address(&config, &over).expect("v6").to_string(),
            "[::1]:8080"
        );
        let bad = HttpOverrides {
            bind: Some("example.com".into()),
            ..HttpOverrides::default()
        };
        assert!(bind_address(&config, &bad).is_err());
    }

    #[test]
    fn accept_is_completed_only_when_anything_goes() {
        for (given, post, expected) in [
            (None, true, Some("application/json, text/event-stream")),
            (
                Some("*/*"),
                true,
                Some("application/json, text/event-stream"),
            ),
            (Some("*/*"), false, Some("text/event-stream")),
            (Some("application/json"), true, Some("application/json")),
        ] {
            let mut map = HeaderMap::new();
            if let Some(value) = given {
                map.insert(header::ACCEPT, HeaderValue::from_static(value));
            }
            lenient_accept(if post { Method::POST } else { Method::GET }, &mut map);
            assert_eq!(
                map.get(header::ACCEPT).and_then(|v| v.to_str().ok()),
                expected
            );
        }
    }
}
