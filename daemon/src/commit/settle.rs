//! git's index that group commits left unwritten (`git::Session::defer_index`) is
//! written once the workspace's writes pause (issue 15).
//!
//! Rewriting git's index is most of what a write pays besides its own files: the whole
//! file is rewritten and flushed when a page is created (880 KB at 10k pages, 10 MB at
//! 100k). A group commit leaves it unwritten and keeps `.git/index.lock` (so nobody
//! reads the old index meanwhile); the next group goes on from there. The settler
//! thread writes it `QUIET` after the last group, or `AT_MOST` after the first one that
//! left it under a steady stream of writes, under the workspace's index guard; then,
//! if writes are still coming, the next one waits `GAP` so git by hand can get in. What
//! else reads git's index settles first (`now`): a sync's merge, a rename or archive,
//! the check for pages a hand commit dropped, the daemon's stop. After a crash,
//! recovery stages what the index missed (`git::stage_last_commit`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, LazyLock, Mutex};
use std::time::{Duration, Instant};

use crate::workspace::WorkspaceState;
use crate::workspace::git;

/// How long a workspace's writes must pause before its index is written.
const QUIET: Duration = Duration::from_millis(20);
/// Longest an index stays unwritten under a steady stream of writes.
const AT_MOST: Duration = Duration::from_secs(1);
/// When a settle failed (a full disk): when to try again.
const RETRY: Duration = Duration::from_secs(1);
/// After an index written under a steady stream of writes (`AT_MOST`), how long the
/// next group waits before it takes `.git/index.lock` again: a gap for git by hand.
/// Without it the next group took the lock within microseconds, and a person's
/// `git add` retried every few ms for 10 s never got in (the kill loop, 1 round in 40).
const GAP: Duration = Duration::from_millis(10);

struct Unsettled {
    state: Arc<WorkspaceState>,
    due: Instant,
    /// Due at `AT_MOST`, not after a pause: writes are still coming.
    streaming: bool,
}

#[derive(Default)]
struct Settler {
    /// By workspace directory.
    due: Mutex<HashMap<PathBuf, Unsettled>>,
    changed: Condvar,
}

/// The settler, its thread started on first use (None: it could not start; indexes are
/// then written at once).
static SETTLER: LazyLock<Option<Arc<Settler>>> = LazyLock::new(|| {
    let settler = Arc::new(Settler::default());
    let run = Arc::clone(&settler);
    std::thread::Builder::new()
        .name("settle-index".into())
        .spawn(move || run.run())
        .map_err(|error| tracing::warn!(%error, "cannot start the thread that writes git's index"))
        .ok()
        .map(|_| settler)
});

/// Whether a group may leave git's index unwritten (the settler is running).
pub(crate) fn may_defer() -> bool {
    SETTLER.is_some()
}

/// A group left the index of the workspace at `root` unwritten since `since`: write it
/// once writes pause.
pub(crate) fn later(state: &Arc<WorkspaceState>, root: &Path, since: Instant) {
    let Some(settler) = SETTLER.as_ref() else {
        now(state, root);
        return;
    };
    // A test can hold the index unwritten (`delay:settle:<ms>`).
    let (quiet, at_most) = match crate::faults::delay_for("settle") {
        Some(delay) => (delay, delay),
        None => (QUIET, AT_MOST),
    };
    let after_pause = Instant::now() + quiet;
    let due = after_pause.min(since + at_most);
    let mut map = settler.due.lock().unwrap_or_else(|p| p.into_inner());
    map.insert(
        root.to_path_buf(),
        Unsettled {
            state: Arc::clone(state),
            due,
            streaming: due < after_pause,
        },
    );
    settler.changed.notify_one();
}

/// Write the index the workspace's groups left unwritten, now. The caller holds the
/// workspace's index guard. Returns false if it could not (logged; the settler tries
/// again).
pub(crate) fn now_locked(repo: &git2::Repository) -> bool {
    match git::settle(repo) {
        Ok(_) => true,
        Err(error) => {
            tracing::warn!(%error, path = %repo.path().display(), "cannot write git's index");
            false
        }
    }
}

/// `now_locked`, taking the workspace's index guard.
pub(crate) fn now(state: &WorkspaceState, root: &Path) -> bool {
    let _index = state.index_lock.lock().unwrap_or_else(|p| p.into_inner());
    state
        .with_repo(root, |repo| Ok::<bool, git2::Error>(now_locked(repo)))
        .unwrap_or(false)
}

/// `now` for the settler. When the writes are still coming (`streaming`, or a write
/// held the guard when the settle came: a group took longer than `QUIET`) and the lock
/// was last free for a while (`last_free`) `AT_MOST` ago or more, the index guard is
/// kept `GAP` longer once git's lock is released (the writes queued behind it wait),
/// so that git by hand can take it: at most one such wait a second.
fn written(
    state: &WorkspaceState,
    root: &Path,
    streaming: bool,
    last_free: &mut Option<Instant>,
) -> bool {
    let (_index, busy) = match state.index_lock.try_lock() {
        Ok(guard) => (guard, false),
        Err(std::sync::TryLockError::Poisoned(p)) => (p.into_inner(), false),
        Err(std::sync::TryLockError::WouldBlock) => (
            state.index_lock.lock().unwrap_or_else(|p| p.into_inner()),
            true,
        ),
    };
    let done = state
        .with_repo(root, |repo| Ok::<bool, git2::Error>(now_locked(repo)))
        .unwrap_or(false);
    if !done {
        return false;
    }
    let now = Instant::now();
    if !(streaming || busy) {
        // The writes paused: the lock stays free until the next one.
        *last_free = Some(now);
    } else if last_free.is_none_or(|free| now.saturating_duration_since(free) >= AT_MOST) {
        std::thread::sleep(GAP);
        *last_free = Some(now);
    }
    true
}

/// Write every index left unwritten (the daemon stops), waiting at most `limit`: work
/// still running may hold a workspace's index guard while it waits for state.db's
/// write lock, which the stop keeps from its clean stamp until the process exits
/// (`db::mark_clean`), so it may not give the guard back before its busy timeout. An
/// index left unwritten then is caught up at the next start, as after a crash. Returns
/// whether every index was written in time.
pub fn all_within(limit: Duration) -> bool {
    if SETTLER
        .as_ref()
        .is_none_or(|s| s.due.lock().unwrap_or_else(|p| p.into_inner()).is_empty())
    {
        return true;
    }
    let (done, finished) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("settle-stop".into())
        .spawn(move || {
            all();
            let _ = done.send(());
        });
    if spawned.is_err() {
        all();
        return true;
    }
    if finished.recv_timeout(limit).is_ok() {
        return true;
    }
    tracing::warn!(
        "git's index of a workspace is held by work still running; it is caught up at the next start"
    );
    false
}

/// Write every index left unwritten.
fn all() {
    let Some(settler) = SETTLER.as_ref() else {
        return;
    };
    let due: Vec<(PathBuf, Unsettled)> = settler
        .due
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .drain()
        .collect();
    for (root, unsettled) in due {
        now(&unsettled.state, &root);
    }
}

impl Settler {
    fn run(&self) {
        // When git's index lock was last left free for a while, by workspace.
        let mut free: HashMap<PathBuf, Instant> = HashMap::new();
        let mut map = self.due.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let clock = Instant::now();
            let ready: Vec<PathBuf> = map
                .iter()
                .filter(|(_, u)| u.due <= clock)
                .map(|(root, _)| root.clone())
                .collect();
            if ready.is_empty() {
                let wait = map
                    .values()
                    .map(|u| u.due.saturating_duration_since(clock))
                    .min()
                    .unwrap_or(Duration::from_secs(3600));
                map = self
                    .changed
                    .wait_timeout(map, wait)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
                continue;
            }
            let taken: Vec<(PathBuf, Unsettled)> = ready
                .into_iter()
                .filter_map(|root| map.remove(&root).map(|u| (root, u)))
                .collect();
            drop(map);
            for (root, unsettled) in taken {
                let mut last_free = free.get(&root).copied();
                let done = written(&unsettled.state, &root, unsettled.streaming, &mut last_free);
                if let Some(at) = last_free {
                    free.insert(root.clone(), at);
                }
                if !done && root.exists() {
                    let mut map = self.due.lock().unwrap_or_else(|p| p.into_inner());
                    map.entry(root).or_insert(Unsettled {
                        state: unsettled.state,
                        due: Instant::now() + RETRY,
                        streaming: false,
                    });
                }
            }
            map = self.due.lock().unwrap_or_else(|p| p.into_inner());
        }
    }
}
