//! End-to-end tests of the day-one paper cuts of issue 21: citing raw files whose names
//! have spaces, pages that differ only by case or Unicode normalization, control
//! characters in page text, `limit` bounds, CLI errors worded for people, and
//! ingesting a directory.

use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;
use std::time::Duration;

use alexandria_tests::{Env, call, error_code, git, make_pdf, text_of, wait_until};
use serde_json::{Value, json};

fn commit_count(env: &Env, workspace: &str) -> usize {
    git(
        &env.workspace_dir(workspace),
        &["rev-list", "--count", "HEAD"],
    )
    .trim()
    .parse()
    .expect("count")
}

/// A workspace `lab` with a source whose name has a space, and a PDF.
fn lab() -> Env {
    let env = Env::new();
    env.ok(&["init"]);
    env.ok(&["workspace", "create", "lab"]);
    let out = env.ingest(
        "lab",
        &[
            ("my notes.md", b"# My notes\n\nkelp forests\n"),
            ("paper.pdf", &make_pdf(&["one", "two"])),
        ],
    );
    assert!(out.contains("raw/my notes.md"), "{out}");
    env
}

fn stderr(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn hint(result: &Value) -> &str {
    result["structuredContent"]["error"]["hint"]
        .as_str()
        .unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_file_with_a_space_can_be_cited() -> anyhow::Result<()> {
    let env = lab();
    let client = env.client(Some("lab")).await?;
    let create = |path: &str, content: &str| {
        call(
            &client,
            "write",
            json!({"command": "create", "path": path, "content": content}),
        )
    };
    for (page, content) in [
        (
            "wiki/percent.md",
            "# P\n\nSee [notes](raw/my%20notes.md).\n",
        ),
        ("wiki/angle.md", "# A\n\nSee [notes](<raw/my notes.md>).\n"),
        (
            "wiki/titled.md",
            "# T\n\nSee [notes](<raw/my notes.md> \"my notes\") and [pdf](raw/paper.pdf#page=2).\n",
        ),
        (
            "wiki/footnote.md",
            "# F\n\nSee[^1] and[^2].\n\n[^1]: raw/my%20notes.md\n[^2]: raw/paper.pdf, p.2\n",
        ),
    ] {
        let result = create(page, content).await?;
        assert!(error_code(&result).is_none(), "{page}: {result}");
    }
    // The source counts as cited.
    let guide = call(&client, "guide", json!({})).await?;
    assert_eq!(guide["structuredContent"]["uncited_sources"], json!([]));

    // Anything that decodes to an escape, or to a file that is not there, is refused.
    for (target, problem) in [
        ("raw/%2e%2e/config.toml", "not a valid raw/ path"),
        ("raw/%2E%2E/%2E%2E/secrets/key", "not a valid raw/ path"),
        ("raw/my%2fnotes.md", "not a valid raw/ path"),
        ("raw/my%5cnotes.md", "not a valid raw/ path"),
        ("raw/my%00notes.md", "not a valid raw/ path"),
        ("raw/my%2520notes.md", "not a valid raw/ path"),
        ("raw/bad%zz.md", "not a valid raw/ path"),
        ("<raw/../config.toml>", "not a valid raw/ path"),
        ("raw/../config.toml", "not a valid raw/ path"),
        ("<raw/other notes.md>", "no such file in raw/"),
        ("raw/other%20notes.md", "no such file in raw/"),
    ] {
        let result = create("wiki/escape.md", &format!("# E\n\nSee [it]({target}).\n")).await?;
        assert_eq!(
            error_code(&result),
            Some("citation_invalid"),
            "{target}: {result}"
        );
        let listed = &result["structuredContent"]["error"]["citations"][0];
        assert_eq!(listed["problem"], problem, "{target}: {result}");
        let written = target.trim_start_matches('<').trim_end_matches('>');
        assert_eq!(listed["citation"], written, "{target}: {result}");
    }
    assert!(!env.workspace_dir("lab").join("wiki/escape.md").exists());
    client.cancel().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_differing_only_by_case_or_normalization_are_refused() -> anyhow::Result<()> {
    let env = lab();
    let client = env.client(Some("lab")).await?;
    let create = |path: &str| {
        call(
            &client,
            "write",
            json!({"command": "create", "path": path, "content": "# Page\n"}),
        )
    };
    let nfc = "wiki/caf\u{e9}.md";
    let nfd = "wiki/cafe\u{301}.md";
    for path in ["wiki/Topic.md", nfc, "wiki/People/Ada.md"] {
        let result = create(path).await?;
        assert!(error_code(&result).is_none(), "{path}: {result}");
    }
    let before = commit_count(&env, "lab");
    for (path, existing) in [
        ("wiki/topic.md", "wiki/Topic.md"),
        ("wiki/TOPIC.md", "wiki/Topic.md"),
        ("wiki/Topic.MD", "wiki/Topic.md"),
        (nfd, nfc),
        ("wiki/CAF\u{c9}.md", nfc),
        ("wiki/people/Ada.md", "wiki/People"),
        ("wiki/people/Grace.md", "wiki/People"),
        ("wiki/People/ada.md", "wiki/People/Ada.md"),
        ("wiki/INDEX.md", "wiki/index.md"),
    ] {
        let result = create(path).await?;
        assert_eq!(
            error_code(&result),
            Some("invalid_path"),
            "{path}: {result}"
        );
        assert_eq!(
            result["structuredContent"]["error"]["existing"], existing,
            "{path}: {result}"
        );
        assert!(hint(&result).contains(existing), "{path}: {result}");
        assert!(text_of(&result).contains(existing), "{path}: {result}");
    }
    assert_eq!(commit_count(&env, "lab"), before, "nothing was committed");
    let names: Vec<String> = std::fs::read_dir(env.workspace_dir("lab").join("wiki"))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !names.iter().any(|n| n == "topic.md" || n == "people"),
        "{names:?}"
    );
    // The same page by its own name is still "already exists", and other pages are fine.
    let again = create("wiki/Topic.md").await?;
    assert_eq!(error_code(&again), Some("invalid_argument"), "{again}");
    let other = create("wiki/People/Grace.md").await?;
    assert!(error_code(&other).is_none(), "{other}");
    client.cancel().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_characters_in_page_text_are_refused() -> anyhow::Result<()> {
    let env = lab();
    let client = env.client(Some("lab")).await?;
    let ok = call(
        &client,
        "write",
        json!({"command": "create", "path": "wiki/ok.md", "content": "# Ok\r\n\ttabbed\r\n"}),
    )
    .await?;
    assert!(error_code(&ok).is_none(), "{ok}");
    let before = commit_count(&env, "lab");
    for args in [
        json!({"command": "create", "path": "wiki/nul.md", "content": "# A\n\nbin\u{0}ary\n"}),
        json!({"command": "create", "path": "wiki/bell.md", "content": "# A\n\u{7}\n"}),
        json!({"command": "create", "path": "wiki/esc.md", "content": "# A\n\u{1b}[31mred\n"}),
        json!({"command": "create", "path": "wiki/del.md", "content": "# A\n\u{7f}\n"}),
        json!({"command": "create", "path": "wiki/c1.md", "content": "# A\n\u{85}\n"}),
        json!({"command": "append", "path": "wiki/ok.md", "content": "more\u{0}\n"}),
        json!({"command": "str_replace", "path": "wiki/ok.md", "old_str": "tabbed", "new_str": "x\u{8}y"}),
    ] {
        let result = call(&client, "write", args.clone()).await?;
        assert_eq!(
            error_code(&result),
            Some("invalid_argument"),
            "{args}: {result}"
        );
        let text = text_of(&result);
        assert!(text.contains("control character"), "{text}");
        assert!(text.contains("line "), "the message says where: {text}");
    }
    assert_eq!(commit_count(&env, "lab"), before);
    for name in ["nul.md", "bell.md", "esc.md", "del.md", "c1.md"] {
        assert!(!env.workspace_dir("lab").join("wiki").join(name).exists());
    }
    let page = std::fs::read_to_string(env.workspace_dir("lab").join("wiki/ok.md"))?;
    assert_eq!(page, "# Ok\r\n\ttabbed\r\n");
    client.cancel().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_outside_their_range_are_invalid_arguments() -> anyhow::Result<()> {
    let env = lab();
    let client = env.client(Some("lab")).await?;
    for (tool, args, range) in [
        ("search", json!({"query": "kelp", "limit": 0}), "1 to 1000"),
        (
            "search",
            json!({"query": "kelp", "limit": 1001}),
            "1 to 1000",
        ),
        ("search", json!({"mode": "list", "limit": 0}), "1 to 1000"),
        (
            "search",
            json!({"mode": "list", "limit": 5000}),
            "1 to 1000",
        ),
        ("history", json!({"limit": 0}), "1 to 500"),
        ("history", json!({"limit": 501}), "1 to 500"),
    ] {
        let result = call(&client, tool, args.clone()).await?;
        assert_eq!(
            error_code(&result),
            Some("invalid_argument"),
            "{tool} {args}: {result}"
        );
        assert!(hint(&result).contains(range), "{tool} {args}: {result}");
    }
    for (tool, args) in [
        ("search", json!({"query": "kelp", "limit": 1})),
        ("search", json!({"query": "kelp", "limit": 1000})),
        ("search", json!({"mode": "list", "limit": 1})),
        ("history", json!({"limit": 500})),
    ] {
        let result = call(&client, tool, args.clone()).await?;
        assert!(error_code(&result).is_none(), "{tool} {args}: {result}");
    }
    let one = call(&client, "search", json!({"mode": "list", "limit": 1})).await?;
    assert_eq!(
        one["structuredContent"]["files"].as_array().map(Vec::len),
        Some(1)
    );

    // The schemas say the range, in JSON Schema terms and in words.
    let tools = client.list_all_tools().await?;
    for (name, max) in [("search", 1000), ("history", 500)] {
        let tool = tools.iter().find(|t| t.name == name).expect("tool listed");
        let limit = &tool.input_schema["properties"]["limit"];
        assert_eq!(limit["minimum"], 1, "{name}: {limit}");
        assert_eq!(limit["maximum"], max, "{name}: {limit}");
        let description = limit["description"].as_str().unwrap_or("");
        assert!(
            description.contains(&format!("1 to {max}")),
            "{name}: {limit}"
        );
    }
    client.cancel().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_errors_name_cli_commands_and_tool_errors_name_tools() -> anyhow::Result<()> {
    let env = Env::new();
    env.ok(&["init"]);
    let scratch = env.dir.path().join("a.md");
    std::fs::write(&scratch, "# A\n")?;
    for args in [
        vec!["ingest", "nope", scratch.to_str().expect("utf-8")],
        vec!["ingest", "Not_A_Slug", scratch.to_str().expect("utf-8")],
        vec!["daemon", "auth", "token", "--workspace", "nope"],
    ] {
        let output = env.run(&args);
        assert!(!output.status.success(), "{args:?}");
        let text = stderr(&output);
        assert!(text.contains("workspace"), "{args:?}: {text}");
        assert!(
            text.contains("alexandria workspace list"),
            "{args:?}: {text}"
        );
        assert!(!text.contains("guide()"), "{args:?}: {text}");
        assert!(!text.contains("call "), "{args:?}: {text}");
    }
    // The same mistake through a tool keeps the agent's hint.
    let client = env.client(None).await?;
    let result = call(
        &client,
        "search",
        json!({"workspace": "nope", "query": "x"}),
    )
    .await?;
    assert_eq!(error_code(&result), Some("workspace_not_found"));
    assert!(hint(&result).contains("guide()"), "{result}");
    client.cancel().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_a_directory_recursively_in_one_commit() -> anyhow::Result<()> {
    let env = Env::new();
    env.ok(&["init"]);
    env.ok(&["workspace", "create", "lab"]);
    let folder = env.dir.path().join("field notes");
    let write = |relative: &str, bytes: &[u8]| {
        let path = folder.join(relative);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, bytes).expect("write");
    };
    write("tides.md", b"# Tides\n\nspring tide urchins\n");
    write("2024/may/pools.txt", b"anemone census in may\n");
    write("2024/survey.pdf", &make_pdf(&["sea star wasting"]));
    write(".hidden.md", b"secret\n");
    write(".git/config", b"[core]\n");
    write("2024/.cache/blob", b"cache\n");
    std::os::unix::fs::symlink("/etc/hostname", folder.join("link.md")).expect("symlink");
    std::fs::create_dir_all(folder.join("empty")).expect("empty dir");
    let before = commit_count(&env, "lab");

    let out = env.ok(&["ingest", "lab", folder.to_str().expect("utf-8")]);
    assert!(out.contains("ingested 3 file(s)"), "{out}");
    for path in [
        "raw/field notes/tides.md",
        "raw/field notes/2024/may/pools.txt",
        "raw/field notes/2024/survey.pdf",
    ] {
        assert!(out.contains(path), "{path}: {out}");
        assert!(env.workspace_dir("lab").join(path).is_file(), "{path}");
    }
    for skipped in [".hidden.md", ".git", "2024/.cache", "link.md"] {
        assert!(
            out.contains(skipped),
            "{skipped} is reported as skipped: {out}"
        );
    }
    assert!(out.contains("skipped"), "{out}");
    for absent in [".hidden.md", ".git", "2024/.cache", "link.md"] {
        assert!(
            !env.workspace_dir("lab")
                .join("raw/field notes")
                .join(absent)
                .exists(),
            "{absent}"
        );
    }
    assert_eq!(commit_count(&env, "lab"), before + 1, "one commit");
    assert!(wait_until(Duration::from_secs(5), || git(
        &env.workspace_dir("lab"),
        &["status", "--porcelain"]
    )
    .trim()
    .is_empty()));

    // Ingested files are searchable and citable at once.
    let client = env.client(Some("lab")).await?;
    let hits = call(&client, "search", json!({"query": "anemone"})).await?;
    assert_eq!(
        hits["structuredContent"]["hits"][0]["path"], "raw/field notes/2024/may/pools.txt",
        "{hits}"
    );
    let cite = call(
        &client,
        "write",
        json!({"command": "create", "path": "wiki/tides.md",
            "content": "# Tides\n\n[notes](<raw/field notes/tides.md>) [^1]\n\n[^1]: raw/field notes/2024/survey.pdf, p.1\n"}),
    )
    .await?;
    assert!(error_code(&cite).is_none(), "{cite}");
    client.cancel().await?;

    // Again: everything is already present, nothing is committed.
    let again = env.ok(&["ingest", "lab", folder.to_str().expect("utf-8")]);
    assert!(again.contains("ingested 0 file(s)"), "{again}");
    assert!(again.contains("3 already present"), "{again}");
    assert_eq!(commit_count(&env, "lab"), before + 2, "only the wiki write");
    Ok(())
}

#[test]
fn a_failing_directory_ingest_changes_nothing() {
    let env = Env::new();
    env.ok(&["init"]);
    env.ok(&["workspace", "create", "lab"]);
    // raw/batch2 is a file, so a folder named batch2 cannot go there.
    env.ingest("lab", &[("batch2", b"a source named like a folder\n")]);
    let before = commit_count(&env, "lab");
    let raw_before = walk(&env.workspace_dir("lab").join("raw"));
    let first = env.dir.path().join("batch");
    let second = env.dir.path().join("batch2");
    for (path, text) in [
        (first.join("a.md"), "# A\n"),
        (first.join("sub/b.md"), "# B\n"),
        (second.join("c.md"), "# C\n"),
    ] {
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    }
    let output = env.run(&[
        "ingest",
        "lab",
        first.to_str().expect("utf-8"),
        second.to_str().expect("utf-8"),
    ]);
    assert!(!output.status.success());
    let text = stderr(&output);
    assert!(text.contains("raw/batch2 is a file"), "{text}");
    assert!(text.contains("nothing was ingested"), "{text}");
    assert!(text.contains("hint: rename"), "{text}");
    assert_eq!(commit_count(&env, "lab"), before);
    // The files of `batch` were staged before `batch2` failed: all gone again.
    assert_eq!(walk(&env.workspace_dir("lab").join("raw")), raw_before);
    assert!(!env.workspace_dir("lab").join("raw/batch").exists());

    // A file name that is not UTF-8 cannot become a raw/ path.
    let odd = env.dir.path().join("odd");
    std::fs::create_dir_all(&odd).expect("mkdir");
    std::fs::write(odd.join("a.md"), "# A\n").expect("a");
    std::fs::write(odd.join(std::ffi::OsStr::from_bytes(b"z\xff.md")), "# Z\n").expect("z");
    let output = env.run(&["ingest", "lab", odd.to_str().expect("utf-8")]);
    assert!(!output.status.success());
    let text = stderr(&output);
    assert!(text.contains("no usable file name"), "{text}");
    assert!(text.contains("nothing was ingested"), "{text}");
    assert_eq!(commit_count(&env, "lab"), before);
    assert_eq!(walk(&env.workspace_dir("lab").join("raw")), raw_before);
}

fn walk(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(current) = stack.pop() {
        for entry in std::fs::read_dir(&current).expect("read_dir").flatten() {
            if entry.file_type().expect("type").is_dir() {
                stack.push(entry.path());
            } else {
                let relative = entry.path();
                let relative = relative.strip_prefix(dir).expect("inside");
                found.push(relative.to_string_lossy().into_owned());
            }
        }
    }
    found.sort();
    found
}
