//! Quick calls on the async worker, with their slow parts handed off (issue 15, part 3).
//!
//! Tool bodies block (SQLite, files, git). A call of `read`, `search` or `guide` is
//! mostly a stat, an SQLite look-up and a small read (tens of microseconds), and
//! `block_in_place` (handing the worker's other tasks to another thread for the
//! duration) cost about 30 µs of it in thread switches: the quick tools therefore run
//! on the worker that took the request (`run_inline`), and every place in them that
//! can wait (a catch-up of the whole workspace, re-indexing a file changed on disk, the
//! search index still being built, an SQLite pool with every connection out, the
//! repository held by a write group, a listing across folders, a large file) goes
//! through `section`, which hands the worker's tasks off first, as before. Every section
//! hands off again: after a short one tokio may give the thread its worker's core back,
//! and a later wait holding it would stall every task queued there (two searches
//! waiting for a cold build this way held up every other call for 8 s, one run in
//! three, before this was so). Outside a quick call `section` just runs its closure.
//!
//! May import: nothing of the crate (below `db`).

use std::cell::Cell;

thread_local! {
    /// This thread is a runtime worker running a quick call inline.
    static INLINE: Cell<bool> = const { Cell::new(false) };
}

/// Run `work` here, on the runtime worker that polls the caller, marked so that its
/// `section`s hand the worker's other tasks off before they wait.
pub fn run_inline<T>(work: impl FnOnce() -> T) -> T {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            INLINE.with(|inline| inline.set(self.0));
        }
    }
    let _reset = Reset(INLINE.with(|inline| inline.replace(true)));
    work()
}

/// Whether this thread runs a quick call inline.
pub fn is_inline() -> bool {
    INLINE.with(Cell::get)
}

/// Run `work`, which may wait (a lock, a long read, a catch-up): inside a quick call,
/// after handing the worker's other tasks to another thread (`block_in_place`), so the
/// runtime never stalls behind it; elsewhere just run it.
pub fn section<T>(work: impl FnOnce() -> T) -> T {
    if !is_inline() {
        return work();
    }
    // `block_in_place` hands the worker's tasks off only while this thread holds the
    // worker's core: after a short section it may have taken the core back (tokio
    // reclaims it when the thread it was handed to has not started yet), so every
    // section of the call hands off again; without the core it just runs `work`.
    match tokio::runtime::Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(work)
        }
        _ => work(),
    }
}

/// A connection from `pool`: at once when one is free, else waited for in a `section`.
pub fn checkout<M: r2d2::ManageConnection>(
    pool: &r2d2::Pool<M>,
) -> Result<r2d2::PooledConnection<M>, r2d2::Error> {
    match pool.try_get() {
        Some(connection) => Ok(connection),
        None => section(|| pool.get()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_hand_off_inside_a_quick_call_and_keep_it_marked() {
        assert!(!is_inline());
        // Outside a quick call (no runtime here): the closure just runs.
        assert_eq!(section(|| 7), 7);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .expect("runtime");
        let marks = runtime.block_on(async {
            tokio::spawn(async {
                run_inline(|| {
                    let before = is_inline();
                    // A short section, then another: each hands off again (the
                    // first may have taken the worker's core back).
                    let first = section(is_inline);
                    let second = section(is_inline);
                    (before, first, second, is_inline())
                })
            })
            .await
            .expect("task")
        });
        assert_eq!(marks, (true, true, true, true));
        assert!(!is_inline());
    }

    #[test]
    fn the_mark_is_reset_when_the_call_panics() {
        let result = std::panic::catch_unwind(|| run_inline(|| panic!("boom")));
        assert!(result.is_err());
        assert!(!is_inline());
    }
}
