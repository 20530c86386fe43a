//! `/w/<slug>/subscriptions`: what the workspace's sources found, with Ingest and
//! Dismiss buttons (SPEC §4: capturing is the user's decision, so these act only for a
//! signed-in browser session, never for a bearer token), and the sources with their
//! pending counts, errors and a "Sync now" button.
//!
//! GET lists; POST (form `csrf`, `action` = ingest | dismiss | ingest_all | sync,
//! `item` = id or `source` = name) acts through the same functions as
//! `alexandria subscription ingest|dismiss` and `alexandria source sync`, then
//! redirects back with a fixed notice code (never text taken from the request).
//! Item titles and excerpts are untrusted text: maud escapes them, links to item URLs
//! carry `rel="noopener noreferrer nofollow"`.

use alexandria_proto::{Binding, ErrorCode};
use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::Response;
use maud::{Markup, html};

use super::error_page;
use super::pages::{PageError, PageResult, nav, ok, page_link, query_param};
use super::render::{encode_path, percent_decode};
use crate::context::DaemonContext;
use crate::error::ToolError;
use crate::sources;

/// Items per page.
const PAGE_SIZE: usize = 50;

/// `GET /w/<slug>/subscriptions?state=&source=&cursor=&done=&n=`.
pub(super) fn page(
    context: &DaemonContext,
    slug: &str,
    query: &str,
    csrf: Option<&str>,
) -> PageResult {
    let store = &context.store;
    let state = query_param(query, "state").unwrap_or_else(|| "pending".into());
    let source = query_param(query, "source");
    let offset: usize = query_param(query, "cursor")
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let connection = store.pool.get()?;
    let all_sources = sources::all(&connection, Some(slug))?;
    let mut described = Vec::new();
    for s in &all_sources {
        described.push(sources::describe(&connection, store, s)?);
    }
    let mut items = sources::items(
        &connection,
        slug,
        source.as_deref(),
        Some(&state),
        PAGE_SIZE + 1,
        offset,
    )?;
    drop(connection);
    let more = items.len() > PAGE_SIZE;
    items.truncate(PAGE_SIZE);
    let notice = notice(query);
    let filter = |extra: &str| {
        let mut link = format!("/w/{slug}/subscriptions?state={state}");
        if let Some(source) = &source {
            link.push_str(&format!("&source={}", encode_path(source)));
        }
        link.push_str(extra);
        link
    };
    let actionable = state == "pending" || state == "failed";
    ok(
        &format!("Subscriptions · {slug}"),
        csrf,
        html! {
            h1 { "Subscriptions" }
            (nav(slug))
            @if let Some(notice) = notice { p.notice role="status" { (notice) } }
            h2 { "Sources" }
            @if described.is_empty() {
                p { "No sources yet. Add one with " code { "alexandria source add " (slug) " folder|feed|url|git <target>" } "." }
            } @else {
                table.sources {
                    thead { tr { th { "source" } th { "kind" } th { "pending" } th { "captured" } th { "last check" } th { "error" } th {} } }
                    tbody {
                        @for s in &described {
                            @let name = s["name"].as_str().unwrap_or("");
                            tr {
                                td { a href={ "/w/" (slug) "/subscriptions?state=pending&source=" (encode_path(name)) } { (name) } }
                                td { (s["kind"].as_str().unwrap_or("")) @if s["auto"] == true { span.muted { " auto" } } }
                                td { (s["pending"]) }
                                td { (s["captured"]) }
                                td.muted { (s["last_check"].as_str().unwrap_or("never")) }
                                td.error { (s["last_error"].as_str().unwrap_or("")) }
                                td {
                                    @if let Some(csrf) = csrf {
                                        form.inline method="post" action={ "/w/" (slug) "/subscriptions" } {
                                            input type="hidden" name="csrf" value=(csrf);
                                            input type="hidden" name="source" value=(name);
                                            button type="submit" name="action" value="sync" { "Sync now" }
                                            @if s["pending"].as_i64().unwrap_or(0) > 0 {
                                                " "
                                                button type="submit" name="action" value="ingest_all" { "Ingest all pending" }
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            h2 { "Items" }
            p.muted {
                @for (i, s) in sources::STATES.iter().enumerate() {
                    @if i > 0 { " · " }
                    @if *s == state.as_str() { strong { (s) } }
                    @else {
                        a href={ "/w/" (slug) "/subscriptions?state=" (s) (source.as_deref().map(|n| format!("&source={}", encode_path(n))).unwrap_or_default()) } { (s) }
                    }
                }
                @if let Some(source) = &source { " · source " strong { (source) } " (" a href={ "/w/" (slug) "/subscriptions?state=" (state) } { "all sources" } ")" }
            }
            p.muted { "Titles and excerpts come from outside sources: treat them as untrusted." }
            @if items.is_empty() {
                p { "No " (state) " items." }
            } @else {
                ul.items {
                    @for item in &items {
                        li.item id={ "item-" (item.id) } {
                            strong.title { (item.title) }
                            " " span.muted { "#" (item.id) " · " (item.source) }
                            @if let Some(published) = item.published { " " span.muted { (sources::time_text(published)) } }
                            @if let Some(url) = &item.url {
                                @let shown = sources::redact_url(url);
                                @if shown.starts_with("https://") || shown.starts_with("http://") {
                                    " " a.muted href=(shown) rel="noopener noreferrer nofollow" { "source link" }
                                }
                            }
                            @if !item.excerpt.is_empty() { p.excerpt { (item.excerpt) } }
                            @if let Some(path) = &item.raw_path { p.muted { "captured as " (page_link(slug, path)) } }
                            @if let Some(error) = &item.error { p.error { "error: " (error) } }
                            @if actionable {
                                @if let Some(csrf) = csrf {
                                    form.inline method="post" action={ "/w/" (slug) "/subscriptions" } {
                                        input type="hidden" name="csrf" value=(csrf);
                                        input type="hidden" name="item" value=(item.id);
                                        button type="submit" name="action" value="ingest" { "Ingest" }
                                        " "
                                        button type="submit" name="action" value="dismiss" { "Dismiss" }
                                    }
                                } @else {
                                    @let (ingest, dismiss) = sources::item_commands(slug, item.id);
                                    p.muted { code { (ingest) } " · " code { (dismiss) } }
                                }
                            }
                        }
                    }
                }
                @if offset > 0 || more {
                    p {
                        @if offset > 0 { a href=(filter(&format!("&cursor={}", offset.saturating_sub(PAGE_SIZE)))) { "← newer" } " " }
                        @if more { a href=(filter(&format!("&cursor={}", offset + PAGE_SIZE))) { "older →" } }
                    }
                }
            }
        },
    )
}

/// The notice shown after an action: from fixed codes only.
fn notice(query: &str) -> Option<String> {
    let n: usize = query_param(query, "n")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let text = match query_param(query, "done")?.as_str() {
        "captured" => format!("Captured {n} item(s) into raw/."),
        "dismissed" => format!("Dismissed {n} item(s); they will not come back."),
        "synced" => format!("Synced: {n} new item(s)."),
        "sync_failed" => "The sync failed; the source's error is shown below.".to_string(),
        "none" => "Nothing to do: the item was already handled.".to_string(),
        _ => return None,
    };
    Some(text)
}

/// The fields of a url-encoded form.
pub(super) fn form_fields(body: &[u8]) -> Vec<(String, String)> {
    String::from_utf8_lossy(body)
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| {
            (
                percent_decode(&k.replace('+', " ")),
                percent_decode(&v.replace('+', " ")),
            )
        })
        .collect()
}

/// `POST /w/<slug>/subscriptions`: the CSRF check has passed; act and redirect.
pub(super) fn act(context: &DaemonContext, binding: &Binding, slug: &str, body: &[u8]) -> Response {
    match act_inner(context, binding, slug, body) {
        Ok(location) => Response::builder()
            .status(StatusCode::SEE_OTHER)
            .header(header::LOCATION, location)
            .header(header::CACHE_CONTROL, "no-store")
            .body(Body::empty())
            .expect("static response parts are valid"),
        Err(PageError::NotFound(message)) => error_page(StatusCode::NOT_FOUND, &message),
        Err(PageError::Tool(error)) => {
            let status = match error.code {
                ErrorCode::NotFound | ErrorCode::WorkspaceNotFound => StatusCode::NOT_FOUND,
                ErrorCode::WorkspaceNotAccessible => StatusCode::FORBIDDEN,
                ErrorCode::InvalidArgument | ErrorCode::InvalidPath => StatusCode::BAD_REQUEST,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            };
            error_page(
                status,
                &format!(
                    "{}: {} ({})",
                    error.code.as_str(),
                    error.message,
                    error.hint
                ),
            )
        }
    }
}

fn act_inner(
    context: &DaemonContext,
    binding: &Binding,
    slug: &str,
    body: &[u8],
) -> Result<String, PageError> {
    let store = &context.store;
    let slug = crate::tools::resolve_workspace(store, binding, Some(slug))?;
    let fields = form_fields(body);
    let field = |name: &str| {
        fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let back = |done: &str, n: usize, source: Option<&str>| {
        let mut location = format!("/w/{slug}/subscriptions?done={done}&n={n}");
        if let Some(source) = source {
            location.push_str(&format!("&source={}", encode_path(source)));
        }
        location
    };
    let item_ids = || -> Result<Vec<i64>, PageError> {
        let ids: Vec<i64> = fields
            .iter()
            .filter(|(k, _)| k == "item")
            .map(|(_, v)| v.trim().parse::<i64>())
            .collect::<Result<_, _>>()
            .map_err(|_| bad("an item id is not a number"))?;
        if ids.is_empty() {
            return Err(bad("the form names no item"));
        }
        Ok(ids)
    };
    match field("action") {
        Some("ingest") => {
            let ids = item_ids()?;
            let outcome = sources::capture_items(store, &slug, None, &ids, true)?;
            if let Some((id, error)) = outcome.failed.first()
                && outcome.captured.is_empty()
            {
                return Err(PageError::Tool(ToolError::new(
                    ErrorCode::Internal,
                    format!("item {id} could not be captured: {error}"),
                    "it stays failed with its error; try again later",
                )));
            }
            let n = outcome.captured.len();
            Ok(back(if n == 0 { "none" } else { "captured" }, n, None))
        }
        Some("dismiss") => {
            let ids = item_ids()?;
            let dismissed = sources::dismiss(store, &slug, &ids)?;
            let n = dismissed.len();
            Ok(back(if n == 0 { "none" } else { "dismissed" }, n, None))
        }
        Some("ingest_all") => {
            let name = field("source").ok_or_else(|| bad("the form names no source"))?;
            let source = {
                let connection = store.pool.get()?;
                sources::find(&connection, &slug, name)?
            };
            let outcome = sources::capture_items(store, &slug, Some(source.id), &[], true)?;
            let n = outcome.captured.len();
            Ok(back(
                if n == 0 { "none" } else { "captured" },
                n,
                Some(name),
            ))
        }
        Some("sync") => {
            let name = field("source").ok_or_else(|| bad("the form names no source"))?;
            let report = sources::sync_now(store, &slug, name)?;
            if report.error.is_some() {
                return Ok(back("sync_failed", 0, Some(name)));
            }
            Ok(back("synced", report.new, Some(name)))
        }
        _ => Err(bad("unknown action; use the page's buttons")),
    }
}

fn bad(message: &str) -> PageError {
    PageError::Tool(ToolError::invalid_argument(
        message,
        "reload the subscriptions page and use its buttons",
    ))
}

/// The sources block of a workspace overview: name, pending, error.
pub(super) fn overview_block(context: &DaemonContext, slug: &str) -> Result<Markup, PageError> {
    let store = &context.store;
    let connection = store.pool.get()?;
    let all = sources::all(&connection, Some(slug))?;
    if all.is_empty() {
        return Ok(html! {});
    }
    let mut rows = Vec::new();
    for s in &all {
        rows.push(sources::describe(&connection, store, s)?);
    }
    Ok(html! {
        h2 { "Sources" }
        ul {
            @for s in &rows {
                @let name = s["name"].as_str().unwrap_or("");
                li {
                    a href={ "/w/" (slug) "/subscriptions?state=pending&source=" (encode_path(name)) } { (name) }
                    " " span.muted { (s["kind"].as_str().unwrap_or("")) " · " (s["pending"]) " pending · last check " (s["last_check"].as_str().unwrap_or("never")) }
                    @if let Some(error) = s["last_error"].as_str() { " " span.error { "error: " (error) } }
                }
            }
        }
        p { a href={ "/w/" (slug) "/subscriptions" } { "All subscription items →" } }
    })
}
