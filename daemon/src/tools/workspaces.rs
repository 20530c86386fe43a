//! The life cycle of a workspace, for the CLI: rename, archive (never delete: the
//! workspace moves under the home's `trash/` with a timestamp), restore, and info.
//!
//! Each change takes the workspace lock (no write is in flight) and the index lock
//! (the watcher and rescans see the move and the rows change as one step), moves the
//! directory, and updates `state.db` in one transaction.

use std::fs;
use std::path::{Path, PathBuf};

use alexandria_proto::ErrorCode;
use rusqlite::{Connection, params};
use serde_json::{Value, json};

use crate::commit::lock_workspace;
use crate::error::{ToolError, ToolResult};
use crate::index;
use crate::workspace::Store;
use crate::workspace::store::Moved;

/// The workspace every home has; it cannot be renamed or archived.
const DEFAULT_WORKSPACE: &str = "global";

/// Where archived workspaces go.
pub fn trash_dir(store: &Store) -> PathBuf {
    store.home.root().join("trash")
}

fn refuse_default(slug: &str, what: &str) -> ToolResult<()> {
    if slug == DEFAULT_WORKSPACE {
        return Err(ToolError::new(
            ErrorCode::InvalidArgument,
            format!("'{DEFAULT_WORKSPACE}' is the default workspace and cannot be {what}"),
            "create another workspace for this (alexandria workspace create <slug>)",
        ));
    }
    Ok(())
}

fn io(context: &str, error: std::io::Error) -> ToolError {
    ToolError::internal(context, error)
}

/// Tables with a `workspace` column (found in the schema, so new tables are covered).
/// Write git's index that the last writes left unwritten (`commit::settle`), and
/// release its lock, before the workspace's folder moves. The caller holds the index
/// guard.
fn settle_index(state: &crate::workspace::WorkspaceState, dir: &Path) -> ToolResult<()> {
    let settled = state
        .with_repo(dir, |repo| {
            Ok::<bool, git2::Error>(crate::commit::settle::now_locked(repo))
        })
        .unwrap_or(true);
    if settled {
        return Ok(());
    }
    Err(ToolError::new(
        ErrorCode::Internal,
        "cannot write git's index of the workspace before moving it",
        "free some disk space and try again (the daemon's log says why)",
    ))
}

fn workspace_tables(connection: &Connection) -> ToolResult<Vec<String>> {
    let mut statement = connection.prepare(
        "SELECT m.name FROM sqlite_master m, pragma_table_info(m.name) p
         WHERE m.type = 'table' AND p.name = 'workspace' ORDER BY m.name",
    )?;
    let names = statement
        .query_map([], |row| row.get::<_, String>(0))?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(names)
}

/// Rename `from` to `to`: directory, index and history move together.
pub fn rename(store: &Store, from: &str, to: &str) -> ToolResult<Value> {
    refuse_default(from, "renamed")?;
    alexandria_proto::paths::validate_slug(to).map_err(|e| {
        ToolError::invalid_argument(e.to_string(), "slugs are [a-z0-9][a-z0-9-]{0,62}")
    })?;
    store.require_workspace(from)?;
    if store.workspace_dir(to).exists() {
        return Err(ToolError::new(
            ErrorCode::WorkspaceExists,
            format!("a workspace '{to}' already exists"),
            "pick another name, or archive that one first",
        ));
    }
    let state = store.state(from);
    let run_id = format!("rename-{}", crate::commit::new_run_id());
    let _lock = lock_workspace(store, &state, from, &run_id)?;
    let _index = state.index_lock.lock().unwrap_or_else(|p| p.into_inner());
    let old_dir = store.workspace_dir(from);
    let new_dir = store.workspace_dir(to);
    settle_index(&state, &old_dir)?;
    let mut connection = store.pool.get()?;
    let transaction = crate::db::write_transaction(&mut connection)?;
    for table in workspace_tables(&transaction)? {
        transaction.execute(
            &format!("UPDATE \"{table}\" SET workspace = ?1 WHERE workspace = ?2"),
            params![to, from],
        )?;
    }
    transaction.execute(
        "UPDATE workspaces SET slug = ?1 WHERE slug = ?2",
        params![to, from],
    )?;
    fs::rename(&old_dir, &new_dir).map_err(|e| io("moving the workspace directory", e))?;
    if let Err(error) = transaction.commit() {
        // Put the directory back so files and state keep agreeing.
        let _ = fs::rename(&new_dir, &old_dir);
        return Err(error.into());
    }
    // The old name's cached state (git handle, caught-up flag) must not outlive it.
    store.forget_state(from);
    store.note_moved(
        from,
        Moved::Renamed {
            to: to.to_string(),
            at: crate::db::now_ms(),
        },
    );
    Ok(json!({"from": from, "to": to, "path": new_dir.display().to_string()}))
}

/// `YYYYMMDDTHHMMSSZ` for archive names.
fn stamp() -> String {
    let iso = crate::tools::iso_time(crate::db::now_ms());
    iso.chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(15)
        .collect::<String>()
        + "Z"
}

/// Move `slug` under `trash/<slug>-<stamp>`; its index rows go (a restore re-indexes),
/// its history stays.
pub fn archive(store: &Store, slug: &str) -> ToolResult<Value> {
    refuse_default(slug, "archived")?;
    store.require_workspace(slug)?;
    let trash = trash_dir(store);
    fs::create_dir_all(&trash).map_err(|e| io("creating the trash folder", e))?;
    let name = format!("{slug}-{}", stamp());
    let target = trash.join(&name);
    if target.exists() {
        return Err(ToolError::new(
            ErrorCode::WorkspaceBusy,
            format!("{} already exists", target.display()),
            "wait a second and try again",
        ));
    }
    let state = store.state(slug);
    let run_id = format!("archive-{}", crate::commit::new_run_id());
    let _lock = lock_workspace(store, &state, slug, &run_id)?;
    let _index = state.index_lock.lock().unwrap_or_else(|p| p.into_inner());
    settle_index(&state, &store.workspace_dir(slug))?;
    let mut connection = store.pool.get()?;
    let transaction = crate::db::write_transaction(&mut connection)?;
    let paths: Vec<String> = {
        let mut statement = transaction.prepare("SELECT path FROM files WHERE workspace = ?1")?;
        statement
            .query_map(params![slug], |row| row.get(0))?
            .collect::<Result<_, _>>()?
    };
    for path in &paths {
        index::remove_file(&transaction, slug, path)?;
    }
    transaction.execute("DELETE FROM workspaces WHERE slug = ?1", params![slug])?;
    fs::rename(store.workspace_dir(slug), &target)
        .map_err(|e| io("moving the workspace to the trash", e))?;
    if let Err(error) = transaction.commit() {
        let _ = fs::rename(&target, store.workspace_dir(slug));
        return Err(error.into());
    }
    store.forget_state(slug);
    store.note_moved(
        slug,
        Moved::Archived {
            archive: name.clone(),
            at: crate::db::now_ms(),
        },
    );
    Ok(json!({"workspace": slug, "archive": name, "path": target.display().to_string()}))
}

/// Archives in the trash: (name, slug), newest last.
pub fn archives(store: &Store) -> Vec<(String, String)> {
    let mut found: Vec<(String, String)> = fs::read_dir(trash_dir(store))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().join(".git").is_dir())
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_string();
            let (slug, stamp) = name.rsplit_once('-')?;
            (stamp.len() == 16 && stamp.ends_with('Z')).then(|| (name.clone(), slug.to_string()))
        })
        .collect();
    found.sort_by(|a, b| a.0.rsplit('-').next().cmp(&b.0.rsplit('-').next()));
    found
}

/// Bring an archive back: `name` is an archive name, or a slug for its newest archive.
pub fn restore(store: &Store, name: &str) -> ToolResult<Value> {
    let all = archives(store);
    let Some((archive, slug)) = all
        .iter()
        .rev()
        .find(|(archive, slug)| archive == name || slug == name)
        .cloned()
    else {
        let listed: Vec<&str> = all.iter().map(|(a, _)| a.as_str()).collect();
        return Err(ToolError::new(
            ErrorCode::NotFound,
            format!(
                "no archived workspace '{name}' in {}",
                trash_dir(store).display()
            ),
            if listed.is_empty() {
                "nothing is archived".to_string()
            } else {
                format!("archived: {}", listed.join(", "))
            },
        ));
    };
    if store.workspace_dir(&slug).exists() {
        return Err(ToolError::new(
            ErrorCode::WorkspaceExists,
            format!("a workspace '{slug}' exists again"),
            format!("rename it first (alexandria workspace rename {slug} <other>), then restore"),
        ));
    }
    let state = store.state(&slug);
    let _index = state.index_lock.lock().unwrap_or_else(|p| p.into_inner());
    fs::rename(trash_dir(store).join(&archive), store.workspace_dir(&slug))
        .map_err(|e| io("moving the workspace back", e))?;
    let connection = store.pool.get()?;
    connection.execute(
        "INSERT OR IGNORE INTO workspaces(slug, created_at) VALUES (?1, ?2)",
        params![slug, crate::db::now_ms()],
    )?;
    drop(_index);
    store.forget_state(&slug);
    index::catch_up(store, &slug)?;
    Ok(
        json!({"workspace": slug, "archive": archive, "path": store.workspace_dir(&slug).display().to_string()}),
    )
}

fn size_on_disk(dir: &Path) -> u64 {
    walkdir::WalkDir::new(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum()
}

/// Paths, counts, size on disk, last write, git remote and sources of a workspace.
pub fn info(store: &Store, slug: &str) -> ToolResult<Value> {
    store.require_workspace(slug)?;
    index::ensure_caught_up(store, slug)?;
    let dir = store.workspace_dir(slug);
    let connection = store.pool.get()?;
    let counts = index::counts(&connection, slug, 0)?;
    let last_write: Option<i64> = connection.query_row(
        "SELECT max(ts) FROM wiki_log_entries WHERE workspace = ?1",
        params![slug],
        |row| row.get(0),
    )?;
    let sources: Vec<String> = {
        let mut statement =
            connection.prepare("SELECT name FROM sources WHERE workspace = ?1 ORDER BY name")?;
        statement
            .query_map(params![slug], |row| row.get(0))?
            .collect::<Result<_, _>>()?
    };
    let remote = git2::Repository::open(&dir)
        .and_then(|repo| {
            Ok(crate::sources::redact_url(
                repo.find_remote("origin")?.url()?,
            ))
        })
        .ok();
    Ok(json!({
        "workspace": slug,
        "path": dir.display().to_string(),
        "wiki": dir.join("wiki").display().to_string(),
        "raw": dir.join("raw").display().to_string(),
        "wiki_pages": counts.wiki,
        "raw_sources": counts.raw,
        "size_bytes": size_on_disk(&dir),
        "last_write": last_write.map(crate::tools::iso_time),
        "remote": remote,
        "sources": sources,
    }))
}
