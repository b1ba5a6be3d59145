//! The live counters of each partition running on this host, and the process's CPU
//! time.
//!
//! A partition's worker counts into its [`PartitionStats`] as it goes (the
//! checkpointer counts its checkpoints there too), and the host's rebalances and
//! restores go into its [`HostStats`], which also keeps the latest of the host's
//! [`HostEvent`]s for the status page's timeline; the running summary, the deployer
//! (waiting for partitions to switch), the final report, the [metrics](crate::metrics)
//! and the [admin API](crate::admin) read them. This module holds the counters only:
//! it imports nothing of the host's layers but the shared record types, so that every
//! layer can count without reaching into another.

mod histogram;
mod host;
mod partition;
mod shadow;

pub use histogram::{Histogram, HistogramCounts};
pub use host::{EVENTS_KEPT, HostEvent, HostEventKind, HostStats, RebalanceChange, StandbyCopy};
pub use partition::{DeadLetters, LiveStats, PartitionStats, Totals};
pub use shadow::{SHADOW_SAMPLES, ShadowReport, ShadowSample, ShadowStats};

use std::time::Duration;

/// The wall clock, ms since the Unix epoch.
pub fn now_ms() -> u64 {
    crate::millis(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default())
}

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

/// The CPU time the calling thread has used (a system call: worth it per batch, not
/// per record).
pub fn thread_cpu() -> Duration {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `now` is a valid timespec for the call to write; the clock exists on
    // every Linux.
    let status = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    assert_eq!(status, 0, "reading the thread's CPU clock");
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// User plus system CPU time of the whole process so far — every thread, RocksDB's
/// background work included — from `/proc/self/stat`, in clock ticks of 10 ms (Linux's
/// `USER_HZ`, 100 on every architecture it runs on); `None` where that is unreadable.
pub fn process_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The fields after the command name (which may hold spaces and parentheses) start
    // with the state, field 3; utime and stime are fields 14 and 15.
    let mut fields = stat[stat.rfind(')')? + 2..].split_whitespace().skip(11);
    let mut ticks = || fields.next()?.parse::<u64>().ok();
    Some(Duration::from_millis((ticks()? + ticks()?) * 10))
}

/// The most memory the process has held resident so far (`VmHWM` in
/// `/proc/self/status`); `None` where that is unreadable.
pub fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib = status.lines().find_map(|line| line.strip_prefix("VmHWM:"))?.trim().strip_suffix("kB")?;
    Some(kib.trim().parse::<u64>().ok()? << 10)
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
