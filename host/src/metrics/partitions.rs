//! The status of a host's running partitions as typed JSON, which the
//! [admin API](crate::admin) serves at `GET /partitions`: what `sluice status` prints
//! and the status page shows, read from the same counters as the Prometheus text of
//! `GET /metrics`, so that neither has to parse that text or name a metric.
//!
//! This module owns the answer's shape and how the counters fill it; the route is the
//! admin API's, and how it is shown is the CLI's and the page's.

use super::{Metrics, lag, load, seconds};
use crate::lock;
use crate::probes::now_ms;
use crate::stats::{DeadLetters, ShadowReport, Skew, StandbyCopy};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeMap;

/// The answer to `GET /partitions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartitionsAnswer {
    /// The partitions running on the host, by number.
    pub partitions: Vec<PartitionStatus>,
    /// The host's figures beyond any one partition.
    pub host: HostStatus,
}

/// One running partition. A figure the host does not know is left out of the JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartitionStatus {
    /// The partition.
    pub partition: u32,
    /// The operator version it runs.
    pub version: String,
    /// The next offset to process, committed with the state.
    pub committed_offset: u64,
    /// Records in the Kafka partition beyond the state (Kafka sources only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag: Option<u64>,
    /// State entries held, as of the last commit.
    pub entries: u64,
    /// Bytes the state takes in RocksDB, counted at most once a second.
    pub state_bytes: u64,
    /// Reads of committed state the cache answered...
    pub cache_hits: u64,
    /// ... and those that went to RocksDB.
    pub cache_misses: u64,
    /// Records processed (emitted or dead-lettered).
    pub processed: u64,
    /// Records (or outputs) sent to the dead letters, of every operator version and kind.
    pub dead_letters: u64,
    /// The partition's clock as of the last commit — in event time its watermark, which
    /// TTLs and timers count on — ms since the epoch (none before it started).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watermark_ms: Option<u64>,
    /// State entries and timers due but not yet expired or fired, as of the last commit
    /// (0 from a host that does not say: `sluice status` reads older hosts too).
    #[serde(default)]
    pub due: u64,
    /// The upper bound of the batch-duration bucket holding the 99th percentile of its
    /// batches, s (none before its first batch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_p99_s: Option<UpperBound>,
    /// Since a checkpoint last held its state, s (if the job takes checkpoints).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_age_s: Option<f64>,
    /// What its shadow found, while one runs (or ran and stopped here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow: Option<ShadowReport>,
}

/// The host's figures beyond any one partition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostStatus {
    /// Rebalance callbacks that moved partitions of this member.
    pub rebalances: u64,
    /// Restores (each a start of one or more partitions).
    pub restores: u64,
    /// The latest restore's duration, s (0 before the first)...
    pub restore_last_s: f64,
    /// ... and what it was predicted to take, s.
    pub restore_predicted_s: f64,
    /// The Kafka consumer's `max.poll.interval.ms`, s (Kafka sources only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_poll_interval_s: Option<f64>,
    /// The kinds of warning that held at the latest check.
    pub warnings: Vec<String>,
    /// The largest partition's state entries over the median partition's (none while
    /// the median is 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entries_skew_ratio: Option<f64>,
    /// This host's standby copies of partitions it does not run, by partition (see
    /// `checkpoint::standby`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub standby: BTreeMap<u32, StandbyCopy>,
    /// The batch durations of every running partition, added up by bucket (empty while
    /// none runs).
    pub batch_seconds: Vec<Bucket>,
    /// The upper bound of the bucket of `batch_seconds` holding their 99th percentile, s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_p99_s: Option<UpperBound>,
}

/// One bucket of a histogram: how many values fell at or under its bound and over the
/// bound of the bucket before it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Bucket {
    /// Its upper bound.
    pub le: UpperBound,
    /// How many values fell in it.
    pub count: u64,
}

/// A histogram bucket's upper bound, s. JSON has no infinity: the last bucket's, which
/// holds whatever passed every other, is the string `"+Inf"`, as Prometheus writes it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UpperBound(pub f64);

/// How JSON spells an infinite [`UpperBound`].
const INFINITE: &str = "+Inf";

impl UpperBound {
    /// The bound of a [`Histogram`](crate::stats::Histogram) bucket, whose last is `f64::MAX`.
    fn of(bound: f64) -> Self {
        UpperBound(if bound == f64::MAX { f64::INFINITY } else { bound })
    }
}

impl Serialize for UpperBound {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0.is_finite() {
            true => serializer.serialize_f64(self.0),
            false => serializer.serialize_str(INFINITE),
        }
    }
}

impl<'de> Deserialize<'de> for UpperBound {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Spelled {
            Seconds(f64),
            Text(String),
        }
        match Spelled::deserialize(deserializer)? {
            Spelled::Seconds(seconds) => Ok(UpperBound(seconds)),
            Spelled::Text(text) if text == INFINITE => Ok(UpperBound(f64::INFINITY)),
            Spelled::Text(text) => Err(serde::de::Error::custom(format!("{text:?} is not a bucket's upper bound"))),
        }
    }
}

impl Metrics {
    /// The answer to `GET /partitions`, as of now; each shadow's samples (records' keys
    /// and values) only `with_samples`.
    pub fn partitions(&self, with_samples: bool) -> PartitionsAnswer {
        let running = self.running();
        let now = now_ms();
        let (mut partitions, mut batch_seconds) = (Vec::new(), Vec::<(f64, u64)>::new());
        for (partition, stats) in &running {
            let batches = stats.batch_seconds.counts().buckets;
            partitions.push(PartitionStatus {
                partition: *partition,
                version: lock(&stats.version).clone(),
                committed_offset: load(&stats.committed_offset),
                lag: lag(stats),
                entries: load(&stats.entries),
                state_bytes: load(&stats.state_bytes),
                cache_hits: load(&stats.cache_hits),
                cache_misses: load(&stats.cache_misses),
                processed: load(&stats.processed),
                dead_letters: lock(&stats.dead_by_version).values().map(DeadLetters::total).sum(),
                watermark_ms: Some(load(&stats.clock_ms)).filter(|ms| *ms > 0),
                due: load(&stats.backlog),
                batch_p99_s: p99(&batches),
                checkpoint_age_s: self.checkpoint_age_s(stats, now),
                shadow: Some(stats.shadow.report()).filter(|shadow| shadow.version.is_some()).map(|shadow| {
                    ShadowReport { samples: if with_samples { shadow.samples } else { Vec::new() }, ..shadow }
                }),
            });
            // Every partition's histogram has the same buckets.
            match batch_seconds.is_empty() {
                true => batch_seconds = batches,
                false => batch_seconds.iter_mut().zip(batches).for_each(|(all, (_, count))| all.1 += count),
            }
        }
        let host = &self.host;
        let host = HostStatus {
            rebalances: load(&host.rebalances),
            restores: host.restore_seconds.counts().count,
            restore_last_s: seconds(&host.restore_actual_us),
            restore_predicted_s: seconds(&host.restore_predicted_us),
            max_poll_interval_s: self.max_poll_interval.map(|interval| interval.as_secs_f64()),
            warnings: lock(&host.warnings).iter().map(|kind| kind.to_string()).collect(),
            entries_skew_ratio: Skew::of(running.iter().map(|(_, stats)| load(&stats.entries))).map(|skew| skew.ratio),
            standby: lock(&host.standby).clone(),
            batch_p99_s: p99(&batch_seconds),
            batch_seconds: batch_seconds
                .into_iter()
                .map(|(le, count)| Bucket { le: UpperBound::of(le), count })
                .collect(),
        };
        PartitionsAnswer { partitions, host }
    }
}

/// The upper bound of the bucket of `buckets` (each bound with its own count, not
/// cumulative) that holds their 99th percentile; `None` while they hold nothing.
fn p99(buckets: &[(f64, u64)]) -> Option<UpperBound> {
    let total: u64 = buckets.iter().map(|&(_, count)| count).sum();
    let mut cumulative = 0;
    let holding = buckets.iter().find(|&&(_, count)| {
        cumulative += count;
        total > 0 && cumulative as f64 >= total as f64 * 0.99
    });
    holding.map(|&(bound, _)| UpperBound::of(bound))
}

#[cfg(test)]
mod tests {
    use super::super::families::*;
    use super::super::tests::fixture;
    use super::super::{encode, parse};
    use super::*;
    use std::collections::BTreeMap;

    /// `GET /partitions` tells what a scrape of `GET /metrics` at the same moment tells.
    #[test]
    fn the_answer_agrees_with_a_scrape() {
        let metrics = fixture();
        let samples = parse(&encode(&metrics.clone().registry()));
        let answer = metrics.partitions(true);
        let of = |family: &str, partition: u32| {
            let partition = partition.to_string();
            let mut found = samples.iter().filter(|s| s.name == family && s.label("partition") == Some(&partition));
            found.next().map(|s| s.value)
        };
        let host = |family: &str| samples.iter().find(|s| s.name == family).map(|s| s.value);
        // Each bucket's cumulative count by its `le`, of one partition or all.
        let buckets = |partition: Option<u32>| {
            let mut cumulative = BTreeMap::<String, f64>::new();
            let batches = samples.iter().filter(|s| s.name == format!("{}_bucket", BATCH_DURATION.name));
            for s in batches.filter(|s| partition.is_none_or(|p| s.label("partition") == Some(&p.to_string()))) {
                *cumulative.entry(s.label("le").expect("a bucket's bound").to_string()).or_default() += s.value;
            }
            let mut cumulative: Vec<(f64, f64)> =
                cumulative.into_iter().map(|(le, n)| (le.parse().expect("a bound"), n)).collect();
            cumulative.sort_by(|a, b| a.0.total_cmp(&b.0));
            cumulative
        };
        let p99 = |cumulative: &[(f64, f64)]| {
            let total = cumulative.last().map_or(0.0, |&(_, n)| n);
            cumulative.iter().find(|&&(_, n)| total > 0.0 && n >= total * 0.99).map(|&(le, _)| le)
        };

        let numbers: Vec<u32> = answer.partitions.iter().map(|p| p.partition).collect();
        assert_eq!(numbers, [0, 1, 3]);
        for p in &answer.partitions {
            let n = p.partition;
            assert_eq!(Some(p.committed_offset as f64), of(COMMITTED_OFFSET.name, n));
            assert_eq!(p.lag.map(|lag| lag as f64), of(CONSUMER_LAG.name, n));
            assert_eq!(Some(p.entries as f64), of(STATE_ENTRIES.name, n));
            assert_eq!(Some(p.state_bytes as f64), of(STATE_BYTES.name, n));
            assert_eq!(Some(p.cache_hits as f64), of(&STATE_CACHE_HITS.sample(), n));
            assert_eq!(Some(p.cache_misses as f64), of(&STATE_CACHE_MISSES.sample(), n));
            assert_eq!(Some(p.processed as f64), of(&RECORDS_PROCESSED.sample(), n));
            let dead = samples.iter().filter(|s| s.name == DEAD_LETTERS.sample());
            let dead: f64 = dead.filter(|s| s.label("partition") == Some(&n.to_string())).map(|s| s.value).sum();
            assert_eq!(p.dead_letters as f64, dead);
            let version = samples
                .iter()
                .find(|s| s.name == PARTITION_OPERATOR_INFO.name && s.label("partition") == Some(&n.to_string()));
            assert_eq!(Some(p.version.as_str()), version.and_then(|s| s.label("version")));
            assert_eq!(p.batch_p99_s.map(|p99| p99.0), p99(&buckets(Some(n))), "partition {n}");
            let (age, scraped) = (p.checkpoint_age_s.expect("an age"), of(CHECKPOINT_AGE.name, n).expect("an age"));
            assert!((age - scraped).abs() < 1.0 && (4.0..5.0).contains(&age), "{age} against {scraped}");
        }
        assert_eq!(answer.partitions[0].batch_p99_s, Some(UpperBound(f64::INFINITY)), "a batch of 70 s in 6");
        assert!(answer.partitions[2].batch_p99_s.is_some_and(|p99| p99.0.is_finite()));

        let status = &answer.host;
        assert_eq!(Some(status.rebalances as f64), host(&REBALANCES.sample()));
        assert_eq!(Some(status.restores as f64), host(&RESTORE_DURATION.count()));
        assert_eq!(Some(status.restore_last_s), host(RESTORE_LAST.name));
        assert_eq!(Some(status.restore_predicted_s), host(RESTORE_PREDICTED.name));
        assert_eq!(status.max_poll_interval_s, host(MAX_POLL_INTERVAL.name));
        assert_eq!(status.entries_skew_ratio, host(STATE_ENTRIES_SKEW.name));
        let warnings: Vec<&str> =
            samples.iter().filter(|s| s.name == WARNING.name).filter_map(|s| s.label("kind")).collect();
        assert_eq!(status.warnings, warnings);
        let mut cumulative = 0.0;
        let all: Vec<(f64, f64)> = status
            .batch_seconds
            .iter()
            .map(|bucket| {
                cumulative += bucket.count as f64;
                (bucket.le.0, cumulative)
            })
            .collect();
        assert_eq!(all, buckets(None));
        assert_eq!(status.batch_p99_s.map(|p99| p99.0), p99(&all));
    }

    /// The answer's JSON: figures the host does not know are left out, the last
    /// bucket's bound is `"+Inf"`, and it reads back as it was.
    #[test]
    fn the_answer_in_json() {
        let answer = fixture().partitions(true);
        let json = serde_json::to_value(&answer).expect("serializing");
        let partitions = json["partitions"].as_array().expect("the partitions");
        assert_eq!(partitions[0]["lag"], 0);
        assert!(partitions[1].get("lag").is_none(), "partition 1 has no lag: {json}");
        assert_eq!(partitions[0]["batch_p99_s"], INFINITE);
        assert_eq!(partitions[0]["dead_letters"], 3);
        assert_eq!(partitions[0]["version"], "op@v0");
        let buckets = json["host"]["batch_seconds"].as_array().expect("the buckets");
        assert_eq!(buckets.len(), 21, "20 bounds and +Inf");
        assert_eq!(buckets[0], serde_json::json!({ "le": 0.0001, "count": 3 }), "a batch of 50 µs per partition");
        assert_eq!(buckets[20], serde_json::json!({ "le": INFINITE, "count": 2 }));
        assert_eq!(json["host"]["warnings"], serde_json::json!(["state skew", "frequent rebalances"]));
        assert_eq!(json["host"]["max_poll_interval_s"], 300.0);
        assert_eq!(serde_json::from_value::<PartitionsAnswer>(json).expect("reading it back"), answer);

        let idle = Metrics::new(Default::default(), Default::default(), None, false).partitions(true);
        let json = serde_json::to_value(&idle).expect("serializing");
        assert_eq!(json["partitions"], serde_json::json!([]));
        assert_eq!(json["host"]["batch_seconds"], serde_json::json!([]), "no buckets while no partition runs");
        for unknown in ["max_poll_interval_s", "entries_skew_ratio", "batch_p99_s"] {
            assert!(json["host"].get(unknown).is_none(), "{unknown}: {json}");
        }
        let bound = serde_json::from_str::<UpperBound>("\"-Inf\"");
        assert!(bound.is_err(), "{bound:?}");
    }
}
