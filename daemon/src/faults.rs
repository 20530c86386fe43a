//! Test-only fault injection, enabled by the `ALEXANDRIA_FAULTS` environment variable
//! (never set it in production). A comma-separated list of:
//! - `delay:<tool>:<ms>`: sleep before running `<tool>`, so a test can act while a call
//!   is in flight (for example kill the daemon). `delay:shutdown:<ms>` makes the last
//!   step of a shutdown slow (the pidfile is still locked), for the stop/start tests.
//! - `delay:swap:<ms>`: sleep before a write swaps its page in (after it planned the
//!   write), so a test can save the page as an editor would in between.
//! - `delay:capture:<ms>`, `delay:capture_commit:<ms>`: sleep after a source capture
//!   chose its file names (before moving the files in), or after it moved them (before
//!   its commit), so a test can put or edit a file there in between.
//! - `delay:record:<ms>`: sleep after a group of writes is committed to git (git's
//!   index lock released), before its SQLite record, so a test can run git in between.
//! - `delay:settle:<ms>`: git's index that group commits left unwritten is written
//!   only after `<ms>` (`commit/settle.rs`), so a test can kill the daemon or use git
//!   while it is held.
//! - `delay:refresh:<ms>`: the watcher's re-index of changed files sleeps while it
//!   holds the workspace's index guard, before it opens its state.db transaction.
//! - `delay:late:<ms>`: the watcher of replaced pages (`commit/late.rs`) looks only
//!   every `<ms>`, so a test can kill the daemon before it notices a late save.
//! - `delay:search-index-commit:<ms>`: sleep before the search index commits a bulk
//!   load (a cold build), so a test can search while it is being built;
//!   `delay:search-wait:<ms>`: how long a search waits for the index (instead of 20 s).
//! - `crash:<point>`: kill the process when execution reaches `<point>` (used by the
//!   write path's crash-safety tests; `search-index-bulk-commit`: before the search
//!   index commits a bulk load). Inside a scope (`in_scope`), `crash:<scope>.<point>`
//!   kills only there: `crash:late.commit_objects` dies after a late save's blob is
//!   written to git, before its commit is (`commit/late.rs`).
//! - `panic:<tool>`: panic inside `<tool>` (the daemon must survive it).
//! - `fail:<point>`: fail with an I/O error when execution reaches `<point>`
//!   (`fail:commit_outside`: committing a version found in place of the planned one).
//! - `off:<feature>`: behave as on a system without `<feature>`: `off:exchange` swaps
//!   pages in as on a file system without an atomic exchange (`commit/place.rs`).

use std::cell::Cell;
use std::sync::OnceLock;
use std::time::Duration;

pub const FAULTS_ENV: &str = "ALEXANDRIA_FAULTS";

#[derive(Debug, Default)]
pub struct Faults {
    delays: Vec<(String, Duration)>,
    crashes: Vec<String>,
    panics: Vec<String>,
    off: Vec<String>,
    failures: Vec<String>,
}

fn faults() -> &'static Faults {
    static FAULTS: OnceLock<Faults> = OnceLock::new();
    FAULTS.get_or_init(|| parse(&std::env::var(FAULTS_ENV).unwrap_or_default()))
}

fn parse(spec: &str) -> Faults {
    let mut faults = Faults::default();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let parts: Vec<&str> = item.split(':').collect();
        match parts.as_slice() {
            ["delay", tool, ms] => {
                if let Ok(ms) = ms.parse() {
                    faults
                        .delays
                        .push((tool.to_string(), Duration::from_millis(ms)));
                }
            }
            ["crash", point] => faults.crashes.push(point.to_string()),
            ["panic", tool] => faults.panics.push(tool.to_string()),
            ["off", feature] => faults.off.push(feature.to_string()),
            ["fail", point] => faults.failures.push(point.to_string()),
            _ => tracing::warn!(item, "ignoring unknown fault"),
        }
    }
    if !spec.is_empty() {
        tracing::warn!(spec, "fault injection is on ({FAULTS_ENV}): test use only");
    }
    faults
}

/// The injected delay before `tool`, if any.
pub fn delay_for(tool: &str) -> Option<Duration> {
    faults()
        .delays
        .iter()
        .find(|(name, _)| name == tool)
        .map(|(_, delay)| *delay)
}

/// An injected I/O error at `point`, if a test asked for one (`fail:<point>`).
pub fn fail_point(point: &str) -> std::io::Result<()> {
    if faults().failures.iter().any(|p| p == point) {
        return Err(std::io::Error::other(format!(
            "injected failure at {point}"
        )));
    }
    Ok(())
}

/// Whether a test asked to behave as if `feature` were missing (`off:<feature>`).
pub fn is_off(feature: &str) -> bool {
    faults().off.iter().any(|f| f == feature)
}

/// Panic here if a test asked for a panic in `tool`.
pub fn panic_point(tool: &str) {
    if faults().panics.iter().any(|t| t == tool) {
        panic!("injected panic in {tool}");
    }
}

thread_local! {
    /// The scope `in_scope` runs this thread in, for `crash:<scope>.<point>`.
    static SCOPE: Cell<Option<&'static str>> = const { Cell::new(None) };
}

/// Run `f` in `scope`: a crash point reached inside also answers to
/// `crash:<scope>.<point>` (a point shared by many paths, crashed on one of them).
pub fn in_scope<T>(scope: &'static str, f: impl FnOnce() -> T) -> T {
    let outer = SCOPE.with(|s| s.replace(Some(scope)));
    let result = f();
    SCOPE.with(|s| s.set(outer));
    result
}

/// Abort the process here if a test asked for a crash at `point`.
pub fn crash_point(point: &str) {
    tracing::trace!(point, "write step");
    let crashes = &faults().crashes;
    if crashes.is_empty() {
        return;
    }
    let scoped = |p: &String| {
        SCOPE.with(Cell::get).is_some_and(|scope| {
            p.strip_prefix(scope)
                .and_then(|rest| rest.strip_prefix('.'))
                == Some(point)
        })
    };
    if crashes.iter().any(|p| p == point || scoped(p)) {
        tracing::error!(point, "injected crash");
        // SIGKILL, like `kill -9`: no unwinding, no destructors, no core dump.
        let _ =
            rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
        std::process::abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_faults() {
        let faults = parse("delay:read:250, crash:after_commit,bogus,off:exchange");
        assert_eq!(faults.off, vec!["exchange".to_string()]);
        assert_eq!(
            faults.delays,
            vec![("read".to_string(), Duration::from_millis(250))]
        );
        assert_eq!(faults.crashes, vec!["after_commit".to_string()]);
    }
}
