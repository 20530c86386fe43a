//! `alexandria completions <shell>` and `alexandria man`: shell completions and the man
//! page, generated from the same clap definition as the parser so they never drift.
//! `packaging/install.sh` installs both.

use std::io::Write;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::CommandFactory;

/// Print the completion script for `shell` on stdout.
pub fn completions(shell: clap_complete::Shell) -> Result<ExitCode> {
    let mut command = crate::Args::command();
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut command, "alexandria", &mut out);
    write_stdout(&out)
}

/// Print the man page (roff) on stdout, or with `dir` write one page per command there
/// (`alexandria.1`, `alexandria-workspace.1`, `alexandria-workspace-create.1`, …).
pub fn man(dir: Option<&std::path::Path>) -> Result<ExitCode> {
    let command = crate::Args::command();
    if let Some(dir) = dir {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        clap_mangen::generate_to(command, dir)
            .with_context(|| format!("cannot write the man pages into {}", dir.display()))?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut out = Vec::new();
    clap_mangen::Man::new(command)
        .render(&mut out)
        .context("rendering the man page")?;
    write_stdout(&out)
}

fn write_stdout(bytes: &[u8]) -> Result<ExitCode> {
    let stdout = std::io::stdout();
    let mut lock = stdout.lock();
    match lock.write_all(bytes).and_then(|()| lock.flush()) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        // `alexandria man | head`: a closed pipe is not an error.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(ExitCode::SUCCESS),
        Err(e) => Err(e).context("writing to stdout"),
    }
}
