//! What serving the metrics costs a running job: vehicle-stats over the generator (4
//! partitions, 10,000 vehicles) with its admin API scraped at `GET /metrics` every
//! second, against the same job with the API listening and nobody scraping, in pairs,
//! six rounds, each round in the other order. Reported: records/s and CPU per record (every thread of the process,
//! the scraping client's included), each as the median over the rounds of the scraped
//! run's over the quiet run's, and how long a scrape took.
//!
//! Run with `./dev.sh bench` (it builds the component first), or alone with
//! `cargo bench -p sluice --bench metrics`. `SLUICE_BENCH_RECORDS` sets the runs'
//! length (default 2,000,000 records).

use anyhow::Result;
use sluice::config::SourceConfig;
use sluice_e2e::{bench_setting, free_port};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

mod common;

/// Between two scrapes, as a Prometheus server set to scrape every second would.
const SCRAPE_EVERY: Duration = Duration::from_secs(1);
/// Pairs of runs.
const ROUNDS: usize = 6;

fn main() -> Result<()> {
    let records = bench_setting("SLUICE_BENCH_RECORDS", 2_000_000)?;
    let dir = tempfile::tempdir()?;
    println!("vehicle-stats, {records} records over 10000 vehicles, 4 partitions, admin API listening\n");
    let (mut rates, mut cpus, mut scrape_times) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        // Each round in the other order: the second run of a pair tends to differ.
        let order = if round % 2 == 0 { [false, true] } else { [true, false] };
        let mut runs = Vec::new();
        for scrape in order {
            let run = run(&dir.path().join(format!("run-{round}-{scrape}")), records, scrape)?;
            let name = if scrape { "scraped every 1 s" } else { "not scraped" };
            println!(
                "  round {round}, {name:<17}: {:>9.0} records/s, {:>5.2} µs CPU/record, {} scrapes",
                run.rate,
                run.cpu * 1e6,
                run.scrapes.len()
            );
            scrape_times.extend(run.scrapes.iter().copied());
            runs.push(run);
        }
        // Paired: the machine's speed drifts between rounds more than a scrape costs.
        let (quiet, scraped) = if order[0] { (&runs[1], &runs[0]) } else { (&runs[0], &runs[1]) };
        rates.push(scraped.rate / quiet.rate);
        cpus.push(quiet.cpu / scraped.cpu);
    }
    let median = |values: &mut Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    let mean_scrape = scrape_times.iter().sum::<Duration>() / scrape_times.len().max(1) as u32;
    println!(
        "\nscraped / not scraped, median of the rounds' ratios: records/s {:.3}; per core (CPU per record, \
         inverted) {:.3}; a scrape took {:.2} ms on average, wall clock, client included",
        median(&mut rates),
        median(&mut cpus),
        mean_scrape.as_secs_f64() * 1e3
    );
    Ok(())
}

/// What one run did.
struct Run {
    /// Records per second.
    rate: f64,
    /// CPU seconds per record, every thread of the process.
    cpu: f64,
    /// How long each scrape took.
    scrapes: Vec<Duration>,
}

/// One run in `dir`, scraped every second if `scrape`.
fn run(dir: &Path, records: u64, scrape: bool) -> Result<Run> {
    let source = SourceConfig::Generator {
        vehicles: 10_000,
        count: Some(records),
        duration: None,
        rate: None,
        seed: 42,
        churn: None,
    };
    let mut config = common::job_config(dir, source);
    config.state.partitions = 4;
    config.checkpoint.enabled = false;
    let admin = format!("127.0.0.1:{}", free_port()?);
    config.admin.listen = Some(admin.clone());
    let done = AtomicBool::new(false);
    let (report, scrapes) = std::thread::scope(|scope| {
        let scraper = scope.spawn(|| {
            let mut scrapes = Vec::new();
            while scrape && !done.load(Ordering::Relaxed) {
                std::thread::sleep(SCRAPE_EVERY);
                let started = Instant::now();
                // Refused before the API listens and after the job ends: not counted.
                if sluice::admin::call(&admin, hyper::Method::GET, "/metrics", Vec::new()).is_ok() {
                    scrapes.push(started.elapsed());
                }
            }
            scrapes
        });
        let report = sluice::job::run(&config);
        done.store(true, Ordering::Relaxed);
        (report, scraper.join().expect("the scraper thread"))
    });
    let report = report?;
    let processed = report.processed() as f64;
    let cpu = report.cpu.map_or(f64::NAN, |cpu| cpu.as_secs_f64() / processed);
    Ok(Run { rate: processed / report.elapsed.as_secs_f64(), cpu, scrapes })
}
