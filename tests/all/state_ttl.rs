//! State that expires (`--ttl`, `[ttl]`, an operator's own TTL), through the real
//! binary: in event time (an idle partition's clock moved on by `[ttl] idle_timeout`)
//! and in processing time, the entries a churning fleet keeps, state of format 1
//! migrated when a TTL comes; and every expiry decided at the same record however the
//! run is interrupted — `kill -9` (with an expiry callback that writes state, too), a
//! restore from an older checkpoint, handovers between Kafka hosts (speed-windows'
//! windows too). (Expiry across operator versions: [`crate::hot_swap`]; an expiry
//! storm cut into batches: [`crate::sandbox_limits`]; the test driver's clock:
//! [`crate::test_driver`].)

use crate::checkpoint_restore::{checkpoint_at_end, stderr};
use crate::crash_recovery::{kill_9_once_written, run_generator};
use anyhow::Result;
use serde_json::Value;
use sluice::events::RESUMED;
use sluice_e2e::*;
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

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
/// One vehicle replaying a backlog with its clock a year ahead — 150 records in a row,
/// past `[ttl] future_confirm` — does not move the partition's clock: nothing expires,
/// every vehicle's state stays, the records are counted as not moving it. With
/// `future_confirm_keys = 1` (any keys) the same run moves it a year on and expires
/// every entry: the setting is what holds.
#[test]
fn one_vehicles_backlog_a_year_ahead_does_not_move_the_clock() -> Result<()> {
    const T0: i64 = 1_700_000_000_000;
    const YEAR: i64 = 365 * 86_400_000;
    let dir = tempfile::tempdir()?;
    let input = dir.path().join("input.jsonl");
    let line = |vehicle: &str, ts: i64| {
        format!(r#"{{"vehicle_id":"{vehicle}","ts":{ts},"lat":52.5,"lon":13.4,"speed_kmh":50.0}}"#)
    };
    let fleet = |from: i64| (0..20).map(move |v| line(&format!("v{v}"), from + v * 1_000));
    let mut lines: Vec<String> = fleet(T0).collect();
    lines.extend((0..150).map(|i| line("drifting", T0 + YEAR + i * 1_000)));
    lines.extend(fleet(T0 + 30_000));
    std::fs::write(&input, lines.join("\n") + "\n")?;
    for (keys, moved) in [(None, false), (Some(1), true)] {
        let dir = dir.path().join(format!("keys-{keys:?}"));
        std::fs::create_dir_all(&dir)?;
        let mut job = run_file_job(&operator_wasm("vehicle_stats"), &input, &dir, 1);
        if let Some(keys) = keys {
            let config = dir.join("sluice.toml");
            std::fs::write(
                &config,
                format!("[operator]\npath = \"unused.wasm\"\n[ttl]\nfuture_confirm_keys = {keys}\n"),
            )?;
            job.arg("--config").arg(config);
        }
        let report = stderr(&run_ok(job.args(["--ttl", "1h"]))?);
        let entries = dump_state(&dir.join("state"))?.len();
        if moved {
            assert!(report.contains("21 expired state entries removed"), "{entries} entries:\n{report}");
        } else {
            assert!(
                report.contains("0 expired state entries removed") && entries == 21,
                "{entries} entries:\n{report}"
            );
            assert!(report.contains("150 records without a usable timestamp"), "{report}");
        }
    }
    Ok(())
}

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
        Ok(manifests
            .iter()
            .map(|m| (m["offset"].as_u64().unwrap(), m["entries"].as_u64().unwrap(), manifest_bytes(m)))
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
    assert!(log.contains("is in format 1: migrating it to 3") && log.contains("20000 records skipped"), "{log}");
    run_ok(job("never", 40_000).args(["--ttl", "3s"]))?;
    let state = |name: &str| dump_state_lines(&dir.path().join(name).join("state"));
    let migrated = state("migrated")?;
    assert!(migrated.iter().any(|line| line.contains("expires_at_ms")), "what was written since expires");
    assert_eq!(migrated, state("never")?);
    Ok(())
}

/// Rewrites the state directory `state` (written by this sluice without a TTL) as sluice
/// wrote it before values carried an expiry: each value without its header byte, no
/// expiry index, no timers' column family and no clock, format 1 recorded in the
/// directory and in each database.
fn downgrade_to_format_1(state: &Path, partitions: u32) -> Result<()> {
    let manifest = state.join("sluice-state.json");
    let mut recorded: Value = serde_json::from_slice(&std::fs::read(&manifest)?)?;
    recorded["format"] = 1.into();
    std::fs::write(&manifest, serde_json::to_vec(&recorded)?)?;
    for partition in 0..partitions {
        let path = state.join(format!("partition-{partition:04}"));
        let mut db = rocksdb::DB::open_cf(&rocksdb::Options::default(), &path, ["meta", "expiry", "timers"])?;
        let values = db.iterator(rocksdb::IteratorMode::Start).collect::<Result<Vec<_>, _>>()?;
        for (key, value) in values {
            anyhow::ensure!(value.first() == Some(&0), "a value that expires: the job had no TTL");
            db.put(key, &value[1..])?;
        }
        let meta = db.cf_handle("meta").expect("opened with it");
        db.put_cf(meta, b"format", 1u32.to_be_bytes())?;
        db.delete_cf(meta, b"clock")?;
        db.drop_cf("expiry")?;
        db.drop_cf("timers")?;
    }
    Ok(())
}

/// With a TTL about the generator's mean gap between two reports of a vehicle, many
/// summaries expire and restart from nothing: two kills and a restart end with the
/// same entries, values and expiries as an uninterrupted run — the clock, the expiry
/// index and the removals are committed with the state, so a replay decides each
/// expiry as the first run did.
#[test]
fn kill_9_with_expiring_state_then_restart_equals_an_uninterrupted_run() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let out = dir.path().join("crashed.out.jsonl");
    for min_lines in [5_000, 20_000] {
        kill_9_once_written(run_generator(dir.path(), "crashed", Some(8_000)).args(["--ttl", "3s"]), &out, min_lines)?;
    }
    run_ok(run_generator(dir.path(), "crashed", None).args(["--ttl", "3s"]))?;
    let clean = run_ok(run_generator(dir.path(), "clean", None).args(["--ttl", "3s"]))?;
    run_ok(run_generator(dir.path(), "again", None).args(["--ttl", "3s"]))?;
    let report = String::from_utf8_lossy(&clean.stderr);
    let expired = reported_expired(&report);
    assert!(expired > 100, "the TTL expired entries: {report}");

    let dump = |state: &str| dump_state_lines(&dir.path().join(state));
    let crashed = dump("crashed")?;
    assert!(crashed.iter().all(|line| line.contains("expires_at_ms")), "every entry expires");
    assert_eq!(crashed, dump("clean")?, "entries, values and expiries after kills equal an uninterrupted run");

    // vehicle-stats is told of each expiry and emits the vehicle's final summary. Two
    // uninterrupted runs write the same lines (the partitions' workers interleave them
    // differently); after the kills, replays repeat some (outputs are at least once),
    // but the distinct expiry outputs are the uninterrupted run's: each expiry came at
    // the same record, of the same value.
    let lines = |state: &str| -> Result<Vec<String>> {
        let text = std::fs::read_to_string(dir.path().join(format!("{state}.out.jsonl")))?;
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        lines.sort();
        Ok(lines)
    };
    let clean_lines = lines("clean")?;
    assert_eq!(clean_lines, lines("again")?, "two event-time runs give the same outputs");
    let expiries = |lines: Vec<String>| -> std::collections::BTreeSet<String> {
        lines.into_iter().filter(|line| line.contains(r#""cause":"expiry""#)).collect()
    };
    let clean_expiries = expiries(clean_lines);
    assert_eq!(clean_expiries.len() as u64, expired, "one output per expiry");
    assert_eq!(expiries(lines("crashed")?), clean_expiries, "the same expiries, at the same records, after kills");
    Ok(())
}

/// The probe remembers a value per key with a TTL that is sometimes shorter than the
/// time until the key's next record, and its `expired` counts each key's expiries in
/// state and emits the count: after two kills and a restart, the counts, the values and
/// the distinct expiry outputs equal an uninterrupted run's. A callback's write applied
/// twice, or lost, or an expiry decided at another record, would show.
#[test]
fn kill_9_with_an_expiry_callback_that_writes_state_handles_each_expiry_once() -> Result<()> {
    let dir = tempfile::tempdir()?;
    const T0: i64 = 1_767_225_600_000;
    let input = dir.path().join("input.jsonl");
    let lines: Vec<String> = (0..30_000u64)
        .map(|i| {
            // 97 keys in turn, each every 970 ms of event time: a TTL of 500 ms
            // expires before the key's next record, one of 2 s does not.
            let ttl_ms = if (i / 97).is_multiple_of(3) { 500 } else { 2_000 };
            serde_json::json!({"vehicle_id": format!("k{}", i % 97), "ts": T0 + i as i64 * 10,
                "action": "remember", "name": "n", "value": i, "ttl_ms": ttl_ms})
            .to_string()
        })
        .collect();
    std::fs::write(&input, lines.join("\n") + "\n")?;
    let (crashed_expiries, clean_expiries) = probe_killed_and_clean(dir.path(), &input, "expiry")?;
    // 30,000 / 97 rounds, a third of them with the short TTL: about 100 per key.
    assert!(clean_expiries.len() > 9_000, "{}", clean_expiries.len());
    assert_eq!(crashed_expiries, clean_expiries, "the same expiries, each once, after kills");
    Ok(())
}

/// Runs the probe over the JSONL `input` into `dir` twice — `crashed`: killed (`kill
/// -9`) once 4,000 and once 15,000 output lines were written, then run to its end;
/// `clean`: uninterrupted — and checks that their state is the same. Returns each
/// run's distinct output lines of `cause` (`expiry`, `timer`): crashed, then clean.
pub(crate) fn probe_killed_and_clean(
    dir: &Path,
    input: &Path,
    cause: &str,
) -> Result<(BTreeSet<String>, BTreeSet<String>)> {
    let job = |state: &str| {
        let mut command = run_file_job(&operator_wasm("probe"), input, dir, 2);
        command.arg("--output").arg(dir.join(format!("{state}.out.jsonl")));
        command.arg("--state-dir").arg(dir.join(state));
        command
    };
    let out = dir.join("crashed.out.jsonl");
    for min_lines in [4_000, 15_000] {
        kill_9_once_written(job("crashed").args(["--rate", "3000"]), &out, min_lines)?;
    }
    run_ok(&mut job("crashed"))?;
    run_ok(&mut job("clean"))?;
    assert_eq!(dump_state(&dir.join("crashed"))?, dump_state(&dir.join("clean"))?, "state after kills");
    let outputs = |state: &str| -> Result<BTreeSet<String>> {
        let outputs = read_jsonl(&dir.join(format!("{state}.out.jsonl")))?;
        Ok(outputs.into_iter().filter(|o| o["cause"] == cause).map(|o| o.to_string()).collect())
    };
    Ok((outputs("crashed")?, outputs("clean")?))
}

/// With a TTL that expires many vehicles' summaries (vehicle-stats is told of each and
/// emits the vehicle's final summary), a job whose state is lost restores a checkpoint
/// older than the state it lost and replays from there: its final state, expiries
/// included, and its distinct expiry outputs equal an uninterrupted run's. The clock
/// and the expiry index come back with the checkpoint, so the replay expires the same
/// entries at the same records.
#[test]
fn a_restore_from_an_older_checkpoint_replays_expiries_as_an_uninterrupted_run() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    let (restored, clean) = (dir.join("restored"), dir.join("clean"));
    let job = |dir: &Path, count| {
        let mut command = checkpoint_at_end(dir, 300, count, 4);
        command.args(["--ttl", "3s"]);
        command
    };
    std::fs::create_dir_all(&restored)?;
    run_ok(&mut job(&restored, 20_000))?;
    let older = dir.join("older.checkpoints");
    copy_dir(&restored.join("state.checkpoints"), &older)?;
    run_ok(&mut job(&restored, 40_000))?;
    // The state is lost, and the store has only the checkpoints at 20,000 records.
    std::fs::remove_dir_all(restored.join("state"))?;
    std::fs::remove_dir_all(restored.join("state.checkpoints"))?;
    std::fs::rename(&older, restored.join("state.checkpoints"))?;
    let run = run_ok(&mut job(&restored, 40_000))?;
    assert!(stderr(&run).contains("20000 records skipped") && stderr(&run).contains("processed 20000 records"));

    std::fs::create_dir_all(&clean)?;
    let report = run_ok(&mut job(&clean, 40_000))?;
    assert!(reported_expired(&stderr(&report)) > 100, "{}", stderr(&report));
    let state = |dir: &Path| dump_state_lines(&dir.join("state"));
    assert_eq!(state(&restored)?, state(&clean)?, "entries, values and expiries");
    let expiries = |dir: &Path| -> Result<BTreeSet<String>> {
        let outputs = read_jsonl(&dir.join("out.jsonl"))?;
        Ok(outputs.into_iter().filter(|o| o["cause"] == "expiry").map(|o| o.to_string()).collect())
    };
    assert_eq!(expiries(&restored)?, expiries(&clean)?, "the same expiries at the same records");
    Ok(())
}

/// Copies the directory tree `from` to `to`.
fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &to.join(entry.file_name()))?;
        } else {
            std::fs::copy(entry.path(), to.join(entry.file_name()))?;
        }
    }
    Ok(())
}

/// With a TTL in event time (the records' Kafka timestamps), partitions move from one
/// host to another twice (a second host joins; the first stops gracefully and hands
/// over) while vehicle-stats expires summaries and emits each vehicle's final one: the
/// state both hosts left in the shared store, expiries included, and the distinct
/// expiry outputs equal those of one host reading the same topic uninterrupted.
#[test]
fn expiries_across_kafka_handovers_equal_an_uninterrupted_run() -> Result<()> {
    let kafka = KafkaJob::on(KafkaBroker::shared()?).topic("positions", 4).start()?;
    let all = kafka.generate("all.jsonl", 200, 12_000)?;
    let run = handed_over_and_alone(&kafka, "vehicle_stats", &["--ttl", "2s"], &all, false)?;
    assert!(reported_expired(&run.alone_report) > 50, "the TTL expired summaries");
    run.assert_equal("expiry")
}

/// speed-windows (a minute's and 5-minute windows per vehicle, on timers) across the
/// same two handovers, its event time the positions' own (each record's timestamp its
/// `ts`): the windows the two hosts emitted (at least once: the file sink's guarantee)
/// and the state they left (open windows and their timers) equal one host's
/// uninterrupted run.
#[test]
fn windows_across_kafka_handovers_equal_an_uninterrupted_run() -> Result<()> {
    let kafka = KafkaJob::on(KafkaBroker::shared()?).topic("positions", 4).start()?;
    let generated = kafka.generate("generated.jsonl", 200, 12_000)?;
    // The positions moved to end ten minutes ago, so the broker keeps their timestamps.
    let text = std::fs::read_to_string(&generated)?;
    let last = text.lines().last().map(serde_json::from_str::<Value>).transpose()?;
    let last = last.and_then(|p| p["ts"].as_i64()).unwrap_or_default();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis() as i64;
    let shift = (now - 600_000 - last) / 60_000 * 60_000;
    let mut shifted = String::new();
    for line in text.lines() {
        let mut p: Value = serde_json::from_str(line)?;
        p["ts"] = Value::from(p["ts"].as_i64().unwrap_or_default() + shift);
        shifted += &(p.to_string() + "\n");
    }
    let all = kafka.dir().join("all.jsonl");
    std::fs::write(&all, shifted)?;
    let run = handed_over_and_alone(&kafka, "speed_windows", &[], &all, true)?;
    let emitted = read_jsonl(&run.dirs[2].join("out.jsonl"))?;
    assert!(emitted.len() > 300 && emitted.iter().all(|o| o["cause"] == "timer"), "{} windows", emitted.len());
    run.assert_equal("timer")
}

/// What [`handed_over_and_alone`] left: the scratch directories of hosts `a`, `b`,
/// `alone` and `check`, and the lone host's report.
struct Handovers {
    dirs: [std::path::PathBuf; 4],
    alone_report: String,
}

impl Handovers {
    /// The state `a` and `b` left in the shared store (as `check` restored it) equals
    /// `alone`'s, and so do the distinct outputs of `cause` the two emitted.
    fn assert_equal(&self, cause: &str) -> Result<()> {
        let [a, b, alone, check] = &self.dirs;
        let state = |dir: &Path| dump_state_lines(&dir.join("state"));
        assert_eq!(state(check)?, state(alone)?, "entries, values and expiries after two handovers");
        let outputs = |dirs: &[&std::path::PathBuf]| -> Result<BTreeSet<String>> {
            let mut outputs = BTreeSet::new();
            for dir in dirs {
                let all = read_jsonl(&dir.join("out.jsonl"))?;
                outputs.extend(all.into_iter().filter(|o| o["cause"] == cause).map(|o| o.to_string()));
            }
            Ok(outputs)
        };
        assert_eq!(outputs(&[a, b])?, outputs(&[alone])?, "the same {cause} outputs at the same records");
        Ok(())
    }
}

/// Runs `operator` (with `flags`) over the positions in `all` produced to the 4
/// partitions of topic `positions` in three parts (each record's timestamp its `ts`
/// when `at_ts`, else the producer's clock): host `a` alone, then `b` joining, then `a`
/// stopping gracefully and handing over, `b` reading the rest, both checkpointing to a
/// shared store; then one host reading the whole topic uninterrupted in a group of its
/// own, and one restoring what `a` and `b` left and processing nothing.
fn handed_over_and_alone(
    kafka: &KafkaJob,
    operator: &str,
    flags: &[&str],
    all: &Path,
    at_ts: bool,
) -> Result<Handovers> {
    let (broker, dir) = (&kafka.broker, kafka.dir());
    let chunks = split_lines(all, 3)?;
    let produce = |chunk: &Path| {
        if at_ts { broker.produce_lines_at_ts("positions", chunk) } else { broker.produce_lines("positions", chunk) }
    };
    let store = dir.join("store");
    let host = |name: &str, config: &Path, store: Option<&Path>| -> Command {
        let mut command = run_job(&operator_wasm(operator), &dir.join(name), 4);
        command.arg("--config").arg(config).args(flags);
        match store {
            Some(store) => command.arg("--checkpoint-store").arg(store).args(["--checkpoint-interval", "1"]),
            None => command.arg("--no-checkpoints"),
        };
        command
    };
    let shared = kafka.source("handover", "")?;
    let minute = Duration::from_secs(60);
    let dirs = ["a", "b", "alone", "check"].map(|name| dir.join(name));
    for dir in &dirs {
        std::fs::create_dir_all(dir)?;
    }

    produce(&chunks[0])?;
    let mut a = Host::spawn("a", &mut host("a", &shared, Some(&store)), &dir.join("a/log"))?;
    a.wait_for(RESUMED, 4, minute)?;
    let mut b = Host::spawn("b", &mut host("b", &shared, Some(&store)), &dir.join("b/log"))?;
    b.wait_for(RESUMED, 1, minute)?;
    produce(&chunks[1])?;
    std::thread::sleep(Duration::from_millis(500));
    a.terminate()?;
    assert!(a.log().contains(&handed_over()), "a handed its partitions over:\n{}", a.log());
    produce(&chunks[2])?;
    let count = std::fs::read_to_string(all)?.lines().count() as i64;
    broker.wait_committed("handover", "positions", count, Duration::from_secs(120))?;
    b.terminate()?;

    // One host over the whole topic, in a group of its own, with nothing to restore.
    let idle = "stop_when_idle_s = 2\n";
    let alone = kafka.source("alone", idle)?;
    let report = run_ok(&mut host("alone", &alone, None))?;
    // What the two hosts left in the store, restored by a host that processes nothing.
    let check = kafka.source("check", idle)?;
    let restored = run_ok(&mut host("check", &check, Some(&store)))?;
    assert!(String::from_utf8_lossy(&restored.stderr).contains("processed 0 records"));
    Ok(Handovers { dirs, alone_report: String::from_utf8_lossy(&report.stderr).into_owned() })
}

/// In processing time the clock follows the wall clock on an idle partition too: five
/// vehicles report, then nothing arrives, and their summaries (TTL 1 s) expire, each
/// with vehicle-stats's final summary, before the job stops 2.5 s after the last
/// record: within the TTL and the idle ticks, with no record to move the clock.
#[test]
fn in_processing_time_an_idle_partition_expires_its_state_by_the_wall_clock() -> Result<()> {
    let kafka = KafkaJob::on(KafkaBroker::shared()?).topic("positions", 1).start()?;
    let (broker, dir) = (&kafka.broker, kafka.dir());
    let input = kafka.generate("positions.jsonl", 5, 50)?;
    broker.produce_lines("positions", &input)?;
    let more = "stop_when_idle_s = 2.5\n[ttl]\ntime = \"processing\"\ndefault = \"1s\"\n";
    let config = kafka.source("idle", more)?;
    let run = run_ok(run_job(&operator_wasm("vehicle_stats"), dir, 1).arg("--config").arg(&config))?;
    let report = String::from_utf8_lossy(&run.stderr);
    assert_eq!(reported_expired(&report), 5, "{report}");
    assert!(dump_state(&dir.join("state"))?.is_empty(), "every summary expired");
    let outputs = read_jsonl(&dir.join("out.jsonl"))?;
    let left: BTreeSet<&str> =
        outputs.iter().filter(|o| o["cause"] == "expiry").map(|o| o["key"].as_str().unwrap()).collect();
    assert_eq!(left.len(), 5, "each vehicle's final summary: {outputs:?}");
    Ok(())
}

/// In event time an idle partition's clock holds — unless `[ttl] idle_timeout` moves it
/// on with the wall clock past the timeout: five vehicles report, then nothing arrives
/// before the job stops idle 3 s later. Without the timeout their summaries (TTL 1 s of
/// event time) outlive the run; with 500 ms, each expires, with vehicle-stats' final
/// summary, within the timeout and the TTL of wall time.
#[test]
fn in_event_time_an_idle_timeout_moves_an_idle_partitions_clock_on() -> Result<()> {
    let kafka = KafkaJob::on(KafkaBroker::shared()?).topic("positions", 1).start()?;
    let (broker, dir) = (&kafka.broker, kafka.dir());
    let input = kafka.generate("positions.jsonl", 5, 50)?;
    broker.produce_lines("positions", &input)?;
    for (group, idle_timeout, expired) in [("held", "", 0), ("moved", "idle_timeout = \"500ms\"\n", 5)] {
        let more = format!("stop_when_idle_s = 3\n[ttl]\ndefault = \"1s\"\n{idle_timeout}");
        let config = kafka.source(group, &more)?;
        let run_dir = dir.join(group);
        std::fs::create_dir_all(&run_dir)?;
        let run = run_ok(run_job(&operator_wasm("vehicle_stats"), &run_dir, 1).arg("--config").arg(&config))?;
        let report = String::from_utf8_lossy(&run.stderr);
        assert_eq!(reported_expired(&report), expired, "{group}: {report}");
        let outputs = read_jsonl(&run_dir.join("out.jsonl"))?;
        let left = outputs.iter().filter(|o| o["cause"] == "expiry").count();
        let kept = dump_state(&run_dir.join("state"))?.len() as u64;
        assert_eq!((left as u64, kept), (expired, 5 - expired), "{group}");
    }
    Ok(())
}
