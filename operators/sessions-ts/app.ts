/**
 * sessions in TypeScript: per-user sessions closed by inactivity, on the TypeScript SDK's
 * session windows — the same logic as `operators/sessions` (Rust), so on the same events
 * it closes the same sessions, emits the same lines and dead-letters the same late events
 * (a test checks it).
 *
 * Input: JSON `{"user","ts","page"}` keyed by user (`[source] key_field = "user"`).
 * Output: one line per closed session, `{"user","start","end","events","pages"}`, marked
 * as a timer's. `gap_ms` in its `[operator.config]` (30 minutes by default) is the
 * inactivity that closes a session.
 */

import { Output, configInt, operator } from "./sluice-operator/index.js";
import { WindowSpec } from "./sluice-operator/window.js";

let gapMs = 30 * 60 * 1000;

interface Session {
  user: string;
  start: number;
  end: number;
  events: number;
  pages: string[];
}

/** Sessions an event bridges become one (and a new session is its first event). */
function merge(into: Session, other: Session): Session {
  if (into.events === 0) return other;
  [into.start, into.end, into.events] = [Math.min(into.start, other.start), Math.max(into.end, other.end), into.events + other.events];
  into.pages.push(...other.pages.filter((page) => !into.pages.includes(page)));
  return into;
}

const sessions = () => WindowSpec.session<Session>("session", gapMs, merge);
const empty = (): Session => ({ user: "", start: 0, end: 0, events: 0, pages: [] });

export const { init, process, processBatch, expired, fired } = operator({
  init(config) {
    gapMs = configInt(config, "gap_ms", gapMs);
  },

  process(record, state) {
    const event = record.json<{ user: string; ts: number; page: string }>();
    const one = (): Session => ({ user: event.user, start: event.ts, end: event.ts, events: 1, pages: [event.page] });
    sessions().add(state, event.ts, (session) => merge(session, one()), empty);
    return [];
  },

  fired(timer, state) {
    return sessions().fired(state, timer).map((window) => new Output(timer.key, window.aggregate));
  },
});
