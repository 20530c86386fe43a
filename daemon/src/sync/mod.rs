//! Workspaces sync through a git remote (issue 12): `alexandria workspace remote`,
//! `workspace clone`, `workspace status`, `alexandria sync`, and the background sync.
//!
//! A sync is: fetch (the `git` command line, no lock held) → merge in-process with the
//! workspace lock held (`merge.rs`: outside edits committed first, merge never rebase,
//! conflicts side by side, index and history caught up) → push fast-forward only (no
//! lock); a rejected push fetches, merges and pushes again, with backoff. Writes never
//! wait for the network.
//!
//! Where the settings live: the remote is the repository's own `origin`
//! (`remote.origin.url`) and `alexandria.syncbranch` in its git config names the
//! remote branch and turns background sync on, so they survive losing `state.db`.
//! `sync_state` in `state.db` caches the outcome of the last attempts (last sync, last
//! error) for `workspace status` and `guide`.
//!
//! May import: `commit`, `index`, `workspace`, `db`, `config`, `error`, `faults`,
//! `sources::redact_url`.

pub mod merge;
pub mod net;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use alexandria_proto::ErrorCode;
use alexandria_proto::paths::validate_slug;
use git2::{Oid, Repository};
use rusqlite::{OptionalExtension, params};
use serde_json::{Value, json};

use crate::db::{iso_time, now_ms};
use crate::error::{ToolError, ToolResult};
use crate::faults::crash_point;
use crate::sources::redact_url;
use crate::workspace::{Store, git};

/// Git config key naming the remote branch a workspace syncs with; set by
/// `workspace remote` and `workspace clone`, it turns background sync on.
pub const SYNC_BRANCH_KEY: &str = "alexandria.syncbranch";
/// How many times a rejected push is retried (fetch, merge, push) in one sync.
const PUSH_ATTEMPTS: u32 = 5;

/// A workspace's remote, from its git config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remote {
    pub url: String,
    /// The remote branch.
    pub branch: String,
    /// Set through alexandria (background sync on).
    pub auto: bool,
}

/// The remote of `repo`: `origin`, and the branch from `alexandria.syncbranch` (else the
/// checked-out branch).
pub fn remote_of(repo: &Repository) -> Option<Remote> {
    let config = repo.config().ok()?.snapshot().ok()?;
    let url = config.get_string("remote.origin.url").ok()?;
    let configured = config.get_string(SYNC_BRANCH_KEY).ok();
    let auto = configured.is_some();
    let branch = configured.or_else(|| git::branch(repo))?;
    Some(Remote { url, branch, auto })
}

fn tracking_ref(branch: &str) -> String {
    format!("refs/remotes/origin/{branch}")
}

fn check_url(url: &str) -> ToolResult<()> {
    if url.is_empty()
        || url.starts_with('-')
        || url.chars().any(|c| c.is_control() || c.is_whitespace())
    {
        return Err(ToolError::invalid_argument(
            format!("{url:?} is not a git URL"),
            "give a URL git understands: https://host/owner/repo.git, git@host:owner/repo.git, ssh://…, file:///path",
        ));
    }
    if url.starts_with("ext::") {
        return Err(ToolError::invalid_argument(
            "ext:: URLs run commands and are not allowed",
            "use https://, ssh:// or file:// URLs",
        ));
    }
    Ok(())
}

fn check_branch(branch: &str) -> ToolResult<()> {
    if branch.starts_with('-') || !git2::Reference::is_valid_name(&format!("refs/heads/{branch}")) {
        return Err(ToolError::invalid_argument(
            format!("{branch:?} is not a valid branch name"),
            "name a branch like main",
        ));
    }
    Ok(())
}

fn sync_error(slug: &str, url: &str, error: impl std::fmt::Display) -> ToolError {
    ToolError::new(
        ErrorCode::SyncFailed,
        format!(
            "cannot sync workspace '{slug}' with {}: {error}",
            redact_url(url)
        ),
        "check the URL and your access to it (the same `git fetch` in the workspace folder shows the same error); writes go on meanwhile and alexandria retries on its own",
    )
    .with_detail("workspace", slug)
}

fn open_repo(store: &Store, slug: &str) -> ToolResult<Repository> {
    Repository::open(store.workspace_dir(slug))
        .map_err(|e| ToolError::internal("opening the workspace's repository", e))
}

/// `alexandria workspace remote <slug> <url> [--branch B]`, or `--unset` (`url: None`).
pub fn set_remote(
    store: &Store,
    slug: &str,
    url: Option<&str>,
    branch: Option<&str>,
) -> ToolResult<Value> {
    store.require_workspace(slug)?;
    let repo = open_repo(store, slug)?;
    let connection = store.pool.get()?;
    let Some(url) = url else {
        let had = remote_of(&repo);
        if repo.find_remote("origin").is_ok() {
            repo.remote_delete("origin")
                .map_err(|e| ToolError::internal("removing the remote", e))?;
        }
        if let Ok(mut config) = repo.config() {
            let _ = config.remove(SYNC_BRANCH_KEY);
        }
        connection.execute("DELETE FROM sync_state WHERE workspace = ?1", params![slug])?;
        return Ok(
            json!({"workspace": slug, "remote": null, "removed": had.map(|r| redact_url(&r.url))}),
        );
    };
    check_url(url)?;
    let branch = match branch {
        Some(branch) => branch.to_string(),
        None => git::branch(&repo).unwrap_or_else(|| store.config.git.default_branch.clone()),
    };
    check_branch(&branch)?;
    let result = if repo.find_remote("origin").is_ok() {
        repo.remote_set_url("origin", url)
    } else {
        repo.remote("origin", url).map(|_| ())
    };
    result.map_err(|e| ToolError::internal("setting the remote", e))?;
    repo.config()
        .and_then(|mut c| c.set_str(SYNC_BRANCH_KEY, &branch))
        .map_err(|e| ToolError::internal("setting the remote", e))?;
    connection.execute(
        "INSERT INTO sync_state(workspace, remote_url, branch, failures) VALUES (?1, ?2, ?3, 0)
         ON CONFLICT(workspace) DO UPDATE SET remote_url = ?2, branch = ?3, last_error = NULL, failures = 0",
        params![slug, redact_url(url), branch],
    )?;
    Ok(json!({"workspace": slug, "remote": redact_url(url), "branch": branch}))
}

/// Serializes syncs of one workspace (the background loop and `alexandria sync`).
fn sync_lock(slug: &str) -> Arc<Mutex<()>> {
    static LOCKS: OnceLock<Mutex<HashMap<String, Arc<Mutex<()>>>>> = OnceLock::new();
    let mut locks = LOCKS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    Arc::clone(locks.entry(slug.to_string()).or_default())
}

fn timeout(store: &Store) -> Duration {
    Duration::from_secs_f64(store.config.sync.timeout_secs.clamp(1.0, 3600.0))
}

/// Fetch the remote branch into `refs/remotes/origin/<branch>`. A remote without that
/// branch yet (a new, empty repository) is not an error.
fn fetch(store: &Store, root: &Path, branch: &str) -> Result<(), net::NetError> {
    let refspec = format!("+refs/heads/{branch}:{}", tracking_ref(branch));
    match net::git(
        root,
        &[
            "fetch",
            "--no-tags",
            "--no-write-fetch-head",
            "origin",
            &refspec,
        ],
        timeout(store),
    ) {
        Ok(_) => Ok(()),
        Err(net::NetError::Failed { all, .. }) if all.contains("couldn't find remote ref") => {
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// What one sync did.
#[derive(Debug, Default)]
pub struct Report {
    pub merged_commits: usize,
    pub outside: usize,
    pub conflicts: Vec<merge::Conflict>,
    pub pushed: bool,
}

/// Sync `slug` with its remote now: fetch, merge, push (retried when rejected). The
/// outcome is recorded in `sync_state`.
pub fn sync(store: &Store, slug: &str) -> ToolResult<Value> {
    store.require_workspace(slug)?;
    let lock = sync_lock(slug);
    let _one = lock.lock().unwrap_or_else(|p| p.into_inner());
    let started = now_ms();
    let result = sync_now(store, slug);
    let head = open_repo(store, slug)
        .ok()
        .and_then(|r| r.head().ok()?.target())
        .map(|id| id.to_string());
    let connection = store.pool.get()?;
    match &result {
        Ok(_) => connection.execute(
            "INSERT INTO sync_state(workspace, last_attempt_at, last_sync_at, failures, synced_head) VALUES (?1, ?2, ?2, 0, ?3)
             ON CONFLICT(workspace) DO UPDATE SET last_attempt_at = ?2, last_sync_at = ?2, last_error = NULL, failures = 0, synced_head = ?3",
            params![slug, started, head],
        )?,
        Err(error) => connection.execute(
            "INSERT INTO sync_state(workspace, last_attempt_at, last_error, failures) VALUES (?1, ?2, ?3, 1)
             ON CONFLICT(workspace) DO UPDATE SET last_attempt_at = ?2, last_error = ?3, failures = failures + 1",
            params![slug, started, error.message],
        )?,
    };
    let report = result?;
    Ok(json!({
        "workspace": slug,
        "merged_commits": report.merged_commits,
        "outside_edits_committed": report.outside,
        "conflicts": report.conflicts.iter().map(|c| json!({"path": c.path, "kept_as": c.kept_as})).collect::<Vec<_>>(),
        "pushed": report.pushed,
        "head": head,
    }))
}

fn sync_now(store: &Store, slug: &str) -> ToolResult<Report> {
    let root = store.workspace_dir(slug);
    let Some(remote) = open_repo(store, slug).ok().as_ref().and_then(remote_of) else {
        return Err(ToolError::invalid_argument(
            format!("workspace '{slug}' has no git remote"),
            format!("set one with `alexandria workspace remote {slug} <git-url>`"),
        ));
    };
    let tracking = tracking_ref(&remote.branch);
    let mut report = Report::default();
    let mut attempt = 0;
    loop {
        fetch(store, &root, &remote.branch).map_err(|e| sync_error(slug, &remote.url, e))?;
        crash_point("sync_after_fetch");
        let merged = merge::integrate(store, slug, &tracking)?;
        report.merged_commits += merged.commits;
        report.outside += merged.outside;
        report.conflicts.extend(merged.conflicts);
        crash_point("sync_after_merge");
        let repo = open_repo(store, slug)?;
        let local = repo
            .head()
            .ok()
            .and_then(|h| h.target())
            .ok_or_else(|| ToolError::internal("sync", "HEAD has no commit"))?;
        let theirs = repo.refname_to_id(&tracking).ok();
        if Some(local) == theirs {
            return Ok(report);
        }
        // Fast-forward only: git refuses anything else without --force.
        let refspec = format!("{local}:refs/heads/{}", remote.branch);
        match net::git(&root, &["push", "origin", &refspec], timeout(store)) {
            Ok(_) => {
                crash_point("sync_after_push");
                let _ = repo.reference(&tracking, local, true, "alexandria: pushed");
                report.pushed = true;
                return Ok(report);
            }
            Err(error) if net::is_rejected(&error) && attempt + 1 < PUSH_ATTEMPTS => {
                attempt += 1;
                let jitter = u64::from(uuid::Uuid::new_v4().as_bytes()[0]);
                std::thread::sleep(Duration::from_millis(100 * (1 << attempt) + jitter));
            }
            Err(error) => return Err(sync_error(slug, &remote.url, error)),
        }
    }
}

/// `alexandria sync --all`: every workspace with a remote. Fails (naming each) if any
/// failed.
pub fn sync_all(store: &Store) -> ToolResult<Value> {
    let mut results = Vec::new();
    let mut failures = Vec::new();
    for slug in store.list_workspaces() {
        let has_remote = open_repo(store, &slug)
            .ok()
            .as_ref()
            .and_then(remote_of)
            .is_some();
        if !has_remote {
            continue;
        }
        match sync(store, &slug) {
            Ok(result) => results.push(result),
            Err(error) => failures.push(format!("{slug}: {}", error.message)),
        }
    }
    if !failures.is_empty() {
        return Err(ToolError::new(
            ErrorCode::SyncFailed,
            failures.join("; "),
            "`alexandria workspace status <slug>` shows each workspace's last error",
        ));
    }
    Ok(json!({"synced": results}))
}

/// Open conflicts: conflict pages still in the workspace (deleting one resolves it).
pub fn open_conflicts(connection: &rusqlite::Connection, slug: &str) -> ToolResult<Vec<String>> {
    // Counted by trigger on `files` (migration 9): without conflict pages (nearly
    // always) no row of the workspace is matched against the pattern.
    let counted: i64 = connection
        .prepare_cached("SELECT coalesce(sum(conflicts), 0) FROM file_counts WHERE ws = ?1")?
        .query_row(params![slug], |r| r.get(0))?;
    if counted == 0 {
        return Ok(Vec::new());
    }
    let mut statement = connection.prepare_cached(
        "SELECT path FROM files WHERE workspace = ?1 AND path LIKE '%.conflict-%' ORDER BY path",
    )?;
    let rows = statement.query_map(params![slug], |r| r.get::<_, String>(0))?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// `alexandria workspace status <slug>`.
pub fn status(store: &Store, slug: &str) -> ToolResult<Value> {
    store.require_workspace(slug)?;
    let repo = open_repo(store, slug)?;
    let remote = remote_of(&repo);
    let connection = store.pool.get()?;
    let row = connection
        .query_row(
            "SELECT last_attempt_at, last_sync_at, last_error, failures FROM sync_state WHERE workspace = ?1",
            params![slug],
            |r| {
                Ok((
                    r.get::<_, Option<i64>>(0)?,
                    r.get::<_, Option<i64>>(1)?,
                    r.get::<_, Option<String>>(2)?,
                    r.get::<_, i64>(3)?,
                ))
            },
        )
        .optional()?;
    let (last_attempt, last_sync, last_error, failures) = row.unwrap_or((None, None, None, 0));
    let (ahead, behind) = match (&remote, repo.head().ok().and_then(|h| h.target())) {
        (Some(remote), Some(local)) => match repo.refname_to_id(&tracking_ref(&remote.branch)) {
            Ok(theirs) => repo
                .graph_ahead_behind(local, theirs)
                .map(|(a, b)| (json!(a), json!(b)))
                .unwrap_or((Value::Null, Value::Null)),
            Err(_) => (Value::Null, json!(0)),
        },
        _ => (Value::Null, Value::Null),
    };
    let conflicts = open_conflicts(&connection, slug)?;
    Ok(json!({
        "workspace": slug,
        "remote": remote.as_ref().map(|r| redact_url(&r.url)),
        "branch": remote.as_ref().map(|r| r.branch.clone()),
        "background_sync": remote.as_ref().is_some_and(|r| r.auto),
        "last_sync": last_sync.map(iso_time),
        "last_attempt": last_attempt.map(iso_time),
        "last_error": last_error,
        "failures": failures,
        "ahead": ahead,
        "behind": behind,
        "conflicts": conflicts,
    }))
}

/// The text of `workspace status`.
pub fn status_text(data: &Value) -> String {
    let or = |key: &str, none: &str| -> String {
        match &data[key] {
            Value::Null => none.to_string(),
            Value::String(s) => s.clone(),
            other => other.to_string(),
        }
    };
    let conflicts = data["conflicts"]
        .as_array()
        .map(|c| {
            if c.is_empty() {
                "none".to_string()
            } else {
                c.iter()
                    .filter_map(|v| v.as_str())
                    .map(|p| format!("\n  {p}"))
                    .collect()
            }
        })
        .unwrap_or_else(|| "none".into());
    format!(
        "workspace:  {}\nremote:     {}\nbranch:     {}\nlast sync:  {}\nahead:      {}\nbehind:     {}\nlast error: {}\nconflicts:  {}",
        or("workspace", ""),
        or(
            "remote",
            "none (alexandria workspace remote <slug> <git-url>)"
        ),
        or("branch", "-"),
        or("last_sync", "never"),
        or("ahead", "unknown"),
        or("behind", "unknown"),
        or("last_error", "none"),
        conflicts
    )
}

/// A slug from a git URL: its last path part without `.git`.
fn slug_from_url(url: &str) -> String {
    let last = url
        .trim_end_matches('/')
        .rsplit(['/', ':'])
        .next()
        .unwrap_or("");
    let last = last.strip_suffix(".git").unwrap_or(last);
    let slug: String = last
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    slug.trim_matches('-').to_string()
}

/// `alexandria workspace clone <url> [<slug>]`: clone into a hidden folder, then move
/// it into place, record it (history from its commits) and index it.
pub fn clone(
    store: &Store,
    url: &str,
    slug: Option<&str>,
    branch: Option<&str>,
) -> ToolResult<Value> {
    check_url(url)?;
    if let Some(branch) = branch {
        check_branch(branch)?;
    }
    let slug = match slug {
        Some(slug) => slug.to_string(),
        None => slug_from_url(url),
    };
    validate_slug(&slug).map_err(|e| {
        ToolError::invalid_argument(
            e.message,
            "name the workspace: alexandria workspace clone <git-url> <slug>",
        )
    })?;
    let dir = store.workspace_dir(&slug);
    if dir.exists() {
        return Err(ToolError::new(
            ErrorCode::WorkspaceExists,
            format!("workspace '{slug}' already exists"),
            "pick another slug: alexandria workspace clone <git-url> <slug>",
        ));
    }
    let workspaces = store.home.workspaces_dir();
    let temp = workspaces.join(format!(
        ".clone-{slug}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    ));
    let temp_name = temp.display().to_string();
    let mut args = vec!["clone", "--no-tags"];
    if let Some(branch) = branch {
        args.extend(["--branch", branch]);
    }
    args.extend(["--", url, &temp_name]);
    let result = (|| -> ToolResult<String> {
        net::git(&workspaces, &args, timeout(store)).map_err(|e| sync_error(&slug, url, e))?;
        let repo =
            Repository::open(&temp).map_err(|e| ToolError::internal("opening the clone", e))?;
        if repo.head().is_err() {
            return Err(ToolError::new(
                ErrorCode::SyncFailed,
                format!("{} has no commits yet", redact_url(url)),
                format!(
                    "create the workspace on this machine and push it: `alexandria workspace create {slug}`, then `alexandria workspace remote {slug} <git-url>` and `alexandria sync {slug}`"
                ),
            ));
        }
        let branch = git::branch(&repo)
            .ok_or_else(|| ToolError::internal("clone", "no branch checked out"))?;
        repo.config()
            .and_then(|mut c| c.set_str(SYNC_BRANCH_KEY, &branch))
            .map_err(|e| ToolError::internal("setting the remote", e))?;
        for sub in ["raw", "wiki", "runs", ".trash"] {
            std::fs::create_dir_all(temp.join(sub))
                .map_err(|e| crate::commit::io_error("creating the workspace folders", e))?;
        }
        Ok(branch)
    })();
    let branch = match result {
        Ok(branch) => branch,
        Err(error) => {
            let _ = std::fs::remove_dir_all(&temp);
            return Err(error);
        }
    };
    if let Err(error) = std::fs::rename(&temp, &dir) {
        let _ = std::fs::remove_dir_all(&temp);
        return Err(crate::commit::io_error(
            "moving the clone into place",
            error,
        ));
    }
    store.forget_state(&slug);
    crate::commit::rebuild::ensure_history(store, &slug)?;
    crate::index::catch_up(store, &slug)?;
    let head = open_repo(store, &slug)?
        .head()
        .ok()
        .and_then(|h| h.target())
        .map(|id| id.to_string());
    let now = now_ms();
    store.pool.get()?.execute(
        "INSERT INTO sync_state(workspace, remote_url, branch, last_attempt_at, last_sync_at, failures, synced_head) VALUES (?1, ?2, ?3, ?4, ?4, 0, ?5)
         ON CONFLICT(workspace) DO UPDATE SET remote_url = ?2, branch = ?3, last_attempt_at = ?4, last_sync_at = ?4, last_error = NULL, failures = 0, synced_head = ?5",
        params![slug, redact_url(url), branch, now, head],
    )?;
    let counts = crate::index::counts(&*store.pool.get()?, &slug, 0)?;
    Ok(json!({
        "workspace": slug,
        "path": dir.display().to_string(),
        "remote": redact_url(url),
        "branch": branch,
        "wiki_pages": counts.wiki,
        "raw_sources": counts.raw,
    }))
}

/// At start, before serving: finish merges a killed daemon was putting in place.
pub fn recover(store: &Store) -> Vec<String> {
    let mut report = Vec::new();
    for slug in store.list_workspaces() {
        match merge::recover(store, &slug) {
            Ok(Some(line)) => report.push(line),
            Ok(None) => {}
            Err(error) => report.push(format!("{slug}: cannot finish a sync merge: {error}")),
        }
    }
    report
}

/// What the background loop knows of one workspace.
struct Tracked {
    /// HEAD as last seen, and since when.
    seen: Option<Oid>,
    seen_since: Instant,
    /// HEAD after the last successful sync.
    synced: Option<Oid>,
    next_due: Instant,
    failures: u32,
}

/// Background sync: each workspace with `alexandria.syncbranch` syncs at start, a few
/// seconds after writes stop (HEAD unchanged for `quiet_secs`), every `interval_secs`,
/// and after a failure with backoff (5 s doubling, at most the interval).
pub fn spawn(store: Arc<Store>) {
    let spawned = std::thread::Builder::new()
        .name("sync".into())
        .spawn(move || run(&store));
    if let Err(error) = spawned {
        tracing::error!(%error, "cannot start background sync");
    }
}

/// Size, modification time and inode of a workspace's `.git/config`.
type ConfigStamp = (u64, std::time::SystemTime, u64);

fn config_stamp(root: &Path) -> Option<ConfigStamp> {
    use std::os::unix::fs::MetadataExt;
    let metadata = std::fs::metadata(root.join(".git/config")).ok()?;
    Some((metadata.len(), metadata.modified().ok()?, metadata.ino()))
}

fn run(store: &Store) {
    let interval = Duration::from_secs_f64(store.config.sync.interval_secs.max(1.0));
    let quiet = Duration::from_secs_f64(store.config.sync.quiet_secs.max(0.1));
    let mut tracked: HashMap<String, Tracked> = HashMap::new();
    // Workspaces without background sync, by the stat of their `.git/config` when that
    // was seen: opening every repository 4 times a second cost ~35k instructions each
    // (reading git's config files) in an idle daemon.
    let mut without: HashMap<String, ConfigStamp> = HashMap::new();
    loop {
        std::thread::sleep(Duration::from_millis(250));
        for slug in store.list_workspaces() {
            let root = store.workspace_dir(&slug);
            let stamp = config_stamp(&root);
            if stamp.is_some() && without.get(&slug) == stamp.as_ref() {
                continue;
            }
            let Ok(repo) = Repository::open(&root) else {
                continue;
            };
            if !remote_of(&repo).is_some_and(|r| r.auto) {
                if let Some(stamp) = stamp {
                    without.insert(slug, stamp);
                }
                continue;
            }
            without.remove(&slug);
            if !crate::commit::rebuild::known(store, &slug).unwrap_or(false) {
                continue;
            }
            let head = repo.head().ok().and_then(|h| h.target());
            drop(repo);
            let now = Instant::now();
            let entry = tracked.entry(slug.clone()).or_insert(Tracked {
                seen: head,
                seen_since: now,
                synced: None,
                next_due: now,
                failures: 0,
            });
            if head != entry.seen {
                entry.seen = head;
                entry.seen_since = now;
            }
            let settled_write = entry.failures == 0
                && entry.synced.is_some()
                && head != entry.synced
                && entry.seen_since.elapsed() >= quiet;
            if now < entry.next_due && !settled_write {
                continue;
            }
            match sync(store, &slug) {
                Ok(result) => {
                    entry.failures = 0;
                    entry.synced = result["head"].as_str().and_then(|h| Oid::from_str(h).ok());
                    entry.next_due = Instant::now() + interval;
                    if result["merged_commits"].as_u64().unwrap_or(0) > 0
                        || result["pushed"] == true
                    {
                        tracing::info!(workspace = %slug, %result, "synced");
                    }
                }
                Err(error) => {
                    entry.failures += 1;
                    let backoff = Duration::from_secs(5)
                        .saturating_mul(1 << entry.failures.min(10).saturating_sub(1))
                        .min(interval);
                    entry.next_due = Instant::now() + backoff;
                    tracing::warn!(workspace = %slug, error = %error.message, retry_in_secs = backoff.as_secs(), "sync failed");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_from_urls() {
        assert_eq!(slug_from_url("git@github.com:me/Notes.git"), "notes");
        assert_eq!(slug_from_url("file:///tmp/x/acme-wiki.git/"), "acme-wiki");
        assert_eq!(slug_from_url("https://h/o/my_wiki"), "my-wiki");
    }

    #[test]
    fn urls_are_checked() {
        assert!(check_url("-upload-pack=evil").is_err());
        assert!(check_url("ext::sh -c x").is_err());
        assert!(check_url("file:///tmp/a b").is_err());
        assert!(check_url("https://github.com/me/notes.git").is_ok());
    }
}
