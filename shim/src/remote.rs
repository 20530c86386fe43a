//! `alexandria remote …`: remote access for cloud MCP clients (Claude.ai, ChatGPT)
//! through a tunnel. Each command is one control request; the daemon owns the
//! settings (`config.toml [remote]`), the OAuth clients and the pairing codes.
#![allow(clippy::print_stdout)]

use std::process::ExitCode;

use alexandria_proto::ControlRequest;
use anyhow::{Result, anyhow, bail};

use crate::cli::request;
use crate::connect::Connector;

#[derive(clap::Subcommand, Debug)]
pub enum RemoteCommand {
    /// Turn remote access on at the tunnel's public https URL
    Enable {
        /// The https origin your tunnel serves, e.g. https://wiki.tail1234.ts.net
        #[arg(long, value_name = "URL")]
        public_url: String,
        /// Share only this workspace (repeat for several; default: all)
        #[arg(long = "workspace", value_name = "SLUG")]
        workspaces: Vec<String>,
    },
    /// Turn remote access off (OAuth tokens stop working at once)
    Disable,
    /// Public URL, shared workspaces, endpoints, clients
    Status {
        #[arg(long)]
        json: bool,
    },
    /// A one-time pairing code (10 minutes) to approve a client on its consent page
    Pair {
        #[arg(long)]
        json: bool,
    },
    /// Fetch this daemon's public documents through the public URL and say what is wrong
    Doctor {
        #[arg(long)]
        json: bool,
    },
    /// Registered clients and their live grants
    Clients {
        #[arg(long)]
        json: bool,
    },
    /// Revoke a client's access (`remote clients` lists them), or everyone's
    Revoke {
        /// The client id
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        client_id: Option<String>,
        /// Revoke every client
        #[arg(long)]
        all: bool,
    },
}

pub fn run(connector: &Connector, command: RemoteCommand) -> Result<ExitCode> {
    let (request_message, json) = match command {
        RemoteCommand::Enable {
            public_url,
            workspaces,
        } => {
            for slug in &workspaces {
                alexandria_proto::paths::validate_slug(slug)?;
            }
            (
                ControlRequest::RemoteEnable {
                    public_url,
                    workspaces,
                },
                false,
            )
        }
        RemoteCommand::Disable => (ControlRequest::RemoteDisable, false),
        RemoteCommand::Status { json } => (ControlRequest::RemoteStatus, json),
        RemoteCommand::Pair { json } => {
            let (text, data) = request(connector, &ControlRequest::RemotePair)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&data)?);
                return Ok(ExitCode::SUCCESS);
            }
            // The code alone on stdout (for scripts), the explanation on stderr.
            let code = data["code"]
                .as_str()
                .ok_or_else(|| anyhow!("the daemon's reply has no code"))?;
            println!("{code}");
            eprintln!("{}", text.strip_prefix(code).unwrap_or(&text).trim());
            return Ok(ExitCode::SUCCESS);
        }
        RemoteCommand::Clients { json } => (ControlRequest::RemoteClients, json),
        RemoteCommand::Doctor { json } => (ControlRequest::RemoteDoctor, json),
        RemoteCommand::Revoke { client_id, all } => {
            if client_id.is_none() && !all {
                bail!("name a client id or pass --all");
            }
            (ControlRequest::RemoteRevoke { client_id, all }, false)
        }
    };
    let (text, data) = request(connector, &request_message)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&data)?);
    } else {
        println!("{text}");
    }
    Ok(ExitCode::SUCCESS)
}
