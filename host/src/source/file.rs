//! A JSONL file as a source: one record per non-empty line.

use crate::record::RawRecord;
use anyhow::{Context, Result};
use std::fs::File;
use std::io::{BufRead, BufReader, Lines};
use std::path::{Path, PathBuf};

/// Reads records from a JSONL file. The key is the string (or number) in
/// `key_field`; the event time is the integer in `timestamp_field`, else 0.
///
/// A line that is not a JSON object with a key gets the empty key, like a Kafka
/// record with a null key, and still reaches the operator, which decides what to do
/// with it (a JSON operator rejects it to the dead-letter file with the reason).
pub struct JsonlFile {
    path: PathBuf,
    lines: Lines<BufReader<File>>,
    line: u64,
    key_field: String,
    timestamp_field: String,
}

impl JsonlFile {
    /// Opens `path`.
    pub fn open(path: &Path, key_field: &str, timestamp_field: &str) -> Result<Self> {
        let file = File::open(path).with_context(|| format!("opening source file {}", path.display()))?;
        Ok(JsonlFile {
            path: path.to_path_buf(),
            lines: BufReader::new(file).lines(),
            line: 0,
            key_field: key_field.to_string(),
            timestamp_field: timestamp_field.to_string(),
        })
    }
}

impl Iterator for JsonlFile {
    type Item = Result<RawRecord>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            self.line += 1;
            let line = match self.lines.next()? {
                Ok(line) => line,
                Err(e) => return Some(Err(e).context(format!("reading {} line {}", self.path.display(), self.line))),
            };
            if line.trim().is_empty() {
                continue;
            }
            let parsed: Option<serde_json::Map<String, serde_json::Value>> = serde_json::from_str(&line).ok();
            let field = |name: &str| parsed.as_ref().and_then(|m| m.get(name));
            let key = match field(&self.key_field) {
                Some(serde_json::Value::String(s)) => s.clone().into_bytes(),
                Some(n @ serde_json::Value::Number(_)) => n.to_string().into_bytes(),
                _ => Vec::new(),
            };
            let timestamp_ms = field(&self.timestamp_field).and_then(serde_json::Value::as_i64).unwrap_or(0);
            return Some(Ok(RawRecord { key, value: line.into_bytes(), timestamp_ms }));
        }
    }
}
