//! The Kafka source: one member of a consumer group reading one topic.
//!
//! Kafka already partitions the log, so records keep the partition and offset the
//! broker gave them. On every assignment the consumer starts each partition at the
//! offset stored *with that partition's state* — never at the group's committed
//! offset — so state and input cannot drift apart; the group's committed offsets are
//! only advanced after state commits, for lag tooling.
//!
//! Several hosts share a group (and a checkpoint store): Kafka decides which host owns
//! which partition. With cooperative-sticky assignment a rebalance moves only the
//! partitions that change owner; the old owner hands each over (last batch finished,
//! last checkpoint uploaded) inside the revocation callback, before the group lets the
//! new owner have it, and the new owner keeps it paused until its state is restored.
//!
//! This module owns the consumer, the rebalance callbacks and the poll loop; it does
//! not process records or restore state (the [worker](crate::worker) module does).

use super::{Batches, SourceRecord};
use crate::worker::Stop;
use anyhow::{Context, Result, bail};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Message, Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often the group's committed offsets follow the state's.
const GROUP_COMMIT_INTERVAL: Duration = Duration::from_secs(1);
/// How long a start waits for the topic's metadata before it says the brokers are
/// unreachable.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one poll waits for a record: also how often the loop looks at everything
/// else (started partitions, backed-up ones, group offsets, a stop).
const POLL_TIMEOUT: Duration = Duration::from_millis(100);
/// The poll timeout while partitions are being started, so they resume promptly.
const STARTING_POLL_TIMEOUT: Duration = Duration::from_millis(5);
/// How long moving a partition to the offset its state holds may take.
const SEEK_TIMEOUT: Duration = Duration::from_secs(10);

/// Where and how to consume.
#[derive(Debug, Clone)]
pub struct KafkaOptions {
    /// Bootstrap servers.
    pub brokers: String,
    /// The topic.
    pub topic: String,
    /// The consumer group.
    pub group: String,
    /// Static membership (`group.instance.id`): a restart within the session timeout
    /// moves no partitions.
    pub instance_id: Option<String>,
    /// librdkafka consumer properties, passed through (they win over sluice's).
    pub properties: BTreeMap<String, String>,
    /// Stop once partitions were assigned, every worker processed all it was handed,
    /// and no record arrived for this long; `None` runs until stopped.
    pub stop_when_idle: Option<Duration>,
}

impl KafkaOptions {
    fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &self.brokers)
            .set("group.id", &self.group)
            .set("partition.assignment.strategy", "cooperative-sticky")
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "false")
            // Statistics every second carry the high watermarks the lag is measured from.
            .set("statistics.interval.ms", "1000");
        if let Some(instance) = &self.instance_id {
            config.set("group.instance.id", instance);
        }
        for (name, value) in &self.properties {
            config.set(name, value);
        }
        config
    }

    /// `max.poll.interval.ms` as configured, or librdkafka's default (300 s): the
    /// longest a rebalance may wait for this member.
    pub fn max_poll_interval(&self) -> Result<Duration> {
        match self.properties.get("max.poll.interval.ms") {
            Some(ms) => Ok(Duration::from_millis(ms.parse().with_context(|| {
                format!("max.poll.interval.ms = {ms:?} in [source] properties is not a number of milliseconds")
            })?)),
            None => Ok(Duration::from_secs(300)),
        }
    }

    /// The topic's partition count, from the brokers' metadata.
    pub fn partition_count(&self) -> Result<u32> {
        let consumer: BaseConsumer = self.client_config().create().context("creating a Kafka consumer")?;
        let metadata = consumer
            .fetch_metadata(Some(&self.topic), METADATA_TIMEOUT)
            .with_context(|| format!("reading metadata of topic {} from {}", self.topic, self.brokers))?;
        let topic = metadata.topics().first().filter(|t| t.error().is_none() && !t.partitions().is_empty());
        match topic {
            Some(topic) => Ok(topic.partitions().len() as u32),
            None => bail!("topic {} does not exist on {}", self.topic, self.brokers),
        }
    }
}

/// This member's side of the group: it owns the [`Batches`] (and so the workers) so
/// that rebalance callbacks, which run inside `poll`, can start and stop partitions
/// before the assignment changes.
struct Membership {
    topic: String,
    /// `None` once the poll loop has ended and taken them back.
    batches: Mutex<Option<Batches>>,
    /// When partitions were last assigned: an idle topic only counts from then.
    assigned_at: Mutex<Option<Instant>>,
    rebalances: AtomicU64,
    /// The first failure inside a callback; the poll loop returns it.
    failure: Mutex<Option<anyhow::Error>>,
}

impl ClientContext for Membership {
    /// librdkafka's client errors (a broker unreachable, a request timed out) go to the
    /// job's log; librdkafka keeps reconnecting by itself.
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        tracing::warn!("Kafka consumer of {}: {error}: {reason}", self.topic);
    }

    /// librdkafka's statistics carry each partition's high watermark: the lag is how far
    /// the state's offset is behind it.
    fn stats(&self, statistics: rdkafka::Statistics) {
        let Some(topic) = statistics.topics.get(&self.topic) else { return };
        let mut batches = lock(&self.batches);
        let Some(workers) = batches.as_mut().map(Batches::workers) else { return };
        for (&p, partition) in &topic.partitions {
            if let (Ok(p), Ok(high)) = (u32::try_from(p), u64::try_from(partition.hi_offset)) {
                workers.record_lag(p, high);
            }
        }
    }
}

impl ConsumerContext for Membership {
    fn rebalance(&self, consumer: &BaseConsumer<Self>, err: RDKafkaRespErr, tpl: &mut TopicPartitionList) {
        let began = Instant::now();
        let rebalance = self.rebalances.fetch_add(1, Ordering::Relaxed) + 1;
        let cooperative = matches!(consumer.rebalance_protocol(), RebalanceProtocol::Cooperative);
        let partitions: Vec<u32> = tpl.elements().iter().map(|e| e.partition() as u32).collect();
        let mut batches = lock(&self.batches);
        let result = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                self.assign(consumer, batches.as_mut(), &partitions, tpl, cooperative).map(|()| {
                    tracing::info!(
                        "rebalance {rebalance}: assigned partitions {partitions:?} of {} in {:.0} ms; paused until their state is restored",
                        self.topic,
                        began.elapsed().as_secs_f64() * 1e3
                    )
                })
            }
            _ => {
                let lost = consumer.assignment_lost();
                let revoked = self.revoke(consumer, batches.as_mut(), &partitions, lost);
                let unassigned = if cooperative { consumer.incremental_unassign(tpl) } else { consumer.unassign() };
                let how = if lost { "lost (another member owns them now; no last checkpoint)" } else { "handed over" };
                if let Ok(stopped) = &revoked {
                    tracing::info!(
                        "rebalance {rebalance}: revoked partitions {partitions:?} of {}: {how} {stopped:?} in {:.0} ms",
                        self.topic,
                        began.elapsed().as_secs_f64() * 1e3
                    );
                }
                revoked.map(drop).and(unassigned.map_err(anyhow::Error::from))
            }
        };
        if let Err(e) = result {
            tracing::error!("rebalance {rebalance} of {}: {e:#}", self.topic);
            lock(&self.failure).get_or_insert(e);
        }
    }
}

impl Membership {
    /// Plans the restore of `partitions`, assigns each at the offset its state will
    /// hold, and pauses them until their workers run.
    fn assign(
        &self,
        consumer: &BaseConsumer<Self>,
        batches: Option<&mut Batches>,
        partitions: &[u32],
        tpl: &mut TopicPartitionList,
        cooperative: bool,
    ) -> Result<()> {
        let Some(batches) = batches.filter(|_| !partitions.is_empty()) else {
            let assigned = if cooperative { consumer.incremental_assign(tpl) } else { consumer.assign(tpl) };
            return assigned.map_err(Into::into);
        };
        if let Some(p) = partitions.iter().find(|&&p| p >= batches.partitions()) {
            bail!("topic {} has partition {p}, but the job has {} partitions", self.topic, batches.partitions());
        }
        let now = Instant::now();
        for (p, offset) in batches.workers().start(partitions)? {
            tpl.set_partition_offset(&self.topic, p as i32, Offset::Offset(offset as i64))?;
        }
        if cooperative {
            consumer.incremental_assign(tpl)?
        } else {
            consumer.assign(tpl)?
        }
        consumer.pause(tpl)?;
        *lock(&self.assigned_at) = Some(now);
        Ok(())
    }

    /// Stops `partitions`' workers — handing them over, or dropping them when `lost` —
    /// and commits the offsets their state reached to the group. Returns the
    /// partitions that were running here.
    fn revoke(
        &self,
        consumer: &BaseConsumer<Self>,
        batches: Option<&mut Batches>,
        partitions: &[u32],
        lost: bool,
    ) -> Result<Vec<u32>> {
        let Some(batches) = batches else { return Ok(Vec::new()) };
        let mut offsets = TopicPartitionList::new();
        let (mut result, mut stopped) = (Ok(()), Vec::new());
        for &p in partitions {
            batches.close(p);
            match batches.workers().stop(p, if lost { Stop::Lost } else { Stop::Handover }) {
                Ok(Some(report)) => {
                    let offset = Offset::Offset(report.committed_offset as i64);
                    result =
                        result.and(offsets.add_partition_offset(&self.topic, p as i32, offset).map_err(Into::into));
                    stopped.push(p);
                }
                Ok(None) => {}
                Err(e) => result = result.and(Err(e)),
            }
        }
        if !lost && offsets.count() > 0 {
            commit(consumer, &offsets, CommitMode::Sync, &self.topic);
        }
        result.map(|()| stopped)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().expect("no panics under this lock")
}

/// Commits `offsets` to the group for lag tooling; a failure only costs freshness.
fn commit<C: ConsumerContext>(consumer: &BaseConsumer<C>, offsets: &TopicPartitionList, mode: CommitMode, topic: &str) {
    if let Err(e) = consumer.commit(offsets, mode) {
        tracing::warn!("committing group offsets of {topic}: {e}");
    }
}

/// Consumes `options.topic` as a member of `options.group` and feeds `batches`: each
/// assigned partition is restored and started at the offset stored with its state,
/// each revoked one handed over. A partition whose worker falls behind is paused, so
/// the poll loop never waits on an operator. Every second the offsets the state
/// reached are committed to the group. Returns when the topic was idle for
/// `stop_when_idle` (workers drain) or `stopping` is set (workers hand over).
pub fn dispatch(options: &KafkaOptions, batches: Batches, stopping: &AtomicBool) -> Result<Batches> {
    let membership = Membership {
        topic: options.topic.clone(),
        batches: Mutex::new(Some(batches)),
        assigned_at: Mutex::default(),
        rebalances: AtomicU64::new(0),
        failure: Mutex::default(),
    };
    let consumer: BaseConsumer<Membership> =
        options.client_config().create_with_context(membership).context("creating a Kafka consumer")?;
    let outcome = consumer
        .subscribe(&[&options.topic])
        .with_context(|| format!("subscribing to {}", options.topic))
        .and_then(|()| poll(&consumer, options, stopping));
    let mut batches = lock(&consumer.context().batches).take().expect("only the poll loop takes them");
    let running = batches.workers().running();
    // Evicted meanwhile: the partitions are someone else's, and so is the store.
    let outcome = outcome.map(|how| if consumer.assignment_lost() { Stop::Lost } else { how });
    let lost = matches!(outcome, Ok(Stop::Lost));
    let finished = batches.finish(outcome);
    // The offsets the final state holds, for lag tooling, before the member leaves.
    let mut offsets = TopicPartitionList::new();
    for &p in running.iter().filter(|_| !lost) {
        if let Some(report) = batches.workers().reports().iter().rev().find(|r| r.partition == p) {
            offsets.add_partition_offset(&options.topic, p as i32, Offset::Offset(report.committed_offset as i64))?;
        }
    }
    if offsets.count() > 0 {
        commit(&consumer, &offsets, CommitMode::Sync, &options.topic);
    }
    finished.map(|()| batches)
}

/// The poll loop: records to workers, started partitions resumed, backed-up ones
/// paused, group offsets committed. Returns how the workers should stop.
fn poll(consumer: &BaseConsumer<Membership>, options: &KafkaOptions, stopping: &AtomicBool) -> Result<Stop> {
    let context = consumer.context();
    // The last moment there was work: a record arrived, or a worker had some left.
    let (mut last_busy, mut last_commit, mut last_flush) = (Instant::now(), Instant::now(), Instant::now());
    let mut group_offsets = BTreeMap::new();
    let mut backed_up = std::collections::BTreeSet::new();
    // While partitions restore, look for finished ones often: they are paused.
    let mut starting = false;
    loop {
        if stopping.load(Ordering::Relaxed) {
            return Ok(Stop::Handover);
        }
        let message = consumer.poll(if starting { STARTING_POLL_TIMEOUT } else { POLL_TIMEOUT });
        if let Some(e) = lock(&context.failure).take() {
            return Err(e);
        }
        let mut guard = lock(&context.batches);
        let batches = guard.as_mut().expect("the poll loop holds them");
        for started in batches.workers().started()? {
            let p = started.partition;
            batches.open(&started);
            // The offset the state holds, whatever the assignment expected: a restore may
            // have fallen back to an older checkpoint.
            consumer.seek(&options.topic, p as i32, Offset::Offset(started.offset as i64), SEEK_TIMEOUT)?;
            consumer.resume(&partition_list(&options.topic, p))?;
            let paused = started.assigned.elapsed();
            tracing::info!(
                partition = p,
                "resumed at offset {} after {:.0} ms paused (state from {}, ready in {:.0} ms)",
                started.offset,
                paused.as_secs_f64() * 1e3,
                started.restored_from,
                started.took.as_secs_f64() * 1e3
            );
        }
        let quiet = message.is_none();
        match message {
            Some(Ok(message)) => {
                last_busy = Instant::now();
                let p = message.partition() as u32;
                let record = SourceRecord {
                    partition: p,
                    offset: message.offset() as u64,
                    key: message.key().unwrap_or_default().to_vec(),
                    value: message.payload().unwrap_or_default().to_vec(),
                    timestamp_ms: message.timestamp().to_millis().unwrap_or(0),
                };
                batches.push(record, false)?;
                if batches.backed_up(p) && backed_up.insert(p) {
                    consumer.pause(&partition_list(&options.topic, p))?;
                }
            }
            // librdkafka retries by itself; say what happened and keep polling.
            Some(Err(e)) => tracing::warn!("consuming {}: {e}", options.topic),
            None => {
                if !batches.caught_up() || batches.workers().any_starting() {
                    last_busy = Instant::now();
                }
                // Idle only counts once partitions were assigned and every worker is done,
                // so the drain at the end does not keep the poll loop waiting.
                let idle_since = lock(&context.assigned_at).map(|at| at.max(last_busy));
                if options.stop_when_idle.zip(idle_since).is_some_and(|(idle, since)| since.elapsed() >= idle) {
                    return Ok(Stop::Drain);
                }
            }
        }
        // Partial batches go out when the topic is quiet, and at least every poll
        // timeout, so a slow partition's records do not wait for a busy one's.
        if quiet || !backed_up.is_empty() || last_flush.elapsed() >= POLL_TIMEOUT {
            batches.flush(false)?;
            last_flush = Instant::now();
        }
        if !backed_up.is_empty() {
            for p in backed_up.clone() {
                if !batches.backed_up(p) {
                    backed_up.remove(&p);
                    // librdkafka rewinds a paused partition to just after the last record
                    // it handed out, so reading goes on where it stopped.
                    if batches.workers().owns(p) {
                        consumer.resume(&partition_list(&options.topic, p))?;
                    }
                }
            }
        }
        starting = batches.workers().any_starting();
        if last_commit.elapsed() >= GROUP_COMMIT_INTERVAL {
            last_commit = Instant::now();
            let mut tpl = TopicPartitionList::new();
            for p in batches.workers().running() {
                let offset = batches.workers().committed_offset(p).unwrap_or(0);
                if group_offsets.insert(p, offset) != Some(offset) {
                    tpl.add_partition_offset(&options.topic, p as i32, Offset::Offset(offset as i64))?;
                }
            }
            if tpl.count() > 0 {
                commit(consumer, &tpl, CommitMode::Async, &options.topic);
            }
        }
    }
}

/// A list holding one partition of `topic`.
fn partition_list(topic: &str, partition: u32) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, partition as i32);
    tpl
}
