//! Outgoing frames of the Unix socket as JSON lines, written by a string escape that
//! passes over eight plain bytes at a time (issue 15: serde_json's looks at every byte,
//! and a glob batch's answer carries its 40,000 characters twice, in the text and in
//! `structuredContent`: that loop was the largest single item of the call's profile).
//!
//! The message goes through `serde_json::Value` first (rmcp's types serialize into
//! it); numbers are written by serde_json itself, so the bytes are serde_json's own.

use serde::Serialize;
use serde_json::Value;

/// `message` as one line (with its `\n`) in `out`, which is cleared first (the caller
/// keeps it between frames, so a frame does not grow a buffer from nothing).
pub fn write_line<T: Serialize>(message: &T, out: &mut Vec<u8>) -> serde_json::Result<()> {
    out.clear();
    let value = serde_json::to_value(message)?;
    write_value(out, &value)?;
    out.push(b'\n');
    Ok(())
}

fn write_value(out: &mut Vec<u8>, value: &Value) -> serde_json::Result<()> {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(number) => serde_json::to_writer(&mut *out, number)?,
        Value::String(text) => write_str(out, text),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(out, item)?;
            }
            out.push(b']');
        }
        Value::Object(map) => {
            out.push(b'{');
            for (i, (key, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_str(out, key);
                out.push(b':');
                write_value(out, item)?;
            }
            out.push(b'}');
        }
    }
    Ok(())
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGH_BITS: u64 = 0x8080_8080_8080_8080;

/// The high bit of each byte of `word` that must be escaped (a control character,
/// below 0x20, `"` or `\`), and maybe of bytes above such a one (a borrow): zero
/// exactly when none must be. A high bit is set only by a byte below the bound, or
/// by a borrow from one below it, so a word with none gives zero.
fn escape_bits(word: u64) -> u64 {
    let below_space = word.wrapping_sub(ONES * 0x20) & !word;
    let quote = word ^ (ONES * u64::from(b'"'));
    let quote = quote.wrapping_sub(ONES) & !quote;
    let backslash = word ^ (ONES * u64::from(b'\\'));
    let backslash = backslash.wrapping_sub(ONES) & !backslash;
    (below_space | quote | backslash) & HIGH_BITS
}

/// Where the first byte of `bytes` that must be escaped is, looked for 32 bytes at a
/// time (the lowest high bit of `escape_bits` is always a byte that must be: no borrow
/// reaches below it).
fn next_escape(bytes: &[u8]) -> Option<usize> {
    let mut blocks = bytes.chunks_exact(32);
    let mut offset = 0;
    for block in &mut blocks {
        let word = |k: usize| {
            let mut eight = [0u8; 8];
            eight.copy_from_slice(&block[k * 8..k * 8 + 8]);
            escape_bits(u64::from_le_bytes(eight))
        };
        let (first, second, third, fourth) = (word(0), word(1), word(2), word(3));
        if first | second | third | fourth != 0 {
            for (k, b) in [first, second, third, fourth].into_iter().enumerate() {
                if b != 0 {
                    return Some(offset + k * 8 + (b.trailing_zeros() / 8) as usize);
                }
            }
        }
        offset += 32;
    }
    blocks
        .remainder()
        .iter()
        .position(|&byte| escape(byte).is_some())
        .map(|p| offset + p)
}

/// JSON's escape of one byte, as serde_json writes it; None when it needs none.
fn escape(byte: u8) -> Option<&'static [u8]> {
    Some(match byte {
        b'"' => b"\\\"",
        b'\\' => b"\\\\",
        b'\n' => b"\\n",
        b'\r' => b"\\r",
        b'\t' => b"\\t",
        0x08 => b"\\b",
        0x0c => b"\\f",
        0x00..=0x1f => b"\\u00",
        _ => return None,
    })
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn write_str(out: &mut Vec<u8>, text: &str) {
    let bytes = text.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    // Bytes before `start` are written.
    let mut start = 0;
    while let Some(found) = next_escape(&bytes[start..]) {
        let at = start + found;
        let byte = bytes[at];
        out.extend_from_slice(&bytes[start..at]);
        if let Some(escaped) = escape(byte) {
            out.extend_from_slice(escaped);
            if escaped == b"\\u00" {
                out.push(HEX[usize::from(byte >> 4)]);
                out.push(HEX[usize::from(byte & 0xf)]);
            }
        }
        start = at + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn same_as_serde_json(value: &Value) {
        let mut out = Vec::new();
        write_line(value, &mut out).expect("writes");
        let mut expected = serde_json::to_vec(value).expect("serde_json");
        expected.push(b'\n');
        assert_eq!(
            String::from_utf8_lossy(&out),
            String::from_utf8_lossy(&expected)
        );
    }

    #[test]
    fn every_byte_and_position_is_escaped_as_serde_json_does() {
        // Each ASCII byte at each offset of an 8-byte word, among plain bytes and
        // multi-byte characters.
        for byte in 0u8..0x80 {
            for offset in 0..70 {
                let mut text = "a".repeat(offset);
                text.push(char::from(byte));
                text.push_str("é—ok ü 漢字 plain tail");
                same_as_serde_json(&Value::String(text));
            }
        }
        same_as_serde_json(&Value::String(String::new()));
        same_as_serde_json(&Value::String("\"\\\u{7f}\u{1f}\u{0}".repeat(9)));
    }

    #[test]
    fn whole_messages_match() {
        same_as_serde_json(&json!({
            "jsonrpc": "2.0",
            "id": 7,
            "result": {
                "content": [{"type": "text", "text": "# Title\n\nline \"quoted\"\ttab\r\n"}],
                "structuredContent": {
                    "files": [{"path": "wiki/a.md", "chars": 12, "truncated": false}],
                    "score": -1.25e-7,
                    "big": 18446744073709551615u64,
                    "negative": -3,
                    "nothing": null,
                    "ok": true,
                    "empty": {},
                    "list": [],
                },
            },
        }));
    }

    #[test]
    fn a_word_with_an_escape_is_told_from_one_without() {
        for byte in 0u8..=255 {
            let word = u64::from_le_bytes([b'x', b'y', byte, b'z', 0xc3, 0xa9, b' ', b'~']);
            let expected = byte < 0x20 || byte == b'"' || byte == b'\\';
            assert_eq!(escape_bits(word) != 0, expected, "byte {byte:#x}");
        }
    }
}
