"""sessions in Python: per-user sessions closed by inactivity, on the Python SDK's session
windows — the same logic as `operators/sessions` (Rust), so on the same events it closes
the same sessions, emits the same lines and dead-letters the same late events (a test
checks it).

Input: JSON `{"user","ts","page"}` keyed by user (`[source] key_field = "user"`). Output:
one line per closed session, `{"user","start","end","events","pages"}`, marked as a
timer's. `gap_ms` in its `[operator.config]` (30 minutes by default) is the inactivity that
closes a session.
"""

from sluice_operator import Output, operator
from sluice_operator.window import WindowSpec

gap_ms = 30 * 60 * 1000


def init(config):
    global gap_ms
    gap_ms = int(config.get("gap_ms", gap_ms))


def merge(into, other):
    """Sessions an event bridges become one (and a new session is its first event)."""
    if into["events"] == 0:
        return other
    into["start"], into["end"], into["events"] = (
        min(into["start"], other["start"]),
        max(into["end"], other["end"]),
        into["events"] + other["events"],
    )
    into["pages"].extend([page for page in other["pages"] if page not in into["pages"]])
    return into


def sessions():
    return WindowSpec.session("session", gap_ms, merge)


def empty():
    return {"user": "", "start": 0, "end": 0, "events": 0, "pages": []}


def process(record, state):
    event = record.json()
    one = {"user": event["user"], "start": event["ts"], "end": event["ts"], "events": 1, "pages": [event["page"]]}
    sessions().add(state, event["ts"], lambda session: merge(session, dict(one, pages=list(one["pages"]))), empty)
    return []


def fired(timer, state):
    return [Output(timer.key, window.aggregate) for window in sessions().fired(state, timer)]


WitWorld = operator(process, init=init, fired=fired)
