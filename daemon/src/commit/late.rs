//! Saves that land in a page's replaced file after the write (issue 20).
//!
//! An editor that opened the page before a write swapped it out may put its save into
//! the file it still holds open (a save in place), which is no longer the page. The
//! write looks at that file until its commit; a save that lands later would be lost.
//! So the replaced file stays open for a grace period after the write (`GRACE`, at
//! most `MAX_WATCHED` files, one thread polling `fstat`, and a last comparison of the
//! bytes when the period ends). A save found there is committed as an outside edit
//! (history names the commit that holds the text before it) and put in place, unless
//! the page changed since: a newer version is never overwritten; the late save is then
//! committed and the page's current version committed again on top, so that HEAD
//! matches the page and history names both.
//!
//! While its replaced files are watched, a run's directory is kept as
//! `runs/.late-<run_id>` (it holds them under their `swap-…` names and the run's
//! manifest): if the daemon dies within the grace period, recovery (`recover`) commits
//! a save that landed in one of them after the write, as the watcher would have.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, LazyLock, Mutex};
use std::time::{Duration, Instant};

use super::*;

/// How long a replaced file is watched after the write.
pub const GRACE: Duration = Duration::from_secs(3);
/// Most replaced files watched at once (open file descriptors); the oldest goes first.
const MAX_WATCHED: usize = 256;
const POLL: Duration = Duration::from_millis(20);

/// A replaced file watched after its write.
pub struct Watch {
    manifest: Manifest,
    /// Rev of what the write put in place.
    placed: Option<String>,
    replaced: place::Replaced,
    until: Instant,
    /// The run's directory, kept while its replaced files are watched.
    kept: Option<Arc<KeptDir>>,
}

/// Name prefix of a run's directory kept while its replaced files are watched.
pub(crate) const KEPT_PREFIX: &str = ".late-";

/// A run's directory kept for the watch (`runs/.late-<run_id>`); removed when the last
/// watch of the run ends.
pub(crate) struct KeptDir(PathBuf);

impl Drop for KeptDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A committed run's directory is done with: removed, or, while the files its swaps
/// replaced are watched (`watches`), kept as `runs/.late-<run_id>` for recovery. A run
/// directory without a manifest (a late commit's) gets the watched run's.
pub(super) fn finish_run(dir: &Path, watches: &mut [Watch]) {
    let Some(first) = watches.first() else {
        let _ = fs::remove_dir_all(dir);
        return;
    };
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let kept = if name.starts_with(KEPT_PREFIX) {
        dir.to_path_buf()
    } else {
        dir.with_file_name(format!("{KEPT_PREFIX}{name}"))
    };
    if load_manifest(dir).is_none() {
        let mut manifest = first.manifest.clone();
        manifest.state = RunState::Prepared;
        let _ = save_manifest(dir, &manifest);
    }
    let moved = if kept == dir {
        Ok(())
    } else {
        fs::rename(dir, &kept)
    };
    match moved {
        Ok(()) => {
            let kept = Arc::new(KeptDir(kept));
            for watch in watches {
                watch.kept = Some(Arc::clone(&kept));
            }
        }
        Err(error) => {
            tracing::warn!(dir = %dir.display(), %error, "cannot keep a run's directory for the watch of its replaced files");
            let _ = fs::remove_dir_all(dir);
        }
    }
}

/// Recovery of a run that was committed and recorded, whose directory a crash left:
/// kept as `runs/.late-<run_id>` when its swaps replaced files (a save may have landed
/// in one after the commit; `recover` looks), else removed.
pub(super) fn keep_for_recovery(dir: &Path) {
    if kept_versions(dir).is_empty() {
        let _ = fs::remove_dir_all(dir);
        return;
    }
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if fs::rename(dir, dir.with_file_name(format!("{KEPT_PREFIX}{name}"))).is_err() {
        let _ = fs::remove_dir_all(dir);
    }
}

/// Recovery: commit the saves that landed, after their write, in the files that runs
/// of a daemon that died had replaced (kept in `runs/.late-<run_id>`), then remove
/// those directories. Runs before serving, after the interrupted runs are completed.
pub(crate) fn recover(store: &Store, workspace: &str, report: &mut Vec<String>) {
    let runs = store.workspace_dir(workspace).join("runs");
    let Ok(entries) = fs::read_dir(&runs) else {
        return;
    };
    let mut dirs: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(KEPT_PREFIX))
        .map(|e| e.path())
        .collect();
    dirs.sort();
    let mut history = History::default();
    for dir in dirs {
        match recover_dir(store, workspace, &dir, &mut history) {
            Ok((n, watches)) => {
                if n > 0 {
                    report.push(format!(
                        "{workspace}: committed {n} save(s) found in files replaced by {}",
                        dir.display()
                    ));
                }
                if !watches.is_empty() {
                    // The directory goes when their watch ends (`KeptDir`).
                    for watch in watches {
                        watch_after_recovery(watch);
                    }
                    continue;
                }
            }
            Err(error) => {
                tracing::error!(workspace, dir = %dir.display(), %error, "cannot commit the saves found in a run's replaced files");
                report.push(format!(
                    "{workspace}: cannot commit what {} holds: {error}",
                    dir.display()
                ));
                continue;
            }
        }
        let _ = fs::remove_dir_all(&dir);
    }
}

/// One kept directory: every replaced file whose text git does not have (and that is
/// not a text the run itself put in place) was saved into after the write. Returns how
/// many saves were committed, and the watches of the replaced files for a grace period
/// from now: an editor that held one open across the restart may save into it yet
/// (such a save was lost when the directory was removed at once).
fn recover_dir(
    store: &Store,
    workspace: &str,
    dir: &Path,
    history: &mut History,
) -> ToolResult<(usize, Vec<Watch>)> {
    let Some(mut manifest) = load_manifest(dir) else {
        return Ok((0, Vec::new()));
    };
    // The workspace may have been renamed since.
    manifest.workspace = workspace.to_string();
    // Opened before their bytes are read: a save that lands from here on is one the
    // watch sees.
    let opened: Vec<(PathBuf, place::Replaced)> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with("swap-") || name.starts_with("back-")
        })
        .filter_map(|e| place::Replaced::open(&e.path()).ok().map(|r| (e.path(), r)))
        .collect();
    let kept = kept_versions(dir);
    let ours: std::collections::HashSet<&str> = kept
        .iter()
        .filter(|k| !k.back)
        .map(|k| k.placed.as_str())
        .chain(manifest.new_rev.as_deref())
        .collect();
    let root = store.workspace_dir(workspace);
    let state = store.state(workspace);
    // What the run's commit put there: a late save goes in place only over that.
    let commit: Option<String> = {
        let connection = store.pool.get()?;
        connection
            .query_row(
                "SELECT commit_id FROM runs WHERE workspace = ?1 AND run_id = ?2",
                rusqlite::params![workspace, manifest.run_id],
                |r| r.get(0),
            )
            .optional()?
            .flatten()
    };
    let (late, placed) = state.with_repo(&root, |repo| -> ToolResult<_> {
        let run_commit = commit
            .as_deref()
            .and_then(|c| git2::Oid::from_str(c).ok())
            .and_then(|oid| repo.find_commit(oid).ok());
        let at_path = |commit: &git2::Commit<'_>| {
            commit
                .tree()
                .ok()
                .and_then(|t| t.get_path(Path::new(&manifest.path)).ok())
                .map(|e| e.id())
        };
        let placed = run_commit.as_ref().and_then(at_path);
        // What the run replaced first: the version before its commit.
        let before = run_commit
            .as_ref()
            .and_then(|c| c.parent(0).ok())
            .as_ref()
            .and_then(at_path);
        let mut late = Vec::new();
        for k in kept.iter().filter(|k| k.swapped()) {
            let rev = revision(&k.bytes);
            if ours.contains(rev.as_str()) || manifest.old_rev.as_deref() == Some(rev.as_str()) {
                continue;
            }
            let Ok(blob) = git2::Oid::from_str(&rev) else {
                continue;
            };
            if before == Some(blob) {
                continue;
            }
            // In git's object store is not committed: a daemon killed inside the
            // commit of this very save (its blob written, its commit not) left the
            // blob behind, unreachable. Only history counts.
            if repo.find_blob(blob).is_ok()
                && history
                    .holds(
                        repo,
                        &manifest.path,
                        blob,
                        run_commit.as_ref().map(|c| c.id()),
                    )
                    .map_err(git2_error)?
            {
                continue;
            }
            late.push(k.bytes.clone());
        }
        Ok((late, placed.map(|id| id.to_string())))
    })?;
    let mut placed = placed;
    let until = Instant::now() + GRACE;
    let mut watches = Vec::new();
    for bytes in &late {
        tracing::warn!(workspace, path = %manifest.path, run = %manifest.run_id, "recovery found a save made into a file a write replaced, after the write; committing it");
        let (now_in_place, replaced) =
            commit_late(store, &manifest, placed.as_deref(), bytes, until)?;
        if now_in_place.is_some() {
            placed = now_in_place;
        }
        watches.extend(replaced);
    }
    let swapped: std::collections::HashSet<&Path> = kept
        .iter()
        .filter(|k| k.swapped())
        .map(|k| k.path.as_path())
        .collect();
    let kept_dir = Arc::new(KeptDir(dir.to_path_buf()));
    watches.extend(
        opened
            .into_iter()
            .filter(|(path, _)| swapped.contains(path.as_path()))
            .map(|(_, replaced)| Watch {
                manifest: manifest.clone(),
                placed: placed.clone(),
                replaced,
                until,
                kept: Some(Arc::clone(&kept_dir)),
            }),
    );
    Ok((late.len(), watches))
}

/// The versions HEAD's first-parent history holds at a path, read once per path
/// while recovery goes through the kept directories of a workspace, and only as far
/// down as a question needs.
#[derive(Default)]
struct History {
    paths: std::collections::HashMap<String, Walked>,
}

#[derive(Default)]
struct Walked {
    /// Where the walk goes on from (None: at the root).
    next: Option<git2::Oid>,
    begun: bool,
    /// The commits walked, with how many came before each.
    commits: std::collections::HashMap<git2::Oid, usize>,
    blobs: std::collections::HashSet<git2::Oid>,
}

/// How many commits below a run's own commit still count: the outside versions its
/// write committed before it, and the runs of its group.
const BELOW_RUN: usize = RECOVERY_DEPTH;
/// Most commits walked for one path (about 10 µs each).
const MOST_WALKED: usize = 200_000;

impl History {
    /// Whether HEAD's history holds `blob` at `path`, from HEAD down past the run's
    /// commit `run` (`BELOW_RUN` more; the run's commit unknown: `RECOVERY_DEPTH`).
    fn holds(
        &mut self,
        repo: &git2::Repository,
        path: &str,
        blob: git2::Oid,
        run: Option<git2::Oid>,
    ) -> Result<bool, git2::Error> {
        let walked = self.paths.entry(path.to_string()).or_default();
        if !walked.begun {
            walked.begun = true;
            walked.next = Some(repo.head()?.peel_to_commit()?.id());
        }
        loop {
            if walked.blobs.contains(&blob) {
                return Ok(true);
            }
            let depth = match run {
                None => RECOVERY_DEPTH,
                Some(run) => match walked.commits.get(&run) {
                    Some(at) => at + 1 + BELOW_RUN,
                    None => MOST_WALKED,
                },
            };
            if walked.commits.len() >= depth.min(MOST_WALKED) {
                return Ok(false);
            }
            let Some(id) = walked.next else {
                return Ok(false);
            };
            let commit = repo.find_commit(id)?;
            let at = walked.commits.len();
            walked.commits.insert(id, at);
            if let Ok(entry) = commit.tree()?.get_path(Path::new(path)) {
                walked.blobs.insert(entry.id());
            }
            walked.next = commit.parent_id(0).ok();
        }
    }
}

impl Watch {
    pub(super) fn new(
        manifest: &Manifest,
        placed: Option<String>,
        replaced: place::Replaced,
    ) -> Self {
        Watch {
            manifest: manifest.clone(),
            placed,
            replaced,
            until: Instant::now() + GRACE,
            kept: None,
        }
    }
}

static STARTED: AtomicBool = AtomicBool::new(false);
static WATCHED: LazyLock<(Mutex<VecDeque<Watch>>, Condvar)> = LazyLock::new(Default::default);

/// Watch a replaced file for the grace period (if the watcher runs). Past
/// `MAX_WATCHED` files, the oldest ones' periods end now (each gets its last look).
pub(super) fn watch(watch: Watch) {
    if !STARTED.load(Ordering::Acquire) {
        return;
    }
    let (queue, wake) = &*WATCHED;
    let mut queue = queue.lock().unwrap_or_else(|p| p.into_inner());
    let over = (queue.len() + 1).saturating_sub(MAX_WATCHED);
    let now = Instant::now();
    for oldest in queue.iter_mut().take(over) {
        oldest.until = oldest.until.min(now);
    }
    queue.push_back(watch);
    wake.notify_one();
}

/// Start the thread that watches replaced files. It runs for the life of the process.
pub fn spawn(store: Arc<Store>) {
    STARTED.store(true, Ordering::Release);
    let spawned = std::thread::Builder::new()
        .name("late-saves".into())
        .spawn(move || run(&store));
    if let Err(error) = spawned {
        STARTED.store(false, Ordering::Release);
        tracing::error!(%error, "cannot start the watcher of replaced pages");
    }
}

fn run(store: &Store) {
    let (queue, wake) = &*WATCHED;
    loop {
        {
            let mut watched = queue.lock().unwrap_or_else(|p| p.into_inner());
            while watched.is_empty() {
                watched = wake.wait(watched).unwrap_or_else(|p| p.into_inner());
            }
        }
        std::thread::sleep(crate::faults::delay_for("late").unwrap_or(POLL));
        let due: Vec<Watch> = {
            let mut watched = queue.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            let (due, keep): (Vec<Watch>, Vec<Watch>) = watched
                .drain(..)
                .partition(|w| w.until <= now || w.replaced.touched());
            watched.extend(keep);
            due
        };
        for mut watch in due {
            let expired = watch.until <= Instant::now();
            let changed = if expired {
                watch.replaced.reread()
            } else {
                watch.replaced.refresh(true)
            };
            match changed {
                Ok(true) => {}
                Ok(false) if expired => continue,
                Ok(false) => {
                    watch_again(watch);
                    continue;
                }
                Err(error) => {
                    tracing::warn!(path = %watch.manifest.path, %error, "cannot read a replaced page");
                    continue;
                }
            }
            let Some(bytes) = watch.replaced.bytes.clone() else {
                continue;
            };
            let committed = crate::faults::in_scope("late", || {
                commit_late(
                    store,
                    &watch.manifest,
                    watch.placed.as_deref(),
                    &bytes,
                    watch.until,
                )
            });
            match committed {
                Ok((placed, replaced)) => {
                    if let Some(placed) = placed {
                        watch.placed = Some(placed);
                    }
                    // What putting the save in place replaced may be open in an editor too.
                    for file in replaced {
                        watch_again(file);
                    }
                }
                Err(error) => {
                    tracing::error!(path = %watch.manifest.path, run = %watch.manifest.run_id, %error, "cannot commit a save found in a replaced page");
                }
            }
            // The editor may still be writing into it, or save into it again.
            if !expired {
                watch_again(watch);
            }
        }
    }
}

/// Watch a replaced file that recovery found, whether or not the watcher runs yet
/// (recovery comes before it starts; it takes the queue as it finds it).
fn watch_after_recovery(watch: Watch) {
    watch_again(watch);
    WATCHED.1.notify_one();
}

fn watch_again(watch: Watch) {
    let (queue, _) = &*WATCHED;
    queue
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push_back(watch);
}

/// What `commit_late` did: the rev it put in place (if it did) and the watches of the
/// files its swaps replaced (watched until `until`).
type LateDone = (Option<String>, Vec<Watch>);

/// Commit `bytes`, saved into the file the run replaced, as an outside edit, and put
/// it in place if the page is still what the run put there (`placed`).
fn commit_late(
    store: &Store,
    manifest: &Manifest,
    placed: Option<&str>,
    bytes: &[u8],
    until: Instant,
) -> ToolResult<LateDone> {
    // A late save is committed as found, never with the run's write applied again on
    // top (its text and payload stay out of the kept manifest, as when they were files
    // of the run's directory only).
    let manifest = &Manifest {
        text: None,
        payload: None,
        ..manifest.clone()
    };
    let workspace = &manifest.workspace;
    let state = store.state(workspace);
    let holder = format!("{}-late", manifest.run_id);
    let lock = lock_workspace(store, &state, workspace, &holder)?;
    let index = state.index_lock.lock().unwrap_or_else(|p| p.into_inner());
    let root = store.workspace_dir(workspace);
    let target = root.join(&manifest.path);
    // Where the swaps below keep what they replace (a save just now, committed too):
    // a kept directory from the start, with the run's manifest, so that recovery
    // commits what a crash before the commit would leave only there (`recover`).
    let dir = run_dir(
        store,
        workspace,
        &format!("{KEPT_PREFIX}{holder}-{}", uuid::Uuid::new_v4().simple()),
    );
    fs::create_dir_all(&dir).map_err(|e| io_error("creating a run directory", e))?;
    let mut kept_manifest = manifest.clone();
    kept_manifest.state = RunState::Prepared;
    save_manifest(&dir, &kept_manifest)?;
    let changed = Cell::new(false);
    let timeout = git_lock_timeout(store);
    let result = state.with_repo(&root, |repo| -> ToolResult<_> {
        let mut session = git::Session::begin(repo, timeout).map_err(git_error)?;
        let mut page = Page::new(
            &mut session,
            manifest,
            &root,
            &target,
            &dir,
            &changed,
            false,
        );
        page.committed = page
            .session
            .repo()
            .head()
            .ok()
            .and_then(|h| h.peel_to_tree().ok())
            .and_then(|t| t.get_path(Path::new(&manifest.path)).ok())
            .map(|e| e.id().to_string());
        page.reason = Reason::Late;
        let on_disk = fs::read(&target).ok();
        let disk = rev_of(on_disk.as_deref());
        page.commit_outside(Some(bytes))?;
        let now_in_place = if disk.is_some() && disk.as_deref() == placed {
            page.put_back(Some(bytes.to_vec()), disk)?;
            Some(revision(bytes))
        } else {
            // Changed since the write: that newer version stays, and is committed on
            // top so that HEAD matches the page.
            page.reason = Reason::Newer;
            let op = if on_disk.is_some() {
                "outside_edit"
            } else {
                "outside_delete"
            };
            if page.committed != disk {
                page.commit_version(
                    on_disk.as_deref(),
                    op,
                    "The page had changed since the write whose replaced file an editor saved \
                     into; that late save is committed just before, and the page's current \
                     version stays in place.",
                )?;
            }
            None
        };
        let outside = std::mem::take(&mut page.outside);
        let replaced = std::mem::take(&mut page.late);
        let finished = session.finish().map_err(git_error)?;
        // Commits made again on top of a branch someone moved meanwhile.
        let outside = super::follow(outside, &finished);
        Ok((outside, finished.durable, now_in_place, replaced))
    });
    let (outside, _durable, now_in_place, replaced) = match result {
        Ok(done) => done,
        Err(error) => {
            // What its swaps replaced stays for recovery (`recover`), if anything.
            if kept_versions(&dir).is_empty() {
                let _ = fs::remove_dir_all(&dir);
            }
            return Err(error);
        }
    };
    let mut watches: Vec<Watch> = replaced
        .into_iter()
        .filter(place::Replaced::is_open)
        .map(|file| Watch {
            manifest: manifest.clone(),
            placed: now_in_place.clone().or_else(|| placed.map(str::to_string)),
            replaced: file,
            until,
            kept: None,
        })
        .collect();
    finish_run(&dir, &mut watches);
    let mut connection = store.pool.get()?;
    let transaction = crate::db::write_transaction(&mut connection)?;
    record(&transaction, &root, manifest, None, &outside, now_ms())?;
    index::index_or_forget(&transaction, workspace, &manifest.path, &target)?;
    transaction.commit()?;
    drop(index);
    drop(lock);
    tracing::info!(path = %manifest.path, run = %manifest.run_id, put_in_place = now_in_place.is_some(), "committed a save found in the file a write replaced");
    store.changed(workspace, &manifest.path);
    flush_to_disk(store, workspace)?;
    Ok((now_in_place, watches))
}
