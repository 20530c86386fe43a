//! `alexandria web`: ask the daemon for a one-time login URL for the web view, print
//! it, and open it in a browser when a desktop session is there.
//!
//! This is CLI output, not the shim: printing to stdout is what it is for.
#![allow(clippy::print_stdout)]

use std::process::{Command, ExitCode, Stdio};

use alexandria_proto::ControlRequest;
use anyhow::{Result, anyhow};

use crate::cli::request;
use crate::connect::Connector;

pub fn web(connector: &Connector, open: bool) -> Result<ExitCode> {
    let (_, data) = request(connector, &ControlRequest::WebLogin)?;
    let url = data["url"]
        .as_str()
        .ok_or_else(|| anyhow!("the daemon's reply has no URL"))?;
    // The URL alone on stdout (for scripts), the explanation on stderr.
    println!("{url}");
    eprintln!("open it within 10 minutes; it signs this browser in once");
    if open && has_desktop() {
        let opener = if cfg!(target_os = "macos") {
            "open"
        } else {
            "xdg-open"
        };
        let _ = Command::new(opener)
            .arg(url)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
    }
    Ok(ExitCode::SUCCESS)
}

fn has_desktop() -> bool {
    cfg!(target_os = "macos")
        || std::env::var_os("DISPLAY").is_some()
        || std::env::var_os("WAYLAND_DISPLAY").is_some()
}
