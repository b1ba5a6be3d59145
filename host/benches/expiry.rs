//! What an expiry costs against a record: vehicle-stats (whose `expired` emits a
//! vehicle's final summary) through the worker path, as `sluice run` runs it, over
//! 200,000 vehicles each seen once under a TTL of an hour, then one record two hours
//! later, which makes all 200,000 entries due at once: a storm of expiries, each a
//! removal, an `expired` call and an output, cut into batches at the per-batch bounds.
//!
//! It runs the storm twice: once with the 200,000 entries committed before it, once
//! with them still in the uncommitted batch (no commit between the records and the
//! storm), and reports the CPU time (every thread) per first sighting and per expiry,
//! and their ratio. Run with `./dev.sh bench`; `SLUICE_BENCH_ENTRIES` changes the
//! vehicles.

#[path = "common/worker_path.rs"]
mod worker_path;

use anyhow::Result;
use sluice::config::{StateConfig, TtlConfig};
use sluice::operator::Operator;
use sluice::operator::versions::ActiveVersion;
use sluice::operator::wasm::{Limits, WasmOperator};
use sluice::record::SourceRecord;
use sluice::state::{PartitionStore, Transaction};
use sluice::worker::Cadence;
use sluice_e2e::{bench_setting, operator_wasm};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

const T0: i64 = 1_767_225_600_000;
const TTL: Duration = Duration::from_secs(3600);

fn main() -> Result<()> {
    let entries = bench_setting("SLUICE_BENCH_ENTRIES", 200_000)?;
    let state = StateConfig::default();
    sluice::state::limit_memory(state.rocksdb_memory_mib << 20)?;
    let records: Vec<SourceRecord> = (0..entries)
        .map(|i| {
            let ts = T0 + i as i64;
            let value = format!(r#"{{"vehicle_id":"v{i}","ts":{ts},"lat":52.5,"lon":13.4,"speed_kmh":42.0}}"#);
            SourceRecord {
                partition: 0,
                offset: i,
                key: format!("v{i}").into_bytes(),
                value: value.into_bytes(),
                timestamp_ms: ts,
                headers: Vec::new(),
            }
        })
        .collect();
    let jump = {
        let ts = T0 + 2 * TTL.as_millis() as i64;
        let value = format!(r#"{{"vehicle_id":"late","ts":{ts},"lat":52.5,"lon":13.4,"speed_kmh":42.0}}"#);
        SourceRecord {
            offset: entries,
            key: b"late".to_vec(),
            value: value.into_bytes(),
            timestamp_ms: ts,
            ..records[0].clone()
        }
    };
    println!(
        "vehicle-stats, {entries} vehicles seen once under a TTL of 1 h, then a record 2 h later: {entries} expiries; \
         one partition, default limits and [state]"
    );
    println!("\nentries before the storm        CPU µs/record   CPU µs/expiry   expiry/record   storm wall s");
    for committed in [true, false] {
        let dir = tempfile::tempdir()?;
        let mut operator = vehicle_stats(dir.path())?;
        // The records alone, committed at the end: what a first sighting costs.
        let records_cpu = worker_path::run(&mut operator, &records, &state, dir.path(), Cadence::of(&state, None))?.1;
        let (storm_wall, storm_cpu) = if committed {
            worker_path::run(&mut operator, std::slice::from_ref(&jump), &state, dir.path(), Cadence::of(&state, None))?
        } else {
            // The same records again into fresh state, never committed before the
            // jump: the storm expires entries of the uncommitted batch.
            let dir = tempfile::tempdir()?;
            let mut operator = vehicle_stats(dir.path())?;
            let never = Cadence {
                commit_interval: Duration::from_secs(3600),
                commit_every: usize::MAX,
                commit_dirty_bytes: usize::MAX,
                slow_batch: None,
            };
            let all: Vec<SourceRecord> = records.iter().cloned().chain([jump.clone()]).collect();
            let (wall, cpu) = worker_path::run(&mut operator, &all, &state, dir.path(), never)?;
            (wall, cpu.saturating_sub(records_cpu))
        };
        let per_record = records_cpu.as_secs_f64() * 1e6 / entries as f64;
        let per_expiry = storm_cpu.as_secs_f64() * 1e6 / entries as f64;
        println!(
            "{:<31} {per_record:>13.2}   {per_expiry:>13.2}   {:>13.2}   {:>12.2}",
            if committed { "committed" } else { "in the uncommitted batch" },
            per_expiry / per_record,
            storm_wall.as_secs_f64()
        );
    }
    Ok(())
}

/// vehicle-stats over a partition in `dir`, entries expiring an hour after their write.
fn vehicle_stats(dir: &Path) -> Result<impl Operator> {
    let operator = WasmOperator::load(&operator_wasm("vehicle_stats"), Limits::default(), Vec::new())?;
    let ttl = TtlConfig { default: Some(TTL), ..TtlConfig::default() };
    let txn = Transaction::new(PartitionStore::open(&dir.join("state"), 0)?, 64 << 20)?.with_ttl(Arc::new(ttl))?;
    ActiveVersion::new(Arc::new(operator)).instantiate(0, txn.with_dirty_limit(64 << 20))
}
