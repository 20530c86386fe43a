//! `state.db`: the SQLite pool (WAL) and the schema migrations.
//!
//! Only the daemon opens this file. Every table is created by `MIGRATIONS`, applied in
//! order inside one transaction each and recorded in `PRAGMA user_version`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use r2d2_sqlite::SqliteConnectionManager;
use rusqlite::Connection;

pub type Pool = r2d2::Pool<SqliteConnectionManager>;
pub type PooledConnection = r2d2::PooledConnection<SqliteConnectionManager>;

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("cannot use {path}: {source}")]
    Unusable {
        path: String,
        source: rusqlite::Error,
    },
    #[error("cannot move the damaged {path} aside: {source}")]
    MoveAside {
        path: String,
        source: std::io::Error,
    },
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
    // 6: history rebuilt from git (issue 18). Runs are keyed per workspace (a
    // workspace copied by hand carries the same run ids), and a history entry names
    // its commit, so that importing a commit twice records it once.
    r#"
CREATE TABLE runs_by_workspace (
    workspace TEXT NOT NULL,
    run_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    client TEXT,
    session TEXT,
    state TEXT NOT NULL,
    started_at INTEGER NOT NULL,
    finished_at INTEGER,
    commit_id TEXT,
    PRIMARY KEY (workspace, run_id)
);
INSERT INTO runs_by_workspace(workspace, run_id, tool, client, session, state, started_at, finished_at, commit_id)
    SELECT workspace, run_id, tool, client, session, state, started_at, finished_at, commit_id FROM runs;
DROP TABLE runs;
ALTER TABLE runs_by_workspace RENAME TO runs;
CREATE UNIQUE INDEX wiki_log_commit ON wiki_log_entries(workspace, commit_id, path)
    WHERE commit_id IS NOT NULL;
"#,
    // 7: sync through a git remote (issue 12). A cache: the remote itself lives in the
    // repository's git config (`remote.origin.url`, `alexandria.syncbranch`).
    r#"
CREATE TABLE sync_state (
    workspace TEXT PRIMARY KEY,
    remote_url TEXT,
    branch TEXT,
    last_attempt_at INTEGER,
    last_sync_at INTEGER,
    last_error TEXT,
    failures INTEGER NOT NULL DEFAULT 0,
    synced_head TEXT
);
"#,
    // 8: the ranked search index (issue 15, `index/engine.rs`). Every change of a file's
    // row is queued, by trigger, in the transaction that makes it; the indexer applies
    // the queue in order and deletes what it committed. The generation names this
    // database, so an index built from another one is rebuilt.
    r#"
CREATE TABLE search_outbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    file_id INTEGER NOT NULL
);
CREATE TRIGGER files_search_insert AFTER INSERT ON files BEGIN
    INSERT INTO search_outbox(file_id) VALUES (new.id);
END;
CREATE TRIGGER files_search_update AFTER UPDATE ON files BEGIN
    INSERT INTO search_outbox(file_id) VALUES (new.id);
END;
CREATE TRIGGER files_search_delete AFTER DELETE ON files BEGIN
    INSERT INTO search_outbox(file_id) VALUES (old.id);
END;
CREATE TABLE search_state (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    generation TEXT NOT NULL
);
INSERT INTO search_state(id, generation) VALUES (1, lower(hex(randomblob(16))));
"#,
    // 9: how many files each workspace has per layer, and how many of them are sync
    // conflict pages (`<page>.conflict-<host>-<time>.md`), kept by trigger in the
    // transaction that changes `files`, so that `guide` counts no rows per call
    // (issue 15). The column is `ws`, not `workspace`: a workspace rename updates every
    // table with a `workspace` column, and the `files` trigger moves the counts.
    r#"
CREATE TABLE file_counts (
    ws TEXT NOT NULL,
    layer TEXT NOT NULL,
    files INTEGER NOT NULL,
    conflicts INTEGER NOT NULL,
    PRIMARY KEY (ws, layer)
) WITHOUT ROWID;
INSERT INTO file_counts(ws, layer, files, conflicts)
    SELECT workspace, layer, count(*), sum(path LIKE '%.conflict-%')
    FROM files GROUP BY workspace, layer;
CREATE TRIGGER files_count_insert AFTER INSERT ON files BEGIN
    INSERT INTO file_counts(ws, layer, files, conflicts)
        VALUES (new.workspace, new.layer, 1, new.path LIKE '%.conflict-%')
        ON CONFLICT(ws, layer) DO UPDATE SET files = files + 1,
            conflicts = conflicts + (new.path LIKE '%.conflict-%');
END;
CREATE TRIGGER files_count_delete AFTER DELETE ON files BEGIN
    UPDATE file_counts SET files = files - 1,
        conflicts = conflicts - (old.path LIKE '%.conflict-%')
        WHERE ws = old.workspace AND layer = old.layer;
END;
CREATE TRIGGER files_count_move AFTER UPDATE OF workspace, layer, path ON files
    WHEN old.workspace IS NOT new.workspace OR old.layer IS NOT new.layer
        OR old.path IS NOT new.path BEGIN
    UPDATE file_counts SET files = files - 1,
        conflicts = conflicts - (old.path LIKE '%.conflict-%')
        WHERE ws = old.workspace AND layer = old.layer;
    INSERT INTO file_counts(ws, layer, files, conflicts)
        VALUES (new.workspace, new.layer, 1, new.path LIKE '%.conflict-%')
        ON CONFLICT(ws, layer) DO UPDATE SET files = files + 1,
            conflicts = conflicts + (new.path LIKE '%.conflict-%');
END;
"#,
    // 10: the chunks' text in a plain table (issue 15). The search index (tantivy,
    // `index/engine.rs`) is the only full-text index; FTS5 indexed every chunk a second
    // time, in every write's transaction and every cold index. Rowids are kept.
    r#"
CREATE TABLE chunks_text (
    id INTEGER PRIMARY KEY,
    page INTEGER,
    heading TEXT,
    body TEXT NOT NULL
);
INSERT INTO chunks_text(id, page, heading, body) SELECT rowid, page, heading, body FROM chunks;
DROP TABLE chunks;
ALTER TABLE chunks_text RENAME TO chunks;
"#,
];

/// What opening `state.db` found and did, for the log and `daemon status`.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct OpenReport {
    pub path: String,
    /// A new, empty state.db was made at this start (there was none, or the old one
    /// was moved aside), so the catalogue, index and history are rebuilt from the
    /// workspaces.
    pub rebuilt: bool,
    /// Why it was rebuilt: missing, or what was wrong with the old file.
    pub reason: Option<String>,
    /// Where the old file went (`state.db.corrupt-<time>`, with its `-wal`/`-shm`).
    pub moved_to: Option<String>,
    /// When (RFC 3339).
    pub at: String,
    /// How long opening and checking took.
    pub check_ms: u64,
    /// `PRAGMA quick_check` was skipped: the previous daemon stopped cleanly and the
    /// file is exactly as it left it (size, mtime, no WAL), see `mark_clean`.
    pub quick_check_skipped: bool,
}

/// `state.db.clean`: written by a daemon that stopped cleanly, read and removed at the
/// next start.
fn clean_stamp(path: &Path) -> std::path::PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".clean");
    path.with_file_name(name)
}

/// What the stamp records: the file's size and mtime, when its WAL is empty.
fn signature(path: &Path) -> Option<String> {
    let mut wal = path.as_os_str().to_os_string();
    wal.push("-wal");
    if std::fs::metadata(std::path::PathBuf::from(wal)).is_ok_and(|m| m.len() > 0) {
        return None;
    }
    let metadata = std::fs::metadata(path).ok()?;
    let mtime = metadata
        .modified()
        .ok()?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_nanos();
    Some(format!("{}:{mtime}", metadata.len()))
}

/// How long a clean stop waits for state.db's WAL to be folded in (`mark_clean`).
const CLEAN_STAMP_WAIT: Duration = Duration::from_secs(5);

/// At a clean stop: fold the WAL into the file and record its size and mtime, so the
/// next start can skip `PRAGMA quick_check` (1.3 s for 10k pages, 78 MiB, on the
/// benchmark machine) when nothing touched the file meanwhile. Any change to the file
/// (a write after this, a crash with a WAL, someone overwriting or truncating it) makes
/// the next start check it in full. Best effort: no stamp, a full check. Called last:
/// the database's write lock is kept until the process exits.
pub fn mark_clean(pool: &Pool, path: &Path) {
    let Ok(connection) = pool.get() else {
        return;
    };
    // Busy while another connection checkpoints (the search indexer's queue trim, just
    // after a cold index, folds in a WAL of hundreds of MB): tried again for a while, as
    // a stop right after a cold index of 100k pages otherwise left no stamp and the next
    // start spent 1.3 s checking state.db.
    let deadline = Instant::now() + CLEAN_STAMP_WAIT;
    let busy = loop {
        let busy: rusqlite::Result<i64> =
            connection.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |row| row.get(0));
        if busy != Ok(1) || Instant::now() >= deadline {
            break busy;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    if busy != Ok(0) {
        tracing::info!(
            ?busy,
            "state.db not stamped clean: its WAL could not be folded in (the next start checks it in full)"
        );
        return;
    }
    // Background threads (the search indexer trimming its queue, the rescanner) may
    // still write: hold the write lock from here until the process exits, so the file
    // stays as the stamp says. A write that came in between shows in the WAL (no
    // stamp: a full check); one that comes after waits for a lock that is never given
    // back and is lost with the process, which is stopping anyway (every request has
    // been answered; the indexer's queue lives in state.db).
    if connection.execute_batch("BEGIN IMMEDIATE").is_err() {
        return;
    }
    let Some(signature) = signature(path) else {
        let _ = connection.execute_batch("ROLLBACK");
        return;
    };
    std::mem::forget(connection);
    let stamp = clean_stamp(path);
    let temp = stamp.with_extension("clean.tmp");
    let written = std::fs::write(&temp, &signature).and_then(|()| std::fs::rename(&temp, &stamp));
    if let Err(error) = written {
        tracing::debug!(%error, "no clean-stop stamp for state.db");
    }
}

/// SQLite's process-wide settings, before its first connection: memory statistics off.
/// With them on (the bundled build's default) every allocation inside SQLite takes a
/// global mutex to count itself, which a cold index's catch-up and every tool call paid
/// for (SQLite's documentation lists `SQLITE_DEFAULT_MEMSTATUS=0` among its speed-ups);
/// nothing here reads the statistics (`sqlite3_memory_used`, a soft heap limit).
pub fn configure() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: `sqlite3_config` takes SQLITE_CONFIG_MEMSTATUS with one int argument
        // and must run before SQLite initializes: `Once` runs it once, and it runs
        // before this module opens any connection. Called later (a connection opened
        // elsewhere first) it returns SQLITE_MISUSE and changes nothing.
        #[allow(unsafe_code)]
        let code = unsafe {
            rusqlite::ffi::sqlite3_config(
                rusqlite::ffi::SQLITE_CONFIG_MEMSTATUS,
                0 as std::ffi::c_int,
            )
        };
        if code != rusqlite::ffi::SQLITE_OK {
            tracing::debug!(
                code,
                "SQLite initialized already: memory statistics left on"
            );
        }
    });
}

/// Open `state.db` for the daemon: check an existing file (SQLite header, `PRAGMA
/// quick_check`, schema version, tables and columns), move a damaged one aside as
/// `state.db.corrupt-<time>` (never deleted) and start a new one. An error here is one
/// that a new file would not fix (the path cannot be opened, is locked, the disk is
/// full); it comes back at once, never after a pool timeout.
pub fn open_checked(path: &Path, busy_timeout: Duration) -> Result<(Pool, OpenReport), DbError> {
    configure();
    let started = Instant::now();
    let mut report = OpenReport {
        path: path.display().to_string(),
        at: iso_time(now_ms()),
        ..OpenReport::default()
    };
    // A stamp counts once: whatever happens during this run, the next start checks in
    // full unless this daemon, too, stops cleanly.
    let stamp = clean_stamp(path);
    let stamped = std::fs::read_to_string(&stamp).ok();
    let _ = std::fs::remove_file(&stamp);
    let trusted = stamped.is_some() && stamped == signature(path);
    report.quick_check_skipped = trusted;
    if path.symlink_metadata().is_err() {
        report.rebuilt = true;
        report.reason = Some("there was no state.db".into());
        report.quick_check_skipped = false;
    } else if let Err(reason) = check(path, busy_timeout, !trusted)? {
        let moved = move_aside(path).map_err(|source| DbError::MoveAside {
            path: path.display().to_string(),
            source,
        })?;
        report.rebuilt = true;
        report.reason = Some(reason);
        report.moved_to = Some(moved.display().to_string());
    }
    let pool = open(path, busy_timeout)?;
    report.check_ms = started.elapsed().as_millis() as u64;
    Ok((pool, report))
}

/// Whether an SQLite error says the file is damaged or not ours (so a new file fixes
/// it), as opposed to a problem of the machine (locked, unreadable, disk full).
fn is_damage(error: &rusqlite::Error) -> bool {
    use rusqlite::ErrorCode::*;
    let code = match error {
        rusqlite::Error::SqliteFailure(failure, _) => Some(failure.code),
        rusqlite::Error::SqlInputError { error, .. } => Some(error.code),
        other => other.sqlite_error_code(),
    };
    !matches!(
        code,
        Some(
            DatabaseBusy
                | DatabaseLocked
                | CannotOpen
                | ReadOnly
                | DiskFull
                | SystemIoFailure
                | PermissionDenied
                | OutOfMemory
                | FileLockingProtocolFailed
        )
    )
}

/// Check an existing state.db: `Ok(Err(reason))` when it is damaged (or of a schema
/// this build does not know) and should be moved aside. Applies pending migrations.
fn check(
    path: &Path,
    busy_timeout: Duration,
    quick_check: bool,
) -> Result<Result<(), String>, DbError> {
    let classify = |what: &str, error: rusqlite::Error| -> Result<Result<(), String>, DbError> {
        if is_damage(&error) {
            Ok(Err(format!("{what}: {error}")))
        } else {
            Err(DbError::Unusable {
                path: path.display().to_string(),
                source: error,
            })
        }
    };
    let flags =
        rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let mut connection = match Connection::open_with_flags(path, flags) {
        Ok(connection) => connection,
        Err(error) => return classify("cannot open it", error),
    };
    if let Err(error) = connection.busy_timeout(busy_timeout) {
        return classify("cannot open it", error);
    }
    // Skipped after a clean stop: still open the header and the schema below.
    let pragma = if quick_check {
        "PRAGMA quick_check"
    } else {
        "SELECT 'ok' WHERE (SELECT count(*) FROM sqlite_master) >= 0"
    };
    let verdict: rusqlite::Result<Vec<String>> = (|| {
        let mut statement = connection.prepare(pragma)?;
        let rows = statement.query_map([], |row| row.get::<_, String>(0))?;
        rows.collect()
    })();
    match verdict {
        Ok(lines) if lines.len() == 1 && lines[0] == "ok" => {}
        Ok(lines) => {
            let mut shown: Vec<String> = lines.into_iter().take(3).collect();
            shown.dedup();
            return Ok(Err(format!(
                "PRAGMA quick_check failed: {}",
                shown.join("; ")
            )));
        }
        Err(error) => return classify("it is not a readable SQLite database", error),
    }
    match migrate(&mut connection) {
        Ok(()) => {}
        Err(DbError::TooNew { found, known }) => {
            return Ok(Err(format!(
                "its schema version {found} is newer than this build knows ({known})"
            )));
        }
        Err(DbError::Sqlite(error)) => return classify("its schema cannot be migrated", error),
        Err(other) => return Err(other),
    }
    match schema_differences(&connection) {
        Ok(differences) if differences.is_empty() => Ok(Ok(())),
        Ok(differences) => Ok(Err(format!(
            "its tables are not this build's: {}",
            differences.join("; ")
        ))),
        Err(DbError::Sqlite(error)) => classify("its schema cannot be read", error),
        Err(other) => Err(other),
    }
}

/// Tables or columns that `connection` lacks or has differently from a database made
/// by `MIGRATIONS`.
fn schema_differences(connection: &Connection) -> Result<Vec<String>, DbError> {
    let mut expected = Connection::open_in_memory()?;
    migrate(&mut expected)?;
    let tables = |connection: &Connection| -> rusqlite::Result<Vec<String>> {
        let mut statement = connection.prepare(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name",
        )?;
        let rows = statement.query_map([], |row| row.get(0))?;
        rows.collect()
    };
    let columns = |connection: &Connection, table: &str| -> rusqlite::Result<Vec<String>> {
        let mut statement =
            connection.prepare("SELECT name, type, \"notnull\", pk FROM pragma_table_info(?1)")?;
        let rows = statement.query_map([table], |row| {
            Ok(format!(
                "{} {} {} {}",
                row.get::<_, String>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, i64>(2)?,
                row.get::<_, i64>(3)?
            ))
        })?;
        rows.collect()
    };
    let mut differences = Vec::new();
    for table in tables(&expected)? {
        let want = columns(&expected, &table)?;
        let have = columns(connection, &table)?;
        if have.is_empty() {
            differences.push(format!("no table {table}"));
        } else if have != want {
            differences.push(format!("table {table} has other columns"));
        }
    }
    Ok(differences)
}

/// Rename `path` (and its `-wal`, `-shm`) to `<path>.corrupt-<time>`; never deletes.
fn move_aside(path: &Path) -> std::io::Result<PathBuf> {
    let stamp = iso_time(now_ms()).replace(':', "-");
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "state.db".into());
    let mut target = path.with_file_name(format!("{name}.corrupt-{stamp}"));
    let mut n = 2;
    while target.symlink_metadata().is_ok() {
        target = path.with_file_name(format!("{name}.corrupt-{stamp}-{n}"));
        n += 1;
    }
    std::fs::rename(path, &target)?;
    for suffix in ["-wal", "-shm"] {
        let companion = PathBuf::from(format!("{}{suffix}", path.display()));
        if companion.symlink_metadata().is_ok() {
            std::fs::rename(&companion, format!("{}{suffix}", target.display()))?;
        }
    }
    Ok(target)
}

/// Open the pool on `path`, creating the file, and apply pending migrations. One
/// connection is opened and migrated first, so that a failure is reported at once
/// (r2d2 would retry until its connection timeout).
pub fn open(path: &Path, busy_timeout: Duration) -> Result<Pool, DbError> {
    configure();
    let init = move |connection: &mut Connection| -> rusqlite::Result<()> {
        connection.execute_batch(
            "PRAGMA journal_mode = WAL;
             PRAGMA synchronous = NORMAL;
             PRAGMA foreign_keys = ON;
             PRAGMA temp_store = MEMORY;
             PRAGMA journal_size_limit = 67108864;",
        )?;
        // journal_size_limit: the WAL is reused, not truncated, once checkpointed. A
        // cold index of 100k pages grows it to 530 MB (the catch-up's readers keep it
        // from starting over), which stayed on disk until the daemon stopped; SQLite
        // now cuts it back to 64 MiB when it next starts over.
        // A write runs about 20 distinct statements (the run's rows, the page's chunks
        // and citations, the search overlay): rusqlite's default 16 made them evict
        // each other and be prepared again.
        connection.set_prepared_statement_cache_capacity(48);
        connection.busy_timeout(busy_timeout)
    };
    let unusable = |source: rusqlite::Error| DbError::Unusable {
        path: path.display().to_string(),
        source,
    };
    let mut first = Connection::open(path).map_err(unusable)?;
    init(&mut first).map_err(unusable)?;
    migrate(&mut first)?;
    drop(first);
    let manager = SqliteConnectionManager::file(path).with_init(init);
    let pool = r2d2::Pool::builder()
        .max_size(8)
        // A connection to a local file does not go bad while idle; checking it on every
        // checkout ran a statement per tool call.
        .test_on_check_out(false)
        .min_idle(Some(0))
        // Each connection keeps up to 2 MiB of pages cached; one idle for 30 s (closed by
        // r2d2's reaper within the next 30) hands its cache back (issue 15, part 4).
        .idle_timeout(Some(Duration::from_secs(30)))
        .connection_timeout(Duration::from_secs(15))
        .build_unchecked(manager);
    Ok(pool)
}

/// A transaction that writes: `BEGIN IMMEDIATE`, so it takes the write lock at once and
/// waits for it (the busy timeout). A deferred one that reads first and then writes
/// fails at once with `SQLITE_BUSY` (no wait) when another connection committed since
/// its first read (WAL's snapshot rule): under the indexer's or the rescanner's writes
/// that failed whole groups of agent writes as `workspace_busy`.
pub fn write_transaction(
    connection: &mut Connection,
) -> rusqlite::Result<rusqlite::Transaction<'_>> {
    connection.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
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

/// Milliseconds since the epoch as an RFC 3339 UTC timestamp.
pub fn iso_time(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil-from-days (Howard Hinnant), proleptic Gregorian.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
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

    /// SQLite's plan of a statement with a bound LIMIT uses the value, so each value
    /// bound to it makes SQLite prepare the statement again (measured: an eighth of a
    /// rare word's search); with the number in the text it is prepared once. The
    /// statements run on every search, guide and indexing batch write theirs.
    #[test]
    fn a_bound_limit_prepares_again_and_the_calls_on_every_request_write_theirs() {
        use rusqlite::StatementStatus;
        let connection = Connection::open_in_memory().expect("open");
        connection
            .execute_batch(
                "CREATE TABLE t(a INTEGER PRIMARY KEY); INSERT INTO t VALUES (1),(2),(3);",
            )
            .expect("create");
        let runs = |sql: &str, limit: Option<i64>| {
            let mut statement = connection.prepare(sql).expect("prepare");
            for _ in 0..5 {
                let values: Vec<i64> = std::iter::once(0).chain(limit).collect();
                let rows: Vec<i64> = statement
                    .query_map(rusqlite::params_from_iter(values), |r| r.get(0))
                    .expect("query")
                    .collect::<Result<_, _>>()
                    .expect("rows");
                assert_eq!(rows, [1, 2]);
            }
            statement.get_status(StatementStatus::RePrepare)
        };
        assert!(runs("SELECT a FROM t WHERE a > ?1 ORDER BY a LIMIT ?2", Some(2)) >= 4);
        assert_eq!(
            runs("SELECT a FROM t WHERE a > ?1 ORDER BY a LIMIT 2", None),
            0
        );
        for (file, text) in [
            ("index/engine.rs", include_str!("index/engine.rs")),
            ("index/mod.rs", include_str!("index/mod.rs")),
            ("index/search.rs", include_str!("index/search.rs")),
            ("tools/guide.rs", include_str!("tools/guide.rs")),
            ("tools/read.rs", include_str!("tools/read.rs")),
            ("tools/history.rs", include_str!("tools/history.rs")),
        ] {
            assert!(!text.contains("LIMIT ?"), "{file} binds a LIMIT");
        }
    }

    /// A transaction that reads, then writes after another connection committed: a
    /// deferred one fails at once (SQLITE_BUSY, the busy timeout not even tried), one
    /// from `write_transaction` holds the write lock from its start and commits.
    #[test]
    fn a_write_transaction_never_fails_on_a_commit_made_after_its_first_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pool = open(&dir.path().join("state.db"), Duration::from_secs(5)).expect("open");
        let mut first = pool.get().expect("conn");
        let second = pool.get().expect("conn");
        let insert = "INSERT INTO events(ts, workspace, kind, data) VALUES (1, 'w', 'k', '{}')";
        let count = "SELECT count(*) FROM events";

        let deferred = first.transaction().expect("begin");
        let _: i64 = deferred.query_row(count, [], |r| r.get(0)).expect("read");
        second.execute(insert, []).expect("other writer");
        let error = deferred.execute(insert, []).expect_err("stale snapshot");
        assert!(
            matches!(&error, rusqlite::Error::SqliteFailure(e, _) if e.code == rusqlite::ErrorCode::DatabaseBusy),
            "{error}"
        );
        drop(deferred);

        let other = std::thread::spawn(move || {
            // Waits (busy timeout) for the write transaction below, then writes.
            std::thread::sleep(Duration::from_millis(50));
            second.execute(insert, []).expect("other writer waits")
        });
        let immediate = write_transaction(&mut first).expect("begin immediate");
        let _: i64 = immediate.query_row(count, [], |r| r.get(0)).expect("read");
        std::thread::sleep(Duration::from_millis(200));
        immediate
            .execute(insert, [])
            .expect("write after the other tried");
        immediate.commit().expect("commit");
        assert_eq!(other.join().expect("thread"), 1);
        let total: i64 = first.query_row(count, [], |r| r.get(0)).expect("count");
        assert_eq!(total, 3);
    }

    #[test]
    fn migrations_apply_once() {
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
        let mode: String = connection
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .expect("mode");
        assert_eq!(mode, "wal");
    }

    /// An in-memory database with every migration before the one containing `marker`
    /// applied (and its version).
    fn migrated_before(marker: &str) -> Connection {
        let connection = Connection::open_in_memory().expect("db");
        let before = MIGRATIONS
            .iter()
            .position(|m| m.contains(marker))
            .expect("the migration");
        for migration in &MIGRATIONS[..before] {
            connection.execute_batch(migration).expect("migration");
        }
        connection
            .pragma_update(None, "user_version", before as i64)
            .expect("version");
        connection
    }

    /// Migration 10 keeps the chunks (rowid, page, heading, text) that FTS5 held, as a
    /// plain table, and drops FTS5's own tables.
    #[test]
    fn chunks_move_out_of_fts5() {
        let mut connection = migrated_before("CREATE TABLE chunks_text");
        let rows = [
            ((7i64 << 20) | 1, Some(3i64), "Guide > Install", "some text"),
            (7i64 << 20, None, "", "other words"),
        ];
        for (rowid, page, heading, body) in rows {
            connection
                .execute(
                    "INSERT INTO chunks(rowid, page, heading, body) VALUES (?1, ?2, ?3, ?4)",
                    rusqlite::params![rowid, page, heading, body],
                )
                .expect("insert");
        }
        migrate(&mut connection).expect("migrate");
        let moved: Vec<(i64, Option<i64>, String, String)> = connection
            .prepare("SELECT rowid, page, heading, body FROM chunks ORDER BY rowid DESC")
            .expect("prepare")
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows");
        let expected: Vec<(i64, Option<i64>, String, String)> = rows
            .iter()
            .map(|(r, p, h, b)| (*r, *p, h.to_string(), b.to_string()))
            .collect();
        assert_eq!(moved, expected);
        let fts5_tables: i64 = connection
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE name LIKE 'chunks_%' OR sql LIKE '%fts5%'",
                [],
                |r| r.get(0),
            )
            .expect("count");
        assert_eq!(fts5_tables, 0);
        assert!(schema_differences(&connection).expect("schema").is_empty());
    }

    fn populated(path: &Path) {
        let pool = open(path, Duration::from_secs(1)).expect("open");
        let connection = pool.get().expect("conn");
        for n in 0..500 {
            connection
                .execute(
                    "INSERT INTO wiki_log_entries(ts, workspace, op, path, origin) VALUES (?1, 'w', 'create', ?2, 'agent')",
                    rusqlite::params![n, format!("wiki/{n}-{}.md", "x".repeat(200))],
                )
                .expect("insert");
        }
        connection
            .execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")
            .expect("checkpoint");
    }

    #[test]
    fn file_counts_are_filled_by_the_migration_and_kept_by_triggers() {
        let mut connection = migrated_before("CREATE TABLE file_counts");
        let insert = |c: &Connection, workspace: &str, path: &str, layer: &str| {
            c.execute(
                "INSERT INTO files(workspace, path, layer, kind, size, mtime_ns, rev, indexed_at)
                 VALUES (?1, ?2, ?3, 'markdown', 1, 1, 'r', 0)
                 ON CONFLICT(workspace, path) DO UPDATE SET layer = excluded.layer",
                rusqlite::params![workspace, path, layer],
            )
            .expect("insert");
        };
        for (workspace, path, layer) in [
            ("a", "wiki/1.md", "wiki"),
            ("a", "wiki/2.md", "wiki"),
            ("a", "raw/1.md", "raw"),
            ("b", "wiki/1.md", "wiki"),
            ("b", "wiki/1.conflict-host-2026.md", "wiki"),
        ] {
            insert(&connection, workspace, path, layer);
        }
        migrate(&mut connection).expect("migrate");
        type Counts = Vec<(String, String, i64, i64)>;
        let counts = |c: &Connection| -> Counts {
            let mut statement = c
                .prepare(
                    "SELECT ws, layer, files, conflicts FROM file_counts WHERE files > 0 ORDER BY 1, 2",
                )
                .expect("prepare");
            let rows = statement
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
                .expect("query");
            rows.collect::<Result<_, _>>().expect("rows")
        };
        let actual = |c: &Connection| -> Counts {
            let mut statement = c
                .prepare(
                    "SELECT workspace, layer, count(*), sum(path LIKE '%.conflict-%')
                     FROM files GROUP BY 1, 2 ORDER BY 1, 2",
                )
                .expect("prepare");
            let rows = statement
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
                .expect("query");
            rows.collect::<Result<_, _>>().expect("rows")
        };
        assert_eq!(
            counts(&connection),
            actual(&connection),
            "after the migration"
        );
        insert(&connection, "b", "wiki/2.md", "wiki");
        insert(&connection, "b", "wiki/2.conflict-host-2026.md", "wiki");
        insert(&connection, "a", "wiki/3.conflict-host-2026.md", "wiki");
        insert(&connection, "a", "raw/1.md", "raw"); // an update: no change
        insert(&connection, "a", "wiki/2.md", "raw"); // moved to another layer
        connection
            .execute(
                "DELETE FROM files WHERE workspace = 'a' AND path = 'wiki/1.md'",
                [],
            )
            .expect("delete");
        connection
            .execute(
                "DELETE FROM files WHERE workspace = 'a' AND path = 'wiki/3.conflict-host-2026.md'",
                [],
            )
            .expect("delete a conflict page");
        connection
            .execute("UPDATE files SET workspace = 'c' WHERE workspace = 'b'", [])
            .expect("rename");
        assert_eq!(counts(&connection), actual(&connection), "after changes");
    }

    #[test]
    fn damaged_files_are_moved_aside_and_replaced() {
        type Damage = fn(&Path);
        let cases: [(&str, Damage); 5] = [
            ("not a readable SQLite database", |p| {
                std::fs::write(p, [0x5a_u8; 4096]).expect("write")
            }),
            ("", |p| {
                populated(p);
                let file = std::fs::OpenOptions::new()
                    .write(true)
                    .open(p)
                    .expect("open");
                let len = file.metadata().expect("len").len();
                file.set_len(len / 3).expect("truncate");
            }),
            ("tables are not this build's", |p| {
                let c = Connection::open(p).expect("open");
                c.execute_batch(&format!(
                    "CREATE TABLE files(name); PRAGMA user_version = {};",
                    MIGRATIONS.len()
                ))
                .expect("schema");
            }),
            ("cannot be migrated", |p| {
                let c = Connection::open(p).expect("open");
                c.execute_batch("CREATE TABLE workspaces(x);")
                    .expect("schema");
            }),
            ("newer than this build", |p| {
                let c = Connection::open(p).expect("open");
                c.execute_batch("PRAGMA user_version = 999;")
                    .expect("schema");
            }),
        ];
        for (expected, damage) in cases {
            let dir = tempfile::tempdir().expect("tempdir");
            let path = dir.path().join("state.db");
            damage(&path);
            let started = Instant::now();
            let (pool, report) = open_checked(&path, Duration::from_secs(1)).expect("open");
            assert!(started.elapsed() < Duration::from_secs(2), "{expected}");
            assert!(report.rebuilt, "{expected}");
            let reason = report.reason.expect("reason");
            assert!(reason.contains(expected), "{expected}: {reason}");
            let moved = PathBuf::from(report.moved_to.expect("moved"));
            assert!(moved.is_file(), "{expected}: kept");
            let count: i64 = pool
                .get()
                .expect("conn")
                .query_row("SELECT count(*) FROM wiki_log_entries", [], |r| r.get(0))
                .expect("fresh db works");
            assert_eq!(count, 0);
            drop(pool);
            // The new file is sound: the next open keeps it.
            let (_, again) = open_checked(&path, Duration::from_secs(1)).expect("reopen");
            assert!(!again.rebuilt, "{expected}: {again:?}");
        }
    }

    #[test]
    fn a_sound_file_is_kept_and_a_missing_one_is_made() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.db");
        let (_, first) = open_checked(&path, Duration::from_secs(1)).expect("open");
        assert!(first.rebuilt && first.moved_to.is_none());
        populated(&path);
        let (pool, second) = open_checked(&path, Duration::from_secs(1)).expect("open");
        assert!(!second.rebuilt, "{second:?}");
        let count: i64 = pool
            .get()
            .expect("conn")
            .query_row("SELECT count(*) FROM wiki_log_entries", [], |r| r.get(0))
            .expect("count");
        assert_eq!(count, 500);
    }

    /// A clean stop while a reader still holds a snapshot of the WAL (after a cold
    /// index, the indexer's last reads and the checkpoint of its queue trim) waits for
    /// it and stamps the file, instead of giving up at the first busy checkpoint and
    /// costing the next start a full check.
    #[test]
    fn a_clean_stop_waits_for_a_reader_to_let_the_wal_go() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.db");
        // A busy timeout shorter than the reader's hold: one checkpoint gives up.
        let pool = open(&path, Duration::from_millis(20)).expect("open");
        pool.get()
            .expect("conn")
            .execute_batch(
                "INSERT INTO events(ts, kind) VALUES (1, 'a');
                 INSERT INTO events(ts, kind) VALUES (2, 'b');",
            )
            .expect("write");
        let reader = pool.get().expect("reader");
        let (held, release) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            let mut reader = reader;
            let transaction = reader.transaction().expect("begin");
            let _: i64 = transaction
                .query_row("SELECT count(*) FROM events", [], |r| r.get(0))
                .expect("read");
            held.send(()).expect("send");
            std::thread::sleep(Duration::from_millis(400));
            drop(transaction);
        });
        release.recv().expect("reader holds its snapshot");
        // A write after the reader's snapshot: the WAL cannot be started over under it.
        pool.get()
            .expect("conn")
            .execute("INSERT INTO events(ts, kind) VALUES (3, 'c')", [])
            .expect("write");
        mark_clean(&pool, &path);
        holder.join().expect("holder");
        drop(pool);
        let (_, report) = open_checked(&path, Duration::from_secs(1)).expect("reopen");
        assert!(report.quick_check_skipped, "{report:?}");
    }

    #[test]
    fn an_unusable_path_fails_at_once_and_is_not_moved() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.db");
        std::fs::create_dir(&path).expect("mkdir");
        let started = Instant::now();
        let error = open_checked(&path, Duration::from_secs(1)).expect_err("a directory");
        assert!(started.elapsed() < Duration::from_secs(2));
        assert!(error.to_string().contains("state.db"), "{error}");
        assert!(path.is_dir(), "left where it was");
    }
}
