//! Picks up files changed behind the daemon's back (an editor, `git pull`, a sync
//! tool): file-system notifications (inotify / FSEvents via `notify`) trigger a
//! re-index of just the changed paths, and a full stat rescan runs periodically as a
//! safety net in case notifications are lost (a known failure mode of watchers).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use notify::{RecursiveMode, Watcher};

use crate::index;
use crate::workspace::Store;

/// Full rescan interval while notifications work (a stat walk: about 1 s of CPU at
/// 100k pages), and when they do not.
const SAFETY_RESCAN: Duration = Duration::from_secs(300);
const FALLBACK_RESCAN: Duration = Duration::from_secs(1);
/// Events are gathered this long before they are applied (editors write in bursts).
const DEBOUNCE: Duration = Duration::from_millis(100);

/// Start the watcher thread. It runs for the life of the process.
pub fn spawn(store: Arc<Store>) {
    let spawned = std::thread::Builder::new()
        .name("watch".into())
        .spawn(move || run(&store));
    if let Err(error) = spawned {
        tracing::error!(%error, "cannot start the file watcher");
    }
}

fn run(store: &Store) {
    let (sender, receiver) = mpsc::channel();
    let mut watcher = match crate::workspace::watcher(sender) {
        Ok(watcher) => Some(watcher),
        Err(error) => {
            tracing::warn!(%error, "no file notifications; rescanning every second instead");
            None
        }
    };
    let mut watched: HashSet<String> = HashSet::new();
    // Workspaces appearing since start, with their last fingerprint.
    let mut arriving: HashMap<String, String> = HashMap::new();
    let mut first_round = true;
    let mut last_full = Instant::now();
    loop {
        // Watch workspaces created since the last round.
        let mut rescan_every = SAFETY_RESCAN;
        for slug in store.list_workspaces() {
            if watched.contains(&slug) {
                continue;
            }
            // A workspace state.db does not know (a new state.db, a folder copied or
            // cloned in by hand) gets its history from git first, once git is done
            // writing it (a clone in progress is looked at again next round).
            let root = store.workspace_dir(&slug);
            if !super::rebuild::settled(&root) {
                continue;
            }
            // A folder that appeared while we run and that state.db does not know is
            // being copied or cloned in: adopt it once it stops changing.
            if !first_round && !super::rebuild::known(store, &slug).unwrap_or(true) {
                let print = super::rebuild::fingerprint(&root);
                if arriving.get(&slug) != Some(&print) {
                    arriving.insert(slug.clone(), print);
                    continue;
                }
            }
            arriving.remove(&slug);
            if let Err(error) = super::rebuild::ensure_history(store, &slug) {
                tracing::warn!(workspace = %slug, %error, "cannot rebuild history from git");
            }
            let ok = watcher.as_mut().is_some_and(|w| {
                ["raw", "wiki"].iter().all(|layer| {
                    w.watch(
                        &store.workspace_dir(&slug).join(layer),
                        RecursiveMode::Recursive,
                    )
                    .map_err(|error| tracing::warn!(workspace = %slug, %error, "cannot watch"))
                    .is_ok()
                })
            });
            if ok {
                tracing::debug!(workspace = %slug, "watching");
                // Whatever changed before the watch began (while the daemon was down,
                // or since the workspace was created) is caught up now.
                if let Err(error) = index::catch_up(store, &slug) {
                    tracing::warn!(workspace = %slug, %error, "catch-up failed");
                }
                watched.insert(slug);
            } else {
                rescan_every = FALLBACK_RESCAN;
            }
        }
        first_round = false;
        // Pages a hand `git commit` dropped from HEAD or git's index (a stat and a ref
        // read per workspace unless one of them changed).
        for slug in &watched {
            super::restore::check(store, slug, false);
        }
        // Wake at least every second to watch new workspaces.
        let wait = rescan_every
            .saturating_sub(last_full.elapsed())
            .min(Duration::from_secs(1));
        let first = match receiver.recv_timeout(wait) {
            Ok(event) => Some(event),
            Err(RecvTimeoutError::Timeout) if last_full.elapsed() < rescan_every => continue,
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => {
                watcher = None;
                std::thread::sleep(FALLBACK_RESCAN);
                None
            }
        };
        let Some(first) = first else {
            full_rescan(store);
            last_full = Instant::now();
            continue;
        };
        let mut events = vec![first];
        let deadline = Instant::now() + DEBOUNCE;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match receiver.recv_timeout(left) {
                Ok(event) => events.push(event),
                Err(_) => break,
            }
        }
        apply(store, events);
    }
}

fn full_rescan(store: &Store) {
    for slug in store.list_workspaces() {
        // Workspaces state.db does not know yet are adopted by the watch loop.
        if !super::rebuild::known(store, &slug).unwrap_or(false) {
            continue;
        }
        match index::catch_up(store, &slug) {
            Ok(result) if result.indexed + result.removed > 0 => {
                tracing::info!(workspace = %slug, ?result, "rescan found changes");
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(workspace = %slug, %error, "rescan failed"),
        }
    }
}

/// Group event paths by workspace and re-index them; a folder that appeared or went
/// away is caught up under it (its pages may have come or gone without an event of
/// their own); a lost event makes every workspace do a full catch-up.
fn apply(store: &Store, events: Vec<notify::Result<notify::Event>>) {
    let workspaces_dir = store.home.workspaces_dir();
    let mut paths: HashMap<String, HashSet<String>> = HashMap::new();
    // Folders that appeared or went away (made, moved in or out, copied in): what is
    // under them is caught up, as no event may come for it.
    let mut folders: HashMap<String, HashSet<String>> = HashMap::new();
    let mut everything = false;
    for event in events {
        let event = match event {
            Ok(event) => event,
            Err(error) => {
                tracing::warn!(%error, "file notification error; rescanning");
                everything = true;
                continue;
            }
        };
        if event.need_rescan() {
            everything = true;
        }
        // Opening or reading a file changes nothing, and the daemon's own indexing
        // reads every file: 100k events after a cold index at 100k pages.
        if matches!(event.kind, notify::EventKind::Access(_)) {
            continue;
        }
        for path in event.paths {
            let Some((slug, relative)) = split(&workspaces_dir, &path) else {
                continue;
            };
            match std::fs::symlink_metadata(&path) {
                Ok(metadata) if metadata.is_dir() => {
                    folders.entry(slug).or_default().insert(relative);
                }
                Ok(_) => {
                    paths.entry(slug).or_default().insert(relative);
                }
                // Gone: a file, or a folder whose pages the catalogue still has.
                Err(_) => {
                    folders
                        .entry(slug.clone())
                        .or_default()
                        .insert(relative.clone());
                    paths.entry(slug).or_default().insert(relative);
                }
            }
        }
    }
    if everything {
        full_rescan(store);
        return;
    }
    for (slug, relatives) in &folders {
        // A folder inside another one of the set is walked with it.
        let mut relatives: Vec<&String> = relatives.iter().collect();
        relatives.sort();
        let mut last: Option<&String> = None;
        for relative in relatives {
            if last.is_some_and(|l| relative.starts_with(&format!("{l}/"))) {
                continue;
            }
            last = Some(relative);
            if let Err(error) = index::catch_up_under(store, slug, relative) {
                tracing::warn!(workspace = %slug, folder = %relative, %error, "catch-up failed");
            }
        }
    }
    for (slug, relatives) in paths {
        let relatives: Vec<String> = relatives.into_iter().collect();
        if let Err(error) = index::refresh_paths(store, &slug, &relatives) {
            tracing::warn!(workspace = %slug, %error, "re-index failed");
        }
    }
}

/// `<workspaces>/<slug>/<raw|wiki>/…` → (slug, `raw/…`); None for anything else,
/// including hidden files (temporary files of editors and of alexandria itself).
fn split(workspaces_dir: &Path, path: &Path) -> Option<(String, String)> {
    let relative = path.strip_prefix(workspaces_dir).ok()?;
    let mut components = relative.components();
    let slug = components.next()?.as_os_str().to_str()?.to_string();
    let rest: PathBuf = components.collect();
    let rest = rest.to_str()?.to_string();
    if !(rest.starts_with("raw/") || rest.starts_with("wiki/")) {
        return None;
    }
    if rest
        .split('/')
        .any(|c| c.starts_with('.') || c.ends_with('~'))
    {
        return None;
    }
    Some((slug, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_map_to_workspaces() {
        let base = Path::new("/h/workspaces");
        assert_eq!(
            split(base, Path::new("/h/workspaces/acme/wiki/a/b.md")),
            Some(("acme".into(), "wiki/a/b.md".into()))
        );
        for ignored in [
            "/h/workspaces/acme/.git/index",
            "/h/workspaces/acme/runs/x/final",
            "/h/workspaces/acme/wiki/.b.md.alx-tmp-1",
            "/h/workspaces/acme/wiki/b.md~",
            "/h/state.db",
        ] {
            assert_eq!(split(base, Path::new(ignored)), None, "{ignored}");
        }
    }
}
