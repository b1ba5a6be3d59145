/**
 * The tests' attacker in TypeScript: an operator that tries to break out of the sandbox or
 * exhaust the host, one attack per record, kept under tests/ beside the Rust probe and the
 * Python attacker. Not an example to copy.
 *
 * Each record's value is JSON {"action": ...}:
 * - count: counts the key's records in state and emits the count (the control);
 * - spin: loops forever (the CPU deadline stops it);
 * - hog: allocates without bound (the memory cap stops it);
 * - recurse: recurses without bound;
 * - fetch: fetches a URL of the machine (a file, then a socket);
 * - clock: reads the clocks (`Date.now()`, `new Date()`, `performance.now()`) and
 *   `Math.random()`, and emits them;
 * - print-flood: writes 100,000 lines with console.log, then counts;
 * - log-flood: logs 10,000 lines through the SDK's `log` (past its rate the host drops
 *   them), then counts.
 */

import { Output, log, operator } from "./sluice-operator/index.js";

declare const console: { log(...items: unknown[]): void };
declare function fetch(url: string): unknown;
declare const performance: { now(): number };

function recurse(n: number): number {
  return recurse(n + 1) + 1;
}

export const { init, process, processBatch, expired, fired } = operator({
  process(record, state) {
    const count = () => {
      const n = (state.get<number>("count") ?? 0) + 1;
      state.put("count", n);
      return [new Output(record.key, { count: n })];
    };
    const action = record.json<{ action: string }>().action;
    switch (action) {
      case "count":
        return count();
      case "spin":
        for (;;) {}
      case "hog": {
        const hoard: Uint8Array[] = [];
        for (;;) hoard.push(new Uint8Array(1 << 20).fill(1));
      }
      case "recurse":
        return [new Output(record.key, { depth: recurse(0) })];
      case "fetch":
        return [new Output(record.key, { file: String(fetch("file:///etc/passwd")), socket: String(fetch("http://127.0.0.1:80/")) })];
      case "clock":
        return [
          new Output(record.key, {
            date: Date.now(),
            now: new Date().getTime(),
            performance: performance.now(),
            random: Math.random(),
          }),
        ];
      case "print-flood":
        for (let i = 0; i < 100_000; i++) console.log("flood", i);
        return count();
      case "log-flood":
        for (let i = 0; i < 10_000; i++) log(`flood ${i}`, "warn");
        return count();
    }
    throw new Error(`unknown action ${JSON.stringify(action)}`);
  },
});
