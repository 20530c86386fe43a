//! OAuth Client ID Metadata Documents (MCP authorization 2025-11-25, "CIMD"): a client
//! whose `client_id` is an https URL publishes its metadata there, so it needs no
//! registration. Claude.ai uses `https://claude.ai/oauth/mcp-oauth-client-metadata`
//! when the server advertises support (otherwise it registers a new client on every
//! fresh connection).
//!
//! The fetch is guarded, because the URL comes from whoever calls `/authorize`:
//! https only (plain http only to a loopback host, and only while the daemon's own
//! public URL is loopback, i.e. in tests); every address the host resolves to must be
//! public (no loopback, private, link-local, CGNAT, unique-local, multicast or
//! unspecified address: no way to make the daemon probe the user's network); no
//! redirects; 5 s; at most 64 KiB. The document must name itself as `client_id`, list
//! https or loopback redirect URIs, and be a public client (`none`).
//!
//! A fetched document is kept for an hour in memory and recorded in `oauth_clients`
//! (so `remote clients`, the web view's `/access` page and revoke see it); when a
//! refresh finds the document host down, the recorded copy is used.

use std::collections::HashMap;
use std::net::{IpAddr, ToSocketAddrs};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::urls::{Url, check_redirect_uri};

/// How long a fetched document is trusted before it is fetched again.
const FRESH: Duration = Duration::from_secs(3600);
const TIMEOUT: Duration = Duration::from_secs(5);
const MAX_BYTES: u64 = 64 * 1024;

/// What a valid document says.
#[derive(Debug, Clone)]
pub struct Document {
    pub client_id: String,
    pub name: Option<String>,
    pub redirect_uris: Vec<String>,
    pub raw: Value,
}

/// Whether `client_id` is a metadata document URL (rather than a registered id).
pub fn is_document_url(client_id: &str) -> bool {
    client_id.starts_with("https://") || client_id.starts_with("http://")
}

fn cache() -> &'static Mutex<HashMap<String, (Instant, Document)>> {
    static CACHE: OnceLock<Mutex<HashMap<String, (Instant, Document)>>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// A fresh document from the memory cache.
pub fn cached(client_id: &str) -> Option<Document> {
    let cache = cache().lock().unwrap_or_else(|p| p.into_inner());
    cache
        .get(client_id)
        .filter(|(at, _)| at.elapsed() < FRESH)
        .map(|(_, document)| document.clone())
}

/// Forget a document (its client was revoked).
pub fn forget(client_id: &str) {
    cache()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(client_id);
}

/// Fetch and check the document at `client_id`. `allow_loopback`: the daemon's public
/// URL is itself loopback (tests), so loopback http documents are accepted.
pub fn fetch(client_id: &str, allow_loopback: bool) -> Result<Document, String> {
    let url = Url::parse(client_id).ok_or("the client_id is not a valid http(s) URL")?;
    if url.path_and_query == "/" {
        return Err("a client metadata document URL needs a path".into());
    }
    if url.path_and_query.contains('?') {
        return Err("a client metadata document URL must not have a query".into());
    }
    let loopback_ok = allow_loopback && url.is_loopback();
    if !url.https && !loopback_ok {
        return Err("a client metadata document must be served over https".into());
    }
    let port = url.port.unwrap_or(if url.https { 443 } else { 80 });
    let addresses: Vec<IpAddr> = (url.host.as_str(), port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {}: {e}", url.host))?
        .map(|a| a.ip())
        .collect();
    if addresses.is_empty() {
        return Err(format!("{} resolves to no address", url.host));
    }
    if let Some(bad) = addresses
        .iter()
        .find(|ip| !(is_public(ip) || (loopback_ok && ip.is_loopback())))
    {
        return Err(format!(
            "{} resolves to {bad}, a private or local address: refused",
            url.host
        ));
    }
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .max_redirects(0)
        .http_status_as_error(false)
        .timeout_global(Some(TIMEOUT))
        .build()
        .into();
    let mut response = agent
        .get(client_id)
        .header("accept", "application/json")
        .call()
        .map_err(|e| format!("fetching the client metadata document failed: {e}"))?;
    let status = response.status().as_u16();
    if status != 200 {
        return Err(format!(
            "the client metadata document answered HTTP {status}"
        ));
    }
    let bytes = response
        .body_mut()
        .with_config()
        .limit(MAX_BYTES)
        .read_to_vec()
        .map_err(|e| format!("reading the client metadata document failed: {e}"))?;
    let document = parse(client_id, &bytes)?;
    cache()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(client_id.to_string(), (Instant::now(), document.clone()));
    Ok(document)
}

/// Check a document's content.
pub fn parse(client_id: &str, bytes: &[u8]) -> Result<Document, String> {
    let raw: Value = serde_json::from_slice(bytes)
        .map_err(|e| format!("the client metadata document is not JSON: {e}"))?;
    if raw["client_id"].as_str() != Some(client_id) {
        return Err("the document's client_id is not the URL it was fetched from".into());
    }
    match raw["token_endpoint_auth_method"].as_str() {
        None | Some("none") => {}
        Some(other) => {
            return Err(format!(
                "token_endpoint_auth_method {other} is not supported for metadata documents (use none, with PKCE)"
            ));
        }
    }
    let redirect_uris: Vec<String> = raw["redirect_uris"]
        .as_array()
        .ok_or("the document lists no redirect_uris")?
        .iter()
        .map(|v| v.as_str().map(str::to_string))
        .collect::<Option<_>>()
        .ok_or("redirect_uris must be strings")?;
    if redirect_uris.is_empty() {
        return Err("the document lists no redirect_uris".into());
    }
    for uri in &redirect_uris {
        check_redirect_uri(uri).map_err(|why| format!("redirect URI {uri}: {why}"))?;
    }
    let name = raw["client_name"]
        .as_str()
        .map(|n| n.chars().take(100).collect());
    Ok(Document {
        client_id: client_id.to_string(),
        name,
        redirect_uris,
        raw,
    })
}

/// A globally routable address: not loopback, private, link-local, shared (CGNAT),
/// documentation, benchmarking, unique-local, multicast, broadcast or unspecified.
pub fn is_public(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, c, _] = v4.octets();
            !(v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.is_documentation()
                || a == 0
                || (a == 100 && (64..128).contains(&b))
                || (a == 192 && b == 0 && c == 0)
                || (a == 198 && (b == 18 || b == 19))
                || a >= 240)
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_public(&IpAddr::V4(v4));
            }
            let first = v6.segments()[0];
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80
                || first == 0x2001 && v6.segments()[1] == 0x0db8)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_public_addresses_pass() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
        ] {
            let ip: IpAddr = ip.parse().expect("ip");
            assert!(!is_public(&ip), "{ip} must be refused");
        }
        for ip in ["160.79.104.10", "1.1.1.1", "2606:4700::1111"] {
            let ip: IpAddr = ip.parse().expect("ip");
            assert!(is_public(&ip), "{ip} is public");
        }
    }

    #[test]
    fn documents_must_name_themselves_and_list_safe_redirects() {
        let url = "https://claude.ai/oauth/mcp-oauth-client-metadata";
        let good = serde_json::json!({"client_id": url, "client_name": "Claude",
            "redirect_uris": ["https://claude.ai/api/mcp/auth_callback"],
            "token_endpoint_auth_method": "none"});
        let document = parse(url, good.to_string().as_bytes()).expect("valid");
        assert_eq!(document.name.as_deref(), Some("Claude"));
        let other = serde_json::json!({"client_id": "https://evil.example/x",
            "redirect_uris": ["https://claude.ai/cb"]});
        assert!(parse(url, other.to_string().as_bytes()).is_err());
        let plain =
            serde_json::json!({"client_id": url, "redirect_uris": ["http://evil.example/cb"]});
        assert!(parse(url, plain.to_string().as_bytes()).is_err());
        let secret = serde_json::json!({"client_id": url, "redirect_uris": ["https://claude.ai/cb"],
            "token_endpoint_auth_method": "private_key_jwt"});
        assert!(parse(url, secret.to_string().as_bytes()).is_err());
        assert!(parse(url, b"not json").is_err());
    }

    #[test]
    fn private_and_plain_http_documents_are_refused_before_any_request() {
        assert!(fetch("http://example.com/meta", false).is_err());
        let local = fetch("https://127.0.0.1/meta", false).expect_err("loopback refused");
        assert!(local.contains("private or local"), "{local}");
        assert!(fetch("https://claude.ai", false).is_err(), "no path");
    }
}
