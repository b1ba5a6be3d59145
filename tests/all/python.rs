//! Operators in Python, through the real binary: vehicle-stats written in Python
//! (`operators/vehicle-stats-py` over the Python SDK, `guest-sdk-python`, built by
//! componentize-py with WASI stubbed out) writes the state and the outputs the Rust build
//! writes, byte for byte, its TTLs and `expired` callbacks included; a running job is deployed from the Rust build to the Python one
//! and rolled back, each vehicle's count going on one by one across both switches; the
//! same app built the way componentize-py builds by default, importing WASI, is refused
//! by the sandbox with the import it called named. speed-windows on the Python SDK's
//! windows writes what the Rust build writes, late records included; a Python build run as
//! the shadow of the Rust one compares every output equal, and one run as a canary for half
//! the keys takes exactly those and changes no byte of the outputs or the state. Timers from
//! Python (`operators/idle-py`): its fixture passes `sluice test`, and over a fleet whose
//! vehicles leave, each leaving vehicle's timer fires once, at its time. The attacker in
//! Python (`tests/evil-py`) is contained attack by attack, each with a clear dead letter; a
//! restarted job reads its Python build compiled instead of compiling it again. What every
//! language's build must do beside the Rust one is in `languages`.

use crate::checkpoint_restore::stderr;
use crate::hot_swap::SEED;
use crate::languages::{
    assert_attacks_stopped, assert_canary_over_rust_changes_no_byte, assert_sessions_agree, assert_speed_windows_agree,
    assert_swap_from_rust_and_back, assert_vehicle_stats_agree, outputs_without_version, write_attacks,
};
use crate::shadow::{file_job, reported_shadow, reported_skipped};
use anyhow::Result;
use serde_json::Value;
use serde_json::json;
use sluice::events::{COMPILED, LOG_LINES_DROPPED, READ_COMPILED};
use sluice_e2e::*;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

#[test]
fn vehicle_stats_in_python_writes_what_the_rust_build_writes_byte_for_byte() -> Result<()> {
    assert_vehicle_stats_agree("vehicle_stats_py")
}

#[test]
fn speed_windows_in_python_writes_what_the_rust_build_writes_byte_for_byte() -> Result<()> {
    assert_speed_windows_agree("speed_windows_py")
}

#[test]
fn sessions_in_python_close_what_the_rust_build_closes() -> Result<()> {
    assert_sessions_agree("sessions_py")
}

/// A Python build deployed as the shadow of the running Rust build: every output it makes
/// — records', timers' (speed-windows) and expiries' (vehicle-stats leaving the fleet) —
/// compares equal to the Rust build's, record by record.
#[test]
fn a_python_shadow_of_the_rust_build_compares_every_output_equal() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let input = dir.path().join("input.jsonl");
    generate_edited(&input, &["--vehicles", "40", "--count", "6000", "--churn", "25"], every_100_ms)?;
    for (operator, more) in
        [("speed_windows", ""), ("vehicle_stats", "[operator.config]\nleft_fleet_after_ms = \"20000\"")]
    {
        let dir = dir.path().join(operator);
        let config = file_job(&dir, operator, &input, more)?;
        let python = operator_wasm(&format!("{operator}_py"));
        run_ok(sluice().args(["deploy", operator]).arg(python).arg("--shadow").arg("--config").arg(&config))?;
        let log = String::from_utf8(run_ok(sluice().arg("run").arg("--config").arg(&config))?.stderr)?;
        let [compared, equal, rest @ ..] = reported_shadow(&log)?;
        // A shadow slower than the live version skips records beyond its share of the
        // partition's time; what it compared is all equal.
        let skipped = reported_skipped(&log)?;
        assert!(
            compared + skipped >= 6000 && compared > 0 && equal == compared && rest == [0; 5],
            "{operator}: {compared} compared, {equal} equal, {rest:?}, {skipped} skipped:\n{log}"
        );
    }
    Ok(())
}

/// The attacker in Python (`tests/evil-py`, built with WASI stubbed out): each attack —
/// spinning, allocating, recursing without end, opening a file or a socket, reading the
/// clock, printing a flood — costs its record alone, a dead letter saying what stopped
/// it; the environment it reads is empty; its flood of log lines through the SDK is cut
/// at the rate; the records around the attacks count on.
#[test]
fn the_attacks_of_an_operator_in_python_each_cost_their_record_with_a_clear_reason() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    let actions =
        ["count", "spin", "hog", "recurse", "read-file", "socket", "clock", "environ", "print-flood", "log-flood"];
    let input = dir.join("input.jsonl");
    write_attacks(&input, &actions)?;
    let ran = run_ok(run_file_job(&operator_wasm("evil_py"), &input, dir, 1).env("SLUICE_LOG", "warn"))?;
    let outputs: Vec<Value> = read_jsonl(&dir.join("out.jsonl"))?.into_iter().map(|o| o["value"].clone()).collect();
    let expected = [json!({"count": 1}), json!({"environ": {}}), json!({"count": 2})];
    assert_eq!(outputs, expected, "the control records, and an empty environment");
    let stubbed = "which this build stubs out with a trap (componentize-py -s)";
    let reasons = [
        ("spin", "exceeded its CPU deadline of 1s"),
        ("hog", "exceeded its memory limit of 64 MiB"),
        ("recurse", "exceeded its memory limit of 64 MiB"),
        ("read-file", stubbed),
        ("socket", stubbed),
        ("clock", "`wall_clock_now` (WASI, through its libc)"),
        ("clock", "`state.now()`"),
        ("print-flood", "`stdout_get_stdout` (WASI, through its libc)"),
        ("print-flood", "the SDK's `log`"),
    ];
    assert_attacks_stopped(dir, &actions, &reasons, 7)?;
    assert!(stderr(&ran).contains(LOG_LINES_DROPPED), "{}", stderr(&ran));
    Ok(())
}

/// A Python build as the canary of the Rust build for half the keys: see
/// [`assert_canary_over_rust_changes_no_byte`].
#[test]
fn a_python_canary_over_the_rust_build_takes_its_keys_and_changes_no_byte() -> Result<()> {
    assert_canary_over_rust_changes_no_byte("vehicle_stats_py")
}

#[test]
fn a_running_job_swaps_from_rust_to_python_and_back_and_every_count_goes_on() -> Result<()> {
    assert_swap_from_rust_and_back("vehicle_stats_py")
}

#[test]
fn a_python_build_that_imports_wasi_is_refused_with_the_import_named() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let input = dir.path().join("input.jsonl");
    generate(&input, 10, 100, SEED)?;
    let error = run_err(&mut run_file_job(&operator_wasm("vehicle_stats_py_wasi"), &input, dir.path(), 1))?;
    // CPython's start-up reads the environment: the first WASI call it makes.
    assert!(
        error.contains("`wasi:cli/environment@0.2.9#get-environment` is denied by the sandbox"),
        "the refusal names the import:\n{error}"
    );
    assert!(error.contains("[operator] wasi = \"deterministic\""), "and says what runs it:\n{error}");
    assert!(!dir.path().join("out.jsonl").exists() || read_jsonl(&dir.path().join("out.jsonl"))?.is_empty());
    Ok(())
}

/// Runs `build` over `input` in `dir` on one partition with `[operator] wasi =
/// "deterministic"` and `SLUICE_LOG=info`; returns what it wrote to stderr.
fn run_under_deterministic_wasi(build: &str, input: &Path, dir: &Path) -> Result<String> {
    std::fs::create_dir_all(dir)?;
    let (wasm, job) = (operator_wasm(build), dir.join("job.toml"));
    std::fs::write(&job, format!("[operator]\npath = {wasm:?}\nwasi = \"deterministic\"\n"))?;
    let ran = run_ok(run_file_job(&wasm, input, dir, 1).arg("--config").arg(&job).env("SLUICE_LOG", "info"))?;
    Ok(stderr(&ran))
}

/// A Python build made the way componentize-py builds by default, importing WASI, runs
/// under the deterministic WASI and writes what the Rust build writes, byte for byte.
#[test]
fn a_python_build_with_wasi_writes_what_the_rust_build_writes_under_the_deterministic_wasi() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let input = dir.path().join("input.jsonl");
    generate(&input, 50, 2_000, SEED)?;
    let (rust, python) = (dir.path().join("rust"), dir.path().join("python"));
    std::fs::create_dir_all(&rust)?;
    run_ok(&mut run_file_job(&operator_wasm("vehicle_stats"), &input, &rust, 1))?;
    run_under_deterministic_wasi("vehicle_stats_py_wasi", &input, &python)?;
    assert_eq!(outputs_without_version(&python)?, outputs_without_version(&rust)?);
    assert_eq!(dump_state_lines(&python.join("state"))?, dump_state_lines(&rust.join("state"))?);
    Ok(())
}

/// The attacker built with WASI (`tests/evil-py` without `-s`) under the deterministic
/// WASI, run twice over the same records: the clock reads each record's event time (the
/// wall clock) and the partition's clock (the monotonic one); `os.urandom` and `random`
/// differ record by record, a trap's fresh instance included, and are the same in both
/// runs — and in a third whose earlier records drew nothing: a record's draw does not
/// depend on what its instance served before; the environment is empty; a file, a socket
/// and a sleep each cost their record with a clear dead letter, as the spin does;
/// printing reaches the operator's log, cut at its rate.
#[test]
fn under_the_deterministic_wasi_a_python_build_reads_its_records_time_and_seeded_randomness_alike_twice() -> Result<()>
{
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    let mut actions = vec![
        "count",
        "clock",
        "monotonic",
        "random",
        "random",
        "environ",
        "read-file",
        "socket",
        "sleep",
        "print",
        "spin",
        "random",
        "count",
        "chance",
        "chance",
    ];
    let (first, second, third) = (dir.join("first"), dir.join("second"), dir.join("third"));
    let input = dir.join("input.jsonl");
    write_attacks(&input, &actions)?;
    let log = run_under_deterministic_wasi("evil_py_wasi", &input, &first)?;
    run_under_deterministic_wasi("evil_py_wasi", &input, &second)?;
    assert_eq!(std::fs::read(second.join("out.jsonl"))?, std::fs::read(first.join("out.jsonl"))?, "runs alike");
    actions[13] = "count";
    write_attacks(&input, &actions)?;
    run_under_deterministic_wasi("evil_py_wasi", &input, &third)?;

    let outputs = |dir: &Path| -> Result<BTreeMap<usize, Value>> {
        Ok(read_jsonl(&dir.join("out.jsonl"))?
            .into_iter()
            .map(|o| (o["offset"].as_u64().unwrap_or_default() as usize, o["value"].clone()))
            .collect())
    };
    let (outputs, third) = (outputs(&first)?, outputs(&third)?);
    assert_eq!(outputs[&1], json!({"time": 1_001.0}), "the wall clock is the record's event time");
    assert_eq!(outputs[&2], json!({"monotonic_ns": 1_002_000_000_000_u64}), "the monotonic clock the partition's");
    let random: BTreeSet<String> = [3, 4, 11, 13, 14].iter().map(|i| outputs[i].to_string()).collect();
    assert_eq!(random.len(), 5, "each record its own random bytes and draws: {random:?}");
    assert_eq!(third[&14], outputs[&14], "a record draws the same whatever its instance drew before");
    assert_eq!(outputs[&5], json!({"environ": {}}));
    assert_eq!((&outputs[&9], &outputs[&12]), (&json!({"count": 2}), &json!({"count": 3})));
    let reasons = [
        ("read-file", "FileNotFoundError: [Errno 44] No such file or directory: '/etc/passwd'"),
        ("socket", "No module named 'socket'"),
        ("sleep", "no sleeping: an operator's time is its record's"),
        ("spin", "exceeded its CPU deadline of 1s"),
    ];
    assert_attacks_stopped(&first, &actions, &reasons, 4)?;
    assert!(log.contains("printed 0") && log.contains("to stderr"), "printing reaches the log:\n{log}");
    assert!(!log.contains("printed 9999") && log.contains(LOG_LINES_DROPPED), "cut at the log's rate");
    Ok(())
}

/// A job keeps its compiled builds in its state directory: restarted, a Python job (an
/// 18 MB component, CPython inside) reads its build compiled instead of compiling it
/// again, and starts in a fraction of the time; with `compiled_cache_mib = 0` nothing is
/// kept and every start compiles.
#[test]
fn a_restarted_python_job_reads_its_build_compiled_instead_of_compiling_it() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    let input = dir.join("input.jsonl");
    generate(&input, 10, 100, SEED)?;
    let run = |out: &Path, cache_mib: u64| -> Result<(String, std::time::Duration)> {
        std::fs::create_dir_all(out)?;
        let wasm = operator_wasm("vehicle_stats_py");
        let job = out.join("job.toml");
        std::fs::write(&job, format!("[operator]\npath = {wasm:?}\ncompiled_cache_mib = {cache_mib}\n"))?;
        let started = std::time::Instant::now();
        let ran = run_ok(run_file_job(&wasm, &input, out, 1).arg("--config").arg(&job).env("SLUICE_LOG", "info"))?;
        Ok((stderr(&ran), started.elapsed()))
    };
    let kept = dir.join("kept");
    let (first, compiling) = run(&kept, 1024)?;
    assert!(first.contains(COMPILED) && !first.contains(READ_COMPILED), "{first}");
    let compiled: Vec<_> = std::fs::read_dir(kept.join("state/compiled"))?.collect::<Result<_, _>>()?;
    assert_eq!(compiled.len(), 1, "one build kept: {compiled:?}");
    let (second, reading) = run(&kept, 1024)?;
    assert!(second.contains(READ_COMPILED) && !second.contains(COMPILED), "{second}");
    eprintln!("first start (compiling) {compiling:?}, restart (reading it compiled) {reading:?}");
    assert!(reading < compiling, "{reading:?} against {compiling:?}");

    let none = dir.join("none");
    for _ in 0..2 {
        let (log, _) = run(&none, 0)?;
        assert!(log.contains(COMPILED) && !log.contains(READ_COMPILED), "{log}");
    }
    assert!(!none.join("state/compiled").exists(), "nothing kept");
    Ok(())
}

/// `operators/idle-py/fixtures`: two vehicles' positions, the clock moved on between them
/// (`$advance_to`), each vehicle's timer firing a minute after its last position.
#[test]
fn a_python_operators_timers_pass_its_fixture_under_sluice_test() -> Result<()> {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../operators/idle-py/fixtures");
    let mut test = sluice();
    test.arg("test").arg(operator_wasm("idle_py")).arg("--input").arg(fixtures.join("input.jsonl"));
    test.args(["--key-field", "vehicle_id", "--expect"]).arg(fixtures.join("expected.jsonl"));
    let run = run_ok(&mut test)?;
    let said = String::from_utf8_lossy(&run.stderr);
    assert!(said.contains("4 records, 2 outputs, 0 dead letters, as expected"), "{said}");
    Ok(())
}

#[test]
fn each_vehicle_that_leaves_fires_its_python_timer_once_at_its_time() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let input = dir.path().join("input.jsonl");
    let seed = SEED.to_string();
    let positions = generate_edited(
        &input,
        &["--vehicles", "200", "--count", "20000", "--seed", &seed, "--churn", "40"],
        |_, _| {},
    )?;
    run_ok(&mut run_file_job(&operator_wasm("idle_py"), &input, dir.path(), 1))?;

    // Vehicles report every 2 s until they leave: only a vehicle that left a minute before
    // the clock's end (the last position's time) has gone idle, once, at its last + 60 s.
    let mut last: BTreeMap<String, i64> = BTreeMap::new();
    for p in &positions {
        last.insert(p["vehicle_id"].as_str().unwrap_or_default().to_string(), p["ts"].as_i64().unwrap_or_default());
    }
    let end = positions.iter().filter_map(|p| p["ts"].as_i64()).max().unwrap_or_default();
    let expected: BTreeSet<(String, i64, i64)> =
        last.into_iter().filter(|(_, ts)| ts + 60_000 <= end).map(|(v, ts)| (v, ts, ts + 60_000)).collect();
    let outputs = read_jsonl(&dir.path().join("out.jsonl"))?;
    let fired: Vec<(String, i64, i64)> = outputs
        .iter()
        .map(|o| {
            let v = &o["value"];
            (
                v["vehicle_id"].as_str().unwrap_or_default().to_string(),
                v["idle_since"].as_i64().unwrap_or(0),
                v["at"].as_i64().unwrap_or(0),
            )
        })
        .collect();
    assert!(expected.len() > 300, "vehicles that left a minute before the end: {}", expected.len());
    assert_eq!(fired.len(), expected.len(), "one output per idle vehicle, none twice");
    assert_eq!(fired.into_iter().collect::<BTreeSet<_>>(), expected);
    assert!(outputs.iter().all(|o| o["cause"] == "timer"), "each output is a timer's");
    Ok(())
}

/// The Python guide's examples are the tested operators' code: each top-level piece of
/// each `python` block of docs/operator-guide-python.md (pieces two blank lines apart, as
/// Python's style has them) is, verbatim, in an operator's `app.py` the tests build and run.
#[test]
fn the_python_guides_examples_are_code_the_tests_run() -> Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let guide = std::fs::read_to_string(root.join("docs/operator-guide-python.md"))?;
    let mut apps = Vec::new();
    for app in ["vehicle-stats-py", "idle-py", "speed-windows-py"] {
        apps.push(std::fs::read_to_string(root.join("operators").join(app).join("app.py"))?);
    }
    let blocks: Vec<&str> = guide.split("```python\n").skip(1).filter_map(|rest| rest.split("```").next()).collect();
    assert_eq!(blocks.len(), 3, "the guide's Python examples");
    for piece in blocks.iter().flat_map(|block| block.split("\n\n\n")).map(str::trim) {
        assert!(apps.iter().any(|app| app.contains(piece)), "not in any operators/*-py/app.py:\n{piece}");
    }
    Ok(())
}
