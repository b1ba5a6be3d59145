//! One partition's RocksDB database: state entries and the offset they reflect.

use super::STATE_FORMAT;
use anyhow::{Context, Result, bail};
use rocksdb::{ColumnFamilyDescriptor, DB, IteratorMode, Options, WriteBatch, WriteBufferManager};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Column family holding the partition's bookkeeping: format and committed offset.
const META_CF: &str = "meta";
const META_FORMAT: &[u8] = b"format";
const META_OFFSET: &[u8] = b"offset";
const META_ENTRIES: &[u8] = b"entries";

/// RocksDB's memory for every partition store of this process: one block cache, to
/// which a write buffer manager charges the memtables, so memtables, data blocks and
/// index and filter blocks stay within one budget however many partitions the host
/// owns (RocksDB's defaults give each database up to two 64 MiB memtables and a block
/// cache of its own).
struct Memory {
    budget: usize,
    cache: rocksdb::Cache,
    write_buffers: WriteBufferManager,
}

static MEMORY: OnceLock<Memory> = OnceLock::new();

/// Bounds the memory of every partition store this process opens from now on to
/// `budget` bytes: memtables are flushed once they hold half of it, and blocks read
/// share the rest. Set once, before the first store opens (a second call with another
/// budget is an error); without it each store gets RocksDB's defaults.
pub fn limit_memory(budget: usize) -> Result<()> {
    let memory = MEMORY.get_or_init(|| {
        let cache = rocksdb::Cache::new_lru_cache(budget);
        let write_buffers = WriteBufferManager::new_write_buffer_manager_with_cache(budget / 2, false, cache.clone());
        Memory { budget, cache, write_buffers }
    });
    if memory.budget != budget {
        bail!("RocksDB's memory is already bounded to {} bytes, not {budget}", memory.budget);
    }
    Ok(())
}

/// One state entry: a named value under a record key.
#[derive(Debug, Clone, PartialEq)]
pub struct StateEntry {
    /// The record key the value belongs to.
    pub key: Vec<u8>,
    /// The name the operator stored it under.
    pub name: String,
    /// The stored bytes.
    pub value: Vec<u8>,
}

/// A partition's database. State entries live in the default column family under
/// [`encode_entry_key`]; the committed source offset lives in the `meta` column family and
/// is only ever written in the same batch as the state it reflects.
pub struct PartitionStore {
    db: DB,
    path: PathBuf,
    partition: u32,
}

impl PartitionStore {
    /// Opens (or creates) the database at `path`, checking its recorded format.
    pub fn open(path: &Path, partition: u32) -> Result<Self> {
        let mut options = Self::options();
        options.create_missing_column_families(true);
        let cfs = [ColumnFamilyDescriptor::new(META_CF, Options::default())];
        let db = DB::open_cf_descriptors(&options, path, cfs)
            .with_context(|| format!("opening state of partition {partition} at {}", path.display()))?;
        let store = PartitionStore { db, path: path.to_path_buf(), partition };
        match store.get_meta(META_FORMAT)? {
            None => {
                let mut batch = WriteBatch::default();
                batch.put_cf(store.meta(), META_FORMAT, STATE_FORMAT.to_be_bytes());
                store.db.write(batch)?;
            }
            Some(bytes) if bytes == STATE_FORMAT.to_be_bytes() => {}
            Some(bytes) => bail!(
                "state of partition {partition} at {} has format {:?}, this sluice reads format {STATE_FORMAT}",
                path.display(),
                bytes
            ),
        }
        Ok(store)
    }

    /// The RocksDB options of a partition's state (public so benchmarks compare raw
    /// RocksDB under the same settings).
    pub fn options() -> Options {
        let mut options = Options::default();
        options.create_if_missing(true);
        options.set_compression_type(rocksdb::DBCompressionType::Lz4);
        // A read of a key the partition never saw (every new entity's first record)
        // skips the table files the filter rules out instead of searching each.
        let mut table = rocksdb::BlockBasedOptions::default();
        table.set_bloom_filter(10.0, false);
        if let Some(memory) = MEMORY.get() {
            table.set_block_cache(&memory.cache);
            // Index and filter blocks count against the budget too, the newest files'
            // kept in it (every read consults them).
            table.set_cache_index_and_filter_blocks(true);
            table.set_pin_l0_filter_and_index_blocks_in_cache(true);
            options.set_write_buffer_manager(&memory.write_buffers);
        }
        options.set_block_based_table_factory(&table);
        options
    }

    /// Writes a consistent snapshot of the committed state to the new directory `dir`:
    /// RocksDB flushes its memtables and hard-links the (immutable) table files, so this
    /// takes milliseconds whatever the state's size.
    pub fn snapshot(&self, dir: &Path) -> Result<()> {
        rocksdb::checkpoint::Checkpoint::new(&self.db)
            .and_then(|checkpoint| checkpoint.create_checkpoint(dir))
            .with_context(|| format!("snapshotting state of partition {} into {}", self.partition, dir.display()))
    }

    /// The partition this store belongs to.
    pub fn partition(&self) -> u32 {
        self.partition
    }

    /// The next source offset to process: the offset committed with the state, or 0.
    pub fn committed_offset(&self) -> Result<u64> {
        self.get_u64(META_OFFSET)
    }

    /// The number of state entries, committed with the state (exact, unlike RocksDB's
    /// own estimate, which counts every overwrite still in a memtable).
    pub fn committed_entries(&self) -> Result<u64> {
        self.get_u64(META_ENTRIES)
    }

    /// Reads the value of an encoded entry key.
    pub(super) fn get(&self, entry_key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.db.get(entry_key).with_context(|| format!("reading state of partition {}", self.partition))
    }

    /// Writes `batch` with the new committed `offset` and entry count, atomically.
    pub(super) fn write(&self, mut batch: WriteBatch, offset: u64, entries: u64) -> Result<()> {
        batch.put_cf(self.meta(), META_OFFSET, offset.to_be_bytes());
        batch.put_cf(self.meta(), META_ENTRIES, entries.to_be_bytes());
        self.db.write(batch).with_context(|| format!("committing state of partition {}", self.partition))
    }

    /// Every state entry in key order.
    pub fn entries(&self) -> impl Iterator<Item = Result<StateEntry>> + '_ {
        self.db.iterator(IteratorMode::Start).map(|item| {
            let (k, v) = item?;
            let (key, name) = decode_entry_key(&k).context("corrupt state entry key")?;
            Ok(StateEntry { key: key.to_vec(), name: String::from_utf8_lossy(name).into_owned(), value: v.to_vec() })
        })
    }

    /// The number of distinct record keys holding state; reads every entry.
    pub fn count_keys(&self) -> Result<u64> {
        let mut count = 0;
        let mut last: Option<Vec<u8>> = None;
        for entry in self.entries() {
            let entry = entry?;
            if last.as_ref() != Some(&entry.key) {
                count += 1;
                last = Some(entry.key);
            }
        }
        Ok(count)
    }

    fn meta(&self) -> &rocksdb::ColumnFamily {
        self.db.cf_handle(META_CF).expect("meta column family is created on open")
    }

    fn get_meta(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.db.get_cf(self.meta(), key).with_context(|| format!("reading state of partition {}", self.partition))
    }

    /// A big-endian u64 in the meta column family; 0 when absent.
    fn get_u64(&self, key: &[u8]) -> Result<u64> {
        let Some(bytes) = self.get_meta(key)? else { return Ok(0) };
        let bytes: [u8; 8] = bytes.as_slice().try_into().with_context(|| {
            format!(
                "corrupt `{}` in state of partition {} at {}",
                String::from_utf8_lossy(key),
                self.partition,
                self.path.display()
            )
        })?;
        Ok(u64::from_be_bytes(bytes))
    }
}

/// Encodes into `out` (replacing what it held) the RocksDB key of the value `name`
/// under record key `key`: the key's length (u32, big-endian), the key, then the name.
/// The length prefix keeps one key's names contiguous and apart from every other key's.
pub(super) fn encode_entry_key(out: &mut Vec<u8>, key: &[u8], name: &str) {
    out.clear();
    out.extend_from_slice(&(key.len() as u32).to_be_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(name.as_bytes());
}

fn decode_entry_key(encoded: &[u8]) -> Option<(&[u8], &[u8])> {
    let len = u32::from_be_bytes(encoded.get(..4)?.try_into().ok()?) as usize;
    let key = encoded.get(4..4 + len)?;
    Some((key, &encoded[4 + len..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_keys_of_different_keys_never_collide() {
        // Without the length prefix, key "ab" + name "c" would equal key "a" + name "bc".
        let (mut ab_c, mut a_bc) = (Vec::new(), Vec::new());
        encode_entry_key(&mut ab_c, b"ab", "c");
        encode_entry_key(&mut a_bc, b"a", "bc");
        assert_ne!(ab_c, a_bc);
        assert_eq!(decode_entry_key(&ab_c), Some((&b"ab"[..], &b"c"[..])));
    }
}
