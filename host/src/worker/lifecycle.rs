//! The partitions this host owns, each with a running worker.
//!
//! A partition is started when the source assigns it: on a thread of its own, it is
//! claimed in the checkpoint store, its state restored (local recovery or the store),
//! opened, bound to an operator instance and a checkpointer, and handed to a new worker
//! thread. A store that fails to answer is tried again with backoff, the partition
//! waiting, rather than failing the host. The source learns from [`Workers::started`]
//! when it may feed the partition, and at which offset. Partitions that stay keep
//! running throughout: only the ones that move wait for a restore.
//!
//! A partition is stopped as [`Stop`] says: drained at the end of the source, handed
//! over (batch in hand finished, last checkpoint uploaded) when revoked, or dropped
//! without a checkpoint when already lost to another host. Each run of a partition
//! ends in a [`PartitionReport`].
//!
//! This module does not decide which partitions this host owns (the source does) and
//! does not read records.

use super::{Cadence, Destinations, StopSignal};
use crate::checkpoint::restore::{self, PartitionPlan};
use crate::checkpoint::store::{self, ClaimedElsewhere};
use crate::checkpoint::{CheckpointSettings, CheckpointStore, Checkpointer, RestoredFrom};
use crate::config::{NullKeys, TtlConfig};
use crate::lock;
use crate::operator::wasm::ActiveVersion;
use crate::operator::{Operator, OperatorStopped};
use crate::record::{SourceRecord, Stop};
use crate::source::Started;
use crate::state::{StateDir, Transaction};
use crate::stats::{DeadLetters, HostStats, LiveStats, PartitionStats, Totals};
use anyhow::{Context, Result, anyhow, bail};
use std::collections::{BTreeMap, BTreeSet};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::runtime::Handle;

/// Logged when a partition's worker stops: `stopped (Handover) in 12 ms at offset N; …`,
/// the reason being a [`Stop`].
pub const STOPPED: &str = "stopped";
/// Logged when a partition's worker failed and the partition stops alone: `partition 1
/// stopped: …; the other partitions go on`.
pub const STOPPED_ALONE: &str = "the other partitions go on";

/// Everything a partition needs to start, shared by all of them.
pub struct WorkerSetup {
    /// This host's state directory.
    pub state: StateDir,
    /// The operator version every partition runs, switched by deploys.
    pub operator: Arc<ActiveVersion>,
    /// Where restores come from and checkpoints go; `None` when checkpoints are off.
    pub checkpoints: Option<Checkpointing>,
    /// Where outputs and dead letters go.
    pub destinations: Destinations,
    /// The runtime restores and checkpoint uploads run on.
    pub runtime: Handle,
    /// Batches a worker may have queued before the source holds its partition back.
    pub queued_batches: usize,
    /// When workers commit, and the batch time they warn at.
    pub cadence: Cadence,
    /// The memory for committed state entries each partition keeps (see
    /// [`Cache`](crate::state::Cache)).
    pub cache_bytes: usize,
    /// When each partition's state expires.
    pub ttl: Arc<TtlConfig>,
    /// What becomes of records without a key.
    pub null_keys: NullKeys,
    /// Set when the host is stopping (SIGTERM): draining partitions hand over instead.
    pub stopping: Arc<AtomicBool>,
}

/// The checkpoint store and how partitions use it.
pub struct Checkpointing {
    /// The store shared by every host of the job.
    pub store: CheckpointStore,
    /// How often and how much.
    pub settings: CheckpointSettings,
    /// A restore predicted to take longer than this is warned about.
    pub restore_budget: Duration,
    /// How long a partition's start tries again while the store fails to answer.
    pub retry_timeout: Duration,
}

/// What one run of a partition on this host did, from its start to its stop.
#[derive(Debug, Clone, PartialEq)]
pub struct PartitionReport {
    /// The partition.
    pub partition: u32,
    /// The offset it resumed from (stored with its state).
    pub resumed_at: u64,
    /// What its counters reached.
    pub totals: Totals,
    /// Its dead letters by the operator version that processed their records, and by
    /// kind.
    pub dead_letters: BTreeMap<String, DeadLetters>,
    /// Distinct keys holding state at the end, counted only when the source ended
    /// ([`Stop::Drain`]): counting scans the partition, too slow for a handover.
    pub keys: Option<u64>,
    /// Where its state came from at start.
    pub restored_from: RestoredFrom,
    /// From the assignment to the running worker.
    pub start_took: Duration,
    /// The operator version it ran at the end.
    pub version: String,
    /// How it ended.
    pub stopped: Stop,
}

/// A partition's start, as its starting thread reports it.
type StartResult = (u32, Result<Running>);

struct Running {
    sender: SyncSender<Vec<SourceRecord>>,
    stop: Arc<StopSignal>,
    thread: JoinHandle<Result<PartitionReport>>,
    stats: Arc<PartitionStats>,
    started: Started,
}

/// The partitions this host owns and their workers.
pub struct Workers {
    setup: Arc<WorkerSetup>,
    running: BTreeMap<u32, Running>,
    /// Partitions being restored.
    starting: BTreeSet<u32>,
    /// Of `starting`, those stopped meanwhile: a start waiting to try the store again
    /// gives them up.
    given_up: Arc<Mutex<BTreeSet<u32>>>,
    started_tx: Sender<StartResult>,
    started_rx: Receiver<StartResult>,
    /// Partitions that started and were not yet returned by [`Workers::started`].
    arrived: Vec<Started>,
    /// The first start that failed, not yet returned.
    failure: Option<anyhow::Error>,
    /// Partitions whose worker failed, stopped alone, with why; until started again.
    failed: BTreeMap<u32, anyhow::Error>,
    /// Of `failed`, those not yet returned by [`Workers::failed`].
    newly_failed: Vec<u32>,
    live: LiveStats,
    host: Arc<HostStats>,
    reports: Vec<PartitionReport>,
}

impl Workers {
    /// No partitions yet; each starts with `setup`.
    pub fn new(setup: WorkerSetup) -> Self {
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        Workers {
            setup: Arc::new(setup),
            running: BTreeMap::new(),
            starting: BTreeSet::new(),
            given_up: Arc::default(),
            started_tx,
            started_rx,
            arrived: Vec::new(),
            failure: None,
            failed: BTreeMap::new(),
            newly_failed: Vec::new(),
            live: LiveStats::default(),
            host: Arc::default(),
            reports: Vec::new(),
        }
    }

    /// Starts `partitions` in the background: claims them in the checkpoint store,
    /// restores their state (local recovery or a checkpoint) and starts their workers;
    /// [`started`](Workers::started) returns each once it runs, at the offset its state
    /// holds. While the store fails to answer, the start is tried again with backoff for
    /// up to `[checkpoint] restore_retry_timeout`, its partitions waiting (a Kafka source
    /// keeps them paused and this host in its group); a partition stopped meanwhile is
    /// given up.
    pub fn start(&mut self, partitions: &[u32]) -> Result<()> {
        let setup = self.setup.clone();
        let now = Instant::now();
        self.starting.extend(partitions);
        for p in partitions {
            self.failed.remove(p);
            lock(&self.given_up).remove(p);
        }
        let (tx, given_up, mut partitions) = (self.started_tx.clone(), self.given_up.clone(), partitions.to_vec());
        let host = self.host.clone();
        std::thread::Builder::new().name("sluice-restore".into()).spawn(move || {
            let mut sent = Vec::new();
            let finished = std::panic::catch_unwind(AssertUnwindSafe(|| {
                let mut report = |partition: u32, result: Result<Running>| {
                    tx.send((partition, result)).ok();
                    sent.push(partition);
                };
                match restore_retrying(&setup, &host, &mut partitions, &given_up, &mut report) {
                    Ok((plans, restored)) => {
                        for (plan, restored) in plans.iter().zip(restored) {
                            report(plan.partition, spawn_worker(&setup, &host, plan, restored, now));
                        }
                    }
                    Err(e) => {
                        // A partition stopped meanwhile is no longer this host's to fail on.
                        let gone = lock(&given_up).clone();
                        for &p in &partitions {
                            let why = if gone.contains(&p) { StartGivenUp.into() } else { anyhow!("restoring: {e:#}") };
                            report(p, Err(why));
                        }
                    }
                }
            }));
            // Whoever waits for these partitions must hear of them, whatever happened.
            if finished.is_err() {
                for &p in partitions.iter().filter(|p| !sent.contains(p)) {
                    tx.send((p, Err(anyhow!("the restore thread panicked")))).ok();
                }
            }
        })?;
        Ok(())
    }

    /// The partitions whose start completed since the last call, each running from
    /// its `offset`. A start that failed is an error (once).
    pub fn started(&mut self) -> Result<Vec<Started>> {
        while let Ok((partition, result)) = self.started_rx.try_recv() {
            self.register(partition, result);
        }
        self.take_started()
    }

    /// The partitions whose worker failed since the last call. A running worker ends
    /// only when stopped, so one that ended by itself failed. If the operator stopped it
    /// ([`OperatorStopped`]), its partition stops alone — its error logged and kept for
    /// the end of the run, its state as its last commit left it — and the others go on;
    /// any other failure is the host's, and the error.
    pub fn failed(&mut self) -> Result<Vec<u32>> {
        let ended: Vec<u32> = self.running.iter().filter(|(_, r)| r.thread.is_finished()).map(|(p, _)| *p).collect();
        for partition in ended {
            let running = self.running.remove(&partition).expect("listed above");
            lock(&self.live).remove(&partition);
            let error = match running.thread.join() {
                Ok(Err(e)) => e,
                Ok(Ok(_)) => anyhow!("its worker ended unasked"),
                Err(_) => anyhow!("its worker panicked"),
            };
            let error = error.context(format!("partition {partition} stopped"));
            if error.downcast_ref::<OperatorStopped>().is_none() {
                return Err(error);
            }
            tracing::error!(partition, "{error:#}; {STOPPED_ALONE}");
            self.failed.insert(partition, error);
            self.newly_failed.push(partition);
        }
        Ok(std::mem::take(&mut self.newly_failed))
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
        let (partition, result) = self.started_rx.recv().expect("Workers holds a sender");
        self.register(partition, result);
    }

    /// Records a completed start: running, or its failure kept for the caller.
    fn register(&mut self, partition: u32, result: Result<Running>) {
        self.starting.remove(&partition);
        match result {
            Ok(running) => {
                self.arrived.push(running.started.clone());
                lock(&self.live).insert(partition, running.stats.clone());
                self.running.insert(partition, running);
            }
            Err(e) if e.is::<StartGivenUp>() => {}
            Err(e) => {
                let e = e.context(format!("starting partition {partition}"));
                tracing::error!("{e:#}");
                self.failure.get_or_insert(e);
            }
        }
    }

    /// Whether `partition` is starting or running here.
    pub fn owns(&self, partition: u32) -> bool {
        self.running.contains_key(&partition) || self.starting.contains(&partition)
    }

    /// Whether any partition is starting or running here.
    pub fn owns_any(&self) -> bool {
        !self.running.is_empty() || !self.starting.is_empty()
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

    /// Stops `partition` as `how` says and waits until it has. A start in progress is
    /// given up if it waits to try the store again, and otherwise completes first (the
    /// store request in flight). Returns what the stopped run did; `None` if it did not
    /// run here.
    pub fn stop(&mut self, partition: u32, how: Stop) -> Result<Option<&PartitionReport>> {
        if self.starting.contains(&partition) {
            lock(&self.given_up).insert(partition);
        }
        while self.starting.contains(&partition) {
            self.receive_start();
        }
        self.arrived.retain(|s| s.partition != partition);
        // One that failed has nothing to hand over: its state is as its last commit left it.
        let Some(running) = self.running.remove(&partition) else { return Ok(None) };
        let began = Instant::now();
        running.stop.set(how);
        drop(running.sender);
        let report = running.thread.join().map_err(|_| anyhow!("the worker of partition {partition} panicked"))?;
        lock(&self.live).remove(&partition);
        let report = report.with_context(|| format!("partition {partition} stopped"))?;
        tracing::info!(
            partition,
            "{STOPPED} ({how:?}) in {:.0} ms at offset {}; {} records processed since it started here",
            began.elapsed().as_secs_f64() * 1e3,
            report.totals.committed_offset,
            report.totals.processed
        );
        self.reports.push(report);
        Ok(self.reports.last())
    }

    /// Stops `partition` alone for `error`, found outside its worker: it hands over
    /// what it has (nothing, if it never ran), is logged and kept with `error` for the
    /// end of the run, and [`failed`](Self::failed) returns it next, as a partition the
    /// operator stopped.
    pub fn stop_alone(&mut self, partition: u32, error: anyhow::Error) -> Result<()> {
        self.stop(partition, Stop::Handover)?;
        let error = error.context(format!("partition {partition} stopped"));
        tracing::error!(partition, "{error:#}; {STOPPED_ALONE}");
        self.failed.insert(partition, error);
        self.newly_failed.push(partition);
        Ok(())
    }

    /// Stops every partition as `how` says, waiting for starts in progress first, and
    /// returns the offset each one's state holds at the end. Every partition is stopped
    /// even when one fails; the first failure is returned, or else, if partitions
    /// stopped alone during the run, why each did.
    pub fn stop_all(&mut self, how: Stop) -> Result<Vec<(u32, u64)>> {
        // A start still waiting for the store has nothing to hand over or drain.
        lock(&self.given_up).extend(&self.starting);
        let mut result = self.wait_started().and_then(|_| self.failed()).map(|_| Vec::new());
        for partition in self.running() {
            let stopped = self.stop(partition, how).map(|r| r.map(|r| (partition, r.totals.committed_offset)));
            result = result.and_then(|mut offsets| {
                offsets.extend(stopped?);
                Ok(offsets)
            });
        }
        let offsets = result?;
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

/// The first wait before a start tries the store again; each retry doubles it.
const FIRST_RETRY: Duration = Duration::from_secs(1);
/// The longest wait between two tries.
const LONGEST_RETRY: Duration = Duration::from_secs(30);

/// Logged while a start waits for the checkpoint store: `partitions [1, 3]: the
/// checkpoint store failed; trying again in 2s, …`.
pub const STORE_RETRY: &str = "the checkpoint store failed; trying again in";

/// A start given up because its partition was stopped while it waited for the store.
#[derive(Debug, thiserror::Error)]
#[error("the partition was stopped while its start waited for the checkpoint store")]
struct StartGivenUp;

/// Restores `partitions` as [`Workers::start`] says: their plans and where each one's
/// state came from. While the store fails to answer, tries again with backoff; before
/// each try, the partitions in `given_up` leave `partitions` and are `report`ed.
fn restore_retrying(
    setup: &WorkerSetup,
    host: &HostStats,
    partitions: &mut Vec<u32>,
    given_up: &Mutex<BTreeSet<u32>>,
    report: &mut impl FnMut(u32, Result<Running>),
) -> Result<(Vec<PartitionPlan>, Vec<RestoredFrom>)> {
    let Some(c) = &setup.checkpoints else {
        let plan = setup.runtime.block_on(restore::plan(Some(&setup.state), partitions, None))?;
        let restored = plan.partitions.iter().map(PartitionPlan::local).collect();
        return Ok((plan.partitions, restored));
    };
    let began = Instant::now();
    let mut wait = FIRST_RETRY;
    let mut claimed = BTreeSet::new();
    loop {
        let claims = setup.runtime.block_on(claim(&c.store, &c.settings.host, partitions, &mut claimed));
        let attempt = claims.and_then(|taken| {
            for &p in &taken {
                tracing::warn!(partition = p, "another host claimed the partition while its start waited; given up");
                report(p, Err(StartGivenUp.into()));
            }
            partitions.retain(|p| !taken.contains(p));
            setup.runtime.block_on(async {
                let plan = restore::plan(Some(&setup.state), partitions, Some(&c.store)).await?;
                restore::restore(&setup.state, &c.store, plan, c.restore_budget, host).await
            })
        });
        match attempt {
            Ok(report) => {
                host.record_restore(report.fetched(), report.took, report.plan.predicted().0);
                return Ok((report.plan.partitions, report.restored));
            }
            Err(e) if store::is_unavailable(&e) && began.elapsed() + wait < c.retry_timeout => tracing::warn!(
                "partitions {partitions:?}: {STORE_RETRY} {}s, for up to {}s in all ([checkpoint] \
                 restore_retry_timeout); they stay paused and this host stays in its group: {e:#}",
                wait.as_secs(),
                c.retry_timeout.as_secs()
            ),
            Err(e) if store::is_unavailable(&e) => {
                return Err(e.context(format!(
                    "the checkpoint store failed for {:.0}s of tries ([checkpoint] restore_retry_timeout)",
                    began.elapsed().as_secs_f64()
                )));
            }
            Err(e) => return Err(e),
        }
        let until = Instant::now() + wait;
        while Instant::now() < until && !partitions.iter().any(|p| lock(given_up).contains(p)) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let gone = lock(given_up).clone();
        for &p in partitions.iter().filter(|p| gone.contains(p)) {
            report(p, Err(StartGivenUp.into()));
        }
        partitions.retain(|p| !gone.contains(p));
        if partitions.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
        wait = (wait * 2).min(LONGEST_RETRY);
    }
}

/// Claims for `host` each of `partitions` not in `claimed` yet (adding it there), so that
/// a host that had it and has not noticed losing it stops collecting the checkpoints a
/// restore reads; of those claimed on an earlier try, checks the claim is still `host`'s
/// — a host retrying past its own eviction must not take a partition back from its new
/// owner — and returns those another host claimed since.
async fn claim(
    store: &CheckpointStore,
    host: &str,
    partitions: &[u32],
    claimed: &mut BTreeSet<u32>,
) -> Result<Vec<u32>> {
    let mut taken = Vec::new();
    for &p in partitions {
        if claimed.contains(&p) {
            match store.check_claim(p, host).await {
                Err(e) if e.is::<ClaimedElsewhere>() => taken.push(p),
                checked => checked?,
            }
        } else {
            store.claim_partition(p, host).await?;
            claimed.insert(p);
        }
    }
    Ok(taken)
}

/// Opens `plan`'s partition as `restored` left it and starts its worker thread.
fn spawn_worker(
    setup: &Arc<WorkerSetup>,
    host: &Arc<HostStats>,
    plan: &PartitionPlan,
    restored_from: RestoredFrom,
    assigned: Instant,
) -> Result<Running> {
    let partition = plan.partition;
    let store = setup.state.open_partition(partition)?;
    let offset = store.committed_offset()?;
    // A batch ends once it wrote what a commit takes: a commit's writes stay bounded.
    let txn = Transaction::new(store, setup.cache_bytes)?.with_ttl(setup.ttl.clone())?;
    let mut instance = setup.operator.instantiate(partition, txn.with_dirty_limit(setup.cadence.commit_dirty_bytes))?;
    let mut checkpointer = setup.checkpoints.as_ref().map(|c| {
        Checkpointer::new(
            c.store.clone(),
            setup.runtime.clone(),
            plan,
            &restored_from,
            c.settings.clone(),
            setup.state.snapshot_path(partition),
            instance.version().to_string(),
        )
    });
    let outputs = setup.destinations.sink.partition(partition, offset)?;
    let stats = Arc::new(PartitionStats::new(offset, instance.state().entries(), instance.version()));
    super::count_state_bytes(instance.state().store(), &stats);
    let (sender, batches) = std::sync::mpsc::sync_channel(setup.queued_batches);
    let stop = Arc::new(StopSignal::following(setup.stopping.clone()));
    let started = Started { partition, offset, restored_from, assigned, took: assigned.elapsed() };
    let thread = std::thread::Builder::new().name(format!("sluice-p{partition}")).spawn({
        let (setup, host, stats, stop, started) =
            (setup.clone(), host.clone(), stats.clone(), stop.clone(), started.clone());
        move || -> Result<PartitionReport> {
            let to = &setup.destinations;
            let checkpointer = checkpointer.as_mut();
            let null_keys = setup.null_keys;
            super::run(
                &mut instance,
                batches,
                to,
                outputs,
                &stats,
                &host,
                checkpointer,
                &stop,
                setup.cadence,
                null_keys,
            )?;
            Ok(PartitionReport {
                partition,
                resumed_at: started.offset,
                totals: stats.totals(),
                dead_letters: lock(&stats.dead_by_version).clone(),
                keys: match stop.get() {
                    None | Some(Stop::Drain) => Some(instance.state().store().count_keys()?),
                    Some(Stop::Handover | Stop::Lost) => None,
                },
                restored_from: started.restored_from,
                start_took: started.took,
                version: instance.version().to_string(),
                stopped: stop.get().unwrap_or(Stop::Drain),
            })
        }
    })?;
    Ok(Running { sender, stop, thread, stats, started })
}
