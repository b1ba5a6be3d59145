//! One operator component run the way a partition of a job runs it, record by record,
//! with the clock in the caller's hands: the test driver behind `sluice test` and the
//! `sluice-test` kit (what Kafka Streams' `TopologyTestDriver` is to a topology).
//!
//! The component is compiled and instantiated under the job's limits ([`Limits`]), its
//! state lives in a scratch RocksDB behind the same [`Transaction`] a worker uses
//! (typed values, TTLs, expiry callbacks), and what it emits comes back as the lines
//! the file sink and the dead-letter file would hold. Each record is committed on its
//! own. This module owns none of a job's operation: no source, sink, checkpoints or
//! deploys.
//!
//! ```no_run
//! use sluice::test_driver::TestDriver;
//!
//! # fn main() -> anyhow::Result<()> {
//! let mut driver = TestDriver::builder("vehicle_stats.wasm").config("left_fleet_after_ms", "60000").build()?;
//! let position = br#"{"vehicle_id":"veh-1","ts":1767225600000,"lat":52.0,"lon":4.0,"speed_kmh":30}"#;
//! let step = driver.process(b"veh-1", position, 1_767_225_600_000)?;
//! assert_eq!(step.outputs[0]["value"]["count"], 1);
//! // A minute later the vehicle has left the fleet: its summary expires.
//! let step = driver.advance_clock(1_767_225_660_000)?;
//! assert_eq!(step.outputs[0]["cause"], "expiry");
//! # Ok(())
//! # }
//! ```

use crate::config::{self, TtlConfig};
use crate::lines;
use crate::operator::wasm::{Limits, WasmInstance, WasmOperator};
use crate::operator::{Expiration, Operator, Outcome, Processed};
use crate::record::{Origin, SourceRecord};
use crate::source::file::JsonlFile;
use crate::state::{StateDir, Transaction};
use crate::worker::Emission;
use anyhow::{Context, Result};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The state cache a driver's partition gets: its state is small.
const CACHE_BYTES: usize = 16 << 20;

/// What one step (a record, or the clock moving) emitted.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Step {
    /// The output lines, in order, as the file sink writes them (`partition`, `offset`,
    /// `cause` for an expiry's, `key`, `topic`, `value`, `operator`).
    pub outputs: Vec<Value>,
    /// The dead-letter lines, in order, as the dead-letter file holds them (with
    /// `error` and `reason`).
    pub dead_letters: Vec<Value>,
}

impl Step {
    /// Adds what `later` emitted after this step's lines.
    fn append(&mut self, later: Step) {
        self.outputs.extend(later.outputs);
        self.dead_letters.extend(later.dead_letters);
    }
}

/// How to start a [`TestDriver`].
#[derive(Debug, Clone)]
pub struct TestDriverBuilder {
    component: PathBuf,
    config: Vec<(String, String)>,
    ttl: TtlConfig,
    limits: Limits,
}

impl TestDriverBuilder {
    /// Adds `name = value` to the operator's `[operator.config]`.
    pub fn config(mut self, name: &str, value: &str) -> Self {
        self.config.push((name.to_string(), value.to_string()));
        self
    }

    /// The host's TTL policy (`[ttl]`); by default entries expire only as the
    /// operator's `put-with-ttl` says, in event time.
    pub fn ttl(mut self, ttl: TtlConfig) -> Self {
        self.ttl = ttl;
        self
    }

    /// The sandbox's limits (`[operator]`); by default a job's.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Compiles the component and starts it over empty state, calling its `init`; fails
    /// on a TTL policy a job would refuse.
    pub fn build(self) -> Result<TestDriver> {
        self.ttl.validate()?;
        let scratch = tempfile::tempdir().context("creating the driver's scratch state directory")?;
        let state = StateDir::open(scratch.path(), 1)?;
        let transaction =
            Transaction::new(state.open_partition(0)?, CACHE_BYTES)?.with_ttl(Arc::new(self.ttl.clone()))?;
        let operator = WasmOperator::load(&self.component, self.limits, self.config)?;
        let instance = WasmInstance::new(Arc::new(operator), 0, transaction)?;
        Ok(TestDriver { instance, next_offset: 0, _scratch: scratch })
    }
}

/// An operator component over scratch state, driven one record at a time (see the
/// module).
pub struct TestDriver {
    instance: WasmInstance,
    /// The offset the next record gets: records are numbered 0, 1, … in one partition.
    next_offset: u64,
    /// Removed with the driver.
    _scratch: tempfile::TempDir,
}

impl TestDriver {
    /// A driver of the component at `component` (a `.wasm` file), with an empty
    /// operator config, no host TTLs and a job's default limits.
    pub fn builder(component: impl AsRef<Path>) -> TestDriverBuilder {
        TestDriverBuilder {
            component: component.as_ref().to_path_buf(),
            config: Vec::new(),
            ttl: TtlConfig::default(),
            limits: Limits::default(),
        }
    }

    /// The operator's version, `name@digest`, as its outputs name it.
    pub fn version(&self) -> &str {
        self.instance.version()
    }

    /// Stores `value` under `name` for `key`, as if the operator had written it before
    /// the first record (a test's starting state); it never expires unless the host's
    /// TTL policy names it.
    pub fn put_state(&mut self, key: &[u8], name: &str, value: &[u8]) -> Result<()> {
        self.write_state(key, |state| {
            state.put(name, value.to_vec());
            Ok(())
        })
    }

    /// Sets `key`'s timer `name` for `at_ms`, as the operator's `set_timer` would.
    pub fn set_timer(&mut self, key: &[u8], name: &str, at_ms: u64) -> Result<()> {
        self.write_state(key, |state| state.set_timer(name, at_ms))
    }

    /// Makes `write` to `key`'s state and commits it.
    fn write_state(&mut self, key: &[u8], write: impl FnOnce(&mut Transaction) -> Result<()>) -> Result<()> {
        let state = self.instance.state();
        state.scope(key);
        let written = write(state);
        state.end_record(written.is_ok());
        written?;
        state.commit(self.next_offset)
    }

    /// Processes one record of `key` and `value` with event time `timestamp_ms`: the
    /// entries its timestamp brings due expire first (their outputs come first), then
    /// the operator processes it; the state is committed with it.
    pub fn process(&mut self, key: &[u8], value: &[u8], timestamp_ms: i64) -> Result<Step> {
        let record = SourceRecord {
            partition: 0,
            offset: self.next_offset,
            key: key.to_vec(),
            value: value.to_vec(),
            timestamp_ms,
            headers: Vec::new(),
        };
        let mut step = Step::default();
        // A batch that reaches its bounds in the expiries before the record ends there,
        // and commits: the next goes on with them, as a partition's would.
        loop {
            let Processed { outcomes, expirations, .. } = self.instance.process_batch(std::slice::from_ref(&record))?;
            step.append(self.expirations(expirations));
            let origin = Origin::of(&record);
            let processed = !outcomes.is_empty();
            for outcome in outcomes {
                self.add(&mut step, origin, &record.key, &record.value, outcome);
            }
            if processed {
                self.next_offset += 1;
                self.instance.state().commit(self.next_offset)?;
                return Ok(step);
            }
            self.instance.state().commit(self.next_offset)?;
        }
    }

    /// Moves the partition's event-time clock to `timestamp_ms` without a record (as a
    /// later record would) and expires what comes due, calling the operator's
    /// `expired` for each entry.
    pub fn advance_clock(&mut self, timestamp_ms: i64) -> Result<Step> {
        let mut step = Step::default();
        let mut due = self.instance.state().advance_clock(timestamp_ms);
        while due {
            let expirations = self.instance.expire(self.next_offset)?;
            step.append(self.expirations(expirations));
            self.instance.state().commit(self.next_offset)?;
            due = self.instance.state().due();
        }
        Ok(step)
    }

    /// The committed state, as `sluice state dump` shows it, in key and name order.
    pub fn state(&mut self) -> Result<Vec<Value>> {
        let store = self.instance.state().store();
        store
            .entries()
            .map(|entry| entry.map(|e| lines::state_line(0, &e.key, &e.name, &e.value, e.expires_at_ms)))
            .collect()
    }

    fn expirations(&self, expirations: Vec<Expiration>) -> Step {
        let mut step = Step::default();
        for expiration in expirations {
            let origin = expiration.origin(0);
            self.add(&mut step, origin, &expiration.entry.key, &expiration.entry.value, expiration.outcome);
        }
        step
    }

    /// Adds to `step` the lines of `outcome`, of the input (or expired entry) of `key`
    /// and `value` at `origin`.
    fn add(&self, step: &mut Step, origin: Origin, key: &[u8], value: &[u8], outcome: Outcome) {
        let version = self.instance.version();
        let mut line = Vec::new();
        match Emission::of(origin, key, value, outcome) {
            Emission::Outputs(outputs) => {
                let operator = lines::OperatorField::new(version);
                for output in outputs {
                    line.clear();
                    lines::format_output(&mut line, &origin, &output, &operator);
                    step.outputs.push(serde_json::from_slice(&line).expect("the sink writes JSON lines"));
                }
            }
            Emission::DeadLetter(dead) => {
                lines::format_dead_letter(&mut line, &dead, version);
                step.dead_letters.push(serde_json::from_slice(&line).expect("the sink writes JSON lines"));
            }
        }
    }
}

impl TestDriver {
    /// Stores each state line of the JSONL file `path` (as `sluice state dump` writes
    /// them: `key` or `key_base64`, `name`, and `value` — a JSON value, stored as its
    /// JSON text — or `value_base64`); returns how many.
    pub fn load_state(&mut self, path: &Path) -> Result<usize> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading state file {}", path.display()))?;
        let mut count = 0;
        for (number, line) in text.lines().enumerate().filter(|(_, line)| !line.trim().is_empty()) {
            let at = || format!("state file {} line {}", path.display(), number + 1);
            let entry: Value = serde_json::from_str(line).with_context(at)?;
            let key = bytes_field(&entry, "key").with_context(at)?;
            let value = bytes_field(&entry, "value").with_context(at)?;
            let name = entry["name"].as_str().context("no \"name\" string").with_context(at)?;
            match crate::state::timer_of(name) {
                // A timer's entry, as the dump shows it: set again for its time.
                Some(timer) => {
                    let at_ms = entry["expires_at_ms"].as_u64().context("a timer without \"expires_at_ms\"");
                    self.set_timer(&key, timer, at_ms.with_context(at)?)?;
                }
                None => self.put_state(&key, name, &value)?,
            }
            count += 1;
        }
        Ok(count)
    }

    /// Processes every record of the JSONL file `path` in order — the key from each
    /// line's `key_field`, the event time from its `timestamp_field`, as a file source
    /// reads them — then, with `advance_to`, moves the clock there; returns all they
    /// emitted and how many records there were. A line `{"$advance_to": MS}` is not a
    /// record but moves the clock to `MS` there, between the records around it
    /// ([`ADVANCE_TO`]).
    pub fn process_file(
        &mut self,
        path: &Path,
        key_field: &str,
        timestamp_field: &str,
        advance_to: Option<i64>,
    ) -> Result<(Step, usize)> {
        let mut all = Step::default();
        let mut records = 0;
        for (line, record) in
            JsonlFile::open(path, key_field, timestamp_field, config::default_max_line_bytes())?.enumerate()
        {
            let record = record?;
            match clock_directive(&record.value)
                .with_context(|| format!("{}: non-empty line {}", path.display(), line + 1))?
            {
                Some(at) => all.append(self.advance_clock(at)?),
                None => {
                    all.append(self.process(&record.key, &record.value, record.timestamp_ms)?);
                    records += 1;
                }
            }
        }
        if let Some(at) = advance_to {
            all.append(self.advance_clock(at)?);
        }
        Ok((all, records))
    }
}

/// The field of a fixture line that makes it a directive moving the clock, not a
/// record: `{"$advance_to": 1767225660000}`.
pub const ADVANCE_TO: &str = "$advance_to";

/// The time a fixture line's [`ADVANCE_TO`] moves the clock to; `None` for a record.
/// A line naming it that is not exactly such a directive is an error, so a typo does
/// not quietly become a record.
fn clock_directive(line: &[u8]) -> Result<Option<i64>> {
    // Cheap for records: only a line that names the field is parsed again.
    if !line.windows(ADVANCE_TO.len()).any(|w| w == ADVANCE_TO.as_bytes()) {
        return Ok(None);
    }
    let fields: serde_json::Map<String, Value> =
        serde_json::from_slice(line).with_context(|| format!("a line naming {ADVANCE_TO} is not a JSON object"))?;
    let Some(at) = fields.get(ADVANCE_TO) else { return Ok(None) };
    anyhow::ensure!(fields.len() == 1, "a line with {ADVANCE_TO} must have no other field");
    let ms = at.as_i64().filter(|ms| *ms > 0);
    ms.map(Some).with_context(|| format!("{ADVANCE_TO} must be ms since the epoch, not {at}"))
}

/// The bytes of `entry`'s field `name`: a JSON value as its JSON text (a string as its
/// text), or `<name>_base64` decoded.
fn bytes_field(entry: &Value, name: &str) -> Result<Vec<u8>> {
    use base64::Engine;
    if let Some(encoded) = entry.get(format!("{name}{}", lines::BASE64_SUFFIX)) {
        let text = encoded.as_str().with_context(|| format!("\"{name}{}\" is not a string", lines::BASE64_SUFFIX))?;
        return base64::engine::general_purpose::STANDARD.decode(text).context("not base64");
    }
    match entry.get(name) {
        Some(Value::String(text)) if name == "key" => Ok(text.as_bytes().to_vec()),
        Some(value) => Ok(serde_json::to_vec(value)?),
        None => anyhow::bail!("no \"{name}\" (or \"{name}{}\")", lines::BASE64_SUFFIX),
    }
}

/// How `actual` lines differ from `expected` ones, position by position, each
/// difference a few lines of text; empty when they match. An expected line matches an
/// actual one when each of its fields matches the actual line's, an object field when
/// each of its own fields does: what the expected line leaves out (`partition`,
/// `offset`, `operator`, a field of a value…) is not compared. `what` names the lines
/// ("output", "dead letter").
pub fn differences(what: &str, expected: &[Value], actual: &[Value]) -> Vec<String> {
    let mut found = Vec::new();
    for (i, (expected, actual)) in expected.iter().zip(actual).enumerate() {
        let fields: Vec<String> = match expected.is_object() {
            true => lines::differing_fields(expected, actual, lines::Compare::Subset)
                .into_iter()
                .map(|field| {
                    let (expected, actual) = (field.left.unwrap_or_default(), field.right.unwrap_or_default());
                    format!("{} (expected {expected}, actual {actual})", field.path)
                })
                .collect(),
            false => vec![format!("the expected line is not a JSON object: {expected}")],
        };
        if !fields.is_empty() {
            found.push(format!(
                "{what} {} (of the input at offset {}): differs in {}\n  expected {expected}\n  actual   {actual}",
                i + 1,
                actual["offset"],
                fields.join(", ")
            ));
        }
    }
    if expected.len() != actual.len() {
        let (more, lines) = match expected.len() > actual.len() {
            true => ("missing", &expected[actual.len()..]),
            false => ("unexpected", &actual[expected.len()..]),
        };
        let shown: Vec<String> = lines.iter().take(5).map(|line| format!("\n  {more} {line}")).collect();
        found.push(format!(
            "expected {} {what}s, got {}: {} {more}{}{}",
            expected.len(),
            actual.len(),
            lines.len(),
            shown.concat(),
            if lines.len() > 5 { "\n  …" } else { "" }
        ));
    }
    found
}
