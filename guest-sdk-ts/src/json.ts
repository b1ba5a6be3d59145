/**
 * State values (in the JSON encoding, `encoding.ts`) and outputs as JSON, written exactly as the Rust SDK writes them
 * (serde_json: compact, fields in their order, strings escaped alike, floats in their
 * shortest round-trip digits, placed as serde_json places them), so a value one language wrote reads back the same in
 * another, and an output made from it is the same bytes.
 *
 * JavaScript has one number type where Rust and Python have two: an integral number is
 * written as an integer (`3`) unless its field is named in `floats`, where it is a float
 * (`3.0`), as serde_json writes an f64. A non-integral number is a float wherever it is.
 * This module has no imports, so it runs under Node as well as in a component.
 */

const encoder = new TextEncoder();
const decoder = new TextDecoder("utf-8", { fatal: true });

/** `value` as JSON bytes, as serde_json writes it; numbers under a field named in
 * `floats` (at any depth, array elements included) are written as floats. NaN and the
 * infinities, which JSON cannot hold, are refused, as are functions and symbols. Give
 * `floats` as a `Set` made once where values are written often: any other iterable is
 * made into one at each call. */
export function dumps(value: unknown, floats?: Iterable<string>): Uint8Array {
  return encoder.encode(stringify(value, floats));
}

/** `value` as a JSON string: see {@link dumps}. */
export function stringify(value: unknown, floats?: Iterable<string>): string {
  return write(value, false, floatSet(floats));
}

/** The JSON value `bytes` hold; bytes that are not UTF-8 are refused, as the Rust and
 * Python SDKs refuse them. */
export function parse(bytes: Uint8Array): unknown {
  return JSON.parse(decoder.decode(bytes));
}

const EMPTY: ReadonlySet<string> = new Set();

/** `floats` as a set: itself when it is one. */
export function floatSet(floats?: Iterable<string>): ReadonlySet<string> {
  if (floats === undefined) return EMPTY;
  return floats instanceof Set ? floats : new Set(floats);
}

function write(value: unknown, float: boolean, floats: ReadonlySet<string>): string {
  switch (typeof value) {
    case "string":
      // JSON.stringify escapes a string as serde_json does: `"`, `\`, \b \f \n \r \t and
      // the other control characters as \u00xx; nothing else.
      return JSON.stringify(value);
    case "number":
      return float || !Number.isInteger(value) ? formatFloat(value) : integer(value);
    case "bigint":
      return value.toString();
    case "boolean":
      return value ? "true" : "false";
    case "object": {
      if (value === null) return "null";
      const prototype = Object.getPrototypeOf(value);
      if (!Array.isArray(value) && prototype !== Object.prototype && prototype !== null) {
        // A Date, Map, Set or typed array would be written as {} or worse.
        throw new TypeError(`a ${prototype.constructor?.name ?? "object"} is not something JSON holds`);
      }
      // Concatenated, not joined: the runtime interprets this code, and a string built
      // with += is a rope it joins once.
      let out = "";
      if (Array.isArray(value)) {
        for (const item of value) {
          out += (out === "" ? "[" : ",") + write(item === undefined ? null : item, float, floats);
        }
        return out === "" ? "[]" : out + "]";
      }
      for (const key in value) {
        const item = (value as { [key: string]: unknown })[key];
        // An absent optional field, as serde's `skip_serializing_if` leaves it out.
        if (item === undefined || !Object.prototype.hasOwnProperty.call(value, key)) continue;
        out += (out === "" ? "{" : ",") + JSON.stringify(key) + ":" + write(item, floats.has(key), floats);
      }
      return out === "" ? "{}" : out + "}";
    }
    default:
      throw new TypeError(`a ${typeof value} is not something JSON holds`);
  }
}

function integer(x: number): string {
  if (!Number.isSafeInteger(x)) {
    throw new RangeError(`${x} is past 2^53: give it as a bigint to write it exactly`);
  }
  // -0 too is written "0", as serde_json writes an i64.
  return String(x);
}

/** `x` as serde_json prints an f64: the shortest digits that read back as `x` (which
 * JavaScript finds too), placed as serde_json places them — plain decimals from 1e-5 up
 * to 1e16 with a digit after the point, else `1e-7` or `1.5e+17`. */
export function formatFloat(x: number): string {
  if (!Number.isFinite(x)) {
    throw new RangeError(`${x} cannot be stored as JSON (it would read back as null)`);
  }
  const magnitude = Math.abs(x);
  // Where JavaScript writes plain decimals too (it does from 1e-6 to 1e21), it writes
  // these digits: the integral ones lack only the ".0".
  if (magnitude >= 1e-5 && magnitude < 1e16) return Number.isInteger(x) ? String(x) + ".0" : String(x);
  const sign = x < 0 || Object.is(x, -0) ? "-" : "";
  if (x === 0) return sign + "0.0";
  // toExponential() without a count gives the shortest round-trip digits.
  const [mantissa, exponent] = magnitude.toExponential().split("e");
  const digits = mantissa.replace(".", "");
  const length = digits.length;
  // 10^(kk-1) <= |x| < 10^kk, and |x| = digits × 10^k.
  const kk = Number(exponent) + 1;
  const k = kk - length;
  if (0 <= k && kk <= 16) return sign + digits + "0".repeat(k) + ".0";
  if (0 < kk && kk <= 16) return sign + digits.slice(0, kk) + "." + digits.slice(kk);
  if (-5 < kk && kk <= 0) return sign + "0." + "0".repeat(-kk) + digits;
  const e = kk - 1 < 0 ? `${kk - 1}` : `+${kk - 1}`;
  return length === 1 ? `${sign}${digits}e${e}` : `${sign}${digits[0]}.${digits.slice(1)}e${e}`;
}
