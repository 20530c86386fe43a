//! `alexandria-bench --search`: the search index (issue 15). One home holds the
//! generated corpus and runs a daemon of this build; with `--base-bin-dir DIR` a
//! second home holds the same corpus and runs the daemon in DIR (say, main's build),
//! so that every figure has its base from the same run. Each is cold indexed in turn
//! (time to the first answer and to the index ready, CPU, memory when ready and after
//! idling); every planted word is checked in both; then the same searches go to both
//! daemons round-robin, one of each per round, so the machine's load slows both alike
//! and the ratio stays meaningful. Last, this build's home is restarted without its
//! index directory and then without state.db: the index is rebuilt and checked again.

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
pub fn run(
    binaries: &Binaries,
    base: Option<&Binaries>,
    seed: u64,
    pages: usize,
    iterations: usize,
) -> Result<Vec<Row>> {
    let label = size_label(pages);
    let mut rows = Vec::new();
    let mut homes = vec![(Home::new(binaries)?, "this build")];
    if let Some(base) = base {
        homes.push((Home::new(base)?, "base"));
    }
    let mut corpus = None;
    for (home, _) in &mut homes {
        home.cli(&["init"])?;
        home.cli(&["workspace", "create", SLUG])?;
        home.stop_daemon()?;
        let workspace = home.workspace_dir(SLUG);
        progress(&format!("[{label}] generating {pages} pages"));
        corpus = Some(corpus::generate(seed, pages, &workspace)?);
        crate::rebuild::commit_corpus(&workspace)
            .context("git is needed to commit the generated corpus")?;
    }
    let corpus = corpus.ok_or_else(|| anyhow!("no corpus"))?;

    // Cold index, one daemon at a time (the base first).
    let mut cold = Vec::new();
    for (home, name) in homes.iter_mut().rev() {
        progress(&format!("[{label}] cold index, {name}"));
        cold.push(cold_index(home, &corpus, &label, name, &mut rows)?);
    }
    cold.reverse();
    let mut row = Row::new(
        "cold index: spawn → search index ready",
        &label,
        "socket",
        Figure::Once(cold[0].ready),
    );
    let mut note = format!(
        "first answer after {}; daemon CPU time {}",
        format_duration(cold[0].first_answer),
        format_duration(cold[0].cpu)
    );
    if let Some(base) = cold.get(1) {
        row = row.floor("base", base.ready);
        note.push_str(&format!(
            "; base: first answer after {}, CPU {}",
            format_duration(base.first_answer),
            format_duration(base.cpu)
        ));
    }
    rows.push(row.note(note));

    // The same searches to both, round-robin, once both are quiet (the merge after the
    // bulk load of the one indexed last may still run).
    let pids: Vec<u32> = homes
        .iter()
        .filter_map(|(home, _)| home.daemon_pid())
        .collect();
    procs::settle(&label, &pids)?;
    progress(&format!("[{label}] searches, round-robin"));
    let mut clients: Vec<Direct> = homes
        .iter()
        .map(|(home, _)| home.direct(SLUG))
        .collect::<Result<_>>()?;
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
        (
            "search, prefix of the common word".to_string(),
            format!(
                "{}*",
                &corpus.common_word[..corpus.common_word.len().saturating_sub(1).max(1)]
            ),
        ),
        (
            "search, common word OR rare word".to_string(),
            format!("{} OR {}", corpus.common_word, rare.word),
        ),
    ];
    let plan = Plan::new(
        (iterations / 10).max(3),
        iterations,
        Duration::from_secs(60),
    );
    let pings = interleaved(
        &mut clients,
        Plan::new(50, iterations * 5, Duration::from_secs(20)),
        |client| client.ping(),
    )?;
    rows.push(
        Row::new(
            "ping round trip",
            &label,
            "socket",
            Figure::Latency(pings[0]),
        )
        .note("this build's daemon; floor of the rows below"),
    );
    // A row for a figure's summaries: this build's, and base's beside it.
    let compared = |figure: &str, summaries: &[Summary]| {
        let on = summaries[0];
        let mut row = latency(figure, &label, on);
        let mut note = format!(
            "{} over the ping",
            format_duration(on.p50.saturating_sub(pings[0].p50))
        );
        if let Some(base) = summaries.get(1) {
            row = row.floor("base", base.p50);
            note.push_str(&format!(
                "; base {} ({} over its ping), {:.1}× faster; over the ping {:.2}× base's",
                format_duration(base.p50),
                format_duration(base.p50.saturating_sub(pings[1].p50)),
                base.p50.as_secs_f64() / on.p50.as_secs_f64().max(1e-9),
                on.p50.saturating_sub(pings[0].p50).as_secs_f64()
                    / base
                        .p50
                        .saturating_sub(pings[1].p50)
                        .as_secs_f64()
                        .max(1e-9)
            ));
        }
        row.note(note)
    };
    for (figure, query) in &cases {
        let args = json!({"query": query});
        let summaries = interleaved(&mut clients, plan, |client| {
            client.call_tool("search", args.clone()).map(|_| ())
        })?;
        rows.push(compared(figure, &summaries));
        // Same hits (paths, with a page's sections) from both, when they are all
        // returned (the top 1000 of 10k matches differ with the scoring).
        let found: Vec<Vec<String>> = clients
            .iter_mut()
            .map(|client| paths(client, query))
            .collect::<Result<_>>()?;
        if let [a, b] = found.as_slice()
            && a.len() < 1000
            && a != b
        {
            bail!(
                "{query}: this build found {} hits, the base {}; they differ",
                a.len(),
                b.len()
            );
        }
    }
    // The other read-only tools (`--tools`' rows), round-robin too: the same arguments
    // to both daemons in a round.
    for case in crate::run::tool_cases(&corpus)?
        .into_iter()
        .filter(|case| case.tool != "search")
    {
        let calls = std::cell::Cell::new(0usize);
        let daemons = clients.len();
        let summaries = interleaved(&mut clients, plan, |client| {
            let call = calls.get();
            calls.set(call + 1);
            client
                .call_tool(case.tool, (case.args)(call / daemons))
                .map(|_| ())
        })?;
        rows.push(compared(&case.figure, &summaries));
    }
    drop(clients);
    let (mut index, _) = homes.remove(0);
    for (mut home, _) in homes {
        home.stop_daemon()?;
    }

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

/// `call` on every client in turn, one call each per round; a summary per client.
fn interleaved(
    clients: &mut [Direct],
    plan: Plan,
    call: impl Fn(&mut Direct) -> Result<()>,
) -> Result<Vec<Summary>> {
    let call = &call;
    let mut closures: Vec<Box<dyn FnMut() -> Result<()> + '_>> = clients
        .iter_mut()
        .map(|client| Box::new(move || call(client)) as Box<dyn FnMut() -> Result<()> + '_>)
        .collect();
    let mut refs: Vec<&mut dyn FnMut() -> Result<()>> = closures
        .iter_mut()
        .map(|c| c.as_mut() as &mut dyn FnMut() -> Result<()>)
        .collect();
    measure_interleaved(plan, &mut refs)
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
/// reports no index: an older daemon with it turned off).
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
