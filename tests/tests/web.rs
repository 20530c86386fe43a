//! The web view against a real daemon: the login flow, every page by its URL, the
//! headers, hostile markdown, confinement, CSRF and Host refusals, bearer tokens; and
//! a real headless Chromium (Debian's package) that signs in and renders a page.
//!
//! Requests are written by hand over a `TcpStream` so every header is what the test says.

use std::process::Command;

use alexandria_tests::http::{Reply, http};
use alexandria_tests::{Env, make_pdf};
use serde_json::{Value, json};

fn get(address: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
    http(address, "GET", path, headers, "")
}

fn send(address: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Reply {
    http(address, method, path, headers, body)
}

/// Debian's headless Chromium with a fresh profile and the flags this closed network
/// needs, on `url`, with `extra` flags (`--dump-dom`, `--screenshot=…`).
fn chromium(binary: &str, extra: &[&str], url: &str) -> std::process::Output {
    let profile = tempfile::tempdir().expect("profile dir");
    let user_data = format!("--user-data-dir={}", profile.path().display());
    let mut args = vec![
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        user_data.as_str(),
    ];
    args.extend_from_slice(extra);
    args.push(url);
    Command::new(binary)
        .args(&args)
        .output()
        .expect("run chromium")
}

/// A home with workspace `acme`: a PDF, a raw note with a space in its name, and a wiki
/// page written through the real shim that cites both, links a missing file and carries
/// an XSS corpus. Returns the env and the HTTP address.
fn web_env() -> (Env, String) {
    let env = Env::new();
    env.ok(&["init"]);
    env.ok(&["workspace", "create", "acme"]);
    let pdf = make_pdf(&["Tide pools hold sea stars.", "Page two mentions urchins."]);
    env.ingest(
        "acme",
        &[
            ("paper.pdf", &pdf),
            ("my notes.md", b"# Notes\nkelp forest\n"),
            ("gone.md", b"soon removed by hand\n"),
        ],
    );
    let mut shim = env.raw_shim(Some("acme"));
    shim.initialize("2025-06-18");
    let page = "# Sea stars <img src=x onerror=alert(1)>\n\nSea stars eat urchins[^1]. See [my notes](<raw/my notes.md>), [gone](raw/gone.md), [a missing page](missing.md) and [the index](../index.md).\n\n<script>alert('x')</script>\n\n[click](javascript:alert(1))\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n- [x] done\n\n[^1]: raw/paper.pdf, p.2\n";
    let reply = shim.request(
        1,
        "tools/call",
        json!({"name": "write", "arguments": {"command": "create", "path": "wiki/topics/sea-stars.md", "content": page}}),
    );
    assert_eq!(
        reply["result"]["isError"], false,
        "the write succeeds: {reply}"
    );
    drop(shim);
    // A person deletes a cited raw file by hand: the citation is now broken.
    std::fs::remove_file(env.workspace_dir("acme").join("raw/gone.md")).expect("remove by hand");
    let status: Value =
        serde_json::from_str(&env.ok(&["daemon", "status", "--json"])).expect("status json");
    let address = status["http"]
        .as_str()
        .and_then(|u| u.strip_prefix("http://"))
        .expect("the daemon reports its HTTP address")
        .to_string();
    (env, address)
}

/// `alexandria web --no-open` → the login URL's path and query.
fn login_path(env: &Env) -> String {
    let url = env.ok(&["web", "--no-open"]);
    let url = url.trim();
    let at = url.find("/login?token=").expect("a login URL on stdout");
    url[at..].to_string()
}

/// Sign in; the `name=value` cookie pair.
fn sign_in(env: &Env, address: &str) -> String {
    let reply = get(address, &login_path(env), &[]);
    assert_eq!(reply.status, 303, "login redirects: {}", reply.body);
    let cookie = reply.header("set-cookie").expect("a session cookie");
    cookie.split(';').next().expect("pair").trim().to_string()
}

#[test]
fn login_is_required_and_a_login_url_works_once() {
    let (env, address) = web_env();
    let reply = get(&address, "/", &[]);
    assert_eq!(reply.status, 401);
    assert!(reply.body.contains("alexandria web"), "{}", reply.body);
    let reply = get(&address, "/w/acme/wiki/topics/sea-stars.md", &[]);
    assert_eq!(reply.status, 401, "pages need the login too");

    let login = login_path(&env);
    let port = address.rsplit(':').next().expect("port");
    let reply = get(&address, &format!("{login}&next=/w/acme/"), &[]);
    assert_eq!(reply.status, 303);
    assert_eq!(reply.header("location"), Some("/w/acme/"));
    let set_cookie = reply.header("set-cookie").expect("cookie").to_string();
    assert!(
        set_cookie.starts_with(&format!("alexandria_web_{port}=")),
        "{set_cookie}"
    );
    assert!(set_cookie.contains("HttpOnly") && set_cookie.contains("SameSite=Strict"));
    let cookie = set_cookie.split(';').next().expect("pair").to_string();

    let again = get(&address, &login, &[]);
    assert_eq!(again.status, 401, "a login URL works only once");
    let forged = get(&address, "/login?token=0000", &[]);
    assert_eq!(forged.status, 401);
    let open_redirect = get(
        &address,
        &format!("{}&next=//evil.example/", login_path(&env)),
        &[],
    );
    assert_eq!(
        open_redirect.header("location"),
        Some("/"),
        "no redirect off the site"
    );

    let home = get(&address, "/", &[("Cookie", &cookie)]);
    assert_eq!(home.status, 200, "{}", home.body);
    assert!(home.body.contains("href=\"/w/acme/\""), "{}", home.body);
    let csp = home.header("content-security-policy").expect("CSP");
    assert!(csp.contains("frame-ancestors 'none'") && csp.contains("default-src 'none'"));
    assert!(!csp.contains("script-src"), "no scripts at all: {csp}");
    assert_eq!(home.header("x-content-type-options"), Some("nosniff"));

    // Sign out: a POST with the CSRF token from the page, same-origin.
    let csrf = home
        .body
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a CSRF token in the page")
        .to_string();
    let cross = send(
        &address,
        "POST",
        "/logout",
        &[("Cookie", &cookie), ("Sec-Fetch-Site", "cross-site")],
        &format!("csrf={csrf}"),
    );
    assert_eq!(cross.status, 403, "cross-site posts are refused");
    let no_token = send(
        &address,
        "POST",
        "/logout",
        &[("Cookie", &cookie), ("Sec-Fetch-Site", "same-origin")],
        "csrf=wrong",
    );
    assert_eq!(no_token.status, 403, "a wrong CSRF token is refused");
    let out = send(
        &address,
        "POST",
        "/logout",
        &[("Cookie", &cookie), ("Sec-Fetch-Site", "same-origin")],
        &format!("csrf={csrf}"),
    );
    assert_eq!(out.status, 303);
    assert_eq!(get(&address, "/", &[("Cookie", &cookie)]).status, 401);
}

#[test]
fn pages_render_citations_safely_and_stay_confined() {
    let (env, address) = web_env();
    let cookie = sign_in(&env, &address);
    let with = [("Cookie", cookie.as_str())];

    let page = get(&address, "/w/acme/wiki/topics/sea-stars.md", &with);
    assert_eq!(page.status, 200, "{}", page.body);
    let body = page.body.to_ascii_lowercase();
    // Hostile text may appear escaped (the title shows `&lt;img …&gt;`), never as markup.
    for forbidden in [
        "<script",
        "<img src=x",
        "<img src=\"x\"",
        "javascript:",
        "alert('x')",
    ] {
        assert!(
            !body.contains(forbidden),
            "{forbidden} survived: {}",
            page.body
        );
    }
    assert!(
        page.body.contains("href=\"/w/acme/raw/paper.pdf#page=2\""),
        "{}",
        page.body
    );
    assert!(
        page.body.contains("href=\"/w/acme/raw/my%20notes.md\""),
        "{}",
        page.body
    );
    assert!(
        page.body.contains("href=\"/w/acme/broken/raw/gone.md\""),
        "{}",
        page.body
    );
    assert!(page.body.contains("<table>"), "GFM tables");
    assert!(page.body.contains("type=\"checkbox\""), "task lists");
    assert!(page.body.contains("data-footnotes"), "footnotes");
    assert!(page.body.contains("rev "), "the page's rev is shown");
    assert!(page.body.contains("Last writers"), "{}", page.body);

    let pdf = get(&address, "/w/acme/raw/paper.pdf", &with);
    assert_eq!(pdf.status, 200);
    assert_eq!(pdf.header("content-type"), Some("application/pdf"));
    assert!(pdf.body.starts_with("%PDF"));
    let note = get(&address, "/w/acme/raw/my%20notes.md", &with);
    assert_eq!(note.status, 200);
    assert!(
        note.header("content-type")
            .is_some_and(|t| t.starts_with("text/plain"))
    );
    assert!(
        note.header("content-security-policy")
            .is_some_and(|c| c.contains("sandbox"))
    );
    assert!(note.body.contains("kelp forest"));
    let broken = get(&address, "/w/acme/broken/raw/gone.md", &with);
    assert_eq!(broken.status, 404);

    for escape in [
        "/w/acme/raw/..%2f..%2f..%2fconfig.toml",
        "/w/acme/raw/../../../config.toml",
        "/w/acme/wiki/%2e%2e/%2e%2e/%2e%2e/config.toml",
        "/w/acme/raw/..%2f.git/config",
        "/w/acme/wiki/../runs",
        "/w/../config.toml",
    ] {
        let reply = get(&address, escape, &with);
        assert!(
            matches!(reply.status, 400 | 404),
            "{escape} → {} {}",
            reply.status,
            reply.body
        );
        assert!(
            !reply.body.contains("[http]"),
            "{escape} leaked config.toml"
        );
    }
    assert_eq!(get(&address, "/w/nope/", &with).status, 404);

    let search = get(&address, "/w/acme/search?q=urchins", &with);
    assert_eq!(search.status, 200);
    assert!(search.body.contains("<mark>"), "{}", search.body);
    assert!(search.body.contains("sea-stars.md"), "{}", search.body);
    let bad = get(&address, "/w/acme/search?q=%22unclosed", &with);
    assert_ne!(bad.status, 500, "a malformed query is not a crash");

    let history = get(&address, "/w/acme/history", &with);
    assert_eq!(history.status, 200);
    let run = history
        .body
        .split("/w/acme/history/")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a diff link")
        .to_string();
    let diff = get(&address, &format!("/w/acme/history/{run}"), &with);
    assert_eq!(diff.status, 200);
    assert!(diff.body.contains("class=\"add\""), "{}", diff.body);
    assert!(diff.body.contains("Sea stars eat urchins"), "{}", diff.body);
    assert!(
        !diff.body.contains("<script>alert"),
        "diffs are escaped too"
    );

    let overview = get(&address, "/w/acme/", &with);
    assert_eq!(overview.status, 200);
    assert!(overview.body.contains("Recent history"));
    let sessions = get(&address, "/sessions", &with);
    assert_eq!(sessions.status, 200);

    let foreign = get(
        &address,
        "/",
        &[("Cookie", cookie.as_str()), ("Host", "evil.example")],
    );
    assert_eq!(
        foreign.status, 403,
        "a foreign Host is refused (DNS rebinding)"
    );
    let post = send(&address, "POST", "/w/acme/", &with, "x=1");
    assert_eq!(post.status, 405, "pages only read");
}

#[test]
fn bearer_tokens_admit_scripts_within_their_workspace() {
    let (env, address) = web_env();
    let token = env.ok(&["daemon", "auth", "token", "--workspace", "acme"]);
    let bearer = format!("Bearer {}", token.trim());
    let with = [("Authorization", bearer.as_str())];
    assert_eq!(get(&address, "/w/acme/", &with).status, 200);
    assert_eq!(get(&address, "/w/global/", &with).status, 403);
    assert_eq!(get(&address, "/sessions", &with).status, 403);
    let wrong = get(&address, "/w/acme/", &[("Authorization", "Bearer nope")]);
    assert_eq!(wrong.status, 401);
    assert_eq!(
        get(&address, "/access", &with).status,
        403,
        "a pinned token cannot see who else has access"
    );

    // "Revoke every token" from a signed-in browser ends the token's access.
    let cookie = sign_in(&env, &address);
    let page = get(&address, "/access", &[("Cookie", cookie.as_str())]);
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains("Revoke every token"), "{}", page.body);
    let csrf = csrf_of(&page.body);
    let same_origin = [
        ("Cookie", cookie.as_str()),
        ("Sec-Fetch-Site", "same-origin"),
    ];
    let unconfirmed = send(
        &address,
        "POST",
        "/access",
        &same_origin,
        &format!("csrf={csrf}&action=revoke_tokens"),
    );
    assert_eq!(unconfirmed.status, 400);
    assert_eq!(get(&address, "/w/acme/", &with).status, 200);
    let revoked = send(
        &address,
        "POST",
        "/access",
        &same_origin,
        &format!("csrf={csrf}&confirm=yes&action=revoke_tokens"),
    );
    assert_eq!(revoked.status, 303, "{}", revoked.body);
    assert_eq!(get(&address, "/w/acme/", &with).status, 401);
}

/// A real browser: Debian's headless Chromium signs in through the one-time URL and
/// renders a wiki page; the DOM it built is checked, and a screenshot is kept in
/// `target/web-screenshots/` for the docs.
#[test]
fn a_real_browser_signs_in_and_renders_a_page() {
    let chromium_bin = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists());
    let Some(chromium_bin) = chromium_bin else {
        // .ci/run installs Debian's chromium; without it this test cannot run, so it
        // fails rather than passing silently.
        panic!("chromium is not installed: `apt-get install chromium` (see .ci/run)");
    };
    let (env, address) = web_env();
    let url = format!(
        "http://{address}{}&next=/w/acme/wiki/topics/sea-stars.md",
        login_path(&env)
    );
    let output = chromium(chromium_bin, &["--dump-dom"], &url);
    let dom = String::from_utf8_lossy(&output.stdout);
    assert!(
        dom.contains("Sea stars eat urchins"),
        "the browser rendered the page after signing in: {dom}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(dom.contains("/w/acme/raw/paper.pdf#page=2"), "{dom}");
    assert!(
        !dom.contains("<img src=\"x\"") && !dom.contains("<script"),
        "no hostile markup reached the DOM: {dom}"
    );

    let shots = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/web-screenshots");
    std::fs::create_dir_all(&shots).expect("screenshot dir");
    let shot = shots.join("page.png");
    let url = format!(
        "http://{address}{}&next=/w/acme/wiki/topics/sea-stars.md",
        login_path(&env)
    );
    let shot_flag = format!("--screenshot={}", shot.display());
    let status = chromium(
        chromium_bin,
        &["--hide-scrollbars", "--window-size=1000,900", &shot_flag],
        &url,
    );
    assert!(
        shot.exists() && std::fs::metadata(&shot).map(|m| m.len()).unwrap_or(0) > 1000,
        "a screenshot was taken: {}",
        String::from_utf8_lossy(&status.stderr)
    );
}

/// The CSRF token of a page signed in with a cookie.
fn csrf_of(body: &str) -> String {
    body.split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a CSRF token in the page")
        .to_string()
}

/// `/w/<slug>/subscriptions`: a folder source's pending items (one with a hostile
/// heading), Ingest and Dismiss buttons that act through the same code as the CLI,
/// "Sync now", and the refusals: no CSRF token, cross-site, a bearer token without
/// a browser session, an item of another workspace.
#[test]
fn subscriptions_page_ingests_and_dismisses_by_button() {
    let (env, address) = web_env();
    env.ok(&["workspace", "create", "other"]);
    let folder = env.dir.path().join("inbox");
    std::fs::create_dir_all(&folder).expect("folder");
    std::fs::write(folder.join("keep.md"), "# Keep me\n\nmarmoset facts\n").expect("write");
    std::fs::write(
        folder.join("<img src=x onerror=alert(1)>.md"),
        "# <script>alert('title')</script>\n\n<img src=x onerror=alert(2)> spam\n",
    )
    .expect("write");
    // A file counts once it has been unchanged for a second.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let folder_arg = folder.to_str().expect("utf8");
    env.ok(&[
        "source",
        "add",
        "acme",
        "folder",
        folder_arg,
        "--name",
        "inbox",
        "--no-auto",
    ]);
    env.ok(&["source", "sync", "acme", "inbox"]);
    env.ok(&[
        "source",
        "add",
        "other",
        "folder",
        folder_arg,
        "--name",
        "theirs",
        "--no-auto",
    ]);
    env.ok(&["source", "sync", "other", "theirs"]);
    let pending: Value = serde_json::from_str(&env.ok(&[
        "subscription",
        "list",
        "acme",
        "--state",
        "pending",
        "--json",
    ]))
    .expect("json");
    let pending = pending.as_array().expect("items").clone();
    assert_eq!(pending.len(), 2, "{pending:?}");
    let id_of = |needle: &str| {
        pending
            .iter()
            .find(|i| i["title"].as_str().is_some_and(|t| t.contains(needle)))
            .and_then(|i| i["id"].as_i64())
            .expect("item")
    };
    let (keep, drop) = (id_of("keep.md"), id_of("onerror"));
    let theirs: Value =
        serde_json::from_str(&env.ok(&["subscription", "list", "other", "--json"])).expect("json");
    let theirs = theirs[0]["id"]
        .as_i64()
        .expect("an item in the other workspace");

    let cookie = sign_in(&env, &address);
    let with = [("Cookie", cookie.as_str())];
    let overview = get(&address, "/w/acme/", &with);
    assert!(
        overview.body.contains("inbox") && overview.body.contains("2 pending"),
        "the overview lists sources with pending counts: {}",
        overview.body
    );
    let page = get(&address, "/w/acme/subscriptions", &with);
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(
        page.body.contains("keep.md") && page.body.contains("marmoset"),
        "{}",
        page.body
    );
    assert!(
        !page.body.contains("<script>alert") && !page.body.contains("<img src=x"),
        "untrusted titles and excerpts are escaped: {}",
        page.body
    );
    assert!(
        page.body
            .contains(&format!("name=\"item\" value=\"{keep}\""))
    );
    assert!(page.body.contains("value=\"ingest\"") && page.body.contains("value=\"dismiss\""));
    let csrf = csrf_of(&page.body);
    let form = |action: &str, item: i64| format!("csrf={csrf}&item={item}&action={action}");
    let same_origin = [
        ("Cookie", cookie.as_str()),
        ("Sec-Fetch-Site", "same-origin"),
        ("Content-Type", "application/x-www-form-urlencoded"),
    ];

    // Refusals change nothing.
    let no_csrf = send(
        &address,
        "POST",
        "/w/acme/subscriptions",
        &same_origin,
        &format!("item={keep}&action=ingest"),
    );
    assert_eq!(no_csrf.status, 403);
    let cross = send(
        &address,
        "POST",
        "/w/acme/subscriptions",
        &[
            ("Cookie", cookie.as_str()),
            ("Sec-Fetch-Site", "cross-site"),
        ],
        &form("ingest", keep),
    );
    assert_eq!(cross.status, 403);
    let token = env.ok(&["daemon", "auth", "token"]);
    let bearer = format!("Bearer {}", token.trim());
    let by_token = send(
        &address,
        "POST",
        "/w/acme/subscriptions",
        &[
            ("Authorization", bearer.as_str()),
            ("Sec-Fetch-Site", "same-origin"),
        ],
        &form("ingest", keep),
    );
    assert_eq!(
        by_token.status, 403,
        "agents' tokens cannot capture: {}",
        by_token.body
    );
    let foreign = send(
        &address,
        "POST",
        "/w/acme/subscriptions",
        &same_origin,
        &form("dismiss", theirs),
    );
    assert_eq!(
        foreign.status, 404,
        "an item of another workspace is not found: {}",
        foreign.body
    );
    assert!(foreign.body.contains("not_found"), "{}", foreign.body);
    let ws = env.workspace_dir("acme");
    assert!(!ws.join("raw/sources/inbox/keep.md").exists());

    // Ingest one, dismiss the other.
    let ingested = send(
        &address,
        "POST",
        "/w/acme/subscriptions",
        &same_origin,
        &form("ingest", keep),
    );
    assert_eq!(ingested.status, 303, "{}", ingested.body);
    let location = ingested.header("location").expect("redirect").to_string();
    assert!(location.contains("done=captured&n=1"), "{location}");
    assert!(
        ws.join("raw/sources/inbox/keep.md").is_file(),
        "captured into raw/"
    );
    let dismissed = send(
        &address,
        "POST",
        "/w/acme/subscriptions",
        &same_origin,
        &form("dismiss", drop),
    );
    assert_eq!(dismissed.status, 303);
    let after = get(&address, &location, &with);
    assert!(after.body.contains("Captured 1 item"), "{}", after.body);
    assert!(after.body.contains("No pending items"), "{}", after.body);
    let states: Value =
        serde_json::from_str(&env.ok(&["subscription", "list", "acme", "--json"])).expect("json");
    let state_of = |id: i64| {
        states
            .as_array()
            .into_iter()
            .flatten()
            .find(|i| i["id"].as_i64() == Some(id))
            .map(|i| i["state"].as_str().unwrap_or("").to_string())
    };
    assert_eq!(state_of(keep).as_deref(), Some("captured"));
    assert_eq!(state_of(drop).as_deref(), Some("dismissed"));
    let other: Value =
        serde_json::from_str(&env.ok(&["subscription", "list", "other", "--json"])).expect("json");
    assert_eq!(
        other[0]["state"], "pending",
        "the other workspace is untouched"
    );

    // Sync now finds a new file.
    std::fs::write(folder.join("new.md"), "# New\n\nfresh\n").expect("write");
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let synced = send(
        &address,
        "POST",
        "/w/acme/subscriptions",
        &same_origin,
        &format!("csrf={csrf}&source=inbox&action=sync"),
    );
    assert_eq!(synced.status, 303, "{}", synced.body);
    // (The folder watcher may have found it first; either way it is pending now.)
    assert!(
        synced
            .header("location")
            .is_some_and(|l| l.contains("done=synced")),
        "{:?}",
        synced.header("location")
    );
    let listed = get(&address, "/w/acme/subscriptions?state=pending", &with);
    assert!(listed.body.contains("new.md"), "{}", listed.body);
    let bad = send(
        &address,
        "POST",
        "/w/acme/subscriptions",
        &same_origin,
        &format!("csrf={csrf}&item=abc&action=ingest"),
    );
    assert_eq!(bad.status, 400, "{}", bad.body);
}

/// Sync state in the web view: `/` says which workspaces are local only and which sync
/// is failing; the workspace page names the remote and the last error.
#[test]
fn the_web_view_shows_sync_state() {
    let (env, address) = web_env();
    let missing = env.dir.path().join("no-such-remote.git");
    let url = format!("file://{}", missing.display());
    env.ok(&["workspace", "remote", "acme", &url]);
    let failed = env.run(&["sync", "acme"]);
    assert!(!failed.status.success(), "a sync to a missing remote fails");
    let cookie = sign_in(&env, &address);
    let with = [("Cookie", cookie.as_str())];
    let home = get(&address, "/", &with);
    assert!(home.body.contains("sync failing"), "{}", home.body);
    assert!(
        home.body.contains("local only"),
        "global has no remote: {}",
        home.body
    );
    let overview = get(&address, "/w/acme/", &with);
    assert!(
        overview.body.contains("the last sync failed") && overview.body.contains("no-such-remote"),
        "{}",
        overview.body
    );
}
