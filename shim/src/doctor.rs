//! `alexandria doctor [--json]`: check the install end to end and say what to do.
//!
//! Each check produces findings (`ok`, `warn` or `error`), and every problem carries the
//! one command or step that fixes it. Checks only look: nothing is started, created or
//! rewritten (the daemon is asked for its status only if it already runs). The exit code
//! is 1 when any finding is an error, so scripts and CI can gate on it.
#![allow(clippy::print_stdout)]

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use alexandria_proto::{BUILD, ConnectionKind, ControlReply, ControlRequest, Home};
use anyhow::Result;
use clap::{Parser, ValueEnum};
use serde::Serialize;
use serde_json::{Value, json};

use crate::connect::{Connector, daemon_binary, is_connection_loss};
use crate::install::clients::{self, Client, Env, Format, Scope};
use crate::install::{SERVER_NAME, codex, continue_block, json as json_edit, service};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Ok,
    Warn,
    Error,
}

impl Level {
    fn label(self) -> &'static str {
        match self {
            Level::Ok => "ok",
            Level::Warn => "warn",
            Level::Error => "error",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    /// What was checked: `binaries`, `home`, `daemon`, `log`, `client:<name>`, `service`, `disk`.
    pub check: String,
    pub status: Level,
    pub message: String,
    /// The command or step that fixes it (problems only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

/// Findings as they are collected.
#[derive(Default)]
struct Report {
    findings: Vec<Finding>,
}

impl Report {
    fn ok(&mut self, check: &str, message: impl Into<String>) {
        self.push(check, Level::Ok, message.into(), None);
    }
    fn warn(&mut self, check: &str, message: impl Into<String>, fix: impl Into<String>) {
        self.push(check, Level::Warn, message.into(), Some(fix.into()));
    }
    fn error(&mut self, check: &str, message: impl Into<String>, fix: impl Into<String>) {
        self.push(check, Level::Error, message.into(), Some(fix.into()));
    }
    fn push(&mut self, check: &str, status: Level, message: String, fix: Option<String>) {
        self.findings.push(Finding {
            check: check.to_string(),
            status,
            message,
            fix,
        });
    }
    fn count(&self, level: Level) -> usize {
        self.findings.iter().filter(|f| f.status == level).count()
    }
}

/// `alexandria doctor`
pub fn run(connector: &Connector, as_json: bool) -> Result<ExitCode> {
    let env = Env::from_process()?;
    let home = &connector.home;
    let mut report = Report::default();
    check_binaries(&mut report);
    let home_ok = check_home(&mut report, home, &env);
    check_daemon(&mut report, connector, home_ok);
    check_log(&mut report, home);
    check_clients(&mut report, home, &env);
    check_service(&mut report, &env);
    check_disk(&mut report, home);

    let errors = report.count(Level::Error);
    let warnings = report.count(Level::Warn);
    if as_json {
        let out = json!({
            "home": home.root().display().to_string(),
            "ok": errors == 0,
            "errors": errors,
            "warnings": warnings,
            "findings": report.findings,
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&out).unwrap_or_else(|_| out.to_string())
        );
    } else {
        println!("alexandria doctor: home {}", home.root().display());
        let width = report
            .findings
            .iter()
            .map(|f| f.check.len())
            .max()
            .unwrap_or(0);
        for finding in &report.findings {
            println!(
                "  {:<5} {:<width$}  {}",
                finding.status.label(),
                finding.check,
                finding.message
            );
            if let Some(fix) = &finding.fix {
                println!("  {:<5} {:<width$}  fix: {fix}", "", "");
            }
        }
        match (errors, warnings) {
            (0, 0) => println!("all good"),
            (0, w) => println!("no errors, {w} warning(s)"),
            (e, w) => println!("{e} error(s), {w} warning(s): fix the errors above"),
        }
    }
    Ok(if errors == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// This executable, symlinks resolved.
fn own_exe() -> Option<PathBuf> {
    std::env::current_exe()
        .ok()
        .and_then(|p| fs::canonicalize(p).ok())
}

/// `<program> --version`'s last word (clap prints `name version`), if it runs.
fn version_of(program: &Path) -> Option<String> {
    let output = Command::new(program)
        .arg("--version")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !output.status.success() {
        return None;
    }
    String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .last()
        .map(str::to_string)
}

const REINSTALL: &str = "reinstall both binaries side by side: packaging/install.sh (or cargo install --locked --path shim && cargo install --locked --path daemon)";

fn check_binaries(report: &mut Report) {
    let shim = own_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "?".into());
    let daemon = daemon_binary();
    let resolved = if daemon.components().count() == 1 {
        crate::install::find_on_path(&daemon.display().to_string())
    } else {
        daemon.is_file().then(|| daemon.clone())
    };
    let Some(daemon_path) = resolved else {
        report.error(
            "binaries",
            format!(
                "alexandria {BUILD} ({shim}); alexandriad not found next to it or on PATH, so no daemon can start"
            ),
            REINSTALL,
        );
        return;
    };
    match version_of(&daemon_path) {
        Some(version) if version == BUILD => report.ok(
            "binaries",
            format!(
                "alexandria {BUILD} ({shim}), alexandriad {version} ({})",
                daemon_path.display()
            ),
        ),
        Some(version) => report.error(
            "binaries",
            format!(
                "alexandria is {BUILD} but alexandriad ({}) is {version}",
                daemon_path.display()
            ),
            REINSTALL,
        ),
        None => report.error(
            "binaries",
            format!(
                "{} does not run (`--version` failed)",
                daemon_path.display()
            ),
            REINSTALL,
        ),
    }
}

/// Returns whether the home is usable (so the daemon checks make sense).
fn check_home(report: &mut Report, home: &Home, env: &Env) -> bool {
    let root = home.root();
    let init = crate::install::init_command(home, env);
    let meta = match fs::metadata(root) {
        Ok(meta) => meta,
        Err(_) => {
            report.error(
                "home",
                format!("{} does not exist", root.display()),
                format!("{init} (or point ALEXANDRIA_HOME / --home at your existing home)"),
            );
            return false;
        }
    };
    let config = home.config_file();
    match fs::read_to_string(&config) {
        Err(_) => {
            report.error(
                "home",
                format!("{} has no config.toml: it was never set up", root.display()),
                init,
            );
            return false;
        }
        Ok(text) => {
            if let Err(e) = text.parse::<toml_edit::DocumentMut>() {
                report.error(
                    "home",
                    format!(
                        "{} is not valid TOML: {}",
                        config.display(),
                        e.to_string().trim().replace('\n', " ")
                    ),
                    format!(
                        "fix {} (or move it away and run `{init}`)",
                        config.display()
                    ),
                );
                return false;
            }
        }
    }
    let uid = rustix::process::getuid().as_raw();
    let mut problems = Vec::new();
    if meta.uid() != uid {
        problems.push(format!(
            "{} belongs to uid {}, not you",
            root.display(),
            meta.uid()
        ));
    }
    if meta.permissions().mode() & 0o200 == 0 {
        problems.push(format!("{} is not writable", root.display()));
    }
    for dir in [home.run_dir(), home.secrets_dir()] {
        if let Ok(meta) = fs::metadata(&dir) {
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                problems.push(format!(
                    "{} is {mode:o}, readable by others (want 700)",
                    dir.display()
                ));
            }
            if meta.uid() != uid {
                problems.push(format!("{} belongs to uid {}", dir.display(), meta.uid()));
            }
        }
    }
    if let Ok(entries) = fs::read_dir(home.secrets_dir()) {
        for entry in entries.flatten() {
            if let Ok(meta) = entry.metadata()
                && meta.is_file()
                && meta.permissions().mode() & 0o077 != 0
            {
                problems.push(format!(
                    "{} is readable by others (want 600)",
                    entry.path().display()
                ));
            }
        }
    }
    if problems.is_empty() {
        report.ok(
            "home",
            format!("{} (config.toml, permissions)", root.display()),
        );
        true
    } else {
        report.error(
            "home",
            problems.join("; "),
            format!(
                "chown -R $(id -un) {root}; chmod 700 {run} {secrets}; chmod 600 {secrets}/*",
                root = root.display(),
                run = home.run_dir().display(),
                secrets = home.secrets_dir().display()
            ),
        );
        false
    }
}

fn check_daemon(report: &mut Report, connector: &Connector, home_ok: bool) {
    let socket = connector.home.socket();
    if !home_ok {
        return;
    }
    // A daemon that is just dying can still accept and then reset a connection: ask again
    // briefly before calling it broken.
    let mut attempt = connector.connect_existing(ConnectionKind::Control);
    for _ in 0..10 {
        match &attempt {
            Err(error) if is_connection_loss(error) => {
                std::thread::sleep(Duration::from_millis(100));
                attempt = connector.connect_existing(ConnectionKind::Control);
            }
            _ => break,
        }
    }
    let connection = match attempt {
        Ok(Some(connection)) => connection,
        Ok(None) => {
            let stale = socket.exists();
            report.warn(
                "daemon",
                if stale {
                    format!(
                        "not running ({} is left over from a daemon that stopped); MCP clients start one on demand",
                        socket.display()
                    )
                } else {
                    "not running; MCP clients start one on demand".to_string()
                },
                "alexandria daemon start (or `alexandria daemon install-service` to keep it running)",
            );
            return;
        }
        Err(error) => {
            report.error(
                "daemon",
                format!("{} does not answer: {error:#}", socket.display()),
                "alexandria daemon stop; alexandria daemon start",
            );
            return;
        }
    };
    match status(connection) {
        Ok(status) => {
            let version = status["version"].as_str().unwrap_or("?");
            let message = format!(
                "running: pid {}, version {version}, socket {}, http {}",
                status["pid"],
                status["socket"].as_str().unwrap_or("?"),
                status["http"].as_str().unwrap_or("off")
            );
            if version == BUILD {
                report.ok("daemon", message);
            } else {
                report.warn(
                    "daemon",
                    format!("{message}; this alexandria is {BUILD}"),
                    "alexandria daemon stop (the next client or command starts the installed version)",
                );
            }
            check_state_db(report, &status["state_db"]);
        }
        Err(error) => report.error(
            "daemon",
            format!("the daemon did not answer a status request: {error:#}"),
            "alexandria daemon stop; alexandria daemon start",
        ),
    }
}

/// What the daemon found when it opened state.db (a cache: a damaged one is moved aside
/// and rebuilt from the workspaces).
fn check_state_db(report: &mut Report, state: &Value) {
    if state.is_null() {
        return; // a daemon from before the check
    }
    if state["rebuilt"] != true {
        report.ok("state.db", "checked at the daemon's start: sound");
        return;
    }
    let reason = state["reason"].as_str().unwrap_or("unknown");
    let at = state["at"].as_str().unwrap_or("start");
    match state["moved_to"].as_str() {
        Some(moved) => report.warn(
            "state.db",
            format!(
                "was damaged ({reason}) and was rebuilt at {at}: index and history come back from the files and git; the old file is kept as {moved}"
            ),
            format!("nothing to do; delete {moved} when you no longer need it"),
        ),
        None => report.ok("state.db", format!("built at {at} ({reason})")),
    }
}

/// Ask a running daemon for its status (one control request, one `Done` reply).
fn status(mut connection: crate::connect::Connection) -> Result<Value> {
    use std::io::{BufRead, Write};
    connection
        .stream
        .write_all(&alexandria_proto::to_line(&ControlRequest::Status))?;
    connection
        .reader
        .get_ref()
        .set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut line = String::new();
    loop {
        line.clear();
        if connection.reader.read_line(&mut line)? == 0 {
            anyhow::bail!("the daemon closed the connection");
        }
        match serde_json::from_str::<ControlReply>(line.trim())? {
            ControlReply::Progress { .. } => continue,
            ControlReply::Done { data, .. } => return Ok(data),
            ControlReply::Failed { code, message, .. } => anyhow::bail!("{code}: {message}"),
        }
    }
}

/// `YYYY-MM-DDTHH:MM:SS` (UTC) of a time, for comparing with the log's RFC 3339 stamps.
fn utc_stamp(time: SystemTime) -> String {
    let secs = time
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn check_log(report: &mut Report, home: &Home) {
    let Ok(entries) = fs::read_dir(home.logs_dir()) else {
        return;
    };
    let cutoff = utc_stamp(SystemTime::now() - Duration::from_secs(3600));
    let mut errors = Vec::new();
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("daemon.") && n.ends_with(".log"))
        })
        .collect();
    files.sort();
    // Only the two newest daily files can hold the last hour.
    for file in files.iter().rev().take(2) {
        let Ok(text) = fs::read_to_string(file) else {
            continue;
        };
        for line in text.lines() {
            let mut words = line.split_whitespace();
            let (Some(stamp), Some(level)) = (words.next(), words.next()) else {
                continue;
            };
            if level == "ERROR" && stamp.get(..19).is_some_and(|s| s >= cutoff.as_str()) {
                errors.push((file.clone(), line.to_string()));
            }
        }
    }
    match errors.last() {
        None => report.ok("log", "no errors in the daemon log in the last hour"),
        Some((file, last)) => report.warn(
            "log",
            format!(
                "{} error(s) in the daemon log in the last hour; last: {}",
                errors.len(),
                last.chars().take(300).collect::<String>()
            ),
            format!("read {} for the context", file.display()),
        ),
    }
}

/// Every place an entry may be: each client's user file, and the project files of the
/// current directory.
fn entry_locations(env: &Env) -> Vec<(Client, Scope, PathBuf, Format)> {
    let mut locations = Vec::new();
    for client in Client::value_variants() {
        let (path, format) = clients::locate(*client, Scope::User, env);
        locations.push((*client, Scope::User, path, format));
        if client.has_project_file() {
            let (path, format) = clients::locate(*client, Scope::Project, env);
            locations.push((*client, Scope::Project, path, format));
        }
    }
    locations
}

fn read_entry(text: &str, format: Format) -> Result<Option<Value>, String> {
    let result = match format {
        Format::Json {
            dialect,
            servers_key,
        } => json_edit::current_entry(
            Some(text),
            json_edit::JsonTarget {
                dialect,
                servers_key,
                name: SERVER_NAME,
            },
        ),
        Format::CodexToml => codex::current_entry(Some(text), SERVER_NAME),
        Format::ContinueBlock => continue_block::current_entry(Some(text)),
    };
    result.map_err(|e| e.to_string())
}

fn check_clients(report: &mut Report, home: &Home, env: &Env) {
    let own = own_exe();
    let mut installed = 0;
    for (client, scope, path, format) in entry_locations(env) {
        let name = client
            .to_possible_value()
            .map(|v| v.get_name().to_string())
            .unwrap_or_default();
        let check = match scope {
            Scope::User => format!("client:{name}"),
            Scope::Project => format!("client:{name} (project)"),
        };
        let Ok(text) = fs::read_to_string(&path) else {
            continue;
        };
        let entry = match read_entry(&text, format) {
            Ok(Some(entry)) => entry,
            Ok(None) => continue,
            Err(error) => {
                report.error(
                    &check,
                    format!(
                        "{} cannot be read: {error}; {} cannot load any server from it",
                        path.display(),
                        client.display_name()
                    ),
                    format!(
                        "fix the file by hand (a copy from before alexandria's last edit may be at {}{}), then run `alexandria mcp install {name}`",
                        path.display(),
                        crate::install::BACKUP_SUFFIX
                    ),
                );
                continue;
            }
        };
        installed += 1;
        check_entry(
            report,
            &check,
            &name,
            &path,
            &entry,
            own.as_deref(),
            home,
            env,
        );
    }
    if installed == 0 {
        report.warn(
            "clients",
            "no MCP client has an alexandria entry",
            "alexandria mcp install <client> (claude-code, claude-desktop, cursor, codex, windsurf, zed, vscode, gemini, continue)",
        );
    }
}

/// Client entries pinned to `slug` (`--workspace slug` or a `/mcp/slug` URL): where each
/// is, and the command that re-writes it.
pub fn entries_pinned_to(slug: &str) -> Vec<(String, String)> {
    let Ok(env) = Env::from_process() else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for (client, scope, path, format) in entry_locations(&env) {
        let Ok(text) = fs::read_to_string(&path) else {
            continue;
        };
        let Ok(Some(entry)) = read_entry(&text, format) else {
            continue;
        };
        let args: Vec<String> = entry
            .get("args")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        let by_arg = pinned_workspace(&args).as_deref() == Some(slug);
        let by_url = ["url", "httpUrl", "serverUrl"].iter().any(|key| {
            entry
                .get(*key)
                .and_then(Value::as_str)
                .is_some_and(|url| url.ends_with(&format!("/mcp/{slug}")))
        });
        if by_arg || by_url {
            let name = client
                .to_possible_value()
                .map(|v| v.get_name().to_string())
                .unwrap_or_default();
            let http = if by_url { " --http" } else { "" };
            let place = match scope {
                Scope::Project => " (run it in that project's directory)",
                Scope::User => "",
            };
            found.push((
                format!("{}: {}", client.display_name(), path.display()),
                format!("alexandria mcp install {name}{http} --workspace <new-slug>{place}"),
            ));
        }
    }
    found
}

#[allow(clippy::too_many_arguments)]
fn check_entry(
    report: &mut Report,
    check: &str,
    name: &str,
    path: &Path,
    entry: &Value,
    own: Option<&Path>,
    home: &Home,
    env: &Env,
) {
    let shown = path.display();
    // URL entries reach the daemon over HTTP: check that something answers there.
    for key in ["url", "httpUrl", "serverUrl"] {
        if let Some(url) = entry.get(key).and_then(Value::as_str) {
            let reinstall = match url.rsplit_once("/mcp/") {
                Some((_, slug)) => {
                    format!("alexandria mcp install {name} --http --workspace {slug}")
                }
                None => format!("alexandria mcp install {name} --http"),
            };
            match probe_health(url) {
                Ok(()) => report.ok(check, format!("{shown}: HTTP entry {url} (the daemon answers)")),
                Err(problem) => report.error(
                    check,
                    format!("{shown}: HTTP entry {url}: {problem}"),
                    format!(
                        "start the daemon (alexandria daemon start); if its port changed, set [http] port in config.toml, restart it (alexandria daemon stop) and run `{reinstall}`"
                    ),
                ),
            }
            return;
        }
    }
    let args: Vec<String> = entry
        .get("args")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|v| v.as_str().unwrap_or_default().to_string())
                .collect()
        })
        .unwrap_or_default();
    // `<uvx> alexandria mcp serve …`, which `mcp install` writes when run from uv's cache:
    // uvx fetches alexandria itself; the arguments after `alexandria` are ours to check.
    let command = entry.get("command").and_then(Value::as_str).unwrap_or("");
    let via_uvx = Path::new(command).file_name().is_some_and(|n| n == "uvx")
        && args.first().is_some_and(|first| first == "alexandria");
    let args = if via_uvx { args[1..].to_vec() } else { args };
    let pinned = pinned_workspace(&args);
    let reinstall = match &pinned {
        Some(slug) => format!("alexandria mcp install {name} --workspace {slug}"),
        None => format!("alexandria mcp install {name}"),
    };
    let command_path = Path::new(command);
    if command.is_empty() || !command_path.is_absolute() {
        report.error(
            check,
            format!("{shown}: the command {command:?} is not an absolute path; GUI clients may not find it"),
            reinstall,
        );
        return;
    }
    if !command_path.is_file() {
        report.error(
            check,
            format!("{shown}: runs {command}, which does not exist (moved or uninstalled binary)"),
            reinstall,
        );
        return;
    }
    let mut notes = Vec::new();
    let same_binary = fs::canonicalize(command_path)
        .ok()
        .zip(own)
        .is_some_and(|(a, b)| a == b);
    if !same_binary && !via_uvx {
        let version = version_of(command_path).unwrap_or_else(|| "?".into());
        notes.push(format!(
            "runs another alexandria ({command}, version {version})"
        ));
    }
    let mut argv = vec!["alexandria".to_string()];
    argv.extend(args.iter().cloned());
    match crate::Args::try_parse_from(&argv) {
        Ok(crate::Args {
            command: crate::Command::Mcp(crate::McpCommand::Serve { .. }),
            ..
        }) => {}
        Ok(_) => {
            report.error(
                check,
                format!("{shown}: args {args:?} do not run `alexandria mcp serve`"),
                reinstall,
            );
            return;
        }
        Err(error) => {
            let first = error.to_string();
            let first = first
                .lines()
                .next()
                .unwrap_or("")
                .trim_start_matches("error: ");
            report.error(
                check,
                format!("{shown}: args {args:?} are not valid: {first}"),
                reinstall,
            );
            return;
        }
    }
    // The home this entry reaches: env, else --home in args, else the default.
    let entry_home = entry
        .get("env")
        .and_then(|e| e.get(alexandria_proto::home::HOME_ENV))
        .and_then(Value::as_str)
        .map(PathBuf::from)
        .or_else(|| flag_value(&args, "--home").map(PathBuf::from))
        .unwrap_or_else(|| env.home.join(".alexandria"));
    let entry_home = Home::new(entry_home);
    if !entry_home.config_file().is_file() {
        report.error(
            check,
            format!(
                "{shown}: reaches the home {}, which is not set up (no config.toml); tool calls answer home_not_found",
                entry_home.root().display()
            ),
            format!("run `{reinstall}` with the right home (ALEXANDRIA_HOME=<home> or --home <home>)"),
        );
        return;
    }
    let same_home = entry_home.root() == home.root()
        || matches!(
            (fs::canonicalize(entry_home.root()), fs::canonicalize(home.root())),
            (Ok(a), Ok(b)) if a == b
        );
    if !same_home {
        notes.push(format!(
            "reaches the home {}, not {} (the one checked here)",
            entry_home.root().display(),
            home.root().display()
        ));
    }
    if let Some(slug) = &pinned
        && !entry_home.workspace(slug).is_dir()
    {
        report.error(
            check,
            format!(
                "{shown}: pinned to workspace {slug}, which does not exist in {}",
                entry_home.root().display()
            ),
            format!("alexandria workspace create {slug} (or re-run mcp install with another --workspace)"),
        );
        return;
    }
    let through = if via_uvx { " (through uvx)" } else { "" };
    let what = match &pinned {
        Some(slug) => format!("{shown}: alexandria mcp serve{through}, pinned to {slug}"),
        None => format!("{shown}: alexandria mcp serve{through}"),
    };
    if notes.is_empty() {
        report.ok(check, what);
    } else {
        report.warn(
            check,
            format!("{what}; {}", notes.join("; ")),
            format!("if that is not intended: {reinstall}"),
        );
    }
}

/// The address of `host:port` without a name lookup: an IP address, or `localhost`. The
/// shim is linked statically (build.rs), where glibc's `getaddrinfo` would load the
/// machine's NSS modules into it.
fn loopback_address(authority: &str) -> Option<std::net::SocketAddr> {
    if let Ok(address) = authority.parse() {
        return Some(address);
    }
    let (host, port) = authority.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    host.eq_ignore_ascii_case("localhost")
        .then(|| std::net::SocketAddr::from(([127, 0, 0, 1], port)))
}

/// `GET /health` on the host of an `http://host:port/…` URL (open even with tokens on).
fn probe_health(url: &str) -> Result<(), String> {
    use std::io::{Read, Write};
    let Some(rest) = url.strip_prefix("http://") else {
        return Err("not an http:// URL (alexandria serves plain HTTP on loopback)".into());
    };
    let authority = rest.split('/').next().unwrap_or(rest);
    let address = loopback_address(authority).ok_or_else(|| {
        format!("not checked: {authority} is not an IP address or localhost (alexandria serves HTTP on loopback)")
    })?;
    let timeout = Duration::from_secs(2);
    let mut stream = std::net::TcpStream::connect_timeout(&address, timeout)
        .map_err(|e| format!("nothing answers at {authority} ({e})"))?;
    let _ = stream.set_read_timeout(Some(timeout));
    let request = format!("GET /health HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .map_err(|e| format!("cannot send to {authority} ({e})"))?;
    let mut reply = Vec::new();
    let _ = stream.take(4096).read_to_end(&mut reply);
    let reply = String::from_utf8_lossy(&reply);
    let status = reply.split_whitespace().nth(1).unwrap_or("");
    if status == "200" && reply.contains("\"status\":\"ok\"") {
        Ok(())
    } else if status == "200" {
        Err(format!("{authority} answers, but not as alexandria"))
    } else {
        Err(format!("{authority}/health answered {status:?}, not 200"))
    }
}

fn flag_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let prefix = format!("{flag}=");
    args.iter().enumerate().find_map(|(i, arg)| {
        if arg == flag {
            args.get(i + 1).map(String::as_str)
        } else {
            arg.strip_prefix(&prefix)
        }
    })
}

fn pinned_workspace(args: &[String]) -> Option<String> {
    flag_value(args, "--workspace").map(str::to_string)
}

fn check_service(report: &mut Report, env: &Env) {
    let kind = service::ServiceKind::current();
    let path = service::service_path(kind, &env.home, env.xdg_config_home.as_deref());
    let Ok(text) = fs::read_to_string(&path) else {
        report.ok(
            "service",
            "no service installed (clients start the daemon on demand)",
        );
        return;
    };
    if !text.contains(service::MARKER) {
        report.warn(
            "service",
            format!(
                "{} exists but was not written by alexandria",
                path.display()
            ),
            "check it by hand, or move it away and run `alexandria daemon install-service`",
        );
        return;
    }
    let daemon = match kind {
        service::ServiceKind::Systemd => text
            .lines()
            .find_map(|l| l.strip_prefix("ExecStart="))
            .map(|v| v.trim().trim_matches('"').to_string()),
        service::ServiceKind::Launchd => text
            .split("<string>")
            .nth(2)
            .and_then(|s| s.split("</string>").next())
            .map(str::to_string),
    };
    if let Some(daemon) = &daemon
        && !Path::new(daemon).is_file()
    {
        report.error(
            "service",
            format!("{} runs {daemon}, which does not exist", path.display()),
            "alexandria daemon install-service (rewrites it for the installed alexandriad)",
        );
        return;
    }
    let state = match kind {
        service::ServiceKind::Systemd => service::systemd_user_bus().map(|systemctl| {
            let unit = service::SYSTEMD_UNIT;
            let enabled = service::succeeds(&systemctl, &["--user", "is-enabled", "--quiet", unit]);
            let active = service::succeeds(&systemctl, &["--user", "is-active", "--quiet", unit]);
            (enabled, active)
        }),
        service::ServiceKind::Launchd => None,
    };
    match state {
        Some((_, true)) => report.ok("service", format!("{} is active", path.display())),
        Some((enabled, false)) => report.warn(
            "service",
            format!(
                "{} is installed but not running ({})",
                path.display(),
                if enabled { "enabled" } else { "not enabled" }
            ),
            format!(
                "systemctl --user enable --now {}; journalctl --user -u {} shows why it stopped",
                service::SYSTEMD_UNIT,
                service::SYSTEMD_UNIT
            ),
        ),
        None => report.ok(
            "service",
            format!(
                "{} is installed (its state cannot be queried from here)",
                path.display()
            ),
        ),
    }
}

fn check_disk(report: &mut Report, home: &Home) {
    let mut dir = home.root();
    while !dir.exists() {
        match dir.parent() {
            Some(parent) => dir = parent,
            None => return,
        }
    }
    let Ok(stat) = rustix::fs::statvfs(dir) else {
        return;
    };
    let free = stat.f_bavail.saturating_mul(stat.f_frsize);
    let mib = free / (1024 * 1024);
    let message = format!("{mib} MiB free on the file system of {}", dir.display());
    if mib < 100 {
        report.error(
            "disk",
            format!("{message}: writes and the index will fail"),
            "free some space (or move the home to a larger disk and set ALEXANDRIA_HOME)",
        );
    } else if mib < 1024 {
        report.warn("disk", message, "free some space soon");
    } else {
        report.ok("disk", message);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_entries_are_probed_without_a_name_lookup() {
        let v4 = std::net::SocketAddr::from(([127, 0, 0, 1], 7181));
        assert_eq!(loopback_address("127.0.0.1:7181"), Some(v4));
        assert_eq!(loopback_address("LocalHost:7181"), Some(v4));
        assert_eq!(
            loopback_address("[::1]:7181"),
            Some(std::net::SocketAddr::from((
                std::net::Ipv6Addr::LOCALHOST,
                7181
            )))
        );
        for other in ["example.com:80", "localhost", "localhost:port", "127.0.0.1"] {
            assert_eq!(loopback_address(other), None, "{other}");
        }
    }

    #[test]
    fn utc_stamps() {
        for (secs, stamp) in [
            (0, "1970-01-01T00:00:00"),
            (951_782_400, "2000-02-29T00:00:00"),
            (1_798_761_599, "2026-12-31T23:59:59"),
        ] {
            assert_eq!(
                utc_stamp(UNIX_EPOCH + Duration::from_secs(secs)),
                stamp,
                "{secs}"
            );
        }
    }

    #[test]
    fn flags() {
        let args: Vec<String> = ["mcp", "serve", "--workspace", "w", "--home=/h"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(pinned_workspace(&args), Some("w".into()));
        assert_eq!(flag_value(&args, "--home"), Some("/h"));
        assert_eq!(flag_value(&args, "--nope"), None);
    }
}
