//! The phrases a job logs, and writes in its running summary and final report, that a
//! reader or a test looks for: the job started, a partition's lag, expired entries removed,
//! dead letters by kind. Each is written once, here, and used where its line is written (in
//! `job/mod.rs` and its `report` and `summary` rooms). [`crate::events`] re-exports them with
//! every other component's phrases.

/// Logged once a job has checked its store and sinks, before its source starts.
pub const JOB_STARTED: &str = "job started";

/// A partition's lag in a running-summary line: ` lag=N`, present when the source
/// knows its end (Kafka).
pub const LAG: &str = "lag=";

/// What follows the count of expired state entries in the final report.
pub const EXPIRED_REMOVED: &str = " expired state entries removed";

/// Starts the final report's line of dead letters by kind, one for each operator
/// version that had any: `dead letters by kind: 2 rejected by the operator, 1 trapped or
/// past a limit, 0 outputs refused by Kafka, 0 records without a key, 0 late for their
/// windows, from probe@…`. The running summary counts them the same way (`dead letters
/// of probe@…: …`).
pub const DEAD_LETTERS_BY_KIND: &str = "dead letters by kind";

/// Begins the final report's line of what a shadow found: `shadow compared with the live
/// version, vehicle_stats@…: 1000 compared, 1000 equal, …`.
pub const SHADOW_COMPARED: &str = "shadow compared with the live version,";

/// Logged when the partitions this host keeps standby copies of under `[checkpoint]
/// standby = N` change (the group's members came or went), followed by them.
pub const STANDBY_CHOSEN: &str = "standby copies kept here of partitions";
