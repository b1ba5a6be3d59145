//! The phrases this host's partitions log as they start, stop and are followed, that a
//! reader or a test looks for: a jump in offsets, a start waiting for the checkpoint
//! store, a partition stopping or starting again, standby copies warming up. Each is
//! written once, here, and used where its line is written. [`crate::events`] re-exports
//! these with every other component's phrases.

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
