//! What a batch emits — outputs and dead letters — gathered, then sent at once as part
//! of the partition's outputs, with the traps it warns about.

use super::events::NULL_KEY_REFUSED;
use crate::log_rate::{self, Admitted, LogRate};
use crate::operator::{Outcome, Output};
use crate::record::{DeadLetter, DeadLetterKind, Origin};
use crate::sink::PartitionOutputs;
use crate::stats::{DeadLetters, PartitionStats};
use anyhow::Result;
use std::sync::atomic::Ordering;

/// What a batch (or an idle partition's expiries) emits, gathered to be sent at
/// once: outputs, and dead letters.
pub(super) struct Emitted {
    /// The operator build that gave all it holds (with a canary, what each build gives
    /// is sent on its own).
    version: String,
    outputs: Vec<(Origin, Output)>,
    dead: Vec<DeadLetter>,
    /// The line sinks' buffer.
    lines: Vec<u8>,
    /// The partition's warnings of trapped records: every one has its dead letter, so
    /// past a few a second they are only counted.
    traps: LogRate,
}

/// Trapped records a partition warns about per second (the rest are counted).
const TRAP_WARNINGS_PER_S: u64 = 10;

impl Default for Emitted {
    fn default() -> Self {
        let traps = LogRate::new(TRAP_WARNINGS_PER_S, u64::MAX);
        Emitted { version: String::new(), outputs: Vec::new(), dead: Vec::new(), lines: Vec::new(), traps }
    }
}

/// What an input (or expired entry) gives: its outputs, or its dead letter.
pub enum Emission {
    /// The operator emitted these.
    Outputs(Vec<Output>),
    /// It failed, or was refused, into the dead letters.
    DeadLetter(DeadLetter),
}

impl Emission {
    /// What `outcome` of the input (or expired entry) with `key` and `value` at `origin`
    /// gives.
    pub fn of(origin: Origin, key: &[u8], value: &[u8], outcome: Outcome) -> Self {
        let (kind, reason, attempts) = match outcome {
            Outcome::Emitted(outputs) => return Emission::Outputs(outputs),
            Outcome::Rejected(reason) => (DeadLetterKind::Rejected, reason, None),
            Outcome::Late(reason) => (DeadLetterKind::Late, reason, None),
            Outcome::NullKey => (DeadLetterKind::NullKey, NULL_KEY_REFUSED.to_string(), None),
            Outcome::Trapped { reason, attempts } => (DeadLetterKind::Trapped, reason, Some(attempts)),
        };
        let (key, value) = (key.to_vec(), value.to_vec());
        Emission::DeadLetter(DeadLetter { origin, kind, key, value, topic: None, reason, attempts })
    }
}

impl Emitted {
    /// Adds what became of the input (or expired entry) with `key` and `value` at
    /// `origin`; a trap is logged, within [`TRAP_WARNINGS_PER_S`].
    pub(super) fn outcome(&mut self, origin: Origin, key: &[u8], value: &[u8], outcome: Outcome) {
        if let Outcome::Trapped { reason, attempts } = &outcome {
            let (partition, offset) = (origin.partition, origin.offset);
            match self.traps.admit(0) {
                Admitted::Yes { dropped } => {
                    if dropped > 0 {
                        tracing::warn!(partition, "{dropped} more records trapped; their dead letters say why");
                    }
                    // The first line: the rest is wasmtime's account with the guest's
                    // backtrace, which the dead letter keeps.
                    let first_line = log_rate::one_line(reason.lines().next().unwrap_or_default()).into_owned();
                    tracing::warn!(partition, offset, cause = ?origin.cause, attempts, "operator trapped: {first_line}");
                }
                Admitted::No { .. } => {}
            }
        }
        match Emission::of(origin, key, value, outcome) {
            Emission::Outputs(outputs) => self.outputs.extend(outputs.into_iter().map(|o| (origin, o))),
            Emission::DeadLetter(dead) => self.dead.push(dead),
        }
    }

    /// Whether what `version` gives next can join what it holds: it holds nothing, or
    /// what that build gave. Otherwise it is to be sent first.
    pub(super) fn takes(&self, version: &str) -> bool {
        (self.outputs.is_empty() && self.dead.is_empty()) || self.version == version
    }

    /// What it gathers from now on is what `version` gives.
    pub(super) fn of_version(&mut self, version: &str) {
        if self.version != version {
            self.version = version.to_string();
        }
    }

    /// Sends the outputs, all of its version, as part of the partition's `outputs`,
    /// then the dead letters (those of outputs Kafka refused included), counts them,
    /// and empties itself.
    pub(super) fn send(&mut self, stats: &PartitionStats, outputs: &mut PartitionOutputs) -> Result<()> {
        let version = self.version.as_str();
        outputs.send(&self.outputs, version, &mut self.lines, &mut self.dead)?;
        stats.outputs.fetch_add(self.outputs.len() as u64, Ordering::Relaxed);
        outputs.send_dead_letters(&self.dead, version, &mut self.lines)?;
        let mut counts = DeadLetters::default();
        self.dead.iter().for_each(|dead| counts.count(dead.kind));
        stats.count_dead(version, counts);
        self.outputs.clear();
        self.dead.clear();
        Ok(())
    }
}
