//! Wiki pages and raw files as MCP resources, MCP-free: list them (paged, in a stable
//! order), read one by URI, and name them. `mcp` turns these into resource results and
//! handles subscriptions.
//!
//! URIs are `alexandria://<workspace>/<path>` with `<path>` under `wiki/` or `raw/`.
//! Reading goes through the same binding and confinement rules as the `read` tool: a
//! pinned session reaches only its workspace, and the path is checked by
//! `validate_workspace_path` and `Store::resolve`.

use std::path::Path;

use alexandria_proto::paths::Layer;
use alexandria_proto::{Binding, ErrorCode};

use crate::error::{ToolError, ToolResult};
use crate::index::{self, extract::Kind};
use crate::workspace::Store;

pub const SCHEME: &str = "alexandria://";

/// Resources per `resources/list` page.
pub const PAGE_SIZE: usize = 200;

/// Largest file `resources/read` returns whole.
pub const MAX_READ_BYTES: u64 = 16 * 1024 * 1024;

/// One listed resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceEntry {
    pub uri: String,
    /// The workspace-relative path (`wiki/topics/x.md`).
    pub name: String,
    pub title: String,
    pub mime: &'static str,
    pub size: u64,
}

/// What `read` found.
#[derive(Debug)]
pub enum Body {
    Text(String),
    Bytes(Vec<u8>),
}

pub fn uri(workspace: &str, path: &str) -> String {
    format!("{SCHEME}{workspace}/{path}")
}

/// `(workspace, path)` of an `alexandria://` URI.
pub fn parse_uri(uri: &str) -> ToolResult<(String, String)> {
    let invalid = || {
        ToolError::invalid_argument(
            format!("{uri:?} is not an alexandria resource URI"),
            "use alexandria://<workspace>/wiki/<page> or alexandria://<workspace>/raw/<file>, as resources/list gives them",
        )
    };
    let rest = uri.strip_prefix(SCHEME).ok_or_else(invalid)?;
    let (workspace, path) = rest.split_once('/').ok_or_else(invalid)?;
    alexandria_proto::paths::validate_slug(workspace).map_err(|_| invalid())?;
    if path.is_empty() {
        return Err(invalid());
    }
    Ok((workspace.to_string(), path.to_string()))
}

/// The MIME type clients should show for a file.
pub fn mime_of(path: &str) -> &'static str {
    let path = Path::new(path);
    match Kind::of(path) {
        Kind::Markdown => "text/markdown",
        Kind::Pdf => "application/pdf",
        Kind::Image => Kind::image_mime(path).unwrap_or("application/octet-stream"),
        Kind::Text => match path.extension().and_then(|e| e.to_str()) {
            Some("json") => "application/json",
            Some("csv") => "text/csv",
            Some("html" | "htm") => "text/html",
            _ => "text/plain",
        },
        Kind::Binary => "application/octet-stream",
    }
}

/// The workspaces a session may see.
fn visible_workspaces(store: &Store, binding: &Binding) -> Vec<String> {
    match binding {
        Binding::Pinned { workspace } => vec![workspace.clone()],
        Binding::Open => store.list_workspaces(),
    }
}

/// One page of resources starting at `offset` (in workspace, path order); the offset of
/// the next page when there is one.
pub fn list(
    store: &Store,
    binding: &Binding,
    offset: usize,
) -> ToolResult<(Vec<ResourceEntry>, Option<usize>)> {
    let workspaces = visible_workspaces(store, binding);
    for workspace in &workspaces {
        if store.workspace_exists(workspace) {
            index::ensure_caught_up(store, workspace)?;
        }
    }
    let connection = store
        .pool
        .get()
        .map_err(|e| ToolError::internal("opening state.db", e))?;
    let mut statement = connection
        .prepare_cached(
            "SELECT workspace, path, title, size FROM files
             WHERE workspace IN (SELECT value FROM json_each(?1)) AND layer IN ('wiki', 'raw')
             ORDER BY workspace, layer DESC, path LIMIT ?2 OFFSET ?3",
        )
        .map_err(|e| ToolError::internal("listing resources", e))?;
    let workspaces_json = serde_json::to_string(&workspaces)
        .map_err(|e| ToolError::internal("listing resources", e))?;
    let rows = statement
        .query_map(
            rusqlite::params![workspaces_json, (PAGE_SIZE + 1) as i64, offset as i64],
            |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, Option<String>>(2)?,
                    row.get::<_, i64>(3)?,
                ))
            },
        )
        .map_err(|e| ToolError::internal("listing resources", e))?;
    let mut entries = Vec::new();
    for row in rows {
        let (workspace, path, title, size) =
            row.map_err(|e| ToolError::internal("listing resources", e))?;
        let title = title
            .filter(|t| !t.trim().is_empty())
            .unwrap_or_else(|| fallback_title(&path));
        entries.push(ResourceEntry {
            uri: uri(&workspace, &path),
            mime: mime_of(&path),
            title: format!("{title} ({workspace})"),
            name: path,
            size: size.max(0) as u64,
        });
    }
    let next = (entries.len() > PAGE_SIZE).then(|| {
        entries.truncate(PAGE_SIZE);
        offset + PAGE_SIZE
    });
    Ok((entries, next))
}

/// `wiki/topics/tide-pools.md` → `tide-pools`.
fn fallback_title(path: &str) -> String {
    Path::new(path)
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.to_string())
}

/// `(path, absolute)` of a resource URI the session may reach: its binding allows the
/// workspace, and the path passes the same confinement as every tool path.
fn resolve(
    store: &Store,
    binding: &Binding,
    uri: &str,
) -> ToolResult<(String, std::path::PathBuf)> {
    let (workspace, path) = parse_uri(uri)?;
    if let Binding::Pinned { workspace: pinned } = binding
        && *pinned != workspace
    {
        return Err(ToolError::new(
            ErrorCode::WorkspaceNotAccessible,
            format!(
                "this session is pinned to workspace '{pinned}'; '{workspace}' is not reachable from it"
            ),
            format!("read alexandria://{pinned}/… instead"),
        ));
    }

    store.require_workspace(&workspace)?;
    let (checked, absolute) = store.checked_path(&workspace, &path)?;
    if checked.layer != Layer::Wiki && checked.layer != Layer::Raw {
        return Err(ToolError::invalid_path(format!(
            "{path} is not under wiki/ or raw/"
        )));
    }
    Ok((path, absolute))
}

/// Whether a session with `binding` may subscribe to `uri`, without touching the disk
/// (the URI parses, its workspace is reachable, its path is a valid wiki/ or raw/ path).
pub fn may_subscribe(binding: &Binding, uri: &str) -> bool {
    let Ok((workspace, path)) = parse_uri(uri) else {
        return false;
    };
    if let Binding::Pinned { workspace: pinned } = binding
        && *pinned != workspace
    {
        return false;
    }
    alexandria_proto::paths::validate_workspace_path(&path, false)
        .is_ok_and(|checked| matches!(checked.layer, Layer::Wiki | Layer::Raw))
}

/// Check that `uri` names a file this session may read (for `resources/subscribe`).
pub fn check_subscribable(store: &Store, binding: &Binding, uri: &str) -> ToolResult<()> {
    resolve(store, binding, uri).map(|_| ())
}

/// Read one resource. Same binding and confinement as the `read` tool.
pub fn read(store: &Store, binding: &Binding, uri: &str) -> ToolResult<(&'static str, Body)> {
    let (path, absolute) = resolve(store, binding, uri)?;
    let metadata = std::fs::metadata(&absolute).map_err(|_| ToolError::not_found(&path))?;
    if !metadata.is_file() {
        return Err(ToolError::not_found(&path));
    }
    if metadata.len() > MAX_READ_BYTES {
        return Err(ToolError::new(
            ErrorCode::TooLarge,
            format!(
                "{path} is {} bytes; resources are returned whole up to {MAX_READ_BYTES}",
                metadata.len()
            ),
            "use the read tool, which reads PDF pages and markdown sections one by one",
        ));
    }
    let bytes = std::fs::read(&absolute).map_err(|e| ToolError::internal("reading the file", e))?;
    let mime = mime_of(&path);
    let body = match Kind::of(Path::new(&path)) {
        Kind::Markdown | Kind::Text => match String::from_utf8(bytes) {
            Ok(text) => Body::Text(text),
            Err(e) => Body::Bytes(e.into_bytes()),
        },
        _ => Body::Bytes(bytes),
    };
    Ok((mime, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris() {
        assert_eq!(
            parse_uri("alexandria://acme/wiki/a b.md").expect("uri"),
            ("acme".to_string(), "wiki/a b.md".to_string())
        );
        for bad in [
            "file:///etc/passwd",
            "alexandria://",
            "alexandria://acme",
            "alexandria://acme/",
            "alexandria://Bad_Slug/wiki/x.md",
        ] {
            assert!(parse_uri(bad).is_err(), "{bad}");
        }
        assert_eq!(uri("w", "raw/p.pdf"), "alexandria://w/raw/p.pdf");
        assert_eq!(mime_of("wiki/x.md"), "text/markdown");
        assert_eq!(mime_of("raw/p.pdf"), "application/pdf");
        assert_eq!(mime_of("raw/i.png"), "image/png");
        assert_eq!(fallback_title("wiki/topics/tide-pools.md"), "tide-pools");
        let pinned = Binding::Pinned {
            workspace: "acme".into(),
        };
        assert!(may_subscribe(&pinned, "alexandria://acme/wiki/a.md"));
        assert!(!may_subscribe(&pinned, "alexandria://other/wiki/a.md"));
        assert!(!may_subscribe(
            &Binding::Open,
            "alexandria://acme/wiki/../x.md"
        ));
        assert!(!may_subscribe(&Binding::Open, "alexandria://acme/runs/x"));
    }
}
