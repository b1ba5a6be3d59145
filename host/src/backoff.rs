//! Trying again after a transient failure: after 1, 2, 4… s, at most 30 s apart, for
//! up to a timeout in all (`[checkpoint] restore_retry_timeout`, modelled on Kafka
//! Streams' `task.timeout.ms`).
//!
//! One pattern for every failure that should cost a partition a pause rather than the
//! host its run: a partition's start while the checkpoint store fails to answer, its
//! resume while the broker cannot say where its log is, its restart after another
//! producer fenced its transactions. This module owns only the schedule; what waits,
//! and what becomes of it past the timeout, is the caller's.
//!
//! A leaf: it imports nothing of the host.

use std::time::{Duration, Instant};

/// The first wait; each next one doubles.
const FIRST: Duration = Duration::from_secs(1);
/// The longest wait between two tries.
const LONGEST: Duration = Duration::from_secs(30);

/// The waits between the tries of one thing that keeps failing.
#[derive(Debug, Clone)]
pub struct Backoff {
    began: Instant,
    wait: Duration,
    timeout: Duration,
}

impl Backoff {
    /// Tries from now on, for up to `timeout` in all.
    pub fn new(timeout: Duration) -> Self {
        Backoff { began: Instant::now(), wait: FIRST, timeout }
    }

    /// How long to wait before the next try (each wait twice the last, at most
    /// `LONGEST`); `None` once that wait would end past the timeout: time to give up.
    pub fn next_wait(&mut self) -> Option<Duration> {
        let wait = self.wait;
        if self.began.elapsed() + wait >= self.timeout {
            return None;
        }
        self.wait = (wait * 2).min(LONGEST);
        Some(wait)
    }

    /// How long it has been trying.
    pub fn elapsed(&self) -> Duration {
        self.began.elapsed()
    }

    /// How long it tries in all.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_up_to_the_longest_and_end_at_the_timeout() {
        let mut backoff = Backoff::new(Duration::from_secs(3600));
        let waits: Vec<u64> = (0..8).map(|_| backoff.next_wait().unwrap().as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30, 30]);
        // A wait that would end past the timeout is not taken.
        assert_eq!(Backoff::new(Duration::from_millis(999)).next_wait(), None);
        assert_eq!(Backoff::new(Duration::ZERO).next_wait(), None);
        let mut short = Backoff::new(Duration::from_millis(2500));
        assert_eq!(short.next_wait(), Some(Duration::from_secs(1)));
        // 2 s more would end at 2 s + the time taken so far, still under 2.5 s.
        assert_eq!(short.next_wait(), Some(Duration::from_secs(2)));
        assert_eq!(short.timeout(), Duration::from_millis(2500));
        assert!(short.elapsed() < Duration::from_secs(1));
    }
}
