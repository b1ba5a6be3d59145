//! The host's metrics, served by the [admin API](crate::admin): at `GET /metrics` in the
//! OpenMetrics text format, for Prometheus, and at `GET /partitions` as typed JSON
//! ([`partitions`]), for `sluice status` and the status page.
//!
//! Nothing is counted here: [`Metrics`] reads, at each request, the counters the
//! workers, checkpointers and the source already keep ([`PartitionStats`] of each
//! running partition, the [`HostStats`] of rebalances and restores), so a scrape costs
//! the job nothing between scrapes and can never disagree with the running summary or
//! the final report. Each metric is named once, in [`families`]. Names and labels follow
//! Prometheus' conventions: counters end in `_total`, durations are `_seconds`, sizes
//! `_bytes`, and every per-partition series carries a `partition` label.
//! docs/observability.md lists them all.

pub mod families;
pub mod partitions;

use crate::lock;
use crate::probes::now_ms;
use crate::record::RESUME_PATHS;
use crate::stats::{Histogram, HistogramCounts, HostStats, LiveStats, PartitionStats, ShadowReport, Skew};
use families::*;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The content type of [`Metrics::encode`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What `GET /metrics` and `GET /partitions` read: the counters of the running
/// partitions and of the host.
#[derive(Debug, Clone)]
pub struct Metrics {
    live: LiveStats,
    host: Arc<HostStats>,
    max_poll_interval: Option<Duration>,
    checkpoints: bool,
}

impl Metrics {
    /// Metrics of the partitions in `live` and of `host`; `max_poll_interval` is the
    /// Kafka consumer's (`None` for the embedded sources); `checkpoints` says whether
    /// the job takes any.
    pub fn new(live: LiveStats, host: Arc<HostStats>, max_poll_interval: Option<Duration>, checkpoints: bool) -> Self {
        Metrics { live, host, max_poll_interval, checkpoints }
    }

    /// A registry holding these metrics, for [`encode`].
    pub fn registry(self) -> Registry {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(self));
        registry
    }

    /// The running partitions, by number, each with its counters.
    fn running(&self) -> Vec<(u32, Arc<PartitionStats>)> {
        lock(&self.live).iter().map(|(&p, stats)| (p, stats.clone())).collect()
    }

    /// Since a checkpoint last held the partition of `stats`'s state, as of `now` (ms
    /// since the epoch), s; `None` if the job takes no checkpoints.
    fn checkpoint_age_s(&self, stats: &PartitionStats, now: u64) -> Option<f64> {
        self.checkpoints.then(|| now.saturating_sub(load(&stats.checkpoint_at_ms)) as f64 / 1e3)
    }
}

/// The value of `counter`.
fn load(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

/// The consumer lag of the partition of `stats`, if its source reports one (Kafka).
fn lag(stats: &PartitionStats) -> Option<u64> {
    u64::try_from(stats.lag.load(Ordering::Relaxed)).ok()
}

/// The duration `micros` holds, s.
fn seconds(micros: &AtomicU64) -> f64 {
    load(micros) as f64 / 1e6
}

/// The metrics of `registry` as a scrape reads them.
pub fn encode(registry: &Registry) -> String {
    let mut text = String::new();
    // Writing into a String fails only if a collector fails, and these do not.
    prometheus_client::encoding::text::encode(&mut text, registry).expect("encoding metrics into a String");
    text
}

/// One sample of a scrape: a metric's name (with its `_total`, `_count`… suffix), its
/// labels and its value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The sample's name.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its value.
    pub value: f64,
}

impl Sample {
    /// The value of its label `name`, if it has one.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels.get(name).map(String::as_str)
    }
}

/// The samples of a scrape's `text` (what [`encode`] writes; label values without
/// escaped quotes or commas, as sluice's are).
pub fn parse(text: &str) -> Vec<Sample> {
    let mut samples = Vec::new();
    for line in text.lines().filter(|line| !line.starts_with('#') && !line.is_empty()) {
        let Some((series, value)) = line.rsplit_once(' ') else { continue };
        let (name, labels) = series.split_once('{').unwrap_or((series, "}"));
        let labels = labels.trim_end_matches('}').split(',').filter_map(|pair| {
            let (key, value) = pair.split_once('=')?;
            Some((key.to_string(), value.trim_matches('"').to_string()))
        });
        let value = value.parse().unwrap_or(f64::NAN);
        samples.push(Sample { name: name.to_string(), labels: labels.collect(), value });
    }
    samples
}

/// The running partitions, each with its counters.
type Partitions = [(u32, Arc<PartitionStats>)];

impl Collector for Metrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let partitions = self.running();
        let (e, partitions) = (&mut encoder, &partitions[..]);
        counters(e, RECORDS_PROCESSED, partitions, |s| load(&s.processed))?;
        counters(e, OUTPUTS, partitions, |s| load(&s.outputs))?;
        dead_letters(e, partitions)?;
        gauges(e, STATE_ENTRIES, partitions, |s| Some(load(&s.entries) as f64))?;
        gauges(e, STATE_BYTES, partitions, |s| Some(load(&s.state_bytes) as f64))?;
        counters(e, STATE_CACHE_HITS, partitions, |s| load(&s.cache_hits))?;
        counters(e, STATE_CACHE_MISSES, partitions, |s| load(&s.cache_misses))?;
        gauges(e, COMMITTED_OFFSET, partitions, |s| Some(load(&s.committed_offset) as f64))?;
        gauges(e, CONSUMER_LAG, partitions, |s| lag(s).map(|lag| lag as f64))?;
        histograms(e, BATCH_DURATION, partitions, |s| &s.batch_seconds)?;
        counters(e, CHECKPOINTS, partitions, |s| load(&s.checkpoints))?;
        histograms(e, CHECKPOINT_DURATION, partitions, |s| &s.checkpoint_seconds)?;
        counters(e, CHECKPOINT_FAILURES, partitions, |s| load(&s.checkpoint_failures))?;
        counters(e, CHECKPOINT_UPLOADED_BYTES, partitions, |s| load(&s.uploaded_bytes))?;
        let now = now_ms();
        gauges(e, CHECKPOINT_AGE, partitions, |s| self.checkpoint_age_s(s, now))?;
        counters(e, EXPIRED_ENTRIES, partitions, |s| load(&s.expired))?;
        gauges(e, EXPIRY_BACKLOG, partitions, |s| Some(load(&s.backlog) as f64))?;
        gauges(e, TTL_CLOCK, partitions, |s| {
            let clock = load(&s.clock_ms);
            (clock > 0).then_some(clock as f64 / 1e3)
        })?;
        counters(e, OPERATOR_SWITCHES, partitions, |s| load(&s.switches))?;
        operator_versions(e, partitions)?;
        shadows(e, partitions)?;
        skew(e, STATE_ENTRIES_SKEW, partitions, |s| load(&s.entries))?;
        skew(e, STATE_BYTES_SKEW, partitions, |s| load(&s.state_bytes))?;
        skew(e, BATCH_P99_SKEW, partitions, |s| load(&s.batch_p99_us))?;
        self.encode_host(e, partitions.len())
    }
}

impl Metrics {
    /// The metrics of the host as a whole: partitions, rebalances, restores.
    fn encode_host(&self, e: &mut DescriptorEncoder, running: usize) -> fmt::Result {
        let host = &self.host;
        gauge(e, PARTITIONS_RUNNING, running as f64)?;
        if let Some(interval) = self.max_poll_interval {
            gauge(e, MAX_POLL_INTERVAL, interval.as_secs_f64())?;
        }
        counter(e, REBALANCES, load(&host.rebalances))?;
        histogram(&host.rebalance_seconds, descriptor(e, REBALANCE_DURATION)?)?;
        counter(e, PARTITIONS_ASSIGNED, load(&host.assigned))?;
        counter(e, PARTITIONS_REVOKED, load(&host.revoked))?;
        counter(e, PARTITIONS_LOST, load(&host.lost))?;
        histogram(&host.restore_seconds, descriptor(e, RESTORE_DURATION)?)?;
        counter(e, RESTORED_BYTES, load(&host.restored_bytes))?;
        gauge(e, RESTORE_PREDICTED, seconds(&host.restore_predicted_us))?;
        gauge(e, RESTORE_LAST, seconds(&host.restore_actual_us))?;
        let mut metric = descriptor(e, RESUME_DURATION)?;
        for (path, values) in RESUME_PATHS.iter().zip(&host.resume_seconds) {
            histogram(values, metric.encode_family(&[("path", *path)])?)?;
        }
        let standby = lock(&host.standby).clone();
        let mut metric = descriptor(e, STANDBY_LAG)?;
        for (p, copy) in &standby {
            if let Some(lag) = copy.lag {
                ConstGauge::new(lag as f64).encode(metric.encode_family(&[("partition", p.to_string())])?)?;
            }
        }
        gauge(e, STANDBY_BYTES, standby.values().map(|c| c.bytes).sum::<u64>() as f64)?;
        counter(e, STANDBY_FETCHED, load(&host.standby_fetched))?;
        let mut metric = descriptor(e, WARNING)?;
        for kind in lock(&host.warnings).iter() {
            ConstGauge::new(1).encode(metric.encode_family(&[("kind", *kind)])?)?;
        }
        Ok(())
    }
}

/// The `# HELP` and `# TYPE` lines of `family`, and the encoder of its samples.
fn descriptor<'e>(e: &'e mut DescriptorEncoder, family: Family) -> Result<MetricEncoder<'e>, fmt::Error> {
    e.encode_descriptor(family.name, family.help, None, family.kind)
}

/// A counter per partition, `value` of its counters.
fn counters(
    e: &mut DescriptorEncoder,
    family: Family,
    partitions: &Partitions,
    value: impl Fn(&PartitionStats) -> u64,
) -> fmt::Result {
    let mut metric = descriptor(e, family)?;
    for (p, stats) in partitions {
        ConstCounter::new(value(stats)).encode(metric.encode_family(&[("partition", p.to_string())])?)?;
    }
    Ok(())
}

/// A gauge per partition for which `value` has one.
fn gauges(
    e: &mut DescriptorEncoder,
    family: Family,
    partitions: &Partitions,
    value: impl Fn(&PartitionStats) -> Option<f64>,
) -> fmt::Result {
    let mut metric = descriptor(e, family)?;
    for (p, stats) in partitions {
        if let Some(value) = value(stats) {
            ConstGauge::new(value).encode(metric.encode_family(&[("partition", p.to_string())])?)?;
        }
    }
    Ok(())
}

/// One counter of the host.
fn counter(e: &mut DescriptorEncoder, family: Family, value: u64) -> fmt::Result {
    ConstCounter::new(value).encode(descriptor(e, family)?)
}

/// One gauge of the host.
fn gauge(e: &mut DescriptorEncoder, family: Family, value: f64) -> fmt::Result {
    ConstGauge::new(value).encode(descriptor(e, family)?)
}

/// What `values` counted, as a Prometheus histogram.
fn histogram(values: &Histogram, mut metric: MetricEncoder) -> fmt::Result {
    let HistogramCounts { sum, count, buckets } = values.counts();
    metric.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
}

/// Dead letters per partition, operator version and kind.
fn dead_letters(e: &mut DescriptorEncoder, partitions: &Partitions) -> fmt::Result {
    let mut metric = descriptor(e, DEAD_LETTERS)?;
    for (p, stats) in partitions {
        for (version, dead) in lock(&stats.dead_by_version).iter() {
            for (kind, count) in dead.by_kind() {
                let labels =
                    [("partition", p.to_string()), ("operator_version", version.clone()), ("kind", kind.name().into())];
                ConstCounter::new(count).encode(metric.encode_family(&labels)?)?;
            }
        }
    }
    Ok(())
}

/// A histogram per partition, `of` its counters.
fn histograms(
    e: &mut DescriptorEncoder,
    family: Family,
    partitions: &Partitions,
    of: impl Fn(&PartitionStats) -> &Histogram,
) -> fmt::Result {
    let mut metric = descriptor(e, family)?;
    for (p, stats) in partitions {
        histogram(of(stats), metric.encode_family(&[("partition", p.to_string())])?)?;
    }
    Ok(())
}

/// The operator version each partition runs, as a series of value 1.
fn operator_versions(e: &mut DescriptorEncoder, partitions: &Partitions) -> fmt::Result {
    let mut metric = descriptor(e, PARTITION_OPERATOR_INFO)?;
    for (p, stats) in partitions {
        let labels = [("partition", p.to_string()), ("version", lock(&stats.version).clone())];
        ConstGauge::new(1).encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

/// What each partition's shadow found, for the partitions that ran one.
fn shadows(e: &mut DescriptorEncoder, partitions: &Partitions) -> fmt::Result {
    let reports: Vec<(u32, ShadowReport)> = partitions
        .iter()
        .map(|(p, stats)| (*p, stats.shadow.report()))
        .filter(|(_, report)| report.version.is_some() || report.compared > 0)
        .collect();
    let mut metric = descriptor(e, SHADOW_COMPARED)?;
    for (p, r) in &reports {
        let results = [
            ("equal", r.equal),
            ("different", r.different),
            ("only_live", r.only_live),
            ("only_shadow", r.only_shadow),
        ];
        for (result, count) in results {
            ConstCounter::new(count)
                .encode(metric.encode_family(&[("partition", p.to_string()), ("result", result.into())])?)?;
        }
    }
    let mut metric = descriptor(e, SHADOW_FAILED)?;
    for (p, r) in &reports {
        ConstCounter::new(r.shadow_failed).encode(metric.encode_family(&[("partition", p.to_string())])?)?;
    }
    let mut metric = descriptor(e, SHADOW_SKIPPED)?;
    for (p, r) in &reports {
        ConstCounter::new(r.skipped).encode(metric.encode_family(&[("partition", p.to_string())])?)?;
    }
    let mut metric = descriptor(e, SHADOW_DIFFERING_WRITES)?;
    for (p, r) in &reports {
        ConstCounter::new(r.differing_writes).encode(metric.encode_family(&[("partition", p.to_string())])?)?;
    }
    let mut metric = descriptor(e, SHADOW_CPU)?;
    for (p, r) in &reports {
        for (side, ns) in [("live", r.live_cpu_ns), ("shadow", r.shadow_cpu_ns)] {
            let labels = [("partition", p.to_string()), ("side", side.to_string())];
            ConstCounter::new(ns as f64 / 1e9).encode(metric.encode_family(&labels)?)?;
        }
    }
    let mut metric = descriptor(e, SHADOW_INFO)?;
    for (p, r) in &reports {
        let Some(version) = &r.version else { continue };
        let labels = [("partition", p.to_string()), ("version", version.clone())];
        ConstGauge::new(i64::from(r.stopped.is_none())).encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

/// The largest of `value` over the partitions, divided by their median; absent while
/// the median is 0.
fn skew(
    e: &mut DescriptorEncoder,
    family: Family,
    partitions: &Partitions,
    value: impl Fn(&PartitionStats) -> u64,
) -> fmt::Result {
    let metric = descriptor(e, family)?;
    match Skew::of(partitions.iter().map(|(_, stats)| value(stats))) {
        Some(skew) => ConstGauge::new(skew.ratio).encode(metric),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{DeadLetters, RebalanceChange};

    /// The metrics of partitions 0, 1 and 3 (1 without a lag, 3 without a batch past
    /// the last bucket), checkpointed 4 s ago, of a Kafka source, and of a host with two
    /// rebalances, a restore and two warnings.
    pub(super) fn fixture() -> Metrics {
        let live: LiveStats = Arc::default();
        for p in [0, 1, 3] {
            let stats = PartitionStats::new(100 * u64::from(p) + 7, 10 * u64::from(p), &format!("op@v{p}"));
            stats.processed.store(1000 + u64::from(p), Ordering::Relaxed);
            stats.state_bytes.store(1 << (20 + p), Ordering::Relaxed);
            stats.cache_hits.store(5 * u64::from(p), Ordering::Relaxed);
            stats.cache_misses.store(3, Ordering::Relaxed);
            stats.checkpoint_at_ms.store(now_ms() - 4_000, Ordering::Relaxed);
            if p != 1 {
                stats.lag.store(3 * i64::from(p), Ordering::Relaxed);
            }
            for seconds in [0.00005, 0.0003, 0.0042, 0.9, 0.0003 * f64::from(p + 1)] {
                stats.batch_seconds.observe(seconds);
            }
            if p != 3 {
                stats.batch_seconds.observe(70.0);
            }
            stats.count_dead("op@v0", DeadLetters { rejected: 1, trapped: u64::from(p), ..DeadLetters::default() });
            stats.count_dead("op@v1", DeadLetters { null_key: 2, ..DeadLetters::default() });
            lock(&live).insert(p, Arc::new(stats));
        }
        let host = Arc::new(HostStats::default());
        host.record_rebalance(RebalanceChange::Assigned, 3, Duration::from_millis(12));
        host.record_rebalance(RebalanceChange::Revoked, 1, Duration::from_millis(3));
        host.record_restore(123_456, Duration::from_millis(31), Duration::from_millis(2), "p0 full".into());
        lock(&host.warnings).extend(["state skew", "frequent rebalances"]);
        Metrics::new(live, host, Some(Duration::from_secs(300)), true)
    }

    /// A scrape declares the families of the table, each with its type, in its order,
    /// and no other.
    #[test]
    fn a_scrape_declares_the_families_of_the_table() {
        let text = encode(&fixture().registry());
        let declared: Vec<&str> = text.lines().filter_map(|line| line.strip_prefix("# TYPE ")).collect();
        let table: Vec<String> = ALL.iter().map(|family| format!("{} {}", family.name, family.kind.as_str())).collect();
        assert_eq!(declared, table);
    }
}
