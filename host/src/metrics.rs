//! The host's Prometheus metrics, served by the [admin API](crate::admin) at
//! `GET /metrics` in the OpenMetrics text format.
//!
//! Nothing is counted here: [`Metrics`] is a collector that reads, at each scrape, the
//! counters the workers, checkpointers and the source already keep
//! ([`PartitionStats`] of each running partition, the [`HostStats`] of rebalances and
//! restores), so a scrape costs the job nothing between scrapes and can never disagree
//! with the running summary or the final report. Names and labels follow Prometheus'
//! conventions: counters end in `_total`, durations are `_seconds`, sizes `_bytes`, and
//! every per-partition series carries a `partition` label. docs/observability.md lists them
//! all.

use crate::lock;
use crate::stats::{HostStats, LiveStats, PartitionStats, Skew, now_ms};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The content type of [`Metrics::encode`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The collector behind `GET /metrics`.
#[derive(Debug)]
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
        let partitions: Vec<(u32, Arc<PartitionStats>)> =
            lock(&self.live).iter().map(|(&p, stats)| (p, stats.clone())).collect();
        let e = &mut encoder;
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        counters(e, "sluice_records_processed", "Records processed (emitted or dead-lettered)", &partitions, |s| {
            load(&s.processed)
        })?;
        counters(e, "sluice_outputs", "Outputs sent to the sink (an expiry's included)", &partitions, |s| {
            load(&s.outputs)
        })?;
        dead_letters(e, &partitions)?;
        gauges(e, "sluice_state_entries", "State entries held, as of the last commit", &partitions, |s| {
            Some(load(&s.entries) as f64)
        })?;
        let help = "Bytes the state takes in RocksDB (live data in table files, memtables), counted once a second";
        gauges(e, "sluice_state_bytes", help, &partitions, |s| Some(load(&s.state_bytes) as f64))?;
        counters(e, "sluice_state_cache_hits", "Reads of committed state the cache answered", &partitions, |s| {
            load(&s.cache_hits)
        })?;
        counters(e, "sluice_state_cache_misses", "Reads of committed state that went to RocksDB", &partitions, |s| {
            load(&s.cache_misses)
        })?;
        gauges(
            e,
            "sluice_committed_offset",
            "The next offset to process, committed with the state",
            &partitions,
            |s| Some(load(&s.committed_offset) as f64),
        )?;
        gauges(
            e,
            "sluice_consumer_lag_records",
            "Records in the Kafka partition beyond the state",
            &partitions,
            |s| {
                let lag = s.lag.load(Ordering::Relaxed);
                (lag >= 0).then_some(lag as f64)
            },
        )?;
        let help = "Processing time of each batch (the poll loop's tail must stay under max.poll.interval.ms)";
        histograms(e, "sluice_batch_duration_seconds", help, &partitions, |s| &s.batch_seconds)?;
        counters(e, "sluice_checkpoints", "Checkpoints completed", &partitions, |s| load(&s.checkpoints))?;
        let help = "Upload time of each completed checkpoint (files and manifest)";
        histograms(e, "sluice_checkpoint_duration_seconds", help, &partitions, |s| &s.checkpoint_seconds)?;
        counters(e, "sluice_checkpoint_failures", "Checkpoints that failed", &partitions, |s| {
            load(&s.checkpoint_failures)
        })?;
        counters(e, "sluice_checkpoint_uploaded_bytes", "Bytes uploaded by checkpoints", &partitions, |s| {
            load(&s.uploaded_bytes)
        })?;
        let now = now_ms();
        let help = "Time since the newest checkpoint held the partition's state (or it started here)";
        gauges(e, "sluice_checkpoint_age_seconds", help, &partitions, |s| {
            self.checkpoints.then(|| now.saturating_sub(load(&s.checkpoint_at_ms)) as f64 / 1e3)
        })?;
        counters(e, "sluice_expired_entries", "State entries removed by expiry", &partitions, |s| load(&s.expired))?;
        gauges(e, "sluice_expiry_backlog_entries", "Entries due but not yet expired", &partitions, |s| {
            Some(load(&s.backlog) as f64)
        })?;
        gauges(
            e,
            "sluice_ttl_clock_seconds",
            "The partition's expiry clock, seconds since the epoch",
            &partitions,
            |s| {
                let clock = load(&s.clock_ms);
                (clock > 0).then_some(clock as f64 / 1e3)
            },
        )?;
        counters(e, "sluice_operator_switches", "Operator versions switched to (hot swaps)", &partitions, |s| {
            load(&s.switches)
        })?;
        operator_versions(e, &partitions)?;
        skew(e, "sluice_state_entries_skew_ratio", "Largest partition's entries over the median", &partitions, |s| {
            load(&s.entries)
        })?;
        skew(
            e,
            "sluice_state_bytes_skew_ratio",
            "Largest partition's state bytes over the median",
            &partitions,
            |s| load(&s.state_bytes),
        )?;
        skew(e, "sluice_batch_p99_skew_ratio", "Slowest partition's batch p99 over the median", &partitions, |s| {
            load(&s.batch_p99_us)
        })?;
        self.encode_host(e, partitions.len())
    }
}

impl Metrics {
    /// The metrics of the host as a whole: partitions, rebalances, restores.
    fn encode_host(&self, e: &mut DescriptorEncoder, running: usize) -> fmt::Result {
        let host = &self.host;
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        gauge(e, "sluice_partitions_running", "Partitions running on this host", running as f64)?;
        if let Some(interval) = self.max_poll_interval {
            let help = "The Kafka consumer's max.poll.interval.ms: the longest a rebalance may wait for a batch";
            gauge(e, "sluice_max_poll_interval_seconds", help, interval.as_secs_f64())?;
        }
        let help = "Rebalance callbacks that moved partitions of this member";
        counter(e, "sluice_rebalances", help, load(&host.rebalances))?;
        let help = "Rebalance callbacks that moved partitions of this member, by duration";
        host.rebalance_seconds.encode(e.encode_descriptor(
            "sluice_rebalance_duration_seconds",
            help,
            None,
            MetricType::Histogram,
        )?)?;
        counter(e, "sluice_partitions_assigned", "Partitions assigned to this member", load(&host.assigned))?;
        counter(e, "sluice_partitions_revoked", "Partitions handed over by this member", load(&host.revoked))?;
        counter(e, "sluice_partitions_lost", "Partitions taken from this member after an eviction", load(&host.lost))?;
        let help = "Restores (one start of one or more partitions), by duration";
        host.restore_seconds.encode(e.encode_descriptor(
            "sluice_restore_duration_seconds",
            help,
            None,
            MetricType::Histogram,
        )?)?;
        counter(
            e,
            "sluice_restored_bytes",
            "Bytes fetched from the checkpoint store by restores",
            load(&host.restored_bytes),
        )?;
        let seconds = |us: &AtomicU64| load(us) as f64 / 1e6;
        gauge(
            e,
            "sluice_restore_predicted_seconds",
            "The latest restore's predicted duration",
            seconds(&host.restore_predicted_us),
        )?;
        gauge(
            e,
            "sluice_restore_last_seconds",
            "The latest restore's actual duration",
            seconds(&host.restore_actual_us),
        )?;
        let help = "A warning that held at the latest check (value 1), by kind";
        let mut metric = e.encode_descriptor("sluice_warning", help, None, MetricType::Gauge)?;
        for kind in lock(&host.warnings).iter() {
            ConstGauge::new(1).encode(metric.encode_family(&[("kind", *kind)])?)?;
        }
        Ok(())
    }
}

/// A counter per partition, `value` of its counters.
fn counters(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    partitions: &Partitions,
    value: impl Fn(&PartitionStats) -> u64,
) -> fmt::Result {
    let mut metric = e.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (p, stats) in partitions {
        ConstCounter::new(value(stats)).encode(metric.encode_family(&[("partition", p.to_string())])?)?;
    }
    Ok(())
}

/// A gauge per partition for which `value` has one.
fn gauges(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    partitions: &Partitions,
    value: impl Fn(&PartitionStats) -> Option<f64>,
) -> fmt::Result {
    let mut metric = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (p, stats) in partitions {
        if let Some(value) = value(stats) {
            ConstGauge::new(value).encode(metric.encode_family(&[("partition", p.to_string())])?)?;
        }
    }
    Ok(())
}

/// One counter of the host.
fn counter(e: &mut DescriptorEncoder, name: &str, help: &str, value: u64) -> fmt::Result {
    ConstCounter::new(value).encode(e.encode_descriptor(name, help, None, MetricType::Counter)?)
}

/// One gauge of the host.
fn gauge(e: &mut DescriptorEncoder, name: &str, help: &str, value: f64) -> fmt::Result {
    ConstGauge::new(value).encode(e.encode_descriptor(name, help, None, MetricType::Gauge)?)
}

/// Dead letters per partition, operator version and kind.
fn dead_letters(e: &mut DescriptorEncoder, partitions: &Partitions) -> fmt::Result {
    let help = "Records (or outputs) sent to the dead letters, by the operator version and why";
    let mut metric = e.encode_descriptor("sluice_dead_letters", help, None, MetricType::Counter)?;
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

/// A histogram per partition, `histogram` of its counters.
fn histograms(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    partitions: &Partitions,
    histogram: impl Fn(&PartitionStats) -> &Histogram,
) -> fmt::Result {
    let mut metric = e.encode_descriptor(name, help, None, MetricType::Histogram)?;
    for (p, stats) in partitions {
        histogram(stats).encode(metric.encode_family(&[("partition", p.to_string())])?)?;
    }
    Ok(())
}

/// The operator version each partition runs, as a series of value 1.
fn operator_versions(e: &mut DescriptorEncoder, partitions: &Partitions) -> fmt::Result {
    let help = "The operator version a partition runs (value 1)";
    let mut metric = e.encode_descriptor("sluice_partition_operator_info", help, None, MetricType::Gauge)?;
    for (p, stats) in partitions {
        let labels = [("partition", p.to_string()), ("version", lock(&stats.version).clone())];
        ConstGauge::new(1).encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

/// The largest of `value` over the partitions, divided by their median; absent while
/// the median is 0.
fn skew(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    partitions: &Partitions,
    value: impl Fn(&PartitionStats) -> u64,
) -> fmt::Result {
    let metric = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
    match Skew::of(partitions.iter().map(|(_, stats)| value(stats))) {
        Some(skew) => ConstGauge::new(skew.ratio).encode(metric),
        None => Ok(()),
    }
}
