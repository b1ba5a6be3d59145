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

use crate::worker::{Started, Stop, Workers};
use anyhow::Result;
use std::sync::atomic::{AtomicBool, Ordering};
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
}

/// How far a source got.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DispatchReport {
    /// Records read from the source, including those a partition had already processed.
    pub read: u64,
    /// Records skipped because their partition's state already reflects them.
    pub skipped: u64,
    /// Times a partition's offsets jumped ahead: records never delivered, which a
    /// compacted topic does by design and a faulty broker by accident.
    pub gaps: u64,
}

/// Records on their way to their partition's worker, a batch at a time, and the
/// [`Workers`] they go to. A record below the offset its partition's state holds is
/// counted and dropped here, for every source: that state already reflects it.
pub struct Batches {
    workers: Workers,
    /// The next offset each partition running here takes; `None`: not running here.
    next: Vec<Option<u64>>,
    pending: Vec<Vec<SourceRecord>>,
    batch_size: usize,
    report: DispatchReport,
}

impl Batches {
    /// Batches of at most `batch_size` records for the `partitions` partitions of a
    /// job, none of them running yet.
    pub fn new(workers: Workers, partitions: u32, batch_size: usize) -> Self {
        Batches {
            workers,
            next: vec![None; partitions as usize],
            pending: vec![Vec::new(); partitions as usize],
            batch_size,
            report: DispatchReport::default(),
        }
    }

    /// The workers the batches go to.
    pub fn workers(&mut self) -> &mut Workers {
        &mut self.workers
    }

    /// The job's partition count.
    pub fn partitions(&self) -> u32 {
        self.next.len() as u32
    }

    /// From now on `started`'s partition takes records from its offset on.
    pub fn open(&mut self, started: &Started) {
        self.next[started.partition as usize] = Some(started.offset);
    }

    /// `partition` no longer runs here: what waits for it is dropped (its next owner
    /// reads it again from the offset stored with the state).
    pub fn close(&mut self, partition: u32) {
        self.next[partition as usize] = None;
        self.pending[partition as usize].clear();
    }

    /// Queues `record` for its partition's worker, handing over full batches. When the
    /// worker's queue is full, `wait` says whether to wait for it or keep the batch
    /// here ([`Batches::backed_up`]). A record of a partition not running here, or
    /// one its state already holds, is dropped.
    pub fn push(&mut self, record: SourceRecord, wait: bool) -> Result<()> {
        self.report.read += 1;
        let p = record.partition as usize;
        match self.next[p] {
            Some(next) if record.offset >= next => {
                if record.offset > next {
                    if self.report.gaps == 0 {
                        tracing::warn!(
                            partition = p,
                            "offsets jump from {next} to {}: the source did not deliver the records between \
                             (compaction and transaction markers do this by design; otherwise the broker is at fault)",
                            record.offset
                        );
                    }
                    self.report.gaps += 1;
                }
                self.next[p] = Some(record.offset + 1);
            }
            Some(_) => {
                self.report.skipped += 1;
                return Ok(());
            }
            None => return Ok(()),
        }
        self.pending[p].push(record);
        if self.pending[p].len() >= self.batch_size { self.hand_over(p, wait, false) } else { Ok(()) }
    }

    /// Hands every partition's waiting records to its worker, partial batches too;
    /// `wait` as for [`Batches::push`].
    pub fn flush(&mut self, wait: bool) -> Result<()> {
        (0..self.pending.len()).try_for_each(|p| self.hand_over(p, wait, true))
    }

    /// Whether every partition running here has processed all it was handed.
    pub fn caught_up(&self) -> bool {
        self.next.iter().enumerate().all(|(p, next)| match next {
            Some(next) => {
                self.pending[p].is_empty() && self.workers.committed_offset(p as u32).is_none_or(|c| c >= *next)
            }
            None => true,
        })
    }

    /// Whether a full batch of `partition` waits here for room in its worker's queue:
    /// time to pause reading it.
    pub fn backed_up(&self, partition: u32) -> bool {
        self.pending[partition as usize].len() >= self.batch_size
    }

    /// What was read and skipped so far.
    pub fn report(&self) -> DispatchReport {
        self.report.clone()
    }

    /// Ends the run as `outcome` says: after the source ended ([`Stop::Drain`]) every
    /// waiting record is handed over and processed; otherwise (and after an error)
    /// workers hand over. Every partition is stopped; the first error is returned, the
    /// workers' own before the source's (a worker that failed is why the source could
    /// not hand it records).
    pub fn finish(&mut self, outcome: Result<Stop>) -> Result<()> {
        let how = *outcome.as_ref().unwrap_or(&Stop::Handover);
        let flushed = if how == Stop::Drain { self.flush(true) } else { Ok(()) };
        let stopped = self.workers.stop_all(if flushed.is_ok() { how } else { Stop::Handover });
        stopped.and(flushed).and(outcome.map(drop))
    }

    fn hand_over(&mut self, p: usize, wait: bool, partial: bool) -> Result<()> {
        while self.pending[p].len() >= self.batch_size || (partial && !self.pending[p].is_empty()) {
            let at = self.pending[p].len().min(self.batch_size);
            let rest = self.pending[p].split_off(at);
            let batch = std::mem::replace(&mut self.pending[p], rest);
            if wait {
                self.workers.send(p as u32, batch)?;
            } else if let Some(mut batch) = self.workers.try_send(p as u32, batch)? {
                batch.append(&mut self.pending[p]);
                self.pending[p] = batch;
                break;
            }
        }
        Ok(())
    }
}

/// Starts every partition of `batches`, then reads `records` in order, assigns each
/// its partition and offset, and hands it to its partition's worker. Returns when the
/// source ends or the duration passes (workers drain what they were given), or when
/// `stopping` is set (workers hand over).
pub fn dispatch(
    records: impl Iterator<Item = Result<RawRecord>>,
    batches: &mut Batches,
    options: &DispatchOptions,
    stopping: &AtomicBool,
) -> Result<()> {
    let outcome = feed(records, batches, options, stopping);
    batches.finish(outcome)
}

fn feed(
    records: impl Iterator<Item = Result<RawRecord>>,
    batches: &mut Batches,
    options: &DispatchOptions,
    stopping: &AtomicBool,
) -> Result<Stop> {
    let partitions = batches.partitions();
    batches.workers().start(&(0..partitions).collect::<Vec<_>>())?;
    for started in batches.workers().wait_started()? {
        batches.open(&started);
    }
    let mut next_offset = vec![0u64; partitions as usize];
    let started = Instant::now();
    for raw in records {
        let raw = raw?;
        if stopping.load(Ordering::Relaxed) {
            return Ok(Stop::Handover);
        }
        if options.duration.is_some_and(|d| started.elapsed() >= d) {
            break;
        }
        if let Some(rate) = options.rate {
            let due = Duration::from_secs_f64(batches.report().read as f64 / rate);
            if let Some(wait) = due.checked_sub(started.elapsed()) {
                // Hand over what is buffered before idling so workers stay current.
                batches.flush(true)?;
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
        batches.push(record, true)?;
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
