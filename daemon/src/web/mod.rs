//! The local web view (SPEC §6): server-rendered HTML on the loopback HTTP listener.
//! Workspaces, rendered pages with live citations, raw files, search, history with
//! diffs, sessions, subscriptions with Ingest/Dismiss buttons. No JavaScript; a few kilobytes of CSS; a strict CSP on every page.
//!
//! Requests reach it from `transport/http.rs` after the Host/Origin check. A request is
//! let in with a session cookie (from `/login?token=`, a one-time token printed by
//! `alexandria web`) or, for scripts, a valid bearer token when tokens are on. Every
//! read goes through the same MCP-free functions as the tools (`tools::*`, with the
//! caller's binding), so confinement and path rules are the same code.
//!
//! May import: `context`, `auth`, `tools`, `index`, `workspace`, `db`. It is a
//! transport: nothing below imports it.

mod access;
mod pages;
pub mod render;
mod subscriptions;

use std::sync::Arc;

use alexandria_proto::Binding;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use maud::{DOCTYPE, Markup, PreEscaped, html};

use crate::context::DaemonContext;

/// CSP of every HTML page: nothing but our own stylesheet; no scripts at all.
const PAGE_CSP: &str = "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";
/// CSP of raw files (untrusted content, Miniflux's rule): sandboxed, nothing loads.
const RAW_CSP: &str = "default-src 'none'; img-src 'self'; style-src 'unsafe-inline'; form-action 'none'; frame-ancestors 'none'; sandbox";
/// PDFs open in the browser's viewer, which a `sandbox` CSP would block.
const PDF_CSP: &str = "default-src 'none'; object-src 'self'; frame-ancestors 'none'";

const STYLE: &str = include_str!("style.css");

/// Whether a path belongs to the web view.
pub fn is_web_path(path: &str) -> bool {
    matches!(
        path,
        "/" | "/sessions" | "/access" | "/login" | "/logout" | "/static/style.css"
    ) || path.starts_with("/w/")
}

/// How a request proved who it is.
pub enum Access {
    /// A bearer token (tokens on), possibly limited to one workspace.
    Bearer { workspace: Option<String> },
    /// No bearer token: the session cookie decides.
    Cookie,
}

/// Serve one web-view request.
pub async fn handle(
    context: Arc<DaemonContext>,
    request: Request,
    access: Access,
    port: u16,
) -> Response {
    let path = request.uri().path().to_string();
    let query = request.uri().query().unwrap_or("").to_string();
    let method = request.method().clone();
    let headers = request.headers().clone();
    let cookie_name = format!("alexandria_web_{port}");

    if path == "/static/style.css" {
        return Response::builder()
            .header(header::CONTENT_TYPE, "text/css; charset=utf-8")
            .header(header::CACHE_CONTROL, "max-age=3600")
            .header("x-content-type-options", "nosniff")
            .body(Body::from(STYLE))
            .expect("static response parts are valid");
    }
    if path == "/login" {
        return login(&context, &query, &cookie_name);
    }
    let session = cookie(&headers, &cookie_name).filter(|s| context.web.check(s));
    let binding = match (&access, &session) {
        (
            Access::Bearer {
                workspace: Some(slug),
            },
            _,
        ) => Binding::Pinned {
            workspace: slug.clone(),
        },
        (Access::Bearer { workspace: None }, _) | (Access::Cookie, Some(_)) => Binding::Open,
        (Access::Cookie, None) => return login_needed(),
    };
    if path == "/logout" {
        if method != Method::POST {
            return error_page(StatusCode::METHOD_NOT_ALLOWED, "sign out with the button");
        }
        let Some(session) = session else {
            return error_page(StatusCode::FORBIDDEN, "not signed in with a cookie");
        };
        let body = match axum::body::to_bytes(request.into_body(), 16 * 1024).await {
            Ok(body) => body,
            Err(_) => return error_page(StatusCode::PAYLOAD_TOO_LARGE, "the form is too large"),
        };
        if let Err(reason) = check_post(&headers, &body, &session) {
            return error_page(StatusCode::FORBIDDEN, reason);
        }
        context.web.end(&session);
        return Response::builder()
            .status(StatusCode::SEE_OTHER)
            .header(header::LOCATION, "/login")
            .header(
                header::SET_COOKIE,
                format!("{cookie_name}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"),
            )
            .body(Body::empty())
            .expect("static response parts are valid");
    }
    if method == Method::POST {
        // The only state changes: capturing/dismissing items and revoking access are
        // the user's decisions, so a signed-in browser session only, never a bearer
        // token an agent may hold.
        let subscriptions_of = path
            .strip_prefix("/w/")
            .and_then(|rest| rest.strip_suffix("/subscriptions"))
            .filter(|slug| !slug.contains('/'))
            .map(render::percent_decode);
        if subscriptions_of.is_some() || path == "/access" {
            let Some(session) = session else {
                return error_page(
                    StatusCode::FORBIDDEN,
                    "this button needs a browser signed in with `alexandria web`; scripts use the `alexandria` commands",
                );
            };
            let body = match axum::body::to_bytes(request.into_body(), 16 * 1024).await {
                Ok(body) => body,
                Err(_) => {
                    return error_page(StatusCode::PAYLOAD_TOO_LARGE, "the form is too large");
                }
            };
            if let Err(reason) = check_post(&headers, &body, &session) {
                return error_page(StatusCode::FORBIDDEN, reason);
            }
            let acted = tokio::task::spawn_blocking(move || match subscriptions_of {
                Some(slug) => subscriptions::act(&context, &binding, &slug, &body),
                None => match binding {
                    Binding::Open => access::act(&context, &body),
                    Binding::Pinned { .. } => error_page(
                        StatusCode::FORBIDDEN,
                        "a token limited to one workspace cannot change access",
                    ),
                },
            })
            .await;
            return acted.unwrap_or_else(|error| {
                tracing::error!(%error, "a web action panicked");
                error_page(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "this action failed; the daemon log has details",
                )
            });
        }
    }
    if method != Method::GET && method != Method::HEAD {
        return error_page(
            StatusCode::METHOD_NOT_ALLOWED,
            "this page takes GET; only sign-out, the subscription and the access buttons post",
        );
    }
    let csrf = session.as_deref().map(csrf_token);
    let page = tokio::task::spawn_blocking(move || {
        pages::dispatch(&context, &binding, &path, &query, csrf.as_deref())
    })
    .await;
    match page {
        Ok(response) => response,
        Err(error) => {
            tracing::error!(%error, "a web page panicked");
            error_page(
                StatusCode::INTERNAL_SERVER_ERROR,
                "this page failed; the daemon log has details",
            )
        }
    }
}

/// `/login?token=…[&next=/w/…]`: spend a one-time token, set the session cookie, and
/// redirect so the token leaves the address bar.
fn login(context: &DaemonContext, query: &str, cookie_name: &str) -> Response {
    let mut token = None;
    let mut next = "/".to_string();
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some(("token", value)) => token = Some(render::percent_decode(value)),
            Some(("next", value)) => {
                let value = render::percent_decode(value);
                // Only a local path: never `//host` or `/\host`.
                if value.starts_with('/') && !value.starts_with("//") && !value.contains('\\') {
                    next = value;
                }
            }
            _ => {}
        }
    }
    let Some(session) = token.as_deref().and_then(|t| context.web.redeem(t)) else {
        return login_needed();
    };
    Response::builder()
        .status(StatusCode::SEE_OTHER)
        .header(header::LOCATION, next)
        .header(
            header::SET_COOKIE,
            format!("{cookie_name}={session}; Path=/; HttpOnly; SameSite=Strict"),
        )
        .header(header::CACHE_CONTROL, "no-store")
        .header(header::REFERRER_POLICY, "no-referrer")
        .body(Body::empty())
        .expect("static response parts are valid")
}

fn login_needed() -> Response {
    let body = layout(
        "Sign in",
        None,
        html! {
            h1 { "Sign in to alexandria" }
            p { "Run " code { "alexandria web" } " in a terminal and open the URL it prints. Each URL works once, within 10 minutes." }
        },
    );
    html_response(StatusCode::UNAUTHORIZED, body)
}

/// The value of cookie `name`.
fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value.to_string())
}

/// The CSRF token of a session: derived from the session id (which a cross-site page
/// can neither read nor guess), so nothing more is stored.
fn csrf_token(session: &str) -> String {
    let digest = ring::digest::digest(
        &ring::digest::SHA256,
        format!("alexandria-csrf:{session}").as_bytes(),
    );
    digest
        .as_ref()
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A state-changing POST: same-origin by the browser's own word (`Sec-Fetch-Site`, or
/// an `Origin` that the Host check already matched), and the form's CSRF token.
fn check_post(headers: &HeaderMap, body: &[u8], session: &str) -> Result<(), &'static str> {
    let fetch_site = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok());
    match fetch_site {
        Some("same-origin") | Some("none") => {}
        Some(_) => return Err("cross-site form posts are refused"),
        None if headers.contains_key(header::ORIGIN) => {}
        None => return Err("a form post needs an Origin header"),
    }
    let form = String::from_utf8_lossy(body);
    let sent = form
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(key, _)| *key == "csrf")
        .map(|(_, value)| value);
    let expected = csrf_token(session);
    // Compare digests, so the comparison's timing says nothing about the token.
    let digest = |text: &str| ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    match sent {
        Some(sent) if digest(sent).as_ref() == digest(&expected).as_ref() => Ok(()),
        _ => Err("the form's CSRF token is missing or wrong; reload the page and try again"),
    }
}

/// The page frame: header with navigation, the content, a sign-out button.
pub(crate) fn layout(title: &str, csrf: Option<&str>, content: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · alexandria" }
                link rel="stylesheet" href="/static/style.css";
                // No favicon request (it would be a 404 on every page).
                link rel="icon" href="data:,";
            }
            body {
                header {
                    nav {
                        a.brand href="/" { "alexandria" }
                        a href="/sessions" { "sessions" }
                        a href="/access" { "access" }
                        @if let Some(csrf) = csrf {
                            form.logout method="post" action="/logout" {
                                input type="hidden" name="csrf" value=(csrf);
                                button type="submit" { "sign out" }
                            }
                        }
                    }
                }
                main { (content) }
            }
        }
    }
}

pub(crate) fn html_response(status: StatusCode, markup: Markup) -> Response {
    with_security_headers(
        Response::builder()
            .status(status)
            .header(header::CONTENT_TYPE, "text/html; charset=utf-8"),
        PAGE_CSP,
    )
    .body(Body::from(markup.into_string()))
    .expect("static response parts are valid")
}

pub(crate) fn with_security_headers(
    builder: axum::http::response::Builder,
    csp: &'static str,
) -> axum::http::response::Builder {
    builder
        .header(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(csp),
        )
        .header("x-content-type-options", "nosniff")
        // Not `no-referrer`: under it browsers send `Origin: null` with a form POST,
        // which the Origin check must refuse, so no button would ever work.
        // `same-origin` still sends nothing to other sites.
        .header(header::REFERRER_POLICY, "same-origin")
        .header("x-frame-options", "DENY")
        .header(header::CACHE_CONTROL, "no-store")
}

pub(crate) fn error_page(status: StatusCode, message: &str) -> Response {
    let body = layout(
        status.canonical_reason().unwrap_or("error"),
        None,
        html! {
            h1 { (status.as_u16()) " " (status.canonical_reason().unwrap_or("")) }
            p { (message) }
            p { a href="/" { "all workspaces" } }
        },
    );
    html_response(status, body)
}

/// Highlight `**hit**` markers of an FTS snippet, everything else escaped.
pub(crate) fn snippet(text: &str) -> Markup {
    let mut out = String::new();
    for (i, part) in text.split("**").enumerate() {
        let part_html = html! { (part) }.into_string();
        if i % 2 == 1 {
            out.push_str("<mark>");
            out.push_str(&part_html);
            out.push_str("</mark>");
        } else {
            out.push_str(&part_html);
        }
    }
    PreEscaped(out)
}
