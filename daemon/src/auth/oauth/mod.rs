//! The OAuth 2.1 authorization server behind `alexandria remote`: what Claude.ai,
//! ChatGPT and other cloud MCP clients need to reach a user's daemon through a tunnel
//! (MCP authorization spec 2025-06-18 / 2025-11-25; RFC 8414, 7591, 7009, 8707, 9207).
//!
//! - Remote settings (`config.toml [remote]`): the public origin pins the issuer and
//!   every advertised URL.
//! - Clients (RFC 7591 dynamic registration) live in `state.db`, bounded; clients that
//!   never obtained a grant expire after a day.
//! - `/authorize` keeps a pending request in memory and shows a consent page; the
//!   owner approves with a one-time pairing code from `alexandria remote pair`.
//! - Authorization codes are in memory, single-use, 60 s, bound to the PKCE S256
//!   challenge, the client, the redirect URI and the resource.
//! - Access tokens are the daemon's HS256 JWTs (`super::Auth::mint_access`) with the
//!   exact resource URL as audience, 1 h; refresh tokens are random, stored as SHA-256
//!   hashes, rotated on every use, and a reused one revokes its whole grant.
//!
//! This module holds no HTTP: `transport/http_oauth.rs` maps requests onto it.
//! It may import `db`, `config` and `super` (the token authority).

pub mod cimd;
pub mod urls;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::{SecureRandom, SystemRandom};
use rusqlite::{OptionalExtension, params};
use serde_json::{Value, json};

use self::urls::{Url, check_redirect_uri, redirect_matches, with_query};
use super::{Auth, OAuthClaims};
use crate::config::RemoteConfig;
use crate::db::{Pool, now_ms};

pub const SCOPE_READ: &str = "wiki:read";
pub const SCOPE_WRITE: &str = "wiki:write";
pub const SCOPES: [&str; 2] = [SCOPE_READ, SCOPE_WRITE];
/// Access tokens live an hour; clients refresh them.
pub const ACCESS_TTL_SECS: u64 = 3600;
const CODE_TTL: Duration = Duration::from_secs(60);
const PAIRING_TTL: Duration = Duration::from_secs(600);
const PENDING_TTL: Duration = Duration::from_secs(600);
/// A refresh token unused this long is dead (the client must authorize again).
const REFRESH_IDLE_MS: i64 = 30 * 24 * 3600 * 1000;
/// Registered clients kept at most; a client that never got a grant expires after a day,
/// one whose grants are all gone after 30 days.
const MAX_CLIENTS: i64 = 200;
const UNUSED_CLIENT_MS: i64 = 24 * 3600 * 1000;
const IDLE_CLIENT_MS: i64 = 30 * 24 * 3600 * 1000;
const MAX_PENDING: usize = 64;
const MAX_CODES: usize = 256;
const MAX_PAIRING_CODES: usize = 5;
/// Wrong pairing codes: per pending request, then per source address and in total.
pub const WRONG_CODES_PER_REQUEST: u32 = 5;
const WRONG_CODES_PER_SOURCE: u32 = 10;
const WRONG_CODES_TOTAL: u32 = 30;
const WRONG_CODE_WINDOW: Duration = Duration::from_secs(600);
/// Registrations per source address per hour.
const REGISTRATIONS_PER_SOURCE: u32 = 20;
const REGISTRATION_WINDOW: Duration = Duration::from_secs(3600);
/// Pairing-code alphabet: no 0/O, 1/I/L.
const PAIRING_ALPHABET: &[u8] = b"ABCDEFGHJKMNPQRSTUVWXYZ23456789";

#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("{0}")]
    BadUrl(String),
    #[error("cannot save the remote settings: {0}")]
    Config(#[from] crate::config::ConfigError),
    #[error("database error: {0}")]
    Db(#[from] crate::db::DbError),
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("database pool: {0}")]
    Pool(#[from] r2d2::Error),
    #[error("the system random number generator failed")]
    Random,
}

/// Remote access as configured: the public origin and the workspaces it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remote {
    /// `scheme://host[:port]`, no trailing slash: the issuer.
    pub origin: String,
    /// The public host (lowercase), admitted by the Host/Origin check.
    pub host: String,
    /// Empty: every workspace (and the open `/mcp` endpoint).
    pub workspaces: Vec<String>,
}

impl Remote {
    /// Validate a public URL: https, or http on a loopback host (tests); an origin
    /// without a path.
    pub fn new(public_url: &str, workspaces: Vec<String>) -> Result<Remote, RemoteError> {
        let url = Url::parse(public_url.trim()).ok_or_else(|| {
            RemoteError::BadUrl(format!(
                "{public_url:?} is not an http(s) URL like https://wiki.example.ts.net"
            ))
        })?;
        if !url.https && !url.is_loopback() {
            return Err(RemoteError::BadUrl(format!(
                "{public_url:?} must use https: cloud clients refuse plain http (http is accepted only for 127.0.0.1/localhost, for tests)"
            )));
        }
        if url.path_and_query != "/" {
            return Err(RemoteError::BadUrl(format!(
                "{public_url:?} has a path or query: give the tunnel's origin only (https://host[:port]); the daemon serves /mcp and /.well-known at its root"
            )));
        }
        for slug in &workspaces {
            alexandria_proto::paths::validate_slug(slug)
                .map_err(|e| RemoteError::BadUrl(e.to_string()))?;
        }
        Ok(Remote {
            origin: url.origin(),
            host: url.host.clone(),
            workspaces,
        })
    }

    pub fn issuer(&self) -> &str {
        &self.origin
    }

    /// Whether `workspace` is reachable remotely (`None`: the open endpoint, only
    /// when every workspace is).
    pub fn serves(&self, workspace: Option<&str>) -> bool {
        match workspace {
            None => self.workspaces.is_empty(),
            Some(slug) => self.workspaces.is_empty() || self.workspaces.iter().any(|w| w == slug),
        }
    }

    /// The resource URL of an endpoint: `<origin>/mcp` or `<origin>/mcp/<slug>`.
    pub fn resource(&self, workspace: Option<&str>) -> String {
        match workspace {
            None => format!("{}/mcp", self.origin),
            Some(slug) => format!("{}/mcp/{slug}", self.origin),
        }
    }

    /// Where the endpoint's Protected Resource Metadata lives (RFC 9728 §3.1).
    pub fn metadata_url(&self, workspace: Option<&str>) -> String {
        match workspace {
            None => format!("{}/.well-known/oauth-protected-resource/mcp", self.origin),
            Some(slug) => format!(
                "{}/.well-known/oauth-protected-resource/mcp/{slug}",
                self.origin
            ),
        }
    }

    /// The endpoint a resource URL names: `Some(None)` for `/mcp`, `Some(Some(slug))`.
    pub fn endpoint_of(&self, resource: &str) -> Option<Option<String>> {
        let rest = resource.trim_end_matches('/').strip_prefix(&self.origin)?;
        if rest == "/mcp" {
            return Some(None);
        }
        let slug = rest.strip_prefix("/mcp/")?;
        alexandria_proto::paths::validate_slug(slug).ok()?;
        Some(Some(slug.to_string()))
    }

    /// RFC 9728 Protected Resource Metadata for an endpoint.
    pub fn resource_metadata(&self, workspace: Option<&str>) -> Value {
        json!({
            "resource": self.resource(workspace),
            "authorization_servers": [self.issuer()],
            "scopes_supported": SCOPES,
            "bearer_methods_supported": ["header"],
            "resource_name": match workspace {
                Some(slug) => format!("alexandria wiki '{slug}'"),
                None => "alexandria wikis".to_string(),
            },
        })
    }

    /// RFC 8414 Authorization Server Metadata.
    pub fn server_metadata(&self) -> Value {
        let origin = &self.origin;
        json!({
            "issuer": origin,
            "authorization_endpoint": format!("{origin}/authorize"),
            "token_endpoint": format!("{origin}/token"),
            "registration_endpoint": format!("{origin}/register"),
            "revocation_endpoint": format!("{origin}/revoke"),
            "response_types_supported": ["code"],
            "response_modes_supported": ["query"],
            "grant_types_supported": ["authorization_code", "refresh_token"],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": ["none", "client_secret_post", "client_secret_basic"],
            "revocation_endpoint_auth_methods_supported": ["none", "client_secret_post", "client_secret_basic"],
            "scopes_supported": [SCOPE_READ, SCOPE_WRITE, "offline_access"],
            "authorization_response_iss_parameter_supported": true,
            "client_id_metadata_document_supported": true,
        })
    }
}

/// A registered client.
#[derive(Debug, Clone)]
pub struct Client {
    pub client_id: String,
    pub name: Option<String>,
    pub redirect_uris: Vec<String>,
    pub auth_method: String,
    secret_hash: Option<String>,
}

/// An OAuth error answer: `error` and `error_description` (RFC 6749 §5.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OAuthFailure {
    /// HTTP status.
    pub status: u16,
    pub error: &'static str,
    pub description: String,
}

impl OAuthFailure {
    fn new(status: u16, error: &'static str, description: impl Into<String>) -> OAuthFailure {
        OAuthFailure {
            status,
            error,
            description: description.into(),
        }
    }
    fn internal(error: impl std::fmt::Display) -> OAuthFailure {
        tracing::error!(%error, "oauth: internal error");
        OAuthFailure::new(
            500,
            "server_error",
            "internal error; the daemon log has details",
        )
    }

    pub fn body(&self) -> Value {
        json!({"error": self.error, "error_description": self.description})
    }
}

/// Why `/authorize` cannot proceed.
#[derive(Debug)]
pub enum AuthorizeFailure {
    /// The client or redirect URI cannot be trusted: show an error page, never redirect.
    Page(String),
    /// Tell the client through its redirect URI.
    Redirect(String),
}

/// What the consent page shows about a pending request.
#[derive(Debug, Clone)]
pub struct Consent {
    pub request_id: String,
    pub csrf: String,
    pub client_name: String,
    pub client_id: String,
    pub redirect_host: String,
    /// `None`: every workspace (the open endpoint).
    pub workspace: Option<String>,
    pub scope: String,
    /// Origins the form may redirect to (for the page's CSP `form-action`).
    pub redirect_origin: String,
}

/// Why an approval failed.
#[derive(Debug, PartialEq, Eq)]
pub enum ApproveFailure {
    /// The request is unknown or expired, or the CSRF token does not match.
    Stale,
    /// Wrong or expired pairing code; `remaining` tries on this request.
    WrongCode { remaining: u32 },
    /// Too many wrong codes from this source or in total.
    RateLimited,
}

struct Pending {
    created: Instant,
    csrf: String,
    client_id: String,
    redirect_uri: String,
    state: Option<String>,
    code_challenge: String,
    resource: String,
    workspace: Option<String>,
    scope: String,
    failures: u32,
}

struct IssuedCode {
    created: Instant,
    client_id: String,
    redirect_uri: String,
    code_challenge: String,
    resource: String,
    workspace: Option<String>,
    scope: String,
    /// Set once exchanged: a second use revokes this grant (RFC 6749 §4.1.2).
    grant_id: Option<String>,
}

/// Sliding-window counters per key, bounded.
#[derive(Default)]
struct Limits {
    windows: HashMap<String, (Instant, u32)>,
}

impl Limits {
    fn count(&mut self, key: &str, window: Duration) -> u32 {
        match self.windows.get(key) {
            Some((start, count)) if start.elapsed() < window => *count,
            _ => 0,
        }
    }

    fn add(&mut self, key: &str, window: Duration) -> u32 {
        if self.windows.len() > 10_000 {
            self.windows
                .retain(|_, (start, _)| start.elapsed() < Duration::from_secs(3600));
        }
        let entry = self
            .windows
            .entry(key.to_string())
            .or_insert((Instant::now(), 0));
        if entry.0.elapsed() >= window {
            *entry = (Instant::now(), 0);
        }
        entry.1 += 1;
        entry.1
    }
}

#[derive(Default)]
struct Volatile {
    pairing: Vec<(String, Instant)>,
    pending: HashMap<String, Pending>,
    codes: HashMap<String, IssuedCode>,
    limits: Limits,
}

impl Volatile {
    fn prune(&mut self) {
        self.pairing.retain(|(_, at)| at.elapsed() < PAIRING_TTL);
        self.pending
            .retain(|_, p| p.created.elapsed() < PENDING_TTL);
        // Exchanged codes are kept a little longer, to catch replays.
        self.codes.retain(|_, c| c.created.elapsed() < CODE_TTL * 5);
    }
}

/// The authorization server.
pub struct OAuthServer {
    pool: Pool,
    config_file: PathBuf,
    remote: RwLock<Option<Remote>>,
    volatile: Mutex<Volatile>,
    /// Grants revoked lately (access tokens of these die before their `exp`).
    revoked: RwLock<HashSet<String>>,
}

impl OAuthServer {
    /// Load the remote settings (an invalid `[remote]` is logged and leaves remote
    /// access off) and the grants revoked within an access token's lifetime.
    pub fn load(
        pool: Pool,
        config_file: PathBuf,
        config: &RemoteConfig,
    ) -> Result<OAuthServer, RemoteError> {
        let remote = if config.enabled {
            match Remote::new(&config.public_url, config.workspaces.clone()) {
                Ok(remote) => Some(remote),
                Err(error) => {
                    tracing::error!(%error, "config.toml [remote] is not valid: remote access is off");
                    None
                }
            }
        } else {
            None
        };
        let since = now_ms() - 2 * ACCESS_TTL_SECS as i64 * 1000;
        let revoked = {
            let connection = pool.get()?;
            let mut statement = connection.prepare(
                "SELECT id FROM oauth_grants WHERE revoked_at IS NOT NULL AND revoked_at > ?1",
            )?;
            statement
                .query_map([since], |row| row.get::<_, String>(0))?
                .collect::<Result<HashSet<_>, _>>()?
        };
        Ok(OAuthServer {
            pool,
            config_file,
            remote: RwLock::new(remote),
            volatile: Mutex::new(Volatile::default()),
            revoked: RwLock::new(revoked),
        })
    }

    pub fn remote(&self) -> Option<Remote> {
        self.remote
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn volatile(&self) -> std::sync::MutexGuard<'_, Volatile> {
        let mut guard = self.volatile.lock().unwrap_or_else(|p| p.into_inner());
        guard.prune();
        guard
    }

    /// Turn remote access on (written to `config.toml`, applied at once).
    pub fn enable(&self, public_url: &str, workspaces: Vec<String>) -> Result<Remote, RemoteError> {
        let remote = Remote::new(public_url, workspaces)?;
        crate::config::save_remote(
            &self.config_file,
            &RemoteConfig {
                enabled: true,
                public_url: remote.origin.clone(),
                workspaces: remote.workspaces.clone(),
            },
        )?;
        *self.remote.write().unwrap_or_else(|p| p.into_inner()) = Some(remote.clone());
        Ok(remote)
    }

    /// Turn remote access off; the public URL stays in the file for the next enable.
    pub fn disable(&self) -> Result<(), RemoteError> {
        let mut guard = self.remote.write().unwrap_or_else(|p| p.into_inner());
        let previous = guard.take();
        crate::config::save_remote(
            &self.config_file,
            &RemoteConfig {
                enabled: false,
                public_url: previous
                    .as_ref()
                    .map_or(String::new(), |r| r.origin.clone()),
                workspaces: previous.map_or(Vec::new(), |r| r.workspaces),
            },
        )?;
        let mut volatile = self.volatile();
        volatile.pairing.clear();
        volatile.pending.clear();
        volatile.codes.clear();
        Ok(())
    }

    /// A new one-time pairing code, `XXXX-XXXX`, and its lifetime in seconds.
    pub fn pair(&self) -> Result<(String, u64), RemoteError> {
        let mut bytes = [0u8; 8];
        SystemRandom::new()
            .fill(&mut bytes)
            .map_err(|_| RemoteError::Random)?;
        let chars: String = bytes
            .iter()
            .map(|b| PAIRING_ALPHABET[*b as usize % PAIRING_ALPHABET.len()] as char)
            .collect();
        let code = format!("{}-{}", &chars[..4], &chars[4..]);
        let mut volatile = self.volatile();
        if volatile.pairing.len() >= MAX_PAIRING_CODES {
            volatile.pairing.remove(0);
        }
        volatile
            .pairing
            .push((normalize_code(&code), Instant::now()));
        Ok((code, PAIRING_TTL.as_secs()))
    }

    /// Whether this grant may still be used (its access tokens are otherwise valid).
    pub fn grant_live(&self, grant_id: &str) -> bool {
        !self
            .revoked
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains(grant_id)
    }

    /// Count a registration from `source`; false once over the limit.
    pub fn allow_registration(&self, source: &str) -> bool {
        let mut volatile = self.volatile();
        volatile
            .limits
            .add(&format!("register {source}"), REGISTRATION_WINDOW)
            <= REGISTRATIONS_PER_SOURCE
    }

    /// RFC 7591 registration. Returns the 201 body.
    pub fn register(&self, request: &Value) -> Result<Value, OAuthFailure> {
        let invalid = |text: &str| OAuthFailure::new(400, "invalid_client_metadata", text);
        let Some(object) = request.as_object() else {
            return Err(invalid("the body must be a JSON object"));
        };
        let redirect_uris: Vec<String> = match object.get("redirect_uris") {
            Some(Value::Array(uris)) if !uris.is_empty() && uris.len() <= 10 => uris
                .iter()
                .map(|u| u.as_str().map(str::to_string))
                .collect::<Option<_>>()
                .ok_or_else(|| invalid("redirect_uris must be strings"))?,
            _ => return Err(invalid("redirect_uris must list 1 to 10 URIs")),
        };
        for uri in &redirect_uris {
            if uri.len() > 2000 {
                return Err(OAuthFailure::new(
                    400,
                    "invalid_redirect_uri",
                    "redirect URI too long",
                ));
            }
            check_redirect_uri(uri).map_err(|why| {
                OAuthFailure::new(400, "invalid_redirect_uri", format!("{uri}: {why}"))
            })?;
        }
        let auth_method = match object
            .get("token_endpoint_auth_method")
            .and_then(Value::as_str)
        {
            None => "client_secret_basic",
            Some(m @ ("none" | "client_secret_post" | "client_secret_basic")) => m,
            Some(other) => {
                return Err(invalid(&format!(
                    "token_endpoint_auth_method {other:?} is not supported (none, client_secret_post, client_secret_basic)"
                )));
            }
        };
        if let Some(grants) = object.get("grant_types").and_then(Value::as_array)
            && grants
                .iter()
                .any(|g| !matches!(g.as_str(), Some("authorization_code" | "refresh_token")))
        {
            return Err(invalid(
                "only the authorization_code and refresh_token grants are supported",
            ));
        }
        let name: Option<String> = object
            .get("client_name")
            .and_then(Value::as_str)
            .map(|n| n.chars().filter(|c| !c.is_control()).take(100).collect());
        let client_id = format!("alx-{}", random_token(16).map_err(OAuthFailure::internal)?);
        let secret = if auth_method == "none" {
            None
        } else {
            Some(random_token(32).map_err(OAuthFailure::internal)?)
        };
        let now = now_ms();
        let connection = self.pool.get().map_err(OAuthFailure::internal)?;
        // Forget clients that never got a grant within a day, or idle for 30 days.
        connection
            .execute(
                "DELETE FROM oauth_clients WHERE
                   (last_used_at IS NULL AND created_at < ?1) OR (last_used_at < ?2)",
                params![now - UNUSED_CLIENT_MS, now - IDLE_CLIENT_MS],
            )
            .map_err(OAuthFailure::internal)?;
        let count: i64 = connection
            .query_row("SELECT count(*) FROM oauth_clients", [], |r| r.get(0))
            .map_err(OAuthFailure::internal)?;
        if count >= MAX_CLIENTS {
            return Err(OAuthFailure::new(
                429,
                "temporarily_unavailable",
                "too many registered clients: remove some with `alexandria remote revoke`",
            ));
        }
        let metadata = serde_json::to_string(request).map_err(OAuthFailure::internal)?;
        if metadata.len() > 16 * 1024 {
            return Err(invalid("client metadata too large"));
        }
        connection
            .execute(
                "INSERT INTO oauth_clients (client_id, secret_hash, auth_method, name, redirect_uris, metadata, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![
                    client_id,
                    secret.as_deref().map(sha256_hex),
                    auth_method,
                    name,
                    serde_json::to_string(&redirect_uris).map_err(OAuthFailure::internal)?,
                    metadata,
                    now,
                ],
            )
            .map_err(OAuthFailure::internal)?;
        let mut reply = json!({
            "client_id": client_id,
            "client_id_issued_at": now / 1000,
            "redirect_uris": redirect_uris,
            "token_endpoint_auth_method": auth_method,
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
        });
        if let Some(name) = name {
            reply["client_name"] = json!(name);
        }
        if let Some(scope) = object.get("scope").and_then(Value::as_str) {
            reply["scope"] = json!(scope);
        }
        if let Some(secret) = secret {
            reply["client_secret"] = json!(secret);
            reply["client_secret_expires_at"] = json!(0);
        }
        tracing::info!(client_id = %reply["client_id"], auth_method, "oauth: client registered");
        Ok(reply)
    }

    /// A client: registered (RFC 7591), or described by the metadata document its
    /// URL-shaped `client_id` points at (CIMD, `cimd.rs`), fetched when not fresh.
    pub fn client(&self, client_id: &str) -> Result<Option<Client>, OAuthFailure> {
        let recorded = self.recorded_client(client_id)?;
        if !cimd::is_document_url(client_id)
            || (recorded.is_some() && cimd::cached(client_id).is_some())
        {
            return Ok(recorded);
        }
        let allow_loopback = self
            .remote()
            .and_then(|remote| Url::parse(remote.issuer()))
            .is_some_and(|url| url.is_loopback());
        match cimd::fetch(client_id, allow_loopback) {
            Ok(document) => {
                let uris = serde_json::to_string(&document.redirect_uris)
                    .map_err(OAuthFailure::internal)?;
                let connection = self.pool.get().map_err(OAuthFailure::internal)?;
                connection
                    .execute(
                        "INSERT INTO oauth_clients(client_id, secret_hash, auth_method, name, redirect_uris, metadata, created_at)
                         VALUES (?1, NULL, 'none', ?2, ?3, ?4, ?5)
                         ON CONFLICT(client_id) DO UPDATE SET name = excluded.name,
                           redirect_uris = excluded.redirect_uris, metadata = excluded.metadata",
                        params![client_id, document.name, uris, document.raw.to_string(), now_ms()],
                    )
                    .map_err(OAuthFailure::internal)?;
                tracing::info!(client_id, "oauth: client metadata document fetched");
                Ok(Some(Client {
                    client_id: client_id.to_string(),
                    name: document.name,
                    redirect_uris: document.redirect_uris,
                    auth_method: "none".into(),
                    secret_hash: None,
                }))
            }
            Err(why) => match recorded {
                Some(client) => {
                    tracing::warn!(
                        client_id,
                        why,
                        "oauth: client metadata document unavailable; using the recorded copy"
                    );
                    Ok(Some(client))
                }
                None => Err(OAuthFailure::new(
                    400,
                    "invalid_client",
                    format!("the client metadata document at {client_id} cannot be used: {why}"),
                )),
            },
        }
    }

    fn recorded_client(&self, client_id: &str) -> Result<Option<Client>, OAuthFailure> {
        let connection = self.pool.get().map_err(OAuthFailure::internal)?;
        connection
            .query_row(
                "SELECT client_id, name, redirect_uris, auth_method, secret_hash FROM oauth_clients WHERE client_id = ?1",
                [client_id],
                |row| {
                    let uris: String = row.get(2)?;
                    Ok(Client {
                        client_id: row.get(0)?,
                        name: row.get(1)?,
                        redirect_uris: serde_json::from_str(&uris).unwrap_or_default(),
                        auth_method: row.get(3)?,
                        secret_hash: row.get(4)?,
                    })
                },
            )
            .optional()
            .map_err(OAuthFailure::internal)
    }

    /// Validate an authorization request (`/authorize` query) and keep it pending
    /// for the consent page.
    pub fn begin_authorization(
        &self,
        query: &HashMap<String, String>,
    ) -> Result<Consent, AuthorizeFailure> {
        let Some(remote) = self.remote() else {
            return Err(AuthorizeFailure::Page("remote access is off".into()));
        };
        let client_id = query
            .get("client_id")
            .ok_or_else(|| AuthorizeFailure::Page("client_id is missing".into()))?;
        let client = self
            .client(client_id)
            .map_err(|e| AuthorizeFailure::Page(e.description))?
            .ok_or_else(|| {
                AuthorizeFailure::Page(
                    "unknown client: it may have expired or been revoked; remove and add the connector again".into(),
                )
            })?;
        let redirect_uri = match query.get("redirect_uri") {
            Some(uri) => client
                .redirect_uris
                .iter()
                .any(|registered| redirect_matches(registered, uri))
                .then(|| uri.clone())
                .ok_or_else(|| {
                    AuthorizeFailure::Page(format!(
                        "the redirect URI {uri} is not one this client registered"
                    ))
                })?,
            None if client.redirect_uris.len() == 1 => client.redirect_uris[0].clone(),
            None => {
                return Err(AuthorizeFailure::Page(
                    "redirect_uri is missing and the client registered several".into(),
                ));
            }
        };
        // From here on, errors go back to the (now trusted) redirect URI.
        let state = query.get("state").cloned();
        let fail = |error: &str, description: &str| {
            let mut params = vec![
                ("error", error),
                ("error_description", description),
                ("iss", remote.issuer()),
            ];
            if let Some(state) = &state {
                params.push(("state", state));
            }
            AuthorizeFailure::Redirect(with_query(&redirect_uri, &params))
        };
        if query.get("response_type").map(String::as_str) != Some("code") {
            return Err(fail(
                "unsupported_response_type",
                "response_type must be code",
            ));
        }
        let challenge = query
            .get("code_challenge")
            .map(String::as_str)
            .unwrap_or("");
        if query.get("code_challenge_method").map(String::as_str) != Some("S256")
            || challenge.len() != 43
            || URL_SAFE_NO_PAD.decode(challenge).is_err()
        {
            return Err(fail(
                "invalid_request",
                "PKCE is required: code_challenge (43 characters) with code_challenge_method=S256",
            ));
        }
        let resource = match query.get("resource") {
            Some(resource) => resource.trim_end_matches('/').to_string(),
            // Clients of the 2025-03-26 spec send no resource: the open endpoint, if served.
            None => remote.resource(None),
        };
        let Some(workspace) = remote.endpoint_of(&resource) else {
            return Err(fail(
                "invalid_target",
                &format!("{resource} is not an endpoint of this server"),
            ));
        };
        if !remote.serves(workspace.as_deref()) {
            return Err(fail(
                "invalid_target",
                "this endpoint is not shared remotely (`alexandria remote enable --workspace …`)",
            ));
        }
        let scope = match granted_scope(query.get("scope").map(String::as_str)) {
            Ok(scope) => scope,
            Err(unknown) => {
                return Err(fail("invalid_scope", &format!("unknown scope {unknown:?}")));
            }
        };
        let request_id = random_token(32).map_err(|e| AuthorizeFailure::Page(e.to_string()))?;
        let csrf = random_token(32).map_err(|e| AuthorizeFailure::Page(e.to_string()))?;
        let redirect_url = Url::parse(&redirect_uri)
            .ok_or_else(|| AuthorizeFailure::Page("the redirect URI is not a URL".into()))?;
        let consent = Consent {
            request_id: request_id.clone(),
            csrf: csrf.clone(),
            client_name: client
                .name
                .clone()
                .unwrap_or_else(|| "an unnamed client".into()),
            client_id: client.client_id.clone(),
            redirect_host: redirect_url.host.clone(),
            redirect_origin: redirect_url.origin(),
            workspace: workspace.clone(),
            scope: scope.clone(),
        };
        let mut volatile = self.volatile();
        if volatile.pending.len() >= MAX_PENDING
            && let Some(oldest) = volatile
                .pending
                .iter()
                .min_by_key(|(_, p)| p.created)
                .map(|(id, _)| id.clone())
        {
            volatile.pending.remove(&oldest);
        }
        volatile.pending.insert(
            request_id,
            Pending {
                created: Instant::now(),
                csrf,
                client_id: client.client_id,
                redirect_uri,
                state,
                code_challenge: challenge.to_string(),
                resource,
                workspace,
                scope,
                failures: 0,
            },
        );
        Ok(consent)
    }

    /// The consent data of a pending request (to show the form again).
    pub fn pending_consent(&self, request_id: &str) -> Option<Consent> {
        let volatile = self.volatile();
        let pending = volatile.pending.get(request_id)?;
        let url = Url::parse(&pending.redirect_uri)?;
        let client = self.client(&pending.client_id).ok().flatten()?;
        Some(Consent {
            request_id: request_id.to_string(),
            csrf: pending.csrf.clone(),
            client_name: client.name.unwrap_or_else(|| "an unnamed client".into()),
            client_id: pending.client_id.clone(),
            redirect_host: url.host.clone(),
            redirect_origin: url.origin(),
            workspace: pending.workspace.clone(),
            scope: pending.scope.clone(),
        })
    }

    /// The owner's answer on the consent page. On approval with a valid pairing code
    /// (consumed), returns the redirect with `code`, `state` and `iss`; on denial the
    /// redirect with `error=access_denied`.
    pub fn decide(
        &self,
        request_id: &str,
        csrf: &str,
        pairing_code: &str,
        approve: bool,
        source: &str,
    ) -> Result<String, ApproveFailure> {
        let remote = self.remote().ok_or(ApproveFailure::Stale)?;
        let mut volatile = self.volatile();
        let Some(pending) = volatile.pending.get(request_id) else {
            return Err(ApproveFailure::Stale);
        };
        if !constant_time_eq(pending.csrf.as_bytes(), csrf.as_bytes()) {
            return Err(ApproveFailure::Stale);
        }
        if !approve {
            let pending = volatile
                .pending
                .remove(request_id)
                .ok_or(ApproveFailure::Stale)?;
            let mut params = vec![
                ("error", "access_denied"),
                ("error_description", "the owner declined"),
                ("iss", remote.issuer()),
            ];
            if let Some(state) = &pending.state {
                params.push(("state", state));
            }
            return Ok(with_query(&pending.redirect_uri, &params));
        }
        let source_key = format!("wrong-code {source}");
        if volatile.limits.count(&source_key, WRONG_CODE_WINDOW) >= WRONG_CODES_PER_SOURCE
            || volatile.limits.count("wrong-code *", WRONG_CODE_WINDOW) >= WRONG_CODES_TOTAL
        {
            return Err(ApproveFailure::RateLimited);
        }
        let wanted = normalize_code(pairing_code);
        let position = volatile.pairing.iter().position(|(code, _)| {
            !wanted.is_empty() && constant_time_eq(code.as_bytes(), wanted.as_bytes())
        });
        let Some(position) = position else {
            volatile.limits.add(&source_key, WRONG_CODE_WINDOW);
            volatile.limits.add("wrong-code *", WRONG_CODE_WINDOW);
            let pending = volatile
                .pending
                .get_mut(request_id)
                .ok_or(ApproveFailure::Stale)?;
            pending.failures += 1;
            let remaining = WRONG_CODES_PER_REQUEST.saturating_sub(pending.failures);
            if remaining == 0 {
                volatile.pending.remove(request_id);
            }
            tracing::warn!(source, "oauth: wrong pairing code on the consent page");
            return Err(ApproveFailure::WrongCode { remaining });
        };
        volatile.pairing.remove(position);
        let pending = volatile
            .pending
            .remove(request_id)
            .ok_or(ApproveFailure::Stale)?;
        let code = random_token(32).map_err(|_| ApproveFailure::Stale)?;
        if volatile.codes.len() >= MAX_CODES
            && let Some(oldest) = volatile
                .codes
                .iter()
                .min_by_key(|(_, c)| c.created)
                .map(|(k, _)| k.clone())
        {
            volatile.codes.remove(&oldest);
        }
        volatile.codes.insert(
            sha256_hex(&code),
            IssuedCode {
                created: Instant::now(),
                client_id: pending.client_id.clone(),
                redirect_uri: pending.redirect_uri.clone(),
                code_challenge: pending.code_challenge,
                resource: pending.resource,
                workspace: pending.workspace,
                scope: pending.scope,
                grant_id: None,
            },
        );
        tracing::info!(client_id = %pending.client_id, "oauth: the owner approved a client");
        let mut params = vec![("code", code.as_str()), ("iss", remote.issuer())];
        if let Some(state) = &pending.state {
            params.push(("state", state));
        }
        Ok(with_query(&pending.redirect_uri, &params))
    }

    /// Client authentication at `/token` and `/revoke`: the client, or 401 invalid_client.
    fn authenticate_client(
        &self,
        form: &HashMap<String, String>,
        basic: Option<(String, String)>,
    ) -> Result<Client, OAuthFailure> {
        let unknown = || {
            OAuthFailure::new(
                401,
                "invalid_client",
                "unknown client or bad credentials: register again",
            )
        };
        let (client_id, secret) = match (&basic, form.get("client_id")) {
            (Some((id, secret)), _) => (id.clone(), Some(secret.clone())),
            (None, Some(id)) => (id.clone(), form.get("client_secret").cloned()),
            (None, None) => return Err(unknown()),
        };
        let client = self.client(&client_id)?.ok_or_else(unknown)?;
        match (&client.secret_hash, secret) {
            (None, _) => Ok(client),
            (Some(hash), Some(secret))
                if constant_time_eq(hash.as_bytes(), sha256_hex(&secret).as_bytes()) =>
            {
                Ok(client)
            }
            _ => Err(unknown()),
        }
    }

    /// `/token`: the authorization-code and refresh-token grants. The 200 body.
    pub fn token(
        &self,
        auth: &Auth,
        form: &HashMap<String, String>,
        basic: Option<(String, String)>,
    ) -> Result<Value, OAuthFailure> {
        let remote = self
            .remote()
            .ok_or_else(|| OAuthFailure::new(400, "invalid_request", "remote access is off"))?;
        let client = self.authenticate_client(form, basic)?;
        let invalid_grant = |text: &str| OAuthFailure::new(400, "invalid_grant", text);
        match form.get("grant_type").map(String::as_str) {
            Some("authorization_code") => {
                let code = form
                    .get("code")
                    .ok_or_else(|| OAuthFailure::new(400, "invalid_request", "code is missing"))?;
                let issued = {
                    let mut volatile = self.volatile();
                    let Some(issued) = volatile.codes.get_mut(&sha256_hex(code)) else {
                        return Err(invalid_grant("the code is unknown or expired"));
                    };
                    if let Some(grant_id) = &issued.grant_id {
                        let grant_id = grant_id.clone();
                        drop(volatile);
                        self.revoke_grant(&grant_id)?;
                        return Err(invalid_grant(
                            "the code was used already: the tokens issued for it are revoked",
                        ));
                    }
                    if issued.created.elapsed() > CODE_TTL {
                        return Err(invalid_grant("the code expired (codes live 60 s)"));
                    }
                    if issued.client_id != client.client_id {
                        return Err(invalid_grant("the code was issued to another client"));
                    }
                    let grant_id = random_token(16).map_err(OAuthFailure::internal)?;
                    issued.grant_id = Some(grant_id.clone());
                    (
                        grant_id,
                        issued.redirect_uri.clone(),
                        issued.code_challenge.clone(),
                        issued.resource.clone(),
                        issued.workspace.clone(),
                        issued.scope.clone(),
                    )
                };
                let (grant_id, redirect_uri, challenge, resource, workspace, scope) = issued;
                if form.get("redirect_uri") != Some(&redirect_uri) {
                    return Err(invalid_grant(
                        "redirect_uri differs from the authorization request",
                    ));
                }
                let verifier = form.get("code_verifier").map(String::as_str).unwrap_or("");
                if !(43..=128).contains(&verifier.len())
                    || URL_SAFE_NO_PAD.encode(ring::digest::digest(
                        &ring::digest::SHA256,
                        verifier.as_bytes(),
                    )) != challenge
                {
                    return Err(invalid_grant("the PKCE code_verifier does not match"));
                }
                if let Some(asked) = form.get("resource")
                    && asked.trim_end_matches('/') != resource
                {
                    return Err(OAuthFailure::new(
                        400,
                        "invalid_target",
                        "resource differs from the authorization request",
                    ));
                }
                let now = now_ms();
                let redirect_host = Url::parse(&redirect_uri)
                    .map(|u| u.host)
                    .unwrap_or_default();
                {
                    let connection = self.pool.get().map_err(OAuthFailure::internal)?;
                    connection
                        .execute(
                            "INSERT INTO oauth_grants (id, client_id, resource, workspace, scope, redirect_host, created_at, last_used_at)
                             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7)",
                            params![grant_id, client.client_id, resource, workspace, scope, redirect_host, now],
                        )
                        .map_err(OAuthFailure::internal)?;
                    connection
                        .execute(
                            "UPDATE oauth_clients SET last_used_at = ?2 WHERE client_id = ?1",
                            params![client.client_id, now],
                        )
                        .map_err(OAuthFailure::internal)?;
                }
                self.issue(
                    auth,
                    &remote,
                    &client.client_id,
                    &grant_id,
                    &resource,
                    &scope,
                )
            }
            Some("refresh_token") => {
                let presented = form.get("refresh_token").ok_or_else(|| {
                    OAuthFailure::new(400, "invalid_request", "refresh_token is missing")
                })?;
                let hash = sha256_hex(presented);
                let connection = self.pool.get().map_err(OAuthFailure::internal)?;
                let row: Option<(String, i64, Option<i64>)> = connection
                    .query_row(
                        "SELECT grant_id, created_at, used_at FROM oauth_refresh_tokens WHERE token_hash = ?1",
                        [&hash],
                        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                    )
                    .optional()
                    .map_err(OAuthFailure::internal)?;
                let Some((grant_id, created_at, used_at)) = row else {
                    return Err(invalid_grant("unknown refresh token"));
                };
                let grant: Option<(String, String, String, Option<i64>)> = connection
                    .query_row(
                        "SELECT client_id, resource, scope, revoked_at FROM oauth_grants WHERE id = ?1",
                        [&grant_id],
                        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
                    )
                    .optional()
                    .map_err(OAuthFailure::internal)?;
                let Some((grant_client, resource, scope, revoked_at)) = grant else {
                    return Err(invalid_grant("the grant is gone"));
                };
                if revoked_at.is_some() {
                    return Err(invalid_grant("the grant was revoked: authorize again"));
                }
                if grant_client != client.client_id {
                    return Err(invalid_grant("the refresh token belongs to another client"));
                }
                if used_at.is_some() {
                    drop(connection);
                    self.revoke_grant(&grant_id)?;
                    tracing::warn!(client_id = %client.client_id, "oauth: a rotated refresh token was reused; the grant is revoked");
                    return Err(invalid_grant(
                        "this refresh token was already used: the grant is revoked, authorize again",
                    ));
                }
                let now = now_ms();
                if now - created_at > REFRESH_IDLE_MS {
                    return Err(invalid_grant("the refresh token expired: authorize again"));
                }
                if let Some(asked) = form.get("resource")
                    && asked.trim_end_matches('/') != resource
                {
                    return Err(invalid_grant("resource differs from the grant's"));
                }
                let scope = match form.get("scope") {
                    Some(asked) => {
                        let narrowed: Vec<&str> = asked
                            .split_whitespace()
                            .filter(|s| *s != "offline_access")
                            .collect();
                        if narrowed
                            .iter()
                            .any(|s| !scope.split_whitespace().any(|g| g == *s))
                        {
                            return Err(OAuthFailure::new(
                                400,
                                "invalid_scope",
                                "more scope than granted",
                            ));
                        }
                        if narrowed.is_empty() {
                            scope
                        } else {
                            narrowed.join(" ")
                        }
                    }
                    None => scope,
                };
                let updated = connection
                    .execute(
                        "UPDATE oauth_refresh_tokens SET used_at = ?2 WHERE token_hash = ?1 AND used_at IS NULL",
                        params![hash, now],
                    )
                    .map_err(OAuthFailure::internal)?;
                if updated != 1 {
                    return Err(invalid_grant("this refresh token was already used"));
                }
                connection
                    .execute(
                        "UPDATE oauth_grants SET last_used_at = ?2 WHERE id = ?1",
                        params![grant_id, now],
                    )
                    .map_err(OAuthFailure::internal)?;
                connection
                    .execute(
                        "UPDATE oauth_clients SET last_used_at = ?2 WHERE client_id = ?1",
                        params![client.client_id, now],
                    )
                    .map_err(OAuthFailure::internal)?;
                drop(connection);
                self.issue(
                    auth,
                    &remote,
                    &client.client_id,
                    &grant_id,
                    &resource,
                    &scope,
                )
            }
            Some(other) => Err(OAuthFailure::new(
                400,
                "unsupported_grant_type",
                format!("grant_type {other:?} is not supported"),
            )),
            None => Err(OAuthFailure::new(
                400,
                "invalid_request",
                "grant_type is missing",
            )),
        }
    }

    fn issue(
        &self,
        auth: &Auth,
        remote: &Remote,
        client_id: &str,
        grant_id: &str,
        resource: &str,
        scope: &str,
    ) -> Result<Value, OAuthFailure> {
        let access = auth
            .mint_access(
                &OAuthClaims {
                    iss: remote.issuer().to_string(),
                    aud: resource.to_string(),
                    client_id: client_id.to_string(),
                    scope: scope.to_string(),
                    grant_id: grant_id.to_string(),
                },
                ACCESS_TTL_SECS,
            )
            .map_err(OAuthFailure::internal)?;
        let refresh = format!("alxr_{}", random_token(32).map_err(OAuthFailure::internal)?);
        let connection = self.pool.get().map_err(OAuthFailure::internal)?;
        connection
            .execute(
                "INSERT INTO oauth_refresh_tokens (token_hash, grant_id, created_at) VALUES (?1, ?2, ?3)",
                params![sha256_hex(&refresh), grant_id, now_ms()],
            )
            .map_err(OAuthFailure::internal)?;
        Ok(json!({
            "access_token": access,
            "token_type": "Bearer",
            "expires_in": ACCESS_TTL_SECS,
            "refresh_token": refresh,
            "scope": scope,
        }))
    }

    /// RFC 7009: revoke the grant behind a refresh or access token. Unknown tokens
    /// are not an error.
    pub fn revoke_token(
        &self,
        auth: &Auth,
        form: &HashMap<String, String>,
        basic: Option<(String, String)>,
    ) -> Result<(), OAuthFailure> {
        let client = self.authenticate_client(form, basic)?;
        let Some(token) = form.get("token") else {
            return Err(OAuthFailure::new(
                400,
                "invalid_request",
                "token is missing",
            ));
        };
        let grant_id = if let Ok(grant) = auth.verify(token)
            && let Some(claims) = grant.oauth
        {
            (claims.client_id == client.client_id).then_some(claims.grant_id)
        } else {
            let connection = self.pool.get().map_err(OAuthFailure::internal)?;
            connection
                .query_row(
                    "SELECT g.id FROM oauth_refresh_tokens r JOIN oauth_grants g ON g.id = r.grant_id
                     WHERE r.token_hash = ?1 AND g.client_id = ?2",
                    params![sha256_hex(token), client.client_id],
                    |r| r.get::<_, String>(0),
                )
                .optional()
                .map_err(OAuthFailure::internal)?
        };
        if let Some(grant_id) = grant_id {
            self.revoke_grant(&grant_id)?;
        }
        Ok(())
    }

    fn revoke_grant(&self, grant_id: &str) -> Result<(), OAuthFailure> {
        self.revoked
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(grant_id.to_string());
        let connection = self.pool.get().map_err(OAuthFailure::internal)?;
        connection
            .execute(
                "UPDATE oauth_grants SET revoked_at = ?2 WHERE id = ?1 AND revoked_at IS NULL",
                params![grant_id, now_ms()],
            )
            .map_err(OAuthFailure::internal)?;
        connection
            .execute(
                "DELETE FROM oauth_refresh_tokens WHERE grant_id = ?1",
                [grant_id],
            )
            .map_err(OAuthFailure::internal)?;
        tracing::info!(grant_id, "oauth: grant revoked");
        Ok(())
    }

    /// Registered clients with their live grants.
    pub fn clients(&self) -> Result<Vec<Value>, RemoteError> {
        let connection = self.pool.get()?;
        let mut statement = connection.prepare(
            "SELECT client_id, name, redirect_uris, auth_method, created_at, last_used_at FROM oauth_clients ORDER BY created_at",
        )?;
        let mut grants = connection.prepare(
            "SELECT id, resource, workspace, scope, redirect_host, created_at, last_used_at FROM oauth_grants
             WHERE client_id = ?1 AND revoked_at IS NULL ORDER BY created_at",
        )?;
        let rows = statement
            .query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, Option<String>>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, i64>(4)?,
                    r.get::<_, Option<i64>>(5)?,
                ))
            })?
            .collect::<Result<Vec<_>, _>>()?;
        let mut out = Vec::new();
        for (client_id, name, uris, method, created, last_used) in rows {
            let live = grants
                .query_map([&client_id], |r| {
                    Ok(json!({
                        "grant_id": r.get::<_, String>(0)?,
                        "resource": r.get::<_, String>(1)?,
                        "workspace": r.get::<_, Option<String>>(2)?,
                        "scope": r.get::<_, String>(3)?,
                        "redirect_host": r.get::<_, Option<String>>(4)?,
                        "created_at": r.get::<_, i64>(5)?,
                        "last_used_at": r.get::<_, Option<i64>>(6)?,
                    }))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            let redirect_uris: Vec<String> = serde_json::from_str(&uris).unwrap_or_default();
            let redirect_hosts: Vec<String> = redirect_uris
                .iter()
                .filter_map(|u| Url::parse(u).map(|u| u.host))
                .collect();
            out.push(json!({
                "client_id": client_id,
                "name": name,
                "redirect_hosts": redirect_hosts,
                "auth_method": method,
                "created_at": created,
                "last_used_at": last_used,
                "grants": live,
            }));
        }
        Ok(out)
    }

    /// Revoke every grant of `client_id` and forget the client. False if unknown.
    pub fn revoke_client(&self, client_id: &str) -> Result<bool, RemoteError> {
        cimd::forget(client_id);
        let grant_ids: Vec<String> = {
            let connection = self.pool.get()?;
            let mut statement = connection.prepare(
                "SELECT id FROM oauth_grants WHERE client_id = ?1 AND revoked_at IS NULL",
            )?;
            statement
                .query_map([client_id], |r| r.get(0))?
                .collect::<Result<_, _>>()?
        };
        for grant_id in &grant_ids {
            self.revoke_grant(grant_id)
                .map_err(|e| RemoteError::BadUrl(e.description))?;
        }
        let connection = self.pool.get()?;
        let removed = connection.execute(
            "DELETE FROM oauth_clients WHERE client_id = ?1",
            [client_id],
        )?;
        Ok(removed > 0 || !grant_ids.is_empty())
    }

    /// Revoke every grant and forget every client. Returns how many clients.
    pub fn revoke_all(&self) -> Result<usize, RemoteError> {
        let ids: Vec<String> = {
            let connection = self.pool.get()?;
            let mut statement = connection.prepare("SELECT client_id FROM oauth_clients")?;
            statement
                .query_map([], |r| r.get(0))?
                .collect::<Result<_, _>>()?
        };
        for id in &ids {
            self.revoke_client(id)?;
        }
        Ok(ids.len())
    }
}

/// The scopes granted for a requested `scope`: known scopes kept, `offline_access`
/// accepted (refresh tokens are always issued); none asked means read and write.
/// `Err(unknown)` for a scope we do not know.
fn granted_scope(requested: Option<&str>) -> Result<String, String> {
    let mut granted = Vec::new();
    for scope in requested.unwrap_or("").split_whitespace() {
        match scope {
            SCOPE_READ | SCOPE_WRITE => {
                if !granted.contains(&scope) {
                    granted.push(scope);
                }
            }
            "offline_access" => {}
            other => return Err(other.to_string()),
        }
    }
    if granted.is_empty() {
        granted = SCOPES.to_vec();
    }
    // Writing implies reading.
    if granted.contains(&SCOPE_WRITE) && !granted.contains(&SCOPE_READ) {
        granted.insert(0, SCOPE_READ);
    }
    Ok(granted.join(" "))
}

fn normalize_code(code: &str) -> String {
    code.chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .map(|c| c.to_ascii_uppercase())
        .collect()
}

fn random_token(bytes: usize) -> Result<String, RemoteError> {
    let mut buffer = vec![0u8; bytes];
    SystemRandom::new()
        .fill(&mut buffer)
        .map_err(|_| RemoteError::Random)?;
    Ok(URL_SAFE_NO_PAD.encode(buffer))
}

pub fn sha256_hex(text: &str) -> String {
    ring::digest::digest(&ring::digest::SHA256, text.as_bytes())
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_urls() {
        let remote = Remote::new("https://Wiki.Example.org/", vec![]).expect("valid");
        assert_eq!(remote.origin, "https://wiki.example.org");
        assert_eq!(
            remote.resource(Some("acme")),
            "https://wiki.example.org/mcp/acme"
        );
        assert_eq!(
            remote.metadata_url(Some("acme")),
            "https://wiki.example.org/.well-known/oauth-protected-resource/mcp/acme"
        );
        assert_eq!(
            remote.endpoint_of("https://wiki.example.org/mcp/acme/"),
            Some(Some("acme".into()))
        );
        assert_eq!(
            remote.endpoint_of("https://wiki.example.org/mcp"),
            Some(None)
        );
        assert_eq!(remote.endpoint_of("https://other.example/mcp"), None);
        assert_eq!(remote.endpoint_of("https://wiki.example.org/mcp/a/b"), None);
        assert!(Remote::new("http://127.0.0.1:4747", vec![]).is_ok());
        for bad in [
            "http://wiki.example.org",
            "https://wiki.example.org/prefix",
            "ftp://x",
            "wiki.example.org",
        ] {
            assert!(Remote::new(bad, vec![]).is_err(), "{bad}");
        }
        let some = Remote::new("https://w.example", vec!["acme".into()]).expect("valid");
        assert!(some.serves(Some("acme")));
        assert!(!some.serves(Some("other")));
        assert!(!some.serves(None));
    }

    #[test]
    fn scopes() {
        assert_eq!(granted_scope(None).as_deref(), Ok("wiki:read wiki:write"));
        assert_eq!(
            granted_scope(Some("offline_access")).as_deref(),
            Ok("wiki:read wiki:write")
        );
        assert_eq!(granted_scope(Some("wiki:read")).as_deref(), Ok("wiki:read"));
        assert_eq!(
            granted_scope(Some("wiki:write")).as_deref(),
            Ok("wiki:read wiki:write")
        );
        assert!(granted_scope(Some("admin")).is_err());
    }

    #[test]
    fn pairing_codes_normalize() {
        assert_eq!(normalize_code(" abcd-efgh "), "ABCDEFGH");
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}
