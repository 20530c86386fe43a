//! `alexandria-bench --soak SECONDS`: does a long-running daemon stay flat (issue 15,
//! part 4)? After the cold index of a generated corpus, four clients send a mix of
//! calls for SECONDS as fast as the daemon answers them — an hour of a busy user's
//! calls compressed into minutes: every read-only tool case the benchmark times
//! (searches common, rare and phrase, single reads, PDF pages, glob batches, guide,
//! history) and writes (creates and appends of new pages). The daemon's RSS is
//! sampled throughout; the rows give it after the cold index, its highest sample
//! under load, at the end of the load and after idling, each against the cold index
//! (the goal: within 10 %). Every call must succeed, every planted word is checked
//! before and after, and every page the load created must be found by its own word.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use serde_json::json;

use crate::client::Mcp;
use crate::corpus::Rng;
use crate::procs::{self, Binaries};
use crate::report::{Figure, Row, mib};
use crate::run::{self, SLUG, Settings, size_label};
use crate::stats::format_duration;

/// Clients sending calls at once.
const CLIENTS: usize = 4;
/// How long the daemon sits idle after the load before its memory is read again (its
/// database pool closes connections idle for 30 s within the next 30).
const IDLE: Duration = Duration::from_secs(75);
/// How often the daemon's memory is sampled under load.
const SAMPLE: Duration = Duration::from_millis(500);
/// One call in this many is a write (the rest cycle through the read-only cases).
const WRITE_EVERY: u64 = 8;

/// Rows for one corpus of `pages` pages under `duration` of mixed load.
pub fn run(
    settings: &Settings,
    binaries: &Binaries,
    pages: usize,
    duration: Duration,
) -> Result<Vec<Row>> {
    let label = size_label(pages);
    let (mut home, _workspace, corpus) = run::corpus_home(settings, binaries, pages)?;
    home.start_daemon()?;
    let mut client = home.direct(SLUG)?;
    run::wait_for_index(&mut client)?;
    run::wait_for_search_index(&mut client)?;
    run::check_planted(&mut client, &corpus)?;
    let pid = home
        .daemon_pid()
        .ok_or_else(|| anyhow!("the daemon wrote no pidfile"))?;
    let (cold, _) = procs::memory(pid)?;
    progress(&format!(
        "[{label}] cold index done, RSS {}; {CLIENTS} clients for {}",
        mib(cold),
        format_duration(duration)
    ));

    let cases = run::tool_cases(&corpus)?;
    let mut clients = Vec::with_capacity(CLIENTS);
    for _ in 0..CLIENTS {
        clients.push(home.direct(SLUG)?);
    }
    let stop = AtomicBool::new(false);
    let calls = AtomicU64::new(0);
    let writes = AtomicU64::new(0);
    let mut highest = cold;
    let started = Instant::now();
    let results: Vec<Result<Vec<String>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = clients
            .into_iter()
            .enumerate()
            .map(|(t, mut client)| {
                let (stop, calls, writes, cases) = (&stop, &calls, &writes, &cases);
                scope.spawn(move || -> Result<Vec<String>> {
                    let mut rng = Rng::new(settings.seed ^ (t as u64 + 1));
                    let mut created = Vec::new();
                    let mut i = 0usize;
                    while !stop.load(Ordering::Relaxed) {
                        i += 1;
                        if rng.next_u64().is_multiple_of(WRITE_EVERY) {
                            soak_write(&mut client, &mut rng, t, &mut created)?;
                            writes.fetch_add(1, Ordering::Relaxed);
                        } else {
                            let case = &cases[rng.range(0, cases.len() - 1)];
                            client
                                .call_tool(case.tool, (case.args)(i))
                                .with_context(|| format!("{} under load", case.figure))?;
                        }
                        calls.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(created)
                })
            })
            .collect();
        while started.elapsed() < duration && !handles.iter().any(|h| h.is_finished()) {
            std::thread::sleep(SAMPLE);
            if let Ok((rss, _)) = procs::memory(pid) {
                highest = highest.max(rss);
            }
        }
        stop.store(true, Ordering::Relaxed);
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow!("a client thread panicked")))
            })
            .collect()
    });
    let elapsed = started.elapsed();
    let mut created = Vec::new();
    for result in results {
        created.extend(result?);
    }
    let (loaded, _) = procs::memory(pid)?;
    let calls = calls.load(Ordering::Relaxed);
    progress(&format!(
        "[{label}] {calls} calls ({} writes) in {}; RSS {}; idling {}",
        writes.load(Ordering::Relaxed),
        format_duration(elapsed),
        mib(loaded),
        format_duration(IDLE)
    ));
    std::thread::sleep(IDLE);
    let (idle, _) = procs::memory(pid)?;
    let (anonymous, _) = procs::own_memory(pid)?;

    // Nothing the load did may have cost a result: the planted words, and each created
    // page found by the word only it holds.
    run::wait_for_search_index(&mut client)?;
    run::check_planted(&mut client, &corpus)?;
    for word in &created {
        let result = client.call_tool("search", json!({"query": word, "limit": 100}))?;
        let hits = result["structuredContent"]["hits"]
            .as_array()
            .ok_or_else(|| anyhow!("search returned no hits array: {result}"))?;
        let mut paths: Vec<&str> = hits.iter().filter_map(|h| h["path"].as_str()).collect();
        paths.dedup();
        if paths.len() != 1 {
            bail!("the page written with the word {word} is found in {paths:?}, not once");
        }
    }
    home.stop_daemon()?;

    let against = |rss: u64| {
        format!(
            "{:+.1} % against the cold index",
            (rss as f64 / cold as f64 - 1.0) * 100.0
        )
    };
    let per_second = calls as f64 / elapsed.as_secs_f64();
    Ok(vec![
        Row::new(
            "daemon RSS after the cold index",
            &label,
            "-",
            Figure::Bytes(cold),
        )
        .note("before the mixed load; the baseline of the rows below"),
        Row::new(
            "daemon RSS, highest sample under mixed load",
            &label,
            "-",
            Figure::Bytes(highest),
        )
        .note(against(highest)),
        Row::new(
            &format!("daemon RSS after {} of mixed load", format_duration(elapsed)),
            &label,
            "-",
            Figure::Bytes(loaded),
        )
        .note(format!(
            "{calls} calls ({per_second:.0}/s; {} pages created, about half then appended to, by {CLIENTS} clients); {}",
            created.len(),
            against(loaded)
        )),
        Row::new(
            &format!("daemon RSS after the load and {} idle", format_duration(IDLE)),
            &label,
            "-",
            Figure::Bytes(idle),
        )
        .note(format!(
            "{}; anonymous {} (goal: within 10 %)",
            against(idle),
            mib(anonymous)
        )),
    ])
}

/// A create of a new page (every other one then appended to), holding a word no other
/// page has; pushes that word onto `created`.
fn soak_write(
    client: &mut dyn Mcp,
    rng: &mut Rng,
    thread: usize,
    created: &mut Vec<String>,
) -> Result<()> {
    let n = created.len();
    // Letters only, never a vocabulary syllable pair, and ending in q: no stemmer maps
    // two of these words onto one, so it is found only in this page.
    let word = format!("zqsoak{}x{}q", letters(thread), letters(n));
    let path = format!("wiki/soak/t{thread}/p{n:05}.md");
    client.call_tool(
        "write",
        json!({"command": "create", "path": path,
               "content": format!("# Soak {thread} {n}\n\nA page of the soak, {word}.\n")}),
    )?;
    if rng.next_u64().is_multiple_of(2) {
        client.call_tool(
            "write",
            json!({"command": "append", "path": path,
                   "content": "\nAn appended paragraph of the soak.\n"}),
        )?;
    }
    created.push(word);
    Ok(())
}

/// `n` written with ten consonants (words are letters only to the tokenizer; no s or
/// l, which a stemmer may strip or merge).
fn letters(n: usize) -> String {
    const DIGITS: &[u8; 10] = b"bcdfghjkmn";
    n.to_string()
        .bytes()
        .map(|digit| char::from(DIGITS[usize::from(digit - b'0')]))
        .collect()
}

fn progress(message: &str) {
    eprintln!("alexandria-bench: {message}");
}
