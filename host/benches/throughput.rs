//! Records/s and CPU time per record of vehicle-stats over the fleet generator, with
//! RocksDB state, several ways in one run:
//!
//! 1. the WASM component through the host's worker path (what `sluice run` does), a
//!    batch of records per call (`process-batch`);
//! 2. the same with every entry under an event-time TTL of a day, longer than the
//!    records span (expiry stamps, the expiry index kept with every write, a clock
//!    check per record), against 1 for a TTL's cost;
//! 3. the same with no limits at all — no CPU deadline (the epoch checks compiled
//!    into the guest's code), no memory cap, no per-call limits — against 1, which
//!    runs with the default limits, for what the sandbox's limits cost; and 4, the
//!    same with its instructions counted (`[operator] instructions_per_call`), for
//!    what an exact CPU bound costs; 1 to 4 alternate for three rounds and each gives
//!    its median;
//! 5. the same operator built against WIT 0.1.0, one call per record, the baseline of
//!    the batched call;
//! 6. the component with the state layer as it was before its cache and commits by
//!    time (no cache, a commit every 512 records), the baseline of those two levers;
//! 7. the same operator code compiled natively, through the same worker path and the
//!    same state layer (transaction, cache, commits);
//! 8. a raw RocksDB read-modify-write loop over the same keys (get, update a
//!    16-byte aggregate, put), the floor of what keyed state costs without a cache;
//! 9. the operator alone, compiled natively, its state in a `HashMap` and its outputs
//!    dropped: no host at all, so the ceiling of any host running this operator (its
//!    own work is parsing the input, decoding and encoding the summary).
//!
//! Each runs on one thread over one partition's pre-generated records, so records/s
//! is per core; CPU time counts every thread of the process (RocksDB's flushes and
//! compactions included). It runs twice: with 10,000 vehicles, whose state fits the
//! cache, and with 1,000,000, whose state does not. Run with `./dev.sh bench` (it
//! builds the component first); `SLUICE_BENCH_RECORDS` changes the records per run and
//! `SLUICE_BENCH_VEHICLES` runs one fleet size only.

#[path = "common/worker_path.rs"]
mod worker_path;

use anyhow::Result;
use sluice::config::{OperatorLimits, StateConfig, TtlConfig};
use sluice::operator::versions::ActiveVersion;
use sluice::operator::wasm::{Limits, WasmOperator};
use sluice::operator::{Operator, Outcome, Output, Switch};
use sluice::record::SourceRecord;
use sluice::source::generator::{Fleet, FleetOptions};
use sluice::state::{PartitionStore, Transaction};
use sluice::worker::Cadence;
use sluice_e2e::{CpuClock, bench_setting, operator_wasm};
use sluice_guest::native::StateBackend;
use std::cell::RefCell;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

fn main() -> Result<()> {
    let count = bench_setting("SLUICE_BENCH_RECORDS", 1_000_000)?;
    let fleets = match std::env::var("SLUICE_BENCH_VEHICLES") {
        Ok(_) => vec![bench_setting("SLUICE_BENCH_VEHICLES", 10_000)?],
        Err(_) => vec![10_000, 1_000_000],
    };
    let state = StateConfig::default();
    // As `sluice run` does: RocksDB's memory bounded for the whole process.
    sluice::state::limit_memory(state.rocksdb_memory_mib << 20)?;
    println!(
        "vehicle-stats, {count} records, one partition, one thread; default [state]: cache {} MiB, commits every {:?} \
         or {} records or {} MiB written, batches of {}",
        state.cache_mib,
        state.commit_interval,
        state.commit_every,
        state.commit_dirty_mib,
        state.batch_size()
    );
    for vehicles in fleets {
        run(count, vehicles, &state)?;
    }
    Ok(())
}

/// Every path over `count` records of `vehicles` vehicles.
fn run(count: u64, vehicles: u64, state: &StateConfig) -> Result<()> {
    let records: Vec<SourceRecord> =
        Fleet::new(&FleetOptions { vehicles: vehicles as u32, count: Some(count), seed: 42, churn: None })
            .enumerate()
            .map(|(offset, raw)| raw.expect("the generator does not fail").at(0, offset as u64))
            .collect();
    let dir = tempfile::tempdir()?;
    let cache_bytes = state.cache_mib << 20;
    println!("\n{vehicles} vehicles                      records/s   CPU µs/record   cache hits");

    let wasm_path = operator_wasm("vehicle_stats");
    let limits = Limits::default();
    let operator = ActiveVersion::new(Arc::new(WasmOperator::load(&wasm_path, limits.clone(), Vec::new())?));
    let load = |limits| WasmOperator::load(&wasm_path, limits, Vec::new()).map(|o| ActiveVersion::new(Arc::new(o)));
    let unlimited_limits = Limits {
        call_timeout: None,
        instructions: None,
        memory_bytes: usize::MAX,
        per_call: OperatorLimits::unlimited(),
        ..limits.clone()
    };
    let unlimited_operator = load(unlimited_limits)?;
    let counting = load(Limits { instructions: Some(u64::MAX), ..limits.clone() })?;
    // The component with and without a TTL, in alternating rounds, each taken as the
    // median of its rounds: the two differ by less than this machine drifts between
    // runs. The TTL (a day) outlasts the records' event time, so the same work is done
    // and what differs is what a TTL costs: the stamps, the index, the expiry checks.
    // (Expiries themselves: the churn bench.)
    let ttl = Arc::new(TtlConfig { default: Some(Duration::from_secs(86_400)), ..TtlConfig::default() });
    let (mut plain, mut expiring, mut unlimited, mut counted) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..3 {
        let path = dir.path().join(format!("wasm-{round}"));
        let txn = Transaction::new(PartitionStore::open(&path, 0)?, cache_bytes)?;
        plain.push(through_worker(operator.instantiate(0, txn)?, &records, state, &path)?);
        let path = dir.path().join(format!("ttl-{round}"));
        let txn = Transaction::new(PartitionStore::open(&path, 0)?, cache_bytes)?.with_ttl(ttl.clone())?;
        expiring.push(through_worker(operator.instantiate(0, txn)?, &records, state, &path)?);
        let path = dir.path().join(format!("unlimited-{round}"));
        let txn = Transaction::new(PartitionStore::open(&path, 0)?, cache_bytes)?;
        unlimited.push(through_worker(unlimited_operator.instantiate(0, txn)?, &records, state, &path)?);
        let path = dir.path().join(format!("counted-{round}"));
        let txn = Transaction::new(PartitionStore::open(&path, 0)?, cache_bytes)?;
        counted.push(through_worker(counting.instantiate(0, txn)?, &records, state, &path)?);
    }
    let (wasm, expiring) = (Measured::median(plain), Measured::median(expiring));
    let (unlimited, counted) = (Measured::median(unlimited), Measured::median(counted));
    println!("wasm component, worker path    {wasm}");
    println!("  the same, TTL 1 day (median) {expiring}");
    println!("  no limits at all (median)    {unlimited}");
    println!("  instructions counted (med.)  {counted}");

    let unbatched = WasmOperator::load(&operator_wasm("vehicle_stats_0_1_0"), limits.clone(), Vec::new())?;
    let store = PartitionStore::open(&dir.path().join("unbatched"), 0)?;
    let unbatched = ActiveVersion::new(Arc::new(unbatched)).instantiate(0, Transaction::new(store, cache_bytes)?)?;
    let unbatched = through_worker(unbatched, &records, state, &dir.path().join("unbatched"))?;
    println!("  0.1.0 build, call per record {unbatched}");

    let before = StateConfig { cache_mib: 0, commit_every: 512, ..state.clone() };
    let store = PartitionStore::open(&dir.path().join("before"), 0)?;
    let uncached = operator.instantiate(0, Transaction::new(store, 0)?)?;
    let uncached = through_worker(uncached, &records, &before, &dir.path().join("before"))?;
    println!("  no cache, commit every 512   {uncached}");

    let store = PartitionStore::open(&dir.path().join("native"), 0)?;
    let native = NativeVehicleStats { txn: Transaction::new(store, cache_bytes)? };
    let native = through_worker(native, &records, state, &dir.path().join("native"))?;
    println!("native Rust, worker path       {native}");

    let raw = raw_rocksdb(&records, &dir.path().join("raw"))?;
    println!("raw RocksDB read-modify-write  {raw}");

    let alone = operator_alone(&records)?;
    println!("operator alone, no host        {alone}");
    ratio("wasm / native", &wasm, &native);
    println!(
        "batched calls: {:.2}x records/s, {:.2}x less CPU per record",
        wasm.rate / unbatched.rate,
        unbatched.cpu / wasm.cpu
    );
    println!(
        "cache and commits by time: {:.2}x records/s, {:.2}x less CPU per record",
        wasm.rate / uncached.rate,
        uncached.cpu / wasm.cpu
    );
    ratio("TTL on / off", &expiring, &wasm);
    ratio("limits on / off", &wasm, &unlimited);
    ratio("instructions counted / not", &counted, &wasm);
    ratio("wasm / raw RocksDB", &wasm, &raw);
    ratio("native through the host / operator alone", &native, &alone);
    Ok(())
}

/// Prints `label`: `of`'s records/s over `to`'s, and the same for CPU per record (so
/// above 1 is `of` doing better either way).
fn ratio(label: &str, of: &Measured, to: &Measured) {
    println!("{label}: {:.2} records/s (CPU per record: {:.2})", of.rate / to.rate, to.cpu / of.cpu);
}

/// What one path measured.
struct Measured {
    /// Records per second of wall time.
    rate: f64,
    /// CPU time per record over every thread, µs.
    cpu: f64,
    /// The share of state reads the cache answered, when there was one.
    hits: Option<f64>,
}

impl Measured {
    /// The round of median rate.
    fn median(mut rounds: Vec<Measured>) -> Measured {
        rounds.sort_by(|a, b| a.rate.total_cmp(&b.rate));
        rounds.swap_remove(rounds.len() / 2)
    }
}

impl std::fmt::Display for Measured {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:>10.0}   {:>13.2}", self.rate, self.cpu)?;
        match self.hits {
            Some(hits) => write!(f, "   {:>9.1}%", hits * 100.0),
            None => Ok(()),
        }
    }
}

/// `operator` through [`worker_path::run`], every batch already queued; its store is
/// closed at the end, so the paths measured after it share RocksDB's memory budget
/// with nothing left over.
fn through_worker(
    mut operator: impl Operator,
    records: &[SourceRecord],
    state: &StateConfig,
    dir: &Path,
) -> Result<Measured> {
    let (wall, cpu) = worker_path::run(&mut operator, records, state, dir, Cadence::of(state, None))?;
    let (hits, misses) = operator.state().cache().hits_and_misses();
    Ok(Measured {
        rate: records.len() as f64 / wall.as_secs_f64(),
        cpu: cpu.as_secs_f64() * 1e6 / records.len() as f64,
        hits: Some(hits as f64 / (hits + misses).max(1) as f64),
    })
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

    fn put(&self, name: &str, value: &[u8], ttl: Option<std::time::Duration>) {
        match ttl {
            Some(ttl) => self.0.borrow_mut().put_with_ttl(name, value.to_vec(), ttl),
            None => self.0.borrow_mut().put(name, value.to_vec()),
        }
    }

    fn delete(&self, name: &str) {
        self.0.borrow_mut().delete(name)
    }
}

impl Operator for NativeVehicleStats {
    fn process(&mut self, record: &SourceRecord) -> Result<Outcome> {
        use sluice_guest::Operator as _;
        let input = guest_record(record);
        let backend = TransactionBackend(RefCell::new(&mut self.txn));
        let state = sluice_guest::State::native(&backend, vehicle_stats::VehicleStats::STATE_ENCODING);
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

    fn follow_deploys(&mut self, _offset: u64) -> Result<Option<Switch>> {
        Ok(None)
    }
}

/// Every key's state: (key, name) -> value.
type Entries = HashMap<(Vec<u8>, String), Vec<u8>>;

/// A key-scoped view of [`Entries`].
#[derive(Default)]
struct MapBackend {
    key: Vec<u8>,
    entries: RefCell<Entries>,
}

impl StateBackend for MapBackend {
    fn get(&self, name: &str) -> Option<Vec<u8>> {
        self.entries.borrow().get(&(self.key.clone(), name.to_string())).cloned()
    }

    /// Without a clock, nothing expires.
    fn put(&self, name: &str, value: &[u8], _ttl: Option<std::time::Duration>) {
        self.entries.borrow_mut().insert((self.key.clone(), name.to_string()), value.to_vec());
    }

    fn delete(&self, name: &str) {
        self.entries.borrow_mut().remove(&(self.key.clone(), name.to_string()));
    }
}

/// `record` as the SDK hands it to a natively compiled operator.
fn guest_record(record: &SourceRecord) -> sluice_guest::Record {
    sluice_guest::Record {
        key: record.key.clone(),
        value: record.value.clone(),
        timestamp_ms: record.timestamp_ms,
        partition: record.partition,
        offset: record.offset,
        headers: Vec::new(),
    }
}

/// vehicle-stats called natively per record over a [`MapBackend`], outputs dropped.
fn operator_alone(records: &[SourceRecord]) -> Result<Measured> {
    use sluice_guest::Operator as _;
    let mut backend = MapBackend::default();
    let mut output_bytes = 0;
    let clock = CpuClock::start()?;
    for record in records {
        backend.key.clone_from(&record.key);
        let input = guest_record(record);
        let state = sluice_guest::State::native(&backend, vehicle_stats::VehicleStats::STATE_ENCODING);
        let outputs = vehicle_stats::VehicleStats::process(input, &state).map_err(|e| anyhow::anyhow!("{e}"))?;
        output_bytes += outputs.iter().map(|o| o.value.len()).sum::<usize>();
    }
    let (wall, cpu) = clock.stop()?;
    std::hint::black_box(output_bytes);
    Ok(Measured {
        rate: records.len() as f64 / wall.as_secs_f64(),
        cpu: cpu.as_secs_f64() * 1e6 / records.len() as f64,
        hits: None,
    })
}

/// Get + update + put per record, straight on RocksDB.
fn raw_rocksdb(records: &[SourceRecord], dir: &Path) -> Result<Measured> {
    let db = rocksdb::DB::open(&PartitionStore::options(), dir)?;
    let clock = CpuClock::start()?;
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
    let (wall, cpu) = clock.stop()?;
    Ok(Measured {
        rate: records.len() as f64 / wall.as_secs_f64(),
        cpu: cpu.as_secs_f64() * 1e6 / records.len() as f64,
        hits: None,
    })
}
