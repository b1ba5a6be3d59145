//! `sluice replay`: a partition of a stopped file job (and of a Kafka job, from its
//! topic) replayed from one of its checkpoints. With the version that ran it the outputs, dead letters and final state
//! are the live run's byte for byte — expiries and timers included, Python and TypeScript builds too — and `--compare`
//! finds no difference; with vehicle-stats v2 it reports exactly the records whose
//! outputs changed, and how; a missing or corrupt checkpoint, a used output directory
//! and a file that is not a component are refused by name, the store left as it was.

use anyhow::{Context, Result};
use serde_json::Value;
use sluice_e2e::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const PARTITIONS: u32 = 2;

/// A stopped file job of `operator` (with `config`, TOML lines of `[operator.config]`)
/// over `input` in `dir`, checkpointing after every commit of 100 records (read at 5000
/// records a second, so that checkpoints keep up); returns its config file.
fn run_checkpointed_job(dir: &Path, operator: &str, config: &str, input: &Path) -> Result<PathBuf> {
    let job = dir.join("job.toml");
    std::fs::create_dir_all(dir)?;
    std::fs::write(
        &job,
        format!(
            "[operator]\npath = {operator:?}\n[operator.config]\n{config}\n[source]\nkind = \"file\"\npath = {input:?}\nrate = 5000\n\
             [sink]\nkind = \"file\"\npath = {out:?}\n[dead_letter]\npath = {dead:?}\n[state]\ndir = {state:?}\n\
             partitions = {PARTITIONS}\nbatch_records = 100\ncommit_every = 100\n[checkpoint]\ninterval = \"0s\"\n\
             retain = 1000\n[report]\ninterval = \"0s\"\n",
            operator = operator_wasm(operator),
            out = dir.join("out.jsonl"),
            dead = dir.join("dead.jsonl"),
            state = dir.join("state"),
        ),
    )?;
    run_ok(sluice().arg("run").arg("--config").arg(&job))?;
    Ok(job)
}

/// The raw lines of the JSONL file `path` of `partition` from offset `from` on, as
/// written (a missing file has none).
fn lines_from(path: &Path, partition: u32, from: u64) -> Result<String> {
    let text = std::fs::read_to_string(path).or_else(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Ok(String::new()),
        _ => Err(e),
    })?;
    let mut kept = String::new();
    for line in text.lines() {
        let value: Value = serde_json::from_str(line)?;
        if value["partition"] == partition && value["offset"].as_u64().context("an offset")? >= from {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    Ok(kept)
}

/// The id and offset of a checkpoint of `partition` in the middle of its run.
fn middle_checkpoint(dir: &Path, partition: u32) -> Result<(u64, u64)> {
    let manifests = checkpoint_manifests(&dir.join("state.checkpoints"), partition)?;
    assert!(manifests.len() > 4, "checkpoints along the run: {}", manifests.len());
    let middle = &manifests[manifests.len() / 2];
    Ok((middle["id"].as_u64().context("an id")?, middle["offset"].as_u64().context("an offset")?))
}

/// `sluice replay` of `partition` from `checkpoint` of the job `job` into `out`, with
/// `args` after.
fn replay(job: &Path, partition: u32, checkpoint: u64, out: &Path, args: &[&str]) -> std::process::Command {
    let mut command = sluice();
    command.arg("replay").arg("--config").arg(job).arg("--out").arg(out);
    command.args(["--partition", &partition.to_string(), "--checkpoint", &checkpoint.to_string()]).args(args);
    command
}

/// vehicle-stats with vehicles leaving the fleet (their summaries expire through its
/// `expired`) and speed-windows (windows closed by timers), in Rust, Python and
/// TypeScript, each replayed with its own version from a checkpoint in the middle of each
/// partition's run: outputs, dead letters and final state equal the live run's, byte for
/// byte.
#[test]
fn a_replay_with_the_version_that_ran_repeats_the_live_run_byte_for_byte() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let input = dir.path().join("input.jsonl");
    let args = ["--vehicles", "40", "--count", "6000", "--seed", "5", "--churn", "25"];
    generate_edited(&input, &args, every_100_ms)?;
    for (operator, config, cause) in [
        ("vehicle_stats", "left_fleet_after_ms = \"20000\"", "\"cause\":\"expiry\""),
        ("speed_windows", "", "\"cause\":\"timer\""),
        ("speed_windows_py", "", "\"cause\":\"timer\""),
        ("speed_windows_ts", "", "\"cause\":\"timer\""),
    ] {
        let dir = dir.path().join(operator);
        let job = run_checkpointed_job(&dir, operator, config, &input)?;
        for partition in 0..PARTITIONS {
            let (checkpoint, offset) = middle_checkpoint(&dir, partition)?;
            let out = dir.join(format!("replay-{partition}"));
            let replayed =
                run_ok(replay(&job, partition, checkpoint, &out, &[]).arg("--compare").arg(dir.join("out.jsonl")))?;
            let stdout = String::from_utf8(replayed.stdout)?;
            assert!(stdout.contains(" 0 different, 0 only in the live outputs, 0 only in the replay's"), "{stdout}");
            let context = format!("{operator}, partition {partition} from checkpoint {checkpoint} (offset {offset})");
            let live = lines_from(&dir.join("out.jsonl"), partition, offset)?;
            assert!(live.contains(cause), "{context}: the replayed range has {cause} outputs");
            assert_eq!(std::fs::read_to_string(out.join("outputs.jsonl"))?, live, "{context}: outputs");
            assert_eq!(
                lines_from(&out.join("dead-letters.jsonl"), partition, offset)?,
                lines_from(&dir.join("dead.jsonl"), partition, offset)?,
                "{context}: dead letters"
            );
            let live_state: Vec<String> = dump_state_lines(&dir.join("state"))?
                .into_iter()
                .filter(|line| serde_json::from_str::<Value>(line).is_ok_and(|entry| entry["partition"] == partition))
                .collect();
            let mut replayed_state: Vec<String> =
                std::fs::read_to_string(out.join("state.jsonl"))?.lines().map(str::to_string).collect();
            replayed_state.sort();
            assert!(!live_state.is_empty());
            assert_eq!(replayed_state, live_state, "{context}: final state");
        }
    }
    Ok(())
}

/// A Kafka job's partition, read again from its topic from a checkpoint's offset (a
/// consumer of no group's): the outputs and state are the live run's byte for byte.
#[test]
fn a_kafka_partition_replays_from_its_topic_byte_for_byte() -> Result<()> {
    let job = KafkaJob::on(KafkaBroker::shared()?).topic("positions", PARTITIONS as i32).start()?;
    let group = job.broker.name("replayed");
    let dir = job.dir().to_path_buf();
    let input = job.generate("input.jsonl", 40, 4000)?;
    job.broker.produce_lines("positions", &input)?;
    let config = dir.join("job.toml");
    std::fs::write(
        &config,
        format!(
            "[operator]\npath = {:?}\n[source]\nkind = \"kafka\"\nbrokers = \"{}\"\ntopic = {:?}\ngroup = {group:?}\n\
             stop_when_idle = \"2s\"\n[sink]\nkind = \"file\"\npath = {:?}\n[dead_letter]\npath = {:?}\n[state]\ndir = {:?}\n\
             partitions = {PARTITIONS}\nbatch_records = 100\ncommit_every = 100\n[checkpoint]\ninterval = \"0s\"\n\
             retain = 1000\n[report]\ninterval = \"0s\"\n",
            operator_wasm("vehicle_stats"),
            job.broker.bootstrap,
            job.broker.name("positions"),
            dir.join("out.jsonl"),
            dir.join("dead.jsonl"),
            dir.join("state"),
        ),
    )?;
    run_ok(sluice().arg("run").arg("--config").arg(&config))?;
    let live_state = dump_state_lines(&dir.join("state"))?;
    for partition in 0..PARTITIONS {
        let manifests = checkpoint_manifests(&dir.join("state.checkpoints"), partition)?;
        let middle = &manifests[manifests.len() / 2];
        let (checkpoint, offset) =
            (middle["id"].as_u64().context("an id")?, middle["offset"].as_u64().context("an offset")?);
        assert!(offset > 0, "a checkpoint in the middle of the run");
        let out = dir.join(format!("replay-{partition}"));
        let mut command = replay(&config, partition, checkpoint, &out, &[]);
        let replayed = run_ok(command.arg("--compare").arg(dir.join("out.jsonl")))?;
        let stdout = String::from_utf8(replayed.stdout)?;
        assert!(stdout.contains(" 0 different, 0 only in the live outputs, 0 only in the replay's"), "{stdout}");
        let live = lines_from(&dir.join("out.jsonl"), partition, offset)?;
        assert_eq!(std::fs::read_to_string(out.join("outputs.jsonl"))?, live, "partition {partition}: outputs");
        let mut state: Vec<String> =
            std::fs::read_to_string(out.join("state.jsonl"))?.lines().map(str::to_string).collect();
        state.sort();
        let of_partition =
            |line: &String| serde_json::from_str::<Value>(line).is_ok_and(|e| e["partition"] == partition);
        assert_eq!(state, live_state.iter().filter(|l| of_partition(l)).cloned().collect::<Vec<_>>());
    }
    // A replay stopping half-way under properties that name the job's group and commit
    // on their own: the group's offsets stay where the live job left them.
    let committed = job.broker.committed("replayed", "positions")?;
    let committing = dir.join("committing.toml");
    let properties = format!(
        "[source.properties]\n\"group.id\" = {group:?}\n\"enable.auto.commit\" = \"true\"\n\
         \"auto.commit.interval.ms\" = \"10\"\n"
    );
    std::fs::write(&committing, std::fs::read_to_string(&config)? + &properties)?;
    let first = &checkpoint_manifests(&dir.join("state.checkpoints"), 0)?[0];
    let (id, offset) = (first["id"].as_u64().context("an id")?, first["offset"].as_u64().context("an offset")?);
    let until = (offset + 50).to_string();
    run_ok(&mut replay(&committing, 0, id, &dir.join("half-way"), &["--until", &until]))?;
    assert_eq!(job.broker.committed("replayed", "positions")?, committed, "the replay committed to the job's group");
    Ok(())
}

/// vehicle-stats v2 over v1's checkpoint: every record's summary gains `idle_count`,
/// counted from the replay's start (v1's summaries have none), and nothing else
/// changes; the report names each record with that one field and both values, and
/// the exit code says the outputs differ.
#[test]
fn a_replay_of_a_new_version_reports_exactly_the_records_whose_outputs_changed() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let input = dir.path().join("input.jsonl");
    generate(&input, 30, 4000, 9)?;
    let job = run_checkpointed_job(dir.path(), "vehicle_stats", "", &input)?;
    let partition = 1;
    let (checkpoint, offset) = middle_checkpoint(dir.path(), partition)?;

    // The reference: each record of the partition from the checkpoint on, with the idle
    // positions of its vehicle from there up to it.
    let mut log = sluice::source::PartitionedLog::new(PARTITIONS);
    let mut idle: BTreeMap<String, u64> = BTreeMap::new();
    let mut expected: BTreeMap<u64, (String, u64)> = BTreeMap::new();
    for position in read_jsonl(&input)? {
        let vehicle = position["vehicle_id"].as_str().context("a vehicle")?.to_string();
        let record = log.place(sluice::record::RawRecord {
            key: vehicle.clone().into_bytes(),
            value: Vec::new(),
            timestamp_ms: 0,
        });
        if record.partition != partition || record.offset < offset {
            continue;
        }
        let count = idle.entry(vehicle.clone()).or_default();
        *count += u64::from(position["speed_kmh"].as_f64().context("a speed")? < 5.0);
        expected.insert(record.offset, (vehicle, *count));
    }
    assert!(idle.values().any(|&n| n > 0), "some positions are idle: {idle:?}");

    let out = dir.path().join("replay");
    let v2 = operator_wasm("vehicle_stats_v2");
    let mut command = replay(&job, partition, checkpoint, &out, &["--show", "2", "--operator"]);
    let failed = command.arg(&v2).arg("--compare").arg(dir.path().join("out.jsonl")).output()?;
    let (stdout, stderr) = (String::from_utf8(failed.stdout)?, String::from_utf8(failed.stderr)?);
    assert_eq!(failed.status.code(), Some(1), "{stdout}{stderr}");
    let records = expected.len();
    assert!(stdout.contains(&format!("{records} records and expiry groups, 0 equal, {records} different")), "{stdout}");
    assert!(stdout.contains("value.idle_count (live absent, replay 0)"), "{stdout}");
    assert!(stderr.contains(&format!("differ from {} for {records} records", dir.path().join("out.jsonl").display())));

    let differences = read_jsonl(&out.join("differences.jsonl"))?;
    let found: BTreeMap<u64, (String, u64)> = differences
        .iter()
        .map(|d| {
            let fields = d["fields"].as_array().expect("fields");
            assert_eq!(fields.len(), 1, "one field differs: {d}");
            assert_eq!((fields[0]["path"].as_str(), fields[0].get("left")), (Some("value.idle_count"), None), "{d}");
            let vehicle = d["key"].as_str().expect("a key").to_string();
            (d["offset"].as_u64().expect("an offset"), (vehicle, fields[0]["right"].as_u64().expect("a count")))
        })
        .collect();
    assert_eq!(found, expected);
    Ok(())
}

/// A used output directory, a checkpoint that does not exist, a file that is not a
/// component and a corrupt file in the store are each refused by name; the corrupt
/// file is left where it is (the store is the live job's).
#[test]
fn a_replay_refuses_bad_input_by_name_and_changes_no_store() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let input = dir.path().join("input.jsonl");
    generate(&input, 20, 2000, 4)?;
    let job = run_checkpointed_job(dir.path(), "vehicle_stats", "", &input)?;
    let (checkpoint, _) = middle_checkpoint(dir.path(), 0)?;
    let out = dir.path().join("replay");

    std::fs::create_dir_all(&out)?;
    std::fs::write(out.join("kept.txt"), "mine")?;
    let used = run_err(&mut replay(&job, 0, checkpoint, &out, &[]))?;
    assert!(used.contains(&format!("{} is not empty", out.display())), "{used}");
    assert_eq!(std::fs::read_to_string(out.join("kept.txt"))?, "mine");

    let fresh = dir.path().join("fresh");
    let missing = run_err(&mut replay(&job, 0, 9_999, &fresh, &[]))?;
    assert!(missing.contains("checkpoint 9999 of partition 0"), "{missing}");
    let not_wasm = run_err(replay(&job, 0, checkpoint, &dir.path().join("other"), &["--operator"]).arg(&job))?;
    assert!(not_wasm.contains(&format!("operator {}", job.display())), "{not_wasm}");

    let manifest = &checkpoint_manifests(&dir.path().join("state.checkpoints"), 0)?[checkpoint as usize - 1];
    assert_eq!(manifest["id"], checkpoint);
    let table = manifest["files"]
        .as_array()
        .context("files")?
        .iter()
        .find(|f| f["name"].as_str().is_some_and(|n| n.ends_with(".sst")))
        .context("a table file")?;
    let object = dir.path().join("state.checkpoints/partition-0000/files").join(format!(
        "{}.{}",
        table["name"].as_str().context("a name")?,
        table["checksum"].as_str().context("a checksum")?
    ));
    let mut bytes = std::fs::read(&object)?;
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&object, &bytes)?;
    let corrupt = run_err(&mut replay(&job, 0, checkpoint, &dir.path().join("third"), &[]))?;
    let name = table["name"].as_str().unwrap_or_default();
    assert!(corrupt.contains(&format!("file `{name}` is corrupt")), "{corrupt}");
    assert!(corrupt.contains(&format!("restoring checkpoint {checkpoint} of partition 0")), "{corrupt}");
    assert_eq!(std::fs::read(&object)?, bytes, "the replay leaves the store's file as it was");
    Ok(())
}

/// The newest checkpoint of a finished file job leaves nothing to replay: the replay
/// says so (0 records) and compares equal. A line in the live file longer than any
/// output of the job can be is refused by its number, unread past the bound. A
/// symbolic link planted in the output directory once the replay started is refused,
/// its target left as it was.
#[test]
fn a_replay_with_nothing_to_replay_a_planted_link_or_an_overlong_line_answers_clearly() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let input = dir.path().join("input.jsonl");
    generate(&input, 20, 2000, 4)?;
    let job = run_checkpointed_job(dir.path(), "vehicle_stats", "", &input)?;
    let live = dir.path().join("out.jsonl");

    let mut newest = sluice();
    newest.arg("replay").arg("--config").arg(&job).args(["--partition", "0", "--out"]).arg(dir.path().join("newest"));
    let replayed = String::from_utf8(run_ok(newest.arg("--compare").arg(&live))?.stdout)?;
    assert!(replayed.contains(": 0 records in"), "{replayed}");
    assert!(replayed.contains(" 0 records and expiry groups, 0 equal, 0 different"), "{replayed}");

    let (checkpoint, offset) = middle_checkpoint(dir.path(), 0)?;
    let overlong = dir.path().join("overlong.jsonl");
    let padding = "x".repeat(7 << 20);
    std::fs::write(&overlong, format!("{{\"partition\":0,\"offset\":{offset},\"value\":\"{padding}\"}}\n"))?;
    let err = run_err(replay(&job, 0, checkpoint, &dir.path().join("overlong"), &["--compare"]).arg(&overlong))?;
    assert!(err.contains(&format!("{} line 1: 7340", overlong.display())), "{err}");
    assert!(err.contains("longer than any output line of this job can be"), "{err}");

    let victim = dir.path().join("victim.txt");
    std::fs::write(&victim, "mine")?;
    let out = dir.path().join("planted");
    let replaying = replay(&job, 0, checkpoint, &out, &[]).stderr(std::process::Stdio::piped()).spawn()?;
    while !out.join("state").exists() {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    std::os::unix::fs::symlink(&victim, out.join("outputs.jsonl"))
        .context("planting the link before the replay wrote its outputs (it was faster than the test)")?;
    let ended = replaying.wait_with_output()?;
    let err = String::from_utf8_lossy(&ended.stderr);
    assert!(!ended.status.success(), "{err}");
    assert!(err.contains(&format!("creating {} (it must not exist)", out.join("outputs.jsonl").display())), "{err}");
    assert_eq!(std::fs::read_to_string(&victim)?, "mine");
    Ok(())
}
