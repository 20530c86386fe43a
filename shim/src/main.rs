//! `alexandria`: the stdio MCP shim (`alexandria mcp serve`) and the command line.
//!
//! This binary holds no wiki logic: every command either pumps MCP frames to the
//! daemon or sends it one control request and prints the answer.

mod cli;
mod connect;
mod demo;
mod docs;
mod doctor;
mod install;
mod nohome;
mod progress;
mod pump;
mod remote;
mod serve_args;
mod source;
mod web;
mod workspaces;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "alexandria",
    version = alexandria_proto::BUILD,
    about = "A local-first wiki for AI agents, served over MCP",
    long_about = "alexandria keeps markdown wikis (one git repository per workspace) and serves them to MCP clients through the alexandriad daemon.\nSet ALEXANDRIA_HOME to use another home than ~/.alexandria."
)]
struct Args {
    /// The alexandria home to use (default: $ALEXANDRIA_HOME, else ~/.alexandria)
    #[arg(long, global = true, value_name = "DIR")]
    home: Option<std::path::PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create the home directory and the `global` workspace (starts the daemon)
    Init,
    /// Manage workspaces
    #[command(subcommand)]
    Workspace(WorkspaceCommand),
    /// Copy source files (or folders, recursively) into a workspace's raw/ layer and index them
    Ingest {
        /// The workspace slug
        workspace: String,
        /// Files or folders to copy (markdown, text, PDF, images); a folder keeps its
        /// layout under raw/<folder name>/, skipping hidden files and folders
        #[arg(required = true)]
        files: Vec<std::path::PathBuf>,
    },
    /// Source adapters: watched folders, feeds, web pages, git repositories
    #[command(subcommand)]
    Source(source::SourceCommand),
    /// Items sources found: list, capture (ingest) or dismiss them
    #[command(subcommand)]
    Subscription(source::SubscriptionCommand),
    /// The MCP side: the stdio shim and session status
    #[command(subcommand)]
    Mcp(McpCommand),
    /// Start, stop and inspect the daemon
    #[command(subcommand)]
    Daemon(DaemonCommand),
    /// Check the install: binaries, home, daemon, client entries, service, disk (exit 1 on errors)
    Doctor {
        /// Print the findings as JSON
        #[arg(long)]
        json: bool,
    },
    /// Print the shell completion script (bash, zsh, fish, elvish, powershell)
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page, or write one page per command into a directory
    Man {
        /// Write alexandria.1, alexandria-<command>.1, … into this directory
        #[arg(long, value_name = "DIR")]
        dir: Option<std::path::PathBuf>,
    },
    /// Print a one-time login URL for the web view (and open it in a browser)
    Web {
        /// Only print the URL; do not open a browser
        #[arg(long)]
        no_open: bool,
    },
    /// Sync a workspace with its git remote now (fetch, merge, push); exit 1 with the reason
    Sync {
        /// The workspace (or --all)
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        workspace: Option<String>,
        /// Every workspace that has a remote
        #[arg(long)]
        all: bool,
        #[arg(long)]
        json: bool,
    },
    /// Remote access for Claude.ai, ChatGPT and other cloud clients (OAuth, through a tunnel)
    #[command(subcommand)]
    Remote(remote::RemoteCommand),
    /// Run a scripted agent session (guide, search, read) on a bundled sample workspace
    Demo {
        /// Keep the demo's temporary home instead of deleting it
        #[arg(long)]
        keep: bool,
    },
}

#[derive(Subcommand)]
enum WorkspaceCommand {
    /// Create a workspace (a git repository with raw/ and wiki/)
    Create { slug: String },
    /// List workspaces
    List {
        #[arg(long)]
        json: bool,
    },
    /// Rename a workspace (its files, index and history move together)
    Rename { from: String, to: String },
    /// Move a workspace to the home's trash/ (restorable; nothing is deleted)
    Archive {
        slug: String,
        /// Archive even while MCP sessions are pinned to it
        #[arg(long)]
        force: bool,
    },
    /// Bring back an archived workspace (an archive name, or a slug for its newest archive)
    Restore { name: String },
    /// Paths, counts, size on disk, last write, remote and sources of a workspace
    Info {
        slug: String,
        #[arg(long)]
        json: bool,
    },
    /// Set the git remote a workspace syncs with (or remove it with --unset)
    Remote {
        slug: String,
        /// The remote: https://…, git@host:owner/repo.git, ssh://…, file:///path
        #[arg(required_unless_present = "unset", conflicts_with = "unset")]
        url: Option<String>,
        /// The remote branch (default: the workspace's branch)
        #[arg(long)]
        branch: Option<String>,
        /// Stop syncing: forget the remote (nothing is deleted)
        #[arg(long)]
        unset: bool,
    },
    /// A workspace from a git remote (the second machine): clone, register, index
    Clone {
        url: String,
        /// The workspace's slug (default: from the URL)
        slug: Option<String>,
        /// The remote branch (default: the remote's default branch)
        #[arg(long)]
        branch: Option<String>,
    },
    /// Sync state of a workspace: remote, last sync, ahead/behind, open conflicts, last error
    Status {
        slug: String,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum McpCommand {
    /// Serve MCP on stdin/stdout (what MCP clients launch)
    Serve {
        /// Pin this session to one workspace (default: $ALEXANDRIA_WORKSPACE when it is set
        /// and not empty, else open mode)
        #[arg(long)]
        workspace: Option<String>,
        /// Set the home up on first use when it does not exist yet (or is an empty
        /// folder), instead of answering home_not_found. For launchers whose users have
        /// no terminal, like the Claude Desktop bundle, which passes the home explicitly.
        #[arg(long)]
        init_if_missing: bool,
    },
    /// Show the daemon and its live MCP sessions
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Add (or update) the alexandria server in an MCP client's config file
    Install(install::McpInstallArgs),
    /// Remove the alexandria server from an MCP client's config file
    Uninstall(install::McpInstallArgs),
}

#[derive(Subcommand)]
enum DaemonCommand {
    /// Start the daemon in the background if it is not running
    Start(cli::DaemonArgs),
    /// Stop the running daemon and wait until its process has exited
    Stop {
        /// Seconds to wait for the daemon to exit (it finishes the writes in progress)
        #[arg(long, value_name = "SECS", default_value_t = 30)]
        timeout: u64,
    },
    /// Show whether the daemon runs, its pid, version and socket
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Run the daemon in the foreground (for service managers)
    Run(cli::DaemonArgs),
    /// HTTP bearer tokens
    #[command(subcommand)]
    Auth(cli::AuthCommand),
    /// Install a systemd user unit (Linux) or launchd agent (macOS) that runs the daemon
    InstallService(install::ServiceArgs),
    /// Stop and remove the service written by install-service
    UninstallService(install::ServiceArgs),
}

fn main() -> ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // What MCP clients run, read without building clap's command tree (serve_args.rs).
    let args = match serve_args::parse(argv.get(1..).unwrap_or_default()) {
        Some(serve) => Args {
            home: serve.home,
            command: Command::Mcp(McpCommand::Serve {
                workspace: serve.workspace,
                init_if_missing: serve.init_if_missing,
            }),
        },
        None => Args::parse_from(argv),
    };
    match run(args) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("alexandria: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> anyhow::Result<ExitCode> {
    match &args.command {
        Command::Demo { keep } => return demo::run(*keep),
        Command::Completions { shell } => return docs::completions(*shell),
        Command::Man { dir } => return docs::man(dir.as_deref()),
        _ => {}
    }
    let connector = connect::Connector::for_home(args.home.as_deref())?;
    match args.command {
        Command::Demo { .. } | Command::Completions { .. } | Command::Man { .. } => {
            unreachable!("handled above")
        }
        Command::Mcp(McpCommand::Serve {
            workspace,
            init_if_missing,
        }) => {
            let binding = match workspace.or_else(pinned_by_env) {
                Some(slug) => {
                    alexandria_proto::paths::validate_slug(&slug)?;
                    alexandria_proto::Binding::Pinned { workspace: slug }
                }
                None => alexandria_proto::Binding::Open,
            };
            if let Some(problem) = nohome::check(&connector.home, args.home.is_some())
                && !(init_if_missing && nohome::init_on_first_use(&connector))
            {
                nohome::serve(&problem)?;
                return Ok(ExitCode::SUCCESS);
            }
            pump::serve(connector, pump::PumpConfig { binding })?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Mcp(McpCommand::Status { json }) => cli::mcp_status(&connector, json),
        Command::Doctor { json } => doctor::run(&connector, json),
        Command::Init => cli::init(&connector),
        Command::Web { no_open } => web::web(&connector, !no_open),
        Command::Workspace(WorkspaceCommand::Create { slug }) => {
            cli::workspace_create(&connector, &slug)
        }
        Command::Workspace(WorkspaceCommand::List { json }) => {
            cli::workspace_list(&connector, json)
        }
        Command::Workspace(WorkspaceCommand::Rename { from, to }) => {
            workspaces::rename(&connector, &from, &to)
        }
        Command::Workspace(WorkspaceCommand::Archive { slug, force }) => {
            workspaces::archive(&connector, &slug, force)
        }
        Command::Workspace(WorkspaceCommand::Restore { name }) => {
            workspaces::restore(&connector, &name)
        }
        Command::Workspace(WorkspaceCommand::Info { slug, json }) => {
            workspaces::info(&connector, &slug, json)
        }
        Command::Workspace(WorkspaceCommand::Remote {
            slug,
            url,
            branch,
            unset: _,
        }) => workspaces::remote(&connector, &slug, url, branch),
        Command::Workspace(WorkspaceCommand::Clone { url, slug, branch }) => {
            workspaces::clone(&connector, url, slug, branch)
        }
        Command::Workspace(WorkspaceCommand::Status { slug, json }) => {
            workspaces::status(&connector, &slug, json)
        }
        Command::Sync {
            workspace,
            all: _,
            json,
        } => workspaces::sync(&connector, workspace, json),
        Command::Remote(command) => remote::run(&connector, command),
        Command::Ingest { workspace, files } => cli::ingest(&connector, &workspace, &files),
        Command::Source(command) => source::source(&connector, command),
        Command::Subscription(command) => source::subscription(&connector, command),
        Command::Daemon(DaemonCommand::Start(daemon)) => cli::daemon_start(&connector, &daemon),
        Command::Daemon(DaemonCommand::Stop { timeout }) => {
            cli::daemon_stop(&connector, std::time::Duration::from_secs(timeout))
        }
        Command::Daemon(DaemonCommand::Status { json }) => cli::daemon_status(&connector, json),
        Command::Daemon(DaemonCommand::Run(daemon)) => cli::daemon_run(&connector, &daemon),
        Command::Daemon(DaemonCommand::Auth(auth)) => cli::auth(&connector, auth),
        Command::Mcp(McpCommand::Install(args)) => install::mcp_install(&args, &connector),
        Command::Mcp(McpCommand::Uninstall(args)) => install::mcp_uninstall(&args),
        Command::Daemon(DaemonCommand::InstallService(args)) => {
            install::install_service(&args, &connector.home)
        }
        Command::Daemon(DaemonCommand::UninstallService(args)) => install::uninstall_service(&args),
    }
}

/// `$ALEXANDRIA_WORKSPACE`, for hosts that configure a server through its environment (the
/// Claude Desktop bundle passes its optional "Workspace" setting this way; empty = open).
fn pinned_by_env() -> Option<String> {
    std::env::var("ALEXANDRIA_WORKSPACE")
        .ok()
        .filter(|slug| !slug.is_empty())
}

/// `pow`, for indicatif's rate and ETA estimates: the one function this binary took
/// from libm.so, so the shim no longer maps and relocates that library at every start
/// (about 300 kB of its resident pages; issue 15's shim RSS goal is 3 MiB).
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
#[unsafe(no_mangle)]
pub extern "C" fn pow(x: f64, y: f64) -> f64 {
    libm::pow(x, y)
}
