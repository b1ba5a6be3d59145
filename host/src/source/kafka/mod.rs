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
//! pause: it is tried again with a [`Backoff`](crate::backoff::Backoff) (1, 2, 4… s) for up to `[checkpoint]
//! restore_retry_timeout`, then the partition stops alone.
//!
//! The revocation callback stops its partitions at once (a restore under way is given
//! up, not waited for), so the poll loop keeps within `max.poll.interval.ms`. A fatal
//! consumer error — this member fenced by another with its `group.instance.id`, above
//! all — ends the run with that error: the member can no longer take part in its group,
//! and its partitions are another member's (dropped as lost).
//!
//! A record keeps its Kafka headers, but for those named like the marks the source adds
//! ([`NULL_KEY_HEADER`](crate::record::NULL_KEY_HEADER), [`TOMBSTONE_HEADER`](crate::record::TOMBSTONE_HEADER)): a producer could otherwise make a record
//! pass for keyless or a tombstone. They are dropped, and the first is warned about.
//!
//! This module owns the consumer, the rebalance callbacks and the poll loop. It drives
//! partition ownership through [`Partitions`] only; it does not process records or
//! restore state (the [partitions](crate::partitions) and the [worker](crate::worker)
//! do). One room per concern: `membership` (the rebalance callbacks), `poll` (the loop
//! around librdkafka's poll), `resume` (where a partition resumes), `record` (a message
//! as a record), `reader` (one partition read outside any group, for `sluice replay`),
//! `group` (the group's members as its coordinator describes them).

mod group;
mod membership;
mod poll;
mod reader;
mod record;
mod resume;
#[cfg(test)]
mod tests;

pub use group::{GroupDescriber, GroupMember};
pub use reader::PartitionReader;
pub use resume::resume_offset;

use super::events::MEMBER_FAILED;
use super::{Partitions, Started};
use crate::config::{GroupProtocol, OutOfRange};
use crate::kafka::client_config;
use crate::lock;
use crate::record::Stop;
use anyhow::{Context, Result, bail};
use membership::Membership;
use poll::poll;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// How long a start waits for the topic's metadata before it says the brokers are
/// unreachable.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one poll waits for a record: also how often the loop looks at everything
/// else (started partitions, backed-up ones, group offsets, a stop).
const POLL_TIMEOUT: Duration = Duration::from_millis(100);

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
        let name = self.member_name();
        defaults.push(("client.id", &name));
        client_config(&self.brokers, &defaults, &self.properties)
    }

    /// What this member is known by in its group's description
    /// ([`GroupDescriber`]): its `group.instance.id` (`[source] instance_id`), else its
    /// `client.id` — a property set, or `sluice-<host id>`, which names the process.
    pub fn member_name(&self) -> String {
        let client_id = self.properties.get("client.id").cloned();
        let name = self.instance_id.clone().or(client_id);
        name.unwrap_or_else(|| format!("sluice-{}", crate::checkpoint::host_id()))
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
