//! `kill -9` in the middle of a run: the restarted host resumes each partition from
//! the offset stored with its state, and the final state equals an uninterrupted
//! run's — nothing lost, nothing counted twice.

use anyhow::Result;
use sluice_tests::*;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

const VEHICLES: u32 = 300;
const COUNT: u64 = 40_000;
const SEED: u64 = 3;

/// A generator job over a state directory named `state` whose outputs go to `<state>.out.jsonl`.
fn run_generator(dir: &Path, state: &str, rate: Option<u32>) -> std::process::Command {
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
    for (kill, min_lines) in [(1, 2_000usize), (2, 12_000), (3, 24_000)] {
        let mut child = run_generator(dir.path(), "crashed", Some(8_000)).stderr(Stdio::null()).spawn()?;
        let started = Instant::now();
        while read_jsonl_lines(&out) < min_lines {
            assert!(child.try_wait()?.is_none(), "run {kill} ended before it could be killed");
            assert!(started.elapsed() < Duration::from_secs(60), "run {kill} made no progress");
            std::thread::sleep(Duration::from_millis(20));
        }
        child.kill()?; // SIGKILL
        child.wait()?;
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
    let mut child = run_generator(dir.path(), "crashed", Some(20_000))
        .args(["--commit-interval", "1h", "--cache-mib", "1"])
        .stderr(Stdio::null())
        .spawn()?;
    let started = Instant::now();
    while read_jsonl_lines(&out) < 25_000 {
        assert!(child.try_wait()?.is_none(), "the run ended before it could be killed");
        assert!(started.elapsed() < Duration::from_secs(60), "the run made no progress");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill()?; // SIGKILL
    child.wait()?;
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
    for min_lines in [5_000usize, 20_000] {
        let mut child =
            run_generator(dir.path(), "crashed", Some(8_000)).args(["--ttl", "3s"]).stderr(Stdio::null()).spawn()?;
        let started = Instant::now();
        while read_jsonl_lines(&out) < min_lines {
            assert!(child.try_wait()?.is_none(), "the run ended before it could be killed");
            assert!(started.elapsed() < Duration::from_secs(60), "the run made no progress");
            std::thread::sleep(Duration::from_millis(20));
        }
        child.kill()?; // SIGKILL
        child.wait()?;
    }
    run_ok(run_generator(dir.path(), "crashed", None).args(["--ttl", "3s"]))?;
    let clean = run_ok(run_generator(dir.path(), "clean", None).args(["--ttl", "3s"]))?;
    let report = String::from_utf8_lossy(&clean.stderr);
    let expired: u64 = report
        .lines()
        .find_map(|line| line.split_once(" expired state entries removed").map(|(count, _)| count))
        .and_then(|count| count.parse().ok())
        .unwrap_or(0);
    assert!(expired > 100, "the TTL expired entries: {report}");

    let dump = |state: &str| -> Result<Vec<String>> {
        let output = run_ok(sluice().args(["state", "dump", "--state-dir"]).arg(dir.path().join(state)))?;
        let mut lines: Vec<String> = String::from_utf8(output.stdout)?.lines().map(str::to_string).collect();
        lines.sort();
        Ok(lines)
    };
    let crashed = dump("crashed")?;
    assert!(crashed.iter().all(|line| line.contains("expires_at_ms")), "every entry expires");
    assert_eq!(crashed, dump("clean")?, "entries, values and expiries after kills equal an uninterrupted run");
    Ok(())
}

/// Lines in a file being appended to; a torn last line does not count.
fn read_jsonl_lines(path: &Path) -> usize {
    std::fs::read(path).map(|b| b.iter().filter(|&&c| c == b'\n').count()).unwrap_or(0)
}
