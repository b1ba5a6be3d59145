//! Records/s through Kafka: vehicle-stats consuming a topic, processing, and producing
//! its outputs to another topic (consume-process-produce), next to a bare rdkafka
//! consumer reading the same topic in the same run.
//!
//! Runs on Apache Kafka (`./dev.sh bench` installs it, as for the tests), one node
//! started through the tests' `KafkaBroker` on free loopback ports. It produces
//! `SLUICE_BENCH_KAFKA_RECORDS` (default 200,000) generator
//! records to a topic of four partitions in batches as librdkafka makes them (hundreds
//! of records per produce request), then times, each in a consumer group of its own, a
//! bare rdkafka consumer and sluice jobs: one with the default `[state]`, one with
//! batches of 20,000 records, two sharing the group (two hosts, each with its own state,
//! one checkpoint store; their aggregate rate), one with exactly-once outputs, and one
//! with its outputs to a file (what consuming alone costs). The
//! jobs' times exclude their idle stop. Then the same job without Kafka — the same
//! records from the generator, outputs to a file — gives sluice's own rate on this
//! machine, the ceiling the Kafka rows can approach.
//!
//! Each row also gives the CPU time per record of the whole process (every thread), and
//! the bare consumer's CPU per record divided by the row's: the rate per core. The
//! broker's own CPU is not counted.

use anyhow::{Result, bail};
use rdkafka::consumer::{BaseConsumer, Consumer};
use sluice::config::{Config, Guarantee, SinkConfig, SourceConfig};
use sluice::job::JobReport;
use sluice::probes::process_cpu;
use sluice::source::generator::{Fleet, FleetOptions};
use sluice_e2e::{KafkaBroker, bench_setting};
use std::path::Path;
use std::time::{Duration, Instant};

mod common;

const PARTITIONS: i32 = 4;
/// How long a job waits for more records before it stops.
const IDLE_STOP: Duration = Duration::from_secs(5);

/// One sluice row: records per batch (and the most per commit; `None`: the defaults),
/// hosts sharing the group, and where the outputs go.
#[derive(Clone, Copy)]
struct Setting {
    label: &'static str,
    batch: Option<usize>,
    hosts: usize,
    outputs: Outputs,
}

/// Where a [`Setting`]'s job writes its outputs.
#[derive(Clone, Copy)]
enum Outputs {
    /// To the topic `summaries`, with this guarantee.
    Kafka(Guarantee),
    /// To a file: the job costs only its consumer.
    File,
}

fn main() -> Result<()> {
    let records: u64 = bench_setting("SLUICE_BENCH_KAFKA_RECORDS", 200_000)?;
    let default = Setting {
        label: "one host, defaults (batches of 512)",
        batch: None,
        hosts: 1,
        outputs: Outputs::Kafka(Guarantee::AtLeastOnce),
    };
    let settings = [
        default,
        Setting { label: "one host, batches of 20,000 records", batch: Some(20_000), ..default },
        Setting { label: "two hosts, defaults (aggregate)", hosts: 2, ..default },
        Setting { label: "one host, exactly once", outputs: Outputs::Kafka(Guarantee::ExactlyOnce), ..default },
        Setting { label: "one host, outputs to a file", outputs: Outputs::File, ..default },
    ];
    // The broker runs as Kafka's own scripts run it (kafka-server-start.sh's heap,
    // kafka-run-class.sh's JVM settings), not as the tests' quick-starting one.
    // SAFETY: no other thread runs yet to read the environment meanwhile.
    unsafe {
        std::env::set_var("KAFKA_HEAP_OPTS", "-Xmx1G -Xms1G");
        std::env::set_var(
            "KAFKA_JVM_PERFORMANCE_OPTS",
            "-server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 \
             -XX:+ExplicitGCInvokesConcurrent -Djava.awt.headless=true",
        );
    }
    let broker = KafkaBroker::start()?;
    fill(&broker, records)?;
    // A first read, untimed, warms the broker (its JIT, the page cache) for every row.
    bare_consumer(&broker, "bench-warm-up", records)?;
    let (bare, bare_cpu) = bare_consumer(&broker, "bench-bare", records)?;
    println!("bare rdkafka consumer                             {bare:>10.0} records/s  {bare_cpu:>6.2} µs CPU/record");
    let row = |label: &str, (rate, cpu): (f64, f64)| {
        println!(
            "sluice, {label:<41} {rate:>10.0} records/s  {cpu:>6.2} µs CPU/record  ({:.2} of the bare consumer; {:.2} per core)",
            rate / bare,
            bare_cpu / cpu
        )
    };
    for setting in &settings {
        row(setting.label, through_sluice(&broker, IDLE_STOP, records, setting)?);
    }
    row("one host, generator to a file (no Kafka)", without_kafka(records)?);
    Ok(())
}

/// Creates the two topics on `broker` and produces `records` generator records to
/// `positions`.
fn fill(broker: &KafkaBroker, records: u64) -> Result<()> {
    for topic in ["positions", "summaries"] {
        broker.create_topic(topic, PARTITIONS)?;
    }
    let started = Instant::now();
    let fleet = Fleet::new(&FleetOptions { vehicles: 10_000, count: Some(records), seed: 42, churn: None });
    broker.produce("positions", fleet.map(|record| record.map(|r| (r.key, r.value))))?;
    println!(
        "produced {records} records of 10000 vehicles to a topic of {PARTITIONS} partitions on {} in {:.1}s",
        broker.bootstrap,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Records/s of jobs that together processed `records` and reported `reports`, their
/// times less `idle` (their idle stop), and the process's CPU time per record over them
/// (every thread; jobs that run together each count all of it, so the largest is taken).
fn rate_and_cpu(records: u64, reports: &[JobReport], idle: Duration) -> Result<(f64, f64)> {
    let processed: u64 = reports.iter().map(JobReport::processed).sum();
    if processed < records {
        bail!("the jobs processed {processed} of {records} records");
    }
    let elapsed = reports.iter().map(|r| r.elapsed).max().unwrap_or_default();
    let cpu = reports.iter().filter_map(|r| r.cpu).max().unwrap_or_default();
    Ok((records as f64 / elapsed.saturating_sub(idle).as_secs_f64(), cpu.as_secs_f64() * 1e6 / records as f64))
}

/// Records/s of the default job over the same records with neither a Kafka source nor a
/// Kafka sink — the generator (same seed) to a file, as many partitions — and its CPU
/// time per record.
fn without_kafka(records: u64) -> Result<(f64, f64)> {
    let dir = tempfile::tempdir()?;
    let source = SourceConfig::Generator {
        vehicles: 10_000,
        count: Some(records),
        duration: None,
        rate: None,
        seed: 42,
        churn: None,
    };
    let mut config = common::job_config(dir.path(), source);
    config.state.partitions = PARTITIONS as u32;
    config.checkpoint.store = Some(dir.path().join("store").display().to_string());
    rate_and_cpu(records, &[sluice::job::run(&config)?], Duration::ZERO)
}

/// Records/s of vehicle-stats from `positions` to `summaries` as `setting` says, each
/// job stopping once idle for `idle`, the jobs sharing a group of their own (and a checkpoint store, which a partition moving
/// between them needs), and their CPU time per record.
fn through_sluice(broker: &KafkaBroker, idle: Duration, records: u64, setting: &Setting) -> Result<(f64, f64)> {
    let dir = tempfile::tempdir()?;
    let group = format!("bench-{}", setting.label.replace([' ', ',', '(', ')'], "-"));
    let configs: Vec<Config> = (0..setting.hosts)
        .map(|host| job(broker, idle, &dir.path().join(format!("host-{host}")), &group, setting))
        .collect();
    let reports = std::thread::scope(|scope| {
        let jobs: Vec<_> = configs.iter().map(|config| scope.spawn(|| sluice::job::run(config))).collect();
        jobs.into_iter().map(|job| job.join().expect("a job thread panicked")).collect::<Result<Vec<_>>>()
    })?;
    rate_and_cpu(records, &reports, idle)
}

/// A job of vehicle-stats reading `positions` in `group` until idle for `idle` and
/// writing to `summaries`, everything under `dir`, its checkpoint store shared with the
/// jobs in sibling directories.
fn job(broker: &KafkaBroker, idle: Duration, dir: &Path, group: &str, setting: &Setting) -> Config {
    let source = SourceConfig::Kafka {
        brokers: broker.bootstrap.clone(),
        topic: "positions".into(),
        group: group.into(),
        instance_id: None,
        group_protocol: Default::default(),
        properties: Default::default(),
        stop_when_idle: Some(idle),
        offset_out_of_range: Default::default(),
        null_keys: Default::default(),
    };
    let mut config = common::job_config(dir, source);
    if let Outputs::Kafka(guarantee) = setting.outputs {
        config.sink = SinkConfig::Kafka {
            brokers: broker.bootstrap.clone(),
            topic: "summaries".into(),
            properties: Default::default(),
            guarantee,
        };
    }
    config.state.partitions = PARTITIONS as u32;
    if let Some(batch) = setting.batch {
        (config.state.batch_records, config.state.commit_every) = (batch, batch);
    }
    let store = dir.parent().expect("a job's directory has a parent").join("store");
    config.checkpoint.store = Some(store.display().to_string());
    config
}

/// Records/s of a plain member of consumer group `group` reading `records` records, and
/// the process's CPU time per record meanwhile.
fn bare_consumer(broker: &KafkaBroker, group: &str, records: u64) -> Result<(f64, f64)> {
    let (started, cpu) = (Instant::now(), process_cpu());
    let consumer: BaseConsumer = broker.consumer_config(group).set("auto.offset.reset", "earliest").create()?;
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
    let elapsed = started.elapsed();
    let cpu = cpu.zip(process_cpu()).map(|(before, after)| after.saturating_sub(before)).unwrap_or_default();
    Ok((records as f64 / elapsed.as_secs_f64(), cpu.as_secs_f64() * 1e6 / records as f64))
}
