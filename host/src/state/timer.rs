//! Timers: a partition's timers in a structure made for them.
//!
//! A timer `name` of a key is named as a state entry of that key under a name reserved
//! for the host ([`entry_name`]), so it sorts, dumps and fires among the key's entries
//! as one; but it is kept apart from the values. [`Timers`] holds every timer of the
//! partition in memory, ordered by (time, entry key) — the order of the expiry index, so
//! timers fire in time order with the expiries, the same whatever the commits — and
//! indexed by entry key, so setting, cancelling and firing one costs no read of the
//! database, no value and no cache entry. The committed timers live in their own column
//! family (entry key → time) that the [`Transaction`](super::Transaction)'s commit
//! writes in the same write batch as the values, the offset and the clock; a partition
//! opened here loads them. What a fired timer does is the operator layer's.
//!
//! The memory they take is bounded by `[state] timers_mib`: a timer set past it fails
//! its record.

use super::EntryMap;
use super::Expired;
use super::expiry::{index_at, index_entry, index_key};
use anyhow::Result;
use foldhash::fast::RandomState;
use rocksdb::{ColumnFamily, WriteBatch};
use std::collections::{BTreeSet, HashMap};

/// What the names of the state entries that hold timers begin with. Operators' state
/// names may not ([`is_reserved`]): a NUL is no name's first character in practice.
const TIMER_PREFIX: &str = "\u{0}timer:";

/// What each timer costs in memory beyond its entry key held twice: the tree's and the
/// table's slots, the time, the vectors' headers, roughly.
const TIMER_OVERHEAD: usize = 96;

/// The state entry name holding the timer `name`.
pub(super) fn entry_name(name: &str) -> String {
    format!("{TIMER_PREFIX}{name}")
}

/// Whether an operator's state name is one reserved for the host's timers.
pub fn is_reserved(name: &str) -> bool {
    name.starts_with('\u{0}')
}

/// The name of the timer a state entry `name` holds, when it holds one.
pub fn timer_of(name: &str) -> Option<&str> {
    name.strip_prefix(TIMER_PREFIX)
}

/// Whether an encoded entry key's name (after its key) is a timer's.
pub(super) fn is_timer_name(name: &[u8]) -> bool {
    name.starts_with(TIMER_PREFIX.as_bytes())
}

impl Expired {
    /// The timer's name, when the entry held a timer (which fired) rather than a value.
    pub fn timer(&self) -> Option<&str> {
        timer_of(&self.name)
    }
}

/// A partition's timers: the committed ones with the batch's sets, cancels and
/// firings applied, and what the next commit writes.
#[derive(Clone, Default)]
pub(super) struct Timers {
    /// Every timer by its [`index_key`] (time, then entry key): the order they fire in.
    order: BTreeSet<Vec<u8>>,
    /// Every timer set, or committed and not yet removed by a commit, by its encoded
    /// entry key: what a set or a cancel replaces, and what a commit writes.
    slots: EntryMap<Slot>,
    /// The entries whose slot changed since the last commit (one may be named twice:
    /// the commit writes each once).
    changed: Vec<Vec<u8>>,
    /// How many slots' time differs from their committed one.
    dirty: usize,
    /// The memory the slots take, roughly: [`TIMER_OVERHEAD`] and the entry key twice
    /// each.
    bytes: usize,
}

/// A timer's time now and as committed; one of them is set.
#[derive(Clone, Copy, PartialEq)]
struct Slot {
    at: Option<u64>,
    committed: Option<u64>,
}

impl Slot {
    fn dirty(self) -> bool {
        self.at != self.committed
    }
}

impl Timers {
    /// The committed timers, as [`PartitionStore::timers`](super::PartitionStore::timers)
    /// reads them.
    pub(super) fn load(committed: impl Iterator<Item = Result<(Vec<u8>, u64)>>) -> Result<Self> {
        let mut timers = Timers::default();
        for timer in committed {
            let (entry, at) = timer?;
            timers.bytes += Self::cost(&entry);
            timers.order.insert(index_key(at, &entry));
            timers.slots.insert(entry, Slot { at: Some(at), committed: Some(at) });
        }
        Ok(timers)
    }

    /// The memory the timers take, roughly: a fired or cancelled timer's until the
    /// next commit.
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether a timer is set under `entry`, or was until the next commit.
    pub(super) fn holds(&self, entry: &[u8]) -> bool {
        self.slots.contains_key(entry)
    }

    /// The memory a timer under `entry` takes.
    pub(super) fn cost(entry: &[u8]) -> usize {
        TIMER_OVERHEAD + 2 * entry.len()
    }

    /// Sets the timer under `entry` to `at`, or cancels it (`None`).
    pub(super) fn set(&mut self, entry: Vec<u8>, at: Option<u64>) {
        let Some(slot) = self.slots.get_mut(&entry) else {
            // Cancelling a timer that is not set changes nothing.
            if let Some(at) = at {
                self.bytes += Self::cost(&entry);
                self.order.insert(index_key(at, &entry));
                self.slots.insert(entry.clone(), Slot { at: Some(at), committed: None });
                self.dirty += 1;
                self.changed.push(entry);
            }
            return;
        };
        if slot.at == at {
            return;
        }
        let before = *slot;
        slot.at = at;
        let after = *slot;
        if let Some(old) = before.at {
            self.order.remove(&index_key(old, &entry));
        }
        if let Some(at) = at {
            self.order.insert(index_key(at, &entry));
        }
        self.changed_slot(entry, before, after);
    }

    /// Counts a slot's change from `before` to `after`, and forgets it when it holds
    /// nothing now nor as committed.
    fn changed_slot(&mut self, entry: Vec<u8>, before: Slot, after: Slot) {
        self.dirty = self.dirty + usize::from(after.dirty()) - usize::from(before.dirty());
        if after.at.is_none() && after.committed.is_none() {
            self.slots.remove(&entry);
            self.bytes -= Self::cost(&entry);
        } else if !before.dirty() {
            self.changed.push(entry);
        }
    }

    /// The earliest time a timer fires at; `u64::MAX`: none.
    pub(super) fn next_at(&self) -> u64 {
        self.order.first().map_or(u64::MAX, |key| index_at(key))
    }

    /// The index key of the earliest timer, if it is due at `clock_ms`.
    pub(super) fn first_due(&self, clock_ms: u64) -> Option<&[u8]> {
        self.order.first().filter(|key| index_at(key) <= clock_ms).map(Vec::as_slice)
    }

    /// Fires the earliest timer (the caller saw it due): it is gone, and the next
    /// commit removes it. Returns its index key.
    pub(super) fn fire_first(&mut self) -> Option<Vec<u8>> {
        let key = self.order.pop_first()?;
        let entry = index_entry(&key);
        let slot = self.slots.get_mut(entry).expect("every timer in the order has a slot");
        let before = *slot;
        slot.at = None;
        let after = *slot;
        self.changed_slot(entry.to_vec(), before, after);
        Some(key)
    }

    /// How many timers are due at `clock_ms`, up to `limit`.
    pub(super) fn count_due(&self, clock_ms: u64, limit: usize) -> usize {
        self.order.iter().take(limit).take_while(|key| index_at(key) <= clock_ms).count()
    }

    /// Whether timers changed since the last commit.
    pub(super) fn has_changes(&self) -> bool {
        self.dirty > 0
    }

    /// The times of the timers changed since the last commit, by entry.
    fn changes(&self) -> HashMap<&[u8], Option<u64>, RandomState> {
        let slots = self.changed.iter().filter_map(|entry| Some((entry.as_slice(), self.slots.get(entry.as_slice())?)));
        slots.filter(|(_, slot)| slot.dirty()).map(|(entry, slot)| (entry, slot.at)).collect()
    }

    /// How many timers `other` (a copy of these at the last commit) changed otherwise
    /// than these since: another time, or a change only one of them made.
    pub(super) fn differing(&self, other: &Timers) -> usize {
        let (ours, theirs) = (self.changes(), other.changes());
        let ours_differ = ours.iter().filter(|(entry, at)| theirs.get(*entry) != Some(at)).count();
        ours_differ + theirs.keys().filter(|entry| !ours.contains_key(*entry)).count()
    }

    /// Stages the changes since the last commit in `batch`, in the column family
    /// `family` and in key order (RocksDB inserts sorted keys faster), and takes them as
    /// committed; returns how many timers that adds to the entry count (negative:
    /// removes).
    pub(super) fn write_changes(&mut self, batch: &mut WriteBatch, family: &ColumnFamily) -> i64 {
        let mut changed = std::mem::take(&mut self.changed);
        changed.sort_unstable();
        changed.dedup();
        let mut added = 0;
        for entry in changed {
            let Some(slot) = self.slots.get_mut(&entry).filter(|slot| slot.dirty()) else { continue };
            match slot.at {
                Some(at) => {
                    added += i64::from(slot.committed.is_none());
                    batch.put_cf(family, &entry, at.to_be_bytes());
                    slot.committed = Some(at);
                }
                None => {
                    added -= 1;
                    batch.delete_cf(family, &entry);
                    self.slots.remove(&entry);
                    self.bytes -= Self::cost(&entry);
                }
            }
        }
        self.dirty = 0;
        added
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timers_entry_is_reserved_and_names_the_timer_back() {
        let expired = Expired { key: b"k".to_vec(), name: entry_name("close"), value: Vec::new(), expired_at_ms: 5 };
        assert!(is_reserved(&expired.name));
        assert_eq!(expired.timer(), Some("close"));
        let value = Expired { name: "close".into(), ..expired };
        assert!(!is_reserved(&value.name));
        assert_eq!(value.timer(), None);
    }

    /// Sets, resets, cancels and firings since a commit come down to what differs from
    /// the committed timers; a timer set and fired, or set and cancelled, between two
    /// commits is written never.
    #[test]
    fn changes_since_a_commit_are_what_differs_from_the_committed_timers() {
        let mut timers = Timers::load([Ok((b"c".to_vec(), 7))].into_iter()).unwrap();
        timers.set(b"a".to_vec(), Some(10));
        timers.set(b"b".to_vec(), Some(5));
        timers.set(b"a".to_vec(), Some(3));
        timers.set(b"c".to_vec(), None);
        timers.set(b"d".to_vec(), None);
        assert_eq!(timers.next_at(), 3);
        assert_eq!(timers.first_due(2), None);
        assert_eq!(timers.count_due(5, 10), 2);
        let fired = timers.fire_first().unwrap();
        assert_eq!((index_at(&fired), index_entry(&fired)), (3, &b"a"[..]));
        let changes = timers.changes();
        assert_eq!(changes, [(&b"b"[..], Some(5)), (&b"c"[..], None)].into_iter().collect(), "a came and went");
        assert!(timers.has_changes());
        assert_eq!(timers.bytes(), Timers::cost(b"b") + Timers::cost(b"c"), "c's room until the commit");
        let mut copy = timers.clone();
        assert_eq!(copy.differing(&timers), 0);
        copy.set(b"b".to_vec(), Some(6));
        copy.set(b"e".to_vec(), Some(6));
        assert_eq!(copy.differing(&timers), 2);
    }
}
