//! A job: the wiring of source, partition workers, operator, state and sinks.
//!
//! [`run`] checks the source against the job, opens the state directory, loads and
//! validates the operator, opens the checkpoint store and the sinks, and hands the
//! source a set of [`Workers`] to start partitions in as it is given them (all at once
//! for an embedded source; on assignment for Kafka). While they work it prints a
//! running summary, follows the operator's deployed versions (and serves the admin
//! API, when configured), turns SIGTERM/SIGINT into a graceful stop, and returns the
//! final [`JobReport`]. Each piece's behaviour lives in its own module.

pub(crate) mod events;

use crate::admin;
use crate::checkpoint::{self, CheckpointSettings, CheckpointStore, JobIdentity};
use crate::config::{Config, Guarantee, SinkConfig, SourceConfig};
use crate::lock;
use crate::metrics::Metrics;
use crate::operator::deploy::{Deployer, Sandbox};
use crate::operator::replay::SwitchLog;
use crate::operator::wasm::ActiveVersion;
use crate::record::RawRecord;
use crate::sink::{DeadLetterSink, Sink};
use crate::source::events::PARTITIONS_ADDED;
use crate::source::file::JsonlFile;
use crate::source::generator::{Fleet, FleetOptions};
use crate::source::kafka::{self, KafkaOptions};
use crate::source::{self, DispatchOptions};
use crate::state::{self, StateDir};
use crate::stats::{DeadLetters, LiveStats, PartitionStats, peak_rss, process_cpu};
use crate::warnings::Watch;
use crate::worker::{
    Cadence, Checkpointing, Destinations, DispatchReport, PartitionReport, Router, WorkerSetup, Workers,
};
use anyhow::{Result, anyhow, bail};
use events::{DEAD_LETTERS_BY_KIND, EXPIRED_REMOVED, JOB_STARTED, LAG};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;

/// What a job did, per partition and in all.
#[derive(Debug, Clone, PartialEq)]
pub struct JobReport {
    /// Wall-clock time from the start of the source to the last commit.
    pub elapsed: Duration,
    /// The longest a partition waited for its state before processing began (`None`:
    /// checkpoints off).
    pub restore_took: Option<Duration>,
    /// What the source read and skipped.
    pub source: DispatchReport,
    /// One entry per run of a partition on this host (a partition that moved away and
    /// back has two), in partition order.
    pub partitions: Vec<PartitionReport>,
    /// CPU time of the whole process over the same span, every thread (RocksDB's
    /// included); `None` where the system does not say.
    pub cpu: Option<Duration>,
    /// The most memory the process held resident, in bytes, when the system says.
    pub peak_rss: Option<u64>,
}

impl JobReport {
    /// What `router`'s run did since `started`, when the process had spent `cpu`.
    fn of(router: &Router, started: Instant, cpu: Option<Duration>, checkpoints_on: bool) -> JobReport {
        let mut reports = router.partition_reports().to_vec();
        reports.sort_by_key(|r| r.partition);
        JobReport {
            elapsed: started.elapsed(),
            restore_took: checkpoints_on.then(|| reports.iter().map(|r| r.start_took).max().unwrap_or_default()),
            source: router.report(),
            partitions: reports,
            cpu: cpu.zip(process_cpu()).map(|(before, after)| after.saturating_sub(before)),
            peak_rss: peak_rss(),
        }
    }

    /// Records processed by this run, over all partitions.
    pub fn processed(&self) -> u64 {
        self.partitions.iter().map(|p| p.totals.processed).sum()
    }
}

impl fmt::Display for JobReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let processed = self.processed();
        let rate = processed as f64 / self.elapsed.as_secs_f64().max(1e-9);
        let dead: u64 = self.partitions.iter().map(|p| p.totals.dead_letters).sum();
        let keys: u64 = self.partitions.iter().filter_map(|p| p.keys).sum();
        writeln!(
            f,
            "processed {processed} records in {:.2}s ({rate:.0} records/s); {dead} dead letters; {keys} keys hold state; \
             {} records skipped (already in state)",
            self.elapsed.as_secs_f64(),
            self.source.skipped
        )?;
        let expired: u64 = self.partitions.iter().map(|p| p.totals.expired).sum();
        let ignored: u64 = self.partitions.iter().map(|p| p.totals.clock_ignored).sum();
        if expired > 0 || ignored > 0 {
            writeln!(
                f,
                "{expired}{EXPIRED_REMOVED}; {ignored} records without a usable timestamp (none, negative or too \
                 far ahead) did not move the event-time clock"
            )?;
        }
        if !self.source.gaps.is_empty() {
            let gaps: Vec<String> = self.source.gaps.iter().map(|(p, n)| format!("partition {p}: {n}")).collect();
            writeln!(f, "offset gaps (offsets the source never delivered, see the log): {}", gaps.join(", "))?;
        }
        for (version, dead) in DeadLetters::by_version(self.partitions.iter().map(|p| &p.dead_letters)) {
            writeln!(f, "{DEAD_LETTERS_BY_KIND}: {dead}, from {version}")?;
        }
        if let Some(took) = self.restore_took {
            writeln!(f, "restore took {:.3}s before processing began", took.as_secs_f64())?;
        }
        if let (Some(cpu), Some(peak)) = (self.cpu, self.peak_rss) {
            writeln!(
                f,
                "CPU time {:.2}s over every thread ({:.2} µs per record); peak memory {} (RSS)",
                cpu.as_secs_f64(),
                cpu.as_secs_f64() * 1e6 / processed.max(1) as f64,
                checkpoint::bytes(peak)
            )?;
        }
        let versions: std::collections::BTreeSet<&str> = self.partitions.iter().map(|p| p.version.as_str()).collect();
        let switches: u64 = self.partitions.iter().map(|p| p.totals.switches).sum();
        writeln!(
            f,
            "operator at the end: {}; {switches} version switches (hot swaps) over all partitions",
            versions.into_iter().collect::<Vec<_>>().join(", ")
        )?;
        writeln!(
            f,
            "partition  restored-from           resumed-at  committed  processed  dead-letters  keys  entries  \
             expired  backlog  clock                 checkpoints  checkpointed-at  uploaded  stopped"
        )?;
        for p in &self.partitions {
            writeln!(
                f,
                "{:>9}  {:<22}  {:>10}  {:>9}  {:>9}  {:>12}  {:>4}  {:>7}  {:>7}  {:>7}  {:<20}  {:>11}  {:>15}  {:>8}  \
                 {:?}",
                p.partition,
                p.restored_from.to_string(),
                p.resumed_at,
                p.totals.committed_offset,
                p.totals.processed,
                p.totals.dead_letters,
                p.keys.map_or("-".to_string(), |k| k.to_string()),
                p.totals.entries,
                p.totals.expired,
                p.totals.backlog,
                clock_time(p.totals.clock_ms),
                p.totals.checkpoints,
                p.totals.checkpoint_offset,
                checkpoint::bytes(p.totals.uploaded_bytes),
                p.stopped
            )?;
        }
        Ok(())
    }
}

/// Runs the job described by `config` until its source ends, or until SIGTERM or
/// SIGINT ask it to stop (partitions hand over: last batch, last checkpoint).
pub fn run(config: &Config) -> Result<JobReport> {
    config.validate()?;
    let partitions = config.state.partitions;
    let source = OpenSource::open(config)?;
    let max_poll_interval = source.max_poll_interval(partitions)?;
    // A partition another host claimed is taken back only where a group decides who
    // owns it, once this member would have heard that the group dropped it.
    let take_back_after = match &source {
        OpenSource::Kafka(kafka) => Some(kafka.session_timeout()?),
        _ => None,
    };
    state::limit_memory(config.state.rocksdb_memory_mib << 20)?;
    let runtime = crate::objects::runtime()?;
    // Before the state directory, which records its partition count when it is new: a
    // store of another count refuses the start before that.
    let checkpoints = open_checkpoints(config, &runtime)?;
    let state = StateDir::open(&config.state.dir, partitions)?;
    let sandbox = Sandbox::new(&config.operator, state.scratch_path());
    let (registry, operator) = Deployer::starting_version(
        &config.registry_url(),
        &config.operator.name(),
        &sandbox,
        &config.operator.path,
        runtime.handle(),
    )?;
    let version = operator.version().to_string();
    let active = ActiveVersion::new(operator);
    let switches =
        SwitchLog::new(registry.clone(), sandbox.limits.clone(), sandbox.config.clone(), runtime.handle().clone());
    // After the operator loaded, so a component that cannot run is the error a start
    // names first.
    if let Some(checkpoints) = &checkpoints {
        runtime.block_on(checkpoints.store.claim(partitions, &job_identity(config)))?;
    }
    // Sinks open last, so a job that cannot start leaves no files behind.
    let sink = Sink::open(&config.sink, &config.source, config.state.sync_outputs)?;
    let dead_letters = DeadLetterSink::open(&config.dead_letter, &config.sink, config.state.sync_outputs)?;
    tracing::info!(
        operator = version,
        partitions,
        state = %config.state.dir.display(),
        checkpoints = checkpoints.as_ref().map_or("off", |c| c.store.url()),
        sink = sink.name(),
        dead_letters = dead_letters.name(),
        "{JOB_STARTED}"
    );
    let stopping = Arc::new(AtomicBool::new(false));
    runtime.spawn(stop_on_signal(stopping.clone()));
    let checkpoints_on = checkpoints.is_some();
    let workers = Workers::new(WorkerSetup {
        state,
        destinations: Destinations { sink, dead_letters },
        operator: Box::new(active.clone()),
        switches,
        checkpoints,
        runtime: runtime.handle().clone(),
        queued_batches: config.state.queued_batches(),
        queued_bytes: config.state.queued_bytes(),
        // A batch half the poll timeout long is warned about: a rebalance waits for it.
        cadence: Cadence::of(&config.state, max_poll_interval.map(|interval| interval / 2)),
        cache_bytes: config.state.cache_mib << 20,
        ttl: Arc::new(config.ttl.clone()),
        null_keys: config.source.null_keys(),
        retry_timeout: config.checkpoint.restore_retry_timeout,
        take_back_after,
        stopping: stopping.clone(),
    });
    let (live, host_stats) = (workers.live(), workers.host_stats());
    let router = Router::new(workers, partitions, config.state.batch_size(), config.state.batch_bytes());
    let deployer = Arc::new(Deployer::new(registry, sandbox, active, live.clone(), runtime.handle().clone()));
    if let Some(listen) = &config.admin.listen {
        let metrics = Metrics::new(live.clone(), host_stats.clone(), max_poll_interval, checkpoints_on);
        admin::serve(listen, &config.admin, deployer.clone(), metrics, host_stats.clone(), &runtime)?;
    }
    let checkpoint_interval = checkpoints_on.then_some(config.checkpoint.interval);
    let watch = Watch::new(config.report.clone(), checkpoint_interval, live.clone(), host_stats);

    let (started, cpu) = (Instant::now(), process_cpu());
    let router = drive(config, source, router, &deployer, &live, watch, &stopping, started)?;
    Ok(JobReport::of(&router, started, cpu, checkpoints_on))
}

/// The checkpoint store and its settings, when checkpoints are on; the store is
/// checked to hold checkpoints of this many partitions, if any.
fn open_checkpoints(config: &Config, runtime: &Runtime) -> Result<Option<Checkpointing>> {
    if !config.checkpoint.enabled {
        return Ok(None);
    }
    let store = CheckpointStore::open(&config.checkpoint.store_url(&config.state.dir))?;
    runtime.block_on(store.check_partitions(config.state.partitions))?;
    Ok(Some(Checkpointing {
        store,
        settings: CheckpointSettings {
            interval: config.checkpoint.interval,
            retain: config.checkpoint.retain,
            upload_bytes_per_s: config.checkpoint.upload_bytes_per_s,
            host: checkpoint::host_id().to_string(),
        },
        restore_budget: config.checkpoint.restore_budget,
    }))
}

/// Which job `config` runs, as its checkpoint store records it.
fn job_identity(config: &Config) -> JobIdentity {
    let input = match &config.source {
        // Not the group: it only shares the partitions out (where each starts is the
        // state's), and a job may move to a new one with its state.
        SourceConfig::Kafka { topic, .. } => Some(format!("kafka topic {topic}")),
        SourceConfig::Generator { .. } | SourceConfig::File { .. } => None,
    };
    JobIdentity { operator: config.operator.name(), input }
}

/// Runs the source into `router` on a thread of its own and follows the operator's
/// deployed versions on another, logging the running summary (timed from `started`) and
/// `watch`'s warnings meanwhile; returns the router once the source has ended and every
/// partition stopped.
#[allow(clippy::too_many_arguments)]
fn drive(
    config: &Config,
    source: OpenSource,
    router: Router,
    deployer: &Deployer,
    live: &LiveStats,
    mut watch: Watch,
    stopping: &AtomicBool,
    started: Instant,
) -> Result<Router> {
    let source_ended = AtomicBool::new(false);
    std::thread::scope(|scope| -> Result<Router> {
        let dispatcher = std::thread::Builder::new()
            .name("sluice-source".into())
            .spawn_scoped(scope, || source.dispatch(router, stopping))?;
        let (poll_versions, source_ended_ref) = (config.operator.poll_versions, &source_ended);
        std::thread::Builder::new()
            .name("sluice-deploys".into())
            .spawn_scoped(scope, move || deployer.follow(poll_versions, || source_ended_ref.load(Ordering::Relaxed)))?;
        let summary = config.report.interval;
        let mut last = Mark::now(0);
        while !dispatcher.is_finished() {
            std::thread::sleep(Duration::from_millis(20).min(summary.max(Duration::from_millis(1))));
            if !summary.is_zero() && last.at.elapsed() >= summary {
                last = log_summary(started, last, live);
            }
            watch.check_if_due();
        }
        source_ended.store(true, Ordering::Relaxed);
        dispatcher.join().map_err(|_| anyhow!("the source panicked"))?
    })
}

/// Sets `stopping` on the first SIGTERM or SIGINT; a second one ends the process at once.
async fn stop_on_signal(stopping: Arc<AtomicBool>) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        tracing::warn!("cannot listen for SIGTERM/SIGINT; they will kill the job without a handover");
        return;
    };
    for round in 0.. {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        if round > 0 {
            std::process::exit(130);
        }
        tracing::info!("stopping: partitions hand over (last batch, last checkpoint); signal again to exit at once");
        stopping.store(true, Ordering::Relaxed);
    }
}

/// A source, opened, as the dispatcher thread reads it.
enum OpenSource {
    /// An embedded source: records the dispatcher partitions itself, and its pacing.
    Embedded(Box<dyn Iterator<Item = Result<RawRecord>> + Send>, DispatchOptions),
    /// A Kafka topic, already partitioned.
    Kafka(KafkaOptions),
}

impl OpenSource {
    /// Opens `config`'s source.
    fn open(config: &Config) -> Result<Self> {
        Ok(match &config.source {
            SourceConfig::Generator { vehicles, count, duration, rate, seed, churn } => OpenSource::Embedded(
                Box::new(Fleet::new(&FleetOptions { vehicles: *vehicles, count: *count, seed: *seed, churn: *churn })),
                DispatchOptions { rate: *rate, duration: *duration },
            ),
            SourceConfig::File { path, key_field, timestamp_field, rate, max_line_bytes } => OpenSource::Embedded(
                Box::new(JsonlFile::open(path, key_field, timestamp_field, *max_line_bytes)?),
                DispatchOptions { rate: *rate, duration: None },
            ),
            SourceConfig::Kafka {
                brokers,
                topic,
                group,
                instance_id,
                properties,
                stop_when_idle,
                offset_out_of_range,
                null_keys: _, // the workers apply it
            } => {
                OpenSource::Kafka(KafkaOptions {
                    brokers: brokers.clone(),
                    topic: topic.clone(),
                    group: group.clone(),
                    instance_id: instance_id.clone(),
                    properties: properties.clone(),
                    stop_when_idle: *stop_when_idle,
                    offset_out_of_range: *offset_out_of_range,
                    // Exactly-once outputs commit the group's offsets in their transactions.
                    commits_group_offsets: !matches!(
                        config.sink,
                        SinkConfig::Kafka { guarantee: Guarantee::ExactlyOnce, .. }
                    ),
                    retry_timeout: config.checkpoint.restore_retry_timeout,
                })
            }
        })
    }

    /// The consumer's poll timeout, which a rebalance may wait for a batch (`None`: an
    /// embedded source has none). A Kafka topic must have the job's number of
    /// partitions.
    fn max_poll_interval(&self, partitions: u32) -> Result<Option<Duration>> {
        let OpenSource::Kafka(kafka) = self else { return Ok(None) };
        let topic_partitions = kafka.partition_count()?;
        if topic_partitions != partitions {
            bail!(
                "topic {} has {topic_partitions} partitions but the job has {partitions}: a partition's state must be \
                 the state of the topic partition of the same number; {PARTITIONS_ADDED}",
                kafka.topic
            );
        }
        Ok(Some(kafka.max_poll_interval()?))
    }

    /// Reads the source into `router` until it ends or `stopping` is set, then stops
    /// every partition; returns the router with the partitions' reports.
    fn dispatch(self, mut router: Router, stopping: &AtomicBool) -> Result<Router> {
        match self {
            OpenSource::Embedded(records, options) => {
                source::dispatch(records, &mut router, &options, stopping)?;
                Ok(router)
            }
            OpenSource::Kafka(options) => kafka::dispatch(&options, router, stopping),
        }
    }
}

/// A partition's clock as a time of day (RFC 3339, to the second), or `-` before it
/// started.
fn clock_time(ms: u64) -> String {
    match ms {
        0 => "-".to_string(),
        ms => humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_millis(ms)).to_string(),
    }
}

/// Where the previous running-summary line left off.
struct Mark {
    at: Instant,
    processed: u64,
    cpu: Option<Duration>,
}

impl Mark {
    fn now(processed: u64) -> Self {
        Mark { at: Instant::now(), processed, cpu: process_cpu() }
    }
}

/// Logs the running summary — a line of totals (records/s and the process's CPU time
/// per record since `since`, partitions, entries, lag, checkpoints, dead letters), then
/// a line per partition [worth attention](worth_attention) — and returns the new mark.
fn log_summary(started: Instant, since: Mark, live: &LiveStats) -> Mark {
    let live = lock(live);
    let sum = |counter: fn(&PartitionStats) -> &AtomicU64| -> u64 {
        live.values().map(|s| counter(s).load(Ordering::Relaxed)).sum()
    };
    let processed = sum(|s| &s.processed);
    let now = Mark::now(processed);
    let records = processed.saturating_sub(since.processed);
    let rate = records as f64 / since.at.elapsed().as_secs_f64();
    let cpu = match (since.cpu, now.cpu) {
        (Some(before), Some(after)) if records > 0 => {
            format!(", {:.1} µs CPU/record", (after - before).as_secs_f64() * 1e6 / records as f64)
        }
        _ => String::new(),
    };
    let lags: Vec<i64> = live.values().map(|s| s.lag.load(Ordering::Relaxed)).filter(|&lag| lag >= 0).collect();
    let lag = if lags.is_empty() { String::new() } else { format!(" {LAG}{}", lags.iter().sum::<i64>()) };
    let failed = match sum(|s| &s.checkpoint_failures) {
        0 => String::new(),
        failed => format!(" ({failed} failed)"),
    };
    let by_partition: Vec<_> = live.values().map(|s| lock(&s.dead_by_version).clone()).collect();
    let dead: String = DeadLetters::by_version(&by_partition)
        .iter()
        .map(|(version, dead)| format!(" | dead letters of {version}: {dead}"))
        .collect();
    let mut summary = format!(
        "[{:>6.1}s] {processed} records, {rate:.0} records/s{cpu} | {} partitions, {} entries{lag}, {} checkpoints{failed}{dead}",
        started.elapsed().as_secs_f64(),
        live.len(),
        sum(|s| &s.entries),
        sum(|s| &s.checkpoints),
    );
    for (p, why) in worth_attention(&live) {
        let s = &live[&p];
        let lag = s.lag.load(Ordering::Relaxed);
        let ttl = match s.expired.load(Ordering::Relaxed) {
            0 => String::new(),
            expired => format!(
                " expired={expired} backlog={} clock={}",
                s.backlog.load(Ordering::Relaxed),
                clock_time(s.clock_ms.load(Ordering::Relaxed))
            ),
        };
        summary += &format!(
            "\n  p{p}@{} entries={}{ttl} ckpt@{} batch-p99={:.2}ms{}{}",
            s.committed_offset.load(Ordering::Relaxed),
            s.entries.load(Ordering::Relaxed),
            s.checkpoint_offset.load(Ordering::Relaxed),
            s.batch_p99_us.load(Ordering::Relaxed) as f64 / 1e3,
            if lag >= 0 { format!(" {LAG}{lag}") } else { String::new() },
            if why.is_empty() { String::new() } else { format!(" ({})", why.join(", ")) }
        );
    }
    // Through the log, so `--log-format json` keeps one JSON object a line.
    tracing::info!(target: "sluice::summary", "{summary}");
    now
}

/// Partitions the running summary lists one by one; a job with more lists only those
/// [worth attention](worth_attention).
const SUMMARY_PARTITIONS: usize = 4;

/// The partitions a running summary shows, each with why: every one of a small job;
/// of a larger one the slowest (batch p99), the largest (entries), the furthest behind
/// (lag) and the one with the largest expiry backlog, where that is above 0.
fn worth_attention(live: &BTreeMap<u32, Arc<PartitionStats>>) -> BTreeMap<u32, Vec<&'static str>> {
    if live.len() <= SUMMARY_PARTITIONS {
        return live.keys().map(|&p| (p, Vec::new())).collect();
    }
    let mut shown: BTreeMap<u32, Vec<&'static str>> = BTreeMap::new();
    /// A reason to show a partition, and the measure whose largest it is.
    type Criterion = (&'static str, fn(&PartitionStats) -> i64);
    let criteria: [Criterion; 4] = [
        ("slowest", |s| s.batch_p99_us.load(Ordering::Relaxed) as i64),
        ("largest", |s| s.entries.load(Ordering::Relaxed) as i64),
        ("furthest behind", |s| s.lag.load(Ordering::Relaxed)),
        ("largest expiry backlog", |s| s.backlog.load(Ordering::Relaxed) as i64),
    ];
    for (why, measure) in criteria {
        let top = live.iter().map(|(&p, s)| (measure(s), p)).max_by_key(|&(value, p)| (value, std::cmp::Reverse(p)));
        if let Some((_, p)) = top.filter(|&(value, _)| value > 0) {
            shown.entry(p).or_default().push(why);
        }
    }
    shown
}
