/**
 * vehicle-stats in TypeScript: per-vehicle running aggregate — count, mean and max
 * speed, distance travelled, first/last seen and the latest note — keeping only what the
 * next record needs. The same logic as `operators/vehicle-stats` (Rust), field for field
 * and float operation for float operation, so on the same input it writes the same state
 * and outputs, byte for byte (a test checks it), and either can be deployed over the other.
 *
 * Input: JSON `{"vehicle_id","ts","lat","lon","speed_kmh"}` (and maybe `"note"`) keyed by
 * vehicle id. Output: the vehicle's updated summary as JSON, one per input. With
 * `left_fleet_after_ms` in its `[operator.config]`, a vehicle's summary expires that long
 * after its last position, and the final summary is emitted with `left_fleet_at` set.
 */

import { Output, configInt, dumps, operator } from "./sluice-operator/index.js";

/** How long after its last position a vehicle has left the fleet, in ms; 0: never. */
const LEFT_FLEET_AFTER_MS = "left_fleet_after_ms";
let leftFleetAfterMs = 0;

interface Position {
  vehicle_id: string;
  ts: number;
  lat: number;
  lon: number;
  speed_kmh: number;
  note?: string | null;
}

/** The state kept per vehicle and the summary emitted for it, in the Rust build's field
 * order. */
interface Summary {
  vehicle_id: string;
  count: number;
  mean_speed_kmh: number;
  max_speed_kmh: number;
  distance_km: number;
  first_seen: number;
  last_seen: number;
  last_lat: number;
  last_lon: number;
  note?: string;
}

/** The summary's fields that are floats (f64 in the Rust build), written as such even
 * when integral. */
const FLOATS = new Set(["mean_speed_kmh", "max_speed_kmh", "distance_km", "last_lat", "last_lon"]);

export const { init, process, processBatch, expired, fired } = operator({
  init(config) {
    leftFleetAfterMs = configInt(config, LEFT_FLEET_AFTER_MS, 0);
  },

  process(record, state) {
    const p = position(record.json());
    const s: Summary = state.get<Summary>("summary") ?? {
      vehicle_id: "",
      count: 0,
      mean_speed_kmh: 0,
      max_speed_kmh: 0,
      distance_km: 0,
      first_seen: 0,
      last_seen: 0,
      last_lat: 0,
      last_lon: 0,
    };
    if (s.count === 0) {
      [s.vehicle_id, s.first_seen, s.last_seen] = [p.vehicle_id, p.ts, p.ts];
    } else {
      s.distance_km += haversineKm(s.last_lat, s.last_lon, p.lat, p.lon);
    }
    s.count += 1;
    s.mean_speed_kmh += (p.speed_kmh - s.mean_speed_kmh) / s.count;
    s.max_speed_kmh = Math.max(s.max_speed_kmh, p.speed_kmh);
    [s.first_seen, s.last_seen] = [Math.min(s.first_seen, p.ts), Math.max(s.last_seen, p.ts)];
    [s.last_lat, s.last_lon] = [p.lat, p.lon];
    if (p.note !== undefined && p.note !== null) {
      s.note = p.note;
    }
    // The summary is both the state and the output: serialized once for both.
    const summary = dumps(s, FLOATS);
    state.putBytes("summary", summary, { ttlMs: leftFleetAfterMs || undefined });
    return [new Output(record.key, summary)];
  },

  /** The vehicle left the fleet (or the host's `[ttl]` expired its summary): its final
   * summary. */
  expired(entry) {
    return [new Output(entry.key, { left_fleet_at: entry.expiredAtMs, ...entry.json<Summary>() }, { floats: FLOATS })];
  },
});

/** `value` as a position, its fields of the types the Rust build's `Position` has (which
 * refuses a record otherwise, as this does). */
function position(value: any): Position {
  for (const field of ["ts", "lat", "lon", "speed_kmh"]) {
    if (typeof value?.[field] !== "number") throw new TypeError(`position: ${field} is not a number`);
  }
  if (typeof value.vehicle_id !== "string") throw new TypeError("position: vehicle_id is not a string");
  if (!Number.isSafeInteger(value.ts)) throw new TypeError("position: ts is not a whole number");
  return value as Position;
}

/** Great-circle distance between two WGS84 positions, in kilometres, computed as the Rust
 * build computes it: each product in the same order, so each rounds alike. */
function haversineKm(lat1: number, lon1: number, lat2: number, lon2: number): number {
  const radians = Math.PI / 180;
  const [dlat, dlon] = [(lat2 - lat1) * radians, (lon2 - lon1) * radians];
  const [halfLat, halfLon] = [Math.sin(dlat / 2), Math.sin(dlon / 2)];
  const a = halfLat * halfLat + Math.cos(lat1 * radians) * Math.cos(lat2 * radians) * (halfLon * halfLon);
  return 6371.0088 * 2 * Math.asin(Math.sqrt(a));
}
