//! End-to-end tests of `alexandria mcp install|uninstall` for all nine clients and of
//! `alexandria daemon install-service|uninstall-service`: the real binary, run against a temp
//! HOME with a PATH that holds nothing (or only the tools a test puts there).
//!
//! Files are read back the way each client reads them: strict JSON, JSON with comments,
//! TOML, YAML. Where the client's own CLI can be had from npm (Claude Code, Codex, Gemini
//! CLI), it lists the server; `systemd-analyze` verifies the unit and the `plist` crate
//! parses the agent.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use alexandria_tests::{bin_path, short_tempdir};
use serde_json::{Value, json};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Format {
    /// Strict JSON with the servers under this key.
    Json(&'static str),
    /// JSON with comments, servers under this key.
    Jsonc(&'static str),
    Toml,
    Yaml,
}

#[derive(Debug, Clone, Copy)]
struct Client {
    name: &'static str,
    /// Relative to HOME (Linux paths, XDG_CONFIG_HOME unset).
    user_file: &'static str,
    /// Relative to the current directory, for clients with project files.
    project_file: Option<&'static str>,
    format: Format,
    /// Whether the entry carries `"type": "stdio"`.
    typed: bool,
}

const CLIENTS: [Client; 9] = [
    Client {
        name: "claude-code",
        user_file: ".claude.json",
        project_file: Some(".mcp.json"),
        format: Format::Json("mcpServers"),
        typed: true,
    },
    Client {
        name: "claude-desktop",
        user_file: ".config/Claude/claude_desktop_config.json",
        project_file: None,
        format: Format::Json("mcpServers"),
        typed: false,
    },
    Client {
        name: "cursor",
        user_file: ".cursor/mcp.json",
        project_file: Some(".cursor/mcp.json"),
        format: Format::Json("mcpServers"),
        typed: false,
    },
    Client {
        name: "codex",
        user_file: ".codex/config.toml",
        project_file: Some(".codex/config.toml"),
        format: Format::Toml,
        typed: false,
    },
    Client {
        name: "windsurf",
        user_file: ".codeium/windsurf/mcp_config.json",
        project_file: None,
        format: Format::Json("mcpServers"),
        typed: false,
    },
    Client {
        name: "zed",
        user_file: ".config/zed/settings.json",
        project_file: None,
        format: Format::Jsonc("context_servers"),
        typed: false,
    },
    Client {
        name: "vscode",
        user_file: ".config/Code/User/mcp.json",
        project_file: Some(".vscode/mcp.json"),
        format: Format::Jsonc("servers"),
        typed: true,
    },
    Client {
        name: "gemini",
        user_file: ".gemini/settings.json",
        project_file: None,
        format: Format::Jsonc("mcpServers"),
        typed: false,
    },
    Client {
        name: "continue",
        user_file: ".continue/mcpServers/alexandria.yaml",
        project_file: None,
        format: Format::Yaml,
        typed: true,
    },
];

/// A temp HOME, a project directory (the current directory of every run) and an empty
/// PATH directory.
struct Sandbox {
    _dir: tempfile::TempDir,
    root: PathBuf,
    home: PathBuf,
    project: PathBuf,
    bin: PathBuf,
}

impl Sandbox {
    fn new() -> Sandbox {
        let dir = short_tempdir();
        let root = fs::canonicalize(dir.path()).expect("canonical temp dir");
        let sandbox = Sandbox {
            home: root.join("home"),
            project: root.join("project"),
            bin: root.join("bin"),
            root,
            _dir: dir,
        };
        for dir in [&sandbox.home, &sandbox.project, &sandbox.bin] {
            fs::create_dir_all(dir).expect("create sandbox dir");
        }
        sandbox
    }

    /// `alexandria <args>` with nothing of the user's environment but what we set.
    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(bin_path("alexandria"));
        command
            .args(args)
            .current_dir(&self.project)
            .env_clear()
            .env("HOME", &self.home)
            .env("PATH", &self.bin);
        command
    }

    fn run(&self, args: &[&str]) -> String {
        let output = self.command(args).output().expect("run alexandria");
        assert_success(&output, args);
        String::from_utf8(output.stdout).expect("utf-8 stdout")
    }

    fn fail(&self, args: &[&str]) -> String {
        let output = self.command(args).output().expect("run alexandria");
        assert!(
            !output.status.success(),
            "alexandria {args:?} should fail but printed:\n{}",
            String::from_utf8_lossy(&output.stdout)
        );
        String::from_utf8(output.stderr).expect("utf-8 stderr")
    }

    fn user_path(&self, client: &Client) -> PathBuf {
        self.home.join(client.user_file)
    }

    fn project_path(&self, client: &Client) -> Option<PathBuf> {
        client.project_file.map(|file| self.project.join(file))
    }
}

fn assert_success(output: &Output, what: impl std::fmt::Debug) {
    assert!(
        output.status.success(),
        "{what:?} failed ({}):\nstdout: {}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn write(path: &Path, text: &str) {
    fs::create_dir_all(path.parent().expect("parent")).expect("create parent");
    fs::write(path, text).expect("write fixture");
}

fn backup_of(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".alexandria-backup");
    PathBuf::from(name)
}

/// The absolute path the installer must write: the real `alexandria`, symlinks resolved.
fn exe() -> String {
    fs::canonicalize(bin_path("alexandria"))
        .expect("canonical alexandria")
        .to_str()
        .expect("utf-8 path")
        .to_string()
}

fn serve_args(workspace: Option<&str>) -> Vec<String> {
    let mut args = vec!["mcp".to_string(), "serve".to_string()];
    if let Some(slug) = workspace {
        args.extend(["--workspace".to_string(), slug.to_string()]);
    }
    args
}

/// What our entry must look like in this client's file.
fn expected_entry(client: &Client, workspace: Option<&str>) -> Value {
    let mut entry = json!({"command": exe(), "args": serve_args(workspace)});
    if client.typed {
        entry["type"] = json!("stdio");
    }
    if client.format == Format::Yaml {
        entry["name"] = json!("alexandria");
    }
    entry
}

/// Parse a config file the way the client does and return the whole document as JSON.
fn parse(client: &Client, text: &str) -> Value {
    match client.format {
        Format::Json(_) => serde_json::from_str(text)
            .unwrap_or_else(|e| panic!("{}: not strict JSON ({e}):\n{text}", client.name)),
        Format::Jsonc(_) => {
            jsonc_parser::cst::CstRootNode::parse(text, &jsonc_parser::ParseOptions::default())
                .unwrap_or_else(|e| panic!("{}: not JSONC ({e}):\n{text}", client.name))
                .value()
                .and_then(|value| value.to_serde_value())
                .unwrap_or(Value::Null)
        }
        Format::Toml => toml::from_str(text)
            .unwrap_or_else(|e| panic!("{}: not TOML ({e}):\n{text}", client.name)),
        Format::Yaml => {
            let block: Value = serde_norway::from_str(text)
                .unwrap_or_else(|e| panic!("{}: not YAML ({e}):\n{text}", client.name));
            // Continue's block-file header.
            assert_eq!(block["name"], "alexandria", "{text}");
            assert_eq!(block["schema"], "v1", "{text}");
            assert!(block["version"].is_string(), "{text}");
            block
        }
    }
}

/// Our entry in a parsed document, if present.
fn entry_in(client: &Client, document: &Value) -> Option<Value> {
    match client.format {
        Format::Json(key) | Format::Jsonc(key) => document.get(key)?.get("alexandria").cloned(),
        Format::Toml => document.get("mcp_servers")?.get("alexandria").cloned(),
        Format::Yaml => document
            .get("mcpServers")?
            .as_array()?
            .iter()
            .find(|server| server["name"] == "alexandria")
            .cloned(),
    }
}

fn entry_in_file(client: &Client, path: &Path) -> Option<Value> {
    entry_in(client, &parse(client, &read(path)))
}

/// The edit only inserted text: the old file is a prefix and a suffix of the new one.
fn assert_pure_insertion(old: &str, new: &str, what: &str) {
    let prefix = old
        .bytes()
        .zip(new.bytes())
        .take_while(|(a, b)| a == b)
        .count();
    let room = old.len().min(new.len()) - prefix;
    let suffix = old
        .bytes()
        .rev()
        .zip(new.bytes().rev())
        .take(room)
        .take_while(|(a, b)| a == b)
        .count();
    assert_eq!(
        prefix + suffix,
        old.len(),
        "{what}: the edit changed more than an insertion\n--- old\n{old}\n--- new\n{new}"
    );
}

/// Existing files with an unrelated server, other settings and (where the format has them)
/// comments.
fn fixture(client: &Client) -> &'static str {
    match client.format {
        Format::Json("mcpServers") => {
            "{\n  \"numStartups\": 3,\n  \"mcpServers\": {\n    \"other\": {\n      \"command\": \"npx\",\n      \"args\": [\"-y\", \"other-server\"]\n    }\n  },\n  \"theme\": \"dark\"\n}\n"
        }
        Format::Jsonc("context_servers") => {
            "// Zed settings\n{\n  \"theme\": \"One Dark\", // the theme\n  /* MCP */\n  \"context_servers\": {\n    \"other\": { \"command\": \"other\", \"args\": [] },\n  },\n  \"vim_mode\": true,\n}\n"
        }
        Format::Jsonc("servers") => {
            "{\n\t// my servers\n\t\"inputs\": [],\n\t\"servers\": {\n\t\t\"other\": {\n\t\t\t\"type\": \"stdio\",\n\t\t\t\"command\": \"other\"\n\t\t}\n\t}\n}\n"
        }
        Format::Jsonc("mcpServers") => {
            "{\n  // Gemini CLI\n  \"theme\": \"GitHub\",\n  \"mcpServers\": {\n    \"other\": {\"command\": \"other\", \"trust\": false}\n  }\n}\n"
        }
        Format::Toml => {
            "# Codex settings\nmodel = \"o4-mini\"  # fast\n\n[mcp_servers.other]\ncommand = \"npx\"\nargs = [\"-y\", \"other-server\"]\nenv = { \"KEY\" = \"value\" }\n\n[profiles.work]\nmodel = \"o3\"\n"
        }
        Format::Json(_) | Format::Jsonc(_) | Format::Yaml => unreachable!("no fixture"),
    }
}

#[test]
fn every_client_installs_into_an_empty_home_and_uninstalls() {
    for client in &CLIENTS {
        let sandbox = Sandbox::new();
        let path = sandbox.user_path(client);
        let out = sandbox.run(&["mcp", "install", client.name]);
        assert!(
            out.contains("added \"alexandria\" to"),
            "{}: {out}",
            client.name
        );
        assert!(
            out.contains(&path.display().to_string()),
            "{}: {out}",
            client.name
        );
        assert_eq!(
            entry_in_file(client, &path),
            Some(expected_entry(client, None)),
            "{}",
            client.name
        );
        assert!(
            !backup_of(&path).exists(),
            "{}: no backup of nothing",
            client.name
        );

        let before = fs::read(&path).expect("installed file");
        let out = sandbox.run(&["mcp", "install", client.name]);
        assert!(out.contains("nothing changed"), "{}: {out}", client.name);
        assert_eq!(
            fs::read(&path).expect("file"),
            before,
            "{}: re-run",
            client.name
        );

        let out = sandbox.run(&["mcp", "uninstall", client.name]);
        assert!(
            out.contains("removed \"alexandria\" from"),
            "{}: {out}",
            client.name
        );
        if client.format == Format::Yaml {
            assert!(!path.exists(), "continue: block file removed");
        } else {
            assert_eq!(entry_in_file(client, &path), None, "{}", client.name);
        }
        let out = sandbox.run(&["mcp", "uninstall", client.name]);
        assert!(out.contains("nothing changed"), "{}: {out}", client.name);
    }
}

#[test]
fn existing_settings_and_servers_survive_byte_for_byte() {
    for client in CLIENTS.iter().filter(|c| c.format != Format::Yaml) {
        let sandbox = Sandbox::new();
        let path = sandbox.user_path(client);
        let original = fixture(client);
        write(&path, original);

        let out = sandbox.run(&["mcp", "install", client.name]);
        assert!(out.contains("added"), "{}: {out}", client.name);
        let installed = read(&path);
        assert_pure_insertion(original, &installed, client.name);
        let document = parse(client, &installed);
        assert_eq!(
            entry_in(client, &document),
            Some(expected_entry(client, None))
        );
        let other = match client.format {
            Format::Json(key) | Format::Jsonc(key) => &document[key]["other"],
            _ => &document["mcp_servers"]["other"],
        };
        assert!(other.is_object(), "{}: other server kept", client.name);
        assert_eq!(read(&backup_of(&path)), original, "{}: backup", client.name);

        let out = sandbox.run(&["mcp", "install", client.name]);
        assert!(out.contains("nothing changed"), "{}: {out}", client.name);
        assert_eq!(read(&path), installed, "{}: re-run", client.name);

        sandbox.run(&["mcp", "uninstall", client.name]);
        assert_eq!(read(&path), original, "{}: uninstall restores", client.name);
    }
}

#[test]
fn continue_leaves_other_blocks_and_config_alone() {
    let sandbox = Sandbox::new();
    let client = &CLIENTS[8];
    let config = sandbox.home.join(".continue/config.yaml");
    let other = sandbox.home.join(".continue/mcpServers/other.yaml");
    let config_text = "name: mine\nversion: 1.0.0\nschema: v1\nmcpServers:\n  - name: other\n    command: other\n";
    let other_text =
        "name: other\nversion: 0.0.1\nschema: v1\nmcpServers:\n  - name: other2\n    command: x\n";
    write(&config, config_text);
    write(&other, other_text);
    sandbox.run(&["mcp", "install", "continue", "--workspace", "notes"]);
    assert_eq!(
        entry_in_file(client, &sandbox.user_path(client)),
        Some(expected_entry(client, Some("notes")))
    );
    sandbox.run(&["mcp", "uninstall", "continue"]);
    assert_eq!(read(&config), config_text);
    assert_eq!(read(&other), other_text);
    assert!(!sandbox.user_path(client).exists());

    // A block file of that name that we did not write is refused.
    write(&sandbox.user_path(client), other_text);
    let error = sandbox.fail(&["mcp", "install", "continue"]);
    assert!(error.contains("not written by alexandria"), "{error}");
    let error = sandbox.fail(&["mcp", "uninstall", "continue"]);
    assert!(error.contains("not written by alexandria"), "{error}");
    assert_eq!(read(&sandbox.user_path(client)), other_text);
}

#[test]
fn an_outdated_entry_is_updated_and_user_fields_are_kept() {
    for client in CLIENTS.iter().filter(|c| c.format != Format::Yaml) {
        let sandbox = Sandbox::new();
        let path = sandbox.user_path(client);
        let old = match client.format {
            Format::Toml => "[mcp_servers.alexandria]\ncommand = \"/old/alexandria\"\nargs = [\"mcp\", \"serve\"]\nenv = { \"A\" = \"1\" }\n".to_string(),
            Format::Json(key) | Format::Jsonc(key) => format!(
                "{{\n  \"{key}\": {{\n    \"alexandria\": {{\n      \"command\": \"/old/alexandria\",\n      \"args\": [\"mcp\", \"serve\"],\n      \"env\": {{\"A\": \"1\"}}\n    }}\n  }}\n}}\n"
            ),
            Format::Yaml => unreachable!(),
        };
        write(&path, &old);
        let out = sandbox.run(&["mcp", "install", client.name]);
        assert!(
            out.contains("updated \"alexandria\" in"),
            "{}: {out}",
            client.name
        );
        let entry = entry_in_file(client, &path).expect("entry");
        assert_eq!(entry["command"], exe(), "{}", client.name);
        assert_eq!(entry["env"], json!({"A": "1"}), "{}: env kept", client.name);
        assert_eq!(read(&backup_of(&path)), old, "{}: backup", client.name);
    }
}

#[test]
fn pinned_installs_write_project_files_or_pin_the_user_entry() {
    for client in &CLIENTS {
        let sandbox = Sandbox::new();
        let out = sandbox.run(&["mcp", "install", client.name, "--workspace", "notes"]);
        assert!(
            out.contains("pinned to workspace notes"),
            "{}: {out}",
            client.name
        );
        let expected = Some(expected_entry(client, Some("notes")));
        match sandbox.project_path(client) {
            Some(project_file) => {
                assert_eq!(
                    entry_in_file(client, &project_file),
                    expected,
                    "{}",
                    client.name
                );
                assert!(
                    !sandbox.user_path(client).exists(),
                    "{}: user file untouched",
                    client.name
                );
                let out = sandbox.run(&["mcp", "install", client.name, "--workspace", "notes"]);
                assert!(out.contains("nothing changed"), "{}: {out}", client.name);
                sandbox.run(&["mcp", "uninstall", client.name, "--workspace", "notes"]);
                assert_eq!(
                    entry_in_file(client, &project_file),
                    None,
                    "{}",
                    client.name
                );
            }
            None => {
                let user_file = sandbox.user_path(client);
                assert_eq!(
                    entry_in_file(client, &user_file),
                    expected,
                    "{}",
                    client.name
                );
                // Unpinning updates the same entry.
                let out = sandbox.run(&["mcp", "install", client.name]);
                assert!(out.contains("updated"), "{}: {out}", client.name);
                assert_eq!(
                    entry_in_file(client, &user_file),
                    Some(expected_entry(client, None)),
                    "{}",
                    client.name
                );
            }
        }
    }
}

#[test]
fn malformed_or_unexpected_files_are_refused_and_left_alone() {
    for client in CLIENTS.iter().filter(|c| c.format != Format::Yaml) {
        let cases: Vec<(String, &str)> = match client.format {
            Format::Json(key) | Format::Jsonc(key) => vec![
                (format!("{{\"{key}\": {{"), "is not valid JSON"),
                (
                    format!("{{\"{key}\": []}}\n"),
                    "should be an object of servers",
                ),
                (format!("{{\"{key}\": \"x\"}}\n"), "but it is a string"),
                ("[1, 2]\n".to_string(), "the top level should be an object"),
            ],
            Format::Toml => vec![
                ("model = \n".to_string(), "is not valid TOML"),
                (
                    "[[mcp_servers]]\nname = \"alexandria\"\n".to_string(),
                    "but it is an array of tables",
                ),
                (
                    "mcp_servers = \"x\"\n".to_string(),
                    "should be a table of servers",
                ),
            ],
            Format::Yaml => unreachable!(),
        };
        for (text, expected) in cases {
            let sandbox = Sandbox::new();
            let path = sandbox.user_path(client);
            write(&path, &text);
            let dir = path.parent().expect("parent");
            let listing = || {
                let mut names: Vec<_> = fs::read_dir(dir)
                    .expect("list")
                    .map(|e| e.expect("entry").file_name())
                    .collect();
                names.sort();
                names
            };
            let before = listing();
            for verb in ["install", "uninstall"] {
                let error = sandbox.fail(&["mcp", verb, client.name]);
                let what = format!("{} {verb} of {text:?}", client.name);
                assert!(error.contains("refusing to edit"), "{what}: {error}");
                assert!(error.contains(expected), "{what}: {error}");
                assert!(error.contains("nothing was changed"), "{what}: {error}");
                assert_eq!(read(&path), text, "{what}: file untouched");
                assert_eq!(listing(), before, "{what}: no backup or temp file");
            }
        }
    }
}

#[test]
fn strict_json_clients_refuse_comments_and_jsonc_clients_keep_them() {
    let sandbox = Sandbox::new();
    let cursor = sandbox.user_path(&CLIENTS[2]);
    write(&cursor, "// mine\n{}\n");
    let error = sandbox.fail(&["mcp", "install", "cursor"]);
    assert!(error.contains("is not valid JSON"), "{error}");
    assert_eq!(read(&cursor), "// mine\n{}\n");

    let vscode = sandbox.user_path(&CLIENTS[6]);
    write(&vscode, "// mine\n{}\n");
    sandbox.run(&["mcp", "install", "vscode"]);
    let text = read(&vscode);
    assert!(text.starts_with("// mine\n{"), "{text}");
    assert_eq!(
        entry_in_file(&CLIENTS[6], &vscode),
        Some(expected_entry(&CLIENTS[6], None))
    );
}

#[test]
fn read_only_files_are_refused() {
    use std::os::unix::fs::PermissionsExt;
    for client in &CLIENTS {
        let sandbox = Sandbox::new();
        sandbox.run(&["mcp", "install", client.name]);
        let path = sandbox.user_path(client);
        let before = read(&path);
        fs::set_permissions(&path, fs::Permissions::from_mode(0o444)).expect("chmod");
        let error = sandbox.fail(&["mcp", "uninstall", client.name]);
        assert!(error.contains("read-only"), "{}: {error}", client.name);
        assert_eq!(read(&path), before, "{}", client.name);
        assert!(path.exists(), "{}", client.name);
    }
    let sandbox = Sandbox::new();
    let cursor = sandbox.user_path(&CLIENTS[2]);
    write(&cursor, fixture(&CLIENTS[2]));
    fs::set_permissions(&cursor, fs::Permissions::from_mode(0o444)).expect("chmod");
    let error = sandbox.fail(&["mcp", "install", "cursor"]);
    assert!(error.contains("read-only"), "{error}");
    assert_eq!(read(&cursor), fixture(&CLIENTS[2]));
}

#[test]
fn dry_runs_write_nothing() {
    for client in &CLIENTS {
        let sandbox = Sandbox::new();
        let out = sandbox.run(&["mcp", "install", client.name, "--dry-run"]);
        assert!(out.contains("would add"), "{}: {out}", client.name);
        assert!(out.contains("dry run"), "{}: {out}", client.name);
        let out = sandbox.run(&[
            "mcp",
            "install",
            client.name,
            "--workspace",
            "w",
            "--dry-run",
        ]);
        assert!(out.contains("would add"), "{}: {out}", client.name);
        let mut left: Vec<_> = walk(&sandbox.root);
        left.retain(|p| p.is_file());
        assert!(left.is_empty(), "{}: dry run wrote {left:?}", client.name);

        sandbox.run(&["mcp", "install", client.name]);
        let path = sandbox.user_path(client);
        let before = read(&path);
        let out = sandbox.run(&["mcp", "uninstall", client.name, "--dry-run"]);
        assert!(out.contains("would remove"), "{}: {out}", client.name);
        assert_eq!(read(&path), before, "{}", client.name);
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in fs::read_dir(dir).expect("read dir") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            found.extend(walk(&path));
        }
        found.push(path);
    }
    found
}

#[test]
fn a_symlinked_config_is_edited_at_its_target() {
    let sandbox = Sandbox::new();
    let client = &CLIENTS[2]; // cursor
    let target = sandbox.root.join("dotfiles/cursor-mcp.json");
    write(&target, fixture(client));
    let link = sandbox.user_path(client);
    fs::create_dir_all(link.parent().expect("parent")).expect("mkdir");
    std::os::unix::fs::symlink(&target, &link).expect("symlink");
    sandbox.run(&["mcp", "install", "cursor"]);
    assert!(
        fs::symlink_metadata(&link)
            .expect("link")
            .file_type()
            .is_symlink()
    );
    assert_eq!(
        entry_in_file(client, &target),
        Some(expected_entry(client, None))
    );
}

#[test]
fn xdg_config_home_and_codex_home_are_honoured() {
    let sandbox = Sandbox::new();
    let xdg = sandbox.root.join("xdg");
    let codex_home = sandbox.root.join("codex");
    for client in ["zed", "vscode", "claude-desktop", "codex"] {
        let output = sandbox
            .command(&["mcp", "install", client])
            .env("XDG_CONFIG_HOME", &xdg)
            .env("CODEX_HOME", &codex_home)
            .output()
            .expect("run");
        assert_success(&output, client);
    }
    for path in [
        "xdg/zed/settings.json",
        "xdg/Code/User/mcp.json",
        "xdg/Claude/claude_desktop_config.json",
        "codex/config.toml",
    ] {
        assert!(sandbox.root.join(path).is_file(), "{path}");
    }
    assert!(!sandbox.home.join(".config").exists());
}

#[test]
fn bad_arguments_are_refused() {
    let sandbox = Sandbox::new();
    let error = sandbox.fail(&["mcp", "install", "cursor", "--workspace", "../x"]);
    assert!(error.contains("alexandria:"), "{error}");
    let error = sandbox.fail(&["mcp", "install", "notepad"]);
    assert!(error.contains("claude-code"), "lists the clients: {error}");
    assert!(walk(&sandbox.home).is_empty());
}

// --- the clients' own CLIs ------------------------------------------------------------

/// A client's real CLI from npm (`ALEXANDRIA_TEST_<NAME>` or PATH). CI must have it;
/// elsewhere the test says it skipped.
fn real_cli(name: &str, npm_package: &str) -> Option<PathBuf> {
    let variable = format!("ALEXANDRIA_TEST_{}", name.to_uppercase());
    if let Some(path) = std::env::var_os(&variable) {
        return Some(PathBuf::from(path));
    }
    let found = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|dir| dir.join(name))
        .find(|path| path.is_file());
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "{name} is not installed; CI needs it: npm install -g {npm_package}"
        );
        eprintln!("skipping the {name} CLI checks: `{name}` is not on PATH (or set {variable})");
    }
    found
}

fn real_claude() -> Option<PathBuf> {
    real_cli("claude", "@anthropic-ai/claude-code")
}

impl Sandbox {
    /// A client CLI run in this sandbox, offline and logged out. Health checks may start
    /// `alexandria mcp serve`; its daemon is pointed at nothing so none outlives the test.
    fn client_cli(&self, program: &Path, args: &[&str]) -> String {
        let output = Command::new(program)
            .args(args)
            .current_dir(&self.project)
            .env_clear()
            .env("HOME", &self.home)
            .env(
                "PATH",
                format!("{}:/usr/local/bin:/usr/bin:/bin", self.bin.display()),
            )
            .env("ALEXANDRIA_HOME", self.root.join("alx"))
            .env("ALEXANDRIAD", self.root.join("no-daemon"))
            .env("DISABLE_AUTOUPDATER", "1")
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
            .output()
            .expect("run client cli");
        assert_success(&output, (program, args));
        // Gemini CLI lists on stderr, the others on stdout.
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    }
}

#[test]
fn codex_reads_back_what_we_install() {
    let Some(codex) = real_cli("codex", "@openai/codex") else {
        return;
    };
    let sandbox = Sandbox::new();
    let user_file = sandbox.user_path(&CLIENTS[3]);
    write(&user_file, fixture(&CLIENTS[3]));
    sandbox.run(&["mcp", "install", "codex"]);
    let get = sandbox.client_cli(&codex, &["mcp", "get", "alexandria"]);
    assert!(get.contains(&format!("command: {}\n", exe())), "{get}");
    assert!(get.contains("args: mcp serve\n"), "{get}");
    let list = sandbox.client_cli(&codex, &["mcp", "list"]);
    assert!(list.contains("other"), "{list}");

    // The project file counts in a trusted project.
    let trust = format!(
        "\n[projects.\"{}\"]\ntrust_level = \"trusted\"\n",
        sandbox.project.display()
    );
    fs::write(&user_file, read(&user_file) + &trust).expect("trust the project");
    sandbox.run(&["mcp", "install", "codex", "--workspace", "notes"]);
    let get = sandbox.client_cli(&codex, &["mcp", "get", "alexandria"]);
    assert!(get.contains("args: mcp serve --workspace notes\n"), "{get}");
}

#[test]
fn gemini_cli_reads_back_what_we_install() {
    let Some(gemini) = real_cli("gemini", "@google/gemini-cli") else {
        return;
    };
    let sandbox = Sandbox::new();
    let user_file = sandbox.user_path(&CLIENTS[7]);
    write(&user_file, fixture(&CLIENTS[7]));
    sandbox.run(&["mcp", "install", "gemini", "--workspace", "notes"]);
    let list = sandbox.client_cli(&gemini, &["mcp", "list"]);
    assert!(
        list.contains(&format!(
            "alexandria: {} mcp serve --workspace notes (stdio)",
            exe()
        )),
        "{list}"
    );
    assert!(list.contains("other: other"), "{list}");
    sandbox.run(&["mcp", "uninstall", "gemini"]);
    let list = sandbox.client_cli(&gemini, &["mcp", "list"]);
    assert!(!list.contains("alexandria"), "{list}");
}

#[test]
fn claude_code_reads_back_what_we_install() {
    let Some(claude) = real_claude() else { return };
    let sandbox = Sandbox::new();
    let client = &CLIENTS[0];
    let user_file = sandbox.user_path(client);
    write(&user_file, fixture(client));
    let command_line = format!("Command: {}", exe());

    // Without `claude` on PATH: we edit ~/.claude.json ourselves; Claude Code reads it.
    let out = sandbox.run(&["mcp", "install", "claude-code"]);
    assert!(!out.contains("via"), "{out}");
    let get = sandbox.client_cli(&claude, &["mcp", "get", "alexandria"]);
    assert!(get.contains("User config"), "{get}");
    assert!(get.contains(&command_line), "{get}");
    assert!(get.contains("Args: mcp serve\n"), "{get}");
    sandbox.run(&["mcp", "uninstall", "claude-code"]);

    // With `claude` on PATH: it writes the user scope for us.
    std::os::unix::fs::symlink(&claude, sandbox.bin.join("claude")).expect("link claude");
    let out = sandbox.run(&["mcp", "install", "claude-code"]);
    assert!(
        out.contains("claude mcp add-json --scope user alexandria"),
        "{out}"
    );
    let document = parse(client, &read(&user_file));
    assert_eq!(
        entry_in(client, &document),
        Some(expected_entry(client, None))
    );
    assert!(
        document["mcpServers"]["other"].is_object(),
        "other server kept"
    );
    // (Claude Code drops settings equal to its defaults, such as "theme": "dark".)
    assert_eq!(document["numStartups"], 3, "other settings kept");
    let list = sandbox.client_cli(&claude, &["mcp", "list"]);
    assert!(list.contains("alexandria: "), "{list}");
    assert!(list.contains("other: "), "{list}");
    let out = sandbox.run(&["mcp", "install", "claude-code"]);
    assert!(out.contains("nothing changed"), "{out}");

    // A pinned install goes to .mcp.json, which Claude Code reads as the project scope.
    sandbox.run(&["mcp", "install", "claude-code", "--workspace", "notes"]);
    let get = sandbox.client_cli(&claude, &["mcp", "get", "alexandria"]);
    assert!(get.contains(&command_line), "{get}");

    let out = sandbox.run(&["mcp", "uninstall", "claude-code"]);
    assert!(
        out.contains("claude mcp remove --scope user alexandria"),
        "{out}"
    );
    assert_eq!(entry_in_file(client, &user_file), None);
}

// --- the service ------------------------------------------------------------------------

/// An executable stand-in for `alexandriad` at a path with a space and a `%`, to exercise
/// quoting.
fn fake_daemon(sandbox: &Sandbox) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = sandbox.root.join("my bin 100%/alexandriad");
    write(&path, "#!/bin/sh\nexit 0\n");
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

#[test]
fn the_systemd_unit_verifies_and_installs_idempotently() {
    let sandbox = Sandbox::new();
    let daemon = fake_daemon(&sandbox);
    let alexandria_home = sandbox.root.join("alx home");
    let render = sandbox
        .command(&["daemon", "install-service", "--render", "systemd"])
        .env("ALEXANDRIAD", &daemon)
        .env("ALEXANDRIA_HOME", &alexandria_home)
        .output()
        .expect("render");
    assert_success(&render, "render systemd");
    let unit = String::from_utf8(render.stdout).expect("utf-8");
    assert!(
        unit.contains("ExecStart=\"") && unit.contains("my bin 100%%/alexandriad\"\n"),
        "{unit}"
    );
    assert!(unit.contains("Restart=on-failure\n"), "{unit}");
    assert!(
        unit.contains(&format!(
            "Environment=\"ALEXANDRIA_HOME={}\"\n",
            alexandria_home.display()
        )),
        "{unit}"
    );
    let unit_file = sandbox.root.join("verify/alexandria.service");
    write(&unit_file, &unit);
    systemd_verify(&sandbox, &unit_file);

    // The real install: no systemctl on PATH, so it writes the file and says how to enable.
    let path = sandbox.home.join(".config/systemd/user/alexandria.service");
    let out = sandbox.run(&["daemon", "install-service"]);
    assert!(out.contains(&format!("wrote {}", path.display())), "{out}");
    assert!(
        out.contains("systemctl --user enable --now alexandria.service"),
        "{out}"
    );
    let installed = read(&path);
    let daemon_real = fs::canonicalize(bin_path("alexandriad")).expect("alexandriad");
    assert!(
        installed.contains(&format!("ExecStart=\"{}\"\n", daemon_real.display())),
        "{installed}"
    );
    assert!(
        !installed.contains("Environment="),
        "no ALEXANDRIA_HOME set: {installed}"
    );
    systemd_verify(&sandbox, &path);
    let out = sandbox.run(&["daemon", "install-service"]);
    assert!(out.contains("nothing changed"), "{out}");
    assert_eq!(read(&path), installed);

    let out = sandbox.run(&["daemon", "uninstall-service", "--dry-run"]);
    assert!(out.contains("would stop"), "{out}");
    assert!(path.exists());
    sandbox.run(&["daemon", "uninstall-service"]);
    assert!(!path.exists());
    let out = sandbox.run(&["daemon", "uninstall-service"]);
    assert!(out.contains("nothing changed"), "{out}");

    // A unit of that name that we did not write is left alone.
    write(&path, "[Service]\nExecStart=/bin/true\n");
    let error = sandbox.fail(&["daemon", "install-service"]);
    assert!(error.contains("not written by alexandria"), "{error}");
    let error = sandbox.fail(&["daemon", "uninstall-service"]);
    assert!(error.contains("not written by alexandria"), "{error}");
    assert_eq!(read(&path), "[Service]\nExecStart=/bin/true\n");
}

/// `systemd-analyze --user verify`, which checks the syntax, the directives and that
/// ExecStart is executable. CI must have it (Debian package `systemd`).
fn systemd_verify(sandbox: &Sandbox, unit: &Path) {
    let runtime = sandbox.root.join("runtime");
    fs::create_dir_all(&runtime).expect("runtime dir");
    let output = match Command::new("systemd-analyze")
        .args(["--user", "verify"])
        .arg(unit)
        .env("XDG_RUNTIME_DIR", &runtime)
        .env("HOME", &sandbox.home)
        .output()
    {
        Ok(output) => output,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            assert!(
                std::env::var_os("CI").is_none(),
                "systemd-analyze is missing; CI needs it: apt-get install -y systemd"
            );
            eprintln!("skipping systemd-analyze verify: not installed");
            return;
        }
        Err(e) => panic!("run systemd-analyze: {e}"),
    };
    assert_success(&output, "systemd-analyze verify");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(said.trim().is_empty(), "systemd-analyze warned:\n{said}");
}

#[test]
fn the_launchd_agent_is_a_valid_plist() {
    let sandbox = Sandbox::new();
    let daemon = fake_daemon(&sandbox);
    let alexandria_home = sandbox.root.join("a&b home");
    for home in [None, Some(&alexandria_home)] {
        let mut command = sandbox.command(&["daemon", "install-service", "--render", "launchd"]);
        command.env("ALEXANDRIAD", &daemon);
        if let Some(home) = home {
            command.env("ALEXANDRIA_HOME", home);
        }
        let output = command.output().expect("render");
        assert_success(&output, "render launchd");
        let plist = plist::Value::from_reader_xml(output.stdout.as_slice()).expect("valid plist");
        let agent = plist.as_dictionary().expect("a dictionary");
        assert_eq!(
            agent.get("Label").and_then(plist::Value::as_string),
            Some("dev.alexandria.daemon")
        );
        let program: Vec<&str> = agent
            .get("ProgramArguments")
            .and_then(plist::Value::as_array)
            .expect("ProgramArguments")
            .iter()
            .filter_map(plist::Value::as_string)
            .collect();
        assert_eq!(program, [daemon.to_str().expect("utf-8")]);
        assert_eq!(
            agent.get("RunAtLoad").and_then(plist::Value::as_boolean),
            Some(true)
        );
        let keep_alive = agent
            .get("KeepAlive")
            .and_then(plist::Value::as_dictionary)
            .expect("KeepAlive");
        assert_eq!(
            keep_alive
                .get("SuccessfulExit")
                .and_then(plist::Value::as_boolean),
            Some(false),
            "restart on failure only"
        );
        let environment = agent
            .get("EnvironmentVariables")
            .and_then(plist::Value::as_dictionary)
            .and_then(|env| env.get("ALEXANDRIA_HOME"))
            .and_then(plist::Value::as_string);
        assert_eq!(environment, home.map(|h| h.to_str().expect("utf-8")));
    }
}
