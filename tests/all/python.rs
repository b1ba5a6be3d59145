//! Operators in Python, through the real binary: vehicle-stats written in Python
//! (`operators/vehicle-stats-py` over the Python SDK, `guest-sdk-python`, built by
//! componentize-py with WASI stubbed out) writes the state and the outputs the Rust build
//! writes, byte for byte, its TTLs and `expired` callbacks included; a running job is deployed from the Rust build to the Python one
//! and rolled back, each vehicle's count going on one by one across both switches; the
//! same app built the way componentize-py builds by default, importing WASI, is refused
//! by the sandbox with the import it called named.

use crate::hot_swap::{SEED, deployed_then_rolled_back};
use anyhow::Result;
use sluice_e2e::*;
use std::collections::BTreeMap;
use std::path::Path;

/// `dir/out.jsonl`'s lines without the `operator` field (which names the version),
/// sorted: what two builds must agree on.
fn outputs_without_version(dir: &Path) -> Result<Vec<String>> {
    let mut lines: Vec<String> = std::fs::read_to_string(dir.join("out.jsonl"))?
        .lines()
        .map(|line| match line.rsplit_once(",\"operator\":") {
            Some((before, _)) => format!("{before}}}"),
            None => line.to_string(),
        })
        .collect();
    lines.sort();
    Ok(lines)
}

/// Runs the Rust and the Python vehicle-stats over `input` with `[operator.config]`
/// `config` (TOML lines), two partitions each, and fails unless their outputs and state
/// are the same bytes; returns the outputs.
fn assert_builds_agree(dir: &Path, input: &Path, config: &str) -> Result<Vec<String>> {
    let job = dir.join("job.toml");
    std::fs::write(&job, format!("[operator.config]\n{config}"))?;
    let (rust, python) = (dir.join("rust"), dir.join("python"));
    for (build, out) in [("vehicle_stats", &rust), ("vehicle_stats_py", &python)] {
        run_ok(run_file_job(&operator_wasm(build), input, out, 2).arg("--config").arg(&job))?;
    }
    let (expected, actual) = (outputs_without_version(&rust)?, outputs_without_version(&python)?);
    assert_eq!(actual.len(), expected.len(), "as many outputs");
    if let Some(i) = (0..expected.len()).find(|&i| expected[i] != actual[i]) {
        panic!("output {i} differs:\n  rust:   {}\n  python: {}", expected[i], actual[i]);
    }
    // The state, as stored: the same bytes under the same keys.
    assert_eq!(dump_state_lines(&python.join("state"))?, dump_state_lines(&rust.join("state"))?);
    assert!(read_jsonl(&python.join("dead.jsonl"))?.is_empty());
    Ok(actual)
}

#[test]
fn vehicle_stats_in_python_writes_what_the_rust_build_writes_byte_for_byte() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let input = dir.path().join("input.jsonl");
    // 200 vehicles reporting every 2 s of event time: distances of a few metres, where a
    // float printed otherwise than serde_json prints it would show.
    generate(&input, 200, 20_000, SEED)?;
    let outputs = assert_builds_agree(&dir.path().join("plain"), &input, "")?;
    assert_eq!(outputs.len(), 20_000, "an output per position");

    // A vehicle leaving the fleet for good every 40 positions: each one's summary expires
    // 10 s after its last position (a TTL on the put), and `expired` emits it final.
    let seed = SEED.to_string();
    generate_edited(&input, &["--vehicles", "200", "--count", "20000", "--seed", &seed, "--churn", "40"], |_, _| {})?;
    let outputs = assert_builds_agree(&dir.path().join("ttl"), &input, "left_fleet_after_ms = \"10000\"")?;
    let left = outputs.iter().filter(|o| o.contains("\"left_fleet_at\":")).count();
    assert!(left > 400, "vehicles left the fleet: {left} final summaries");
    Ok(())
}

#[test]
fn a_running_job_swaps_from_rust_to_python_and_back_and_every_count_goes_on() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    // Preparing an 18 MB component takes the debug build about 10 s: the job outlasts it.
    let python_file = operator_wasm("vehicle_stats_py");
    let (input, python, host) = deployed_then_rolled_back(dir, "vehicle_stats", &python_file, "", 200_000)?;
    assert!(python.starts_with("vehicle_stats@"), "{}", host.log());

    let mut outputs = read_jsonl(&dir.join("out.jsonl"))?;
    outputs.sort_by_key(|o| (o["partition"].as_u64(), o["offset"].as_u64()));
    let reference = Reference::fold(&input)?;
    let expected = reference.after_each_by_vehicle();
    assert_eq!(outputs.len(), reference.after_each.len(), "one output per position");
    // Per partition, the versions in offset order: Rust, Python from one offset on, Rust.
    let mut runs: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for output in &outputs {
        let version = output["operator"].as_str().unwrap_or_default().to_string();
        let partition = runs.entry(output["partition"].as_u64().unwrap_or_default()).or_default();
        if partition.last() != Some(&version) {
            partition.push(version);
        }
        let vehicle = output["key"].as_str().unwrap_or_default().to_string();
        let n = seen.entry(vehicle.clone()).or_default();
        // Each summary continues the one before it, whichever language wrote that one.
        assert_summary(&output["value"], &vehicle, expected[vehicle.as_str()][*n], "output");
        *n += 1;
    }
    for (partition, versions) in &runs {
        assert_eq!(versions.len(), 3, "partition {partition}: Rust, Python, Rust: {versions:?}");
        assert_eq!(versions[1], python, "partition {partition}: {versions:?}");
        assert!(versions[0] == versions[2] && versions[0] != python, "partition {partition}: {versions:?}");
    }
    assert!(read_jsonl(&dir.join("dead.jsonl"))?.is_empty());
    Ok(())
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
    assert!(!dir.path().join("out.jsonl").exists() || read_jsonl(&dir.path().join("out.jsonl"))?.is_empty());
    Ok(())
}
