//! Bounded state under fleet churn: vehicle-stats over a generated fleet in which a
//! vehicle leaves for good (and a new one joins) every `CHURN` records, so the distinct
//! vehicles seen grow without bound. The same job runs twice, with a TTL and without,
//! in segments of one TTL of event time each; after each segment it reports the
//! distinct vehicles seen so far, the live state entries, the newest checkpoint's size
//! and RocksDB's live data size. With the TTL the last three plateau while the
//! vehicles seen grow; without it they grow with them. Then each runs once more over
//! all the records in one go, for the TTL's cost under churn (expiries, the index,
//! `expired` calls): records per second of wall time and per second of CPU time of
//! every thread, with the TTL over without.
//!
//! Run with `./dev.sh bench`. `SLUICE_BENCH_TTLS` sets how many TTLs of event time a
//! run covers (default 24).

use anyhow::Result;
use sluice::checkpoint::{CheckpointStore, bytes};
use sluice::config::{Config, SourceConfig};
use sluice::state::StateDir;
use sluice_e2e::bench_setting;
use std::path::Path;
use std::time::{Duration, Instant};

mod common;

/// Vehicles reporting at any time.
const FLEET: u32 = 10_000;
/// A vehicle leaves (and another joins) every this many records.
const CHURN: u64 = 10;
/// The generator's event time between two records.
const STEP_MS: u64 = 10;
/// The TTL: ten minutes of event time, 60,000 records. A vehicle reports every 10,000
/// records (100 s) on average, so one still in the fleet outlives it but rarely.
const TTL: Duration = Duration::from_secs(600);
const PARTITIONS: u32 = 2;

/// What a job's state held after a segment.
struct Sample {
    records: u64,
    vehicles_seen: u64,
    entries: u64,
    checkpoint_bytes: u64,
    live_data_bytes: u64,
}

fn main() -> Result<()> {
    let ttls: u64 = bench_setting("SLUICE_BENCH_TTLS", 24)?;
    let segment = TTL.as_millis() as u64 / STEP_MS;
    println!(
        "vehicle-stats, a fleet of {FLEET} vehicles of which one leaves and one joins every {CHURN} records, \
         {PARTITIONS} partitions, {ttls} segments of {segment} records (one TTL of {} s of event time)\n",
        TTL.as_secs()
    );
    let dir = tempfile::tempdir()?;
    let runtime = sluice::objects::runtime()?;
    let mut runs = Vec::new();
    for ttl in [Some(TTL), None] {
        let dir = dir.path().join(if ttl.is_some() { "ttl" } else { "none" });
        let mut samples = Vec::new();
        for i in 1..=ttls {
            let mut config = churning_job(&dir.join("segments"), i * segment, ttl);
            config.checkpoint.interval = Duration::from_secs(3600);
            sluice::job::run(&config)?;
            samples.push(sample(&runtime, &config, i * segment)?);
        }
        println!("{}", if ttl.is_some() { "with a TTL of 10 min" } else { "without a TTL" });
        println!("  records  vehicles seen  live entries  newest checkpoint  RocksDB live data");
        for s in &samples {
            println!(
                "  {:>7}  {:>13}  {:>12}  {:>17}  {:>17}",
                s.records,
                s.vehicles_seen,
                s.entries,
                bytes(s.checkpoint_bytes),
                bytes(s.live_data_bytes)
            );
        }
        let half = &samples[samples.len() / 2 - 1];
        let last = samples.last().expect("at least one segment");
        println!(
            "  from {} to {} records: vehicles seen x{:.2}, live entries x{:.2}, checkpoint x{:.2}, live data x{:.2}\n",
            half.records,
            last.records,
            last.vehicles_seen as f64 / half.vehicles_seen as f64,
            last.entries as f64 / half.entries as f64,
            last.checkpoint_bytes as f64 / half.checkpoint_bytes as f64,
            last.live_data_bytes as f64 / half.live_data_bytes as f64,
        );
        let mut config = churning_job(&dir.join("whole"), ttls * segment, ttl);
        config.checkpoint.enabled = false;
        let cpu = process_cpu()?;
        let started = Instant::now();
        let report = sluice::job::run(&config)?;
        let (wall, cpu) = (started.elapsed(), process_cpu()? - cpu);
        let processed = report.processed() as f64;
        runs.push((processed / wall.as_secs_f64(), processed / cpu.as_secs_f64()));
    }
    let ((ttl_wall, ttl_cpu), (none_wall, none_cpu)) = (runs[0], runs[1]);
    println!(
        "one run over all {} records: with the TTL {ttl_wall:.0} records/s ({ttl_cpu:.0} per CPU-second), \
         without {none_wall:.0} ({none_cpu:.0}); with/without {:.3} ({:.3} per CPU-second)",
        ttls * segment,
        ttl_wall / none_wall,
        ttl_cpu / none_cpu
    );
    Ok(())
}

/// The process's CPU time so far, every thread.
fn process_cpu() -> Result<Duration> {
    sluice::probes::process_cpu().ok_or_else(|| anyhow::anyhow!("/proc/self/stat is unreadable"))
}

/// [`common::job_config`] over the first `count` records of the churning fleet, under
/// `ttl`.
fn churning_job(dir: &Path, count: u64, ttl: Option<Duration>) -> Config {
    let (rate, seed, churn) = (None, 7, Some(CHURN));
    let source = SourceConfig::Generator { vehicles: FLEET, count: Some(count), duration: None, rate, seed, churn };
    let mut config = common::job_config(dir, source);
    config.state.partitions = PARTITIONS;
    config.ttl.default = ttl;
    config
}

/// What the state of the job `config` ran holds after its first `records` records.
fn sample(runtime: &tokio::runtime::Runtime, config: &Config, records: u64) -> Result<Sample> {
    let state = StateDir::open(&config.state.dir, PARTITIONS)?;
    let store = CheckpointStore::open(&config.checkpoint.store_url(&config.state.dir))?;
    let (mut entries, mut live_data_bytes, mut checkpoint_bytes) = (0, 0, 0);
    for partition in 0..PARTITIONS {
        let store_of_partition = state.open_partition(partition)?;
        entries += store_of_partition.committed_entries()?;
        live_data_bytes += store_of_partition.live_data_bytes()?;
        let newest = runtime.block_on(store.checkpoint_ids(partition))?.into_iter().max();
        if let Some(id) = newest {
            checkpoint_bytes += runtime.block_on(store.manifest(partition, id))?.bytes();
        }
    }
    // The generator's fleet at the start, and one more every CHURN records after the first.
    let vehicles_seen = u64::from(FLEET) + (records - 1) / CHURN;
    Ok(Sample { records, vehicles_seen, entries, checkpoint_bytes, live_data_bytes })
}
