/**
 * What a call reads of time and chance — `Date.now()`, `new Date()`, `performance.now()`,
 * `Math.random()` and `crypto.getRandomValues()` — made to depend on the record (or
 * timer, or expiry) the call is for, and on nothing else, so that a replay, a trap's
 * fresh instance and a handover's new owner decide as the first run did.
 *
 * A build without WASI (componentize-js -d) leaves the runtime the build's time, frozen,
 * and a random sequence fixed at build time that restarts in every new instance: what a
 * record drew then depended on how many records the instance had served before it. Here
 * the clock reads the record's event time (a timer's time in `fired`, an expiry's in
 * `expired`, the epoch in `init` and for a record without one), and the sequence restarts
 * at every call from a seed of the partition and offset (of the key, name and time for a
 * timer or expiry).
 *
 * This module owns those globals; `index.ts` says, before each call, what it is for.
 */

/** The moment's event time, ms since the epoch. */
let timeMs = 0;
/** What the call is for, until its first draw seeds the sequence from it: hashing at
 * every call instead would cost each record tens of µs in an interpreter, and most
 * records draw nothing. */
let unseeded: string | null = null;
/** sfc32's four words: the moment's random sequence. */
const words = new Uint32Array(4);

/** The call runs for what `seed` names, at event time `eventTimeMs`. */
export function enter(seed: string, eventTimeMs: number): void {
  timeMs = eventTimeMs > 0 ? eventTimeMs : 0;
  unseeded = seed;
}

/** Seeds the sequence from `seed`: four 32-bit FNV-1a hashes of it, from four offsets, as
 * sfc32's start, then sfc32's own warm-up, so that seeds alike in a few characters part. */
function seedFrom(seed: string): void {
  for (let w = 0; w < 4; w++) {
    let hash = (0x811c9dc5 ^ Math.imul(w + 1, 0x9e3779b9)) >>> 0;
    for (let i = 0; i < seed.length; i++) {
      hash = Math.imul(hash ^ seed.charCodeAt(i), 0x01000193) >>> 0;
    }
    words[w] = hash;
  }
  for (let i = 0; i < 12; i++) sfc32();
}

/** The next number of the moment's sequence, in [0, 1). */
function next(): number {
  if (unseeded !== null) {
    seedFrom(unseeded);
    unseeded = null;
  }
  return sfc32();
}

/** sfc32's next number, in [0, 1). */
function sfc32(): number {
  const [a, b, c, d] = words as unknown as [number, number, number, number];
  const t = (((a + b) >>> 0) + d) >>> 0;
  words[0] = b ^ (b >>> 9);
  words[1] = (c + (c << 3)) >>> 0;
  words[2] = (((c << 21) | (c >>> 11)) + t) >>> 0;
  words[3] = (d + 1) >>> 0;
  return t / 4294967296;
}

/** The runtime's own `Date`: what `new Date(…)` with arguments still makes. */
const RuntimeDate = Date;

/** `Date` with the moment's time where the runtime would read its clock. */
class MomentDate extends RuntimeDate {
  constructor(...args: ConstructorParameters<DateConstructor> | []) {
    if (args.length === 0) {
      super(timeMs);
    } else {
      super(...(args as ConstructorParameters<DateConstructor>));
    }
  }

  static override now(): number {
    return timeMs;
  }
}

/** The runtime's `performance`, whose clock traps in a build without WASI. */
declare const performance: { now(): number } | undefined;

/** The runtime's Web Crypto, where it has one. */
declare const crypto: { getRandomValues<T extends ArrayBufferView>(array: T): T } | undefined;

/** `crypto.getRandomValues`: the array's bytes from the moment's sequence. */
function getRandomValues<T extends ArrayBufferView>(array: T): T {
  const bytes = new Uint8Array(array.buffer, array.byteOffset, array.byteLength);
  for (let i = 0; i < bytes.length; i++) bytes[i] = Math.floor(next() * 256);
  return array;
}

Math.random = next;
globalThis.Date = MomentDate as DateConstructor;
if (typeof crypto !== "undefined") crypto.getRandomValues = getRandomValues;
if (typeof performance !== "undefined") performance.now = () => timeMs;
enter("init", 0);
