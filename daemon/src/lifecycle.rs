//! The daemon's life: take the pidfile lock, open the store, bind the socket, report
//! ready, keep the index current, serve until stopped, then stop in an order that lets
//! clients tell "stopping" from "gone" (ARCHITECTURE.md, "Stopping"):
//!
//! 1. close the socket and remove its file: new clients see no daemon, find the
//!    pidfile locked, and wait for this process to exit;
//! 2. admit no new request (`daemon_stopping`: not started, send it again), let the
//!    requests admitted finish and be answered (≤ `DRAIN_GRACE`; HTTP tool calls are
//!    counted too), then tell every MCP connection that nothing it still waits for was
//!    started;
//! 3. finish HTTP (≤ `HTTP_SHUTDOWN_GRACE`) and git's index;
//! 4. stop the runtime, which waits for blocking work still running;
//! 5. remove the pidfile and exit: the kernel releases the lock with the process, so
//!    "the pidfile lock is free" means "the old daemon has exited".

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use alexandria_proto::{BUILD, Home, PROTOCOL_VERSION, StartupNotice};
use anyhow::{Context, Result};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;

use crate::auth::Auth;
use crate::context::{DaemonContext, HttpInfo, Inflight};
use crate::mcp::calllog;
use crate::mcp::sessions::Sessions;
use crate::transport::http::{self, HttpOverrides};
use crate::transport::socket;
use crate::workspace::Store;

/// How long shutdown waits for HTTP connections to finish.
const HTTP_SHUTDOWN_GRACE: Duration = Duration::from_secs(3);
/// How long shutdown waits for socket requests in flight (tool calls, an ingest).
const DRAIN_GRACE: Duration = Duration::from_secs(20);
/// How long the MCP connections get to write their closing notice after the drain.
const CLOSING_GRACE: Duration = Duration::from_secs(1);
/// How long the runtime's shutdown waits for blocking work that outlived the drain;
/// work cut off after that is recovered at the next start, as after a crash.
const BLOCKING_GRACE: Duration = Duration::from_secs(5);
/// How long the stop waits to write git's indexes the last writes left unwritten
/// (`commit/settle.rs`): before the clean stamp, and once more at the very end.
const SETTLE_GRACE: Duration = Duration::from_secs(10);
const LAST_SETTLE_GRACE: Duration = Duration::from_secs(1);
/// How long a starting daemon waits for a stopping one to exit. A spawned daemon's
/// shim has waited already (and waits for the ready notice for 5 s); a service
/// manager's daemon may be started right after a `daemon stop`.
const SPAWNED_LOCK_WAIT: Duration = Duration::from_secs(3);
const FOREGROUND_LOCK_WAIT: Duration = Duration::from_secs(30);

/// The locked pidfile. Never dropped: only the process's exit releases the lock.
static PID_LOCK: OnceLock<File> = OnceLock::new();

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
    crate::memory::limit_arenas();
    crate::workspace::git::configure_libgit2();
    let home = options.home.clone();
    if let Err(error) = take_pidfile(&options) {
        notify(&StartupNotice::Failed {
            message: format!("{error:#}"),
        });
        return Err(error);
    }
    // Two workers: quick calls of two sessions can overlap. One worker was measured
    // (BENCHMARKS.md, fourth session of 2026-12-07): about 40 % fewer context switches
    // and a faster bare ping, but no call faster end to end beyond the noise, and a
    // read of one page slower in the round-robin.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(32)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let result = runtime.block_on(run_async(options));
    // Blocking work still running (a tool call or ingest past the drain) ends here.
    runtime.shutdown_timeout(BLOCKING_GRACE);
    // git's indexes that writes since step 4 left unwritten (none, mostly).
    crate::commit::settle::all_within(LAST_SETTLE_GRACE);
    if let Some(delay) = crate::faults::delay_for("shutdown") {
        std::thread::sleep(delay);
    }
    // Removed while still locked; a daemon waiting on the old file sees it is gone
    // (`lock_pidfile` checks that the file it locked is still the pidfile).
    let _ = std::fs::remove_file(home.pid_file());
    if result.is_ok() {
        tracing::info!("alexandriad stopped");
    }
    result
}

/// Create the home and take its pidfile lock. Run in the foreground (by a service
/// manager or by hand) while a daemon that a shim started is running, ask that one to
/// step down, so the managed daemon is the one that serves (shims reconnect to it).
fn take_pidfile(options: &DaemonOptions) -> Result<()> {
    let home = &options.home;
    crate::workspace::ensure_layout(home)
        .with_context(|| format!("cannot create the home {}", home.root().display()))?;
    let wait = if options.spawned {
        SPAWNED_LOCK_WAIT
    } else {
        FOREGROUND_LOCK_WAIT
    };
    let file = match lock_pidfile(home, wait) {
        Ok(file) => file,
        Err(PidfileError::Running { holder, .. }) if !options.spawned => {
            tracing::info!(%holder, "another daemon runs: asking it to step down");
            ask_running_daemon_to_stop(home);
            // It may accept connections for a moment more (an older build answers
            // before it closes its socket): wait for its exit either way.
            lock_pidfile_after_stop(home, wait)?
        }
        Err(error) => return Err(error.into()),
    };
    let _ = PID_LOCK.set(file);
    Ok(())
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
    } = started;
    let home = context.store.home.clone();
    notify(&StartupNotice::Ready {
        pid: std::process::id(),
        socket: home.socket().display().to_string(),
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
    tokio::spawn(crate::memory::release_when_quiet(
        Arc::clone(&context.inflight),
        Arc::clone(&context.store),
    ));
    // Sources sync on their own threads: never on the runtime, never under a lock
    // while they wait on the network.
    // Before the socket serves anything: sources a rebuilt state.db lost come back.
    crate::sources::ledger::restore_all(&context.store);
    crate::sources::scheduler::spawn(Arc::clone(&context.store));
    // Workspaces with a git remote sync on their own thread (network never under a lock).
    crate::sync::spawn(Arc::clone(&context.store));
    let signals = tokio::spawn(wait_for_signal(Arc::clone(&context)));
    let http_server = http_listener.map(|listener| {
        let context = Arc::clone(&context);
        tokio::spawn(async move {
            let config = context.store.config.http.clone();
            http::serve(listener, context, &config).await;
        })
    });
    socket::serve(listener, Arc::clone(&context)).await;
    // Admit no new request from here on (one read from now on is answered
    // `daemon_stopping`: not started, send it again).
    context.inflight.close();
    // 1. The listener is closed; its file goes too. We still hold the pidfile lock,
    //    so the path is ours to remove and nobody can bind a new one yet.
    let _ = std::fs::remove_file(home.socket());
    signals.abort();
    let stopping = Instant::now();
    // 2. The requests admitted finish and are answered.
    tracing::info!(
        inflight = context.inflight.count(),
        "stopping: answering the requests in flight"
    );
    if tokio::time::timeout(DRAIN_GRACE, context.inflight.drained())
        .await
        .is_err()
    {
        tracing::warn!(
            inflight = context.inflight.count(),
            "requests still running after {}s; stopping anyway",
            DRAIN_GRACE.as_secs()
        );
    } else {
        // Every admitted request is answered: each MCP connection tells its shim that
        // whatever it still waits for was never started, and the shim sends that to
        // the next daemon. Then the sessions close with the runtime.
        context.inflight.settle();
        if tokio::time::timeout(CLOSING_GRACE, context.inflight.writers_closed())
            .await
            .is_err()
        {
            tracing::warn!("MCP connections did not take their closing notice in time");
        }
    }
    // 3. HTTP (its graceful shutdown ran meanwhile).
    if let Some(mut server) = http_server {
        // At least a moment, even after a long drain: the last answers may still be in
        // the connections' write buffers.
        let left = HTTP_SHUTDOWN_GRACE
            .saturating_sub(stopping.elapsed())
            .max(Duration::from_secs(1));
        if tokio::time::timeout(left, &mut server).await.is_err() {
            tracing::warn!("HTTP connections still open at shutdown; closing them");
            server.abort();
        }
    }
    // 4. git's indexes the last writes left unwritten are written and their locks
    //    released, before the clean stamp: from there state.db's write lock is never
    //    given back, and background work that holds a workspace's index guard while it
    //    waits for that lock (the watcher's re-index) would keep the guard until its
    //    busy timeout (30 s), and the stop with it.
    let _ = tokio::task::spawn_blocking(|| crate::commit::settle::all_within(SETTLE_GRACE)).await;
    //    What each repository was last seen consistent as, for the next start's check
    //    for pages a hand commit dropped (`workspace::dropped::persist`).
    let store = std::sync::Arc::clone(&context.store);
    let _ = tokio::task::spawn_blocking(move || {
        for workspace in store.list_workspaces() {
            let root = store.workspace_dir(&workspace);
            let _ = store.state(&workspace).with_repo(&root, |repo| {
                crate::workspace::dropped::persist(repo);
                Ok::<(), git2::Error>(())
            });
        }
    })
    .await;
    // 5. A clean stop: the next start may skip state.db's full check.
    crate::db::mark_clean(&context.store.pool, &home.state_db());
    Ok(())
}

struct Started {
    listener: UnixListener,
    http_listener: Option<TcpListener>,
    context: Arc<DaemonContext>,
}

async fn start(options: &DaemonOptions) -> Result<Started> {
    let home = options.home.clone();
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
        move || {
            let mut lines = crate::commit::recover(&store);
            // Then merges a sync was putting in place.
            lines.extend(crate::sync::recover(&store));
            lines
        }
    })
    .await
    .context("recovery panicked")?;
    for line in recovered {
        tracing::warn!("recovery: {line}");
    }
    let listener = bind_socket(&home)?;
    let http_config = &store.config.http;
    let auth = Auth::load(
        &home,
        options.http.token_required || http_config.token_required,
    )
    .context("cannot load the HTTP token key")?;
    let address = http::bind_address(http_config, &options.http)?;
    // Refusing an open network bind is fatal; a busy port only costs HTTP, not the
    // socket that every shim needs.
    let (http_listener, http_error) = match http::bind(address, &auth).await {
        Ok(listener) => (Some(listener), None),
        Err(http::HttpError::Listen { address, source }) => {
            let message = if source.kind() == std::io::ErrorKind::AddrInUse {
                format!(
                    "cannot listen for HTTP on {address}: the port is taken (another program, or the daemon of another alexandria home). Set `[http] port` in {} or start with --port N",
                    home.config_file().display()
                )
            } else {
                format!("cannot listen for HTTP on {address}: {source}")
            };
            tracing::error!("{message}; serving without HTTP");
            (None, Some(message))
        }
        Err(error) => return Err(error.into()),
    };
    let oauth = crate::auth::oauth::OAuthServer::load(
        store.pool.clone(),
        home.config_file(),
        &store.config.remote,
    )
    .context("cannot load the remote access settings")?;
    let http = http_listener
        .as_ref()
        .and_then(|l| l.local_addr().ok())
        .map(|bound| HttpInfo {
            address: bound,
            ephemeral: address.port() == 0,
        });
    let (shutdown, _) = watch::channel(false);
    let context = Arc::new(DaemonContext {
        store,
        sessions: Arc::new(Sessions::default()),
        started: Instant::now(),
        auth: Arc::new(auth),
        web: Arc::default(),
        oauth: Arc::new(oauth),
        http,
        inflight: Arc::new(Inflight::default()),
        http_error,
        shutdown,
    });
    Ok(Started {
        listener,
        http_listener,
        context,
    })
}

/// Bind the socket where `Home::socket_place` says (in the home, or a short per-user
/// path when the home's path is too long), 0600 in a 0700 directory.
fn bind_socket(home: &Home) -> Result<UnixListener> {
    let socket = home.socket();
    home.prepare_socket_dir().with_context(|| {
        format!(
            "cannot prepare the socket directory for {}",
            socket.display()
        )
    })?;
    // We hold the pidfile lock, so no other daemon owns this socket: a leftover file
    // is stale.
    let _ = std::fs::remove_file(&socket);
    let listener = UnixListener::bind(&socket)
        .with_context(|| format!("cannot listen on {}", socket.display()))?;
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("cannot restrict {}", socket.display()))?;
    Ok(listener)
}

#[derive(Debug, thiserror::Error)]
enum PidfileError {
    /// The holder answers on the socket: a daemon is running.
    #[error("another alexandriad is already running (pidfile {path}: {holder})")]
    Running { path: String, holder: String },
    /// The holder does not answer and kept the lock for the whole wait.
    #[error(
        "another alexandriad (pidfile {path}: {holder}) is still stopping after {secs}s; wait for it to exit, or end it with `kill <pid>`"
    )]
    Stopping {
        path: String,
        holder: String,
        secs: u64,
    },
    #[error("cannot lock {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

/// `lock_pidfile` for a holder that was asked to stop: that it still answers is no
/// reason to give up before `wait`.
fn lock_pidfile_after_stop(home: &Home, wait: Duration) -> Result<File, PidfileError> {
    let deadline = Instant::now() + wait;
    loop {
        match lock_pidfile(home, deadline.saturating_duration_since(Instant::now())) {
            Err(PidfileError::Running { .. }) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            result => return result,
        }
    }
}

/// Lock `run/daemon.pid` for the daemon's lifetime and write "pid version" and the
/// socket path into it.
/// While another process holds it and does not answer on the socket (it is stopping),
/// wait up to `wait` for it to exit.
fn lock_pidfile(home: &Home, wait: Duration) -> Result<File, PidfileError> {
    let path = home.pid_file();
    let io = |source| PidfileError::Io {
        path: path.display().to_string(),
        source,
    };
    let deadline = Instant::now() + wait;
    loop {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => {
                // The daemon that held it removes the file as it exits: if that
                // happened after we opened it, we locked a file nobody else sees.
                let ours = file.metadata().map_err(io)?;
                match std::fs::metadata(&path) {
                    Ok(now) if now.ino() == ours.ino() && now.dev() == ours.dev() => {}
                    _ => continue,
                }
                file.set_len(0).map_err(io)?;
                // "pid build", then the socket path (clients whose environment names
                // another short socket directory find this daemon through it).
                writeln!(file, "{} {}", std::process::id(), BUILD).map_err(io)?;
                file.write_all(home.socket().as_os_str().as_bytes())
                    .and_then(|()| file.write_all(b"\n"))
                    .map_err(io)?;
                file.sync_all().map_err(io)?;
                return Ok(file);
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim().to_string();
                if home.connect_socket().is_ok() {
                    return Err(PidfileError::Running {
                        path: path.display().to_string(),
                        holder,
                    });
                }
                if Instant::now() >= deadline {
                    return Err(PidfileError::Stopping {
                        path: path.display().to_string(),
                        holder,
                        secs: wait.as_secs(),
                    });
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
        }
    }
}

/// Send `Stop` to the daemon on our socket and read its answer; `lock_pidfile` then
/// waits for it to exit.
fn ask_running_daemon_to_stop(home: &Home) {
    use std::io::BufRead;
    let hello = alexandria_proto::Hello {
        protocol: PROTOCOL_VERSION,
        build: BUILD.into(),
        kind: alexandria_proto::ConnectionKind::Control,
    };
    if let Ok(mut stream) = home.connect_socket() {
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

/// Watch for outside edits and catch up with the disk: the watcher thread registers a
/// workspace's watch first and then catches it up, so no change falls between the two.
async fn keep_index_current(context: Arc<DaemonContext>) {
    crate::index::engine::start(&context.store);
    crate::commit::watch::spawn(Arc::clone(&context.store));
    crate::commit::late::spawn(Arc::clone(&context.store));
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
