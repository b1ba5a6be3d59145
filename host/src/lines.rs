//! The JSON lines the host writes: an output or a dead letter of the sinks' files and
//! stdout, and an entry of `sluice state dump` (and `sluice test --show-state`). This
//! module owns how each field is written — a key or value as embedded JSON, text or
//! base64 ([`Payload`]), the `cause` of an expiry's or a timer's lines, the operator build — and
//! that every line reads back with serde_json — and how two lines differ, field by
//! field ([`differing_fields`]). It does not own where lines go (the
//! [`sink`](crate::sink)'s files, chunked and synced) nor where the entries come from.

use crate::record::{DeadLetter, Origin, Output};
use serde::Serialize;

/// One line of the outputs or the dead letters: where the input record was, the
/// output (or the input, for a dead letter), the operator build, and for a dead letter
/// why it was not processed.
#[derive(Serialize)]
struct Line<'a> {
    partition: u32,
    offset: u64,
    /// The [`Cause`]'s name for an expiry's or a timer's output or dead letter.
    #[serde(skip_serializing_if = "Option::is_none")]
    cause: Option<&'a str>,
    #[serde(flatten)]
    key: BytesField<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    topic: Option<&'a str>,
    #[serde(flatten)]
    value: BytesField<'a>,
    /// The operator build that produced it (or that refused the input).
    operator: &'a str,
    /// The [`DeadLetterKind`](crate::record::DeadLetterKind)'s name; dead letters only.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
    /// The calls a `trapped` record got (`[operator.retry]`).
    #[serde(skip_serializing_if = "Option::is_none")]
    attempts: Option<u32>,
}

impl Line<'_> {
    /// Appends this line to `buf`.
    fn write_to(&self, buf: &mut Vec<u8>) {
        serde_json::to_writer(&mut *buf, self).expect("serializing to memory cannot fail");
        buf.push(b'\n');
    }
}

/// Bytes as a JSON line holds them: embedded as JSON when they are JSON a reader holds
/// (values only, see `readable_json`), else as a string when they are UTF-8, else in
/// base64.
pub enum Payload<'a> {
    /// JSON a reader holds, embedded as is.
    Json(&'a serde_json::value::RawValue),
    /// UTF-8 text, as a string.
    Text(&'a str),
    /// Anything else, which a line holds in base64 under the field's name with
    /// [`BASE64_SUFFIX`].
    Bytes(&'a [u8]),
}

/// What a field holding bytes that are not UTF-8 adds to its name: `"key_base64"`,
/// `"value_base64"`, so no two keys or values ever read the same.
pub const BASE64_SUFFIX: &str = "_base64";

impl<'a> Payload<'a> {
    /// Classifies a value's `bytes`.
    pub fn of(bytes: &'a [u8]) -> Self {
        match std::str::from_utf8(bytes) {
            Ok(text) => readable_json(text).map_or(Payload::Text(text), Payload::Json),
            Err(_) => Payload::Bytes(bytes),
        }
    }

    /// Classifies a key's `bytes`: text or not, never embedded JSON.
    pub fn of_key(bytes: &'a [u8]) -> Self {
        std::str::from_utf8(bytes).map_or(Payload::Bytes(bytes), Payload::Text)
    }
}

/// How deep a value embedded in a line may nest: the line holds it one level down, and
/// serde_json reads 127 levels (its recursion limit).
const MAX_VALUE_DEPTH: usize = 126;

/// `text` as JSON that a reader of a line holding it reads back: valid JSON whose
/// numbers a double holds and which nests at most [`MAX_VALUE_DEPTH`] deep — what
/// serde_json (this host's reader, and `sluice test`'s), and most others, accept —
/// or `None`. `1e400` or `[[[…]]]` 200 deep are valid JSON that such a reader refuses,
/// so a line embedding them could not be read at all: they are text to it.
fn readable_json(text: &str) -> Option<&serde_json::value::RawValue> {
    let raw: &serde_json::value::RawValue = serde_json::from_str(text).ok()?;
    // Reading every number costs three times the syntax check: only JSON whose bytes may
    // hold what a reader refuses pays for it.
    (!may_be_refused(raw.get().as_bytes()) || reads_back(raw.get())).then_some(raw)
}

/// Whether valid JSON `json` may hold what a reader refuses, by a look at its bytes that
/// is wrong only towards "may": an exponent or a run of 309 digits (the only numbers
/// past a double's range), a `\u` escape (a lone surrogate, which serde_json refuses),
/// more brackets than [`MAX_VALUE_DEPTH`] (deeper nesting needs them). About a third of
/// what the syntax check costs, where reading every number costs three times as much.
fn may_be_refused(json: &[u8]) -> bool {
    memchr::memchr2_iter(b'e', b'E', json).any(|at| at > 0 && json[at - 1].is_ascii_digit())
        || memchr::memchr_iter(b'\\', json).any(|at| json.get(at + 1) == Some(&b'u'))
        || json.len() > MAX_VALUE_DEPTH
            && (memchr::memchr2_iter(b'[', b'{', json).count() > MAX_VALUE_DEPTH
                || json.split(|byte| !byte.is_ascii_digit()).any(|digits| digits.len() >= 309))
}

/// Whether serde_json reads `json` back, nested at most [`MAX_VALUE_DEPTH`] deep: each
/// value read and dropped, in one pass that allocates nothing.
fn reads_back(json: &str) -> bool {
    use serde::de::{DeserializeSeed, Deserializer, Error, IgnoredAny, MapAccess, SeqAccess, Visitor};

    /// Any JSON value that may open this many more levels; serde_json itself refuses a
    /// number past a double's range and a lone surrogate.
    struct Readable(usize);

    impl Readable {
        /// What an array's items or an object's values may open.
        fn inner<E: Error>(&self) -> Result<Readable, E> {
            self.0.checked_sub(1).map(Readable).ok_or_else(|| E::custom("nested too deep"))
        }
    }

    impl<'de> DeserializeSeed<'de> for Readable {
        type Value = ();

        fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
            deserializer.deserialize_any(self)
        }
    }

    impl<'de> Visitor<'de> for Readable {
        type Value = ();

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("any JSON value")
        }

        fn visit_bool<E: Error>(self, _: bool) -> Result<(), E> {
            Ok(())
        }

        fn visit_i64<E: Error>(self, _: i64) -> Result<(), E> {
            Ok(())
        }

        fn visit_u64<E: Error>(self, _: u64) -> Result<(), E> {
            Ok(())
        }

        fn visit_f64<E: Error>(self, _: f64) -> Result<(), E> {
            Ok(())
        }

        fn visit_str<E: Error>(self, _: &str) -> Result<(), E> {
            Ok(())
        }

        fn visit_unit<E: Error>(self) -> Result<(), E> {
            Ok(())
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<(), A::Error> {
            while items.next_element_seed(self.inner()?)?.is_some() {}
            Ok(())
        }

        fn visit_map<A: MapAccess<'de>>(self, mut fields: A) -> Result<(), A::Error> {
            while fields.next_key::<IgnoredAny>()?.is_some() {
                fields.next_value_seed(self.inner()?)?;
            }
            Ok(())
        }
    }

    let mut reader = serde_json::Deserializer::from_str(json);
    Readable(MAX_VALUE_DEPTH).deserialize(&mut reader).and_then(|()| reader.end()).is_ok()
}

/// A field of a line holding bytes: `"<name>": <payload>`, or for bytes that are not
/// UTF-8, `"<name>_base64": "<base64>"`.
pub struct BytesField<'a> {
    name: &'static str,
    payload: Payload<'a>,
}

impl<'a> BytesField<'a> {
    /// A `"key"` field.
    pub fn key(bytes: &'a [u8]) -> Self {
        BytesField { name: "key", payload: Payload::of_key(bytes) }
    }

    /// A `"value"` field.
    pub fn value(bytes: &'a [u8]) -> Self {
        BytesField { name: "value", payload: Payload::of(bytes) }
    }

    /// Appends `,"<name>":<payload>` (or its base64 form) to `buf`, as serde writes it
    /// (the names need no escaping).
    fn write_to(&self, buf: &mut Vec<u8>) {
        let text = |buf: &mut Vec<u8>, text: &str| serde_json::to_writer(&mut *buf, text).expect("writing to memory");
        buf.extend_from_slice(b",\"");
        buf.extend_from_slice(self.name.as_bytes());
        match &self.payload {
            Payload::Json(raw) => {
                buf.extend_from_slice(b"\":");
                buf.extend_from_slice(raw.get().as_bytes());
            }
            Payload::Text(value) => {
                buf.extend_from_slice(b"\":");
                text(buf, value);
            }
            Payload::Bytes(bytes) => {
                buf.extend_from_slice(BASE64_SUFFIX.as_bytes());
                buf.extend_from_slice(b"\":");
                text(buf, &base64_of(bytes));
            }
        }
    }
}

/// `bytes` in standard base64.
fn base64_of(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

impl Serialize for BytesField<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(1))?;
        match &self.payload {
            Payload::Json(raw) => map.serialize_entry(self.name, raw)?,
            Payload::Text(text) => map.serialize_entry(self.name, text)?,
            Payload::Bytes(bytes) => {
                map.serialize_entry(&format!("{}{BASE64_SUFFIX}", self.name), &base64_of(bytes))?
            }
        }
        map.end()
    }
}

/// The end of every output line of a batch, `,"operator":"<version>"}` and the newline,
/// escaped once per batch rather than once per line.
pub struct OperatorField(Vec<u8>);

impl OperatorField {
    /// The field of operator build `version`.
    pub fn new(version: &str) -> Self {
        let mut field = br#","operator":"#.to_vec();
        serde_json::to_writer(&mut field, version).expect("serializing to memory cannot fail");
        field.extend_from_slice(b"}\n");
        OperatorField(field)
    }
}

/// Appends the output line for `output`, of `origin`, by the operator whose field is
/// `operator`, to `buf`: the same line as `Line` writes, field by field.
pub fn format_output(buf: &mut Vec<u8>, origin: &Origin, output: &Output, operator: &OperatorField) {
    let text = |buf: &mut Vec<u8>, text: &str| serde_json::to_writer(&mut *buf, text).expect("writing to memory");
    buf.extend_from_slice(br#"{"partition":"#);
    buf.extend_from_slice(itoa::Buffer::new().format(origin.partition).as_bytes());
    buf.extend_from_slice(br#","offset":"#);
    buf.extend_from_slice(itoa::Buffer::new().format(origin.offset).as_bytes());
    if let Some(cause) = origin.cause.name() {
        buf.extend_from_slice(br#","cause":"#);
        text(buf, cause);
    }
    BytesField::key(&output.key).write_to(buf);
    if let Some(topic) = &output.topic {
        buf.extend_from_slice(br#","topic":"#);
        text(buf, topic);
    }
    BytesField::value(&output.value).write_to(buf);
    buf.extend_from_slice(&operator.0);
}

/// The line `sluice state dump` shows for the state entry of `partition` stored under
/// record key `key` and `name` with `value`: `partition`, `name`, the key (`key`, or
/// `key_base64`), the value (a value in the SDK's binary encoding as the JSON it
/// decodes to, any other embedded if JSON a reader holds, else text, else
/// `value_base64`: see [`Payload`]) and `expires_at_ms` when it expires.
pub fn state_line(
    partition: u32,
    key: &[u8],
    name: &str,
    value: &[u8],
    expires_at_ms: Option<u64>,
) -> serde_json::Value {
    use sluice_guest::encoding::{self, BINARY_MARKER};
    let mut line = serde_json::json!({ "partition": partition, "name": name });
    let fields = line.as_object_mut().expect("an object");
    let mut add = |field: serde_json::Value| fields.extend(field.as_object().cloned().unwrap_or_default());
    add(serde_json::to_value(BytesField::key(key)).expect("a key serializes"));
    let decoded = match value.first() {
        // Nested deeper than a reader reads (MessagePack allows more), it stays bytes.
        Some(&BINARY_MARKER) => encoding::decode::<serde_json::Value>(value)
            .ok()
            .filter(|value| readable_json(&value.to_string()).is_some()),
        _ => None,
    };
    add(match decoded {
        Some(value) => serde_json::json!({ "value": value }),
        None => serde_json::to_value(BytesField::value(value)).expect("a value serializes"),
    });
    if let Some(at) = expires_at_ms {
        line["expires_at_ms"] = at.into();
    }
    line
}

/// Appends to `buf` the dead-letter line of `dead`, by operator `version`.
pub fn format_dead_letter(buf: &mut Vec<u8>, dead: &DeadLetter, version: &str) {
    Line {
        partition: dead.origin.partition,
        offset: dead.origin.offset,
        cause: dead.origin.cause.name(),
        key: BytesField::key(&dead.key),
        topic: dead.topic.as_deref(),
        value: BytesField::value(&dead.value),
        operator: version,
        error: Some(dead.kind.name()),
        reason: Some(&dead.reason),
        attempts: dead.attempts,
    }
    .write_to(buf);
}

/// How much of a line the other must match in [`differing_fields`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compare {
    /// Every field of the first line, an object's fields likewise; fields the first
    /// leaves out are not compared (an expected line of `sluice test`).
    Subset,
    /// Every field of either line (two versions' outputs of one record).
    Exact,
}

/// A field in which two JSON lines differ: its path (`value.count`) and its value in
/// each, `None` where that line has no such field.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FieldDifference {
    /// The fields' names from the line down, joined by dots; empty for the lines
    /// themselves (one is not an object).
    pub path: String,
    /// Its value in the first line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub left: Option<serde_json::Value>,
    /// Its value in the second line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub right: Option<serde_json::Value>,
}

/// Where `right` does not match `left`, field by field as `compare` says: objects are
/// compared field by field down to the first values that differ, a number matches the
/// same number written otherwise (`30` and `30.0`), anything else matches when equal.
pub fn differing_fields(left: &serde_json::Value, right: &serde_json::Value, compare: Compare) -> Vec<FieldDifference> {
    let mut found = Vec::new();
    differing_below("", Some(left), Some(right), compare, &mut found);
    found
}

fn differing_below(
    path: &str,
    left: Option<&serde_json::Value>,
    right: Option<&serde_json::Value>,
    compare: Compare,
    found: &mut Vec<FieldDifference>,
) {
    use serde_json::Value;
    let below = |name: &str| if path.is_empty() { name.to_string() } else { format!("{path}.{name}") };
    match (left, right) {
        (Some(Value::Object(left)), Some(Value::Object(right))) => {
            for (name, value) in left {
                // A subset's `null` matches a field left out.
                static NULL: Value = Value::Null;
                let other = right.get(name).or((compare == Compare::Subset).then_some(&NULL));
                differing_below(&below(name), Some(value), other, compare, found);
            }
            if compare == Compare::Exact {
                for (name, value) in right.iter().filter(|(name, _)| !left.contains_key(*name)) {
                    differing_below(&below(name), None, Some(value), compare, found);
                }
            }
        }
        (left, right) if left == right => {}
        // 30 and 30.0 are one number to a reader of JSON.
        (Some(Value::Number(l)), Some(Value::Number(r))) if l.as_f64() == r.as_f64() => {}
        (left, right) => {
            found.push(FieldDifference { path: path.to_string(), left: left.cloned(), right: right.cloned() })
        }
    }
}

/// Reads the next line of `reader` into `line` (its newline included), up to `max`
/// bytes of it and its newline, never holding more; returns the bytes the line had,
/// its newline not counted (more than `max`: it was too long, and `line` holds its
/// start), and `None` at the end of the input.
pub fn read_line_bounded(
    reader: &mut impl std::io::BufRead,
    line: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Option<usize>> {
    let mut read = 0;
    loop {
        let buffer = reader.fill_buf()?;
        if buffer.is_empty() {
            return Ok((read > 0).then_some(read));
        }
        let (chunk, ends) = match buffer.iter().position(|&b| b == b'\n') {
            Some(at) => (&buffer[..=at], true),
            None => (buffer, false),
        };
        let room = (max + 1).saturating_sub(line.len());
        line.extend_from_slice(&chunk[..chunk.len().min(room)]);
        let taken = chunk.len();
        reader.consume(taken);
        read += taken;
        if ends {
            return Ok(Some(read - 1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Cause;

    /// [`format_output`] writes, field by field, the line serde writes for [`Line`]:
    /// JSON values embedded, other values and keys as strings, bytes that are not UTF-8
    /// in base64, escapes, topics.
    #[test]
    fn an_output_line_is_the_line_serde_writes() {
        let record = Origin { partition: 3, offset: 1_234_567, cause: Cause::Record };
        let expiry = Origin { cause: Cause::Expiry, ..record };
        let timer = Origin { cause: Cause::Timer, ..record };
        let outputs = [
            Output { key: b"veh-1".to_vec(), value: br#"{"count":1,"name":"a\"b"}"#.to_vec(), topic: None },
            Output { key: vec![0xff, b'x'], value: b"plain \"text\"\n".to_vec(), topic: Some("other".into()) },
            Output { key: Vec::new(), value: vec![0xC1, 0x80], topic: None },
            Output { key: b"k".to_vec(), value: b" [1, 2] ".to_vec(), topic: None },
        ];
        let version = "vehicle_stats@\"quoted\"";
        for (output, origin) in outputs.iter().zip([record, expiry, timer].iter().cycle()) {
            let mut fast = Vec::new();
            format_output(&mut fast, origin, output, &OperatorField::new(version));
            let mut reference = Vec::new();
            Line {
                partition: origin.partition,
                offset: origin.offset,
                cause: origin.cause.name(),
                key: BytesField::key(&output.key),
                topic: output.topic.as_deref(),
                value: BytesField::value(&output.value),
                operator: version,
                error: None,
                reason: None,
                attempts: None,
            }
            .write_to(&mut reference);
            assert_eq!(String::from_utf8_lossy(&fast), String::from_utf8_lossy(&reference));
        }
    }

    /// A value is embedded where a line holding it reads back with serde_json (numbers a
    /// double holds, nesting under its limit with the line around it); otherwise it is a
    /// string of its text. Either way the line reads back.
    #[test]
    fn json_a_reader_cannot_hold_is_written_as_text() {
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        let values = [
            (" [1, 2] ".to_string(), true),
            ("1e308".into(), true),
            ("18446744073709551616".into(), true),
            (deep(1), true),
            (deep(MAX_VALUE_DEPTH), true),
            (format!(r#"{{"a": {}}}"#, deep(MAX_VALUE_DEPTH - 1)), true),
            ("1.5e-7".into(), true),
            (format!("1{}", "0".repeat(308)), true),
            (format!(r#""{}""#, "[".repeat(200)), true),
            (r#""\u00e9""#.into(), true),
            ("1e400".into(), false),
            ("9".repeat(309), false),
            (r#""\ud800""#.into(), false),
            ("-1e400".into(), false),
            (r#"{"a": [1e999]}"#.into(), false),
            (deep(MAX_VALUE_DEPTH + 1), false),
            (format!(r#"{{"a": {}}}"#, deep(MAX_VALUE_DEPTH)), false),
            (deep(200), false),
            ("[1,".into(), false),
            ("1 2".into(), false),
        ];
        let origin = Origin { partition: 0, offset: 1, cause: Cause::Record };
        for (value, embedded) in values {
            assert_eq!(readable_json(&value).is_some(), embedded, "{value}");
            let mut line = Vec::new();
            let output = Output { key: b"k".to_vec(), value: value.clone().into_bytes(), topic: None };
            format_output(&mut line, &origin, &output, &OperatorField::new("v"));
            let line: serde_json::Value = serde_json::from_slice(&line).expect("every line reads back");
            match embedded {
                true => assert_eq!(line["value"], serde_json::from_str::<serde_json::Value>(&value).unwrap()),
                false => assert_eq!(line["value"], value.as_str()),
            }
        }
    }

    /// Keys and values that are not UTF-8 are written losslessly: two that differ only
    /// in bytes a lossy conversion would merge stay apart, and decode back.
    #[test]
    fn bytes_that_are_not_utf8_are_written_in_base64() {
        use base64::Engine;
        let origin = Origin { partition: 0, offset: 1, cause: Cause::Record };
        let line = |key: &[u8], value: &[u8]| {
            let mut buf = Vec::new();
            let output = Output { key: key.to_vec(), value: value.to_vec(), topic: None };
            format_output(&mut buf, &origin, &output, &OperatorField::new("v"));
            serde_json::from_slice::<serde_json::Value>(&buf).unwrap()
        };
        let (a, b) = (line(&[0xff], &[0x80, 0]), line(&[0xfe], &[0x81, 0]));
        assert_ne!(a, b);
        let decode =
            |v: &serde_json::Value| base64::engine::general_purpose::STANDARD.decode(v.as_str().unwrap()).unwrap();
        assert_eq!((decode(&a["key_base64"]), decode(&a["value_base64"])), (vec![0xff], vec![0x80, 0]));
        assert!(a.get("key").is_none() && a.get("value").is_none(), "{a}");
        let text = line(b"k", b"plain");
        assert_eq!((text["key"].as_str(), text["value"].as_str()), (Some("k"), Some("plain")));
    }
}
