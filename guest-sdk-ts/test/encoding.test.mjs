// The SDK's state encodings against the Rust SDK's: each vector in
// guest-sdk/testdata/binary-encoding.json is a value and the bytes rmp-serde writes for it
// (the Rust SDK's own test checks them), which the SDK must write byte for byte, given the
// fields that are floats, and read back as the same value. Run by `./dev.sh test` over
// encoding.ts compiled into $SLUICE_TS_SDK.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

const { decode, dumpsBinary, encode, loadsBinary } = await import(`${process.env.SLUICE_TS_SDK}/encoding.js`);
const vectors = JSON.parse(readFileSync(new URL("../../guest-sdk/testdata/binary-encoding.json", import.meta.url)));

const hex = (bytes) => Buffer.from(bytes).toString("hex");
const unhex = (text) => new Uint8Array(Buffer.from(text, "hex"));

test("the binary encoding writes what rmp-serde writes", () => {
  for (const { name, value, floats, hex: expected } of vectors) {
    assert.equal(hex(dumpsBinary(value, floats)), expected, name);
  }
});

test("the binary encoding reads what rmp-serde writes", () => {
  for (const { name, value, hex: bytes } of vectors) {
    assert.deepEqual(decode(name, unhex(bytes)), value, name);
  }
});

test("JSON is read too, and written as json.ts writes it", () => {
  assert.deepEqual(decode("count", new TextEncoder().encode('{"n":3,"mean":2.5}')), { n: 3, mean: 2.5 });
  assert.equal(new TextDecoder().decode(encode({ n: 3, mean: 3 }, "json", ["mean"])), '{"n":3,"mean":3.0}');
});

test("integers past 2^53 travel as bigints, and what JSON cannot hold is kept", () => {
  const big = { max: 18446744073709551615n, min: -9223372036854775808n, id: 2n ** 53n };
  assert.deepEqual(loadsBinary(dumpsBinary(big)), big);
  const odd = { nan: NaN, up: Infinity, down: -Infinity };
  assert.deepEqual(loadsBinary(dumpsBinary(odd)), odd);
  // An absent field is left out and an absent element is nil, as JSON writes them.
  assert.deepEqual(loadsBinary(dumpsBinary({ gone: undefined, list: [undefined, 1] })), { list: [null, 1] });
  // A field named __proto__ is a field, as JSON.parse makes it.
  const proto = loadsBinary(unhex("c181a95f5f70726f746f5f5f01"));
  assert.equal(Object.getPrototypeOf(proto), Object.prototype);
  assert.deepEqual(Object.keys(proto), ["__proto__"]);
});

test("what the encoding cannot hold is refused", () => {
  assert.throws(() => encode({}, "msgpack"), /"msgpack" is not one of json, binary/);
  assert.throws(() => dumpsBinary({ x: 2 ** 60 }), /past 2\^53/);
  assert.throws(() => dumpsBinary({ x: 2n ** 64n }), /does not fit 64 bits/);
  assert.throws(() => dumpsBinary({ at: new Date(0) }), /a Date is not something state holds/);
  assert.throws(() => dumpsBinary({ f: () => 1 }), /a function is not something state holds/);
});

test("bad bytes name the entry and the fault", () => {
  const whole = unhex(vectors[0].hex);
  const cases = [
    [whole.subarray(0, whole.length - 3), /ends early/],
    [new Uint8Array([...whole, 0]), /1 bytes left over/],
    [unhex("c1c7010000"), /0xc7 is not a value/],
    [unhex("c1a2fffe"), /not UTF-8/],
  ];
  for (const [bytes, error] of cases) {
    assert.throws(() => decode("windows", bytes), (e) => /^state "windows": /.test(e.message) && error.test(e.message));
  }
});
