//! Resuming a started partition where its state is ([`resume_offset`]), checked against
//! the log's range, tried again while the broker fails to answer; and resuming a
//! backed-up partition once its worker has room.

use super::membership::Resuming;
use super::{KafkaOptions, METADATA_TIMEOUT, Partitions, Started, partition_list};
use crate::config::OutOfRange;
use crate::source::events::{OUT_OF_RANGE, RESUME_RETRY, RESUMED};
use anyhow::{Context, Result, bail};
use rdkafka::Offset;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// How long moving a partition to the offset its state holds may take.
const SEEK_TIMEOUT: Duration = Duration::from_secs(10);

/// Where partition `p`, whose state holds offset `stored`, resumes in a log whose
/// records run from `low` to `high` (its end), or why it may not: a state past the end
/// belongs to another log; a state before the start lost the records retention deleted,
/// which `on_gap` decides about. A state at offset 0 has read nothing, so it starts at
/// the earliest record there is.
pub fn resume_offset(p: u32, stored: u64, (low, high): (u64, u64), on_gap: OutOfRange) -> Result<u64> {
    if stored > high {
        bail!(
            "partition {p}: its state holds offset {stored}, past the end of its log ({high}): this is another \
             topic, or the topic was recreated since the state was written; the state belongs to the old log, so \
             the partition stops rather than mix them (run the job with a new state dir and checkpoint store)"
        );
    }
    if stored >= low || stored == 0 {
        return Ok(stored.max(low));
    }
    let lost = low - stored;
    match on_gap {
        OutOfRange::Fail => bail!(
            "partition {p}: {OUT_OF_RANGE}: its state holds offset {stored}, but the log now starts at {low} (it \
             holds {low}..{high}): the {lost} records between were deleted (retention) before this job read them. \
             Set [source] offset_out_of_range = \"earliest\" to resume at {low} without them"
        ),
        OutOfRange::Earliest => {
            tracing::warn!(
                partition = p,
                "{OUT_OF_RANGE}: its state holds offset {stored}, the log starts at {low}: resuming there, {lost} \
                 records never read ([source] offset_out_of_range = \"earliest\")"
            );
            Ok(low)
        }
    }
}

/// The offsets partition `p` of `topic` holds: its earliest and its end.
fn watermarks<C: ConsumerContext>(consumer: &BaseConsumer<C>, topic: &str, p: u32) -> Result<(u64, u64)> {
    let (low, high) = consumer
        .fetch_watermarks(topic, p as i32, METADATA_TIMEOUT)
        .with_context(|| format!("reading the offsets partition {p} of {topic} holds"))?;
    Ok((low.max(0) as u64, high.max(0) as u64))
}

/// Resumes the partitions of `resuming` whose turn it is: each one is moved to where
/// its state is ([`resume_offset`]; one its log cannot serve stops alone). When the
/// broker fails to answer, the partition is tried again after its next [`Backoff`]
/// wait, or past `[checkpoint] restore_retry_timeout` stops alone; and the others wait
/// for the next poll, so that one call of this costs the poll loop at most one of the
/// broker's timeouts.
pub(super) fn resume_due<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    options: &KafkaOptions,
    partitions: &mut impl Partitions,
    resuming: &mut BTreeMap<u32, Resuming>,
) -> Result<()> {
    let topic = &options.topic;
    let due: Vec<u32> = resuming.iter().filter(|(_, r)| r.due <= Instant::now()).map(|(&p, _)| p).collect();
    for p in due {
        let Some(entry) = resuming.get_mut(&p).filter(|_| partitions.owns(p)) else {
            resuming.remove(&p);
            continue;
        };
        let started = &entry.started;
        let failed = match watermarks(consumer, topic, p) {
            Ok(range) => match resume_offset(p, started.offset, range, options.offset_out_of_range) {
                Ok(offset) => resume(consumer, topic, started, offset).err(),
                // Left paused: the others go on.
                Err(e) => {
                    resuming.remove(&p);
                    partitions.stop_alone(p, e.context(format!("topic {topic}")))?;
                    continue;
                }
            },
            Err(e) => Some(e),
        };
        let Some(e) = failed else {
            resuming.remove(&p);
            continue;
        };
        match entry.backoff.next_wait() {
            Some(wait) => {
                tracing::warn!(
                    partition = p,
                    "partition {p} {RESUME_RETRY} {}s, for up to {}s in all ([checkpoint] restore_retry_timeout); it \
                     stays paused, the others go on: {e:#}",
                    wait.as_secs(),
                    entry.backoff.timeout().as_secs()
                );
                entry.due = Instant::now() + wait;
            }
            None => {
                let tried = entry.backoff.elapsed().as_secs_f64();
                resuming.remove(&p);
                let why = format!("resuming it failed for {tried:.0}s of tries ([checkpoint] restore_retry_timeout)");
                partitions.stop_alone(p, e.context(why))?;
            }
        }
        // The broker failed this partition; the others may wait for the next poll.
        break;
    }
    Ok(())
}

/// Moves `started`'s partition, assigned paused at offset 0, to `offset` — where its
/// state is, or where [`resume_offset`] says when its log no longer holds that — and
/// resumes it.
pub(super) fn resume<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    started: &Started,
    offset: u64,
) -> Result<()> {
    let p = started.partition;
    consumer.seek(topic, p as i32, Offset::Offset(offset as i64), SEEK_TIMEOUT)?;
    consumer.resume(&partition_list(topic, p))?;
    tracing::info!(
        partition = p,
        "{RESUMED} {offset} after {:.0} ms paused (state from {}, ready in {:.0} ms)",
        started.assigned.elapsed().as_secs_f64() * 1e3,
        started.restored_from,
        started.took.as_secs_f64() * 1e3
    );
    Ok(())
}

/// Resumes the partitions of `backed_up` whose batches found room in their worker's
/// queue (and that still run here).
pub(super) fn resume_drained<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    partitions: &impl Partitions,
    backed_up: &mut BTreeSet<u32>,
) -> Result<()> {
    for p in backed_up.clone() {
        if !partitions.backed_up(p) {
            backed_up.remove(&p);
            // librdkafka rewinds a paused partition to just after the last record it
            // handed out, so reading goes on where it stopped.
            if partitions.owns(p) {
                consumer.resume(&partition_list(topic, p))?;
            }
        }
    }
    Ok(())
}
