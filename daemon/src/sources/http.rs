//! HTTP for source adapters: one conditional GET with a timeout and a size limit,
//! redirects followed by hand (so that a permanent move can rewrite the stored URL and
//! a loop ends in an error), `Retry-After` read on 429/503, credentials sent only to
//! the original host, and every URL in an error message redacted.
//!
//! ureq (blocking) rather than reqwest: syncs run on their own threads, one per source,
//! so an async client would only add a runtime hop; ureq with rustls over ring reuses
//! the ring already in the tree for tokens.

use std::sync::OnceLock;
use std::time::Duration;

use super::SyncError;
use super::redact::redact_url;
use super::secret::Secret;

/// Most redirects followed for one request.
const MAX_REDIRECTS: usize = 5;

/// Limits from `[sources]` in config.toml.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub timeout: Duration,
    pub max_bytes: u64,
}

/// One GET.
pub struct Get<'a> {
    pub url: &'a str,
    pub etag: Option<&'a str>,
    pub last_modified: Option<&'a str>,
    pub secret: Option<&'a Secret>,
    pub accept: &'a str,
}

/// A response that was not an error.
#[derive(Debug)]
pub enum Fetched {
    /// 304: nothing new.
    NotModified,
    Body(Body),
}

#[derive(Debug)]
pub struct Body {
    pub status: u16,
    /// Where the body came from after redirects.
    pub final_url: String,
    /// Set when every redirect on the way was permanent (301/308).
    pub moved_to: Option<String>,
    pub content_type: Option<String>,
    pub etag: Option<String>,
    pub last_modified: Option<String>,
    pub bytes: Vec<u8>,
}

fn agent(limits: Limits) -> ureq::Agent {
    // One agent per timeout (connection pool shared by every source).
    static AGENT: OnceLock<(Duration, ureq::Agent)> = OnceLock::new();
    let (timeout, agent) = AGENT.get_or_init(|| (limits.timeout, build(limits.timeout)));
    if *timeout == limits.timeout {
        agent.clone()
    } else {
        build(limits.timeout)
    }
}

fn build(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .max_redirects(0)
        .http_status_as_error(false)
        .timeout_global(Some(timeout))
        .user_agent(format!(
            "alexandria/{} (+https://github.com/alexandria-wiki)",
            alexandria_proto::BUILD
        ))
        .build()
        .new_agent()
}

fn host_of(url: &str) -> String {
    url.split_once("://")
        .map_or("", |(_, r)| r)
        .split(['/', '?', '#'])
        .next()
        .unwrap_or("")
        .to_ascii_lowercase()
}

/// `location` resolved against `base`.
pub fn join(base: &str, location: &str) -> String {
    if location.contains("://") {
        return location.to_string();
    }
    let (scheme, rest) = base.split_once("://").unwrap_or(("http", base));
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    if let Some(net) = location.strip_prefix("//") {
        return format!("{scheme}://{net}");
    }
    if location.starts_with('/') {
        return format!("{scheme}://{authority}{location}");
    }
    let path = rest[authority_end..].split(['?', '#']).next().unwrap_or("");
    let dir = match path.rfind('/') {
        Some(i) => &path[..=i],
        None => "/",
    };
    format!("{scheme}://{authority}{dir}{location}")
}

/// Parse `Retry-After`: seconds, or an HTTP date.
fn retry_after(value: &str) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    let wait = at.timestamp() - chrono::Utc::now().timestamp();
    Some(Duration::from_secs(wait.max(0) as u64))
}

fn error(message: String, status: Option<u16>, secret: Option<&Secret>) -> SyncError {
    let mut error = SyncError::new(message);
    if let Some(secret) = secret {
        error.message = secret.scrub(&error.message);
    }
    error.status = status;
    error
}

/// GET `request.url`; 304 is `NotModified`; other non-2xx answers are errors.
pub fn get(request: &Get<'_>, limits: Limits) -> Result<Fetched, SyncError> {
    let agent = agent(limits);
    let origin_host = host_of(request.url);
    let mut url = request.url.to_string();
    let mut permanent = true;
    let mut seen = vec![url.clone()];
    for _ in 0..=MAX_REDIRECTS {
        let mut builder = agent.get(&url).header("Accept", request.accept);
        if let Some(etag) = request.etag {
            builder = builder.header("If-None-Match", etag);
        }
        if let Some(since) = request.last_modified {
            builder = builder.header("If-Modified-Since", since);
        }
        if let Some(secret) = request.secret
            && host_of(&url) == origin_host
        {
            builder = builder.header("Authorization", secret.authorization());
        }
        let shown = redact_url(&url);
        let mut response = builder.call().map_err(|e| {
            let message = match &e {
                ureq::Error::Timeout(_) => format!(
                    "{shown}: no complete answer within {}s (timeout)",
                    limits.timeout.as_secs()
                ),
                ureq::Error::HostNotFound => format!("{shown}: host not found"),
                ureq::Error::ConnectionFailed => format!("{shown}: connection failed"),
                other => format!("{shown}: {other}"),
            };
            error(message, None, request.secret)
        })?;
        let status = response.status().as_u16();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        match status {
            304 => return Ok(Fetched::NotModified),
            301 | 302 | 303 | 307 | 308 => {
                let Some(location) = header("location") else {
                    return Err(error(
                        format!("{shown}: HTTP {status} without a Location"),
                        Some(status),
                        request.secret,
                    ));
                };
                if !matches!(status, 301 | 308) {
                    permanent = false;
                }
                url = join(&url, &location);
                if seen.contains(&url) {
                    return Err(error(
                        format!("{shown}: redirect loop"),
                        Some(status),
                        request.secret,
                    ));
                }
                seen.push(url.clone());
                continue;
            }
            200..=299 => {
                let content_type = header("content-type");
                let etag = header("etag");
                let last_modified = header("last-modified");
                let bytes = response
                    .body_mut()
                    .with_config()
                    .limit(limits.max_bytes)
                    .read_to_vec()
                    .map_err(|e| {
                        let message = match e {
                            ureq::Error::BodyExceedsLimit(_) => format!(
                                "{shown}: the response is larger than {} bytes, refused ([sources] max_response_bytes)",
                                limits.max_bytes
                            ),
                            ureq::Error::Timeout(_) => format!(
                                "{shown}: no complete answer within {}s (timeout)",
                                limits.timeout.as_secs()
                            ),
                            other => format!("{shown}: reading the body: {other}"),
                        };
                        error(message, Some(status), request.secret)
                    })?;
                let moved_to = (permanent && seen.len() > 1).then(|| url.clone());
                return Ok(Fetched::Body(Body {
                    status,
                    final_url: url,
                    moved_to,
                    content_type,
                    etag,
                    last_modified,
                    bytes,
                }));
            }
            _ => {
                let mut failure = error(
                    format!(
                        "{shown}: HTTP {status}{}",
                        match status {
                            401 | 403 =>
                                " (set or check the credential: alexandria source secret <workspace> <name>)",
                            404 | 410 => " (gone: check the URL)",
                            429 => " (too many requests)",
                            _ => "",
                        }
                    ),
                    Some(status),
                    request.secret,
                );
                if matches!(status, 429 | 503) {
                    failure.retry_after = header("retry-after").as_deref().and_then(retry_after);
                }
                return Err(failure);
            }
        }
    }
    Err(error(
        format!(
            "{}: more than {MAX_REDIRECTS} redirects",
            redact_url(request.url)
        ),
        None,
        request.secret,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_resolve() {
        assert_eq!(join("http://h:1/a/b?x", "/c"), "http://h:1/c");
        assert_eq!(join("http://h:1/a/b", "c"), "http://h:1/a/c");
        assert_eq!(join("http://h:1", "c"), "http://h:1/c");
        assert_eq!(join("https://h/a", "//g/x"), "https://g/x");
        assert_eq!(join("https://h/a", "http://o/p"), "http://o/p");
    }

    #[test]
    fn retry_after_forms() {
        assert_eq!(retry_after("120"), Some(Duration::from_secs(120)));
        assert_eq!(
            retry_after("Wed, 21 Oct 2015 07:28:00 GMT"),
            Some(Duration::ZERO)
        );
        assert_eq!(retry_after("soon"), None);
    }
}
