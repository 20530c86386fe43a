//! A new user's first day (issue 17): client entries that reach the right home, a shim that
//! explains a missing home instead of creating one, `alexandria doctor`, completions and
//! the man page. Real binaries, temp homes, client processes started the way MCP clients
//! start them (a reduced environment, the entry's command and env exactly as written).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use alexandria_tests::{Env, RawShim, short_tempdir};
use serde_json::{Value, json};

/// What the official Python SDK's stdio client passes to a server when the entry has no
/// `env`: only these variables of the parent (`get_default_environment()`).
const SDK_DEFAULT_VARS: [&str; 6] = ["HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER"];

/// A user account: a HOME for client config files, and a project directory.
struct User {
    _dir: tempfile::TempDir,
    home: PathBuf,
    project: PathBuf,
}

impl User {
    fn new() -> User {
        let dir = short_tempdir();
        let root = fs::canonicalize(dir.path()).expect("canonical temp dir");
        let user = User {
            home: root.join("u"),
            project: root.join("p"),
            _dir: dir,
        };
        fs::create_dir_all(&user.home).expect("home");
        fs::create_dir_all(&user.project).expect("project");
        user
    }

    /// `alexandria` run by this user against `env`'s alexandria home (`ALEXANDRIA_HOME`).
    fn command(&self, env: &Env, args: &[&str]) -> Command {
        let mut command = env.command();
        command
            .args(args)
            .current_dir(&self.project)
            .env("HOME", &self.home)
            .env_remove("XDG_CONFIG_HOME")
            .env_remove("CLAUDE_CONFIG_DIR")
            .env_remove("CODEX_HOME");
        command
    }

    fn alexandria(&self, env: &Env, args: &[&str]) -> std::process::Output {
        self.command(env, args).output().expect("run alexandria")
    }

    fn ok(&self, env: &Env, args: &[&str]) -> String {
        let output = self.alexandria(env, args);
        assert!(
            output.status.success(),
            "alexandria {args:?} failed:\n{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Start an entry's command as an MCP client does: the SDK's reduced environment (this
    /// user's HOME, a system PATH) plus the entry's own `env`.
    fn start_entry(&self, entry: &Value) -> RawShim {
        let mut command = Command::new(entry["command"].as_str().expect("command"));
        let args: Vec<&str> = entry["args"]
            .as_array()
            .expect("args")
            .iter()
            .map(|a| a.as_str().expect("string arg"))
            .collect();
        command.args(args).env_clear().current_dir(&self.project);
        for var in SDK_DEFAULT_VARS {
            match var {
                "HOME" => command.env(var, &self.home),
                "PATH" => command.env(var, "/usr/local/bin:/usr/bin:/bin"),
                _ => match std::env::var_os(var) {
                    Some(value) => command.env(var, value),
                    None => &mut command,
                },
            };
        }
        if let Some(env) = entry.get("env").and_then(Value::as_object) {
            for (key, value) in env {
                command.env(key, value.as_str().expect("string env"));
            }
        }
        RawShim::spawn(command)
    }
}

fn read_json(path: &Path) -> Value {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parse {}: {e}", path.display()))
}

fn guide_text(shim: &mut RawShim) -> Value {
    shim.initialize("2025-11-25");
    shim.request(7, "tools/call", json!({"name": "guide", "arguments": {}}))
}

#[test]
fn an_installed_entry_reaches_the_home_it_was_installed_from() {
    let env = Env::new();
    env.ok(&["init"]);
    env.ok(&["workspace", "create", "acme"]);
    let user = User::new();

    let out = user.ok(&env, &["mcp", "install", "cursor"]);
    let home = env.home.display().to_string();
    assert!(
        out.contains(&format!("env: ALEXANDRIA_HOME={home}")),
        "{out}"
    );
    let file = user.home.join(".cursor/mcp.json");
    let entry = read_json(&file)["mcpServers"]["alexandria"].clone();
    assert_eq!(entry["env"], json!({"ALEXANDRIA_HOME": home}), "{entry}");

    // Started exactly as written, with what the SDK passes: the agent sees `acme`.
    let mut shim = user.start_entry(&entry);
    let reply = guide_text(&mut shim);
    let text = reply["result"]["content"][0]["text"].as_str().unwrap_or("");
    assert!(text.contains("acme"), "{reply}");

    // The same entry without its env is what users had before: it must not silently
    // start a second, empty home under the user's HOME.
    let mut bare = entry.clone();
    bare.as_object_mut().expect("object").remove("env");
    let mut shim = user.start_entry(&bare);
    let reply = guide_text(&mut shim);
    assert_eq!(
        reply["result"]["structuredContent"]["error"]["code"], "home_not_found",
        "{reply}"
    );
    assert!(!user.home.join(".alexandria").exists());

    // Re-installing is idempotent; `--home` on the command line is the same home.
    let out = user.ok(&env, &["--home", &home, "mcp", "install", "cursor"]);
    assert!(out.contains("already has an up-to-date"), "{out}");

    // From the default home the variable is removed again (the user's own are kept).
    let mut with_user_var = read_json(&file);
    with_user_var["mcpServers"]["alexandria"]["env"]["MY_VAR"] = json!("1");
    fs::write(
        &file,
        serde_json::to_string_pretty(&with_user_var).expect("json"),
    )
    .expect("write");
    let default_home = user.home.join(".alexandria");
    let out = user.ok(
        &env,
        &[
            "--home",
            default_home.to_str().expect("utf-8"),
            "mcp",
            "install",
            "cursor",
        ],
    );
    assert!(out.contains("is not set up yet"), "{out}");
    let entry = read_json(&file)["mcpServers"]["alexandria"].clone();
    assert_eq!(entry["env"], json!({"MY_VAR": "1"}), "{entry}");
}

#[test]
fn every_client_with_env_gets_the_home() {
    let env = Env::new();
    let user = User::new();
    let home = env.home.display().to_string();
    let json_clients = [
        (
            "claude-desktop",
            ".config/Claude/claude_desktop_config.json",
            "mcpServers",
        ),
        (
            "windsurf",
            ".codeium/windsurf/mcp_config.json",
            "mcpServers",
        ),
        ("gemini", ".gemini/settings.json", "mcpServers"),
        ("zed", ".config/zed/settings.json", "context_servers"),
        ("vscode", ".config/Code/User/mcp.json", "servers"),
        ("claude-code", ".claude.json", "mcpServers"),
    ];
    for (client, file, key) in json_clients {
        user.ok(&env, &["mcp", "install", client]);
        let entry = read_json(&user.home.join(file))[key]["alexandria"].clone();
        assert_eq!(
            entry["env"]["ALEXANDRIA_HOME"],
            json!(home),
            "{client}: {entry}"
        );
    }
    user.ok(&env, &["mcp", "install", "codex"]);
    let codex: Value = toml::from_str(
        &fs::read_to_string(user.home.join(".codex/config.toml")).expect("codex config"),
    )
    .expect("toml");
    assert_eq!(
        codex["mcp_servers"]["alexandria"]["env"]["ALEXANDRIA_HOME"],
        json!(home)
    );
    user.ok(&env, &["mcp", "install", "continue"]);
    let block: Value = serde_norway::from_str(
        &fs::read_to_string(user.home.join(".continue/mcpServers/alexandria.yaml"))
            .expect("continue block"),
    )
    .expect("yaml");
    assert_eq!(
        block["mcpServers"][0]["env"]["ALEXANDRIA_HOME"],
        json!(home),
        "{block}"
    );
}

#[test]
fn a_shim_without_a_home_explains_instead_of_creating_one() {
    let env = Env::new();
    // No home at all, then a directory without config.toml.
    for set_up in [false, true] {
        if set_up {
            fs::create_dir_all(&env.home).expect("home dir");
        }
        let mut shim = RawShim::spawn(env.bare_shim_command(Some("acme")));
        let init = shim.initialize("2025-06-18");
        assert_eq!(init["result"]["protocolVersion"], "2025-06-18", "{init}");
        assert_eq!(init["result"]["serverInfo"]["name"], "alexandria");
        let tools = shim.request(1, "tools/list", json!({}));
        assert!(
            tools["result"]["tools"]
                .as_array()
                .is_some_and(|t| t.iter().any(|t| t["name"] == "read")),
            "{tools}"
        );
        for (id, tool) in [(2, "guide"), (3, "read")] {
            let reply = shim.request(
                id,
                "tools/call",
                json!({"name": tool, "arguments": {"path": "wiki/index.md"}}),
            );
            let result = &reply["result"];
            assert_eq!(result["isError"], true, "{reply}");
            let error = &result["structuredContent"]["error"];
            assert_eq!(error["code"], "home_not_found");
            assert_eq!(error["home"], json!(env.home.display().to_string()));
            let text = result["content"][0]["text"].as_str().unwrap_or("");
            assert!(text.starts_with("home_not_found"), "{text}");
            assert!(text.contains(&env.home.display().to_string()), "{text}");
            assert!(text.contains("init"), "{text}");
            assert!(text.contains("mcp install"), "{text}");
        }
        let status = shim.close();
        assert!(status.success());
        // Nothing was created and no daemon started.
        assert_eq!(env.home.exists(), set_up);
        assert!(!env.home.join("run").exists());
        assert!(!env.home.join("config.toml").exists());
    }
    // Once the home is set up the same command works.
    env.ok(&["init"]);
    let mut shim = env.raw_shim(None);
    let reply = guide_text(&mut shim);
    assert_ne!(reply["result"]["isError"], true, "{reply}");
}

#[test]
fn the_home_flag_is_global_and_reaches_the_daemon() {
    let env = Env::new();
    // `other` owns the second home (its drop stops the daemon started there).
    let other = Env::new();
    let other_home = other.home.to_str().expect("utf-8").to_string();
    let out = env.ok(&["--home", &other_home, "init"]);
    assert!(other.home.join("config.toml").is_file(), "{out}");
    assert!(!env.home.exists(), "ALEXANDRIA_HOME was not used");
    // The flag also works after the subcommand, and for the shim.
    let mut command = env.command();
    command.args(["mcp", "serve", "--home", &other_home]);
    let mut shim = RawShim::spawn(command);
    let reply = guide_text(&mut shim);
    assert_ne!(reply["result"]["isError"], true, "{reply}");
    assert!(!env.home.exists());
}

/// `alexandria doctor --json` as `user`: exit code and the parsed report.
fn doctor(user: &User, env: &Env) -> (i32, Value) {
    let output = user.alexandria(env, &["doctor", "--json"]);
    let report: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor --json printed no JSON ({e}):\n{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    });
    (output.status.code().unwrap_or(-1), report)
}

/// The findings of one check.
fn findings<'a>(report: &'a Value, check: &str) -> Vec<&'a Value> {
    report["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter(|f| f["check"] == check)
        .collect()
}

fn only<'a>(report: &'a Value, check: &str) -> &'a Value {
    let found = findings(report, check);
    assert_eq!(found.len(), 1, "one {check} finding expected: {report:#}");
    found[0]
}

#[test]
fn doctor_passes_a_healthy_install_and_finds_each_planted_fault() {
    let env = Env::new();
    env.ok(&["init"]);
    let user = User::new();
    user.ok(&env, &["mcp", "install", "cursor"]);
    let file = user.home.join(".cursor/mcp.json");
    let healthy = fs::read_to_string(&file).expect("entry");

    let (code, report) = doctor(&user, &env);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["ok"], true);
    assert_eq!(report["errors"], 0, "{report:#}");
    assert_eq!(report["warnings"], 0, "{report:#}");
    for check in [
        "binaries",
        "home",
        "daemon",
        "log",
        "client:cursor",
        "service",
        "disk",
    ] {
        assert_eq!(only(&report, check)["status"], "ok", "{check}: {report:#}");
    }
    // The human form says the same and points at nothing to fix.
    let text = user.ok(&env, &["doctor"]);
    assert!(text.contains("all good"), "{text}");

    // Stale binary path: the entry runs a binary that was moved away.
    let mut entry: Value = serde_json::from_str(&healthy).expect("json");
    entry["mcpServers"]["alexandria"]["command"] = json!("/opt/gone/alexandria");
    fs::write(&file, entry.to_string()).expect("plant");
    let (code, report) = doctor(&user, &env);
    assert_eq!(code, 1, "{report:#}");
    let finding = only(&report, "client:cursor");
    assert_eq!(finding["status"], "error");
    assert!(
        finding["message"]
            .as_str()
            .unwrap_or("")
            .contains("/opt/gone/alexandria"),
        "{finding}"
    );
    assert_eq!(finding["fix"], "alexandria mcp install cursor");

    // Malformed client file.
    fs::write(&file, "{\"mcpServers\": {\"alexandria\": ").expect("plant");
    let (code, report) = doctor(&user, &env);
    assert_eq!(code, 1);
    let finding = only(&report, "client:cursor");
    assert_eq!(finding["status"], "error", "{finding}");
    assert!(
        finding["message"]
            .as_str()
            .unwrap_or("")
            .contains("cannot be read"),
        "{finding}"
    );

    // Wrong home: the entry reaches a home that was never set up.
    let mut entry: Value = serde_json::from_str(&healthy).expect("json");
    entry["mcpServers"]["alexandria"]["env"]["ALEXANDRIA_HOME"] =
        json!("/tmp/no-such-alexandria-home");
    fs::write(&file, entry.to_string()).expect("plant");
    let (code, report) = doctor(&user, &env);
    assert_eq!(code, 1);
    let finding = only(&report, "client:cursor");
    assert_eq!(finding["status"], "error", "{finding}");
    assert!(
        finding["message"]
            .as_str()
            .unwrap_or("")
            .contains("/tmp/no-such-alexandria-home"),
        "{finding}"
    );
    // Invalid args (a typo in a hand-written entry).
    let mut entry: Value = serde_json::from_str(&healthy).expect("json");
    entry["mcpServers"]["alexandria"]["args"] = json!(["mcp", "serve", "--workspce", "x"]);
    fs::write(&file, entry.to_string()).expect("plant");
    let (_, report) = doctor(&user, &env);
    let finding = only(&report, "client:cursor");
    assert_eq!(finding["status"], "error", "{finding}");
    assert!(
        finding["message"]
            .as_str()
            .unwrap_or("")
            .contains("--workspce"),
        "{finding}"
    );
    // Re-running the fix line makes it healthy again.
    fs::remove_file(&file).expect("remove");
    user.ok(&env, &["mcp", "install", "cursor"]);
    let (code, _) = doctor(&user, &env);
    assert_eq!(code, 0);

    // Daemon down: killed, leaving its socket behind.
    env.kill_daemon();
    let (code, report) = doctor(&user, &env);
    assert_eq!(code, 0, "a stopped daemon is started on demand: {report:#}");
    let finding = only(&report, "daemon");
    assert_eq!(finding["status"], "warn", "{finding}");
    assert!(
        finding["message"]
            .as_str()
            .unwrap_or("")
            .contains("not running"),
        "{finding}"
    );
    assert!(
        finding["fix"]
            .as_str()
            .unwrap_or("")
            .contains("alexandria daemon start"),
        "{finding}"
    );
    // Doctor only looks: it did not start a daemon.
    assert!(
        env.daemon_pid()
            .is_none_or(|pid| !alexandria_tests::process_alive(pid))
    );

    // A daemon binary of another version than this alexandria.
    let fake = env.dir.path().join("alexandriad-old");
    fs::write(&fake, "#!/bin/sh\necho 'alexandriad 0.0.1'\n").expect("fake daemon");
    fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    let output = user
        .command(&env, &["doctor", "--json"])
        .env("ALEXANDRIAD", &fake)
        .output()
        .expect("doctor");
    let report: Value = serde_json::from_slice(&output.stdout).expect("json");
    let finding = only(&report, "binaries");
    assert_eq!(finding["status"], "error", "{finding}");
    assert!(
        finding["message"].as_str().unwrap_or("").contains("0.0.1"),
        "{finding}"
    );
    assert_eq!(output.status.code(), Some(1));

    // No home at all.
    let empty = Env::new();
    let (code, report) = doctor(&user, &empty);
    assert_eq!(code, 1);
    let finding = only(&report, "home");
    assert_eq!(finding["status"], "error");
    assert!(
        finding["fix"].as_str().unwrap_or("").contains("init"),
        "{finding}"
    );
    assert!(!empty.home.exists(), "doctor created the home");
}

#[test]
fn completions_and_man_pages_are_generated() {
    let env = Env::new();
    for shell in ["bash", "zsh", "fish"] {
        let script = env.ok(&["completions", shell]);
        assert!(script.contains("alexandria"), "{shell}");
        assert!(script.contains("doctor"), "{shell}: lists subcommands");
    }
    // bash can load the script and completes a subcommand.
    let script = env.ok(&["completions", "bash"]);
    let probe = format!(
        "{script}\nCOMP_WORDS=(alexandria doc); COMP_CWORD=1; COMP_LINE='alexandria doc'; COMP_POINT=${{#COMP_LINE}}; _alexandria alexandria doc alexandria; echo \"${{COMPREPLY[@]}}\""
    );
    let output = Command::new("bash")
        .args(["--norc", "-c", &probe])
        .output()
        .expect("bash");
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("doctor"),
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let page = env.ok(&["man"]);
    assert!(
        page.starts_with(".ie") || page.contains(".TH alexandria"),
        "{page}"
    );
    let dir = short_tempdir();
    env.ok(&["man", "--dir", dir.path().to_str().expect("utf-8")]);
    for page in [
        "alexandria.1",
        "alexandria-doctor.1",
        "alexandria-mcp-install.1",
    ] {
        assert!(dir.path().join(page).is_file(), "{page}");
    }
    assert!(!env.home.exists(), "completions and man need no home");
}

#[test]
fn ingest_reports_progress_as_plain_lines_off_a_terminal() {
    let env = Env::new();
    env.ok(&["init"]);
    let files: Vec<(String, Vec<u8>)> = (0..5)
        .map(|i| (format!("note{i}.md"), format!("# Note {i}\n").into_bytes()))
        .collect();
    let scratch = env.dir.path().join("scratch");
    fs::create_dir_all(&scratch).expect("scratch");
    let mut args = vec!["ingest".to_string(), "global".to_string()];
    for (name, bytes) in &files {
        fs::write(scratch.join(name), bytes).expect("fixture");
        args.push(scratch.join(name).display().to_string());
    }
    let output = env.command().args(&args).output().expect("ingest");
    assert!(output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("[5/5]"), "{stderr}");
    assert!(!String::from_utf8_lossy(&output.stdout).contains("[5/5]"));
}

/// POST an `initialize` to an MCP URL with `headers`; the HTTP status.
fn http_initialize(url: &str, headers: &serde_json::Map<String, Value>) -> u16 {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://").expect("http URL");
    let (address, path) = rest.split_at(rest.find('/').expect("path"));
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "firstday", "version": "1"}}})
    .to_string();
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: {address}\r\nAccept: application/json, text/event-stream\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {}\r\n", value.as_str().expect("header")));
    }
    request.push_str("\r\n");
    request.push_str(&body);
    let mut stream = std::net::TcpStream::connect(address).expect("connect");
    stream.write_all(request.as_bytes()).expect("send");
    let mut reply = String::new();
    let _ = stream.read_to_string(&mut reply);
    reply
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status line")
}

#[test]
fn http_entries_carry_the_url_and_the_bearer_token() {
    let env = Env::new();
    env.ok(&["init"]);
    let user = User::new();
    let status: Value =
        serde_json::from_str(&env.ok(&["daemon", "status", "--json"])).expect("status");
    let base = status["http"].as_str().expect("http address").to_string();

    // Tokens off: a plain URL entry that works as written.
    let out = user.ok(&env, &["mcp", "install", "cursor", "--http"]);
    assert!(out.contains("new HTTP port"), "warns about port 0: {out}");
    let cursor = user.home.join(".cursor/mcp.json");
    let entry = read_json(&cursor)["mcpServers"]["alexandria"].clone();
    assert_eq!(entry, json!({"url": format!("{base}/mcp")}));
    assert_eq!(
        http_initialize(&format!("{base}/mcp"), &serde_json::Map::new()),
        200
    );

    // Tokens on: a pinned project entry with a workspace-limited bearer token.
    env.ok(&["daemon", "auth", "token"]);
    user.ok(
        &env,
        &[
            "mcp",
            "install",
            "claude-code",
            "--http",
            "--workspace",
            "global",
        ],
    );
    let project = user.project.join(".mcp.json");
    let entry = read_json(&project)["mcpServers"]["alexandria"].clone();
    assert_eq!(entry["type"], "http");
    assert_eq!(entry["url"], json!(format!("{base}/mcp/global")));
    let headers = entry["headers"].as_object().expect("headers").clone();
    assert!(
        headers["Authorization"]
            .as_str()
            .unwrap_or("")
            .starts_with("Bearer "),
        "{entry}"
    );
    assert_eq!(
        http_initialize(entry["url"].as_str().expect("url"), &headers),
        200
    );
    assert_eq!(
        http_initialize(entry["url"].as_str().expect("url"), &serde_json::Map::new()),
        401,
        "the token is what lets it in"
    );
    // Re-running keeps the token (no new one each time).
    let out = user.ok(
        &env,
        &[
            "mcp",
            "install",
            "claude-code",
            "--http",
            "--workspace",
            "global",
        ],
    );
    assert!(out.contains("already has an up-to-date"), "{out}");

    // Each client's URL dialect.
    for (client, file, key, url_key) in [
        (
            "windsurf",
            ".codeium/windsurf/mcp_config.json",
            "mcpServers",
            "serverUrl",
        ),
        ("gemini", ".gemini/settings.json", "mcpServers", "httpUrl"),
        ("vscode", ".config/Code/User/mcp.json", "servers", "url"),
    ] {
        user.ok(&env, &["mcp", "install", client, "--http"]);
        let entry = read_json(&user.home.join(file))[key]["alexandria"].clone();
        assert_eq!(
            entry[url_key],
            json!(format!("{base}/mcp")),
            "{client}: {entry}"
        );
        assert!(
            entry["headers"]["Authorization"].is_string(),
            "{client}: {entry}"
        );
        assert!(entry.get("command").is_none(), "{client}: {entry}");
    }
    user.ok(&env, &["mcp", "install", "codex", "--http"]);
    let codex: Value =
        toml::from_str(&fs::read_to_string(user.home.join(".codex/config.toml")).expect("codex"))
            .expect("toml");
    let entry = &codex["mcp_servers"]["alexandria"];
    assert_eq!(entry["url"], json!(format!("{base}/mcp")));
    assert!(
        entry["http_headers"]["Authorization"].is_string(),
        "{entry}"
    );

    // doctor checks that the daemon answers at an entry's URL.
    let (_, report) = doctor(&user, &env);
    assert_eq!(only(&report, "client:cursor")["status"], "ok", "{report:#}");
    let mut moved = read_json(&cursor);
    moved["mcpServers"]["alexandria"]["url"] = json!("http://127.0.0.1:9/mcp");
    fs::write(&cursor, moved.to_string()).expect("plant");
    let (code, report) = doctor(&user, &env);
    assert_eq!(code, 1);
    let finding = only(&report, "client:cursor");
    assert_eq!(finding["status"], "error", "{finding}");
    assert!(
        finding["fix"]
            .as_str()
            .unwrap_or("")
            .contains("alexandria mcp install cursor --http"),
        "{finding}"
    );

    // Back to stdio: the URL entry is replaced whole.
    user.ok(&env, &["mcp", "install", "cursor"]);
    let entry = read_json(&cursor)["mcpServers"]["alexandria"].clone();
    assert!(
        entry.get("url").is_none() && entry["command"].is_string(),
        "{entry}"
    );

    // Clients without URL entries refuse and change nothing.
    let output = user.alexandria(&env, &["mcp", "install", "claude-desktop", "--http"]);
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("takes no URL servers"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!user.home.join(".config/Claude").exists());
}

fn info(env: &Env, slug: &str) -> Value {
    serde_json::from_str(&env.ok(&["workspace", "info", slug, "--json"])).expect("info json")
}

fn tool(shim: &mut RawShim, id: i64, name: &str, arguments: Value) -> Value {
    shim.request(
        id,
        "tools/call",
        json!({"name": name, "arguments": arguments}),
    )["result"]
        .clone()
}

#[test]
fn workspaces_are_renamed_archived_restored_and_described() {
    let env = Env::new();
    env.ok(&["init"]);
    env.ok(&["workspace", "create", "acme"]);
    env.ingest("acme", &[("notes.md", b"# Notes\n\nPelicans glide.\n")]);
    let mut open = env.raw_shim(None);
    open.initialize("2025-11-25");
    let written = tool(
        &mut open,
        1,
        "write",
        json!({"workspace": "acme", "command": "create", "path": "wiki/birds.md",
               "content": "# Birds\n\nPelicans [^1].\n\n[^1]: raw/notes.md\n"}),
    );
    assert_ne!(written["isError"], true, "{written}");

    let described = info(&env, "acme");
    assert_eq!(described["raw_sources"], 1, "{described}");
    assert_eq!(
        described["wiki_pages"], 4,
        "index, log, SCHEMA, birds: {described}"
    );
    assert!(described["size_bytes"].as_u64().unwrap_or(0) > 0);
    assert!(described["last_write"].is_string(), "{described}");
    assert_eq!(
        described["path"],
        json!(env.workspace_dir("acme").display().to_string())
    );
    let text = env.ok(&["workspace", "info", "acme"]);
    assert!(text.contains("wiki pages: 4"), "{text}");

    // Archive: refused while a session is pinned, then forced; nothing is deleted.
    let mut pinned = env.raw_shim(Some("acme"));
    pinned.initialize("2025-11-25");
    let refused = env.run(&["workspace", "archive", "acme"]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("workspace_busy"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert!(env.workspace_dir("acme").is_dir());
    let out = env.ok(&["workspace", "archive", "acme", "--force"]);
    assert!(out.contains("restore it with"), "{out}");
    assert!(!env.workspace_dir("acme").exists());
    let trash: Vec<_> = fs::read_dir(env.home.join("trash"))
        .expect("trash")
        .flatten()
        .collect();
    assert_eq!(trash.len(), 1);
    assert!(trash[0].path().join("wiki/birds.md").is_file());
    let gone = tool(&mut pinned, 2, "read", json!({"path": "wiki/birds.md"}));
    assert_eq!(
        gone["structuredContent"]["error"]["code"], "workspace_not_found",
        "{gone}"
    );
    // The pinned session is told what happened and how to undo it.
    let said = gone["structuredContent"]["error"].to_string();
    assert!(
        said.contains("was archived") && said.contains("alexandria workspace restore acme-"),
        "{said}"
    );
    assert!(!env.ok(&["workspace", "list"]).contains("acme"));

    // Restore: files, index and history are back.
    env.ok(&["workspace", "restore", "acme"]);
    let found = tool(
        &mut open,
        3,
        "search",
        json!({"workspace": "acme", "query": "Pelicans"}),
    );
    assert!(
        found["content"][0]["text"]
            .as_str()
            .unwrap_or("")
            .contains("wiki/birds.md"),
        "{found}"
    );
    let history = tool(&mut open, 4, "history", json!({"workspace": "acme"}));
    assert!(
        history["content"][0]["text"]
            .as_str()
            .unwrap_or("")
            .contains("wiki/birds.md"),
        "{history}"
    );
    let missing = env.run(&["workspace", "restore", "acme"]);
    assert!(!missing.status.success(), "nothing left to restore");

    // Rename: files, index and history follow; entries pinning the old name are listed.
    let user = User::new();
    user.ok(&env, &["mcp", "install", "cursor", "--workspace", "acme"]);
    let out = user.ok(&env, &["workspace", "rename", "acme", "field-notes"]);
    assert!(
        out.contains("renamed workspace 'acme' to 'field-notes'"),
        "{out}"
    );
    assert!(
        out.contains(".cursor/mcp.json"),
        "lists the pinned entry: {out}"
    );
    assert!(
        out.contains("alexandria mcp install cursor --workspace <new-slug>"),
        "{out}"
    );
    assert!(!env.workspace_dir("acme").exists());
    let found = tool(
        &mut open,
        5,
        "search",
        json!({"workspace": "field-notes", "query": "Pelicans"}),
    );
    assert!(
        found["content"][0]["text"]
            .as_str()
            .unwrap_or("")
            .contains("wiki/birds.md"),
        "{found}"
    );
    let history = tool(&mut open, 6, "history", json!({"workspace": "field-notes"}));
    assert!(
        history["content"][0]["text"]
            .as_str()
            .unwrap_or("")
            .contains("wiki/birds.md"),
        "{history}"
    );
    let old = tool(&mut open, 7, "guide", json!({"workspace": "acme"}));
    assert_eq!(
        old["structuredContent"]["error"]["code"],
        "workspace_not_found"
    );
    // A session still pinned to the old name learns the new one and the fix.
    let pinned_old = tool(&mut pinned, 10, "guide", json!({}));
    let said = pinned_old["structuredContent"]["error"].to_string();
    assert!(
        said.contains("renamed to 'field-notes'")
            && said.contains("alexandria mcp install <client> --workspace field-notes"),
        "{said}"
    );
    // A write to the renamed workspace commits in its new place.
    let appended = tool(
        &mut open,
        8,
        "write",
        json!({"workspace": "field-notes", "command": "append", "path": "wiki/birds.md", "content": "\nGulls.\n"}),
    );
    assert_ne!(appended["isError"], true, "{appended}");

    // Refusals change nothing.
    for args in [
        vec!["workspace", "rename", "global", "other"],
        vec!["workspace", "rename", "field-notes", "global"],
        vec!["workspace", "rename", "field-notes", "Bad Slug"],
        vec!["workspace", "archive", "global"],
    ] {
        let output = env.run(&args);
        assert!(!output.status.success(), "{args:?} should fail");
    }
    assert!(env.workspace_dir("field-notes").is_dir());
    assert!(env.workspace_dir("global").is_dir());
}

/// `mcp serve --init-if-missing` (what the Claude Desktop bundle runs: its users have no
/// terminal for `alexandria init`): a home that does not exist is set up on first use and
/// the first tool call works; a folder that holds something else is never taken over.
#[test]
fn a_bundle_entry_sets_the_home_up_on_first_use() {
    let env = Env::new();
    assert!(!env.home.exists());
    let mut command = env.bare_shim_command(Some("global"));
    command.arg("--init-if-missing");
    let mut shim = RawShim::spawn(command);
    let reply = guide_text(&mut shim);
    assert_ne!(reply["result"]["isError"], true, "{reply}");
    assert!(env.home.join("config.toml").is_file());
    let written = shim.request(
        8,
        "tools/call",
        json!({"name": "write", "arguments": {"command": "create", "path": "wiki/first.md", "content": "# First\n"}}),
    );
    assert_ne!(written["result"]["isError"], true, "{written}");
    drop(shim);

    // A non-empty folder without config.toml is not ours: home_not_found as before.
    let other = Env::new();
    fs::create_dir_all(&other.home).expect("home dir");
    fs::write(other.home.join("unrelated.txt"), "mine").expect("write");
    let mut command = other.bare_shim_command(None);
    command.arg("--init-if-missing");
    let mut shim = RawShim::spawn(command);
    let reply = guide_text(&mut shim);
    assert_eq!(
        reply["result"]["structuredContent"]["error"]["code"], "home_not_found",
        "{reply}"
    );
    assert!(!other.home.join("config.toml").exists());
}

/// The shim every client starts maps no library it does not need: libm.so was loaded
/// and relocated at every start only for indicatif's `pow` (issue 15: about 200 kB of
/// the shim's resident pages), which the binary now defines itself. (Where glibc links
/// statically the shim needs no library at all: `core.rs` checks that.)
#[cfg(target_os = "linux")]
#[test]
fn the_shim_binary_does_not_load_libm() {
    let binary = alexandria_tests::bin_path("alexandria");
    let output = Command::new("readelf")
        .args(["--dynamic", "--program-headers"])
        .arg(&binary)
        .output()
        .expect("readelf (binutils) runs");
    assert!(output.status.success(), "readelf failed: {output:?}");
    let dynamic = String::from_utf8_lossy(&output.stdout);
    let needed: Vec<&str> = dynamic.lines().filter(|l| l.contains("(NEEDED)")).collect();
    // Linked dynamically (it asks for an interpreter), it needs libc.so: the entries
    // were read.
    let interpreted = dynamic.contains("INTERP");
    assert!(
        !interpreted || needed.iter().any(|l| l.contains("libc.so")),
        "no NEEDED entries read: {dynamic}"
    );
    assert!(
        !needed.iter().any(|l| l.contains("libm.so")),
        "the shim loads libm again: {needed:?}"
    );
}
