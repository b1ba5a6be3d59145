#!/usr/bin/env bash
# Sluice's entry point for people and CI.
#   ./dev.sh demo    set up, build, and run the vehicle demo on the embedded generator,
#                    deploying version 2 of its operator while it runs
#   ./dev.sh test    set up, build, and run the whole test suite (what CI runs)
#   ./dev.sh bench   set up, build, and run the benchmarks (throughput, checkpoints and restore,
#                    Kafka, hot swap)
# "Set up" installs what is missing: the wasm32-wasip2 target and Debian packages.
set -euo pipefail
cd "$(dirname "$0")"

# One target directory outside the clone, so fresh clones on the same machine
# (CI runs in one) build incrementally instead of from scratch.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/sluice/target}"
WASM_DIR="$CARGO_TARGET_DIR/wasm32-wasip2/release"
# Programs the tests run (installed once, then cached across clones).
TOOLS="$HOME/.cache/sluice/tools"
export PATH="$TOOLS/bin:$PATH"

setup() {
    local missing=()
    # rocksdb's bindings are generated with libclang.
    compgen -G "/usr/lib/llvm-*/lib/libclang*.so*" >/dev/null || missing+=(libclang-dev)
    command -v c++ >/dev/null || missing+=(g++)
    if [ ${#missing[@]} -gt 0 ]; then
        echo "setup: installing ${missing[*]}" >&2
        local sudo=""
        [ "$(id -u)" = 0 ] || sudo=sudo
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
    rustup target list --installed | grep -qx wasm32-wasip2 || rustup target add wasm32-wasip2
}

# The servers the tests run on loopback ports: an S3-compatible store (s3s-fs, ~2 min
# to build) and a Kafka-protocol broker (tansu with in-memory storage, ~12 min).
install_test_tools() {
    if ! command -v s3s-fs >/dev/null; then
        echo "setup: installing s3s-fs (the tests' S3 server) into $TOOLS" >&2
        CARGO_TARGET_DIR="$TOOLS/target" cargo install --locked --root "$TOOLS" s3s-fs --version 0.14.1 --features binary
    fi
    if ! command -v tansu >/dev/null; then
        echo "setup: installing tansu (the tests' Kafka broker) into $TOOLS" >&2
        CARGO_TARGET_DIR="$TOOLS/target" cargo install --locked --root "$TOOLS" tansu --version 0.6.0 --features dynostore
    fi
}

build_operators() {
    # Version 2 of vehicle-stats (the hot-swap tests deploy it over version 1) first:
    # both builds write vehicle_stats.wasm, so version 2 is kept under its own name.
    cargo build --release --target wasm32-wasip2 -p vehicle-stats --features v2
    cp "$WASM_DIR/vehicle_stats.wasm" "$WASM_DIR/vehicle_stats_v2.wasm"
    cargo build --release --target wasm32-wasip2 -p vehicle-stats -p probe
}

# The demo and the tests share one build. Building tests and binaries in one command
# resolves features exactly as `cargo test` does, so nothing (RocksDB above all) is
# built twice.
build_host() {
    cargo build --workspace --bins --tests
}

case "${1:-}" in
demo)
    setup
    build_operators
    build_host
    out=demo-out
    sluice="$CARGO_TARGET_DIR/debug/sluice"
    rm -rf "$out"
    mkdir -p "$out"
    "$sluice" run \
        --operator "$WASM_DIR/vehicle_stats.wasm" \
        --vehicles 10000 --count 1000000 --seed 42 --rate 100000 --partitions 4 \
        --state-dir "$out/state" --output "$out/outputs.jsonl" --dead-letter "$out/dead-letter.jsonl" \
        --report-interval 1 --admin 127.0.0.1:0 2> >(tee "$out/run.log" >&2) &
    job=$!
    # A few seconds in, version 2 of the operator is deployed into the running job.
    admin=""
    while [ -z "$admin" ] && kill -0 "$job" 2>/dev/null; do
        sleep 0.2
        admin=$(grep -so 'http://127\.0\.0\.1:[0-9]*' "$out/run.log" | head -n 1 || true)
    done
    if [ -z "$admin" ]; then
        wait "$job" # the job ended before its admin API came up: its exit status says why
        exit 1
    fi
    sleep 3
    echo "--- hot swap: sluice deploy vehicle_stats vehicle_stats_v2.wasm --admin $admin" >&2
    "$sluice" deploy vehicle_stats "$WASM_DIR/vehicle_stats_v2.wasm" --admin "$admin" >&2 || {
        wait "$job"
        exit 1
    }
    wait "$job"
    echo "--- outputs per operator version (grep '\"operator\"' $out/outputs.jsonl):"
    grep -o '"operator":"[^"]*"' "$out/outputs.jsonl" | sort | uniq -c
    echo "--- three vehicles' final summaries (sluice state dump --state-dir $out/state):"
    "$sluice" state dump --state-dir "$out/state" | head -n 3
    ;;
test)
    setup
    install_test_tools
    build_operators
    build_host
    cargo fmt --all -- --check
    cargo test --workspace
    ;;
bench)
    setup
    install_test_tools
    build_operators
    cargo bench -p sluice --bench throughput --bench checkpoint --bench kafka --bench swap
    ;;
*)
    echo "usage: $0 demo|test|bench" >&2
    exit 2
    ;;
esac
