//! The commit protocol of a partition's worker: what it processed since its last
//! commit ([`Uncommitted`]), when that is due ([`Cadence`]), and the order a commit
//! takes — the outputs sent since the last commit made final (acknowledged, or their
//! Kafka transaction committed) and the line files synced, then the state written since
//! committed with the next offset in one RocksDB write batch — so that state is never
//! ahead of the outputs that came of it.
//!
//! The steps of that protocol are [kill points](crate::kill_point) a test can crash
//! the host at: [`BEFORE_SEND`] and [`AFTER_SEND`] around a batch's send,
//! [`OUTPUTS_COMMITTED`] and [`STATE_COMMITTED`] within a commit.
//!
//! This module does not decide what a batch emits or when the worker commits besides
//! its cadence (a deploy's switch, an idle moment, the end: see the
//! [worker](super::PartitionWorker)).

use super::Destinations;
use crate::config::StateConfig;
use crate::operator::Operator;
use crate::sink::PartitionOutputs;
use crate::state::PartitionStore;
use crate::stats::PartitionStats;
use anyhow::{Context, Result};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Kill point: a batch processed, its outputs not sent yet.
pub const BEFORE_SEND: &str = "before-send";
/// Kill point: a batch's outputs sent (queued, or produced in the open transaction).
pub const AFTER_SEND: &str = "after-send";
/// Kill point: a commit's outputs final (acknowledged, or their transaction committed),
/// its state not committed yet.
pub const OUTPUTS_COMMITTED: &str = "outputs-committed";
/// Kill point: a commit's state committed with its offset.
pub const STATE_COMMITTED: &str = "state-committed";

/// When a worker commits its partition's state, and which batch time it warns at.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cadence {
    /// Commit once this long has passed since the last commit...
    pub commit_interval: Duration,
    /// ... or this many records were processed since ...
    pub commit_every: usize,
    /// ... or this many bytes of state were written since (each entry's last value).
    pub commit_dirty_bytes: usize,
    /// A batch taking this long or longer is warned about (see
    /// `BatchTimes`).
    pub slow_batch: Option<Duration>,
}

impl Cadence {
    /// The cadence `[state]` configures, warning at `slow_batch`.
    pub fn of(state: &StateConfig, slow_batch: Option<Duration>) -> Self {
        Cadence {
            commit_interval: state.commit_interval,
            commit_every: state.commit_every,
            commit_dirty_bytes: state.commit_dirty_mib << 20,
            slow_batch,
        }
    }
}

/// What a worker processed since its last commit.
pub(super) struct Uncommitted {
    /// The offset the next commit stores; `None`: nothing to commit.
    pub(super) next_offset: Option<u64>,
    records: usize,
    /// When the first of them was processed.
    since: Option<Instant>,
    /// Their outputs, until the commit makes them final.
    pub(super) outputs: PartitionOutputs,
    /// When the partition's state bytes were last counted (the worker's start counts
    /// them first).
    sized: Instant,
}

/// How often a worker counts its partition's state bytes: RocksDB's size properties
/// are read under its database lock, too dear for every commit.
const SIZE_STATE_EVERY: Duration = Duration::from_secs(1);

impl Uncommitted {
    pub(super) fn new(outputs: PartitionOutputs) -> Self {
        Uncommitted { next_offset: None, records: 0, since: None, outputs, sized: Instant::now() }
    }

    /// Counts the state bytes of `store` into `stats` if [`SIZE_STATE_EVERY`] has passed
    /// since the last count.
    pub(super) fn size_state(&mut self, store: &PartitionStore, stats: &PartitionStats) {
        if self.sized.elapsed() >= SIZE_STATE_EVERY {
            self.sized = Instant::now();
            count_state_bytes(store, stats);
        }
    }

    pub(super) fn add(&mut self, next_offset: u64, records: usize) {
        self.next_offset = Some(next_offset);
        self.records += records;
        self.since.get_or_insert_with(Instant::now);
    }

    /// Whether `cadence` asks for a commit, with `dirty_bytes` of state written.
    pub(super) fn due(&self, cadence: &Cadence, dirty_bytes: usize) -> bool {
        self.records >= cadence.commit_every
            || dirty_bytes >= cadence.commit_dirty_bytes
            || self.since.is_some_and(|since| since.elapsed() >= cadence.commit_interval)
    }

    /// Commits the operator's state with the next offset, if anything waits (records,
    /// or expiries of an idle partition), once the outputs sent since the last commit
    /// are final, and publishes the committed offset, entry count and clock; returns
    /// whether anything waited. A delivery or transaction that failed is the error, and
    /// the state is not committed.
    pub(super) fn commit(
        &mut self,
        operator: &mut dyn Operator,
        stats: &PartitionStats,
        to: &Destinations,
    ) -> Result<bool> {
        let state = operator.state();
        let next_offset = match self.next_offset {
            Some(next_offset) => next_offset,
            None if state.has_writes() => stats.committed_offset.load(Ordering::Relaxed),
            None => return Ok(false),
        };
        // A replay must route what this commit counts as this run did.
        operator.switches_recorded(next_offset)?;
        let state = operator.state();
        self.outputs.commit(next_offset).with_context(|| format!("sending outputs to {}", to.sink.name()))?;
        // Lines written to files reach the disk before the state that covers them: after
        // a power loss, state is never ahead of its outputs.
        to.sink.sync()?;
        to.dead_letters.sync()?;
        crate::kill_point(OUTPUTS_COMMITTED);
        state.commit(next_offset)?;
        crate::kill_point(STATE_COMMITTED);
        stats.committed_offset.store(next_offset, Ordering::Relaxed);
        stats.entries.store(state.entries(), Ordering::Relaxed);
        self.size_state(state.store(), stats);
        let (hits, misses) = state.cache().hits_and_misses();
        stats.cache_hits.store(hits, Ordering::Relaxed);
        stats.cache_misses.store(misses, Ordering::Relaxed);
        stats.expired.store(state.expired(), Ordering::Relaxed);
        stats.backlog.store(state.backlog(), Ordering::Relaxed);
        stats.clock_ms.store(state.clock().now_ms(), Ordering::Relaxed);
        stats.clock_ignored.store(state.clock().ignored, Ordering::Relaxed);
        (self.next_offset, self.records, self.since) = (None, 0, None);
        Ok(true)
    }
}

/// Sets `stats`' state bytes to what `store` takes in RocksDB. A size for the metrics
/// only: a failed read leaves the last one.
pub fn count_state_bytes(store: &PartitionStore, stats: &PartitionStats) {
    if let (Ok(tables), Ok(memtables)) = (store.live_data_bytes(), store.memtable_bytes()) {
        stats.state_bytes.store(tables + memtables, Ordering::Relaxed);
    }
}
