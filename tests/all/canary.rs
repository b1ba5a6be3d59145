//! Per-key canaries: `sluice deploy --canary 10%` sends exactly the keys the hash says
//! to the new version while the rest stay on the version in force; raised to 50% it keeps
//! those keys and adds others; `sluice rollback` ends it, and both versions read what the
//! other wrote all along (each vehicle's count goes on one by one through every change).

use crate::hot_swap::{PacedJob, named_version};
use anyhow::{Context, Result};
use sluice_e2e::*;
use std::collections::BTreeMap;
use std::time::Duration;

/// The canary's hash, written out again from its definition: FNV-1a (64 bits) of the
/// key's bytes, modulo 10,000, against the share in basis points.
pub(crate) fn in_canary(key: &str, basis_points: u64) -> bool {
    let hash = key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    hash % 10_000 < basis_points
}

#[test]
fn a_canary_takes_exactly_the_keys_its_hash_says_keeps_them_as_it_grows_and_ends_at_a_rollback() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    let PacedJob { config, mut host, admin, input } =
        PacedJob::start(dir, (200, 60_000), 6_000, &operator_wasm("vehicle_stats"), "")?;
    let first = run_ok(sluice().arg("versions").arg("vehicle_stats").arg("--admin").arg(&admin))?;
    let v1 = named_version(&String::from_utf8_lossy(&first.stdout));
    let v2_file = operator_wasm("vehicle_stats_v2");
    let deploy = |share: &str| -> Result<String> {
        let mut command = sluice();
        command.args(["deploy", "vehicle_stats"]).arg(&v2_file).args(["--canary", share, "--config"]).arg(&config);
        Ok(String::from_utf8(run_ok(&mut command)?.stdout)?)
    };
    std::thread::sleep(Duration::from_secs(1));
    let started = deploy("10%")?;
    assert!(started.contains("for 10.00% of the keys recorded"), "{started}");
    let v2 = named_version(&started);
    std::thread::sleep(Duration::from_secs(2));
    // Through a host's admin API, as `sluice deploy --admin` does.
    let raised =
        run_ok(sluice().args(["deploy", "vehicle_stats"]).arg(&v2_file).args(["--canary", "50%", "--admin", &admin]))?;
    assert!(String::from_utf8(raised.stdout)?.contains("for 50.00% of the keys"));
    std::thread::sleep(Duration::from_secs(2));
    let ended =
        String::from_utf8(run_ok(sluice().args(["rollback", "vehicle_stats", "--config"]).arg(&config))?.stdout)?;
    assert!(ended.contains(&format!("ended the canary {v2}")), "{ended}");
    host.wait_exit(Duration::from_secs(60))?;
    let log = host.log();
    assert!(log.contains("processed 60000 records"), "{log}");

    // Each vehicle's versions, in the order of its outputs, as runs; and its counts.
    let mut runs: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    for output in read_jsonl(&dir.join("out.jsonl"))? {
        let key = output["key"].as_str().context("a key")?.to_string();
        let version = output["operator"].as_str().context("a version")?.to_string();
        assert!(version == v1 || version == v2, "{output}");
        let versions = runs.entry(key.clone()).or_default();
        if versions.last() != Some(&version) {
            versions.push(version);
        }
        let count = counts.entry(key.clone()).or_default();
        *count += 1;
        assert_eq!(output["value"]["count"], *count, "{key}'s count goes on through every change: {output}");
    }
    let (mut ten, mut fifty) = (0, 0);
    for (key, versions) in &runs {
        let expected: &[&String] = match (in_canary(key, 1000), in_canary(key, 5000)) {
            // Taken at 10% and kept at 50%: one run of v2, never back to v1 in between.
            (true, _) => &[&v1, &v2, &v1],
            (false, true) => &[&v1, &v2, &v1],
            (false, false) => &[&v1],
        };
        assert_eq!(versions.iter().collect::<Vec<_>>(), expected, "{key}");
        ten += usize::from(in_canary(key, 1000));
        fifty += usize::from(in_canary(key, 5000));
    }
    assert!(ten > 5 && fifty > ten + 50 && runs.len() == 200, "{ten} of {fifty} of {}", runs.len());
    // A 10% key's first v2 output comes before a 50%-only key's: its v2 run began at 10%.
    let first_v2 = |wanted: fn(&str) -> bool| -> Option<u64> {
        let outputs = read_jsonl(&dir.join("out.jsonl")).ok()?;
        outputs
            .iter()
            .filter(|o| o["operator"] == v2.as_str() && wanted(o["key"].as_str().unwrap_or("")))
            .filter_map(|o| o["value"]["last_seen"].as_u64())
            .min()
    };
    let (at_ten, at_fifty) =
        (first_v2(|k| in_canary(k, 1000)), first_v2(|k| !in_canary(k, 1000) && in_canary(k, 5000)));
    assert!(at_ten.context("10% keys ran v2")? < at_fifty.context("50% keys ran v2")?);
    // After the rollback both versions' summaries read back: the state is the fold.
    assert_state_matches(&dump_state(&dir.join("state"))?, &Reference::fold(&input)?, "after the canary");
    Ok(())
}

/// A canary is recorded with the partition's switches: after `kill -9`, the records
/// processed again before the canary started go to the version in force alone, and
/// those after to the versions the canary's share said, as the first run did. (A job
/// that commits rarely: the restart processes everything again.)
#[test]
fn records_processed_again_after_a_kill_9_go_where_the_first_run_sent_them() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    let input = dir.join("input.jsonl");
    generate(&input, 200, 30_000, 5)?;
    let config = dir.join("job.toml");
    std::fs::write(
        &config,
        format!(
            "[operator]\npath = {:?}\npoll_versions = \"0.2s\"\n[source]\nkind = \"file\"\npath = {input:?}\n\
             rate = 4000\n[sink]\nkind = \"file\"\npath = {:?}\n[dead_letter]\npath = {:?}\n[state]\ndir = {:?}\npartitions = 2\n\
             commit_every = 1000000\ncommit_interval = \"60s\"\n[checkpoint]\nenabled = false\n[report]\n\
             interval = \"0s\"\n",
            operator_wasm("vehicle_stats"),
            dir.join("out.jsonl"),
            dir.join("dead.jsonl"),
            dir.join("state"),
        ),
    )?;
    let log = dir.join("host.log");
    let mut host = Host::spawn("host", sluice().arg("run").arg("--config").arg(&config), &log)?;
    std::thread::sleep(Duration::from_millis(1500));
    let mut canary = sluice();
    canary.args(["deploy", "vehicle_stats"]).arg(operator_wasm("vehicle_stats_v2")).args(["--canary", "50%"]);
    let v2 = named_version(&String::from_utf8(run_ok(canary.arg("--config").arg(&config))?.stdout)?);
    std::thread::sleep(Duration::from_millis(1500));
    host.kill_9()?;
    let mut restarted = Host::spawn("restarted", sluice().arg("run").arg("--config").arg(&config), &log)?;
    restarted.wait_exit(Duration::from_secs(60))?;

    let mut first: BTreeMap<(u64, u64), String> = BTreeMap::new();
    let (mut again, mut v1_again_for_canary_keys) = (0, 0);
    for output in read_jsonl(&dir.join("out.jsonl"))? {
        let at =
            (output["partition"].as_u64().context("a partition")?, output["offset"].as_u64().context("an offset")?);
        let version = output["operator"].as_str().context("a version")?.to_string();
        match first.get(&at) {
            None => {
                first.insert(at, version);
            }
            Some(before) => {
                assert_eq!(&version, before, "processed again by another version: {output}");
                again += 1;
                let key = output["key"].as_str().unwrap_or_default();
                v1_again_for_canary_keys += usize::from(in_canary(key, 5000) && version != v2);
            }
        }
    }
    assert!(again > 1000, "the restart processed the first run's records again: {again}");
    assert!(v1_again_for_canary_keys > 0, "records of canary keys from before the canary started came again");
    Ok(())
}

/// A full deploy ends a canary on every host: after it, every key runs the deployed
/// version, and the canary's record is gone.
/// A deploy ends the canary, and one refused leaves it running.
#[test]
fn a_deploy_ends_the_canary() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    // 10 s of records: both deploys land while it runs, however slow a loaded machine
    // makes the `sluice deploy` commands.
    let PacedJob { config, mut host, .. } =
        PacedJob::start(dir, (100, 60_000), 6_000, &operator_wasm("vehicle_stats"), "")?;
    let deploy = |file: &str, canary: &[&str]| -> Result<String> {
        let mut command = sluice();
        command.args(["deploy", "vehicle_stats"]).arg(operator_wasm(file)).args(canary).arg("--config").arg(&config);
        Ok(named_version(&String::from_utf8(run_ok(&mut command)?.stdout)?))
    };
    std::thread::sleep(Duration::from_secs(1));
    // The same logic built against WIT 0.1.2: another version, told apart by its name.
    let canary = deploy("vehicle_stats_0_1_2", &["--canary", "50%"])?;
    let record = dir.join("state.checkpoints/operators/vehicle_stats/canary.json");
    assert!(record.exists(), "the canary is recorded in the job's registry");
    // A deploy refused (of the version in force) leaves the canary as it was.
    let mut again = sluice();
    again.args(["deploy", "vehicle_stats"]).arg(operator_wasm("vehicle_stats")).arg("--config").arg(&config);
    let refused = run_err(&mut again)?;
    assert!(refused.contains("is already the version in force"), "{refused}");
    assert!(record.exists(), "a refused deploy keeps the canary");
    std::thread::sleep(Duration::from_millis(1500));
    let v2 = deploy("vehicle_stats_v2", &[])?;
    host.wait_exit(Duration::from_secs(60))?;
    let mut last: BTreeMap<String, String> = BTreeMap::new();
    let mut canary_outputs = 0;
    for output in read_jsonl(&dir.join("out.jsonl"))? {
        let version = output["operator"].as_str().context("a version")?.to_string();
        canary_outputs += usize::from(version == canary);
        last.insert(output["key"].as_str().context("a key")?.to_string(), version);
    }
    assert!(canary_outputs > 0, "the canary ran");
    assert!(last.values().all(|version| *version == v2), "every key ends on {v2}: {last:?}");
    assert!(!record.exists(), "the deploy removed the canary's record");
    Ok(())
}

/// A version told of nothing (a batched component exporting neither `expired` nor
/// `fired`: the echo of `sandbox_limits`) beside vehicle-stats, which is told of its
/// vehicles leaving the fleet, each way round: the echo the canary, then vehicle-stats.
/// The vehicles' expiries come due in the middle of one run of the echo's keys, and each
/// still reaches vehicle-stats, once, with its summary, named with vehicle-stats'
/// version, canary or not; none is lost, none goes to the dead letters.
#[test]
fn a_canary_told_of_nothing_leaves_the_other_versions_expiries_to_it() -> Result<()> {
    const T0: i64 = 1_700_000_000_000;
    let scratch = tempfile::tempdir()?;
    let echo = crate::sandbox_limits::aliasing_operator(scratch.path(), "echo", true)?;
    let keys = |prefix: &'static str, canary: bool| {
        (0..).map(move |i| format!("{prefix}-{i}")).filter(move |k| in_canary(k, 5000) == canary)
    };
    let line =
        |key: &str, ts: i64| format!(r#"{{"vehicle_id":"{key}","ts":{ts},"lat":52.5,"lon":13.4,"speed_kmh":50.0}}"#);
    for vehicle_stats_is_canary in [false, true] {
        let dir = &scratch.path().join(if vehicle_stats_is_canary { "told-canary" } else { "told-active" });
        std::fs::create_dir_all(dir)?;
        let (running, canary) = match vehicle_stats_is_canary {
            false => (operator_wasm("vehicle_stats"), echo.clone()),
            true => (echo.clone(), operator_wasm("vehicle_stats")),
        };
        // The job's operator is named after its file; a deploy keeps the name.
        let name = running.file_stem().and_then(|s| s.to_str()).context("a file name")?.to_string();
        let told_version = sluice::operator::version_of(&name, &std::fs::read(operator_wasm("vehicle_stats"))?);
        let told: Vec<String> = keys("v", vehicle_stats_is_canary).take(5).collect();
        let mut lines: Vec<String> = told.iter().zip(0..).map(|(key, i)| line(key, T0 + 2_000 * i)).collect();
        // The vehicles leave the fleet 10 s after their record, at the echo's records
        // 1, 3, 5, 7 and 9: inside one run of its keys.
        let echoed = keys("c", !vehicle_stats_is_canary).take(60).zip(0..);
        lines.extend(echoed.map(|(key, j)| line(&key, T0 + 9_000 + 1_000 * j)));
        let input = dir.join("input.jsonl");
        std::fs::write(&input, lines.join("\n") + "\n")?;
        let config = dir.join("job.toml");
        std::fs::write(
            &config,
            format!(
                "[operator]\npath = {running:?}\nmemory_limit_mib = 40\n[operator.config]\nleft_fleet_after_ms = \"10000\"\n\
                 [source]\nkind = \"file\"\npath = {input:?}\n[sink]\nkind = \"file\"\npath = {:?}\n[dead_letter]\n\
                 path = {:?}\n[state]\ndir = {:?}\npartitions = 1\nbatch_records = 1000\ncommit_every = 1000\n",
                dir.join("out.jsonl"),
                dir.join("dead.jsonl"),
                dir.join("state"),
            ),
        )?;
        let mut deploy = sluice();
        run_ok(deploy.args(["deploy", &name]).arg(&canary).args(["--canary", "50%", "--config"]).arg(&config))?;
        let run = run_ok(sluice().arg("run").arg("--config").arg(&config))?;
        let report = String::from_utf8_lossy(&run.stderr);
        let outputs = read_jsonl(&dir.join("out.jsonl"))?;
        let echoed = outputs.iter().filter(|o| o["key"].as_str().is_some_and(|k| k.starts_with("c-"))).count();
        assert_eq!(echoed, 60, "the echo's keys went to it:\n{report}");
        for (key, i) in told.iter().zip(0..) {
            let left: Vec<_> = outputs.iter().filter(|o| o["key"] == key.as_str() && o["cause"] == "expiry").collect();
            assert_eq!(left.len(), 1, "{key} left the fleet once, told to vehicle-stats: {left:?}\n{report}");
            assert_eq!(left[0]["value"]["left_fleet_at"], T0 + 2_000 * i + 10_000, "{}", left[0]);
            assert_eq!(left[0]["operator"], told_version.as_str(), "canary: {vehicle_stats_is_canary}");
        }
        assert!(!dir.join("dead.jsonl").exists() || read_jsonl(&dir.join("dead.jsonl"))?.is_empty(), "{report}");
        assert!(
            dump_state(&dir.join("state"))?.keys().all(|key| !key.starts_with("v-")),
            "the vehicles' state expired"
        );
    }
    Ok(())
}
