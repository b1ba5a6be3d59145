//! The limits every call of an operator runs under, and the bounds on what one
//! component instance may create.

use super::*;

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
    /// What a component's WASI imports get: traps, or the deterministic WASI.
    pub wasi: WasiGrant,
}

impl From<&OperatorConfig> for Limits {
    /// The limits `operator` configures.
    fn from(operator: &OperatorConfig) -> Self {
        Limits {
            call_timeout: Some(Duration::from_millis(operator.call_timeout_ms)),
            instructions: Some(operator.instructions_per_call).filter(|&n| n > 0),
            memory_bytes: (operator.memory_limit_mib as usize) << 20,
            per_call: operator.limits.clone(),
            retry: operator.retry.clone(),
            wasi: operator.wasi,
        }
    }
}

impl Default for Limits {
    /// The defaults of `[operator]`.
    fn default() -> Self {
        Limits::from(&OperatorConfig::for_path(Path::new("")))
    }
}

/// What one slot of a table costs the instance's memory budget: a reference, as wasmtime
/// holds it.
pub(super) const TABLE_SLOT_BYTES: usize = std::mem::size_of::<usize>();
/// The most core instances, linear memories and tables one component instance may
/// create: a Rust component built for wasm32-wasip2 has a handful of each.
pub(super) const MAX_CORE_INSTANCES: usize = 50;
pub(super) const MAX_MEMORIES: usize = 4;
pub(super) const MAX_TABLES: usize = 20;
/// The most WASI handles (streams, pollables) an instance given the deterministic WASI
/// may hold at once: a runtime holds a few; one that leaks them fails its call, rather
/// than growing the host's memory outside the instance's cap.
pub(super) const MAX_WASI_HANDLES: usize = 1024;
