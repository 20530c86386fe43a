//! Helpers for the crate's unit tests.

/// A small deterministic generator (xorshift): the same cases on every run, without a
/// dependency.
pub struct Xorshift(pub u64);

impl Xorshift {
    /// A number below `n`.
    pub fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// Run git in `dir` (as user `t`, never through the caller's `GIT_DIR` or
/// `GIT_INDEX_FILE`); what it printed. Fails the test when git fails.
pub fn git(dir: &std::path::Path, args: &[&str]) -> String {
    git_with(dir, args, None)
}

/// `git`, reading `index` instead of `.git/index` when given.
pub fn git_with(dir: &std::path::Path, args: &[&str], index: Option<&std::path::Path>) -> String {
    let mut command = std::process::Command::new("git");
    command
        .current_dir(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@t"])
        .args(args)
        .env_remove("GIT_DIR")
        .env_remove("GIT_INDEX_FILE");
    if let Some(index) = index {
        command.env("GIT_INDEX_FILE", index);
    }
    let output = command.output().expect("git runs");
    assert!(
        output.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}
