//! One partition's records through the worker path, as `sluice run` runs them: what the
//! benches that time that path share (each includes it as `mod worker_path`).

use anyhow::Result;
use sluice::config::{NullKeys, StateConfig};
use sluice::operator::Operator;
use sluice::record::SourceRecord;
use sluice::sink::{DeadLetterSink, LineSink, Sink};
use sluice::stats::{HostStats, PartitionStats};
use sluice::worker::{self, Cadence, Destinations, Partition, PartitionWorker, StopSignal};
use sluice_e2e::CpuClock;
use std::path::Path;
use std::time::Duration;

/// `records` (of partition 0) through a [`PartitionWorker`] with every batch of `state`'s
/// size queued before it starts, committing as `cadence` says and at the end, outputs
/// to `dir/out.jsonl` and dead letters to `dir/dead.jsonl`: its wall and CPU time
/// (every thread of the process).
pub fn run(
    operator: &mut dyn Operator,
    records: &[SourceRecord],
    state: &StateConfig,
    dir: &Path,
    cadence: Cadence,
) -> Result<(Duration, Duration)> {
    let batches: Vec<Vec<SourceRecord>> = records.chunks(state.batch_size()).map(<[_]>::to_vec).collect();
    let (tx, rx) = worker::queue::bounded(batches.len(), usize::MAX);
    for batch in batches {
        tx.send(batch)?;
    }
    drop(tx);
    let destinations = Destinations {
        sink: Sink::Lines(LineSink::file(&dir.join("out.jsonl"), true)?),
        dead_letters: DeadLetterSink::Lines(LineSink::file(&dir.join("dead.jsonl"), true)?),
    };
    let first = records[0].offset;
    let stats = PartitionStats::new(first, 0, "bench");
    let outputs = destinations.sink.partition(&destinations.dead_letters, 0, first)?;
    let clock = CpuClock::start()?;
    let (stop, host) = (StopSignal::default(), HostStats::default());
    let partition = Partition {
        operator,
        to: &destinations,
        stats: &stats,
        host: &host,
        checkpointer: None,
        stop: &stop,
        cadence,
        null_keys: NullKeys::default(),
        shadows: None,
    };
    PartitionWorker::new(partition, outputs).run(rx)?;
    clock.stop()
}
