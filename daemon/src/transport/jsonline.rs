//! Outgoing frames of the Unix socket as JSON lines, written by a string escape that
//! passes over eight plain bytes at a time (issue 15: serde_json's looks at every byte,
//! and a glob batch's answer carries its 40,000 characters twice, in the text and in
//! `structuredContent`: that loop was the largest single item of the call's profile).
//!
//! The message is serialized straight into the line by a serializer of its own
//! (`Line`): compact JSON as serde_json writes it, numbers written by serde_json
//! itself, so the bytes are serde_json's own. It used to go through a
//! `serde_json::Value` first, which copied every string of the answer once more (4.7 %
//! of a glob batch's samples).

use serde::Serialize;
use serde::ser::{self, Error as _};

/// `message` as one line (with its `\n`) in `out`, which is cleared first (the caller
/// keeps it between frames, so a frame does not grow a buffer from nothing).
pub fn write_line<T: Serialize>(message: &T, out: &mut Vec<u8>) -> serde_json::Result<()> {
    out.clear();
    message.serialize(&mut Line { out: &mut *out })?;
    out.push(b'\n');
    Ok(())
}

/// The serializer: compact JSON into `out`.
struct Line<'o> {
    out: &'o mut Vec<u8>,
}

impl<'o> Line<'o> {
    /// Open a compound: for a variant's, `{"variant":` first; then `opening`.
    fn open<'l>(
        &'l mut self,
        variant: Option<&str>,
        opening: u8,
        close: &'static [u8],
    ) -> Compound<'l, 'o> {
        if let Some(variant) = variant {
            self.out.push(b'{');
            write_str(self.out, variant);
            self.out.push(b':');
        }
        self.out.push(opening);
        Compound {
            line: self,
            first: true,
            close,
        }
    }

    /// A number as serde_json writes it (non-finite floats as `null`).
    fn number<N: Serialize>(&mut self, number: N) -> serde_json::Result<()> {
        serde_json::to_writer(&mut *self.out, &number)
    }
}

/// A sequence, map or struct being written: whether an element was written yet, and
/// what closes it (`]`, `}`, or also the `}` of a variant's object).
struct Compound<'l, 'o> {
    line: &'l mut Line<'o>,
    first: bool,
    close: &'static [u8],
}

impl Compound<'_, '_> {
    fn comma(&mut self) {
        if !std::mem::take(&mut self.first) {
            self.line.out.push(b',');
        }
    }

    fn field<T: ?Sized + Serialize>(&mut self, key: &str, value: &T) -> serde_json::Result<()> {
        self.comma();
        write_str(self.line.out, key);
        self.line.out.push(b':');
        value.serialize(&mut *self.line)
    }

    fn element<T: ?Sized + Serialize>(&mut self, value: &T) -> serde_json::Result<()> {
        self.comma();
        value.serialize(&mut *self.line)
    }

    fn end(self) -> serde_json::Result<()> {
        self.line.out.extend_from_slice(self.close);
        Ok(())
    }
}

/// The integer methods of a serializer, each handing the integer to `$helper`.
macro_rules! integers {
    ($helper:ident) => {
        integers!($helper;
            serialize_i8: i8, serialize_i16: i16, serialize_i32: i32, serialize_i64: i64,
            serialize_i128: i128, serialize_u8: u8, serialize_u16: u16, serialize_u32: u32,
            serialize_u64: u64, serialize_u128: u128);
    };
    ($helper:ident; $($method:ident: $kind:ty),*) => {$(
        fn $method(self, v: $kind) -> serde_json::Result<()> {
            self.$helper(v)
        }
    )*};
}

/// What both serializers (a value's, a map key's) write as they would the content: a
/// unit variant as its name, a newtype struct as what it wraps (serde_json does the same).
macro_rules! as_their_content {
    () => {
        fn serialize_unit_variant(
            self,
            _name: &'static str,
            _index: u32,
            variant: &'static str,
        ) -> serde_json::Result<()> {
            self.serialize_str(variant)
        }
        fn serialize_newtype_struct<T: ?Sized + Serialize>(
            self,
            _name: &'static str,
            value: &T,
        ) -> serde_json::Result<()> {
            value.serialize(self)
        }
    };
}

/// The methods of `Line` that open a compound of one kind (`[` or `{`): the plain one,
/// a named one (a tuple struct, a struct) and a variant's.
macro_rules! opening {
    ($plain:ident, $named:ident, $variant:ident, $open:expr, $close:expr, $variant_close:expr) => {
        fn $plain(self, _len: Option<usize>) -> serde_json::Result<Compound<'l, 'o>> {
            Ok(self.open(None, $open, $close))
        }
        fn $named(self, _name: &'static str, _len: usize) -> serde_json::Result<Compound<'l, 'o>> {
            Ok(self.open(None, $open, $close))
        }
        fn $variant(
            self,
            _name: &'static str,
            _index: u32,
            variant: &'static str,
            _len: usize,
        ) -> serde_json::Result<Compound<'l, 'o>> {
            Ok(self.open(Some(variant), $open, $variant_close))
        }
    };
}

impl<'l, 'o> ser::Serializer for &'l mut Line<'o> {
    type Ok = ();
    type Error = serde_json::Error;
    type SerializeSeq = Compound<'l, 'o>;
    type SerializeTuple = Compound<'l, 'o>;
    type SerializeTupleStruct = Compound<'l, 'o>;
    type SerializeTupleVariant = Compound<'l, 'o>;
    type SerializeMap = Compound<'l, 'o>;
    type SerializeStruct = Compound<'l, 'o>;
    type SerializeStructVariant = Compound<'l, 'o>;

    fn serialize_bool(self, v: bool) -> serde_json::Result<()> {
        self.out
            .extend_from_slice(if v { b"true" } else { b"false" });
        Ok(())
    }
    integers!(number);
    fn serialize_f32(self, v: f32) -> serde_json::Result<()> {
        self.number(v)
    }
    fn serialize_f64(self, v: f64) -> serde_json::Result<()> {
        self.number(v)
    }
    fn serialize_char(self, v: char) -> serde_json::Result<()> {
        write_str(self.out, v.encode_utf8(&mut [0u8; 4]));
        Ok(())
    }
    fn serialize_str(self, v: &str) -> serde_json::Result<()> {
        write_str(self.out, v);
        Ok(())
    }
    fn serialize_bytes(self, v: &[u8]) -> serde_json::Result<()> {
        use ser::SerializeSeq as _;
        let mut seq = self.serialize_seq(Some(v.len()))?;
        for byte in v {
            seq.serialize_element(byte)?;
        }
        seq.end()
    }
    fn serialize_none(self) -> serde_json::Result<()> {
        self.serialize_unit()
    }
    fn serialize_some<T: ?Sized + Serialize>(self, value: &T) -> serde_json::Result<()> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> serde_json::Result<()> {
        self.out.extend_from_slice(b"null");
        Ok(())
    }
    fn serialize_unit_struct(self, _name: &'static str) -> serde_json::Result<()> {
        self.serialize_unit()
    }
    as_their_content!();
    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> serde_json::Result<()> {
        self.out.push(b'{');
        write_str(self.out, variant);
        self.out.push(b':');
        value.serialize(&mut *self)?;
        self.out.push(b'}');
        Ok(())
    }
    fn serialize_tuple(self, len: usize) -> serde_json::Result<Compound<'l, 'o>> {
        self.serialize_seq(Some(len))
    }
    opening!(
        serialize_seq,
        serialize_tuple_struct,
        serialize_tuple_variant,
        b'[',
        b"]",
        b"]}"
    );
    opening!(
        serialize_map,
        serialize_struct,
        serialize_struct_variant,
        b'{',
        b"}",
        b"}}"
    );
}

/// The sequence-like compounds: each element after a comma.
macro_rules! elements {
    ($($trait:ident :: $method:ident),*) => {$(
        impl ser::$trait for Compound<'_, '_> {
            type Ok = ();
            type Error = serde_json::Error;
            fn $method<T: ?Sized + Serialize>(&mut self, value: &T) -> serde_json::Result<()> {
                self.element(value)
            }
            fn end(self) -> serde_json::Result<()> {
                Compound::end(self)
            }
        }
    )*};
}

elements!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field
);

impl ser::SerializeMap for Compound<'_, '_> {
    type Ok = ();
    type Error = serde_json::Error;
    fn serialize_key<T: ?Sized + Serialize>(&mut self, key: &T) -> serde_json::Result<()> {
        self.comma();
        key.serialize(Key {
            out: &mut *self.line.out,
        })
    }
    fn serialize_value<T: ?Sized + Serialize>(&mut self, value: &T) -> serde_json::Result<()> {
        self.line.out.push(b':');
        value.serialize(&mut *self.line)
    }
    fn end(self) -> serde_json::Result<()> {
        Compound::end(self)
    }
}

/// The struct-like compounds: each field as `"key":value` after a comma.
macro_rules! fields {
    ($($trait:ident),*) => {$(
        impl ser::$trait for Compound<'_, '_> {
            type Ok = ();
            type Error = serde_json::Error;
            fn serialize_field<T: ?Sized + Serialize>(
                &mut self,
                key: &'static str,
                value: &T,
            ) -> serde_json::Result<()> {
                self.field(key, value)
            }
            fn end(self) -> serde_json::Result<()> {
                Compound::end(self)
            }
        }
    )*};
}

fields!(SerializeStruct, SerializeStructVariant);

/// A map's key, as serde_json writes one: a string, or a number (a finite one), a bool
/// or a char in quotes; anything else is refused as serde_json refuses it.
struct Key<'o> {
    out: &'o mut Vec<u8>,
}

impl Key<'_> {
    fn quoted<N: Serialize>(self, number: N) -> serde_json::Result<()> {
        self.out.push(b'"');
        serde_json::to_writer(&mut *self.out, &number)?;
        self.out.push(b'"');
        Ok(())
    }
}

fn key_must_be_a_string() -> serde_json::Error {
    serde_json::Error::custom("key must be a string")
}

fn float_key_must_be_finite() -> serde_json::Error {
    serde_json::Error::custom("float key must be finite (got NaN or +/-inf)")
}

impl ser::Serializer for Key<'_> {
    type Ok = ();
    type Error = serde_json::Error;
    type SerializeSeq = ser::Impossible<(), serde_json::Error>;
    type SerializeTuple = ser::Impossible<(), serde_json::Error>;
    type SerializeTupleStruct = ser::Impossible<(), serde_json::Error>;
    type SerializeTupleVariant = ser::Impossible<(), serde_json::Error>;
    type SerializeMap = ser::Impossible<(), serde_json::Error>;
    type SerializeStruct = ser::Impossible<(), serde_json::Error>;
    type SerializeStructVariant = ser::Impossible<(), serde_json::Error>;

    fn serialize_str(self, v: &str) -> serde_json::Result<()> {
        write_str(self.out, v);
        Ok(())
    }
    fn serialize_char(self, v: char) -> serde_json::Result<()> {
        write_str(self.out, v.encode_utf8(&mut [0u8; 4]));
        Ok(())
    }
    fn serialize_bool(self, v: bool) -> serde_json::Result<()> {
        self.out
            .extend_from_slice(if v { b"\"true\"" } else { b"\"false\"" });
        Ok(())
    }
    integers!(quoted);
    as_their_content!();
    fn serialize_f32(self, v: f32) -> serde_json::Result<()> {
        if !v.is_finite() {
            return Err(float_key_must_be_finite());
        }
        self.quoted(v)
    }
    fn serialize_f64(self, v: f64) -> serde_json::Result<()> {
        if !v.is_finite() {
            return Err(float_key_must_be_finite());
        }
        self.quoted(v)
    }
    fn serialize_bytes(self, _v: &[u8]) -> serde_json::Result<()> {
        Err(key_must_be_a_string())
    }
    fn serialize_none(self) -> serde_json::Result<()> {
        Err(key_must_be_a_string())
    }
    fn serialize_some<T: ?Sized + Serialize>(self, value: &T) -> serde_json::Result<()> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> serde_json::Result<()> {
        Err(key_must_be_a_string())
    }
    fn serialize_unit_struct(self, _name: &'static str) -> serde_json::Result<()> {
        Err(key_must_be_a_string())
    }
    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _value: &T,
    ) -> serde_json::Result<()> {
        Err(key_must_be_a_string())
    }
    fn serialize_seq(self, _len: Option<usize>) -> serde_json::Result<Self::SerializeSeq> {
        Err(key_must_be_a_string())
    }
    fn serialize_tuple(self, _len: usize) -> serde_json::Result<Self::SerializeTuple> {
        Err(key_must_be_a_string())
    }
    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> serde_json::Result<Self::SerializeTupleStruct> {
        Err(key_must_be_a_string())
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> serde_json::Result<Self::SerializeTupleVariant> {
        Err(key_must_be_a_string())
    }
    fn serialize_map(self, _len: Option<usize>) -> serde_json::Result<Self::SerializeMap> {
        Err(key_must_be_a_string())
    }
    fn serialize_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> serde_json::Result<Self::SerializeStruct> {
        Err(key_must_be_a_string())
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> serde_json::Result<Self::SerializeStructVariant> {
        Err(key_must_be_a_string())
    }
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
    use serde_json::{Value, json};

    fn same_as_serde_json<T: Serialize>(value: &T) {
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

    /// Whatever serde's data model holds comes out as serde_json writes it: enums of
    /// every kind, options, bytes, tuples, maps with keys of every kind serde_json
    /// takes, non-finite floats (`null`); keys it refuses are refused.
    #[test]
    fn the_data_model_is_written_as_serde_json_writes_it() {
        use std::collections::BTreeMap;
        #[derive(Serialize)]
        enum E {
            Unit,
            Newtype(u8),
            Tuple(i32, String),
            Struct { a: Option<f64>, b: Vec<u8> },
        }
        #[derive(Serialize)]
        struct Unit;
        #[derive(Serialize)]
        struct Wrapper(String);
        #[derive(Serialize)]
        struct Pair(u16, bool);
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Message {
            kinds: Vec<E>,
            unit: Unit,
            wrapper: Wrapper,
            pair: Pair,
            tuple: (char, i128, u128, f32),
            #[serde(with = "serde_bytes_as_seq")]
            bytes: Vec<u8>,
            nothing: Option<String>,
            by_int: BTreeMap<i64, &'static str>,
            by_bool: BTreeMap<bool, u8>,
            by_char: BTreeMap<char, u8>,
            #[serde(flatten)]
            rest: BTreeMap<String, serde_json::Value>,
            floats: Vec<f64>,
        }
        mod serde_bytes_as_seq {
            pub fn serialize<S: serde::Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
                s.serialize_bytes(v)
            }
        }
        let message = Message {
            kinds: vec![
                E::Unit,
                E::Newtype(7),
                E::Tuple(-3, "t\"\n".into()),
                E::Struct {
                    a: Some(0.1),
                    b: vec![1, 2],
                },
                E::Struct { a: None, b: vec![] },
            ],
            unit: Unit,
            wrapper: Wrapper("w\u{1}".into()),
            pair: Pair(65535, false),
            tuple: ('\u{e9}', i128::MIN, u128::MAX, 1.5e-7),
            bytes: vec![0, 255, 10],
            nothing: None,
            by_int: BTreeMap::from([(-1, "minus"), (42, "answer")]),
            by_bool: BTreeMap::from([(false, 0), (true, 1)]),
            by_char: BTreeMap::from([('"', 1), ('x', 2)]),
            rest: BTreeMap::from([
                ("flat".into(), serde_json::json!({"k": [1, 2.5, null]})),
                ("z".into(), serde_json::json!("end")),
            ]),
            floats: vec![f64::NAN, f64::INFINITY, -0.0, 1e300, 123.456],
        };
        same_as_serde_json(&message);
        #[derive(Serialize)]
        struct FloatKey(#[serde(serialize_with = "float_key")] ());
        fn float_key<S: serde::Serializer>(_: &(), s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeMap as _;
            let mut map = s.serialize_map(Some(2))?;
            map.serialize_entry(&2.5f64, &1)?;
            map.serialize_entry(&Some("k"), &2)?;
            map.end()
        }
        let mut out = Vec::new();
        write_line(&FloatKey(()), &mut out).expect("writes");
        assert_eq!(
            out,
            [
                serde_json::to_vec(&FloatKey(())).expect("serde_json"),
                b"\n".to_vec()
            ]
            .concat()
        );
        for refused in [
            serde_json::to_value(BTreeMap::from([(vec![1u8], 1)])).is_err(),
            write_line(&BTreeMap::from([(vec![1u8], 1)]), &mut out).is_err(),
            write_line(&BTreeMap::from([((), 1)]), &mut out).is_err(),
        ] {
            assert!(refused);
        }
        #[derive(Serialize)]
        struct NanKey(#[serde(serialize_with = "nan_key")] ());
        fn nan_key<S: serde::Serializer>(_: &(), s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeMap as _;
            let mut map = s.serialize_map(Some(1))?;
            map.serialize_entry(&f64::NAN, &1)?;
            map.end()
        }
        assert!(serde_json::to_vec(&NanKey(())).is_err());
        assert!(write_line(&NanKey(()), &mut out).is_err());
    }

    /// rmcp's own messages (a tool's result with text and structured content, a
    /// request, a notification, an error) are serde_json's bytes.
    #[test]
    fn rmcp_messages_are_serde_json_s_bytes() {
        use rmcp::model::{
            CallToolResult, ContentBlock, ErrorData, JsonRpcMessage, ServerJsonRpcMessage,
            ServerResult,
        };
        let text = "# Page\n\n\"quoted\" \t tab \u{1} é 漢字 ".repeat(300);
        let mut result = CallToolResult::success(vec![ContentBlock::text(text.clone())]);
        result.structured_content = Some(serde_json::json!({
            "files": [{"path": "wiki/a.md", "content": text, "chars": 12, "truncated": false}],
            "score": -1.25e-7,
        }));
        let messages: Vec<ServerJsonRpcMessage> = vec![
            JsonRpcMessage::response(
                ServerResult::CallToolResult(result),
                rmcp::model::NumberOrString::Number(7),
            ),
            JsonRpcMessage::error(
                ErrorData::invalid_params(
                    "bad \"path\"",
                    Some(serde_json::json!({"path": "../x"})),
                ),
                Some(rmcp::model::NumberOrString::String("id-1".into())),
            ),
        ];
        for message in &messages {
            same_as_serde_json(message);
        }
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
