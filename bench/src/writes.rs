//! `--writes`: only the write rows at each size, for work on the write path (issue 15).
//! With `--base-bin-dir`, the same writes go to a daemon built from other binaries (the
//! base) and to this build's, round-robin (one write to each per round; the concurrent
//! writers take turns, base first), so that a busy machine slows both alike and the
//! ratio holds. Each row also gives the daemon's CPU time per write.

use std::cell::Cell;
use std::time::Duration;

use anyhow::{Result, anyhow};
use serde_json::json;

use crate::client::Mcp;
use crate::corpus::Corpus;
use crate::procs::{self, Binaries, Home};
use crate::report::{Figure, Row};
use crate::run::{
    SLUG, Settings, concurrent_writes, corpus_home, fsync_floor, size_label, wait_for_index,
    wait_for_search_index,
};
use crate::stats::{Plan, format_duration, measure_interleaved};

/// A daemon under test: which build, its home and corpus.
struct Side {
    name: &'static str,
    home: Home,
    corpus: Corpus,
    pid: u32,
}

impl Side {
    fn cpu(&self) -> Result<Duration> {
        procs::cpu_time(self.pid)
    }
}

fn start(
    settings: &Settings,
    binaries: &Binaries,
    pages: usize,
    name: &'static str,
) -> Result<Side> {
    let (mut home, _workspace, corpus) = corpus_home(settings, binaries, pages)?;
    home.start_daemon()?;
    let mut direct = home.direct(SLUG)?;
    wait_for_index(&mut direct)?;
    wait_for_search_index(&mut direct)?;
    drop(direct);
    let pid = home
        .daemon_pid()
        .ok_or_else(|| anyhow!("the daemon wrote no pidfile"))?;
    Ok(Side {
        name,
        home,
        corpus,
        pid,
    })
}

/// The write rows at each size, for this build (and the base, when given).
pub fn run(settings: &Settings, binaries: &Binaries, base: Option<&Binaries>) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for &pages in &settings.sizes {
        let label = size_label(pages);
        let mut sides = Vec::new();
        if let Some(base) = base {
            sides.push(start(settings, base, pages, "base")?);
        }
        sides.push(start(settings, binaries, pages, "this build")?);
        // The daemon started last may still be merging its search index: the side
        // started second was 1.35x slower than the first with the same binaries.
        let pids: Vec<u32> = sides.iter().map(|side| side.pid).collect();
        procs::settle(&label, &pids)?;
        eprintln!(
            "alexandria-bench: [{label}] writes, load {}",
            procs::load_average()
        );
        let workspace = sides[0].home.workspace_dir(SLUG);
        let plan = Plan::new(
            (settings.iterations / 10).max(3),
            settings.iterations,
            Duration::from_secs(600),
        );
        let floor = fsync_floor(settings, &workspace)?;
        rows.push(
            Row::new(
                "write 4 KiB + fsync (durable write floor)",
                &label,
                "-",
                Figure::Latency(floor),
            )
            .note("in the workspace directory, by the benchmark"),
        );
        for (figure, command) in [
            ("write create (cited)", "create"),
            ("write append (cited)", "append"),
        ] {
            let mut shims = Vec::new();
            for side in &sides {
                let mut shim = side.home.shim(SLUG)?;
                if command == "append" {
                    shim.call_tool(
                        "write",
                        json!({"command": "create", "path": format!("{}/append.md", crate::run::write_folder()),
                               "content": "# Appended\n\n"}),
                    )?;
                }
                shims.push(shim);
            }
            let before: Vec<Duration> = sides.iter().map(Side::cpu).collect::<Result<_>>()?;
            let calls = Cell::new(0usize);
            let mut steps: Vec<Box<dyn FnMut() -> Result<()> + '_>> = Vec::new();
            for (shim, side) in shims.iter_mut().zip(&sides) {
                let corpus: &Corpus = &side.corpus;
                let calls = &calls;
                let mut i = 0usize;
                steps.push(Box::new(move || {
                    i += 1;
                    if side.name == "this build" {
                        calls.set(i);
                    }
                    let arguments = if command == "create" {
                        json!({"command": "create", "path": format!("{}/create-{i:05}.md", crate::run::write_folder()),
                               "content": crate::run::cited_text(corpus, i, true)})
                    } else {
                        json!({"command": "append", "path": format!("{}/append.md", crate::run::write_folder()),
                               "content": crate::run::cited_text(corpus, i, false)})
                    };
                    shim.call_tool("write", arguments)?;
                    Ok(())
                }));
            }
            let mut refs: Vec<&mut dyn FnMut() -> Result<()>> = steps
                .iter_mut()
                .map(|s| &mut **s as &mut dyn FnMut() -> Result<()>)
                .collect();
            let summaries = measure_interleaved(plan, &mut refs)?;
            drop(refs);
            drop(steps);
            let calls = calls.get().max(1) as u32;
            for ((side, summary), before) in sides.iter().zip(&summaries).zip(&before) {
                let cpu = side.cpu()?.saturating_sub(*before) / calls;
                let mut note = format!("daemon CPU {} per write", format_duration(cpu));
                if sides.len() > 1 {
                    let ratio = summary.p50.as_secs_f64() / summaries[0].p50.as_secs_f64();
                    note.push_str(&format!("; p50 {ratio:.2}× base's; round-robin with base"));
                }
                rows.push(
                    Row::new(
                        figure,
                        &label,
                        &format!("shim, {}", side.name),
                        Figure::Latency(*summary),
                    )
                    .floor("fsync", floor.p50)
                    .note(note),
                );
            }
            for shim in shims {
                shim.close()?;
            }
        }
        for &writers in &settings.writers {
            let mut rates = vec![Vec::new(); sides.len()];
            let mut cpus = vec![Duration::ZERO; sides.len()];
            let mut eaches = vec![Vec::new(); sides.len()];
            for round in 0..2 {
                for (k, side) in sides.iter().enumerate() {
                    let before = side.cpu()?;
                    let (rate, each) = concurrent_writes(
                        settings,
                        &side.home,
                        &side.corpus,
                        writers,
                        &format!("r{round}"),
                    )?;
                    cpus[k] += side.cpu()?.saturating_sub(before);
                    rates[k].push(rate);
                    eaches[k].push(each);
                }
            }
            let writes = 2 * writers * (settings.iterations / 4).max(5);
            let best = |r: &Vec<f64>| r.iter().cloned().fold(0.0, f64::max);
            for (k, side) in sides.iter().enumerate() {
                let mut note = format!(
                    "two rounds (taking turns): {}; daemon CPU {} per write; write p50 {} / p99 {} (last round)",
                    rates[k]
                        .iter()
                        .map(|r| format!("{r:.0}/s"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    format_duration(cpus[k] / writes as u32),
                    format_duration(eaches[k][1].p50),
                    format_duration(eaches[k][1].p99),
                );
                if sides.len() > 1 {
                    note.push_str(&format!(
                        "; best {:.2}× base's",
                        best(&rates[k]) / best(&rates[0])
                    ));
                }
                rows.push(
                    Row::new(
                        &format!("committed writes/s, {writers} concurrent writers"),
                        &label,
                        &format!("shim, {}", side.name),
                        Figure::PerSecond(best(&rates[k])),
                    )
                    .note(note),
                );
            }
        }
        for mut side in sides {
            side.home.stop_daemon()?;
        }
    }
    Ok(rows)
}
