//! Running operators outside the sandbox, against state the caller provides: for
//! native unit tests of operator logic and for the host's native-baseline benchmark.

use super::State;
use std::cell::RefCell;
use std::collections::BTreeMap;

/// Where a native [`State`] reads and writes, already scoped to the current key.
pub trait StateBackend {
    /// The value under `name`.
    fn get(&self, name: &str) -> Option<Vec<u8>>;
    /// Stores `value` under `name`, expiring `ttl` from now if given (else as
    /// the backend's own policy says).
    fn put(&self, name: &str, value: &[u8], ttl: Option<std::time::Duration>);
    /// Removes `name`.
    fn delete(&self, name: &str);
    /// Sets the timer `name` to fire at `at_ms`. A backend without timers (the
    /// benchmarks') panics: only an operator that sets timers calls it.
    fn set_timer(&self, name: &str, at_ms: u64) {
        panic!("this state backend keeps no timers (set_timer({name:?}, {at_ms}))");
    }
    /// Cancels the timer `name`; see [`set_timer`](Self::set_timer).
    fn cancel_timer(&self, name: &str) {
        panic!("this state backend keeps no timers (cancel_timer({name:?}))");
    }
    /// The clock timers fire at; see [`set_timer`](Self::set_timer).
    fn now(&self) -> u64 {
        panic!("this state backend keeps no clock");
    }
}

impl<'a> State<'a> {
    /// A `State` over `backend` that writes values as `encoding` (pass the
    /// operator's [`Operator::STATE_ENCODING`](crate::Operator::STATE_ENCODING)).
    pub fn native(backend: &'a dyn StateBackend, encoding: crate::Encoding) -> Self {
        State { backend, encoding }
    }
}

/// (key, name) → value, or a timer's time.
type Entries<T> = BTreeMap<(Vec<u8>, String), T>;

/// Every key's state and timers in memory, for native unit tests of an operator's
/// logic: [`MemoryState::process`] scopes it to the record's key as the host does, and
/// [`MemoryState::fire_until`] fires the timers a clock reaching a time would. TTLs
/// are not kept (expiry is the host's: test it in the sandbox, with `sluice test`
/// or the `sluice-test` kit).
///
/// ```
/// use sluice_guest::native::MemoryState;
/// use sluice_guest::{Operator, Output, Record, Result, State};
///
/// struct Counter;
/// impl Operator for Counter {
///     fn process(record: Record, state: &State<'_>) -> Result<Vec<Output>> {
///         let seen = state.get::<u64>("seen")?.unwrap_or(0) + 1;
///         state.put("seen", &seen)?;
///         Ok(vec![Output::json(record.key, &seen)?])
///     }
/// }
///
/// let state = MemoryState::default();
/// state.process::<Counter>(Record::new("a", "{}", 0)).unwrap();
/// let outputs = state.process::<Counter>(Record::new("a", "{}", 1)).unwrap();
/// assert_eq!(outputs[0].value, b"2");
/// assert_eq!(state.get::<u64>("a", "seen").unwrap(), Some(2));
/// ```
#[derive(Default)]
pub struct MemoryState {
    entries: RefCell<Entries<Vec<u8>>>,
    timers: RefCell<Entries<u64>>,
    key: RefCell<Vec<u8>>,
    /// While [`fire_until`](MemoryState::fire_until) runs, its time: a timer set for it
    /// or before would fire without end, which the host traps and this refuses.
    firing_until: std::cell::Cell<Option<u64>>,
    /// The clock: the latest time [`fire_until`](MemoryState::fire_until) reached.
    now: std::cell::Cell<u64>,
}

impl MemoryState {
    /// Calls `O::process` for `record` with the state of its key; a record the
    /// operator fails keeps none of its writes, as in the host.
    pub fn process<O: crate::Operator>(&self, record: crate::Record) -> crate::Result<Vec<crate::Output>> {
        let key = record.key.clone();
        self.scoped(&key, |state| O::process(record, state), O::STATE_ENCODING)
    }

    /// Fires, in time order (then key and name order), every timer set for `until_ms`
    /// or before, calling `O::fired` for each as the host does when its clock reaches
    /// `until_ms`; returns the outputs in that order. A timer whose `fired` fails is
    /// removed all the same; one that `fired` sets for `until_ms` or before panics (the
    /// host traps: it would fire without end).
    ///
    /// ```
    /// use sluice_guest::native::MemoryState;
    /// use sluice_guest::{Operator, Output, Record, Result, State, Timer};
    ///
    /// /// Emits a key's count a minute after its first record.
    /// struct Minute;
    /// impl Operator for Minute {
    ///     fn process(record: Record, state: &State<'_>) -> Result<Vec<Output>> {
    ///         let seen = state.get::<u64>("seen")?.unwrap_or(0) + 1;
    ///         state.put("seen", &seen)?;
    ///         if seen == 1 {
    ///             state.set_timer("minute", record.timestamp_ms as u64 + 60_000);
    ///         }
    ///         Ok(Vec::new())
    ///     }
    ///
    ///     fn fired(timer: Timer, state: &State<'_>) -> Result<Vec<Output>> {
    ///         Ok(vec![Output::json(timer.key, &state.get::<u64>("seen")?)?])
    ///     }
    /// }
    ///
    /// let state = MemoryState::default();
    /// state.process::<Minute>(Record::new("a", "{}", 1_000)).unwrap();
    /// state.process::<Minute>(Record::new("a", "{}", 2_000)).unwrap();
    /// assert_eq!(state.timers("a"), [("minute".to_string(), 61_000)]);
    /// assert!(state.fire_until::<Minute>(60_999).unwrap().is_empty());
    /// assert_eq!(state.fire_until::<Minute>(61_000).unwrap()[0].value, b"2");
    /// assert!(state.timers("a").is_empty());
    /// ```
    pub fn fire_until<O: crate::Operator>(&self, until_ms: u64) -> crate::Result<Vec<crate::Output>> {
        self.now.set(self.now.get().max(until_ms));
        self.firing_until.set(Some(until_ms));
        let fired = self.fire_due::<O>(until_ms);
        self.firing_until.set(None);
        fired
    }

    fn fire_due<O: crate::Operator>(&self, until_ms: u64) -> crate::Result<Vec<crate::Output>> {
        let mut outputs = Vec::new();
        loop {
            let due = self
                .timers
                .borrow()
                .iter()
                .filter(|(_, at)| **at <= until_ms)
                .min_by_key(|(_, at)| **at)
                .map(|((key, name), at)| crate::Timer { key: key.clone(), name: name.clone(), at_ms: *at });
            let Some(timer) = due else { return Ok(outputs) };
            self.timers.borrow_mut().remove(&(timer.key.clone(), timer.name.clone()));
            let key = timer.key.clone();
            outputs.extend(self.scoped(&key, |state| O::fired(timer, state), O::STATE_ENCODING)?);
        }
    }

    /// The timers set for `key`: each name and time, in name order.
    pub fn timers(&self, key: impl AsRef<[u8]>) -> Vec<(String, u64)> {
        let timers = self.timers.borrow();
        timers.iter().filter(|((k, _), _)| k == key.as_ref()).map(|((_, name), at)| (name.clone(), *at)).collect()
    }

    /// Runs `call` with the state of `key`; keeps its writes and timers only if it
    /// returns outputs, as the host does.
    fn scoped<R>(
        &self,
        key: &[u8],
        call: impl FnOnce(&State<'_>) -> crate::Result<R>,
        encoding: crate::Encoding,
    ) -> crate::Result<R> {
        *self.key.borrow_mut() = key.to_vec();
        let before = (self.entries.borrow().clone(), self.timers.borrow().clone());
        let result = call(&State::native(self, encoding));
        if result.is_err() {
            (*self.entries.borrow_mut(), *self.timers.borrow_mut()) = before;
        }
        result
    }

    /// The value `key` holds under `name`, decoded as [`State::get`] would.
    pub fn get<T: serde::de::DeserializeOwned>(&self, key: impl AsRef<[u8]>, name: &str) -> crate::Result<Option<T>> {
        let entries = self.entries.borrow();
        let Some(bytes) = entries.get(&(key.as_ref().to_vec(), name.to_string())) else { return Ok(None) };
        crate::encoding::decode(bytes).map(Some).map_err(|e| crate::Error::msg(format!("state `{name}`: {e}")))
    }
}

impl StateBackend for MemoryState {
    fn get(&self, name: &str) -> Option<Vec<u8>> {
        self.entries.borrow().get(&(self.key.borrow().clone(), name.to_string())).cloned()
    }

    fn put(&self, name: &str, value: &[u8], _ttl: Option<std::time::Duration>) {
        self.entries.borrow_mut().insert((self.key.borrow().clone(), name.to_string()), value.to_vec());
    }

    fn delete(&self, name: &str) {
        self.entries.borrow_mut().remove(&(self.key.borrow().clone(), name.to_string()));
    }

    fn set_timer(&self, name: &str, at_ms: u64) {
        if let Some(until) = self.firing_until.get().filter(|until| at_ms <= *until) {
            panic!("timer {name:?} set for {at_ms} while firing timers until {until}: it would fire without end");
        }
        self.timers.borrow_mut().insert((self.key.borrow().clone(), name.to_string()), at_ms);
    }

    fn cancel_timer(&self, name: &str) {
        self.timers.borrow_mut().remove(&(self.key.borrow().clone(), name.to_string()));
    }

    fn now(&self) -> u64 {
        self.now.get()
    }
}
