//! A partition's live counters ([`PartitionStats`]), what they reached at its stop
//! ([`Totals`]), and its dead letters by operator version and kind ([`DeadLetters`]).

use super::Histogram;
use crate::lock;
use crate::probes::now_ms;
use crate::record::DeadLetterKind;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

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
    /// How many recent batches `batch_p99_us` is taken over; under 100 it is their
    /// maximum, which one stall of the machine sets.
    pub batch_times_counted: AtomicU64,
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
    /// What its shadow found, while one runs.
    pub shadow: super::ShadowStats,
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
            batch_times_counted: AtomicU64::new(0),
            batch_seconds: Histogram::of_durations(),
            checkpoint_at_ms: AtomicU64::new(now_ms()),
            lag: AtomicI64::new(-1),
            switches: AtomicU64::new(0),
            last_switch_stall_us: AtomicU64::new(0),
            version: Mutex::new(version.to_string()),
            refused: Mutex::new(None),
            shadow: super::ShadowStats::default(),
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
    /// Records the operator found late for their windows.
    pub late: u64,
}

impl DeadLetters {
    /// Counts one more of `kind`.
    pub fn count(&mut self, kind: DeadLetterKind) {
        match kind {
            DeadLetterKind::Rejected => self.rejected += 1,
            DeadLetterKind::Trapped => self.trapped += 1,
            DeadLetterKind::Refused => self.refused += 1,
            DeadLetterKind::NullKey => self.null_key += 1,
            DeadLetterKind::Late => self.late += 1,
        }
    }

    /// All of them.
    pub fn total(&self) -> u64 {
        self.by_kind().iter().map(|(_, count)| count).sum()
    }

    /// Each kind's count.
    pub fn by_kind(&self) -> [(DeadLetterKind, u64); 5] {
        [
            (DeadLetterKind::Rejected, self.rejected),
            (DeadLetterKind::Trapped, self.trapped),
            (DeadLetterKind::Refused, self.refused),
            (DeadLetterKind::NullKey, self.null_key),
            (DeadLetterKind::Late, self.late),
        ]
    }

    /// Adds `other`'s counts.
    pub fn add(&mut self, other: &DeadLetters) {
        self.rejected += other.rejected;
        self.trapped += other.trapped;
        self.refused += other.refused;
        self.null_key += other.null_key;
        self.late += other.late;
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
             without a key, {} late for their windows",
            self.rejected, self.trapped, self.refused, self.null_key, self.late
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
        p1.count_dead("v2", DeadLetters { rejected: 1, refused: 3, late: 4, ..DeadLetters::default() });
        assert_eq!(p0.dead_letters.load(Ordering::Relaxed), 6);
        let partitions = [p0.dead_by_version.lock().unwrap().clone(), p1.dead_by_version.lock().unwrap().clone()];
        let all = DeadLetters::by_version(&partitions);
        assert_eq!(all["v1"], DeadLetters { rejected: 1, trapped: 2, ..DeadLetters::default() });
        assert_eq!(all["v2"], DeadLetters { rejected: 1, trapped: 1, refused: 3, null_key: 2, late: 4 });
        assert_eq!(
            all["v2"].to_string(),
            "1 rejected by the operator, 1 trapped or past a limit, 3 outputs refused by Kafka, 2 records without a \
             key, 4 late for their windows"
        );
    }
}
