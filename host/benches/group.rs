//! Rebalances end to end on Apache Kafka: three hosts of one group lose one to `kill -9`,
//! lose one gracefully, gain a fourth, or are restarted one after another, while records
//! keep arriving — sluice's hosts, and beside them the system a platform team would
//! otherwise pick, Kafka Streams, on the same broker, the same records and the same
//! per-vehicle aggregate (`kafka-streams/VehicleStats.java`); and the feedback loop, one
//! key whose records take longer than `max.poll.interval.ms`, for five minutes.
//!
//! Each run has a topic of six partitions of its own, filled with one position per vehicle,
//! each carrying a note of 4,096 characters of random text that the aggregate keeps (the
//! latest per vehicle): `SLUICE_BENCH_GROUP_STATE_MB` (default `100`; a comma-separated
//! list) says how much state that makes in all. Three members start and are waited for
//! until the group's committed offsets cover every record and no partition has moved for
//! 10 s; then positions (with notes) are produced at 500 a second throughout (2 MiB of
//! state rewritten a second), and after 30 s and 30 s a GiB of state (for checkpoints and
//! copies to catch up with the burst that filled it), the event. Per partition move, what is timed is its pause: from the moment it stopped —
//! its old owner's revocation began (sluice: the revocation it logs; Kafka Streams: the
//! task's close), else the event (a `kill -9`) — to the moment its new owner resumed it
//! (sluice logs `resumed at offset`, with the path its state came from) or processed its
//! first record (Kafka Streams, which the application prints); for sluice, the part of the
//! longest pause that ran on its new owner, from its assignment, is given apart (the rest is
//! the handover and the group's rebalance). The group's session
//! timeout is 6 s in both systems (classic protocol): a `kill -9` pause includes it, and
//! the table gives it apart. Rebalances: the most any member went through after the
//! event (sluice: generations it was assigned in; Kafka Streams: its moves to
//! `REBALANCING`). Outputs repeated: once every record is committed, the outputs the
//! output topic holds (`read_committed`) beyond one per record produced — records whose
//! output a consumer sees twice (both systems send one per record: Kafka Streams' record
//! cache is off). What the group cost its members while records arrived before the event:
//! sluice's downloads for standby copies (a member's, the mean) and its checkpoints' uploads
//! (the group's), per hour, from the hosts' metrics; the disk each member's state directory
//! took at the event (`du`, the mean), in both systems.
//!
//! The scenarios (`SLUICE_BENCH_GROUP_SCENARIOS`, default all): `kill` (`kill -9` of one
//! member), `scale-in` (SIGTERM of one, which leaves the group), `scale-out` (a fourth
//! joins), `rolling` (each member in turn stopped with SIGTERM and started again at once
//! with its state directory, the next once the group is quiet: a deploy), and `slow-key`
//! (no state filled; one key's record every 20 s takes 12 s to process, while
//! `max.poll.interval.ms` is 10 s, for `SLUICE_BENCH_GROUP_SLOW_S`, default 300 s; sluice
//! runs the tests' probe operator, whose `spin` runs into a CPU deadline of 12 s, the record
//! then dead-lettered, Kafka Streams sleeps 12 s in its fold).
//!
//! The systems (`SLUICE_BENCH_GROUP_SYSTEMS`, default all): `sluice-all`, `sluice-1`,
//! `sluice-none` (`[checkpoint] standby`), `sluice-1-eos` (with `[sink] guarantee =
//! "exactly-once"`); `streams-1`, `streams-0` (`num.standby.replicas`), `streams-1-eos`
//! (`exactly_once_v2`). sluice checkpoints every 5 s to an S3 store (`s3s-fs`) read at
//! 100 MiB/s at most; Kafka Streams keeps RocksDB stores with changelog topics on the
//! broker. Kafka Streams' systems need `SLUICE_BENCH_KAFKA_STREAMS` (the directory
//! `./dev.sh bench` builds it into); the sluice binary is `SLUICE_BIN` (`./dev.sh bench`
//! passes the release build).

use anyhow::{Context, Result, bail};
use sluice::metrics::families::{CHECKPOINT_UPLOADED_BYTES, STANDBY_FETCHED};
use sluice::source::generator::{Fleet, FleetOptions};
use sluice_e2e::{Host, KafkaBroker, S3Server, bench_setting, metric_sum, operator_wasm, sluice};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const PARTITIONS: i32 = 6;
const SESSION_TIMEOUT: Duration = Duration::from_secs(6);
/// Records a second produced while a scenario runs.
const STEADY_RATE: u64 = 500;
/// How long a group must stay quiet (no partition resuming) before a scenario is over.
const SETTLED: Duration = Duration::from_secs(10);
/// How long a scenario waits for a first partition to move before it counts none.
const NONE_MOVED: Duration = Duration::from_secs(60);
/// Characters of random text in each position's note: what the state is made of.
const NOTE_CHARS: usize = 4096;
/// What a summary holds besides its note, about.
const SUMMARY_BYTES: u64 = 250;
/// The feedback loop: `max.poll.interval.ms` of both systems, ...
const MAX_POLL_INTERVAL: Duration = Duration::from_secs(10);
/// ... how long a slow record takes, ...
const SLOW_RECORD: Duration = Duration::from_secs(12);
/// ... and how often one comes.
const SLOW_EVERY: Duration = Duration::from_secs(20);
/// The feedback loop's vehicles (its state is not what it measures).
const SLOW_KEY_VEHICLES: u32 = 10_000;
const SYSTEMS: &str = "sluice-all,sluice-1,sluice-none,sluice-1-eos,streams-1,streams-0,streams-1-eos";
const SCENARIOS: &str = "kill,scale-in,scale-out,rolling,slow-key";

/// Who runs the group.
#[derive(Clone, Copy)]
enum System {
    /// `sluice run` hosts with `[checkpoint] standby` so.
    Sluice { standby: &'static str, exactly_once: bool },
    /// Kafka Streams instances with `num.standby.replicas` so.
    Streams { standbys: u32, exactly_once: bool },
}

impl System {
    fn parse(name: &str) -> Result<Self> {
        Ok(match name.trim() {
            "sluice-all" => System::Sluice { standby: "all", exactly_once: false },
            "sluice-1" => System::Sluice { standby: "1", exactly_once: false },
            "sluice-none" => System::Sluice { standby: "none", exactly_once: false },
            "sluice-1-eos" => System::Sluice { standby: "1", exactly_once: true },
            "streams-1" => System::Streams { standbys: 1, exactly_once: false },
            "streams-0" => System::Streams { standbys: 0, exactly_once: false },
            "streams-1-eos" => System::Streams { standbys: 1, exactly_once: true },
            other => bail!("SLUICE_BENCH_GROUP_SYSTEMS: no system {other:?} (known: {SYSTEMS})"),
        })
    }

    fn label(&self) -> String {
        let (name, exactly_once) = match self {
            System::Sluice { standby, exactly_once } => (format!("sluice, standby = {standby}"), exactly_once),
            System::Streams { standbys, exactly_once } => {
                (format!("Kafka Streams, num.standby.replicas = {standbys}"), exactly_once)
            }
        };
        if *exactly_once { format!("{name}, exactly-once") } else { name }
    }

    fn exactly_once(&self) -> bool {
        matches!(self, System::Sluice { exactly_once: true, .. } | System::Streams { exactly_once: true, .. })
    }
}

/// What happens to the group.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Scenario {
    /// `kill -9` of one member.
    Kill,
    /// SIGTERM of one member, which leaves the group.
    ScaleIn,
    /// A fourth member joins.
    ScaleOut,
    /// Each member stopped with SIGTERM and started again, in turn.
    Rolling,
    /// One key's records take longer than `max.poll.interval.ms`.
    SlowKey,
}

impl Scenario {
    fn parse(name: &str) -> Result<Self> {
        Ok(match name.trim() {
            "kill" => Scenario::Kill,
            "scale-in" => Scenario::ScaleIn,
            "scale-out" => Scenario::ScaleOut,
            "rolling" => Scenario::Rolling,
            "slow-key" => Scenario::SlowKey,
            other => bail!("SLUICE_BENCH_GROUP_SCENARIOS: no scenario {other:?} (known: {SCENARIOS})"),
        })
    }
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
    /// sluice: how long the new owner held the partition paused, from its assignment.
    paused_here: Option<f64>,
}

/// A partition a member stopped processing at `at`.
struct Stop {
    partition: u32,
    at: u64,
}

/// What keeping the group running cost its members over the steady records before the
/// event.
struct Upkeep {
    /// sluice: bytes downloaded for standby copies an hour, the mean of the members.
    fetched: Option<f64>,
    /// sluice: bytes the group's checkpoints uploaded an hour.
    uploaded: Option<f64>,
    /// The disk a member's state directory took at the event, the mean of the members.
    disk: f64,
}

/// One event of a scenario: when, and how much of each member's log came before it.
struct Step {
    event: u64,
    logged: Vec<usize>,
}

fn main() -> Result<()> {
    let sizes: String = bench_setting("SLUICE_BENCH_GROUP_STATE_MB", "100".to_string())?;
    let systems: String = bench_setting("SLUICE_BENCH_GROUP_SYSTEMS", SYSTEMS.to_string())?;
    let scenarios: String = bench_setting("SLUICE_BENCH_GROUP_SCENARIOS", SCENARIOS.to_string())?;
    let slow_for = Duration::from_secs(bench_setting("SLUICE_BENCH_GROUP_SLOW_S", 300)?);
    let streams = std::env::var_os("SLUICE_BENCH_KAFKA_STREAMS").map(PathBuf::from);
    let mut systems: Vec<System> = systems.split(',').map(System::parse).collect::<Result<_>>()?;
    if streams.is_none() {
        println!("Kafka Streams rows skipped: SLUICE_BENCH_KAFKA_STREAMS is not set (./dev.sh bench sets it)");
        systems.retain(|s| matches!(s, System::Sluice { .. }));
    }
    let scenarios: Vec<Scenario> = scenarios.split(',').map(Scenario::parse).collect::<Result<_>>()?;
    let broker = KafkaBroker::start()?;
    let store = S3Server::start()?;
    println!(
        "three members, {PARTITIONS} partitions, {STEADY_RATE} records/s during each scenario, session timeout {}s; \
         notes of {NOTE_CHARS} characters of random text",
        SESSION_TIMEOUT.as_secs()
    );
    println!(
        "| state | system | scenario | moves | longest pause | its new owner's part | median pause | of which session \
         timeout | paths | restored | rebalances | outputs repeated | copies fetched a member | checkpoints uploaded | \
         disk a member |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut run = 0;
    let mut each = |state_mb: u64, scenario: Scenario| -> Result<()> {
        for &system in &systems {
            run += 1;
            let group = Group { broker: &broker, store: &store, streams: streams.as_deref(), system, run };
            group.measure(scenario, state_mb, slow_for)?;
        }
        Ok(())
    };
    for size in sizes.split(',') {
        let state_mb: u64 = size.trim().parse().with_context(|| format!("SLUICE_BENCH_GROUP_STATE_MB: {size:?}"))?;
        for &scenario in scenarios.iter().filter(|&&s| s != Scenario::SlowKey) {
            each(state_mb, scenario)?;
        }
    }
    if scenarios.contains(&Scenario::SlowKey) {
        each(0, Scenario::SlowKey)?;
    }
    Ok(())
}

/// One run of one scenario for one system, on topics, a group and a store of its own.
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

    fn output(&self) -> String {
        format!("summaries-{}", self.run)
    }

    fn group(&self) -> String {
        format!("group-{}", self.run)
    }

    fn measure(&self, scenario: Scenario, state_mb: u64, slow_for: Duration) -> Result<()> {
        let dir = tempfile::tempdir()?;
        let topic = self.topic();
        self.broker.create_topic(&topic, PARTITIONS)?;
        self.broker.create_topic(&self.output(), PARTITIONS)?;
        // Every vehicle's first position, with a note; or for the feedback loop positions
        // the probe counts, for every member to have records to run.
        let (vehicles, filled) = match scenario {
            Scenario::SlowKey => {
                let fleet = Fleet::new(&FleetOptions {
                    vehicles: SLOW_KEY_VEHICLES,
                    count: Some(10_000),
                    seed: 3,
                    churn: None,
                });
                let counted = fleet.map(|record| {
                    let r = record?;
                    let position = String::from_utf8(r.value)?;
                    Ok((r.key, counted_position(&position)?))
                });
                (SLOW_KEY_VEHICLES, self.broker.produce(&topic, counted)?)
            }
            _ => {
                let vehicles = ((state_mb << 20) / (NOTE_CHARS as u64 + SUMMARY_BYTES)).max(1) as u32;
                (vehicles, self.broker.produce(&topic, (0..vehicles).map(|v| Ok(noted_position(v))))?)
            }
        };
        let filled = filled as u64;
        let mut members = Vec::new();
        for name in ["a", "b", "c"] {
            members.push(self.start(name, dir.path(), scenario)?);
        }
        // Every member runs partitions, and the group has been quiet since.
        let started = Instant::now();
        while members.iter().any(|m| self.resumes(&m.log(), 0).is_empty()) {
            if started.elapsed() > Duration::from_secs(600) {
                bail!("a member runs no partition after 600 s:\n{}", logs(&members));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let at_start = Step { event: 0, logged: vec![0; 3] };
        self.wait_settled(&members, &at_start)?;
        self.broker
            .wait_committed(&self.group(), &topic, filled as i64, Duration::from_secs(1200))
            .with_context(|| logs(&members))?;
        let stop = AtomicBool::new(false);
        let ((steps, upkeep), steady) = std::thread::scope(|scope| -> Result<((Vec<Step>, Upkeep), u64)> {
            let steady = scope.spawn(|| self.produce_steadily(&stop, vehicles, scenario));
            // The producer stops however the scenario ends: the scope waits for it.
            let steps = self.run_scenario(scenario, &mut members, dir.path(), (warm_up(state_mb), slow_for));
            stop.store(true, Ordering::Relaxed);
            let produced = steady.join().expect("the producer thread")?;
            Ok((steps?, produced as u64))
        })?;
        let produced = filled + steady;
        // A group caught in the feedback loop may never commit the slow key's record.
        let drained = match scenario {
            Scenario::SlowKey => Duration::from_secs(120),
            _ => Duration::from_secs(1200),
        };
        let repeated = match self.broker.wait_committed(&self.group(), &topic, produced as i64, drained) {
            Ok(()) => {
                let outputs = if self.system.exactly_once() {
                    self.broker.count_records(&self.output())?
                } else {
                    self.broker.ends(&self.output())?.values().map(|&end| end as u64).sum()
                };
                // A record sluice dead-letters (the slow key's) has no output.
                let dead: usize = members
                    .iter()
                    .map(|m| std::fs::read_to_string(dir.path().join(&m.name).join("dead.jsonl")).unwrap_or_default())
                    .map(|dead| dead.lines().count())
                    .sum();
                (outputs as i64 + dead as i64 - produced as i64).to_string()
            }
            Err(_) if scenario == Scenario::SlowKey => format!("not all committed {} s after", drained.as_secs()),
            Err(e) => return Err(e.context(logs(&members))),
        };
        let state = match scenario {
            Scenario::SlowKey => "-".to_string(),
            _ => format!("{:.2} GiB", vehicles as f64 * (NOTE_CHARS as u64 + SUMMARY_BYTES) as f64 / (1 << 30) as f64),
        };
        self.report(&state, scenario, &members, (&steps, &upkeep), &repeated);
        for member in &mut members {
            // One already stopped, or a JVM that takes its time to close, is no failure here.
            member.terminate().ok();
        }
        self.remove_data()
    }

    /// Runs `scenario` on the settled group, after `warm` of steady records; returns its
    /// steps, and what the group cost its members during `warm`.
    fn run_scenario(
        &self,
        scenario: Scenario,
        members: &mut Vec<Host>,
        dir: &Path,
        (warm, slow_for): (Duration, Duration),
    ) -> Result<(Vec<Step>, Upkeep)> {
        let before = self.transferred(members)?;
        let started = Instant::now();
        std::thread::sleep(warm);
        let per_hour = 3600.0 / started.elapsed().as_secs_f64();
        let after = self.transferred(members)?;
        let transferred = before.zip(after).map(|((fetched, uploaded), (fetched_after, uploaded_after))| {
            ((fetched_after - fetched) * per_hour / members.len() as f64, (uploaded_after - uploaded) * per_hour)
        });
        let mut disk = 0.0;
        for member in members.iter() {
            disk += disk_bytes(&dir.join(&member.name).join("state"))? / members.len() as f64;
        }
        let upkeep = Upkeep { fetched: transferred.map(|t| t.0), uploaded: transferred.map(|t| t.1), disk };
        let step = |members: &[Host]| Step { event: now_ms(), logged: members.iter().map(|m| m.log().len()).collect() };
        let mut steps = Vec::new();
        match scenario {
            Scenario::Kill | Scenario::ScaleIn | Scenario::ScaleOut => {
                steps.push(step(members));
                match scenario {
                    Scenario::Kill => members[2].kill_9()?,
                    Scenario::ScaleIn => members[2].terminate()?,
                    _ => members.push(self.start("d", dir, scenario)?),
                }
                self.wait_settled(members, steps.last().expect("one step"))?;
            }
            Scenario::Rolling => {
                for i in 0..members.len() {
                    steps.push(step(members));
                    members[i].terminate()?;
                    members[i] = self.start(&members[i].name.clone(), dir, scenario)?;
                    self.wait_settled(members, steps.last().expect("this step"))?;
                }
            }
            Scenario::SlowKey => {
                steps.push(step(members));
                std::thread::sleep(slow_for);
            }
        }
        Ok((steps, upkeep))
    }

    /// sluice: the bytes the members downloaded for standby copies and uploaded in
    /// checkpoints so far, as their metrics say.
    fn transferred(&self, members: &mut [Host]) -> Result<Option<(f64, f64)>> {
        if let System::Streams { .. } = self.system {
            return Ok(None);
        }
        let (mut fetched, mut uploaded) = (0.0, 0.0);
        for member in members {
            let metrics = sluice::admin::call(&member.admin_url()?, hyper::Method::GET, "/metrics", Vec::new())?;
            fetched += metric_sum(&metrics, &STANDBY_FETCHED.sample());
            uploaded += metric_sum(&metrics, &CHECKPOINT_UPLOADED_BYTES.sample());
        }
        Ok(Some((fetched, uploaded)))
    }

    /// Starts member `name` with its state in `dir/name`.
    fn start(&self, name: &str, dir: &Path, scenario: Scenario) -> Result<Host> {
        let home = dir.join(name);
        std::fs::create_dir_all(&home)?;
        let log = home.join("log");
        let max_poll_interval = match scenario {
            Scenario::SlowKey => MAX_POLL_INTERVAL,
            _ => Duration::from_secs(300),
        };
        match self.system {
            System::Sluice { standby, exactly_once } => {
                let config = home.join("job.toml");
                std::fs::write(&config, self.sluice_config(standby, exactly_once, &home, scenario, max_poll_interval))?;
                let mut command = sluice();
                command.arg("run").arg("--config").arg(&config);
                Host::spawn(name, self.store.configure(&mut command), &log)
            }
            System::Streams { standbys, exactly_once } => {
                let streams = self.streams.context("no Kafka Streams build")?;
                let classpath = format!("{}:{}/*", streams.join("classes").display(), streams.join("libs").display());
                let guarantee = if exactly_once { "exactly_once_v2" } else { "at_least_once" };
                let mut command = Command::new("java");
                command
                    .arg("-Dorg.slf4j.simpleLogger.defaultLogLevel=warn")
                    .arg("-cp")
                    .arg(classpath)
                    .arg("VehicleStats")
                    .args([&self.broker.bootstrap, &self.group(), &self.topic(), &self.output()])
                    .arg(home.join("state"))
                    .args([standbys.to_string(), guarantee.to_string(), SESSION_TIMEOUT.as_millis().to_string()])
                    .arg(max_poll_interval.as_millis().to_string());
                Host::spawn(name, &mut command, &log)
            }
        }
    }

    fn sluice_config(
        &self,
        standby: &str,
        exactly_once: bool,
        home: &Path,
        scenario: Scenario,
        max_poll_interval: Duration,
    ) -> String {
        let standby = if standby == "none" || standby == "all" { format!("{standby:?}") } else { standby.into() };
        let guarantee = if exactly_once { "exactly-once" } else { "at-least-once" };
        // The feedback loop runs the probe, whose `spin` takes the CPU deadline, once.
        let (operator, call_timeout_ms) = match scenario {
            Scenario::SlowKey => (operator_wasm("probe"), SLOW_RECORD.as_millis()),
            _ => (operator_wasm("vehicle_stats"), 1000),
        };
        format!(
            "[operator]\npath = {operator:?}\ncall_timeout_ms = {call_timeout_ms}\n[operator.retry]\nattempts = 1\n\
             [source]\nkind = \"kafka\"\n\
             brokers = \"{}\"\ntopic = \"{}\"\ngroup = \"{}\"\ngroup_protocol = \"classic\"\n[source.properties]\n\
             \"session.timeout.ms\" = \"{}\"\n\"heartbeat.interval.ms\" = \"500\"\n\"max.poll.interval.ms\" = \"{}\"\n\
             [sink]\nkind = \"kafka\"\nbrokers = \"{}\"\ntopic = \"{}\"\nguarantee = \"{guarantee}\"\n\
             [state]\ndir = {:?}\npartitions = {PARTITIONS}\n[checkpoint]\nstore = \"s3://sluice/run-{}\"\n\
             interval = \"5s\"\ndownload_bytes_per_s = {}\nstandby = {standby}\nstandby_poll = \"1s\"\n\
             [dead_letter]\npath = {:?}\n[report]\ninterval_s = 0\n[admin]\nlisten = \"127.0.0.1:0\"\n",
            self.broker.bootstrap,
            self.topic(),
            self.group(),
            SESSION_TIMEOUT.as_millis(),
            max_poll_interval.as_millis(),
            self.broker.bootstrap,
            self.output(),
            home.join("state"),
            self.run,
            100 << 20,
            home.join("dead.jsonl"),
        )
    }

    /// Produces records to the topic at [`STEADY_RATE`] until `stop`: positions with
    /// notes, or for the feedback loop positions the probe counts and, every
    /// [`SLOW_EVERY`], one of the slow key that takes [`SLOW_RECORD`].
    fn produce_steadily(&self, stop: &AtomicBool, vehicles: u32, scenario: Scenario) -> Result<usize> {
        let fleet = Fleet::new(&FleetOptions { vehicles, count: None, seed: 7, churn: None });
        let started = Instant::now();
        let slow_every = SLOW_EVERY.as_secs() * STEADY_RATE;
        let paced = fleet.enumerate().map_while(|(i, record)| {
            if stop.load(Ordering::Relaxed) {
                return None;
            }
            let due = Duration::from_secs_f64(i as f64 / STEADY_RATE as f64);
            std::thread::sleep(due.saturating_sub(started.elapsed()));
            Some(record.and_then(|r| {
                let position = String::from_utf8(r.value)?;
                let position = position.strip_suffix('}').context("a position is a JSON object")?;
                Ok(match scenario {
                    Scenario::SlowKey if (i as u64).is_multiple_of(slow_every) => (
                        b"veh-slow".to_vec(),
                        format!(r#"{position},"action":"spin","work_ms":{}}}"#, SLOW_RECORD.as_millis()),
                    ),
                    Scenario::SlowKey => (r.key, counted_position(&format!("{position}}}"))?),
                    _ => (r.key, format!(r#"{position},"note":"{}"}}"#, note(i as u64 + u64::from(vehicles)))),
                })
            }))
        });
        self.broker.produce(&self.topic(), paced)
    }

    /// Waits until no partition has resumed since `step` for [`SETTLED`] and at least
    /// one has, or none has in [`NONE_MOVED`].
    fn wait_settled(&self, members: &[Host], step: &Step) -> Result<()> {
        let started = Instant::now();
        loop {
            let last = members
                .iter()
                .enumerate()
                .flat_map(|(i, m)| self.resumes(&m.log(), step.logged.get(i).copied().unwrap_or(0)))
                .map(|r| r.at)
                .filter(|&at| at >= step.event)
                .max();
            if last.is_some_and(|last| now_ms().saturating_sub(last) >= SETTLED.as_millis() as u64) {
                return Ok(());
            }
            // Kafka Streams gives a member that joins warm-up tasks first, and their active
            // tasks only at a probing rebalance (`probing.rebalance.interval.ms`, 10 min).
            if step.event > 0 && last.is_none() && started.elapsed() > NONE_MOVED {
                return Ok(());
            }
            if started.elapsed() > Duration::from_secs(600) {
                bail!("the group did not settle in 600 s:\n{}", logs(members));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The resumes `log` tells of after its first `from` bytes.
    fn resumes(&self, log: &str, from: usize) -> Vec<Resume> {
        let log = &log[from.min(log.len())..];
        match self.system {
            System::Sluice { .. } => log
                .lines()
                .filter(|line| line.contains("resumed at offset"))
                .filter_map(|line| {
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
                    let paused_here = line.split(" after ").nth(1)?.split(" ms paused").next()?.parse::<f64>().ok();
                    Some(Resume {
                        partition,
                        at: logged_at(line)?,
                        path: path.to_string(),
                        restored: fetched,
                        paused_here: paused_here.map(|ms| ms / 1e3),
                    })
                })
                .collect(),
            System::Streams { .. } => {
                let restores = events(log, "restored", "records");
                events(log, "first", "at")
                    .into_iter()
                    .map(|(partition, at, _)| {
                        // What this member restored of the partition before it ran it.
                        let restored = restores.iter().rev().find(|&&(p, done, _)| p == partition && done <= at);
                        Resume {
                            partition,
                            at,
                            path: "changelog".into(),
                            restored: restored.map_or(0, |&(_, _, records)| records),
                            paused_here: None,
                        }
                    })
                    .collect()
            }
        }
    }

    /// The partitions `log` says its member stopped processing.
    fn stops(&self, log: &str) -> Vec<Stop> {
        match self.system {
            // `... revoked partitions [1, 4] of positions-1: handed over [1, 4] in 52 ms`: the
            // revocation began that long before it was logged.
            System::Sluice { .. } => log
                .lines()
                .filter(|line| line.contains("revoked partitions"))
                .filter_map(|line| {
                    let (list, took) = line.rsplit_once(" in ")?;
                    let took: f64 = took.split(' ').next()?.parse().ok()?;
                    let at = logged_at(line)?.saturating_sub(took as u64);
                    let list = list.rsplit_once('[')?.1.strip_suffix(']')?;
                    let partitions: Vec<u32> = list.split(", ").filter_map(|p| p.parse().ok()).collect();
                    Some(partitions.into_iter().map(move |partition| Stop { partition, at }))
                })
                .flatten()
                .collect(),
            System::Streams { .. } => {
                events(log, "closed", "at").into_iter().map(|(partition, at, _)| Stop { partition, at }).collect()
            }
        }
    }

    /// Prints the scenario's row.
    fn report(
        &self,
        state: &str,
        scenario: Scenario,
        members: &[Host],
        (steps, upkeep): (&[Step], &Upkeep),
        repeated: &str,
    ) {
        let stops: Vec<Stop> = members.iter().flat_map(|m| self.stops(&m.log())).collect();
        let mut moves = Vec::new();
        for (k, step) in steps.iter().enumerate() {
            let until = steps.get(k + 1).map_or(u64::MAX, |next| next.event);
            for (i, member) in members.iter().enumerate() {
                let resumes = self.resumes(&member.log(), step.logged.get(i).copied().unwrap_or(0));
                for resume in resumes.into_iter().filter(|r| (step.event..until).contains(&r.at)) {
                    // The pause began where the partition last stopped, or at the event.
                    let stopped = stops
                        .iter()
                        .filter(|s| s.partition == resume.partition && s.at <= resume.at)
                        .map(|s| s.at)
                        .fold(step.event, u64::max);
                    moves.push(((resume.at - stopped) as f64 / 1e3, resume));
                }
            }
        }
        moves.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut paths: Vec<(&str, usize)> = Vec::new();
        for (_, resume) in &moves {
            match paths.iter_mut().find(|(path, _)| *path == resume.path) {
                Some((_, n)) => *n += 1,
                None => paths.push((&resume.path, 1)),
            }
        }
        let paths: Vec<String> = paths.iter().map(|(path, n)| format!("{n} {path}")).collect();
        let restored: u64 = moves.iter().map(|(_, r)| r.restored).sum();
        let restored = match self.system {
            System::Sluice { .. } => format!("{:.1} MiB", mib(restored as f64)),
            System::Streams { .. } => format!("{restored} records"),
        };
        let rebalances = members
            .iter()
            .enumerate()
            .map(|(i, m)| self.rebalances(&m.log()[steps[0].logged.get(i).copied().unwrap_or(0)..]))
            .max()
            .unwrap_or(0);
        let session = if scenario == Scenario::Kill { SESSION_TIMEOUT.as_secs() } else { 0 };
        let new_owner = match moves.last().and_then(|(_, r)| r.paused_here) {
            Some(paused) => format!("{paused:.2} s"),
            None => "-".to_string(),
        };
        let per_hour = |bytes: Option<f64>| bytes.map_or("-".to_string(), |b| format!("{} MiB/h", mib(b).round()));
        println!(
            "| {state} | {} | {scenario:?} | {} | {:.2} s | {new_owner} | {:.2} s | {session} s | {} | {restored} | \
             {rebalances} | {repeated} | {} | {} | {:.0} MiB |",
            self.system.label(),
            moves.len(),
            moves.last().map_or(0.0, |m| m.0),
            moves.get(moves.len() / 2).map_or(0.0, |m| m.0),
            paths.join(", "),
            per_hour(upkeep.fetched),
            per_hour(upkeep.uploaded),
            mib(upkeep.disk),
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

    /// Deletes the run's topics and checkpoints: a few GiB each at the larger sizes.
    fn remove_data(&self) -> Result<()> {
        self.broker.delete_topic(&self.topic())?;
        self.broker.delete_topic(&self.output())?;
        if let System::Streams { .. } = self.system {
            // Kafka Streams names its changelog topic after the application and the store.
            self.broker.delete_topic(&format!("{}-vehicle-stats-changelog", self.group())).ok();
        }
        let checkpoints = self.store.bucket_dir.join(format!("run-{}", self.run));
        if checkpoints.exists() {
            std::fs::remove_dir_all(checkpoints)?;
        }
        Ok(())
    }
}

/// How long records arrive steadily before the event, for `state_mb` of state: 30 s and
/// 30 s a GiB, time for the checkpoints and standby copies of a state just written in a
/// burst to catch up, as they would be in a group that has been running.
fn warm_up(state_mb: u64) -> Duration {
    Duration::from_secs(30 + 30 * state_mb / 1024)
}

/// `position` with the action the probe counts.
fn counted_position(position: &str) -> Result<String> {
    let position = position.strip_suffix('}').context("a position is a JSON object")?;
    Ok(format!(r#"{position},"action":"count"}}"#))
}

/// Vehicle `v`'s first position, with a note.
fn noted_position(v: u32) -> (String, String) {
    let id = format!("veh-{v:05}");
    let position = format!(
        r#"{{"vehicle_id":"{id}","ts":{},"lat":52.37,"lon":4.9,"speed_kmh":50.0,"note":"{}"}}"#,
        1_700_000_000_000u64 + u64::from(v),
        note(u64::from(v))
    );
    (id, position)
}

/// [`NOTE_CHARS`] characters of random text from `seed`, 6 bits of entropy each: nothing
/// a compressor can shrink by much, and nothing JSON must escape.
fn note(seed: u64) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut note = String::with_capacity(NOTE_CHARS);
    while note.len() < NOTE_CHARS {
        // xorshift64: ten characters from each draw.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        note.extend((0..10).map(|i| ALPHABET[((x >> (i * 6)) & 63) as usize] as char));
    }
    note.truncate(NOTE_CHARS);
    note
}

/// The partition, `field` and wall clock of each Kafka Streams event named `name` in `log`.
fn events(log: &str, name: &str, field: &str) -> Vec<(u32, u64, u64)> {
    let tag = format!("{{\"event\":\"{name}\"");
    log.lines()
        .filter(|line| line.starts_with(&tag))
        .filter_map(|line| {
            let event: serde_json::Value = serde_json::from_str(line).ok()?;
            Some((event["partition"].as_u64()? as u32, event["at"].as_u64()?, event[field].as_u64()?))
        })
        .collect()
}

/// When sluice logged `line` (its first word), in ms since the epoch.
fn logged_at(line: &str) -> Option<u64> {
    Some(ms(humantime::parse_rfc3339(line.split_whitespace().next()?).ok()?))
}

/// The disk `dir` takes, a file of several links counted once (`du`).
fn disk_bytes(dir: &Path) -> Result<f64> {
    let du = Command::new("du").arg("-sb").arg(dir).output().context("running du")?;
    let bytes = String::from_utf8_lossy(&du.stdout).split_whitespace().next().and_then(|b| b.parse().ok());
    bytes.with_context(|| format!("du -sb {}: {}", dir.display(), String::from_utf8_lossy(&du.stderr)))
}

fn mib(bytes: f64) -> f64 {
    bytes / (1 << 20) as f64
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
