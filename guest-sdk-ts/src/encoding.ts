/**
 * How state values become bytes and back, as the Rust SDK's `encoding` module does it,
 * byte for byte: JSON by default (`json.ts`), or the compact binary encoding, MessagePack
 * with field names behind the byte 0xC1, as rmp-serde writes it. Reading tells them apart
 * by the first byte (0xC1 starts no JSON text), so an operator reads either whichever it
 * writes, and switching encodings across a hot swap needs no migration.
 *
 * Numbers follow `json.ts`'s rule in both: an integral number is an integer unless its
 * field is named in `floats`; a non-integral one is a float (an f64) wherever it is. A
 * bigint is an integer. This module imports nothing from the world, so it runs under Node
 * as well as in a component (`./dev.sh test` checks it against the vectors the Rust SDK is
 * checked against).
 */

import { dumps, floatSet, parse } from "./json.js";

/** The encodings `State.put` writes values in: `"json"`, readable in `sluice state dump`
 * as it is, or `"binary"` (MessagePack), which spends less on numbers in Rust. Either reads
 * both. */
export const ENCODINGS = ["json", "binary"] as const;
export type Encoding = (typeof ENCODINGS)[number];

/** The first byte of a value in the binary encoding. */
const BINARY_MARKER = 0xc1;

/** `value` as bytes in `encoding`; numbers under a field named in `floats` are floats. */
export function encode(value: unknown, encoding: Encoding, floats?: Iterable<string>): Uint8Array {
  if (encoding === "json") return dumps(value, floats);
  if (encoding === "binary") return dumpsBinary(value, floats);
  throw new TypeError(`encoding ${JSON.stringify(encoding)} is not one of ${ENCODINGS.join(", ")}`);
}

/** The value `bytes` (the state entry `name`'s) hold, whichever encoding wrote them. */
export function decode(name: string, bytes: Uint8Array): unknown {
  if (bytes[0] !== BINARY_MARKER) return parse(bytes);
  try {
    return loadsBinary(bytes);
  } catch (e) {
    throw new Error(`state ${JSON.stringify(name)}: ${e instanceof Error ? e.message : String(e)}`);
  }
}

/** `value` in the binary encoding: null, booleans, numbers, bigints within 64 bits,
 * strings, arrays and plain objects of them (NaN and the infinities too, which JSON
 * cannot hold). An `undefined` field is left out, an `undefined` element is nil, as
 * `dumps` writes them. */
export function dumpsBinary(value: unknown, floats?: Iterable<string>): Uint8Array {
  const out = new Writer();
  out.byte(BINARY_MARKER);
  out.value(value, false, floatSet(floats));
  return out.bytes.slice(0, out.length);
}

/** The value `bytes` (starting with the marker byte) hold in the binary encoding: maps
 * become objects, arrays arrays, integers numbers (bigints past 2^53), binaries
 * `Uint8Array`s. Truncated or left-over bytes, strings that are not UTF-8 and
 * MessagePack's extension types are errors. */
export function loadsBinary(bytes: Uint8Array): unknown {
  if (bytes[0] !== BINARY_MARKER) throw new Error("not the binary encoding (no 0xC1 marker)");
  const reader = new Reader(bytes);
  const value = reader.value();
  if (reader.at !== bytes.length) throw new Error(`${bytes.length - reader.at} bytes left over after the value`);
  return value;
}

const encoder = new TextEncoder();
const decoder = new TextDecoder("utf-8", { fatal: true });
const TWO_32 = 4294967296;
const MIN_SAFE = BigInt(Number.MIN_SAFE_INTEGER);
const MAX_SAFE = BigInt(Number.MAX_SAFE_INTEGER);

class Writer {
  bytes = new Uint8Array(256);
  view = new DataView(this.bytes.buffer);
  length = 0;

  /** Room for `n` more bytes. */
  private room(n: number): void {
    if (this.length + n <= this.bytes.length) return;
    const grown = new Uint8Array(Math.max(this.bytes.length * 2, this.length + n));
    grown.set(this.bytes.subarray(0, this.length));
    this.bytes = grown;
    this.view = new DataView(grown.buffer);
  }

  byte(b: number): void {
    this.room(1);
    this.bytes[this.length++] = b;
  }

  /** A marker and a big-endian unsigned number of `width` bytes (1, 2 or 4). */
  sized(marker: number, width: number, n: number): void {
    this.room(1 + width);
    this.bytes[this.length] = marker;
    if (width === 1) this.view.setUint8(this.length + 1, n);
    else if (width === 2) this.view.setUint16(this.length + 1, n);
    else this.view.setUint32(this.length + 1, n);
    this.length += 1 + width;
  }

  /** A string's, array's or map's header: the fixed form below `fixedBelow`, else the
   * 16- or 32-bit one (a string's has an 8-bit one first). */
  header(length: number, fixed: number, fixedBelow: number, sized16: number): void {
    if (length < fixedBelow) this.byte(fixed | length);
    else if (sized16 === 0xda && length < 256) this.sized(0xd9, 1, length);
    else if (length < 65536) this.sized(sized16, 2, length);
    else this.sized(sized16 + 1, 4, length);
  }

  value(value: unknown, float: boolean, floats: ReadonlySet<string>): void {
    switch (typeof value) {
      case "number":
        if (float || !Number.isInteger(value)) {
          this.room(9);
          this.bytes[this.length] = 0xcb;
          this.view.setFloat64(this.length + 1, value);
          this.length += 9;
        } else if (!Number.isSafeInteger(value)) {
          throw new RangeError(`${value} is past 2^53: give it as a bigint to write it exactly`);
        } else {
          this.integer(value);
        }
        return;
      case "bigint":
        if (value >= MIN_SAFE && value <= MAX_SAFE) this.integer(Number(value));
        else if (value >= 0n && value < 2n ** 64n) this.big(0xcf, value);
        else if (value < 0n && value >= -(2n ** 63n)) this.big(0xd3, value);
        else throw new RangeError(`${value} does not fit 64 bits`);
        return;
      case "string":
        this.string(value);
        return;
      case "boolean":
        this.byte(value ? 0xc3 : 0xc2);
        return;
      case "object": {
        if (value === null) return this.byte(0xc0);
        if (Array.isArray(value)) {
          this.header(value.length, 0x90, 16, 0xdc);
          for (const item of value) {
            if (item === undefined) this.byte(0xc0);
            else this.value(item, float, floats);
          }
          return;
        }
        const prototype = Object.getPrototypeOf(value);
        if (prototype !== Object.prototype && prototype !== null) {
          throw new TypeError(`a ${prototype.constructor?.name ?? "object"} is not something state holds`);
        }
        const fields = value as { [key: string]: unknown };
        let count = 0;
        for (const key in fields) {
          if (fields[key] !== undefined && Object.prototype.hasOwnProperty.call(fields, key)) count++;
        }
        this.header(count, 0x80, 16, 0xde);
        for (const key in fields) {
          const item = fields[key];
          if (item === undefined || !Object.prototype.hasOwnProperty.call(fields, key)) continue;
          this.string(key);
          this.value(item, floats.has(key), floats);
        }
        return;
      }
      default:
        throw new TypeError(`a ${typeof value} is not something state holds`);
    }
  }

  /** A whole number within 2^53, in the fewest bytes (non-negative ones as unsigned),
   * as rmp writes an integer of any width. */
  private integer(x: number): void {
    if (x >= 0) {
      if (x < 128) this.byte(x);
      else if (x < 256) this.sized(0xcc, 1, x);
      else if (x < 65536) this.sized(0xcd, 2, x);
      else if (x < TWO_32) this.sized(0xce, 4, x);
      else this.big(0xcf, BigInt(x));
    } else if (x >= -32) this.byte(x & 0xff);
    else if (x >= -128) this.sized(0xd0, 1, x & 0xff);
    else if (x >= -32768) this.sized(0xd1, 2, x & 0xffff);
    else if (x >= -2147483648) this.sized(0xd2, 4, x >>> 0);
    else this.big(0xd3, BigInt(x));
  }

  private big(marker: number, x: bigint): void {
    this.room(9);
    this.bytes[this.length] = marker;
    if (marker === 0xcf) this.view.setBigUint64(this.length + 1, x);
    else this.view.setBigInt64(this.length + 1, x);
    this.length += 9;
  }

  private string(s: string): void {
    // Field names and most values are short and ASCII: copied without an encoder.
    const n = s.length;
    if (n < 32) {
      this.room(1 + n);
      let i = 0;
      for (; i < n; i++) {
        const c = s.charCodeAt(i);
        if (c >= 0x80) break;
        this.bytes[this.length + 1 + i] = c;
      }
      if (i === n) {
        this.bytes[this.length] = 0xa0 | n;
        this.length += 1 + n;
        return;
      }
    }
    const utf8 = encoder.encode(s);
    this.header(utf8.length, 0xa0, 32, 0xda);
    this.room(utf8.length);
    this.bytes.set(utf8, this.length);
    this.length += utf8.length;
  }
}

class Reader {
  readonly view: DataView;
  at = 1;

  constructor(readonly bytes: Uint8Array) {
    this.view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  }

  /** The position past `n` more bytes, which must be there. */
  private take(n: number): number {
    const at = this.at;
    if (at + n > this.bytes.length) {
      throw new Error(`the value ends early: byte ${at} needs ${n}, ${this.bytes.length - at} are left`);
    }
    this.at = at + n;
    return at;
  }

  value(): unknown {
    const marker = this.bytes[this.take(1)];
    if (marker < 0x80) return marker;
    if (marker >= 0xe0) return marker - 256;
    if (marker >= 0xa0 && marker < 0xc0) return this.string(marker & 0x1f);
    if (marker < 0x90) return this.map(marker & 0x0f);
    if (marker < 0xa0) return this.array(marker & 0x0f);
    const view = this.view;
    switch (marker) {
      case 0xc0:
        return null;
      case 0xc2:
        return false;
      case 0xc3:
        return true;
      case 0xca:
        return view.getFloat32(this.take(4));
      case 0xcb:
        return view.getFloat64(this.take(8));
      case 0xcc:
        return view.getUint8(this.take(1));
      case 0xcd:
        return view.getUint16(this.take(2));
      case 0xce:
        return view.getUint32(this.take(4));
      case 0xcf:
        return exact(view.getBigUint64(this.take(8)));
      case 0xd0:
        return view.getInt8(this.take(1));
      case 0xd1:
        return view.getInt16(this.take(2));
      case 0xd2:
        return view.getInt32(this.take(4));
      case 0xd3:
        return exact(view.getBigInt64(this.take(8)));
      case 0xd9:
        return this.string(view.getUint8(this.take(1)));
      case 0xda:
        return this.string(view.getUint16(this.take(2)));
      case 0xdb:
        return this.string(view.getUint32(this.take(4)));
      case 0xc4:
        return this.binary(view.getUint8(this.take(1)));
      case 0xc5:
        return this.binary(view.getUint16(this.take(2)));
      case 0xc6:
        return this.binary(view.getUint32(this.take(4)));
      case 0xdc:
        return this.array(view.getUint16(this.take(2)));
      case 0xdd:
        return this.array(view.getUint32(this.take(4)));
      case 0xde:
        return this.map(view.getUint16(this.take(2)));
      case 0xdf:
        return this.map(view.getUint32(this.take(4)));
      default:
        throw new Error(`byte ${this.at - 1}: 0x${marker.toString(16)} is not a value this encoding writes`);
    }
  }

  private string(length: number): string {
    const at = this.take(length);
    // Short ASCII strings (field names above all) without a decoder: in the runtime's
    // interpreter a call to its native decoder costs more than this loop (measured).
    if (length < 32) {
      let s = "";
      for (let i = at; i < at + length; i++) {
        const c = this.bytes[i];
        if (c >= 0x80) return this.utf8(at, length);
        s += String.fromCharCode(c);
      }
      return s;
    }
    return this.utf8(at, length);
  }

  private utf8(at: number, length: number): string {
    try {
      return decoder.decode(this.bytes.subarray(at, at + length));
    } catch {
      throw new Error(`byte ${at}: a string that is not UTF-8`);
    }
  }

  private binary(length: number): Uint8Array {
    const at = this.take(length);
    return this.bytes.slice(at, at + length);
  }

  private array(length: number): unknown[] {
    const items: unknown[] = [];
    for (let i = 0; i < length; i++) items.push(this.value());
    return items;
  }

  private map(length: number): { [key: string]: unknown } {
    const fields: { [key: string]: unknown } = {};
    for (let i = 0; i < length; i++) {
      const key = String(this.value());
      const item = this.value();
      // `__proto__` as a field, as JSON.parse makes it, not the object's prototype.
      if (key === "__proto__") Object.defineProperty(fields, key, { value: item, enumerable: true, writable: true, configurable: true });
      else fields[key] = item;
    }
    return fields;
  }
}

/** A 64-bit integer as a number when that is exact, else as the bigint. */
function exact(x: bigint): number | bigint {
  return x >= MIN_SAFE && x <= MAX_SAFE ? Number(x) : x;
}
