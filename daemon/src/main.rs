//! `alexandriad`: a thin main over the daemon library.

use std::process::ExitCode;

use alexandria_daemon::transport::http::HttpOverrides;
use alexandria_daemon::{DaemonOptions, run};
use alexandria_proto::Home;
use clap::Parser;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

#[derive(Parser)]
#[command(
    name = "alexandriad",
    version = alexandria_proto::BUILD,
    about = "The alexandria daemon: owns the wikis and serves them over MCP (runs in the foreground)"
)]
struct Args {
    /// Home directory (default: $ALEXANDRIA_HOME, else ~/.alexandria)
    #[arg(long)]
    home: Option<std::path::PathBuf>,
    /// Set by `alexandria` when it starts the daemon in the background
    #[arg(long, hide = true)]
    spawned: bool,
    /// HTTP bind address (overrides config.toml [http] bind; non-loopback needs tokens)
    #[arg(long, value_name = "ADDR")]
    bind: Option<String>,
    /// HTTP port (overrides config.toml [http] port, default 4747; 0 picks a free port)
    #[arg(long, value_name = "N")]
    port: Option<u16>,
    /// Require a bearer token on every HTTP request (`alexandria daemon auth token`)
    #[arg(long)]
    token_required: bool,
}

/// Log lines queued for the file writer at most.
const LOG_LINES_BUFFERED: usize = 8_192;

fn main() -> ExitCode {
    let args = Args::parse();
    let home = match args.home.map(Home::new).or_else(Home::from_env) {
        Some(home) => home,
        None => {
            eprintln!("alexandriad: cannot locate the home: set ALEXANDRIA_HOME or HOME");
            return ExitCode::FAILURE;
        }
    };
    let _guard = init_logging(&home);
    match run(DaemonOptions {
        home,
        spawned: args.spawned,
        http: HttpOverrides {
            bind: args.bind,
            // ALEXANDRIA_HTTP_PORT: the test harness's way to give every daemon a free port.
            port: args.port.or_else(|| {
                std::env::var("ALEXANDRIA_HTTP_PORT")
                    .ok()
                    .and_then(|p| p.parse().ok())
            }),
            token_required: args.token_required,
        },
    }) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!("{error:#}");
            eprintln!("alexandriad: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Logs go to `logs/daemon.log.<date>` and, when `ALEXANDRIA_LOG` is set, to stderr
/// with that filter. Never to stdout.
fn init_logging(home: &Home) -> Option<tracing_appender::non_blocking::WorkerGuard> {
    let stderr_filter = std::env::var("ALEXANDRIA_LOG").ok();
    let stderr_layer = stderr_filter.as_ref().map(|filter| {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_filter(EnvFilter::new(filter))
    });
    let _ = std::fs::create_dir_all(home.logs_dir());
    let (file_layer, guard) = match tracing_appender::rolling::Builder::new()
        .rotation(tracing_appender::rolling::Rotation::DAILY)
        .filename_prefix("daemon")
        .filename_suffix("log")
        .max_log_files(7)
        .build(home.logs_dir())
    {
        Ok(appender) => {
            // Lines waiting for the log writer: tracing-appender's default of 128,000
            // preallocates 4 MiB the daemon keeps for good (issue 15); lines of a burst
            // beyond this many are dropped rather than making a tool call wait.
            let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
                .buffered_lines_limit(LOG_LINES_BUFFERED)
                .finish(appender);
            let layer = tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(writer)
                .with_filter(EnvFilter::new("info"));
            (Some(layer), Some(guard))
        }
        Err(_) => (None, None),
    };
    use tracing_subscriber::Layer;
    let _ = tracing_subscriber::registry()
        .with(stderr_layer)
        .with(file_layer)
        .try_init();
    guard
}
