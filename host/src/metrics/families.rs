//! Every metric the host serves, named once: its name, type and help text, which the
//! [collector](super::Metrics) encodes and the tests and docs/observability.md refer to
//! (a test here checks that doc against this table, and the collector against it).
//!
//! This module owns the names only; what each metric's value is, is the collector's.

use prometheus_client::metrics::MetricType;

/// One metric family as `GET /metrics` declares it (`# TYPE`, `# HELP`).
#[derive(Debug, Clone, Copy)]
pub struct Family {
    /// Its name; a counter's samples add `_total` to it, a histogram's `_bucket`,
    /// `_count` and `_sum`.
    pub name: &'static str,
    /// Counter, gauge or histogram.
    pub kind: MetricType,
    /// What it measures, as its `# HELP` line says.
    pub help: &'static str,
}

impl Family {
    const fn counter(name: &'static str, help: &'static str) -> Family {
        Family { name, kind: MetricType::Counter, help }
    }

    const fn gauge(name: &'static str, help: &'static str) -> Family {
        Family { name, kind: MetricType::Gauge, help }
    }

    const fn histogram(name: &'static str, help: &'static str) -> Family {
        Family { name, kind: MetricType::Histogram, help }
    }

    /// The name its samples carry in a scrape: a counter's ends in `_total`, a gauge's
    /// is its name (a histogram's are [`Family::count`] and the buckets and sum).
    pub fn sample(&self) -> String {
        match self.kind {
            MetricType::Counter => format!("{}_total", self.name),
            _ => self.name.to_string(),
        }
    }

    /// The name of a histogram's sample counting its observations: `<name>_count`.
    pub fn count(&self) -> String {
        format!("{}_count", self.name)
    }
}

// Per partition (label `partition`).

/// Records processed, per partition.
pub const RECORDS_PROCESSED: Family =
    Family::counter("sluice_records_processed", "Records processed (emitted or dead-lettered)");
/// Outputs sent to the sink, per partition.
pub const OUTPUTS: Family = Family::counter("sluice_outputs", "Outputs sent to the sink (an expiry's included)");
/// Dead letters, per partition, operator version and kind.
pub const DEAD_LETTERS: Family = Family::counter(
    "sluice_dead_letters",
    "Records (or outputs) sent to the dead letters, by the operator version and why",
);
/// State entries held, per partition.
pub const STATE_ENTRIES: Family = Family::gauge("sluice_state_entries", "State entries held, as of the last commit");
/// Bytes the state takes in RocksDB, per partition.
pub const STATE_BYTES: Family = Family::gauge(
    "sluice_state_bytes",
    "Bytes the state takes in RocksDB (live data in table files, memtables), counted once a second",
);
/// Reads of committed state the cache answered, per partition.
pub const STATE_CACHE_HITS: Family =
    Family::counter("sluice_state_cache_hits", "Reads of committed state the cache answered");
/// Reads of committed state that went to RocksDB, per partition.
pub const STATE_CACHE_MISSES: Family =
    Family::counter("sluice_state_cache_misses", "Reads of committed state that went to RocksDB");
/// The committed offset, per partition.
pub const COMMITTED_OFFSET: Family =
    Family::gauge("sluice_committed_offset", "The next offset to process, committed with the state");
/// Records in the Kafka partition beyond the state.
pub const CONSUMER_LAG: Family =
    Family::gauge("sluice_consumer_lag_records", "Records in the Kafka partition beyond the state");
/// Each batch's processing time, per partition.
pub const BATCH_DURATION: Family = Family::histogram(
    "sluice_batch_duration_seconds",
    "Processing time of each batch (the poll loop's tail must stay under max.poll.interval.ms)",
);
/// Checkpoints completed, per partition.
pub const CHECKPOINTS: Family = Family::counter("sluice_checkpoints", "Checkpoints completed");
/// Each completed checkpoint's upload time, per partition.
pub const CHECKPOINT_DURATION: Family = Family::histogram(
    "sluice_checkpoint_duration_seconds",
    "Upload time of each completed checkpoint (files and manifest)",
);
/// Checkpoints that failed, per partition.
pub const CHECKPOINT_FAILURES: Family = Family::counter("sluice_checkpoint_failures", "Checkpoints that failed");
/// Bytes uploaded by checkpoints, per partition.
pub const CHECKPOINT_UPLOADED_BYTES: Family =
    Family::counter("sluice_checkpoint_uploaded_bytes", "Bytes uploaded by checkpoints");
/// Time since a checkpoint last held the partition's state.
pub const CHECKPOINT_AGE: Family = Family::gauge(
    "sluice_checkpoint_age_seconds",
    "Time since the newest checkpoint held the partition's state (or it started here)",
);
/// State entries removed by expiry (timers that fired included), per partition.
pub const EXPIRED_ENTRIES: Family =
    Family::counter("sluice_expired_entries", "State entries removed by expiry, timers that fired included");
/// Entries and timers due but not yet expired or fired, per partition.
pub const EXPIRY_BACKLOG: Family =
    Family::gauge("sluice_expiry_backlog_entries", "Entries and timers due but not yet expired or fired");
/// The partition's clock (in event time its watermark), which TTLs and timers count on.
pub const TTL_CLOCK: Family = Family::gauge(
    "sluice_ttl_clock_seconds",
    "The partition's clock (in event time its watermark) that TTLs and timers count on, seconds since the epoch",
);
/// Hot swaps, per partition.
pub const OPERATOR_SWITCHES: Family =
    Family::counter("sluice_operator_switches", "Operator versions switched to (hot swaps)");
/// The operator version a partition runs (label `version`, value 1).
pub const PARTITION_OPERATOR_INFO: Family =
    Family::gauge("sluice_partition_operator_info", "The operator version a partition runs (value 1)");
/// Records (and groups of expiries or timers) whose outputs a shadow compared, per
/// partition and `result`.
pub const SHADOW_COMPARED: Family = Family::counter(
    "sluice_shadow_compared",
    "Records (and groups of expiries or timers) a shadow's outputs were compared for, by result: equal, different, \
     only_live, only_shadow",
);
/// Records the shadow failed on where the live version did not, per partition.
pub const SHADOW_FAILED: Family = Family::counter(
    "sluice_shadow_failed",
    "Records the shadow failed on (trapped, past a limit) and the live did not",
);
/// Records the shadow skipped (out of its share of time), per partition.
pub const SHADOW_SKIPPED: Family = Family::counter(
    "sluice_shadow_skipped",
    "Records the shadow had no time for (its share of the live version's time spent) and did not compare",
);
/// State entries the shadow staged otherwise than the live version, per partition.
pub const SHADOW_DIFFERING_WRITES: Family = Family::counter(
    "sluice_shadow_differing_writes",
    "State entries the shadow wrote otherwise than the live version between two commits",
);
/// CPU time of the batches both ran, per partition and `side` (live, shadow).
pub const SHADOW_CPU: Family =
    Family::counter("sluice_shadow_cpu_seconds", "CPU time of the records both versions ran, by side: live, shadow");
/// The shadow version a partition runs (label `version`, value 1).
pub const SHADOW_INFO: Family = Family::gauge(
    "sluice_shadow_info",
    "The shadow version a partition runs beside the live one (value 1; 0 once it stopped there)",
);

// Of the host as a whole.

/// The largest partition's entries over the median.
pub const STATE_ENTRIES_SKEW: Family =
    Family::gauge("sluice_state_entries_skew_ratio", "Largest partition's entries over the median");
/// The largest partition's state bytes over the median.
pub const STATE_BYTES_SKEW: Family =
    Family::gauge("sluice_state_bytes_skew_ratio", "Largest partition's state bytes over the median");
/// The slowest partition's batch p99 over the median.
pub const BATCH_P99_SKEW: Family =
    Family::gauge("sluice_batch_p99_skew_ratio", "Slowest partition's batch p99 over the median");
/// Partitions running on this host.
pub const PARTITIONS_RUNNING: Family = Family::gauge("sluice_partitions_running", "Partitions running on this host");
/// The Kafka consumer's `max.poll.interval.ms` (Kafka sources only).
pub const MAX_POLL_INTERVAL: Family = Family::gauge(
    "sluice_max_poll_interval_seconds",
    "The Kafka consumer's max.poll.interval.ms: the longest a rebalance may wait for a batch",
);
/// Rebalance callbacks that moved partitions of this member.
pub const REBALANCES: Family =
    Family::counter("sluice_rebalances", "Rebalance callbacks that moved partitions of this member");
/// Those callbacks' durations.
pub const REBALANCE_DURATION: Family = Family::histogram(
    "sluice_rebalance_duration_seconds",
    "Rebalance callbacks that moved partitions of this member, by duration",
);
/// Partitions assigned to this member.
pub const PARTITIONS_ASSIGNED: Family =
    Family::counter("sluice_partitions_assigned", "Partitions assigned to this member");
/// Partitions handed over by this member.
pub const PARTITIONS_REVOKED: Family =
    Family::counter("sluice_partitions_revoked", "Partitions handed over by this member");
/// Partitions taken from this member without a handover: after an eviction, or claimed by
/// another host in the checkpoint store.
pub const PARTITIONS_LOST: Family = Family::counter(
    "sluice_partitions_lost",
    "Partitions taken from this member without a handover: after an eviction, or claimed by another host in the checkpoint store",
);
/// Restores' durations.
pub const RESTORE_DURATION: Family =
    Family::histogram("sluice_restore_duration_seconds", "Restores (one start of one or more partitions), by duration");
/// Bytes fetched from the checkpoint store by restores.
pub const RESTORED_BYTES: Family =
    Family::counter("sluice_restored_bytes", "Bytes fetched from the checkpoint store by restores");
/// The latest restore's predicted duration.
pub const RESTORE_PREDICTED: Family =
    Family::gauge("sluice_restore_predicted_seconds", "The latest restore's predicted duration");
/// The latest restore's actual duration.
pub const RESTORE_LAST: Family = Family::gauge("sluice_restore_last_seconds", "The latest restore's actual duration");
/// Partitions' resumes, from assignment to a running worker, by how they resumed
/// (label `path`: `empty`, `local`, `standby`, `incremental`, `full`).
pub const RESUME_DURATION: Family = Family::histogram(
    "sluice_partition_resume_seconds",
    "Partitions' resumes, from assignment to a running worker, by path (empty, local, standby, incremental, full)",
);
/// Checkpoints a standby copy is behind its partition's newest, per partition followed.
pub const STANDBY_LAG: Family = Family::gauge(
    "sluice_standby_lag_checkpoints",
    "Checkpoints this host's standby copy of a partition is behind the owner's newest",
);
/// The disk standby copies take.
pub const STANDBY_BYTES: Family =
    Family::gauge("sluice_standby_bytes", "The disk this host's standby copies take, bytes");
/// Bytes downloaded for standby copies.
pub const STANDBY_FETCHED: Family =
    Family::counter("sluice_standby_fetched_bytes", "Bytes downloaded from the checkpoint store for standby copies");
/// A warning that holds (label `kind`, value 1).
pub const WARNING: Family =
    Family::gauge("sluice_warning", "A warning that held at the latest check (value 1), by kind");

/// Every family above, in the order a scrape lists them.
pub const ALL: &[Family] = &[
    RECORDS_PROCESSED,
    OUTPUTS,
    DEAD_LETTERS,
    STATE_ENTRIES,
    STATE_BYTES,
    STATE_CACHE_HITS,
    STATE_CACHE_MISSES,
    COMMITTED_OFFSET,
    CONSUMER_LAG,
    BATCH_DURATION,
    CHECKPOINTS,
    CHECKPOINT_DURATION,
    CHECKPOINT_FAILURES,
    CHECKPOINT_UPLOADED_BYTES,
    CHECKPOINT_AGE,
    EXPIRED_ENTRIES,
    EXPIRY_BACKLOG,
    TTL_CLOCK,
    OPERATOR_SWITCHES,
    PARTITION_OPERATOR_INFO,
    SHADOW_COMPARED,
    SHADOW_FAILED,
    SHADOW_SKIPPED,
    SHADOW_DIFFERING_WRITES,
    SHADOW_CPU,
    SHADOW_INFO,
    STATE_ENTRIES_SKEW,
    STATE_BYTES_SKEW,
    BATCH_P99_SKEW,
    PARTITIONS_RUNNING,
    MAX_POLL_INTERVAL,
    REBALANCES,
    REBALANCE_DURATION,
    PARTITIONS_ASSIGNED,
    PARTITIONS_REVOKED,
    PARTITIONS_LOST,
    RESTORE_DURATION,
    RESTORED_BYTES,
    RESTORE_PREDICTED,
    RESTORE_LAST,
    RESUME_DURATION,
    STANDBY_LAG,
    STANDBY_BYTES,
    STANDBY_FETCHED,
    WARNING,
];

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// docs/observability.md names every metric as a scrape shows it (a counter with
    /// `_total`, a histogram by its family), and no metric this table does not hold.
    #[test]
    fn the_observability_doc_names_every_metric_and_no_other() {
        let doc = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/observability.md");
        let doc = std::fs::read_to_string(doc).expect("reading docs/observability.md");
        let named: BTreeSet<&str> = doc
            .match_indices("sluice_")
            .map(|(at, _)| {
                let rest = &doc[at..];
                &rest[..rest
                    .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
                    .unwrap_or(rest.len())]
            })
            .collect();
        let shown: BTreeSet<String> = ALL.iter().map(Family::sample).collect();
        let missing: Vec<&String> = shown.iter().filter(|name| !named.contains(name.as_str())).collect();
        assert!(missing.is_empty(), "docs/observability.md does not name {missing:?}");
        let unknown: Vec<&&str> = named.iter().filter(|name| !shown.contains(**name)).collect();
        assert!(unknown.is_empty(), "docs/observability.md names metrics sluice does not serve: {unknown:?}");
    }
}
