//! The `feed` adapter: RSS 0.9x/1.0/2.0, Atom and JSON Feed (`feed-rs`), fetched with
//! a conditional GET (or read from a local file). One entry is one item; capture
//! fetches the linked article and keeps its readable text as markdown, falling back to
//! the entry's own content.
//!
//! Dedup key: the entry's id, else its link, else a hash of title and content. Never
//! an id the parser invents (feed-rs would make one up from link and title, or a random
//! UUID, so its generator is replaced by one that returns nothing).

use serde_json::json;

use super::article::{self, MIN_ARTICLE_CHARS};
use super::http::{self, Fetched, Get};
use super::{
    Fetch, Found, Item, SyncContext, SyncError, excerpt, front_matter, slugify, time_text,
};
use crate::workspace::revision;

const ACCEPT: &str = "application/atom+xml, application/rss+xml, application/feed+json, application/json;q=0.9, application/xml;q=0.9, text/xml;q=0.8, */*;q=0.5";

pub(super) fn limits(context: &SyncContext<'_>) -> http::Limits {
    let config = &context.store.config.sources;
    http::Limits {
        timeout: std::time::Duration::from_secs_f64(config.timeout_secs.max(0.1)),
        max_bytes: config.max_response_bytes,
    }
}

fn is_url(target: &str) -> bool {
    target.starts_with("http://") || target.starts_with("https://")
}

pub fn fetch(context: &SyncContext<'_>) -> Result<Fetch, SyncError> {
    let source = context.source;
    let target = source
        .config
        .targets
        .first()
        .ok_or_else(|| SyncError::new("the source has no target"))?;
    let mut outcome = Fetch::default();
    let (bytes, content_type, base) = if is_url(target) {
        let get = Get {
            url: target,
            etag: source.etag.as_deref(),
            last_modified: source.last_modified.as_deref(),
            secret: context.secret.as_ref(),
            accept: ACCEPT,
        };
        match http::get(&get, limits(context))? {
            Fetched::NotModified => {
                outcome.status = Some(304);
                return Ok(outcome);
            }
            Fetched::Body(body) => {
                outcome.status = Some(body.status);
                outcome.etag = body.etag;
                outcome.last_modified = body.last_modified;
                outcome.moved_to = body.moved_to;
                (body.bytes, body.content_type, Some(body.final_url))
            }
        }
    } else {
        let bytes = std::fs::read(target)
            .map_err(|e| SyncError::new(format!("cannot read the feed file {target}: {e}")))?;
        (bytes, None, None)
    };
    outcome.found = parse(&bytes, content_type.as_deref(), base.as_deref())?;
    Ok(outcome)
}

/// The items of a feed document.
pub fn parse(
    bytes: &[u8],
    content_type: Option<&str>,
    base: Option<&str>,
) -> Result<Vec<Found>, SyncError> {
    if article::looks_like_html(bytes, content_type) {
        return Err(SyncError::new(
            "the URL serves an HTML page, not a feed (use a url source for pages, or find the page's RSS/Atom link)",
        ));
    }
    let parser = feed_rs::parser::Builder::new()
        .base_uri(base)
        .id_generator(|_, _, _| String::new())
        .build();
    let feed = parser
        .parse(bytes)
        .map_err(|e| SyncError::new(format!("not a valid RSS, Atom or JSON feed: {e}")))?;
    let mut found = Vec::with_capacity(feed.entries.len());
    for entry in feed.entries {
        let link = entry
            .links
            .iter()
            .find(|l| l.rel.as_deref().is_none_or(|r| r == "alternate"))
            .or(entry.links.first())
            .map(|l| l.href.trim().to_string())
            .filter(|l| !l.is_empty());
        let title = entry
            .title
            .as_ref()
            .map(|t| t.content.trim().to_string())
            .filter(|t| !t.is_empty());
        let content = entry
            .content
            .as_ref()
            .and_then(|c| c.body.clone())
            .or_else(|| entry.summary.as_ref().map(|s| s.content.clone()))
            .unwrap_or_default();
        let published = entry
            .published
            .or(entry.updated)
            .map(|t| t.timestamp_millis());
        let revision = revision(
            format!(
                "{}\n{}\n{}",
                title.as_deref().unwrap_or(""),
                link.as_deref().unwrap_or(""),
                content
            )
            .as_bytes(),
        );
        let id = entry.id.trim();
        let dedup_key = if !id.is_empty() {
            format!("id:{id}")
        } else if let Some(link) = &link {
            format!("link:{link}")
        } else {
            format!("hash:{revision}")
        };
        let text = article::fragment_to_markdown(&content);
        found.push(Found {
            dedup_key,
            revision,
            title: title
                .clone()
                .or_else(|| link.clone())
                .unwrap_or_else(|| "(untitled entry)".into()),
            url: link.clone(),
            published,
            excerpt: excerpt(&text, 280),
            payload: json!({"link": link, "title": title, "content": content}),
        });
    }
    Ok(found)
}

/// The markdown (or PDF) to capture for an entry.
pub fn materialize(
    context: &SyncContext<'_>,
    item: &Item,
) -> Result<Option<(String, Vec<u8>)>, SyncError> {
    let link = item.payload["link"].as_str().map(str::to_string);
    let content = item.payload["content"].as_str().unwrap_or_default();
    let fallback = (!content.trim().is_empty()).then(|| article::fragment_to_markdown(content));
    let feed_host = context.source.config.targets.first().map(|t| host(t));
    let mut body = None;
    let mut title = item.payload["title"].as_str().map(str::to_string);
    let mut note = None;
    if let Some(link) = link.as_deref().filter(|l| is_url(l)) {
        let secret = context
            .secret
            .as_ref()
            .filter(|_| feed_host.as_deref() == Some(host(link).as_str()));
        let get = Get {
            url: link,
            etag: None,
            last_modified: None,
            secret,
            accept: "text/html, application/xhtml+xml, application/pdf;q=0.9, */*;q=0.5",
        };
        match http::get(&get, limits(context)) {
            Ok(Fetched::Body(page))
                if article::is_pdf(&page.bytes, page.content_type.as_deref()) =>
            {
                let name = format!(
                    "{}-{}.pdf",
                    date_of(item),
                    slugify(title.as_deref().unwrap_or(&item.title))
                );
                return Ok(Some((name, page.bytes)));
            }
            Ok(Fetched::Body(page)) => {
                let html = article::decode(&page.bytes, page.content_type.as_deref());
                match article::readable(&html, Some(&page.final_url)) {
                    Some(found)
                        if found.markdown.chars().count() >= MIN_ARTICLE_CHARS
                            || fallback.is_none() =>
                    {
                        if title.is_none() {
                            title = found.title;
                        }
                        body = Some(found.markdown);
                    }
                    _ => {
                        note = Some(
                            "the linked page had no readable article; this is the feed's own text",
                        )
                    }
                }
            }
            Ok(Fetched::NotModified) => {}
            Err(error) if fallback.is_some() => {
                tracing::info!(item = item.id, %error, "article fetch failed; capturing the entry's content");
                note = Some("the linked article could not be fetched; this is the feed's own text");
            }
            Err(error) => return Err(error),
        }
    }
    let body = match body.or(fallback) {
        Some(body) => body,
        None => {
            return Err(SyncError::new(
                "the entry has neither a readable link nor content",
            ));
        }
    };
    let title = title.unwrap_or_else(|| item.title.clone());
    let mut text = front_matter(&[
        ("title", Some(title.clone())),
        ("url", link.as_deref().map(super::redact_url)),
        ("published", item.published.map(time_text)),
        ("source", Some(context.source.name.clone())),
        ("item_id", Some(item.dedup_key.clone())),
        ("revision", Some(item.revision.clone())),
        ("fetched", Some(time_text(crate::db::now_ms()))),
    ]);
    text.push_str(&format!("# {title}\n\n"));
    if let Some(note) = note {
        text.push_str(&format!("> {note}\n\n"));
    }
    text.push_str(&body);
    let name = format!("{}-{}.md", date_of(item), slugify(&title));
    Ok(Some((name, text.into_bytes())))
}

fn host(url: &str) -> String {
    url.split_once("://")
        .map_or("", |(_, r)| r)
        .split(['/', '?', '#'])
        .next()
        .unwrap_or("")
        .to_ascii_lowercase()
}

/// `yyyy-mm-dd` of the item's publication (or discovery).
pub(super) fn date_of(item: &Item) -> String {
    time_text(item.published.unwrap_or(item.found_at))
        .chars()
        .take(10)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_never_invented() {
        let rss = br#"<?xml version="1.0"?><rss version="2.0"><channel><title>t</title>
<item><guid>g-1</guid><title>One</title><link>http://h/1</link><description>first</description></item>
<item><title>Two</title><link>http://h/2</link></item>
<item><title>Three</title><description>no link</description></item>
</channel></rss>"#;
        let found = parse(rss, None, None).expect("parses");
        assert_eq!(found[0].dedup_key, "id:g-1");
        assert_eq!(found[1].dedup_key, "link:http://h/2");
        assert!(found[2].dedup_key.starts_with("hash:"));
        let again = parse(rss, None, None).expect("parses");
        assert_eq!(found[2].dedup_key, again[2].dedup_key, "stable");
    }

    #[test]
    fn html_and_garbage_are_errors() {
        let error =
            parse(b"<!DOCTYPE html><html><body>hi</body></html>", None, None).expect_err("html");
        assert!(error.message.contains("HTML page"));
        let error = parse(b"<rss><channel><item>", None, None).expect_err("malformed");
        assert!(error.message.contains("not a valid"), "{}", error.message);
    }

    #[test]
    fn atom_and_json_feed() {
        let atom = br#"<?xml version="1.0" encoding="utf-8"?><feed xmlns="http://www.w3.org/2005/Atom"><title>a</title><id>urn:f</id><updated>2026-01-01T00:00:00Z</updated>
<entry><id>urn:e1</id><title>E1</title><updated>2026-01-02T00:00:00Z</updated><link href="http://h/e1"/><content type="html">&lt;p&gt;body&lt;/p&gt;</content></entry></feed>"#;
        let found = parse(atom, None, None).expect("atom");
        assert_eq!(found[0].dedup_key, "id:urn:e1");
        assert!(found[0].published.is_some());
        let json = br#"{"version":"https://jsonfeed.org/version/1.1","title":"j","items":[{"id":"1","url":"http://h/j1","content_text":"hello"}]}"#;
        let found = parse(json, Some("application/feed+json"), None).expect("json feed");
        assert_eq!(found[0].dedup_key, "id:1");
    }
}
