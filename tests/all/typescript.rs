//! Operators in TypeScript, through the real binary: vehicle-stats written in TypeScript
//! (`operators/vehicle-stats-ts` over the TypeScript SDK, `guest-sdk-ts`, compiled by tsc
//! and built by componentize-js with every WASI feature off) writes the state and the
//! outputs the Rust build writes, byte for byte, its TTLs and `expired` callbacks
//! included; speed-windows and sessions on the TypeScript SDK's windows close what the
//! Rust builds close, late records included; run as the canary of the Rust build for half
//! the keys, vehicle-stats takes exactly those and changes no byte of the outputs or the
//! state; a running job is deployed from the Rust build to it and rolled back, each
//! vehicle's count going on one by one. The attacker in TypeScript (`tests/evil-ts`) is
//! contained attack by attack.

use crate::checkpoint_restore::stderr;
use crate::hot_swap::SEED;
use crate::languages::{
    assert_attacks_stopped, assert_canary_over_rust_changes_no_byte, assert_sessions_agree, assert_speed_windows_agree,
    assert_swap_from_rust_and_back, assert_vehicle_stats_agree, outputs_without_version, write_attacks,
};
use anyhow::Result;
use serde_json::{Value, json};
use sluice::events::{LOG_LINES_DROPPED, RETRYING};
use sluice_e2e::*;

#[test]
fn vehicle_stats_in_typescript_writes_what_the_rust_build_writes_byte_for_byte() -> Result<()> {
    assert_vehicle_stats_agree("vehicle_stats_ts")
}

#[test]
fn speed_windows_in_typescript_writes_what_the_rust_build_writes_byte_for_byte() -> Result<()> {
    assert_speed_windows_agree("speed_windows_ts")
}

#[test]
fn sessions_in_typescript_close_what_the_rust_build_closes() -> Result<()> {
    assert_sessions_agree("sessions_ts")
}

/// speed-windows in TypeScript over 10,000 vehicles in one partition, under the default
/// memory cap of 64 MiB: SpiderMonkey's garbage reaches the cap between two of its
/// collections every 20,000 records or so, mostly inside a `fired` call, which the host
/// calls again in a fresh instance as it calls a record again — so no window is lost,
/// and the outputs and state are the Rust build's.
#[test]
fn speed_windows_in_typescript_under_the_memory_cap_loses_no_window() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    let input = dir.join("input.jsonl");
    generate(&input, 10_000, 26_000, SEED)?;
    let mut logs = Vec::new();
    for build in ["speed_windows", "speed_windows_ts"] {
        let out = dir.join(build);
        let run = run_ok(run_file_job(&operator_wasm(build), &input, &out, 1).env("SLUICE_LOG", "info"))?;
        logs.push(stderr(&run));
        assert!(read_jsonl(&out.join("dead.jsonl"))?.is_empty(), "{build}: no dead letter");
    }
    let trapped = "exceeded its memory limit of 64 MiB";
    assert!(logs[1].contains(RETRYING) && logs[1].contains(trapped), "the cap was reached: {}", logs[1]);
    let (rust, typescript) = (dir.join("speed_windows"), dir.join("speed_windows_ts"));
    assert_eq!(outputs_without_version(&typescript)?, outputs_without_version(&rust)?);
    assert_eq!(dump_state_lines(&typescript.join("state"))?, dump_state_lines(&rust.join("state"))?);
    Ok(())
}

/// A TypeScript build as the canary of the Rust build for half the keys: see
/// [`assert_canary_over_rust_changes_no_byte`].
#[test]
fn a_typescript_canary_over_the_rust_build_takes_its_keys_and_changes_no_byte() -> Result<()> {
    assert_canary_over_rust_changes_no_byte("vehicle_stats_ts")
}

#[test]
fn a_running_job_swaps_from_rust_to_typescript_and_back_and_every_count_goes_on() -> Result<()> {
    assert_swap_from_rust_and_back("vehicle_stats_ts")
}

/// The attacker in TypeScript (`tests/evil-ts`, built with every WASI feature off): each
/// attack that breaks something — spinning, allocating, recursing without end, fetching a
/// file or a URL — costs its record alone, a dead letter saying what stopped it; the clock
/// it reads (`Date.now()`, `new Date()`, `performance.now()`) is the record's event time, and `Math.random()`
/// a sequence the SDK seeds per record, so two runs decide alike, and a record draws the
/// same whatever its instance drew before; 100,000 `console.log` lines go nowhere, and its
/// flood of log lines through the SDK is cut at the rate; the records around the attacks
/// count on.
#[test]
fn the_attacks_of_an_operator_in_typescript_each_cost_their_record_with_a_clear_reason() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    let actions = ["count", "spin", "hog", "recurse", "fetch", "clock", "clock", "print-flood", "log-flood"];
    let input = dir.join("input.jsonl");
    write_attacks(&input, &actions)?;
    let mut runs = Vec::new();
    for run in ["first", "again"] {
        let out = dir.join(run);
        let ran = run_ok(run_file_job(&operator_wasm("evil_ts"), &input, &out, 1).env("SLUICE_LOG", "warn"))?;
        assert!(stderr(&ran).contains(LOG_LINES_DROPPED), "{}", stderr(&ran));
        assert!(!stderr(&ran).contains("flood 1000"), "console.log reaches nothing: {}", stderr(&ran));
        runs.push(read_jsonl(&out.join("out.jsonl"))?.into_iter().map(|o| o["value"].clone()).collect::<Vec<Value>>());
        let reasons = [
            ("spin", "exceeded its CPU deadline of 1s"),
            ("hog", "exceeded its memory limit of 64 MiB"),
            ("recurse", "InternalError: too much recursion"),
            ("fetch", "operator called `[constructor]fields` (WASI, through its JavaScript runtime)"),
            ("fetch", "(componentize-js -d)"),
            ("fetch", "`fetch` has nothing behind it"),
        ];
        assert_attacks_stopped(&out, &actions, &reasons, 4)?;
    }
    let outputs = &runs[0];
    assert_eq!(outputs.len(), 5, "{outputs:?}");
    assert_eq!(
        [&outputs[0], &outputs[3], &outputs[4]],
        [&json!({"count": 1}), &json!({"count": 2}), &json!({"count": 3})]
    );
    // The clock is the record's event time; randomness the record's own.
    let (first, second) = (&outputs[1], &outputs[2]);
    for (output, time) in [(first, 1_005_000), (second, 1_006_000)] {
        let read = [&output["date"], &output["now"], &output["performance"]];
        assert_eq!(read, [&json!(time); 3], "{output}");
    }
    assert_ne!(first["random"], second["random"], "each record its own draw");
    assert_eq!(runs[0], runs[1], "two runs decide alike");
    // A record draws the same whatever the instance drew before it: here nothing.
    let mut counted = actions;
    counted[5] = "count";
    write_attacks(&input, &counted)?;
    let out = dir.join("counted");
    run_ok(&mut run_file_job(&operator_wasm("evil_ts"), &input, &out, 1))?;
    let outputs: Vec<Value> = read_jsonl(&out.join("out.jsonl"))?.into_iter().map(|o| o["value"].clone()).collect();
    let drawn = outputs.iter().find(|o| o.get("random").is_some()).map(|o| &o["random"]);
    assert_eq!(drawn, Some(&second["random"]), "{outputs:?}");
    Ok(())
}

/// The TypeScript guide's examples are the operators' code: each piece of each `ts` block
/// (pieces are parted by `// …` lines) is in an `operators/*-ts/app.ts`.
#[test]
fn the_typescript_guides_examples_are_code_the_tests_run() -> Result<()> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let guide = std::fs::read_to_string(root.join("docs/operator-guide-typescript.md"))?;
    let mut apps = Vec::new();
    for app in ["vehicle-stats-ts", "speed-windows-ts", "sessions-ts"] {
        apps.push(std::fs::read_to_string(root.join("operators").join(app).join("app.ts"))?);
    }
    let blocks: Vec<&str> = guide.split("```ts\n").skip(1).filter_map(|rest| rest.split("```").next()).collect();
    assert_eq!(blocks.len(), 2, "the guide's TypeScript examples");
    for piece in blocks.iter().flat_map(|block| block.split("\n// …\n")).map(|piece| piece.trim_end()) {
        assert!(apps.iter().any(|app| app.contains(piece)), "not in any operators/*-ts/app.ts:\n{piece}");
    }
    Ok(())
}
