//! `kill -9` in the middle of a run: the restarted host resumes each partition from
//! the offset stored with its state, and the final state equals an uninterrupted
//! run's — nothing lost, nothing counted twice. (With state that expires:
//! [`crate::state_ttl`], which runs these jobs with a TTL.)

use anyhow::Result;
use sluice_e2e::*;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const VEHICLES: u32 = 300;

const COUNT: u64 = 40_000;

const SEED: u64 = 3;

/// A generator job over a state directory named `state` whose outputs go to `<state>.out.jsonl`.
pub(crate) fn run_generator(dir: &Path, state: &str, rate: Option<u32>) -> Command {
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

/// Starts `command` (a job writing its outputs to `out`), and kills it with SIGKILL
/// once `out` holds `min_lines` lines, while records are flowing.
pub(crate) fn kill_9_once_written(command: &mut Command, out: &Path, min_lines: usize) -> Result<()> {
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
