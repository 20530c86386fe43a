//! The `read` tool: one file, a glob batch within a budget, PDF pages, sections, images.

use std::fmt::Write as _;
use std::io::Read as _;
use std::path::Path;

use alexandria_proto::paths::{self};
use alexandria_proto::{Binding, ErrorCode};
use base64::Engine as _;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::params::scope;
use super::{ToolOutput, resolve_workspace};
use crate::error::{ToolError, ToolResult};
use crate::index::extract::Kind;
use crate::index::markdown;
use crate::index::{self};
use crate::workspace::Store;

/// Default and largest character budget of one `read`.
pub const DEFAULT_MAX_CHARS: usize = 40_000;
pub const LIMIT_MAX_CHARS: usize = 400_000;
/// Largest image returned as image content.
const MAX_IMAGE_BYTES: u64 = 10 * 1024 * 1024;

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadParams {
    /// Workspace slug. Required in open sessions; defaults to the pinned workspace.
    pub workspace: Option<String>,
    /// A file (`wiki/index.md`, `raw/paper.pdf`) or a glob for a batch (`wiki/topics/*.md`).
    pub path: String,
    /// PDF pages to read, e.g. "3", "1-5,9".
    pub pages: Option<String>,
    /// Markdown sections to read, by heading text or trail ("Setup" or "Guide > Setup").
    pub sections: Option<Vec<String>>,
    /// Return png/jpg/gif/webp files as image content.
    pub include_images: Option<bool>,
    /// Character budget for the answer (default 40000).
    pub max_chars: Option<u32>,
}

/// Parse `"1-5,9"` into sorted unique page numbers within `1..=count`.
pub fn parse_pages(spec: &str, count: u32) -> ToolResult<Vec<u32>> {
    let invalid = |why: String| {
        ToolError::invalid_argument(
            format!("pages={spec:?}: {why}"),
            format!("use page numbers from 1 to {count}, like \"3\" or \"1-5,9\""),
        )
        .with_detail("page_count", count)
    };
    let mut pages = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (from, to) = match part.split_once('-') {
            Some((a, b)) => (a.trim(), b.trim()),
            None => (part, part),
        };
        let from: u32 = from
            .parse()
            .map_err(|_| invalid(format!("'{part}' is not a page or range")))?;
        let to: u32 = to
            .parse()
            .map_err(|_| invalid(format!("'{part}' is not a page or range")))?;
        if from == 0 || to < from {
            return Err(invalid(format!("'{part}' is not a valid range")));
        }
        if to > count {
            return Err(invalid(format!("the document has {count} pages")));
        }
        if to - from > 10_000 {
            return Err(invalid("range too long".into()));
        }
        pages.extend(from..=to);
    }
    if pages.is_empty() {
        return Err(invalid("no pages given".into()));
    }
    pages.sort_unstable();
    pages.dedup();
    Ok(pages)
}

/// Cut `text` to at most `max` characters; returns whether it was cut.
fn truncate_chars(text: &mut String, max: usize) -> bool {
    // No more bytes than `max`: no more characters either (most pages).
    if text.len() <= max {
        return false;
    }
    match text.char_indices().nth(max) {
        Some((cut, _)) => {
            text.truncate(cut);
            true
        }
        None => false,
    }
}

pub fn read(store: &Store, binding: &Binding, params: ReadParams) -> ToolResult<ToolOutput> {
    let slug = resolve_workspace(store, binding, params.workspace.as_deref())?;
    let max_chars = params
        .max_chars
        .map(|m| m as usize)
        .unwrap_or(DEFAULT_MAX_CHARS)
        .clamp(100, LIMIT_MAX_CHARS);
    if paths::is_glob(&params.path) {
        return read_batch(store, &slug, &params, max_chars);
    }
    let checked = store.checked_path_for_read(&slug, &params.path)?;
    let (record, file) = fresh_record(checked.stat, checked.file, |stat| {
        index::ensure_fresh_with(
            store,
            &slug,
            &checked.path.path,
            &checked.absolute,
            None,
            stat,
        )
    })?;
    read_file(
        store,
        &slug,
        &checked.path,
        &checked.absolute,
        record,
        file,
        &params,
        max_chars,
    )
}

/// The file's catalogue row, current with the disk (`fresh`: `index::ensure_fresh_with`
/// given the stat), and the file the path check opened when the row describes that very
/// file (else it was re-indexed from the path meanwhile, and is read by its path).
fn fresh_record(
    stat: Option<std::fs::Metadata>,
    file: Option<std::fs::File>,
    fresh: impl FnOnce(Option<std::fs::Metadata>) -> ToolResult<index::FileRecord>,
) -> ToolResult<(index::FileRecord, Option<std::fs::File>)> {
    let opened = stat.as_ref().map(index::stat_key);
    let record = fresh(stat)?;
    let file = file.filter(|_| opened == Some((record.size, record.mtime_ns)));
    Ok((record, file))
}

/// Read one checked file whose catalogue row is current (`file`: that file, opened).
#[allow(clippy::too_many_arguments)]
fn read_file(
    store: &Store,
    slug: &str,
    checked: &paths::WorkspacePath,
    absolute: &Path,
    record: index::FileRecord,
    file: Option<std::fs::File>,
    params: &ReadParams,
    max_chars: usize,
) -> ToolResult<ToolOutput> {
    let kind = Kind::of(absolute);
    if params.pages.is_some() && kind != Kind::Pdf {
        return Err(ToolError::invalid_argument(
            format!(
                "pages applies to PDF files; {} is {}",
                checked.path,
                kind.as_str()
            ),
            "omit pages, or use sections=[…] for markdown",
        ));
    }
    if params.sections.is_some() && kind != Kind::Markdown {
        return Err(ToolError::invalid_argument(
            format!(
                "sections applies to markdown files; {} is {}",
                checked.path,
                kind.as_str()
            ),
            "omit sections (use pages=\"…\" for PDFs)",
        ));
    }
    let mut structured = json!({
        "workspace": slug,
        "path": checked.path,
        "kind": kind.as_str(),
        "rev": record.rev,
        "size": record.size,
    });
    let mut images = Vec::new();
    let (text, truncated) = match kind {
        Kind::Markdown | Kind::Text => {
            let mut content = read_text(
                absolute,
                file,
                record.size as u64,
                params.sections.is_none().then_some(max_chars),
            )?;
            if let Some(wanted) = &params.sections {
                let mut parts = Vec::new();
                let mut missing = Vec::new();
                for heading in wanted {
                    match markdown::find_section(&content, heading) {
                        Some((a, b)) => parts.push(content[a..b].to_string()),
                        None => missing.push(heading.clone()),
                    }
                }
                if !missing.is_empty() {
                    let available: Vec<String> = markdown::sections(&content)
                        .into_iter()
                        .filter(|s| s.level > 0)
                        .map(|s| s.trail.join(" > "))
                        .collect();
                    return Err(ToolError::new(
                        ErrorCode::NoMatch,
                        format!("{} has no section {}", checked.path, missing.join(", ")),
                        "pass a heading exactly as in the page (case does not matter); the available headings are listed",
                    )
                    .with_detail("missing", missing)
                    .with_detail("available", available));
                }
                structured["sections"] = json!(wanted);
                content = parts.join("\n");
            }
            let truncated = truncate_chars(&mut content, max_chars);
            (content, truncated)
        }
        Kind::Pdf => {
            let count = record.pages.unwrap_or(0) as u32;
            structured["page_count"] = json!(count);
            if count == 0 {
                return Err(ToolError::new(
                    ErrorCode::InvalidArgument,
                    format!(
                        "{} has no readable pages (damaged or encrypted PDF?)",
                        checked.path
                    ),
                    "read another source, or ask the user for a text version",
                ));
            }
            let pages = match &params.pages {
                Some(spec) => parse_pages(spec, count)?,
                None => (1..=count).collect(),
            };
            let connection = crate::blocking::checkout(&store.pool)?;
            let mut content = String::new();
            let mut returned = Vec::new();
            let mut truncated = false;
            for (page, body) in index::pdf_pages(&connection, record.id, &pages)? {
                let body = if body.trim().is_empty() {
                    "(no text on this page: it may be a scanned image)\n".to_string()
                } else {
                    body
                };
                let block = format!("--- page {page} ---\n{}\n", body.trim());
                if content.chars().count() + block.chars().count() > max_chars {
                    truncated = true;
                    if returned.is_empty() {
                        let mut partial = block;
                        truncate_chars(&mut partial, max_chars);
                        content.push_str(&partial);
                        returned.push(page);
                    }
                    break;
                }
                content.push_str(&block);
                returned.push(page);
            }
            structured["pages"] = json!(returned);
            if truncated && let Some(last) = returned.last() {
                structured["next_pages"] =
                    json!(format!("{}-{}", last + 1, pages.last().unwrap_or(last)));
            }
            (content, truncated)
        }
        Kind::Image => {
            if params.include_images.unwrap_or(false) {
                let Some(mime) = Kind::image_mime(absolute) else {
                    return Err(ToolError::invalid_argument(
                        format!(
                            "{} is an image format that cannot be returned as image content",
                            checked.path
                        ),
                        "png, jpg, gif and webp can be returned",
                    ));
                };
                if record.size as u64 > MAX_IMAGE_BYTES {
                    return Err(ToolError::new(
                        ErrorCode::TooLarge,
                        format!(
                            "{} is {} bytes; images over {MAX_IMAGE_BYTES} bytes are not returned",
                            checked.path, record.size
                        ),
                        "ask the user for a smaller version",
                    ));
                }
                let bytes = crate::blocking::section(|| std::fs::read(absolute))
                    .map_err(|e| ToolError::internal("reading image", e))?;
                images.push((
                    base64::engine::general_purpose::STANDARD.encode(&bytes),
                    mime.to_string(),
                ));
                (
                    format!(
                        "{} (image, {} bytes) is attached.",
                        checked.path, record.size
                    ),
                    false,
                )
            } else {
                (
                    format!(
                        "{} is an image ({} bytes). Call read with include_images=true to see it.",
                        checked.path, record.size
                    ),
                    false,
                )
            }
        }
        Kind::Binary => (
            format!(
                "{} is a binary file ({} bytes) with no text alexandria can extract.",
                checked.path, record.size
            ),
            false,
        ),
    };
    structured["truncated"] = json!(truncated);
    structured["chars"] = json!(text.chars().count());
    let mut rendered = format!(
        "{} (rev {})\n\n{text}",
        checked.path,
        short_rev(&record.rev)
    );
    if truncated {
        let hint = match kind {
            Kind::Pdf => format!(
                "\n[truncated at {max_chars} characters: continue with pages=\"{}\"]",
                structured["next_pages"].as_str().unwrap_or("…")
            ),
            _ => format!(
                "\n[truncated at {max_chars} characters: read parts with sections=[…] or raise max_chars (up to {LIMIT_MAX_CHARS})]"
            ),
        };
        rendered.push_str(&hint);
    }
    // Moved, not copied (`json!` serializes its argument into a new value).
    structured["content"] = Value::String(text);
    Ok(ToolOutput {
        text: rendered,
        structured,
        images,
    })
}

fn short_rev(rev: &str) -> &str {
    &rev[..rev.len().min(12)]
}

/// Read a text file, at most about `max_chars` characters of it when given.
/// Whether a glob's folders are all literal (only its last segment has wildcards).
fn one_folder(glob: &str) -> bool {
    glob.rsplit_once('/')
        .is_none_or(|(folders, _)| !folders.contains(['*', '?', '[', '{']))
}

/// Files from this size on are read in a `blocking::section`.
const LARGE_READ: u64 = 1 << 20;

/// The text of `path` (`file`: already open), `size` bytes by its catalogue row (just
/// checked against the disk).
fn read_text(
    path: &Path,
    file: Option<std::fs::File>,
    size: u64,
    max_chars: Option<usize>,
) -> ToolResult<String> {
    let file = match file {
        Some(file) => file,
        None => std::fs::File::open(path).map_err(|e| ToolError::internal("opening file", e))?,
    };
    let limit = max_chars.map(|max| (max as u64 + 1) * 4);
    if size.min(limit.unwrap_or(u64::MAX)) >= LARGE_READ {
        return crate::blocking::section(|| read_from(file, size, limit));
    }
    read_from(file, size, limit)
}

/// At most `limit` bytes of `file` (4 bytes per character at most, plus one more
/// character to detect the cut), as text. The buffer is sized from the stat (`size`),
/// so a page takes one `read` and the one that finds its end (`read_to_end` grows its
/// buffer from 32 bytes: 9 reads for a 4 KiB page).
fn read_from(mut file: std::fs::File, size: u64, limit: Option<u64>) -> ToolResult<String> {
    let error = |e| ToolError::internal("reading file", e);
    let cap = limit.unwrap_or(u64::MAX);
    let expected = size.min(cap);
    // One byte more than the stat said, unless that is past the limit: a file that
    // grew since shows it by filling the buffer.
    let first = if expected < cap {
        expected + 1
    } else {
        expected
    };
    let mut bytes =
        vec![
            0u8;
            usize::try_from(first)
                .map_err(|_| ToolError::internal("reading file", "the file is too large"))?
        ];
    let mut filled = 0;
    while filled < bytes.len() {
        match file.read(&mut bytes[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(error(e)),
        }
    }
    bytes.truncate(filled);
    if filled as u64 == first && first < cap {
        // It grew since its stat: the rest, up to the limit.
        (&mut file)
            .take(cap - first)
            .read_to_end(&mut bytes)
            .map_err(error)?;
    }
    Ok(match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    })
}

fn read_batch(
    store: &Store,
    slug: &str,
    params: &ReadParams,
    max_chars: usize,
) -> ToolResult<ToolOutput> {
    if params.pages.is_some() || params.sections.is_some() {
        return Err(ToolError::invalid_argument(
            "pages and sections apply to a single file, not a glob",
            "read the file on its own to select pages or sections",
        ));
    }
    let scope = scope(&params.path)?;
    let list = || {
        let connection = crate::blocking::checkout(&store.pool)?;
        index::list(
            &connection,
            slug,
            Some(scope.layer),
            Some(&scope.matcher),
            Some(&scope.sql),
        )
    };
    // A glob within one folder (wiki/topics/*.md: what agents mostly send) lists that
    // folder; one that spans folders may walk every file of the workspace.
    let files = if one_folder(&params.path) {
        list()?
    } else {
        crate::blocking::section(list)?
    };
    if files.is_empty() {
        return Err(ToolError::new(
            ErrorCode::NotFound,
            format!("no file matches {}", params.path),
            "list what exists with search(mode=\"list\", path=\"wiki/**\")",
        )
        .with_detail("path", params.path.as_str()));
    }
    // The pages' text goes in once more than it is read: room for it from the start.
    let expected: u64 = files.iter().map(|f| f.size.max(0) as u64 + 64).sum();
    let mut text = String::with_capacity(expected.min((max_chars as u64 + 1) * 4) as usize);
    let mut used = 0usize;
    let mut returned = Vec::new();
    let mut remaining = Vec::new();
    let mut images = Vec::new();
    for (i, file) in files.iter().enumerate() {
        if used >= max_chars {
            remaining.extend(files[i..].iter().map(|f| f.path.clone()));
            break;
        }
        let single = ReadParams {
            workspace: None,
            path: String::new(),
            pages: None,
            sections: None,
            include_images: params.include_images,
            max_chars: None,
        };
        // The listing's row saves a look-up per file; the file is still checked on
        // disk (a changed one is re-indexed first), as a single read does.
        let outcome = store
            .checked_path_for_read(slug, &file.path)
            .and_then(|checked| {
                let (record, opened) = fresh_record(checked.stat, checked.file, |stat| {
                    index::ensure_fresh_with(
                        store,
                        slug,
                        &checked.path.path,
                        &checked.absolute,
                        Some(file),
                        stat,
                    )
                })?;
                let budget = (max_chars - used).max(100);
                read_file(
                    store,
                    slug,
                    &checked.path,
                    &checked.absolute,
                    record,
                    opened,
                    &single,
                    budget,
                )
            });
        match outcome {
            Ok(mut output) => {
                let structured = &mut output.structured;
                let truncated = structured["truncated"].as_bool().unwrap_or(false);
                let chars = structured["chars"].as_u64().unwrap_or(0) as usize;
                if truncated && !returned.is_empty() {
                    // It does not fit whole: leave it for the next call.
                    remaining.extend(files[i..].iter().map(|f| f.path.clone()));
                    break;
                }
                used += chars;
                let _ = writeln!(text, "=== {} ===", output.text);
                images.extend(output.images);
                // Built by moving the parts in: `json!` would copy the content.
                let mut entry = Map::new();
                entry.insert("path".into(), Value::String(file.path.clone()));
                entry.insert("rev".into(), structured["rev"].take());
                entry.insert("kind".into(), structured["kind"].take());
                entry.insert("chars".into(), Value::from(chars));
                entry.insert("truncated".into(), Value::Bool(truncated));
                entry.insert("content".into(), structured["content"].take());
                returned.push(Value::Object(entry));
            }
            Err(error) => {
                let _ = writeln!(text, "=== {} ===\n{}\n", file.path, error.to_text());
                returned.push(json!({"path": file.path, "error": error.to_json()["error"]}));
            }
        }
    }
    if !remaining.is_empty() {
        let _ = writeln!(
            text,
            "[budget of {max_chars} characters used: {} more files not shown: {}. Read them with a narrower glob or one by one.]",
            remaining.len(),
            remaining
                .iter()
                .take(20)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let mut structured = Map::new();
    structured.insert("workspace".into(), Value::from(slug));
    structured.insert("path".into(), Value::from(params.path.as_str()));
    structured.insert("files".into(), Value::Array(returned));
    structured.insert("truncated".into(), Value::Bool(!remaining.is_empty()));
    structured.insert("remaining".into(), Value::from(remaining));
    Ok(ToolOutput {
        text,
        structured: Value::Object(structured),
        images,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_read_whole_whatever_its_stat_said_up_to_the_limit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("page.md");
        let text = "é and plain text ".repeat(1000);
        std::fs::write(&path, &text).expect("write");
        let open = || std::fs::File::open(&path).expect("open");
        let size = text.len() as u64;
        // As stat'ed; grown since (a smaller stat); shrunk since (a larger one).
        for stat in [size, 10, 0, size * 2] {
            assert_eq!(read_from(open(), stat, None).expect("read"), text, "{stat}");
        }
        // A limit cuts, whatever the stat.
        for stat in [size, 10] {
            assert_eq!(
                read_from(open(), stat, Some(100)).expect("read").len(),
                100,
                "{stat}"
            );
        }
        // Bytes that are not UTF-8 are replaced, not refused.
        std::fs::write(&path, b"ok \xff ok").expect("write");
        assert_eq!(read_from(open(), 7, None).expect("read"), "ok \u{fffd} ok");
    }

    #[test]
    fn page_specs() {
        assert_eq!(parse_pages("3", 5).expect("ok"), vec![3]);
        assert_eq!(parse_pages("1-3, 5,2", 5).expect("ok"), vec![1, 2, 3, 5]);
        for bad in ["0", "6", "3-1", "x", "", "1-", "2-9"] {
            assert!(parse_pages(bad, 5).is_err(), "{bad}");
        }
    }
}
