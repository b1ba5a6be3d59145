//! The data every layer shares: a record as a source reads it ([`RawRecord`]) and at
//! its place in the partitioned log ([`SourceRecord`]), what an operator emits for it
//! ([`Output`]) and what caused that ([`Origin`]), what goes to the dead letters
//! ([`DeadLetter`]), where a partition's state came from when it started
//! ([`RestoredFrom`]: the restore decides it, the source reports it) and how a
//! partition's run ends ([`Stop`]).
//!
//! This module is a leaf: it imports nothing of the host, and every layer may import
//! it. It holds data only; what is done with a record belongs to the layer doing it.

/// FNV-1a (64 bits) of a key's bytes: a hash that every host and every version of
/// sluice computes alike, for what must be decided the same way wherever a key is
/// processed (a canary's share of the keys, the keys that move an event clock).
pub fn key_hash(key: &[u8]) -> u64 {
    key.iter().fold(0xcbf2_9ce4_8422_2325u64, |hash, &byte| (hash ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3))
}

/// A record before it is placed in a partition.
#[derive(Debug, Clone, PartialEq)]
pub struct RawRecord {
    /// The partitioning key (empty for a record without one, like Kafka's null key).
    pub key: Vec<u8>,
    /// The payload.
    pub value: Vec<u8>,
    /// Event time, milliseconds since the Unix epoch.
    pub timestamp_ms: i64,
}

impl RawRecord {
    /// This record placed at `offset` of `partition`.
    pub fn at(self, partition: u32, offset: u64) -> SourceRecord {
        let RawRecord { key, value, timestamp_ms } = self;
        SourceRecord { partition, offset, key, value, timestamp_ms, headers: Vec::new() }
    }
}

/// A record at its place in the partitioned log.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceRecord {
    /// The partition it was assigned to.
    pub partition: u32,
    /// Its offset within the partition.
    pub offset: u64,
    /// The partitioning key.
    pub key: Vec<u8>,
    /// The payload.
    pub value: Vec<u8>,
    /// Event time, milliseconds since the Unix epoch.
    pub timestamp_ms: i64,
    /// Its headers, in order, as a Kafka source read them (with [`TOMBSTONE_HEADER`]
    /// and [`NULL_KEY_HEADER`] where they apply); none from the embedded sources.
    pub headers: Vec<(String, Vec<u8>)>,
}

/// The header a Kafka record without a value (a tombstone) reaches the operator with,
/// its value empty: the operator can tell it from a record whose value is empty.
pub const TOMBSTONE_HEADER: &str = "sluice-tombstone";

/// The header a Kafka record without a key reaches the operator with, its key empty:
/// the operator can tell it from a record whose key is empty, which shares its state.
pub const NULL_KEY_HEADER: &str = "sluice-null-key";

impl SourceRecord {
    /// Whether Kafka had no key for it (not an empty one): its key is empty and it
    /// carries [`NULL_KEY_HEADER`].
    pub fn has_null_key(&self) -> bool {
        self.key.is_empty() && self.headers.iter().any(|(name, _)| name == NULL_KEY_HEADER)
    }

    /// What it makes the host hold: its key, value and headers, in bytes.
    pub fn bytes(&self) -> usize {
        self.key.len()
            + self.value.len()
            + self.headers.iter().map(|(name, value)| name.len() + value.len()).sum::<usize>()
    }
}

/// One record an operator emitted.
#[derive(Debug, Clone, PartialEq)]
pub struct Output {
    /// The output key.
    pub key: Vec<u8>,
    /// The output payload.
    pub value: Vec<u8>,
    /// Destination topic; `None` is the job's sink.
    pub topic: Option<String>,
}

impl Output {
    /// What it makes the host hold: its key, value and topic name, in bytes.
    pub fn bytes(&self) -> usize {
        self.key.len() + self.value.len() + self.topic.as_ref().map_or(0, String::len)
    }
}

/// What made an operator emit an output: where in the partitioned log, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Origin {
    /// The partition.
    pub partition: u32,
    /// The input record's offset; for an expiry, the offset of the record the
    /// partition processes next (the expiry happened between it and the one before), so
    /// a replay gives the same.
    pub offset: u64,
    /// Whether the output answers an input record, an expired state entry or a timer.
    pub cause: Cause,
}

/// Why an operator emitted an output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Cause {
    /// It processed the input record at the origin's offset.
    Record,
    /// A state entry expired (the operator's `expired` callback).
    Expiry,
    /// A timer fired (the operator's `fired` callback).
    Timer,
}

impl Cause {
    /// What the `cause` field of an output line (or the `sluice-cause` header of an
    /// output record) says: nothing for an input record's.
    pub fn name(self) -> Option<&'static str> {
        match self {
            Cause::Record => None,
            Cause::Expiry => Some("expiry"),
            Cause::Timer => Some("timer"),
        }
    }
}

impl Origin {
    /// The origin of outputs for `record`.
    pub fn of(record: &SourceRecord) -> Self {
        Origin { partition: record.partition, offset: record.offset, cause: Cause::Record }
    }
}

/// Why something went to the dead letters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadLetterKind {
    /// The operator returned an error for the record.
    Rejected,
    /// The record's calls trapped (after their retries) or passed one of the
    /// operator's limits.
    Trapped,
    /// Kafka refused an output of the record for the output itself (over
    /// `message.max.bytes`).
    Refused,
    /// A Kafka record without a key, never given to the operator (`[source] null_keys`):
    /// keyed state would put it with every other keyless record of its partition.
    NullKey,
    /// The operator found the record late: it came after the windows it belongs to
    /// closed (the SDK's windows; `timers.mark-late`).
    Late,
}

impl DeadLetterKind {
    /// Its name in a dead letter's `error` field (or `sluice-error` header).
    pub fn name(self) -> &'static str {
        match self {
            DeadLetterKind::Rejected => "rejected",
            DeadLetterKind::Trapped => "trapped",
            DeadLetterKind::Refused => "refused",
            DeadLetterKind::NullKey => "null-key",
            DeadLetterKind::Late => "late",
        }
    }
}

/// What goes to the dead letters: an input record (or an expired state entry) the
/// operator failed on, or an output of one that Kafka refused, with why.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetter {
    /// Where in the partitioned log it happened.
    pub origin: Origin,
    /// What went wrong.
    pub kind: DeadLetterKind,
    /// The input's key (the expired entry's, the refused output's).
    pub key: Vec<u8>,
    /// The input's value (the expired entry's, the refused output's).
    pub value: Vec<u8>,
    /// The topic a refused output was for; `None` otherwise, and for the sink's topic.
    pub topic: Option<String>,
    /// Why, in words: the operator's error, the trap, Kafka's refusal.
    pub reason: String,
    /// The calls a trapped record got (`[operator.retry]`).
    pub attempts: Option<u32>,
}

/// Where a partition's state came from.
#[derive(Debug, Clone, PartialEq)]
pub enum RestoredFrom {
    /// No local state and no checkpoint: an empty database.
    Empty,
    /// The local database, as new as or newer than any usable checkpoint.
    Local {
        /// Its committed offset.
        offset: u64,
    },
    /// A checkpoint from the store.
    Checkpoint {
        /// The checkpoint's id.
        id: u64,
        /// Its offset.
        offset: u64,
        /// Its size.
        bytes: u64,
        /// Of those, the bytes downloaded; the rest were local files reused.
        fetched: u64,
        /// Whether a standby copy supplied some of them.
        standby: bool,
    },
}

/// Every [`RestoredFrom::path`].
pub const RESUME_PATHS: [&str; 5] = ["empty", "local", "standby", "incremental", "full"];

impl RestoredFrom {
    /// How the partition resumed, as metrics label it: `empty`, `local` (its own
    /// database), `standby` (a checkpoint built with a standby copy's files),
    /// `incremental` (from other local files) or `full` (all downloaded).
    pub fn path(&self) -> &'static str {
        match self {
            RestoredFrom::Empty => "empty",
            RestoredFrom::Local { .. } => "local",
            RestoredFrom::Checkpoint { standby: true, .. } => "standby",
            RestoredFrom::Checkpoint { bytes, fetched, .. } if fetched < bytes => "incremental",
            RestoredFrom::Checkpoint { .. } => "full",
        }
    }
}

impl std::fmt::Display for RestoredFrom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RestoredFrom::Empty => write!(f, "empty"),
            RestoredFrom::Local { offset } => write!(f, "local@{offset}"),
            RestoredFrom::Checkpoint { id, offset, bytes, fetched, .. } => {
                write!(f, "checkpoint {id}@{offset} ({}: fetched {fetched} B of {bytes} B)", self.path())
            }
        }
    }
}

/// How a partition's run on this host ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The source ended: process every queued batch, then take a last checkpoint.
    Drain,
    /// The partition moves to another host (or this one shuts down): finish the batch
    /// in hand, leave queued ones (the next owner reads them again from the offset
    /// stored with the state), and take a last checkpoint so the next owner restores
    /// the newest state.
    Handover,
    /// The partition already belongs to another host (this one was evicted): finish
    /// the batch in hand and take no checkpoint — the store is the new owner's now.
    Lost,
}
