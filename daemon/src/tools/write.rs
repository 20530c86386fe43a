//! The `write` tool: `create`, `str_replace`, `append` on `wiki/` pages, citations
//! checked; the commit path itself is `commit`.

use std::fs;

use alexandria_proto::paths::{self, Layer};
use alexandria_proto::{Binding, ErrorCode};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{Caller, wiki_target};
use super::{ToolOutput, resolve_workspace};
pub use crate::commit::MAX_PAGE_BYTES;
use crate::commit::{
    Manifest, RunDirCleanup, RunState, apply_command, io_error, new_run_id, read_current,
    read_settled, run_dir, save_manifest, submit,
};
use crate::db::now_ms;
use crate::error::{ToolError, ToolResult};
use crate::faults::crash_point;
use crate::index::extract::Kind;
use crate::index::markdown;
use crate::index::{self};
use crate::workspace::{Store, names, revision};

#[derive(Debug, Clone, Copy, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum WriteCommand {
    /// Create a new page with `content` (fails if it exists).
    Create,
    /// Replace the one occurrence of `old_str` with `new_str`.
    StrReplace,
    /// Append `content` to the end of an existing page.
    Append,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteParams {
    /// Workspace slug. Required in open sessions; defaults to the pinned workspace.
    pub workspace: Option<String>,
    /// `create`, `str_replace` or `append`.
    pub command: WriteCommand,
    /// The page, under wiki/ (e.g. `wiki/topics/sea-stars.md`).
    pub path: String,
    /// Page text for `create`, text to add for `append`.
    pub content: Option<String>,
    /// For `str_replace`: the exact text to replace; must occur exactly once.
    pub old_str: Option<String>,
    /// For `str_replace`: the replacement text.
    pub new_str: Option<String>,
    /// The `rev` you read; if the page changed since, the write is refused with
    /// `stale_plan` so you can re-read and re-plan.
    pub base_rev: Option<String>,
}

/// Every citation in `text` that names a missing raw file or a page past the end.
pub fn check_citations(store: &Store, workspace: &str, text: &str) -> ToolResult<()> {
    let mut problems = Vec::new();
    for citation in markdown::citations(text) {
        let target = &citation.written;
        let checked = match paths::validate_workspace_path(&citation.target, false) {
            Ok(p) if p.layer == Layer::Raw => p,
            _ => {
                problems.push(json!({"citation": target, "problem": "not a valid raw/ path"}));
                continue;
            }
        };
        let absolute = match store.resolve(workspace, &checked) {
            Ok(path) if path.is_file() => path,
            _ => {
                problems.push(json!({"citation": target, "problem": "no such file in raw/"}));
                continue;
            }
        };
        if let Some((from, to)) = citation.pages {
            if Kind::of(&absolute) != Kind::Pdf {
                problems.push(json!({"citation": target, "problem": format!("p.{from}: page numbers apply to PDFs only")}));
                continue;
            }
            let record = index::ensure_fresh(store, workspace, &checked.path, &absolute, None)?;
            let count = record.pages.unwrap_or(0);
            if from == 0 || i64::from(to) > count {
                problems.push(json!({
                    "citation": target,
                    "problem": format!("p.{from}-{to} is beyond the document's {count} pages"),
                    "page_count": count,
                }));
            }
        }
    }
    if problems.is_empty() {
        return Ok(());
    }
    let listing: Vec<String> = problems
        .iter()
        .map(|p| {
            format!(
                "{} ({})",
                p["citation"].as_str().unwrap_or(""),
                p["problem"].as_str().unwrap_or("")
            )
        })
        .collect();
    Err(ToolError::new(
        ErrorCode::CitationInvalid,
        format!("{} citation(s) are invalid: {}", problems.len(), listing.join("; ")),
        "cite files that exist in raw/ (search with layer=\"raw\" or mode=\"list\") and PDF pages within their page count; nothing was written",
    )
    .with_detail("citations", problems))
}

/// Refuse control characters other than tab, line feed and carriage return: a NUL
/// makes git treat the page as binary, and the others are invisible in an editor and
/// garble a terminal.
fn check_text(name: &str, text: &str) -> ToolResult<()> {
    for (line, content) in text.split('\n').enumerate() {
        let found = content
            .chars()
            .enumerate()
            .find(|(_, c)| c.is_control() && !matches!(c, '\t' | '\r'));
        if let Some((column, c)) = found {
            let code = format!("U+{:04X}", u32::from(c));
            return Err(ToolError::invalid_argument(
                format!(
                    "{name} contains a control character ({code}) at line {}, column {}",
                    line + 1,
                    column + 1
                ),
                "page text is markdown: tabs and line breaks are fine, other control characters are not; remove it (binary files belong in raw/, which the user manages)",
            )
            .with_detail("character", code)
            .with_detail("line", line + 1)
            .with_detail("column", column + 1));
        }
    }
    Ok(())
}

/// Refuse a new page whose path a case- or normalization-insensitive file system
/// (macOS, Windows) would merge with an existing one: a clone there would lose one.
fn refuse_name_collision(store: &Store, workspace: &str, path: &str) -> ToolResult<()> {
    let root = store.workspace_dir(workspace);
    let existing = names::conflicting_path(&root, path)
        .map_err(|e| io_error("checking the names beside the page", e))?;
    let Some(existing) = existing else {
        return Ok(());
    };
    Err(ToolError::invalid_path(format!(
        "{path} differs from the existing {existing} only by letter case or Unicode normalization; on macOS and Windows they would be one file"
    ))
    .with_hint(if existing.matches('/').count() < path.matches('/').count() {
        format!(
            "put the page under {existing}/ (the folder that exists), or choose a name that differs in more than case or accents"
        )
    } else {
        format!(
            "change {existing} instead (read it, then str_replace or append), or choose a name that differs in more than case or accents"
        )
    })
    .with_detail("path", path)
    .with_detail("existing", existing))
}

fn require_arg<'a>(value: &'a Option<String>, name: &str, command: &str) -> ToolResult<&'a str> {
    value.as_deref().ok_or_else(|| {
        ToolError::invalid_argument(
            format!("{command} needs {name}"),
            format!("pass {name}=\"…\""),
        )
    })
}

/// The `write` tool.
pub fn write(
    store: &Store,
    binding: &Binding,
    caller: &Caller,
    params: WriteParams,
) -> ToolResult<ToolOutput> {
    let workspace = resolve_workspace(store, binding, params.workspace.as_deref())?;
    let (path, absolute) = wiki_target(store, &workspace, &params.path, false)?;
    let command = params.command;
    let command_name = match command {
        WriteCommand::Create => "create",
        WriteCommand::StrReplace => "str_replace",
        WriteCommand::Append => "append",
    };
    // Stage: the payload, validated, before any lock.
    let payload = match command {
        WriteCommand::Create | WriteCommand::Append => {
            require_arg(&params.content, "content", command_name)?.to_string()
        }
        WriteCommand::StrReplace => {
            let old = require_arg(&params.old_str, "old_str", command_name)?;
            if old.is_empty() {
                return Err(ToolError::invalid_argument(
                    "old_str is empty",
                    "pass the exact text to replace",
                ));
            }
            require_arg(&params.new_str, "new_str", command_name)?.to_string()
        }
    };
    let payload_name = match command {
        WriteCommand::StrReplace => "new_str",
        _ => "content",
    };
    check_text(payload_name, &payload)?;
    if payload.len() > MAX_PAGE_BYTES {
        return Err(ToolError::new(
            ErrorCode::TooLarge,
            format!(
                "the text is {} bytes; a page may have at most {MAX_PAGE_BYTES}",
                payload.len()
            ),
            "split it into several pages",
        ));
    }
    check_citations(store, &workspace, &payload)?;
    let run_id = new_run_id();
    let dir = run_dir(store, &workspace, &run_id);
    let mut manifest = Manifest {
        run_id: run_id.clone(),
        workspace: workspace.clone(),
        tool: "write".into(),
        op: command_name.into(),
        path: path.clone(),
        state: RunState::Staged,
        client: caller.client.clone(),
        session: caller.session.clone(),
        started_at: now_ms(),
        old_rev: None,
        new_rev: None,
        trash_path: None,
        summary: String::new(),
        old_str: params.old_str.clone(),
        pinned_base: false,
        text: None,
        payload: None,
    };
    let cleanup = RunDirCleanup(dir.clone());
    // Nothing on disk yet: recovery drops a run that never reached `prepared`, and
    // each file made and removed per write costs (a new inode on ext4 without a
    // journal scans past the ones freed in the last minute).
    crash_point("after_stage");

    // Lock, check, commit: with the workspace lock held, in a group with whatever
    // other writes are queued (`commit::group`).
    let prepared_path = path.clone();
    let target = absolute.clone();
    let base_rev: Option<String> = params
        .base_rev
        .as_deref()
        .map(str::trim)
        .filter(|b| !b.is_empty())
        .map(str::to_owned);
    let old_str = params.old_str.clone();
    let prepare_workspace = workspace.clone();
    let git_dir = store.workspace_dir(&workspace).join(".git");
    let prepare = move |store: &Store| -> ToolResult<(Manifest, String)> {
        let path = prepared_path;
        let workspace = prepare_workspace;
        crash_point("after_lock");
        let current = if command == WriteCommand::Create {
            read_current(&target)?
        } else {
            read_settled(&target, &git_dir)?
        };
        let current_rev = current.as_deref().map(revision);
        if let Some(base) = base_rev.as_deref()
            && current_rev.as_deref() != Some(base)
            && !current_rev
                .as_deref()
                .is_some_and(|r| r.starts_with(base) && base.len() >= 7)
        {
            return Err(ToolError::new(
                ErrorCode::StalePlan,
                format!(
                    "{path} changed since rev {base}: it is now {}",
                    current_rev.as_deref().unwrap_or("deleted")
                ),
                "read the page again and re-plan the edit against its current text",
            )
            .with_detail("current_rev", current_rev.clone()));
        }
        if command == WriteCommand::Create && current.is_none() {
            refuse_name_collision(store, &workspace, &path)?;
        }
        let current_text = current.as_deref().map(String::from_utf8_lossy);
        let new_text = apply_command(
            command_name,
            &path,
            current_text.as_deref(),
            &payload,
            old_str.as_deref(),
        )
        .map_err(|e| {
            if command == WriteCommand::Create && e.code == ErrorCode::InvalidArgument {
                e.with_detail("rev", current_rev.clone())
            } else {
                e
            }
        })?;
        if new_text.len() > MAX_PAGE_BYTES {
            return Err(ToolError::new(
                ErrorCode::TooLarge,
                format!(
                    "the page would be {} bytes; a page may have at most {MAX_PAGE_BYTES}",
                    new_text.len()
                ),
                "split it into several pages",
            ));
        }
        let new_rev = revision(new_text.as_bytes());
        manifest.text = Some(new_text.clone());
        if command != WriteCommand::Create {
            manifest.payload = Some(payload);
        }
        manifest.state = RunState::Prepared;
        manifest.old_rev = current_rev;
        manifest.new_rev = Some(new_rev);
        manifest.summary = format!("{command_name} {path}");
        manifest.pinned_base = base_rev.is_some();
        save_manifest(&dir, &manifest)?;
        Ok((manifest, new_text))
    };
    let (completed, new_text) = submit(store, &workspace, &run_id, cleanup, prepare)?;
    let planned_rev = revision(new_text.as_bytes());
    let commit = completed.commit;
    // An outside save found when the page was swapped in: the write was applied on
    // top of it, so the page's text is not `new_text`.
    let new_rev = completed.rev.unwrap_or_else(|| planned_rev.clone());
    let title = if new_rev == planned_rev {
        markdown::title(&new_text)
    } else {
        fs::read_to_string(&absolute)
            .ok()
            .and_then(|t| markdown::title(&t))
    };
    Ok(ToolOutput {
        text: format!(
            "{command_name}: {path} is now at rev {new_rev} (run {run_id}, commit {})",
            &commit[..commit.len().min(12)]
        ),
        structured: json!({
            "workspace": workspace,
            "path": path,
            "command": command_name,
            "rev": new_rev,
            "run_id": run_id,
            "commit": commit,
            "title": title,
        }),
        images: Vec::new(),
    })
}
