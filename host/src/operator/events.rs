//! The phrases the WebAssembly operators' host logs that a reader or a test looks for: a
//! trapped record called again, an instance's log lines dropped past their rate. Each is
//! written once, here, and used where its line is written (in `wasm/`).
//! [`crate::events`] re-exports them with every other component's phrases.

/// Logged when a record that trapped is called again: `calling it again in 10ms, attempt 2 of 2`.
pub const RETRYING: &str = "calling it again";

/// Logged when an instance's log lines pass their rate: `its log lines are dropped`.
pub const LOG_LINES_DROPPED: &str = "log lines are dropped";
