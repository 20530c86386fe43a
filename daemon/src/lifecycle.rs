//! The daemon's life: take the pidfile lock, open the store, bind the socket, report
//! ready, keep the index current, serve until stopped, clean up.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::sync::Arc;
use std::time::{Duration, Instant};

use alexandria_proto::{BUILD, Home, PROTOCOL_VERSION, StartupNotice};
use anyhow::{Context, Result, anyhow};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;

use crate::auth::Auth;
use crate::context::{DaemonContext, HttpInfo};
use crate::mcp::calllog;
use crate::mcp::sessions::Sessions;
use crate::transport::http::{self, HttpOverrides};
use crate::transport::socket;
use crate::workspace::Store;

/// How long shutdown waits for HTTP connections to finish.
const HTTP_SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

#[derive(Debug, Clone)]
pub struct DaemonOptions {
    pub home: Home,
    /// Started by a shim: report readiness on stdout, then detach from it.
    pub spawned: bool,
    /// `--bind`, `--port`, `--token-required`.
    pub http: HttpOverrides,
}

/// Run the daemon until it is stopped. Blocks.
pub fn run(options: DaemonOptions) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(32)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(run_async(options))
}

async fn run_async(options: DaemonOptions) -> Result<()> {
    let started = match start(&options).await {
        Ok(started) => started,
        Err(error) => {
            notify(&StartupNotice::Failed {
                message: format!("{error:#}"),
            });
            return Err(error);
        }
    };
    let Started {
        listener,
        http_listener,
        context,
        pid_lock,
    } = started;
    notify(&StartupNotice::Ready {
        pid: std::process::id(),
        socket: context.store.home.socket().display().to_string(),
    });
    if options.spawned {
        silence_stdout();
    }
    tracing::info!(
        pid = std::process::id(),
        version = BUILD,
        "alexandriad ready"
    );
    tokio::spawn(keep_index_current(Arc::clone(&context)));
    tokio::spawn(prune_call_logs(Arc::clone(&context)));
    tokio::spawn(sync_git_indexes(Arc::clone(&context)));
    let signals = tokio::spawn(wait_for_signal(Arc::clone(&context)));
    let http_server = http_listener.map(|listener| {
        let context = Arc::clone(&context);
        tokio::spawn(async move {
            let config = context.store.config.http.clone();
            http::serve(listener, context, &config).await;
        })
    });
    socket::serve(listener, Arc::clone(&context)).await;
    signals.abort();
    let store = Arc::clone(&context.store);
    let _ = tokio::task::spawn_blocking(move || store.sync_git_indexes()).await;
    if let Some(mut server) = http_server
        && tokio::time::timeout(HTTP_SHUTDOWN_GRACE, &mut server)
            .await
            .is_err()
    {
        tracing::warn!("HTTP connections still open at shutdown; closing them");
        server.abort();
    }
    let _ = std::fs::remove_file(context.store.home.socket());
    let _ = std::fs::remove_file(context.store.home.pid_file());
    drop(pid_lock);
    tracing::info!("alexandriad stopped");
    Ok(())
}

struct Started {
    listener: UnixListener,
    http_listener: Option<TcpListener>,
    context: Arc<DaemonContext>,
    pid_lock: File,
}

async fn start(options: &DaemonOptions) -> Result<Started> {
    let home = options.home.clone();
    crate::workspace::ensure_layout(&home)
        .with_context(|| format!("cannot create the home {}", home.root().display()))?;
    let pid_lock = match lock_pidfile(&home) {
        Ok(lock) => lock,
        // Run in the foreground (by a service manager or by hand) while a daemon that a
        // shim started is running: take over, so the managed daemon is the one that
        // serves. Shims reconnect to it by themselves.
        Err(error) if !options.spawned => {
            tracing::info!("another daemon runs: asking it to step down ({error:#})");
            ask_running_daemon_to_stop(&home);
            lock_pidfile(&home)?
        }
        Err(error) => return Err(error),
    };
    let store = tokio::task::spawn_blocking({
        let home = home.clone();
        move || Store::open(home)
    })
    .await
    .context("opening the store panicked")?
    .context("cannot open the store")?;
    // Finish or drop writes interrupted by a crash before anything is served.
    let recovered = tokio::task::spawn_blocking({
        let store = Arc::clone(&store);
        move || crate::commit::recover(&store)
    })
    .await
    .context("recovery panicked")?;
    for line in recovered {
        tracing::warn!("recovery: {line}");
    }
    // We hold the pidfile lock, so no other daemon owns this socket: a leftover file
    // is stale.
    let socket = home.socket();
    let _ = std::fs::remove_file(&socket);
    let listener = UnixListener::bind(&socket)
        .with_context(|| format!("cannot listen on {}", socket.display()))?;
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("cannot restrict {}", socket.display()))?;
    let http_config = &store.config.http;
    let auth = Auth::load(
        &home,
        options.http.token_required || http_config.token_required,
    )
    .context("cannot load the HTTP token key")?;
    let address = http::bind_address(http_config, &options.http)?;
    // Refusing an open network bind is fatal; a busy port only costs HTTP, not the
    // socket that every shim needs.
    let http_listener = match http::bind(address, &auth).await {
        Ok(listener) => Some(listener),
        Err(error @ http::HttpError::Listen { .. }) => {
            tracing::error!(%error, "serving without HTTP");
            None
        }
        Err(error) => return Err(error.into()),
    };
    let http = http_listener
        .as_ref()
        .and_then(|l| l.local_addr().ok())
        .map(|address| HttpInfo { address });
    let (shutdown, _) = watch::channel(false);
    let context = Arc::new(DaemonContext {
        store,
        sessions: Arc::new(Sessions::default()),
        started: Instant::now(),
        auth: Arc::new(auth),
        http,
        shutdown,
    });
    Ok(Started {
        listener,
        http_listener,
        context,
        pid_lock,
    })
}

/// Lock `run/daemon.pid` for the daemon's lifetime and write "pid version" into it.
fn lock_pidfile(home: &Home) -> Result<File> {
    let path = home.pid_file();
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            return Err(anyhow!(
                "another alexandriad is already running (pidfile {}: {})",
                path.display(),
                holder.trim()
            ));
        }
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(e).with_context(|| format!("cannot lock {}", path.display()));
        }
    }
    file.set_len(0)?;
    writeln!(file, "{} {}", std::process::id(), BUILD)?;
    file.sync_all()?;
    Ok(file)
}

/// Send `Stop` to the daemon on our socket and wait (≤ 10 s) until its pidfile lock
/// is free.
fn ask_running_daemon_to_stop(home: &Home) {
    use std::io::BufRead;
    let hello = alexandria_proto::Hello {
        protocol: PROTOCOL_VERSION,
        build: BUILD.into(),
        kind: alexandria_proto::ConnectionKind::Control,
    };
    if let Ok(mut stream) = std::os::unix::net::UnixStream::connect(home.socket()) {
        let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
        let _ = stream.write_all(&alexandria_proto::to_line(&hello));
        let _ = stream.write_all(&alexandria_proto::to_line(
            &alexandria_proto::ControlRequest::Stop,
        ));
        let mut reader = std::io::BufReader::new(stream);
        let mut line = String::new();
        while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
            line.clear();
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let free = File::options()
            .read(true)
            .open(home.pid_file())
            .map(|file| file.try_lock().is_ok())
            .unwrap_or(true);
        if free {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Print the startup notice on stdout for whoever spawned us.
fn notify(notice: &StartupNotice) {
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(&alexandria_proto::to_line(notice));
    let _ = stdout.flush();
}

/// Point stdout at /dev/null so that nothing later can write into the spawner's pipe
/// (which is gone once the spawning shim exits).
fn silence_stdout() {
    match File::options().write(true).open("/dev/null") {
        Ok(null) => {
            if let Err(error) = rustix::stdio::dup2_stdout(&null) {
                tracing::warn!(%error, "cannot detach stdout");
            }
        }
        Err(error) => tracing::warn!(%error, "cannot open /dev/null"),
    }
    // A new session, so the client's terminal signals never reach the daemon.
    let _ = rustix::process::setsid();
}

async fn wait_for_signal(context: Arc<DaemonContext>) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::warn!("cannot install signal handlers");
        return;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM"),
        _ = int.recv() => tracing::info!("SIGINT"),
    }
    context.shutdown();
}

/// Bring git's index up to date with recent commits, twice a second (see `workspace/git.rs`).
async fn sync_git_indexes(context: Arc<DaemonContext>) {
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let store = Arc::clone(&context.store);
        if let Err(error) = tokio::task::spawn_blocking(move || store.sync_git_indexes()).await {
            tracing::error!(%error, "git index sync panicked");
        }
    }
}

/// Watch for outside edits and catch up with the disk: the watcher thread registers a
/// workspace's watch first and then catches it up, so no change falls between the two.
async fn keep_index_current(context: Arc<DaemonContext>) {
    crate::commit::watch::spawn(Arc::clone(&context.store));
}

/// Delete old `logs/mcp-<date>.jsonl` files at start and then daily.
async fn prune_call_logs(context: Arc<DaemonContext>) {
    let logs = context.store.home.logs_dir();
    let retention_days = context.store.config.logs.retention_days;
    loop {
        let removed = calllog::prune(&logs, retention_days);
        if removed > 0 {
            tracing::info!(removed, retention_days, "pruned tool-call logs");
        }
        tokio::time::sleep(Duration::from_secs(6 * 60 * 60)).await;
    }
}
