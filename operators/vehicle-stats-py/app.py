"""vehicle-stats in Python: per-vehicle running aggregate — count, mean and max speed,
distance travelled, first/last seen and the latest note — keeping only what the next
record needs. The same logic as `operators/vehicle-stats` (Rust), field for field and
float operation for float operation, so on the same input it writes the same state and
outputs, byte for byte (a test checks it), and either can be deployed over the other.

Input: JSON `{"vehicle_id","ts","lat","lon","speed_kmh"}` (and maybe `"note"`) keyed by
vehicle id. Output: the vehicle's updated summary as JSON, one per input. With
`left_fleet_after_ms` in its `[operator.config]`, a vehicle's summary expires that long
after its last position, and the final summary is emitted with `left_fleet_at` set.
"""

import math

from sluice_operator import Output, dumps, operator

# How long after its last position a vehicle has left the fleet, in ms; 0: never.
LEFT_FLEET_AFTER_MS = "left_fleet_after_ms"
left_fleet_after_ms = 0


def init(config):
    global left_fleet_after_ms
    if LEFT_FLEET_AFTER_MS in config:
        left_fleet_after_ms = int(config[LEFT_FLEET_AFTER_MS])


def process(record, state):
    p = record.json()
    s = state.get("summary") or {
        "vehicle_id": "",
        "count": 0,
        "mean_speed_kmh": 0.0,
        "max_speed_kmh": 0.0,
        "distance_km": 0.0,
        "first_seen": 0,
        "last_seen": 0,
        "last_lat": 0.0,
        "last_lon": 0.0,
    }
    lat, lon, speed, ts = float(p["lat"]), float(p["lon"]), float(p["speed_kmh"]), int(p["ts"])
    if s["count"] == 0:
        s["vehicle_id"], s["first_seen"], s["last_seen"] = p["vehicle_id"], ts, ts
    else:
        s["distance_km"] += haversine_km(s["last_lat"], s["last_lon"], lat, lon)
    s["count"] += 1
    s["mean_speed_kmh"] += (speed - s["mean_speed_kmh"]) / s["count"]
    s["max_speed_kmh"] = max(s["max_speed_kmh"], speed)
    s["first_seen"], s["last_seen"] = min(s["first_seen"], ts), max(s["last_seen"], ts)
    s["last_lat"], s["last_lon"] = lat, lon
    if p.get("note") is not None:
        s["note"] = p["note"]
    # The summary is both the state and the output: serialized once for both.
    summary = dumps(s)
    state.put_bytes("summary", summary, ttl_ms=left_fleet_after_ms or None)
    return [Output(record.key, summary)]


def expired(entry, state):
    """The vehicle left the fleet (or the host's `[ttl]` expired its summary): its final
    summary."""
    return [Output(entry.key, {"left_fleet_at": entry.expired_at_ms, **entry.json()})]


def haversine_km(lat1, lon1, lat2, lon2):
    """Great-circle distance between two WGS84 positions, in kilometres, computed as
    the Rust build computes it."""
    dlat, dlon = math.radians(lat2 - lat1), math.radians(lon2 - lon1)
    half_lat, half_lon = math.sin(dlat / 2.0), math.sin(dlon / 2.0)
    # As Rust evaluates `sin².powi(2) + cos(lat1) * cos(lat2) * sin².powi(2)`: each
    # product in the same order, so each rounds alike.
    a = half_lat * half_lat + math.cos(math.radians(lat1)) * math.cos(math.radians(lat2)) * (half_lon * half_lon)
    return 6371.0088 * 2.0 * math.asin(math.sqrt(a))


WitWorld = operator(process, init=init, expired=expired)
