//! The poll loop ([`poll`]): records to their partitions, started partitions resumed,
//! backed-up ones paused and resumed, group offsets committed, until the topic is idle,
//! the host stops or the member fails.

use super::membership::{Membership, Resuming};
use super::record::source_record;
use super::resume::{resume_drained, resume_due};
use super::{KafkaOptions, POLL_TIMEOUT, Partitions, commit, member_failed, partition_list};
use crate::backoff::Backoff;
use crate::lock;
use crate::record::{NULL_KEY_HEADER, Stop, TOMBSTONE_HEADER};
use crate::source::events::RESERVED_HEADER;
use anyhow::Result;
use rdkafka::Message;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::message::BorrowedMessage;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How often the group's committed offsets follow the state's.
const GROUP_COMMIT_INTERVAL: Duration = Duration::from_secs(1);
/// How often every partition's offset goes to the group again, moved or not: a commit
/// may fail (one sent as a rebalance begins carries a generation that is over), and
/// librdkafka tells a manual asynchronous commit's failure only to its log, so a
/// partition without new records would keep a stale offset — a false lag — for good.
const GROUP_RECOMMIT_INTERVAL: Duration = Duration::from_secs(10);
/// The poll timeout while partitions are being started, so they resume promptly.
const STARTING_POLL_TIMEOUT: Duration = Duration::from_millis(5);

/// What the poll loop keeps between two polls.
pub(super) struct PollState {
    /// The last moment there was work: a record arrived, or a worker had some left.
    last_busy: Instant,
    last_commit: Instant,
    /// When every partition's offset last went to the group.
    last_recommit: Instant,
    last_flush: Instant,
    /// The offsets last committed to the group, by partition.
    group_offsets: BTreeMap<u32, u64>,
    /// Partitions paused because their worker's queue is full.
    backed_up: BTreeSet<u32>,
    /// Partitions are being restored: look for finished ones often, they are paused.
    starting: bool,
    /// Whether a record carrying a reserved header name was warned about.
    reserved_warned: bool,
}

/// The poll loop: records to partitions, started partitions resumed, backed-up ones
/// paused, group offsets committed. Returns how the partitions should stop.
pub(super) fn poll<P: Partitions + Send>(
    consumer: &BaseConsumer<Membership<P>>,
    options: &KafkaOptions,
    stopping: &AtomicBool,
) -> Result<Stop> {
    let context = consumer.context();
    let mut state = PollState::new(Instant::now());
    loop {
        if stopping.load(Ordering::Relaxed) {
            return Ok(Stop::Handover);
        }
        let message = consumer.poll(if state.starting { STARTING_POLL_TIMEOUT } else { POLL_TIMEOUT });
        if let Some(e) = lock(&context.failure).take() {
            return Err(e);
        }
        let mut guard = lock(&context.partitions);
        let partitions = guard.as_mut().expect("the poll loop holds them");
        let (resuming_any, all_stopped) = state.follow_starts(consumer, options, partitions)?;
        if all_stopped {
            // Every partition here stopped: the run ends in their errors, and a restart
            // (or the group moving them) takes them up again.
            return Ok(Stop::Handover);
        }
        let quiet = message.is_none();
        // A fatal error leaves a consumer that can never go on (it fetches nothing more,
        // so the next polls are quiet or errors): the member is dead.
        if (quiet || matches!(message, Some(Err(_))))
            && let Some(fatal) = consumer.client().fatal_error()
        {
            return Err(member_failed(options, fatal));
        }
        match message {
            Some(Ok(message)) => state.push(consumer, &options.topic, partitions, &message)?,
            // librdkafka retries by itself; say what happened and keep polling, unless
            // the error was fatal (looked at below).
            Some(Err(e)) => tracing::warn!("consuming {}: {e}", options.topic),
            None => {
                if partitions.starting() || resuming_any || !partitions.caught_up() {
                    state.last_busy = Instant::now();
                }
                // Idle only counts once partitions were assigned and every worker is done,
                // so the drain at the end does not keep the poll loop waiting.
                let idle_since = lock(&context.assigned_at).map(|at| at.max(state.last_busy));
                if options.stop_when_idle.zip(idle_since).is_some_and(|(idle, since)| since.elapsed() >= idle) {
                    return Ok(Stop::Drain);
                }
            }
        }
        // Partial batches go out when the topic is quiet, and at least every poll
        // timeout, so a slow partition's records do not wait for a busy one's.
        if quiet || !state.backed_up.is_empty() || state.last_flush.elapsed() >= POLL_TIMEOUT {
            partitions.flush(false)?;
            state.last_flush = Instant::now();
        }
        resume_drained(consumer, &options.topic, partitions, &mut state.backed_up)?;
        state.starting = partitions.starting();
        if options.commits_group_offsets && state.last_commit.elapsed() >= GROUP_COMMIT_INTERVAL {
            state.commit_group_offsets(consumer, &options.topic, partitions);
        }
    }
}

impl PollState {
    /// A poll loop's state as it starts, at `now`: nothing committed, nothing backed up.
    pub(super) fn new(now: Instant) -> Self {
        PollState {
            last_busy: now,
            last_commit: now,
            last_recommit: now,
            last_flush: now,
            group_offsets: BTreeMap::new(),
            backed_up: BTreeSet::new(),
            starting: false,
            reserved_warned: false,
        }
    }

    /// Resumes the partitions whose start completed (once the broker's offsets agree)
    /// and pauses those whose worker stopped alone; returns whether any partition still
    /// waits to resume, and whether some stopped and none is left here.
    fn follow_starts<P: Partitions + Send>(
        &mut self,
        consumer: &BaseConsumer<Membership<P>>,
        options: &KafkaOptions,
        partitions: &mut P,
    ) -> Result<(bool, bool)> {
        let mut resuming = lock(&consumer.context().resuming);
        for started in partitions.started(false)? {
            let due = Instant::now();
            resuming.insert(started.partition, Resuming { started, backoff: Backoff::new(options.retry_timeout), due });
        }
        resume_due(consumer, options, partitions, &mut resuming)?;
        let failed = partitions.failed()?;
        for &p in &failed {
            // Not read until it starts again (a restart, or a rebalance moving it).
            consumer.pause(&partition_list(&options.topic, p))?;
            self.backed_up.remove(&p);
            resuming.remove(&p);
        }
        Ok((!resuming.is_empty(), !failed.is_empty() && !partitions.owns_any()))
    }

    /// Hands `message`'s record to its partition, pausing the partition when that fills
    /// its worker's queue.
    fn push<C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
        topic: &str,
        partitions: &mut impl Partitions,
        message: &BorrowedMessage<'_>,
    ) -> Result<()> {
        self.last_busy = Instant::now();
        let p = message.partition() as u32;
        let (record, reserved) = source_record(message);
        if reserved && !std::mem::replace(&mut self.reserved_warned, true) {
            tracing::warn!(
                partition = p,
                "the record at offset {} {RESERVED_HEADER} ({NULL_KEY_HEADER} or {TOMBSTONE_HEADER}, which mark a \
                 record Kafka had no key or value for): dropped from it; further ones are dropped without a word",
                record.offset
            );
        }
        if partitions.push(record, false)? && self.backed_up.insert(p) {
            consumer.pause(&partition_list(topic, p))?;
        }
        Ok(())
    }

    /// Commits to the group the offsets the partitions' states reached since the last
    /// time, without waiting for the answer; all of them every
    /// [`GROUP_RECOMMIT_INTERVAL`].
    fn commit_group_offsets<C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
        topic: &str,
        partitions: &impl Partitions,
    ) {
        self.last_commit = Instant::now();
        let all = self.last_recommit.elapsed() >= GROUP_RECOMMIT_INTERVAL;
        if all {
            self.last_recommit = self.last_commit;
        }
        let due = self.offsets_to_commit(partitions.committed_offsets(), all);
        commit(consumer, topic, &due, CommitMode::Async);
    }

    /// Of the offsets the partitions' states `reached`, those to commit: the ones that
    /// moved since the last commit, or `all`.
    pub(super) fn offsets_to_commit(&mut self, reached: Vec<(u32, u64)>, all: bool) -> Vec<(u32, u64)> {
        if all {
            self.group_offsets.clear();
        }
        reached.into_iter().filter(|&(p, offset)| self.group_offsets.insert(p, offset) != Some(offset)).collect()
    }
}
