//! `kill -9` in the middle of a run: the restarted host resumes each partition from
//! the offset stored with its state, and the final state equals an uninterrupted
//! run's — nothing lost, nothing counted twice.

use anyhow::Result;
use sluice_tests::*;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const VEHICLES: u32 = 300;
const COUNT: u64 = 40_000;
const SEED: u64 = 3;

/// A generator job over a state directory named `state` whose outputs go to `<state>.out.jsonl`.
fn run_generator(dir: &Path, state: &str, rate: Option<u32>) -> Command {
    let mut command = run_generator_job(dir, VEHICLES, COUNT, SEED, 4);
    command.arg("--output").arg(dir.join(format!("{state}.out.jsonl"))).arg("--state-dir").arg(dir.join(state));
    if let Some(rate) = rate {
        command.args(["--rate", &rate.to_string()]);
    }
    command
}

#[test]
fn kill_9_mid_run_then_restart_equals_an_uninterrupted_run() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let out = dir.path().join("crashed.out.jsonl");

    // Three kills at growing amounts of progress, each while records are flowing.
    for min_lines in [2_000, 12_000, 24_000] {
        kill_9_once_written(&mut run_generator(dir.path(), "crashed", Some(8_000)), &out, min_lines)?;
    }
    run_ok(&mut run_generator(dir.path(), "crashed", None))?;
    run_ok(&mut run_generator(dir.path(), "clean", None))?;

    let crashed = dump_state(&dir.path().join("crashed"))?;
    assert_eq!(crashed, dump_state(&dir.path().join("clean"))?, "state after kills equals an uninterrupted run");
    let input = dir.path().join("input.jsonl");
    generate(&input, VEHICLES, COUNT, SEED)?;
    let reference = Reference::fold(&input)?;
    assert_state_matches(&crashed, &reference, "state after three kill -9");

    // Outputs are at-least-once: every input has an output, and each vehicle's last
    // output is its final summary.
    let outputs = read_jsonl(&out)?;
    let positions: std::collections::BTreeSet<_> =
        outputs.iter().map(|o| (o["partition"].as_u64(), o["offset"].as_u64())).collect();
    assert_eq!(positions.len() as u64, COUNT);
    let last = outputs.iter().map(|o| (o["key"].as_str().unwrap(), &o["value"]));
    assert_last_outputs(last, &reference, "last output after kills");
    Ok(())
}

/// With commits an hour apart and a cache of 1 MiB (evicting all the time), the killed
/// run holds tens of thousands of processed records' writes uncommitted: the restart
/// replays them from the last committed offset, and state is still the reference fold.
#[test]
fn kill_9_with_much_uncommitted_state_and_a_tiny_cache_loses_nothing() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let out = dir.path().join("crashed.out.jsonl");
    let mut crashing = run_generator(dir.path(), "crashed", Some(20_000));
    kill_9_once_written(crashing.args(["--commit-interval", "1h", "--cache-mib", "1"]), &out, 25_000)?;
    run_ok(run_generator(dir.path(), "crashed", None).args(["--cache-mib", "1"]))?;

    let input = dir.path().join("input.jsonl");
    generate(&input, VEHICLES, COUNT, SEED)?;
    let reference = Reference::fold(&input)?;
    assert_state_matches(&dump_state(&dir.path().join("crashed"))?, &reference, "state after kill -9");
    let outputs = read_jsonl(&out)?;
    let last = outputs.iter().map(|o| (o["key"].as_str().unwrap(), &o["value"]));
    assert_last_outputs(last, &reference, "last output after the kill");
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
    let job = |state: &str| {
        let mut command = run_file_job(&operator_wasm("probe"), &input, dir.path(), 2);
        command.arg("--output").arg(dir.path().join(format!("{state}.out.jsonl")));
        command.arg("--state-dir").arg(dir.path().join(state));
        command
    };
    let out = dir.path().join("crashed.out.jsonl");
    for min_lines in [4_000, 15_000] {
        kill_9_once_written(job("crashed").args(["--rate", "3000"]), &out, min_lines)?;
    }
    run_ok(&mut job("crashed"))?;
    run_ok(&mut job("clean"))?;

    let clean = dump_state(&dir.path().join("clean"))?;
    assert_eq!(dump_state(&dir.path().join("crashed"))?, clean, "state after kills equals an uninterrupted run");
    let expiries = |state: &str| -> Result<std::collections::BTreeSet<String>> {
        let outputs = read_jsonl(&dir.path().join(format!("{state}.out.jsonl")))?;
        Ok(outputs.into_iter().filter(|o| o["cause"] == "expiry").map(|o| o.to_string()).collect())
    };
    let clean_expiries = expiries("clean")?;
    // 30,000 / 97 rounds, a third of them with the short TTL: about 100 per key.
    assert!(clean_expiries.len() > 9_000, "{}", clean_expiries.len());
    assert_eq!(expiries("crashed")?, clean_expiries, "the same expiries, each once, after kills");
    Ok(())
}

/// Starts `command` (a job writing its outputs to `out`), and kills it with SIGKILL
/// once `out` holds `min_lines` lines, while records are flowing.
fn kill_9_once_written(command: &mut Command, out: &Path, min_lines: usize) -> Result<()> {
    let log = out.with_extension("stderr");
    let mut child = command.stderr(std::fs::File::create(&log)?).spawn()?;
    let started = Instant::now();
    while read_jsonl_lines(out) < min_lines {
        if let Some(status) = child.try_wait()? {
            let stderr = std::fs::read_to_string(&log).unwrap_or_default();
            panic!("the run ended ({status}) before it could be killed at {min_lines} lines:\n{stderr}");
        }
        assert!(started.elapsed() < Duration::from_secs(60), "the run made no progress");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill()?; // SIGKILL
    child.wait()?;
    Ok(())
}

/// Lines in a file being appended to; a torn last line does not count.
fn read_jsonl_lines(path: &Path) -> usize {
    std::fs::read(path).map(|b| b.iter().filter(|&&c| c == b'\n').count()).unwrap_or(0)
}
