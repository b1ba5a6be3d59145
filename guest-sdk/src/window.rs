//! Event-time windows of a key's records: tumbling, hopping and session windows,
//! aligned to the Unix epoch, each with an aggregate the operator writes, closed on the
//! host's timers. Pure guest code over [`State`] and timers: a key's windows of a spec,
//! with their aggregates, are one state entry of the key (so a record costs one read and
//! one write per spec, however many windows hold it), and each window's close and purge
//! are the key's timers, so windows
//! are exactly-once and survive restarts, restores, handovers and hot swaps as state and
//! timers do.
//!
//! A [`WindowSpec`] says how records are grouped ([`Windows`]), how long after its end a
//! window still takes records (`grace_ms`), when results are emitted ([`Emit`]) and what
//! the grace does to them ([`Late`]). A record no window takes any more is *late*: an
//! error the host sends to the dead letters as `late`. In `process`, [`WindowSpec::add`]
//! folds the record into each of its windows; in `fired`, [`WindowSpec::fired`] closes
//! the window a timer names. Both return the windows to emit, which the operator turns
//! into outputs. The clock is the partition's ([`State::now`]): event time less the
//! host's `[ttl] lateness`, the watermark.
//!
//! ```
//! use serde::{Deserialize, Serialize};
//! use sluice_guest::native::MemoryState;
//! use sluice_guest::window::{Aggregate, Window, WindowSpec};
//! use sluice_guest::{Operator, Output, Record, Result, State, Timer};
//!
//! /// Records per key and minute.
//! #[derive(Default, Clone, Serialize, Deserialize)]
//! struct Count(u64);
//! impl Aggregate for Count {}
//!
//! const MINUTES: WindowSpec = WindowSpec::tumbling("minute", 60_000);
//!
//! struct PerMinute;
//! impl Operator for PerMinute {
//!     fn process(record: Record, state: &State<'_>) -> Result<Vec<Output>> {
//!         MINUTES.add(state, record.timestamp_ms, |count: &mut Count| count.0 += 1)?;
//!         Ok(Vec::new())
//!     }
//!
//!     fn fired(timer: Timer, state: &State<'_>) -> Result<Vec<Output>> {
//!         let closed: Vec<Window<Count>> = MINUTES.fired(state, &timer)?;
//!         closed.iter().map(|w| Output::json(timer.key.clone(), &(w.start_ms, w.aggregate.0))).collect()
//!     }
//! }
//!
//! let state = MemoryState::default();
//! for ts in [1_000, 59_999, 60_000] {
//!     state.fire_until::<PerMinute>(ts as u64).unwrap();
//!     state.process::<PerMinute>(Record::new("veh-1", "{}", ts)).unwrap();
//! }
//! assert_eq!(state.fire_until::<PerMinute>(120_000).unwrap().len(), 1);
//! ```

use super::{Error, Result, State, Timer};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// How a key's records are grouped into windows of event time, in ms. Every window is
/// `[start, end)`; tumbling and hopping windows start at multiples of their advance
/// since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Windows {
    /// Back to back windows of `size_ms`: each record in exactly one.
    Tumbling { size_ms: u64 },
    /// Windows of `size_ms` starting every `advance_ms` (less than the size): each
    /// record in `size_ms / advance_ms` of them.
    Hopping { size_ms: u64, advance_ms: u64 },
    /// A window per burst of activity: a record opens `[ts, ts + gap_ms)`, and windows
    /// that overlap or touch merge (their aggregates with [`Aggregate::merge`]), so a
    /// session ends `gap_ms` after its last record.
    Session { gap_ms: u64 },
}

/// When a window's result is emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Emit {
    /// When the window closes (see [`Late`]).
    OnClose,
    /// At every record added to it, and not when it closes.
    OnUpdate,
}

/// What a window's grace (`grace_ms`, the records it takes after its end) does to its
/// result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Late {
    /// The window closes at its end + grace, and its result, with the records late
    /// within the grace, is emitted then, once (Kafka Streams' grace, emitting final
    /// results).
    Wait,
    /// The window closes at its end, its result emitted then; each record late within
    /// the grace is added and the corrected result emitted at once (Flink's allowed
    /// lateness).
    Correct,
}

/// A window with its aggregate, as [`WindowSpec::add`] and [`WindowSpec::fired`] return
/// it for the operator to emit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Window<A> {
    /// Its start, ms since the epoch: the first instant it holds.
    pub start_ms: u64,
    /// Its end: the first instant it does not hold.
    pub end_ms: u64,
    /// What the operator folded into it.
    pub aggregate: A,
}

/// A key's session windows of one spec: one state entry.
#[derive(Serialize, Deserialize)]
#[serde(bound = "A: Aggregate")]
struct Sessions<A> {
    /// The sessions open, or closed and correcting within their grace.
    open: Vec<Window<A>>,
    /// The bounds of closed sessions, while a record could still touch one: such a
    /// record is late, since the session it would join was emitted.
    closed: Vec<(u64, u64)>,
}

impl<A> Default for Sessions<A> {
    fn default() -> Self {
        Sessions { open: Vec::new(), closed: Vec::new() }
    }
}

/// What a window folds its records into: any state value. Session windows that merge
/// fold one aggregate into the other with [`merge`](Aggregate::merge).
pub trait Aggregate: Default + Clone + Serialize + DeserializeOwned {
    /// Folds `other`, the aggregate of a session window merging into this one, in. The
    /// default keeps this one's; tumbling and hopping windows never merge.
    fn merge(&mut self, other: Self) {
        let _ = other;
    }
}

/// How one kind of window of an operator is kept: see the [module](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowSpec {
    /// Names the spec's state entry (`name`) and its windows' timers (`name/start`): an
    /// operator with several specs gives each its own, and uses neither form itself.
    pub name: &'static str,
    pub windows: Windows,
    /// How long after its end a window still takes records, ms: its state is deleted
    /// then.
    pub grace_ms: u64,
    /// When results are emitted.
    pub emit: Emit,
    /// What the grace does to results.
    pub late: Late,
}

impl WindowSpec {
    /// Tumbling windows of `size_ms`, no grace, emitted on close (that is, at their end).
    pub const fn tumbling(name: &'static str, size_ms: u64) -> Self {
        Self::of(name, Windows::Tumbling { size_ms })
    }

    /// Hopping windows of `size_ms` every `advance_ms`, no grace, emitted on close.
    pub const fn hopping(name: &'static str, size_ms: u64, advance_ms: u64) -> Self {
        Self::of(name, Windows::Hopping { size_ms, advance_ms })
    }

    /// Session windows closing `gap_ms` after their last record, no grace, emitted on
    /// close.
    pub const fn session(name: &'static str, gap_ms: u64) -> Self {
        Self::of(name, Windows::Session { gap_ms })
    }

    const fn of(name: &'static str, windows: Windows) -> Self {
        WindowSpec { name, windows, grace_ms: 0, emit: Emit::OnClose, late: Late::Wait }
    }

    /// The same, taking records `grace_ms` after a window's end.
    pub const fn grace(self, grace_ms: u64) -> Self {
        WindowSpec { grace_ms, ..self }
    }

    /// The same, emitting as `emit` says.
    pub const fn emit(self, emit: Emit) -> Self {
        WindowSpec { emit, ..self }
    }

    /// The same, its grace doing as `late` says.
    pub const fn late(self, late: Late) -> Self {
        WindowSpec { late, ..self }
    }

    /// Folds the record at `timestamp_ms` into each window of the key that holds it:
    /// `add` updates the window's aggregate (a new window's starts as the default).
    /// Returns the windows to emit now: each window added to with [`Emit::OnUpdate`],
    /// each closed one corrected within its grace with [`Late::Correct`]. A record that
    /// no window takes — the clock passed the end and grace of each — is late: the error
    /// ([`Error::is_late`]) sends it to the dead letters as `late`, and changes nothing.
    /// So is a record without an event time.
    pub fn add<A: Aggregate>(
        &self,
        state: &State<'_>,
        timestamp_ms: i64,
        add: impl FnMut(&mut A),
    ) -> Result<Vec<Window<A>>> {
        let ts = u64::try_from(timestamp_ms).ok().filter(|ts| *ts > 0).ok_or_else(|| {
            Error::late(format!("window {}: a record without an event time ({timestamp_ms})", self.name))
        })?;
        let now = state.now();
        match self.windows {
            Windows::Session { gap_ms } => self.add_to_session(state, ts, gap_ms, now, add),
            Windows::Tumbling { size_ms } => self.add_to_fixed(state, ts, size_ms, now, add),
            Windows::Hopping { advance_ms, .. } => self.add_to_fixed(state, ts, advance_ms, now, add),
        }
    }

    /// Closes or deletes the window `timer` names, when it is one of this spec's:
    /// returns it to emit when it closed with [`Emit::OnClose`], nothing otherwise (a
    /// timer of another spec or of the operator's own included).
    pub fn fired<A: Aggregate>(&self, state: &State<'_>, timer: &Timer) -> Result<Vec<Window<A>>> {
        let Some(start_ms) = self.window_of(&timer.name) else { return Ok(Vec::new()) };
        let now = state.now();
        let Windows::Session { gap_ms } = self.windows else {
            let mut windows: Vec<Window<A>> = state.get(self.name)?.unwrap_or_default();
            let Some(at) = windows.iter().position(|w| w.start_ms == start_ms) else { return Ok(Vec::new()) };
            let emitted = self.closing(&windows[at], timer.at_ms);
            let end_ms = windows[at].end_ms;
            if self.kept_after(end_ms, timer.at_ms, now) {
                state.set_timer(&timer.name, self.ends(end_ms));
            } else {
                windows.remove(at);
                self.put_all(state, &windows, windows.is_empty())?;
            }
            return Ok(emitted.into_iter().collect());
        };
        let mut sessions: Sessions<A> = state.get(self.name)?.unwrap_or_default();
        let Some(at) = sessions.open.iter().position(|w| w.start_ms == start_ms) else {
            // A closed session's bounds, kept while a record could touch them: now gone.
            sessions.closed.retain(|(start, _)| *start != start_ms);
            self.put_sessions(state, &sessions)?;
            return Ok(Vec::new());
        };
        let emitted = self.closing(&sessions.open[at], timer.at_ms);
        let end_ms = sessions.open[at].end_ms;
        if self.kept_after(end_ms, timer.at_ms, now) {
            // The sessions stay as they are.
            state.set_timer(&timer.name, self.ends(end_ms));
            return Ok(emitted.into_iter().collect());
        }
        sessions.open.remove(at);
        // A record touching it from now on would have joined a session already emitted:
        // it is late, until it could be late anyway.
        let forgotten_at = self.ends(end_ms.saturating_add(gap_ms));
        if forgotten_at > now {
            sessions.closed.push((start_ms, end_ms));
            state.set_timer(&timer.name, forgotten_at);
        }
        self.put_sessions(state, &sessions)?;
        Ok(emitted.into_iter().collect())
    }

    /// `add` for tumbling and hopping windows: those of `size_ms` starting at multiples
    /// of `advance_ms` that hold `ts`. A key's windows of the spec are one state entry
    /// (one read and one write a record, however many windows hold it), each window
    /// with a timer named after its start.
    fn add_to_fixed<A: Aggregate>(
        &self,
        state: &State<'_>,
        ts: u64,
        advance_ms: u64,
        now: u64,
        mut add: impl FnMut(&mut A),
    ) -> Result<Vec<Window<A>>> {
        let size_ms = self.size_ms();
        let advance_ms = advance_ms.clamp(1, size_ms);
        let last = ts / advance_ms * advance_ms;
        let starts = (0..size_ms.div_ceil(advance_ms)).filter_map(|i| last.checked_sub(i * advance_ms));
        let mut windows: Vec<Window<A>> = state.get(self.name)?.unwrap_or_default();
        // Every timer due has fired before a record: a window past its grace is one
        // whose `fired` failed, its timer gone. Dropped here, its state does not stay.
        windows.retain(|w| self.ends(w.end_ms) > now);
        let mut emit = Vec::new();
        let mut taken = false;
        for start_ms in starts.filter(|start| ts < start.saturating_add(size_ms)) {
            let end_ms = start_ms.saturating_add(size_ms);
            let Some(closed) = self.takes(end_ms, now) else { continue };
            taken = true;
            let at = windows.iter().position(|w| w.start_ms == start_ms).unwrap_or_else(|| {
                state.set_timer(&self.timer_name(start_ms), self.first_timer(end_ms, closed));
                windows.push(Window { start_ms, end_ms, aggregate: A::default() });
                windows.len() - 1
            });
            add(&mut windows[at].aggregate);
            if closed || self.emit == Emit::OnUpdate {
                emit.push(windows[at].clone());
            }
        }
        if !taken {
            return Err(self.too_late(ts, now));
        }
        self.put_all(state, &windows, false)?;
        Ok(emit)
    }

    /// `add` for session windows: the key's sessions are one state entry, each open one
    /// with a timer named after its start.
    fn add_to_session<A: Aggregate>(
        &self,
        state: &State<'_>,
        ts: u64,
        gap_ms: u64,
        now: u64,
        mut add: impl FnMut(&mut A),
    ) -> Result<Vec<Window<A>>> {
        let Sessions { mut open, mut closed } = state.get(self.name)?.unwrap_or_else(Sessions::<A>::default);
        // As for fixed windows: what is past its grace had a `fired` that failed.
        open.retain(|w| self.ends(w.end_ms) > now);
        closed.retain(|&(_, end)| self.ends(end.saturating_add(gap_ms)) > now);
        let (mut start_ms, mut end_ms) = (ts, ts.saturating_add(gap_ms.max(1)));
        if closed.iter().any(|&(start, end)| start <= end_ms && ts <= end) {
            return Err(self.too_late(ts, now));
        }
        // The sessions this record's window overlaps or touches merge with it (and may
        // bring others in reach: sessions never overlap one another, so one pass over
        // them in start order finds all).
        open.sort_by_key(|w| w.start_ms);
        let (merging, kept): (Vec<_>, Vec<_>) =
            open.into_iter().partition(|w| w.start_ms <= end_ms && start_ms <= w.end_ms);
        for window in &merging {
            (start_ms, end_ms) = (start_ms.min(window.start_ms), end_ms.max(window.end_ms));
        }
        let Some(closed_now) = self.takes(end_ms, now) else { return Err(self.too_late(ts, now)) };
        let mut aggregate = A::default();
        for window in merging {
            aggregate.merge(window.aggregate);
            if window.start_ms != start_ms {
                state.cancel_timer(&self.timer_name(window.start_ms));
            }
        }
        add(&mut aggregate);
        state.set_timer(&self.timer_name(start_ms), self.first_timer(end_ms, closed_now));
        let merged = Window { start_ms, end_ms, aggregate };
        let emit = (closed_now || self.emit == Emit::OnUpdate).then(|| merged.clone());
        let mut sessions = Sessions { open: kept, closed };
        sessions.open.push(merged);
        self.put_sessions(state, &sessions)?;
        Ok(emit.into_iter().collect())
    }

    /// Stores a key's `sessions`, or deletes them when there are none.
    fn put_sessions<A: Aggregate>(&self, state: &State<'_>, sessions: &Sessions<A>) -> Result<()> {
        self.put_all(state, sessions, sessions.open.is_empty() && sessions.closed.is_empty())
    }

    /// Stores `value`, a key's windows of this spec, as its one state entry, or deletes
    /// the entry when there are none (`none`).
    fn put_all<T: Serialize>(&self, state: &State<'_>, value: &T, none: bool) -> Result<()> {
        if none {
            state.delete(self.name);
            return Ok(());
        }
        state.put(self.name, value)
    }

    /// The windows' size: their span for tumbling and hopping windows.
    fn size_ms(&self) -> u64 {
        match self.windows {
            Windows::Tumbling { size_ms } | Windows::Hopping { size_ms, .. } => size_ms.max(1),
            Windows::Session { gap_ms } => gap_ms.max(1),
        }
    }

    /// `window` to emit, when the timer at `at_ms` closes it.
    fn closing<A: Aggregate>(&self, window: &Window<A>, at_ms: u64) -> Option<Window<A>> {
        (self.emit == Emit::OnClose && at_ms == self.close_at(window.end_ms)).then(|| window.clone())
    }

    /// Whether the window ending at `end_ms`, whose timer fired at `at_ms` with the clock
    /// at `now`, stays: it closed and takes corrections until its grace ends (unless the
    /// clock jumped past that too).
    fn kept_after(&self, end_ms: u64, at_ms: u64, now: u64) -> bool {
        let ends = self.ends(end_ms);
        at_ms < ends && now < ends
    }

    /// When a window ending at `end_ms` ends its grace: its state is deleted then.
    fn ends(&self, end_ms: u64) -> u64 {
        end_ms.saturating_add(self.grace_ms)
    }

    /// Whether a window ending at `end_ms` takes a record when the clock is `now`:
    /// `Some(false)` open, `Some(true)` closed and corrected within its grace, `None`
    /// late for it.
    fn takes(&self, end_ms: u64, now: u64) -> Option<bool> {
        if now >= self.ends(end_ms) {
            return None;
        }
        Some(now >= self.close_at(end_ms))
    }

    /// When a window ending at `end_ms` closes (its result emitted, with
    /// [`Emit::OnClose`]).
    fn close_at(&self, end_ms: u64) -> u64 {
        match self.late {
            Late::Wait => self.ends(end_ms),
            Late::Correct => end_ms,
        }
    }

    /// The first timer of a window ending at `end_ms`: its close, or, for one emitted at
    /// every update or already closed, the end of its grace.
    fn first_timer(&self, end_ms: u64, closed: bool) -> u64 {
        if closed || self.emit == Emit::OnUpdate { self.ends(end_ms) } else { self.close_at(end_ms) }
    }

    /// The timer of this spec's window starting at `start_ms`.
    fn timer_name(&self, start_ms: u64) -> String {
        format!("{}/{start_ms}", self.name)
    }

    /// The start of this spec's window `name` (a timer's) names, if it is one.
    fn window_of(&self, name: &str) -> Option<u64> {
        name.strip_prefix(self.name)?.strip_prefix('/')?.parse().ok()
    }

    fn too_late(&self, ts: u64, now: u64) -> Error {
        Error::late(format!(
            "window {}: the record at {ts} is late: the clock is at {now}, past the end and grace ({} ms) of every \
             window it belongs to",
            self.name, self.grace_ms
        ))
    }
}

#[cfg(test)]
mod tests {
    //! Each kind of window against a reference written the obvious way over the same
    //! out-of-order input: which windows a record lands in, which records are late, and
    //! what is emitted when.
    use super::*;
    use crate::native::MemoryState;
    use crate::{Operator, Output, Record};
    use std::collections::BTreeMap;

    /// Count and sum of the values of a window's records.
    #[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
    struct Sum {
        count: u64,
        sum: u64,
    }

    impl Aggregate for Sum {
        fn merge(&mut self, other: Self) {
            (self.count, self.sum) = (self.count + other.count, self.sum + other.sum);
        }
    }

    /// An emitted window: key, start, end, count, sum.
    type Emitted = (String, u64, u64, u64, u64);

    /// What a run emitted, in order, and which of its records were late.
    type Ran = (Vec<Emitted>, Vec<usize>);

    /// Records: key and event time, in arrival order.
    type Input = [(String, i64)];

    /// An operator summing each record's value (its `ts` modulo 100) per window of `SPEC`.
    struct Summing<const SPEC: usize>;

    const SPECS: [WindowSpec; 5] = [
        WindowSpec::tumbling("t", 1_000).grace(300),
        WindowSpec::hopping("h", 1_000, 250).grace(300),
        WindowSpec::tumbling("c", 1_000).grace(300).late(Late::Correct),
        WindowSpec::session("s", 400).grace(300),
        WindowSpec::tumbling("u", 1_000).grace(300).emit(Emit::OnUpdate),
    ];

    impl<const SPEC: usize> Operator for Summing<SPEC> {
        fn process(record: Record, state: &State<'_>) -> Result<Vec<Output>> {
            let value = record.timestamp_ms as u64 % 100;
            let windows = SPECS[SPEC].add(state, record.timestamp_ms, |sum: &mut Sum| {
                (sum.count, sum.sum) = (sum.count + 1, sum.sum + value)
            })?;
            outputs(&record.key, windows)
        }

        fn fired(timer: Timer, state: &State<'_>) -> Result<Vec<Output>> {
            outputs(&timer.key, SPECS[SPEC].fired(state, &timer)?)
        }
    }

    fn outputs(key: &[u8], windows: Vec<Window<Sum>>) -> Result<Vec<Output>> {
        windows.into_iter().map(|w| Output::json(key.to_vec(), &w)).collect()
    }

    /// Records of three keys in bursts of 200 (10 ms apart, then a second's pause), mostly
    /// in order, a few up to `spread_ms` behind the newest, and a few 2 s behind (late for
    /// every window): key and event time, in arrival order. Times are multiples of 10 ms,
    /// as window bounds are, so records and the clock land on them.
    fn input(spread_ms: u64) -> Vec<(String, i64)> {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |bound: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % bound
        };
        (0..3_000)
            .map(|i| {
                let newest = 10_000 + i * 10 + i / 200 * 1_000;
                let behind = match next(100) {
                    0..=79 => 0,
                    80..=97 => next(spread_ms / 10) * 10,
                    _ => 2_000,
                };
                (format!("k{}", next(3)), (newest - behind as i64))
            })
            .collect()
    }

    /// Runs `input` through `Summing<SPEC>` as the host would (the clock at the largest
    /// time seen; the timers due fire before each record), then the clock to the end of
    /// time: what was emitted, in order, and the records found late (their places in
    /// `input`).
    fn run<const SPEC: usize>(input: &Input) -> Ran {
        let state = MemoryState::default();
        let (mut emitted, mut late, mut clock) = (Vec::new(), Vec::new(), 0u64);
        let mut collect = |outputs: Vec<Output>| {
            for output in outputs {
                let w: Window<Sum> = serde_json::from_slice(&output.value).unwrap();
                let key = String::from_utf8(output.key).unwrap();
                emitted.push((key, w.start_ms, w.end_ms, w.aggregate.count, w.aggregate.sum));
            }
        };
        for (at, (key, ts)) in input.iter().enumerate() {
            clock = clock.max(*ts as u64);
            collect(state.fire_until::<Summing<SPEC>>(clock).unwrap());
            match state.process::<Summing<SPEC>>(Record::new(key.as_str(), "", *ts)) {
                Ok(outputs) => collect(outputs),
                Err(e) if e.is_late() => late.push(at),
                Err(e) => panic!("{e}"),
            }
            // Each window kept has one timer: each open session and each closed one kept
            // (a session merged into another leaves none behind), each fixed window.
            let (open, closed) = kept(&state, &SPECS[SPEC], key);
            assert_eq!(state.timers(key).len(), open.len() + closed, "timers of {key} after {ts}");
        }
        collect(state.fire_until::<Summing<SPEC>>(u64::MAX / 2).unwrap());
        (emitted, late)
    }

    /// What `key`'s entry of `spec` keeps: the starts of its windows (open, or closed
    /// and correcting), in order, and the closed sessions' bounds kept.
    fn kept(state: &MemoryState, spec: &WindowSpec, key: &str) -> (Vec<u64>, usize) {
        let (mut starts, closed): (Vec<u64>, usize) = match spec.windows {
            Windows::Session { .. } => {
                let sessions: Sessions<Sum> = state.get(key, spec.name).unwrap().unwrap_or_default();
                (sessions.open.iter().map(|w| w.start_ms).collect(), sessions.closed.len())
            }
            _ => {
                let windows: Vec<Window<Sum>> = state.get(key, spec.name).unwrap().unwrap_or_default();
                (windows.iter().map(|w| w.start_ms).collect(), 0)
            }
        };
        starts.sort();
        (starts, closed)
    }

    /// The windows of `size` every `advance` that hold `ts`: their starts.
    fn starts(ts: u64, size: u64, advance: u64) -> impl Iterator<Item = u64> {
        (0..=ts / advance).map(move |k| k * advance).filter(move |start| *start <= ts && ts < start + size)
    }

    /// The reference for fixed windows: each record goes to every window holding it whose
    /// end + grace the clock (its own time included) has not reached; emitted per `late`
    /// and `emit`. Returns the emissions, sorted, and the late records.
    fn reference_fixed(input: &Input, spec: &WindowSpec) -> Ran {
        let (size, advance) = match spec.windows {
            Windows::Tumbling { size_ms } => (size_ms, size_ms),
            Windows::Hopping { size_ms, advance_ms } => (size_ms, advance_ms),
            Windows::Session { .. } => unreachable!(),
        };
        let mut windows: BTreeMap<(String, u64), (u64, u64)> = BTreeMap::new();
        let (mut emitted, mut late, mut clock) = (Vec::new(), Vec::new(), 0u64);
        for (at, (key, ts)) in input.iter().enumerate() {
            let ts = *ts as u64;
            clock = clock.max(ts);
            let mut taken = false;
            for start in starts(ts, size, advance).filter(|start| clock < start + size + spec.grace_ms) {
                taken = true;
                let sum = windows.entry((key.clone(), start)).or_default();
                (sum.0, sum.1) = (sum.0 + 1, sum.1 + ts % 100);
                let closed = spec.late == Late::Correct && clock >= start + size;
                if spec.emit == Emit::OnUpdate || closed {
                    emitted.push((key.clone(), start, start + size, sum.0, sum.1));
                }
            }
            if !taken {
                late.push(at);
            }
        }
        if spec.emit == Emit::OnClose {
            // Emitted once at close with what it took before: for `Wait` everything; for
            // `Correct`, the records that came before the clock reached its end.
            for (key, start) in windows.keys() {
                let before_close = input.iter().scan(0u64, |clock, (k, ts)| {
                    *clock = (*clock).max(*ts as u64);
                    Some((k, *ts as u64, *clock))
                });
                let close = match spec.late {
                    Late::Wait => start + size + spec.grace_ms,
                    Late::Correct => start + size,
                };
                let taken: Vec<u64> = before_close
                    .filter(|(k, ts, clock)| {
                        *k == key && starts(*ts, size, advance).any(|s| s == *start) && *clock < close
                    })
                    .map(|(_, ts, _)| ts)
                    .collect();
                if !taken.is_empty() {
                    emitted.push((
                        key.clone(),
                        *start,
                        start + size,
                        taken.len() as u64,
                        taken.iter().map(|ts| ts % 100).sum(),
                    ));
                }
            }
        }
        emitted.sort();
        (emitted, late)
    }

    fn sorted(mut emitted: Vec<Emitted>) -> Vec<Emitted> {
        emitted.sort();
        emitted
    }

    #[test]
    fn tumbling_hopping_corrected_and_updating_windows_equal_the_reference() {
        // Records up to 2 s behind: on both sides of every window's end and grace.
        let input = input(2_000);
        let runs = [(0, run::<0>(&input)), (1, run::<1>(&input)), (2, run::<2>(&input)), (4, run::<4>(&input))];
        for (spec, (emitted, late)) in runs {
            let (expected, expected_late) = reference_fixed(&input, &SPECS[spec]);
            assert!(!expected_late.is_empty() && expected.len() > 100, "the input exercises {:?}", SPECS[spec]);
            assert_eq!(late, expected_late, "late records of {:?}", SPECS[spec]);
            assert_eq!(sorted(emitted), expected, "emitted by {:?}", SPECS[spec]);
        }
    }

    #[test]
    fn windows_close_and_take_records_exactly_at_their_bounds() {
        // Tumbling by the second, grace 300 ms: window [0, 1000) closes at 1000
        // (corrected) or 1300 (waiting), and is late from 1300.
        let k = |ts: i64| ("k".to_string(), ts);
        let input = [k(500), k(1_000), k(900), k(1_299), k(1_300), k(999)];
        let (corrected, late) = run::<2>(&input);
        let first = |emitted: &[Emitted]| emitted.iter().filter(|e| e.1 == 0).map(|e| e.3).collect::<Vec<_>>();
        // Corrected: it closes at 1000 with one record, 900 comes within the grace and
        // corrects it (1299 is the next window's), and 999 comes when the clock is at its
        // end + grace: late. Waiting: it closes at 1300 with two.
        assert_eq!(first(&corrected), [1, 2]);
        assert_eq!(late, [5]);
        let (waited, late) = run::<0>(&input);
        assert_eq!(first(&waited), [2]);
        assert_eq!(late, [5]);
    }

    /// Fails `fired` for the timers named in `FAILING`, as a bug or a limit would: the
    /// host discards its writes, and the timer is gone.
    struct FailingToFire<const SPEC: usize>;

    const FAILING: [&str; 2] = ["h/1000", "s/1200"];

    impl<const SPEC: usize> Operator for FailingToFire<SPEC> {
        fn process(record: Record, state: &State<'_>) -> Result<Vec<Output>> {
            Summing::<SPEC>::process(record, state)
        }

        fn fired(timer: Timer, state: &State<'_>) -> Result<Vec<Output>> {
            if FAILING.contains(&timer.name.as_str()) {
                return Err(Error::msg("failing"));
            }
            Summing::<SPEC>::fired(timer, state)
        }
    }

    /// A window whose `fired` failed stays in its key's entry, without a timer, only
    /// until the key's next record, which drops it: window state does not outlive its
    /// grace by more than that.
    #[test]
    fn a_window_whose_fired_failed_is_dropped_at_the_keys_next_record() {
        fn starts_after<const SPEC: usize>(first: i64, failing_at: u64, next: i64) -> (Vec<u64>, Vec<u64>) {
            let state = MemoryState::default();
            let starts = |state: &MemoryState| kept(state, &SPECS[SPEC], "k").0;
            state.fire_until::<FailingToFire<SPEC>>(first as u64).unwrap();
            state.process::<FailingToFire<SPEC>>(Record::new("k", "", first)).unwrap();
            assert!(state.fire_until::<FailingToFire<SPEC>>(failing_at).is_err(), "the failing timer fired");
            let stale = starts(&state);
            state.fire_until::<FailingToFire<SPEC>>(next as u64).unwrap();
            state.process::<FailingToFire<SPEC>>(Record::new("k", "", next)).unwrap();
            (stale, starts(&state))
        }
        // Hopping windows of 1 s every 250 ms, grace 300: the record at 1200 is in the
        // windows from 250 to 1000, the last ending its grace at 2300; the next record,
        // at 2000, is in those from 1250 to 2000.
        let (stale, after) = starts_after::<1>(1_200, 2_300, 2_000);
        assert_eq!((stale, after), (vec![1_000], vec![1_250, 1_500, 1_750, 2_000]));
        // Sessions with a gap of 400, grace 300: [1200, 1600) closes at 1900; a record
        // at 1600 would have joined it.
        let (stale, after) = starts_after::<3>(1_200, 1_900, 1_600);
        assert_eq!((stale, after), (vec![1_200], vec![1_600]));
    }

    #[test]
    fn a_record_that_would_join_a_closed_session_is_late() {
        // Gap 400, grace 300: a's session [1000, 1400) closes at 1700, when b's record
        // brings the clock there; a record of a at 1001 would join it: late, not a second
        // session overlapping the first. One at 1750 starts a new session.
        let input =
            [("a".to_string(), 1_000), ("b".to_string(), 1_700), ("a".to_string(), 1_001), ("a".to_string(), 1_750)];
        let (emitted, late) = run::<3>(&input);
        assert_eq!(late, [2]);
        let sessions = |key: &str| emitted.iter().filter(|e| e.0 == key).map(|e| (e.1, e.2, e.3)).collect::<Vec<_>>();
        assert_eq!(sessions("a"), [(1_000, 1_400, 1), (1_750, 2_150, 1)]);
        assert_eq!(sessions("b"), [(1_700, 2_100, 1)]);
    }

    #[test]
    fn session_windows_equal_the_gaps_between_the_records_they_took() {
        // Records at most 250 ms behind but the late ones: less than the gap, so a record
        // never falls between a session that closed and the records it would have joined,
        // and the reference can be the gaps alone.
        let input = input(250);
        let (emitted, late) = run::<3>(&input);
        let Windows::Session { gap_ms } = SPECS[3].windows else { unreachable!() };
        // What was not late, per key in time order, split where the next record is more
        // than the gap after the last: each run is a session of `[first, last + gap)`.
        let mut taken: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
        for (at, (key, ts)) in input.iter().enumerate() {
            if !late.contains(&at) {
                taken.entry(key).or_default().push(*ts as u64);
            }
        }
        let mut expected = Vec::new();
        for (key, mut times) in taken {
            times.sort();
            let mut session: Vec<u64> = Vec::new();
            for ts in times {
                if session.last().is_some_and(|last| ts > last + gap_ms) {
                    expected.push(session_of(key, &session, gap_ms));
                    session.clear();
                }
                session.push(ts);
            }
            expected.push(session_of(key, &session, gap_ms));
        }
        expected.sort();
        // The late records are those 2 s behind: the sessions they would join closed
        // with their grace.
        assert!(
            !late.is_empty()
                && late.iter().all(|at| input[..*at].iter().any(|(_, newest)| *newest > input[*at].1 + 1_900))
        );
        assert_eq!(sorted(emitted), expected);
    }

    fn session_of(key: &str, times: &[u64], gap_ms: u64) -> Emitted {
        let (first, last) = (times[0], times[times.len() - 1]);
        (key.to_string(), first, last + gap_ms, times.len() as u64, times.iter().map(|ts| ts % 100).sum())
    }
}
