//! Running a batch of records through a partition's [`WasmInstance`]: each record
//! reached (the batch's bounds, its clock, the expiries due before it, its key's
//! scope), then called — in runs of records per `process-batch` call, or alone in a
//! `process` call — a trap ending a run at the record it hit, which is called again
//! as the retry policy says; in strict mode a record that still failed stops the
//! partition.
//!
//! It does not make calls itself ([`Live`] does), nor replace an instance after a trap
//! or expire entries (the instance's own steps).

use super::*;

impl WasmInstance {
    /// [`Operator::process_batch`]: reaches each record in turn
    /// ([`reach`](WasmInstance::reach): the bounds, its clock, its expiries, its scope)
    /// and calls it: in a run of records per `process-batch` call, or alone in a
    /// `process` call.
    pub(super) fn run_batch(&mut self, records: &[SourceRecord]) -> Result<Processed> {
        self.ctx().budget = self.budget();
        let mut processed = Processed::default();
        let mut next = NextCall { alone: false, attempt: 1 };
        // One call per run of records: a trap ends a run at the record it hit, and the
        // records after it make the next run, in a fresh instance; for an operator told
        // of expiries, an expiry ends a run before the record that makes it due. The
        // batch ends at its bounds (see `Operator::process_batch`).
        while let Some(rest) = records.get(processed.outcomes.len()..).filter(|rest| !rest.is_empty()) {
            if !self.reach(&rest[0], &mut processed.expirations)? {
                break;
            }
            // The version that takes the record (a paired one may be built otherwise).
            if self.live().exports.process_batch.is_some() {
                let run = self.next_run(rest, std::mem::take(&mut next.alone));
                self.call_batch(run, &mut next, &mut processed.outcomes)?;
            } else {
                self.call_alone(&rest[0], &mut next.attempt, &mut processed.outcomes)?;
            }
            // A run is one version's: its outcomes say which.
            if self.paired.is_some() {
                processed.by_paired.resize(processed.outcomes.len(), self.on_paired());
            }
        }
        self.check_strict(records, &processed)?;
        Ok(processed)
    }

    /// Whether the record at `offset` (or the callback due before it), whose `attempt`th
    /// call trapped for `reason`, gets another call: then it has waited the retry
    /// policy's backoff, and `attempt` counts the call to come.
    pub(super) fn retry(&mut self, attempt: &mut u32, offset: u64, reason: &str) -> bool {
        let partition = self.ctx().partition;
        let policy = &self.operator.limits.retry;
        if *attempt >= policy.attempts {
            return false;
        }
        *attempt += 1;
        let wait = policy.backoff_before(*attempt);
        let first_line = reason.lines().next().unwrap_or_default();
        tracing::info!(
            partition,
            offset,
            "operator trapped; {RETRYING} in {wait:?}, attempt {attempt} of {}: {first_line}",
            policy.attempts
        );
        std::thread::sleep(wait);
        true
    }

    /// In strict mode (`[operator.retry] strict`), the first record of `records` that
    /// failed by a trap or a limit after its attempts — or an expiry that did, in
    /// `processed` — stops the partition instead of going to the dead letters.
    fn check_strict(&self, records: &[SourceRecord], processed: &Processed) -> Result<()> {
        if !self.operator.limits.retry.strict {
            return Ok(());
        }
        let failed =
            records.iter().zip(&processed.outcomes).map(|(record, outcome)| (record.offset, "record", outcome));
        let expired = processed.expirations.iter().map(|e| (e.offset, "expiry before the record", &e.outcome));
        for (offset, what, outcome) in failed.chain(expired) {
            if let Outcome::Trapped { reason, attempts } = outcome {
                return Err(anyhow::Error::new(OperatorStopped(format!(
                    "the {what} at offset {offset} failed in {attempts} call(s), and [operator.retry] strict = true \
                     stops the partition rather than dead-letter it: {reason}"
                ))));
            }
        }
        Ok(())
    }

    /// Brings the batch to `record`, its next, unless the batch's bounds are spent:
    /// observes the record's clock, expires the entries due before it and opens its
    /// key's scope. Returns whether the batch goes on with it.
    fn reach(&mut self, record: &SourceRecord, expirations: &mut Vec<Expiration>) -> Result<bool> {
        let limits = &self.operator.limits.per_call;
        let ctx = self.live.as_mut().expect("instance is live between calls").store.data_mut();
        if ctx.budget.started() && ctx.budget.is_spent(limits, &ctx.txn) {
            return Ok(false);
        }
        ctx.txn.observe(record.offset, &record.key, record.timestamp_ms);
        if !self.expire_before(record.offset, expirations)? {
            return Ok(false);
        }
        self.route(&record.key);
        let ctx = self.ctx();
        ctx.txn.scope(&record.key);
        wasi::enter_moment(&mut ctx.wasi, &ctx.txn, record.offset, &record.key, "", record.timestamp_ms);
        Ok(true)
    }

    /// The records of `rest` the next `process-batch` call takes, its first reached:
    /// that one `alone`, or as many as an eighth of the memory cap holds (the inputs of
    /// a call are copied into the guest's memory at once, however large a batch's
    /// records are) — where either version is told of expiries, up to the record that
    /// makes entries due, which starts the next run.
    fn next_run<'r>(&mut self, rest: &'r [SourceRecord], alone: bool) -> &'r [SourceRecord] {
        if alone {
            return &rest[..1];
        }
        let mut len = run_length(rest, self.operator.limits.memory_bytes / 8);
        if self.told_any() {
            len = 1 + self.state().records_before_due(&rest[1..len]);
        }
        // A run goes to one version: it ends before a key the other one takes.
        if self.paired.is_some() {
            len = 1 + rest[1..len].iter().take_while(|r| self.paired_takes(&r.key) == self.on_paired()).count();
        }
        &rest[..len]
    }

    /// Runs `run`, records of one key scope after another, in one `process-batch` call,
    /// its first record reached; appends the outcomes of the records it finished to
    /// `outcomes`, and sets how the `next` call starts.
    fn call_batch(&mut self, run: &[SourceRecord], next: &mut NextCall, outcomes: &mut Vec<Outcome>) -> Result<()> {
        let RunEnd { finished, cut, called } = self.call_run(run, outcomes)?;
        if finished > 0 {
            next.attempt = 1;
        }
        let Called { result, mid_record } = called;
        next.alone = if mid_record {
            self.after_unfinished(run, finished, result, &mut next.attempt, outcomes)?
        } else {
            self.after_last_finish(result, cut)?;
            false
        };
        Ok(())
    }

    /// The `process-batch` call of `run` itself: the inputs handed over, the outcomes
    /// of those it finished appended to `outcomes`. An `Err` is a host failure.
    fn call_run(&mut self, run: &[SourceRecord], outcomes: &mut Vec<Outcome>) -> Result<RunEnd> {
        let told = self.told_any();
        let live = self.live();
        let process_batch = live.exports.process_batch.expect("called only when the component exports it");
        live.store.data_mut().batch.start(run, told);
        let headers: Vec<Vec<types::Header<'_>>> = run.iter().map(headers).collect();
        let inputs: Vec<InputRecord<'_>> = run.iter().zip(&headers).map(|(r, h)| input_record(r, h)).collect();
        let called = live.call_in_record::<BatchParams<'_>, ()>(process_batch, (&inputs,), true);
        let ctx = live.store.data_mut();
        let finished = ctx.batch.outcomes.len();
        outcomes.append(&mut ctx.batch.outcomes);
        let cut = ctx.batch.cut;
        ctx.batch.end();
        Ok(RunEnd { finished, cut, called: called? })
    }

    /// After a call that finished every input of its run (or was cut between two): a
    /// trap after the last `finish` still poisons the instance, which is replaced.
    fn after_last_finish(&mut self, result: wasmtime::Result<()>, cut: bool) -> Result<()> {
        if let Err(trap) = result {
            let reason = self.replace_after(trap)?;
            if !cut {
                tracing::warn!("operator trapped after finishing its batch: {reason}");
            }
        }
        Ok(())
    }

    /// After a call that ended inside the input after the `finished` first of `run`,
    /// returning `result`: drops that input's writes, replaces the instance if it
    /// trapped, and returns whether the input runs alone next (a call of its own, or a
    /// retry on `attempt`); else appends its failure to `outcomes`.
    fn after_unfinished(
        &mut self,
        run: &[SourceRecord],
        finished: usize,
        result: wasmtime::Result<()>,
        attempt: &mut u32,
        outcomes: &mut Vec<Outcome>,
    ) -> Result<bool> {
        // The input being processed when the call ended: its writes go.
        self.state().end_record(false);
        let reason = match result {
            Ok(()) => format!("`{PROCESS_BATCH}` returned before finishing this record"),
            Err(trap) => self.replace_after(trap)?,
        };
        if finished == 0 && run.len() > 1 {
            // Trapped before its first `finish`: perhaps by the run's inputs themselves
            // (copying them in, under the memory cap), not by this record. It gets a
            // call of its own.
            tracing::debug!("`{PROCESS_BATCH}` of {} records trapped before finishing one: {reason}", run.len());
            return Ok(true);
        }
        if self.retry(attempt, run[finished].offset, &reason) {
            return Ok(true);
        }
        self.add_outcome(Outcome::Trapped { reason, attempts: std::mem::replace(attempt, 1) }, outcomes);
        Ok(false)
    }

    /// Runs `record`, reached, in a call of `process` of its own (a component without
    /// `process-batch`), or again after a trap as the retry policy says; appends its
    /// outcome unless it gets another call.
    fn call_alone(&mut self, record: &SourceRecord, attempt: &mut u32, outcomes: &mut Vec<Outcome>) -> Result<()> {
        let replaced = self.replaced;
        let outcome = match crate::operator::process_scoped(self, record)? {
            // A trap, not outputs past a limit: the instance is a fresh one.
            Outcome::Trapped { reason, .. } if self.replaced != replaced => {
                if self.retry(attempt, record.offset, &reason) {
                    return Ok(());
                }
                Outcome::Trapped { reason, attempts: std::mem::replace(attempt, 1) }
            }
            outcome => outcome,
        };
        self.add_outcome(outcome, outcomes);
        Ok(())
    }

    /// Counts a finished record's `outcome` in the batch's budget and appends it to
    /// `outcomes`.
    fn add_outcome(&mut self, outcome: Outcome, outcomes: &mut Vec<Outcome>) {
        self.ctx().budget.add_record(&outcome);
        outcomes.push(outcome);
    }
}

/// How a batch's next call starts, carried from one call to the next.
struct NextCall {
    /// Whether its first record runs alone: the last run trapped before finishing
    /// one, or the record that ended it is retried.
    alone: bool,
    /// The call its first record is on: a record that trapped runs again (alone, in
    /// the fresh instance) as the retry policy says.
    attempt: u32,
}

/// How a `process-batch` call of a run ended, when the host did not fail.
struct RunEnd {
    /// How many of the run's inputs it finished.
    finished: usize,
    /// Whether `finish` cut it short ([`Batch::cut`]).
    cut: bool,
    /// What it returned, or its trap, and whether it ended inside an input.
    called: Called<()>,
}

/// How many of `records`, at least one, make a `process-batch` call whose inputs' keys
/// and values take at most `bytes`.
pub(super) fn run_length(records: &[SourceRecord], bytes: usize) -> usize {
    let mut total = 0;
    let within = records.iter().take_while(|record| {
        let headers: usize = record.headers.iter().map(|(key, value)| key.len() + value.len()).sum();
        total += record.key.len() + record.value.len() + headers;
        total <= bytes
    });
    within.count().max(1)
}
