//! Markdown structure: sections by ATX heading (outside fenced code), the page title,
//! and citations of raw sources.

/// One section of a markdown document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    /// Heading level 1-6; 0 for the text before the first heading.
    pub level: usize,
    /// The heading text ("" for the preamble).
    pub heading: String,
    /// Headings from the top down to this one, e.g. ["Guide", "Install"].
    pub trail: Vec<String>,
    /// Byte range of the section in the document, heading line included, up to the
    /// next heading of any level.
    pub start: usize,
    pub end: usize,
}

/// Parse an ATX heading line: `## Title ##` → (2, "Title").
fn heading(line: &str) -> Option<(usize, String)> {
    let trimmed = line.trim_start_matches(' ');
    if line.len() - trimmed.len() > 3 {
        return None;
    }
    let level = trimmed.bytes().take_while(|b| *b == b'#').count();
    if !(1..=6).contains(&level) {
        return None;
    }
    let rest = &trimmed[level..];
    if !(rest.is_empty() || rest.starts_with(' ') || rest.starts_with('\t')) {
        return None;
    }
    let text = rest.trim().trim_end_matches('#').trim_end();
    Some((level, text.to_string()))
}

/// Split a document into sections. Every byte belongs to exactly one section.
pub fn sections(text: &str) -> Vec<Section> {
    let mut result = Vec::new();
    let mut trail: Vec<(usize, String)> = Vec::new();
    let mut current = Section {
        level: 0,
        heading: String::new(),
        trail: Vec::new(),
        start: 0,
        end: 0,
    };
    let mut fence: Option<(char, usize)> = None;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let content = line.trim_end_matches(['\n', '\r']);
        let stripped = content.trim_start();
        if let Some((marker, len)) = fence {
            let run = stripped.chars().take_while(|c| *c == marker).count();
            if run >= len && stripped[run * marker.len_utf8()..].trim().is_empty() {
                fence = None;
            }
        } else if stripped.starts_with("```") || stripped.starts_with("~~~") {
            let marker = stripped.chars().next().unwrap_or('`');
            fence = Some((
                marker,
                stripped.chars().take_while(|c| *c == marker).count(),
            ));
        } else if let Some((level, text)) = heading(content) {
            current.end = offset;
            if current.end > current.start || current.level > 0 {
                result.push(current.clone());
            }
            trail.retain(|(l, _)| *l < level);
            trail.push((level, text.clone()));
            current = Section {
                level,
                heading: text,
                trail: trail.iter().map(|(_, t)| t.clone()).collect(),
                start: offset,
                end: offset,
            };
        }
        offset += line.len();
    }
    current.end = text.len();
    if current.end > current.start || current.level > 0 {
        result.push(current);
    }
    result
}

/// The first level-1 heading, else the first heading of any level.
pub fn title(text: &str) -> Option<String> {
    let all = sections(text);
    all.iter()
        .find(|s| s.level == 1)
        .or_else(|| all.iter().find(|s| s.level > 0))
        .map(|s| s.heading.clone())
}

/// The byte range of a section and its subsections, found by heading text
/// (case-insensitive) or by trail (`"Guide > Install"`).
pub fn find_section(text: &str, wanted: &str) -> Option<(usize, usize)> {
    let all = sections(text);
    let wanted_norm = wanted.trim().trim_start_matches('#').trim().to_lowercase();
    let index = all.iter().position(|s| {
        s.level > 0
            && (s.heading.to_lowercase() == wanted_norm
                || s.trail.join(" > ").to_lowercase() == wanted_norm)
    })?;
    let section = &all[index];
    let end = all[index + 1..]
        .iter()
        .find(|s| s.level <= section.level)
        .map(|s| s.start)
        .unwrap_or(text.len());
    Some((section.start, end))
}

/// A reference from a wiki page to a raw source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Citation {
    /// The `raw/...` path it names, percent-decoded (`raw/my%20notes.md` →
    /// `raw/my notes.md`). Kept as written when it does not decode to a plain path (a
    /// bad `%` sequence, an encoded `/`, `\` or NUL), so that path validation refuses it.
    pub target: String,
    /// The path as written in the page, for messages.
    pub written: String,
    /// PDF page range cited (`p.3` → (3,3), `p.3-5` → (3,5)).
    pub pages: Option<(u32, u32)>,
}

impl Citation {
    fn new(written: &str, pages: Option<(u32, u32)>) -> Citation {
        Citation {
            target: percent_decode(written).unwrap_or_else(|| written.to_string()),
            written: written.to_string(),
            pages,
        }
    }
}

/// Citations in a page: footnote definitions `[^n]: raw/file, p.N[-M]` (or
/// `[^n]: <raw/my file.pdf>, p.N`) and inline links `[text](raw/file)`,
/// `[text](raw/my%20file.md)`, `[text](<raw/my file.md> "title")`.
pub fn citations(text: &str) -> Vec<Citation> {
    let mut found = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("[^")
            && let Some(close) = trimmed.find("]:")
        {
            let body = trimmed[close + 2..].trim();
            let (path, tail) = if let Some(inside) = body.strip_prefix('<') {
                let Some(end) = inside.find('>') else {
                    continue;
                };
                let tail = inside[end + 1..].trim_start();
                (
                    &inside[..end],
                    tail.strip_prefix(',').unwrap_or(tail).trim(),
                )
            } else {
                match body.find(',') {
                    Some(i) => (body[..i].trim(), body[i + 1..].trim()),
                    None => (body.split_whitespace().next().unwrap_or(""), ""),
                }
            };
            if path.starts_with("raw/") {
                found.push(Citation::new(path, parse_page_ref(tail)));
            }
        }
    }
    let mut search = 0;
    while let Some(pos) = text[search..].find("](") {
        let start = search + pos + 2;
        search = start;
        if let Some((destination, used)) = link_destination(&text[start..]) {
            search = start + used;
            let path = destination.split('#').next().unwrap_or(&destination);
            if path.starts_with("raw/") {
                found.push(Citation::new(path, None));
            }
        }
    }
    found
}

/// The destination of an inline link, read from just after `](` as CommonMark does
/// (optional spaces, `<…>` or a bare destination with balanced parentheses, an
/// optional title, then `)`), with backslash escapes resolved; and the bytes used.
/// `None` when this is not a well-formed inline link.
fn link_destination(text: &str) -> Option<(String, usize)> {
    let bytes = text.as_bytes();
    let mut i = skip_space(bytes, 0);
    let mut destination = Vec::new();
    if bytes.get(i) == Some(&b'<') {
        i += 1;
        loop {
            match *bytes.get(i)? {
                b'>' => break,
                b'<' | b'\n' => return None,
                b'\\' if bytes.get(i + 1).is_some_and(u8::is_ascii_punctuation) => {
                    destination.push(bytes[i + 1]);
                    i += 1;
                }
                byte => destination.push(byte),
            }
            i += 1;
        }
        i += 1;
    } else {
        let mut depth = 0usize;
        while let Some(&byte) = bytes.get(i) {
            match byte {
                _ if byte.is_ascii_whitespace() || byte.is_ascii_control() => break,
                b'(' => depth += 1,
                b')' if depth == 0 => break,
                b')' => depth -= 1,
                b'\\' if bytes.get(i + 1).is_some_and(u8::is_ascii_punctuation) => i += 1,
                _ => {}
            }
            destination.push(bytes[i]);
            i += 1;
        }
        if depth > 0 || destination.is_empty() {
            return None;
        }
    }
    i = skip_space(bytes, i);
    let close = match *bytes.get(i)? {
        b')' => return Some((String::from_utf8(destination).ok()?, i + 1)),
        b'"' => b'"',
        b'\'' => b'\'',
        b'(' => b')',
        _ => return None,
    };
    i += 1;
    loop {
        match *bytes.get(i)? {
            b'\\' => i += 1,
            byte if byte == close => break,
            _ => {}
        }
        i += 1;
    }
    i = skip_space(bytes, i + 1);
    if bytes.get(i) != Some(&b')') {
        return None;
    }
    Some((String::from_utf8(destination).ok()?, i + 1))
}

/// Past spaces, tabs and at most one line break, from `i`.
fn skip_space(bytes: &[u8], mut i: usize) -> usize {
    let mut line_break = false;
    while let Some(&byte) = bytes.get(i) {
        match byte {
            b' ' | b'\t' => {}
            b'\n' if !line_break => line_break = true,
            _ => break,
        }
        i += 1;
    }
    i
}

/// Percent-decode a link path (`my%20notes.md` → `my notes.md`). `None` when a `%`
/// is not followed by two hex digits, the result is not UTF-8, or it encodes `/`,
/// `\` or NUL: no file name holds those, so encoding one is an attempt to escape.
fn percent_decode(text: &str) -> Option<String> {
    if !text.contains('%') {
        return Some(text.to_string());
    }
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            if !hex.iter().all(u8::is_ascii_hexdigit) {
                return None;
            }
            let value = u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?;
            if matches!(value, b'/' | b'\\' | 0) {
                return None;
            }
            decoded.push(value);
            i += 3;
        } else {
            decoded.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(decoded).ok()
}

/// `p.3` / `p. 3-5` / `pp.3-5` → page range.
fn parse_page_ref(text: &str) -> Option<(u32, u32)> {
    let rest = text
        .strip_prefix("pp.")
        .or_else(|| text.strip_prefix("p."))?
        .trim_start();
    let digits: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '-' || *c == '–')
        .collect();
    let mut parts = digits.split(['-', '–']);
    let from: u32 = parts.next()?.parse().ok()?;
    let to: u32 = match parts.next() {
        Some(t) => t.parse().ok()?,
        None => from,
    };
    Some((from, to))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "intro\n# Title\ntext\n## Install\nsteps\n```\n# not a heading\n```\n### Deep\nx\n## Usage\ny\n";

    #[test]
    fn sections_follow_headings_outside_fences() {
        let s = sections(DOC);
        let headings: Vec<_> = s.iter().map(|s| (s.level, s.heading.as_str())).collect();
        assert_eq!(
            headings,
            vec![
                (0, ""),
                (1, "Title"),
                (2, "Install"),
                (3, "Deep"),
                (2, "Usage")
            ]
        );
        assert_eq!(s[3].trail, vec!["Title", "Install", "Deep"]);
        let covered: usize = s.iter().map(|s| s.end - s.start).sum();
        assert_eq!(covered, DOC.len());
    }

    #[test]
    fn find_section_includes_subsections() {
        let (a, b) = find_section(DOC, "install").expect("found");
        let body = &DOC[a..b];
        assert!(body.starts_with("## Install"));
        assert!(body.contains("### Deep"));
        assert!(!body.contains("## Usage"));
        assert!(find_section(DOC, "Title > Install").is_some());
        assert!(find_section(DOC, "missing").is_none());
        assert_eq!(title(DOC).as_deref(), Some("Title"));
    }

    fn targets(page: &str) -> Vec<(String, String)> {
        citations(page)
            .into_iter()
            .map(|c| (c.target, c.written))
            .collect()
    }

    #[test]
    fn citations_are_found() {
        let page = "See [notes](raw/notes.md) and [^1].\n\n[^1]: raw/paper.pdf, p.3-5\n[^2]: raw/a.pdf, p. 7\n[^3]: https://example.com\n";
        let c = citations(page);
        let cited: Vec<_> = c.iter().map(|c| (c.target.as_str(), c.pages)).collect();
        assert_eq!(
            cited,
            vec![
                ("raw/paper.pdf", Some((3, 5))),
                ("raw/a.pdf", Some((7, 7))),
                ("raw/notes.md", None),
            ]
        );
    }

    #[test]
    fn link_destinations_follow_commonmark() {
        let pair = |t: &str, w: &str| (t.to_string(), w.to_string());
        for (page, expected) in [
            (
                "[a](raw/my%20notes.md)",
                pair("raw/my notes.md", "raw/my%20notes.md"),
            ),
            (
                "[a](<raw/my notes.md>)",
                pair("raw/my notes.md", "raw/my notes.md"),
            ),
            (
                "[a]( <raw/my notes.md> \"t\" )",
                pair("raw/my notes.md", "raw/my notes.md"),
            ),
            ("[a](raw/x.md 'title')", pair("raw/x.md", "raw/x.md")),
            ("[a](raw/x.md (title))", pair("raw/x.md", "raw/x.md")),
            (
                "[a](raw/paper(1).pdf)",
                pair("raw/paper(1).pdf", "raw/paper(1).pdf"),
            ),
            (
                "[a](raw/paper\\(1.pdf)",
                pair("raw/paper(1.pdf", "raw/paper(1.pdf"),
            ),
            ("[a](raw/x.pdf#page=2)", pair("raw/x.pdf", "raw/x.pdf")),
            (
                "![fig](raw/caf%C3%A9.png)",
                pair("raw/caf\u{e9}.png", "raw/caf%C3%A9.png"),
            ),
            (
                "[^1]: <raw/my notes.pdf>, p.2",
                pair("raw/my notes.pdf", "raw/my notes.pdf"),
            ),
            (
                "[^1]: raw/my%20notes.md",
                pair("raw/my notes.md", "raw/my%20notes.md"),
            ),
        ] {
            assert_eq!(targets(page), vec![expected], "{page}");
        }
        assert_eq!(
            citations("[^1]: <raw/my notes.pdf>, p.2")[0].pages,
            Some((2, 2))
        );
        // Not links, or not to raw/.
        for page in [
            "[a](raw/x.md",
            "[a](<raw/x.md)",
            "[a](raw/x.md \"unclosed)",
            "[a](raw/x.md junk)",
            "[a](wiki/x.md)",
            "[a](https://example.com/raw/x)",
            "[a]()",
        ] {
            assert_eq!(targets(page), vec![], "{page}");
        }
    }

    #[test]
    fn encoded_escapes_stay_as_written() {
        for written in [
            "raw/%2e%2e/config.toml",
            "raw/a%2fb.md",
            "raw/a%2Fb.md",
            "raw/a%5cb.md",
            "raw/a%00b.md",
            "raw/a%zz.md",
            "raw/a%2.md",
            "raw/a%+f.md",
            "raw/a%ff.md",
        ] {
            let cited = citations(&format!("[x]({written})"));
            let expected = if written.contains("%2e") {
                "raw/../config.toml".to_string()
            } else {
                written.to_string()
            };
            assert_eq!(cited[0].target, expected, "{written}");
            assert!(
                alexandria_proto::paths::validate_workspace_path(&cited[0].target, false).is_err(),
                "{written} must stay refused"
            );
        }
    }
}
