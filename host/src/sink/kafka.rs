//! The Kafka sink: outputs as records on Kafka topics, through an idempotent producer.
//!
//! Each output goes to its own topic when the operator named one, else to the
//! configured topic, keyed by the output key (so Kafka's partitioner keeps a key's
//! outputs in order) and with the input's partition and offset as headers
//! (`sluice-partition`, `sluice-offset`). [`KafkaSink::write`] returns only once the
//! broker acknowledged every record of the batch, because the worker commits state
//! right after: an output is never lost, and a crash before the commit replays the
//! batch (at least once, like the file sink). This module does not read from Kafka.

use crate::operator::Output;
use crate::source::SourceRecord;
use anyhow::{Context, Result, bail};
use rdkafka::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

/// How long a batch may wait for the broker's acknowledgements.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(60);

/// A producer shared by all workers.
pub struct KafkaSink {
    /// Polled by the workers' flushes (a background poll thread would make every
    /// flush wait for its next poll, ~100 ms).
    producer: BaseProducer<DeliveryTracker>,
    topic: String,
    name: String,
}

/// Remembers the first failed delivery. It stays: the batch that lost a record must
/// not commit, and neither may any later one.
#[derive(Default)]
struct DeliveryTracker {
    failure: Mutex<Option<String>>,
}

impl ClientContext for DeliveryTracker {}

impl ProducerContext for DeliveryTracker {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((error, message)) = result {
            let mut failure = self.failure.lock().expect("no panics under this lock");
            failure.get_or_insert_with(|| format!("delivering to topic {}: {error}", rdkafka::Message::topic(message)));
        }
    }
}

impl KafkaSink {
    /// Connects an idempotent producer to `brokers`; outputs without a topic go to
    /// `topic`. `properties` are librdkafka settings passed through, and win.
    pub fn open(brokers: &str, topic: &str, properties: &BTreeMap<String, String>) -> Result<Self> {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", brokers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "5")
            // Java clients' partitioner, so a key lands where Kafka Streams would put it.
            .set("partitioner", "murmur2_random");
        for (name, value) in properties {
            config.set(name, value);
        }
        let producer = config
            .create_with_context(DeliveryTracker::default())
            .with_context(|| format!("creating a Kafka producer for {brokers}"))?;
        Ok(KafkaSink { producer, topic: topic.to_string(), name: format!("kafka {brokers} topic {topic}") })
    }

    /// Where this sink writes, for messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Produces `outputs` and waits until the broker has acknowledged all of them.
    pub fn write(&self, outputs: &[(&SourceRecord, Output)]) -> Result<()> {
        if outputs.is_empty() {
            return Ok(());
        }
        for (input, output) in outputs {
            let (partition, offset) = (input.partition.to_string(), input.offset.to_string());
            let headers = OwnedHeaders::new()
                .insert(Header { key: "sluice-partition", value: Some(&partition) })
                .insert(Header { key: "sluice-offset", value: Some(&offset) });
            let mut record = BaseRecord::to(output.topic.as_deref().unwrap_or(&self.topic))
                .key(&output.key)
                .payload(&output.value)
                .headers(headers);
            loop {
                match self.producer.send(record) {
                    Ok(()) => break,
                    // The local queue is full: wait for acknowledgements to make room.
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), returned)) => {
                        record = returned;
                        self.producer.poll(Duration::from_millis(5));
                    }
                    Err((error, _)) => bail!("producing to {}: {error}", self.name),
                }
            }
        }
        self.producer.flush(DELIVERY_TIMEOUT).with_context(|| format!("waiting for {} to acknowledge", self.name))?;
        if let Some(failure) = self.producer.context().failure.lock().expect("no panics under this lock").as_ref() {
            bail!("{}: {failure}", self.name);
        }
        Ok(())
    }
}
