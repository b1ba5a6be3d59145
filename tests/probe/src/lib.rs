//! The tests' attacker: an operator that probes the sandbox and the guest SDK, kept
//! under `tests/` with them. Not an example to copy.
//!
//! A record with an empty value (a Kafka tombstone, say) emits `{"empty": true,
//! "headers": {...}}`, the headers it arrived with. Every other record's value is JSON
//! `{"action": ..., ...}`:
//! - `roundtrip` with `sample`: stores the sample as typed state, reads it back, and
//!   emits `{"previous": <sample stored before>, "readback_equal": bool}`;
//! - `count`: increments a counter and emits it;
//! - `work` with `iterations`: spins that many iterations (a slow operator), then counts;
//! - `put-then-panic`: writes state, then panics (the write must be discarded);
//! - `put-then-fail`: writes state, then returns an error (the write must be discarded);
//! - `read-fs`, `read-env`: touch the filesystem / environment (must trap);
//! - `hash-map`, `clock`: make a std `HashMap` (seeded by randomness) / read the system
//!   clock (must trap, saying what to use instead);
//! - `spin`: loops forever (must hit the deadline);
//! - `hog`: allocates without bound (must hit the memory cap);
//! - `leak` with `kib`: leaks that much memory (a leaky operator: its instance fills
//!   up over many records and traps at the cap on one a fresh instance handles), then
//!   counts;
//! - `remember` with `name`, `value` and `ttl_ms`: stores the value under the name with
//!   that TTL, emits `{"remembered": name}`;
//! - `peek` with `name`: emits `{"name": name, "value": <the value or null>}`;
//! - `put-bytes` with `name` and `text`: stores the text's bytes as they are under the
//!   name (state an operator writes may be any bytes), emits `{"put": name}`;
//! - `outputs` with `count`, `bytes` and optionally `topic`: emits `count` outputs of a
//!   `bytes`-long string, to `topic` if given;
//! - `writes` with `count` and `bytes`: stores a `bytes`-long string under each of
//!   `count` names (`w0`, `w1`, ...), then counts;
//! - `name` with `bytes`: stores under a `bytes`-long name, then counts;
//! - `reads` with `count`: reads `count` names (`r0`, `r1`, ...), then counts;
//! - `log` with `count` and `bytes`: logs `count` warnings of `bytes` bytes, then counts;
//! - `fail` with `bytes`: returns an error whose reason is `bytes` long;
//! - `overflow`: stores a float that overflowed to infinity (which JSON cannot hold);
//! - `timer` with `name` and `at_ms`: sets the key's timer, emits `{"timer": name}`;
//! - `cancel-timer` with `name`: cancels it, emits `{"cancelled": name}`.
//!
//! When an entry expires, `expired` counts it in the key's `expiries` state and emits
//! `{"expired": name, "value": <value>, "at": <expiry>, "expiries": <count>}`; for a
//! name starting with `fail` it returns an error instead, for one starting with `trap`
//! it panics, each after writing `expiries` (a write that must be discarded); for one
//! starting with `log` it also logs `expired <name>` at info.
//!
//! When a timer fires, `fired` counts it in the key's `fireds` state and emits
//! `{"fired": name, "at": <time>, "fireds": <count>}`; for a name starting with `fail`
//! it returns an error instead, for one starting with `trap` it panics, each after
//! writing `fireds`; for one starting with `again` it sets the timer again a second
//! later, and for one starting with `past` at the time it fired (which traps); for one
//! starting with `double` it sets `<name>0` and `<name>1` a second later (two timers
//! from one, each firing once); for one starting with `log` it also logs `fired <name>` at info.
//!
//! With `fail_init = "true"` in its config, `init` returns an error; with
//! `trap_init = "true"`, it panics (a trap); with `state_in_init = "true"`, it writes
//! state through the raw bindings, which the host must refuse outside `process`.
use serde::{Deserialize, Serialize};
use sluice_guest::{Error, Operator, Output, Record, Result, State, export_operator};
use std::collections::BTreeMap;

/// A value exercising most of serde's data model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub text: String,
    pub int: i64,
    pub float: f64,
    pub list: Vec<u32>,
    pub map: BTreeMap<String, Option<bool>>,
    pub kind: Kind,
    pub nested: Option<Box<Sample>>,
}

/// An enum with unit, tuple and struct variants.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Kind {
    Unit,
    Tuple(u8, String),
    Struct { bytes: Vec<u8> },
}

#[derive(Deserialize)]
#[serde(tag = "action", rename_all = "kebab-case")]
enum Action {
    Roundtrip { sample: Sample },
    Count,
    Work { iterations: u64 },
    PutThenPanic,
    PutThenFail,
    ReadFs,
    ReadEnv,
    HashMap,
    Clock,
    Spin,
    Hog,
    Leak { kib: usize },
    Remember { name: String, value: serde_json::Value, ttl_ms: u64 },
    Peek { name: String },
    PutBytes { name: String, text: String },
    Outputs { count: usize, bytes: usize, topic: Option<String> },
    Writes { count: usize, bytes: usize },
    Name { bytes: usize },
    Reads { count: usize },
    Log { count: usize, bytes: usize },
    Fail { bytes: usize },
    Overflow,
    Timer { name: String, at_ms: u64 },
    CancelTimer { name: String },
}

/// The probe operator.
pub struct Probe;

impl Operator for Probe {
    fn init(config: Vec<(String, String)>) -> Result<()> {
        let set = |name: &str| config.iter().any(|(k, v)| k == name && v == "true");
        if set("trap_init") {
            panic!("trap_init is set");
        }
        #[cfg(target_arch = "wasm32")]
        if set("state_in_init") {
            sluice_guest::bindings::sluice::operator::state::put("from-init", b"1");
        }
        match set("fail_init") {
            true => Err(Error::msg("fail_init is set")),
            false => Ok(()),
        }
    }

    fn process(record: Record, state: &State<'_>) -> Result<Vec<Output>> {
        let key = record.key.clone();
        if record.value.is_empty() {
            // A tombstone, say: what the record carried, headers and all.
            let headers: serde_json::Map<String, serde_json::Value> =
                record.headers.iter().map(|(k, v)| (k.clone(), String::from_utf8_lossy(v).into())).collect();
            return Ok(vec![Output::json(key, &serde_json::json!({ "empty": true, "headers": headers }))?]);
        }
        let emitted = match record.json::<Action>()? {
            Action::Roundtrip { sample } => {
                let previous: Option<Sample> = state.get("sample")?;
                state.put("sample", &sample)?;
                let back: Sample = state.get("sample")?.ok_or_else(|| Error::msg("sample vanished"))?;
                serde_json::json!({ "previous": previous, "readback_equal": back == sample })
            }
            Action::Count => count(state)?,
            Action::Work { iterations } => {
                let mut n: u64 = 0;
                for _ in 0..iterations {
                    n = std::hint::black_box(n.wrapping_add(1));
                }
                count(state)?
            }
            Action::PutThenPanic => {
                state.put("count", &1_000_000u64)?;
                panic!("probe panics after a write");
            }
            Action::PutThenFail => {
                state.put("count", &1_000_000u64)?;
                return Err(Error::msg("probe fails after a write"));
            }
            Action::ReadFs => serde_json::json!({ "read": std::fs::read_to_string("/etc/hostname")? }),
            Action::ReadEnv => serde_json::json!({ "env": std::env::vars().collect::<Vec<_>>() }),
            Action::HashMap => {
                let mut seen = std::collections::HashMap::new();
                seen.insert(key.clone(), 1);
                serde_json::json!({ "entries": seen.len() })
            }
            Action::Clock => serde_json::json!({ "now": format!("{:?}", std::time::SystemTime::now()) }),
            Action::Spin => {
                let mut n: u64 = 0;
                loop {
                    n = std::hint::black_box(n.wrapping_add(1));
                }
            }
            Action::Hog => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(vec![1u8; 1 << 20]);
                    std::hint::black_box(&hoard);
                }
            }
            Action::Leak { kib } => {
                std::hint::black_box(Vec::leak(vec![1u8; kib << 10]));
                count(state)?
            }
            Action::Remember { name, value, ttl_ms } => {
                state.put_with_ttl(&name, &value, std::time::Duration::from_millis(ttl_ms))?;
                serde_json::json!({ "remembered": name })
            }
            Action::Peek { name } => {
                let value: Option<serde_json::Value> = state.get(&name)?;
                serde_json::json!({ "name": name, "value": value })
            }
            Action::PutBytes { name, text } => {
                state.put_bytes(&name, text.as_bytes());
                serde_json::json!({ "put": name })
            }
            Action::Outputs { count, bytes, topic } => {
                let value = "o".repeat(bytes);
                let output = |_| -> Result<Output> {
                    let output = Output::json(key.clone(), &value)?;
                    Ok(match &topic {
                        Some(topic) => output.to_topic(topic.as_str()),
                        None => output,
                    })
                };
                return (0..count).map(output).collect();
            }
            Action::Writes { count: writes, bytes } => {
                let value = "w".repeat(bytes);
                for i in 0..writes {
                    state.put(&format!("w{i}"), &value)?;
                }
                count(state)?
            }
            Action::Name { bytes } => {
                state.put(&"n".repeat(bytes), &1)?;
                count(state)?
            }
            Action::Reads { count: reads } => {
                for i in 0..reads {
                    state.get::<u64>(&format!("r{i}"))?;
                }
                count(state)?
            }
            Action::Overflow => {
                state.put("mean", &(std::hint::black_box(f64::MAX) * 2.0))?;
                count(state)?
            }
            Action::Timer { name, at_ms } => {
                state.set_timer(&name, at_ms);
                serde_json::json!({ "timer": name })
            }
            Action::CancelTimer { name } => {
                state.cancel_timer(&name);
                serde_json::json!({ "cancelled": name })
            }
            Action::Fail { bytes } => return Err(Error::msg("f".repeat(bytes))),
            Action::Log { count: lines, bytes } => {
                let line = "l".repeat(bytes);
                for _ in 0..lines {
                    sluice_guest::log::warn(&line);
                }
                count(state)?
            }
        };
        Ok(vec![Output::json(key, &emitted)?])
    }

    fn expired(entry: sluice_guest::Expired, state: &State<'_>) -> Result<Vec<Output>> {
        let expiries = state.get::<u64>("expiries")?.unwrap_or(0) + 1;
        state.put("expiries", &expiries)?;
        if entry.name.starts_with("fail") {
            return Err(Error::msg(format!("probe fails on the expiry of {}", entry.name)));
        }
        if entry.name.starts_with("trap") {
            panic!("probe panics on the expiry of {}", entry.name);
        }
        if entry.name.starts_with("log") {
            sluice_guest::log::info(&format!("expired {}", entry.name));
        }
        let value: serde_json::Value = entry.value()?;
        let emitted = serde_json::json!({ "expired": entry.name, "value": value, "at": entry.expired_at_ms, "expiries": expiries });
        Ok(vec![Output::json(entry.key, &emitted)?])
    }

    fn fired(timer: sluice_guest::Timer, state: &State<'_>) -> Result<Vec<Output>> {
        let fireds = state.get::<u64>("fireds")?.unwrap_or(0) + 1;
        state.put("fireds", &fireds)?;
        let name = timer.name.as_str();
        if name.starts_with("fail") {
            return Err(Error::msg(format!("probe fails on the timer {name}")));
        }
        if name.starts_with("trap") {
            panic!("probe panics on the timer {name}");
        }
        if name.starts_with("again") {
            state.set_timer(name, timer.at_ms + 1_000);
        }
        if name.starts_with("past") {
            state.set_timer(name, timer.at_ms);
        }
        if name.starts_with("double") {
            state.set_timer(&format!("{name}0"), timer.at_ms + 1_000);
            state.set_timer(&format!("{name}1"), timer.at_ms + 1_000);
        }
        if name.starts_with("log") {
            sluice_guest::log::info(&format!("fired {name}"));
        }
        let emitted = serde_json::json!({ "fired": name, "at": timer.at_ms, "fireds": fireds });
        Ok(vec![Output::json(timer.key, &emitted)?])
    }
}

/// Increments the key's counter and returns it as the output.
fn count(state: &State<'_>) -> Result<serde_json::Value> {
    let count = state.get::<u64>("count")?.unwrap_or(0) + 1;
    state.put("count", &count)?;
    Ok(serde_json::json!({ "count": count }))
}

export_operator!(Probe);
