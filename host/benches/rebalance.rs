//! What a partition that moves costs its new owner, by what the new owner holds of it —
//! no copy, a stale local copy, a warm standby copy — at several state sizes, with
//! downloads from the checkpoint store capped as S3 would cap them. The baseline in the
//! same run is the full restore (no copy): its time is the state's size over the cap.
//!
//! Per size (`SLUICE_BENCH_REBALANCE_MB`, default `100,1024,4096` MiB of incompressible
//! 1 KiB values in one partition; downloads capped at `SLUICE_BENCH_DOWNLOAD_MB_S`,
//! default 100 MiB/s, from a local checkpoint store):
//!
//! 1. the owner writes the state and checkpoints it (checkpoint 1); a host restores it:
//!    that database is the stale copy, the partition as this host last ran it;
//! 2. the owner rewrites 5% of the keys and checkpoints (2) — an hour of records; a
//!    standby host brings its copy to checkpoint 2;
//! 3. the owner rewrites 0.5% of the keys and checkpoints (3) — the checkpoint a
//!    handover or the last interval before a `kill -9` writes — and the partition moves.
//!
//! Each new owner is timed from its restore plan to its database open at checkpoint 3's
//! offset: the part of a move's pause that grows with the state. Not included, and the
//! same for every path: the group's rebalance, the operator's instantiation, and after a
//! `kill -9` the session timeout the group waits before it moves the partition
//! (`session.timeout.ms`, 45 s by default). Run with `./dev.sh bench` or
//! `cargo bench -p sluice --bench rebalance`.

use anyhow::Result;
use large_state::{VALUE_BYTES, checkpoint, dir_bytes, write_values};
use sluice::checkpoint::{CheckpointStore, JobIdentity, bytes, restore, standby};
use sluice::state::StateDir;
use sluice::stats::HostStats;
use sluice_e2e::bench_setting;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;

#[path = "common/large_state.rs"]
mod large_state;

fn main() -> Result<()> {
    let sizes: String = bench_setting("SLUICE_BENCH_REBALANCE_MB", "100,1024,4096".to_string())?;
    let cap_mb: u64 = bench_setting("SLUICE_BENCH_DOWNLOAD_MB_S", 100)?;
    let runtime = sluice::objects::runtime()?;
    println!(
        "moving one partition; downloads capped at {cap_mb} MiB/s; time from the restore plan to the open database"
    );
    println!(
        "\n{:>10}  {:<28}  {:>9}  {:>10}  {:>14}  {:>10}",
        "state", "new owner holds", "resume s", "fetched", "fetched/state", "predicted"
    );
    for size_mb in sizes.split(',') {
        let size = size_mb.trim().parse::<u64>()? << 20;
        let dir = tempfile::tempdir()?;
        move_partition(&runtime, dir.path(), size, cap_mb << 20)?;
    }
    Ok(())
}

/// One size: the three new owners, timed.
fn move_partition(runtime: &Runtime, dir: &Path, size: u64, cap: u64) -> Result<()> {
    let keys = size / VALUE_BYTES;
    let url = dir.join("store").to_string_lossy().into_owned();
    let store = CheckpointStore::open(&url)?;
    runtime.block_on(store.claim(1, &JobIdentity { operator: "bench".into(), input: None }))?;
    let capped = CheckpointStore::open(&url)?.with_download_cap(Some(cap));
    let host = |name: &str| StateDir::open(&dir.join(name), 1);

    let owner = host("owner")?;
    write_values(&owner, 0..keys, 1)?;
    checkpoint(runtime, &owner, &store, 3)?;
    let stale = host("stale")?;
    restore_all(runtime, &stale, &store)?;
    write_values(&owner, (0..keys).step_by(20), 2)?;
    checkpoint(runtime, &owner, &store, 3)?;
    let warm = host("standby")?;
    let progress = Arc::default();
    let first = runtime.block_on(standby::update(&warm, &store, 0, u64::MAX, &progress, &|| false))?;
    let disk = dir_bytes(&warm.standby_path(0))?;
    write_values(&owner, (0..keys).step_by(200), 3)?;
    checkpoint(runtime, &owner, &store, 3)?;
    let newest = runtime.block_on(store.checkpoint_ids(0))?.last().copied().unwrap_or(0);
    let manifest = runtime.block_on(store.manifest(0, newest))?;

    // The set-up's uncapped restores are no history to predict a capped one from.
    std::fs::remove_file(dir.join("store/restores.json"))?;
    let fresh = host("fresh")?;
    let mut full = None;
    for (name, state) in
        [("no copy", &fresh), ("stale copy (5% changed)", &stale), ("standby, 1 checkpoint behind", &warm)]
    {
        let started = Instant::now();
        let plan = runtime.block_on(restore::plan(Some(state), &[0], Some(&capped)))?;
        let predicted = plan.predicted().0;
        let report = runtime.block_on(restore::restore(state, &capped, plan, Duration::MAX, &HostStats::default()))?;
        let offset = state.open_partition(0)?.committed_offset()?;
        let took = started.elapsed();
        assert_eq!(offset, manifest.offset, "{name}: resumed at the newest checkpoint");
        let fetched = report.fetched();
        println!(
            "{:>10}  {name:<28}  {:>9.3}  {:>10}  {:>13.1}%  {:>9.2}s  ({})",
            bytes(manifest.bytes()),
            took.as_secs_f64(),
            bytes(fetched),
            100.0 * fetched as f64 / manifest.bytes() as f64,
            predicted.as_secs_f64(),
            report.restored[0].path()
        );
        full.get_or_insert(took);
        if name.starts_with("standby") {
            let full = full.expect("the no-copy row is first").as_secs_f64();
            println!("{:>10}  standby / no copy: {:.4} of the time", "", took.as_secs_f64() / full);
        }
    }
    println!(
        "{:>10}  a standby's cost: {} downloaded to make the copy, then {} for checkpoint {newest} ({:.1}% of the \
         state); {} of disk",
        "",
        bytes(first.fetched),
        bytes(manifest.uploaded_bytes),
        100.0 * manifest.uploaded_bytes as f64 / manifest.bytes() as f64,
        bytes(disk),
    );
    Ok(())
}

/// Restores partition 0 of `state` from `store`, uncapped: a host's set-up, not timed.
fn restore_all(runtime: &Runtime, state: &StateDir, store: &CheckpointStore) -> Result<()> {
    let plan = runtime.block_on(restore::plan(Some(state), &[0], Some(store)))?;
    runtime.block_on(restore::restore(state, store, plan, Duration::MAX, &HostStats::default()))?;
    Ok(())
}
