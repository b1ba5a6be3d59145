//! Records/s through Kafka: vehicle-stats consuming a topic, processing, and producing
//! its outputs to another topic (consume-process-produce), next to a bare rdkafka
//! consumer reading the same topic in the same run.
//!
//! Needs `tansu` on the PATH (`./dev.sh bench` installs it, as for the tests); the
//! benchmark starts it through the tests' `KafkaBroker` on a free loopback port with in-memory storage, produces
//! `SLUICE_BENCH_KAFKA_RECORDS` (default 200,000) generator records to a topic of two
//! partitions, one record per batch (tansu 0.6 mis-serves fetches that start inside a
//! batch, which every resume of a backed-up partition does; one-record batches also
//! make tansu slow to serve, hence the modest count), then times both readers. Both
//! join a consumer group, so both include a group join; the job's time excludes its
//! idle stop. The job runs twice: with the default `[state]` (batches of 512 records,
//! state committed by time) and with batches of 20,000 records.

use anyhow::{Result, bail};
use rdkafka::consumer::{BaseConsumer, Consumer};
use sluice::config::{SinkConfig, SourceConfig};
use sluice::source::generator::{Fleet, FleetOptions};
use sluice_tests::{KafkaBroker, bench_setting};
use std::time::{Duration, Instant};

mod common;

const PARTITIONS: i32 = 2;
/// How long the job waits for more records before it stops (tansu can take seconds to
/// serve a first fetch of many one-record batches).
const IDLE_STOP: Duration = Duration::from_secs(10);

fn main() -> Result<()> {
    let records: u64 = bench_setting("SLUICE_BENCH_KAFKA_RECORDS", 200_000)?;
    let broker = KafkaBroker::start()?;
    for topic in ["positions", "summaries"] {
        broker.create_topic(topic, PARTITIONS)?;
    }
    let started = Instant::now();
    produce(&broker, records)?;
    println!(
        "produced {records} records of 10000 vehicles to a topic of {PARTITIONS} partitions in {:.1}s",
        started.elapsed().as_secs_f64()
    );

    let bare = bare_consumer(&broker, records)?;
    println!(
        "bare rdkafka consumer                                    {:>10.0} records/s",
        records as f64 / bare.as_secs_f64()
    );

    let bare_rate = records as f64 / bare.as_secs_f64();
    // A worker waits for the broker to acknowledge each batch's outputs before the
    // next, so the batch size sets how often it waits a produce round trip.
    for batch in [None, Some(20_000)] {
        let rate = through_sluice(&broker, records, batch)?;
        let label = batch.map_or("default batches (512 records)".to_string(), |b| format!("batches of {b} records"));
        println!(
            "sluice consume-process-produce, {label:<29}  {rate:>10.0} records/s  ({:.2} of the bare consumer)",
            rate / bare_rate
        );
    }
    Ok(())
}

/// Records/s of vehicle-stats from `positions` to `summaries`, in its own group.
/// `batch`: records per batch and the most per commit; `None`: the defaults.
fn through_sluice(broker: &KafkaBroker, records: u64, batch: Option<usize>) -> Result<f64> {
    let dir = tempfile::tempdir()?;
    let source = SourceConfig::Kafka {
        brokers: broker.bootstrap.clone(),
        topic: "positions".into(),
        group: format!("bench-sluice-{}", batch.unwrap_or_default()),
        instance_id: None,
        properties: Default::default(),
        stop_when_idle: Some(IDLE_STOP),
    };
    let mut config = common::job_config(dir.path(), source);
    config.sink = SinkConfig::Kafka {
        brokers: broker.bootstrap.clone(),
        topic: "summaries".into(),
        properties: Default::default(),
    };
    config.state.partitions = PARTITIONS as u32;
    if let Some(batch) = batch {
        (config.state.batch_records, config.state.commit_every) = (batch, batch);
    }
    config.checkpoint.enabled = false;
    let report = sluice::job::run(&config)?;
    if report.processed() != records {
        bail!("the job processed {} of {records} records", report.processed());
    }
    Ok(records as f64 / report.elapsed.saturating_sub(IDLE_STOP).as_secs_f64())
}

/// Produces `records` generator records to `positions` (one record per batch: tansu 0.6
/// mis-serves fetches that start inside a batch, which every pause/resume of a backed-up
/// partition does; see the README).
fn produce(broker: &KafkaBroker, records: u64) -> Result<()> {
    let fleet = Fleet::new(&FleetOptions { vehicles: 10_000, count: Some(records), seed: 42, churn: None });
    broker.produce("positions", fleet.map(|record| record.map(|r| (r.key, r.value))))?;
    Ok(())
}

/// How long a plain consumer-group member takes to read `records` records.
fn bare_consumer(broker: &KafkaBroker, records: u64) -> Result<Duration> {
    let started = Instant::now();
    let consumer: BaseConsumer = broker.consumer_config("bench-bare").set("auto.offset.reset", "earliest").create()?;
    consumer.subscribe(&["positions"])?;
    let mut read = 0;
    while read < records {
        if let Some(message) = consumer.poll(Duration::from_millis(100)) {
            message?;
            read += 1;
        }
        if started.elapsed() > Duration::from_secs(600) {
            bail!("the bare consumer read {read} of {records} records in 10 minutes");
        }
    }
    Ok(started.elapsed())
}
