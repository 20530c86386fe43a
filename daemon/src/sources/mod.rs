//! Source adapters (SPEC §4 `sources`/`subscriptions`, issue 10): sources of a
//! workspace, the items they find, capture into `raw/sources/<name>/`, and the
//! scheduler that syncs due sources in the background.
//!
//! A source has a kind (`folder`, `feed`, `url`, `git`), targets, an interval and
//! `auto`. A sync asks the adapter what is there now (network and disk, never under
//! the workspace lock), records what is new as pending items (dedup per source on a
//! key and a revision), and with `auto` captures them: one commit per sync run through
//! `commit::capture`. Items move `pending → captured | dismissed`, or `failed` (kept
//! with the error, retried). Sync state (ETag, Last-Modified, cursor, checks, errors,
//! backoff) is kept per source, like a feed reader's.
//!
//! May import: `commit` (captures), `index`, `workspace`, `db`, `config`, `error`.
//! Tools and control requests call it; it never calls a tool.

pub mod article;
pub mod feed;
pub mod folder;
pub mod git;
pub mod http;
pub mod ledger;
pub mod redact;
pub mod scheduler;
pub mod secret;
pub mod url;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use alexandria_proto::{ErrorCode, SourceSpec};
use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::commit::capture::{self, CaptureFile};
use crate::db::now_ms;
use crate::error::{ToolError, ToolResult};
use crate::workspace::Store;

pub use redact::{redact_text, redact_url};

/// Longest wait between two checks of a failing source.
pub const MAX_BACKOFF: Duration = Duration::from_secs(24 * 60 * 60);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Folder,
    Feed,
    Url,
    Git,
}

impl Kind {
    pub fn parse(text: &str) -> Option<Kind> {
        match text {
            "folder" => Some(Kind::Folder),
            "feed" => Some(Kind::Feed),
            "url" => Some(Kind::Url),
            "git" => Some(Kind::Git),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Folder => "folder",
            Kind::Feed => "feed",
            Kind::Url => "url",
            Kind::Git => "git",
        }
    }

    /// Feeds and pages can flood; folders and repositories hold what the user chose.
    pub fn default_auto(self) -> bool {
        matches!(self, Kind::Folder | Kind::Git)
    }

    /// Folders also sync on file notifications, so their interval is a safety net.
    pub fn default_every(self) -> Duration {
        match self {
            Kind::Feed | Kind::Url => Duration::from_secs(6 * 3600),
            Kind::Folder | Kind::Git => Duration::from_secs(3600),
        }
    }
}

/// What `source add` configured, kept as JSON in `sources.config`. Never a credential.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SourceConfig {
    pub targets: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
}

/// A source and its sync state.
#[derive(Debug, Clone)]
pub struct Source {
    pub id: i64,
    pub workspace: String,
    pub name: String,
    pub kind: Kind,
    pub config: SourceConfig,
    pub auto: bool,
    pub every_secs: i64,
    pub etag: Option<String>,
    pub last_modified: Option<String>,
    pub cursor: Option<String>,
    pub last_check: Option<i64>,
    pub next_check: Option<i64>,
    pub errors: i64,
    pub last_error: Option<String>,
    pub last_status: Option<i64>,
}

const SOURCE_COLUMNS: &str = "id, workspace, name, kind, config, auto, every_secs, etag, last_modified, cursor, last_check, next_check, errors, last_error, last_status";

fn source_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Source> {
    let kind: String = row.get(3)?;
    let config: String = row.get(4)?;
    Ok(Source {
        id: row.get(0)?,
        workspace: row.get(1)?,
        name: row.get(2)?,
        kind: Kind::parse(&kind).unwrap_or(Kind::Folder),
        config: serde_json::from_str(&config).unwrap_or_default(),
        auto: row.get::<_, i64>(5)? != 0,
        every_secs: row.get(6)?,
        etag: row.get(7)?,
        last_modified: row.get(8)?,
        cursor: row.get(9)?,
        last_check: row.get(10)?,
        next_check: row.get(11)?,
        errors: row.get(12)?,
        last_error: row.get(13)?,
        last_status: row.get(14)?,
    })
}

/// Something an adapter found: one revision of one item.
#[derive(Debug, Clone)]
pub struct Found {
    /// Stable per source: `path:<rel>`, `id:<guid>`, `link:<url>`, `url:<normalized>`.
    pub dedup_key: String,
    /// Changes when the item's content changes (content hash, blob id).
    pub revision: String,
    pub title: String,
    pub url: Option<String>,
    pub published: Option<i64>,
    pub excerpt: String,
    /// What capture needs (adapter-specific JSON).
    pub payload: Value,
}

/// The adapter's answer to "what is there now?".
#[derive(Debug, Default)]
pub struct Fetch {
    pub found: Vec<Found>,
    /// `None`: keep the stored value.
    pub etag: Option<String>,
    pub last_modified: Option<String>,
    pub cursor: Option<String>,
    /// A 301/308 moved the (first) target here for good.
    pub moved_to: Option<String>,
    pub status: Option<u16>,
    /// Check again this soon (a folder file still being written).
    pub recheck_in: Option<Duration>,
}

/// A failed sync: recorded on the source, which backs off.
#[derive(Debug, Clone)]
pub struct SyncError {
    pub message: String,
    pub status: Option<u16>,
    pub retry_after: Option<Duration>,
}

impl SyncError {
    pub fn new(message: impl Into<String>) -> SyncError {
        SyncError {
            message: redact_text(&message.into()),
            status: None,
            retry_after: None,
        }
    }
}

impl std::fmt::Display for SyncError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Context an adapter runs with.
pub struct SyncContext<'a> {
    pub store: &'a Store,
    pub source: &'a Source,
    pub secret: Option<secret::Secret>,
}

// ---------------------------------------------------------------------------------
// sources

fn invalid(message: impl Into<String>, hint: impl Into<String>) -> ToolError {
    ToolError::invalid_argument(message, hint)
}

fn source_not_found(workspace: &str, name: &str) -> ToolError {
    ToolError::new(
        ErrorCode::NotFound,
        format!("workspace '{workspace}' has no source named '{name}'"),
        format!("list them with `alexandria source list {workspace}`"),
    )
}

pub fn find(connection: &Connection, workspace: &str, name: &str) -> ToolResult<Source> {
    connection
        .query_row(
            &format!("SELECT {SOURCE_COLUMNS} FROM sources WHERE workspace = ?1 AND name = ?2"),
            params![workspace, name],
            source_from_row,
        )
        .optional()?
        .ok_or_else(|| source_not_found(workspace, name))
}

pub fn by_id(connection: &Connection, id: i64) -> ToolResult<Option<Source>> {
    Ok(connection
        .query_row(
            &format!("SELECT {SOURCE_COLUMNS} FROM sources WHERE id = ?1"),
            params![id],
            source_from_row,
        )
        .optional()?)
}

pub fn all(connection: &Connection, workspace: Option<&str>) -> ToolResult<Vec<Source>> {
    let mut statement = connection.prepare_cached(&format!(
        "SELECT {SOURCE_COLUMNS} FROM sources WHERE ?1 IS NULL OR workspace = ?1 ORDER BY workspace, name"
    ))?;
    Ok(statement
        .query_map(params![workspace], source_from_row)?
        .collect::<Result<_, _>>()?)
}

/// A name from the target: a folder's or repository's base name, a URL's host.
fn default_name(kind: Kind, target: &str) -> String {
    let base = if target.contains("://") {
        let rest = target.split_once("://").map_or(target, |(_, r)| r);
        let host = rest.split(['/', '?', '#']).next().unwrap_or(rest);
        let host = host.rsplit('@').next().unwrap_or(host);
        let host = host.split(':').next().unwrap_or(host);
        if kind == Kind::Git {
            rest.trim_end_matches('/')
                .rsplit('/')
                .next()
                .unwrap_or(host)
                .trim_end_matches(".git")
                .to_string()
        } else {
            host.trim_start_matches("www.").to_string()
        }
    } else {
        std::path::Path::new(target)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let mut name: String = base
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    while name.contains("--") {
        name = name.replace("--", "-");
    }
    let name = name.trim_matches('-').to_string();
    if name.is_empty() {
        kind.as_str().to_string()
    } else {
        name.chars().take(48).collect()
    }
}

fn check_url(url: &str) -> ToolResult<()> {
    let lower = url.to_ascii_lowercase();
    if !(lower.starts_with("http://") || lower.starts_with("https://")) {
        return Err(invalid(
            format!("{} is not an http(s) URL", redact_url(url)),
            "give a URL starting with https://",
        ));
    }
    let authority = url
        .split_once("://")
        .map_or("", |(_, r)| r)
        .split(['/', '?', '#'])
        .next()
        .unwrap_or("");
    if authority.contains('@') {
        return Err(invalid(
            "the URL carries a user name or password",
            "add the URL without them, then store the credential with `alexandria source secret <workspace> <name>` (read from stdin)",
        ));
    }
    if authority.is_empty() {
        return Err(invalid(
            format!("{} has no host", redact_url(url)),
            "give a full URL",
        ));
    }
    Ok(())
}

/// Add a source (`alexandria source add`).
pub fn add(store: &Store, spec: SourceSpec) -> ToolResult<Value> {
    store.require_workspace(&spec.workspace)?;
    let kind = Kind::parse(&spec.kind).ok_or_else(|| {
        invalid(
            format!("unknown source kind '{}'", spec.kind),
            "use folder, feed, url or git",
        )
    })?;
    let mut targets: Vec<String> = spec
        .targets
        .iter()
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
        .collect();
    if targets.is_empty() {
        return Err(invalid(
            "no target given",
            "name a folder, URL or repository",
        ));
    }
    if kind != Kind::Url && targets.len() > 1 {
        return Err(invalid(
            format!("a {} source has one target", kind.as_str()),
            "add one source per target (only url sources take several pages)",
        ));
    }
    let home =
        std::fs::canonicalize(store.home.root()).unwrap_or_else(|_| store.home.root().into());
    match kind {
        Kind::Folder => {
            let dir = std::fs::canonicalize(&targets[0]).map_err(|e| {
                invalid(
                    format!("cannot use folder {}: {e}", targets[0]),
                    "give an existing directory",
                )
            })?;
            if !dir.is_dir() {
                return Err(invalid(
                    format!("{} is not a directory", dir.display()),
                    "give a directory",
                ));
            }
            if dir.starts_with(&home) || home.starts_with(&dir) {
                return Err(invalid(
                    format!("{} overlaps the alexandria home", dir.display()),
                    "watch a folder outside ALEXANDRIA_HOME",
                ));
            }
            targets[0] = dir.display().to_string();
        }
        Kind::Feed => {
            if targets[0].contains("://") && !targets[0].starts_with("file://") {
                check_url(&targets[0])?;
            } else {
                let path = targets[0].trim_start_matches("file://");
                let file = std::fs::canonicalize(path).map_err(|e| {
                    invalid(
                        format!("cannot use feed file {path}: {e}"),
                        "give a feed URL (https://…) or an existing file",
                    )
                })?;
                targets[0] = file.display().to_string();
            }
        }
        Kind::Url => {
            for target in &targets {
                check_url(target)?;
            }
        }
        Kind::Git => {
            if targets[0].contains("://") || targets[0].contains('@') {
                if targets[0].starts_with("http") {
                    check_url(&targets[0])?;
                }
            } else {
                let dir = std::fs::canonicalize(&targets[0]).map_err(|e| {
                    invalid(
                        format!("cannot use repository {}: {e}", targets[0]),
                        "give a local repository path or a clone URL",
                    )
                })?;
                git2::Repository::open(&dir).map_err(|e| {
                    invalid(
                        format!("{} is not a git repository: {}", dir.display(), e.message()),
                        "give the path of a git repository",
                    )
                })?;
                targets[0] = dir.display().to_string();
            }
        }
    }
    if let Some(glob) = &spec.include {
        globset::Glob::new(glob).map_err(|e| {
            invalid(
                format!("--include {glob}: {e}"),
                "use a glob like **/*.md or *.pdf",
            )
        })?;
    }
    let name = match spec.name.as_deref() {
        Some(name) => name.to_string(),
        None => default_name(kind, &targets[0]),
    };
    alexandria_proto::paths::validate_slug(&name).map_err(|e| {
        invalid(
            format!("source name '{name}': {}", e.message),
            "names look like `arxiv-cs` (lowercase letters, digits, dashes); pass --name",
        )
    })?;
    let every = spec
        .every_secs
        .map_or(kind.default_every(), Duration::from_secs);
    if every < Duration::from_secs(60) && matches!(kind, Kind::Feed | Kind::Url) {
        return Err(invalid(
            "--every must be at least 1m for feeds and pages",
            "web sources are checked at most once a minute",
        ));
    }
    if every.is_zero() {
        return Err(invalid("--every must be positive", "for example 30m or 6h"));
    }
    let auto = spec.auto.unwrap_or(kind.default_auto());
    let config = SourceConfig {
        targets,
        include: spec.include.clone(),
        branch: spec.branch.clone(),
    };
    let connection = store.pool.get()?;
    let now = now_ms();
    let inserted = connection.execute(
        "INSERT INTO sources(workspace, name, kind, config, auto, every_secs, created_at, next_check)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7)",
        params![
            spec.workspace,
            name,
            kind.as_str(),
            serde_json::to_string(&config).map_err(|e| ToolError::internal("config", e))?,
            auto as i64,
            every.as_secs() as i64,
            now
        ],
    );
    match inserted {
        Ok(_) => {}
        Err(rusqlite::Error::SqliteFailure(e, _))
            if e.code == rusqlite::ErrorCode::ConstraintViolation =>
        {
            return Err(ToolError::new(
                ErrorCode::InvalidArgument,
                format!(
                    "workspace '{}' already has a source named '{name}'",
                    spec.workspace
                ),
                "pick another --name, or remove the old source first",
            ));
        }
        Err(e) => return Err(e.into()),
    }
    ledger::save(store, &spec.workspace);
    let source = find(&connection, &spec.workspace, &name)?;
    let summary = describe(&connection, store, &source)?;
    scheduler::wake();
    Ok(summary)
}

/// Remove a source and its items; what it captured stays in `raw/`.
pub fn remove(store: &Store, workspace: &str, name: &str) -> ToolResult<Value> {
    store.require_workspace(workspace)?;
    let connection = store.pool.get()?;
    let source = find(&connection, workspace, name)?;
    let lock = source_lock(source.id);
    let _guard = lock.lock().unwrap_or_else(|p| p.into_inner());
    connection.execute("DELETE FROM sources WHERE id = ?1", params![source.id])?;
    secret::remove(store, source.id);
    drop(connection);
    ledger::save(store, workspace);
    scheduler::wake();
    Ok(json!({"workspace": workspace, "name": name, "removed": true}))
}

/// Store a source's credential in `secrets/` (0600).
pub fn set_secret(store: &Store, workspace: &str, name: &str, value: &str) -> ToolResult<Value> {
    store.require_workspace(workspace)?;
    let connection = store.pool.get()?;
    let source = find(&connection, workspace, name)?;
    if matches!(source.kind, Kind::Folder) {
        return Err(invalid(
            "folder sources need no credential",
            "secrets are for private feeds, pages and repositories",
        ));
    }
    secret::store(store, source.id, value)?;
    // Try again soon with the credential.
    connection.execute(
        "UPDATE sources SET next_check = ?2, errors = 0 WHERE id = ?1",
        params![source.id, now_ms()],
    )?;
    scheduler::wake();
    Ok(json!({"workspace": workspace, "name": name, "auth": "set"}))
}

/// One source as `source list --json` and the `sources` tool show it.
pub fn describe(connection: &Connection, store: &Store, source: &Source) -> ToolResult<Value> {
    let counts = item_counts(connection, source.id)?;
    Ok(json!({
        "workspace": source.workspace,
        "name": source.name,
        "kind": source.kind.as_str(),
        "target": source.config.targets.iter().map(|t| redact_url(t)).collect::<Vec<_>>().join(" "),
        "include": source.config.include,
        "branch": source.config.branch,
        "auto": source.auto,
        "every": human_duration(source.every_secs),
        "every_secs": source.every_secs,
        "last_check": source.last_check.map(time_text),
        "next_check": source.next_check.map(time_text),
        "last_error": source.last_error,
        "last_status": source.last_status,
        "errors": source.errors,
        "pending": counts.get("pending").copied().unwrap_or(0),
        "captured": counts.get("captured").copied().unwrap_or(0),
        "dismissed": counts.get("dismissed").copied().unwrap_or(0),
        "failed": counts.get("failed").copied().unwrap_or(0),
        "auth": if secret::exists(store, source.id) { "set" } else { "none" },
    }))
}

fn item_counts(connection: &Connection, source_id: i64) -> ToolResult<HashMap<String, i64>> {
    let mut statement = connection.prepare_cached(
        "SELECT state, count(*) FROM source_items WHERE source_id = ?1 GROUP BY state",
    )?;
    Ok(statement
        .query_map(params![source_id], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?)
}

pub fn human_duration(secs: i64) -> String {
    match secs {
        s if s % 86_400 == 0 && s > 0 => format!("{}d", s / 86_400),
        s if s % 3600 == 0 && s > 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 && s > 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// One source's state in a line, for the CLI's list and the `sources` tool:
/// "(kind[, auto]) target · every … · N pending · M captured · auth … · last check … · next …"
/// and the last error, if any, after " · last error: ". `value` is [`describe`]'s answer.
pub fn summary_line(source: &Source, value: &Value) -> String {
    format!(
        "({}{}) {} · every {} · {} pending · {} captured · auth {} · last check {} · next {}{}",
        source.kind.as_str(),
        if source.auto { ", auto" } else { "" },
        value["target"].as_str().unwrap_or(""),
        value["every"].as_str().unwrap_or(""),
        value["pending"],
        value["captured"],
        value["auth"].as_str().unwrap_or("none"),
        value["last_check"].as_str().unwrap_or("never"),
        value["next_check"].as_str().unwrap_or("now"),
        source
            .last_error
            .as_deref()
            .map(|e| format!(" · last error: {e}"))
            .unwrap_or_default(),
    )
}

/// Sources of one workspace, or of all: (text, JSON list).
pub fn list(store: &Store, workspace: Option<&str>) -> ToolResult<(String, Value)> {
    if let Some(slug) = workspace {
        store.require_workspace(slug)?;
    }
    let connection = store.pool.get()?;
    let mut text = String::new();
    let mut out = Vec::new();
    for source in all(&connection, workspace)? {
        let value = describe(&connection, store, &source)?;
        let _ = writeln!(
            text,
            "{}/{} {}",
            source.workspace,
            source.name,
            summary_line(&source, &value)
        );
        out.push(value);
    }
    if out.is_empty() {
        text = "no sources; add one with `alexandria source add <workspace> folder|feed|url|git <target>`"
            .into();
    }
    Ok((text.trim_end().to_string(), Value::Array(out)))
}

/// Lines for `guide`: one per source with pending items or errors.
pub fn guide_lines(connection: &Connection, workspace: &str) -> ToolResult<(i64, Vec<String>)> {
    let mut lines = Vec::new();
    let mut pending_total = 0;
    for source in all(connection, Some(workspace))? {
        let counts = item_counts(connection, source.id)?;
        let pending = counts.get("pending").copied().unwrap_or(0);
        let failed = counts.get("failed").copied().unwrap_or(0);
        pending_total += pending;
        if pending == 0 && failed == 0 && source.last_error.is_none() {
            continue;
        }
        let mut line = format!("{} `{}`:", source.kind.as_str(), source.name);
        if pending > 0 {
            let _ = write!(
                line,
                " {pending} pending (the user captures them with `alexandria subscription ingest {workspace} --source {} --all`)",
                source.name
            );
        }
        if failed > 0 {
            let _ = write!(line, " {failed} failed item(s);");
        }
        if let Some(error) = &source.last_error {
            let _ = write!(
                line,
                " failing ({error}), next try {}",
                source.next_check.map(time_text).unwrap_or_default()
            );
        }
        lines.push(line);
    }
    Ok((pending_total, lines))
}

// ---------------------------------------------------------------------------------
// items

#[derive(Debug, Clone)]
pub struct Item {
    pub id: i64,
    pub source: String,
    pub source_id: i64,
    pub dedup_key: String,
    pub revision: String,
    pub title: String,
    pub url: Option<String>,
    pub published: Option<i64>,
    pub excerpt: String,
    pub payload: Value,
    pub state: String,
    pub raw_path: Option<String>,
    pub error: Option<String>,
    pub found_at: i64,
}

const ITEM_COLUMNS: &str = "i.id, s.name, i.source_id, i.dedup_key, i.revision, i.title, i.url, i.published, i.excerpt, i.payload, i.state, i.raw_path, i.error, i.found_at";

fn item_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Item> {
    let payload: String = row.get(9)?;
    Ok(Item {
        id: row.get(0)?,
        source: row.get(1)?,
        source_id: row.get(2)?,
        dedup_key: row.get(3)?,
        revision: row.get(4)?,
        title: row.get(5)?,
        url: row.get(6)?,
        published: row.get(7)?,
        excerpt: row.get::<_, Option<String>>(8)?.unwrap_or_default(),
        payload: serde_json::from_str(&payload).unwrap_or(Value::Null),
        state: row.get(10)?,
        raw_path: row.get(11)?,
        error: row.get(12)?,
        found_at: row.get(13)?,
    })
}

pub const STATES: [&str; 4] = ["pending", "captured", "dismissed", "failed"];

/// Items of a workspace, newest first.
pub fn items(
    connection: &Connection,
    workspace: &str,
    source: Option<&str>,
    state: Option<&str>,
    limit: usize,
    offset: usize,
) -> ToolResult<Vec<Item>> {
    if let Some(state) = state
        && !STATES.contains(&state)
    {
        return Err(invalid(
            format!("unknown item state '{state}'"),
            "use pending, captured, dismissed or failed",
        ));
    }
    if let Some(name) = source {
        find(connection, workspace, name)?;
    }
    let mut statement = connection.prepare_cached(&format!(
        "SELECT {ITEM_COLUMNS} FROM source_items i JOIN sources s ON s.id = i.source_id
         WHERE s.workspace = ?1 AND (?2 IS NULL OR s.name = ?2) AND (?3 IS NULL OR i.state = ?3)
         ORDER BY coalesce(i.published, i.found_at) DESC, i.id DESC LIMIT ?4 OFFSET ?5"
    ))?;
    Ok(statement
        .query_map(
            params![workspace, source, state, limit as i64, offset as i64],
            item_from_row,
        )?
        .collect::<Result<_, _>>()?)
}

/// The commands a user runs to capture or dismiss an item.
pub fn item_commands(workspace: &str, id: i64) -> (String, String) {
    (
        format!("alexandria subscription ingest {workspace} {id}"),
        format!("alexandria subscription dismiss {workspace} {id}"),
    )
}

pub fn item_json(workspace: &str, item: &Item) -> Value {
    let (ingest, dismiss) = item_commands(workspace, item.id);
    json!({
        "id": item.id,
        "source": item.source,
        "state": item.state,
        "title": item.title,
        "url": item.url.as_deref().map(redact_url),
        "published": item.published.map(time_text),
        "found": time_text(item.found_at),
        "excerpt": item.excerpt,
        "raw_path": item.raw_path,
        "error": item.error,
        "ingest_command": ingest,
        "dismiss_command": dismiss,
    })
}

/// Record what a sync found: new keys and new revisions of captured items become
/// pending; a pending item gets the newer revision in place; dismissed keys never
/// come back. Returns the ids of new pending rows.
fn record_found(connection: &mut Connection, source_id: i64, found: &[Found]) -> ToolResult<usize> {
    let transaction = crate::db::write_transaction(connection)?;
    let now = now_ms();
    let mut added = 0;
    {
        let mut latest = transaction.prepare_cached(
            "SELECT id, revision, state FROM source_items WHERE source_id = ?1 AND dedup_key = ?2 ORDER BY id DESC",
        )?;
        let mut insert = transaction.prepare_cached(
            "INSERT OR IGNORE INTO source_items(source_id, dedup_key, revision, title, url, published, excerpt, payload, state, found_at, changed_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 'pending', ?9, ?9)",
        )?;
        let mut update = transaction.prepare_cached(
            "UPDATE source_items SET revision = ?2, title = ?3, url = ?4, published = ?5, excerpt = ?6, payload = ?7, changed_at = ?8, state = 'pending', error = NULL WHERE id = ?1",
        )?;
        for item in found {
            let rows: Vec<(i64, String, String)> = latest
                .query_map(params![source_id, item.dedup_key], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })?
                .collect::<Result<_, _>>()?;
            if rows
                .iter()
                .any(|(_, revision, state)| state == "dismissed" || *revision == item.revision)
            {
                continue;
            }
            let payload = item.payload.to_string();
            match rows.first() {
                Some((id, _, state)) if state == "pending" || state == "failed" => {
                    update.execute(params![
                        id,
                        item.revision,
                        item.title,
                        item.url,
                        item.published,
                        item.excerpt,
                        payload,
                        now
                    ])?;
                }
                _ => {
                    added += insert.execute(params![
                        source_id,
                        item.dedup_key,
                        item.revision,
                        item.title,
                        item.url,
                        item.published,
                        item.excerpt,
                        payload,
                        now
                    ])?;
                }
            }
        }
    }
    transaction.commit()?;
    Ok(added)
}

// ---------------------------------------------------------------------------------
// sync

/// One lock per source: the scheduler skips a source being synced, a manual sync waits.
pub fn source_lock(id: i64) -> Arc<Mutex<()>> {
    static LOCKS: OnceLock<Mutex<HashMap<i64, Arc<Mutex<()>>>>> = OnceLock::new();
    let mut locks = LOCKS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    Arc::clone(locks.entry(id).or_default())
}

/// What one sync did.
#[derive(Debug, Default, Clone, Serialize)]
pub struct SyncReport {
    pub workspace: String,
    pub name: String,
    pub found: usize,
    pub new: usize,
    pub captured: Vec<String>,
    pub failed_items: usize,
    pub not_modified: bool,
    pub error: Option<String>,
    pub next_check: Option<String>,
}

/// Sync one source now: fetch, record, capture when `auto`, update its sync state.
/// The caller holds the source's lock.
pub fn sync_locked(store: &Store, source: &Source) -> SyncReport {
    sync_locked_with(store, source, &|_, _, _| {})
}

/// Reports progress while it captures: done, total, and the item just handled.
pub type Progress<'a> = &'a dyn Fn(u64, u64, &str);

/// `sync_locked`, reporting each captured item (a sync that captures many pages takes
/// seconds: `alexandria source sync` shows it).
pub fn sync_locked_with(store: &Store, source: &Source, progress: Progress<'_>) -> SyncReport {
    let mut report = SyncReport {
        workspace: source.workspace.clone(),
        name: source.name.clone(),
        ..Default::default()
    };
    let context = SyncContext {
        store,
        source,
        secret: secret::load(store, source.id),
    };
    let started = now_ms();
    let outcome = match source.kind {
        Kind::Folder => folder::fetch(&context),
        Kind::Git => git::fetch(&context),
        Kind::Feed => feed::fetch(&context),
        Kind::Url => url::fetch(&context),
    };
    let outcome = outcome.and_then(|fetch| {
        let mut connection = store
            .pool
            .get()
            .map_err(|e| SyncError::new(e.to_string()))?;
        let new = record_found(&mut connection, source.id, &fetch.found)
            .map_err(|e| SyncError::new(e.message))?;
        report.found = fetch.found.len();
        report.new = new;
        report.not_modified = fetch.status == Some(304);
        Ok(fetch)
    });
    let connection = match store.pool.get() {
        Ok(connection) => connection,
        Err(error) => {
            report.error = Some(format!("database: {error}"));
            return report;
        }
    };
    let now = now_ms();
    match outcome {
        Ok(fetch) => {
            let every = source.every_secs.max(1) * 1000;
            let mut next = started + every;
            if let Some(soon) = fetch.recheck_in {
                next = next.min(now + soon.as_millis() as i64);
            }
            let mut config = source.config.clone();
            if let Some(moved) = &fetch.moved_to {
                tracing::info!(source = %source.name, to = %redact_url(moved), "source moved for good; URL updated");
                if let Some(first) = config.targets.first_mut() {
                    *first = moved.clone();
                }
            }
            let result = connection.execute(
                "UPDATE sources SET etag = coalesce(?2, etag), last_modified = coalesce(?3, last_modified), cursor = coalesce(?4, cursor),
                 last_check = ?5, next_check = ?6, last_ok = ?5, errors = 0, last_error = NULL, last_status = ?7, config = ?8 WHERE id = ?1",
                params![
                    source.id,
                    fetch.etag,
                    fetch.last_modified,
                    fetch.cursor,
                    now,
                    next,
                    fetch.status.map(i64::from),
                    serde_json::to_string(&config).unwrap_or_default()
                ],
            );
            if let Err(error) = result {
                report.error = Some(format!("database: {error}"));
            }
            report.next_check = Some(time_text(next));
        }
        Err(error) => {
            let errors = source.errors + 1;
            let next = now + backoff(errors, error.retry_after).as_millis() as i64;
            tracing::warn!(workspace = %source.workspace, source = %source.name, errors, error = %error.message, "source sync failed");
            let _ = connection.execute(
                "UPDATE sources SET last_check = ?2, next_check = ?3, errors = ?4, last_error = ?5, last_status = ?6 WHERE id = ?1",
                params![source.id, now, next, errors, error.message, error.status.map(i64::from)],
            );
            report.error = Some(error.message);
            report.next_check = Some(time_text(next));
            return report;
        }
    }
    drop(connection);
    if source.auto {
        match capture_items_with(
            store,
            &source.workspace,
            Some(source.id),
            &[],
            true,
            progress,
        ) {
            Ok(outcome) => {
                report.captured = outcome.captured.iter().map(|c| c.1.clone()).collect();
                report.failed_items = outcome.failed.len();
            }
            Err(error) => report.error = Some(error.message),
        }
    }
    report
}

/// Exponential backoff with jitter: 1 min, 2, 4 … up to 24 h; `Retry-After` wins when
/// it asks for longer. Never parks a source for good.
pub fn backoff(errors: i64, retry_after: Option<Duration>) -> Duration {
    let exponent = (errors.max(1) - 1).min(20) as u32;
    let base = Duration::from_secs(60).saturating_mul(2u32.saturating_pow(exponent));
    let base = base.min(MAX_BACKOFF);
    // ±20 % jitter so that many failing sources do not retry in lockstep.
    let random = uuid::Uuid::new_v4().as_u128() as u64 % 1000;
    let factor = 0.8 + (random as f64) / 2500.0;
    let jittered = base.mul_f64(factor).min(MAX_BACKOFF);
    match retry_after {
        Some(wait) => jittered.max(wait.min(MAX_BACKOFF)),
        None => jittered,
    }
}

/// Sync one source by name now (waits while a background sync of it runs).
pub fn sync_now(store: &Store, workspace: &str, name: &str) -> ToolResult<SyncReport> {
    sync_now_with(store, workspace, name, &|_, _, _| {})
}

/// `sync_now`, reporting each captured item.
pub fn sync_now_with(
    store: &Store,
    workspace: &str,
    name: &str,
    progress: Progress<'_>,
) -> ToolResult<SyncReport> {
    let source = {
        let connection = store.pool.get()?;
        find(&connection, workspace, name)?
    };
    let lock = source_lock(source.id);
    let _guard = lock.lock().unwrap_or_else(|p| p.into_inner());
    // Re-read: a sync that just finished may have moved its state on.
    let connection = store.pool.get()?;
    let Some(source) = by_id(&connection, source.id)? else {
        return Err(source_not_found(workspace, name));
    };
    drop(connection);
    Ok(sync_locked_with(store, &source, progress))
}

// ---------------------------------------------------------------------------------
// capture, dismiss

#[derive(Debug, Default)]
pub struct CaptureOutcome {
    /// (item id, raw path)
    pub captured: Vec<(i64, String)>,
    /// (item id, error)
    pub failed: Vec<(i64, String)>,
}

/// Capture items: the given ids, or every pending item of `source_id` (with
/// `retry_failed`, failed ones too). One commit for the lot.
pub fn capture_items(
    store: &Store,
    workspace: &str,
    source_id: Option<i64>,
    ids: &[i64],
    retry_failed: bool,
) -> ToolResult<CaptureOutcome> {
    capture_items_with(
        store,
        workspace,
        source_id,
        ids,
        retry_failed,
        &|_, _, _| {},
    )
}

/// `capture_items`, reporting each item as it is fetched or read.
pub fn capture_items_with(
    store: &Store,
    workspace: &str,
    source_id: Option<i64>,
    ids: &[i64],
    retry_failed: bool,
    progress: Progress<'_>,
) -> ToolResult<CaptureOutcome> {
    let connection = store.pool.get()?;
    let mut chosen: Vec<Item> = Vec::new();
    if let Some(source_id) = source_id {
        let mut statement = connection.prepare_cached(&format!(
            "SELECT {ITEM_COLUMNS} FROM source_items i JOIN sources s ON s.id = i.source_id
             WHERE i.source_id = ?1 AND (i.state = 'pending' OR (?2 AND i.state = 'failed')) ORDER BY i.id"
        ))?;
        chosen = statement
            .query_map(params![source_id, retry_failed], item_from_row)?
            .collect::<Result<_, _>>()?;
    }
    for id in ids {
        let item = connection
            .query_row(
                &format!(
                    "SELECT {ITEM_COLUMNS} FROM source_items i JOIN sources s ON s.id = i.source_id WHERE i.id = ?1 AND s.workspace = ?2"
                ),
                params![id, workspace],
                item_from_row,
            )
            .optional()?
            .ok_or_else(|| {
                ToolError::new(
                    ErrorCode::NotFound,
                    format!("workspace '{workspace}' has no item {id}"),
                    format!("list items with `alexandria subscription list {workspace}`"),
                )
            })?;
        match item.state.as_str() {
            "pending" | "failed" => chosen.push(item),
            "captured" => {}
            _ => {
                return Err(invalid(
                    format!("item {id} was dismissed"),
                    "dismissed items stay dismissed",
                ));
            }
        }
    }
    let mut sources: HashMap<i64, Source> = HashMap::new();
    for item in &chosen {
        if !sources.contains_key(&item.source_id)
            && let Some(source) = by_id(&connection, item.source_id)?
        {
            sources.insert(source.id, source);
        }
    }
    drop(connection);
    let mut outcome = CaptureOutcome::default();
    let mut files = Vec::new();
    let mut names = Vec::new();
    // Materialize each item (disk, network) before taking any lock.
    let total = chosen.len() as u64;
    for (done, item) in chosen.iter().enumerate() {
        progress(done as u64, total, &item.title);
        let Some(source) = sources.get(&item.source_id) else {
            continue;
        };
        let context = SyncContext {
            store,
            source,
            secret: secret::load(store, source.id),
        };
        let result = match source.kind {
            Kind::Folder => folder::materialize(&context, item),
            Kind::Git => git::materialize(&context, item),
            Kind::Feed => feed::materialize(&context, item),
            Kind::Url => url::materialize(&context, item),
        };
        match result {
            Ok(Some((relative, bytes))) => {
                files.push(CaptureFile {
                    item_id: item.id,
                    path: format!("raw/sources/{}/{}", source.name, relative),
                    bytes,
                });
                if !names.contains(&source.name) {
                    names.push(source.name.clone());
                }
            }
            Ok(None) => {
                // Gone or changed since it was found: the next sync finds it again.
                let connection = store.pool.get()?;
                connection.execute(
                    "DELETE FROM source_items WHERE id = ?1 AND state IN ('pending', 'failed')",
                    params![item.id],
                )?;
            }
            Err(error) => {
                let message = redact_text(&error.message);
                let connection = store.pool.get()?;
                connection.execute(
                    "UPDATE source_items SET state = 'failed', error = ?2, changed_at = ?3 WHERE id = ?1",
                    params![item.id, message, now_ms()],
                )?;
                outcome.failed.push((item.id, message));
            }
        }
    }
    progress(total, total, "committing");
    if files.is_empty() {
        return Ok(outcome);
    }
    let summary = format!(
        "sources: capture {} item(s) from {}",
        files.len(),
        names.join(", ")
    );
    let captured = capture::capture(store, workspace, &summary, files)?;
    outcome.captured = captured.into_iter().map(|c| (c.item_id, c.path)).collect();
    Ok(outcome)
}

/// Dismiss items for good (their keys stay, so they never come back).
pub fn dismiss(store: &Store, workspace: &str, ids: &[i64]) -> ToolResult<Vec<i64>> {
    let mut connection = store.pool.get()?;
    let transaction = crate::db::write_transaction(&mut connection)?;
    let mut done = Vec::new();
    for id in ids {
        let state: Option<String> = transaction
            .query_row(
                "SELECT i.state FROM source_items i JOIN sources s ON s.id = i.source_id WHERE i.id = ?1 AND s.workspace = ?2",
                params![id, workspace],
                |r| r.get(0),
            )
            .optional()?;
        match state.as_deref() {
            None => {
                return Err(ToolError::new(
                    ErrorCode::NotFound,
                    format!("workspace '{workspace}' has no item {id}"),
                    format!("list items with `alexandria subscription list {workspace}`"),
                ));
            }
            Some("captured") => {
                return Err(invalid(
                    format!("item {id} is already captured"),
                    "captured files stay in raw/ (immutable)",
                ));
            }
            Some(_) => {
                transaction.execute(
                    "UPDATE source_items SET state = 'dismissed', changed_at = ?2 WHERE id = ?1",
                    params![id, now_ms()],
                )?;
                done.push(*id);
            }
        }
    }
    transaction.commit()?;
    drop(connection);
    ledger::save(store, workspace);
    Ok(done)
}

// ---------------------------------------------------------------------------------
// helpers shared by adapters

/// Milliseconds since the epoch as RFC 3339 UTC (`2026-11-30T15:00:00Z`).
pub fn time_text(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_default()
}

/// A file name from a title: lowercase words joined by dashes, at most 60 characters.
pub fn slugify(text: &str) -> String {
    let mut slug = String::new();
    for c in text.chars().flat_map(char::to_lowercase) {
        if c.is_alphanumeric() {
            slug.push(c);
        } else if !slug.ends_with('-') && !slug.is_empty() {
            slug.push('-');
        }
        if slug.chars().count() >= 60 {
            break;
        }
    }
    let slug = slug.trim_matches('-').to_string();
    if slug.is_empty() { "item".into() } else { slug }
}

/// A short plain excerpt (at most `max` characters).
pub fn excerpt(text: &str, max: usize) -> String {
    let flat: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() <= max {
        return flat;
    }
    let mut cut: String = flat.chars().take(max).collect();
    cut.push('…');
    cut
}

/// YAML front matter (JSON strings are valid YAML scalars).
pub fn front_matter(fields: &[(&str, Option<String>)]) -> String {
    let mut text = String::from("---\n");
    for (key, value) in fields {
        if let Some(value) = value {
            let _ = writeln!(text, "{key}: {}", Value::String(value.clone()));
        }
    }
    text.push_str("---\n\n");
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_targets() {
        assert_eq!(
            default_name(Kind::Feed, "https://www.example.org/feed.xml"),
            "example-org"
        );
        assert_eq!(
            default_name(Kind::Folder, "/home/me/Papers 2026"),
            "papers-2026"
        );
        assert_eq!(
            default_name(Kind::Git, "https://github.com/a/b-c.git"),
            "b-c"
        );
        assert_eq!(
            default_name(Kind::Url, "https://u:p@host.tld:8080/x"),
            "host-tld"
        );
    }

    #[test]
    fn backoff_grows_and_caps() {
        let first = backoff(1, None);
        assert!(first >= Duration::from_secs(48) && first <= Duration::from_secs(72));
        let tenth = backoff(10, None);
        assert!(tenth > first * 100);
        assert!(backoff(40, None) <= MAX_BACKOFF);
        assert!(backoff(1, Some(Duration::from_secs(3600))) >= Duration::from_secs(3600));
        assert!(backoff(1, Some(Duration::from_secs(10 * 86_400))) <= MAX_BACKOFF);
    }

    #[test]
    fn slugs() {
        assert_eq!(slugify("Hello, World! Ünïcode"), "hello-world-ünïcode");
        assert_eq!(slugify("???"), "item");
    }
}
