//! Hot swap through the real binary: a new operator version deployed into a running
//! job (through its admin API, and through the registry with `sluice deploy --config`)
//! takes over between two batches in every partition, continues the state the old
//! version wrote, and can be rolled back; a restart runs the newest deployed version;
//! a component that cannot run is refused and the old version keeps processing; expiry
//! callbacks fire only while a version that exports them runs, and timers while one
//! exports `fired` (under one that does not, each is a dead letter); a replay runs each
//! record with the version that first did and expires as the first run did. The
//! registry works the same in an S3 store (a start whose upload of the component
//! breaks off tries again), a build forged to carry another's CRC-64 is
//! a version of its own, a registry written with CRC-64 names stays readable, `sluice
//! deploy --config` tries versions out in a private directory, and a deploy reaches
//! every host of a Kafka group through the shared store.

use anyhow::{Context, Result};
use serde_json::Value;
use sluice::events::{EXPIRED_REMOVED, RESUMED};
use sluice_e2e::*;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The seed of the positions the hot-swap tests (and the admin API's, which run their job) generate.
pub(crate) const SEED: u64 = 21;

/// vehicle-stats version 2 counts positions below this speed (`IDLE_KMH`).
const IDLE_KMH: f64 = 5.0;

/// A running job of `operator` over `count` generated positions of `vehicles`
/// vehicles, read at `rate` records/s into `dir/out.jsonl`, its admin API on a free
/// port, looking at the registry every 200 ms; `more` is TOML added to its config.
pub(crate) struct PacedJob {
    /// The generated input.
    pub(crate) input: PathBuf,
    /// The job's config file.
    pub(crate) config: PathBuf,
    /// The running host.
    pub(crate) host: Host,
    /// Its admin API.
    pub(crate) admin: String,
}

impl PacedJob {
    pub(crate) fn start(
        dir: &Path,
        (vehicles, count): (u32, u64),
        rate: u32,
        operator: &Path,
        more: &str,
    ) -> Result<Self> {
        let input = dir.join("input.jsonl");
        generate(&input, vehicles, count, SEED)?;
        let config = paced_job(dir, &input, rate, operator, more)?;
        let mut host = Host::spawn("host", sluice().arg("run").arg("--config").arg(&config), &dir.join("host.log"))?;
        let admin = host.admin_url()?;
        Ok(PacedJob { input, config, host, admin })
    }
}

/// The config of a [`PacedJob`].
pub(crate) fn paced_job(dir: &Path, input: &Path, rate: u32, operator: &Path, more: &str) -> Result<PathBuf> {
    let config = dir.join("job.toml");
    std::fs::write(
        &config,
        format!(
            "[operator]\npath = {operator:?}\npoll_versions_s = 0.2\n\
             [source]\nkind = \"file\"\npath = {input:?}\nrate = {rate}\n\
             [sink]\nkind = \"file\"\npath = {:?}\n[state]\ndir = {:?}\npartitions = 4\ncommit_every = 64\n\
             [dead_letter]\npath = {:?}\n[report]\ninterval_s = 0\n[admin]\nlisten = \"127.0.0.1:0\"\n{more}",
            dir.join("out.jsonl"),
            dir.join("state"),
            dir.join("dead.jsonl"),
        ),
    )?;
    Ok(config)
}

/// The version a deploy or rollback line names: `deployed vehicle_stats@… (entry 2): …`.
pub(crate) fn named_version(line: &str) -> String {
    line.split_whitespace().find(|w| w.starts_with("vehicle_stats@")).unwrap_or_default().to_string()
}

/// Per partition, the versions its outputs name, in offset order, with repeats
/// collapsed: `[v1, v2]` means one switch.
pub(crate) fn version_runs(outputs: &[Value]) -> BTreeMap<u64, Vec<String>> {
    let mut by_partition: BTreeMap<u64, Vec<(u64, String)>> = BTreeMap::new();
    for output in outputs {
        let (partition, offset) = (output["partition"].as_u64().unwrap(), output["offset"].as_u64().unwrap());
        by_partition.entry(partition).or_default().push((offset, output["operator"].as_str().unwrap().to_string()));
    }
    by_partition
        .into_iter()
        .map(|(partition, mut outputs)| {
            outputs.sort();
            let mut runs: Vec<String> = Vec::new();
            for (_, version) in outputs {
                if runs.last() != Some(&version) {
                    runs.push(version);
                }
            }
            (partition, runs)
        })
        .collect()
}

/// Checks every output against the reference fold — one output per input, each the
/// vehicle's summary after that input whatever version made it — and version 2's
/// `idle_count` against the idle positions it processed since it took over.
fn assert_outputs(outputs: &[Value], input: &Path, v2: &str) -> Result<()> {
    let reference = Reference::fold(input)?;
    assert_eq!(outputs.len(), reference.after_each.len(), "one output per input");
    let expected = reference.after_each_by_vehicle();
    let mut speeds: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for line in std::fs::read_to_string(input)?.lines() {
        let p: Value = serde_json::from_str(line)?;
        speeds.entry(p["vehicle_id"].as_str().unwrap().into()).or_default().push(p["speed_kmh"].as_f64().unwrap());
    }
    let mut in_order = outputs.to_vec();
    in_order.sort_by_key(|o| (o["partition"].as_u64(), o["offset"].as_u64()));
    let mut seen: BTreeMap<String, (usize, u64)> = BTreeMap::new();
    for output in &in_order {
        let vehicle = output["key"].as_str().unwrap().to_string();
        let (n, idle) = seen.entry(vehicle.clone()).or_default();
        assert_summary(&output["value"], &vehicle, expected[vehicle.as_str()][*n], "output");
        if output["operator"] == v2 {
            *idle += u64::from(speeds[&vehicle][*n] < IDLE_KMH);
            assert_eq!(output["value"]["idle_count"].as_u64(), Some(*idle), "version 2's new field: {output}");
        } else {
            // Version 1 neither reads nor writes it: a rollback drops it.
            assert!(output["value"].get("idle_count").is_none(), "{output}");
            *idle = 0;
        }
        *n += 1;
    }
    Ok(())
}

#[test]
fn a_deploy_under_load_switches_each_partition_once_and_carries_the_state_on() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    let PacedJob { input, config, mut host, admin } =
        PacedJob::start(dir, (100, 96_000), 8_000, &operator_wasm("vehicle_stats"), "")?;
    let first = run_ok(sluice().arg("versions").arg("vehicle_stats").arg("--admin").arg(&admin))?;
    let v1 = named_version(&String::from_utf8_lossy(&first.stdout));
    std::thread::sleep(Duration::from_secs(1));

    // Through the host's admin API: it answers once every partition switched.
    let v2_file = operator_wasm("vehicle_stats_v2");
    let deployed = run_ok(sluice().arg("deploy").arg("vehicle_stats").arg(&v2_file).arg("--admin").arg(&admin))?;
    let answer = String::from_utf8_lossy(&deployed.stdout);
    let v2 = named_version(&answer);
    assert!(v2 != v1 && answer.contains("(entry 2)") && answer.contains("4 partitions switched"), "{answer}");
    std::thread::sleep(Duration::from_millis(1500));

    // Through the registry: the host finds the rollback on its next look.
    let rolled = run_ok(sluice().arg("rollback").arg("vehicle_stats").arg("--config").arg(&config))?;
    let rolled = String::from_utf8_lossy(&rolled.stdout);
    assert!(rolled.contains(&format!("rolled back to {v1} recorded as entry 3")), "{rolled}");
    host.wait_for(&format!("deployed {v1} (entry 3)"), 1, Duration::from_secs(10))?;
    host.wait_for("processed 96000 records", 1, Duration::from_secs(60))?;
    let report = format!("operator at the end: {v1}; 8 version switches");
    assert!(host.log().contains(&report), "two switches in each of 4 partitions:\n{}", host.log());
    // A worker's events carry the version it runs as a field.
    let log = host.log();
    let back: Vec<&str> = log.lines().filter(|l| l.contains(&format!("switched from {v2} to {v1}"))).collect();
    let running_v2 = format!("operator{{operator_version={v2}}}");
    assert!(back.len() == 4 && back.iter().all(|l| l.contains(&running_v2)), "{log}");

    let outputs = read_jsonl(&dir.join("out.jsonl"))?;
    for (partition, runs) in version_runs(&outputs) {
        assert_eq!(
            runs,
            [v1.clone(), v2.clone(), v1.clone()],
            "partition {partition}: v1, then v2 from one offset on, then v1 again"
        );
    }
    assert_outputs(&outputs, &input, &v2)?;
    assert!(read_jsonl(&dir.join("dead.jsonl"))?.is_empty());

    let versions = run_ok(sluice().arg("versions").arg("vehicle_stats").arg("--config").arg(&config))?;
    let versions = String::from_utf8_lossy(&versions.stdout);
    let lines: Vec<&str> = versions.lines().skip(1).collect();
    assert_eq!(lines.len(), 3, "{versions}");
    assert!(
        lines[0].contains("deploy") && lines[0].contains(&v1) && lines[0].contains("configured file"),
        "{versions}"
    );
    assert!(lines[1].contains("deploy") && lines[1].contains(&v2) && lines[1].contains("admin API"), "{versions}");
    assert!(lines[2].starts_with('*') && lines[2].contains("rollback") && lines[2].contains(&v1), "{versions}");

    // Deployed while no host runs, version 2 is what a restart runs, though the config
    // still names version 1's file; it continues from the state version 1 left.
    run_ok(sluice().arg("deploy").arg("vehicle_stats").arg(&v2_file).arg("--config").arg(&config))?;
    generate(&input, 100, 100_000, SEED)?;
    let restarted = run_ok(sluice().arg("run").arg("--config").arg(&config).env("SLUICE_LOG", "info"))?;
    let log = String::from_utf8_lossy(&restarted.stderr);
    assert!(log.contains(&format!("running {v2} (registry entry 4), not the configured")), "{log}");
    assert!(log.contains("processed 4000 records") && log.contains("96000 records skipped"), "{log}");
    let outputs = read_jsonl(&dir.join("out.jsonl"))?;
    assert!(outputs[96_000..].iter().all(|o| o["operator"] == v2.as_str()), "the restart runs version 2");
    assert_outputs(&outputs, &input, &v2)?;
    let manifests = checkpoint_manifests(&dir.join("state.checkpoints"), 0)?;
    assert_eq!(manifests.last().unwrap()["operator"], v2.as_str(), "the checkpoint names the version that wrote it");
    Ok(())
}

/// A [`PacedJob`] of the component `v1` (as `operator_wasm` names it; `more` added to its
/// config) over `records` positions of 100 vehicles at 8,000/s: `other` deployed a second
/// in, rolled back from 1.5 s after its deploy answered, the job run to its end. Returns
/// the input, the deployed version and the host.
pub(crate) fn deployed_then_rolled_back(
    dir: &Path,
    v1: &str,
    other: &Path,
    more: &str,
    records: u64,
) -> Result<(PathBuf, String, Host)> {
    // Under the name of the job's operator, which the file's stem gives.
    let v1_file = dir.join("vehicle_stats.wasm");
    std::fs::copy(operator_wasm(v1), &v1_file)?;
    let PacedJob { input, mut host, admin, .. } = PacedJob::start(dir, (100, records), 8_000, &v1_file, more)?;
    std::thread::sleep(Duration::from_secs(1));
    let deployed = run_ok(sluice().arg("deploy").arg("vehicle_stats").arg(other).arg("--admin").arg(&admin))?;
    let version = named_version(&String::from_utf8_lossy(&deployed.stdout));
    std::thread::sleep(Duration::from_millis(1500));
    run_ok(sluice().arg("rollback").arg("vehicle_stats").arg("--admin").arg(&admin))?;
    host.wait_for(&format!("processed {records} records"), 1, Duration::from_secs(60 + records / 1000))?;
    Ok((input, version, host))
}

/// With a TTL from the host's config, version 1 built against WIT 0.1.0 (which has no
/// `expired`) runs, version 2 (which exports it) is deployed, then version 1 is rolled
/// back to. Entries expire throughout; callbacks fire for exactly the expiries that came
/// while version 2 ran, each at a record version 2 processed, as a run of version 2
/// alone fires them there.
#[test]
fn expiry_callbacks_fire_exactly_while_a_version_that_exports_them_runs() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    let v2_file = operator_wasm("vehicle_stats_v2");
    let ttl = "[ttl]\ndefault = \"3s\"\n";
    let (input, v2, host) = deployed_then_rolled_back(dir, "vehicle_stats_0_1_0", &v2_file, ttl, 48_000)?;

    let outputs = read_jsonl(&dir.join("out.jsonl"))?;
    let (records, callbacks): (Vec<Value>, Vec<Value>) = outputs.into_iter().partition(|o| o.get("cause").is_none());
    for (partition, runs) in version_runs(&records) {
        assert_eq!(runs.len(), 3, "partition {partition}: v1, v2, v1 again: {runs:?}");
        assert_eq!(runs[1], v2, "partition {partition}");
    }
    let processed_by: BTreeMap<(u64, u64), &str> = records
        .iter()
        .map(|o| ((o["partition"].as_u64().unwrap(), o["offset"].as_u64().unwrap()), o["operator"].as_str().unwrap()))
        .collect();
    let expiry = |o: &Value| (o["partition"].as_u64().unwrap(), o["offset"].as_u64().unwrap(), o["key"].to_string());
    assert!(callbacks.iter().all(|o| o["operator"] == v2.as_str()), "only version 2 is told");
    let fired: std::collections::BTreeSet<_> = callbacks.iter().map(expiry).collect();
    assert_eq!(fired.len(), callbacks.len(), "each expiry once");

    // Every expiry of the input, from a run of version 2 alone: it expires the same
    // entries at the same records, whatever ran and whenever it committed.
    let alone = dir.join("alone");
    std::fs::create_dir(&alone)?;
    let report = run_ok(run_file_job(&v2_file, &input, &alone, 4).args(["--ttl", "3s"]))?;
    let every: Vec<_> =
        read_jsonl(&alone.join("out.jsonl"))?.iter().filter(|o| o["cause"] == "expiry").map(expiry).collect();
    assert_eq!(every.len() as u64, reported_expired(&String::from_utf8_lossy(&report.stderr)));
    assert!(host.log().contains(&format!("{}{}", every.len(), EXPIRED_REMOVED)), "{}", host.log());
    let expected: std::collections::BTreeSet<_> =
        every.iter().filter(|(partition, offset, _)| processed_by[&(*partition, *offset)] == v2).cloned().collect();
    assert!(!expected.is_empty() && expected.len() < every.len(), "{} of {}", expected.len(), every.len());
    assert_eq!(fired, expected, "callbacks for exactly the expiries at records version 2 processed");
    Ok(())
}

/// Timers across a hot swap from a build without them (vehicle-stats against WIT 0.1.2)
/// to a windowed build (speed-windows, deployed as the same operator) and back. Each
/// window the windowed build opened and the clock closed by the end comes out exactly
/// once: as the windowed build's output when its timer fired while that build ran, else
/// as a dead letter (`"cause":"timer"`) of the 0.1.2 build naming the timer and saying
/// it cannot handle it. Refusing it there is the design: a version without `fired`
/// cannot emit the window, and dropping the timer would lose it without a trace.
#[test]
fn timers_fire_while_a_windowed_build_runs_and_are_refused_by_a_build_without_them() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    let (input, windowed, _host) =
        deployed_then_rolled_back(dir, "vehicle_stats_0_1_2", &operator_wasm("speed_windows"), "", 48_000)?;

    // The positions each build processed: vehicle-stats emits one output per position,
    // speed-windows none.
    let outputs = read_jsonl(&dir.join("out.jsonl"))?;
    let (records, fired): (Vec<Value>, Vec<Value>) = outputs.into_iter().partition(|o| o.get("cause").is_none());
    let by_v1: BTreeSet<(u64, u64)> =
        records.iter().map(|o| (o["partition"].as_u64().unwrap(), o["offset"].as_u64().unwrap())).collect();
    // The windows the windowed build opened, by (vehicle, timer name), and each
    // partition's final clock.
    let (mut opened, mut clock) = (BTreeMap::new(), BTreeMap::new());
    let mut next_offset: BTreeMap<u32, u64> = BTreeMap::new();
    for line in std::fs::read_to_string(&input)?.lines() {
        let p: Value = serde_json::from_str(line)?;
        let (vehicle, ts) = (p["vehicle_id"].as_str().unwrap().to_string(), p["ts"].as_u64().unwrap());
        let partition = sluice::source::partition_for(vehicle.as_bytes(), 4);
        let offset = next_offset.entry(partition).or_default();
        let processed_by_v1 = by_v1.contains(&(u64::from(partition), *offset));
        *offset += 1;
        *clock.entry(partition).or_default() = ts;
        if processed_by_v1 {
            continue;
        }
        let minute = ts - ts % 60_000;
        opened.insert((vehicle.clone(), format!("minute/{minute}")), (partition, minute + 60_000));
        for start in (0..5).map(|i| minute - i * 60_000) {
            opened.insert((vehicle.clone(), format!("5min/{start}")), (partition, start + 300_000));
        }
    }
    let closed: BTreeSet<_> =
        opened.into_iter().filter(|(_, (p, end))| *end <= clock[p]).map(|(window, _)| window).collect();

    assert!(fired.iter().all(|o| o["cause"] == "timer" && o["operator"] == windowed.as_str()), "{fired:?}");
    let emitted: Vec<(String, String)> = fired
        .iter()
        .map(|o| {
            (
                o["key"].as_str().unwrap().to_string(),
                format!("{}/{}", o["value"]["window"].as_str().unwrap(), o["value"]["start"]),
            )
        })
        .collect();
    let dead = read_jsonl(&dir.join("dead.jsonl"))?;
    let refusal = "does not export `fired` (it was built against sluice:operator before 0.1.3";
    let refused: Vec<(String, String)> = dead
        .iter()
        .map(|d| {
            assert!(d["cause"] == "timer" && d["operator"] != windowed.as_str(), "{d}");
            let reason = d["reason"].as_str().unwrap();
            assert!(reason.contains(refusal), "{reason}");
            let timer = reason.strip_prefix("timer \"").and_then(|r| r.split('"').next()).unwrap();
            (d["key"].as_str().unwrap().to_string(), timer.to_string())
        })
        .collect();
    assert!(!emitted.is_empty() && !refused.is_empty(), "{} fired, {} refused", emitted.len(), refused.len());
    let mut both: Vec<_> = emitted.into_iter().chain(refused).collect();
    both.sort();
    let distinct = both.iter().cloned().collect::<BTreeSet<_>>();
    assert_eq!(both.len(), distinct.len(), "no window both fired and refused, or twice");
    assert_eq!(distinct, closed, "each closed window once, fired or refused");
    Ok(())
}

#[test]
fn a_component_that_cannot_run_is_refused_and_the_running_version_keeps_processing() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    // Version 1 ignores its config; the probe, deployed in its place, traps in `init`.
    // Eight seconds of records: the job must outlast every deploy below, each of which
    // compiles a component, on two cores shared with the other tests.
    let job = PacedJob::start(
        dir,
        (50, 12_000),
        1_500,
        &operator_wasm("vehicle_stats"),
        "[operator.config]\ntrap_init = \"true\"\n",
    )?;
    let PacedJob { input, config, mut host, admin } = job;
    let outputs_before = read_jsonl(&dir.join("out.jsonl"))?.len();

    let broken: [(&str, Vec<u8>, &str); 3] = [
        ("text.wasm", b"not wasm at all".to_vec(), "is not a WebAssembly file"),
        ("core.wasm", wat::parse_str("(module)")?, "core WebAssembly module, not a component"),
        ("empty.wasm", wat::parse_str("(component)")?, "does not fit the sluice:operator/operator@0.1 world"),
    ];
    for (name, bytes, expected) in broken {
        let file = dir.join(name);
        std::fs::write(&file, bytes)?;
        let err = run_err(sluice().arg("deploy").arg("vehicle_stats").arg(&file).arg("--admin").arg(&admin))?;
        assert!(err.contains(expected) && err.contains("400 Bad Request"), "{name}: {err}");
    }
    let probe = operator_wasm("probe");
    let err = run_err(sluice().arg("deploy").arg("vehicle_stats").arg(&probe).arg("--admin").arg(&admin))?;
    assert!(
        err.contains("trapped in init") && err.contains("trap_init is set") && err.contains("400 Bad Request"),
        "{err}"
    );
    // `--config` validates the same way before it records anything.
    let err = run_err(sluice().arg("deploy").arg("vehicle_stats").arg(&probe).arg("--config").arg(&config))?;
    assert!(err.contains("trapped in init") && err.contains(&probe.display().to_string()), "{err}");
    let err = run_err(sluice().arg("deploy").arg("other_name").arg(&probe).arg("--admin").arg(&admin))?;
    assert!(
        err.contains("this job runs operator `vehicle_stats`, not `other_name`") && err.contains("404 Not Found"),
        "{err}"
    );
    let err = run_err(sluice().arg("rollback").arg("vehicle_stats").arg("--admin").arg(&admin))?;
    assert!(err.contains("nothing to roll back to") && err.contains("409 Conflict"), "{err}");
    let err = run_err(
        sluice().arg("deploy").arg("vehicle_stats").arg(operator_wasm("vehicle_stats")).arg("--admin").arg(&admin),
    )?;
    assert!(err.contains("is already the version in force (entry 1)") && err.contains("409 Conflict"), "{err}");
    // A valid version while the registry cannot be written (its history folder is a
    // file for a moment): the store's failure, not the component's.
    let history = dir.join("state.checkpoints/operators/vehicle_stats/history");
    std::fs::rename(&history, dir.join("history.aside"))?;
    std::fs::write(&history, b"")?;
    let v2_file = operator_wasm("vehicle_stats_v2");
    let err = run_err(sluice().arg("deploy").arg("vehicle_stats").arg(&v2_file).arg("--admin").arg(&admin));
    std::fs::remove_file(&history)?;
    std::fs::rename(dir.join("history.aside"), &history)?;
    let err = err?;
    assert!(err.contains("503 Service Unavailable") && err.contains("checkpoint store"), "{err}");
    let outputs_during = read_jsonl(&dir.join("out.jsonl"))?.len();
    assert!(outputs_during > outputs_before, "processing went on while deploys were refused");

    host.wait_for("processed 12000 records", 1, Duration::from_secs(60))?;
    let versions = run_ok(sluice().arg("versions").arg("vehicle_stats").arg("--config").arg(&config))?;
    assert_eq!(String::from_utf8_lossy(&versions.stdout).lines().count(), 2, "only the first version is recorded");
    let outputs = read_jsonl(&dir.join("out.jsonl"))?;
    assert!(version_runs(&outputs).values().all(|runs| runs.len() == 1), "one version throughout");
    assert_outputs(&outputs, &input, "none")?;
    assert_state_matches(&dump_state(&dir.join("state"))?, &Reference::fold(&input)?, "final state");
    Ok(())
}

#[test]
fn versions_live_in_an_s3_store_and_a_racing_writer_cannot_overwrite_an_entry() -> Result<()> {
    let s3 = S3Server::start()?;
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    let config = dir.join("job.toml");
    std::fs::write(
        &config,
        format!(
            "[operator]\npath = {:?}\n[source]\nkind = \"generator\"\nvehicles = 200\nseed = 3\n\
             [sink]\nkind = \"file\"\npath = {:?}\n[state]\ndir = {:?}\npartitions = 2\n\
             [checkpoint]\nstore = \"s3://sluice/jobs/swap\"\n[report]\ninterval_s = 0\n\
             [dead_letter]\npath = {:?}\n",
            operator_wasm("vehicle_stats"),
            dir.join("out.jsonl"),
            dir.join("state"),
            dir.join("dead.jsonl"),
        ),
    )?;
    let sluice_s3 = || {
        let mut command = sluice();
        s3.configure(&mut command);
        command
    };
    run_ok(sluice_s3().arg("run").arg("--config").arg(&config).args(["--count", "4000"]))?;
    let history = s3.bucket_dir.join("jobs/swap/operators/vehicle_stats/history");
    let first = std::fs::read_to_string(history.join("0000000001.json"))?;
    // Another writer took entry 2 a moment before this deploy.
    std::fs::write(history.join("0000000002.json"), first.replace("\"seq\": 1", "\"seq\": 2"))?;

    let v2_file = operator_wasm("vehicle_stats_v2");
    let deployed = run_ok(sluice_s3().arg("deploy").arg("vehicle_stats").arg(&v2_file).arg("--config").arg(&config))?;
    let deployed = String::from_utf8_lossy(&deployed.stdout);
    assert!(deployed.contains("recorded as entry 3"), "the conditional put kept entry 2: {deployed}");
    assert!(std::fs::read_to_string(history.join("0000000002.json"))?.contains("\"seq\": 2"));
    let v2 = named_version(&deployed);

    let run = run_ok(
        sluice_s3().arg("run").arg("--config").arg(&config).args(["--count", "6000"]).env("SLUICE_LOG", "info"),
    )?;
    let log = String::from_utf8_lossy(&run.stderr);
    assert!(
        log.contains(&format!("running {v2} (registry entry 3)")) && log.contains("processed 2000 records"),
        "{log}"
    );
    let outputs = read_jsonl(&dir.join("out.jsonl"))?;
    assert_eq!(outputs.len(), 6000);
    assert!(
        outputs[4000..].iter().all(|o| o["operator"] == v2.as_str()),
        "the restart ran the version in the S3 registry"
    );
    Ok(())
}

/// A host starting on a new store whose write of the component breaks off (the
/// connection reset mid-upload, as an S3 server may do when hosts starting beside it
/// write the same object at once) tries again after a wait and starts, the version
/// recorded once; before, that host exited with the store's error.
#[test]
fn a_start_whose_component_upload_breaks_off_tries_again() -> Result<()> {
    let s3 = S3Server::start()?;
    let proxy = ResettingProxy::start(&s3.endpoint, "/components/", 2)?;
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    let mut command = run_generator_job(dir, 100, 2_000, SEED, 2);
    command.args(["--checkpoint-store", "s3://sluice/jobs/reset"]);
    s3.configure(&mut command).env("AWS_ENDPOINT", &proxy.endpoint);
    let run = run_ok(&mut command)?;
    let log = String::from_utf8_lossy(&run.stderr);
    assert_eq!(proxy.resets(), 2, "both uploads were cut off:\n{log}");
    assert_eq!(log.matches("recording the configured operator in the registry").count(), 2, "{log}");
    assert!(log.contains("processed 2000 records"), "{log}");
    let operator = s3.bucket_dir.join("jobs/reset/operators/vehicle_stats");
    assert_eq!(std::fs::read_dir(operator.join("history"))?.count(), 1, "one deploy recorded");
    let components: Vec<_> = std::fs::read_dir(operator.join("components"))?.collect::<Result<_, _>>()?;
    assert_eq!(components.len(), 1);
    assert_eq!(std::fs::read(components[0].path())?, std::fs::read(operator_wasm("vehicle_stats"))?);
    Ok(())
}

/// A TCP proxy to an HTTP server that resets, `resets` times, the connection of a
/// request whose line names a path containing `cut`: the client sees its upload broken
/// off mid-body (the proxy closes with the body unread, so the kernel resets).
struct ResettingProxy {
    endpoint: String,
    /// Connections reset so far.
    reset: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl ResettingProxy {
    fn start(upstream: &str, cut: &str, resets: usize) -> Result<Self> {
        use std::io::{Read, Write};
        use std::net::{TcpListener, TcpStream};
        use std::sync::atomic::{AtomicUsize, Ordering};
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let endpoint = format!("http://{}", listener.local_addr()?);
        let upstream = upstream.trim_start_matches("http://").to_string();
        let reset = std::sync::Arc::new(AtomicUsize::new(0));
        let (cut, counted) = (cut.to_string(), reset.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let (upstream, cut, counted) = (upstream.clone(), cut.clone(), counted.clone());
                std::thread::spawn(move || -> Result<()> {
                    let server = TcpStream::connect(&upstream)?;
                    let (mut from_server, mut to_client) = (server.try_clone()?, client.try_clone()?);
                    std::thread::spawn(move || std::io::copy(&mut from_server, &mut to_client));
                    let (mut client, mut server) = (client, server);
                    let mut chunk = vec![0; 64 << 10];
                    loop {
                        let n = client.read(&mut chunk)?;
                        if n == 0 {
                            return Ok(server.shutdown(std::net::Shutdown::Write)?);
                        }
                        let text = String::from_utf8_lossy(&chunk[..n]);
                        let cut_here = text.lines().any(|l| l.starts_with("PUT ") && l.contains(&cut));
                        if cut_here
                            && counted
                                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < resets).then_some(n + 1))
                                .is_ok()
                        {
                            // Dropped with the body unread: the kernel answers with a reset.
                            server.shutdown(std::net::Shutdown::Both).ok();
                            return Ok(());
                        }
                        server.write_all(&chunk[..n])?;
                    }
                });
            }
        });
        Ok(ResettingProxy { endpoint, reset })
    }

    /// How many connections it reset.
    fn resets(&self) -> usize {
        self.reset.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A replay decides what the first run decided, whatever the wall clock says when it
/// runs. The input holds positions a day and 20 seconds ahead of the wall clock at the
/// test's start (the edge of `future_skew` then, inside it 25 seconds later) and ones
/// ten years ahead, each alone among ordinary records, under a TTL of a minute. Three
/// runs from empty state — one with a hot swap in its middle (from the 0.1.0 build to
/// the current one, the same logic), one 25 seconds later, one killed at its fifth
/// commit and restarted — leave byte-identical state, and the same outputs.
#[test]
fn a_replay_moves_the_clock_and_expires_as_the_first_run_did_whenever_it_runs() -> Result<()> {
    const RECORDS: u64 = 30_000;
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis() as i64;
    let generated = dir.join("generated.jsonl");
    generate(&generated, 200, RECORDS, SEED)?;
    let mut lines: Vec<Value> = read_jsonl(&generated)?;
    for (i, line) in lines.iter_mut().enumerate().filter(|(i, _)| i % 2_000 == 1_000) {
        let ahead = if i % 4_000 == 1_000 { 86_400_000 + 20_000 } else { 10 * 365 * 86_400_000 };
        line["ts"] = (now_ms + ahead).into();
    }
    let input = dir.join("input.jsonl");
    std::fs::write(&input, lines.iter().map(|l| format!("{l}\n")).collect::<String>())?;
    // Under the name of the job's operator, which the file's stem gives.
    let v1_file = dir.join("vehicle_stats.wasm");
    std::fs::copy(operator_wasm("vehicle_stats_0_1_0"), &v1_file)?;
    let ttl = "[ttl]\ndefault = \"60s\"\n";
    // Each run in a directory of its own: state, outputs and checkpoints.
    let run_in = |name: &str, rate: u32| -> Result<(PathBuf, PathBuf)> {
        let home = dir.join(name);
        std::fs::create_dir_all(&home)?;
        Ok((home.clone(), paced_job(&home, &input, rate, &v1_file, ttl)?))
    };
    let outputs_of = |home: &Path| -> Result<std::collections::BTreeSet<String>> {
        let outputs = read_jsonl(&home.join("out.jsonl"))?;
        Ok(outputs
            .iter()
            .map(|o| format!("{} {} {} {} {}", o["partition"], o["offset"], o["cause"], o["key"], o["value"]))
            .collect())
    };

    let (swapped, config) = run_in("swapped", 10_000)?;
    let mut host = Host::spawn("swapped", sluice().arg("run").arg("--config").arg(&config), &swapped.join("host.log"))?;
    let admin = host.admin_url()?;
    std::thread::sleep(Duration::from_secs(1));
    run_ok(sluice().arg("deploy").arg("vehicle_stats").arg(operator_wasm("vehicle_stats")).arg("--admin").arg(&admin))?;
    assert!(host.wait_exit(Duration::from_secs(120))?.success(), "{}", host.log());
    let versions: std::collections::BTreeSet<String> =
        read_jsonl(&swapped.join("out.jsonl"))?.iter().map(|o| o["operator"].to_string()).collect();
    assert_eq!(versions.len(), 2, "the swap came in the middle of the run: {versions:?}");

    let since = std::time::Instant::now();
    std::thread::sleep(Duration::from_secs(25).saturating_sub(since.elapsed()));
    let (later, config) = run_in("later", 1_000_000)?;
    run_ok(sluice().arg("run").arg("--config").arg(&config))?;

    let (killed, config) = run_in("killed", 1_000_000)?;
    let kill = sluice().arg("run").arg("--config").arg(&config).env("SLUICE_KILL_AT", "state-committed:5").output()?;
    assert!(!kill.status.success(), "killed at its fifth commit");
    run_ok(sluice().arg("run").arg("--config").arg(&config))?;

    let state = dump_state_lines(&swapped.join("state"))?;
    assert!(state.iter().any(|line| line.contains("expires_at_ms")), "entries carry expiries");
    assert_eq!(dump_state_lines(&later.join("state"))?, state, "a run 25 seconds later");
    assert_eq!(dump_state_lines(&killed.join("state"))?, state, "a run killed and restarted");
    let outputs = outputs_of(&swapped)?;
    assert_eq!(outputs_of(&later)?, outputs, "the same outputs 25 seconds later");
    assert_eq!(outputs_of(&killed)?, outputs, "the same outputs (each at least once) after the kill");
    Ok(())
}

/// A replay processes each record with the version that first processed it. A job
/// runs version 1, version 2 is deployed in its middle, and the job ends; then its
/// host loses its disk and the checkpoints taken since the deploy are gone, so the
/// next run restores checkpoints version 1 took and replays records from before the
/// switch, with version 2 in force. Version 1 processes them again — every replayed
/// record's output names the version its first output named — version 2 takes over at
/// the offset where it first did, and the state ends as the first run left it.
#[test]
fn a_replay_from_before_a_hot_swap_runs_each_record_with_the_version_that_first_did() -> Result<()> {
    use sluice::events::REPLAYED_WITH;
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    let more = "[checkpoint]\ninterval = \"500ms\"\nretain = 1000\n";
    let PacedJob { config, mut host, admin, .. } =
        PacedJob::start(dir, (400, 24_000), 4_000, &operator_wasm("vehicle_stats"), more)?;
    std::thread::sleep(Duration::from_secs(2));
    let deployed = run_ok(
        sluice().arg("deploy").arg("vehicle_stats").arg(operator_wasm("vehicle_stats_v2")).arg("--admin").arg(&admin),
    )?;
    let v2 = named_version(&String::from_utf8_lossy(&deployed.stdout));
    assert!(host.wait_exit(Duration::from_secs(60))?.success(), "{}", host.log());
    let version_at = |outputs: &[Value]| -> BTreeMap<(u64, u64), String> {
        let at = |o: &Value| (o["partition"].as_u64().unwrap(), o["offset"].as_u64().unwrap());
        outputs.iter().map(|o| (at(o), o["operator"].as_str().unwrap().to_string())).collect()
    };
    let first = version_at(&read_jsonl(&dir.join("out.jsonl"))?);
    let state = dump_state_lines(&dir.join("state"))?;

    // The disk is lost, and so are the checkpoints version 2 took and, where version 1
    // took more than one, its last: the commit of a switch takes a checkpoint when one
    // is due, and on a loaded machine one was due at every partition's switch, so a
    // restore of it replayed nothing of version 1 anywhere.
    std::fs::remove_dir_all(dir.join("state"))?;
    std::fs::rename(dir.join("out.jsonl"), dir.join("first.jsonl"))?;
    let store = dir.join("state.checkpoints");
    for partition in 0..4 {
        let (of_v2, mut of_v1): (Vec<Value>, Vec<Value>) =
            checkpoint_manifests(&store, partition)?.into_iter().partition(|m| m["operator"] == v2.as_str());
        let lost = of_v2.into_iter().chain(if of_v1.len() > 1 { of_v1.pop() } else { None });
        for manifest in lost {
            let id = manifest["id"].as_u64().context("a manifest names its checkpoint")?;
            std::fs::remove_file(store.join(format!("partition-{partition:04}/manifests/{id:010}.json")))?;
        }
    }
    let run =
        run_ok(sluice().arg("run").arg("--config").arg(&config).args(["--rate", "1000000"]).env("SLUICE_LOG", "info"))?;
    let log = String::from_utf8_lossy(&run.stderr);
    let v1 = first.values().find(|v| **v != v2).context("version 1 ran first")?;
    let back = format!("from {v2} to {v1} at offset");
    // A partition with one checkpoint of version 1, taken at its switch, resumes at the
    // switch itself and replays nothing of version 1.
    let replayed = log.lines().filter(|l| l.contains(REPLAYED_WITH) && l.contains(&back)).count();
    assert!(replayed >= 1, "a partition replays with version 1, then switches to 2 again:\n{log}");
    let again = version_at(&read_jsonl(&dir.join("out.jsonl"))?);
    let v1_replayed = again.iter().filter(|(_, version)| **version != v2).count();
    assert!(v1_replayed > 0 && again.values().any(|v| *v == v2), "the replay crossed the switch: {v1_replayed}");
    for (at, version) in &again {
        assert_eq!(Some(version), first.get(at), "partition {} offset {}", at.0, at.1);
    }
    assert_eq!(dump_state_lines(&dir.join("state"))?, state, "the state the first run left");
    Ok(())
}

/// A build made to carry another build's CRC-64 — anyone can append bytes that do, a
/// CRC being linear — is a version of its own: deployed, it gets its own (SHA-256)
/// name and leaves the stored component of the build it imitates as it was, so two
/// rollbacks return to version 1 itself (its outputs carry no `idle_count`), not to the
/// impostor, which is version 2's code.
#[test]
fn a_build_made_to_match_another_builds_crc64_is_a_version_of_its_own() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    let v1_file = operator_wasm("vehicle_stats");
    let PacedJob { mut host, admin, .. } = PacedJob::start(dir, (20, 30_000), 1_000, &v1_file, "")?;
    let registry = dir.join("state.checkpoints/operators/vehicle_stats");
    let entry = |seq: u64| -> Result<String> {
        let entry: Value = serde_json::from_slice(&std::fs::read(registry.join(format!("history/{seq:010}.json")))?)?;
        Ok(entry["version"].as_str().unwrap_or_default().to_string())
    };
    let v1 = entry(1)?;
    let v1_bytes = std::fs::read(&v1_file)?;
    let impostor_file = dir.join("impostor.wasm");
    let v2_bytes = std::fs::read(operator_wasm("vehicle_stats_v2"))?;
    std::fs::write(&impostor_file, with_crc64_of(&v2_bytes, &v1_bytes))?;
    let admin_command = |command: &str, file: Option<&Path>| -> Result<String> {
        let mut call = sluice();
        call.arg(command).arg("vehicle_stats").args(file).arg("--admin").arg(&admin);
        let answer = run_ok(&mut call)?;
        std::thread::sleep(Duration::from_millis(500));
        Ok(named_version(&String::from_utf8_lossy(&answer.stdout)))
    };
    let v2 = admin_command("deploy", Some(&operator_wasm("vehicle_stats_v2")))?;
    let impostor = admin_command("deploy", Some(&impostor_file))?;
    assert!(impostor != v1 && impostor != v2, "{v1} {v2} {impostor}");
    let digest = |version: &str| version.rsplit_once('@').map(|(_, d)| d.to_string()).unwrap_or_default();
    assert_eq!(digest(&impostor).len(), 64, "named by SHA-256: {impostor}");
    assert_eq!(std::fs::read(registry.join(format!("components/{}.wasm", digest(&v1))))?, v1_bytes);
    assert_eq!(admin_command("rollback", None)?, v2);
    assert_eq!(admin_command("rollback", None)?, v1);
    host.terminate()?;
    let outputs = read_jsonl(&dir.join("out.jsonl"))?;
    for (partition, runs) in version_runs(&outputs) {
        assert_eq!(runs.last(), Some(&v1), "partition {partition} runs version 1 at the end: {runs:?}");
    }
    let v1_outputs: Vec<&Value> = outputs.iter().filter(|o| o["operator"] == v1.as_str()).collect();
    assert!(v1_outputs.iter().all(|o| o["value"].get("idle_count").is_none()), "version 1's code ran as version 1");
    Ok(())
}

/// A registry written when versions were named by the CRC-64 of their component (16
/// hex digits) stays readable, and its builds keep those names: a host starting with
/// the first build's file runs the second, as its history says, under its old name
/// (records nothing new); a rollback returns to the first; deploying the second again is
/// the same version; a build new to the registry is named by SHA-256.
#[test]
fn a_registry_written_with_crc64_names_stays_readable() -> Result<()> {
    use sluice::operator::registry::{Action, Deployment};
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    let (v1_file, v2_file) = (operator_wasm("vehicle_stats"), operator_wasm("vehicle_stats_v2"));
    let registry = dir.join("state.checkpoints/operators/vehicle_stats");
    std::fs::create_dir_all(registry.join("components"))?;
    std::fs::create_dir_all(registry.join("history"))?;
    let mut old_names = Vec::new();
    for (seq, file) in [(1, &v1_file), (2, &v2_file)] {
        let bytes = std::fs::read(file)?;
        let crc = sluice::checksum::of_bytes(&bytes);
        std::fs::write(registry.join(format!("components/{crc}.wasm")), &bytes)?;
        let version = format!("vehicle_stats@{crc}");
        let entry =
            Deployment { seq, action: Action::Deploy, version: version.clone(), at_ms: seq, origin: "old".into() };
        std::fs::write(registry.join(format!("history/{seq:010}.json")), serde_json::to_vec_pretty(&entry)?)?;
        old_names.push(version);
    }
    let [v1, v2] = [old_names[0].clone(), old_names[1].clone()];
    let input = dir.join("input.jsonl");
    generate(&input, 20, 2_000, SEED)?;
    let config = paced_job(dir, &input, 100_000, &v1_file, "")?;
    let run = run_ok(sluice().arg("run").arg("--config").arg(&config).env("SLUICE_LOG", "info"))?;
    let log = String::from_utf8_lossy(&run.stderr);
    assert!(log.contains(&format!("running {v2} (registry entry 2)")), "{log}");
    assert!(read_jsonl(&dir.join("out.jsonl"))?.iter().all(|o| o["operator"] == v2.as_str()));
    let on_config = |command: &str, file: Option<&Path>| -> Result<String> {
        let mut call = sluice();
        call.arg(command).arg("vehicle_stats").args(file).arg("--config").arg(&config);
        Ok(String::from_utf8_lossy(&run_ok(&mut call)?.stdout).into_owned())
    };
    assert!(on_config("rollback", None)?.contains(&format!("{v1} recorded as entry 3")));
    assert!(on_config("deploy", Some(&v2_file))?.contains(&format!("{v2} recorded as entry 4")));
    let new_build = dir.join("new.wasm");
    std::fs::write(&new_build, with_custom_section(&std::fs::read(&v2_file)?, &[1; 8]).0)?;
    let deployed = on_config("deploy", Some(&new_build))?;
    let new_version = named_version(&deployed);
    assert!(deployed.contains("recorded as entry 5") && new_version.len() == "vehicle_stats@".len() + 64, "{deployed}");
    let versions = on_config("versions", None)?;
    assert_eq!(versions.lines().count(), 6, "a header and the five entries:\n{versions}");
    Ok(())
}

/// `sluice deploy --config` tries the version out in a directory of its own, made afresh
/// under a random name, and removes it: with links planted at `sluice-deploy-<pid>` (the
/// path it once used) for the next 20,000 process ids, pointing at a directory of the
/// test, nothing is written through them.
#[test]
fn sluice_deploy_tries_a_version_out_in_a_private_directory() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    let (tmp, elsewhere) = (dir.join("tmp"), dir.join("elsewhere"));
    std::fs::create_dir(&tmp)?;
    std::fs::create_dir(&elsewhere)?;
    let input = dir.join("input.jsonl");
    generate(&input, 20, 100, SEED)?;
    let config = paced_job(dir, &input, 100_000, &operator_wasm("vehicle_stats"), "")?;
    let pid = |name: &str| -> Result<u64> {
        Ok(std::fs::read_to_string(format!("/proc/sys/kernel/{name}"))?.trim().parse()?)
    };
    let (last, max) = (pid("ns_last_pid")?, pid("pid_max")?);
    for next in (last + 1..).take(20_000) {
        std::os::unix::fs::symlink(&elsewhere, tmp.join(format!("sluice-deploy-{}", next % max)))?;
    }
    let mut deploy = sluice();
    deploy.env("TMPDIR", &tmp).arg("deploy").arg("vehicle_stats").arg(operator_wasm("vehicle_stats_v2"));
    run_ok(deploy.arg("--config").arg(&config))?;
    let written: Vec<_> = std::fs::read_dir(&elsewhere)?.collect();
    assert!(written.is_empty(), "written through a planted link: {written:?}");
    let left: Vec<_> = std::fs::read_dir(&tmp)?.filter_map(|e| e.ok()).filter(|e| !e.path().is_symlink()).collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    Ok(())
}

/// `component` with a custom section appended (ignored by every WebAssembly tool) whose
/// content ends in `tail`: another build of the same code. Returns it and where `tail` is.
fn with_custom_section(component: &[u8], tail: &[u8; 8]) -> (Vec<u8>, usize) {
    let name = b"sluice-tests";
    let mut built = component.to_vec();
    // Section id 0, its size and its name's (LEB128, each under 128).
    built.extend_from_slice(&[0, (1 + name.len() + tail.len()) as u8, name.len() as u8]);
    built.extend_from_slice(name);
    let at = built.len();
    built.extend_from_slice(tail);
    (built, at)
}

/// `component` made to carry the CRC-64 of `target`: with a custom section whose last
/// 8 bytes are solved for. A CRC is affine in the bits of a message of fixed length, so
/// the bits flipped in those 8 bytes flip the CRC by a linear map, which is invertible.
fn with_crc64_of(component: &[u8], target: &[u8]) -> Vec<u8> {
    let crc = |bytes: &[u8]| u64::from_str_radix(&sluice::checksum::of_bytes(bytes), 16).expect("16 hex digits");
    let (mut forged, at) = with_custom_section(component, &[0; 8]);
    let mut crc_with = |tail: u64| {
        forged[at..].copy_from_slice(&tail.to_le_bytes());
        crc(&forged)
    };
    let base = crc_with(0);
    // A basis by leading bit of the CRC changes, each with the tail bits that make it.
    let mut basis = [(0u64, 0u64); 64];
    for bit in 0..64 {
        let (mut change, mut tail) = (crc_with(1 << bit) ^ base, 1u64 << bit);
        while change != 0 {
            let top = 63 - change.leading_zeros() as usize;
            if basis[top].0 == 0 {
                basis[top] = (change, tail);
                break;
            }
            (change, tail) = (change ^ basis[top].0, tail ^ basis[top].1);
        }
    }
    let (mut wanted, mut tail) = (crc(target) ^ base, 0);
    while wanted != 0 {
        let top = 63 - wanted.leading_zeros() as usize;
        assert_ne!(basis[top].0, 0, "8 bytes reach every CRC-64");
        (wanted, tail) = (wanted ^ basis[top].0, tail ^ basis[top].1);
    }
    crc_with(tail);
    assert_eq!(crc(&forged), crc(target));
    forged
}

#[test]
fn a_deploy_reaches_every_host_of_the_group_through_the_shared_store() -> Result<()> {
    let kafka = KafkaJob::on(KafkaBroker::shared()?).topic("positions", 4).topic("summaries", 2).start()?;
    let (broker, dir) = (&kafka.broker, kafka.dir());
    let (vehicles, total) = (200, 12_000usize);
    let all = kafka.generate("all.jsonl", vehicles, total as u64)?;
    let chunks = split_lines(&all, 3)?;
    // The registry is the job's checkpoint store, which `sluice deploy --config` finds
    // in the same config file the hosts run.
    let config = dir.join("job.toml");
    std::fs::write(
        &config,
        format!(
            "[operator]\npath = {:?}\npoll_versions_s = 0.2\n[source]\nkind = \"kafka\"\nbrokers = \"{}\"\n\
             topic = {:?}\ngroup = {:?}\n[checkpoint]\nstore = {:?}\n",
            operator_wasm("vehicle_stats"),
            broker.bootstrap,
            broker.name("positions"),
            broker.name("swap"),
            dir.join("store")
        ),
    )?;
    let output = broker.output("summaries");
    let host = |name: &str| kafka.host(name, 4, &config, None, &["--output", &output]);
    let minute = Duration::from_secs(60);
    let mut a = host("a")?;
    a.wait_for(RESUMED, 4, minute)?;
    let mut b = host("b")?;
    b.wait_for(RESUMED, 1, minute)?;
    // Every partition a handed over runs on b before any record arrives, so each
    // partition's outputs start with version 1.
    let started = Instant::now();
    while a.log().matches(&handed_over()).count() != b.log().matches(RESUMED).count() {
        assert!(started.elapsed() < minute, "the group did not settle:\n{}\n{}", a.log(), b.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    broker.produce_lines("positions", &chunks[0])?;

    let deployed = std::thread::scope(|scope| -> Result<String> {
        let loader = scope.spawn(|| broker.produce_lines("positions", &chunks[1]));
        let deploy = sluice()
            .arg("deploy")
            .arg("vehicle_stats")
            .arg(operator_wasm("vehicle_stats_v2"))
            .arg("--config")
            .arg(&config)
            .output()?;
        loader.join().expect("the producer thread")?;
        assert!(deploy.status.success(), "{}", String::from_utf8_lossy(&deploy.stderr));
        Ok(String::from_utf8_lossy(&deploy.stdout).into_owned())
    })?;
    let v2 = deployed.split_whitespace().nth(1).context("deploy names the version")?.to_string();
    for host in [&mut a, &mut b] {
        host.wait_for(&format!("deployed {v2} (entry 2)"), 1, Duration::from_secs(30))?;
    }
    broker.produce_lines("positions", &chunks[2])?;
    broker.wait_committed("swap", "positions", total as i64, Duration::from_secs(120))?;
    a.terminate()?;
    b.terminate()?;
    for host in [&a, &b] {
        let switches = host.log().matches(&format!("to {v2} at offset")).count();
        let owned = host.log().matches(RESUMED).count();
        assert!(
            switches >= 1 && switches <= owned,
            "host {} switched its partitions once each:\n{}",
            host.name,
            host.log()
        );
    }

    // Per input partition, outputs in offset order come from version 1, then from
    // version 2; version 2 carried every vehicle's summary on.
    let outputs = broker.read_topic("summaries")?;
    let mut by_partition: BTreeMap<String, BTreeMap<u64, String>> = BTreeMap::new();
    for output in &outputs {
        let offset: u64 = output.headers["sluice-offset"].parse()?;
        let versions = by_partition.entry(output.headers["sluice-partition"].clone()).or_default();
        let version = &output.headers["sluice-operator"];
        let first = versions.entry(offset).or_insert_with(|| version.clone());
        assert_eq!(
            first, version,
            "input {offset} of partition {} was processed by two versions",
            output.headers["sluice-partition"]
        );
    }
    assert_eq!(by_partition.values().map(BTreeMap::len).sum::<usize>(), total, "every input has an output");
    for (partition, versions) in &by_partition {
        let mut runs: Vec<&String> = versions.values().collect();
        runs.dedup();
        assert!(runs.len() == 2 && *runs[1] == v2, "partition {partition}: version 1, then {v2}: {runs:?}");
    }
    let reference = Reference::fold(&all)?;
    let last = outputs.iter().map(|r| (r.key.as_str(), &r.value));
    for output in assert_last_outputs(last, &reference, "last output, by version 2").values() {
        assert!(output.get("idle_count").is_some(), "version 2 wrote the last output: {output}");
    }
    Ok(())
}

/// A switch is made whatever the store does and recorded once it can be: with
/// partition 0's switch log unwritable for a while (its folder a file), every partition
/// still goes from v1 to v2 — none is pinned to v1 — and partition 0's log names v2
/// once the folder is back. A partition whose claim another host took records nothing:
/// a host that lost a partition writes no switch of it.
#[test]
fn a_switch_is_recorded_once_the_store_lets_it_and_never_by_a_host_that_lost_its_partition() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    let PacedJob { mut host, admin, .. } =
        PacedJob::start(dir, (100, 24_000), 3_000, &operator_wasm("vehicle_stats"), "")?;
    std::thread::sleep(Duration::from_millis(1500));
    let switches = dir.join("state.checkpoints/operators/vehicle_stats/switches");
    let (broken, aside) = (switches.join("partition-0000"), dir.join("partition-0000.aside"));
    std::fs::rename(&broken, &aside)?;
    std::fs::write(&broken, b"")?;
    let claim = dir.join("state.checkpoints/partition-0001/claim.json");
    std::fs::write(&claim, r#"{"host": "intruder", "claimed_at_ms": 1}"#)?;
    let deployed = sluice()
        .args(["deploy", "vehicle_stats"])
        .arg(operator_wasm("vehicle_stats_v2"))
        .args(["--admin", &admin])
        .output()?;
    let v2 = named_version(&String::from_utf8_lossy(&deployed.stdout));
    std::thread::sleep(Duration::from_secs(1));
    std::fs::remove_file(&broken)?;
    std::fs::rename(&aside, &broken)?;
    host.wait_exit(Duration::from_secs(60))?;
    let log = host.log();
    let names = |partition: u32| -> Result<Vec<String>> {
        let folder = switches.join(format!("partition-{partition:04}"));
        let records = std::fs::read_dir(&folder).with_context(|| format!("listing {}", folder.display()))?;
        records.flatten().map(|r| Ok(std::fs::read_to_string(r.path())?)).collect()
    };
    let runs = version_runs(&read_jsonl(&dir.join("out.jsonl"))?);
    for partition in [0, 2, 3] {
        assert_eq!(runs[&partition].len(), 2, "partition {partition} went from v1 to v2: {runs:?}\n{log}");
        assert_eq!(runs[&partition][1], v2, "{runs:?}");
        assert!(
            names(partition as u32)?.iter().any(|r| r.contains(&v2)),
            "partition {partition}'s log names v2\n{log}"
        );
    }
    assert!(!names(1)?.iter().any(|r| r.contains(&v2)), "the lost partition recorded no switch:\n{log}");
    Ok(())
}

/// Switch records do not pile up: with two checkpoints retained, a deploy, a rollback
/// and a deploy again leave each partition at most the records its oldest retained
/// checkpoint needs — never the first one, at offset 0. And one record that is not one
/// costs its partition only: a host started over it stops that partition, named, and
/// runs the others.
#[test]
fn switch_records_are_pruned_to_what_checkpoints_need_and_a_bad_one_costs_its_partition_only() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    let more = "[checkpoint]\ninterval = \"300ms\"\nretain = 2\n";
    let PacedJob { config, mut host, admin, .. } =
        PacedJob::start(dir, (100, 24_000), 3_000, &operator_wasm("vehicle_stats"), more)?;
    let v2 = operator_wasm("vehicle_stats_v2");
    let deploy = || run_ok(sluice().args(["deploy", "vehicle_stats"]).arg(&v2).args(["--admin", &admin]));
    std::thread::sleep(Duration::from_secs(1));
    deploy()?;
    std::thread::sleep(Duration::from_millis(1500));
    run_ok(sluice().args(["rollback", "vehicle_stats", "--admin", &admin]))?;
    std::thread::sleep(Duration::from_millis(1500));
    deploy()?;
    host.wait_exit(Duration::from_secs(60))?;
    let switches = dir.join("state.checkpoints/operators/vehicle_stats/switches");
    let records = |partition: u32| -> Result<Vec<PathBuf>> {
        let folder = switches.join(format!("partition-{partition:04}"));
        let mut records: Vec<PathBuf> = std::fs::read_dir(folder)?.flatten().map(|r| r.path()).collect();
        records.sort();
        Ok(records)
    };
    for partition in 0..4 {
        let kept = records(partition)?;
        let first = switches.join(format!("partition-{partition:04}/00000000000000000000.json"));
        assert!(kept.len() <= 2 && !kept.contains(&first), "partition {partition} keeps {kept:?}");
    }

    let newest = records(1)?.pop().context("partition 1 has a switch record")?;
    std::fs::write(&newest, "{")?;
    let again = run_err(sluice().arg("run").arg("--config").arg(&config))?;
    assert!(again.contains("partition 1's switch log cannot be used"), "{again}");
    assert!(again.contains(&newest.file_name().unwrap().to_string_lossy().to_string()), "{again}");
    assert!(again.contains("stopped alone") || again.contains("stops here"), "{again}");
    Ok(())
}
