//! Staging a partition's writes between commits, and removing expired entries in them.

use super::PartitionStore;
use super::cache::Cache;
use super::expiry::{Clock, Prior, StoredValue, encode_value, index_key};
use super::partition::encode_entry_key;
use crate::config::TtlConfig;
use anyhow::{Context, Result};
use rocksdb::WriteBatch;
use std::collections::HashMap;
use std::sync::Arc;

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
/// Each record moves the partition's event-time [`Clock`]; a value written under a TTL
/// ([`TtlConfig`]) carries its expiry, and is never read once the clock reaches it.
/// A commit keeps the expiry index in step with the values it writes, and removes up
/// to [`TtlConfig::sweep_limit`] expired entries, in the same write batch as the state,
/// the offset and the clock.
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
    /// The partition's event time.
    clock: Clock,
    /// Expired entries removed since the partition was opened here.
    expired: u64,
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
        let clock = Clock::at(store.committed_clock()?);
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
            expired: 0,
        })
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

    /// Expired entries removed since the partition was opened here.
    pub fn expired(&self) -> u64 {
        self.expired
    }

    /// Whether committed entries have expired and wait for a commit to remove them
    /// (the last one stopped at its limit, or, in processing time, the clock moved on
    /// while the partition was idle). Moves a processing-time clock first.
    pub fn expiry_due(&mut self) -> Result<bool> {
        self.clock.tick(&self.ttl);
        let first = self.store.expiry_index().next().transpose()?;
        Ok(first.is_some_and(|(at, _)| at <= self.clock.now_ms()))
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

    /// Scopes state access to `key` for the next record, whose event time
    /// `timestamp_ms` (0: none) moves the clock.
    pub fn begin_record(&mut self, key: &[u8], timestamp_ms: i64) {
        debug_assert!(self.record.is_empty(), "end_record was not called");
        self.key.clear();
        self.key.extend_from_slice(key);
        self.clock.observe(timestamp_ms, &self.ttl);
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
        encode_entry_key(&mut self.entry, &self.key, name);
        let expires_at = self.clock.expiry(self.ttl.ttl(name));
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
                    dirty.prior
                }
                None => self
                    .cache
                    .prior(&entry)
                    .or_else(|| self.record_reads.iter().find(|(read, _)| *read == entry).map(|&(_, prior)| prior)),
            };
            self.dirty_bytes += size;
            self.batch.insert(entry, Dirty { value, prior });
        }
        self.record_reads.clear();
    }

    /// Writes the batch, the removal of expired entries, the next offset to process and
    /// the clock in one atomic write; the written values become the cache's.
    pub fn commit(&mut self, next_offset: u64) -> Result<()> {
        debug_assert!(self.record.is_empty(), "commit inside a record");
        let mut batch = WriteBatch::default();
        let mut entries = self.entries;
        let swept = self.sweep(&mut batch)?;
        entries -= swept.len() as u64;
        let mut expired = swept.len() as u64;
        let clock = self.clock.now_ms();
        let index = self.store.expiry();
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
            // A value that expired before it was ever committed is removed, not written.
            let value = match dirty.value {
                Some(stored) if !StoredValue::decode(&stored)?.is_live(clock) => {
                    expired += 1;
                    None
                }
                value => value,
            };
            match &value {
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
            written.push((entry, value));
        }
        self.store.write(batch, next_offset, entries, clock)?;
        self.entries = entries;
        self.dirty_bytes = 0;
        self.expired += expired;
        // Only once they are committed: the cache holds committed values alone.
        for (entry, value) in written {
            self.cache.insert(entry, value);
        }
        for entry in swept {
            self.cache.insert(entry, None);
        }
        Ok(())
    }

    /// Stages in `batch` the removal of entries due at the clock, in expiry order and
    /// at most [`TtlConfig::sweep_limit`] of them, with their index entries; returns
    /// the entries removed. An entry this commit writes is left to its write (which
    /// moves its index entry): it was refreshed or deleted after it expired.
    fn sweep(&mut self, batch: &mut WriteBatch) -> Result<Vec<Vec<u8>>> {
        let clock = self.clock.now_ms();
        let mut swept = Vec::new();
        for item in self.store.expiry_index() {
            let (at, entry) = item?;
            if at > clock {
                break;
            }
            if self.batch.contains_key(&entry) {
                continue;
            }
            if swept.len() == self.ttl.sweep_limit {
                break;
            }
            batch.delete_cf(self.store.expiry(), index_key(at, &entry));
            // The index is written with the values, so it names the value's own expiry;
            // an index entry that does not is removed without touching the value.
            match Prior::of(self.store.get(&entry)?.as_deref())? {
                Prior::Stored(Some(expires_at)) if expires_at == at => {
                    batch.delete(&entry);
                    swept.push(entry);
                }
                prior => tracing::warn!(
                    partition = self.store.partition(),
                    "expiry index entry at {at} for an entry that holds {prior:?}; removed"
                ),
            }
        }
        Ok(swept)
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
mod tests {
    use super::*;
    use crate::state::StateEntry;

    fn open() -> (tempfile::TempDir, Transaction) {
        let dir = tempfile::tempdir().unwrap();
        let store = PartitionStore::open(&dir.path().join("p"), 0).unwrap();
        (dir, Transaction::new(store, 1 << 20).unwrap())
    }

    #[test]
    fn dropped_record_writes_are_never_seen_or_committed() {
        let (_dir, mut txn) = open();
        txn.begin_record(b"k", 0);
        txn.put("n", b"kept".to_vec());
        txn.end_record(true);
        txn.begin_record(b"k", 0);
        txn.put("n", b"dropped".to_vec());
        assert_eq!(txn.get("n").unwrap(), Some(b"dropped".to_vec()));
        txn.end_record(false);
        txn.begin_record(b"k", 0);
        assert_eq!(txn.get("n").unwrap(), Some(b"kept".to_vec()));
        txn.end_record(true);
        txn.commit(7).unwrap();
        txn.begin_record(b"k", 0);
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
                txn.begin_record(key, 0);
                txn.get("n").unwrap();
                txn.put("n", vec![round]);
                txn.end_record(true);
            }
            txn.commit(u64::from(round)).unwrap();
        }
        txn.begin_record(b"b", 0);
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
        txn.begin_record(b"a", 0);
        txn.put("n", b"1".to_vec());
        txn.end_record(true);
        txn.begin_record(b"b", 0);
        assert_eq!(txn.get("n").unwrap(), None);
        txn.delete("n");
        txn.end_record(true);
        txn.begin_record(b"a", 0);
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
                txn.begin_record(&[key], 0);
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
        let index = txn.store().expiry_index().map(Result::unwrap).collect();
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
        txn.begin_record(b"k", T0);
        txn.put("n", b"v".to_vec());
        txn.end_record(true);
        txn.commit(1).unwrap();
        for (at, expected) in [(T0 + 9_999, Some(b"v".to_vec())), (T0 + 10_000, None)] {
            // Another key's record moves the clock.
            txn.begin_record(b"other", at);
            txn.end_record(true);
            txn.begin_record(b"k", 0);
            assert_eq!(txn.get("n").unwrap(), expected, "at {at}");
            txn.end_record(true);
        }
        assert_eq!(txn.store().entries().count(), 1, "not removed before a commit");
        assert_eq!(txn.clock().ignored, 2, "the records without a timestamp");
        txn.commit(4).unwrap();
        assert_eq!((txn.entries(), txn.expired()), (0, 1));
        assert_eq!(txn.store().entries().count(), 0);
        assert_eq!(index_and_stamps(&txn).0, []);
        assert_eq!(txn.store().committed_clock().unwrap(), (T0 + 10_000) as u64);
    }

    #[test]
    fn an_entry_rewritten_in_the_batch_that_would_sweep_it_survives_with_one_index_entry() {
        let (_dir, mut txn) = expiring(ttl_of(10));
        txn.begin_record(b"k", T0);
        txn.put("n", b"old".to_vec());
        txn.end_record(true);
        txn.commit(1).unwrap();
        txn.begin_record(b"k", T0 + 20_000);
        assert_eq!(txn.get("n").unwrap(), None, "expired");
        txn.put("n", b"new".to_vec());
        txn.end_record(true);
        txn.commit(2).unwrap();
        txn.begin_record(b"k", 0);
        assert_eq!(txn.get("n").unwrap(), Some(b"new".to_vec()));
        txn.end_record(true);
        assert_eq!((txn.entries(), txn.expired()), (1, 0));
        let (index, stamps) = index_and_stamps(&txn);
        assert_eq!(index, stamps);
        assert_eq!(index.len(), 1);
        assert_eq!(index[0].0, (T0 + 30_000) as u64);
    }

    #[test]
    fn the_clock_is_committed_with_the_state_and_resumed() {
        let dir = tempfile::tempdir().unwrap();
        let mut txn = Transaction::new(PartitionStore::open(dir.path(), 0).unwrap(), 0).unwrap();
        txn.begin_record(b"k", T0);
        txn.end_record(true);
        assert_eq!(txn.store().committed_clock().unwrap(), 0, "not before the commit");
        txn.commit(1).unwrap();
        drop(txn);
        let txn = Transaction::new(PartitionStore::open(dir.path(), 0).unwrap(), 0).unwrap();
        assert_eq!(txn.clock().now_ms(), T0 as u64);
    }

    /// Random puts, deletes, reads, dropped records and commits over names with and
    /// without a TTL, with an event clock that jumps, stalls and sees records without a
    /// timestamp, against a model, with a sweep limit small enough to leave backlogs:
    /// every read is the model's live value, and after every commit the entry count is
    /// the stored entries' and the index holds exactly one entry per expiring value.
    #[test]
    fn entries_and_the_expiry_index_stay_exact_through_random_writes_ttls_and_commits() {
        for cache_bytes in [0, 1 << 20] {
            let dir = tempfile::tempdir().unwrap();
            let ttl = TtlConfig {
                default: Some(std::time::Duration::from_secs(5)),
                names: [("forever".to_string(), crate::config::Ttl(std::time::Duration::from_secs(3600 * 24 * 365)))]
                    .into(),
                sweep_limit: 3,
                ..TtlConfig::default()
            };
            let mut txn = Transaction::new(PartitionStore::open(dir.path(), 0).unwrap(), cache_bytes)
                .unwrap()
                .with_ttl(Arc::new(ttl.clone()))
                .unwrap();
            // (key, name) -> (value, expiry)
            let mut model: HashMap<(u8, &str), (Vec<u8>, u64)> = HashMap::new();
            let mut clock = T0;
            let mut seed = 11u64;
            for step in 0..6_000u64 {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let key = (seed >> 33) as u8 % 40;
                let name = ["a", "b", "forever"][(seed >> 41) as usize % 3];
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
                txn.begin_record(&[key], timestamp);
                let now = txn.clock().now_ms();
                let expected = model.get(&(key, name)).filter(|(_, at)| *at > now).map(|(v, _)| v.clone());
                assert_eq!(txn.get(name).unwrap(), expected, "read at step {step} (cache {cache_bytes})");
                let write = match (seed >> 55) % 5 {
                    0 => {
                        txn.delete(name);
                        Some(None)
                    }
                    1 => None,
                    _ => {
                        let value = step.to_be_bytes().to_vec();
                        txn.put(name, value.clone());
                        Some(Some(value))
                    }
                };
                txn.end_record(keep);
                match write.filter(|_| keep) {
                    Some(Some(value)) => {
                        let at = now + ttl.ttl(name).unwrap().as_millis() as u64;
                        model.insert((key, name), (value, at));
                    }
                    Some(None) => {
                        model.remove(&(key, name));
                    }
                    None => {}
                }
                if step.is_multiple_of(37) {
                    txn.commit(step).unwrap();
                    let stored: Vec<StateEntry> = txn.store().entries().map(Result::unwrap).collect();
                    assert_eq!(txn.entries(), stored.len() as u64, "entries at step {step}");
                    let (index, stamps) = index_and_stamps(&txn);
                    assert_eq!(index, stamps, "index at step {step}");
                    // What is stored is the model's, and what the model says expired
                    // is either stored still (a backlog) or removed.
                    for entry in &stored {
                        let name = entry.name.as_str();
                        let model_entry = model.iter().find(|((k, n), _)| *k == entry.key[0] && *n == name);
                        match model_entry {
                            Some((_, (value, at))) => {
                                assert_eq!((&entry.value, entry.expires_at_ms), (value, Some(*at)), "step {step}")
                            }
                            None => panic!("step {step}: {entry:?} is stored but not in the model"),
                        }
                    }
                    let live_in_model = model.values().filter(|(_, at)| *at > txn.clock().now_ms()).count();
                    assert!(stored.len() >= live_in_model, "step {step}: a live entry was removed");
                    let now = txn.clock().now_ms();
                    model.retain(|(k, n), (_, at)| {
                        let kept = stored.iter().any(|e| e.key[0] == *k && e.name == *n);
                        assert!(kept || *at <= now, "step {step}: ({k}, {n}) removed before its expiry");
                        kept
                    });
                }
            }
            assert!(txn.expired() > 100, "the test expired entries ({})", txn.expired());
        }
    }

    #[test]
    fn in_processing_time_an_idle_partition_expires_by_the_wall_clock() {
        let ttl = TtlConfig {
            default: Some(std::time::Duration::from_millis(100)),
            time: crate::config::TimeDomain::Processing,
            ..TtlConfig::default()
        };
        let (_dir, mut txn) = expiring(ttl);
        txn.begin_record(b"k", 0);
        txn.put("n", b"v".to_vec());
        txn.end_record(true);
        txn.commit(1).unwrap();
        assert!(!txn.expiry_due().unwrap());
        std::thread::sleep(std::time::Duration::from_millis(150));
        assert!(txn.expiry_due().unwrap(), "no record came, and the entry is due");
        txn.commit(1).unwrap();
        assert_eq!((txn.entries(), txn.expired()), (0, 1));
        assert!(!txn.expiry_due().unwrap());
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
