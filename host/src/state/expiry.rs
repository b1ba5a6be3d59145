//! When state entries expire: each stored value's expiry stamp and a partition's
//! event-time clock.
//!
//! How entries expire is configured by [`TtlConfig`]. Every stored value starts with a header saying when it expires, if ever
//! ([`encode_value`], [`StoredValue`]); an entry whose expiry is at or below the
//! partition's [`Clock`] is never returned, whether or not it was physically removed
//! yet. Physical removal — the time-ordered index and the bounded sweep — happens in the
//! [`Transaction`](super::Transaction)'s commit, which writes a value, its index entry
//! and the clock in one RocksDB write batch.
//!
//! This module decides what expires and when; it does not read or write the database.

use crate::config::{TimeDomain, TtlConfig};
use crate::millis;
use crate::probes::now_ms;
use crate::record::key_hash;
use anyhow::{Result, bail};
use std::time::Duration;

/// A partition's clock, in milliseconds since the Unix epoch; it never goes back. In
/// event time it is the largest record timestamp seen, less the allowed lateness; in
/// processing time, the wall clock. It is committed with the state and the offset, so
/// a restart or a new owner resumes an event clock exactly.
///
/// What moves an event clock is decided by the records and the committed clock alone,
/// never by the wall clock of whoever processes them: a replay — after a crash, a
/// restore or a handover, minutes or months later — moves it exactly as the first run
/// did. A timestamp more than `[ttl] future_skew` ahead of the clock (a device whose
/// clock is years off, say) does not move it; a run of `[ttl] future_confirm` such
/// records in a row does, to the nearest of them, so a gap in the data (a partition
/// idle for days) is crossed while a lone far-future timestamp is not — nor a few keys'
/// run: the run must hold `[ttl] future_confirm_keys` distinct keys, told apart by a
/// 64-slot sketch of their hashes (two keys sharing a slot count once, so a run may
/// need a key or two more). Each record is observed once, by its offset, however often
/// a batch boundary hands it over again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Clock {
    /// The time; 0 until a record with a usable timestamp was seen.
    now_ms: u64,
    /// The offset after the last record observed: one below it is not observed again.
    next_offset: u64,
    /// The records in a row, up to now, too far ahead to move the clock...
    ahead: u64,
    /// ... the nearest time (less the lateness) among them...
    ahead_nearest_ms: u64,
    /// ... and their keys: bit `hash % 64` of each key's [`key_hash`].
    ahead_keys: u64,
    /// Records whose timestamp did not move the clock: none (0), negative, or too
    /// far ahead of it. Counted since this process opened the partition.
    pub ignored: u64,
    /// How far the current idle spell moved an event clock on (`[ttl] idle_timeout`).
    idle_advanced_ms: u64,
}

/// A clock as committed with the state: its time, then the offset after the last
/// record it observed and the run of records too far ahead, as
/// [`PartitionStore`](super::PartitionStore) stores them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CommittedClock {
    /// See [`Clock::now_ms`].
    pub now_ms: u64,
    /// The offset after the last record observed.
    pub next_offset: u64,
    /// The records in a row too far ahead, the nearest of their times, and the
    /// sketch of their keys.
    pub ahead: (u64, u64, u64),
}

impl Clock {
    /// A clock at `now_ms` that has observed no record.
    pub fn at(now_ms: u64) -> Self {
        Clock { now_ms, ..Clock::default() }
    }

    /// The clock as committed.
    pub fn resume(committed: CommittedClock) -> Self {
        let CommittedClock { now_ms, next_offset, ahead: (ahead, ahead_nearest_ms, ahead_keys) } = committed;
        Clock { now_ms, next_offset, ahead, ahead_nearest_ms, ahead_keys, ignored: 0, idle_advanced_ms: 0 }
    }

    /// What of it is committed with the state.
    pub fn committed(&self) -> CommittedClock {
        CommittedClock {
            now_ms: self.now_ms,
            next_offset: self.next_offset,
            ahead: (self.ahead, self.ahead_nearest_ms, self.ahead_keys),
        }
    }

    /// The current time, ms since the epoch; 0 when no usable timestamp was seen.
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// Moves the clock for the record of `key` at `offset` with `timestamp_ms` (0
    /// means the source had none) as the type's docs say, unless a record at or after
    /// `offset` was observed already. A processing-time clock moves only by
    /// [`tick`](Clock::tick).
    pub fn observe(&mut self, offset: u64, key: &[u8], timestamp_ms: i64, policy: &TtlConfig) {
        if offset < self.next_offset {
            return;
        }
        self.next_offset = offset.saturating_add(1);
        self.advance(key, timestamp_ms, policy);
    }

    /// Moves the clock as a record of `key` with `timestamp_ms` would, whatever was
    /// observed.
    pub fn advance(&mut self, key: &[u8], timestamp_ms: i64, policy: &TtlConfig) {
        if policy.time == TimeDomain::Processing {
            return;
        }
        let timestamp = match u64::try_from(timestamp_ms) {
            Ok(timestamp) if timestamp > 0 => timestamp,
            _ => {
                self.ignored += 1;
                return;
            }
        };
        let at = timestamp.saturating_sub(millis(policy.lateness));
        if self.now_ms == 0 || at <= self.now_ms.saturating_add(millis(policy.future_skew)) {
            self.now_ms = self.now_ms.max(at);
            self.ahead = 0;
            return;
        }
        (self.ahead_nearest_ms, self.ahead_keys) = match self.ahead {
            0 => (at, 0),
            _ => (self.ahead_nearest_ms.min(at), self.ahead_keys),
        };
        self.ahead += 1;
        self.ahead_keys |= 1 << (key_hash(key) % 64);
        if self.ahead >= policy.future_confirm && self.ahead_keys.count_ones() >= policy.future_confirm_keys {
            self.now_ms = self.ahead_nearest_ms;
            self.ahead = 0;
        } else {
            self.ignored += 1;
        }
    }

    /// Moves a processing-time clock to the wall clock. An event-time clock moves with
    /// records, and, with `[ttl] idle_timeout`, once the partition has been idle
    /// (`idle_for`: by the wall clock, since its last records) for longer than that,
    /// by the wall clock's time past it: its clock goes on at the wall clock's pace
    /// from where the records left it, never jumping to the wall clock's time (a job
    /// catching up on old records that pauses would expire everything at once).
    pub fn tick(&mut self, policy: &TtlConfig, idle_for: Duration) {
        match (policy.time, policy.idle_timeout) {
            (TimeDomain::Processing, _) => self.now_ms = self.now_ms.max(now_ms()),
            (TimeDomain::Event, Some(timeout)) if self.now_ms > 0 => {
                let over = millis(idle_for.saturating_sub(timeout));
                if over == 0 {
                    self.idle_advanced_ms = 0;
                }
                self.now_ms = self.now_ms.saturating_add(over.saturating_sub(self.idle_advanced_ms));
                self.idle_advanced_ms = self.idle_advanced_ms.max(over);
            }
            (TimeDomain::Event, _) => {}
        }
    }

    /// When a value written now under a TTL of `ttl` expires. A clock that has not
    /// started (no usable timestamp yet) gives no expiry: event time has not begun, so
    /// nothing can be measured against it.
    pub fn expiry(&self, ttl: Option<Duration>) -> Option<u64> {
        let ttl = ttl?;
        (self.now_ms > 0).then(|| self.now_ms.saturating_add(millis(ttl)))
    }
}

/// The header byte of a value that never expires...
const NEVER: u8 = 0;
/// ... and of one followed by its expiry (u64 ms, big-endian), then the value.
const EXPIRES: u8 = 1;

/// `value` as stored: the expiry header, then the bytes.
pub fn encode_value(value: &[u8], expires_at: Option<u64>) -> Vec<u8> {
    let mut stored = Vec::with_capacity(9 + value.len());
    match expires_at {
        None => stored.push(NEVER),
        Some(at) => {
            stored.push(EXPIRES);
            stored.extend_from_slice(&at.to_be_bytes());
        }
    }
    stored.extend_from_slice(value);
    stored
}

/// A stored value read back: when it expires, and the bytes the operator wrote.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StoredValue<'a> {
    /// Ms since the epoch at (or after) which the value is gone; `None`: never.
    pub expires_at: Option<u64>,
    /// The operator's bytes.
    pub value: &'a [u8],
}

impl<'a> StoredValue<'a> {
    /// Reads the header of `stored`.
    pub fn decode(stored: &'a [u8]) -> Result<Self> {
        match stored.split_first() {
            Some((&NEVER, value)) => Ok(StoredValue { expires_at: None, value }),
            Some((&EXPIRES, rest)) if rest.len() >= 8 => {
                let (at, value) = rest.split_at(8);
                Ok(StoredValue { expires_at: Some(u64::from_be_bytes(at.try_into()?)), value })
            }
            Some((tag, _)) => bail!("its expiry header starts with {tag:#04x}, which is neither 0x00 nor 0x01"),
            None => bail!("it is empty, without the expiry header every value starts with"),
        }
    }

    /// Whether the value is still there at `clock`.
    pub fn is_live(&self, clock: u64) -> bool {
        self.expires_at.is_none_or(|at| at > clock)
    }
}

/// What the database held for an entry at the last commit, as a write of it needs to
/// know: whether the write adds an entry, and which index entry the old value had.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Prior {
    /// No value.
    Absent,
    /// A value expiring then (`None`: never).
    Stored(Option<u64>),
}

impl Prior {
    /// The prior of an entry whose stored bytes are `stored`.
    pub fn of(stored: Option<&[u8]>) -> Result<Self> {
        Ok(match stored {
            None => Prior::Absent,
            Some(stored) => Prior::Stored(StoredValue::decode(stored)?.expires_at),
        })
    }
}

/// The key of `entry`'s index entry for an expiry at `at`: the time first, so the
/// index iterates in expiry order.
pub fn index_key(at: u64, entry: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(8 + entry.len());
    key.extend_from_slice(&at.to_be_bytes());
    key.extend_from_slice(entry);
    key
}

/// The expiry of an index key that [`index_key`] made or [`decode_index_key`] checked.
pub fn index_at(key: &[u8]) -> u64 {
    u64::from_be_bytes(key[..8].try_into().expect("an index key starts with its expiry"))
}

/// The encoded entry key of an index key that [`index_key`] made or
/// [`decode_index_key`] checked.
pub fn index_entry(key: &[u8]) -> &[u8] {
    &key[8..]
}

/// The expiry and entry of an index key.
pub fn decode_index_key(key: &[u8]) -> Option<(u64, &[u8])> {
    let (at, entry) = key.split_at_checked(8)?;
    Some((u64::from_be_bytes(at.try_into().ok()?), entry))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Ttl;

    #[test]
    fn a_value_reads_back_with_its_expiry_and_a_bad_header_is_an_error() {
        for expires_at in [None, Some(0), Some(1_700_000_000_000)] {
            let stored = encode_value(b"v", expires_at);
            assert_eq!(StoredValue::decode(&stored).unwrap(), StoredValue { expires_at, value: b"v" });
        }
        assert!(StoredValue::decode(b"").is_err());
        assert!(StoredValue::decode(b"{\"a\":1}").is_err());
        assert!(StoredValue::decode(&[EXPIRES, 0, 0]).is_err());
    }

    #[test]
    fn an_entry_is_gone_at_its_expiry_not_before() {
        let value = StoredValue { expires_at: Some(1000), value: b"" };
        assert!(value.is_live(999));
        assert!(!value.is_live(1000));
        assert!(StoredValue { expires_at: None, value: b"" }.is_live(u64::MAX));
    }

    #[test]
    fn timestamps_that_are_missing_negative_or_far_ahead_do_not_move_the_clock() {
        let policy = TtlConfig { lateness: Duration::from_secs(1), ..TtlConfig::default() };
        let mut clock = Clock::default();
        clock.observe(0, b"k", 1_700_000_005_000, &policy);
        assert_eq!(clock.now_ms(), 1_700_000_004_000, "the lateness is taken off");
        clock.observe(1, b"k", 1_700_000_001_000, &policy);
        assert_eq!(clock.now_ms(), 1_700_000_004_000, "never back");
        let next_year = 1_700_000_005_000 + 365 * 86_400_000;
        for (offset, ignored) in (2..).zip([0, -5, next_year]) {
            clock.observe(offset, b"k", ignored, &policy);
        }
        assert_eq!((clock.now_ms(), clock.ignored), (1_700_000_004_000, 3));
        clock.observe(2, b"k", 1_700_000_009_000, &policy);
        assert_eq!(clock.now_ms(), 1_700_000_004_000, "a record observed already is not observed again");
    }

    /// A run of `future_confirm` records in a row far ahead of the clock moves it to the
    /// nearest of them; a record within reach between them ends the run. Nothing reads
    /// the wall clock: the same records move it the same way whenever they are replayed.
    #[test]
    fn a_run_of_far_ahead_records_moves_the_clock_and_a_lone_one_does_not() {
        let policy = TtlConfig { future_confirm: 3, future_confirm_keys: 1, ..TtlConfig::default() };
        let day = 86_400_000;
        let start = 1_000 * day;
        let mut clock = Clock::default();
        let mut offset = 0..;
        let mut observe =
            |clock: &mut Clock, timestamp: u64| clock.observe(offset.next().unwrap(), b"k", timestamp as i64, &policy);
        observe(&mut clock, start);
        for far in [start + 400 * day, start + 1, start + 300 * day, start + 2, start + 3] {
            observe(&mut clock, far);
        }
        assert_eq!(clock.now_ms(), start + 3, "lone far-ahead records between ordinary ones");
        observe(&mut clock, start + 5 * day);
        observe(&mut clock, start + 3 * day);
        assert_eq!(clock.now_ms(), start + 3, "two in a row are not yet three");
        let before_third = clock;
        observe(&mut clock, start + 4 * day);
        assert_eq!(clock.now_ms(), start + 3 * day, "the third moves it to the nearest");
        let mut resumed = Clock::resume(before_third.committed());
        resumed.observe(9, b"k", (start + 4 * day) as i64, &policy);
        assert_eq!(resumed.now_ms(), start + 3 * day, "the run is committed with the clock");
    }

    /// A run far ahead moves the clock only once it holds `future_confirm_keys`
    /// distinct keys: one key's backlog of any length does not, and the run's keys are
    /// committed with it.
    #[test]
    fn a_run_far_ahead_moves_the_clock_only_across_enough_keys() {
        let policy = TtlConfig { future_confirm: 3, future_confirm_keys: 3, ..TtlConfig::default() };
        let day = 86_400_000;
        let mut clock = Clock::default();
        clock.observe(0, b"a", day, &policy);
        for offset in 1..1_000 {
            clock.observe(offset, b"wrong-clock", 400 * day, &policy);
        }
        assert_eq!(clock.now_ms(), day as u64, "one key's backlog far ahead");
        clock.observe(1_000, b"b", 0, &policy);
        let (b, c) = (b"b".as_slice(), b"c".as_slice());
        assert_ne!(key_hash(b) % 64, key_hash(c) % 64, "keys in different slots of the sketch");
        clock.observe(1_001, b"b", 3 * day, &policy);
        let mut resumed = Clock::resume(clock.committed());
        assert_eq!(resumed.now_ms(), day as u64, "two keys are not yet three");
        resumed.observe(1_002, b"c", 2 * day, &policy);
        assert_eq!(resumed.now_ms(), 2 * day as u64, "the third key moves it to the nearest");
    }

    #[test]
    fn a_processing_time_clock_follows_the_wall_clock_whatever_the_timestamps() {
        let policy = TtlConfig { time: TimeDomain::Processing, ..TtlConfig::default() };
        let mut clock = Clock::default();
        let before = now_ms();
        clock.tick(&policy, Duration::ZERO);
        assert!(clock.now_ms() >= before);
        std::thread::sleep(Duration::from_millis(5));
        let ticked = clock.now_ms();
        clock.observe(0, b"k", 0, &policy);
        clock.observe(1, b"k", 1_700_000_000_000, &policy);
        assert_eq!((clock.now_ms(), clock.ignored), (ticked, 0), "records do not move it, nor count as ignored");
        clock.tick(&policy, Duration::ZERO);
        assert!(clock.now_ms() > ticked, "ticks move it");
        let mut event = Clock::at(1_000);
        event.tick(&TtlConfig::default(), Duration::from_secs(3600));
        assert_eq!(event.now_ms(), 1_000, "an event clock moves with records only");
    }

    /// With `[ttl] idle_timeout`, an idle event clock goes on at the wall clock's pace
    /// past the timeout, from where the records left it, each idle spell counted from
    /// its start; without a usable timestamp yet, it has nowhere to go on from.
    #[test]
    fn an_idle_event_clock_goes_on_with_the_wall_clock_past_the_idle_timeout() {
        let policy = TtlConfig { idle_timeout: Some(Duration::from_secs(10)), ..TtlConfig::default() };
        let mut clock = Clock::at(1_000_000);
        let secs = Duration::from_secs;
        clock.tick(&policy, secs(10));
        assert_eq!(clock.now_ms(), 1_000_000, "idle for no longer than the timeout: it holds");
        clock.tick(&policy, secs(12));
        clock.tick(&policy, secs(15));
        assert_eq!(clock.now_ms(), 1_005_000, "5 s past the timeout: 5 s on, each second once");
        // A record comes (the worker ticks with no idle time first), then a new spell.
        clock.tick(&policy, Duration::ZERO);
        clock.observe(0, b"k", 1_005_500, &policy);
        clock.tick(&policy, secs(11));
        assert_eq!(clock.now_ms(), 1_006_500, "the new spell counts from its own start");
        let mut unstarted = Clock::default();
        unstarted.tick(&policy, secs(60));
        assert_eq!(unstarted.now_ms(), 0);
    }

    #[test]
    fn the_most_specific_ttl_wins_and_no_clock_means_no_expiry() {
        let policy = TtlConfig {
            default: Some(Duration::from_secs(10)),
            names: [("short".to_string(), Ttl(Duration::from_secs(1)))].into(),
            ..TtlConfig::default()
        };
        assert_eq!(Clock::at(5_000).expiry(policy.ttl("short")), Some(6_000));
        assert_eq!(Clock::at(5_000).expiry(policy.ttl("other")), Some(15_000));
        assert_eq!(Clock::default().expiry(policy.ttl("other")), None);
        assert_eq!(Clock::at(5_000).expiry(TtlConfig::default().ttl("other")), None);
    }

    #[test]
    fn index_keys_sort_by_expiry() {
        let (early, late) = (index_key(9, b"zz"), index_key(10, b"aa"));
        assert!(early < late);
        assert_eq!(decode_index_key(&late), Some((10, &b"aa"[..])));
    }
}
