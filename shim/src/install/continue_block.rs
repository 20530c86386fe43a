//! Continue's MCP block file `~/.continue/mcpServers/alexandria.yaml`: a whole file that
//! alexandria owns, recognised by its first line.
//!
//! A standalone block keeps us out of the user's `config.yaml` entirely. We write the YAML
//! ourselves (strings as JSON-style double-quoted scalars, which YAML accepts verbatim), so
//! no YAML library is needed in the shim; a file with that name that we did not write is
//! refused rather than overwritten.

use super::entry::Entry;
use super::{Change, Edit, EditError};

/// First line of every block file we write; the mark that the file is ours.
pub const MARKER: &str = "# Written by `alexandria mcp install continue`";

/// The block file's whole text.
pub fn render(entry: &Entry) -> String {
    let quote = |s: &str| serde_json::Value::String(s.to_string()).to_string();
    let args: Vec<String> = entry.args().iter().map(|a| quote(a)).collect();
    format!(
        "{MARKER}; `alexandria mcp uninstall continue` removes it.\n\
         name: alexandria\n\
         version: 0.0.1\n\
         schema: v1\n\
         mcpServers:\n  \
           - name: alexandria\n    \
             type: stdio\n    \
             command: {command}\n    \
             args: [{args}]\n{env}",
        command = quote(entry.command()),
        args = args.join(", "),
        env = match entry.home() {
            Some(home) => format!(
                "    env:\n      {}: {}\n",
                super::entry::HOME_VAR,
                quote(home)
            ),
            None => String::new(),
        },
    )
}

/// Our block read back as an entry (`command`, `args`, `env`); `None` when there is no file.
/// Only files we wrote are read: their strings are JSON-quoted, one field a line.
pub fn current_entry(text: Option<&str>) -> Result<Option<serde_json::Value>, EditError> {
    let Some(text) = text else {
        return Ok(None);
    };
    check_ours(text)?;
    let invalid = |message: String| EditError::Invalid {
        format: "alexandria's YAML block",
        message,
    };
    let mut entry = serde_json::Map::new();
    let mut env = serde_json::Map::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        let Some((key, value)) = trimmed.split_once(": ") else {
            continue;
        };
        let parsed = || {
            serde_json::from_str::<serde_json::Value>(value)
                .map_err(|e| invalid(format!("{key}: {e}")))
        };
        match key {
            "command" | "args" if line.starts_with("    ") => {
                entry.insert(key.to_string(), parsed()?);
            }
            _ if line.starts_with("      ") => {
                env.insert(key.to_string(), parsed()?);
            }
            _ => {}
        }
    }
    if !env.is_empty() {
        entry.insert("env".to_string(), serde_json::Value::Object(env));
    }
    Ok(Some(serde_json::Value::Object(entry)))
}

pub fn upsert(text: Option<&str>, entry: &Entry) -> Result<Edit, EditError> {
    let wanted = render(entry);
    match text {
        None => Ok(Edit::Changed {
            change: Change::Added,
            text: wanted,
        }),
        Some(current) if current == wanted => Ok(Edit::Unchanged),
        Some(current) => {
            check_ours(current)?;
            Ok(Edit::Changed {
                change: Change::Updated,
                text: wanted,
            })
        }
    }
}

/// Removing the block means deleting the file: `Changed` carries an empty text.
pub fn remove(text: Option<&str>) -> Result<Edit, EditError> {
    match text {
        None => Ok(Edit::Unchanged),
        Some(current) => {
            check_ours(current)?;
            Ok(Edit::Changed {
                change: Change::Removed,
                text: String::new(),
            })
        }
    }
}

fn check_ours(text: &str) -> Result<(), EditError> {
    if text.starts_with(MARKER) {
        Ok(())
    } else {
        Err(EditError::NotOurs(
            "it was not written by alexandria (its first line is not our marker)".to_string(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_quoted_strings() {
        let entry = Entry::stdio(
            true,
            "/opt/my apps/alexandria",
            &[
                "mcp".into(),
                "serve".into(),
                "--workspace".into(),
                "notes".into(),
            ],
            Some("/w/my home"),
        );
        let text = render(&entry);
        assert!(text.starts_with(MARKER));
        assert!(
            text.contains("    command: \"/opt/my apps/alexandria\"\n"),
            "{text}"
        );
        assert!(
            text.contains("    args: [\"mcp\", \"serve\", \"--workspace\", \"notes\"]\n"),
            "{text}"
        );
        assert!(
            text.ends_with("    env:\n      ALEXANDRIA_HOME: \"/w/my home\"\n"),
            "{text}"
        );
    }

    #[test]
    fn reads_back_what_it_renders() {
        let entry = Entry::stdio(
            true,
            "/opt/a b/alexandria",
            &["mcp".into(), "serve".into()],
            Some("/w/h"),
        );
        assert_eq!(
            current_entry(Some(&render(&entry))),
            Ok(Some(serde_json::json!({
                "command": "/opt/a b/alexandria",
                "args": ["mcp", "serve"],
                "env": {"ALEXANDRIA_HOME": "/w/h"},
            })))
        );
        assert!(current_entry(Some("name: mine\n")).is_err());
    }

    #[test]
    fn edits() {
        let entry = Entry::stdio(
            true,
            "/bin/alexandria",
            &["mcp".into(), "serve".into()],
            None,
        );
        let ours = render(&entry);
        let stale = render(&Entry::stdio(true, "/old", &[], None));
        // (file, install outcome, uninstall outcome); Err(()) is a refusal
        type Outcome = Result<Option<Change>, ()>;
        let cases: Vec<(Option<&str>, Outcome, Outcome)> = vec![
            (None, Ok(Some(Change::Added)), Ok(None)),
            (Some(&ours), Ok(None), Ok(Some(Change::Removed))),
            (
                Some(&stale),
                Ok(Some(Change::Updated)),
                Ok(Some(Change::Removed)),
            ),
            (Some("name: mine\n"), Err(()), Err(())),
        ];
        let summary = |edit: Result<Edit, EditError>| match edit {
            Ok(Edit::Unchanged) => Ok(None),
            Ok(Edit::Changed { change, .. }) => Ok(Some(change)),
            Err(_) => Err(()),
        };
        for (input, install, uninstall) in cases {
            assert_eq!(summary(upsert(input, &entry)), install, "{input:?}");
            assert_eq!(summary(remove(input)), uninstall, "{input:?}");
        }
    }
}
