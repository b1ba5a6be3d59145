//! Running a version per partition: the [`WasmInstance`] that calls a partition's
//! records into it, replaces it after a trap, hands the keys a [`KeyRoute`] names to the
//! instance of a second version paired with it, and switches versions between batches
//! when told to. Which versions run, which keys each takes and when they switch are the
//! [versions](crate::operator::versions)' to say; this carries it out. How a batch runs
//! through it is `batch`'s.

use super::*;

/// One partition's instance of a version, and of a second version paired with it while
/// the versions run one (a canary).
pub struct WasmInstance {
    pub(super) operator: Arc<WasmOperator>,
    /// Always `Some` between calls; taken only while the instance is replaced.
    pub(super) live: Option<Live>,
    /// How many times a trap replaced the instance.
    pub(super) replaced: u64,
    /// The second version's instance, while one is paired.
    pub(super) paired: Option<Paired>,
    /// Whether `operator` and `live` are the paired version's now, swapped in for a key
    /// it takes ([`route`](WasmInstance::route)); never between batches.
    on_paired: bool,
    /// When the next batch must end, if sooner than its own bounds say
    /// ([`Operator::bound_next_batch`]).
    next_bound: Option<Instant>,
}

/// Which keys the paired version takes: its records, expiries and timers. The versions
/// choose it (a canary's share of a hash of the key); it must answer the same for a key
/// all along, since a key's state is one version's to write.
pub type KeyRoute = Arc<dyn Fn(&[u8]) -> bool + Send + Sync>;

/// A partition's instance of a second version: the version, its live instance (the one
/// not swapped in holds a [detached](Transaction::detached) transaction, never used),
/// and the keys it takes.
pub(super) struct Paired {
    pub(super) operator: Arc<WasmOperator>,
    pub(super) live: Option<Live>,
    route: KeyRoute,
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
    pub(super) mid_record: bool,
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
    pub(super) fn call_in_record<P, R>(&mut self, func: Func, params: P, in_record: bool) -> Result<Called<R>>
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
        ctx.forward_printed();
        if let Some(error) = ctx.host_error.take() {
            ctx.txn.end_record(false);
            return Err(error);
        }
        Ok(Called { result, mid_record })
    }
}

impl WasmInstance {
    /// Instantiates `operator` for `partition` over `txn` and calls its `init`.
    pub fn new(operator: Arc<WasmOperator>, partition: u32, txn: Transaction) -> Result<WasmInstance> {
        let live = operator.start(operator.context(partition, txn)).map_err(|(e, _)| e)?;
        Ok(WasmInstance { operator, live: Some(live), replaced: 0, paired: None, on_paired: false, next_bound: None })
    }

    /// The version it runs (between batches: the paired version's keys aside).
    pub fn operator(&self) -> &Arc<WasmOperator> {
        &self.operator
    }

    /// Swaps in the instance that processes `key`'s records, expiries and timers: the
    /// paired version's for a key its route takes, else this one's. The state (and the
    /// batch's budget) moves with it.
    pub(super) fn route(&mut self, key: &[u8]) {
        if self.paired.as_ref().is_some_and(|paired| (paired.route)(key) != self.on_paired) {
            self.swap_paired();
        }
    }

    /// Whether the paired version's instance is swapped in.
    pub(super) fn on_paired(&self) -> bool {
        self.on_paired
    }

    /// Whether the paired version takes `key`.
    pub(super) fn paired_takes(&self, key: &[u8]) -> bool {
        self.paired.as_ref().is_some_and(|paired| (paired.route)(key))
    }

    /// Swaps its own instance back in (between batches it always is).
    pub(super) fn route_home(&mut self) {
        if self.on_paired {
            self.swap_paired();
        }
    }

    /// Swaps the paired version's instance and its own, the state going along.
    fn swap_paired(&mut self) {
        let paired = self.paired.as_mut().expect("a version is paired");
        // Both are live but after a trap whose instance could not be replaced: the
        // partition stops then, and nothing commits.
        if let (Some(here), Some(there)) = (self.live.as_mut(), paired.live.as_mut()) {
            let (here, there) = (here.store.data_mut(), there.store.data_mut());
            std::mem::swap(&mut here.txn, &mut there.txn);
            std::mem::swap(&mut here.budget, &mut there.budget);
        }
        std::mem::swap(&mut self.live, &mut paired.live);
        std::mem::swap(&mut self.operator, &mut paired.operator);
        self.on_paired = !self.on_paired;
    }

    /// Pairs `operator` with this instance from the next batch on, taking the keys
    /// `route` names, in place of any other: an instance of it is started (its `init`
    /// called) over a [detached](Transaction::detached) transaction, unless that version
    /// is paired already, whose instance then takes `route`'s keys. An `Err` says why
    /// it could not start; then none is paired.
    pub fn pair(&mut self, operator: Arc<WasmOperator>, route: KeyRoute) -> Result<()> {
        debug_assert!(!self.on_paired, "between batches");
        if let Some(paired) = self.paired.as_mut().filter(|p| p.operator.version == operator.version) {
            paired.route = route;
            return Ok(());
        }
        self.paired = None;
        let partition = self.ctx().partition;
        let parked = self.state().detached()?;
        let live = operator.start(operator.context(partition, parked)).map_err(|(e, _)| e)?;
        self.paired = Some(Paired { operator, live: Some(live), route });
        Ok(())
    }

    /// Ends the pairing: from the next batch on, this version takes every key.
    pub fn unpair(&mut self) {
        debug_assert!(!self.on_paired, "between batches");
        self.paired = None;
    }

    /// The budget of a batch starting now: its own bounds, and the one
    /// [`bound_next_batch`](Operator::bound_next_batch) set, if any, taken.
    pub(super) fn budget(&mut self) -> BatchBudget {
        let limits = &self.operator.limits.per_call;
        match self.next_bound.take() {
            Some(until) => BatchBudget::bounded(limits, until),
            None => BatchBudget::new(limits),
        }
    }

    pub(super) fn live(&mut self) -> &mut Live {
        self.live.as_mut().expect("instance is live between calls")
    }

    /// Whether either version this partition runs is told of expiries or timers. Then
    /// every batched call, of either version, ends before a record that makes entries
    /// due, and each due entry expires between calls, routed to the version its key
    /// goes to ([`expire_before`](Self::expire_before)): a version told of none must
    /// not expire the other's entries unseen inside its own call.
    pub(super) fn told_any(&self) -> bool {
        let told = |live: &Option<Live>| live.as_ref().is_some_and(|live| live.exports.told());
        told(&self.live) || self.paired.as_ref().is_some_and(|paired| told(&paired.live))
    }

    pub(super) fn ctx(&mut self) -> &mut HostCtx {
        self.live().store.data_mut()
    }

    /// Says why the last call trapped and replaces the instance: a trapped instance may
    /// hold broken invariants in its memory. A fresh instance that fails to start is
    /// tried again as the retry policy says; an `Err` is the last attempt's failure.
    pub(super) fn replace_after(&mut self, trap: wasmtime::Error) -> Result<String> {
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
    /// `expired` for each when it exports it (`fired` for a timer's), until none is due
    /// or the batch is spent (after it did something); returns whether none is due.
    pub(super) fn expire_before(&mut self, offset: u64, expirations: &mut Vec<Expiration>) -> Result<bool> {
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
            // The version that processes the entry's key is told of it.
            self.route(&entry.key);
            if self.live().exports.told()
                && let Some(outcome) = self.call_told(&entry, offset)?
            {
                let bytes = entry.key.len() + entry.name.len() + entry.value.len() + outcome.bytes();
                let budget = &mut self.ctx().budget;
                budget.bytes = budget.bytes.saturating_add(bytes);
                expirations.push(Expiration { entry, offset, outcome, by_paired: self.on_paired });
            }
        }
    }

    /// Tells the component of `entry`, due before the record at `offset`, in a record
    /// scope of its key: its `expired`, or for a timer its `fired` — a timer fired in a
    /// version without `fired` (one set by a newer version before a rollback) is the
    /// timer's dead letter; an expiry in one without `expired` has no outcome. The call's
    /// writes stand only if it returns outputs. An `Err` is a host failure.
    fn call_told(&mut self, entry: &Expired, offset: u64) -> Result<Option<Outcome>> {
        let exports = self.live().exports;
        let outcome = match (entry.timer(), exports.fired) {
            (None, _) => {
                if exports.expired.is_none() {
                    return Ok(None);
                }
                let params = (entry.key.as_slice(), entry.name.as_str(), entry.value.as_slice(), entry.expired_at_ms);
                self.call_callback::<ExpiredParams<'_>>(entry, offset, |exports| exports.expired, params)?
            }
            (Some(timer), Some(_)) => {
                let params = (entry.key.as_slice(), timer, entry.expired_at_ms);
                self.call_callback::<FiredParams<'_>>(entry, offset, |exports| exports.fired, params)?
            }
            (Some(timer), None) => Outcome::Rejected(format!(
                "timer {timer:?} fired at {}, but {} does not export `fired` (it was built against {WIT_PACKAGE} \
                 before 0.1.3; a version that set the timer does)",
                entry.expired_at_ms, self.operator.version
            )),
        };
        Ok(Some(outcome))
    }

    /// Calls the callback `export` picks from the live instance's exports (`expired` or
    /// `fired`, which it exports) with `params`, for `entry` due before the record at
    /// `offset`, in a record scope of its key: the call's
    /// writes stand only if it returns outputs. A trap replaces the instance and calls the
    /// callback again in the fresh one as `[operator.retry]` says, as a record's does:
    /// what broke the instance need not be the callback's doing (a JavaScript runtime's
    /// garbage reaching the memory cap between two collections, say).
    fn call_callback<P: ComponentNamedList + Lower + Copy>(
        &mut self,
        entry: &Expired,
        offset: u64,
        export: fn(&Exports) -> Option<Func>,
        params: P,
    ) -> Result<Outcome> {
        let mut attempt = 1;
        loop {
            let func = export(&self.live().exports).expect("every instance of a version has its exports");
            let ctx = self.ctx();
            ctx.txn.scope(&entry.key);
            wasi::enter_moment(&mut ctx.wasi, &ctx.txn, offset, &entry.key, &entry.name, entry.expired_at_ms as i64);
            ctx.in_callback = true;
            let replaced = self.replaced;
            let outcome = self.call_for_outcome::<P>(func, params);
            // After a trap whose replacement failed to start there is no instance left.
            if let Some(live) = self.live.as_mut() {
                live.store.data_mut().in_callback = false;
            }
            let outcome = outcome?;
            self.state().end_record(matches!(outcome, Outcome::Emitted(_)));
            return Ok(match outcome {
                // A trap, not outputs past a limit: the instance is a fresh one.
                Outcome::Trapped { reason, .. } if self.replaced != replaced => {
                    if self.retry(&mut attempt, offset, &reason) {
                        continue;
                    }
                    Outcome::Trapped { reason, attempts: attempt }
                }
                outcome => outcome,
            });
        }
    }

    /// Calls `func` — an export that returns one record's result, `P -> ProcessResults`
    /// — with `params` in the record scope the caller opened: the record's outcome, a
    /// trap replacing the instance. An `Err` is a host failure.
    fn call_for_outcome<P: ComponentNamedList + Lower>(&mut self, func: Func, params: P) -> Result<Outcome> {
        match self.live().call::<P, ProcessResults>(func, params, true)? {
            Ok((result,)) => {
                let late = self.ctx().late;
                Ok(outcome_of(result, &self.operator.limits.per_call, late))
            }
            Err(trap) => Ok(Outcome::Trapped { reason: self.replace_after(trap)?, attempts: 1 }),
        }
    }
}

/// `record`'s headers as the guest receives them, borrowing their bytes.
pub(super) fn headers(record: &SourceRecord) -> Vec<types::Header<'_>> {
    record.headers.iter().map(|(key, value)| types::Header { key, value }).collect()
}

/// `record` with its `headers` as the guest receives it, borrowing its bytes.
pub(super) fn input_record<'a>(record: &'a SourceRecord, headers: &'a [types::Header<'a>]) -> InputRecord<'a> {
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
        let processed = self.run_batch(records);
        self.route_home();
        processed
    }

    fn expire(&mut self, offset: u64) -> Result<Vec<Expiration>> {
        self.ctx().budget = self.budget();
        let mut expirations = Vec::new();
        let expired = self.expire_before(offset, &mut expirations);
        self.route_home();
        expired.map(|_| expirations)
    }

    fn bound_next_batch(&mut self, until: Instant) {
        self.next_bound = Some(until);
    }

    fn state(&mut self) -> &mut Transaction {
        &mut self.ctx().txn
    }

    fn version(&self) -> &str {
        self.operator.version()
    }

    fn paired_version(&self) -> Option<&str> {
        self.paired.as_ref().map(|paired| paired.operator.version())
    }
}

impl WasmInstance {
    /// Switches to `next` between batches, keeping the partition's state; a version
    /// that fails to start leaves the old one running (`replayed`: a switch a replay
    /// repeats).
    pub fn switch_to(&mut self, next: Arc<WasmOperator>, replayed: bool) -> Result<Switch> {
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
