//! Which partitions run on this host: starting each as the source assigns it, stopping
//! it as it is revoked or the source ends, and keeping standby copies of those it does
//! not run.
//!
//! [`Workers`] owns the life of each partition on this host: started (held, claimed,
//! restored, opened, instantiated) when the source assigns it, stopped when it is
//! revoked or the source ends, started again after its transactions were fenced. The
//! [`Router`] stands between a source and the workers: it implements the source's
//! [`Partitions`](crate::source::Partitions), batching records for each partition.
//! Standby copies of partitions this host does not run follow the checkpoint store
//! ([`StandbySettings`]) on a thread of their own, giving way to every start. One
//! partition has one user at a time — a start, its worker or a standby update — which
//! the `occupancy` room keeps.
//!
//! The rooms point one way: `lifecycle` (the partitions and their runs) uses `start`
//! (one partition's start) and `standby` (the copies), which both use `occupancy`;
//! all of them share `setup` (what every partition starts with) and `report`.
//!
//! This module does not decide which partitions this host owns (the
//! [source](crate::source) does), read records, or touch a partition's state while it
//! runs: one partition's run is the [worker](crate::worker)'s.

pub(crate) mod events;
mod lifecycle;
mod occupancy;
mod report;
mod router;
mod setup;
mod standby;
mod start;

pub use lifecycle::Workers;
pub use report::PartitionReport;
pub use router::{DispatchReport, Router};
pub use setup::{Checkpointing, WorkerSetup};
pub use standby::{ChooseCopies, Followed, StandbySettings, chosen_copies};
