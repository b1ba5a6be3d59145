//! What checkpoints cost and what restores take, each against a baseline in the same
//! run:
//!
//! 1. job throughput (vehicle-stats over the generator, two partitions) with
//!    checkpoints every 1 s and every 10 s versus none, alternating, two rounds;
//! 2. bytes uploaded per checkpoint versus the state's size, from the 1 s runs (where
//!    every key changes every second) and under a steady trickle of updates to a
//!    large state;
//! 3. restoring a large partition (`SLUICE_BENCH_STATE_MB`, default 1024 MiB of
//!    incompressible values) from a local checkpoint store versus a plain copy of the
//!    same files on the same disk (`std::fs::copy` + fsync, one file after another);
//! 4. local recovery (state intact, nothing fetched) for that partition and for one a
//!    hundredth its size: the time should not grow with the size.
//!
//! Run with `./dev.sh bench` (it builds the component first). Files are fresh in the
//! page cache for both the copy and the restore, so (3) compares the two code paths,
//! not the disk. `SLUICE_BENCH_RECORDS` sets the job runs' length.

use anyhow::Result;
use large_state::dir_bytes;
use sluice::checkpoint::{CheckpointStore, JobIdentity, bytes, restore};
use sluice::config::{Config, SourceConfig};
use sluice::record::RestoredFrom;
use sluice::state::StateDir;
use sluice::stats::HostStats;
use sluice_e2e::bench_setting;
use std::path::Path;
use std::time::{Duration, Instant};

mod common;
#[path = "common/large_state.rs"]
mod large_state;

fn main() -> Result<()> {
    let records = bench_setting("SLUICE_BENCH_RECORDS", 1_000_000)?;
    let state_mb: u64 = bench_setting("SLUICE_BENCH_STATE_MB", 1024)?;
    let dir = tempfile::tempdir()?;
    let runtime = sluice::objects::runtime()?;

    throughput(dir.path(), records)?;
    steady_updates(&runtime, &dir.path().join("steady"))?;
    let large = dir.path().join("large");
    let store = fill_and_checkpoint(&runtime, &large, state_mb << 20)?;
    restore_versus_copy(&runtime, &large, &store)?;
    let small = dir.path().join("small");
    let small_store = fill_and_checkpoint(&runtime, &small, (state_mb << 20) / 100)?;
    println!("\nlocal recovery (state intact; plan, nothing fetched, open)");
    for (dir, store) in [(&small, &small_store), (&large, &store)] {
        let size = dir_bytes(&StateDir::open(&dir.join("state"), 1)?.partition_path(0))?;
        let took = local_recovery(&runtime, dir, store)?;
        println!("  {:>10} of state  {:>8.1} ms", bytes(size), took.as_secs_f64() * 1e3);
    }
    Ok(())
}

/// (1) and (2): the same job with checkpoints off, every 10 s and every 1 s.
fn throughput(dir: &Path, records: u64) -> Result<()> {
    println!("vehicle-stats, {records} records over 10000 vehicles, 2 partitions; records/s per run\n");
    let second = Duration::from_secs(1);
    let intervals: [(&str, Option<Duration>); 3] = [("none", None), ("10 s", Some(10 * second)), ("1 s", Some(second))];
    let mut rates = vec![Vec::new(); intervals.len()];
    let mut per_checkpoint = Vec::new();
    for round in 0..2 {
        for (i, (name, interval)) in intervals.iter().enumerate() {
            let mut config = generator_job(&dir.join(format!("job-{round}-{i}")), 10_000, records, 2);
            config.checkpoint.enabled = interval.is_some();
            config.checkpoint.interval = interval.unwrap_or_default();
            let report = sluice::job::run(&config)?;
            let rate = report.processed() as f64 / report.elapsed.as_secs_f64();
            let checkpoints: u64 = report.partitions.iter().map(|p| p.totals.checkpoints).sum();
            let uploaded: u64 = report.partitions.iter().map(|p| p.totals.uploaded_bytes).sum();
            println!("  round {round}, checkpoints {name:>4}: {rate:>9.0} records/s, {checkpoints} checkpoints");
            rates[i].push(rate);
            if *interval == Some(second) && checkpoints > 0 {
                let state = dir_bytes(&config.state.dir)?;
                per_checkpoint.push((uploaded / checkpoints, state / 2));
            }
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let none = mean(&rates[0]);
    println!();
    for (i, (name, _)) in intervals.iter().enumerate().skip(1) {
        println!("checkpoints every {name:>4} / none: {:.3}", mean(&rates[i]) / none);
    }
    for (uploaded, state) in per_checkpoint {
        println!(
            "every 1 s: {} uploaded per checkpoint per partition, partition state {} ({:.1}%)",
            bytes(uploaded),
            bytes(state),
            100.0 * uploaded as f64 / state as f64
        );
    }
    Ok(())
}

/// (2) when a steady trickle touches a small share of a large state: 100,000 vehicles
/// loaded first, then 5,000 updates/s for 20 s with a checkpoint every second.
fn steady_updates(runtime: &tokio::runtime::Runtime, dir: &Path) -> Result<()> {
    const VEHICLES: u32 = 100_000;
    const LOADED: u64 = 300_000;
    let mut config = generator_job(dir, VEHICLES, LOADED, 1);
    config.checkpoint.interval = Duration::from_secs(3600);
    config.checkpoint.retain = 1000;
    sluice::job::run(&config)?;
    let store = CheckpointStore::open(&config.checkpoint.store_url(&config.state.dir))?;
    let loaded = runtime.block_on(store.checkpoint_ids(0))?.len();
    config.source = SourceConfig::Generator {
        vehicles: VEHICLES,
        count: Some(LOADED + 100_000),
        duration: None,
        rate: Some(5_000.0),
        seed: 42,
        churn: None,
    };
    config.checkpoint.interval = Duration::from_secs(1);
    sluice::job::run(&config)?;
    let mut shares = Vec::new();
    for id in runtime.block_on(store.checkpoint_ids(0))?.into_iter().skip(loaded) {
        let manifest = runtime.block_on(store.manifest(0, id))?;
        shares.push((manifest.uploaded_bytes, manifest.bytes()));
    }
    let uploaded: u64 = shares.iter().map(|s| s.0).sum();
    let state: u64 = shares.iter().map(|s| s.1).sum();
    let max = shares.iter().map(|s| s.0 as f64 / s.1 as f64).fold(0.0, f64::max);
    println!("\nsteady updates: {VEHICLES} vehicles, 5000 updates/s (~5% of keys per second), a checkpoint every 1 s");
    println!(
        "  {} checkpoints uploaded {} per checkpoint on average, of {} of state ({:.1}%; the largest {:.1}%, when a \
         compaction rewrote files)",
        shares.len(),
        bytes(uploaded / shares.len().max(1) as u64),
        bytes(state / shares.len().max(1) as u64),
        100.0 * uploaded as f64 / state as f64,
        100.0 * max
    );
    Ok(())
}

/// [`common::job_config`] over `count` generator records of `vehicles` vehicles,
/// `partitions` partitions.
fn generator_job(dir: &Path, vehicles: u32, count: u64, partitions: u32) -> Config {
    let source =
        SourceConfig::Generator { vehicles, count: Some(count), duration: None, rate: None, seed: 42, churn: None };
    let mut config = common::job_config(dir, source);
    config.state.partitions = partitions;
    config
}

/// A one-partition state directory in `dir/state` holding about `size` bytes of
/// incompressible values, checkpointed to `dir/store`.
fn fill_and_checkpoint(runtime: &tokio::runtime::Runtime, dir: &Path, size: u64) -> Result<CheckpointStore> {
    let state = StateDir::open(&dir.join("state"), 1)?;
    large_state::write_values(&state, 0..size / large_state::VALUE_BYTES, 42)?;
    let store = CheckpointStore::open(dir.join("store").to_str().expect("UTF-8 temp path"))?;
    runtime.block_on(store.claim(1, &JobIdentity { operator: "bench".into(), input: None }))?;
    let started = Instant::now();
    large_state::checkpoint(runtime, &state, &store, 1)?;
    println!(
        "\nfilled {} of state, first checkpoint uploaded in {:.2}s",
        bytes(dir_bytes(&state.partition_path(0))?),
        started.elapsed().as_secs_f64()
    );
    Ok(store)
}

/// (3): a plain copy of the checkpoint's files, then a restore of the wiped state.
fn restore_versus_copy(runtime: &tokio::runtime::Runtime, dir: &Path, store: &CheckpointStore) -> Result<()> {
    let files = dir.join("store/partition-0000/files");
    let copy = dir.join("copy");
    std::fs::create_dir_all(&copy)?;
    let started = Instant::now();
    let mut copied = 0;
    for entry in std::fs::read_dir(&files)? {
        let entry = entry?;
        let to = copy.join(entry.file_name());
        copied += std::fs::copy(entry.path(), &to)?;
        std::fs::File::open(&to)?.sync_all()?;
    }
    let copy_took = started.elapsed();

    let state = StateDir::open(&dir.join("state"), 1)?;
    std::fs::remove_dir_all(state.partition_path(0))?;
    let plan = runtime.block_on(restore::plan(Some(&state), &[0], Some(store)))?;
    let report =
        runtime.block_on(restore::restore(&state, store, plan, Duration::from_secs(3600), &HostStats::default()))?;
    let fetched = report.plan.bytes_to_fetch();
    let mb_s = |b: u64, t: Duration| b as f64 / t.as_secs_f64() / (1 << 20) as f64;
    println!("\nrestore of {} from a local checkpoint store", bytes(fetched));
    println!("  plain copy + fsync   {:>8.2}s  {:>8.0} MiB/s", copy_took.as_secs_f64(), mb_s(copied, copy_took));
    println!("  sluice restore       {:>8.2}s  {:>8.0} MiB/s", report.took.as_secs_f64(), mb_s(fetched, report.took));
    println!("  restore / copy throughput {:.2}", mb_s(fetched, report.took) / mb_s(copied, copy_took));
    std::fs::remove_dir_all(copy)?;
    Ok(())
}

/// (4): what a start costs when the local state is current.
fn local_recovery(runtime: &tokio::runtime::Runtime, dir: &Path, store: &CheckpointStore) -> Result<Duration> {
    let started = Instant::now();
    let state = StateDir::open(&dir.join("state"), 1)?;
    let plan = runtime.block_on(restore::plan(Some(&state), &[0], Some(store)))?;
    let report =
        runtime.block_on(restore::restore(&state, store, plan, Duration::from_secs(3600), &HostStats::default()))?;
    assert!(matches!(report.restored[0], RestoredFrom::Local { .. }), "{:?}", report.restored);
    state.open_partition(0)?.committed_offset()?;
    Ok(started.elapsed())
}
