//! One partition's RocksDB database: state entries, their expiry index, timers, and
//! the offset and clock they reflect.

use super::STATE_FORMAT;
use super::expiry::{CommittedClock, StoredValue, decode_index_key, encode_value, index_at, index_entry};
use super::timer::is_timer_name;
use crate::config::TimeDomain;
use anyhow::{Context, Result, bail};
use rocksdb::{
    ColumnFamily, ColumnFamilyDescriptor, DB, Direction, IteratorMode, Options, WriteBatch, WriteBufferManager,
};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// Column family holding the partition's bookkeeping: format and committed offset.
const META_CF: &str = "meta";
const META_FORMAT: &[u8] = b"format";
const META_OFFSET: &[u8] = b"offset";
const META_ENTRIES: &[u8] = b"entries";
const META_CLOCK: &[u8] = b"clock";
/// What else the clock committed: the offset after the last record it observed, and
/// its run of records too far ahead (count, nearest time, keys' sketch); big-endian
/// u64s, three where sluice before the sketch wrote them (its run's keys then unknown:
/// none).
const META_CLOCK_SEEN: &[u8] = b"clock-seen";
/// The clock TTLs count in, once a job configured one: `event` or `processing`.
const META_TIME: &[u8] = b"time";
/// The last entry key a migration from format 1 rewrote, while it runs.
const META_MIGRATED: &[u8] = b"migrated-to";

/// Column family of the expiry index: an empty value under (expiry, entry key) for
/// every stored value that expires, in expiry order.
const EXPIRY_CF: &str = "expiry";

/// Column family of the timers: each timer's time (a big-endian u64) under its
/// encoded entry key (see the `timer` module).
const TIMERS_CF: &str = "timers";

/// The memtable size of the timers' column family, bytes. Firing reads the timers from
/// memory (the `timer` module), never from here: the family is their durable copy,
/// read only on open, and its memtable only gathers writes for a flush — a put where a
/// timer is set, a delete where it fires, ~64 bytes each in the memtable, most of them
/// cancelling out. At RocksDB's default (64 MiB) that churn alone held 64 MiB of memory
/// at 10,000 keys with six timers each, as much as the values' memtable; at this size
/// it flushes about every 130,000 timer writes.
const TIMERS_MEMTABLE_BYTES: usize = 8 << 20;

/// The format whose values had no expiry header, which [`PartitionStore::open`]
/// migrates.
const FORMAT_WITHOUT_EXPIRY: u32 = 1;

/// The format that kept timers as empty expiring values, which [`PartitionStore::open`]
/// migrates.
const FORMAT_TIMERS_AS_VALUES: u32 = 2;

/// Entries one write batch of the migration from format 1 rewrites.
const MIGRATION_CHUNK: usize = 10_000;

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
    /// The bytes the operator wrote.
    pub value: Vec<u8>,
    /// When the entry expires (ms since the epoch, event time); `None`: never.
    pub expires_at_ms: Option<u64>,
}

/// A partition's database. State entries live in the default column family under
/// `encode_entry_key`, each value behind its expiry header
/// (`expiry::encode_value`); the `expiry` column family indexes
/// the values that expire; the committed source offset and clock live in the `meta`
/// column family and are only ever written in the same batch as the state they reflect.
pub struct PartitionStore {
    db: Arc<DB>,
    path: PathBuf,
    partition: u32,
    /// A [committed view](PartitionStore::committed_view): it reads, and refuses to write.
    never_writes: bool,
}

impl PartitionStore {
    /// The directory of the database.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens (or creates) the database at `path`, checking its recorded format.
    pub fn open(path: &Path, partition: u32) -> Result<Self> {
        let mut options = Self::options();
        options.create_missing_column_families(true);
        let cfs = [rocksdb::DEFAULT_COLUMN_FAMILY_NAME, META_CF, EXPIRY_CF, TIMERS_CF].map(Self::family);
        let db = DB::open_cf_descriptors(&options, path, cfs)
            .with_context(|| format!("opening state of partition {partition} at {}", path.display()))?;
        let store = PartitionStore { db: Arc::new(db), path: path.to_path_buf(), partition, never_writes: false };
        match store.get_meta(META_FORMAT)? {
            None => {
                let mut batch = WriteBatch::default();
                batch.put_cf(store.meta(), META_FORMAT, STATE_FORMAT.to_be_bytes());
                store.db.write(batch)?;
            }
            Some(bytes) if bytes == STATE_FORMAT.to_be_bytes() => {}
            Some(bytes) if bytes == FORMAT_WITHOUT_EXPIRY.to_be_bytes() => {
                store.migrate_from_format_1(MIGRATION_CHUNK)?;
                store.migrate_from_format_2(MIGRATION_CHUNK)?
            }
            Some(bytes) if bytes == FORMAT_TIMERS_AS_VALUES.to_be_bytes() => {
                store.migrate_from_format_2(MIGRATION_CHUNK)?
            }
            Some(bytes) => bail!(
                "state of partition {partition} at {} has format {:?}, this sluice reads format {STATE_FORMAT}",
                path.display(),
                bytes
            ),
        }
        Ok(store)
    }

    /// A second handle on this database that reads the committed state and never
    /// writes — under a [detached](super::Transaction::detached) transaction, which
    /// stages writes it never commits: every write through it fails. It keeps the
    /// database open until it is dropped.
    pub fn committed_view(&self) -> PartitionStore {
        PartitionStore { db: self.db.clone(), path: self.path.clone(), partition: self.partition, never_writes: true }
    }

    /// Fails on a [committed view](PartitionStore::committed_view), which never writes.
    fn check_writable(&self) -> Result<()> {
        if self.never_writes {
            bail!("a committed view of the state of partition {} never writes", self.partition);
        }
        Ok(())
    }

    /// Opens the existing database at `path` to read it alone: nothing is created,
    /// migrated or written. Fails, naming it, unless it is in this build's format.
    pub fn open_read_only(path: &Path, partition: u32) -> Result<Self> {
        let context = || format!("opening state of partition {partition} at {} to read it", path.display());
        if !path.exists() {
            bail!("state of partition {partition} at {} does not exist", path.display());
        }
        let options = Self::options();
        let cfs = DB::list_cf(&options, path).with_context(context)?;
        if ![META_CF, EXPIRY_CF, TIMERS_CF].iter().all(|cf| cfs.iter().any(|found| found == cf)) {
            bail!(
                "state of partition {partition} at {} lacks the column families of state format {STATE_FORMAT} \
                 (found {cfs:?})",
                path.display()
            );
        }
        let cfs = cfs.iter().map(|name| Self::family(name));
        let db = DB::open_cf_descriptors_read_only(&options, path, cfs, false).with_context(context)?;
        let store = PartitionStore { db: Arc::new(db), path: path.to_path_buf(), partition, never_writes: false };
        match store.get_meta(META_FORMAT)? {
            Some(bytes) if bytes == STATE_FORMAT.to_be_bytes() => Ok(store),
            found => bail!(
                "state of partition {partition} at {} has format {found:?}; this sluice reads format {STATE_FORMAT} \
                 only without writing (a job it runs migrates formats {FORMAT_WITHOUT_EXPIRY} and \
                 {FORMAT_TIMERS_AS_VALUES} at its start)",
                path.display()
            ),
        }
    }

    /// Rewrites every value of a format-1 database (written before values carried an
    /// expiry) with a header saying it never expires, `chunk` entries per write batch,
    /// each recording how far it got: a crash resumes where the last batch ended.
    fn migrate_from_format_1(&self, chunk: usize) -> Result<()> {
        let mut migrated_to = self.get_meta(META_MIGRATED)?;
        let mut rewritten = 0u64;
        loop {
            let mode = match &migrated_to {
                Some(last) => IteratorMode::From(last, Direction::Forward),
                None => IteratorMode::Start,
            };
            let mut batch = WriteBatch::default();
            let mut last = None;
            for item in self.db.iterator(mode) {
                let (entry, value) = item?;
                if migrated_to.as_deref() == Some(&entry[..]) {
                    continue;
                }
                batch.put(&entry, encode_value(&value, None));
                last = Some(entry);
                if batch.len() == chunk {
                    break;
                }
            }
            let Some(last) = last else { break };
            rewritten += batch.len() as u64;
            batch.put_cf(self.meta(), META_MIGRATED, &last);
            self.db.write(batch).with_context(|| format!("migrating state of partition {}", self.partition))?;
            migrated_to = Some(last.into_vec());
        }
        let mut done = WriteBatch::default();
        done.put_cf(self.meta(), META_FORMAT, FORMAT_TIMERS_AS_VALUES.to_be_bytes());
        done.delete_cf(self.meta(), META_MIGRATED);
        self.db.write(done)?;
        tracing::info!(
            partition = self.partition,
            "state migrated from format {FORMAT_WITHOUT_EXPIRY} to {FORMAT_TIMERS_AS_VALUES}: {rewritten} values now \
             carry an expiry header (none expires)"
        );
        Ok(())
    }

    /// Moves every timer of a format-2 database (kept as an empty value expiring at its
    /// time, with an expiry index entry) to the timers column family, `chunk` timers per
    /// write batch, each batch removing what it moved: a crash resumes with the timers
    /// left. The entry count is unchanged (timers count as entries).
    fn migrate_from_format_2(&self, chunk: usize) -> Result<()> {
        let mut moved = 0u64;
        // The index key looked at last: those before it are moved or values.
        let mut from: Option<Vec<u8>> = None;
        loop {
            let mut batch = WriteBatch::default();
            for index_key in self.expiry_index(from.as_deref()) {
                let index_key = index_key?;
                let (at, entry) = (index_at(&index_key), index_entry(&index_key));
                let is_timer = decode_entry_key(entry).is_some_and(|(_, name)| is_timer_name(name));
                if is_timer && from.as_deref() != Some(&index_key[..]) {
                    batch.delete_cf(self.expiry(), &index_key);
                    batch.delete(entry);
                    batch.put_cf(self.timers_family(), entry, at.to_be_bytes());
                }
                from = Some(index_key);
                if batch.len() == 3 * chunk {
                    break;
                }
            }
            if batch.is_empty() {
                break;
            }
            moved += batch.len() as u64 / 3;
            self.db.write(batch).with_context(|| format!("migrating the timers of partition {}", self.partition))?;
        }
        let mut done = WriteBatch::default();
        done.put_cf(self.meta(), META_FORMAT, STATE_FORMAT.to_be_bytes());
        self.db.write(done)?;
        tracing::info!(
            partition = self.partition,
            "state migrated from format {FORMAT_TIMERS_AS_VALUES} to {STATE_FORMAT}: {moved} timers moved to a column \
             family of their own"
        );
        Ok(())
    }

    /// The column family `name` with [`options`](Self::options): every family must be
    /// named with its options on open, or RocksDB gives it its defaults (its own block
    /// cache outside the memory budget, no filters). Only the state values' (default)
    /// family keeps the memtable filter: the others are iterated or hold a few keys.
    /// The timers' family has a small memtable ([`TIMERS_MEMTABLE_BYTES`]).
    fn family(name: &str) -> ColumnFamilyDescriptor {
        let mut options = Self::options();
        if name != rocksdb::DEFAULT_COLUMN_FAMILY_NAME {
            options.set_memtable_prefix_bloom_ratio(0.0);
            options.set_memtable_whole_key_filtering(false);
        }
        if name == TIMERS_CF {
            options.set_write_buffer_size(TIMERS_MEMTABLE_BYTES);
        }
        ColumnFamilyDescriptor::new(name, options)
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
        // A read of a key not in the memtable (most reads, with state larger than the
        // cache) skips searching it: 8% less CPU per record at 1M keys. The filter takes
        // this share of a memtable's size (64 MiB) whatever it holds: a hundredth is about
        // 20 bits per entry of a 250-byte value, where 10 already rule out 99% of misses.
        options.set_memtable_prefix_bloom_ratio(0.01);
        options.set_memtable_whole_key_filtering(true);
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

    /// RocksDB's estimate of the live data in the partition's table files, every column
    /// family (values, expiry index, metadata, timers) together, in bytes: what compaction
    /// would leave. Memtables are not counted.
    pub fn live_data_bytes(&self) -> Result<u64> {
        self.summed_property(rocksdb::properties::ESTIMATE_LIVE_DATA_SIZE, "live data size")
    }

    /// The bytes RocksDB's memtables hold for the partition, every column family
    /// together: writes not yet flushed into table files.
    pub fn memtable_bytes(&self) -> Result<u64> {
        self.summed_property(rocksdb::properties::CUR_SIZE_ALL_MEM_TABLES, "memtable size")
    }

    /// RocksDB's integer `property` summed over every column family; `what` names it
    /// in an error.
    fn summed_property(&self, property: &rocksdb::properties::PropName, what: &str) -> Result<u64> {
        let families = [
            self.db.cf_handle(rocksdb::DEFAULT_COLUMN_FAMILY_NAME),
            Some(self.expiry()),
            Some(self.meta()),
            Some(self.timers_family()),
        ];
        let mut total = 0;
        for family in families.into_iter().flatten() {
            let value = self.db.property_int_value_cf(family, property);
            total += value.with_context(|| format!("reading the {what} of partition {}", self.partition))?.unwrap_or(0);
        }
        Ok(total)
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

    /// The event-time clock committed with the state (its time in ms since the epoch;
    /// 0: not started). State written before the clock kept what it observed resumes
    /// with the time alone.
    pub fn committed_clock(&self) -> Result<CommittedClock> {
        let now_ms = self.get_u64(META_CLOCK)?;
        let Some(seen) = self.get_meta(META_CLOCK_SEEN)? else {
            return Ok(CommittedClock { now_ms, ..Default::default() });
        };
        let words: Vec<u64> =
            seen.chunks_exact(8).map(|word| u64::from_be_bytes(word.try_into().expect("8 bytes"))).collect();
        match words[..] {
            [next_offset, ahead, nearest] if seen.len() == 24 => {
                Ok(CommittedClock { now_ms, next_offset, ahead: (ahead, nearest, 0) })
            }
            [next_offset, ahead, nearest, keys] if seen.len() == 32 => {
                Ok(CommittedClock { now_ms, next_offset, ahead: (ahead, nearest, keys) })
            }
            _ => bail!(
                "corrupt `{}` in state of partition {} at {}: {} bytes, not 24 or 32",
                String::from_utf8_lossy(META_CLOCK_SEEN),
                self.partition,
                self.path.display(),
                seen.len()
            ),
        }
    }

    /// Records that this partition's TTLs count in `time`, or checks that they already
    /// do: expiries stamped by one clock mean nothing to the other.
    pub(super) fn record_time(&self, time: TimeDomain) -> Result<()> {
        match self.get_meta(META_TIME)? {
            None => {
                self.check_writable()?;
                let mut batch = WriteBatch::default();
                batch.put_cf(self.meta(), META_TIME, time.name());
                self.db.write(batch).with_context(|| format!("writing state of partition {}", self.partition))
            }
            Some(recorded) if recorded == time.name().as_bytes() => Ok(()),
            Some(recorded) => bail!(
                "state of partition {} at {} counts TTLs in {} time, but [ttl] time = \"{}\": its entries' expiries \
                 were stamped by the other clock. Set [ttl] time = \"{}\" or use a new state directory; nothing was \
                 changed",
                self.partition,
                self.path.display(),
                String::from_utf8_lossy(&recorded),
                time.name(),
                String::from_utf8_lossy(&recorded)
            ),
        }
    }

    /// Reads the stored bytes (expiry header included) of an encoded entry key.
    pub(super) fn get(&self, entry_key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.db.get(entry_key).with_context(|| format!("reading state of partition {}", self.partition))
    }

    /// Writes `batch` with the new committed `offset`, entry count and clock, atomically.
    pub(super) fn write(&self, mut batch: WriteBatch, offset: u64, entries: u64, clock: CommittedClock) -> Result<()> {
        self.check_writable()?;
        batch.put_cf(self.meta(), META_OFFSET, offset.to_be_bytes());
        batch.put_cf(self.meta(), META_ENTRIES, entries.to_be_bytes());
        batch.put_cf(self.meta(), META_CLOCK, clock.now_ms.to_be_bytes());
        let seen: Vec<u8> = [clock.next_offset, clock.ahead.0, clock.ahead.1, clock.ahead.2]
            .iter()
            .flat_map(|w| w.to_be_bytes())
            .collect();
        batch.put_cf(self.meta(), META_CLOCK_SEEN, seen);
        self.db.write(batch).with_context(|| format!("committing state of partition {}", self.partition))
    }

    /// Every stored state entry in key order, expired ones not yet removed included,
    /// and every timer among them (an entry under its reserved name, with no value,
    /// expiring at its time).
    pub fn entries(&self) -> impl Iterator<Item = Result<StateEntry>> + '_ {
        let values = self.db.iterator(IteratorMode::Start).map(|item| -> Result<(Box<[u8]>, StoredEntry)> {
            let (k, v) = item?;
            Ok((k, StoredEntry::Value(v)))
        });
        let timers = self.db.iterator_cf(self.timers_family(), IteratorMode::Start).map(|item| {
            let (k, v) = item?;
            Ok((k, StoredEntry::Timer(v)))
        });
        merge_by_key(values, timers).map(|item| {
            let (k, stored) = item?;
            let (key, name) = decode_entry_key(&k).context("corrupt state entry key")?;
            let name = String::from_utf8_lossy(name).into_owned();
            let corrupt = || {
                format!(
                    "corrupt value of {name:?} under key {:?} in state of partition {}",
                    String::from_utf8_lossy(key),
                    self.partition
                )
            };
            let (value, expires_at_ms) = match stored {
                StoredEntry::Value(v) => {
                    let stored = StoredValue::decode(&v).with_context(corrupt)?;
                    (stored.value.to_vec(), stored.expires_at)
                }
                StoredEntry::Timer(at) => (Vec::new(), Some(decode_timer_at(&at).with_context(corrupt)?)),
            };
            Ok(StateEntry { key: key.to_vec(), name, value, expires_at_ms })
        })
    }

    /// Every timer: its encoded entry key and its time, in entry key order.
    pub(super) fn timers(&self) -> impl Iterator<Item = Result<(Vec<u8>, u64)>> + '_ {
        self.db.iterator_cf(self.timers_family(), IteratorMode::Start).map(|item| {
            let (entry, at) = item?;
            let at = decode_timer_at(&at).with_context(|| {
                format!("corrupt timer {:?} in state of partition {}", String::from_utf8_lossy(&entry), self.partition)
            })?;
            Ok((entry.into_vec(), at))
        })
    }

    /// The column family of the timers, for a commit's write batch.
    pub(super) fn timers_family(&self) -> &ColumnFamily {
        self.db.cf_handle(TIMERS_CF).expect("timers column family is created on open")
    }

    /// Writes every stored entry to `out` as `sluice state dump` shows it, one JSON line
    /// each ([`state_line`](crate::lines::state_line)), in key order.
    pub fn dump(&self, out: &mut impl std::io::Write) -> Result<()> {
        for entry in self.entries() {
            let entry = entry?;
            let line =
                crate::lines::state_line(self.partition, &entry.key, &entry.name, &entry.value, entry.expires_at_ms);
            serde_json::to_writer(&mut *out, &line)?;
            out.write_all(b"\n")?;
        }
        Ok(())
    }

    /// The expiry index's keys ([`index_key`](super::expiry::index_key)s: expiry,
    /// then encoded entry key) in expiry order, from `from` (inclusive) or the earliest.
    pub(super) fn expiry_index<'a>(&'a self, from: Option<&[u8]>) -> impl Iterator<Item = Result<Vec<u8>>> + use<'a> {
        let mode = from.map_or(IteratorMode::Start, |from| IteratorMode::From(from, rocksdb::Direction::Forward));
        self.db.iterator_cf(self.expiry(), mode).map(|item| {
            let (key, _) = item?;
            decode_index_key(&key)
                .with_context(|| format!("corrupt expiry index key in state of partition {}", self.partition))?;
            Ok(key.into_vec())
        })
    }

    /// The column family of the expiry index, for a commit's write batch.
    pub(super) fn expiry(&self) -> &ColumnFamily {
        self.db.cf_handle(EXPIRY_CF).expect("expiry column family is created on open")
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

    fn meta(&self) -> &ColumnFamily {
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

/// A stored entry before decoding: a value (expiry header first) or a timer's time.
enum StoredEntry {
    Value(Box<[u8]>),
    Timer(Box<[u8]>),
}

/// A timer's time as the timers column family stores it.
fn decode_timer_at(stored: &[u8]) -> Result<u64> {
    let bytes: [u8; 8] = stored.try_into().with_context(|| format!("{} bytes, not 8", stored.len()))?;
    Ok(u64::from_be_bytes(bytes))
}

/// Two iterators of `(key, item)` in key order merged into one in key order.
fn merge_by_key<T>(
    a: impl Iterator<Item = Result<(Box<[u8]>, T)>>,
    b: impl Iterator<Item = Result<(Box<[u8]>, T)>>,
) -> impl Iterator<Item = Result<(Box<[u8]>, T)>> {
    let (mut a, mut b) = (a.peekable(), b.peekable());
    std::iter::from_fn(move || {
        let take_a = match (a.peek(), b.peek()) {
            (Some(Ok((ka, _))), Some(Ok((kb, _)))) => ka <= kb,
            (Some(Err(_)), _) | (Some(_), None) => true,
            (_, Some(_)) => false,
            (None, None) => return None,
        };
        if take_a { a.next() } else { b.next() }
    })
}

pub(super) fn decode_entry_key(encoded: &[u8]) -> Option<(&[u8], &[u8])> {
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

    /// Every column family gets the partition's options, the default one above all
    /// (RocksDB would give an unnamed family its defaults: no filter, its own cache),
    /// only the state values' family a memtable filter, and only the timers' family a
    /// small memtable.
    #[test]
    fn every_column_family_has_the_partitions_options() {
        let dir = tempfile::tempdir().unwrap();
        drop(PartitionStore::open(dir.path(), 0).unwrap());
        let options = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|file| file.unwrap().path())
            .find(|path| path.file_name().unwrap().to_string_lossy().starts_with("OPTIONS-"))
            .expect("RocksDB writes an OPTIONS file");
        let options = std::fs::read_to_string(options).unwrap();
        for family in [rocksdb::DEFAULT_COLUMN_FAMILY_NAME, META_CF, EXPIRY_CF, TIMERS_CF] {
            let section = |kind: &str| {
                let start =
                    options.find(&format!("[{kind} \"{family}\"]")).unwrap_or_else(|| panic!("{kind} of {family}"));
                let rest = &options[start + 1..];
                &rest[..rest.find("\n[").unwrap_or(rest.len())]
            };
            let memtable_filter = family == rocksdb::DEFAULT_COLUMN_FAMILY_NAME;
            let expected = format!("memtable_whole_key_filtering={memtable_filter}");
            assert!(section("CFOptions").contains(&expected), "{family}");
            const ROCKSDB_DEFAULT_MEMTABLE_BYTES: usize = 64 << 20;
            let memtable_bytes =
                if family == TIMERS_CF { TIMERS_MEMTABLE_BYTES } else { ROCKSDB_DEFAULT_MEMTABLE_BYTES };
            assert!(section("CFOptions").contains(&format!("\n  write_buffer_size={memtable_bytes}\n")), "{family}");
            assert!(section("TableOptions/BlockBasedTable").contains("filter_policy=bloomfilter"), "{family}");
        }
    }

    /// A format-2 database (timers kept as empty values expiring at their time, in the
    /// expiry index with the values under a TTL), migrated a few timers per batch: every
    /// timer moves to the timers column family, the values and their index stay, and
    /// the state reads (and dumps) as before.
    #[test]
    fn a_format_2_databases_timers_move_to_their_column_family() {
        let dir = tempfile::tempdir().unwrap();
        let entry = |i: u32, name: &str| {
            let mut key = Vec::new();
            encode_entry_key(&mut key, &i.to_be_bytes(), name);
            key
        };
        let timer = super::super::timer::entry_name("close");
        let before: Vec<StateEntry>;
        {
            let mut options = Options::default();
            options.create_if_missing(true);
            options.create_missing_column_families(true);
            let db = DB::open_cf(&options, dir.path(), [META_CF, EXPIRY_CF]).unwrap();
            let (meta, expiry) = (db.cf_handle(META_CF).unwrap(), db.cf_handle(EXPIRY_CF).unwrap());
            db.put_cf(meta, META_FORMAT, FORMAT_TIMERS_AS_VALUES.to_be_bytes()).unwrap();
            db.put_cf(meta, META_ENTRIES, 50u64.to_be_bytes()).unwrap();
            for i in 0..25 {
                // The timers interleave with the values in the index.
                let (value_at, timer_at) = (1_000 + 2 * u64::from(i), 1_001 + 2 * u64::from(i));
                db.put(entry(i, "v"), encode_value(b"x", Some(value_at))).unwrap();
                db.put_cf(expiry, super::super::expiry::index_key(value_at, &entry(i, "v")), b"").unwrap();
                db.put(entry(i, &timer), encode_value(b"", Some(timer_at))).unwrap();
                db.put_cf(expiry, super::super::expiry::index_key(timer_at, &entry(i, &timer)), b"").unwrap();
            }
            drop(db);
            let cfs = [rocksdb::DEFAULT_COLUMN_FAMILY_NAME, META_CF, EXPIRY_CF, TIMERS_CF].map(PartitionStore::family);
            let mut options = PartitionStore::options();
            options.create_missing_column_families(true);
            let db = DB::open_cf_descriptors(&options, dir.path(), cfs).unwrap();
            let store = PartitionStore { db: Arc::new(db), path: dir.path().into(), partition: 0, never_writes: false };
            before = store.entries().map(Result::unwrap).collect();
            assert_eq!(before.len(), 50);
            store.migrate_from_format_2(4).unwrap();
        }
        let store = PartitionStore::open(dir.path(), 0).unwrap();
        let after: Vec<StateEntry> = store.entries().map(Result::unwrap).collect();
        assert_eq!(after, before, "the state reads as before");
        let timers: Vec<(Vec<u8>, u64)> = store.timers().map(Result::unwrap).collect();
        assert_eq!(timers, (0..25).map(|i| (entry(i, &timer), 1_001 + 2 * u64::from(i))).collect::<Vec<_>>());
        let index: Vec<Vec<u8>> = store.expiry_index(None).map(Result::unwrap).collect();
        let values: Vec<Vec<u8>> =
            (0..25).map(|i| super::super::expiry::index_key(1_000 + 2 * u64::from(i), &entry(i, "v"))).collect();
        assert_eq!(index, values, "only the values are left in the expiry index");
        assert_eq!(store.committed_entries().unwrap(), 50, "timers still count as entries");
        assert_eq!(store.get_meta(META_FORMAT).unwrap(), Some(STATE_FORMAT.to_be_bytes().to_vec()));
    }

    /// A format-1 database (values without an expiry header), as a migration killed
    /// after its first batch left it: the first ten values rewritten and recorded.
    #[test]
    fn a_format_1_database_is_migrated_once_and_an_interrupted_migration_resumes() {
        let dir = tempfile::tempdir().unwrap();
        let entry = |i: u32| {
            let mut key = Vec::new();
            encode_entry_key(&mut key, &i.to_be_bytes(), "n");
            key
        };
        // A format-1 value may start with any byte, the header's included.
        let value = |i: u32| if i == 3 || i == 17 { vec![1, 2, 3] } else { format!("{{\"v\":{i}}}").into_bytes() };
        {
            let mut options = Options::default();
            options.create_if_missing(true);
            options.create_missing_column_families(true);
            let db = DB::open_cf(&options, dir.path(), [META_CF]).unwrap();
            let meta = db.cf_handle(META_CF).unwrap();
            db.put_cf(meta, META_FORMAT, FORMAT_WITHOUT_EXPIRY.to_be_bytes()).unwrap();
            for i in 0..25 {
                let migrated = i < 10;
                db.put(entry(i), if migrated { encode_value(&value(i), None) } else { value(i) }).unwrap();
            }
            db.put_cf(meta, META_MIGRATED, entry(9)).unwrap();
        }
        for _ in 0..2 {
            let store = PartitionStore::open(dir.path(), 0).unwrap();
            let entries: Vec<StateEntry> = store.entries().map(Result::unwrap).collect();
            let expected: Vec<StateEntry> = (0..25)
                .map(|i: u32| StateEntry {
                    key: i.to_be_bytes().to_vec(),
                    name: "n".into(),
                    value: value(i),
                    expires_at_ms: None,
                })
                .collect();
            assert_eq!(entries, expected);
            assert_eq!(store.get_meta(META_FORMAT).unwrap(), Some(STATE_FORMAT.to_be_bytes().to_vec()));
            assert_eq!(store.get_meta(META_MIGRATED).unwrap(), None);
        }
    }
}
