//! The web view's pages. Each is a blocking function that reads through the tools'
//! functions (same binding, confinement and errors as MCP) and returns HTML.
//! URL scheme (a contract; tests address pages directly):
//! `/`, `/sessions`, `/access`, `/w/<slug>/`, `/w/<slug>/wiki/<path>`, `/w/<slug>/raw/<path>`,
//! `/w/<slug>/search?q=`, `/w/<slug>/history`, `/w/<slug>/history/<run_id>`,
//! `/w/<slug>/subscriptions` (GET lists; POST acts, see `subscriptions.rs`),
//! `/w/<slug>/broken/<path>` (where a link to a missing file leads).

use std::fs;

use alexandria_proto::paths::{Layer, validate_workspace_path};
use alexandria_proto::{Binding, ErrorCode};
use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::Response;
use maud::{Markup, PreEscaped, html};
use rusqlite::{OptionalExtension, params};
use serde_json::Value;

use super::render::{self, LinkContext, encode_path, percent_decode};
use super::{PDF_CSP, RAW_CSP, error_page, html_response, layout, snippet, with_security_headers};
use crate::context::DaemonContext;
use crate::error::ToolError;
use crate::tools::{self, GuideParams, HistoryParams, SearchParams, ToolOutput};
use crate::workspace::revision;

/// Largest raw file served (bigger ones are refused rather than read into memory).
const MAX_RAW_BYTES: u64 = 64 * 1024 * 1024;
/// Largest diff shown.
const MAX_DIFF_BYTES: usize = 512 * 1024;

pub fn dispatch(
    context: &DaemonContext,
    binding: &Binding,
    path: &str,
    query: &str,
    csrf: Option<&str>,
) -> Response {
    let result = match path {
        "/" => home(context, binding, csrf),
        "/sessions" => sessions(context, binding, csrf),
        "/access" => super::access::page(context, binding, query, csrf),
        _ => match path
            .strip_prefix("/w/")
            .and_then(|rest| rest.split_once('/'))
        {
            Some((slug, rest)) => workspace_page(context, binding, slug, rest, query, csrf),
            None => Err(PageError::NotFound("no such page".into())),
        },
    };
    match result {
        Ok(response) => response,
        Err(PageError::NotFound(message)) => error_page(StatusCode::NOT_FOUND, &message),
        Err(PageError::Tool(error)) => {
            let status = match error.code {
                ErrorCode::NotFound | ErrorCode::WorkspaceNotFound => StatusCode::NOT_FOUND,
                ErrorCode::WorkspaceNotAccessible => StatusCode::FORBIDDEN,
                ErrorCode::InvalidPath
                | ErrorCode::InvalidArgument
                | ErrorCode::InvalidQuery
                | ErrorCode::WorkspaceRequired => StatusCode::BAD_REQUEST,
                ErrorCode::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            };
            error_page(
                status,
                &format!("{}: {}", error.code.as_str(), error.message),
            )
        }
    }
}

pub(super) enum PageError {
    NotFound(String),
    Tool(ToolError),
}

impl From<ToolError> for PageError {
    fn from(error: ToolError) -> Self {
        PageError::Tool(error)
    }
}

impl From<rusqlite::Error> for PageError {
    fn from(error: rusqlite::Error) -> Self {
        PageError::Tool(ToolError::from(error))
    }
}

impl From<r2d2::Error> for PageError {
    fn from(error: r2d2::Error) -> Self {
        PageError::Tool(ToolError::from(error))
    }
}

pub(super) type PageResult = Result<Response, PageError>;

pub(super) fn ok(title: &str, csrf: Option<&str>, content: Markup) -> PageResult {
    Ok(html_response(StatusCode::OK, layout(title, csrf, content)))
}

pub(super) fn query_param(query: &str, name: &str) -> Option<String> {
    query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| percent_decode(&value.replace('+', " ")))
        .filter(|value| !value.is_empty())
}

fn text(value: &Value) -> &str {
    value.as_str().unwrap_or("")
}

/// `/`: every workspace the binding reaches, with counts and the last write.
fn home(context: &DaemonContext, binding: &Binding, csrf: Option<&str>) -> PageResult {
    let store = &context.store;
    let slugs: Vec<String> = match binding {
        Binding::Open => store.list_workspaces(),
        Binding::Pinned { workspace } => vec![workspace.clone()],
    };
    let mut rows = Vec::new();
    for slug in &slugs {
        let output = tools::guide(
            store,
            binding,
            GuideParams {
                workspace: Some(slug.clone()),
            },
        )?;
        rows.push((slug.clone(), output.structured));
    }
    ok(
        "Workspaces",
        csrf,
        html! {
            h1 { "Workspaces" }
            table {
                thead { tr { th { "workspace" } th { "wiki pages" } th { "raw sources" } th { "pending items" } th { "sync" } th { "last write" } } }
                tbody {
                    @for (slug, data) in &rows {
                        tr {
                            td { a href={ "/w/" (slug) "/" } { (slug) } }
                            td { (data["wiki_pages"]) }
                            td { (data["raw_sources"]) }
                            td { (data["pending_subscription_items"]) }
                            td { (sync_cell(&data["sync"])) }
                            td.muted {
                                @if let Some(last) = data["recent_history"].as_array().and_then(|h| h.first()) {
                                    (text(&last["ts"])) " · " (text(&last["op"])) " " (text(&last["path"]))
                                } @else { "—" }
                            }
                        }
                    }
                }
            }
        },
    )
}

/// A workspace's sync state in one cell: no remote, the last error, open conflicts.
fn sync_cell(sync: &Value) -> Markup {
    let conflicts = sync["conflicts"].as_array().map_or(0, Vec::len);
    html! {
        @match sync["remote"].as_str() {
            None => span.muted { "local only" },
            Some(_) => {
                @if let Some(error) = sync["last_error"].as_str() {
                    span.error title=(error) { "sync failing" }
                } @else {
                    "synced"
                }
                @if conflicts > 0 { " · " span.error { (conflicts) " conflict(s)" } }
            }
        }
    }
}

/// `/sessions`: what `alexandria mcp status` shows.
fn sessions(context: &DaemonContext, binding: &Binding, csrf: Option<&str>) -> PageResult {
    if let Binding::Pinned { .. } = binding {
        return Err(PageError::Tool(ToolError::new(
            ErrorCode::WorkspaceNotAccessible,
            "a token limited to one workspace cannot list every session",
            "use a token for every workspace, or `alexandria mcp status`",
        )));
    }
    let sessions = context.sessions.snapshot();
    ok(
        "Sessions",
        csrf,
        html! {
            h1 { "Live MCP sessions" }
            p.muted { "alexandriad " (alexandria_proto::BUILD) ", pid " (std::process::id()) ", up " (context.started.elapsed().as_secs()) " s" }
            @if sessions.is_empty() { p { "No MCP session is connected." } }
            @else {
                table {
                    thead { tr { th { "client" } th { "transport" } th { "binding" } th { "parent" } th { "started" } th { "last call" } th { "calls" } } }
                    tbody {
                        @for s in &sessions {
                            tr {
                                td { (text(&s["client_name"])) " " span.muted { (text(&s["client_version"])) } }
                                td { (text(&s["transport"])) }
                                td { (text(&s["binding"])) @if let Some(w) = s["workspace"].as_str() { " " a href={ "/w/" (w) "/" } { (w) } } }
                                td { (s["parent_pid"]) " " span.muted { (text(&s["parent_name"])) } }
                                td.muted { (text(&s["started_at"])) }
                                td.muted { (text(&s["last_call_at"])) }
                                td { (s["calls"]) }
                            }
                        }
                    }
                }
            }
        },
    )
}

fn workspace_page(
    context: &DaemonContext,
    binding: &Binding,
    slug: &str,
    rest: &str,
    query: &str,
    csrf: Option<&str>,
) -> PageResult {
    // The binding decides, as for a tool call.
    let slug = tools::resolve_workspace(&context.store, binding, Some(slug))?;
    let rest = percent_decode(rest);
    if rest.is_empty() {
        return overview(context, binding, &slug, csrf);
    }
    if rest == "search" {
        return search(context, binding, &slug, query, csrf);
    }
    if rest == "subscriptions" {
        return super::subscriptions::page(context, &slug, query, csrf);
    }
    if rest == "history" {
        return history(context, binding, &slug, query, csrf);
    }
    if let Some(run_id) = rest.strip_prefix("history/") {
        return diff(context, &slug, run_id, csrf);
    }
    if let Some(missing) = rest.strip_prefix("broken/") {
        return Ok(error_page(
            StatusCode::NOT_FOUND,
            &format!(
                "{missing} does not exist in workspace '{slug}': the page links to or cites a file that is not there"
            ),
        ));
    }
    if rest.starts_with("wiki/") {
        return wiki_page(context, &slug, &rest, csrf);
    }
    if rest.starts_with("raw/") {
        return raw_file(context, &slug, &rest);
    }
    Err(PageError::NotFound(format!(
        "no page {rest} in workspace '{slug}'"
    )))
}

pub(super) fn nav(slug: &str) -> Markup {
    html! {
        p.muted {
            a href={ "/w/" (slug) "/" } { (slug) } " · "
            a href={ "/w/" (slug) "/history" } { "history" } " · "
            a href={ "/w/" (slug) "/search" } { "search" } " · "
            a href={ "/w/" (slug) "/subscriptions" } { "subscriptions" }
        }
        form.search method="get" action={ "/w/" (slug) "/search" } {
            input type="search" name="q" placeholder="Search this workspace" aria-label="search";
            button type="submit" { "Search" }
        }
    }
}

/// `/w/<slug>/`: index page, recent history, uncited sources.
fn overview(
    context: &DaemonContext,
    binding: &Binding,
    slug: &str,
    csrf: Option<&str>,
) -> PageResult {
    let store = &context.store;
    let guide = tools::guide(
        store,
        binding,
        GuideParams {
            workspace: Some(slug.to_string()),
        },
    )?
    .structured;
    let sources_block = super::subscriptions::overview_block(context, slug)?;
    let root = store.workspace_dir(slug);
    let index_html = fs::read(root.join("wiki/index.md")).ok().map(|bytes| {
        render::markdown(
            &String::from_utf8_lossy(&bytes),
            &LinkContext {
                slug,
                page_dir: "wiki",
                root: &root,
            },
        )
    });
    ok(
        slug,
        csrf,
        html! {
            h1 { (slug) }
            (nav(slug))
            p.muted { (guide["wiki_pages"]) " wiki pages · " (guide["raw_sources"]) " raw sources · " (guide["pending_subscription_items"]) " pending items" }
            @if let Some(index_html) = index_html {
                article { (PreEscaped(index_html)) }
            }
            @if let Some(remote) = guide["sync"]["remote"].as_str() {
                h2 { "Sync" }
                p { "With " code { (remote) } @if let Some(error) = guide["sync"]["last_error"].as_str() { " · " span.error { "the last sync failed: " (error) } " (writes go on; it is retried)" } }
                @let conflicts = guide["sync"]["conflicts"].as_array().cloned().unwrap_or_default();
                @if !conflicts.is_empty() {
                    p { "Open conflicts (both machines changed the same lines; the page has the other machine's version, the conflict page this one's):" }
                    ul { @for path in &conflicts { li { (page_link(slug, text(path))) } } }
                }
            }
            (sources_block)
            h2 { "Recent history" }
            ul {
                @for entry in guide["recent_history"].as_array().into_iter().flatten() {
                    li {
                        span.muted { (text(&entry["ts"])) } " " (text(&entry["op"])) " "
                        (page_link(slug, text(&entry["path"])))
                        @if let Some(run) = entry["run_id"].as_str() { " " a.muted href={ "/w/" (slug) "/history/" (run) } { "diff" } }
                    }
                }
            }
            @let uncited = guide["uncited_sources"].as_array().cloned().unwrap_or_default();
            @if !uncited.is_empty() {
                h2 { "Raw sources not cited yet" }
                ul { @for path in &uncited { li { (page_link(slug, text(path))) } } }
            }
        },
    )
}

pub(super) fn page_link(slug: &str, path: &str) -> Markup {
    html! { a href={ "/w/" (slug) "/" (encode_path(path)) } { (path) } }
}

/// One history row of a page: time, op, origin, run id, client.
type Writer = (i64, String, String, Option<String>, Option<String>);

/// `/w/<slug>/wiki/<path>`: a page rendered, with its rev and last writers.
fn wiki_page(context: &DaemonContext, slug: &str, path: &str, csrf: Option<&str>) -> PageResult {
    let store = &context.store;
    let checked =
        validate_workspace_path(path, false).map_err(|e| ToolError::invalid_path(e.to_string()))?;
    if checked.layer != Layer::Wiki {
        return Err(PageError::NotFound(path.to_string()));
    }
    let absolute = store.resolve(slug, &checked)?;
    let bytes = match fs::read(&absolute) {
        Ok(bytes) => bytes,
        Err(_) => return Err(PageError::Tool(ToolError::not_found(&checked.path))),
    };
    let rev = revision(&bytes);
    let source = String::from_utf8_lossy(&bytes);
    let root = store.workspace_dir(slug);
    let page_dir = checked
        .path
        .rsplit_once('/')
        .map_or("wiki", |(dir, _)| dir)
        .to_string();
    let body = if checked.path.ends_with(".md") {
        render::markdown(
            &source,
            &LinkContext {
                slug,
                page_dir: &page_dir,
                root: &root,
            },
        )
    } else {
        html! { pre { (source) } }.into_string()
    };
    let connection = store.pool.get()?;
    let mut statement = connection.prepare_cached(
        "SELECT w.ts, w.op, w.origin, w.run_id, r.client FROM wiki_log_entries w
         LEFT JOIN runs r ON r.run_id = w.run_id
         WHERE w.workspace = ?1 AND w.path = ?2 ORDER BY w.ts DESC, w.id DESC LIMIT 5",
    )?;
    let writers: Vec<Writer> = statement
        .query_map(params![slug, checked.path], |row| {
            Ok((
                row.get(0)?,
                row.get(1)?,
                row.get(2)?,
                row.get(3)?,
                row.get(4)?,
            ))
        })?
        .collect::<Result<_, _>>()?;
    let title = crate::index::markdown::title(&source).unwrap_or_else(|| checked.path.clone());
    ok(
        &title,
        csrf,
        html! {
            (nav(slug))
            article { (PreEscaped(body)) }
            div.page-meta.muted {
                p { (checked.path) " · rev " code { (&rev[..rev.len().min(12)]) } }
                @if !writers.is_empty() {
                    p { "Last writers:" }
                    ul {
                        @for (ts, op, origin, run, client) in &writers {
                            li {
                                (tools::iso_time(*ts)) " · " (op) " by "
                                (client.as_deref().unwrap_or(if origin == "outside" { "an outside edit" } else { "unknown client" }))
                                @if let Some(run) = run { " · " a href={ "/w/" (slug) "/history/" (run) } { "diff" } }
                            }
                        }
                    }
                }
            }
        },
    )
}

/// `/w/<slug>/raw/<path>`: the file itself, under a sandboxing CSP.
fn raw_file(context: &DaemonContext, slug: &str, path: &str) -> PageResult {
    let store = &context.store;
    let checked =
        validate_workspace_path(path, false).map_err(|e| ToolError::invalid_path(e.to_string()))?;
    if checked.layer != Layer::Raw {
        return Err(PageError::NotFound(path.to_string()));
    }
    let absolute = store.resolve(slug, &checked)?;
    let metadata = fs::metadata(&absolute).map_err(|_| ToolError::not_found(&checked.path))?;
    if !metadata.is_file() {
        return Err(PageError::Tool(ToolError::not_found(&checked.path)));
    }
    if metadata.len() > MAX_RAW_BYTES {
        return Err(PageError::Tool(ToolError::new(
            ErrorCode::TooLarge,
            format!(
                "{} is {} bytes; the web view serves at most {MAX_RAW_BYTES}",
                checked.path,
                metadata.len()
            ),
            "open it from the workspace folder",
        )));
    }
    let bytes = fs::read(&absolute).map_err(|e| ToolError::internal("reading a raw file", e))?;
    let extension = checked
        .path
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    let (content_type, csp, inline) = match extension.as_str() {
        "pdf" => ("application/pdf", PDF_CSP, true),
        "png" => ("image/png", RAW_CSP, true),
        "jpg" | "jpeg" => ("image/jpeg", RAW_CSP, true),
        "gif" => ("image/gif", RAW_CSP, true),
        "webp" => ("image/webp", RAW_CSP, true),
        "md" | "markdown" | "txt" | "text" | "csv" | "json" | "yaml" | "yml" | "toml" | "log"
        | "vtt" | "srt" => ("text/plain; charset=utf-8", RAW_CSP, true),
        // HTML, SVG and anything else: downloaded, never rendered by the browser.
        _ => ("application/octet-stream", RAW_CSP, false),
    };
    let file_name = checked.path.rsplit('/').next().unwrap_or("file");
    let disposition = format!(
        "{}; filename*=UTF-8''{}",
        if inline { "inline" } else { "attachment" },
        encode_path(file_name)
    );
    Ok(with_security_headers(Response::builder(), csp)
        .header(header::CONTENT_TYPE, content_type)
        .header(header::CONTENT_DISPOSITION, disposition)
        .body(Body::from(bytes))
        .expect("static response parts are valid"))
}

/// `/w/<slug>/search?q=`: the `search` tool, as a page.
fn search(
    context: &DaemonContext,
    binding: &Binding,
    slug: &str,
    query: &str,
    csrf: Option<&str>,
) -> PageResult {
    let q = query_param(query, "q");
    let cursor = query_param(query, "cursor");
    let output: Option<ToolOutput> = match &q {
        Some(q) => Some(tools::search(
            &context.store,
            binding,
            SearchParams {
                workspace: Some(slug.to_string()),
                mode: None,
                query: Some(q.clone()),
                path: None,
                layer: None,
                limit: Some(20),
                cursor: cursor.clone(),
            },
        )?),
        None => None,
    };
    ok(
        "Search",
        csrf,
        html! {
            (nav(slug))
            @if let Some(output) = &output {
                @let hits = output.structured["hits"].as_array().cloned().unwrap_or_default();
                h1 { (hits.len()) " results for " q { (q.as_deref().unwrap_or("")) } }
                ol.hits {
                    @for hit in &hits {
                        @let path = text(&hit["path"]);
                        li {
                            @if let Some(page) = hit["page"].as_i64() {
                                a href={ "/w/" (slug) "/" (encode_path(path)) "#page=" (page) } { (path) ", p." (page) }
                            } @else {
                                (page_link(slug, path))
                            }
                            @if let Some(heading) = hit["heading"].as_str() { " " span.muted { "› " (heading) } }
                            br;
                            span { (snippet(text(&hit["snippet"]))) }
                        }
                    }
                }
                @if let Some(next) = output.structured["next_cursor"].as_str() {
                    p { a href={ "/w/" (slug) "/search?q=" (encode_path(q.as_deref().unwrap_or(""))) "&cursor=" (next) } { "more results" } }
                }
            } @else {
                h1 { "Search " (slug) }
                p.muted { "All words must match; \"quoted phrases\" and prefix* work." }
            }
        },
    )
}

/// `/w/<slug>/history`: the `history` tool, as a page (filters by query parameters).
fn history(
    context: &DaemonContext,
    binding: &Binding,
    slug: &str,
    query: &str,
    csrf: Option<&str>,
) -> PageResult {
    let output = tools::history(
        &context.store,
        binding,
        HistoryParams {
            workspace: Some(slug.to_string()),
            since: query_param(query, "since"),
            until: query_param(query, "until"),
            op: query_param(query, "op"),
            path: query_param(query, "path"),
            run_id: query_param(query, "run_id"),
            limit: Some(100),
            cursor: query_param(query, "cursor"),
        },
    )?;
    let entries = output.structured["entries"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    ok(
        "History",
        csrf,
        html! {
            (nav(slug))
            h1 { "History of " (slug) }
            table {
                thead { tr { th { "time" } th { "op" } th { "path" } th { "by" } th { "" } } }
                tbody {
                    @for entry in &entries {
                        tr {
                            td.muted { (text(&entry["ts"])) }
                            td { (text(&entry["op"])) }
                            td { (page_link(slug, text(&entry["path"]))) }
                            td.muted { (text(&entry["origin"])) }
                            td { @if let Some(run) = entry["run_id"].as_str() { a href={ "/w/" (slug) "/history/" (run) } { "diff" } } }
                        }
                    }
                }
            }
            @if let Some(next) = output.structured["next_cursor"].as_str() {
                p { a href={ "/w/" (slug) "/history?cursor=" (next) } { "older" } }
            }
        },
    )
}

/// `/w/<slug>/history/<run_id>`: the commit of one run as a diff.
fn diff(context: &DaemonContext, slug: &str, run_id: &str, csrf: Option<&str>) -> PageResult {
    let store = &context.store;
    let commit_id: Option<String> = {
        let connection = store.pool.get()?;
        connection
            .query_row(
                "SELECT commit_id FROM runs WHERE run_id = ?1 AND workspace = ?2",
                params![run_id, slug],
                |row| row.get(0),
            )
            .optional()?
            .flatten()
    };
    let Some(commit_id) = commit_id else {
        return Err(PageError::NotFound(format!(
            "run {run_id} has no commit in workspace '{slug}'"
        )));
    };
    let root = store.workspace_dir(slug);
    let patch = patch_of(&root, &commit_id)
        .map_err(|e| ToolError::internal("reading the commit's diff", e))?;
    ok(
        "Diff",
        csrf,
        html! {
            (nav(slug))
            h1 { "Run " code { (run_id) } }
            p.muted { "commit " code { (commit_id) } }
            pre.diff {
                @for line in patch.lines() {
                    @let class = if line.starts_with("+++") || line.starts_with("---") { "file" }
                        else if line.starts_with('+') { "add" }
                        else if line.starts_with('-') { "del" }
                        else if line.starts_with("@@") { "hunk" } else { "ctx" };
                    span class=(class) { (line) } "\n"
                }
            }
        },
    )
}

fn patch_of(root: &std::path::Path, commit_id: &str) -> Result<String, git2::Error> {
    let repo = git2::Repository::open(root)?;
    let commit = repo.find_commit(git2::Oid::from_str(commit_id)?)?;
    let tree = commit.tree()?;
    let parent = commit.parents().next().map(|p| p.tree()).transpose()?;
    let diff = repo.diff_tree_to_tree(parent.as_ref(), Some(&tree), None)?;
    let mut out = String::new();
    diff.print(git2::DiffFormat::Patch, |_, _, line| {
        if out.len() > MAX_DIFF_BYTES {
            return false;
        }
        let origin = line.origin();
        if matches!(origin, '+' | '-' | ' ') {
            out.push(origin);
        }
        out.push_str(&String::from_utf8_lossy(line.content()));
        true
    })
    .or_else(|e| {
        if out.len() > MAX_DIFF_BYTES {
            Ok(())
        } else {
            Err(e)
        }
    })?;
    if out.len() > MAX_DIFF_BYTES {
        out.push_str("\n… (diff cut at 512 KiB)\n");
    }
    Ok(out)
}
