//! `[state]` and `[ttl]`: the state directory, batches, queues, commits and memory, and
//! when state expires, with their defaults and checks.

use super::*;

/// `[state]`
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StateConfig {
    /// The state directory: one RocksDB database per partition.
    pub dir: PathBuf,
    /// How many partitions keys are hashed into.
    pub partitions: u32,
    /// The most records per batch handed to a worker (never more than
    /// `commit_every`): between batches a worker writes outputs and looks for stops
    /// and deploys, so a batch's processing time is what a rebalance waits for.
    pub batch_records: usize,
    /// The most records a partition's worker may have queued, in whole batches (at
    /// least four), before the source holds the partition back: the memory of each
    /// partition's queue. A Kafka source pauses the partition, which costs it the
    /// records librdkafka prefetched, so too small a queue pauses it all the time.
    pub queued_records: usize,
    /// The most bytes of records (keys, values and headers) a partition's worker may
    /// have queued, MiB, before the source holds the partition back; a batch ends at a
    /// quarter of it. A queue bounded by records alone would hold `queued_records` of
    /// the largest record, whatever its size. One record larger than the bound still
    /// passes, alone.
    pub queued_mib: usize,
    /// The longest a partition's processed records wait for their state commit.
    #[serde(deserialize_with = "duration")]
    pub commit_interval: Duration,
    /// The most records per state commit.
    pub commit_every: usize,
    /// The most bytes of state written (each entry's last value) before a commit, MiB.
    pub commit_dirty_mib: usize,
    /// Whether each commit first syncs the output and dead-letter files to disk, so that
    /// after a power loss state is never ahead of the lines it emitted (Kafka outputs
    /// are acknowledged before a commit whatever this says).
    pub sync_outputs: bool,
    /// The memory for committed state entries kept per partition (reads of them skip
    /// RocksDB), MiB; 0 keeps none.
    pub cache_mib: usize,
    /// The memory a partition's timers may take (they are all held in memory, about
    /// 100 bytes each), MiB: a timer set past it fails its record.
    pub timers_mib: usize,
    /// The memory RocksDB may use for every partition of the host together — memtables,
    /// and data, index and filter blocks — MiB.
    pub rocksdb_memory_mib: usize,
}

impl StateConfig {
    /// Checks values that parse but cannot work.
    pub fn validate(&self) -> Result<()> {
        if self.partitions == 0 {
            bail!("[state] partitions must be at least 1");
        }
        if self.partitions > MAX_PARTITIONS {
            bail!(
                "[state] partitions = {} is more than {MAX_PARTITIONS}: each partition has a database, a queue and, \
                 while it runs, a thread of its own",
                self.partitions
            );
        }
        if self.queued_records > MAX_QUEUED_RECORDS {
            bail!(
                "[state] queued_records = {} is more than {MAX_QUEUED_RECORDS}: each partition's queue is allocated \
                 for that many",
                self.queued_records
            );
        }
        if self.commit_every == 0 || self.batch_records == 0 {
            bail!("[state] commit_every and batch_records must be at least 1");
        }
        if self.commit_interval.is_zero() || self.commit_dirty_mib == 0 || self.queued_mib == 0 {
            bail!("[state] commit_interval, commit_dirty_mib and queued_mib must be more than 0");
        }
        if self.rocksdb_memory_mib == 0 {
            bail!("[state] rocksdb_memory_mib must be at least 1: RocksDB needs memory for its memtables");
        }
        check_duration("[state] commit_interval", self.commit_interval)?;
        check_mib(&[
            ("[state] commit_dirty_mib", self.commit_dirty_mib as u64),
            ("[state] queued_mib", self.queued_mib as u64),
            ("[state] cache_mib", self.cache_mib as u64),
            ("[state] timers_mib", self.timers_mib as u64),
            ("[state] rocksdb_memory_mib", self.rocksdb_memory_mib as u64),
        ])
    }

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

impl Default for StateConfig {
    fn default() -> Self {
        StateConfig {
            dir: "sluice-state".into(),
            partitions: 4,
            batch_records: 512,
            queued_records: 65_536,
            queued_mib: 64,
            commit_interval: Duration::from_secs(1),
            commit_every: 100_000,
            commit_dirty_mib: 64,
            sync_outputs: true,
            cache_mib: 64,
            timers_mib: 64,
            rocksdb_memory_mib: 256,
        }
    }
}

/// The most partitions a job may have (`[state] partitions`).
pub const MAX_PARTITIONS: u32 = 1 << 16;

/// The most records a partition's queue may hold (`[state] queued_records`).
pub const MAX_QUEUED_RECORDS: usize = 1 << 24;

/// `[ttl]`: state expiry, in event time.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TtlConfig {
    /// The TTL of every entry whose name has none in `names`, counted from its last
    /// write; absent: such entries never expire.
    #[serde(deserialize_with = "optional_duration")]
    pub default: Option<Duration>,
    /// TTLs by state name.
    pub names: BTreeMap<String, Ttl>,
    /// Which clock TTLs count in; recorded with the state.
    pub time: TimeDomain,
    /// How far the clock trails the largest timestamp seen.
    #[serde(deserialize_with = "duration")]
    pub lateness: Duration,
    /// In event time, how long a partition goes without records (by the wall clock)
    /// before its clock moves on with the wall clock, so its windows close and its
    /// timers fire without a record; absent: an idle partition's clock holds, so a
    /// replay decides every expiry and timer as the first run did.
    #[serde(deserialize_with = "optional_duration")]
    pub idle_timeout: Option<Duration>,
    /// A timestamp further than this ahead of the partition's clock does not move it,
    /// unless `future_confirm` such records come in a row.
    #[serde(deserialize_with = "duration")]
    pub future_skew: Duration,
    /// Records in a row, each more than `future_skew` ahead of the clock, that move it
    /// (to the nearest of them): a gap in the data is crossed, a lone far-future
    /// timestamp is not. Decided by the records alone, so a replay decides the same.
    pub future_confirm: u64,
    /// Distinct keys among those records, at least: one device replaying a backlog
    /// with a wrong clock — a few keys — cannot move the clock past everyone else's.
    /// At most [`FUTURE_CONFIRM_KEYS_MAX`].
    pub future_confirm_keys: u32,
    /// The most entries one batch expires: every entry due before a record expires
    /// before it, earliest first, and a batch past this (or past a per-batch bound of
    /// `[operator.limits]`) ends there, the rest expiring in the next batches.
    pub sweep_limit: usize,
}

/// The most distinct keys `[ttl] future_confirm_keys` may ask for: the clock tells
/// keys apart by a 64-slot sketch it commits with its time.
pub const FUTURE_CONFIRM_KEYS_MAX: u32 = 32;

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
        if let Some(idle) = self.idle_timeout {
            check_duration("[ttl] idle_timeout", idle)?;
            if idle.is_zero() {
                bail!("[ttl] idle_timeout must be more than 0 (absent: an idle partition's clock holds)");
            }
            if self.time == TimeDomain::Processing {
                bail!(
                    "[ttl] idle_timeout is for time = \"event\": in processing time the clock follows the wall \
                     clock, idle or not"
                );
            }
        }
        if self.sweep_limit == 0 {
            bail!("[ttl] sweep_limit must be at least 1, or expired entries would never be removed");
        }
        if self.future_confirm == 0 {
            bail!("[ttl] future_confirm must be at least 1 (1: every timestamp moves the clock, however far ahead)");
        }
        if !(1..=FUTURE_CONFIRM_KEYS_MAX).contains(&self.future_confirm_keys) {
            bail!(
                "[ttl] future_confirm_keys must be 1 to {FUTURE_CONFIRM_KEYS_MAX} (1: the keys do not matter), not {}",
                self.future_confirm_keys
            );
        }
        Ok(())
    }
}

impl Default for TtlConfig {
    fn default() -> Self {
        TtlConfig {
            default: None,
            names: BTreeMap::new(),
            time: TimeDomain::Event,
            lateness: Duration::ZERO,
            idle_timeout: None,
            future_skew: Duration::from_secs(24 * 3600),
            future_confirm: 100,
            future_confirm_keys: 5,
            sweep_limit: 50_000,
        }
    }
}
