"""Idle vehicles, in Python, on timers: each position sets the vehicle's timer `idle` for a
minute (or `idle_ms` of its `[operator.config]`) of event time after it, replacing the one
before; a vehicle with no position for that long has its timer fire, and the operator emits
its last position then, once, and forgets it.

Input: JSON `{"vehicle_id","ts","lat","lon","speed_kmh"}` keyed by vehicle id. Output, per
idle spell: `{"vehicle_id","idle_since","lat","lon","at"}` (`idle_since` its last
position's time, `at` the timer's), marked as a timer's. Nothing per position.
"""

from sluice_operator import Output, operator

idle_ms = 60_000


def init(config):
    global idle_ms
    idle_ms = int(config.get("idle_ms", idle_ms))


def process(record, state):
    p = record.json()
    state.put("last", {"vehicle_id": p["vehicle_id"], "idle_since": p["ts"], "lat": p["lat"], "lon": p["lon"]})
    state.set_timer("idle", p["ts"] + idle_ms)
    return []


def fired(timer, state):
    last = state.get("last")
    state.delete("last")
    return [Output(timer.key, {**last, "at": timer.at_ms})]


WitWorld = operator(process, init=init, fired=fired)
