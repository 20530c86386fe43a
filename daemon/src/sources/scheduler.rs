//! The scheduler: a thread that starts a sync for every due source (`next_check` passed,
//! which includes overdue sources at start), each on its own thread, so a slow or
//! failing source never holds up another one, a tool call or a write. Folder sources
//! are also watched: a file notification makes the source due about a second later
//! (after the file has stopped changing).

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use notify::{RecursiveMode, Watcher};
use rusqlite::params;

use super::{Kind, all, folder, source_lock, sync_locked};
use crate::db::now_ms;
use crate::workspace::Store;

/// Most sources synced at the same time.
const MAX_PARALLEL: usize = 4;
/// Longest sleep between two looks at the schedule.
const TICK: Duration = Duration::from_secs(1);

fn waker() -> &'static Mutex<Option<Sender<()>>> {
    static WAKER: OnceLock<Mutex<Option<Sender<()>>>> = OnceLock::new();
    WAKER.get_or_init(Default::default)
}

/// Look at the schedule now (a source was added, a secret set).
pub fn wake() {
    if let Some(sender) = waker().lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
        let _ = sender.send(());
    }
}

/// Start the scheduler thread (once per process).
pub fn spawn(store: Arc<Store>) {
    let (sender, receiver) = mpsc::channel();
    *waker().lock().unwrap_or_else(|p| p.into_inner()) = Some(sender.clone());
    let spawned = std::thread::Builder::new()
        .name("sources".into())
        .spawn(move || run(&store, &sender, &receiver));
    if let Err(error) = spawned {
        tracing::error!(%error, "cannot start the source scheduler");
    }
}

fn run(store: &Arc<Store>, sender: &Sender<()>, receiver: &Receiver<()>) {
    let running = Arc::new(AtomicUsize::new(0));
    let (event_sender, events) = mpsc::channel::<notify::Result<notify::Event>>();
    let wake_on_event = sender.clone();
    let mut watcher = crate::workspace::watcher(move |event| {
        let _ = event_sender.send(event);
        let _ = wake_on_event.send(());
    })
    .map_err(|error| tracing::warn!(%error, "no file notifications for folder sources"))
    .ok();
    let mut watched: HashMap<PathBuf, i64> = HashMap::new();
    let mut poked: HashMap<i64, Instant> = HashMap::new();
    loop {
        let sources = match store
            .pool
            .get()
            .map_err(|e| e.to_string())
            .and_then(|c| all(&c, None).map_err(|e| e.to_string()))
        {
            Ok(sources) => sources,
            Err(error) => {
                tracing::error!(%error, "the source scheduler cannot read the sources");
                std::thread::sleep(TICK);
                continue;
            }
        };
        // Watch folders of new sources; forget removed ones.
        let folders: HashMap<PathBuf, i64> = sources
            .iter()
            .filter(|s| s.kind == Kind::Folder)
            .filter_map(|s| s.config.targets.first().map(|t| (PathBuf::from(t), s.id)))
            .collect();
        if let Some(watcher) = watcher.as_mut() {
            for path in watched.keys().filter(|p| !folders.contains_key(*p)) {
                let _ = watcher.unwatch(path);
            }
            watched.retain(|p, _| folders.contains_key(p));
            for (path, id) in &folders {
                if !watched.contains_key(path) {
                    match watcher.watch(path, RecursiveMode::Recursive) {
                        Ok(()) => {
                            watched.insert(path.clone(), *id);
                        }
                        Err(error) => {
                            tracing::warn!(%error, folder = %path.display(), "cannot watch")
                        }
                    }
                }
            }
        }
        // A notification makes its folder due once the file has settled.
        let mut due_soon = HashSet::new();
        while let Ok(event) = events.try_recv() {
            let Ok(event) = event else { continue };
            if matches!(event.kind, notify::EventKind::Access(_)) {
                continue;
            }
            for path in &event.paths {
                if let Some((_, id)) = watched.iter().find(|(root, _)| path.starts_with(root)) {
                    due_soon.insert(*id);
                }
            }
        }
        if !due_soon.is_empty()
            && let Ok(connection) = store.pool.get()
        {
            let at = now_ms() + (folder::STABLE.as_millis() as i64) + 100;
            for id in due_soon {
                if poked
                    .get(&id)
                    .is_some_and(|t| t.elapsed() < Duration::from_millis(300))
                {
                    continue;
                }
                poked.insert(id, Instant::now());
                let _ = connection.execute(
                    "UPDATE sources SET next_check = ?2 WHERE id = ?1 AND (next_check IS NULL OR next_check > ?2)",
                    params![id, at],
                );
            }
        }
        // Start every due source that is not already syncing.
        let now = now_ms();
        let mut next_due: Option<i64> = None;
        for source in sources {
            let due_at = source.next_check.unwrap_or(0);
            if due_at > now {
                next_due = Some(next_due.map_or(due_at, |n: i64| n.min(due_at)));
                continue;
            }
            if running.load(Ordering::SeqCst) >= MAX_PARALLEL {
                break;
            }
            let lock = source_lock(source.id);
            if lock.try_lock().is_err() {
                continue; // a manual sync runs
            }
            running.fetch_add(1, Ordering::SeqCst);
            let store = Arc::clone(store);
            let counter = Arc::clone(&running);
            let wake_when_done = sender.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("source-{}", source.id))
                .spawn(move || {
                    {
                        let Ok(_guard) = lock.try_lock() else {
                            counter.fetch_sub(1, Ordering::SeqCst);
                            return;
                        };
                        // Re-read under the lock: a manual sync may just have run.
                        let current = store
                            .pool
                            .get()
                            .ok()
                            .and_then(|c| super::by_id(&c, source.id).ok().flatten());
                        if let Some(current) = current
                            && current.next_check.unwrap_or(0) <= now_ms()
                        {
                            let report = sync_locked(&store, &current);
                            tracing::info!(
                                workspace = %report.workspace,
                                source = %report.name,
                                new = report.new,
                                captured = report.captured.len(),
                                error = report.error.as_deref().unwrap_or(""),
                                "source synced"
                            );
                        }
                    }
                    counter.fetch_sub(1, Ordering::SeqCst);
                    let _ = wake_when_done.send(());
                });
            if spawned.is_err() {
                running.fetch_sub(1, Ordering::SeqCst);
            }
        }
        let wait = next_due
            .map(|at| {
                Duration::from_millis((at - now_ms()).clamp(10, TICK.as_millis() as i64) as u64)
            })
            .unwrap_or(TICK);
        match receiver.recv_timeout(wait) {
            Ok(()) | Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        // Coalesce a burst of wake-ups.
        while receiver.try_recv().is_ok() {}
    }
}
