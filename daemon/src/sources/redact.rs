//! Redaction of credentials in anything printed: URL user-info and token-like query
//! parameters become `REDACTED`, in a URL or in any text that quotes URLs.

/// Query parameter names whose values are credentials.
const SECRET_PARAMS: [&str; 14] = [
    "token",
    "access_token",
    "auth",
    "key",
    "apikey",
    "api_key",
    "secret",
    "password",
    "passwd",
    "pass",
    "sig",
    "signature",
    "session",
    "private",
];

fn is_secret_param(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    SECRET_PARAMS
        .iter()
        .any(|p| name == *p || name.ends_with(&format!("_{p}")) || name.ends_with(&format!("-{p}")))
        || name.contains("token")
}

/// `url` with user-info and token-like query values replaced by `REDACTED`.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let authority = match authority.rsplit_once('@') {
        Some((_, host)) => format!("REDACTED@{host}"),
        None => authority.to_string(),
    };
    let (before_fragment, fragment) = match tail.split_once('#') {
        Some((a, f)) => (a, Some(f)),
        None => (tail, None),
    };
    let tail = match before_fragment.split_once('?') {
        Some((path, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((name, _)) if is_secret_param(name) => format!("{name}=REDACTED"),
                    _ => pair.to_string(),
                })
                .collect();
            format!("{path}?{}", query.join("&"))
        }
        None => before_fragment.to_string(),
    };
    let mut out = format!("{scheme}://{authority}{tail}");
    if let Some(fragment) = fragment {
        out.push('#');
        out.push_str(fragment);
    }
    out
}

/// Every URL inside `text` redacted (error messages quote URLs).
pub fn redact_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        // Back up to the start of the scheme.
        let start = rest[..at]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '+' || c == '-' || c == '.'))
            .map_or(0, |i| i + 1);
        let end = rest[at..]
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>' | ')' | ','))
            .map_or(rest.len(), |i| at + i);
        out.push_str(&rest[..start]);
        out.push_str(&redact_url(&rest[start..end]));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_info_and_tokens_are_redacted() {
        for (given, wanted) in [
            (
                "https://example.org/feed.xml",
                "https://example.org/feed.xml",
            ),
            (
                "https://me:pw@example.org/f?x=1",
                "https://REDACTED@example.org/f?x=1",
            ),
            (
                "https://h/f?token=abc&page=2&api_key=k#top",
                "https://h/f?token=REDACTED&page=2&api_key=REDACTED#top",
            ),
            ("http://h?auth_token=zz", "http://h?auth_token=REDACTED"),
            ("not a url", "not a url"),
        ] {
            assert_eq!(redact_url(given), wanted, "{given}");
        }
        assert_eq!(
            redact_text("GET https://u:p@h/x?key=s failed (see http://h/y)"),
            "GET https://REDACTED@h/x?key=REDACTED failed (see http://h/y)"
        );
    }
}
