//! Running operator code against a partition's state.
//!
//! This module owns the boundary between the host and operator logic: the
//! [`Operator`] trait the [worker](crate::worker) drives, the [`Outcome`] of one
//! record, and the sandboxed WebAssembly runtime in [`wasm`]. It does not decide when
//! state commits or where outputs go.

pub mod wasm;

use crate::source::SourceRecord;
use crate::state::Transaction;
use anyhow::Result;

/// One record an operator emitted.
#[derive(Debug, Clone, PartialEq)]
pub struct Output {
    /// The output key.
    pub key: Vec<u8>,
    /// The output payload.
    pub value: Vec<u8>,
    /// Destination topic; `None` is the job's sink.
    pub topic: Option<String>,
}

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
/// The worker brackets every call with [`Transaction::begin_record`] and
/// [`Transaction::end_record`], keeping the record's writes only on
/// [`Outcome::Emitted`].
pub trait Operator: Send {
    /// Processes `record`, reading and writing state for its key. An `Err` is a host
    /// failure (the state store could not be read) and stops the worker.
    fn process(&mut self, record: &SourceRecord) -> Result<Outcome>;

    /// The partition state this operator reads and writes.
    fn state(&mut self) -> &mut Transaction;

    /// Which build of the operator this is (`name@checksum` for a component): every
    /// output and dead letter it produces, and every checkpoint of its state, says so.
    fn version(&self) -> &str;
}
