//! The real binaries: where they are, a temp `ALEXANDRIA_HOME` isolated from the
//! user's, starting and stopping `alexandriad`, and what `/proc` says about a process.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use alexandria_proto::StartupNotice;
use anyhow::{Context, Result, anyhow, bail};
use serde_json::Value;

use crate::client::{self, Direct, Shim};

/// Paths of `alexandria` and `alexandriad`.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub shim: PathBuf,
    pub daemon: PathBuf,
}

impl Binaries {
    /// In `dir`, or else next to the running executable (`target/release`).
    pub fn locate(dir: Option<&Path>) -> Result<Binaries> {
        let dir = match dir {
            Some(dir) => dir.to_path_buf(),
            None => std::env::current_exe()
                .context("cannot locate the benchmark executable")?
                .parent()
                .map(Path::to_path_buf)
                .ok_or_else(|| anyhow!("the benchmark executable has no directory"))?,
        };
        let binaries = Binaries {
            shim: dir.join("alexandria"),
            daemon: dir.join("alexandriad"),
        };
        for path in [&binaries.shim, &binaries.daemon] {
            if !path.is_file() {
                bail!(
                    "{} is missing: build with `cargo build --release -p alexandria -p alexandria-daemon -p alexandria-bench`, or pass --bin-dir",
                    path.display()
                );
            }
        }
        Ok(binaries)
    }
}

/// A throw-away alexandria home (short path: socket paths are limited to ~100 bytes).
pub struct Home {
    _dir: tempfile::TempDir,
    pub root: PathBuf,
    pub binaries: Binaries,
    /// The daemon this benchmark started, to reap after it stops.
    daemon: Option<Child>,
    /// Environment set for every command of this home (and so its daemon).
    env: Vec<(String, String)>,
}

/// Where the throw-away homes go: `/tmp` (short, so the socket path stays short), or
/// `ALEXANDRIA_BENCH_TMPDIR` for another file system (these machines' `/` is ext4
/// without a journal, where each new inode is checked against those deleted lately).
pub fn homes_parent() -> PathBuf {
    std::env::var_os("ALEXANDRIA_BENCH_TMPDIR").map_or_else(|| PathBuf::from("/tmp"), PathBuf::from)
}

impl Home {
    pub fn new(binaries: &Binaries) -> Result<Home> {
        let parent = homes_parent();
        let dir = tempfile::Builder::new()
            .prefix("alxb")
            .tempdir_in(&parent)
            .with_context(|| format!("cannot create a temp dir in {}", parent.display()))?;
        let root = dir.path().join("h");
        Ok(Home {
            _dir: dir,
            root,
            binaries: binaries.clone(),
            daemon: None,
            env: Vec::new(),
        })
    }

    /// Set `name` for every command run for this home from now on.
    pub fn env(&mut self, name: &str, value: &str) {
        self.env.push((name.to_string(), value.to_string()));
    }

    pub fn scratch(&self) -> PathBuf {
        self.root.with_file_name("scratch")
    }

    pub fn socket(&self) -> PathBuf {
        self.root.join("run/daemon.sock")
    }

    pub fn workspace_dir(&self, slug: &str) -> PathBuf {
        self.root.join("workspaces").join(slug)
    }

    /// Point a command at this home; keep the user's settings and the test-only
    /// fault switch out of it.
    pub fn isolate(&self, command: &mut Command) {
        command
            .env("ALEXANDRIA_HOME", &self.root)
            .env("ALEXANDRIAD", &self.binaries.daemon)
            // A free port, not the fixed default: benchmarks may run beside a daemon.
            .env("ALEXANDRIA_HTTP_PORT", "0")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env_remove("ALEXANDRIA_LOG")
            .env_remove("ALEXANDRIA_FAULTS");
        for (name, value) in &self.env {
            command.env(name, value);
        }
    }

    /// Run the CLI and require success; its stdout.
    pub fn cli(&self, args: &[&str]) -> Result<String> {
        let mut command = Command::new(&self.binaries.shim);
        self.isolate(&mut command);
        let output = command
            .args(args)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("cannot run alexandria {args:?}"))?;
        if !output.status.success() {
            bail!(
                "alexandria {args:?} failed: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    pub fn status(&self) -> Result<Value> {
        let text = self.cli(&["daemon", "status", "--json"])?;
        serde_json::from_str(&text).context("daemon status --json is not JSON")
    }

    /// `alexandria mcp serve --workspace slug`, as a command.
    pub fn shim_command(&self, slug: &str) -> Command {
        let mut command = Command::new(&self.binaries.shim);
        self.isolate(&mut command);
        command.args(["mcp", "serve", "--workspace", slug]);
        command
    }

    /// A shim pinned to `slug`, initialized.
    pub fn shim(&self, slug: &str) -> Result<Shim> {
        use crate::client::Mcp as _;
        let mut shim = Shim::spawn(self.shim_command(slug))?;
        shim.initialize()?;
        Ok(shim)
    }

    /// A direct socket client pinned to `slug`, initialized.
    pub fn direct(&self, slug: &str) -> Result<Direct> {
        use crate::client::Mcp as _;
        let mut direct = client::connect_direct(&self.socket(), slug)?;
        direct.initialize()?;
        Ok(direct)
    }

    /// Start `alexandriad` as the shim does (`--spawned`) and wait for its ready
    /// notice; returns how long that took.
    pub fn start_daemon(&mut self) -> Result<Duration> {
        let started = Instant::now();
        let mut command = Command::new(&self.binaries.daemon);
        self.isolate(&mut command);
        // For profiling by hand: the daemon's log at this filter, appended to
        // `$ALEXANDRIA_BENCH_DAEMON_LOG_FILE` (or `daemon-stderr.log` in the home).
        let stderr = match std::env::var("ALEXANDRIA_BENCH_DAEMON_LOG") {
            Ok(filter) => {
                command.env("ALEXANDRIA_LOG", filter);
                let path = std::env::var_os("ALEXANDRIA_BENCH_DAEMON_LOG_FILE")
                    .map_or_else(|| self.root.join("daemon-stderr.log"), PathBuf::from);
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .with_context(|| format!("cannot open {}", path.display()))?;
                Stdio::from(file)
            }
            Err(_) => Stdio::null(),
        };
        let mut child = command
            .arg("--spawned")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .context("cannot start alexandriad")?;
        let stdout = child.stdout.take().context("daemon stdout")?;
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .context("cannot read the daemon's start-up notice")?;
        let elapsed = started.elapsed();
        self.daemon = Some(child);
        match serde_json::from_str::<StartupNotice>(line.trim()) {
            Ok(StartupNotice::Ready { .. }) => Ok(elapsed),
            Ok(StartupNotice::Failed { message }) => bail!("the daemon failed to start: {message}"),
            Err(_) => bail!("unexpected start-up line from the daemon: {line:?}"),
        }
    }

    /// The running daemon's pid, from its pidfile.
    pub fn daemon_pid(&self) -> Option<u32> {
        let text = std::fs::read_to_string(self.root.join("run/daemon.pid")).ok()?;
        text.split_whitespace().next()?.parse().ok()
    }

    /// `alexandria daemon stop`, then wait until the process is gone.
    pub fn stop_daemon(&mut self) -> Result<()> {
        let pid = self.daemon_pid();
        if pid.is_some_and(process_alive) {
            self.cli(&["daemon", "stop"])?;
        }
        if let Some(mut child) = self.daemon.take() {
            child.wait().context("waiting for the daemon")?;
        }
        if let Some(pid) = pid {
            let deadline = Instant::now() + Duration::from_secs(30);
            while process_alive(pid) {
                if Instant::now() > deadline {
                    bail!("the daemon {pid} did not stop within 30 s");
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        Ok(())
    }

    /// The daemon's HTTP address when this build serves HTTP.
    pub fn http_address(&self) -> Result<Option<String>> {
        Ok(self.status()?["http"].as_str().map(str::to_string))
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        if let Some(pid) = self.daemon_pid()
            && process_alive(pid)
        {
            let _ = self.cli(&["daemon", "stop"]);
        }
        if let Some(mut child) = self.daemon.take() {
            let _ = child.wait();
        }
        // Shim-started daemons are not our children; wait for them to go so the
        // temp dir can be removed.
        if let Some(pid) = self.daemon_pid() {
            let deadline = Instant::now() + Duration::from_secs(10);
            while process_alive(pid) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// True while `/proc/<pid>` exists and is not a zombie.
pub fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Resident and peak resident memory of a process, in bytes (`VmRSS`, `VmHWM`).
pub fn memory(pid: u32) -> Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("cannot read /proc/{pid}/status"))?;
    let field = |name: &str| -> Result<u64> {
        let line = status
            .lines()
            .find(|l| l.starts_with(name))
            .ok_or_else(|| anyhow!("{name} missing from /proc/{pid}/status"))?;
        let kib: u64 = line[name.len()..]
            .split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| anyhow!("cannot parse {line:?}"))?;
        Ok(kib * 1024)
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// Anonymous (private) resident memory and proportional set size, in bytes: how
/// much of the RSS is the process's own rather than shared file pages.
pub fn own_memory(pid: u32) -> Result<(u64, u64)> {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .with_context(|| format!("cannot read /proc/{pid}/smaps_rollup"))?;
    let field = |name: &str| -> u64 {
        rollup
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l[name.len()..].split_whitespace().next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    Ok((field("Anonymous:"), field("Pss:")))
}

/// The 1, 5 and 15 minute load averages, as Linux prints them.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// CPU time (user + system) a process used so far.
pub fn cpu_time(pid: u32) -> Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("cannot read /proc/{pid}/stat"))?;
    let rest = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or_else(|| anyhow!("odd /proc/{pid}/stat"))?;
    // After the command: state is field 3; utime and stime are fields 14 and 15.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> Result<u64> {
        fields
            .get(i)
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| anyhow!("odd /proc/{pid}/stat"))
    };
    let total = ticks(11)? + ticks(12)?;
    // USER_HZ is 100 on every Linux configuration we run on.
    Ok(Duration::from_millis(total * 10))
}

/// Wait (up to `limit`) until the daemon `pid` is quiet: under 5 % of one core over
/// two half-second windows in a row, so that what the bench times next is not sharing
/// the machine with the search index's merge after a bulk load (at 100k pages it runs
/// for minutes after the index reports ready). Returns how long it waited, and whether
/// it went quiet.
pub fn wait_quiet(pid: u32, limit: Duration) -> Result<(Duration, bool)> {
    const WINDOW: Duration = Duration::from_millis(500);
    let started = Instant::now();
    let mut quiet_windows = 0;
    let mut before = cpu_time(pid)?;
    while started.elapsed() < limit {
        std::thread::sleep(WINDOW);
        let now = cpu_time(pid)?;
        let used = now.saturating_sub(before);
        before = now;
        if used.as_secs_f64() < 0.05 * WINDOW.as_secs_f64() {
            quiet_windows += 1;
            if quiet_windows == 2 {
                return Ok((started.elapsed(), true));
            }
        } else {
            quiet_windows = 0;
        }
    }
    Ok((started.elapsed(), false))
}

/// `wait_quiet` for each daemon, with a line on stderr saying how long it took.
pub fn settle(label: &str, pids: &[u32]) -> Result<()> {
    for &pid in pids {
        let (waited, quiet) = wait_quiet(pid, Duration::from_secs(300))?;
        if quiet {
            eprintln!(
                "alexandria-bench: [{label}] daemon {pid} quiet after {:.1} s",
                waited.as_secs_f64()
            );
        } else {
            eprintln!(
                "alexandria-bench: [{label}] daemon {pid} still busy after {:.0} s; timing anyway",
                waited.as_secs_f64()
            );
        }
    }
    Ok(())
}

/// Time from spawning `alexandria --version` to its first byte on stdout: the cost
/// of starting this binary at all.
pub fn spawn_to_first_byte(binaries: &Binaries) -> Result<Duration> {
    let started = Instant::now();
    let mut child = Command::new(&binaries.shim)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("cannot spawn alexandria --version")?;
    let mut stdout = child.stdout.take().context("stdout")?;
    let mut byte = [0u8; 1];
    stdout.read_exact(&mut byte)?;
    let elapsed = started.elapsed();
    let mut rest = Vec::new();
    let _ = stdout.read_to_end(&mut rest);
    child.wait()?;
    Ok(elapsed)
}
