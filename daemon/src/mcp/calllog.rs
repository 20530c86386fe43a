//! `logs/mcp-<date>.jsonl`: one line per tool call on any transport
//! `{ts, session, transport, workspace, tool, args_hash, latency_ms, result}`.
//! Arguments are hashed, never written: they may quote the user's pages.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use alexandria_proto::Binding;
use serde_json::{Value, json};

use crate::db::now_ms;
use crate::tools::iso_time;

const PREFIX: &str = "mcp-";
const SUFFIX: &str = ".jsonl";

/// One tool call, as logged.
pub struct CallRecord<'a> {
    pub session: &'a str,
    pub transport: &'a str,
    pub workspace: Option<&'a str>,
    pub tool: &'a str,
    pub args_hash: String,
    pub latency: Duration,
    /// `ok`, or the tool error code.
    pub result: &'a str,
}

/// The workspace a call names, else the pin.
pub fn workspace_of<'a>(arguments: &'a Value, binding: &'a Binding) -> Option<&'a str> {
    match arguments.get("workspace").and_then(Value::as_str) {
        Some(slug) => Some(slug),
        None => match binding {
            Binding::Pinned { workspace } => Some(workspace),
            Binding::Open => None,
        },
    }
}

/// A short stable hash of the arguments (FNV-1a 64 over canonical JSON), enough to
/// spot repeated calls without keeping what was asked.
pub fn args_hash(arguments: &Value) -> String {
    let canonical = serde_json::to_vec(arguments).unwrap_or_default();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in canonical {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{hash:016x}")
}

/// Today's file, kept open between calls (opening and closing it cost more than the
/// write). Reopened when the date changes or the file was deleted or renamed.
static OPEN: Mutex<Option<(PathBuf, File)>> = Mutex::new(None);

/// Append one line to today's file. Failures are logged, never returned: a full
/// disk must not fail the tool call.
pub fn append(logs_dir: &Path, record: &CallRecord<'_>) {
    let now = now_ms();
    let ts = iso_time(now);
    let date = ts.get(..10).unwrap_or("unknown");
    let line = json!({
        "ts": ts,
        "session": record.session,
        "transport": record.transport,
        "workspace": record.workspace,
        "tool": record.tool,
        "args_hash": record.args_hash,
        "latency_ms": (record.latency.as_secs_f64() * 1000.0 * 1000.0).round() / 1000.0,
        "result": record.result,
    });
    let mut bytes = line.to_string().into_bytes();
    bytes.push(b'\n');
    let path = logs_dir.join(format!("{PREFIX}{date}{SUFFIX}"));
    let mut open = OPEN.lock().unwrap_or_else(|p| p.into_inner());
    let current = match open.take() {
        Some((open_path, file)) if open_path == path && still_named(&file, &path) => Ok(file),
        _ => OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&path),
    };
    // One write of a whole line with O_APPEND: lines from parallel calls never mix.
    let written = current.and_then(|mut file| {
        file.write_all(&bytes)?;
        *open = Some((path.clone(), file));
        Ok(())
    });
    if let Err(error) = written {
        tracing::warn!(path = %path.display(), %error, "cannot write the tool-call log");
    }
}

/// Whether `file` is still the file at `path` (not deleted, renamed or replaced).
fn still_named(file: &File, path: &Path) -> bool {
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(open), Ok(named)) => open.dev() == named.dev() && open.ino() == named.ino(),
        _ => false,
    }
}

/// Delete `mcp-<date>.jsonl` files older than `retention_days`.
pub fn prune(logs_dir: &Path, retention_days: u32) -> usize {
    let cutoff_ms = now_ms() - i64::from(retention_days) * 86_400_000;
    let cutoff = iso_time(cutoff_ms);
    let Some(cutoff_date) = cutoff.get(..10) else {
        return 0;
    };
    let Ok(entries) = std::fs::read_dir(logs_dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(date) = name
            .to_str()
            .and_then(|n| n.strip_prefix(PREFIX))
            .and_then(|n| n.strip_suffix(SUFFIX))
        else {
            continue;
        };
        // ISO dates compare as strings.
        if date.len() == 10 && date < cutoff_date && std::fs::remove_file(entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_appended_and_old_files_pruned() {
        let dir = tempfile::tempdir().expect("tempdir");
        let arguments = json!({"query": "secret words", "workspace": "acme"});
        let binding = Binding::Open;
        let record = CallRecord {
            session: "s1",
            transport: "http",
            workspace: workspace_of(&arguments, &binding),
            tool: "search",
            args_hash: args_hash(&arguments),
            latency: Duration::from_micros(1500),
            result: "ok",
        };
        append(dir.path(), &record);
        append(dir.path(), &record);
        let today = &iso_time(now_ms())[..10];
        let text = std::fs::read_to_string(dir.path().join(format!("mcp-{today}.jsonl")))
            .expect("log file");
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("json line"))
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["workspace"], "acme");
        assert_eq!(lines[0]["latency_ms"], 1.5);
        assert_eq!(lines[0]["args_hash"], lines[1]["args_hash"]);
        assert!(!text.contains("secret words"));

        std::fs::write(dir.path().join("mcp-2001-01-01.jsonl"), "{}\n").expect("old");
        std::fs::write(dir.path().join("daemon.log.2001-01-01"), "").expect("other");
        assert_eq!(prune(dir.path(), 7), 1);
        assert!(dir.path().join("daemon.log.2001-01-01").exists());
        assert!(dir.path().join(format!("mcp-{today}.jsonl")).exists());

        let pinned = Binding::Pinned {
            workspace: "b".into(),
        };
        assert_eq!(workspace_of(&json!({}), &pinned), Some("b"));
        assert_eq!(workspace_of(&json!({}), &Binding::Open), None);
    }
}
