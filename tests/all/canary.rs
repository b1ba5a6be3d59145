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
fn in_canary(key: &str, basis_points: u64) -> bool {
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
