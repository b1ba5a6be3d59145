//! The phrases that start the [warnings](super) a running job logs: skew, checkpoints
//! behind, standby copies behind, frequent rebalances, a rising dead-letter rate; each also names its kind in the
//! host's events. Each is written once, here, and used where its warning is written (in
//! `warnings/mod.rs`). [`crate::events`] re-exports them with every other component's phrases.

/// Starts the warning of a partition whose state is much larger than the others'.
pub const SKEWED_STATE: &str = "state skew";

/// Starts the warning of a partition whose batches are much slower than the others'.
pub const SKEWED_TIME: &str = "processing-time skew";

/// Starts the warning of checkpoints falling behind.
pub const CHECKPOINTS_BEHIND: &str = "checkpoints behind";

/// Starts the warning of standby copies far behind their partitions' owners, or not
/// kept at all.
pub const STANDBY_BEHIND: &str = "standby copies behind";

/// Starts the warning of a member rebalancing often.
pub const REBALANCING_OFTEN: &str = "frequent rebalances";

/// Starts the warning of many dead letters.
pub const DEAD_LETTERS_RISING: &str = "dead-letter rate";
