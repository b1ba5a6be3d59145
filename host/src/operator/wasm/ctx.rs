//! What the host functions see during a call ([`HostCtx`]): the partition's state, the
//! instance's limits and what the call used of them, the running batch and its budget,
//! and why the host stopped a call.

use super::*;

/// What the host functions see: the partition's state and the instance's limits.
pub(super) struct HostCtx {
    pub(super) txn: Transaction,
    /// The most memory the instance may hold, in bytes: linear memories and tables.
    pub(super) memory_cap: usize,
    /// What the instance's memories and tables hold now, in bytes.
    pub(super) memory_used: usize,
    /// What one call may make the host hold.
    pub(super) per_call: OperatorLimits,
    /// What the current call made the host hold so far.
    pub(super) usage: CallUsage,
    /// The instance's log lines, against [`OperatorLimits::log_lines_per_s`] and
    /// [`OperatorLimits::log_bytes_per_s`].
    pub(super) log: LogRate,
    /// Epoch ticks one record (or `init`) runs for before its thread's CPU time is
    /// looked at: the CPU deadline in wall-clock time; 0 without a deadline.
    pub(super) deadline_ticks: u64,
    /// The CPU deadline itself.
    pub(super) call_timeout: Duration,
    /// The thread's CPU time when the current record's wall-clock deadline first
    /// passed; `None` before.
    pub(super) cpu_mark: Option<Duration>,
    /// The instructions (fuel) one record (or `init`) may execute; `None`: uncounted.
    pub(super) instructions: Option<u64>,
    /// Why the host stopped the current call, when it did (see [`Cause`]).
    pub(super) cause: Option<Cause>,
    pub(super) operator: Arc<str>,
    pub(super) partition: u32,
    /// A failure of the host itself (RocksDB), raised as a trap to unwind the guest
    /// and reported by the worker as fatal rather than as the record's fault.
    pub(super) host_error: Option<anyhow::Error>,
    /// The guest's last error-level log line in the current call: the SDK's panic
    /// hook logs the panic message there just before the trap.
    pub(super) last_error: Option<String>,
    /// Whether a `process` call is running: state is scoped to its record's key and
    /// exists only there (an `init` that reached for state would see whichever key the
    /// partition's last record had).
    pub(super) in_record: bool,
    /// Whether the running call is `expired`'s or `fired`'s, where a timer the clock
    /// has reached may not be set.
    pub(super) in_callback: bool,
    /// Whether the current record was marked late (`timers.mark-late`).
    pub(super) late: bool,
    /// The running `process-batch` call's inputs and finished outcomes.
    pub(super) batch: Batch,
    /// Where the batch in hand stands against its bounds.
    pub(super) budget: BatchBudget,
    /// How much of a call's outputs and reasons is lifted out of the guest.
    pub(super) lift_bounds: LiftBounds,
    /// The deterministic WASI, where the job grants it: each instance gets its own.
    pub(super) wasi: Option<wasi::DeterministicWasi>,
}

/// Where a batch stands against its bounds: `[operator.limits]`
/// `output_bytes_per_batch` and `time_per_batch_ms`, `[ttl] sweep_limit` expiries, and
/// `[state] commit_dirty_mib` (which the transaction counts).
#[derive(Debug)]
pub(super) struct BatchBudget {
    /// When the batch must end.
    ends_at: Instant,
    /// Bytes it holds for what it emits: outputs, failure reasons, expired entries.
    pub(super) bytes: usize,
    /// Entries it expired.
    pub(super) expiries: usize,
    /// Records it finished.
    pub(super) records: usize,
    /// Whether it goes on to its first record or expiry whatever its bounds (a live
    /// batch must make progress; a shadow's need not).
    progress: bool,
}

impl BatchBudget {
    /// A batch starting now under `limits`.
    pub(super) fn new(limits: &OperatorLimits) -> Self {
        let time = Duration::from_millis(limits.time_per_batch_ms.min(u32::MAX.into()));
        BatchBudget { ends_at: Instant::now() + time, bytes: 0, expiries: 0, records: 0, progress: true }
    }

    /// A batch starting now under `limits` that ends by `until` too, and may end before
    /// it did anything.
    pub(super) fn bounded(limits: &OperatorLimits, until: Instant) -> Self {
        let budget = BatchBudget::new(limits);
        BatchBudget { ends_at: budget.ends_at.min(until), progress: false, ..budget }
    }

    /// Whether the batch is held to its bounds: once it has done anything, or from the
    /// start where it need not make progress.
    pub(super) fn started(&self) -> bool {
        !self.progress || self.records + self.expiries > 0
    }

    /// Whether the batch should end before its next record or expiry.
    pub(super) fn is_spent(&self, limits: &OperatorLimits, txn: &Transaction) -> bool {
        self.bytes >= limits.output_bytes_per_batch
            || self.expiries >= txn.ttl().sweep_limit
            || txn.dirty_full()
            || Instant::now() >= self.ends_at
    }

    /// Counts a finished record with `outcome`.
    pub(super) fn add_record(&mut self, outcome: &Outcome) {
        self.records += 1;
        self.bytes = self.bytes.saturating_add(outcome.bytes());
    }
}

/// What the host keeps of a `process-batch` call while it runs: enough to move the
/// record scope from one input to the next at each `batch.finish`.
#[derive(Default)]
pub(super) struct Batch {
    /// The inputs' keys end to end (the buffer is reused from batch to batch)...
    pub(super) keys: Vec<u8>,
    /// ... and where each ends.
    pub(super) ends: Vec<usize>,
    /// The inputs' offsets and event times.
    pub(super) times: Vec<(u64, i64)>,
    /// The outcomes of the inputs finished so far, in order.
    pub(super) outcomes: Vec<Outcome>,
    /// Whether an operator is told of expiries — this version, or the canary paired
    /// with it, whose keys' entries are its to hear of: a call is then cut before an
    /// input that makes entries due, so each goes to the version its key routes to.
    pub(super) told: bool,
    /// Whether `finish` cut the call short, before an input that makes expiries due
    /// (the call's own writes brought them) or at the batch's bounds: the host goes on
    /// from there.
    pub(super) cut: bool,
}

impl Batch {
    /// A call of `records` starts, their first's time observed.
    pub(super) fn start(&mut self, records: &[SourceRecord], told: bool) {
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
    pub(super) fn is_running(&self) -> bool {
        !self.ends.is_empty()
    }

    /// Ends the call: `finish` has no inputs to move to until the next starts.
    pub(super) fn end(&mut self) {
        self.keys.clear();
        self.ends.clear();
        self.times.clear();
    }

    /// The key, offset and event time of input `index`, if there is one.
    pub(super) fn input(&self, index: usize) -> Option<(&[u8], u64, i64)> {
        let end = *self.ends.get(index)?;
        let start = index.checked_sub(1).map_or(0, |before| self.ends[before]);
        let (offset, timestamp_ms) = self.times[index];
        Some((&self.keys[start..end], offset, timestamp_ms))
    }
}

/// What one call has made the host hold so far, counted against
/// [`OperatorLimits`].
#[derive(Debug, Default)]
pub(super) struct CallUsage {
    pub(super) reads: usize,
    pub(super) writes: usize,
    written_bytes: usize,
    /// Timers set from `expired` or `fired`.
    pub(super) callback_timers: usize,
}

/// Why the host stopped a call, recorded where it stops it: the trap that unwinds
/// the guest carries only a message.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Cause {
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

impl HostCtx {
    /// Forgets what the previous call (or record of a batched call) left behind: its
    /// trap's cause, its last error log line, a host failure, what it used of its
    /// limits.
    pub(super) fn forget_last_call(&mut self) {
        (self.cause, self.last_error, self.host_error, self.late) = (None, None, None, false);
        self.usage = CallUsage::default();
    }

    /// Counts growing one of the instance's memories or tables from `current` to
    /// `desired` bytes; past the cap, traps and records why.
    pub(super) fn grow(&mut self, what: &str, current: usize, desired: usize) -> wasmtime::Result<bool> {
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
    pub(super) fn check_limit(&mut self, name: &str, max: usize, used: usize) -> Result<()> {
        if used > max {
            let reason = limit_passed(name, max, used);
            self.cause = Some(Cause::Limit(reason.clone()));
            bail!(reason);
        }
        Ok(())
    }

    /// Checks a state or timer name: within `[operator.limits] state_name_bytes`, and
    /// not one of the names the host keeps timers under.
    pub(super) fn check_name(&mut self, name: &str) -> Result<()> {
        if crate::state::is_reserved(name) {
            bail!("state or timer name {name:?} begins with NUL: such names are reserved for the host's timers");
        }
        self.check_limit("state_name_bytes", self.per_call.state_name_bytes, name.len())
    }

    /// Counts a write of `value` (`None`: a delete) under `name` against the limits.
    pub(super) fn check_write(&mut self, name: &str, value: Option<&[u8]>) -> Result<()> {
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
    pub(super) fn admit_log_line(&mut self, bytes: usize) -> bool {
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

    /// Traps a state or timer call (`call`, as `state.put`) made outside a record.
    pub(super) fn check_in_record(&self, call: &str) -> Result<()> {
        if !self.in_record {
            bail!(
                "{call} called outside a record: state and timers belong to a record's key, so neither `init` nor \
                 `process-batch` after its last `batch.finish` can use them"
            );
        }
        Ok(())
    }

    /// Ends the running `process-batch` call before its next input, for `why`: the trap
    /// that unwinds the guest, which the host knows for a cut (the instance is
    /// replaced, and the batch goes on from that input).
    pub(super) fn cut(&mut self, why: &str) -> wasmtime::Error {
        (self.batch.cut, self.in_record) = (true, false);
        wasmtime::format_err!("`{PROCESS_BATCH}` cut before its next input: {why}")
    }

    /// Records a host failure and returns the trap that unwinds the guest.
    pub(super) fn fail(&mut self, error: anyhow::Error) -> anyhow::Error {
        let trap = anyhow!("host failure: {error:#}");
        self.host_error = Some(error);
        trap
    }
}
