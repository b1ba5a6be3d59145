//! The live counters of each partition running on this host.
//!
//! A partition's worker counts into its [`PartitionStats`] as it goes (the
//! checkpointer counts its checkpoints there too), and the host's rebalances and
//! restores go into its [`HostStats`], which also keeps the latest of the host's
//! [`TimelineEntry`]s for the status page's timeline; the running summary, the deployer
//! (waiting for partitions to switch), the final report, the [metrics](crate::metrics)
//! and the [admin API](crate::admin) read them. This module holds the counters only:
//! it imports nothing of the host's layers but the shared record types, so that every
//! layer can count without reaching into another.

mod histogram;
mod host;
mod partition;
mod shadow;

pub use histogram::{Histogram, HistogramCounts};
pub use host::{HostStats, RebalanceChange, StandbyCopy, TIMELINE_KEPT, TimelineEntry, TimelineKind};
pub use partition::{DeadLetters, LiveStats, PartitionStats, Totals};
pub use shadow::{SHADOW_SAMPLES, ShadowReport, ShadowSample, ShadowStats};

/// How unevenly a measure spreads over partitions: the largest value over the median.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Skew {
    /// `largest / median`.
    pub ratio: f64,
    /// The largest value.
    pub largest: u64,
    /// The median value.
    pub median: u64,
}

impl Skew {
    /// The skew of `values`; `None` without values or while the median is 0.
    pub fn of(values: impl IntoIterator<Item = u64>) -> Option<Skew> {
        let mut values: Vec<u64> = values.into_iter().collect();
        values.sort_unstable();
        // The lower median: of two partitions, the smaller.
        let (median, largest) = (*values.get(values.len().checked_sub(1)? / 2)?, *values.last()?);
        (median > 0).then(|| Skew { ratio: largest as f64 / median as f64, largest, median })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skew_is_the_largest_over_the_lower_median() {
        assert_eq!(Skew::of([10, 40]).map(|s| s.ratio), Some(4.0), "of two, the larger over the smaller");
        assert_eq!(Skew::of([5, 10, 10, 100]).map(|s| (s.median, s.largest)), Some((10, 100)));
        assert_eq!(Skew::of([0, 0, 7]), None, "a median of 0 has no ratio");
        assert_eq!(Skew::of([]), None);
    }
}
