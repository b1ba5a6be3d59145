//! The running summary a job logs every `[report] interval`: a line of totals, then a
//! line per partition worth attention.

use super::events::LAG;
use super::report::clock_time;
use crate::lock;
use crate::probes::process_cpu;
use crate::stats::{DeadLetters, HostStats, LiveStats, PartitionStats};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Where the previous running-summary line left off.
pub(super) struct Mark {
    /// When it was taken.
    pub(super) at: Instant,
    processed: u64,
    cpu: Option<Duration>,
}

impl Mark {
    pub(super) fn now(processed: u64) -> Self {
        Mark { at: Instant::now(), processed, cpu: process_cpu() }
    }
}

/// Logs the running summary — a line of totals (records/s and the process's CPU time
/// per record since `since`, partitions, entries, lag, checkpoints, dead letters, and
/// `host`'s standby copies), then a line per partition [worth attention](worth_attention)
/// — and returns the new mark.
pub(super) fn log_summary(started: Instant, since: Mark, live: &LiveStats, host: &HostStats) -> Mark {
    let live = lock(live);
    let sum = |counter: fn(&PartitionStats) -> &AtomicU64| -> u64 {
        live.values().map(|s| counter(s).load(Ordering::Relaxed)).sum()
    };
    let processed = sum(|s| &s.processed);
    let now = Mark::now(processed);
    let records = processed.saturating_sub(since.processed);
    let rate = records as f64 / since.at.elapsed().as_secs_f64();
    let cpu = match (since.cpu, now.cpu) {
        (Some(before), Some(after)) if records > 0 => {
            format!(", {:.1} µs CPU/record", (after - before).as_secs_f64() * 1e6 / records as f64)
        }
        _ => String::new(),
    };
    let lags: Vec<i64> = live.values().map(|s| s.lag.load(Ordering::Relaxed)).filter(|&lag| lag >= 0).collect();
    let lag = if lags.is_empty() { String::new() } else { format!(" {LAG}{}", lags.iter().sum::<i64>()) };
    let failed = match sum(|s| &s.checkpoint_failures) {
        0 => String::new(),
        failed => format!(" ({failed} failed)"),
    };
    let by_partition: Vec<_> = live.values().map(|s| lock(&s.dead_by_version).clone()).collect();
    let dead: String = DeadLetters::by_version(&by_partition)
        .iter()
        .map(|(version, dead)| format!(" | dead letters of {version}: {dead}"))
        .collect();
    let copies = lock(&host.standby).values().map(|copy| copy.lag).collect::<Vec<_>>();
    let standby = match copies.iter().copied().collect::<Option<Vec<u64>>>() {
        _ if copies.is_empty() => String::new(),
        Some(lags) => format!(" | {} standby copies, ≤ {} behind", lags.len(), lags.iter().max().unwrap_or(&0)),
        None => format!(" | {} standby copies, some not followed", copies.len()),
    };
    let mut summary = format!(
        "[{:>6.1}s] {processed} records, {rate:.0} records/s{cpu} | {} partitions, {} entries{lag}, {} checkpoints{failed}{dead}{standby}",
        started.elapsed().as_secs_f64(),
        live.len(),
        sum(|s| &s.entries),
        sum(|s| &s.checkpoints),
    );
    for (p, why) in worth_attention(&live) {
        summary += &partition_line(p, &live[&p], &why);
    }
    // Through the log, so `--log-format json` keeps one JSON object a line.
    tracing::info!(target: "sluice::summary", "{summary}");
    now
}

/// Partitions the running summary lists one by one; a job with more lists only those
/// [worth attention](worth_attention).
const SUMMARY_PARTITIONS: usize = 4;

/// The partitions a running summary shows, each with why: every one of a small job;
/// of a larger one the slowest (batch p99), the largest (entries), the furthest behind
/// (lag) and the one with the largest expiry backlog, where that is above 0.
fn worth_attention(live: &BTreeMap<u32, Arc<PartitionStats>>) -> BTreeMap<u32, Vec<&'static str>> {
    if live.len() <= SUMMARY_PARTITIONS {
        return live.keys().map(|&p| (p, Vec::new())).collect();
    }
    let mut shown: BTreeMap<u32, Vec<&'static str>> = BTreeMap::new();
    /// A reason to show a partition, and the measure whose largest it is.
    type Criterion = (&'static str, fn(&PartitionStats) -> i64);
    let criteria: [Criterion; 4] = [
        ("slowest", |s| s.batch_p99_us.load(Ordering::Relaxed) as i64),
        ("largest", |s| s.entries.load(Ordering::Relaxed) as i64),
        ("furthest behind", |s| s.lag.load(Ordering::Relaxed)),
        ("largest expiry backlog", |s| s.backlog.load(Ordering::Relaxed) as i64),
    ];
    for (why, measure) in criteria {
        let top = live.iter().map(|(&p, s)| (measure(s), p)).max_by_key(|&(value, p)| (value, std::cmp::Reverse(p)));
        if let Some((_, p)) = top.filter(|&(value, _)| value > 0) {
            shown.entry(p).or_default().push(why);
        }
    }
    shown
}

/// The running summary's line of partition `p`, whose counters are `s`, shown for `why`.
fn partition_line(p: u32, s: &PartitionStats, why: &[&str]) -> String {
    let lag = s.lag.load(Ordering::Relaxed);
    // The event-time clock (the watermark, once a record set it), the entries and
    // timers due at it not yet done, and the entries expired so far.
    let mut ttl = String::new();
    let [clock_ms, due, expired] = [&s.clock_ms, &s.backlog, &s.expired].map(|c| c.load(Ordering::Relaxed));
    if clock_ms > 0 {
        ttl += &format!(" watermark={}", clock_time(clock_ms));
    }
    if due > 0 {
        ttl += &format!(" due={due}");
    }
    if expired > 0 {
        ttl += &format!(" expired={expired}");
    }
    format!(
        "\n  p{p}@{} entries={}{ttl} ckpt@{} batch-p99={:.2}ms{}{}",
        s.committed_offset.load(Ordering::Relaxed),
        s.entries.load(Ordering::Relaxed),
        s.checkpoint_offset.load(Ordering::Relaxed),
        s.batch_p99_us.load(Ordering::Relaxed) as f64 / 1e3,
        if lag >= 0 { format!(" {LAG}{lag}") } else { String::new() },
        if why.is_empty() { String::new() } else { format!(" ({})", why.join(", ")) }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A partition's line shows its watermark once a record set it, and what is due at
    /// it (expiries and timers) while anything is.
    #[test]
    fn a_partition_line_shows_its_watermark_and_what_is_due() {
        let s = PartitionStats::new(42, 7, "op@1");
        assert_eq!(partition_line(3, &s, &[]), "\n  p3@42 entries=7 ckpt@0 batch-p99=0.00ms");
        s.clock_ms.store(1_767_225_660_000, Ordering::Relaxed);
        s.backlog.store(5, Ordering::Relaxed);
        s.expired.store(2, Ordering::Relaxed);
        assert_eq!(
            partition_line(3, &s, &["slowest"]),
            "\n  p3@42 entries=7 watermark=2026-01-01T00:01:00Z due=5 expired=2 ckpt@0 batch-p99=0.00ms (slowest)"
        );
    }
}
