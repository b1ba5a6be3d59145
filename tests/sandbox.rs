//! The sandbox and the guest SDK, through the real binary with the `probe` operator:
//! typed state round-trips, a trapped record's writes are discarded, operators get no
//! filesystem or environment, and CPU and memory are capped.

use anyhow::Result;
use serde_json::{Value, json};
use sluice_tests::*;
use std::path::Path;

/// Runs the probe over the log `records` (JSON values, all under key `k` unless they
/// carry `vehicle_id`) and returns this run's (outputs, dead letters).
fn run_probe(dir: &Path, records: &[Value]) -> Result<(Vec<Value>, Vec<Value>)> {
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
    let config = dir.join("probe.toml");
    std::fs::write(
        &config,
        format!(
            "[operator]\npath = {:?}\ncall_timeout_ms = 300\nmemory_limit_mib = 16\n\
             [state]\ndir = {:?}\npartitions = 1\n[report]\ninterval_s = 0\n",
            operator_wasm("probe"),
            dir.join("state")
        ),
    )?;
    run_ok(
        sluice()
            .arg("run")
            .arg("--config")
            .arg(&config)
            .arg("--input")
            .arg(&input)
            .arg("--output")
            .arg(&out)
            .arg("--dead-letter")
            .arg(&dead),
    )?;
    Ok((read_jsonl(&out)?.into_iter().map(|o| o["value"].clone()).collect(), read_jsonl(&dead)?))
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

#[test]
fn operators_get_no_filesystem_or_environment() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let records = [json!({"action": "read-fs"}), json!({"action": "read-env"}), json!({"action": "count"})];
    let (outputs, dead) = run_probe(dir.path(), &records)?;
    assert_eq!(outputs, vec![json!({"count": 1})]);
    assert_eq!(dead.len(), 2, "{dead:?}");
    for (letter, interface) in dead.iter().zip(["wasi:filesystem", "wasi:cli/environment"]) {
        let reason = letter["reason"].as_str().unwrap();
        assert!(letter["error"] == "trapped" && reason.starts_with("operator called `"), "{letter}");
        assert!(reason.contains(interface) && reason.contains("which the sandbox denies"), "{letter}");
    }
    Ok(())
}

#[test]
fn cpu_deadline_and_memory_cap_stop_runaway_calls() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let records = [json!({"action": "spin"}), json!({"action": "hog"}), json!({"action": "count"})];
    let (outputs, dead) = run_probe(dir.path(), &records)?;
    assert_eq!(outputs, vec![json!({"count": 1})]);
    assert_eq!(dead.len(), 2, "{dead:?}");
    assert!(dead[0]["reason"].as_str().unwrap().contains("exceeded its deadline of 300ms"), "{}", dead[0]);
    assert!(dead[1]["reason"].as_str().unwrap().contains("memory limit of 16 MiB"), "{}", dead[1]);
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
