//! Progress of a long control request (ingest of many files): a bar on a terminal
//! (indicatif), plain lines on stderr otherwise, never anything on stdout.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// How often plain (non-terminal) progress lines are printed at most.
const PLAIN_EVERY: Duration = Duration::from_secs(1);

pub struct Progress {
    bar: Option<ProgressBar>,
    last_plain: Option<Instant>,
}

impl Progress {
    pub fn new() -> Progress {
        Progress {
            bar: None,
            last_plain: None,
        }
    }

    /// One step: `done` of `total` finished, `item` is what was just handled.
    pub fn update(&mut self, done: u64, total: u64, item: &str) {
        // One file is done before a bar could help.
        if total <= 1 {
            return;
        }
        if std::io::stderr().is_terminal() {
            let bar = self.bar.get_or_insert_with(|| {
                let bar = ProgressBar::new(total);
                let style = ProgressStyle::with_template(
                    "{bar:30} {pos}/{len} {elapsed_precise} {wide_msg}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar());
                bar.set_style(style);
                bar
            });
            bar.set_length(total);
            bar.set_position(done);
            bar.set_message(item.to_string());
            return;
        }
        // Plain lines: the first, the last, and at most one a second in between.
        let due = self
            .last_plain
            .is_none_or(|last| last.elapsed() >= PLAIN_EVERY);
        if done == total || due {
            eprintln!("[{done}/{total}] {item}");
            self.last_plain = Some(Instant::now());
        }
    }

    /// Clear the bar (before the final answer or an error is printed).
    pub fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}
