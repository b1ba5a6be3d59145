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

State values are JSON, written exactly as the Rust SDK writes them (`guest-sdk`'s
default encoding: compact, fields in the order given, floats in their shortest
round-trip form as serde_json prints them), so a value one language's operator wrote
reads back the same in the other's, and an output built from it is the same bytes.
Values the Rust SDK wrote in its binary encoding (MessagePack behind the byte 0xC1)
are refused with a clear error: this SDK reads JSON only.
"""

import json
import math
import random

import wit_world
from componentize_py_types import Err, Ok
from wit_world.imports import batch as _batch
from wit_world.imports import log as _log
from wit_world.imports import state as _state
from wit_world.imports import timers as _timers
from wit_world.imports import types

# The first byte of a value the Rust SDK wrote in its binary encoding.
_BINARY_MARKER = 0xC1

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
        return _decode(self.name, self.value)


class Timer:
    """A timer that came due: its key, name and the time it was set for."""

    __slots__ = ("key", "name", "at_ms")

    def __init__(self, key, name, at_ms):
        self.key, self.name, self.at_ms = bytes(key), name, at_ms


class State:
    """The state of the current record's key: named values, JSON by default, each with
    a TTL if given; and the key's timers."""

    def get(self, name):
        """The value stored under `name`, decoded from JSON, or None."""
        stored = self.get_bytes(name)
        return None if stored is None else _decode(name, stored)

    def put(self, name, value, ttl_ms=None):
        """Stores `value` (anything JSON holds) under `name`; with `ttl_ms`, to expire
        that long after the partition's clock now (else as the host's `[ttl]` says)."""
        self.put_bytes(name, dumps(value), ttl_ms)

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


def _decode(name, stored):
    if stored[:1] == bytes([_BINARY_MARKER]):
        raise ValueError(
            f"state {name!r} is in the Rust SDK's binary encoding, which this SDK does not read; "
            "store it as JSON (the Rust SDK's default) to share it between languages"
        )
    return json.loads(stored)


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


def dumps(value):
    """`value` as compact JSON bytes, as serde_json writes it: object fields in their
    order, strings escaped alike, floats in serde_json's notation. NaN and
    infinities, which JSON cannot hold, are refused."""
    if _repr_is_serde_json(value):
        # The standard library's C encoder, four times as fast: where every float is one
        # whose repr serde_json writes alike, it writes the same bytes.
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    return "".join(_encode(value)).encode()


def _repr_is_serde_json(value):
    """Whether `value` holds only what `json.dumps` writes as serde_json does: strings,
    integers, booleans, None, lists and string-keyed dicts of them, and floats that are
    0 or between 1e-4 and 1e16 in magnitude (outside, repr and serde_json place the
    exponent differently)."""
    if isinstance(value, float):
        return value == 0.0 or 1e-4 <= abs(value) < 1e16
    if isinstance(value, dict):
        return all(isinstance(k, str) and _repr_is_serde_json(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(_repr_is_serde_json(v) for v in value)
    return value is None or isinstance(value, (str, int))


def _encode(value):
    if value is None:
        yield "null"
    elif value is True:
        yield "true"
    elif value is False:
        yield "false"
    elif isinstance(value, int):
        yield str(value)
    elif isinstance(value, float):
        yield format_float(value)
    elif isinstance(value, str):
        yield json.dumps(value, ensure_ascii=False)
    elif isinstance(value, dict):
        yield "{"
        for i, (k, v) in enumerate(value.items()):
            if i:
                yield ","
            yield json.dumps(str(k), ensure_ascii=False)
            yield ":"
            yield from _encode(v)
        yield "}"
    elif isinstance(value, (list, tuple)):
        yield "["
        for i, v in enumerate(value):
            if i:
                yield ","
            yield from _encode(v)
        yield "]"
    else:
        raise TypeError(f"{type(value).__name__} is not something JSON holds")


def format_float(x):
    """`x` as serde_json prints an f64: the shortest digits that read back as `x`
    (Python's repr finds the same ones), placed as serde_json places them — plain decimals
    from 1e-5 up to 1e16, with a digit after the point, else `1e-7` or `1.5e+17`."""
    if math.isnan(x) or math.isinf(x):
        raise ValueError(f"{x} cannot be stored as JSON (it would read back as null)")
    sign = "-" if math.copysign(1.0, x) < 0 else ""
    mantissa, _, exponent = repr(abs(x)).partition("e")
    whole, _, fraction = mantissa.partition(".")
    # x = int(digits) × 10^k, digits without leading or trailing zeros.
    digits = (whole + fraction).lstrip("0")
    if not digits:
        return sign + "0.0"
    k = int(exponent or 0) - len(fraction) + len(digits) - len(digits.rstrip("0"))
    digits = digits.rstrip("0")
    length = len(digits)
    kk = length + k  # 10^(kk-1) <= x < 10^kk
    if 0 <= k and kk <= 16:
        return sign + digits + "0" * k + ".0"
    if 0 < kk <= 16:
        return sign + digits[:kk] + "." + digits[kk:]
    if -5 < kk <= 0:
        return sign + "0." + "0" * -kk + digits
    exponent = f"{kk - 1:+d}"
    if length == 1:
        return f"{sign}{digits}e{exponent}"
    return f"{sign}{digits[0]}.{digits[1:]}e{exponent}"


def operator(process, init=None, expired=None, fired=None):
    """The `WitWorld` class componentize-py exports, calling `process(record, state)`
    for each record, `init(config)` (a dict of `[operator.config]`) once per instance,
    `expired(entry, state)` for each entry whose TTL ran out and `fired(timer, state)`
    for each timer that came due, each returning a list of `Output`s (none when not
    given). An exception fails that record, expiry or timer alone: its message is the
    dead letter's, and its writes are discarded; a `Late` one marks a record late."""

    state = State()

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
