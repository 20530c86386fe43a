//! Live MCP sessions, for `alexandria mcp status`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use alexandria_proto::Binding;
use serde_json::{Value, json};

use crate::db::now_ms;
use crate::tools::iso_time;

/// One MCP session on any transport.
#[derive(Debug)]
pub struct SessionInfo {
    pub id: String,
    pub transport: &'static str,
    pub binding: Binding,
    pub parent_pid: Option<u32>,
    pub parent_name: Option<String>,
    pub cwd: Option<String>,
    pub resumed: bool,
    pub started_at: i64,
    client: Mutex<Option<(String, String)>>,
    last_call_at: AtomicI64,
    calls: AtomicU64,
}

impl SessionInfo {
    pub fn new(
        transport: &'static str,
        binding: Binding,
        parent_pid: Option<u32>,
        cwd: Option<String>,
        resumed: bool,
    ) -> SessionInfo {
        SessionInfo {
            id: uuid::Uuid::new_v4().simple().to_string(),
            transport,
            binding,
            parent_pid,
            parent_name: parent_pid.and_then(process_name),
            cwd,
            resumed,
            started_at: now_ms(),
            client: Mutex::new(None),
            last_call_at: AtomicI64::new(0),
            calls: AtomicU64::new(0),
        }
    }

    pub fn set_client(&self, name: &str, version: &str) {
        *self.client.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((name.to_string(), version.to_string()));
    }

    pub fn client(&self) -> Option<(String, String)> {
        self.client
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn record_call(&self) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.last_call_at.store(now_ms(), Ordering::Relaxed);
    }

    pub fn to_json(&self) -> Value {
        let last = self.last_call_at.load(Ordering::Relaxed);
        let (mode, workspace) = match &self.binding {
            Binding::Open => ("open", None),
            Binding::Pinned { workspace } => ("pinned", Some(workspace.clone())),
        };
        let client = self.client();
        json!({
            "session": self.id,
            "transport": self.transport,
            "binding": mode,
            "workspace": workspace,
            "parent_pid": self.parent_pid,
            "parent_name": self.parent_name,
            "cwd": self.cwd,
            "client_name": client.as_ref().map(|c| c.0.clone()),
            "client_version": client.as_ref().map(|c| c.1.clone()),
            "resumed": self.resumed,
            "started_at": iso_time(self.started_at),
            "last_call_at": (last > 0).then(|| iso_time(last)),
            "calls": self.calls.load(Ordering::Relaxed),
        })
    }
}

/// The name of a process (Linux: /proc/<pid>/comm).
fn process_name(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|name| name.trim().to_string())
        .filter(|name| !name.is_empty())
}

#[derive(Default)]
pub struct Sessions {
    live: Mutex<HashMap<String, Arc<SessionInfo>>>,
}

impl Sessions {
    pub fn register(&self, session: Arc<SessionInfo>) {
        self.live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(session.id.clone(), session);
    }

    pub fn remove(&self, id: &str) {
        self.live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
    }

    pub fn snapshot(&self) -> Vec<Value> {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        let mut sessions: Vec<&Arc<SessionInfo>> = live.values().collect();
        sessions.sort_by_key(|s| s.started_at);
        sessions.iter().map(|s| s.to_json()).collect()
    }
}

/// Keeps a session in `Sessions` from the moment it is listed until this is dropped
/// (with the last clone of the MCP server that owns it).
pub struct SessionListing {
    sessions: Arc<Sessions>,
    session: Arc<SessionInfo>,
    listed: std::sync::atomic::AtomicBool,
}

impl SessionListing {
    pub fn new(sessions: Arc<Sessions>, session: Arc<SessionInfo>) -> SessionListing {
        SessionListing {
            sessions,
            session,
            listed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    pub fn list(&self) {
        if !self.listed.swap(true, Ordering::AcqRel) {
            self.sessions.register(Arc::clone(&self.session));
        }
    }
}

impl Drop for SessionListing {
    fn drop(&mut self) {
        if self.listed.load(Ordering::Acquire) {
            self.sessions.remove(&self.session.id);
        }
    }
}
