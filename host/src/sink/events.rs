//! The phrases the sinks log, and put in the errors that stop a partition, that a reader
//! or a test looks for: a line sink that cannot sync, a Kafka producer whose queue stayed
//! full, a partition's transactions taken over, replayed, fenced or aborted. Each is written
//! once, here, and used where its line is written; the lines around the phrases stay in the
//! sinks. [`crate::events`] re-exports them with every other component's phrases.

// The line sinks' (`mod.rs`).
/// Logged, after the path, when a line sink's file is not a regular file (`/dev/null`,
/// a pipe, a FIFO): its lines are written but cannot be synced to disk.
pub const NOT_SYNCED: &str = "is not a regular file: lines written to it are not synced to disk";

// The Kafka producer's (`kafka.rs`).
/// Starts the error of a partition whose producer's queue stayed full past
/// [`DELIVERY_TIMEOUT`](super::kafka::DELIVERY_TIMEOUT).
pub const QUEUE_STAYED_FULL: &str = "the Kafka producer's queue stayed full";

// A partition's Kafka transactions' (`transaction.rs`).
/// Logged when a partition's transactions are taken over: `outputs committed up to
/// offset N`.
pub const COVERED: &str = "outputs committed up to offset";

/// Logged when records whose outputs a committed transaction holds are processed again
/// to rebuild state whose commit a crash prevented.
pub const REPLAYED_SILENTLY: &str = "processed again without outputs";

/// Why a partition whose transaction failed to commit, unfenced, starts again.
pub const COMMIT_FAILED: &str = "the transaction did not commit: nothing since the partition's last commit counts";

/// Why a fenced producer stops: `fenced: another owner of this partition took over its
/// transactions`.
pub const FENCED: &str = "fenced: another owner of this partition took over its transactions";

/// Logged when a partition that stops without committing aborts its open transaction.
pub const ABORTED: &str = "aborted the open transaction";
