//! The Kafka sink: outputs as records on Kafka topics, through an idempotent producer.
//!
//! Each output goes to its own topic when the operator named one, else to the
//! configured topic, keyed by the output key (so Kafka's partitioner keeps a key's
//! outputs in order) and with the input's partition and offset as headers
//! (`sluice-partition`, `sluice-offset`) and the operator build that made it
//! (`sluice-operator`); outputs of an expiry also carry `sluice-cause: expiry`.
//! [`KafkaSink::write`] returns only once the
//! broker acknowledged every record of the batch, because the worker commits state
//! right after: an output is never lost, and a crash before the commit replays the
//! batch (at least once, like the file sink). Each batch waits for its own records'
//! acknowledgements only — a producer-wide flush would make every worker wait for the
//! others' records too, and under load never return. This module does not read from
//! Kafka.

use super::EXPIRY_CAUSE;
use crate::config::kafka_client;
use crate::lock;
use crate::record::{Cause, Origin, Output};
use anyhow::{Context, Result, anyhow, bail};
use rdkafka::ClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, ProducerContext, ThreadedProducer};
use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// How long a batch may wait for the broker's acknowledgements.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(60);

/// A producer shared by all workers.
pub struct KafkaSink {
    /// Its own thread serves delivery reports as they arrive, so each worker waits for
    /// its batch's acknowledgements only, never for other workers' records.
    producer: ThreadedProducer<DeliveryReports>,
    topic: String,
    name: String,
}

/// Routes each delivery report to the batch its record belongs to.
struct DeliveryReports;

impl ClientContext for DeliveryReports {
    /// librdkafka's client errors go to the job's log; it keeps reconnecting by itself.
    fn error(&self, error: KafkaError, reason: &str) {
        tracing::warn!("Kafka producer: {error}: {reason}");
    }
}

impl ProducerContext for DeliveryReports {
    type DeliveryOpaque = Arc<BatchAcks>;

    fn delivery(&self, result: &DeliveryResult<'_>, batch: Arc<BatchAcks>) {
        let failure = result
            .as_ref()
            .err()
            .map(|(error, message)| format!("delivering to topic {}: {error}", rdkafka::Message::topic(message)));
        batch.acknowledge(failure);
    }
}

/// The acknowledgements one batch still waits for, and its first failure.
struct BatchAcks {
    state: Mutex<(usize, Option<String>)>,
    done: Condvar,
}

impl BatchAcks {
    fn new(records: usize) -> Self {
        BatchAcks { state: Mutex::new((records, None)), done: Condvar::new() }
    }

    fn acknowledge(&self, failure: Option<String>) {
        let mut state = lock(&self.state);
        state.0 -= 1;
        if state.1.is_none() {
            state.1 = failure;
        }
        if state.0 == 0 {
            self.done.notify_all();
        }
    }

    /// Waits until every record was acknowledged; the first failure, if any, is the error.
    fn wait(&self, timeout: Duration) -> std::result::Result<(), String> {
        let state = lock(&self.state);
        let (state, waited) =
            self.done.wait_timeout_while(state, timeout, |(left, _)| *left > 0).expect("no panics under this lock");
        match &state.1 {
            Some(failure) => Err(failure.clone()),
            None if waited.timed_out() => Err(format!("{} records unacknowledged after {timeout:?}", state.0)),
            None => Ok(()),
        }
    }
}

impl KafkaSink {
    /// Connects an idempotent producer to `brokers`; outputs without a topic go to
    /// `topic`. `properties` are librdkafka settings passed through, and win.
    pub fn open(brokers: &str, topic: &str, properties: &BTreeMap<String, String>) -> Result<Self> {
        let defaults = [
            ("enable.idempotence", "true"),
            ("acks", "all"),
            ("linger.ms", "5"),
            // Java clients' partitioner, so a key lands where Kafka Streams would put it.
            ("partitioner", "murmur2_random"),
        ];
        let producer = kafka_client(brokers, &defaults, properties)
            .create_with_context(DeliveryReports)
            .with_context(|| format!("creating a Kafka producer for {brokers}"))?;
        Ok(KafkaSink { producer, topic: topic.to_string(), name: format!("kafka {brokers} topic {topic}") })
    }

    /// Where this sink writes, for messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Produces `outputs` (made by operator `version`, which goes in a header) and waits
    /// until the broker has acknowledged all of them.
    pub fn write(&self, outputs: &[(Origin, Output)], version: &str) -> Result<()> {
        if outputs.is_empty() {
            return Ok(());
        }
        let acks = Arc::new(BatchAcks::new(outputs.len()));
        for (origin, output) in outputs {
            let (partition, offset) = (origin.partition.to_string(), origin.offset.to_string());
            let mut headers = OwnedHeaders::new()
                .insert(Header { key: "sluice-partition", value: Some(&partition) })
                .insert(Header { key: "sluice-offset", value: Some(&offset) })
                .insert(Header { key: "sluice-operator", value: Some(version) });
            if origin.cause == Cause::Expiry {
                headers = headers.insert(Header { key: "sluice-cause", value: Some(EXPIRY_CAUSE) });
            }
            let mut record = BaseRecord::with_opaque_to(output.topic.as_deref().unwrap_or(&self.topic), acks.clone())
                .key(&output.key)
                .payload(&output.value)
                .headers(headers);
            loop {
                match self.producer.send(record) {
                    Ok(()) => break,
                    // The local queue is full: wait for acknowledgements to make room.
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), returned)) => {
                        record = returned;
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err((error, _)) => {
                        // The records already queued still report to `acks`; nobody waits.
                        bail!("producing to {}: {error}", self.name)
                    }
                }
            }
        }
        acks.wait(DELIVERY_TIMEOUT).map_err(|failure| anyhow!("{}: {failure}", self.name))
    }
}
