//! The complete path of a record through the real binary: JSONL file or generator →
//! partition workers → vehicle-stats (WASM) → RocksDB state → JSONL sink, whose outputs
//! and state equal the reference fold; outputs to what cannot be synced; a config file
//! with flags over it; a component built against WIT 0.1.0 beside a batched one;
//! RocksDB's memory budget; and dedup and sessions through `sluice test` and a run.

use anyhow::Result;
use serde_json::Value;
use sluice_e2e::*;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

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

    let outputs = read_jsonl(&out)?;
    assert_outputs_are_the_fold(&outputs, &reference);
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

/// Every input produced exactly one output, and the n-th output of a vehicle is the
/// reference summary after its n-th record.
fn assert_outputs_are_the_fold(outputs: &[Value], reference: &Reference) {
    assert_eq!(outputs.len(), reference.after_each.len());
    let expected_by_vehicle = reference.after_each_by_vehicle();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut positions = BTreeSet::new();
    for output in outputs {
        let vehicle = output["key"].as_str().unwrap().to_string();
        let n = seen.entry(vehicle.clone()).or_default();
        assert_summary(&output["value"], &vehicle, expected_by_vehicle[vehicle.as_str()][*n], "output");
        *n += 1;
        assert!(positions.insert((output["partition"].as_u64(), output["offset"].as_u64())), "duplicate {output}");
    }
}

/// State far larger than the cache and RocksDB's memory — 100,000 vehicles seen about
/// twice each, a 1 MiB cache, 8 MiB for RocksDB, a commit every 10,000 records — is read
/// back from table files (through their bloom filters, past the memtables' filter) and
/// committed in key order commit after commit: every output and the final state still
/// equal the reference fold.
#[test]
fn state_far_larger_than_the_cache_equals_the_reference_fold() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let input = dir.path().join("input.jsonl");
    generate(&input, 100_000, 200_000, 5)?;
    let reference = Reference::fold(&input)?;
    let operator = operator_wasm("vehicle_stats");
    let config = dir.path().join("small.toml");
    std::fs::write(
        &config,
        format!(
            "[operator]\npath = {operator:?}\n[state]\ncache_mib = 1\nrocksdb_memory_mib = 8\ncommit_every = 10000\n"
        ),
    )?;
    run_ok(run_file_job(&operator, &input, dir.path(), 1).arg("--config").arg(&config).arg("--no-checkpoints"))?;
    // The values' table files alone hold several times the cache, compressed (the other
    // two families' are a few KiB).
    let mut table_bytes = 0;
    for file in table_files(&dir.path().join("state/partition-0000"))? {
        table_bytes += std::fs::metadata(&file)?.len();
    }
    assert!(table_bytes > 4 << 20, "the state went to table files ({table_bytes} bytes)");
    assert_outputs_are_the_fold(&read_jsonl(&dir.path().join("out.jsonl"))?, &reference);
    assert_state_matches(&dump_state(&dir.path().join("state"))?, &reference, "final state");
    Ok(())
}

/// Outputs to what cannot be synced — `/dev/null`, a FIFO — are written unsynced: the job
/// runs to its end with `sync_outputs` on (the default), says so once per sink at its
/// start, and a reader at the FIFO gets every line.
#[test]
fn outputs_to_dev_null_or_a_fifo_are_written_unsynced_and_the_job_runs() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let input = dir.path().join("input.jsonl");
    generate(&input, 10, 500, 3)?;
    let reference = Reference::fold(&input)?;
    let vehicle_stats = operator_wasm("vehicle_stats");

    let null = dir.path().join("null");
    let mut job = run_file_job(&vehicle_stats, &input, &null, 2);
    let run = run_ok(job.args(["--output", "/dev/null", "--dead-letter", "/dev/null"]).env("SLUICE_LOG", "info"))?;
    let log = String::from_utf8_lossy(&run.stderr);
    assert_eq!(
        log.matches(sluice::events::NOT_SYNCED).count(),
        2,
        "once for the outputs, once for the dead letters: {log}"
    );
    assert_state_matches(&dump_state(&null.join("state"))?, &reference, "state of a job writing to /dev/null");

    let fifo = dir.path().join("outputs.fifo");
    run_ok(std::process::Command::new("mkfifo").arg(&fifo))?;
    // Opening a FIFO to read waits for a writer: the host, once it opens its sink.
    let reader = std::thread::spawn({
        let fifo = fifo.clone();
        move || std::fs::read_to_string(fifo)
    });
    let piped = dir.path().join("piped");
    let run = run_ok(run_file_job(&vehicle_stats, &input, &piped, 2).arg("--output").arg(&fifo));
    // Should the host never have opened it, a writer of our own lets the reader end.
    drop(std::fs::OpenOptions::new().read(true).write(true).open(&fifo)?);
    let lines = reader.join().expect("the FIFO's reader")?;
    run?;
    assert_eq!(lines.lines().count(), reference.after_each.len(), "every output reached the FIFO's reader");
    assert_state_matches(&dump_state(&piped.join("state"))?, &reference, "state of a job writing to a FIFO");
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

/// The same operator built against WIT 0.1.0 (one `process` call per record) and
/// against the current package (`process-batch`, a batch per call) gives the same
/// outputs, dead letters and state, poison records included.
#[test]
fn a_0_1_0_component_and_a_batched_one_give_the_same_outputs_and_state() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let input = dir.path().join("input.jsonl");
    generate(&input, 40, 3000, 12)?;
    let mut lines: Vec<String> = std::fs::read_to_string(&input)?.lines().map(String::from).collect();
    for at in [10, 700, 1500, 2999] {
        lines.insert(at, format!(r#"{{"vehicle_id":"veh-{:05}","ts":"poison {at}"}}"#, at % 40));
    }
    std::fs::write(&input, lines.join("\n") + "\n")?;

    let unbatched = operator_wasm("vehicle_stats_0_1_0");
    let batched = operator_wasm("vehicle_stats");
    let contains = |wasm: &std::path::Path, text: &str| -> Result<bool> {
        Ok(std::fs::read(wasm)?.windows(text.len()).any(|w| w == text.as_bytes()))
    };
    assert!(contains(&unbatched, "sluice:operator/state@0.1.0")? && !contains(&unbatched, "process-batch")?);
    assert!(contains(&batched, "sluice:operator/batch@0.1.3")? && contains(&batched, "process-batch")?);

    // What a run wrote, without the field that names the build, in input order (the
    // partitions' workers interleave their lines differently from run to run).
    let run = |wasm: &std::path::Path, name: &str| -> Result<(Vec<Value>, Vec<Value>, StateDump)> {
        let run_dir = dir.path().join(name);
        run_ok(&mut run_file_job(wasm, &input, &run_dir, 3))?;
        let without_build = |mut line: Value| {
            line.as_object_mut().expect("a JSON object").remove("operator");
            line
        };
        let in_input_order = |lines: Vec<Value>| {
            let mut lines: Vec<Value> = lines.into_iter().map(without_build).collect();
            lines.sort_by_key(|line| (line["partition"].as_u64(), line["offset"].as_u64()));
            lines
        };
        let outputs = in_input_order(read_jsonl(&run_dir.join("out.jsonl"))?);
        let dead = in_input_order(read_jsonl(&run_dir.join("dead.jsonl"))?);
        Ok((outputs, dead, dump_state(&run_dir.join("state"))?))
    };
    let (outputs, dead, state) = run(&unbatched, "0.1.0")?;
    assert_eq!((outputs.len(), dead.len()), (3000, 4));
    assert_state_matches(&state, &Reference::fold(&input)?, "state of the 0.1.0 build");
    let batched_run = run(&batched, "0.1.1")?;
    assert_eq!(batched_run.0.len(), outputs.len());
    if let Some((batched, unbatched)) = batched_run.0.iter().zip(&outputs).find(|(a, b)| a != b) {
        panic!("the batched build's outputs differ: {batched} where the 0.1.0 build has {unbatched}");
    }
    assert_eq!(batched_run.1, dead, "dead letters");
    assert!(batched_run.2 == state, "the batched build's state differs");
    Ok(())
}

/// `[state] rocksdb_memory_mib` bounds RocksDB's memtables: under a small budget they
/// are flushed to table files while the job runs; under a large one the same writes
/// stay in memory (RocksDB's defaults would hold them too).
#[test]
fn the_rocksdb_memory_budget_bounds_the_memtables() -> Result<()> {
    let table_files_at = |budget_mib: u32| -> Result<usize> {
        let dir = tempfile::tempdir()?;
        // ~126,000 vehicles' summaries, ~34 MiB, written in two commits or more (one
        // per 100,000 records at most): the budget is checked at each.
        run_ok(run_generator_job(dir.path(), 200_000, 200_000, 3, 1).args([
            "--no-checkpoints",
            "--rocksdb-memory-mib",
            &budget_mib.to_string(),
        ]))?;
        Ok(table_files(&dir.path().join("state/partition-0000"))?.len())
    };
    assert!(table_files_at(8)? >= 1, "an 8 MiB budget flushes the memtables");
    assert_eq!(table_files_at(1024)?, 0, "a 1 GiB budget keeps them in memory");
    Ok(())
}

/// The table files (`.sst`) of the RocksDB database at `dir`.
fn table_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for file in std::fs::read_dir(dir)? {
        let path = file?.path();
        if path.extension().is_some_and(|e| e == "sst") {
            files.push(path);
        }
    }
    Ok(files)
}

/// The example operators beside vehicle-stats, each over its fixtures: `sluice test`
/// gives exactly the expected lines, and a 2-partition `sluice run` over the same input
/// gives the same outputs (per key, in order) — dedup passes each id's first record of
/// its window, and sessions closes each user's session once the user was inactive for
/// the gap (the run's clock ends at its last record, so the last session stays open).
#[test]
fn dedup_and_sessions_give_their_fixtures_in_sluice_test_and_in_a_run() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let fixtures =
        |operator: &str| Path::new(env!("CARGO_MANIFEST_DIR")).join("../operators").join(operator).join("fixtures");
    // (operator, key field, config, the clock moved to after the last record, lines a run gives)
    let cases = [
        ("dedup", "id", "window_ms", "60000", None, 4),
        ("sessions", "user", "gap_ms", "60000", Some("1767225800000"), 2),
    ];
    for (operator, key_field, setting, value, advance_to, in_a_run) in cases {
        let mut test = sluice();
        test.arg("test").arg(operator_wasm(operator)).arg("--input").arg(fixtures(operator).join("input.jsonl"));
        test.args(["--key-field", key_field, "--config", &format!("{setting}={value}"), "--expect"]);
        test.arg(fixtures(operator).join("expected.jsonl"));
        if let Some(at) = advance_to {
            test.args(["--advance-to", at]);
        }
        let said = String::from_utf8(run_ok(&mut test)?.stderr)?;
        assert!(said.contains("as expected"), "{operator}: {said}");

        let home = dir.path().join(operator);
        std::fs::create_dir_all(&home)?;
        let config = home.join("job.toml");
        std::fs::write(
            &config,
            format!(
                "[operator]\npath = {:?}\n[operator.config]\n{setting} = \"{value}\"\n\
                 [source]\nkind = \"file\"\npath = {:?}\nkey_field = \"{key_field}\"\n\
                 [sink]\nkind = \"file\"\npath = {:?}\n[state]\ndir = {:?}\npartitions = 2\n\
                 [dead_letter]\npath = {:?}\n",
                operator_wasm(operator),
                fixtures(operator).join("input.jsonl"),
                home.join("out.jsonl"),
                home.join("state"),
                home.join("dead.jsonl"),
            ),
        )?;
        run_ok(sluice().arg("run").arg("--config").arg(&config))?;
        // Per key, in order, matched as `sluice test` matches lines.
        let per_key = |lines: Vec<Value>| {
            let mut keys: BTreeMap<String, Vec<Value>> = BTreeMap::new();
            for line in lines {
                keys.entry(line["key"].as_str().unwrap_or_default().to_string()).or_default().push(line);
            }
            keys
        };
        let expected = read_jsonl(&fixtures(operator).join("expected.jsonl"))?;
        let (expected, actual) =
            (per_key(expected.into_iter().take(in_a_run).collect()), per_key(read_jsonl(&home.join("out.jsonl"))?));
        assert_eq!(expected.keys().collect::<Vec<_>>(), actual.keys().collect::<Vec<_>>(), "{operator} in a run");
        for (key, lines) in &expected {
            let differences = sluice::test_driver::differences("output", lines, &actual[key]);
            assert!(differences.is_empty(), "{operator} in a run, key {key}: {differences:#?}");
        }
        assert!(read_jsonl(&home.join("dead.jsonl"))?.is_empty(), "{operator}: no dead letters");
    }
    Ok(())
}
