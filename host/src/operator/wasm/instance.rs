//! Running a version per partition: the [`ActiveVersion`] a host follows, and the
//! [`WasmInstance`] that calls a partition's records into it, replaces it after a trap
//! and switches versions between batches. How a batch runs through it is `batch`'s.

use super::*;
use crate::operator::Instantiate;
use crate::operator::replay::RecordedSwitches;

/// The version every partition of this host runs: set by a deploy, followed by each
/// partition's [`WasmInstance`] at its next batch boundary.
pub struct ActiveVersion {
    /// Increases with every activation, so an instance sees a change with one load.
    generation: AtomicU64,
    pub(super) current: Mutex<Arc<WasmOperator>>,
    /// The canary beside it, and the share of the keys it takes.
    canary: Mutex<Option<(Arc<WasmOperator>, BasisPoints)>>,
}

impl ActiveVersion {
    /// `operator` is active.
    pub fn new(operator: Arc<WasmOperator>) -> Arc<Self> {
        Arc::new(ActiveVersion {
            generation: AtomicU64::new(0),
            current: Mutex::new(operator),
            canary: Mutex::default(),
        })
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

    /// Makes `operator` the active version for every key: a canary ends.
    pub fn activate(&self, operator: Arc<WasmOperator>) {
        let mut current = crate::lock(&self.current);
        *current = operator;
        *crate::lock(&self.canary) = None;
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// The canary, if one runs, and the share of the keys it takes.
    pub fn canary(&self) -> Option<(Arc<WasmOperator>, BasisPoints)> {
        crate::lock(&self.canary).clone()
    }

    /// Runs `canary` (a version and the share of the keys it takes, [`in_canary`]) beside
    /// the active version from each partition's next batch on, in place of any other;
    /// `None` ends it.
    ///
    /// [`in_canary`]: crate::operator::in_canary
    pub fn set_canary(&self, canary: Option<(Arc<WasmOperator>, BasisPoints)>) {
        *crate::lock(&self.canary) = canary;
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Instantiates the active version for `partition` over `txn` and calls its `init`.
    pub fn instantiate(self: &Arc<Self>, partition: u32, txn: Transaction) -> Result<WasmInstance> {
        let (generation, operator) = self.get();
        let live = operator.start(operator.context(partition, txn)).map_err(|(e, _)| e)?;
        let mut instance = WasmInstance {
            operator,
            active: self.clone(),
            generation: Some(generation),
            switches: None,
            live: Some(live),
            replaced: 0,
            canary: None,
            on_canary: false,
            next_bound: None,
        };
        instance.use_canary(self.canary());
        Ok(instance)
    }
}

/// How a worker instantiates the active version, not knowing it is WebAssembly.
impl Instantiate for Arc<ActiveVersion> {
    fn instantiate(&self, partition: u32, txn: Transaction) -> Result<Box<dyn Operator>> {
        Ok(Box::new(ActiveVersion::instantiate(self, partition, txn)?))
    }
}

/// The version this host runs as a shadow beside the active one, if any: set and
/// cleared by the [deployer](crate::operator::deploy), followed by each partition's
/// worker between batches. Each start is a version of its own: its instances never
/// switch.
#[derive(Default)]
pub struct ShadowVersion {
    /// Increases with every start and stop.
    generation: AtomicU64,
    current: Mutex<Option<Arc<ActiveVersion>>>,
}

impl ShadowVersion {
    /// Runs `operator` as the shadow from now on, in place of any other.
    pub fn start(&self, operator: Arc<WasmOperator>) {
        *crate::lock(&self.current) = Some(ActiveVersion::new(operator));
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Stops the shadow, if one runs.
    pub fn stop(&self) {
        if crate::lock(&self.current).take().is_some() {
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
    }
}

impl crate::operator::Shadows for ShadowVersion {
    fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    fn version(&self) -> Option<String> {
        crate::lock(&self.current).as_ref().map(|active| active.get().1.version().to_string())
    }

    fn instantiate(&self, partition: u32, txn: Transaction) -> Result<Option<Box<dyn Operator>>> {
        let Some(active) = crate::lock(&self.current).clone() else { return Ok(None) };
        Ok(Some(Box::new(active.instantiate(partition, txn)?)))
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
    /// The canary beside the active version, while one runs.
    pub(super) canary: Option<Canary>,
    /// Whether `operator` and `live` are the canary's now, swapped in for a key it takes
    /// ([`route`](WasmInstance::route)); never between batches.
    on_canary: bool,
    /// When the next batch must end, if sooner than its own bounds say
    /// ([`Operator::bound_next_batch`]).
    next_bound: Option<Instant>,
}

/// A partition's instance of the canary: the version, its live instance (the one not
/// swapped in holds a [shadow](Transaction::shadow) of the state, never used), and the
/// share of the keys it takes.
pub(super) struct Canary {
    pub(super) operator: Arc<WasmOperator>,
    pub(super) live: Option<Live>,
    pub(super) share: BasisPoints,
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
        if let Some(error) = ctx.host_error.take() {
            ctx.txn.end_record(false);
            return Err(error);
        }
        Ok(Called { result, mid_record })
    }
}

impl WasmInstance {
    /// Swaps in the version that processes `key`'s records, expiries and timers: the
    /// canary's instance for a key it takes, else the active version's. The state (and
    /// the batch's budget) moves with it.
    pub(super) fn route(&mut self, key: &[u8]) {
        if self.canary.as_ref().is_some_and(|canary| in_canary(key, canary.share) != self.on_canary) {
            self.swap_canary();
        }
    }

    /// Whether the canary's instance is swapped in.
    pub(super) fn on_canary(&self) -> bool {
        self.on_canary
    }

    /// Swaps the active version's instance back in (between batches it always is).
    pub(super) fn route_to_active(&mut self) {
        if self.on_canary {
            self.swap_canary();
        }
    }

    /// Swaps the canary's instance and the active version's, the state going along.
    fn swap_canary(&mut self) {
        let canary = self.canary.as_mut().expect("a canary runs");
        // Both are live but after a trap whose instance could not be replaced: the
        // partition stops then, and nothing commits.
        if let (Some(here), Some(there)) = (self.live.as_mut(), canary.live.as_mut()) {
            let (here, there) = (here.store.data_mut(), there.store.data_mut());
            std::mem::swap(&mut here.txn, &mut there.txn);
            std::mem::swap(&mut here.budget, &mut there.budget);
        }
        std::mem::swap(&mut self.live, &mut canary.live);
        std::mem::swap(&mut self.operator, &mut canary.operator);
        self.on_canary = !self.on_canary;
    }

    /// Runs `wanted` as the canary (a version and its share; `None`: no canary): started,
    /// its share changed, or ended. A canary that cannot start here is logged, and none
    /// runs.
    fn use_canary(&mut self, wanted: Option<(Arc<WasmOperator>, BasisPoints)>) {
        debug_assert!(!self.on_canary, "between batches");
        let Some((operator, share)) = wanted else {
            self.canary = None;
            return;
        };
        if let Some(canary) = self.canary.as_mut().filter(|c| c.operator.version == operator.version) {
            canary.share = share;
            return;
        }
        self.canary = None;
        let partition = self.ctx().partition;
        let started = self
            .state()
            .shadow()
            .and_then(|parked| operator.start(operator.context(partition, parked)).map_err(|(e, _)| e));
        match started {
            Ok(live) => self.canary = Some(Canary { operator, live: Some(live), share }),
            Err(e) => tracing::error!(partition, "canary {} could not start: {e:#}", operator.version),
        }
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
        told(&self.live) || self.canary.as_ref().is_some_and(|canary| told(&canary.live))
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
                && let Some(outcome) = self.call_told(&entry)?
            {
                let bytes = entry.key.len() + entry.name.len() + entry.value.len() + outcome.bytes();
                let budget = &mut self.ctx().budget;
                budget.bytes = budget.bytes.saturating_add(bytes);
                expirations.push(Expiration { entry, offset, outcome });
            }
        }
    }

    /// Tells the component of `entry`, in a record scope of its key: its `expired`, or
    /// for a timer its `fired` — a timer fired in a version without `fired` (one set by
    /// a newer version before a rollback) is the timer's dead letter; an expiry in one
    /// without `expired` has no outcome. The call's writes stand only if it returns
    /// outputs. An `Err` is a host failure.
    fn call_told(&mut self, entry: &Expired) -> Result<Option<Outcome>> {
        let exports = self.live().exports;
        let outcome = match (entry.timer(), exports.fired) {
            (None, _) => {
                let Some(expired) = exports.expired else { return Ok(None) };
                let params = (entry.key.as_slice(), entry.name.as_str(), entry.value.as_slice(), entry.expired_at_ms);
                self.call_callback::<ExpiredParams<'_>>(&entry.key, expired, params)?
            }
            (Some(timer), Some(fired)) => {
                let params = (entry.key.as_slice(), timer, entry.expired_at_ms);
                self.call_callback::<FiredParams<'_>>(&entry.key, fired, params)?
            }
            (Some(timer), None) => Outcome::Rejected(format!(
                "timer {timer:?} fired at {}, but {} does not export `fired` (it was built against {WIT_PACKAGE} \
                 before 0.1.3; a version that set the timer does)",
                entry.expired_at_ms, self.operator.version
            )),
        };
        Ok(Some(outcome))
    }

    /// Calls `func`, the `expired` or `fired` callback, with `params` in a record scope
    /// of `key`: the call's writes stand only if it returns outputs.
    fn call_callback<P: ComponentNamedList + Lower>(&mut self, key: &[u8], func: Func, params: P) -> Result<Outcome> {
        let ctx = self.ctx();
        ctx.txn.scope(key);
        ctx.in_callback = true;
        let outcome = self.call_for_outcome::<P>(func, params);
        // After a trap whose replacement failed to start there is no instance left.
        if let Some(live) = self.live.as_mut() {
            live.store.data_mut().in_callback = false;
        }
        let outcome = outcome?;
        self.state().end_record(matches!(outcome, Outcome::Emitted(_)));
        Ok(outcome)
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
        self.route_to_active();
        processed
    }

    fn expire(&mut self, offset: u64) -> Result<Vec<Expiration>> {
        self.ctx().budget = self.budget();
        let mut expirations = Vec::new();
        let expired = self.expire_before(offset, &mut expirations);
        self.route_to_active();
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

    fn version_for(&self, key: &[u8]) -> &str {
        match &self.canary {
            Some(canary) if in_canary(key, canary.share) => canary.operator.version(),
            _ => self.operator.version(),
        }
    }

    fn follow_deploys(&mut self, offset: u64) -> Result<Option<Switch>> {
        if let Some(first) = self.switches.as_ref().and_then(|s| s.replayed(offset)).cloned() {
            // After the replay, the active version is looked at whatever its generation.
            self.generation = None;
            self.use_canary(first.canary);
            if first.version.version == self.operator.version {
                return Ok(None);
            }
            return self.switch_to(first.version, true).map(Some);
        }
        if self.generation == Some(self.active.generation()) {
            return Ok(None);
        }
        let (generation, next) = self.active.get();
        self.generation = Some(generation);
        self.use_canary(self.active.canary());
        // Deployed and rolled back again before this partition looked, or not.
        let switched = (next.version != self.operator.version).then(|| self.switch_to(next, false)).transpose()?;
        // What runs now (a version that failed to start left the old one running, a
        // canary that failed to start none), recorded before it processes anything.
        if let Some(switches) = &mut self.switches {
            let canary = self.canary.as_ref().map(|canary| (canary.operator.clone(), canary.share));
            switches.record(offset, Routing { version: self.operator.clone(), canary }.switched());
        }
        Ok(switched)
    }

    fn switches_recorded(&mut self, next_offset: u64) -> Result<()> {
        match &mut self.switches {
            Some(switches) => switches.recorded_before(next_offset),
            None => Ok(()),
        }
    }

    fn next_switch(&self, offset: u64) -> Option<u64> {
        self.switches.as_ref()?.next_change(offset)
    }

    /// Replays, then records each switch beginning with the version it runs then. Fails
    /// when the log cannot be read or a version it names cannot be loaded.
    fn follow_switches(
        &mut self,
        (log, recorded): (&Arc<SwitchLog>, RecordedSwitches),
        partition: u32,
        offsets: (u64, u64),
    ) -> Result<()> {
        self.switches = Some(log.partition(recorded, partition, offsets, &self.operator)?);
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
