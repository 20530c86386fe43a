//! The tools' logic, independent of MCP (SPEC §4): one file per tool, each a blocking
//! function from parameters to a `ToolOutput` or a `ToolError`. `mcp` registers them;
//! the web view and the CLI can call the same functions.
//!
//! May import: `sources` (adapters, read-only here), `commit` (the write path), `index`, `workspace`, `db`, `error`. Never
//! `mcp`, `transport` or anything that knows a wire format.

pub mod delete;
pub mod guide;
pub mod history;
pub mod params;
pub mod read;
pub mod resources;
pub mod search;
pub mod sources;
pub mod subscriptions;
pub mod workspaces;
pub mod write;

pub use delete::{DeleteParams, delete};
pub use guide::{GuideParams, guide};
pub use history::{HistoryParams, history};
pub use params::iso_time;
pub use read::{ReadParams, read};
pub use search::{SearchParams, search};
pub use sources::{SourcesParams, sources};
pub use subscriptions::{SubscriptionsParams, subscriptions};
pub use write::{WriteParams, write};

use std::path::{Path, PathBuf};

use alexandria_proto::paths::{self, Layer};
use alexandria_proto::{Binding, ErrorCode};
use serde_json::Value;

use crate::error::{ToolError, ToolResult};
use crate::index::{self};
use crate::workspace::Store;

/// Who asks for a write: for commit messages, `runs` and history.
#[derive(Debug, Clone, Default)]
pub struct Caller {
    pub client: Option<String>,
    pub session: Option<String>,
}

/// What a tool returns: readable text, the same as JSON, and optional images.
#[derive(Debug)]
pub struct ToolOutput {
    pub text: String,
    pub structured: Value,
    /// (base64 data, MIME type)
    pub images: Vec<(String, String)>,
}

/// The workspace a call is bound to, after applying the session's binding.
pub fn resolve_workspace(
    store: &Store,
    binding: &Binding,
    given: Option<&str>,
) -> ToolResult<String> {
    let slug = bound_workspace(store, binding, given)?;
    index::ensure_caught_up(store, &slug)?;
    Ok(slug)
}

/// The workspace a call names, checked against the session's binding, without waiting
/// for its index to catch up (`guide` reports the progress instead).
pub fn bound_workspace(
    store: &Store,
    binding: &Binding,
    given: Option<&str>,
) -> ToolResult<String> {
    let given = given.map(str::trim).filter(|s| !s.is_empty());
    let slug = match (binding, given) {
        (Binding::Open, None) => {
            return Err(ToolError::new(
                ErrorCode::WorkspaceRequired,
                "this session serves every workspace, so each call must name one",
                "call guide() to list the workspaces, then pass workspace=\"<slug>\" (for example workspace=\"global\")",
            ));
        }
        (Binding::Open, Some(slug)) => slug.to_string(),
        (Binding::Pinned { workspace }, None) => workspace.clone(),
        (Binding::Pinned { workspace }, Some(slug)) if slug == workspace => slug.to_string(),
        (Binding::Pinned { workspace }, Some(slug)) => {
            return Err(ToolError::new(
                ErrorCode::WorkspaceNotAccessible,
                format!("this session is pinned to workspace '{workspace}'; '{slug}' is not reachable from it"),
                format!("omit workspace or pass workspace=\"{workspace}\""),
            )
            .with_detail("pinned", workspace.as_str()));
        }
    };
    store.require_workspace(&slug)?;
    Ok(slug)
}

/// A wiki page named by a write or delete: checked, under `wiki/`, as (path, absolute).
pub(crate) fn wiki_target(
    store: &Store,
    workspace: &str,
    raw_path: &str,
    for_delete: bool,
) -> ToolResult<(String, PathBuf)> {
    let checked = paths::validate_workspace_path(raw_path, false)
        .map_err(|e| ToolError::invalid_path(e.message).with_detail("path", raw_path))?;
    if checked.layer == Layer::Raw {
        return Err(if for_delete {
            ToolError::new(
                ErrorCode::ProtectedPath,
                format!("{raw_path} is a source in raw/, which is immutable"),
                "sources cannot be deleted through MCP; the user manages raw/",
            )
        } else {
            ToolError::new(
                ErrorCode::RawReadonly,
                format!("{raw_path} is in raw/, which agents may read and cite but not write"),
                "write your page under wiki/ and cite the source from it",
            )
        });
    }
    let extension = Path::new(&checked.path)
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    if !for_delete && !matches!(extension.as_deref(), Some("md" | "markdown")) {
        return Err(ToolError::invalid_argument(
            format!("{raw_path}: wiki pages are markdown files ending in .md"),
            "name the page like wiki/topics/sea-stars.md",
        ));
    }
    let absolute = store.resolve(workspace, &checked)?;
    Ok((checked.path, absolute))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binding_rules() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(alexandria_proto::Home::new(dir.path())).expect("store");
        store.create_workspace("acme").expect("acme");
        let open = Binding::Open;
        let pinned = Binding::Pinned {
            workspace: "acme".into(),
        };
        assert_eq!(
            resolve_workspace(&store, &open, None)
                .expect_err("req")
                .code,
            ErrorCode::WorkspaceRequired
        );
        assert_eq!(
            resolve_workspace(&store, &open, Some("acme")).expect("ok"),
            "acme"
        );
        assert_eq!(
            resolve_workspace(&store, &open, Some("nope"))
                .expect_err("nf")
                .code,
            ErrorCode::WorkspaceNotFound
        );
        assert_eq!(
            resolve_workspace(&store, &pinned, None).expect("pin"),
            "acme"
        );
        assert_eq!(
            resolve_workspace(&store, &pinned, Some("global"))
                .expect_err("pin")
                .code,
            ErrorCode::WorkspaceNotAccessible
        );
    }
}
