//! `state.db`: the SQLite pool (WAL) and the schema migrations.
//!
//! Only the daemon opens this file. Every table is created by `MIGRATIONS`, applied in
//! order inside one transaction each and recorded in `PRAGMA user_version`.

use std::path::Path;
use std::time::Duration;

use r2d2_sqlite::SqliteConnectionManager;
use rusqlite::Connection;

pub type Pool = r2d2::Pool<SqliteConnectionManager>;
pub type PooledConnection = r2d2::PooledConnection<SqliteConnectionManager>;

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("cannot open {path}: {source}")]
    Open { path: String, source: r2d2::Error },
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("database pool: {0}")]
    Pool(#[from] r2d2::Error),
    #[error(
        "state.db has schema version {found}, newer than this daemon knows ({known}); upgrade alexandria"
    )]
    TooNew { found: i64, known: i64 },
}

/// Schema migrations; index i brings `user_version` from i to i+1.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE workspaces (
    slug TEXT PRIMARY KEY,
    created_at INTEGER NOT NULL
);
-- One row per file of raw/ and wiki/ known to the index.
CREATE TABLE files (
    id INTEGER PRIMARY KEY,
    workspace TEXT NOT NULL,
    path TEXT NOT NULL,
    layer TEXT NOT NULL,
    kind TEXT NOT NULL,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    rev TEXT NOT NULL,
    pages INTEGER,
    title TEXT,
    indexed_at INTEGER NOT NULL,
    UNIQUE (workspace, path)
);
-- Full-text chunks; rowid = (files.id << 20) | ordinal, so one file's chunks form a
-- rowid range that can be deleted without scanning.
CREATE VIRTUAL TABLE chunks USING fts5(
    page UNINDEXED,
    heading UNINDEXED,
    body,
    tokenize = 'porter unicode61 remove_diacritics 2'
);
-- Citations found in wiki pages (raw/ targets), for guide's "uncited sources".
CREATE TABLE citations (
    file_id INTEGER NOT NULL REFERENCES files(id) ON DELETE CASCADE,
    target TEXT NOT NULL
);
CREATE INDEX citations_file ON citations(file_id);
CREATE INDEX citations_target ON citations(target);
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY,
    workspace TEXT NOT NULL,
    tool TEXT NOT NULL,
    client TEXT,
    session TEXT,
    state TEXT NOT NULL,
    started_at INTEGER NOT NULL,
    finished_at INTEGER,
    commit_id TEXT
);
CREATE TABLE wiki_log_entries (
    id INTEGER PRIMARY KEY,
    ts INTEGER NOT NULL,
    workspace TEXT NOT NULL,
    run_id TEXT,
    op TEXT NOT NULL,
    path TEXT NOT NULL,
    summary TEXT,
    origin TEXT NOT NULL
);
CREATE INDEX wiki_log_workspace_ts ON wiki_log_entries(workspace, ts);
CREATE TABLE events (
    id INTEGER PRIMARY KEY,
    ts INTEGER NOT NULL,
    workspace TEXT,
    kind TEXT NOT NULL,
    data TEXT
);
CREATE TABLE sources (
    workspace TEXT NOT NULL,
    name TEXT NOT NULL,
    kind TEXT NOT NULL,
    config TEXT NOT NULL,
    state TEXT,
    last_sync INTEGER,
    PRIMARY KEY (workspace, name)
);
CREATE TABLE subscription_items (
    id INTEGER PRIMARY KEY,
    workspace TEXT NOT NULL,
    source TEXT NOT NULL,
    title TEXT NOT NULL,
    location TEXT,
    found_at INTEGER NOT NULL,
    ingested_at INTEGER
);
CREATE INDEX subscription_pending ON subscription_items(workspace, ingested_at);
"#,
    // 2: counting a workspace's files per layer (guide) without scanning every row.
    "CREATE INDEX files_layer ON files(workspace, layer);",
    // 3: history names commits: the one that recorded a change, and for outside edits
    // the one that still holds the text from before.
    "ALTER TABLE wiki_log_entries ADD COLUMN commit_id TEXT;
     ALTER TABLE wiki_log_entries ADD COLUMN previous_commit TEXT;",
    // 4: OAuth for remote access (issue 19): registered clients, grants (one per
    // consent), refresh tokens (SHA-256 hashes only; a used one is kept to detect reuse).
    r#"
CREATE TABLE oauth_clients (
    client_id TEXT PRIMARY KEY,
    secret_hash TEXT,
    auth_method TEXT NOT NULL,
    name TEXT,
    redirect_uris TEXT NOT NULL,
    metadata TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    last_used_at INTEGER
);
CREATE TABLE oauth_grants (
    id TEXT PRIMARY KEY,
    client_id TEXT NOT NULL,
    resource TEXT NOT NULL,
    workspace TEXT,
    scope TEXT NOT NULL,
    redirect_host TEXT,
    created_at INTEGER NOT NULL,
    last_used_at INTEGER,
    revoked_at INTEGER
);
CREATE INDEX oauth_grants_client ON oauth_grants(client_id);
CREATE TABLE oauth_refresh_tokens (
    token_hash TEXT PRIMARY KEY,
    grant_id TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    used_at INTEGER
);
CREATE INDEX oauth_refresh_grant ON oauth_refresh_tokens(grant_id);
"#,
    // 5: source adapters and their items (issue 10); replaces the unused first sketch.
    r#"
DROP TABLE IF EXISTS subscription_items;
DROP TABLE IF EXISTS sources;
CREATE TABLE sources (
    id INTEGER PRIMARY KEY,
    workspace TEXT NOT NULL,
    name TEXT NOT NULL,
    kind TEXT NOT NULL,
    -- JSON: targets, include, branch (never a credential)
    config TEXT NOT NULL,
    auto INTEGER NOT NULL,
    every_secs INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    -- sync state, as a feed reader keeps it
    etag TEXT,
    last_modified TEXT,
    cursor TEXT,
    last_check INTEGER,
    next_check INTEGER,
    last_ok INTEGER,
    errors INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    last_status INTEGER,
    UNIQUE (workspace, name)
);
-- One row per revision of an item a source found: pending -> captured | dismissed,
-- or failed (kept with its error, retried). (source_id, dedup_key) never comes back
-- once dismissed; a new revision of a captured item is a new pending row.
CREATE TABLE source_items (
    id INTEGER PRIMARY KEY,
    source_id INTEGER NOT NULL REFERENCES sources(id) ON DELETE CASCADE,
    dedup_key TEXT NOT NULL,
    revision TEXT NOT NULL,
    title TEXT NOT NULL,
    url TEXT,
    published INTEGER,
    excerpt TEXT,
    -- JSON: what capture needs (a relative path, a blob id, the entry's content)
    payload TEXT NOT NULL,
    state TEXT NOT NULL,
    raw_path TEXT,
    error TEXT,
    found_at INTEGER NOT NULL,
    changed_at INTEGER NOT NULL,
    UNIQUE (source_id, dedup_key, revision)
);
CREATE INDEX source_items_state ON source_items(source_id, state);
"#,
];

/// Open the pool on `path`, creating the file, and apply pending migrations.
/// `busy_timeout` is how long a statement waits for a lock held by another
/// connection (or another process) before failing with `SQLITE_BUSY`.
pub fn open(path: &Path, busy_timeout: Duration) -> Result<Pool, DbError> {
    let manager = SqliteConnectionManager::file(path).with_init(move |connection| {
        connection.execute_batch(
            "PRAGMA journal_mode = WAL;
             PRAGMA synchronous = NORMAL;
             PRAGMA foreign_keys = ON;
             PRAGMA temp_store = MEMORY;",
        )?;
        connection.busy_timeout(busy_timeout)
    });
    let pool = r2d2::Pool::builder()
        .max_size(8)
        .connection_timeout(Duration::from_secs(15))
        .build(manager)
        .map_err(|source| DbError::Open {
            path: path.display().to_string(),
            source,
        })?;
    let mut connection = pool.get()?;
    migrate(&mut connection)?;
    Ok(pool)
}

/// Apply every migration above the database's `user_version`.
pub fn migrate(connection: &mut Connection) -> Result<(), DbError> {
    let known = MIGRATIONS.len() as i64;
    let found: i64 = connection.query_row("PRAGMA user_version", [], |row| row.get(0))?;
    if found > known {
        return Err(DbError::TooNew { found, known });
    }
    for (index, migration) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        let transaction = connection.transaction()?;
        transaction.execute_batch(migration)?;
        transaction.pragma_update(None, "user_version", index as i64 + 1)?;
        transaction.commit()?;
    }
    Ok(())
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_apply_once_and_fts5_works() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pool = open(&dir.path().join("state.db"), Duration::from_secs(1)).expect("open");
        let mut connection = pool.get().expect("conn");
        migrate(&mut connection).expect("second migrate is a no-op");
        let version: i64 = connection
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .expect("version");
        assert_eq!(version, MIGRATIONS.len() as i64);
        connection
            .execute(
                "INSERT INTO chunks(rowid, page, heading, body) VALUES (1, NULL, 'a', 'hello world')",
                [],
            )
            .expect("insert");
        let hits: i64 = connection
            .query_row(
                "SELECT count(*) FROM chunks WHERE chunks MATCH 'hello'",
                [],
                |r| r.get(0),
            )
            .expect("match");
        assert_eq!(hits, 1);
        let mode: String = connection
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .expect("mode");
        assert_eq!(mode, "wal");
    }
}
