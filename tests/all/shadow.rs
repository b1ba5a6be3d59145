//! Shadow deploys: a version run beside the live one on the same records, its outputs
//! compared and never sent. A shadow of the running build finds no difference through
//! a hot swap and a `kill -9` (the restarted host resumes it from the registry), as
//! `sluice shadow status`, `/metrics` and the final report say, and compares timers'
//! and expiries' outputs equal too; a shadow of vehicle-stats v2 reports every record, with the field it adds and the counts a
//! reference computes; a shadow that traps, spins, hogs memory or fails on record after
//! record costs the live partition nothing: its outputs and state equal a run without
//! it. `sluice shadow promote` and `stop` end a shadow.

use crate::hot_swap::PacedJob;
use anyhow::{Context, Result};
use serde_json::Value;
use sluice::events::SHADOW_COMPARED;
use sluice_e2e::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The numbers of the final report's shadow line in `log` (the last one):
/// compared, equal, different, only live, only shadow, failed, writes that differ.
pub(crate) fn reported_shadow(log: &str) -> Result<[u64; 7]> {
    let line = log.lines().rfind(|l| l.contains(SHADOW_COMPARED)).context("a shadow line")?;
    let numbers: Vec<u64> = line
        .split(": ")
        .nth(1)
        .context("counts after the version")?
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect();
    numbers.get(..7).and_then(|n| n.try_into().ok()).with_context(|| format!("seven counts in {line}"))
}

/// The records the final report's shadow line in `log` says the shadow skipped (out of
/// its share of the live version's time, as a loaded machine may leave it).
pub(crate) fn reported_skipped(log: &str) -> Result<u64> {
    let line = log.lines().rfind(|l| l.contains(SHADOW_COMPARED)).context("a shadow line")?;
    let before = line.split(" records skipped").next().context("a count of records skipped")?;
    let count = before.rsplit(' ').next().context("a count of records skipped")?;
    Ok(count.parse()?)
}

/// The numbers of `sluice shadow status`'s last row (all hosts): compared, equal,
/// different, only live, only shadow, failed, writes that differ.
fn status_totals(admin: &str) -> Result<[u64; 7]> {
    let status = run_ok(sluice().args(["shadow", "status", "vehicle_stats", "--admin", admin]))?;
    let stdout = String::from_utf8(status.stdout)?;
    let row = stdout.lines().find(|l| l.starts_with("all ")).with_context(|| format!("a row of all: {stdout}"))?;
    let numbers: Vec<u64> = row.split_whitespace().skip(1).take(7).map(str::parse).collect::<Result<_, _>>()?;
    numbers.try_into().map_err(|n| anyhow::anyhow!("seven counts, not {n:?}"))
}

#[test]
fn a_shadow_of_the_running_build_finds_no_difference_through_a_hot_swap_and_a_kill_9() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    let v1 = operator_wasm("vehicle_stats");
    let PacedJob { config, mut host, admin, .. } = PacedJob::start(dir, (60, 48_000), 6_000, &v1, "")?;
    let started = run_ok(sluice().args(["deploy", "vehicle_stats"]).arg(&v1).args(["--shadow", "--admin", &admin]))?;
    assert!(String::from_utf8(started.stdout)?.contains("this host runs it from its partitions' next batch"));
    std::thread::sleep(Duration::from_millis(1500));
    // The same logic built against WIT 0.1.2: another version, the same outputs.
    let swapped = operator_wasm("vehicle_stats_0_1_2");
    run_ok(sluice().args(["deploy", "vehicle_stats"]).arg(&swapped).args(["--admin", &admin]))?;
    std::thread::sleep(Duration::from_millis(1500));
    let [compared, equal, rest @ ..] = status_totals(&admin)?;
    assert!(compared > 1000 && equal == compared && rest == [0; 5], "{compared} {equal} {rest:?}");
    let scrape = sluice::admin::call(&admin, hyper::Method::GET, "/metrics", Vec::new())?;
    let equal_series: f64 = sluice::metrics::parse(&scrape)
        .iter()
        .filter(|s| s.name == "sluice_shadow_compared_total" && s.label("result") == Some("equal"))
        .map(|s| s.value)
        .sum();
    assert!(equal_series >= equal as f64, "{scrape}");

    host.kill_9()?;
    let mut restarted = Host::spawn("restarted", sluice().arg("run").arg("--config").arg(&config), &host.log)?;
    restarted.wait_exit(Duration::from_secs(120))?;
    let log = restarted.log();
    let [compared, equal, rest @ ..] = reported_shadow(&log)?;
    assert!(compared > 1000 && equal == compared && rest == [0; 5], "{compared} {equal} {rest:?}:\n{log}");
    Ok(())
}

/// A file job of vehicle-stats over `input` in `dir` with a commit after every batch of
/// 100 records, and `shadow` recorded as its shadow before it starts; returns its log.
fn shadowed_file_job(dir: &Path, input: &Path, shadow: &Path, more: &str) -> Result<String> {
    let config = file_job(dir, "vehicle_stats", input, more)?;
    run_ok(sluice().args(["deploy", "vehicle_stats"]).arg(shadow).arg("--shadow").arg("--config").arg(&config))?;
    let run = run_ok(sluice().arg("run").arg("--config").arg(&config))?;
    Ok(String::from_utf8(run.stderr)?)
}

/// The config of a file job of `operator` over `input` in `dir`, 2 partitions, a commit
/// after every batch of 100 records; `more` is TOML added to it.
pub(crate) fn file_job(dir: &Path, operator: &str, input: &Path, more: &str) -> Result<PathBuf> {
    let config = dir.join("job.toml");
    std::fs::create_dir_all(dir)?;
    std::fs::write(
        &config,
        format!(
            "[operator]\npath = {:?}\n{more}\n[source]\nkind = \"file\"\npath = {input:?}\n[sink]\nkind = \"file\"\n\
             path = {:?}\n[dead_letter]\npath = {:?}\n[state]\ndir = {:?}\npartitions = 2\nbatch_records = 100\n\
             commit_every = 100\n[report]\ninterval = \"0s\"\n",
            operator_wasm(operator),
            dir.join("out.jsonl"),
            dir.join("dead.jsonl"),
            dir.join("state"),
        ),
    )?;
    Ok(config)
}

/// `count` generator positions of 3 vehicles, every third one idle (below 5 km/h),
/// each then changed by `more` (given its index).
fn positions_with_idles(path: &Path, count: u64, mut more: impl FnMut(usize, &mut Value)) -> Result<Vec<Value>> {
    generate_edited(path, &["--vehicles", "3", "--count", &count.to_string()], |i, position| {
        if i % 3 == 0 {
            position["speed_kmh"] = 1.5.into();
        }
        more(i, position);
    })
}

/// v2 adds `idle_count` to every summary: every record differs, in that field alone.
/// The shadow starts over from the committed state at each commit (every 100 records
/// of a partition here), where v1 dropped the field: its count is the vehicle's idle
/// positions since the partition's last commit, which the reference computes.
#[test]
fn a_shadow_of_v2_reports_every_record_with_the_field_it_adds_and_the_counts_it_makes() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let input = dir.path().join("input.jsonl");
    let positions = positions_with_idles(&input, 3000, |_, _| {})?;
    let log = shadowed_file_job(dir.path(), &input, &operator_wasm("vehicle_stats_v2"), "")?;
    let [compared, equal, different, only_live, only_shadow, failed, writes] = reported_shadow(&log)?;
    assert_eq!((compared, equal, different, only_live, only_shadow, failed), (3000, 0, 3000, 0, 0, 0), "{log}");
    assert!(writes > 0, "v2 stores its summaries in binary: {log}");

    let mut log_of = sluice::source::PartitionedLog::new(2);
    let mut idle: BTreeMap<(u32, String), u64> = BTreeMap::new();
    let mut expected = Vec::new();
    for position in &positions {
        let vehicle = position["vehicle_id"].as_str().context("a vehicle")?.to_string();
        let raw = sluice::record::RawRecord { key: vehicle.clone().into_bytes(), value: Vec::new(), timestamp_ms: 0 };
        let record = log_of.place(raw);
        if record.offset.is_multiple_of(100) {
            idle.retain(|(p, _), _| *p != record.partition);
        }
        let count = idle.entry((record.partition, vehicle.clone())).or_default();
        *count += u64::from(position["speed_kmh"].as_f64().context("a speed")? < 5.0);
        if record.offset < 3 {
            expected.push(format!(
                "partition {} offset {}, key {vehicle:?}: value.idle_count (live absent, shadow {count})",
                record.partition, record.offset
            ));
        }
    }
    let mut shown: Vec<String> =
        log.lines().filter(|l| l.starts_with("  partition ")).map(|l| l.trim().to_string()).collect();
    shown.sort();
    expected.sort();
    assert_eq!(shown, expected, "{log}");
    Ok(())
}

/// A shadow of the running build of speed-windows (windows closed by timers) and of
/// vehicle-stats with vehicles leaving the fleet (summaries expiring through its
/// `expired`): every record and every group of timers or expiries compares equal, and
/// no write differs.
#[test]
fn a_shadow_of_the_running_build_compares_timers_and_expiries_equal() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let input = dir.path().join("input.jsonl");
    generate_edited(&input, &["--vehicles", "40", "--count", "6000", "--churn", "25"], every_100_ms)?;
    for (operator, more, cause) in [
        ("speed_windows", "", "\"cause\":\"timer\""),
        ("vehicle_stats", "[operator.config]\nleft_fleet_after_ms = \"20000\"", "\"cause\":\"expiry\""),
    ] {
        let dir = dir.path().join(operator);
        let config = file_job(&dir, operator, &input, more)?;
        run_ok(
            sluice()
                .args(["deploy", operator])
                .arg(operator_wasm(operator))
                .arg("--shadow")
                .arg("--config")
                .arg(&config),
        )?;
        let log = String::from_utf8(run_ok(sluice().arg("run").arg("--config").arg(&config))?.stderr)?;
        let groups = std::fs::read_to_string(dir.join("out.jsonl"))?.matches(cause).count();
        assert!(groups > 0, "{operator}: the run has {cause} outputs");
        let [compared, equal, rest @ ..] = reported_shadow(&log)?;
        // Records skipped are not compared: what was compared is all equal.
        let skipped = reported_skipped(&log)?;
        assert!(
            compared + skipped > 6000 && compared > 0 && equal == compared && rest == [0; 5],
            "{operator}: {compared} {equal} {rest:?}, {skipped} skipped:\n{log}"
        );
    }
    Ok(())
}

/// Positions that also tell the probe what to do (`action`): vehicle-stats ignores the
/// field. The probe as a shadow counts most, spins, hogs memory, and panics on a run
/// of one vehicle's records in a row, where it is stopped on that partition.
#[test]
fn a_shadow_that_traps_spins_or_hogs_memory_costs_the_live_partition_nothing() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let input = dir.path().join("input.jsonl");
    positions_with_idles(&input, 3000, |i, position| {
        position["action"] = match i {
            100 | 700 => "spin",
            300 | 900 => "hog",
            // Panics in a row: the shadow gets through some after each commit (a trap
            // replaces its instance, which takes time out of its share), as few as two
            // a batch on a loaded machine, so the run spans six batches or more of each
            // partition, for ten in a row.
            _ if (1000..2800).contains(&i) => "put-then-panic",
            _ => "count",
        }
        .into();
    })?;
    let limits = "call_timeout_ms = 200\nmemory_limit_mib = 32\n";
    let alone = dir.path().join("alone");
    run_ok(sluice().arg("run").arg("--config").arg(file_job(&alone, "vehicle_stats", &input, limits)?))?;
    let shadowed = dir.path().join("shadowed");
    let log = shadowed_file_job(&shadowed, &input, &operator_wasm("probe"), limits)?;

    let [compared, _, different, _, _, failed, _] = reported_shadow(&log)?;
    assert!(compared > 0 && different > 0, "the probe's counts are not summaries: {log}");
    assert!(failed >= 4, "spins, hogs and panics: {log}");
    assert!(log.contains("the shadow stopped: it failed on 10 records in a row"), "{log}");
    let by_partition = |dir: &Path| -> Result<BTreeMap<u64, Vec<String>>> {
        let mut lines: BTreeMap<u64, Vec<String>> = BTreeMap::new();
        for line in std::fs::read_to_string(dir.join("out.jsonl"))?.lines() {
            let value: Value = serde_json::from_str(line)?;
            lines.entry(value["partition"].as_u64().context("a partition")?).or_default().push(line.to_string());
        }
        Ok(lines)
    };
    assert_eq!(by_partition(&shadowed)?, by_partition(&alone)?, "the live outputs");
    assert_eq!(dump_state_lines(&shadowed.join("state"))?, dump_state_lines(&alone.join("state"))?, "the live state");
    assert!(!shadowed.join("dead.jsonl").exists() || std::fs::read_to_string(shadowed.join("dead.jsonl"))?.is_empty());
    Ok(())
}

/// A shadow slow on every record (the probe working tens of ms on each, within its
/// call timeout: it never fails) costs the live partition a bounded share of each
/// batch's time, not the shadow's time on every record: the run takes about what it
/// takes alone, and the records the shadow had no time for are skipped and counted.
#[test]
fn a_slow_shadow_is_held_to_its_share_of_the_live_partitions_time() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let input = dir.path().join("input.jsonl");
    positions_with_idles(&input, 1000, |_, position| {
        position["action"] = "work".into();
        position["iterations"] = 100_000_000.into();
    })?;
    let limits = "call_timeout_ms = 10000\n";
    let alone = std::time::Instant::now();
    run_ok(sluice().arg("run").arg("--config").arg(file_job(
        &dir.path().join("alone"),
        "vehicle_stats",
        &input,
        limits,
    )?))?;
    let alone = alone.elapsed();
    let shadowed = std::time::Instant::now();
    let log = shadowed_file_job(&dir.path().join("shadowed"), &input, &operator_wasm("probe"), limits)?;
    let shadowed = shadowed.elapsed();
    let [compared, _, _, _, _, failed, _] = reported_shadow(&log)?;
    let skipped: u64 = log
        .lines()
        .find_map(|l| l.split("; ").find_map(|part| part.strip_suffix(" records skipped (out of the shadow's time)")))
        .context("skipped records in the report")?
        .parse()?;
    assert!(failed == 0 && !log.contains("the shadow stopped"), "{log}");
    assert!(compared > 0 && skipped > 0 && compared + skipped == 1000, "{compared} + {skipped}: {log}");
    // Unbounded, the shadow alone would take 1,000 × tens of ms.
    assert!(shadowed < alone + Duration::from_secs(15), "{shadowed:?} against {alone:?} alone:\n{log}");
    Ok(())
}

/// `sluice shadow promote` deploys the shadow and ends it; `stop` ends one without a
/// deploy; either without a shadow is refused by name.
#[test]
fn a_shadow_is_promoted_or_stopped_through_the_registry() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let input = dir.path().join("input.jsonl");
    positions_with_idles(&input, 300, |_, _| {})?;
    let config = file_job(dir.path(), "vehicle_stats", &input, "")?;
    let shadow = |args: &[&str]| {
        let mut command = sluice();
        command.arg("shadow").args(args).arg("vehicle_stats").arg("--config").arg(&config);
        command
    };
    let none = run_err(&mut shadow(&["stop"]))?;
    assert!(none.contains("operator vehicle_stats runs no shadow"), "{none}");
    run_ok(sluice().arg("run").arg("--config").arg(&config))?;
    let v2 = operator_wasm("vehicle_stats_v2");
    run_ok(sluice().args(["deploy", "vehicle_stats"]).arg(&v2).arg("--shadow").arg("--config").arg(&config))?;
    let stopped = run_ok(&mut shadow(&["stop"]))?;
    assert!(String::from_utf8(stopped.stdout)?.starts_with("stopped the shadow vehicle_stats@"));
    run_ok(sluice().args(["deploy", "vehicle_stats"]).arg(&v2).arg("--shadow").arg("--config").arg(&config))?;
    let promoted = String::from_utf8(run_ok(&mut shadow(&["promote"]))?.stdout)?;
    assert!(
        promoted.contains("promoted the shadow: deployed vehicle_stats@") && promoted.contains("entry 2"),
        "{promoted}"
    );
    let none = run_err(&mut shadow(&["promote"]))?;
    assert!(none.contains("runs no shadow"), "{none}");
    let versions =
        String::from_utf8(run_ok(sluice().args(["versions", "vehicle_stats", "--config"]).arg(&config))?.stdout)?;
    assert!(versions.lines().any(|l| l.starts_with("* ") && l.contains("sluice shadow promote")), "{versions}");
    Ok(())
}
