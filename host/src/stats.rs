//! The live counters of each partition running on this host, and the process's CPU
//! time.
//!
//! A partition's worker counts into its [`PartitionStats`] as it goes (the
//! checkpointer counts its checkpoints there too), and the host's rebalances and
//! restores go into its [`HostStats`], which also keeps the latest of the host's
//! [`HostEvent`]s for the status page's timeline; the running summary, the deployer
//! (waiting for partitions to switch), the final report, the [metrics](crate::metrics)
//! and the [admin API](crate::admin) read them. This module holds the counters only:
//! it imports nothing of the host's layers but the shared record types, so that every
//! layer can count without reaching into another.

use crate::lock;
use crate::record::DeadLetterKind;
use prometheus_client::metrics::histogram::exponential_buckets;
use serde::Serialize;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A partition's live counters, read by the running summary while the worker runs.
#[derive(Debug)]
pub struct PartitionStats {
    /// Records processed (emitted or dead-lettered) by this worker.
    pub processed: AtomicU64,
    /// Outputs this worker sent to the sink (an expiry's included).
    pub outputs: AtomicU64,
    /// Dead letters this worker sent (to the dead-letter file or topic)...
    pub dead_letters: AtomicU64,
    /// ... by the operator version that processed them, and by kind.
    pub dead_by_version: Mutex<BTreeMap<String, DeadLetters>>,
    /// The next offset to process, as last committed.
    pub committed_offset: AtomicU64,
    /// State entries held, as of the last commit (expired ones not yet removed
    /// included).
    pub entries: AtomicU64,
    /// The bytes the partition's state takes in RocksDB, counted at the worker's start,
    /// then at most once a second (at a commit, or while idle): its estimate of the
    /// live data in the table files plus its memtables (see
    /// [`PartitionStore::live_data_bytes`], [`PartitionStore::memtable_bytes`]).
    ///
    /// [`PartitionStore::live_data_bytes`]: crate::state::PartitionStore::live_data_bytes
    /// [`PartitionStore::memtable_bytes`]: crate::state::PartitionStore::memtable_bytes
    pub state_bytes: AtomicU64,
    /// Reads of committed state (entries not written since the last commit) the cache
    /// answered since the partition started here, as of the last commit...
    pub cache_hits: AtomicU64,
    /// ... and reads that went to RocksDB.
    pub cache_misses: AtomicU64,
    /// Expired entries removed by this worker's commits.
    pub expired: AtomicU64,
    /// Entries due but not yet expired as of the last commit (more came due at once
    /// than `[ttl] sweep_limit`), counted up to the limit.
    pub backlog: AtomicU64,
    /// The partition's event-time clock as of the last commit, ms since the epoch (0:
    /// not started).
    pub clock_ms: AtomicU64,
    /// Records whose timestamp did not move the clock (none, negative or too far
    /// ahead), counted by this worker.
    pub clock_ignored: AtomicU64,
    /// Checkpoints completed by this worker.
    pub checkpoints: AtomicU64,
    /// The offset of the newest completed checkpoint.
    pub checkpoint_offset: AtomicU64,
    /// Bytes uploaded by this worker's checkpoints.
    pub uploaded_bytes: AtomicU64,
    /// Each completed checkpoint's upload time (files and manifest), s.
    pub checkpoint_seconds: Histogram,
    /// Checkpoints that failed (each logged).
    pub checkpoint_failures: AtomicU64,
    /// The 99th percentile of the worker's recent batches' processing time, µs.
    pub batch_p99_us: AtomicU64,
    /// The longest of the worker's recent batches' processing time, µs.
    pub batch_max_us: AtomicU64,
    /// Every batch's processing time, s.
    pub batch_seconds: Histogram,
    /// When the newest checkpoint last held the partition's state (it completed, or a
    /// checkpoint found nothing changed since), or the partition started here if none
    /// did since, ms since the epoch.
    pub checkpoint_at_ms: AtomicU64,
    /// Records in the partition beyond the state's offset, as of the source's last
    /// report; -1 where the source does not report it (the embedded sources).
    pub lag: AtomicI64,
    /// Operator versions switched to while running (hot swaps).
    pub switches: AtomicU64,
    /// How long the latest switch stood the partition still, µs.
    pub last_switch_stall_us: AtomicU64,
    /// The operator version it runs; changes only when it switches.
    pub version: Mutex<String>,
    /// The latest version it could not switch to, and why (it kept running `version`).
    pub refused: Mutex<Option<(String, String)>>,
}

impl PartitionStats {
    /// Counters of a partition that starts at `committed_offset` with `entries` state
    /// entries, running operator `version`.
    pub fn new(committed_offset: u64, entries: u64, version: &str) -> Self {
        PartitionStats {
            processed: AtomicU64::new(0),
            outputs: AtomicU64::new(0),
            dead_letters: AtomicU64::new(0),
            dead_by_version: Mutex::default(),
            committed_offset: AtomicU64::new(committed_offset),
            entries: AtomicU64::new(entries),
            state_bytes: AtomicU64::new(0),
            cache_hits: AtomicU64::new(0),
            cache_misses: AtomicU64::new(0),
            expired: AtomicU64::new(0),
            backlog: AtomicU64::new(0),
            clock_ms: AtomicU64::new(0),
            clock_ignored: AtomicU64::new(0),
            checkpoints: AtomicU64::new(0),
            checkpoint_offset: AtomicU64::new(0),
            uploaded_bytes: AtomicU64::new(0),
            checkpoint_seconds: Histogram::of_durations(),
            checkpoint_failures: AtomicU64::new(0),
            batch_p99_us: AtomicU64::new(0),
            batch_max_us: AtomicU64::new(0),
            batch_seconds: Histogram::of_durations(),
            checkpoint_at_ms: AtomicU64::new(now_ms()),
            lag: AtomicI64::new(-1),
            switches: AtomicU64::new(0),
            last_switch_stall_us: AtomicU64::new(0),
            version: Mutex::new(version.to_string()),
            refused: Mutex::new(None),
        }
    }

    /// The counters a run ends with, as plain values.
    pub fn totals(&self) -> Totals {
        Totals {
            committed_offset: self.committed_offset.load(Ordering::Relaxed),
            processed: self.processed.load(Ordering::Relaxed),
            dead_letters: self.dead_letters.load(Ordering::Relaxed),
            entries: self.entries.load(Ordering::Relaxed),
            expired: self.expired.load(Ordering::Relaxed),
            backlog: self.backlog.load(Ordering::Relaxed),
            clock_ms: self.clock_ms.load(Ordering::Relaxed),
            clock_ignored: self.clock_ignored.load(Ordering::Relaxed),
            checkpoints: self.checkpoints.load(Ordering::Relaxed),
            checkpoint_offset: self.checkpoint_offset.load(Ordering::Relaxed),
            uploaded_bytes: self.uploaded_bytes.load(Ordering::Relaxed),
            switches: self.switches.load(Ordering::Relaxed),
        }
    }
}

/// Dead letters of one operator version, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeadLetters {
    /// Records the operator returned an error for.
    pub rejected: u64,
    /// Records whose calls trapped (after their retries) or passed one of the
    /// operator's limits.
    pub trapped: u64,
    /// Outputs Kafka refused for themselves.
    pub refused: u64,
    /// Kafka records without a key, refused before the operator.
    pub null_key: u64,
}

impl DeadLetters {
    /// Counts one more of `kind`.
    pub fn count(&mut self, kind: DeadLetterKind) {
        match kind {
            DeadLetterKind::Rejected => self.rejected += 1,
            DeadLetterKind::Trapped => self.trapped += 1,
            DeadLetterKind::Refused => self.refused += 1,
            DeadLetterKind::NullKey => self.null_key += 1,
        }
    }

    /// All of them.
    pub fn total(&self) -> u64 {
        self.by_kind().iter().map(|(_, count)| count).sum()
    }

    /// Each kind's count.
    pub fn by_kind(&self) -> [(DeadLetterKind, u64); 4] {
        [
            (DeadLetterKind::Rejected, self.rejected),
            (DeadLetterKind::Trapped, self.trapped),
            (DeadLetterKind::Refused, self.refused),
            (DeadLetterKind::NullKey, self.null_key),
        ]
    }

    /// Adds `other`'s counts.
    pub fn add(&mut self, other: &DeadLetters) {
        self.rejected += other.rejected;
        self.trapped += other.trapped;
        self.refused += other.refused;
        self.null_key += other.null_key;
    }

    /// `dead` added up over partitions, by version.
    pub fn by_version<'a>(
        dead: impl IntoIterator<Item = &'a BTreeMap<String, DeadLetters>>,
    ) -> BTreeMap<String, DeadLetters> {
        let mut all = BTreeMap::<String, DeadLetters>::new();
        for (version, counts) in dead.into_iter().flatten() {
            all.entry(version.clone()).or_default().add(counts);
        }
        all
    }
}

impl std::fmt::Display for DeadLetters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} rejected by the operator, {} trapped or past a limit, {} outputs refused by Kafka, {} records \
             without a key",
            self.rejected, self.trapped, self.refused, self.null_key
        )
    }
}

impl PartitionStats {
    /// Counts `dead` dead letters of operator `version`.
    pub fn count_dead(&self, version: &str, dead: DeadLetters) {
        if dead.total() == 0 {
            return;
        }
        self.dead_letters.fetch_add(dead.total(), Ordering::Relaxed);
        let mut by_version = lock(&self.dead_by_version);
        match by_version.get_mut(version) {
            Some(counts) => counts.add(&dead),
            None => {
                by_version.insert(version.to_string(), dead);
            }
        }
    }
}

/// What a partition's counters reached, as a run's report keeps them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// The next offset to process, committed with its state.
    pub committed_offset: u64,
    /// Records processed.
    pub processed: u64,
    /// Dead letters sent (to the dead-letter file or topic).
    pub dead_letters: u64,
    /// State entries stored, as of the last commit.
    pub entries: u64,
    /// Expired entries removed.
    pub expired: u64,
    /// Entries due but not yet expired (counted up to `[ttl] sweep_limit`).
    pub backlog: u64,
    /// The partition's clock, ms since the epoch (0: not started).
    pub clock_ms: u64,
    /// Records whose timestamp did not move the clock.
    pub clock_ignored: u64,
    /// Checkpoints completed.
    pub checkpoints: u64,
    /// The offset of the newest of them (0 if none).
    pub checkpoint_offset: u64,
    /// Bytes they uploaded.
    pub uploaded_bytes: u64,
    /// Operator versions it switched to while running (hot swaps).
    pub switches: u64,
}

/// The live counters of the running partitions, by partition, for the running summary.
pub type LiveStats = Arc<Mutex<BTreeMap<u32, Arc<PartitionStats>>>>;

/// The wall clock, ms since the Unix epoch.
pub fn now_ms() -> u64 {
    crate::millis(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default())
}

/// How unevenly a measure spreads over partitions: the largest value over the median.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Skew {
    /// `largest / median`.
    pub ratio: f64,
    /// The largest value.
    pub largest: u64,
    /// The median value.
    pub median: u64,
}

impl Skew {
    /// The skew of `values`; `None` without values or while the median is 0.
    pub fn of(values: impl IntoIterator<Item = u64>) -> Option<Skew> {
        let mut values: Vec<u64> = values.into_iter().collect();
        values.sort_unstable();
        // The lower median: of two partitions, the smaller.
        let (median, largest) = (*values.get(values.len().checked_sub(1)? / 2)?, *values.last()?);
        (median > 0).then(|| Skew { ratio: largest as f64 / median as f64, largest, median })
    }
}

/// Values counted into buckets, as Prometheus' histograms count them (the
/// [metrics](crate::metrics) encode it as one), readable as counts for the status the
/// admin API serves.
#[derive(Debug)]
pub struct Histogram(Mutex<HistogramCounts>);

/// What a [`Histogram`] counted.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramCounts {
    /// The sum of the values.
    pub sum: f64,
    /// How many values there were.
    pub count: u64,
    /// Each bucket's upper bound (the last one's `f64::MAX`, which Prometheus writes as
    /// `+Inf`) and how many values fell in it and in no bucket before (not cumulative).
    pub buckets: Vec<(f64, u64)>,
}

impl Histogram {
    /// A histogram for durations, s: buckets from 100 µs to about 52 s, doubling, and
    /// one for the rest.
    pub fn of_durations() -> Self {
        let buckets = exponential_buckets(0.0001, 2.0, 20).chain([f64::MAX]).map(|bound| (bound, 0)).collect();
        Histogram(Mutex::new(HistogramCounts { sum: 0.0, count: 0, buckets }))
    }

    /// Counts `value` into the first bucket whose bound it does not pass (none if it is
    /// NaN or +∞, as Prometheus' own histogram counts).
    pub fn observe(&self, value: f64) {
        let mut counts = lock(&self.0);
        counts.sum += value;
        counts.count += 1;
        if let Some((_, n)) = counts.buckets.iter_mut().find(|(bound, _)| *bound >= value) {
            *n += 1;
        }
    }

    /// What it counted so far.
    pub fn counts(&self) -> HistogramCounts {
        lock(&self.0).clone()
    }
}

/// What a rebalance did to this member's partitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RebalanceChange {
    /// Partitions were assigned to it.
    Assigned,
    /// Partitions were taken from it, handed over.
    Revoked,
    /// Partitions were taken from it after it was evicted: another member had them.
    Lost,
}

/// The host's counters beyond any one partition: its rebalances and restores.
#[derive(Debug)]
pub struct HostStats {
    /// Rebalance callbacks that moved partitions of this member (an eager rebalance
    /// makes two: the revocation and the assignment).
    pub rebalances: AtomicU64,
    /// Each of those callbacks' duration, s.
    pub rebalance_seconds: Histogram,
    /// Partitions assigned to this member so far.
    pub assigned: AtomicU64,
    /// Partitions revoked (handed over) so far.
    pub revoked: AtomicU64,
    /// Partitions lost (taken after an eviction, or claimed by another host in the
    /// checkpoint store) so far.
    pub lost: AtomicU64,
    /// Each restore's duration (one start of one or more partitions), s.
    pub restore_seconds: Histogram,
    /// Bytes fetched from the checkpoint store by restores.
    pub restored_bytes: AtomicU64,
    /// The latest restore's predicted duration, µs.
    pub restore_predicted_us: AtomicU64,
    /// The latest restore's actual duration, µs.
    pub restore_actual_us: AtomicU64,
    /// The kinds of warning that held at the latest check (see
    /// [`warnings`](crate::warnings)).
    pub warnings: Mutex<Vec<&'static str>>,
    /// The latest [`EVENTS_KEPT`] events, oldest first.
    events: Mutex<VecDeque<HostEvent>>,
}

/// How many of the host's latest events [`HostStats`] keeps.
pub const EVENTS_KEPT: usize = 256;

/// Something that happened to the host, when (ms since the epoch).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HostEvent {
    /// When it happened (for a switch: when its first partition switched).
    pub at_ms: u64,
    /// What happened.
    #[serde(flatten)]
    pub what: HostEventKind,
}

/// What happened, as the status page's timeline shows it (JSON: `"kind"` names the
/// variant, the other fields are its own).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum HostEventKind {
    /// A rebalance callback moved `partitions` of this member's partitions.
    Rebalance {
        /// What it did to them.
        change: RebalanceChange,
        /// How many it moved.
        partitions: usize,
        /// How long the callback took, s.
        took_s: f64,
    },
    /// A restore started partitions from local state or the checkpoint store.
    Restore {
        /// Bytes fetched from the store.
        bytes: u64,
        /// How long it took, s.
        took_s: f64,
        /// How long it was predicted to take, s.
        predicted_s: f64,
    },
    /// Partitions switched operator version (a deploy or rollback); the partitions of
    /// one deploy are one event.
    Switch {
        /// The version they ran.
        from: String,
        /// The version they run now.
        to: String,
        /// How many switched.
        partitions: usize,
    },
    /// A warning was logged (see [`warnings`](crate::warnings)).
    Warning {
        /// Its kind, as the [`WARNING`](crate::metrics::families::WARNING) metric labels it.
        warning: &'static str,
        /// What the log says: the numbers and the setting that tunes it.
        text: String,
    },
}

impl Default for HostStats {
    fn default() -> Self {
        HostStats {
            rebalances: AtomicU64::new(0),
            rebalance_seconds: Histogram::of_durations(),
            assigned: AtomicU64::new(0),
            revoked: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            restore_seconds: Histogram::of_durations(),
            restored_bytes: AtomicU64::new(0),
            restore_predicted_us: AtomicU64::new(0),
            restore_actual_us: AtomicU64::new(0),
            warnings: Mutex::default(),
            events: Mutex::default(),
        }
    }
}

impl HostStats {
    /// Counts a rebalance that made `change` to `partitions` partitions in `took`.
    pub fn record_rebalance(&self, change: RebalanceChange, partitions: usize, took: Duration) {
        self.rebalances.fetch_add(1, Ordering::Relaxed);
        self.rebalance_seconds.observe(took.as_secs_f64());
        let counter = match change {
            RebalanceChange::Assigned => &self.assigned,
            RebalanceChange::Revoked => &self.revoked,
            RebalanceChange::Lost => &self.lost,
        };
        counter.fetch_add(partitions as u64, Ordering::Relaxed);
        self.record(HostEventKind::Rebalance { change, partitions, took_s: took.as_secs_f64() });
    }

    /// Counts a restore that fetched `bytes` in `took`, predicted to take `predicted`.
    pub fn record_restore(&self, bytes: u64, took: Duration, predicted: Duration) {
        self.restore_seconds.observe(took.as_secs_f64());
        self.restored_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.restore_predicted_us.store(crate::micros(predicted), Ordering::Relaxed);
        self.restore_actual_us.store(crate::micros(took), Ordering::Relaxed);
        self.record(HostEventKind::Restore { bytes, took_s: took.as_secs_f64(), predicted_s: predicted.as_secs_f64() });
    }

    /// Records that a partition switched from version `from` to `to`: one more partition
    /// of the latest event when that is the same switch (a deploy switches every
    /// partition within moments), else a new event.
    pub fn record_switch(&self, from: &str, to: &str) {
        let mut events = lock(&self.events);
        if let Some(HostEvent { what: HostEventKind::Switch { from: f, to: t, partitions }, .. }) = events.back_mut()
            && (f.as_str(), t.as_str()) == (from, to)
        {
            *partitions += 1;
            return;
        }
        drop(events);
        self.record(HostEventKind::Switch { from: from.to_string(), to: to.to_string(), partitions: 1 });
    }

    /// Records that warning `warning` was logged saying `text`.
    pub fn record_warning(&self, warning: &'static str, text: String) {
        self.record(HostEventKind::Warning { warning, text });
    }

    /// The latest events, oldest first.
    pub fn events(&self) -> Vec<HostEvent> {
        lock(&self.events).iter().cloned().collect()
    }

    fn record(&self, what: HostEventKind) {
        let mut events = lock(&self.events);
        if events.len() == EVENTS_KEPT {
            events.pop_front();
        }
        events.push_back(HostEvent { at_ms: now_ms(), what });
    }
}

/// User plus system CPU time of the whole process so far — every thread, RocksDB's
/// background work included — from `/proc/self/stat`, in clock ticks of 10 ms (Linux's
/// `USER_HZ`, 100 on every architecture it runs on); `None` where that is unreadable.
pub fn process_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The fields after the command name (which may hold spaces and parentheses) start
    // with the state, field 3; utime and stime are fields 14 and 15.
    let mut fields = stat[stat.rfind(')')? + 2..].split_whitespace().skip(11);
    let mut ticks = || fields.next()?.parse::<u64>().ok();
    Some(Duration::from_millis((ticks()? + ticks()?) * 10))
}

/// The most memory the process has held resident so far (`VmHWM` in
/// `/proc/self/status`); `None` where that is unreadable.
pub fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib = status.lines().find_map(|line| line.strip_prefix("VmHWM:"))?.trim().strip_suffix("kB")?;
    Some(kib.trim().parse::<u64>().ok()? << 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Dead letters are counted per version as they come, and a report adds the
    /// partitions' up by version.
    #[test]
    fn dead_letters_add_up_by_version_and_kind() {
        let (p0, p1) = (PartitionStats::new(0, 0, "v1"), PartitionStats::new(0, 0, "v1"));
        p0.count_dead("v1", DeadLetters { rejected: 1, trapped: 2, ..DeadLetters::default() });
        p0.count_dead("v2", DeadLetters { trapped: 1, null_key: 2, ..DeadLetters::default() });
        p0.count_dead("v2", DeadLetters::default());
        p1.count_dead("v2", DeadLetters { rejected: 1, refused: 3, ..DeadLetters::default() });
        assert_eq!(p0.dead_letters.load(Ordering::Relaxed), 6);
        let partitions = [p0.dead_by_version.lock().unwrap().clone(), p1.dead_by_version.lock().unwrap().clone()];
        let all = DeadLetters::by_version(&partitions);
        assert_eq!(all["v1"], DeadLetters { rejected: 1, trapped: 2, ..DeadLetters::default() });
        assert_eq!(all["v2"], DeadLetters { rejected: 1, trapped: 1, refused: 3, null_key: 2 });
        assert_eq!(
            all["v2"].to_string(),
            "1 rejected by the operator, 1 trapped or past a limit, 3 outputs refused by Kafka, 2 records without a key"
        );
    }

    /// The log keeps the latest events, and one deploy's switches are one event.
    #[test]
    fn events_keep_the_latest_and_a_deploy_is_one_event() {
        let host = HostStats::default();
        host.record_switch("v1", "v2");
        host.record_switch("v1", "v2");
        host.record_rebalance(RebalanceChange::Revoked, 2, Duration::from_millis(5));
        host.record_switch("v1", "v2");
        let kinds: Vec<HostEventKind> = host.events().into_iter().map(|e| e.what).collect();
        let switch = |partitions| HostEventKind::Switch { from: "v1".into(), to: "v2".into(), partitions };
        assert_eq!(kinds[0], switch(2), "two partitions in a row switching alike are one deploy");
        assert_eq!(kinds[2], switch(1), "a switch after another event is a new one");
        let json = serde_json::to_value(host.events()).unwrap();
        assert_eq!(json[1]["kind"], "rebalance");
        assert_eq!(json[1]["change"], "revoked");
        for n in 0..EVENTS_KEPT {
            host.record_warning("state skew", format!("warning {n}"));
        }
        let events = host.events();
        assert_eq!(events.len(), EVENTS_KEPT);
        assert_eq!(events[0].what, HostEventKind::Warning { warning: "state skew", text: "warning 0".into() });
    }

    #[test]
    fn skew_is_the_largest_over_the_lower_median() {
        assert_eq!(Skew::of([10, 40]).map(|s| s.ratio), Some(4.0), "of two, the larger over the smaller");
        assert_eq!(Skew::of([5, 10, 10, 100]).map(|s| (s.median, s.largest)), Some((10, 100)));
        assert_eq!(Skew::of([0, 0, 7]), None, "a median of 0 has no ratio");
        assert_eq!(Skew::of([]), None);
    }
}
