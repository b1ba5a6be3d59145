//! A job: the wiring of source, partition workers, operator, state and sinks.
//!
//! [`run`] opens the state directory, loads and validates the operator, restores each
//! partition's state (local recovery or the checkpoint store) and so its offset, starts
//! one worker thread per partition (each with its checkpointer) and the source's
//! dispatcher, prints a running summary while they work, and returns the final
//! [`JobReport`]. It owns thread lifetimes and error propagation; each piece's
//! behaviour lives in its own module.

use crate::checkpoint::{self, CheckpointSettings, CheckpointStore, Checkpointer, RestoredFrom};
use crate::config::{Config, SourceConfig};
use crate::operator::Operator;
use crate::operator::wasm::{Limits, WasmOperator};
use crate::sink::{LineSink, Sink};
use crate::source::file::JsonlFile;
use crate::source::generator::{Fleet, FleetOptions};
use crate::source::kafka::{self, KafkaOptions};
use crate::source::{self, DispatchOptions, DispatchReport, RawRecord, SourceRecord};
use crate::state::{StateDir, Transaction};
use crate::worker::{self, Destinations, PartitionStats};
use anyhow::{Context, Result, anyhow, bail};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::SyncSender;
use std::time::{Duration, Instant};

/// Batches a worker may have queued before the source waits for it.
const QUEUED_BATCHES: usize = 4;

/// What a job did, per partition and in all.
#[derive(Debug, Clone, PartialEq)]
pub struct JobReport {
    /// Wall-clock time from the first record to the last commit.
    pub elapsed: Duration,
    /// How long restoring state took before processing began (`None`: checkpoints off).
    pub restore_took: Option<Duration>,
    /// What the source read and skipped.
    pub source: DispatchReport,
    /// One entry per partition, in partition order.
    pub partitions: Vec<PartitionReport>,
}

/// One partition's part of a [`JobReport`].
#[derive(Debug, Clone, PartialEq)]
pub struct PartitionReport {
    /// The partition.
    pub partition: u32,
    /// The offset it resumed from (stored with its state).
    pub resumed_at: u64,
    /// The next offset to process, committed with its state.
    pub committed_offset: u64,
    /// Records processed by this run.
    pub processed: u64,
    /// Records sent to the dead-letter file by this run.
    pub dead_letters: u64,
    /// Distinct keys holding state.
    pub keys: u64,
    /// Where its state came from at start.
    pub restored_from: RestoredFrom,
    /// Checkpoints this run completed.
    pub checkpoints: u64,
    /// The offset of the newest of them (0 if none).
    pub checkpoint_offset: u64,
    /// Bytes they uploaded.
    pub uploaded_bytes: u64,
}

impl JobReport {
    /// Records processed by this run, over all partitions.
    pub fn processed(&self) -> u64 {
        self.partitions.iter().map(|p| p.processed).sum()
    }
}

impl fmt::Display for JobReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let processed = self.processed();
        let rate = processed as f64 / self.elapsed.as_secs_f64().max(1e-9);
        let dead: u64 = self.partitions.iter().map(|p| p.dead_letters).sum();
        let keys: u64 = self.partitions.iter().map(|p| p.keys).sum();
        writeln!(
            f,
            "processed {processed} records in {:.2}s ({rate:.0} records/s); {dead} dead letters; {keys} keys hold state; \
             {} records skipped (already in state)",
            self.elapsed.as_secs_f64(),
            self.source.skipped
        )?;
        if let Some(took) = self.restore_took {
            writeln!(f, "restore took {:.3}s before processing began", took.as_secs_f64())?;
        }
        writeln!(
            f,
            "partition  restored-from           resumed-at  committed  processed  dead-letters  keys  checkpoints  \
             checkpointed-at  uploaded"
        )?;
        for p in &self.partitions {
            writeln!(
                f,
                "{:>9}  {:<22}  {:>10}  {:>9}  {:>9}  {:>12}  {:>4}  {:>11}  {:>15}  {}",
                p.partition,
                p.restored_from.to_string(),
                p.resumed_at,
                p.committed_offset,
                p.processed,
                p.dead_letters,
                p.keys,
                p.checkpoints,
                p.checkpoint_offset,
                checkpoint::bytes(p.uploaded_bytes)
            )?;
        }
        Ok(())
    }
}

/// Runs the job described by `config` to the end of its source.
pub fn run(config: &Config) -> Result<JobReport> {
    config.validate()?;
    let partitions = config.state.partitions;
    let source = OpenSource::open(&config.source, config.state.commit_every)?;
    if let OpenSource::Kafka(kafka) = &source {
        let topic_partitions = kafka.partition_count()?;
        if topic_partitions != partitions {
            bail!(
                "topic {} has {topic_partitions} partitions but the job has {partitions}: a partition's state must \
                 be the state of the topic partition of the same number. Set [state] partitions = {topic_partitions}",
                kafka.topic
            );
        }
    }
    let state_dir = StateDir::open(&config.state.dir, partitions)?;
    let limits = Limits {
        call_timeout: Duration::from_millis(config.operator.call_timeout_ms),
        memory_bytes: (config.operator.memory_limit_mib as usize) << 20,
    };
    let operator_config = config.operator.config.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let operator = Arc::new(WasmOperator::load(&config.operator.path, limits, operator_config)?);
    let runtime = checkpoint::runtime()?;
    let restore = if config.checkpoint.enabled {
        let store = CheckpointStore::open(&config.checkpoint.store_url(&config.state.dir))?;
        runtime.block_on(store.check_partitions(partitions))?;
        let budget = Duration::from_secs_f64(config.checkpoint.restore_budget_s);
        let report = runtime.block_on(checkpoint::restore::restore(&state_dir, &store, budget))?;
        Some((store, report))
    } else {
        None
    };
    let mut instances = Vec::new();
    let mut start_offsets = Vec::new();
    for partition in 0..partitions {
        let store = state_dir.open_partition(partition)?;
        start_offsets.push(store.committed_offset()?);
        instances.push(operator.instantiate(partition, Transaction::new(store)?)?);
    }
    let restored_from: Vec<RestoredFrom> = match &restore {
        Some((_, report)) => report.restored.clone(),
        None => start_offsets.iter().map(|&offset| RestoredFrom::Local { offset }).collect(),
    };
    let mut checkpointers: Vec<Option<Checkpointer>> = match &restore {
        Some((store, report)) => {
            let settings = CheckpointSettings {
                interval: Duration::from_secs_f64(config.checkpoint.interval_s),
                retain: config.checkpoint.retain,
                upload_bytes_per_s: config.checkpoint.upload_bytes_per_s,
            };
            (report.plan.partitions.iter().zip(&report.restored))
                .map(|(plan, restored)| {
                    Some(Checkpointer::new(
                        store.clone(),
                        runtime.handle().clone(),
                        plan,
                        restored,
                        settings.clone(),
                        state_dir.snapshot_path(plan.partition),
                        operator.version().to_string(),
                    ))
                })
                .collect()
        }
        None => (0..partitions).map(|_| None).collect(),
    };
    // Sinks open last, so a job that cannot start leaves no files behind.
    let sink = Sink::open(&config.sink)?;
    let dead_letters = LineSink::file(&config.dead_letter.path)?;
    let stats: Vec<PartitionStats> = instances
        .iter_mut()
        .zip(&start_offsets)
        .map(|(instance, &offset)| {
            let stats = PartitionStats::default();
            stats.committed_offset.store(offset, Ordering::Relaxed);
            stats.entries.store(instance.state().entries(), Ordering::Relaxed);
            stats
        })
        .collect();
    tracing::info!(
        operator = %config.operator.path.display(),
        partitions,
        state = %config.state.dir.display(),
        checkpoints = restore.as_ref().map_or("off", |(store, _)| store.url()),
        sink = sink.name(),
        "job started; resuming at offsets {start_offsets:?}"
    );

    let started = Instant::now();
    let destinations = Destinations { sink: &sink, dead_letters: &dead_letters, operator: operator.name() };
    let (source_report, instances) = std::thread::scope(|scope| -> Result<_> {
        let mut senders = Vec::new();
        let mut workers = Vec::new();
        for ((mut instance, stats), checkpointer) in instances.into_iter().zip(&stats).zip(&mut checkpointers) {
            let (tx, rx) = std::sync::mpsc::sync_channel(QUEUED_BATCHES);
            senders.push(tx);
            let destinations = &destinations;
            let thread = std::thread::Builder::new().name(format!("sluice-p{}", workers.len()));
            workers.push(thread.spawn_scoped(scope, move || {
                worker::run(&mut instance, rx, destinations, stats, checkpointer.as_mut()).map(|()| instance)
            })?);
        }
        let dispatcher = std::thread::Builder::new().name("sluice-source".into()).spawn_scoped(scope, {
            let (start_offsets, stats) = (&start_offsets, &stats);
            move || source.dispatch(start_offsets, &senders, stats)
        })?;
        let summary = Duration::from_secs_f64(config.report.interval_s.max(0.0));
        let mut last = (Instant::now(), 0u64);
        while !workers.iter().all(|w| w.is_finished()) {
            std::thread::sleep(Duration::from_millis(20).min(summary.max(Duration::from_millis(1))));
            if !summary.is_zero() && last.0.elapsed() >= summary {
                last = print_summary(started, last, &stats);
            }
        }
        let mut finished = Vec::new();
        for (partition, worker) in workers.into_iter().enumerate() {
            let result = worker.join().map_err(|_| anyhow!("worker of partition {partition} panicked"))?;
            finished.push(result.with_context(|| format!("partition {partition} stopped"))?);
        }
        let report = dispatcher.join().map_err(|_| anyhow!("the source panicked"))??;
        Ok((report, finished))
    })?;
    let elapsed = started.elapsed();

    let mut reports = Vec::new();
    for (partition, (mut instance, stats)) in instances.into_iter().zip(&stats).enumerate() {
        reports.push(PartitionReport {
            partition: partition as u32,
            resumed_at: start_offsets[partition],
            committed_offset: stats.committed_offset.load(Ordering::Relaxed),
            processed: stats.processed.load(Ordering::Relaxed),
            dead_letters: stats.dead_letters.load(Ordering::Relaxed),
            keys: instance.state().store().count_keys()?,
            restored_from: restored_from[partition].clone(),
            checkpoints: stats.checkpoints.load(Ordering::Relaxed),
            checkpoint_offset: stats.checkpoint_offset.load(Ordering::Relaxed),
            uploaded_bytes: stats.uploaded_bytes.load(Ordering::Relaxed),
        });
    }
    Ok(JobReport {
        elapsed,
        restore_took: restore.map(|(_, report)| report.took),
        source: source_report,
        partitions: reports,
    })
}

/// A source, opened, as the dispatcher thread reads it.
enum OpenSource {
    /// An embedded source: records the dispatcher partitions itself, and its pacing.
    Embedded(Box<dyn Iterator<Item = Result<RawRecord>> + Send>, DispatchOptions),
    /// A Kafka topic, already partitioned.
    Kafka(KafkaOptions),
}

impl OpenSource {
    /// Opens `source`; `batch_size` records at most go to a worker at once.
    fn open(source: &SourceConfig, batch_size: usize) -> Result<Self> {
        Ok(match source {
            SourceConfig::Generator { vehicles, count, duration_s, rate, seed } => OpenSource::Embedded(
                Box::new(Fleet::new(&FleetOptions { vehicles: *vehicles, count: *count, seed: *seed })),
                DispatchOptions { rate: *rate, duration: duration_s.map(Duration::from_secs_f64), batch_size },
            ),
            SourceConfig::File { path, key_field, timestamp_field, rate } => OpenSource::Embedded(
                Box::new(JsonlFile::open(path, key_field, timestamp_field)?),
                DispatchOptions { rate: *rate, duration: None, batch_size },
            ),
            SourceConfig::Kafka { brokers, topic, group, instance_id, properties, stop_when_idle_s } => {
                OpenSource::Kafka(KafkaOptions {
                    brokers: brokers.clone(),
                    topic: topic.clone(),
                    group: group.clone(),
                    instance_id: instance_id.clone(),
                    properties: properties.clone(),
                    stop_when_idle: stop_when_idle_s.map(Duration::from_secs_f64),
                    batch_size,
                })
            }
        })
    }

    /// Reads the source to its end, sending each partition's records to its worker.
    fn dispatch(
        self,
        start_offsets: &[u64],
        workers: &[SyncSender<Vec<SourceRecord>>],
        stats: &[PartitionStats],
    ) -> Result<DispatchReport> {
        match self {
            OpenSource::Embedded(records, options) => source::dispatch(records, start_offsets, workers, &options),
            OpenSource::Kafka(options) => kafka::dispatch(&options, start_offsets, workers, &|p| {
                stats[p as usize].committed_offset.load(Ordering::Relaxed)
            }),
        }
    }
}

/// Prints one running-summary line to stderr and returns the new reference point.
fn print_summary(started: Instant, (since, before): (Instant, u64), stats: &[PartitionStats]) -> (Instant, u64) {
    let processed: u64 = stats.iter().map(|s| s.processed.load(Ordering::Relaxed)).sum();
    let rate = (processed - before) as f64 / since.elapsed().as_secs_f64();
    let partitions: Vec<String> = stats
        .iter()
        .enumerate()
        .map(|(p, s)| {
            format!(
                "p{p}@{} entries={} ckpt@{}",
                s.committed_offset.load(Ordering::Relaxed),
                s.entries.load(Ordering::Relaxed),
                s.checkpoint_offset.load(Ordering::Relaxed)
            )
        })
        .collect();
    eprintln!(
        "[{:>6.1}s] {processed} records, {rate:.0} records/s | {}",
        started.elapsed().as_secs_f64(),
        partitions.join(" | ")
    );
    (Instant::now(), processed)
}
