//! The `search` tool: ranked full-text search (`mode=search`) and path globs (`mode=list`).

use std::fmt::Write as _;

use alexandria_proto::Binding;
use alexandria_proto::paths::Layer;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

use super::params::{limit_in_range, parse_cursor, scope};
use super::{ToolOutput, resolve_workspace};
use crate::error::{ToolError, ToolResult};
use crate::index::{self, SearchQuery};
use crate::workspace::Store;

/// The largest `limit` (the schema says the same).
const LIMIT_MAX: u32 = 1000;

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
    /// Maximum results, 1 to 1000 (default 10 for search, 200 for list); page
    /// through more with `cursor`.
    #[schemars(range(min = 1, max = LIMIT_MAX))]
    pub limit: Option<u32>,
    /// `next_cursor` from a previous call, to get the next page of results.
    pub cursor: Option<String>,
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
    let connection = crate::blocking::checkout(&store.pool)?;
    match mode {
        SearchMode::Search => {
            let Some(query) = query else {
                return Err(ToolError::invalid_argument(
                    "mode=search needs a query",
                    "pass query=\"words to find\", or mode=\"list\" with a path glob",
                ));
            };
            let limit = limit_in_range(params.limit, 10, LIMIT_MAX)?;
            let found = index::search_ranked(
                store,
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
            let hits = found.hits;
            let next_cursor = found.more.then(|| (offset + hits.len()).to_string());
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
            let mut structured = json!({
                "mode": "search",
                "workspace": slug,
                "query": query,
                "hits": hits,
                "next_cursor": next_cursor,
            });
            if found.indexing {
                let _ = writeln!(
                    text,
                    "The search index is still being built: these results may be incomplete. Search again in a moment."
                );
                structured["indexing"] = json!(true);
            }
            Ok(ToolOutput {
                text,
                structured,
                images: Vec::new(),
            })
        }
        SearchMode::List => {
            let limit = limit_in_range(params.limit, 200, LIMIT_MAX)?;
            // A listing may walk every file of the workspace.
            let files = crate::blocking::section(|| {
                index::list(
                    &connection,
                    &slug,
                    layer,
                    scope.as_ref().map(|s| &s.matcher),
                    scope.as_ref().map(|s| s.sql.as_str()),
                )
            })?;
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
