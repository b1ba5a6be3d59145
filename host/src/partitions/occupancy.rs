//! Which of this host's partitions a start, a worker or a standby update uses now
//! ([`Occupancy`]), so that a partition's state directory and transactions have one
//! user at a time, and whether any start is restoring, which standby updates give way
//! to. It does not start, stop or follow anything: [`start`](super::start),
//! [`lifecycle`](super::lifecycle) and [`standby`](super::standby) do, asking it first.

use crate::lock;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The partitions a start, a worker or a standby update of this host holds: a
/// partition's state directory and transactions are used by one at a time, so a
/// partition started again before an earlier start or worker of it ended (a start given
/// up still restoring, say) waits for that one to end. A standby update only takes a
/// partition no one holds ([`Occupancy::try_hold`]) and gives way to a start that wants
/// it ([`Occupancy::is_wanted`]), and to any start restoring
/// ([`Occupancy::is_restoring`]): a takeover's downloads go before a copy's, under the
/// download cap they share.
#[derive(Debug, Default)]
pub(super) struct Occupancy {
    held: Mutex<BTreeSet<u32>>,
    /// Partitions a start waits to hold.
    wanted: Mutex<BTreeSet<u32>>,
    released: Condvar,
    /// Starts restoring now.
    restoring: AtomicUsize,
}

/// A start restoring, counted in its [`Occupancy`] until dropped.
pub(super) struct Restoring<'a>(&'a Occupancy);

impl Drop for Restoring<'_> {
    fn drop(&mut self) {
        self.0.restoring.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A partition held in its [`Occupancy`] until dropped.
#[derive(Debug)]
pub(super) struct Held {
    partition: u32,
    occupancy: Arc<Occupancy>,
}

impl Occupancy {
    /// Holds `partition` for a start, waiting while an earlier start or worker holds
    /// it; `None` if the start is `given_up` first.
    pub(super) fn hold(self: &Arc<Self>, partition: u32, given_up: impl Fn() -> bool) -> Option<Held> {
        let mut held = lock(&self.held);
        while held.contains(&partition) {
            if given_up() {
                lock(&self.wanted).remove(&partition);
                return None;
            }
            lock(&self.wanted).insert(partition);
            held = self.released.wait_timeout(held, GIVE_UP_POLL).expect("no panics under this lock").0;
        }
        lock(&self.wanted).remove(&partition);
        held.insert(partition);
        Some(Held { partition, occupancy: self.clone() })
    }

    /// Holds `partition` if nothing does.
    pub(super) fn try_hold(self: &Arc<Self>, partition: u32) -> Option<Held> {
        lock(&self.held).insert(partition).then(|| Held { partition, occupancy: self.clone() })
    }

    /// Whether a start waits to hold `partition`.
    pub(super) fn is_wanted(&self, partition: u32) -> bool {
        lock(&self.wanted).contains(&partition)
    }

    /// Counts a start restoring until the returned guard drops.
    pub(super) fn restoring(&self) -> Restoring<'_> {
        self.restoring.fetch_add(1, Ordering::Relaxed);
        Restoring(self)
    }

    /// Whether a start is restoring.
    pub(super) fn is_restoring(&self) -> bool {
        self.restoring.load(Ordering::Relaxed) > 0
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        lock(&self.occupancy.held).remove(&self.partition);
        self.occupancy.released.notify_all();
    }
}

/// How often a waiting start looks whether it was given up.
const GIVE_UP_POLL: Duration = Duration::from_millis(50);

/// Sleeps for `wait`, or until `done` says so (looked at every [`GIVE_UP_POLL`]).
pub(super) fn wait_unless(wait: Duration, done: impl Fn() -> bool) {
    let until = Instant::now() + wait;
    while Instant::now() < until && !done() {
        std::thread::sleep(GIVE_UP_POLL.min(until.saturating_duration_since(Instant::now())));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A partition is held by one start or worker at a time: a second hold waits until
    /// the first is released, other partitions do not, and a start given up stops
    /// waiting.
    #[test]
    fn a_partition_is_held_by_one_start_or_worker_at_a_time() {
        let occupancy = Arc::new(Occupancy::default());
        let first = occupancy.hold(3, || false).expect("free");
        let other = occupancy.hold(4, || false).expect("another partition is free");
        assert!(occupancy.hold(3, || true).is_none(), "a start given up stops waiting");
        let second = std::thread::spawn({
            let occupancy = occupancy.clone();
            move || occupancy.hold(3, || false).map(|_held| Instant::now())
        });
        std::thread::sleep(Duration::from_millis(200));
        let released = Instant::now();
        drop(first);
        let held = second.join().expect("no panic").expect("held once released");
        assert!(held >= released, "held while the first still held it");
        drop(other);
    }

    /// A standby update gives way while any start restores, and only then.
    #[test]
    fn a_start_restoring_is_seen_until_it_ends() {
        let occupancy = Occupancy::default();
        assert!(!occupancy.is_restoring());
        let (first, second) = (occupancy.restoring(), occupancy.restoring());
        drop(first);
        assert!(occupancy.is_restoring(), "one start still restores");
        drop(second);
        assert!(!occupancy.is_restoring());
    }
}
