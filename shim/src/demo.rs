//! `alexandria demo`: a scripted agent session on a bundled sample workspace, in a
//! throw-away home, through the real shim and daemon: guide → search → read.
#![allow(clippy::print_stdout)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, ExitCode, Stdio};

use alexandria_proto::{ControlRequest, Home, home::HOME_ENV};
use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::cli;
use crate::connect::Connector;

const SAMPLE: [(&str, &[u8]); 3] = [
    (
        "field-notes-2024-06-02.md",
        include_bytes!("../../examples/sample/raw/field-notes-2024-06-02.md"),
    ),
    (
        "interview-dr-okafor.txt",
        include_bytes!("../../examples/sample/raw/interview-dr-okafor.txt"),
    ),
    (
        "tidepool-survey-2019.pdf",
        include_bytes!("../../examples/sample/raw/tidepool-survey-2019.pdf"),
    ),
];

pub fn run(keep: bool) -> Result<ExitCode> {
    let root = std::env::temp_dir().join(format!("alexandria-demo-{}", std::process::id()));
    let home = Home::new(root.join("home"));
    let result = session(&home, &root);
    // Always stop the demo's daemon; keep the files only when asked.
    let _ = cli::request(&Connector { home: home.clone() }, &ControlRequest::Stop);
    if keep {
        println!("\nThe demo home is kept at {}", home.root().display());
    } else {
        let _ = std::fs::remove_dir_all(&root);
    }
    result.map(|()| ExitCode::SUCCESS)
}

fn session(home: &Home, root: &std::path::Path) -> Result<()> {
    let connector = Connector { home: home.clone() };
    println!(
        "alexandria demo: a throw-away home in {}\n",
        home.root().display()
    );
    cli::request(
        &connector,
        &ControlRequest::WorkspaceCreate {
            slug: "tidepools".into(),
        },
    )?;
    let scratch = root.join("sources");
    std::fs::create_dir_all(&scratch)?;
    let mut files = Vec::new();
    for (name, bytes) in SAMPLE {
        let path = scratch.join(name);
        std::fs::write(&path, bytes)?;
        files.push(path.display().to_string());
    }
    let (text, _) = cli::request(
        &connector,
        &ControlRequest::Ingest {
            workspace: "tidepools".into(),
            files,
        },
    )?;
    println!("$ alexandria ingest tidepools <3 sample sources>\n{text}\n");

    let exe = std::env::current_exe().context("locating this executable")?;
    println!(
        "$ {} mcp serve --workspace tidepools   (an agent's session, scripted)\n",
        exe.display()
    );
    let mut shim = Command::new(&exe)
        .args(["mcp", "serve", "--workspace", "tidepools"])
        .env(HOME_ENV, home.root())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the shim")?;
    let mut stdin = shim.stdin.take().context("shim stdin")?;
    let mut stdout = BufReader::new(shim.stdout.take().context("shim stdout")?);
    let mut next_id = 0;
    let mut rpc = |method: &str, params: Value| -> Result<Value> {
        next_id += 1;
        let frame = json!({"jsonrpc": "2.0", "id": next_id, "method": method, "params": params});
        writeln!(stdin, "{frame}")?;
        stdin.flush()?;
        loop {
            let mut line = String::new();
            if stdout.read_line(&mut line)? == 0 {
                bail!("the shim exited");
            }
            let reply: Value = serde_json::from_str(&line)?;
            if reply["id"] == json!(next_id) {
                if let Some(error) = reply.get("error") {
                    bail!("{method} failed: {error}");
                }
                return Ok(reply["result"].clone());
            }
        }
    };
    let init = rpc(
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "alexandria-demo", "version": alexandria_proto::BUILD}}),
    )?;
    println!(
        "→ initialize: {} {} (protocol {})",
        init["serverInfo"]["name"].as_str().unwrap_or("?"),
        init["serverInfo"]["version"].as_str().unwrap_or("?"),
        init["protocolVersion"].as_str().unwrap_or("?")
    );
    let tools = rpc("tools/list", json!({}))?;
    let names: Vec<&str> = tools["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["name"].as_str())
        .collect();
    println!("→ tools/list: {}\n", names.join(", "));
    let steps = [
        ("guide", json!({})),
        ("search", json!({"query": "ochre sea star"})),
        (
            "read",
            json!({"path": "raw/tidepool-survey-2019.pdf", "pages": "2"}),
        ),
        (
            "read",
            json!({"path": "raw/field-notes-2024-06-02.md", "sections": ["Anemones"]}),
        ),
    ];
    for (tool, arguments) in steps {
        let result = rpc("tools/call", json!({"name": tool, "arguments": arguments}))?;
        println!("→ {tool}({arguments})");
        let text = result["content"][0]["text"].as_str().unwrap_or("");
        for line in text.lines() {
            println!("    {line}");
        }
        println!();
    }
    drop(stdin);
    let _ = shim.wait();
    println!("Done. Register alexandria with your MCP client (see README) to use your own wiki.");
    Ok(())
}
