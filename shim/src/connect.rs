//! Connect to the daemon's socket, starting `alexandriad` when none is running.
//!
//! The rules (after atuin and sccache): one start lock so that parallel shims start
//! exactly one daemon; the spawner waits for the daemon's explicit `StartupNotice` on
//! its stdout, for a few seconds at most; a daemon speaking an older protocol, or an
//! older build of the same protocol (an upgrade was installed while it ran), steps down
//! when greeted and is replaced.
//!
//! A daemon holds its pidfile lock until its process exits, and closes its socket as
//! soon as it begins to stop. So "the socket does not answer but the pidfile is locked"
//! means a daemon is stopping (or starting): whoever needs a daemon waits for it,
//! within `SETTLE_TIMEOUT`, instead of starting one that would be refused. A stale
//! socket file is left for the next daemon to replace (it does so once it holds the
//! pidfile lock, so it never removes a live daemon's socket).

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, ErrorKind, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use alexandria_proto::{
    BUILD, ConnectionKind, Hello, HelloReply, Home, PROTOCOL_VERSION, StartupNotice, home::HOME_ENV,
};
use anyhow::{Context, Result, anyhow, bail};

/// How long a spawner waits for the daemon's ready notice.
const START_TIMEOUT: Duration = Duration::from_secs(5);
/// How long any process waits for the start lock (another shim may be starting one).
const LOCK_TIMEOUT: Duration = Duration::from_secs(10);
/// How long to wait for the daemon's answer to `Hello`.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a client waits for a daemon that is stopping (it finishes the writes in
/// progress first) or starting, before it gives up.
pub const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);

/// An established, greeted connection.
pub struct Connection {
    pub stream: UnixStream,
    /// Buffered reader over a clone of `stream`; may hold bytes already read.
    pub reader: BufReader<UnixStream>,
    pub daemon_pid: u32,
}

/// Knows where the daemon lives and how to start it.
#[derive(Debug, Clone)]
pub struct Connector {
    pub home: Home,
}

impl Connector {
    /// The home given by `--home` (made absolute), else `$ALEXANDRIA_HOME`, else
    /// `~/.alexandria`.
    pub fn for_home(flag: Option<&Path>) -> Result<Connector> {
        if let Some(dir) = flag {
            let dir = if dir.is_absolute() {
                dir.to_path_buf()
            } else {
                std::env::current_dir()
                    .context("cannot read the current directory to resolve --home")?
                    .join(dir)
            };
            return Ok(Connector {
                home: Home::new(dir),
            });
        }
        let home = Home::from_env().ok_or_else(|| {
            anyhow!("cannot locate the alexandria home: set ALEXANDRIA_HOME or HOME")
        })?;
        Ok(Connector { home })
    }

    /// Connect, starting the daemon if needed, and complete the handshake.
    pub fn connect(&self, kind: ConnectionKind) -> Result<Connection> {
        let hello = Hello {
            protocol: PROTOCOL_VERSION,
            build: BUILD.to_string(),
            kind,
        };
        let mut last_error = None;
        for _attempt in 0..5 {
            let stream = match self.home.connect_socket() {
                Ok(stream) => stream,
                Err(e) if is_absent(&e) => {
                    self.start_daemon()?;
                    continue;
                }
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!("cannot connect to {}", self.home.socket().display())
                    });
                }
            };
            match greet(stream, &hello) {
                Ok(Greeting::Ready(connection)) => return Ok(connection),
                // The next round finds no socket and waits for this daemon's exit
                // before it starts ours.
                Ok(Greeting::Replaced { pid }) => {
                    wait_until_gone(&self.home);
                    last_error = Some(anyhow!("daemon {pid} was stepping down"));
                }
                // The daemon died while we greeted it (killed, crashed, stopping):
                // connect again, which starts a new one if needed.
                Err(e) if is_connection_loss(&e) => {
                    thread::sleep(Duration::from_millis(20));
                    last_error = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last_error.unwrap_or_else(|| anyhow!("could not reach the daemon")))
    }

    /// Connect only if a daemon is already running; `None` when there is none.
    pub fn connect_existing(&self, kind: ConnectionKind) -> Result<Option<Connection>> {
        let hello = Hello {
            protocol: PROTOCOL_VERSION,
            build: BUILD.to_string(),
            kind,
        };
        let mut last_error = None;
        for _attempt in 0..5 {
            let stream = match self.home.connect_socket() {
                Ok(stream) => stream,
                Err(e) if is_absent(&e) => return Ok(None),
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!("cannot connect to {}", self.home.socket().display())
                    });
                }
            };
            match greet(stream, &hello) {
                Ok(Greeting::Ready(connection)) => return Ok(Some(connection)),
                Ok(Greeting::Replaced { .. }) => {
                    wait_until_gone(&self.home);
                    return Ok(None);
                }
                // It began to stop (or died) as we greeted it: look again.
                Err(e) if is_connection_loss(&e) => {
                    thread::sleep(Duration::from_millis(20));
                    last_error = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last_error.unwrap_or_else(|| anyhow!("could not reach the daemon")))
    }

    /// Start a daemon unless another process already did. Returns once a daemon
    /// accepts connections.
    pub fn start_daemon(&self) -> Result<()> {
        self.start_daemon_with(&[])
    }

    /// `start_daemon`, passing `args` (e.g. `--port 8080`) to a daemon it starts.
    pub fn start_daemon_with(&self, args: &[String]) -> Result<()> {
        let run_dir = self.home.run_dir();
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&run_dir)
            .with_context(|| format!("cannot create {}", run_dir.display()))?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(self.home.start_lock())
            .with_context(|| format!("cannot open {}", self.home.start_lock().display()))?;
        lock_with_timeout(&lock, LOCK_TIMEOUT)?;
        let result = self.start_locked(args);
        drop(lock);
        result
    }

    fn start_locked(&self, args: &[String]) -> Result<()> {
        // Someone else may have started a daemon while we waited for the lock, or one
        // may be stopping: wait until one answers or the pidfile lock is free.
        if self.settle(SETTLE_TIMEOUT)? == Settled::Answering {
            return Ok(());
        }
        let daemon = daemon_binary();
        let mut command = Command::new(&daemon);
        command
            .arg("--spawned")
            .args(args)
            .env(HOME_ENV, self.home.root())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .process_group(0);
        if std::env::var_os("ALEXANDRIA_LOG").is_none() {
            command.stderr(Stdio::null());
        }
        let mut child = command.spawn().with_context(|| {
            format!(
                "cannot start the daemon {}: install alexandriad next to alexandria or on PATH",
                daemon.display()
            )
        })?;
        let stdout = child.stdout.take().expect("stdout was piped");
        let (sender, receiver) = mpsc::channel();
        thread::spawn(move || {
            let mut line = String::new();
            let result = BufReader::new(stdout).read_line(&mut line).map(|_| line);
            let _ = sender.send(result);
        });
        // Reap the child if it exits while we live, so it never lingers as a zombie.
        thread::spawn(move || {
            let _ = child.wait();
        });
        let debug_hint = format!(
            "run `ALEXANDRIA_HOME={} ALEXANDRIA_LOG=debug {} ` in a terminal to see why, or read {}",
            self.home.root().display(),
            daemon.display(),
            self.home.logs_dir().join("daemon.*.log").display()
        );
        let line = match receiver.recv_timeout(START_TIMEOUT) {
            Ok(Ok(line)) => line,
            Ok(Err(e)) => bail!("the daemon did not report its start ({e}); {debug_hint}"),
            Err(_) => bail!(
                "the daemon did not report ready within {}s; {debug_hint}",
                START_TIMEOUT.as_secs()
            ),
        };
        match serde_json::from_str::<StartupNotice>(line.trim()) {
            Ok(StartupNotice::Ready { .. }) => Ok(()),
            // Lost a race with a daemon started without the start lock (by a service
            // manager): it is the one to use.
            Ok(StartupNotice::Failed { .. }) if self.home.connect_socket().is_ok() => Ok(()),
            Ok(StartupNotice::Failed { message }) => {
                bail!("the daemon failed to start: {message}; {debug_hint}")
            }
            Err(_) if line.is_empty() => bail!("the daemon exited during start-up; {debug_hint}"),
            Err(_) => {
                bail!("the daemon printed an unexpected start-up line {line:?}; {debug_hint}")
            }
        }
    }
}

impl Connector {
    /// Wait (at most `timeout`) until a daemon answers on the socket or no process
    /// holds the pidfile lock. Fails, naming the pid, when a daemon holds the lock but
    /// does not answer for that long.
    pub fn settle(&self, timeout: Duration) -> Result<Settled> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.home.connect_socket() {
                Ok(_) => return Ok(Settled::Answering),
                Err(e) if is_absent(&e) => {}
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!("cannot connect to {}", self.home.socket().display())
                    });
                }
            }
            let Some(holder) = pidfile_holder(&self.home)? else {
                return Ok(Settled::Free);
            };
            if Instant::now() >= deadline {
                bail!(
                    "{} holds {} but has not answered on {} for {}s: it is still stopping (or starting); wait and retry, or end it with `kill {}`",
                    holder.describe(),
                    self.home.pid_file().display(),
                    self.home.socket().display(),
                    timeout.as_secs(),
                    holder
                        .pid
                        .map_or("<pid>".to_string(), |pid| pid.to_string()),
                );
            }
            thread::sleep(Duration::from_millis(10));
        }
    }
}

/// What `Connector::settle` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// A daemon accepts connections.
    Answering,
    /// No daemon: nobody holds the pidfile lock.
    Free,
}

/// The process holding a home's pidfile lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holder {
    /// As written in the pidfile (`None` while it is being written).
    pub pid: Option<u32>,
}

impl Holder {
    pub fn describe(&self) -> String {
        match self.pid {
            Some(pid) => format!("alexandriad (pid {pid})"),
            None => "an alexandriad".to_string(),
        }
    }
}

/// Who holds the pidfile lock now; `None` when nobody does (or there is no pidfile).
pub fn pidfile_holder(home: &Home) -> Result<Option<Holder>> {
    let path = home.pid_file();
    let file = match File::open(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("cannot open {}", path.display())),
    };
    if lock_released(&file)? {
        return Ok(None);
    }
    Ok(Some(Holder {
        pid: read_pid(&file),
    }))
}

/// Whether nobody holds `file`'s lock any more. The probe takes a shared lock for an
/// instant; a daemon that starts at that very instant retries.
pub fn lock_released(file: &File) -> Result<bool> {
    match file.try_lock_shared() {
        Ok(()) => {
            let _ = file.unlock();
            Ok(true)
        }
        Err(fs::TryLockError::WouldBlock) => Ok(false),
        Err(fs::TryLockError::Error(e)) => Err(e).context("cannot probe the pidfile lock"),
    }
}

/// The pid at the start of a pidfile (`"<pid> <build>"`).
pub fn read_pid(mut file: &File) -> Option<u32> {
    use std::io::{Read, Seek};
    let mut text = String::new();
    file.seek(io::SeekFrom::Start(0)).ok()?;
    file.read_to_string(&mut text).ok()?;
    text.split_whitespace().next()?.parse().ok()
}

enum Greeting {
    Ready(Connection),
    Replaced { pid: u32 },
}

fn greet(mut stream: UnixStream, hello: &Hello) -> Result<Greeting> {
    stream
        .write_all(&alexandria_proto::to_line(hello))
        .context("cannot send the handshake to the daemon")?;
    let read_half = stream
        .try_clone()
        .context("cannot clone the daemon socket")?;
    read_half.set_read_timeout(Some(HELLO_TIMEOUT))?;
    let mut reader = BufReader::new(read_half);
    let mut line = String::new();
    let n = reader
        .read_line(&mut line)
        .context("the daemon did not answer the handshake")?;
    if n == 0 {
        return Err(io::Error::from(ErrorKind::UnexpectedEof))
            .context("the daemon closed the connection during the handshake");
    }
    reader.get_ref().set_read_timeout(None)?;
    let reply: HelloReply = serde_json::from_str(line.trim())
        .with_context(|| format!("unexpected handshake reply {line:?}"))?;
    match reply {
        HelloReply::Ready { pid, .. } => Ok(Greeting::Ready(Connection {
            stream,
            reader,
            daemon_pid: pid,
        })),
        HelloReply::ProtocolMismatch {
            pid,
            restarting: true,
            ..
        }
        | HelloReply::Superseded { pid, .. } => Ok(Greeting::Replaced { pid }),
        HelloReply::ProtocolMismatch {
            build, protocol, ..
        } => bail!(
            "the running daemon (build {build}, protocol {protocol}) is newer than this alexandria (build {BUILD}, protocol {PROTOCOL_VERSION}); reinstall alexandria so both match"
        ),
        HelloReply::Refused {
            code,
            message,
            hint,
        } => bail!("{code}: {message}; {hint}"),
    }
}

/// A handshake that failed because the connection dropped, not because of an answer.
pub(crate) fn is_connection_loss(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause.downcast_ref::<io::Error>().is_some_and(|e| {
            matches!(
                e.kind(),
                ErrorKind::ConnectionReset
                    | ErrorKind::ConnectionAborted
                    | ErrorKind::BrokenPipe
                    | ErrorKind::UnexpectedEof
            )
        })
    })
}

fn is_absent(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        ErrorKind::NotFound | ErrorKind::ConnectionRefused
    )
}

fn lock_with_timeout(file: &File, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(()),
            Err(fs::TryLockError::WouldBlock) if Instant::now() < deadline => {
                thread::sleep(Duration::from_millis(5));
            }
            Err(fs::TryLockError::WouldBlock) => {
                bail!(
                    "another process has been starting the daemon for {}s",
                    timeout.as_secs()
                )
            }
            Err(fs::TryLockError::Error(e)) => return Err(e).context("cannot lock the start lock"),
        }
    }
}

/// Wait (briefly) until a stepping-down daemon no longer accepts connections; starting
/// the next one then waits for its exit (`settle`).
fn wait_until_gone(home: &Home) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        match home.connect_socket() {
            Ok(_) => thread::sleep(Duration::from_millis(10)),
            Err(_) => return,
        }
    }
}

/// `alexandriad` next to this executable, else on PATH.
pub fn daemon_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("ALEXANDRIAD") {
        return PathBuf::from(path);
    }
    if let Ok(exe) = std::env::current_exe()
        && let Some(dir) = exe.parent()
    {
        let sibling = dir.join("alexandriad");
        if sibling.is_file() {
            return sibling;
        }
    }
    PathBuf::from("alexandriad")
}
