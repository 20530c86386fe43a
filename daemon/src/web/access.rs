//! `/access`: who can reach this daemon besides local MCP clients. Local bearer
//! tokens (required or not, "Revoke every token") and remote access over OAuth (the
//! public URL, each registered client with its live grants and a Revoke button,
//! "Revoke every client"). The same functions as `alexandria daemon auth revoke` and
//! `alexandria remote revoke`.
//!
//! Reading it needs access to every workspace (a pinned token gets 403); revoking
//! needs a browser session signed in with `alexandria web` plus the CSRF token, so a
//! bearer token can never revoke others' access. POST form: `csrf`, `action` =
//! revoke_client (`client` = id) | revoke_clients | revoke_tokens, and for the two
//! "every" actions `confirm=yes` (a required checkbox; the server checks it too).

use alexandria_proto::{Binding, ErrorCode};
use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::Response;
use maud::html;

use super::error_page;
use super::pages::{PageError, PageResult, ok, query_param};
use super::subscriptions::form_fields;
use crate::context::DaemonContext;
use crate::db::iso_time;
use crate::error::ToolError;

fn require_open(binding: &Binding) -> Result<(), PageError> {
    if let Binding::Pinned { .. } = binding {
        return Err(PageError::Tool(ToolError::new(
            ErrorCode::WorkspaceNotAccessible,
            "a token limited to one workspace cannot see who else has access",
            "sign in with `alexandria web`",
        )));
    }
    Ok(())
}

/// `GET /access`.
pub(super) fn page(
    context: &DaemonContext,
    binding: &Binding,
    query: &str,
    csrf: Option<&str>,
) -> PageResult {
    require_open(binding)?;
    let tokens_on = context.auth.tokens_enabled();
    let remote = context.oauth.remote();
    let clients = context
        .oauth
        .clients()
        .map_err(|e| PageError::Tool(ToolError::internal("listing OAuth clients", e)))?;
    let notice = match query_param(query, "done").as_deref() {
        Some("client") => Some("Revoked the client: its tokens stop working now."),
        Some("clients") => Some("Revoked every remote client and all their grants."),
        Some("tokens") => Some(
            "Revoked every local token: clients installed with a token need a new one (`alexandria daemon auth token`).",
        ),
        _ => None,
    };
    let when = |value: &serde_json::Value| value.as_i64().map_or("never".to_string(), iso_time);
    ok(
        "Access",
        csrf,
        html! {
            h1 { "Access" }
            @if let Some(notice) = notice { p.notice role="status" { (notice) } }
            h2 { "Local tokens" }
            @if tokens_on {
                p { "HTTP clients need a bearer token (" code { "alexandria daemon auth token" } ")." }
                @if let Some(csrf) = csrf {
                    form method="post" action="/access" {
                        input type="hidden" name="csrf" value=(csrf);
                        label { input type="checkbox" name="confirm" value="yes" required; " every client using a token will need a new one" }
                        " "
                        button type="submit" name="action" value="revoke_tokens" { "Revoke every token" }
                    }
                }
            } @else {
                p { "Tokens are off: only local processes reach the loopback listener. Turn them on with " code { "alexandria daemon auth token" } "." }
            }
            h2 { "Remote access" }
            @match &remote {
                Some(remote) => {
                    p { "On at " code { (remote.issuer()) } @if !remote.workspaces.is_empty() { " for " (remote.workspaces.join(", ")) } "." }
                }
                None => {
                    p { "Off. Turn it on with " code { "alexandria remote enable <public-url>" } " (docs/remote.md)." }
                }
            }
            @if clients.is_empty() {
                p.muted { "No registered remote clients." }
            } @else {
                table.clients {
                    thead { tr { th { "client" } th { "redirects to" } th { "grants" } th { "last used" } th {} } }
                    tbody {
                        @for client in &clients {
                            @let id = client["client_id"].as_str().unwrap_or("");
                            tr id={ "client-" (id) } {
                                td { (client["name"].as_str().unwrap_or("(unnamed)")) br; span.muted { code { (id) } } }
                                td { @for host in client["redirect_hosts"].as_array().into_iter().flatten() { (host.as_str().unwrap_or("")) " " } }
                                td {
                                    @for grant in client["grants"].as_array().into_iter().flatten() {
                                        (grant["workspace"].as_str().unwrap_or("every workspace")) " "
                                        span.muted { "[" (grant["scope"].as_str().unwrap_or("")) "]" } br;
                                    }
                                }
                                td.muted { (when(&client["last_used_at"])) }
                                td {
                                    @if let Some(csrf) = csrf {
                                        form.inline method="post" action="/access" {
                                            input type="hidden" name="csrf" value=(csrf);
                                            input type="hidden" name="client" value=(id);
                                            button type="submit" name="action" value="revoke_client" { "Revoke" }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
                @if let Some(csrf) = csrf {
                    form method="post" action="/access" {
                        input type="hidden" name="csrf" value=(csrf);
                        label { input type="checkbox" name="confirm" value="yes" required; " sign every remote client out" }
                        " "
                        button type="submit" name="action" value="revoke_clients" { "Revoke every client" }
                    }
                }
            }
        },
    )
}

/// `POST /access`: the session and CSRF checks have passed.
pub(super) fn act(context: &DaemonContext, body: &[u8]) -> Response {
    let fields = form_fields(body);
    let field = |name: &str| {
        fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let confirmed = field("confirm") == Some("yes");
    let done = match field("action") {
        Some("revoke_client") => {
            let Some(client) = field("client").filter(|c| !c.is_empty()) else {
                return error_page(StatusCode::BAD_REQUEST, "the form names no client");
            };
            match context.oauth.revoke_client(client) {
                Ok(true) => "client",
                Ok(false) => {
                    return error_page(
                        StatusCode::NOT_FOUND,
                        "no such client (already revoked?); reload the page",
                    );
                }
                Err(error) => return failed(&error.to_string()),
            }
        }
        Some("revoke_clients") if confirmed => match context.oauth.revoke_all() {
            Ok(_) => "clients",
            Err(error) => return failed(&error.to_string()),
        },
        Some("revoke_tokens") if confirmed => match context.auth.revoke() {
            Ok(_) => "tokens",
            Err(error) => return failed(&error.to_string()),
        },
        Some("revoke_clients" | "revoke_tokens") => {
            return error_page(
                StatusCode::BAD_REQUEST,
                "tick the confirmation box to revoke everyone's access",
            );
        }
        _ => {
            return error_page(
                StatusCode::BAD_REQUEST,
                "unknown action; use the page's buttons",
            );
        }
    };
    Response::builder()
        .status(StatusCode::SEE_OTHER)
        .header(header::LOCATION, format!("/access?done={done}"))
        .header(header::CACHE_CONTROL, "no-store")
        .body(Body::empty())
        .expect("static response parts are valid")
}

fn failed(error: &str) -> Response {
    tracing::error!(error, "web: revoking access failed");
    error_page(
        StatusCode::INTERNAL_SERVER_ERROR,
        "revoking failed; reload the page to see what changed; the daemon log has details",
    )
}
