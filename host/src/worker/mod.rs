//! A partition worker: the only code that touches its partition's state.
//!
//! The worker takes batches of its partition's records, runs each through the
//! operator inside a record scope of the partition's [`Transaction`], writes the
//! batch's outputs and dead letters, and then commits the state writes together with
//! the next offset in one RocksDB write batch. It owns that ordering — outputs
//! before commit, commit after every batch — and the partition's live counters.
//!
//! Checkpoints happen between batches, after a commit, so a snapshot always holds
//! whole batches and the offset committed with them.
//!
//! It does not own where records come from (the [source](crate::source)) or how the
//! operator runs (the [operator](crate::operator)).

use crate::checkpoint::Checkpointer;
use crate::operator::{Operator, Outcome};
use crate::sink::{self, LineSink, Sink};
use crate::source::SourceRecord;
use anyhow::Result;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Receiver;

/// A partition's live counters, read by the running summary while the worker runs.
#[derive(Debug, Default)]
pub struct PartitionStats {
    /// Records processed (emitted or dead-lettered) by this run.
    pub processed: AtomicU64,
    /// Records sent to the dead-letter file by this run.
    pub dead_letters: AtomicU64,
    /// The next offset to process, as last committed.
    pub committed_offset: AtomicU64,
    /// State entries held, as of the last commit.
    pub entries: AtomicU64,
    /// Checkpoints completed by this run.
    pub checkpoints: AtomicU64,
    /// The offset of the newest completed checkpoint.
    pub checkpoint_offset: AtomicU64,
    /// Bytes uploaded by this run's checkpoints.
    pub uploaded_bytes: AtomicU64,
    /// Checkpoints that failed (each logged).
    pub checkpoint_failures: AtomicU64,
}

/// Where a worker sends what it produces.
pub struct Destinations<'a> {
    /// The job's sink.
    pub sink: &'a Sink,
    /// The dead-letter file.
    pub dead_letters: &'a LineSink,
    /// The operator's name, recorded in dead letters.
    pub operator: &'a str,
}

/// Processes batches from `batches` until the sender goes away, committing after each
/// and letting `checkpointer` checkpoint after a commit when one is due; at the end,
/// a last checkpoint holds the final state.
pub fn run(
    operator: &mut dyn Operator,
    batches: Receiver<Vec<SourceRecord>>,
    to: &Destinations<'_>,
    stats: &PartitionStats,
    mut checkpointer: Option<&mut Checkpointer>,
) -> Result<()> {
    let mut dead = Vec::new();
    for batch in batches {
        let mut outputs = Vec::new();
        let Some(last) = batch.last() else { continue };
        let next_offset = last.offset + 1;
        let mut dead_count = 0;
        for record in &batch {
            operator.state().begin_record(&record.key);
            let outcome = operator.process(record);
            operator.state().end_record(matches!(outcome, Ok(Outcome::Emitted(_))));
            match outcome? {
                Outcome::Emitted(outs) => outputs.extend(outs.into_iter().map(|o| (record, o))),
                Outcome::Rejected(reason) => {
                    sink::format_dead_letter(&mut dead, record, to.operator, "rejected", &reason);
                    dead_count += 1;
                }
                Outcome::Trapped(reason) => {
                    tracing::warn!(partition = record.partition, offset = record.offset, "operator trapped: {reason}");
                    sink::format_dead_letter(&mut dead, record, to.operator, "trapped", &reason);
                    dead_count += 1;
                }
            }
        }
        // Outputs first, then state: a crash in between replays the batch (outputs at
        // least once) but never leaves state ahead of what was emitted.
        to.sink.write(&outputs)?;
        to.dead_letters.write(&dead)?;
        dead.clear();
        operator.state().commit(next_offset)?;

        stats.processed.fetch_add(batch.len() as u64, Ordering::Relaxed);
        stats.dead_letters.fetch_add(dead_count, Ordering::Relaxed);
        stats.committed_offset.store(next_offset, Ordering::Relaxed);
        stats.entries.store(operator.state().entries(), Ordering::Relaxed);
        if let Some(checkpointer) = checkpointer.as_deref_mut() {
            checkpointer.after_commit(operator.state().store(), stats);
        }
    }
    if let Some(checkpointer) = checkpointer {
        checkpointer.finish(operator.state().store(), stats)?;
    }
    Ok(())
}
