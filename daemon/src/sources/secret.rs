//! Source credentials: `secrets/source-<id>` (0600, in the 0700
//! `secrets/` folder). Read from stdin by `alexandria source secret`; never in
//! `config.toml`, `state.db`, logs, tool results or error messages. `Debug` prints
//! `[REDACTED]`.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use crate::error::{ToolError, ToolResult};
use crate::workspace::Store;

/// A credential: `user:password` (HTTP Basic) or a token (`Authorization: Bearer`).
#[derive(Clone)]
pub struct Secret(String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[REDACTED]")
    }
}

impl Secret {
    /// The `Authorization` header value.
    pub fn authorization(&self) -> String {
        use base64::Engine as _;
        let value = self.0.trim();
        if let Some(token) = value.strip_prefix("bearer:") {
            return format!("Bearer {}", token.trim());
        }
        if value.contains(':') && !value.contains(char::is_whitespace) {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(value)
            )
        } else {
            format!("Bearer {value}")
        }
    }

    /// Remove every occurrence of the secret (and of its parts) from `text`.
    pub fn scrub(&self, text: &str) -> String {
        let mut out = text.replace(self.0.trim(), "REDACTED");
        for part in self.0.trim().split(':').filter(|p| p.len() >= 6) {
            out = out.replace(part, "REDACTED");
        }
        out
    }
}

/// Keyed by the source's id, so a workspace rename keeps it.
fn path(store: &Store, source_id: i64) -> PathBuf {
    store.home.secrets_dir().join(format!("source-{source_id}"))
}

pub fn exists(store: &Store, source_id: i64) -> bool {
    path(store, source_id).is_file()
}

pub fn load(store: &Store, source_id: i64) -> Option<Secret> {
    std::fs::read_to_string(path(store, source_id))
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .map(Secret)
}

/// Store (replace) a credential, 0600, written to a temp file and renamed.
pub fn store(store: &Store, source_id: i64, value: &str) -> ToolResult<()> {
    let value = value.trim();
    if value.is_empty() {
        return Err(ToolError::invalid_argument(
            "the secret is empty",
            "pipe it on stdin: `printf '%s' 'user:password' | alexandria source secret <workspace> <name>`",
        ));
    }
    let target = path(store, source_id);
    let temp = target.with_extension(format!("tmp-{}", uuid::Uuid::new_v4().simple()));
    let result = (|| -> std::io::Result<()> {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temp)?;
        file.write_all(value.as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&temp, &target)
    })();
    if let Err(error) = result {
        let _ = std::fs::remove_file(&temp);
        return Err(ToolError::internal("storing the secret", error.kind()));
    }
    Ok(())
}

pub fn remove(store: &Store, source_id: i64) {
    let _ = std::fs::remove_file(path(store, source_id));
}
