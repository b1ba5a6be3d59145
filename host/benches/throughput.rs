//! Records/s per core of vehicle-stats over the fleet generator, with RocksDB state,
//! three ways in one run:
//!
//! 1. the WASM component through the host's worker path (what `sluice run` does);
//! 2. the same operator code compiled natively, through the same worker path;
//! 3. a raw RocksDB read-modify-write loop over the same keys (get, update a
//!    16-byte aggregate, put), the floor of what keyed state costs.
//!
//! Each runs on one thread over one partition's pre-generated records, so records/s
//! is per core. Run with `./dev.sh bench` (it builds the component first);
//! `SLUICE_BENCH_RECORDS` and `SLUICE_BENCH_VEHICLES` change the sizes.

use anyhow::Result;
use sluice::operator::wasm::{ActiveVersion, Limits, WasmOperator};
use sluice::operator::{Operator, Outcome, Output, Switch};
use sluice::record::SourceRecord;
use sluice::sink::{LineSink, Sink};
use sluice::source::generator::{Fleet, FleetOptions};
use sluice::state::{PartitionStore, Transaction};
use sluice::stats::PartitionStats;
use sluice::worker::{self, Destinations, StopSignal};
use sluice_guest::native::StateBackend;
use sluice_tests::{bench_setting, operator_wasm};
use std::cell::RefCell;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

const BATCH: usize = 512;

fn main() -> Result<()> {
    let count = bench_setting("SLUICE_BENCH_RECORDS", 1_000_000)?;
    let vehicles = bench_setting("SLUICE_BENCH_VEHICLES", 10_000)?;
    let records: Vec<SourceRecord> = Fleet::new(&FleetOptions { vehicles, count: Some(count), seed: 42 })
        .enumerate()
        .map(|(offset, raw)| {
            let raw = raw.expect("the generator does not fail");
            SourceRecord {
                partition: 0,
                offset: offset as u64,
                key: raw.key,
                value: raw.value,
                timestamp_ms: raw.timestamp_ms,
            }
        })
        .collect();
    let dir = tempfile::tempdir()?;
    println!("vehicle-stats, {count} records over {vehicles} vehicles, one partition, one thread\n");

    let wasm_path = operator_wasm("vehicle_stats");
    let limits = Limits { call_timeout: Duration::from_secs(1), memory_bytes: 64 << 20 };
    let operator = ActiveVersion::new(Arc::new(WasmOperator::load(&wasm_path, limits, Vec::new())?));
    let mut wasm = operator.instantiate(0, Transaction::new(PartitionStore::open(&dir.path().join("wasm"), 0)?)?)?;
    let wasm_rate = through_worker(&mut wasm, &records, &dir.path().join("wasm"))?;
    println!("wasm component, worker path   {wasm_rate:>12.0} records/s");

    let mut native =
        NativeVehicleStats { txn: Transaction::new(PartitionStore::open(&dir.path().join("native"), 0)?)? };
    let native_rate = through_worker(&mut native, &records, &dir.path().join("native"))?;
    println!("native Rust, worker path      {native_rate:>12.0} records/s");

    let raw_rate = raw_rocksdb(&records, &dir.path().join("raw"))?;
    println!("raw RocksDB read-modify-write {raw_rate:>12.0} records/s");
    println!("\nwasm / native      {:.2}", wasm_rate / native_rate);
    println!("wasm / raw RocksDB {:.2}", wasm_rate / raw_rate);
    Ok(())
}

/// Records/s of `operator` through [`worker::run`] with every batch already queued.
fn through_worker(operator: &mut dyn Operator, records: &[SourceRecord], dir: &Path) -> Result<f64> {
    let batches: Vec<Vec<SourceRecord>> = records.chunks(BATCH).map(<[_]>::to_vec).collect();
    let (tx, rx) = std::sync::mpsc::sync_channel(batches.len());
    for batch in batches {
        tx.send(batch)?;
    }
    drop(tx);
    let destinations = Destinations {
        sink: Sink::Lines(LineSink::file(&dir.join("out.jsonl"))?),
        dead_letters: LineSink::file(&dir.join("dead.jsonl"))?,
    };
    let started = Instant::now();
    worker::run(operator, rx, &destinations, &PartitionStats::new(0, 0, "bench"), None, &StopSignal::default(), None)?;
    Ok(records.len() as f64 / started.elapsed().as_secs_f64())
}

/// vehicle-stats compiled natively, over the partition's transaction.
struct NativeVehicleStats {
    txn: Transaction,
}

struct TransactionBackend<'a>(RefCell<&'a mut Transaction>);

impl StateBackend for TransactionBackend<'_> {
    fn get(&self, name: &str) -> Option<Vec<u8>> {
        self.0.borrow_mut().get(name).expect("reading state")
    }

    fn put(&self, name: &str, value: &[u8]) {
        self.0.borrow_mut().put(name, value.to_vec())
    }

    fn delete(&self, name: &str) {
        self.0.borrow_mut().delete(name)
    }
}

impl Operator for NativeVehicleStats {
    fn process(&mut self, record: &SourceRecord) -> Result<Outcome> {
        use sluice_guest::Operator as _;
        let input = sluice_guest::Record {
            key: record.key.clone(),
            value: record.value.clone(),
            timestamp_ms: record.timestamp_ms,
            partition: record.partition,
            offset: record.offset,
            headers: Vec::new(),
        };
        let backend = TransactionBackend(RefCell::new(&mut self.txn));
        let state = sluice_guest::State::native(&backend);
        Ok(match vehicle_stats::VehicleStats::process(input, &state) {
            Ok(outputs) => Outcome::Emitted(
                outputs.into_iter().map(|o| Output { key: o.key, value: o.value, topic: o.topic }).collect(),
            ),
            Err(e) => Outcome::Rejected(e.to_string()),
        })
    }

    fn state(&mut self) -> &mut Transaction {
        &mut self.txn
    }

    fn version(&self) -> &str {
        "vehicle_stats@native"
    }

    fn follow_deploys(&mut self) -> Result<Option<Switch>> {
        Ok(None)
    }
}

/// Records/s of get + update + put per record, straight on RocksDB.
fn raw_rocksdb(records: &[SourceRecord], dir: &Path) -> Result<f64> {
    let db = rocksdb::DB::open(&PartitionStore::options(), dir)?;
    let started = Instant::now();
    for record in records {
        let (mut count, mut sum) = match db.get(&record.key)? {
            Some(v) => (u64::from_le_bytes(v[..8].try_into()?), f64::from_le_bytes(v[8..16].try_into()?)),
            None => (0, 0.0),
        };
        count += 1;
        sum += record.timestamp_ms as f64;
        let mut value = [0u8; 16];
        value[..8].copy_from_slice(&count.to_le_bytes());
        value[8..].copy_from_slice(&sum.to_le_bytes());
        db.put(&record.key, value)?;
    }
    Ok(records.len() as f64 / started.elapsed().as_secs_f64())
}
