//! The phrases the WebAssembly operators' host logs that a reader or a test looks for: a
//! build compiled or read compiled, a trapped record called again, an instance's log
//! lines dropped past their rate. Each is
//! written once, here, and used where its line is written (in `wasm/`).
//! [`crate::events`] re-exports them with every other component's phrases.

/// Logged when a record that trapped is called again: `calling it again in 10ms, attempt 2 of 2`.
pub const RETRYING: &str = "calling it again";

/// Logged when a build compiled before is read from the compiled components a job keeps:
/// `operator component 3f2a… read compiled from …/compiled/….cwasm in 12 ms`.
pub const READ_COMPILED: &str = "read compiled from";

/// Logged when a build is compiled: `operator component 3f2a… compiled in 5912 ms`.
pub const COMPILED: &str = "compiled in";

/// Logged when an instance's log lines pass their rate: `its log lines are dropped`.
pub const LOG_LINES_DROPPED: &str = "log lines are dropped";
