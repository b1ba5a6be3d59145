//! `sluice test` and its driver, which run a component in the sandbox outside a job:
//! outputs and dead letters compared with fixtures, and the driver's clock deciding
//! expiry, moved by the caller or by a fixture's `$advance_to` lines.

use anyhow::Result;
use serde_json::{Value, json};
use sluice_e2e::*;
use std::path::{Path, PathBuf};

/// vehicle-stats' fixtures, in `operators/vehicle-stats/fixtures`.
fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../operators/vehicle-stats/fixtures").join(name)
}

/// `sluice test` runs a component over a file of records in the sandbox: its outputs
/// and dead letter match the fixtures; with the "left the fleet" TTL and the clock moved
/// on, the expiry callbacks' outputs come too, earliest first; a deliberately wrong
/// expectation fails with the record, the field and both lines; a given starting state
/// carries on, and `--show-state` prints the state after.
#[test]
fn sluice_test_compares_a_components_outputs_with_the_fixtures() -> Result<()> {
    let test = || {
        let mut command = sluice();
        command.arg("test").arg(operator_wasm("vehicle_stats")).arg("--input").arg(fixture("input.jsonl"));
        command
    };
    let run = run_ok(
        test()
            .arg("--expect")
            .arg(fixture("expected.jsonl"))
            .arg("--expect-dead-letters")
            .arg(fixture("dead-letters.jsonl")),
    )?;
    let said = String::from_utf8(run.stderr)?;
    assert!(said.contains("5 records, 4 outputs, 1 dead letters, as expected,"), "{said}");

    let run = run_ok(
        test()
            .args(["--config", "left_fleet_after_ms=60000", "--advance-to", "1767225700000", "--expect"])
            .arg(fixture("expected-left-fleet.jsonl"))
            .arg("--expect-dead-letters")
            .arg(fixture("dead-letters.jsonl")),
    )?;
    assert!(String::from_utf8(run.stderr)?.contains("6 outputs"));
    // A job's sandbox: its operator config, and its limits, one output per record.
    let scratch = tempfile::tempdir()?;
    let job = scratch.path().join("job.toml");
    std::fs::write(
        &job,
        "[operator]\npath = \"x.wasm\"\n[operator.config]\nleft_fleet_after_ms = \"60000\"\n\
         [operator.limits]\noutput_bytes_per_record = 100\n",
    )?;
    let run = run_ok(test().arg("--job").arg(&job).args(["--advance-to", "1767225700000"]))?;
    let dead: Vec<Value> =
        String::from_utf8(run.stdout)?.lines().map(serde_json::from_str).collect::<Result<_, _>>()?;
    let errors: Vec<&str> = dead.iter().map(|line| line["error"].as_str().unwrap_or_default()).collect();
    assert_eq!(errors, ["trapped", "trapped", "trapped", "trapped", "rejected"], "the positions passed the limit");
    assert!(dead[0]["reason"].as_str().unwrap_or_default().contains("output_bytes_per_record = 100"), "{dead:?}");

    let dir = tempfile::tempdir()?;
    let wrong = dir.path().join("wrong.jsonl");
    let expected = std::fs::read_to_string(fixture("expected.jsonl"))?;
    std::fs::write(&wrong, expected.replacen("\"count\":2", "\"count\":5", 1))?;
    let err =
        run_err(test().arg("--expect").arg(&wrong).arg("--expect-dead-letters").arg(fixture("dead-letters.jsonl")))?;
    assert!(
        err.contains("output 3 (of the input at offset 2): differs in value.count (expected 5, actual 2)"),
        "{err}"
    );
    assert!(err.contains("expected {\"key\":\"veh-1\",\"value\":{\"count\":5,") && err.contains("actual   {"), "{err}");
    assert!(err.contains("1 difference(s)"), "{err}");
    let err = run_err(test().arg("--expect").arg(fixture("expected.jsonl")))?;
    assert!(
        err.contains("expected 0 dead letters, got 1: 1 unexpected") && err.contains("\"error\":\"rejected\""),
        "{err}"
    );

    let state = dir.path().join("state.jsonl");
    let summary = json!({"vehicle_id": "veh-1", "count": 10, "mean_speed_kmh": 30.0, "max_speed_kmh": 90.0,
        "distance_km": 1.5, "first_seen": 0, "last_seen": 0, "last_lat": 52.3702, "last_lon": 4.8952});
    std::fs::write(&state, json!({"key": "veh-1", "name": "summary", "value": summary}).to_string() + "\n")?;
    let run = run_ok(test().arg("--state").arg(&state).arg("--show-state"))?;
    let lines: Vec<Value> =
        String::from_utf8(run.stdout)?.lines().map(serde_json::from_str).collect::<Result<_, _>>()?;
    assert_eq!(lines[0]["value"]["count"], 11, "the given state carried on: {lines:?}");
    assert_eq!(lines[0]["value"]["max_speed_kmh"], 90.0);
    let after: Vec<&Value> = lines.iter().filter(|line| line["name"] == "summary").collect();
    assert_eq!(after.len(), 2, "two vehicles' summaries after: {lines:?}");
    assert_eq!(after[0]["value"]["count"], 13);
    Ok(())
}

/// `sluice test` keeps the component it compiled in the user's cache directory, so the
/// next run of the same build reads it back instead of compiling it (seconds for a
/// Python or TypeScript component); `--compiled-cache` names another directory, and
/// `--no-compiled-cache` compiles and keeps nothing.
#[test]
fn sluice_test_reads_back_a_build_it_compiled_before() -> Result<()> {
    use sluice::events::{COMPILED, READ_COMPILED};
    let user_cache = tempfile::tempdir()?;
    let test = || {
        let mut command = sluice();
        command.env("SLUICE_LOG", "info").env("XDG_CACHE_HOME", user_cache.path());
        command.arg("test").arg(operator_wasm("vehicle_stats")).arg("--input").arg(fixture("input.jsonl"));
        command
    };
    let said =
        |command: &mut std::process::Command| -> Result<String> { Ok(String::from_utf8(run_ok(command)?.stderr)?) };
    let compiled_files = |dir: &Path| -> Result<usize> {
        let Ok(entries) = std::fs::read_dir(dir) else { return Ok(0) };
        let mut count = 0;
        for entry in entries {
            count += usize::from(entry?.path().extension().is_some_and(|extension| extension == "cwasm"));
        }
        Ok(count)
    };
    let kept = user_cache.path().join("sluice/compiled");

    let first = said(&mut test())?;
    assert!(first.contains(COMPILED) && !first.contains(READ_COMPILED), "{first}");
    assert_eq!(compiled_files(&kept)?, 1, "kept in $XDG_CACHE_HOME/sluice/compiled");
    let second = said(&mut test())?;
    assert!(second.contains(READ_COMPILED) && !second.contains(COMPILED), "{second}");
    assert!(second.contains("5 records, 4 outputs, 1 dead letters"), "the same run: {second}");

    let other = tempfile::tempdir()?;
    let named = said(test().arg("--compiled-cache").arg(other.path()))?;
    assert!(named.contains(COMPILED), "{named}");
    assert_eq!(compiled_files(other.path())?, 1, "kept where --compiled-cache says");
    let none = said(test().arg("--no-compiled-cache"))?;
    assert!(none.contains(COMPILED) && !none.contains(READ_COMPILED), "{none}");
    assert_eq!((compiled_files(&kept)?, compiled_files(other.path())?), (1, 1), "nothing more kept");
    Ok(())
}

/// The test driver's clock decides expiry, to the millisecond: a vehicle's summary,
/// put with a TTL of a minute, lives until its clock reaches the minute and expires at
/// it, through the operator's `expired`, whose output says so; the state is then empty.
#[test]
fn the_test_drivers_clock_drives_expiry_deterministically() -> Result<()> {
    use sluice::test_driver::TestDriver;
    let mut driver =
        TestDriver::builder(operator_wasm("vehicle_stats")).config("left_fleet_after_ms", "60000").build()?;
    let at = 1_767_225_600_000_i64;
    let position = json!({"vehicle_id": "veh-1", "ts": at, "lat": 52.0, "lon": 4.0, "speed_kmh": 30.0});
    let step = driver.process(b"veh-1", position.to_string().as_bytes(), at)?;
    assert_eq!(step.outputs[0]["value"]["count"], 1, "{step:?}");
    assert_eq!(driver.state()?.len(), 1);
    let step = driver.advance_clock(at + 59_999)?;
    assert!(step.outputs.is_empty() && driver.state()?.len() == 1, "not due yet: {step:?}");
    let step = driver.advance_clock(at + 60_000)?;
    assert_eq!(step.outputs.len(), 1, "{step:?}");
    assert_eq!(step.outputs[0]["cause"], "expiry");
    assert_eq!(step.outputs[0]["value"]["left_fleet_at"], at + 60_000);
    assert_eq!(step.outputs[0]["operator"], driver.version());
    assert!(driver.state()?.is_empty(), "the summary is gone");
    Ok(())
}

/// A fixture line `{"$advance_to": MS}` moves the clock between two records:
/// speed-windows' fixtures close a minute and its 5-minute windows mid-file, so the
/// position after the first move is late for its minute (not for its 5-minute windows)
/// and the one after the second is late for all, a `late` dead letter. A line naming
/// the directive that is not one is an error naming the line.
#[test]
fn a_fixture_line_moves_the_clock_between_records() -> Result<()> {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../operators/speed-windows/fixtures");
    let test = |input: &Path| {
        let mut command = sluice();
        command.arg("test").arg(operator_wasm("speed_windows")).arg("--input").arg(input);
        command
    };
    let run = run_ok(
        test(&fixtures.join("input.jsonl"))
            .arg("--expect")
            .arg(fixtures.join("expected.jsonl"))
            .arg("--expect-dead-letters")
            .arg(fixtures.join("dead-letters.jsonl")),
    )?;
    let said = String::from_utf8(run.stderr)?;
    assert!(said.contains("4 records, 6 outputs, 1 dead letters, as expected,"), "{said}");

    let dir = tempfile::tempdir()?;
    let input = dir.path().join("input.jsonl");
    let position = r#"{"vehicle_id":"veh-1","ts":1767225610000,"lat":0,"lon":0,"speed_kmh":30}"#;
    for (wrong, says) in [
        (r#"{"$advance_to":"soon"}"#, "$advance_to must be ms since the epoch, not \"soon\""),
        (r#"{"$advance_to":-5}"#, "$advance_to must be ms since the epoch, not -5"),
        (r#"{"$advance_to":1767225660000"#, "a line naming $advance_to is not a JSON object"),
        (r#"{"$advance_to":1767225660000,"vehicle_id":"veh-1"}"#, "a line with $advance_to must have no other field"),
    ] {
        std::fs::write(&input, format!("{position}\n\n{wrong}\n"))?;
        let err = run_err(&mut test(&input))?;
        assert!(err.contains("input.jsonl: non-empty line 2") && err.contains(says), "{err}");
    }
    Ok(())
}
