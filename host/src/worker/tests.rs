//! The commit protocol through one [`PartitionWorker`], with a fake operator over real
//! state and a temporary file sink: what an idle partition commits, what a deploy
//! commits before the new version runs, and what a lost partition leaves uncommitted.
//! Each runs in milliseconds; the partitions' tests run this fake and real components
//! through [`Workers`](crate::partitions::Workers).

use super::*;
use crate::config::{TimeDomain, TtlConfig};
use crate::operator::Output;
use crate::operator::{Instantiate, Switch, process_each};
use crate::sink::{LineSink, Sink};
use crate::state::{PartitionStore, Transaction};
use std::collections::VecDeque;
use std::path::Path;

/// Every record puts its value under its key and emits it; every expired entry emits
/// `expired`. Versions are deployed at offsets the test chooses.
struct Fake {
    txn: Transaction,
    version: String,
    /// Versions deployed, in order, each followed at the first batch at or past its
    /// offset.
    deploys: VecDeque<(u64, String)>,
    /// Told the partition is lost while the fake processes a batch, if set.
    lost: Option<Arc<StopSignal>>,
    /// Each batch processed: the version, its first offset, and the offset the state's
    /// last commit stored.
    batches: Vec<(String, u64, u64)>,
}

impl Fake {
    /// Version `v1` over `txn`.
    fn over(txn: Transaction) -> Self {
        Fake { txn, version: "v1".into(), deploys: VecDeque::new(), lost: None, batches: Vec::new() }
    }

    /// Version `v1` over a partition's fresh state in `dir`, its entries expiring after
    /// `ttl` of the wall clock (processing time).
    fn new(dir: &Path, ttl: Option<Duration>) -> anyhow::Result<Self> {
        let ttl = TtlConfig { default: ttl, time: TimeDomain::Processing, ..TtlConfig::default() };
        Ok(Fake::over(Transaction::new(PartitionStore::open(dir, 0)?, 1 << 20)?.with_ttl(Arc::new(ttl))?))
    }
}

/// Instantiates a [`Fake`] for every partition.
pub(crate) struct FakeVersions;

impl Instantiate for FakeVersions {
    fn instantiate(&self, _partition: u32, txn: Transaction) -> Result<Box<dyn Operator>> {
        Ok(Box::new(Fake::over(txn)))
    }
}

impl Operator for Fake {
    fn process(&mut self, record: &SourceRecord) -> Result<Outcome> {
        self.txn.put("n", record.value.clone());
        Ok(Outcome::Emitted(vec![Output { key: record.key.clone(), value: record.value.clone(), topic: None }]))
    }

    fn process_batch(&mut self, records: &[SourceRecord]) -> Result<Processed> {
        let committed = self.txn.store().committed_offset()?;
        self.batches.push((self.version.clone(), records[0].offset, committed));
        if let Some(stop) = &self.lost {
            stop.set(Stop::Lost);
        }
        Ok(Processed::from_outcomes(process_each(self, records)?))
    }

    fn expire(&mut self, offset: u64) -> Result<Vec<Expiration>> {
        let mut expirations = Vec::new();
        while let Some(entry) = self.txn.expire_next()? {
            let output = Output { key: entry.key.clone(), value: b"expired".to_vec(), topic: None };
            expirations.push(Expiration { entry, offset, outcome: Outcome::Emitted(vec![output]), by_paired: false });
        }
        Ok(expirations)
    }

    fn state(&mut self) -> &mut Transaction {
        &mut self.txn
    }

    fn version(&self) -> &str {
        &self.version
    }

    fn follow_deploys(&mut self, offset: u64) -> Result<Option<Switch>> {
        if self.deploys.front().is_none_or(|(at, _)| offset < *at) {
            return Ok(None);
        }
        let (_, to) = self.deploys.pop_front().expect("looked at above");
        let from = std::mem::replace(&mut self.version, to.clone());
        Ok(Some(Switch { from, to, stall: Duration::ZERO, refused: None, replayed: false }))
    }
}

/// Commits only when the worker must: never by its cadence.
pub(crate) const NEVER: Cadence = Cadence {
    commit_interval: Duration::from_secs(3600),
    commit_every: usize::MAX,
    commit_dirty_bytes: usize::MAX,
    slow_batch: None,
};

/// Records `offsets` of partition 0, keyed `k`.
pub(crate) fn records(offsets: std::ops::Range<u64>) -> Vec<SourceRecord> {
    let record = |offset| SourceRecord {
        partition: 0,
        offset,
        key: b"k".to_vec(),
        value: format!("r{offset}").into_bytes(),
        timestamp_ms: 0,
        headers: Vec::new(),
    };
    offsets.map(record).collect()
}

/// Outputs to `dir/out.jsonl`, dead letters to `dir/dead.jsonl`.
pub(crate) fn destinations(dir: &Path) -> anyhow::Result<Destinations> {
    Ok(Destinations {
        sink: Sink::Lines(LineSink::file(&dir.join("out.jsonl"), true)?),
        dead_letters: DeadLetterSink::Lines(LineSink::file(&dir.join("dead.jsonl"), true)?),
    })
}

/// Runs `fake` as partition 0's worker over what `batches` hands over, committing as
/// `cadence` says, stopped as `stop` says; its counters at the end.
fn run(
    fake: &mut Fake,
    batches: queue::QueueReceiver,
    to: &Destinations,
    stop: &StopSignal,
    cadence: Cadence,
) -> anyhow::Result<PartitionStats> {
    let stats = PartitionStats::new(0, 0, "v1");
    run_with(fake, batches, to, stop, cadence, &stats)?;
    Ok(stats)
}

/// [`run`] with the partition's counters `stats`.
fn run_with(
    fake: &mut Fake,
    batches: queue::QueueReceiver,
    to: &Destinations,
    stop: &StopSignal,
    cadence: Cadence,
    stats: &PartitionStats,
) -> anyhow::Result<()> {
    let host = HostStats::default();
    let outputs = to.sink.partition(&to.dead_letters, 0, 0)?;
    let partition = Partition {
        operator: fake,
        to,
        stats,
        host: &host,
        checkpointer: None,
        stop,
        cadence,
        null_keys: NullKeys::default(),
        shadows: None,
    };
    PartitionWorker::new(partition, outputs).run(batches)
}

/// `batches` queued, the sender gone: a worker processes them all, then ends.
fn queued(batches: Vec<Vec<SourceRecord>>) -> anyhow::Result<queue::QueueReceiver> {
    let (sender, receiver) = queue::bounded(batches.len().max(1), usize::MAX);
    for batch in batches {
        sender.send(batch)?;
    }
    Ok(receiver)
}

/// An idle partition whose processing-time clock made an entry due expires it, sends
/// what the expiry emitted and commits it, without a record coming.
#[test]
fn an_idle_partition_commits_what_expired() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut fake = Fake::new(&dir.path().join("state"), Some(Duration::from_millis(20)))?;
    expires_while_idle(&mut fake, dir.path(), records(0..1))
}

/// With `[ttl] idle_timeout`, an idle event-time partition's clock goes on with the
/// wall clock past the timeout: the entry its record put, with a TTL counted from the
/// record's event time, expires and is committed without another record.
#[test]
fn an_idle_event_time_partition_goes_on_past_its_idle_timeout() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let ttl = TtlConfig {
        default: Some(Duration::from_millis(20)),
        idle_timeout: Some(Duration::from_millis(30)),
        ..TtlConfig::default()
    };
    let txn =
        Transaction::new(PartitionStore::open(&dir.path().join("state"), 0)?, 1 << 20)?.with_ttl(Arc::new(ttl))?;
    let mut fake = Fake::over(txn);
    let mut batch = records(0..1);
    batch[0].timestamp_ms = 1_767_225_600_000;
    expires_while_idle(&mut fake, dir.path(), batch)
}

/// Runs `batch` (its one record putting an entry that expires soon) through a worker of
/// `fake` with its files in `dir`, then leaves it idle: the expiry is committed, the
/// entry gone, and the expiry's output follows the record's.
fn expires_while_idle(fake: &mut Fake, dir: &Path, batch: Vec<SourceRecord>) -> anyhow::Result<()> {
    let to = destinations(dir)?;
    let (sender, batches) = queue::bounded(1, usize::MAX);
    // A commit after the batch: the entry is committed before it expires.
    let cadence = Cadence { commit_every: 1, ..NEVER };
    let (stop, stats) = (StopSignal::default(), PartitionStats::new(0, 0, "v1"));
    let committed_idle = std::thread::scope(|scope| -> anyhow::Result<bool> {
        let watch = scope.spawn(|| {
            sender.send(batch).expect("the worker waits");
            // Published by a commit only; the sender still here, no record to come.
            let until = Instant::now() + Duration::from_secs(5);
            while stats.expired.load(Ordering::Relaxed) == 0 && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(5));
            }
            let committed = stats.expired.load(Ordering::Relaxed) == 1;
            drop(sender);
            committed
        });
        run_with(fake, batches, &to, &stop, cadence, &stats)?;
        Ok(watch.join().expect("no panic"))
    })?;
    assert!(committed_idle, "the idle partition committed its expiry");
    assert_eq!((fake.txn.entries(), stats.committed_offset.load(Ordering::Relaxed)), (0, 1));
    let lines = std::fs::read_to_string(dir.join("out.jsonl"))?;
    assert_eq!(lines.lines().count(), 2, "the record's output and the expiry's:\n{lines}");
    Ok(())
}

/// A deploy between two batches commits what the old version processed before the new
/// one processes anything, though the cadence asks for no commit.
#[test]
fn a_deploy_commits_the_old_versions_batch_before_the_new_one_runs() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut fake = Fake::new(&dir.path().join("state"), None)?;
    fake.deploys.push_back((3, "v2".into()));
    let to = destinations(dir.path())?;
    let stats = run(&mut fake, queued(vec![records(0..3), records(3..6)])?, &to, &StopSignal::default(), NEVER)?;
    assert_eq!(fake.batches, [("v1".into(), 0, 0), ("v2".into(), 3, 3)], "v2 ran after v1's batch committed");
    assert_eq!(stats.committed_offset.load(Ordering::Relaxed), 6, "the end committed v2's batch");
    assert_eq!(stats.switches.load(Ordering::Relaxed), 1);
    Ok(())
}

/// A partition lost with a batch in hand finishes the batch and commits nothing of it:
/// it is another host's already. Drained instead, the same batch is committed.
#[test]
fn a_lost_partition_skips_its_last_commit() -> anyhow::Result<()> {
    for lost in [true, false] {
        let dir = tempfile::tempdir()?;
        let mut fake = Fake::new(&dir.path().join("state"), None)?;
        let stop = Arc::new(StopSignal::default());
        fake.lost = lost.then(|| stop.clone());
        let to = destinations(dir.path())?;
        let stats = run(&mut fake, queued(vec![records(0..3)])?, &to, &stop, NEVER)?;
        let committed = (stats.committed_offset.load(Ordering::Relaxed), fake.txn.store().committed_offset()?);
        assert_eq!(committed, if lost { (0, 0) } else { (3, 3) }, "lost: {lost}");
        assert_eq!(stats.processed.load(Ordering::Relaxed), 3, "lost: {lost}");
    }
    Ok(())
}
