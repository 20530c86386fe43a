//! Ranked full-text search (the search index of `engine.rs`, snippets from the hits'
//! stored text) and path listings over the catalogue.

use super::glob::PathGlob;
use super::*;
use crate::error::{ToolError, ToolResult};
use alexandria_proto::paths::Layer;
use rusqlite::{Connection, params};

/// One search hit.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Hit {
    pub path: String,
    pub layer: String,
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub page: Option<i64>,
    /// Heading trail of the matching section, `"Guide > Install"`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub heading: String,
    /// Matching text with hits in `**bold**`.
    pub snippet: String,
    pub score: f64,
}

pub struct SearchQuery<'a> {
    pub workspace: &'a str,
    pub query: &'a str,
    pub layer: Option<Layer>,
    pub scope: Option<&'a PathGlob>,
    /// SQLite GLOB prefilter matching a superset of `scope`.
    pub scope_sql: Option<String>,
    pub limit: usize,
    pub offset: usize,
}

/// What a ranked search found.
#[derive(Debug)]
pub struct Found {
    pub hits: Vec<Hit>,
    /// More hits follow (for the next cursor).
    pub more: bool,
    /// The search index was still being built and did not catch up within
    /// `engine::SEARCH_WAIT`: the hits come from what it had indexed.
    pub indexing: bool,
}

/// Ranked full-text search through the search index (`engine.rs`): the query parsed
/// (`query.rs`; `invalid_query` when malformed), the best chunks, their snippets.
pub fn search_ranked(
    store: &crate::workspace::Store,
    connection: &Connection,
    query: &SearchQuery<'_>,
) -> ToolResult<Found> {
    let expr = super::query::parse(query.query)?;
    let deadline = std::time::Instant::now() + super::engine::SEARCH_WAIT;
    let Some(engine) = super::engine::wait_for(store, deadline) else {
        return Err(ToolError::internal(
            "search",
            "the search index could not be opened (see the daemon's log)",
        ));
    };
    let answer = engine
        .search(connection, query, &expr)
        .map_err(|e| ToolError::internal("search", e))?;
    let hits = super::engine::complete(connection, &expr, &answer.hits)?;
    Ok(Found {
        hits,
        more: answer.more,
        indexing: answer.indexing,
    })
}

/// Files of a workspace whose path matches `scope`, sorted by path. `scope_sql` is a
/// SQLite GLOB matching a superset of `scope`: its literal prefix turns the scan of
/// every file of the workspace into a range of the (workspace, path) index.
pub fn list(
    connection: &Connection,
    workspace: &str,
    layer: Option<Layer>,
    scope: Option<&PathGlob>,
    scope_sql: Option<&str>,
) -> ToolResult<Vec<FileRecord>> {
    let mut statement = connection.prepare_cached(&format!(
        "SELECT {FILE_COLUMNS} FROM files WHERE workspace = ?1 AND (?2 IS NULL OR layer = ?2){} ORDER BY path",
        if scope_sql.is_some() { " AND path GLOB ?3" } else { "" }
    ))?;
    let layer = layer.map(Layer::as_str);
    let rows = match scope_sql {
        Some(glob) => statement.query_map(params![workspace, layer, glob], file_from_row)?,
        None => statement.query_map(params![workspace, layer], file_from_row)?,
    };
    let mut files = Vec::new();
    for row in rows {
        let record = row?;
        if scope.is_none_or(|s| s.is_match(&record.path)) {
            files.push(record);
        }
    }
    Ok(files)
}
