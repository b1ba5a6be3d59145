//! The job's configuration: a TOML file, then command-line overrides.
//!
//! This module owns parsing and validating configuration and nothing else: every
//! error names the file and, for TOML errors, the line and column. Unknown keys are
//! errors, so a typo never silently falls back to a default. Durations are a number
//! of seconds or a string such as `"500ms"`, `"10s"` or `"1m"`, all read by
//! [`parse_duration`]; the settings' older names with an `_s` suffix still work.
//!
//! ```toml
//! [operator]
//! path = "vehicle_stats.wasm" # the first version; `sluice deploy` records later ones
//! # name = "vehicle_stats"    # what versions are deployed under; default: the file stem
//! call_timeout_ms = 1000      # CPU time of one call (its thread's: waiting for a core does not count)
//! instructions_per_call = 0   # WebAssembly instructions one call may run, exact on every replay; 0: uncounted
//! memory_limit_mib = 64       # linear-memory cap of one instance
//! poll_versions = "1s"        # how often a host looks for versions deployed elsewhere
//! [operator.config]           # passed to the operator's init
//! [operator.limits]           # what one call may make the host hold; passing one fails the record
//! outputs_per_record = 1000
//! output_bytes_per_record = 1048576     # keys, values and topics of one record's outputs
//! writes_per_record = 1000              # state puts and deletes
//! written_bytes_per_record = 16777216   # names and values of one record's state writes
//! reads_per_record = 10000
//! state_value_bytes = 1048576
//! state_name_bytes = 256
//! log_lines_per_s = 100                 # per instance; lines past these are dropped and counted
//! log_bytes_per_s = 65536
//! log_line_bytes = 4096                 # a longer line is cut
//! reason_bytes = 4096                   # a longer reason of a failed record is cut
//! output_bytes_per_batch = 67108864     # a batch past these ends there; the rest is the next batch
//! time_per_batch_ms = 10000
//! output_topics = []                    # topics an output may name; none: only the sink's own
//! [operator.retry]            # a record whose call trapped is called again on a fresh instance
//! attempts = 2                # calls in all; then its dead letter
//! backoff = "10ms"            # before the first retry, doubling
//! strict = false              # true: after the last attempt stop the partition instead
//!
//! [source]                    # or: kind = "file", path = "input.jsonl", key_field = "vehicle_id",
//!                             #     max_line_bytes = 16777216 (a longer line is skipped, logged)
//!                             # or: kind = "kafka", brokers = "host:9092", topic = "positions",
//!                             #     offset_out_of_range = "fail" (or "earliest")
//!                             #     null_keys = "dead_letter" (or "operator")
//! kind = "generator"
//! vehicles = 10000
//! count = 1000000             # or duration = "1m"; neither = unbounded
//! seed = 42
//! # churn = 100               # every 100 records a vehicle leaves for good, a new one joins
//! # rate = 5000               # records/s; absent = as fast as possible
//!
//! [sink]                      # or: kind = "stdout"; or kind = "kafka",
//! kind = "file"               #   brokers = "host:9092", topic = "out", [sink.properties]
//! path = "out/outputs.jsonl"
//!
//! [state]
//! dir = "sluice-state"
//! partitions = 4
//! batch_records = 512         # records per batch a worker processes, at most
//! queued_records = 16384      # records queued per partition (whole batches, at least 4) before its source waits
//! queued_mib = 64             # ... or this much of records' bytes (batches cut at a quarter of it)
//! commit_interval = "1s"      # a partition commits its state at least this often
//! commit_every = 100000       # ... and after this many records
//! commit_dirty_mib = 64       # ... or this much written
//! sync_outputs = true         # output and dead-letter files reach the disk before each commit
//! cache_mib = 64              # committed entries kept in memory, per partition
//! rocksdb_memory_mib = 256    # RocksDB's memtables and block cache, all partitions together
//!
//! [ttl]                       # state expiry
//! # default = "7d"            # every entry's TTL from its last write; absent: never expires
//! time = "event"              # the partition's largest timestamp; or "processing": the wall clock
//! lateness = "0s"             # the event clock trails the largest timestamp seen by this much
//! future_skew = "1d"          # a timestamp further ahead of the clock does not move it...
//! future_confirm = 100        # ... unless this many such records come in a row
//! sweep_limit = 50000         # the most entries one batch expires (the rest in the next batches)
//! [ttl.names]                 # TTLs per state name, over the default
//! # summary = "1h"
//!
//! [dead_letter]
//! path = "out/dead-letter.jsonl"  # default "dead-letter.jsonl"; or, with a Kafka sink:
//! # topic = "positions.dead-letters"  # records on this topic (not with path)
//!
//! [checkpoint]
//! enabled = true
//! store = "s3://bucket/sluice"  # or a directory; absent = "<state dir>.checkpoints"
//! interval = "10s"
//! retain = 3                  # checkpoints kept per partition
//! restore_budget = "1m"       # warn when a restore is predicted to take longer
//! restore_retry_timeout = "5m" # a partition retries a failing store, broker or fencing this long
//! # upload_bytes_per_s = 50000000
//!
//! [admin]                     # the admin HTTP API (deploy, rollback, versions)
//! # listen = "127.0.0.1:9464" # absent: no API; port 0 picks a free port (logged)
//! # token_file = "admin-token" # bearer token deploys need; absent: $SLUICE_ADMIN_TOKEN
//! # host_names = ["devbox"]   # names a question without the token may give as its Host (IPs, localhost always)
//! ```

use anyhow::{Context, Result, bail};
use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A whole job.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The operator to run.
    pub operator: OperatorConfig,
    /// Where records come from.
    #[serde(default)]
    pub source: SourceConfig,
    /// Where outputs go.
    #[serde(default)]
    pub sink: SinkConfig,
    /// Where state lives.
    #[serde(default)]
    pub state: StateConfig,
    /// When state expires.
    #[serde(default)]
    pub ttl: TtlConfig,
    /// Where records the operator could not process go.
    #[serde(default)]
    pub dead_letter: DeadLetterConfig,
    /// Checkpoints of the state to a checkpoint store, and restores from it.
    #[serde(default)]
    pub checkpoint: CheckpointConfig,
    /// The running summary.
    #[serde(default)]
    pub report: ReportConfig,
    /// The admin HTTP API.
    #[serde(default)]
    pub admin: AdminConfig,
}

/// `[operator]`
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperatorConfig {
    /// The operator component (`.wasm`): the version a job starts with until another
    /// is deployed.
    pub path: PathBuf,
    /// The name versions are deployed under; absent: the file stem of `path`.
    pub name: Option<String>,
    /// Between a host's looks at the registry for versions deployed elsewhere.
    #[serde(default = "default_poll_versions", alias = "poll_versions_s", deserialize_with = "duration")]
    pub poll_versions: Duration,
    /// The WebAssembly instructions one call may execute (wasmtime's fuel): a CPU bound
    /// a replay reproduces exactly, where `call_timeout_ms` depends on the machine's
    /// speed. Counting costs the guest's code about a fifth of its speed, so 0, the
    /// default, counts none.
    #[serde(default)]
    pub instructions_per_call: u64,
    /// CPU deadline of one call (one record's, inside a batched call), in milliseconds:
    /// the CPU time of the thread running it — the guest's and the host calls' on its
    /// behalf — so time spent waiting for a core on a loaded host does not count.
    #[serde(default = "default_call_timeout_ms")]
    pub call_timeout_ms: u64,
    /// Linear-memory cap of one instance, in MiB.
    #[serde(default = "default_memory_limit_mib")]
    pub memory_limit_mib: u64,
    /// Name/value pairs passed to the operator's `init`.
    #[serde(default)]
    pub config: BTreeMap<String, String>,
    /// What one record's call may make the host hold.
    #[serde(default)]
    pub limits: OperatorLimits,
    /// What a record whose call trapped gets.
    #[serde(default)]
    pub retry: RetryPolicy,
}

/// `[operator.retry]`: a record whose call trapped — a panic, a limit, the deadline, a
/// denied call — is called again on a fresh instance, which may do better (the
/// instance it trapped in may have leaked memory, or the host was loaded); after the
/// last attempt it goes to the dead letters, or, when `strict`, stops its partition.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryPolicy {
    /// Calls of a record that traps, the first included: 1 never retries.
    pub attempts: u32,
    /// The wait before the second call; each later one waits twice the one before.
    #[serde(deserialize_with = "duration")]
    pub backoff: Duration,
    /// After the last attempt, stop the partition instead of dead-lettering the record.
    pub strict: bool,
}

impl Default for RetryPolicy {
    /// One retry, 10 ms later: a burst of records that trap whatever happens costs
    /// little more than without, and one a fresh instance processes is not lost.
    fn default() -> Self {
        RetryPolicy { attempts: 2, backoff: Duration::from_millis(10), strict: false }
    }
}

impl RetryPolicy {
    /// The wait before attempt `attempt` (2 is the first retry).
    pub fn backoff_before(&self, attempt: u32) -> Duration {
        self.backoff.saturating_mul(1 << attempt.saturating_sub(2).min(16))
    }
}

/// `[operator.limits]`: what one call of the operator — a record's, or an expired
/// entry's — may make the host hold, beyond the instance's own memory. A call that
/// passes one fails as a trap, naming the limit; the record goes to the dead letters
/// and its state writes are discarded. Log lines past a rate are dropped and counted.
/// The defaults leave a well-behaved operator far below each.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OperatorLimits {
    /// Outputs one call may emit.
    pub outputs_per_record: usize,
    /// Bytes (keys, values and topic names) of one call's outputs together; by default
    /// Kafka's default `message.max.bytes`, which one output may not pass anyway.
    pub output_bytes_per_record: usize,
    /// State writes (`put`s and `delete`s) one call may make.
    pub writes_per_record: usize,
    /// Bytes (names and values) of one call's state writes together, a name written
    /// twice counted twice.
    pub written_bytes_per_record: usize,
    /// State reads one call may make.
    pub reads_per_record: usize,
    /// Bytes of one state value.
    pub state_value_bytes: usize,
    /// Bytes of one state name.
    pub state_name_bytes: usize,
    /// Log lines an instance may write per second; the rest are dropped and counted.
    pub log_lines_per_s: u64,
    /// Log bytes an instance may write per second; the rest are dropped and counted.
    pub log_bytes_per_s: u64,
    /// Bytes of one log line; a longer line is cut there.
    pub log_line_bytes: usize,
    /// Bytes of the reason a record failed for — the operator's error, or the host's
    /// account of a trap — as its dead letter carries it; a longer one is cut there
    /// (before it is copied out of the guest), and it counts against
    /// `output_bytes_per_batch`.
    pub reason_bytes: usize,
    /// Bytes one batch holds for what it emits — outputs, the reasons of failed
    /// records, expired entries handed to the operator — together: past them the batch
    /// ends at the record (or expiry) that passed them, its outputs go to the sink, and
    /// the rest make the next batch.
    pub output_bytes_per_batch: usize,
    /// Milliseconds one batch may take: past them it ends as for
    /// `output_bytes_per_batch`, so a handover, deploy or stop waits at most this (and
    /// one record's `call_timeout_ms`) for the batch in hand.
    pub time_per_batch_ms: u64,
    /// Topics an output may name. An output without a topic goes to the sink's own;
    /// one naming a topic not listed here fails its record (an operator must not
    /// write into its own input or another team's topics).
    pub output_topics: Vec<String>,
}

impl OperatorLimits {
    /// No limit at all, for measuring what the limits cost (a job always has them).
    pub fn unlimited() -> Self {
        OperatorLimits {
            outputs_per_record: usize::MAX,
            output_bytes_per_record: usize::MAX,
            writes_per_record: usize::MAX,
            written_bytes_per_record: usize::MAX,
            reads_per_record: usize::MAX,
            state_value_bytes: usize::MAX,
            state_name_bytes: usize::MAX,
            log_lines_per_s: u64::MAX,
            log_bytes_per_s: u64::MAX,
            log_line_bytes: usize::MAX,
            reason_bytes: usize::MAX,
            output_bytes_per_batch: usize::MAX,
            time_per_batch_ms: u64::MAX,
            output_topics: Vec::new(),
        }
    }
}

impl Default for OperatorLimits {
    fn default() -> Self {
        OperatorLimits {
            outputs_per_record: 1_000,
            output_bytes_per_record: 1 << 20,
            writes_per_record: 1_000,
            written_bytes_per_record: 16 << 20,
            reads_per_record: 10_000,
            state_value_bytes: 1 << 20,
            state_name_bytes: 256,
            log_lines_per_s: 100,
            log_bytes_per_s: 64 << 10,
            log_line_bytes: 4 << 10,
            reason_bytes: 4 << 10,
            output_bytes_per_batch: 64 << 20,
            time_per_batch_ms: 10_000,
            output_topics: Vec::new(),
        }
    }
}

fn default_poll_versions() -> Duration {
    Duration::from_secs(1)
}

impl OperatorConfig {
    /// The name versions are deployed under: `name`, or the file stem of `path`.
    pub fn name(&self) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| self.path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default())
    }
}

/// `[operator] call_timeout_ms` when unset.
pub fn default_call_timeout_ms() -> u64 {
    1000
}

/// `[operator] memory_limit_mib` when unset.
pub fn default_memory_limit_mib() -> u64 {
    64
}

/// `[source]`
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum SourceConfig {
    /// The embedded fleet generator.
    Generator {
        /// Number of vehicles (distinct keys).
        #[serde(default = "default_vehicles")]
        vehicles: u32,
        /// Records to produce; absent with no `duration` is unbounded.
        count: Option<u64>,
        /// Wall-clock time to run for.
        #[serde(default, alias = "duration_s", deserialize_with = "optional_duration")]
        duration: Option<Duration>,
        /// Records per second; absent is as fast as possible.
        rate: Option<f64>,
        /// Seed: the same seed gives the same records.
        #[serde(default)]
        seed: u64,
        /// Every this many records a vehicle leaves for good and a new one joins.
        churn: Option<u64>,
    },
    /// A JSONL file, one record per line.
    File {
        /// The file.
        path: PathBuf,
        /// The JSON field holding the record key.
        #[serde(default = "default_key_field")]
        key_field: String,
        /// The JSON field holding the event time (ms since the epoch).
        #[serde(default = "default_timestamp_field")]
        timestamp_field: String,
        /// Records per second; absent is as fast as possible.
        rate: Option<f64>,
        /// The longest line read as a record; a longer one is skipped, logged, so one
        /// line cannot make the host hold a file's worth of memory.
        #[serde(default = "default_max_line_bytes")]
        max_line_bytes: usize,
    },
    /// A Kafka topic, consumed as a member of a consumer group.
    Kafka {
        /// Bootstrap servers, `host:port[,host:port…]`.
        brokers: String,
        /// The topic; the job's partitions are its partitions.
        topic: String,
        /// The consumer group.
        #[serde(default = "default_group")]
        group: String,
        /// Static membership (`group.instance.id`).
        instance_id: Option<String>,
        /// librdkafka consumer properties, passed through (they win over sluice's).
        #[serde(default)]
        properties: BTreeMap<String, String>,
        /// Stop once no record arrived for this long; absent runs until killed.
        #[serde(default, alias = "stop_when_idle_s", deserialize_with = "optional_duration")]
        stop_when_idle: Option<Duration>,
        /// What a partition whose state's offset is older than its log's earliest
        /// retained record does.
        #[serde(default)]
        offset_out_of_range: OutOfRange,
        /// What becomes of a record without a key.
        #[serde(default)]
        null_keys: NullKeys,
    },
}

/// `[source] null_keys`: what becomes of a Kafka record without a key. Keyed state is
/// scoped to the key's bytes, so keyless records — which producers spread over every
/// partition — would share one state per partition with each other and with empty keys.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NullKeys {
    /// To the dead letters (kind `null-key`), the operator not called.
    #[default]
    DeadLetter,
    /// To the operator, with an empty key and the `sluice-null-key` header: for
    /// operators that keep no state for such records.
    Operator,
}

/// `[source] offset_out_of_range`: what a partition does when the records after its
/// state's offset are gone (retention deleted them while the job was down, a restore
/// from an old checkpoint). A state offset past the log's end always stops its
/// partition.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutOfRange {
    /// Stop the partition alone, naming it, the state's offset and the log's range.
    #[default]
    Fail,
    /// Resume at the earliest retained record; the gap is logged and counted.
    Earliest,
}

fn default_group() -> String {
    "sluice".into()
}

fn default_vehicles() -> u32 {
    1000
}

impl SourceConfig {
    /// A JSONL file source at `path` with the default key and timestamp fields.
    pub fn file(path: PathBuf) -> Self {
        SourceConfig::File {
            path,
            key_field: default_key_field(),
            timestamp_field: default_timestamp_field(),
            rate: None,
            max_line_bytes: default_max_line_bytes(),
        }
    }
}

/// The longest line a file source (and `sluice test`) reads by default.
pub fn default_max_line_bytes() -> usize {
    16 << 20
}

/// The JSON field a file source (and `sluice test`) takes a record's key from by default.
pub fn default_key_field() -> String {
    "vehicle_id".into()
}

/// The JSON field a file source (and `sluice test`) takes a record's event time from by
/// default.
pub fn default_timestamp_field() -> String {
    "ts".into()
}

impl Default for SourceConfig {
    fn default() -> Self {
        SourceConfig::Generator {
            vehicles: default_vehicles(),
            count: Some(100_000),
            duration: None,
            rate: None,
            seed: 0,
            churn: None,
        }
    }
}

/// `[sink]`
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum SinkConfig {
    /// A JSONL file, appended to.
    File {
        /// The file.
        path: PathBuf,
    },
    /// Standard output.
    #[default]
    Stdout,
    /// Records on a Kafka topic, through an idempotent producer.
    Kafka {
        /// Bootstrap servers, `host:port[,host:port…]`.
        brokers: String,
        /// The topic of outputs that do not name their own.
        topic: String,
        /// librdkafka producer properties, passed through (they win over sluice's).
        #[serde(default)]
        properties: BTreeMap<String, String>,
        /// Whether a crash may repeat outputs.
        #[serde(default)]
        guarantee: Guarantee,
    },
}

/// `[sink] guarantee`: what a consumer of the outputs sees after a crash.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Guarantee {
    /// The outputs of records processed since the last commit are sent again.
    #[default]
    AtLeastOnce,
    /// Outputs go out in Kafka transactions tied to the state's commits: a consumer
    /// reading `read_committed` sees each exactly once. Needs a Kafka source, whose
    /// consumer group records the input offset each transaction covers.
    ExactlyOnce,
}

/// `[state]`
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateConfig {
    /// The state directory: one RocksDB database per partition.
    #[serde(default = "default_state_dir")]
    pub dir: PathBuf,
    /// How many partitions keys are hashed into.
    #[serde(default = "default_partitions")]
    pub partitions: u32,
    /// The most records per batch handed to a worker (never more than
    /// `commit_every`): between batches a worker writes outputs and looks for stops
    /// and deploys, so a batch's processing time is what a rebalance waits for.
    #[serde(default = "default_batch_records")]
    pub batch_records: usize,
    /// The most records a partition's worker may have queued, in whole batches (at
    /// least four), before the source holds the partition back: the memory of each
    /// partition's queue. A Kafka source pauses the partition, which costs it the
    /// records librdkafka prefetched, so too small a queue pauses it all the time.
    #[serde(default = "default_queued_records")]
    pub queued_records: usize,
    /// The most bytes of records (keys, values and headers) a partition's worker may
    /// have queued, MiB, before the source holds the partition back; a batch ends at a
    /// quarter of it. A queue bounded by records alone would hold `queued_records` of
    /// the largest record, whatever its size. One record larger than the bound still
    /// passes, alone.
    #[serde(default = "default_queued_mib")]
    pub queued_mib: usize,
    /// The longest a partition's processed records wait for their state commit.
    #[serde(default = "default_commit_interval", deserialize_with = "duration")]
    pub commit_interval: Duration,
    /// The most records per state commit.
    #[serde(default = "default_commit_every")]
    pub commit_every: usize,
    /// The most bytes of state written (each entry's last value) before a commit, MiB.
    #[serde(default = "default_commit_dirty_mib")]
    pub commit_dirty_mib: usize,
    /// Whether each commit first syncs the output and dead-letter files to disk, so that
    /// after a power loss state is never ahead of the lines it emitted (Kafka outputs
    /// are acknowledged before a commit whatever this says).
    #[serde(default = "default_sync_outputs")]
    pub sync_outputs: bool,
    /// The memory for committed state entries kept per partition (reads of them skip
    /// RocksDB), MiB; 0 keeps none.
    #[serde(default = "default_cache_mib")]
    pub cache_mib: usize,
    /// The memory RocksDB may use for every partition of the host together — memtables,
    /// and data, index and filter blocks — MiB.
    #[serde(default = "default_rocksdb_memory_mib")]
    pub rocksdb_memory_mib: usize,
}

impl StateConfig {
    /// The records per batch: `batch_records`, at most `commit_every`.
    pub fn batch_size(&self) -> usize {
        self.batch_records.min(self.commit_every)
    }

    /// The batches a partition's worker may have queued: `queued_records` of them,
    /// at least four.
    pub fn queued_batches(&self) -> usize {
        (self.queued_records / self.batch_size()).max(4)
    }

    /// The bytes of records a partition's worker may have queued: `queued_mib`.
    pub fn queued_bytes(&self) -> usize {
        self.queued_mib << 20
    }

    /// The bytes of records after which a batch ends: a quarter of `queued_mib`, so a
    /// full queue holds at least four batches, as it does by records.
    pub fn batch_bytes(&self) -> usize {
        (self.queued_bytes() / 4).max(1)
    }
}

fn default_state_dir() -> PathBuf {
    "sluice-state".into()
}

fn default_partitions() -> u32 {
    4
}

fn default_batch_records() -> usize {
    512
}

fn default_queued_records() -> usize {
    16_384
}

fn default_queued_mib() -> usize {
    64
}

fn default_commit_interval() -> Duration {
    Duration::from_secs(1)
}

fn default_commit_every() -> usize {
    100_000
}

fn default_commit_dirty_mib() -> usize {
    64
}

fn default_sync_outputs() -> bool {
    true
}

fn default_cache_mib() -> usize {
    64
}

fn default_rocksdb_memory_mib() -> usize {
    256
}

impl Default for StateConfig {
    fn default() -> Self {
        StateConfig {
            dir: default_state_dir(),
            partitions: default_partitions(),
            batch_records: default_batch_records(),
            queued_records: default_queued_records(),
            queued_mib: default_queued_mib(),
            commit_interval: default_commit_interval(),
            commit_every: default_commit_every(),
            sync_outputs: default_sync_outputs(),
            commit_dirty_mib: default_commit_dirty_mib(),
            cache_mib: default_cache_mib(),
            rocksdb_memory_mib: default_rocksdb_memory_mib(),
        }
    }
}

/// `[ttl]`: state expiry, in event time.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TtlConfig {
    /// The TTL of every entry whose name has none in `names`, counted from its last
    /// write; absent: such entries never expire.
    #[serde(default, deserialize_with = "optional_duration")]
    pub default: Option<Duration>,
    /// TTLs by state name.
    #[serde(default)]
    pub names: BTreeMap<String, Ttl>,
    /// Which clock TTLs count in; recorded with the state.
    #[serde(default)]
    pub time: TimeDomain,
    /// How far the clock trails the largest timestamp seen.
    #[serde(default, deserialize_with = "duration")]
    pub lateness: Duration,
    /// A timestamp further than this ahead of the partition's clock does not move it,
    /// unless `future_confirm` such records come in a row.
    #[serde(default = "default_future_skew", deserialize_with = "duration")]
    pub future_skew: Duration,
    /// Records in a row, each more than `future_skew` ahead of the clock, that move it
    /// (to the nearest of them): a gap in the data is crossed, a lone far-future
    /// timestamp is not. Decided by the records alone, so a replay decides the same.
    #[serde(default = "default_future_confirm")]
    pub future_confirm: u64,
    /// The most entries one batch expires: every entry due before a record expires
    /// before it, earliest first, and a batch past this (or past a per-batch bound of
    /// `[operator.limits]`) ends there, the rest expiring in the next batches.
    #[serde(default = "default_sweep_limit")]
    pub sweep_limit: usize,
}

/// The clock a partition's TTLs count in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TimeDomain {
    /// The largest record timestamp the partition has seen: a replay decides every
    /// expiry as the first run did.
    #[default]
    Event,
    /// The wall clock, moving while the partition is idle too.
    Processing,
}

impl TimeDomain {
    /// Its name in config and in the state.
    pub fn name(self) -> &'static str {
        match self {
            TimeDomain::Event => "event",
            TimeDomain::Processing => "processing",
        }
    }
}

/// One state name's TTL in `[ttl.names]`.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(transparent)]
pub struct Ttl(#[serde(deserialize_with = "duration")] pub Duration);

impl TtlConfig {
    /// The TTL of entries named `name`: its own, else the default; `None`: they never
    /// expire.
    pub fn ttl(&self, name: &str) -> Option<Duration> {
        self.names.get(name).map(|ttl| ttl.0).or(self.default)
    }

    /// Whether any entry can expire.
    pub fn expires_anything(&self) -> bool {
        self.default.is_some() || !self.names.is_empty()
    }

    /// Checks values that parse but cannot work: a TTL under a millisecond (expiries
    /// count in whole milliseconds, so its entry would expire as it is written), a
    /// duration past [`MAX_DURATION`], a sweep that removes nothing, a clock no
    /// run of far-ahead records can move.
    pub fn validate(&self) -> Result<()> {
        let default = self.default.map(|ttl| ("[ttl] default".to_string(), ttl));
        let named = self.names.iter().map(|(name, ttl)| (format!("[ttl.names] {name}"), ttl.0));
        for (setting, ttl) in default.into_iter().chain(named) {
            if ttl < Duration::from_millis(1) {
                bail!(
                    "{setting} = {ttl:?} is under 1 ms: expiries count in whole milliseconds, so an entry would \
                     expire as it is written"
                );
            }
            check_duration(&setting, ttl)?;
        }
        check_duration("[ttl] lateness", self.lateness)?;
        check_duration("[ttl] future_skew", self.future_skew)?;
        if self.sweep_limit == 0 {
            bail!("[ttl] sweep_limit must be at least 1, or expired entries would never be removed");
        }
        if self.future_confirm == 0 {
            bail!("[ttl] future_confirm must be at least 1 (1: every timestamp moves the clock, however far ahead)");
        }
        Ok(())
    }
}

fn default_future_skew() -> Duration {
    Duration::from_secs(24 * 3600)
}

fn default_future_confirm() -> u64 {
    100
}

fn default_sweep_limit() -> usize {
    50_000
}

impl Default for TtlConfig {
    fn default() -> Self {
        TtlConfig {
            default: None,
            names: BTreeMap::new(),
            time: TimeDomain::Event,
            lateness: Duration::ZERO,
            future_skew: default_future_skew(),
            future_confirm: default_future_confirm(),
            sweep_limit: default_sweep_limit(),
        }
    }
}

/// `[dead_letter]`: a JSONL file, or a Kafka topic of the sink's cluster.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeadLetterConfig {
    /// The JSONL file dead letters are appended to; absent: [`DEFAULT_DEAD_LETTER_PATH`]
    /// unless `topic` is set.
    pub path: Option<PathBuf>,
    /// The Kafka topic dead letters are produced to, through the sink's producer
    /// (a Kafka sink only).
    pub topic: Option<String>,
}

/// Where dead letters go when `[dead_letter]` names nothing.
pub const DEFAULT_DEAD_LETTER_PATH: &str = "dead-letter.jsonl";

impl DeadLetterConfig {
    /// The dead-letter file, when dead letters go to one.
    pub fn path(&self) -> &Path {
        self.path.as_deref().unwrap_or(Path::new(DEFAULT_DEAD_LETTER_PATH))
    }
}

/// `[checkpoint]`
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointConfig {
    /// Whether to checkpoint and restore at all.
    #[serde(default = "default_checkpoint_enabled")]
    pub enabled: bool,
    /// The checkpoint store: a directory, `file:///dir` or `s3://bucket/prefix`.
    /// Absent: `<state dir>.checkpoints`, a directory beside the state directory.
    pub store: Option<String>,
    /// Between the starts of a partition's checkpoints.
    #[serde(default = "default_checkpoint_interval", alias = "interval_s", deserialize_with = "duration")]
    pub interval: Duration,
    /// Checkpoints kept per partition.
    #[serde(default = "default_checkpoint_retain")]
    pub retain: usize,
    /// A restore predicted to take longer than this logs a warning.
    #[serde(default = "default_restore_budget", alias = "restore_budget_s", deserialize_with = "duration")]
    pub restore_budget: Duration,
    /// How long a partition keeps trying while something fails that should come back —
    /// the store failing to answer at its start (then the start fails), the broker at
    /// its resume, another producer fencing its transactions (then it stops alone) —
    /// the partition paused and the host in its group.
    #[serde(default = "default_restore_retry_timeout", deserialize_with = "duration")]
    pub restore_retry_timeout: Duration,
    /// Upload bandwidth cap in bytes per second; absent is unlimited.
    pub upload_bytes_per_s: Option<u64>,
}

fn default_checkpoint_enabled() -> bool {
    true
}

fn default_checkpoint_interval() -> Duration {
    Duration::from_secs(10)
}

fn default_checkpoint_retain() -> usize {
    3
}

fn default_restore_budget() -> Duration {
    Duration::from_secs(60)
}

/// Kafka Streams' `task.timeout.ms` default: a store outage this long is not a blip.
fn default_restore_retry_timeout() -> Duration {
    Duration::from_secs(300)
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        CheckpointConfig {
            enabled: default_checkpoint_enabled(),
            store: None,
            interval: default_checkpoint_interval(),
            retain: default_checkpoint_retain(),
            restore_budget: default_restore_budget(),
            restore_retry_timeout: default_restore_retry_timeout(),
            upload_bytes_per_s: None,
        }
    }
}

impl CheckpointConfig {
    /// The store URL: the configured one, or `<state_dir>.checkpoints`.
    pub fn store_url(&self, state_dir: &Path) -> String {
        self.store.clone().unwrap_or_else(|| {
            let name = state_dir.file_name().map_or("sluice-state".into(), |n| n.to_string_lossy());
            state_dir.with_file_name(format!("{name}.checkpoints")).to_string_lossy().into_owned()
        })
    }
}

/// `[report]`
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportConfig {
    /// Between running-summary lines; 0 turns them off.
    #[serde(default = "default_report_interval", alias = "interval_s", deserialize_with = "duration")]
    pub interval: Duration,
    /// Warn when the largest partition's state (or slowest partition's batch p99) is
    /// this many times the median partition's.
    #[serde(default = "default_skew_ratio")]
    pub skew_ratio: f64,
    /// Warn when a partition's newest checkpoint is older than this many checkpoint
    /// intervals.
    #[serde(default = "default_checkpoint_age_intervals")]
    pub checkpoint_age_intervals: u32,
    /// Warn when this member took part in more rebalances than this in the last hour.
    #[serde(default = "default_rebalances_per_hour")]
    pub rebalances_per_hour: u32,
    /// Warn when more than this share of the records processed went to the dead
    /// letters (over the last check's window).
    #[serde(default = "default_dead_letter_ratio")]
    pub dead_letter_ratio: f64,
}

fn default_report_interval() -> Duration {
    Duration::from_secs(2)
}

fn default_skew_ratio() -> f64 {
    4.0
}

fn default_checkpoint_age_intervals() -> u32 {
    3
}

fn default_rebalances_per_hour() -> u32 {
    12
}

fn default_dead_letter_ratio() -> f64 {
    0.01
}

impl Default for ReportConfig {
    fn default() -> Self {
        ReportConfig {
            interval: default_report_interval(),
            skew_ratio: default_skew_ratio(),
            checkpoint_age_intervals: default_checkpoint_age_intervals(),
            rebalances_per_hour: default_rebalances_per_hour(),
            dead_letter_ratio: default_dead_letter_ratio(),
        }
    }
}

/// `[admin]`
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// `host:port` the admin HTTP API listens on; absent: no API. Beyond loopback it
    /// needs a token.
    pub listen: Option<String>,
    /// A file holding the bearer token deploys and rollbacks must present (and, beyond
    /// loopback, every request); absent: the `SLUICE_ADMIN_TOKEN` environment variable,
    /// else no token, and the API only answers questions.
    pub token_file: Option<PathBuf>,
    /// Names this host is reached by, besides IP addresses and `localhost`: on loopback
    /// a question without the token is answered only if its `Host` is one of these (a
    /// page of a site that points its name at 127.0.0.1 is refused).
    #[serde(default)]
    pub host_names: Vec<String>,
}

impl Config {
    /// A job running the operator at `path` with every other setting at its default.
    pub fn for_operator(path: &Path) -> Self {
        Config {
            operator: OperatorConfig {
                path: path.to_path_buf(),
                name: None,
                poll_versions: default_poll_versions(),
                instructions_per_call: 0,
                call_timeout_ms: default_call_timeout_ms(),
                memory_limit_mib: default_memory_limit_mib(),
                config: BTreeMap::new(),
                limits: OperatorLimits::default(),
                retry: RetryPolicy::default(),
            },
            source: SourceConfig::default(),
            sink: SinkConfig::default(),
            state: StateConfig::default(),
            ttl: TtlConfig::default(),
            dead_letter: DeadLetterConfig::default(),
            checkpoint: CheckpointConfig::default(),
            report: ReportConfig::default(),
            admin: AdminConfig::default(),
        }
    }

    /// Where the operator's deployed versions are recorded: the checkpoint store, which
    /// every host of the job shares; with checkpoints off, `versions` in the state
    /// directory (this host only).
    pub fn registry_url(&self) -> String {
        match self.checkpoint.enabled {
            true => self.checkpoint.store_url(&self.state.dir),
            false => self.state.dir.join("versions").to_string_lossy().into_owned(),
        }
    }

    /// Reads and validates the config file at `path`.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading config file {}", path.display()))?;
        let config: Config = toml::from_str(&text).map_err(|e| {
            anyhow::anyhow!("config file {} is not a valid sluice config: {}", path.display(), e.to_string().trim_end())
        })?;
        config.validate().with_context(|| format!("config file {}", path.display()))?;
        Ok(config)
    }

    /// Checks values that parse but cannot work.
    pub fn validate(&self) -> Result<()> {
        if self.state.partitions == 0 {
            bail!("[state] partitions must be at least 1");
        }
        if self.state.partitions > MAX_PARTITIONS {
            bail!(
                "[state] partitions = {} is more than {MAX_PARTITIONS}: each partition has a database, a queue and, \
                 while it runs, a thread of its own",
                self.state.partitions
            );
        }
        if self.state.queued_records > MAX_QUEUED_RECORDS {
            bail!(
                "[state] queued_records = {} is more than {MAX_QUEUED_RECORDS}: each partition's queue is allocated \
                 for that many",
                self.state.queued_records
            );
        }
        if self.state.commit_every == 0 || self.state.batch_records == 0 {
            bail!("[state] commit_every and batch_records must be at least 1");
        }
        if self.state.commit_interval.is_zero() || self.state.commit_dirty_mib == 0 || self.state.queued_mib == 0 {
            bail!("[state] commit_interval, commit_dirty_mib and queued_mib must be more than 0");
        }
        let report = &self.report;
        if !(report.skew_ratio >= 1.0 && report.skew_ratio.is_finite()) {
            bail!("[report] skew_ratio = {} must be a number of at least 1", report.skew_ratio);
        }
        if !(report.dead_letter_ratio > 0.0 && report.dead_letter_ratio <= 1.0) {
            bail!("[report] dead_letter_ratio = {} must be more than 0 and at most 1", report.dead_letter_ratio);
        }
        if report.checkpoint_age_intervals == 0 || report.rebalances_per_hour == 0 {
            bail!("[report] checkpoint_age_intervals and rebalances_per_hour must be at least 1");
        }
        if self.state.rocksdb_memory_mib == 0 {
            bail!("[state] rocksdb_memory_mib must be at least 1: RocksDB needs memory for its memtables");
        }
        self.ttl.validate()?;
        let durations = [
            ("[operator] poll_versions", self.operator.poll_versions),
            ("[operator.retry] backoff", self.operator.retry.backoff),
            ("[state] commit_interval", self.state.commit_interval),
            ("[checkpoint] interval", self.checkpoint.interval),
            ("[checkpoint] restore_budget", self.checkpoint.restore_budget),
            ("[checkpoint] restore_retry_timeout", self.checkpoint.restore_retry_timeout),
            ("[report] interval", self.report.interval),
        ];
        let source_duration = match &self.source {
            SourceConfig::Generator { duration, .. } => duration.map(|d| ("[source] duration", d)),
            SourceConfig::Kafka { stop_when_idle, .. } => stop_when_idle.map(|d| ("[source] stop_when_idle", d)),
            SourceConfig::File { .. } => None,
        };
        for (setting, duration) in durations.into_iter().chain(source_duration) {
            check_duration(setting, duration)?;
        }
        let sizes_mib = [
            ("[operator] memory_limit_mib", self.operator.memory_limit_mib),
            ("[state] commit_dirty_mib", self.state.commit_dirty_mib as u64),
            ("[state] queued_mib", self.state.queued_mib as u64),
            ("[state] cache_mib", self.state.cache_mib as u64),
            ("[state] rocksdb_memory_mib", self.state.rocksdb_memory_mib as u64),
        ];
        if let Some((name, mib)) = sizes_mib.into_iter().find(|&(_, mib)| mib > MAX_MIB) {
            bail!("{name} = {mib} is more than {MAX_MIB} MiB (16 TiB), more than any host has");
        }
        if self.operator.call_timeout_ms == 0 || self.operator.memory_limit_mib == 0 {
            bail!("[operator] call_timeout_ms and memory_limit_mib must be positive");
        }
        if self.operator.retry.attempts == 0 {
            bail!("[operator.retry] attempts must be at least 1 (the first call)");
        }
        let limits = &self.operator.limits;
        let sizes = [
            ("outputs_per_record", limits.outputs_per_record),
            ("output_bytes_per_record", limits.output_bytes_per_record),
            ("writes_per_record", limits.writes_per_record),
            ("written_bytes_per_record", limits.written_bytes_per_record),
            ("reads_per_record", limits.reads_per_record),
            ("state_value_bytes", limits.state_value_bytes),
            ("state_name_bytes", limits.state_name_bytes),
            ("log_line_bytes", limits.log_line_bytes),
            ("reason_bytes", limits.reason_bytes),
            ("output_bytes_per_batch", limits.output_bytes_per_batch),
        ];
        let rates = [
            ("log_lines_per_s", limits.log_lines_per_s),
            ("log_bytes_per_s", limits.log_bytes_per_s),
            ("time_per_batch_ms", limits.time_per_batch_ms),
        ];
        let zero = sizes.iter().map(|&(name, n)| (name, n as u64)).chain(rates).find(|&(_, n)| n == 0);
        if let Some((name, _)) = zero {
            bail!("[operator.limits] {name} must be at least 1");
        }
        if self.operator.poll_versions.is_zero() {
            bail!("[operator] poll_versions must be more than 0");
        }
        let checkpoint = &self.checkpoint;
        if checkpoint.retain == 0 {
            bail!("[checkpoint] retain must be at least 1");
        }
        if checkpoint.upload_bytes_per_s == Some(0) {
            bail!("[checkpoint] upload_bytes_per_s must be positive (leave it out for no cap)");
        }
        if let SourceConfig::Generator { vehicles, .. } = &self.source {
            check_vehicles("[source] vehicles", *vehicles)?;
        }
        let rate = match &self.source {
            SourceConfig::Generator { vehicles: 0, .. } => bail!("[source] vehicles must be at least 1"),
            SourceConfig::File { max_line_bytes: 0, .. } => bail!("[source] max_line_bytes must be at least 1"),
            SourceConfig::Generator { rate, .. } | SourceConfig::File { rate, .. } => *rate,
            SourceConfig::Kafka { stop_when_idle, .. } => {
                if stop_when_idle.is_some_and(|idle| idle.is_zero()) {
                    bail!("[source] stop_when_idle must be more than 0");
                }
                None
            }
        };
        if rate.is_some_and(|r| r.is_nan() || r < MIN_RATE) {
            bail!("[source] rate must be at least {MIN_RATE} records per second (one record every 1000 s)");
        }
        if let (Some(path), Some(topic)) = (&self.dead_letter.path, &self.dead_letter.topic) {
            bail!(
                "[dead_letter] names both a file ({}) and a topic ({topic:?}): dead letters go to one of them",
                path.display()
            );
        }
        if let (Some(topic), SinkConfig::File { .. } | SinkConfig::Stdout) = (&self.dead_letter.topic, &self.sink) {
            bail!("[dead_letter] topic = {topic:?} needs a Kafka sink: dead letters go through its producer");
        }
        if let SinkConfig::Kafka { brokers, properties, guarantee: Guarantee::ExactlyOnce, .. } = &self.sink {
            let SourceConfig::Kafka { brokers: source_brokers, .. } = &self.source else {
                bail!(
                    "[sink] guarantee = \"exactly-once\" needs a Kafka source: each transaction records the input \
                     offset it covers in the source's consumer group"
                );
            };
            if brokers != source_brokers {
                bail!(
                    "[sink] guarantee = \"exactly-once\" needs the sink on the source's cluster: [sink] brokers \
                     {brokers:?} differ from [source] brokers {source_brokers:?} (a transaction commits the input \
                     offsets to the source's consumer group through the sink's brokers)"
                );
            }
            let timeout_ms = properties.get("transaction.timeout.ms").map_or(Ok(60_000), |ms| {
                ms.parse::<u64>()
                    .with_context(|| format!("[sink.properties] transaction.timeout.ms = {ms:?} is not a number"))
            })?;
            if self.state.commit_interval.as_millis() * 2 > timeout_ms as u128 {
                bail!(
                    "[state] commit_interval ({:?}) must be under half of the sink's transaction.timeout.ms \
                     ({timeout_ms} ms): a transaction stays open a commit interval and more, and the broker aborts \
                     one open longer",
                    self.state.commit_interval
                );
            }
        }
        let not_a_name =
            |name: &&String| name.is_empty() || !name.chars().all(|c| c.is_alphanumeric() || "-.".contains(c));
        if let Some(name) = self.admin.host_names.iter().find(not_a_name) {
            bail!("[admin] host_names: {name:?} is not a host name (give the name alone: no scheme, port or path)");
        }
        Ok(())
    }
}

/// The largest size in MiB a setting takes: its bytes fit every counter with room to
/// spare.
pub const MAX_MIB: u64 = 1 << 24;

/// The most partitions a job may have (`[state] partitions`).
pub const MAX_PARTITIONS: u32 = 1 << 16;

/// The most vehicles the embedded generator simulates (`[source] vehicles`, `sluice
/// generate --vehicles`): it holds each in memory, about 100 bytes a vehicle.
pub const MAX_VEHICLES: u32 = 1 << 24;

/// Fails, naming `setting`, when the generator is asked for more than [`MAX_VEHICLES`].
pub fn check_vehicles(setting: &str, vehicles: u32) -> Result<()> {
    if vehicles > MAX_VEHICLES {
        bail!("{setting} = {vehicles} is more than {MAX_VEHICLES}: the generator holds every vehicle in memory");
    }
    Ok(())
}

/// The longest duration a setting takes: its milliseconds fit the u64 that clocks,
/// expiries and deadlines count in (2^64 - 1 ms, about 584 million years). A longer one
/// would wrap where it becomes milliseconds, or overflow where it is added to a time.
pub const MAX_DURATION: Duration = Duration::from_millis(u64::MAX);

/// Fails, naming `setting`, when `duration` is longer than [`MAX_DURATION`].
fn check_duration(setting: &str, duration: Duration) -> Result<()> {
    if duration > MAX_DURATION {
        bail!(
            "{setting} = {}s is more than {}s (2^64 - 1 ms, about 584 million years), the longest duration sluice \
             counts",
            duration.as_secs(),
            MAX_DURATION.as_secs()
        );
    }
    Ok(())
}

/// The most records a partition's queue may hold (`[state] queued_records`).
pub const MAX_QUEUED_RECORDS: usize = 1 << 24;

/// The slowest `[source] rate`, records per second.
pub const MIN_RATE: f64 = 0.001;

/// A librdkafka client configuration for `brokers`: sluice's `defaults`, then the
/// user's `properties` (from `[source]` or `[sink]`), which win.
pub fn kafka_client(
    brokers: &str,
    defaults: &[(&str, &str)],
    properties: &std::collections::BTreeMap<String, String>,
) -> rdkafka::config::ClientConfig {
    let mut config = rdkafka::config::ClientConfig::new();
    config.set("bootstrap.servers", brokers);
    for (name, value) in defaults.iter().copied().chain(properties.iter().map(|(k, v)| (k.as_str(), v.as_str()))) {
        config.set(name, value);
    }
    config
}

/// Reads a duration as the config and the command line write it: a number of seconds
/// (`2.5`), or a number with units as [`humantime`] reads it (`"500ms"`, `"10s"`,
/// `"1m"`, `"1h 30m"`). Negative, infinite and unreadable values are errors.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    match text.trim().parse::<f64>() {
        Ok(seconds) => duration_of_seconds(seconds),
        Err(_) => humantime::parse_duration(text.trim()).map_err(|e| {
            format!("{text:?} is not a duration ({e}): write a number of seconds or e.g. \"500ms\", \"10s\", \"1m\"")
        }),
    }
}

fn duration_of_seconds(seconds: f64) -> Result<Duration, String> {
    if seconds < 0.0 {
        return Err(format!("{seconds} is not a duration: durations are 0 or more seconds"));
    }
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{seconds} is not a duration: {e}"))
}

/// A duration setting, through [`parse_duration`]: TOML gives a number or a string.
fn duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    struct DurationVisitor;

    impl Visitor<'_> for DurationVisitor {
        type Value = Duration;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a duration: a number of seconds or a string such as \"500ms\", \"10s\" or \"1m\"")
        }

        fn visit_i64<E: de::Error>(self, seconds: i64) -> Result<Duration, E> {
            duration_of_seconds(seconds as f64).map_err(E::custom)
        }

        fn visit_u64<E: de::Error>(self, seconds: u64) -> Result<Duration, E> {
            Ok(Duration::from_secs(seconds))
        }

        fn visit_f64<E: de::Error>(self, seconds: f64) -> Result<Duration, E> {
            duration_of_seconds(seconds).map_err(E::custom)
        }

        fn visit_str<E: de::Error>(self, text: &str) -> Result<Duration, E> {
            parse_duration(text).map_err(E::custom)
        }
    }

    deserializer.deserialize_any(DurationVisitor)
}

/// An optional duration setting: absent is `None` (with `#[serde(default)]`).
fn optional_duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Duration>, D::Error> {
    duration(deserializer).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minimal_config_takes_defaults() {
        let config: Config = toml::from_str("[operator]\npath = \"op.wasm\"\n").unwrap();
        assert_eq!(config.state.partitions, 4);
        assert_eq!(config.sink, SinkConfig::Stdout);
        config.validate().unwrap();
    }

    /// Exactly-once outputs need a Kafka source, whose group records the offsets
    /// their transactions cover; a misspelt guarantee names the choices.
    #[test]
    fn exactly_once_outputs_need_a_kafka_source() {
        let sink = "[sink]\nkind = \"kafka\"\nbrokers = \"b:9092\"\ntopic = \"out\"\nguarantee = \"exactly-once\"\n";
        let generator: Config = toml::from_str(&format!("[operator]\npath = \"op.wasm\"\n{sink}")).unwrap();
        let err = generator.validate().unwrap_err().to_string();
        assert!(err.contains("needs a Kafka source"), "{err}");
        let kafka: Config = toml::from_str(&format!(
            "[operator]\npath = \"op.wasm\"\n{sink}[source]\nkind = \"kafka\"\nbrokers = \"b:9092\"\ntopic = \"in\"\n"
        ))
        .unwrap();
        kafka.validate().unwrap();
        let mut elsewhere = kafka.clone();
        let SourceConfig::Kafka { brokers, .. } = &mut elsewhere.source else { unreachable!() };
        *brokers = "other:9092".into();
        let err = elsewhere.validate().unwrap_err().to_string();
        assert!(err.contains("needs the sink on the source's cluster"), "{err}");
        let mut slow = kafka.clone();
        slow.state.commit_interval = Duration::from_secs(31);
        let err = slow.validate().unwrap_err().to_string();
        assert!(err.contains("under half of the sink's transaction.timeout.ms (60000 ms)"), "{err}");
        let misspelt = toml::from_str::<Config>(&format!(
            "[operator]\npath = \"op.wasm\"\n{}",
            sink.replace("exactly-once", "exactly_once")
        ));
        let err = misspelt.unwrap_err().to_string();
        assert!(err.contains("at-least-once") && err.contains("exactly-once"), "{err}");
    }

    #[test]
    fn the_default_checkpoint_store_sits_beside_the_state_directory() {
        let checkpoint = CheckpointConfig::default();
        assert_eq!(checkpoint.store_url(Path::new("out/state")), "out/state.checkpoints");
        assert_eq!(checkpoint.store_url(Path::new("out/state/")), "out/state.checkpoints");
        let configured = CheckpointConfig { store: Some("s3://b/p".into()), ..CheckpointConfig::default() };
        assert_eq!(configured.store_url(Path::new("out/state")), "s3://b/p");
    }

    #[test]
    fn durations_are_seconds_or_strings_with_units_under_new_and_old_names() {
        let config: Config = toml::from_str(
            "[operator]\npath = \"op.wasm\"\npoll_versions_s = 0.25\n[checkpoint]\ninterval = \"500ms\"\n\
             restore_budget_s = 90\n[report]\ninterval = \"1m 30s\"\n[source]\nkind = \"generator\"\nduration = 2\n",
        )
        .unwrap();
        assert_eq!(config.operator.poll_versions, Duration::from_millis(250));
        assert_eq!(config.checkpoint.interval, Duration::from_millis(500));
        assert_eq!(config.checkpoint.restore_budget, Duration::from_secs(90));
        assert_eq!(config.report.interval, Duration::from_secs(90));
        assert!(
            matches!(config.source, SourceConfig::Generator { duration: Some(d), .. } if d == Duration::from_secs(2))
        );
        let kafka: Config = toml::from_str(
            "[operator]\npath = \"op.wasm\"\n[source]\nkind = \"kafka\"\nbrokers = \"b:9092\"\ntopic = \"t\"\n\
             stop_when_idle_s = \"10s\"\n",
        )
        .unwrap();
        assert!(
            matches!(kafka.source, SourceConfig::Kafka { stop_when_idle: Some(d), .. } if d == Duration::from_secs(10))
        );
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration(" 1.5 "), Ok(Duration::from_millis(1500)));
    }

    #[test]
    fn a_bad_duration_is_an_error_naming_the_setting() {
        for (setting, expected) in [
            ("[checkpoint]\ninterval_s = -1", "-1 is not a duration: durations are 0 or more seconds"),
            ("[report]\ninterval = \"soon\"", "\"soon\" is not a duration"),
            ("[checkpoint]\nrestore_budget = \"-5s\"", "\"-5s\" is not a duration"),
            ("[checkpoint]\ninterval = nan", "NaN is not a duration"),
            ("[checkpoint]\ninterval = true", "expected a duration: a number of seconds or a string"),
        ] {
            let text = format!("[operator]\npath = \"op.wasm\"\n{setting}\n");
            let err = toml::from_str::<Config>(&text).unwrap_err().to_string();
            let line = setting.lines().last().unwrap();
            assert!(err.contains(expected) && err.contains(line), "{setting}: {err}");
        }
        for (setting, expected) in [
            ("memory_limit_mib = 17592186044416", "[operator] memory_limit_mib = 17592186044416 is more than"),
            ("[state]\ncache_mib = 17592186044416", "[state] cache_mib = 17592186044416 is more than"),
            ("[source]\nkind = \"generator\"\nrate = 1e-300", "[source] rate must be at least 0.001"),
            ("[source]\nkind = \"generator\"\nrate = nan", "[source] rate must be at least 0.001"),
        ] {
            let config = toml::from_str::<Config>(&format!("[operator]\npath = \"op.wasm\"\n{setting}\n")).unwrap();
            let err = config.validate().unwrap_err().to_string();
            assert!(err.contains(expected), "{setting}: {err}");
        }
        let zero = toml::from_str::<Config>("[operator]\npath = \"op.wasm\"\npoll_versions = 0\n").unwrap();
        assert!(zero.validate().unwrap_err().to_string().contains("poll_versions must be more than 0"));
        let zero =
            toml::from_str::<Config>("[operator]\npath = \"op.wasm\"\n[state]\nrocksdb_memory_mib = 0\n").unwrap();
        assert!(zero.validate().unwrap_err().to_string().contains("rocksdb_memory_mib must be at least 1"));
    }

    #[test]
    fn ttls_are_durations_by_name_and_out_of_range_ones_are_refused() {
        let text = "[operator]\npath = \"op.wasm\"\n[ttl]\ndefault = \"7d\"\n[ttl.names]\nsummary = 90\n";
        let config = toml::from_str::<Config>(text).unwrap();
        assert_eq!(config.ttl.default, Some(Duration::from_secs(7 * 86_400)));
        assert_eq!(config.ttl.names["summary"], Ttl(Duration::from_secs(90)));
        config.validate().unwrap();
        for (ttl, expected) in [
            ("\"0s\"", "[ttl.names] summary = 0ns is under 1 ms"),
            ("0.0005", "[ttl.names] summary = 500µs is under 1 ms"),
            ("18446744073709552", "[ttl.names] summary = 18446744073709552s is more than 18446744073709551s"),
        ] {
            let text = format!("[operator]\npath = \"op.wasm\"\n[ttl.names]\nsummary = {ttl}\n");
            let err = toml::from_str::<Config>(&text).unwrap().validate().unwrap_err().to_string();
            assert!(err.contains(expected), "{ttl}: {err}");
        }
        let shortest = "[operator]\npath = \"op.wasm\"\n[ttl]\ndefault = \"1ms\"\n";
        toml::from_str::<Config>(shortest).unwrap().validate().unwrap();
    }

    /// Dead letters go to a file or to a topic of a Kafka sink, never both.
    #[test]
    fn a_dead_letter_topic_needs_a_kafka_sink_and_no_file() {
        let config = |more: &str| toml::from_str::<Config>(&format!("[operator]\npath = \"op.wasm\"\n{more}")).unwrap();
        let kafka = "[sink]\nkind = \"kafka\"\nbrokers = \"b:9092\"\ntopic = \"out\"\n";
        let on_kafka = config(&format!("{kafka}[dead_letter]\ntopic = \"dead\"\n"));
        on_kafka.validate().unwrap();
        assert_eq!(on_kafka.dead_letter.topic.as_deref(), Some("dead"));
        assert_eq!(config("").dead_letter.path(), Path::new(DEFAULT_DEAD_LETTER_PATH));
        let both = config(&format!("{kafka}[dead_letter]\ntopic = \"dead\"\npath = \"dead.jsonl\"\n"));
        let err = both.validate().unwrap_err().to_string();
        assert!(err.contains("names both a file (dead.jsonl) and a topic (\"dead\")"), "{err}");
        let on_file = config("[dead_letter]\ntopic = \"dead\"\n");
        let err = on_file.validate().unwrap_err().to_string();
        assert!(err.contains("[dead_letter] topic = \"dead\" needs a Kafka sink"), "{err}");
    }

    /// `[admin] host_names` are names alone: one with a port or a scheme would never
    /// match a request's `Host`.
    #[test]
    fn admin_host_names_are_names_alone() {
        let config = |names: &str| {
            toml::from_str::<Config>(&format!("[operator]\npath = \"op.wasm\"\n[admin]\nhost_names = {names}\n"))
                .unwrap()
        };
        config(r#"["devbox", "devbox.internal", "dev-1"]"#).validate().unwrap();
        for bad in ["devbox:9464", "http://devbox", ""] {
            let err = config(&format!("[{bad:?}]")).validate().unwrap_err().to_string();
            assert!(err.contains(&format!("[admin] host_names: {bad:?} is not a host name")), "{err}");
        }
    }

    #[test]
    fn a_typo_is_an_error_not_a_default() {
        let err = toml::from_str::<Config>("[operator]\npath = \"op.wasm\"\n[state]\npartitons = 3\n").unwrap_err();
        assert!(err.to_string().contains("partitons"), "{err}");
    }
}
