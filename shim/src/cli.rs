//! Client commands: each sends one control request to the daemon and prints the reply.
//!
//! Human output goes to stdout, progress and errors to stderr. (None of this runs in
//! `mcp serve`, whose stdout is the MCP channel.)
#![allow(clippy::print_stdout)]

use std::fs::File;
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use alexandria_proto::{ConnectionKind, ControlReply, ControlRequest};
use anyhow::{Context, Result, anyhow, bail};

use crate::connect::{Connection, Connector, daemon_binary, lock_released, pidfile_holder};

/// Send `request` (starting the daemon if needed) and return the final reply's text
/// and data. Progress lines are shown on stderr when it is a terminal.
pub(crate) fn request(
    connector: &Connector,
    request: &ControlRequest,
) -> Result<(String, serde_json::Value)> {
    // A daemon that began to stop answers `daemon_stopping` without starting the
    // request: connect again (that waits for it to exit and starts the next one).
    let mut attempts = 0;
    loop {
        let connection = connector.connect(ConnectionKind::Control)?;
        match exchange(connection, request) {
            Err(error) if error.is::<NotStarted>() && attempts < 3 => attempts += 1,
            result => return result,
        }
    }
}

/// The daemon was stopping and did not start the request.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct NotStarted(String);

fn exchange(
    mut connection: Connection,
    request: &ControlRequest,
) -> Result<(String, serde_json::Value)> {
    connection
        .stream
        .write_all(&alexandria_proto::to_line(request))
        .context("sending the request to the daemon")?;
    let mut progress = crate::progress::Progress::new();
    let mut line = String::new();
    loop {
        line.clear();
        let n = connection
            .reader
            .read_line(&mut line)
            .context("reading the daemon's reply")?;
        if n == 0 {
            bail!("the daemon closed the connection before answering");
        }
        let reply: ControlReply = serde_json::from_str(line.trim())
            .with_context(|| format!("unexpected reply from the daemon: {line:?}"))?;
        match reply {
            ControlReply::Progress { done, total, item } => progress.update(done, total, &item),
            ControlReply::Done { text, data } => {
                progress.finish();
                return Ok((text, data));
            }
            ControlReply::Failed {
                code,
                message,
                hint,
            } => {
                progress.finish();
                if code == alexandria_proto::ErrorCode::DaemonStopping.as_str() {
                    return Err(NotStarted(format!("{code}: {message}\nhint: {hint}")).into());
                }
                if hint.is_empty() {
                    bail!("{code}: {message}");
                }
                bail!("{code}: {message}\nhint: {hint}");
            }
        }
    }
}

fn print_result(text: &str, data: &serde_json::Value, json: bool) {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(data).unwrap_or_else(|_| data.to_string())
        );
    } else {
        println!("{text}");
    }
}

pub fn init(connector: &Connector) -> Result<ExitCode> {
    let (text, data) = request(connector, &ControlRequest::Init)?;
    print_result(&text, &data, false);
    Ok(ExitCode::SUCCESS)
}

pub fn workspace_create(connector: &Connector, slug: &str) -> Result<ExitCode> {
    alexandria_proto::paths::validate_slug(slug)?;
    let (text, data) = request(
        connector,
        &ControlRequest::WorkspaceCreate {
            slug: slug.to_string(),
        },
    )?;
    print_result(&text, &data, false);
    Ok(ExitCode::SUCCESS)
}

pub fn workspace_list(connector: &Connector, json: bool) -> Result<ExitCode> {
    let (text, data) = request(connector, &ControlRequest::WorkspaceList)?;
    print_result(&text, &data, json);
    Ok(ExitCode::SUCCESS)
}

pub fn ingest(connector: &Connector, workspace: &str, files: &[PathBuf]) -> Result<ExitCode> {
    let mut absolute = Vec::with_capacity(files.len());
    for file in files {
        let path = std::fs::canonicalize(file)
            .with_context(|| format!("cannot read {}", file.display()))?;
        if !path.is_file() && !path.is_dir() {
            bail!(
                "{} is neither a file nor a folder; nothing was ingested",
                file.display()
            );
        }
        absolute.push(path.display().to_string());
    }
    let (text, data) = request(
        connector,
        &ControlRequest::Ingest {
            workspace: workspace.to_string(),
            files: absolute,
        },
    )?;
    print_result(&text, &data, false);
    Ok(ExitCode::SUCCESS)
}

pub fn mcp_status(connector: &Connector, json: bool) -> Result<ExitCode> {
    daemon_status(connector, json)
}

/// HTTP settings for a daemon being started (`daemon start`, `daemon run`).
#[derive(clap::Args, Debug, Default)]
pub struct DaemonArgs {
    /// HTTP bind address (default from config.toml, 127.0.0.1); non-loopback needs tokens
    #[arg(long, value_name = "ADDR")]
    pub bind: Option<String>,
    /// HTTP port (default from config.toml, 4747; 0 picks a free port)
    #[arg(long, value_name = "N")]
    pub port: Option<u16>,
    /// Require a bearer token on every HTTP request
    #[arg(long)]
    pub token_required: bool,
}

impl DaemonArgs {
    fn to_daemon_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        if let Some(bind) = &self.bind {
            args.extend(["--bind".to_string(), bind.clone()]);
        }
        if let Some(port) = self.port {
            args.extend(["--port".to_string(), port.to_string()]);
        }
        if self.token_required {
            args.push("--token-required".to_string());
        }
        args
    }
}

#[derive(clap::Subcommand, Debug)]
pub enum AuthCommand {
    /// Mint a bearer token for HTTP (printed once, on stdout); turns tokens on
    Token {
        /// Limit the token to one workspace
        #[arg(long)]
        workspace: Option<String>,
        /// Lifetime, e.g. 3600, 90m, 12h, 30d (default: until revoked)
        #[arg(long, value_parser = parse_ttl)]
        ttl: Option<u64>,
    },
    /// Invalidate every token minted so far
    Revoke,
}

/// Seconds from `3600`, `3600s`, `90m`, `12h`, `30d`, `2w`.
pub(crate) fn parse_ttl(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 3600, 90m, 12h or 30d"))?;
    let scale = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 604_800,
        _ => return Err(format!("unknown unit {unit:?}: use s, m, h, d or w")),
    };
    match number.checked_mul(scale) {
        Some(0) => Err("the lifetime must be positive".into()),
        Some(secs) => Ok(secs),
        None => Err("the lifetime is too long".into()),
    }
}

pub fn auth(connector: &Connector, command: AuthCommand) -> Result<ExitCode> {
    match command {
        AuthCommand::Token { workspace, ttl } => {
            if let Some(slug) = &workspace {
                alexandria_proto::paths::validate_slug(slug)?;
            }
            let (text, data) = request(
                connector,
                &ControlRequest::AuthToken {
                    workspace,
                    ttl_secs: ttl,
                },
            )?;
            // The token alone on stdout (for `$(…)`), the explanation on stderr.
            let token = data["token"]
                .as_str()
                .ok_or_else(|| anyhow!("the daemon's reply has no token"))?;
            println!("{token}");
            let explanation = text.strip_prefix(token).unwrap_or(&text).trim();
            eprintln!("{explanation}");
        }
        AuthCommand::Revoke => {
            let (text, data) = request(connector, &ControlRequest::AuthRevoke)?;
            print_result(&text, &data, false);
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn daemon_start(connector: &Connector, args: &DaemonArgs) -> Result<ExitCode> {
    let flags = args.to_daemon_args();
    let connection = match connector.connect_existing(ConnectionKind::Control)? {
        Some(connection) => {
            if !flags.is_empty() {
                eprintln!(
                    "alexandria: the daemon is already running, so --bind/--port/--token-required do not apply; run `alexandria daemon stop` first"
                );
            }
            connection
        }
        None => {
            connector.start_daemon_with(&flags)?;
            connector.connect(ConnectionKind::Control)?
        }
    };
    let (_, data) = exchange(connection, &ControlRequest::Status)?;
    println!(
        "alexandriad is running (pid {}, socket {}, http {})",
        data["pid"],
        data["socket"].as_str().unwrap_or("?"),
        data["http"].as_str().unwrap_or("off")
    );
    if let Some(error) = data["http_error"].as_str() {
        eprintln!("alexandria: {error}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `daemon stop`: ask the daemon to stop, then wait until its process has exited, which
/// is when the kernel frees its pidfile lock (it holds the lock to its last instant).
pub fn daemon_stop(connector: &Connector, timeout: Duration) -> Result<ExitCode> {
    let home = &connector.home;
    let (pid, pidfile) = match connector.connect_existing(ConnectionKind::Control)? {
        Some(connection) => {
            // Opened while the daemon answers, so this is its pidfile (a daemon removes
            // it only as it exits); watched through this handle even once removed.
            let pidfile = File::open(home.pid_file()).ok();
            let pid = connection.daemon_pid;
            exchange(connection, &ControlRequest::Stop)?;
            (pid, pidfile)
        }
        None => match pidfile_holder(home)? {
            // Not answering but holding the pidfile: already stopping.
            Some(holder) => {
                eprintln!(
                    "{} is already stopping; waiting for it to exit",
                    holder.describe()
                );
                (holder.pid.unwrap_or(0), File::open(home.pid_file()).ok())
            }
            None => {
                println!("alexandriad is not running");
                return Ok(ExitCode::SUCCESS);
            }
        },
    };
    let deadline = Instant::now() + timeout;
    loop {
        let released = match &pidfile {
            Some(file) => lock_released(file)?,
            None => pidfile_holder(home)?.is_none(),
        };
        if released {
            println!("alexandriad (pid {pid}) stopped");
            return Ok(ExitCode::SUCCESS);
        }
        if Instant::now() >= deadline {
            bail!(
                "alexandriad (pid {pid}) is still stopping after {}s (it finishes the writes in progress first); check with `alexandria daemon status`, or end it with `kill {pid}`",
                timeout.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub fn daemon_status(connector: &Connector, json: bool) -> Result<ExitCode> {
    let Some(connection) = connector.connect_existing(ConnectionKind::Control)? else {
        let holder = pidfile_holder(&connector.home)?;
        if json {
            let mut data = serde_json::json!({"running": false});
            if let Some(holder) = holder {
                data["stopping"] = serde_json::json!(true);
                data["pid"] = serde_json::json!(holder.pid);
            }
            println!("{data}");
        } else if let Some(holder) = holder {
            println!(
                "{} holds the home but does not answer: it is stopping (or starting)",
                holder.describe()
            );
        } else {
            println!("alexandriad is not running");
        }
        // Like `systemctl status`: 3 means "not running".
        return Ok(ExitCode::from(3));
    };
    let (text, data) = exchange(connection, &ControlRequest::Status)?;
    print_result(&text, &data, json);
    Ok(ExitCode::SUCCESS)
}

pub fn daemon_run(connector: &Connector, args: &DaemonArgs) -> Result<ExitCode> {
    let daemon = daemon_binary();
    let status = std::process::Command::new(&daemon)
        .args(args.to_daemon_args())
        .env(alexandria_proto::home::HOME_ENV, connector.home.root())
        .status()
        .with_context(|| format!("cannot run {}", daemon.display()))?;
    Ok(if status.success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_units() {
        for (text, secs) in [
            ("3600", 3600),
            ("45s", 45),
            ("90m", 5400),
            ("12h", 43_200),
            ("30d", 2_592_000),
            ("2w", 1_209_600),
        ] {
            assert_eq!(parse_ttl(text), Ok(secs), "{text}");
        }
        for bad in ["", "h", "0", "12x", "-5", "99999999999999999999d"] {
            assert!(parse_ttl(bad).is_err(), "{bad}");
        }
    }
}
