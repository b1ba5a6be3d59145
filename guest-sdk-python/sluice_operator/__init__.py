"""Write Sluice stream operators in Python: records, keyed state and outputs over the
`operator` world of Sluice's WIT package (`wit/operator.wit`), built into a component
by componentize-py.

An operator is a module that defines `process(record, state)` returning a list of
`Output`s, and exports the world with `WitWorld = operator(process)`:

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

State values are JSON, written exactly as the Rust SDK writes them (`guest-sdk`'s
default encoding: compact, fields in the order given, floats in their shortest
round-trip form as serde_json prints them), so a value one language's operator wrote
reads back the same in the other's, and an output built from it is the same bytes.
Values the Rust SDK wrote in its binary encoding (MessagePack behind the byte 0xC1)
are refused with a clear error: this SDK reads JSON only.
"""

import json
import math

import wit_world
from componentize_py_types import Err
from wit_world.imports import state as _state
from wit_world.imports import types

# The first byte of a value the Rust SDK wrote in its binary encoding.
_BINARY_MARKER = 0xC1


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


class State:
    """The state of the current record's key: named values, JSON by default."""

    def get(self, name):
        """The value stored under `name`, decoded from JSON, or None."""
        stored = self.get_bytes(name)
        if stored is None:
            return None
        if stored[:1] == bytes([_BINARY_MARKER]):
            raise ValueError(
                f"state {name!r} is in the Rust SDK's binary encoding, which this SDK does not read; "
                "store it as JSON (the Rust SDK's default) to share it between languages"
            )
        return json.loads(stored)

    def put(self, name, value):
        """Stores `value` (anything JSON holds) under `name`."""
        _state.put(name, dumps(value))

    def get_bytes(self, name):
        """The bytes stored under `name`, or None."""
        stored = _state.get(name)
        return None if stored is None else bytes(stored)

    def put_bytes(self, name, value):
        """Stores `value` (bytes) under `name` as it is."""
        _state.put(name, bytes(value))

    def delete(self, name):
        """Removes the value under `name`, if any."""
        _state.delete(name)


class Output:
    """A record to send: its key, and its value — bytes as they are, anything else as
    JSON ([`dumps`])."""

    __slots__ = ("key", "value")

    def __init__(self, key, value):
        self.key = key.encode() if isinstance(key, str) else bytes(key)
        self.value = bytes(value) if isinstance(value, (bytes, bytearray)) else dumps(value)


def dumps(value):
    """`value` as compact JSON bytes, as serde_json writes it: object fields in their
    order, strings escaped alike, floats in serde_json's (ryu's) notation. NaN and
    infinities, which JSON cannot hold, are refused."""
    return "".join(_encode(value)).encode()


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
    (Python's repr finds the same ones), placed as ryu places them — plain decimals
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


def operator(process, init=None):
    """The `WitWorld` class componentize-py exports, calling `process(record, state)`
    for each record (and `init(config)`, a dict of `[operator.config]`, once per
    instance). An exception fails the record: its message is the record's error."""

    state = State()

    class WitWorld(wit_world.WitWorld):
        def init(self, config):
            if init is not None:
                try:
                    init(dict(config))
                except Exception as e:
                    raise Err(f"{type(e).__name__}: {e}")

        def process(self, input):
            try:
                outputs = process(Record(input), state)
            except Exception as e:
                raise Err(f"{type(e).__name__}: {e}")
            return [types.OutputRecord(key=o.key, value=o.value, topic=None) for o in outputs]

    return WitWorld
