//! Packing a workspace's loose objects once the daemon has gone quiet.
//!
//! Every write adds its blob, the trees on its page's path and its commit as loose
//! objects (`loose`), and big folders' trees are stored uncompressed: a folder of 2,000
//! pages adds an 86 KB tree per write. libgit2 never runs git's `gc --auto`, so unless
//! the user ran git by hand, nothing ever packed them: a workspace grew by tens of
//! kilobytes per write, for ever. When the daemon goes quiet, a workspace holding
//! `LOOSE_FROM` loose objects or more is packed with `git repack -d` (reachable loose
//! objects into one new pack, delta-compressed, then the loose copies that pack holds
//! removed), and one holding more than `PACKS_FROM` packs is packed into one with
//! `git repack -A -d`.
//!
//! Neither takes the workspace lock, and neither can lose an object a concurrent write
//! or a hand `git commit` relies on: `-d` removes only loose objects the new pack holds,
//! and `-A` writes the unreachable objects of the packs it replaces out loose again
//! rather than dropping them (no prune: nothing is ever deleted that is not kept
//! elsewhere). A write that finds its object loose freshens it, as git does
//! (`loose::write`), so a `git gc` run by hand does not prune it under the write.
//! Without `git` on the PATH nothing is packed (logged once).

use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// git's own threshold for `gc --auto` is 6,700 loose objects; a write here makes 3–6
/// (its blob, the trees on its path, its commit), so this is some 500 writes.
const LOOSE_FROM: usize = 2_000;
/// git's `gc.autoPackLimit` is 50.
const PACKS_FROM: usize = 16;
/// A repack that takes longer is stopped (it leaves only a temporary pack, which the
/// next one replaces).
const TIMEOUT: Duration = Duration::from_secs(600);

/// What `pack_if_needed` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Packed {
    Nothing,
    Loose { before: usize, after: usize },
    Packs { before: usize },
}

/// How many loose objects and packs `root/.git/objects` holds.
pub fn count(root: &Path) -> (usize, usize) {
    let objects = root.join(".git/objects");
    let loose = (0..=255u8)
        .map(|byte| {
            std::fs::read_dir(objects.join(format!("{byte:02x}")))
                .map(|entries| {
                    entries
                        .flatten()
                        .filter(|e| e.file_name().len() == 38)
                        .count()
                })
                .unwrap_or(0)
        })
        .sum();
    let packs = std::fs::read_dir(objects.join("pack"))
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".pack"))
                .count()
        })
        .unwrap_or(0);
    (loose, packs)
}

/// The thresholds: `ALEXANDRIA_PACK_LOOSE_FROM` overrides `LOOSE_FROM` (tests).
fn loose_from() -> usize {
    std::env::var("ALEXANDRIA_PACK_LOOSE_FROM")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(LOOSE_FROM)
}

/// Pack the workspace at `root` if it has gathered enough loose objects or packs.
pub fn pack_if_needed(root: &Path) -> std::io::Result<Packed> {
    let (loose, packs) = count(root);
    if packs > PACKS_FROM {
        repack(root, &["-A", "-d"])?;
        return Ok(Packed::Packs { before: packs });
    }
    if loose >= loose_from() {
        repack(root, &["-d"])?;
        let (after, _) = count(root);
        return Ok(Packed::Loose {
            before: loose,
            after,
        });
    }
    Ok(Packed::Nothing)
}

/// `git repack -q <args>` in `root`, on one thread, without the user's hooks or
/// prompts, stopped after `TIMEOUT`.
fn repack(root: &Path, args: &[&str]) -> std::io::Result<()> {
    static NO_GIT_LOGGED: AtomicBool = AtomicBool::new(false);
    let started = Instant::now();
    let spawned = super::git_cli()
        .current_dir(root)
        .args(["-c", "pack.threads=1", "-c", "repack.writeBitmaps=false"])
        .args(["repack", "-q"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(error) => {
            if !NO_GIT_LOGGED.swap(true, Ordering::Relaxed) {
                tracing::warn!(%error, "git cannot run: loose objects are not packed");
            }
            return Err(error);
        }
    };
    // Read while it runs: a full pipe would stop git.
    let mut pipe = child.stderr.take();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(pipe) = pipe.as_mut() {
            let _ = std::io::Read::read_to_string(pipe, &mut text);
        }
        text
    });
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if started.elapsed() > TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "git repack took too long and was stopped",
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    if status.success() {
        tracing::info!(
            root = %root.display(),
            args = args.join(" "),
            ms = started.elapsed().as_millis() as u64,
            "loose objects packed"
        );
        return Ok(());
    }
    let stderr = reader.join().unwrap_or_default();
    Err(std::io::Error::other(format!(
        "git repack {}: {status}: {}",
        args.join(" "),
        stderr.trim()
    )))
}
