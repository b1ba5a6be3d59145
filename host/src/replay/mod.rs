//! `sluice replay`: trying a version of an operator against a partition's real records
//! before it counts.
//!
//! - [`run`](mod@run): one partition replayed from a checkpoint through a given version, as
//!   its host would have processed it: the test that a version is deterministic, and
//!   the way to run new code over production history.
//! - [`diff`]: how two runs' outputs of the same records differ, record by record and
//!   field by field.
//!
//! It builds on the host's own pieces — a checkpoint's restore, the sandbox, the
//! partition worker — and changes nothing a job owns: no checkpoint, registry entry or
//! output of the live job is written.

pub mod diff;
pub mod run;

pub use run::{Replay, ReplayInput, Replayed, run};
