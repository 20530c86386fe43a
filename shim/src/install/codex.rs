//! Insert, update or remove `[mcp_servers.alexandria]` in a Codex `config.toml`, keeping
//! comments, key order and formatting (`toml_edit`).
//!
//! Codex wants one table per server under `mcp_servers` (not an array of tables). An existing
//! entry keeps the keys we do not own (`env`, `startup_timeout_sec`, `enabled`, …).

use toml_edit::{Array, DocumentMut, InlineTable, Item, Table, TableLike, Value};

use super::entry::{Entry, FieldValue};
use super::{Change, Edit, EditError};

const SERVERS_KEY: &str = "mcp_servers";
const REMOTE_KEYS: [&str; 2] = ["url", "bearer_token_env_var"];

/// Insert or update `[mcp_servers.<name>]`.
pub fn upsert(text: Option<&str>, name: &str, entry: &Entry) -> Result<Edit, EditError> {
    let mut document = parse(text)?;
    let servers = servers_table(&mut document, true)?.expect("created when missing");
    let change = match servers.get_mut(name) {
        None => {
            servers.insert(name, Item::Table(new_table(entry)));
            Change::Added
        }
        Some(item) => match item.as_table_like_mut() {
            Some(existing)
                if REMOTE_KEYS.iter().any(|k| existing.contains_key(k)) == entry.is_remote() =>
            {
                let mut changed = false;
                for (key, value) in &entry.fields {
                    if let FieldValue::Env(vars) = value {
                        changed |= patch_env(existing, key, vars);
                        continue;
                    }
                    if existing.get(key).and_then(Item::as_value).map(field_of)
                        != Some(Some(value.clone()))
                    {
                        existing.insert(key, Item::Value(toml_value(value)));
                        changed = true;
                    }
                }
                if !changed {
                    return Ok(Edit::Unchanged);
                }
                Change::Updated
            }
            _ => {
                let decor = item.as_table().map(|t| t.decor().clone());
                let mut table = new_table(entry);
                if let Some(decor) = decor {
                    *table.decor_mut() = decor;
                }
                *item = Item::Table(table);
                Change::Updated
            }
        },
    };
    Ok(Edit::Changed {
        change,
        text: document.to_string(),
    })
}

/// Our entry as JSON (`command`, `args`, `env`, …) for checks such as `alexandria doctor`.
pub fn current_entry(
    text: Option<&str>,
    name: &str,
) -> Result<Option<serde_json::Value>, EditError> {
    let mut document = parse(text)?;
    let Some(servers) = servers_table(&mut document, false)? else {
        return Ok(None);
    };
    Ok(servers.get(name).map(item_json))
}

fn item_json(item: &Item) -> serde_json::Value {
    use serde_json::Value as Json;
    if let Some(table) = item.as_table_like() {
        return Json::Object(
            table
                .iter()
                .map(|(k, v)| (k.to_string(), item_json(v)))
                .collect(),
        );
    }
    match item.as_value() {
        Some(Value::String(s)) => Json::String(s.value().clone()),
        Some(Value::Boolean(b)) => Json::Bool(*b.value()),
        Some(Value::Integer(i)) => Json::from(*i.value()),
        Some(Value::Array(array)) => Json::Array(
            array
                .iter()
                .map(|v| item_json(&Item::Value(v.clone())))
                .collect(),
        ),
        _ => Json::Null,
    }
}

/// Remove `[mcp_servers.<name>]`.
pub fn remove(text: Option<&str>, name: &str) -> Result<Edit, EditError> {
    let mut document = parse(text)?;
    let Some(servers) = servers_table(&mut document, false)? else {
        return Ok(Edit::Unchanged);
    };
    if servers.remove(name).is_none() {
        return Ok(Edit::Unchanged);
    }
    Ok(Edit::Changed {
        change: Change::Removed,
        text: document.to_string(),
    })
}

fn parse(text: Option<&str>) -> Result<DocumentMut, EditError> {
    text.unwrap_or("")
        .parse::<DocumentMut>()
        .map_err(|e| EditError::Invalid {
            format: "TOML",
            message: e.to_string().trim().replace('\n', " "),
        })
}

fn servers_table(
    document: &mut DocumentMut,
    create: bool,
) -> Result<Option<&mut dyn TableLike>, EditError> {
    if !document.contains_key(SERVERS_KEY) {
        if !create {
            return Ok(None);
        }
        let mut table = Table::new();
        table.set_implicit(true);
        document.insert(SERVERS_KEY, Item::Table(table));
    }
    let item = document
        .get_mut(SERVERS_KEY)
        .expect("mcp_servers exists: checked or inserted above");
    let found = match item {
        Item::ArrayOfTables(_) => "an array of tables ([[mcp_servers]])",
        Item::Value(Value::InlineTable(_)) | Item::Table(_) => {
            return Ok(item.as_table_like_mut());
        }
        Item::Value(_) => "a plain value",
        Item::None => "empty",
    };
    Err(EditError::WrongType {
        at: "mcp_servers".to_string(),
        expected: "a table of servers ([mcp_servers.<name>])",
        found,
    })
}

/// Set or remove our variables in the server's `env` (inline `env = { … }` or an
/// `[mcp_servers.x.env]` table), keeping the user's. Returns whether anything changed.
fn patch_env(server: &mut dyn TableLike, key: &str, vars: &[(String, Option<String>)]) -> bool {
    let value = FieldValue::Env(vars.to_vec());
    let Some(env) = server.get_mut(key).and_then(Item::as_table_like_mut) else {
        if value.is_empty_env() {
            return false;
        }
        server.insert(key, Item::Value(toml_value(&value)));
        return true;
    };
    let mut changed = false;
    for (name, wanted) in vars {
        let current = env.get(name).and_then(Item::as_str).map(str::to_string);
        match wanted {
            Some(wanted) if current.as_deref() != Some(wanted.as_str()) => {
                env.insert(name, Item::Value(Value::from(wanted.as_str())));
                changed = true;
            }
            None if env.contains_key(name) => {
                env.remove(name);
                changed = true;
            }
            _ => {}
        }
    }
    if changed && env.is_empty() {
        server.remove(key);
    }
    changed
}

fn new_table(entry: &Entry) -> Table {
    let mut table = Table::new();
    for (key, value) in entry.new_fields() {
        table.insert(key, Item::Value(toml_value(value)));
    }
    table
}

fn toml_value(value: &FieldValue) -> Value {
    match value {
        FieldValue::Str(s) => Value::from(s.as_str()),
        FieldValue::List(items) => {
            Value::Array(items.iter().map(String::as_str).collect::<Array>())
        }
        FieldValue::Env(vars) => Value::InlineTable(
            vars.iter()
                .filter_map(|(k, v)| Some((k.as_str(), Value::from(v.as_deref()?))))
                .collect::<InlineTable>(),
        ),
    }
}

fn field_of(value: &Value) -> Option<FieldValue> {
    match value {
        Value::String(s) => Some(FieldValue::Str(s.value().clone())),
        Value::Array(array) => array
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .map(FieldValue::List),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(command: &str) -> Entry {
        Entry::stdio(false, command, &["mcp".into(), "serve".into()], None)
    }

    fn text_of(edit: Edit) -> String {
        match edit {
            Edit::Changed { text, .. } => text,
            Edit::Unchanged => panic!("expected a change"),
        }
    }

    #[test]
    fn upserts() {
        let cases: Vec<(&str, Option<&str>, &str)> = vec![
            (
                "no file",
                None,
                "[mcp_servers.alexandria]\ncommand = \"/bin/alexandria\"\nargs = [\"mcp\", \"serve\"]\n",
            ),
            (
                "keeps comments and other servers",
                Some(
                    "# my codex config\nmodel = \"o3\" # inline\n\n[mcp_servers.other]\ncommand = \"other\"\n\n[profiles.x]\nmodel = \"y\"\n",
                ),
                // toml_edit places the new table after its sibling server tables.
                "# my codex config\nmodel = \"o3\" # inline\n\n[mcp_servers.other]\ncommand = \"other\"\n\n[mcp_servers.alexandria]\ncommand = \"/bin/alexandria\"\nargs = [\"mcp\", \"serve\"]\n\n[profiles.x]\nmodel = \"y\"\n",
            ),
            (
                "updates the command, keeps env and position",
                Some(
                    "[mcp_servers.alexandria]\ncommand = \"/old\"\nargs = [\"mcp\", \"serve\"]\nenv = { A = \"1\" }\n\n[other]\nx = 1\n",
                ),
                "[mcp_servers.alexandria]\ncommand = \"/bin/alexandria\"\nargs = [\"mcp\", \"serve\"]\nenv = { A = \"1\" }\n\n[other]\nx = 1\n",
            ),
            (
                "inline servers table",
                Some("mcp_servers = { other = { command = \"o\" } }\n"),
                "mcp_servers = { other = { command = \"o\" } , alexandria = { command = \"/bin/alexandria\", args = [\"mcp\", \"serve\"] } }\n",
            ),
            (
                "remote entry is replaced",
                Some("[mcp_servers.alexandria]\nurl = \"http://x\"\n"),
                "[mcp_servers.alexandria]\ncommand = \"/bin/alexandria\"\nargs = [\"mcp\", \"serve\"]\n",
            ),
        ];
        for (name, input, expected) in cases {
            let text = text_of(upsert(input, "alexandria", &entry("/bin/alexandria")).expect(name));
            assert_eq!(text, expected, "{name}");
            assert_eq!(
                upsert(Some(&text), "alexandria", &entry("/bin/alexandria")),
                Ok(Edit::Unchanged),
                "{name}: second run"
            );
        }
    }

    #[test]
    fn the_home_goes_into_env() {
        let homed = Entry::stdio(
            false,
            "/bin/alexandria",
            &["mcp".into(), "serve".into()],
            Some("/w/h"),
        );
        let cases: Vec<(&str, Option<&str>, &str)> = vec![
            (
                "no file",
                None,
                "[mcp_servers.alexandria]\ncommand = \"/bin/alexandria\"\nargs = [\"mcp\", \"serve\"]\nenv = { ALEXANDRIA_HOME = \"/w/h\" }\n",
            ),
            (
                "env table keeps the user's variables",
                Some(
                    "[mcp_servers.alexandria]\ncommand = \"/bin/alexandria\"\nargs = [\"mcp\", \"serve\"]\n\n[mcp_servers.alexandria.env]\nA = \"1\"\n",
                ),
                "[mcp_servers.alexandria]\ncommand = \"/bin/alexandria\"\nargs = [\"mcp\", \"serve\"]\n\n[mcp_servers.alexandria.env]\nA = \"1\"\nALEXANDRIA_HOME = \"/w/h\"\n",
            ),
        ];
        for (name, input, expected) in cases {
            let text = text_of(upsert(input, "alexandria", &homed).expect(name));
            assert_eq!(text, expected, "{name}");
            assert_eq!(
                upsert(Some(&text), "alexandria", &homed),
                Ok(Edit::Unchanged),
                "{name}: second run"
            );
        }
        // Back to the default home: the variable and the emptied env go.
        let text = text_of(
            upsert(
                Some("[mcp_servers.alexandria]\ncommand = \"/bin/alexandria\"\nargs = [\"mcp\", \"serve\"]\nenv = { ALEXANDRIA_HOME = \"/old\" }\n"),
                "alexandria",
                &entry("/bin/alexandria"),
            )
            .expect("edit"),
        );
        assert_eq!(
            text,
            "[mcp_servers.alexandria]\ncommand = \"/bin/alexandria\"\nargs = [\"mcp\", \"serve\"]\n"
        );
    }

    #[test]
    fn refusals() {
        let cases: Vec<(&str, &str)> = vec![
            ("model = ", "it is not valid TOML"),
            (
                "[[mcp_servers]]\nname = \"x\"\n",
                "mcp_servers should be a table of servers ([mcp_servers.<name>]), but it is an array of tables",
            ),
            (
                "mcp_servers = 3\n",
                "mcp_servers should be a table of servers",
            ),
        ];
        for (input, expected) in cases {
            let error = upsert(Some(input), "alexandria", &entry("/x")).expect_err(input);
            assert!(error.to_string().starts_with(expected), "{input}: {error}");
            assert!(
                remove(Some(input), "alexandria").is_err(),
                "{input}: remove"
            );
        }
    }

    #[test]
    fn removes() {
        let cases: Vec<(Option<&str>, Option<&str>)> = vec![
            (None, None),
            (Some("model = \"o3\"\n"), None),
            (
                Some(
                    "model = \"o3\"\n\n[mcp_servers.alexandria]\ncommand = \"c\"\n\n[mcp_servers.other]\ncommand = \"o\"\n",
                ),
                Some("model = \"o3\"\n\n[mcp_servers.other]\ncommand = \"o\"\n"),
            ),
            // A comment right above our table belongs to it and goes with it.
            (
                Some("# about alexandria\n[mcp_servers.alexandria]\ncommand = \"c\"\n"),
                Some(""),
            ),
        ];
        for (input, expected) in cases {
            let edit = remove(input, "alexandria").expect("remove");
            match expected {
                None => assert_eq!(edit, Edit::Unchanged, "{input:?}"),
                Some(expected) => assert_eq!(text_of(edit), expected, "{input:?}"),
            }
        }
    }
}
