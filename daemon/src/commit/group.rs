//! Group commit (issue 15): writes to one workspace that queue for it are committed
//! together.
//!
//! A write stages its payload (no lock), then hands the part that needs the lock (read
//! the page, check the plan, prepare the run: a `Prepare`) to the workspace's queue.
//! The first writer that finds nobody leading becomes the leader: it takes the
//! workspace lock, takes every job queued at that moment (up to `MAX_GROUP`) and, in
//! queue order, prepares each one and commits it on top of the previous one — one git
//! commit per write, so history and runs keep a commit id per write — all inside one
//! git session (`.git/index.lock` taken once, git's index written once). Then one
//! SQLite transaction records every run, the lock is released and one flush makes the
//! whole group durable (one `syncfs`, or with `[write] flush_files` an fsync of each file
//! and folder the group wrote: `Durable`). Only then is each writer answered; jobs queued meanwhile form
//! the next group under a new leader.
//!
//! Writers that were answered together send their next writes a little apart, so the
//! first of them would lead a group of one while the rest queue behind it, and groups
//! settle into two cohorts that take turns (1 and 7 of 8 writers, or 4 and 4: two group
//! costs per round, as strace of the 8-writer benchmark showed). So a leader, while
//! writers are active, expects the writers the last group answered plus those that
//! were queued when it ended, and waits for them a little (a quarter of the last
//! group's time, at most `MAX_GATHER`) before it takes the queue: `gather_until`. The
//! cohorts then merge into one group.
//!
//! A job that fails (a plan that no longer holds, `stale_plan`, a full disk) is answered
//! with its error and undone alone; the others go on. If the group's SQLite transaction
//! fails, every run of the group is rolled back: HEAD's branch returns to where the
//! group began, with outside versions found meanwhile committed again, so nothing is
//! half-applied and no version is lost.

use std::cell::Cell;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::fs;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, LazyLock, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use alexandria_proto::ErrorCode;

use super::*;

/// Most jobs one group takes (bounds how long the first of them waits).
const MAX_GROUP: usize = 64;

/// Longest a leader waits for the writers of the last group to queue again.
const MAX_GATHER: Duration = Duration::from_millis(4);

/// Writers count as active while the last group ended less than this long ago.
const ACTIVE: Duration = Duration::from_millis(250);

/// The part of a write that runs with the workspace lock held: read and check the
/// page, write `final` and the `prepared` manifest. It runs on the leader's thread,
/// inside the workspace's open repository (so it must not call `with_repo`).
pub(crate) type Prepare = Box<dyn FnOnce(&Store) -> ToolResult<Manifest> + Send>;

struct Job {
    run_id: String,
    prepare: Prepare,
    cleanup: RunDirCleanup,
    ticket: Arc<Ticket>,
}

/// Where a writer finds its answer.
#[derive(Default)]
struct Ticket {
    result: Mutex<Option<ToolResult<Completed>>>,
}

impl Ticket {
    fn set(&self, result: ToolResult<Completed>) {
        let mut slot = self.result.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(result);
        }
    }

    fn take(&self) -> Option<ToolResult<Completed>> {
        self.result.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    fn is_set(&self) -> bool {
        self.result
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }
}

#[derive(Default)]
struct Queue {
    state: Mutex<QueueState>,
    /// A group ended, or the leader stepped down.
    changed: Condvar,
    /// A job was queued (what a gathering leader waits for).
    arrived: Condvar,
}

#[derive(Default)]
struct QueueState {
    jobs: VecDeque<Job>,
    leading: bool,
    /// The last group: how many jobs, how many were queued when it ended, when it
    /// ended, how long it took.
    last: Option<LastGroup>,
}

#[derive(Clone, Copy, Debug)]
struct LastGroup {
    jobs: usize,
    queued_after: usize,
    ended: Instant,
    took: Duration,
}

/// How many jobs a leader waits for, and until when, before taking the queue: the
/// writers the last group answered and those queued when it ended, if it ended less
/// than `ACTIVE` ago, for a quarter of its time (at most `MAX_GATHER`) from now. None:
/// take what is queued.
fn gather_until(last: Option<LastGroup>, queued: usize, now: Instant) -> Option<(usize, Instant)> {
    let last = last?;
    let wanted = (last.jobs + last.queued_after).min(MAX_GROUP);
    if queued >= wanted || now.saturating_duration_since(last.ended) >= ACTIVE {
        return None;
    }
    Some((wanted, now + (last.took / 4).min(MAX_GATHER)))
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One queue per workspace directory.
static QUEUES: LazyLock<Mutex<HashMap<PathBuf, Arc<Queue>>>> = LazyLock::new(Default::default);

fn queue_of(store: &Store, workspace: &str) -> Arc<Queue> {
    let mut queues = QUEUES.lock().unwrap_or_else(|p| p.into_inner());
    Arc::clone(queues.entry(store.workspace_dir(workspace)).or_default())
}

/// Commit a staged run: `prepare` runs with the workspace lock held, then the run is
/// committed with whatever else is queued, and this returns once the group is
/// durable. `T` is whatever `prepare` hands back to its caller besides the manifest.
pub(crate) fn submit<T: Send + 'static>(
    store: &Store,
    workspace: &str,
    run_id: &str,
    cleanup: RunDirCleanup,
    prepare: impl FnOnce(&Store) -> ToolResult<(Manifest, T)> + Send + 'static,
) -> ToolResult<(Completed, T)> {
    let extra: Arc<Mutex<Option<T>>> = Arc::new(Mutex::new(None));
    let slot = Arc::clone(&extra);
    let prepare: Prepare = Box::new(move |store: &Store| {
        let (manifest, value) = prepare(store)?;
        *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(value);
        Ok(manifest)
    });
    let completed = run(store, workspace, run_id, cleanup, prepare)?;
    let value = extra
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
        .ok_or_else(|| ToolError::internal("group commit", "the prepared value is missing"))?;
    Ok((completed, value))
}

fn run(
    store: &Store,
    workspace: &str,
    run_id: &str,
    cleanup: RunDirCleanup,
    prepare: Prepare,
) -> ToolResult<Completed> {
    let queue = queue_of(store, workspace);
    let ticket = Arc::new(Ticket::default());
    {
        let mut state = queue.lock();
        state.jobs.push_back(Job {
            run_id: run_id.to_string(),
            prepare,
            cleanup,
            ticket: Arc::clone(&ticket),
        });
        queue.arrived.notify_one();
        loop {
            if let Some(result) = ticket.take() {
                return result;
            }
            if !state.leading {
                state.leading = true;
                break;
            }
            state = queue.changed.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }
    // Lead until this writer's own job is done (it may sit behind a full group).
    while !ticket.is_set() {
        let gathering = Instant::now();
        let jobs: Vec<Job> = {
            let mut state = queue.lock();
            if let Some((wanted, deadline)) =
                gather_until(state.last, state.jobs.len(), Instant::now())
            {
                while state.jobs.len() < wanted {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    state = queue
                        .arrived
                        .wait_timeout(state, left)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            }
            let n = state.jobs.len().min(MAX_GROUP);
            state.jobs.drain(..n).collect()
        };
        if jobs.is_empty() {
            break;
        }
        let size = jobs.len();
        let began = Instant::now();
        let tickets: Vec<Arc<Ticket>> = jobs.iter().map(|j| Arc::clone(&j.ticket)).collect();
        let outcome =
            std::panic::catch_unwind(AssertUnwindSafe(|| commit_group(store, workspace, jobs)));
        let ended = Instant::now();
        let phases = outcome.as_ref().copied().unwrap_or_default();
        let us = |d: Duration| d.as_micros() as u64;
        tracing::debug!(
            jobs = size,
            gathered_us = us(began.saturating_duration_since(gathering)),
            took_us = us(ended.saturating_duration_since(began)),
            lock_us = us(phases.lock),
            prepare_us = us(phases.prepare),
            commit_us = us(phases.commit),
            finish_us = us(phases.finish),
            record_us = us(phases.record),
            flush_us = us(phases.flush),
            "group committed"
        );
        if outcome.is_err() {
            for ticket in &tickets {
                ticket.set(Err(ToolError::internal(
                    "group commit",
                    "the commit of this write's group crashed",
                )));
            }
        }
        let mut state = queue.lock();
        let queued_after = state.jobs.len();
        state.last = Some(LastGroup {
            jobs: size,
            queued_after,
            ended,
            took: ended.saturating_duration_since(began),
        });
        queue.changed.notify_all();
    }
    let mut state = queue.lock();
    state.leading = false;
    queue.changed.notify_all();
    drop(state);
    ticket.take().unwrap_or_else(|| {
        Err(ToolError::internal(
            "group commit",
            "the write was not committed",
        ))
    })
}

/// A job of the group that reached the commit.
struct Member {
    manifest: Manifest,
    cleanup: RunDirCleanup,
    ticket: Arc<Ticket>,
    /// Commit and rev, or why not.
    done: ToolResult<(String, Option<String>)>,
    outside: Vec<OutsideVersion>,
    /// What the run's swaps replaced, watched after the write (`late.rs`).
    watch: Vec<late::Watch>,
}

/// Where a group's time went (the debug line of each group).
#[derive(Clone, Copy, Debug, Default)]
struct Phases {
    /// Waiting for the workspace lock (and git's index guard).
    lock: Duration,
    /// The jobs' `prepare`, together (with the check for pages a hand commit dropped).
    prepare: Duration,
    /// Their commits (git's lock, objects, trees, the page in place), together.
    commit: Duration,
    /// The git session's end: git's index written, the branch moved.
    finish: Duration,
    /// The SQLite transaction.
    record: Duration,
    flush: Duration,
}

/// Lock, prepare and commit each job, write git's index, record, flush, answer.
fn commit_group(store: &Store, workspace: &str, jobs: Vec<Job>) -> Phases {
    let mut phases = Phases::default();
    let mut clock = Instant::now();
    let mut lap = move || {
        let now = Instant::now();
        let took = now.saturating_duration_since(clock);
        clock = now;
        took
    };
    let state = store.state(workspace);
    let holder = jobs.first().map(|j| j.run_id.clone()).unwrap_or_default();
    let lock = match lock_workspace(store, &state, workspace, &holder) {
        Ok(lock) => lock,
        Err(error) => {
            for job in jobs {
                job.ticket.set(Err(error.clone()));
            }
            return phases;
        }
    };
    let root = store.workspace_dir(workspace);
    let index_guard = state.index_lock.lock().unwrap_or_else(|p| p.into_inner());
    phases.lock = lap();
    // Pages a hand `git commit` dropped since the last group go back first.
    super::restore::check(store, workspace, true);
    let timeout = git_lock_timeout(store);
    let mut members: Vec<Member> = Vec::new();
    let mut start: Option<git2::Oid> = None;
    let committed = state.with_repo(&root, |repo| -> ToolResult<Durable> {
        start = repo.head().ok().and_then(|h| h.target());
        let mut session: Option<git::Session<'_>> = None;
        let mut refused: Option<ToolError> = None;
        let count = jobs.len();
        for (at, job) in jobs.into_iter().enumerate() {
            if let Some(error) = &refused {
                job.ticket.set(Err(error.clone()));
                continue;
            }
            let prepared = (job.prepare)(store);
            phases.prepare += lap();
            let manifest = match prepared {
                Ok(manifest) => manifest,
                Err(error) => {
                    job.ticket.set(Err(error));
                    continue;
                }
            };
            crash_point("after_prepare");
            let dir = run_dir(store, workspace, &manifest.run_id);
            if session.is_none() {
                match git::Session::begin(repo, timeout) {
                    Ok(mut begun) => {
                        // git's index is written once writes pause (`settle`).
                        if super::settle::may_defer() {
                            begun.defer_index();
                        }
                        session = Some(begun);
                    }
                    Err(error) => {
                        // Nothing was changed: the run is dropped, and so is the rest.
                        let error = git_error(error);
                        let _ = fs::remove_dir_all(&dir);
                        job.ticket.set(Err(error.clone()));
                        refused = Some(error);
                        continue;
                    }
                }
            }
            let Some(open) = session.as_mut() else {
                continue;
            };
            // The objects of every write but the last are written on another thread
            // while the next write is committed.
            open.write_objects_later(at + 1 < count);
            let changed = Cell::new(false);
            let (done, outside, watch) =
                commit_page(open, &root, &manifest, &dir, &changed, false);
            phases.commit += lap();
            if let Err(error) = &done
                && error.code != ErrorCode::StalePlan
                && changed.get()
            {
                tracing::error!(run = %manifest.run_id, %error, "write failed; rolling back");
                if let Err(undo_error) = undo(open, &root, &manifest) {
                    tracing::error!(run = %manifest.run_id, error = %undo_error, "roll back failed");
                }
                if let Some(trash) = &manifest.trash_path {
                    let _ = fs::remove_file(root.join(trash));
                }
            }
            if done.is_err() {
                let _ = fs::remove_dir_all(&dir);
            }
            members.push(Member {
                manifest,
                cleanup: job.cleanup,
                ticket: job.ticket,
                done,
                outside,
                watch,
            });
        }
        let Some(session) = session else {
            return Ok(Durable::default());
        };
        let finished = session.finish().map_err(git_error);
        phases.finish = lap();
        let finished = finished?;
        // Commits made again on top of a branch someone moved meanwhile.
        for member in &mut members {
            if let Ok((commit, _)) = &mut member.done {
                *commit = finished.id(commit);
            }
            member.outside = follow(std::mem::take(&mut member.outside), &finished);
        }
        Ok(finished.durable)
    });
    crash_point("after_commit");
    if let Some(delay) = crate::faults::delay_for("record") {
        std::thread::sleep(delay);
    }
    lap();
    let recorded = committed.and_then(|durable| {
        let mut connection = store.pool.get()?;
        let transaction = crate::db::write_transaction(&mut connection)?;
        let now = now_ms();
        for member in &members {
            record(
                &transaction,
                &root,
                &member.manifest,
                member.done.as_ref().ok(),
                &member.outside,
                now,
            )?;
        }
        transaction.commit()?;
        Ok(durable)
    });
    phases.record = lap();
    let mut durable = match recorded {
        Ok(durable) => durable,
        Err(error) => {
            roll_back_group(store, &root, start, &members);
            drop(index_guard);
            drop(lock);
            for member in members {
                member.ticket.set(match member.done {
                    Err(stale) => Err(stale),
                    Ok(_) => Err(error.clone()),
                });
            }
            return phases;
        }
    };
    drop(index_guard);
    crash_point("after_index");
    for member in &mut members {
        if member.done.is_ok() {
            // Kept while the files its swaps replaced are watched (`late.rs`).
            let dir = run_dir(store, workspace, &member.manifest.run_id);
            late::finish_run(&dir, &mut member.watch);
            store.changed(workspace, &member.manifest.path);
            page_written(&mut durable, &root, &member.manifest);
        }
    }
    durable.file(wal_file(store));
    drop(lock);
    crash_point("before_flush");
    lap();
    let flushed = if store.config.write.flush_files {
        durable.flush().map_err(|e| io_error("flushing to disk", e))
    } else {
        flush_to_disk(store, workspace)
    };
    phases.flush = lap();
    crash_point("after_flush");
    if let Some(since) = git::index_held_since(&root.join(".git")) {
        super::settle::later(&state, &root, since);
    }
    for member in members {
        drop(member.cleanup);
        for watch in member.watch {
            late::watch(watch);
        }
        member.ticket.set(match (member.done, &flushed) {
            (Err(error), _) => Err(error),
            (Ok(_), Err(error)) => Err(error.clone()),
            (Ok((commit, rev)), Ok(())) => Ok(Completed {
                commit,
                rev,
                durable: Durable::default(),
            }),
        });
    }
    phases
}

/// The group's SQLite transaction failed: undo every run of the group. HEAD's branch
/// goes back to where the group began and the outside versions found meanwhile are
/// committed again on top (they are on no disk but in git); every page the group
/// touched becomes HEAD's version again, and so does its index entry.
fn roll_back_group(store: &Store, root: &Path, start: Option<git2::Oid>, members: &[Member]) {
    let timeout = git_lock_timeout(store);
    let ours: BTreeSet<&str> = members.iter().map(|m| m.manifest.run_id.as_str()).collect();
    let outside: BTreeSet<String> = members
        .iter()
        .flat_map(|m| m.outside.iter().map(|o| o.commit.clone()))
        .collect();
    let workspace = members.first().map(|m| m.manifest.workspace.as_str());
    let Some(workspace) = workspace else {
        return;
    };
    let result = store
        .state(workspace)
        .with_repo(root, |repo| -> Result<(), git::GitError> {
            let mut session = git::Session::begin(repo, timeout)?;
            // The group's commits, newest first, down to where it began.
            let mut found = Vec::new();
            let mut reached = false;
            let mut cursor = session.tip()?;
            for _ in 0..(4 * MAX_GROUP + 8) {
                if Some(cursor.id()) == start {
                    reached = true;
                    break;
                }
                let mine = cursor
                    .message()
                    .is_ok_and(|m| ours.iter().any(|run| message::names_run(m, run)));
                if !mine && !outside.contains(&cursor.id().to_string()) {
                    break;
                }
                found.push(cursor.clone());
                match cursor.parent(0) {
                    Ok(parent) => cursor = parent,
                    Err(_) => break,
                }
            }
            if reached {
                session.reset_soft(&cursor)?;
                for version in found.iter().rev() {
                    if !outside.contains(&version.id().to_string()) {
                        continue;
                    }
                    let parent_tree = version.parent(0)?.tree()?;
                    let tree = version.tree()?;
                    let diff = repo.diff_tree_to_tree(Some(&parent_tree), Some(&tree), None)?;
                    let mut paths = Vec::new();
                    for delta in diff.deltas() {
                        if let Some(path) = delta.new_file().path().and_then(|p| p.to_str()) {
                            paths.push(path.to_string());
                        }
                    }
                    let changes: Vec<git::Change<'_>> = paths
                        .iter()
                        .map(|path| git::Change {
                            path,
                            content: match tree.get_path(Path::new(path)) {
                                Ok(entry) => git::Content::Blob(entry.id()),
                                Err(_) => git::Content::Gone,
                            },
                            stat: None,
                        })
                        .collect();
                    session.commit(&changes, version.message().unwrap_or(""), &version.author())?;
                }
            } else {
                // Someone moved HEAD meanwhile: undo what is on top, run by run.
                for member in members.iter().rev() {
                    undo(&mut session, root, &member.manifest)?;
                }
            }
            let head = session.tip()?.tree()?;
            for member in members {
                let path = &member.manifest.path;
                match head.get_path(Path::new(path)) {
                    Ok(entry) => {
                        let blob = repo.find_blob(entry.id())?;
                        put_back_before(root, &member.manifest, Some(blob.content()));
                    }
                    Err(_) => put_back_before(root, &member.manifest, None),
                }
                session.stage_head_version(path)?;
            }
            session.finish()?;
            Ok(())
        });
    if let Err(error) = result {
        tracing::error!(%error, "rolling back a group of writes failed");
    }
    for member in members {
        if let Some(trash) = &member.manifest.trash_path {
            let _ = fs::remove_file(root.join(trash));
        }
        let _ = fs::remove_dir_all(run_dir(store, workspace, &member.manifest.run_id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last(jobs: usize, ago_ms: u64, took_ms: u64, now: Instant) -> Option<LastGroup> {
        Some(LastGroup {
            jobs,
            queued_after: 0,
            ended: now - Duration::from_millis(ago_ms),
            took: Duration::from_millis(took_ms),
        })
    }

    #[test]
    fn a_leader_waits_for_the_writers_of_the_last_group_only_while_they_are_active() {
        let now = Instant::now();
        // No group yet, or a lone writer: nothing to wait for.
        assert_eq!(gather_until(None, 1, now), None);
        assert_eq!(gather_until(last(1, 1, 20, now), 1, now), None);
        // Eight writers answered together, one is back: wait for the other seven, a
        // quarter of the last group's 12 ms.
        assert_eq!(
            gather_until(last(8, 1, 12, now), 1, now),
            Some((8, now + Duration::from_millis(3)))
        );
        // A slow group: the wait is bounded.
        assert_eq!(
            gather_until(last(8, 1, 400, now), 3, now),
            Some((8, now + MAX_GATHER))
        );
        // All are back already, or the writers went quiet.
        assert_eq!(gather_until(last(8, 1, 12, now), 8, now), None);
        assert_eq!(gather_until(last(8, 300, 12, now), 1, now), None);
        // Two cohorts of four taking turns: the one queued waits for the one answered.
        let turns = last(4, 1, 12, now).map(|l| LastGroup {
            queued_after: 4,
            ..l
        });
        assert_eq!(gather_until(turns, 4, now).map(|(n, _)| n), Some(8));
        // Never more than a group holds.
        assert_eq!(
            gather_until(last(500, 1, 8, now), 1, now).map(|(n, _)| n),
            Some(MAX_GROUP)
        );
    }
}
