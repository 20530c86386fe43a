//! The `folder` adapter: a local directory, recursive, optionally filtered by an
//! `--include` glob. One item is a new or changed file once it has stopped changing
//! (its mtime is at least `STABLE` old); dedup on relative path + content hash. The
//! cursor remembers (size, mtime, hash) per file so an unchanged file is not re-read.
//! The scheduler also syncs folders on file notifications.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, SystemTime};

use serde_json::json;

use super::{Fetch, Found, Item, SyncContext, SyncError, excerpt};
use crate::workspace::revision;

/// A file counts as written once it has not changed for this long.
pub const STABLE: Duration = Duration::from_secs(1);

/// Names that are never items: partial downloads, editor swap and backup files.
fn ignored(name: &str) -> bool {
    name.starts_with('.')
        || name.ends_with('~')
        || [".part", ".crdownload", ".tmp", ".swp", ".download"]
            .iter()
            .any(|s| name.ends_with(s))
}

pub(super) fn matcher(include: Option<&str>) -> Result<Option<globset::GlobMatcher>, SyncError> {
    include
        .map(|glob| {
            globset::Glob::new(glob)
                .map(|g| g.compile_matcher())
                .map_err(|e| SyncError::new(format!("--include {glob}: {e}")))
        })
        .transpose()
}

/// Whether `relative` passes the include glob (matched on the path and the file name).
pub(super) fn included(matcher: Option<&globset::GlobMatcher>, relative: &str) -> bool {
    matcher.is_none_or(|m| {
        m.is_match(relative) || m.is_match(relative.rsplit('/').next().unwrap_or(relative))
    })
}

type Cursor = BTreeMap<String, (u64, i64, String)>;

pub fn fetch(context: &SyncContext<'_>) -> Result<Fetch, SyncError> {
    let source = context.source;
    let root = Path::new(
        source
            .config
            .targets
            .first()
            .ok_or_else(|| SyncError::new("the source has no folder"))?,
    );
    if !root.is_dir() {
        return Err(SyncError::new(format!(
            "the folder {} does not exist (any more)",
            root.display()
        )));
    }
    let matcher = matcher(source.config.include.as_deref())?;
    let old: Cursor = source
        .cursor
        .as_deref()
        .and_then(|c| serde_json::from_str(c).ok())
        .unwrap_or_default();
    let mut cursor = Cursor::new();
    let mut outcome = Fetch::default();
    let now = SystemTime::now();
    let walker = walkdir::WalkDir::new(root)
        .follow_links(false)
        .into_iter()
        .filter_entry(|e| e.depth() == 0 || !ignored(&e.file_name().to_string_lossy()));
    for entry in walker {
        let entry = match entry {
            Ok(entry) => entry,
            Err(error) => {
                tracing::debug!(%error, "skipping an unreadable entry");
                continue;
            }
        };
        if !entry.file_type().is_file() {
            continue;
        }
        let Ok(relative) = entry.path().strip_prefix(root) else {
            continue;
        };
        let Some(relative) = relative.to_str().map(str::to_string) else {
            continue;
        };
        if !included(matcher.as_ref(), &relative) {
            continue;
        }
        let Ok(metadata) = entry.metadata() else {
            continue;
        };
        let modified = metadata.modified().unwrap_or(now);
        if now.duration_since(modified).unwrap_or_default() < STABLE {
            // Still being written: look again once it has settled.
            outcome.recheck_in = Some(STABLE + Duration::from_millis(100));
            if let Some(previous) = old.get(&relative) {
                cursor.insert(relative, previous.clone());
            }
            continue;
        }
        let (size, mtime) = crate::index::stat_key(&metadata);
        let size = size as u64;
        let rev = match old.get(&relative) {
            Some((s, m, rev)) if *s == size && *m == mtime => rev.clone(),
            _ => match std::fs::read(entry.path()) {
                Ok(bytes) => revision(&bytes),
                Err(error) => {
                    tracing::debug!(%error, path = %relative, "cannot read; skipped");
                    continue;
                }
            },
        };
        let preview = if size < 1_000_000 && is_text(&relative) {
            std::fs::read(entry.path())
                .map(|b| excerpt(&String::from_utf8_lossy(&b), 200))
                .unwrap_or_default()
        } else {
            format!("{size} bytes")
        };
        outcome.found.push(Found {
            dedup_key: format!("path:{relative}"),
            revision: rev.clone(),
            title: relative.clone(),
            url: None,
            published: None,
            excerpt: preview,
            payload: json!({"path": relative}),
        });
        cursor.insert(relative, (size, mtime, rev));
    }
    outcome.cursor = Some(serde_json::to_string(&cursor).unwrap_or_default());
    Ok(outcome)
}

fn is_text(relative: &str) -> bool {
    let lower = relative.to_ascii_lowercase();
    [
        ".md",
        ".markdown",
        ".txt",
        ".org",
        ".rst",
        ".csv",
        ".json",
        ".html",
    ]
    .iter()
    .any(|e| lower.ends_with(e))
}

/// The file's bytes, if it still has the revision that was found.
pub fn materialize(
    context: &SyncContext<'_>,
    item: &Item,
) -> Result<Option<(String, Vec<u8>)>, SyncError> {
    let root = Path::new(
        context
            .source
            .config
            .targets
            .first()
            .map_or("", String::as_str),
    );
    let Some(relative) = item.payload["path"].as_str() else {
        return Err(SyncError::new("the item has no path"));
    };
    match std::fs::read(root.join(relative)) {
        Ok(bytes) if revision(&bytes) == item.revision => Ok(Some((relative.to_string(), bytes))),
        Ok(_) => Ok(None),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(SyncError::new(format!("cannot read {relative}: {error}"))),
    }
}
