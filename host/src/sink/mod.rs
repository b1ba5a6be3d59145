//! Where outputs and dead letters go: JSONL lines to a file or stdout, or records on
//! Kafka topics ([`kafka`]).
//!
//! This module owns the line formats and the choice of sink. A worker hands a whole
//! batch's outputs to [`Sink::write`] (and its dead letters to a [`LineSink`]) before
//! it commits state, so an output is never lost: after a crash, the batch that was
//! written but not committed is processed and written again (outputs are
//! at-least-once; state is exactly-once).

pub mod kafka;

use crate::config::SinkConfig;
use crate::record::{Output, SourceRecord};
use anyhow::{Context, Result};
use serde::Serialize;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

/// Where the job's outputs go, shared by all workers.
pub enum Sink {
    /// JSONL lines to a file or stdout.
    Lines(LineSink),
    /// Records on Kafka topics.
    Kafka(kafka::KafkaSink),
}

impl Sink {
    /// Writes a batch's outputs, each with the input that produced it, all produced by
    /// operator `version`, and returns once they are durable enough to commit the batch's
    /// state after them.
    pub fn write(&self, outputs: &[(&SourceRecord, Output)], version: &str) -> Result<()> {
        match self {
            Sink::Lines(lines) => {
                let mut buf = Vec::new();
                for (input, output) in outputs {
                    format_output(&mut buf, input, output, version);
                }
                lines.write(&buf)
            }
            Sink::Kafka(kafka) => kafka.write(outputs, version),
        }
    }

    /// Where this sink writes, for messages.
    pub fn name(&self) -> &str {
        match self {
            Sink::Lines(lines) => lines.name(),
            Sink::Kafka(kafka) => kafka.name(),
        }
    }
}

/// A destination of JSONL lines shared by all workers.
pub struct LineSink {
    out: Mutex<Box<dyn Write + Send>>,
    name: String,
}

impl LineSink {
    /// Appends to the file at `path`, creating it and its directory when missing.
    ///
    /// A torn last line — the host was killed in the middle of a write — is cut off
    /// first: its batch was never committed, so it will be processed and written again.
    pub fn file(path: &Path) -> Result<Self> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).with_context(|| format!("creating directory {}", parent.display()))?;
        }
        let file: File = OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .open(path)
            .with_context(|| format!("opening {} for appending", path.display()))?;
        cut_torn_line(&file).with_context(|| format!("repairing the end of {}", path.display()))?;
        Ok(LineSink { out: Mutex::new(Box::new(file)), name: path.display().to_string() })
    }

    /// Writes to standard output.
    pub fn stdout() -> Self {
        LineSink { out: Mutex::new(Box::new(std::io::stdout())), name: "stdout".into() }
    }

    /// Where this sink writes, for messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Writes complete lines in one piece and flushes them to the OS.
    pub fn write(&self, lines: &[u8]) -> Result<()> {
        if lines.is_empty() {
            return Ok(());
        }
        let mut out = self.out.lock().expect("a sink writer panicked");
        out.write_all(lines).and_then(|()| out.flush()).with_context(|| format!("writing to {}", self.name))
    }
}

/// Truncates `file` after its last newline.
fn cut_torn_line(file: &File) -> std::io::Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    let len = file.metadata()?.len();
    let mut reader = file;
    let mut end = len;
    let mut chunk = vec![0u8; 64 * 1024];
    while end > 0 {
        let start = end.saturating_sub(chunk.len() as u64);
        let buf = &mut chunk[..(end - start) as usize];
        reader.seek(SeekFrom::Start(start))?;
        reader.read_exact(buf)?;
        if let Some(i) = buf.iter().rposition(|&b| b == b'\n') {
            end = start + i as u64 + 1;
            break;
        }
        end = start;
    }
    if end < len {
        tracing::warn!("cutting {} bytes of a torn last line", len - end);
        file.set_len(end)?;
    }
    Ok(())
}

impl Sink {
    /// Opens the sink `config` describes.
    pub fn open(config: &SinkConfig) -> Result<Self> {
        Ok(match config {
            SinkConfig::File { path } => Sink::Lines(LineSink::file(path)?),
            SinkConfig::Stdout => Sink::Lines(LineSink::stdout()),
            SinkConfig::Kafka { brokers, topic, properties } => {
                Sink::Kafka(kafka::KafkaSink::open(brokers, topic, properties)?)
            }
        })
    }
}

/// One line of the outputs or the dead letters: where the input record was, the
/// output (or the input, for a dead letter), the operator build, and for a dead letter
/// why it was not processed.
#[derive(Serialize)]
struct Line<'a> {
    partition: u32,
    offset: u64,
    key: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    topic: Option<&'a str>,
    value: Payload<'a>,
    /// The operator build that produced it (or that refused the input).
    operator: &'a str,
    /// `rejected` (the operator returned an error) or `trapped`; dead letters only.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
}

impl Line<'_> {
    /// Appends this line to `buf`.
    fn write_to(&self, buf: &mut Vec<u8>) {
        serde_json::to_writer(&mut *buf, self).expect("serializing to memory cannot fail");
        buf.push(b'\n');
    }
}

/// A payload embedded as JSON when it is JSON, else as a (lossy UTF-8) string.
pub enum Payload<'a> {
    /// Valid JSON, embedded as is.
    Json(&'a serde_json::value::RawValue),
    /// Anything else, as a string.
    Text(std::borrow::Cow<'a, str>),
}

impl<'a> Payload<'a> {
    /// Classifies `bytes`.
    pub fn of(bytes: &'a [u8]) -> Self {
        match std::str::from_utf8(bytes).ok().and_then(|s| serde_json::from_str(s).ok()) {
            Some(raw) => Payload::Json(raw),
            None => Payload::Text(String::from_utf8_lossy(bytes)),
        }
    }
}

impl Serialize for Payload<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Payload::Json(raw) => raw.serialize(s),
            Payload::Text(text) => text.serialize(s),
        }
    }
}

/// Appends the output line for `output`, produced from `input` by operator `version`,
/// to `buf`.
fn format_output(buf: &mut Vec<u8>, input: &SourceRecord, output: &Output, version: &str) {
    Line {
        partition: input.partition,
        offset: input.offset,
        key: &String::from_utf8_lossy(&output.key),
        topic: output.topic.as_deref(),
        value: Payload::of(&output.value),
        operator: version,
        error: None,
        reason: None,
    }
    .write_to(buf);
}

/// Appends the dead-letter line for `input` to `buf`.
pub fn format_dead_letter(buf: &mut Vec<u8>, input: &SourceRecord, operator: &str, error: &str, reason: &str) {
    Line {
        partition: input.partition,
        offset: input.offset,
        key: &String::from_utf8_lossy(&input.key),
        topic: None,
        value: Payload::of(&input.value),
        operator,
        error: Some(error),
        reason: Some(reason),
    }
    .write_to(buf);
}
