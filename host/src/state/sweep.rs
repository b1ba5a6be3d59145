//! The sweep: which of a partition's entries expire, and in what order, as its clock
//! passes them.
//!
//! [`Sweep`] keeps the expiry index of the batch's values beside the committed one in
//! RocksDB, and takes the entries due at the clock from the two together (the
//! *logical* index: the committed one less what the batch overrides, with the
//! batch's), earliest first, a chunk at a time. That order is the same however the
//! commits fell, so a replay from committed state expires the same entries before the
//! same records. It counts what expired, and what was left due at a commit.
//!
//! It holds no values: the [`Transaction`](super::Transaction) stages each removal the
//! sweep names (and owns the batch and the cache it reads), and its commit writes the
//! committed index with the values.

use super::PartitionStore;
use super::expiry::{Clock, StoredValue, index_at, index_entry, index_key};
use super::partition::decode_entry_key;
use crate::config::TtlConfig;
use crate::record::SourceRecord;
use anyhow::{Context, Result};
use std::collections::{BTreeSet, VecDeque};

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

/// Where a partition's expiries stand: the batch's expiry index, the committed index's
/// cursor, the entries taken ahead, and the counts of what expired.
pub(super) struct Sweep {
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
    /// Expired entries removed since the partition was opened here, committed ones...
    expired: u64,
    /// ... and ones staged in the batch.
    expired_in_batch: u64,
}

/// An entry of the logical index due at the clock, by its index key.
pub(super) enum Due {
    /// A value the batch holds (its index entry already out of the batch's index).
    Written(Vec<u8>),
    /// A committed value the batch does not override.
    Committed(Vec<u8>),
}

impl Sweep {
    /// The sweep of `store` as committed: nothing in the batch.
    pub(super) fn new(store: &PartitionStore) -> Result<Self> {
        let index_next = store.expiry_index(None).next().transpose()?.map_or(u64::MAX, |key| index_at(&key));
        Ok(Sweep {
            batch_index: BTreeSet::new(),
            index_next,
            index_cursor: None,
            stale_index: Vec::new(),
            due_ahead: VecDeque::new(),
            backlog: 0,
            expired: 0,
            expired_in_batch: 0,
        })
    }

    /// Expired entries removed since the partition was opened here.
    pub(super) fn expired(&self) -> u64 {
        self.expired
    }

    /// Counts an entry expired in the batch.
    pub(super) fn count_expired(&mut self) {
        self.expired_in_batch += 1;
    }

    /// Expired entries staged in the batch.
    #[cfg(test)]
    fn expired_in_batch(&self) -> u64 {
        self.expired_in_batch
    }

    /// Entries due but not yet expired at the last commit, up to the sweep limit.
    pub(super) fn backlog(&self) -> u64 {
        self.backlog
    }

    /// Whether entries may be due at `clock_ms` (it reached the earliest expiry
    /// known); [`next`](Self::next) says for sure.
    pub(super) fn due(&self, clock_ms: u64) -> bool {
        !self.due_ahead.is_empty() || clock_ms >= self.next_due()
    }

    /// A lower bound of the earliest expiry of the logical index not yet taken ahead.
    fn next_due(&self) -> u64 {
        let batch_next = self.batch_index.first().map_or(u64::MAX, |key| index_at(key));
        self.index_next.min(batch_next)
    }

    /// How many of `records`, in order, move `clock` (under `ttl`) short of the next
    /// expiry known and of `timer_at`, the next timer's time.
    pub(super) fn records_before_due(
        &self,
        mut clock: Clock,
        ttl: &TtlConfig,
        records: &[SourceRecord],
        timer_at: u64,
    ) -> usize {
        let next_due = self.next_due().min(timer_at);
        let mut before = 0;
        for record in records {
            clock.observe(record.offset, &record.key, record.timestamp_ms, ttl);
            if clock.now_ms() >= next_due {
                break;
            }
            before += 1;
        }
        before
    }

    /// Whether index entries found stale wait for the next commit to remove them.
    pub(super) fn has_stale(&self) -> bool {
        !self.stale_index.is_empty()
    }

    /// The batch now holds `stored` under `entry` (the batch's index follows the
    /// entry's value).
    pub(super) fn index_written(&mut self, entry: &[u8], stored: Option<&[u8]>) {
        if let Some(at) = expires_at(stored) {
            self.batch_index.insert(index_key(at, entry));
        }
    }

    /// The batch no longer holds `stored` under `entry`.
    pub(super) fn unindex_written(&mut self, entry: &[u8], stored: Option<&[u8]>) {
        if let Some(at) = expires_at(stored) {
            self.batch_index.remove(&index_key(at, entry));
        }
    }

    /// The committed index entry `index_key` does not match its value: the next commit
    /// removes it.
    pub(super) fn mark_stale(&mut self, index_key: Vec<u8>) {
        self.stale_index.push(index_key);
    }

    /// The index entries found stale, for the commit to remove.
    pub(super) fn drain_stale(&mut self) -> impl Iterator<Item = Vec<u8>> + '_ {
        self.stale_index.drain(..)
    }

    /// The index key of the earliest entry of the logical index due at `clock_ms`, if
    /// any, against the batch of writes (`written` says whether it holds an entry) and
    /// the committed `store`, without taking it: the entries taken ahead that the batch
    /// has overridden since (an `expired` call wrote or deleted them: the batch's value
    /// decides, as for any write) are dropped on the way.
    pub(super) fn peek(
        &mut self,
        store: &PartitionStore,
        written: &dyn Fn(&[u8]) -> bool,
        clock_ms: u64,
    ) -> Result<Option<&[u8]>> {
        loop {
            if self.due_ahead.is_empty() {
                if clock_ms < self.next_due() {
                    return Ok(None);
                }
                self.take_due_ahead(store, written, clock_ms)?;
                if self.due_ahead.is_empty() {
                    return Ok(None);
                }
            }
            let (index_key, from_batch) = self.due_ahead.front().expect("not empty");
            let current = match from_batch {
                true => self.batch_index.contains(index_key),
                false => !written(index_entry(index_key)),
            };
            if current {
                return Ok(self.due_ahead.front().map(|(key, _)| key.as_slice()));
            }
            self.due_ahead.pop_front();
        }
    }

    /// Takes the earliest entry of the logical index due at `clock_ms`, if any: the one
    /// [`peek`](Self::peek) names.
    pub(super) fn next(
        &mut self,
        store: &PartitionStore,
        written: &dyn Fn(&[u8]) -> bool,
        clock_ms: u64,
    ) -> Result<Option<Due>> {
        if self.peek(store, written, clock_ms)?.is_none() {
            return Ok(None);
        }
        let (index_key, from_batch) = self.due_ahead.pop_front().expect("peeked");
        if from_batch {
            self.batch_index.remove(&index_key);
            return Ok(Some(Due::Written(index_key)));
        }
        Ok(Some(Due::Committed(index_key)))
    }

    /// Takes ahead the first [`DUE_AHEAD`] entries of the logical index due at
    /// `clock`, in index order, and moves the committed index's cursor past them.
    fn take_due_ahead(&mut self, store: &PartitionStore, written: &dyn Fn(&[u8]) -> bool, clock: u64) -> Result<()> {
        // The committed index from the cursor, less the entries the batch overrides.
        let mut committed = store
            .expiry_index(self.index_cursor.as_deref())
            .filter(|item| item.as_ref().map_or(true, |key| !written(index_entry(key))));
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

    /// The batch committed to `store`, its index with its values: the next look starts
    /// at the earliest expiry there can be, and what is due at `clock_ms` is counted
    /// (up to `sweep_limit`) as the backlog.
    pub(super) fn committed(&mut self, store: &PartitionStore, clock_ms: u64, sweep_limit: usize) -> Result<()> {
        self.expired += std::mem::take(&mut self.expired_in_batch);
        // The batch's index is the committed one's now, and nothing is overridden: the
        // next look starts at the earliest expiry there can be, entries taken ahead but
        // not expired included.
        let ahead_next = self.due_ahead.drain(..).map(|(key, _)| index_at(&key)).min().unwrap_or(u64::MAX);
        self.index_next = self.next_due().min(ahead_next);
        self.batch_index.clear();
        self.index_cursor = (self.index_next < u64::MAX).then(|| index_key(self.index_next, b""));
        let due = clock_ms >= self.index_next;
        self.backlog = if due { self.count_due(store, clock_ms, sweep_limit)? as u64 } else { 0 };
        Ok(())
    }

    /// Counts the entries due at `clock`, up to `limit`, as of the last commit.
    fn count_due(&self, store: &PartitionStore, clock: u64, limit: usize) -> Result<usize> {
        let mut count = 0;
        for key in store.expiry_index(self.index_cursor.as_deref()) {
            if count == limit || index_at(&key?) > clock {
                break;
            }
            count += 1;
        }
        Ok(count)
    }
}

/// `entry` (an encoded entry key) as an expired one that held `value` until `at`.
pub(super) fn expired_entry(entry: &[u8], value: Vec<u8>, at: u64) -> Result<Expired> {
    let (key, name) = decode_entry_key(entry).context("corrupt state entry key in the expiry index")?;
    let name = String::from_utf8_lossy(name).into_owned();
    Ok(Expired { key: key.to_vec(), name, value, expired_at_ms: at })
}

/// The expiry of a value as stored, if it has one (and a readable header).
fn expires_at(stored: Option<&[u8]>) -> Option<u64> {
    StoredValue::decode(stored?).ok()?.expires_at
}

#[cfg(test)]
mod tests {
    use super::super::partition::encode_entry_key;
    use super::super::transaction::tests::{begin, open, record};
    use super::*;
    use crate::state::{StateEntry, Transaction};
    use std::collections::HashMap;
    use std::sync::Arc;
    use std::time::Duration;

    /// Moves the clock as a next record at `timestamp_ms` would; whether entries may be due.
    fn observe(txn: &mut Transaction, timestamp_ms: i64) -> bool {
        let record = record(b"", timestamp_ms);
        txn.observe(record.offset, &record.key, timestamp_ms)
    }

    /// Expires every entry due at the clock, earliest first.
    fn expire_all(txn: &mut Transaction) -> Vec<Expired> {
        std::iter::from_fn(|| txn.expire_next().unwrap()).collect()
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
            if txn.observe(step, b"k", timestamp) {
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
                    Some(Some((value, now + crate::millis(ttl.ttl(name).unwrap()))))
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
        assert_eq!(txn.expired(), log.len() as u64 - txn.sweep().expired_in_batch());
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

    /// What [`timer_run`] saw fire or expire: (step, key, name, time), in order.
    type FiredLog = Vec<(u64, u8, String, u64)>;

    /// Random timers set, set again and cancelled, among values under a TTL, over a
    /// clock that jumps, with dropped records, commits every `commit_every` steps (some
    /// between two firings) and the transaction reopened from its store after some:
    /// each timer fires once, at the time the model holds for it, never early, in the
    /// order of (time, key, name) with the expiries; after every commit the entry count
    /// is what the store holds, timers included.
    fn timer_run(commit_every: u64) -> FiredLog {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p");
        let open = || {
            Transaction::new(PartitionStore::open(&path, 0).unwrap(), 1 << 20)
                .unwrap()
                .with_ttl(Arc::new(ttl_of(5)))
                .unwrap()
        };
        let mut txn = open();
        txn.advance_clock(T0);
        // (key, timer) -> time
        let mut model: HashMap<(u8, String), u64> = HashMap::new();
        let mut log = FiredLog::new();
        let mut clock = T0;
        let mut seed = 7u64;
        for step in 0..4_000u64 {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let key = (seed >> 33) as u8 % 30;
            let timer = format!("t{}", (seed >> 41) % 3);
            clock += [0, 100, 250, 3_000][(seed >> 45) as usize % 4];
            let keep = !(seed >> 50).is_multiple_of(8);
            if txn.observe(step, b"k", clock) {
                let mut fired = Vec::new();
                while let Some(expired) = txn.expire_next().unwrap() {
                    if fired.len() % 4 == 3 && step.is_multiple_of(commit_every) {
                        txn.commit(step).unwrap();
                    }
                    assert!(expired.expired_at_ms <= txn.clock().now_ms(), "step {step}: {expired:?} early");
                    if let Some(name) = expired.timer() {
                        let at = model.remove(&(expired.key[0], name.to_string()));
                        assert_eq!(at, Some(expired.expired_at_ms), "step {step}: {expired:?}");
                    }
                    let mut entry = Vec::new();
                    encode_entry_key(&mut entry, &expired.key, &expired.name);
                    fired.push(index_key(expired.expired_at_ms, &entry));
                    log.push((step, expired.key[0], expired.name, expired.expired_at_ms));
                }
                assert!(fired.is_sorted(), "step {step}: fired out of order");
            }
            let now = txn.clock().now_ms();
            assert!(!model.values().any(|at| *at <= now), "step {step}: a timer is due at the record");
            txn.scope(&[key]);
            // Some(Some(at)): set; Some(None): cancelled; None: a value written.
            let timer_write = match (seed >> 55) % 4 {
                0 => {
                    txn.cancel_timer(&timer);
                    Some(None)
                }
                1 => {
                    txn.put("v", vec![key]);
                    None
                }
                _ => {
                    let at = now + 1 + (seed >> 20) % 10_000;
                    txn.set_timer(&timer, at).unwrap();
                    Some(Some(at))
                }
            };
            txn.end_record(keep);
            match timer_write.filter(|_| keep) {
                Some(Some(at)) => {
                    model.insert((key, timer), at);
                }
                Some(None) => {
                    model.remove(&(key, timer));
                }
                None => {}
            }
            if step.is_multiple_of(commit_every) {
                txn.commit(step + 1).unwrap();
                assert_eq!(txn.entries(), txn.store().entries().count() as u64, "entries at step {step}");
                if (step / commit_every).is_multiple_of((1_000 / commit_every).max(1)) {
                    drop(txn);
                    txn = open();
                }
            }
        }
        assert!(log.iter().filter(|(.., name, _)| name.starts_with('\u{0}')).count() > 500, "timers fired");
        assert!(log.iter().filter(|(.., name, _)| name == "v").count() > 100, "values expired");
        log
    }

    #[test]
    fn timers_fire_once_each_in_time_order_with_expiries_whatever_the_commits() {
        let log = timer_run(13);
        assert_eq!(timer_run(1), log, "committing every record");
        assert_eq!(timer_run(400), log, "committing every 400 records");
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
        assert!(!txn.tick(Duration::ZERO));
        begin(&mut txn, b"k", 0);
        txn.put("n", b"v".to_vec());
        txn.end_record(true);
        txn.commit(1).unwrap();
        assert!(!txn.tick(Duration::ZERO));
        std::thread::sleep(std::time::Duration::from_millis(150));
        assert!(txn.tick(Duration::ZERO), "no record came, and the entry is due");
        assert_eq!(expire_all(&mut txn).len(), 1);
        txn.commit(1).unwrap();
        assert_eq!((txn.entries(), txn.expired()), (0, 1));
        assert!(!txn.tick(Duration::ZERO));
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
