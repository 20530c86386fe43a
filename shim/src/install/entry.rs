//! The `alexandria` server entry as a small ordered list of fields, and the rule for merging
//! it into an entry that is already there.
//!
//! Merge rule: our fields (`type`, `command`, `args`) are set; fields we do not write
//! (`disabled`, `timeout`, …) are kept, so a user's additions survive a re-install. In `env` we
//! own one variable, `ALEXANDRIA_HOME`: it is set when the home is not the default (clients
//! start servers with a reduced environment, so the user's shell variable never reaches the
//! shim) and removed when it is; the user's other variables stay. An existing
//! entry that is not an object, or that describes a remote server (`url`, `httpUrl`,
//! `serverUrl`, or an HTTP/SSE `type`), is replaced whole: mixing a URL with a command would
//! give the client an entry it rejects.

use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldValue {
    Str(String),
    List(Vec<String>),
    /// Variables we own in the entry's `env` map: `Some` sets one, `None` removes it. Other
    /// variables in the map belong to the user and are kept.
    Env(Vec<(String, Option<String>)>),
}

impl FieldValue {
    pub fn to_json(&self) -> Value {
        match self {
            FieldValue::Str(s) => Value::String(s.clone()),
            FieldValue::List(items) => {
                Value::Array(items.iter().map(|s| Value::String(s.clone())).collect())
            }
            FieldValue::Env(vars) => Value::Object(
                vars.iter()
                    .filter_map(|(k, v)| Some((k.clone(), Value::String(v.clone()?))))
                    .collect(),
            ),
        }
    }

    /// Whether `existing` (the entry's current value for this field) already says this.
    pub fn is_current(&self, existing: Option<&Value>) -> bool {
        match self {
            FieldValue::Env(vars) => vars.iter().all(|(key, value)| {
                let current = existing.and_then(|env| env.get(key));
                match value {
                    Some(value) => current.and_then(Value::as_str) == Some(value.as_str()),
                    None => current.is_none(),
                }
            }),
            _ => existing == Some(&self.to_json()),
        }
    }

    /// An `env` that sets nothing: not written into a new entry.
    pub fn is_empty_env(&self) -> bool {
        matches!(self, FieldValue::Env(vars) if vars.iter().all(|(_, v)| v.is_none()))
    }

    /// `existing` env map with our variables set or removed; `None` when nothing is left.
    pub fn merge_env(
        vars: &[(String, Option<String>)],
        existing: Option<&Value>,
    ) -> Option<serde_json::Map<String, Value>> {
        let mut env = match existing {
            Some(Value::Object(map)) => map.clone(),
            _ => serde_json::Map::new(),
        };
        for (key, value) in vars {
            match value {
                Some(value) => env.insert(key.clone(), Value::String(value.clone())),
                None => env.remove(key),
            };
        }
        (!env.is_empty()).then_some(env)
    }
}

/// The header a URL entry carries its bearer token in.
pub const AUTHORIZATION: &str = "Authorization";

/// The keys under which clients take a server's URL.
pub const URL_KEYS: [&str; 3] = ["url", "httpUrl", "serverUrl"];

/// The environment variable our entries carry when the home is not the default.
pub const HOME_VAR: &str = alexandria_proto::home::HOME_ENV;

/// An entry in the order its fields should be written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub fields: Vec<(&'static str, FieldValue)>,
}

impl Entry {
    /// The stdio entry: `type` first when the client wants one, then `command`, `args` and
    /// `env` (`ALEXANDRIA_HOME` when `home` is given, else that variable removed).
    pub fn stdio(type_field: bool, command: &str, args: &[String], home: Option<&str>) -> Entry {
        let mut fields = Vec::new();
        if type_field {
            fields.push(("type", FieldValue::Str("stdio".to_string())));
        }
        fields.push(("command", FieldValue::Str(command.to_string())));
        fields.push(("args", FieldValue::List(args.to_vec())));
        fields.push((
            "env",
            FieldValue::Env(vec![(HOME_VAR.to_string(), home.map(str::to_string))]),
        ));
        Entry { fields }
    }

    /// A URL entry for the daemon's Streamable HTTP endpoint: `type` (when the client wants
    /// one), the URL under `url_key` (`url`, `httpUrl`, `serverUrl`), and the bearer token in
    /// `headers_key` (`headers`, Codex `http_headers`) when tokens are on, else removed.
    pub fn http(
        type_field: Option<&str>,
        url_key: &'static str,
        url: &str,
        headers_key: &'static str,
        bearer: Option<&str>,
    ) -> Entry {
        let mut fields = Vec::new();
        if let Some(kind) = type_field {
            fields.push(("type", FieldValue::Str(kind.to_string())));
        }
        fields.push((url_key, FieldValue::Str(url.to_string())));
        fields.push((
            headers_key,
            FieldValue::Env(vec![(
                AUTHORIZATION.to_string(),
                bearer.map(|token| format!("Bearer {token}")),
            )]),
        ));
        Entry { fields }
    }

    /// Whether this entry points at a URL rather than a command.
    pub fn is_remote(&self) -> bool {
        self.fields.iter().any(|(key, _)| URL_KEYS.contains(key))
    }

    /// The URL of a remote entry.
    pub fn url(&self) -> Option<&str> {
        self.fields.iter().find_map(|(key, value)| match value {
            FieldValue::Str(url) if URL_KEYS.contains(key) => Some(url.as_str()),
            _ => None,
        })
    }

    /// The home this entry sets, if any.
    pub fn home(&self) -> Option<&str> {
        match self.get("env") {
            Some(FieldValue::Env(vars)) => vars
                .iter()
                .find(|(k, _)| k == HOME_VAR)
                .and_then(|(_, v)| v.as_deref()),
            _ => None,
        }
    }

    /// The fields a new entry is written with (an `env` that sets nothing is left out).
    pub fn new_fields(&self) -> impl Iterator<Item = &(&'static str, FieldValue)> {
        self.fields.iter().filter(|(_, v)| !v.is_empty_env())
    }

    pub fn get(&self, key: &str) -> Option<&FieldValue> {
        self.fields.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    pub fn command(&self) -> &str {
        match self.get("command") {
            Some(FieldValue::Str(s)) => s,
            _ => "",
        }
    }

    pub fn args(&self) -> &[String] {
        match self.get("args") {
            Some(FieldValue::List(items)) => items,
            _ => &[],
        }
    }

    /// Compact JSON with the fields in order (for `claude mcp add-json` and for messages).
    pub fn to_json_text(&self) -> String {
        let parts: Vec<String> = self
            .new_fields()
            .map(|(k, v)| format!("{}:{}", Value::String((*k).to_string()), v.to_json()))
            .collect();
        format!("{{{}}}", parts.join(","))
    }
}

/// What to do with the entry already in a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// No entry yet: insert ours whole.
    Insert,
    /// The entry is not an object or is a remote server: replace it whole.
    Replace,
    /// Set these fields (in entry order); keep the rest.
    Patch(Vec<&'static str>),
    /// Every field we own already has our value.
    Unchanged,
}

/// Compare an existing entry (as JSON) with ours.
pub fn plan(existing: Option<&Value>, entry: &Entry) -> Plan {
    let Some(existing) = existing else {
        return Plan::Insert;
    };
    let Some(object) = existing.as_object() else {
        return Plan::Replace;
    };
    // A command entry and a URL entry do not mix: switching kinds replaces the entry whole.
    if is_remote(object) != entry.is_remote() {
        return Plan::Replace;
    }
    let stale: Vec<&'static str> = entry
        .fields
        .iter()
        .filter(|(key, value)| !value.is_current(object.get(*key)))
        .map(|(key, _)| *key)
        .collect();
    if stale.is_empty() {
        Plan::Unchanged
    } else {
        Plan::Patch(stale)
    }
}

/// The entry after the merge, as JSON (used where we hand a whole entry to someone else).
pub fn merged(existing: Option<&Value>, entry: &Entry) -> Value {
    let mut object = match existing {
        Some(Value::Object(object)) if is_remote(object) == entry.is_remote() => object.clone(),
        _ => serde_json::Map::new(),
    };
    for (key, value) in &entry.fields {
        match value {
            FieldValue::Env(vars) => match FieldValue::merge_env(vars, object.get(*key)) {
                Some(env) => {
                    object.insert((*key).to_string(), Value::Object(env));
                }
                None => {
                    object.remove(*key);
                }
            },
            _ => {
                object.insert((*key).to_string(), value.to_json());
            }
        }
    }
    Value::Object(object)
}

fn is_remote(object: &serde_json::Map<String, Value>) -> bool {
    const REMOTE_TYPES: [&str; 3] = ["http", "sse", "streamable-http"];
    URL_KEYS.iter().any(|key| object.contains_key(*key))
        || object
            .get("type")
            .and_then(Value::as_str)
            .is_some_and(|t| REMOTE_TYPES.contains(&t))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ours() -> Entry {
        Entry::stdio(
            true,
            "/bin/alexandria",
            &["mcp".into(), "serve".into()],
            None,
        )
    }

    fn homed(home: &str) -> Entry {
        Entry::stdio(
            true,
            "/bin/alexandria",
            &["mcp".into(), "serve".into()],
            Some(home),
        )
    }

    #[test]
    fn plans() {
        let cases: Vec<(Option<Value>, Plan)> = vec![
            (None, Plan::Insert),
            (Some(json!("x")), Plan::Replace),
            (Some(json!({"url": "http://x"})), Plan::Replace),
            (Some(json!({"type": "http", "command": "x"})), Plan::Replace),
            (
                Some(
                    json!({"type": "stdio", "command": "/bin/alexandria", "args": ["mcp", "serve"]}),
                ),
                Plan::Unchanged,
            ),
            (
                Some(
                    json!({"env": {"A": "1"}, "args": ["mcp", "serve"], "command": "/bin/alexandria", "type": "stdio"}),
                ),
                Plan::Unchanged,
            ),
            (
                Some(json!({"command": "/old/alexandria", "args": ["mcp", "serve"]})),
                Plan::Patch(vec!["type", "command"]),
            ),
            (
                Some(
                    json!({"type": "stdio", "command": "/bin/alexandria", "args": ["mcp", "serve", "--workspace", "w"]}),
                ),
                Plan::Patch(vec!["args"]),
            ),
        ];
        for (existing, expected) in cases {
            assert_eq!(plan(existing.as_ref(), &ours()), expected, "{existing:?}");
        }
    }

    #[test]
    fn merge_keeps_user_fields_and_drops_remote_ones() {
        let kept = merged(Some(&json!({"env": {"A": "1"}, "command": "old"})), &ours());
        assert_eq!(
            kept,
            json!({"env": {"A": "1"}, "type": "stdio", "command": "/bin/alexandria", "args": ["mcp", "serve"]})
        );
        let replaced = merged(Some(&json!({"url": "http://x", "headers": {}})), &ours());
        assert_eq!(
            replaced,
            json!({"type": "stdio", "command": "/bin/alexandria", "args": ["mcp", "serve"]})
        );
    }

    #[test]
    fn env_carries_the_home_and_keeps_the_users_variables() {
        let base = json!({"type": "stdio", "command": "/bin/alexandria", "args": ["mcp", "serve"]});
        let with = |env: Value| {
            let mut entry = base.clone();
            entry["env"] = env;
            entry
        };
        let cases: Vec<(Value, Entry, Plan, Value)> = vec![
            (
                base.clone(),
                homed("/w/h"),
                Plan::Patch(vec!["env"]),
                with(json!({"ALEXANDRIA_HOME": "/w/h"})),
            ),
            (
                with(json!({"A": "1"})),
                homed("/w/h"),
                Plan::Patch(vec!["env"]),
                with(json!({"A": "1", "ALEXANDRIA_HOME": "/w/h"})),
            ),
            (
                with(json!({"ALEXANDRIA_HOME": "/w/h"})),
                homed("/w/h"),
                Plan::Unchanged,
                with(json!({"ALEXANDRIA_HOME": "/w/h"})),
            ),
            (
                with(json!({"ALEXANDRIA_HOME": "/old", "A": "1"})),
                ours(),
                Plan::Patch(vec!["env"]),
                with(json!({"A": "1"})),
            ),
            (
                with(json!({"ALEXANDRIA_HOME": "/old"})),
                ours(),
                Plan::Patch(vec!["env"]),
                base.clone(),
            ),
        ];
        for (existing, entry, expected_plan, expected_merge) in cases {
            assert_eq!(plan(Some(&existing), &entry), expected_plan, "{existing}");
            assert_eq!(
                merged(Some(&existing), &entry),
                expected_merge,
                "{existing}"
            );
        }
        assert_eq!(
            homed("/w/h").to_json_text(),
            r#"{"type":"stdio","command":"/bin/alexandria","args":["mcp","serve"],"env":{"ALEXANDRIA_HOME":"/w/h"}}"#
        );
        assert_eq!(homed("/w/h").home(), Some("/w/h"));
        assert_eq!(ours().home(), None);
    }

    #[test]
    fn url_entries_replace_command_entries_and_back() {
        let http = Entry::http(
            Some("http"),
            "url",
            "http://127.0.0.1:7/mcp",
            "headers",
            Some("t"),
        );
        let stdio = json!({"type": "stdio", "command": "/bin/alexandria", "args": ["mcp", "serve"], "env": {"A": "1"}});
        assert_eq!(plan(Some(&stdio), &http), Plan::Replace);
        assert_eq!(
            merged(Some(&stdio), &http),
            json!({"type": "http", "url": "http://127.0.0.1:7/mcp", "headers": {"Authorization": "Bearer t"}})
        );
        let current = merged(None, &http);
        assert_eq!(plan(Some(&current), &http), Plan::Unchanged);
        // Tokens turned off: the header goes, other headers stay.
        let untokened = Entry::http(
            Some("http"),
            "url",
            "http://127.0.0.1:7/mcp",
            "headers",
            None,
        );
        let with_other = json!({"type": "http", "url": "http://127.0.0.1:7/mcp", "headers": {"Authorization": "Bearer t", "X": "1"}});
        assert_eq!(
            plan(Some(&with_other), &untokened),
            Plan::Patch(vec!["headers"])
        );
        assert_eq!(
            merged(Some(&with_other), &untokened),
            json!({"type": "http", "url": "http://127.0.0.1:7/mcp", "headers": {"X": "1"}})
        );
        assert_eq!(plan(Some(&current), &ours()), Plan::Replace);
        assert!(http.is_remote() && !ours().is_remote());
        assert_eq!(http.url(), Some("http://127.0.0.1:7/mcp"));
    }

    #[test]
    fn json_text_keeps_field_order_and_escapes() {
        let entry = Entry::stdio(false, "/a \"b\"/alexandria", &["mcp".into()], None);
        assert_eq!(
            entry.to_json_text(),
            r#"{"command":"/a \"b\"/alexandria","args":["mcp"]}"#
        );
    }
}
