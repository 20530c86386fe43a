//! URL rules for the OAuth server: the public URL, redirect URIs (https, or http on a
//! loopback host, matched exactly with the loopback port ignored as RFC 8252 asks),
//! and the form and query encodings OAuth speaks. `http::Uri` parses; nothing here is
//! ever built from a request's `Host` or `X-Forwarded-*` headers.

use std::collections::HashMap;

use axum::http::Uri;

/// A parsed absolute http(s) URL (no fragment, no user info).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    pub https: bool,
    /// Lowercase, without brackets.
    pub host: String,
    pub port: Option<u16>,
    /// Path and query as given (`/` when empty).
    pub path_and_query: String,
}

impl Url {
    pub fn parse(text: &str) -> Option<Url> {
        if text.contains('#') || text.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return None;
        }
        let uri: Uri = text.parse().ok()?;
        let https = match uri.scheme_str()? {
            "https" => true,
            "http" => false,
            _ => return None,
        };
        let authority = uri.authority()?;
        if authority.as_str().contains('@') || authority.host().is_empty() {
            return None;
        }
        Some(Url {
            https,
            host: authority
                .host()
                .trim_matches(['[', ']'])
                .to_ascii_lowercase(),
            port: authority.port_u16(),
            path_and_query: uri
                .path_and_query()
                .map_or("/".to_string(), |p| p.as_str().to_string()),
        })
    }

    pub fn is_loopback(&self) -> bool {
        is_loopback_host(&self.host)
    }

    /// `scheme://host[:port]`.
    pub fn origin(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        match self.port {
            Some(port) if port != if self.https { 443 } else { 80 } => {
                format!("{scheme}://{host}:{port}")
            }
            _ => format!("{scheme}://{host}"),
        }
    }
}

pub fn is_loopback_host(host: &str) -> bool {
    matches!(host, "localhost" | "::1") || host.starts_with("127.")
}

/// Why a redirect URI cannot be registered.
pub fn check_redirect_uri(uri: &str) -> Result<(), &'static str> {
    let url = Url::parse(uri)
        .ok_or("a redirect URI must be an absolute http(s) URL without a fragment")?;
    if !url.https && !url.is_loopback() {
        return Err("a redirect URI must use https (http only on 127.0.0.1, [::1] or localhost)");
    }
    Ok(())
}

/// Whether `given` (from `/authorize`) matches the registered `registered` URI:
/// exactly, or, for http on a loopback host, with any port (RFC 8252 §7.3).
pub fn redirect_matches(registered: &str, given: &str) -> bool {
    if registered == given {
        return true;
    }
    match (Url::parse(registered), Url::parse(given)) {
        (Some(a), Some(b)) => {
            !a.https
                && !b.https
                && a.is_loopback()
                && a.host == b.host
                && a.path_and_query == b.path_and_query
        }
        _ => false,
    }
}

/// `application/x-www-form-urlencoded` (or a query string) as a map. `None` when a
/// parameter repeats (RFC 6749 §3.1) or the encoding is broken.
pub fn parse_form(text: &str) -> Option<HashMap<String, String>> {
    let mut map = HashMap::new();
    for pair in text.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let name = decode(name)?;
        let value = decode(value)?;
        if map.insert(name, value).is_some() {
            return None;
        }
    }
    Some(map)
}

fn decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = text.get(i + 1..i + 3)?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            byte => out.push(byte),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

/// Percent-encode for a query component (unreserved characters stay).
pub fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// `base` with `params` appended to its query.
pub fn with_query(base: &str, params: &[(&str, &str)]) -> String {
    let mut url = base.to_string();
    let mut separator = if base.contains('?') { '&' } else { '?' };
    for (name, value) in params {
        url.push(separator);
        url.push_str(&encode(name));
        url.push('=');
        url.push_str(&encode(value));
        separator = '&';
    }
    url
}

/// Escape text for HTML element content and quoted attribute values.
pub fn html_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirect_uris() {
        for ok in [
            "https://claude.ai/api/mcp/auth_callback",
            "http://127.0.0.1:33418/callback",
            "http://localhost/cb",
            "http://[::1]:9/cb",
        ] {
            assert!(check_redirect_uri(ok).is_ok(), "{ok}");
        }
        for bad in [
            "http://evil.example/cb",
            "ftp://x/y",
            "https://claude.ai/cb#frag",
            "https://user@claude.ai/cb",
            "/relative",
            "javascript:alert(1)",
        ] {
            assert!(check_redirect_uri(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn redirect_matching() {
        let cases = [
            ("https://claude.ai/cb", "https://claude.ai/cb", true),
            ("https://claude.ai/cb", "https://claude.ai/cb/", false),
            ("https://claude.ai/cb", "https://claude.ai:8443/cb", false),
            ("https://claude.ai/cb", "https://CLAUDE.ai/cb?x=1", false),
            (
                "http://127.0.0.1/callback",
                "http://127.0.0.1:5000/callback",
                true,
            ),
            (
                "http://127.0.0.1:1/callback",
                "http://127.0.0.1:5000/callback",
                true,
            ),
            (
                "http://127.0.0.1/callback",
                "http://127.0.0.1:5000/other",
                false,
            ),
            (
                "http://127.0.0.1/callback",
                "http://localhost:5000/callback",
                false,
            ),
            (
                "https://127.0.0.1/callback",
                "https://127.0.0.1:5000/callback",
                false,
            ),
        ];
        for (registered, given, expected) in cases {
            assert_eq!(
                redirect_matches(registered, given),
                expected,
                "{registered} vs {given}"
            );
        }
    }

    #[test]
    fn forms_and_queries() {
        let form = parse_form("a=1&b=x+y%2Fz&empty=").expect("form");
        assert_eq!(form["b"], "x y/z");
        assert_eq!(form["empty"], "");
        assert!(parse_form("a=1&a=2").is_none());
        assert!(parse_form("a=%zz").is_none());
        assert_eq!(
            with_query(
                "https://c.example/cb?x=1",
                &[("code", "a b"), ("state", "s&t")]
            ),
            "https://c.example/cb?x=1&code=a%20b&state=s%26t"
        );
        assert_eq!(
            html_escape("<a href=\"x\">'&"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;"
        );
    }

    #[test]
    fn origins() {
        let url = Url::parse("https://Wiki.Example.org:443/").expect("url");
        assert_eq!(url.origin(), "https://wiki.example.org");
        let url = Url::parse("http://127.0.0.1:4747").expect("url");
        assert_eq!(url.origin(), "http://127.0.0.1:4747");
        assert!(url.is_loopback());
    }
}
