//! `alexandria workspace rename|archive|restore|info|remote|clone|status` and `alexandria
//! sync`: the workspace life cycle and its git remote. Each is one control request;
//! `rename` then lists the client entries that still pin the old name.
#![allow(clippy::print_stdout)]

use std::process::ExitCode;

use alexandria_proto::ControlRequest;
use alexandria_proto::paths::validate_slug;
use anyhow::Result;

use crate::cli::request;
use crate::connect::Connector;

pub fn rename(connector: &Connector, from: &str, to: &str) -> Result<ExitCode> {
    validate_slug(from)?;
    validate_slug(to)?;
    let (text, _) = request(
        connector,
        &ControlRequest::WorkspaceRename {
            from: from.to_string(),
            to: to.to_string(),
        },
    )?;
    println!("{text}");
    let pinned = crate::doctor::entries_pinned_to(from);
    if !pinned.is_empty() {
        println!("client entries still pinned to '{from}' (re-run these to point them at '{to}'):");
        for (where_, fix) in pinned {
            println!("  {where_}\n    {fix}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn archive(connector: &Connector, slug: &str, force: bool) -> Result<ExitCode> {
    validate_slug(slug)?;
    let (text, _) = request(
        connector,
        &ControlRequest::WorkspaceArchive {
            slug: slug.to_string(),
            force,
        },
    )?;
    println!("{text}");
    Ok(ExitCode::SUCCESS)
}

pub fn restore(connector: &Connector, name: &str) -> Result<ExitCode> {
    let (text, _) = request(
        connector,
        &ControlRequest::WorkspaceRestore {
            name: name.to_string(),
        },
    )?;
    println!("{text}");
    Ok(ExitCode::SUCCESS)
}

pub fn info(connector: &Connector, slug: &str, json: bool) -> Result<ExitCode> {
    validate_slug(slug)?;
    let (text, data) = request(
        connector,
        &ControlRequest::WorkspaceInfo {
            slug: slug.to_string(),
        },
    )?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&data).unwrap_or_else(|_| data.to_string())
        );
    } else {
        println!("{text}");
    }
    Ok(ExitCode::SUCCESS)
}

fn print(text: &str, data: &serde_json::Value, json: bool) {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(data).unwrap_or_else(|_| data.to_string())
        );
    } else {
        println!("{text}");
    }
}

pub fn remote(
    connector: &Connector,
    slug: &str,
    url: Option<String>,
    branch: Option<String>,
) -> Result<ExitCode> {
    validate_slug(slug)?;
    let (text, _) = request(
        connector,
        &ControlRequest::WorkspaceRemote {
            slug: slug.to_string(),
            url,
            branch,
        },
    )?;
    println!("{text}");
    Ok(ExitCode::SUCCESS)
}

pub fn clone(
    connector: &Connector,
    url: String,
    slug: Option<String>,
    branch: Option<String>,
) -> Result<ExitCode> {
    if let Some(slug) = &slug {
        validate_slug(slug)?;
    }
    let (text, _) = request(
        connector,
        &ControlRequest::WorkspaceClone { url, slug, branch },
    )?;
    println!("{text}");
    Ok(ExitCode::SUCCESS)
}

pub fn status(connector: &Connector, slug: &str, json: bool) -> Result<ExitCode> {
    validate_slug(slug)?;
    let (text, data) = request(
        connector,
        &ControlRequest::WorkspaceStatus {
            slug: slug.to_string(),
        },
    )?;
    print(&text, &data, json);
    Ok(ExitCode::SUCCESS)
}

pub fn sync(connector: &Connector, workspace: Option<String>, json: bool) -> Result<ExitCode> {
    if let Some(slug) = &workspace {
        validate_slug(slug)?;
    }
    let (text, data) = request(connector, &ControlRequest::Sync { workspace })?;
    print(&text, &data, json);
    Ok(ExitCode::SUCCESS)
}
