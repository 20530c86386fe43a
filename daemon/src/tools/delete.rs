//! The `delete` tool: soft delete of a wiki page into `.trash/`.

use alexandria_proto::{Binding, ErrorCode};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

use super::{Caller, wiki_target};
use super::{ToolOutput, resolve_workspace};
use crate::commit::{
    Manifest, RunDirCleanup, RunState, new_run_id, read_settled, run_dir, save_manifest, submit,
};
use crate::db::now_ms;
use crate::error::{ToolError, ToolResult};
use crate::workspace::{STRUCTURAL_PAGES, Store, revision};

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeleteParams {
    /// Workspace slug. Required in open sessions; defaults to the pinned workspace.
    pub workspace: Option<String>,
    /// The page to soft-delete, under wiki/.
    pub path: String,
}

/// The `delete` tool: soft delete into `.trash/`.
pub fn delete(
    store: &Store,
    binding: &Binding,
    caller: &Caller,
    params: DeleteParams,
) -> ToolResult<ToolOutput> {
    let workspace = resolve_workspace(store, binding, params.workspace.as_deref())?;
    let (path, absolute) = wiki_target(store, &workspace, &params.path, true)?;
    if STRUCTURAL_PAGES.contains(&path.as_str()) {
        return Err(ToolError::new(
            ErrorCode::ProtectedPath,
            format!("{path} is a structural page of the wiki"),
            "edit it with write(command=\"str_replace\") instead of deleting it",
        ));
    }
    let run_id = new_run_id();
    let dir = run_dir(store, &workspace, &run_id);
    let stamp = crate::tools::iso_time(now_ms()).replace(':', "-");
    let trash_path = format!(".trash/{stamp}_{}/{path}", &run_id[run_id.len() - 8..]);
    let mut manifest = Manifest {
        run_id: run_id.clone(),
        workspace: workspace.clone(),
        tool: "delete".into(),
        op: "delete".into(),
        path: path.clone(),
        state: RunState::Staged,
        client: caller.client.clone(),
        session: caller.session.clone(),
        started_at: now_ms(),
        old_rev: None,
        new_rev: None,
        trash_path: Some(trash_path.clone()),
        summary: format!("delete {path} (kept in {trash_path})"),
        old_str: None,
        pinned_base: false,
        text: None,
        payload: None,
    };
    let cleanup = RunDirCleanup(dir.clone());
    let git_dir = store.workspace_dir(&workspace).join(".git");
    // The manifest is written once prepared: recovery drops a run before that anyway.
    let prepared_path = path.clone();
    let prepare = move |_: &Store| -> ToolResult<(Manifest, ())> {
        let Some(current) = read_settled(&absolute, &git_dir)? else {
            return Err(ToolError::not_found(&prepared_path));
        };
        manifest.old_rev = Some(revision(&current));
        manifest.state = RunState::Prepared;
        save_manifest(&dir, &manifest)?;
        Ok((manifest, ()))
    };
    let commit = submit(store, &workspace, &run_id, cleanup, prepare)?
        .0
        .commit;
    Ok(ToolOutput {
        text: format!("deleted {path}; a copy is kept in {trash_path} (run {run_id})"),
        structured: json!({
            "workspace": workspace,
            "path": path,
            "trash_path": trash_path,
            "run_id": run_id,
            "commit": commit,
        }),
        images: Vec::new(),
    })
}
