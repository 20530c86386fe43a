//! The `url` adapter: one or more web pages. One item is a page that is new or whose
//! extracted text changed; dedup on the normalized URL (no fragment, no `utm_*`).
//! Conditional-request state is kept per page in the cursor. A PDF behind a URL is
//! captured as the PDF itself.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::article;
use super::feed::{date_of, limits};
use super::http::{self, Fetched, Get};
use super::{
    Fetch, Found, Item, SyncContext, SyncError, excerpt, front_matter, slugify, time_text,
};
use crate::workspace::revision;

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct PageState {
    etag: Option<String>,
    last_modified: Option<String>,
}

/// The URL without its fragment and `utm_*` parameters.
pub fn normalize(url: &str) -> String {
    let url = url.split('#').next().unwrap_or(url);
    match url.split_once('?') {
        Some((base, query)) => {
            let kept: Vec<&str> = query
                .split('&')
                .filter(|p| !p.is_empty() && !p.to_ascii_lowercase().starts_with("utm_"))
                .collect();
            if kept.is_empty() {
                base.to_string()
            } else {
                format!("{base}?{}", kept.join("&"))
            }
        }
        None => url.to_string(),
    }
}

pub fn fetch(context: &SyncContext<'_>) -> Result<Fetch, SyncError> {
    let source = context.source;
    let mut pages: BTreeMap<String, PageState> = source
        .cursor
        .as_deref()
        .and_then(|c| serde_json::from_str(c).ok())
        .unwrap_or_default();
    let mut outcome = Fetch::default();
    let mut first_error = None;
    for target in &source.config.targets {
        let state = pages.get(target).cloned().unwrap_or_default();
        let get = Get {
            url: target,
            etag: state.etag.as_deref(),
            last_modified: state.last_modified.as_deref(),
            secret: context.secret.as_ref(),
            accept: "text/html, application/xhtml+xml, application/pdf;q=0.9, text/plain;q=0.8, */*;q=0.5",
        };
        let body = match http::get(&get, limits(context)) {
            Ok(Fetched::NotModified) => continue,
            Ok(Fetched::Body(body)) => body,
            Err(error) => {
                first_error.get_or_insert(error);
                continue;
            }
        };
        outcome.status = Some(body.status);
        pages.insert(
            target.clone(),
            PageState {
                etag: body.etag.clone(),
                last_modified: body.last_modified.clone(),
            },
        );
        let key = format!("url:{}", normalize(target));
        if article::is_pdf(&body.bytes, body.content_type.as_deref()) {
            outcome.found.push(Found {
                dedup_key: key,
                revision: revision(&body.bytes),
                title: target.clone(),
                url: Some(target.clone()),
                published: None,
                excerpt: format!("PDF, {} bytes", body.bytes.len()),
                payload: json!({"url": target, "pdf": true}),
            });
            continue;
        }
        let text = article::decode(&body.bytes, body.content_type.as_deref());
        let is_html = article::looks_like_html(&body.bytes, body.content_type.as_deref())
            || text.trim_start().starts_with('<');
        let (title, markdown) = if is_html {
            match article::readable(&text, Some(&body.final_url)) {
                Some(found) => (found.title, found.markdown),
                None => (None, article::fragment_to_markdown(&text)),
            }
        } else {
            (None, text)
        };
        outcome.found.push(Found {
            dedup_key: key,
            revision: revision(markdown.as_bytes()),
            title: title.clone().unwrap_or_else(|| target.clone()),
            url: Some(target.clone()),
            published: None,
            excerpt: excerpt(&markdown, 280),
            payload: json!({"url": target, "title": title, "markdown": markdown}),
        });
    }
    if outcome.found.is_empty()
        && let Some(error) = first_error
    {
        return Err(error);
    }
    if let Some(error) = first_error {
        tracing::warn!(source = %source.name, %error, "a page of the source failed");
    }
    outcome.cursor = Some(serde_json::to_string(&pages).unwrap_or_default());
    Ok(outcome)
}

pub fn materialize(
    context: &SyncContext<'_>,
    item: &Item,
) -> Result<Option<(String, Vec<u8>)>, SyncError> {
    let url = item.payload["url"].as_str().unwrap_or_default();
    let title = item.payload["title"]
        .as_str()
        .unwrap_or(&item.title)
        .to_string();
    if item.payload["pdf"].as_bool() == Some(true) {
        let get = Get {
            url,
            etag: None,
            last_modified: None,
            secret: context.secret.as_ref(),
            accept: "application/pdf",
        };
        return match http::get(&get, limits(context))? {
            Fetched::Body(body) if revision(&body.bytes) == item.revision => {
                let name = url
                    .rsplit('/')
                    .next()
                    .unwrap_or("page")
                    .trim_end_matches(".pdf");
                Ok(Some((
                    format!("{}-{}.pdf", date_of(item), slugify(name)),
                    body.bytes,
                )))
            }
            _ => Ok(None),
        };
    }
    let markdown = item.payload["markdown"].as_str().unwrap_or_default();
    let mut text = front_matter(&[
        ("title", Some(title.clone())),
        ("url", Some(super::redact_url(url))),
        ("source", Some(context.source.name.clone())),
        ("item_id", Some(item.dedup_key.clone())),
        ("revision", Some(item.revision.clone())),
        ("fetched", Some(time_text(item.found_at))),
    ]);
    text.push_str(&format!("# {title}\n\n{markdown}"));
    Ok(Some((
        format!("{}-{}.md", date_of(item), slugify(&title)),
        text.into_bytes(),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalized() {
        assert_eq!(
            normalize("https://h/a?utm_source=x&id=3#frag"),
            "https://h/a?id=3"
        );
        assert_eq!(normalize("https://h/a?utm_medium=y"), "https://h/a");
        assert_eq!(normalize("https://h/a"), "https://h/a");
    }
}
