//! Staging a partition's writes between commits.

use super::PartitionStore;
use super::cache::Cache;
use super::partition::encode_entry_key;
use anyhow::Result;
use rocksdb::WriteBatch;
use std::collections::HashMap;

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
pub struct Transaction {
    store: PartitionStore,
    /// The current record's key.
    key: Vec<u8>,
    /// The encoded entry key of the current call, reused so a read allocates nothing.
    entry: Vec<u8>,
    /// The current record's writes, in order (`None` = delete).
    record: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    /// Entries the current record read from the database, and whether they exist
    /// there: what a write of them needs to know when the cache did not keep them.
    record_reads: Vec<(Vec<u8>, bool)>,
    /// Writes of completed records since the last commit.
    batch: HashMap<Vec<u8>, Dirty>,
    /// Bytes of the batch's entry keys and values.
    dirty_bytes: usize,
    /// Committed entries read or written recently.
    cache: Cache,
    /// State entries in the database as of the last commit.
    entries: u64,
}

/// A write waiting for the next commit.
struct Dirty {
    value: Option<Vec<u8>>,
    /// Whether the database held the entry before this batch, when known without a
    /// read (the entry was read or committed recently); the commit counts new and
    /// removed entries with it.
    existed: Option<bool>,
}

impl Transaction {
    /// Starts staging writes against `store`, caching at most `cache_bytes` of its
    /// committed entries.
    pub fn new(store: PartitionStore, cache_bytes: usize) -> Result<Self> {
        let entries = store.committed_entries()?;
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
        })
    }

    /// State entries as of the last commit; exact, and committed with the state.
    pub fn entries(&self) -> u64 {
        self.entries
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

    /// Scopes state access to `key` for the next record.
    pub fn begin_record(&mut self, key: &[u8]) {
        debug_assert!(self.record.is_empty(), "end_record was not called");
        self.key.clear();
        self.key.extend_from_slice(key);
    }

    /// The value under `name` for the current key.
    pub fn get(&mut self, name: &str) -> Result<Option<Vec<u8>>> {
        encode_entry_key(&mut self.entry, &self.key, name);
        let entry = self.entry.as_slice();
        if let Some((_, value)) = self.record.iter().rev().find(|(k, _)| k == entry) {
            return Ok(value.clone());
        }
        if let Some(dirty) = self.batch.get(entry) {
            return Ok(dirty.value.clone());
        }
        if let Some(value) = self.cache.get(entry) {
            return Ok(value.map(<[u8]>::to_vec));
        }
        let value = self.store.get(entry)?;
        self.record_reads.push((entry.to_vec(), value.is_some()));
        self.cache.insert(entry.to_vec(), value.clone());
        Ok(value)
    }

    /// Stages `value` under `name` for the current key.
    pub fn put(&mut self, name: &str, value: Vec<u8>) {
        encode_entry_key(&mut self.entry, &self.key, name);
        self.record.push((self.entry.clone(), Some(value)));
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
            // The first write since the last commit asks whether the entry exists:
            // the cache knows if it holds it, the record if it read it (as a
            // read-modify-write does); else the commit will read it.
            let existed = match self.batch.get(&entry) {
                Some(dirty) => {
                    self.dirty_bytes -= entry.len() + dirty.value.as_ref().map_or(0, Vec::len);
                    dirty.existed
                }
                None => self
                    .cache
                    .exists(&entry)
                    .or_else(|| self.record_reads.iter().find(|(read, _)| *read == entry).map(|&(_, exists)| exists)),
            };
            self.dirty_bytes += size;
            self.batch.insert(entry, Dirty { value, existed });
        }
        self.record_reads.clear();
    }

    /// Writes the batch and the next offset to process in one atomic write; the
    /// written values become the cache's.
    pub fn commit(&mut self, next_offset: u64) -> Result<()> {
        debug_assert!(self.record.is_empty(), "commit inside a record");
        let mut batch = WriteBatch::default();
        let mut entries = self.entries;
        let mut written = Vec::with_capacity(self.batch.len());
        for (entry, dirty) in self.batch.drain() {
            // Blind writes (not read recently) are the rare case that costs a read.
            let existed = match dirty.existed {
                Some(existed) => existed,
                None => self.store.get(&entry)?.is_some(),
            };
            match &dirty.value {
                Some(value) => {
                    entries += u64::from(!existed);
                    batch.put(&entry, value);
                }
                None => {
                    entries -= u64::from(existed);
                    batch.delete(&entry);
                }
            }
            written.push((entry, dirty.value));
        }
        self.store.write(batch, next_offset, entries)?;
        self.entries = entries;
        self.dirty_bytes = 0;
        // Only once they are committed: the cache holds committed values alone.
        for (entry, value) in written {
            self.cache.insert(entry, value);
        }
        Ok(())
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    fn open() -> (tempfile::TempDir, Transaction) {
        let dir = tempfile::tempdir().unwrap();
        let store = PartitionStore::open(&dir.path().join("p"), 0).unwrap();
        (dir, Transaction::new(store, 1 << 20).unwrap())
    }

    #[test]
    fn dropped_record_writes_are_never_seen_or_committed() {
        let (_dir, mut txn) = open();
        txn.begin_record(b"k");
        txn.put("n", b"kept".to_vec());
        txn.end_record(true);
        txn.begin_record(b"k");
        txn.put("n", b"dropped".to_vec());
        assert_eq!(txn.get("n").unwrap(), Some(b"dropped".to_vec()));
        txn.end_record(false);
        txn.begin_record(b"k");
        assert_eq!(txn.get("n").unwrap(), Some(b"kept".to_vec()));
        txn.end_record(true);
        txn.commit(7).unwrap();
        txn.begin_record(b"k");
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
                txn.begin_record(key);
                txn.get("n").unwrap();
                txn.put("n", vec![round]);
                txn.end_record(true);
            }
            txn.commit(u64::from(round)).unwrap();
        }
        txn.begin_record(b"b");
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
        txn.begin_record(b"a");
        txn.put("n", b"1".to_vec());
        txn.end_record(true);
        txn.begin_record(b"b");
        assert_eq!(txn.get("n").unwrap(), None);
        txn.delete("n");
        txn.end_record(true);
        txn.begin_record(b"a");
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
                txn.begin_record(&[key]);
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
