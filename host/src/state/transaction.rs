//! Staging a partition's writes between commits, and staging the removal of the
//! entries that expire as the partition's clock passes them (which ones, and in what
//! order, is the [sweep](super::sweep)'s to say).

use super::cache::Cache;
use super::expiry::{Clock, Prior, StoredValue, encode_value, index_at, index_entry, index_key};
use super::partition::encode_entry_key;
use super::sweep::{Due, Expired, Sweep, expired_entry};
use super::timer::{self, Timers};
use super::{EntryMap, PartitionStore};
use crate::config::{TimeDomain, TtlConfig};
use crate::record::SourceRecord;
use anyhow::{Context, Result, bail};
use rocksdb::WriteBatch;
use std::sync::Arc;
use std::time::Duration;

/// A partition's state as an operator sees it: scoped to the current record's key,
/// with writes staged in memory until [`commit`](Transaction::commit), and committed
/// entries read through a [`Cache`].
///
/// Writes happen at two levels. A record's writes are kept apart until the record
/// ends: [`end_record(true)`](Transaction::end_record) (the operator returned normally)
/// folds them into the batch, `end_record(false)` (error, trap, deadline) drops them.
/// The batch then commits with the source offset in one RocksDB write batch, and its
/// values become the cache's. Reads see the record's writes, then the batch's, then
/// the cache, then the database.
///
/// Each record moves the partition's [`Clock`]; a value written under a TTL
/// ([`TtlConfig`], or [`put_with_ttl`](Transaction::put_with_ttl)) carries its expiry,
/// and is never read once the clock reaches it. When the clock passes an expiry, the
/// entry *expires*: its removal is staged in the batch like a delete. Every entry due
/// at a record's clock expires before the record is processed, earliest first, one
/// [`expire_next`](Transaction::expire_next) at a time, so the operator layer can end a
/// batch between two expiries (at its bounds) and commit: the clock and what expired
/// so far commit with the offset of the record still to come, and the next batch goes
/// on with the rest. So an expiry is one more write of the batch: it commits exactly
/// once, and a replay from the committed state decides it again before the same
/// record, wherever the commits fell. A commit keeps the expiry index in step with the
/// values it writes.
pub struct Transaction {
    store: PartitionStore,
    /// The current record's key.
    key: Vec<u8>,
    /// The encoded entry key of the current call, reused so a read allocates nothing.
    entry: Vec<u8>,
    /// The current record's writes as stored (expiry header first), in order (`None` =
    /// delete).
    record: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    /// Entries the current record read from the database, and what the database held:
    /// what a write of them needs to know when the cache did not keep them.
    record_reads: Vec<(Vec<u8>, Prior)>,
    /// Writes of completed records since the last commit.
    batch: EntryMap<Dirty>,
    /// Bytes of the batch's entry keys and values.
    dirty_bytes: usize,
    /// Committed entries read or written recently.
    cache: Cache,
    /// State entries in the database as of the last commit, expired ones not yet
    /// removed included.
    entries: u64,
    /// How entries expire.
    ttl: Arc<TtlConfig>,
    /// The partition's clock.
    clock: Clock,
    /// Which entries expire when, and how many did.
    sweep: Sweep,
    /// The partition's timers, the batch's changes applied.
    timers: Timers,
    /// The current record's timer changes, in order: (encoded entry key, time or
    /// `None`: cancelled).
    record_timers: Vec<(Vec<u8>, Option<u64>)>,
    /// Timers due but not fired at the last commit, up to the sweep limit.
    timer_backlog: u64,
    /// The memory past which a timer set fails (`[state] timers_mib`).
    timers_limit: usize,
    /// Dirty bytes past which [`dirty_full`](Transaction::dirty_full) says the batch
    /// should end (`[state] commit_dirty_mib`).
    dirty_limit: usize,
}

/// A write waiting for the next commit.
struct Dirty {
    /// As stored, expiry header first; `None`: a delete.
    value: Option<Vec<u8>>,
    /// What the database held before this batch, when known without a read (the entry
    /// was read or committed recently); the commit counts new and removed entries and
    /// moves index entries with it.
    prior: Option<Prior>,
}

impl Transaction {
    /// Starts staging writes against `store`, caching at most `cache_bytes` of its
    /// committed entries; nothing expires until [`with_ttl`](Transaction::with_ttl).
    pub fn new(store: PartitionStore, cache_bytes: usize) -> Result<Self> {
        let entries = store.committed_entries()?;
        let clock = Clock::resume(store.committed_clock()?);
        let sweep = Sweep::new(&store)?;
        let timers = Timers::load(store.timers())?;
        Ok(Transaction {
            store,
            key: Vec::new(),
            entry: Vec::new(),
            record: Vec::new(),
            record_reads: Vec::new(),
            batch: EntryMap::default(),
            dirty_bytes: 0,
            cache: Cache::new(cache_bytes),
            entries,
            ttl: Arc::new(TtlConfig::default()),
            clock,
            sweep,
            timers,
            record_timers: Vec::new(),
            timer_backlog: 0,
            timers_limit: usize::MAX,
            dirty_limit: usize::MAX,
        })
    }

    /// A transaction detached from this one, right after this one's commit: over the
    /// committed state (a [`PartitionStore::committed_view`] handle), with this one's TTL
    /// policy, clock and dirty limit and no cache of its own, so every read sees this
    /// one's last commit. Its writes are staged and never committed. A shadow version
    /// runs over one, a new one replacing it after each commit of this one; a canary's
    /// instance parks one while the active version's holds the live transaction.
    pub fn detached(&self) -> Result<Transaction> {
        let mut detached = Transaction::new(self.store.committed_view(), 0)?
            .with_ttl(self.ttl.clone())?
            .with_dirty_limit(self.dirty_limit)
            .with_timers_limit(self.timers_limit);
        detached.clock = self.clock;
        Ok(detached)
    }

    /// Sets a [detached](Transaction::detached) transaction's clock to `clock`, the live transaction's
    /// before a batch or an idle partition's expiries: both decide what is due at the
    /// same time, whatever the wall clock read meanwhile.
    pub fn follow_clock(&mut self, clock: Clock) {
        self.clock = clock;
    }

    /// How many entries `other`, a [detached](Transaction::detached) one of this transaction
    /// made at its last commit, staged otherwise than this one since: another value, or
    /// a write only one of them made.
    pub fn differing_writes(&self, other: &Transaction) -> u64 {
        let differs = |(entry, dirty): (&Vec<u8>, &Dirty), theirs: &Transaction| {
            theirs.batch.get(entry).is_none_or(|their| their.value != dirty.value)
        };
        let ours = self.batch.iter().filter(|&written| differs(written, other)).count();
        let only_theirs = other.batch.keys().filter(|entry| !self.batch.contains_key(*entry)).count();
        (ours + only_theirs + self.timers.differing(&other.timers)) as u64
    }

    /// A batch that wrote `bytes` should end: [`dirty_full`](Transaction::dirty_full)
    /// says so from there.
    pub fn with_dirty_limit(mut self, bytes: usize) -> Self {
        self.dirty_limit = bytes;
        self
    }

    /// A timer set while the partition's timers take `bytes` of memory fails.
    pub fn with_timers_limit(mut self, bytes: usize) -> Self {
        self.timers_limit = bytes;
        self
    }

    /// Values written from now on expire as `ttl` says. Fails, changing nothing, when
    /// `ttl` counts in another clock than the one the state's expiries were stamped by.
    pub fn with_ttl(mut self, ttl: Arc<TtlConfig>) -> Result<Self> {
        if ttl.expires_anything() {
            self.store.record_time(ttl.time)?;
        }
        self.ttl = ttl;
        Ok(self)
    }

    /// State entries as of the last commit; exact, and committed with the state.
    /// Expired entries count until a commit removes them.
    pub fn entries(&self) -> u64 {
        self.entries
    }

    /// The partition's event-time clock.
    pub fn clock(&self) -> Clock {
        self.clock
    }

    /// How entries expire.
    pub fn ttl(&self) -> &TtlConfig {
        &self.ttl
    }

    /// Expired entries removed since the partition was opened here.
    pub fn expired(&self) -> u64 {
        self.sweep.expired()
    }

    /// Entries due but not yet expired at the last commit: a batch ended at its bounds
    /// before they all expired, and the next batches go on with them. Counted up to
    /// [`TtlConfig::sweep_limit`] (which then means at least as many).
    pub fn backlog(&self) -> u64 {
        (self.sweep.backlog() + self.timer_backlog).min(self.ttl.sweep_limit as u64)
    }

    /// Whether entries may be due to expire at the clock (it reached the earliest
    /// expiry known); [`expire_next`](Self::expire_next) says for sure.
    pub fn due(&self) -> bool {
        let clock = self.clock.now_ms();
        self.sweep.due(clock) || self.timers.first_due(clock).is_some()
    }

    /// Whether the batch holds at least `[state] commit_dirty_mib` of writes: it
    /// should end, and commit.
    pub fn dirty_full(&self) -> bool {
        self.dirty_bytes >= self.dirty_limit
    }

    /// Moves a processing-time clock to the wall clock, and an event-time one idle for
    /// `idle_for` past `[ttl] idle_timeout` on by the wall clock (see
    /// [`Clock::tick`](super::expiry::Clock::tick)): the worker calls it before each
    /// batch (idle for no time), so the clock holds still through a batch and its
    /// expiries are decided once, and when the partition is idle. Says whether entries
    /// are [due](Self::due) by such a clock: an idle partition expires by this. Without
    /// an idle timeout an event-time backlog waits for the next record, so that what
    /// expires where never depends on when the partition was idle.
    pub fn tick(&mut self, idle_for: Duration) -> bool {
        self.clock.tick(&self.ttl, idle_for);
        (self.ttl.time == TimeDomain::Processing || self.ttl.idle_timeout.is_some()) && self.due()
    }

    /// Whether the batch holds writes (expiries included) not yet committed.
    pub fn has_writes(&self) -> bool {
        !self.batch.is_empty() || self.sweep.has_stale() || self.timers.has_changes()
    }

    /// How many of `records`, in order, can be processed before entries come
    /// [due](Self::due) (by what is stored now): a batched call stops there, so the
    /// entries expire between two calls.
    pub fn records_before_due(&self, records: &[SourceRecord]) -> usize {
        self.sweep.records_before_due(self.clock, &self.ttl, records, self.timers.next_at())
    }

    /// Bytes written since the last commit and held until it (each entry's last
    /// value counted once).
    pub fn dirty_bytes(&self) -> usize {
        self.dirty_bytes
    }

    /// The cache of committed entries.
    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    /// The underlying store.
    pub fn store(&self) -> &PartitionStore {
        &self.store
    }

    /// Its sweep, for the sweep's tests.
    #[cfg(test)]
    pub(super) fn sweep(&self) -> &Sweep {
        &self.sweep
    }

    /// Starts `record`: its event time moves the clock, every entry that makes due
    /// expires, and state access is scoped to its key. For an operator that neither is
    /// told of expiries nor bounds its batches (a native one, in benchmarks and tests);
    /// the sandbox calls [`observe`](Self::observe), [`expire_next`](Self::expire_next)
    /// and [`scope`](Self::scope) itself.
    pub fn begin_record(&mut self, record: &SourceRecord) -> Result<()> {
        self.observe(record.offset, &record.key, record.timestamp_ms);
        while self.expire_next()?.is_some() {}
        self.scope(&record.key);
        Ok(())
    }

    /// Moves the clock for the record at `offset` with event time `timestamp_ms` (0:
    /// none; in processing time nothing moves it but [`tick`](Self::tick)), once per
    /// record; returns whether entries may now be [due](Self::due).
    pub fn observe(&mut self, offset: u64, key: &[u8], timestamp_ms: i64) -> bool {
        self.clock.observe(offset, key, timestamp_ms, &self.ttl);
        self.due()
    }

    /// Moves the clock as a record with event time `timestamp_ms` would, without one
    /// (`sluice test --advance-to`); returns whether entries may now be due.
    pub fn advance_clock(&mut self, timestamp_ms: i64) -> bool {
        // As a keyless record would.
        self.clock.advance(b"", timestamp_ms, &self.ttl);
        self.due()
    }

    /// Scopes state access to `key` without moving the clock: for the next record
    /// once its time was [observed](Self::observe), or for an operator's handling of
    /// an expiry of `key`.
    pub fn scope(&mut self, key: &[u8]) {
        debug_assert!(self.record.is_empty() && self.record_timers.is_empty(), "end_record was not called");
        self.key.clear();
        self.key.extend_from_slice(key);
    }

    /// Expires the earliest entry due at the clock, if any: stages its removal in the
    /// batch and returns it. Entries expire in the order of the logical index (the
    /// committed one, less what the batch overrides, with the batch's), which is the
    /// same however the commits fell, so a replay from committed state expires the
    /// same entries before the same records.
    pub fn expire_next(&mut self) -> Result<Option<Expired>> {
        debug_assert!(self.record.is_empty(), "expire_next inside a record");
        let clock = self.clock.now_ms();
        loop {
            // A timer fires first when its index key sorts first: the order timers and
            // expiries had when timers were entries of the expiry index.
            let value_first = self.sweep.peek(&self.store, &|entry| self.batch.contains_key(entry), clock)?;
            let timer_first = match (self.timers.first_due(clock), value_first) {
                (Some(timer), Some(value)) => timer < value,
                (timer, _) => timer.is_some(),
            };
            if timer_first {
                let fired = self.timers.fire_first().expect("a timer is due");
                self.sweep.count_expired();
                return expired_entry(index_entry(&fired), Vec::new(), index_at(&fired)).map(Some);
            }
            let Some(due) = self.sweep.next(&self.store, &|entry| self.batch.contains_key(entry), clock)? else {
                return Ok(None);
            };
            let (index_key, value) = match due {
                Due::Written(index_key) => {
                    let value = self.expire_written(&index_key)?;
                    (index_key, Some(value))
                }
                Due::Committed(index_key) => {
                    let value = self.expire_committed(index_entry(&index_key), index_at(&index_key))?;
                    (index_key, value)
                }
            };
            if let Some(value) = value {
                self.sweep.count_expired();
                return expired_entry(index_entry(&index_key), value, index_at(&index_key)).map(Some);
            }
        }
    }

    /// Stages the removal of the batch's value under `index_key` (the sweep took it out
    /// of the batch's index), due at its expiry, and returns the operator's bytes it held.
    fn expire_written(&mut self, index_key: &[u8]) -> Result<Vec<u8>> {
        let dirty = self.batch.get_mut(index_entry(index_key)).context("the batch index names a value of the batch")?;
        let stored = dirty.value.take().context("the batch index names a value, not a delete")?;
        self.dirty_bytes -= stored.len();
        Ok(StoredValue::decode(&stored)?.value.to_vec())
    }

    /// Stages the removal of the committed `entry`, which the index says expires at
    /// `at`, and returns the operator's bytes it held; `None` (and the stale index
    /// entry removed) when its value says otherwise. The index is written with the
    /// values, so that is corruption, warned about.
    fn expire_committed(&mut self, entry: &[u8], at: u64) -> Result<Option<Vec<u8>>> {
        let stored = match self.cache.get(entry) {
            Some(cached) => cached.map(<[u8]>::to_vec),
            None => self.store.get(entry)?,
        };
        let prior = Prior::of(stored.as_deref())?;
        if prior != Prior::Stored(Some(at)) {
            tracing::warn!(
                partition = self.store.partition(),
                "expiry index entry at {at} for an entry that holds {prior:?}; removed"
            );
            self.sweep.mark_stale(index_key(at, entry));
            return Ok(None);
        }
        let value = StoredValue::decode(stored.as_deref().expect("stored"))?.value.to_vec();
        self.dirty_bytes += entry.len();
        self.batch.insert(entry.to_vec(), Dirty { value: None, prior: Some(prior) });
        Ok(Some(value))
    }

    /// The value under `name` for the current key, unless it expired.
    pub fn get(&mut self, name: &str) -> Result<Option<Vec<u8>>> {
        let clock = self.clock.now_ms();
        encode_entry_key(&mut self.entry, &self.key, name);
        let entry = self.entry.as_slice();
        let stored = if let Some((_, value)) = self.record.iter().rev().find(|(k, _)| k == entry) {
            value.as_deref()
        } else if let Some(dirty) = self.batch.get(entry) {
            dirty.value.as_deref()
        } else if let Some(value) = self.cache.get(entry) {
            value
        } else {
            let value = self.store.get(entry)?;
            let prior = Prior::of(value.as_deref()).with_context(|| self.corrupt(name))?;
            self.record_reads.push((entry.to_vec(), prior));
            self.cache.insert(entry.to_vec(), value.clone());
            return live(value.as_deref(), clock);
        };
        live(stored, clock)
    }

    /// Stages `value` under `name` for the current key, expiring after the name's TTL.
    pub fn put(&mut self, name: &str, value: Vec<u8>) {
        self.put_expiring_at(name, &value, self.clock.expiry(self.ttl.ttl(name)));
    }

    /// Stages `value` under `name` for the current key, expiring `ttl` after the clock
    /// now, whatever the config says for `name`.
    pub fn put_with_ttl(&mut self, name: &str, value: Vec<u8>, ttl: Duration) {
        self.put_expiring_at(name, &value, self.clock.expiry(Some(ttl)));
    }

    /// Sets the timer `name` of the current key to fire at `at_ms` on the clock,
    /// replacing its time (see the `timer` module). Fails, setting nothing, when the
    /// partition's timers take the memory `[state] timers_mib` allows.
    pub fn set_timer(&mut self, name: &str, at_ms: u64) -> Result<()> {
        encode_entry_key(&mut self.entry, &self.key, &timer::entry_name(name));
        let pending: usize = self.record_timers.iter().map(|(entry, _)| Timers::cost(entry)).sum();
        let added = if self.timers.holds(&self.entry) { 0 } else { Timers::cost(&self.entry) };
        if self.timers.bytes() + pending + added > self.timers_limit {
            bail!(
                "partition {} holds {} MiB of timers, the most [state] timers_mib allows: timer {name:?} was not set",
                self.store.partition(),
                self.timers.bytes() >> 20
            );
        }
        self.record_timers.push((self.entry.clone(), Some(at_ms)));
        Ok(())
    }

    /// Stages `value` under `name` for the current key, expiring at `expires_at`.
    fn put_expiring_at(&mut self, name: &str, value: &[u8], expires_at: Option<u64>) {
        encode_entry_key(&mut self.entry, &self.key, name);
        self.record.push((self.entry.clone(), Some(encode_value(value, expires_at))));
    }

    /// Cancels the timer `name` of the current key.
    pub fn cancel_timer(&mut self, name: &str) {
        encode_entry_key(&mut self.entry, &self.key, &timer::entry_name(name));
        self.record_timers.push((self.entry.clone(), None));
    }

    /// Stages the removal of `name` for the current key.
    pub fn delete(&mut self, name: &str) {
        encode_entry_key(&mut self.entry, &self.key, name);
        self.record.push((self.entry.clone(), None));
    }

    /// Ends the current record: keeps its writes if `keep`, drops them otherwise.
    pub fn end_record(&mut self, keep: bool) {
        if !keep {
            self.record.clear();
            self.record_reads.clear();
            self.record_timers.clear();
            return;
        }
        for (entry, at) in self.record_timers.drain(..) {
            self.timers.set(entry, at);
        }
        for (entry, value) in self.record.drain(..) {
            let size = entry.len() + value.as_ref().map_or(0, Vec::len);
            // The first write since the last commit asks what the database holds: the
            // cache knows if it keeps the entry, the record if it read it (as a
            // read-modify-write does); else the commit will read it.
            let prior = match self.batch.get(&entry) {
                Some(dirty) => {
                    self.dirty_bytes -= entry.len() + dirty.value.as_ref().map_or(0, Vec::len);
                    // The batch index follows the entry's value.
                    self.sweep.unindex_written(&entry, dirty.value.as_deref());
                    dirty.prior
                }
                None => self
                    .cache
                    .prior(&entry)
                    .or_else(|| self.record_reads.iter().find(|(read, _)| *read == entry).map(|&(_, prior)| prior)),
            };
            self.dirty_bytes += size;
            self.sweep.index_written(&entry, value.as_deref());
            self.batch.insert(entry, Dirty { value, prior });
        }
        self.record_reads.clear();
    }

    /// Writes the batch (expired entries' removal included), the next offset to
    /// process and the clock in one atomic write; the written values become the
    /// cache's.
    pub fn commit(&mut self, next_offset: u64) -> Result<()> {
        debug_assert!(self.record.is_empty(), "commit inside a record");
        // Sized for the values and a record header each up front: grown by doubling, a
        // write batch of tens of MiB is copied about twice over as it fills.
        let mut batch = WriteBatch::with_capacity_bytes(self.dirty_bytes + 16 * self.batch.len() + 256);
        let mut entries = self.entries;
        let index = self.store.expiry();
        for stale in self.sweep.drain_stale() {
            batch.delete_cf(index, stale);
        }
        let timers_added = self.timers.write_changes(&mut batch, self.store.timers_family());
        entries = entries.checked_add_signed(timers_added).context("the entry count went below zero")?;
        // In key order: RocksDB inserts each key into its memtable's skip list from
        // where the previous one went, so sorted writes skip most of the search.
        let mut dirty: Vec<(Vec<u8>, Dirty)> = self.batch.drain().collect();
        dirty.sort_unstable_by(|(a, _), (b, _)| a.cmp(b));
        let mut written = Vec::with_capacity(dirty.len());
        for (entry, dirty) in dirty {
            // Blind writes (not read recently) are the rare case that costs a read.
            let prior = match dirty.prior {
                Some(prior) => prior,
                None => Prior::of(self.store.get(&entry)?.as_deref())?,
            };
            // The old value's index entry goes; the new value's comes.
            if let Prior::Stored(Some(at)) = prior {
                batch.delete_cf(index, index_key(at, &entry));
            }
            match &dirty.value {
                Some(stored) => {
                    entries += u64::from(prior == Prior::Absent);
                    if let Some(at) = StoredValue::decode(stored)?.expires_at {
                        batch.put_cf(index, index_key(at, &entry), b"");
                    }
                    batch.put(&entry, stored);
                }
                None => {
                    entries -= u64::from(prior != Prior::Absent);
                    batch.delete(&entry);
                }
            }
            written.push((entry, dirty.value));
        }
        self.store.write(batch, next_offset, entries, self.clock.committed())?;
        self.entries = entries;
        self.dirty_bytes = 0;
        self.sweep.committed(&self.store, self.clock.now_ms(), self.ttl.sweep_limit)?;
        self.timer_backlog = self.timers.count_due(self.clock.now_ms(), self.ttl.sweep_limit) as u64;
        // Only once they are committed: the cache holds committed values alone.
        for (entry, value) in written {
            self.cache.insert(entry, value);
        }
        Ok(())
    }

    /// What a corrupt stored value of `name` under the current key is.
    fn corrupt(&self, name: &str) -> String {
        format!(
            "corrupt value of {name:?} under key {:?} in state of partition {}",
            String::from_utf8_lossy(&self.key),
            self.store.partition()
        )
    }
}

/// The operator's bytes of `stored` if they have not expired at `clock`.
fn live(stored: Option<&[u8]>, clock: u64) -> Result<Option<Vec<u8>>> {
    let Some(stored) = stored else { return Ok(None) };
    let stored = StoredValue::decode(stored)?;
    Ok(stored.is_live(clock).then(|| stored.value.to_vec()))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Starts a record of `key` at event time `timestamp_ms`, at an offset after every
    /// earlier one (the clock observes each offset once).
    pub(in crate::state) fn begin(txn: &mut Transaction, key: &[u8], timestamp_ms: i64) {
        txn.begin_record(&record(key, timestamp_ms)).unwrap();
    }

    /// A record of `key` at event time `timestamp_ms`, at an offset after every earlier
    /// one.
    pub(in crate::state) fn record(key: &[u8], timestamp_ms: i64) -> SourceRecord {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let offset = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        SourceRecord { partition: 0, offset, key: key.to_vec(), value: Vec::new(), timestamp_ms, headers: Vec::new() }
    }

    pub(in crate::state) fn open() -> (tempfile::TempDir, Transaction) {
        let dir = tempfile::tempdir().unwrap();
        let store = PartitionStore::open(&dir.path().join("p"), 0).unwrap();
        (dir, Transaction::new(store, 1 << 20).unwrap())
    }

    /// The timers' memory is bounded: a set past `[state] timers_mib` fails and sets
    /// nothing, setting one again costs nothing more, and fired ones free theirs once
    /// committed.
    #[test]
    fn a_timer_past_the_timers_memory_fails_and_a_fired_one_frees_its_room() {
        let (_dir, txn) = open();
        let mut entry = Vec::new();
        encode_entry_key(&mut entry, b"k0", &timer::entry_name("t"));
        let mut txn = txn.with_timers_limit(3 * Timers::cost(&entry));
        txn.advance_clock(1_000);
        for key in [b"k0", b"k1", b"k2"] {
            txn.scope(key);
            txn.set_timer("t", 5_000).unwrap();
            txn.end_record(true);
        }
        txn.scope(b"k2");
        txn.set_timer("t", 6_000).unwrap();
        txn.end_record(true);
        txn.scope(b"k3");
        let err = txn.set_timer("t", 5_000).unwrap_err().to_string();
        assert!(err.contains("[state] timers_mib") && err.contains("\"t\" was not set"), "{err}");
        txn.end_record(false);
        txn.commit(1).unwrap();
        assert_eq!(txn.entries(), 3);
        txn.advance_clock(5_000);
        assert_eq!(txn.expire_next().unwrap().map(|fired| fired.key), Some(b"k0".to_vec()));
        txn.commit(2).unwrap();
        txn.scope(b"k3");
        txn.set_timer("t", 9_000).unwrap();
        txn.end_record(true);
    }

    #[test]
    fn dropped_record_writes_are_never_seen_or_committed() {
        let (_dir, mut txn) = open();
        begin(&mut txn, b"k", 0);
        txn.put("n", b"kept".to_vec());
        txn.end_record(true);
        begin(&mut txn, b"k", 0);
        txn.put("n", b"dropped".to_vec());
        assert_eq!(txn.get("n").unwrap(), Some(b"dropped".to_vec()));
        txn.end_record(false);
        begin(&mut txn, b"k", 0);
        assert_eq!(txn.get("n").unwrap(), Some(b"kept".to_vec()));
        txn.end_record(true);
        txn.commit(7).unwrap();
        begin(&mut txn, b"k", 0);
        assert_eq!(txn.get("n").unwrap(), Some(b"kept".to_vec()));
        txn.end_record(true);
        assert_eq!(txn.store().committed_offset().unwrap(), 7);
    }

    #[test]
    fn entry_counts_are_exact_through_overwrites_deletes_and_reopens() {
        let dir = tempfile::tempdir().unwrap();
        let mut txn = Transaction::new(PartitionStore::open(&dir.path().join("p"), 0).unwrap(), 1 << 20).unwrap();
        for round in 0..3u8 {
            for key in [b"a", b"b", b"c"] {
                begin(&mut txn, key, 0);
                txn.get("n").unwrap();
                txn.put("n", vec![round]);
                txn.end_record(true);
            }
            txn.commit(u64::from(round)).unwrap();
        }
        begin(&mut txn, b"b", 0);
        txn.delete("n"); // blind: not read since the last commit
        txn.put("other", vec![1]); // blind and new
        txn.end_record(true);
        txn.commit(9).unwrap();
        assert_eq!(txn.entries(), 3);
        let reopened = Transaction::new(PartitionStore::open(&dir.path().join("q"), 0).unwrap(), 0).unwrap();
        assert_eq!(reopened.entries(), 0);
        drop(txn);
        let reopened = Transaction::new(PartitionStore::open(&dir.path().join("p"), 0).unwrap(), 0).unwrap();
        assert_eq!(reopened.entries(), 3);
        assert_eq!(reopened.store().entries().count(), 3);
    }

    #[test]
    fn state_is_scoped_to_the_current_key() {
        let (_dir, mut txn) = open();
        begin(&mut txn, b"a", 0);
        txn.put("n", b"1".to_vec());
        txn.end_record(true);
        begin(&mut txn, b"b", 0);
        assert_eq!(txn.get("n").unwrap(), None);
        txn.delete("n");
        txn.end_record(true);
        begin(&mut txn, b"a", 0);
        assert_eq!(txn.get("n").unwrap(), Some(b"1".to_vec()));
        txn.end_record(true);
    }

    /// Reads, writes and deletes over many keys, committed now and then, against a
    /// model map: with a cache far smaller than the state (evicting all the time) or
    /// none, every read, the entry count and the committed state are the model's.
    #[test]
    fn a_tiny_cache_evicts_without_changing_what_is_read_or_committed() {
        for cache_bytes in [0, 2_000, 1 << 20] {
            let dir = tempfile::tempdir().unwrap();
            let mut txn = Transaction::new(PartitionStore::open(dir.path(), 0).unwrap(), cache_bytes).unwrap();
            let mut model: HashMap<(u8, &str), Vec<u8>> = HashMap::new();
            let mut committed = model.clone();
            let mut seed = 7u64;
            for step in 0..20_000u64 {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let (key, name) = ((seed >> 33) as u8 % 200, ["a", "b"][(seed >> 45) as usize % 2]);
                let keep = !(seed >> 50).is_multiple_of(10);
                begin(&mut txn, &[key], 0);
                let expected = model.get(&(key, name)).cloned();
                assert_eq!(txn.get(name).unwrap(), expected, "read at step {step} (cache {cache_bytes})");
                match (seed >> 55) % 4 {
                    0 => txn.delete(name),
                    _ => txn.put(name, step.to_be_bytes().repeat(1 + (seed >> 60) as usize)),
                }
                // The record reads its own write.
                let written = txn.get(name).unwrap();
                txn.end_record(keep);
                if keep {
                    match written {
                        Some(value) => model.insert((key, name), value),
                        None => model.remove(&(key, name)),
                    };
                }
                if step.is_multiple_of(97) {
                    txn.commit(step).unwrap();
                    committed = model.clone();
                    assert_eq!(txn.entries(), committed.len() as u64, "entries at step {step}");
                    assert!(txn.cache().bytes() <= cache_bytes, "cache over budget at step {step}");
                }
            }
            drop(txn);
            let store = PartitionStore::open(dir.path(), 0).unwrap();
            let stored: HashMap<(u8, String), Vec<u8>> =
                store.entries().map(|e| e.unwrap()).map(|e| ((e.key[0], e.name), e.value)).collect();
            let committed: HashMap<(u8, String), Vec<u8>> =
                committed.into_iter().map(|((k, n), v)| ((k, n.to_string()), v)).collect();
            assert_eq!(stored, committed, "committed state (cache {cache_bytes})");
            assert_eq!(store.committed_entries().unwrap(), stored.len() as u64);
        }
    }
}
