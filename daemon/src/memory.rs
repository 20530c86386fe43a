//! Keeping a long-running daemon's memory flat (issue 15, part 4).
//!
//! glibc's malloc gives each thread that allocates an arena of its own (up to 8 per
//! core) and hands freed memory inside an arena back to the system only when asked.
//! The daemon's tool calls run on a blocking pool of up to 32 threads, so after a busy
//! spell every one of them held freed memory: `alexandria-bench --soak 90` at 10k pages
//! left the daemon at +143 % of its RSS after the cold index, and idling did not give
//! any of it back. Two arenas and a trim once the daemon has gone quiet keep it flat.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::context::Inflight;
use crate::workspace::Store;

/// How often the daemon looks whether it has gone quiet.
const QUIET_CHECK: Duration = Duration::from_secs(10);
/// How long after its last request the daemon keeps trimming: the database pool closes
/// connections idle for 30 s within the next 30 (`db::open`), and their caches are
/// freed only then.
const TRIM_AFTER_ACTIVITY: Duration = Duration::from_secs(90);

/// At most two malloc arenas, whatever the number of threads. Call early: arenas
/// already made stay.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn limit_arenas() {
    // SAFETY: mallopt takes two integers and has no precondition; glibc changes the
    // setting under its own lock, and it is read only when an arena is created.
    #[allow(unsafe_code)]
    let accepted = unsafe { libc::mallopt(libc::M_ARENA_MAX, 2) };
    if accepted != 1 {
        tracing::debug!("malloc did not accept M_ARENA_MAX");
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn limit_arenas() {}

/// Hand freed memory inside malloc's arenas back to the system.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn release() {
    let started = Instant::now();
    // SAFETY: malloc_trim takes no pointer and has no precondition; it walks glibc's
    // own arenas under their locks.
    #[allow(unsafe_code)]
    let released = unsafe { libc::malloc_trim(0) };
    tracing::debug!(
        released,
        ms = started.elapsed().as_secs_f64() * 1e3,
        "freed memory handed back"
    );
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn release() {
    let _ = Instant::now();
}

/// Every `QUIET_CHECK` while no request is in flight, if one was answered within
/// `TRIM_AFTER_ACTIVITY`: let go of the copies of git's indexes kept for the next write
/// (`gitindex::release_cached`), the trees kept for the next commit
/// (`gittree::release_cached`), the names kept of big folders
/// (`names::release_cached`), the kept zlib compressors (`loose::release_cached`) and
/// the workspaces' open repositories (libgit2's
/// object caches: `Store::release_repositories`), and trim (on the blocking pool: it
/// takes a few milliseconds). Once per quiet spell (a whole `QUIET_CHECK` without a
/// call finishing), the workspaces that gathered many loose objects are packed
/// (`workspace::pack`) on a thread of their own, while the trims go on. An idle daemon
/// does nothing.
pub async fn release_when_quiet(inflight: Arc<Inflight>, store: Arc<Store>) {
    let mut seen = inflight.finished();
    let mut active = None;
    let mut packed_after = seen;
    loop {
        tokio::time::sleep(QUIET_CHECK).await;
        let finished = inflight.finished();
        // No call finished over the last check's interval.
        let still = finished == seen;
        if !still {
            seen = finished;
            active = Some(Instant::now());
        }
        let recent = active.is_some_and(|at| at.elapsed() <= TRIM_AFTER_ACTIVITY);
        if recent && inflight.count() == 0 {
            // The copies of git's indexes kept for the next write go first.
            crate::workspace::gitindex::release_cached();
            crate::workspace::gittree::release_cached();
            crate::workspace::names::release_cached();
            crate::workspace::loose::release_cached();
            // Packing costs a process and, after an import, seconds of one core: only
            // after a whole interval without a call, once per quiet spell.
            let pack = still && packed_after != seen;
            if pack {
                packed_after = seen;
            }
            let kept = Arc::clone(&store);
            let _ = tokio::task::spawn_blocking(move || {
                kept.release_repositories();
                release();
            })
            .await;
            if pack {
                pack_in_background(Arc::clone(&store));
            }
        }
    }
}

/// A pack is running (at most one per daemon).
static PACKING: AtomicBool = AtomicBool::new(false);

/// The packing thread's nice value, and so `git repack`'s (Linux's nice is per thread,
/// and a child starts with its parent thread's).
const PACK_NICE: i32 = 19;

/// Pack on a thread of its own: after an import it takes a minute, and the trims of the
/// quiet spell must go on meanwhile (awaited here, it held them back: what the
/// database pool's connections closed in that minute freed stayed with the daemon; at
/// 100k pages after 180 s of mixed load and 75 s idle, 37.4 MiB anonymous, 22.4 with
/// the trims going on).
fn pack_in_background(store: Arc<Store>) {
    if PACKING.swap(true, Ordering::AcqRel) {
        return;
    }
    struct Done;
    impl Drop for Done {
        fn drop(&mut self) {
            PACKING.store(false, Ordering::Release);
        }
    }
    let spawned = std::thread::Builder::new()
        .name("alexandria-pack".into())
        .spawn(move || {
            let _done = Done;
            // `git repack` inherits this thread's nice value: after an import it keeps
            // a core busy for a minute, and calls made meanwhile come first.
            if let Err(error) = rustix::process::setpriority_process(None, PACK_NICE) {
                tracing::debug!(%error, "cannot lower the packing thread's priority");
            }
            pack_workspaces(&store);
            // What packing allocated (the workspaces' names, git's output) goes back.
            release();
        });
    if let Err(error) = spawned {
        PACKING.store(false, Ordering::Release);
        tracing::warn!(%error, "cannot start a thread to pack loose objects");
    }
}

/// Pack the loose objects of every workspace that gathered enough of them.
fn pack_workspaces(store: &Store) {
    for slug in store.list_workspaces() {
        let root = store.workspace_dir(&slug);
        match crate::workspace::pack::pack_if_needed(&root) {
            Ok(packed) => tracing::debug!(workspace = %slug, ?packed, "packing checked"),
            // No git: logged once by `pack`.
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => {
                tracing::warn!(workspace = %slug, %error, "cannot pack the loose objects")
            }
        }
    }
}
