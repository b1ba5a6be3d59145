//! The engines operators are compiled by, the epoch thread that drives call deadlines,
//! and the CPU clock a deadline is measured on.

use super::*;

/// How often the epoch advances; the granularity of call deadlines.
const EPOCH_TICK: Duration = Duration::from_millis(5);

/// The engines operators of this process are compiled by, one for each combination
/// of the two limits that change the compiled code: counting the instructions a call
/// executes (for operators with an instruction limit), and interrupting it at an epoch
/// deadline (for operators with a CPU deadline, which every job's have). The epochs
/// advance every [`EPOCH_TICK`], on one thread of their own.
struct Engines([Engine; 4]);

/// The engine an operator whose calls run under `limits` is compiled by.
pub(super) fn engine(limits: &Limits) -> Result<&'static Engine> {
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

/// The epoch ticks `time` takes, rounded up, plus the one under way.
pub(super) fn ticks(time: Duration) -> u64 {
    time.as_micros().div_ceil(EPOCH_TICK.as_micros()) as u64 + 1
}

pub(super) use crate::probes::thread_cpu;

/// Called when a record's wall-clock deadline passes. Reading the thread's CPU clock
/// for every record would cost it a system call, so the CPU time is counted from
/// here: the first time, the record gets its deadline again, from a mark of the
/// thread's CPU time; after that, it is stopped once it has used its deadline of CPU
/// since the mark, and otherwise waits for the rest. A record that used less CPU than
/// its deadline is never stopped; one that spins is stopped after one to two times it.
pub(super) fn deadline_passed(mut store: StoreContextMut<'_, HostCtx>) -> wasmtime::Result<wasmtime::UpdateDeadline> {
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
pub(super) fn arm_deadline(mut store: impl AsContextMut<Data = HostCtx>) {
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
