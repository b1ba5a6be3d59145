//! What a build costs before its first record, per language: vehicle-stats' Rust build,
//! its Python build (CPython inside the component) and its TypeScript build
//! (SpiderMonkey inside). For each: compiling the
//! component, reading it compiled from the cache a job keeps in its state directory
//! (`[operator] compiled_cache_mib`), and instantiating it for a partition — a new
//! instance and its `init`, what a partition's start, a handover and a trap's
//! replacement pay — with the memory each instance adds to the process. The Rust build
//! in the same process is the baseline: `python / rust` and `typescript / rust` are
//! printed for each.

use anyhow::Result;
use sluice::operator::versions::ActiveVersion;
use sluice::operator::wasm::{Limits, WasmOperator, keep_compiled};
use sluice::state::{PartitionStore, Transaction};
use sluice_e2e::operator_wasm;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Instances made of each build (each a partition of its own).
const INSTANCES: u32 = 20;

/// What one build costs.
struct Costs {
    bytes: usize,
    compile: Duration,
    read_compiled: Duration,
    instantiate: Duration,
    instance_kib: u64,
}

fn main() -> Result<()> {
    let builds = ["vehicle_stats", "vehicle_stats_py", "vehicle_stats_ts"];
    // Compiled cold first: the cache is set for the process once set.
    let compiles: Vec<Duration> = builds.iter().map(|build| compile_cold(build)).collect::<Result<_>>()?;
    let cache = tempfile::tempdir()?;
    keep_compiled(cache.path(), 4 << 30)?;
    let mut costs = Vec::new();
    for (build, compile) in builds.iter().zip(compiles) {
        let cost = measure(build, compile)?;
        println!(
            "{build}: component {:.1} MB; compile {:.0} ms; read compiled {:.1} ms; instantiate and init a \
             partition {:.2} ms (median of {INSTANCES}); memory per instance {:.1} MiB",
            cost.bytes as f64 / 1e6,
            ms(cost.compile),
            ms(cost.read_compiled),
            ms(cost.instantiate),
            cost.instance_kib as f64 / 1024.0,
        );
        costs.push(cost);
    }
    let rust = &costs[0];
    for (language, other) in ["python", "typescript"].iter().zip(&costs[1..]) {
        println!(
            "{language} / rust: compile {:.1}, read compiled {:.1}, instantiate {:.1}, memory per instance {:.1}",
            other.compile.as_secs_f64() / rust.compile.as_secs_f64(),
            other.read_compiled.as_secs_f64() / rust.read_compiled.as_secs_f64(),
            other.instantiate.as_secs_f64() / rust.instantiate.as_secs_f64(),
            other.instance_kib as f64 / rust.instance_kib.max(1) as f64,
        );
        println!(
            "{language}: read compiled / compile {:.4}",
            other.read_compiled.as_secs_f64() / other.compile.as_secs_f64()
        );
    }
    Ok(())
}

/// The median of three compiles of `build`, no cache set.
fn compile_cold(build: &str) -> Result<Duration> {
    let bytes = std::fs::read(operator_wasm(build))?;
    let samples = (0..3)
        .map(|_| {
            let started = Instant::now();
            WasmOperator::compile(build, &bytes, "bench", Limits::default(), Vec::new()).map(|_| started.elapsed())
        })
        .collect::<Result<_>>()?;
    Ok(median(samples))
}

/// `build`'s reads from the cache (the first compile fills it), instantiations and
/// memory per instance.
fn measure(build: &str, compile: Duration) -> Result<Costs> {
    let bytes = std::fs::read(operator_wasm(build))?;
    let load = || WasmOperator::compile(build, &bytes, "bench", Limits::default(), Vec::new());
    load()?;
    let reads = (0..5)
        .map(|_| {
            let started = Instant::now();
            load().map(|_| started.elapsed())
        })
        .collect::<Result<_>>()?;
    let active = ActiveVersion::new(Arc::new(load()?));
    let dir = tempfile::tempdir()?;
    let stores: Vec<Transaction> = (0..INSTANCES)
        .map(|p| Transaction::new(PartitionStore::open(&dir.path().join(p.to_string()), p)?, 1 << 20))
        .collect::<Result<_>>()?;
    let before = rss_kib()?;
    let mut instances = Vec::new();
    let mut samples = Vec::new();
    for (partition, txn) in (0..).zip(stores) {
        let started = Instant::now();
        instances.push(active.instantiate(partition, txn)?);
        samples.push(started.elapsed());
    }
    let instance_kib = rss_kib()?.saturating_sub(before) / u64::from(INSTANCES);
    Ok(Costs { bytes: bytes.len(), compile, read_compiled: median(reads), instantiate: median(samples), instance_kib })
}

/// The process's resident memory, KiB.
fn rss_kib() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).ok_or_else(|| anyhow::anyhow!("no VmRSS"))?;
    Ok(line.split_whitespace().nth(1).unwrap_or("0").parse()?)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort_unstable();
    samples[samples.len() / 2]
}
