// The imports of Sluice's `timed-operator` world (wit/operator.wit, package
// sluice:operator@0.1.3) as componentize-js binds them: list<u8> is a Uint8Array, u64
// and s64 are bigints, option<T> is T | undefined, and a result an import takes is
// `{ tag: "ok", val }` or `{ tag: "err", val }`. Written by hand from the WIT, which is
// the contract: keep them in step when it changes.

declare module "sluice:operator/types@0.1.3" {
  export interface Header {
    key: string;
    value: Uint8Array;
  }
  export interface InputRecord {
    key: Uint8Array;
    value: Uint8Array;
    timestampMs: bigint;
    partition: number;
    offset: bigint;
    headers: Header[];
  }
  export interface OutputRecord {
    key: Uint8Array;
    value: Uint8Array;
    topic?: string;
  }
}

declare module "sluice:operator/state@0.1.3" {
  export function get(name: string): Uint8Array | undefined;
  export function put(name: string, value: Uint8Array): void;
  export function putWithTtl(name: string, value: Uint8Array, ttlMs: bigint): void;
  function delete_(name: string): void;
  export { delete_ as delete };
}

declare module "sluice:operator/timers@0.1.3" {
  export function set(name: string, atMs: bigint): void;
  export function cancel(name: string): void;
  export function now(): bigint;
  export function markLate(): void;
}

declare module "sluice:operator/log@0.1.3" {
  export type Level = "trace" | "debug" | "info" | "warn" | "error";
  export function log(level: Level, message: string): void;
}

declare module "sluice:operator/batch@0.1.3" {
  import type { OutputRecord } from "sluice:operator/types@0.1.3";
  export type Outcome = { tag: "ok"; val: OutputRecord[] } | { tag: "err"; val: string };
  export function finish(outcome: Outcome): void;
}
