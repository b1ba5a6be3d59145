//! `[operator]`: the component, its call limits (`[operator.limits]`), its retries
//! (`[operator.retry]`) and its config, with their defaults and checks.

use super::*;

/// `[operator]`
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperatorConfig {
    /// The operator component (`.wasm`): the version a job starts with until another
    /// is deployed.
    pub path: PathBuf,
    /// The name versions are deployed under; absent: the file stem of `path`.
    pub name: Option<String>,
    /// Between a host's looks at the registry for versions deployed elsewhere.
    #[serde(default = "default_poll_versions", alias = "poll_versions_s", deserialize_with = "duration")]
    pub poll_versions: Duration,
    /// The WebAssembly instructions one call may execute (wasmtime's fuel): a CPU bound
    /// a replay reproduces exactly, where `call_timeout_ms` depends on the machine's
    /// speed. Counting costs the guest's code about a fifth of its speed, so 0, the
    /// default, counts none.
    #[serde(default)]
    pub instructions_per_call: u64,
    /// CPU deadline of one call (one record's, inside a batched call), in milliseconds:
    /// the CPU time of the thread running it — the guest's and the host calls' on its
    /// behalf — so time spent waiting for a core on a loaded host does not count.
    #[serde(default = "default_call_timeout_ms")]
    pub call_timeout_ms: u64,
    /// The most memory one instance may hold, in MiB: its linear memories and its tables
    /// together. A call's inputs are copied into it, so a batch is split into calls
    /// whose records take at most an eighth of it.
    #[serde(default = "default_memory_limit_mib")]
    pub memory_limit_mib: u64,
    /// The most disk, in MiB, for compiled components kept in the state directory
    /// (`compiled/`), so a restart, deploy or replay of a build compiled before skips
    /// compiling it; the least recently used go first. 0 keeps none.
    #[serde(default = "default_compiled_cache_mib")]
    pub compiled_cache_mib: u64,
    /// Name/value pairs passed to the operator's `init`.
    #[serde(default)]
    pub config: BTreeMap<String, String>,
    /// What one record's call may make the host hold.
    #[serde(default)]
    pub limits: OperatorLimits,
    /// What a record whose call trapped gets.
    #[serde(default)]
    pub retry: RetryPolicy,
    /// What a component that imports WASI gets.
    #[serde(default)]
    pub wasi: WasiGrant,
}

/// `[operator] wasi`: what the sandbox gives a component's WASI imports. Rust builds
/// import a few through the standard library; CPython and JavaScript runtimes built with
/// WASI (componentize-py without `-s`) call them from the start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WasiGrant {
    /// Every WASI call traps, naming the function: the record (or `init`) fails.
    #[default]
    Deny,
    /// WASI with nothing of the machine in it: clocks at the record's event time, random
    /// bytes seeded from the version, partition and record, printing into the operator's
    /// bounded log, no files, environment or network; a replay decides as the first run
    /// did. See the sandbox's `wasi` room.
    Deterministic,
}

/// `[operator.retry]`: a record whose call trapped — a panic, a limit, the deadline, a
/// denied call — is called again on a fresh instance, which may do better (the
/// instance it trapped in may have leaked memory, or the host was loaded); after the
/// last attempt it goes to the dead letters, or, when `strict`, stops its partition.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryPolicy {
    /// Calls of a record that traps, the first included: 1 never retries.
    pub attempts: u32,
    /// The wait before the second call; each later one waits twice the one before.
    #[serde(deserialize_with = "duration")]
    pub backoff: Duration,
    /// After the last attempt, stop the partition instead of dead-lettering the record.
    pub strict: bool,
}

impl Default for RetryPolicy {
    /// One retry, 10 ms later: a burst of records that trap whatever happens costs
    /// little more than without, and one a fresh instance processes is not lost.
    fn default() -> Self {
        RetryPolicy { attempts: 2, backoff: Duration::from_millis(10), strict: false }
    }
}

impl RetryPolicy {
    /// The wait before attempt `attempt` (2 is the first retry).
    pub fn backoff_before(&self, attempt: u32) -> Duration {
        self.backoff.saturating_mul(1 << attempt.saturating_sub(2).min(16))
    }
}

/// `[operator.limits]`: what one call of the operator — a record's, or an expired
/// entry's — may make the host hold, beyond the instance's own memory. A call that
/// passes one fails as a trap, naming the limit; the record goes to the dead letters
/// and its state writes are discarded. Log lines past a rate are dropped and counted.
/// The defaults leave a well-behaved operator far below each.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OperatorLimits {
    /// Outputs one call may emit.
    pub outputs_per_record: usize,
    /// Bytes (keys, values and topic names) of one call's outputs together; by default
    /// Kafka's default `message.max.bytes`, which one output may not pass anyway.
    pub output_bytes_per_record: usize,
    /// State writes (`put`s and `delete`s) one call may make.
    pub writes_per_record: usize,
    /// Bytes (names and values) of one call's state writes together, a name written
    /// twice counted twice.
    pub written_bytes_per_record: usize,
    /// Timers one `expired` or `fired` call may set. With 1 a timer that fires may set
    /// itself again, or one in its place, but never multiply: the timers pending stay
    /// as many as records set. More lets every firing set that many, and timers that
    /// set timers grow without bound.
    pub timers_per_callback: usize,
    /// State reads one call may make.
    pub reads_per_record: usize,
    /// Bytes of one state value.
    pub state_value_bytes: usize,
    /// Bytes of one state name.
    pub state_name_bytes: usize,
    /// Log lines an instance may write per second; the rest are dropped and counted.
    pub log_lines_per_s: u64,
    /// Log bytes an instance may write per second; the rest are dropped and counted.
    pub log_bytes_per_s: u64,
    /// Bytes of one log line; a longer line is cut there.
    pub log_line_bytes: usize,
    /// Bytes of the reason a record failed for — the operator's error, or the host's
    /// account of a trap — as its dead letter carries it; a longer one is cut there
    /// (before it is copied out of the guest), and it counts against
    /// `output_bytes_per_batch`.
    pub reason_bytes: usize,
    /// Bytes one batch holds for what it emits — outputs, the reasons of failed
    /// records, expired entries handed to the operator — together: past them the batch
    /// ends at the record (or expiry) that passed them, its outputs go to the sink, and
    /// the rest make the next batch.
    pub output_bytes_per_batch: usize,
    /// Milliseconds one batch may take: past them it ends as for
    /// `output_bytes_per_batch`, so a handover, deploy or stop waits at most this (and
    /// one record's `call_timeout_ms`) for the batch in hand.
    pub time_per_batch_ms: u64,
    /// Topics an output may name. An output without a topic goes to the sink's own;
    /// one naming a topic not listed here fails its record (an operator must not
    /// write into its own input or another team's topics).
    pub output_topics: Vec<String>,
}

impl OperatorLimits {
    /// No limit at all, for measuring what the limits cost (a job always has them).
    pub fn unlimited() -> Self {
        OperatorLimits {
            outputs_per_record: usize::MAX,
            output_bytes_per_record: usize::MAX,
            writes_per_record: usize::MAX,
            written_bytes_per_record: usize::MAX,
            timers_per_callback: usize::MAX,
            reads_per_record: usize::MAX,
            state_value_bytes: usize::MAX,
            state_name_bytes: usize::MAX,
            log_lines_per_s: u64::MAX,
            log_bytes_per_s: u64::MAX,
            log_line_bytes: usize::MAX,
            reason_bytes: usize::MAX,
            output_bytes_per_batch: usize::MAX,
            time_per_batch_ms: u64::MAX,
            output_topics: Vec::new(),
        }
    }
}

impl Default for OperatorLimits {
    fn default() -> Self {
        OperatorLimits {
            outputs_per_record: 1_000,
            output_bytes_per_record: 1 << 20,
            writes_per_record: 1_000,
            written_bytes_per_record: 16 << 20,
            timers_per_callback: 1,
            reads_per_record: 10_000,
            state_value_bytes: 1 << 20,
            state_name_bytes: 256,
            log_lines_per_s: 100,
            log_bytes_per_s: 64 << 10,
            log_line_bytes: 4 << 10,
            reason_bytes: 4 << 10,
            output_bytes_per_batch: 64 << 20,
            time_per_batch_ms: 10_000,
            output_topics: Vec::new(),
        }
    }
}

impl OperatorConfig {
    /// The component at `path` with every other setting at its default.
    pub fn for_path(path: &Path) -> Self {
        OperatorConfig {
            path: path.to_path_buf(),
            name: None,
            poll_versions: default_poll_versions(),
            instructions_per_call: 0,
            call_timeout_ms: default_call_timeout_ms(),
            memory_limit_mib: default_memory_limit_mib(),
            compiled_cache_mib: default_compiled_cache_mib(),
            config: BTreeMap::new(),
            limits: OperatorLimits::default(),
            retry: RetryPolicy::default(),
            wasi: WasiGrant::default(),
        }
    }

    /// Checks values that parse but cannot work.
    pub fn validate(&self) -> Result<()> {
        check_duration("[operator] poll_versions", self.poll_versions)?;
        check_duration("[operator.retry] backoff", self.retry.backoff)?;
        check_mib(&[
            ("[operator] memory_limit_mib", self.memory_limit_mib),
            ("[operator] compiled_cache_mib", self.compiled_cache_mib),
        ])?;
        if self.call_timeout_ms == 0 || self.memory_limit_mib == 0 {
            bail!("[operator] call_timeout_ms and memory_limit_mib must be positive");
        }
        if self.retry.attempts == 0 {
            bail!("[operator.retry] attempts must be at least 1 (the first call)");
        }
        let limits = &self.limits;
        let sizes = [
            ("outputs_per_record", limits.outputs_per_record),
            ("output_bytes_per_record", limits.output_bytes_per_record),
            ("writes_per_record", limits.writes_per_record),
            ("written_bytes_per_record", limits.written_bytes_per_record),
            ("reads_per_record", limits.reads_per_record),
            ("state_value_bytes", limits.state_value_bytes),
            ("state_name_bytes", limits.state_name_bytes),
            ("log_line_bytes", limits.log_line_bytes),
            ("reason_bytes", limits.reason_bytes),
            ("output_bytes_per_batch", limits.output_bytes_per_batch),
        ];
        let rates = [
            ("log_lines_per_s", limits.log_lines_per_s),
            ("log_bytes_per_s", limits.log_bytes_per_s),
            ("time_per_batch_ms", limits.time_per_batch_ms),
        ];
        let zero = sizes.iter().map(|&(name, n)| (name, n as u64)).chain(rates).find(|&(_, n)| n == 0);
        if let Some((name, _)) = zero {
            bail!("[operator.limits] {name} must be at least 1");
        }
        if self.poll_versions.is_zero() {
            bail!("[operator] poll_versions must be more than 0");
        }
        Ok(())
    }

    /// The name versions are deployed under: `name`, or the file stem of `path`.
    pub fn name(&self) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| self.path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default())
    }
}

// The defaults of `[operator]`'s own settings, for serde (the section has a required
// `path`, so no `Default`) and `for_path`.

/// `[operator] poll_versions` when unset.
fn default_poll_versions() -> Duration {
    Duration::from_secs(1)
}

/// `[operator] call_timeout_ms` when unset.
fn default_call_timeout_ms() -> u64 {
    1000
}

/// `[operator] compiled_cache_mib` when unset.
fn default_compiled_cache_mib() -> u64 {
    1024
}

/// `[operator] memory_limit_mib` when unset.
fn default_memory_limit_mib() -> u64 {
    64
}
