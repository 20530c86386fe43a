//! Markdown to HTML for the web view. Agent-written markdown is hostile input: comrak
//! renders it with raw HTML omitted and dangerous URLs (`javascript:`, `vbscript:`,
//! `file:`, non-image `data:`) dropped, and every link passes `rewrite` below, which
//! turns workspace paths into web-view URLs and marks the ones that lead nowhere.

use std::path::Path;
use std::sync::Arc;

use alexandria_proto::paths::validate_workspace_path;
use comrak::Options;

/// Where the page being rendered lives, for resolving its links.
pub struct LinkContext<'a> {
    pub slug: &'a str,
    /// The page's directory, workspace-relative (`wiki/topics`).
    pub page_dir: &'a str,
    /// The workspace directory on disk (existence checks only).
    pub root: &'a Path,
}

/// GitHub-flavoured markdown (tables, footnotes, task lists, strikethrough, autolinks)
/// as safe HTML, citations linked.
pub fn markdown(text: &str, links: &LinkContext<'_>) -> String {
    let text = link_footnote_citations(text);
    let slug = links.slug.to_string();
    let page_dir = links.page_dir.to_string();
    let root = links.root.to_path_buf();
    let mut options = Options::default();
    options.extension.table = true;
    options.extension.footnotes = true;
    options.extension.tasklist = true;
    options.extension.strikethrough = true;
    options.extension.autolink = true;
    options.render.r#unsafe = false;
    let rewriter = move |url: &str| rewrite(url, &slug, &page_dir, &root);
    options.extension.link_url_rewriter = Some(Arc::new(rewriter.clone()));
    options.extension.image_url_rewriter = Some(Arc::new(rewriter));
    comrak::markdown_to_html(&text, &options)
}

/// `[^1]: raw/paper.pdf, p.3` → `[^1]: [raw/paper.pdf, p.3](<raw/paper.pdf#page=3>)`, so
/// the citation is a link (PDFs open at the cited page).
fn link_footnote_citations(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 64);
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        if trimmed.starts_with("[^")
            && let Some(close) = trimmed.find("]:")
        {
            let label = &trimmed[..close + 2];
            let body = trimmed[close + 2..].trim_end_matches(['\n', '\r']).trim();
            if let Some(rest) = body.strip_prefix("raw/") {
                let (path_part, tail) = match rest.find(',') {
                    Some(i) => (rest[..i].trim(), rest[i + 1..].trim()),
                    None => (rest.trim(), ""),
                };
                let path = format!("raw/{path_part}");
                let clean = !path.contains(['<', '>', '\n', '[', ']']);
                if clean {
                    let page = first_page(tail)
                        .map(|p| format!("#page={p}"))
                        .unwrap_or_default();
                    let newline = if line.ends_with('\n') { "\n" } else { "" };
                    out.push_str(&format!(
                        "{indent}{label} [{}](<{path}{page}>){newline}",
                        escape_link_text(body)
                    ));
                    continue;
                }
            }
        }
        out.push_str(line);
    }
    out
}

fn escape_link_text(text: &str) -> String {
    text.replace('\\', "\\\\")
        .replace('[', "\\[")
        .replace(']', "\\]")
}

/// `p.3`, `p. 3-5`, `pp.3-5` → 3.
fn first_page(tail: &str) -> Option<u32> {
    let rest = tail
        .strip_prefix("pp.")
        .or_else(|| tail.strip_prefix("p."))?
        .trim_start();
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// A link target as the web view serves it.
pub fn rewrite(url: &str, slug: &str, page_dir: &str, root: &Path) -> String {
    if url.starts_with('#') || url.starts_with('/') {
        return url.to_string();
    }
    if let Some(colon) = url.find(':')
        && !url[..colon].contains('/')
    {
        let scheme = url[..colon].to_ascii_lowercase();
        return if matches!(scheme.as_str(), "http" | "https" | "mailto") {
            url.to_string()
        } else {
            "#".to_string()
        };
    }
    let (path, fragment) = match url.split_once('#') {
        Some((path, fragment)) => (path, Some(fragment)),
        None => (url, None),
    };
    let path = path.split('?').next().unwrap_or(path);
    let decoded = percent_decode(path);
    let Some(resolved) = resolve_relative(&decoded, page_dir) else {
        return format!("/w/{slug}/broken/{}", encode_path(&decoded));
    };
    let fragment = fragment
        .map(|f| format!("#{}", encode_fragment(f)))
        .unwrap_or_default();
    let exists =
        validate_workspace_path(&resolved, false).is_ok() && root.join(&resolved).is_file();
    if exists {
        format!("/w/{slug}/{}{fragment}", encode_path(&resolved))
    } else {
        format!("/w/{slug}/broken/{}", encode_path(&resolved))
    }
}

/// A link relative to the page's directory (or workspace-relative when it starts with
/// `raw/` or `wiki/`), normalized; `None` if it climbs out of the workspace.
fn resolve_relative(path: &str, page_dir: &str) -> Option<String> {
    let joined = if path.starts_with("raw/") || path.starts_with("wiki/") {
        path.to_string()
    } else {
        format!("{page_dir}/{path}")
    };
    let mut parts: Vec<&str> = Vec::new();
    for part in joined.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            other => parts.push(other),
        }
    }
    (!parts.is_empty()).then(|| parts.join("/"))
}

pub fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push(h * 16 + l);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex(byte: u8) -> Option<u8> {
    match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'a'..=b'f' => Some(byte - b'a' + 10),
        b'A'..=b'F' => Some(byte - b'A' + 10),
        _ => None,
    }
}

/// Percent-encode a workspace path for a URL, keeping `/`.
pub fn encode_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for byte in path.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~/".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn encode_fragment(fragment: &str) -> String {
    let mut out = String::with_capacity(fragment.len());
    for byte in fragment.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~=&".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(text: &str, root: &Path) -> String {
        markdown(
            text,
            &LinkContext {
                slug: "acme",
                page_dir: "wiki/topics",
                root,
            },
        )
    }

    #[test]
    fn hostile_markdown_loses_its_teeth() {
        let dir = tempfile::tempdir().expect("tempdir");
        for (input, forbidden) in [
            ("<script>alert(1)</script>", "<script"),
            ("<img src=x onerror=alert(1)>", "onerror"),
            ("[x](javascript:alert(1))", "javascript:"),
            ("[x](JaVaScRiPt:alert(1))", "alert(1)"),
            ("[x](vbscript:msgbox)", "vbscript:"),
            ("<a href=\"javascript:alert(1)\">x</a>", "javascript:"),
            ("[^1]\n\n[^1]: <svg onload=alert(1)>", "onload"),
            ("# <img src=x onerror=alert(1)>", "onerror"),
            ("[x](data:text/html;base64,PHNjcmlwdD4=)", "data:text/html"),
        ] {
            let html = render(input, dir.path());
            assert!(
                !html.to_ascii_lowercase().contains(forbidden),
                "{input:?} rendered as {html:?}"
            );
        }
    }

    #[test]
    fn citations_and_links_point_into_the_workspace() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("raw")).expect("raw");
        std::fs::create_dir_all(dir.path().join("wiki/topics")).expect("wiki");
        std::fs::write(dir.path().join("raw/paper.pdf"), b"%PDF").expect("pdf");
        std::fs::write(dir.path().join("raw/my notes.md"), b"n").expect("notes");
        std::fs::write(dir.path().join("wiki/topics/b.md"), b"b").expect("b");
        let html = render(
            "See[^1] and [notes](<raw/my notes.md>) and [b](b.md) and [gone](raw/gone.md).\n\n[^1]: raw/paper.pdf, p.3\n",
            dir.path(),
        );
        assert!(
            html.contains("href=\"/w/acme/raw/paper.pdf#page=3\""),
            "{html}"
        );
        assert!(
            html.contains("href=\"/w/acme/raw/my%20notes.md\""),
            "{html}"
        );
        assert!(html.contains("href=\"/w/acme/wiki/topics/b.md\""), "{html}");
        assert!(
            html.contains("href=\"/w/acme/broken/raw/gone.md\""),
            "{html}"
        );
        assert!(html.contains("data-footnotes"), "{html}");
    }

    #[test]
    fn links_cannot_climb_out() {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = rewrite("../../../../etc/passwd", "acme", "wiki/topics", dir.path());
        assert!(url.starts_with("/w/acme/broken/"), "{url}");
        let url = rewrite("%2e%2e/%2e%2e/%2e%2e/x", "acme", "wiki", dir.path());
        assert!(url.starts_with("/w/acme/broken/"), "{url}");
    }
}
