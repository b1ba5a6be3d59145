//! The WebAssembly sandbox: loading, validating and running operator components.
//!
//! A [`WasmOperator`] is a validated, compiled component with its linker set up
//! (pre-instantiated, so an instance costs microseconds, not a compile). A
//! [`WasmInstance`] runs one partition's records through a version (and through a
//! second version paired with it for the keys a [`KeyRoute`] names), and switches to
//! another between two batches, keeping the partition's state, when told to: which
//! versions run, and which keys each takes, are the [versions](super::versions)' to
//! say, never the sandbox's. Instances get only the `sluice:operator`
//! imports (keyed state and logging). WASI imports (the Rust standard library links
//! some in) are defined as traps, so a guest that touches the filesystem, network,
//! clock or environment traps with the name of the function — unless the job grants
//! the deterministic WASI (`wasi`), which gives them nothing of the machine; any other
//! import is refused when the component is loaded. Each record runs under a deadline (epoch
//! interruption), a memory cap on the whole instance, its memories and tables together
//! (a resource limiter), and [`OperatorLimits`] on what it makes the host hold: its
//! outputs, state writes and reads, and log lines. The host records why it
//! stopped a call — the memory cap, a denied import — as it happens, so a trap's
//! reason comes from that record, not from the wording of wasmtime's message.
//!
//! A component built against 0.1.1 or later also exports `process-batch`, which takes
//! a whole batch per call and reports each record's result through the `batch.finish`
//! import; the host then moves the record scope and restarts the deadline. One built
//! against 0.1.0 gets one `process` call per record. Both give the same outcomes.
//!
//! A component built against 0.1.2 or later may export `expired`: the host then calls
//! it for each state entry that expires, scoped to the entry's key, before the record
//! whose clock reached the expiry (a batched call is cut there, since a component
//! cannot be called while it is in a call). One built against 0.1.3 may set timers
//! (`timers`), which the state keeps in its timer index, and export
//! `fired`, which the host calls for a timer's entry instead of `expired`.
//!
//! What a call returns is lifted out of the guest's memory by `lift`'s types, which
//! check counts and lengths before copying anything. A batch's outputs, failure
//! reasons and expiries count against its per-batch bounds as they come, so a batch —
//! records and expiries alike — ends at its bounds wherever it is, even between two
//! expiries before one record.
//!
//! One room per concept: `bindings` (the WIT world and the exports' signatures),
//! `component` (loading, validating and compiling a component), `compiled` (compiled
//! components kept on disk), `engine` (engines,
//! the epoch thread, the CPU clock of deadlines), `limits`, `ctx` (what a call's host
//! functions see and count), `host` (the imports a guest calls), `lift` (what a call
//! returns, checked before it is copied), `outcome` (what a call's end becomes for its
//! record), `instance` (a partition's instance of a version, and of a paired one), `batch`
//! (how a batch runs through an instance: runs per call, retries, strict mode), `wasi`
//! (the deterministic WASI a job may grant), `tests`.

mod batch;
mod bindings;
mod compiled;
mod component;
mod ctx;
mod engine;
mod host;
mod instance;
mod lift;
mod limits;
mod outcome;
#[cfg(test)]
mod tests;
mod wasi;

pub use bindings::{WIT_PACKAGE, WIT_VERSION};
pub use compiled::keep_compiled;
pub use component::WasmOperator;
pub use instance::{KeyRoute, WasmInstance};
pub use limits::Limits;

// Every room of the sandbox sees the others' items through `use super::*`.
use bindings::{
    BATCH_INTERFACE, BatchParams, EXPIRED, ExpiredParams, FIRED, FiredParams, INIT, InitParams, InitResults, PROCESS,
    PROCESS_BATCH, ProcessParams, ProcessResults, TIMERS_INTERFACE,
};
use component::*;
use ctx::*;
use engine::*;
use host::*;
use instance::*;
use limits::*;
use outcome::*;

use super::events::{LOG_LINES_DROPPED, RETRYING};
use super::{Expiration, Operator, OperatorStopped, Outcome, Processed, Switch};
use crate::config::{OperatorConfig, OperatorLimits, RetryPolicy, WasiGrant};
use crate::log_rate::{self, Admitted, LogRate};
use crate::record::SourceRecord;
use crate::state::{Expired, Transaction};
use anyhow::{Context, Result, anyhow, bail};
use lift::{GuestOutputs, GuestReason, GuestResult, LiftBounds};
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use wasmtime::component::types::ComponentItem;
use wasmtime::component::{
    Component, ComponentExportIndex, ComponentNamedList, Func, HasSelf, Lift, Linker, LinkerInstance, Lower,
    ResourceType, TypedFunc,
};
use wasmtime::{AsContextMut, Engine, ResourceLimiter, Store, StoreContextMut};

use bindings::sluice::operator::{log, state, types};
use bindings::{InputRecord, Operator as Bindings, OperatorPre};
