//! Hot-swap latency. First, a switch on its own: one partition's instance switched
//! between versions 1 and 2 of vehicle-stats 200 times, nothing else running — what a
//! switch costs (instantiating the pre-compiled version over the partition's state and
//! running its `init`). Then under load: a job on the embedded generator (4 partitions,
//! 20,000 records/s, default batches) while versions 2 and 1 are deployed in turn
//! through its admin API, `SLUICE_BENCH_SWAPS` times (default 20); each deploy answers
//! with the time from activation until every partition had switched and the longest
//! any partition stood still for its switch.
//!
//! The baseline, measured in the same process, is what a swap costs without
//! pre-compilation: compiling the component from its bytes.

use anyhow::{Context, Result};
use hyper::Method;
use sluice::admin::{self, DeployAnswer};
use sluice::config::SourceConfig;
use sluice::operator::Operator;
use sluice::operator::versions::ActiveVersion;
use sluice::operator::wasm::{Limits, WasmOperator};
use sluice::state::{PartitionStore, Transaction};
use sluice_e2e::{ADMIN_TOKEN, bench_setting, free_port, operator_wasm, wait_listening};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;

const RATE: f64 = 20_000.0;
/// Between two deploys: the job keeps processing under the version just deployed.
const DWELL: Duration = Duration::from_millis(300);

fn main() -> Result<()> {
    // The job's admin API deploys only for a caller with its token, and this process is
    // both: the host and the client read it from the environment.
    // SAFETY: set before any other thread starts, so nothing reads the environment meanwhile.
    unsafe { std::env::set_var(admin::TOKEN_VARIABLE, ADMIN_TOKEN) };
    let swaps: usize = bench_setting("SLUICE_BENCH_SWAPS", 20)?;
    let versions = [operator_wasm("vehicle_stats_v2"), operator_wasm("vehicle_stats")];
    let components: Vec<Vec<u8>> = versions.iter().map(std::fs::read).collect::<Result<_, _>>()?;

    let compiles: Vec<Duration> = (0..5)
        .map(|_| {
            let started = Instant::now();
            WasmOperator::compile("vehicle_stats", &components[0], "bench", Limits::default(), Vec::new())
                .map(|_| started.elapsed())
        })
        .collect::<Result<_>>()?;
    let compile = median(compiles);
    let alone = switch_alone(&versions)?;

    let dir = tempfile::tempdir()?;
    let port = free_port()?;
    // Long enough for every swap, whatever compiling takes here; the job ends by itself.
    let duration = Duration::from_secs(10) + (DWELL + Duration::from_secs(1)) * swaps as u32;
    let source = SourceConfig::Generator {
        vehicles: 10_000,
        count: None,
        duration: Some(duration),
        rate: Some(RATE),
        seed: 1,
        churn: None,
    };
    let mut config = common::job_config(dir.path(), source);
    config.admin.listen = Some(format!("127.0.0.1:{port}"));
    let job = std::thread::spawn(move || sluice::job::run(&config));
    wait_listening(port, Duration::from_secs(60)).context("the job's admin API did not come up")?;
    let admin = format!("127.0.0.1:{port}");
    std::thread::sleep(Duration::from_secs(1));

    println!("{swaps} deploys under {RATE} records/s (4 partitions, batches of at most 512), alternating versions");
    let (mut switched, mut stalls, mut prepared) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..swaps {
        let answer = admin::call(&admin, Method::POST, "/operators/vehicle_stats/versions", components[i % 2].clone())
            .with_context(|| format!("deploy {i}"))?;
        let answer: DeployAnswer = serde_json::from_str(&answer)?;
        anyhow::ensure!(answer.not_switched.is_empty() && answer.partitions == 4, "{}", answer.summary);
        switched.push(Duration::from_secs_f64(answer.switched_ms / 1e3));
        stalls.push(Duration::from_micros(answer.worst_stall_us));
        prepared.push(Duration::from_secs_f64(answer.prepared_ms / 1e3));
        std::thread::sleep(DWELL);
    }
    let report = job.join().expect("the job thread")?;
    let dead: u64 = report.partitions.iter().map(|p| p.totals.dead_letters).sum();
    println!("the job processed {} records, {dead} dead letters", report.processed());

    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let (switched_max, stalls_max) = (*switched.iter().max().unwrap(), *stalls.iter().max().unwrap());
    println!(
        "deploy to all partitions switched: median {:.2} ms, max {:.2} ms (goal <= 100 ms)",
        ms(median(switched)),
        ms(switched_max)
    );
    println!(
        "worst per-partition stall:          median {:.3} ms, max {:.3} ms (goal <= 1 ms)",
        ms(median(stalls.clone())),
        ms(stalls_max)
    );
    println!("validating (compile + trial init) before each deploy: median {:.1} ms", ms(median(prepared)));
    println!(
        "a switch alone (one partition, no load, 200 switches): median {:.3} ms, max {:.3} ms",
        ms(median(alone.clone())),
        ms(*alone.iter().max().unwrap())
    );
    println!("baseline, compiling the component (a swap without pre-compilation): median {:.1} ms", ms(compile));
    println!("switch alone / compile: {:.4}", median(alone).as_secs_f64() / compile.as_secs_f64());
    println!("worst stall under load / compile: {:.4}", stalls_max.as_secs_f64() / compile.as_secs_f64());
    Ok(())
}

/// The stall of each of 200 switches of one instance between `versions`, nothing else
/// running.
fn switch_alone(versions: &[PathBuf; 2]) -> Result<Vec<Duration>> {
    let operators: Vec<Arc<WasmOperator>> = versions
        .iter()
        .map(|v| WasmOperator::load(v, Limits::default(), Vec::new()).map(Arc::new))
        .collect::<Result<_>>()?;
    let dir = tempfile::tempdir()?;
    let active = ActiveVersion::new(operators[1].clone());
    let mut instance = active.instantiate(0, Transaction::new(PartitionStore::open(dir.path(), 0)?, 1 << 20)?)?;
    (0..200)
        .map(|i| {
            active.activate(operators[i % 2].clone());
            let switch = instance.follow_deploys(i as u64)?.context("a new version was active")?;
            Ok(switch.stall)
        })
        .collect()
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort_unstable();
    samples[samples.len() / 2]
}
