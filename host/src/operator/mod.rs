//! Running operator code against a partition's state.
//!
//! This module owns the boundary between the host and operator logic: the
//! [`Operator`] trait the [worker](crate::worker) drives, the [`Outcome`] of one
//! record, and the versions an operator goes through:
//!
//! - [`wasm`]: the sandboxed WebAssembly runtime, and the active version each
//!   partition's instance follows.
//! - [`registry`]: the deployed versions and their history, kept in the job's store.
//! - [`deploy`]: validating a new version, recording it and switching this host to it.
//!
//! It does not decide when state commits or where outputs go.

pub mod deploy;
pub mod registry;
pub mod wasm;

pub use crate::record::Output;
use crate::record::SourceRecord;
use crate::state::Transaction;
use anyhow::Result;
use std::time::Duration;

/// What became of one record.
#[derive(Debug)]
pub enum Outcome {
    /// The operator returned normally; its state writes stand.
    Emitted(Vec<Output>),
    /// The operator returned an error for this record (a poison record, typically).
    Rejected(String),
    /// The call trapped, ran past its deadline or hit its memory cap. The instance
    /// was replaced by a fresh one; the record's writes are discarded.
    Trapped(String),
}

/// Operator logic bound to one partition's state.
///
/// The worker hands it a batch at a time ([`Operator::process_batch`]); every record
/// runs in its own record scope of the [`Transaction`] (between
/// [`Transaction::begin_record`] and [`Transaction::end_record`]), which keeps the
/// record's writes only on [`Outcome::Emitted`].
pub trait Operator: Send {
    /// Processes `record`, reading and writing state for its key, inside a record scope
    /// the caller opened. An `Err` is a host failure (the state store could not be
    /// read) and stops the worker.
    fn process(&mut self, record: &SourceRecord) -> Result<Outcome>;

    /// Processes `records` in order, each in its own record scope, and returns their
    /// outcomes in the same order. An `Err` is a host failure, as for
    /// [`process`](Operator::process); the records' writes are then never committed.
    fn process_batch(&mut self, records: &[SourceRecord]) -> Result<Vec<Outcome>> {
        process_each(self, records)
    }

    /// The partition state this operator reads and writes.
    fn state(&mut self) -> &mut Transaction;

    /// Which build of the operator this is (`name@checksum` for a component): every
    /// output and dead letter it produces, and every checkpoint of its state, says so.
    fn version(&self) -> &str;

    /// Switches to the version deployed since this operator last looked, if any,
    /// keeping the partition's state. The worker calls it only between batches, so
    /// each record is processed by exactly one version.
    fn follow_deploys(&mut self) -> Result<Option<Switch>>;
}

/// [`Operator::process_batch`] one call of [`Operator::process`] per record.
pub fn process_each<O: Operator + ?Sized>(operator: &mut O, records: &[SourceRecord]) -> Result<Vec<Outcome>> {
    let mut outcomes = Vec::with_capacity(records.len());
    for record in records {
        operator.state().begin_record(&record.key, record.timestamp_ms);
        let outcome = operator.process(record).inspect_err(|_| operator.state().end_record(false))?;
        operator.state().end_record(matches!(outcome, Outcome::Emitted(_)));
        outcomes.push(outcome);
    }
    Ok(outcomes)
}

/// The version of a build of operator `name`: `name@checksum` of its component. Outputs,
/// dead letters, checkpoint manifests and the registry all name builds this way.
pub fn version_of(name: &str, component: &[u8]) -> String {
    format!("{name}@{}", crate::checksum::of_bytes(component))
}

/// A partition's switch from one operator version to another.
#[derive(Debug, Clone, PartialEq)]
pub struct Switch {
    /// The version that ran before.
    pub from: String,
    /// The version switched to (or, when `refused`, tried).
    pub to: String,
    /// How long the partition stood still: instantiating the new version and its `init`.
    pub stall: Duration,
    /// Why the new version could not start on this partition, which keeps running
    /// `from`.
    pub refused: Option<String>,
}
