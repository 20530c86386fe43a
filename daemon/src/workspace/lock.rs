//! The workspace lock: an in-process condvar plus an `fcntl` lock on `<ws>/.lock`, with
//! the holder's run id written into the lock file for `workspace_busy` errors.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use alexandria_proto::ErrorCode;

use crate::error::{ToolError, ToolResult};

/// In-process half of the workspace lock, with the holder's run id.
#[derive(Default)]
pub struct WorkspaceLock {
    holder: Mutex<Option<String>>,
    released: Condvar,
}

/// Both halves held; released on drop.
pub struct LockGuard<'a> {
    lock: &'a WorkspaceLock,
    file: Option<File>,
}

impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        if let Some(file) = self.file.take() {
            let _ = rustix::fs::fcntl_lock(&file, rustix::fs::FlockOperation::Unlock);
        }
        let mut holder = self.lock.holder.lock().unwrap_or_else(|p| p.into_inner());
        *holder = None;
        self.lock.released.notify_one();
    }
}

fn busy(holder: &str, timeout: Duration) -> ToolError {
    ToolError::new(
        ErrorCode::WorkspaceBusy,
        format!(
            "the workspace is locked by run {holder} and did not become free within {}s",
            timeout.as_secs_f32()
        ),
        "retry in a moment; if it persists, another alexandria process may be stuck (`alexandria mcp status`)",
    )
    .with_detail("holder_run_id", holder)
}

impl WorkspaceLock {
    /// Take the in-process lock, then the fcntl lock on `lock_path`, within `timeout`.
    pub fn acquire(
        &self,
        lock_path: &Path,
        run_id: &str,
        timeout: Duration,
    ) -> ToolResult<LockGuard<'_>> {
        let deadline = Instant::now() + timeout;
        {
            let mut holder = self.holder.lock().unwrap_or_else(|p| p.into_inner());
            while let Some(current) = holder.as_ref() {
                let now = Instant::now();
                if now >= deadline {
                    return Err(busy(current, timeout));
                }
                holder = self
                    .released
                    .wait_timeout(holder, deadline - now)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            *holder = Some(run_id.to_string());
        }
        let mut guard = LockGuard {
            lock: self,
            file: None,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(lock_path)
            .map_err(|e| ToolError::io("opening the workspace lock", e))?;
        let mut pause = Duration::from_micros(200);
        loop {
            match rustix::fs::fcntl_lock(
                &file,
                rustix::fs::FlockOperation::NonBlockingLockExclusive,
            ) {
                Ok(()) => break,
                Err(e) if e == rustix::io::Errno::AGAIN || e == rustix::io::Errno::ACCESS => {
                    if Instant::now() >= deadline {
                        let holder = fs::read_to_string(lock_path).unwrap_or_default();
                        let holder = holder.trim();
                        return Err(busy(
                            if holder.is_empty() { "unknown" } else { holder },
                            timeout,
                        ));
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(20));
                }
                Err(e) => return Err(ToolError::internal("locking the workspace", e)),
            }
        }
        // Record the holder in place, at a fixed size: truncating (or growing and
        // shrinking) the file would make ext4 flush it on close (auto_da_alloc), ~10 ms.
        let mut record = format!("{run_id:<63}").into_bytes();
        record.truncate(63);
        record.push(b'\n');
        let _ = rustix::io::pwrite(&file, &record, 0);
        guard.file = Some(file);
        Ok(guard)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_reports_the_holder_after_the_timeout() {
        let dir = tempfile::tempdir().expect("tempdir");
        let lock = WorkspaceLock::default();
        let path = dir.path().join(".lock");
        let held = lock
            .acquire(&path, "run-a", Duration::from_millis(10))
            .expect("first");
        let error = match lock.acquire(&path, "run-b", Duration::from_millis(50)) {
            Ok(_) => panic!("second acquire must time out"),
            Err(error) => error,
        };
        assert_eq!(error.code, ErrorCode::WorkspaceBusy);
        assert_eq!(error.details["holder_run_id"], "run-a");
        drop(held);
        assert!(
            lock.acquire(&path, "run-c", Duration::from_millis(10))
                .is_ok()
        );
    }
}
