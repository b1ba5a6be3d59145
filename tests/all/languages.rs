//! What a build of an operator in another language (Python, TypeScript) must do beside
//! the Rust build of the same logic, through the real binary: write the same outputs and
//! state byte for byte, share a partition's state key by key as its canary, and take over
//! a running job and give it back with every count going on. Each language's module
//! (`python`, `typescript`) runs these over its build, and writes and checks its
//! attacker's input and dead letters with the helpers at the end.

use crate::canary::in_canary;
use crate::hot_swap::{SEED, deployed_then_rolled_back, named_version, version_runs};
use crate::shadow::file_job;
use anyhow::Result;
use serde_json::Value;
use sluice_e2e::*;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// `dir/out.jsonl`'s lines without the `operator` field (which names the version),
/// sorted: what two builds must agree on.
pub(crate) fn outputs_without_version(dir: &Path) -> Result<Vec<String>> {
    let mut lines: Vec<String> = std::fs::read_to_string(dir.join("out.jsonl"))?
        .lines()
        .map(|line| match line.rsplit_once(",\"operator\":") {
            Some((before, _)) => format!("{before}}}"),
            None => line.to_string(),
        })
        .collect();
    lines.sort();
    Ok(lines)
}

/// Runs the Rust build `operator` and `build`, the same logic in another language, over
/// `input` with `[operator.config]` `config` (TOML lines), two partitions each, and fails
/// unless their outputs and state are the same bytes, and their dead letters those of the
/// same records for the same errors, word for word; returns the outputs. The jobs run in
/// `dir/rust` and `dir/other`.
pub(crate) fn assert_builds_agree(
    dir: &Path,
    input: &Path,
    operator: &str,
    build: &str,
    config: &str,
) -> Result<Vec<String>> {
    let (rust, other) = (dir.join("rust"), dir.join("other"));
    for (wasm, out) in [(operator, &rust), (build, &other)] {
        std::fs::create_dir_all(out)?;
        let (wasm, job) = (operator_wasm(wasm), out.join("job.toml"));
        std::fs::write(&job, format!("[operator]\npath = {wasm:?}\n[operator.config]\n{config}"))?;
        run_ok(run_file_job(&wasm, input, out, 2).arg("--config").arg(&job))?;
    }
    let (expected, actual) = (outputs_without_version(&rust)?, outputs_without_version(&other)?);
    assert_eq!(actual.len(), expected.len(), "as many outputs");
    if let Some(i) = (0..expected.len()).find(|&i| expected[i] != actual[i]) {
        panic!("output {i} differs:\n  rust:     {}\n  {build}: {}", expected[i], actual[i]);
    }
    // The state, as stored: the same bytes under the same keys (the dump first, for a
    // readable difference; it shows a binary value as the JSON it decodes to).
    assert_eq!(dump_state_lines(&other.join("state"))?, dump_state_lines(&rust.join("state"))?);
    assert!(stored_values(&other.join("state"))? == stored_values(&rust.join("state"))?, "the state's bytes differ");
    let dead = |dir: &Path| -> Result<BTreeSet<String>> {
        let letters = read_jsonl(&dir.join("dead.jsonl"))?;
        Ok(letters
            .iter()
            .map(|d| format!("{} {} {} {}", d["partition"], d["offset"], d["error"], d["reason"]))
            .collect())
    };
    assert_eq!(dead(&other)?, dead(&rust)?, "the same records dead-lettered, for the same errors");
    Ok(actual)
}

/// vehicle-stats' `build` in another language writes what the Rust build writes, byte for
/// byte: 200 vehicles' summaries, then with vehicles leaving the fleet, their TTLs and
/// `expired` callbacks included.
pub(crate) fn assert_vehicle_stats_agree(build: &str) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let input = dir.path().join("input.jsonl");
    // 200 vehicles reporting every 2 s of event time: distances of a few metres, where a
    // float printed otherwise than serde_json prints it would show.
    generate(&input, 200, 20_000, SEED)?;
    let outputs = assert_builds_agree(&dir.path().join("plain"), &input, "vehicle_stats", build, "")?;
    assert_eq!(outputs.len(), 20_000, "an output per position");

    // A vehicle leaving the fleet for good every 40 positions: each one's summary expires
    // 10 s after its last position (a TTL on the put), and `expired` emits it final.
    let seed = SEED.to_string();
    generate_edited(&input, &["--vehicles", "200", "--count", "20000", "--seed", &seed, "--churn", "40"], |_, _| {})?;
    let ttl = "left_fleet_after_ms = \"10000\"";
    let outputs = assert_builds_agree(&dir.path().join("ttl"), &input, "vehicle_stats", build, ttl)?;
    let left = outputs.iter().filter(|o| o.contains("\"left_fleet_at\":")).count();
    assert!(left > 400, "vehicles left the fleet: {left} final summaries");
    Ok(())
}

/// vehicle-stats' `build` in another language as the canary of the Rust build, for half
/// the keys, recorded before the job runs: each key runs the build the canary's hash
/// gives it, from its first record to its last; and the outputs and the state are, byte
/// for byte, those of the Rust build alone — the two languages' builds sharing one
/// partition's state, key by key.
pub(crate) fn assert_canary_over_rust_changes_no_byte(build: &str) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    let input = dir.join("input.jsonl");
    generate_edited(&input, &["--vehicles", "40", "--count", "4000"], every_100_ms)?;
    let rust = file_job(&dir.join("rust"), "vehicle_stats", &input, "")?;
    run_ok(sluice().arg("run").arg("--config").arg(&rust))?;
    let canary = file_job(&dir.join("canary"), "vehicle_stats", &input, "")?;
    let mut deploy = sluice();
    deploy.args(["deploy", "vehicle_stats"]).arg(operator_wasm(build));
    let deployed = run_ok(deploy.args(["--canary", "50%", "--config"]).arg(&canary))?;
    let other = named_version(&String::from_utf8(deployed.stdout)?);
    run_ok(sluice().arg("run").arg("--config").arg(&canary))?;

    let outputs = read_jsonl(&dir.join("canary/out.jsonl"))?;
    let mut keys_by_build: BTreeMap<bool, BTreeSet<String>> = BTreeMap::new();
    for output in &outputs {
        let key = output["key"].as_str().unwrap_or_default().to_string();
        let by_other = output["operator"] == other.as_str();
        assert_eq!(by_other, in_canary(&key, 5_000), "{key} runs the build the hash gives it: {output}");
        keys_by_build.entry(by_other).or_default().insert(key);
    }
    assert!(keys_by_build.values().all(|keys| keys.len() > 10), "both builds ran keys: {keys_by_build:?}");
    assert_eq!(outputs_without_version(&dir.join("canary"))?, outputs_without_version(&dir.join("rust"))?);
    assert_eq!(dump_state_lines(&dir.join("canary/state"))?, dump_state_lines(&dir.join("rust/state"))?);
    Ok(())
}

/// A running job on the Rust build of vehicle-stats, deployed to `build` in another
/// language and rolled back: each vehicle's summary continues the one before it, whichever
/// language wrote that one, and each partition's outputs name Rust, then `build` from one
/// offset on, then Rust again.
pub(crate) fn assert_swap_from_rust_and_back(build: &str) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    // Preparing a component of 12-18 MB (an interpreter inside) takes the debug build about
    // 10 s, and three times that beside other tests on two cores: the job (75 s at 8,000 a
    // second) outlasts it.
    let (input, other, host) = deployed_then_rolled_back(dir, "vehicle_stats", &operator_wasm(build), "", 600_000)?;
    assert!(other.starts_with("vehicle_stats@"), "{}", host.log());

    let mut outputs = read_jsonl(&dir.join("out.jsonl"))?;
    outputs.sort_by_key(|o| (o["partition"].as_u64(), o["offset"].as_u64()));
    let reference = Reference::fold(&input)?;
    let expected = reference.after_each_by_vehicle();
    assert_eq!(outputs.len(), reference.after_each.len(), "one output per position");
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for output in &outputs {
        let vehicle = output["key"].as_str().unwrap_or_default().to_string();
        let n = seen.entry(vehicle.clone()).or_default();
        assert_summary(&output["value"], &vehicle, expected[vehicle.as_str()][*n], "output");
        *n += 1;
    }
    for (partition, versions) in version_runs(&outputs) {
        assert_eq!(versions.len(), 3, "partition {partition}: Rust, {build}, Rust: {versions:?}");
        assert_eq!(versions[1], other, "partition {partition}: {versions:?}");
        assert!(versions[0] == versions[2] && versions[0] != other, "partition {partition}: {versions:?}");
    }
    assert!(read_jsonl(&dir.join("dead.jsonl"))?.is_empty());
    Ok(())
}

/// speed-windows' `build` in another language, on its SDK's windows, against the Rust
/// build on the Rust SDK's: the same windows closed, in the same outputs, the same state
/// and timers, the same late records — with a grace, positions late within it and beyond
/// it.
pub(crate) fn assert_speed_windows_agree(build: &str) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let input = dir.path().join("input.jsonl");
    let seed = SEED.to_string();
    // A position every 100 ms: minutes and 5-minute windows close along the run. Every
    // 97th is 90 s late (past its minute's 30 s grace, in time for some 5-minute windows),
    // every 389th 10 minutes late (late for all).
    generate_edited(&input, &["--vehicles", "50", "--count", "12000", "--seed", &seed], |i, p| {
        every_100_ms(i, p);
        let late = match i {
            _ if i > 0 && i % 389 == 0 => 600_000,
            _ if i > 0 && i % 97 == 0 => 90_000,
            _ => 0,
        };
        p["ts"] = (p["ts"].as_i64().unwrap_or_default() - late).into();
    })?;
    let outputs = assert_builds_agree(dir.path(), &input, "speed_windows", build, "grace_ms = \"30000\"")?;
    assert!(outputs.len() > 1_000, "windows closed: {}", outputs.len());
    // Its windows are kept in the binary encoding, in every language.
    let values: Vec<_> = stored_values(&dir.path().join("other").join("state"))?.into_iter().flatten().collect();
    assert!(!values.is_empty() && values.iter().all(|(_, _, v)| v.first() == Some(&0xC1)), "binary windows");
    let dead = read_jsonl(&dir.path().join("other").join("dead.jsonl"))?;
    assert!(!dead.is_empty() && dead.iter().all(|d| d["error"] == "late"), "late records: {dead:?}");
    Ok(())
}

/// sessions' `build` in another language, on its SDK's session windows, against the Rust
/// build under `sluice test`: 3,000 events of 20 users, out of order, with pauses longer
/// than the gap (new sessions), events bridging two sessions (merges) and events too late
/// for a closed one.
pub(crate) fn assert_sessions_agree(build: &str) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let input = dir.path().join("events.jsonl");
    let (mut x, mut ts, mut lines) = (7u64, 1_767_225_600_000i64, Vec::new());
    for _ in 0..3_000 {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        let user = format!("user-{}", (x >> 33) % 20);
        ts += ((x >> 40) % 3_000) as i64;
        // Now and then an event from the past: within a session, bridging two, or late.
        let back = match (x >> 20) % 50 {
            0 => 200_000,
            1..=3 => 40_000,
            _ => 0,
        };
        let page = format!("/p{}", (x >> 50) % 5);
        lines.push(serde_json::json!({"user": user, "ts": ts - back, "page": page}).to_string());
    }
    std::fs::write(&input, lines.join("\n") + "\n")?;
    let mut runs = Vec::new();
    for wasm in ["sessions", build] {
        let mut test = sluice();
        test.arg("test").arg(operator_wasm(wasm)).arg("--input").arg(&input);
        test.args(["--key-field", "user", "--config", "gap_ms=60000", "--advance-to"]).arg((ts + 600_000).to_string());
        let run = run_ok(&mut test)?;
        let printed: Vec<Value> =
            String::from_utf8(run.stdout)?.lines().map(serde_json::from_str).collect::<Result<_, _>>()?;
        // What each build printed, but the version it names.
        runs.push(
            printed
                .into_iter()
                .map(|mut line| {
                    line.as_object_mut().map(|o| o.remove("operator"));
                    line.to_string()
                })
                .collect::<Vec<_>>(),
        );
    }
    assert!(runs[0].len() > 100, "sessions closed: {}", runs[0].len());
    assert_eq!(runs[1], runs[0], "{build}'s sessions, then the Rust build's");
    Ok(())
}

/// Writes `path`: a record of key `u` and value `{"action": …, "ts": …}` a line, one for
/// each of `actions` — an attacker's input, one attack a record, the one at offset `i` at
/// event time 1,000,000 + 1,000 × `i` ms.
pub(crate) fn write_attacks(path: &Path, actions: &[&str]) -> Result<()> {
    let lines: String = actions
        .iter()
        .enumerate()
        .map(|(i, action)| {
            format!("{{\"vehicle_id\":\"u\",\"action\":\"{action}\",\"ts\":{}}}\n", 1_000_000 + i * 1_000)
        })
        .collect();
    Ok(std::fs::write(path, lines)?)
}

/// Fails unless `dir/dead.jsonl` holds `count` dead letters, and the reason of the one of
/// each attack in `reasons` (an action of `actions`, found by its record's offset)
/// contains the words given.
pub(crate) fn assert_attacks_stopped(
    dir: &Path,
    actions: &[&str],
    reasons: &[(&str, &str)],
    count: usize,
) -> Result<()> {
    let said: BTreeMap<String, String> = read_jsonl(&dir.join("dead.jsonl"))?
        .into_iter()
        .map(|d| (actions[d["offset"].as_u64().unwrap_or(0) as usize].to_string(), d["reason"].to_string()))
        .collect();
    for (action, reason) in reasons {
        let told = said.get(*action).map_or("", String::as_str);
        assert!(told.contains(reason), "{action}: {reason:?} not in {told}");
    }
    assert_eq!(said.len(), count, "{said:#?}");
    Ok(())
}
