//! `sluice status`: a job's partitions as one table, of its running hosts or, when no
//! host runs, of a state directory and its checkpoint store.
//!
//! Of running hosts it reads each one's `/metrics` and picks each partition's columns
//! and each host's footer out of them; one host that does not answer is a footer line
//! and, at the end, an error, but does not hide the others. Of a state directory it
//! opens each partition read-only. This module owns the table; it does not own the
//! metrics (`sluice::metrics`), the admin API, the state or the store.

use anyhow::{Result, bail};
use hyper::Method;
use sluice::admin;
use sluice::checkpoint::{CheckpointStore, bytes};
use sluice::metrics;
use sluice::state::StateDir;
use sluice::stats;
use std::path::Path;

/// `sluice status`
pub fn status(hosts: &[String]) -> Result<()> {
    println!(
        "{:>9}  {:<24}  {:>10}  {:>8}  {:>9}  {:>10}  {:>10}  {:>14}  version",
        "partition", "host", "offset", "lag", "entries", "bytes", "batch-p99", "checkpoint-age"
    );
    let (mut footers, mut unreachable) = (Vec::new(), 0);
    for host in hosts {
        let scraped = admin::call(host, Method::GET, admin::METRICS_PATH, Vec::new());
        let samples = match scraped {
            Ok(text) => metrics::parse(&text),
            // One host down must not hide the others.
            Err(e) => {
                footers.push(format!("{host}: unreachable: {e:#}"));
                unreachable += 1;
                continue;
            }
        };
        let value = |name: &str, partition: Option<&str>| {
            let found =
                samples.iter().find(|s| s.name == name && partition.is_none_or(|p| s.label("partition") == Some(p)));
            found.map(|s| s.value)
        };
        let partitions: Vec<&str> = samples
            .iter()
            .filter(|s| s.name == "sluice_committed_offset")
            .filter_map(|s| s.label("partition"))
            .collect();
        for p in partitions {
            let shown = |name: &str| value(name, Some(p)).map_or("-".to_string(), |v| format!("{v}"));
            let version =
                samples.iter().find(|s| s.name == "sluice_partition_operator_info" && s.label("partition") == Some(p));
            println!(
                "{p:>9}  {host:<24}  {:>10}  {:>8}  {:>9}  {:>10}  {:>10}  {:>14}  {}",
                shown("sluice_committed_offset"),
                shown("sluice_consumer_lag_records"),
                shown("sluice_state_entries"),
                value("sluice_state_bytes", Some(p)).map_or("-".to_string(), |b| bytes(b as u64)),
                batch_p99(&samples, p).map_or("-".to_string(), |s| format!("≤{:.1}ms", s * 1e3)),
                value("sluice_checkpoint_age_seconds", Some(p)).map_or("-".to_string(), |s| format!("{s:.0}s")),
                version.and_then(|s| s.label("version")).unwrap_or("-")
            );
        }
        let warnings: Vec<&str> =
            samples.iter().filter(|s| s.name == "sluice_warning").filter_map(|s| s.label("kind")).collect();
        footers.push(format!(
            "{host}: {} rebalances; latest restore {:.2}s (predicted {:.2}s); warnings: {}",
            value("sluice_rebalances_total", None).unwrap_or(0.0),
            value("sluice_restore_last_seconds", None).unwrap_or(0.0),
            value("sluice_restore_predicted_seconds", None).unwrap_or(0.0),
            if warnings.is_empty() { "none".to_string() } else { warnings.join(", ") }
        ));
    }
    for footer in footers {
        println!("{footer}");
    }
    if unreachable > 0 {
        bail!("{unreachable} of {} hosts did not answer", hosts.len());
    }
    Ok(())
}

/// `sluice status --state-dir`: each partition's offset and entries as its state holds
/// them, and its newest checkpoint in `store`.
pub fn stored_status(state_dir: &Path, store: Option<&str>) -> Result<()> {
    let dir = StateDir::open_read_only(state_dir)?;
    let store = store.map(CheckpointStore::open_existing).transpose()?;
    let runtime = sluice::objects::runtime()?;
    println!("{:>9}  {:>10}  {:>9}  newest checkpoint", "partition", "offset", "entries");
    for p in 0..dir.partitions() {
        // A partition never started here has no database.
        let local = match dir.partition_path(p).exists() {
            true => dir.open_partition(p).and_then(|s| Ok((s.committed_offset()?, s.committed_entries()?))),
            false => Ok((0, 0)),
        };
        let (offset, entries) = match local {
            Ok((offset, entries)) => (offset.to_string(), entries.to_string()),
            Err(e) => (format!("unreadable: {e:#}"), "-".to_string()),
        };
        let newest = match &store {
            Some(store) => match runtime.block_on(store.checkpoint_ids(p))?.last() {
                Some(&id) => {
                    let m = runtime.block_on(store.manifest(p, id))?;
                    let age = (stats::now_ms().saturating_sub(m.created_at_ms)) as f64 / 1e3;
                    format!("{id} at offset {}, {age:.0}s old, {}, by {}", m.offset, bytes(m.bytes()), m.operator)
                }
                None => "none".to_string(),
            },
            None => "- (no --store)".to_string(),
        };
        println!("{p:>9}  {offset:>10}  {entries:>9}  {newest}");
    }
    Ok(())
}

/// The upper bound of the histogram bucket that holds the 99th percentile of
/// `partition`'s batch times, in seconds.
fn batch_p99(samples: &[metrics::Sample], partition: &str) -> Option<f64> {
    let buckets: Vec<(f64, f64)> = samples
        .iter()
        .filter(|s| s.name == "sluice_batch_duration_seconds_bucket" && s.label("partition") == Some(partition))
        .filter_map(|s| Some((s.label("le")?.parse().ok()?, s.value)))
        .collect();
    let count = buckets.iter().map(|&(_, n)| n).fold(0.0, f64::max);
    (count > 0.0).then(|| buckets.iter().find(|&&(_, n)| n >= count * 0.99).map(|&(le, _)| le)).flatten()
}
