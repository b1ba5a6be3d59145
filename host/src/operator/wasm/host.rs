//! The imports a guest calls: keyed state, timers, logging, `batch.finish`, and the
//! resource limiter that caps the instance's memories and tables. One room for all of them: each
//! is a thin check over [`HostCtx`](super::ctx::HostCtx), whose methods do the work.

use super::*;

/// `batch.finish`: ends the current input of the running `process-batch` call with
/// `result` and moves the record scope, and the deadline, to the next one — unless the
/// batch is spent, or the next input makes expiries due that the operator is told of,
/// which end the call here, by a trap the host knows for a cut.
pub(super) fn finish(mut store: StoreContextMut<'_, HostCtx>, (result,): (GuestResult,)) -> wasmtime::Result<()> {
    let ctx = store.data_mut();
    // Inside `process` (a component may import `batch` without exporting
    // `process-batch`) there is no next input to move to, only a past batch's keys.
    if !ctx.in_record || !ctx.batch.is_running() {
        wasmtime::bail!("batch.finish called outside `process-batch`");
    }
    let outcome = outcome_of(result, &ctx.per_call, ctx.late);
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
    if ctx.txn.observe(offset, key, timestamp_ms) {
        if ctx.batch.told {
            // An operator told of expiries (this version or its canary pair) is told
            // before the record that makes them due, which a call cannot be
            // interrupted for. Calls are cut ahead where stored entries come due; this
            // is for the call's own writes.
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
    wasi::enter_moment(&mut ctx.wasi, &ctx.txn, offset, key, "", timestamp_ms);
    ctx.forget_last_call();
    arm_deadline(store);
    Ok(())
}

/// `timers.set`: sets the current key's timer `name` to fire at `at_ms`, counted as a
/// state write. From `expired` or `fired`, a time the clock has reached traps: it would
/// come due at once, and a callback that sets it again would never end; and so does a
/// timer past `[operator.limits] timers_per_callback`, lest timers multiply as they
/// fire.
pub(super) fn set_timer(mut store: StoreContextMut<'_, HostCtx>, (name, at_ms): (String, u64)) -> wasmtime::Result<()> {
    store.data_mut().set_timer(&name, at_ms).map_err(wasmtime::Error::from_anyhow)
}

/// `timers.cancel`: cancels the current key's timer `name`, counted as a state write.
pub(super) fn cancel_timer(mut store: StoreContextMut<'_, HostCtx>, (name,): (String,)) -> wasmtime::Result<()> {
    store.data_mut().cancel_timer(&name).map_err(wasmtime::Error::from_anyhow)
}

/// `timers.now`: the partition's clock.
pub(super) fn clock_now(store: StoreContextMut<'_, HostCtx>, (): ()) -> wasmtime::Result<(u64,)> {
    Ok((store.data().txn.clock().now_ms(),))
}

/// `timers.mark-late`: the current record is late; an error it returns makes it a
/// `late` dead letter.
pub(super) fn mark_late(mut store: StoreContextMut<'_, HostCtx>, (): ()) -> wasmtime::Result<()> {
    let ctx = store.data_mut();
    ctx.check_in_record("timers.mark-late").map_err(wasmtime::Error::from_anyhow)?;
    ctx.late = true;
    Ok(())
}

impl HostCtx {
    fn set_timer(&mut self, name: &str, at_ms: u64) -> Result<()> {
        self.check_in_record("timers.set")?;
        self.check_write(name, None)?;
        let now = self.txn.clock().now_ms();
        if self.in_callback && at_ms <= now {
            bail!(
                "timers.set of {name:?} at {at_ms} from `expired` or `fired`, which the partition's clock ({now}) has \
                 reached: it would fire at once, and again from its own `fired`"
            );
        }
        if self.in_callback {
            self.usage.callback_timers += 1;
            self.check_limit("timers_per_callback", self.per_call.timers_per_callback, self.usage.callback_timers)?;
        }
        self.txn.set_timer(name, at_ms)
    }

    fn cancel_timer(&mut self, name: &str) -> Result<()> {
        self.check_in_record("timers.cancel")?;
        self.check_write(name, None)?;
        self.txn.cancel_timer(name);
        Ok(())
    }
}

impl state::Host for HostCtx {
    fn get(&mut self, name: String) -> Result<Option<Vec<u8>>> {
        self.check_in_record("state.get")?;
        self.check_name(&name)?;
        self.usage.reads += 1;
        self.check_limit("reads_per_record", self.per_call.reads_per_record, self.usage.reads)?;
        self.txn.get(&name).map_err(|e| self.fail(e))
    }

    fn put(&mut self, name: String, value: Vec<u8>) -> Result<()> {
        self.check_in_record("state.put")?;
        self.check_write(&name, Some(&value))?;
        self.txn.put(&name, value);
        Ok(())
    }

    fn put_with_ttl(&mut self, name: String, value: Vec<u8>, ttl_ms: u64) -> Result<()> {
        self.check_in_record("state.put-with-ttl")?;
        if ttl_ms == 0 {
            // It would be due at once: an `expired` that puts it again would never end.
            bail!("put-with-ttl of {name:?} with a TTL of 0 ms: a TTL must be at least 1 ms");
        }
        self.check_write(&name, Some(&value))?;
        self.txn.put_with_ttl(&name, value, Duration::from_millis(ttl_ms));
        Ok(())
    }

    fn delete(&mut self, name: String) -> Result<()> {
        self.check_in_record("state.delete")?;
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
