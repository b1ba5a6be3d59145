// The SDK's JSON against serde_json's: each string below is what serde_json 1.0 writes
// for the f64, the i64 or the value, which the SDK must write byte for byte so a state
// value or an output is the same whichever language wrote it. Run by `./dev.sh test`
// over json.ts compiled into $SLUICE_TS_SDK.
import assert from "node:assert/strict";
import { test } from "node:test";

const { formatFloat, parse, stringify } = await import(`${process.env.SLUICE_TS_SDK}/json.js`);

test("floats are placed as serde_json places them", () => {
  const serdeJson = [
    [1.5e17, "1.5e+17"],
    [1e-7, "1e-7"],
    [1e16, "1e+16"],
    [1e15, "1000000000000000.0"],
    [123456789012345680.0, "1.2345678901234568e+17"],
    [0.0001, "0.0001"],
    [0.00001, "0.00001"],
    [1.2345e-5, "0.000012345"],
    [40.58, "40.58"],
    [0, "0.0"],
    [-0, "-0.0"],
    [1, "1.0"],
    [-2.5, "-2.5"],
    [1e21, "1e+21"],
    [5e-324, "5e-324"],
    [1.7976931348623157e308, "1.7976931348623157e+308"],
    [0.1 + 0.2, "0.30000000000000004"],
    [100, "100.0"],
    [1234567.125, "1234567.125"],
    [9007199254740993, "9007199254740992.0"],
  ];
  for (const [x, expected] of serdeJson) {
    assert.equal(formatFloat(x), expected, `formatFloat(${x})`);
  }
});

test("a number is a float where its field is named so, else by its value", () => {
  const value = { count: 3, mean: 3, max: 40.5, nested: [{ mean: 7 }], means: [1, 2.5], id: "v", none: null };
  assert.equal(
    stringify(value, ["mean", "means"]),
    '{"count":3,"mean":3.0,"max":40.5,"nested":[{"mean":7.0}],"means":[1.0,2.5],"id":"v","none":null}',
  );
  assert.equal(stringify({ big: 18446744073709551615n, neg: -0 }), '{"big":18446744073709551615,"neg":0}');
});

test("strings are escaped as serde_json escapes them, and absent fields left out", () => {
  assert.equal(stringify({ s: 'a"b\\c\n\t\u0001é/€', gone: undefined }), '{"s":"a\\"b\\\\c\\n\\t\\u0001é/€"}');
});

test("what JSON cannot hold is refused", () => {
  assert.throws(() => stringify({ x: NaN }), /cannot be stored as JSON/);
  assert.throws(() => stringify({ x: Infinity }), /cannot be stored as JSON/);
  assert.throws(() => stringify({ x: 2 ** 60 }), /past 2\^53/);
  assert.throws(() => stringify({ f: () => 1 }), /not something JSON holds/);
  assert.throws(() => stringify({ at: new Date(0) }), /a Date is not something JSON holds/);
  assert.throws(() => stringify({ bytes: new Uint8Array(2) }), /a Uint8Array is not something JSON holds/);
});

test("bytes that are not UTF-8 are refused", () => {
  assert.throws(() => parse(new Uint8Array([0x22, 0xff, 0x22])), TypeError, "not UTF-8");
});
