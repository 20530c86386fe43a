//! The `sources` tool: the workspace's source adapters and their sync state
//! (read-only; credentials never appear, only `auth: set|none`).

use std::fmt::Write as _;

use alexandria_proto::Binding;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ToolOutput, resolve_workspace};
use crate::error::ToolResult;
use crate::sources;
use crate::workspace::Store;

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SourcesParams {
    /// Workspace slug (optional in a pinned session).
    pub workspace: Option<String>,
}

pub fn sources(store: &Store, binding: &Binding, params: SourcesParams) -> ToolResult<ToolOutput> {
    let slug = resolve_workspace(store, binding, params.workspace.as_deref())?;
    let connection = store.pool.get()?;
    let mut list = Vec::new();
    let mut text = String::new();
    for source in sources::all(&connection, Some(&slug))? {
        let value = sources::describe(&connection, store, &source)?;
        let _ = writeln!(
            text,
            "- {} {}",
            source.name,
            sources::summary_line(&source, &value)
        );
        list.push(value);
    }
    let text = if list.is_empty() {
        format!(
            "Workspace '{slug}' has no sources. The user adds one with `alexandria source add {slug} folder|feed|url|git <target>` (sources cannot be configured through MCP)."
        )
    } else {
        format!(
            "Sources of workspace '{slug}' (configured by the user with `alexandria source …`; captured items land in raw/sources/<name>/):\n{text}Pending items: call subscriptions."
        )
    };
    Ok(ToolOutput {
        text,
        structured: json!({"workspace": slug, "sources": Value::Array(list)}),
        images: Vec::new(),
    })
}
