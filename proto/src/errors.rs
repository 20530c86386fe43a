//! Machine-readable error codes shared by tools, control requests and the CLI.

use std::fmt;

/// Every error code a tool result or control reply can carry (SPEC §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    WorkspaceRequired,
    WorkspaceNotFound,
    WorkspaceNotAccessible,
    WorkspaceExists,
    WorkspaceBusy,
    RepositoryInUse,
    StalePlan,
    NotFound,
    InvalidPath,
    RawReadonly,
    ProtectedPath,
    CitationInvalid,
    NoMatch,
    AmbiguousMatch,
    TooLarge,
    InvalidArgument,
    InvalidQuery,
    /// The daemon is stopping (`daemon stop`, a signal, an upgrade) and did not start
    /// this request: send it again (the shim does, to the next daemon).
    DaemonStopping,
    SyncFailed,
    Internal,
}

impl ErrorCode {
    pub const ALL: [ErrorCode; 20] = [
        ErrorCode::WorkspaceRequired,
        ErrorCode::WorkspaceNotFound,
        ErrorCode::WorkspaceNotAccessible,
        ErrorCode::WorkspaceExists,
        ErrorCode::WorkspaceBusy,
        ErrorCode::RepositoryInUse,
        ErrorCode::StalePlan,
        ErrorCode::NotFound,
        ErrorCode::InvalidPath,
        ErrorCode::RawReadonly,
        ErrorCode::ProtectedPath,
        ErrorCode::CitationInvalid,
        ErrorCode::NoMatch,
        ErrorCode::AmbiguousMatch,
        ErrorCode::TooLarge,
        ErrorCode::InvalidArgument,
        ErrorCode::InvalidQuery,
        ErrorCode::DaemonStopping,
        ErrorCode::SyncFailed,
        ErrorCode::Internal,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::WorkspaceRequired => "workspace_required",
            ErrorCode::WorkspaceNotFound => "workspace_not_found",
            ErrorCode::WorkspaceNotAccessible => "workspace_not_accessible",
            ErrorCode::WorkspaceExists => "workspace_exists",
            ErrorCode::WorkspaceBusy => "workspace_busy",
            ErrorCode::RepositoryInUse => "repository_in_use",
            ErrorCode::StalePlan => "stale_plan",
            ErrorCode::NotFound => "not_found",
            ErrorCode::InvalidPath => "invalid_path",
            ErrorCode::RawReadonly => "raw_readonly",
            ErrorCode::ProtectedPath => "protected_path",
            ErrorCode::CitationInvalid => "citation_invalid",
            ErrorCode::NoMatch => "no_match",
            ErrorCode::AmbiguousMatch => "ambiguous_match",
            ErrorCode::TooLarge => "too_large",
            ErrorCode::InvalidArgument => "invalid_argument",
            ErrorCode::InvalidQuery => "invalid_query",
            ErrorCode::DaemonStopping => "daemon_stopping",
            ErrorCode::SyncFailed => "sync_failed",
            ErrorCode::Internal => "internal",
        }
    }

    pub fn parse(code: &str) -> Option<ErrorCode> {
        ErrorCode::ALL.into_iter().find(|c| c.as_str() == code)
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for code in ErrorCode::ALL {
            assert!(seen.insert(code.as_str()), "duplicate {code}");
            assert_eq!(ErrorCode::parse(code.as_str()), Some(code));
        }
        assert_eq!(ErrorCode::parse("nope"), None);
    }
}
