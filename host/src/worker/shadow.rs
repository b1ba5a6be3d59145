//! A partition's shadow: the version a shadow deploy runs beside the live one, on the
//! same records, in the same batch, under its own sandbox limits.
//!
//! The shadow reads the committed state plus its own writes, which its
//! [detached transaction](crate::state::Transaction::detached) stages and never commits:
//! after each commit of the live version it starts over from the committed state, so it
//! never drifts more than one commit from the live state, and its writes take at most
//! what a commit's do (`[state] commit_dirty_mib`). Its outputs are compared with the
//! live version's per record — and per group of expiries or timers before a record — and
//! never sent; before each commit the entries the two staged differently are counted.
//! Whatever the shadow does — trap, spin, pass a limit, fail to start — costs the live
//! path at most a share of its time: each batch the shadow gets [`TIME_SHARE_PERCENT`]
//! of the time the live version took on it (time it did not use carried over, up to
//! [`TIME_CARRIED`]), in one call under the live batch's bounds (a call in progress
//! finishes: at most one `call_timeout_ms` more). The records it had no time for are
//! skipped and counted, and so is every record until the live version's next commit,
//! after which it starts over in step. Its errors stop the shadow on this partition,
//! never the worker, and a shadow that fails on [`FAILURES_IN_A_ROW`] records — or
//! groups of expiries or timers — in a row is stopped so it cannot keep spending the
//! partition's time.
//!
//! This module owns running and comparing; what it found goes to the partition's
//! [`ShadowStats`], and where the shadow comes from is the host's [`Shadows`].

use super::events::SHADOW_STOPPED;
use crate::config::NullKeys;
use crate::lines::{Compare, differing_fields};
use crate::lock;
use crate::operator::{Expiration, Operator, Outcome, Processed, Shadows};
use crate::probes::thread_cpu;
use crate::record::{Cause, Output, SourceRecord};
use crate::state::Clock;
use crate::stats::{ShadowSample, ShadowStats};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Records in a row the shadow may fail on (where the live version did not) before it
/// is stopped on the partition; groups of expiries or timers likewise.
pub const FAILURES_IN_A_ROW: u32 = 10;
/// The shadow's time on a batch, at most, as a share of the live version's time on it.
pub const TIME_SHARE_PERCENT: u32 = 400;
/// The most time the shadow did not use that it may spend on later batches.
pub const TIME_CARRIED: Duration = Duration::from_millis(100);

/// [`Shadow::tally`]'s kinds: records, and groups of expiries or timers.
const RECORDS: usize = 0;
const GROUPS: usize = 1;

/// One partition's shadow, as its worker runs it.
#[derive(Default)]
pub(super) struct Shadow {
    /// Its instance over its detached transaction; `None` while none runs here.
    instance: Option<Box<dyn Operator>>,
    /// The generation of the host's shadow this partition followed last.
    generation: Option<u64>,
    /// What each side emitted for expiries and timers not yet compared (with the key
    /// of the first entry), by the offset of the record they came before and their
    /// cause: compared once both sides processed that record.
    pending: BTreeMap<(u64, Cause), PendingGroup>,
    /// Records, and groups of expiries or timers, in a row it failed on where the live
    /// version did not.
    failures_in_a_row: [u32; 2],
    /// The time it may spend on the next batch, before the live version's share.
    credit: Duration,
    /// Whether it ran out of time since the last commit: it skips every record until
    /// the next, when it starts over in step.
    skipping: bool,
    /// Whether it started over before the live version's commit (its writes passed the
    /// commit's bound): the writes it staged since are not comparable at that commit.
    reset_early: bool,
}

/// The key of a group of expiries or timers (its first entry's), and what the live
/// version and the shadow gave for it.
type PendingGroup = (Vec<u8>, [Vec<Emitted>; 2]);

/// What an input (or an expiry or timer) gave, as two versions' are compared: an
/// output, or a dead letter's kind and reason.
#[derive(Debug, Clone, PartialEq)]
enum Emitted {
    Output(Output),
    DeadLetter(&'static str, String),
}

impl Emitted {
    /// What `outcome` gave.
    fn of(outcome: &Outcome) -> Vec<Emitted> {
        let (kind, reason) = match outcome {
            Outcome::Emitted(outputs) => return outputs.iter().cloned().map(Emitted::Output).collect(),
            Outcome::Rejected(reason) => ("rejected", reason.as_str()),
            Outcome::Late(reason) => ("late", reason.as_str()),
            Outcome::Trapped { reason, .. } => ("trapped", reason.as_str()),
            Outcome::NullKey => ("null-key", ""),
        };
        vec![Emitted::DeadLetter(kind, reason.to_string())]
    }

    /// As a sample shows it: an output's value, or the dead letter.
    fn shown(&self) -> String {
        match self {
            Emitted::Output(output) => String::from_utf8_lossy(&output.value).into_owned(),
            Emitted::DeadLetter(kind, reason) => format!("dead letter ({kind}): {reason}"),
        }
    }
}

impl Shadow {
    /// Whether a shadow runs on this partition.
    pub(super) fn is_running(&self) -> bool {
        self.instance.is_some()
    }

    /// Whether the host's shadow started or stopped since this partition looked.
    pub(super) fn changed(&self, shadows: &dyn Shadows) -> bool {
        self.generation != Some(shadows.generation())
    }

    /// Starts or stops this partition's shadow as the host's says: called when the live
    /// version has just committed, so the shadow starts from the state it committed.
    pub(super) fn follow(&mut self, shadows: &dyn Shadows, live: &mut dyn Operator, stats: &ShadowStats) {
        self.generation = Some(shadows.generation());
        let had = self.instance.take().is_some();
        self.pending.clear();
        (self.failures_in_a_row, self.reset_early, self.skipping) = ([0; 2], false, false);
        let partition = live.state().store().partition();
        match live.state().detached().and_then(|txn| shadows.instantiate(partition, txn)) {
            Ok(Some(instance)) => {
                tracing::info!(partition, "shadow {} runs beside {}", instance.version(), live.version());
                stats.reset(Some(instance.version().to_string()));
                self.instance = Some(instance);
            }
            Ok(None) => {
                if had {
                    tracing::info!(partition, "the shadow stopped");
                }
                *lock(&stats.version) = None;
            }
            Err(e) => {
                let version = shadows.version();
                stats.reset(version.clone());
                let version = version.unwrap_or_default();
                self.stop(partition, format!("{version} could not start: {e:#}"), stats);
            }
        }
    }

    /// Runs the shadow over `records`, the records the live version (`operator`) just
    /// processed from `clock` with `live`'s outcomes and expirations in `live_took` (of
    /// which `live_cpu` CPU time), and compares what each gave, for the share of that
    /// time the shadow has; the records past it are skipped. A failure of the shadow
    /// stops it here.
    pub(super) fn process(
        &mut self,
        operator: &mut dyn Operator,
        (records, live, clock): (&[SourceRecord], &Processed, Clock),
        (live_took, live_cpu): (Duration, Duration),
        null_keys: NullKeys,
        stats: &ShadowStats,
    ) {
        let Some(until) = self.allowance(live_took, records.len(), stats) else { return };
        let Some(instance) = self.instance.as_mut() else { return };
        let (started, began) = (thread_cpu(), Instant::now());
        instance.state().follow_clock(clock);
        instance.bound_next_batch(until);
        let processed = match super::process_batch(&mut **instance, records, null_keys) {
            Ok(processed) => processed,
            Err(e) => {
                let reason = format!("failed at offset {}: {e:#}", records[0].offset);
                return self.stop(records[0].partition, reason, stats);
            }
        };
        self.credit = self.credit.saturating_sub(began.elapsed());
        let done = processed.outcomes.len();
        stats.records.fetch_add(done as u64, Ordering::Relaxed);
        stats.live_cpu_ns.fetch_add(crate::micros(live_cpu) * 1000, Ordering::Relaxed);
        stats.shadow_cpu_ns.fetch_add(crate::micros(thread_cpu().saturating_sub(started)) * 1000, Ordering::Relaxed);
        self.add_expirations(&live.expirations, &processed.expirations);
        for ((record, live), shadow) in records.iter().zip(&live.outcomes).zip(&processed.outcomes) {
            if let Some(reason) = self.settle_before(record.offset, stats) {
                return self.stop(record.partition, reason, stats);
            }
            let fails = matches!(shadow, Outcome::Trapped { .. }) && !matches!(live, Outcome::Trapped { .. });
            let (offset, key) = (record.offset, &record.key);
            compare(offset, None, key, &Emitted::of(live), &Emitted::of(shadow), stats);
            if let Some(reason) = self.tally(RECORDS, fails, stats) {
                return self.stop(record.partition, format!("{reason} (the last at offset {offset})"), stats);
            }
        }
        if done < records.len() {
            self.skip(records.len() - done, stats);
        }
        // Its writes since the last commit take at most what a commit's may (`[state]
        // commit_dirty_mib`): past that it starts over from the committed state at once.
        if self.instance.as_mut().is_some_and(|instance| instance.state().dirty_full()) {
            stats.early_resets.fetch_add(1, Ordering::Relaxed);
            self.start_over(operator, stats);
            self.reset_early = true;
        }
    }

    /// When the shadow's call on a batch of `records` the live version took `live_took`
    /// on must end; `None` (the records counted as skipped) while it skips.
    fn allowance(&mut self, live_took: Duration, records: usize, stats: &ShadowStats) -> Option<Instant> {
        if self.skipping {
            stats.skipped.fetch_add(records as u64, Ordering::Relaxed);
            return None;
        }
        let share = live_took.saturating_mul(TIME_SHARE_PERCENT) / 100;
        self.credit = (self.credit + share).min(TIME_CARRIED.max(share));
        Some(Instant::now() + self.credit)
    }

    /// The shadow ran out of time with `records` left: they and every record until the
    /// next commit are skipped, counted; what it staged is not comparable at that commit.
    fn skip(&mut self, records: usize, stats: &ShadowStats) {
        stats.skipped.fetch_add(records as u64, Ordering::Relaxed);
        (self.skipping, self.reset_early) = (true, true);
    }

    /// Counts a record (`RECORDS`) or a group of expiries or timers (`GROUPS`) the shadow
    /// failed on (`fails`) or not; why it must stop, if it must.
    fn tally(&mut self, kind: usize, fails: bool, stats: &ShadowStats) -> Option<String> {
        if fails {
            stats.shadow_failed.fetch_add(1, Ordering::Relaxed);
        }
        self.failures_in_a_row[kind] = if fails { self.failures_in_a_row[kind] + 1 } else { 0 };
        let failed = stats.shadow_failed.load(Ordering::Relaxed);
        let what = ["records", "groups of expiries or timers"][kind];
        if self.failures_in_a_row[kind] >= FAILURES_IN_A_ROW {
            Some(format!("it failed on {FAILURES_IN_A_ROW} {what} in a row where the live version did not"))
        } else if failed >= u64::from(FAILURES_IN_A_ROW) && 2 * failed > stats.compared.load(Ordering::Relaxed) {
            // Failing every other record never makes a row, but spends as much.
            Some(format!(
                "it failed on {failed} records and groups, more than half of those compared, where the live version \
                 did not"
            ))
        } else {
            None
        }
    }

    /// Expires what the live version's `clock` made due while the partition is idle,
    /// beside the live version's `live` expirations (before the record at `offset`), and
    /// compares them: both sides have expired what was due.
    pub(super) fn expire(
        &mut self,
        offset: u64,
        (clock, live_took): (Clock, Duration),
        live: &[Expiration],
        stats: &ShadowStats,
    ) {
        let Some(until) = self.allowance(live_took, 0, stats) else { return };
        let Some(instance) = self.instance.as_mut() else { return };
        let partition = instance.state().store().partition();
        instance.state().follow_clock(clock);
        instance.bound_next_batch(until);
        let began = Instant::now();
        let expired = instance.expire(offset);
        self.credit = self.credit.saturating_sub(began.elapsed());
        match expired {
            Ok(expirations) => {
                self.add_expirations(live, &expirations);
                if let Some(reason) = self.settle_before(offset, stats) {
                    self.stop(partition, reason, stats);
                }
            }
            Err(e) => self.stop(partition, format!("expiring before offset {offset}: {e:#}"), stats),
        }
    }

    /// The entries the shadow staged otherwise than the live version since the last
    /// commit, which is about to commit the live version's; `None` when not comparable.
    pub(super) fn differing_writes(&mut self, live: &mut dyn Operator) -> Option<u64> {
        let instance = self.instance.as_mut().filter(|_| !self.reset_early)?;
        Some(live.state().differing_writes(instance.state()))
    }

    /// After the live version committed, its writes `differing` from the shadow's
    /// (see [`differing_writes`](Shadow::differing_writes)): counts them, and the shadow
    /// starts over from the committed state. Expiry groups still open are dropped
    /// uncounted: the commit took what the live version expired of them.
    pub(super) fn after_commit(&mut self, live: &mut dyn Operator, differing: Option<u64>, stats: &ShadowStats) {
        stats.differing_writes.fetch_add(differing.unwrap_or(0), Ordering::Relaxed);
        (self.reset_early, self.skipping) = (false, false);
        self.pending.clear();
        self.start_over(live, stats);
    }

    /// The shadow starts over from the state `live` committed.
    fn start_over(&mut self, live: &mut dyn Operator, stats: &ShadowStats) {
        let Some(instance) = self.instance.as_mut() else { return };
        match live.state().detached() {
            Ok(txn) => *instance.state() = txn,
            Err(e) => {
                let partition = live.state().store().partition();
                self.stop(partition, format!("its state could not follow the commit: {e:#}"), stats);
            }
        }
    }

    /// Adds the live version's and the shadow's `expirations` to what waits to be
    /// compared.
    fn add_expirations(&mut self, live: &[Expiration], shadow: &[Expiration]) {
        for (side, expirations) in [live, shadow].into_iter().enumerate() {
            for expiration in expirations {
                let cause = if expiration.entry.timer().is_some() { Cause::Timer } else { Cause::Expiry };
                let (_, sides) = self
                    .pending
                    .entry((expiration.offset, cause))
                    .or_insert_with(|| (expiration.entry.key.clone(), Default::default()));
                sides[side].extend(Emitted::of(&expiration.outcome));
            }
        }
    }

    /// Compares the expiry and timer groups before the record at `offset`: both sides
    /// have processed them. Returns why the shadow must stop, if its failures there say
    /// it must.
    fn settle_before(&mut self, offset: u64, stats: &ShadowStats) -> Option<String> {
        while let Some(entry) = self.pending.first_entry().filter(|entry| entry.key().0 <= offset) {
            let ((at, cause), (key, [live, shadow])) = entry.remove_entry();
            let trapped = |emitted: &[Emitted]| emitted.iter().any(|e| matches!(e, Emitted::DeadLetter("trapped", _)));
            let fails = trapped(&shadow) && !trapped(&live);
            compare(at, cause.name(), &key, &live, &shadow, stats);
            if let Some(reason) = self.tally(GROUPS, fails, stats) {
                return Some(format!("{reason} (the last before offset {at})"));
            }
        }
        None
    }

    /// Stops the shadow on this partition for `reason`; the live version goes on.
    fn stop(&mut self, partition: u32, reason: String, stats: &ShadowStats) {
        let version = self.instance.as_ref().map_or(String::new(), |instance| format!(" ({})", instance.version()));
        tracing::warn!(partition, "{SHADOW_STOPPED}{version}: {reason}");
        self.instance = None;
        self.pending.clear();
        *lock(&stats.stopped) = Some(reason);
    }
}

/// Counts how what the live version and the shadow gave for one origin compare, and
/// samples a difference.
fn compare(
    offset: u64,
    cause: Option<&'static str>,
    key: &[u8],
    live: &[Emitted],
    shadow: &[Emitted],
    stats: &ShadowStats,
) {
    stats.compared.fetch_add(1, Ordering::Relaxed);
    let counter = match (live.is_empty(), shadow.is_empty()) {
        _ if live == shadow => {
            stats.equal.fetch_add(1, Ordering::Relaxed);
            return;
        }
        (false, true) => &stats.only_live,
        (true, false) => &stats.only_shadow,
        _ => &stats.different,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    stats.sample(|| ShadowSample {
        offset,
        cause: cause.map(str::to_string),
        key: String::from_utf8_lossy(key).into_owned(),
        live: live.iter().map(Emitted::shown).collect(),
        shadow: shadow.iter().map(Emitted::shown).collect(),
        fields: differing_values(live, shadow),
    });
}

/// The fields in which the values of `live`'s and `shadow`'s outputs differ, pair by
/// pair (`value.count`, `[1].value.count` past the first pair), as JSON; empty unless
/// both are as many outputs whose values are JSON.
fn differing_values(live: &[Emitted], shadow: &[Emitted]) -> serde_json::Value {
    let json = |emitted: &Emitted| match emitted {
        Emitted::Output(output) => serde_json::from_slice::<serde_json::Value>(&output.value).ok(),
        Emitted::DeadLetter(..) => None,
    };
    let mut fields = Vec::new();
    if live.len() == shadow.len() {
        for (i, (l, s)) in live.iter().zip(shadow).enumerate() {
            let (Some(l), Some(s)) = (json(l), json(s)) else { return serde_json::Value::Array(Vec::new()) };
            for mut field in differing_fields(&l, &s, Compare::Exact) {
                let value = if i == 0 { "value".to_string() } else { format!("[{i}].value") };
                field.path = match field.path.is_empty() {
                    true => value,
                    false => format!("{value}.{}", field.path),
                };
                fields.push(field);
            }
        }
    }
    serde_json::to_value(fields).expect("field differences serialize")
}

#[cfg(test)]
mod tests {
    //! The shadow's decisions on their own: its share of the live time, when it stops,
    //! how two versions' outcomes compare. A shadow through real workers and the binary
    //! is `tests/all/shadow.rs`'s.

    use super::*;

    fn output(value: &str) -> Emitted {
        Emitted::Output(Output { key: b"k".to_vec(), value: value.as_bytes().to_vec(), topic: None })
    }

    /// A batch gives the shadow four times the live version's time on it, and what it
    /// did not use carries over up to [`TIME_CARRIED`] (or one batch's share, if more);
    /// while it skips, it gets none and the records count as skipped.
    #[test]
    fn the_shadow_gets_a_share_of_the_live_time_and_carries_little_over() {
        let (mut shadow, stats) = (Shadow::default(), ShadowStats::default());
        let until = |shadow: &mut Shadow, live_ms| {
            let now = Instant::now();
            let until = shadow.allowance(Duration::from_millis(live_ms), 10, &stats).expect("not skipping");
            until.saturating_duration_since(now)
        };
        let near = |got: Duration, ms: u64| got.abs_diff(Duration::from_millis(ms)) < Duration::from_millis(5);
        assert!(near(until(&mut shadow, 10), 40), "four times the live 10 ms");
        assert!(near(until(&mut shadow, 10), 80), "unused time carries over");
        assert!(near(until(&mut shadow, 10), 100), "up to TIME_CARRIED");
        assert!(near(until(&mut shadow, 50), 200), "a share above it is its own bound");
        shadow.skip(7, &stats);
        assert_eq!(shadow.allowance(Duration::from_millis(10), 3, &stats), None);
        assert_eq!(stats.skipped.load(Ordering::Relaxed), 10, "the records left, and those after");
    }

    /// The shadow stops after [`FAILURES_IN_A_ROW`] failures of one kind in a row — a
    /// success resets the row — or when it failed on more than half of what was
    /// compared, which never makes a row.
    #[test]
    fn the_shadow_stops_on_failures_in_a_row_or_on_most_of_its_records() {
        let stats = ShadowStats::default();
        let mut shadow = Shadow::default();
        for _ in 1..FAILURES_IN_A_ROW {
            stats.compared.fetch_add(100, Ordering::Relaxed);
            assert_eq!(shadow.tally(GROUPS, true, &stats), None);
        }
        assert_eq!(shadow.tally(RECORDS, true, &stats), None, "records keep their own row");
        let stop = shadow.tally(GROUPS, true, &stats).expect("ten groups in a row");
        assert!(stop.contains("groups of expiries or timers in a row"), "{stop}");

        let stats = ShadowStats::default();
        let mut shadow = Shadow::default();
        let mut stopped = None;
        for n in 0..40 {
            stats.compared.fetch_add(1, Ordering::Relaxed);
            stopped = stopped.or(shadow.tally(RECORDS, n % 3 != 0, &stats));
        }
        let stop = stopped.expect("two records in three failed");
        assert!(stop.contains("more than half of those compared"), "{stop}");
    }

    /// Equal outcomes count as equal; one side alone, or values that differ, count apart,
    /// with a sample naming the fields that differ.
    #[test]
    fn outcomes_compare_by_what_each_side_emitted() {
        let stats = ShadowStats::default();
        let live = [output(r#"{"count":2,"max":5}"#)];
        compare(1, None, b"k", &live, &live, &stats);
        compare(2, None, b"k", &live, &[], &stats);
        compare(3, Some("timer"), b"k", &[], &live, &stats);
        compare(4, None, b"k", &live, &[output(r#"{"count":3,"max":5}"#)], &stats);
        let rejected = Emitted::DeadLetter("rejected", "no".to_string());
        compare(5, None, b"k", &live, &[rejected], &stats);
        let count = |counter: &std::sync::atomic::AtomicU64| counter.load(Ordering::Relaxed);
        assert_eq!(count(&stats.compared), 5);
        assert_eq!([&stats.equal, &stats.only_live, &stats.only_shadow, &stats.different].map(count), [1, 1, 1, 2]);
        let samples = lock(&stats.samples);
        let fields = &samples.iter().find(|s| s.offset == 4).expect("sampled").fields;
        assert_eq!(fields[0]["path"], "value.count", "{fields}");
        let dead = samples.iter().find(|s| s.offset == 5).expect("sampled");
        assert_eq!(dead.shadow, ["dead letter (rejected): no"]);
        assert_eq!(dead.fields, serde_json::json!([]), "no fields between an output and a dead letter");
    }
}
