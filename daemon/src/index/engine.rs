//! The ranked search index (issue 15): tantivy, whose top-k collector skips blocks of
//! postings that cannot reach the k best (block-max WAND), so a word found in every
//! page costs what a rare one does. FTS5 `bm25()` scores every match before `LIMIT`.
//!
//! `state.db` stays the system of record. A trigger on `files` queues every change of
//! a file's row in `search_outbox` inside the writer's own transaction (no search-index
//! commit in a write). A background thread applies the queue in batches and commits
//! tantivy with the last applied sequence and the database's generation as the commit
//! payload. Files queued since that commit are searched in a small in-memory overlay
//! (built from SQLite when a search needs it) and left out of the committed index, so
//! an acknowledged write is found by the next search. On start the queue is replayed
//! from the payload's sequence; an index from another `state.db` (or none, or one that
//! cannot be opened) is rebuilt from SQLite. Until the index is ready, for a query it
//! cannot express, or while too much is queued, search uses FTS5 as before.
//!
//! A bulk load (a cold index, a rebuild) is handed to tantivy as it is queued and
//! committed once, when the queue goes quiet; tantivy's own queue is kept short
//! (`IN_FLIGHT`) and freed memory is handed back after commits (`release_memory`), so
//! the daemon's memory after a cold build is about what it was before it.
//!
//! Terms are made by `tokens.rs` the way FTS5 makes them (our tokenizer, inside
//! tantivy's indexing thread); a phrase is looked up in a field of word pairs ("a b"),
//! so a phrase of common words is a term or two, not a position check in every page
//! holding the words. Snippets are made from the hit's stored text (`snippet.rs`).

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OptionalExtension, params};
use tantivy::collector::TopDocs;
use tantivy::directory::{MmapDirectory, RamDirectory};
use tantivy::indexer::{IndexWriterOptions, LogMergePolicy, NoMergePolicy};
use tantivy::query::{Bm25StatisticsProvider, BooleanQuery, Occur, Query, TermQuery};
use tantivy::schema::{
    FAST, Field, INDEXED, IndexRecordOption, STRING, Schema, TextFieldIndexing, TextOptions,
};
use tantivy::tokenizer::{Token, TokenStream, Tokenizer, TokenizerManager};
use tantivy::{DocAddress, Index, IndexReader, IndexWriter, ReloadPolicy, Searcher, Term};

use super::search::{Hit, SearchQuery};
use super::tokens;
use crate::db::Pool;
use crate::workspace::Store;

/// Bumped when the schema or the terms change: an index with another one is rebuilt.
const FORMAT: u32 = 3;
/// Writer memory: the terms held before a segment is written (tantivy's floor is 15 MB).
const WRITER_BUDGET: usize = 32_000_000;
/// Documents handed to tantivy's indexing thread and not tokenized yet. tantivy queues
/// up to 10,000; with each page's text that is tens of MiB the process keeps (glibc
/// does not give freed memory back on its own).
const IN_FLIGHT: u64 = 256;
/// The indexing thread took no document for this long: the batch is rolled back and
/// tried again.
const STALLED: Duration = Duration::from_secs(30);
/// How often the indexer looks at the queue.
const POLL: Duration = Duration::from_millis(250);
/// Queue entries read from SQLite at a time.
const BATCH: i64 = 2_000;
/// While writes keep coming, the index commits once this many entries wait, or after
/// `COMMIT_AFTER` since its last commit.
const COMMIT_ENTRIES: i64 = 64;
const COMMIT_AFTER: Duration = Duration::from_secs(1);
/// A bulk load (a cold index, a big outside change: more queued than the overlay
/// takes, so search uses FTS5 meanwhile) is committed once the queue stays quiet for
/// `BULK_QUIET`, or every `BULK_COMMIT_AFTER`: one segment set and one sync instead of
/// one per poll, and no merges while it runs.
const BULK_QUIET: Duration = Duration::from_secs(1);
const BULK_COMMIT_AFTER: Duration = Duration::from_secs(60);
/// Memory freed by indexing is handed back to the system this long after a commit
/// (again after `TRIM_LATE`, when merges started by the commit are likely done).
const TRIM_SOON: Duration = Duration::from_secs(2);
const TRIM_LATE: Duration = Duration::from_secs(30);
/// Committed queue entries are deleted once this many piled up, or after `TRIM_AFTER`.
const TRIM_EVERY: i64 = 5_000;
const TRIM_AFTER: Duration = Duration::from_secs(30);
/// More files queued than this and search uses FTS5 until the indexer catches up.
const OVERLAY_MAX_FILES: usize = 1_000;
/// Terms longer than this (bytes) are left out; a query naming one goes to FTS5.
const MAX_TERM: usize = 255;
/// Candidates fetched from the index beyond the hits needed stop growing here; past it
/// (a narrow path scope over a common word) FTS5 answers.
const MAX_CANDIDATES: usize = 1 << 16;

type Result<T> = std::result::Result<T, EngineError>;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("search index: {0}")]
    Tantivy(#[from] tantivy::TantivyError),
    #[error("search index: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("search index: {0}")]
    Pool(#[from] r2d2::Error),
    #[error("search index: {0}")]
    Io(#[from] std::io::Error),
    #[error("search index: {0}")]
    Directory(#[from] tantivy::directory::error::OpenDirectoryError),
    #[error("search index: the indexing thread stopped taking documents")]
    Stalled,
}

#[derive(Clone, Copy)]
struct Fields {
    file_id: Field,
    rowid: Field,
    workspace: Field,
    layer: Field,
    body: Field,
    pairs: Field,
}

fn schema() -> (Schema, Fields) {
    let mut builder = Schema::builder();
    let file_id = builder.add_u64_field("file_id", INDEXED | FAST);
    let rowid = builder.add_u64_field("rowid", FAST);
    let workspace = builder.add_text_field("workspace", STRING);
    let layer = builder.add_text_field("layer", STRING);
    let text = |tokenizer, record| {
        TextOptions::default().set_indexing_options(
            TextFieldIndexing::default()
                .set_tokenizer(tokenizer)
                .set_index_option(record),
        )
    };
    let body = builder.add_text_field("body", text(TERMS, IndexRecordOption::WithFreqs));
    // Pairs without positions: a phrase of three words or more is its pairs ANDed,
    // then checked in the chunk's text (`Engine::search`). Positions made the pairs
    // the costliest part of a build.
    let pairs = builder.add_text_field("pairs", text(PAIRS, IndexRecordOption::WithFreqs));
    let fields = Fields {
        file_id,
        rowid,
        workspace,
        layer,
        body,
        pairs,
    };
    (builder.build(), fields)
}

/// Names of our tokenizers in tantivy's registry.
const TERMS: &str = "alexandria-terms";
const PAIRS: &str = "alexandria-pairs";

/// tantivy's view of `tokens::Terms`: every term of a text (`TERMS`), or every pair of
/// neighbouring terms (`PAIRS`), each pair at the position of its first word. Terms
/// longer than `MAX_TERM` are left out (and the pairs holding them). The terms
/// tokenizer counts the texts it started on: the indexer's throttle (`IN_FLIGHT`).
#[derive(Clone)]
struct TermTokenizer {
    pairs: bool,
    started: Arc<AtomicU64>,
}

struct TermStream<'a> {
    terms: tokens::Terms<'a>,
    pairs: bool,
    /// Terms seen so far.
    count: usize,
    previous: String,
    token: Token,
}

impl Tokenizer for TermTokenizer {
    type TokenStream<'a> = TermStream<'a>;

    fn token_stream<'a>(&'a mut self, text: &'a str) -> TermStream<'a> {
        if !self.pairs {
            self.started.fetch_add(1, Ordering::Release);
        }
        TermStream {
            terms: tokens::Terms::new(text),
            pairs: self.pairs,
            count: 0,
            previous: String::new(),
            token: Token::default(),
        }
    }
}

impl TokenStream for TermStream<'_> {
    fn advance(&mut self) -> bool {
        while self.terms.advance().is_some() {
            let term = self.terms.term();
            self.count += 1;
            if !self.pairs {
                if term.len() > MAX_TERM {
                    continue;
                }
                self.token.text.clear();
                self.token.text.push_str(term);
                self.token.position = self.count - 1;
                return true;
            }
            let usable =
                self.count > 1 && self.previous.len() <= MAX_TERM && term.len() <= MAX_TERM;
            if usable {
                self.token.text.clear();
                self.token.text.push_str(&self.previous);
                self.token.text.push(' ');
                self.token.text.push_str(term);
                self.token.position = self.count - 2;
            }
            self.previous.clear();
            self.previous.push_str(term);
            if usable {
                return true;
            }
        }
        false
    }

    fn token(&self) -> &Token {
        &self.token
    }

    fn token_mut(&mut self) -> &mut Token {
        &mut self.token
    }
}

/// Our tokenizers, `started` counting the texts they began to index.
fn tokenizers(started: &Arc<AtomicU64>) -> TokenizerManager {
    let manager = TokenizerManager::default();
    for (name, pairs) in [(TERMS, false), (PAIRS, true)] {
        manager.register(
            name,
            TermTokenizer {
                pairs,
                started: Arc::clone(started),
            },
        );
    }
    manager
}

/// What the searches of the moment see: the committed index and the queue position
/// it holds.
struct Snapshot {
    searcher: Searcher,
    seq: i64,
}

/// Files queued since the snapshot, indexed in memory.
struct Overlay {
    key: (i64, i64, usize),
    searcher: Searcher,
}

pub struct Engine {
    index: Index,
    reader: IndexReader,
    fields: Fields,
    generation: String,
    snapshot: RwLock<Arc<Snapshot>>,
    overlay: Mutex<Option<Arc<Overlay>>>,
    ready: AtomicBool,
    /// Texts our tokenizer began to index (see `IN_FLIGHT`).
    started: Arc<AtomicU64>,
    /// Set when the merge that follows a bulk load is done (the reader then reloads).
    merged: Arc<AtomicBool>,
}

/// The indexer's position: what it handed to the writer, and when.
struct Feed {
    /// The last queue entry handed to the writer (committed or not).
    applied: i64,
    /// Documents handed to the writer (compared with `Engine::started`).
    sent: u64,
    committed: Instant,
    /// When the queue last had entries.
    grew: Instant,
    /// When to hand freed memory back.
    release: Vec<Instant>,
    /// In a bulk load: the writer merges nothing until it is over (`Engine::bulk`).
    bulk: bool,
}

impl Feed {
    fn new() -> Feed {
        Feed {
            applied: 0,
            sent: 0,
            committed: Instant::now(),
            grew: Instant::now(),
            release: Vec::new(),
            bulk: false,
        }
    }
}

/// Hand memory freed by indexing back to the system. glibc keeps freed memory in its
/// arenas (one per thread that allocated) and gives back only the top of the main
/// heap by itself: after a cold build the daemon kept hundreds of MiB it no longer used.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn release_memory() {
    let started = Instant::now();
    // SAFETY: malloc_trim takes no pointer and has no precondition; it walks glibc's
    // own arenas under their locks.
    #[allow(unsafe_code)]
    let released = unsafe { libc::malloc_trim(0) };
    tracing::debug!(
        released,
        ms = started.elapsed().as_secs_f64() * 1e3,
        "freed memory handed back"
    );
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn release_memory() {}

fn registry() -> &'static Mutex<HashMap<PathBuf, Arc<Engine>>> {
    static ENGINES: OnceLock<Mutex<HashMap<PathBuf, Arc<Engine>>>> = OnceLock::new();
    ENGINES.get_or_init(Default::default)
}

/// The engine of this store, once `start` opened it.
pub fn get(store: &Store) -> Option<Arc<Engine>> {
    let engines = registry().lock().unwrap_or_else(|p| p.into_inner());
    engines.get(&store.home.state_db()).cloned()
}

/// Whether the ranked index answers searches, and how many queued changes it has not
/// committed yet (searched in the overlay, or with FTS5 past a thousand files): for
/// `guide` and the benchmark, which waits for it before timing searches.
pub fn status(store: &Store) -> serde_json::Value {
    let Some(engine) = get(store) else {
        return serde_json::json!({"ready": false, "queued": null});
    };
    let seq = engine.snapshot().seq;
    let queued: Option<i64> = store.pool.get().ok().and_then(|connection| {
        connection
            .query_row(
                "SELECT count(*) FROM search_outbox WHERE seq > ?1",
                params![seq],
                |row| row.get(0),
            )
            .ok()
    });
    serde_json::json!({"ready": engine.ready.load(Ordering::Acquire), "queued": queued})
}

/// Where the index lives.
pub fn index_dir(store: &Store) -> PathBuf {
    store.home.root().join("search-index")
}

/// Open (or create) the index of `store` and start its indexer thread. Search uses
/// FTS5 until the index has caught up with the queue, so the daemon answers as soon
/// as it would without the index.
///
/// On unless `ALEXANDRIA_SEARCH_INDEX=off` (FTS5 then answers every search; the queue
/// is kept, so turning the index on again replays what it missed).
pub fn start(store: &Arc<Store>) {
    if std::env::var("ALEXANDRIA_SEARCH_INDEX").is_ok_and(|v| v == "off") {
        tracing::info!("search uses FTS5 alone (ALEXANDRIA_SEARCH_INDEX=off)");
        return;
    }
    start_engine(store);
}

/// The indexer's nice value: a build yields the processor to the daemon's calls and
/// its catch-up with the disk (threads tantivy starts from this one inherit it).
const INDEXER_NICE: i32 = 5;

/// Lower this thread's priority to `INDEXER_NICE` (never raise it).
fn lower_priority() {
    let Ok(now) = rustix::process::getpriority_process(None) else {
        return;
    };
    if now < INDEXER_NICE
        && let Err(error) = rustix::process::setpriority_process(None, INDEXER_NICE)
    {
        tracing::debug!(%error, "cannot lower the search indexer's priority");
    }
}

/// Open the index and start its indexer thread, whatever the environment says.
fn start_engine(store: &Arc<Store>) {
    let store = Arc::clone(store);
    let spawned = std::thread::Builder::new()
        .name("search-index".into())
        .spawn(move || {
            lower_priority();
            let pool = store.pool.clone();
            let engine = match Engine::open(&index_dir(&store), &pool) {
                Ok(engine) => Arc::new(engine),
                Err(error) => {
                    tracing::error!(%error, "cannot open the search index; search uses FTS5");
                    return;
                }
            };
            registry()
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(store.home.state_db(), Arc::clone(&engine));
            engine.run(&pool);
        });
    if let Err(error) = spawned {
        tracing::error!(%error, "cannot start the search indexer; search uses FTS5");
    }
}

fn payload(generation: &str, seq: i64) -> String {
    format!("alexandria-search {FORMAT} {generation} {seq}")
}

/// The queue position of an index made for this `generation`, if it is one.
fn parse_payload(payload: Option<&str>, generation: &str) -> Option<i64> {
    let mut parts = payload?.split(' ');
    if parts.next()? != "alexandria-search" || parts.next()? != FORMAT.to_string() {
        return None;
    }
    if parts.next()? != generation {
        return None;
    }
    parts.next()?.parse().ok()
}

fn open_dir(dir: &Path, schema: &Schema) -> Result<Index> {
    std::fs::create_dir_all(dir)?;
    let directory = MmapDirectory::open(dir)?;
    let index = Index::open_or_create(directory, schema.clone())?;
    index.load_metas()?;
    Ok(index)
}

impl Engine {
    fn open(dir: &Path, pool: &Pool) -> Result<Engine> {
        let (schema, fields) = schema();
        let mut index = match open_dir(dir, &schema) {
            Ok(index) => index,
            Err(error) => {
                tracing::warn!(%error, dir = %dir.display(), "search index unusable; rebuilding it");
                std::fs::remove_dir_all(dir)?;
                open_dir(dir, &schema)?
            }
        };
        let started = Arc::new(AtomicU64::new(0));
        index.set_tokenizers(tokenizers(&started));
        let generation: String = pool.get()?.query_row(
            "SELECT generation FROM search_state WHERE id = 1",
            [],
            |row| row.get(0),
        )?;
        let reader = index
            .reader_builder()
            .reload_policy(ReloadPolicy::Manual)
            .try_into()?;
        let searcher = reader.searcher();
        let snapshot = Arc::new(Snapshot { searcher, seq: 0 });
        Ok(Engine {
            index,
            reader,
            fields,
            generation,
            snapshot: RwLock::new(snapshot),
            overlay: Mutex::new(None),
            ready: AtomicBool::new(false),
            started,
            merged: Arc::new(AtomicBool::new(false)),
        })
    }

    fn snapshot(&self) -> Arc<Snapshot> {
        Arc::clone(&self.snapshot.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// One indexing thread, one merge thread (the daemon shares two cores with its
    /// clients), `WRITER_BUDGET` of terms per segment.
    fn writer(&self) -> IndexWriter {
        let options = IndexWriterOptions::builder()
            .num_worker_threads(1)
            .num_merge_threads(1)
            .memory_budget_per_thread(WRITER_BUDGET)
            .build();
        loop {
            match self.index.writer_with_options(options.clone()) {
                Ok(writer) => {
                    writer.set_merge_policy(Box::new(LogMergePolicy::default()));
                    return writer;
                }
                Err(error) => {
                    tracing::error!(%error, "cannot open the search index writer; retrying");
                    std::thread::sleep(Duration::from_secs(5));
                }
            }
        }
    }

    /// The indexer: rebuild or replay, then apply the queue as it grows. Never returns.
    fn run(&self, pool: &Pool) {
        let mut writer = self.writer();
        let mut feed = Feed::new();
        loop {
            match self.catch_up(pool, &mut writer, &mut feed) {
                Ok(()) => break,
                Err(error) => {
                    tracing::error!(%error, "search index catch-up failed; retrying");
                    self.rollback(&mut writer, &mut feed);
                    std::thread::sleep(Duration::from_secs(5));
                }
            }
        }
        self.ready.store(true, Ordering::Release);
        tracing::info!(seq = self.snapshot().seq, "search index ready");
        let mut trimmed = (0i64, Instant::now());
        loop {
            std::thread::sleep(POLL);
            if let Err(error) = self.step(pool, &mut writer, &mut feed) {
                tracing::warn!(%error, "applying the search queue failed; retrying");
                self.rollback(&mut writer, &mut feed);
                std::thread::sleep(Duration::from_secs(1));
            }
            // Committed entries are deleted seldom: every delete is a write transaction
            // that other writers of state.db would wait for.
            let seq = self.snapshot().seq;
            if seq > trimmed.0
                && (seq - trimmed.0 >= TRIM_EVERY || trimmed.1.elapsed() >= TRIM_AFTER)
            {
                match self.trim(pool, seq) {
                    Ok(()) => trimmed = (seq, Instant::now()),
                    Err(error) => tracing::warn!(%error, "cannot trim the search queue"),
                }
            }
            if self.merged.swap(false, Ordering::AcqRel) {
                let seq = self.snapshot().seq;
                match self.publish(seq) {
                    Ok(()) => feed.release.push(Instant::now() + TRIM_SOON),
                    Err(error) => tracing::warn!(%error, "cannot reload the merged search index"),
                }
            }
            if feed.release.first().is_some_and(|at| *at <= Instant::now()) {
                feed.release.remove(0);
                release_memory();
            }
        }
    }

    /// Apply what was queued since the last poll; commit when it is time.
    fn step(&self, pool: &Pool, writer: &mut IndexWriter, feed: &mut Feed) -> Result<()> {
        while self.feed(pool, writer, feed)? > 0 {}
        let waiting = feed.applied - self.snapshot().seq;
        if waiting <= 0 {
            if feed.bulk && feed.grew.elapsed() >= BULK_QUIET {
                self.end_bulk(writer, feed)?;
            }
            return Ok(());
        }
        let due = if feed.bulk || waiting > OVERLAY_MAX_FILES as i64 {
            feed.grew.elapsed() >= BULK_QUIET || feed.committed.elapsed() >= BULK_COMMIT_AFTER
        } else {
            // Under a stream of writes, commit at most once a second (the overlay has
            // the rest): every commit writes and syncs segment files, and merges follow.
            waiting >= COMMIT_ENTRIES || feed.committed.elapsed() >= COMMIT_AFTER
        };
        if due {
            self.commit(writer, feed)?;
        }
        Ok(())
    }

    /// Drop what was handed to the writer since its last commit.
    fn rollback(&self, writer: &mut IndexWriter, feed: &mut Feed) {
        if let Err(error) = writer.rollback() {
            tracing::warn!(%error, "search index rollback failed");
        }
        feed.applied = self.snapshot().seq;
        feed.sent = self.started.load(Ordering::Acquire);
        // The writer is a new one, with the default merge policy.
        feed.bulk = false;
    }

    /// A bulk load begins: no merges until it is over. Merging while segments keep
    /// coming cost a quarter of a build's CPU, and merged the same documents again
    /// and again; one merge at the end (`end_bulk`) is enough.
    fn bulk(&self, writer: &IndexWriter, feed: &mut Feed) {
        if !feed.bulk {
            writer.set_merge_policy(Box::new(NoMergePolicy));
            feed.bulk = true;
        }
    }

    /// The bulk load is committed and the queue has gone quiet: merge its segments
    /// into one in the background (the index answers meanwhile from the segments as
    /// they are; the reader reloads when the merge is done), and merge as usual again.
    fn end_bulk(&self, writer: &mut IndexWriter, feed: &mut Feed) -> Result<()> {
        writer.set_merge_policy(Box::new(LogMergePolicy::default()));
        feed.bulk = false;
        let segments = self.index.searchable_segment_ids()?;
        if segments.len() < 2 {
            return Ok(());
        }
        tracing::debug!(
            segments = segments.len(),
            "merging the bulk load's segments"
        );
        let merging = writer.merge(&segments);
        let merged = Arc::clone(&self.merged);
        std::thread::Builder::new()
            .name("search-merge".into())
            .spawn(move || match merging.wait() {
                Ok(_) => merged.store(true, Ordering::Release),
                Err(error) => tracing::warn!(%error, "merging the search index failed"),
            })?;
        Ok(())
    }

    /// Delete queue entries the published snapshot holds (never earlier: see `search`).
    fn trim(&self, pool: &Pool, seq: i64) -> Result<()> {
        pool.get()?
            .execute("DELETE FROM search_outbox WHERE seq <= ?1", params![seq])?;
        Ok(())
    }

    /// Rebuild from SQLite if the committed index is not this database's, then replay.
    fn catch_up(&self, pool: &Pool, writer: &mut IndexWriter, feed: &mut Feed) -> Result<()> {
        let metas = self.index.load_metas()?;
        match parse_payload(metas.payload.as_deref(), &self.generation) {
            Some(seq) => {
                self.publish(seq)?;
                feed.applied = seq;
            }
            None => self.rebuild(pool, writer, feed)?,
        }
        while self.feed(pool, writer, feed)? > 0 {}
        // A bulk load (a cold start with the disk's pages still coming in) is committed
        // by `step` once the queue has gone quiet; searches use FTS5 meanwhile.
        if feed.applied > self.snapshot().seq && !feed.bulk {
            self.commit(writer, feed)?;
        }
        self.trim(pool, self.snapshot().seq)
    }

    fn publish(&self, seq: i64) -> Result<()> {
        self.reader.reload()?;
        let snapshot = Arc::new(Snapshot {
            searcher: self.reader.searcher(),
            seq,
        });
        *self.snapshot.write().unwrap_or_else(|p| p.into_inner()) = snapshot;
        Ok(())
    }

    /// Commit what the writer holds, up to the queue entry `feed.applied`.
    fn commit(&self, writer: &mut IndexWriter, feed: &mut Feed) -> Result<()> {
        let mut prepared = writer.prepare_commit()?;
        prepared.set_payload(&payload(&self.generation, feed.applied));
        prepared.commit()?;
        let now = Instant::now();
        feed.committed = now;
        // Every document handed over is indexed once the commit is done.
        feed.sent = self.started.load(Ordering::Acquire);
        feed.release = vec![now + TRIM_SOON, now + TRIM_LATE];
        self.publish(feed.applied)
    }

    fn rebuild(&self, pool: &Pool, writer: &mut IndexWriter, feed: &mut Feed) -> Result<()> {
        let started = Instant::now();
        self.bulk(writer, feed);
        writer.delete_all_documents()?;
        let connection = pool.get()?;
        let transaction = connection.unchecked_transaction()?;
        let seq: i64 = transaction.query_row(
            "SELECT coalesce(max(seq), 0) FROM search_outbox",
            [],
            |row| row.get(0),
        )?;
        let mut statement = transaction.prepare(
            "SELECT c.rowid, c.body, f.id, f.workspace, f.layer
             FROM chunks c JOIN files f ON f.id = (c.rowid >> 20)",
        )?;
        let mut rows = statement.query([])?;
        let mut count = 0usize;
        while let Some(row) = rows.next()? {
            let file = FileRow {
                id: row.get(2)?,
                workspace: row.get(3)?,
                layer: row.get(4)?,
            };
            let document = self.document(&file, row.get(0)?, row.get(1)?);
            self.add(writer, feed, document)?;
            count += 1;
        }
        drop(rows);
        drop(statement);
        drop(transaction);
        feed.applied = seq;
        self.commit(writer, feed)?;
        tracing::info!(
            chunks = count,
            seconds = started.elapsed().as_secs_f64(),
            "search index rebuilt"
        );
        Ok(())
    }

    /// Hand the next batch of queued changes to the writer, uncommitted; the number of
    /// queue entries it held.
    fn feed(&self, pool: &Pool, writer: &mut IndexWriter, feed: &mut Feed) -> Result<usize> {
        let connection = pool.get()?;
        let transaction = connection.unchecked_transaction()?;
        let queued: Vec<(i64, i64)> = {
            let mut statement = transaction.prepare_cached(
                "SELECT seq, file_id FROM search_outbox WHERE seq > ?1 ORDER BY seq LIMIT ?2",
            )?;
            let rows = statement.query_map(params![feed.applied, BATCH], |row| {
                Ok((row.get(0)?, row.get(1)?))
            })?;
            rows.collect::<rusqlite::Result<_>>()?
        };
        let Some(&(last, _)) = queued.last() else {
            return Ok(0);
        };
        if last - self.snapshot().seq > OVERLAY_MAX_FILES as i64 {
            self.bulk(writer, feed);
        }
        let files: BTreeSet<i64> = queued.iter().map(|(_, id)| *id).collect();
        for id in &files {
            writer.delete_term(Term::from_field_u64(self.fields.file_id, *id as u64));
            for (rowid, file, body) in file_chunks(&transaction, *id)? {
                self.add(writer, feed, self.document(&file, rowid, body))?;
            }
        }
        feed.applied = last;
        feed.grew = Instant::now();
        Ok(queued.len())
    }

    /// Add a document, waiting while tantivy's indexing thread is `IN_FLIGHT` behind.
    fn add(
        &self,
        writer: &IndexWriter,
        feed: &mut Feed,
        document: tantivy::TantivyDocument,
    ) -> Result<()> {
        writer.add_document(document)?;
        feed.sent += 1;
        let deadline = Instant::now() + STALLED;
        while feed.sent > self.started.load(Ordering::Acquire) + IN_FLIGHT {
            if Instant::now() > deadline {
                return Err(EngineError::Stalled);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    fn document(&self, file: &FileRow, rowid: i64, body: String) -> tantivy::TantivyDocument {
        let mut document = tantivy::TantivyDocument::new();
        document.add_u64(self.fields.file_id, file.id as u64);
        document.add_u64(self.fields.rowid, rowid as u64);
        document.add_text(self.fields.workspace, &file.workspace);
        document.add_text(self.fields.layer, &file.layer);
        document.add_text(self.fields.pairs, &body);
        document.add_text(self.fields.body, body);
        document
    }

    /// Ranked search, or None when FTS5 must answer (not ready, a query the index
    /// cannot express, too much queued). `fts` is the query as FTS5 reads it.
    pub fn search(
        &self,
        connection: &Connection,
        query: &SearchQuery<'_>,
        fts: &str,
    ) -> Result<Option<(Vec<Ranked>, bool)>> {
        if !self.ready.load(Ordering::Acquire) {
            return Ok(None);
        }
        let Some(phrases) = parse(fts) else {
            return Ok(None);
        };
        let transaction = connection.unchecked_transaction()?;
        // The queue after the snapshot it continues, then the snapshot again: the
        // indexer deletes queue entries only after publishing a snapshot that holds
        // them, so entries past the newer snapshot were all still there when read.
        let before = self.snapshot().seq;
        let queued: Vec<(i64, i64)> = {
            let mut statement = transaction.prepare_cached(
                "SELECT seq, file_id FROM search_outbox WHERE seq > ?1 ORDER BY seq LIMIT ?2",
            )?;
            let cap = (OVERLAY_MAX_FILES * 4) as i64 + 1;
            let rows =
                statement.query_map(params![before, cap], |row| Ok((row.get(0)?, row.get(1)?)))?;
            rows.collect::<rusqlite::Result<_>>()?
        };
        if queued.len() > OVERLAY_MAX_FILES * 4 {
            return Ok(None);
        }
        let snapshot = self.snapshot();
        let queued: Vec<(i64, i64)> = queued
            .into_iter()
            .filter(|(seq, _)| *seq > snapshot.seq)
            .collect();
        let pending: BTreeSet<i64> = queued.iter().map(|(_, id)| *id).collect();
        if pending.len() > OVERLAY_MAX_FILES {
            return Ok(None);
        }
        let overlay = match queued.last() {
            None => None,
            Some(&(last, _)) => {
                Some(self.overlay(&transaction, (snapshot.seq, last, pending.len()), &pending)?)
            }
        };
        let main = &snapshot.searcher;
        let stats = Combined {
            main,
            overlay: overlay.as_ref().map(|o| &o.searcher),
        };
        let built = self.query(&phrases, query, &stats)?;
        let need = query.offset + query.limit + 1;
        let mut paths = PathCache::new(&transaction);
        let mut verifier = Verifier::new(&phrases);
        let mut ranked = Vec::new();
        // Committed index: pages queued since are left out (the overlay has them).
        let mut fetch = need + pending.len() * 4;
        loop {
            let top = main.search_with_statistics_provider(
                built.as_ref(),
                &TopDocs::with_limit(fetch).order_by_score(),
                &stats,
            )?;
            ranked.clear();
            for (score, address) in &top {
                if ranked.len() >= need {
                    break;
                }
                let (file_id, rowid) = ids(main, *address)?;
                if pending.contains(&file_id)
                    || !paths.in_scope(file_id, query)?
                    || !verifier.holds(&transaction, rowid)?
                {
                    continue;
                }
                ranked.push(Ranked {
                    score: *score,
                    file_id,
                    rowid,
                });
            }
            if ranked.len() >= need || top.len() < fetch {
                break;
            }
            if fetch >= MAX_CANDIDATES {
                return Ok(None);
            }
            fetch = (fetch * 4).min(MAX_CANDIDATES);
        }
        if let Some(overlay) = &overlay {
            let top = overlay.searcher.search_with_statistics_provider(
                built.as_ref(),
                &TopDocs::with_limit(need).order_by_score(),
                &stats,
            )?;
            for (score, address) in top {
                let (file_id, rowid) = ids(&overlay.searcher, address)?;
                if paths.in_scope(file_id, query)? && verifier.holds(&transaction, rowid)? {
                    ranked.push(Ranked {
                        score,
                        file_id,
                        rowid,
                    });
                }
            }
            ranked.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.rowid.cmp(&b.rowid)));
        }
        let more = ranked.len() > query.offset + query.limit;
        let page: Vec<Ranked> = ranked
            .into_iter()
            .skip(query.offset)
            .take(query.limit)
            .collect();
        Ok(Some((page, more)))
    }

    /// The tantivy query: every phrase must match, in the workspace (and layer).
    fn query(
        &self,
        phrases: &[Vec<String>],
        query: &SearchQuery<'_>,
        stats: &Combined<'_>,
    ) -> Result<Box<dyn Query>> {
        let mut clauses: Vec<(Occur, Box<dyn Query>)> = Vec::new();
        for terms in phrases {
            let clause: Box<dyn Query> = match terms.as_slice() {
                [one] => Box::new(TermQuery::new(
                    Term::from_field_text(self.fields.body, one),
                    IndexRecordOption::WithFreqs,
                )),
                [first, second] => Box::new(TermQuery::new(
                    Term::from_field_text(self.fields.pairs, &tokens::pair(first, second)),
                    IndexRecordOption::WithFreqs,
                )),
                // Every pair of the phrase; whether they follow each other is checked
                // in the text (`Verifier`).
                _ => Box::new(BooleanQuery::new(
                    tokens::pairs(terms)
                        .iter()
                        .map(|p| -> (Occur, Box<dyn Query>) {
                            (
                                Occur::Must,
                                Box::new(TermQuery::new(
                                    Term::from_field_text(self.fields.pairs, p),
                                    IndexRecordOption::WithFreqs,
                                )),
                            )
                        })
                        .collect(),
                )),
            };
            clauses.push((Occur::Must, clause));
        }
        // A filter every document passes is left out: it would only cost time.
        let mut filter = |field: Field, value: &str| -> Result<()> {
            let term = Term::from_field_text(field, value);
            if stats.doc_freq(&term)? < stats.max_doc() {
                clauses.push((
                    Occur::Must,
                    Box::new(TermQuery::new(term, IndexRecordOption::Basic)),
                ));
            }
            Ok(())
        };
        filter(self.fields.workspace, query.workspace)?;
        if let Some(layer) = query.layer {
            filter(self.fields.layer, layer.as_str())?;
        }
        Ok(if clauses.len() == 1 {
            clauses.remove(0).1
        } else {
            Box::new(BooleanQuery::new(clauses))
        })
    }

    /// The overlay for the files queued since the snapshot; reused while the queue
    /// does not change.
    fn overlay(
        &self,
        connection: &Connection,
        key: (i64, i64, usize),
        pending: &BTreeSet<i64>,
    ) -> Result<Arc<Overlay>> {
        let mut cached = self.overlay.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(overlay) = cached.as_ref()
            && overlay.key == key
        {
            return Ok(Arc::clone(overlay));
        }
        let (schema, _) = schema();
        let mut writer = Index::builder()
            .schema(schema)
            .tokenizers(tokenizers(&Arc::new(AtomicU64::new(0))))
            .single_segment_index_writer(RamDirectory::create(), 15_000_000)?;
        for id in pending {
            for (rowid, file, body) in file_chunks(connection, *id)? {
                writer.add_document(self.document(&file, rowid, body))?;
            }
        }
        let index = writer.finalize()?;
        let reader: IndexReader = index
            .reader_builder()
            .reload_policy(ReloadPolicy::Manual)
            .try_into()?;
        let overlay = Arc::new(Overlay {
            key,
            searcher: reader.searcher(),
        });
        *cached = Some(Arc::clone(&overlay));
        Ok(overlay)
    }
}

/// One ranked chunk.
#[derive(Debug, Clone, Copy)]
pub struct Ranked {
    pub score: f32,
    pub file_id: i64,
    pub rowid: i64,
}

struct FileRow {
    id: i64,
    workspace: String,
    layer: String,
}

/// The chunks of a file that still exists: (rowid, file, body).
fn file_chunks(connection: &Connection, id: i64) -> Result<Vec<(i64, FileRow, String)>> {
    let file = connection
        .prepare_cached("SELECT workspace, layer FROM files WHERE id = ?1")?
        .query_row(params![id], |row| Ok((row.get(0)?, row.get(1)?)))
        .optional()?;
    let Some((workspace, layer)) = file else {
        return Ok(Vec::new());
    };
    let low = id << super::CHUNK_BITS;
    let high = low | super::MAX_CHUNKS as i64;
    let mut statement = connection
        .prepare_cached("SELECT rowid, body FROM chunks WHERE rowid BETWEEN ?1 AND ?2")?;
    let rows = statement.query_map(params![low, high], |row| {
        Ok((row.get::<_, i64>(0)?, row.get::<_, String>(1)?))
    })?;
    let mut chunks = Vec::new();
    for row in rows {
        let (rowid, body) = row?;
        let file = FileRow {
            id,
            workspace: String::clone(&workspace),
            layer: String::clone(&layer),
        };
        chunks.push((rowid, file, body));
    }
    Ok(chunks)
}

fn ids(searcher: &Searcher, address: DocAddress) -> Result<(i64, i64)> {
    let segment = searcher.segment_reader(address.segment_ord);
    let fast = segment.fast_fields();
    let file_id = fast.u64("file_id")?.first(address.doc_id).unwrap_or(0);
    let rowid = fast.u64("rowid")?.first(address.doc_id).unwrap_or(0);
    Ok((file_id as i64, rowid as i64))
}

/// Paths of files by id, read once per search, for the `path` scope.
struct PathCache<'c> {
    connection: &'c Connection,
    known: HashMap<i64, bool>,
}

impl<'c> PathCache<'c> {
    fn new(connection: &'c Connection) -> Self {
        PathCache {
            connection,
            known: HashMap::new(),
        }
    }

    fn in_scope(&mut self, file_id: i64, query: &SearchQuery<'_>) -> Result<bool> {
        let Some(scope) = query.scope else {
            return Ok(true);
        };
        if let Some(known) = self.known.get(&file_id) {
            return Ok(*known);
        }
        let path: Option<String> = self
            .connection
            .prepare_cached("SELECT path FROM files WHERE id = ?1")?
            .query_row(params![file_id], |row| row.get(0))
            .optional()?;
        let inside = path.is_some_and(|p| scope.is_match(&p));
        self.known.insert(file_id, inside);
        Ok(inside)
    }
}

/// Whether a chunk holds the query's phrases of three words or more, in order: the
/// index has their pairs without positions, so a chunk with "a b" and "b c" but not
/// "a b c" is a candidate to drop. Each chunk is read once per search.
struct Verifier<'p> {
    long: Vec<&'p [String]>,
    known: HashMap<i64, bool>,
}

impl<'p> Verifier<'p> {
    fn new(phrases: &'p [Vec<String>]) -> Self {
        Verifier {
            long: phrases
                .iter()
                .filter(|p| p.len() > 2)
                .map(Vec::as_slice)
                .collect(),
            known: HashMap::new(),
        }
    }

    fn holds(&mut self, connection: &Connection, rowid: i64) -> Result<bool> {
        if self.long.is_empty() {
            return Ok(true);
        }
        if let Some(known) = self.known.get(&rowid) {
            return Ok(*known);
        }
        let body: Option<String> = connection
            .prepare_cached("SELECT body FROM chunks WHERE rowid = ?1")?
            .query_row(params![rowid], |row| row.get(0))
            .optional()?;
        let holds = body.is_some_and(|body| {
            self.long
                .iter()
                .all(|phrase| tokens::contains_phrase(&body, phrase))
        });
        self.known.insert(rowid, holds);
        Ok(holds)
    }
}

/// BM25 statistics of the committed index and the overlay together, so both score
/// alike and an empty committed index still gives finite scores.
struct Combined<'a> {
    main: &'a Searcher,
    overlay: Option<&'a Searcher>,
}

impl Combined<'_> {
    fn max_doc(&self) -> u64 {
        let count = |s: &Searcher| {
            s.segment_readers()
                .iter()
                .map(|r| u64::from(r.max_doc()))
                .sum::<u64>()
        };
        count(self.main) + self.overlay.map(count).unwrap_or(0)
    }
}

impl Bm25StatisticsProvider for Combined<'_> {
    fn total_num_tokens(&self, field: Field) -> tantivy::Result<u64> {
        let mut total = self.main.total_num_tokens(field)?;
        if let Some(overlay) = self.overlay {
            total += overlay.total_num_tokens(field)?;
        }
        Ok(total)
    }

    fn total_num_docs(&self) -> tantivy::Result<u64> {
        let mut total = Bm25StatisticsProvider::total_num_docs(self.main)?;
        if let Some(overlay) = self.overlay {
            total += Bm25StatisticsProvider::total_num_docs(overlay)?;
        }
        Ok(total)
    }

    fn doc_freq(&self, term: &Term) -> tantivy::Result<u64> {
        let mut total = self.main.doc_freq(term)?;
        if let Some(overlay) = self.overlay {
            total += overlay.doc_freq(term)?;
        }
        Ok(total)
    }
}

/// The phrases (each a list of terms) of an FTS5 query made only of "quoted phrases"
/// and plain words, all of which must match; None for anything else (OR, NOT, NEAR,
/// prefix*, ^, column filters, malformed input): FTS5 answers those.
pub fn parse(fts: &str) -> Option<Vec<Vec<String>>> {
    let mut phrases = Vec::new();
    let mut chars = fts.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let Some(first) = chars.next() else {
            break;
        };
        let text = if first == '"' {
            let mut text = String::new();
            loop {
                match chars.next()? {
                    '"' if chars.next_if_eq(&'"').is_some() => text.push('"'),
                    '"' => break,
                    c => text.push(c),
                }
            }
            // A phrase must be followed by a space or the end (not `*`, `:` …).
            if chars.peek().is_some_and(|c| !c.is_whitespace()) {
                return None;
            }
            text
        } else {
            let mut word = String::from(first);
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                word.push(c);
            }
            let bare = word
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || !c.is_ascii());
            if !bare || matches!(word.as_str(), "AND" | "OR" | "NOT" | "NEAR") {
                return None;
            }
            word
        };
        let terms = tokens::terms(&text);
        if terms.is_empty() || terms.iter().any(|t| t.len() > MAX_TERM) {
            return None;
        }
        phrases.push(terms);
    }
    (!phrases.is_empty()).then_some(phrases)
}

/// A hit of the committed index or the overlay, completed from SQLite: path, kind,
/// page, heading trail, and a snippet with the words in bold made from the chunk's
/// text (`snippet.rs`) as FTS5 makes it.
pub fn complete(
    connection: &Connection,
    fts: &str,
    ranked: &[Ranked],
) -> rusqlite::Result<Vec<Hit>> {
    let phrases = parse(fts).unwrap_or_default();
    let mut file =
        connection.prepare_cached("SELECT path, layer, kind FROM files WHERE id = ?1")?;
    let mut chunk =
        connection.prepare_cached("SELECT page, heading, body FROM chunks WHERE rowid = ?1")?;
    let mut hits = Vec::with_capacity(ranked.len());
    for hit in ranked {
        let Some((path, layer, kind)) = file
            .query_row(params![hit.file_id], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, String>(2)?,
                ))
            })
            .optional()?
        else {
            continue;
        };
        let Some((page, heading, body)) = chunk
            .query_row(params![hit.rowid], |row| {
                Ok((
                    row.get::<_, Option<i64>>(0)?,
                    row.get::<_, Option<String>>(1)?,
                    row.get::<_, String>(2)?,
                ))
            })
            .optional()?
        else {
            continue;
        };
        // No phrase in the text would mean our terms and the index's differ: the
        // chunk's opening words then.
        let snippet = super::snippet::snippet(&body, &phrases, SNIPPET_TOKENS)
            .unwrap_or_else(|| opening(&body));
        hits.push(Hit {
            path,
            layer,
            kind,
            page,
            heading: heading.unwrap_or_default(),
            snippet: snippet.trim().to_string(),
            score: f64::from(hit.score),
        });
    }
    Ok(hits)
}

/// Tokens in a snippet (FTS5's `snippet(…, 24)` in `search.rs`).
const SNIPPET_TOKENS: usize = 24;

fn opening(body: &str) -> String {
    let words: Vec<&str> = body.split_whitespace().take(24).collect();
    let mut text = words.join(" ");
    if body.split_whitespace().nth(24).is_some() {
        text.push('…');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_takes_words_and_phrases_only() {
        assert_eq!(
            parse("\"hello\" \"big world\""),
            Some(vec![
                vec!["hello".to_string()],
                vec!["big".into(), "world".into()]
            ])
        );
        assert_eq!(parse("wombats"), Some(vec![vec!["wombat".to_string()]]));
        assert_eq!(parse("\"unbalanced"), None);
        assert_eq!(parse("a OR b"), None);
        assert_eq!(parse("pre*"), None);
        assert_eq!(parse("\"pre\"*"), None);
        assert_eq!(parse("body:x"), None);
        assert_eq!(parse("\"+++\""), None);
        assert_eq!(parse("  "), None);
    }

    fn wait_until_committed(store: &Store) {
        let started = std::time::Instant::now();
        loop {
            let status = status(store);
            if status["ready"] == true && status["queued"] == 0 {
                return;
            }
            assert!(started.elapsed() < Duration::from_secs(60), "{status}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn paths(hits: &[Hit]) -> Vec<String> {
        let mut paths: Vec<String> = hits.iter().map(|h| h.path.clone()).collect();
        paths.sort();
        paths
    }

    /// The index finds what FTS5 finds, from its committed segments and from the
    /// overlay of changes not committed yet, and forgets deleted files at once.
    #[test]
    fn index_and_overlay_find_what_fts5_finds() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(alexandria_proto::Home::new(dir.path())).expect("store");
        let wiki = store.workspace_dir("global").join("wiki");
        std::fs::create_dir_all(wiki.join("sub")).expect("mkdir");
        for (name, text) in [
            (
                "a.md",
                "# A\n\nThe wombats were running through the big wombat burrow.\n",
            ),
            (
                "b.md",
                "# B\n\n## Burrows\nA big wombat digs. Café déjà vu.\n",
            ),
            (
                "sub/c.md",
                "# C\n\nquokka and wombat, the quick brown fox\n",
            ),
        ] {
            std::fs::write(wiki.join(name), text).expect("write");
        }
        super::super::catch_up(&store, "global").expect("catch up");
        start_engine(&store);
        wait_until_committed(&store);
        let engine = get(&store).expect("engine");
        let connection = store.pool.get().expect("conn");
        let check = |text: &str, expected: &[&str]| {
            let query = SearchQuery {
                workspace: "global",
                query: text,
                layer: None,
                scope: None,
                scope_sql: None,
                limit: 10,
                offset: 0,
            };
            let fts = super::super::fts_query(text).expect("query");
            assert!(
                engine
                    .search(&connection, &query, &fts)
                    .expect("search")
                    .is_some(),
                "the index answers {text}"
            );
            let (ranked, _) =
                super::super::search_ranked(&store, &connection, &query).expect("ranked");
            let (fts5, _) = super::super::search(&connection, &query).expect("fts5");
            assert_eq!(paths(&ranked), paths(&fts5), "{text}");
            let mut expected: Vec<String> = expected.iter().map(|p| format!("wiki/{p}")).collect();
            expected.sort();
            assert_eq!(paths(&ranked), expected, "{text}");
            assert!(
                ranked.iter().all(|h| h.snippet.contains("**")),
                "{ranked:?}"
            );
        };
        check("wombat", &["a.md", "b.md", "sub/c.md"]);
        check("\"big wombat\"", &["a.md", "b.md"]);
        check("\"the quick brown\"", &["sub/c.md"]);
        check("running wombats", &["a.md"]);
        check("cafe", &["b.md"]);
        check("zebra", &[]);

        // A change not committed to the index yet is found through the overlay.
        std::fs::write(wiki.join("d.md"), "# D\n\nzebra and big wombat\n").expect("write");
        super::super::refresh_paths(&store, "global", &["wiki/d.md".to_string()]).expect("refresh");
        check("zebra", &["d.md"]);
        check("\"big wombat\"", &["a.md", "b.md", "d.md"]);
        std::fs::remove_file(wiki.join("a.md")).expect("rm");
        super::super::refresh_paths(&store, "global", &["wiki/a.md".to_string()]).expect("refresh");
        check("\"big wombat\"", &["b.md", "d.md"]);
        wait_until_committed(&store);
        check("\"big wombat\"", &["b.md", "d.md"]);
        check("zebra", &["d.md"]);
    }

    #[test]
    fn payload_round_trips() {
        assert_eq!(parse_payload(Some(&payload("g1", 42)), "g1"), Some(42));
        assert_eq!(parse_payload(Some(&payload("g1", 42)), "g2"), None);
        assert_eq!(parse_payload(None, "g1"), None);
    }
}
