//! Partition workers: the only code that touches a partition's state.
//!
//! A worker takes batches of its partition's records, runs each through the operator
//! inside a record scope of the partition's [`Transaction`](crate::state::Transaction),
//! sends the batch's outputs and writes its dead letters, and commits the state writes
//! since the last commit together with the next offset in one RocksDB write batch when
//! its [`Cadence`] says so. It owns that ordering — outputs acknowledged before the
//! commit that covers them, commits between batches — the partition's live counters
//! and the tail of its batch processing times.
//!
//! Batches are pipelined: a worker does not wait for a batch's outputs to be
//! acknowledged (by a Kafka broker) before it processes the next; the batches since
//! the last commit are all in flight at once, their writes visible to later records
//! through the uncommitted transaction. A commit first makes their outputs final —
//! waits for every acknowledgement, or commits the partition's Kafka transaction — so a
//! delivery that failed stops the partition before anything after its last commit is
//! committed, and a crash replays those batches. Whatever ends a run of batches — a
//! deploy switching the version, a handover, the end of the source — commits, so it
//! drains what is in flight first.
//!
//! The steps of that protocol are [kill points](crate::kill_point) a test can crash
//! the host at: [`BEFORE_SEND`], [`AFTER_SEND`], [`OUTPUTS_COMMITTED`],
//! [`STATE_COMMITTED`].
//!
//! Checkpoints happen between batches, right after a commit, so a snapshot always
//! holds whole batches and the offset committed with them.
//!
//! [`Workers`] owns the life of each partition on this host: started (restored,
//! opened, instantiated) when the source assigns it, stopped when it is revoked or the
//! source ends. The [`Router`] stands between a source and the workers: it implements
//! the source's [`Partitions`](crate::source::Partitions), batching records for each
//! partition. This module does not own where records come from (the
//! [source](crate::source)) or how the operator runs (the [operator](crate::operator)).

mod lifecycle;
pub mod queue;
mod router;

pub use lifecycle::{
    Checkpointing, PartitionReport, RESTARTING, STOPPED, STOPPED_ALONE, STORE_RETRY, WorkerSetup, Workers,
};
pub use router::{DispatchReport, OFFSETS_JUMP, Router};

use crate::checkpoint::Checkpointer;
use crate::config::{NullKeys, StateConfig};
use crate::lock;
use crate::log_rate::{self, Admitted, LogRate};
use crate::operator::{Expiration, Operator, Outcome, Output, Processed};
use crate::record::{Cause, DeadLetter, DeadLetterKind, Origin, SourceRecord, Stop};
use crate::sink::{DeadLetterSink, PartitionOutputs, Sink};
use crate::state::PartitionStore;
use crate::stats::{DeadLetters, HostStats, PartitionStats};
use anyhow::{Context, Result};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

/// Where workers send what they produce, shared by all of them.
pub struct Destinations {
    /// The job's sink.
    pub sink: Sink,
    /// Where dead letters go.
    pub dead_letters: DeadLetterSink,
}

/// Tells a running worker how to end; set once, by whoever stops it.
#[derive(Debug, Default)]
pub struct StopSignal {
    how: AtomicU8,
    /// Whether the host is stopping (SIGTERM): a partition draining what its source
    /// gave it hands over instead, so a stop never waits for a long drain.
    host_stopping: Option<Arc<AtomicBool>>,
}

impl StopSignal {
    /// A signal that also says [`Stop::Handover`] to a draining worker once
    /// `host_stopping` is set.
    pub fn following(host_stopping: Arc<AtomicBool>) -> Self {
        StopSignal { how: AtomicU8::new(0), host_stopping: Some(host_stopping) }
    }

    /// Asks the worker to end as `how` says.
    pub fn set(&self, how: Stop) {
        let code = match how {
            Stop::Drain => 1,
            Stop::Handover => 2,
            Stop::Lost => 3,
        };
        self.how.store(code, Ordering::Release);
    }

    /// How the worker was asked to end, if it was.
    pub fn get(&self) -> Option<Stop> {
        match self.how.load(Ordering::Acquire) {
            1 if self.host_stopping.as_ref().is_some_and(|stopping| stopping.load(Ordering::Relaxed)) => {
                Some(Stop::Handover)
            }
            1 => Some(Stop::Drain),
            2 => Some(Stop::Handover),
            3 => Some(Stop::Lost),
            _ => None,
        }
    }
}

/// How long a worker waits for a batch before it looks whether a checkpoint is due or
/// a new operator version was deployed (the longest an idle partition takes to switch).
/// Logged when a partition's batch times near the consumer's poll timeout: `batch
/// processing time p99 … reaches 1000 ms, half of max.poll.interval.ms: …`.
pub const SLOW_BATCH: &str = "half of max.poll.interval.ms";

const IDLE_TICK: Duration = Duration::from_millis(50);

/// Kill point: a batch processed, its outputs not sent yet.
pub const BEFORE_SEND: &str = "before-send";
/// Kill point: a batch's outputs sent (queued, or produced in the open transaction).
pub const AFTER_SEND: &str = "after-send";
/// Kill point: a commit's outputs final (acknowledged, or their transaction committed),
/// its state not committed yet.
pub const OUTPUTS_COMMITTED: &str = "outputs-committed";
/// Kill point: a commit's state committed with its offset.
pub const STATE_COMMITTED: &str = "state-committed";

/// Names, in the host's events, the warning of batch times near the poll timeout.
pub const SLOW_BATCHES: &str = "slow batches";

/// Batches whose processing times make up the published tail.
const BATCH_TIMES: usize = 1000;

/// The recent batch processing times of one worker, and the warning when their tail
/// nears the limit a revocation can wait.
struct BatchTimes {
    recent: VecDeque<Duration>,
    published: Instant,
    /// Warn when p99 or max reaches this: a revocation waits for the batch in hand, and
    /// Kafka evicts a member whose rebalance takes longer than `max.poll.interval.ms`.
    warn_at: Option<Duration>,
    warned: Option<Instant>,
}

impl BatchTimes {
    /// How often the tail is published (and checked against `warn_at`).
    const PUBLISH_EVERY: Duration = Duration::from_secs(1);
    /// The least time between two warnings of one worker.
    const WARN_EVERY: Duration = Duration::from_secs(30);

    fn new(warn_at: Option<Duration>) -> Self {
        BatchTimes { recent: VecDeque::with_capacity(BATCH_TIMES), published: Instant::now(), warn_at, warned: None }
    }

    fn record(&mut self, took: Duration, partition: u32, stats: &PartitionStats, host: &HostStats) {
        stats.batch_seconds.observe(took.as_secs_f64());
        if self.recent.len() == BATCH_TIMES {
            self.recent.pop_front();
        }
        self.recent.push_back(took);
        if self.published.elapsed() < Self::PUBLISH_EVERY {
            return;
        }
        self.published = Instant::now();
        let mut sorted: Vec<Duration> = self.recent.iter().copied().collect();
        sorted.sort_unstable();
        let (p99, max) = (sorted[sorted.len() * 99 / 100], sorted[sorted.len() - 1]);
        stats.batch_p99_us.store(crate::micros(p99), Ordering::Relaxed);
        stats.batch_max_us.store(crate::micros(max), Ordering::Relaxed);
        if let Some(limit) = self.warn_at
            && (p99 >= limit || max >= limit)
            && self.warned.is_none_or(|at| at.elapsed() >= Self::WARN_EVERY)
        {
            self.warned = Some(Instant::now());
            let warning = format!(
                "partition {partition}: batch processing time p99 {:.0} ms, max {:.0} ms reaches {:.0} ms, \
                 {SLOW_BATCH}: a rebalance waits for the batch in hand, and a member whose rebalance outlasts \
                 max.poll.interval.ms is evicted. Lower [state] batch_records, speed up the operator, or raise \
                 max.poll.interval.ms",
                p99.as_secs_f64() * 1e3,
                max.as_secs_f64() * 1e3,
                limit.as_secs_f64() * 1e3
            );
            tracing::warn!(partition, "{warning}");
            host.record_warning(SLOW_BATCHES, warning);
        }
    }
}

/// When a worker commits its partition's state, and which batch time it warns at.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cadence {
    /// Commit once this long has passed since the last commit...
    pub commit_interval: Duration,
    /// ... or this many records were processed since ...
    pub commit_every: usize,
    /// ... or this many bytes of state were written since (each entry's last value).
    pub commit_dirty_bytes: usize,
    /// A batch taking this long or longer is warned about (see [`BatchTimes`]).
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

/// Logged with a switch a replay makes: `switched from … to … at offset 1500 (the
/// version that first processed these records)`.
pub const REPLAYED_WITH: &str = "the version that first processed these records";

/// The reason a dead letter of a record without a key gives.
pub const NULL_KEY_REFUSED: &str = "the record has no key, and keyed state would put it with every other keyless record \
     of its partition; [source] null_keys = \"operator\" gives such records to the operator instead";

/// Processes batches from `batches` until the sender goes away or `stop` says to end.
/// After each batch it sends the batch's outputs, as part of the partition's
/// `outputs`, and writes its dead letters; it commits the state writes with the next
/// offset when `cadence` or a due checkpoint says so, when no batch came for a moment,
/// after a deploy switched the version, and at the end (unless the partition was lost).
/// After a commit `checkpointer` checkpoints when one is due; at the end (unless the partition
/// was lost), a last checkpoint holds the final state — its failure is an error when
/// the source ended, a warning at a handover. Records without a key go to the dead
/// letters unseen by the operator unless `null_keys` says otherwise.
#[allow(clippy::too_many_arguments)]
pub fn run(
    operator: &mut dyn Operator,
    batches: queue::QueueReceiver,
    to: &Destinations,
    outputs: PartitionOutputs,
    stats: &PartitionStats,
    host: &HostStats,
    mut checkpointer: Option<&mut Checkpointer>,
    stop: &StopSignal,
    cadence: Cadence,
    null_keys: NullKeys,
) -> Result<()> {
    // Its buffers are reused from batch to batch.
    let mut emitted = Emitted::default();
    let mut times = BatchTimes::new(cadence.slow_batch);
    let mut uncommitted = Uncommitted::new(outputs);
    // What is left of a batch that ended early at a per-batch bound: the next batch.
    let mut rest: Option<Vec<SourceRecord>> = None;
    let mut _in_version = version_span(operator.version());
    loop {
        let received = match rest.take() {
            Some(rest) => Ok(rest),
            None => batches.recv_timeout(IDLE_TICK),
        };
        let mut batch = match received {
            Ok(batch) => batch,
            // An idle partition expires what its processing-time clock (the wall
            // clock) made due, commits what it processed, still follows deploys and
            // gets its due checkpoint of what it last committed.
            Err(RecvTimeoutError::Timeout) => {
                if operator.state().tick() {
                    let next = uncommitted.next_offset.unwrap_or(stats.committed_offset.load(Ordering::Relaxed));
                    let expirations = operator.expire(next)?;
                    let partition = operator.state().store().partition();
                    emitted.expirations(partition, expirations);
                    emitted.send(operator.version(), stats, &mut uncommitted.outputs)?;
                }
                uncommitted.commit(operator, stats, to)?;
                // An idle partition's size catches up with its last writes.
                uncommitted.size_state(operator.state().store(), stats);
                let at = stats.committed_offset.load(Ordering::Relaxed);
                if follow_deploys(operator, checkpointer.as_deref_mut(), stats, host, at)? {
                    _in_version = version_span(operator.version());
                }
                if let Some(checkpointer) = checkpointer.as_deref_mut() {
                    checkpointer.checkpoint_if_due(operator.state().store(), stats);
                }
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => break,
        };
        if matches!(stop.get(), Some(Stop::Handover | Stop::Lost)) {
            break;
        }
        let Some(first) = batch.first() else { continue };
        // Between two batches: the whole batch runs on one version, and a switch
        // commits what the old version processed.
        if follow_deploys(operator, checkpointer.as_deref_mut(), stats, host, first.offset)? {
            _in_version = version_span(operator.version());
            uncommitted.commit(operator, stats, to)?;
        }
        // A replay switches versions where the first run of its records did.
        if let Some(cut) = operator.next_switch(first.offset)
            && let Some(at) = batch.iter().position(|record| record.offset >= cut)
        {
            rest = Some(batch.split_off(at));
        }
        let started = Instant::now();
        // A processing-time clock reads the wall clock once a batch: the batch's
        // expiries are decided at one time.
        operator.state().tick();
        // An error stops the worker; what it processed since the last commit is never
        // committed. A keyless record the job refuses ends the batch before it, and a
        // batch starting with such records has them refused and ends after them.
        let refused = |record: &SourceRecord| null_keys == NullKeys::DeadLetter && record.has_null_key();
        let Processed { outcomes, expirations } = match batch.iter().position(refused) {
            Some(0) => Processed {
                outcomes: batch.iter().take_while(|r| refused(r)).map(|_| Outcome::NullKey).collect(),
                expirations: Vec::new(),
            },
            Some(keyed) => operator.process_batch(&batch[..keyed])?,
            None => operator.process_batch(&batch)?,
        };
        // The offset the next commit stores: past the last record processed, or, when
        // the batch ended in the expiries before a record, that record's (the clock and
        // the expiries so far commit with it, and the next batch goes on with the rest).
        let next_offset = batch.get(outcomes.len()).map_or(batch[batch.len() - 1].offset + 1, |next| next.offset);
        let partition = batch[0].partition;
        if outcomes.len() < batch.len() {
            // Ended at a per-batch bound: the rest is the next batch, before what a
            // replay's switch cut off.
            let mut unprocessed = batch.split_off(outcomes.len());
            unprocessed.extend(rest.take().into_iter().flatten());
            rest = Some(unprocessed);
        }
        let version = operator.version();
        // Each expiry's outputs come before those of the record it preceded.
        let mut expirations = expirations.into_iter().peekable();
        for (record, outcome) in batch.iter().zip(outcomes) {
            let before = std::iter::from_fn(|| expirations.next_if(|e| e.offset <= record.offset));
            emitted.expirations(partition, before);
            emitted.outcome(Origin::of(record), &record.key, &record.value, outcome);
        }
        // Those before the record the batch ended at.
        emitted.expirations(partition, expirations);
        // Outputs first, then state: the commit makes them final first, so a crash in
        // between replays the records since the last commit but never leaves state
        // ahead of what was emitted.
        crate::kill_point(BEFORE_SEND);
        emitted.send(version, stats, &mut uncommitted.outputs)?;
        crate::kill_point(AFTER_SEND);
        // A delivery already refused stops the partition now rather than at the commit.
        uncommitted.outputs.check().with_context(|| format!("sending outputs to {}", to.sink.name()))?;
        stats.processed.fetch_add(batch.len() as u64, Ordering::Relaxed);
        uncommitted.add(next_offset, batch.len());
        let checkpoint_due = checkpointer.as_deref().is_some_and(Checkpointer::is_due);
        if checkpoint_due || uncommitted.due(&cadence, operator.state().dirty_bytes()) {
            uncommitted.commit(operator, stats, to)?;
            if let Some(checkpointer) = checkpointer.as_deref_mut() {
                checkpointer.checkpoint_if_due(operator.state().store(), stats);
            }
        }
        times.record(started.elapsed(), partition, stats, host);
    }
    // A lost partition is another host's already: what it processed since its last
    // commit is left to the new owner, whose start fenced its transactions anyway.
    if !matches!(stop.get(), Some(Stop::Lost)) {
        uncommitted.commit(operator, stats, to)?;
    }
    match (checkpointer, stop.get()) {
        (Some(_), Some(Stop::Lost)) | (None, _) => Ok(()),
        // A handover's last checkpoint only spares the next owner some replay: if it
        // fails (the store is down, or another host already wrote that checkpoint because
        // the group briefly gave the partition to two members), the next owner restores
        // an older one and reads more. Logged, not fatal.
        (Some(checkpointer), Some(Stop::Handover)) => {
            if let Err(e) = checkpointer.finish(operator.state().store(), stats) {
                tracing::warn!("last checkpoint before the handover failed: {e:#}");
            }
            Ok(())
        }
        (Some(checkpointer), _) => checkpointer.finish(operator.state().store(), stats),
    }
}

/// What a batch (or an idle partition's expiries) emits, gathered to be sent at
/// once: outputs, and dead letters.
struct Emitted {
    outputs: Vec<(Origin, Output)>,
    dead: Vec<DeadLetter>,
    /// The line sinks' buffer.
    lines: Vec<u8>,
    /// The partition's warnings of trapped records: every one has its dead letter, so
    /// past a few a second they are only counted.
    traps: LogRate,
}

/// Trapped records a partition warns about per second (the rest are counted).
const TRAP_WARNINGS_PER_S: u64 = 10;

impl Default for Emitted {
    fn default() -> Self {
        let traps = LogRate::new(TRAP_WARNINGS_PER_S, u64::MAX);
        Emitted { outputs: Vec::new(), dead: Vec::new(), lines: Vec::new(), traps }
    }
}

/// What an input (or expired entry) gives: its outputs, or its dead letter.
pub enum Emission {
    /// The operator emitted these.
    Outputs(Vec<Output>),
    /// It failed, or was refused, into the dead letters.
    DeadLetter(DeadLetter),
}

impl Emission {
    /// What `outcome` of the input (or expired entry) with `key` and `value` at `origin`
    /// gives.
    pub fn of(origin: Origin, key: &[u8], value: &[u8], outcome: Outcome) -> Self {
        let (kind, reason, attempts) = match outcome {
            Outcome::Emitted(outputs) => return Emission::Outputs(outputs),
            Outcome::Rejected(reason) => (DeadLetterKind::Rejected, reason, None),
            Outcome::NullKey => (DeadLetterKind::NullKey, NULL_KEY_REFUSED.to_string(), None),
            Outcome::Trapped { reason, attempts } => (DeadLetterKind::Trapped, reason, Some(attempts)),
        };
        let (key, value) = (key.to_vec(), value.to_vec());
        Emission::DeadLetter(DeadLetter { origin, kind, key, value, topic: None, reason, attempts })
    }
}

impl Emitted {
    /// Adds what became of the input (or expired entry) with `key` and `value` at
    /// `origin`; a trap is logged, within [`TRAP_WARNINGS_PER_S`].
    fn outcome(&mut self, origin: Origin, key: &[u8], value: &[u8], outcome: Outcome) {
        if let Outcome::Trapped { reason, attempts } = &outcome {
            let (partition, offset) = (origin.partition, origin.offset);
            match self.traps.admit(0) {
                Admitted::Yes { dropped } => {
                    if dropped > 0 {
                        tracing::warn!(partition, "{dropped} more records trapped; their dead letters say why");
                    }
                    // The first line: the rest is wasmtime's account with the guest's
                    // backtrace, which the dead letter keeps.
                    let first_line = log_rate::one_line(reason.lines().next().unwrap_or_default()).into_owned();
                    tracing::warn!(partition, offset, cause = ?origin.cause, attempts, "operator trapped: {first_line}");
                }
                Admitted::No { .. } => {}
            }
        }
        match Emission::of(origin, key, value, outcome) {
            Emission::Outputs(outputs) => self.outputs.extend(outputs.into_iter().map(|o| (origin, o))),
            Emission::DeadLetter(dead) => self.dead.push(dead),
        }
    }

    /// Adds what became of `expirations` of `partition`.
    fn expirations(&mut self, partition: u32, expirations: impl IntoIterator<Item = Expiration>) {
        for Expiration { entry, offset, outcome } in expirations {
            let origin = Origin { partition, offset, cause: Cause::Expiry };
            self.outcome(origin, &entry.key, &entry.value, outcome);
        }
    }

    /// Sends the outputs, all of operator `version`, as part of the partition's
    /// `outputs`, then the dead letters (those of outputs Kafka refused included),
    /// counts them, and empties itself.
    fn send(&mut self, version: &str, stats: &PartitionStats, outputs: &mut PartitionOutputs) -> Result<()> {
        outputs.send(&self.outputs, version, &mut self.lines, &mut self.dead)?;
        stats.outputs.fetch_add(self.outputs.len() as u64, Ordering::Relaxed);
        outputs.send_dead_letters(&self.dead, version, &mut self.lines)?;
        let mut counts = DeadLetters::default();
        self.dead.iter().for_each(|dead| counts.count(dead.kind));
        stats.count_dead(version, counts);
        self.outputs.clear();
        self.dead.clear();
        Ok(())
    }
}

/// What a worker processed since its last commit.
struct Uncommitted {
    /// The offset the next commit stores; `None`: nothing to commit.
    next_offset: Option<u64>,
    records: usize,
    /// When the first of them was processed.
    since: Option<Instant>,
    /// Their outputs, until the commit makes them final.
    outputs: PartitionOutputs,
    /// When the partition's state bytes were last counted (the worker's start counts
    /// them first).
    sized: Instant,
}

/// How often a worker counts its partition's state bytes: RocksDB's size properties
/// are read under its database lock, too dear for every commit.
const SIZE_STATE_EVERY: Duration = Duration::from_secs(1);

impl Uncommitted {
    fn new(outputs: PartitionOutputs) -> Self {
        Uncommitted { next_offset: None, records: 0, since: None, outputs, sized: Instant::now() }
    }

    /// Counts the state bytes of `store` into `stats` if [`SIZE_STATE_EVERY`] has passed
    /// since the last count.
    fn size_state(&mut self, store: &PartitionStore, stats: &PartitionStats) {
        if self.sized.elapsed() >= SIZE_STATE_EVERY {
            self.sized = Instant::now();
            count_state_bytes(store, stats);
        }
    }

    fn add(&mut self, next_offset: u64, records: usize) {
        self.next_offset = Some(next_offset);
        self.records += records;
        self.since.get_or_insert_with(Instant::now);
    }

    /// Whether `cadence` asks for a commit, with `dirty_bytes` of state written.
    fn due(&self, cadence: &Cadence, dirty_bytes: usize) -> bool {
        self.records >= cadence.commit_every
            || dirty_bytes >= cadence.commit_dirty_bytes
            || self.since.is_some_and(|since| since.elapsed() >= cadence.commit_interval)
    }

    /// Commits the operator's state with the next offset, if anything waits (records,
    /// or expiries of an idle partition), once the outputs sent since the last commit
    /// are final, and publishes the committed offset, entry count and clock. A delivery
    /// or transaction that failed is the error, and the state is not committed.
    fn commit(&mut self, operator: &mut dyn Operator, stats: &PartitionStats, to: &Destinations) -> Result<()> {
        let state = operator.state();
        let next_offset = match self.next_offset {
            Some(next_offset) => next_offset,
            None if state.has_writes() => stats.committed_offset.load(Ordering::Relaxed),
            None => return Ok(()),
        };
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
        Ok(())
    }
}

/// Sets `stats`' state bytes to what `store` takes in RocksDB. A size for the metrics
/// only: a failed read leaves the last one.
pub(crate) fn count_state_bytes(store: &PartitionStore, stats: &PartitionStats) {
    if let (Ok(tables), Ok(memtables)) = (store.live_data_bytes(), store.memtable_bytes()) {
        stats.state_bytes.store(tables + memtables, Ordering::Relaxed);
    }
}

/// A span entered until the worker switches versions, so that every event the worker
/// logs carries the operator version it runs (`operator{operator_version=…}` in the
/// text log, `span.operator_version` in the JSON one). A root span: the next version's
/// is not the previous one's child.
fn version_span(version: &str) -> tracing::span::EnteredSpan {
    tracing::info_span!(parent: None, "operator", operator_version = %version).entered()
}

/// Switches `operator` to a newly deployed version if there is one, from offset
/// `offset` on, and tells the checkpointer, the partition's and the host's counters and
/// the log; returns whether it switched.
fn follow_deploys(
    operator: &mut dyn Operator,
    checkpointer: Option<&mut Checkpointer>,
    stats: &PartitionStats,
    host: &HostStats,
    offset: u64,
) -> Result<bool> {
    let Some(switch) = operator.follow_deploys(offset)? else { return Ok(false) };
    let partition = operator.state().store().partition();
    if let Some(reason) = switch.refused {
        tracing::error!(
            partition,
            "version {} failed to start here; {} keeps running: {reason}",
            switch.to,
            switch.from
        );
        *lock(&stats.refused) = Some((switch.to, reason));
        return Ok(false);
    }
    let stall_us = crate::micros(switch.stall);
    let why = if switch.replayed { format!(" ({REPLAYED_WITH})") } else { String::new() };
    tracing::info!(
        partition,
        "switched from {} to {} at offset {offset}{why}, standing still {stall_us} µs",
        switch.from,
        switch.to
    );
    if let Some(checkpointer) = checkpointer {
        checkpointer.set_operator(&switch.to);
    }
    stats.switches.fetch_add(1, Ordering::Relaxed);
    stats.last_switch_stall_us.store(stall_us, Ordering::Relaxed);
    host.record_switch(&switch.from, &switch.to);
    *lock(&stats.version) = switch.to;
    Ok(true)
}
