//! The host's counters beyond any one partition ([`HostStats`]): its rebalances and
//! restores, the warnings that hold, and its latest [`TimelineEntry`]s for the status
//! page's timeline.

use super::Histogram;
use crate::lock;
use crate::probes::now_ms;
use crate::record::RESUME_PATHS;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// What a rebalance did to this member's partitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RebalanceChange {
    /// Partitions were assigned to it.
    Assigned,
    /// Partitions were taken from it, handed over.
    Revoked,
    /// Partitions were taken from it after it was evicted: another member had them.
    Lost,
}

/// The host's counters beyond any one partition: its rebalances and restores.
#[derive(Debug)]
pub struct HostStats {
    /// Rebalance callbacks that moved partitions of this member (an eager rebalance
    /// makes two: the revocation and the assignment).
    pub rebalances: AtomicU64,
    /// Each of those callbacks' duration, s.
    pub rebalance_seconds: Histogram,
    /// Partitions assigned to this member so far.
    pub assigned: AtomicU64,
    /// Partitions revoked (handed over) so far.
    pub revoked: AtomicU64,
    /// Partitions lost (taken after an eviction, or claimed by another host in the
    /// checkpoint store) so far.
    pub lost: AtomicU64,
    /// Each restore's duration (one start of one or more partitions), s.
    pub restore_seconds: Histogram,
    /// Bytes fetched from the checkpoint store by restores.
    pub restored_bytes: AtomicU64,
    /// The latest restore's predicted duration, µs.
    pub restore_predicted_us: AtomicU64,
    /// The latest restore's actual duration, µs.
    pub restore_actual_us: AtomicU64,
    /// Partitions' resumes — from assignment to a running worker — s, by how they
    /// resumed: one histogram per [`RESUME_PATHS`] entry, in its order.
    pub resume_seconds: [Histogram; RESUME_PATHS.len()],
    /// The standby copies this host keeps, by partition (see
    /// `checkpoint::standby`).
    pub standby: Mutex<BTreeMap<u32, StandbyCopy>>,
    /// Bytes downloaded for standby copies.
    pub standby_fetched: AtomicU64,
    /// The kinds of warning that held at the latest check (see
    /// [`warnings`](crate::warnings)).
    pub warnings: Mutex<Vec<&'static str>>,
    /// The latest [`TIMELINE_KEPT`] entries of its timeline, oldest first.
    timeline: Mutex<VecDeque<TimelineEntry>>,
}

/// A standby copy as its latest update left it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StandbyCopy {
    /// The checkpoint it holds.
    pub checkpoint: Option<u64>,
    /// Checkpoints it is behind the owner's newest; `None`: not followed — the newest
    /// checkpoint does not fit in the disk budget, or the latest update failed.
    pub lag: Option<u64>,
    /// Its size.
    pub bytes: u64,
}

/// How many of the latest entries of the host's timeline [`HostStats`] keeps.
pub const TIMELINE_KEPT: usize = 256;

/// Something that happened to the host, when (ms since the epoch).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TimelineEntry {
    /// When it happened (for a switch: when its first partition switched).
    pub at_ms: u64,
    /// What happened.
    #[serde(flatten)]
    pub what: TimelineKind,
}

/// What happened, as the status page's timeline shows it (JSON: `"kind"` names the
/// variant, the other fields are its own).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TimelineKind {
    /// A rebalance callback moved `partitions` of this member's partitions.
    Rebalance {
        /// What it did to them.
        change: RebalanceChange,
        /// How many it moved.
        partitions: usize,
        /// How long the callback took, s.
        took_s: f64,
    },
    /// A restore started partitions from local state or the checkpoint store.
    Restore {
        /// Bytes fetched from the store.
        bytes: u64,
        /// How long it took, s.
        took_s: f64,
        /// How long it was predicted to take, s.
        predicted_s: f64,
        /// How each partition resumed: `p3 standby, p5 full`.
        paths: String,
    },
    /// The host brought its standby copies up to date before joining its group.
    WarmUp {
        /// Copies current at the end.
        copies: usize,
        /// Bytes downloaded.
        fetched: u64,
        /// How long the host waited, s.
        took_s: f64,
    },
    /// Partitions switched operator version (a deploy or rollback); the partitions of
    /// one deploy are one event.
    Switch {
        /// The version they ran.
        from: String,
        /// The version they run now.
        to: String,
        /// How many switched.
        partitions: usize,
    },
    /// A warning was logged (see [`warnings`](crate::warnings)).
    Warning {
        /// Its kind, as the [`WARNING`](crate::metrics::families::WARNING) metric labels it.
        warning: &'static str,
        /// What the log says: the numbers and the setting that tunes it.
        text: String,
    },
}

impl Default for HostStats {
    fn default() -> Self {
        HostStats {
            rebalances: AtomicU64::new(0),
            rebalance_seconds: Histogram::of_durations(),
            assigned: AtomicU64::new(0),
            revoked: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            restore_seconds: Histogram::of_durations(),
            restored_bytes: AtomicU64::new(0),
            restore_predicted_us: AtomicU64::new(0),
            restore_actual_us: AtomicU64::new(0),
            resume_seconds: std::array::from_fn(|_| Histogram::of_durations()),
            standby: Mutex::default(),
            standby_fetched: AtomicU64::new(0),
            warnings: Mutex::default(),
            timeline: Mutex::default(),
        }
    }
}

impl HostStats {
    /// Counts a rebalance that made `change` to `partitions` partitions in `took`.
    pub fn record_rebalance(&self, change: RebalanceChange, partitions: usize, took: Duration) {
        self.rebalances.fetch_add(1, Ordering::Relaxed);
        self.rebalance_seconds.observe(took.as_secs_f64());
        let counter = match change {
            RebalanceChange::Assigned => &self.assigned,
            RebalanceChange::Revoked => &self.revoked,
            RebalanceChange::Lost => &self.lost,
        };
        counter.fetch_add(partitions as u64, Ordering::Relaxed);
        self.record(TimelineKind::Rebalance { change, partitions, took_s: took.as_secs_f64() });
    }

    /// Counts a restore that fetched `bytes` in `took`, predicted to take `predicted`,
    /// its partitions resuming as `paths` says (`p3 standby, p5 full`).
    pub fn record_restore(&self, bytes: u64, took: Duration, predicted: Duration, paths: String) {
        self.restore_seconds.observe(took.as_secs_f64());
        self.restored_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.restore_predicted_us.store(crate::micros(predicted), Ordering::Relaxed);
        self.restore_actual_us.store(crate::micros(took), Ordering::Relaxed);
        let (took_s, predicted_s) = (took.as_secs_f64(), predicted.as_secs_f64());
        self.record(TimelineKind::Restore { bytes, took_s, predicted_s, paths });
    }

    /// Counts a partition's resume along `path` (one of [`RESUME_PATHS`]) in `took`.
    pub fn record_resume(&self, path: &str, took: Duration) {
        if let Some(at) = RESUME_PATHS.iter().position(|p| *p == path) {
            self.resume_seconds[at].observe(took.as_secs_f64());
        }
    }

    /// Records what an update left of `partition`'s standby copy, `fetched` bytes
    /// downloaded for it.
    pub fn record_standby(&self, partition: u32, copy: StandbyCopy, fetched: u64) {
        self.standby_fetched.fetch_add(fetched, Ordering::Relaxed);
        lock(&self.standby).insert(partition, copy);
    }

    /// Forgets `partition`'s standby copy: the partition runs here.
    pub fn forget_standby(&self, partition: u32) {
        lock(&self.standby).remove(&partition);
    }

    /// Records the warm-up before joining the group.
    pub fn record_warm_up(&self, copies: usize, fetched: u64, took: Duration) {
        self.record(TimelineKind::WarmUp { copies, fetched, took_s: took.as_secs_f64() });
    }

    /// Records that a partition switched from version `from` to `to`: one more partition
    /// of the latest event when that is the same switch (a deploy switches every
    /// partition within moments), else a new event.
    pub fn record_switch(&self, from: &str, to: &str) {
        let mut timeline = lock(&self.timeline);
        if let Some(TimelineEntry { what: TimelineKind::Switch { from: f, to: t, partitions }, .. }) =
            timeline.back_mut()
            && (f.as_str(), t.as_str()) == (from, to)
        {
            *partitions += 1;
            return;
        }
        drop(timeline);
        self.record(TimelineKind::Switch { from: from.to_string(), to: to.to_string(), partitions: 1 });
    }

    /// Records that warning `warning` was logged saying `text`.
    pub fn record_warning(&self, warning: &'static str, text: String) {
        self.record(TimelineKind::Warning { warning, text });
    }

    /// The latest entries of its timeline, oldest first.
    pub fn timeline(&self) -> Vec<TimelineEntry> {
        lock(&self.timeline).iter().cloned().collect()
    }

    fn record(&self, what: TimelineKind) {
        let mut timeline = lock(&self.timeline);
        if timeline.len() == TIMELINE_KEPT {
            timeline.pop_front();
        }
        timeline.push_back(TimelineEntry { at_ms: now_ms(), what });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The timeline keeps the latest entries, and one deploy's switches are one entry.
    #[test]
    fn the_timeline_keeps_the_latest_and_a_deploy_is_one_entry() {
        let host = HostStats::default();
        host.record_switch("v1", "v2");
        host.record_switch("v1", "v2");
        host.record_rebalance(RebalanceChange::Revoked, 2, Duration::from_millis(5));
        host.record_switch("v1", "v2");
        let kinds: Vec<TimelineKind> = host.timeline().into_iter().map(|e| e.what).collect();
        let switch = |partitions| TimelineKind::Switch { from: "v1".into(), to: "v2".into(), partitions };
        assert_eq!(kinds[0], switch(2), "two partitions in a row switching alike are one deploy");
        assert_eq!(kinds[2], switch(1), "a switch after another event is a new one");
        let json = serde_json::to_value(host.timeline()).unwrap();
        assert_eq!(json[1]["kind"], "rebalance");
        assert_eq!(json[1]["change"], "revoked");
        for n in 0..TIMELINE_KEPT {
            host.record_warning("state skew", format!("warning {n}"));
        }
        let timeline = host.timeline();
        assert_eq!(timeline.len(), TIMELINE_KEPT);
        assert_eq!(timeline[0].what, TimelineKind::Warning { warning: "state skew", text: "warning 0".into() });
    }
}
