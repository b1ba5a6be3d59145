//! Staging a partition's writes between commits.

use super::PartitionStore;
use super::partition::entry_key;
use anyhow::Result;
use rocksdb::WriteBatch;
use std::collections::HashMap;

/// A partition's state as an operator sees it: scoped to the current record's key,
/// with writes staged in memory until [`commit`](Transaction::commit).
///
/// Writes happen at two levels. A record's writes are kept apart until the record
/// ends: [`end_record(true)`](Transaction::end_record) (the operator returned normally)
/// folds them into the batch, `end_record(false)` (error, trap, deadline) drops them.
/// The batch then commits with the source offset in one RocksDB write batch. Reads
/// see the record's writes, then the batch's, then the database.
pub struct Transaction {
    store: PartitionStore,
    /// The current record's key.
    key: Vec<u8>,
    /// The current record's writes, in order (`None` = delete).
    record: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    /// Writes of completed records since the last commit.
    batch: HashMap<Vec<u8>, Option<Vec<u8>>>,
    /// Whether entries read from the database since the last commit exist there, so
    /// that commit can count new and removed entries without reading them again.
    exists: HashMap<Vec<u8>, bool>,
    /// State entries in the database as of the last commit.
    entries: u64,
}

impl Transaction {
    /// Starts staging writes against `store`.
    pub fn new(store: PartitionStore) -> Result<Self> {
        let entries = store.committed_entries()?;
        Ok(Transaction {
            store,
            key: Vec::new(),
            record: Vec::new(),
            batch: HashMap::new(),
            exists: HashMap::new(),
            entries,
        })
    }

    /// State entries as of the last commit; exact, and committed with the state.
    pub fn entries(&self) -> u64 {
        self.entries
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
        let entry = entry_key(&self.key, name);
        if let Some((_, value)) = self.record.iter().rev().find(|(k, _)| *k == entry) {
            return Ok(value.clone());
        }
        if let Some(value) = self.batch.get(&entry) {
            return Ok(value.clone());
        }
        let value = self.store.get(&entry)?;
        self.exists.insert(entry, value.is_some());
        Ok(value)
    }

    /// Stages `value` under `name` for the current key.
    pub fn put(&mut self, name: &str, value: Vec<u8>) {
        self.record.push((entry_key(&self.key, name), Some(value)));
    }

    /// Stages the removal of `name` for the current key.
    pub fn delete(&mut self, name: &str) {
        self.record.push((entry_key(&self.key, name), None));
    }

    /// Ends the current record: keeps its writes if `keep`, drops them otherwise.
    pub fn end_record(&mut self, keep: bool) {
        if keep {
            self.batch.extend(self.record.drain(..));
        } else {
            self.record.clear();
        }
    }

    /// Writes the batch and the next offset to process in one atomic write.
    pub fn commit(&mut self, next_offset: u64) -> Result<()> {
        debug_assert!(self.record.is_empty(), "commit inside a record");
        let mut batch = WriteBatch::default();
        let mut entries = self.entries;
        for (key, value) in self.batch.drain() {
            // Blind writes (no read since the last commit) are the rare case that costs a read.
            let existed = match self.exists.get(&key) {
                Some(&existed) => existed,
                None => self.store.get(&key)?.is_some(),
            };
            match value {
                Some(value) => {
                    entries += u64::from(!existed);
                    batch.put(key, value);
                }
                None => {
                    entries -= u64::from(existed);
                    batch.delete(key);
                }
            }
        }
        self.exists.clear();
        self.store.write(batch, next_offset, entries)?;
        self.entries = entries;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open() -> (tempfile::TempDir, Transaction) {
        let dir = tempfile::tempdir().unwrap();
        let store = PartitionStore::open(&dir.path().join("p"), 0).unwrap();
        (dir, Transaction::new(store).unwrap())
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
        let mut txn = Transaction::new(PartitionStore::open(&dir.path().join("p"), 0).unwrap()).unwrap();
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
        let reopened = Transaction::new(PartitionStore::open(&dir.path().join("q"), 0).unwrap()).unwrap();
        assert_eq!(reopened.entries(), 0);
        drop(txn);
        let reopened = Transaction::new(PartitionStore::open(&dir.path().join("p"), 0).unwrap()).unwrap();
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
}
