//! Running a version per partition: the [`ActiveVersion`] a host follows, and the
//! [`WasmInstance`] that calls a partition's records into it, replaces it after a trap
//! and switches versions between batches.

use super::*;
use crate::operator::Instantiate;

/// The version every partition of this host runs: set by a deploy, followed by each
/// partition's [`WasmInstance`] at its next batch boundary.
pub struct ActiveVersion {
    /// Increases with every activation, so an instance sees a change with one load.
    generation: AtomicU64,
    pub(super) current: Mutex<Arc<WasmOperator>>,
}

impl ActiveVersion {
    /// `operator` is active.
    pub fn new(operator: Arc<WasmOperator>) -> Arc<Self> {
        Arc::new(ActiveVersion { generation: AtomicU64::new(0), current: Mutex::new(operator) })
    }

    /// The active version and its generation.
    pub fn get(&self) -> (u64, Arc<WasmOperator>) {
        let current = crate::lock(&self.current);
        (self.generation.load(Ordering::Acquire), current.clone())
    }

    /// The generation of the active version: it changes with every activation.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Makes `operator` the active version.
    pub fn activate(&self, operator: Arc<WasmOperator>) {
        let mut current = crate::lock(&self.current);
        *current = operator;
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Instantiates the active version for `partition` over `txn` and calls its `init`.
    pub fn instantiate(self: &Arc<Self>, partition: u32, txn: Transaction) -> Result<WasmInstance> {
        let (generation, operator) = self.get();
        let live = operator.start(operator.context(partition, txn)).map_err(|(e, _)| e)?;
        Ok(WasmInstance {
            operator,
            active: self.clone(),
            generation: Some(generation),
            switches: None,
            live: Some(live),
            replaced: 0,
        })
    }
}

/// How a worker instantiates the active version, not knowing it is WebAssembly.
impl Instantiate for Arc<ActiveVersion> {
    fn instantiate(&self, partition: u32, txn: Transaction) -> Result<Box<dyn Operator>> {
        Ok(Box::new(ActiveVersion::instantiate(self, partition, txn)?))
    }
}

/// One partition's instance of the [active version](ActiveVersion).
pub struct WasmInstance {
    pub(super) operator: Arc<WasmOperator>,
    pub(super) active: Arc<ActiveVersion>,
    /// The generation of the active version this instance last followed; `None` once
    /// it must look again whatever the generation (its replay ended, its switches are
    /// to be recorded).
    generation: Option<u64>,
    /// Its partition's switches of versions: those it replays, those it records.
    pub(super) switches: Option<PartitionSwitches>,
    /// Always `Some` between calls; taken only while the instance is replaced.
    pub(super) live: Option<Live>,
    /// How many times a trap replaced the instance.
    pub(super) replaced: u64,
}

/// A live instance: its store (the partition's state and the limits' accounting inside)
/// and its exports.
pub(super) struct Live {
    pub(super) store: Store<HostCtx>,
    pub(super) exports: Exports,
}

/// How a call into the guest ended, when the host did not fail.
pub(super) struct Called<R> {
    /// What it returned, or its trap.
    pub(super) result: wasmtime::Result<R>,
    /// Whether it ended inside a record (a `process-batch` that trapped or returned
    /// before finishing its inputs).
    mid_record: bool,
}

impl Live {
    /// Calls `func` — one of [`Exports`], whose signature is `P -> R` — with `params`,
    /// inside a record scope the caller opened when `in_record` (every call but
    /// `init`'s): the last call forgotten, the deadline armed, the lift bounds in
    /// force. An `Err` is a failure of the host itself (the state store), which the call
    /// trapped to unwind; the record scope's writes are then dropped.
    pub(super) fn call<P, R>(&mut self, func: Func, params: P, in_record: bool) -> Result<wasmtime::Result<R>>
    where
        P: ComponentNamedList + Lower,
        R: ComponentNamedList + Lift,
    {
        self.call_in_record(func, params, in_record).map(|called| called.result)
    }

    /// [`call`](Live::call), also saying whether it ended inside a record.
    fn call_in_record<P, R>(&mut self, func: Func, params: P, in_record: bool) -> Result<Called<R>>
    where
        P: ComponentNamedList + Lower,
        R: ComponentNamedList + Lift,
    {
        let ctx = self.store.data_mut();
        ctx.forget_last_call();
        ctx.in_record = in_record;
        let bounds = ctx.lift_bounds;
        arm_deadline(&mut self.store);
        // SAFETY: every export in `Exports` was checked to have the signature its call
        // names, when the instance was made (`WasmOperator::instantiate`).
        let typed = unsafe { TypedFunc::<P, R>::new_unchecked(func) };
        let result = lift::with_bounds(bounds, || typed.call(&mut self.store, params));
        let ctx = self.store.data_mut();
        let mid_record = std::mem::replace(&mut ctx.in_record, false);
        if let Some(error) = ctx.host_error.take() {
            ctx.txn.end_record(false);
            return Err(error);
        }
        Ok(Called { result, mid_record })
    }
}

impl WasmInstance {
    pub(super) fn live(&mut self) -> &mut Live {
        self.live.as_mut().expect("instance is live between calls")
    }

    pub(super) fn ctx(&mut self) -> &mut HostCtx {
        self.live().store.data_mut()
    }

    /// Whether `record`, whose `attempt`th call trapped for `reason`, gets another
    /// call: then it has waited the retry policy's backoff, and `attempt` counts the
    /// call to come.
    pub(super) fn retry(&self, attempt: &mut u32, record: &SourceRecord, reason: &str) -> bool {
        let policy = &self.operator.limits.retry;
        if *attempt >= policy.attempts {
            return false;
        }
        *attempt += 1;
        let wait = policy.backoff_before(*attempt);
        let (partition, offset) = (record.partition, record.offset);
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

    /// Says why the last call trapped and replaces the instance: a trapped instance may
    /// hold broken invariants in its memory. A fresh instance that fails to start is
    /// tried again as the retry policy says; an `Err` is the last attempt's failure.
    fn replace_after(&mut self, trap: wasmtime::Error) -> Result<String> {
        self.replaced += 1;
        let live = self.live.take().expect("instance is live between calls");
        let mut ctx = live.store.into_data();
        let reason = describe_trap(trap, &self.operator.limits, &mut ctx);
        let (operator, mut attempt) = (self.operator.clone(), 1);
        loop {
            match operator.start(ctx) {
                Ok(live) => {
                    self.live = Some(live);
                    return Ok(reason);
                }
                Err((error, back)) if attempt < operator.limits.retry.attempts => {
                    attempt += 1;
                    let wait = operator.limits.retry.backoff_before(attempt);
                    tracing::warn!("a fresh instance failed to start; {RETRYING} in {wait:?}: {error:#}");
                    std::thread::sleep(wait);
                    ctx = back;
                }
                Err((error, _)) => {
                    let trapped = reason.lines().next().unwrap_or_default();
                    return Err(anyhow::Error::new(OperatorStopped(format!(
                        "replacing an instance that trapped ({trapped}): a fresh one failed to start {attempt} time(s): \
                         {error:#}"
                    ))));
                }
            }
        }
    }

    /// Expires the entries due before the record at `offset`, calling the component's
    /// `expired` for each when it exports it, until none is due or the batch is spent
    /// (after it did something); returns whether none is due.
    fn expire_before(&mut self, offset: u64, expirations: &mut Vec<Expiration>) -> Result<bool> {
        let told = self.live().exports.expired.is_some();
        loop {
            let limits = &self.operator.limits.per_call;
            let ctx = self.live.as_mut().expect("instance is live between calls").store.data_mut();
            if !ctx.txn.due() {
                return Ok(true);
            }
            if ctx.budget.started() && ctx.budget.is_spent(limits, &ctx.txn) {
                return Ok(false);
            }
            let Some(entry) = ctx.txn.expire_next()? else { return Ok(true) };
            ctx.budget.expiries += 1;
            if told {
                let outcome = self.call_expired(&entry)?;
                let bytes = entry.key.len() + entry.name.len() + entry.value.len() + outcome.bytes();
                let budget = &mut self.ctx().budget;
                budget.bytes = budget.bytes.saturating_add(bytes);
                expirations.push(Expiration { entry, offset, outcome });
            }
        }
    }

    /// Calls the component's `expired` for `entry`, in a record scope of its key: the
    /// call's writes stand only if it returns outputs. An `Err` is a host failure.
    fn call_expired(&mut self, entry: &Expired) -> Result<Outcome> {
        let live = self.live();
        let expired = live.exports.expired.expect("called only when the component exports it");
        live.store.data_mut().txn.scope(&entry.key);
        let params = (entry.key.as_slice(), entry.name.as_str(), entry.value.as_slice(), entry.expired_at_ms);
        let outcome = self.call_for_outcome::<ExpiredParams<'_>>(expired, params)?;
        self.state().end_record(matches!(outcome, Outcome::Emitted(_)));
        Ok(outcome)
    }

    /// Calls `func` — an export that returns one record's result, `P -> ProcessResults`
    /// — with `params` in the record scope the caller opened: the record's outcome, a
    /// trap replacing the instance. An `Err` is a host failure.
    fn call_for_outcome<P: ComponentNamedList + Lower>(&mut self, func: Func, params: P) -> Result<Outcome> {
        match self.live().call::<P, ProcessResults>(func, params, true)? {
            Ok((result,)) => Ok(outcome_of(result, &self.operator.limits.per_call)),
            Err(trap) => Ok(Outcome::Trapped { reason: self.replace_after(trap)?, attempts: 1 }),
        }
    }

    /// Runs `run`, records of one key scope after another, in one `process-batch` call,
    /// its first record's clock observed, its expiries done and its scope open; appends
    /// the outcomes of the records it finished to `outcomes`. Returns how the next run
    /// starts: whether its first record runs alone (this call trapped before finishing
    /// one, or a retry is due), and the attempt it is on.
    fn call_batch(&mut self, run: &[SourceRecord], attempt: &mut u32, outcomes: &mut Vec<Outcome>) -> Result<bool> {
        let told = self.live().exports.expired.is_some();
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
        let Called { result, mid_record } = called?;
        if finished > 0 {
            *attempt = 1;
        }
        if !mid_record {
            // Every input finished (or the call was cut between two); a trap after the
            // last `finish` still poisons the instance.
            if let Err(trap) = result {
                let reason = self.replace_after(trap)?;
                if !cut {
                    tracing::warn!("operator trapped after finishing its batch: {reason}");
                }
            }
            return Ok(false);
        }
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
        if self.retry(attempt, &run[finished], &reason) {
            return Ok(true);
        }
        let outcome = Outcome::Trapped { reason, attempts: *attempt };
        self.ctx().budget.add_record(&outcome);
        outcomes.push(outcome);
        *attempt = 1;
        Ok(false)
    }

    /// Runs `record`, its clock observed, its expiries done and its scope open, in a
    /// call of `process` of its own (a component without `process-batch`), or again
    /// after a trap as the retry policy says; appends its outcome unless it gets
    /// another call.
    fn call_alone(&mut self, record: &SourceRecord, attempt: &mut u32, outcomes: &mut Vec<Outcome>) -> Result<()> {
        let replaced = self.replaced;
        let outcome = crate::operator::process_scoped(self, record)?;
        // A trap, not outputs past a limit: the instance is a fresh one.
        if let Outcome::Trapped { reason, .. } = &outcome
            && self.replaced != replaced
        {
            if self.retry(attempt, record, reason) {
                return Ok(());
            }
            let reason = reason.clone();
            return self.finish_alone(Outcome::Trapped { reason, attempts: std::mem::replace(attempt, 1) }, outcomes);
        }
        self.finish_alone(outcome, outcomes)
    }

    fn finish_alone(&mut self, outcome: Outcome, outcomes: &mut Vec<Outcome>) -> Result<()> {
        self.ctx().budget.add_record(&outcome);
        outcomes.push(outcome);
        Ok(())
    }
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

/// `record`'s headers as the guest receives them, borrowing their bytes.
pub(super) fn headers(record: &SourceRecord) -> Vec<types::Header<'_>> {
    record.headers.iter().map(|(key, value)| types::Header { key, value }).collect()
}

/// `record` with its `headers` as the guest receives it, borrowing its bytes.
fn input_record<'a>(record: &'a SourceRecord, headers: &'a [types::Header<'a>]) -> InputRecord<'a> {
    InputRecord {
        key: &record.key,
        value: &record.value,
        timestamp_ms: record.timestamp_ms,
        partition: record.partition,
        offset: record.offset,
        headers,
    }
}

impl Operator for WasmInstance {
    fn process(&mut self, record: &SourceRecord) -> Result<Outcome> {
        let headers = headers(record);
        let process = self.live().exports.process;
        self.call_for_outcome::<ProcessParams<'_>>(process, (input_record(record, &headers),))
    }

    fn process_batch(&mut self, records: &[SourceRecord]) -> Result<Processed> {
        let told = self.live().exports.expired.is_some();
        let batched = self.live().exports.process_batch.is_some();
        self.ctx().budget = BatchBudget::new(&self.operator.limits.per_call);
        let mut processed = Processed::default();
        // The inputs of a call are copied into the guest's memory at once: a run takes
        // at most an eighth of the memory cap, however large a batch's records are.
        let call_bytes = self.operator.limits.memory_bytes / 8;
        // Whether the next record runs alone: its run trapped before finishing one.
        let mut alone = false;
        // The call the next record is on: a record that trapped runs again (alone, in
        // the fresh instance) as the retry policy says.
        let mut attempt = 1;
        // One call per run of records: a trap ends a run at the record it hit, and the
        // records after it make the next run, in a fresh instance; for an operator told
        // of expiries, an expiry ends a run before the record that makes it due. The
        // batch ends at its bounds (see `Operator::process_batch`).
        while let Some(rest) = records.get(processed.outcomes.len()..).filter(|rest| !rest.is_empty()) {
            let first = &rest[0];
            let ctx = self.live.as_mut().expect("instance is live between calls").store.data_mut();
            if ctx.budget.started() && ctx.budget.is_spent(&self.operator.limits.per_call, &ctx.txn) {
                break;
            }
            ctx.txn.observe(first.offset, first.timestamp_ms);
            if !self.expire_before(first.offset, &mut processed.expirations)? {
                break;
            }
            self.state().scope(&first.key);
            if !batched {
                self.call_alone(first, &mut attempt, &mut processed.outcomes)?;
                continue;
            }
            let mut len = if std::mem::take(&mut alone) { 1 } else { run_length(rest, call_bytes) };
            if told {
                len = 1 + self.state().records_before_due(&rest[1..len]);
            }
            alone = self.call_batch(&rest[..len], &mut attempt, &mut processed.outcomes)?;
        }
        self.check_strict(records, &processed)?;
        Ok(processed)
    }

    fn expire(&mut self, offset: u64) -> Result<Vec<Expiration>> {
        self.ctx().budget = BatchBudget::new(&self.operator.limits.per_call);
        let mut expirations = Vec::new();
        self.expire_before(offset, &mut expirations)?;
        Ok(expirations)
    }

    fn state(&mut self) -> &mut Transaction {
        &mut self.ctx().txn
    }

    fn version(&self) -> &str {
        self.operator.version()
    }

    fn follow_deploys(&mut self, offset: u64) -> Result<Option<Switch>> {
        if let Some(first) = self.switches.as_ref().and_then(|s| s.replayed(offset)) {
            // After the replay, the active version is looked at whatever its generation.
            self.generation = None;
            if first.version == self.operator.version {
                return Ok(None);
            }
            return self.switch_to(first.clone(), true).map(Some);
        }
        if self.generation == Some(self.active.generation()) {
            return Ok(None);
        }
        let began = Instant::now();
        let (generation, next) = self.active.get();
        self.generation = Some(generation);
        if let Some(switches) = &mut self.switches
            && let Err(e) = switches.record(offset, &next.version)
        {
            // Unrecorded, a replay of what it would process could not repeat it.
            let reason = format!("recording the switch at offset {offset} failed: {e:#}");
            let (from, to) = (self.operator.version.clone(), next.version.clone());
            return Ok(Some(Switch { from, to, stall: began.elapsed(), refused: Some(reason), replayed: false }));
        }
        // Deployed and rolled back again before this partition looked.
        if next.version == self.operator.version {
            return Ok(None);
        }
        self.switch_to(next, false).map(Some)
    }

    fn next_switch(&self, offset: u64) -> Option<u64> {
        self.switches.as_ref()?.next_change(offset)
    }

    /// Replays, then records each switch beginning with the version it runs then. Fails
    /// when the log cannot be read or a version it names cannot be loaded.
    fn follow_switches(&mut self, log: &Arc<SwitchLog>, partition: u32, resume_at: u64, covered: u64) -> Result<()> {
        self.switches = Some(log.partition(partition, resume_at, covered, &self.operator)?);
        self.generation = None;
        Ok(())
    }
}

impl WasmInstance {
    /// Switches to `next`, keeping the partition's state; a version that fails to start
    /// leaves the old one running (`replayed`: a switch a replay repeats).
    fn switch_to(&mut self, next: Arc<WasmOperator>, replayed: bool) -> Result<Switch> {
        let began = Instant::now();
        let from = self.operator.version.clone();
        let ctx = self.live.take().expect("instance is live between calls").store.into_data();
        let to = next.version.clone();
        let refused = match next.start(ctx) {
            Ok(live) => {
                self.live = Some(live);
                self.operator = next;
                None
            }
            // Validated before activation, so rare: keep running the old version here.
            Err((reason, ctx)) => {
                self.live = Some(self.operator.start(ctx).map_err(|(e, _)| e)?);
                Some(format!("{reason:#}"))
            }
        };
        Ok(Switch { from, to, stall: began.elapsed(), refused, replayed })
    }
}
