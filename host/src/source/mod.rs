//! Where records come from and which partition each belongs to.
//!
//! This module owns the producers of records: the embedded sources — a deterministic
//! [fleet generator](generator) and a [JSONL file](mod@file) — with the [`dispatch`] loop
//! that turns one such sequence into a partitioned log (each record goes to partition
//! `murmur2(key) % partitions`, Kafka's default partitioner, at the next offset of that
//! partition), and the [Kafka](kafka) consumer, whose records keep the broker's
//! partition and offset.
//!
//! A source drives partition ownership through the narrow [`Partitions`] trait it
//! defines here: assign, revoke, push records, flush. The
//! [worker](crate::worker) module's router implements it; tests implement it with a
//! fake, so the rebalance paths are tested without a broker. This module does not own
//! routing, processing or state.

pub(crate) mod events;
pub mod file;
pub mod generator;
pub mod kafka;

use crate::record::{RawRecord, RestoredFrom, SourceRecord, Stop};
use crate::stats::RebalanceChange;
use anyhow::Result;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The partitions a source feeds, as the source sees them: started on assignment,
/// stopped on revocation, fed records. Implemented by the
/// [worker](crate::worker) module's router.
pub trait Partitions {
    /// The job's partition count.
    fn count(&self) -> u32;

    /// Starts `partitions`: their state is restored in the background, and they take
    /// records once [`Partitions::started`] returns them, each at the offset its state
    /// holds.
    fn assign(&mut self, partitions: &[u32]) -> Result<()>;

    /// The partitions whose start completed since the last call, each taking records
    /// from its `offset`; with `wait`, waits until no partition is starting. A start
    /// that failed is an error (once).
    fn started(&mut self, wait: bool) -> Result<Vec<Started>>;

    /// The partitions that stopped alone since the last call: each one's records
    /// are dropped from now on (a Kafka source pauses it), its state stays as its last
    /// commit left it. One the operator stopped (see
    /// [`OperatorStopped`](crate::operator::OperatorStopped)) stays stopped, and
    /// [`Partitions::finish`] reports why; one whose Kafka transactions another producer
    /// took over starts again after a backoff, and [`Partitions::started`] returns it
    /// when it runs. A worker that failed for any other reason is the error.
    fn failed(&mut self) -> Result<Vec<u32>>;
    /// Stops `partitions` as `how` says ([`Stop::Handover`] or [`Stop::Lost`]), all at
    /// once, dropping what waits for them here: each is told before any is waited for,
    /// and one still starting is given up without waiting for its restore. Returns the
    /// offset committed with the state of each one that ran here, and the first failure;
    /// every one is stopped even when one fails.
    fn revoke(&mut self, partitions: &[u32], how: Stop) -> (Vec<(u32, u64)>, Result<()>);
    /// Stops `partition` alone for `error`, which the source found (its log cannot
    /// serve the partition's state): like one the operator stopped, it is returned by
    /// [`Partitions::failed`], reported with `error` at the end, and the others go on.
    fn stop_alone(&mut self, partition: u32, error: anyhow::Error) -> Result<()>;

    /// Queues `record` for its partition, handing full batches to its worker. When the
    /// worker's queue is full, `wait` says whether to wait or keep the batch here.
    /// Returns whether the partition is now backed up (a full batch waits here): time
    /// to pause reading it. A record of a partition not running here, or one its state
    /// already holds, is dropped.
    fn push(&mut self, record: SourceRecord, wait: bool) -> Result<bool>;

    /// Hands every partition's waiting records to its worker, partial batches too;
    /// `wait` as for [`Partitions::push`].
    fn flush(&mut self, wait: bool) -> Result<()>;

    /// Whether a full batch of `partition` still waits for room in its worker's queue.
    fn backed_up(&self, partition: u32) -> bool;

    /// Whether `partition` is starting or running here.
    fn owns(&self, partition: u32) -> bool;
    /// Whether any partition is starting or running here.
    fn owns_any(&self) -> bool;

    /// Whether any partition is still starting.
    fn starting(&self) -> bool;

    /// Whether every running partition has processed all it was handed.
    fn caught_up(&self) -> bool;

    /// The offset each running partition's state holds.
    fn committed_offsets(&self) -> Vec<(u32, u64)>;

    /// Records how far `partition`'s state is behind `high_watermark`, the end of its
    /// log as the broker last reported it.
    fn record_lag(&self, partition: u32, high_watermark: u64);

    /// Records a rebalance that made `change` to `partitions` partitions of this member
    /// in `took`.
    fn record_rebalance(&self, change: RebalanceChange, partitions: usize, took: Duration);

    /// Ends the run as `outcome` says: after the source ended ([`Stop::Drain`]) every
    /// waiting record is handed over and processed; otherwise (and after an error)
    /// partitions hand over. Every partition is stopped; returns the offset each one's
    /// state holds at the end, or the first error.
    fn finish(&mut self, outcome: Result<Stop>) -> Result<Vec<(u32, u64)>>;
}

/// A partition that has started: its worker runs and takes records from `offset`.
#[derive(Debug, Clone)]
pub struct Started {
    /// The partition.
    pub partition: u32,
    /// The offset stored with its state: the first record it needs.
    pub offset: u64,
    /// Where its state came from.
    pub restored_from: RestoredFrom,
    /// When it was assigned (its pause, for a Kafka source, runs from here).
    pub assigned: Instant,
    /// From the assignment to the running worker.
    pub took: Duration,
}

/// The partition Kafka's default partitioner picks for `key`:
/// `murmur2(key) & 0x7fffffff % partitions`.
pub fn partition_for(key: &[u8], partitions: u32) -> u32 {
    (murmur2(key) & 0x7fff_ffff) % partitions
}

/// Kafka's murmur2 hash (`org.apache.kafka.common.utils.Utils.murmur2`), so that the
/// embedded sources partition keys exactly as a Kafka producer would.
fn murmur2(data: &[u8]) -> u32 {
    const M: u32 = 0x5bd1_e995;
    let mut h: u32 = 0x9747_b28c ^ data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes(chunk.try_into().expect("chunks of four"));
        k = k.wrapping_mul(M);
        k ^= k >> 24;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M) ^ k;
    }
    let tail = chunks.remainder();
    if !tail.is_empty() {
        for (i, byte) in tail.iter().enumerate() {
            h ^= (*byte as u32) << (8 * i);
        }
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^ (h >> 15)
}

/// An embedded source's records made a partitioned log, as Kafka's default
/// partitioner and a broker would: each record goes to partition
/// [`partition_for`]`(key)`, at that partition's next offset.
#[derive(Debug, Clone)]
pub struct PartitionedLog {
    next_offset: Vec<u64>,
}

impl PartitionedLog {
    /// A log of `partitions` empty partitions.
    pub fn new(partitions: u32) -> Self {
        PartitionedLog { next_offset: vec![0; partitions as usize] }
    }

    /// Appends `raw` to its partition: it, at its partition and offset.
    pub fn place(&mut self, raw: RawRecord) -> SourceRecord {
        let p = partition_for(&raw.key, self.next_offset.len() as u32);
        let offset = self.next_offset[p as usize];
        self.next_offset[p as usize] += 1;
        raw.at(p, offset)
    }
}

/// How [`dispatch`] paces and batches.
#[derive(Debug, Clone)]
pub struct DispatchOptions {
    /// Records per second across all partitions; `None` is as fast as workers take them.
    pub rate: Option<f64>,
    /// Stop after this much wall-clock time.
    pub duration: Option<Duration>,
}

/// Starts every partition of `partitions`, then reads `records` in order, assigns each
/// its partition and offset, and pushes it to its partition. Returns when the source
/// ends or the duration passes (partitions drain what they were given), or when
/// `stopping` is set (partitions hand over).
pub fn dispatch(
    records: impl Iterator<Item = Result<RawRecord>>,
    partitions: &mut impl Partitions,
    options: &DispatchOptions,
    stopping: &AtomicBool,
) -> Result<()> {
    let outcome = feed(records, partitions, options, stopping);
    partitions.finish(outcome).map(drop)
}

fn feed(
    records: impl Iterator<Item = Result<RawRecord>>,
    partitions: &mut impl Partitions,
    options: &DispatchOptions,
    stopping: &AtomicBool,
) -> Result<Stop> {
    let count = partitions.count();
    partitions.assign(&(0..count).collect::<Vec<_>>())?;
    partitions.started(true)?;
    let mut log = PartitionedLog::new(count);
    let started = Instant::now();
    for (read, raw) in records.enumerate() {
        let raw = raw?;
        if stopping.load(Ordering::Relaxed) {
            return Ok(Stop::Handover);
        }
        if options.duration.is_some_and(|d| started.elapsed() >= d) {
            break;
        }
        if let Some(rate) = options.rate {
            // Past what a Duration holds (at the slowest rate, after 10^16 records): never.
            let due = Duration::try_from_secs_f64(read as f64 / rate).unwrap_or(Duration::MAX);
            if let Some(wait) = due.checked_sub(started.elapsed()) {
                // Hand over what is buffered before idling so workers stay current.
                partitions.flush(true)?;
                std::thread::sleep(wait);
            }
        }
        partitions.push(log.place(raw), true)?;
        if !partitions.owns_any() {
            // Every partition stopped alone: the run ends in their errors.
            return Ok(Stop::Handover);
        }
    }
    Ok(Stop::Drain)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur2_matches_kafka() {
        // Vectors from Kafka's UtilsTest.
        assert_eq!(murmur2(b"21") as i32, -973932308);
        assert_eq!(murmur2(b"foobar") as i32, -790332482);
        assert_eq!(murmur2(b"a-little-bit-long-string") as i32, -985981536);
        assert_eq!(murmur2(b"a-little-bit-longer-string") as i32, -1486304829);
        assert_eq!(murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8") as i32, -58897971);
    }
}
