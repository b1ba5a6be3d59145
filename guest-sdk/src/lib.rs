//! Write Sluice stream operators in Rust.
//!
//! An operator is a type that implements [`Operator`] and is exported with
//! [`export_operator!`]. Built for `wasm32-wasip2`, the crate becomes a WebAssembly
//! component that the `sluice` host runs in its sandbox, one record at a time.
//!
//! This crate owns the operator author's view of the `sluice:operator` WIT world:
//! [`Record`] and [`Output`] instead of raw bindings, [`State`] for typed keyed state
//! (any `Serialize + DeserializeOwned` value under a name, scoped to the record's key,
//! optionally with a TTL, and the key's timers), [`Expired`] for the entries the host
//! expires, [`Timer`] for the timers that fire, and [`log`].
//! It does not own anything operational — partitions, offsets, storage, checkpoints —
//! which all live in the host.
//!
//! State values are stored as JSON by default, or in a compact binary encoding an
//! operator opts into with [`Operator::STATE_ENCODING`] (see [`encoding`]). Both are
//! self-describing: a later version of an operator can add a field with
//! `#[serde(default)]` and still read what an earlier version wrote, with no migration.
//!
//! ```no_run
//! use serde::{Deserialize, Serialize};
//! use sluice_guest::{export_operator, Operator, Output, Record, Result, State};
//!
//! #[derive(Default, Serialize, Deserialize)]
//! struct Count {
//!     seen: u64,
//! }
//!
//! struct Counter;
//!
//! impl Operator for Counter {
//!     fn process(record: Record, state: &State<'_>) -> Result<Vec<Output>> {
//!         let mut count: Count = state.get("count")?.unwrap_or_default();
//!         count.seen += 1;
//!         state.put("count", &count)?;
//!         Ok(vec![Output::json(record.key, &count)?])
//!     }
//! }
//!
//! export_operator!(Counter);
//! ```

// The generated bindings name this crate by its public path so that the export
// macro also resolves when it expands inside an operator's crate.
extern crate self as sluice_guest;

use serde::Serialize;
use serde::de::DeserializeOwned;
use std::fmt;

#[cfg(any(all(target_arch = "wasm32", not(target_feature = "atomics"), feature = "allocator"), test))]
mod alloc;
pub mod encoding;
pub use encoding::Encoding;
#[cfg(not(any(feature = "wit-0-1-0", feature = "wit-0-1-2")))]
pub mod window;

#[cfg(all(feature = "wit-0-1-0", feature = "wit-0-1-2"))]
compile_error!("features `wit-0-1-0` and `wit-0-1-2` each choose the WIT package to build against: enable one");

/// A component built with the SDK allocates through `alloc::ChunkAllocator` (an
/// operator with an allocator of its own builds the SDK without the default feature
/// `allocator`). Not where WebAssembly has threads (`atomics`): the allocator is for
/// one thread.
#[cfg(all(target_arch = "wasm32", not(target_feature = "atomics"), feature = "allocator"))]
#[global_allocator]
static ALLOCATOR: alloc::ChunkAllocator = alloc::ChunkAllocator::new();
pub mod log;
#[cfg(not(target_arch = "wasm32"))]
pub mod native;

#[doc(hidden)]
#[allow(clippy::too_many_arguments)] // generated code mirrors the canonical ABI
pub mod bindings {
    // The current package: `process`, the batched `process-batch`, `expired` and
    // `fired`.
    #[cfg(not(any(feature = "wit-0-1-0", feature = "wit-0-1-2")))]
    wit_bindgen::generate!({
        path: "wit",
        world: "timed-operator",
        pub_export_macro: true,
        export_macro_name: "__export_operator_world",
        default_bindings_module: "sluice_guest::bindings",
        runtime_path: "sluice_guest::__private::wit_bindgen::rt",
    });
    // The package as 0.1.0 published it, for building components the way operators
    // built then were (the host's compatibility tests run one).
    #[cfg(feature = "wit-0-1-0")]
    wit_bindgen::generate!({
        path: "wit/0.1.0",
        world: "operator",
        pub_export_macro: true,
        export_macro_name: "__export_operator_world",
        default_bindings_module: "sluice_guest::bindings",
        runtime_path: "sluice_guest::__private::wit_bindgen::rt",
    });
    // The package as 0.1.2 published it: batches and expiries, no timers.
    #[cfg(feature = "wit-0-1-2")]
    wit_bindgen::generate!({
        path: "wit/0.1.2",
        world: "expiring-operator",
        pub_export_macro: true,
        export_macro_name: "__export_operator_world",
        default_bindings_module: "sluice_guest::bindings",
        runtime_path: "sluice_guest::__private::wit_bindgen::rt",
    });
}

#[cfg(target_arch = "wasm32")]
use bindings::sluice::operator::state as wit_state;
use bindings::sluice::operator::{log as wit_log, types};

/// What an operator implements.
pub trait Operator {
    /// How [`State::put`] encodes this operator's values: JSON unless overridden.
    /// Reads accept either encoding, so changing it between versions of an operator
    /// needs no migration.
    const STATE_ENCODING: Encoding = Encoding::Json;

    /// Called once per instance before its first record, with the operator's
    /// `[operator.config]` table. The default accepts any config.
    fn init(config: Vec<(String, String)>) -> Result<()> {
        let _ = config;
        Ok(())
    }

    /// Processes one record: read and write `state` for the record's key, return the
    /// outputs. An `Err` sends the record to the dead-letter destination with the
    /// error as its reason and discards the record's state writes.
    fn process(record: Record, state: &State<'_>) -> Result<Vec<Output>>;

    /// Called when a state entry of this operator expired (a TTL from
    /// [`State::put_with_ttl`] or the host's `[ttl]` config), after the host removed
    /// it and before the next record of its key: `state` is scoped to the entry's key.
    /// The outputs are emitted marked as the expiry's; the removal, the writes and the
    /// outputs are committed together, so each expiry is handled once. An `Err` sends
    /// the entry to the dead-letter destination and discards the writes; the entry
    /// stays removed. The default emits nothing.
    fn expired(entry: Expired, state: &State<'_>) -> Result<Vec<Output>> {
        let _ = (entry, state);
        Ok(Vec::new())
    }

    /// Called when a timer set with [`State::set_timer`] fires: the partition's clock
    /// reached its time. It runs after the host removed the timer and before the record
    /// that moved the clock past it, with `state` scoped to the timer's key (it may set
    /// timers again, for later times). The outputs are emitted marked as the timer's;
    /// the removal, the writes and the outputs are committed together, so each timer
    /// fires once. An `Err` sends the timer to the dead-letter destination and discards
    /// the writes. The default emits nothing.
    fn fired(timer: Timer, state: &State<'_>) -> Result<Vec<Output>> {
        let _ = (timer, state);
        Ok(Vec::new())
    }
}

/// The value of `name` in an operator's config (the pairs [`Operator::init`] gets),
/// parsed as `T`; `None` when the config has no `name`. The error names the setting,
/// its value and why it does not parse, which `init` can return as it is.
///
/// ```
/// let config = vec![("window_ms".to_string(), "60000".to_string())];
/// assert_eq!(sluice_guest::config_value::<u64>(&config, "window_ms").unwrap(), Some(60_000));
/// assert_eq!(sluice_guest::config_value::<u64>(&config, "gap_ms").unwrap(), None);
/// ```
pub fn config_value<T>(config: &[(String, String)], name: &str) -> Result<Option<T>>
where
    T: std::str::FromStr,
    T::Err: fmt::Display,
{
    let Some((_, value)) = config.iter().find(|(key, _)| key == name) else { return Ok(None) };
    let parsed = value.parse().map_err(|e| Error::msg(format!("operator config {name} = {value:?}: {e}")))?;
    Ok(Some(parsed))
}

/// A state entry that expired.
#[derive(Debug, Clone, PartialEq)]
pub struct Expired {
    /// The record key it belonged to.
    pub key: Vec<u8>,
    /// Its state name.
    pub name: String,
    /// The bytes it held, as [`State::put`] stored them.
    pub value: Vec<u8>,
    /// When it expired on the partition's clock, ms since the Unix epoch.
    pub expired_at_ms: u64,
}

impl Expired {
    /// The value it held, decoded as [`State::get`] would have.
    pub fn value<T: DeserializeOwned>(&self) -> Result<T> {
        encoding::decode(&self.value).map_err(|e| {
            Error::msg(format!("expired state `{}` does not decode as {}: {e}", self.name, std::any::type_name::<T>()))
        })
    }
}

/// A timer that fired (see [`State::set_timer`] and [`Operator::fired`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Timer {
    /// The record key it was set for.
    pub key: Vec<u8>,
    /// Its name, as [`State::set_timer`] set it.
    pub name: String,
    /// The time it was set for, on the partition's clock, ms since the Unix epoch.
    pub at_ms: u64,
}

/// An operator's error: a message for the dead-letter record or the host's log.
///
/// Any `std::error::Error` converts into it, so `?` works on serde, parsing and I/O
/// results alike.
#[derive(Debug, Clone, PartialEq)]
pub struct Error {
    message: String,
    late: bool,
}

impl Error {
    /// An error with the given message.
    pub fn msg(message: impl fmt::Display) -> Self {
        Error { message: message.to_string(), late: false }
    }

    /// The error of a record that came too late for its windows (see [`window`]): the
    /// host sends it to the dead letters as `late`, not `rejected`, and counts it in the
    /// partition's late records.
    pub fn late(message: impl fmt::Display) -> Self {
        Error { message: message.to_string(), late: true }
    }

    /// Whether it is a [late](Error::late) record's.
    pub fn is_late(&self) -> bool {
        self.late
    }
}

impl<E: std::error::Error> From<E> for Error {
    fn from(error: E) -> Self {
        Error::msg(error)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// The result type of operator code.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// One input record.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// The partitioning key; [`State`] is scoped to it.
    pub key: Vec<u8>,
    /// The payload.
    pub value: Vec<u8>,
    /// Event time, milliseconds since the Unix epoch.
    pub timestamp_ms: i64,
    /// The source partition.
    pub partition: u32,
    /// The offset within the partition.
    pub offset: u64,
    /// Record headers, in order.
    pub headers: Vec<(String, Vec<u8>)>,
}

impl Record {
    /// A record of `key` and `value` at event time `timestamp_ms`, at offset 0 of
    /// partition 0, without headers: for native tests.
    pub fn new(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>, timestamp_ms: i64) -> Self {
        Record { key: key.into(), value: value.into(), timestamp_ms, partition: 0, offset: 0, headers: Vec::new() }
    }

    /// Parses the value as JSON into `T`; the error names the field that did not match
    /// and the position in the value.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T> {
        // The plain parser first: tracking the path costs on every record, and only a
        // record that fails needs it, parsed a second time for the error message.
        if let Ok(value) = serde_json::from_slice(&self.value) {
            return Ok(value);
        }
        let mut json = serde_json::Deserializer::from_slice(&self.value);
        serde_path_to_error::deserialize(&mut json).map_err(|e| match e.path().to_string().as_str() {
            "." => Error::msg(format!("value is not valid JSON for this operator: {}", e.inner())),
            path => Error::msg(format!("value is not valid JSON for this operator: field `{path}`: {}", e.inner())),
        })
    }

    /// The key as UTF-8 text.
    pub fn key_str(&self) -> Result<&str> {
        std::str::from_utf8(&self.key).map_err(|e| Error::msg(format!("key is not UTF-8: {e}")))
    }
}

impl From<types::InputRecord> for Record {
    fn from(r: types::InputRecord) -> Self {
        Record {
            key: r.key,
            value: r.value,
            timestamp_ms: r.timestamp_ms,
            partition: r.partition,
            offset: r.offset,
            headers: r.headers.into_iter().map(|h| (h.key, h.value)).collect(),
        }
    }
}

/// One record an operator emits.
#[derive(Debug, Clone, PartialEq)]
pub struct Output {
    /// The output key.
    pub key: Vec<u8>,
    /// The output payload.
    pub value: Vec<u8>,
    /// Destination topic; `None` sends it to the job's sink.
    pub topic: Option<String>,
}

impl Output {
    /// An output with raw bytes.
    pub fn new(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Self {
        Output { key: key.into(), value: value.into(), topic: None }
    }

    /// An output whose value is `value` serialized as JSON.
    pub fn json<T: Serialize + ?Sized>(key: impl Into<Vec<u8>>, value: &T) -> Result<Self> {
        Ok(Output::new(key, serde_json::to_vec(value)?))
    }

    /// Sends this output to `topic` instead of the job's sink.
    pub fn to_topic(mut self, topic: impl Into<String>) -> Self {
        self.topic = Some(topic.into());
        self
    }
}

/// Keyed state for the record being processed.
///
/// Every value lives under a name and the current record's key; another key's state
/// is out of reach. Values are any `Serialize + DeserializeOwned` type, stored in the
/// operator's [`Operator::STATE_ENCODING`]. Writes become durable only if `process`
/// returns normally.
///
/// Inside the host, calls go to the `sluice:operator/state` interface. Compiled for
/// any other target, a `State` reads and writes a [`native::StateBackend`], so the
/// same operator code runs in native tests and benchmarks.
pub struct State<'a> {
    #[cfg(target_arch = "wasm32")]
    backend: std::marker::PhantomData<&'a ()>,
    #[cfg(not(target_arch = "wasm32"))]
    backend: &'a dyn native::StateBackend,
    /// How `put` encodes.
    encoding: Encoding,
}

impl State<'_> {
    /// The value under `name`, or `None` if nothing is stored. Fails if the stored
    /// bytes do not deserialize into `T`, naming the state entry.
    pub fn get<T: DeserializeOwned>(&self, name: &str) -> Result<Option<T>> {
        match self.get_bytes(name) {
            None => Ok(None),
            Some(bytes) => encoding::decode(&bytes).map(Some).map_err(|e| {
                Error::msg(format!("state `{name}` does not decode as {}: {e}", std::any::type_name::<T>()))
            }),
        }
    }

    /// Stores `value` under `name`. Fails, naming the entry, if `value` cannot be
    /// encoded so that it reads back (a NaN or infinite float in JSON).
    pub fn put<T: Serialize + ?Sized>(&self, name: &str, value: &T) -> Result<()> {
        self.put_bytes(name, &self.encode(name, value)?);
        Ok(())
    }

    /// `value` as this state stores it under `name`.
    fn encode<T: Serialize + ?Sized>(&self, name: &str, value: &T) -> Result<Vec<u8>> {
        encoding::encode(value, self.encoding).map_err(|e| Error::msg(format!("state `{name}` cannot be stored: {e}")))
    }

    /// Stores `value` under `name`, to expire `ttl` after the partition's clock now
    /// (event time unless the host counts TTLs in processing time), whatever the host's
    /// config says for `name`; [`Operator::expired`] is then called with it. Every put
    /// sets the expiry anew; reads do not extend it. A TTL under 1 ms (whole
    /// milliseconds count) traps: it would be due at once.
    #[cfg(not(feature = "wit-0-1-0"))]
    pub fn put_with_ttl<T: Serialize + ?Sized>(&self, name: &str, value: &T, ttl: std::time::Duration) -> Result<()> {
        self.put_bytes_with_ttl(name, &self.encode(name, value)?, ttl);
        Ok(())
    }

    /// Sets this key's timer `name` to fire at `at_ms` (ms since the Unix epoch) on the
    /// partition's clock — event time less the host's `[ttl] lateness`, the watermark,
    /// unless the host counts in processing time — replacing the time it had; then
    /// [`Operator::fired`] is called with it. A time the clock has reached fires before
    /// the next record; from `fired` or `expired` that traps (it would fire at once,
    /// without end). Timers live with the key's state: they survive restarts, restores
    /// and hot swaps, and each fires once.
    #[cfg(not(any(feature = "wit-0-1-0", feature = "wit-0-1-2")))]
    pub fn set_timer(&self, name: &str, at_ms: u64) {
        #[cfg(target_arch = "wasm32")]
        bindings::sluice::operator::timers::set(name, at_ms);
        #[cfg(not(target_arch = "wasm32"))]
        self.backend.set_timer(name, at_ms);
    }

    /// Cancels this key's timer `name`; cancelling a timer that is not set is fine.
    #[cfg(not(any(feature = "wit-0-1-0", feature = "wit-0-1-2")))]
    pub fn cancel_timer(&self, name: &str) {
        #[cfg(target_arch = "wasm32")]
        bindings::sluice::operator::timers::cancel(name);
        #[cfg(not(target_arch = "wasm32"))]
        self.backend.cancel_timer(name);
    }

    /// The partition's clock now, ms since the Unix epoch (0 before event time began):
    /// what timers fire at — in event time the largest timestamp seen, this record's
    /// included, less the host's `[ttl] lateness`: the watermark.
    #[cfg(not(any(feature = "wit-0-1-0", feature = "wit-0-1-2")))]
    pub fn now(&self) -> u64 {
        #[cfg(target_arch = "wasm32")]
        return bindings::sluice::operator::timers::now();
        #[cfg(not(target_arch = "wasm32"))]
        return self.backend.now();
    }

    /// Removes the value under `name`.
    pub fn delete(&self, name: &str) {
        #[cfg(target_arch = "wasm32")]
        wit_state::delete(name);
        #[cfg(not(target_arch = "wasm32"))]
        self.backend.delete(name);
    }

    /// The raw bytes under `name`.
    pub fn get_bytes(&self, name: &str) -> Option<Vec<u8>> {
        #[cfg(target_arch = "wasm32")]
        return wit_state::get(name);
        #[cfg(not(target_arch = "wasm32"))]
        return self.backend.get(name);
    }

    /// Stores raw bytes under `name`.
    pub fn put_bytes(&self, name: &str, value: &[u8]) {
        #[cfg(target_arch = "wasm32")]
        wit_state::put(name, value);
        #[cfg(not(target_arch = "wasm32"))]
        self.backend.put(name, value, None);
    }

    /// Stores raw bytes under `name`, expiring as [`put_with_ttl`](Self::put_with_ttl) says.
    #[cfg(not(feature = "wit-0-1-0"))]
    pub fn put_bytes_with_ttl(&self, name: &str, value: &[u8], ttl: std::time::Duration) {
        #[cfg(target_arch = "wasm32")]
        wit_state::put_with_ttl(name, value, ttl.as_millis().try_into().unwrap_or(u64::MAX));
        #[cfg(not(target_arch = "wasm32"))]
        self.backend.put(name, value, Some(ttl));
    }
}

/// Exports a type implementing [`Operator`] as this component's operator.
///
/// Use it once, at the crate root of a `cdylib` built for `wasm32-wasip2`.
#[macro_export]
macro_rules! export_operator {
    ($operator:ty) => {
        #[doc(hidden)]
        #[cfg(target_arch = "wasm32")]
        struct __SluiceOperatorExport;

        #[cfg(target_arch = "wasm32")]
        impl $crate::bindings::Guest for __SluiceOperatorExport {
            fn init(config: ::std::vec::Vec<(::std::string::String, ::std::string::String)>) -> ::std::result::Result<(), ::std::string::String> {
                $crate::__private::init::<$operator>(config)
            }

            fn process(
                record: $crate::bindings::InputRecord,
            ) -> ::std::result::Result<::std::vec::Vec<$crate::bindings::OutputRecord>, ::std::string::String> {
                $crate::__private::process::<$operator>(record)
            }

            $crate::__export_since_0_1_1!($operator);
            $crate::__export_since_0_1_3!($operator);
        }

        #[cfg(target_arch = "wasm32")]
        $crate::bindings::__export_operator_world!(__SluiceOperatorExport with_types_in $crate::bindings);
    };
}

/// The exports added by 0.1.1 and 0.1.2 (`process-batch`, `expired`); nothing for a
/// 0.1.0 build.
#[doc(hidden)]
#[macro_export]
#[cfg(not(feature = "wit-0-1-0"))]
macro_rules! __export_since_0_1_1 {
    ($operator:ty) => {
        fn process_batch(inputs: ::std::vec::Vec<$crate::bindings::InputRecord>) {
            $crate::__private::process_batch::<$operator>(inputs)
        }

        fn expired(
            key: ::std::vec::Vec<u8>,
            name: ::std::string::String,
            value: ::std::vec::Vec<u8>,
            expired_at_ms: u64,
        ) -> ::std::result::Result<::std::vec::Vec<$crate::bindings::OutputRecord>, ::std::string::String> {
            $crate::__private::expired::<$operator>($crate::Expired { key, name, value, expired_at_ms })
        }
    };
}

/// The export added by 0.1.3 (`fired`); nothing for a 0.1.0 or 0.1.2 build.
#[doc(hidden)]
#[macro_export]
#[cfg(not(any(feature = "wit-0-1-0", feature = "wit-0-1-2")))]
macro_rules! __export_since_0_1_3 {
    ($operator:ty) => {
        fn fired(
            key: ::std::vec::Vec<u8>,
            name: ::std::string::String,
            at_ms: u64,
        ) -> ::std::result::Result<::std::vec::Vec<$crate::bindings::OutputRecord>, ::std::string::String> {
            $crate::__private::fired::<$operator>($crate::Timer { key, name, at_ms })
        }
    };
}

/// The exports added by 0.1.1 and 0.1.2: none in a 0.1.0 build.
#[doc(hidden)]
#[macro_export]
#[cfg(feature = "wit-0-1-0")]
macro_rules! __export_since_0_1_1 {
    ($operator:ty) => {};
}

/// The export added by 0.1.3: none in a 0.1.0 or 0.1.2 build.
#[doc(hidden)]
#[macro_export]
#[cfg(any(feature = "wit-0-1-0", feature = "wit-0-1-2"))]
macro_rules! __export_since_0_1_3 {
    ($operator:ty) => {};
}

#[doc(hidden)]
pub mod __private {
    //! What [`export_operator!`] expands to calls; not part of the API.
    use super::*;

    pub use wit_bindgen;

    /// The host calls `init` first in every instance, so the hook is in place before
    /// any operator code runs.
    pub fn init<O: Operator>(config: Vec<(String, String)>) -> std::result::Result<(), String> {
        // std's default hook reads the environment, which traps in the sandbox before
        // the message is printed; this one hands the message to the host, which names
        // it in the error (init) or the dead letter (process).
        #[cfg(target_arch = "wasm32")]
        std::panic::set_hook(Box::new(|info| log::log(log::Level::Error, &info.to_string())));
        O::init(config).map_err(|e| e.message)
    }

    #[cfg(target_arch = "wasm32")]
    pub fn process<O: Operator>(record: types::InputRecord) -> std::result::Result<Vec<types::OutputRecord>, String> {
        outputs(O::process(record.into(), &state::<O>()))
    }

    #[cfg(all(target_arch = "wasm32", not(feature = "wit-0-1-0")))]
    pub fn expired<O: Operator>(entry: Expired) -> std::result::Result<Vec<types::OutputRecord>, String> {
        outputs(O::expired(entry, &state::<O>()))
    }

    #[cfg(all(target_arch = "wasm32", not(any(feature = "wit-0-1-0", feature = "wit-0-1-2"))))]
    pub fn fired<O: Operator>(timer: Timer) -> std::result::Result<Vec<types::OutputRecord>, String> {
        outputs(O::fired(timer, &state::<O>()))
    }

    /// The state of the host's current key, as `O` stores it.
    #[cfg(target_arch = "wasm32")]
    fn state<O: Operator>() -> State<'static> {
        State { backend: std::marker::PhantomData, encoding: O::STATE_ENCODING }
    }

    /// What the host gets of an operator's result.
    #[cfg(target_arch = "wasm32")]
    fn outputs(result: Result<Vec<Output>>) -> std::result::Result<Vec<types::OutputRecord>, String> {
        #[cfg(not(any(feature = "wit-0-1-0", feature = "wit-0-1-2")))]
        if result.as_ref().is_err_and(Error::is_late) {
            bindings::sluice::operator::timers::mark_late();
        }
        let outputs = result.map_err(|e| e.message)?;
        Ok(outputs.into_iter().map(|o| types::OutputRecord { key: o.key, value: o.value, topic: o.topic }).collect())
    }

    /// Each input through [`process`], its result handed to the host before the next
    /// starts: the host scopes state to the current input's key and keeps or discards
    /// its writes by that result.
    #[cfg(all(target_arch = "wasm32", not(feature = "wit-0-1-0")))]
    pub fn process_batch<O: Operator>(inputs: Vec<types::InputRecord>) {
        for input in inputs {
            let outcome = process::<O>(input);
            bindings::sluice::operator::batch::finish(outcome.as_deref().map_err(String::as_str));
        }
    }
}
