"""The tests' attacker in Python: an operator that tries to break out of the sandbox or
exhaust the host, one attack per record, kept under tests/ beside the Rust probe. Not an
example to copy.

Each record's value is JSON {"action": ...}:
- count: counts the key's records in state and emits the count (the control);
- spin: loops forever (the CPU deadline stops it);
- hog: allocates without bound (the memory cap stops it);
- recurse: recurses without bound;
- read-file: opens a file of the machine;
- socket: opens a network socket;
- clock: reads the wall clock;
- environ: reads the environment;
- print-flood: prints a million lines to stdout;
- log-flood: logs 10,000 lines through the SDK's `log` (past its rate the host drops
  them), then counts;
and, for its build with WASI (componentize-py without -s) under the deterministic WASI:
- random: emits 16 bytes of os.urandom;
- chance: emits `random.random()` (any build);
- monotonic: emits the monotonic clock;
- sleep: sleeps a second;
- print: prints a line to stderr and 10,000 to stdout, then counts.
"""

import sys

from sluice_operator import Output, log, operator


def recurse(n):
    return recurse(n + 1) + 1


def count(record, state):
    count = (state.get("count") or 0) + 1
    state.put("count", count)
    return [Output(record.key, {"count": count})]


def process(record, state):
    action = record.json()["action"]
    if action == "count":
        return count(record, state)
    if action == "spin":
        while True:
            pass
    if action == "hog":
        hoard = []
        while True:
            hoard.append(bytearray(1 << 20))
    if action == "recurse":
        sys.setrecursionlimit(1_000_000)
        recurse(0)
    if action == "read-file":
        with open("/etc/passwd") as f:
            return [Output(record.key, {"read": f.read()})]
    if action == "socket":
        import socket

        socket.create_connection(("127.0.0.1", 80))
    if action == "clock":
        import time

        return [Output(record.key, {"time": time.time()})]
    if action == "environ":
        import os

        return [Output(record.key, {"environ": dict(os.environ)})]
    if action == "print-flood":
        for i in range(1_000_000):
            print("flood", i)
    if action == "log-flood":
        for i in range(10_000):
            log(f"flood {i}", "warn")
        return count(record, state)
    if action == "random":
        import os

        return [Output(record.key, {"random": os.urandom(16).hex()})]
    if action == "chance":
        import random

        return [Output(record.key, {"chance": random.random()})]
    if action == "monotonic":
        import time

        return [Output(record.key, {"monotonic_ns": time.monotonic_ns()})]
    if action == "sleep":
        import time

        time.sleep(1)
    if action == "print":
        print("to stderr", file=sys.stderr)
        for i in range(10_000):
            print("printed", i)
        return count(record, state)
    raise ValueError(f"unknown action {action!r}")


WitWorld = operator(process)
