//! Records/s through Kafka: vehicle-stats consuming a topic, processing, and producing
//! its outputs to another topic (consume-process-produce), next to a bare rdkafka
//! consumer reading the same topic in the same run.
//!
//! Needs `tansu` on the PATH (`./dev.sh bench` installs it, as for the tests); the
//! benchmark starts it through the tests' `KafkaBroker` (SQLite storage) on a free
//! loopback port, produces `SLUICE_BENCH_KAFKA_RECORDS` (default 200,000) generator
//! records to a topic of four partitions in batches as librdkafka makes them (hundreds
//! of records per produce request), then times, each in a consumer group of its own:
//! a bare rdkafka consumer; one sluice job with the default `[state]`; the same with
//! batches of 20,000 records; and two sluice jobs sharing the group (two hosts, each
//! with its own state, one checkpoint store), whose aggregate rate is reported. The
//! jobs' times exclude their idle stop.

use anyhow::{Result, bail};
use rdkafka::consumer::{BaseConsumer, Consumer};
use sluice::config::{Config, SinkConfig, SourceConfig};
use sluice::source::generator::{Fleet, FleetOptions};
use sluice_tests::{KafkaBroker, bench_setting};
use std::path::Path;
use std::time::{Duration, Instant};

mod common;

const PARTITIONS: i32 = 4;
/// How long a job waits for more records before it stops.
const IDLE_STOP: Duration = Duration::from_secs(5);

fn main() -> Result<()> {
    let records: u64 = bench_setting("SLUICE_BENCH_KAFKA_RECORDS", 200_000)?;
    let broker = KafkaBroker::start()?;
    for topic in ["positions", "summaries"] {
        broker.create_topic(topic, PARTITIONS)?;
    }
    let started = Instant::now();
    let fleet = Fleet::new(&FleetOptions { vehicles: 10_000, count: Some(records), seed: 42, churn: None });
    broker.produce("positions", fleet.map(|record| record.map(|r| (r.key, r.value))))?;
    println!(
        "produced {records} records of 10000 vehicles to a topic of {PARTITIONS} partitions in {:.1}s",
        started.elapsed().as_secs_f64()
    );

    let bare = records as f64 / bare_consumer(&broker, records)?.as_secs_f64();
    println!("bare rdkafka consumer                                  {bare:>10.0} records/s");
    for (label, batch, hosts) in [
        ("one host, default batches (512 records)", None, 1),
        ("one host, batches of 20,000 records", Some(20_000), 1),
        ("two hosts, default batches", None, 2),
    ] {
        let rate = through_sluice(&broker, records, batch, hosts)?;
        println!("sluice, {label:<41}  {rate:>10.0} records/s  ({:.2} of the bare consumer)", rate / bare);
    }
    Ok(())
}

/// Records/s of vehicle-stats from `positions` to `summaries` on `hosts` jobs sharing a
/// group of their own (and a checkpoint store, which a partition moving between them
/// needs); `batch`: records per batch and the most per commit, `None`: the defaults.
fn through_sluice(broker: &KafkaBroker, records: u64, batch: Option<usize>, hosts: usize) -> Result<f64> {
    let dir = tempfile::tempdir()?;
    let group = format!("bench-sluice-{}-{hosts}", batch.unwrap_or_default());
    let configs: Vec<Config> =
        (0..hosts).map(|host| job(broker, &dir.path().join(format!("host-{host}")), &group, batch)).collect();
    let reports = std::thread::scope(|scope| {
        let jobs: Vec<_> = configs.iter().map(|config| scope.spawn(|| sluice::job::run(config))).collect();
        jobs.into_iter().map(|job| job.join().expect("a job thread panicked")).collect::<Result<Vec<_>>>()
    })?;
    let processed: u64 = reports.iter().map(|r| r.processed()).sum();
    if processed < records {
        bail!("the jobs processed {processed} of {records} records");
    }
    let elapsed = reports.iter().map(|r| r.elapsed).max().unwrap_or_default();
    Ok(records as f64 / elapsed.saturating_sub(IDLE_STOP).as_secs_f64())
}

/// A job of vehicle-stats reading `positions` in `group` and writing to `summaries`,
/// everything under `dir`, its checkpoint store shared with the jobs in sibling
/// directories.
fn job(broker: &KafkaBroker, dir: &Path, group: &str, batch: Option<usize>) -> Config {
    let source = SourceConfig::Kafka {
        brokers: broker.bootstrap.clone(),
        topic: "positions".into(),
        group: group.into(),
        instance_id: None,
        properties: Default::default(),
        stop_when_idle: Some(IDLE_STOP),
    };
    let mut config = common::job_config(dir, source);
    config.sink = SinkConfig::Kafka {
        brokers: broker.bootstrap.clone(),
        topic: "summaries".into(),
        properties: Default::default(),
    };
    config.state.partitions = PARTITIONS as u32;
    if let Some(batch) = batch {
        (config.state.batch_records, config.state.commit_every) = (batch, batch);
    }
    let store = dir.parent().expect("a job's directory has a parent").join("store");
    config.checkpoint.store = Some(store.display().to_string());
    config
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
