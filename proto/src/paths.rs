//! Rules for workspace slugs and workspace-relative paths (SPEC §2, §4 "Confinement").
//!
//! These checks are purely lexical; the daemon additionally resolves symlinks and
//! checks the real path stays inside the workspace layer.

use std::fmt;

/// Why a slug or path was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathRuleError {
    pub message: String,
}

impl fmt::Display for PathRuleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for PathRuleError {}

fn refuse(message: impl Into<String>) -> PathRuleError {
    PathRuleError {
        message: message.into(),
    }
}

/// Slugs: `[a-z0-9][a-z0-9-]{0,62}`.
pub fn validate_slug(slug: &str) -> Result<(), PathRuleError> {
    let bytes = slug.as_bytes();
    let valid = !bytes.is_empty()
        && bytes.len() <= 63
        && (bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit())
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-');
    if valid {
        Ok(())
    } else {
        Err(refuse(format!(
            "'{slug}' is not a valid workspace slug: use 1-63 characters of a-z, 0-9 and '-', starting with a letter or digit"
        )))
    }
}

/// The two layers a tool may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layer {
    Raw,
    Wiki,
}

impl Layer {
    pub fn as_str(self) -> &'static str {
        match self {
            Layer::Raw => "raw",
            Layer::Wiki => "wiki",
        }
    }
}

/// A checked workspace-relative path: `raw/…` or `wiki/…`, `/`-separated, no empty,
/// `.` or `..` components. Globs are allowed in the components when `allow_glob`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WorkspacePath {
    pub layer: Layer,
    /// The full relative path, e.g. `wiki/topics/rust.md`.
    pub path: String,
}

impl WorkspacePath {
    /// Components after the layer directory.
    pub fn rest(&self) -> &str {
        self.path
            .split_once('/')
            .map(|(_, rest)| rest)
            .unwrap_or("")
    }
}

/// Check a path given by a tool caller. `allow_glob` admits `* ? [ ] { }` and a bare
/// layer (`wiki`) for listings.
pub fn validate_workspace_path(
    raw: &str,
    allow_glob: bool,
) -> Result<WorkspacePath, PathRuleError> {
    if raw.is_empty() {
        return Err(refuse("path is empty"));
    }
    if raw.contains('\0') {
        return Err(refuse("path contains a NUL byte"));
    }
    if raw.contains('\\') {
        return Err(refuse(
            "path contains a backslash; use '/' as the separator",
        ));
    }
    if raw.contains('%') {
        return Err(refuse(
            "path contains '%': percent-encoded paths are not accepted",
        ));
    }
    if raw.chars().any(|c| c.is_control()) {
        return Err(refuse("path contains a control character"));
    }
    if raw.starts_with('/') || raw.starts_with('~') {
        return Err(refuse(
            "path is absolute; paths are relative to the workspace, e.g. wiki/index.md",
        ));
    }
    if raw.len() > 1024 {
        return Err(refuse("path is longer than 1024 bytes"));
    }
    let trimmed = raw.strip_suffix('/').unwrap_or(raw);
    let mut components = trimmed.split('/');
    let first = components.next().unwrap_or("");
    let layer = match first {
        "raw" => Layer::Raw,
        "wiki" => Layer::Wiki,
        _ => {
            return Err(refuse(format!(
                "'{raw}' is outside the wiki: paths start with raw/ or wiki/"
            )));
        }
    };
    let mut rest_count = 0;
    for component in components {
        rest_count += 1;
        match component {
            "" => return Err(refuse("path has an empty component ('//')")),
            "." | ".." => return Err(refuse("path contains '.' or '..' components")),
            c if c.starts_with('.') && !allow_glob => {
                return Err(refuse(format!("'{c}': hidden files are not reachable")));
            }
            c if !allow_glob && c.contains(['*', '?', '[', ']', '{', '}']) => {
                return Err(refuse(
                    "path contains glob characters; pass a single file here",
                ));
            }
            _ => {}
        }
    }
    if rest_count == 0 && !allow_glob {
        return Err(refuse(format!(
            "'{raw}' is a directory; name a file under it"
        )));
    }
    Ok(WorkspacePath {
        layer,
        path: trimmed.to_string(),
    })
}

/// True when the string contains glob metacharacters.
pub fn is_glob(path: &str) -> bool {
    path.contains(['*', '?', '[', '{'])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs() {
        for ok in ["global", "a", "customer-acme", "0x", &"a".repeat(63)] {
            assert!(validate_slug(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "-a",
            "A",
            "a_b",
            "a/b",
            "..",
            "a.b",
            &"a".repeat(64),
            "é",
        ] {
            assert!(validate_slug(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn escapes_are_refused() {
        let cases = [
            "../../secrets",
            "wiki/../../secrets",
            "wiki/../raw/x",
            "/etc/passwd",
            "~/x",
            "wiki\\..\\x",
            "wiki/%2e%2e/x",
            "wiki/a\0b",
            "secrets/token",
            "state.db",
            "config.toml",
            ".git/config",
            "runs/1/staged/x",
            ".trash/x",
            "templates/x",
            "wiki//x",
            "wiki/./x",
            "wiki/.hidden",
            "",
            "wiki",
        ];
        for case in cases {
            assert!(
                validate_workspace_path(case, false).is_err(),
                "{case:?} accepted"
            );
        }
    }

    #[test]
    fn good_paths() {
        let p = validate_workspace_path("wiki/topics/rust.md", false).expect("ok");
        assert_eq!(p.layer, Layer::Wiki);
        assert_eq!(p.rest(), "topics/rust.md");
        let p = validate_workspace_path("raw/*.pdf", true).expect("glob");
        assert_eq!(p.layer, Layer::Raw);
        assert!(validate_workspace_path("raw/*.pdf", false).is_err());
        assert!(validate_workspace_path("wiki", true).is_ok());
        assert!(validate_workspace_path("wiki/**", true).is_ok());
        assert!(validate_workspace_path("wiki/../x/**", true).is_err());
    }
}
