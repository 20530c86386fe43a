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
    /// `raw/...` path as written.
    pub target: String,
    /// PDF page range cited (`p.3` → (3,3), `p.3-5` → (3,5)).
    pub pages: Option<(u32, u32)>,
}

/// Citations in a page: footnote definitions `[^n]: raw/file, p.N[-M]` and markdown
/// links `[text](raw/file)`.
pub fn citations(text: &str) -> Vec<Citation> {
    let mut found = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("[^")
            && let Some(close) = trimmed.find("]:")
        {
            let body = trimmed[close + 2..].trim();
            if let Some(rest) = body.strip_prefix("raw/") {
                let (path_part, tail) = match rest.find(',') {
                    Some(i) => (&rest[..i], rest[i + 1..].trim()),
                    None => (rest.split_whitespace().next().unwrap_or(""), ""),
                };
                let target = format!("raw/{}", path_part.trim());
                found.push(Citation {
                    target,
                    pages: parse_page_ref(tail),
                });
            }
        }
    }
    let bytes = text.as_bytes();
    let mut search = 0;
    while let Some(pos) = text[search..].find("](raw/") {
        let start = search + pos + 2;
        let Some(len) = text[start..].find([')', ' ', '\n']) else {
            break;
        };
        if bytes.get(start + len) == Some(&b')') {
            let target = &text[start..start + len];
            let target = target.split('#').next().unwrap_or(target);
            found.push(Citation {
                target: target.to_string(),
                pages: None,
            });
        }
        search = start + len;
    }
    found
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

    #[test]
    fn citations_are_found() {
        let page = "See [notes](raw/notes.md) and [^1].\n\n[^1]: raw/paper.pdf, p.3-5\n[^2]: raw/a.pdf, p. 7\n[^3]: https://example.com\n";
        let c = citations(page);
        assert_eq!(
            c,
            vec![
                Citation {
                    target: "raw/paper.pdf".into(),
                    pages: Some((3, 5))
                },
                Citation {
                    target: "raw/a.pdf".into(),
                    pages: Some((7, 7))
                },
                Citation {
                    target: "raw/notes.md".into(),
                    pages: None
                },
            ]
        );
    }
}
