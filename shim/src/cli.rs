//! Client commands: each sends one control request to the daemon and prints the reply.
//!
//! Human output goes to stdout, progress and errors to stderr. (None of this runs in
//! `mcp serve`, whose stdout is the MCP channel.)
#![allow(clippy::print_stdout)]

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use alexandria_proto::{ConnectionKind, ControlReply, ControlRequest};
use anyhow::{Context, Result, anyhow, bail};

use crate::connect::{Connection, Connector, daemon_binary};

/// Send `request` (starting the daemon if needed) and return the final reply's text
/// and data. Progress lines are shown on stderr when it is a terminal.
pub(crate) fn request(
    connector: &Connector,
    request: &ControlRequest,
) -> Result<(String, serde_json::Value)> {
    let connection = connector.connect(ConnectionKind::Control)?;
    exchange(connection, request)
}

fn exchange(
    mut connection: Connection,
    request: &ControlRequest,
) -> Result<(String, serde_json::Value)> {
    connection
        .stream
        .write_all(&alexandria_proto::to_line(request))
        .context("sending the request to the daemon")?;
    let show_progress = std::io::stderr().is_terminal();
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
            ControlReply::Progress { done, total, item } => {
                if show_progress {
                    eprint!("\r\x1b[2K[{done}/{total}] {item}");
                    if done == total {
                        eprintln!();
                    }
                }
            }
            ControlReply::Done { text, data } => return Ok((text, data)),
            ControlReply::Failed {
                code,
                message,
                hint,
            } => {
                if show_progress {
                    eprintln!();
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
        if !path.is_file() {
            bail!("{} is not a file", file.display());
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

pub fn daemon_start(connector: &Connector) -> Result<ExitCode> {
    let (text, data) = request(connector, &ControlRequest::Status)?;
    let _ = text;
    println!(
        "alexandriad is running (pid {}, socket {})",
        data["pid"],
        data["socket"].as_str().unwrap_or("?")
    );
    Ok(ExitCode::SUCCESS)
}

pub fn daemon_stop(connector: &Connector) -> Result<ExitCode> {
    let Some(connection) = connector.connect_existing(ConnectionKind::Control)? else {
        println!("alexandriad is not running");
        return Ok(ExitCode::SUCCESS);
    };
    let pid = connection.daemon_pid;
    let (text, _) = exchange(connection, &ControlRequest::Stop)?;
    // Wait until the socket no longer answers, so a following start is clean.
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if std::os::unix::net::UnixStream::connect(connector.home.socket()).is_err() {
            println!("{text}");
            return Ok(ExitCode::SUCCESS);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(anyhow!("alexandriad (pid {pid}) did not stop within 10s"))
}

pub fn daemon_status(connector: &Connector, json: bool) -> Result<ExitCode> {
    let Some(connection) = connector.connect_existing(ConnectionKind::Control)? else {
        if json {
            println!("{}", serde_json::json!({"running": false}));
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

pub fn daemon_run(connector: &Connector) -> Result<ExitCode> {
    let daemon = daemon_binary();
    let status = std::process::Command::new(&daemon)
        .env(alexandria_proto::home::HOME_ENV, connector.home.root())
        .status()
        .with_context(|| format!("cannot run {}", daemon.display()))?;
    Ok(if status.success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
