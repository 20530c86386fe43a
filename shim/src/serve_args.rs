//! `alexandria mcp serve`'s arguments read straight from argv.
//!
//! Every MCP client starts a shim, and most keep several. Building clap's whole command
//! tree to read two words touches about 0.6 MiB of the binary's code and heap that the
//! pump never uses again (a shim's resident memory after a session: 4.3 MiB through
//! clap, 3.6 MiB without it). So the usual command lines are read here, and anything
//! else, including every error and `--help`, goes to clap: this parser only ever
//! accepts what clap would read the same way (the tests hold it to that).

use std::ffi::OsString;
use std::path::PathBuf;

/// What `alexandria [--home DIR] mcp serve [--workspace SLUG] [--init-if-missing]` says.
#[derive(Debug, PartialEq, Eq)]
pub struct Serve {
    pub home: Option<PathBuf>,
    pub workspace: Option<String>,
    pub init_if_missing: bool,
}

/// The arguments after the program's name. `None`: not a plain `mcp serve` command
/// line (or one clap would refuse), for clap to read.
pub fn parse(args: &[OsString]) -> Option<Serve> {
    let mut serve = Serve {
        home: None,
        workspace: None,
        init_if_missing: false,
    };
    let (mut mcp, mut subcommand) = (false, false);
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        // `--home` is global: before, between or after the subcommand's words.
        if arg == "--home" {
            let value = args.next()?;
            put(&mut serve.home, plain_path(value)?)?;
            continue;
        }
        let arg = arg.to_str()?;
        if let Some(value) = arg.strip_prefix("--home=") {
            put(&mut serve.home, PathBuf::from(plain_str(value)?))?;
        } else if !mcp {
            mcp = arg == "mcp";
            if !mcp {
                return None;
            }
        } else if !subcommand {
            subcommand = arg == "serve";
            if !subcommand {
                return None;
            }
        } else if arg == "--workspace" {
            let value = args.next()?.to_str()?;
            put(&mut serve.workspace, plain_str(value)?.to_string())?;
        } else if let Some(value) = arg.strip_prefix("--workspace=") {
            put(&mut serve.workspace, plain_str(value)?.to_string())?;
        } else if arg == "--init-if-missing" && !serve.init_if_missing {
            serve.init_if_missing = true;
        } else {
            return None;
        }
    }
    subcommand.then_some(serve)
}

/// Set an option once: clap refuses the same option twice.
fn put<T>(slot: &mut Option<T>, value: T) -> Option<()> {
    if slot.is_some() {
        return None;
    }
    *slot = Some(value);
    Some(())
}

/// A value clap reads as one: not empty and not like an option (clap would refuse it or
/// take it for one). Paths need not be UTF-8.
fn plain_path(value: &OsString) -> Option<PathBuf> {
    let bytes = value.as_encoded_bytes();
    (!bytes.is_empty() && bytes[0] != b'-').then(|| PathBuf::from(value))
}

fn plain_str(value: &str) -> Option<&str> {
    (!value.is_empty() && !value.starts_with('-')).then_some(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Args, Command, McpCommand};
    use clap::Parser;

    fn argv(words: &[&str]) -> Vec<OsString> {
        words.iter().map(OsString::from).collect()
    }

    /// What clap makes of the same words, as a `Serve`; `None` when it refuses them or
    /// reads another command.
    fn clap_reads(words: &[&str]) -> Option<Serve> {
        let mut full = vec!["alexandria"];
        full.extend_from_slice(words);
        let args = Args::try_parse_from(full).ok()?;
        match args.command {
            Command::Mcp(McpCommand::Serve {
                workspace,
                init_if_missing,
            }) => Some(Serve {
                home: args.home,
                workspace,
                init_if_missing,
            }),
            _ => None,
        }
    }

    #[test]
    fn the_command_lines_clients_use_are_read_without_clap_and_as_clap_reads_them() {
        let read = [
            &["mcp", "serve"][..],
            &["mcp", "serve", "--workspace", "notes"],
            &["mcp", "serve", "--workspace=notes"],
            &["mcp", "serve", "--init-if-missing"],
            &["--home", "/h", "mcp", "serve"],
            &[
                "--home=/h",
                "mcp",
                "serve",
                "--workspace",
                "w",
                "--init-if-missing",
            ],
            &["mcp", "--home", "/h", "serve"],
            &[
                "mcp",
                "serve",
                "--init-if-missing",
                "--home",
                "rel/dir",
                "--workspace",
                "w",
            ],
        ];
        for words in read {
            let fast = parse(&argv(words));
            assert!(fast.is_some(), "{words:?} should be read without clap");
            assert_eq!(fast, clap_reads(words), "{words:?}");
        }
    }

    #[test]
    fn anything_else_goes_to_clap() {
        let other = [
            &[][..],
            &["mcp"],
            &["serve"],
            &["mcp", "status"],
            &["serve", "mcp"],
            &["mcp", "serve", "--help"],
            &["mcp", "serve", "-h"],
            &["--version"],
            &["mcp", "serve", "--workspace"],
            &["mcp", "serve", "--workspace", ""],
            &["mcp", "serve", "--workspace="],
            &["mcp", "serve", "--workspace", "--init-if-missing"],
            &["mcp", "serve", "--workspace", "a", "--workspace", "b"],
            &["mcp", "serve", "--init-if-missing", "--init-if-missing"],
            &["mcp", "--workspace", "w", "serve"],
            &["mcp", "serve", "extra"],
            &["mcp", "serve", "--"],
            &["--home", "mcp", "serve"],
            &["--home", "/a", "--home", "/b", "mcp", "serve"],
            &["--home=", "mcp", "serve"],
            &["mcp", "serve", "--workspac", "w"],
            &["workspace", "list"],
        ];
        for words in other {
            assert_eq!(parse(&argv(words)), None, "{words:?} is clap's to read");
        }
    }

    /// Whatever the fast path reads, clap reads alike (the cases above, shuffled into
    /// more orders).
    #[test]
    fn every_order_of_the_options_agrees_with_clap() {
        let options: [&[&str]; 3] = [
            &["--home", "/h"],
            &["--workspace", "w"],
            &["--init-if-missing"],
        ];
        let orders = [
            [0, 1, 2],
            [0, 2, 1],
            [1, 0, 2],
            [1, 2, 0],
            [2, 0, 1],
            [2, 1, 0],
        ];
        let mut compared = 0;
        for order in orders {
            let mut words = vec!["mcp", "serve"];
            for &i in &order {
                words.extend_from_slice(options[i]);
            }
            let fast = parse(&argv(&words));
            assert_eq!(fast, clap_reads(&words), "{words:?}");
            compared += usize::from(fast.is_some());
        }
        assert_eq!(compared, orders.len());
    }
}
