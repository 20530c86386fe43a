//! Control requests from the CLI: status, init, workspaces (create, list, rename, archive,
//! restore, info), ingest, tokens, stop.

use std::sync::Arc;

use alexandria_proto::{ControlReply, ControlRequest, ErrorCode};
use serde_json::json;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

use crate::context::DaemonContext;
use crate::error::{Audience, ToolError};
use crate::index;
use crate::tools::workspaces;
use crate::transport::socket::{Frame, read_frame};
use crate::workspace::Store;

const REQUEST_MAX_BYTES: usize = 4 * 1024 * 1024;
/// How long a `Stop` waits for the socket to be closed before it answers.
const SOCKET_CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

pub async fn handle(
    mut reader: BufReader<OwnedReadHalf>,
    mut writer: OwnedWriteHalf,
    context: Arc<DaemonContext>,
) -> anyhow::Result<()> {
    let mut buffer = Vec::new();
    if !matches!(
        read_frame(&mut reader, &mut buffer, REQUEST_MAX_BYTES).await?,
        Frame::Line
    ) {
        return Ok(());
    }
    let request: ControlRequest = match serde_json::from_slice(&buffer) {
        Ok(request) => request,
        Err(e) => {
            let reply = ControlReply::Failed {
                code: ErrorCode::InvalidArgument.as_str().into(),
                message: format!("unknown control request: {e}"),
                hint: "the CLI and the daemon are different builds: reinstall alexandria".into(),
            };
            writer.write_all(&alexandria_proto::to_line(&reply)).await?;
            return Ok(());
        }
    };
    // Counted until the last reply is written: a stop waits for an ingest to finish.
    // Once the daemon is stopping nothing new starts (a second stop just answers).
    let _inflight = match context.inflight.try_begin() {
        Some(guard) => Some(guard),
        None if matches!(request, ControlRequest::Stop) => None,
        None => {
            let reply = ControlReply::Failed {
                code: ErrorCode::DaemonStopping.as_str().into(),
                message: "the alexandria daemon is stopping and did not start this request".into(),
                hint: "run the command again: it waits for the daemon to exit and starts a new one"
                    .into(),
            };
            writer.write_all(&alexandria_proto::to_line(&reply)).await?;
            return Ok(());
        }
    };
    let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel::<ControlReply>();
    let stop = matches!(request, ControlRequest::Stop);
    if stop {
        // Close the socket before answering: whoever reads the answer and connects
        // again must find the daemon stopping, not still accepting.
        context.shutdown();
        let socket = context.store.home.socket();
        let deadline = tokio::time::Instant::now() + SOCKET_CLOSE_WAIT;
        while socket.exists() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
    let worker_context = Arc::clone(&context);
    let worker = tokio::task::spawn_blocking(move || {
        let progress = sender.clone();
        let reply = match run(&worker_context, request, &|done, total, item: &str| {
            let _ = progress.send(ControlReply::Progress {
                done,
                total,
                item: item.to_string(),
            });
        }) {
            Ok(reply) => reply,
            Err(error) => ControlReply::Failed {
                code: error.code.as_str().into(),
                hint: error.hint_for(Audience::Person).to_string(),
                message: error.message,
            },
        };
        let _ = sender.send(reply);
    });
    while let Some(reply) = receiver.recv().await {
        let _ = writer.write_all(&alexandria_proto::to_line(&reply)).await;
    }
    let _ = writer.flush().await;
    if let Err(join_error) = worker.await {
        let reply = ControlReply::Failed {
            code: ErrorCode::Internal.as_str().into(),
            message: format!("the request crashed: {join_error}"),
            hint: "this is a bug; the daemon log has details".into(),
        };
        let _ = writer.write_all(&alexandria_proto::to_line(&reply)).await;
    }
    if stop {
        let _ = writer.shutdown().await;
    }
    Ok(())
}

/// Live sessions pinned to `slug`, as `mcp status` shows them.
fn pinned_sessions(context: &DaemonContext, slug: &str) -> Vec<serde_json::Value> {
    context
        .sessions
        .snapshot()
        .into_iter()
        .filter(|s| s["binding"] == "pinned" && s["workspace"] == slug)
        .collect()
}

/// One line for `daemon status`: whether state.db was sound at start or rebuilt, and
/// where a damaged one was kept.
fn state_db_line(report: &serde_json::Value) -> String {
    if report["rebuilt"] != true {
        if report["quick_check_skipped"] == true {
            return "state.db: sound (the previous daemon stopped cleanly and left it untouched, so the full check was skipped)\n".into();
        }
        return "state.db: checked at start, sound\n".into();
    }
    let reason = report["reason"].as_str().unwrap_or("unknown");
    match report["moved_to"].as_str() {
        Some(moved) => format!(
            "state.db: rebuilt at {} ({reason}); the old file is kept as {moved}; index and history were rebuilt from the workspaces\n",
            report["at"].as_str().unwrap_or("start")
        ),
        None => format!(
            "state.db: rebuilt at {} ({reason}); index and history were rebuilt from the workspaces\n",
            report["at"].as_str().unwrap_or("start")
        ),
    }
}

fn done(text: String, data: serde_json::Value) -> ControlReply {
    ControlReply::Done { text, data }
}

fn run(
    context: &DaemonContext,
    request: ControlRequest,
    progress: &dyn Fn(u64, u64, &str),
) -> Result<ControlReply, ToolError> {
    let store = &context.store;
    match request {
        ControlRequest::Status => {
            let status = context.status();
            let mut text = format!(
                "alexandriad {} (pid {}), up {}s\nhome:   {}\nsocket: {}\nhttp:   {}\n{}sessions: {}\n",
                status["version"].as_str().unwrap_or(""),
                status["pid"],
                status["uptime_secs"],
                status["home"].as_str().unwrap_or(""),
                match status["socket_note"].as_str() {
                    Some(note) => format!("{} ({note})", status["socket"].as_str().unwrap_or("")),
                    None => status["socket"].as_str().unwrap_or("").to_string(),
                },
                status["http"]
                    .as_str()
                    .or(status["http_error"].as_str())
                    .unwrap_or("off"),
                state_db_line(&status["state_db"]),
                status["sessions"].as_array().map_or(0, Vec::len),
            );
            for session in status["sessions"].as_array().into_iter().flatten() {
                let parent = match session["parent_pid"].as_u64() {
                    Some(pid) => format!(
                        "parent {pid} ({})",
                        session["parent_name"].as_str().unwrap_or("?")
                    ),
                    None => "remote".to_string(),
                };
                text.push_str(&format!(
                    "  - {} {} {} {parent} client {} {} · since {} · {} calls, last {}\n",
                    session["transport"].as_str().unwrap_or(""),
                    session["binding"].as_str().unwrap_or(""),
                    session["workspace"].as_str().unwrap_or("*"),
                    session["client_name"].as_str().unwrap_or("?"),
                    session["client_version"].as_str().unwrap_or(""),
                    session["started_at"].as_str().unwrap_or("?"),
                    session["calls"],
                    session["last_call_at"].as_str().unwrap_or("never"),
                ));
            }
            Ok(done(text.trim_end().to_string(), status))
        }
        ControlRequest::Init => {
            let workspaces = store.list_workspaces();
            Ok(done(
                format!(
                    "alexandria is ready.\nhome:       {}\nworkspaces: {}\nNext: alexandria ingest global <files…>, then register the MCP server (see README).",
                    store.home.root().display(),
                    workspaces.join(", ")
                ),
                json!({"home": store.home.root().display().to_string(), "workspaces": workspaces}),
            ))
        }
        ControlRequest::WorkspaceCreate { slug } => {
            let dir = store.create_workspace(&slug)?;
            index::catch_up(store, &slug)?;
            Ok(done(
                format!("created workspace '{slug}' at {}", dir.display()),
                json!({"workspace": slug, "path": dir.display().to_string()}),
            ))
        }
        ControlRequest::WorkspaceList => {
            let connection = store.pool.get()?;
            let mut text = String::new();
            let mut list = Vec::new();
            for slug in store.list_workspaces() {
                let indexing = store.state(&slug).indexing_note();
                let counts = index::counts(&connection, &slug, 0)?;
                text.push_str(&format!(
                    "{slug:<24} {:>6} wiki pages {:>6} raw sources{}\n",
                    counts.wiki,
                    counts.raw,
                    indexing
                        .as_ref()
                        .map(|note| format!("  ({note})"))
                        .unwrap_or_default()
                ));
                list.push(json!({"workspace": slug, "wiki_pages": counts.wiki, "raw_sources": counts.raw, "indexing": indexing}));
            }
            Ok(done(text.trim_end().to_string(), json!(list)))
        }
        ControlRequest::WorkspaceRename { from, to } => {
            let pinned = pinned_sessions(context, &from);
            let data = workspaces::rename(store, &from, &to)?;
            let mut text = format!(
                "renamed workspace '{from}' to '{to}' ({})",
                data["path"].as_str().unwrap_or("")
            );
            if !pinned.is_empty() {
                text.push_str(&format!(
                    "
{} live session(s) pinned to '{from}' are told the new name at their next call (workspace_not_found with the fix); restart them after updating their client entries",
                    pinned.len()
                ));
            }
            let mut data = data;
            data["pinned_sessions"] = json!(pinned);
            Ok(done(text, data))
        }
        ControlRequest::WorkspaceArchive { slug, force } => {
            let pinned = pinned_sessions(context, &slug);
            if !pinned.is_empty() && !force {
                return Err(ToolError::new(
                    ErrorCode::WorkspaceBusy,
                    format!("{} live session(s) are pinned to '{slug}'", pinned.len()),
                    "close those MCP clients first, or pass --force (they then get workspace_not_found)",
                )
                .with_detail("pinned_sessions", json!(pinned)));
            }
            let data = workspaces::archive(store, &slug)?;
            Ok(done(
                format!(
                    "archived workspace '{slug}' to {}
restore it with: alexandria workspace restore {}",
                    data["path"].as_str().unwrap_or(""),
                    data["archive"].as_str().unwrap_or(&slug)
                ),
                data,
            ))
        }
        ControlRequest::WorkspaceRestore { name } => {
            let data = workspaces::restore(store, &name)?;
            Ok(done(
                format!(
                    "restored workspace '{}' from {}",
                    data["workspace"].as_str().unwrap_or(""),
                    data["archive"].as_str().unwrap_or("")
                ),
                data,
            ))
        }
        ControlRequest::WorkspaceInfo { slug } => {
            let data = workspaces::info(store, &slug)?;
            let text = format!(
                "workspace:  {slug}
path:       {}
wiki pages: {}
raw files:  {}
size:       {} KiB
last write: {}
remote:     {}
sources:    {}",
                data["path"].as_str().unwrap_or(""),
                data["wiki_pages"],
                data["raw_sources"],
                data["size_bytes"].as_u64().unwrap_or(0) / 1024,
                data["last_write"].as_str().unwrap_or("never"),
                data["remote"].as_str().unwrap_or("none"),
                data["sources"]
                    .as_array()
                    .filter(|s| !s.is_empty())
                    .map(|s| s
                        .iter()
                        .filter_map(|v| v.as_str())
                        .collect::<Vec<_>>()
                        .join(", "))
                    .unwrap_or_else(|| "none".to_string()),
            );
            Ok(done(text, data))
        }
        ControlRequest::WorkspaceRemote { slug, url, branch } => {
            let data = crate::sync::set_remote(store, &slug, url.as_deref(), branch.as_deref())?;
            let text = match (&data["remote"], &data["removed"]) {
                (serde_json::Value::String(remote), _) => format!(
                    "workspace '{slug}' syncs with {remote} (branch {}): at start, a few seconds after writes, and every {}s; `alexandria sync {slug}` syncs now",
                    data["branch"].as_str().unwrap_or(""),
                    store.config.sync.interval_secs
                ),
                (_, serde_json::Value::String(removed)) => {
                    format!("workspace '{slug}' no longer syncs with {removed}")
                }
                _ => format!("workspace '{slug}' had no remote"),
            };
            Ok(done(text, data))
        }
        ControlRequest::WorkspaceClone { url, slug, branch } => {
            progress(0, 1, "cloning");
            let data = crate::sync::clone(store, &url, slug.as_deref(), branch.as_deref())?;
            Ok(done(
                format!(
                    "cloned {} into workspace '{}' ({} wiki pages, {} raw files); it syncs with the remote on its own",
                    data["remote"].as_str().unwrap_or(""),
                    data["workspace"].as_str().unwrap_or(""),
                    data["wiki_pages"],
                    data["raw_sources"]
                ),
                data,
            ))
        }
        ControlRequest::WorkspaceStatus { slug } => {
            let data = crate::sync::status(store, &slug)?;
            Ok(done(crate::sync::status_text(&data), data))
        }
        ControlRequest::Sync { workspace } => {
            let data = match workspace {
                Some(slug) => crate::sync::sync(store, &slug)?,
                None => crate::sync::sync_all(store)?,
            };
            let describe = |d: &serde_json::Value| {
                let conflicts = d["conflicts"].as_array().map(Vec::len).unwrap_or(0);
                format!(
                    "{}: synced ({} commit(s) merged in, {}{})",
                    d["workspace"].as_str().unwrap_or(""),
                    d["merged_commits"],
                    if d["pushed"] == true {
                        "pushed"
                    } else {
                        "nothing to push"
                    },
                    if conflicts > 0 {
                        format!(", {conflicts} conflict(s) kept side by side")
                    } else {
                        String::new()
                    }
                )
            };
            let text = match data["synced"].as_array() {
                Some(all) if all.is_empty() => "no workspace has a git remote".to_string(),
                Some(all) => all.iter().map(describe).collect::<Vec<_>>().join("\n"),
                None => describe(&data),
            };
            Ok(done(text, data))
        }
        ControlRequest::Ingest { workspace, files } => ingest(store, &workspace, &files, progress),
        ControlRequest::AuthToken {
            workspace,
            ttl_secs,
        } => {
            if let Some(slug) = &workspace {
                store.require_workspace(slug)?;
            }
            let minted = context
                .auth
                .mint(workspace, ttl_secs)
                .map_err(|e| ToolError::internal("minting a token", e))?;
            let scope = minted
                .workspace
                .as_deref()
                .map_or("every workspace".to_string(), |w| {
                    format!("workspace '{w}' only")
                });
            let expiry = minted.expires_at.map_or("never expires".to_string(), |at| {
                format!("expires {}", crate::tools::iso_time(at as i64 * 1000))
            });
            let url = match (&context.http, &minted.workspace) {
                (Some(http), Some(w)) => format!("{}/mcp/{w}", http.url()),
                (Some(http), None) => format!("{}/mcp", http.url()),
                (None, _) => "(HTTP is not being served)".to_string(),
            };
            Ok(done(
                format!(
                    "{}\n\nA bearer token for {scope}; it {expiry}. It is shown only once.\nSend it as `Authorization: Bearer <token>` to {url}.\nEvery HTTP request now needs a token; `alexandria daemon auth revoke` invalidates all of them.",
                    minted.token
                ),
                json!({"token": minted.token, "workspace": minted.workspace, "expires_at": minted.expires_at, "url": url}),
            ))
        }
        ControlRequest::AuthRevoke => {
            let generation = context
                .auth
                .revoke()
                .map_err(|e| ToolError::internal("revoking tokens", e))?;
            Ok(done(
                "every token minted so far is now invalid; HTTP still requires a token (mint one with `alexandria daemon auth token`)".into(),
                json!({"revoked": true, "generation": generation}),
            ))
        }
        ControlRequest::WebLogin => {
            let Some(http) = &context.http else {
                return Err(ToolError::new(
                    alexandria_proto::ErrorCode::Internal,
                    "the daemon has no HTTP listener, so the web view is off",
                    "see the daemon log for why HTTP could not be bound, then `alexandria daemon stop && alexandria daemon start`",
                ));
            };
            let token = context.web.issue().map_err(|_| {
                ToolError::internal("drawing a login token", "the system random source failed")
            })?;
            let url = format!("{}/login?token={token}", http.url());
            Ok(done(
                format!("{url}\nopen this URL in your browser within 10 minutes (it works once)"),
                json!({"url": url, "expires_in_secs": crate::auth::web::LOGIN_TOKEN_TTL.as_secs()}),
            ))
        }
        ControlRequest::RemoteEnable {
            public_url,
            workspaces,
        } => remote_enable(context, &public_url, workspaces),
        ControlRequest::RemoteDisable => {
            context
                .oauth
                .disable()
                .map_err(|e| ToolError::internal("turning remote access off", e))?;
            Ok(done(
                "remote access is off: OAuth tokens stop working now (clients and grants are kept; `alexandria remote revoke --all` forgets them)".into(),
                json!({"enabled": false}),
            ))
        }
        ControlRequest::RemoteStatus => remote_status(context),
        ControlRequest::RemoteDoctor => {
            let Some(remote) = context.oauth.remote() else {
                return Err(remote_off());
            };
            let (text, data, ok) =
                crate::transport::remote_doctor::run(&remote, alexandria_proto::BUILD);
            if ok {
                Ok(done(text, data))
            } else {
                Err(ToolError::new(
                    ErrorCode::InvalidArgument,
                    text,
                    "fix the problems above, then run `alexandria remote doctor` again",
                ))
            }
        }
        ControlRequest::RemotePair => {
            let Some(remote) = context.oauth.remote() else {
                return Err(remote_off());
            };
            let (code, ttl) = context
                .oauth
                .pair()
                .map_err(|e| ToolError::internal("drawing a pairing code", e))?;
            let expires = crate::tools::iso_time((crate::db::now_ms() / 1000 + ttl as i64) * 1000);
            Ok(done(
                format!(
                    "{code}\n\nType this code on the consent page that opens when a client (Claude.ai, ChatGPT, …) connects to {}/mcp/<workspace>. It works once, for 10 minutes.",
                    remote.origin
                ),
                json!({"code": code, "expires": expires}),
            ))
        }
        ControlRequest::RemoteClients => {
            let clients = context
                .oauth
                .clients()
                .map_err(|e| ToolError::internal("listing OAuth clients", e))?;
            let mut text = String::new();
            for client in &clients {
                text.push_str(&format!(
                    "{}  {}  → {}\n",
                    client["client_id"].as_str().unwrap_or(""),
                    client["name"].as_str().unwrap_or("(unnamed)"),
                    client["redirect_hosts"]
                        .as_array()
                        .map(|h| h
                            .iter()
                            .filter_map(|h| h.as_str())
                            .collect::<Vec<_>>()
                            .join(", "))
                        .unwrap_or_default(),
                ));
                for grant in client["grants"].as_array().into_iter().flatten() {
                    text.push_str(&format!(
                        "    grant: {} [{}] last used {}\n",
                        grant["workspace"].as_str().unwrap_or("every workspace"),
                        grant["scope"].as_str().unwrap_or(""),
                        grant["last_used_at"]
                            .as_i64()
                            .map_or("never".to_string(), crate::tools::iso_time),
                    ));
                }
            }
            if clients.is_empty() {
                text.push_str("no registered clients");
            }
            Ok(done(text.trim_end().to_string(), json!(clients)))
        }
        ControlRequest::RemoteRevoke { client_id, all } => {
            if all {
                let count = context
                    .oauth
                    .revoke_all()
                    .map_err(|e| ToolError::internal("revoking OAuth clients", e))?;
                return Ok(done(
                    format!("revoked {count} client(s) and all their grants"),
                    json!({"revoked": count}),
                ));
            }
            let Some(client_id) = client_id else {
                return Err(ToolError::invalid_argument(
                    "name a client to revoke, or --all",
                    "`alexandria remote clients` lists them",
                ));
            };
            let found = context
                .oauth
                .revoke_client(&client_id)
                .map_err(|e| ToolError::internal("revoking an OAuth client", e))?;
            if !found {
                return Err(ToolError::new(
                    ErrorCode::NotFound,
                    format!("no client {client_id}"),
                    "`alexandria remote clients` lists them",
                ));
            }
            Ok(done(
                format!("revoked {client_id}: its tokens stop working now"),
                json!({"revoked": 1, "client_id": client_id}),
            ))
        }
        ControlRequest::SourceAdd(spec) => {
            let source = crate::sources::add(store, spec)?;
            Ok(done(
                format!(
                    "added {} source '{}' to {} ({}, every {}, {}); it syncs now in the background (`alexandria source sync {} {}` to wait for it)",
                    source["kind"].as_str().unwrap_or(""),
                    source["name"].as_str().unwrap_or(""),
                    source["workspace"].as_str().unwrap_or(""),
                    source["target"].as_str().unwrap_or(""),
                    source["every"].as_str().unwrap_or(""),
                    if source["auto"] == true {
                        "captures new items itself"
                    } else {
                        "new items wait as pending subscriptions"
                    },
                    source["workspace"].as_str().unwrap_or(""),
                    source["name"].as_str().unwrap_or(""),
                ),
                source,
            ))
        }
        ControlRequest::SourceList { workspace } => {
            let (text, data) = crate::sources::list(store, workspace.as_deref())?;
            Ok(done(text, data))
        }
        ControlRequest::SourceSync { workspace, name } => {
            source_sync(store, &workspace, name, progress)
        }
        ControlRequest::SourceSecret {
            workspace,
            name,
            secret,
        } => {
            let data = crate::sources::set_secret(store, &workspace, &name, &secret)?;
            Ok(done(
                format!(
                    "stored the credential of {workspace}/{name} in secrets/ (0600); it is used from the next sync"
                ),
                data,
            ))
        }
        ControlRequest::SourceRemove { workspace, name } => {
            let data = crate::sources::remove(store, &workspace, &name)?;
            Ok(done(
                format!(
                    "removed source '{name}' from {workspace}; what it captured stays in raw/sources/{name}/"
                ),
                data,
            ))
        }
        ControlRequest::SubscriptionList {
            workspace,
            source,
            state,
        } => {
            store.require_workspace(&workspace)?;
            let connection = store.pool.get()?;
            let items = crate::sources::items(
                &connection,
                &workspace,
                source.as_deref(),
                state.as_deref(),
                10_000,
                0,
            )?;
            let mut text = String::new();
            for item in &items {
                text.push_str(&format!(
                    "{:>6} {:<9} {:<16} {}{}
",
                    item.id,
                    item.state,
                    item.source,
                    item.title,
                    item.raw_path
                        .as_deref()
                        .map(|p| format!(" → {p}"))
                        .unwrap_or_default()
                ));
                if let Some(error) = &item.error {
                    text.push_str(&format!(
                        "         error: {error}
"
                    ));
                }
            }
            if items.is_empty() {
                text = "no items".into();
            }
            let data: Vec<serde_json::Value> = items
                .iter()
                .map(|item| crate::sources::item_json(&workspace, item))
                .collect();
            Ok(done(text.trim_end().to_string(), json!(data)))
        }
        ControlRequest::SubscriptionIngest {
            workspace,
            items,
            source,
            all,
        } => {
            store.require_workspace(&workspace)?;
            let source_id = match (&source, all) {
                (Some(name), true) => {
                    let connection = store.pool.get()?;
                    Some(crate::sources::find(&connection, &workspace, name)?.id)
                }
                (None, false) if !items.is_empty() => None,
                _ => {
                    return Err(ToolError::invalid_argument(
                        "name item ids, or --source <name> --all",
                        format!(
                            "list pending items with `alexandria subscription list {workspace}`"
                        ),
                    ));
                }
            };
            let outcome = crate::sources::capture_items_with(
                store, &workspace, source_id, &items, true, progress,
            )?;
            let mut text = format!("captured {} item(s)", outcome.captured.len());
            for (id, path) in &outcome.captured {
                text.push_str(&format!(
                    "
  + {id} → {path}"
                ));
            }
            for (id, error) in &outcome.failed {
                text.push_str(&format!(
                    "
  ! {id}: {error}"
                ));
            }
            let data = json!({
                "captured": outcome.captured.iter().map(|(id, path)| json!({"id": id, "raw_path": path})).collect::<Vec<_>>(),
                "failed": outcome.failed.iter().map(|(id, error)| json!({"id": id, "error": error})).collect::<Vec<_>>(),
            });
            if !outcome.failed.is_empty() && outcome.captured.is_empty() {
                return Err(ToolError::new(
                    ErrorCode::Internal,
                    text,
                    "the items stay failed with their error; retry later with the same command",
                ));
            }
            Ok(done(text, data))
        }
        ControlRequest::SubscriptionDismiss { workspace, items } => {
            store.require_workspace(&workspace)?;
            let dismissed = crate::sources::dismiss(store, &workspace, &items)?;
            Ok(done(
                format!(
                    "dismissed {} item(s); they will not come back",
                    dismissed.len()
                ),
                json!({"dismissed": dismissed}),
            ))
        }
        ControlRequest::Stop => Ok(done(
            format!("alexandriad (pid {}) is stopping", std::process::id()),
            json!({"pid": std::process::id()}),
        )),
    }
}

fn remote_off() -> ToolError {
    ToolError::new(
        ErrorCode::InvalidArgument,
        "remote access is off",
        "turn it on with `alexandria remote enable --public-url https://<your tunnel host>`",
    )
}

fn remote_enable(
    context: &DaemonContext,
    public_url: &str,
    workspaces: Vec<String>,
) -> Result<ControlReply, ToolError> {
    for slug in &workspaces {
        context.store.require_workspace(slug)?;
    }
    let remote = context
        .oauth
        .enable(public_url, workspaces)
        .map_err(|e| match e {
            crate::auth::oauth::RemoteError::BadUrl(message) => ToolError::invalid_argument(
                message,
                "give the https origin your tunnel serves, e.g. https://wiki.tail1234.ts.net",
            ),
            other => ToolError::internal("saving the remote settings", other),
        })?;
    let mut text = format!(
        "remote access is on at {}.\nEvery HTTP request now needs a token (OAuth, or `alexandria daemon auth token`).\n",
        remote.origin
    );
    match &context.http {
        Some(http) => text.push_str(&format!(
            "Point your tunnel at {} (see docs/remote.md), then add {} as a connector and approve it with a code from `alexandria remote pair`.",
            http.url(),
            endpoints(&remote, &context.store.list_workspaces()).join(" or "),
        )),
        None => text.push_str(
            "warning: HTTP is not being served (`alexandria daemon status` says why), so the tunnel has nothing to reach.",
        ),
    }
    Ok(done(text, remote_json(context, &remote)))
}

fn endpoints(remote: &crate::auth::oauth::Remote, all: &[String]) -> Vec<String> {
    let mut list: Vec<String> = all
        .iter()
        .filter(|slug| remote.serves(Some(slug)))
        .map(|slug| remote.resource(Some(slug)))
        .collect();
    if remote.serves(None) {
        list.push(remote.resource(None));
    }
    list
}

fn remote_json(context: &DaemonContext, remote: &crate::auth::oauth::Remote) -> serde_json::Value {
    json!({
        "enabled": true,
        "public_url": remote.origin,
        "workspaces": remote.workspaces,
        "endpoints": endpoints(remote, &context.store.list_workspaces()),
        "authorization_server_metadata": format!("{}/.well-known/oauth-authorization-server", remote.origin),
        "local": context.http.as_ref().map(|h| h.url()),
    })
}

fn remote_status(context: &DaemonContext) -> Result<ControlReply, ToolError> {
    let Some(remote) = context.oauth.remote() else {
        return Ok(done(
            "remote access is off (`alexandria remote enable --public-url https://…`)".into(),
            json!({"enabled": false}),
        ));
    };
    let clients = context
        .oauth
        .clients()
        .map_err(|e| ToolError::internal("listing OAuth clients", e))?;
    let grants: usize = clients
        .iter()
        .map(|c| c["grants"].as_array().map_or(0, Vec::len))
        .sum();
    let mut data = remote_json(context, &remote);
    data["clients"] = json!(clients.len());
    data["grants"] = json!(grants);
    let text = format!(
        "remote access is on\npublic URL: {}\nworkspaces: {}\nendpoints:  {}\nlocal:      {}\nclients:    {} ({} live grants)",
        remote.origin,
        if remote.workspaces.is_empty() {
            "all".to_string()
        } else {
            remote.workspaces.join(", ")
        },
        data["endpoints"]
            .as_array()
            .map(|e| e
                .iter()
                .filter_map(|e| e.as_str())
                .collect::<Vec<_>>()
                .join(", "))
            .unwrap_or_default(),
        data["local"].as_str().unwrap_or("HTTP is not being served"),
        clients.len(),
        grants,
    );
    Ok(done(text, data))
}

/// `source sync`: one source or all of the workspace's, with progress; fails (exit 1)
/// when a source failed, after syncing every other one.
fn source_sync(
    store: &Arc<Store>,
    workspace: &str,
    name: Option<String>,
    progress: &dyn Fn(u64, u64, &str),
) -> Result<ControlReply, ToolError> {
    store.require_workspace(workspace)?;
    let names: Vec<String> = match name {
        Some(name) => vec![name],
        None => {
            let connection = store.pool.get()?;
            crate::sources::all(&connection, Some(workspace))?
                .into_iter()
                .map(|s| s.name)
                .collect()
        }
    };
    let total = names.len() as u64;
    let mut reports = Vec::new();
    let mut text = String::new();
    let mut failed = 0;
    for (i, name) in names.iter().enumerate() {
        progress(i as u64, total, name);
        // One source: show its items being captured; several: one step per source.
        let report = if total == 1 {
            crate::sources::sync_now_with(store, workspace, name, progress)?
        } else {
            crate::sources::sync_now(store, workspace, name)?
        };
        match &report.error {
            Some(error) => {
                failed += 1;
                text.push_str(&format!(
                    "{name}: failed: {error} (next try {})\n",
                    report.next_check.as_deref().unwrap_or("?")
                ));
            }
            None => text.push_str(&format!(
                "{name}: {}{} new item(s){}\n",
                if report.not_modified {
                    "not modified, "
                } else {
                    ""
                },
                report.new,
                if report.captured.is_empty() {
                    String::new()
                } else {
                    format!(", captured {}", report.captured.len())
                }
            )),
        }
        reports.push(report);
        progress(i as u64 + 1, total, name);
    }
    if names.is_empty() {
        text = format!("workspace '{workspace}' has no sources");
    }
    if failed > 0 {
        text.push_str(&format!(
            "{failed} of {total} source(s) failed; they back off and retry by themselves (`alexandria source list {workspace}` shows the error and next check)"
        ));
    }
    let data = serde_json::to_value(&reports).unwrap_or_default();
    Ok(done(text.trim_end().to_string(), data))
}

/// The reply to an ingest: what was added, already there, skipped, and problems.
fn ingest(
    store: &Arc<Store>,
    workspace: &str,
    files: &[String],
    progress: &dyn Fn(u64, u64, &str),
) -> Result<ControlReply, ToolError> {
    let report = crate::commit::ingest::ingest(store, workspace, files, progress)?;
    let mut text = format!(
        "ingested {} file(s) into {workspace}/raw ({} already present",
        report.added.len(),
        report.unchanged.len()
    );
    if !report.skipped.is_empty() {
        text.push_str(&format!(", {} skipped", report.skipped.len()));
    }
    text.push(')');
    for path in &report.added {
        text.push_str(&format!("\n  + {path}"));
    }
    for (path, why) in &report.skipped {
        text.push_str(&format!("\n  - {path} (skipped: {why})"));
    }
    for problem in &report.problems {
        text.push_str(&format!("\n  ! {problem}"));
    }
    let skipped: Vec<_> = report
        .skipped
        .iter()
        .map(|(path, why)| json!({"path": path, "reason": why}))
        .collect();
    Ok(done(
        text,
        json!({
            "workspace": workspace,
            "added": report.added,
            "unchanged": report.unchanged,
            "skipped": skipped,
            "problems": report.problems,
        }),
    ))
}
