//! Claude Code's user scope through its own CLI (`claude mcp add-json --scope user`), which
//! takes Claude Code's own care with `~/.claude.json`, a file its running sessions rewrite.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// `claude` on PATH, if there is one.
pub fn find() -> Option<PathBuf> {
    find_on_path("claude")
}

/// An executable named `name` in one of `$PATH`'s directories.
pub fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

#[cfg(unix)]
fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(not(unix))]
fn is_executable(path: &Path) -> bool {
    path.is_file()
}

/// The command lines we run, for `--dry-run` and for messages.
pub fn remove_args(name: &str) -> Vec<String> {
    ["mcp", "remove", "--scope", "user", name]
        .map(str::to_string)
        .to_vec()
}

pub fn add_args(name: &str, json: &str) -> Vec<String> {
    ["mcp", "add-json", "--scope", "user", name, json]
        .map(str::to_string)
        .to_vec()
}

/// Run `claude <args>`; on failure the error carries its output.
pub fn run(claude: &Path, args: &[String]) -> Result<()> {
    let output = Command::new(claude)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .with_context(|| format!("cannot run {}", claude.display()))?;
    if !output.status.success() {
        let said = String::from_utf8_lossy(&output.stderr);
        let said = if said.trim().is_empty() {
            String::from_utf8_lossy(&output.stdout)
        } else {
            said
        };
        bail!(
            "`claude {}` failed ({}): {}",
            shell_words(args),
            output.status,
            said.trim()
        );
    }
    Ok(())
}

/// Arguments quoted for a POSIX shell, for showing a command the user can copy.
pub fn shell_words(args: &[String]) -> String {
    args.iter()
        .map(|arg| {
            let plain = !arg.is_empty()
                && arg
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:@+,".contains(c));
            if plain {
                arg.clone()
            } else {
                format!("'{}'", arg.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_for_the_shell() {
        let cases: Vec<(Vec<&str>, &str)> = vec![
            (vec!["mcp", "get", "alexandria"], "mcp get alexandria"),
            (vec![r#"{"a":"b c"}"#], r#"'{"a":"b c"}'"#),
            (vec!["it's"], r"'it'\''s'"),
            (vec![""], "''"),
        ];
        for (args, expected) in cases {
            let args: Vec<String> = args.into_iter().map(str::to_string).collect();
            assert_eq!(shell_words(&args), expected);
        }
    }
}
