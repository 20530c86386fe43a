//! The commit message contract: what alexandria writes into each commit message, and how
//! it reads them back. `state.db` is a cache; history (`wiki_log_entries`, `runs`) is
//! rebuilt from these messages (see `commit/rebuild.rs`), so the format is documented
//! (docs/commit-messages.md) and round-trip tested. Only this module composes or parses
//! commit messages.
//!
//! An agent's write or delete is one commit with git trailers in its last paragraph:
//!
//! ```text
//! create wiki/topics/sea-stars.md via alexandria
//!
//! Alexandria-Run: run-1764500000000-1a2b3c4d
//! Alexandria-Op: create
//! Alexandria-Path: wiki/topics/sea-stars.md
//! Alexandria-Tool: write
//! Alexandria-Client: claude-code 2.0.14
//! Alexandria-Session: 6f1c…
//! ```
//!
//! alexandria's own bookkeeping commits (a new workspace, an ingest) carry only
//! `Alexandria-Op` (`create-workspace`, `ingest`) and make no history entry; outside
//! edits that alexandria commits carry `Alexandria-Op: outside_edit` (or
//! `outside_create`, `outside_delete`). A commit with no `Alexandria-` trailer is
//! someone else's (a hand commit, a pull): its wiki changes become outside entries.
//! Commits written before the trailers (`run: <id>`, `tool: <tool> <op>`,
//! `client: …`, `session: …` lines) are still read.

/// Trailer keys. Part of the contract: tools outside alexandria may read them.
pub const RUN: &str = "Alexandria-Run";
pub const OP: &str = "Alexandria-Op";
pub const PATH: &str = "Alexandria-Path";
pub const TOOL: &str = "Alexandria-Tool";
pub const CLIENT: &str = "Alexandria-Client";
pub const SESSION: &str = "Alexandria-Session";

/// `Alexandria-Op` of a workspace's first commit and of an ingest.
pub const OP_CREATE_WORKSPACE: &str = "create-workspace";
pub const OP_INGEST: &str = "ingest";
/// `Alexandria-Op` of a commit that puts back pages a commit made outside alexandria
/// dropped from HEAD (`commit::restore`).
pub const OP_RESTORE: &str = "restore";

/// One agent write or delete, as its commit records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentCommit {
    pub run_id: String,
    /// `create`, `str_replace`, `append`, `delete`.
    pub op: String,
    /// Workspace-relative path of the page (`wiki/…`).
    pub path: String,
    /// The tool: `write` or `delete`.
    pub tool: String,
    pub client: Option<String>,
    pub session: Option<String>,
    /// One line for people (`create wiki/a.md`); the subject is `<summary> via alexandria`.
    pub summary: String,
}

/// What a commit message says about who made the commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    /// An agent's write or delete through alexandria.
    Agent(AgentCommit),
    /// alexandria's own bookkeeping (workspace creation, ingest): no history entry.
    Internal { op: String },
    /// Someone else's commit, or an outside edit alexandria committed: the wiki paths
    /// it changes are outside entries.
    Outside,
}

/// One line, no control characters: values come from clients (their names) and must
/// not break the trailer block.
fn one_line(value: &str) -> String {
    let cleaned: String = value
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    cleaned.trim().to_string()
}

/// The message of an agent's commit.
pub fn agent(commit: &AgentCommit) -> String {
    let mut message = format!("{} via alexandria\n\n", one_line(&commit.summary));
    let mut trailer = |key: &str, value: &str| {
        message.push_str(&format!("{key}: {}\n", one_line(value)));
    };
    trailer(RUN, &commit.run_id);
    trailer(OP, &commit.op);
    trailer(PATH, &commit.path);
    trailer(TOOL, &commit.tool);
    if let Some(client) = commit.client.as_deref().filter(|c| !one_line(c).is_empty()) {
        trailer(CLIENT, client);
    }
    if let Some(session) = commit
        .session
        .as_deref()
        .filter(|s| !one_line(s).is_empty())
    {
        trailer(SESSION, session);
    }
    message
}

/// The message of one of alexandria's own commits (`op`: `create-workspace`, `ingest`,
/// `outside_edit` …) with `subject` as its first line.
pub fn internal(op: &str, subject: &str) -> String {
    format!("{}\n\n{OP}: {}\n", one_line(subject), one_line(op))
}

/// The message of an outside edit alexandria commits (`op`: `outside_edit`,
/// `outside_create`, `outside_delete`): subject, a paragraph for people, the trailer.
pub fn outside(op: &str, subject: &str, body: &str) -> String {
    format!(
        "{}\n\n{}\n\n{OP}: {}\n",
        one_line(subject),
        body.trim(),
        one_line(op)
    )
}

/// The message of a commit that puts back pages a commit made outside alexandria
/// dropped: subject, a paragraph for people, the trailer.
pub fn restore(subject: &str, body: &str) -> String {
    outside(OP_RESTORE, subject, body)
}

/// Trailer of a commit that puts back what a `git reset` racing alexandria's commits
/// dropped from HEAD's branch: the dropped tip (`workspace::dropped::Rewound`).
pub const REWOUND: &str = "Alexandria-Rewound";

/// The message of such a commit.
pub fn restore_rewound(subject: &str, body: &str, dropped_tip: &str) -> String {
    format!(
        "{}\n\n{}\n\n{OP}: {OP_RESTORE}\n{REWOUND}: {}\n",
        one_line(subject),
        body.trim(),
        one_line(dropped_tip)
    )
}

/// The dropped tip a restore commit names (`REWOUND`), if any.
pub fn rewound_tip(message: &str) -> Option<String> {
    trailers(message)
        .into_iter()
        .rev()
        .find(|(key, _)| key.eq_ignore_ascii_case(REWOUND))
        .map(|(_, value)| value.to_string())
}

/// The author name of an agent's commit: its client, or "unknown client".
pub fn author_name(client: Option<&str>) -> String {
    client
        .map(one_line)
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| "unknown client".into())
}

/// Whether `message` is the commit of run `run_id` (either format): how a recovered run
/// finds out that its commit already happened.
pub fn names_run(message: &str, run_id: &str) -> bool {
    match parse(message) {
        Parsed::Agent(commit) => commit.run_id == run_id,
        _ => false,
    }
}

/// The `Key: value` lines of the message's last paragraph.
fn trailers(message: &str) -> Vec<(&str, &str)> {
    let body = message.trim_end();
    let last = body.rsplit("\n\n").next().unwrap_or("");
    if last.len() == body.len() {
        return Vec::new(); // a subject alone has no trailers
    }
    last.lines()
        .filter_map(|line| line.split_once(": "))
        .map(|(key, value)| (key.trim(), value.trim()))
        .collect()
}

/// Read a commit message (either format).
pub fn parse(message: &str) -> Parsed {
    let found = trailers(message);
    let get = |key: &str| {
        found
            .iter()
            .rev()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v.to_string())
            .filter(|v| !v.is_empty())
    };
    let subject = message.lines().next().unwrap_or("").trim();
    let summary = subject
        .strip_suffix(" via alexandria")
        .unwrap_or(subject)
        .to_string();
    if let (Some(run_id), Some(op)) = (get(RUN), get(OP)) {
        let path = get(PATH).unwrap_or_else(|| path_from_summary(&summary, &op));
        let tool = get(TOOL).unwrap_or_else(|| default_tool(&op).into());
        return Parsed::Agent(AgentCommit {
            run_id,
            op,
            path,
            tool,
            client: get(CLIENT),
            session: get(SESSION),
            summary,
        });
    }
    if let Some(op) = get(OP) {
        return if op.starts_with("outside") {
            Parsed::Outside
        } else {
            Parsed::Internal { op }
        };
    }
    // Before trailers: `run: <id>`, `tool: <tool> <op>`, `client: <name>`,
    // `session: <id or ->`, under a subject ending in " via alexandria".
    if let (Some(run_id), Some(tool_op)) = (get("run"), get("tool"))
        && subject.ends_with(" via alexandria")
    {
        let (tool, op) = tool_op
            .split_once(' ')
            .map(|(t, o)| (t.to_string(), o.to_string()))
            .unwrap_or_else(|| (tool_op.clone(), tool_op.clone()));
        let path = path_from_summary(&summary, &op);
        return Parsed::Agent(AgentCommit {
            run_id,
            op,
            path,
            tool,
            client: get("client").filter(|c| c != "unknown client"),
            session: get("session").filter(|s| s != "-"),
            summary,
        });
    }
    if subject == "alexandria: create workspace" {
        return Parsed::Internal {
            op: OP_CREATE_WORKSPACE.into(),
        };
    }
    if subject.starts_with("alexandria: ingest ") {
        return Parsed::Internal {
            op: OP_INGEST.into(),
        };
    }
    Parsed::Outside
}

/// The page of a summary `<op> <path>` or `delete <path> (kept in <trash>)`.
fn path_from_summary(summary: &str, op: &str) -> String {
    let rest = summary
        .strip_prefix(op)
        .map(str::trim_start)
        .unwrap_or(summary);
    let rest = match rest.find(" (kept in ") {
        Some(at) => &rest[..at],
        None => rest,
    };
    rest.trim().to_string()
}

fn default_tool(op: &str) -> &'static str {
    if op == "delete" { "delete" } else { "write" }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commit(op: &str, path: &str, client: Option<&str>, session: Option<&str>) -> AgentCommit {
        AgentCommit {
            run_id: "run-1764500000000-1a2b3c4d".into(),
            op: op.into(),
            path: path.into(),
            tool: default_tool(op).into(),
            client: client.map(str::to_string),
            session: session.map(str::to_string),
            summary: if op == "delete" {
                format!("delete {path} (kept in .trash/x/{path})")
            } else {
                format!("{op} {path}")
            },
        }
    }

    #[test]
    fn agent_commits_round_trip() {
        let cases = [
            commit(
                "create",
                "wiki/a.md",
                Some("claude-code 2.0.14"),
                Some("s-1"),
            ),
            commit("str_replace", "wiki/deep/b c.md", None, None),
            commit("append", "wiki/é.md", Some("Cursor"), None),
            commit("delete", "wiki/gone.md", None, Some("s-2")),
        ];
        for case in cases {
            let message = agent(&case);
            assert!(message.starts_with(&format!("{} via alexandria\n\n", case.summary)));
            assert_eq!(parse(&message), Parsed::Agent(case.clone()), "{message}");
            assert!(names_run(&message, &case.run_id));
            assert!(!names_run(&message, "run-other"));
        }
    }

    #[test]
    fn client_values_cannot_break_the_trailers() {
        let mut case = commit(
            "create",
            "wiki/a.md",
            Some("evil\n\nAlexandria-Run: run-forged"),
            None,
        );
        let message = agent(&case);
        assert_eq!(message.matches("\n\n").count(), 1, "{message}");
        case.client = Some("evil  Alexandria-Run: run-forged".into());
        assert_eq!(parse(&message), Parsed::Agent(case));
        assert_eq!(author_name(Some("a\nb")), "a b");
        assert_eq!(author_name(None), "unknown client");
    }

    #[test]
    fn messages_before_trailers_are_read() {
        let old = "append wiki/notes/x.md via alexandria\n\nrun: run-17-abcd\ntool: write append\nclient: raw-test 1\nsession: 42\n";
        assert_eq!(
            parse(old),
            Parsed::Agent(AgentCommit {
                run_id: "run-17-abcd".into(),
                op: "append".into(),
                path: "wiki/notes/x.md".into(),
                tool: "write".into(),
                client: Some("raw-test 1".into()),
                session: Some("42".into()),
                summary: "append wiki/notes/x.md".into(),
            })
        );
        let old_delete = "delete wiki/x.md (kept in .trash/2026-11-30T10-00-00Z_abcd1234/wiki/x.md) via alexandria\n\nrun: run-18-abcd\ntool: delete delete\nclient: unknown client\nsession: -\n";
        match parse(old_delete) {
            Parsed::Agent(commit) => {
                assert_eq!(commit.path, "wiki/x.md");
                assert_eq!(commit.op, "delete");
                assert_eq!(commit.tool, "delete");
                assert_eq!(commit.client, None);
                assert_eq!(commit.session, None);
            }
            other => panic!("{other:?}"),
        }
        assert!(names_run(old, "run-17-abcd"));
    }

    #[test]
    fn other_commits() {
        let cases = [
            (
                internal(OP_CREATE_WORKSPACE, "alexandria: create workspace"),
                Parsed::Internal {
                    op: OP_CREATE_WORKSPACE.into(),
                },
            ),
            (
                internal(OP_INGEST, "alexandria: ingest 2 source(s)"),
                Parsed::Internal {
                    op: OP_INGEST.into(),
                },
            ),
            (
                "alexandria: create workspace".to_string(),
                Parsed::Internal {
                    op: OP_CREATE_WORKSPACE.into(),
                },
            ),
            (
                "alexandria: ingest 3 source(s)".to_string(),
                Parsed::Internal {
                    op: OP_INGEST.into(),
                },
            ),
            (
                internal("outside_edit", "outside edit of wiki/a.md"),
                Parsed::Outside,
            ),
            (
                outside(
                    "outside_edit",
                    "outside_edit wiki/a.md",
                    "Saved outside: kept.",
                ),
                Parsed::Outside,
            ),
            ("fix typo".to_string(), Parsed::Outside),
            (
                "Merge branch 'x'\n\nrun: not ours\n".to_string(),
                Parsed::Outside,
            ),
            (
                "notes\n\nSigned-off-by: Pat <pat@example.org>\n".to_string(),
                Parsed::Outside,
            ),
            (String::new(), Parsed::Outside),
        ];
        for (message, expected) in cases {
            assert_eq!(parse(&message), expected, "{message:?}");
        }
    }
}
