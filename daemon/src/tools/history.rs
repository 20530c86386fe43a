//! The `history` tool: a structured query over `wiki_log_entries`.

use alexandria_proto::Binding;
use rusqlite::params;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

use super::params::{limit_in_range, parse_time};
use super::{ToolOutput, resolve_workspace};
use crate::db::now_ms;
use crate::error::{ToolError, ToolResult};
use crate::workspace::Store;

/// The largest `limit` (the schema says the same).
const LIMIT_MAX: u32 = 500;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HistoryParams {
    /// Workspace slug. Required in open sessions; defaults to the pinned workspace.
    pub workspace: Option<String>,
    /// Only entries at or after this time: RFC 3339 (`2026-11-30T08:00:00Z`), a date
    /// (`2026-11-30`), or an age (`30m`, `24h`, `7d`).
    pub since: Option<String>,
    /// Only entries before this time (same formats as `since`).
    pub until: Option<String>,
    /// Only this operation: create, str_replace, append, delete, outside_create,
    /// outside_edit, outside_delete.
    pub op: Option<String>,
    /// Only paths matching this glob (e.g. `wiki/topics/**`).
    pub path: Option<String>,
    /// Only this run.
    pub run_id: Option<String>,
    /// Maximum entries, 1 to 500 (default 50), newest first; page through more with
    /// `cursor`.
    #[schemars(range(min = 1, max = LIMIT_MAX))]
    pub limit: Option<u32>,
    /// `next_cursor` from a previous call.
    pub cursor: Option<String>,
}

pub fn history(store: &Store, binding: &Binding, params: HistoryParams) -> ToolResult<ToolOutput> {
    let workspace = resolve_workspace(store, binding, params.workspace.as_deref())?;
    crate::commit::rebuild::ensure_history(store, &workspace)?;
    let now = now_ms();
    let bound = |value: &Option<String>, name: &str| -> ToolResult<Option<i64>> {
        match value.as_deref().map(str::trim).filter(|v| !v.is_empty()) {
            None => Ok(None),
            Some(v) => parse_time(v, now).map(Some).ok_or_else(|| {
                ToolError::invalid_argument(
                    format!("{name}={v:?} is not a time"),
                    "use 2026-11-30, 2026-11-30T08:00:00Z, or an age like 30m, 24h, 7d",
                )
            }),
        }
    };
    let since = bound(&params.since, "since")?;
    let until = bound(&params.until, "until")?;
    let scope = params
        .path
        .as_deref()
        .map(crate::tools::params::scope)
        .transpose()?;
    let matcher = scope.map(|s| s.matcher);
    let limit = limit_in_range(params.limit, 50, LIMIT_MAX)?;
    let offset = crate::tools::params::parse_cursor(params.cursor.as_deref())?;
    let connection = store.pool.get()?;
    let mut statement = connection.prepare_cached(
        "SELECT e.ts, e.op, e.path, e.run_id, e.summary, e.origin, e.commit_id, e.previous_commit, r.client, r.tool
         FROM wiki_log_entries e
         LEFT JOIN runs r ON r.workspace = e.workspace AND r.run_id = e.run_id
         WHERE e.workspace = ?1 AND (?2 IS NULL OR e.ts >= ?2) AND (?3 IS NULL OR e.ts < ?3)
           AND (?4 IS NULL OR e.op = ?4) AND (?5 IS NULL OR e.run_id = ?5)
         ORDER BY e.ts DESC, e.id DESC",
    )?;
    let mut rows = statement.query(params![workspace, since, until, params.op, params.run_id])?;
    let mut entries = Vec::new();
    let mut skipped = 0;
    let mut more = false;
    while let Some(row) = rows.next()? {
        let path: String = row.get(2)?;
        if matcher.as_ref().is_some_and(|m| !m.is_match(&path)) {
            continue;
        }
        if skipped < offset {
            skipped += 1;
            continue;
        }
        if entries.len() == limit {
            more = true;
            break;
        }
        entries.push(json!({
            "ts": crate::tools::iso_time(row.get(0)?),
            "op": row.get::<_, String>(1)?,
            "path": path,
            "run_id": row.get::<_, Option<String>>(3)?,
            "summary": row.get::<_, Option<String>>(4)?,
            "origin": row.get::<_, String>(5)?,
            "commit": row.get::<_, Option<String>>(6)?,
            "previous_commit": row.get::<_, Option<String>>(7)?,
            "client": row.get::<_, Option<String>>(8)?,
            "tool": row.get::<_, Option<String>>(9)?,
        }));
    }
    let next_cursor = more.then(|| (offset + entries.len()).to_string());
    let mut text = format!(
        "{} history entries in '{workspace}' (newest first):\n",
        entries.len()
    );
    for entry in &entries {
        let short = |key: &str| entry[key].as_str().map(|c| &c[..c.len().min(12)]);
        text.push_str(&format!(
            "- {} {} {} [{}{}{}{}]{}\n",
            entry["ts"].as_str().unwrap_or(""),
            entry["op"].as_str().unwrap_or(""),
            entry["path"].as_str().unwrap_or(""),
            entry["origin"].as_str().unwrap_or(""),
            entry["run_id"]
                .as_str()
                .map(|r| format!(", {r}"))
                .unwrap_or_default(),
            entry["client"]
                .as_str()
                .map(|c| format!(", {c}"))
                .unwrap_or_default(),
            short("commit")
                .map(|c| format!(", commit {c}"))
                .unwrap_or_default(),
            short("previous_commit")
                .map(|c| format!(
                    "; the text before is in commit {c} (`git show {c}:{}`)",
                    entry["path"].as_str().unwrap_or("")
                ))
                .unwrap_or_default(),
        ));
    }
    if let Some(cursor) = &next_cursor {
        text.push_str(&format!("More: call again with cursor=\"{cursor}\".\n"));
    }
    Ok(ToolOutput {
        text,
        structured: json!({"workspace": workspace, "entries": entries, "next_cursor": next_cursor}),
        images: Vec::new(),
    })
}
