//! The phrases the partition workers log, and give dead letters, that a reader or a test
//! looks for: slow batches, a replay's switch, a record refused for its missing key, a
//! shadow stopping. Each is written once, here, and used where its line is written; the
//! lines around the phrases stay in the worker's rooms. (The kill points of the commit protocol are not
//! log phrases: they stay with the protocol.) [`crate::events`] re-exports these with every
//! other component's phrases.

// A worker's, over its batches (`mod.rs`, `batch_times.rs`, `emitted.rs`).
/// Logged when a partition's batch times near the consumer's poll timeout: `batch
/// processing time p99 … reaches 1000 ms, half of max.poll.interval.ms: …`.
pub const SLOW_BATCH: &str = "half of max.poll.interval.ms";

/// Names, in the host's events, the warning of batch times near the poll timeout.
pub const SLOW_BATCHES: &str = "slow batches";

/// Logged with a switch a replay makes: `switched from … to … at offset 1500 (the
/// version that first processed these records)`.
pub const REPLAYED_WITH: &str = "the version that first processed these records";

/// The reason a dead letter of a record without a key gives.
pub const NULL_KEY_REFUSED: &str = "the record has no key, and keyed state would put it with every other keyless record \
     of its partition; [source] null_keys = \"operator\" gives such records to the operator instead";

// A partition's shadow (`shadow.rs`).
/// Logged when a partition's shadow stops while the live version goes on: `the shadow
/// stopped on this partition: …` and why.
pub const SHADOW_STOPPED: &str = "the shadow stopped on this partition";
