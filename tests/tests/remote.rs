//! Remote access (issue 19) against a real daemon whose public URL is its own loopback
//! address: the metadata documents, the 401 challenge, dynamic registration, the
//! consent page with a pairing code, PKCE, audience-bound tokens, scopes, refresh
//! rotation with reuse detection, revocation, and the stable-port error.

use std::collections::HashMap;
use std::path::Path;

use alexandria_tests::http::{
    Daemon, JSON, MCP_ACCEPT, Reply, cli, cli_json, http, initialize_body, mint, start_daemon,
};
use alexandria_tests::short_tempdir;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};

const VERIFIER: &str = "a-pkce-code-verifier-that-is-long-enough-0123456789";
const REDIRECT: &str = "http://127.0.0.1:9/callback";

fn challenge(verifier: &str) -> String {
    URL_SAFE_NO_PAD.encode(ring::digest::digest(
        &ring::digest::SHA256,
        verifier.as_bytes(),
    ))
}

fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn form(pairs: &[(&str, &str)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

fn query_of(location: &str) -> HashMap<String, String> {
    let query = location.split_once('?').map_or("", |(_, q)| q);
    query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.to_string(), decode(v)))
        .collect()
}

fn decode(text: &str) -> String {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            out.push(u8::from_str_radix(&text[i + 1..i + 3], 16).expect("hex"));
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).expect("utf8")
}

/// A hidden input's value in the consent page.
fn hidden(page: &str, name: &str) -> String {
    let marker = format!("name={name} value=\"");
    let start = page.find(&marker).expect("hidden input") + marker.len();
    page[start..].split('"').next().expect("value").to_string()
}

struct Remote {
    home: tempfile::TempDir,
    daemon: Daemon,
    origin: String,
}

impl Remote {
    fn start() -> Remote {
        let home = short_tempdir();
        let daemon = start_daemon(home.path(), &["--port", "0"]).expect("daemon starts");
        for slug in ["acme", "other"] {
            let output = cli(home.path(), &["workspace", "create", slug]);
            assert!(output.status.success(), "{output:?}");
        }
        let notes = home.path().join("notes.md");
        std::fs::write(&notes, "# Lighthouses\n\nThe Fresnel lens.\n").expect("write");
        let output = cli(
            home.path(),
            &["ingest", "acme", notes.to_str().expect("utf8")],
        );
        assert!(output.status.success(), "{output:?}");
        let origin = format!("http://{}", daemon.address);
        let enabled = cli(home.path(), &["remote", "enable", "--public-url", &origin]);
        assert!(enabled.status.success(), "{enabled:?}");
        let stdout = String::from_utf8_lossy(&enabled.stdout);
        assert!(stdout.contains(&format!("{origin}/mcp/acme")), "{stdout}");
        Remote {
            home,
            daemon,
            origin,
        }
    }

    fn home(&self) -> &Path {
        self.home.path()
    }

    fn get(&self, path: &str) -> Reply {
        http(&self.daemon.address, "GET", path, &[], "")
    }

    fn post_form(&self, path: &str, body: &str, extra: &[(&str, &str)]) -> Reply {
        let mut headers = vec![("Content-Type", "application/x-www-form-urlencoded")];
        headers.extend_from_slice(extra);
        http(&self.daemon.address, "POST", path, &headers, body)
    }

    fn register(&self, redirect: &str) -> Value {
        let body = json!({"redirect_uris": [redirect], "client_name": "Test <Client>",
            "token_endpoint_auth_method": "none", "grant_types": ["authorization_code", "refresh_token"]});
        let reply = http(
            &self.daemon.address,
            "POST",
            "/register",
            &[JSON],
            &body.to_string(),
        );
        assert_eq!(reply.status, 201, "{}", reply.body);
        serde_json::from_str(&reply.body).expect("json")
    }

    fn pair(&self) -> String {
        let output = cli(self.home(), &["remote", "pair"]);
        assert!(output.status.success(), "{output:?}");
        String::from_utf8(output.stdout)
            .expect("utf8")
            .trim()
            .to_string()
    }

    /// GET /authorize; returns the consent page reply.
    fn authorize(&self, client_id: &str, workspace: &str, scope: &str) -> Reply {
        let query = form(&[
            ("response_type", "code"),
            ("client_id", client_id),
            ("redirect_uri", REDIRECT),
            ("state", "st4te"),
            ("code_challenge", &challenge(VERIFIER)),
            ("code_challenge_method", "S256"),
            ("resource", &format!("{}/mcp/{workspace}", self.origin)),
            ("scope", scope),
        ]);
        self.get(&format!("/authorize?{query}"))
    }

    /// Post the consent form with `code`.
    fn consent(&self, page: &Reply, code: &str) -> Reply {
        let csrf = hidden(&page.body, "csrf");
        let request_id = hidden(&page.body, "request_id");
        let cookie = format!("alx_csrf={csrf}");
        self.post_form(
            "/authorize",
            &form(&[
                ("request_id", &request_id),
                ("csrf", &csrf),
                ("pairing_code", code),
                ("decision", "approve"),
            ]),
            &[("Cookie", &cookie), ("Origin", &self.origin)],
        )
    }

    /// The whole dance: register, authorize, consent, exchange. The token response.
    fn tokens(&self, workspace: &str, scope: &str) -> (String, Value) {
        let client = self.register(REDIRECT);
        let client_id = client["client_id"].as_str().expect("client_id").to_string();
        let page = self.authorize(&client_id, workspace, scope);
        assert_eq!(page.status, 200, "{}", page.body);
        let approved = self.consent(&page, &self.pair());
        assert_eq!(approved.status, 303, "{}", approved.body);
        let params = query_of(approved.header("location").expect("location"));
        let reply = self.exchange(&client_id, &params["code"], workspace);
        assert_eq!(reply.status, 200, "{}", reply.body);
        (client_id, serde_json::from_str(&reply.body).expect("json"))
    }

    fn exchange(&self, client_id: &str, code: &str, workspace: &str) -> Reply {
        self.post_form(
            "/token",
            &form(&[
                ("grant_type", "authorization_code"),
                ("code", code),
                ("redirect_uri", REDIRECT),
                ("client_id", client_id),
                ("code_verifier", VERIFIER),
                ("resource", &format!("{}/mcp/{workspace}", self.origin)),
            ]),
            &[],
        )
    }

    fn refresh(&self, client_id: &str, refresh_token: &str) -> Reply {
        self.post_form(
            "/token",
            &form(&[
                ("grant_type", "refresh_token"),
                ("refresh_token", refresh_token),
                ("client_id", client_id),
            ]),
            &[],
        )
    }

    /// POST initialize to `path` with `token`; the status.
    fn initialize(&self, path: &str, token: &str) -> Reply {
        let bearer = format!("Bearer {token}");
        http(
            &self.daemon.address,
            "POST",
            path,
            &[MCP_ACCEPT, JSON, ("Authorization", &bearer)],
            &initialize_body(),
        )
    }
}

#[test]
fn metadata_and_challenge_name_the_public_url_only() {
    let remote = Remote::start();
    let origin = &remote.origin;
    // No token: 401 pointing at this endpoint's metadata, with the scope to ask for.
    let denied = http(
        &remote.daemon.address,
        "POST",
        "/mcp/acme",
        &[MCP_ACCEPT, JSON, ("Host", "evil.example.org")],
        &initialize_body(),
    );
    assert_eq!(denied.status, 403, "a foreign Host is still refused");
    let denied = remote.initialize("/mcp/acme", "not-a-token");
    assert_eq!(denied.status, 401);
    let challenge = denied.header("www-authenticate").expect("challenge");
    assert!(
        challenge.starts_with(&format!(
            "Bearer resource_metadata=\"{origin}/.well-known/oauth-protected-resource/mcp/acme\", scope=\"wiki:read\""
        )),
        "{challenge}"
    );
    assert!(challenge.contains("error=\"invalid_token\""), "{challenge}");
    let bare = http(
        &remote.daemon.address,
        "POST",
        "/mcp",
        &[MCP_ACCEPT, JSON],
        &initialize_body(),
    );
    assert_eq!(bare.status, 401);
    assert!(
        bare.header("www-authenticate")
            .expect("challenge")
            .contains(&format!(
                "{origin}/.well-known/oauth-protected-resource/mcp\""
            )),
    );

    // The documents are public, never built from Host or X-Forwarded-*.
    let forwarded = [
        ("X-Forwarded-Host", "evil.example"),
        ("X-Forwarded-Proto", "https"),
    ];
    for (path, resource) in [
        (
            "/.well-known/oauth-protected-resource/mcp/acme",
            format!("{origin}/mcp/acme"),
        ),
        (
            "/.well-known/oauth-protected-resource/mcp",
            format!("{origin}/mcp"),
        ),
        (
            "/.well-known/oauth-protected-resource",
            format!("{origin}/mcp"),
        ),
    ] {
        let reply = http(&remote.daemon.address, "GET", path, &forwarded, "");
        assert_eq!(reply.status, 200, "{path}: {}", reply.body);
        assert_eq!(reply.header("access-control-allow-origin"), Some("*"));
        let document: Value = serde_json::from_str(&reply.body).expect("json");
        assert_eq!(document["resource"], json!(resource));
        assert_eq!(document["authorization_servers"], json!([origin]));
        assert_eq!(
            document["scopes_supported"],
            json!(["wiki:read", "wiki:write"])
        );
        assert_eq!(document["bearer_methods_supported"], json!(["header"]));
    }
    for path in [
        "/.well-known/oauth-authorization-server",
        "/.well-known/openid-configuration",
    ] {
        let reply = http(&remote.daemon.address, "GET", path, &forwarded, "");
        assert_eq!(reply.status, 200, "{path}");
        let document: Value = serde_json::from_str(&reply.body).expect("json");
        assert_eq!(document["issuer"], json!(origin));
        assert_eq!(document["token_endpoint"], json!(format!("{origin}/token")));
        assert_eq!(
            document["code_challenge_methods_supported"],
            json!(["S256"])
        );
        assert_eq!(
            document["authorization_response_iss_parameter_supported"],
            json!(true)
        );
        assert!(
            document["token_endpoint_auth_methods_supported"]
                .as_array()
                .expect("list")
                .contains(&json!("none"))
        );
    }
    assert_eq!(
        remote
            .get("/.well-known/oauth-protected-resource/mcp/no_such!")
            .status,
        404
    );
    // Off again: the documents are gone and local HTTP needs no token.
    let status = cli_json(remote.home(), &["remote", "status", "--json"]);
    assert_eq!(status["public_url"], json!(origin));
    assert_eq!(status["enabled"], json!(true));
    let output = cli(remote.home(), &["remote", "disable"]);
    assert!(output.status.success());
    assert_eq!(
        remote.get("/.well-known/oauth-authorization-server").status,
        404
    );
    let open = http(
        &remote.daemon.address,
        "POST",
        "/mcp/acme",
        &[MCP_ACCEPT, JSON],
        &initialize_body(),
    );
    assert_eq!(open.status, 200, "{}", open.body);
}

#[test]
fn registration_consent_and_tokens() {
    let remote = Remote::start();
    // Registration: https or loopback redirects only.
    let bad = http(
        &remote.daemon.address,
        "POST",
        "/register",
        &[JSON],
        &json!({"redirect_uris": ["http://evil.example/cb"]}).to_string(),
    );
    assert_eq!(bad.status, 400);
    assert!(bad.body.contains("invalid_redirect_uri"), "{}", bad.body);
    let with_secret = http(
        &remote.daemon.address,
        "POST",
        "/register",
        &[JSON],
        &json!({"redirect_uris": ["https://claude.ai/api/mcp/auth_callback"], "token_endpoint_auth_method": "client_secret_post"}).to_string(),
    );
    assert_eq!(with_secret.status, 201);
    assert!(with_secret.body.contains("client_secret"));

    let client = remote.register(REDIRECT);
    let client_id = client["client_id"].as_str().expect("id").to_string();
    // The consent page: escaped, framed by nobody, names client, host and workspace.
    let page = remote.authorize(&client_id, "acme", "wiki:read");
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains("Test &lt;Client&gt;"));
    assert!(!page.body.contains("<Client>"));
    assert!(page.body.contains("<code>acme</code>"));
    assert!(page.body.contains("127.0.0.1"));
    let csp = page.header("content-security-policy").expect("csp");
    assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
    assert!(
        page.header("set-cookie")
            .expect("cookie")
            .contains("HttpOnly")
    );

    // A wrong pairing code issues nothing; a missing cookie neither.
    let wrong = remote.consent(&page, "AAAA-AAAA");
    assert_eq!(wrong.status, 400);
    assert!(wrong.header("location").is_none());
    assert!(wrong.body.contains("tries left"), "{}", wrong.body);
    let code = remote.pair();
    let no_cookie = remote.post_form(
        "/authorize",
        &form(&[
            ("request_id", &hidden(&page.body, "request_id")),
            ("csrf", &hidden(&page.body, "csrf")),
            ("pairing_code", &code),
        ]),
        &[],
    );
    assert_eq!(no_cookie.status, 400);
    assert!(no_cookie.header("location").is_none());
    // The right code: redirect with code, state and iss; the code works once.
    let approved = remote.consent(&page, &code.to_lowercase());
    assert_eq!(approved.status, 303, "{}", approved.body);
    let location = approved.header("location").expect("location");
    assert!(location.starts_with(REDIRECT), "{location}");
    let params = query_of(location);
    assert_eq!(params["state"], "st4te");
    assert_eq!(params["iss"], remote.origin);
    let again = remote.consent(&page, &code);
    assert_eq!(
        again.status, 400,
        "the request and the pairing code are used up"
    );

    // PKCE: a wrong verifier fails, and burns nothing for the honest client? No: the
    // code is single-use, so check the wrong verifier on a second authorization.
    let reply = remote.exchange(&client_id, &params["code"], "acme");
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.header("cache-control"), Some("no-store"));
    let tokens: Value = serde_json::from_str(&reply.body).expect("json");
    assert_eq!(tokens["token_type"], "Bearer");
    assert_eq!(tokens["expires_in"], 3600);
    assert_eq!(tokens["scope"], "wiki:read");
    let access = tokens["access_token"].as_str().expect("access");
    let reuse = remote.exchange(&client_id, &params["code"], "acme");
    assert_eq!(reuse.status, 400);
    assert!(reuse.body.contains("invalid_grant"));
    // A replayed code revokes what it produced.
    assert_eq!(remote.initialize("/mcp/acme", access).status, 401);

    // Unknown client → 401 invalid_client (clients re-register on it).
    let unknown = remote.exchange("alx-nobody", "x", "acme");
    assert_eq!(unknown.status, 401);
    assert!(unknown.body.contains("invalid_client"));
}

#[test]
fn tokens_are_bound_to_their_endpoint_and_scope() {
    let remote = Remote::start();
    let (_, tokens) = remote.tokens("acme", "wiki:read");
    let access = tokens["access_token"].as_str().expect("access");
    let ok = remote.initialize("/mcp/acme", access);
    assert_eq!(ok.status, 200, "{}", ok.body);
    for other in ["/mcp/other", "/mcp"] {
        let refused = remote.initialize(other, access);
        assert_eq!(refused.status, 401, "{other}");
    }
    // Writing needs wiki:write: 403 insufficient_scope before the tool runs.
    let session = ok.header("mcp-session-id").expect("session").to_string();
    let bearer = format!("Bearer {access}");
    let headers = [
        MCP_ACCEPT,
        JSON,
        ("Authorization", bearer.as_str()),
        ("Mcp-Session-Id", session.as_str()),
        ("MCP-Protocol-Version", "2025-11-25"),
    ];
    let write = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "write",
        "arguments": {"command": "create", "path": "wiki/a.md", "content": "# A\n"}}});
    let denied = http(
        &remote.daemon.address,
        "POST",
        "/mcp/acme",
        &headers,
        &write.to_string(),
    );
    assert_eq!(denied.status, 403, "{}", denied.body);
    let challenge = denied.header("www-authenticate").expect("challenge");
    assert!(
        challenge.contains("error=\"insufficient_scope\""),
        "{challenge}"
    );
    assert!(challenge.contains("wiki:write"), "{challenge}");
    assert!(!remote.home().join("workspaces/acme/wiki/a.md").exists());
    let search = json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "search",
        "arguments": {"query": "Fresnel"}}});
    let found = http(
        &remote.daemon.address,
        "POST",
        "/mcp/acme",
        &headers,
        &search.to_string(),
    );
    assert_eq!(found.status, 200, "{}", found.body);
    assert!(found.body.contains("raw/notes.md"), "{}", found.body);

    // With wiki:write the write goes through.
    let (_, writer) = remote.tokens("acme", "wiki:read wiki:write");
    assert_eq!(writer["scope"], "wiki:read wiki:write");
    let writer = writer["access_token"].as_str().expect("access");
    let ok = remote.initialize("/mcp/acme", writer);
    let session = ok.header("mcp-session-id").expect("session").to_string();
    let bearer = format!("Bearer {writer}");
    let headers = [
        MCP_ACCEPT,
        JSON,
        ("Authorization", bearer.as_str()),
        ("Mcp-Session-Id", session.as_str()),
        ("MCP-Protocol-Version", "2025-11-25"),
    ];
    let wrote = http(
        &remote.daemon.address,
        "POST",
        "/mcp/acme",
        &headers,
        &write.to_string(),
    );
    assert_eq!(wrote.status, 200, "{}", wrote.body);
    assert!(
        remote.home().join("workspaces/acme/wiki/a.md").exists(),
        "{}",
        wrote.body
    );

    // CLI tokens keep working beside OAuth.
    let cli_token = mint(remote.home(), &[]);
    assert_eq!(remote.initialize("/mcp/other", &cli_token).status, 200);
}

#[test]
fn refresh_rotates_and_reuse_revokes_the_grant() {
    let remote = Remote::start();
    let (client_id, first) = remote.tokens("acme", "wiki:read");
    let refresh1 = first["refresh_token"].as_str().expect("refresh");
    let rotated = remote.refresh(&client_id, refresh1);
    assert_eq!(rotated.status, 200, "{}", rotated.body);
    assert_eq!(rotated.header("cache-control"), Some("no-store"));
    let second: Value = serde_json::from_str(&rotated.body).expect("json");
    let refresh2 = second["refresh_token"].as_str().expect("refresh");
    assert_ne!(refresh1, refresh2);
    let access2 = second["access_token"].as_str().expect("access");
    assert_eq!(remote.initialize("/mcp/acme", access2).status, 200);
    // Someone replays the first refresh token: the whole grant dies.
    let replay = remote.refresh(&client_id, refresh1);
    assert_eq!(replay.status, 400);
    assert!(replay.body.contains("invalid_grant"));
    assert_eq!(remote.refresh(&client_id, refresh2).status, 400);
    assert_eq!(remote.initialize("/mcp/acme", access2).status, 401);

    // RFC 7009 revocation of a refresh token kills its access tokens too.
    let (client_id, tokens) = remote.tokens("acme", "wiki:read");
    let access = tokens["access_token"].as_str().expect("access");
    assert_eq!(remote.initialize("/mcp/acme", access).status, 200);
    let revoked = remote.post_form(
        "/revoke",
        &form(&[
            ("token", tokens["refresh_token"].as_str().expect("refresh")),
            ("client_id", &client_id),
        ]),
        &[],
    );
    assert_eq!(revoked.status, 200);
    assert_eq!(remote.initialize("/mcp/acme", access).status, 401);

    // `remote clients` lists live grants; `remote revoke` ends them.
    let (client_id, tokens) = remote.tokens("acme", "wiki:read");
    let clients = cli_json(remote.home(), &["remote", "clients", "--json"]);
    let listed = clients
        .as_array()
        .expect("list")
        .iter()
        .find(|c| c["client_id"] == json!(client_id))
        .expect("listed");
    assert_eq!(listed["grants"][0]["workspace"], "acme");
    assert_eq!(listed["name"], "Test <Client>");
    let output = cli(remote.home(), &["remote", "revoke", &client_id]);
    assert!(output.status.success(), "{output:?}");
    let access = tokens["access_token"].as_str().expect("access");
    assert_eq!(remote.initialize("/mcp/acme", access).status, 401);
    let output = cli(remote.home(), &["remote", "revoke", "--all"]);
    assert!(output.status.success(), "{output:?}");
}

#[test]
fn bad_public_urls_and_busy_ports_are_explained() {
    let home = short_tempdir();
    let _daemon = start_daemon(home.path(), &["--port", "0"]).expect("daemon starts");
    for (url, words) in [
        ("http://wiki.example.org", "must use https"),
        ("https://wiki.example.org/prefix", "path"),
        ("not a url", "not an http(s) URL"),
    ] {
        let output = cli(home.path(), &["remote", "enable", "--public-url", url]);
        assert!(!output.status.success(), "{url}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(words), "{url}: {stderr}");
    }
    let output = cli(home.path(), &["remote", "pair"]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("remote access is off"));

    // A taken port: the daemon serves the socket and says which key to change.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port().to_string();
    let other = short_tempdir();
    let _busy = start_daemon_without_http(other.path(), &["--port", &port]);
    let status = cli_json(other.path(), &["daemon", "status", "--json"]);
    assert_eq!(status["http"], Value::Null);
    let error = status["http_error"].as_str().expect("http_error");
    assert!(error.contains("[http] port"), "{error}");
    assert!(error.contains(&port), "{error}");
}

/// Start a daemon expected to serve without HTTP (its status has no URL).
fn start_daemon_without_http(home: &Path, args: &[&str]) -> Daemon {
    use std::io::BufRead;
    let mut command = std::process::Command::new(alexandria_tests::bin_path("alexandriad"));
    alexandria_tests::isolate(&mut command, home);
    let mut child = command
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("notice");
    assert!(line.contains("ready"), "{line}");
    Daemon {
        child,
        address: String::new(),
    }
}

/// The web view's `/access` page: lists the remote client (its name escaped) with a
/// Revoke button that ends its access at once; revoking needs the browser session and
/// its CSRF token (a bearer token cannot), and "revoke everyone" needs the confirmation.
#[test]
fn the_access_page_lists_and_revokes_remote_clients() {
    let remote = Remote::start();
    let (client_id, tokens) = remote.tokens("acme", "wiki:read");
    let access = tokens["access_token"].as_str().expect("access token");
    assert_eq!(remote.initialize("/mcp/acme", access).status, 200);

    let login = cli(remote.home(), &["web", "--no-open"]);
    assert!(login.status.success(), "{login:?}");
    let url = String::from_utf8_lossy(&login.stdout).trim().to_string();
    let login_path = &url[url.find("/login?token=").expect("a login URL")..];
    let signed_in = remote.get(login_path);
    assert_eq!(signed_in.status, 303, "{}", signed_in.body);
    let cookie = signed_in
        .header("set-cookie")
        .and_then(|c| c.split(';').next())
        .expect("a session cookie")
        .to_string();
    let page = http(
        &remote.daemon.address,
        "GET",
        "/access",
        &[("Cookie", &cookie)],
        "",
    );
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains(&client_id), "{}", page.body);
    assert!(
        page.body.contains("Test &lt;Client&gt;") && !page.body.contains("Test <Client>"),
        "the client's self-chosen name is escaped: {}",
        page.body
    );
    assert!(
        page.body.contains(&remote.origin),
        "the public URL is shown"
    );
    let csrf = page
        .body
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a CSRF token in the page")
        .to_string();

    // An agent's bearer token cannot revoke anything.
    let bearer = format!("Bearer {access}");
    let by_token = remote.post_form(
        "/access",
        &form(&[
            ("csrf", &csrf),
            ("action", "revoke_client"),
            ("client", &client_id),
        ]),
        &[("Authorization", &bearer), ("Origin", &remote.origin)],
    );
    assert_ne!(by_token.status, 303, "{}", by_token.body);
    assert_eq!(remote.initialize("/mcp/acme", access).status, 200);
    // "Revoke everyone" without the confirmation box changes nothing.
    let unconfirmed = remote.post_form(
        "/access",
        &form(&[("csrf", &csrf), ("action", "revoke_clients")]),
        &[("Cookie", &cookie), ("Origin", &remote.origin)],
    );
    assert_eq!(unconfirmed.status, 400, "{}", unconfirmed.body);
    assert_eq!(remote.initialize("/mcp/acme", access).status, 200);

    let revoked = remote.post_form(
        "/access",
        &form(&[
            ("csrf", &csrf),
            ("action", "revoke_client"),
            ("client", &client_id),
        ]),
        &[("Cookie", &cookie), ("Origin", &remote.origin)],
    );
    assert_eq!(revoked.status, 303, "{}", revoked.body);
    assert_eq!(revoked.header("location"), Some("/access?done=client"));
    assert_eq!(
        remote.initialize("/mcp/acme", access).status,
        401,
        "the revoked client's token stops working at once"
    );
    let after = http(
        &remote.daemon.address,
        "GET",
        "/access?done=client",
        &[("Cookie", &cookie)],
        "",
    );
    assert!(after.body.contains("Revoked the client"), "{}", after.body);
    assert!(!after.body.contains(&client_id), "{}", after.body);
    let clients = cli(remote.home(), &["remote", "clients"]);
    assert!(
        String::from_utf8_lossy(&clients.stdout).contains("no registered clients"),
        "{clients:?}"
    );
}

/// Client ID Metadata Documents: a client whose client_id is the URL of its metadata
/// (as Claude.ai's is) authorizes without registering; the server advertises it; a
/// document that names another client_id or another redirect is refused; the client is
/// listed and revocable like a registered one.
#[test]
fn a_client_metadata_document_replaces_registration() {
    use alexandria_bench::httpd::{Route, Server};
    let remote = Remote::start();
    let metadata: Value =
        serde_json::from_str(&remote.get("/.well-known/oauth-authorization-server").body)
            .expect("json");
    assert_eq!(metadata["client_id_metadata_document_supported"], true);

    let server = Server::start().expect("document server");
    let client_id = server.url("/oauth/client-metadata");
    server.route(
        "/oauth/client-metadata",
        Route::body(
            "application/json",
            json!({"client_id": client_id, "client_name": "Metadata <Client>",
                   "redirect_uris": [REDIRECT], "token_endpoint_auth_method": "none"})
            .to_string(),
        ),
    );
    let page = remote.authorize(&client_id, "acme", "wiki:read");
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(
        page.body.contains("Metadata &lt;Client&gt;"),
        "{}",
        page.body
    );
    let approved = remote.consent(&page, &remote.pair());
    assert_eq!(approved.status, 303, "{}", approved.body);
    let params = query_of(approved.header("location").expect("location"));
    let reply = remote.exchange(&client_id, &params["code"], "acme");
    assert_eq!(reply.status, 200, "{}", reply.body);
    let tokens: Value = serde_json::from_str(&reply.body).expect("json");
    let access = tokens["access_token"].as_str().expect("access token");
    assert_eq!(remote.initialize("/mcp/acme", access).status, 200);
    let listed = cli(remote.home(), &["remote", "clients"]);
    assert!(
        String::from_utf8_lossy(&listed.stdout).contains(&client_id),
        "{listed:?}"
    );

    // A document that claims another identity, or a redirect it does not list.
    let liar = server.url("/oauth/liar");
    server.route(
        "/oauth/liar",
        Route::body(
            "application/json",
            json!({"client_id": "https://claude.ai/oauth/mcp-oauth-client-metadata",
                   "redirect_uris": [REDIRECT]})
            .to_string(),
        ),
    );
    let refused = remote.authorize(&liar, "acme", "wiki:read");
    assert_ne!(refused.status, 200, "{}", refused.body);
    assert!(refused.body.contains("client_id"), "{}", refused.body);
    let other_redirect = server.url("/oauth/other");
    server.route(
        "/oauth/other",
        Route::body(
            "application/json",
            json!({"client_id": other_redirect, "redirect_uris": ["http://127.0.0.1:9/elsewhere"]})
                .to_string(),
        ),
    );
    let refused = remote.authorize(&other_redirect, "acme", "wiki:read");
    assert_ne!(refused.status, 200, "{}", refused.body);

    // Revoked like any client: the token stops working.
    let revoked = cli(remote.home(), &["remote", "revoke", &client_id]);
    assert!(revoked.status.success(), "{revoked:?}");
    assert_eq!(remote.initialize("/mcp/acme", access).status, 401);
}

#[test]
fn remote_doctor_checks_the_public_url_from_outside() {
    let remote = Remote::start();
    let passed = cli(remote.home(), &["remote", "doctor", "--json"]);
    assert!(passed.status.success(), "{passed:?}");
    let report: Value = serde_json::from_slice(&passed.stdout).expect("json");
    assert_eq!(report["ok"], json!(true), "{report}");
    assert_eq!(
        report["checks"].as_array().map(Vec::len),
        Some(4),
        "{report}"
    );

    // A public URL nothing answers at (the tunnel is down): said, with a hint.
    let free = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let dead = format!("http://{}", free.local_addr().expect("addr"));
    drop(free);
    let enabled = cli(remote.home(), &["remote", "enable", "--public-url", &dead]);
    assert!(enabled.status.success(), "{enabled:?}");
    let failed = cli(remote.home(), &["remote", "doctor"]);
    assert!(!failed.status.success());
    let text = String::from_utf8_lossy(&failed.stderr);
    assert!(text.contains("PROBLEM"), "{text}");
    assert!(text.contains("cannot reach"), "{text}");
    assert!(text.contains("tunnel"), "{text}");

    let off = cli(remote.home(), &["remote", "disable"]);
    assert!(off.status.success(), "{off:?}");
    let failed = cli(remote.home(), &["remote", "doctor"]);
    assert!(!failed.status.success());
    assert!(
        String::from_utf8_lossy(&failed.stderr).contains("remote access is off"),
        "{failed:?}"
    );
}
