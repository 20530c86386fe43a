//! Web view page timings (issue 11): a browser-like GET of a rendered wiki page, a
//! search page and the history page, signed in with the one-time login of
//! `alexandria web`, each checked for the content it must show. One connection per
//! request (`Connection: close`), so the figure includes a loopback TCP connect, as a
//! browser's first request does.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};

use crate::procs::Home;
use crate::report::{Figure, Row};
use crate::stats::{Plan, measure};

/// One GET: (status, headers, body).
fn get(address: &str, path: &str, cookie: Option<&str>) -> Result<(u16, String, String)> {
    let mut stream =
        TcpStream::connect(address).with_context(|| format!("cannot connect to {address}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    let cookie = cookie
        .map(|c| format!("Cookie: {c}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\n{cookie}Connection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("a response without headers from {path}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("no status line from {path}"))?;
    Ok((status, head.to_string(), body.to_string()))
}

/// Time the three pages; every answer is checked (status 200 and its content).
pub fn page_latencies(
    home: &Home,
    slug: &str,
    label: &str,
    plan: Plan,
    page: &str,
    word: &str,
) -> Result<Vec<Row>> {
    let base = home
        .http_address()?
        .ok_or_else(|| anyhow!("the daemon serves no HTTP, so no web view"))?;
    let address = base.trim_start_matches("http://").to_string();
    let login = home.cli(&["web", "--no-open"])?;
    let at = login
        .find("/login?token=")
        .ok_or_else(|| anyhow!("`alexandria web` printed no login URL: {login}"))?;
    let (status, head, _) = get(&address, login[at..].trim(), None)?;
    if status != 303 {
        bail!("the login answered {status}");
    }
    let cookie = head
        .lines()
        .find_map(|l| {
            l.strip_prefix("set-cookie: ")
                .or_else(|| l.strip_prefix("Set-Cookie: "))
        })
        .and_then(|c| c.split(';').next())
        .ok_or_else(|| anyhow!("the login set no cookie"))?
        .to_string();
    let pages = [
        (
            "web: rendered wiki page",
            format!("/w/{slug}/{page}"),
            "<article",
        ),
        (
            "web: search page (rare word)",
            format!("/w/{slug}/search?q={word}"),
            "<mark>",
        ),
        ("web: history page", format!("/w/{slug}/history"), "<li"),
    ];
    let mut rows = Vec::new();
    for (figure, path, expected) in pages {
        let summary = measure(plan, |_| {
            let (status, _, body) = get(&address, &path, Some(&cookie))?;
            if status != 200 || !body.contains(expected) {
                bail!(
                    "{path} answered {status} without {expected:?}: {}",
                    body.chars().take(300).collect::<String>()
                );
            }
            Ok(None)
        })?;
        rows.push(
            Row::new(figure, label, "http", Figure::Latency(summary))
                .note("GET with a session cookie, one TCP connection each; the page is checked"),
        );
    }
    Ok(rows)
}
