/**
 * Write Sluice stream operators in TypeScript: records, keyed state with TTLs, timers
 * and outputs over the `timed-operator` world of Sluice's WIT package
 * (`wit/operator.wit`), built into a component by componentize-js.
 *
 * An operator is a module that hands its functions to {@link operator} and exports
 * what it returns, under the names the world's exports have:
 *
 * ```ts
 * import { Output, operator } from "./sluice-operator/index.js";
 *
 * export const { init, process, processBatch, expired, fired } = operator({
 *   process(record, state) {
 *     const count = (state.get<number>("count") ?? 0) + 1;
 *     state.put("count", count);
 *     return [new Output(record.key, { count })];
 *   },
 * });
 * ```
 *
 * This module owns the TypeScript side of the contract: reading records, the state's
 * value encodings (`encoding.ts`: JSON, or MessagePack, as the Rust and Python SDKs
 * write them, byte for byte) and outputs; before each call it tells `moment.ts` what the call is for, which the
 * runtime's clocks and randomness then read. It decides nothing the host decides (which
 * key a call is scoped to, when writes commit, what a failure costs): an exception
 * `process` throws fails that record alone, which the host sends to the dead letters
 * with the message.
 */

import * as stateImports from "sluice:operator/state@0.1.3";
import * as timerImports from "sluice:operator/timers@0.1.3";
import * as logImports from "sluice:operator/log@0.1.3";
import { finish, type Outcome } from "sluice:operator/batch@0.1.3";
import type { InputRecord, OutputRecord } from "sluice:operator/types@0.1.3";
import { ENCODINGS, decode, encode, type Encoding } from "./encoding.js";
import { dumps, parse } from "./json.js";
import { enter } from "./moment.js";

export { ENCODINGS, decode, encode, type Encoding } from "./encoding.js";
export { dumps, floatSet, formatFloat, parse, stringify } from "./json.js";

const decoder = new TextDecoder();
const encoder = new TextEncoder();

/** The record being processed: its key and value as bytes, its event time (ms since the
 * epoch, 0 when the source had none), and where it came from. */
export class Record {
  readonly key: Uint8Array;
  readonly value: Uint8Array;
  readonly timestampMs: number;
  readonly partition: number;
  readonly offset: number;

  constructor(input: InputRecord) {
    this.key = input.key;
    this.value = input.value;
    this.timestampMs = Number(input.timestampMs);
    this.partition = input.partition;
    this.offset = Number(input.offset);
  }

  /** The key as text (UTF-8). */
  keyText(): string {
    return decoder.decode(this.key);
  }

  /** The value parsed as JSON (refused unless it is UTF-8). */
  json<T = any>(): T {
    return parse(this.value) as T;
  }
}

/** Thrown by `process` for a record that came after the windows it belongs to closed:
 * the host sends it to the dead letters as `late`, not `rejected`. */
export class Late extends Error {
  override name = "Late";
}

/** A state entry whose TTL ran out: its key, name and the bytes it held, and when it
 * expired on the partition's clock. The host removed it before `expired` is called. */
export class Expired {
  constructor(
    readonly key: Uint8Array,
    readonly name: string,
    readonly value: Uint8Array,
    readonly expiredAtMs: number,
  ) {}

  /** The value it held, decoded as `State.get` decodes. */
  json<T = any>(): T {
    return decode(this.name, this.value) as T;
  }
}

/** A timer that came due: its key, name and the time it was set for. */
export class Timer {
  constructor(
    readonly key: Uint8Array,
    readonly name: string,
    readonly atMs: number,
  ) {}

  /** The key as text (UTF-8). */
  keyText(): string {
    return decoder.decode(this.key);
  }
}

/** How a value is put: `ttlMs` to expire that long after the partition's clock now
 * (else as the host's `[ttl]` says); `floats`, the fields whose numbers are floats
 * (see `json.ts`; a `Set` made once costs nothing per call). */
export interface PutOptions {
  ttlMs?: number;
  floats?: Iterable<string>;
}

/** The state of the current record's key: named values, in the operator's
 * `stateEncoding` (JSON unless it says `"binary"`), each with a TTL if given; and the
 * key's timers. */
export class State {
  constructor(readonly encoding: Encoding = "json") {}

  /** The value stored under `name`, decoded from whichever encoding wrote it, or
   * undefined. */
  get<T = any>(name: string): T | undefined {
    const stored = stateImports.get(name);
    return stored === undefined ? undefined : (decode(name, stored) as T);
  }

  /** Stores `value` (null, booleans, numbers, bigints, strings, arrays and plain objects
   * of them) under `name` in the state's encoding, as `options` say. */
  put(name: string, value: unknown, options: PutOptions = {}): void {
    this.putBytes(name, encode(value, this.encoding, options.floats), options);
  }

  /** The bytes stored under `name`, or undefined. */
  getBytes(name: string): Uint8Array | undefined {
    return stateImports.get(name);
  }

  /** Stores `value` under `name` as it is; `ttlMs` as for `put`. */
  putBytes(name: string, value: Uint8Array, options: { ttlMs?: number } = {}): void {
    if (options.ttlMs === undefined) {
      stateImports.put(name, value);
    } else {
      stateImports.putWithTtl(name, value, BigInt(options.ttlMs));
    }
  }

  /** Removes the value under `name`, if any. */
  delete(name: string): void {
    stateImports.delete(name);
  }

  /** Sets the key's timer `name` to fire at `atMs` on the partition's clock, replacing
   * the time it had; `fired` is called then. */
  setTimer(name: string, atMs: number): void {
    timerImports.set(name, BigInt(atMs));
  }

  /** Cancels the key's timer `name`, if set. */
  cancelTimer(name: string): void {
    timerImports.cancel(name);
  }

  /** The partition's clock, ms since the epoch: event time less the host's `[ttl]
   * lateness` (the watermark), 0 before the first record with a time. */
  now(): number {
    return Number(timerImports.now());
  }
}

/** A record to send: its key, and its value — bytes as they are, anything else as JSON
 * ({@link dumps}, with `floats`) — to the job's sink or to `topic`. */
export class Output {
  readonly key: Uint8Array;
  readonly value: Uint8Array;
  readonly topic?: string;

  constructor(key: string | Uint8Array, value: unknown, options: { floats?: Iterable<string>; topic?: string } = {}) {
    this.key = typeof key === "string" ? encoder.encode(key) : key;
    this.value = value instanceof Uint8Array ? value : dumps(value, options.floats);
    this.topic = options.topic;
  }
}

/** The whole number `config` gives `name` (its `[operator.config]` value), or
 * `fallback` when it gives none; anything else is an error, which refuses `init`. */
export function configInt(config: { [name: string]: string }, name: string, fallback: number): number {
  const value = config[name];
  if (value === undefined) return fallback;
  if (!/^-?[0-9]+$/.test(value.trim()) || !Number.isSafeInteger(Number(value))) {
    throw new TypeError(`[operator.config] ${name} = ${JSON.stringify(value)} is not a whole number`);
  }
  return Number(value);
}

/** A level of the host's log. */
export type Level = logImports.Level;

/** Writes `message` to the host's log at `level`, named with the operator's version and
 * partition and bounded like every operator's lines (`[operator.limits]
 * log_lines_per_s`, `log_bytes_per_s`, `log_line_bytes`). `console.log` is no way to
 * log: a build without WASI's stdio (the one `./build.sh` makes) drops it. */
export function log(message: string, level: Level = "info"): void {
  logImports.log(level, String(message));
}

/** What an operator does: `process` for each record, and if it wants them `init` once
 * per instance (with the `[operator.config]` table), `expired` for each entry whose TTL
 * ran out and `fired` for each of its timers that came due. Each returns the outputs. */
export interface Handlers {
  process(record: Record, state: State): Output[];
  init?(config: { [name: string]: string }): void;
  expired?(entry: Expired, state: State): Output[];
  fired?(timer: Timer, state: State): Output[];
}

/** How an operator keeps its state: `stateEncoding`, how `State.put` writes (`"json"`
 * unless given; see {@link Encoding}). */
export interface Options {
  stateEncoding?: Encoding;
}

/** The exports of the `timed-operator` world, calling `handlers`: an exception fails
 * that record, expiry or timer alone (its message is the dead letter's, and its writes
 * are discarded); a {@link Late} one marks a record late. */
export function operator(handlers: Handlers, options: Options = {}) {
  const { stateEncoding = "json" } = options;
  if (!ENCODINGS.includes(stateEncoding)) {
    throw new TypeError(`stateEncoding ${JSON.stringify(stateEncoding)} is not one of ${ENCODINGS.join(", ")}`);
  }
  const state = new State(stateEncoding);

  // componentize-js makes a thrown string a call's `err`.
  const failed = (e: unknown): string => (e instanceof Error ? `${e.name}: ${e.message}` : String(e));

  const outcome = (call: () => Output[]): OutputRecord[] => {
    try {
      return call().map((o) => ({ key: o.key, value: o.value, topic: o.topic }));
    } catch (e) {
      if (e instanceof Late) {
        timerImports.markLate();
        throw e.message;
      }
      throw failed(e);
    }
  };

  // What a call is for, which the clock and `Math.random()` read (moment.ts).
  const record = (input: InputRecord): Record => {
    const read = new Record(input);
    enter(`r/${read.partition}/${read.offset}`, read.timestampMs);
    return read;
  };
  const due = (kind: string, key: Uint8Array, name: string, atMs: bigint): void => {
    enter(`${kind}/${Array.from(key, (b) => b.toString(16).padStart(2, "0")).join("")}/${name}/${atMs}`, Number(atMs));
  };

  return {
    init(config: [string, string][]): void {
      enter("init", 0);
      try {
        handlers.init?.(Object.fromEntries(config));
      } catch (e) {
        throw failed(e);
      }
    },

    process(input: InputRecord): OutputRecord[] {
      return outcome(() => handlers.process(record(input), state));
    },

    processBatch(inputs: InputRecord[]): void {
      for (const input of inputs) {
        let result: Outcome;
        try {
          result = { tag: "ok", val: outcome(() => handlers.process(record(input), state)) };
        } catch (e) {
          result = { tag: "err", val: String(e) };
        }
        finish(result);
      }
    },

    expired(key: Uint8Array, name: string, value: Uint8Array, expiredAtMs: bigint): OutputRecord[] {
      const expired = handlers.expired;
      if (expired === undefined) return [];
      due("expired", key, name, expiredAtMs);
      return outcome(() => expired(new Expired(key, name, value, Number(expiredAtMs)), state));
    },

    fired(key: Uint8Array, name: string, atMs: bigint): OutputRecord[] {
      const fired = handlers.fired;
      if (fired === undefined) return [];
      due("timer", key, name, atMs);
      return outcome(() => fired(new Timer(key, name, Number(atMs)), state));
    },
  };
}
