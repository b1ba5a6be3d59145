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
}

impl<'a> State<'a> {
    /// A `State` over `backend` that writes values as `encoding` (pass the
    /// operator's [`Operator::STATE_ENCODING`](crate::Operator::STATE_ENCODING)).
    pub fn native(backend: &'a dyn StateBackend, encoding: crate::Encoding) -> Self {
        State { backend, encoding }
    }
}

/// (key, name) → value.
type Entries = BTreeMap<(Vec<u8>, String), Vec<u8>>;

/// Every key's state in memory, for native unit tests of an operator's logic:
/// [`MemoryState::process`] scopes it to the record's key as the host does. TTLs
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
    entries: RefCell<Entries>,
    key: RefCell<Vec<u8>>,
}

impl MemoryState {
    /// Calls `O::process` for `record` with the state of its key; a record the
    /// operator fails keeps none of its writes, as in the host.
    pub fn process<O: crate::Operator>(&self, record: crate::Record) -> crate::Result<Vec<crate::Output>> {
        *self.key.borrow_mut() = record.key.clone();
        let before = self.entries.borrow().clone();
        let outputs = O::process(record, &State::native(self, O::STATE_ENCODING));
        if outputs.is_err() {
            *self.entries.borrow_mut() = before;
        }
        outputs
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
}
