//! The phrases a restore logs that a reader or a test looks for: local state moved aside,
//! local files found corrupt, the store's restore history unavailable, a restore predicted over its budget. Each is
//! written once, here, and used where its line is written (in `restore.rs`).
//! [`crate::events`] re-exports them with every other component's phrases.

/// Logged when a local database that cannot be opened is moved aside for a checkpoint.
pub const LOCAL_MOVED_ASIDE: &str = "the local state cannot be opened; moved aside";

/// Logged when a checkpoint built from this host's files (a standby copy's, a
/// database's) does not open, a file trusted by its recorded checksum damaged since: it
/// is built again, every local file read first.
pub const LOCAL_FILES_CORRUPT: &str = "local files found corrupt";

/// Logged when the store's history of restore times cannot be read or written: the
/// restore goes on, its prediction from an assumed bandwidth.
pub const NO_RESTORE_HISTORY: &str = "restore statistics unavailable";

/// Names, in the host's events, the warning of a restore predicted over its budget.
pub const RESTORE_OVER_BUDGET: &str = "restore over budget";
