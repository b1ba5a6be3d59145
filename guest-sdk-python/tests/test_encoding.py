"""The SDK's state encodings against the Rust SDK's: each vector in
guest-sdk/testdata/binary-encoding.json is a value and the bytes rmp-serde writes for
it (the Rust SDK's own test checks them), which this SDK must write byte for byte and
read back as the same value, integers as integers and floats as floats. Run by
`./dev.sh test` under plain Python: `python3 -m unittest discover guest-sdk-python/tests`.
"""

import json
import math
import pathlib
import sys
import unittest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "guest-sdk-python" / "sluice_operator"))

import encoding  # noqa: E402  (the SDK's module, without the package's world imports)

VECTORS = json.loads((ROOT / "guest-sdk" / "testdata" / "binary-encoding.json").read_text())


def typed(value):
    """`value` with each number's type beside it, so 3 and 3.0 differ."""
    if isinstance(value, dict):
        return {k: typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [typed(v) for v in value]
    return (type(value).__name__, value)


class BinaryEncoding(unittest.TestCase):
    def test_writes_what_rmp_serde_writes(self):
        for vector in VECTORS:
            with self.subTest(vector["name"]):
                self.assertEqual(encoding.dumps_binary(vector["value"]).hex(), vector["hex"])

    def test_reads_what_rmp_serde_writes(self):
        for vector in VECTORS:
            with self.subTest(vector["name"]):
                read = encoding.decode(vector["name"], bytes.fromhex(vector["hex"]))
                self.assertEqual(typed(read), typed(vector["value"]))

    def test_reads_json_too(self):
        self.assertEqual(encoding.decode("count", b'{"n":3,"mean":2.5}'), {"n": 3, "mean": 2.5})
        self.assertEqual(encoding.encode({"n": 3}, "json"), b'{"n":3}')

    def test_keeps_what_json_cannot_hold(self):
        for x in [math.inf, -math.inf]:
            self.assertEqual(encoding.loads_binary(encoding.dumps_binary({"x": x})), {"x": x})
        self.assertTrue(math.isnan(encoding.loads_binary(encoding.dumps_binary([math.nan]))[0]))

    def test_writes_a_subclass_as_its_base(self):
        import enum

        class Colour(str, enum.Enum):
            RED = "red"

        class Size(enum.IntEnum):
            BIG = 3

        value = {Colour.RED: [Colour.RED, Size.BIG]}
        self.assertEqual(encoding.dumps_binary(value), encoding.dumps_binary({"red": ["red", 3]}))
        self.assertEqual(encoding.dumps(value), b'{"red":["red",3]}')

    def test_refuses_an_unknown_encoding(self):
        with self.assertRaisesRegex(ValueError, "'msgpack' is not one of json, binary"):
            encoding.encode({}, "msgpack")

    def test_refuses_what_it_cannot_write(self):
        for value, error in [
            ({1: 2}, "dict key must be a string"),
            (b"bytes", "bytes is not something"),
            (2**64, "does not fit 64 bits"),
            (-(2**63) - 1, "does not fit 64 bits"),
        ]:
            with self.subTest(repr(value)):
                with self.assertRaisesRegex((TypeError, OverflowError), error):
                    encoding.dumps_binary(value)

    def test_names_the_entry_and_the_fault_in_bad_bytes(self):
        whole = bytes.fromhex(VECTORS[0]["hex"])
        for data, error in [
            (whole[:-3], "ends early"),
            (whole + b"\x00", "1 bytes left over"),
            (b"\xc1\xc7\x01\x00\x00", "0xC7 is not a value"),
            (b"\xc1\xa2\xff\xfe", "not UTF-8"),
            (b"\xc1\x81\x91\x01\x02", "key is a list or a map"),
            (b"\xc1" + b"\x91" * 100_000 + b"\x01", "nested too deeply"),
        ]:
            with self.subTest(data.hex()):
                with self.assertRaisesRegex(ValueError, f"state 'windows': .*{error}"):
                    encoding.decode("windows", data)


if __name__ == "__main__":
    unittest.main()
