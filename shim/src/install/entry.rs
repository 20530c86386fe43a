//! The `alexandria` server entry as a small ordered list of fields, and the rule for merging
//! it into an entry that is already there.
//!
//! Merge rule: our fields (`type`, `command`, `args`) are set; fields we do not write (`env`,
//! `disabled`, `timeout`, …) are kept, so a user's additions survive a re-install. An existing
//! entry that is not an object, or that describes a remote server (`url`, `httpUrl`,
//! `serverUrl`, or an HTTP/SSE `type`), is replaced whole: mixing a URL with a command would
//! give the client an entry it rejects.

use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldValue {
    Str(String),
    List(Vec<String>),
}

impl FieldValue {
    pub fn to_json(&self) -> Value {
        match self {
            FieldValue::Str(s) => Value::String(s.clone()),
            FieldValue::List(items) => {
                Value::Array(items.iter().map(|s| Value::String(s.clone())).collect())
            }
        }
    }
}

/// An entry in the order its fields should be written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub fields: Vec<(&'static str, FieldValue)>,
}

impl Entry {
    /// The stdio entry: `type` first when the client wants one, then `command` and `args`.
    pub fn stdio(type_field: bool, command: &str, args: &[String]) -> Entry {
        let mut fields = Vec::new();
        if type_field {
            fields.push(("type", FieldValue::Str("stdio".to_string())));
        }
        fields.push(("command", FieldValue::Str(command.to_string())));
        fields.push(("args", FieldValue::List(args.to_vec())));
        Entry { fields }
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
            .fields
            .iter()
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
    if is_remote(object) {
        return Plan::Replace;
    }
    let stale: Vec<&'static str> = entry
        .fields
        .iter()
        .filter(|(key, value)| object.get(*key) != Some(&value.to_json()))
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
        Some(Value::Object(object)) if !is_remote(object) => object.clone(),
        _ => serde_json::Map::new(),
    };
    for (key, value) in &entry.fields {
        object.insert((*key).to_string(), value.to_json());
    }
    Value::Object(object)
}

fn is_remote(object: &serde_json::Map<String, Value>) -> bool {
    const URL_KEYS: [&str; 3] = ["url", "httpUrl", "serverUrl"];
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
        Entry::stdio(true, "/bin/alexandria", &["mcp".into(), "serve".into()])
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
    fn json_text_keeps_field_order_and_escapes() {
        let entry = Entry::stdio(false, "/a \"b\"/alexandria", &["mcp".into()]);
        assert_eq!(
            entry.to_json_text(),
            r#"{"command":"/a \"b\"/alexandria","args":["mcp"]}"#
        );
    }
}
