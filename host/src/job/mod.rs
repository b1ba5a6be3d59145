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
mod report;
mod summary;

pub use report::JobReport;
use summary::{Mark, log_summary};

use crate::admin;
use crate::checkpoint::{self, CheckpointSettings, CheckpointStore, JobIdentity};
use crate::config::{Config, Guarantee, SinkConfig, SourceConfig, Standby};
use crate::metrics::Metrics;
use crate::operator::deploy::{Deployer, Sandbox};
use crate::operator::versions::switches::{Claims, SwitchLog};
use crate::operator::versions::{ActiveVersion, ShadowVersion};
use crate::operator::wasm::keep_compiled;
use crate::partitions::{
    Checkpointing, ChooseCopies, Followed, Router, StandbySettings, WorkerSetup, Workers, chosen_copies,
};
use crate::probes::process_cpu;
use crate::record::RawRecord;
use crate::sink::{DeadLetterSink, Sink};
use crate::source::events::PARTITIONS_ADDED;
use crate::source::file::JsonlFile;
use crate::source::generator::{Fleet, FleetOptions};
use crate::source::kafka::{self, GroupDescriber, KafkaOptions};
use crate::source::{self, DispatchOptions};
use crate::state::{self, StateDir};
use crate::stats::{HostStats, LiveStats};
use crate::warnings::Watch;
use crate::worker::{Cadence, Destinations};
use anyhow::{Result, anyhow, bail};
use events::{JOB_STARTED, STANDBY_CHOSEN};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;

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
    keep_compiled(&state.compiled_path(), config.operator.compiled_cache_mib << 20)?;
    let sandbox = Sandbox::new(&config.operator, state.scratch_path());
    let (registry, operator) = Deployer::starting_version(
        &config.registry_url(),
        &config.operator.name(),
        &sandbox,
        &config.operator.path,
        (runtime.handle(), config.checkpoint.restore_retry_timeout),
    )?;
    let version = operator.version().to_string();
    let active = ActiveVersion::new(operator);
    let shadow = Arc::new(ShadowVersion::default());
    let claims = checkpoints.as_ref().map(|c| Claims { store: c.store.clone(), host: c.settings.host.clone() });
    let switches = SwitchLog::new(
        registry.clone(),
        (sandbox.limits.clone(), sandbox.config.clone()),
        runtime.handle().clone(),
        claims,
        config.checkpoint.restore_retry_timeout,
    );
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
    let followed = match (&source, config.checkpoint.standby) {
        (OpenSource::Kafka(_), Standby::All) if checkpoints_on => Some(Followed::All),
        (OpenSource::Kafka(kafka), Standby::Hosts(copies)) if checkpoints_on => {
            Some(Followed::Chosen(chosen_by_group(kafka, partitions, copies)?))
        }
        _ => None,
    };
    if followed.is_none() {
        // Copies no one brings up to date would only take disk (and a restore reuses
        // the partition's own files without them).
        checkpoint::standby::discard_all(&state)?;
    }
    let workers = Workers::new(WorkerSetup {
        state,
        destinations: Destinations { sink, dead_letters },
        operator: Box::new(active.clone()),
        switches,
        shadows: Some(shadow.clone()),
        checkpoints,
        runtime: runtime.handle().clone(),
        queued_batches: config.state.queued_batches(),
        queued_bytes: config.state.queued_bytes(),
        // A batch half the poll timeout long is warned about: a rebalance waits for it.
        cadence: Cadence::of(&config.state, max_poll_interval.map(|interval| interval / 2)),
        cache_bytes: config.state.cache_mib << 20,
        timers_bytes: config.state.timers_mib << 20,
        ttl: Arc::new(config.ttl.clone()),
        null_keys: config.source.null_keys(),
        retry_timeout: config.checkpoint.restore_retry_timeout,
        take_back_after,
        stopping: stopping.clone(),
    });
    let (live, host_stats) = (workers.live(), workers.host_stats());
    let mut router = Router::new(workers, partitions, config.state.batch_size(), config.state.batch_bytes());
    let deployer = Arc::new(Deployer::new(registry, sandbox, (active, shadow), live.clone(), runtime.handle().clone()));
    if let Err(e) = deployer.sync_trials() {
        tracing::error!("starting the recorded shadow or canary of {}: {e:#}", config.operator.name());
    }
    if let Some(listen) = &config.admin.listen {
        let metrics = Metrics::new(live.clone(), host_stats.clone(), max_poll_interval, checkpoints_on);
        admin::serve(listen, &config.admin, deployer.clone(), metrics, host_stats.clone(), &runtime)?;
    }
    // Before the source joins its group: the copies are warm when partitions arrive.
    if let Some(followed) = followed {
        let settings = StandbySettings {
            max_bytes: config.checkpoint.standby_max_bytes,
            poll: config.checkpoint.standby_poll,
            warm_up: config.checkpoint.standby_warm_up,
        };
        router.follow_standbys(settings, followed)?;
    }
    let checkpoint_interval = checkpoints_on.then_some(config.checkpoint.interval);
    let watch = Watch::new(config.report.clone(), checkpoint_interval, live.clone(), host_stats.clone());

    let (started, cpu) = (Instant::now(), process_cpu());
    let router = drive(config, source, router, &deployer, (&live, &host_stats), watch, &stopping, started)?;
    Ok(JobReport::of(&router, started, cpu, checkpoints_on))
}

/// The checkpoint store and its settings, when checkpoints are on; the store is
/// checked to hold checkpoints of this many partitions, if any.
fn open_checkpoints(config: &Config, runtime: &Runtime) -> Result<Option<Checkpointing>> {
    if !config.checkpoint.enabled {
        return Ok(None);
    }
    let store = CheckpointStore::open(&config.checkpoint.store_url(&config.state.dir))?
        .with_download_cap(config.checkpoint.download_bytes_per_s);
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
    (live, host): (&LiveStats, &HostStats),
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
                last = log_summary(started, last, live, host);
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
/// The partitions this host keeps standby copies of under `[checkpoint] standby =
/// copies` ([`chosen_copies`]), from the group's description at each round; where the
/// broker fails to describe it, those chosen last.
fn chosen_by_group(kafka: &KafkaOptions, partitions: u32, copies: u32) -> Result<ChooseCopies> {
    let describer = GroupDescriber::new(&kafka.brokers, &kafka.properties, &kafka.group, &kafka.topic)?;
    let own = kafka.member_name();
    let mut last: Option<BTreeSet<u32>> = None;
    Ok(Box::new(move || {
        match describer.describe(GROUP_DESCRIBE_TIMEOUT) {
            Ok(members) => {
                let chosen = chosen_copies(&own, &members, partitions, copies as usize);
                if last.as_ref() != Some(&chosen) {
                    tracing::info!(
                        "{STANDBY_CHOSEN} {chosen:?} ([checkpoint] standby = {copies}; the group has {} members)",
                        members.len()
                    );
                }
                last = Some(chosen);
            }
            Err(e) => tracing::warn!("{e:#}: the standby copies chosen last are followed meanwhile"),
        }
        last.clone().unwrap_or_default()
    }))
}

/// How long a round of standby updates waits for the group's description.
const GROUP_DESCRIBE_TIMEOUT: Duration = Duration::from_secs(10);

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
                group_protocol,
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
                    group_protocol: *group_protocol,
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
