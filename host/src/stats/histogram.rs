//! A histogram counted as Prometheus counts one, readable as counts.

use crate::lock;
use prometheus_client::metrics::histogram::exponential_buckets;
use std::sync::Mutex;

/// Values counted into buckets, as Prometheus' histograms count them (the
/// [metrics](crate::metrics) encode it as one), readable as counts for the status the
/// admin API serves.
#[derive(Debug)]
pub struct Histogram(Mutex<HistogramCounts>);

/// What a [`Histogram`] counted.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramCounts {
    /// The sum of the values.
    pub sum: f64,
    /// How many values there were.
    pub count: u64,
    /// Each bucket's upper bound (the last one's `f64::MAX`, which Prometheus writes as
    /// `+Inf`) and how many values fell in it and in no bucket before (not cumulative).
    pub buckets: Vec<(f64, u64)>,
}

impl Histogram {
    /// A histogram for durations, s: buckets from 100 µs to about 52 s, doubling, and
    /// one for the rest.
    pub fn of_durations() -> Self {
        let buckets = exponential_buckets(0.0001, 2.0, 20).chain([f64::MAX]).map(|bound| (bound, 0)).collect();
        Histogram(Mutex::new(HistogramCounts { sum: 0.0, count: 0, buckets }))
    }

    /// Counts `value` into the first bucket whose bound it does not pass (none if it is
    /// NaN or +∞, as Prometheus' own histogram counts).
    pub fn observe(&self, value: f64) {
        let mut counts = lock(&self.0);
        counts.sum += value;
        counts.count += 1;
        if let Some((_, n)) = counts.buckets.iter_mut().find(|(bound, _)| *bound >= value) {
            *n += 1;
        }
    }

    /// What it counted so far.
    pub fn counts(&self) -> HistogramCounts {
        lock(&self.0).clone()
    }
}
