//! The first complete path of a record, through the real binary: JSONL file →
//! partition workers → vehicle-stats (WASM) → RocksDB state → JSONL sink.

use anyhow::Result;
use sluice_tests::*;
use std::collections::{BTreeMap, BTreeSet};

#[test]
fn every_output_and_the_final_state_equal_the_reference_fold() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let input = dir.path().join("input.jsonl");
    generate(&input, 40, 3000, 11)?;
    let reference = Reference::fold(&input)?;
    let (out, state) = (dir.path().join("out.jsonl"), dir.path().join("state"));

    let run = run_ok(&mut run_file_job(&operator_wasm("vehicle_stats"), &input, dir.path(), 3))?;
    let report = String::from_utf8_lossy(&run.stderr);
    assert!(report.contains("processed 3000 records") && report.contains("40 keys hold state"), "{report}");

    // Every input produced exactly one output, and the n-th output of a vehicle is the
    // reference summary after its n-th record.
    let outputs = read_jsonl(&out)?;
    assert_eq!(outputs.len(), reference.after_each.len());
    let expected_by_vehicle = reference.after_each_by_vehicle();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut positions = BTreeSet::new();
    for output in &outputs {
        let vehicle = output["key"].as_str().unwrap().to_string();
        let n = seen.entry(vehicle.clone()).or_default();
        assert_summary(&output["value"], &vehicle, expected_by_vehicle[vehicle.as_str()][*n], "output");
        *n += 1;
        assert!(positions.insert((output["partition"].as_u64(), output["offset"].as_u64())), "duplicate {output}");
    }
    // A vehicle's records all land in one partition.
    let mut partition_of: BTreeMap<String, u64> = BTreeMap::new();
    for output in &outputs {
        let p = output["partition"].as_u64().unwrap();
        assert_eq!(*partition_of.entry(output["key"].as_str().unwrap().into()).or_insert(p), p);
    }
    assert_eq!(partition_of.values().collect::<BTreeSet<_>>().len(), 3, "all partitions used");

    assert_state_matches(&dump_state(&state)?, &reference, "final state");

    // Every output names the operator build that made it — the one the checkpoint records.
    let manifest = checkpoint_manifests(&dir.path().join("state.checkpoints"), 0)?;
    let version = manifest.last().expect("a checkpoint at the end")["operator"].clone();
    assert!(version.as_str().is_some_and(|v| v.starts_with("vehicle_stats@")), "{version}");
    assert!(outputs.iter().all(|o| o["operator"] == version), "every output says {version}");

    // A second run over the same input resumes from the stored offsets: nothing is
    // processed again, and the state is unchanged.
    let again = run_ok(&mut run_file_job(&operator_wasm("vehicle_stats"), &input, dir.path(), 3))?;
    let report = String::from_utf8_lossy(&again.stderr);
    assert!(report.contains("processed 0 records") && report.contains("3000 records skipped"), "{report}");
    assert_eq!(read_jsonl(&out)?.len(), outputs.len());
    assert_state_matches(&dump_state(&state)?, &reference, "state after a second run");
    Ok(())
}

#[test]
fn a_config_file_runs_the_generator_and_flags_override_it() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("job.toml");
    std::fs::write(
        &config,
        format!(
            "[operator]\npath = {:?}\n[source]\nkind = \"generator\"\nvehicles = 25\ncount = 999\nseed = 5\n\
             [sink]\nkind = \"file\"\npath = {:?}\n[state]\ndir = {:?}\npartitions = 2\n[report]\ninterval_s = 0\n\
             [dead_letter]\npath = {:?}\n",
            operator_wasm("vehicle_stats"),
            dir.path().join("out.jsonl"),
            dir.path().join("state"),
            dir.path().join("dead.jsonl"),
        ),
    )?;
    run_ok(sluice().arg("run").arg("--config").arg(&config).args(["--count", "1500"]))?;
    let input = dir.path().join("same-records.jsonl");
    generate(&input, 25, 1500, 5)?;
    let reference = Reference::fold(&input)?;
    assert_eq!(read_jsonl(&dir.path().join("out.jsonl"))?.len(), 1500);
    assert_state_matches(&dump_state(&dir.path().join("state"))?, &reference, "generator run");
    Ok(())
}
