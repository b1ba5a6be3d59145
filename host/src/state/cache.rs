//! A partition's cache of committed state entries, under a byte budget.
//!
//! [`Cache`] remembers what the partition's database holds for entries read or
//! committed recently — a value, or that there is none — so reads of hot keys never
//! reach RocksDB (whose reads of a much-overwritten key walk every version still in a
//! memtable), and a commit knows whether each entry it writes is new without reading
//! it. It holds only committed values: writes not yet committed stay in the
//! [`Transaction`](super::Transaction), which moves them here once they are. So
//! evicting an entry never loses a write; it only costs a read later.
//!
//! The budget counts what the cache takes from the allocator: its hash table as
//! allocated (slots for the entries it may grow to, not only those it holds) and each
//! key and value rounded up to the allocator's size class. Counting key and value
//! bytes alone let a cache of small entries take 1.5–2.1 times its budget. (While the
//! table doubles, its old allocation is held too, for the move.)
//!
//! Eviction is a second-chance sweep: an entry read or written since the last sweep
//! survives one more, the others go, until the cache holds at most
//! [`SWEEP_TO`](Cache::SWEEP_TO) of its budget. It does not decide what is committed
//! or when (the transaction and the worker do).

use super::expiry::Prior;
use foldhash::fast::RandomState;

/// Committed state entries (encoded entry key → value, `None`: known absent), at most
/// a budget of bytes.
pub struct Cache {
    /// hashbrown's table rather than std's, for its [`allocation_size`]: what the table
    /// takes is counted, not estimated.
    ///
    /// [`allocation_size`]: hashbrown::HashMap::allocation_size
    entries: hashbrown::HashMap<Vec<u8>, Slot, RandomState>,
    /// What the entries' keys and values take from the allocator.
    heap: usize,
    budget: usize,
    hits: u64,
    misses: u64,
}

struct Slot {
    value: Option<Vec<u8>>,
    /// Read or written since the last sweep.
    used: bool,
}

impl Cache {
    /// A sweep evicts down to this share of the budget, so sweeps (each visits every
    /// entry) come at most once per tenth of the budget inserted.
    const SWEEP_TO: f64 = 0.9;

    /// An empty cache that holds at most `budget` bytes (0: remembers nothing).
    pub fn new(budget: usize) -> Self {
        Cache { entries: hashbrown::HashMap::default(), heap: 0, budget, hits: 0, misses: 0 }
    }

    /// The committed value of `entry` if the cache knows it: `Some(None)` means the
    /// database has no such entry. Counts a hit or a miss.
    pub fn get(&mut self, entry: &[u8]) -> Option<Option<&[u8]>> {
        match self.entries.get_mut(entry) {
            Some(slot) => {
                self.hits += 1;
                slot.used = true;
                Some(slot.value.as_deref())
            }
            None => {
                self.misses += 1;
                None
            }
        }
    }

    /// What the database holds for `entry`, if the cache knows; counts nothing.
    pub fn prior(&self, entry: &[u8]) -> Option<Prior> {
        // A value that does not decode was never cached (reads check it first).
        self.entries.get(entry).and_then(|slot| Prior::of(slot.value.as_deref()).ok())
    }

    /// Remembers `value` as the committed value of `entry`, then evicts if the cache
    /// is over its budget.
    pub fn insert(&mut self, entry: Vec<u8>, value: Option<Vec<u8>>) {
        if self.budget == 0 {
            return;
        }
        // A new entry in a full table doubles the table. Where the doubled table would
        // not fit, the entries come down to under half the table first, which the insert
        // then rehashes in place: a table grown past the budget would be swept of every
        // entry it holds.
        let full = self.entries.len() == self.entries.capacity();
        if full && 2 * self.entries.allocation_size() + self.heap > self.budget && !self.entries.contains_key(&entry) {
            self.sweep((self.entries.capacity() / 2).saturating_sub(1));
        }
        let key_len = entry.len();
        self.heap += heap_cost(key_len, value.as_deref());
        if let Some(old) = self.entries.insert(entry, Slot { value, used: true }) {
            // The table kept its key and dropped this one, the same bytes.
            self.heap -= heap_cost(key_len, old.value.as_deref());
        }
        if self.bytes() > self.budget {
            self.sweep(usize::MAX);
        }
    }

    /// Bytes the cache takes: its table as allocated, and its keys and values.
    pub fn bytes(&self) -> usize {
        self.entries.allocation_size() + self.heap
    }

    /// Reads answered from the cache and reads that went to the database.
    pub fn hits_and_misses(&self) -> (u64, u64) {
        (self.hits, self.misses)
    }

    /// Evicts entries not used since the last sweep (and marks the rest unused) until
    /// the cache is down to [`SWEEP_TO`](Self::SWEEP_TO) of its budget and holds at
    /// most `entries`.
    fn sweep(&mut self, entries: usize) {
        // The table keeps its slots (a sweep frees keys and values, not slots), so the
        // keys and values come down to what the target leaves beside it.
        let target = ((self.budget as f64 * Self::SWEEP_TO) as usize).saturating_sub(self.entries.allocation_size());
        let mut len = self.entries.len();
        // Two passes at most: the first gives every used entry its second chance.
        for _ in 0..2 {
            let heap = &mut self.heap;
            self.entries.retain(|entry, slot| {
                if *heap <= target && len <= entries {
                    return true;
                }
                if std::mem::take(&mut slot.used) {
                    return true;
                }
                *heap -= heap_cost(entry.len(), slot.value.as_deref());
                len -= 1;
                false
            });
            if self.heap <= target && len <= entries {
                break;
            }
        }
    }
}

/// What an entry's key of `key_len` bytes and its value take from the allocator.
fn heap_cost(key_len: usize, value: Option<&[u8]>) -> usize {
    allocation(key_len) + value.map_or(0, |v| allocation(v.len()))
}

/// What the allocator hands out for `len` bytes: jemalloc's size classes (the `sluice`
/// binary's allocator), multiples of 16 up to 128 bytes and four classes to each
/// doubling above.
fn allocation(len: usize) -> usize {
    match len {
        0 => 0,
        1..=128 => len.next_multiple_of(16),
        _ => len.next_multiple_of(len.next_power_of_two() / 8),
    }
}
