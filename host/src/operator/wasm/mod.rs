//! The WebAssembly sandbox: loading, validating and running operator components.
//!
//! A [`WasmOperator`] is a validated, compiled component with its linker set up
//! (pre-instantiated, so an instance costs microseconds, not a compile). The
//! [`ActiveVersion`] says which one this host runs; it makes one [`WasmInstance`] per
//! partition, and each instance switches to a newly activated version between two
//! batches, keeping the partition's state — or, while its partition replays records, to
//! the version that first processed them ([`replay`](super::replay)). Instances get only the `sluice:operator`
//! imports (keyed state and logging). WASI imports that the Rust standard library
//! links in are defined as traps, so a guest that touches the filesystem, network,
//! clock or environment traps with the name of the function; any other import is
//! refused when the component is loaded. Each record runs under a deadline (epoch
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
//! cannot be called while it is in a call).
//!
//! What a call returns is lifted out of the guest's memory by [`lift`]'s types, which
//! check counts and lengths before copying anything. A batch's outputs, failure
//! reasons and expiries count against its per-batch bounds as they come, so a batch —
//! records and expiries alike — ends at its bounds wherever it is, even between two
//! expiries before one record.

mod lift;

use super::replay::{PartitionSwitches, SwitchLog};
use super::{Expiration, Operator, OperatorStopped, Outcome, Processed, Switch};
use crate::config::{self, OperatorLimits, RetryPolicy};
use crate::log_rate::{self, Admitted, LogRate};
use crate::record::SourceRecord;
use crate::state::{Expired, Transaction};
use anyhow::{Context, Result, anyhow, bail};
use lift::{GuestOutputs, GuestReason, GuestResult, LiftBounds};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use wasmtime::component::types::ComponentItem;
use wasmtime::component::{
    Component, ComponentExportIndex, ComponentNamedList, Func, HasSelf, Lift, Linker, Lower, ResourceType, TypedFunc,
};
use wasmtime::{AsContextMut, Engine, ResourceLimiter, Store, StoreContextMut};

mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "operator",
        imports: { default: trappable },
        anyhow: true,
        // The record handed to `process` borrows the host's bytes, which are copied
        // into the guest's memory once, by the call itself.
        ownership: Borrowing { duplicate_if_necessary: true },
    });
}

use bindings::sluice::operator::{log, state, types};
use bindings::{InputRecord, Operator as Bindings, OperatorPre};

/// The WIT package operators are built against, and the version range this host serves.
pub const WIT_PACKAGE: &str = "sluice:operator";
/// The package's major.minor this host serves: any `0.1.x` component links.
pub const WIT_VERSION: &str = "0.1";

/// The interface a batched call reports each record's result through (0.1.1, defined
/// at this host's version), and the export that takes a batch.
const BATCH_INTERFACE: &str = "sluice:operator/batch@0.1.2";

/// The exports a component may have, and the signatures the host calls them with
/// (each result lifted by [`lift`]'s checked types).
const INIT: &str = "init";
type InitParams<'a> = (&'a [(&'a str, &'a str)],);
type InitResults = (std::result::Result<(), GuestReason>,);
const PROCESS: &str = "process";
type ProcessParams<'a> = (InputRecord<'a>,);
type ProcessResults = (GuestResult,);
const PROCESS_BATCH: &str = "process-batch";
type BatchParams<'a> = (&'a [InputRecord<'a>],);
/// The export told of each expired state entry (0.1.2).
const EXPIRED: &str = "expired";
type ExpiredParams<'a> = (&'a [u8], &'a str, &'a [u8], u64);

/// Logged when a record that trapped is called again: `calling it again in 10ms, attempt 2 of 2`.
pub const RETRYING: &str = "calling it again";

/// Logged when an instance's log lines pass their rate: `its log lines are dropped`.
pub const LOG_LINES_DROPPED: &str = "log lines are dropped";

/// How often the epoch advances; the granularity of call deadlines.
const EPOCH_TICK: Duration = Duration::from_millis(5);

/// Limits every call of an operator runs under.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// CPU deadline of one `process` or `init` call (of one record, inside a batched
    /// call): the CPU time of the thread running it, so a record that takes less is
    /// never stopped however loaded the host, and one that spins is stopped once it
    /// took between one and two times this. `None`, for measuring what the deadline
    /// costs only (a job always has one), runs on an engine that never interrupts.
    pub call_timeout: Option<Duration>,
    /// The WebAssembly instructions one call (one record's share of a batched call) may
    /// execute; `None`: uncounted, which makes the operator run on an engine that does
    /// not count.
    pub instructions: Option<u64>,
    /// The most memory an instance may hold, in bytes: its linear memories and its
    /// tables together.
    pub memory_bytes: usize,
    /// What one call may make the host hold: outputs, state writes and reads, logs.
    pub per_call: OperatorLimits,
    /// What a record whose call trapped gets: more calls, then its dead letter or the
    /// partition's stop.
    pub retry: RetryPolicy,
}

impl Default for Limits {
    /// The defaults of `[operator]`.
    fn default() -> Self {
        Limits {
            call_timeout: Some(Duration::from_millis(config::default_call_timeout_ms())),
            instructions: None,
            memory_bytes: (config::default_memory_limit_mib() as usize) << 20,
            per_call: OperatorLimits::default(),
            retry: RetryPolicy::default(),
        }
    }
}

/// What one slot of a table costs the instance's memory budget: a reference, as wasmtime
/// holds it.
const TABLE_SLOT_BYTES: usize = std::mem::size_of::<usize>();
/// The most core instances, linear memories and tables one component instance may
/// create: a Rust component built for wasm32-wasip2 has a handful of each.
const MAX_CORE_INSTANCES: usize = 50;
const MAX_MEMORIES: usize = 4;
const MAX_TABLES: usize = 20;

/// A validated, compiled operator component, ready to instantiate per partition.
pub struct WasmOperator {
    pre: OperatorPre<HostCtx>,
    /// The component's exports the host calls.
    exports: ExportIndices,
    /// Where the component came from (a file, a deployed version), for errors.
    origin: String,
    name: Arc<str>,
    version: String,
    limits: Limits,
    config: Vec<(String, String)>,
}

/// What the host functions see: the partition's state and the instance's limits.
struct HostCtx {
    txn: Transaction,
    /// The most memory the instance may hold, in bytes: linear memories and tables.
    memory_cap: usize,
    /// What the instance's memories and tables hold now, in bytes.
    memory_used: usize,
    /// What one call may make the host hold.
    per_call: OperatorLimits,
    /// What the current call made the host hold so far.
    usage: CallUsage,
    /// The instance's log lines, against [`OperatorLimits::log_lines_per_s`] and
    /// [`OperatorLimits::log_bytes_per_s`].
    log: LogRate,
    /// Epoch ticks one record (or `init`) runs for before its thread's CPU time is
    /// looked at: the CPU deadline in wall-clock time; 0 without a deadline.
    deadline_ticks: u64,
    /// The CPU deadline itself.
    call_timeout: Duration,
    /// The thread's CPU time when the current record's wall-clock deadline first
    /// passed; `None` before.
    cpu_mark: Option<Duration>,
    /// The instructions (fuel) one record (or `init`) may execute; `None`: uncounted.
    instructions: Option<u64>,
    /// Why the host stopped the current call, when it did (see [`Cause`]).
    cause: Option<Cause>,
    operator: Arc<str>,
    partition: u32,
    /// A failure of the host itself (RocksDB), raised as a trap to unwind the guest
    /// and reported by the worker as fatal rather than as the record's fault.
    host_error: Option<anyhow::Error>,
    /// The guest's last error-level log line in the current call: the SDK's panic
    /// hook logs the panic message there just before the trap.
    last_error: Option<String>,
    /// Whether a `process` call is running: state is scoped to its record's key and
    /// exists only there (an `init` that reached for state would see whichever key the
    /// partition's last record had).
    in_record: bool,
    /// The running `process-batch` call's inputs and finished outcomes.
    batch: Batch,
    /// Where the batch in hand stands against its bounds.
    budget: BatchBudget,
    /// How much of a call's outputs and reasons is lifted out of the guest.
    lift_bounds: LiftBounds,
}

/// Where a batch stands against its bounds: `[operator.limits]`
/// `output_bytes_per_batch` and `time_per_batch_ms`, `[ttl] sweep_limit` expiries, and
/// `[state] commit_dirty_mib` (which the transaction counts).
#[derive(Debug)]
struct BatchBudget {
    /// When the batch must end.
    ends_at: Instant,
    /// Bytes it holds for what it emits: outputs, failure reasons, expired entries.
    bytes: usize,
    /// Entries it expired.
    expiries: usize,
    /// Records it finished.
    records: usize,
}

impl BatchBudget {
    /// A batch starting now under `limits`.
    fn new(limits: &OperatorLimits) -> Self {
        let time = Duration::from_millis(limits.time_per_batch_ms.min(u32::MAX.into()));
        BatchBudget { ends_at: Instant::now() + time, bytes: 0, expiries: 0, records: 0 }
    }

    /// Whether the batch has done anything: a batch ends at its bounds only after
    /// that, so each makes progress.
    fn started(&self) -> bool {
        self.records + self.expiries > 0
    }

    /// Whether the batch should end before its next record or expiry.
    fn is_spent(&self, limits: &OperatorLimits, txn: &Transaction) -> bool {
        self.bytes >= limits.output_bytes_per_batch
            || self.expiries >= txn.ttl().sweep_limit
            || txn.dirty_full()
            || Instant::now() >= self.ends_at
    }

    /// Counts a finished record with `outcome`.
    fn add_record(&mut self, outcome: &Outcome) {
        self.records += 1;
        self.bytes = self.bytes.saturating_add(outcome.bytes());
    }
}

/// What the host keeps of a `process-batch` call while it runs: enough to move the
/// record scope from one input to the next at each `batch.finish`.
#[derive(Default)]
struct Batch {
    /// The inputs' keys end to end (the buffer is reused from batch to batch)...
    keys: Vec<u8>,
    /// ... and where each ends.
    ends: Vec<usize>,
    /// The inputs' offsets and event times.
    times: Vec<(u64, i64)>,
    /// The outcomes of the inputs finished so far, in order.
    outcomes: Vec<Outcome>,
    /// Whether the operator is told of expiries: a call is then cut before an input
    /// that makes entries due.
    told: bool,
    /// Whether `finish` cut the call short, before an input that makes expiries due
    /// (the call's own writes brought them) or at the batch's bounds: the host goes on
    /// from there.
    cut: bool,
}

impl Batch {
    /// A call of `records` starts, their first's time observed.
    fn start(&mut self, records: &[SourceRecord], told: bool) {
        self.end();
        self.outcomes.clear();
        (self.told, self.cut) = (told, false);
        for record in records {
            self.keys.extend_from_slice(&record.key);
            self.ends.push(self.keys.len());
            self.times.push((record.offset, record.timestamp_ms));
        }
    }

    /// Whether a `process-batch` call is running (between [`start`](Batch::start) and
    /// [`end`](Batch::end)).
    fn is_running(&self) -> bool {
        !self.ends.is_empty()
    }

    /// Ends the call: `finish` has no inputs to move to until the next starts.
    fn end(&mut self) {
        self.keys.clear();
        self.ends.clear();
        self.times.clear();
    }

    /// The key, offset and event time of input `index`, if there is one.
    fn input(&self, index: usize) -> Option<(&[u8], u64, i64)> {
        let end = *self.ends.get(index)?;
        let start = index.checked_sub(1).map_or(0, |before| self.ends[before]);
        let (offset, timestamp_ms) = self.times[index];
        Some((&self.keys[start..end], offset, timestamp_ms))
    }
}

/// What one call has made the host hold so far, counted against
/// [`OperatorLimits`].
#[derive(Debug, Default)]
struct CallUsage {
    reads: usize,
    writes: usize,
    written_bytes: usize,
}

/// Why the host stopped a call, recorded where it stops it: the trap that unwinds
/// the guest carries only a message.
#[derive(Debug, Clone, PartialEq)]
enum Cause {
    /// The instance tried to grow its memories or tables past the cap.
    MemoryCap,
    /// The call passed one of [`OperatorLimits`]: which, and by how much.
    Limit(String),
    /// The guest called a WASI function, which the sandbox denies; its full name
    /// (`wasi:cli/environment@0.2.6#get-environment`).
    DeniedImport(String),
    /// The call took its CPU deadline.
    Deadline,
}

/// The engines operators of this process are compiled by, one for each combination
/// of the two limits that change the compiled code: counting the instructions a call
/// executes (for operators with an instruction limit), and interrupting it at an epoch
/// deadline (for operators with a CPU deadline, which every job's have). The epochs
/// advance every [`EPOCH_TICK`], on one thread of their own.
struct Engines([Engine; 4]);

/// The engine an operator whose calls run under `limits` is compiled by.
fn engine(limits: &Limits) -> Result<&'static Engine> {
    static ENGINES: OnceLock<Engines> = OnceLock::new();
    if let Some(engines) = ENGINES.get() {
        return Ok(engines.pick(limits));
    }
    let new = |kind: usize| {
        let mut config = wasmtime::Config::new();
        config.consume_fuel(kind & 1 != 0).epoch_interruption(kind & 2 != 0);
        Engine::new(&config)
    };
    let engines = Engines([new(0)?, new(1)?, new(2)?, new(3)?]);
    let mut started = false;
    let engines = ENGINES.get_or_init(|| {
        started = true;
        engines
    });
    if started {
        std::thread::Builder::new().name("sluice-epoch".into()).spawn(|| {
            loop {
                engines.0.iter().for_each(Engine::increment_epoch);
                std::thread::sleep(EPOCH_TICK);
            }
        })?;
    }
    Ok(engines.pick(limits))
}

impl Engines {
    fn pick(&self, limits: &Limits) -> &Engine {
        &self.0[usize::from(limits.instructions.is_some()) | usize::from(limits.call_timeout.is_some()) << 1]
    }
}

impl WasmOperator {
    /// Reads, validates and compiles the component at `path`, named after the file.
    pub fn load(path: &Path, limits: Limits, config: Vec<(String, String)>) -> Result<Self> {
        let bytes = std::fs::read(path).with_context(|| format!("reading operator {}", path.display()))?;
        let name = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        Self::compile(&super::version_of(&name, &bytes), &bytes, &path.display().to_string(), limits, config)
    }

    /// Validates and compiles `component`, the build `version` (`name@digest`, as its
    /// registry names it: see [`Registry::version_of`](super::registry::Registry::version_of))
    /// found at `origin` (a path or a deployed version, named in errors).
    ///
    /// Fails with an error naming `origin` when it is not a WebAssembly component, was
    /// built against another world or version, or imports anything but the sluice
    /// interfaces and WASI.
    pub fn compile(
        version: &str,
        component: &[u8],
        origin: &str,
        limits: Limits,
        config: Vec<(String, String)>,
    ) -> Result<Self> {
        check_component_header(component).with_context(|| format!("operator {origin}"))?;
        let engine = engine(&limits)?;
        let compiled = Component::new(engine, component)
            .map_err(anyhow::Error::from)
            .with_context(|| format!("operator {origin}: not a valid WebAssembly component"))?;
        check_imports(engine, &compiled).with_context(|| format!("operator {origin}"))?;

        let mut linker = Linker::<HostCtx>::new(engine);
        Bindings::add_to_linker::<HostCtx, HasSelf<HostCtx>>(&mut linker, |ctx| ctx)?;
        linker.instance(BATCH_INTERFACE)?.func_wrap("finish", finish)?;
        deny_wasi(&mut linker, engine, &compiled)?;
        // The sluice interfaces are defined once, at this host's version: wasmtime
        // links a component's import of any 0.1.x version to them (semver). A function
        // of a newer minor that the component calls is missing here, and refused now,
        // by name, rather than trapping on some later record. (Stubbing unknown imports
        // as traps would define the 0.1.0 names too, shadowing the real functions.)
        let pre =
            linker.instantiate_pre(&compiled).and_then(OperatorPre::new).map_err(anyhow::Error::from).with_context(
                || {
                    format!(
                        "operator {origin} does not fit the {WIT_PACKAGE}/operator@{WIT_VERSION} world this host \
                         serves (it must export `init` and `process` with the signatures in wit/operator.wit, and \
                         import only functions of the interfaces there)"
                    )
                },
            )?;
        let export = |name| compiled.get_export_index(None, name);
        let (init, process) =
            export(INIT).zip(export(PROCESS)).context("the world check found `init` and `process`")?;
        let exports = ExportIndices { init, process, process_batch: export(PROCESS_BATCH), expired: export(EXPIRED) };
        let (origin, name) = (origin.to_string(), super::name_of(version).into());
        Ok(WasmOperator { pre, exports, origin, name, version: version.into(), limits, config })
    }

    /// The operator's name, used in logs and dead letters.
    pub fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// The operator's version, `name@digest` of its component (see
    /// [`version_of`](super::version_of)): names exactly which build wrote a checkpoint's
    /// state.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// Instantiates the operator once over `scratch`, the state of an empty database,
    /// and calls its `init`: a component that cannot start under its limits is refused
    /// before a job opens its sinks or any partition, and before a deploy replaces a
    /// running version.
    pub fn check_init(&self, scratch: Transaction) -> Result<()> {
        self.start(self.context(0, scratch)).map(drop).map_err(|(e, _)| e)
    }

    fn context(&self, partition: u32, txn: Transaction) -> HostCtx {
        HostCtx {
            txn,
            memory_cap: self.limits.memory_bytes,
            memory_used: 0,
            per_call: self.limits.per_call.clone(),
            usage: CallUsage::default(),
            log: LogRate::new(self.limits.per_call.log_lines_per_s, self.limits.per_call.log_bytes_per_s),
            deadline_ticks: self.limits.call_timeout.map_or(0, ticks),
            call_timeout: self.limits.call_timeout.unwrap_or(Duration::MAX),
            cpu_mark: None,
            instructions: self.limits.instructions,
            cause: None,
            operator: self.name.clone(),
            partition,
            host_error: None,
            last_error: None,
            in_record: false,
            batch: Batch::default(),
            budget: BatchBudget::new(&self.limits.per_call),
            lift_bounds: LiftBounds {
                outputs: self.limits.per_call.outputs_per_record,
                output_bytes: self.limits.per_call.output_bytes_per_record,
                reason_bytes: self.limits.per_call.reason_bytes,
            },
        }
    }

    /// Instantiates the component over `ctx` and calls its `init`. On failure `ctx`
    /// (the partition's state) comes back with the error.
    #[expect(clippy::result_large_err, reason = "a failed start is rare; the context is moved back, not copied")]
    fn start(&self, mut ctx: HostCtx) -> std::result::Result<Live, (anyhow::Error, HostCtx)> {
        // A context moved over from an earlier instance must not lend it a stale reason,
        // nor count the earlier instance's memory.
        ctx.forget_last_call();
        ctx.memory_used = 0;
        let mut store = Store::new(self.pre.engine(), ctx);
        store.limiter(|ctx| ctx);
        if self.limits.call_timeout.is_some() {
            store.epoch_deadline_callback(deadline_passed);
        }
        // Instantiating runs the component's start functions: under the deadline too.
        arm_deadline(&mut store);
        let exports = match self.instantiate(&mut store) {
            Ok(exports) => exports,
            Err(e) => {
                let e = e.context(format!("instantiating operator {}", self.origin));
                return Err((e, store.into_data()));
            }
        };
        let mut live = Live { store, exports };
        let config: Vec<(&str, &str)> = self.config.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let failure = match live.call::<InitParams<'_>, InitResults>(exports.init, (&config,), false) {
            Ok(Ok((Ok(()),))) => return Ok(live),
            Ok(Ok((Err(GuestReason(reason)),))) => {
                anyhow!("operator {} refused to start: init returned an error: {reason}", self.origin)
            }
            Ok(Err(trap)) => {
                let reason = describe_trap(trap, &self.limits, live.store.data_mut());
                anyhow!("operator {} trapped in init: {reason}", self.origin)
            }
            Err(host_failure) => host_failure.context(format!("operator {}'s init", self.origin)),
        };
        Err((failure, live.store.into_data()))
    }

    /// A new instance in `store`, and its exports, each checked to have the signature
    /// of its world.
    fn instantiate(&self, store: &mut Store<HostCtx>) -> Result<Exports> {
        let instance = self.pre.instance_pre().instantiate(&mut *store)?;
        let mut export = |index: &ComponentExportIndex, name: &str| {
            instance.get_func(&mut *store, index).with_context(|| format!("`{name}` is not a function"))
        };
        let indices = &self.exports;
        let exports = Exports {
            init: export(&indices.init, INIT)?,
            process: export(&indices.process, PROCESS)?,
            process_batch: indices.process_batch.as_ref().map(|i| export(i, PROCESS_BATCH)).transpose()?,
            expired: indices.expired.as_ref().map(|i| export(i, EXPIRED)).transpose()?,
        };
        let check = |result: wasmtime::Result<()>, name: &str, world: &str| {
            result.map_err(anyhow::Error::from).with_context(|| {
                format!("`{name}` does not have the signature of the {world} world in wit/operator.wit")
            })
        };
        check(exports.init.typed::<InitParams<'_>, InitResults>(&*store).map(drop), INIT, "operator")?;
        check(exports.process.typed::<ProcessParams<'_>, ProcessResults>(&*store).map(drop), PROCESS, "operator")?;
        if let Some(func) = exports.process_batch {
            check(func.typed::<BatchParams<'_>, ()>(&*store).map(drop), PROCESS_BATCH, "batched-operator")?;
        }
        if let Some(func) = exports.expired {
            check(func.typed::<ExpiredParams<'_>, ProcessResults>(&*store).map(drop), EXPIRED, "expiring-operator")?;
        }
        Ok(exports)
    }
}

/// Where a component's exports are, found when it was compiled.
struct ExportIndices {
    init: ComponentExportIndex,
    process: ComponentExportIndex,
    process_batch: Option<ComponentExportIndex>,
    expired: Option<ComponentExportIndex>,
}

/// An instance's exports, each checked when the instance was made to have the
/// signature its type alias above says: [`Live::call`] calls them without a check.
#[derive(Clone, Copy)]
struct Exports {
    init: Func,
    process: Func,
    /// When the component exports it (0.1.1).
    process_batch: Option<Func>,
    /// When the component exports it (0.1.2).
    expired: Option<Func>,
}

/// The epoch ticks `time` takes, rounded up, plus the one under way.
fn ticks(time: Duration) -> u64 {
    time.as_micros().div_ceil(EPOCH_TICK.as_micros()) as u64 + 1
}

/// The CPU time the calling thread has used.
fn thread_cpu() -> Duration {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `now` is a valid timespec for the call to write; the clock exists on
    // every Linux.
    let status = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    assert_eq!(status, 0, "reading the thread's CPU clock");
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// Called when a record's wall-clock deadline passes. Reading the thread's CPU clock
/// for every record would cost it a system call, so the CPU time is counted from
/// here: the first time, the record gets its deadline again, from a mark of the
/// thread's CPU time; after that, it is stopped once it has used its deadline of CPU
/// since the mark, and otherwise waits for the rest. A record that used less CPU than
/// its deadline is never stopped; one that spins is stopped after one to two times it.
fn deadline_passed(mut store: StoreContextMut<'_, HostCtx>) -> wasmtime::Result<wasmtime::UpdateDeadline> {
    let ctx = store.data_mut();
    let now = thread_cpu();
    let used = match ctx.cpu_mark {
        Some(mark) => now.saturating_sub(mark),
        None => {
            ctx.cpu_mark = Some(now);
            return Ok(wasmtime::UpdateDeadline::Continue(ctx.deadline_ticks));
        }
    };
    match ctx.call_timeout.checked_sub(used).filter(|left| !left.is_zero()) {
        Some(left) => Ok(wasmtime::UpdateDeadline::Continue(ticks(left))),
        None => {
            ctx.cause = Some(Cause::Deadline);
            wasmtime::bail!("the call took its CPU deadline")
        }
    }
}

/// Gives the call about to run, or the record about to start, its full deadline and
/// instructions.
fn arm_deadline(mut store: impl AsContextMut<Data = HostCtx>) {
    let mut store = store.as_context_mut();
    let ticks = store.data().deadline_ticks;
    if ticks > 0 {
        store.data_mut().cpu_mark = None;
        store.set_epoch_deadline(ticks);
    }
    if let Some(instructions) = store.data().instructions {
        store.set_fuel(instructions).expect("an operator with an instruction limit runs on the counting engine");
    }
}

/// `batch.finish`: ends the current input of the running `process-batch` call with
/// `result` and moves the record scope, and the deadline, to the next one — unless the
/// batch is spent, or the next input makes expiries due that the operator is told of,
/// which end the call here, by a trap the host knows for a cut.
fn finish(mut store: StoreContextMut<'_, HostCtx>, (result,): (GuestResult,)) -> wasmtime::Result<()> {
    let ctx = store.data_mut();
    // Inside `process` (a component may import `batch` without exporting
    // `process-batch`) there is no next input to move to, only a past batch's keys.
    if !ctx.in_record || !ctx.batch.is_running() {
        wasmtime::bail!("batch.finish called outside `process-batch`");
    }
    let outcome = outcome_of(result, &ctx.per_call);
    ctx.txn.end_record(matches!(outcome, Outcome::Emitted(_)));
    ctx.budget.add_record(&outcome);
    ctx.batch.outcomes.push(outcome);
    let next = ctx.batch.outcomes.len();
    let Some((key, offset, timestamp_ms)) = ctx.batch.input(next) else {
        // Finished every input: a further `finish` or state call traps.
        ctx.in_record = false;
        return Ok(());
    };
    if ctx.budget.is_spent(&ctx.per_call, &ctx.txn) {
        return Err(ctx.cut("the batch reached a per-batch bound"));
    }
    if ctx.txn.observe(offset, timestamp_ms) {
        if ctx.batch.told {
            // An operator told of expiries is told before the record that makes them
            // due, which a call cannot be interrupted for. Calls are cut ahead where
            // stored entries come due; this is for the call's own writes.
            return Err(ctx.cut("a record makes state entries expire"));
        }
        // Nobody is told: they expire here, as many as the batch's bounds allow.
        loop {
            match ctx.txn.expire_next() {
                Ok(Some(_)) => ctx.budget.expiries += 1,
                Ok(None) => break,
                Err(error) => return Err(wasmtime::Error::from_anyhow(ctx.fail(error))),
            }
            if ctx.txn.due() && ctx.budget.is_spent(&ctx.per_call, &ctx.txn) {
                return Err(ctx.cut("the batch reached a per-batch bound between two expiries"));
            }
        }
    }
    ctx.txn.scope(key);
    ctx.forget_last_call();
    arm_deadline(store);
    Ok(())
}

/// The version every partition of this host runs: set by a deploy, followed by each
/// partition's [`WasmInstance`] at its next batch boundary.
pub struct ActiveVersion {
    /// Increases with every activation, so an instance sees a change with one load.
    generation: AtomicU64,
    current: Mutex<Arc<WasmOperator>>,
}

impl ActiveVersion {
    /// `operator` is active.
    pub fn new(operator: Arc<WasmOperator>) -> Arc<Self> {
        Arc::new(ActiveVersion { generation: AtomicU64::new(0), current: Mutex::new(operator) })
    }

    /// The active version and its generation.
    pub fn get(&self) -> (u64, Arc<WasmOperator>) {
        let current = self.current.lock().expect("no panics under this lock");
        (self.generation.load(Ordering::Acquire), current.clone())
    }

    /// The generation of the active version: it changes with every activation.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Makes `operator` the active version.
    pub fn activate(&self, operator: Arc<WasmOperator>) {
        let mut current = self.current.lock().expect("no panics under this lock");
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

/// One partition's instance of the [active version](ActiveVersion).
pub struct WasmInstance {
    operator: Arc<WasmOperator>,
    active: Arc<ActiveVersion>,
    /// The generation of the active version this instance last followed; `None` once
    /// it must look again whatever the generation (its replay ended, its switches are
    /// to be recorded).
    generation: Option<u64>,
    /// Its partition's switches of versions: those it replays, those it records.
    switches: Option<PartitionSwitches>,
    /// Always `Some` between calls; taken only while the instance is replaced.
    live: Option<Live>,
    /// How many times a trap replaced the instance.
    replaced: u64,
}

/// A live instance: its store (the partition's state and the limits' accounting inside)
/// and its exports.
struct Live {
    store: Store<HostCtx>,
    exports: Exports,
}

/// How a call into the guest ended, when the host did not fail.
struct Called<R> {
    /// What it returned, or its trap.
    result: wasmtime::Result<R>,
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
    fn call<P, R>(&mut self, func: Func, params: P, in_record: bool) -> Result<wasmtime::Result<R>>
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
    fn live(&mut self) -> &mut Live {
        self.live.as_mut().expect("instance is live between calls")
    }

    fn ctx(&mut self) -> &mut HostCtx {
        self.live().store.data_mut()
    }

    /// Whether `record`, whose `attempt`th call trapped for `reason`, gets another
    /// call: then it has waited the retry policy's backoff, and `attempt` counts the
    /// call to come.
    fn retry(&self, attempt: &mut u32, record: &SourceRecord, reason: &str) -> bool {
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
        let outcome = match live.call::<ExpiredParams<'_>, ProcessResults>(expired, params, true)? {
            Ok((result,)) => outcome_of(result, &self.operator.limits.per_call),
            Err(trap) => {
                self.state().end_record(false);
                return Ok(Outcome::Trapped { reason: self.replace_after(trap)?, attempts: 1 });
            }
        };
        self.state().end_record(matches!(outcome, Outcome::Emitted(_)));
        Ok(outcome)
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
        let outcome = super::process_scoped(self, record)?;
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
fn run_length(records: &[SourceRecord], bytes: usize) -> usize {
    let mut total = 0;
    let within = records.iter().take_while(|record| {
        let headers: usize = record.headers.iter().map(|(key, value)| key.len() + value.len()).sum();
        total += record.key.len() + record.value.len() + headers;
        total <= bytes
    });
    within.count().max(1)
}

/// `record`'s headers as the guest receives them, borrowing their bytes.
fn headers(record: &SourceRecord) -> Vec<types::Header<'_>> {
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

/// What a call that returned `result` did for its record: its outputs, or, when they
/// pass one of `limits`, a failure naming it (the instance did nothing wrong by its own
/// rules, and is kept), or the operator's error.
fn outcome_of(result: GuestResult, limits: &OperatorLimits) -> Outcome {
    let outputs = match result {
        Ok(GuestOutputs::Lifted(outputs)) => outputs,
        Ok(GuestOutputs::TooMany(count)) => {
            let reason = limit_passed("outputs_per_record", limits.outputs_per_record, count);
            return Outcome::Trapped { reason, attempts: 1 };
        }
        Ok(GuestOutputs::TooLarge(bytes)) => {
            let reason = limit_passed("output_bytes_per_record", limits.output_bytes_per_record, bytes);
            return Outcome::Trapped { reason, attempts: 1 };
        }
        Err(GuestReason(reason)) => return Outcome::Rejected(reason),
    };
    let foreign = outputs.iter().filter_map(|o| o.topic.as_ref()).find(|topic| !limits.output_topics.contains(topic));
    if let Some(topic) = foreign {
        let reason = format!(
            "operator sent an output to topic {topic:?}, which [operator.limits] output_topics = {:?} does not list",
            limits.output_topics
        );
        return Outcome::Trapped { reason: lift::cut_reason(reason, limits.reason_bytes), attempts: 1 };
    }
    Outcome::Emitted(outputs)
}

/// The reason a call failed: it reached `used` of something `[operator.limits] name`
/// allows `max` of.
fn limit_passed(name: &str, max: usize, used: usize) -> String {
    format!("operator passed its limit [operator.limits] {name} = {max} (reached {used})")
}

impl Operator for WasmInstance {
    fn process(&mut self, record: &SourceRecord) -> Result<Outcome> {
        let live = self.live();
        let headers = headers(record);
        let input = input_record(record, &headers);
        let process = live.exports.process;
        match live.call::<ProcessParams<'_>, ProcessResults>(process, (input,), true)? {
            Ok((result,)) => Ok(outcome_of(result, &self.operator.limits.per_call)),
            Err(trap) => Ok(Outcome::Trapped { reason: self.replace_after(trap)?, attempts: 1 }),
        }
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
}

impl WasmInstance {
    /// Follows `partition`'s switches in `log` from now on, its state resuming at
    /// offset `resume_at` and its outputs committed up to `covered`: replays the records
    /// before both with the versions that first processed them, then records each
    /// switch, beginning with the version it runs then. Fails when the log cannot be
    /// read or a version it names cannot be loaded.
    pub fn follow_switches(
        &mut self,
        log: &Arc<SwitchLog>,
        partition: u32,
        resume_at: u64,
        covered: u64,
    ) -> Result<()> {
        self.switches = Some(log.partition(partition, resume_at, covered, &self.operator)?);
        self.generation = None;
        Ok(())
    }

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

impl state::Host for HostCtx {
    fn get(&mut self, name: String) -> Result<Option<Vec<u8>>> {
        self.check_in_record("get")?;
        self.check_name(&name)?;
        self.usage.reads += 1;
        self.check_limit("reads_per_record", self.per_call.reads_per_record, self.usage.reads)?;
        self.txn.get(&name).map_err(|e| self.fail(e))
    }

    fn put(&mut self, name: String, value: Vec<u8>) -> Result<()> {
        self.check_in_record("put")?;
        self.check_write(&name, Some(&value))?;
        self.txn.put(&name, value);
        Ok(())
    }

    fn put_with_ttl(&mut self, name: String, value: Vec<u8>, ttl_ms: u64) -> Result<()> {
        self.check_in_record("put-with-ttl")?;
        if ttl_ms == 0 {
            // It would be due at once: an `expired` that puts it again would never end.
            bail!("put-with-ttl of {name:?} with a TTL of 0 ms: a TTL must be at least 1 ms");
        }
        self.check_write(&name, Some(&value))?;
        self.txn.put_with_ttl(&name, value, Duration::from_millis(ttl_ms));
        Ok(())
    }

    fn delete(&mut self, name: String) -> Result<()> {
        self.check_in_record("delete")?;
        self.check_write(&name, None)?;
        self.txn.delete(&name);
        Ok(())
    }
}

impl log::Host for HostCtx {
    fn log(&mut self, level: log::Level, message: String) -> Result<()> {
        // One line of the host's log, which the guest's text cannot break into two.
        let mut message = log_rate::one_line(&message).into_owned();
        if message.len() > self.per_call.log_line_bytes {
            let kept = message.floor_char_boundary(self.per_call.log_line_bytes);
            let cut = message.len() - kept;
            message.truncate(kept);
            message.push_str(&format!("… ({cut} more bytes cut: [operator.limits] log_line_bytes)"));
        }
        if !self.admit_log_line(message.len()) {
            // The panic message still explains a trap that follows.
            if level == log::Level::Error {
                self.last_error = Some(message);
            }
            return Ok(());
        }
        let (operator, partition) = (&*self.operator, self.partition);
        match level {
            log::Level::Trace => tracing::trace!(operator, partition, "{message}"),
            log::Level::Debug => tracing::debug!(operator, partition, "{message}"),
            log::Level::Info => tracing::info!(operator, partition, "{message}"),
            log::Level::Warn => tracing::warn!(operator, partition, "{message}"),
            log::Level::Error => {
                tracing::error!(operator, partition, "{message}");
                self.last_error = Some(message);
            }
        }
        Ok(())
    }
}

impl types::Host for HostCtx {}

/// The memory cap. Growing past it traps (and records why) rather than failing the
/// growth: a guest's allocator would abort through a denied stderr write, which would
/// hide the reason, and a guest that recovered would keep writes that a memory-limit
/// hit must discard.
///
/// The cap is the instance's, not one memory's: every linear memory and table of the
/// component (a table slot costs [`TABLE_SLOT_BYTES`]) counts against it, and the
/// number of core instances, memories and tables is bounded too.
impl ResourceLimiter for HostCtx {
    fn memory_growing(&mut self, current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        self.grow("linear memory", current, desired)
    }

    /// Growth past the memory's declared maximum, or refused by the system: a trap too.
    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        Err(error)
    }

    fn table_growing(&mut self, current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        self.grow("a table", current.saturating_mul(TABLE_SLOT_BYTES), desired.saturating_mul(TABLE_SLOT_BYTES))
    }

    fn table_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        Err(error)
    }

    fn instances(&self) -> usize {
        MAX_CORE_INSTANCES
    }

    fn memories(&self) -> usize {
        MAX_MEMORIES
    }

    fn tables(&self) -> usize {
        MAX_TABLES
    }
}

impl HostCtx {
    /// Forgets what the previous call (or record of a batched call) left behind: its
    /// trap's cause, its last error log line, a host failure, what it used of its
    /// limits.
    fn forget_last_call(&mut self) {
        (self.cause, self.last_error, self.host_error) = (None, None, None);
        self.usage = CallUsage::default();
    }

    /// Counts growing one of the instance's memories or tables from `current` to
    /// `desired` bytes; past the cap, traps and records why.
    fn grow(&mut self, what: &str, current: usize, desired: usize) -> wasmtime::Result<bool> {
        let total = (self.memory_used - current.min(self.memory_used)).saturating_add(desired);
        if total > self.memory_cap {
            self.cause = Some(Cause::MemoryCap);
            wasmtime::bail!(
                "growing {what} to {desired} bytes would take the instance to {total} bytes, past its cap of {}",
                self.memory_cap
            );
        }
        self.memory_used = total;
        Ok(true)
    }

    /// Traps, recording why, when the call has used more than `max` of what
    /// `[operator.limits] name` bounds.
    fn check_limit(&mut self, name: &str, max: usize, used: usize) -> Result<()> {
        if used > max {
            let reason = limit_passed(name, max, used);
            self.cause = Some(Cause::Limit(reason.clone()));
            bail!(reason);
        }
        Ok(())
    }

    fn check_name(&mut self, name: &str) -> Result<()> {
        self.check_limit("state_name_bytes", self.per_call.state_name_bytes, name.len())
    }

    /// Counts a write of `value` (`None`: a delete) under `name` against the limits.
    fn check_write(&mut self, name: &str, value: Option<&[u8]>) -> Result<()> {
        self.check_name(name)?;
        let bytes = value.map_or(0, <[u8]>::len);
        self.check_limit("state_value_bytes", self.per_call.state_value_bytes, bytes)?;
        self.usage.writes += 1;
        self.check_limit("writes_per_record", self.per_call.writes_per_record, self.usage.writes)?;
        self.usage.written_bytes += name.len() + bytes;
        self.check_limit("written_bytes_per_record", self.per_call.written_bytes_per_record, self.usage.written_bytes)
    }

    /// Whether a log line of `bytes` fits the instance's budget for this second. The
    /// first line that does not is warned about; how many did not, before the next line
    /// written.
    fn admit_log_line(&mut self, bytes: usize) -> bool {
        let (operator, partition, limits) = (&*self.operator, self.partition, &self.per_call);
        match self.log.admit(bytes) {
            Admitted::Yes { dropped: 0 } => true,
            Admitted::Yes { dropped } => {
                tracing::warn!(operator, partition, "{dropped} operator log lines were dropped");
                true
            }
            Admitted::No { first } => {
                if first {
                    tracing::warn!(
                        operator,
                        partition,
                        "operator passed [operator.limits] log_lines_per_s = {} or log_bytes_per_s = {}: its \
                         {LOG_LINES_DROPPED} for the rest of this second",
                        limits.log_lines_per_s,
                        limits.log_bytes_per_s
                    );
                }
                false
            }
        }
    }

    /// Traps a state call made outside a record.
    fn check_in_record(&self, call: &str) -> Result<()> {
        if !self.in_record {
            bail!(
                "state.{call} called outside a record: state belongs to a record's key, so neither `init` nor \
                 `process-batch` after its last `batch.finish` can use it"
            );
        }
        Ok(())
    }

    /// Ends the running `process-batch` call before its next input, for `why`: the trap
    /// that unwinds the guest, which the host knows for a cut (the instance is
    /// replaced, and the batch goes on from that input).
    fn cut(&mut self, why: &str) -> wasmtime::Error {
        (self.batch.cut, self.in_record) = (true, false);
        wasmtime::format_err!("`{PROCESS_BATCH}` cut before its next input: {why}")
    }

    /// Records a host failure and returns the trap that unwinds the guest.
    fn fail(&mut self, error: anyhow::Error) -> anyhow::Error {
        let trap = anyhow!("host failure: {error:#}");
        self.host_error = Some(error);
        trap
    }
}

/// Why a call trapped, in one line — the limit it hit, the panic message, or the
/// denied import, from what `ctx` recorded during the call — followed by wasmtime's
/// account with the guest's backtrace.
fn describe_trap(trap: wasmtime::Error, limits: &Limits, ctx: &mut HostCtx) -> String {
    let stopped = trap.downcast_ref::<wasmtime::Trap>().copied();
    // A recorded cause is where the call stopped; an error log line is only the last
    // thing the guest said, the panic message when it panicked.
    let reason = match (stopped, ctx.cause.take(), ctx.last_error.take()) {
        (_, Some(Cause::Deadline), _) => {
            format!("call exceeded its CPU deadline of {:?} ([operator] call_timeout_ms)", ctx.call_timeout)
        }
        (Some(wasmtime::Trap::OutOfFuel), _, _) => format!(
            "operator passed its limit [operator] instructions_per_call = {}",
            limits.instructions.unwrap_or_default()
        ),
        (_, Some(Cause::MemoryCap), _) => {
            format!("operator exceeded its memory limit of {} MiB", limits.memory_bytes >> 20)
        }
        (_, Some(Cause::Limit(reason)), _) => reason,
        (_, Some(Cause::DeniedImport(import)), _) => {
            format!(
                "operator called `{import}`, which the sandbox denies (no filesystem, network, clock, randomness or \
                 environment){}",
                instead_of(&import)
            )
        }
        (_, None, Some(panic)) => panic,
        (_, None, None) => trap.root_cause().to_string(),
    };
    // wasmtime's account ends with the guest's backtrace, as long as its stack was deep.
    lift::cut_reason(format!("{reason}\n{trap:#}"), limits.per_call.reason_bytes)
}

/// What an operator should use instead of denied WASI `import`, where there is a
/// usual reason to reach for it: a replay must decide exactly as the first run did,
/// so neither the clock nor randomness may decide anything.
fn instead_of(import: &str) -> &'static str {
    if import.starts_with("wasi:random/") {
        "; std's `HashMap::new()` and `HashSet::new()` seed themselves with randomness: use a `BTreeMap`, or a \
         `HashMap` with a fixed hasher (`HashMap::with_hasher(BuildHasherDefault::<DefaultHasher>::default())`)"
    } else if import.starts_with("wasi:clocks/") {
        "; for time use the record's event time (`record.timestamp_ms`), which a replay sees again"
    } else {
        ""
    }
}

/// Defines each function of the WASI interfaces `component` imports (the Rust
/// standard library links them in) as a trap that records which one was called; the
/// sandbox grants none of them. [`check_imports`] has refused any other kind of import.
fn deny_wasi(linker: &mut Linker<HostCtx>, engine: &Engine, component: &Component) -> Result<()> {
    for (name, import) in component.component_type().imports(engine) {
        let ComponentItem::ComponentInstance(interface) = import.ty else { continue };
        if !name.starts_with("wasi:") {
            continue;
        }
        let mut instance = linker.instance(name)?;
        for (export, item) in interface.exports(engine) {
            match item.ty {
                ComponentItem::ComponentFunc(_) => {
                    let function = format!("{name}#{export}");
                    instance.func_new(export, move |mut store, _, _, _| {
                        store.data_mut().cause = Some(Cause::DeniedImport(function.clone()));
                        wasmtime::bail!("`{function}` is denied by the sandbox")
                    })?;
                }
                // Handles of WASI resources never reach the guest: every function that
                // would make one traps.
                ComponentItem::Resource(_) => instance.resource(export, ResourceType::host::<()>(), |_, _| Ok(()))?,
                _ => {}
            }
        }
    }
    Ok(())
}

/// Checks the 8-byte preamble: `\0asm`, then the component-model version and layer.
fn check_component_header(bytes: &[u8]) -> Result<()> {
    match bytes.get(..8) {
        Some([0, b'a', b's', b'm', _, _, 1, 0]) => Ok(()),
        Some([0, b'a', b's', b'm', 1, 0, 0, 0]) => bail!(
            "is a core WebAssembly module, not a component; build the operator with \
             `cargo build --target wasm32-wasip2`, which produces a component"
        ),
        _ => bail!("is not a WebAssembly file (it does not start with the `\\0asm` preamble)"),
    }
}

/// Refuses imports the sandbox cannot satisfy, naming each.
fn check_imports(engine: &Engine, component: &Component) -> Result<()> {
    for (name, item) in component.component_type().imports(engine) {
        if let Some(rest) = name.strip_prefix(WIT_PACKAGE).and_then(|r| r.strip_prefix('/')) {
            let version = rest.split_once('@').map(|(_, v)| v).unwrap_or("");
            if version.split('.').take(2).collect::<Vec<_>>().join(".") != WIT_VERSION {
                bail!(
                    "imports `{name}`: built against {WIT_PACKAGE}@{version}, but this host serves \
                     {WIT_PACKAGE}@{WIT_VERSION}.x; rebuild it against a compatible guest SDK"
                );
            }
        } else if !name.starts_with("wasi:") || !matches!(item.ty, ComponentItem::ComponentInstance(_)) {
            bail!(
                "imports `{name}`, which the sandbox does not provide; operators may import only \
                 {WIT_PACKAGE}@{WIT_VERSION}.x interfaces (WASI interfaces link, but every call traps)"
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::PartitionStore;

    /// A record asking the probe to do `action` (a JSON object's fields) for `key`.
    fn probe_record(offset: u64, key: &str, action: &str) -> SourceRecord {
        let value = format!("{{{action}}}").into_bytes();
        SourceRecord { partition: 0, offset, key: key.as_bytes().to_vec(), value, timestamp_ms: 0, headers: Vec::new() }
    }

    /// Has the probe do `action` for the record at `offset`, one call per record.
    fn call(instance: &mut WasmInstance, offset: u64, action: &str) -> Result<Outcome> {
        let record = probe_record(offset, "k", &format!(r#""action":"{action}""#));
        Ok(crate::operator::process_each(instance, &[record])?.remove(0))
    }

    fn probe(limits: Limits, dir: &Path) -> Result<WasmInstance> {
        let probe = Arc::new(WasmOperator::load(&sluice_tests::operator_wasm("probe"), limits, Vec::new())?);
        let txn = Transaction::new(PartitionStore::open(dir, 0)?, 1 << 20)?;
        let instance = ActiveVersion::new(probe).instantiate(0, txn)?;
        assert!(
            instance.operator.exports.process_batch.is_some(),
            "the probe is built against 0.1.1 and takes batches"
        );
        Ok(instance)
    }

    /// Each outcome in one line: the output, or how the record failed and the first
    /// line of why.
    fn outcome_lines(outcomes: &[Outcome]) -> Vec<String> {
        let first_line = |reason: &str| reason.lines().next().unwrap_or_default().to_string();
        outcomes
            .iter()
            .map(|outcome| match outcome {
                Outcome::Emitted(outputs) => String::from_utf8_lossy(&outputs[0].value).into_owned(),
                Outcome::Rejected(reason) => format!("rejected: {}", first_line(reason)),
                Outcome::Trapped { reason, .. } => format!("trapped: {}", first_line(reason)),
                Outcome::NullKey => "no key".to_string(),
            })
            .collect()
    }

    #[test]
    fn a_batched_call_costs_a_failing_or_trapping_record_only_its_own_writes() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let mut instance = probe(
            Limits { call_timeout: Some(Duration::from_millis(300)), memory_bytes: 16 << 20, ..Limits::default() },
            dir.path(),
        )?;
        let actions = [
            ("a", "count"),
            ("a", "count"),
            ("a", "put-then-panic"),
            ("b", "count"),
            ("a", "count"),
            ("a", "put-then-fail"),
            ("a", "spin"),
            ("a", "count"),
            ("b", "count"),
            ("a", "hog"),
            ("a", "count"),
        ];
        let records: Vec<SourceRecord> = (0..)
            .zip(actions)
            .map(|(offset, (key, action))| probe_record(offset, key, &format!(r#""action":"{action}""#)))
            .collect();
        let outcomes = instance.process_batch(&records)?.outcomes;
        let lines = outcome_lines(&outcomes);
        // Each count is one more than the last good record of its key left: no record
        // ran twice, and no failed record's write (a count of 1,000,000) was seen.
        let expected = [
            r#"{"count":1}"#,
            r#"{"count":2}"#,
            "trapped: panicked at ",
            r#"{"count":1}"#,
            r#"{"count":3}"#,
            "rejected: probe fails after a write",
            "trapped: call exceeded its CPU deadline of 300ms",
            r#"{"count":4}"#,
            r#"{"count":2}"#,
            "trapped: operator exceeded its memory limit of 16 MiB",
            r#"{"count":5}"#,
        ];
        assert_eq!(lines.len(), expected.len(), "{lines:#?}");
        for (line, expected) in lines.iter().zip(expected) {
            assert!(line.starts_with(expected), "{line:?} is not {expected:?} in {lines:#?}");
        }
        Ok(())
    }

    #[test]
    fn a_call_past_one_of_its_limits_fails_naming_it_and_keeps_none_of_its_writes() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let per_call = OperatorLimits {
            outputs_per_record: 10,
            output_bytes_per_record: 1_000,
            writes_per_record: 5,
            written_bytes_per_record: 1_500,
            reads_per_record: 20,
            state_value_bytes: 500,
            state_name_bytes: 16,
            output_topics: vec!["alerts".into()],
            ..OperatorLimits::default()
        };
        let mut instance = probe(Limits { per_call, ..Limits::default() }, dir.path())?;
        let passed = |limit: &str| format!("trapped: operator passed its limit [operator.limits] {limit}");
        let cases = [
            (r#""action":"count""#, r#"{"count":1}"#.to_string()),
            (r#""action":"outputs","count":10,"bytes":10"#, r#""oooooooooo""#.to_string()),
            (r#""action":"outputs","count":11,"bytes":1"#, passed("outputs_per_record = 10 (reached 11)")),
            (r#""action":"outputs","count":1,"bytes":1000"#, passed("output_bytes_per_record = 1000")),
            (r#""action":"outputs","count":1,"bytes":1,"topic":"alerts""#, r#""o""#.to_string()),
            (
                r#""action":"outputs","count":1,"bytes":1,"topic":"positions""#,
                r#"trapped: operator sent an output to topic "positions", which [operator.limits] output_topics"#
                    .to_string(),
            ),
            // Four writes and the count's: five.
            (r#""action":"writes","count":4,"bytes":100"#, r#"{"count":2}"#.to_string()),
            (r#""action":"writes","count":5,"bytes":10"#, passed("writes_per_record = 5 (reached 6)")),
            (r#""action":"writes","count":1,"bytes":500"#, passed("state_value_bytes = 500")),
            (r#""action":"writes","count":4,"bytes":450"#, passed("written_bytes_per_record = 1500")),
            (r#""action":"name","bytes":17"#, passed("state_name_bytes = 16 (reached 17)")),
            // Twenty reads and the count's.
            (r#""action":"reads","count":20"#, passed("reads_per_record = 20 (reached 21)")),
            (r#""action":"count""#, r#"{"count":3}"#.to_string()),
        ];
        let records: Vec<SourceRecord> =
            (0..).zip(&cases).map(|(offset, (action, _))| probe_record(offset, "a", action)).collect();
        let lines = outcome_lines(&instance.process_batch(&records)?.outcomes);
        assert_eq!(lines.len(), cases.len(), "{lines:#?}");
        for (line, (action, expected)) in lines.iter().zip(&cases) {
            assert!(line.starts_with(expected.as_str()), "{action}: {line:?} is not {expected:?}");
        }
        // None of the failed records' writes stand.
        instance.state().scope(b"a");
        assert!(instance.state().get("w0")?.is_some(), "the good record's write stands");
        assert_eq!(instance.state().get("w4")?, None);
        instance.state().end_record(false);
        Ok(())
    }

    /// A record at event time `timestamp_ms` asking the probe to do `action`.
    fn timed(offset: u64, key: &str, timestamp_ms: i64, action: &str) -> SourceRecord {
        SourceRecord { timestamp_ms, ..probe_record(offset, key, action) }
    }

    #[test]
    fn expired_runs_before_the_record_that_reaches_the_expiry_scoped_to_its_key() -> Result<()> {
        const T0: i64 = 1_700_000_000_000;
        let dir = tempfile::tempdir()?;
        let mut instance = probe(
            Limits { call_timeout: Some(Duration::from_secs(5)), memory_bytes: 16 << 20, ..Limits::default() },
            dir.path(),
        )?;
        let remember = |name: &str| format!(r#""action":"remember","name":"{name}","value":"v-{name}","ttl_ms":1000"#);
        let records = [
            timed(0, "a", T0, &remember("n")),
            timed(1, "b", T0, &remember("fail-n")),
            timed(2, "c", T0, &remember("trap-n")),
            timed(3, "z", T0 + 999, r#""action":"count""#),
            // Reaches T0 + 1000: the three expire before it, in one batched call.
            timed(4, "z", T0 + 1_000, r#""action":"count""#),
            timed(5, "a", T0 + 1_000, r#""action":"peek","name":"expiries""#),
            timed(6, "b", T0 + 1_000, r#""action":"peek","name":"expiries""#),
            timed(7, "a", T0 + 1_000, r#""action":"peek","name":"n""#),
        ];
        let processed = instance.process_batch(&records)?;
        assert_eq!(processed.outcomes.len(), records.len());
        let expirations: Vec<(String, u64, u64, String)> = processed
            .expirations
            .iter()
            .map(|e| {
                let key = String::from_utf8_lossy(&e.entry.key).into_owned();
                (key, e.offset, e.entry.expired_at_ms, outcome_lines(std::slice::from_ref(&e.outcome)).remove(0))
            })
            .collect();
        let at = (T0 + 1_000) as u64;
        assert_eq!(expirations.len(), 3, "{expirations:#?}");
        assert_eq!(
            expirations[0],
            ("a".into(), 4, at, format!(r#"{{"at":{at},"expired":"n","expiries":1,"value":"v-n"}}"#))
        );
        assert_eq!(expirations[1], ("b".into(), 4, at, "rejected: probe fails on the expiry of fail-n".to_string()));
        assert!(expirations[2].3.starts_with("trapped: panicked at "), "{expirations:#?}");
        match &processed.expirations[2].outcome {
            Outcome::Trapped { reason, .. } => {
                assert!(reason.contains("probe panics on the expiry of trap-n"), "{reason}")
            }
            other => bail!("{other:?}"),
        }
        // The handler's write stands for `a` and is gone for `b`; the entries are gone.
        let lines = outcome_lines(&processed.outcomes[5..]);
        assert_eq!(
            lines,
            [r#"{"name":"expiries","value":1}"#, r#"{"name":"expiries","value":null}"#, r#"{"name":"n","value":null}"#]
        );
        instance.state().commit(8)?;
        assert_eq!(instance.state().expired(), 3);
        Ok(())
    }

    #[test]
    fn finish_outside_a_batched_call_traps_and_moves_nothing() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let mut instance = probe(
            Limits { call_timeout: Some(Duration::from_secs(1)), memory_bytes: 16 << 20, ..Limits::default() },
            dir.path(),
        )?;
        // A batch ran before: had its keys been kept, `finish` would move to one.
        instance.process_batch(&[
            probe_record(0, "a", r#""action":"count""#),
            probe_record(1, "b", r#""action":"count""#),
        ])?;
        let live = instance.live();
        // As inside `process`: a record in hand, no batch running.
        live.store.data_mut().in_record = true;
        live.store.data_mut().txn.scope(b"k");
        let trap = finish(live.store.as_context_mut(), (Ok(GuestOutputs::Lifted(Vec::new())),)).unwrap_err();
        assert!(trap.to_string().contains("batch.finish called outside `process-batch`"), "{trap}");
        assert!(live.store.data().batch.outcomes.is_empty(), "no outcome recorded");
        Ok(())
    }

    #[test]
    fn a_batch_larger_than_the_memory_cap_is_split_into_calls_that_fit() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let mut instance = probe(
            Limits { call_timeout: Some(Duration::from_secs(5)), memory_bytes: 16 << 20, ..Limits::default() },
            dir.path(),
        )?;
        // 24 MiB of inputs: more than the guest's whole memory, so in one call they
        // would trap while being copied in.
        let padding = "x".repeat(1 << 20);
        let records: Vec<SourceRecord> = (0..24)
            .map(|offset| probe_record(offset, "k", &format!(r#""action":"count","padding":"{padding}""#)))
            .collect();
        assert_eq!(run_length(&records, 16 << 20 >> 3), 1, "a run holds what an eighth of the cap holds");
        let expected: Vec<String> = (1..=24).map(|count| format!(r#"{{"count":{count}}}"#)).collect();
        assert_eq!(outcome_lines(&instance.process_batch(&records)?.outcomes), expected);
        Ok(())
    }

    #[test]
    fn the_deadline_bounds_each_record_of_a_batched_call_not_the_call() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let timeout = Duration::from_secs(1);
        let limits =
            Limits { call_timeout: Some(timeout), instructions: None, memory_bytes: 16 << 20, ..Limits::default() };
        let mut instance = probe(limits, dir.path())?;
        let work = |offset, iterations: u64| {
            probe_record(offset, "k", &format!(r#""action":"work","iterations":{iterations}"#))
        };
        // How many iterations take a tenth of the deadline here: ten times the margin
        // for a loaded machine.
        let started = Instant::now();
        instance.process_batch(&[work(0, 20_000_000)])?;
        let iterations = (20_000_000.0 * (timeout / 10).as_secs_f64() / started.elapsed().as_secs_f64()) as u64;

        let records: Vec<SourceRecord> = (1..=20).map(|offset| work(offset, iterations)).collect();
        let started = Instant::now();
        let lines = outcome_lines(&instance.process_batch(&records)?.outcomes);
        assert!(
            started.elapsed() > timeout,
            "the call must outlast one record's deadline for this test to mean anything"
        );
        let expected: Vec<String> = (2..=21).map(|count| format!(r#"{{"count":{count}}}"#)).collect();
        assert_eq!(lines, expected);
        Ok(())
    }

    /// The deadline counts the thread's CPU time, not the wall clock: a record that
    /// needs half its deadline of CPU finishes though its thread gets a quarter of a
    /// core (three busy threads share its core), taking twice the deadline in wall time.
    #[test]
    fn a_record_within_its_cpu_deadline_is_not_stopped_on_a_loaded_host() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let timeout = Duration::from_millis(400);
        let limits = Limits { call_timeout: Some(timeout), memory_bytes: 16 << 20, ..Limits::default() };
        let mut instance = probe(limits, dir.path())?;
        let work = |offset, iterations: u64| {
            probe_record(offset, "k", &format!(r#""action":"work","iterations":{iterations}"#))
        };
        let cpu = thread_cpu();
        instance.process_batch(&[work(0, 20_000_000)])?;
        let iterations = (20_000_000.0 * (timeout / 2).as_secs_f64() / (thread_cpu() - cpu).as_secs_f64()) as u64;

        let pin_to_first_core = || {
            // SAFETY: a zeroed cpu_set_t is an empty set; the calls only read it.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(0, &mut set);
                assert_eq!(libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set), 0);
            }
        };
        pin_to_first_core();
        let stop = std::sync::atomic::AtomicBool::new(false);
        let (outcomes, took) = std::thread::scope(|scope| {
            for _ in 0..3 {
                scope.spawn(|| {
                    pin_to_first_core();
                    while !stop.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                });
            }
            let started = Instant::now();
            let outcomes = instance.process_batch(&[work(1, iterations)]);
            stop.store(true, Ordering::Relaxed);
            (outcomes, started.elapsed())
        });
        let lines = outcome_lines(&outcomes?.outcomes);
        assert!(took > timeout, "the record must outlast its deadline in wall time for this test to mean anything");
        assert_eq!(lines, [r#"{"count":2}"#]);
        Ok(())
    }

    /// The instruction limit is what a replay reproduces: a record past it fails on
    /// every attempt, one within it never does, however loaded the machine — and, like
    /// the deadline, it bounds each record of a batched call, not the call.
    #[test]
    fn the_instruction_limit_bounds_each_record_the_same_way_every_time() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let limits = Limits {
            call_timeout: Some(Duration::from_secs(60)),
            instructions: Some(10_000_000),
            memory_bytes: 16 << 20,
            ..Limits::default()
        };
        let mut instance = probe(limits, dir.path())?;
        let work = |offset, iterations: u64| {
            probe_record(offset, "k", &format!(r#""action":"work","iterations":{iterations}"#))
        };
        let trapped = |outcomes: &[Outcome]| {
            matches!(&outcomes[0], Outcome::Trapped { reason, .. } if reason.starts_with(
                "operator passed its limit [operator] instructions_per_call = 10000000"
            ))
        };
        // The fewest iterations, to a factor of two, that pass the limit.
        let mut too_many = 1;
        while !trapped(&instance.process_batch(&[work(0, too_many)])?.outcomes) {
            too_many *= 2;
        }
        for attempt in 0..3 {
            assert!(trapped(&instance.process_batch(&[work(attempt, too_many)])?.outcomes), "attempt {attempt}");
            let within = instance.process_batch(&[work(attempt, too_many / 4)])?.outcomes;
            assert!(matches!(&within[0], Outcome::Emitted(_)), "attempt {attempt}: {within:?}");
        }
        // Twenty records of a quarter each: five times the limit in one call.
        let records: Vec<SourceRecord> = (10..30).map(|offset| work(offset, too_many / 4)).collect();
        let outcomes = instance.process_batch(&records)?.outcomes;
        assert!(outcomes.iter().all(|o| matches!(o, Outcome::Emitted(_))), "{:#?}", outcome_lines(&outcomes));
        Ok(())
    }

    fn count(instance: &mut WasmInstance, offset: u64) -> Result<Vec<u8>> {
        match call(instance, offset, "count")? {
            Outcome::Emitted(outputs) => Ok(outputs[0].value.clone()),
            other => bail!("count failed: {other:?}"),
        }
    }

    /// A leaky operator's instance fills up and traps at the memory cap on a record a
    /// fresh instance handles: with a retry that record is processed once, in the fresh
    /// instance, its count following the last; without, it fails after one call and
    /// its key's count skips it. Either way the records after it go on.
    #[test]
    fn a_record_that_traps_once_is_processed_exactly_once_by_its_retry() -> Result<()> {
        for (attempts, batched) in [(2, true), (2, false), (1, true)] {
            let dir = tempfile::tempdir()?;
            let retry = RetryPolicy { attempts, backoff: Duration::from_millis(1), strict: false };
            let mut instance = probe(Limits { memory_bytes: 16 << 20, retry, ..Limits::default() }, dir.path())?;
            let leak = |offset| probe_record(offset, "k", r#""action":"leak","kib":3072"#);
            let records: Vec<SourceRecord> = (0..8).map(leak).collect();
            let outcomes = match batched {
                true => instance.process_batch(&records)?.outcomes,
                false => records.iter().map(|r| instance.process_batch(std::slice::from_ref(r))).try_fold(
                    Vec::new(),
                    |mut all, processed| {
                        all.extend(processed?.outcomes);
                        anyhow::Ok(all)
                    },
                )?,
            };
            let lines = outcome_lines(&outcomes);
            let trapped: Vec<u32> = outcomes
                .iter()
                .filter_map(|o| match o {
                    Outcome::Trapped { attempts, .. } => Some(*attempts),
                    _ => None,
                })
                .collect();
            if attempts == 2 {
                let expected: Vec<String> = (1..=8).map(|count| format!(r#"{{"count":{count}}}"#)).collect();
                assert_eq!(lines, expected, "batched: {batched}");
            } else {
                assert_eq!(trapped, [1], "{lines:#?}");
                let counts = lines.iter().filter(|line| line.starts_with(r#"{"count""#)).count();
                assert_eq!(counts, 7, "{lines:#?}");
                assert!(lines.last().is_some_and(|l| l == r#"{"count":7}"#), "{lines:#?}");
            }
            assert!(instance.replaced >= 1, "the leak must fill the instance for this test to mean anything");
        }
        Ok(())
    }

    /// A batch ends at the record that takes its outputs past `output_bytes_per_batch`,
    /// or its time past `time_per_batch_ms`: the outcomes are a prefix, and the rest runs
    /// as the next batch, its first record in a fresh call.
    #[test]
    fn a_batch_ends_early_at_its_output_or_time_bound() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let per_call = OperatorLimits { output_bytes_per_batch: 2_500, ..OperatorLimits::default() };
        let mut instance = probe(Limits { per_call, ..Limits::default() }, dir.path())?;
        let output = |offset| probe_record(offset, "k", r#""action":"outputs","count":1,"bytes":1000"#);
        let records: Vec<SourceRecord> = (0..10).map(output).collect();
        // 1,001 bytes a record (key and value): the third passes 2,500.
        assert_eq!(instance.process_batch(&records)?.outcomes.len(), 3);
        assert_eq!(instance.process_batch(&records[3..])?.outcomes.len(), 3);

        let per_call = OperatorLimits { time_per_batch_ms: 50, ..OperatorLimits::default() };
        let dir = tempfile::tempdir()?;
        let mut instance = probe(Limits { per_call, ..Limits::default() }, dir.path())?;
        let work = |offset| probe_record(offset, "w", r#""action":"work","iterations":30000000"#);
        let records: Vec<SourceRecord> = (0..10).map(work).collect();
        let started = Instant::now();
        let outcomes = instance.process_batch(&records)?.outcomes;
        assert!(outcomes.len() < records.len(), "{:?} for {} records", started.elapsed(), outcomes.len());
        let expected: Vec<String> = (1..=outcomes.len()).map(|count| format!(r#"{{"count":{count}}}"#)).collect();
        assert_eq!(outcome_lines(&outcomes), expected);
        Ok(())
    }

    /// In strict mode a record that still traps after its attempts stops the partition:
    /// the batch is an error naming the record's offset and the setting.
    #[test]
    fn strict_mode_makes_a_record_that_keeps_trapping_an_error() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let retry = RetryPolicy { attempts: 2, backoff: Duration::from_millis(1), strict: true };
        let mut instance = probe(Limits { memory_bytes: 16 << 20, retry, ..Limits::default() }, dir.path())?;
        let records = [probe_record(0, "k", r#""action":"count""#), probe_record(1, "k", r#""action":"hog""#)];
        let error = instance.process_batch(&records).expect_err("strict mode stops at the hog").to_string();
        assert!(
            error.starts_with("the record at offset 1 failed in 2 call(s), and [operator.retry] strict"),
            "{error}"
        );
        assert!(error.contains("memory limit of 16 MiB"), "{error}");
        Ok(())
    }

    #[test]
    fn a_trap_is_explained_by_what_the_host_recorded_in_that_call() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let mut instance = probe(
            Limits { call_timeout: Some(Duration::from_secs(5)), memory_bytes: 16 << 20, ..Limits::default() },
            dir.path(),
        )?;
        let expected = [
            ("hog", "operator exceeded its memory limit of 16 MiB"),
            // A cause explains only the call it was recorded in, not the next trap.
            ("put-then-panic", "panicked at "),
            ("read-env", "operator called `wasi:cli/environment@"),
            ("read-fs", "operator called `wasi:filesystem/"),
        ];
        for (offset, (action, reason)) in (0..).zip(expected) {
            match call(&mut instance, offset, action)? {
                Outcome::Trapped { reason: why, .. } => assert!(why.starts_with(reason), "{action}: {why}"),
                other => bail!("{action} did not trap: {other:?}"),
            }
        }
        assert_eq!(count(&mut instance, 4)?, br#"{"count":1}"#, "a fresh instance carries on, the panic's write gone");
        Ok(())
    }

    #[test]
    fn a_version_that_fails_to_start_on_a_partition_leaves_it_running_the_old_one() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let probe = sluice_tests::operator_wasm("probe");
        let limits = Limits::default();
        let good = Arc::new(WasmOperator::load(&probe, limits.clone(), Vec::new())?);
        let config = vec![("fail_init".to_string(), "true".to_string())];
        let failing = Arc::new(WasmOperator::compile("other@0", &std::fs::read(&probe)?, "test", limits, config)?);
        let active = ActiveVersion::new(good.clone());
        let mut instance = active.instantiate(0, Transaction::new(PartitionStore::open(dir.path(), 0)?, 1 << 20)?)?;
        assert_eq!(count(&mut instance, 0)?, br#"{"count":1}"#);

        // Not validated first, so it gets as far as a partition, which keeps its version.
        active.activate(failing.clone());
        let switch = instance.follow_deploys(1)?.expect("a new version is active");
        assert_eq!((switch.from.as_str(), switch.to.as_str()), (good.version(), failing.version()));
        assert!(switch.refused.as_deref().is_some_and(|r| r.contains("fail_init is set")), "{switch:?}");
        assert_eq!(instance.version(), good.version());
        assert!(instance.follow_deploys(1)?.is_none(), "a refused version is tried once");
        assert_eq!(count(&mut instance, 1)?, br#"{"count":2}"#, "the state is still there");

        active.activate(good.clone());
        assert!(instance.follow_deploys(2)?.is_none(), "already runs it");
        Ok(())
    }
}
