//! The contract between the `alexandria` shim/CLI and the `alexandriad` daemon.
//!
//! Everything that crosses the daemon's Unix socket is defined here: where the socket
//! lives, the handshake (`Hello` / `HelloReply`), control requests and their replies,
//! the tool error codes, and the rules for workspace slugs and workspace-relative paths.
//! This crate has no async runtime, no SQLite and no git so that the shim stays small.
//!
//! Framing: every message in both directions is one line of JSON terminated by `\n`.
//! A connection starts with one `Hello` line from the client and one `HelloReply` line
//! from the daemon. After that an MCP connection carries MCP JSON-RPC frames unchanged,
//! and a control connection carries one `ControlRequest` and a stream of
//! `ControlReply` lines ending with `Done` or `Failed`.

pub mod errors;
pub mod home;
pub mod paths;

pub use errors::ErrorCode;
pub use home::Home;

use serde::{Deserialize, Serialize};

/// Version of the shim ↔ daemon protocol. Bump it whenever a message in this crate
/// changes shape; a shim that meets a daemon with an older protocol restarts it.
pub const PROTOCOL_VERSION: u32 = 2;

/// The build of the binaries, reported in the handshake and in `--version`.
pub const BUILD: &str = env!("CARGO_PKG_VERSION");

/// The HTTP port the daemon listens on unless `[http] port` or `--port` says otherwise.
/// Fixed, so a URL given to a client (or a tunnel) survives a daemon restart; 0 picks
/// a free port (tests).
pub const DEFAULT_HTTP_PORT: u16 = 4747;

/// Largest MCP frame the daemon accepts from a client (one JSON-RPC message).
/// Larger frames are answered with a JSON-RPC error and discarded.
pub const MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;

/// The last frame a stopping daemon writes on an MCP connection, once every request it
/// admitted is answered: a JSON-RPC notification with this method. A request the
/// client sent that is still unanswered then was never started, so the shim sends it
/// again to the next daemon instead of failing it. The shim does not pass it on.
pub const CLOSING_NOTIFICATION: &str = "notifications/alexandria/closing";

/// The first line a client sends on a fresh connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub protocol: u32,
    pub build: String,
    #[serde(flatten)]
    pub kind: ConnectionKind,
}

/// What the connection is for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ConnectionKind {
    /// An MCP session relayed by `alexandria mcp serve`.
    Mcp(McpHello),
    /// A one-shot control request from the CLI.
    Control,
}

/// Who is on the other side of an MCP session, as far as the shim can tell.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct McpHello {
    pub binding: Binding,
    /// PID of the process that launched the shim: the MCP client.
    pub parent_pid: u32,
    pub cwd: String,
    /// Set when the shim reconnects after losing the daemon, so the daemon can tell a
    /// resumed session from a new one in `mcp status`.
    #[serde(default)]
    pub resumed: bool,
}

/// Open mode (every workspace, `workspace` required) or pinned to one slug.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum Binding {
    Open,
    Pinned { workspace: String },
}

/// The daemon's answer to `Hello`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum HelloReply {
    Ready {
        protocol: u32,
        build: String,
        pid: u32,
    },
    /// The daemon speaks another protocol version. When the client's version is
    /// newer, the daemon shuts down right after sending this so the client can start
    /// its own build; `restarting` says so.
    ProtocolMismatch {
        protocol: u32,
        build: String,
        pid: u32,
        restarting: bool,
    },
    /// Same protocol, but the client is a newer build (`is_newer_build`): an upgrade was
    /// installed while this daemon ran. The daemon shuts down right after sending this,
    /// finishing what it was doing, so the client can start the new build. Only a newer
    /// client can receive it, and a newer client knows it: no protocol bump needed.
    Superseded { build: String, pid: u32 },
    Refused {
        code: String,
        message: String,
        hint: String,
    },
}

/// Whether build `candidate` is newer than build `current`, both `MAJOR.MINOR.PATCH` with
/// an optional `-prerelease` and `+metadata` (semver precedence: `1.0.0-rc.1` < `1.0.0`;
/// metadata is ignored). Anything that does not parse is never newer, so a daemon steps
/// down only for a build it can tell is an upgrade.
pub fn is_newer_build(candidate: &str, current: &str) -> bool {
    match (Version::parse(candidate), Version::parse(current)) {
        (Some(candidate), Some(current)) => candidate > current,
        _ => false,
    }
}

/// A parsed build version, ordered by semver precedence.
#[derive(Debug, PartialEq, Eq)]
struct Version<'a> {
    numbers: [u64; 3],
    /// Dot-separated pre-release identifiers; empty for a release.
    pre: Vec<&'a str>,
}

impl<'a> Version<'a> {
    fn parse(text: &'a str) -> Option<Version<'a>> {
        let text = text.split_once('+').map_or(text, |(version, _)| version);
        let (core, pre) = match text.split_once('-') {
            Some((core, pre)) => (core, pre.split('.').collect()),
            None => (text, Vec::new()),
        };
        let mut parts = core.split('.').map(|part| {
            (!part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()))
                .then(|| part.parse::<u64>().ok())
                .flatten()
        });
        let numbers = [parts.next()??, parts.next()??, parts.next()??];
        if parts.next().is_some() || pre.iter().any(|id: &&str| id.is_empty()) {
            return None;
        }
        Some(Version { numbers, pre })
    }
}

impl Ord for Version<'_> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        use std::cmp::Ordering;
        self.numbers.cmp(&other.numbers).then_with(|| {
            match (self.pre.is_empty(), other.pre.is_empty()) {
                (true, true) => Ordering::Equal,
                (true, false) => Ordering::Greater,
                (false, true) => Ordering::Less,
                (false, false) => {
                    for (a, b) in self.pre.iter().zip(&other.pre) {
                        let order = match (a.parse::<u64>(), b.parse::<u64>()) {
                            (Ok(a), Ok(b)) => a.cmp(&b),
                            (Ok(_), Err(_)) => Ordering::Less,
                            (Err(_), Ok(_)) => Ordering::Greater,
                            (Err(_), Err(_)) => a.cmp(b),
                        };
                        if order != Ordering::Equal {
                            return order;
                        }
                    }
                    self.pre.len().cmp(&other.pre.len())
                }
            }
        })
    }
}

impl PartialOrd for Version<'_> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// A request from the CLI to the daemon.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "request", rename_all = "snake_case")]
pub enum ControlRequest {
    /// Daemon pid, version, uptime, socket, sessions.
    Status,
    /// Create the home layout and the `global` workspace if missing.
    Init,
    WorkspaceCreate {
        slug: String,
    },
    WorkspaceList,
    /// Rename a workspace (directory, index and history move together).
    WorkspaceRename {
        from: String,
        to: String,
    },
    /// Move a workspace under the home's `trash/` (restorable); refused while a session is
    /// pinned to it unless `force`.
    WorkspaceArchive {
        slug: String,
        #[serde(default)]
        force: bool,
    },
    /// Bring back an archived workspace: an archive name, or a slug for its newest archive.
    WorkspaceRestore {
        name: String,
    },
    /// Paths, counts, size, last write, remote and sources of a workspace.
    WorkspaceInfo {
        slug: String,
    },
    /// Set (`url: Some`) or remove the git remote a workspace syncs with.
    WorkspaceRemote {
        slug: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        url: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        branch: Option<String>,
    },
    /// A workspace from a git remote (the second machine): clone, register, index.
    WorkspaceClone {
        url: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        slug: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        branch: Option<String>,
    },
    /// Remote, last sync, ahead/behind, open conflicts, last error.
    WorkspaceStatus {
        slug: String,
    },
    /// Sync one workspace with its remote now, or every workspace that has one.
    Sync {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        workspace: Option<String>,
    },
    /// Copy files into `raw/` of a workspace and index them. Paths are absolute; a
    /// directory is copied recursively to `raw/<its name>/` (hidden entries skipped).
    Ingest {
        workspace: String,
        files: Vec<String>,
    },
    /// Shut the daemon down gracefully.
    Stop,
    /// Mint an HTTP bearer token (turns tokens on). The reply carries it once.
    AuthToken {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        workspace: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ttl_secs: Option<u64>,
    },
    /// Invalidate every HTTP token minted so far.
    AuthRevoke,
    /// A one-time login URL for the web view.
    WebLogin,
    /// Turn remote access (OAuth for Claude.ai, ChatGPT, …) on at `public_url`,
    /// for `workspaces` (empty: every workspace). Written to `config.toml [remote]`.
    RemoteEnable {
        public_url: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        workspaces: Vec<String>,
    },
    /// Turn remote access off (OAuth tokens stop working at once).
    RemoteDisable,
    /// The public URL, workspaces, endpoints, clients and grants.
    RemoteStatus,
    /// A one-time pairing code (10 min) for the consent page.
    RemotePair,
    /// Registered OAuth clients and their live grants.
    RemoteClients,
    /// Fetch our own public documents through the public URL and report problems.
    RemoteDoctor,
    /// Revoke a client's grants (and forget the client), or every grant.
    RemoteRevoke {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        client_id: Option<String>,
        #[serde(default)]
        all: bool,
    },
    /// Add a source adapter to a workspace (`alexandria source add`).
    SourceAdd(SourceSpec),
    /// Sources of one workspace, or of every workspace.
    SourceList {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        workspace: Option<String>,
    },
    /// Sync one source now, or every source of the workspace (`name: None`).
    SourceSync {
        workspace: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
    },
    /// Store a source's credential (`user:password` or a bearer token) in `secrets/`.
    SourceSecret {
        workspace: String,
        name: String,
        secret: String,
    },
    /// Remove a source; what it captured stays in `raw/`.
    SourceRemove {
        workspace: String,
        name: String,
    },
    /// Items sources found, filtered.
    SubscriptionList {
        workspace: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        source: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        state: Option<String>,
    },
    /// Capture items into `raw/sources/<name>/` (one commit).
    SubscriptionIngest {
        workspace: String,
        #[serde(default)]
        items: Vec<i64>,
        /// With `all`: every pending item of this source.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        source: Option<String>,
        #[serde(default)]
        all: bool,
    },
    /// Dismiss items: they never come back.
    SubscriptionDismiss {
        workspace: String,
        items: Vec<i64>,
    },
}

/// A source as `alexandria source add` describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceSpec {
    pub workspace: String,
    /// `folder`, `feed`, `url` or `git`.
    pub kind: String,
    /// A directory, a feed URL (or file), page URLs, a repository path or URL.
    pub targets: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    /// Seconds between checks; `None` is the kind's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every_secs: Option<u64>,
    /// Capture new items without asking; `None` is the kind's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto: Option<bool>,
}

/// One line of the daemon's answer to a control request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum ControlReply {
    /// Intermediate progress of a long operation.
    Progress { done: u64, total: u64, item: String },
    /// Final success; `text` is for a human, `data` for `--json`.
    Done {
        text: String,
        data: serde_json::Value,
    },
    /// Final failure.
    Failed {
        code: String,
        message: String,
        hint: String,
    },
}

/// The line the daemon prints on its stdout once it is serving (or has failed to
/// start), so whoever spawned it can wait for an explicit answer instead of polling.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "daemon", rename_all = "snake_case")]
pub enum StartupNotice {
    Ready { pid: u32, socket: String },
    Failed { message: String },
}

/// Encode one message as a JSON line (with the trailing newline).
pub fn to_line<T: Serialize>(message: &T) -> Vec<u8> {
    let mut line = serde_json::to_vec(message).expect("protocol types always serialize");
    line.push(b'\n');
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip<T>(value: &T, golden: &str)
    where
        T: Serialize + for<'de> Deserialize<'de> + PartialEq + std::fmt::Debug,
    {
        let line = to_line(value);
        assert_eq!(
            std::str::from_utf8(&line).expect("utf8"),
            format!("{golden}\n")
        );
        let back: T = serde_json::from_str(golden).expect("golden parses");
        assert_eq!(&back, value);
    }

    #[test]
    fn superseded_golden() {
        round_trip(
            &HelloReply::Superseded {
                build: "0.1.0".into(),
                pid: 7,
            },
            r#"{"status":"superseded","build":"0.1.0","pid":7}"#,
        );
    }

    #[test]
    fn newer_builds() {
        let cases = [
            ("0.2.0", "0.1.0", true),
            ("0.1.1", "0.1.0", true),
            ("1.0.0", "0.99.99", true),
            ("0.10.0", "0.9.0", true),
            ("0.1.0", "0.1.0-rc.1", true),
            ("0.1.0-rc.2", "0.1.0-rc.1", true),
            ("0.1.0-rc.10", "0.1.0-rc.9", true),
            ("0.1.0-rc.1.1", "0.1.0-rc.1", true),
            ("0.1.0-beta", "0.1.0-alpha", true),
            ("0.1.0-alpha", "0.1.0-1", true),
            ("0.1.0", "0.1.0", false),
            ("0.1.0+abc", "0.1.0+def", false),
            ("0.1.0", "0.2.0", false),
            ("0.1.0-rc.1", "0.1.0", false),
            ("999.0.0", "garbage", false),
            ("garbage", "0.1.0", false),
            ("1.2", "1.1.0", false),
            ("1.2.3.4", "1.1.0", false),
            ("01.2.3x", "1.1.0", false),
            ("1.2.3-", "1.1.0", false),
            ("", "0.1.0", false),
        ];
        for (candidate, current, newer) in cases {
            assert_eq!(
                is_newer_build(candidate, current),
                newer,
                "{candidate} newer than {current}?"
            );
        }
    }

    #[test]
    fn hello_golden() {
        round_trip(
            &Hello {
                protocol: 1,
                build: "0.1.0".into(),
                kind: ConnectionKind::Mcp(McpHello {
                    binding: Binding::Pinned {
                        workspace: "acme".into(),
                    },
                    parent_pid: 42,
                    cwd: "/tmp".into(),
                    resumed: false,
                }),
            },
            r#"{"protocol":1,"build":"0.1.0","kind":"mcp","binding":{"mode":"pinned","workspace":"acme"},"parent_pid":42,"cwd":"/tmp","resumed":false}"#,
        );
        round_trip(
            &Hello {
                protocol: 1,
                build: "0.1.0".into(),
                kind: ConnectionKind::Control,
            },
            r#"{"protocol":1,"build":"0.1.0","kind":"control"}"#,
        );
    }

    #[test]
    fn replies_golden() {
        round_trip(
            &HelloReply::Ready {
                protocol: 1,
                build: "0.1.0".into(),
                pid: 7,
            },
            r#"{"status":"ready","protocol":1,"build":"0.1.0","pid":7}"#,
        );
        round_trip(
            &ControlRequest::Ingest {
                workspace: "global".into(),
                files: vec!["/a.md".into()],
            },
            r#"{"request":"ingest","workspace":"global","files":["/a.md"]}"#,
        );
        round_trip(
            &ControlRequest::AuthToken {
                workspace: Some("acme".into()),
                ttl_secs: Some(3600),
            },
            r#"{"request":"auth_token","workspace":"acme","ttl_secs":3600}"#,
        );
        round_trip(
            &ControlRequest::AuthToken {
                workspace: None,
                ttl_secs: None,
            },
            r#"{"request":"auth_token"}"#,
        );
        round_trip(&ControlRequest::AuthRevoke, r#"{"request":"auth_revoke"}"#);
        round_trip(
            &ControlRequest::RemoteEnable {
                public_url: "https://wiki.example.org".into(),
                workspaces: vec!["acme".into()],
            },
            r#"{"request":"remote_enable","public_url":"https://wiki.example.org","workspaces":["acme"]}"#,
        );
        round_trip(
            &ControlRequest::RemoteRevoke {
                client_id: None,
                all: true,
            },
            r#"{"request":"remote_revoke","all":true}"#,
        );
        round_trip(&ControlRequest::RemotePair, r#"{"request":"remote_pair"}"#);
        round_trip(
            &ControlRequest::SourceAdd(SourceSpec {
                workspace: "acme".into(),
                kind: "feed".into(),
                targets: vec!["https://example.org/feed.xml".into()],
                name: Some("news".into()),
                include: None,
                branch: None,
                every_secs: Some(3600),
                auto: None,
            }),
            r#"{"request":"source_add","workspace":"acme","kind":"feed","targets":["https://example.org/feed.xml"],"name":"news","every_secs":3600}"#,
        );
        round_trip(
            &ControlRequest::SubscriptionIngest {
                workspace: "acme".into(),
                items: vec![3, 4],
                source: None,
                all: false,
            },
            r#"{"request":"subscription_ingest","workspace":"acme","items":[3,4],"all":false}"#,
        );
        round_trip(
            &ControlReply::Progress {
                done: 1,
                total: 2,
                item: "a.md".into(),
            },
            r#"{"reply":"progress","done":1,"total":2,"item":"a.md"}"#,
        );
        round_trip(
            &StartupNotice::Failed {
                message: "boom".into(),
            },
            r#"{"daemon":"failed","message":"boom"}"#,
        );
    }

    #[test]
    fn hello_with_unknown_protocol_still_exposes_version() {
        // A future shim may add fields; the daemon must still read `protocol`.
        let future = r#"{"protocol":9,"build":"9.0.0","kind":"telepathy"}"#;
        let version: serde_json::Value = serde_json::from_str(future).expect("json");
        assert_eq!(version["protocol"], 9);
        assert!(serde_json::from_str::<Hello>(future).is_err());
    }
}
