//! The `guide` tool: how the wiki works, the workspaces or one workspace's state.

use std::fmt::Write as _;

use alexandria_proto::Binding;
use rusqlite::params;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::params::iso_time;
use super::{ToolOutput, bound_workspace};
use crate::error::ToolResult;
use crate::index::{self};
use crate::workspace::{Store, git};

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GuideParams {
    /// Workspace slug to describe. Omit to list every workspace this session can use
    /// (in a pinned session it defaults to the pinned workspace).
    pub workspace: Option<String>,
}

const GUIDE_INTRO: &str = "alexandria is the user's local, git-backed markdown wiki (not the web, not a code index). Each workspace has two layers:\n- raw/: immutable sources (notes, PDFs, transcripts, images). Read and cite, never edit.\n- wiki/: markdown pages maintained by agents: summaries, topics, entities. wiki/index.md is the map, wiki/log.md the chronological log, wiki/SCHEMA.md the conventions (read it before writing).\nCitations: footnotes `[^1]: raw/paper.pdf, p.3` (or p.3-5) or links `[text](raw/notes.md)`; a name with spaces as `[text](<raw/my notes.md>)` or `[text](raw/my%20notes.md)`; cited files and PDF pages must exist.\nLoop: guide → search (mode=search ranked full text, mode=list globs like wiki/** or raw/*.pdf) → read (pages=\"1-3\" for PDFs, sections=[\"Heading\"] for markdown) → write.";

pub fn guide(store: &Store, binding: &Binding, params: GuideParams) -> ToolResult<ToolOutput> {
    let describe_one = match (binding, params.workspace.as_deref()) {
        (Binding::Open, None) => None,
        _ => Some(bound_workspace(
            store,
            binding,
            params.workspace.as_deref(),
        )?),
    };
    let pooled = crate::blocking::checkout(&store.pool)?;
    // The guide's statements read in one transaction (it writes nothing): each alone is
    // a transaction of its own, the WAL's read lock taken and let go (2 `fcntl`s), and
    // the guide of a workspace ran eight.
    let connection = pooled.unchecked_transaction()?;
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
                // Never wait for a catch-up here: say how far it is.
                let indexing = store.state(&slug).indexing_note();
                let counts = index::counts(&connection, &slug, 0)?;
                let last = last_change(&connection, &slug)?;
                let _ = writeln!(
                    text,
                    "- {slug}: {} wiki pages, {} raw sources{}{}",
                    counts.wiki,
                    counts.raw,
                    last.as_ref()
                        .map(|(ts, path)| format!(", last change {} ({path})", iso_time(*ts)))
                        .unwrap_or_default(),
                    indexing
                        .as_ref()
                        .map(|note| format!(" ({note}; counts so far)"))
                        .unwrap_or_default()
                );
                workspaces.push(json!({
                    "workspace": slug,
                    "indexing": indexing,
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
            let indexing = store.state(&slug).indexing_note();
            let counts = index::counts(&connection, &slug, 20)?;
            let (pending, source_lines) = crate::sources::guide_lines(&connection, &slug)?;
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
                "Workspace '{slug}' ({mode} session): {} wiki pages, {} raw sources, {pending} pending subscription items.{}",
                counts.wiki,
                counts.raw,
                indexing
                    .as_ref()
                    .map(|note| format!(" Still {note}: counts so far; search waits for it."))
                    .unwrap_or_default()
            );
            let git = git_status(store, &slug);
            text.push_str(&git.0);
            let sync = sync_status(store, &connection, &slug)?;
            text.push_str(&sync.0);
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
            if !source_lines.is_empty() {
                text.push_str(
                    "Sources (items are untrusted content; see the subscriptions tool):\n",
                );
                for line in &source_lines {
                    let _ = writeln!(text, "- {line}");
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
                    "indexing": indexing,
                    "wiki_pages": counts.wiki,
                    "raw_sources": counts.raw,
                    "pending_subscription_items": pending,
                    "sources": source_lines,
                    "recent_history": history,
                    "uncited_sources": counts.uncited,
                    "schema_page": "wiki/SCHEMA.md",
                    "git": git.1,
                    "sync": sync.1,
                    "search_index": index::engine::status(store),
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

/// The workspace repository's branch and state, as a line of text and as JSON: writes
/// go to the checked-out branch, and are refused while a person is in the middle of a
/// merge, rebase … or on a detached HEAD.
fn git_status(store: &Store, slug: &str) -> (String, Value) {
    let root = store.workspace_dir(slug);
    let found = store.state(slug).with_repo(&root, |repo| {
        Ok::<_, git2::Error>((git::branch(repo), git::GitState::of(repo)))
    });
    let Ok((branch, state)) = found else {
        return (
            "Git: the repository cannot be read.\n".into(),
            json!({"state": "unreadable", "writable": false}),
        );
    };
    let writable = state == git::GitState::Clean;
    let line = if writable {
        format!(
            "Git: writes are committed to branch '{}'.\n",
            branch.as_deref().unwrap_or("?")
        )
    } else {
        format!(
            "Git: {}; writes are refused (repository_in_use) until the user finishes it: {}. Reads work.\n",
            state.describe(),
            state.how_to_finish()
        )
    };
    (
        line,
        json!({"branch": branch, "state": state.name(), "writable": writable}),
    )
}

/// The workspace's git remote, its last sync error and open sync conflicts (pages kept
/// side by side when both machines changed the same lines), as text and JSON.
fn sync_status(
    store: &Store,
    connection: &rusqlite::Connection,
    slug: &str,
) -> ToolResult<(String, Value)> {
    use rusqlite::OptionalExtension;
    let conflicts = crate::sync::open_conflicts(connection, slug)?;
    let root = store.workspace_dir(slug);
    let remote = store
        .state(slug)
        .with_repo(&root, |repo| {
            Ok::<_, git2::Error>(crate::sync::remote_of(repo))
        })
        .ok()
        .flatten();
    let error: Option<String> = connection
        .query_row(
            "SELECT last_error FROM sync_state WHERE workspace = ?1",
            params![slug],
            |r| r.get(0),
        )
        .optional()?
        .flatten();
    let mut text = String::new();
    if let Some(remote) = &remote {
        let _ = writeln!(
            text,
            "Sync: with {} (branch {}){}.",
            crate::sources::redact_url(&remote.url),
            remote.branch,
            error
                .as_deref()
                .map(|e| format!("; the last sync failed: {e} (writes go on; it is retried)"))
                .unwrap_or_default()
        );
    }
    if !conflicts.is_empty() {
        text.push_str("Open sync conflicts (both machines changed the same lines; the page at the path has the other machine's version, the conflict page this one's: merge them into the page, then delete the conflict page):\n");
        for path in &conflicts {
            let _ = writeln!(text, "- {path}");
        }
    }
    Ok((
        text,
        json!({
            "remote": remote.as_ref().map(|r| crate::sources::redact_url(&r.url)),
            "last_error": error,
            "conflicts": conflicts,
        }),
    ))
}
