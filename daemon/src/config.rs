//! `config.toml`: user-controlled daemon settings. Missing keys take defaults.

use std::path::Path;

use serde::Deserialize;

/// The default file written by `alexandria init`, documented in place.
pub const DEFAULT_CONFIG: &str = r#"# alexandria daemon configuration. Restart the daemon after editing:
#   alexandria daemon stop && alexandria daemon start

[http]
# Address of the Streamable HTTP endpoint (/mcp and /mcp/<slug>).
bind = "127.0.0.1"
# A fixed port, so URLs given to clients and tunnels survive restarts (`--port`
# overrides it; 0 picks a free port). `alexandria daemon status` shows the address.
port = 4747
# Require a bearer token (`alexandria daemon auth token`) on every HTTP request.
# Always on once a token has been minted, and mandatory for a non-loopback bind.
token_required = false
# Extra Host names to accept besides localhost/127.0.0.1/[::1] (e.g. a tunnel's
# hostname). Requests naming any other Host or Origin get 403 (DNS rebinding).
allowed_hosts = []
# Browser origins (e.g. "http://localhost:6274" for the MCP Inspector) whose CORS
# preflights are answered; they also pass the Origin check.
cors_origins = []

[remote]
# Remote access for Claude.ai, ChatGPT and other cloud MCP clients, through a tunnel
# that forwards https://<public host> to this daemon. Managed by `alexandria remote
# enable|disable`; the daemon applies changes at once.
enabled = false
# The public HTTPS origin the tunnel serves (https://host[:port]); every URL the
# daemon advertises is built from it, never from Host or X-Forwarded-* headers.
public_url = ""
# Workspaces reachable remotely (empty: all of them).
workspaces = []

[write]
# How long a write waits for the workspace lock before answering workspace_busy.
lock_timeout_secs = 30.0
# How a group of writes is made durable before it is answered: false = one syncfs of
# the file system (measured cheaper on ext4 unless other programs keep much unwritten
# data), true = fsync of only the files and folders the writes touched.
flush_files = false

[git]
# The branch a new workspace's repository starts on (existing ones keep theirs; a
# branch switched by hand in a workspace is followed).
default_branch = "main"

[logs]
# Tool-call logs (logs/mcp-<date>.jsonl) older than this are deleted.
retention_days = 7

[sync]
# Workspaces with a git remote (`alexandria workspace remote`) sync on their own: at
# start, a few seconds after writes stop, and at this interval (seconds).
interval_secs = 300
# Quiet time after the last write before a sync starts.
quiet_secs = 5
# A fetch, push or clone that takes longer is killed and the sync fails (retried).
timeout_secs = 120

[sources]
# Every request a source makes (feeds, pages, articles) gives up after this long.
timeout_secs = 30
# Larger responses are refused with an error.
max_response_bytes = 20971520
"#;

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Config {
    pub http: HttpConfig,
    pub write: WriteConfig,
    pub git: GitConfig,
    pub logs: LogsConfig,
    pub remote: RemoteConfig,
    pub sources: SourcesConfig,
    pub sync: SyncConfig,
}

/// `[sync]`: background sync of workspaces with a git remote.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct SyncConfig {
    pub interval_secs: f64,
    pub quiet_secs: f64,
    pub timeout_secs: f64,
}

impl Default for SyncConfig {
    fn default() -> SyncConfig {
        SyncConfig {
            interval_secs: 300.0,
            quiet_secs: 5.0,
            timeout_secs: 120.0,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct SourcesConfig {
    pub timeout_secs: f64,
    pub max_response_bytes: u64,
}

impl Default for SourcesConfig {
    fn default() -> SourcesConfig {
        SourcesConfig {
            timeout_secs: 30.0,
            max_response_bytes: 20 * 1024 * 1024,
        }
    }
}

/// `[remote]`: OAuth-protected access through a tunnel.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct RemoteConfig {
    pub enabled: bool,
    pub public_url: String,
    pub workspaces: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct GitConfig {
    pub default_branch: String,
}

impl Default for GitConfig {
    fn default() -> GitConfig {
        GitConfig {
            default_branch: "main".into(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct HttpConfig {
    pub bind: String,
    pub port: u16,
    pub token_required: bool,
    pub allowed_hosts: Vec<String>,
    pub cors_origins: Vec<String>,
    /// Request headers must arrive within this (slowloris).
    pub header_timeout_secs: f64,
    /// A request body must arrive within this.
    pub body_timeout_secs: f64,
    /// A connection with no request in flight is closed after this.
    pub idle_timeout_secs: f64,
    /// Connections open at once (the oldest idle one makes room for a new one).
    pub max_connections: usize,
    /// Requests with a bad bearer token per minute from one source (all of loopback,
    /// i.e. a tunnel, counts as one) before they get 429.
    pub failed_auth_per_minute: u32,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct WriteConfig {
    pub lock_timeout_secs: f64,
    /// Flush writes by fsyncing what they wrote instead of one `syncfs`.
    pub flush_files: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct LogsConfig {
    pub retention_days: u32,
}

impl Default for HttpConfig {
    fn default() -> HttpConfig {
        HttpConfig {
            bind: "127.0.0.1".into(),
            port: alexandria_proto::DEFAULT_HTTP_PORT,
            token_required: false,
            allowed_hosts: Vec::new(),
            cors_origins: Vec::new(),
            header_timeout_secs: 10.0,
            body_timeout_secs: 30.0,
            idle_timeout_secs: 120.0,
            max_connections: 256,
            failed_auth_per_minute: 30,
        }
    }
}

impl Default for WriteConfig {
    fn default() -> WriteConfig {
        WriteConfig {
            lock_timeout_secs: 30.0,
            flush_files: false,
        }
    }
}

impl Default for LogsConfig {
    fn default() -> LogsConfig {
        LogsConfig { retention_days: 7 }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is not valid: {source}")]
    Parse {
        path: String,
        source: toml::de::Error,
    },
    #[error("cannot edit {path}: {reason}")]
    Edit { path: String, reason: String },
}

impl Config {
    /// Load `path`; a missing file means all defaults.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Config::default()),
            Err(source) => {
                return Err(ConfigError::Read {
                    path: path.display().to_string(),
                    source,
                });
            }
        };
        toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.display().to_string(),
            source,
        })
    }
}

/// Rewrite `[remote]` in `path`, keeping the rest of the file (comments included).
pub fn save_remote(path: &Path, remote: &RemoteConfig) -> Result<(), ConfigError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(source) => {
            return Err(ConfigError::Read {
                path: path.display().to_string(),
                source,
            });
        }
    };
    let mut document: toml_edit::DocumentMut =
        text.parse()
            .map_err(|e: toml_edit::TomlError| ConfigError::Edit {
                path: path.display().to_string(),
                reason: e.to_string(),
            })?;
    if !document.contains_table("remote") {
        document["remote"] = toml_edit::table();
    }
    let table = &mut document["remote"];
    table["enabled"] = toml_edit::value(remote.enabled);
    table["public_url"] = toml_edit::value(remote.public_url.as_str());
    let mut workspaces = toml_edit::Array::new();
    for slug in &remote.workspaces {
        workspaces.push(slug.as_str());
    }
    table["workspaces"] = toml_edit::value(workspaces);
    let temp = path.with_extension("toml.tmp");
    std::fs::write(&temp, document.to_string())
        .and_then(|()| std::fs::rename(&temp, path))
        .map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_file_parses_to_defaults() {
        let config: Config = toml::from_str(DEFAULT_CONFIG).expect("default config parses");
        assert_eq!(config.http.bind, "127.0.0.1");
        assert_eq!(config.http.port, alexandria_proto::DEFAULT_HTTP_PORT);
        assert_eq!(config.http.port, HttpConfig::default().port);
        assert_eq!(config.remote, RemoteConfig::default());
        assert_eq!(config.write.lock_timeout_secs, 30.0);
        let partial: Config =
            toml::from_str("[write]\nlock_timeout_secs = 2.5\n").expect("partial");
        assert_eq!(partial.write.lock_timeout_secs, 2.5);
        assert_eq!(partial.logs.retention_days, 7);
        assert_eq!(config.git.default_branch, "main");
        assert_eq!(partial.git.default_branch, "main");
    }

    #[test]
    fn remote_settings_are_saved_keeping_the_rest_of_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("config.toml");
        std::fs::write(&path, DEFAULT_CONFIG).expect("write");
        let remote = RemoteConfig {
            enabled: true,
            public_url: "https://wiki.example.org".into(),
            workspaces: vec!["acme".into()],
        };
        save_remote(&path, &remote).expect("save");
        let text = std::fs::read_to_string(&path).expect("read");
        assert!(
            text.contains("# Require a bearer token"),
            "comments survive"
        );
        let config = Config::load(&path).expect("load");
        assert_eq!(config.remote, remote);
        assert_eq!(config.http.port, alexandria_proto::DEFAULT_HTTP_PORT);
        let missing = dir.path().join("none.toml");
        save_remote(&missing, &remote).expect("save into a new file");
        assert_eq!(Config::load(&missing).expect("load").remote, remote);
    }
}
