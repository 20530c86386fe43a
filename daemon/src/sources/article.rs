//! Web pages to readable markdown: decode the charset, keep the article (readability:
//! `dom_smoothie`, a port of Mozilla's readability.js, drops nav, header, footer,
//! scripts) as markdown; plain HTML fragments (feed entry content) go through
//! `dom_query`'s markdown serializer.

/// A page's readable text.
#[derive(Debug, Clone)]
pub struct Article {
    pub title: Option<String>,
    pub markdown: String,
}

/// Shortest extracted article worth keeping over the feed entry's own content.
pub const MIN_ARTICLE_CHARS: usize = 200;

/// Decode `bytes` using the charset in `content_type`, a `<meta charset>`, or a BOM;
/// UTF-8 otherwise (invalid sequences replaced, never a failure).
pub fn decode(bytes: &[u8], content_type: Option<&str>) -> String {
    let declared = content_type
        .and_then(|ct| {
            ct.split(';')
                .map(str::trim)
                .find_map(|p| p.strip_prefix("charset="))
        })
        .map(|c| c.trim_matches('"').to_string())
        .or_else(|| meta_charset(bytes));
    let encoding = declared
        .and_then(|label| encoding_rs::Encoding::for_label(label.as_bytes()))
        .unwrap_or(encoding_rs::UTF_8);
    let (text, _, _) = encoding.decode(bytes);
    text.into_owned()
}

/// The charset a page declares in its first 2 KiB (`<meta charset=…>` or
/// `http-equiv` content).
fn meta_charset(bytes: &[u8]) -> Option<String> {
    let head = &bytes[..bytes.len().min(2048)];
    let head = String::from_utf8_lossy(head).to_ascii_lowercase();
    let at = head.find("charset=")?;
    let rest = head[at + 8..].trim_start_matches(['"', '\'']);
    let end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
        .unwrap_or(rest.len());
    let label = &rest[..end];
    (!label.is_empty()).then(|| label.to_string())
}

/// The readable article of an HTML page, or `None` when nothing readable was found.
pub fn readable(html: &str, url: Option<&str>) -> Option<Article> {
    let config = dom_smoothie::Config {
        text_mode: dom_smoothie::TextMode::Markdown,
        max_elements_to_parse: 50_000,
        ..Default::default()
    };
    let url = url.filter(|u| u.starts_with("http://") || u.starts_with("https://"));
    let mut readability = dom_smoothie::Readability::new(html, url, Some(config)).ok()?;
    let article = readability.parse().ok()?;
    let markdown = tidy(&article.text_content);
    if markdown.trim().is_empty() {
        return None;
    }
    let title = Some(article.title.trim().to_string()).filter(|t| !t.is_empty());
    Some(Article { title, markdown })
}

/// An HTML fragment (a feed entry's content) as markdown.
pub fn fragment_to_markdown(html: &str) -> String {
    let document = dom_query::Document::from(html);
    tidy(&document.md(Some(&[
        "script", "style", "meta", "head", "nav", "iframe", "form",
    ])))
}

/// At most two blank lines in a row, no trailing spaces.
fn tidy(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut blank = 0;
    for line in text.lines() {
        let line = line.trim_end();
        if line.is_empty() {
            blank += 1;
            if blank > 1 {
                continue;
            }
        } else {
            blank = 0;
        }
        out.push_str(line);
        out.push('\n');
    }
    out.trim().to_string() + "\n"
}

/// Does this body look like an HTML page (not a feed)?
pub fn looks_like_html(bytes: &[u8], content_type: Option<&str>) -> bool {
    if content_type.is_some_and(|ct| ct.to_ascii_lowercase().contains("text/html")) {
        return true;
    }
    let head = String::from_utf8_lossy(&bytes[..bytes.len().min(512)]).to_ascii_lowercase();
    let head = head.trim_start_matches('\u{feff}').trim_start();
    head.starts_with("<!doctype html") || head.starts_with("<html")
}

pub fn is_pdf(bytes: &[u8], content_type: Option<&str>) -> bool {
    bytes.starts_with(b"%PDF-")
        || content_type.is_some_and(|ct| ct.to_ascii_lowercase().contains("application/pdf"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = r#"<!doctype html><html><head><title>Sea stars</title><script>var tracking = 1;</script></head>
<body><nav><a href="/">Home</a> <a href="/about">About us</a> NAVIGATIONMENU</nav>
<header>SITEHEADER banner</header>
<article><h1>Sea stars regrow arms</h1>
<p>Sea stars can regenerate lost arms over several months. The process starts with a wound healing phase, in which cells migrate to close the injury and form a protective layer.</p>
<p>After that, a blastema forms and the new arm grows from it, slowly taking on the shape and function of the lost limb. Researchers study this to learn about regeneration in general.</p>
<p>Some species can even regrow an entire body from a single arm, provided part of the central disc remains attached to it.</p>
</article>
<footer>FOOTERTEXT copyright</footer></body></html>"#;

    #[test]
    fn keeps_the_article_drops_the_chrome() {
        let article = readable(PAGE, Some("https://example.org/a")).expect("readable");
        assert!(
            article.markdown.contains("blastema"),
            "{}",
            article.markdown
        );
        for chrome in ["NAVIGATIONMENU", "FOOTERTEXT", "tracking", "SITEHEADER"] {
            assert!(
                !article.markdown.contains(chrome),
                "{chrome} in {}",
                article.markdown
            );
        }
    }

    #[test]
    fn charsets() {
        let latin1 = b"<html><head><meta charset=\"iso-8859-1\"></head><body>caf\xe9</body></html>";
        assert!(decode(latin1, None).contains("café"));
        assert!(decode(b"caf\xe9", Some("text/html; charset=windows-1252")).contains("café"));
        assert!(decode(b"ok \xff", None).contains("ok"));
    }

    #[test]
    fn fragments() {
        let md = fragment_to_markdown("<p>Hello <b>world</b></p><script>x()</script>");
        assert!(md.contains("Hello **world**"), "{md}");
        assert!(!md.contains("x()"));
    }
}
