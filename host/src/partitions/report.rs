//! What one run of a partition on this host did ([`PartitionReport`]), as the job's
//! summary and the tests read it.

use crate::record::{RestoredFrom, Stop};
use crate::stats::{DeadLetters, ShadowReport, Totals};
use std::collections::BTreeMap;
use std::time::Duration;

/// What one run of a partition on this host did, from its start to its stop.
#[derive(Debug, Clone, PartialEq)]
pub struct PartitionReport {
    /// The partition.
    pub partition: u32,
    /// The offset it resumed from (stored with its state).
    pub resumed_at: u64,
    /// What its counters reached.
    pub totals: Totals,
    /// Its dead letters by the operator version that processed their records, and by
    /// kind.
    pub dead_letters: BTreeMap<String, DeadLetters>,
    /// Distinct keys holding state at the end, counted only when the source ended
    /// ([`Stop::Drain`]): counting scans the partition, too slow for a handover.
    pub keys: Option<u64>,
    /// Where its state came from at start.
    pub restored_from: RestoredFrom,
    /// From the assignment to the running worker.
    pub start_took: Duration,
    /// The operator version it ran at the end.
    pub version: String,
    /// What its shadow found, if one ran at the end.
    pub shadow: ShadowReport,
    /// How it ended.
    pub stopped: Stop,
}
