//! Starting one partition on this host, on a thread of its own: holding it (one start
//! or worker of a partition at a time, [`Occupancy`]), claiming it in the checkpoint
//! store, restoring its state (local recovery or the store, tried again with backoff
//! while the store fails to answer), opening it, instantiating its operator and
//! spawning its [worker](crate::worker::PartitionWorker)'s thread. A start looks between its
//! steps whether it was given up ([`Start`]), and never takes over the partition's
//! Kafka transactions after it was.
//!
//! This module does not decide which partitions start or stop, nor keep the running
//! ones: [`Workers`](super::Workers) does.

use super::events::STORE_RETRY;
use super::occupancy::{Held, Occupancy, wait_unless};
use super::report::PartitionReport;
use super::setup::WorkerSetup;
use crate::backoff::Backoff;
use crate::checkpoint::restore::{self, PartitionPlan};
use crate::checkpoint::store::ClaimedElsewhere;
use crate::checkpoint::{CheckpointStore, Checkpointer};
use crate::lock;
use crate::objects;
use crate::record::{RestoredFrom, Stop};
use crate::source::Started;
use crate::state::Transaction;
use crate::stats::{HostStats, PartitionStats};
use crate::worker::queue::{self, QueueSender};
use crate::worker::{self, Partition, PartitionWorker, StopSignal};
use anyhow::{Result, anyhow};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// One start of one partition, shared by [`Workers`] and the thread doing it.
#[derive(Debug, Default)]
pub(super) struct Start {
    /// Set when the partition stopped meanwhile: the start ends as soon as it looks.
    given_up: Mutex<bool>,
}

impl Start {
    /// Gives the start up. Waits while it takes over the partition's transactions
    /// ([`Start::take_over`]), so it never takes them over after this returns.
    pub(super) fn give_up(&self) {
        *lock(&self.given_up) = true;
    }

    fn given_up(&self) -> bool {
        *lock(&self.given_up)
    }

    /// Runs `take_over` — taking over the partition's Kafka transactions, which fences
    /// their earlier owners — unless the start was given up; [`Start::give_up`] waits
    /// meanwhile. A partition this host was told it no longer owns must never be taken
    /// over: it would fence its new owner.
    fn take_over<T>(&self, take_over: impl FnOnce() -> Result<T>) -> Result<T> {
        let given_up = lock(&self.given_up);
        if *given_up {
            return Err(StartGivenUp.into());
        }
        take_over()
    }
}

/// A partition's running worker, as [`Workers`](super::Workers) keeps it.
pub(super) struct Running {
    /// Hands the worker its batches.
    pub(super) sender: QueueSender,
    /// Tells it how to end.
    pub(super) stop: Arc<StopSignal>,
    /// Its thread, ending in its report.
    pub(super) thread: JoinHandle<Result<PartitionReport>>,
    /// Its live counters.
    pub(super) stats: Arc<PartitionStats>,
    /// Where it started.
    pub(super) started: Started,
}

/// A start given up because its partition was stopped while it was under way.
#[derive(Debug, thiserror::Error)]
#[error("the partition was stopped while it was starting")]
pub(super) struct StartGivenUp;

/// What one start thread shares between its steps.
pub(super) struct Begun<'a> {
    pub(super) setup: &'a Arc<WorkerSetup>,
    pub(super) host: &'a Arc<HostStats>,
    pub(super) occupancy: &'a Arc<Occupancy>,
    /// When its partitions were assigned (or stopped, for a restart): their pause began.
    pub(super) assigned: Instant,
    /// Whether to claim the partitions in the checkpoint store.
    pub(super) claim: bool,
}

impl Begun<'_> {
    /// Starts `starts`' partitions after `delay`, `report`ing each: once it holds the
    /// partition ([`Occupancy`]), restores it, then starts its worker unless given up.
    pub(super) fn start(
        &self,
        starts: &BTreeMap<u32, Arc<Start>>,
        delay: Duration,
        report: &mut impl FnMut(u32, Result<Running>),
    ) {
        let given_up = |p: &u32| starts[p].given_up();
        let mut held = BTreeMap::new();
        for (&p, start) in starts {
            match self.occupancy.hold(p, || start.given_up()) {
                Some(h) => drop(held.insert(p, h)),
                None => report(p, Err(StartGivenUp.into())),
            }
        }
        let mut partitions: Vec<u32> = held.keys().copied().collect();
        wait_unless(delay, || partitions.iter().all(given_up));
        drop_given_up(&mut partitions, &given_up, report);
        if partitions.is_empty() {
            return;
        }
        let restoring = self.occupancy.restoring();
        let restored = restore_retrying(self.setup, self.host, &mut partitions, &given_up, self.claim, report);
        drop(restoring);
        match restored {
            Ok((plans, restored)) => {
                for (plan, restored) in plans.iter().zip(restored) {
                    let (p, held) = (plan.partition, held.remove(&plan.partition).expect("restored only held ones"));
                    let start = &starts[&p];
                    if start.given_up() {
                        report(p, Err(StartGivenUp.into()));
                    } else {
                        report(p, spawn_worker(self.setup, self.host, plan, restored, self.assigned, start, held));
                    }
                }
            }
            Err(e) => {
                for p in partitions {
                    // A partition stopped meanwhile is no longer this host's to fail on.
                    let why = if given_up(&p) { StartGivenUp.into() } else { anyhow!("restoring: {e:#}") };
                    report(p, Err(why));
                }
            }
        }
    }
}

/// Removes from `partitions` those `given_up` says were stopped, `report`ing each.
fn drop_given_up(
    partitions: &mut Vec<u32>,
    given_up: &dyn Fn(&u32) -> bool,
    report: &mut impl FnMut(u32, Result<Running>),
) {
    partitions.retain(|p| {
        let gone = given_up(p);
        if gone {
            report(*p, Err(StartGivenUp.into()));
        }
        !gone
    });
}

/// Restores `partitions` as [`Workers::start`] says (claiming them first if `claim`
/// says so): their plans and where each one's state came from. While the store fails
/// to answer, tries again with [`Backoff`]; before each try, the partitions
/// `given_up` says were stopped leave `partitions` and are `report`ed.
fn restore_retrying(
    setup: &WorkerSetup,
    host: &HostStats,
    partitions: &mut Vec<u32>,
    given_up: &dyn Fn(&u32) -> bool,
    claim: bool,
    report: &mut impl FnMut(u32, Result<Running>),
) -> Result<(Vec<PartitionPlan>, Vec<RestoredFrom>)> {
    let Some(c) = &setup.checkpoints else {
        let plan = setup.runtime.block_on(restore::plan(Some(&setup.state), partitions, None))?;
        let restored = plan.partitions.iter().map(PartitionPlan::local).collect();
        return Ok((plan.partitions, restored));
    };
    let mut backoff = Backoff::new(setup.retry_timeout);
    let mut claimed = BTreeSet::new();
    loop {
        let claims = match claim {
            true => {
                setup.runtime.block_on(claim_partitions(&c.store, &c.settings.host, partitions, given_up, &mut claimed))
            }
            false => Ok(Vec::new()),
        };
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
        let wait = match attempt {
            Ok(report) => {
                let paths = (report.plan.partitions.iter().zip(&report.restored))
                    .map(|(p, r)| format!("p{} {}", p.partition, r.path()))
                    .collect::<Vec<_>>()
                    .join(", ");
                host.record_restore(report.fetched(), report.took, report.plan.predicted().0, paths);
                return Ok((report.plan.partitions, report.restored));
            }
            Err(e) if !objects::is_unavailable(&e) => return Err(e),
            Err(e) => match backoff.next_wait() {
                Some(wait) => {
                    tracing::warn!(
                        "partitions {partitions:?}: {STORE_RETRY} {}s, for up to {}s in all ([checkpoint] \
                         restore_retry_timeout); they stay paused and this host stays in its group: {e:#}",
                        wait.as_secs(),
                        backoff.timeout().as_secs()
                    );
                    wait
                }
                None => {
                    return Err(e.context(format!(
                        "the checkpoint store failed for {:.0}s of tries ([checkpoint] restore_retry_timeout)",
                        backoff.elapsed().as_secs_f64()
                    )));
                }
            },
        };
        wait_unless(wait, || partitions.iter().any(given_up));
        drop_given_up(partitions, given_up, report);
        if partitions.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
    }
}

/// Claims for `host` each of `partitions` not in `claimed` yet (adding it there), so that
/// a host that had it and has not noticed losing it stops collecting the checkpoints a
/// restore reads; of those claimed on an earlier try, checks the claim is still `host`'s
/// — a host retrying past its own eviction must not take a partition back from its new
/// owner — and returns those another host claimed since. A partition `given_up` by now
/// is left alone: it may be its next owner's already.
async fn claim_partitions(
    store: &CheckpointStore,
    host: &str,
    partitions: &[u32],
    given_up: &dyn Fn(&u32) -> bool,
    claimed: &mut BTreeSet<u32>,
) -> Result<Vec<u32>> {
    let mut taken = Vec::new();
    for &p in partitions.iter().filter(|p| !given_up(p)) {
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

/// Opens `plan`'s partition as `restored` left it and starts its worker thread, which
/// keeps the partition `held` until it ends. Its outputs take over the partition's
/// transactions unless `start` was given up by then.
fn spawn_worker(
    setup: &Arc<WorkerSetup>,
    host: &Arc<HostStats>,
    plan: &PartitionPlan,
    restored_from: RestoredFrom,
    assigned: Instant,
    start: &Start,
    held: Held,
) -> Result<Running> {
    let partition = plan.partition;
    let store = setup.state.open_partition(partition)?;
    let offset = store.committed_offset()?;
    // A batch ends once it wrote what a commit takes: a commit's writes stay bounded.
    let txn = Transaction::new(store, setup.cache_bytes)?
        .with_ttl(setup.ttl.clone())?
        .with_dirty_limit(setup.cadence.commit_dirty_bytes)
        .with_timers_limit(setup.timers_bytes);
    let mut instance = setup.operator.instantiate(partition, txn)?;
    let checkpointer = setup.checkpoints.as_ref().map(|c| {
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
    // Before the take-over: a log that cannot be used stops the partition before it
    // fences anyone.
    let recorded = setup.switches.read(partition, offset)?;
    let outputs =
        start.take_over(|| setup.destinations.sink.partition(&setup.destinations.dead_letters, partition, offset))?;
    instance.follow_switches((&setup.switches, recorded), partition, (offset, outputs.covered()))?;
    let stats = Arc::new(PartitionStats::new(offset, instance.state().entries(), instance.version()));
    worker::count_state_bytes(instance.state().store(), &stats);
    let (sender, batches) = queue::bounded(setup.queued_batches, setup.queued_bytes);
    let stop = Arc::new(StopSignal::following(setup.stopping.clone()));
    let started = Started { partition, offset, restored_from, assigned, took: assigned.elapsed() };
    host.forget_standby(partition);
    host.record_resume(started.restored_from.path(), started.took);
    let thread = std::thread::Builder::new().name(format!("sluice-p{partition}")).spawn({
        let (setup, host, stats, stop, started) =
            (setup.clone(), host.clone(), stats.clone(), stop.clone(), started.clone());
        move || -> Result<PartitionReport> {
            // Locals drop in reverse: the checkpointer, the instance (its state's
            // database), then the partition, free for its next start.
            let _held = held;
            let (mut instance, mut checkpointer) = (instance, checkpointer);
            let partition_of_run = Partition {
                operator: &mut *instance,
                to: &setup.destinations,
                stats: &stats,
                host: &host,
                checkpointer: checkpointer.as_mut(),
                stop: &stop,
                cadence: setup.cadence,
                null_keys: setup.null_keys,
                shadows: setup.shadows.as_deref(),
            };
            PartitionWorker::new(partition_of_run, outputs).run(batches)?;
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
                shadow: stats.shadow.report(),
                stopped: stop.get().unwrap_or(Stop::Drain),
            })
        }
    })?;
    Ok(Running { sender, stop, thread, stats, started })
}

#[cfg(test)]
mod tests {
    //! A start given up, on its own; the router's tests run starts and stops through
    //! real workers.

    use super::*;

    /// A start given up never takes its partition's transactions over afterwards, and a
    /// take-over in flight holds the give-up back until it returns: once a revocation
    /// returns, no take-over (fencing the partition's next owner) can follow.
    #[test]
    fn a_given_up_start_never_takes_its_partition_over_after() {
        let start = Arc::new(Start::default());
        let (entered_tx, entered) = std::sync::mpsc::channel();
        let taking = std::thread::spawn({
            let start = start.clone();
            move || {
                start.take_over(|| {
                    entered_tx.send(()).expect("the test waits");
                    std::thread::sleep(Duration::from_millis(300));
                    Ok(Instant::now())
                })
            }
        });
        entered.recv().expect("the take-over began");
        start.give_up();
        let gave_up = Instant::now();
        let took_over = taking.join().expect("no panic").expect("it began before the give-up");
        assert!(took_over <= gave_up, "the give-up returned while the take-over was in flight");
        let after = start.take_over(|| -> Result<()> { panic!("taken over after the give-up") });
        assert!(after.expect_err("given up").is::<StartGivenUp>());
    }
}
