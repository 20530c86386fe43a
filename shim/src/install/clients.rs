//! The nine MCP clients: where each keeps its MCP config, in what format, and what our entry
//! looks like there. Path rules are a pure function of an [`Env`] so every OS is testable.

use std::path::PathBuf;

use anyhow::{Result, bail};

use super::entry::Entry;
use super::json::Dialect;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Client {
    ClaudeCode,
    ClaudeDesktop,
    Cursor,
    Codex,
    Windsurf,
    Zed,
    Vscode,
    Gemini,
    Continue,
}

impl Client {
    pub fn display_name(self) -> &'static str {
        match self {
            Client::ClaudeCode => "Claude Code",
            Client::ClaudeDesktop => "Claude Desktop",
            Client::Cursor => "Cursor",
            Client::Codex => "Codex",
            Client::Windsurf => "Windsurf",
            Client::Zed => "Zed",
            Client::Vscode => "VS Code",
            Client::Gemini => "Gemini CLI",
            Client::Continue => "Continue",
        }
    }

    /// Whether `--workspace` writes a project file in the current directory.
    pub fn has_project_file(self) -> bool {
        matches!(
            self,
            Client::ClaudeCode | Client::Cursor | Client::Vscode | Client::Codex
        )
    }

    /// Our entry in this client's dialect; `home` goes into its `env` (every client we
    /// support takes one).
    pub fn entry(self, command: &str, args: &[String], home: Option<&str>) -> Entry {
        let type_field = matches!(self, Client::ClaudeCode | Client::Vscode | Client::Continue);
        Entry::stdio(type_field, command, args, home)
    }

    /// Our URL entry (Streamable HTTP) in this client's dialect; `None` for clients whose
    /// config file takes no URL servers.
    pub fn http_entry(self, url: &str, bearer: Option<&str>) -> Option<Entry> {
        let (kind, url_key, headers_key) = match self {
            Client::ClaudeCode | Client::Vscode => (Some("http"), "url", "headers"),
            Client::Cursor => (None, "url", "headers"),
            Client::Windsurf => (None, "serverUrl", "headers"),
            Client::Gemini => (None, "httpUrl", "headers"),
            Client::Codex => (None, "url", "http_headers"),
            Client::ClaudeDesktop | Client::Zed | Client::Continue => return None,
        };
        Some(Entry::http(kind, url_key, url, headers_key, bearer))
    }

    /// What the user does next for the client to see the change.
    pub fn reload_hint(self, scope: Scope) -> &'static str {
        match (self, scope) {
            (Client::ClaudeCode, Scope::Project) => {
                "Claude Code asks you to approve servers from .mcp.json the first time it starts here"
            }
            (Client::ClaudeCode, Scope::User) => {
                "new Claude Code sessions load it; `claude mcp list` shows it"
            }
            (Client::ClaudeDesktop, _) => "quit and reopen Claude Desktop to load it",
            (Client::Cursor, _) => {
                "Cursor picks it up in Settings > MCP (restart Cursor if it does not)"
            }
            (Client::Codex, Scope::Project) => {
                "Codex reads .codex/config.toml only in projects you have marked trusted"
            }
            (Client::Codex, Scope::User) => "new Codex sessions load it; `codex mcp list` shows it",
            (Client::Windsurf, _) => "refresh the MCP servers in Windsurf's Cascade panel",
            (Client::Zed, _) => {
                "Zed reloads its settings on its own; the Agent panel lists the server"
            }
            (Client::Vscode, _) => "run \"MCP: List Servers\" in VS Code to start it",
            (Client::Gemini, _) => "new Gemini CLI sessions load it; `/mcp` lists it",
            (Client::Continue, _) => "reload the editor window; Continue uses MCP in agent mode",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    User,
    Project,
}

/// The shape of the file that holds our entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `{ servers_key: { "alexandria": { … } } }`
    Json {
        dialect: Dialect,
        servers_key: &'static str,
    },
    /// `[mcp_servers.alexandria]` in TOML.
    CodexToml,
    /// A whole YAML block file owned by us.
    ContinueBlock,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::Json {
                dialect: Dialect::Json,
                ..
            } => "JSON",
            Format::Json {
                dialect: Dialect::Jsonc,
                ..
            } => "JSONC",
            Format::CodexToml => "TOML",
            Format::ContinueBlock => "YAML",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Os {
    Linux,
    Mac,
    Windows,
}

impl Os {
    pub fn current() -> Os {
        if cfg!(target_os = "macos") {
            Os::Mac
        } else if cfg!(windows) {
            Os::Windows
        } else {
            Os::Linux
        }
    }
}

/// The environment the path rules read. Built from the process by [`Env::from_process`].
#[derive(Debug, Clone, Default)]
pub struct Env {
    pub os: Option<Os>,
    pub home: PathBuf,
    pub cwd: PathBuf,
    pub xdg_config_home: Option<PathBuf>,
    pub appdata: Option<PathBuf>,
    pub codex_home: Option<PathBuf>,
    pub claude_config_dir: Option<PathBuf>,
    pub continue_global_dir: Option<PathBuf>,
    /// Windows: the packaged (MSIX) Claude Desktop's redirected `Roaming\Claude`, if installed.
    pub claude_msix_dir: Option<PathBuf>,
}

impl Env {
    pub fn from_process() -> Result<Env> {
        let var = |name: &str| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
                .filter(|p| p.is_absolute())
        };
        let os = Os::current();
        let home = match os {
            Os::Windows => var("USERPROFILE").or_else(|| var("HOME")),
            _ => var("HOME"),
        };
        let Some(home) = home else {
            bail!("cannot find your home directory: set HOME to an absolute path");
        };
        let cwd = std::env::current_dir()
            .map_err(|e| anyhow::anyhow!("cannot read the current directory: {e}"))?;
        let claude_msix_dir = match os {
            Os::Windows => var("LOCALAPPDATA").and_then(|local| find_claude_msix(&local)),
            _ => None,
        };
        Ok(Env {
            os: Some(os),
            home,
            cwd,
            xdg_config_home: var("XDG_CONFIG_HOME"),
            appdata: var("APPDATA"),
            codex_home: var("CODEX_HOME"),
            claude_config_dir: var("CLAUDE_CONFIG_DIR"),
            continue_global_dir: var("CONTINUE_GLOBAL_DIR"),
            claude_msix_dir,
        })
    }

    fn os(&self) -> Os {
        self.os.unwrap_or_else(Os::current)
    }

    /// `$XDG_CONFIG_HOME`, else `~/.config` (Linux only; Electron and Zed follow it).
    fn xdg_config(&self) -> PathBuf {
        self.xdg_config_home
            .clone()
            .unwrap_or_else(|| self.home.join(".config"))
    }

    /// `%APPDATA%`, else `~\AppData\Roaming`.
    fn roaming(&self) -> PathBuf {
        self.appdata
            .clone()
            .unwrap_or_else(|| self.home.join("AppData").join("Roaming"))
    }

    /// Per-user app data of desktop apps: Linux XDG config, macOS Application Support,
    /// Windows roaming AppData.
    fn app_config(&self) -> PathBuf {
        match self.os() {
            Os::Linux => self.xdg_config(),
            Os::Mac => self.home.join("Library").join("Application Support"),
            Os::Windows => self.roaming(),
        }
    }
}

/// `%LOCALAPPDATA%\Packages\Claude_*\LocalCache\Roaming\Claude`: the MSIX install reads its
/// config there, not from `%APPDATA%\Claude`.
fn find_claude_msix(local_app_data: &std::path::Path) -> Option<PathBuf> {
    let packages = std::fs::read_dir(local_app_data.join("Packages")).ok()?;
    packages
        .filter_map(|entry| entry.ok())
        .filter(|entry| entry.file_name().to_string_lossy().starts_with("Claude_"))
        .map(|entry| {
            entry
                .path()
                .join("LocalCache")
                .join("Roaming")
                .join("Claude")
        })
        .find(|dir| dir.is_dir())
}

/// Where the client's file is and how it is shaped.
pub fn locate(client: Client, scope: Scope, env: &Env) -> (PathBuf, Format) {
    let mcp_servers = |dialect| Format::Json {
        dialect,
        servers_key: "mcpServers",
    };
    let home = &env.home;
    let cwd = &env.cwd;
    match (client, scope) {
        (Client::ClaudeCode, Scope::Project) => (cwd.join(".mcp.json"), mcp_servers(Dialect::Json)),
        (Client::ClaudeCode, Scope::User) => (
            env.claude_config_dir
                .as_ref()
                .unwrap_or(home)
                .join(".claude.json"),
            mcp_servers(Dialect::Json),
        ),
        (Client::ClaudeDesktop, _) => {
            let dir = match (&env.claude_msix_dir, env.os()) {
                (Some(msix), Os::Windows) => msix.clone(),
                _ => env.app_config().join("Claude"),
            };
            (
                dir.join("claude_desktop_config.json"),
                mcp_servers(Dialect::Json),
            )
        }
        (Client::Cursor, Scope::Project) => (
            cwd.join(".cursor").join("mcp.json"),
            mcp_servers(Dialect::Json),
        ),
        (Client::Cursor, Scope::User) => (
            home.join(".cursor").join("mcp.json"),
            mcp_servers(Dialect::Json),
        ),
        (Client::Codex, Scope::Project) => {
            (cwd.join(".codex").join("config.toml"), Format::CodexToml)
        }
        (Client::Codex, Scope::User) => (
            env.codex_home
                .clone()
                .unwrap_or_else(|| home.join(".codex"))
                .join("config.toml"),
            Format::CodexToml,
        ),
        (Client::Windsurf, _) => (
            home.join(".codeium")
                .join("windsurf")
                .join("mcp_config.json"),
            mcp_servers(Dialect::Json),
        ),
        (Client::Zed, _) => {
            let dir = match env.os() {
                Os::Linux => env.xdg_config().join("zed"),
                Os::Mac => home.join(".config").join("zed"),
                Os::Windows => env.roaming().join("Zed"),
            };
            (
                dir.join("settings.json"),
                Format::Json {
                    dialect: Dialect::Jsonc,
                    servers_key: "context_servers",
                },
            )
        }
        (Client::Vscode, scope) => {
            let path = match scope {
                Scope::Project => cwd.join(".vscode").join("mcp.json"),
                Scope::User => env.app_config().join("Code").join("User").join("mcp.json"),
            };
            (
                path,
                Format::Json {
                    dialect: Dialect::Jsonc,
                    servers_key: "servers",
                },
            )
        }
        (Client::Gemini, _) => (
            home.join(".gemini").join("settings.json"),
            mcp_servers(Dialect::Jsonc),
        ),
        (Client::Continue, _) => (
            env.continue_global_dir
                .clone()
                .unwrap_or_else(|| home.join(".continue"))
                .join("mcpServers")
                .join("alexandria.yaml"),
            Format::ContinueBlock,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::ValueEnum;

    fn env(os: Os) -> Env {
        Env {
            os: Some(os),
            home: PathBuf::from("/h"),
            cwd: PathBuf::from("/p"),
            ..Env::default()
        }
    }

    #[test]
    fn paths() {
        let linux = env(Os::Linux);
        let mac = env(Os::Mac);
        let xdg = Env {
            xdg_config_home: Some(PathBuf::from("/x")),
            codex_home: Some(PathBuf::from("/c")),
            claude_config_dir: Some(PathBuf::from("/cc")),
            continue_global_dir: Some(PathBuf::from("/cg")),
            ..env(Os::Linux)
        };
        let windows = Env {
            appdata: Some(PathBuf::from("/h/AppData/Roaming")),
            ..env(Os::Windows)
        };
        let msix = Env {
            claude_msix_dir: Some(PathBuf::from(
                "/l/Packages/Claude_x/LocalCache/Roaming/Claude",
            )),
            ..windows.clone()
        };
        let cases: Vec<(Client, Scope, &Env, &str)> = vec![
            (Client::ClaudeCode, Scope::User, &linux, "/h/.claude.json"),
            (Client::ClaudeCode, Scope::User, &xdg, "/cc/.claude.json"),
            (Client::ClaudeCode, Scope::Project, &linux, "/p/.mcp.json"),
            (
                Client::ClaudeDesktop,
                Scope::User,
                &linux,
                "/h/.config/Claude/claude_desktop_config.json",
            ),
            (
                Client::ClaudeDesktop,
                Scope::User,
                &xdg,
                "/x/Claude/claude_desktop_config.json",
            ),
            (
                Client::ClaudeDesktop,
                Scope::User,
                &mac,
                "/h/Library/Application Support/Claude/claude_desktop_config.json",
            ),
            (
                Client::ClaudeDesktop,
                Scope::User,
                &windows,
                "/h/AppData/Roaming/Claude/claude_desktop_config.json",
            ),
            (
                Client::ClaudeDesktop,
                Scope::User,
                &msix,
                "/l/Packages/Claude_x/LocalCache/Roaming/Claude/claude_desktop_config.json",
            ),
            (Client::Cursor, Scope::User, &mac, "/h/.cursor/mcp.json"),
            (
                Client::Cursor,
                Scope::Project,
                &linux,
                "/p/.cursor/mcp.json",
            ),
            (Client::Codex, Scope::User, &linux, "/h/.codex/config.toml"),
            (Client::Codex, Scope::User, &xdg, "/c/config.toml"),
            (Client::Codex, Scope::Project, &xdg, "/p/.codex/config.toml"),
            (
                Client::Windsurf,
                Scope::User,
                &linux,
                "/h/.codeium/windsurf/mcp_config.json",
            ),
            (
                Client::Zed,
                Scope::User,
                &linux,
                "/h/.config/zed/settings.json",
            ),
            (Client::Zed, Scope::User, &xdg, "/x/zed/settings.json"),
            (
                Client::Zed,
                Scope::User,
                &mac,
                "/h/.config/zed/settings.json",
            ),
            (
                Client::Zed,
                Scope::User,
                &windows,
                "/h/AppData/Roaming/Zed/settings.json",
            ),
            (
                Client::Vscode,
                Scope::User,
                &linux,
                "/h/.config/Code/User/mcp.json",
            ),
            (
                Client::Vscode,
                Scope::User,
                &mac,
                "/h/Library/Application Support/Code/User/mcp.json",
            ),
            (Client::Vscode, Scope::Project, &mac, "/p/.vscode/mcp.json"),
            (
                Client::Gemini,
                Scope::User,
                &linux,
                "/h/.gemini/settings.json",
            ),
            (
                Client::Continue,
                Scope::User,
                &linux,
                "/h/.continue/mcpServers/alexandria.yaml",
            ),
            (
                Client::Continue,
                Scope::User,
                &xdg,
                "/cg/mcpServers/alexandria.yaml",
            ),
        ];
        for (client, scope, env, expected) in cases {
            let (path, _) = locate(client, scope, env);
            assert_eq!(
                path,
                PathBuf::from(expected),
                "{client:?} {scope:?} {:?}",
                env.os
            );
        }
    }

    #[test]
    fn cli_names() {
        let names: Vec<String> = Client::value_variants()
            .iter()
            .filter_map(|c| c.to_possible_value().map(|v| v.get_name().to_string()))
            .collect();
        assert_eq!(
            names,
            [
                "claude-code",
                "claude-desktop",
                "cursor",
                "codex",
                "windsurf",
                "zed",
                "vscode",
                "gemini",
                "continue"
            ]
        );
    }
}
