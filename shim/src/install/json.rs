//! Insert, update or remove one server entry in a JSON or JSONC config file, changing only
//! that entry.
//!
//! Editing goes through `jsonc-parser`'s concrete syntax tree, which keeps every comment,
//! blank line, key order and the file's indentation and newline style; only the nodes we set
//! are re-rendered. Files that the client reads as strict JSON are first checked with
//! `serde_json`, so we refuse a file the client itself would reject instead of "fixing" it.

use jsonc_parser::ParseOptions;
use jsonc_parser::cst::{CstInputValue, CstNode, CstObject, CstRootNode};
use serde_json::Value;

use super::entry::{self, Entry, FieldValue, Plan};
use super::{Change, Edit, EditError};

/// How the client parses the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// Plain JSON (Claude Code, Claude Desktop, Cursor, Windsurf).
    Json,
    /// JSON with comments and trailing commas (VS Code, Zed, Gemini CLI).
    Jsonc,
}

impl Dialect {
    pub fn name(self) -> &'static str {
        match self {
            Dialect::Json => "JSON",
            Dialect::Jsonc => "JSON with comments",
        }
    }
}

/// Where the entry goes: `{ <servers_key>: { <name>: entry } }`.
#[derive(Debug, Clone, Copy)]
pub struct JsonTarget<'a> {
    pub dialect: Dialect,
    pub servers_key: &'a str,
    pub name: &'a str,
}

/// The current value of our entry, if the file has one (used to decide and to report).
pub fn current_entry(text: Option<&str>, target: JsonTarget) -> Result<Option<Value>, EditError> {
    let Some(root) = parse(text, target.dialect)? else {
        return Ok(None);
    };
    let Some(servers) = servers_object(&root, target, false)? else {
        return Ok(None);
    };
    Ok(servers
        .get(target.name)
        .and_then(|prop| prop.value())
        .and_then(|value| value.to_serde_value()))
}

/// Insert or update our entry.
pub fn upsert(text: Option<&str>, target: JsonTarget, entry: &Entry) -> Result<Edit, EditError> {
    let root = match parse(text, target.dialect)? {
        Some(root) => root,
        None => empty_document(),
    };
    let Some(servers) = servers_object(&root, target, true)? else {
        unreachable!("servers_object creates the object when asked to")
    };
    let existing = servers.get(target.name);
    let existing_value = existing
        .as_ref()
        .and_then(|prop| prop.value())
        .and_then(|value| value.to_serde_value());
    let change = match (entry::plan(existing_value.as_ref(), entry), existing) {
        (Plan::Unchanged, _) => return Ok(Edit::Unchanged),
        (Plan::Insert, _) | (_, None) => {
            servers.append(target.name, input_entry(entry));
            Change::Added
        }
        (Plan::Replace, Some(prop)) => {
            prop.set_value(input_entry(entry));
            Change::Updated
        }
        (Plan::Patch(keys), Some(prop)) => {
            let Some(object) = prop.object_value() else {
                unreachable!("a patch is only planned for an object entry")
            };
            for key in keys {
                let Some(value) = entry.get(key) else {
                    continue;
                };
                if let FieldValue::Env(vars) = value {
                    patch_env(&object, key, vars);
                    continue;
                }
                match object.get(key) {
                    Some(field) => field.set_value(input_field(value)),
                    None => {
                        object.append(key, input_field(value));
                    }
                }
            }
            Change::Updated
        }
    };
    Ok(Edit::Changed {
        change,
        text: finish(&root, text),
    })
}

/// Remove our entry; the (possibly empty) servers object stays.
pub fn remove(text: Option<&str>, target: JsonTarget) -> Result<Edit, EditError> {
    let Some(root) = parse(text, target.dialect)? else {
        return Ok(Edit::Unchanged);
    };
    let Some(servers) = servers_object(&root, target, false)? else {
        return Ok(Edit::Unchanged);
    };
    let Some(prop) = servers.get(target.name) else {
        return Ok(Edit::Unchanged);
    };
    prop.remove();
    Ok(Edit::Changed {
        change: Change::Removed,
        text: finish(&root, text),
    })
}

/// Parse a file; `None` when there is no file or it holds only whitespace.
fn parse(text: Option<&str>, dialect: Dialect) -> Result<Option<CstRootNode>, EditError> {
    let Some(text) = text.filter(|t| !t.trim().is_empty()) else {
        return Ok(None);
    };
    let invalid = |message: String| EditError::Invalid {
        format: dialect.name(),
        message,
    };
    if dialect == Dialect::Json {
        serde_json::from_str::<serde::de::IgnoredAny>(text).map_err(|e| invalid(e.to_string()))?;
    }
    let options = ParseOptions {
        allow_comments: dialect == Dialect::Jsonc,
        allow_trailing_commas: dialect == Dialect::Jsonc,
        allow_loose_object_property_names: false,
        allow_missing_commas: false,
        allow_single_quoted_strings: false,
        allow_hexadecimal_numbers: false,
        allow_unary_plus_numbers: false,
        allow_bare_decimal_point_numbers: false,
        allow_non_finite_numbers: false,
        allow_extended_string_escapes: false,
    };
    let root = CstRootNode::parse(text, &options).map_err(|e| invalid(e.to_string()))?;
    Ok(Some(root))
}

fn empty_document() -> CstRootNode {
    CstRootNode::parse("{}\n", &ParseOptions::default()).expect("an empty object parses")
}

/// The object under `servers_key`, created (when `create`) if the key is missing.
fn servers_object(
    root: &CstRootNode,
    target: JsonTarget,
    create: bool,
) -> Result<Option<CstObject>, EditError> {
    let top = match root.value() {
        None if create => root.object_value_or_set(),
        None => return Ok(None),
        Some(value) => value.as_object().ok_or_else(|| EditError::WrongType {
            at: "the top level".to_string(),
            expected: "an object",
            found: kind(&value),
        })?,
    };
    match top.get(target.servers_key) {
        None if create => Ok(Some(
            top.append(target.servers_key, CstInputValue::Object(Vec::new()))
                .object_value()
                .expect("the object just inserted"),
        )),
        None => Ok(None),
        Some(prop) => {
            let value = prop.value().ok_or_else(|| EditError::Invalid {
                format: target.dialect.name(),
                message: format!("\"{}\" has no value", target.servers_key),
            })?;
            let object = value.as_object().ok_or_else(|| EditError::WrongType {
                at: format!("\"{}\"", target.servers_key),
                expected: "an object of servers",
                found: kind(&value),
            })?;
            Ok(Some(object))
        }
    }
}

/// The edited text, with a final newline if the file had one or is new.
fn finish(root: &CstRootNode, original: Option<&str>) -> String {
    let mut text = root.to_string();
    let wants_newline = original.is_none_or(|t| t.trim().is_empty() || t.ends_with('\n'));
    if wants_newline && !text.ends_with('\n') {
        text.push('\n');
    }
    text
}

fn kind(node: &CstNode) -> &'static str {
    match node {
        _ if node.as_array().is_some() => "an array",
        _ if node.as_object().is_some() => "an object",
        _ if node.as_string_lit().is_some() => "a string",
        _ if node.as_number_lit().is_some() => "a number",
        _ if node.as_boolean_lit().is_some() => "a boolean",
        _ if node.as_null_keyword().is_some() => "null",
        _ => "something else",
    }
}

/// Set or remove our variables in the entry's `env` object, keeping the user's; an `env` left
/// empty by a removal goes too.
fn patch_env(object: &CstObject, key: &str, vars: &[(String, Option<String>)]) {
    let env = object.get(key);
    let Some(env_object) = env.as_ref().and_then(|prop| prop.object_value()) else {
        // No env yet (or one that is not an object): write ours whole.
        let value = FieldValue::Env(vars.to_vec());
        match env {
            Some(prop) => prop.set_value(input_field(&value)),
            None => {
                object.append(key, input_field(&value));
            }
        }
        return;
    };
    for (name, value) in vars {
        match (value, env_object.get(name)) {
            (Some(value), Some(prop)) => prop.set_value(CstInputValue::String(value.clone())),
            (Some(value), None) => {
                env_object.append(name, CstInputValue::String(value.clone()));
            }
            (None, Some(prop)) => prop.remove(),
            (None, None) => {}
        }
    }
    if env_object.properties().is_empty()
        && let Some(prop) = env
    {
        prop.remove();
    }
}

fn input_field(value: &FieldValue) -> CstInputValue {
    match value {
        FieldValue::Str(s) => CstInputValue::String(s.clone()),
        FieldValue::List(items) => CstInputValue::Array(
            items
                .iter()
                .map(|s| CstInputValue::String(s.clone()))
                .collect(),
        ),
        FieldValue::Env(vars) => CstInputValue::Object(
            vars.iter()
                .filter_map(|(k, v)| Some((k.clone(), CstInputValue::String(v.clone()?))))
                .collect(),
        ),
    }
}

fn input_entry(entry: &Entry) -> CstInputValue {
    CstInputValue::Object(
        entry
            .new_fields()
            .map(|(k, v)| ((*k).to_string(), input_field(v)))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const MCP: JsonTarget = JsonTarget {
        dialect: Dialect::Json,
        servers_key: "mcpServers",
        name: "alexandria",
    };
    const MCPC: JsonTarget = JsonTarget {
        dialect: Dialect::Jsonc,
        servers_key: "mcpServers",
        name: "alexandria",
    };

    fn entry() -> Entry {
        Entry::stdio(
            false,
            "/bin/alexandria",
            &["mcp".into(), "serve".into()],
            None,
        )
    }

    fn changed(edit: Edit) -> (Change, String) {
        match edit {
            Edit::Changed { change, text } => (change, text),
            Edit::Unchanged => panic!("expected a change"),
        }
    }

    #[test]
    fn upserts() {
        // (name, target, input, expected change, expected output)
        let cases: Vec<(&str, JsonTarget, Option<&str>, Change, &str)> = vec![
            (
                "no file",
                MCP,
                None,
                Change::Added,
                "{\n  \"mcpServers\": {\n    \"alexandria\": {\n      \"command\": \"/bin/alexandria\",\n      \"args\": [\"mcp\", \"serve\"]\n    }\n  }\n}\n",
            ),
            (
                "empty file",
                MCP,
                Some("\n"),
                Change::Added,
                "{\n  \"mcpServers\": {\n    \"alexandria\": {\n      \"command\": \"/bin/alexandria\",\n      \"args\": [\"mcp\", \"serve\"]\n    }\n  }\n}\n",
            ),
            (
                "next to another server, 4-space indent",
                MCP,
                Some(
                    "{\n    \"theme\": \"dark\",\n    \"mcpServers\": {\n        \"other\": {\"command\": \"x\"}\n    },\n    \"z\": 1\n}\n",
                ),
                Change::Added,
                "{\n    \"theme\": \"dark\",\n    \"mcpServers\": {\n        \"other\": {\"command\": \"x\"},\n        \"alexandria\": {\n            \"command\": \"/bin/alexandria\",\n            \"args\": [\"mcp\", \"serve\"]\n        }\n    },\n    \"z\": 1\n}\n",
            ),
            (
                "comments survive in JSONC",
                MCPC,
                Some(
                    "// settings\n{\n  /* servers */\n  \"mcpServers\": {\n    \"other\": {}, // keep\n  },\n}\n",
                ),
                Change::Added,
                "// settings\n{\n  /* servers */\n  \"mcpServers\": {\n    \"other\": {}, // keep\n    \"alexandria\": {\n      \"command\": \"/bin/alexandria\",\n      \"args\": [\"mcp\", \"serve\"],\n    },\n  },\n}\n",
            ),
            (
                "stale command is patched, env kept",
                MCP,
                Some(
                    "{\"mcpServers\": {\"alexandria\": {\"command\": \"/old\", \"env\": {\"A\": \"1\"}, \"args\": [\"mcp\", \"serve\"]}}}",
                ),
                Change::Updated,
                "{\"mcpServers\": {\"alexandria\": {\"command\": \"/bin/alexandria\", \"env\": {\"A\": \"1\"}, \"args\": [\"mcp\", \"serve\"]}}}",
            ),
        ];
        for (name, target, input, expected_change, expected) in cases {
            check_upsert(name, target, input, &entry(), expected_change, expected);
        }
    }

    fn check_upsert(
        name: &str,
        target: JsonTarget,
        input: Option<&str>,
        entry: &Entry,
        expected_change: Change,
        expected: &str,
    ) {
        let (change, text) = changed(upsert(input, target, entry).expect(name));
        assert_eq!(change, expected_change, "{name}");
        assert_eq!(text, expected, "{name}");
        // Re-running on the output changes nothing.
        assert_eq!(
            upsert(Some(&text), target, entry),
            Ok(Edit::Unchanged),
            "{name}: second run"
        );
    }

    #[test]
    fn the_home_goes_into_env() {
        let homed = Entry::stdio(
            false,
            "/bin/alexandria",
            &["mcp".into(), "serve".into()],
            Some("/w/h"),
        );
        let cases: Vec<(&str, Option<&str>, &Entry, Change, &str)> = vec![
            (
                "new entry",
                None,
                &homed,
                Change::Added,
                "{\n  \"mcpServers\": {\n    \"alexandria\": {\n      \"command\": \"/bin/alexandria\",\n      \"args\": [\"mcp\", \"serve\"],\n      \"env\": {\n        \"ALEXANDRIA_HOME\": \"/w/h\"\n      }\n    }\n  }\n}\n",
            ),
            (
                "user env kept",
                Some(
                    "{\"mcpServers\": {\"alexandria\": {\"command\": \"/bin/alexandria\", \"args\": [\"mcp\", \"serve\"], \"env\": {\"A\": \"1\"}}}}",
                ),
                &homed,
                Change::Updated,
                // jsonc-parser lays out an object it appends to over several lines
                "{\"mcpServers\": {\"alexandria\": {\"command\": \"/bin/alexandria\", \"args\": [\"mcp\", \"serve\"], \"env\": {\n        \"A\": \"1\",\n        \"ALEXANDRIA_HOME\": \"/w/h\"\n      }}}}",
            ),
            (
                "stale home replaced",
                Some(
                    "{\"mcpServers\": {\"alexandria\": {\"command\": \"/bin/alexandria\", \"args\": [\"mcp\", \"serve\"], \"env\": {\"ALEXANDRIA_HOME\": \"/old\"}}}}",
                ),
                &homed,
                Change::Updated,
                "{\"mcpServers\": {\"alexandria\": {\"command\": \"/bin/alexandria\", \"args\": [\"mcp\", \"serve\"], \"env\": {\"ALEXANDRIA_HOME\": \"/w/h\"}}}}",
            ),
        ];
        for (name, input, entry, expected_change, expected) in cases {
            check_upsert(name, MCP, input, entry, expected_change, expected);
        }
        // Back to the default home: our variable goes, and with it an env left empty.
        let (_, text) = changed(
            upsert(
                Some(
                    "{\"mcpServers\": {\"alexandria\": {\"command\": \"/bin/alexandria\", \"args\": [\"mcp\", \"serve\"], \"env\": {\"ALEXANDRIA_HOME\": \"/old\"}}}}",
                ),
                MCP,
                &entry(),
            )
            .expect("edit"),
        );
        let value: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(
            value["mcpServers"]["alexandria"],
            serde_json::json!({"command": "/bin/alexandria", "args": ["mcp", "serve"]}),
            "{text}"
        );
    }

    #[test]
    fn crlf_files_stay_crlf() {
        let input = "{\r\n  \"mcpServers\": {\r\n    \"other\": {}\r\n  }\r\n}\r\n";
        let (_, text) = changed(upsert(Some(input), MCP, &entry()).expect("edit"));
        assert!(!text.replace("\r\n", "").contains('\n'), "{text:?}");
    }

    #[test]
    fn refusals() {
        let cases: Vec<(&str, JsonTarget, &str, &str)> = vec![
            (
                "truncated",
                MCP,
                "{\"mcpServers\": {",
                "it is not valid JSON",
            ),
            (
                "comment in strict JSON",
                MCP,
                "// hi\n{}",
                "it is not valid JSON",
            ),
            (
                "trailing comma in strict JSON",
                MCP,
                "{\"a\": 1,}",
                "it is not valid JSON",
            ),
            (
                "array at the top",
                MCP,
                "[]",
                "the top level should be an object, but it is an array",
            ),
            (
                "servers is an array",
                MCPC,
                "{\"mcpServers\": []}",
                "\"mcpServers\" should be an object of servers, but it is an array",
            ),
            (
                "servers is null",
                MCP,
                "{\"mcpServers\": null}",
                "\"mcpServers\" should be an object of servers, but it is null",
            ),
        ];
        for (name, target, input, expected) in cases {
            let error = upsert(Some(input), target, &entry()).expect_err(name);
            assert!(error.to_string().starts_with(expected), "{name}: {error}");
            assert!(remove(Some(input), target).is_err(), "{name}: remove");
        }
    }

    #[test]
    fn removes() {
        let cases: Vec<(&str, Option<&str>, Option<&str>)> = vec![
            ("no file", None, None),
            ("no servers", Some("{\"a\": 1}\n"), None),
            (
                "other server only",
                Some("{\"mcpServers\": {\"x\": {}}}\n"),
                None,
            ),
            (
                "ours among others",
                Some(
                    "{\n  \"mcpServers\": {\n    \"x\": {},\n    \"alexandria\": {\"command\": \"c\"}\n  }\n}\n",
                ),
                Some("{\n  \"mcpServers\": {\n    \"x\": {}\n  }\n}\n"),
            ),
            (
                "ours alone",
                Some("{\"mcpServers\": {\"alexandria\": {}}, \"b\": 2}"),
                Some("{\"mcpServers\": {}, \"b\": 2}"),
            ),
        ];
        for (name, input, expected) in cases {
            let edit = remove(input, MCP).expect(name);
            match expected {
                None => assert_eq!(edit, Edit::Unchanged, "{name}"),
                Some(expected) => {
                    assert_eq!(
                        changed(edit),
                        (Change::Removed, expected.to_string()),
                        "{name}"
                    )
                }
            }
        }
    }

    #[test]
    fn reads_current_entry() {
        let text = "{\"mcpServers\": {\"alexandria\": {\"command\": \"c\"}}}";
        assert_eq!(
            current_entry(Some(text), MCP),
            Ok(Some(serde_json::json!({"command": "c"})))
        );
        assert_eq!(current_entry(Some("{}"), MCP), Ok(None));
        assert_eq!(current_entry(None, MCP), Ok(None));
    }
}
