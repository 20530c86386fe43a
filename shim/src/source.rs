//! `alexandria source …` and `alexandria subscription …`: source adapters and the items
//! they find. Every command is one control request; the daemon does the work.
#![allow(clippy::print_stdout)]

use std::io::Read as _;
use std::process::ExitCode;

use alexandria_proto::{ControlRequest, SourceSpec};
use anyhow::{Context, Result, bail};

use crate::cli::{parse_ttl, request};
use crate::connect::Connector;

#[derive(clap::Subcommand, Debug)]
pub enum SourceCommand {
    /// Add a source: folder <dir>, feed <url>, url <url>…, git <path-or-url>
    Add {
        /// The workspace slug
        workspace: String,
        /// folder, feed, url or git
        #[arg(value_parser = ["folder", "feed", "url", "git"])]
        kind: String,
        /// A directory, a feed URL (or file), page URLs, a repository path or clone URL
        #[arg(required = true)]
        targets: Vec<String>,
        /// Name of the source (captures go to raw/sources/<name>/); default from the target
        #[arg(long)]
        name: Option<String>,
        /// Only files matching this glob (folder, git), e.g. '**/*.md'
        #[arg(long, value_name = "GLOB")]
        include: Option<String>,
        /// Branch to follow (git; default: the repository's HEAD)
        #[arg(long)]
        branch: Option<String>,
        /// How often to check, e.g. 30m, 6h, 1d (default 6h for feeds and pages, 1h otherwise)
        #[arg(long, value_parser = parse_ttl, value_name = "DUR")]
        every: Option<u64>,
        /// Capture new items without asking (default for folder and git)
        #[arg(long, conflicts_with = "no_auto")]
        auto: bool,
        /// Keep new items pending until `subscription ingest` (default for feed and url)
        #[arg(long)]
        no_auto: bool,
    },
    /// List sources with their sync state
    List {
        workspace: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Sync a source now (or every source of the workspace); exit 1 if one failed
    Sync {
        workspace: String,
        name: Option<String>,
        /// Every source of the workspace (the default without a name)
        #[arg(long, conflicts_with = "name")]
        all: bool,
        #[arg(long)]
        json: bool,
    },
    /// Store a source's credential, read from stdin: `user:password` (HTTP Basic) or a token (Bearer)
    Secret { workspace: String, name: String },
    /// Remove a source (what it captured stays in raw/)
    Remove { workspace: String, name: String },
}

#[derive(clap::Subcommand, Debug)]
pub enum SubscriptionCommand {
    /// Items sources found
    List {
        workspace: String,
        #[arg(long)]
        source: Option<String>,
        /// pending, captured, dismissed or failed (default: all)
        #[arg(long, value_parser = ["pending", "captured", "dismissed", "failed"])]
        state: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Capture items into raw/sources/<name>/ (one commit)
    Ingest {
        workspace: String,
        /// Item ids (from `subscription list`)
        items: Vec<i64>,
        /// With --all: every pending item of this source
        #[arg(long)]
        source: Option<String>,
        #[arg(long, requires = "source")]
        all: bool,
    },
    /// Dismiss items: they never come back
    Dismiss {
        workspace: String,
        #[arg(required = true)]
        items: Vec<i64>,
    },
}

fn show(text: &str, data: &serde_json::Value, json: bool) {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(data).unwrap_or_else(|_| data.to_string())
        );
    } else {
        println!("{text}");
    }
}

pub fn source(connector: &Connector, command: SourceCommand) -> Result<ExitCode> {
    match command {
        SourceCommand::Add {
            workspace,
            kind,
            targets,
            name,
            include,
            branch,
            every,
            auto,
            no_auto,
        } => {
            // Paths are the CLI's, not the daemon's: make them absolute here.
            let targets = if matches!(kind.as_str(), "folder" | "git" | "feed") {
                targets
                    .into_iter()
                    .map(|t| {
                        if t.contains("://") || t.contains('@') {
                            t
                        } else {
                            std::fs::canonicalize(&t)
                                .map(|p| p.display().to_string())
                                .unwrap_or(t)
                        }
                    })
                    .collect()
            } else {
                targets
            };
            let spec = SourceSpec {
                workspace,
                kind,
                targets,
                name,
                include,
                branch,
                every_secs: every,
                auto: if auto {
                    Some(true)
                } else if no_auto {
                    Some(false)
                } else {
                    None
                },
            };
            let (text, data) = request(connector, &ControlRequest::SourceAdd(spec))?;
            show(&text, &data, false);
        }
        SourceCommand::List { workspace, json } => {
            let (text, data) = request(connector, &ControlRequest::SourceList { workspace })?;
            show(&text, &data, json);
        }
        SourceCommand::Sync {
            workspace,
            name,
            all: _,
            json,
        } => {
            let (text, data) = request(connector, &ControlRequest::SourceSync { workspace, name })?;
            show(&text, &data, json);
            let failed = data
                .as_array()
                .is_some_and(|reports| reports.iter().any(|r| !r["error"].is_null()));
            if failed {
                return Ok(ExitCode::FAILURE);
            }
        }
        SourceCommand::Secret { workspace, name } => {
            let mut secret = String::new();
            std::io::stdin()
                .read_to_string(&mut secret)
                .context("reading the secret from stdin")?;
            let secret = secret.trim_end_matches(['\n', '\r']).to_string();
            if secret.trim().is_empty() {
                bail!(
                    "no secret on stdin\nhint: printf '%s' 'user:password' | alexandria source secret {workspace} {name}"
                );
            }
            let (text, _) = request(
                connector,
                &ControlRequest::SourceSecret {
                    workspace,
                    name,
                    secret,
                },
            )?;
            println!("{text}");
        }
        SourceCommand::Remove { workspace, name } => {
            let (text, data) =
                request(connector, &ControlRequest::SourceRemove { workspace, name })?;
            show(&text, &data, false);
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn subscription(connector: &Connector, command: SubscriptionCommand) -> Result<ExitCode> {
    let (text, data, json) = match command {
        SubscriptionCommand::List {
            workspace,
            source,
            state,
            json,
        } => {
            let (text, data) = request(
                connector,
                &ControlRequest::SubscriptionList {
                    workspace,
                    source,
                    state,
                },
            )?;
            (text, data, json)
        }
        SubscriptionCommand::Ingest {
            workspace,
            items,
            source,
            all,
        } => {
            if items.is_empty() && !all {
                bail!("name item ids, or --source <name> --all");
            }
            let (text, data) = request(
                connector,
                &ControlRequest::SubscriptionIngest {
                    workspace,
                    items,
                    source,
                    all,
                },
            )?;
            (text, data, false)
        }
        SubscriptionCommand::Dismiss { workspace, items } => {
            let (text, data) = request(
                connector,
                &ControlRequest::SubscriptionDismiss { workspace, items },
            )?;
            (text, data, false)
        }
    };
    show(&text, &data, json);
    Ok(ExitCode::SUCCESS)
}
