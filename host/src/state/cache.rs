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
//! Eviction is a second-chance sweep: an entry read or written since the last sweep
//! survives one more, the others go, until the cache holds at most
//! [`SWEEP_TO`](Cache::SWEEP_TO) of its budget. It does not decide what is committed
//! or when (the transaction and the worker do).

use super::EntryMap;
use super::expiry::Prior;

/// What each cached entry costs beyond its key and value: the table slot, the two
/// vectors' headers and the allocator's rounding, roughly.
const ENTRY_OVERHEAD: usize = 64;

/// Committed state entries (encoded entry key → value, `None`: known absent), at most
/// a budget of bytes.
pub struct Cache {
    entries: EntryMap<Slot>,
    /// Bytes the entries take, [`ENTRY_OVERHEAD`] included.
    bytes: usize,
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
        Cache { entries: EntryMap::default(), bytes: 0, budget, hits: 0, misses: 0 }
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
        let key_len = entry.len();
        self.bytes += cost(&entry, value.as_deref());
        if let Some(old) = self.entries.insert(entry, Slot { value, used: true }) {
            self.bytes -= ENTRY_OVERHEAD + key_len + old.value.map_or(0, |v| v.len());
        }
        if self.bytes > self.budget {
            self.sweep();
        }
    }

    /// Bytes the cached entries take.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Reads answered from the cache and reads that went to the database.
    pub fn hits_and_misses(&self) -> (u64, u64) {
        (self.hits, self.misses)
    }

    /// Evicts entries not used since the last sweep (and marks the rest unused) until
    /// the cache is down to [`SWEEP_TO`](Self::SWEEP_TO) of its budget.
    fn sweep(&mut self) {
        let target = (self.budget as f64 * Self::SWEEP_TO) as usize;
        // Two passes at most: the first gives every used entry its second chance.
        for _ in 0..2 {
            let bytes = &mut self.bytes;
            self.entries.retain(|entry, slot| {
                if *bytes <= target {
                    return true;
                }
                if std::mem::take(&mut slot.used) {
                    return true;
                }
                *bytes -= cost(entry, slot.value.as_deref());
                false
            });
            if self.bytes <= target {
                break;
            }
        }
    }
}

fn cost(entry: &[u8], value: Option<&[u8]>) -> usize {
    ENTRY_OVERHEAD + entry.len() + value.map_or(0, <[u8]>::len)
}
