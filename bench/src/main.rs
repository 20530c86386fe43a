//! `alexandria-bench`: run the benchmark, print the table, write BENCHMARKS.md.

use std::path::PathBuf;
use std::process::ExitCode;

use alexandria_bench::corpus;
use alexandria_bench::machine::Machine;
use alexandria_bench::procs::{self, Binaries};
use alexandria_bench::report;
use alexandria_bench::run::{self, Settings};
use anyhow::{Context, Result};
use clap::Parser;

#[derive(Parser)]
#[command(
    name = "alexandria-bench",
    about = "Benchmark the real alexandria shim and daemon on a generated corpus (issue 6)"
)]
struct Args {
    /// Corpus sizes in pages, comma-separated (1k = 1000 pages)
    #[arg(long, default_value = "1k,10k,100k", value_delimiter = ',')]
    sizes: Vec<String>,
    /// Timed iterations per tool figure (pings take 10×, cold starts fewer)
    #[arg(long)]
    iterations: Option<usize>,
    /// CI configuration: 1k pages, few iterations; never judges timings
    #[arg(long)]
    quick: bool,
    /// Where to write the report
    #[arg(long, default_value = "BENCHMARKS.md")]
    out: PathBuf,
    /// Directory holding `alexandria` and `alexandriad` (default: next to this binary)
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Corpus seed
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Concurrent writer counts, comma-separated
    #[arg(long, default_value = "1,8,32", value_delimiter = ',')]
    writers: Vec<usize>,
    /// Only generate the corpus of the first size into this workspace directory
    /// (its raw/ and wiki/), then exit: for profiling by hand
    #[arg(long, value_name = "WORKSPACE_DIR")]
    generate_only: Option<PathBuf>,
    /// Only measure how long a restart takes to rebuild a lost or corrupted state.db
    /// (issue 18), for each size, after this many agent writes; prints the table and
    /// writes no report
    #[arg(long, value_name = "WRITES")]
    rebuild: Option<usize>,
    /// Only measure the read-only tools (search, read, guide, history) over the shim
    /// and HTTP, for each size, after the cold index; prints the table and writes no
    /// report. With ALEXANDRIA_BENCH_HOOK=<command> each tool is then run again between
    /// `<command> begin|end <case> <daemon pid> <calls>`, for profiling by hand
    #[arg(long)]
    tools: bool,
    /// Only measure sync through a git remote (issue 12), for each size: first push,
    /// clone, and a sync of this many commits made elsewhere; prints the table and
    /// writes no report
    #[arg(long, value_name = "BACKLOG")]
    sync: Option<usize>,
    /// Only the search index (issue 15), for each size: cold index time and memory,
    /// searches and the other read-only tools over a socket client (with
    /// --base-bin-dir: the same calls to a daemon of that build too, round-robin),
    /// rebuilds after losing the index or state.db; prints the table and writes no
    /// report
    #[arg(long)]
    search: bool,
    /// Only check that a long-running daemon stays flat (issue 15): after the cold
    /// index, four clients send mixed calls (searches, reads, guide, history, writes)
    /// for this many seconds; the daemon's RSS after the cold index, under the load
    /// and after idling, for each size; prints the table and writes no report
    #[arg(long, value_name = "SECONDS")]
    soak: Option<u64>,
    /// Only the write rows (issue 15), for each size: single creates and appends, and
    /// the concurrent writers; prints the table and writes no report
    #[arg(long)]
    writes: bool,
    /// Full run: seconds of mixed load (four clients, every read-only case and writes)
    /// after the figures of each size of 10k pages and more, for the daemon's memory
    /// after an hour of calls compressed (0: leave it out; --quick always does)
    #[arg(long, value_name = "SECONDS", default_value_t = 180)]
    mixed_load: u64,
    /// With --writes or --search: also run the binaries in this directory (a base
    /// build), with the same calls round-robin, for ratios that hold on a busy machine
    #[arg(long)]
    base_bin_dir: Option<PathBuf>,
}

fn main() -> ExitCode {
    match run_main() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("alexandria-bench: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run_main() -> Result<()> {
    let args = Args::parse();
    let sizes = if args.quick {
        vec![1000]
    } else {
        args.sizes
            .iter()
            .map(|s| run::parse_size(s))
            .collect::<Result<Vec<_>>>()?
    };
    let settings = Settings {
        sizes,
        iterations: args
            .iterations
            .unwrap_or(if args.quick { 10 } else { 200 })
            .max(1),
        quick: args.quick,
        seed: args.seed,
        writers: args.writers.into_iter().filter(|w| *w > 0).collect(),
        mixed_load: std::time::Duration::from_secs(if args.quick { 0 } else { args.mixed_load }),
    };
    if let Some(workspace) = &args.generate_only {
        let pages = settings.sizes.first().copied().unwrap_or(1000);
        let corpus = corpus::generate(settings.seed, pages, workspace)?;
        eprintln!(
            "alexandria-bench: wrote {} pages ({} bytes) into {}",
            corpus.pages,
            corpus.bytes,
            workspace.display()
        );
        return Ok(());
    }
    let binaries = Binaries::locate(args.bin_dir.as_deref())?;
    if let Some(writes) = args.rebuild {
        let mut rows = Vec::new();
        for &pages in &settings.sizes {
            rows.extend(alexandria_bench::rebuild::run(
                &binaries,
                settings.seed,
                pages,
                writes,
            )?);
        }
        print_results(&report::table(&rows), "");
        return Ok(());
    }
    if args.tools {
        let rows = run::tools(&settings, &binaries)?;
        print_results(&report::table(&rows), "");
        return Ok(());
    }
    if args.writes {
        let base = args
            .base_bin_dir
            .as_deref()
            .map(|dir| Binaries::locate(Some(dir)))
            .transpose()?;
        let load = procs::load_average();
        let rows = alexandria_bench::writes::run(&settings, &binaries, base.as_ref())?;
        eprintln!(
            "alexandria-bench: load average at start {load}, at end {}",
            procs::load_average()
        );
        print_results(&report::table(&rows), "");
        return Ok(());
    }
    if args.search {
        let base = args
            .base_bin_dir
            .as_deref()
            .map(|dir| Binaries::locate(Some(dir)))
            .transpose()?;
        let load = procs::load_average();
        let mut rows = Vec::new();
        for &pages in &settings.sizes {
            rows.extend(alexandria_bench::search::run(
                &binaries,
                base.as_ref(),
                settings.seed,
                pages,
                settings.iterations,
            )?);
        }
        eprintln!(
            "alexandria-bench: load average at start {load}, at end {}",
            procs::load_average()
        );
        print_results(&report::table(&rows), "");
        return Ok(());
    }
    if let Some(seconds) = args.soak {
        let mut rows = Vec::new();
        for &pages in &settings.sizes {
            rows.extend(alexandria_bench::soak::run(
                &settings,
                &binaries,
                pages,
                std::time::Duration::from_secs(seconds),
            )?);
        }
        print_results(&report::table(&rows), "");
        return Ok(());
    }
    if let Some(backlog) = args.sync {
        let mut rows = Vec::new();
        for &pages in &settings.sizes {
            rows.extend(alexandria_bench::sync::run(
                &binaries,
                settings.seed,
                pages,
                backlog,
            )?);
        }
        print_results(&report::table(&rows), "");
        return Ok(());
    }
    let machine = Machine::describe(&procs::homes_parent());
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let load_at_start = procs::load_average();
    let outcome = run::run(&settings, &binaries)?;
    let load_at_end = procs::load_average();
    let mut targets = outcome.targets;
    if settings.quick {
        // CI runs on shared machines: report timings, judge none.
        for target in &mut targets {
            target.reached = None;
        }
    }
    let document = report::document(
        &machine,
        (&load_at_start, &load_at_end),
        &command,
        &outcome.rows,
        &targets,
        &outcome.notes,
    );
    std::fs::write(&args.out, &document)
        .with_context(|| format!("cannot write {}", args.out.display()))?;
    print_results(
        &report::table(&outcome.rows),
        &report::targets_table(&targets),
    );
    eprintln!("alexandria-bench: written to {}", args.out.display());
    Ok(())
}

#[allow(clippy::print_stdout)] // the tables are this program's output
fn print_results(table: &str, targets: &str) {
    println!("{table}");
    println!("{targets}");
}
