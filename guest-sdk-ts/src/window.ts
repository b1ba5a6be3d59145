/**
 * Event-time windows of a key's records — tumbling, hopping and session windows aligned
 * to the Unix epoch — closed on the host's timers: the Rust SDK's `window` module in
 * TypeScript, as the Python SDK's is, storing the same state under the same names and
 * setting the same timers, so a TypeScript, a Python and a Rust build of one operator
 * read each other's windows (and a hot swap between them carries open windows on).
 *
 * A {@link WindowSpec} says how records are grouped, how long after its end a window
 * still takes records (`grace`), when results are emitted (`emitting`: on close, or on
 * every update) and what the grace does to them (`withLate`: wait for it, or close at the
 * end and correct); `withFloats` names the aggregate's fields that are floats, as `put`
 * takes them. In `process`, `spec.add(state, record.timestampMs, fold, create)` folds the
 * record into each of its windows (`create()` makes an empty aggregate, `fold(aggregate)`
 * updates one in place, or returns the new one); in `fired`, `spec.fired(state, timer)`
 * closes the window the timer names. Both return the windows to emit. A record no window
 * takes any more throws {@link Late}. Session windows merge their aggregates with the
 * `merge(into, other)` given to `session` (returning the merged one).
 *
 * A key's windows of a spec are one state entry named after the spec; each window's
 * timer is named `<spec>/<start>`.
 */

import { Late, State, Timer } from "./index.js";
import { floatSet } from "./json.js";

/** When a window's result is emitted. */
export type Emit = "on-close" | "on-update";
/** What a window's grace does to its result. */
export type LateMode = "wait" | "correct";

/** A window `[startMs, endMs)` with its aggregate. */
export interface Window<A> {
  startMs: number;
  endMs: number;
  aggregate: A;
}

/** A window as stored, in the Rust SDK's field names. */
interface Stored<A> {
  start_ms: number;
  end_ms: number;
  aggregate: A;
}

/** A key's session windows of one spec, as stored. */
interface Sessions<A> {
  open: Stored<A>[];
  closed: [number, number][];
}

type Kind = "tumbling" | "hopping" | "session";

/** How one kind of window of an operator is kept (see the module). */
export class WindowSpec<A> {
  private constructor(
    readonly name: string,
    private readonly kind: Kind,
    /** The windows' size; a session's gap. */
    private readonly sizeMs: number,
    /** How far apart windows start (none for sessions). */
    private readonly advanceMs: number,
    private readonly merge?: (into: A, other: A) => A,
    readonly graceMs = 0,
    readonly emit: Emit = "on-close",
    readonly late: LateMode = "wait",
    private readonly floats: ReadonlySet<string> = floatSet(),
  ) {}

  /** Back to back windows of `sizeMs`. */
  static tumbling<A>(name: string, sizeMs: number): WindowSpec<A> {
    return new WindowSpec<A>(name, "tumbling", sizeMs, sizeMs);
  }

  /** Windows of `sizeMs` starting every `advanceMs`. */
  static hopping<A>(name: string, sizeMs: number, advanceMs: number): WindowSpec<A> {
    return new WindowSpec<A>(name, "hopping", sizeMs, advanceMs);
  }

  /** A window per burst of activity, closing `gapMs` after its last record. */
  static session<A>(name: string, gapMs: number, merge: (into: A, other: A) => A): WindowSpec<A> {
    return new WindowSpec<A>(name, "session", gapMs, 0, merge);
  }

  private with(changes: { graceMs?: number; emit?: Emit; late?: LateMode; floats?: ReadonlySet<string> }): WindowSpec<A> {
    const { graceMs = this.graceMs, emit = this.emit, late = this.late, floats = this.floats } = changes;
    return new WindowSpec<A>(this.name, this.kind, this.sizeMs, this.advanceMs, this.merge, graceMs, emit, late, floats);
  }

  /** The same, taking records `graceMs` after a window's end. */
  grace(graceMs: number): WindowSpec<A> {
    return this.with({ graceMs });
  }

  /** The same, emitting as `emit` says. */
  emitting(emit: Emit): WindowSpec<A> {
    return this.with({ emit });
  }

  /** The same, its grace doing as `late` says. */
  withLate(late: LateMode): WindowSpec<A> {
    return this.with({ late });
  }

  /** The same, the aggregate's fields `floats` stored as floats (a `Set` is kept as it
   * is, so one made once costs nothing per record). */
  withFloats(floats: Iterable<string>): WindowSpec<A> {
    return this.with({ floats: floatSet(floats) });
  }

  /** Folds the record at `timestampMs` into each of the key's windows that hold it;
   * returns the windows to emit now. Throws {@link Late} for a record no window takes. */
  add(state: State, timestampMs: number, fold: (aggregate: A) => A | void, create: () => A): Window<A>[] {
    if (!Number.isSafeInteger(timestampMs)) {
      throw new TypeError(`window ${this.name}: the event time ${JSON.stringify(timestampMs)} is not a whole number`);
    }
    if (timestampMs <= 0) {
      throw new Late(`window ${this.name}: a record without an event time (${timestampMs})`);
    }
    const now = state.now();
    if (this.kind === "session") return this.addToSession(state, timestampMs, now, fold, create);
    return this.addToFixed(state, timestampMs, now, fold, create);
  }

  /** Closes or deletes the window `timer` names, when it is one of this spec's; returns
   * it to emit when it closed on close, nothing otherwise. */
  fired(state: State, timer: Timer): Window<A>[] {
    const startMs = this.windowOf(timer.name);
    if (startMs === undefined) return [];
    const now = state.now();
    if (this.kind !== "session") {
      const windows = (state.get<Stored<A>[]>(this.name) ?? []).map(read);
      const at = windows.findIndex((w) => w.startMs === startMs);
      if (at < 0) return [];
      const emitted = this.closing(windows[at], timer.atMs);
      const endMs = windows[at].endMs;
      if (this.keptAfter(endMs, timer.atMs, now)) {
        state.setTimer(timer.name, this.ends(endMs));
      } else {
        windows.splice(at, 1);
        this.putAll(state, windows.map(stored), windows.length === 0);
      }
      return emitted;
    }
    const sessions = state.get<Sessions<A>>(this.name) ?? { open: [], closed: [] };
    const open = sessions.open.map(read);
    let closed = sessions.closed;
    const at = open.findIndex((w) => w.startMs === startMs);
    if (at < 0) {
      // A closed session's bounds, kept while a record could touch them: now gone.
      closed = closed.filter(([start]) => start !== startMs);
      this.putSessions(state, open, closed);
      return [];
    }
    const emitted = this.closing(open[at], timer.atMs);
    const endMs = open[at].endMs;
    if (this.keptAfter(endMs, timer.atMs, now)) {
      state.setTimer(timer.name, this.ends(endMs));
      return emitted;
    }
    open.splice(at, 1);
    const forgottenAt = this.ends(endMs + this.sizeMs);
    if (forgottenAt > now) {
      closed.push([startMs, endMs]);
      state.setTimer(timer.name, forgottenAt);
    }
    this.putSessions(state, open, closed);
    return emitted;
  }

  private addToFixed(state: State, ts: number, now: number, fold: (a: A) => A | void, create: () => A): Window<A>[] {
    const size = Math.max(this.sizeMs, 1);
    const advance = Math.min(Math.max(this.advanceMs, 1), size);
    const last = Math.floor(ts / advance) * advance;
    const starts: number[] = [];
    for (let i = 0; i < Math.ceil(size / advance); i++) {
      if (last - i * advance >= 0) starts.push(last - i * advance);
    }
    // A window past its grace is one whose `fired` failed: dropped here.
    const windows = (state.get<Stored<A>[]>(this.name) ?? []).map(read).filter((w) => this.ends(w.endMs) > now);
    const emit: Window<A>[] = [];
    let taken = false;
    for (const startMs of starts) {
      if (ts >= startMs + size) continue;
      const endMs = startMs + size;
      const closed = this.takes(endMs, now);
      if (closed === undefined) continue;
      taken = true;
      let at = windows.findIndex((w) => w.startMs === startMs);
      if (at < 0) {
        state.setTimer(this.timerName(startMs), this.firstTimer(endMs, closed));
        at = windows.push({ startMs, endMs, aggregate: create() }) - 1;
      }
      const folded = fold(windows[at].aggregate);
      if (folded !== undefined) windows[at].aggregate = folded;
      if (closed || this.emit === "on-update") emit.push({ ...windows[at] });
    }
    if (!taken) throw this.tooLate(ts, now);
    this.putAll(state, windows.map(stored), false);
    return emit;
  }

  private addToSession(state: State, ts: number, now: number, fold: (a: A) => A | void, create: () => A): Window<A>[] {
    const gap = this.sizeMs;
    const sessions = state.get<Sessions<A>>(this.name) ?? { open: [], closed: [] };
    const open = sessions.open.map(read).filter((w) => this.ends(w.endMs) > now);
    const closed = sessions.closed.filter(([, end]) => this.ends(end + gap) > now);
    let [startMs, endMs] = [ts, ts + Math.max(gap, 1)];
    if (closed.some(([start, end]) => start <= endMs && ts <= end)) throw this.tooLate(ts, now);
    open.sort((a, b) => a.startMs - b.startMs);
    const touches = (w: Window<A>) => w.startMs <= endMs && startMs <= w.endMs;
    const merging = open.filter(touches);
    const kept = open.filter((w) => !touches(w));
    for (const window of merging) {
      [startMs, endMs] = [Math.min(startMs, window.startMs), Math.max(endMs, window.endMs)];
    }
    const closedNow = this.takes(endMs, now);
    if (closedNow === undefined) throw this.tooLate(ts, now);
    let aggregate = create();
    for (const window of merging) {
      aggregate = this.merge!(aggregate, window.aggregate);
      if (window.startMs !== startMs) state.cancelTimer(this.timerName(window.startMs));
    }
    const folded = fold(aggregate);
    if (folded !== undefined) aggregate = folded;
    state.setTimer(this.timerName(startMs), this.firstTimer(endMs, closedNow));
    const merged = { startMs, endMs, aggregate };
    const emit = closedNow || this.emit === "on-update" ? [merged] : [];
    this.putSessions(state, [...kept, merged], closed);
    return emit;
  }

  private putSessions(state: State, open: Window<A>[], closed: [number, number][]): void {
    this.putAll(state, { open: open.map(stored), closed }, open.length === 0 && closed.length === 0);
  }

  private putAll(state: State, value: unknown, none: boolean): void {
    if (none) {
      state.delete(this.name);
    } else {
      state.put(this.name, value, { floats: this.floats });
    }
  }

  private closing(window: Window<A>, atMs: number): Window<A>[] {
    return this.emit === "on-close" && atMs === this.closeAt(window.endMs) ? [window] : [];
  }

  private keptAfter(endMs: number, atMs: number, now: number): boolean {
    const ends = this.ends(endMs);
    return atMs < ends && now < ends;
  }

  private ends(endMs: number): number {
    return endMs + this.graceMs;
  }

  /** Whether a window ending at `endMs` takes a record now: false open, true closed and
   * corrected within its grace, undefined late for it. */
  private takes(endMs: number, now: number): boolean | undefined {
    if (now >= this.ends(endMs)) return undefined;
    return now >= this.closeAt(endMs);
  }

  private closeAt(endMs: number): number {
    return this.late === "wait" ? this.ends(endMs) : endMs;
  }

  private firstTimer(endMs: number, closed: boolean): number {
    return closed || this.emit === "on-update" ? this.ends(endMs) : this.closeAt(endMs);
  }

  private timerName(startMs: number): string {
    return `${this.name}/${startMs}`;
  }

  private windowOf(name: string): number | undefined {
    const prefix = this.name + "/";
    const start = name.slice(prefix.length);
    return name.startsWith(prefix) && /^[0-9]+$/.test(start) ? Number(start) : undefined;
  }

  private tooLate(ts: number, now: number): Late {
    return new Late(
      `window ${this.name}: the record at ${ts} is late: the clock is at ${now}, past the end and grace ` +
        `(${this.graceMs} ms) of every window it belongs to`,
    );
  }
}

function read<A>(w: Stored<A>): Window<A> {
  return { startMs: w.start_ms, endMs: w.end_ms, aggregate: w.aggregate };
}

function stored<A>(w: Window<A>): Stored<A> {
  return { start_ms: w.startMs, end_ms: w.endMs, aggregate: w.aggregate };
}
