//! The partitions this host owns, each with a running worker.
//!
//! A partition is started when the source assigns it: on a thread of its own (the
//! steps are the `start` room's), it is claimed in the checkpoint store, its state
//! restored (local recovery or the store), opened, bound to an operator instance and a
//! checkpointer, and handed to a new worker thread. A store that fails to answer is
//! tried again with backoff, the partition waiting, rather than failing the host. The
//! source learns from [`Workers::started`] when it may feed the partition, and at
//! which offset. Partitions that stay keep running throughout: only the ones that move
//! wait for a restore.
//!
//! A partition is stopped as [`Stop`] says: drained at the end of the source, handed
//! over (batch in hand finished, last checkpoint uploaded) when revoked, or dropped
//! without a checkpoint when already lost to another host. Partitions stopped together
//! stop at once, each told before any is waited for, so a revocation takes as long as
//! its slowest handover, not their sum; and a partition still starting is given up
//! without waiting for its restore (which goes on in the background, into a directory
//! no worker opens, until it ends). A start given up never takes over the partition's
//! Kafka transactions afterwards — that would fence the partition's new owner — and
//! one whose worker was already running when it was given up is stopped before it
//! takes a record. One partition has one start or worker at a time on this host: a
//! partition started again waits until the last one has ended. A partition whose
//! transactions another producer took over (fenced) stops alone and starts again after
//! a backoff, while the source still assigns it here. A partition whose checkpoint found
//! it claimed by another host in the checkpoint store ([`ClaimedElsewhere`]: the group
//! gave it to that host without this one hearing of it) stops as lost, paused; if the
//! source still assigns it here after [`WorkerSetup::take_back_after`], this host claims
//! it back and starts it again from the store. Each run of a partition ends in a
//! [`PartitionReport`].
//!
//! This module does not decide which partitions this host owns (the source does) and
//! does not read records.

use super::events::{CLAIMED_ELSEWHERE, RESTARTING, STOPPED, STOPPED_ALONE};
use super::occupancy::Occupancy;
use super::report::PartitionReport;
use super::setup::WorkerSetup;
use super::standby::{Followed, Follower, Following, StandbySettings};
use super::start::{Begun, Running, Start, StartGivenUp};
use crate::backoff::Backoff;
use crate::checkpoint::store::ClaimedElsewhere;
use crate::lock;
use crate::operator::OperatorStopped;
use crate::operator::versions::switches::{SwitchLogUnreadable, SwitchUnrecorded};
use crate::record::{SourceRecord, Stop};
use crate::sink::transaction::{CommitFailed, Fenced};
use crate::source::Started;
use crate::stats::{HostStats, LiveStats};
use anyhow::{Context, Result, anyhow, bail};
use std::collections::{BTreeMap, BTreeSet};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, Sender, TrySendError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Whether `error`, which ended a partition's worker, is one of its commit: another
/// producer took its transactions over ([`Fenced`]), its transaction failed to commit
/// ([`CommitFailed`]) or its switch of versions could not be recorded
/// ([`SwitchUnrecorded`]). The partition's alone, not the host's: nothing since its
/// last commit committed, and a start again, here or on its next owner, goes on from it.
fn ended_by_its_commit(error: &anyhow::Error) -> bool {
    error.is::<Fenced>() || error.is::<CommitFailed>() || error.is::<SwitchUnrecorded>()
}

/// A partition's start, as its starting thread reports it: which start it was, and the
/// worker it started.
type StartResult = (u32, Arc<Start>, Result<Running>);

/// A fenced partition starting again: how long it has been retrying, and why it
/// stopped, the error of the run if it never runs again.
struct Restart {
    backoff: Backoff,
    error: anyhow::Error,
}

/// The partitions this host owns and their workers.
pub struct Workers {
    setup: Arc<WorkerSetup>,
    running: BTreeMap<u32, Running>,
    /// Partitions being started (restored), each with its start.
    starting: BTreeMap<u32, Arc<Start>>,
    /// Which partitions a start or a worker holds.
    occupancy: Arc<Occupancy>,
    started_tx: Sender<StartResult>,
    started_rx: Receiver<StartResult>,
    /// Partitions that started and were not yet returned by [`Workers::started`].
    arrived: Vec<Started>,
    /// The first start that failed, not yet returned.
    failure: Option<anyhow::Error>,
    /// Partitions whose worker failed, stopped alone, with why; until started again.
    failed: BTreeMap<u32, anyhow::Error>,
    /// Of `failed` and the fenced ones starting again, those not yet returned by
    /// [`Workers::failed`].
    newly_failed: Vec<u32>,
    /// Fenced partitions starting again, or running again since.
    restarts: BTreeMap<u32, Restart>,
    /// Partitions another host claimed in the checkpoint store while they ran here,
    /// stopped for good (no [`WorkerSetup::take_back_after`]): held until the source
    /// revokes them or assigns them here again.
    claimed_elsewhere: BTreeSet<u32>,
    /// Workers of starts given up after they started: stopped, never fed, ending.
    retiring: Vec<JoinHandle<Result<PartitionReport>>>,
    live: LiveStats,
    host: Arc<HostStats>,
    reports: Vec<PartitionReport>,
    /// The thread following standby copies, if this host keeps any.
    following: Option<Following>,
}

impl Workers {
    /// No partitions yet; each starts with `setup`.
    pub fn new(setup: WorkerSetup) -> Self {
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        Workers {
            setup: Arc::new(setup),
            running: BTreeMap::new(),
            starting: BTreeMap::new(),
            occupancy: Arc::default(),
            started_tx,
            started_rx,
            arrived: Vec::new(),
            failure: None,
            failed: BTreeMap::new(),
            newly_failed: Vec::new(),
            restarts: BTreeMap::new(),
            claimed_elsewhere: BTreeSet::new(),
            retiring: Vec::new(),
            live: LiveStats::default(),
            host: Arc::default(),
            reports: Vec::new(),
            following: None,
        }
    }

    /// Brings standby copies of every partition up to date — before the source joins
    /// its group: call it first — then keeps them so on a thread of its own (see
    /// `standby`). Needs checkpoints on; a no-op otherwise.
    pub fn follow_standbys(&mut self, settings: StandbySettings, followed: Followed) -> Result<()> {
        if self.setup.checkpoints.is_some() {
            let follower =
                Follower::new(self.setup.clone(), self.occupancy.clone(), self.host.clone(), settings, followed);
            self.following = Some(follower.warm_up_and_follow()?);
        }
        Ok(())
    }

    /// Starts `partitions` in the background: claims them in the checkpoint store,
    /// restores their state (local recovery or a checkpoint) and starts their workers;
    /// [`started`](Workers::started) returns each once it runs, at the offset its state
    /// holds. While the store fails to answer, the start is tried again with backoff for
    /// up to `[checkpoint] restore_retry_timeout`, its partitions waiting (a Kafka source
    /// keeps them paused and this host in its group); a partition stopped meanwhile is
    /// given up.
    pub fn start(&mut self, partitions: &[u32]) -> Result<()> {
        for p in partitions {
            self.failed.remove(p);
            self.claimed_elsewhere.remove(p);
        }
        self.launch(partitions, Duration::ZERO, true)
    }

    /// Starts `partitions` on a thread of their own after `delay`, claiming them in
    /// the checkpoint store if `claim` says so (a partition started again after it was
    /// fenced keeps the claim it had: another host may hold it by now, rightly).
    fn launch(&mut self, partitions: &[u32], delay: Duration, claim: bool) -> Result<()> {
        let assigned = Instant::now();
        let starts: BTreeMap<u32, Arc<Start>> = partitions.iter().map(|&p| (p, Arc::default())).collect();
        self.starting.extend(starts.iter().map(|(&p, start)| (p, start.clone())));
        let (setup, host, occupancy, tx) =
            (self.setup.clone(), self.host.clone(), self.occupancy.clone(), self.started_tx.clone());
        std::thread::Builder::new().name("sluice-restore".into()).spawn(move || {
            let mut sent = BTreeSet::new();
            let finished = std::panic::catch_unwind(AssertUnwindSafe(|| {
                let mut report = |partition: u32, result: Result<Running>| {
                    tx.send((partition, starts[&partition].clone(), result)).ok();
                    sent.insert(partition);
                };
                let begun = Begun { setup: &setup, host: &host, occupancy: &occupancy, assigned, claim };
                begun.start(&starts, delay, &mut report);
            }));
            // Whoever waits for these partitions must hear of them, whatever happened.
            if finished.is_err() {
                for (&p, start) in starts.iter().filter(|(p, _)| !sent.contains(p)) {
                    tx.send((p, start.clone(), Err(anyhow!("the restore thread panicked")))).ok();
                }
            }
        })?;
        Ok(())
    }

    /// The partitions whose start completed since the last call, each running from
    /// its `offset`. A start that failed is an error (once).
    pub fn started(&mut self) -> Result<Vec<Started>> {
        while let Ok((partition, start, result)) = self.started_rx.try_recv() {
            self.register(partition, start, result);
        }
        self.take_started()
    }

    /// The partitions whose worker failed since the last call. A running worker ends
    /// only when stopped, so one that ended by itself failed. If the operator stopped it
    /// ([`OperatorStopped`]), its partition stops alone — its error logged and kept for
    /// the end of the run, its state as its last commit left it — and the others go on.
    /// If another producer took over its transactions ([`Fenced`]), it stops alone too,
    /// nothing since its last commit committed, and starts again after a backoff (1, 2,
    /// 4… s; [`started`](Workers::started) returns it once it runs), for up to
    /// `[checkpoint] restore_retry_timeout` of runs that committed nothing, then stays
    /// stopped as one the operator stopped; so does one whose transaction failed to
    /// commit otherwise ([`CommitFailed`]: a broker lost, the coordinator moving) and
    /// one whose switch of versions could not be recorded ([`SwitchUnrecorded`]). If another host claimed it in the checkpoint
    /// store ([`ClaimedElsewhere`]), it was lost without a rebalance saying so: it stops,
    /// nothing since its last commit committed, counted as lost and no failure of this
    /// host, and is claimed back and started again after
    /// [`WorkerSetup::take_back_after`] unless the source moves it first. Any other
    /// failure is the host's, and the error.
    pub fn failed(&mut self) -> Result<Vec<u32>> {
        self.reap_retired();
        let ended: Vec<u32> = self.running.iter().filter(|(_, r)| r.thread.is_finished()).map(|(p, _)| *p).collect();
        for partition in ended {
            let running = self.running.remove(&partition).expect("listed above");
            lock(&self.live).remove(&partition);
            let progressed = running.stats.committed_offset.load(Ordering::Relaxed) > running.started.offset;
            let error = match running.thread.join() {
                Ok(Err(e)) => e,
                Ok(Ok(_)) => anyhow!("its worker ended unasked"),
                Err(_) => anyhow!("its worker panicked"),
            };
            let error = error.context(format!("partition {partition} stopped"));
            if ended_by_its_commit(&error) {
                self.restart(partition, error, progressed)?;
            } else if error.is::<ClaimedElsewhere>() {
                self.host.lost.fetch_add(1, Ordering::Relaxed);
                match self.setup.take_back_after {
                    Some(wait) => {
                        tracing::warn!(
                            partition,
                            "{error:#}; {CLAIMED_ELSEWHERE}; if the group still assigns it here in {}s \
                             (session.timeout.ms), this host claims it back",
                            wait.as_secs()
                        );
                        self.launch(&[partition], wait, true)?;
                    }
                    None => {
                        tracing::warn!(partition, "{error:#}; {CLAIMED_ELSEWHERE}; it stays stopped here");
                        self.claimed_elsewhere.insert(partition);
                    }
                }
            } else if error.is::<OperatorStopped>() {
                tracing::error!(partition, "{error:#}; {STOPPED_ALONE}");
                self.failed.insert(partition, error);
            } else {
                return Err(error);
            }
            self.newly_failed.push(partition);
        }
        Ok(std::mem::take(&mut self.newly_failed))
    }

    /// Starts fenced (or failed to commit) `partition` again after the next wait of its backoff — a new one
    /// if the run that failed had committed since it started — or, past its timeout,
    /// keeps it stopped alone with `error`.
    fn restart(&mut self, partition: u32, error: anyhow::Error, progressed: bool) -> Result<()> {
        let mut backoff = match self.restarts.remove(&partition) {
            Some(restart) if !progressed => restart.backoff,
            _ => Backoff::new(self.setup.retry_timeout),
        };
        match backoff.next_wait() {
            Some(wait) => {
                tracing::warn!(
                    partition,
                    "{error:#}; {RESTARTING} {}s while the group assigns it here (its next owner's start, or this \
                     one's, will fence the other), for up to {}s of tries ([checkpoint] restore_retry_timeout); \
                     {STOPPED_ALONE}",
                    wait.as_secs(),
                    backoff.timeout().as_secs()
                );
                self.launch(&[partition], wait, false)?;
                self.restarts.insert(partition, Restart { backoff, error });
            }
            None => {
                let error = error.context(format!(
                    "failing for {:.0}s of tries ([checkpoint] restore_retry_timeout)",
                    backoff.elapsed().as_secs_f64()
                ));
                tracing::error!(partition, "{error:#}; {STOPPED_ALONE}");
                self.failed.insert(partition, error);
            }
        }
        Ok(())
    }

    /// Joins the workers of given-up starts that have ended.
    fn reap_retired(&mut self) {
        let (ended, going) = std::mem::take(&mut self.retiring).into_iter().partition(|t| t.is_finished());
        self.retiring = going;
        for thread in ended {
            if let Ok(Err(e)) = thread.join() {
                tracing::warn!("a worker stopped before it took a record failed as it stopped: {e:#}");
            }
        }
    }

    /// Waits until no partition is starting; returns those that started, or the first
    /// start that failed.
    pub fn wait_started(&mut self) -> Result<Vec<Started>> {
        while !self.starting.is_empty() {
            self.receive_start();
        }
        self.take_started()
    }

    fn take_started(&mut self) -> Result<Vec<Started>> {
        match self.failure.take() {
            Some(e) => Err(e),
            None => Ok(std::mem::take(&mut self.arrived)),
        }
    }

    /// Waits for the next start to complete and registers it.
    fn receive_start(&mut self) {
        // `self` holds a sender, so this ends only when a restore thread reports, and
        // every restore thread reports every one of its partitions.
        let (partition, start, result) = self.started_rx.recv().expect("Workers holds a sender");
        self.register(partition, start, result);
    }

    /// Records a completed start: running, or its failure kept for the caller; a start
    /// given up meanwhile has its worker stopped.
    fn register(&mut self, partition: u32, start: Arc<Start>, result: Result<Running>) {
        if !self.starting.get(&partition).is_some_and(|current| Arc::ptr_eq(current, &start)) {
            if let Ok(running) = result {
                self.retire(partition, running);
            }
            return;
        }
        self.starting.remove(&partition);
        match result {
            Ok(running) => {
                self.arrived.push(running.started.clone());
                lock(&self.live).insert(partition, running.stats.clone());
                self.running.insert(partition, running);
            }
            Err(e) if e.is::<StartGivenUp>() => {}
            // Its own records only: the partition stops alone, the others go on.
            Err(e) if e.is::<SwitchLogUnreadable>() => {
                let e = e.context(format!("starting partition {partition}"));
                tracing::error!(partition, "{e:#}; {STOPPED_ALONE}");
                self.failed.insert(partition, e);
                self.newly_failed.push(partition);
            }
            Err(e) => {
                let e = e.context(format!("starting partition {partition}"));
                tracing::error!("{e:#}");
                self.failure.get_or_insert(e);
            }
        }
    }

    /// Stops the worker of a start given up after it took over its partition: it never
    /// took a record, so it commits nothing and takes no checkpoint ([`Stop::Lost`]).
    /// Not waited for: it releases its partition when it ends.
    fn retire(&mut self, partition: u32, running: Running) {
        tracing::info!(partition, "its start completed after it was stopped here: its worker stops before any record");
        running.stop.set(Stop::Lost);
        drop(running.sender);
        self.retiring.push(running.thread);
    }

    /// Whether `partition` is starting or running here.
    pub fn owns(&self, partition: u32) -> bool {
        self.running.contains_key(&partition) || self.starting.contains_key(&partition)
    }

    /// Whether any partition is starting or running here, or held after another host
    /// claimed it (the source has yet to revoke it).
    pub fn owns_any(&self) -> bool {
        !self.running.is_empty() || !self.starting.is_empty() || !self.claimed_elsewhere.is_empty()
    }

    /// Whether any partition is still starting.
    pub fn any_starting(&self) -> bool {
        !self.starting.is_empty()
    }

    /// The running partitions.
    pub fn running(&self) -> Vec<u32> {
        self.running.keys().copied().collect()
    }

    /// The offset `partition`'s state holds, if it runs here.
    pub fn committed_offset(&self, partition: u32) -> Option<u64> {
        self.running.get(&partition).map(|r| r.stats.committed_offset.load(Ordering::Relaxed))
    }

    /// Records how far `partition`'s state is behind `high_watermark`, the end of its
    /// partition as the broker last reported it (ignored when it does not run here).
    pub fn record_lag(&self, partition: u32, high_watermark: u64) {
        if let Some(running) = self.running.get(&partition) {
            let lag = high_watermark.saturating_sub(running.stats.committed_offset.load(Ordering::Relaxed));
            running.stats.lag.store(lag as i64, Ordering::Relaxed);
        }
    }

    /// Hands `batch` to `partition`'s worker unless its queue is full, in which case
    /// the batch comes back. A worker that failed meanwhile drops it: the next
    /// [`failed`](Workers::failed) tells.
    pub fn try_send(&mut self, partition: u32, batch: Vec<SourceRecord>) -> Result<Option<Vec<SourceRecord>>> {
        match self.worker(partition)?.sender.try_send(batch) {
            Ok(()) | Err(TrySendError::Disconnected(_)) => Ok(None),
            Err(TrySendError::Full(batch)) => Ok(Some(batch)),
        }
    }

    /// Hands `batch` to `partition`'s worker, waiting while its queue is full; as
    /// [`try_send`](Workers::try_send), a worker that failed drops it.
    pub fn send(&mut self, partition: u32, batch: Vec<SourceRecord>) -> Result<()> {
        // A send fails only when the worker has ended, which `failed` tells.
        let _ = self.worker(partition)?.sender.send(batch);
        Ok(())
    }

    fn worker(&self, partition: u32) -> Result<&Running> {
        self.running.get(&partition).ok_or_else(|| anyhow!("partition {partition} is not running here"))
    }

    /// Stops `partitions` as `how` says, all at once, and waits until the running ones
    /// have: each worker is told before any is waited for, and a start in progress is
    /// given up without waiting for it (if it is taking over its partition's
    /// transactions, until that returns). Returns the offset each partition that ran
    /// here committed with its state, and the first failure; every partition is stopped
    /// even when one fails. A worker that failed in its commit (fenced, its transaction or switch unrecorded,
    /// or claimed elsewhere) is no failure: the partition leaves as it would have
    /// restarted, from its last commit.
    pub fn stop(&mut self, partitions: &[u32], how: Stop) -> (Vec<(u32, u64)>, Result<()>) {
        let began = Instant::now();
        let mut stopping = Vec::new();
        for &partition in partitions {
            self.arrived.retain(|s| s.partition != partition);
            self.restarts.remove(&partition);
            self.claimed_elsewhere.remove(&partition);
            // One that failed has nothing to hand over: its state is as its last commit left it.
            if let Some(Running { sender, stop, thread, .. }) = self.running.remove(&partition) {
                stop.set(how);
                drop(sender);
                stopping.push((partition, thread));
            }
        }
        for partition in partitions {
            if let Some(start) = self.starting.remove(partition) {
                start.give_up();
            }
        }
        let (mut offsets, mut result) = (Vec::new(), Ok(()));
        for (partition, thread) in stopping {
            let report = thread.join().map_err(|_| anyhow!("the worker of partition {partition} panicked"));
            lock(&self.live).remove(&partition);
            match report.and_then(|r| r.with_context(|| format!("partition {partition} stopped"))) {
                Ok(report) => {
                    tracing::info!(
                        partition,
                        "{STOPPED} ({how:?}) in {:.0} ms at offset {}; {} records processed since it started here",
                        began.elapsed().as_secs_f64() * 1e3,
                        report.totals.committed_offset,
                        report.totals.processed
                    );
                    offsets.push((partition, report.totals.committed_offset));
                    self.reports.push(report);
                }
                // Its own failure, which it leaves with: its next owner starts from its last commit.
                Err(e) if ended_by_its_commit(&e) || e.is::<ClaimedElsewhere>() => tracing::warn!(
                    partition,
                    "{e:#}; {STOPPED} ({how:?}) in {:.0} ms, nothing since its last commit committed",
                    began.elapsed().as_secs_f64() * 1e3
                ),
                Err(e) => result = result.and(Err(e)),
            }
        }
        (offsets, result)
    }

    /// Stops `partition` alone for `error`, found outside its worker: it hands over
    /// what it has (nothing, if it never ran), is logged and kept with `error` for the
    /// end of the run, and [`failed`](Self::failed) returns it next, as a partition the
    /// operator stopped.
    pub fn stop_alone(&mut self, partition: u32, error: anyhow::Error) -> Result<()> {
        self.stop(&[partition], Stop::Handover).1?;
        let error = error.context(format!("partition {partition} stopped"));
        tracing::error!(partition, "{error:#}; {STOPPED_ALONE}");
        self.failed.insert(partition, error);
        self.newly_failed.push(partition);
        Ok(())
    }

    /// Stops every partition as `how` says, all at once (a start in progress is given
    /// up), and returns the offset each one's state holds at the end. Every partition
    /// is stopped even when one fails; the first failure is returned (a start that
    /// failed first), or else, if partitions stopped alone during the run (a fenced one
    /// not running again included), why each did.
    pub fn stop_all(&mut self, how: Stop) -> Result<Vec<(u32, u64)>> {
        let mut result = self.started().and_then(|_| self.failed()).map(drop);
        for (partition, restart) in std::mem::take(&mut self.restarts) {
            if !self.running.contains_key(&partition) {
                self.failed.insert(partition, restart.error);
            }
        }
        let partitions: Vec<u32> = self.running.keys().chain(self.starting.keys()).copied().collect();
        let (offsets, stopped) = self.stop(&partitions, how);
        for thread in self.retiring.drain(..) {
            thread.join().ok();
        }
        result = result.and(stopped);
        result?;
        if !self.failed.is_empty() {
            let failures: Vec<String> = self.failed.values().map(|e| format!("{e:#}")).collect();
            bail!("{}", failures.join("\n"));
        }
        Ok(offsets)
    }

    /// The running partitions' live counters.
    pub fn live(&self) -> LiveStats {
        self.live.clone()
    }

    /// The host's counters of rebalances and restores.
    pub fn host_stats(&self) -> Arc<HostStats> {
        self.host.clone()
    }

    /// The reports of every stopped run, in the order they stopped.
    pub fn reports(&self) -> &[PartitionReport] {
        &self.reports
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::NullKeys;
    use crate::objects::Objects;
    use crate::operator::registry::Registry;
    use crate::operator::versions::switches::SwitchLog;
    use crate::operator::wasm::Limits;
    use crate::state::StateDir;
    use crate::worker::tests::{FakeVersions, NEVER, destinations, records};

    /// A fake operator stands behind [`Workers`] as a component would: a partition
    /// started, fed and drained runs the version it instantiated and commits all it
    /// processed.
    #[test]
    fn workers_run_the_operator_their_setup_instantiates() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let runtime = crate::objects::runtime()?;
        let registry = Registry::new(Objects::open(&dir.path().join("versions").to_string_lossy())?, "fake")?;
        let mut workers = Workers::new(WorkerSetup {
            state: StateDir::open(&dir.path().join("state"), 1)?,
            operator: Box::new(FakeVersions),
            switches: SwitchLog::new(
                registry,
                (Limits::default(), Vec::new()),
                runtime.handle().clone(),
                None,
                std::time::Duration::from_secs(5),
            ),
            checkpoints: None,
            destinations: destinations(dir.path())?,
            runtime: runtime.handle().clone(),
            queued_batches: 1,
            queued_bytes: usize::MAX,
            cadence: NEVER,
            cache_bytes: 1 << 20,
            timers_bytes: usize::MAX,
            ttl: Default::default(),
            null_keys: NullKeys::default(),
            shadows: None,
            retry_timeout: Duration::from_secs(60),
            take_back_after: None,
            stopping: Arc::default(),
        });
        workers.start(&[0])?;
        assert_eq!(workers.wait_started()?.len(), 1);
        workers.send(0, records(0..3))?;
        assert_eq!(workers.stop_all(Stop::Drain)?, [(0, 3)]);
        assert_eq!((workers.reports()[0].version.as_str(), workers.reports()[0].totals.processed), ("v1", 3));
        Ok(())
    }
}
