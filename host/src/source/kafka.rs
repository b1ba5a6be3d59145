//! The Kafka source: one member of a consumer group reading one topic.
//!
//! Kafka already partitions the log, so records keep the partition and offset the
//! broker gave them. On every assignment the consumer starts each partition at the
//! offset stored *with that partition's state* — never at the group's committed
//! offset — so state and input cannot drift apart; the group's committed offsets are
//! only advanced after state commits, for lag tooling. The job opens every
//! partition's state at start, so this source serves one host per group (several
//! hosts sharing a group, with state restored on assignment, come next).
//!
//! This module owns the consumer and the poll loop; it does not process records.

use super::{Batches, DispatchReport, SourceRecord};
use anyhow::{Context, Result, bail};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Message, Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::sync::mpsc::SyncSender;
use std::time::{Duration, Instant};

/// How often the group's committed offsets follow the state's.
const GROUP_COMMIT_INTERVAL: Duration = Duration::from_secs(1);
/// How long a start waits for the topic's metadata before it says the brokers are
/// unreachable.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

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
    /// Stop once no record arrived for this long since partitions were assigned;
    /// `None` runs until killed.
    pub stop_when_idle: Option<Duration>,
    /// The most records handed to a worker at once.
    pub batch_size: usize,
}

impl KafkaOptions {
    fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &self.brokers)
            .set("group.id", &self.group)
            .set("partition.assignment.strategy", "cooperative-sticky")
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "false");
        if let Some(instance) = &self.instance_id {
            config.set("group.instance.id", instance);
        }
        for (name, value) in &self.properties {
            config.set(name, value);
        }
        config
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

/// Starts every assigned partition at the offset stored with its state.
struct StartAtStateOffsets {
    topic: String,
    offsets: Vec<u64>,
    /// When partitions were last assigned: an idle topic only counts from then.
    assigned_at: std::sync::Mutex<Option<Instant>>,
}

impl ClientContext for StartAtStateOffsets {}

impl ConsumerContext for StartAtStateOffsets {
    fn rebalance(&self, consumer: &BaseConsumer<Self>, err: RDKafkaRespErr, tpl: &mut TopicPartitionList) {
        let cooperative = matches!(consumer.rebalance_protocol(), RebalanceProtocol::Cooperative);
        let result = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                let partitions: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
                for &p in &partitions {
                    let offset = self.offsets.get(p as usize).copied().unwrap_or(0);
                    if let Err(e) = tpl.set_partition_offset(&self.topic, p, Offset::Offset(offset as i64)) {
                        tracing::error!(partition = p, "cannot start at the state's offset {offset}: {e}");
                    }
                }
                tracing::info!("assigned partitions {partitions:?} of {}", self.topic);
                *self.assigned_at.lock().expect("no panics under this lock") = Some(Instant::now());
                if cooperative { consumer.incremental_assign(tpl) } else { consumer.assign(tpl) }
            }
            _ => {
                let partitions: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
                tracing::info!("revoked partitions {partitions:?} of {}", self.topic);
                if cooperative { consumer.incremental_unassign(tpl) } else { consumer.unassign() }
            }
        };
        if let Err(e) = result {
            tracing::error!("applying a rebalance of {}: {e}", self.topic);
        }
    }
}

/// Consumes `options.topic` in `options.group`, starting each partition at
/// `start_offsets[p]`, and sends its records to `workers[p]` in batches; every second
/// it commits `committed(p)` (the offset the state holds) to the group. Returns when
/// the topic was idle for `stop_when_idle` or every worker has gone.
pub fn dispatch(
    options: &KafkaOptions,
    start_offsets: &[u64],
    workers: &[SyncSender<Vec<SourceRecord>>],
    committed: &dyn Fn(u32) -> u64,
) -> Result<DispatchReport> {
    let context = StartAtStateOffsets {
        topic: options.topic.clone(),
        offsets: start_offsets.to_vec(),
        assigned_at: std::sync::Mutex::new(None),
    };
    let consumer: BaseConsumer<StartAtStateOffsets> =
        options.client_config().create_with_context(context).context("creating a Kafka consumer")?;
    consumer.subscribe(&[&options.topic]).with_context(|| format!("subscribing to {}", options.topic))?;
    let mut batches = Batches::new(workers, start_offsets, options.batch_size);
    let (mut last_record, mut last_commit) = (Instant::now(), Instant::now());
    let mut group_offsets = start_offsets.to_vec();
    loop {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(message)) => {
                last_record = Instant::now();
                let p = message.partition() as usize;
                if p >= workers.len() {
                    bail!("topic {} has partition {p}, but the job has {} partitions", options.topic, workers.len());
                }
                let record = SourceRecord {
                    partition: p as u32,
                    offset: message.offset() as u64,
                    key: message.key().unwrap_or_default().to_vec(),
                    value: message.payload().unwrap_or_default().to_vec(),
                    timestamp_ms: message.timestamp().to_millis().unwrap_or(0),
                };
                if !batches.push(record) {
                    return Ok(batches.report());
                }
            }
            // librdkafka retries by itself; say what happened and keep polling.
            Some(Err(e)) => tracing::warn!("consuming {}: {e}", options.topic),
            None => {
                if !batches.flush() {
                    return Ok(batches.report());
                }
                let assigned_at = *consumer.context().assigned_at.lock().expect("no panics under this lock");
                let idle_since = assigned_at.map(|at| at.max(last_record));
                if options.stop_when_idle.zip(idle_since).is_some_and(|(idle, since)| since.elapsed() >= idle) {
                    return Ok(batches.report());
                }
            }
        }
        if last_commit.elapsed() >= GROUP_COMMIT_INTERVAL {
            last_commit = Instant::now();
            let mut tpl = TopicPartitionList::new();
            for (p, known) in group_offsets.iter_mut().enumerate() {
                let offset = committed(p as u32);
                if offset > *known {
                    *known = offset;
                    tpl.add_partition_offset(&options.topic, p as i32, Offset::Offset(offset as i64))?;
                }
            }
            if tpl.count() > 0
                && let Err(e) = consumer.commit(&tpl, CommitMode::Async)
            {
                tracing::warn!("committing group offsets of {}: {e}", options.topic);
            }
        }
    }
}
