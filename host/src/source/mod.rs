//! Where records come from and which partition each belongs to.
//!
//! This module owns the embedded sources — a deterministic [fleet
//! generator](generator) and a [JSONL file](file) — the [Kafka](kafka) source, and the
//! [`dispatch`] loop that turns one such sequence into a partitioned log: each
//! record goes to partition `murmur2(key) % partitions` (Kafka's default
//! partitioner), gets the next offset of that partition, and is handed to the
//! partition's worker in batches. A partition whose state already reflects a record
//! (its offset is below the offset stored with the state) never receives it again.
//!
//! It does not own processing or state; workers do.

pub mod file;
pub mod generator;
pub mod kafka;

use anyhow::Result;
use std::sync::mpsc::SyncSender;
use std::time::{Duration, Instant};

/// A record before it is placed in a partition.
#[derive(Debug, Clone, PartialEq)]
pub struct RawRecord {
    /// The partitioning key (empty for a record without one, like Kafka's null key).
    pub key: Vec<u8>,
    /// The payload.
    pub value: Vec<u8>,
    /// Event time, milliseconds since the Unix epoch.
    pub timestamp_ms: i64,
}

/// A record at its place in the partitioned log.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceRecord {
    /// The partition it was assigned to.
    pub partition: u32,
    /// Its offset within the partition.
    pub offset: u64,
    /// The partitioning key.
    pub key: Vec<u8>,
    /// The payload.
    pub value: Vec<u8>,
    /// Event time, milliseconds since the Unix epoch.
    pub timestamp_ms: i64,
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

/// How [`dispatch`] paces and batches.
#[derive(Debug, Clone)]
pub struct DispatchOptions {
    /// Records per second across all partitions; `None` is as fast as workers take them.
    pub rate: Option<f64>,
    /// Stop after this much wall-clock time.
    pub duration: Option<Duration>,
    /// The most records handed to a worker at once.
    pub batch_size: usize,
}

/// How far [`dispatch`] got.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DispatchReport {
    /// Records read from the source, including those a partition had already processed.
    pub read: u64,
    /// Records skipped because their partition's state already reflects them.
    pub skipped: u64,
}

/// Records on their way to their partition's worker, a batch at a time. A record
/// below the offset stored with its partition's state is counted and dropped here,
/// for every source: that state already reflects it.
pub struct Batches<'a> {
    workers: &'a [SyncSender<Vec<SourceRecord>>],
    start_offsets: &'a [u64],
    pending: Vec<Vec<SourceRecord>>,
    batch_size: usize,
    report: DispatchReport,
}

impl<'a> Batches<'a> {
    /// Batches of at most `batch_size` records for `workers`, one per partition, each
    /// partition starting at `start_offsets[p]`.
    pub fn new(workers: &'a [SyncSender<Vec<SourceRecord>>], start_offsets: &'a [u64], batch_size: usize) -> Self {
        Batches {
            workers,
            start_offsets,
            pending: vec![Vec::new(); workers.len()],
            batch_size,
            report: DispatchReport::default(),
        }
    }

    /// Queues `record` for its partition's worker (or skips it, see above), handing
    /// over the batch once it is full. Returns false when that worker has gone.
    pub fn push(&mut self, record: SourceRecord) -> bool {
        self.report.read += 1;
        let p = record.partition as usize;
        if record.offset < self.start_offsets[p] {
            self.report.skipped += 1;
            return true;
        }
        self.pending[p].push(record);
        self.pending[p].len() < self.batch_size || self.send(p)
    }

    /// Hands every partial batch to its worker. Returns false when a worker has gone.
    pub fn flush(&mut self) -> bool {
        (0..self.pending.len()).all(|p| self.send(p))
    }

    /// What was read and skipped so far.
    pub fn report(&self) -> DispatchReport {
        self.report.clone()
    }

    fn send(&mut self, p: usize) -> bool {
        self.pending[p].is_empty() || self.workers[p].send(std::mem::take(&mut self.pending[p])).is_ok()
    }
}

/// Reads `records` in order, assigns each its partition and offset, and sends the
/// records at or beyond `start_offsets[partition]` to `workers[partition]` in batches.
/// Returns when the source ends, the duration passes, or every worker has gone.
pub fn dispatch(
    records: impl Iterator<Item = Result<RawRecord>>,
    start_offsets: &[u64],
    workers: &[SyncSender<Vec<SourceRecord>>],
    options: &DispatchOptions,
) -> Result<DispatchReport> {
    let partitions = workers.len() as u32;
    let mut next_offset = vec![0u64; workers.len()];
    let mut batches = Batches::new(workers, start_offsets, options.batch_size);
    let started = Instant::now();
    for raw in records {
        let raw = raw?;
        if options.duration.is_some_and(|d| started.elapsed() >= d) {
            break;
        }
        if let Some(rate) = options.rate {
            let due = Duration::from_secs_f64(batches.report().read as f64 / rate);
            if let Some(wait) = due.checked_sub(started.elapsed()) {
                // Hand over what is buffered before idling so workers stay current.
                if !batches.flush() {
                    return Ok(batches.report());
                }
                std::thread::sleep(wait);
            }
        }
        let p = partition_for(&raw.key, partitions) as usize;
        let offset = next_offset[p];
        next_offset[p] += 1;
        let record = SourceRecord {
            partition: p as u32,
            offset,
            key: raw.key,
            value: raw.value,
            timestamp_ms: raw.timestamp_ms,
        };
        if !batches.push(record) {
            return Ok(batches.report());
        }
    }
    batches.flush();
    Ok(batches.report())
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

    #[test]
    fn dispatch_skips_what_each_partition_already_holds() {
        let records = (0..100u32).map(|i| {
            Ok(RawRecord { key: format!("k{}", i % 7).into_bytes(), value: i.to_be_bytes().to_vec(), timestamp_ms: 0 })
        });
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..3).map(|_| std::sync::mpsc::sync_channel(1000)).unzip();
        let options = DispatchOptions { rate: None, duration: None, batch_size: 4 };
        let report = dispatch(records, &[0, 5, 1000], &senders, &options).unwrap();
        drop(senders);
        let got: Vec<Vec<SourceRecord>> = receivers.iter().map(|r| r.iter().flatten().collect()).collect();
        assert_eq!(report.read, 100);
        assert!(got[2].is_empty());
        assert_eq!(got[1].first().map(|r| r.offset), Some(5));
        for (p, records) in got.iter().enumerate() {
            assert!(records.iter().all(|r| partition_for(&r.key, 3) == p as u32));
            assert!(records.windows(2).all(|w| w[1].offset == w[0].offset + 1));
        }
        assert_eq!(report.skipped as usize + got.iter().map(Vec::len).sum::<usize>(), 100);
    }
}
