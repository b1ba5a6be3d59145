//! The Kafka sink: outputs as records on Kafka topics, through an idempotent producer.
//!
//! Each output goes to its own topic when the operator named one, else to the
//! configured topic, keyed by the output key (so Kafka's partitioner keeps a key's
//! outputs in order) and with the input's partition and offset as headers
//! (`sluice-partition`, `sluice-offset`) and the operator build that made it
//! (`sluice-operator`); outputs of an expiry also carry `sluice-cause: expiry`.
//!
//! A dead letter on a Kafka topic (`[dead_letter] topic`) is the failed record as it
//! was — key and value, bytes unchanged — with the same headers and why it failed:
//! `sluice-error` (`rejected`, `trapped`, `refused`), `sluice-reason`, and where they
//! apply `sluice-attempts` and `sluice-topic` (the topic a refused output was for). One
//! too large for Kafka goes without its key and value, `sluice-dropped` saying how
//! many bytes they held, so a dead letter never stops its partition for its size.
//!
//! [`KafkaSink::send`] queues a batch's records and returns at once: a worker goes on
//! with its next batches while the broker acknowledges, and its next commit waits (in
//! [`PartitionOutputs::commit`](super::PartitionOutputs::commit)) until every output of the batches it
//! covers is acknowledged, because state must never be ahead of its outputs. Each
//! partition waits for its own records' acknowledgements only — a producer-wide flush
//! would make every worker wait for the others' records too, and under load never
//! return. This module does not read from Kafka.

use super::events::QUEUE_STAYED_FULL;
use crate::kafka::client_config;
use crate::lock;
use crate::record::{DeadLetter, Origin, Output};
use anyhow::{Context, Result, bail};
use rdkafka::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, ProducerContext, ThreadedProducer};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long a commit may wait for the broker's acknowledgements of the outputs it
/// covers, and a record for room in the producer's queue, which empties only as the
/// broker acknowledges.
pub const DELIVERY_TIMEOUT: Duration = Duration::from_secs(60);

/// How long reading a topic's metadata at the start may take.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

/// Fails, naming it, unless `topic` (where `what` sends records) exists on `brokers`
/// (the client's `properties` passed through): producers never create topics, so a
/// missing one would otherwise fail only at its first record, after the delivery
/// timeout. Asked through a consumer: a producer's metadata request has the broker create
/// the topic.
pub(super) fn check_topic(brokers: &str, properties: &BTreeMap<String, String>, topic: &str, what: &str) -> Result<()> {
    let consumer: rdkafka::consumer::BaseConsumer =
        client_config(brokers, &[("allow.auto.create.topics", "false")], properties)
            .create()
            .with_context(|| format!("creating a Kafka client for {brokers}"))?;
    let metadata = rdkafka::consumer::Consumer::fetch_metadata(&consumer, Some(topic), METADATA_TIMEOUT)
        .with_context(|| format!("reading metadata of topic {topic} from {brokers}"))?;
    match metadata.topics().first() {
        Some(found) if found.error().is_none() && !found.partitions().is_empty() => Ok(()),
        _ => bail!("{what} topic {topic} does not exist on {brokers}: create it first (sluice never creates topics)"),
    }
}

/// A producer shared by all workers.
pub struct KafkaSink {
    /// Its own thread serves delivery reports as they arrive, so each worker waits for
    /// its own records' acknowledgements only, never for other workers' records.
    producer: ThreadedProducer<DeliveryReports>,
    topic: String,
    name: String,
}

/// Routes each delivery report to the acknowledgements its record counts in.
struct DeliveryReports;

impl ClientContext for DeliveryReports {
    /// librdkafka's client errors go to the job's log; it keeps reconnecting by itself.
    fn error(&self, error: KafkaError, reason: &str) {
        tracing::warn!("Kafka producer: {error}: {reason}");
    }
}

impl ProducerContext for DeliveryReports {
    type DeliveryOpaque = Arc<Acks>;

    fn delivery(&self, result: &DeliveryResult<'_>, acks: Arc<Acks>) {
        match result {
            Ok(_) => acks.acknowledge(),
            Err((error, message)) => {
                let topic = rdkafka::Message::topic(message);
                acks.fail(format!("delivering {} to topic {topic}: {error}", what_of(message)))
            }
        }
    }
}

/// What `message` is, from its headers: `the output of input <partition>/<offset>`, or
/// `the dead letter of input …`.
fn what_of(message: &rdkafka::message::BorrowedMessage<'_>) -> String {
    use rdkafka::message::Headers;
    let header = |name: &str| {
        let headers = rdkafka::Message::headers(message)?;
        let value = headers.iter().find(|h| h.key == name)?.value?;
        Some(String::from_utf8_lossy(value).into_owned())
    };
    let or_unknown = |value: Option<String>| value.unwrap_or_else(|| "?".into());
    let what = if header("sluice-error").is_some() { "the dead letter" } else { "the output" };
    format!("{what} of input {}/{}", or_unknown(header("sluice-partition")), or_unknown(header("sluice-offset")))
}

/// The acknowledgements one partition's outputs since its last commit still wait for,
/// and the first failure among them.
///
/// A delivery report costs one atomic decrement; the lock is taken only by a failure,
/// by the last acknowledgement a waiter may be waiting for, and by the waiter.
#[derive(Default)]
pub struct Acks {
    /// Records sent and not yet acknowledged.
    left: AtomicUsize,
    failed: AtomicBool,
    /// The first failure; also the mutex a waiter sleeps under.
    failure: Mutex<Option<String>>,
    done: Condvar,
}

impl Acks {
    fn acknowledge(&self) {
        if self.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            // Taken after the decrement, so a waiter either sees zero or is already
            // asleep and gets this notification.
            let _waiter = lock(&self.failure);
            self.done.notify_all();
        }
    }

    fn fail(&self, failure: String) {
        self.left.fetch_sub(1, Ordering::AcqRel);
        let mut first = lock(&self.failure);
        first.get_or_insert(failure);
        self.failed.store(true, Ordering::Release);
        self.done.notify_all();
    }

    /// The first failure reported so far, without waiting.
    pub fn failure(&self) -> Option<String> {
        self.failed.load(Ordering::Acquire).then(|| lock(&self.failure).clone()).flatten()
    }

    /// Waits until every record sent was acknowledged or one failed; the first failure,
    /// or the records left after `timeout`, is the error.
    pub fn wait(&self, timeout: Duration) -> std::result::Result<(), String> {
        let first = lock(&self.failure);
        let (first, waited) = self
            .done
            .wait_timeout_while(first, timeout, |first| first.is_none() && self.left.load(Ordering::Acquire) > 0)
            .expect("no panics under this lock");
        match &*first {
            Some(failure) => Err(failure.clone()),
            None if waited.timed_out() => {
                Err(format!("{} records unacknowledged after {timeout:?}", self.left.load(Ordering::Acquire)))
            }
            None => Ok(()),
        }
    }
}

/// The producer settings of every output producer, before the user's properties: an
/// idempotent producer (a retried send is neither duplicated nor reordered) that
/// partitions like Java clients, so a key lands where Kafka Streams would put it, and
/// never has the broker create a topic it writes to (an output to a missing topic fails).
pub(super) fn producer_config(brokers: &str, properties: &BTreeMap<String, String>) -> ClientConfig {
    let defaults = [
        ("enable.idempotence", "true"),
        ("acks", "all"),
        ("linger.ms", "5"),
        ("partitioner", "murmur2_random"),
        ("allow.auto.create.topics", "false"),
    ];
    client_config(brokers, &defaults, properties)
}

/// The headers of the output record of `origin` made by operator `version`.
pub(super) fn headers(origin: &Origin, version: &str) -> OwnedHeaders {
    let (partition, offset) = (origin.partition.to_string(), origin.offset.to_string());
    let headers = OwnedHeaders::new()
        .insert(Header { key: "sluice-partition", value: Some(&partition) })
        .insert(Header { key: "sluice-offset", value: Some(&offset) })
        .insert(Header { key: "sluice-operator", value: Some(version) });
    match origin.cause.name() {
        Some(cause) => headers.insert(Header { key: "sluice-cause", value: Some(cause) }),
        None => headers,
    }
}

/// The most bytes of a dead letter's reason kept in the header of one sent without
/// its key and value.
const DROPPED_REASON_BYTES: usize = 1024;

/// Queues dead letter `dead` (of operator `version`) on `producer` for `topic`, with
/// the delivery opaque `opaque` makes. One the producer refuses for its size goes
/// again without its key and value and with its reason cut short; any other refusal is
/// the error.
pub(super) fn send_dead_letter<C: ProducerContext + 'static>(
    producer: &ThreadedProducer<C>,
    topic: &str,
    dead: &DeadLetter,
    version: &str,
    opaque: impl Fn() -> C::DeliveryOpaque,
) -> std::result::Result<(), SendError> {
    let attempts = dead.attempts.map(|a| a.to_string());
    let headers = |reason: &str, dropped: Option<&str>| {
        let mut headers = headers(&dead.origin, version)
            .insert(Header { key: "sluice-error", value: Some(dead.kind.name()) })
            .insert(Header { key: "sluice-reason", value: Some(reason) });
        let optional = [("sluice-attempts", attempts.as_deref()), ("sluice-topic", dead.topic.as_deref())];
        for (key, value) in optional.into_iter().chain([("sluice-dropped", dropped)]) {
            if let Some(value) = value {
                headers = headers.insert(Header { key, value: Some(value) });
            }
        }
        headers
    };
    let whole = BaseRecord::with_opaque_to(topic, opaque())
        .key(&dead.key[..])
        .payload(&dead.value[..])
        .headers(headers(&dead.reason, None));
    match send_waiting(producer, whole) {
        Err(error) if refuses_the_record(&error) => {
            let cut = dead.reason.floor_char_boundary(DROPPED_REASON_BYTES);
            let dropped = format!("{} key and value bytes: {error}", dead.key.len() + dead.value.len());
            let bare = BaseRecord::<[u8], [u8], _>::with_opaque_to(topic, opaque())
                .headers(headers(&dead.reason[..cut], Some(&dropped)));
            send_waiting(producer, bare)
        }
        sent => sent,
    }
}

/// Whether the producer refused `error`'s record for the record itself — it is over
/// the producer's `message.max.bytes` — rather than failing: such an output is the
/// operator's error and costs only itself, while any other failure stops the partition.
pub(super) fn refuses_the_record(error: &SendError) -> bool {
    matches!(error, SendError::Kafka(KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge)))
}

/// Why [`send_waiting`] did not queue a record.
#[derive(Debug, thiserror::Error)]
pub(super) enum SendError {
    /// The producer refused it.
    #[error(transparent)]
    Kafka(KafkaError),
    /// The producer's queue stayed full for [`DELIVERY_TIMEOUT`].
    #[error(
        "{QUEUE_STAYED_FULL} for {DELIVERY_TIMEOUT:?}: the broker acknowledged nothing meanwhile (the queue holds \
         [sink.properties] queue.buffering.max.messages records and queue.buffering.max.kbytes KiB)"
    )]
    QueueStayedFull,
}

impl SendError {
    /// librdkafka's code for the failure, where it has one.
    pub(super) fn code(&self) -> Option<RDKafkaErrorCode> {
        match self {
            SendError::Kafka(error) => error.rdkafka_error_code(),
            SendError::QueueStayedFull => Some(RDKafkaErrorCode::QueueFull),
        }
    }
}

/// Queues `record` on `producer`, waiting while its queue is full (it empties as the
/// broker acknowledges), for up to [`DELIVERY_TIMEOUT`]; that, or any other refusal,
/// is the error.
pub(super) fn send_waiting<C: ProducerContext + 'static>(
    producer: &ThreadedProducer<C>,
    mut record: BaseRecord<'_, [u8], [u8], C::DeliveryOpaque>,
) -> std::result::Result<(), SendError> {
    let mut full_since = None;
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), returned)) => {
                if full_since.get_or_insert_with(Instant::now).elapsed() >= DELIVERY_TIMEOUT {
                    return Err(SendError::QueueStayedFull);
                }
                record = returned;
                std::thread::sleep(Duration::from_millis(1));
            }
            Err((error, _)) => return Err(SendError::Kafka(error)),
        }
    }
}

impl KafkaSink {
    /// Connects an idempotent producer to `brokers`; outputs without a topic go to
    /// `topic`, which must exist. `properties` are librdkafka settings passed through,
    /// and win.
    pub fn open(brokers: &str, topic: &str, properties: &BTreeMap<String, String>) -> Result<Self> {
        check_topic(brokers, properties, topic, "[sink]")?;
        let producer = producer_config(brokers, properties)
            .create_with_context(DeliveryReports)
            .with_context(|| format!("creating a Kafka producer for {brokers}"))?;
        Ok(KafkaSink { producer, topic: topic.to_string(), name: format!("kafka {brokers} topic {topic}") })
    }

    /// Where this sink writes, for messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Queues `outputs` (made by operator `version`, which goes in a header) for the
    /// broker, each counted in `acks` until the broker acknowledges it. The dead letters
    /// of outputs the producer refuses for themselves go into `refused`.
    pub fn send(
        &self,
        outputs: &[(Origin, Output)],
        version: &str,
        acks: &Arc<Acks>,
        refused: &mut Vec<DeadLetter>,
    ) -> Result<()> {
        // Counted at once, before any can be acknowledged: one atomic add per batch.
        acks.left.fetch_add(outputs.len(), Ordering::AcqRel);
        for (sent, (origin, output)) in outputs.iter().enumerate() {
            let record = BaseRecord::with_opaque_to(output.topic.as_deref().unwrap_or(&self.topic), acks.clone())
                .key(&output.key[..])
                .payload(&output.value[..])
                .headers(headers(origin, version));
            match send_waiting(&self.producer, record) {
                Ok(()) => {}
                Err(error) if refuses_the_record(&error) => {
                    acks.left.fetch_sub(1, Ordering::AcqRel);
                    refused.push(super::refused(origin, output, &error));
                }
                Err(error) => {
                    // This one and the rest were never queued, so never reported: they
                    // are the caller's error.
                    acks.left.fetch_sub(outputs.len() - sent, Ordering::AcqRel);
                    bail!(
                        "producing the output of input {}/{} to {}: {error}",
                        origin.partition,
                        origin.offset,
                        self.name
                    )
                }
            }
        }
        Ok(())
    }

    /// Queues `dead` (of operator `version`) for `topic`, each counted in `acks` until
    /// the broker acknowledges it.
    pub fn send_dead_letters(&self, topic: &str, dead: &[DeadLetter], version: &str, acks: &Arc<Acks>) -> Result<()> {
        for dead in dead {
            acks.left.fetch_add(1, Ordering::AcqRel);
            if let Err(error) = send_dead_letter(&self.producer, topic, dead, version, || acks.clone()) {
                acks.left.fetch_sub(1, Ordering::AcqRel);
                let (partition, offset) = (dead.origin.partition, dead.origin.offset);
                bail!("producing the dead letter of input {partition}/{offset} to topic {topic}: {error}")
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent(acks: &Acks, records: usize) {
        acks.left.fetch_add(records, Ordering::AcqRel);
    }

    /// A wait ends when the last record sent is acknowledged, not before; records sent
    /// after that are waited for again.
    #[test]
    fn a_wait_ends_at_the_last_acknowledgement() {
        let acks = Arc::new(Acks::default());
        assert_eq!(acks.wait(Duration::ZERO), Ok(()), "nothing sent, nothing to wait for");
        sent(&acks, 3);
        let reporter = {
            let acks = acks.clone();
            std::thread::spawn(move || {
                for _ in 0..3 {
                    std::thread::sleep(Duration::from_millis(20));
                    acks.acknowledge();
                }
            })
        };
        assert_eq!(acks.wait(Duration::from_secs(10)), Ok(()));
        assert_eq!(acks.left.load(Ordering::Acquire), 0, "woken only by the last acknowledgement");
        reporter.join().unwrap();
        sent(&acks, 2);
        acks.acknowledge();
        assert_eq!(acks.wait(Duration::from_millis(50)), Err("1 records unacknowledged after 50ms".into()));
        assert_eq!(acks.failure(), None, "a timeout is not a delivery failure");
    }

    /// The first failure ends a wait at once, with records still unacknowledged, and
    /// stays the error whatever is reported after it.
    #[test]
    fn the_first_failure_ends_a_wait() {
        let acks = Arc::new(Acks::default());
        sent(&acks, 4);
        acks.acknowledge();
        assert_eq!(acks.failure(), None);
        let reporter = {
            let acks = acks.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                acks.fail("first".into());
                acks.fail("second".into());
            })
        };
        assert_eq!(acks.wait(Duration::from_secs(10)), Err("first".into()));
        reporter.join().unwrap();
        acks.acknowledge();
        assert_eq!(acks.failure(), Some("first".into()));
        assert_eq!(acks.wait(Duration::ZERO), Err("first".into()));
    }
}
