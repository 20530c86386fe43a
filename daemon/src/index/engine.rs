//! The search index (issue 15): tantivy, whose top-k collection skips blocks of
//! postings that cannot reach the k best (block-max WAND), so a word found in every
//! page costs what a rare one does. It is the only full-text index: `state.db` holds
//! the chunks' text (`chunks`) and what to index, not a second index of its own.
//!
//! `state.db` stays the system of record. A trigger on `files` queues every change of
//! a file's row in `search_outbox` inside the writer's own transaction (no search-index
//! commit in a write). A background thread applies the queue in batches and commits
//! tantivy with the last applied sequence, the database's generation and the common
//! words (below) as the commit payload. Files queued since that commit are searched in
//! a small in-memory overlay (built from SQLite when a search needs it) and left out of
//! the committed index, so an acknowledged write is found by the next search. On start
//! the queue is replayed from the payload's sequence; an index from another
//! `state.db` (or none, or one that cannot be opened) is rebuilt from SQLite. A search
//! that comes while the index is being built (a cold start, a rebuild, more queued than
//! the overlay takes) waits for it, up to `SEARCH_WAIT`, then answers from what is
//! committed and says so (`Answer::indexing`).
//!
//! A bulk load (a cold index, a rebuild) is handed to tantivy as it is queued and
//! committed once, as soon as the catch-up with the disk is over; tantivy's own queue is
//! kept short (`IN_FLIGHT`) and freed memory is handed back after commits
//! (`release_memory`), so the daemon's memory after a cold build is about what it was
//! before it.
//!
//! Terms are made by `tokens.rs` (FTS5's `porter unicode61 remove_diacritics 2`) inside
//! tantivy's indexing thread, with positions. A phrase is a position check, which costs
//! what its rarest word's postings do; so for the words common enough that this is
//! slow (`Common`: in at least `COMMON_SHARE` of the chunks of a sample, chosen with
//! their shares when the index is rebuilt and again when it has grown `GROWTH` times),
//! the index also holds each pair of neighbouring common words whose shares multiply to
//! `PAIR_PRODUCT` or more as one term, at the position of the first: a phrase of such
//! words is then a term or two. Snippets are made from the hit's
//! stored text (`snippet.rs`).

use std::collections::{BTreeSet, BinaryHeap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OptionalExtension, params};
use tantivy::directory::{MmapDirectory, RamDirectory};
use tantivy::indexer::{IndexWriterOptions, LogMergePolicy, NoMergePolicy};
use tantivy::query::{
    Bm25StatisticsProvider, BooleanQuery, ConstScoreQuery, ConstScorer, EmptyQuery, EnableScoring,
    Occur, PhraseQuery, Query, Scorer, TermQuery, Weight,
};
use tantivy::schema::{
    FAST, Field, IndexRecordOption, STRING, Schema, TextFieldIndexing, TextOptions,
};
use tantivy::tokenizer::{Token, TokenStream, Tokenizer, TokenizerManager};
use tantivy::{
    DocId, DocSet, Index, IndexReader, IndexWriter, ReloadPolicy, Score, Searcher, Term,
};

use super::query::{Expr, Phrase, Word};
use super::search::{Hit, SearchQuery};
use super::tokens;
use crate::db::Pool;
use crate::workspace::Store;

/// Bumped when the schema or the terms change: an index with another one is rebuilt.
const FORMAT: u32 = 6;
/// Writer memory: the terms held before a segment is written (tantivy's floor is 15 MB).
/// A segment written sorts its terms, builds their dictionary and the postings' block
/// maxima: with 32 MB, a cold index of 10k pages wrote one every few thousand pages and
/// spent a third more CPU than with 128 MB. Freed (and handed back) once written.
const WRITER_BUDGET: usize = 128_000_000;
/// tantivy's indexing threads (`Engine::writer`).
const INDEXING_THREADS: usize = 2;
/// Documents handed to tantivy's indexing thread and not tokenized yet. tantivy queues
/// up to 10,000; with each page's text that is tens of MiB the process keeps (glibc
/// does not give freed memory back on its own).
const IN_FLIGHT: u64 = 256;
/// The indexing thread took no document for this long: the batch is rolled back and
/// tried again.
const STALLED: Duration = Duration::from_secs(30);
/// How often the indexer looks at the queue (in a bulk load: `BULK_POLL`).
const POLL: Duration = Duration::from_millis(250);
const BULK_POLL: Duration = Duration::from_millis(10);
/// Queue entries read from SQLite at a time.
const BATCH: i64 = 2_000;
/// While writes keep coming, the index commits once this many entries wait, or after
/// `COMMIT_AFTER` since its last commit.
const COMMIT_ENTRIES: i64 = 64;
const COMMIT_AFTER: Duration = Duration::from_secs(1);
/// A bulk load (a cold index, a big outside change: more queued than the overlay
/// takes) is committed once the queue is drained and no catch-up with the disk is
/// under way (or a search waits), else once it stays quiet for `BULK_QUIET`, or every
/// `BULK_COMMIT_AFTER`: one segment set and one sync instead of one per poll, and no
/// merges while it runs.
const BULK_QUIET: Duration = Duration::from_secs(1);
const BULK_SETTLED: Duration = Duration::from_millis(100);
const BULK_COMMIT_AFTER: Duration = Duration::from_secs(60);
/// Memory freed by indexing is handed back to the system this long after a commit
/// (again after `TRIM_LATE`, when merges started by the commit are likely done).
const TRIM_SOON: Duration = Duration::from_secs(2);
const TRIM_LATE: Duration = Duration::from_secs(30);
/// Committed queue entries are deleted once this many piled up, or after `TRIM_AFTER`.
const TRIM_EVERY: i64 = 5_000;
const TRIM_AFTER: Duration = Duration::from_secs(30);
/// More files queued than this and a search waits for the indexer to commit them.
const OVERLAY_MAX_FILES: usize = 1_000;
/// How long a search waits for the index to be built or to catch up before it answers
/// from what the index holds (and says it is incomplete).
pub const SEARCH_WAIT: Duration = Duration::from_secs(20);
/// Terms longer than this (bytes) are left out of the index.
const MAX_TERM: usize = 255;

/// A prefix that begins more terms than this matches with one score for every page
/// (as Lucene's prefix queries do): a scored union of a few hundred terms, some in nearly
/// every page, leaves block-max WAND nothing to skip (`bed*` of the benchmark's 100k
/// pages, 164 terms: 122 ms, every match scored). Up to this many, each is scored.
const PREFIX_SCORED: usize = 16;
/// A word is common when it is in at least this share of the chunks of the sample, and
/// in two of them at least.
const COMMON_SHARE: f64 = 0.02;
/// Shares are kept in units of 1/`SHARE_UNITS`.
const SHARE_UNITS: u32 = 10_000;
/// A pair of neighbouring common words is indexed as one term when the product of their
/// shares is at least this (in `SHARE_UNITS`²): a phrase of two words is slow to check by
/// positions in proportion to the chunks holding both, about that product. Every pair of
/// words in 2 % of the chunks each made about seven times the distinct terms (107k
/// against 14.5k in a sample of the benchmark's 100k pages) and half again the
/// tokens, which made a cold index of 100k pages about a quarter slower; the pairs left
/// out are those of words rare enough that their phrase is checked by positions in
/// about a millisecond at 100k pages (`"beba daka"`, 78 % and 9 %: 4.7 ms unpaired).
const PAIR_PRODUCT: u32 = 200 * SHARE_UNITS; // 0.02
/// The sample the common words are chosen from: chunks of files spread over the
/// catalogue; a rebuild during the first catch-up waits until this many are there.
const SAMPLE_CHUNKS: usize = 4_000;
/// The catch-up indexes this many files spread over a workspace first (`SPREAD`).
const SAMPLE_FILES: i64 = super::SPREAD as i64;
/// At most this many common words (the most frequent).
const COMMON_MAX: usize = 4_096;
/// The index is rebuilt (common words chosen again) once it holds this many times the
/// chunks it held when they were chosen.
const GROWTH: u64 = 4;
/// Marks a pair term, so that it never starts with a word's letters (prefix search).
const PAIR_MARK: char = '\u{1}';

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
}

fn schema() -> (Schema, Fields) {
    let mut builder = Schema::builder();
    // Fast only: deletes find a file's chunks by this column (`FilesQuery`). Indexed,
    // its terms (one per file) made tantivy's term table, which every word of a cold
    // index probes, four times the size of the words' at 100k pages.
    let file_id = builder.add_u64_field("file_id", FAST);
    let rowid = builder.add_u64_field("rowid", FAST);
    // Fast too: a search of a workspace holding most of the index checks it per hit
    // instead of intersecting with its postings (`Filters`).
    let workspace = builder.add_text_field("workspace", STRING | FAST);
    let layer = builder.add_text_field("layer", STRING | FAST);
    let body = builder.add_text_field(
        "body",
        TextOptions::default().set_indexing_options(
            TextFieldIndexing::default()
                .set_tokenizer(TERMS)
                .set_index_option(IndexRecordOption::WithFreqsAndPositions),
        ),
    );
    let fields = Fields {
        file_id,
        rowid,
        workspace,
        layer,
        body,
    };
    (builder.build(), fields)
}

/// Our tokenizer's name in tantivy's registry.
const TERMS: &str = "alexandria-terms";

/// The words whose pairs the index holds, with their share of the chunks sampled (in
/// `SHARE_UNITS`; never 0).
#[derive(Debug, Default, PartialEq)]
pub struct Common {
    words: HashMap<String, u16, BuildFx>,
}

impl Common {
    /// The share of a common word, 0 for any other.
    fn share(&self, term: &str) -> u16 {
        if self.words.is_empty() {
            return 0;
        }
        self.words.get(term).copied().unwrap_or(0)
    }

    #[cfg(test)]
    fn contains(&self, term: &str) -> bool {
        self.share(term) > 0
    }

    /// Whether two neighbouring words are indexed as a pair term.
    fn pairs(&self, first: &str, second: &str) -> bool {
        paired(self.share(first), self.share(second))
    }
}

/// Whether words of these shares make a pair term (`PAIR_PRODUCT`).
fn paired(first: u16, second: u16) -> bool {
    first > 0 && second > 0 && u32::from(first) * u32::from(second) >= PAIR_PRODUCT
}

/// FxHash (rustc's): a few instructions per short string, which a set looked up for
/// every term indexed needs (SipHash cost a third of the tokenizer).
#[derive(Clone, Copy, Default)]
struct BuildFx;

impl std::hash::BuildHasher for BuildFx {
    type Hasher = rustc_hash::FxHasher;
    fn build_hasher(&self) -> rustc_hash::FxHasher {
        rustc_hash::FxHasher::default()
    }
}

/// The pair term of two neighbouring words.
fn pair(first: &str, second: &str) -> String {
    let mut text = String::with_capacity(first.len() + second.len() + 2);
    text.push(PAIR_MARK);
    text.push_str(first);
    text.push(' ');
    text.push_str(second);
    text
}

/// tantivy's view of `tokens::Terms`: every term of a text at its position, and each
/// pair of neighbouring common words at the position of the first. Terms longer than
/// `MAX_TERM` are left out. Counts the texts it started on: the indexer's throttle
/// (`IN_FLIGHT`).
#[derive(Clone)]
struct TermTokenizer {
    common: Arc<RwLock<Arc<Common>>>,
    started: Arc<AtomicU64>,
    stems: Stems,
}

/// Words already stemmed by this tokenizer (one per segment being written), with
/// whether each is common: most words of a text are words seen before, and looking one
/// up costs a fraction of stemming it and of the lookup in `Common`. Direct-mapped, each
/// slot holding its word and stem inline (a cache line), so a look-up touches one line:
/// a `HashMap<String, _>` of them cost a fifth of the indexing thread at 100k pages,
/// most of it reaching the keys' heap memory.
struct Stems {
    /// The common words the flags were taken from.
    common: Option<Arc<Common>>,
    slots: Vec<Slot>,
}

/// Words and stems up to this many bytes are cached.
const SLOT_BYTES: usize = 22;
const SLOTS: usize = 8192;

#[derive(Clone, Copy)]
struct Slot {
    /// 0: empty.
    word_len: u8,
    stem_len: u8,
    /// Its share if it is a common word, else 0.
    share: u16,
    word: [u8; SLOT_BYTES],
    stem: [u8; SLOT_BYTES],
}

const EMPTY_SLOT: Slot = Slot {
    word_len: 0,
    stem_len: 0,
    share: 0,
    word: [0; SLOT_BYTES],
    stem: [0; SLOT_BYTES],
};

impl Stems {
    fn new() -> Stems {
        Stems {
            common: None,
            slots: vec![EMPTY_SLOT; SLOTS],
        }
    }

    fn slot(word: &str) -> usize {
        use std::hash::{BuildHasher, Hasher};
        let mut hasher = BuildFx.build_hasher();
        hasher.write(word.as_bytes());
        (hasher.finish() as usize) & (SLOTS - 1)
    }

    /// The stem of `word` (into `stem`) and its share (`Common::share`), if cached.
    fn get(&self, word: &str, stem: &mut String) -> Option<u16> {
        let slot = &self.slots[Stems::slot(word)];
        let length = usize::from(slot.word_len);
        if length == 0 || length != word.len() || &slot.word[..length] != word.as_bytes() {
            return None;
        }
        stem.clear();
        stem.push_str(std::str::from_utf8(&slot.stem[..usize::from(slot.stem_len)]).ok()?);
        Some(slot.share)
    }

    fn put(&mut self, word: &str, stem: &str, share: u16) {
        if word.is_empty() || word.len() > SLOT_BYTES || stem.len() > SLOT_BYTES {
            return;
        }
        let slot = &mut self.slots[Stems::slot(word)];
        slot.word_len = word.len() as u8;
        slot.stem_len = stem.len() as u8;
        slot.share = share;
        slot.word[..word.len()].copy_from_slice(word.as_bytes());
        slot.stem[..stem.len()].copy_from_slice(stem.as_bytes());
    }

    fn clear(&mut self) {
        self.slots.fill(EMPTY_SLOT);
    }
}

impl Clone for Stems {
    fn clone(&self) -> Stems {
        Stems::new()
    }
}

struct TermStream<'a> {
    terms: tokens::Terms<'a>,
    stems: &'a mut Stems,
    /// Terms seen so far.
    count: usize,
    /// The previous term, when it is common (`previous_share` > 0).
    previous: String,
    previous_share: u16,
    /// The current term is still to be given (after its pair).
    word_due: bool,
    /// The current term (`token.text` holds the pair before it).
    term: String,
    token: Token,
}

impl Tokenizer for TermTokenizer {
    type TokenStream<'a> = TermStream<'a>;

    fn token_stream<'a>(&'a mut self, text: &'a str) -> TermStream<'a> {
        self.started.fetch_add(1, Ordering::Release);
        let common = Arc::clone(&self.common.read().unwrap_or_else(|p| p.into_inner()));
        if !self
            .stems
            .common
            .as_ref()
            .is_some_and(|c| Arc::ptr_eq(c, &common))
        {
            self.stems.clear();
            self.stems.common = Some(common);
        }
        TermStream {
            terms: tokens::Terms::new(text),
            stems: &mut self.stems,
            count: 0,
            previous: String::new(),
            previous_share: 0,
            word_due: false,
            term: String::new(),
            token: Token::default(),
        }
    }
}

impl TermStream<'_> {
    /// The next term into `self.term`, and its share (`Common::share`).
    fn next_term(&mut self) -> Option<u16> {
        loop {
            let (_, first) = self.terms.advance_unstemmed()?;
            if first.is_none() {
                continue; // folds to nothing: not a term
            }
            self.count += 1;
            if let Some(share) = self.stems.get(self.terms.term(), &mut self.term) {
                return Some(share);
            }
            let folded = self.terms.term().to_string();
            self.terms.stem();
            self.term.clear();
            self.term.push_str(self.terms.term());
            let share = self
                .stems
                .common
                .as_ref()
                .map_or(0, |c| c.share(&self.term));
            self.stems.put(&folded, &self.term, share);
            return Some(share);
        }
    }
}

impl TokenStream for TermStream<'_> {
    fn advance(&mut self) -> bool {
        if self.word_due {
            self.word_due = false;
            self.token.text.clear();
            self.token.text.push_str(&self.term);
            self.token.position = self.count - 1;
            return true;
        }
        while let Some(share) = self.next_term() {
            if self.term.len() > MAX_TERM {
                self.previous_share = 0;
                continue;
            }
            let pair = paired(self.previous_share, share);
            if pair {
                self.token.text.clear();
                self.token.text.push(PAIR_MARK);
                self.token.text.push_str(&self.previous);
                self.token.text.push(' ');
                self.token.text.push_str(&self.term);
                self.token.position = self.count - 2;
            }
            self.previous_share = share;
            if share > 0 {
                self.previous.clear();
                self.previous.push_str(&self.term);
            }
            if pair {
                self.word_due = true;
                return true;
            }
            self.token.text.clear();
            self.token.text.push_str(&self.term);
            self.token.position = self.count - 1;
            return true;
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

fn tokenizers(common: &Arc<RwLock<Arc<Common>>>, started: &Arc<AtomicU64>) -> TokenizerManager {
    let manager = TokenizerManager::default();
    manager.register(
        TERMS,
        TermTokenizer {
            common: Arc::clone(common),
            started: Arc::clone(started),
            stems: Stems::new(),
        },
    );
    manager
}

/// What the searches of the moment see: the committed index, the queue position it
/// holds and the common words it was made with.
struct Snapshot {
    searcher: Searcher,
    /// Its segments' fast fields (None: they could not be opened; each search then
    /// opens them, and says why).
    columns: Option<Vec<Columns>>,
    seq: i64,
    common: Arc<Common>,
}

impl Snapshot {
    fn new(searcher: Searcher, seq: i64, common: Arc<Common>) -> Snapshot {
        let columns = Columns::of(&searcher).ok();
        Snapshot {
            searcher,
            columns,
            seq,
            common,
        }
    }
}

/// Files queued since the snapshot, indexed in memory.
struct Overlay {
    key: (i64, i64, usize),
    searcher: Searcher,
    columns: Option<Vec<Columns>>,
}

/// The fast fields of one segment that `collect` reads per document, opened once per
/// searcher: opening them for every search (four columns per segment) was a twentieth
/// of a rare word's search.
struct Columns {
    file_ids: tantivy::columnar::Column<u64>,
    rowids: tantivy::columnar::Column<u64>,
    workspaces: Option<tantivy::columnar::StrColumn>,
    layers: Option<tantivy::columnar::StrColumn>,
}

impl Columns {
    /// Each segment's, in the searcher's order.
    fn of(searcher: &Searcher) -> Result<Vec<Columns>> {
        searcher
            .segment_readers()
            .iter()
            .map(|segment| {
                let fast = segment.fast_fields();
                Ok(Columns {
                    file_ids: fast.u64("file_id")?,
                    rowids: fast.u64("rowid")?,
                    workspaces: fast.str("workspace")?,
                    layers: fast.str("layer")?,
                })
            })
            .collect()
    }
}

/// What a commit's payload says.
struct Committed {
    seq: i64,
    /// Chunks in the index when its common words were settled.
    basis: u64,
    common: Arc<Common>,
}

pub struct Engine {
    dir: PathBuf,
    index: Index,
    reader: IndexReader,
    fields: Fields,
    generation: String,
    snapshot: RwLock<Arc<Snapshot>>,
    overlay: Mutex<Option<Arc<Overlay>>>,
    ready: AtomicBool,
    /// The common words the writer indexes with.
    writer_common: Arc<RwLock<Arc<Common>>>,
    /// Texts our tokenizer began to index (see `IN_FLIGHT`).
    started: Arc<AtomicU64>,
    /// Set when the merge that follows a bulk load is done (the reader then reloads).
    merged: Arc<AtomicBool>,
    /// Bumped at every publish (and when the index is ready), for waiting searches.
    published: (Mutex<u64>, Condvar),
    /// Searches waiting for the index: it commits as soon as it has applied the queue.
    waiting: AtomicUsize,
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
    /// Chunks in the index when its common words were settled (see `GROWTH`).
    basis: u64,
    /// The common words were chosen in this bulk load: `basis` follows its commits.
    fresh: bool,
    /// Documents handed over since the last commit, and whether every document was
    /// deleted since (a rebuild).
    added: u64,
    cleared: bool,
    /// Of `added`, the documents of files new to the index (`max_file`): what the
    /// index will have grown by once they are committed (`Engine::outgrown`).
    added_new: u64,
    /// No file of a higher id has documents in the index (committed or not): a file
    /// beyond it is new, with nothing to delete first. A cold build queues every file
    /// once, and a delete costs a query of every segment at the next commit.
    max_file: i64,
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
            basis: 0,
            fresh: false,
            added: 0,
            cleared: false,
            added_new: 0,
            max_file: i64::MAX,
        }
    }
}

/// Hand memory freed by indexing back to the system. glibc keeps freed memory in its
/// arenas and gives back only the top of the main heap by itself: after a cold build
/// the daemon kept hundreds of MiB it no longer used.
fn release_memory() {
    crate::memory::release();
}

/// The engine of each store (by its state.db), or None when it could not be opened.
fn registry() -> &'static Mutex<HashMap<PathBuf, Option<Arc<Engine>>>> {
    static ENGINES: OnceLock<Mutex<HashMap<PathBuf, Option<Arc<Engine>>>>> = OnceLock::new();
    ENGINES.get_or_init(Default::default)
}

/// The engine of this store, once `start` opened it.
pub fn get(store: &Store) -> Option<Arc<Engine>> {
    let engines = registry().lock().unwrap_or_else(|p| p.into_inner());
    engines.get(&store.home.state_db()).cloned().flatten()
}

/// The engine of this store, waiting (until `deadline`) for `start` to open it: the
/// daemon starts it beside its listeners, so the first call may come first. None when
/// it could not be opened, or was not started by then.
pub fn wait_for(store: &Store, deadline: Instant) -> Option<Arc<Engine>> {
    loop {
        {
            let engines = registry().lock().unwrap_or_else(|p| p.into_inner());
            if let Some(slot) = engines.get(&store.home.state_db()) {
                return slot.clone();
            }
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Whether the index answers searches, and how many queued changes it has not
/// committed yet (searched in the overlay, or waited for past a thousand files): for
/// `guide` and the benchmark, which waits for it before timing searches.
pub fn status(store: &Store) -> serde_json::Value {
    let Some(engine) = get(store) else {
        return serde_json::json!({"ready": false, "queued": null});
    };
    let seq = engine.snapshot().seq;
    // The queue's sequence has no gaps (AUTOINCREMENT; a rolled back insert takes its
    // number back), and only entries the snapshot holds are deleted: what follows the
    // snapshot is the last sequence less its own. Counting the rows cost a scan of the
    // queue for every `guide` during a cold index (100k rows at 100k pages).
    let queued: Option<i64> = crate::blocking::checkout(&store.pool)
        .ok()
        .and_then(|connection| {
            connection
                .prepare_cached("SELECT coalesce(max(seq), 0) FROM search_outbox")
                .and_then(|mut statement| statement.query_row([], |row| row.get::<_, i64>(0)))
                .ok()
                .map(|last| (last - seq).max(0))
        });
    serde_json::json!({"ready": engine.ready.load(Ordering::Acquire), "queued": queued})
}

/// Where the index lives.
pub fn index_dir(store: &Store) -> PathBuf {
    store.home.root().join("search-index")
}

/// Open (or create) the index of `store` and start its indexer thread. The thread
/// opens the index again (and rebuilds it) if its directory is deleted meanwhile.
pub fn start(store: &Arc<Store>) {
    let dir = index_dir(store);
    let engine = match Engine::open(&dir, &store.pool) {
        Ok(engine) => Arc::new(engine),
        Err(error) => {
            tracing::error!(%error, "cannot open the search index; search is unavailable");
            registry()
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(store.home.state_db(), None);
            return;
        }
    };
    register(store, &engine);
    let store = Arc::clone(store);
    let spawned = std::thread::Builder::new()
        .name("search-index".into())
        .spawn(move || {
            lower_priority();
            let mut engine = engine;
            loop {
                engine.run(&store);
                tracing::warn!(dir = %dir.display(), "the search index was deleted; rebuilding it");
                engine = loop {
                    match Engine::open(&dir, &store.pool) {
                        Ok(engine) => break Arc::new(engine),
                        Err(error) => {
                            tracing::error!(%error, "cannot open the search index; retrying");
                            std::thread::sleep(Duration::from_secs(5));
                        }
                    }
                };
                register(&store, &engine);
            }
        });
    if let Err(error) = spawned {
        tracing::error!(%error, "cannot start the search indexer");
    }
}

fn register(store: &Store, engine: &Arc<Engine>) {
    registry()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(store.home.state_db(), Some(Arc::clone(engine)));
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

fn payload(generation: &str, seq: i64, basis: u64, common: &Common) -> String {
    let mut words: Vec<String> = common
        .words
        .iter()
        .map(|(word, share)| format!("{word}:{share}"))
        .collect();
    words.sort_unstable();
    format!(
        "alexandria-search {FORMAT} {generation} {seq} {basis} {}",
        words.join(" ")
    )
}

/// What a commit made for this `generation` holds, if it is one.
fn parse_payload(payload: Option<&str>, generation: &str) -> Option<Committed> {
    let mut parts = payload?.split(' ');
    if parts.next()? != "alexandria-search" || parts.next()? != FORMAT.to_string() {
        return None;
    }
    if parts.next()? != generation {
        return None;
    }
    let seq = parts.next()?.parse().ok()?;
    let basis = parts.next()?.parse().ok()?;
    // Each word with its share; a word holds no ':' (the tokenizer splits there).
    let mut words = HashMap::default();
    for part in parts.filter(|w| !w.is_empty()) {
        let (word, share) = part.rsplit_once(':')?;
        let share: u16 = share.parse().ok().filter(|s| *s > 0)?;
        words.insert(word.to_string(), share);
    }
    Some(Committed {
        seq,
        basis,
        common: Arc::new(Common { words }),
    })
}

fn open_dir(dir: &Path, schema: &Schema) -> Result<Index> {
    std::fs::create_dir_all(dir)?;
    let directory = MmapDirectory::open(dir)?;
    let index = Index::open_or_create(directory, schema.clone())?;
    index.load_metas()?;
    Ok(index)
}

/// Whether a workspace's catch-up with the disk is under way or still to come: its
/// files are being queued (a bulk load is not over).
fn catching_up(store: &Store) -> bool {
    store.list_workspaces().iter().any(|slug| {
        let state = store.state(slug);
        !state.caught_up.load(Ordering::Acquire) || state.indexing.running.load(Ordering::Acquire)
    })
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
        let writer_common = Arc::new(RwLock::new(Arc::new(Common::default())));
        index.set_tokenizers(tokenizers(&writer_common, &started));
        let generation: String = pool.get()?.query_row(
            "SELECT generation FROM search_state WHERE id = 1",
            [],
            |row| row.get(0),
        )?;
        let reader = index
            .reader_builder()
            .reload_policy(ReloadPolicy::Manual)
            .try_into()?;
        let snapshot = Arc::new(Snapshot::new(
            reader.searcher(),
            0,
            Arc::new(Common::default()),
        ));
        Ok(Engine {
            dir: dir.to_path_buf(),
            index,
            reader,
            fields,
            generation,
            snapshot: RwLock::new(snapshot),
            overlay: Mutex::new(None),
            ready: AtomicBool::new(false),
            writer_common,
            started,
            merged: Arc::new(AtomicBool::new(false)),
            published: (Mutex::new(0), Condvar::new()),
            waiting: AtomicUsize::new(0),
        })
    }

    fn snapshot(&self) -> Arc<Snapshot> {
        Arc::clone(&self.snapshot.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Wake the searches waiting for the index.
    fn notify(&self) {
        let (count, changed) = &self.published;
        *count.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        changed.notify_all();
    }

    /// Wait (until `deadline` at most) for the next publish after `seen`; the count now.
    fn wait_for_publish(&self, seen: u64, deadline: Instant) -> u64 {
        let (count, changed) = &self.published;
        let mut now = count.lock().unwrap_or_else(|p| p.into_inner());
        while *now == seen {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                break;
            };
            now = changed
                .wait_timeout(now, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        *now
    }

    fn publish_count(&self) -> u64 {
        *self.published.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Two indexing threads (a cold index keeps both cores busy: the catch-up with the
    /// disk is done long before the index, whose tokenizing and term hashing are most
    /// of a build; measured at 100k pages, ready after 25 s instead of 50), one merge
    /// thread, `WRITER_BUDGET` of terms per segment each.
    fn writer(&self) -> IndexWriter {
        let options = IndexWriterOptions::builder()
            .num_worker_threads(INDEXING_THREADS)
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

    /// Whether the index's directory is gone (deleted by hand while the daemon runs):
    /// nothing can be committed to it any more.
    fn lost(&self) -> bool {
        !self.dir.join("meta.json").exists()
    }

    /// The indexer: rebuild or replay, then apply the queue as it grows. Returns only
    /// when the index's directory was deleted (`start` then opens a new one).
    fn run(&self, store: &Store) {
        let pool = &store.pool;
        let mut writer = self.writer();
        let mut feed = Feed::new();
        loop {
            match self.catch_up(store, &mut writer, &mut feed) {
                Ok(()) => break,
                Err(_) if self.lost() => return,
                Err(error) => {
                    tracing::error!(%error, "search index catch-up failed; retrying");
                    self.rollback(&mut writer, &mut feed);
                    std::thread::sleep(Duration::from_secs(5));
                }
            }
        }
        self.ready.store(true, Ordering::Release);
        self.notify();
        tracing::info!(seq = self.snapshot().seq, "search index ready");
        let mut trimmed = (0i64, Instant::now());
        loop {
            // A bulk load is followed closely: the catch-up queues a batch every few
            // tens of milliseconds, and tantivy's thread would wait for it.
            std::thread::sleep(if feed.bulk { BULK_POLL } else { POLL });
            if let Err(error) = self.step(store, &mut writer, &mut feed) {
                if self.lost() {
                    return;
                }
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
                match self.reload() {
                    Ok(()) => feed.release.push(Instant::now() + TRIM_SOON),
                    Err(error) => tracing::warn!(%error, "cannot reload the merged search index"),
                }
            }
            if feed.release.first().is_some_and(|at| *at <= Instant::now()) {
                feed.release.remove(0);
                release_memory();
            }
            if self.grown(&feed) {
                tracing::info!(
                    chunks = self.snapshot().searcher.num_docs(),
                    basis = feed.basis,
                    "the search index has grown: choosing its common words again"
                );
                if let Err(error) = self.rebuild(store, &mut writer, &mut feed) {
                    if self.lost() {
                        return;
                    }
                    tracing::warn!(%error, "rebuilding the search index failed");
                    self.rollback(&mut writer, &mut feed);
                }
            }
        }
    }

    /// Nothing to apply, and the index holds `GROWTH` times the chunks it held when its
    /// common words were chosen.
    fn grown(&self, feed: &Feed) -> bool {
        let snapshot = self.snapshot();
        !feed.bulk
            && feed.applied == snapshot.seq
            && snapshot.searcher.num_docs() >= GROWTH * feed.basis.max(16)
    }

    /// Apply what was queued since the last poll; commit when it is time.
    fn step(&self, store: &Store, writer: &mut IndexWriter, feed: &mut Feed) -> Result<()> {
        while self.feed(store, writer, feed)? > 0 {}
        let waiting = feed.applied - self.snapshot().seq;
        if waiting <= 0 {
            if feed.bulk && feed.grew.elapsed() >= BULK_QUIET {
                self.end_bulk(writer, feed)?;
            }
            return Ok(());
        }
        let due = if feed.bulk || waiting > OVERLAY_MAX_FILES as i64 {
            let settled = self.waiting.load(Ordering::Acquire) > 0
                || (feed.grew.elapsed() >= BULK_SETTLED && !catching_up(store));
            settled
                || feed.grew.elapsed() >= BULK_QUIET
                || feed.committed.elapsed() >= BULK_COMMIT_AFTER
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
        let snapshot = self.snapshot();
        feed.applied = snapshot.seq;
        feed.sent = self.started.load(Ordering::Acquire);
        feed.added = 0;
        feed.added_new = 0;
        feed.cleared = false;
        // The writer is a new one, with the default merge policy.
        feed.bulk = false;
        *self
            .writer_common
            .write()
            .unwrap_or_else(|p| p.into_inner()) = Arc::clone(&snapshot.common);
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
        feed.fresh = false;
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
    fn catch_up(&self, store: &Store, writer: &mut IndexWriter, feed: &mut Feed) -> Result<()> {
        let pool = &store.pool;
        let metas = self.index.load_metas()?;
        match parse_payload(metas.payload.as_deref(), &self.generation) {
            Some(committed) => {
                *self
                    .writer_common
                    .write()
                    .unwrap_or_else(|p| p.into_inner()) = Arc::clone(&committed.common);
                feed.applied = committed.seq;
                feed.basis = committed.basis;
                self.publish(committed.seq, committed.common)?;
                feed.max_file = self.max_file_committed()?;
            }
            None => self.rebuild(store, writer, feed)?,
        }
        while self.feed(store, writer, feed)? > 0 {}
        // A bulk load (a cold start with the disk's pages still coming in) is committed
        // by `step` once it is over.
        if feed.applied > self.snapshot().seq && !feed.bulk {
            self.commit(writer, feed)?;
        }
        // A bulk load still to commit is trimmed after its commit (`run`). The trim is
        // a write, the first since the catch-up with the disk filled the WAL with the
        // pages' text (readers kept SQLite's checkpoints from finishing meanwhile), and
        // the transaction that commits first runs the checkpoint: at 100k pages it
        // wrote the WAL into state.db and synced it for 0.5-1.4 s before the index
        // could commit, with both cores idle.
        if feed.bulk {
            return Ok(());
        }
        self.trim(pool, self.snapshot().seq)
    }

    /// The highest file id with documents in the committed index.
    fn max_file_committed(&self) -> Result<i64> {
        let mut max = 0;
        for segment in self.snapshot().searcher.segment_readers() {
            if segment.max_doc() > 0 {
                max = max.max(segment.fast_fields().u64("file_id")?.max_value() as i64);
            }
        }
        Ok(max)
    }

    fn publish(&self, seq: i64, common: Arc<Common>) -> Result<()> {
        self.reader.reload()?;
        let snapshot = Arc::new(Snapshot::new(self.reader.searcher(), seq, common));
        *self.snapshot.write().unwrap_or_else(|p| p.into_inner()) = snapshot;
        self.notify();
        Ok(())
    }

    /// The reader again, for the same commit (a merge finished).
    fn reload(&self) -> Result<()> {
        let snapshot = self.snapshot();
        self.publish(snapshot.seq, Arc::clone(&snapshot.common))
    }

    /// Commit what the writer holds, up to the queue entry `feed.applied`.
    fn commit(&self, writer: &mut IndexWriter, feed: &mut Feed) -> Result<()> {
        if feed.bulk {
            // Test-only: a slow bulk load, or a daemon killed in the middle of one.
            if let Some(delay) = crate::faults::delay_for("search-index-commit") {
                std::thread::sleep(delay);
            }
            crate::faults::crash_point("search-index-bulk-commit");
        }
        let common = Arc::clone(&self.writer_common.read().unwrap_or_else(|p| p.into_inner()));
        let basis = if feed.fresh {
            // The chunks once this commit is done: what was committed (unless deleted
            // since) and what was added since; a file indexed again counts twice (an
            // estimate: only the growth rule uses it).
            let kept = if feed.cleared {
                0
            } else {
                self.snapshot().searcher.num_docs()
            };
            kept + feed.added
        } else {
            feed.basis
        };
        let mut prepared = writer.prepare_commit()?;
        prepared.set_payload(&payload(&self.generation, feed.applied, basis, &common));
        prepared.commit()?;
        let now = Instant::now();
        feed.committed = now;
        // Every document handed over is indexed once the commit is done.
        feed.sent = self.started.load(Ordering::Acquire);
        if feed.bulk {
            // The segments' memory, freed by the commit (a few ms).
            release_memory();
        }
        feed.release = vec![now + TRIM_SOON, now + TRIM_LATE];
        feed.basis = basis;
        feed.added = 0;
        feed.added_new = 0;
        feed.cleared = false;
        self.publish(feed.applied, common)?;
        Ok(())
    }

    /// Choose the common words from a sample of the chunks `state.db` holds. During
    /// the first catch-up, wait until it has queued `SAMPLE_CHUNKS` (or is over).
    fn choose_common(&self, store: &Store) -> Result<Common> {
        let connection = store.pool.get()?;
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let chunks: i64 = connection.query_row(
                &format!("SELECT count(*) FROM (SELECT 1 FROM chunks LIMIT {SAMPLE_CHUNKS})"),
                [],
                |row| row.get(0),
            )?;
            if chunks as usize >= SAMPLE_CHUNKS || !catching_up(store) || Instant::now() > deadline
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let max_file: i64 =
            connection.query_row("SELECT coalesce(max(id), 0) FROM files", [], |row| {
                row.get(0)
            })?;
        let every = (max_file / SAMPLE_FILES).max(1);
        let mut statement =
            connection.prepare_cached("SELECT body FROM chunks WHERE rowid BETWEEN ?1 AND ?2")?;
        let mut frequency: HashMap<String, (u32, u32), BuildFx> = HashMap::default();
        let mut sampled = 0u32;
        let mut id = 1;
        while id <= max_file && (sampled as usize) < SAMPLE_CHUNKS {
            let low = id << super::CHUNK_BITS;
            let high = low | super::MAX_CHUNKS as i64;
            let mut rows = statement.query(params![low, high])?;
            while let Some(row) = rows.next()? {
                let body: String = row.get(0)?;
                sampled += 1;
                let mut terms = tokens::Terms::new(&body);
                while terms.advance().is_some() {
                    let term = terms.term();
                    if term.len() > MAX_TERM {
                        continue;
                    }
                    match frequency.get_mut(term) {
                        Some((count, last)) => {
                            if *last != sampled {
                                *count += 1;
                                *last = sampled;
                            }
                        }
                        None => {
                            frequency.insert(term.to_string(), (1, sampled));
                        }
                    }
                }
            }
            id += every;
        }
        let least = ((f64::from(sampled) * COMMON_SHARE).ceil() as u32).max(2);
        let mut common: Vec<(u32, String)> = frequency
            .into_iter()
            .filter(|(_, (count, _))| *count >= least)
            .map(|(term, (count, _))| (count, term))
            .collect();
        common.sort_unstable_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        common.truncate(COMMON_MAX);
        tracing::debug!(
            sampled,
            common = common.len(),
            "common words of the search index"
        );
        let share = |count: u32| {
            let units = u64::from(count) * u64::from(SHARE_UNITS) / u64::from(sampled.max(1));
            u16::try_from(units.clamp(1, u64::from(SHARE_UNITS))).unwrap_or(1)
        };
        Ok(Common {
            words: common
                .into_iter()
                .map(|(count, term)| (term, share(count)))
                .collect(),
        })
    }

    fn rebuild(&self, store: &Store, writer: &mut IndexWriter, feed: &mut Feed) -> Result<()> {
        let started = Instant::now();
        // Whatever the writer holds goes (and would have been tokenized with the old
        // common words).
        self.rollback(writer, feed);
        let common = Arc::new(self.choose_common(store)?);
        *self
            .writer_common
            .write()
            .unwrap_or_else(|p| p.into_inner()) = Arc::clone(&common);
        self.bulk(writer, feed);
        feed.fresh = true;
        writer.delete_all_documents()?;
        feed.cleared = true;
        feed.max_file = 0;
        let connection = store.pool.get()?;
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
            feed.max_file = feed.max_file.max(file.id);
            let document = self.document(&file, row.get(0)?, row.get(1)?);
            self.add(writer, feed, document)?;
            count += 1;
        }
        drop(rows);
        drop(statement);
        drop(transaction);
        feed.applied = seq;
        // While the files are still being caught up (a cold start, a big import) a bulk
        // load follows, and its commit (`step`) takes these documents too. Committing
        // them here wrote and synced a few thousand documents' segments while tantivy's
        // threads waited (0.3-0.5 s of a 100k cold index with a core idle), and left
        // small segments for the end's merge. Killed before that commit, the next start
        // rebuilds: the committed index is not this database's.
        let later = feed.bulk && catching_up(store);
        if !later {
            self.commit(writer, feed)?;
        }
        tracing::info!(
            chunks = count,
            common = common.words.len(),
            seconds = started.elapsed().as_secs_f64(),
            committed = !later,
            "search index rebuilt"
        );
        Ok(())
    }

    /// Hand the next batch of queued changes to the writer, uncommitted; the number of
    /// queue entries it held.
    fn feed(&self, store: &Store, writer: &mut IndexWriter, feed: &mut Feed) -> Result<usize> {
        let connection = store.pool.get()?;
        let transaction = connection.unchecked_transaction()?;
        let queued: Vec<(i64, i64)> = {
            // The batch written into the statement (a bound LIMIT: `search_now`).
            let mut statement = transaction.prepare_cached(&format!(
                "SELECT seq, file_id FROM search_outbox WHERE seq > ?1 ORDER BY seq LIMIT {BATCH}"
            ))?;
            let rows =
                statement.query_map(params![feed.applied], |row| Ok((row.get(0)?, row.get(1)?)))?;
            rows.collect::<rusqlite::Result<_>>()?
        };
        let Some(&(last, _)) = queued.last() else {
            return Ok(0);
        };
        if last - self.snapshot().seq > OVERLAY_MAX_FILES as i64 {
            if !feed.fresh && self.outgrown(&transaction, feed)? {
                drop(transaction);
                drop(connection);
                tracing::info!(
                    chunks = self.snapshot().searcher.num_docs(),
                    basis = feed.basis,
                    "a bulk load outgrows the search index's common words: choosing them again first"
                );
                self.rebuild(store, writer, feed)?;
                return Ok(queued.len());
            }
            self.bulk(writer, feed);
        }
        let files: BTreeSet<i64> = queued.iter().map(|(_, id)| *id).collect();
        // The batch's earlier versions are deleted before its documents are added (a
        // delete applies to the documents added before it): one query for the batch,
        // each a pass over the file ids of the index.
        let known: Vec<u64> = files
            .iter()
            .filter(|id| **id <= feed.max_file)
            .map(|id| *id as u64)
            .collect();
        if !known.is_empty() {
            writer.delete_query(Box::new(FilesQuery(Arc::new(known))))?;
        }
        for id in &files {
            let new = *id > feed.max_file;
            for (rowid, file, body) in file_chunks(&transaction, *id)? {
                self.add(writer, feed, self.document(&file, rowid, body))?;
                feed.added_new += u64::from(new);
            }
            feed.max_file = feed.max_file.max(*id);
        }
        feed.applied = last;
        feed.grew = Instant::now();
        Ok(queued.len())
    }

    /// A bulk load (beginning, or under way) makes the index grow enough that the growth
    /// rule (`grown`) would rebuild it once the load is committed: the copy of a big
    /// folder into a workspace of a few pages, a pull of thousands of pages. Indexing it
    /// all with common words chosen from those few pages and then again (a cold index of
    /// 100k pages into a workspace of 14 chunks: ready after 13.8 s, then 12 s more and
    /// 50 s of CPU in all) costs more than rebuilding first. At the start of a bulk load
    /// the new files still queued count (a document each at least); under way, the
    /// documents of new files handed over.
    fn outgrown(&self, transaction: &Connection, feed: &Feed) -> Result<bool> {
        let threshold = GROWTH * feed.basis.max(16);
        let mut documents = self.snapshot().searcher.num_docs() + feed.added_new;
        if documents < threshold && !feed.bulk {
            let queued: i64 = transaction.query_row(
                "SELECT count(DISTINCT file_id) FROM search_outbox WHERE seq > ?1 AND file_id > ?2",
                params![feed.applied, feed.max_file],
                |row| row.get(0),
            )?;
            documents += u64::try_from(queued).unwrap_or(0);
        }
        Ok(documents >= threshold)
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
        feed.added += 1;
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
        document.add_text(self.fields.body, body);
        document
    }

    /// Ranked search. Waits (up to `SEARCH_WAIT`) while the index is being built or has
    /// more queued than the overlay takes; then answers from what it has committed,
    /// with `indexing` set.
    pub fn search(
        &self,
        connection: &Connection,
        query: &SearchQuery<'_>,
        expr: &Expr,
    ) -> Result<Answer> {
        // Test-only: a shorter wait.
        let wait = crate::faults::delay_for("search-wait").unwrap_or(SEARCH_WAIT);
        let deadline = Instant::now() + wait;
        let mut seen = self.publish_count();
        let mut registered = false;
        let answer = loop {
            if self.ready.load(Ordering::Acquire) {
                match self.search_now(connection, query, expr, false)? {
                    Some(answer) => break answer,
                    None if Instant::now() >= deadline => {
                        break self
                            .search_now(connection, query, expr, true)?
                            .unwrap_or_default();
                    }
                    None => {}
                }
            } else if Instant::now() >= deadline {
                break Answer {
                    indexing: true,
                    ..Answer::default()
                };
            }
            if !registered {
                registered = true;
                self.waiting.fetch_add(1, Ordering::AcqRel);
            }
            seen = crate::blocking::section(|| self.wait_for_publish(seen, deadline));
        };
        if registered {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
        }
        Ok(answer)
    }

    /// The search on the index as it is: None when more is queued than the overlay
    /// takes, unless `anyway` (then the committed index alone answers).
    fn search_now(
        &self,
        connection: &Connection,
        query: &SearchQuery<'_>,
        expr: &Expr,
        anyway: bool,
    ) -> Result<Option<Answer>> {
        let transaction = connection.unchecked_transaction()?;
        // The queue after the snapshot it continues, then the snapshot again: the
        // indexer deletes queue entries only after publishing a snapshot that holds
        // them, so entries past the newer snapshot were all still there when read.
        let before = self.snapshot().seq;
        let queued: Vec<(i64, i64)> = {
            // The cap written into the statement: SQLite prepares a statement with a
            // bound LIMIT again each time a value is bound to it (its plan uses the
            // value), which was an eighth of a rare word's search.
            let mut statement = transaction.prepare_cached(&format!(
                "SELECT seq, file_id FROM search_outbox WHERE seq > ?1 ORDER BY seq LIMIT {}",
                OVERLAY_MAX_FILES * 4 + 1
            ))?;
            let rows =
                statement.query_map(params![before], |row| Ok((row.get(0)?, row.get(1)?)))?;
            rows.collect::<rusqlite::Result<_>>()?
        };
        let snapshot = self.snapshot();
        let queued: Vec<(i64, i64)> = queued
            .into_iter()
            .filter(|(seq, _)| *seq > snapshot.seq)
            .collect();
        let pending: HashSet<i64, BuildFx> = queued.iter().map(|(_, id)| *id).collect();
        let behind = queued.len() > OVERLAY_MAX_FILES * 4 || pending.len() > OVERLAY_MAX_FILES;
        if behind && !anyway {
            return Ok(None);
        }
        let (pending, overlay) = match queued.last() {
            Some(&(last, _)) if !behind => {
                let key = (snapshot.seq, last, pending.len());
                let overlay = self.overlay(&transaction, key, &pending, &snapshot.common)?;
                (pending, Some(overlay))
            }
            // Behind: the committed index as it is.
            _ => (HashSet::default(), None),
        };
        let main = &snapshot.searcher;
        let stats = Combined {
            main,
            overlay: overlay.as_ref().map(|o| &o.searcher),
        };
        let compiled = self.compile(expr, &snapshot.common, &stats)?;
        let (built, filters) = self.scoped(compiled.query, query, &stats)?;
        let need = query.offset + query.limit + 1;
        let mut check = Check {
            connection: &transaction,
            query,
            expr: (!compiled.exact).then_some(expr),
            scope: ScopeCheck::default(),
            error: None,
        };
        let mut ranked = collect(
            main,
            snapshot.columns.as_deref(),
            built.as_ref(),
            &stats,
            need,
            &filters,
            &pending,
            &mut check,
        )?;
        if let Some(overlay) = &overlay {
            ranked.extend(collect(
                &overlay.searcher,
                overlay.columns.as_deref(),
                built.as_ref(),
                &stats,
                need,
                &filters,
                &HashSet::default(),
                &mut check,
            )?);
            ranked.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.rowid.cmp(&b.rowid)));
            ranked.truncate(need);
        }
        let more = ranked.len() > query.offset + query.limit;
        let hits: Vec<Ranked> = ranked
            .into_iter()
            .skip(query.offset)
            .take(query.limit)
            .collect();
        Ok(Some(Answer {
            hits,
            more,
            indexing: behind || !self.ready.load(Ordering::Acquire),
        }))
    }

    /// The workspace and layer: in the query when they are a small part of the index
    /// (their postings are then short, and drive the intersection), else checked per
    /// hit (an intersection with the postings of nearly every document would score
    /// every match, where block-max WAND skips most of them).
    fn scoped(
        &self,
        built: Box<dyn Query>,
        query: &SearchQuery<'_>,
        stats: &Combined<'_>,
    ) -> Result<(Box<dyn Query>, Filters)> {
        let total = stats.max_doc();
        let mut clauses: Vec<(Occur, Box<dyn Query>)> = vec![(Occur::Must, built)];
        let mut filters = Filters::default();
        let mut scope = |field: Field, value: &str| -> Result<Option<String>> {
            let term = Term::from_field_text(field, value);
            let count = stats.doc_freq(&term)?;
            if count >= total {
                Ok(None)
            } else if count * 2 >= total {
                Ok(Some(value.to_string()))
            } else {
                clauses.push((
                    Occur::Must,
                    Box::new(TermQuery::new(term, IndexRecordOption::Basic)),
                ));
                Ok(None)
            }
        };
        filters.workspace = scope(self.fields.workspace, query.workspace)?;
        if let Some(layer) = query.layer {
            filters.layer = scope(self.fields.layer, layer.as_str())?;
        }
        let built = if clauses.len() == 1 {
            clauses.remove(0).1
        } else {
            Box::new(BooleanQuery::new(clauses))
        };
        Ok((built, filters))
    }

    /// The tantivy query for an expression, and whether it matches exactly the chunks
    /// the expression does (else every candidate is checked in its text).
    fn compile(&self, expr: &Expr, common: &Common, stats: &Combined<'_>) -> Result<Compiled> {
        Ok(match expr {
            Expr::Nothing => Compiled::exact(Box::new(EmptyQuery)),
            Expr::Phrase(phrase) => self.phrase(phrase, common, stats)?,
            Expr::Near { phrases, .. } => {
                let mut clauses = Vec::new();
                for phrase in phrases {
                    clauses.push((Occur::Must, self.phrase(phrase, common, stats)?.query));
                }
                Compiled {
                    query: Box::new(BooleanQuery::new(clauses)),
                    exact: false,
                }
            }
            Expr::And(..) | Expr::Or(..) => {
                // One query for a chain of the same operator (`a b c …` is a chain of
                // ANDs): nested two by two, a long query overflowed the stack.
                let and = matches!(expr, Expr::And(..));
                let occur = if and { Occur::Must } else { Occur::Should };
                let mut exact = true;
                let mut clauses = Vec::new();
                for operand in operands(expr, and) {
                    let compiled = self.compile(operand, common, stats)?;
                    exact &= compiled.exact;
                    clauses.push((occur, compiled.query));
                }
                Compiled {
                    exact,
                    query: Box::new(BooleanQuery::new(clauses)),
                }
            }
            Expr::Not(a, b) => {
                let a = self.compile(a, common, stats)?;
                let b = self.compile(b, common, stats)?;
                if b.exact {
                    Compiled {
                        exact: a.exact,
                        query: Box::new(BooleanQuery::new(vec![
                            (Occur::Must, a.query),
                            (Occur::MustNot, b.query),
                        ])),
                    }
                } else {
                    // Leaving out a superset of what NOT names could drop a match: the
                    // candidates are the left side's, checked in their text.
                    Compiled {
                        exact: false,
                        query: a.query,
                    }
                }
            }
        })
    }

    fn phrase(&self, phrase: &Phrase, common: &Common, stats: &Combined<'_>) -> Result<Compiled> {
        let field = self.fields.body;
        let term = |text: &str| Term::from_field_text(field, text);
        if phrase.words.iter().any(|w| w.term.len() > MAX_TERM) {
            return Ok(Compiled::exact(Box::new(EmptyQuery)));
        }
        if phrase.is_plain() {
            let words: Vec<&str> = phrase.words.iter().map(|w| w.term.as_str()).collect();
            let units = units(&words, common);
            return Ok(Compiled::exact(match units.as_slice() {
                [(_, one)] => Box::new(TermQuery::new(term(one), IndexRecordOption::WithFreqs)),
                _ => Box::new(SteadyPhrase(PhraseQuery::new_with_offset(
                    units.iter().map(|(at, text)| (*at, term(text))).collect(),
                ))),
            }));
        }
        // A prefix or `^`: every word (a prefix: any term it begins), checked in the text.
        let mut clauses: Vec<(Occur, Box<dyn Query>)> = Vec::new();
        for word in &phrase.words {
            clauses.push((Occur::Must, self.word(word, stats)?));
        }
        let query: Box<dyn Query> = if clauses.len() == 1 {
            clauses.remove(0).1
        } else {
            Box::new(BooleanQuery::new(clauses))
        };
        // A lone prefix is exact.
        let exact = !phrase.first && phrase.words.len() == 1;
        Ok(Compiled { query, exact })
    }

    /// A word: its term, or for a prefix every term of the index it begins.
    fn word(&self, word: &Word, stats: &Combined<'_>) -> Result<Box<dyn Query>> {
        let field = self.fields.body;
        if !word.prefix {
            return Ok(Box::new(TermQuery::new(
                Term::from_field_text(field, &word.term),
                IndexRecordOption::WithFreqs,
            )));
        }
        let mut expansions: BTreeSet<Vec<u8>> = BTreeSet::new();
        for searcher in std::iter::once(stats.main).chain(stats.overlay) {
            for segment in searcher.segment_readers() {
                let inverted = segment.inverted_index(field)?;
                let mut stream = inverted
                    .terms()
                    .range()
                    .ge(word.term.as_bytes())
                    .into_stream()?;
                while stream.advance() {
                    if !stream.key().starts_with(word.term.as_bytes()) {
                        break;
                    }
                    expansions.insert(stream.key().to_vec());
                }
            }
        }
        let clauses: Vec<(Occur, Box<dyn Query>)> = expansions
            .into_iter()
            .filter_map(|bytes| String::from_utf8(bytes).ok())
            .map(|text| -> (Occur, Box<dyn Query>) {
                (
                    Occur::Should,
                    Box::new(TermQuery::new(
                        Term::from_field_text(field, &text),
                        IndexRecordOption::WithFreqs,
                    )),
                )
            })
            .collect();
        Ok(if clauses.is_empty() {
            Box::new(EmptyQuery)
        } else if clauses.len() > PREFIX_SCORED {
            Box::new(ConstScoreQuery::new(
                Box::new(BooleanQuery::new(clauses)),
                1.0,
            ))
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
        pending: &HashSet<i64, BuildFx>,
        common: &Arc<Common>,
    ) -> Result<Arc<Overlay>> {
        let mut cached = match self.overlay.try_lock() {
            Ok(cached) => cached,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            // Another search is building it.
            Err(std::sync::TryLockError::WouldBlock) => {
                crate::blocking::section(|| self.overlay.lock().unwrap_or_else(|p| p.into_inner()))
            }
        };
        if let Some(overlay) = cached.as_ref()
            && overlay.key == key
        {
            return Ok(Arc::clone(overlay));
        }
        // Up to `OVERLAY_MAX_FILES` files indexed in memory.
        crate::blocking::section(|| {
            self.build_overlay(connection, key, pending, common, &mut cached)
        })
    }

    fn build_overlay(
        &self,
        connection: &Connection,
        key: (i64, i64, usize),
        pending: &HashSet<i64, BuildFx>,
        common: &Arc<Common>,
        cached: &mut Option<Arc<Overlay>>,
    ) -> Result<Arc<Overlay>> {
        let (schema, _) = schema();
        let common = Arc::new(RwLock::new(Arc::clone(common)));
        let mut writer = Index::builder()
            .schema(schema)
            .tokenizers(tokenizers(&common, &Arc::new(AtomicU64::new(0))))
            .single_segment_index_writer(RamDirectory::create(), 15_000_000)?;
        let mut ids: Vec<i64> = pending.iter().copied().collect();
        ids.sort_unstable();
        for id in ids {
            for (rowid, file, body) in file_chunks(connection, id)? {
                writer.add_document(self.document(&file, rowid, body))?;
            }
        }
        let index = writer.finalize()?;
        let reader: IndexReader = index
            .reader_builder()
            .reload_policy(ReloadPolicy::Manual)
            .try_into()?;
        let searcher = reader.searcher();
        let overlay = Arc::new(Overlay {
            key,
            columns: Columns::of(&searcher).ok(),
            searcher,
        });
        *cached = Some(Arc::clone(&overlay));
        Ok(overlay)
    }
}

/// The operands of a chain of ANDs (`and`) or ORs, in order, without recursion.
fn operands(expr: &Expr, and: bool) -> Vec<&Expr> {
    let mut found = Vec::new();
    let mut stack = vec![expr];
    while let Some(expr) = stack.pop() {
        match expr {
            Expr::And(a, b) if and => stack.extend([&**b, &**a]),
            Expr::Or(a, b) if !and => stack.extend([&**b, &**a]),
            other => found.push(other),
        }
    }
    found
}

/// The chunks of some files (sorted ids), by the `file_id` column: what a changed or
/// removed file's chunks are deleted with.
#[derive(Clone, Debug)]
struct FilesQuery(Arc<Vec<u64>>);

impl Query for FilesQuery {
    fn weight(&self, _scoring: EnableScoring<'_>) -> tantivy::Result<Box<dyn Weight>> {
        Ok(Box::new(self.clone()))
    }
}

impl Weight for FilesQuery {
    fn scorer(
        &self,
        reader: &tantivy::SegmentReader,
        boost: Score,
    ) -> tantivy::Result<Box<dyn Scorer>> {
        let ids = &self.0;
        let (Some(&low), Some(&high)) = (ids.first(), ids.last()) else {
            return Ok(Box::new(tantivy::query::EmptyScorer));
        };
        let column = reader.fast_fields().u64("file_id")?;
        let mut candidates = Vec::new();
        column.get_docids_for_value_range(low..=high, 0..reader.max_doc(), &mut candidates);
        let mut found = tantivy::BitSet::with_max_value(reader.max_doc());
        for doc in candidates {
            if column
                .first(doc)
                .is_some_and(|id| ids.binary_search(&id).is_ok())
            {
                found.insert(doc);
            }
        }
        Ok(Box::new(ConstScorer::new(
            tantivy::query::BitSetDocSet::from(found),
            boost,
        )))
    }

    fn explain(
        &self,
        _reader: &tantivy::SegmentReader,
        _doc: DocId,
    ) -> tantivy::Result<tantivy::query::Explanation> {
        Err(tantivy::TantivyError::InvalidArgument(
            "no explanation for a delete".into(),
        ))
    }
}

/// A phrase query whose scorer answers `seek_danger` as a plain `seek` does (tantivy's
/// default), so it is never left in the "invalid" state. tantivy 0.27's phrase scorer
/// asserts (in debug builds) that a `seek_danger` target is not behind its document,
/// which the contract allows once an earlier `seek_danger` left it ahead: a phrase in an
/// intersection inside a NOT (`kelp NOT big "red kelp forest" bur*`) panicked in the
/// tests. Release builds answered right; this costs a seek to the next match instead of
/// a lower bound, only where a phrase is not the first clause of an intersection.
#[derive(Clone, Debug)]
struct SteadyPhrase(PhraseQuery);

impl Query for SteadyPhrase {
    fn weight(&self, scoring: EnableScoring<'_>) -> tantivy::Result<Box<dyn Weight>> {
        Ok(Box::new(SteadyWeight(self.0.weight(scoring)?)))
    }

    fn query_terms<'a>(&'a self, visitor: &mut dyn FnMut(&'a Term, bool)) {
        self.0.query_terms(visitor);
    }
}

struct SteadyWeight(Box<dyn Weight>);

impl Weight for SteadyWeight {
    fn scorer(
        &self,
        reader: &tantivy::SegmentReader,
        boost: Score,
    ) -> tantivy::Result<Box<dyn Scorer>> {
        Ok(Box::new(SteadyScorer(self.0.scorer(reader, boost)?)))
    }

    fn explain(
        &self,
        reader: &tantivy::SegmentReader,
        doc: DocId,
    ) -> tantivy::Result<tantivy::query::Explanation> {
        self.0.explain(reader, doc)
    }
}

struct SteadyScorer(Box<dyn Scorer>);

impl DocSet for SteadyScorer {
    fn advance(&mut self) -> DocId {
        self.0.advance()
    }

    fn seek(&mut self, target: DocId) -> DocId {
        self.0.seek(target)
    }

    fn doc(&self) -> DocId {
        self.0.doc()
    }

    fn size_hint(&self) -> u32 {
        self.0.size_hint()
    }

    fn cost(&self) -> u64 {
        self.0.cost()
    }
}

impl Scorer for SteadyScorer {
    fn score(&mut self) -> Score {
        self.0.score()
    }
}

/// The units of a phrase of plain words for the index: a pair term for each pair of
/// neighbouring common words, and every word no pair holds, at their offsets.
fn units(words: &[&str], common: &Common) -> Vec<(usize, String)> {
    let mut covered = vec![false; words.len()];
    let mut units = Vec::new();
    for i in 1..words.len() {
        if common.pairs(words[i - 1], words[i]) {
            units.push((i - 1, pair(words[i - 1], words[i])));
            covered[i - 1] = true;
            covered[i] = true;
        }
    }
    for (i, word) in words.iter().enumerate() {
        if !covered[i] {
            units.push((i, word.to_string()));
        }
    }
    units.sort_by_key(|(at, _)| *at);
    units
}

/// What a search found: the page of hits asked for, whether more follow, and whether
/// the index was still being built (the hits may then be incomplete).
#[derive(Debug, Default)]
pub struct Answer {
    pub hits: Vec<Ranked>,
    pub more: bool,
    pub indexing: bool,
}

/// A tantivy query and whether it matches exactly what the expression does.
struct Compiled {
    query: Box<dyn Query>,
    exact: bool,
}

impl Compiled {
    fn exact(query: Box<dyn Query>) -> Compiled {
        Compiled { query, exact: true }
    }
}

/// Workspace and layer checked per hit (`Engine::scoped`).
#[derive(Default)]
struct Filters {
    workspace: Option<String>,
    layer: Option<String>,
}

/// The checks made in SQLite per candidate: the path scope and, for a query the index
/// does not answer exactly, the expression in the chunk's text.
struct Check<'c, 'q> {
    connection: &'c Connection,
    query: &'q SearchQuery<'q>,
    expr: Option<&'q Expr>,
    scope: ScopeCheck,
    error: Option<EngineError>,
}

/// The path scope: file by file at first; once many files were asked about (a narrow
/// scope over a common word), every file of the scope at once.
#[derive(Default)]
struct ScopeCheck {
    known: HashMap<i64, bool, BuildFx>,
    all: Option<HashSet<i64, BuildFx>>,
}

/// Files looked up one at a time before the scope's files are read at once.
const SCOPE_LOOKUPS: usize = 256;

impl Check<'_, '_> {
    fn accepts(&mut self, file_id: i64, rowid: i64) -> Result<bool> {
        Ok(self.in_scope(file_id)? && self.holds(rowid)?)
    }

    fn in_scope(&mut self, file_id: i64) -> Result<bool> {
        let Some(scope) = self.query.scope else {
            return Ok(true);
        };
        if let Some(all) = &self.scope.all {
            return Ok(all.contains(&file_id));
        }
        if let Some(known) = self.scope.known.get(&file_id) {
            return Ok(*known);
        }
        if self.scope.known.len() >= SCOPE_LOOKUPS {
            let mut statement = self.connection.prepare_cached(
                "SELECT id, path FROM files WHERE workspace = ?1 AND (?2 IS NULL OR path GLOB ?2)",
            )?;
            let rows = statement
                .query_map(params![self.query.workspace, self.query.scope_sql], |row| {
                    Ok((row.get::<_, i64>(0)?, row.get::<_, String>(1)?))
                })?;
            let mut all = HashSet::default();
            for row in rows {
                let (id, path) = row?;
                if scope.is_match(&path) {
                    all.insert(id);
                }
            }
            let inside = all.contains(&file_id);
            self.scope.all = Some(all);
            return Ok(inside);
        }
        let path: Option<String> = self
            .connection
            .prepare_cached("SELECT path FROM files WHERE id = ?1")?
            .query_row(params![file_id], |row| row.get(0))
            .optional()?;
        let inside = path.is_some_and(|p| scope.is_match(&p));
        self.scope.known.insert(file_id, inside);
        Ok(inside)
    }

    fn holds(&mut self, rowid: i64) -> Result<bool> {
        let Some(expr) = self.expr else {
            return Ok(true);
        };
        let body: Option<String> = self
            .connection
            .prepare_cached("SELECT body FROM chunks WHERE rowid = ?1")?
            .query_row(params![rowid], |row| row.get(0))
            .optional()?;
        Ok(body.is_some_and(|body| expr.matches(&tokens::terms(&body))))
    }
}

/// One ranked chunk.
#[derive(Debug, Clone, Copy)]
pub struct Ranked {
    pub score: f32,
    pub file_id: i64,
    pub rowid: i64,
}

/// A candidate in the heap of the best: the lowest score on top.
struct Candidate(Ranked);

impl PartialEq for Candidate {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == std::cmp::Ordering::Equal
    }
}

impl Eq for Candidate {}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Candidate {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other
            .0
            .score
            .total_cmp(&self.0.score)
            .then(self.0.rowid.cmp(&other.0.rowid))
    }
}

/// The `need` best chunks of `searcher` for `query`, through tantivy's pruning
/// collection (block-max WAND: only documents that could enter the heap are scored
/// and handed over), with our checks per document handed over: workspace and layer
/// (`filters`), files queued since (`pending`), path scope and text (`check`).
#[allow(clippy::too_many_arguments)]
fn collect(
    searcher: &Searcher,
    columns: Option<&[Columns]>,
    query: &dyn Query,
    stats: &Combined<'_>,
    need: usize,
    filters: &Filters,
    pending: &HashSet<i64, BuildFx>,
    check: &mut Check<'_, '_>,
) -> Result<Vec<Ranked>> {
    let weight = query.weight(EnableScoring::enabled_from_statistics_provider(
        stats, searcher,
    ))?;
    let mut heap: BinaryHeap<Candidate> = BinaryHeap::with_capacity(need + 1);
    let mut threshold = Score::MIN;
    let opened;
    let columns = match columns {
        Some(columns) if columns.len() == searcher.segment_readers().len() => columns,
        _ => {
            opened = Columns::of(searcher)?;
            &opened[..]
        }
    };
    for (segment, column) in searcher.segment_readers().iter().zip(columns) {
        let Columns {
            file_ids,
            rowids,
            workspaces,
            layers,
        } = column;
        let ordinal = |column: &Option<tantivy::columnar::StrColumn>,
                       value: &Option<String>|
         -> Result<Option<Option<u64>>> {
            let Some(value) = value else {
                return Ok(Some(None));
            };
            let Some(column) = column else {
                return Ok(None);
            };
            Ok(column.dictionary().term_ord(value)?.map(Some))
        };
        // None: no document of this segment passes.
        let (Some(workspace), Some(layer)) = (
            ordinal(workspaces, &filters.workspace)?,
            ordinal(layers, &filters.layer)?,
        ) else {
            continue;
        };
        let alive = segment.alive_bitset();
        weight.for_each_pruning(threshold, segment, &mut |doc: DocId, score: Score| {
            if alive.is_some_and(|a| a.is_deleted(doc)) {
                return threshold;
            }
            let passes = |wanted: Option<u64>, column: &Option<tantivy::columnar::StrColumn>| {
                wanted.is_none_or(|ord| {
                    column
                        .as_ref()
                        .is_some_and(|c| c.ords().first(doc) == Some(ord))
                })
            };
            if !passes(workspace, workspaces) || !passes(layer, layers) {
                return threshold;
            }
            let rowid = rowids.first(doc).unwrap_or(0) as i64;
            let mut candidate = Candidate(Ranked {
                score,
                file_id: 0,
                rowid,
            });
            // A tie with the worst kept is decided by the rowid (the order of the
            // answer), whatever order the documents come in; before anything else is
            // read, as a prefix of many terms brings every page back here.
            if heap.len() == need && heap.peek().is_some_and(|worst| candidate >= *worst) {
                return threshold;
            }
            let file_id = file_ids.first(doc).unwrap_or(0) as i64;
            if pending.contains(&file_id) {
                return threshold;
            }
            candidate.0.file_id = file_id;
            match check.accepts(file_id, rowid) {
                Ok(true) => {}
                Ok(false) => return threshold,
                Err(error) => {
                    check.error.get_or_insert(error);
                    // Nothing can pass this: the collection ends.
                    threshold = Score::INFINITY;
                    return threshold;
                }
            }
            heap.push(candidate);
            if heap.len() > need {
                heap.pop();
            }
            if heap.len() == need
                && let Some(lowest) = heap.peek()
            {
                // Just below the lowest kept, so that a tie still comes back here: a
                // prefix of many terms scores every page alike, and the pages a cursor
                // skips must be the ones the previous page showed.
                threshold = lowest.0.score.next_down();
            }
            threshold
        })?;
        if let Some(error) = check.error.take() {
            return Err(error);
        }
    }
    let mut ranked: Vec<Ranked> = heap.into_iter().map(|c| c.0).collect();
    ranked.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.rowid.cmp(&b.rowid)));
    Ok(ranked)
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

/// Hits completed from SQLite: path, kind, page, heading trail, and a snippet with
/// the words in bold made from the chunk's text (`snippet.rs`) as FTS5 makes it.
pub fn complete(
    connection: &Connection,
    expr: &Expr,
    ranked: &[Ranked],
) -> rusqlite::Result<Vec<Hit>> {
    let phrases = expr.phrases();
    let mut statement = connection.prepare_cached(
        "SELECT f.path, f.layer, f.kind, c.page, c.heading, c.body
         FROM chunks c JOIN files f ON f.id = ?2 WHERE c.rowid = ?1",
    )?;
    let mut hits = Vec::with_capacity(ranked.len());
    for hit in ranked {
        let found = statement
            .query_row(params![hit.rowid, hit.file_id], |row| {
                // The snippet is made from SQLite's copy of the text, not a new one.
                let body = row.get_ref(5)?.as_str()?;
                // No phrase in the text (the index answered from a chunk changed since):
                // the chunk's opening words then.
                let snippet = super::snippet::snippet(body, &phrases, SNIPPET_TOKENS)
                    .unwrap_or_else(|| opening(body));
                let trimmed = snippet.trim();
                Ok(Hit {
                    path: row.get(0)?,
                    layer: row.get(1)?,
                    kind: row.get(2)?,
                    page: row.get(3)?,
                    heading: row.get::<_, Option<String>>(4)?.unwrap_or_default(),
                    snippet: if trimmed.len() == snippet.len() {
                        snippet
                    } else {
                        trimmed.to_string()
                    },
                    score: f64::from(hit.score),
                })
            })
            .optional()?;
        hits.extend(found);
    }
    Ok(hits)
}

/// Tokens in a snippet (FTS5's `snippet(…, 24)`, as before the index).
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

    // The same pages and queries on every run.
    use crate::testing::Xorshift as Random;

    const WORDS: &[&str] = &[
        "the", "the", "the", "of", "of", "and", "wombat", "wombats", "burrow", "digging", "big",
        "big", "red", "kelp", "forest", "sea", "quokka", "runs", "running", "café", "night",
    ];

    fn page(random: &mut Random, unique: usize) -> String {
        let mut text = String::from("# Page\n\n");
        for section in 0..2 {
            if section == 1 {
                text.push_str("\n## Part\n");
            }
            for _ in 0..(5 + random.below(25)) {
                text.push_str(WORDS[random.below(WORDS.len())]);
                text.push(' ');
            }
            text.push_str(&format!("unique{unique} end.\n"));
        }
        text
    }

    /// Phrases cut from the pages' text: common words, pairs of them, and the unique
    /// words among them.
    fn cut_phrases(random: &mut Random, pages: &[String]) -> Vec<String> {
        let mut queries = Vec::new();
        for _ in 0..200 {
            let words: Vec<&str> = pages[random.below(pages.len())]
                .split(|c: char| !c.is_alphanumeric())
                .filter(|w| !w.is_empty())
                .collect();
            let length = 2 + random.below(3);
            if words.len() <= length {
                continue;
            }
            let from = random.below(words.len() - length);
            let mut phrase = words[from..from + length].join(" ");
            if random.below(4) == 0 {
                phrase.pop(); // the last word as a prefix
                queries.push(format!("\"{phrase}\" *"));
            } else {
                queries.push(format!("\"{phrase}\""));
            }
        }
        queries
    }

    fn queries(random: &mut Random) -> Vec<String> {
        let mut queries: Vec<String> = [
            "wombat",
            "the",
            "\"the big\"",
            "\"big red kelp\"",
            "\"the the\"",
            "\"of the big\"",
            "\"quokka runs\"",
            "big kelp",
            "wom*",
            "\"big wom\" *",
            "r*",
            "kelp OR quokka",
            "the NOT wombat",
            "big NOT \"red kelp\"",
            "NEAR(wombat kelp, 2)",
            "NEAR(\"the big\" sea)",
            "the NOT NEAR(big red, 0)",
            "^the",
            "^\"the big\"",
            "heading:the OR kelp",
            "-heading:kelp",
            "unique3",
            "unique3 OR unique7",
            "\"unique3 end\"",
            "cafe",
            "zebra",
        ]
        .iter()
        .map(|q| q.to_string())
        .collect();
        let pieces = [
            "the",
            "of",
            "big",
            "red",
            "kelp",
            "wombat",
            "sea",
            "bur*",
            "r*",
            "OR",
            "NOT",
            "AND",
            "(",
            ")",
            "\"the big\"",
            "\"red kelp forest\"",
            "\"of the\"",
            "NEAR(kelp sea, 3)",
            "^big",
        ];
        // At the parser's limits: the index's nested queries keep to the stack.
        queries.push(vec!["kelp"; 256].join(" OR "));
        queries.push(vec!["the"; 500].join(" "));
        queries.push(format!("{}big kelp{}", "(".repeat(32), ")".repeat(32)));
        for _ in 0..300 {
            let length = 1 + random.below(5);
            let query: Vec<&str> = (0..length)
                .map(|_| pieces[random.below(pieces.len())])
                .collect();
            queries.push(query.join(" "));
        }
        queries
    }

    /// The rowids of the chunks the expression matches, read from SQLite.
    fn expected(connection: &Connection, expr: &Expr) -> BTreeSet<i64> {
        let mut statement = connection
            .prepare("SELECT c.rowid, c.body FROM chunks c JOIN files f ON f.id = c.rowid >> 20 WHERE f.workspace = 'global'")
            .expect("prepare");
        let rows = statement
            .query_map([], |row| {
                Ok((row.get::<_, i64>(0)?, row.get::<_, String>(1)?))
            })
            .expect("query");
        rows.map(|row| row.expect("row"))
            .filter(|(_, body)| expr.matches(&tokens::terms(body)))
            .map(|(rowid, _)| rowid)
            .collect()
    }

    fn compare(engine: &Engine, store: &Store, queries: &[String], when: &str) -> usize {
        let connection = store.pool.get().expect("conn");
        let mut compared = 0;
        for text in queries {
            let Ok(expr) = super::super::query::parse(text) else {
                continue;
            };
            let query = SearchQuery {
                workspace: "global",
                query: text,
                layer: None,
                scope: None,
                scope_sql: None,
                limit: 1000,
                offset: 0,
            };
            let answer = engine.search(&connection, &query, &expr).expect("search");
            assert!(!answer.indexing, "{when}: {text}");
            let found: BTreeSet<i64> = answer.hits.iter().map(|h| h.rowid).collect();
            assert_eq!(
                found.len(),
                answer.hits.len(),
                "{when}: {text}: a chunk twice"
            );
            assert_eq!(found, expected(&connection, &expr), "{when}: {text}");
            compared += usize::from(!found.is_empty());
        }
        compared
    }

    /// A bulk load that the growth rule would answer with a rebuild once committed (a
    /// big folder copied into a workspace of a few pages) is indexed once, with common
    /// words chosen from what it brings: the first commit that holds it has them.
    #[test]
    fn a_bulk_load_that_outgrows_the_common_words_chooses_them_first() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(alexandria_proto::Home::new(dir.path())).expect("store");
        let wiki = store.workspace_dir("global").join("wiki");
        for i in 0..3 {
            std::fs::write(
                wiki.join(format!("old{i}.md")),
                "# Old\n\nwalrus tusks walrus\n",
            )
            .expect("write");
        }
        super::super::catch_up(&store, "global").expect("catch up");
        start(&store);
        wait_until_committed(&store);
        let engine = get(&store).expect("engine");
        assert!(
            engine.snapshot().common.contains("walru"),
            "{:?}",
            engine.snapshot().common
        );
        assert!(!engine.snapshot().common.contains("kelp"));
        // The build's bulk load is over once the queue stays quiet (`BULK_QUIET`): what
        // comes later is a load of its own.
        std::thread::sleep(BULK_QUIET * 2);

        let folder = wiki.join("imported");
        std::fs::create_dir(&folder).expect("mkdir");
        let mut random = Random(0x9e37_79b9_7f4a_7c15);
        for i in 0..(OVERLAY_MAX_FILES + 500) {
            std::fs::write(folder.join(format!("p{i}.md")), page(&mut random, i)).expect("write");
        }
        super::super::catch_up(&store, "global").expect("catch up");
        let number = |sql: &str| -> i64 {
            let connection = store.pool.get().expect("connection");
            connection.query_row(sql, [], |row| row.get(0)).expect(sql)
        };
        let last = number("SELECT max(seq) FROM search_outbox");
        let started = Instant::now();
        let snapshot = loop {
            let snapshot = engine.snapshot();
            if snapshot.seq >= last {
                break snapshot;
            }
            assert!(started.elapsed() < Duration::from_secs(60), "not committed");
            std::thread::sleep(Duration::from_millis(1));
        };
        assert!(
            snapshot.common.contains("kelp") && !snapshot.common.contains("walru"),
            "the bulk load was committed with the old common words: {:?}",
            snapshot.common
        );
        let chunks = number("SELECT count(*) FROM chunks");
        assert_eq!(snapshot.searcher.num_docs(), chunks as u64);
    }

    /// The index finds exactly the chunks the query matches (as FTS5 matched them:
    /// `query.rs`), for every form of the query language, from its committed segments
    /// and from the overlay of changes not committed yet, with common words' pairs
    /// and without.
    #[test]
    fn index_and_overlay_find_what_the_query_matches() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(alexandria_proto::Home::new(dir.path())).expect("store");
        let wiki = store.workspace_dir("global").join("wiki");
        let mut random = Random(0x2545_f491_4f6c_dd1d);
        let mut pages = Vec::new();
        for i in 0..80 {
            pages.push(page(&mut random, i));
            std::fs::write(wiki.join(format!("p{i}.md")), &pages[i]).expect("write");
        }
        super::super::catch_up(&store, "global").expect("catch up");
        start(&store);
        wait_until_committed(&store);
        let engine = get(&store).expect("engine");
        let common = &engine.snapshot().common;
        assert!(
            common.contains("the") && common.contains("big"),
            "{common:?}"
        );
        assert!(!common.contains("unique3"), "{common:?}");
        let mut queries = queries(&mut random);
        queries.extend(cut_phrases(&mut random, &pages));
        let compared = compare(&engine, &store, &queries, "committed");
        assert!(compared > 100, "only {compared} queries found something");

        // Changes not committed to the index yet are found through the overlay.
        let mut changed = Vec::new();
        for i in 80..90 {
            pages.push(page(&mut random, i));
            std::fs::write(wiki.join(format!("p{i}.md")), &pages[i]).expect("write");
            changed.push(format!("wiki/p{i}.md"));
        }
        queries.extend(cut_phrases(&mut random, &pages[80..]));
        for i in [1, 2] {
            std::fs::remove_file(wiki.join(format!("p{i}.md"))).expect("rm");
            changed.push(format!("wiki/p{i}.md"));
        }
        std::fs::write(wiki.join("p3.md"), "# Changed\n\nthe big red kelp forest\n").expect("edit");
        changed.push("wiki/p3.md".into());
        super::super::refresh_paths(&store, "global", &changed).expect("refresh");
        compare(&engine, &store, &queries, "overlay");
        wait_until_committed(&store);
        compare(&engine, &store, &queries, "committed again");
    }

    #[test]
    fn payload_round_trips() {
        let common = shares(&[("a", 7_500), ("b", 230)]);
        let text = payload("g1", 42, 7, &common);
        let parsed = parse_payload(Some(&text), "g1").expect("parsed");
        assert_eq!((parsed.seq, parsed.basis), (42, 7));
        assert_eq!(parsed.common.words, common.words);
        assert!(parse_payload(Some(&text), "g2").is_none());
        // An index of the format before shares (words only) is not taken for one.
        let older = format!("alexandria-search {FORMAT} g1 42 7 a b");
        assert!(parse_payload(Some(&older), "g1").is_none());
        assert!(parse_payload(None, "g1").is_none());
        let none = payload("g1", 1, 0, &Common::default());
        assert!(
            parse_payload(Some(&none), "g1")
                .expect("parsed")
                .common
                .words
                .is_empty()
        );
    }

    #[test]
    fn phrases_become_pairs_of_common_words() {
        let common = shares(&[("a", 5_000), ("b", 5_000), ("c", 5_000)]);
        let at = |units: Vec<(usize, String)>| -> Vec<(usize, String)> { units };
        assert_eq!(at(units(&["a"], &common)), vec![(0, "a".to_string())]);
        assert_eq!(at(units(&["a", "b"], &common)), vec![(0, pair("a", "b"))]);
        assert_eq!(
            at(units(&["a", "b", "c"], &common)),
            vec![(0, pair("a", "b")), (1, pair("b", "c"))]
        );
        assert_eq!(
            at(units(&["x", "a", "b", "y"], &common)),
            vec![
                (0, "x".to_string()),
                (1, pair("a", "b")),
                (3, "y".to_string())
            ]
        );
        assert_eq!(
            at(units(&["a", "x", "b"], &common)),
            vec![(0, "a".into()), (1, "x".into()), (2, "b".into())]
        );
    }

    fn shares(words: &[(&str, u16)]) -> Common {
        Common {
            words: words.iter().map(|(w, s)| (w.to_string(), *s)).collect(),
        }
    }

    /// Pairs only of words whose shares multiply to `PAIR_PRODUCT` or more: the same
    /// rule for the terms indexed and the units a phrase is searched by.
    #[test]
    fn only_pairs_of_words_common_enough_together_are_indexed() {
        // In 100 % and 2 % of the chunks (a product of 0.02), in 50 % and 3 % (0.015),
        // in 14 % and 15 % (0.021).
        let common = shares(&[
            ("common", 10_000),
            ("some", 200),
            ("half", 5_000),
            ("few", 300),
            ("x", 1_400),
            ("y", 1_500),
        ]);
        assert!(common.pairs("common", "some"));
        assert!(common.pairs("some", "common"));
        assert!(!common.pairs("half", "few"));
        assert!(!common.pairs("half", "unknown"));
        assert!(common.pairs("x", "y"));
        // "few some": 0.0006.
        assert_eq!(
            units(&["half", "few", "some", "common"], &common),
            vec![
                (0, "half".to_string()),
                (1, "few".to_string()),
                (2, pair("some", "common"))
            ]
        );
        // The tokenizer makes the same pairs.
        let made = {
            let common = Arc::new(RwLock::new(Arc::new(common)));
            let mut tokenizer = TermTokenizer {
                common,
                started: Arc::new(AtomicU64::new(0)),
                stems: Stems::new(),
            };
            let mut stream = tokenizer.token_stream("half few some common x y");
            let mut made = Vec::new();
            while stream.advance() {
                made.push((stream.token().position, stream.token().text.clone()));
            }
            made
        };
        assert_eq!(
            made,
            vec![
                (0, "half".to_string()),
                (1, "few".to_string()),
                (2, "some".to_string()),
                (2, pair("some", "common")),
                (3, "common".to_string()),
                (3, pair("common", "x")),
                (4, "x".to_string()),
                (4, pair("x", "y")),
                (5, "y".to_string()),
            ]
        );
    }
}
