//! Turning a file into indexable text: kind detection, markdown sections, plain text,
//! PDF text per page (pdf-extract, isolated against its panics), images listed.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

use crate::index::markdown::{self, Citation};

/// Files larger than this are listed but their text is not indexed.
pub const MAX_INDEXED_BYTES: u64 = 64 * 1024 * 1024;
/// Plain text is indexed in chunks of about this many bytes.
const TEXT_CHUNK: usize = 8 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Markdown,
    Text,
    Pdf,
    Image,
    Binary,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Markdown => "markdown",
            Kind::Text => "text",
            Kind::Pdf => "pdf",
            Kind::Image => "image",
            Kind::Binary => "binary",
        }
    }

    pub fn of(path: &Path) -> Kind {
        let extension = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase)
            .unwrap_or_default();
        match extension.as_str() {
            "md" | "markdown" | "mdx" => Kind::Markdown,
            "pdf" => Kind::Pdf,
            "png" | "jpg" | "jpeg" | "gif" | "webp" | "svg" | "bmp" | "tif" | "tiff" => Kind::Image,
            "txt" | "text" | "rst" | "org" | "csv" | "tsv" | "json" | "jsonl" | "yaml" | "yml"
            | "toml" | "xml" | "html" | "htm" | "log" | "tex" | "srt" | "vtt" | "adoc" | "" => {
                Kind::Text
            }
            _ => Kind::Binary,
        }
    }

    /// MIME type for images returned as image content.
    pub fn image_mime(path: &Path) -> Option<&'static str> {
        let extension = path.extension()?.to_str()?.to_ascii_lowercase();
        match extension.as_str() {
            "png" => Some("image/png"),
            "jpg" | "jpeg" => Some("image/jpeg"),
            "gif" => Some("image/gif"),
            "webp" => Some("image/webp"),
            _ => None,
        }
    }
}

/// One indexable piece of a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// 1-based PDF page.
    pub page: Option<u32>,
    /// Heading trail, `"Guide > Install"`.
    pub heading: String,
    pub body: String,
}

#[derive(Debug, Clone, Default)]
pub struct Extracted {
    pub title: Option<String>,
    pub pages: Option<u32>,
    pub chunks: Vec<Chunk>,
    pub citations: Vec<Citation>,
    /// Why the text could not be (fully) extracted, if it could not.
    pub problem: Option<String>,
}

/// Extract the indexable text of `bytes`, a file at `path` of kind `kind`.
pub fn extract(path: &Path, kind: Kind, bytes: &[u8]) -> Extracted {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    match kind {
        Kind::Markdown => {
            let text = String::from_utf8_lossy(bytes);
            let chunks = markdown::sections(&text)
                .into_iter()
                .map(|section| Chunk {
                    page: None,
                    heading: section.trail.join(" > "),
                    body: text[section.start..section.end].to_string(),
                })
                .filter(|chunk| !chunk.body.trim().is_empty())
                .collect();
            Extracted {
                title: markdown::title(&text),
                chunks,
                citations: markdown::citations(&text),
                ..Extracted::default()
            }
        }
        Kind::Text => {
            let text = String::from_utf8_lossy(bytes);
            Extracted {
                chunks: split_text(&text),
                ..Extracted::default()
            }
        }
        Kind::Pdf => match pdf_pages(bytes) {
            Ok(pages) => {
                let count = pages.len() as u32;
                let empty = pages.iter().filter(|p| p.trim().is_empty()).count();
                let chunks = pages
                    .into_iter()
                    .enumerate()
                    .map(|(i, body)| Chunk {
                        page: Some(i as u32 + 1),
                        heading: String::new(),
                        body,
                    })
                    .collect();
                Extracted {
                    pages: Some(count),
                    chunks,
                    problem: (count > 0 && empty == count as usize).then(|| {
                        "no text layer (a scanned PDF?): nothing to search until it is OCRed"
                            .to_string()
                    }),
                    ..Extracted::default()
                }
            }
            Err(problem) => Extracted {
                problem: Some(problem),
                ..Extracted::default()
            },
        },
        // Images and binaries are listed: their name is searchable.
        Kind::Image | Kind::Binary => Extracted {
            chunks: vec![Chunk {
                page: None,
                heading: String::new(),
                body: name,
            }],
            ..Extracted::default()
        },
    }
}

fn split_text(text: &str) -> Vec<Chunk> {
    let mut chunks = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let mut cut = rest.len().min(TEXT_CHUNK);
        if cut < rest.len() {
            // Prefer a line break, never split a character.
            while !rest.is_char_boundary(cut) {
                cut -= 1;
            }
            if let Some(newline) = rest[..cut].rfind('\n') {
                cut = newline + 1;
            }
        }
        chunks.push(Chunk {
            page: None,
            heading: String::new(),
            body: rest[..cut].to_string(),
        });
        rest = &rest[cut..];
    }
    chunks
}

/// Text of every page of a PDF, page 1 first. A page whose extraction fails (or
/// panics inside pdf-extract) yields an empty string rather than ending the document.
pub fn pdf_pages(bytes: &[u8]) -> Result<Vec<String>, String> {
    let loaded = catch_unwind(AssertUnwindSafe(|| {
        let mut document = pdf_extract::Document::load_mem(bytes).map_err(|e| e.to_string())?;
        if document.is_encrypted() {
            document
                .decrypt("")
                .map_err(|e| format!("encrypted PDF: {e}"))?;
        }
        Ok::<_, String>(document)
    }));
    let document = match loaded {
        Ok(Ok(document)) => document,
        Ok(Err(error)) => return Err(format!("not a readable PDF: {error}")),
        Err(_) => return Err("not a readable PDF (the parser gave up)".to_string()),
    };
    let count = document.get_pages().len() as u32;
    let mut pages = Vec::with_capacity(count as usize);
    for number in 1..=count {
        let text = catch_unwind(AssertUnwindSafe(|| {
            let mut text = String::new();
            let mut output = pdf_extract::PlainTextOutput::new(&mut text);
            pdf_extract::output_doc_page(&document, &mut output, number).map(|()| text)
        }));
        pages.push(match text {
            Ok(Ok(text)) => text,
            _ => String::new(),
        });
    }
    Ok(pages)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds() {
        for (path, kind) in [
            ("a.md", Kind::Markdown),
            ("a.PDF", Kind::Pdf),
            ("a.png", Kind::Image),
            ("notes.txt", Kind::Text),
            ("README", Kind::Text),
            ("a.zip", Kind::Binary),
        ] {
            assert_eq!(Kind::of(Path::new(path)), kind, "{path}");
        }
    }

    #[test]
    fn text_chunks_cover_everything() {
        let text = "line\n".repeat(5000);
        let chunks = split_text(&text);
        assert!(chunks.len() > 1);
        assert_eq!(
            chunks.iter().map(|c| c.body.len()).sum::<usize>(),
            text.len()
        );
    }

    #[test]
    fn garbage_pdf_is_an_error_not_a_panic() {
        assert!(pdf_pages(b"%PDF-1.4 garbage").is_err());
        assert!(pdf_pages(b"").is_err());
    }
}
