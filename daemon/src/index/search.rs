//! Ranked full-text search (the search index of `engine.rs`, or FTS5 `MATCH` and bm25;
//! snippets for the returned hits from FTS5) and path listings over the catalogue.

use super::glob::PathGlob;
use super::*;
use crate::error::{ToolError, ToolResult};
use alexandria_proto::ErrorCode;
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

/// Ranked full-text search through the search index (`engine.rs`) when it can answer,
/// else through FTS5 (`search`). Returns the hits and whether more follow.
pub fn search_ranked(
    store: &crate::workspace::Store,
    connection: &Connection,
    query: &SearchQuery<'_>,
) -> ToolResult<(Vec<Hit>, bool)> {
    let fts = fts_query(query.query)?;
    if let Some(engine) = super::engine::get(store) {
        match engine.search(connection, query, &fts) {
            Ok(Some((ranked, more))) => {
                let hits = super::engine::complete(connection, &fts, &ranked)
                    .map_err(|e| query_error(query.query, e))?;
                return Ok((hits, more));
            }
            Ok(None) => {}
            Err(error) => tracing::warn!(%error, "search index failed; FTS5 answers"),
        }
    }
    search(connection, query)
}

/// Ranked full-text search with FTS5 alone. Returns the hits and whether more follow.
pub fn search(connection: &Connection, query: &SearchQuery<'_>) -> ToolResult<(Vec<Hit>, bool)> {
    let fts = fts_query(query.query)?;
    // Two steps: rank every match (bm25 only), then read page, heading and snippet
    // for the hits returned. A snippet re-reads and re-tokenizes its chunk, so
    // computing it in the ranking query cost one per match, not one per hit: 0.75 s
    // for a word in 28k chunks. Without a glob to check here, SQL stops after the
    // last hit needed.
    let sql = "SELECT chunks.rowid, f.path, f.layer, f.kind, bm25(chunks)
               FROM chunks JOIN files f ON f.id = (chunks.rowid >> 20)
               WHERE chunks MATCH ?1 AND f.workspace = ?2
                 AND (?3 IS NULL OR f.layer = ?3)
                 AND (?4 IS NULL OR f.path GLOB ?4)
               ORDER BY bm25(chunks)
               LIMIT ?5";
    let sql_limit = match query.scope {
        Some(_) => -1,
        None => (query.offset + query.limit + 1) as i64,
    };
    let mut statement = connection
        .prepare_cached(sql)
        .map_err(|e| query_error(query.query, e))?;
    let mut rows = statement
        .query(params![
            fts,
            query.workspace,
            query.layer.map(Layer::as_str),
            query.scope_sql,
            sql_limit
        ])
        .map_err(|e| query_error(query.query, e))?;
    let mut ranked = Vec::new();
    let mut skipped = 0;
    let mut more = false;
    while let Some(row) = rows.next().map_err(|e| query_error(query.query, e))? {
        let path: String = row.get(1)?;
        if let Some(scope) = query.scope
            && !scope.is_match(&path)
        {
            continue;
        }
        if skipped < query.offset {
            skipped += 1;
            continue;
        }
        if ranked.len() == query.limit {
            more = true;
            break;
        }
        let rowid: i64 = row.get(0)?;
        let layer: String = row.get(2)?;
        let kind: String = row.get(3)?;
        let score: f64 = row.get(4)?;
        ranked.push((rowid, path, layer, kind, score));
    }
    drop(rows);
    let mut detail = connection
        .prepare_cached(
            "SELECT page, heading, snippet(chunks, 2, '**', '**', '…', 24)
             FROM chunks WHERE chunks MATCH ?1 AND rowid = ?2",
        )
        .map_err(|e| query_error(query.query, e))?;
    let mut hits = Vec::with_capacity(ranked.len());
    for (rowid, path, layer, kind, score) in ranked {
        let (page, heading, snippet) = detail
            .query_row(params![fts, rowid], |row| {
                Ok((
                    row.get::<_, Option<i64>>(0)?,
                    row.get::<_, Option<String>>(1)?,
                    row.get::<_, String>(2)?,
                ))
            })
            .map_err(|e| query_error(query.query, e))?;
        hits.push(Hit {
            path,
            layer,
            kind,
            page,
            heading: heading.unwrap_or_default(),
            snippet: snippet.trim().to_string(),
            score: -score,
        });
    }
    Ok((hits, more))
}

fn query_error(query: &str, error: rusqlite::Error) -> ToolError {
    let text = error.to_string();
    // FTS5 reports query syntax problems as plain SQLITE_ERROR at step time.
    let is_syntax = matches!(
        &error,
        rusqlite::Error::SqliteFailure(e, _) if e.code == rusqlite::ErrorCode::Unknown
    );
    if is_syntax {
        ToolError::new(
            ErrorCode::InvalidQuery,
            format!("cannot parse the search query {query:?}: {text}"),
            "use plain words (all must match), \"an exact phrase\", word* for a prefix, OR / NOT between words; or drop the special characters",
        )
    } else {
        ToolError::internal("search", error)
    }
}

/// Turn a user query into an FTS5 query. Plain words are quoted so punctuation
/// cannot break the syntax; queries that use FTS5 syntax on purpose pass through.
pub fn fts_query(query: &str) -> ToolResult<String> {
    let trimmed = query.trim();
    if trimmed.is_empty() {
        return Err(ToolError::new(
            ErrorCode::InvalidQuery,
            "the search query is empty",
            "pass words to look for, or use mode=\"list\" to list files",
        ));
    }
    let uses_syntax = trimmed.contains(['"', '*', '(', ')', '^'])
        || trimmed
            .split_whitespace()
            .any(|w| matches!(w, "AND" | "OR" | "NOT") || w.starts_with("NEAR("));
    if uses_syntax {
        return Ok(trimmed.to_string());
    }
    let terms: Vec<String> = trimmed
        .split_whitespace()
        .map(|word| format!("\"{}\"", word.replace('"', "\"\"")))
        .collect();
    Ok(terms.join(" "))
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
