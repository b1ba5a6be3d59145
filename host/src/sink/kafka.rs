//! The Kafka sink: outputs as records on Kafka topics, through an idempotent producer.
//!
//! Each output goes to its own topic when the operator named one, else to the
//! configured topic, keyed by the output key (so Kafka's partitioner keeps a key's
//! outputs in order) and with the input's partition and offset as headers
//! (`sluice-partition`, `sluice-offset`) and the operator build that made it
//! (`sluice-operator`); outputs of an expiry also carry `sluice-cause: expiry`.
//!
//! [`KafkaSink::send`] queues a batch's records and returns at once: a worker goes on
//! with its next batches while the broker acknowledges, and its next commit waits (in
//! [`PartitionOutputs::commit`](super::PartitionOutputs::commit)) until every output of the batches it
//! covers is acknowledged, because state must never be ahead of its outputs. Each
//! partition waits for its own records' acknowledgements only — a producer-wide flush
//! would make every worker wait for the others' records too, and under load never
//! return. This module does not read from Kafka.

use super::EXPIRY_CAUSE;
use crate::config::kafka_client;
use crate::lock;
use crate::record::{Cause, Origin, Output};
use anyhow::{Context, Result, bail};
use rdkafka::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, ProducerContext, ThreadedProducer};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// How long a commit may wait for the broker's acknowledgements of the outputs it covers.
pub const DELIVERY_TIMEOUT: Duration = Duration::from_secs(60);

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
                acks.fail(format!("delivering the output of input {} to topic {topic}: {error}", input_of(message)))
            }
        }
    }
}

/// `partition/offset` of the input whose output `message` is, from its headers.
fn input_of(message: &rdkafka::message::BorrowedMessage<'_>) -> String {
    use rdkafka::message::Headers;
    let header = |name: &str| {
        let headers = rdkafka::Message::headers(message)?;
        let value = headers.iter().find(|h| h.key == name)?.value?;
        Some(String::from_utf8_lossy(value).into_owned())
    };
    let or_unknown = |value: Option<String>| value.unwrap_or_else(|| "?".into());
    format!("{}/{}", or_unknown(header("sluice-partition")), or_unknown(header("sluice-offset")))
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
    kafka_client(brokers, &defaults, properties)
}

/// The headers of the output record of `origin` made by operator `version`.
pub(super) fn headers(origin: &Origin, version: &str) -> OwnedHeaders {
    let (partition, offset) = (origin.partition.to_string(), origin.offset.to_string());
    let headers = OwnedHeaders::new()
        .insert(Header { key: "sluice-partition", value: Some(&partition) })
        .insert(Header { key: "sluice-offset", value: Some(&offset) })
        .insert(Header { key: "sluice-operator", value: Some(version) });
    match origin.cause {
        Cause::Expiry => headers.insert(Header { key: "sluice-cause", value: Some(EXPIRY_CAUSE) }),
        Cause::Record => headers,
    }
}

/// Whether the producer refused `error`'s record for the record itself — it is over
/// the producer's `message.max.bytes` — rather than failing: such an output is the
/// operator's error and costs only itself, while any other failure stops the partition.
pub(super) fn refuses_the_record(error: &KafkaError) -> bool {
    matches!(error, KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge))
}

/// Queues `record` on `producer`, waiting while its queue is full (it empties as the
/// broker acknowledges); any other refusal is the error.
pub(super) fn send_waiting<C: ProducerContext + 'static>(
    producer: &ThreadedProducer<C>,
    mut record: BaseRecord<'_, [u8], [u8], C::DeliveryOpaque>,
) -> std::result::Result<(), KafkaError> {
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), returned)) => {
                record = returned;
                std::thread::sleep(Duration::from_millis(1));
            }
            Err((error, _)) => return Err(error),
        }
    }
}

impl KafkaSink {
    /// Connects an idempotent producer to `brokers`; outputs without a topic go to
    /// `topic`. `properties` are librdkafka settings passed through, and win.
    pub fn open(brokers: &str, topic: &str, properties: &BTreeMap<String, String>) -> Result<Self> {
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
    /// of outputs the producer refuses for themselves go into `refused`; returns how many.
    pub fn send(
        &self,
        outputs: &[(Origin, Output)],
        version: &str,
        acks: &Arc<Acks>,
        refused: &mut Vec<u8>,
    ) -> Result<u64> {
        // Counted at once, before any can be acknowledged: one atomic add per batch.
        acks.left.fetch_add(outputs.len(), Ordering::AcqRel);
        let mut refusals = 0;
        for (sent, (origin, output)) in outputs.iter().enumerate() {
            let record = BaseRecord::with_opaque_to(output.topic.as_deref().unwrap_or(&self.topic), acks.clone())
                .key(&output.key[..])
                .payload(&output.value[..])
                .headers(headers(origin, version));
            match send_waiting(&self.producer, record) {
                Ok(()) => {}
                Err(error) if refuses_the_record(&error) => {
                    acks.left.fetch_sub(1, Ordering::AcqRel);
                    super::format_refused(refused, origin, output, version, &error);
                    refusals += 1;
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
        Ok(refusals)
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
