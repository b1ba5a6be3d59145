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
}

impl Transaction {
    /// Starts staging writes against `store`.
    pub fn new(store: PartitionStore) -> Self {
        Transaction { store, key: Vec::new(), record: Vec::new(), batch: HashMap::new() }
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
    pub fn get(&self, name: &str) -> Result<Option<Vec<u8>>> {
        let entry = entry_key(&self.key, name);
        if let Some((_, value)) = self.record.iter().rev().find(|(k, _)| *k == entry) {
            return Ok(value.clone());
        }
        if let Some(value) = self.batch.get(&entry) {
            return Ok(value.clone());
        }
        self.store.get(&entry)
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
        for (key, value) in self.batch.drain() {
            match value {
                Some(value) => batch.put(key, value),
                None => batch.delete(key),
            }
        }
        self.store.write(batch, next_offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open() -> (tempfile::TempDir, Transaction) {
        let dir = tempfile::tempdir().unwrap();
        let store = PartitionStore::open(&dir.path().join("p"), 0).unwrap();
        (dir, Transaction::new(store))
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
