//! What a call's end becomes for its record: the outcome of a returned result, and the
//! one-line reason of a trap (the limit it hit, the panic message, the denied import).

use super::*;

/// What a call that returned `result` did for its record: its outputs, or, when they
/// pass one of `limits`, a failure naming it (the instance did nothing wrong by its own
/// rules, and is kept), or the operator's error — a late record's when the call marked
/// its record `late`.
pub(super) fn outcome_of(result: GuestResult, limits: &OperatorLimits, late: bool) -> Outcome {
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
        Err(GuestReason(reason)) if late => return Outcome::Late(reason),
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
pub(super) fn limit_passed(name: &str, max: usize, used: usize) -> String {
    format!("operator passed its limit [operator.limits] {name} = {max} (reached {used})")
}

/// Why a call trapped, in one line — the limit it hit, the panic message, or the
/// denied import, from what `ctx` recorded during the call — followed by wasmtime's
/// account with the guest's backtrace.
pub(super) fn describe_trap(trap: wasmtime::Error, limits: &Limits, ctx: &mut HostCtx) -> String {
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
        (_, Some(Cause::DeniedImport(import)), _) => match limits.wasi {
            WasiGrant::Deny => format!(
                "operator called `{import}`, which the sandbox denies (no filesystem, network, clock, randomness or \
                 environment){}; a build that needs WASI (componentize-py without -s) runs under [operator] wasi = \
                 \"deterministic\"",
                instead_of(&import)
            ),
            WasiGrant::Deterministic => format!(
                "operator called `{import}`, which the sandbox denies even under [operator] wasi = \"deterministic\" \
                 (no sleeping: an operator's time is its record's; no HTTP)"
            ),
        },
        (_, None, Some(panic)) => panic,
        (_, None, None) => match stubbed_wasi(&trap) {
            Some(Stub { function, how }) => format!(
                "operator called `{function}` {how}: the sandbox gives an operator no filesystem, network, clock, \
                 stdio or environment{}",
                instead_of_stub(function)
            ),
            None => trap.root_cause().to_string(),
        },
    };
    // wasmtime's account ends with the guest's backtrace, as long as its stack was deep.
    lift::cut_reason(format!("{reason}\n{trap:#}"), limits.per_call.reason_bytes)
}

/// A WASI function a build stubbed out with a trap, which a trap stopped in.
struct Stub<'a> {
    /// The function: a libc binding's name (`wall_clock_now`) or a WASI import's
    /// (`[constructor]fields`).
    function: &'a str,
    /// How the operator reached it, and which build stubbed it out.
    how: &'static str,
}

/// The WASI function a trap stopped in, when the trap is one a build stubbed out: an
/// `unreachable` at the top of the stack, where componentize-py's `-s` puts a function
/// that traps in place of each WASI import (in nameless code of a nameless module, called
/// from libc, whose WASI bindings are named after their functions) and componentize-js's
/// `-d` in place of each import of a feature it turns off (named after the import, in the
/// component model's syntax for a resource's functions, `[constructor]fields`, which no
/// compiled function's name starts with).
fn stubbed_wasi(trap: &wasmtime::Error) -> Option<Stub<'_>> {
    if trap.downcast_ref::<wasmtime::Trap>() != Some(&wasmtime::Trap::UnreachableCodeReached) {
        return None;
    }
    let frames = trap.downcast_ref::<wasmtime::WasmBacktrace>()?.frames();
    if let Some(function) = frames.first().and_then(|f| f.func_name()).filter(|name| name.starts_with('[')) {
        let how = "(WASI, through its JavaScript runtime), which this build leaves out with a trap \
                   (componentize-js -d)";
        return Some(Stub { function, how });
    }
    let nameless = frames.iter().take_while(|f| f.func_name().is_none() && f.module().name().is_none()).count();
    let caller = frames.get(nameless).filter(|_| nameless > 0)?;
    caller.module().name().filter(|module| module.starts_with("libc.so"))?;
    let how = "(WASI, through its libc), which this build stubs out with a trap (componentize-py -s)";
    Some(Stub { function: caller.func_name()?, how })
}

/// What an operator should use instead of the stubbed WASI function `function` (a libc
/// binding's name or a WASI import's), where there is a usual reason to reach for it.
fn instead_of_stub(function: &str) -> &'static str {
    if function.starts_with("wall_clock") || function.starts_with("monotonic_clock") {
        "; for time use the record's event time (`record.timestamp_ms`) or the partition's clock (`state.now()`), \
         which a replay sees again"
    } else if function.starts_with("stdout") || function.starts_with("stderr") {
        "; to log, use the SDK's `log`, whose lines the host names and bounds"
    } else if function.ends_with("]fields") || function.contains("request") {
        // wasi:http's: JavaScript's `fetch` builds its headers first.
        "; `fetch` has nothing behind it"
    } else {
        ""
    }
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
