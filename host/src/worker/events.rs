//! The phrases the partition workers log, and give dead letters, that a reader or a test
//! looks for: slow batches, a replay's switch, a record refused for its missing key, a shadow stopping, a jump
//! in offsets, a start waiting for the checkpoint store, a partition stopping or starting
//! again. Each is written once, here, and used where its line is written; the lines around
//! the phrases stay in the worker's rooms. (The kill points of the commit protocol are not
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

// The router's (`router.rs`).
/// Logged at a partition's first jump ahead in a run: `offsets jump from N to M`.
pub const OFFSETS_JUMP: &str = "offsets jump from";

// A partition's start (`start.rs`).
/// Logged while a start waits for the checkpoint store: `partitions [1, 3]: the
/// checkpoint store failed; trying again in 2s, …`.
pub const STORE_RETRY: &str = "the checkpoint store failed; trying again in";

// A partition's life on this host (`lifecycle.rs`).
/// Logged when a partition's worker stops: `stopped (Handover) in 12 ms at offset N; …`,
/// the reason being a [`Stop`](crate::record::Stop).
pub const STOPPED: &str = "stopped";

/// Logged when a partition's worker failed and the partition stops alone: `partition 1
/// stopped: …; the other partitions go on`.
pub const STOPPED_ALONE: &str = "the other partitions go on";

/// Logged when a fenced partition is to start again: `partition 1 stopped: …: fenced: …;
/// starting it again in 1s, …`.
pub const RESTARTING: &str = "starting it again in";

/// Logged when a partition stops because another host claimed it in the checkpoint
/// store: `partition 1 stopped: … partition 1 was claimed by host …; this host no longer
/// owns it …; stopped here without a last checkpoint; if the group still assigns it here
/// in 45s …`.
pub const CLAIMED_ELSEWHERE: &str = "stopped here without a last checkpoint";

// Standby copies (`standby.rs`).
/// Logged when a starting host brings its standby copies up to date before it joins its
/// group: `warming up: bringing standby copies of 6 partitions up to date from …`.
pub const WARMING_UP: &str = "warming up";

/// Logged when the warm-up ends, before the host joins its group: `warm-up done in
/// 1.2s: 4 copies current, 1.3 MiB fetched`.
pub const WARMED_UP: &str = "warm-up done";
