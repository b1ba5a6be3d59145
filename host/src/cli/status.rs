//! `sluice status`: a job's partitions as one table, of its running hosts or, when no
//! host runs, of a state directory and its checkpoint store.
//!
//! Of running hosts it reads each one's `GET /partitions` (typed JSON) for the
//! partitions' rows and the host's footer; one host that does not answer is a footer
//! line and, at the end, an error, but does not hide the others. Of a state directory it
//! opens each partition read-only. This module owns the table; it does not own the
//! answer (`sluice::metrics::partitions`), the admin API, the state or the store.

use anyhow::{Context, Result, bail};
use hyper::Method;
use sluice::admin;
use sluice::checkpoint::{CheckpointStore, bytes};
use sluice::metrics::partitions::{HostStatus, PartitionStatus, PartitionsAnswer};
use sluice::state::StateDir;
use std::io::Write;
use std::path::Path;

/// `sluice status`
pub fn status(hosts: &[String]) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", header())?;
    let (mut footers, mut unreachable) = (Vec::new(), 0);
    for host in hosts {
        let answer = admin::call(host, Method::GET, admin::PARTITIONS_PATH, Vec::new()).and_then(|text| {
            serde_json::from_str::<PartitionsAnswer>(&text).context("reading the answer to GET /partitions")
        });
        match answer {
            Ok(answer) => {
                for partition in &answer.partitions {
                    writeln!(out, "{}", row(host, partition))?;
                }
                footers.push(footer(host, &answer.host));
            }
            // One host down must not hide the others.
            Err(e) => {
                footers.push(format!("{host}: unreachable: {e:#}"));
                unreachable += 1;
            }
        }
    }
    for footer in footers {
        writeln!(out, "{footer}")?;
    }
    if unreachable > 0 {
        bail!("{unreachable} of {} hosts did not answer", hosts.len());
    }
    Ok(())
}

/// The table's header.
fn header() -> String {
    format!(
        "{:>9}  {:<24}  {:>10}  {:>8}  {:>9}  {:>10}  {:>10}  {:>14}  version",
        "partition", "host", "offset", "lag", "entries", "bytes", "batch-p99", "checkpoint-age"
    )
}

/// The table's row of `partition`, running on `host`.
fn row(host: &str, partition: &PartitionStatus) -> String {
    let PartitionStatus { partition: p, version, committed_offset, lag, entries, state_bytes, .. } = partition;
    format!(
        "{p:>9}  {host:<24}  {committed_offset:>10}  {:>8}  {entries:>9}  {:>10}  {:>10}  {:>14}  {version}",
        lag.map_or("-".to_string(), |lag| lag.to_string()),
        bytes(*state_bytes),
        partition.batch_p99_s.map_or("-".to_string(), |p99| format!("≤{:.1}ms", p99.0 * 1e3)),
        partition.checkpoint_age_s.map_or("-".to_string(), |age| format!("{age:.0}s")),
    )
}

/// The line under the table about `host`: its rebalances, latest restore and warnings.
fn footer(host: &str, status: &HostStatus) -> String {
    let warnings = if status.warnings.is_empty() { "none".to_string() } else { status.warnings.join(", ") };
    format!(
        "{host}: {} rebalances; latest restore {:.2}s (predicted {:.2}s); warnings: {warnings}",
        status.rebalances, status.restore_last_s, status.restore_predicted_s
    )
}

/// `sluice status --state-dir`: each partition's offset and entries as its state holds
/// them, and its newest checkpoint in `store`.
pub fn stored_status(state_dir: &Path, store: Option<&str>) -> Result<()> {
    let mut out = std::io::stdout().lock();
    let dir = StateDir::open_read_only(state_dir)?;
    let store = store.map(CheckpointStore::open_existing).transpose()?;
    let runtime = sluice::objects::runtime()?;
    writeln!(out, "{:>9}  {:>10}  {:>9}  newest checkpoint", "partition", "offset", "entries")?;
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
                    let age = (sluice::probes::now_ms().saturating_sub(m.created_at_ms)) as f64 / 1e3;
                    format!("{id} at offset {}, {age:.0}s old, {}, by {}", m.offset, bytes(m.bytes()), m.operator)
                }
                None => "none".to_string(),
            },
            None => "- (no --store)".to_string(),
        };
        writeln!(out, "{p:>9}  {offset:>10}  {entries:>9}  {newest}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host's answer to `GET /partitions` prints as a row per partition under the
    /// header, `-` where the host does not know a figure, and a footer line.
    #[test]
    fn a_hosts_answer_prints_as_rows_and_a_footer() {
        let answer: PartitionsAnswer = serde_json::from_str(
            r#"{
                "partitions": [
                    {"partition": 0, "version": "vehicle_stats@bb63", "committed_offset": 8335, "lag": 0,
                     "entries": 523, "state_bytes": 1048576, "cache_hits": 9, "cache_misses": 3, "processed": 8335,
                     "dead_letters": 0, "batch_p99_s": 0.0001, "checkpoint_age_s": 5.2},
                    {"partition": 7, "version": "vehicle_stats@bb63", "committed_offset": 12, "entries": 2,
                     "state_bytes": 512, "cache_hits": 0, "cache_misses": 0, "processed": 12, "dead_letters": 1,
                     "batch_p99_s": "+Inf"},
                    {"partition": 12, "version": "v", "committed_offset": 0, "entries": 0, "state_bytes": 0,
                     "cache_hits": 0, "cache_misses": 0, "processed": 0, "dead_letters": 0}
                ],
                "host": {"rebalances": 2, "restores": 1, "restore_last_s": 0.031, "restore_predicted_s": 0.002,
                         "warnings": [], "batch_seconds": []}
            }"#,
        )
        .expect("an answer of GET /partitions");
        let host = "http://127.0.0.1:9464";
        let rows: Vec<String> = answer.partitions.iter().map(|p| row(host, p)).collect();
        assert_eq!(
            [header(), rows[0].clone(), rows[1].clone(), rows[2].clone(), footer(host, &answer.host)],
            [
                "partition  host                          offset       lag    entries       bytes   batch-p99  \
                 checkpoint-age  version",
                "        0  http://127.0.0.1:9464           8335         0        523     1.0 MiB      ≤0.1ms              5s  \
                 vehicle_stats@bb63",
                "        7  http://127.0.0.1:9464             12         -          2       512 B      ≤infms               -  \
                 vehicle_stats@bb63",
                "       12  http://127.0.0.1:9464              0         -          0         0 B           -               -  v",
                "http://127.0.0.1:9464: 2 rebalances; latest restore 0.03s (predicted 0.00s); warnings: none",
            ]
        );
        let warned = HostStatus { warnings: vec!["state skew".into(), "frequent rebalances".into()], ..answer.host };
        assert!(footer(host, &warned).ends_with("; warnings: state skew, frequent rebalances"));
    }
}
