//! A bandwidth cap: bytes per second that transfers sharing it may move together
//! (`[checkpoint] upload_bytes_per_s` for one checkpoint's upload,
//! `download_bytes_per_s` for every download of a host from its checkpoint store).
//!
//! A transfer reserves its bytes as it moves them and waits the time the cap gives
//! them; reservations queue behind one another, so transfers in parallel share the cap
//! rather than each having all of it, and time left unused is not saved up for a burst.
//! This module owns only the arithmetic; how a transfer waits (a thread's sleep or a
//! task's) is the caller's.
//!
//! A leaf: it imports nothing of the host.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// A cap of bytes per second shared by the transfers that hold it.
#[derive(Debug)]
pub struct Bandwidth {
    bytes_per_s: f64,
    /// When the bytes reserved so far have all passed at the cap.
    free_at: Mutex<Instant>,
}

impl Bandwidth {
    /// A cap of `bytes_per_s` (positive: configuration checks it).
    pub fn new(bytes_per_s: u64) -> Self {
        Bandwidth { bytes_per_s: bytes_per_s.max(1) as f64, free_at: Mutex::new(Instant::now()) }
    }

    /// Reserves `bytes` just moved (or about to be); returns how long the caller waits
    /// so that, with everything reserved before, they pass at the cap.
    pub fn reserve(&self, bytes: u64) -> Duration {
        let now = Instant::now();
        let mut free_at = self.free_at.lock().unwrap_or_else(PoisonError::into_inner);
        *free_at = (*free_at).max(now) + Duration::from_secs_f64(bytes as f64 / self.bytes_per_s);
        *free_at - now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reservations queue: each waits for those before it, and an idle spell earns no
    /// burst.
    #[test]
    fn reservations_queue_at_the_cap() {
        let cap = Bandwidth::new(1000);
        let first = cap.reserve(500);
        assert!(first > Duration::from_millis(490) && first <= Duration::from_millis(500), "{first:?}");
        let second = cap.reserve(1000);
        assert!(second > Duration::from_millis(1490) && second <= Duration::from_millis(1500), "{second:?}");
        let idle = Bandwidth::new(1000);
        std::thread::sleep(Duration::from_millis(50));
        let after_idle = idle.reserve(100);
        assert!(after_idle > Duration::from_millis(90), "no credit for the idle spell: {after_idle:?}");
    }
}
