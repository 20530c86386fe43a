//! The front end of the install commands: find the file, run the pure edit, write it with
//! care and tell the user what changed. The only module under `install` that prints.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use alexandria_proto::{ControlRequest, Home};
use anyhow::{Context, Result, anyhow, bail};

use super::clients::{Client, Env, Format, Scope, locate};
use super::entry::{self, Entry, Plan};
use super::files::{self, Found};
use super::json::{self, Dialect, JsonTarget};
use super::service::{self, ServiceConfig, ServiceKind};
use super::{Change, Edit, EditError, SERVER_NAME, claude_cli, codex, continue_block, launcher};
use crate::connect::Connector;

/// `println!` that never fails: a closed stdout (`… | head`) must not abort an install
/// half-way, between running a command and checking its result.
macro_rules! say {
    ($($arg:tt)*) => {{
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

macro_rules! say_raw {
    ($($arg:tt)*) => {{
        let _ = write!(std::io::stdout().lock(), $($arg)*);
    }};
}

#[derive(clap::Args)]
pub struct McpInstallArgs {
    /// The MCP client whose configuration to edit
    #[arg(value_enum)]
    pub client: Client,
    /// Pin the entry to one workspace. For claude-code, cursor, vscode and codex this writes
    /// the project file in the current directory instead of the user file
    #[arg(long, value_name = "SLUG")]
    pub workspace: Option<String>,
    /// Show what would change and write nothing
    #[arg(long)]
    pub dry_run: bool,
    /// Write a URL entry for the daemon's HTTP endpoint (/mcp, or /mcp/<slug> with
    /// --workspace) instead of a command, with a bearer token when tokens are on
    #[arg(long)]
    pub http: bool,
}

#[derive(clap::Args)]
pub struct ServiceArgs {
    /// Show what would change and write nothing
    #[arg(long)]
    pub dry_run: bool,
    /// Print the service file for this service manager and exit (tests, packagers)
    #[arg(long, value_enum, hide = true)]
    pub render: Option<ServiceKind>,
}

/// `alexandria mcp install <client>`; `home` is the home this command runs against, which the
/// entry must reach too.
pub fn mcp_install(args: &McpInstallArgs, connector: &Connector) -> Result<ExitCode> {
    let home = &connector.home;
    let request = Request::new(args)?;
    if args.http {
        let entry = http_entry(&request, connector)?;
        return write_entry(&request, &entry);
    }
    let launcher = server_launcher()?;
    let mut serve_args = vec!["mcp".to_string(), "serve".to_string()];
    if let Some(slug) = &args.workspace {
        serve_args.extend(["--workspace".to_string(), slug.clone()]);
    }
    let entry_home = entry_home(home, &request.env)?;
    let entry = args.client.entry(
        &launcher.command,
        &launcher.args(&serve_args),
        entry_home.as_deref(),
    );
    if let Some(reason) = &launcher.reason {
        say!("note: {reason}");
    }
    if !home.config_file().is_file() {
        say!(
            "note: {} is not set up yet (no config.toml); run `{}` before using the client",
            home.root().display(),
            init_command(home, &request.env)
        );
    }
    write_entry(&request, &entry)
}

/// Put `entry` into the request's file (or hand it to `claude`) and report.
fn write_entry(request: &Request, entry: &Entry) -> Result<ExitCode> {
    if request.uses_claude_cli()
        && let Some(claude) = claude_cli::find()
    {
        return claude_install(request, &claude, entry);
    }
    let found = files::read(&request.path)?;
    let text = found.text.as_deref();
    let edit = match request.format {
        Format::Json {
            dialect,
            servers_key,
        } => json::upsert(text, json_target(dialect, servers_key), entry),
        Format::CodexToml => codex::upsert(text, SERVER_NAME, entry),
        Format::ContinueBlock => continue_block::upsert(text, entry),
    }
    .map_err(|error| refusal(&found.path, error))?;
    request.apply(&found, edit, Some(entry))
}

/// The URL entry for `--http`: the running daemon's address (started if needed) and, when
/// tokens are on, a bearer token (the one already in the entry for the same URL, else a new
/// one limited to the pinned workspace).
fn http_entry(request: &Request, connector: &Connector) -> Result<Entry> {
    let client = request.client;
    if client.http_entry("http://x", None).is_none() {
        bail!(
            "{} takes no URL servers in its config file; install the stdio entry (without --http){}",
            client.display_name(),
            if client == Client::ClaudeDesktop {
                ", or add a remote connector in Claude Desktop's Settings > Connectors"
            } else {
                ""
            }
        );
    }
    let home = &connector.home;
    if !home.config_file().is_file() {
        bail!(
            "{} is not set up yet; run `{}` first",
            home.root().display(),
            init_command(home, &request.env)
        );
    }
    let (_, status) = crate::cli::request(connector, &ControlRequest::Status)?;
    let Some(base) = status["http"].as_str() else {
        bail!(
            "the daemon serves no HTTP (its log under {} says why); check [http] in {}",
            home.logs_dir().display(),
            home.config_file().display()
        );
    };
    let url = match &request.workspace {
        Some(slug) => format!("{base}/mcp/{slug}"),
        None => format!("{base}/mcp"),
    };
    if status["http_ephemeral"].as_bool().unwrap_or(false) {
        say!(
            "note: the daemon picks a new HTTP port each time it starts ([http] port = 0), so this URL lasts until it restarts; set a fixed port in {} (the default is 4747) and re-run",
            home.config_file().display()
        );
    }
    let tokens = status["http_tokens"].as_bool().unwrap_or(false);
    let bearer = if tokens {
        match existing_bearer(request, &url)? {
            Some(token) => Some(token),
            None => {
                let (_, minted) = crate::cli::request(
                    connector,
                    &ControlRequest::AuthToken {
                        workspace: request.workspace.clone(),
                        ttl_secs: None,
                    },
                )?;
                let token = minted["token"]
                    .as_str()
                    .ok_or_else(|| anyhow!("the daemon's reply has no token"))?;
                Some(token.to_string())
            }
        }
    } else {
        None
    };
    Ok(client
        .http_entry(&url, bearer.as_deref())
        .expect("checked above that the client takes URL entries"))
}

/// The token already in our entry when it points at `url`, so re-running install is
/// idempotent instead of minting a token each time.
fn existing_bearer(request: &Request, url: &str) -> Result<Option<String>> {
    let found = files::read(&request.path)?;
    let current = match request.format {
        Format::Json {
            dialect,
            servers_key,
        } => json::current_entry(found.text.as_deref(), json_target(dialect, servers_key)),
        Format::CodexToml => codex::current_entry(found.text.as_deref(), SERVER_NAME),
        Format::ContinueBlock => Ok(None),
    }
    .map_err(|error| refusal(&found.path, error))?;
    let Some(current) = current else {
        return Ok(None);
    };
    let same_url = super::entry::URL_KEYS
        .iter()
        .any(|key| current.get(*key).and_then(|v| v.as_str()) == Some(url));
    if !same_url {
        return Ok(None);
    }
    Ok(["headers", "http_headers"].iter().find_map(|key| {
        current
            .get(*key)?
            .get(super::entry::AUTHORIZATION)?
            .as_str()?
            .strip_prefix("Bearer ")
            .map(str::to_string)
    }))
}

/// `alexandria mcp uninstall <client>`
pub fn mcp_uninstall(args: &McpInstallArgs) -> Result<ExitCode> {
    let request = Request::new(args)?;
    if request.uses_claude_cli()
        && let Some(claude) = claude_cli::find()
    {
        return claude_uninstall(&request, &claude);
    }
    let found = files::read(&request.path)?;
    let text = found.text.as_deref();
    let edit = match request.format {
        Format::Json {
            dialect,
            servers_key,
        } => json::remove(text, json_target(dialect, servers_key)),
        Format::CodexToml => codex::remove(text, SERVER_NAME),
        Format::ContinueBlock => continue_block::remove(text),
    }
    .map_err(|error| refusal(&found.path, error))?;
    request.apply(&found, edit, None)
}

/// The home to write into an entry's `env`: `None` for the default home (`~/.alexandria`),
/// which the shim finds without help.
pub fn entry_home(home: &Home, env: &Env) -> Result<Option<String>> {
    if is_default_home(home, env) {
        return Ok(None);
    }
    let root = home.root();
    root.to_str().map(|s| Some(s.to_string())).ok_or_else(|| {
        anyhow!(
            "the home {} is not a UTF-8 path, which client config files cannot hold; use a UTF-8 path",
            root.display()
        )
    })
}

/// Whether `home` is `$HOME/.alexandria` (compared after resolving symlinks when both exist).
pub fn is_default_home(home: &Home, env: &Env) -> bool {
    let default = env.home.join(".alexandria");
    if home.root() == default {
        return true;
    }
    match (
        std::fs::canonicalize(home.root()),
        std::fs::canonicalize(&default),
    ) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// The command that creates `home`: `alexandria init`, with the home named when it is not
/// the default.
pub fn init_command(home: &Home, env: &Env) -> String {
    if is_default_home(home, env) {
        "alexandria init".to_string()
    } else {
        format!(
            "alexandria --home {} init",
            claude_cli::shell_words(&[home.root().display().to_string()])
        )
    }
}

/// One install or uninstall: which client, which file.
struct Request {
    env: Env,
    client: Client,
    scope: Scope,
    path: PathBuf,
    format: Format,
    workspace: Option<String>,
    dry_run: bool,
}

impl Request {
    fn new(args: &McpInstallArgs) -> Result<Request> {
        if let Some(slug) = &args.workspace {
            alexandria_proto::paths::validate_slug(slug)?;
        }
        let env = Env::from_process()?;
        let scope = if args.workspace.is_some() && args.client.has_project_file() {
            Scope::Project
        } else {
            Scope::User
        };
        let (path, format) = locate(args.client, scope, &env);
        Ok(Request {
            env,
            client: args.client,
            scope,
            path,
            format,
            workspace: args.workspace.clone(),
            dry_run: args.dry_run,
        })
    }

    fn uses_claude_cli(&self) -> bool {
        self.client == Client::ClaudeCode && self.scope == Scope::User
    }

    fn label(&self) -> String {
        let scope = match (self.scope, &self.workspace) {
            (Scope::Project, _) => " (project)",
            (Scope::User, Some(_)) => " (user, pinned)",
            (Scope::User, None) => "",
        };
        format!("{}{scope}", self.client.display_name())
    }

    /// Write (or not) and report.
    fn apply(&self, found: &Found, edit: Edit, entry: Option<&Entry>) -> Result<ExitCode> {
        let path = found.path.display();
        let (change, text) = match edit {
            Edit::Unchanged => {
                match (entry, &found.text) {
                    (Some(_), _) => say!(
                        "{}: {path} already has an up-to-date \"{SERVER_NAME}\" entry; nothing changed",
                        self.label()
                    ),
                    (None, None) => {
                        say!("{}: {path} does not exist; nothing changed", self.label())
                    }
                    (None, Some(_)) => say!(
                        "{}: {path} has no \"{SERVER_NAME}\" entry; nothing changed",
                        self.label()
                    ),
                }
                return Ok(ExitCode::SUCCESS);
            }
            Edit::Changed { change, text } => (change, text),
        };
        let verb = change.verb(self.dry_run);
        say!(
            "{}: {verb} \"{SERVER_NAME}\" {} {path} ({})",
            self.label(),
            preposition(change),
            self.format.name()
        );
        if let Some(entry) = entry {
            print_entry(entry, self.workspace.as_deref());
        }
        if self.dry_run {
            say!("  dry run: nothing was written");
            return Ok(ExitCode::SUCCESS);
        }
        let backup = match (self.format, change) {
            (Format::ContinueBlock, Change::Removed) => files::remove(found)?,
            _ => files::write(found, &text)?,
        };
        if let Some(backup) = backup {
            say!("  previous file kept as {}", backup.display());
        }
        if change != Change::Removed {
            say!("  next: {}", self.client.reload_hint(self.scope));
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// Claude Code user scope with `claude` on PATH: read `~/.claude.json` to decide, let
/// `claude mcp add-json` write it, then read it back to check.
fn claude_install(request: &Request, claude: &Path, entry: &Entry) -> Result<ExitCode> {
    let found = files::read(&request.path)?;
    let target = json_target(Dialect::Json, "mcpServers");
    let current = json::current_entry(found.text.as_deref(), target)
        .map_err(|error| refusal(&found.path, error))?;
    let plan = entry::plan(current.as_ref(), entry);
    let path = found.path.display();
    let change = match plan {
        Plan::Unchanged => {
            say!(
                "{}: {path} already has an up-to-date \"{SERVER_NAME}\" entry; nothing changed",
                request.label()
            );
            return Ok(ExitCode::SUCCESS);
        }
        Plan::Insert => Change::Added,
        Plan::Replace | Plan::Patch(_) => Change::Updated,
    };
    let json_text = match plan {
        Plan::Patch(_) => entry::merged(current.as_ref(), entry).to_string(),
        _ => entry.to_json_text(),
    };
    let mut commands = Vec::new();
    if current.is_some() {
        commands.push(claude_cli::remove_args(SERVER_NAME));
    }
    commands.push(claude_cli::add_args(SERVER_NAME, &json_text));
    run_claude(request, claude, &found, change, &commands)?;
    print_entry(entry, request.workspace.as_deref());
    if request.dry_run {
        say!("  dry run: nothing was run or written");
        return Ok(ExitCode::SUCCESS);
    }
    let after = files::read(&request.path)?;
    let written = json::current_entry(after.text.as_deref(), target)
        .map_err(|error| refusal(&after.path, error))?;
    if entry::plan(written.as_ref(), entry) != Plan::Unchanged {
        bail!(
            "`claude` reported success but {path} has no matching \"{SERVER_NAME}\" entry; if CLAUDE_CONFIG_DIR is set for Claude Code, set it here too and re-run"
        );
    }
    say!("  next: {}", request.client.reload_hint(request.scope));
    Ok(ExitCode::SUCCESS)
}

fn claude_uninstall(request: &Request, claude: &Path) -> Result<ExitCode> {
    let found = files::read(&request.path)?;
    let target = json_target(Dialect::Json, "mcpServers");
    let current = json::current_entry(found.text.as_deref(), target)
        .map_err(|error| refusal(&found.path, error))?;
    if current.is_none() {
        say!(
            "{}: {} has no \"{SERVER_NAME}\" entry; nothing changed",
            request.label(),
            found.path.display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let commands = vec![claude_cli::remove_args(SERVER_NAME)];
    run_claude(request, claude, &found, Change::Removed, &commands)?;
    if request.dry_run {
        say!("  dry run: nothing was run or written");
        return Ok(ExitCode::SUCCESS);
    }
    let after = files::read(&request.path)?;
    if json::current_entry(after.text.as_deref(), target)
        .map_err(|error| refusal(&after.path, error))?
        .is_some()
    {
        bail!(
            "`claude mcp remove` reported success but {} still has a \"{SERVER_NAME}\" entry",
            after.path.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Announce, back up and run the `claude` commands (or only announce, in a dry run).
fn run_claude(
    request: &Request,
    claude: &Path,
    found: &Found,
    change: Change,
    commands: &[Vec<String>],
) -> Result<()> {
    let verb = change.verb(request.dry_run);
    say!(
        "{}: {verb} \"{SERVER_NAME}\" {} {} (JSON, via {})",
        request.label(),
        preposition(change),
        found.path.display(),
        claude.display()
    );
    if !request.dry_run && found.text.is_some() {
        let backup = files::backup(found)?;
        say!("  previous file kept as {}", backup.display());
    }
    for args in commands {
        say!(
            "  {} claude {}",
            if request.dry_run {
                "would run:"
            } else {
                "ran:"
            },
            claude_cli::shell_words(args)
        );
        if !request.dry_run {
            claude_cli::run(claude, args)?;
        }
    }
    Ok(())
}

/// `alexandria daemon install-service` for the daemon of `home`.
pub fn install_service(args: &ServiceArgs, home: &Home) -> Result<ExitCode> {
    let env = Env::from_process()?;
    let config = ServiceConfig {
        daemon: daemon_path()?,
        alexandria_home: (!is_default_home(home, &env)).then(|| home.root().to_path_buf()),
        home: env.home.clone(),
    };
    if let Some(kind) = args.render {
        say_raw!("{}", service::render(kind, &config));
        return Ok(ExitCode::SUCCESS);
    }
    if let launcher::Origin::UvCache(cache) = launcher::origin(&config.daemon) {
        bail!(
            "{} lives in uv's cache ({}), which `uv cache clean` removes, and a service must not point there; install alexandria for good first (`uv tool install alexandria` or `pipx install alexandria`) and run install-service from there",
            config.daemon.display(),
            cache.display()
        );
    }
    let kind = ServiceKind::current();
    let path = service::service_path(kind, &env.home, env.xdg_config_home.as_deref());
    let text = service::render(kind, &config);
    let found = files::read(&path)?;
    if let Some(existing) = &found.text
        && !existing.contains(service::MARKER)
    {
        bail!(
            "{} exists and was not written by alexandria; move it away (or remove it), then re-run",
            found.path.display()
        );
    }
    let changed = found.text.as_deref() != Some(text.as_str());
    let shown = found.path.display();
    if !changed {
        say!("{shown} is up to date; nothing changed");
    } else if args.dry_run {
        say!(
            "would write {shown} (runs {}):\n{text}",
            config.daemon.display()
        );
    } else {
        let backup = files::write(&found, &text)?;
        say!("wrote {shown} (runs {})", config.daemon.display());
        if let Some(backup) = backup {
            say!("  previous file kept as {}", backup.display());
        }
    }
    if args.dry_run {
        say!("dry run: nothing was written or started");
        return Ok(ExitCode::SUCCESS);
    }
    match kind {
        ServiceKind::Systemd => activate_systemd(changed)?,
        ServiceKind::Launchd => activate_launchd(&found.path, changed)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `alexandria daemon uninstall-service`
pub fn uninstall_service(args: &ServiceArgs) -> Result<ExitCode> {
    let env = Env::from_process()?;
    let kind = ServiceKind::current();
    let path = service::service_path(kind, &env.home, env.xdg_config_home.as_deref());
    let found = files::read(&path)?;
    let Some(existing) = &found.text else {
        say!("{} does not exist; nothing changed", path.display());
        return Ok(ExitCode::SUCCESS);
    };
    if !existing.contains(service::MARKER) {
        bail!(
            "{} was not written by alexandria, so it is left alone; remove it yourself if you want it gone",
            path.display()
        );
    }
    if args.dry_run {
        say!("would stop the service and remove {}", path.display());
        say!("dry run: nothing was changed");
        return Ok(ExitCode::SUCCESS);
    }
    match kind {
        ServiceKind::Systemd => {
            let systemctl = service::systemd_user_bus();
            if let Some(systemctl) = &systemctl {
                let unit = service::SYSTEMD_UNIT;
                service::run(systemctl, &["--user", "disable", "--now", unit])?;
                say!("ran: systemctl --user disable --now {unit}");
            }
            std::fs::remove_file(&found.path)
                .with_context(|| format!("cannot remove {}", found.path.display()))?;
            say!("removed {}", found.path.display());
            if let Some(systemctl) = &systemctl {
                service::run(systemctl, &["--user", "daemon-reload"])?;
            }
        }
        ServiceKind::Launchd => {
            if let Some((launchctl, domain)) = launchd_domain()? {
                let target = format!("{domain}/{}", service::LAUNCHD_LABEL);
                if service::succeeds(&launchctl, &["bootout", &target]) {
                    say!("ran: launchctl bootout {target}");
                }
            }
            std::fs::remove_file(&found.path)
                .with_context(|| format!("cannot remove {}", found.path.display()))?;
            say!("removed {}", found.path.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn activate_systemd(changed: bool) -> Result<()> {
    let unit = service::SYSTEMD_UNIT;
    let Some(systemctl) = service::systemd_user_bus() else {
        say!(
            "systemctl --user cannot reach a user service manager here, so the service was not started; in your login session run:\n  systemctl --user daemon-reload\n  systemctl --user enable --now {unit}\n(stop a daemon started by hand first: alexandria daemon stop)"
        );
        return Ok(());
    };
    if changed {
        service::run(&systemctl, &["--user", "daemon-reload"])?;
    }
    let enabled = service::succeeds(&systemctl, &["--user", "is-enabled", "--quiet", unit]);
    let active = service::succeeds(&systemctl, &["--user", "is-active", "--quiet", unit]);
    if !enabled {
        service::run(&systemctl, &["--user", "enable", unit])?;
        say!("ran: systemctl --user enable {unit}");
    }
    if !active {
        service::run(&systemctl, &["--user", "start", unit])?;
        say!("ran: systemctl --user start {unit}");
    } else if changed {
        service::run(&systemctl, &["--user", "restart", unit])?;
        say!("ran: systemctl --user restart {unit}");
    } else if enabled {
        say!("{unit} is enabled and running; nothing changed");
    }
    Ok(())
}

fn activate_launchd(path: &Path, changed: bool) -> Result<()> {
    let Some((launchctl, domain)) = launchd_domain()? else {
        say!(
            "launchctl is not available, so the agent was not loaded; run: launchctl bootstrap gui/$(id -u) {}",
            path.display()
        );
        return Ok(());
    };
    let target = format!("{domain}/{}", service::LAUNCHD_LABEL);
    let loaded = service::succeeds(&launchctl, &["print", &target]);
    if loaded && !changed {
        say!("{target} is loaded; nothing changed");
        return Ok(());
    }
    if loaded {
        service::run(&launchctl, &["bootout", &target])?;
        say!("ran: launchctl bootout {target}");
    }
    let path_text = path.display().to_string();
    service::run(&launchctl, &["bootstrap", &domain, &path_text])?;
    say!("ran: launchctl bootstrap {domain} {path_text}");
    Ok(())
}

/// `launchctl` and the user's GUI domain (`gui/<uid>`), when both can be found.
fn launchd_domain() -> Result<Option<(PathBuf, String)>> {
    let Some(launchctl) = claude_cli::find_on_path("launchctl") else {
        return Ok(None);
    };
    let output = std::process::Command::new("id")
        .arg("-u")
        .output()
        .context("cannot run `id -u`")?;
    let uid = String::from_utf8_lossy(&output.stdout).trim().to_string();
    if !output.status.success() || uid.is_empty() {
        bail!("`id -u` did not print a user id");
    }
    Ok(Some((launchctl, format!("gui/{uid}"))))
}

fn print_entry(entry: &Entry, workspace: Option<&str>) {
    if let Some(url) = entry.url() {
        say!("  url: {url}");
        let bearer = entry.fields.iter().any(|(_, value)| {
            matches!(value, super::entry::FieldValue::Env(vars)
                if vars.iter().any(|(k, v)| k == super::entry::AUTHORIZATION && v.is_some()))
        });
        if bearer {
            say!(
                "  with a bearer token (Authorization header); it is a secret: keep the file private"
            );
        }
    } else {
        say!(
            "  command: {} {}",
            entry.command(),
            claude_cli::shell_words(entry.args())
        );
    }
    if let Some(home) = entry.home() {
        say!("  env: {}={home}", super::entry::HOME_VAR);
    }
    if let Some(slug) = workspace {
        say!("  pinned to workspace {slug}");
    }
}

fn preposition(change: Change) -> &'static str {
    match change {
        Change::Added => "to",
        Change::Updated => "in",
        Change::Removed => "from",
    }
}

fn json_target(dialect: Dialect, servers_key: &'static str) -> JsonTarget<'static> {
    JsonTarget {
        dialect,
        servers_key,
        name: SERVER_NAME,
    }
}

fn refusal(path: &Path, error: EditError) -> anyhow::Error {
    anyhow!(
        "refusing to edit {}: {error}; nothing was changed: fix the file (or move it away) and re-run",
        path.display()
    )
}

/// What the entry runs: this executable's absolute path, or `uvx alexandria` when this one
/// runs from uv's cache (see `launcher`).
fn server_launcher() -> Result<launcher::Launcher> {
    let exe = own_executable()?;
    let uv = std::env::var_os("UV").map(PathBuf::from);
    let path = std::env::var_os("PATH");
    Ok(launcher::choose(&exe, uv.as_deref(), path.as_deref()))
}

/// The absolute, symlink-free path of this `alexandria`, so clients that do not inherit the
/// user's PATH still find it.
fn own_executable() -> Result<String> {
    let exe = std::env::current_exe().context("cannot find the path of this executable")?;
    let exe =
        std::fs::canonicalize(&exe).with_context(|| format!("cannot resolve {}", exe.display()))?;
    exe.to_str().map(str::to_string).ok_or_else(|| {
        anyhow!(
            "the path of this executable ({}) is not UTF-8, which client config files cannot hold; install alexandria under a UTF-8 path",
            exe.display()
        )
    })
}

/// `alexandriad`: `$ALEXANDRIAD` if set, else next to this executable.
fn daemon_path() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("ALEXANDRIAD").filter(|v| !v.is_empty()) {
        let path = PathBuf::from(path);
        return std::fs::canonicalize(&path).with_context(|| {
            format!(
                "ALEXANDRIAD points to {}, which does not exist",
                path.display()
            )
        });
    }
    let exe = PathBuf::from(own_executable()?);
    let sibling = exe.with_file_name("alexandriad");
    if !sibling.is_file() {
        bail!(
            "cannot find alexandriad next to {}; install both binaries (packaging/install.sh) or set ALEXANDRIAD to its absolute path",
            exe.display()
        );
    }
    Ok(sibling)
}
