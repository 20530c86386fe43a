//! End-to-end tests of the lean per-call path (issue 15, part 3): what is now kept
//! between calls instead of recomputed (guide's file counts, the listing a glob batch
//! reads from) is never stale after a write, a delete, an ingest, an edit made outside
//! alexandria, a workspace rename or a rebuilt state.db.

use std::path::Path;
use std::time::Duration;

use alexandria_tests::{Env, call, error_code};
use serde_json::{Value, json};

/// Files under `raw/` and `wiki/` as the index counts them (hidden names skipped).
fn files_on_disk(workspace: &Path, layer: &str) -> u64 {
    walk(&workspace.join(layer))
}

fn walk(dir: &Path) -> u64 {
    let mut count = 0;
    for entry in std::fs::read_dir(dir).expect("read dir").flatten() {
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let kind = entry.file_type().expect("file type");
        if kind.is_dir() {
            count += walk(&entry.path());
        } else if kind.is_file() {
            count += 1;
        }
    }
    count
}

async fn counts(
    client: &rmcp::service::RunningService<rmcp::RoleClient, ()>,
    slug: &str,
) -> (u64, u64) {
    let guide = call(client, "guide", json!({"workspace": slug}))
        .await
        .expect("guide");
    assert_eq!(error_code(&guide), None, "{guide}");
    let structured = &guide["structuredContent"];
    (
        structured["wiki_pages"].as_u64().expect("wiki_pages"),
        structured["raw_sources"].as_u64().expect("raw_sources"),
    )
}

/// Guide's counts, and those of the workspace list, against the files on disk.
async fn assert_counts(
    env: &Env,
    client: &rmcp::service::RunningService<rmcp::RoleClient, ()>,
    slug: &str,
    step: &str,
) {
    let dir = env.workspace_dir(slug);
    let expected = (files_on_disk(&dir, "wiki"), files_on_disk(&dir, "raw"));
    assert_eq!(counts(client, slug).await, expected, "after {step}");
    let open = call(client, "guide", json!({})).await.expect("guide");
    let listed = open["structuredContent"]["workspaces"]
        .as_array()
        .expect("workspaces")
        .iter()
        .find(|w| w["workspace"] == slug)
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(
        (
            listed["wiki_pages"].as_u64().unwrap_or(u64::MAX),
            listed["raw_sources"].as_u64().unwrap_or(u64::MAX)
        ),
        expected,
        "workspace list after {step}: {listed}"
    );
}

/// Poll guide until its counts match the disk (an outside edit is indexed within
/// ~0.1 s of its file notification).
async fn wait_for_counts(
    env: &Env,
    client: &rmcp::service::RunningService<rmcp::RoleClient, ()>,
    slug: &str,
) -> bool {
    let dir = env.workspace_dir(slug);
    let expected = (files_on_disk(&dir, "wiki"), files_on_disk(&dir, "raw"));
    for _ in 0..600 {
        if counts(client, slug).await == expected {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test]
async fn guide_counts_follow_every_change() -> anyhow::Result<()> {
    let env = Env::new();
    env.ok(&["init"]);
    env.ok(&["workspace", "create", "lab"]);
    env.ingest("lab", &[("a.md", b"# A\n\nalpha\n"), ("b.txt", b"beta\n")]);
    let client = env.client(None).await?;
    assert_counts(&env, &client, "lab", "start").await;

    for i in 0..3 {
        let written = call(
            &client,
            "write",
            json!({"workspace": "lab", "command": "create", "path": format!("wiki/p{i}.md"),
                   "content": format!("# Page {i}\n\nSee [a](raw/a.md).\n")}),
        )
        .await?;
        assert_eq!(error_code(&written), None, "{written}");
    }
    assert_counts(&env, &client, "lab", "three writes").await;
    let deleted = call(
        &client,
        "delete",
        json!({"workspace": "lab", "path": "wiki/p1.md"}),
    )
    .await?;
    assert_eq!(error_code(&deleted), None, "{deleted}");
    assert_counts(&env, &client, "lab", "a delete").await;
    env.ingest("lab", &[("c.md", b"# C\n\ngamma\n")]);
    assert_counts(&env, &client, "lab", "an ingest").await;

    // Outside alexandria: a page created, one removed, a raw file dropped in.
    let dir = env.workspace_dir("lab");
    std::fs::write(dir.join("wiki/outside.md"), "# Outside\n\nby hand\n")?;
    std::fs::remove_file(dir.join("wiki/p2.md"))?;
    std::fs::write(dir.join("raw/dropped.txt"), "dropped by hand\n")?;
    assert!(
        wait_for_counts(&env, &client, "lab").await,
        "outside edits were not counted: guide says {:?}",
        counts(&client, "lab").await
    );
    assert_counts(&env, &client, "lab", "outside edits").await;
    drop(client);

    // A rename moves the counts with the files; the old name counts nothing.
    env.ok(&["workspace", "rename", "lab", "bench"]);
    let client = env.client(None).await?;
    assert_counts(&env, &client, "bench", "a rename").await;
    let old = call(&client, "guide", json!({"workspace": "lab"})).await?;
    assert_eq!(error_code(&old), Some("workspace_not_found"), "{old}");
    drop(client);

    // A lost state.db is rebuilt from the files: the counts with it.
    env.ok(&["daemon", "stop"]);
    std::fs::remove_file(env.home.join("state.db"))?;
    let client = env.client(None).await?;
    assert!(
        wait_for_counts(&env, &client, "bench").await,
        "after a rebuilt state.db guide says {:?}",
        counts(&client, "bench").await
    );
    assert_counts(&env, &client, "bench", "a rebuilt state.db").await;
    Ok(())
}

#[tokio::test]
async fn a_glob_batch_reads_what_single_reads_read_even_after_outside_edits() -> anyhow::Result<()>
{
    let env = Env::new();
    env.ok(&["init"]);
    env.ok(&["workspace", "create", "lab"]);
    let client = env.client(Some("lab")).await?;
    for i in 0..4 {
        let written = call(
            &client,
            "write",
            json!({"command": "create", "path": format!("wiki/t/p{i}.md"),
                   "content": format!("# Page {i}\n\nbody {i}\n")}),
        )
        .await?;
        assert_eq!(error_code(&written), None, "{written}");
    }
    let dir = env.workspace_dir("lab");
    // Edited by hand after it was indexed: the batch must not serve the indexed row.
    // The size changes, so this does not depend on the file system's mtime resolution.
    std::fs::write(
        dir.join("wiki/t/p2.md"),
        "# Page 2\n\nedited by hand, longer\n",
    )?;
    let batch = call(&client, "read", json!({"path": "wiki/t/*.md"})).await?;
    assert_eq!(error_code(&batch), None, "{batch}");
    let files = batch["structuredContent"]["files"]
        .as_array()
        .expect("files")
        .clone();
    assert_eq!(files.len(), 4, "{batch}");
    for file in &files {
        let path = file["path"].as_str().expect("path");
        let single = call(&client, "read", json!({"path": path})).await?;
        assert_eq!(error_code(&single), None, "{single}");
        let one = &single["structuredContent"];
        assert_eq!(file["rev"], one["rev"], "{path}");
        assert_eq!(file["kind"], one["kind"], "{path}");
        assert_eq!(file["content"], one["content"], "{path}");
        assert_eq!(file["chars"], one["chars"], "{path}");
        let on_disk = std::fs::read_to_string(dir.join(path))?;
        assert_eq!(file["content"].as_str(), Some(on_disk.as_str()), "{path}");
    }
    assert!(text_contains(&batch, "edited by hand, longer"), "{batch}");

    // A file gone since the listing is reported in the batch, not served from the index.
    std::fs::remove_file(dir.join("wiki/t/p3.md"))?;
    let batch = call(&client, "read", json!({"path": "wiki/t/*.md"})).await?;
    let gone = batch["structuredContent"]["files"]
        .as_array()
        .expect("files")
        .iter()
        .find(|f| f["path"] == "wiki/t/p3.md")
        .cloned();
    if let Some(gone) = gone {
        assert_eq!(gone["error"]["code"], "not_found", "{batch}");
    }
    Ok(())
}

fn text_contains(result: &Value, needle: &str) -> bool {
    result["content"][0]["text"]
        .as_str()
        .is_some_and(|t| t.contains(needle))
}

/// Lines of the tool-call logs (`logs/mcp-<date>.jsonl`) of `env`, all days.
fn call_log_lines(env: &Env) -> Vec<Value> {
    let mut lines = Vec::new();
    for entry in std::fs::read_dir(env.home.join("logs"))
        .expect("logs dir")
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("mcp-") && name.ends_with(".jsonl") {
            let text = std::fs::read_to_string(entry.path()).expect("read log");
            lines.extend(
                text.lines()
                    .map(|l| serde_json::from_str::<Value>(l).expect("json line")),
            );
        }
    }
    lines
}

#[tokio::test]
async fn the_call_log_gets_every_call_even_when_its_file_is_removed_or_replaced()
-> anyhow::Result<()> {
    let env = Env::new();
    env.ok(&["init"]);
    let client = env.client(Some("global")).await?;
    call(&client, "guide", json!({})).await?;
    call(&client, "read", json!({"path": "wiki/index.md"})).await?;
    let lines = call_log_lines(&env);
    let tools: Vec<&str> = lines.iter().filter_map(|l| l["tool"].as_str()).collect();
    assert_eq!(tools, ["guide", "read"], "{lines:?}");

    // Removed while the daemon runs (log rotation, a person tidying up): the next
    // call starts a new file rather than writing into the removed one.
    for entry in std::fs::read_dir(env.home.join("logs"))?.flatten() {
        if entry.file_name().to_string_lossy().starts_with("mcp-") {
            std::fs::remove_file(entry.path())?;
        }
    }
    call(&client, "search", json!({"query": "wiki"})).await?;
    let lines = call_log_lines(&env);
    let tools: Vec<&str> = lines.iter().filter_map(|l| l["tool"].as_str()).collect();
    assert_eq!(tools, ["search"], "{lines:?}");
    assert_eq!(lines[0]["result"], "ok");

    // Moved aside and replaced by another file: lines go to the file at the name.
    for entry in std::fs::read_dir(env.home.join("logs"))?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("mcp-") {
            std::fs::rename(
                entry.path(),
                env.home.join("logs").join(format!("old-{name}")),
            )?;
            std::fs::write(entry.path(), "")?;
        }
    }
    call(&client, "guide", json!({})).await?;
    let tools: Vec<String> = call_log_lines(&env)
        .iter()
        .filter_map(|l| l["tool"].as_str().map(str::to_string))
        .collect();
    assert_eq!(tools, ["guide"]);
    Ok(())
}
