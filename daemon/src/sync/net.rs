//! The network side of sync: `git fetch`, `git push` and `git clone` through the `git`
//! command line, so that the user's ssh config, ssh-agent and credential helpers apply.
//! Prompts are off (there is no terminal), ssh runs in batch mode, and a command that
//! takes longer than the timeout is killed with its process group.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What a git command printed, or why it failed.
#[derive(Debug)]
pub struct Output {
    pub stdout: String,
    pub stderr: String,
}

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("git is not installed or cannot run: {0}")]
    NoGit(std::io::Error),
    #[error("`git {command}` took longer than {}s and was stopped", .timeout.as_secs())]
    Timeout { command: String, timeout: Duration },
    #[error("`git {command}` failed: {stderr}")]
    Failed {
        command: String,
        /// The last lines of git's error output, credentials removed.
        stderr: String,
        /// Everything git printed (for telling a rejected push from other failures).
        all: String,
    },
}

/// A `git` command with prompts off and batch-mode ssh.
fn command(dir: &Path, args: &[&str]) -> Command {
    let mut command = crate::workspace::git_cli();
    command
        .current_dir(dir)
        // ext:: runs arbitrary commands; never from a URL.
        .args(["-c", "protocol.ext.allow=never"])
        .args(args)
        .env("GCM_INTERACTIVE", "never")
        .env("GIT_ASKPASS", "")
        .env("SSH_ASKPASS", "")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group: a timeout kills ssh and helpers too.
        .process_group(0);
    if std::env::var_os("GIT_SSH_COMMAND").is_none() && std::env::var_os("GIT_SSH").is_none() {
        command.env(
            "GIT_SSH_COMMAND",
            "ssh -o BatchMode=yes -o ConnectTimeout=30",
        );
    }
    command
}

/// Run `git <args>` in `dir`, killing it after `timeout`.
pub fn git(dir: &Path, args: &[&str], timeout: Duration) -> Result<Output, NetError> {
    let shown = args.first().copied().unwrap_or("").to_string();
    let mut child = command(dir, args).spawn().map_err(NetError::NoGit)?;
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let out = std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(pipe) = stdout.as_mut() {
            let _ = pipe.read_to_string(&mut text);
        }
        text
    });
    let err = std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(pipe) = stderr.as_mut() {
            let _ = pipe.read_to_string(&mut text);
        }
        text
    });
    let started = Instant::now();
    let mut pause = Duration::from_millis(2);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() >= timeout => {
                if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
                    let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
                }
                let _ = child.kill();
                let _ = child.wait();
                return Err(NetError::Timeout {
                    command: shown,
                    timeout,
                });
            }
            Ok(None) => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            Err(error) => return Err(NetError::NoGit(error)),
        }
    };
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    if !status.success() {
        return Err(NetError::Failed {
            command: shown,
            stderr: last_lines(&stderr),
            all: format!("{stdout}\n{stderr}"),
        });
    }
    Ok(Output { stdout, stderr })
}

/// The last few meaningful lines of git's error output, credentials removed.
fn last_lines(stderr: &str) -> String {
    let lines: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("hint:"))
        .collect();
    let tail = &lines[lines.len().saturating_sub(3)..];
    tail.iter()
        .map(|line| {
            line.split_whitespace()
                .map(|word| {
                    if word.contains("://") {
                        crate::sources::redact_url(word.trim_matches(|c| c == '\'' || c == '"'))
                    } else {
                        word.to_string()
                    }
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Whether a failed push was refused because the remote has commits we lack.
pub fn is_rejected(error: &NetError) -> bool {
    match error {
        NetError::Failed { all, .. } => {
            all.contains("[rejected]")
                || all.contains("[remote rejected]")
                || all.contains("non-fast-forward")
                || all.contains("fetch first")
                || all.contains("cannot lock ref")
                || all.contains("failed to update ref")
        }
        _ => false,
    }
}
