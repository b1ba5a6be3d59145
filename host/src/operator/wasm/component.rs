//! Loading and validating a component: its header, its imports (only the sluice
//! interfaces and WASI, which is denied), its exports and their signatures, compiled
//! and pre-instantiated once per version.

use super::*;

/// A validated, compiled operator component, ready to instantiate per partition.
pub struct WasmOperator {
    pub(super) pre: OperatorPre<HostCtx>,
    /// The component's exports the host calls.
    pub(super) exports: ExportIndices,
    /// Where the component came from (a file, a deployed version), for errors.
    origin: String,
    pub(super) name: Arc<str>,
    pub(super) version: String,
    pub(super) limits: Limits,
    pub(super) config: Vec<(String, String)>,
}

impl WasmOperator {
    /// Reads, validates and compiles the component at `path`, named after the file.
    pub fn load(path: &Path, limits: Limits, config: Vec<(String, String)>) -> Result<Self> {
        let bytes = std::fs::read(path).with_context(|| format!("reading operator {}", path.display()))?;
        let name = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        Self::compile(&crate::operator::version_of(&name, &bytes), &bytes, &path.display().to_string(), limits, config)
    }

    /// Validates and compiles `component`, the build `version` (`name@digest`, as its
    /// registry names it: see [`Registry::version_of`](crate::operator::registry::Registry::version_of))
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
        let compiled = compiled::compile(engine, component)
            .with_context(|| format!("operator {origin}: not a valid WebAssembly component"))?;
        check_imports(engine, &compiled).with_context(|| format!("operator {origin}"))?;

        let mut linker = Linker::<HostCtx>::new(engine);
        if limits.wasi == WasiGrant::Deterministic {
            wasi::add_to_linker(&mut linker)?;
        }
        Bindings::add_to_linker::<HostCtx, HasSelf<HostCtx>>(&mut linker, |ctx| ctx)?;
        linker.instance(BATCH_INTERFACE)?.func_wrap("finish", finish)?;
        let mut timers = linker.instance(TIMERS_INTERFACE)?;
        timers.func_wrap("set", set_timer)?;
        timers.func_wrap("cancel", cancel_timer)?;
        timers.func_wrap("now", clock_now)?;
        timers.func_wrap("mark-late", mark_late)?;
        deny_wasi(&mut linker, engine, &compiled, limits.wasi)?;
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
        let exports = ExportIndices {
            init,
            process,
            process_batch: export(PROCESS_BATCH),
            expired: export(EXPIRED),
            fired: export(FIRED),
        };
        let (origin, name) = (origin.to_string(), crate::operator::name_of(version).into());
        Ok(WasmOperator { pre, exports, origin, name, version: version.into(), limits, config })
    }

    /// The operator's name, used in logs and dead letters.
    pub fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// The operator's version, `name@digest` of its component (see
    /// [`version_of`](crate::operator::version_of)): names exactly which build wrote a checkpoint's
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

    pub(super) fn context(&self, partition: u32, txn: Transaction) -> HostCtx {
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
            in_callback: false,
            late: false,
            batch: Batch::default(),
            budget: BatchBudget::new(&self.limits.per_call),
            lift_bounds: LiftBounds {
                outputs: self.limits.per_call.outputs_per_record,
                output_bytes: self.limits.per_call.output_bytes_per_record,
                reason_bytes: self.limits.per_call.reason_bytes,
            },
            wasi: None,
        }
    }

    /// Instantiates the component over `ctx` and calls its `init`. On failure `ctx`
    /// (the partition's state) comes back with the error.
    #[expect(clippy::result_large_err, reason = "a failed start is rare; the context is moved back, not copied")]
    pub(super) fn start(&self, mut ctx: HostCtx) -> std::result::Result<Live, (anyhow::Error, HostCtx)> {
        // A context moved over from an earlier instance must not lend it a stale reason,
        // nor count the earlier instance's memory.
        ctx.forget_last_call();
        ctx.memory_used = 0;
        // Nor its WASI handles, or another version's seeds.
        ctx.grant_wasi(self.limits.wasi, &self.version);
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
    pub(super) fn instantiate(&self, store: &mut Store<HostCtx>) -> Result<Exports> {
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
            fired: indices.fired.as_ref().map(|i| export(i, FIRED)).transpose()?,
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
        if let Some(func) = exports.fired {
            check(func.typed::<FiredParams<'_>, ProcessResults>(&*store).map(drop), FIRED, "timed-operator")?;
        }
        Ok(exports)
    }
}

/// Where a component's exports are, found when it was compiled.
pub(super) struct ExportIndices {
    pub(super) init: ComponentExportIndex,
    pub(super) process: ComponentExportIndex,
    pub(super) process_batch: Option<ComponentExportIndex>,
    pub(super) expired: Option<ComponentExportIndex>,
    pub(super) fired: Option<ComponentExportIndex>,
}

/// An instance's exports, each checked when the instance was made to have the
/// signature its type alias above says: [`Live::call`] calls them without a check.
#[derive(Clone, Copy)]
pub(super) struct Exports {
    pub(super) init: Func,
    pub(super) process: Func,
    /// When the component exports it (0.1.1).
    pub(super) process_batch: Option<Func>,
    /// When the component exports it (0.1.2).
    pub(super) expired: Option<Func>,
    /// When the component exports it (0.1.3).
    pub(super) fired: Option<Func>,
}

impl Exports {
    /// Whether the component is told of expiries or timers (it exports `expired` or
    /// `fired`): the host then calls it for each before the record that makes it due,
    /// and cuts a batched call there.
    pub(super) fn told(&self) -> bool {
        self.expired.is_some() || self.fired.is_some()
    }
}

/// Defines each function of the WASI interfaces `component` imports (the Rust
/// standard library links them in) as a trap that records which one was called: all of
/// them, or under the deterministic WASI those it does not define. [`check_imports`] has
/// refused any other kind of import.
fn deny_wasi(linker: &mut Linker<HostCtx>, engine: &Engine, component: &Component, grant: WasiGrant) -> Result<()> {
    for (name, import) in component.component_type().imports(engine) {
        let ComponentItem::ComponentInstance(interface) = import.ty else { continue };
        if !name.starts_with("wasi:") || (grant == WasiGrant::Deterministic && wasi::provides(name)) {
            continue;
        }
        let mut instance = linker.instance(name)?;
        for (export, item) in interface.exports(engine) {
            match item.ty {
                ComponentItem::ComponentFunc(_) => deny_function(&mut instance, name, export)?,
                // Handles of WASI resources never reach the guest: every function that
                // would make one traps.
                ComponentItem::Resource(_) => instance.resource(export, ResourceType::host::<()>(), |_, _| Ok(()))?,
                _ => {}
            }
        }
    }
    Ok(())
}

/// Defines the function `export` of the WASI interface `interface` in `instance` as a
/// trap that records which one was called.
pub(super) fn deny_function(instance: &mut LinkerInstance<'_, HostCtx>, interface: &str, export: &str) -> Result<()> {
    let function = format!("{interface}#{export}");
    instance.func_new(export, move |mut store, _, _, _| {
        store.data_mut().cause = Some(Cause::DeniedImport(function.clone()));
        wasmtime::bail!("`{function}` is denied by the sandbox")
    })?;
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
                 {WIT_PACKAGE}@{WIT_VERSION}.x interfaces (WASI interfaces link, but every call traps unless [operator] wasi = \"deterministic\")"
            );
        }
    }
    Ok(())
}
