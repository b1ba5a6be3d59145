//! The host's side of the WIT world: the `bindgen!` output, and the names and
//! signatures of the exports the host calls (each result lifted by [`lift`](super::lift)'s
//! checked types).

use super::*;

wasmtime::component::bindgen!({
    path: "../wit",
    world: "operator",
    imports: { default: trappable },
    anyhow: true,
    // The record handed to `process` borrows the host's bytes, which are copied
    // into the guest's memory once, by the call itself.
    ownership: Borrowing { duplicate_if_necessary: true },
});

/// The WIT package operators are built against, and the version range this host serves.
pub const WIT_PACKAGE: &str = "sluice:operator";
/// The package's major.minor this host serves: any `0.1.x` component links.
pub const WIT_VERSION: &str = "0.1";

/// The interface a batched call reports each record's result through (0.1.1, defined
/// at this host's version), and the export that takes a batch.
pub(super) const BATCH_INTERFACE: &str = "sluice:operator/batch@0.1.3";

/// The exports a component may have, and the signatures the host calls them with
/// (each result lifted by [`lift`]'s checked types).
pub(super) const INIT: &str = "init";
pub(super) type InitParams<'a> = (&'a [(&'a str, &'a str)],);
pub(super) type InitResults = (std::result::Result<(), GuestReason>,);
pub(super) const PROCESS: &str = "process";
pub(super) type ProcessParams<'a> = (InputRecord<'a>,);
pub(super) type ProcessResults = (GuestResult,);
pub(super) const PROCESS_BATCH: &str = "process-batch";
pub(super) type BatchParams<'a> = (&'a [InputRecord<'a>],);
/// The export told of each expired state entry (0.1.2).
pub(super) const EXPIRED: &str = "expired";
pub(super) type ExpiredParams<'a> = (&'a [u8], &'a str, &'a [u8], u64);
/// The interface that sets and cancels the current key's timers (0.1.3, defined at this
/// host's version), and the export told of each timer that fires.
pub(super) const TIMERS_INTERFACE: &str = "sluice:operator/timers@0.1.3";
pub(super) const FIRED: &str = "fired";
pub(super) type FiredParams<'a> = (&'a [u8], &'a str, u64);
