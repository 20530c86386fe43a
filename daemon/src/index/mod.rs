//! The file catalogue and the chunks' text in `state.db` (indexing files, catching up
//! with the disk), the ranked search index fed from it (`engine`), the query
//! language (`query`), and listings.
//!
//! May import: `workspace` (paths, revisions), `db`, `error`. Extraction (`extract`:
//! kinds, PDF text per page) and markdown parsing (`markdown`: sections, citations) live
//! here because only indexing and citation checks need them.

pub mod engine;
pub mod extract;
pub mod glob;
pub mod markdown;
pub mod query;
pub mod search;
pub mod snippet;
pub mod tokens;

pub use glob::PathGlob;
pub use search::{Found, Hit, SearchQuery, list, search_ranked};

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::Ordering;

use alexandria_proto::paths::Layer;
use rusqlite::{Connection, OptionalExtension, params};

use self::extract::Kind;
use crate::db::now_ms;
use crate::error::{ToolError, ToolResult};
use crate::workspace::{Store, revision};

/// Bits of a chunk rowid reserved for the chunk ordinal within its file.
const CHUNK_BITS: i64 = 20;
const MAX_CHUNKS: usize = (1 << CHUNK_BITS) - 1;

/// What the catalogue knows about one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRecord {
    pub id: i64,
    pub path: String,
    pub layer: String,
    pub kind: String,
    pub size: i64,
    pub mtime_ns: i64,
    pub rev: String,
    pub pages: Option<i64>,
    pub title: Option<String>,
}

/// Size and modification time: what tells us a file changed.
pub fn stat_key(metadata: &std::fs::Metadata) -> (i64, i64) {
    (
        metadata.size() as i64,
        metadata.mtime() * 1_000_000_000 + metadata.mtime_nsec(),
    )
}

/// The columns `file_from_row` reads, as a literal for `concat!` (cached statements).
macro_rules! file_columns {
    () => {
        "id, path, layer, kind, size, mtime_ns, rev, pages, title"
    };
}
const FILE_COLUMNS: &str = file_columns!();

fn file_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<FileRecord> {
    Ok(FileRecord {
        id: row.get(0)?,
        path: row.get(1)?,
        layer: row.get(2)?,
        kind: row.get(3)?,
        size: row.get(4)?,
        mtime_ns: row.get(5)?,
        rev: row.get(6)?,
        pages: row.get(7)?,
        title: row.get(8)?,
    })
}

pub fn lookup(
    connection: &Connection,
    workspace: &str,
    path: &str,
) -> ToolResult<Option<FileRecord>> {
    // Cached: preparing the statement cost more than running it.
    Ok(connection
        .prepare_cached(concat!(
            "SELECT ",
            file_columns!(),
            " FROM files WHERE workspace = ?1 AND path = ?2"
        ))?
        .query_row(params![workspace, path], file_from_row)
        .optional()?)
}

/// (Re)index one file: catalogue row, chunks, citations. Runs inside the caller's
/// transaction when there is one.
pub fn index_file(
    connection: &Connection,
    workspace: &str,
    path: &str,
    absolute: &Path,
) -> ToolResult<FileRecord> {
    // One open: the stat and the read go through the handle (a path walked once).
    let mut file = std::fs::File::open(absolute).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            ToolError::not_found(path)
        } else {
            ToolError::internal("opening file", e)
        }
    })?;
    let metadata = file
        .metadata()
        .map_err(|e| ToolError::internal("reading file metadata", e))?;
    let (size, mtime_ns) = stat_key(&metadata);
    let kind = Kind::of(absolute);
    let layer = path.split('/').next().unwrap_or("wiki").to_string();
    let (rev, extracted) = if metadata.len() > extract::MAX_INDEXED_BYTES {
        (
            format!("size-{size}-{mtime_ns}"),
            extract::Extracted {
                problem: Some("too large to index".into()),
                ..Default::default()
            },
        )
    } else {
        let mut bytes = Vec::with_capacity(metadata.len() as usize + 1);
        std::io::Read::read_to_end(&mut file, &mut bytes)
            .map_err(|e| ToolError::internal("reading file", e))?;
        (revision(&bytes), extract::extract(absolute, kind, &bytes))
    };
    if let Some(problem) = &extracted.problem {
        tracing::info!(workspace, path, problem, "indexed with a problem");
    }
    // Cached statements: preparing one compiles the triggers on `files` into it, which
    // cost more than running it (a cold index prepares them once, not once per file).
    connection.prepare_cached(
        "INSERT INTO files(workspace, path, layer, kind, size, mtime_ns, rev, pages, title, indexed_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
         ON CONFLICT(workspace, path) DO UPDATE SET
           layer = excluded.layer, kind = excluded.kind, size = excluded.size,
           mtime_ns = excluded.mtime_ns, rev = excluded.rev, pages = excluded.pages,
           title = excluded.title, indexed_at = excluded.indexed_at",
    )?.execute(
        params![
            workspace,
            path,
            layer,
            kind.as_str(),
            size,
            mtime_ns,
            rev,
            extracted.pages.map(i64::from),
            extracted.title,
            now_ms()
        ],
    )?;
    let record = lookup(connection, workspace, path)?
        .ok_or_else(|| ToolError::internal("indexing", "row vanished after upsert"))?;
    replace_chunks(connection, record.id, &extracted.chunks)?;
    replace_citations(connection, record.id, &extracted.citations)?;
    Ok(record)
}

/// `index_file`, or `remove_file` when the file is not there (any more): for a file a
/// commit just wrote, which a `git reset` or `git stash` by hand that resolved HEAD
/// before the commit may take off the disk when it ends (`restore` puts it back, and
/// the watcher indexes it again). The catalogue follows the disk; the commit stands.
pub fn index_or_forget(
    connection: &Connection,
    workspace: &str,
    path: &str,
    absolute: &Path,
) -> ToolResult<()> {
    match index_file(connection, workspace, path, absolute) {
        Ok(_) => Ok(()),
        Err(error) if error.code == alexandria_proto::ErrorCode::NotFound => {
            tracing::warn!(
                workspace,
                path,
                "a file gone from the disk right after its commit (a git reset racing it?)"
            );
            remove_file(connection, workspace, path)
        }
        Err(error) => Err(error),
    }
}

/// The file's chunks become `chunks`, written only where they changed: a page
/// appended to keeps its chunks but the last, and deleting and inserting them all
/// again cost an append in proportion to the page (at 1,000 appends to one page, a
/// third of the write's CPU time).
fn replace_chunks(
    connection: &Connection,
    file_id: i64,
    chunks: &[extract::Chunk],
) -> ToolResult<()> {
    let low = file_id << CHUNK_BITS;
    let kept = chunks.len().min(MAX_CHUNKS);
    // Not updated (no page written) when the chunk is what it was.
    let mut upsert = connection.prepare_cached(
        "INSERT INTO chunks(id, page, heading, body) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT(id) DO UPDATE SET
           page = excluded.page, heading = excluded.heading, body = excluded.body
         WHERE page IS NOT excluded.page OR heading IS NOT excluded.heading
           OR body IS NOT excluded.body",
    )?;
    for (ordinal, chunk) in chunks.iter().take(kept).enumerate() {
        let rowid = low | ordinal as i64;
        upsert.execute(params![rowid, chunk.page, chunk.heading, chunk.body])?;
    }
    connection
        .prepare_cached("DELETE FROM chunks WHERE rowid BETWEEN ?1 AND ?2")?
        .execute(params![low | kept as i64, low | MAX_CHUNKS as i64])?;
    Ok(())
}

/// The file's citations become `citations` (a set: only which sources are cited is
/// read), the rows of those that stayed left as they are.
fn replace_citations(
    connection: &Connection,
    file_id: i64,
    citations: &[markdown::Citation],
) -> ToolResult<()> {
    let mut wanted: HashMap<&str, usize> = HashMap::new();
    for citation in citations {
        *wanted.entry(citation.target.as_str()).or_default() += 1;
    }
    let old: Vec<(i64, String)> = connection
        .prepare_cached("SELECT rowid, target FROM citations WHERE file_id = ?1")?
        .query_map(params![file_id], |row| Ok((row.get(0)?, row.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    let mut delete = connection.prepare_cached("DELETE FROM citations WHERE rowid = ?1")?;
    for (rowid, target) in &old {
        match wanted.get_mut(target.as_str()) {
            Some(left) if *left > 0 => *left -= 1,
            _ => {
                delete.execute(params![rowid])?;
            }
        }
    }
    let mut cite =
        connection.prepare_cached("INSERT INTO citations(file_id, target) VALUES (?1, ?2)")?;
    for citation in citations {
        if let Some(left) = wanted.get_mut(citation.target.as_str())
            && *left > 0
        {
            *left -= 1;
            cite.execute(params![file_id, citation.target])?;
        }
    }
    Ok(())
}

fn delete_chunks(connection: &Connection, file_id: i64) -> ToolResult<()> {
    let low = file_id << CHUNK_BITS;
    let high = low | MAX_CHUNKS as i64;
    connection
        .prepare_cached("DELETE FROM chunks WHERE rowid BETWEEN ?1 AND ?2")?
        .execute(params![low, high])?;
    connection
        .prepare_cached("DELETE FROM citations WHERE file_id = ?1")?
        .execute(params![file_id])?;
    Ok(())
}

/// Forget a file that no longer exists.
pub fn remove_file(connection: &Connection, workspace: &str, path: &str) -> ToolResult<()> {
    if let Some(record) = lookup(connection, workspace, path)? {
        delete_chunks(connection, record.id)?;
        connection
            .prepare_cached("DELETE FROM files WHERE id = ?1")?
            .execute(params![record.id])?;
    }
    Ok(())
}

/// The catalogue row for a file, re-indexed first if the file changed on disk.
/// `known`: the row as just read by the caller (a listing), which saves the look-up
/// when the file is unchanged.
pub fn ensure_fresh(
    store: &Store,
    workspace: &str,
    path: &str,
    absolute: &Path,
    known: Option<&FileRecord>,
) -> ToolResult<FileRecord> {
    ensure_fresh_with(store, workspace, path, absolute, known, None)
}

/// `ensure_fresh` with the file's stat data when the caller has it already (`stat`:
/// what `Store::checked_path_for_read` read of the file itself, no link in between).
pub fn ensure_fresh_with(
    store: &Store,
    workspace: &str,
    path: &str,
    absolute: &Path,
    known: Option<&FileRecord>,
    stat: Option<std::fs::Metadata>,
) -> ToolResult<FileRecord> {
    let metadata = match stat.map_or_else(|| std::fs::metadata(absolute), Ok) {
        Ok(m) if m.is_file() => m,
        Ok(_) => {
            return Err(ToolError::invalid_argument(
                format!("{path} is a directory"),
                format!("list it with search(mode=\"list\", path=\"{path}/**\") or read a glob"),
            ));
        }
        Err(_) => return Err(ToolError::not_found(path)),
    };
    if let Some(record) = known
        && record.path == path
        && (record.size, record.mtime_ns) == stat_key(&metadata)
    {
        return Ok(record.clone());
    }
    let connection = crate::blocking::checkout(&store.pool)?;
    if let Some(record) = lookup(&connection, workspace, path)?
        && (record.size, record.mtime_ns) == stat_key(&metadata)
    {
        return Ok(record);
    }
    // Changed on disk (or new): extracting and indexing it may take a while.
    crate::blocking::section(|| {
        let state = store.state(workspace);
        let _guard = state.index_lock.lock().unwrap_or_else(|p| p.into_inner());
        index_file(&connection, workspace, path, absolute)
    })
}

/// The stat key of a file walked without a stat (no file has a negative size).
const UNSTATED: (i64, i64) = (-1, -1);

/// Result of a catch-up scan.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CatchUp {
    pub indexed: usize,
    pub removed: usize,
    pub unchanged: usize,
}

/// Catch up once after start before the first query of a workspace is answered.
pub fn ensure_caught_up(store: &Store, workspace: &str) -> ToolResult<()> {
    let state = store.state(workspace);
    if state.caught_up.load(std::sync::atomic::Ordering::Acquire) {
        return Ok(());
    }
    crate::blocking::section(|| catch_up(store, workspace))?;
    Ok(())
}

/// Bring the catalogue of `workspace` in line with the files on disk. Wiki changes
/// found in a workspace that was indexed before are recorded as outside edits.
pub fn catch_up(store: &Store, workspace: &str) -> ToolResult<CatchUp> {
    catch_up_in(store, workspace, None)
}

/// `catch_up` of one folder (`raw/...` or `wiki/...`, workspace-relative): what is
/// under it on disk and in the catalogue. A folder that appeared (made, moved or
/// copied in) or went away: walking the whole workspace for it cost about a second
/// of CPU at 100k pages, each time an agent wrote the first page of a new folder.
pub fn catch_up_under(store: &Store, workspace: &str, folder: &str) -> ToolResult<CatchUp> {
    catch_up_in(store, workspace, Some(folder))
}

fn catch_up_in(store: &Store, workspace: &str, folder: Option<&str>) -> ToolResult<CatchUp> {
    let root = store.workspace_dir(workspace);
    // Walk and stat without the index lock: at 100k files this is most of a scan, and
    // writes need the lock to index their page. Whatever looks changed or removed is
    // checked again under the lock, when writes cannot move it.
    let mut on_disk: HashMap<String, (i64, i64)> = HashMap::new();
    // A workspace the catalogue holds nothing of (a cold index) is walked without a
    // stat per file: every file is indexed, and `index_file` stats what it reads. A
    // file a write indexed since is in the catalogue read under the lock, and gets
    // its stat there (`UNSTATED` matches no file's).
    let unstated = folder.is_none() && {
        let connection = store.pool.get()?;
        !connection
            .prepare_cached("SELECT EXISTS(SELECT 1 FROM files WHERE workspace = ?1)")?
            .query_row(params![workspace], |row| row.get::<_, bool>(0))?
    };
    let tops: Vec<&str> = match folder {
        Some(folder) => vec![folder],
        None => vec![Layer::Raw.as_str(), Layer::Wiki.as_str()],
    };
    for top in tops {
        let walker = walkdir::WalkDir::new(root.join(top))
            .follow_links(false)
            .into_iter()
            .filter_entry(|e| e.depth() == 0 || !e.file_name().to_string_lossy().starts_with('.'));
        for entry in walker.flatten() {
            if !entry.file_type().is_file() {
                continue;
            }
            let Ok(relative) = entry.path().strip_prefix(&root) else {
                continue;
            };
            let Some(relative) = relative.to_str() else {
                continue; // non-UTF-8 names cannot be named by tools
            };
            if unstated {
                on_disk.insert(relative.to_string(), UNSTATED);
                continue;
            }
            let Ok(metadata) = entry.metadata() else {
                continue;
            };
            on_disk.insert(relative.to_string(), stat_key(&metadata));
        }
    }
    let state = store.state(workspace);
    let _guard = state.index_lock.lock().unwrap_or_else(|p| p.into_inner());
    // HEAD under the lock: a write committed since the walk is in it, so an outside
    // edit logged below names the commit that holds the text it replaced.
    let head = head_commit(store, workspace);
    let mut connection = store.pool.get()?;
    let known: HashMap<String, (i64, i64)> = {
        let row =
            |row: &rusqlite::Row<'_>| Ok((row.get::<_, String>(0)?, (row.get(1)?, row.get(2)?)));
        match folder {
            // The folder itself (a file where it was) and everything under it: the
            // paths from `folder/` up to `folder0` ('0' follows '/').
            Some(folder) => connection
                .prepare_cached(
                    "SELECT path, size, mtime_ns FROM files WHERE workspace = ?1
                     AND (path = ?2 OR (path > ?2 || '/' AND path < ?2 || '0'))",
                )?
                .query_map(params![workspace, folder], row)?
                .collect::<Result<_, _>>()?,
            None => connection
                .prepare("SELECT path, size, mtime_ns FROM files WHERE workspace = ?1")?
                .query_map(params![workspace], row)?
                .collect::<Result<_, _>>()?,
        }
    };
    // Nothing logged as an outside edit for a workspace never indexed before.
    let first_scan = folder.is_none() && known.is_empty();
    let mut changed = Vec::new();
    let mut result = CatchUp::default();
    for (relative, key) in &on_disk {
        let known_key = known.get(relative);
        if known_key == Some(key) {
            result.unchanged += 1;
            continue;
        }
        let absolute = root.join(relative);
        if known_key.is_none() {
            // Not in the catalogue read under the lock either, so no write indexed it
            // since the walk: nothing to check (a stat per file was a fifth of the
            // serial start of a 100k cold index). One gone since is skipped below.
            changed.push((relative.clone(), absolute, true));
            continue;
        }
        match std::fs::metadata(&absolute) {
            // Indexed by a write since the walk.
            Ok(now) if known_key == Some(&stat_key(&now)) => result.unchanged += 1,
            Ok(_) => changed.push((relative.clone(), absolute, false)),
            Err(_) => {} // gone since the walk: the next scan removes it
        }
    }
    changed.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    spread_first(&mut changed, SPREAD);
    // A file created since the walk (by a write, which indexed it) is not removed;
    // files the walk skips (hidden) are, as before.
    let hidden = |p: &str| p.split('/').any(|c| c.starts_with('.'));
    let removed: Vec<&String> = known
        .keys()
        .filter(|p| !on_disk.contains_key(*p) && (hidden(p) || !root.join(p).exists()))
        .collect();
    let mut notify = Vec::new();
    let progress = &state.indexing;
    let _running = folder.is_none().then(|| {
        progress.done.store(0, Ordering::Release);
        progress
            .total
            .store(changed.len() as u64, Ordering::Release);
        progress.running.store(true, Ordering::Release);
        ClearOnDrop(&progress.running)
    });
    for batch in changed.chunks(256) {
        let transaction = crate::db::write_transaction(&mut connection)?;
        for (relative, absolute, is_new) in batch {
            match index_file(&transaction, workspace, relative, absolute) {
                Ok(_) => result.indexed += 1,
                // Gone since the walk: the next scan removes it if it was known.
                Err(error) if error.code == alexandria_proto::ErrorCode::NotFound => continue,
                Err(error) => tracing::warn!(workspace, path = %relative, %error, "cannot index"),
            }
            if !first_scan {
                notify.push(relative.clone());
            }
            if !first_scan && relative.starts_with("wiki/") {
                let op = if *is_new {
                    "outside_create"
                } else {
                    "outside_edit"
                };
                record_outside(&transaction, workspace, op, relative, head.as_deref())?;
            }
        }
        transaction.commit()?;
        progress
            .done
            .fetch_add(batch.len() as u64, Ordering::AcqRel);
    }
    if !removed.is_empty() {
        let transaction = crate::db::write_transaction(&mut connection)?;
        for relative in removed {
            remove_file(&transaction, workspace, relative)?;
            notify.push(relative.clone());
            result.removed += 1;
            if relative.starts_with("wiki/") {
                record_outside(
                    &transaction,
                    workspace,
                    "outside_delete",
                    relative,
                    head.as_deref(),
                )?;
            }
        }
        transaction.commit()?;
    }
    if folder.is_none() {
        state
            .caught_up
            .store(true, std::sync::atomic::Ordering::Release);
    }
    for relative in &notify {
        store.changed(workspace, relative);
    }
    Ok(result)
}

/// A catch-up of more files than twice this indexes this many, spread evenly over the
/// paths, before the rest: the search index chooses its common words from the first
/// files indexed (`engine::choose_common`), and in path order those are one corner of
/// the workspace (`raw/` before `wiki/`, a folder's first PDFs).
pub(crate) const SPREAD: usize = 1_000;

/// Move `count` items spread evenly over `items` to the front, each part keeping its
/// order; fewer than `2 * count` items are left as they are.
fn spread_first<T>(items: &mut Vec<T>, count: usize) {
    if count == 0 || items.len() < 2 * count {
        return;
    }
    let len = items.len();
    let mut chosen = vec![false; len];
    for k in 0..count {
        chosen[k * len / count] = true;
    }
    let (first, rest): (Vec<_>, Vec<_>) = std::mem::take(items)
        .into_iter()
        .enumerate()
        .partition(|(i, _)| chosen[*i]);
    items.extend(first.into_iter().chain(rest).map(|(_, item)| item));
}

/// Clears a flag however the scope ends.
struct ClearOnDrop<'a>(&'a std::sync::atomic::AtomicBool);

impl Drop for ClearOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// Re-index the given workspace-relative paths (from file notifications): changed
/// files are indexed, vanished ones forgotten, wiki changes logged as outside edits.
pub fn refresh_paths(store: &Store, workspace: &str, relatives: &[String]) -> ToolResult<()> {
    let state = store.state(workspace);
    let _guard = state.index_lock.lock().unwrap_or_else(|p| p.into_inner());
    // A test holds the index guard here (`delay:refresh:<ms>`), as a long re-index does.
    if let Some(delay) = crate::faults::delay_for("refresh") {
        std::thread::sleep(delay);
    }
    let mut connection = store.pool.get()?;
    let transaction = crate::db::write_transaction(&mut connection)?;
    let root = store.workspace_dir(workspace);
    let mut notify = Vec::new();
    let head = head_commit(store, workspace);
    for relative in relatives {
        let absolute = root.join(relative);
        let known = lookup(&transaction, workspace, relative)?;
        match std::fs::symlink_metadata(&absolute) {
            Ok(metadata) if metadata.is_file() => {
                if known.as_ref().map(|r| (r.size, r.mtime_ns)) == Some(stat_key(&metadata)) {
                    continue;
                }
                index_file(&transaction, workspace, relative, &absolute)?;
                notify.push(relative);
                if relative.starts_with("wiki/") {
                    let op = if known.is_none() {
                        "outside_create"
                    } else {
                        "outside_edit"
                    };
                    record_outside(&transaction, workspace, op, relative, head.as_deref())?;
                }
            }
            Ok(_) => {}
            Err(_) => {
                if known.is_some() {
                    remove_file(&transaction, workspace, relative)?;
                    notify.push(relative);
                    if relative.starts_with("wiki/") {
                        record_outside(
                            &transaction,
                            workspace,
                            "outside_delete",
                            relative,
                            head.as_deref(),
                        )?;
                    }
                }
            }
        }
    }
    transaction.commit()?;
    for relative in notify {
        store.changed(workspace, relative);
    }
    Ok(())
}

/// HEAD's commit: for an outside edit found now, the commit that still holds the text
/// from before it (every acknowledged write is committed).
fn head_commit(store: &Store, workspace: &str) -> Option<String> {
    let root = store.workspace_dir(workspace);
    store
        .state(workspace)
        .with_repo(&root, |repo| {
            repo.head()
                .and_then(|h| h.peel_to_commit())
                .map(|c| c.id().to_string())
        })
        .ok()
}

fn record_outside(
    connection: &Connection,
    workspace: &str,
    op: &str,
    path: &str,
    previous_commit: Option<&str>,
) -> ToolResult<()> {
    // Cached: a catch-up logs every page that appeared while the daemon was stopped
    // (100k of them after a copy), and preparing the statement cost more than running it.
    connection
        .prepare_cached(
            "INSERT INTO wiki_log_entries(ts, workspace, run_id, op, path, summary, origin, previous_commit)
             VALUES (?1, ?2, NULL, ?3, ?4, 'changed outside alexandria (editor, git pull …)', 'outside', ?5)",
        )?
        .execute(params![now_ms(), workspace, op, path, previous_commit])?;
    Ok(())
}

/// Indexed text of the given pages of a PDF (1-based), in the order asked.
pub fn pdf_pages(
    connection: &Connection,
    file_id: i64,
    pages: &[u32],
) -> ToolResult<Vec<(u32, String)>> {
    let low = file_id << CHUNK_BITS;
    let high = low | MAX_CHUNKS as i64;
    let mut statement = connection
        .prepare_cached("SELECT body FROM chunks WHERE rowid BETWEEN ?1 AND ?2 AND page = ?3")?;
    let mut result = Vec::with_capacity(pages.len());
    for page in pages {
        let text: Option<String> = statement
            .query_row(params![low, high, page], |row| row.get(0))
            .optional()?;
        result.push((*page, text.unwrap_or_default()));
    }
    Ok(result)
}

/// Counts for `guide`.
pub struct WorkspaceCounts {
    pub raw: i64,
    pub wiki: i64,
    pub uncited: Vec<String>,
}

pub fn counts(
    connection: &Connection,
    workspace: &str,
    uncited_limit: usize,
) -> ToolResult<WorkspaceCounts> {
    // Kept by trigger on `files` (migration 9): one row, not a count over every file.
    let count = |layer: &str| -> ToolResult<i64> {
        Ok(connection
            .prepare_cached("SELECT files FROM file_counts WHERE ws = ?1 AND layer = ?2")?
            .query_row(params![workspace, layer], |row| row.get(0))
            .optional()?
            .unwrap_or(0))
    };
    // The raw files through `files_layer` (workspace, layer), then sorted: left to
    // itself SQLite walked every file of the workspace in path order to keep the raw
    // ones (10 M instructions per guide at 10k pages, for 8 raw files).
    // The limit written into the statement (0 or 20 here): SQLite prepares a statement
    // with a bound LIMIT again each time a value is bound to it.
    let uncited = if uncited_limit == 0 {
        Vec::new()
    } else {
        let mut statement = connection.prepare_cached(&format!(
            "SELECT path FROM files r INDEXED BY files_layer WHERE r.workspace = ?1 AND r.layer = 'raw'
               AND NOT EXISTS (SELECT 1 FROM citations c CROSS JOIN files w ON w.id = c.file_id
                               WHERE c.target = r.path AND w.workspace = ?1)
             ORDER BY path LIMIT {uncited_limit}"
        ))?;
        statement
            .query_map(params![workspace], |row| row.get(0))?
            .collect::<Result<Vec<String>, _>>()?
    };
    Ok(WorkspaceCounts {
        raw: count("raw")?,
        wiki: count("wiki")?,
        uncited,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use alexandria_proto::ErrorCode;

    #[test]
    fn spread_first_puts_an_even_sample_first() {
        let mut items: Vec<usize> = (0..10_000).collect();
        spread_first(&mut items, 1_000);
        let first: Vec<usize> = items[..1_000].to_vec();
        assert_eq!(first, (0..1_000).map(|i| i * 10).collect::<Vec<_>>());
        // The rest keep their order, and nothing is lost or repeated.
        assert!(items[1_000..].windows(2).all(|w| w[0] < w[1]));
        let mut sorted = items.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..10_000).collect::<Vec<_>>());
        // An odd length: still 1,000 first, spread to the end.
        let mut items: Vec<usize> = (0..2_999).collect();
        spread_first(&mut items, 1_000);
        assert_eq!(items[999], 2_996);
        assert!(items[1_000..].windows(2).all(|w| w[0] < w[1]));
        // Too few to spread: untouched.
        let mut few: Vec<usize> = (0..1_999).collect();
        spread_first(&mut few, 1_000);
        assert_eq!(few, (0..1_999).collect::<Vec<_>>());
    }

    fn query<'a>(text: &'a str) -> SearchQuery<'a> {
        SearchQuery {
            workspace: "global",
            query: text,
            layer: None,
            scope: None,
            scope_sql: None,
            limit: 10,
            offset: 0,
        }
    }

    #[test]
    fn index_search_and_remove() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(alexandria_proto::Home::new(dir.path())).expect("store");
        let page = store.workspace_dir("global").join("wiki/zebra.md");
        std::fs::write(
            &page,
            "# Zebras\n\n## Stripes\nThe quokka is not a zebra.\n",
        )
        .expect("write");
        let result = catch_up(&store, "global").expect("catch up");
        assert!(result.indexed >= 4, "{result:?}");
        engine::start(&store);
        let connection = store.pool.get().expect("conn");
        let found = search_ranked(&store, &connection, &query("quokka")).expect("search");
        assert_eq!(found.hits.len(), 1);
        assert!(!found.more && !found.indexing);
        assert_eq!(found.hits[0].path, "wiki/zebra.md");
        assert_eq!(found.hits[0].heading, "Zebras > Stripes");
        assert!(found.hits[0].snippet.contains("**quokka**"));
        assert_eq!(
            search_ranked(&store, &connection, &query("\"unbalanced"))
                .expect_err("bad")
                .code,
            ErrorCode::InvalidQuery
        );
        std::fs::remove_file(&page).expect("rm");
        drop(connection);
        let result = catch_up(&store, "global").expect("catch up");
        assert_eq!(result.removed, 1);
        let connection = store.pool.get().expect("conn");
        let found = search_ranked(&store, &connection, &query("quokka")).expect("search");
        assert!(found.hits.is_empty());
    }

    /// A file's chunks (ordinal, PDF page, heading, body) and cited targets (sorted).
    type Rows = (Vec<(i64, Option<i64>, String, String)>, Vec<String>);
    type Edit = Box<dyn Fn(&str) -> String>;

    /// What `index_file` left for a file: its chunks by ordinal and its citations
    /// (sorted).
    fn rows(connection: &Connection, id: i64) -> Rows {
        let low = id << CHUNK_BITS;
        let chunks = connection
            .prepare("SELECT id - ?1, page, heading, body FROM chunks WHERE id BETWEEN ?1 AND ?2 ORDER BY id")
            .expect("prepare")
            .query_map(params![low, low | MAX_CHUNKS as i64], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })
            .expect("query")
            .collect::<rusqlite::Result<Vec<_>>>()
            .expect("rows");
        let mut cited: Vec<String> = connection
            .prepare("SELECT target FROM citations WHERE file_id = ?1")
            .expect("prepare")
            .query_map(params![id], |r| r.get(0))
            .expect("query")
            .collect::<rusqlite::Result<Vec<_>>>()
            .expect("rows");
        cited.sort();
        (chunks, cited)
    }

    /// A page indexed again after each change holds exactly the chunks and citations
    /// extracted from it, and only what changed is written: an append to a
    /// page of 40 sections changes a row or two, not 40.
    #[test]
    fn a_page_indexed_again_writes_only_what_changed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(alexandria_proto::Home::new(dir.path())).expect("store");
        let root = store.workspace_dir("global");
        let page = root.join("wiki/log.md");
        let mut text = String::from("# Log\n\nFootnoted.[^1]\n\n[^1]: raw/first.pdf, p.2\n");
        for n in 0..40 {
            text.push_str(&format!(
                "\n## Entry {n}\n\nWords of entry {n} [src](raw/s{}.md).\n",
                n % 7
            ));
        }
        let edits: Vec<Edit> = vec![
            Box::new(|t| t.to_string()),
            Box::new(|t| format!("{t}More words in the last entry.\n")),
            Box::new(|t| format!("{t}\n## Entry 40\n\nA new one [src](raw/new.md).\n")),
            Box::new(|t| t.replace("Words of entry 7 ", "Changed entry seven ")),
            Box::new(|t| t.replace(" [src](raw/s3.md)", "")),
            Box::new(|t| t.replace("[^1]: raw/first.pdf, p.2", "[^1]: raw/other.pdf, p.4")),
            Box::new(|t| {
                t.split("\n## Entry 20")
                    .next()
                    .unwrap_or_default()
                    .to_string()
            }),
            Box::new(|t| t.to_string()),
        ];
        let connection = store.pool.get().expect("conn");
        for (n, edit) in edits.iter().enumerate() {
            text = edit(&text);
            std::fs::write(&page, &text).expect("write");
            let before = connection.total_changes();
            let record = index_file(&connection, "global", "wiki/log.md", &page).expect("index");
            let changes = connection.total_changes() - before;
            let got = rows(&connection, record.id);
            let expected = {
                let extracted = extract::extract(&page, Kind::of(&page), text.as_bytes());
                let chunks: Vec<(i64, Option<i64>, String, String)> = extracted
                    .chunks
                    .iter()
                    .enumerate()
                    .map(|(i, c)| {
                        (
                            i as i64,
                            c.page.map(i64::from),
                            c.heading.clone(),
                            c.body.clone(),
                        )
                    })
                    .collect();
                let mut cited: Vec<String> = extracted
                    .citations
                    .iter()
                    .map(|c| c.target.clone())
                    .collect();
                cited.sort();
                (chunks, cited)
            };
            assert!(expected.0.len() > 20, "step {n}: a page of many chunks");
            assert_eq!(got, expected, "step {n}");
            // The row in `files` and its search queue entry (a trigger), and what
            // changed: for an append, one chunk (all 40 and their 40 citations deleted
            // and inserted again, before).
            let most = [usize::MAX, 3, 5, 3, 14, 5, 60, 2][n];
            assert!(changes as usize <= most, "step {n}: {changes} rows written");
        }
    }

    #[test]
    fn search_pages_through_ranked_hits_with_snippets() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(alexandria_proto::Home::new(dir.path())).expect("store");
        let wiki = store.workspace_dir("global").join("wiki");
        std::fs::create_dir_all(wiki.join("sub")).expect("mkdir");
        for (name, text) in [
            ("a.md", "# A\n\nwombat wombat wombat\n"),
            ("b.md", "# B\n\nwombat and more words here\n"),
            (
                "sub/c.md",
                "# C\n\none wombat among many many other words\n",
            ),
        ] {
            std::fs::write(wiki.join(name), text).expect("write");
        }
        catch_up(&store, "global").expect("catch up");
        engine::start(&store);
        let connection = store.pool.get().expect("conn");
        let scoped = PathGlob::new("wiki/sub/**").expect("glob");
        // (offset, limit, scope, expected paths, more)
        let cases: &[(usize, usize, bool, &[&str], bool)] = &[
            (
                0,
                10,
                false,
                &["wiki/a.md", "wiki/b.md", "wiki/sub/c.md"],
                false,
            ),
            (0, 1, false, &["wiki/a.md"], true),
            (1, 1, false, &["wiki/b.md"], true),
            (2, 1, false, &["wiki/sub/c.md"], false),
            (3, 1, false, &[], false),
            (0, 10, true, &["wiki/sub/c.md"], false),
        ];
        for (offset, limit, scope, expected, more) in cases {
            let query = SearchQuery {
                scope: scope.then_some(&scoped),
                scope_sql: scope.then(|| "wiki/sub/*".to_string()),
                limit: *limit,
                offset: *offset,
                ..query("wombat")
            };
            let found = search_ranked(&store, &connection, &query).expect("search");
            let paths: Vec<&str> = found.hits.iter().map(|h| h.path.as_str()).collect();
            assert_eq!(&paths, expected, "offset {offset} limit {limit}");
            assert_eq!(found.more, *more, "offset {offset} limit {limit}");
            assert!(found.hits.iter().all(|h| h.snippet.contains("**wombat**")));
        }
    }
}
