"""Write Sluice stream operators in Python: records, keyed state with TTLs, timers,
outputs and (in `window`) event-time windows over the `timed-operator` world of Sluice's WIT package (`wit/operator.wit`),
built into a component by componentize-py.

An operator is a module that defines `process(record, state)` returning a list of
`Output`s (and, if it wants them, `expired(entry, state)` for entries whose TTL ran out and
`fired(timer, state)` for its timers), and exports the world with
`WitWorld = operator(process)`:

    from sluice_operator import Output, operator

    def process(record, state):
        count = (state.get("count") or 0) + 1
        state.put("count", count)
        return [Output(record.key, {"count": count})]

    WitWorld = operator(process)

This module owns the Python side of the contract: reading records, the state's value
encoding and outputs. It does not decide anything the host decides (which key a call
is scoped to, when writes commit, what a failure costs): an exception `process` raises
fails that record alone, which the host sends to the dead letters with the message.

`random`'s module functions draw, in each call, from a generator seeded by what the call
is for (the record's partition and offset; a timer's or expiry's key, name and time), so
`random.random()` draws the same for a record on a replay, in a trap's fresh instance or
on a handover's new owner, rather than continuing a sequence the instance began with its
earlier records. (The SDK wraps them when it is imported: a name taken from `random`
before that, `from random import choice` above the SDK's import, keeps the instance's
sequence.)

State values are written exactly as the Rust SDK writes them (`encoding`): JSON by
default (compact, fields in the order given, floats in their shortest round-trip form as
serde_json prints them), or with `operator(..., state_encoding="binary")` MessagePack
behind the byte 0xC1; either is read whichever the operator writes. So a value one
language's operator wrote reads back the same in another's, and an output built from it
is the same bytes.
"""

import json
import random

import wit_world
from componentize_py_types import Err, Ok
from wit_world.imports import batch as _batch
from wit_world.imports import log as _log
from wit_world.imports import state as _state
from wit_world.imports import timers as _timers
from wit_world.imports import types

from .encoding import ENCODINGS, decode, dumps, encode, format_float  # dumps and format_float: the SDK's own

# What the running call is for, until `random` is first drawn from in it: the draw seeds
# the generator from it. Seeding at every call instead would cost each record about 9 µs
# (CPython's Mersenne Twister fills 624 words), and most records draw nothing.
_unseeded = ("init",)


def _enter(*call):
    global _unseeded
    _unseeded = call


def _seeded(draw):
    def drawn(*args, **kwargs):
        global _unseeded
        if _unseeded is not None:
            random._inst.seed("/".join(map(str, _unseeded)))
            _unseeded = None
        return draw(*args, **kwargs)

    return drawn


for _name in dir(random):
    if getattr(getattr(random, _name), "__self__", None) is random._inst:
        setattr(random, _name, _seeded(getattr(random, _name)))


class Record:
    """The record being processed: its key and value as bytes, its event time (ms since
    the epoch, 0 when the source had none), and where it came from."""

    __slots__ = ("key", "value", "timestamp_ms", "partition", "offset")

    def __init__(self, input):
        self.key = bytes(input.key)
        self.value = bytes(input.value)
        self.timestamp_ms = input.timestamp_ms
        self.partition = input.partition
        self.offset = input.offset

    def json(self):
        """The value parsed as JSON."""
        return json.loads(self.value)


class Late(Exception):
    """Raised by `process` for a record that came after the windows it belongs to
    closed: the host sends it to the dead letters as `late`, not `rejected`."""


class Expired:
    """A state entry whose TTL ran out: its key, name and the bytes it held, and when it
    expired on the partition's clock. The host removed it before `expired` is called."""

    __slots__ = ("key", "name", "value", "expired_at_ms")

    def __init__(self, key, name, value, expired_at_ms):
        self.key, self.name, self.value, self.expired_at_ms = bytes(key), name, bytes(value), expired_at_ms

    def json(self):
        """The value it held, decoded as `State.get` decodes."""
        return decode(self.name, self.value)


class Timer:
    """A timer that came due: its key, name and the time it was set for."""

    __slots__ = ("key", "name", "at_ms")

    def __init__(self, key, name, at_ms):
        self.key, self.name, self.at_ms = bytes(key), name, at_ms


class State:
    """The state of the current record's key: named values, in the operator's
    `state_encoding` (JSON unless it says "binary"), each with a TTL if given; and the
    key's timers."""

    __slots__ = ("encoding",)

    def __init__(self, encoding="json"):
        self.encoding = encoding

    def get(self, name):
        """The value stored under `name`, decoded from whichever encoding wrote it, or
        None."""
        stored = self.get_bytes(name)
        return None if stored is None else decode(name, stored)

    def put(self, name, value, ttl_ms=None):
        """Stores `value` (None, booleans, numbers, strings, lists and string-keyed dicts
        of them) under `name` in the state's encoding; with `ttl_ms`, to expire that long
        after the partition's clock now (else as the host's `[ttl]` says)."""
        self.put_bytes(name, encode(value, self.encoding), ttl_ms)

    def get_bytes(self, name):
        """The bytes stored under `name`, or None."""
        stored = _state.get(name)
        return None if stored is None else bytes(stored)

    def put_bytes(self, name, value, ttl_ms=None):
        """Stores `value` (bytes) under `name` as it is; `ttl_ms` as for `put`."""
        if ttl_ms is None:
            _state.put(name, bytes(value))
        else:
            _state.put_with_ttl(name, bytes(value), ttl_ms)

    def delete(self, name):
        """Removes the value under `name`, if any."""
        _state.delete(name)

    def set_timer(self, name, at_ms):
        """Sets the key's timer `name` to fire at `at_ms` on the partition's clock,
        replacing the time it had; `fired` is called then."""
        _timers.set(name, at_ms)

    def cancel_timer(self, name):
        """Cancels the key's timer `name`, if set."""
        _timers.cancel(name)

    def now(self):
        """The partition's clock, ms since the epoch: event time less the host's
        `[ttl] lateness` (the watermark), 0 before the first record with a time."""
        return _timers.now()


class Output:
    """A record to send: its key, and its value — bytes as they are, anything else as
    JSON ([`dumps`])."""

    __slots__ = ("key", "value")

    def __init__(self, key, value):
        self.key = key.encode() if isinstance(key, str) else bytes(key)
        self.value = bytes(value) if isinstance(value, (bytes, bytearray)) else dumps(value)


def log(message, level="info"):
    """Writes `message` to the host's log at `level` ("trace", "debug", "info", "warn" or
    "error"), named with the operator's version and partition and bounded like every
    operator's lines (`[operator.limits] log_lines_per_s`, `log_bytes_per_s`,
    `log_line_bytes`). `print` is no way to log: stdout is not an operator's, and a
    build stubbed with `-s` traps there."""
    _log.log(_log.Level[level.upper()], str(message))


def operator(process, init=None, expired=None, fired=None, state_encoding="json"):
    """The `WitWorld` class componentize-py exports, calling `process(record, state)`
    for each record, `init(config)` (a dict of `[operator.config]`) once per instance,
    `expired(entry, state)` for each entry whose TTL ran out and `fired(timer, state)`
    for each timer that came due, each returning a list of `Output`s (none when not
    given). An exception fails that record, expiry or timer alone: its message is the
    dead letter's, and its writes are discarded; a `Late` one marks a record late.
    `state_encoding` is how `State.put` writes: "json" (readable in `sluice state
    dump` as it is) or "binary" (MessagePack, the Rust SDK's `Encoding::Binary`); either
    reads both."""

    if state_encoding not in ENCODINGS:
        raise ValueError(f"state_encoding {state_encoding!r} is not one of {', '.join(ENCODINGS)}")
    state = State(state_encoding)

    def failed(e):
        return Err(f"{type(e).__name__}: {e}")

    def record(input):
        _enter("r", input.partition, input.offset)
        return Record(input)

    def outcome(call, *args):
        try:
            return [types.OutputRecord(key=o.key, value=o.value, topic=None) for o in call(*args, state)]
        except Late as e:
            _timers.mark_late()
            raise Err(str(e))
        except Exception as e:
            raise failed(e)

    class WitWorld(wit_world.WitWorld):
        def init(self, config):
            _enter("init")
            if init is not None:
                try:
                    init(dict(config))
                except Exception as e:
                    raise failed(e)

        def process(self, input):
            return outcome(process, record(input))

        def process_batch(self, inputs):
            for input in inputs:
                try:
                    result = Ok(outcome(process, record(input)))
                except Err as e:
                    result = e
                _batch.finish(result)

        def expired(self, key, name, value, expired_at_ms):
            if expired is None:
                return []
            _enter("expired", bytes(key).hex(), name, expired_at_ms)
            return outcome(expired, Expired(key, name, value, expired_at_ms))

        def fired(self, key, name, at_ms):
            if fired is None:
                return []
            _enter("timer", bytes(key).hex(), name, at_ms)
            return outcome(fired, Timer(key, name, at_ms))

    return WitWorld
