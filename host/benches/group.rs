//! Rebalances end to end on Apache Kafka: three hosts of one group lose one to `kill -9`,
//! lose one gracefully, or gain a fourth, while records keep arriving — sluice's hosts,
//! and beside them the system a platform team would otherwise pick, Kafka Streams, on
//! the same broker, the same records and the same per-vehicle aggregate
//! (`kafka-streams/VehicleStats.java`).
//!
//! Each run: a topic of six partitions filled with `SLUICE_BENCH_GROUP_RECORDS`
//! (default 200,000) generator records over `SLUICE_BENCH_GROUP_VEHICLES` (default
//! 50,000) vehicles; three members started and waited for until the group's committed
//! offsets cover every record and the group has been quiet for 10 s; then records
//! produced at 2,000 a second throughout, and the event. What is timed, per partition that
//! moved: from the event (the signal sent, or the fourth member's process started, so a
//! scale-out counts the new member's start-up and join) to the moment its new owner
//! resumed it (sluice logs `resumed at offset`, with the path its state came from) or
//! processed its first record (Kafka Streams: the application prints it). The
//! group's session timeout is 6 s in both systems (classic protocol), and a `kill -9`
//! pause includes it: the table gives it apart. Rebalances: the most any member went
//! through after the event (sluice: generations it was assigned in; Kafka Streams: its
//! moves to `REBALANCING`).
//!
//! sluice checkpoints every 5 s to an S3 store (`s3s-fs`) read at 100 MiB/s at most, with
//! `standby` as the row says; Kafka Streams keeps RocksDB stores with changelog topics on
//! the broker, `num.standby.replicas` as the row says. Kafka Streams' rows need
//! `SLUICE_BENCH_KAFKA_STREAMS` (the directory `./dev.sh bench` builds it into); the
//! sluice binary is `SLUICE_BIN` (`./dev.sh bench` passes the release build).

use anyhow::{Context, Result, bail};
use sluice::source::generator::{Fleet, FleetOptions};
use sluice_e2e::{Host, KafkaBroker, S3Server, bench_setting, operator_wasm, sluice};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const PARTITIONS: i32 = 6;
const SESSION_TIMEOUT: Duration = Duration::from_secs(6);
/// Records a second produced while a scenario runs.
const STEADY_RATE: u64 = 2_000;
/// How long a group must stay quiet (no partition resuming) before a scenario is over.
const SETTLED: Duration = Duration::from_secs(10);
/// How long a scenario waits for a first partition to move before it counts none.
const NONE_MOVED: Duration = Duration::from_secs(60);

/// Who runs the group.
#[derive(Clone, Copy)]
enum System {
    /// `sluice run` hosts with `[checkpoint] standby` so.
    Sluice { standby: &'static str },
    /// Kafka Streams instances with `num.standby.replicas` so.
    Streams { standbys: u32 },
}

impl System {
    fn label(&self) -> String {
        match self {
            System::Sluice { standby } => format!("sluice, standby = {standby}"),
            System::Streams { standbys } => format!("Kafka Streams, num.standby.replicas = {standbys}"),
        }
    }
}

/// What happens to the group.
#[derive(Clone, Copy, Debug)]
enum Scenario {
    /// `kill -9` of one member.
    Kill,
    /// SIGTERM of one member, which leaves the group.
    ScaleIn,
    /// A fourth member joins.
    ScaleOut,
}

/// A partition resumed by a member at `at` (ms since the epoch), its state from `path`
/// (sluice: `standby`, `incremental`, `full`, `local`, `empty`; Kafka Streams:
/// `changelog`), having restored `restored` (sluice: bytes fetched from the store; Kafka
/// Streams: changelog records).
#[derive(Debug)]
struct Resume {
    partition: u32,
    at: u64,
    path: String,
    restored: u64,
}

fn main() -> Result<()> {
    let records: u64 = bench_setting("SLUICE_BENCH_GROUP_RECORDS", 200_000)?;
    let vehicles: u32 = bench_setting("SLUICE_BENCH_GROUP_VEHICLES", 50_000)?;
    let streams = std::env::var_os("SLUICE_BENCH_KAFKA_STREAMS").map(PathBuf::from);
    let broker = KafkaBroker::start()?;
    let store = S3Server::start()?;
    let mut systems =
        vec![System::Sluice { standby: "all" }, System::Sluice { standby: "1" }, System::Sluice { standby: "none" }];
    match &streams {
        Some(_) => systems.extend([System::Streams { standbys: 1 }, System::Streams { standbys: 0 }]),
        None => println!("Kafka Streams rows skipped: SLUICE_BENCH_KAFKA_STREAMS is not set (./dev.sh bench sets it)"),
    }
    println!(
        "{records} records over {vehicles} vehicles in {PARTITIONS} partitions, three members, {STEADY_RATE} \
         records/s during each scenario, session timeout {}s",
        SESSION_TIMEOUT.as_secs()
    );
    println!(
        "| system | scenario | partitions moved | longest pause | median pause | of which session timeout | paths | \
         restored | rebalances |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut run = 0;
    for scenario in [Scenario::Kill, Scenario::ScaleIn, Scenario::ScaleOut] {
        for &system in &systems {
            run += 1;
            let group = Group { broker: &broker, store: &store, streams: streams.as_deref(), system, run };
            group.measure(scenario, records, vehicles)?;
        }
    }
    Ok(())
}

/// One run of one scenario for one system, on topics and a group of its own.
struct Group<'a> {
    broker: &'a KafkaBroker,
    store: &'a S3Server,
    streams: Option<&'a Path>,
    system: System,
    run: u32,
}

impl Group<'_> {
    fn topic(&self) -> String {
        format!("positions-{}", self.run)
    }

    fn group(&self) -> String {
        format!("group-{}", self.run)
    }

    fn measure(&self, scenario: Scenario, records: u64, vehicles: u32) -> Result<()> {
        let dir = tempfile::tempdir()?;
        let topic = self.topic();
        self.broker.create_topic(&topic, PARTITIONS)?;
        self.broker.create_topic(&format!("summaries-{}", self.run), PARTITIONS)?;
        let fleet = Fleet::new(&FleetOptions { vehicles, count: Some(records), seed: 42, churn: None });
        self.broker.produce(&topic, fleet.map(|record| record.map(|r| (r.key, r.value))))?;
        let mut members = Vec::new();
        for name in ["a", "b", "c"] {
            members.push(self.start(name, dir.path())?);
        }
        // Every member runs partitions, and the group has been quiet since. A sluice host
        // can fail at its start when three write their component to a new store's
        // registry at once (s3s-fs breaks a connection, and the start does not try that
        // write again yet; see docs/benchmarks.md): it is said and started again, outside
        // the measured window.
        let started = Instant::now();
        while members.iter().any(|m| self.resumes(&m.log()).is_empty()) {
            if started.elapsed() > Duration::from_secs(120) {
                bail!("a member runs no partition after 120 s:\n{}", logs(&members));
            }
            for member in &mut members {
                if let Ok(status) = member.wait_exit(Duration::ZERO) {
                    println!("member {} exited ({status}) before it ran a partition: started again", member.name);
                    *member = self.start(&member.name.clone(), dir.path())?;
                }
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        self.wait_settled(&members, &|_| 0, 0)?;
        self.broker
            .wait_committed(&self.group(), &topic, records as i64, Duration::from_secs(600))
            .with_context(|| logs(&members))?;
        let stop = AtomicBool::new(false);
        std::thread::scope(|scope| -> Result<()> {
            let steady = scope.spawn(|| self.produce_steadily(&stop, vehicles));
            // The producer stops however the scenario ends: the scope waits for it.
            let mut run_event = || -> Result<()> {
                std::thread::sleep(Duration::from_secs(2));
                let logged: Vec<usize> = members.iter().map(|m| m.log().len()).collect();
                let event = now_ms();
                match scenario {
                    Scenario::Kill => members[2].kill_9()?,
                    Scenario::ScaleIn => members[2].terminate()?,
                    Scenario::ScaleOut => members.push(self.start("d", dir.path())?),
                }
                let survivors = match scenario {
                    Scenario::Kill | Scenario::ScaleIn => &members[..2],
                    Scenario::ScaleOut => &members[..],
                };
                let since = |i: usize| logged.get(i).copied().unwrap_or(0);
                let resumes = self.wait_settled(survivors, &since, event)?;
                self.report(scenario, &resumes, event, survivors, &since);
                Ok(())
            };
            let measured = run_event();
            stop.store(true, Ordering::Relaxed);
            steady.join().expect("the producer thread")?;
            measured
        })?;
        for member in &mut members {
            // One already stopped, or a JVM that takes its time to close, is no failure here.
            member.terminate().ok();
        }
        Ok(())
    }

    /// Starts member `name` with its state in `dir/name`.
    fn start(&self, name: &str, dir: &Path) -> Result<Host> {
        let home = dir.join(name);
        std::fs::create_dir_all(&home)?;
        let log = home.join("log");
        match self.system {
            System::Sluice { standby } => {
                let config = home.join("job.toml");
                std::fs::write(&config, self.sluice_config(standby, &home))?;
                let mut command = sluice();
                command.arg("run").arg("--config").arg(&config);
                Host::spawn(name, self.store.configure(&mut command), &log)
            }
            System::Streams { standbys } => {
                let streams = self.streams.context("no Kafka Streams build")?;
                let classpath = format!("{}:{}/*", streams.join("classes").display(), streams.join("libs").display());
                let mut command = Command::new("java");
                command
                    .arg("-Dorg.slf4j.simpleLogger.defaultLogLevel=warn")
                    .arg("-cp")
                    .arg(classpath)
                    .arg("VehicleStats")
                    .args([&self.broker.bootstrap, &self.group(), &self.topic(), &format!("summaries-{}", self.run)])
                    .arg(home.join("state"))
                    .args([standbys.to_string(), "at_least_once".into(), SESSION_TIMEOUT.as_millis().to_string()]);
                Host::spawn(name, &mut command, &log)
            }
        }
    }

    fn sluice_config(&self, standby: &str, home: &Path) -> String {
        let standby = if standby == "none" || standby == "all" { format!("{standby:?}") } else { standby.into() };
        format!(
            "[operator]\npath = {:?}\n[source]\nkind = \"kafka\"\nbrokers = \"{}\"\ntopic = \"{}\"\ngroup = \"{}\"\n\
             group_protocol = \"classic\"\n[source.properties]\n\"session.timeout.ms\" = \"{}\"\n\
             \"heartbeat.interval.ms\" = \"500\"\n[sink]\nkind = \"kafka\"\nbrokers = \"{}\"\ntopic = \"summaries-{}\"\n\
             [state]\ndir = {:?}\npartitions = {PARTITIONS}\n[checkpoint]\nstore = \"s3://sluice/run-{}\"\n\
             interval = \"5s\"\ndownload_bytes_per_s = {}\nstandby = {standby}\nstandby_poll = \"1s\"\n\
             [dead_letter]\npath = {:?}\n[report]\ninterval_s = 0\n",
            operator_wasm("vehicle_stats"),
            self.broker.bootstrap,
            self.topic(),
            self.group(),
            SESSION_TIMEOUT.as_millis(),
            self.broker.bootstrap,
            self.run,
            home.join("state"),
            self.run,
            100 << 20,
            home.join("dead.jsonl"),
        )
    }

    /// Produces records to the topic at [`STEADY_RATE`] until `stop`.
    fn produce_steadily(&self, stop: &AtomicBool, vehicles: u32) -> Result<usize> {
        let fleet = Fleet::new(&FleetOptions { vehicles, count: None, seed: 7, churn: None });
        let started = Instant::now();
        let paced = fleet.enumerate().map_while(|(i, record)| {
            if stop.load(Ordering::Relaxed) {
                return None;
            }
            let due = Duration::from_secs_f64(i as f64 / STEADY_RATE as f64);
            std::thread::sleep(due.saturating_sub(started.elapsed()));
            Some(record.map(|r| (r.key, r.value)))
        });
        self.broker.produce(&self.topic(), paced)
    }

    /// Waits until no partition has resumed for [`SETTLED`] and at least one has since
    /// the event, or none has in [`NONE_MOVED`]; returns every resume since.
    fn wait_settled(&self, members: &[Host], since: &dyn Fn(usize) -> usize, event: u64) -> Result<Vec<Resume>> {
        let started = Instant::now();
        loop {
            let resumes: Vec<Resume> = members
                .iter()
                .enumerate()
                .flat_map(|(i, m)| self.resumes(&m.log()[since(i).min(m.log().len())..]))
                .filter(|r| r.at >= event)
                .collect();
            let last = resumes.iter().map(|r| r.at).max();
            if last.is_some_and(|last| now_ms().saturating_sub(last) >= SETTLED.as_millis() as u64) {
                return Ok(resumes);
            }
            // Kafka Streams gives a member that joins warm-up tasks first, and their active
            // tasks only at a probing rebalance (`probing.rebalance.interval.ms`, 10 min).
            if event > 0 && resumes.is_empty() && started.elapsed() > NONE_MOVED {
                return Ok(resumes);
            }
            if started.elapsed() > Duration::from_secs(300) {
                bail!("the group did not settle in 300 s: {resumes:?}\n{}", logs(members));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The resumes `log` tells of.
    fn resumes(&self, log: &str) -> Vec<Resume> {
        match self.system {
            System::Sluice { .. } => log
                .lines()
                .filter(|line| line.contains("resumed at offset"))
                .filter_map(|line| {
                    let at = humantime::parse_rfc3339(line.split_whitespace().next()?).ok()?;
                    let partition = line.rsplit("partition=").next()?.trim().parse().ok()?;
                    // `checkpoint 2@76064 (standby: fetched 0 B of 583129 B)`, `local@N` or `empty`.
                    let from = line.split("state from ").nth(1)?;
                    let (path, fetched) = match from.split_once(" (") {
                        Some((checkpoint, rest)) if checkpoint.starts_with("checkpoint") => {
                            let (path, rest) = rest.split_once(": fetched ")?;
                            (path, rest.split(' ').next()?.parse().ok()?)
                        }
                        _ => (from.split(['@', ',', ')']).next()?, 0),
                    };
                    Some(Resume { partition, at: ms(at), path: path.to_string(), restored: fetched })
                })
                .collect(),
            System::Streams { .. } => events(log, "first", "at")
                .into_iter()
                .map(|(partition, at)| {
                    let restored = events(log, "restored", "records");
                    let restored = restored.iter().filter(|(p, _)| *p == partition).map(|(_, n)| n).sum();
                    Resume { partition, at, path: "changelog".into(), restored }
                })
                .collect(),
        }
    }

    /// Prints the scenario's row.
    fn report(
        &self,
        scenario: Scenario,
        resumes: &[Resume],
        event: u64,
        members: &[Host],
        since: &dyn Fn(usize) -> usize,
    ) {
        // A partition's pause ends at its first resume after the event.
        let mut first: BTreeMap<u32, &Resume> = BTreeMap::new();
        for resume in resumes {
            first
                .entry(resume.partition)
                .and_modify(|r| {
                    if resume.at < r.at {
                        *r = resume
                    }
                })
                .or_insert(resume);
        }
        let mut pauses: Vec<f64> = first.values().map(|r| (r.at - event) as f64 / 1e3).collect();
        pauses.sort_by(f64::total_cmp);
        let mut paths: BTreeMap<&str, usize> = BTreeMap::new();
        for resume in first.values() {
            *paths.entry(&resume.path).or_default() += 1;
        }
        let paths: Vec<String> = paths.iter().map(|(path, n)| format!("{n} {path}")).collect();
        let restored: u64 = first.values().map(|r| r.restored).sum();
        let restored = match self.system {
            System::Sluice { .. } => format!("{:.1} MiB", restored as f64 / (1 << 20) as f64),
            System::Streams { .. } => format!("{restored} records"),
        };
        let rebalances = members
            .iter()
            .enumerate()
            .map(|(i, m)| self.rebalances(&m.log()[since(i).min(m.log().len())..]))
            .max()
            .unwrap_or(0);
        let session = matches!(scenario, Scenario::Kill).then_some(SESSION_TIMEOUT.as_secs_f64()).unwrap_or(0.0);
        println!(
            "| {} | {scenario:?} | {} | {:.2} s | {:.2} s | {session:.0} s | {} | {restored} | {rebalances} |",
            self.system.label(),
            pauses.len(),
            pauses.last().copied().unwrap_or(0.0),
            pauses.get(pauses.len() / 2).copied().unwrap_or(0.0),
            paths.join(", ")
        );
    }

    /// How many rebalances `log` tells of.
    fn rebalances(&self, log: &str) -> usize {
        match self.system {
            System::Sluice { .. } => log
                .lines()
                .filter_map(|line| line.split("(generation ").nth(1)?.split(')').next().map(str::to_string))
                .collect::<BTreeSet<_>>()
                .len(),
            System::Streams { .. } => log.lines().filter(|l| l.contains("\"to\":\"REBALANCING\"")).count(),
        }
    }
}

/// The partition and `field` of each Kafka Streams event named `name` in `log`.
fn events(log: &str, name: &str, field: &str) -> Vec<(u32, u64)> {
    let tag = format!("{{\"event\":\"{name}\"");
    log.lines()
        .filter(|line| line.starts_with(&tag))
        .filter_map(|line| {
            let event: serde_json::Value = serde_json::from_str(line).ok()?;
            Some((event["partition"].as_u64()? as u32, event[field].as_u64()?))
        })
        .collect()
}

fn logs(members: &[Host]) -> String {
    members.iter().map(|m| format!("--- {}:\n{}", m.name, m.log())).collect()
}

fn ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn now_ms() -> u64 {
    ms(SystemTime::now())
}
