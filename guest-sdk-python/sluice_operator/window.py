"""Event-time windows of a key's records — tumbling, hopping and session windows aligned
to the Unix epoch — closed on the host's timers: the Rust SDK's `window` module in Python,
storing the same state under the same names and setting the same timers, so a Python
build and a Rust build of one operator read each other's windows (and a hot swap between
them carries open windows on).

A `WindowSpec` says how records are grouped, how long after its end a window still takes
records (`grace`), when results are emitted (`emit`: on close, or on every update) and
what the grace does to them (`late`: wait for it, or close at the end and correct). In
`process`, `spec.add(state, record.timestamp_ms, fold, new)` folds the record into each of
its windows (`new()` makes an empty aggregate, `fold(aggregate)` updates one in place and
returns nothing, or returns the new one); in `fired`, `spec.fired(state, timer)` closes the
window the timer names. Both return the windows to emit (`Window`: `start_ms`, `end_ms`,
`aggregate`). A record no window takes any more raises `Late`. Session windows merge their
aggregates with `merge(into, other)` (returning the merged one), given to `session`.

A key's windows of a spec are one state entry named after the spec; each window's timer is
named `<spec>/<start>`.
"""

import copy

from . import Late

ON_CLOSE, ON_UPDATE = "on-close", "on-update"
WAIT, CORRECT = "wait", "correct"


class Window:
    """A window `[start_ms, end_ms)` with its aggregate."""

    __slots__ = ("start_ms", "end_ms", "aggregate")

    def __init__(self, start_ms, end_ms, aggregate):
        self.start_ms, self.end_ms, self.aggregate = start_ms, end_ms, aggregate

    def stored(self):
        return {"start_ms": self.start_ms, "end_ms": self.end_ms, "aggregate": self.aggregate}

    @classmethod
    def read(cls, stored):
        return cls(stored["start_ms"], stored["end_ms"], stored["aggregate"])


class WindowSpec:
    """How one kind of window of an operator is kept (see the module)."""

    def __init__(self, name, kind, size_ms, advance_ms=None, merge=None):
        # A session's size is its gap.
        self.name, self.kind, self.size_ms, self.advance, self.merge = name, kind, size_ms, advance_ms, merge
        self.grace_ms, self.emit, self.late = 0, ON_CLOSE, WAIT

    @classmethod
    def tumbling(cls, name, size_ms):
        return cls(name, "tumbling", size_ms, size_ms)

    @classmethod
    def hopping(cls, name, size_ms, advance_ms):
        return cls(name, "hopping", size_ms, advance_ms)

    @classmethod
    def session(cls, name, gap_ms, merge):
        return cls(name, "session", gap_ms, merge=merge)

    def _with(self, **changes):
        spec = copy.copy(self)
        spec.__dict__.update(changes)
        return spec

    def grace(self, grace_ms):
        return self._with(grace_ms=grace_ms)

    def emitting(self, emit):
        return self._with(emit=emit)

    def with_late(self, late):
        return self._with(late=late)

    def add(self, state, timestamp_ms, fold, new):
        """Folds the record at `timestamp_ms` into each of the key's windows that hold it;
        returns the windows to emit now. Raises `Late` for a record no window takes."""
        if timestamp_ms <= 0:
            raise Late(f"window {self.name}: a record without an event time ({timestamp_ms})")
        now = state.now()
        if self.kind == "session":
            return self._add_to_session(state, timestamp_ms, self.size_ms, now, fold, new)
        return self._add_to_fixed(state, timestamp_ms, now, fold, new)

    def fired(self, state, timer):
        """Closes or deletes the window `timer` names, when it is one of this spec's;
        returns it to emit when it closed on close, nothing otherwise."""
        start_ms = self._window_of(timer.name)
        if start_ms is None:
            return []
        now = state.now()
        if self.kind != "session":
            windows = [Window.read(w) for w in state.get(self.name) or []]
            at = next((i for i, w in enumerate(windows) if w.start_ms == start_ms), None)
            if at is None:
                return []
            emitted = self._closing(windows[at], timer.at_ms)
            end_ms = windows[at].end_ms
            if self._kept_after(end_ms, timer.at_ms, now):
                state.set_timer(timer.name, self._ends(end_ms))
            else:
                del windows[at]
                self._put_all(state, [w.stored() for w in windows], not windows)
            return emitted
        sessions = state.get(self.name) or {"open": [], "closed": []}
        open_ = [Window.read(w) for w in sessions["open"]]
        closed = [tuple(c) for c in sessions["closed"]]
        at = next((i for i, w in enumerate(open_) if w.start_ms == start_ms), None)
        if at is None:
            # A closed session's bounds, kept while a record could touch them: now gone.
            closed = [c for c in closed if c[0] != start_ms]
            self._put_sessions(state, open_, closed)
            return []
        emitted = self._closing(open_[at], timer.at_ms)
        end_ms = open_[at].end_ms
        if self._kept_after(end_ms, timer.at_ms, now):
            state.set_timer(timer.name, self._ends(end_ms))
            return emitted
        del open_[at]
        forgotten_at = self._ends(end_ms + self.size_ms)
        if forgotten_at > now:
            closed.append((start_ms, end_ms))
            state.set_timer(timer.name, forgotten_at)
        self._put_sessions(state, open_, closed)
        return emitted

    def _add_to_fixed(self, state, ts, now, fold, new):
        size = max(self.size_ms, 1)
        advance = min(max(self.advance, 1), size)
        last = ts // advance * advance
        starts = [last - i * advance for i in range(-(-size // advance)) if last - i * advance >= 0]
        windows = [Window.read(w) for w in state.get(self.name) or []]
        # A window past its grace is one whose `fired` failed: dropped here.
        windows = [w for w in windows if self._ends(w.end_ms) > now]
        emit, taken = [], False
        for start_ms in starts:
            if ts >= start_ms + size:
                continue
            end_ms = start_ms + size
            closed = self._takes(end_ms, now)
            if closed is None:
                continue
            taken = True
            at = next((i for i, w in enumerate(windows) if w.start_ms == start_ms), None)
            if at is None:
                state.set_timer(self._timer_name(start_ms), self._first_timer(end_ms, closed))
                windows.append(Window(start_ms, end_ms, new()))
                at = len(windows) - 1
            folded = fold(windows[at].aggregate)
            if folded is not None:
                windows[at].aggregate = folded
            if closed or self.emit == ON_UPDATE:
                emit.append(Window(start_ms, end_ms, windows[at].aggregate))
        if not taken:
            raise self._too_late(ts, now)
        self._put_all(state, [w.stored() for w in windows], False)
        return emit

    def _add_to_session(self, state, ts, gap_ms, now, fold, new):
        sessions = state.get(self.name) or {"open": [], "closed": []}
        open_ = [Window.read(w) for w in sessions["open"] if self._ends(w["end_ms"]) > now]
        closed = [tuple(c) for c in sessions["closed"] if self._ends(c[1] + gap_ms) > now]
        start_ms, end_ms = ts, ts + max(gap_ms, 1)
        if any(start <= end_ms and ts <= end for start, end in closed):
            raise self._too_late(ts, now)
        open_.sort(key=lambda w: w.start_ms)
        merging = [w for w in open_ if w.start_ms <= end_ms and start_ms <= w.end_ms]
        kept = [w for w in open_ if not (w.start_ms <= end_ms and start_ms <= w.end_ms)]
        for window in merging:
            start_ms, end_ms = min(start_ms, window.start_ms), max(end_ms, window.end_ms)
        closed_now = self._takes(end_ms, now)
        if closed_now is None:
            raise self._too_late(ts, now)
        aggregate = new()
        for window in merging:
            aggregate = self.merge(aggregate, window.aggregate)
            if window.start_ms != start_ms:
                state.cancel_timer(self._timer_name(window.start_ms))
        folded = fold(aggregate)
        if folded is not None:
            aggregate = folded
        state.set_timer(self._timer_name(start_ms), self._first_timer(end_ms, closed_now))
        merged = Window(start_ms, end_ms, aggregate)
        emit = [merged] if closed_now or self.emit == ON_UPDATE else []
        self._put_sessions(state, kept + [merged], closed)
        return emit

    def _put_sessions(self, state, open_, closed):
        stored = {"open": [w.stored() for w in open_], "closed": [list(c) for c in closed]}
        self._put_all(state, stored, not open_ and not closed)

    def _put_all(self, state, value, none):
        if none:
            state.delete(self.name)
        else:
            state.put(self.name, value)

    def _closing(self, window, at_ms):
        return [window] if self.emit == ON_CLOSE and at_ms == self._close_at(window.end_ms) else []

    def _kept_after(self, end_ms, at_ms, now):
        ends = self._ends(end_ms)
        return at_ms < ends and now < ends

    def _ends(self, end_ms):
        return end_ms + self.grace_ms

    def _takes(self, end_ms, now):
        if now >= self._ends(end_ms):
            return None
        return now >= self._close_at(end_ms)

    def _close_at(self, end_ms):
        return self._ends(end_ms) if self.late == WAIT else end_ms

    def _first_timer(self, end_ms, closed):
        return self._ends(end_ms) if closed or self.emit == ON_UPDATE else self._close_at(end_ms)

    def _timer_name(self, start_ms):
        return f"{self.name}/{start_ms}"

    def _window_of(self, name):
        prefix = self.name + "/"
        if not name.startswith(prefix) or not name[len(prefix):].isdigit():
            return None
        return int(name[len(prefix):])

    def _too_late(self, ts, now):
        return Late(
            f"window {self.name}: the record at {ts} is late: the clock is at {now}, past the end and grace "
            f"({self.grace_ms} ms) of every window it belongs to"
        )
