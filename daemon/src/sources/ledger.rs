//! What must survive losing `state.db` (a cache, issue 18): the sources a user set up
//! and the items they dismissed. Kept per workspace in
//! `<workspace>/.git/alexandria-sources.json`: inside `.git`, so it moves with a
//! rename, archive or restore, is never committed and never synced to another machine
//! (sources belong to one machine). Rewritten atomically (temp file, fsync, rename)
//! after every add, remove and dismiss.
//!
//! When a workspace has no sources in `state.db` but a ledger, they are put back with
//! their ids (so credentials in `secrets/`, keyed by id, still apply), due at once;
//! what they captured is recognised again from `raw/sources/<name>/` (feed and page
//! captures carry `item_id` and `revision` in their front matter; folder and repository
//! captures are the upstream file, whose revision is its git blob id), so nothing is
//! captured twice; dismissed keys come back from the ledger so they stay dismissed.

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use rusqlite::{OptionalExtension, params};
use serde::{Deserialize, Serialize};

use super::Kind;
use crate::db::now_ms;
use crate::error::{ToolError, ToolResult};
use crate::workspace::{Store, revision};

const FILE: &str = "alexandria-sources.json";

#[derive(Debug, Default, Serialize, Deserialize)]
struct Ledger {
    sources: Vec<LedgerSource>,
}

#[derive(Debug, Serialize, Deserialize)]
struct LedgerSource {
    id: i64,
    name: String,
    kind: String,
    config: serde_json::Value,
    auto: bool,
    every_secs: i64,
    created_at: i64,
    /// (dedup key, revision) of every dismissed item.
    #[serde(default)]
    dismissed: Vec<(String, String)>,
}

fn path(store: &Store, workspace: &str) -> PathBuf {
    store.workspace_dir(workspace).join(".git").join(FILE)
}

/// Write the ledger of `workspace` from `state.db`. Errors are logged, not returned:
/// the change itself is done and `state.db` holds it.
pub fn save(store: &Store, workspace: &str) {
    if let Err(error) = try_save(store, workspace) {
        tracing::warn!(workspace, %error, "cannot write the sources ledger");
    }
}

fn try_save(store: &Store, workspace: &str) -> ToolResult<()> {
    let connection = store.pool.get()?;
    let mut statement = connection.prepare_cached(
        "SELECT id, name, kind, config, auto, every_secs, created_at FROM sources WHERE workspace = ?1 ORDER BY id",
    )?;
    let mut sources: Vec<LedgerSource> = statement
        .query_map(params![workspace], |r| {
            let config: String = r.get(3)?;
            Ok(LedgerSource {
                id: r.get(0)?,
                name: r.get(1)?,
                kind: r.get(2)?,
                config: serde_json::from_str(&config).unwrap_or_default(),
                auto: r.get::<_, i64>(4)? != 0,
                every_secs: r.get(5)?,
                created_at: r.get(6)?,
                dismissed: Vec::new(),
            })
        })?
        .collect::<Result<_, _>>()?;
    let mut dismissed = connection.prepare_cached(
        "SELECT dedup_key, revision FROM source_items WHERE source_id = ?1 AND state = 'dismissed' ORDER BY id",
    )?;
    for source in &mut sources {
        source.dismissed = dismissed
            .query_map(params![source.id], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<Result<_, _>>()?;
    }
    let text = serde_json::to_vec_pretty(&Ledger { sources })
        .map_err(|e| ToolError::internal("encoding the sources ledger", e))?;
    let target = path(store, workspace);
    let temp = target.with_extension("json.tmp");
    let io = |e| ToolError::internal("writing the sources ledger", e);
    let mut file = fs::File::create(&temp).map_err(io)?;
    file.write_all(&text).map_err(io)?;
    file.sync_all().map_err(io)?;
    fs::rename(&temp, &target).map_err(io)?;
    Ok(())
}

/// At start, before any request is served: put back every workspace's sources that a
/// rebuilt `state.db` lost.
pub fn restore_all(store: &Store) {
    for slug in store.list_workspaces() {
        if let Err(error) = restore(store, &slug) {
            tracing::error!(workspace = slug, %error, "cannot put the sources back from the ledger");
        }
    }
}

/// Put back the sources of `workspace` from its ledger when `state.db` has none (it
/// was lost or rebuilt). Returns how many sources came back.
pub fn restore(store: &Store, workspace: &str) -> ToolResult<usize> {
    let file = path(store, workspace);
    let Ok(bytes) = fs::read(&file) else {
        return Ok(0);
    };
    let ledger: Ledger = match serde_json::from_slice(&bytes) {
        Ok(ledger) => ledger,
        Err(error) => {
            tracing::warn!(workspace, %error, "the sources ledger is unreadable; left as is");
            return Ok(0);
        }
    };
    if ledger.sources.is_empty() {
        return Ok(0);
    }
    let mut connection = store.pool.get()?;
    let transaction =
        connection.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let known: i64 = transaction.query_row(
        "SELECT count(*) FROM sources WHERE workspace = ?1",
        params![workspace],
        |r| r.get(0),
    )?;
    if known > 0 {
        return Ok(0);
    }
    let now = now_ms();
    let root = store.workspace_dir(workspace);
    let mut restored = 0;
    for source in &ledger.sources {
        let Some(kind) = Kind::parse(&source.kind) else {
            continue;
        };
        // Keep the id (credentials are filed by it) unless another row took it.
        let taken: Option<i64> = transaction
            .query_row(
                "SELECT id FROM sources WHERE id = ?1",
                params![source.id],
                |r| r.get(0),
            )
            .optional()?;
        let config = source.config.to_string();
        if taken.is_none() {
            transaction.execute(
                "INSERT INTO sources(id, workspace, name, kind, config, auto, every_secs, created_at, next_check)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                params![source.id, workspace, source.name, source.kind, config, source.auto as i64, source.every_secs, source.created_at, now],
            )?;
        } else {
            transaction.execute(
                "INSERT INTO sources(workspace, name, kind, config, auto, every_secs, created_at, next_check)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![workspace, source.name, source.kind, config, source.auto as i64, source.every_secs, source.created_at, now],
            )?;
        }
        let id = transaction.last_insert_rowid();
        let mut insert = transaction.prepare_cached(
            "INSERT OR IGNORE INTO source_items(source_id, dedup_key, revision, title, payload, state, raw_path, found_at, changed_at)
             VALUES (?1, ?2, ?3, ?4, '{}', ?5, ?6, ?7, ?7)",
        )?;
        for (key, rev, raw_path) in captured(&root, &source.name, kind) {
            insert.execute(params![id, key, rev, raw_path, "captured", raw_path, now])?;
        }
        for (key, rev) in &source.dismissed {
            insert.execute(params![id, key, rev, key, "dismissed", None::<String>, now])?;
        }
        restored += 1;
    }
    transaction.commit()?;
    tracing::info!(
        workspace,
        restored,
        "sources put back from the ledger after state.db was rebuilt"
    );
    Ok(restored)
}

/// (dedup key, revision, raw path) of what a source captured, read from its folder.
fn captured(root: &Path, name: &str, kind: Kind) -> Vec<(String, String, String)> {
    let base = root.join("raw/sources").join(name);
    let mut out = Vec::new();
    let mut stack = vec![base.clone()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let file = entry.path();
            if file.is_dir() {
                stack.push(file);
                continue;
            }
            let Ok(relative) = file.strip_prefix(&base) else {
                continue;
            };
            let relative = relative.to_string_lossy().to_string();
            let raw_path = format!("raw/sources/{name}/{relative}");
            let Ok(bytes) = fs::read(&file) else {
                continue;
            };
            match kind {
                Kind::Feed | Kind::Url => {
                    if let Some((key, rev)) = front_matter_ids(&bytes) {
                        out.push((key, rev, raw_path));
                    }
                }
                Kind::Folder | Kind::Git => {
                    let key = format!("path:{}", unsuffixed(&base, &relative));
                    out.push((key, revision(&bytes), raw_path));
                }
            }
        }
    }
    out
}

/// A later revision is captured beside the first as `stem-N.ext`: its key is the
/// first's path when that file is there.
fn unsuffixed(base: &Path, relative: &str) -> String {
    let (dir, file) = relative.rsplit_once('/').unwrap_or(("", relative));
    let (stem, ext) = match file.rsplit_once('.') {
        Some((stem, ext)) if !stem.is_empty() => (stem, Some(ext)),
        _ => (file, None),
    };
    if let Some((first, n)) = stem.rsplit_once('-')
        && n.parse::<u32>().is_ok_and(|n| n >= 2)
    {
        let original = match ext {
            Some(ext) => format!("{first}.{ext}"),
            None => first.to_string(),
        };
        let original = if dir.is_empty() {
            original
        } else {
            format!("{dir}/{original}")
        };
        if base.join(&original).is_file() {
            return original;
        }
    }
    relative.to_string()
}

/// `item_id` and `revision` from a capture's YAML front matter.
fn front_matter_ids(bytes: &[u8]) -> Option<(String, String)> {
    let text = std::str::from_utf8(bytes).ok()?;
    let body = text.strip_prefix("---\n")?;
    let end = body.find("\n---")?;
    let mut key = None;
    let mut rev = None;
    for line in body[..end].lines() {
        if let Some((field, value)) = line.split_once(':') {
            let value = value.trim();
            let value = serde_json::from_str::<String>(value).unwrap_or_else(|_| value.to_string());
            match field.trim() {
                "item_id" => key = Some(value),
                "revision" => rev = Some(value),
                _ => {}
            }
        }
    }
    Some((key?, rev?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_from_front_matter_written_by_captures() {
        let text = super::super::front_matter(&[
            ("title", Some("A \"quoted\": title".into())),
            ("item_id", Some("id:urn:e1".into())),
            ("revision", Some("abc123".into())),
        ]) + "# body\n";
        assert_eq!(
            front_matter_ids(text.as_bytes()),
            Some(("id:urn:e1".to_string(), "abc123".to_string()))
        );
        assert_eq!(front_matter_ids(b"# no front matter\n"), None);
    }

    #[test]
    fn later_revisions_map_to_the_first_path() {
        let dir = tempfile::tempdir().expect("dir");
        fs::create_dir_all(dir.path().join("sub")).expect("sub");
        fs::write(dir.path().join("sub/first.md"), "1").expect("write");
        assert_eq!(unsuffixed(dir.path(), "sub/first-2.md"), "sub/first.md");
        assert_eq!(unsuffixed(dir.path(), "sub/first.md"), "sub/first.md");
        // No first file: the name is its own (a file really called `x-2.md`).
        assert_eq!(unsuffixed(dir.path(), "x-2.md"), "x-2.md");
        assert_eq!(unsuffixed(dir.path(), "2024-01-05.md"), "2024-01-05.md");
    }
}
