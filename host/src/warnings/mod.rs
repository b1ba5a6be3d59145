//! Warnings about the numbers that break a stream job before they break it: a skewed
//! partition, checkpoints falling behind, standby copies falling behind, a member
//! rebalancing over and over, records pouring into the dead letters. (Batch times near the poll timeout and restores over
//! their budget are warned about where they are measured, by the
//! [worker](crate::worker) and the [restore](crate::checkpoint::restore).)
//!
//! A [`Watch`] reads the counters the job keeps anyway ([`PartitionStats`],
//! [`HostStats`]) every [`CHECK_EVERY`] and logs each warning with the setting that
//! tunes it, at most once a minute per kind; the kinds that hold are kept in the
//! [`HostStats`] for the metrics, and each warning logged is one of its events. It changes nothing in the job.

pub(crate) mod events;

use crate::config::ReportConfig;
use crate::lock;
use crate::probes::now_ms;
use crate::stats::{HostStats, LiveStats, PartitionStats, Skew};
use events::{CHECKPOINTS_BEHIND, DEAD_LETTERS_RISING, REBALANCING_OFTEN, SKEWED_STATE, SKEWED_TIME, STANDBY_BEHIND};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How often the numbers are looked at, and the window the rates are taken over.
pub const CHECK_EVERY: Duration = Duration::from_secs(5);
/// The least time between two warnings of one kind.
const WARN_EVERY: Duration = Duration::from_secs(60);
/// A partition holding fewer entries than this is not called skewed, whatever the ratio.
const SKEW_LEAST_ENTRIES: u64 = 1000;
/// A batch p99 shorter than this is not called skewed: fast is fast.
const SKEW_LEAST_BATCH_P99: Duration = Duration::from_millis(10);
/// A partition whose p99 is taken over fewer batches than this is not called skewed in
/// time: its p99 is its slowest batch, which one stall of a loaded machine sets.
const SKEW_LEAST_BATCHES: u64 = 100;

/// Watches a running job's numbers against `[report]`'s thresholds.
pub struct Watch {
    thresholds: ReportConfig,
    checkpoint_interval: Option<Duration>,
    live: LiveStats,
    host: Arc<HostStats>,
    /// Records processed and dead-lettered per partition at the last check.
    last: BTreeMap<u32, (u64, u64)>,
    last_rebalances: u64,
    /// When each rebalance of the last hour was seen.
    rebalances: VecDeque<Instant>,
    checked: Instant,
    warned: BTreeMap<&'static str, Instant>,
}

impl Watch {
    /// Watches the partitions in `live` and `host` against `thresholds`; checkpoints
    /// are expected every `checkpoint_interval` (`None`: checkpoints are off).
    pub fn new(
        thresholds: ReportConfig,
        checkpoint_interval: Option<Duration>,
        live: LiveStats,
        host: Arc<HostStats>,
    ) -> Self {
        Watch {
            thresholds,
            checkpoint_interval,
            live,
            host,
            last: BTreeMap::new(),
            last_rebalances: 0,
            rebalances: VecDeque::new(),
            checked: Instant::now(),
            warned: BTreeMap::new(),
        }
    }

    /// Checks the numbers if [`CHECK_EVERY`] has passed since the last check, logging
    /// what is wrong.
    pub fn check_if_due(&mut self) {
        if self.checked.elapsed() < CHECK_EVERY {
            return;
        }
        self.checked = Instant::now();
        let partitions: Vec<(u32, Arc<PartitionStats>)> =
            lock(&self.live).iter().map(|(&p, stats)| (p, stats.clone())).collect();
        let mut found = Vec::new();
        found.extend(self.skew(&partitions));
        found.extend(self.checkpoints_behind(&partitions));
        found.extend(self.standby_behind());
        found.extend(self.rebalancing_often());
        found.extend(self.dead_letters_rising(&partitions));
        *lock(&self.host.warnings) = found.iter().map(|&(kind, _)| kind).collect();
        for (kind, warning) in found {
            if self.warned.get(kind).is_none_or(|at| at.elapsed() >= WARN_EVERY) {
                self.warned.insert(kind, Instant::now());
                tracing::warn!("{warning}");
                self.host.record_warning(kind, warning);
            }
        }
    }

    fn skew(&self, partitions: &[(u32, Arc<PartitionStats>)]) -> Vec<(&'static str, String)> {
        let ratio = self.thresholds.skew_ratio;
        let mut found = Vec::new();
        let entries = |s: &PartitionStats| s.entries.load(Ordering::Relaxed);
        if let Some(skew) = Skew::of(partitions.iter().map(|(_, s)| entries(s)))
            && skew.ratio >= ratio
            && skew.largest >= SKEW_LEAST_ENTRIES
        {
            found.push((
                SKEWED_STATE,
                format!(
                    "{SKEWED_STATE}: partition {} holds {} state entries, {:.1} times the median partition's {} \
                     ([report] skew_ratio = {ratio}): it sets how long its restore and every rebalance that moves it \
                     take. A key that spreads better, or more partitions, evens it out",
                    partitions.iter().max_by_key(|(_, s)| entries(s)).map(|(p, _)| *p).unwrap_or_default(),
                    skew.largest,
                    skew.ratio,
                    skew.median
                ),
            ));
        }
        let p99 = |s: &PartitionStats| s.batch_p99_us.load(Ordering::Relaxed);
        // The median over every partition; the slowest among those whose p99 is a tail.
        let tails =
            partitions.iter().filter(|(_, s)| s.batch_times_counted.load(Ordering::Relaxed) >= SKEW_LEAST_BATCHES);
        if let Some(median) = Skew::of(partitions.iter().map(|(_, s)| p99(s))).map(|skew| skew.median)
            && let Some((slowest, stats)) = tails.max_by_key(|(_, s)| p99(s))
            && p99(stats) as f64 >= ratio * median as f64
            && Duration::from_micros(p99(stats)) >= SKEW_LEAST_BATCH_P99
        {
            found.push((
                SKEWED_TIME,
                format!(
                    "{SKEWED_TIME}: partition {slowest}'s batches take {:.1} ms at p99, {:.1} times the median partition's \
                     ([report] skew_ratio = {ratio}): the slowest partition sets the job's pace. Look for a hot key",
                    p99(stats) as f64 / 1e3,
                    p99(stats) as f64 / median as f64
                ),
            ));
        }
        found
    }

    fn checkpoints_behind(&self, partitions: &[(u32, Arc<PartitionStats>)]) -> Option<(&'static str, String)> {
        let intervals = self.thresholds.checkpoint_age_intervals;
        // A checkpoint interval of 0 checkpoints at every commit: no age is too old.
        let limit = self.checkpoint_interval.filter(|i| !i.is_zero())?.checked_mul(intervals)?;
        let now = now_ms();
        let behind: Vec<String> = partitions
            .iter()
            .filter_map(|(p, s)| {
                let age = Duration::from_millis(now.saturating_sub(s.checkpoint_at_ms.load(Ordering::Relaxed)));
                (age > limit).then(|| format!("{p} ({:.0}s)", age.as_secs_f64()))
            })
            .collect();
        if behind.is_empty() {
            return None;
        }
        Some((
            CHECKPOINTS_BEHIND,
            format!(
                "{CHECKPOINTS_BEHIND}: partitions {} have no checkpoint newer than {intervals} checkpoint intervals \
                 ([report] checkpoint_age_intervals = {intervals}): a restore would replay that much. See the \
                 checkpoint failures logged, the store, or [checkpoint] upload_bytes_per_s",
                behind.join(", ")
            ),
        ))
    }

    fn standby_behind(&self) -> Option<(&'static str, String)> {
        let intervals = self.thresholds.checkpoint_age_intervals;
        let behind: Vec<String> = lock(&self.host.standby)
            .iter()
            .filter_map(|(p, copy)| match copy.lag {
                Some(lag) if lag > u64::from(intervals) => Some(format!("{p} ({lag} checkpoints)")),
                Some(_) => None,
                None => Some(format!("{p} (not followed)")),
            })
            .collect();
        if behind.is_empty() {
            return None;
        }
        Some((
            STANDBY_BEHIND,
            format!(
                "{STANDBY_BEHIND}: this host's standby copies of partitions {} are more than {intervals} checkpoints \
                 behind their owners ([report] checkpoint_age_intervals = {intervals}): a move of them here fetches \
                 what the copy lacks. See the standby updates logged, [checkpoint] standby_max_bytes (a checkpoint \
                 that does not fit is not followed), download_bytes_per_s and standby_poll",
                behind.join(", ")
            ),
        ))
    }

    fn rebalancing_often(&mut self) -> Option<(&'static str, String)> {
        let count = self.host.rebalances.load(Ordering::Relaxed);
        let now = Instant::now();
        for _ in self.last_rebalances..count {
            self.rebalances.push_back(now);
        }
        self.last_rebalances = count;
        while self.rebalances.front().is_some_and(|at| at.elapsed() > Duration::from_secs(3600)) {
            self.rebalances.pop_front();
        }
        let limit = self.thresholds.rebalances_per_hour;
        (self.rebalances.len() > limit as usize).then(|| {
            (
                REBALANCING_OFTEN,
                format!(
                    "{REBALANCING_OFTEN}: {} rebalances in the last hour ([report] rebalances_per_hour = {limit}): \
                     each pauses the partitions that move until they are restored. Members evicted for slow batches \
                     (max.poll.interval.ms) or missed heartbeats (session.timeout.ms), or restarts without \
                     instance_id (static membership), are the usual causes",
                    self.rebalances.len()
                ),
            )
        })
    }

    fn dead_letters_rising(&mut self, partitions: &[(u32, Arc<PartitionStats>)]) -> Option<(&'static str, String)> {
        let (mut processed, mut dead) = (0, 0);
        let mut now = BTreeMap::new();
        for (p, s) in partitions {
            // Records without a key are refused by design (`[source] null_keys`), not failed.
            let failed: u64 = lock(&s.dead_by_version).values().map(|d| d.total() - d.null_key).sum();
            let counts = (s.processed.load(Ordering::Relaxed), failed);
            // A partition new since the last check counts from 0.
            let (before_processed, before_dead) = self.last.get(p).copied().unwrap_or_default();
            processed += counts.0.saturating_sub(before_processed);
            dead += counts.1.saturating_sub(before_dead);
            now.insert(*p, counts);
        }
        self.last = now;
        let limit = self.thresholds.dead_letter_ratio;
        let share = dead as f64 / processed.max(1) as f64;
        (dead > 0 && share > limit).then(|| {
            (
                DEAD_LETTERS_RISING,
                format!(
                    "{DEAD_LETTERS_RISING}: {dead} of the {processed} records of the last {}s went to the dead letters \
                     ({:.1}%, [report] dead_letter_ratio = {limit}): see their reasons in the dead letters; a deploy \
                     that fails records can be rolled back",
                    CHECK_EVERY.as_secs(),
                    share * 100.0
                ),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::StandbyCopy;

    /// A standby copy more than `checkpoint_age_intervals` checkpoints behind its owner,
    /// or a partition followed without a copy, is warned about by partition; a copy
    /// within the limit is not.
    #[test]
    fn standby_copies_behind_are_named() {
        let host = Arc::new(HostStats::default());
        let copy = |lag: Option<u64>| StandbyCopy { checkpoint: lag.map(|_| 1), lag, bytes: 0 };
        host.record_standby(1, copy(Some(3)), 0);
        let interval = Some(Duration::from_secs(10));
        let watch = Watch::new(ReportConfig::default(), interval, LiveStats::default(), host.clone());
        assert_eq!(watch.standby_behind(), None, "3 checkpoints behind is within the default limit of 3");
        host.record_standby(2, copy(Some(9)), 0);
        host.record_standby(3, copy(None), 0);
        let (kind, text) = watch.standby_behind().expect("two copies behind");
        assert_eq!(kind, STANDBY_BEHIND);
        assert!(text.contains("partitions 2 (9 checkpoints), 3 (not followed)"), "{text}");
    }

    /// The slowest partition by batch p99 is named only where its p99 is taken over 100
    /// batches or more: a quiet partition's one stalled batch is not a skew.
    #[test]
    fn time_skew_names_a_slow_tail_not_one_stalled_batch() {
        let partition = |p99_ms: u64, batches: u64| {
            let stats = Arc::new(PartitionStats::new(0, 0, "v"));
            stats.batch_p99_us.store(p99_ms * 1000, Ordering::Relaxed);
            stats.batch_times_counted.store(batches, Ordering::Relaxed);
            stats
        };
        let watch = Watch::new(ReportConfig::default(), None, LiveStats::default(), Arc::default());
        let skewed = |partitions: &[(u32, Arc<PartitionStats>)]| {
            watch
                .skew(partitions)
                .into_iter()
                .filter(|(kind, _)| *kind == SKEWED_TIME)
                .map(|(_, text)| text)
                .collect::<Vec<_>>()
        };
        let mut partitions =
            vec![(0, partition(40, 1000)), (1, partition(115, 40)), (2, partition(1, 40)), (3, partition(1, 40))];
        let found = skewed(&partitions);
        assert!(
            found.len() == 1 && found[0].starts_with("processing-time skew: partition 0's batches take 40.0 ms"),
            "{found:?}"
        );
        partitions[0] = (0, partition(2, 1000));
        assert_eq!(skewed(&partitions), Vec::<String>::new(), "partition 1's p99 is one batch of 40");
    }
}
