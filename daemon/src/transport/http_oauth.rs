//! The HTTP face of the OAuth server (`auth::oauth`) for remote access: the
//! `/.well-known/*` metadata documents (always public, `Access-Control-Allow-Origin: *`),
//! `/register`, `/authorize` (the consent page), `/token` and `/revoke`.
//!
//! Every URL these documents name comes from `[remote] public_url`, never from the
//! request's `Host` or `X-Forwarded-*` headers. With remote access off, all of this is 404.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::Response;
use base64::Engine;
use serde_json::Value;

use crate::auth::oauth::urls::{html_escape, parse_form};
use crate::auth::oauth::{ApproveFailure, AuthorizeFailure, Consent, OAuthFailure, Remote};
use crate::context::DaemonContext;

/// Largest body of a registration, token or consent request.
const MAX_FORM_BYTES: usize = 64 * 1024;
const CSRF_COOKIE: &str = "alx_csrf";

/// Whether `path` belongs to the OAuth server.
pub fn is_oauth_path(path: &str) -> bool {
    path.starts_with("/.well-known/")
        || matches!(path, "/authorize" | "/token" | "/register" | "/revoke")
}

pub async fn handle(context: &Arc<DaemonContext>, request: Request, source: String) -> Response {
    let Some(remote) = context.oauth.remote() else {
        return text(
            StatusCode::NOT_FOUND,
            "remote access is off: `alexandria remote enable --public-url https://…` turns it on",
        );
    };
    let path = request.uri().path().to_string();
    let method = request.method().clone();
    if let Some(rest) = path.strip_prefix("/.well-known/") {
        if method != Method::GET && method != Method::HEAD {
            return method_not_allowed("GET");
        }
        return well_known(&remote, rest);
    }
    match (path.as_str(), method) {
        ("/register", Method::POST) => register(context, request, source).await,
        ("/authorize", Method::GET) => authorize_page(context, request).await,
        ("/authorize", Method::POST) => authorize_decision(context, &remote, request, source).await,
        ("/token", Method::POST) => token(context, request).await,
        ("/revoke", Method::POST) => revoke(context, request).await,
        ("/authorize", _) => method_not_allowed("GET, POST"),
        _ => method_not_allowed("POST"),
    }
}

fn well_known(remote: &Remote, rest: &str) -> Response {
    let rest = rest.trim_end_matches('/');
    let document = if let Some(resource) = rest.strip_prefix("oauth-protected-resource") {
        match resource {
            "" | "/mcp" => remote.serves(None).then(|| remote.resource_metadata(None)),
            _ => resource
                .strip_prefix("/mcp/")
                .filter(|slug| alexandria_proto::paths::validate_slug(slug).is_ok())
                .filter(|slug| remote.serves(Some(slug)))
                .map(|slug| remote.resource_metadata(Some(slug))),
        }
    } else if rest.starts_with("oauth-authorization-server")
        || rest.starts_with("openid-configuration")
    {
        Some(remote.server_metadata())
    } else {
        None
    };
    match document {
        Some(document) => Response::builder()
            .status(StatusCode::OK)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCESS_CONTROL_ALLOW_ORIGIN, "*")
            .header(header::CACHE_CONTROL, "public, max-age=60")
            .body(Body::from(document.to_string()))
            .expect("static response parts are valid"),
        None => text(StatusCode::NOT_FOUND, "no such metadata document"),
    }
}

async fn read_body(request: Request) -> Result<(HeaderMap, String), Response> {
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, MAX_FORM_BYTES)
        .await
        .map_err(|_| {
            oauth_error(&OAuthFailure {
                status: 413,
                error: "invalid_request",
                description: format!("the body is larger than {MAX_FORM_BYTES} bytes"),
            })
        })?;
    let text = String::from_utf8(bytes.to_vec()).map_err(|_| {
        oauth_error(&OAuthFailure {
            status: 400,
            error: "invalid_request",
            description: "the body is not UTF-8".into(),
        })
    })?;
    Ok((parts.headers, text))
}

fn bad_form() -> Response {
    oauth_error(&OAuthFailure {
        status: 400,
        error: "invalid_request",
        description: "the form is malformed or repeats a parameter".into(),
    })
}

/// `Authorization: Basic` client credentials (RFC 6749 §2.3.1: form-encoded parts).
fn basic_credentials(headers: &HeaderMap) -> Option<(String, String)> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, encoded) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let decoded = String::from_utf8(decoded).ok()?;
    let (id, secret) = decoded.split_once(':')?;
    let form = parse_form(&format!("i={id}&s={secret}"))?;
    Some((form.get("i")?.clone(), form.get("s")?.clone()))
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, OAuthFailure> + Send + 'static,
) -> Result<T, OAuthFailure> {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|error| {
            tracing::error!(%error, "oauth: a request panicked");
            Err(OAuthFailure {
                status: 500,
                error: "server_error",
                description: "internal error".into(),
            })
        })
}

async fn register(context: &Arc<DaemonContext>, request: Request, source: String) -> Response {
    if !context.oauth.allow_registration(&source) {
        return oauth_error(&OAuthFailure {
            status: 429,
            error: "temporarily_unavailable",
            description: "too many registrations from this address; try again later".into(),
        });
    }
    let (_, body) = match read_body(request).await {
        Ok(read) => read,
        Err(response) => return response,
    };
    let Ok(metadata) = serde_json::from_str::<Value>(&body) else {
        return oauth_error(&OAuthFailure {
            status: 400,
            error: "invalid_client_metadata",
            description: "the body must be JSON client metadata (RFC 7591)".into(),
        });
    };
    let oauth = Arc::clone(&context.oauth);
    match blocking(move || oauth.register(&metadata)).await {
        Ok(reply) => json_no_store(StatusCode::CREATED, &reply),
        Err(failure) => oauth_error(&failure),
    }
}

async fn token(context: &Arc<DaemonContext>, request: Request) -> Response {
    let (headers, body) = match read_body(request).await {
        Ok(read) => read,
        Err(response) => return response,
    };
    let Some(form) = parse_form(&body) else {
        return bad_form();
    };
    let basic = basic_credentials(&headers);
    let oauth = Arc::clone(&context.oauth);
    let auth = Arc::clone(&context.auth);
    match blocking(move || oauth.token(&auth, &form, basic)).await {
        Ok(reply) => json_no_store(StatusCode::OK, &reply),
        Err(failure) => oauth_error(&failure),
    }
}

async fn revoke(context: &Arc<DaemonContext>, request: Request) -> Response {
    let (headers, body) = match read_body(request).await {
        Ok(read) => read,
        Err(response) => return response,
    };
    let Some(form) = parse_form(&body) else {
        return bad_form();
    };
    let basic = basic_credentials(&headers);
    let oauth = Arc::clone(&context.oauth);
    let auth = Arc::clone(&context.auth);
    match blocking(move || oauth.revoke_token(&auth, &form, basic)).await {
        Ok(()) => json_no_store(StatusCode::OK, &serde_json::json!({})),
        Err(failure) => oauth_error(&failure),
    }
}

async fn authorize_page(context: &Arc<DaemonContext>, request: Request) -> Response {
    let query = request.uri().query().unwrap_or("");
    let Some(query) = parse_form(query) else {
        return error_page(
            StatusCode::BAD_REQUEST,
            "the authorization request is malformed",
        );
    };
    let oauth = Arc::clone(&context.oauth);
    let result = tokio::task::spawn_blocking(move || oauth.begin_authorization(&query)).await;
    match result {
        Ok(Ok(consent)) => consent_page(StatusCode::OK, &consent, None, true),
        Ok(Err(AuthorizeFailure::Page(message))) => error_page(StatusCode::BAD_REQUEST, &message),
        Ok(Err(AuthorizeFailure::Redirect(location))) => redirect(&location),
        Err(_) => error_page(StatusCode::INTERNAL_SERVER_ERROR, "internal error"),
    }
}

fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v.to_string())
}

async fn authorize_decision(
    context: &Arc<DaemonContext>,
    remote: &Remote,
    request: Request,
    source: String,
) -> Response {
    // A form post from anywhere but our own page is refused.
    if let Some(origin) = request.headers().get(header::ORIGIN)
        && origin.to_str().ok() != Some(remote.origin.as_str())
    {
        return error_page(
            StatusCode::FORBIDDEN,
            "the form was posted from another site",
        );
    }
    let (headers, body) = match read_body(request).await {
        Ok(read) => read,
        Err(response) => return response,
    };
    let Some(form) = parse_form(&body) else {
        return error_page(StatusCode::BAD_REQUEST, "the form is malformed");
    };
    let request_id = form.get("request_id").cloned().unwrap_or_default();
    let csrf = form.get("csrf").cloned().unwrap_or_default();
    if cookie(&headers, CSRF_COOKIE).as_deref() != Some(csrf.as_str()) {
        return error_page(
            StatusCode::BAD_REQUEST,
            "this page expired or cookies are blocked: start again from the client",
        );
    }
    let approve = form.get("decision").map(String::as_str) != Some("deny");
    let code = form.get("pairing_code").cloned().unwrap_or_default();
    let oauth = Arc::clone(&context.oauth);
    let result = tokio::task::spawn_blocking(move || {
        let decided = oauth.decide(&request_id, &csrf, &code, approve, &source);
        let consent = oauth.pending_consent(&request_id);
        (decided, consent)
    })
    .await;
    match result {
        Ok((Ok(location), _)) => redirect(&location),
        Ok((Err(ApproveFailure::WrongCode { remaining }), Some(consent))) if remaining > 0 => {
            consent_page(
                StatusCode::BAD_REQUEST,
                &consent,
                Some(&format!(
                    "That pairing code is wrong or expired ({remaining} tries left). Run `alexandria remote pair` for a fresh one."
                )),
                false,
            )
        }
        Ok((Err(ApproveFailure::WrongCode { .. }), _)) => error_page(
            StatusCode::BAD_REQUEST,
            "too many wrong pairing codes for this request: start again from the client",
        ),
        Ok((Err(ApproveFailure::RateLimited), _)) => error_page(
            StatusCode::TOO_MANY_REQUESTS,
            "too many wrong pairing codes: wait ten minutes and try again",
        ),
        Ok((Err(ApproveFailure::Stale), _)) => error_page(
            StatusCode::BAD_REQUEST,
            "this authorization request expired: start again from the client",
        ),
        Err(_) => error_page(StatusCode::INTERNAL_SERVER_ERROR, "internal error"),
    }
}

const PAGE_STYLE: &str = "body{font:16px/1.5 system-ui,sans-serif;max-width:34rem;margin:3rem auto;padding:0 1rem;color:#222}h1{font-size:1.4rem}dl{display:grid;grid-template-columns:auto 1fr;gap:.3rem 1rem}dt{color:#666}dd{margin:0;word-break:break-all}input[type=text]{font:1.2rem monospace;padding:.4rem;width:12rem;text-transform:uppercase}button{font-size:1rem;padding:.5rem 1.2rem;margin-right:.5rem}.error{color:#a00;font-weight:600}code{background:#eee;padding:0 .2rem}";

fn page_headers(
    builder: axum::http::response::Builder,
    form_action: &str,
) -> axum::http::response::Builder {
    builder
        .header(header::CONTENT_TYPE, "text/html; charset=utf-8")
        .header(header::CACHE_CONTROL, "no-store")
        .header(
            header::CONTENT_SECURITY_POLICY,
            format!(
                "default-src 'none'; style-src 'unsafe-inline'; form-action {form_action}; frame-ancestors 'none'; base-uri 'none'"
            ),
        )
        .header(header::X_FRAME_OPTIONS, "DENY")
        // `same-origin`, not `no-referrer`: under `no-referrer` a browser posts the
        // consent form with `Origin: null`, which the Origin check refuses.
        .header(header::REFERRER_POLICY, "same-origin")
        .header("X-Content-Type-Options", "nosniff")
}

fn consent_page(
    status: StatusCode,
    consent: &Consent,
    error: Option<&str>,
    set_cookie: bool,
) -> Response {
    let workspace = match &consent.workspace {
        Some(slug) => format!("<code>{}</code>", html_escape(slug)),
        None => "every workspace".to_string(),
    };
    let access = if consent.scope.split_whitespace().any(|s| s == "wiki:write") {
        "read, search, write and delete pages"
    } else {
        "read and search (no writing)"
    };
    let error = error.map_or(String::new(), |e| {
        format!("<p class=error>{}</p>", html_escape(e))
    });
    let html = format!(
        "<!doctype html><html lang=en><head><meta charset=utf-8><meta name=viewport content=\"width=device-width\"><title>Allow access to your alexandria wiki?</title><style>{PAGE_STYLE}</style></head><body>\
<h1>Allow <em>{name}</em> to use your alexandria wiki?</h1>\
<dl><dt>Client</dt><dd>{name} <small>({client_id})</small></dd><dt>Sends you back to</dt><dd><code>{host}</code></dd><dt>Workspace</dt><dd>{workspace}</dd><dt>Access</dt><dd>{access} <small>({scope})</small></dd></dl>\
{error}\
<form method=post action=\"/authorize\">\
<input type=hidden name=request_id value=\"{request_id}\"><input type=hidden name=csrf value=\"{csrf}\">\
<p><label for=pairing_code>Pairing code from <code>alexandria remote pair</code>:</label><br>\
<input type=text id=pairing_code name=pairing_code autocomplete=off autocapitalize=characters spellcheck=false maxlength=20 placeholder=XXXX-XXXX autofocus></p>\
<p><button type=submit name=decision value=approve>Approve</button><button type=submit name=decision value=deny>Deny</button></p>\
</form><p><small>Only approve if you started this connection yourself. You can revoke it any time with <code>alexandria remote revoke</code>.</small></p></body></html>",
        name = html_escape(&consent.client_name),
        client_id = html_escape(&consent.client_id),
        host = html_escape(&consent.redirect_host),
        scope = html_escape(&consent.scope),
        request_id = html_escape(&consent.request_id),
        csrf = html_escape(&consent.csrf),
    );
    let mut builder = page_headers(
        Response::builder().status(status),
        &format!("'self' {}", consent.redirect_origin),
    );
    if set_cookie {
        builder = builder.header(
            header::SET_COOKIE,
            format!(
                "{CSRF_COOKIE}={}; Path=/authorize; HttpOnly; SameSite=Strict; Max-Age=600",
                consent.csrf
            ),
        );
    }
    builder
        .body(Body::from(html))
        .expect("page response parts are valid")
}

fn error_page(status: StatusCode, message: &str) -> Response {
    let html = format!(
        "<!doctype html><html lang=en><head><meta charset=utf-8><title>alexandria: authorization failed</title><style>{PAGE_STYLE}</style></head><body><h1>Authorization failed</h1><p class=error>{}</p></body></html>",
        html_escape(message)
    );
    page_headers(Response::builder().status(status), "'none'")
        .body(Body::from(html))
        .expect("page response parts are valid")
}

fn redirect(location: &str) -> Response {
    Response::builder()
        .status(StatusCode::SEE_OTHER)
        .header(header::LOCATION, location)
        .header(header::CACHE_CONTROL, "no-store")
        .body(Body::empty())
        .unwrap_or_else(|_| error_page(StatusCode::BAD_REQUEST, "the redirect URI is not usable"))
}

fn json_no_store(status: StatusCode, value: &Value) -> Response {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CACHE_CONTROL, "no-store")
        .header(header::PRAGMA, "no-cache")
        .body(Body::from(value.to_string()))
        .expect("static response parts are valid")
}

fn oauth_error(failure: &OAuthFailure) -> Response {
    let status = StatusCode::from_u16(failure.status).unwrap_or(StatusCode::BAD_REQUEST);
    let mut response = json_no_store(status, &failure.body());
    if status == StatusCode::UNAUTHORIZED
        && let Ok(value) = "Basic realm=\"alexandria\"".parse()
    {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, value);
    }
    response
}

fn text(status: StatusCode, message: &'static str) -> Response {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Body::from(message))
        .expect("static response parts are valid")
}

fn method_not_allowed(allow: &'static str) -> Response {
    Response::builder()
        .status(StatusCode::METHOD_NOT_ALLOWED)
        .header(header::ALLOW, allow)
        .body(Body::from("method not allowed"))
        .expect("static response parts are valid")
}
