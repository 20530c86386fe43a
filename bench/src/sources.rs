//! Source adapter figures (issue 10): syncing a 500-entry feed (served by the fixture
//! HTTP server, with an article page per entry, all captured) and a 1,000-file folder
//! (all captured), each timed from `source add` to the end of `source sync`, with the
//! daemon's peak memory.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use crate::httpd::{Route, Server, article_page, rss};
use crate::procs::{self, Binaries, Home};
use crate::report::{Figure, Row};

const SLUG: &str = "bench-sources";

pub struct SourceFigures {
    pub rows: Vec<Row>,
}

fn sync(home: &Home, args: &[&str]) -> Result<Duration> {
    let started = Instant::now();
    home.cli(args)?;
    Ok(started.elapsed())
}

fn peak(home: &Home) -> Result<(u32, u64, u64)> {
    let Some(pid) = home.daemon_pid() else {
        bail!("the daemon is not running");
    };
    let (rss, hwm) = procs::memory(pid)?;
    Ok((pid, rss, hwm))
}

pub fn run(binaries: &Binaries, feed_entries: usize, folder_files: usize) -> Result<SourceFigures> {
    let mut rows = Vec::new();
    let mut home = Home::new(binaries)?;
    home.cli(&["init"])?;
    home.cli(&["workspace", "create", SLUG])?;
    let (_, rss_before, _) = peak(&home)?;

    // A feed of `feed_entries` entries, each linking to an article page.
    let server = Server::start()?;
    let entries: Vec<(String, String, String, String)> = (0..feed_entries)
        .map(|n| {
            (
                format!("urn:bench:{n}"),
                format!("Benchmark entry {n}"),
                server.url(&format!("/a/{n}")),
                format!("Summary {n}"),
            )
        })
        .collect();
    for n in 0..feed_entries {
        server.route(
            &format!("/a/{n}"),
            Route::body(
                "text/html",
                article_page(
                    &format!("Benchmark entry {n}"),
                    &format!("Article body {n}."),
                ),
            ),
        );
    }
    server.route(
        "/feed.xml",
        Route::body("application/rss+xml", rss(&entries)).with_etag("bench"),
    );
    let feed_url = server.url("/feed.xml");
    let started = Instant::now();
    home.cli(&[
        "source", "add", SLUG, "feed", &feed_url, "--name", "feed", "--auto",
    ])?;
    home.cli(&["source", "sync", SLUG, "feed"])?;
    let feed_time = started.elapsed();
    let captured = std::fs::read_dir(home.workspace_dir(SLUG).join("raw/sources/feed"))
        .map(|d| d.count())
        .unwrap_or(0);
    let (_, rss_after_feed, hwm_feed) = peak(&home)?;
    let not_modified = sync(&home, &["source", "sync", SLUG, "feed"])?;
    rows.push(
        Row::new(
            &format!("feed source: {feed_entries} entries, add → synced and captured"),
            "-",
            "cli",
            Figure::Once(feed_time),
        )
        .note(format!(
            "{captured} articles fetched from 127.0.0.1, made readable and committed in one capture; a second sync (304) took {} ms",
            not_modified.as_millis()
        )),
    );
    rows.push(
        Row::new(
            &format!("daemon peak RSS, feed of {feed_entries}"),
            "-",
            "-",
            Figure::Bytes(hwm_feed),
        )
        .note(format!(
            "RSS {} MiB before, {} MiB after",
            rss_before / (1024 * 1024),
            rss_after_feed / (1024 * 1024)
        )),
    );

    // A folder of `folder_files` markdown files.
    let folder = home.scratch().join("folder");
    std::fs::create_dir_all(&folder)?;
    let mut bytes = 0;
    for n in 0..folder_files {
        let text = format!("# Note {n}\n\nA note of the benchmark folder, number {n}.\n");
        bytes += text.len();
        std::fs::create_dir_all(folder.join(format!("d{}", n % 20)))?;
        std::fs::write(folder.join(format!("d{}/note-{n}.md", n % 20)), text)?;
    }
    // Files count once unchanged for a second.
    std::thread::sleep(Duration::from_millis(1100));
    let folder_text = folder.display().to_string();
    let started = Instant::now();
    home.cli(&[
        "source",
        "add",
        SLUG,
        "folder",
        &folder_text,
        "--name",
        "folder",
    ])?;
    home.cli(&["source", "sync", SLUG, "folder"])?;
    let folder_time = started.elapsed();
    let resync = sync(&home, &["source", "sync", SLUG, "folder"])?;
    let (_, _, hwm_folder) = peak(&home)?;
    rows.push(
        Row::new(
            &format!("folder source: {folder_files} files, add → synced and captured"),
            "-",
            "cli",
            Figure::Once(folder_time),
        )
        .note(format!(
            "{} KiB in 20 subfolders, one commit; an unchanged re-sync took {} ms",
            bytes / 1024,
            resync.as_millis()
        )),
    );
    rows.push(Row::new(
        &format!("daemon peak RSS, folder of {folder_files}"),
        "-",
        "-",
        Figure::Bytes(hwm_folder),
    ));
    home.stop_daemon()?;
    Ok(SourceFigures { rows })
}
