//! `alexandria remote doctor`: fetch our own public documents through the public URL
//! (so through the tunnel, as Claude.ai or ChatGPT would) and say what is wrong: the
//! tunnel does not reach us, reaches another server, or a document disagrees with the
//! public URL.

use std::time::Duration;

use serde_json::{Value, json};

use crate::auth::oauth::Remote;

const TIMEOUT: Duration = Duration::from_secs(10);
const MAX_BYTES: u64 = 256 * 1024;
const TUNNEL_HINT: &str = "check that the tunnel runs and forwards to this daemon's HTTP port (`alexandria daemon status` shows it); see docs/remote.md";
const URL_HINT: &str = "the public URL in config.toml [remote] must be the URL clients use: run `alexandria remote enable --public-url …` again";

/// One check: what was looked at, and its problem with a hint (`None`: fine).
struct Check {
    name: &'static str,
    problem: Option<(String, String)>,
}

struct Fetched {
    status: u16,
    challenge: Option<String>,
    body: Value,
}

fn fetch(agent: &ureq::Agent, url: &str, post: bool) -> Result<Fetched, String> {
    let response = if post {
        agent
            .post(url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .send(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#)
    } else {
        agent.get(url).header("accept", "application/json").call()
    };
    let mut response = response.map_err(|e| format!("cannot reach {url}: {e}"))?;
    let status = response.status().as_u16();
    let challenge = response
        .headers()
        .get("www-authenticate")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = response
        .body_mut()
        .with_config()
        .limit(MAX_BYTES)
        .read_to_vec()
        .unwrap_or_default();
    Ok(Fetched {
        status,
        challenge,
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
    })
}

fn problem(what: String, hint: &str) -> Option<(String, String)> {
    Some((what, hint.to_string()))
}

fn check_health(agent: &ureq::Agent, remote: &Remote, version: &str) -> Option<(String, String)> {
    let url = format!("{}/health", remote.origin);
    match fetch(agent, &url, false) {
        Err(e) => problem(e, TUNNEL_HINT),
        Ok(f) if f.status == 200 && f.body["status"] == "ok" => {
            if f.body["version"] == version {
                None
            } else {
                problem(
                    format!(
                        "{url} answers as alexandria {} (this daemon is {version})",
                        f.body["version"]
                    ),
                    "the tunnel reaches another alexandria daemon: point it at this one's port",
                )
            }
        }
        Ok(f) => problem(
            format!("{url} answered HTTP {}, not alexandria's health", f.status),
            TUNNEL_HINT,
        ),
    }
}

fn check_prm(
    agent: &ureq::Agent,
    remote: &Remote,
    endpoint: Option<&str>,
) -> Option<(String, String)> {
    let url = remote.metadata_url(endpoint);
    let resource = remote.resource(endpoint);
    match fetch(agent, &url, false) {
        Err(e) => problem(e, TUNNEL_HINT),
        Ok(f) if f.status != 200 => {
            problem(format!("{url} answered HTTP {}", f.status), TUNNEL_HINT)
        }
        Ok(f) if f.body["resource"] != json!(resource) => problem(
            format!(
                "{url} names resource {} instead of {resource}",
                f.body["resource"]
            ),
            URL_HINT,
        ),
        Ok(f)
            if !f.body["authorization_servers"]
                .as_array()
                .is_some_and(|a| a.iter().any(|s| s == remote.issuer())) =>
        {
            problem(
                format!(
                    "{url} does not name {} as its authorization server",
                    remote.issuer()
                ),
                URL_HINT,
            )
        }
        Ok(_) => None,
    }
}

fn check_asm(agent: &ureq::Agent, remote: &Remote) -> Option<(String, String)> {
    let url = format!("{}/.well-known/oauth-authorization-server", remote.origin);
    match fetch(agent, &url, false) {
        Err(e) => problem(e, TUNNEL_HINT),
        Ok(f) if f.status != 200 => {
            problem(format!("{url} answered HTTP {}", f.status), TUNNEL_HINT)
        }
        Ok(f) if f.body["issuer"] != json!(remote.issuer()) => problem(
            format!(
                "{url} names issuer {} instead of {}",
                f.body["issuer"],
                remote.issuer()
            ),
            URL_HINT,
        ),
        Ok(f) => [
            "authorization_endpoint",
            "token_endpoint",
            "registration_endpoint",
        ]
        .into_iter()
        .find(|key| {
            !f.body[*key]
                .as_str()
                .is_some_and(|u| u.starts_with(&remote.origin))
        })
        .and_then(|key| {
            problem(
                format!("{url}: {key} is not under {}", remote.origin),
                URL_HINT,
            )
        }),
    }
}

fn check_challenge(
    agent: &ureq::Agent,
    remote: &Remote,
    endpoint: Option<&str>,
) -> Option<(String, String)> {
    let url = remote.resource(endpoint);
    let prm = remote.metadata_url(endpoint);
    match fetch(agent, &url, true) {
        Err(e) => problem(e, TUNNEL_HINT),
        Ok(f) if f.status != 401 => problem(
            format!(
                "{url} answered HTTP {} without a token (expected 401)",
                f.status
            ),
            TUNNEL_HINT,
        ),
        Ok(f)
            if f.challenge
                .as_deref()
                .is_some_and(|c| c.contains(&format!("resource_metadata=\"{prm}\""))) =>
        {
            None
        }
        Ok(f) => problem(
            format!(
                "{url} answered 401 with WWW-Authenticate {:?}, which does not point at {prm}",
                f.challenge
            ),
            "a proxy or tunnel may drop or rewrite the header; clients need it to find the authorization server",
        ),
    }
}

/// Run every check: the text for a person, the JSON for `--json`, and whether all passed.
pub fn run(remote: &Remote, version: &str) -> (String, Value, bool) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .max_redirects(0)
        .http_status_as_error(false)
        .timeout_global(Some(TIMEOUT))
        .build()
        .into();
    // The open endpoint, or the first shared workspace when only some are shared.
    let endpoint = if remote.serves(None) {
        None
    } else {
        remote.workspaces.first().map(String::as_str)
    };
    let checks = [
        Check {
            name: "health through the public URL",
            problem: check_health(&agent, remote, version),
        },
        Check {
            name: "protected resource metadata",
            problem: check_prm(&agent, remote, endpoint),
        },
        Check {
            name: "authorization server metadata",
            problem: check_asm(&agent, remote),
        },
        Check {
            name: "401 challenge on the MCP endpoint",
            problem: check_challenge(&agent, remote, endpoint),
        },
    ];
    let ok = checks.iter().all(|c| c.problem.is_none());
    let mut text = format!("remote doctor: {}\n", remote.origin);
    for check in &checks {
        match &check.problem {
            None => text.push_str(&format!("  ok       {}\n", check.name)),
            Some((what, hint)) => text.push_str(&format!(
                "  PROBLEM  {}: {what}\n           hint: {hint}\n",
                check.name
            )),
        }
    }
    text.push_str(if ok {
        "all checks passed"
    } else {
        "some checks failed"
    });
    let data = json!({
        "public_url": remote.origin,
        "ok": ok,
        "checks": checks.iter().map(|c| json!({
            "check": c.name,
            "ok": c.problem.is_none(),
            "problem": c.problem.as_ref().map(|p| &p.0),
            "hint": c.problem.as_ref().map(|p| &p.1),
        })).collect::<Vec<_>>(),
    });
    (text, data, ok)
}
