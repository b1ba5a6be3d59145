"""How state values become bytes and back, as the Rust SDK's `encoding` module does it,
byte for byte: JSON (the default) and the compact binary encoding, MessagePack with field
names behind the byte 0xC1. A value one language's operator wrote reads back the same in
another's, and an output built from it is the same bytes. Reading tells the encodings
apart by the first byte (0xC1 starts no JSON text), so an operator reads either whichever
it writes, and switching encodings across a hot swap needs no migration.

This module has no imports from the world, so it runs under plain Python as well as in a
component (`./dev.sh test` checks it against the vectors the Rust SDK is checked against).
"""

import json
import math
import struct

# The first byte of a value in the binary encoding (0xC1: no UTF-8 text starts with it,
# and MessagePack leaves it unused).
BINARY_MARKER = b"\xc1"

ENCODINGS = ("json", "binary")


def encode(value, encoding):
    """`value` as bytes in `encoding`, one of `ENCODINGS`."""
    if encoding == "json":
        return dumps(value)
    if encoding == "binary":
        return dumps_binary(value)
    raise ValueError(f"encoding {encoding!r} is not one of {', '.join(ENCODINGS)}")


def decode(name, stored):
    """The value `stored` (the state entry `name`'s bytes) holds, whichever encoding
    wrote it."""
    if stored[:1] != BINARY_MARKER:
        return json.loads(stored)
    try:
        return loads_binary(stored)
    except ValueError as e:
        raise ValueError(f"state {name!r}: {e}") from None


# --- JSON as serde_json writes it ----------------------------------------------------------


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


# --- The binary encoding: MessagePack as rmp-serde writes it ------------------------------
# Integers in the fewest bytes (rmp's write_sint: non-negative ones as unsigned), floats
# as f64, strings, lists and string-keyed dicts with the smallest header that holds
# their length.

_U8, _U16, _U32, _U64 = (struct.Struct(f">B{c}").pack for c in "BHIQ")
_I8, _I16, _I32, _I64 = (struct.Struct(f">B{c}").pack for c in "bhiq")
_F64 = struct.Struct(">Bd").pack


def dumps_binary(value):
    """`value` in the binary encoding: None, booleans, integers that fit 64 bits, floats
    (NaN and the infinities too), strings, lists and tuples, and dicts with string keys."""
    out = bytearray(BINARY_MARKER)
    _write(value, out)
    return bytes(out)


def _write(value, out):
    kind = type(value)
    if kind is float:
        out += _F64(0xCB, value)
    elif kind is int:
        _write_int(value, out)
    elif kind is str:
        data = value.encode()
        _header(len(data), 0xA0, 32, 0xDA, out)
        out += data
    elif kind is dict:
        _header(len(value), 0x80, 16, 0xDE, out)
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"a dict key must be a string, not {type(key).__name__}")
            _write(str.__str__(key), out)
            _write(item, out)
    elif kind is list or kind is tuple:
        _header(len(value), 0x90, 16, 0xDC, out)
        for item in value:
            _write(item, out)
    elif value is None:
        out.append(0xC0)
    elif value is True:
        out.append(0xC3)
    elif value is False:
        out.append(0xC2)
    elif isinstance(value, str):
        # A subclass (a str enum's member): its characters, as JSON writes it.
        _write(str.__str__(value), out)
    elif isinstance(value, (int, float, dict, list, tuple)):
        # A subclass (an IntEnum, an OrderedDict), written as its base is.
        base = next(b for b in (int, float, dict, list, tuple) if isinstance(value, b))
        _write(base(value), out)
    else:
        raise TypeError(f"{kind.__name__} is not something the binary encoding holds")


def _header(length, fixed, fixed_below, sized16, out):
    """A string's, list's or dict's header: the fixed form below `fixed_below`, else the
    16-bit one (`sized16`) or the 32-bit one after it; a string's has an 8-bit one first."""
    if length < fixed_below:
        out.append(fixed | length)
    elif sized16 == 0xDA and length < 256:
        out += _U8(0xD9, length)
    elif length < 65536:
        out += _U16(sized16, length)
    else:
        out += _U32(sized16 + 1, length)


def _write_int(x, out):
    if 0 <= x < 128:
        out.append(x)
    elif x >= 0:
        if x < 256:
            out += _U8(0xCC, x)
        elif x < 65536:
            out += _U16(0xCD, x)
        elif x < 4294967296:
            out += _U32(0xCE, x)
        elif x < 18446744073709551616:
            out += _U64(0xCF, x)
        else:
            raise OverflowError(f"{x} does not fit 64 bits")
    elif x >= -32:
        out.append(x & 0xFF)
    elif x >= -128:
        out += _I8(0xD0, x)
    elif x >= -32768:
        out += _I16(0xD1, x)
    elif x >= -2147483648:
        out += _I32(0xD2, x)
    elif x >= -9223372036854775808:
        out += _I64(0xD3, x)
    else:
        raise OverflowError(f"{x} does not fit 64 bits")


def loads_binary(data):
    """The value `data` (starting with the marker byte) holds in the binary encoding:
    maps become dicts, arrays lists, binaries bytes. Truncated or left-over bytes,
    strings that are not UTF-8 and MessagePack's extension types are errors."""
    if data[:1] != BINARY_MARKER:
        raise ValueError("not the binary encoding (no 0xC1 marker)")
    data = bytes(data)
    try:
        value, at = _read(data, 1)
    except (IndexError, struct.error):
        raise ValueError(f"the value ends early, in {len(data)} bytes") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"a string that is not UTF-8 ({e.reason})") from None
    except TypeError:
        raise ValueError("a map's key is a list or a map, which a dict cannot hold") from None
    except RecursionError:
        raise ValueError("the value is nested too deeply to read") from None
    if at > len(data):
        raise ValueError(f"the value ends early, in {len(data)} bytes")
    if at != len(data):
        raise ValueError(f"{len(data) - at} bytes left over after the value")
    return value


# Fixed-width numbers: their reader, and width.
_NUMBERS = {
    marker: (struct.Struct(code).unpack_from, struct.calcsize(code))
    for marker, code in {
        0xCA: ">f", 0xCB: ">d", 0xCC: ">B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q",
        0xD0: ">b", 0xD1: ">h", 0xD2: ">i", 0xD3: ">q",
    }.items()
}
# Sized strings (0), binaries (1), arrays (2) and maps (3): their kind and length's reader.
_SIZED = {
    0xD9: (0, ">B"), 0xDA: (0, ">H"), 0xDB: (0, ">I"),
    0xC4: (1, ">B"), 0xC5: (1, ">H"), 0xC6: (1, ">I"),
    0xDC: (2, ">H"), 0xDD: (2, ">I"),
    0xDE: (3, ">H"), 0xDF: (3, ">I"),
}
_SIZED = {marker: (kind, struct.Struct(code).unpack_from, struct.calcsize(code)) for marker, (kind, code) in _SIZED.items()}
_F64_AT = struct.Struct(">d").unpack_from


def _read(data, at):
    # The forms a state value is mostly made of come first: this runs per field.
    marker = data[at]
    at += 1
    if marker < 0x80:
        return marker, at
    if marker >= 0xA0 and marker < 0xC0:
        end = at + (marker & 0x1F)
        return data[at:end].decode(), end
    if marker == 0xCB:
        return _F64_AT(data, at)[0], at + 8
    if marker < 0x90:
        return _read_map(marker & 0x0F, data, at)
    if marker < 0xA0:
        return _read_array(marker & 0x0F, data, at)
    if marker >= 0xE0:
        return marker - 256, at
    if marker == 0xC0:
        return None, at
    if marker == 0xC2:
        return False, at
    if marker == 0xC3:
        return True, at
    number = _NUMBERS.get(marker)
    if number is not None:
        read, width = number
        return read(data, at)[0], at + width
    sized = _SIZED.get(marker)
    if sized is None:
        raise ValueError(f"byte {at - 1}: 0x{marker:02X} is not a value this encoding writes")
    kind, read, width = sized
    length = read(data, at)[0]
    at += width
    if kind == 2:
        return _read_array(length, data, at)
    if kind == 3:
        return _read_map(length, data, at)
    end = at + length
    if end > len(data):
        raise IndexError
    return (data[at:end].decode() if kind == 0 else data[at:end]), end


def _read_array(length, data, at):
    items = []
    for _ in range(length):
        item, at = _read(data, at)
        items.append(item)
    return items, at


def _read_map(length, data, at):
    entries = {}
    for _ in range(length):
        # Field names are short strings: read here, without a call.
        marker = data[at]
        if 0xA0 <= marker < 0xC0:
            end = at + 1 + (marker & 0x1F)
            key, at = data[at + 1 : end].decode(), end
        else:
            key, at = _read(data, at)
        entries[key], at = _read(data, at)
    return entries, at
