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
    fn alexandria(&self, env: &Env, args: &[&str]) -> std::process::Output {
        let mut command = env.command();
        command
            .args(args)
            .current_dir(&self.project)
            .env("HOME", &self.home)
            .env_remove("XDG_CONFIG_HOME")
            .env_remove("CLAUDE_CONFIG_DIR")
            .env_remove("CODEX_HOME");
        command.output().expect("run alexandria")
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
        let mut shim = env.raw_shim(Some("acme"));
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
