//! Where outputs and dead letters go: JSONL lines to a file or stdout, or records on
//! Kafka topics ([`kafka`]).
//!
//! This module owns the choice of sinks and where lines go (how a line is written is
//! [`lines`](crate::lines)'s). Each worker has its partition's side of the sinks, a
//! [`PartitionOutputs`] ([`Sink::partition`]): it hands it a whole batch's outputs
//! ([`send`](PartitionOutputs::send)) and dead letters
//! ([`send_dead_letters`](PartitionOutputs::send_dead_letters)) and goes on with its
//! next batch; before it commits state it makes them final
//! ([`commit`](PartitionOutputs::commit)): it waits until every output (and every dead
//! letter on a Kafka topic) of the batches the commit covers is where it was sent, or,
//! with exactly-once outputs, commits their Kafka [transaction]. So an output is never
//! lost: after a crash, the batches processed since the last commit are processed
//! again, and sent again (at-least-once) or, where a committed transaction holds their
//! outputs already, not (exactly-once).

pub(crate) mod events;
pub mod kafka;
pub mod transaction;

use crate::config::{DeadLetterConfig, Guarantee, SinkConfig, SourceConfig};
use crate::lines::{OperatorField, format_dead_letter, format_output};
use crate::record::{DeadLetter, DeadLetterKind, Origin, Output};
use anyhow::{Context, Result};
use events::NOT_SYNCED;
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
    Kafka(Arc<kafka::KafkaSink>),
    /// Records on Kafka topics, exactly once: each partition through its own
    /// transactions.
    Transactional(transaction::TransactionalSink),
}

impl Sink {
    /// `partition`'s side of this sink and of `dead_letters`, made when its worker
    /// starts with state at `state_offset`: for exactly-once outputs it takes over the
    /// partition's transactions, fencing earlier owners. Dead letters on a topic need a
    /// Kafka sink to go through ([`DeadLetterSink::open`] refuses them without).
    pub fn partition(
        &self,
        dead_letters: &DeadLetterSink,
        partition: u32,
        state_offset: u64,
    ) -> Result<PartitionOutputs> {
        Ok(match (self, dead_letters) {
            (Sink::Lines(lines), DeadLetterSink::Lines(dead)) => {
                PartitionOutputs::Lines { outputs: lines.clone(), dead_letters: dead.clone() }
            }
            (Sink::Lines(_), DeadLetterSink::Topic(topic)) => return Err(topic_needs_kafka(topic)),
            (Sink::Kafka(sink), dead_letters) => {
                PartitionOutputs::Kafka { sink: sink.clone(), acks: None, dead_letters: dead_letters.clone() }
            }
            (Sink::Transactional(sink), dead_letters) => PartitionOutputs::Transaction {
                transaction: sink.begin(partition, state_offset)?,
                dead_letters: dead_letters.clone(),
            },
        })
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

/// One partition's side of the job's sink and dead letters: where its outputs and dead
/// letters go, each variant owning what sending them takes, and what it sent since its
/// last commit, kept until the commit makes it final. Made by [`Sink::partition`].
pub enum PartitionOutputs {
    /// Lines to a file or stdout, written when sent; dead letters to a file.
    Lines {
        /// Where outputs go.
        outputs: LineSink,
        /// Where dead letters go.
        dead_letters: LineSink,
    },
    /// Records on Kafka topics through the shared producer.
    Kafka {
        /// The shared sink.
        sink: Arc<kafka::KafkaSink>,
        /// The acknowledgements the broker still owes.
        acks: Option<Arc<kafka::Acks>>,
        /// Where dead letters go: a file, or a topic through `sink`.
        dead_letters: DeadLetterSink,
    },
    /// The partition's own Kafka transaction.
    Transaction {
        /// The transaction.
        transaction: transaction::PartitionTransaction,
        /// Where dead letters go: a file, or a topic in the transaction.
        dead_letters: DeadLetterSink,
    },
}

impl PartitionOutputs {
    /// Sends a batch's outputs, each with its origin, all produced by operator
    /// `version`. Lines are written when it returns (formatted into `scratch`, which
    /// the caller keeps from batch to batch so its memory is reused,
    /// `LINE_CHUNK_BYTES` at a time, so it holds that plus one line); Kafka records
    /// are queued, counted until the broker acknowledges them, or in the open
    /// transaction. An output Kafka refuses for itself (over the producer's
    /// `message.max.bytes`) is not sent: its dead letter goes into `refused`.
    pub fn send(
        &mut self,
        outputs: &[(Origin, Output)],
        version: &str,
        scratch: &mut Vec<u8>,
        refused: &mut Vec<DeadLetter>,
    ) -> Result<()> {
        if outputs.is_empty() {
            return Ok(());
        }
        match self {
            PartitionOutputs::Lines { outputs: lines, .. } => {
                let operator = OperatorField::new(version);
                lines
                    .write_each(outputs, scratch, |buf, (origin, output)| format_output(buf, origin, output, &operator))
            }
            PartitionOutputs::Kafka { sink, acks, .. } => {
                sink.send(outputs, version, acks.get_or_insert_with(Default::default), refused)
            }
            PartitionOutputs::Transaction { transaction, .. } => transaction.send(outputs, version, refused),
        }
    }

    /// Sends `dead`, all of operator `version`'s batch (formatting lines into `scratch`,
    /// as [`send`](Self::send) does): a dead-letter topic's records go as the outputs
    /// do, counted until acknowledged or in the transaction.
    pub fn send_dead_letters(&mut self, dead: &[DeadLetter], version: &str, scratch: &mut Vec<u8>) -> Result<()> {
        if dead.is_empty() {
            return Ok(());
        }
        match self {
            PartitionOutputs::Lines { dead_letters: lines, .. }
            | PartitionOutputs::Kafka { dead_letters: DeadLetterSink::Lines(lines), .. }
            | PartitionOutputs::Transaction { dead_letters: DeadLetterSink::Lines(lines), .. } => {
                lines.write_each(dead, scratch, |buf, dead| format_dead_letter(buf, dead, version))
            }
            PartitionOutputs::Kafka { sink, acks, dead_letters: DeadLetterSink::Topic(topic) } => {
                sink.send_dead_letters(topic, dead, version, acks.get_or_insert_with(Default::default))
            }
            PartitionOutputs::Transaction { transaction, dead_letters: DeadLetterSink::Topic(topic) } => {
                transaction.send_dead_letters(topic, dead, version)
            }
        }
    }

    /// The offset below which every input's outputs are committed already, so that
    /// processing those inputs again emits nothing: a committed transaction's, else 0.
    pub fn covered(&self) -> u64 {
        match self {
            PartitionOutputs::Lines { .. } | PartitionOutputs::Kafka { .. } => 0,
            PartitionOutputs::Transaction { transaction, .. } => transaction.covered(),
        }
    }

    /// The first delivery that failed so far, or a transactional producer's fatal
    /// error (fenced, above all), as an error, without waiting.
    pub fn check(&self) -> Result<()> {
        match self {
            PartitionOutputs::Lines { .. } => Ok(()),
            PartitionOutputs::Kafka { acks, .. } => match acks.as_deref().and_then(kafka::Acks::failure) {
                Some(failure) => Err(anyhow::anyhow!("{failure}")),
                None => Ok(()),
            },
            PartitionOutputs::Transaction { transaction, .. } => transaction.check(),
        }
    }

    /// Makes every output sent since the last commit final, before the state of the
    /// inputs below `next_offset` commits: waits until each is acknowledged, or commits
    /// the transaction with `next_offset` as the group's offset (lines are written
    /// already). A failed delivery or transaction, or outputs still unacknowledged
    /// after [`kafka::DELIVERY_TIMEOUT`], is the error, and then nothing sent since the
    /// last commit may be taken as delivered.
    pub fn commit(&mut self, next_offset: u64) -> Result<()> {
        match self {
            PartitionOutputs::Lines { .. } => Ok(()),
            PartitionOutputs::Kafka { acks, .. } => {
                if let Some(acks) = acks.take() {
                    acks.wait(kafka::DELIVERY_TIMEOUT).map_err(|failure| anyhow::anyhow!("{failure}"))?;
                }
                Ok(())
            }
            PartitionOutputs::Transaction { transaction, .. } => transaction.commit(next_offset),
        }
    }
}

/// A destination of JSONL lines shared by all workers. Cheap to clone; every clone
/// writes to the same destination.
#[derive(Clone)]
pub struct LineSink {
    out: Arc<Mutex<Box<dyn Write + Send>>>,
    /// The file written to, for [`sync`](Self::sync) (another handle of it, so a sync
    /// does not hold up the writers); `None` for stdout, for what is not a regular file,
    /// and when not syncing.
    file: Option<Arc<File>>,
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
        Self::of_file(file, path, sync)
    }

    /// Writes to a new file at `path`, unsynced: refused if anything is there already —
    /// a file, or a symbolic link planted to make it write elsewhere.
    pub fn new_file(path: &Path) -> Result<Self> {
        let file = OpenOptions::new()
            .create_new(true)
            .append(true)
            .read(true)
            .open(path)
            .with_context(|| format!("creating {} (it must not exist)", path.display()))?;
        Self::of_file(file, path, false)
    }

    /// Writes to `file`, opened at `path`.
    fn of_file(file: File, path: &Path, sync: bool) -> Result<Self> {
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
        Ok(LineSink {
            out: Arc::new(Mutex::new(Box::new(file))),
            file: handle.map(Arc::new),
            name: path.display().to_string(),
        })
    }

    /// Writes to standard output.
    pub fn stdout() -> Self {
        LineSink { out: Arc::new(Mutex::new(Box::new(std::io::stdout()))), file: None, name: "stdout".into() }
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

    /// Writes a line for each of `items`, as `format` appends it to a buffer, through
    /// `scratch` (cleared first) [`LINE_CHUNK_BYTES`] at a time.
    fn write_each<T>(
        &self,
        items: &[T],
        scratch: &mut Vec<u8>,
        mut format: impl FnMut(&mut Vec<u8>, &T),
    ) -> Result<()> {
        scratch.clear();
        for item in items {
            format(scratch, item);
            if scratch.len() >= LINE_CHUNK_BYTES {
                self.write(scratch)?;
                scratch.clear();
            }
        }
        self.write(scratch)
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

/// Where dead letters go, shared by all workers.
#[derive(Clone)]
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
            (Some(topic), _) => Err(topic_needs_kafka(topic)),
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

/// The error of dead letters for `topic` without a Kafka sink to send them through.
fn topic_needs_kafka(topic: &str) -> anyhow::Error {
    anyhow::anyhow!("[dead_letter] topic = {topic:?} needs a Kafka sink")
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
                Sink::Kafka(Arc::new(kafka::KafkaSink::open(brokers, topic, properties)?))
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
    use crate::record::Cause;

    /// A batch's outputs, formatted far larger than they are (NUL bytes), are written
    /// whole and in order, a piece at a time: the formatting buffer never holds the batch.
    #[test]
    fn a_line_sink_formats_and_writes_a_large_batch_a_piece_at_a_time() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("out.jsonl");
        let sink = Sink::Lines(LineSink::file(&path, true)?);
        let dead_letters = DeadLetterSink::Lines(LineSink::file(&dir.path().join("dead.jsonl"), true)?);
        let outputs: Vec<(Origin, Output)> = (0..3_000)
            .map(|offset| {
                let origin = Origin { partition: 0, offset, cause: Cause::Record };
                (origin, Output { key: b"k".to_vec(), value: vec![0; 1_024], topic: None })
            })
            .collect();
        let (mut scratch, mut refused) = (Vec::new(), Vec::new());
        sink.partition(&dead_letters, 0, 0)?.send(&outputs, "v", &mut scratch, &mut refused)?;
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
}
