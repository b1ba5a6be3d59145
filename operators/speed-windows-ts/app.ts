/**
 * speed-windows in TypeScript: average and maximum speed per vehicle over event-time
 * windows, per minute (tumbling) and over the last 5 minutes every minute (hopping), each
 * emitted once when it closes, on the TypeScript SDK's windows. The same logic as
 * `operators/speed-windows` (Rust), so on the same input it writes the same state, timers
 * and outputs, byte for byte (a test checks it).
 *
 * Input: JSON `{"vehicle_id","ts","lat","lon","speed_kmh"}` keyed by vehicle id. Output,
 * per closed window: `{"vehicle_id","window","start","end","positions","mean_speed_kmh",
 * "max_speed_kmh"}`, marked as a timer's. With `grace_ms` in its `[operator.config]` (0 by
 * default), a window closes that long after its end and takes positions late by up to that
 * much; a position later than that for all its windows is a `late` dead letter.
 */

import { Late, Output, configInt, operator } from "./sluice-operator/index.js";
import { WindowSpec } from "./sluice-operator/window.js";

let graceMs = 0;

/** A window's positions: their count, speed sum and maximum. (Not the vehicle: that is
 * the key, which `fired` is given.) */
interface Speeds {
  positions: number;
  sum_kmh: number;
  max_kmh: number;
}

/** The fields that are floats (f64 in the Rust build): a window's, and a summary's. */
const WINDOW_FLOATS = new Set(["sum_kmh", "max_kmh"]);
const SUMMARY_FLOATS = new Set(["mean_speed_kmh", "max_speed_kmh"]);

function windows(): WindowSpec<Speeds>[] {
  return [
    WindowSpec.tumbling<Speeds>("minute", 60_000).grace(graceMs).withFloats(WINDOW_FLOATS),
    WindowSpec.hopping<Speeds>("5min", 300_000, 60_000).grace(graceMs).withFloats(WINDOW_FLOATS),
  ];
}

const speeds = (): Speeds => ({ positions: 0, sum_kmh: 0, max_kmh: 0 });

// State in the binary encoding, as the Rust build's: the windows' entries are the same bytes.
export const { init, process, processBatch, expired, fired } = operator({
  init(config) {
    graceMs = configInt(config, "grace_ms", 0);
  },

  process(record, state) {
    const p = record.json<{ speed_kmh: number }>();
    const add = (w: Speeds) => {
      [w.positions, w.sum_kmh, w.max_kmh] = [w.positions + 1, w.sum_kmh + p.speed_kmh, Math.max(w.max_kmh, p.speed_kmh)];
    };
    const [minute, fiveMinutes] = windows();
    // A position late for its minute may be in time for 5-minute windows, which end
    // later: only when it is late for those too is it a late record.
    try {
      minute.add(state, record.timestampMs, add, speeds);
    } catch (e) {
      if (!(e instanceof Late)) throw e;
    }
    fiveMinutes.add(state, record.timestampMs, add, speeds);
    return [];
  },

  fired(timer, state) {
    const outputs: Output[] = [];
    for (const spec of windows()) {
      for (const window of spec.fired(state, timer)) {
        const s = window.aggregate;
        const summary = {
          vehicle_id: timer.keyText(),
          window: spec.name,
          start: window.startMs,
          end: window.endMs,
          positions: s.positions,
          mean_speed_kmh: s.positions ? s.sum_kmh / s.positions : 0,
          max_speed_kmh: s.max_kmh,
        };
        outputs.push(new Output(timer.key, summary, { floats: SUMMARY_FLOATS }));
      }
    }
    return outputs;
  },
}, { stateEncoding: "binary" });
