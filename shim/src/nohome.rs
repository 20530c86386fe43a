//! `alexandria mcp serve` on a home that is not set up: answer the MCP client ourselves.
//!
//! MCP clients start servers with a reduced environment, so a user's `ALEXANDRIA_HOME` often
//! never reaches the shim. Starting a daemon there would silently create an empty home and
//! the agent would see "no workspace 'acme'". Instead the shim answers `initialize` normally
//! (so the client shows the server as connected and the agent can read why) and every tool
//! call with an `isError` result naming the home it looked at and the command that fixes it.
//! No daemon is started and nothing is created. stdout carries MCP frames only.

use std::io::{self, BufRead, Write};

use alexandria_proto::{BUILD, Home};
use anyhow::{Context, Result};
use serde_json::{Value, json};

/// The error code of every tool result while the home is missing.
pub const CODE: &str = "home_not_found";

/// Protocol revisions we echo back when the client asks for them; anything else gets the
/// newest we know.
const KNOWN_VERSIONS: [&str; 5] = [
    "2024-11-05",
    "2025-03-26",
    "2025-06-18",
    "2025-11-25",
    "2026-07-28",
];

/// The tools the daemon would offer; listed so the agent calls one and reads the error.
const TOOLS: [&str; 8] = [
    "guide",
    "search",
    "read",
    "write",
    "delete",
    "sources",
    "subscriptions",
    "history",
];

/// Why the home cannot be served, in words for the agent and the user.
#[derive(Debug, Clone)]
pub struct Problem {
    pub message: String,
    pub hint: String,
    pub home: String,
}

/// `Some` when `home` has no `config.toml` (it was never set up with `alexandria init`).
/// `from_flag`: the home came from `--home`, not the environment.
pub fn check(home: &Home, from_flag: bool) -> Option<Problem> {
    if home.config_file().is_file() {
        return None;
    }
    let root = home.root();
    let what = if root.is_dir() {
        format!("{} has no config.toml", root.display())
    } else {
        format!("{} does not exist", root.display())
    };
    let source = if from_flag {
        "from --home".to_string()
    } else if std::env::var_os(alexandria_proto::home::HOME_ENV).is_some_and(|v| !v.is_empty()) {
        format!("from {}", alexandria_proto::home::HOME_ENV)
    } else {
        format!(
            "the default; {} was not set in this server's environment",
            alexandria_proto::home::HOME_ENV
        )
    };
    let message =
        format!("alexandria is not set up at the home this server uses: {what} (home {source})");
    let hint = format!(
        "if this is a new install, run `{}` in a terminal; if your wiki lives in another home, run `ALEXANDRIA_HOME=<that home> alexandria mcp install <client>` so this client's entry carries it (or add `\"env\": {{\"{}\": \"<that home>\"}}` to the entry); then restart the MCP client",
        init_command(home),
        alexandria_proto::home::HOME_ENV
    );
    Some(Problem {
        message,
        hint,
        home: root.display().to_string(),
    })
}

/// `mcp serve --init-if-missing`: set the home up when it does not exist or is an
/// empty folder (never over a folder holding something else). Reports on stderr only;
/// false when it cannot, and the caller answers home_not_found as usual.
pub fn init_on_first_use(connector: &crate::connect::Connector) -> bool {
    let root = connector.home.root();
    let empty = match std::fs::read_dir(root) {
        Ok(mut entries) => entries.next().is_none(),
        Err(error) => error.kind() == io::ErrorKind::NotFound,
    };
    if !empty {
        return false;
    }
    match crate::cli::request(connector, &alexandria_proto::ControlRequest::Init) {
        Ok((text, _)) => {
            eprintln!("alexandria: first use, set up {}: {text}", root.display());
            true
        }
        Err(error) => {
            eprintln!(
                "alexandria: could not set up {} on first use: {error:#}",
                root.display()
            );
            false
        }
    }
}

/// `alexandria init`, naming the home when it is not the default.
fn init_command(home: &Home) -> String {
    match crate::install::clients::Env::from_process() {
        Ok(env) => crate::install::init_command(home, &env),
        Err(_) => format!("alexandria --home '{}' init", home.root().display()),
    }
}

/// Answer frames on stdin until it closes.
pub fn serve(problem: &Problem) -> Result<()> {
    let stdin = io::stdin();
    let mut input = stdin.lock();
    let mut line = String::new();
    loop {
        line.clear();
        if input.read_line(&mut line).context("reading stdin")? == 0 {
            return Ok(());
        }
        if line.trim().is_empty() {
            continue;
        }
        if let Some(reply) = answer(problem, &line) {
            let mut bytes = serde_json::to_vec(&reply).context("encoding a reply")?;
            bytes.push(b'\n');
            let stdout = io::stdout();
            let mut out = stdout.lock();
            if out.write_all(&bytes).and_then(|()| out.flush()).is_err() {
                // The client closed our stdout: nobody is listening any more.
                return Ok(());
            }
        }
    }
}

/// The reply to one frame; `None` for notifications and responses.
pub fn answer(problem: &Problem, line: &str) -> Option<Value> {
    let Ok(frame) = serde_json::from_str::<Value>(line) else {
        return Some(error(
            Value::Null,
            -32700,
            "parse error: the frame is not JSON",
        ));
    };
    let method = frame.get("method").and_then(Value::as_str)?;
    let id = frame.get("id")?.clone();
    let result = match method {
        "initialize" => {
            let asked = frame["params"]["protocolVersion"].as_str();
            let version = asked
                .filter(|v| KNOWN_VERSIONS.contains(v))
                .unwrap_or("2025-11-25");
            json!({
                "protocolVersion": version,
                "capabilities": {"tools": {}, "resources": {}},
                "serverInfo": {"name": "alexandria", "version": BUILD},
                "instructions": format!("{}: {}. Fix: {}", CODE, problem.message, problem.hint),
            })
        }
        "ping" => json!({}),
        "tools/list" => json!({
            "tools": TOOLS.iter().map(|name| json!({
                "name": name,
                "description": format!("alexandria wiki tool (unavailable: {})", problem.message),
                "inputSchema": {"type": "object"},
            })).collect::<Vec<_>>()
        }),
        "tools/call" => {
            let text = format!("{CODE}: {}\nhint: {}", problem.message, problem.hint);
            json!({
                "content": [{"type": "text", "text": text}],
                "structuredContent": {"error": {
                    "code": CODE,
                    "message": problem.message,
                    "hint": problem.hint,
                    "home": problem.home,
                }},
                "isError": true,
            })
        }
        "resources/list" => json!({"resources": []}),
        "resources/templates/list" => json!({"resourceTemplates": []}),
        "prompts/list" => json!({"prompts": []}),
        _ => {
            return Some(error(
                id,
                -32601,
                &format!("method not found: {method} ({}: {})", CODE, problem.message),
            ));
        }
    };
    Some(json!({"jsonrpc": "2.0", "id": id, "result": result}))
}

fn error(id: Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem() -> Problem {
        Problem {
            message: "m".into(),
            hint: "h".into(),
            home: "/x".into(),
        }
    }

    #[test]
    fn answers() {
        let p = problem();
        let init = answer(
            &p,
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18"}}"#,
        )
        .expect("reply");
        assert_eq!(init["result"]["protocolVersion"], "2025-06-18");
        let odd = answer(
            &p,
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"1999-01-01"}}"#,
        )
        .expect("reply");
        assert_eq!(odd["result"]["protocolVersion"], "2025-11-25");
        assert!(
            answer(
                &p,
                r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#
            )
            .is_none()
        );
        let call = answer(
            &p,
            r#"{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"guide"}}"#,
        )
        .expect("reply");
        assert_eq!(call["id"], "a");
        assert_eq!(call["result"]["isError"], true);
        assert_eq!(call["result"]["structuredContent"]["error"]["code"], CODE);
        let unknown = answer(&p, r#"{"jsonrpc":"2.0","id":2,"method":"x/y"}"#).expect("reply");
        assert_eq!(unknown["error"]["code"], -32601);
        let garbage = answer(&p, "{nope").expect("reply");
        assert_eq!(garbage["error"]["code"], -32700);
    }
}
