//! Staging a partition's writes between commits, and expiring entries as the
//! partition's clock passes them.

use super::PartitionStore;
use super::cache::Cache;
use super::expiry::{Clock, Prior, StoredValue, encode_value, index_at, index_entry, index_key};
use super::partition::{decode_entry_key, encode_entry_key};
use crate::config::{TimeDomain, TtlConfig};
use crate::record::SourceRecord;
use anyhow::{Context, Result};
use rocksdb::WriteBatch;
use std::collections::{BTreeSet, HashMap, VecDeque};
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
    batch: HashMap<Vec<u8>, Dirty>,
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
    /// The expiry index of the batch's values, keyed as the committed index is
    /// ([`index_key`]): exact, a write moves its entry's key. With the committed index,
    /// less the entries the batch overrides, it makes the partition's logical index,
    /// the same whenever the commits fall, so expiries are decided the same in a replay.
    batch_index: BTreeSet<Vec<u8>>,
    /// No committed index entry expires before this (the earliest when last looked
    /// at, or one committed since): records whose clock stays below it and below the
    /// batch index's first cost no look at the index.
    index_next: u64,
    /// Where this batch reads the committed index from: the entries before it are
    /// overridden by the batch (written again, or expired), so no look reads them twice.
    index_cursor: Option<Vec<u8>>,
    /// Index entries found not to match their values, removed at the next commit.
    stale_index: Vec<Vec<u8>>,
    /// The next entries due, taken from the logical index in order (the committed
    /// index's cursor is past them) but not expired yet: (index key, whether the batch
    /// holds its value rather than the committed state), at most [`DUE_AHEAD`].
    due_ahead: VecDeque<(Vec<u8>, bool)>,
    /// Entries due but not expired at the last commit, counted up to
    /// [`TtlConfig::sweep_limit`].
    backlog: u64,
    /// Dirty bytes past which [`dirty_full`](Transaction::dirty_full) says the batch
    /// should end (`[state] commit_dirty_mib`).
    dirty_limit: usize,
    /// Expired entries removed since the partition was opened here, committed ones...
    expired: u64,
    /// ... and ones staged in the batch.
    expired_in_batch: u64,
}

/// An entry that expired: its removal is staged in the batch, and an operator told of
/// expiries gets this.
#[derive(Debug, Clone, PartialEq)]
pub struct Expired {
    /// The record key it belonged to.
    pub key: Vec<u8>,
    /// Its state name.
    pub name: String,
    /// The operator's bytes it held.
    pub value: Vec<u8>,
    /// Its expiry on the partition's clock, ms since the epoch.
    pub expired_at_ms: u64,
}

/// How many due entries one look at the index takes ahead: one RocksDB seek per this
/// many expiries, and only their index keys held.
const DUE_AHEAD: usize = 1024;

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
        let index_next = store.expiry_index(None).next().transpose()?.map_or(u64::MAX, |key| index_at(&key));
        Ok(Transaction {
            store,
            key: Vec::new(),
            entry: Vec::new(),
            record: Vec::new(),
            record_reads: Vec::new(),
            batch: HashMap::new(),
            dirty_bytes: 0,
            cache: Cache::new(cache_bytes),
            entries,
            ttl: Arc::new(TtlConfig::default()),
            clock,
            batch_index: BTreeSet::new(),
            index_next,
            index_cursor: None,
            stale_index: Vec::new(),
            due_ahead: VecDeque::new(),
            backlog: 0,
            dirty_limit: usize::MAX,
            expired: 0,
            expired_in_batch: 0,
        })
    }

    /// A batch that wrote `bytes` should end: [`dirty_full`](Transaction::dirty_full)
    /// says so from there.
    pub fn with_dirty_limit(mut self, bytes: usize) -> Self {
        self.dirty_limit = bytes;
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
        self.expired
    }

    /// Entries due but not yet expired at the last commit: a batch ended at its bounds
    /// before they all expired, and the next batches go on with them. Counted up to
    /// [`TtlConfig::sweep_limit`] (which then means at least as many).
    pub fn backlog(&self) -> u64 {
        self.backlog
    }

    /// Whether entries may be due to expire at the clock (it reached the earliest
    /// expiry known); [`expire_next`](Self::expire_next) says for sure.
    pub fn due(&self) -> bool {
        !self.due_ahead.is_empty() || self.clock.now_ms() >= self.next_due()
    }

    /// A lower bound of the earliest expiry of the logical index not yet taken ahead.
    fn next_due(&self) -> u64 {
        let batch_next = self.batch_index.first().map_or(u64::MAX, |key| index_at(key));
        self.index_next.min(batch_next)
    }

    /// Whether the batch holds at least `[state] commit_dirty_mib` of writes: it
    /// should end, and commit.
    pub fn dirty_full(&self) -> bool {
        self.dirty_bytes >= self.dirty_limit
    }

    /// Moves a processing-time clock to the wall clock (an event-time clock moves with
    /// records only): the worker calls it before each batch, so the clock holds still
    /// through a batch and its expiries are decided once, and when the partition is
    /// idle. Says whether entries are [due](Self::due) in processing time: an idle
    /// partition expires by this. An event-time backlog waits for the next record, so
    /// that what expires where never depends on when the partition was idle.
    pub fn tick(&mut self) -> bool {
        self.clock.tick(&self.ttl);
        self.ttl.time == TimeDomain::Processing && self.due()
    }

    /// Whether the batch holds writes (expiries included) not yet committed.
    pub fn has_writes(&self) -> bool {
        !self.batch.is_empty() || !self.stale_index.is_empty()
    }

    /// How many of `records`, in order, can be processed before entries come
    /// [due](Self::due) (by what is stored now): a batched call stops there, so the
    /// entries expire between two calls.
    pub fn records_before_due(&self, records: &[SourceRecord]) -> usize {
        let (mut clock, next_due) = (self.clock, self.next_due());
        let mut before = 0;
        for record in records {
            clock.observe(record.offset, record.timestamp_ms, &self.ttl);
            if clock.now_ms() >= next_due {
                break;
            }
            before += 1;
        }
        before
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

    /// Starts `record`: its event time moves the clock, every entry that makes due
    /// expires, and state access is scoped to its key. For an operator that neither is
    /// told of expiries nor bounds its batches (a native one, in benchmarks and tests);
    /// the sandbox calls [`observe`](Self::observe), [`expire_next`](Self::expire_next)
    /// and [`scope`](Self::scope) itself.
    pub fn begin_record(&mut self, record: &SourceRecord) -> Result<()> {
        self.observe(record.offset, record.timestamp_ms);
        while self.expire_next()?.is_some() {}
        self.scope(&record.key);
        Ok(())
    }

    /// Moves the clock for the record at `offset` with event time `timestamp_ms` (0:
    /// none; in processing time nothing moves it but [`tick`](Self::tick)), once per
    /// record; returns whether entries may now be [due](Self::due).
    pub fn observe(&mut self, offset: u64, timestamp_ms: i64) -> bool {
        self.clock.observe(offset, timestamp_ms, &self.ttl);
        self.due()
    }

    /// Moves the clock as a record with event time `timestamp_ms` would, without one
    /// (`sluice test --advance-to`); returns whether entries may now be due.
    pub fn advance_clock(&mut self, timestamp_ms: i64) -> bool {
        self.clock.advance(timestamp_ms, &self.ttl);
        self.due()
    }

    /// Scopes state access to `key` without moving the clock: for the next record
    /// once its time was [observed](Self::observe), or for an operator's handling of
    /// an expiry of `key`.
    pub fn scope(&mut self, key: &[u8]) {
        debug_assert!(self.record.is_empty(), "end_record was not called");
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
        loop {
            if self.due_ahead.is_empty() {
                if self.clock.now_ms() < self.next_due() {
                    return Ok(None);
                }
                self.take_due_ahead()?;
                if self.due_ahead.is_empty() {
                    return Ok(None);
                }
            }
            let (index_key, from_batch) = self.due_ahead.pop_front().expect("not empty");
            let (at, entry) = (index_at(&index_key), index_entry(&index_key).to_vec());
            // Taken ahead, then overridden by the batch since (an `expired` call wrote or
            // deleted it): the batch's value decides, as for any write.
            let value = if from_batch {
                if !self.batch_index.contains(&index_key) {
                    continue;
                }
                Some(self.expire_written(index_key)?)
            } else {
                if self.batch.contains_key(&entry) {
                    continue;
                }
                self.expire_committed(&entry, at)?
            };
            if let Some(value) = value {
                self.expired_in_batch += 1;
                return expired_entry(&entry, value, at).map(Some);
            }
        }
    }

    /// Takes ahead the first [`DUE_AHEAD`] entries of the logical index due at the
    /// clock, in index order, and moves the committed index's cursor past them.
    fn take_due_ahead(&mut self) -> Result<()> {
        let clock = self.clock.now_ms();
        // The committed index from the cursor, less the entries the batch overrides.
        let mut committed = self
            .store
            .expiry_index(self.index_cursor.as_deref())
            .filter(|item| item.as_ref().map_or(true, |key| !self.batch.contains_key(index_entry(key))));
        let mut next_committed = committed.next().transpose()?;
        let mut batch = self.batch_index.iter().peekable();
        while self.due_ahead.len() < DUE_AHEAD {
            let from_batch = match (&next_committed, batch.peek()) {
                (Some(committed), Some(&batch)) => batch < committed,
                (None, Some(_)) => true,
                (Some(_), None) => false,
                (None, None) => break,
            };
            let head =
                if from_batch { *batch.peek().expect("matched") } else { next_committed.as_ref().expect("matched") };
            if index_at(head) > clock {
                break;
            }
            if from_batch {
                self.due_ahead.push_back((batch.next().expect("peeked").clone(), true));
            } else {
                self.due_ahead.push_back((next_committed.take().expect("matched"), false));
                next_committed = committed.next().transpose()?;
            }
        }
        self.index_next = next_committed.as_deref().map_or(u64::MAX, index_at);
        // The next look starts at the first committed entry not taken, or at the last
        // taken (the batch's from now on, so skipped) when the index ran out.
        let last_taken = || self.due_ahead.iter().rev().find(|(_, from_batch)| !from_batch).map(|(key, _)| key.clone());
        if let Some(cursor) = next_committed.or_else(last_taken) {
            self.index_cursor = Some(cursor);
        }
        Ok(())
    }

    /// Counts the entries due at the clock, up to `limit`, as of the last commit.
    fn count_due(&self, limit: usize) -> Result<usize> {
        let clock = self.clock.now_ms();
        let mut count = 0;
        for key in self.store.expiry_index(self.index_cursor.as_deref()) {
            if count == limit || index_at(&key?) > clock {
                break;
            }
            count += 1;
        }
        Ok(count)
    }

    /// Stages the removal of the batch's value under `index_key`, due at its expiry,
    /// and returns the operator's bytes it held.
    fn expire_written(&mut self, index_key: Vec<u8>) -> Result<Vec<u8>> {
        self.batch_index.remove(&index_key);
        let dirty =
            self.batch.get_mut(index_entry(&index_key)).context("the batch index names a value of the batch")?;
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
            self.stale_index.push(index_key(at, entry));
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
        self.put_expiring(name, value, self.ttl.ttl(name));
    }

    /// Stages `value` under `name` for the current key, expiring `ttl` after the clock
    /// now, whatever the config says for `name`.
    pub fn put_with_ttl(&mut self, name: &str, value: Vec<u8>, ttl: Duration) {
        self.put_expiring(name, value, Some(ttl));
    }

    fn put_expiring(&mut self, name: &str, value: Vec<u8>, ttl: Option<Duration>) {
        encode_entry_key(&mut self.entry, &self.key, name);
        let expires_at = self.clock.expiry(ttl);
        self.record.push((self.entry.clone(), Some(encode_value(&value, expires_at))));
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
            return;
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
                    if let Some(at) = expires_at(dirty.value.as_deref()) {
                        self.batch_index.remove(&index_key(at, &entry));
                    }
                    dirty.prior
                }
                None => self
                    .cache
                    .prior(&entry)
                    .or_else(|| self.record_reads.iter().find(|(read, _)| *read == entry).map(|&(_, prior)| prior)),
            };
            self.dirty_bytes += size;
            if let Some(at) = expires_at(value.as_deref()) {
                self.batch_index.insert(index_key(at, &entry));
            }
            self.batch.insert(entry, Dirty { value, prior });
        }
        self.record_reads.clear();
    }

    /// Writes the batch (expired entries' removal included), the next offset to
    /// process and the clock in one atomic write; the written values become the
    /// cache's.
    pub fn commit(&mut self, next_offset: u64) -> Result<()> {
        debug_assert!(self.record.is_empty(), "commit inside a record");
        let mut batch = WriteBatch::default();
        let mut entries = self.entries;
        let index = self.store.expiry();
        for stale in self.stale_index.drain(..) {
            batch.delete_cf(index, stale);
        }
        let mut written = Vec::with_capacity(self.batch.len());
        for (entry, dirty) in self.batch.drain() {
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
        self.expired += std::mem::take(&mut self.expired_in_batch);
        // The batch's index is the committed one's now, and nothing is overridden: the
        // next look starts at the earliest expiry there can be, entries taken ahead but
        // not expired included.
        let ahead_next = self.due_ahead.drain(..).map(|(key, _)| index_at(&key)).min().unwrap_or(u64::MAX);
        self.index_next = self.next_due().min(ahead_next);
        self.batch_index.clear();
        self.index_cursor = (self.index_next < u64::MAX).then(|| index_key(self.index_next, b""));
        let due = self.clock.now_ms() >= self.index_next;
        self.backlog = if due { self.count_due(self.ttl.sweep_limit)? as u64 } else { 0 };
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

/// `entry` (an encoded entry key) as an expired one that held `value` until `at`.
fn expired_entry(entry: &[u8], value: Vec<u8>, at: u64) -> Result<Expired> {
    let (key, name) = decode_entry_key(entry).context("corrupt state entry key in the expiry index")?;
    let name = String::from_utf8_lossy(name).into_owned();
    Ok(Expired { key: key.to_vec(), name, value, expired_at_ms: at })
}

/// The expiry of a value as stored, if it has one (and a readable header).
fn expires_at(stored: Option<&[u8]>) -> Option<u64> {
    StoredValue::decode(stored?).ok()?.expires_at
}

/// The operator's bytes of `stored` if they have not expired at `clock`.
fn live(stored: Option<&[u8]>, clock: u64) -> Result<Option<Vec<u8>>> {
    let Some(stored) = stored else { return Ok(None) };
    let stored = StoredValue::decode(stored)?;
    Ok(stored.is_live(clock).then(|| stored.value.to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::StateEntry;

    /// Starts a record of `key` at event time `timestamp_ms`, at an offset after every
    /// earlier one (the clock observes each offset once).
    fn begin(txn: &mut Transaction, key: &[u8], timestamp_ms: i64) {
        txn.begin_record(&record(key, timestamp_ms)).unwrap();
    }

    /// A record of `key` at event time `timestamp_ms`, at an offset after every earlier
    /// one.
    fn record(key: &[u8], timestamp_ms: i64) -> SourceRecord {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let offset = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        SourceRecord { partition: 0, offset, key: key.to_vec(), value: Vec::new(), timestamp_ms, headers: Vec::new() }
    }

    /// Moves the clock as a next record at `timestamp_ms` would; whether entries may be due.
    fn observe(txn: &mut Transaction, timestamp_ms: i64) -> bool {
        let record = record(b"", timestamp_ms);
        txn.observe(record.offset, timestamp_ms)
    }

    /// Expires every entry due at the clock, earliest first.
    fn expire_all(txn: &mut Transaction) -> Vec<Expired> {
        std::iter::from_fn(|| txn.expire_next().unwrap()).collect()
    }

    fn open() -> (tempfile::TempDir, Transaction) {
        let dir = tempfile::tempdir().unwrap();
        let store = PartitionStore::open(&dir.path().join("p"), 0).unwrap();
        (dir, Transaction::new(store, 1 << 20).unwrap())
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

    /// An event time of this year, so the clock takes it (it is not far ahead).
    const T0: i64 = 1_700_000_000_000;

    fn expiring(ttl: TtlConfig) -> (tempfile::TempDir, Transaction) {
        let (dir, txn) = open();
        (dir, txn.with_ttl(Arc::new(ttl)).unwrap())
    }

    fn ttl_of(seconds: u64) -> TtlConfig {
        TtlConfig { default: Some(std::time::Duration::from_secs(seconds)), ..TtlConfig::default() }
    }

    /// `(expiry, encoded entry key)` pairs.
    type Stamps = Vec<(u64, Vec<u8>)>;

    /// The stamps of every index entry, and of every stored value that expires.
    fn index_and_stamps(txn: &Transaction) -> (Stamps, Stamps) {
        let index = txn
            .store()
            .expiry_index(None)
            .map(|key| key.unwrap())
            .map(|key| (index_at(&key), index_entry(&key).to_vec()))
            .collect();
        let mut stamps: Stamps = txn
            .store()
            .entries()
            .map(Result::unwrap)
            .filter_map(|e| {
                let mut entry = Vec::new();
                encode_entry_key(&mut entry, &e.key, &e.name);
                Some((e.expires_at_ms?, entry))
            })
            .collect();
        stamps.sort();
        (index, stamps)
    }

    #[test]
    fn an_entry_is_read_until_its_expiry_and_never_at_it_even_before_a_sweep() {
        let (_dir, mut txn) = expiring(ttl_of(10));
        begin(&mut txn, b"k", T0);
        txn.put("n", b"v".to_vec());
        txn.end_record(true);
        txn.commit(1).unwrap();
        for (at, expected) in [(T0 + 9_999, Some(b"v".to_vec())), (T0 + 10_000, None)] {
            // Another key's record moves the clock.
            begin(&mut txn, b"other", at);
            txn.end_record(true);
            begin(&mut txn, b"k", 0);
            assert_eq!(txn.get("n").unwrap(), expected, "at {at}");
            txn.end_record(true);
        }
        assert_eq!(txn.store().entries().count(), 1, "not removed before a commit");
        assert_eq!(txn.clock().ignored, 2, "the records without a timestamp");
        txn.commit(4).unwrap();
        assert_eq!((txn.entries(), txn.expired()), (0, 1));
        assert_eq!(txn.store().entries().count(), 0);
        assert_eq!(index_and_stamps(&txn).0, []);
        assert_eq!(txn.store().committed_clock().unwrap().now_ms, (T0 + 10_000) as u64);
    }

    #[test]
    fn an_entry_rewritten_after_it_expired_in_the_same_batch_has_one_index_entry() {
        let (_dir, mut txn) = expiring(ttl_of(10));
        begin(&mut txn, b"k", T0);
        txn.put("n", b"old".to_vec());
        txn.end_record(true);
        txn.commit(1).unwrap();
        begin(&mut txn, b"k", T0 + 20_000);
        assert_eq!(txn.get("n").unwrap(), None, "expired");
        txn.put("n", b"new".to_vec());
        txn.end_record(true);
        txn.commit(2).unwrap();
        begin(&mut txn, b"k", 0);
        assert_eq!(txn.get("n").unwrap(), Some(b"new".to_vec()));
        txn.end_record(true);
        assert_eq!((txn.entries(), txn.expired()), (1, 1), "it expired, then was written anew");
        let (index, stamps) = index_and_stamps(&txn);
        assert_eq!(index, stamps);
        assert_eq!(index.len(), 1);
        assert_eq!(index[0].0, (T0 + 30_000) as u64);
    }

    /// Every entry due at a record's clock expires before the record, earliest first,
    /// one at a time; a commit between two expiries (a batch ended at its bounds) leaves
    /// the rest due, and they expire after it, each once.
    #[test]
    fn due_entries_expire_earliest_first_and_a_commit_between_two_loses_or_repeats_none() {
        let (_dir, mut txn) = expiring(ttl_of(10));
        for key in 0..10u8 {
            begin(&mut txn, &[key], T0 + i64::from(key));
            txn.put("n", vec![key]);
            // A TTL of its own, longer than the config's.
            txn.put_with_ttl("own", vec![key], Duration::from_secs(60));
            txn.end_record(true);
        }
        // Half of them committed, half still in the batch.
        txn.commit(5).unwrap();
        for key in 10..20u8 {
            begin(&mut txn, &[key], T0 + i64::from(key));
            txn.put("n", vec![key]);
            txn.end_record(true);
        }
        assert!(observe(&mut txn, T0 + 20_000));
        let first: Vec<Expired> = (0..7).map(|_| txn.expire_next().unwrap().unwrap()).collect();
        txn.commit(20).unwrap();
        assert_eq!(txn.backlog(), 13, "left due at the commit");
        let rest = expire_all(&mut txn);
        let keys: Vec<u8> = first.iter().chain(&rest).map(|e| e.key[0]).collect();
        assert_eq!(keys, (0..20).collect::<Vec<u8>>(), "each once, earliest first");
        assert!(first.iter().chain(&rest).all(|e| e.name == "n"));
        assert!(!txn.due());
        txn.commit(20).unwrap();
        assert_eq!(
            (txn.entries(), txn.expired(), txn.backlog()),
            (10, 20, 0),
            "the entries with their own TTL are left"
        );
        let (index, stamps) = index_and_stamps(&txn);
        assert_eq!(index, stamps);
        assert!(index.iter().all(|(at, _)| *at >= (T0 + 60_000) as u64));
    }

    /// Expiring entries costs the same whether they are committed or still in the
    /// batch: 100,000 of each expire in one pass, in far less than the quadratic time a
    /// look per key at the batch's index took.
    #[test]
    fn a_storm_of_written_but_uncommitted_entries_expires_in_linear_time() {
        let (_dir, mut txn) = expiring(ttl_of(60));
        for key in 0..200_000u32 {
            if key == 100_000 {
                txn.commit(u64::from(key)).unwrap();
            }
            begin(&mut txn, &key.to_be_bytes(), T0);
            txn.put("n", vec![1]);
            txn.end_record(true);
        }
        assert!(observe(&mut txn, T0 + 3_600_000));
        let started = std::time::Instant::now();
        assert_eq!(expire_all(&mut txn).len(), 200_000);
        // About 1 µs each in a debug build; the quadratic look took minutes.
        assert!(started.elapsed() < Duration::from_secs(30), "{:?}", started.elapsed());
        txn.commit(200_000).unwrap();
        assert_eq!(txn.entries(), 0);
    }

    #[test]
    fn the_clock_is_committed_with_the_state_and_resumed() {
        let dir = tempfile::tempdir().unwrap();
        let mut txn = Transaction::new(PartitionStore::open(dir.path(), 0).unwrap(), 0).unwrap();
        begin(&mut txn, b"k", T0);
        txn.end_record(true);
        assert_eq!(txn.store().committed_clock().unwrap().now_ms, 0, "not before the commit");
        txn.commit(1).unwrap();
        drop(txn);
        let txn = Transaction::new(PartitionStore::open(dir.path(), 0).unwrap(), 0).unwrap();
        assert_eq!(txn.clock().now_ms(), T0 as u64);
    }

    /// The state names [`model_run`] writes.
    const NAMES: [&str; 3] = ["a", "b", "forever"];

    /// What [`model_run`] saw expire: (step, key, name, expiry), in order.
    type ExpiryLog = Vec<(u64, u8, String, u64)>;

    /// Random puts (with the config's TTL or one of their own), deletes, reads,
    /// dropped records and commits every `commit_every` steps — some between two
    /// expiries before a record, as a batch that ends at its bounds commits — over names
    /// with and without a TTL, with an event clock that jumps, stalls and sees records
    /// without a timestamp, against a model. Every read is the model's live value; each
    /// expiry is of an entry the model holds with that expiry, at or below the clock,
    /// and reported once; before a record, no entry is due; after every commit the
    /// entry count is the stored entries' and the index holds exactly one entry per
    /// expiring value. Returns what expired where.
    fn model_run(cache_bytes: usize, commit_every: u64) -> ExpiryLog {
        let dir = tempfile::tempdir().unwrap();
        let ttl = TtlConfig {
            default: Some(std::time::Duration::from_secs(5)),
            names: [("forever".to_string(), crate::config::Ttl(std::time::Duration::from_secs(3600 * 24 * 365)))]
                .into(),
            ..TtlConfig::default()
        };
        let mut txn = Transaction::new(PartitionStore::open(dir.path(), 0).unwrap(), cache_bytes)
            .unwrap()
            .with_ttl(Arc::new(ttl.clone()))
            .unwrap();
        // (key, name) -> (value, expiry)
        let mut model: HashMap<(u8, &str), (Vec<u8>, u64)> = HashMap::new();
        let mut log = ExpiryLog::new();
        let mut clock = T0;
        // Started, so that every put has an expiry.
        txn.advance_clock(T0);
        let mut seed = 11u64;
        for step in 0..6_000u64 {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let key = (seed >> 33) as u8 % 40;
            let name = NAMES[(seed >> 41) as usize % 3];
            let timestamp = match (seed >> 45) % 8 {
                0 => 0,
                1 => clock - 3_000,
                2 => {
                    clock += 4_000;
                    clock
                }
                _ => {
                    clock += 100;
                    clock
                }
            };
            let keep = !(seed >> 50).is_multiple_of(8);
            if txn.observe(step, timestamp) {
                let now = txn.clock().now_ms();
                let mut taken = 0;
                while let Some(expired) = txn.expire_next().unwrap() {
                    taken += 1;
                    if taken % 5 == 0 && step.is_multiple_of(commit_every) {
                        txn.commit(step).unwrap();
                    }
                    let n = NAMES.into_iter().find(|n| *n == expired.name).expect("one of the names");
                    let k = expired.key[0];
                    let (value, at) = model.remove(&(k, n)).unwrap_or_else(|| panic!("step {step}: {expired:?}"));
                    assert_eq!((expired.value, expired.expired_at_ms), (value, at), "step {step}");
                    assert!(at <= now, "step {step}: ({k}, {n}) expired before its time");
                    log.push((step, k, n.to_string(), at));
                }
            }
            let now = txn.clock().now_ms();
            assert!(!model.values().any(|(_, at)| *at <= now), "step {step}: an entry is due at the record");
            txn.scope(&[key]);
            let expected = model.get(&(key, name)).map(|(v, _)| v.clone());
            assert_eq!(txn.get(name).unwrap(), expected, "read at step {step} (cache {cache_bytes})");
            let write = match (seed >> 55) % 6 {
                0 => {
                    txn.delete(name);
                    Some(None)
                }
                1 => None,
                2 if name != "forever" => {
                    let value = step.to_be_bytes().to_vec();
                    txn.put_with_ttl(name, value.clone(), Duration::from_millis(700));
                    Some(Some((value, now + 700)))
                }
                _ => {
                    let value = step.to_be_bytes().to_vec();
                    txn.put(name, value.clone());
                    Some(Some((value, now + ttl.ttl(name).unwrap().as_millis() as u64)))
                }
            };
            txn.end_record(keep);
            match write.filter(|_| keep) {
                Some(Some(value)) => {
                    model.insert((key, name), value);
                }
                Some(None) => {
                    model.remove(&(key, name));
                }
                None => {}
            }
            if step.is_multiple_of(commit_every) {
                txn.commit(step).unwrap();
                let stored: Vec<StateEntry> = txn.store().entries().map(Result::unwrap).collect();
                assert_eq!(txn.entries(), stored.len() as u64, "entries at step {step}");
                let (index, stamps) = index_and_stamps(&txn);
                assert_eq!(index, stamps, "index at step {step}");
                let stored: HashMap<(u8, &str), (Vec<u8>, u64)> = stored
                    .iter()
                    .map(|e| ((e.key[0], e.name.as_str()), (e.value.clone(), e.expires_at_ms.unwrap())))
                    .collect();
                let model: HashMap<(u8, &str), (Vec<u8>, u64)> = model.iter().map(|(k, v)| (*k, v.clone())).collect();
                assert_eq!(stored, model, "stored state at step {step}");
            }
        }
        assert_eq!(txn.expired(), log.len() as u64 - txn.expired_in_batch);
        assert!(log.len() > 500, "the test expired entries ({})", log.len());
        log
    }

    #[test]
    fn entries_index_and_expiries_stay_exact_through_random_writes_ttls_and_commits() {
        let log = model_run(1 << 20, 37);
        let mut per_record: HashMap<u64, usize> = HashMap::new();
        for (step, ..) in &log {
            *per_record.entry(*step).or_default() += 1;
        }
        assert!(per_record.values().any(|&n| n > 5), "some records had several expiries before them");
        // Without a cache, and with commits elsewhere: the same expiries at the same
        // records, as a replay from a commit needs.
        assert_eq!(model_run(0, 37), log, "without a cache");
        assert_eq!(model_run(1 << 20, 5), log, "committing every 5 records");
        assert_eq!(model_run(1 << 20, 1_000), log, "committing every 1,000 records");
    }

    #[test]
    fn in_processing_time_an_idle_partition_expires_by_the_wall_clock() {
        let ttl = TtlConfig {
            default: Some(std::time::Duration::from_millis(100)),
            time: crate::config::TimeDomain::Processing,
            ..TtlConfig::default()
        };
        let (_dir, mut txn) = expiring(ttl);
        // As the worker does before each batch: records do not move this clock.
        assert!(!txn.tick());
        begin(&mut txn, b"k", 0);
        txn.put("n", b"v".to_vec());
        txn.end_record(true);
        txn.commit(1).unwrap();
        assert!(!txn.tick());
        std::thread::sleep(std::time::Duration::from_millis(150));
        assert!(txn.tick(), "no record came, and the entry is due");
        assert_eq!(expire_all(&mut txn).len(), 1);
        txn.commit(1).unwrap();
        assert_eq!((txn.entries(), txn.expired()), (0, 1));
        assert!(!txn.tick());
    }

    #[test]
    fn a_ttl_in_another_clock_than_the_state_was_stamped_by_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let open = |time| {
            let ttl = TtlConfig { default: Some(std::time::Duration::from_secs(60)), time, ..TtlConfig::default() };
            Transaction::new(PartitionStore::open(dir.path(), 0).unwrap(), 0).unwrap().with_ttl(Arc::new(ttl))
        };
        drop(open(crate::config::TimeDomain::Event).unwrap());
        let err = open(crate::config::TimeDomain::Processing).err().unwrap().to_string();
        assert!(err.contains("counts TTLs in event time, but [ttl] time = \"processing\""), "{err}");
        drop(open(crate::config::TimeDomain::Event).unwrap());
        // Without a TTL nothing is checked (or recorded).
        Transaction::new(PartitionStore::open(dir.path(), 0).unwrap(), 0)
            .unwrap()
            .with_ttl(Arc::new(TtlConfig { time: crate::config::TimeDomain::Processing, ..TtlConfig::default() }))
            .unwrap();
    }
}
