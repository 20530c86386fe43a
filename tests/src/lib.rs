//! Harness for the end-to-end tests: locate the real binaries, give each test its own
//! short temp `ALEXANDRIA_HOME`, start the daemon and shims as real processes, speak
//! MCP to them with rmcp's client or raw JSON-RPC lines.
//!
//! The binaries are built by `cargo build --workspace` (the README's test command does
//! that first); `CARGO_BIN_EXE_*` is not available here because the binaries belong
//! to other packages.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rmcp::service::RunningService;
use rmcp::transport::TokioChildProcess;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};

pub mod http;

/// Path of a workspace binary (`alexandria` or `alexandriad`) in the target directory
/// the tests were built into.
pub fn bin_path(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test>-<hash>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test executable lives in target/<profile>/deps");
    let path = profile_dir.join(name);
    assert!(
        path.is_file(),
        "{} is missing: run `cargo build --workspace` before the tests (the README's test command does)",
        path.display()
    );
    path
}

/// A temp directory with a short path (Unix socket paths are limited to ~100 bytes).
pub fn short_tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("alx")
        .tempdir_in("/tmp")
        .expect("create temp dir in /tmp")
}

/// A `Command` for the `alexandria` CLI with `ALEXANDRIA_HOME` set and git isolated
/// from the user's configuration.
pub fn alexandria(home: &Path) -> Command {
    let mut command = Command::new(bin_path("alexandria"));
    isolate(&mut command, home);
    command
}

/// Point a command at `home` and keep the user's environment out of it.
pub fn isolate(command: &mut Command, home: &Path) {
    command
        .env("ALEXANDRIA_HOME", home)
        .env("ALEXANDRIAD", bin_path("alexandriad"))
        // Every test daemon on a free port (the default, 4747, is one per machine).
        .env("ALEXANDRIA_HTTP_PORT", "0")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env_remove("ALEXANDRIA_LOG")
        .env_remove("ALEXANDRIA_FAULTS");
}

/// One test's alexandria home. Dropping it stops its daemon.
pub struct Env {
    pub dir: tempfile::TempDir,
    pub home: PathBuf,
    /// `ALEXANDRIA_FAULTS` given to every process this env starts.
    pub faults: Option<String>,
    /// More environment for every process this env starts (`None` removes the variable).
    pub vars: Vec<(String, Option<String>)>,
}

impl Default for Env {
    fn default() -> Self {
        Env::new()
    }
}

impl Env {
    pub fn new() -> Env {
        let dir = short_tempdir();
        let home = dir.path().join("h");
        Env::at(dir, home)
    }

    /// An env whose home is `home` (somewhere under `dir`, which is removed on drop).
    pub fn at(dir: tempfile::TempDir, home: PathBuf) -> Env {
        Env {
            dir,
            home,
            faults: None,
            vars: Vec::new(),
        }
    }

    pub fn with_faults(faults: &str) -> Env {
        let mut env = Env::new();
        env.faults = Some(faults.to_string());
        env
    }

    /// Another environment on this home (its own working directory) whose CLI and
    /// shim, and so the daemon the shim starts, run with `faults`.
    pub fn same_home_with_faults(&self, faults: &str) -> Env {
        Env {
            dir: short_tempdir(),
            home: self.home.clone(),
            faults: Some(faults.to_string()),
            vars: Vec::new(),
        }
    }

    /// The `alexandria` CLI for this home.
    pub fn command(&self) -> Command {
        let mut command = alexandria(&self.home);
        if let Some(faults) = &self.faults {
            command.env("ALEXANDRIA_FAULTS", faults);
        }
        for (name, value) in &self.vars {
            match value {
                Some(value) => command.env(name, value),
                None => command.env_remove(name),
            };
        }
        command
    }

    /// Run the CLI; the output, whatever the exit status.
    pub fn run(&self, args: &[&str]) -> Output {
        self.command()
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run alexandria")
    }

    /// Run the CLI and require success; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let output = self.run(args);
        assert!(
            output.status.success(),
            "alexandria {args:?} failed: {}\nstdout: {}",
            String::from_utf8_lossy(&output.stderr),
            String::from_utf8_lossy(&output.stdout)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Write `files` (name, bytes) into a scratch directory and ingest them.
    pub fn ingest(&self, workspace: &str, files: &[(&str, &[u8])]) -> String {
        let scratch = self.dir.path().join("scratch");
        std::fs::create_dir_all(&scratch).expect("scratch dir");
        let mut args = vec!["ingest".to_string(), workspace.to_string()];
        for (name, bytes) in files {
            let path = scratch.join(name);
            std::fs::write(&path, bytes).expect("write fixture");
            args.push(path.display().to_string());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.ok(&args)
    }

    pub fn workspace_dir(&self, slug: &str) -> PathBuf {
        self.home.join("workspaces").join(slug)
    }

    /// The pid the running daemon wrote into `run/daemon.pid`.
    /// The pid in the home's pidfile, if that process is an `alexandriad`: a daemon
    /// killed with -9 leaves its pidfile, and its pid may since belong to anything
    /// (a test must never signal a stranger).
    pub fn daemon_pid(&self) -> Option<u32> {
        let text = std::fs::read_to_string(self.home.join("run/daemon.pid")).ok()?;
        let pid: u32 = text.split_whitespace().next()?.parse().ok()?;
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
        (comm.trim() == "alexandriad").then_some(pid)
    }

    /// `alexandria mcp serve [--workspace slug]` as a command. The home gets a
    /// `config.toml` first (as `alexandria init` would, without starting anything), since a
    /// shim refuses a home that was never set up; `bare_shim_command` skips that.
    pub fn shim_command(&self, pinned: Option<&str>) -> Command {
        self.set_up_home();
        self.bare_shim_command(pinned)
    }

    /// `alexandria mcp serve [--workspace slug]` on the home exactly as it is.
    pub fn bare_shim_command(&self, pinned: Option<&str>) -> Command {
        let mut command = self.command();
        command.args(["mcp", "serve"]);
        if let Some(slug) = pinned {
            command.args(["--workspace", slug]);
        }
        command
    }

    /// An rmcp client talking through a real shim process.
    pub async fn client(&self, pinned: Option<&str>) -> Result<RunningService<RoleClient, ()>> {
        let command = tokio::process::Command::from(self.shim_command(pinned));
        let transport = TokioChildProcess::new(command).context("spawn the shim")?;
        Ok(().serve(transport).await?)
    }

    /// A shim speaking raw JSON-RPC lines.
    pub fn raw_shim(&self, pinned: Option<&str>) -> RawShim {
        RawShim::spawn(self.shim_command(pinned))
    }

    /// Give the home a `config.toml` (empty: defaults) without starting anything, as if
    /// `alexandria init` had run but no daemon is up. A shim refuses a home without one.
    pub fn set_up_home(&self) {
        std::fs::create_dir_all(&self.home).expect("create home");
        let config = self.home.join("config.toml");
        if !config.exists() {
            std::fs::write(config, "").expect("write config.toml");
        }
    }

    /// Kill this home's daemon with SIGKILL (if one runs) and wait until it is gone.
    pub fn kill_daemon(&self) {
        if let Some(pid) = self.daemon_pid() {
            send_signal(pid, rustix::process::Signal::KILL);
            wait_until(Duration::from_secs(10), || !process_alive(pid));
        }
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Some(pid) = self.daemon_pid() {
            send_signal(pid, rustix::process::Signal::TERM);
            if !wait_until(Duration::from_secs(5), || !process_alive(pid)) {
                send_signal(pid, rustix::process::Signal::KILL);
            }
        }
    }
}

/// True while `/proc/<pid>` exists and is not a zombie.
/// Run git in `dir` as a person at the terminal would: this machine's git config left
/// out, the identity `Hand <hand@example.com>`, no `GIT_DIR`/`GIT_INDEX_FILE` inherited.
/// Wait (up to 10 s) until nobody holds the git index lock of the workspace at `root`:
/// the daemon writes git's index once a workspace's writes pause (about 20 ms after
/// the last one), and holds `.git/index.lock` until then, so what `git status` shows
/// right after a write can still be the index before it.
pub fn wait_index_written(root: &Path) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while root.join(".git/index.lock").exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
}

pub fn git_output(dir: &Path, args: &[&str]) -> Output {
    Command::new("git")
        .args(["-c", "user.name=Hand", "-c", "user.email=hand@example.com"])
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env_remove("GIT_DIR")
        .env_remove("GIT_INDEX_FILE")
        .output()
        .expect("git")
}

/// [`git_output`] that must succeed; its stdout.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let output = git_output(dir, args);
    assert!(
        output.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Deletions in `root`'s history that alexandria did not put back: every commit that
/// deleted paths, with the paths no later `Alexandria-Op: restore` commit committed
/// again. A hand `git commit` made from a copy of git's index read before a daemon
/// commit drops that commit's pages (git does the same to any other program that
/// writes the index); the daemon commits them again. Nothing else may delete a page in
/// the tests that use this. Empty when all is well.
pub fn unrestored_deletions(root: &Path) -> String {
    let restored: std::collections::HashSet<String> = git(
        root,
        &[
            "log",
            "--grep=^Alexandria-Op: restore$",
            "--name-only",
            "--format=",
        ],
    )
    .lines()
    .filter(|l| !l.trim().is_empty())
    .map(str::to_string)
    .collect();
    let mut report = String::new();
    let mut commit = String::new();
    for line in git(
        root,
        &[
            "log",
            "--diff-filter=D",
            "--name-only",
            "--format=@%h %cn: %s",
        ],
    )
    .lines()
    {
        if let Some(header) = line.strip_prefix('@') {
            commit = header.to_string();
        } else if !line.trim().is_empty()
            && (commit.contains(" alexandria: ") || !restored.contains(line))
        {
            report.push_str(&format!("{commit} — {line}\n"));
        }
    }
    report
}

/// Send `signal` to process `pid` (a positive pid only: never a group, never -1).
/// Not through the `kill` command: procps-ng 4.0.2 reads `kill -KILL -18300` as
/// `kill(-1, SIGKILL)`, every process of the user, which ended whole sessions here.
pub fn send_signal(pid: u32, signal: rustix::process::Signal) {
    if let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process(pid, signal);
    }
}

/// Send `signal` to the process group `pgid` (a positive id: the group a child was
/// started in with `process_group(0)`).
pub fn signal_group(pgid: u32, signal: rustix::process::Signal) {
    if let Some(pgid) = i32::try_from(pgid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process_group(pgid, signal);
    }
}

pub fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.trim_start().starts_with('Z'))
            .unwrap_or(false),
        Err(_) => false,
    }
}

/// Poll `condition` until it holds or `timeout` passes; returns whether it held.
pub fn wait_until(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A shim process driven line by line.
pub struct RawShim {
    pub child: Child,
    pub stdin: Option<ChildStdin>,
    pub stdout: BufReader<ChildStdout>,
}

impl RawShim {
    /// Start `command` (an `alexandria mcp serve` as some client would) with piped stdio.
    pub fn spawn(mut command: Command) -> RawShim {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn shim");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        RawShim {
            child,
            stdin: Some(stdin),
            stdout,
        }
    }

    pub fn send(&mut self, frame: &Value) {
        self.send_raw(serde_json::to_string(frame).expect("json").as_bytes());
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(bytes).expect("write frame");
        stdin.write_all(b"\n").expect("write newline");
        stdin.flush().expect("flush");
    }

    /// The next frame from the shim's stdout; every line must be JSON.
    pub fn recv(&mut self) -> Result<Value> {
        let mut line = String::new();
        if self.stdout.read_line(&mut line)? == 0 {
            bail!("the shim closed stdout");
        }
        serde_json::from_str(&line).with_context(|| format!("stdout line is not JSON: {line:?}"))
    }

    /// Frames until one answers `id`; the others are returned too.
    pub fn recv_id(&mut self, id: &Value) -> Result<(Value, Vec<Value>)> {
        let mut others = Vec::new();
        loop {
            let frame = self.recv()?;
            if frame.get("id") == Some(id) && frame.get("method").is_none() {
                return Ok((frame, others));
            }
            others.push(frame);
        }
    }

    /// Send a request and wait for its answer.
    pub fn request(&mut self, id: i64, method: &str, params: Value) -> Value {
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        self.recv_id(&json!(id)).expect("answer").0
    }

    /// Initialize with `version` and send `notifications/initialized`.
    pub fn initialize(&mut self, version: &str) -> Value {
        let reply = self.request(
            0,
            "initialize",
            json!({"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "raw-test", "version": "1"}}),
        );
        self.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        reply
    }

    /// Close stdin and wait for the shim to exit.
    pub fn close(mut self) -> std::process::ExitStatus {
        drop(self.stdin.take());
        self.child.wait().expect("wait shim")
    }
}

impl Drop for RawShim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A small valid PDF with one page per string (shared with the benchmark corpus).
pub use alexandria_bench::pdf::make_pdf;

/// The smallest valid PNG (1×1, transparent).
pub const TINY_PNG: &[u8] = &[
    0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44, 0x52,
    0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x06, 0x00, 0x00, 0x00, 0x1f, 0x15, 0xc4,
    0x89, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9c, 0x63, 0x00, 0x01, 0x00, 0x00,
    0x05, 0x00, 0x01, 0x0d, 0x0a, 0x2d, 0xb4, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45, 0x4e, 0x44, 0xae,
    0x42, 0x60, 0x82,
];

/// Call a tool through an rmcp client; returns the whole result as JSON.
pub async fn call(
    client: &RunningService<RoleClient, ()>,
    tool: &str,
    arguments: Value,
) -> Result<Value> {
    let arguments = match arguments {
        Value::Object(map) => map,
        _ => bail!("arguments must be an object"),
    };
    let result = client
        .call_tool(
            rmcp::model::CallToolRequestParams::new(tool.to_string()).with_arguments(arguments),
        )
        .await?;
    Ok(serde_json::to_value(result)?)
}

/// The error code of an `isError` tool result, if it is one.
pub fn error_code(result: &Value) -> Option<&str> {
    if result.get("isError") != Some(&Value::Bool(true)) {
        return None;
    }
    result["structuredContent"]["error"]["code"].as_str()
}

/// The first text content of a tool result.
pub fn text_of(result: &Value) -> &str {
    result["content"][0]["text"].as_str().unwrap_or("")
}
