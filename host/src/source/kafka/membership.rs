//! This member's side of its group ([`Membership`]): the rebalance callbacks, which run
//! inside librdkafka's poll and start and stop partitions before the assignment
//! changes, and librdkafka's errors and statistics. What the loop around the poll does
//! is `poll`'s.

use super::{Partitions, Started, commit};
use crate::backoff::Backoff;
use crate::lock;
use crate::record::Stop;
use crate::source::events::{ASSIGNED, PARTITIONS_ADDED, REVOKED};
use crate::stats::RebalanceChange;
use anyhow::{Result, bail};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// This member's side of the group: it owns the [`Partitions`] so that rebalance
/// callbacks, which run inside `poll`, can start and stop partitions before the
/// assignment changes.
pub(super) struct Membership<P> {
    pub(super) topic: String,
    /// `None` once the poll loop has ended and taken them back.
    pub(super) partitions: Mutex<Option<P>>,
    /// When partitions were last assigned: an idle topic only counts from then.
    pub(super) assigned_at: Mutex<Option<Instant>>,
    rebalances: AtomicU64,
    /// [`KafkaOptions::commits_group_offsets`].
    commits_group_offsets: bool,
    /// The first failure inside a callback; the poll loop returns it.
    pub(super) failure: Mutex<Option<anyhow::Error>>,
    /// Started partitions waiting to resume, by partition; a revocation drops its own.
    pub(super) resuming: Mutex<BTreeMap<u32, Resuming>>,
}

impl<P> Membership<P> {
    pub(super) fn new(topic: &str, partitions: P, commits_group_offsets: bool) -> Self {
        Membership {
            topic: topic.to_string(),
            partitions: Mutex::new(Some(partitions)),
            assigned_at: Mutex::default(),
            rebalances: AtomicU64::new(0),
            commits_group_offsets,
            failure: Mutex::default(),
            resuming: Mutex::default(),
        }
    }
}

/// A started partition, paused until the broker told where its log is and moved it to
/// where its state is.
pub(super) struct Resuming {
    pub(super) started: Started,
    /// The waits between tries after the broker failed.
    pub(super) backoff: Backoff,
    /// When to try next.
    pub(super) due: Instant,
}

impl<P: Partitions + Send> ClientContext for Membership<P> {
    /// librdkafka's client errors (a broker unreachable, a request timed out) go to the
    /// job's log; librdkafka keeps reconnecting by itself.
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        tracing::warn!("Kafka consumer of {}: {error}: {reason}", self.topic);
    }

    /// librdkafka's statistics carry each partition's high watermark: the lag is how far
    /// the state's offset is behind it.
    fn stats(&self, statistics: rdkafka::Statistics) {
        let Some(topic) = statistics.topics.get(&self.topic) else { return };
        let owner = lock(&self.partitions);
        let Some(owner) = owner.as_ref() else { return };
        for (&p, partition) in &topic.partitions {
            if let (Ok(p), Ok(high)) = (u32::try_from(p), u64::try_from(partition.hi_offset)) {
                owner.record_lag(p, high);
            }
        }
    }
}

impl<P: Partitions + Send> ConsumerContext for Membership<P> {
    fn rebalance(&self, consumer: &BaseConsumer<Self>, err: RDKafkaRespErr, tpl: &mut TopicPartitionList) {
        let began = Instant::now();
        let rebalance = self.rebalances.fetch_add(1, Ordering::Relaxed) + 1;
        let cooperative = matches!(consumer.rebalance_protocol(), RebalanceProtocol::Cooperative);
        let partitions: Vec<u32> = tpl.elements().iter().map(|e| e.partition() as u32).collect();
        let change = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => RebalanceChange::Assigned,
            _ if consumer.assignment_lost() => RebalanceChange::Lost,
            _ => RebalanceChange::Revoked,
        };
        let generation = generation(consumer);
        let mut owner = lock(&self.partitions);
        let result = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                self.assign(consumer, owner.as_mut(), &partitions, tpl, cooperative).map(|()| {
                    tracing::info!(
                        rebalance,
                        generation,
                        "rebalance {rebalance} (generation {generation}): {ASSIGNED} {partitions:?} of {} in {:.0} ms; \
                         paused until their state is restored",
                        self.topic,
                        began.elapsed().as_secs_f64() * 1e3
                    )
                })
            }
            _ => {
                let lost = change == RebalanceChange::Lost;
                lock(&self.resuming).retain(|p, _| !partitions.contains(p));
                let how = if lost { Stop::Lost } else { Stop::Handover };
                let (offsets, revoked) = match owner.as_mut() {
                    Some(owner) => owner.revoke(&partitions, how),
                    None => (Vec::new(), Ok(())),
                };
                if !lost && self.commits_group_offsets {
                    commit(consumer, &self.topic, &offsets, CommitMode::Sync);
                }
                let unassigned = if cooperative { consumer.incremental_unassign(tpl) } else { consumer.unassign() };
                let how = if lost { "lost (another member owns them now; no last checkpoint)" } else { "handed over" };
                if revoked.is_ok() {
                    let stopped: Vec<u32> = offsets.iter().map(|(p, _)| *p).collect();
                    tracing::info!(
                        rebalance,
                        generation,
                        "rebalance {rebalance} (generation {generation}): {REVOKED} {partitions:?} of {}: {how} \
                         {stopped:?} in {:.0} ms",
                        self.topic,
                        began.elapsed().as_secs_f64() * 1e3
                    );
                }
                revoked.and(unassigned.map_err(anyhow::Error::from))
            }
        };
        // A callback that moved none of this member's partitions is not counted.
        if let Some(owner) = owner.as_ref().filter(|_| !partitions.is_empty()) {
            owner.record_rebalance(change, partitions.len(), began.elapsed());
        }
        if let Err(e) = result {
            tracing::error!(rebalance, "rebalance {rebalance} of {}: {e:#}", self.topic);
            lock(&self.failure).get_or_insert(e);
        }
    }
}

impl<P: Partitions + Send> Membership<P> {
    /// Starts `partitions` and assigns them paused until their workers run. Where each
    /// resumes is known only once its state is restored (which may wait for the
    /// checkpoint store), so they are assigned at offset 0 and moved to their state's
    /// offset when they resume. The offset must be a number: a logical one (the log's
    /// end) makes librdkafka look it up, and the answer can land after the move and
    /// undo it.
    fn assign(
        &self,
        consumer: &BaseConsumer<Self>,
        owner: Option<&mut P>,
        partitions: &[u32],
        tpl: &mut TopicPartitionList,
        cooperative: bool,
    ) -> Result<()> {
        let mut owner = owner.filter(|_| !partitions.is_empty());
        let now = Instant::now();
        if let Some(owner) = owner.as_deref_mut() {
            assign(owner, &self.topic, partitions)?;
            tpl.set_all_offsets(Offset::Offset(0))?;
        }
        if cooperative {
            consumer.incremental_assign(tpl)?
        } else {
            consumer.assign(tpl)?
        }
        if owner.is_some() {
            consumer.pause(tpl)?;
            *lock(&self.assigned_at) = Some(now);
        }
        Ok(())
    }
}

/// This member's generation in its group as librdkafka knows it: the classic
/// protocol's generation id, the consumer protocol's member epoch (each new assignment
/// of the group raises it); -1 outside a group. A member evicted and joining again
/// comes back in a new one.
fn generation<C: ConsumerContext>(consumer: &BaseConsumer<C>) -> i32 {
    use rdkafka::bindings::{
        rd_kafka_consumer_group_metadata, rd_kafka_consumer_group_metadata_destroy,
        rd_kafka_consumer_group_metadata_generation_id,
    };
    // SAFETY: the client pointer lives as long as `consumer`; the metadata is a copy
    // this function owns (null when the consumer has no group) and destroys once read.
    unsafe {
        let metadata = rd_kafka_consumer_group_metadata(consumer.client().native_ptr());
        if metadata.is_null() {
            return -1;
        }
        let generation = rd_kafka_consumer_group_metadata_generation_id(metadata);
        rd_kafka_consumer_group_metadata_destroy(metadata);
        generation
    }
}

/// Starts `partitions` of `topic` in `owner`. A partition the job does not have is
/// refused before any starts.
fn assign(owner: &mut impl Partitions, topic: &str, partitions: &[u32]) -> Result<()> {
    if let Some(p) = partitions.iter().find(|&&p| p >= owner.count()) {
        bail!("topic {topic} has partition {p}, but the job has {} partitions: {}", owner.count(), PARTITIONS_ADDED);
    }
    owner.assign(partitions)
}
