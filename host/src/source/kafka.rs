//! The Kafka source: one member of a consumer group reading one topic.
//!
//! Kafka already partitions the log, so records keep the partition and offset the
//! broker gave them. On every assignment the consumer starts each partition at the
//! offset stored *with that partition's state* — never at the group's committed
//! offset — so state and input cannot drift apart; the group's committed offsets are
//! only advanced after state commits, for lag tooling.
//!
//! Several hosts share a group (and a checkpoint store): Kafka decides which host owns
//! which partition, under the classic group protocol (cooperative-sticky assignment) or
//! KIP-848's consumer protocol (the broker assigns), as `[source] group_protocol` says.
//! Either way a rebalance moves only the partitions that change owner; the old owner
//! hands each over (last batch finished, last checkpoint uploaded) inside the revocation
//! callback, before the group lets the new owner have it, and the new owner keeps it
//! paused until its state is restored.
//!
//! Before a partition resumes, its state's offset is checked against the log's range
//! ([`resume_offset`]): records retention deleted before the job read them, or a log
//! shorter than the state (another topic, a recreated one), are never jumped over in
//! silence, and librdkafka's own reset is off (`auto.offset.reset = error`). A broker
//! that fails to tell the range, or to move the partition there, costs that partition a
//! pause: it is tried again with [`Backoff`] (1, 2, 4… s) for up to `[checkpoint]
//! restore_retry_timeout`, then the partition stops alone.
//!
//! The revocation callback stops its partitions at once (a restore under way is given
//! up, not waited for), so the poll loop keeps within `max.poll.interval.ms`. A fatal
//! consumer error — this member fenced by another with its `group.instance.id`, above
//! all — ends the run with that error: the member can no longer take part in its group,
//! and its partitions are another member's (dropped as lost).
//!
//! A record keeps its Kafka headers, but for those named like the marks the source adds
//! ([`NULL_KEY_HEADER`], [`TOMBSTONE_HEADER`]): a producer could otherwise make a record
//! pass for keyless or a tombstone. They are dropped, and the first is warned about.
//!
//! This module owns the consumer, the rebalance callbacks and the poll loop. It drives
//! partition ownership through [`Partitions`] only; it does not process records or
//! restore state (the [worker](crate::worker) module does).

use super::events::{
    ASSIGNED, MEMBER_FAILED, OUT_OF_RANGE, PARTITIONS_ADDED, RESERVED_HEADER, RESUME_RETRY, RESUMED, REVOKED,
};
use super::{Partitions, Started};
use crate::backoff::Backoff;
use crate::config::{GroupProtocol, OutOfRange};
use crate::kafka::client_config;
use crate::lock;
use crate::record::{NULL_KEY_HEADER, SourceRecord, Stop, TOMBSTONE_HEADER};
use crate::stats::RebalanceChange;
use anyhow::{Context, Result, bail};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::message::BorrowedMessage;
use rdkafka::types::{RDKafkaErrorCode, RDKafkaRespErr};
use rdkafka::{ClientContext, Message, Offset, TopicPartitionList};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often the group's committed offsets follow the state's.
const GROUP_COMMIT_INTERVAL: Duration = Duration::from_secs(1);
/// How often every partition's offset goes to the group again, moved or not: a commit
/// may fail (one sent as a rebalance begins carries a generation that is over), and
/// librdkafka tells a manual asynchronous commit's failure only to its log, so a
/// partition without new records would keep a stale offset — a false lag — for good.
const GROUP_RECOMMIT_INTERVAL: Duration = Duration::from_secs(10);
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
    /// Who assigns partitions and owns the session timeout: the members (classic) or
    /// the broker (KIP-848's consumer protocol).
    pub group_protocol: GroupProtocol,
    /// librdkafka consumer properties, passed through (they win over sluice's).
    pub properties: BTreeMap<String, String>,
    /// Stop once partitions were assigned, every worker processed all it was handed,
    /// and no record arrived for this long; `None` runs until stopped.
    pub stop_when_idle: Option<Duration>,
    /// Whether this member commits the offsets the partitions' states reached to the
    /// group; not when exactly-once outputs commit them in their transactions, which
    /// a commit of their own could move back.
    pub commits_group_offsets: bool,
    /// What a partition whose state is older than its log's retained records does.
    pub offset_out_of_range: OutOfRange,
    /// How long a partition whose resume fails (the broker does not answer) is tried
    /// again before it stops alone: `[checkpoint] restore_retry_timeout`.
    pub retry_timeout: Duration,
}

impl KafkaOptions {
    fn client_config(&self) -> ClientConfig {
        let mut defaults = vec![("group.id", self.group.as_str())];
        match self.group_protocol {
            GroupProtocol::Classic => defaults
                .extend([("group.protocol", "classic"), ("partition.assignment.strategy", "cooperative-sticky")]),
            // The broker assigns, incrementally: librdkafka refuses an assignment strategy.
            GroupProtocol::Consumer => defaults.push(("group.protocol", "consumer")),
        }
        defaults.extend([
            ("enable.auto.commit", "false"),
            ("enable.partition.eof", "false"),
            // Never jump to the log's end (librdkafka's default) or start: the checks at
            // resume decide, and an offset lost later stalls its partition, logged.
            ("auto.offset.reset", "error"),
            // Statistics every second carry the high watermarks the lag is measured from.
            ("statistics.interval.ms", "1000"),
        ]);
        if let Some(instance) = &self.instance_id {
            defaults.push(("group.instance.id", instance));
        }
        client_config(&self.brokers, &defaults, &self.properties)
    }

    /// `max.poll.interval.ms` as configured, or librdkafka's default (300 s): the
    /// longest a rebalance may wait for this member.
    pub fn max_poll_interval(&self) -> Result<Duration> {
        self.milliseconds("max.poll.interval.ms", Duration::from_secs(300))
    }

    /// How long the group waits for a silent member before it drops it: by then a
    /// member the group dropped has heard of it (its heartbeats are refused). Classic:
    /// `session.timeout.ms` as configured, or librdkafka's default (45 s). Consumer:
    /// the broker's `group.consumer.session.timeout.ms`, as the brokers describe it
    /// (Kafka's default, 45 s, if they do not).
    pub fn session_timeout(&self) -> Result<Duration> {
        const DEFAULT: Duration = Duration::from_secs(45);
        match self.group_protocol {
            GroupProtocol::Classic => self.milliseconds("session.timeout.ms", DEFAULT),
            GroupProtocol::Consumer => Ok(self.broker_session_timeout().unwrap_or_else(|e| {
                tracing::warn!(
                    "reading group.consumer.session.timeout.ms from {}: {e:#}; taking Kafka's default, {}s",
                    self.brokers,
                    DEFAULT.as_secs()
                );
                DEFAULT
            })),
        }
    }

    /// The broker's `group.consumer.session.timeout.ms`: of a broker the metadata
    /// names, as all brokers of a cluster are set alike.
    fn broker_session_timeout(&self) -> Result<Duration> {
        use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
        let admin: AdminClient<rdkafka::client::DefaultClientContext> =
            client_config(&self.brokers, &[], &BTreeMap::new()).create()?;
        let metadata = admin.inner().fetch_metadata(Some(&self.topic), METADATA_TIMEOUT)?;
        let broker = metadata.brokers().first().context("the metadata names no broker")?.id();
        let options = AdminOptions::new().request_timeout(Some(METADATA_TIMEOUT));
        let described =
            futures::executor::block_on(admin.describe_configs(&[ResourceSpecifier::Broker(broker)], &options))?;
        let resource = described.into_iter().next().context("no answer")?.map_err(|e| anyhow::anyhow!("{e}"))?;
        let value = resource
            .get("group.consumer.session.timeout.ms")
            .and_then(|entry| entry.value.clone())
            .with_context(|| format!("broker {broker} does not name it"))?;
        Ok(Duration::from_millis(value.parse().with_context(|| format!("{value:?} is not milliseconds"))?))
    }

    /// The property `name`, a number of milliseconds, or `default` if it is not set.
    fn milliseconds(&self, name: &str, default: Duration) -> Result<Duration> {
        let Some(ms) = self.properties.get(name) else { return Ok(default) };
        let ms = ms
            .parse()
            .with_context(|| format!("{name} = {ms:?} in [source] properties is not a number of milliseconds"))?;
        Ok(Duration::from_millis(ms))
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

/// This member's side of the group: it owns the [`Partitions`] so that rebalance
/// callbacks, which run inside `poll`, can start and stop partitions before the
/// assignment changes.
struct Membership<P> {
    topic: String,
    /// `None` once the poll loop has ended and taken them back.
    partitions: Mutex<Option<P>>,
    /// When partitions were last assigned: an idle topic only counts from then.
    assigned_at: Mutex<Option<Instant>>,
    rebalances: AtomicU64,
    /// [`KafkaOptions::commits_group_offsets`].
    commits_group_offsets: bool,
    /// The first failure inside a callback; the poll loop returns it.
    failure: Mutex<Option<anyhow::Error>>,
    /// Started partitions waiting to resume, by partition; a revocation drops its own.
    resuming: Mutex<BTreeMap<u32, Resuming>>,
}

impl<P> Membership<P> {
    fn new(topic: &str, partitions: P, commits_group_offsets: bool) -> Self {
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
struct Resuming {
    started: Started,
    /// The waits between tries after the broker failed.
    backoff: Backoff,
    /// When to try next.
    due: Instant,
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

/// Commits `offsets` of `topic` to the group for lag tooling; a failure only costs
/// freshness.
fn commit<C: ConsumerContext>(consumer: &BaseConsumer<C>, topic: &str, offsets: &[(u32, u64)], mode: CommitMode) {
    if offsets.is_empty() {
        return;
    }
    let mut tpl = TopicPartitionList::new();
    let listed = offsets
        .iter()
        .try_for_each(|&(p, offset)| tpl.add_partition_offset(topic, p as i32, Offset::Offset(offset as i64)));
    if let Err(e) = listed.and_then(|()| consumer.commit(&tpl, mode)) {
        tracing::warn!("committing group offsets of {topic}: {e}");
    }
}

/// Consumes `options.topic` as a member of `options.group` and feeds `partitions`:
/// each assigned partition is restored and started at the offset stored with its
/// state, each revoked one handed over. A partition whose worker falls behind is
/// paused, so the poll loop never waits on an operator. Every second the offsets the
/// state reached are committed to the group. Returns, with `partitions` back, when
/// the topic was idle for `stop_when_idle` (partitions drain) or `stopping` is set
/// (partitions hand over).
pub fn dispatch<P: Partitions + Send>(options: &KafkaOptions, partitions: P, stopping: &AtomicBool) -> Result<P> {
    let membership = Membership::new(&options.topic, partitions, options.commits_group_offsets);
    let consumer: BaseConsumer<Membership<P>> =
        options.client_config().create_with_context(membership).context("creating a Kafka consumer")?;
    let outcome = consumer
        .subscribe(&[&options.topic])
        .with_context(|| format!("subscribing to {}", options.topic))
        .and_then(|()| poll(&consumer, options, stopping));
    let mut partitions = lock(&consumer.context().partitions).take().expect("only the poll loop takes them");
    let outcome = match outcome {
        // A dead member's partitions are another member's: dropped, and the run ends in
        // why the member died.
        Err(dead) if dead.is::<MemberFailed>() => {
            if let Err(e) = partitions.finish(Ok(Stop::Lost)) {
                tracing::error!("stopping the partitions of a member that failed: {e:#}");
            }
            return Err(dead);
        }
        // Evicted meanwhile: the partitions are someone else's, and so is the store.
        outcome => outcome.map(|how| if consumer.assignment_lost() { Stop::Lost } else { how }),
    };
    let lost = matches!(outcome, Ok(Stop::Lost));
    let offsets = partitions.finish(outcome)?;
    // The offsets the final state holds, for lag tooling, before the member leaves.
    if !lost && options.commits_group_offsets {
        commit(&consumer, &options.topic, &offsets, CommitMode::Sync);
    }
    Ok(partitions)
}

/// What the poll loop keeps between two polls.
struct PollState {
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
fn poll<P: Partitions + Send>(
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
    fn new(now: Instant) -> Self {
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
    fn offsets_to_commit(&mut self, reached: Vec<(u32, u64)>, all: bool) -> Vec<(u32, u64)> {
        if all {
            self.group_offsets.clear();
        }
        reached.into_iter().filter(|&(p, offset)| self.group_offsets.insert(p, offset) != Some(offset)).collect()
    }
}

/// The record `message` carries, at the broker's partition and offset, with its
/// headers; a missing key or value (a tombstone) is empty and marked by a header. Headers
/// of the marks' names that the record itself carries are dropped (so the marks are the
/// source's alone); the second value says whether there were any.
fn source_record(message: &BorrowedMessage<'_>) -> (SourceRecord, bool) {
    use rdkafka::message::Headers;
    let mut headers: Vec<(String, Vec<u8>)> = message
        .headers()
        .map(|headers| {
            headers
                .iter()
                .map(|h| (String::from_utf8_lossy(h.key.as_bytes()).into_owned(), h.value.unwrap_or_default().to_vec()))
                .collect()
        })
        .unwrap_or_default();
    let carried = headers.len();
    headers.retain(|(name, _)| name != NULL_KEY_HEADER && name != TOMBSTONE_HEADER);
    let reserved = headers.len() < carried;
    let marks = [(message.key().is_none(), NULL_KEY_HEADER), (message.payload().is_none(), TOMBSTONE_HEADER)];
    headers.extend(marks.into_iter().filter(|(missing, _)| *missing).map(|(_, name)| (name.to_string(), Vec::new())));
    let record = SourceRecord {
        partition: message.partition() as u32,
        offset: message.offset() as u64,
        key: message.key().unwrap_or_default().to_vec(),
        value: message.payload().unwrap_or_default().to_vec(),
        timestamp_ms: message.timestamp().to_millis().unwrap_or(0),
        headers,
    };
    (record, reserved)
}

/// The records of one partition of a topic from an offset on, as this source reads
/// them (headers kept, null keys and tombstones marked): what `sluice replay` runs
/// again. A consumer of no group's, assigned the partition, committing nothing; it
/// ends at `until`, or at the end the broker reported when reading began.
pub struct PartitionReader {
    consumer: BaseConsumer,
    topic: String,
    partition: u32,
    /// The offset the next record has at least.
    next: u64,
    /// Reading ends before this offset.
    end: u64,
}

/// How long a [`PartitionReader`] waits for a record it knows exists.
const READ_TIMEOUT: Duration = Duration::from_secs(30);

impl PartitionReader {
    /// Reads `partition` of `topic` at `brokers` (with the source's `properties`) from
    /// offset `from` up to `until` (exclusive), or to the partition's end now. Fails,
    /// naming the partition, when the log no longer holds `from`. It belongs to no
    /// group and commits nothing, whatever the properties say: a replay runs beside
    /// the live job and must not move its group's offsets.
    pub fn open(
        (brokers, topic, properties): (&str, &str, &BTreeMap<String, String>),
        partition: u32,
        from: u64,
        until: Option<u64>,
    ) -> Result<Self> {
        let mut config = client_config(brokers, &[], properties);
        for (name, value) in [
            ("group.id", "sluice-replay"),
            ("enable.auto.commit", "false"),
            ("enable.auto.offset.store", "false"),
            ("enable.partition.eof", "false"),
            ("auto.offset.reset", "error"),
        ] {
            config.set(name, value);
        }
        let consumer: BaseConsumer = config.create().context("creating a Kafka consumer")?;
        let (low, high) = consumer
            .fetch_watermarks(topic, partition as i32, METADATA_TIMEOUT)
            .with_context(|| format!("reading the offsets of {topic}/{partition} at {brokers}"))?;
        let (low, high) = (low.max(0) as u64, high.max(0) as u64);
        if from < low {
            bail!("{topic}/{partition} at {brokers} no longer holds offset {from}: its log starts at {low}");
        }
        let mut assignment = TopicPartitionList::new();
        assignment.add_partition_offset(topic, partition as i32, Offset::Offset(from as i64))?;
        consumer.assign(&assignment).with_context(|| format!("reading {topic}/{partition} from offset {from}"))?;
        let end = until.map_or(high, |until| until.min(high));
        Ok(PartitionReader { consumer, topic: topic.to_string(), partition, next: from, end })
    }

    /// The offset the consumer fetches next, once it fetched something.
    fn fetch_position(&self) -> Option<u64> {
        let position = self.consumer.position().ok()?;
        match position.find_partition(&self.topic, self.partition as i32)?.offset() {
            Offset::Offset(offset) => u64::try_from(offset).ok(),
            _ => None,
        }
    }
}

impl Iterator for PartitionReader {
    type Item = Result<SourceRecord>;

    fn next(&mut self) -> Option<Self::Item> {
        let waiting = Instant::now();
        while self.next < self.end {
            match self.consumer.poll(POLL_TIMEOUT) {
                Some(Ok(message)) => {
                    let (record, _) = source_record(&message);
                    self.next = record.offset + 1;
                    return (record.offset < self.end).then_some(Ok(record));
                }
                Some(Err(e)) => return Some(Err(e).context(format!("reading {}/{}", self.topic, self.partition))),
                // Past the last record: what is left before the end are offsets the broker
                // delivers no record for (transaction markers).
                None if self.fetch_position().is_some_and(|position| position >= self.end) => return None,
                None if waiting.elapsed() > READ_TIMEOUT => {
                    let (topic, partition, next) = (&self.topic, self.partition, self.next);
                    return Some(Err(anyhow::anyhow!(
                        "{topic}/{partition}: no record at offset {next} or after within {READ_TIMEOUT:?}"
                    )));
                }
                None => {}
            }
        }
        None
    }
}

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
fn resume_due<C: ConsumerContext>(
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
fn resume<C: ConsumerContext>(consumer: &BaseConsumer<C>, topic: &str, started: &Started, offset: u64) -> Result<()> {
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
fn resume_drained<C: ConsumerContext>(
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

/// Why a consumer that failed for good (a fatal error, librdkafka's `code`) ends the
/// run: the member cannot rejoin its group, and its partitions are another's.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct MemberFailed(String);

/// The [`MemberFailed`] error of a consumer whose fatal error is `(code, reason)`:
/// what librdkafka says, and for a static member fenced by another what to do.
fn member_failed(options: &KafkaOptions, (code, reason): (RDKafkaErrorCode, String)) -> anyhow::Error {
    let advice = match (code, &options.instance_id) {
        // Classic groups fence the member already there; KIP-848's refuse the newcomer.
        (RDKafkaErrorCode::FencedInstanceId, Some(id)) => format!(
            ": another consumer joined group {} with this one's [source] instance_id = {id:?} (each host needs \
             its own; a restarted host's old process must have ended)",
            options.group
        ),
        (RDKafkaErrorCode::UnreleasedInstanceId, Some(id)) => format!(
            ": another consumer of group {} holds this one's [source] instance_id = {id:?} (each host needs \
             its own; a restarted host's old process must have ended, or its session timed out)",
            options.group
        ),
        _ => String::new(),
    };
    MemberFailed(format!(
        "the Kafka consumer of topic {} in group {} failed for good: {reason}{advice}; {MEMBER_FAILED}, and its \
         partitions are another member's",
        options.topic, options.group
    ))
    .into()
}

/// A list holding one partition of `topic`.
fn partition_list(topic: &str, partition: u32) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, partition as i32);
    tpl
}

#[cfg(test)]
mod tests {
    //! The consumer's side of rebalances against a fake owner of partitions: no broker
    //! is needed, since assigning, pausing and polling an unsubscribed consumer are
    //! local to librdkafka.

    use super::*;
    use crate::record::RestoredFrom;

    /// Partitions that record what the source asked of them.
    #[derive(Default)]
    struct Fake {
        count: u32,
        /// The offset each running partition's state holds.
        running: BTreeMap<u32, u64>,
        assigned: Vec<u32>,
        revoked: Vec<(u32, Stop)>,
        pushed: Vec<u64>,
        /// The next call to `started` fails, as a failed restore does.
        fail_start: bool,
    }

    impl Partitions for Fake {
        fn count(&self) -> u32 {
            self.count
        }
        fn assign(&mut self, partitions: &[u32]) -> Result<()> {
            self.assigned.extend(partitions);
            Ok(())
        }
        fn started(&mut self, _wait: bool) -> Result<Vec<Started>> {
            if std::mem::take(&mut self.fail_start) {
                bail!("starting partition 1: restoring: checkpoint 3 is corrupt");
            }
            Ok(Vec::new())
        }
        fn failed(&mut self) -> Result<Vec<u32>> {
            Ok(Vec::new())
        }
        fn stop_alone(&mut self, partition: u32, _error: anyhow::Error) -> Result<()> {
            self.running.remove(&partition);
            Ok(())
        }
        fn revoke(&mut self, partitions: &[u32], how: Stop) -> (Vec<(u32, u64)>, Result<()>) {
            self.revoked.extend(partitions.iter().map(|&p| (p, how)));
            let offsets = partitions.iter().filter_map(|p| Some((*p, self.running.remove(p)?))).collect();
            (offsets, Ok(()))
        }
        fn push(&mut self, record: SourceRecord, _wait: bool) -> Result<bool> {
            self.pushed.push(record.offset);
            Ok(false)
        }
        fn flush(&mut self, _wait: bool) -> Result<()> {
            Ok(())
        }
        fn backed_up(&self, _partition: u32) -> bool {
            false
        }
        fn owns(&self, partition: u32) -> bool {
            self.running.contains_key(&partition)
        }
        fn owns_any(&self) -> bool {
            !self.running.is_empty()
        }
        fn starting(&self) -> bool {
            false
        }
        fn caught_up(&self) -> bool {
            true
        }
        fn committed_offsets(&self) -> Vec<(u32, u64)> {
            self.running.iter().map(|(&p, &o)| (p, o)).collect()
        }
        fn record_lag(&self, _partition: u32, _high_watermark: u64) {}
        fn record_rebalance(&self, _change: RebalanceChange, _partitions: usize, _took: Duration) {}
        fn finish(&mut self, outcome: Result<Stop>) -> Result<Vec<(u32, u64)>> {
            outcome?;
            Ok(std::mem::take(&mut self.running).into_iter().collect())
        }
    }

    fn fake(count: u32, running: &[(u32, u64)]) -> Fake {
        Fake { count, running: running.iter().copied().collect(), ..Fake::default() }
    }

    fn options() -> KafkaOptions {
        KafkaOptions {
            // Nothing listens on the discard port: nothing here needs a broker.
            brokers: "127.0.0.1:9".into(),
            topic: "positions".into(),
            group: "sluice-test".into(),
            instance_id: None,
            group_protocol: GroupProtocol::Classic,
            properties: BTreeMap::new(),
            stop_when_idle: None,
            commits_group_offsets: true,
            offset_out_of_range: OutOfRange::Fail,
            retry_timeout: Duration::from_secs(300),
        }
    }

    fn consumer(owner: Fake) -> BaseConsumer<Membership<Fake>> {
        let membership = Membership::new("positions", owner, true);
        options().client_config().create_with_context(membership).expect("a consumer needs no broker to exist")
    }

    fn list(partitions: &[i32]) -> TopicPartitionList {
        let mut tpl = TopicPartitionList::new();
        for &p in partitions {
            tpl.add_partition("positions", p);
        }
        tpl
    }

    #[test]
    fn an_assignment_starts_the_partitions_and_assigns_them_paused_at_a_numeric_offset() {
        let consumer = consumer(fake(2, &[]));
        let mut tpl = list(&[0, 1]);
        consumer.context().rebalance(&consumer, RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS, &mut tpl);
        assert!(lock(&consumer.context().failure).is_none());
        assert_eq!(lock(&consumer.context().partitions).as_ref().unwrap().assigned, [0, 1]);
        let offsets: Vec<Offset> = tpl.elements().iter().map(|e| e.offset()).collect();
        assert_eq!(offsets, [Offset::Offset(0), Offset::Offset(0)], "moved to their states' offsets on resuming");
        assert_eq!(consumer.assignment().unwrap().count(), 2);
        assert!(lock(&consumer.context().assigned_at).is_some(), "idleness counts from the assignment");
    }

    #[test]
    fn an_assignment_of_a_partition_the_job_lacks_starts_nothing_and_stops_the_poll_loop() {
        let consumer = consumer(fake(2, &[]));
        let mut tpl = list(&[1, 2]);
        consumer.context().rebalance(&consumer, RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS, &mut tpl);
        assert!(lock(&consumer.context().partitions).as_ref().unwrap().assigned.is_empty());
        let err = poll(&consumer, &options(), &AtomicBool::new(false)).expect_err("the failure surfaces");
        assert!(err.to_string().contains("topic positions has partition 2, but the job has 2 partitions"), "{err}");
    }

    #[test]
    fn a_revocation_hands_its_partitions_over_together_and_drops_their_pending_resumes() {
        let consumer = consumer(fake(3, &[(0, 10), (1, 20)]));
        let started = |partition| Started {
            partition,
            offset: 0,
            restored_from: RestoredFrom::Empty,
            assigned: Instant::now(),
            took: Duration::ZERO,
        };
        let context = consumer.context();
        for p in [1, 2] {
            let pending = Resuming { started: started(p), backoff: Backoff::new(Duration::ZERO), due: Instant::now() };
            lock(&context.resuming).insert(p, pending);
        }
        context.rebalance(&consumer, RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS, &mut list(&[0, 1]));
        assert!(lock(&context.failure).is_none());
        let owner = lock(&context.partitions);
        assert_eq!(owner.as_ref().unwrap().revoked, [(0, Stop::Handover), (1, Stop::Handover)], "in one call");
        assert_eq!(lock(&context.resuming).keys().collect::<Vec<_>>(), [&2], "a revoked partition never resumes");
    }

    /// Group offsets go to the group once each as they move, and all of them again now
    /// and then: a commit that failed (one sent as a rebalance began, say) is not
    /// reported, and an offset that no longer moves would otherwise stay stale for good.
    #[test]
    fn group_offsets_are_committed_as_they_move_and_all_again_now_and_then() {
        let mut state = PollState::new(Instant::now());
        assert_eq!(state.offsets_to_commit(vec![(2, 1148), (3, 847)], false), [(2, 1148), (3, 847)]);
        assert_eq!(state.offsets_to_commit(vec![(2, 1148), (3, 900)], false), [(3, 900)], "only what moved");
        assert_eq!(state.offsets_to_commit(vec![(2, 1148), (3, 900)], false), [], "nothing moved");
        assert_eq!(state.offsets_to_commit(vec![(2, 1148), (3, 900)], true), [(2, 1148), (3, 900)], "all again");
    }

    #[test]
    fn a_failed_restore_stops_the_poll_loop_with_its_reason() {
        let consumer = consumer(Fake { fail_start: true, ..fake(2, &[]) });
        let err = poll(&consumer, &options(), &AtomicBool::new(false)).expect_err("the failed start surfaces");
        assert!(format!("{err:#}").contains("starting partition 1: restoring"), "{err:#}");
    }

    #[test]
    fn a_stop_ends_the_poll_loop_with_a_handover() {
        let consumer = consumer(fake(1, &[(0, 5)]));
        assert_eq!(poll(&consumer, &options(), &AtomicBool::new(true)).unwrap(), Stop::Handover);
    }

    #[test]
    fn a_started_partition_resumes_at_the_offset_its_state_holds() {
        let consumer = consumer(fake(1, &[]));
        let mut tpl = list(&[0]);
        consumer.context().rebalance(&consumer, RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS, &mut tpl);
        let started = Started {
            partition: 0,
            offset: 42,
            restored_from: RestoredFrom::Local { offset: 42 },
            assigned: Instant::now(),
            took: Duration::ZERO,
        };
        // Seeking needs the partition assigned; resuming a paused one is local.
        resume(&consumer, "positions", &started, 42).expect("seek and resume an assigned partition");
    }

    /// A state inside its log resumes where it is; one at 0 starts at the earliest
    /// record; one past the end is refused whatever the setting; one before the start
    /// is refused, naming the range and the setting, or resumes at the start with it.
    #[test]
    fn a_state_outside_its_log_is_never_jumped_over_in_silence() {
        use OutOfRange::{Earliest, Fail};
        assert_eq!(resume_offset(0, 50, (10, 100), Fail).unwrap(), 50);
        assert_eq!(resume_offset(0, 100, (10, 100), Fail).unwrap(), 100, "at the end: waits for records");
        assert_eq!(resume_offset(0, 0, (10, 100), Fail).unwrap(), 10, "a state that read nothing");
        let past = resume_offset(3, 101, (0, 100), Earliest).unwrap_err().to_string();
        assert!(past.contains("partition 3: its state holds offset 101, past the end of its log (100)"), "{past}");
        let gone = resume_offset(1, 5, (10, 100), Fail).unwrap_err().to_string();
        assert!(gone.contains(OUT_OF_RANGE) && gone.contains("holds 10..100") && gone.contains("5 records"), "{gone}");
        assert!(gone.contains("offset_out_of_range = \"earliest\""), "{gone}");
        assert_eq!(resume_offset(1, 5, (10, 100), Earliest).unwrap(), 10);
    }
}
