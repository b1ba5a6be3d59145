//! Replaying one partition from a checkpoint through a given version, as its host would
//! have processed it (`sluice replay`).
//!
//! The checkpoint is built into a state directory of the replay's own — downloaded and
//! checked file by file against its manifest, the store left as it was — and the
//! partition's records from the checkpoint's offset on run through the version in a
//! [`PartitionWorker`], the host's own, over a [`Transaction`] with the job's TTL policy,
//! batches, commits and sandbox limits: the same clock decisions, expiries and timers
//! as the live run, the same lines in the same files. The records are the job's file,
//! partitioned as its file source does, or its Kafka topic's partition read from the
//! checkpoint's offset ([`PartitionReader`]). Nothing it does writes to the
//! checkpoint store or the operator's registry, so it runs beside the live job.
//!
//! This module owns that run and what it leaves in its output directory; comparing its
//! outputs with the live ones is [`diff`](super::diff)'s.

use super::diff::{OutputDiff, read_outputs};
use crate::checkpoint::assemble::LocalFiles;
use crate::checkpoint::{CheckpointStore, Manifest, restore};
use crate::config::{Config, TimeDomain};
use crate::objects::Objects;
use crate::operator::Operator;
use crate::operator::deploy::Sandbox;
use crate::operator::registry::Registry;
use crate::operator::registry::Switched;
use crate::operator::wasm::{WasmInstance, WasmOperator};
use crate::record::SourceRecord;
use crate::sink::{DeadLetterSink, LineSink, Sink};
use crate::source::PartitionedLog;
use crate::source::file::JsonlFile;
use crate::source::kafka::PartitionReader;
use crate::state::{StateDir, Transaction};
use crate::stats::{HostStats, PartitionStats};
use crate::worker::{Cadence, Destinations, Partition, PartitionWorker, StopSignal, queue};
use anyhow::{Context, Result, anyhow, bail};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// What to replay, through what, and where to.
#[derive(Debug, Clone)]
pub struct Replay {
    /// The job whose partition it is: its sandbox (`[operator]` limits and config), TTL
    /// policy, batches and commits (`[state]`) and keyless records (`[source]
    /// null_keys`) apply as in the job.
    pub job: Config,
    /// The job's checkpoint store (its URL), which also holds its operator's registry.
    pub store: String,
    /// The partition.
    pub partition: u32,
    /// The checkpoint to start from; `None`: the partition's newest.
    pub checkpoint: Option<u64>,
    /// The version to run (a `.wasm` file); `None`: the version the partition ran from
    /// the checkpoint's offset on (its last switch at or before it, else the one the
    /// checkpoint names), from the registry.
    pub operator: Option<PathBuf>,
    /// Where the partition's records come from.
    pub input: ReplayInput,
    /// Replay the records before this offset only; `None`: to the end of the input.
    pub until: Option<u64>,
    /// A new (or empty) directory for what the replay writes: `outputs.jsonl`,
    /// `dead-letters.jsonl`, `state.jsonl` (the final state, as `sluice state dump`
    /// shows it) and `state/` (the final state directory).
    pub out: PathBuf,
}

/// Where a replayed partition's records come from.
#[derive(Debug, Clone)]
pub enum ReplayInput {
    /// The JSONL file the job read, partitioned and numbered as the job's file source
    /// does (its `[source]` key and timestamp fields).
    File(PathBuf),
    /// The Kafka topic the job read, its partition of the same number read from the
    /// checkpoint's offset (with the job's `[source.properties]`).
    Kafka {
        /// Bootstrap servers.
        brokers: String,
        /// The topic.
        topic: String,
        /// librdkafka consumer properties.
        properties: BTreeMap<String, String>,
    },
}

/// What a replay did.
#[derive(Debug, Clone)]
pub struct Replayed {
    /// The checkpoint it started from.
    pub checkpoint: Manifest,
    /// The version that ran.
    pub version: String,
    /// Records processed.
    pub records: u64,
    /// The offset after the last record processed: the replay covers the checkpoint's
    /// offset up to here.
    pub end: u64,
    /// Where its outputs are.
    pub outputs: PathBuf,
    /// Where its dead letters are.
    pub dead_letters: PathBuf,
    /// Where its final state is, as `sluice state dump` lines.
    pub state: PathBuf,
    /// Why its outputs may differ from the live run's even with the same version: the
    /// live partition switched versions inside the range, or its clock reads the wall
    /// clock.
    pub caveats: Vec<String>,
    /// How long it took, the checkpoint's download included.
    pub took: Duration,
    /// The longest line the job's file sink can write (its outputs' bound, escaped):
    /// a longer line in a file compared is not one of its outputs.
    pub max_line_bytes: usize,
}

impl Replayed {
    /// Compares the replay's outputs with those the live job wrote to the JSONL file
    /// `live` for the same records (its other partitions' and offsets' lines ignored).
    pub fn compare(&self, live: &Path) -> Result<OutputDiff> {
        let (partition, from) = (self.checkpoint.partition, self.checkpoint.offset);
        let live = read_outputs(live, partition, from, self.end, self.max_line_bytes)?;
        let replayed = read_outputs(&self.outputs, partition, from, self.end, self.max_line_bytes)?;
        Ok(OutputDiff::of(&live, &replayed, self.records))
    }
}

/// Runs `replay` (see the module).
pub fn run(replay: &Replay) -> Result<Replayed> {
    let started = Instant::now();
    let runtime = crate::objects::runtime()?;
    let store = CheckpointStore::open_existing(&replay.store)?;
    let partitions = runtime
        .block_on(store.store_manifest())?
        .ok_or_else(|| anyhow!("{} holds no checkpoints (no sluice-checkpoints.json)", replay.store))?
        .partitions;
    let partition = replay.partition;
    if partition >= partitions {
        bail!(
            "partition {partition} does not exist: the checkpoints in {} are of {partitions} partitions",
            replay.store
        );
    }
    let id = match replay.checkpoint {
        Some(id) => id,
        None => *runtime
            .block_on(store.checkpoint_ids(partition))?
            .last()
            .ok_or_else(|| anyhow!("partition {partition} has no checkpoints in {}", replay.store))?,
    };
    let manifest = runtime
        .block_on(store.manifest(partition, id))
        .with_context(|| format!("reading checkpoint {id} of partition {partition} in {}", replay.store))?;
    let out = &replay.out;
    if std::fs::read_dir(out).is_ok_and(|mut entries| entries.next().is_some()) {
        bail!("{} is not empty: a replay writes into a new or empty directory", out.display());
    }
    // Every path in it is made new, never opened if found: a symbolic link planted since
    // the check would make the replay write elsewhere.
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let state_dir = out.join("state");
    std::fs::create_dir(&state_dir).with_context(|| format!("creating {} (it must not exist)", state_dir.display()))?;
    let state = StateDir::open(&state_dir, partitions)?;
    let db = state.partition_path(partition);
    runtime
        .block_on(restore::build(&store, &manifest, &db, &LocalFiles::default(), &Arc::new(AtomicU64::new(0))))
        .with_context(|| format!("restoring checkpoint {id} of partition {partition} from {}", replay.store))?;

    let registry = Registry::new(Objects::open(&replay.store)?, crate::operator::name_of(&manifest.operator))?;
    let switches = runtime.block_on(registry.switches(partition, manifest.offset))?;
    let (component, origin) = match &replay.operator {
        Some(path) => {
            let bytes = std::fs::read(path).with_context(|| format!("reading operator {}", path.display()))?;
            (bytes, path.display().to_string())
        }
        None => {
            // The version that ran from the checkpoint's offset on: a switch recorded at
            // or before it, else the one the checkpoint names.
            let ran = switches.range(..=manifest.offset).next_back().map_or(&manifest.operator, |(_, s)| &s.version);
            let origin = format!("version {ran}, which partition {partition} ran at offset {}", manifest.offset);
            (runtime.block_on(registry.component(ran))?, origin)
        }
    };
    let version = runtime.block_on(registry.version_of(&component))?;
    let sandbox = Sandbox::new(&replay.job.operator, state.scratch_path());
    let operator = WasmOperator::compile(&version, &component, &origin, sandbox.limits, sandbox.config)?;
    let job = &replay.job;
    let txn = Transaction::new(state.open_partition(partition)?, job.state.cache_mib << 20)?
        .with_ttl(Arc::new(job.ttl.clone()))?
        .with_dirty_limit(job.state.commit_dirty_mib << 20)
        .with_timers_limit(job.state.timers_mib << 20);
    let mut instance = WasmInstance::new(Arc::new(operator), partition, txn)?;

    let (outputs, dead_letters) = (out.join("outputs.jsonl"), out.join("dead-letters.jsonl"));
    let to = Destinations {
        sink: Sink::Lines(LineSink::new_file(&outputs)?),
        dead_letters: DeadLetterSink::Lines(LineSink::new_file(&dead_letters)?),
    };
    let stats = PartitionStats::new(manifest.offset, instance.state().entries(), instance.version());
    let records: Box<dyn Iterator<Item = Result<SourceRecord>> + Send> = match &replay.input {
        ReplayInput::File(path) => Box::new(Records::open(replay, path, partitions, manifest.offset)?),
        ReplayInput::Kafka { brokers, topic, properties } => {
            let from = (brokers.as_str(), topic.as_str(), properties);
            Box::new(PartitionReader::open(from, partition, manifest.offset, replay.until)?)
        }
    };
    run_worker(&mut instance, &to, &stats, job, records)?;

    let state_lines = out.join("state.jsonl");
    let mut file = std::io::BufWriter::new(
        std::fs::File::create_new(&state_lines)
            .with_context(|| format!("creating {} (it must not exist)", state_lines.display()))?,
    );
    instance.state().store().dump(&mut file)?;
    std::io::Write::flush(&mut file)?;
    let end = stats.committed_offset.load(Ordering::Relaxed);
    let caveats = caveats(job, switches, manifest.offset, end);
    Ok(Replayed {
        checkpoint: manifest,
        version,
        records: stats.processed.load(Ordering::Relaxed),
        end,
        outputs,
        dead_letters,
        state: state_lines,
        caveats,
        took: started.elapsed(),
        // JSON escapes a byte in at most 6 (`\u0000`), base64 in 4/3; the rest of a
        // line (partition, offset, cause, operator) is short.
        max_line_bytes: job.operator.limits.output_bytes_per_record.saturating_mul(6).saturating_add(64 << 10),
    })
}

/// Runs `operator`'s partition worker over `records`, fed in batches from a thread of
/// their own as a router would, to the end of them.
fn run_worker(
    operator: &mut dyn Operator,
    to: &Destinations,
    stats: &PartitionStats,
    job: &Config,
    records: Box<dyn Iterator<Item = Result<SourceRecord>> + Send>,
) -> Result<()> {
    let (sender, batches) = queue::bounded(job.state.queued_batches(), job.state.queued_bytes());
    let (batch_size, batch_bytes) = (job.state.batch_size(), job.state.batch_bytes());
    std::thread::scope(|scope| {
        let feeder = scope.spawn(move || -> Result<()> {
            let mut batch = Vec::new();
            let mut bytes = 0;
            for record in records {
                let record = record?;
                bytes += record.bytes();
                batch.push(record);
                if batch.len() >= batch_size || bytes >= batch_bytes {
                    sender.send(std::mem::take(&mut batch))?;
                    bytes = 0;
                }
            }
            if !batch.is_empty() {
                sender.send(batch)?;
            }
            Ok(())
        });
        let number = operator.state().store().partition();
        let outputs = to.sink.partition(&to.dead_letters, number, stats.committed_offset.load(Ordering::Relaxed))?;
        let (host, stop) = (HostStats::default(), StopSignal::default());
        let partition = Partition {
            operator,
            to,
            stats,
            host: &host,
            checkpointer: None,
            stop: &stop,
            cadence: Cadence::of(&job.state, None),
            null_keys: job.source.null_keys(),
            shadows: None,
        };
        let worked = PartitionWorker::new(partition, outputs).run(batches);
        let fed = feeder.join().map_err(|_| anyhow!("reading the replay's input panicked"))?;
        // A worker that failed dropped its queue, failing the feeder: its error is why.
        worked.and(fed)
    })
}

/// The records of one partition of an embedded source's file, from an offset on.
struct Records {
    file: JsonlFile,
    log: PartitionedLog,
    partition: u32,
    from: u64,
    until: u64,
}

impl Records {
    /// The records of `replay`'s partition in the file at `path`, of a job of
    /// `partitions` partitions, from `from` on.
    fn open(replay: &Replay, path: &Path, partitions: u32, from: u64) -> Result<Self> {
        let (key_field, timestamp_field, max_line_bytes) = match &replay.job.source {
            crate::config::SourceConfig::File { key_field, timestamp_field, max_line_bytes, .. } => {
                (key_field.clone(), timestamp_field.clone(), *max_line_bytes)
            }
            _ => (
                crate::config::default_key_field(),
                crate::config::default_timestamp_field(),
                crate::config::default_max_line_bytes(),
            ),
        };
        Ok(Records {
            file: JsonlFile::open(path, &key_field, &timestamp_field, max_line_bytes)?,
            log: PartitionedLog::new(partitions),
            partition: replay.partition,
            from,
            until: replay.until.unwrap_or(u64::MAX),
        })
    }
}

impl Iterator for Records {
    type Item = Result<SourceRecord>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let record = match self.file.next()? {
                Ok(raw) => self.log.place(raw),
                Err(e) => return Some(Err(e)),
            };
            if record.partition != self.partition || record.offset < self.from {
                continue;
            }
            return (record.offset < self.until).then_some(Ok(record));
        }
    }
}

/// Why a replay of offsets `from` to `end` of a job's partition may differ from its
/// live run even with the version that ran it, given the partition's recorded
/// `switches` of versions.
fn caveats(job: &Config, switches: BTreeMap<u64, Switched>, from: u64, end: u64) -> Vec<String> {
    // The offsets after the checkpoint's, replayed (none where nothing was).
    let after = from + 1..end.max(from + 1);
    let mut caveats: Vec<String> = switches
        .range(after.clone())
        .map(|(offset, switched)| {
            format!(
                "the live partition switched to {} at offset {offset}: one version replays it all",
                switched.version
            )
        })
        .collect();
    // The routing in force at the checkpoint, and every one after it in the range.
    let canaries = switches.range(..=from).next_back().into_iter().chain(switches.range(after));
    for (offset, canary) in canaries.filter_map(|(offset, switched)| Some((offset, switched.canary.as_ref()?))) {
        caveats.push(format!(
            "from offset {offset} the live partition ran the canary {} for {:.2}% of the keys: one version replays them all",
            canary.version,
            f64::from(canary.share) / 100.0
        ));
    }
    if job.ttl.time == TimeDomain::Processing {
        caveats
            .push("[ttl] time = \"processing\": expiries follow the wall clock, which a replay cannot repeat".into());
    }
    if job.ttl.idle_timeout.is_some() {
        caveats.push(
            "[ttl] idle_timeout: an idle partition's clock followed the wall clock, which a replay cannot repeat"
                .into(),
        );
    }
    caveats
}

#[cfg(test)]
mod tests {
    //! A replay's records and caveats on their own; a replay through the binary, its
    //! outputs and state against the live run's, is `tests/all/replay.rs`'s.

    use super::*;
    use crate::operator::registry::CanaryShare;

    fn switched(version: &str, canary: Option<(&str, u32)>) -> Switched {
        let canary = canary.map(|(version, share)| CanaryShare { version: version.to_string(), share });
        Switched { version: version.to_string(), canary }
    }

    /// A replay from a checkpoint at `from` to `end` is told of each switch inside the
    /// range (one version replays it all), of a canary in force at the checkpoint or
    /// started after it, and of clocks that followed the wall; a switch at or before the
    /// checkpoint without a canary, or after the end, says nothing.
    #[test]
    fn a_replay_names_what_it_cannot_repeat_and_nothing_else() {
        let job = Config::for_operator(Path::new("op.wasm"));
        let none = caveats(&job, BTreeMap::new(), 100, 500);
        assert!(none.is_empty(), "{none:?}");
        let switches = BTreeMap::from([
            (50, switched("op@1", None)),
            (100, switched("op@2", Some(("op@3", 2_500)))),
            (300, switched("op@4", None)),
            (600, switched("op@5", None)),
        ]);
        let said = caveats(&job, switches, 100, 500);
        assert_eq!(said.len(), 2, "{said:#?}");
        assert!(said[0].contains("switched to op@4 at offset 300"), "{said:#?}");
        assert!(said[1].contains("from offset 100 the live partition ran the canary op@3 for 25.00%"), "{said:#?}");

        let mut wall = job.clone();
        wall.ttl.time = TimeDomain::Processing;
        wall.ttl.idle_timeout = Some(Duration::from_secs(30));
        let said = caveats(&wall, BTreeMap::new(), 0, 0);
        assert!(said[0].contains("[ttl] time = \"processing\"") && said[1].contains("[ttl] idle_timeout"), "{said:#?}");
    }

    /// The file's records of one partition, numbered and keyed as the job's file source
    /// places them, from the checkpoint's offset to `until`.
    #[test]
    fn a_file_is_replayed_as_the_jobs_file_source_partitioned_it() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("input.jsonl");
        let lines: String = (0..200).map(|i| format!("{{\"vehicle_id\":\"v{}\",\"ts\":{i}}}\n", i % 17)).collect();
        std::fs::write(&path, lines)?;
        let replay = |until| Replay {
            job: Config::for_operator(Path::new("op.wasm")),
            store: String::new(),
            partition: 1,
            checkpoint: None,
            operator: None,
            input: ReplayInput::File(path.clone()),
            until,
            out: dir.path().join("out"),
        };
        // What the job's source gave partition 1, offset by offset.
        let mut log = PartitionedLog::new(3);
        let file = JsonlFile::open(
            &path,
            &crate::config::default_key_field(),
            &crate::config::default_timestamp_field(),
            crate::config::default_max_line_bytes(),
        )?;
        let mut live = Vec::new();
        for raw in file {
            let record = log.place(raw?);
            if record.partition == 1 {
                live.push(record);
            }
        }
        let replayed: Vec<SourceRecord> = Records::open(&replay(None), &path, 3, 10)?.collect::<Result<_>>()?;
        assert_eq!(replayed, live[10..], "from offset 10 to the end");
        let bounded: Vec<SourceRecord> = Records::open(&replay(Some(20)), &path, 3, 10)?.collect::<Result<_>>()?;
        assert_eq!(bounded, live[10..20], "until offset 20");
        Ok(())
    }
}
