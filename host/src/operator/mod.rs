//! Running operator code against a partition's state.
//!
//! This module owns the boundary between the host and operator logic: the
//! [`Operator`] trait the [worker](crate::worker) drives and the [`Instantiate`] it gets
//! one from, the [`Outcome`] of one
//! record or [`Expiration`] of one state entry, and the versions an operator goes
//! through:
//!
//! - [`wasm`]: the sandboxed WebAssembly runtime: one partition's instance of a
//!   version (and of a second version paired with it, taking the keys it is told),
//!   which never chooses what runs.
//! - [`versions`]: which version processes a record — the active version, its canary
//!   and the shadow this host runs, and each partition's switches of versions, recorded
//!   so that records processed again are processed with the version that first
//!   processed them.
//! - [`registry`]: the deployed versions and their history, kept in the job's store.
//! - [`deploy`]: validating a new version, recording it and switching this host to it.
//!
//! It does not decide when state commits or where outputs go.

pub mod deploy;
pub(crate) mod events;
pub mod registry;
pub mod versions;
pub mod wasm;

pub use crate::record::Output;
use crate::record::{Cause, Origin, SourceRecord};
use crate::state::{Expired, Transaction};
use anyhow::Result;
use std::sync::Arc;
use std::time::Duration;
use versions::switches::{RecordedSwitches, SwitchLog};

/// What became of one record.
#[derive(Debug)]
pub enum Outcome {
    /// The operator returned normally; its state writes stand.
    Emitted(Vec<Output>),
    /// The operator returned an error for this record (a poison record, typically).
    Rejected(String),
    /// The operator returned an error for this record after marking it late (it came
    /// after the windows it belongs to closed: `timers.mark-late`).
    Late(String),
    /// The call trapped, ran past its deadline, hit its memory cap or passed one of
    /// the operator's limits; the record's writes are discarded. An instance that
    /// trapped was replaced by a fresh one (one whose outputs passed a limit is kept:
    /// it returned normally).
    Trapped {
        /// Why, naming the limit where one was passed.
        reason: String,
        /// The calls it got (see [`RetryPolicy`](crate::config::RetryPolicy)), the
        /// last of which failed like this.
        attempts: u32,
    },
    /// The record had no key, and `[source] null_keys` sends such records to the dead
    /// letters: the operator was not called.
    NullKey,
}

impl Outcome {
    /// What it makes the host hold until it is sent: its outputs' bytes (see
    /// [`Output::bytes`]), or its reason's.
    pub fn bytes(&self) -> usize {
        match self {
            Outcome::Emitted(outputs) => outputs.iter().map(Output::bytes).sum(),
            Outcome::Rejected(reason) | Outcome::Late(reason) | Outcome::Trapped { reason, .. } => reason.len(),
            Outcome::NullKey => 0,
        }
    }
}

/// What an operator made of a state entry that expired, or of a timer that fired (an
/// entry too). The entry is removed whatever the outcome; an operator not told of
/// expiries makes none.
#[derive(Debug)]
pub struct Expiration {
    /// The entry, as it was.
    pub entry: Expired,
    /// The offset of the record the partition processes next: the expiry came between
    /// it and the one before.
    pub offset: u64,
    /// What the operator's `expired` (or `fired`) returned; `Emitted` outputs are
    /// marked as the expiry's (or the timer's).
    pub outcome: Outcome,
    /// Whether the [paired version](Operator::paired_version) gave it.
    pub by_paired: bool,
}

impl Expiration {
    /// What its outputs and dead letter say caused them.
    pub fn origin(&self, partition: u32) -> Origin {
        let cause = if self.entry.timer().is_some() { Cause::Timer } else { Cause::Expiry };
        Origin { partition, offset: self.offset, cause }
    }
}

/// The operator, not the host, stopped its partition: a record kept failing in strict
/// mode (`[operator.retry] strict`), or a fresh instance could not start after a trap.
/// A worker that fails with this (anywhere in its error's chain) stops its partition
/// alone, and the others go on; any other failure — the state store, the sink — is the
/// host's, and stops it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct OperatorStopped(pub String);

/// What became of a batch of records, and of the entries that expired meanwhile.
#[derive(Debug, Default)]
pub struct Processed {
    /// One per record, in order.
    pub outcomes: Vec<Outcome>,
    /// In the order they expired; each before the record at its offset.
    pub expirations: Vec<Expiration>,
    /// Whether the [paired version](Operator::paired_version) gave each outcome, in
    /// order; empty when none is paired (every outcome is [`Operator::version`]'s).
    pub by_paired: Vec<bool>,
}

impl Processed {
    /// `outcomes`, with no expirations, all [`Operator::version`]'s.
    pub fn from_outcomes(outcomes: Vec<Outcome>) -> Self {
        Processed { outcomes, ..Processed::default() }
    }
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
    /// outcomes in the same order, with the expirations their clock brought (every
    /// entry due before a record expires before it). A batch that passes a per-batch
    /// bound (`[operator.limits] output_bytes_per_batch`, `time_per_batch_ms`, `[state]
    /// commit_dirty_mib`, `[ttl] sweep_limit` expiries) ends there — after a record, or
    /// between two expiries before one: the outcomes are then those of a prefix of
    /// `records`, possibly empty, and the caller commits as it sees fit and hands the
    /// rest over again as the next batch, which goes on where this one ended. An `Err`
    /// is a host failure, as for [`process`](Operator::process); the records' writes
    /// are then never committed.
    fn process_batch(&mut self, records: &[SourceRecord]) -> Result<Processed> {
        Ok(Processed::from_outcomes(process_each(self, records)?))
    }

    /// Expires the entries due at the partition's clock without a record (an idle
    /// partition in processing time): `offset` is the next record's. It ends at the
    /// per-batch bounds as [`process_batch`](Operator::process_batch) does; what is
    /// still due waits for the next call.
    fn expire(&mut self, offset: u64) -> Result<Vec<Expiration>> {
        let _ = offset;
        while self.state().expire_next()?.is_some() {}
        Ok(Vec::new())
    }

    /// Ends the next [`process_batch`](Operator::process_batch) or
    /// [`expire`](Operator::expire) call by `until` too (between two records or
    /// expiries; a call in progress finishes), even before it did anything: for a
    /// shadow, which must not cost the live partition more than a share of its time.
    fn bound_next_batch(&mut self, until: std::time::Instant) {
        let _ = until;
    }

    /// The partition state this operator reads and writes.
    fn state(&mut self) -> &mut Transaction;

    /// Which build of the operator this is (`name@digest` for a component): every
    /// output and dead letter it produces, and every checkpoint of its state, says so.
    fn version(&self) -> &str;

    /// The second build that processes some keys' records, expiries and timers beside
    /// [`version`](Operator::version) (a canary), if one does; [`Processed::by_paired`]
    /// and [`Expiration::by_paired`] say which outcomes are its.
    fn paired_version(&self) -> Option<&str> {
        None
    }

    /// Switches to the version that processes the record at `offset` on, if it runs
    /// another, keeping the partition's state: while the partition replays records, the
    /// version that first processed that one ([`versions::switches`]), else the version
    /// deployed since this operator last looked. The worker calls it only between
    /// batches, so each record is processed by exactly one version. An operator that
    /// runs one version only never switches.
    fn follow_deploys(&mut self, offset: u64) -> Result<Option<Switch>> {
        let _ = offset;
        Ok(None)
    }

    /// Waits until every switch of versions made below `next_offset` is recorded in the
    /// switch log: the worker commits up to `next_offset` only then. Fails when one
    /// could not be ([`versions::switches::SwitchUnrecorded`]); an operator that runs one version
    /// only has none.
    fn switches_recorded(&mut self, next_offset: u64) -> Result<()> {
        let _ = next_offset;
        Ok(())
    }

    /// The first offset after `offset` whose record a replay may process with another
    /// version than the record at `offset`'s: a batch starting at `offset` ends before
    /// it. `None` when the partition does not replay.
    fn next_switch(&self, offset: u64) -> Option<u64> {
        let _ = offset;
        None
    }

    /// Follows `partition`'s switches in `log` from now on — `recorded`, as
    /// [`SwitchLog::read`] read them before the partition started — its state resuming
    /// at offset `resume_at` and its outputs committed up to `covered`: replays the
    /// records before both with the versions that first processed them, then records
    /// each switch. An operator that runs one version only has none to follow.
    fn follow_switches(
        &mut self,
        (log, recorded): (&Arc<SwitchLog>, RecordedSwitches),
        partition: u32,
        (resume_at, covered): (u64, u64),
    ) -> Result<()> {
        let _ = (log, recorded, partition, resume_at, covered);
        Ok(())
    }
}

/// Where each partition's [`Operator`] comes from: the one way a
/// [worker](crate::worker) gets one, so it runs whatever stands behind this —
/// [`versions::ActiveVersion`] in a job, a fake in the worker's tests.
pub trait Instantiate: Send + Sync {
    /// An operator for `partition` over `txn`, running the active version, its `init`
    /// called.
    fn instantiate(&self, partition: u32, txn: Transaction) -> Result<Box<dyn Operator>>;
}

/// Where each partition's shadow comes from: the version a shadow deploy runs beside
/// the live one on the same records, its outputs compared and never sent, its writes
/// never committed ([`deploy`]). A worker looks at it between batches, as at the active
/// version; [`versions::ShadowVersion`] in a job.
pub trait Shadows: Send + Sync {
    /// Changes with every start and stop of a shadow.
    fn generation(&self) -> u64;

    /// The shadow's version, if one runs.
    fn version(&self) -> Option<String>;

    /// An instance of the shadow version for `partition` over `txn` (a
    /// [detached transaction](Transaction::detached)), its `init` called; `None` when no
    /// shadow runs.
    fn instantiate(&self, partition: u32, txn: Transaction) -> Result<Option<Box<dyn Operator>>>;
}

/// A canary's share of a partition's keys, in basis points (1/10,000): 500 is 5%
/// ([`versions::in_canary`] says which keys).
pub type BasisPoints = u32;

/// A canary's share as people write it — `5%`, `0.5%`, `25` (percent) — in basis
/// points; an error names what is wrong with it.
pub fn parse_share(text: &str) -> Result<BasisPoints> {
    let number = text.trim().trim_end_matches('%');
    let percent: f64 =
        number.parse().map_err(|_| anyhow::anyhow!("canary share {text:?}: expected a percentage such as 5%"))?;
    if !(0.01..=100.0).contains(&percent) {
        anyhow::bail!("canary share {text:?}: a canary takes from 0.01% to 100% of the keys");
    }
    Ok((percent * 100.0).round() as BasisPoints)
}

/// [`Operator::process_batch`] one call of [`Operator::process`] per record.
pub fn process_each<O: Operator + ?Sized>(operator: &mut O, records: &[SourceRecord]) -> Result<Vec<Outcome>> {
    let mut outcomes = Vec::with_capacity(records.len());
    for record in records {
        operator.state().begin_record(record)?;
        outcomes.push(process_scoped(operator, record)?);
    }
    Ok(outcomes)
}

/// [`Operator::process`] of `record` in the record scope the caller opened, which it
/// closes: the record's writes are kept only if it emitted.
pub fn process_scoped<O: Operator + ?Sized>(operator: &mut O, record: &SourceRecord) -> Result<Outcome> {
    let outcome = operator.process(record).inspect_err(|_| operator.state().end_record(false))?;
    operator.state().end_record(matches!(outcome, Outcome::Emitted(_)));
    Ok(outcome)
}

/// The version of a build of operator `name` new to its registry: `name@` and the
/// SHA-256 of its component in 64 hex digits. Outputs, dead letters, checkpoint
/// manifests and the registry all name builds by a version. A build the registry
/// recorded before versions were named by SHA-256 keeps its older name there, `name@`
/// and the component's CRC-64 in 16 hex digits ([`checksum`](crate::checksum)): see
/// [`names_build`] and [`Registry::version_of`](registry::Registry::version_of).
pub fn version_of(name: &str, component: &[u8]) -> String {
    format!("{name}@{}", sha256_hex(component))
}

/// Whether `version` names the build `component`, by the digest it holds: 64 hex digits
/// are a SHA-256, 16 the CRC-64 of a version named before SHA-256. Any other version
/// names no build. A CRC-64 is no proof against a build made to match it, so a
/// registry takes a CRC-64 name only for the bytes stored under it.
pub fn names_build(version: &str, component: &[u8]) -> bool {
    match digest_of(version) {
        digest if digest.len() == SHA256_DIGITS => sha256_hex(component) == digest,
        digest if digest.len() == CRC64_DIGITS => crate::checksum::of_bytes(component) == digest,
        _ => false,
    }
}

/// The operator name in `version` (`name@digest`).
pub fn name_of(version: &str) -> &str {
    version.rsplit_once('@').map_or(version, |(name, _)| name)
}

/// The digest in `version` (`name@digest`): its component's object name in a registry.
pub fn digest_of(version: &str) -> &str {
    version.rsplit_once('@').map_or("", |(_, digest)| digest)
}

/// The hex digits of a SHA-256 version's digest.
const SHA256_DIGITS: usize = 64;
/// The hex digits of a CRC-64 version's digest (versions named before SHA-256).
const CRC64_DIGITS: usize = 16;

/// The SHA-256 of `bytes` in 64 hex digits.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    format!("{:x}", sha2::Sha256::digest(bytes))
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
    /// Whether a replay switched where the first run of its records had.
    pub replayed: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_is_read_as_people_write_it_and_a_wrong_one_is_named() {
        assert_eq!(
            [parse_share("5%").unwrap(), parse_share("0.5%").unwrap(), parse_share(" 25 ").unwrap()],
            [500, 50, 2500]
        );
        assert_eq!(parse_share("100%").unwrap(), 10_000);
        for wrong in ["0", "101%", "five", "-3%"] {
            let err = parse_share(wrong).unwrap_err().to_string();
            assert!(err.contains(&format!("canary share {wrong:?}")), "{err}");
        }
    }
}
