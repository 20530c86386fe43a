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
    let engine = super::engine::get(store)
        .or_else(|| crate::blocking::section(|| super::engine::wait_for(store, deadline)));
    let Some(engine) = engine else {
        return Err(ToolError::internal(
            "search",
            "the search index could not be opened (see the daemon's log)",
        ));
    };
    let answer = engine
        .search(connection, query, &expr)
        .map_err(|e| ToolError::internal("search", e))?;
    // One read transaction for every hit's text: each statement outside one is a
    // transaction of its own, and taking and letting go of WAL's read lock is two
    // `fcntl` calls and a look at the WAL's header (10 hits: 11 transactions a search).
    let transaction = connection.unchecked_transaction()?;
    let hits = super::engine::complete(&transaction, &expr, &answer.hits)?;
    transaction.commit()?;
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
    // The glob's literal prefix as a range of the (workspace, path) index, not `path
    // GLOB ?3`: SQLite prepares a statement again whenever the value bound to the right
    // of a GLOB changes (its prefix optimisation depends on it), which cost a tenth of
    // a glob read. The glob itself is matched below.
    let prefix = scope_sql.map(literal_prefix).filter(|p| !p.is_empty());
    let end = prefix.and_then(prefix_end);
    let mut statement = connection.prepare_cached(&format!(
        "SELECT {FILE_COLUMNS} FROM files WHERE workspace = ?1 AND (?2 IS NULL OR layer = ?2){}{} ORDER BY path",
        if prefix.is_some() { " AND path >= ?3" } else { "" },
        if end.is_some() { " AND path < ?4" } else { "" },
    ))?;
    let layer = layer.map(Layer::as_str);
    let rows = match (prefix, &end) {
        (Some(prefix), Some(end)) => {
            statement.query_map(params![workspace, layer, prefix, end], file_from_row)?
        }
        (Some(prefix), None) => {
            statement.query_map(params![workspace, layer, prefix], file_from_row)?
        }
        _ => statement.query_map(params![workspace, layer], file_from_row)?,
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

/// What every path a GLOB pattern matches starts with: the pattern up to its first
/// wildcard.
fn literal_prefix(glob: &str) -> &str {
    let end = glob.find(['*', '?', '[']).unwrap_or(glob.len());
    &glob[..end]
}

/// The smallest string greater than every string that starts with `prefix` (SQLite
/// compares text byte by byte): its last character that can be, raised by one, with
/// what follows it cut. None when no character can be raised.
fn prefix_end(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let next = (u32::from(last) + 1..=0x10FFFF).find_map(char::from_u32);
        if let Some(next) = next {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_prefix_ranges_hold_every_match() {
        assert_eq!(literal_prefix("wiki/s0001/p00010*.md"), "wiki/s0001/p00010");
        assert_eq!(literal_prefix("wiki/a?/[bc]*"), "wiki/a");
        assert_eq!(literal_prefix("*"), "");
        assert_eq!(prefix_end("wiki/a").as_deref(), Some("wiki/b"));
        assert_eq!(
            prefix_end("wiki/\u{D7FF}").as_deref(),
            Some("wiki/\u{E000}")
        );
        assert_eq!(prefix_end("a\u{10FFFF}").as_deref(), Some("b"));
        assert_eq!(prefix_end("\u{10FFFF}"), None);
        // Byte order (SQLite's) agrees with the range for paths under the prefix.
        let end = prefix_end("wiki/é").expect("end");
        for inside in [
            "wiki/é",
            "wiki/éa",
            "wiki/é\u{10FFFF}x",
            "wiki/é/deep/page.md",
        ] {
            assert!(
                inside.as_bytes() >= "wiki/é".as_bytes() && inside.as_bytes() < end.as_bytes(),
                "{inside}"
            );
        }
        for outside in ["wiki/f", "wiki/ê", "wiki/e"] {
            assert!(
                !(outside.as_bytes() >= "wiki/é".as_bytes() && outside.as_bytes() < end.as_bytes()),
                "{outside}"
            );
        }
    }
}
