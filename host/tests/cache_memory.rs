//! The value cache stays within its budget as the allocator counts it, whatever its
//! entries' sizes: its own binary, since it counts every allocation of the process.

use sluice::state::Cache;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The system allocator, counting the bytes asked of it and not yet freed.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed to the system allocator unchanged; the counter only
// observes the sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size, Ordering::Relaxed);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Inserts `count` distinct entries of a key of `key_len` bytes and a value of
/// `value_len` (0: known absent) into a cache of `budget` bytes; returns the most the
/// cache took after an insert, as the allocator counted it, and its entries' bytes at
/// the end.
fn fill(budget: usize, count: usize, key_len: usize, value_len: usize) -> (usize, usize) {
    let before = LIVE.load(Ordering::Relaxed);
    let mut cache = Cache::new(budget);
    let mut most = 0;
    for i in 0..count {
        let mut key = format!("{i:020}").into_bytes();
        key.resize(key_len, b'k');
        cache.insert(key, (value_len > 0).then(|| vec![7; value_len]));
        most = most.max(LIVE.load(Ordering::Relaxed) - before);
    }
    (most, cache.bytes())
}

/// Small entries, known-absent ones above all, were the cache's worst case: counted by
/// their keys and values and a fixed overhead, they took 1.5 (30-byte keys, 50-byte
/// values) and 2.1 (30-byte keys, absent) times the budget.
#[test]
fn the_cache_takes_at_most_its_budget_for_entries_of_every_size() {
    let budget = 1 << 20;
    for (key_len, value_len) in [(30, 0), (30, 50), (40, 460), (30, 4000)] {
        let (most, at_end) = fill(budget, 100_000, key_len, value_len);
        assert!(
            most <= budget,
            "{key_len}-byte keys, {value_len}-byte values: the cache took {most} bytes of {budget}"
        );
        // ... and uses it: it does not sweep itself down to a fraction.
        assert!(at_end >= budget / 2, "{key_len}-byte keys, {value_len}-byte values: {at_end} bytes held of {budget}");
    }
}
