//! `sluice generate`: the fleet generator's records, as JSONL on stdout or produced to a
//! Kafka topic (what a user's first Kafka job reads: docs/getting-started.md).
//!
//! This module owns only the command: the generator and its records are the library's
//! (`sluice::source::generator`), as a `generator` source of a job reads them.

use super::args::{GenerateArgs, kafka_topic};
use anyhow::{Context, Result, bail};
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;
use sluice::config;
use sluice::kafka::client_config;
use sluice::source::generator::{Fleet, FleetOptions};
use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Mutex;
use std::time::Duration;

/// `sluice generate`
pub fn generate(args: &GenerateArgs) -> Result<()> {
    let fleet_args = &args.fleet;
    config::check_vehicles("--vehicles", fleet_args.vehicles)?;
    let options = FleetOptions {
        vehicles: fleet_args.vehicles,
        count: Some(fleet_args.count),
        seed: fleet_args.seed,
        churn: fleet_args.churn,
    };
    let fleet = Fleet::new(&options);
    match &args.to {
        Some(url) => produce(fleet, url),
        None => {
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            for record in fleet {
                out.write_all(&record?.value)?;
                out.write_all(b"\n")?;
            }
            Ok(out.flush()?)
        }
    }
}

/// Produces `fleet`'s records to the topic of `url`, each keyed by its vehicle and
/// timestamped with its event time, partitioned as Kafka's Java clients do (murmur2),
/// by an idempotent producer; returns once the brokers acknowledged them all.
fn produce(fleet: Fleet, url: &str) -> Result<()> {
    let (brokers, topic) = kafka_topic("--to", url)?;
    let defaults = [("partitioner", "murmur2_random"), ("enable.idempotence", "true"), ("linger.ms", "20")];
    let producer: ThreadedProducer<Deliveries> = client_config(brokers, &defaults, &BTreeMap::new())
        .create_with_context(Deliveries::default())
        .with_context(|| format!("creating a Kafka producer for {brokers}"))?;
    let mut produced = 0u64;
    for record in fleet {
        let record = record?;
        let mut message =
            BaseRecord::<[u8], [u8]>::to(topic).key(&record.key).payload(&record.value).timestamp(record.timestamp_ms);
        // A full queue empties as the brokers acknowledge; any other error is final.
        while let Err((e, returned)) = producer.send(message) {
            if !matches!(e, KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull)) {
                bail!("producing to {topic} on {brokers}: {e}");
            }
            message = returned;
            producer.poll(Duration::from_millis(10));
        }
        produced += 1;
    }
    producer.flush(Duration::from_secs(60)).with_context(|| format!("waiting for {brokers} to acknowledge"))?;
    if let Some((failed, first)) = producer.context().failed.lock().expect("not poisoned").take() {
        bail!("{failed} of {produced} records were not delivered to topic {topic} on {brokers}; the first: {first}");
    }
    eprintln!("produced {produced} records to topic {topic} on {brokers}");
    Ok(())
}

/// The records the brokers refused: how many, and the first one's error.
#[derive(Default)]
struct Deliveries {
    failed: Mutex<Option<(u64, String)>>,
}

impl rdkafka::ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((error, _)) = result {
            let mut failed = self.failed.lock().expect("not poisoned");
            failed.get_or_insert_with(|| (0, error.to_string())).0 += 1;
        }
    }
}
