"""speed-windows in Python: average and maximum speed per vehicle over event-time windows,
per minute (tumbling) and over the last 5 minutes every minute (hopping), each emitted
once when it closes, on the Python SDK's windows. The same logic as
`operators/speed-windows` (Rust), so on the same input it writes the same state, timers
and outputs, byte for byte (a test checks it).

Input: JSON `{"vehicle_id","ts","lat","lon","speed_kmh"}` keyed by vehicle id. Output, per
closed window: `{"vehicle_id","window","start","end","positions","mean_speed_kmh",
"max_speed_kmh"}`, marked as a timer's. With `grace_ms` in its `[operator.config]` (0 by
default), a window closes that long after its end and takes positions late by up to that
much; a position later than that for all its windows is a `late` dead letter.
"""

from sluice_operator import Late, Output, operator
from sluice_operator.window import WindowSpec

grace_ms = 0


def init(config):
    global grace_ms
    grace_ms = int(config.get("grace_ms", 0))


def windows():
    return [WindowSpec.tumbling("minute", 60_000).grace(grace_ms), WindowSpec.hopping("5min", 300_000, 60_000).grace(grace_ms)]


def speeds():
    # Not the vehicle: that is the key, which `fired` is given.
    return {"positions": 0, "sum_kmh": 0.0, "max_kmh": 0.0}


def process(record, state):
    speed = float(record.json()["speed_kmh"])

    def add(w):
        w["positions"], w["sum_kmh"], w["max_kmh"] = w["positions"] + 1, w["sum_kmh"] + speed, max(w["max_kmh"], speed)

    minute, five_minutes = windows()
    # A position late for its minute may be in time for 5-minute windows, which end
    # later: only when it is late for those too is it a late record.
    try:
        minute.add(state, record.timestamp_ms, add, speeds)
    except Late:
        pass
    five_minutes.add(state, record.timestamp_ms, add, speeds)
    return []


def fired(timer, state):
    outputs = []
    for spec in windows():
        for window in spec.fired(state, timer):
            s = window.aggregate
            mean = s["sum_kmh"] / s["positions"] if s["positions"] else 0.0
            summary = {
                "vehicle_id": timer.key.decode(),
                "window": spec.name,
                "start": window.start_ms,
                "end": window.end_ms,
                "positions": s["positions"],
                "mean_speed_kmh": mean,
                "max_speed_kmh": s["max_kmh"],
            }
            outputs.append(Output(timer.key, summary))
    return outputs


# The binary encoding, as the Rust build's: the windows' entries are the same bytes.
WitWorld = operator(process, init=init, fired=fired, state_encoding="binary")
