//! A JSONL file as a source: one record per non-empty line.

use super::events::LINE_TOO_LONG;
use crate::lines::read_line_bounded;
use crate::record::RawRecord;
use anyhow::{Context, Result};
use serde_json::value::RawValue;
use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

/// Reads records from a JSONL file. The key is the string (or number, as written) in
/// `key_field`; the event time is the integer in `timestamp_field`, else 0.
///
/// A line that is not a JSON object with a key — not JSON, or not even UTF-8 — gets the
/// empty key, like a Kafka record with a null key, and still reaches the operator, its
/// bytes as they are, which decides what to do with it (a JSON operator rejects it to
/// the dead letters with the reason): one bad line costs that line, never the job. A
/// line longer than `max_line_bytes` is skipped, with an error in the log naming it,
/// without ever being held whole.
pub struct JsonlFile {
    path: PathBuf,
    reader: BufReader<File>,
    line: u64,
    key_field: String,
    timestamp_field: String,
    max_line_bytes: usize,
}

impl JsonlFile {
    /// Opens `path`.
    pub fn open(path: &Path, key_field: &str, timestamp_field: &str, max_line_bytes: usize) -> Result<Self> {
        let file = File::open(path).with_context(|| format!("opening source file {}", path.display()))?;
        Ok(JsonlFile {
            path: path.to_path_buf(),
            reader: BufReader::new(file),
            line: 0,
            key_field: key_field.to_string(),
            timestamp_field: timestamp_field.to_string(),
            max_line_bytes,
        })
    }

    /// The key in `line`'s `key_field`: a string's text, or a number as written (so two
    /// numbers beyond what a float holds exactly stay two keys); empty without one.
    fn key_and_timestamp(&self, line: &[u8]) -> (Vec<u8>, i64) {
        let Ok(fields) = serde_json::from_slice::<HashMap<String, &RawValue>>(line) else {
            return (Vec::new(), 0);
        };
        let key = match fields.get(self.key_field.as_str()).map(|raw| raw.get()) {
            Some(text) if text.starts_with('"') => {
                serde_json::from_str::<String>(text).unwrap_or_default().into_bytes()
            }
            Some(text) if text.starts_with(|c: char| c == '-' || c.is_ascii_digit()) => text.as_bytes().to_vec(),
            _ => Vec::new(),
        };
        let timestamp = fields.get(self.timestamp_field.as_str()).and_then(|raw| raw.get().parse().ok());
        (key, timestamp.unwrap_or(0))
    }
}

impl Iterator for JsonlFile {
    type Item = Result<RawRecord>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            self.line += 1;
            let mut line = Vec::new();
            let read = match read_line_bounded(&mut self.reader, &mut line, self.max_line_bytes) {
                Ok(None) => return None,
                Ok(Some(read)) => read,
                Err(e) => return Some(Err(e).context(format!("reading {} line {}", self.path.display(), self.line))),
            };
            if read > self.max_line_bytes {
                tracing::error!(
                    "{} line {}: {LINE_TOO_LONG}: {read} bytes, over [source] max_line_bytes = {}",
                    self.path.display(),
                    self.line,
                    self.max_line_bytes
                );
                continue;
            }
            if line.ends_with(b"\n") {
                line.pop();
            }
            if line.ends_with(b"\r") {
                line.pop();
            }
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let (key, timestamp_ms) = self.key_and_timestamp(&line);
            return Some(Ok(RawRecord { key, value: line, timestamp_ms }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(text: &[u8]) -> Result<Vec<RawRecord>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("input.jsonl");
        std::fs::write(&path, text)?;
        JsonlFile::open(&path, "id", "ts", 64)?.collect()
    }

    /// Keys are taken as written: numbers past what a float holds exactly stay apart,
    /// escaped strings are unescaped; the timestamp is the integer field, else 0.
    #[test]
    fn keys_are_never_merged() -> Result<()> {
        let text = b"{\"id\": 18446744073709551617, \"ts\": 5}\n{\"id\": 18446744073709551616}\n\
                     {\"id\": \"a\\\"b\", \"ts\": \"7\"}\r\n{\"id\": -3}\n";
        let keys: Vec<(String, i64)> = records(text)?
            .into_iter()
            .map(|r| (String::from_utf8_lossy(&r.key).into_owned(), r.timestamp_ms))
            .collect();
        let expected = [("18446744073709551617", 5), ("18446744073709551616", 0), ("a\"b", 0), ("-3", 0)];
        assert_eq!(keys, expected.map(|(k, ts)| (k.to_string(), ts)));
        Ok(())
    }

    /// A line that is not UTF-8 (or not JSON) is a record with the empty key and its
    /// bytes as they are; the lines after it are read as usual.
    #[test]
    fn a_line_that_is_not_utf8_is_a_record_with_its_bytes() -> Result<()> {
        let text = b"{\"id\": \"a\"}\n{\"id\": \"\xff\xfe\"}\nnot json\n\n{\"id\": \"b\"}";
        let read = records(text)?;
        let keys: Vec<&[u8]> = read.iter().map(|r| &r.key[..]).collect();
        assert_eq!(keys, [&b"a"[..], b"", b"", b"b"]);
        assert_eq!(read[1].value, b"{\"id\": \"\xff\xfe\"}");
        assert_eq!(read[3].value, b"{\"id\": \"b\"}", "a last line without a newline");
        Ok(())
    }

    /// A line over the cap is skipped, whatever its length, and the next read as usual;
    /// one exactly at the cap is a record.
    #[test]
    fn a_line_over_the_cap_is_skipped() -> Result<()> {
        let at_cap = format!("{{\"id\": \"a\", \"pad\": \"{}\"}}", "x".repeat(64 - 22));
        assert_eq!(at_cap.len(), 64);
        let over = format!("{{\"id\": \"b\", \"pad\": \"{}\"}}", "x".repeat(100_000));
        let just_over = format!("{at_cap} ");
        let text = format!("{at_cap}\n{over}\n{{\"id\": \"c\"}}\n{over}\n{at_cap}\n{just_over}");
        let read = records(text.as_bytes())?;
        let keys: Vec<&[u8]> = read.iter().map(|r| &r.key[..]).collect();
        assert_eq!(keys, [&b"a"[..], b"c", b"a"], "the last line, a byte over and without a newline, is skipped");
        Ok(())
    }
}
