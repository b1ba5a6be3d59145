//! The sandbox and the guest SDK, through the real binary with the `probe` operator:
//! typed state round-trips, a trapped record's writes are discarded, a non-finite
//! float is refused, operators get no filesystem, environment, clock or randomness;
//! strict mode, a partition that fails alone, and an `init` that fails. Its probe jobs
//! serve [`crate::sandbox_limits`] too.

use anyhow::Result;
use serde_json::{Value, json};
use sluice::events::STOPPED_ALONE;
use sluice_e2e::*;
use std::path::Path;
use std::process::Command;

/// Runs the probe over the log `records` (JSON values, all under key `k` unless they
/// carry `vehicle_id`) and returns this run's (outputs, dead letters).
pub(crate) fn run_probe(dir: &Path, records: &[Value]) -> Result<(Vec<Value>, Vec<Value>)> {
    run_probe_with(dir, records, "").map(|(outputs, dead, _)| (outputs, dead))
}

/// [`run_probe`] with `config` (TOML lines) added to the job's, also returning what the
/// host logged.
pub(crate) fn run_probe_with(dir: &Path, records: &[Value], config: &str) -> Result<(Vec<Value>, Vec<Value>, String)> {
    let run = run_ok(&mut sandbox_job(dir, &operator_wasm("probe"), records, config)?)?;
    let outputs = read_jsonl(&dir.join("out.jsonl"))?.into_iter().map(|o| o["value"].clone()).collect();
    Ok((outputs, read_jsonl(&dir.join("dead.jsonl"))?, String::from_utf8(run.stderr)?))
}

/// A `sluice run` of `operator` in `dir` over the log `records` (as [`run_probe`] takes
/// them), one partition, a deadline of 300 ms and a memory cap of 16 MiB per call, with
/// `config` (TOML lines; keys before any table are `[operator]`'s) added; outputs to
/// `out.jsonl`, dead letters to `dead.jsonl`.
pub(crate) fn sandbox_job(dir: &Path, operator: &Path, records: &[Value], config: &str) -> Result<Command> {
    let input = dir.join("input.jsonl");
    let lines: Vec<String> = records
        .iter()
        .map(|r| {
            let mut r = r.clone();
            r.as_object_mut().unwrap().entry("vehicle_id").or_insert("k".into());
            r.to_string()
        })
        .collect();
    std::fs::write(&input, lines.join("\n") + "\n")?;
    let (out, dead) = (dir.join("out.jsonl"), dir.join("dead.jsonl"));
    let _ = (std::fs::remove_file(&out), std::fs::remove_file(&dead));
    let config_file = dir.join("sandbox.toml");
    std::fs::write(
        &config_file,
        format!(
            "[operator]\npath = {operator:?}\ncall_timeout_ms = 300\nmemory_limit_mib = 16\n{config}\n\
             [state]\ndir = {:?}\npartitions = 1\n[report]\ninterval_s = 0\n",
            dir.join("state")
        ),
    )?;
    let mut command = sluice();
    command.arg("run").arg("--config").arg(&config_file).arg("--input").arg(&input);
    command.arg("--output").arg(&out).arg("--dead-letter").arg(&dead);
    Ok(command)
}

fn sample(i: u32) -> Value {
    json!({
        "text": format!("sample {i}: ünïcödé ✓ \"quoted\" \\ slash"),
        "int": -(i as i64) * 1_000_000_007,
        "float": 1.0 / (i as f64 + 3.0),
        "list": [i, i + 1, u32::MAX],
        "map": { "yes": true, "no": false, "unknown": null },
        "kind": match i % 3 {
            0 => json!("Unit"),
            1 => json!({"Tuple": [i as u8, "t"]}),
            _ => json!({"Struct": {"bytes": [0, 255, i as u8]}}),
        },
        "nested": if i.is_multiple_of(2) { Value::Null } else { json!({
            "text": "", "int": 0, "float": -0.5, "list": [], "map": {}, "kind": "Unit", "nested": null
        }) },
    })
}

#[test]
fn typed_state_round_trips_through_the_host_and_across_restarts() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let first: Vec<Value> = (0..6).map(|i| json!({"action": "roundtrip", "sample": sample(i)})).collect();
    let (outputs, dead) = run_probe(dir.path(), &first)?;
    assert!(dead.is_empty(), "{dead:?}");
    assert_eq!(outputs.len(), 6);
    for (i, output) in outputs.iter().enumerate() {
        assert_eq!(output["readback_equal"], true, "{output}");
        let previous = if i == 0 { Value::Null } else { sample(i as u32 - 1) };
        assert_eq!(output["previous"], previous, "record {i}");
    }
    // The log grows by one record: a new run processes only that one, and reads what
    // the last run stored.
    let mut log = first;
    log.push(json!({"action": "roundtrip", "sample": sample(9)}));
    let (outputs, _) = run_probe(dir.path(), &log)?;
    assert_eq!(outputs.len(), 1);
    assert_eq!(outputs[0]["previous"], sample(5));
    Ok(())
}

#[test]
fn a_trapped_record_loses_its_writes_and_processing_continues_in_a_fresh_instance() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let records = [json!({"action": "count"}), json!({"action": "put-then-panic"}), json!({"action": "count"})];
    let (outputs, dead) = run_probe(dir.path(), &records)?;
    assert_eq!(outputs, vec![json!({"count": 1}), json!({"count": 2})], "the panicking record's write is gone");
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0]["error"], "trapped");
    assert!(dead[0]["reason"].as_str().unwrap().starts_with("panicked at "), "{}", dead[0]);
    assert!(dead[0]["reason"].as_str().unwrap().contains("probe panics after a write"), "{}", dead[0]);
    assert_eq!(dead[0]["offset"], 1);
    Ok(())
}

/// A float that overflowed to infinity cannot be stored as JSON (it would read back as
/// `null` and break the key for good): the SDK refuses it, naming the entry, and the
/// record is rejected with the key's state as before.
#[test]
fn a_non_finite_float_is_refused_by_the_sdk_not_stored_broken() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let records = [json!({"action": "count"}), json!({"action": "overflow"}), json!({"action": "count"})];
    let (outputs, dead) = run_probe(dir.path(), &records)?;
    assert_eq!(outputs, [json!({"count": 1}), json!({"count": 2})]);
    assert_eq!(dead.len(), 1, "{dead:?}");
    let reason = dead[0]["reason"].as_str().unwrap_or_default();
    assert_eq!(dead[0]["error"], "rejected");
    assert!(reason.contains("state `mean` cannot be stored") && reason.contains("NaN or infinite"), "{reason}");
    Ok(())
}

/// Operators get no WASI at all: each call traps naming the function. For randomness
/// and the clock (denied because a replay must decide exactly as the first run did) the
/// reason also says what to use instead: std's `HashMap::new()` seeds itself with
/// randomness, `SystemTime::now()` reads the clock.
#[test]
fn operators_get_no_filesystem_environment_clock_or_randomness() -> Result<()> {
    let dir = tempfile::tempdir()?;
    // Each action, the interface its trap names, and the advice it gives.
    let denied = [
        ("read-fs", "wasi:filesystem", ""),
        ("read-env", "wasi:cli/environment", ""),
        ("hash-map", "`wasi:random/", "use a `BTreeMap`"),
        ("clock", "`wasi:clocks/", "record.timestamp_ms"),
    ];
    let mut records: Vec<Value> = denied.iter().map(|(action, ..)| json!({"action": action})).collect();
    records.push(json!({"action": "count"}));
    let (outputs, dead) = run_probe(dir.path(), &records)?;
    assert_eq!(outputs, vec![json!({"count": 1})]);
    assert_eq!(dead.len(), denied.len(), "{dead:?}");
    for (letter, (_, interface, advice)) in dead.iter().zip(denied) {
        let reason = letter["reason"].as_str().unwrap_or_default();
        assert!(letter["error"] == "trapped" && reason.starts_with("operator called `"), "{letter}");
        assert!(reason.contains(interface) && reason.contains("which the sandbox denies"), "{letter}");
        assert!(reason.contains(advice), "{letter}");
    }
    Ok(())
}

/// In strict mode a record that still traps after its attempts stops the partition
/// (here, with one partition, the job) naming it, and loses nothing: nothing of its
/// batch was committed, so a run without strict mode processes the batch again and
/// dead-letters only that record.
#[test]
fn strict_mode_stops_at_a_record_that_keeps_trapping_and_loses_nothing() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let records = [json!({"action": "count"}), json!({"action": "hog"}), json!({"action": "count"})];
    let strict = "[operator.retry]\nstrict = true\nbackoff = \"1ms\"";
    let err = run_err(&mut sandbox_job(dir.path(), &operator_wasm("probe"), &records, strict)?)?;
    assert!(err.contains("the record at offset 1 failed in 2 call(s), and [operator.retry] strict = true"), "{err}");
    assert!(err.contains("memory limit of 16 MiB"), "{err}");
    let (outputs, dead) = run_probe(dir.path(), &records)?;
    assert_eq!(outputs, vec![json!({"count": 1}), json!({"count": 2})]);
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0]["offset"], 1);
    Ok(())
}

/// A partition whose worker fails stops alone: its later records are dropped while the
/// other partition processes all of its own, the job then fails naming the stopped
/// partition and why, and a run after it (without strict mode) processes the stopped
/// partition's records from its last commit, and nothing twice.
#[test]
fn a_partition_that_fails_stops_alone_and_the_others_go_on() -> Result<()> {
    const EACH: usize = 1500;
    let dir = tempfile::tempdir()?;
    let (failing, healthy) = (key_in_partition(0, 2), key_in_partition(1, 2));
    // The failing key's first record traps; records go on arriving for both partitions
    // after it (at 3,000 a second).
    let records: Vec<Value> = (0..EACH)
        .flat_map(|i| {
            let action = if i == 0 { "hog" } else { "count" };
            [json!({"vehicle_id": failing, "action": action}), json!({"vehicle_id": healthy, "action": "count"})]
        })
        .collect();
    let counts = |key: &str| -> Result<Vec<u64>> {
        let outputs = read_jsonl(&dir.path().join("out.jsonl"))?;
        Ok(outputs.iter().filter(|o| o["key"] == key).filter_map(|o| o["value"]["count"].as_u64()).collect())
    };
    let probe = operator_wasm("probe");
    let strict = "[operator.retry]\nstrict = true\nbackoff = \"1ms\"";
    let err =
        run_err(sandbox_job(dir.path(), &probe, &records, strict)?.args(["--partitions", "2", "--rate", "3000"]))?;
    assert!(err.contains("partition 0 stopped") && err.contains(STOPPED_ALONE), "{err}");
    assert!(err.contains("the record at offset 0 failed in 2 call(s)"), "{err}");
    let healthy_counts = counts(&healthy)?;
    assert!(healthy_counts.iter().copied().eq(1..=EACH as u64), "partition 1: {} of {EACH}", healthy_counts.len());
    assert_eq!(counts(&failing)?, Vec::<u64>::new(), "nothing of the failed partition is committed or sent");

    run_ok(sandbox_job(dir.path(), &probe, &records, "")?.args(["--partitions", "2"]))?;
    let failing_counts = counts(&failing)?;
    assert!(failing_counts.iter().copied().eq(1..EACH as u64), "partition 0: {} of {}", failing_counts.len(), EACH - 1);
    assert_eq!(counts(&healthy)?, Vec::<u64>::new(), "partition 1 already committed its records");
    assert_eq!(read_jsonl(&dir.path().join("dead.jsonl"))?.len(), 1);
    Ok(())
}

#[test]
fn an_operator_whose_init_fails_stops_the_job_with_its_reason() -> Result<()> {
    let failures = [
        ("fail_init", "init returned an error: fail_init is set"),
        ("trap_init", "trapped in init: panicked at"),
        // State belongs to a record's key; init has none.
        ("state_in_init", "state.put called outside a record"),
    ];
    for (setting, expected) in failures {
        let dir = tempfile::tempdir()?;
        let config = dir.path().join("probe.toml");
        std::fs::write(
            &config,
            format!(
                "[operator]\npath = {:?}\n[operator.config]\n{setting} = \"true\"\n[state]\ndir = {:?}\n",
                operator_wasm("probe"),
                dir.path().join("state")
            ),
        )?;
        let (out, dead) = (dir.path().join("out.jsonl"), dir.path().join("dead.jsonl"));
        let err = run_err(
            sluice().arg("run").arg("--config").arg(&config).arg("--output").arg(&out).arg("--dead-letter").arg(&dead),
        )?;
        assert!(err.contains("probe.wasm") && err.contains(expected), "{setting}: {err}");
        assert!(!out.exists() && !dead.exists(), "a job that cannot start writes no files");
    }
    Ok(())
}
