//! The tail of a worker's batch processing times: published as the partition's p99 and
//! maximum, and warned about when it nears the time a revocation may wait.

use super::events::{SLOW_BATCH, SLOW_BATCHES};
use crate::stats::{HostStats, PartitionStats};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Batches whose processing times make up the published tail.
const BATCH_TIMES: usize = 1000;

/// The recent batch processing times of one worker, and the warning when their tail
/// nears the limit a revocation can wait.
pub(super) struct BatchTimes {
    recent: VecDeque<Duration>,
    published: Instant,
    /// Warn when p99 or max reaches this: a revocation waits for the batch in hand, and
    /// Kafka evicts a member whose rebalance takes longer than `max.poll.interval.ms`.
    warn_at: Option<Duration>,
    warned: Option<Instant>,
}

impl BatchTimes {
    /// How often the tail is published (and checked against `warn_at`).
    const PUBLISH_EVERY: Duration = Duration::from_secs(1);
    /// The least time between two warnings of one worker.
    const WARN_EVERY: Duration = Duration::from_secs(30);

    /// No times yet; warns when the tail reaches `warn_at`.
    pub(super) fn new(warn_at: Option<Duration>) -> Self {
        BatchTimes { recent: VecDeque::with_capacity(BATCH_TIMES), published: Instant::now(), warn_at, warned: None }
    }

    /// Counts a batch of `partition` that `took`; publishes the tail to `stats` once a
    /// [`PUBLISH_EVERY`](Self::PUBLISH_EVERY), warning (in the log and `host`'s
    /// events) when it reaches the limit.
    pub(super) fn record(&mut self, took: Duration, partition: u32, stats: &PartitionStats, host: &HostStats) {
        stats.batch_seconds.observe(took.as_secs_f64());
        if self.recent.len() == BATCH_TIMES {
            self.recent.pop_front();
        }
        self.recent.push_back(took);
        if self.published.elapsed() < Self::PUBLISH_EVERY {
            return;
        }
        self.published = Instant::now();
        let mut sorted: Vec<Duration> = self.recent.iter().copied().collect();
        sorted.sort_unstable();
        let (p99, max) = (sorted[sorted.len() * 99 / 100], sorted[sorted.len() - 1]);
        stats.batch_p99_us.store(crate::micros(p99), Ordering::Relaxed);
        stats.batch_max_us.store(crate::micros(max), Ordering::Relaxed);
        stats.batch_times_counted.store(sorted.len() as u64, Ordering::Relaxed);
        if let Some(limit) = self.warn_at
            && (p99 >= limit || max >= limit)
            && self.warned.is_none_or(|at| at.elapsed() >= Self::WARN_EVERY)
        {
            self.warned = Some(Instant::now());
            let warning = format!(
                "partition {partition}: batch processing time p99 {:.0} ms, max {:.0} ms reaches {:.0} ms, \
                 {SLOW_BATCH}: a rebalance waits for the batch in hand, and a member whose rebalance outlasts \
                 max.poll.interval.ms is evicted. Lower [state] batch_records, speed up the operator, or raise \
                 max.poll.interval.ms",
                p99.as_secs_f64() * 1e3,
                max.as_secs_f64() * 1e3,
                limit.as_secs_f64() * 1e3
            );
            tracing::warn!(partition, "{warning}");
            host.record_warning(SLOW_BATCHES, warning);
        }
    }
}
