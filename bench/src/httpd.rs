//! A tiny HTTP/1.1 server on `127.0.0.1:0` for offline fixtures (source adapter tests
//! and the feed benchmark): fixed routes that answer a body (with an ETag, honouring
//! `If-None-Match`), a status with headers (304, 429 + Retry-After, 500, redirects), or
//! a body after a delay; every request is recorded with its headers.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How a route answers.
#[derive(Debug, Clone)]
pub enum Route {
    /// 200 with this body; with an ETag, a matching `If-None-Match` gets 304.
    Body {
        content_type: String,
        body: Vec<u8>,
        etag: Option<String>,
        /// `Authorization` header required (else 401).
        auth: Option<String>,
    },
    /// This status and headers, empty body.
    Status {
        code: u16,
        headers: Vec<(String, String)>,
    },
    /// 200 with this body, after a delay.
    Slow { delay: Duration, body: Vec<u8> },
}

impl Route {
    pub fn body(content_type: &str, body: impl Into<Vec<u8>>) -> Route {
        Route::Body {
            content_type: content_type.into(),
            body: body.into(),
            etag: None,
            auth: None,
        }
    }

    pub fn with_etag(mut self, tag: &str) -> Route {
        if let Route::Body { etag, .. } = &mut self {
            *etag = Some(format!("\"{tag}\""));
        }
        self
    }

    pub fn with_auth(mut self, header: &str) -> Route {
        if let Route::Body { auth, .. } = &mut self {
            *auth = Some(header.to_string());
        }
        self
    }

    pub fn status(code: u16, headers: &[(&str, &str)]) -> Route {
        Route::Status {
            code,
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }
}

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub path: String,
    /// Header names lowercased.
    pub headers: HashMap<String, String>,
}

/// The server; it runs until the process exits.
#[derive(Clone)]
pub struct Server {
    pub address: String,
    routes: Arc<Mutex<HashMap<String, Route>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Server {
    pub fn start() -> std::io::Result<Server> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let server = Server {
            address: format!("http://{}", listener.local_addr()?),
            routes: Arc::default(),
            seen: Arc::default(),
        };
        let handle = server.clone();
        std::thread::Builder::new()
            .name("fixture-httpd".into())
            .spawn(move || {
                for stream in listener.incoming().flatten() {
                    let handle = handle.clone();
                    std::thread::spawn(move || {
                        let _ = handle.serve(stream);
                    });
                }
            })?;
        Ok(server)
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.address)
    }

    pub fn route(&self, path: &str, route: Route) {
        self.routes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(path.to_string(), route);
    }

    /// Every request for `path` so far.
    pub fn requests(&self, path: &str) -> Vec<Seen> {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|s| s.path == path)
            .cloned()
            .collect()
    }

    fn serve(&self, stream: TcpStream) -> std::io::Result<()> {
        let mut reader = BufReader::new(stream.try_clone()?);
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
        let mut headers = HashMap::new();
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header)? == 0 || header.trim().is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
            }
        }
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Seen {
                path: path.clone(),
                headers: headers.clone(),
            });
        let route = self
            .routes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&path)
            .cloned();
        let mut stream = stream;
        match route {
            None => respond(&mut stream, 404, &[], b"not found"),
            Some(Route::Status { code, headers }) => {
                let headers: Vec<(&str, &str)> = headers
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect();
                respond(&mut stream, code, &headers, b"")
            }
            Some(Route::Slow { delay, body }) => {
                std::thread::sleep(delay);
                respond(&mut stream, 200, &[("Content-Type", "text/html")], &body)
            }
            Some(Route::Body {
                content_type,
                body,
                etag,
                auth,
            }) => {
                if let Some(required) = auth
                    && headers.get("authorization") != Some(&required)
                {
                    return respond(&mut stream, 401, &[], b"unauthorized");
                }
                if let Some(tag) = &etag
                    && headers.get("if-none-match") == Some(tag)
                {
                    return respond(&mut stream, 304, &[("ETag", tag)], b"");
                }
                let mut out = vec![("Content-Type", content_type.as_str())];
                if let Some(tag) = &etag {
                    out.push(("ETag", tag));
                }
                respond(&mut stream, 200, &out, &body)
            }
        }
    }
}

fn respond(
    stream: &mut TcpStream,
    code: u16,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {code} X\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    stream.flush()
}

/// An RSS 2.0 feed of `(guid, title, link, description)` entries.
pub fn rss(entries: &[(String, String, String, String)]) -> String {
    let mut out = String::from(
        "<?xml version=\"1.0\" encoding=\"utf-8\"?>\n<rss version=\"2.0\"><channel><title>Fixture feed</title><link>http://example.invalid/</link><description>d</description>\n",
    );
    for (guid, title, link, description) in entries {
        out.push_str(&format!(
            "<item><guid>{guid}</guid><title>{title}</title><link>{link}</link><pubDate>Mon, 30 Nov 2026 10:00:00 GMT</pubDate><description>{description}</description></item>\n"
        ));
    }
    out.push_str("</channel></rss>\n");
    out
}

/// An article page with navigation, header and footer around the body text.
pub fn article_page(title: &str, body: &str) -> String {
    format!(
        "<!doctype html><html><head><title>{title}</title><script>window.trackingPixel = 1;</script></head><body>\
<nav><a href=\"/\">Home</a> <a href=\"/about\">About</a> NAVMENUTEXT</nav><header>SITEHEADERTEXT</header>\
<article><h1>{title}</h1>\
<p>{body} This paragraph is long enough to count as the main content of the page for a readability algorithm, with several sentences of text.</p>\
<p>A second paragraph adds more words about the same subject, so that the article clearly outweighs the navigation and the footer around it.</p>\
<p>A third paragraph closes the article with a final remark on the topic and a few more words.</p></article>\
<footer>FOOTERTEXT all rights reserved</footer></body></html>"
    )
}
