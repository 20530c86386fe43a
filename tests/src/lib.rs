//! Harness for the end-to-end tests: locate the real binaries, give each test its own
//! short temp `ALEXANDRIA_HOME`, start the daemon and shims as real processes.
//!
//! The binaries are built by `cargo build --workspace` (the README's test command does
//! that first); `CARGO_BIN_EXE_*` is not available here because the binaries belong
//! to other packages.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Path of a workspace binary (`alexandria` or `alexandriad`) next to the test
/// executable's target directory.
pub fn bin_path(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test>-<hash>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test executable lives in target/<profile>/deps");
    let path = profile_dir.join(name);
    assert!(
        path.is_file(),
        "{} is missing: run `cargo build --workspace` before the tests (the README's test command does)",
        path.display()
    );
    path
}

/// A temp directory with a short path (Unix socket paths are limited to ~100 bytes).
pub fn short_tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("alx")
        .tempdir_in("/tmp")
        .expect("create temp dir in /tmp")
}

/// A `Command` for the `alexandria` CLI with `ALEXANDRIA_HOME` set and git isolated
/// from the user's configuration.
pub fn alexandria(home: &Path) -> Command {
    let mut command = Command::new(bin_path("alexandria"));
    isolate(&mut command, home);
    command
}

/// Point a command at `home` and keep the user's environment out of it.
pub fn isolate(command: &mut Command, home: &Path) {
    command
        .env("ALEXANDRIA_HOME", home)
        .env("ALEXANDRIAD", bin_path("alexandriad"))
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env_remove("ALEXANDRIA_LOG");
}
