//! The tools' logic, independent of MCP: parameters, workspace binding, and the
//! blocking implementations of `guide`, `search` and `read`. `mcp` registers them.

use std::fmt::Write as _;
use std::io::Read as _;
use std::path::Path;

use alexandria_proto::paths::{self, Layer};
use alexandria_proto::{Binding, ErrorCode};
use base64::Engine as _;
use rusqlite::params;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::{ToolError, ToolResult};
use crate::extract::Kind;
use crate::index::{self, SearchQuery};
use crate::markdown;
use crate::store::Store;

/// Default and largest character budget of one `read`.
pub const DEFAULT_MAX_CHARS: usize = 40_000;
pub const LIMIT_MAX_CHARS: usize = 400_000;
/// Largest image returned as image content.
const MAX_IMAGE_BYTES: u64 = 10 * 1024 * 1024;

/// What a tool returns: readable text, the same as JSON, and optional images.
#[derive(Debug)]
pub struct ToolOutput {
    pub text: String,
    pub structured: Value,
    /// (base64 data, MIME type)
    pub images: Vec<(String, String)>,
}

/// The workspace a call is bound to, after applying the session's binding.
pub fn resolve_workspace(
    store: &Store,
    binding: &Binding,
    given: Option<&str>,
) -> ToolResult<String> {
    let given = given.map(str::trim).filter(|s| !s.is_empty());
    let slug = match (binding, given) {
        (Binding::Open, None) => {
            return Err(ToolError::new(
                ErrorCode::WorkspaceRequired,
                "this session serves every workspace, so each call must name one",
                "call guide() to list the workspaces, then pass workspace=\"<slug>\" (for example workspace=\"global\")",
            ));
        }
        (Binding::Open, Some(slug)) => slug.to_string(),
        (Binding::Pinned { workspace }, None) => workspace.clone(),
        (Binding::Pinned { workspace }, Some(slug)) if slug == workspace => slug.to_string(),
        (Binding::Pinned { workspace }, Some(slug)) => {
            return Err(ToolError::new(
                ErrorCode::WorkspaceNotAccessible,
                format!("this session is pinned to workspace '{workspace}'; '{slug}' is not reachable from it"),
                format!("omit workspace or pass workspace=\"{workspace}\""),
            )
            .with_detail("pinned", workspace.as_str()));
        }
    };
    store.require_workspace(&slug)?;
    index::ensure_caught_up(store, &slug)?;
    Ok(slug)
}

// ---------------------------------------------------------------------------------
// guide

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GuideParams {
    /// Workspace slug to describe. Omit to list every workspace this session can use
    /// (in a pinned session it defaults to the pinned workspace).
    pub workspace: Option<String>,
}

const GUIDE_INTRO: &str = "alexandria is the user's local, git-backed markdown wiki (not the web, not a code index). Each workspace has two layers:\n- raw/: immutable sources (notes, PDFs, transcripts, images). Read and cite, never edit.\n- wiki/: markdown pages maintained by agents: summaries, topics, entities. wiki/index.md is the map, wiki/log.md the chronological log, wiki/SCHEMA.md the conventions (read it before writing).\nCitations: footnotes `[^1]: raw/paper.pdf, p.3` (or p.3-5) or links `[text](raw/notes.md)`; cited files and PDF pages must exist.\nLoop: guide → search (mode=search ranked full text, mode=list globs like wiki/** or raw/*.pdf) → read (pages=\"1-3\" for PDFs, sections=[\"Heading\"] for markdown) → write.";

pub fn guide(store: &Store, binding: &Binding, params: GuideParams) -> ToolResult<ToolOutput> {
    let describe_one = match (binding, params.workspace.as_deref()) {
        (Binding::Open, None) => None,
        _ => Some(resolve_workspace(
            store,
            binding,
            params.workspace.as_deref(),
        )?),
    };
    let connection = store.pool.get()?;
    let mut text = String::from(GUIDE_INTRO);
    text.push_str("\n\n");
    match describe_one {
        None => {
            let mut workspaces = Vec::new();
            let _ = writeln!(
                text,
                "Workspaces (pass one as workspace=\"<slug>\" on every call):"
            );
            for slug in store.list_workspaces() {
                index::ensure_caught_up(store, &slug)?;
                let counts = index::counts(&connection, &slug, 0)?;
                let last = last_change(&connection, &slug)?;
                let _ = writeln!(
                    text,
                    "- {slug}: {} wiki pages, {} raw sources{}",
                    counts.wiki,
                    counts.raw,
                    last.as_ref()
                        .map(|(ts, path)| format!(", last change {} ({path})", iso_time(*ts)))
                        .unwrap_or_default()
                );
                workspaces.push(json!({
                    "workspace": slug,
                    "wiki_pages": counts.wiki,
                    "raw_sources": counts.raw,
                    "last_change": last.map(|(ts, path)| json!({"ts": iso_time(ts), "path": path})),
                }));
            }
            Ok(ToolOutput {
                text,
                structured: json!({"mode": "open", "workspaces": workspaces}),
                images: Vec::new(),
            })
        }
        Some(slug) => {
            let counts = index::counts(&connection, &slug, 20)?;
            let pending: i64 = connection.query_row(
                "SELECT count(*) FROM subscription_items WHERE workspace = ?1 AND ingested_at IS NULL",
                params![slug],
                |row| row.get(0),
            )?;
            let mut statement = connection.prepare_cached(
                "SELECT ts, op, path, origin, run_id FROM wiki_log_entries WHERE workspace = ?1 ORDER BY ts DESC, id DESC LIMIT 10",
            )?;
            let history: Vec<Value> = statement
                .query_map(params![slug], |row| {
                    Ok(json!({
                        "ts": iso_time(row.get(0)?),
                        "op": row.get::<_, String>(1)?,
                        "path": row.get::<_, String>(2)?,
                        "origin": row.get::<_, String>(3)?,
                        "run_id": row.get::<_, Option<String>>(4)?,
                    }))
                })?
                .collect::<Result<_, _>>()?;
            let mode = match binding {
                Binding::Open => "open",
                Binding::Pinned { .. } => "pinned",
            };
            let _ = writeln!(
                text,
                "Workspace '{slug}' ({mode} session): {} wiki pages, {} raw sources, {pending} pending subscription items.",
                counts.wiki, counts.raw
            );
            if history.is_empty() {
                text.push_str("Recent history: none yet.\n");
            } else {
                text.push_str("Recent history (newest first):\n");
                for entry in &history {
                    let _ = writeln!(
                        text,
                        "- {} {} {} ({})",
                        entry["ts"].as_str().unwrap_or(""),
                        entry["op"].as_str().unwrap_or(""),
                        entry["path"].as_str().unwrap_or(""),
                        entry["origin"].as_str().unwrap_or("")
                    );
                }
            }
            if counts.uncited.is_empty() {
                text.push_str("Uncited sources: none.\n");
            } else {
                text.push_str(
                    "Raw sources no wiki page cites yet (candidates to ingest into the wiki):\n",
                );
                for path in &counts.uncited {
                    let _ = writeln!(text, "- {path}");
                }
            }
            Ok(ToolOutput {
                text,
                structured: json!({
                    "mode": mode,
                    "workspace": slug,
                    "wiki_pages": counts.wiki,
                    "raw_sources": counts.raw,
                    "pending_subscription_items": pending,
                    "recent_history": history,
                    "uncited_sources": counts.uncited,
                    "schema_page": "wiki/SCHEMA.md",
                }),
                images: Vec::new(),
            })
        }
    }
}

fn last_change(connection: &rusqlite::Connection, slug: &str) -> ToolResult<Option<(i64, String)>> {
    use rusqlite::OptionalExtension;
    Ok(connection
        .query_row(
            "SELECT ts, path FROM wiki_log_entries WHERE workspace = ?1 ORDER BY ts DESC, id DESC LIMIT 1",
            params![slug],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .optional()?)
}

/// Milliseconds since the epoch as an RFC 3339 UTC timestamp.
pub fn iso_time(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil-from-days (Howard Hinnant), proleptic Gregorian.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

// ---------------------------------------------------------------------------------
// search

#[derive(Debug, Clone, Copy, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SearchMode {
    /// List files whose path matches `path` (a glob).
    List,
    /// Ranked full-text search for `query`.
    Search,
}

#[derive(Debug, Clone, Copy, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LayerArg {
    Wiki,
    Raw,
    All,
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchParams {
    /// Workspace slug. Required in open sessions; defaults to the pinned workspace.
    pub workspace: Option<String>,
    /// `search` (default when `query` is given): ranked full-text search.
    /// `list`: list files matching `path`.
    pub mode: Option<SearchMode>,
    /// Words to find (all must match), "an exact phrase", prefix*, OR/NOT.
    pub query: Option<String>,
    /// Glob that scopes the paths, e.g. `wiki/**`, `raw/*.pdf`, `wiki/topics/*`.
    pub path: Option<String>,
    /// Which layer to search: `wiki`, `raw` or `all` (default).
    pub layer: Option<LayerArg>,
    /// Maximum results (default 10 for search, 200 for list; at most 1000).
    pub limit: Option<u32>,
    /// `next_cursor` from a previous call, to get the next page of results.
    pub cursor: Option<String>,
}

/// A caller's path glob, checked: the matcher, a SQL GLOB prefilter, the layer.
pub(crate) struct Scope {
    pub(crate) matcher: globset::GlobMatcher,
    pub(crate) sql: String,
    pub(crate) layer: Layer,
}

pub(crate) fn scope(path: &str) -> ToolResult<Scope> {
    let checked = paths::validate_workspace_path(path, true)
        .map_err(|e| ToolError::invalid_path(e.message).with_detail("path", path))?;
    let pattern = if checked.rest().is_empty() {
        format!("{}/**", checked.path)
    } else {
        checked.path.clone()
    };
    let matcher = globset::GlobBuilder::new(&pattern)
        .literal_separator(true)
        .build()
        .map_err(|e| {
            ToolError::invalid_argument(
                format!("'{path}' is not a valid glob: {e}"),
                "use * within a directory, ** across directories, {a,b} for alternatives",
            )
        })?
        .compile_matcher();
    // SQLite GLOB prefilter: a superset of the glob (its * also matches '/').
    let mut sql = String::new();
    let mut in_braces = false;
    for c in pattern.chars() {
        match c {
            '{' => {
                in_braces = true;
                sql.push('*');
            }
            '}' => in_braces = false,
            _ if in_braces => {}
            _ => sql.push(c),
        }
    }
    let sql = sql.replace("**", "*").replace("[!", "[^");
    Ok(Scope {
        matcher,
        sql,
        layer: checked.layer,
    })
}

pub(crate) fn parse_cursor(cursor: Option<&str>) -> ToolResult<usize> {
    match cursor.map(str::trim).filter(|c| !c.is_empty()) {
        None => Ok(0),
        Some(c) => c.parse().map_err(|_| {
            ToolError::invalid_argument(
                format!("'{c}' is not a cursor this server issued"),
                "pass the next_cursor value from the previous result unchanged, or omit cursor",
            )
        }),
    }
}

pub fn search(store: &Store, binding: &Binding, params: SearchParams) -> ToolResult<ToolOutput> {
    let slug = resolve_workspace(store, binding, params.workspace.as_deref())?;
    let query = params
        .query
        .as_deref()
        .map(str::trim)
        .filter(|q| !q.is_empty());
    let mode = params.mode.unwrap_or(if query.is_some() {
        SearchMode::Search
    } else {
        SearchMode::List
    });
    let scope = params.path.as_deref().map(scope).transpose()?;
    let layer = match (params.layer.unwrap_or(LayerArg::All), &scope) {
        (_, Some(scope)) => Some(scope.layer),
        (LayerArg::Wiki, None) => Some(Layer::Wiki),
        (LayerArg::Raw, None) => Some(Layer::Raw),
        (LayerArg::All, None) => None,
    };
    let offset = parse_cursor(params.cursor.as_deref())?;
    let connection = store.pool.get()?;
    match mode {
        SearchMode::Search => {
            let Some(query) = query else {
                return Err(ToolError::invalid_argument(
                    "mode=search needs a query",
                    "pass query=\"words to find\", or mode=\"list\" with a path glob",
                ));
            };
            let limit = params.limit.unwrap_or(10).clamp(1, 1000) as usize;
            let (hits, more) = index::search(
                &connection,
                &SearchQuery {
                    workspace: &slug,
                    query,
                    layer,
                    scope: scope.as_ref().map(|s| &s.matcher),
                    scope_sql: scope.as_ref().map(|s| s.sql.clone()),
                    limit,
                    offset,
                },
            )?;
            let next_cursor = more.then(|| (offset + hits.len()).to_string());
            let mut text = if hits.is_empty() {
                format!(
                    "No matches for {query:?} in workspace '{slug}'. Try fewer or other words, word* prefixes, or layer=\"all\".\n"
                )
            } else {
                format!(
                    "{} matches for {query:?} in workspace '{slug}' (best first):\n",
                    hits.len()
                )
            };
            for (i, hit) in hits.iter().enumerate() {
                let page = hit.page.map(|p| format!(", p.{p}")).unwrap_or_default();
                let heading = if hit.heading.is_empty() {
                    String::new()
                } else {
                    format!(" — {}", hit.heading)
                };
                let _ = writeln!(
                    text,
                    "{}. {}{page}{heading}\n   {}",
                    offset + i + 1,
                    hit.path,
                    hit.snippet.replace('\n', " ")
                );
            }
            if let Some(cursor) = &next_cursor {
                let _ = writeln!(text, "More results: call again with cursor=\"{cursor}\".");
            }
            Ok(ToolOutput {
                text,
                structured: json!({
                    "mode": "search",
                    "workspace": slug,
                    "query": query,
                    "hits": hits,
                    "next_cursor": next_cursor,
                }),
                images: Vec::new(),
            })
        }
        SearchMode::List => {
            let limit = params.limit.unwrap_or(200).clamp(1, 1000) as usize;
            let files = index::list(
                &connection,
                &slug,
                layer,
                scope.as_ref().map(|s| &s.matcher),
                scope.as_ref().map(|s| s.sql.as_str()),
            )?;
            let total = files.len();
            let page: Vec<_> = files.into_iter().skip(offset).take(limit).collect();
            let next_cursor =
                (offset + page.len() < total).then(|| (offset + page.len()).to_string());
            let mut text = format!(
                "{total} files in workspace '{slug}'{}{}:\n",
                params
                    .path
                    .as_deref()
                    .map(|p| format!(" matching {p}"))
                    .unwrap_or_default(),
                if offset > 0 {
                    format!(" (from #{})", offset + 1)
                } else {
                    String::new()
                }
            );
            let mut listed = Vec::with_capacity(page.len());
            for file in &page {
                let detail = match (file.kind.as_str(), file.pages, &file.title) {
                    ("pdf", Some(pages), _) => format!("pdf, {pages} pages"),
                    (_, _, Some(title)) => format!("{} — {title}", file.kind),
                    (kind, _, None) => kind.to_string(),
                };
                let _ = writeln!(text, "- {} ({detail}, {} bytes)", file.path, file.size);
                listed.push(json!({
                    "path": file.path,
                    "kind": file.kind,
                    "size": file.size,
                    "pages": file.pages,
                    "title": file.title,
                    "rev": file.rev,
                }));
            }
            if let Some(cursor) = &next_cursor {
                let _ = writeln!(text, "More: call again with cursor=\"{cursor}\".");
            }
            Ok(ToolOutput {
                text,
                structured: json!({
                    "mode": "list",
                    "workspace": slug,
                    "total": total,
                    "files": listed,
                    "next_cursor": next_cursor,
                }),
                images: Vec::new(),
            })
        }
    }
}

// ---------------------------------------------------------------------------------
// read

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadParams {
    /// Workspace slug. Required in open sessions; defaults to the pinned workspace.
    pub workspace: Option<String>,
    /// A file (`wiki/index.md`, `raw/paper.pdf`) or a glob for a batch (`wiki/topics/*.md`).
    pub path: String,
    /// PDF pages to read, e.g. "3", "1-5,9".
    pub pages: Option<String>,
    /// Markdown sections to read, by heading text or trail ("Setup" or "Guide > Setup").
    pub sections: Option<Vec<String>>,
    /// Return png/jpg/gif/webp files as image content.
    pub include_images: Option<bool>,
    /// Character budget for the answer (default 40000).
    pub max_chars: Option<u32>,
}

/// Parse `"1-5,9"` into sorted unique page numbers within `1..=count`.
pub fn parse_pages(spec: &str, count: u32) -> ToolResult<Vec<u32>> {
    let invalid = |why: String| {
        ToolError::invalid_argument(
            format!("pages={spec:?}: {why}"),
            format!("use page numbers from 1 to {count}, like \"3\" or \"1-5,9\""),
        )
        .with_detail("page_count", count)
    };
    let mut pages = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (from, to) = match part.split_once('-') {
            Some((a, b)) => (a.trim(), b.trim()),
            None => (part, part),
        };
        let from: u32 = from
            .parse()
            .map_err(|_| invalid(format!("'{part}' is not a page or range")))?;
        let to: u32 = to
            .parse()
            .map_err(|_| invalid(format!("'{part}' is not a page or range")))?;
        if from == 0 || to < from {
            return Err(invalid(format!("'{part}' is not a valid range")));
        }
        if to > count {
            return Err(invalid(format!("the document has {count} pages")));
        }
        if to - from > 10_000 {
            return Err(invalid("range too long".into()));
        }
        pages.extend(from..=to);
    }
    if pages.is_empty() {
        return Err(invalid("no pages given".into()));
    }
    pages.sort_unstable();
    pages.dedup();
    Ok(pages)
}

/// Cut `text` to at most `max` characters; returns whether it was cut.
fn truncate_chars(text: &mut String, max: usize) -> bool {
    match text.char_indices().nth(max) {
        Some((cut, _)) => {
            text.truncate(cut);
            true
        }
        None => false,
    }
}

pub fn read(store: &Store, binding: &Binding, params: ReadParams) -> ToolResult<ToolOutput> {
    let slug = resolve_workspace(store, binding, params.workspace.as_deref())?;
    let max_chars = params
        .max_chars
        .map(|m| m as usize)
        .unwrap_or(DEFAULT_MAX_CHARS)
        .clamp(100, LIMIT_MAX_CHARS);
    if paths::is_glob(&params.path) {
        return read_batch(store, &slug, &params, max_chars);
    }
    let (checked, absolute) = store.checked_path(&slug, &params.path)?;
    let record = index::ensure_fresh(store, &slug, &checked.path, &absolute)?;
    let kind = Kind::of(&absolute);
    if params.pages.is_some() && kind != Kind::Pdf {
        return Err(ToolError::invalid_argument(
            format!(
                "pages applies to PDF files; {} is {}",
                checked.path,
                kind.as_str()
            ),
            "omit pages, or use sections=[…] for markdown",
        ));
    }
    if params.sections.is_some() && kind != Kind::Markdown {
        return Err(ToolError::invalid_argument(
            format!(
                "sections applies to markdown files; {} is {}",
                checked.path,
                kind.as_str()
            ),
            "omit sections (use pages=\"…\" for PDFs)",
        ));
    }
    let mut structured = json!({
        "workspace": slug,
        "path": checked.path,
        "kind": kind.as_str(),
        "rev": record.rev,
        "size": record.size,
    });
    let mut images = Vec::new();
    let (text, truncated) = match kind {
        Kind::Markdown | Kind::Text => {
            let mut content = read_text(&absolute, params.sections.is_none().then_some(max_chars))?;
            if let Some(wanted) = &params.sections {
                let mut parts = Vec::new();
                let mut missing = Vec::new();
                for heading in wanted {
                    match markdown::find_section(&content, heading) {
                        Some((a, b)) => parts.push(content[a..b].to_string()),
                        None => missing.push(heading.clone()),
                    }
                }
                if !missing.is_empty() {
                    let available: Vec<String> = markdown::sections(&content)
                        .into_iter()
                        .filter(|s| s.level > 0)
                        .map(|s| s.trail.join(" > "))
                        .collect();
                    return Err(ToolError::new(
                        ErrorCode::NoMatch,
                        format!("{} has no section {}", checked.path, missing.join(", ")),
                        "pass a heading exactly as in the page (case does not matter); the available headings are listed",
                    )
                    .with_detail("missing", missing)
                    .with_detail("available", available));
                }
                structured["sections"] = json!(wanted);
                content = parts.join("\n");
            }
            let truncated = truncate_chars(&mut content, max_chars);
            (content, truncated)
        }
        Kind::Pdf => {
            let count = record.pages.unwrap_or(0) as u32;
            structured["page_count"] = json!(count);
            if count == 0 {
                return Err(ToolError::new(
                    ErrorCode::InvalidArgument,
                    format!(
                        "{} has no readable pages (damaged or encrypted PDF?)",
                        checked.path
                    ),
                    "read another source, or ask the user for a text version",
                ));
            }
            let pages = match &params.pages {
                Some(spec) => parse_pages(spec, count)?,
                None => (1..=count).collect(),
            };
            let connection = store.pool.get()?;
            let mut content = String::new();
            let mut returned = Vec::new();
            let mut truncated = false;
            for (page, body) in index::pdf_pages(&connection, record.id, &pages)? {
                let body = if body.trim().is_empty() {
                    "(no text on this page: it may be a scanned image)\n".to_string()
                } else {
                    body
                };
                let block = format!("--- page {page} ---\n{}\n", body.trim());
                if content.chars().count() + block.chars().count() > max_chars {
                    truncated = true;
                    if returned.is_empty() {
                        let mut partial = block;
                        truncate_chars(&mut partial, max_chars);
                        content.push_str(&partial);
                        returned.push(page);
                    }
                    break;
                }
                content.push_str(&block);
                returned.push(page);
            }
            structured["pages"] = json!(returned);
            if truncated && let Some(last) = returned.last() {
                structured["next_pages"] =
                    json!(format!("{}-{}", last + 1, pages.last().unwrap_or(last)));
            }
            (content, truncated)
        }
        Kind::Image => {
            if params.include_images.unwrap_or(false) {
                let Some(mime) = Kind::image_mime(&absolute) else {
                    return Err(ToolError::invalid_argument(
                        format!(
                            "{} is an image format that cannot be returned as image content",
                            checked.path
                        ),
                        "png, jpg, gif and webp can be returned",
                    ));
                };
                if record.size as u64 > MAX_IMAGE_BYTES {
                    return Err(ToolError::new(
                        ErrorCode::TooLarge,
                        format!(
                            "{} is {} bytes; images over {MAX_IMAGE_BYTES} bytes are not returned",
                            checked.path, record.size
                        ),
                        "ask the user for a smaller version",
                    ));
                }
                let bytes = std::fs::read(&absolute)
                    .map_err(|e| ToolError::internal("reading image", e))?;
                images.push((
                    base64::engine::general_purpose::STANDARD.encode(&bytes),
                    mime.to_string(),
                ));
                (
                    format!(
                        "{} (image, {} bytes) is attached.",
                        checked.path, record.size
                    ),
                    false,
                )
            } else {
                (
                    format!(
                        "{} is an image ({} bytes). Call read with include_images=true to see it.",
                        checked.path, record.size
                    ),
                    false,
                )
            }
        }
        Kind::Binary => (
            format!(
                "{} is a binary file ({} bytes) with no text alexandria can extract.",
                checked.path, record.size
            ),
            false,
        ),
    };
    structured["truncated"] = json!(truncated);
    structured["chars"] = json!(text.chars().count());
    let mut rendered = format!(
        "{} (rev {})\n\n{text}",
        checked.path,
        short_rev(&record.rev)
    );
    if truncated {
        let hint = match kind {
            Kind::Pdf => format!(
                "\n[truncated at {max_chars} characters: continue with pages=\"{}\"]",
                structured["next_pages"].as_str().unwrap_or("…")
            ),
            _ => format!(
                "\n[truncated at {max_chars} characters: read parts with sections=[…] or raise max_chars (up to {LIMIT_MAX_CHARS})]"
            ),
        };
        rendered.push_str(&hint);
    }
    structured["content"] = json!(text);
    Ok(ToolOutput {
        text: rendered,
        structured,
        images,
    })
}

fn short_rev(rev: &str) -> &str {
    &rev[..rev.len().min(12)]
}

/// Read a text file, at most about `max_chars` characters of it when given.
fn read_text(path: &Path, max_chars: Option<usize>) -> ToolResult<String> {
    let file = std::fs::File::open(path).map_err(|e| ToolError::internal("opening file", e))?;
    let mut bytes = Vec::new();
    match max_chars {
        // 4 bytes per character at most, plus one more character to detect the cut.
        Some(max) => file.take((max as u64 + 1) * 4).read_to_end(&mut bytes),
        None => {
            let mut file = file;
            file.read_to_end(&mut bytes)
        }
    }
    .map_err(|e| ToolError::internal("reading file", e))?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

fn read_batch(
    store: &Store,
    slug: &str,
    params: &ReadParams,
    max_chars: usize,
) -> ToolResult<ToolOutput> {
    if params.pages.is_some() || params.sections.is_some() {
        return Err(ToolError::invalid_argument(
            "pages and sections apply to a single file, not a glob",
            "read the file on its own to select pages or sections",
        ));
    }
    let scope = scope(&params.path)?;
    let connection = store.pool.get()?;
    let files = index::list(
        &connection,
        slug,
        Some(scope.layer),
        Some(&scope.matcher),
        Some(&scope.sql),
    )?;
    drop(connection);
    if files.is_empty() {
        return Err(ToolError::new(
            ErrorCode::NotFound,
            format!("no file matches {}", params.path),
            "list what exists with search(mode=\"list\", path=\"wiki/**\")",
        )
        .with_detail("path", params.path.as_str()));
    }
    let mut text = String::new();
    let mut used = 0usize;
    let mut returned = Vec::new();
    let mut remaining = Vec::new();
    let mut images = Vec::new();
    for (i, file) in files.iter().enumerate() {
        if used >= max_chars {
            remaining.extend(files[i..].iter().map(|f| f.path.clone()));
            break;
        }
        let single = ReadParams {
            workspace: Some(slug.to_string()),
            path: file.path.clone(),
            pages: None,
            sections: None,
            include_images: params.include_images,
            max_chars: Some((max_chars - used).max(100) as u32),
        };
        match read(
            store,
            &Binding::Pinned {
                workspace: slug.to_string(),
            },
            single,
        ) {
            Ok(output) => {
                let truncated = output.structured["truncated"].as_bool().unwrap_or(false);
                let chars = output.structured["chars"].as_u64().unwrap_or(0) as usize;
                if truncated && !returned.is_empty() {
                    // It does not fit whole: leave it for the next call.
                    remaining.extend(files[i..].iter().map(|f| f.path.clone()));
                    break;
                }
                used += chars;
                let _ = writeln!(text, "=== {} ===", output.text);
                images.extend(output.images);
                returned.push(json!({
                    "path": file.path,
                    "rev": output.structured["rev"],
                    "kind": output.structured["kind"],
                    "chars": chars,
                    "truncated": truncated,
                    "content": output.structured["content"],
                }));
            }
            Err(error) => {
                let _ = writeln!(text, "=== {} ===\n{}\n", file.path, error.to_text());
                returned.push(json!({"path": file.path, "error": error.to_json()["error"]}));
            }
        }
    }
    if !remaining.is_empty() {
        let _ = writeln!(
            text,
            "[budget of {max_chars} characters used: {} more files not shown: {}. Read them with a narrower glob or one by one.]",
            remaining.len(),
            remaining
                .iter()
                .take(20)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(ToolOutput {
        text,
        structured: json!({
            "workspace": slug,
            "path": params.path,
            "files": returned,
            "remaining": remaining,
            "truncated": !remaining.is_empty(),
        }),
        images,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_specs() {
        assert_eq!(parse_pages("3", 5).expect("ok"), vec![3]);
        assert_eq!(parse_pages("1-3, 5,2", 5).expect("ok"), vec![1, 2, 3, 5]);
        for bad in ["0", "6", "3-1", "x", "", "1-", "2-9"] {
            assert!(parse_pages(bad, 5).is_err(), "{bad}");
        }
    }

    #[test]
    fn times() {
        assert_eq!(iso_time(0), "1970-01-01T00:00:00Z");
        assert_eq!(iso_time(1_700_000_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(iso_time(951_782_400_000), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn binding_rules() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(alexandria_proto::Home::new(dir.path())).expect("store");
        store.create_workspace("acme").expect("acme");
        let open = Binding::Open;
        let pinned = Binding::Pinned {
            workspace: "acme".into(),
        };
        assert_eq!(
            resolve_workspace(&store, &open, None)
                .expect_err("req")
                .code,
            ErrorCode::WorkspaceRequired
        );
        assert_eq!(
            resolve_workspace(&store, &open, Some("acme")).expect("ok"),
            "acme"
        );
        assert_eq!(
            resolve_workspace(&store, &open, Some("nope"))
                .expect_err("nf")
                .code,
            ErrorCode::WorkspaceNotFound
        );
        assert_eq!(
            resolve_workspace(&store, &pinned, None).expect("pin"),
            "acme"
        );
        assert_eq!(
            resolve_workspace(&store, &pinned, Some("global"))
                .expect_err("pin")
                .code,
            ErrorCode::WorkspaceNotAccessible
        );
    }
}
