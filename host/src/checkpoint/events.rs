//! The phrases a restore logs that a reader or a test looks for: local state moved aside,
//! the store's restore history unavailable, a restore predicted over its budget. Each is
//! written once, here, and used where its line is written (in `restore.rs`).
//! [`crate::events`] re-exports them with every other component's phrases.

/// Logged when a local database that cannot be opened is moved aside for a checkpoint.
pub const LOCAL_MOVED_ASIDE: &str = "the local state cannot be opened; moved aside";

/// Logged when the store's history of restore times cannot be read or written: the
/// restore goes on, its prediction from an assumed bandwidth.
pub const NO_RESTORE_HISTORY: &str = "restore statistics unavailable";

/// Names, in the host's events, the warning of a restore predicted over its budget.
pub const RESTORE_OVER_BUDGET: &str = "restore over budget";
