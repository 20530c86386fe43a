//! `alexandria-bench --search`: the ranked search index (issue 15) against FTS5 in one
//! run. Two homes hold the same generated corpus; one daemon runs with the index
//! (`ALEXANDRIA_SEARCH_INDEX=on`), the other with FTS5 alone (`off`). Each is cold
//! indexed in turn (time, CPU, memory when ready and after idling); every planted
//! word is checked in both; then the same searches go to both daemons round-robin,
//! one of each per round, so the machine's load slows both alike and the ratio
//! stays meaningful. Last, the index home is restarted without its index directory
//! and without state.db: the index is rebuilt and checked again.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Value, json};

use crate::client::{Direct, Mcp};
use crate::corpus::{self, Corpus};
use crate::procs::{self, Binaries, Home};
use crate::report::{Figure, Row, mib};
use crate::run::{SLUG, size_label};
use crate::stats::{Plan, Summary, format_duration, measure_interleaved};

/// How long the daemons sit idle before their memory is read again.
const IDLE: Duration = Duration::from_secs(40);

/// Rows for one corpus of `pages` pages; `iterations` timed searches per figure.
pub fn run(binaries: &Binaries, seed: u64, pages: usize, iterations: usize) -> Result<Vec<Row>> {
    let label = size_label(pages);
    let mut rows = Vec::new();
    let mut index = Home::new(binaries)?;
    index.env("ALEXANDRIA_SEARCH_INDEX", "on");
    let mut fts5 = Home::new(binaries)?;
    fts5.env("ALEXANDRIA_SEARCH_INDEX", "off");
    let mut corpus = None;
    for home in [&mut index, &mut fts5] {
        home.cli(&["init"])?;
        home.cli(&["workspace", "create", SLUG])?;
        home.stop_daemon()?;
        let workspace = home.workspace_dir(SLUG);
        progress(&format!("[{label}] generating {pages} pages"));
        corpus = Some(corpus::generate(seed, pages, &workspace)?);
        git(&workspace, &["add", "-A"])?;
        git(&workspace, &["commit", "-q", "-m", "benchmark corpus"])?;
    }
    let corpus = corpus.ok_or_else(|| anyhow!("no corpus"))?;

    // Cold index, one daemon at a time.
    let mut cold = Vec::new();
    for (home, name) in [(&mut fts5, "FTS5"), (&mut index, "search index")] {
        progress(&format!("[{label}] cold index, {name}"));
        cold.push(cold_index(home, &corpus, &label, name, &mut rows)?);
    }
    if let [fts5_cold, index_cold] = cold.as_slice() {
        rows.push(
            Row::new(
                "cold index → search index ready, with the index",
                &label,
                "socket",
                Figure::Once(index_cold.ready),
            )
            .floor("FTS5 cold index", fts5_cold.first_answer)
            .note(format!(
                "daemon CPU time {} vs {} with FTS5 alone",
                format_duration(index_cold.cpu),
                format_duration(fts5_cold.cpu)
            )),
        );
    }

    // The same searches to both, round-robin.
    progress(&format!("[{label}] searches, round-robin"));
    let mut with_index = index.direct(SLUG)?;
    let mut without = fts5.direct(SLUG)?;
    let rare = corpus
        .marker(10)
        .or_else(|| corpus.markers.first())
        .ok_or_else(|| anyhow!("the corpus has no marker words"))?;
    let words: Vec<&str> = corpus.phrase.split_whitespace().collect();
    let cases = [
        (
            format!(
                "search, common word ({} of {} pages)",
                corpus.common_pages, corpus.pages
            ),
            corpus.common_word.clone(),
        ),
        (
            format!("search, rare word ({} pages)", rare.pages),
            rare.word.clone(),
        ),
        (
            format!("search, phrase (≥ {} pages)", corpus.phrase_pages),
            format!("\"{}\"", corpus.phrase),
        ),
        (
            "search, two-word phrase".to_string(),
            format!(
                "\"{}\"",
                words.iter().take(2).copied().collect::<Vec<_>>().join(" ")
            ),
        ),
        (
            "search, the phrase's three words, unquoted (all must match)".to_string(),
            corpus.phrase.clone(),
        ),
    ];
    let plan = Plan::new(
        (iterations / 10).max(3),
        iterations,
        Duration::from_secs(60),
    );
    let pings = {
        let mut a = || with_index.ping();
        let mut b = || without.ping();
        measure_interleaved(
            Plan::new(50, iterations * 5, Duration::from_secs(20)),
            &mut [&mut a, &mut b],
        )?
    };
    rows.push(
        Row::new(
            "ping round trip",
            &label,
            "socket",
            Figure::Latency(pings[0]),
        )
        .note("daemon with the index; floor of the rows below"),
    );
    for (figure, query) in &cases {
        let args = json!({"query": query});
        let summaries = {
            let mut a = || with_index.call_tool("search", args.clone()).map(|_| ());
            let mut b = || without.call_tool("search", args.clone()).map(|_| ());
            measure_interleaved(plan, &mut [&mut a, &mut b])?
        };
        let (on, off) = (summaries[0], summaries[1]);
        rows.push(latency(&format!("{figure}, FTS5"), &label, off).floor("ping", pings[1].p50));
        rows.push(
            latency(&format!("{figure}, search index"), &label, on)
                .floor("FTS5", off.p50)
                .note(format!(
                    "{} over the ping; {:.1}× faster than FTS5",
                    format_duration(on.p50.saturating_sub(pings[0].p50)),
                    off.p50.as_secs_f64() / on.p50.as_secs_f64().max(1e-9)
                )),
        );
        // Same hits (paths, with a page's sections) from both, when they are all
        // returned (the top 1000 of 10k matches differ with the scoring).
        let a = paths(&mut with_index, query)?;
        let b = paths(&mut without, query)?;
        if a.len() < 1000 && a != b {
            bail!(
                "{query}: the index found {} hits, FTS5 {}; they differ",
                a.len(),
                b.len()
            );
        }
    }
    drop(with_index);
    drop(without);
    fts5.stop_daemon()?;
    drop(fts5);

    // The index lost, then state.db lost: rebuilt, and right.
    for (what, remove) in [
        ("index directory deleted", &["search-index"][..]),
        (
            "state.db deleted",
            &["state.db", "state.db-wal", "state.db-shm"][..],
        ),
    ] {
        index.stop_daemon()?;
        for name in remove {
            let path = index.root.join(name);
            if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path).or_else(|e| {
                    if e.kind() == std::io::ErrorKind::NotFound {
                        Ok(())
                    } else {
                        Err(e)
                    }
                })
            }
            .with_context(|| format!("cannot remove {}", path.display()))?;
        }
        progress(&format!("[{label}] restart, {what}"));
        let started = Instant::now();
        index.start_daemon()?;
        let mut client = index.direct(SLUG)?;
        client.call_tool("search", json!({"query": "index", "limit": 1}))?;
        let first = started.elapsed();
        wait_for_search_index(&mut client)?;
        let ready = started.elapsed();
        check_planted(&mut client, &corpus)?;
        let pid = index
            .daemon_pid()
            .ok_or_else(|| anyhow!("the daemon wrote no pidfile"))?;
        let (rss, _) = procs::memory(pid)?;
        rows.push(
            Row::new(
                &format!("restart, {what}: spawn → search index ready"),
                &label,
                "socket",
                Figure::Once(ready),
            )
            .floor("first answer", first)
            .note(format!("RSS then {}; planted words checked", mib(rss))),
        );
    }
    index.stop_daemon()?;
    Ok(rows)
}

/// What a cold index took.
struct Cold {
    first_answer: Duration,
    ready: Duration,
    cpu: Duration,
}

/// Start the daemon on the fresh corpus; time the first answer and the index; read
/// memory when ready and after idling; check every planted word.
fn cold_index(
    home: &mut Home,
    corpus: &Corpus,
    label: &str,
    name: &str,
    rows: &mut Vec<Row>,
) -> Result<Cold> {
    let started = Instant::now();
    home.start_daemon()?;
    let mut client = home.direct(SLUG)?;
    client.call_tool("search", json!({"query": "index", "limit": 1}))?;
    let first_answer = started.elapsed();
    wait_for_search_index(&mut client)?;
    let ready = started.elapsed();
    let pid = home
        .daemon_pid()
        .ok_or_else(|| anyhow!("the daemon wrote no pidfile"))?;
    let cpu = procs::cpu_time(pid)?;
    let (rss, peak) = procs::memory(pid)?;
    std::thread::sleep(IDLE);
    let (idle, _) = procs::memory(pid)?;
    // Work the index does after it is ready (the merge after a bulk load) shows here.
    let cpu_idle = procs::cpu_time(pid)?;
    let (anonymous, _) = procs::own_memory(pid)?;
    check_planted(&mut client, corpus)?;
    rows.push(
        Row::new(
            &format!("cold index: spawn → first answer, {name}"),
            label,
            "socket",
            Figure::Once(first_answer),
        )
        .note(format!(
            "{} pages; ready with nothing queued after {}",
            corpus.pages,
            format_duration(ready)
        )),
    );
    rows.push(
        Row::new(
            &format!("daemon RSS when ready, {name}"),
            label,
            "-",
            Figure::Bytes(rss),
        )
        .note(format!("peak (VmHWM) {}", mib(peak))),
    );
    rows.push(
        Row::new(
            &format!("daemon RSS after {} idle, {name}", format_duration(IDLE)),
            label,
            "-",
            Figure::Bytes(idle),
        )
        .note(format!(
            "of which anonymous {}; daemon CPU time by then {}",
            mib(anonymous),
            format_duration(cpu_idle)
        )),
    );
    Ok(Cold {
        first_answer,
        ready,
        cpu,
    })
}

/// Every planted word is found as often as planted, and the phrase at least as often.
fn check_planted(client: &mut Direct, corpus: &Corpus) -> Result<()> {
    for marker in &corpus.markers {
        let found = paths(client, &marker.word)?.len();
        if found != marker.pages {
            bail!(
                "search for the marker {} found {found} hits, {} were planted",
                marker.word,
                marker.pages
            );
        }
    }
    let phrase = format!("\"{}\"", corpus.phrase);
    let found = paths(client, &phrase)?.len();
    if found < corpus.phrase_pages.min(1000) {
        bail!(
            "the phrase {phrase} was found {found} times, planted in {} pages",
            corpus.phrase_pages
        );
    }
    Ok(())
}

/// The sorted paths of up to 1000 hits.
fn paths(client: &mut dyn Mcp, query: &str) -> Result<Vec<String>> {
    let result = client.call_tool("search", json!({"query": query, "limit": 1000}))?;
    let hits = result["structuredContent"]["hits"]
        .as_array()
        .ok_or_else(|| anyhow!("search returned no hits array: {result}"))?;
    let mut paths: Vec<String> = hits
        .iter()
        .map(|h| h["path"].as_str().unwrap_or_default().to_string())
        .collect();
    paths.sort();
    Ok(paths)
}

/// Wait (≤ 10 min) until `guide` reports the index ready with nothing queued (or
/// reports no index: FTS5 answers).
fn wait_for_search_index(client: &mut dyn Mcp) -> Result<()> {
    let started = Instant::now();
    loop {
        let guide = client.call_tool("guide", json!({}))?;
        let status: &Value = &guide["structuredContent"]["search_index"];
        let none = status.is_null() || status["queued"].is_null() && status["ready"] == false;
        if none || status["ready"] == true && status["queued"] == 0 {
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(600) {
            bail!("the search index is not ready after 10 minutes: {status}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn latency(figure: &str, pages: &str, summary: Summary) -> Row {
    Row::new(figure, pages, "socket", Figure::Latency(summary))
}

fn progress(message: &str) {
    eprintln!("alexandria-bench: {message}");
}

fn git(dir: &Path, args: &[&str]) -> Result<()> {
    crate::rebuild::git_output(dir, args).map(|_| ())
}
