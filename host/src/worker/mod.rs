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
//! [`STATE_COMMITTED`]. The protocol (what is uncommitted, when a commit is due, the
//! order of its steps) is the `commit` room's; a [`PartitionWorker`] runs it, one
//! handler per event of a run: a batch, an idle moment, the end.
//!
//! Checkpoints happen between batches, right after a commit, so a snapshot always
//! holds whole batches and the offset committed with them.
//!
//! This module does not own where records come from (the [source](crate::source)),
//! how the operator runs (the [operator](crate::operator)), or which partitions run on
//! this host and when they start and stop ([`partitions`](crate::partitions)).

mod batch_times;
mod commit;
mod emitted;
pub(crate) mod events;
pub mod queue;
mod shadow;
#[cfg(test)]
pub(crate) mod tests;

pub use commit::{AFTER_SEND, BEFORE_SEND, Cadence, OUTPUTS_COMMITTED, STATE_COMMITTED, count_state_bytes};
pub use emitted::Emission;
pub use shadow::FAILURES_IN_A_ROW;

use crate::checkpoint::Checkpointer;
use crate::config::NullKeys;
use crate::lock;
use crate::operator::{Expiration, Operator, Outcome, Processed, Shadows};
use crate::record::{Origin, SourceRecord, Stop};
use crate::sink::{DeadLetterSink, PartitionOutputs, Sink};
use crate::stats::{HostStats, PartitionStats};
use anyhow::{Context, Result};
use batch_times::BatchTimes;
use commit::Uncommitted;
use emitted::Emitted;
use events::REPLAYED_WITH;
use shadow::Shadow;
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
const IDLE_TICK: Duration = Duration::from_millis(50);

/// A partition as its worker sees it through one run: what it works on and with.
pub struct Partition<'a> {
    /// The operator, bound to the partition's state.
    pub operator: &'a mut dyn Operator,
    /// Where the outputs and dead letters go.
    pub to: &'a Destinations,
    /// The partition's live counters.
    pub stats: &'a PartitionStats,
    /// The host's counters and warnings.
    pub host: &'a HostStats,
    /// Checkpoints the partition when one is due; `None` when checkpoints are off.
    pub checkpointer: Option<&'a mut Checkpointer>,
    /// How the worker is told to end.
    pub stop: &'a StopSignal,
    /// When it commits, and the batch time it warns at.
    pub cadence: Cadence,
    /// What becomes of records without a key.
    pub null_keys: NullKeys,
    /// Where its shadow comes from, if it may run one.
    pub shadows: Option<&'a dyn Shadows>,
}

/// A partition's worker through one run: it processes batches until the sender goes
/// away or its [`StopSignal`] says to end. After each batch it sends the batch's
/// outputs, as part of the partition's outputs, and writes its dead letters; it commits
/// the state writes with the next offset when its [`Cadence`] or a due checkpoint says
/// so, when no batch came for a moment, after a deploy switched the version, and at the
/// end (unless the partition was lost). After a commit the checkpointer checkpoints
/// when one is due; at the end (unless the partition was lost), a last checkpoint holds
/// the final state — its failure is an error when the source ended, a warning at a
/// handover. Records without a key go to the dead letters unseen by the operator unless
/// [`NullKeys`] says otherwise.
pub struct PartitionWorker<'a> {
    p: Partition<'a>,
    /// What a batch emits; its buffers are reused from batch to batch.
    emitted: Emitted,
    times: BatchTimes,
    uncommitted: Uncommitted,
    /// What is left of a batch that ended early at a per-batch bound: the next batch.
    rest: Option<Vec<SourceRecord>>,
    /// The shadow beside the operator, while one runs.
    shadow: Shadow,
    /// When the last batch was done (or the worker started): how long the partition has
    /// been idle.
    last_batch: Instant,
    /// Entered for the version the operator runs (see [`version_span`]).
    _in_version: tracing::span::EnteredSpan,
}

impl<'a> PartitionWorker<'a> {
    /// A worker of `p`, its outputs since its start sent as part of `outputs`.
    pub fn new(p: Partition<'a>, outputs: PartitionOutputs) -> Self {
        let times = BatchTimes::new(p.cadence.slow_batch);
        let _in_version = version_span(p.operator.version());
        let (emitted, uncommitted) = (Emitted::default(), Uncommitted::new(outputs));
        let shadow = Shadow::default();
        PartitionWorker { p, emitted, times, uncommitted, rest: None, shadow, last_batch: Instant::now(), _in_version }
    }

    /// Processes what `batches` hands over until it goes away or the worker is told to
    /// end, then ends as it was told (see [`PartitionWorker`]).
    pub fn run(mut self, batches: queue::QueueReceiver) -> Result<()> {
        loop {
            let received = match self.rest.take() {
                Some(rest) => Ok(rest),
                None => batches.recv_timeout(IDLE_TICK),
            };
            match received {
                Ok(_) if matches!(self.p.stop.get(), Some(Stop::Handover | Stop::Lost)) => break,
                Ok(batch) => {
                    self.on_batch(batch)?;
                    self.last_batch = Instant::now();
                }
                Err(RecvTimeoutError::Timeout) => self.on_idle()?,
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        self.finish()
    }

    /// An idle partition expires what its clock made due — in processing time the wall
    /// clock, in event time with `[ttl] idle_timeout` one gone on with the wall clock —
    /// commits what it processed, still follows deploys and gets its due
    /// checkpoint of what it last committed.
    fn on_idle(&mut self) -> Result<()> {
        let p = &mut self.p;
        let idle_for = self.last_batch.elapsed();
        if p.operator.state().tick(idle_for) {
            let next = self.uncommitted.next_offset.unwrap_or(p.stats.committed_offset.load(Ordering::Relaxed));
            let (clock, began) = (p.operator.state().clock(), Instant::now());
            let expirations = p.operator.expire(next)?;
            self.shadow.expire(next, (clock, began.elapsed()), &expirations, &p.stats.shadow);
            let partition = p.operator.state().store().partition();
            for expiration in expirations {
                self.gather(expiration.origin(partition), expiration)?;
            }
            let p = &mut self.p;
            self.emitted.send(p.stats, &mut self.uncommitted.outputs)?;
        }
        self.commit()?;
        let p = &mut self.p;
        // An idle partition's size catches up with its last writes.
        self.uncommitted.size_state(p.operator.state().store(), p.stats);
        let at = p.stats.committed_offset.load(Ordering::Relaxed);
        self.between_batches(at)?;
        self.checkpoint_if_due()
    }

    /// Between two batches, before the record at `offset`: follows a deploy (a switch
    /// commits what the old version processed) and starts or stops the shadow as the
    /// host's says, from the state just committed.
    fn between_batches(&mut self, offset: u64) -> Result<()> {
        let switched = self.follow_deploys(offset)?;
        let shadow_changed = self.p.shadows.is_some_and(|shadows| self.shadow.changed(shadows));
        if switched || shadow_changed {
            self.commit()?;
        }
        if let Some(shadows) = self.p.shadows.filter(|_| shadow_changed) {
            self.shadow.follow(shadows, self.p.operator, &self.p.stats.shadow);
        }
        Ok(())
    }

    /// Commits what waits ([`Uncommitted::commit`]), counting first what the shadow
    /// staged otherwise, which then starts over from the committed state.
    fn commit(&mut self) -> Result<()> {
        let p = &mut self.p;
        let differing = self.shadow.differing_writes(p.operator);
        if self.uncommitted.commit(p.operator, p.stats, p.to)? {
            self.shadow.after_commit(p.operator, differing, &p.stats.shadow);
        }
        Ok(())
    }

    /// Processes `batch` (or the part of it before a per-batch bound, the rest coming
    /// next), sends what it emitted, and commits if due.
    fn on_batch(&mut self, mut batch: Vec<SourceRecord>) -> Result<()> {
        let Some(first) = batch.first() else { return Ok(()) };
        let first = first.offset;
        // Between two batches: the whole batch runs on one version.
        self.between_batches(first)?;
        // A replay switches versions where the first run of its records did.
        if let Some(cut) = self.p.operator.next_switch(first)
            && let Some(at) = batch.iter().position(|record| record.offset >= cut)
        {
            self.rest = Some(batch.split_off(at));
        }
        let started = Instant::now();
        // A processing-time clock reads the wall clock once a batch: the batch's expiries
        // are decided at one time, the shadow's at the same.
        self.p.operator.state().tick(Duration::ZERO);
        let clock = self.p.operator.state().clock();
        let cpu = self.shadow.is_running().then(crate::probes::thread_cpu);
        let processed = process_batch(self.p.operator, &batch, self.p.null_keys)?;
        if let Some(cpu) = cpu {
            let live_cpu = crate::probes::thread_cpu().saturating_sub(cpu);
            let done = &batch[..processed.outcomes.len()];
            let stats = &self.p.stats.shadow;
            let took = (started.elapsed(), live_cpu);
            self.shadow.process(self.p.operator, (done, &processed, clock), took, self.p.null_keys, stats);
        }
        let outcomes = processed.outcomes.len();
        // The offset the next commit stores: past the last record processed, or, when
        // the batch ended in the expiries before a record, that record's (the clock and
        // the expiries so far commit with it, and the next batch goes on with the rest).
        let next_offset = batch.get(outcomes).map_or(batch[batch.len() - 1].offset + 1, |next| next.offset);
        let partition = batch[0].partition;
        if outcomes < batch.len() {
            // Ended at a per-batch bound: the rest is the next batch, before what a
            // replay's switch cut off.
            let mut unprocessed = batch.split_off(outcomes);
            unprocessed.extend(self.rest.take().into_iter().flatten());
            self.rest = Some(unprocessed);
        }
        self.emit(partition, &batch, processed)?;
        self.send()?;
        let p = &mut self.p;
        p.stats.processed.fetch_add(batch.len() as u64, Ordering::Relaxed);
        self.uncommitted.add(next_offset, batch.len());
        let checkpoint_due = p.checkpointer.as_deref().is_some_and(Checkpointer::is_due);
        if checkpoint_due || self.uncommitted.due(&p.cadence, p.operator.state().dirty_bytes()) {
            self.commit()?;
            self.checkpoint_if_due()?;
        }
        self.times.record(started.elapsed(), partition, self.p.stats, self.p.host);
        Ok(())
    }

    /// Gathers what the records of `batch` (its prefix `processed` has outcomes of) and
    /// the expirations among them emitted: each expiry's outputs before those of the
    /// record it preceded.
    fn emit(&mut self, partition: u32, batch: &[SourceRecord], processed: Processed) -> Result<()> {
        let Processed { outcomes, expirations, by_paired } = processed;
        let (mut expirations, mut by_paired) = (expirations.into_iter().peekable(), by_paired.into_iter());
        for (record, outcome) in batch.iter().zip(outcomes) {
            while let Some(expiration) = expirations.next_if(|e| e.offset <= record.offset) {
                self.gather(expiration.origin(partition), expiration)?;
            }
            let paired = by_paired.next().unwrap_or(false);
            self.gather_outcome(Origin::of(record), (&record.key, &record.value), outcome, paired)?;
        }
        // Those before the record the batch ended at.
        for expiration in expirations {
            self.gather(expiration.origin(partition), expiration)?;
        }
        Ok(())
    }

    /// Gathers what became of `expiration`, at `origin`.
    fn gather(&mut self, origin: Origin, expiration: Expiration) -> Result<()> {
        let entry = &expiration.entry;
        self.gather_outcome(origin, (&entry.key, &entry.value), expiration.outcome, expiration.by_paired)
    }

    /// Gathers `outcome` of the input (or expired entry) with `key` and `value` at
    /// `origin`, under the build that gave it — the paired one (a canary) when
    /// `by_paired` — what another build gave before is sent first.
    fn gather_outcome(
        &mut self,
        origin: Origin,
        (key, value): (&[u8], &[u8]),
        outcome: Outcome,
        by_paired: bool,
    ) -> Result<()> {
        let operator = &*self.p.operator;
        let version = match by_paired {
            true => operator.paired_version().expect("an outcome of the paired version while one is"),
            false => operator.version(),
        };
        if self.emitted.takes(version) {
            self.emitted.of_version(version);
        } else {
            // Another version's outputs go first; a switch of versions is rare.
            let version = version.to_string();
            self.send()?;
            self.emitted.of_version(&version);
        }
        self.emitted.outcome(origin, key, value, outcome);
        Ok(())
    }

    /// Sends what the batch emitted. Outputs first, then state: the commit makes them
    /// final first, so a crash in between replays the records since the last commit but
    /// never leaves state ahead of what was emitted.
    fn send(&mut self) -> Result<()> {
        let p = &mut self.p;
        crate::kill_point(BEFORE_SEND);
        self.emitted.send(p.stats, &mut self.uncommitted.outputs)?;
        crate::kill_point(AFTER_SEND);
        // A delivery already refused stops the partition now rather than at the commit.
        self.uncommitted.outputs.check().with_context(|| format!("sending outputs to {}", p.to.sink.name()))
    }

    /// Checkpoints the partition if a checkpoint is due (checkpoints are taken right
    /// after a commit, or while idle, of what was last committed). Fails, ending the
    /// run as a lost partition's (nothing more committed, no last checkpoint), if the
    /// checkpoint store says another host claimed the partition: the group gave it to
    /// that host without this one hearing of it.
    fn checkpoint_if_due(&mut self) -> Result<()> {
        match self.p.checkpointer.as_deref_mut() {
            Some(checkpointer) => checkpointer.checkpoint_if_due(self.p.operator.state().store(), self.p.stats),
            None => Ok(()),
        }
    }

    /// Switches the operator to a newly deployed version if there is one, from offset
    /// `offset` on, and tells the checkpointer, the partition's and the host's counters
    /// and the log; returns whether it switched.
    fn follow_deploys(&mut self, offset: u64) -> Result<bool> {
        let p = &mut self.p;
        let Some(switch) = p.operator.follow_deploys(offset)? else { return Ok(false) };
        let partition = p.operator.state().store().partition();
        if let Some(reason) = switch.refused {
            tracing::error!(
                partition,
                "version {} failed to start here; {} keeps running: {reason}",
                switch.to,
                switch.from
            );
            *lock(&p.stats.refused) = Some((switch.to, reason));
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
        if let Some(checkpointer) = p.checkpointer.as_deref_mut() {
            checkpointer.set_operator(&switch.to);
        }
        p.stats.switches.fetch_add(1, Ordering::Relaxed);
        p.stats.last_switch_stall_us.store(stall_us, Ordering::Relaxed);
        p.host.record_switch(&switch.from, &switch.to);
        *lock(&p.stats.version) = switch.to;
        self._in_version = version_span(p.operator.version());
        Ok(true)
    }

    /// Ends the run as the worker was told: commits what is uncommitted and takes a
    /// last checkpoint, unless the partition was lost.
    fn finish(mut self) -> Result<()> {
        let p = &mut self.p;
        // A lost partition is another host's already: what it processed since its last
        // commit is left to the new owner, whose start fenced its transactions anyway.
        if !matches!(p.stop.get(), Some(Stop::Lost)) {
            self.commit()?;
        }
        let p = &mut self.p;
        match (p.checkpointer.as_deref_mut(), p.stop.get()) {
            (Some(_), Some(Stop::Lost)) | (None, _) => Ok(()),
            // A handover's last checkpoint only spares the next owner some replay: if it
            // fails (the store is down, or another host already wrote that checkpoint
            // because the group briefly gave the partition to two members), the next
            // owner restores an older one and reads more. Logged, not fatal.
            (Some(checkpointer), Some(Stop::Handover)) => {
                if let Err(e) = checkpointer.finish(p.operator.state().store(), p.stats) {
                    tracing::warn!("last checkpoint before the handover failed: {e:#}");
                }
                Ok(())
            }
            (Some(checkpointer), _) => checkpointer.finish(p.operator.state().store(), p.stats),
        }
    }
}

/// Runs `batch` through `operator` on the clock its state holds (the caller ticked it).
/// An error stops the worker; what it processed since the last commit is never
/// committed. A keyless record the job refuses (`null_keys`) ends the batch before it,
/// and a batch starting with such records has them refused and ends after them.
fn process_batch(operator: &mut dyn Operator, batch: &[SourceRecord], null_keys: NullKeys) -> Result<Processed> {
    let refused = |record: &SourceRecord| null_keys == NullKeys::DeadLetter && record.has_null_key();
    Ok(match batch.iter().position(refused) {
        // A keyless record the job refused met no version: the one in force names it.
        Some(0) => {
            Processed::from_outcomes(batch.iter().take_while(|r| refused(r)).map(|_| Outcome::NullKey).collect())
        }
        Some(keyed) => operator.process_batch(&batch[..keyed])?,
        None => operator.process_batch(batch)?,
    })
}

/// A span entered until the worker switches versions, so that every event the worker
/// logs carries the operator version it runs (`operator{operator_version=…}` in the
/// text log, `span.operator_version` in the JSON one). A root span: the next version's
/// is not the previous one's child.
fn version_span(version: &str) -> tracing::span::EnteredSpan {
    tracing::info_span!(parent: None, "operator", operator_version = %version).entered()
}
