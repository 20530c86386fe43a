//! Tool errors: a code from SPEC §4, a message, a hint and optional details.
//! `mcp` turns them into `isError` results; `control` into `Failed` replies.
//!
//! A hint tells the reader what to do next, and the reader is either an agent calling
//! tools or a person at the command line: "call guide()" helps the one and confuses
//! the other. An error carries the agent's hint and, when a person needs other words,
//! theirs (`with_person_hint`); `hint_for` is the one place that picks.

use alexandria_proto::ErrorCode;
use serde_json::{Map, Value};

/// Who reads an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Audience {
    /// An agent, through a tool result: hints name tools and parameters.
    Agent,
    /// A person, through the CLI: hints name `alexandria` commands.
    Person,
}

/// An error a caller can act on.
#[derive(Debug, Clone)]
pub struct ToolError {
    pub code: ErrorCode,
    pub message: String,
    /// The hint for an agent, and for a person unless `person_hint` is set.
    pub hint: String,
    /// The hint for a person when the agent's would name tools.
    pub person_hint: Option<String>,
    pub details: Map<String, Value>,
}

pub type ToolResult<T> = Result<T, ToolError>;

impl ToolError {
    /// A failed file operation: a full disk or a read-only file system say so, with
    /// what to do; anything else is `internal`.
    pub fn io(context: &str, error: std::io::Error) -> ToolError {
        match error.raw_os_error() {
            Some(28) => ToolError::new(
                ErrorCode::TooLarge,
                format!("{context}: the disk is full"),
                "free disk space, then retry; nothing was changed",
            ),
            Some(30) => ToolError::new(
                ErrorCode::Internal,
                format!("{context}: the file system is read-only"),
                "make the alexandria home writable, then retry; nothing was changed",
            ),
            _ => ToolError::internal(context, error),
        }
    }

    pub fn new(code: ErrorCode, message: impl Into<String>, hint: impl Into<String>) -> ToolError {
        ToolError {
            code,
            message: message.into(),
            hint: hint.into(),
            person_hint: None,
            details: Map::new(),
        }
    }

    /// Another hint than the constructor's.
    pub fn with_hint(mut self, hint: impl Into<String>) -> ToolError {
        self.hint = hint.into();
        self
    }

    /// Other words for a person at the command line.
    pub fn with_person_hint(mut self, hint: impl Into<String>) -> ToolError {
        self.person_hint = Some(hint.into());
        self
    }

    /// The hint for `audience`.
    pub fn hint_for(&self, audience: Audience) -> &str {
        match (audience, &self.person_hint) {
            (Audience::Person, Some(hint)) => hint,
            _ => &self.hint,
        }
    }

    pub fn with_detail(mut self, key: &str, value: impl Into<Value>) -> ToolError {
        self.details.insert(key.to_string(), value.into());
        self
    }

    pub fn internal(context: &str, error: impl std::fmt::Display) -> ToolError {
        tracing::error!(%error, context, "internal error");
        ToolError::new(
            ErrorCode::Internal,
            format!("{context}: {error}"),
            "this is a bug or an environment problem (disk, permissions); the daemon log has details",
        )
    }

    pub fn invalid_argument(message: impl Into<String>, hint: impl Into<String>) -> ToolError {
        ToolError::new(ErrorCode::InvalidArgument, message, hint)
    }

    pub fn invalid_path(message: impl Into<String>) -> ToolError {
        ToolError::new(
            ErrorCode::InvalidPath,
            message,
            "paths are workspace-relative and start with raw/ or wiki/, e.g. wiki/index.md; no '..', absolute paths, backslashes or percent-encoding",
        )
    }

    pub fn not_found(path: &str) -> ToolError {
        ToolError::new(
            ErrorCode::NotFound,
            format!("{path} does not exist"),
            "list what exists with search(mode=\"list\", path=\"wiki/**\") or search by content",
        )
        .with_detail("path", path)
    }

    /// The `structuredContent` of an error result.
    pub fn to_json(&self) -> Value {
        let mut error = Map::new();
        error.insert("code".into(), self.code.as_str().into());
        error.insert("message".into(), self.message.clone().into());
        error.insert("hint".into(), self.hint_for(Audience::Agent).into());
        for (key, value) in &self.details {
            error.insert(key.clone(), value.clone());
        }
        serde_json::json!({ "error": error })
    }

    /// The text content of an error result: begins with the code.
    pub fn to_text(&self) -> String {
        format!(
            "{}: {}\nhint: {}",
            self.code,
            self.message,
            self.hint_for(Audience::Agent)
        )
    }
}

impl std::fmt::Display for ToolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for ToolError {}

impl From<rusqlite::Error> for ToolError {
    fn from(error: rusqlite::Error) -> ToolError {
        if let rusqlite::Error::SqliteFailure(e, _) = &error
            && matches!(
                e.code,
                rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
            )
        {
            return ToolError::new(
                ErrorCode::WorkspaceBusy,
                format!("alexandria's state.db is locked by another process: {error}"),
                "retry in a moment; if it persists, close whatever has state.db open (only alexandriad should)",
            );
        }
        if let rusqlite::Error::SqliteFailure(e, _) = &error
            && e.code == rusqlite::ErrorCode::DiskFull
        {
            return ToolError::new(
                ErrorCode::TooLarge,
                format!("the disk is full: {error}"),
                "free disk space, then retry; nothing was changed",
            );
        }
        ToolError::internal("database", error)
    }
}

impl From<r2d2::Error> for ToolError {
    fn from(error: r2d2::Error) -> ToolError {
        ToolError::internal("database pool", error)
    }
}

/// Opening a workspace's repository (`WorkspaceState::with_repo`) failed.
impl From<git2::Error> for ToolError {
    fn from(error: git2::Error) -> ToolError {
        ToolError::internal("opening the workspace's git repository", error)
    }
}
