//! The first complete path of a record, through the real binary: JSONL file →
//! partition workers → vehicle-stats (WASM) → RocksDB state → JSONL sink.

use anyhow::Result;
use serde_json::Value;
use sluice_tests::*;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

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
        log.matches(sluice::sink::NOT_SYNCED).count(),
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
/// against 0.1.2 (`process-batch`, a batch per call) gives the same outputs, dead
/// letters and state, poison records included.
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
    assert!(contains(&batched, "sluice:operator/batch@0.1.2")? && contains(&batched, "process-batch")?);

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
    let table_files = |budget_mib: u32| -> Result<usize> {
        let dir = tempfile::tempdir()?;
        // ~126,000 vehicles' summaries, ~34 MiB, written in two commits or more (one
        // per 100,000 records at most): the budget is checked at each.
        run_ok(run_generator_job(dir.path(), 200_000, 200_000, 3, 1).args([
            "--no-checkpoints",
            "--rocksdb-memory-mib",
            &budget_mib.to_string(),
        ]))?;
        let files = std::fs::read_dir(dir.path().join("state/partition-0000"))?;
        Ok(files.filter(|f| f.as_ref().is_ok_and(|f| f.path().extension().is_some_and(|e| e == "sst"))).count())
    };
    assert!(table_files(8)? >= 1, "an 8 MiB budget flushes the memtables");
    assert_eq!(table_files(1024)?, 0, "a 1 GiB budget keeps them in memory");
    Ok(())
}

/// Event-time TTL through the binary: the state of a vehicle that stopped reporting is
/// removed once the partition's clock (its largest timestamp) passes the vehicle's last
/// report plus the TTL; a vehicle still reporting keeps its state, whose expiry `state
/// dump` shows.
#[test]
fn the_state_of_a_vehicle_that_stopped_reporting_expires_in_event_time() -> Result<()> {
    const T0: i64 = 1_700_000_000_000;
    let dir = tempfile::tempdir()?;
    let input = dir.path().join("input.jsonl");
    let line = |vehicle: &str, ts: i64| {
        format!(r#"{{"vehicle_id":"{vehicle}","ts":{ts},"lat":52.5,"lon":13.4,"speed_kmh":50.0}}"#)
    };
    let mut lines = vec![line("gone", T0), line("gone", T0 + 1_000)];
    lines.extend((0..=20).map(|second| line("stays", T0 + second * 1_000)));
    std::fs::write(&input, lines.join("\n") + "\n")?;
    let run = run_ok(run_file_job(&operator_wasm("vehicle_stats"), &input, dir.path(), 1).args(["--ttl", "10s"]))?;
    let report = String::from_utf8_lossy(&run.stderr);
    assert!(report.contains("1 expired state entries removed"), "{report}");

    let dump = run_ok(sluice().args(["state", "dump", "--state-dir"]).arg(dir.path().join("state")))?;
    let entries: Vec<Value> =
        String::from_utf8(dump.stdout)?.lines().map(serde_json::from_str).collect::<Result<_, _>>()?;
    assert!(entries.iter().all(|e| e["key"] == "stays"), "{entries:?}");
    assert!(!entries.is_empty());
    for entry in &entries {
        assert_eq!(entry["expires_at_ms"], T0 + 30_000, "the last write plus the TTL: {entry}");
    }

    // vehicle-stats is told of the expiry: "gone" left the fleet, with its final
    // summary, before the first record whose time reached the expiry (offset 13,
    // "stays" at T0 + 11 s).
    let left = |dir: &Path| -> Result<Vec<Value>> {
        let outputs = read_jsonl(&dir.join("out.jsonl"))?;
        Ok(outputs.into_iter().filter(|o| o.get("cause").is_some()).collect())
    };
    let expected = |left: &[Value]| {
        assert_eq!(left.len(), 1, "{left:?}");
        let (output, value) = (&left[0], &left[0]["value"]);
        assert_eq!(
            (&output["cause"], &output["key"], &output["offset"]),
            (&"expiry".into(), &"gone".into(), &13.into())
        );
        assert_eq!((&value["left_fleet_at"], &value["count"]), (&(T0 + 11_000).into(), &2.into()), "{output}");
    };
    expected(&left(dir.path())?);

    // Without a TTL the same input keeps both...
    let again = tempfile::tempdir()?;
    run_ok(&mut run_file_job(&operator_wasm("vehicle_stats"), &input, again.path(), 1))?;
    assert_eq!(dump_state(&again.path().join("state"))?.len(), 2);
    assert_eq!(left(again.path())?, Vec::<Value>::new());

    // ... and vehicle-stats's own "left the fleet" TTL, from its config, does as the
    // host's did.
    let own = tempfile::tempdir()?;
    let config = own.path().join("job.toml");
    let operator = format!("[operator]\npath = {:?}\n", operator_wasm("vehicle_stats"));
    std::fs::write(&config, operator + "[operator.config]\nleft_fleet_after_ms = \"10000\"\n")?;
    run_ok(run_file_job(&operator_wasm("vehicle_stats"), &input, own.path(), 1).arg("--config").arg(&config))?;
    expected(&left(own.path())?);
    assert_eq!(dump_state(&own.path().join("state"))?.keys().collect::<Vec<_>>(), ["stays"]);
    Ok(())
}

/// Fleet churn: a vehicle leaves for good and a new one joins every 20 records, so the
/// vehicles seen grow without bound. One run of 20 TTLs of event time each way,
/// checkpointing every 200 ms: with a TTL the live entries stay where they were at 10
/// TTLs while the vehicles seen double, and the checkpoints of the second half are no
/// larger than those of the first (their size swings as flushed files wait for
/// compaction, so the largest of each half is compared); without one both grow with
/// the vehicles seen. (`./dev.sh bench` runs the long version: host/benches/churn.rs.)
#[test]
fn state_plateaus_under_churn_with_a_ttl_and_grows_with_the_vehicles_seen_without() -> Result<()> {
    // 60 s of event time at 10 ms per record: one TTL is 6,000 records; the 200
    // vehicles in the fleet report every 2 s on average.
    const RECORDS: u64 = 20 * 6_000;
    let dir = tempfile::tempdir()?;
    // Per checkpoint of partition 0, oldest first: (offset, entries, bytes).
    let run = |name: &str, ttl: bool| -> Result<Vec<(u64, u64, u64)>> {
        let home = dir.path().join(name);
        std::fs::create_dir_all(&home)?;
        let config = home.join("job.toml");
        std::fs::write(&config, "[operator]\npath = \"set-by-flag.wasm\"\n[checkpoint]\nretain = 10000\n")?;
        let mut command = run_generator_job(&home, 200, RECORDS, 9, 2);
        command.arg("--config").arg(&config).args(["--churn", "20", "--checkpoint-interval", "200ms"]);
        command.args(["--rate", "20000"]);
        if ttl {
            command.args(["--ttl", "60s"]);
        }
        run_ok(&mut command)?;
        let manifests = checkpoint_manifests(&home.join("state.checkpoints"), 0)?;
        let bytes = |m: &Value| m["files"].as_array().map_or(0, |f| f.iter().filter_map(|f| f["size"].as_u64()).sum());
        Ok(manifests
            .iter()
            .map(|m| (m["offset"].as_u64().unwrap(), m["entries"].as_u64().unwrap(), bytes(m)))
            .collect())
    };
    // The checkpoint at about half the partition's records, the last one, and the
    // largest checkpoint of each half.
    let halves = |checkpoints: &[(u64, u64, u64)]| {
        let end = checkpoints.last().expect("a checkpoint at the end").0;
        let (first, second): (Vec<&(u64, u64, u64)>, Vec<_>) = checkpoints.iter().partition(|c| c.0 <= end / 2);
        assert!(first.len() >= 5 && second.len() >= 5, "checkpoints all along: {checkpoints:?}");
        let largest = |half: &[&(u64, u64, u64)]| half.iter().map(|c| c.2).max().unwrap();
        (*first[first.len() - 1], checkpoints[checkpoints.len() - 1], largest(&first), largest(&second))
    };
    let (ttl_mid, ttl_end, ttl_first, ttl_second) = halves(&run("ttl", true)?);
    let (none_mid, none_end, none_first, none_second) = halves(&run("none", false)?);
    let summary = format!("with a TTL {ttl_mid:?} {ttl_end:?}, without {none_mid:?} {none_end:?}");
    assert!((ttl_end.1 as f64) < 1.15 * ttl_mid.1 as f64, "entries plateau: {summary}");
    assert!((ttl_second as f64) < 1.25 * ttl_first as f64, "checkpoints plateau: {ttl_first} then {ttl_second}");
    assert!((none_end.1 as f64) > 1.8 * none_mid.1 as f64, "entries grow: {summary}");
    assert!((none_second as f64) > 1.6 * none_first as f64, "checkpoints grow: {none_first} then {none_second}");
    Ok(())
}

/// A job's state written before values carried an expiry (state format 1) is migrated
/// when a TTL-aware sluice opens it, and kept: continued with a TTL, it ends exactly as
/// the same job whose state was never in format 1 (values, and expiries only on what
/// was written since).
#[test]
fn state_of_format_1_is_migrated_and_kept_when_a_ttl_comes() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let job = |name: &str, count: u64| run_generator_job(&dir.path().join(name), 300, count, 13, 2);
    for name in ["migrated", "never"] {
        run_ok(&mut job(name, 20_000))?;
    }
    downgrade_to_format_1(&dir.path().join("migrated/state"), 2)?;
    let log = run_ok(job("migrated", 40_000).args(["--ttl", "3s"]).env("SLUICE_LOG", "info"))?;
    let log = String::from_utf8_lossy(&log.stderr);
    assert!(log.contains("is in format 1: migrating it to 2") && log.contains("20000 records skipped"), "{log}");
    run_ok(job("never", 40_000).args(["--ttl", "3s"]))?;
    let state = |name: &str| dump_state_lines(&dir.path().join(name).join("state"));
    let migrated = state("migrated")?;
    assert!(migrated.iter().any(|line| line.contains("expires_at_ms")), "what was written since expires");
    assert_eq!(migrated, state("never")?);
    Ok(())
}

/// Rewrites the state directory `state` (written by this sluice without a TTL) as sluice
/// wrote it before values carried an expiry: each value without its header byte, no
/// expiry index and no clock, format 1 recorded in the directory and in each database.
fn downgrade_to_format_1(state: &Path, partitions: u32) -> Result<()> {
    let manifest = state.join("sluice-state.json");
    let mut recorded: Value = serde_json::from_slice(&std::fs::read(&manifest)?)?;
    recorded["format"] = 1.into();
    std::fs::write(&manifest, serde_json::to_vec(&recorded)?)?;
    for partition in 0..partitions {
        let path = state.join(format!("partition-{partition:04}"));
        let mut db = rocksdb::DB::open_cf(&rocksdb::Options::default(), &path, ["meta", "expiry"])?;
        let values = db.iterator(rocksdb::IteratorMode::Start).collect::<Result<Vec<_>, _>>()?;
        for (key, value) in values {
            anyhow::ensure!(value.first() == Some(&0), "a value that expires: the job had no TTL");
            db.put(key, &value[1..])?;
        }
        let meta = db.cf_handle("meta").expect("opened with it");
        db.put_cf(meta, b"format", 1u32.to_be_bytes())?;
        db.delete_cf(meta, b"clock")?;
        db.drop_cf("expiry")?;
    }
    Ok(())
}

/// The log as a platform team reads it: no escape sequences in a file or a pipe, colours
/// on a terminal unless `NO_COLOR` is set, one JSON object a line with `--log-format
/// json` (running summary included, partitions as fields), and a running summary of an
/// 8-partition job that lists only the partitions worth attention.
#[test]
fn logs_are_plain_in_files_coloured_on_terminals_and_json_when_asked() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let job = |name: &str| {
        let home = dir.path().join(name);
        let mut command = run_generator_job(&home, 200, 12_000, 11, 8);
        command.args(["--rate", "4000", "--report-interval", "0.3"]).env("SLUICE_LOG", "info");
        command
    };
    let piped = String::from_utf8(run_ok(&mut job("piped"))?.stderr)?;
    assert!(!piped.contains('\x1b'), "escape sequences in a pipe:\n{piped}");
    let summaries: Vec<&str> = piped.split("sluice::summary").skip(1).collect();
    assert!(!summaries.is_empty(), "{piped}");
    for summary in &summaries {
        let lines: Vec<&str> = summary.lines().skip(1).take_while(|l| l.starts_with("  p")).collect();
        assert!(lines.len() <= 4, "8 partitions, only those worth attention:\n{summary}");
    }
    assert!(summaries.iter().any(|s| s.contains("(slowest") || s.contains("largest")), "{piped}");
    // A summary counts the partitions running when it is written: the first may come
    // while some of the eight are still opening their state.
    assert!(summaries.iter().any(|s| s.contains("8 partitions")), "{piped}");

    // `script` gives the job a terminal.
    let on_terminal = |no_color: bool| -> Result<String> {
        let command = job(if no_color { "plain" } else { "terminal" });
        let words = std::iter::once(command.get_program()).chain(command.get_args());
        let line: Vec<String> = words.map(|w| format!("'{}'", w.to_string_lossy())).collect();
        let mut script = std::process::Command::new("script");
        script.args(["-qec", &format!("{} 2>&1", line.join(" ")), "/dev/null"]);
        script.envs(command.get_envs().filter_map(|(key, value)| Some((key, value?))));
        if no_color {
            script.env("NO_COLOR", "1");
        }
        Ok(String::from_utf8_lossy(&run_ok(&mut script)?.stdout).into_owned())
    };
    assert!(on_terminal(false)?.contains("\x1b["), "colours on a terminal");
    assert!(!on_terminal(true)?.contains("\x1b["), "NO_COLOR is respected");

    let json = String::from_utf8(run_ok(job("json").arg("--log-format").arg("json"))?.stderr)?;
    let events: Vec<Value> =
        json.lines().filter(|l| l.starts_with('{')).map(serde_json::from_str).collect::<Result<_, _>>()?;
    assert!(events.iter().all(|e| e["level"].is_string() && e["message"].is_string()), "{json}");
    assert!(events.iter().any(|e| e["target"] == "sluice::summary"), "{json}");
    assert!(events.iter().any(|e| e["partition"].is_u64()), "partitions as fields:\n{json}");
    let report = json.lines().skip_while(|l| l.starts_with('{')).collect::<Vec<_>>();
    assert!(report.iter().all(|l| !l.starts_with('{')), "only the final report follows the events:\n{json}");
    Ok(())
}

/// Warnings say what is wrong and the setting that tunes it: one partition holding most
/// of the state and taking most of the time, and records failing into the dead letters
/// (the probe over a paced file); then checkpoints falling behind once the store fails.
#[test]
fn warnings_name_skew_failing_records_and_checkpoints_behind_with_their_settings() -> Result<()> {
    use sluice::warnings::{CHECKPOINTS_BEHIND, DEAD_LETTERS_RISING, SKEWED_STATE, SKEWED_TIME};
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    let keys_in = |partition: u32| {
        (0..).map(|i| format!("v{i}")).filter(move |k| sluice::source::partition_for(k.as_bytes(), 4) == partition)
    };
    let record = |key: &str, action: serde_json::Value| {
        let mut line = action;
        line["vehicle_id"] = key.into();
        line.to_string()
    };
    let mut hot = Vec::new();
    for (i, key) in keys_in(0).take(3000).enumerate() {
        hot.push(record(&key, serde_json::json!({"action": "count"})));
        // Batches holding one take tens of ms, past the 10 ms below which no skew is
        // called, with room on a fast core.
        if i % 25 == 0 {
            hot.push(record(&key, serde_json::json!({"action": "work", "iterations": 100_000_000})));
        }
        if i % 10 == 0 {
            hot.push(record(&key, serde_json::json!({"action": "put-then-fail"})));
        }
    }
    let cold: Vec<String> = (1..4)
        .flat_map(|p| keys_in(p).take(20).collect::<Vec<_>>())
        .flat_map(|key| (0..5).map(move |_| key.clone()))
        .map(|key| record(&key, serde_json::json!({"action": "count"})))
        .collect();
    // The cold records spread over the whole run, between the hot ones.
    let (mut lines, step) = (Vec::new(), hot.len() / cold.len());
    for (i, line) in hot.iter().enumerate() {
        lines.push(line.clone());
        if i % step == 0 {
            lines.extend(cold.get(i / step).cloned());
        }
    }
    let input = dir.join("skewed.jsonl");
    std::fs::write(&input, lines.join("\n") + "\n")?;
    let run = run_ok(run_file_job(&operator_wasm("probe"), &input, dir, 4).args(["--rate", "600"]))?;
    let log = String::from_utf8_lossy(&run.stderr);
    for warning in [SKEWED_STATE, SKEWED_TIME] {
        assert!(log.contains(&format!("{warning}: partition 0")) && log.contains("skew_ratio"), "{warning}:\n{log}");
    }
    assert!(log.contains(DEAD_LETTERS_RISING) && log.contains("dead_letter_ratio"), "{log}");

    // One vehicle: one partition busy, the other idle, its state held by its last
    // checkpoint however old that is. Every 0.3 s a checkpoint: none behind until the
    // store fails.
    let store = dir.join("store");
    let home = dir.join("behind");
    let mut job = run_generator_job(&home, 1, 60_000, 11, 2);
    job.args(["--rate", "1000", "--checkpoint-interval", "0.3", "--report-interval", "0.5"]).arg("--checkpoint-store");
    let mut host = Host::spawn("behind", job.arg(&store), &dir.join("behind.log"))?;
    host.wait_for("sluice::summary", 1, std::time::Duration::from_secs(60))?;
    std::thread::sleep(sluice::warnings::CHECK_EVERY + std::time::Duration::from_secs(1));
    assert!(!host.log().contains(CHECKPOINTS_BEHIND), "{}", host.log());
    std::fs::rename(&store, dir.join("store.away"))?;
    std::fs::write(&store, "not a directory")?;
    host.wait_for(CHECKPOINTS_BEHIND, 1, std::time::Duration::from_secs(30))?;
    host.kill_9()?;
    assert!(host.log().contains("checkpoint_age_intervals = 3"), "{}", host.log());
    Ok(())
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
