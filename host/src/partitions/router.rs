//! The partition router: records on their way to their partition's worker, a batch at
//! a time.
//!
//! [`Router`] implements the [`Partitions`] a source drives: it starts and stops
//! partitions in [`Workers`] as the source assigns and revokes them, batches each
//! partition's records, and holds a partition's batches back (the source pauses it)
//! while its worker's queue is full. A record below the offset its partition's state
//! holds is counted and dropped here, for every source: that state already reflects it.
//!
//! It does not read records (the [source](crate::source) does) or process them (the
//! workers do).

use super::events::OFFSETS_JUMP;
use super::{Followed, PartitionReport, StandbySettings, Workers};
use crate::record::{SourceRecord, Stop};
use crate::source::{Partitions, Started};
use crate::stats::RebalanceChange;
use anyhow::Result;
use std::collections::BTreeMap;
use std::time::Duration;

/// How far a source got.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DispatchReport {
    /// Records read from the source, including those a partition had already processed.
    pub read: u64,
    /// Records skipped because their partition's state already reflects them.
    pub skipped: u64,
    /// Times each partition's offsets jumped ahead (partitions without a jump are left
    /// out): offsets never delivered, which transaction markers, aborted transactions
    /// and compaction leave by design, and a faulty broker by accident.
    pub gaps: BTreeMap<u32, u64>,
}

/// Routes records to the [`Workers`] of their partitions.
pub struct Router {
    workers: Workers,
    /// The next offset each partition running here takes; `None`: not running here.
    next: Vec<Option<u64>>,
    pending: Vec<Vec<SourceRecord>>,
    /// The bytes of each partition's `pending` records.
    pending_bytes: Vec<usize>,
    batch_size: usize,
    batch_bytes: usize,
    report: DispatchReport,
    /// Partitions that stopped alone since the source last asked
    /// ([`Partitions::failed`]): found while pushing and flushing too.
    stopped: Vec<u32>,
}

impl Router {
    /// Batches of at most `batch_size` records, ending once they hold `batch_bytes`,
    /// for the `partitions` partitions of a job, none of them running yet.
    pub fn new(workers: Workers, partitions: u32, batch_size: usize, batch_bytes: usize) -> Self {
        Router {
            workers,
            next: vec![None; partitions as usize],
            pending: vec![Vec::new(); partitions as usize],
            pending_bytes: vec![0; partitions as usize],
            batch_size,
            batch_bytes,
            report: DispatchReport::default(),
            stopped: Vec::new(),
        }
    }

    /// Warms standby copies up, then follows them ([`Workers::follow_standbys`]).
    pub fn follow_standbys(&mut self, settings: StandbySettings, followed: Followed) -> Result<()> {
        self.workers.follow_standbys(settings, followed)
    }

    /// What the source delivered so far.
    pub fn report(&self) -> DispatchReport {
        self.report.clone()
    }

    /// The reports of every stopped run of a partition, in the order they stopped.
    pub fn partition_reports(&self) -> &[PartitionReport] {
        self.workers.reports()
    }

    /// From now on `started`'s partition takes records from its offset on.
    fn open(&mut self, started: &[Started]) {
        for started in started {
            self.next[started.partition as usize] = Some(started.offset);
        }
    }

    /// Drops what waits for partition `p` and takes no more of its records: they stay in
    /// the source, from the offset its state holds, for its next start.
    fn close(&mut self, p: u32) {
        self.next[p as usize] = None;
        self.pending[p as usize].clear();
        self.pending_bytes[p as usize] = 0;
    }

    /// Closes the partitions whose worker stopped alone since the last look, and keeps
    /// them for [`Partitions::failed`].
    fn close_failed(&mut self) -> Result<()> {
        for p in self.workers.failed()? {
            self.close(p);
            self.stopped.push(p);
        }
        Ok(())
    }

    fn hand_over(&mut self, p: usize, wait: bool, partial: bool) -> Result<()> {
        while let Some((at, bytes)) = self.next_batch(p, partial) {
            let rest = self.pending[p].split_off(at);
            let batch = std::mem::replace(&mut self.pending[p], rest);
            self.pending_bytes[p] -= bytes;
            if wait {
                self.workers.send(p as u32, batch)?;
            } else if let Some(mut batch) = self.workers.try_send(p as u32, batch)? {
                batch.append(&mut self.pending[p]);
                self.pending[p] = batch;
                self.pending_bytes[p] += bytes;
                break;
            }
        }
        Ok(())
    }

    /// How many of partition `p`'s pending records its next batch takes, and their
    /// bytes: a full batch (`batch_size` records, or fewer holding `batch_bytes`), or
    /// with `partial` whatever waits; `None` when no batch is due.
    fn next_batch(&self, p: usize, partial: bool) -> Option<(usize, usize)> {
        let pending = &self.pending[p];
        let mut bytes = 0;
        for (at, record) in pending.iter().take(self.batch_size).enumerate() {
            bytes += record.bytes();
            if bytes >= self.batch_bytes {
                return Some((at + 1, bytes));
            }
        }
        // Under `batch_bytes`: the batch takes every record summed above.
        match pending.len() {
            len if len >= self.batch_size => Some((self.batch_size, bytes)),
            len if partial && len > 0 => Some((len, bytes)),
            _ => None,
        }
    }
}

impl Partitions for Router {
    fn count(&self) -> u32 {
        self.next.len() as u32
    }

    fn assign(&mut self, partitions: &[u32]) -> Result<()> {
        self.workers.start(partitions)
    }

    fn started(&mut self, wait: bool) -> Result<Vec<Started>> {
        let started = if wait { self.workers.wait_started() } else { self.workers.started() }?;
        self.open(&started);
        Ok(started)
    }

    fn failed(&mut self) -> Result<Vec<u32>> {
        self.close_failed()?;
        Ok(std::mem::take(&mut self.stopped))
    }

    fn stop_alone(&mut self, partition: u32, error: anyhow::Error) -> Result<()> {
        self.close(partition);
        self.workers.stop_alone(partition, error)
    }

    fn revoke(&mut self, partitions: &[u32], how: Stop) -> (Vec<(u32, u64)>, Result<()>) {
        // Their next owner reads what waits for them again from the offset stored with
        // the state.
        for &p in partitions {
            self.close(p);
        }
        self.workers.stop(partitions, how)
    }

    fn push(&mut self, record: SourceRecord, wait: bool) -> Result<bool> {
        self.report.read += 1;
        let p = record.partition as usize;
        match self.next[p] {
            Some(next) if record.offset >= next => {
                if record.offset > next {
                    // Offsets alone cannot tell a legitimate jump from a lost record (see
                    // docs/kafka.md, *Offset gaps*): each is counted, each partition's
                    // first is logged.
                    let gaps = self.report.gaps.entry(record.partition).or_default();
                    if *gaps == 0 {
                        tracing::warn!(
                            partition = p,
                            "{} {next} to {}: the source did not deliver the offsets between (transaction \
                             markers, aborted transactions and compaction do this by design; otherwise the broker \
                             is at fault); further jumps of this partition are counted in the report",
                            OFFSETS_JUMP,
                            record.offset
                        );
                    }
                    *gaps += 1;
                }
                self.next[p] = Some(record.offset + 1);
            }
            Some(_) => {
                self.report.skipped += 1;
                return Ok(false);
            }
            None => return Ok(false),
        }
        self.pending_bytes[p] += record.bytes();
        self.pending[p].push(record);
        if self.backed_up(p as u32) {
            self.hand_over(p, wait, false)?;
            // A worker that failed took nothing: its partition stops here, once a batch.
            self.close_failed()?;
        }
        Ok(self.backed_up(p as u32))
    }

    fn flush(&mut self, wait: bool) -> Result<()> {
        (0..self.pending.len()).try_for_each(|p| self.hand_over(p, wait, true))?;
        self.close_failed()
    }

    fn backed_up(&self, partition: u32) -> bool {
        let p = partition as usize;
        self.pending[p].len() >= self.batch_size || self.pending_bytes[p] >= self.batch_bytes
    }

    fn owns(&self, partition: u32) -> bool {
        self.workers.owns(partition)
    }

    fn owns_any(&self) -> bool {
        self.workers.owns_any()
    }

    fn starting(&self) -> bool {
        self.workers.any_starting()
    }

    fn caught_up(&self) -> bool {
        self.next.iter().enumerate().all(|(p, next)| match next {
            Some(next) => {
                self.pending[p].is_empty() && self.workers.committed_offset(p as u32).is_none_or(|c| c >= *next)
            }
            None => true,
        })
    }

    fn committed_offsets(&self) -> Vec<(u32, u64)> {
        let running = self.workers.running().into_iter();
        running.filter_map(|p| self.workers.committed_offset(p).map(|offset| (p, offset))).collect()
    }

    fn record_lag(&self, partition: u32, high_watermark: u64) {
        self.workers.record_lag(partition, high_watermark);
    }

    fn record_rebalance(&self, change: RebalanceChange, partitions: usize, took: Duration) {
        self.workers.host_stats().record_rebalance(change, partitions, took);
    }

    fn finish(&mut self, outcome: Result<Stop>) -> Result<Vec<(u32, u64)>> {
        let how = *outcome.as_ref().unwrap_or(&Stop::Handover);
        let flushed = if how == Stop::Drain { self.flush(true) } else { Ok(()) };
        // The workers' own errors come before the source's: a worker that failed is why
        // the source could not hand it records.
        let stopped = self.workers.stop_all(if flushed.is_ok() { how } else { Stop::Handover })?;
        flushed?;
        outcome?;
        Ok(stopped)
    }
}

#[cfg(test)]
mod tests {
    //! The rebalance paths of the router and its workers, without a broker: a real
    //! vehicle-stats component over real state, driven as the Kafka source drives it.

    use super::*;
    use crate::objects::Objects;
    use crate::operator::registry::Registry;
    use crate::operator::versions::ActiveVersion;
    use crate::operator::versions::switches::SwitchLog;
    use crate::operator::wasm::{Limits, WasmOperator};
    use crate::partitions::{Checkpointing, WorkerSetup};
    use crate::sink::{DeadLetterSink, LineSink, Sink};
    use crate::source::generator::{Fleet, FleetOptions};
    use crate::state::{PartitionStore, StateDir};
    use crate::worker::{Cadence, Destinations};
    use std::path::Path;
    use std::sync::Arc;
    use std::time::Duration;

    const BATCH: usize = 10;

    /// A router over `partitions` partitions of vehicle-stats with state in `dir`.
    fn router(dir: &Path, partitions: u32, runtime: &tokio::runtime::Runtime) -> anyhow::Result<Router> {
        router_of("vehicle_stats", Vec::new(), dir, partitions, runtime)
    }

    /// A router over `partitions` partitions of operator `name` with `config`.
    fn router_of(
        name: &str,
        config: Vec<(String, String)>,
        dir: &Path,
        partitions: u32,
        runtime: &tokio::runtime::Runtime,
    ) -> anyhow::Result<Router> {
        Ok(Router::new(Workers::new(setup(name, config, dir, partitions, runtime)?), partitions, BATCH, usize::MAX))
    }

    /// What [`router_of`] starts partitions with: no checkpoints.
    fn setup(
        name: &str,
        config: Vec<(String, String)>,
        dir: &Path,
        partitions: u32,
        runtime: &tokio::runtime::Runtime,
    ) -> anyhow::Result<WorkerSetup> {
        let limits = Limits { call_timeout: Some(Duration::from_secs(5)), memory_bytes: 64 << 20, ..Limits::default() };
        let operator = WasmOperator::load(&sluice_e2e::operator_wasm(name), limits.clone(), config.clone())?;
        let registry = Registry::new(Objects::open(&dir.join("versions").to_string_lossy())?, name)?;
        Ok(WorkerSetup {
            state: StateDir::open(&dir.join("state"), partitions)?,
            operator: Box::new(ActiveVersion::new(Arc::new(operator))),
            switches: SwitchLog::new(
                registry,
                (limits, config),
                runtime.handle().clone(),
                None,
                std::time::Duration::from_secs(5),
            ),
            shadows: None,
            checkpoints: None,
            destinations: Destinations {
                sink: Sink::Lines(LineSink::file(&dir.join("out.jsonl"), true)?),
                dead_letters: DeadLetterSink::Lines(LineSink::file(&dir.join("dead.jsonl"), true)?),
            },
            runtime: runtime.handle().clone(),
            queued_batches: 1,
            queued_bytes: usize::MAX,
            // A commit after every batch, as the tests' offsets expect.
            cadence: Cadence {
                commit_interval: Duration::from_secs(60),
                commit_every: 1,
                commit_dirty_bytes: usize::MAX,
                slow_batch: None,
            },
            cache_bytes: 1 << 20,
            timers_bytes: usize::MAX,
            ttl: Default::default(),
            null_keys: Default::default(),
            retry_timeout: Duration::from_secs(60),
            take_back_after: None,
            stopping: Arc::default(),
        })
    }

    /// The first `count` records of partition 0 (one vehicle, so all in one partition).
    fn records(count: u64) -> Vec<SourceRecord> {
        let fleet = Fleet::new(&FleetOptions { vehicles: 1, count: Some(count), seed: 7, churn: None });
        let records = fleet.map(|raw| raw.expect("the generator does not fail"));
        records.enumerate().map(|(offset, raw)| raw.at(0, offset as u64)).collect()
    }

    /// The records partition 0's state has folded in: vehicle-stats counts them.
    fn folded(dir: &Path) -> anyhow::Result<u64> {
        let store = PartitionStore::open(&StateDir::open(&dir.join("state"), 1)?.partition_path(0), 0)?;
        let mut count = 0;
        for entry in store.entries() {
            let summary: serde_json::Value = serde_json::from_slice(&entry?.value)?;
            count += summary["count"].as_u64().expect("a summary has a count");
        }
        Ok(count)
    }

    #[test]
    fn a_revocation_mid_batch_drops_what_waits_and_the_next_start_resumes_at_the_state() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let runtime = crate::objects::runtime()?;
        let all = records(45);
        let mut router = router(dir.path(), 1, &runtime)?;
        router.assign(&[0])?;
        assert_eq!(router.started(true)?.len(), 1);
        for record in &all[..25] {
            router.push(record.clone(), true)?;
        }
        // Two batches were handed over, five records wait here; the worker finishes at
        // most the batch in hand.
        let committed = revoke_one(&mut router, 0, Stop::Handover)?.expect("partition 0 ran here");
        assert!([0, 10, 20].contains(&committed), "committed {committed}");
        assert!(!router.owns(0) && !router.backed_up(0));
        assert!(!router.push(all[25].clone(), true)?, "a record of a revoked partition is dropped");

        // Assigned again: it resumes at the offset its state holds, and records it
        // already holds are skipped.
        router.assign(&[0])?;
        let started = router.started(true)?;
        assert_eq!((started[0].partition, started[0].offset), (0, committed));
        for record in &all {
            router.push(record.clone(), true)?;
        }
        assert_eq!(router.finish(Ok(Stop::Drain))?, [(0, 45)]);
        assert_eq!(router.report().skipped, committed);
        drop(router);
        assert_eq!(folded(dir.path())?, 45, "every record folded in exactly once");
        Ok(())
    }

    #[test]
    fn offsets_that_jump_are_counted_per_partition_and_the_records_after_them_processed() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let runtime = crate::objects::runtime()?;
        let mut router = router(dir.path(), 1, &runtime)?;
        router.assign(&[0])?;
        router.started(true)?;
        // Offsets 5 and 6 never arrive (one jump), nor 20 (another), as a transaction's
        // aborted records and markers would leave them.
        let delivered: Vec<SourceRecord> =
            records(30).into_iter().filter(|r| ![5, 6, 20].contains(&r.offset)).collect();
        for record in delivered {
            router.push(record, true)?;
        }
        assert_eq!(router.finish(Ok(Stop::Drain))?, [(0, 30)]);
        assert_eq!(router.report().gaps, BTreeMap::from([(0, 2)]));
        drop(router);
        assert_eq!(folded(dir.path())?, 27, "every delivered record folded in");
        Ok(())
    }

    /// Revokes `partition` alone: the offset its state holds if it ran here.
    fn revoke_one(router: &mut Router, partition: u32, how: Stop) -> anyhow::Result<Option<u64>> {
        let (offsets, result) = router.revoke(&[partition], how);
        result?;
        Ok(offsets.first().map(|&(_, offset)| offset))
    }

    #[test]
    fn a_revocation_while_restoring_gives_the_start_up() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let runtime = crate::objects::runtime()?;
        let mut router = router(dir.path(), 2, &runtime)?;
        router.assign(&[0, 1])?;
        assert!(router.owns(0));
        // Revoked before the source heard it started: given up, whether its worker had
        // started by then (stopped unfed) or not (never started).
        assert_eq!(revoke_one(&mut router, 0, Stop::Handover)?, None);
        let started: Vec<u32> = router.started(true)?.iter().map(|s| s.partition).collect();
        assert_eq!(started, [1], "a revoked partition is never reported started");
        assert!(!router.owns(0) && router.owns(1));
        // Started again, it waits until the given-up start has let go of its state.
        router.assign(&[0])?;
        assert_eq!(router.started(true)?.iter().map(|s| s.partition).collect::<Vec<_>>(), [0]);
        assert_eq!(router.finish(Ok(Stop::Drain))?, [(0, 0), (1, 0)]);
        Ok(())
    }

    /// A store whose request never returns (its restore history is a FIFO no one
    /// writes: reading it blocks, as a request to a store that stopped answering does)
    /// holds a restore; revoking the partition gives the restore up at once rather than
    /// wait for the store. The store answers only after 10 s, so a revocation that waited
    /// for it would take that long.
    #[test]
    fn a_revocation_does_not_wait_for_a_restore_in_flight() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let runtime = crate::objects::runtime()?;
        let mut router = router_with_store(dir.path(), Duration::from_secs(600), &runtime)?;
        let fifo = dir.path().join("store/restores.json");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status()?;
        assert!(made.success(), "mkfifo {}", fifo.display());
        let answer = std::thread::spawn(move || -> std::io::Result<()> {
            std::thread::sleep(Duration::from_secs(10));
            // Opening it for writing lets the read go on; it reads nothing, no history.
            let writer = std::fs::OpenOptions::new().write(true).open(&fifo)?;
            std::fs::remove_file(&fifo)?;
            drop(writer);
            Ok(())
        });
        router.assign(&[0])?;
        std::thread::sleep(Duration::from_millis(500));
        assert!(router.starting() && router.started(false)?.is_empty(), "the restore waits for the store");
        let began = std::time::Instant::now();
        assert_eq!(revoke_one(&mut router, 0, Stop::Handover)?, None, "it never ran");
        let took = began.elapsed();
        assert!(took < Duration::from_secs(5), "the revocation waited {took:?} for the store");
        assert!(!router.owns(0) && !router.starting());
        answer.join().expect("the answering thread")?;
        // The given-up restore ends; a new start of the partition runs after it.
        router.assign(&[0])?;
        assert_eq!(router.started(true)?.iter().map(|s| s.partition).collect::<Vec<_>>(), [0]);
        assert_eq!(router.finish(Ok(Stop::Handover))?, [(0, 0)]);
        Ok(())
    }

    #[test]
    fn a_lost_partition_stops_with_what_it_committed() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let runtime = crate::objects::runtime()?;
        let mut router = router(dir.path(), 1, &runtime)?;
        router.assign(&[0])?;
        router.started(true)?;
        for record in records(30) {
            router.push(record, true)?;
        }
        router.flush(true)?;
        let committed = revoke_one(&mut router, 0, Stop::Lost)?.expect("partition 0 ran here");
        assert_eq!(committed % BATCH as u64, 0, "whole batches only: {committed}");
        assert_eq!(router.partition_reports()[0].stopped, Stop::Lost);
        assert_eq!(router.finish(Ok(Stop::Drain))?, []);
        drop(router);
        assert_eq!(folded(dir.path())?, committed);
        Ok(())
    }

    #[test]
    fn a_failed_start_is_an_error_naming_the_partition_which_is_not_owned() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let runtime = crate::objects::runtime()?;
        // The probe operator traps in `init` with this config: no instance can start.
        let config = vec![("trap_init".to_string(), "true".to_string())];
        let mut router = router_of("probe", config, dir.path(), 1, &runtime)?;
        router.assign(&[0])?;
        let err = router.started(true).expect_err("partition 0 cannot start");
        let err = format!("{err:#}");
        assert!(err.contains("starting partition 0") && err.contains("trap_init is set"), "{err}");
        assert!(!router.owns(0) && !router.starting());
        assert_eq!(router.finish(Ok(Stop::Drain))?, []);
        Ok(())
    }

    /// A router of one partition whose checkpoint store at `dir/store` fails to answer
    /// (a file stands where its directory was), its starts trying again for `retry`.
    fn router_with_failing_store(
        dir: &Path,
        retry: Duration,
        runtime: &tokio::runtime::Runtime,
    ) -> anyhow::Result<Router> {
        let router = router_with_store(dir, retry, runtime)?;
        let path = dir.join("store");
        std::fs::remove_dir_all(&path)?;
        std::fs::write(&path, "not a directory")?;
        Ok(router)
    }

    /// A router of one partition checkpointing to the directory `dir/store`, its starts
    /// trying the store again for `retry`.
    fn router_with_store(dir: &Path, retry: Duration, runtime: &tokio::runtime::Runtime) -> anyhow::Result<Router> {
        let path = dir.join("store");
        let store = crate::checkpoint::CheckpointStore::open(path.to_str().expect("UTF-8 temp path"))?;
        let mut setup = setup("vehicle_stats", Vec::new(), dir, 1, runtime)?;
        setup.checkpoints = Some(Checkpointing {
            store,
            settings: crate::checkpoint::CheckpointSettings {
                interval: Duration::from_secs(60),
                retain: 1,
                upload_bytes_per_s: None,
                host: "test".into(),
            },
            restore_budget: Duration::from_secs(60),
        });
        setup.retry_timeout = retry;
        Ok(Router::new(Workers::new(setup), 1, BATCH, usize::MAX))
    }

    #[test]
    fn a_start_waiting_for_a_failing_store_is_given_up_when_its_partition_is_revoked() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let runtime = crate::objects::runtime()?;
        // Ten minutes of tries: only giving up ends this start within the test.
        let mut router = router_with_failing_store(dir.path(), Duration::from_secs(600), &runtime)?;
        router.assign(&[0])?;
        std::thread::sleep(Duration::from_millis(200));
        assert!(router.starting() && router.started(false)?.is_empty(), "still trying");
        assert_eq!(revoke_one(&mut router, 0, Stop::Handover)?, None, "it never ran");
        assert!(!router.owns(0) && !router.starting());
        assert!(router.started(false)?.is_empty(), "giving up is no failure");
        assert_eq!(router.finish(Ok(Stop::Handover))?, []);
        Ok(())
    }

    #[test]
    fn a_start_fails_once_the_store_failed_for_its_retry_timeout() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let runtime = crate::objects::runtime()?;
        let mut router = router_with_failing_store(dir.path(), Duration::ZERO, &runtime)?;
        router.assign(&[0])?;
        let err = format!("{:#}", router.started(true).expect_err("the store never answers"));
        assert!(err.contains("starting partition 0") && err.contains("restore_retry_timeout"), "{err}");
        assert!(err.contains("Not a directory"), "the store's own error is kept: {err}");
        Ok(())
    }
}
