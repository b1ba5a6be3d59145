//! The WebAssembly sandbox: loading, validating and running operator components.
//!
//! A [`WasmOperator`] is a validated, compiled component with its linker set up
//! (pre-instantiated, so an instance costs microseconds, not a compile). The
//! [`ActiveVersion`] says which one this host runs; it makes one [`WasmInstance`] per
//! partition, and each instance switches to a newly activated version between two
//! batches, keeping the partition's state. Instances get only the `sluice:operator`
//! imports (keyed state and logging). WASI imports that the Rust standard library
//! links in are defined as traps, so a guest that touches the filesystem, network,
//! clock or environment traps with the name of the function; any other import is
//! refused when the component is loaded. Each call runs under a CPU deadline (epoch
//! interruption) and a memory cap (a resource limiter). The host records why it
//! stopped a call — the memory cap, a denied import — as it happens, so a trap's
//! reason comes from that record, not from the wording of wasmtime's message.

use super::{Operator, Outcome, Output, Switch};
use crate::record::SourceRecord;
use crate::state::Transaction;
use anyhow::{Context, Result, anyhow, bail};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use wasmtime::component::types::ComponentItem;
use wasmtime::component::{Component, HasSelf, Linker, ResourceType};
use wasmtime::{Engine, ResourceLimiter, Store};

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

/// How often the epoch advances; the granularity of call deadlines.
const EPOCH_TICK: Duration = Duration::from_millis(5);

/// Limits every call of an operator runs under.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// Wall-clock deadline of one `process` or `init` call.
    pub call_timeout: Duration,
    /// The most linear memory an instance may hold, in bytes.
    pub memory_bytes: usize,
}

/// A validated, compiled operator component, ready to instantiate per partition.
pub struct WasmOperator {
    pre: OperatorPre<HostCtx>,
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
    /// The most linear memory the instance may hold, in bytes.
    memory_cap: usize,
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
}

/// Why the host stopped a call, recorded where it stops it: the trap that unwinds
/// the guest carries only a message.
#[derive(Debug, Clone, PartialEq)]
enum Cause {
    /// The instance tried to grow its linear memory past the cap.
    MemoryCap,
    /// The guest called a WASI function, which the sandbox denies; its full name
    /// (`wasi:cli/environment@0.2.6#get-environment`).
    DeniedImport(String),
}

/// The engine every operator of this process is compiled by. Its epoch advances
/// every [`EPOCH_TICK`] on a thread of its own, which is what call deadlines count.
fn engine() -> Result<&'static Engine> {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    if let Some(engine) = ENGINE.get() {
        return Ok(engine);
    }
    let mut config = wasmtime::Config::new();
    config.epoch_interruption(true);
    let engine = Engine::new(&config)?;
    let mut started = false;
    let engine = ENGINE.get_or_init(|| {
        started = true;
        engine
    });
    if started {
        std::thread::Builder::new().name("sluice-epoch".into()).spawn(|| {
            loop {
                engine.increment_epoch();
                std::thread::sleep(EPOCH_TICK);
            }
        })?;
    }
    Ok(engine)
}

impl WasmOperator {
    /// Reads, validates and compiles the component at `path`, named after the file.
    pub fn load(path: &Path, limits: Limits, config: Vec<(String, String)>) -> Result<Self> {
        let bytes = std::fs::read(path).with_context(|| format!("reading operator {}", path.display()))?;
        let name = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        Self::compile(&name, &bytes, &path.display().to_string(), limits, config)
    }

    /// Validates and compiles `component`, the build of operator `name` found at
    /// `origin` (a path or a deployed version, named in errors).
    ///
    /// Fails with an error naming `origin` when it is not a WebAssembly component, was
    /// built against another world or version, or imports anything but the sluice
    /// interfaces and WASI.
    pub fn compile(
        name: &str,
        component: &[u8],
        origin: &str,
        limits: Limits,
        config: Vec<(String, String)>,
    ) -> Result<Self> {
        check_component_header(component).with_context(|| format!("operator {origin}"))?;
        let engine = engine()?;
        let compiled = Component::new(engine, component)
            .map_err(anyhow::Error::from)
            .with_context(|| format!("operator {origin}: not a valid WebAssembly component"))?;
        check_imports(engine, &compiled).with_context(|| format!("operator {origin}"))?;

        let mut linker = Linker::<HostCtx>::new(engine);
        Bindings::add_to_linker::<HostCtx, HasSelf<HostCtx>>(&mut linker, |ctx| ctx)?;
        deny_wasi(&mut linker, engine, &compiled)?;
        // What is left: functions of a newer 0.1.x minor than this host serves. They
        // trap when called (with wasmtime's "unknown import"), so such a component
        // still runs as long as it does not call them.
        linker.define_unknown_imports_as_traps(&compiled)?;
        let pre =
            linker.instantiate_pre(&compiled).and_then(OperatorPre::new).map_err(anyhow::Error::from).with_context(
                || {
                    format!(
                        "operator {origin} does not implement the {WIT_PACKAGE}/operator@{WIT_VERSION} world (it must \
                     export `init` and `process` with the signatures in wit/operator.wit)"
                    )
                },
            )?;
        let version = super::version_of(name, component);
        Ok(WasmOperator { pre, origin: origin.to_string(), name: name.into(), version, limits, config })
    }

    /// The operator's name, used in logs and dead letters.
    pub fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// The operator's name and the [checksum](crate::checksum) of its component,
    /// `name@checksum`: names exactly which build wrote a checkpoint's state.
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
            cause: None,
            operator: self.name.clone(),
            partition,
            host_error: None,
            last_error: None,
            in_record: false,
        }
    }

    /// Instantiates the component over `ctx` and calls its `init`. On failure `ctx`
    /// (the partition's state) comes back with the error.
    #[expect(clippy::result_large_err, reason = "a failed start is rare; the context is moved back, not copied")]
    fn start(&self, mut ctx: HostCtx) -> std::result::Result<Live, (anyhow::Error, HostCtx)> {
        // A context moved over from an earlier instance must not lend it a stale reason.
        ctx.forget_last_call();
        let mut store = Store::new(self.pre.engine(), ctx);
        store.limiter(|ctx| ctx);
        self.arm_deadline(&mut store);
        let bindings = match self.pre.instantiate(&mut store) {
            Ok(bindings) => bindings,
            Err(e) => {
                let e = anyhow::Error::from(e).context(format!("instantiating operator {}", self.origin));
                return Err((e, store.into_data()));
            }
        };
        self.arm_deadline(&mut store);
        let config: Vec<(&str, &str)> = self.config.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let failure = match bindings.call_init(&mut store, &config) {
            Ok(Ok(())) => return Ok(Live { store, bindings }),
            Ok(Err(reason)) => anyhow!("operator {} refused to start: init returned an error: {reason}", self.origin),
            Err(trap) => {
                anyhow!(
                    "operator {} trapped in init: {}",
                    self.origin,
                    describe_trap(trap, &self.limits, store.data_mut())
                )
            }
        };
        Err((failure, store.into_data()))
    }

    fn arm_deadline(&self, store: &mut Store<HostCtx>) {
        let ticks = self.limits.call_timeout.as_micros().div_ceil(EPOCH_TICK.as_micros()) as u64 + 1;
        store.set_epoch_deadline(ticks);
    }
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
        Ok(WasmInstance { operator, active: self.clone(), generation, live: Some(live) })
    }
}

/// One partition's instance of the [active version](ActiveVersion).
pub struct WasmInstance {
    operator: Arc<WasmOperator>,
    active: Arc<ActiveVersion>,
    /// The generation of the active version this instance last followed.
    generation: u64,
    /// Always `Some` between calls; taken only while the instance is replaced.
    live: Option<Live>,
}

struct Live {
    store: Store<HostCtx>,
    bindings: Bindings,
}

impl WasmInstance {
    fn live(&mut self) -> &mut Live {
        self.live.as_mut().expect("instance is live between calls")
    }
}

impl Operator for WasmInstance {
    fn process(&mut self, record: &SourceRecord) -> Result<Outcome> {
        // Fields borrowed apart, so nothing is cloned per record.
        let live = self.live.as_mut().expect("instance is live between calls");
        self.operator.arm_deadline(&mut live.store);
        let input = InputRecord {
            key: &record.key,
            value: &record.value,
            timestamp_ms: record.timestamp_ms,
            partition: record.partition,
            offset: record.offset,
            headers: &[],
        };
        live.store.data_mut().forget_last_call();
        live.store.data_mut().in_record = true;
        let result = live.bindings.call_process(&mut live.store, input);
        live.store.data_mut().in_record = false;
        if let Some(error) = live.store.data_mut().host_error.take() {
            return Err(error);
        }
        match result {
            Ok(Ok(outputs)) => Ok(Outcome::Emitted(
                outputs.into_iter().map(|o| Output { key: o.key, value: o.value, topic: o.topic }).collect(),
            )),
            Ok(Err(reason)) => Ok(Outcome::Rejected(reason)),
            Err(trap) => {
                let reason = describe_trap(trap, &self.operator.limits, live.store.data_mut());
                // A trapped instance may hold broken invariants in its memory: replace it.
                let ctx = self.live.take().expect("instance is live").store.into_data();
                self.live = Some(self.operator.start(ctx).map_err(|(e, _)| e)?);
                Ok(Outcome::Trapped(reason))
            }
        }
    }

    fn state(&mut self) -> &mut Transaction {
        &mut self.live().store.data_mut().txn
    }

    fn version(&self) -> &str {
        self.operator.version()
    }

    fn follow_deploys(&mut self) -> Result<Option<Switch>> {
        if self.active.generation() == self.generation {
            return Ok(None);
        }
        let began = Instant::now();
        let (generation, next) = self.active.get();
        self.generation = generation;
        // Deployed and rolled back again before this partition looked.
        if next.version == self.operator.version {
            return Ok(None);
        }
        let from = self.operator.version.clone();
        let ctx = self.live.take().expect("instance is live between calls").store.into_data();
        match next.start(ctx) {
            Ok(live) => {
                self.live = Some(live);
                self.operator = next;
                Ok(Some(Switch { from, to: self.operator.version.clone(), stall: began.elapsed(), refused: None }))
            }
            // Validated before activation, so rare: keep running the old version here.
            Err((reason, ctx)) => {
                self.live = Some(self.operator.start(ctx).map_err(|(e, _)| e)?);
                let to = next.version.clone();
                Ok(Some(Switch { from, to, stall: began.elapsed(), refused: Some(format!("{reason:#}")) }))
            }
        }
    }
}

impl state::Host for HostCtx {
    fn get(&mut self, name: String) -> Result<Option<Vec<u8>>> {
        self.check_in_record("get")?;
        self.txn.get(&name).map_err(|e| self.fail(e))
    }

    fn put(&mut self, name: String, value: Vec<u8>) -> Result<()> {
        self.check_in_record("put")?;
        self.txn.put(&name, value);
        Ok(())
    }

    fn delete(&mut self, name: String) -> Result<()> {
        self.check_in_record("delete")?;
        self.txn.delete(&name);
        Ok(())
    }
}

impl log::Host for HostCtx {
    fn log(&mut self, level: log::Level, message: String) -> Result<()> {
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
impl ResourceLimiter for HostCtx {
    fn memory_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.memory_cap {
            self.cause = Some(Cause::MemoryCap);
            wasmtime::bail!("growing linear memory to {desired} bytes would pass the cap of {} bytes", self.memory_cap);
        }
        Ok(true)
    }

    /// Growth past the memory's declared maximum, or refused by the system: a trap too.
    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        Err(error)
    }

    // Tables are not capped (yet); wasmtime still enforces their declared maxima.
    fn table_growing(&mut self, _current: usize, _desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(true)
    }

    fn table_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        Err(error)
    }
}

impl HostCtx {
    /// Forgets what the previous call left behind: its trap's cause, its last error
    /// log line, a host failure.
    fn forget_last_call(&mut self) {
        (self.cause, self.last_error, self.host_error) = (None, None, None);
    }

    /// Traps a state call made outside `process`.
    fn check_in_record(&self, call: &str) -> Result<()> {
        if !self.in_record {
            bail!("state.{call} called outside `process`: state belongs to a record's key, so `init` cannot use it");
        }
        Ok(())
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
    let interrupted = matches!(trap.downcast_ref::<wasmtime::Trap>(), Some(wasmtime::Trap::Interrupt));
    // A recorded cause is where the call stopped; an error log line is only the last
    // thing the guest said, the panic message when it panicked.
    let reason = match (interrupted, ctx.cause.take(), ctx.last_error.take()) {
        (true, _, _) => format!("call exceeded its deadline of {:?}", limits.call_timeout),
        (_, Some(Cause::MemoryCap), _) => {
            format!("operator exceeded its memory limit of {} MiB", limits.memory_bytes >> 20)
        }
        (_, Some(Cause::DeniedImport(import)), _) => {
            format!(
                "operator called `{import}`, which the sandbox denies (no filesystem, network, clock or environment)"
            )
        }
        (_, None, Some(panic)) => panic,
        (_, None, None) => trap.root_cause().to_string(),
    };
    format!("{reason}\n{trap:#}")
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

    /// Has the probe do `action` for the record at `offset`, as the worker would.
    fn call(instance: &mut WasmInstance, offset: u64, action: &str) -> Result<Outcome> {
        let value = format!(r#"{{"action":"{action}"}}"#).into_bytes();
        let record = SourceRecord { partition: 0, offset, key: b"k".to_vec(), value, timestamp_ms: 0 };
        instance.state().begin_record(&record.key);
        let outcome = instance.process(&record)?;
        instance.state().end_record(matches!(outcome, Outcome::Emitted(_)));
        Ok(outcome)
    }

    fn count(instance: &mut WasmInstance, offset: u64) -> Result<Vec<u8>> {
        match call(instance, offset, "count")? {
            Outcome::Emitted(outputs) => Ok(outputs[0].value.clone()),
            other => bail!("count failed: {other:?}"),
        }
    }

    #[test]
    fn a_trap_is_explained_by_what_the_host_recorded_in_that_call() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let limits = Limits { call_timeout: Duration::from_secs(5), memory_bytes: 16 << 20 };
        let probe = Arc::new(WasmOperator::load(&sluice_tests::operator_wasm("probe"), limits, Vec::new())?);
        let txn = Transaction::new(PartitionStore::open(dir.path(), 0)?, 1 << 20)?;
        let mut instance = ActiveVersion::new(probe).instantiate(0, txn)?;
        let expected = [
            ("hog", "operator exceeded its memory limit of 16 MiB"),
            // A cause explains only the call it was recorded in, not the next trap.
            ("put-then-panic", "panicked at "),
            ("read-env", "operator called `wasi:cli/environment@"),
            ("read-fs", "operator called `wasi:filesystem/"),
        ];
        for (offset, (action, reason)) in (0..).zip(expected) {
            match call(&mut instance, offset, action)? {
                Outcome::Trapped(why) => assert!(why.starts_with(reason), "{action}: {why}"),
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
        let limits = Limits { call_timeout: Duration::from_secs(1), memory_bytes: 64 << 20 };
        let good = Arc::new(WasmOperator::load(&probe, limits.clone(), Vec::new())?);
        let config = vec![("fail_init".to_string(), "true".to_string())];
        let failing = Arc::new(WasmOperator::compile("other", &std::fs::read(&probe)?, "test", limits, config)?);
        let active = ActiveVersion::new(good.clone());
        let mut instance = active.instantiate(0, Transaction::new(PartitionStore::open(dir.path(), 0)?, 1 << 20)?)?;
        assert_eq!(count(&mut instance, 0)?, br#"{"count":1}"#);

        // Not validated first, so it gets as far as a partition, which keeps its version.
        active.activate(failing.clone());
        let switch = instance.follow_deploys()?.expect("a new version is active");
        assert_eq!((switch.from.as_str(), switch.to.as_str()), (good.version(), failing.version()));
        assert!(switch.refused.as_deref().is_some_and(|r| r.contains("fail_init is set")), "{switch:?}");
        assert_eq!(instance.version(), good.version());
        assert!(instance.follow_deploys()?.is_none(), "a refused version is tried once");
        assert_eq!(count(&mut instance, 1)?, br#"{"count":2}"#, "the state is still there");

        active.activate(good.clone());
        assert!(instance.follow_deploys()?.is_none(), "already runs it");
        Ok(())
    }
}
