//! A tiny PDF writer: one page per string, Helvetica, one text line per `\n`. Enough
//! for pdf-extract to read back, small enough to need no dependency. Shared by the
//! benchmark corpus and the end-to-end tests.

/// A small valid PDF with one page per string (Helvetica text, one line per `\n`).
pub fn make_pdf(pages: &[&str]) -> Vec<u8> {
    let mut objects: Vec<String> = Vec::new();
    let page_count = pages.len();
    // 1: catalog, 2: pages, 3: font, then (page, content) pairs.
    objects.push("<< /Type /Catalog /Pages 2 0 R >>".to_string());
    let kids: Vec<String> = (0..page_count)
        .map(|i| format!("{} 0 R", 4 + 2 * i))
        .collect();
    objects.push(format!(
        "<< /Type /Pages /Kids [{}] /Count {page_count} >>",
        kids.join(" ")
    ));
    objects.push("<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>".to_string());
    for (i, text) in pages.iter().enumerate() {
        let content_id = 5 + 2 * i;
        objects.push(format!(
            "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> /Contents {content_id} 0 R >>"
        ));
        let mut stream = String::from("BT /F1 12 Tf 14 TL 72 720 Td\n");
        for line in text.lines() {
            let escaped = line
                .replace('\\', "\\\\")
                .replace('(', "\\(")
                .replace(')', "\\)");
            stream.push_str(&format!("({escaped}) Tj T*\n"));
        }
        stream.push_str("ET");
        objects.push(format!(
            "<< /Length {} >>\nstream\n{stream}\nendstream",
            stream.len()
        ));
    }
    let mut pdf = b"%PDF-1.4\n".to_vec();
    let mut offsets = Vec::new();
    for (i, object) in objects.iter().enumerate() {
        offsets.push(pdf.len());
        pdf.extend_from_slice(format!("{} 0 obj\n{object}\nendobj\n", i + 1).as_bytes());
    }
    let xref = pdf.len();
    pdf.extend_from_slice(
        format!("xref\n0 {}\n0000000000 65535 f \n", objects.len() + 1).as_bytes(),
    );
    for offset in offsets {
        pdf.extend_from_slice(format!("{offset:010} 00000 n \n").as_bytes());
    }
    pdf.extend_from_slice(
        format!(
            "trailer\n<< /Size {} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n",
            objects.len() + 1
        )
        .as_bytes(),
    );
    pdf
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn structure_and_offsets() {
        let pdf = make_pdf(&["one (page)", "two\nlines"]);
        let text = String::from_utf8(pdf.clone()).expect("ascii");
        assert!(text.starts_with("%PDF-1.4\n"));
        assert!(text.contains("/Count 2"));
        assert!(text.contains("(one \\(page\\)) Tj"));
        // Every xref offset points at the start of its object.
        let xref_at = text.find("xref\n").expect("xref");
        for (i, line) in text[xref_at..].lines().skip(3).take(7).enumerate() {
            let offset: usize = line[..10].parse().expect("offset");
            assert!(
                text[offset..].starts_with(&format!("{} 0 obj", i + 1)),
                "{line}"
            );
        }
    }
}
