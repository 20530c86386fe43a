//! `config.toml`: user-controlled daemon settings. Missing keys take defaults.

use std::path::Path;

use serde::Deserialize;

/// The default file written by `alexandria init`, documented in place.
pub const DEFAULT_CONFIG: &str = r#"# alexandria daemon configuration. Restart the daemon after editing:
#   alexandria daemon stop && alexandria daemon start

[http]
# Address of the Streamable HTTP endpoint (/mcp and /mcp/<slug>).
bind = "127.0.0.1"
# 0 picks a free port; `alexandria daemon status` shows the bound address.
port = 0
# Require a bearer token (`alexandria daemon auth token`) on every HTTP request.
# Always on once a token has been minted, and mandatory for a non-loopback bind.
token_required = false
# Extra Host names to accept besides localhost/127.0.0.1/[::1] (e.g. a tunnel's
# hostname). Requests naming any other Host or Origin get 403 (DNS rebinding).
allowed_hosts = []

[write]
# How long a write waits for the workspace lock before answering workspace_busy.
lock_timeout_secs = 30.0

[git]
# The branch a new workspace's repository starts on (existing ones keep theirs; a
# branch switched by hand in a workspace is followed).
default_branch = "main"

[logs]
# Tool-call logs (logs/mcp-<date>.jsonl) older than this are deleted.
retention_days = 7
"#;

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Config {
    pub http: HttpConfig,
    pub write: WriteConfig,
    pub git: GitConfig,
    pub logs: LogsConfig,
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
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct WriteConfig {
    pub lock_timeout_secs: f64,
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
            port: 0,
            token_required: false,
            allowed_hosts: Vec::new(),
        }
    }
}

impl Default for WriteConfig {
    fn default() -> WriteConfig {
        WriteConfig {
            lock_timeout_secs: 30.0,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_file_parses_to_defaults() {
        let config: Config = toml::from_str(DEFAULT_CONFIG).expect("default config parses");
        assert_eq!(config.http.bind, "127.0.0.1");
        assert_eq!(config.write.lock_timeout_secs, 30.0);
        let partial: Config =
            toml::from_str("[write]\nlock_timeout_secs = 2.5\n").expect("partial");
        assert_eq!(partial.write.lock_timeout_secs, 2.5);
        assert_eq!(partial.logs.retention_days, 7);
        assert_eq!(config.git.default_branch, "main");
        assert_eq!(partial.git.default_branch, "main");
    }
}
