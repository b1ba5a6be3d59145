//! Where outputs and dead letters go: JSONL lines to a file or stdout, or records on
//! Kafka topics ([`kafka`]).
//!
//! This module owns the line formats and the choice of sinks. A worker hands a whole
//! batch's outputs to [`Sink::send`], and its dead letters to
//! [`DeadLetterSink::send`], and goes on with its next batch; before it commits state
//! it makes them final through its [`PartitionOutputs`]: it waits until every output
//! (and every dead letter on a Kafka topic) of the batches the commit covers is where
//! it was sent, or, with exactly-once outputs, commits their Kafka [transaction]. So
//! an output is never lost: after a crash, the batches processed since the last commit
//! are processed again, and sent again (at-least-once) or, where a committed
//! transaction holds their outputs already, not (exactly-once).

pub mod kafka;
pub mod transaction;

use crate::config::{DeadLetterConfig, Guarantee, SinkConfig, SourceConfig};
use crate::record::{Cause, DeadLetter, DeadLetterKind, Origin, Output};
use crate::state::StateEntry;
use anyhow::{Context, Result};
use serde::Serialize;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// The most formatted lines a line sink holds before it writes them: a batch's
/// outputs are written in pieces of about this size, so formatting them (which can make
/// a value six times longer: a NUL byte becomes `\u0000`) never holds a whole batch.
const LINE_CHUNK_BYTES: usize = 1 << 20;

/// Where the job's outputs go, shared by all workers.
pub enum Sink {
    /// JSONL lines to a file or stdout.
    Lines(LineSink),
    /// Records on Kafka topics, at least once.
    Kafka(kafka::KafkaSink),
    /// Records on Kafka topics, exactly once: each partition through its own
    /// transactions.
    Transactional(transaction::TransactionalSink),
}

impl Sink {
    /// `partition`'s side of this sink, made when its worker starts with state at
    /// `state_offset`: for exactly-once outputs it takes over the partition's
    /// transactions, fencing earlier owners.
    pub fn partition(&self, partition: u32, state_offset: u64) -> Result<PartitionOutputs> {
        Ok(match self {
            Sink::Transactional(sink) => PartitionOutputs::Transaction(sink.begin(partition, state_offset)?),
            Sink::Lines(_) | Sink::Kafka(_) => PartitionOutputs::Acknowledged(None),
        })
    }

    /// Sends a batch's outputs, each with its origin, all produced by operator
    /// `version`, as part of `into`, the sending partition's outputs. A line sink has
    /// written them when it returns (formatted into `scratch`, which the caller keeps
    /// from batch to batch so its memory is reused, [`LINE_CHUNK_BYTES`] at a time, so
    /// it holds that plus one line); a Kafka sink has queued them,
    /// counted in `into` until the broker acknowledges them, or in `into`'s open
    /// transaction. An output Kafka refuses for itself (over the producer's
    /// `message.max.bytes`) is not sent: its dead letter goes into `refused`.
    pub fn send(
        &self,
        outputs: &[(Origin, Output)],
        version: &str,
        scratch: &mut Vec<u8>,
        into: &mut PartitionOutputs,
        refused: &mut Vec<DeadLetter>,
    ) -> Result<()> {
        if outputs.is_empty() {
            return Ok(());
        }
        match (self, into) {
            (Sink::Lines(lines), _) => {
                scratch.clear();
                let operator = OperatorField::new(version);
                for (origin, output) in outputs {
                    format_output(scratch, origin, output, &operator);
                    if scratch.len() >= LINE_CHUNK_BYTES {
                        lines.write(scratch)?;
                        scratch.clear();
                    }
                }
                lines.write(scratch)
            }
            (Sink::Kafka(kafka), PartitionOutputs::Acknowledged(acks)) => {
                kafka.send(outputs, version, acks.get_or_insert_with(Default::default), refused)
            }
            (Sink::Transactional(_), PartitionOutputs::Transaction(transaction)) => {
                transaction.send(outputs, version, refused)
            }
            _ => unreachable!("a partition's outputs come from Sink::partition of the same sink"),
        }
    }

    /// Makes the lines a line sink wrote durable ([`LineSink::sync`]); a Kafka sink's
    /// outputs are made final by [`PartitionOutputs::commit`] instead.
    pub fn sync(&self) -> Result<()> {
        match self {
            Sink::Lines(lines) => lines.sync(),
            Sink::Kafka(_) | Sink::Transactional(_) => Ok(()),
        }
    }

    /// Where this sink writes, for messages.
    pub fn name(&self) -> &str {
        match self {
            Sink::Lines(lines) => lines.name(),
            Sink::Kafka(kafka) => kafka.name(),
            Sink::Transactional(sink) => sink.name(),
        }
    }
}

/// One partition's outputs since its last commit, as its sink keeps them until the
/// commit makes them final.
pub enum PartitionOutputs {
    /// Sent through a shared sink: the acknowledgements a Kafka broker still owes (a
    /// line sink's writes are done when [`Sink::send`] returns).
    Acknowledged(Option<Arc<kafka::Acks>>),
    /// The partition's own Kafka transaction.
    Transaction(transaction::PartitionTransaction),
}

impl PartitionOutputs {
    /// The offset below which every input's outputs are committed already, so that
    /// processing those inputs again emits nothing: a committed transaction's, else 0.
    pub fn covered(&self) -> u64 {
        match self {
            PartitionOutputs::Acknowledged(_) => 0,
            PartitionOutputs::Transaction(transaction) => transaction.covered(),
        }
    }

    /// The first delivery that failed so far, or a transactional producer's fatal
    /// error (fenced, above all), as an error, without waiting.
    pub fn check(&self) -> Result<()> {
        match self {
            PartitionOutputs::Acknowledged(acks) => match acks.as_deref().and_then(kafka::Acks::failure) {
                Some(failure) => Err(anyhow::anyhow!("{failure}")),
                None => Ok(()),
            },
            PartitionOutputs::Transaction(transaction) => transaction.check(),
        }
    }

    /// Makes every output sent since the last commit final, before the state of the
    /// inputs below `next_offset` commits: waits until each is acknowledged, or commits
    /// the transaction with `next_offset` as the group's offset. A failed delivery or
    /// transaction, or outputs still unacknowledged after [`kafka::DELIVERY_TIMEOUT`],
    /// is the error, and then nothing sent since the last commit may be taken as
    /// delivered.
    pub fn commit(&mut self, next_offset: u64) -> Result<()> {
        match self {
            PartitionOutputs::Acknowledged(acks) => {
                if let Some(acks) = acks.take() {
                    acks.wait(kafka::DELIVERY_TIMEOUT).map_err(|failure| anyhow::anyhow!("{failure}"))?;
                }
                Ok(())
            }
            PartitionOutputs::Transaction(transaction) => transaction.commit(next_offset),
        }
    }
}

/// A destination of JSONL lines shared by all workers.
pub struct LineSink {
    out: Mutex<Box<dyn Write + Send>>,
    /// The file written to, for [`sync`](Self::sync) (another handle of it, so a sync
    /// does not hold up the writers); `None` for stdout, for what is not a regular file,
    /// and when not syncing.
    file: Option<File>,
    name: String,
}

impl LineSink {
    /// Appends to the file at `path`, creating it and its directory when missing;
    /// [`sync`](Self::sync) makes what was written durable when `sync` is set, else
    /// does nothing (`[state] sync_outputs`).
    ///
    /// A torn last line — the host was killed in the middle of a write — is cut off
    /// first: its batch was never committed, so it will be processed and written again.
    ///
    /// Only a regular file holds lines to make durable: `/dev/null`, a pipe or a FIFO
    /// refuses to be synced (and has no end to cut), so one is written unsynced, which
    /// is logged once, here ([`NOT_SYNCED`]).
    pub fn file(path: &Path, sync: bool) -> Result<Self> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).with_context(|| format!("creating directory {}", parent.display()))?;
        }
        // Read and write: opening a FIFO so does not wait for its reader, and a regular
        // file's torn end is read to be cut.
        let file: File = OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .open(path)
            .with_context(|| format!("opening {} for appending", path.display()))?;
        let regular = file.metadata().with_context(|| format!("reading the metadata of {}", path.display()))?.is_file();
        if regular {
            cut_torn_line(&file).with_context(|| format!("repairing the end of {}", path.display()))?;
        }
        let handle = match (sync, regular) {
            (true, true) => Some(file.try_clone().with_context(|| format!("opening {} for syncing", path.display()))?),
            (true, false) => {
                tracing::info!("{} {NOT_SYNCED} ([state] sync_outputs applies to regular files)", path.display());
                None
            }
            (false, _) => None,
        };
        Ok(LineSink { out: Mutex::new(Box::new(file)), file: handle, name: path.display().to_string() })
    }

    /// Writes to standard output.
    pub fn stdout() -> Self {
        LineSink { out: Mutex::new(Box::new(std::io::stdout())), file: None, name: "stdout".into() }
    }

    /// Makes every line written so far durable (on disk, not only handed to the OS):
    /// a commit does this before its state, so after a power loss the state is never
    /// ahead of the lines it emitted. Nothing for stdout or what is not a regular file.
    pub fn sync(&self) -> Result<()> {
        match &self.file {
            Some(file) => file.sync_data().with_context(|| format!("syncing {} to disk", self.name)),
            None => Ok(()),
        }
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
        out.write_all(lines).and_then(|()| out.flush()).with_context(|| format!("writing to {}", self.name))?;
        Ok(())
    }
}

/// Logged, after the path, when a line sink's file is not a regular file (`/dev/null`,
/// a pipe, a FIFO): its lines are written but cannot be synced to disk.
pub const NOT_SYNCED: &str = "is not a regular file: lines written to it are not synced to disk";

/// Where dead letters go, shared by all workers.
pub enum DeadLetterSink {
    /// JSONL lines to a file.
    Lines(LineSink),
    /// Records on this Kafka topic, sent through the job's Kafka sink with the
    /// outputs: a commit waits for their acknowledgements too, and with exactly-once
    /// outputs they are in the partition's transactions.
    Topic(String),
}

impl DeadLetterSink {
    /// Opens what `config` names (a file synced at each commit when `sync_files` is
    /// set); a topic must exist on the cluster of `sink`, which must be a Kafka sink.
    pub fn open(config: &DeadLetterConfig, sink: &SinkConfig, sync_files: bool) -> Result<Self> {
        match (&config.topic, sink) {
            (None, _) => Ok(DeadLetterSink::Lines(LineSink::file(config.path(), sync_files)?)),
            (Some(topic), SinkConfig::Kafka { brokers, properties, .. }) => {
                kafka::check_topic(brokers, properties, topic, "[dead_letter]")?;
                Ok(DeadLetterSink::Topic(topic.clone()))
            }
            (Some(topic), _) => anyhow::bail!("[dead_letter] topic = {topic:?} needs a Kafka sink"),
        }
    }

    /// Sends `dead`, all of operator `version`'s batch, as part of `into`, the sending
    /// partition's outputs on `sink` (formatting lines into `scratch`, as
    /// [`Sink::send`] does).
    pub fn send(
        &self,
        dead: &[DeadLetter],
        version: &str,
        sink: &Sink,
        scratch: &mut Vec<u8>,
        into: &mut PartitionOutputs,
    ) -> Result<()> {
        if dead.is_empty() {
            return Ok(());
        }
        match (self, sink, into) {
            (DeadLetterSink::Lines(lines), _, _) => {
                scratch.clear();
                for dead in dead {
                    format_dead_letter(scratch, dead, version);
                    if scratch.len() >= LINE_CHUNK_BYTES {
                        lines.write(scratch)?;
                        scratch.clear();
                    }
                }
                lines.write(scratch)
            }
            (DeadLetterSink::Topic(topic), Sink::Kafka(kafka), PartitionOutputs::Acknowledged(acks)) => {
                kafka.send_dead_letters(topic, dead, version, acks.get_or_insert_with(Default::default))
            }
            (DeadLetterSink::Topic(topic), Sink::Transactional(_), PartitionOutputs::Transaction(transaction)) => {
                transaction.send_dead_letters(topic, dead, version)
            }
            _ => {
                unreachable!("a dead-letter topic is opened on a Kafka sink, and a partition's outputs are that sink's")
            }
        }
    }

    /// Makes the dead letters written to a file durable ([`LineSink::sync`]); those on a
    /// topic are made final with the outputs.
    pub fn sync(&self) -> Result<()> {
        match self {
            DeadLetterSink::Lines(lines) => lines.sync(),
            DeadLetterSink::Topic(_) => Ok(()),
        }
    }

    /// Where dead letters go, for messages.
    pub fn name(&self) -> String {
        match self {
            DeadLetterSink::Lines(lines) => lines.name().to_string(),
            DeadLetterSink::Topic(topic) => format!("topic {topic}"),
        }
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
    /// Opens the sink `config` describes, for a job reading `source` (whose consumer
    /// group exactly-once outputs commit input offsets to); a file is synced at each
    /// commit when `sync_files` is set.
    pub fn open(config: &SinkConfig, source: &SourceConfig, sync_files: bool) -> Result<Self> {
        Ok(match (config, source) {
            (SinkConfig::File { path }, _) => Sink::Lines(LineSink::file(path, sync_files)?),
            (SinkConfig::Stdout, _) => Sink::Lines(LineSink::stdout()),
            (SinkConfig::Kafka { brokers, topic, properties, guarantee: Guarantee::AtLeastOnce }, _) => {
                Sink::Kafka(kafka::KafkaSink::open(brokers, topic, properties)?)
            }
            (
                SinkConfig::Kafka { brokers, topic, properties, guarantee: Guarantee::ExactlyOnce },
                SourceConfig::Kafka {
                    brokers: source_brokers, topic: input, group, properties: source_properties, ..
                },
            ) => {
                let input = transaction::InputGroup {
                    brokers: source_brokers.clone(),
                    topic: input.clone(),
                    group: group.clone(),
                    properties: source_properties.clone(),
                };
                Sink::Transactional(transaction::TransactionalSink::open(brokers, topic, properties, input)?)
            }
            (SinkConfig::Kafka { .. }, _) => {
                anyhow::bail!("[sink] guarantee = \"exactly-once\" needs a Kafka source")
            }
        })
    }
}

/// What the `cause` field of an output or dead letter that an expiry caused says (an
/// input record's have none).
pub const EXPIRY_CAUSE: &str = "expiry";

/// The `cause` field of an output or dead letter of `origin`: none for an input record's.
fn cause(origin: &Origin) -> Option<&'static str> {
    (origin.cause == Cause::Expiry).then_some(EXPIRY_CAUSE)
}

/// One line of the outputs or the dead letters: where the input record was, the
/// output (or the input, for a dead letter), the operator build, and for a dead letter
/// why it was not processed.
#[derive(Serialize)]
struct Line<'a> {
    partition: u32,
    offset: u64,
    /// [`EXPIRY_CAUSE`] for an expiry's output or dead letter.
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
    /// The [`DeadLetterKind`]'s name; dead letters only.
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
/// (values only, see [`readable_json`]), else as a string when they are UTF-8, else in
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
struct OperatorField(Vec<u8>);

impl OperatorField {
    fn new(version: &str) -> Self {
        let mut field = br#","operator":"#.to_vec();
        serde_json::to_writer(&mut field, version).expect("serializing to memory cannot fail");
        field.extend_from_slice(b"}\n");
        OperatorField(field)
    }
}

/// Appends the output line for `output`, of `origin`, by the operator whose field is
/// `operator`, to `buf`: the same line as [`Line`] writes, field by field.
fn format_output(buf: &mut Vec<u8>, origin: &Origin, output: &Output, operator: &OperatorField) {
    let text = |buf: &mut Vec<u8>, text: &str| serde_json::to_writer(&mut *buf, text).expect("writing to memory");
    buf.extend_from_slice(br#"{"partition":"#);
    buf.extend_from_slice(itoa::Buffer::new().format(origin.partition).as_bytes());
    buf.extend_from_slice(br#","offset":"#);
    buf.extend_from_slice(itoa::Buffer::new().format(origin.offset).as_bytes());
    if let Some(cause) = cause(origin) {
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

/// Appends to `buf` the output line of `output`, of `origin`, by operator `version`.
pub fn format_output_line(buf: &mut Vec<u8>, origin: &Origin, output: &Output, version: &str) {
    format_output(buf, origin, output, &OperatorField::new(version));
}

/// The line `sluice state dump` shows for `entry` of `partition`: `partition`, `name`,
/// the key (`key`, or `key_base64`), the value (a value in the SDK's binary encoding as
/// the JSON it decodes to, any other embedded if JSON a reader holds, else text, else
/// `value_base64`: see [`Payload`]) and `expires_at_ms` when it expires.
pub fn state_line(partition: u32, entry: &StateEntry) -> serde_json::Value {
    use sluice_guest::encoding::{self, BINARY_MARKER};
    let mut line = serde_json::json!({ "partition": partition, "name": entry.name });
    let fields = line.as_object_mut().expect("an object");
    let mut add = |field: serde_json::Value| fields.extend(field.as_object().cloned().unwrap_or_default());
    add(serde_json::to_value(BytesField::key(&entry.key)).expect("a key serializes"));
    let decoded = match entry.value.first() {
        // Nested deeper than a reader reads (MessagePack allows more), it stays bytes.
        Some(&BINARY_MARKER) => encoding::decode::<serde_json::Value>(&entry.value)
            .ok()
            .filter(|value| readable_json(&value.to_string()).is_some()),
        _ => None,
    };
    add(match decoded {
        Some(value) => serde_json::json!({ "value": value }),
        None => serde_json::to_value(BytesField::value(&entry.value)).expect("a value serializes"),
    });
    if let Some(at) = entry.expires_at_ms {
        line["expires_at_ms"] = at.into();
    }
    line
}

/// Appends to `buf` the dead-letter line of `dead`, by operator `version`.
pub fn format_dead_letter(buf: &mut Vec<u8>, dead: &DeadLetter, version: &str) {
    Line {
        partition: dead.origin.partition,
        offset: dead.origin.offset,
        cause: cause(&dead.origin),
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

/// The dead letter of `output` (of `origin`), which Kafka refused to take with
/// `error`: the output itself, so it can be sent again.
fn refused(origin: &Origin, output: &Output, error: &impl std::fmt::Display) -> DeadLetter {
    let topic = output.topic.as_deref().unwrap_or("the sink's topic");
    DeadLetter {
        origin: *origin,
        kind: DeadLetterKind::Refused,
        key: output.key.clone(),
        value: output.value.clone(),
        topic: output.topic.clone(),
        reason: format!(
            "Kafka refused this output (to {topic}) of the input: {error}; this dead letter holds the output, not \
             the input"
        ),
        attempts: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch's outputs, formatted far larger than they are (NUL bytes), are written
    /// whole and in order, a piece at a time: the formatting buffer never holds the batch.
    #[test]
    fn a_line_sink_formats_and_writes_a_large_batch_a_piece_at_a_time() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("out.jsonl");
        let sink = Sink::Lines(LineSink::file(&path, true)?);
        let outputs: Vec<(Origin, Output)> = (0..3_000)
            .map(|offset| {
                let origin = Origin { partition: 0, offset, cause: Cause::Record };
                (origin, Output { key: b"k".to_vec(), value: vec![0; 1_024], topic: None })
            })
            .collect();
        let (mut scratch, mut refused) = (Vec::new(), Vec::new());
        let mut into = PartitionOutputs::Acknowledged(None);
        sink.send(&outputs, "v", &mut scratch, &mut into, &mut refused)?;
        assert_eq!(refused, []);
        let written = std::fs::read_to_string(&path)?;
        assert!(written.len() > 3_000 * 6_000, "each NUL byte is written as six: {} bytes", written.len());
        let offsets: Vec<u64> = written
            .lines()
            .map(|line| serde_json::from_str::<serde_json::Value>(line).map(|l| l["offset"].as_u64().unwrap_or(0)))
            .collect::<std::result::Result<_, _>>()?;
        assert_eq!(offsets, (0..3_000).collect::<Vec<u64>>());
        assert!(scratch.capacity() <= 4 * LINE_CHUNK_BYTES, "the buffer grew to {} bytes", scratch.capacity());
        Ok(())
    }

    /// [`format_output`] writes, field by field, the line serde writes for [`Line`]:
    /// JSON values embedded, other values and keys as strings, bytes that are not UTF-8
    /// in base64, escapes, topics.
    #[test]
    fn an_output_line_is_the_line_serde_writes() {
        let record = Origin { partition: 3, offset: 1_234_567, cause: Cause::Record };
        let expiry = Origin { cause: Cause::Expiry, ..record };
        let outputs = [
            Output { key: b"veh-1".to_vec(), value: br#"{"count":1,"name":"a\"b"}"#.to_vec(), topic: None },
            Output { key: vec![0xff, b'x'], value: b"plain \"text\"\n".to_vec(), topic: Some("other".into()) },
            Output { key: Vec::new(), value: vec![0xC1, 0x80], topic: None },
            Output { key: b"k".to_vec(), value: b" [1, 2] ".to_vec(), topic: None },
        ];
        let version = "vehicle_stats@\"quoted\"";
        for (output, origin) in outputs.iter().zip([record, expiry].iter().cycle()) {
            let mut fast = Vec::new();
            format_output(&mut fast, origin, output, &OperatorField::new(version));
            let mut reference = Vec::new();
            Line {
                partition: origin.partition,
                offset: origin.offset,
                cause: cause(origin),
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
