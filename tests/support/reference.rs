//! The inputs and the expected results: generator records as JSONL (written with
//! `sluice generate`, read back with [`read_jsonl`]), and the reference fold of
//! vehicle-stats ([`Reference`]), computed here from the operator's specification
//! rather than its code, with the assertions that compare a job's outputs and state
//! against it.

use crate::binary::{run_ok, sluice};
use crate::stores::StateDump;
use anyhow::{Context, Result};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

/// Writes the generator's records to `path` with `sluice generate`.
pub fn generate(path: &Path, vehicles: u32, count: u64, seed: u64) -> Result<()> {
    let output = run_ok(sluice().args(["generate", "--vehicles", &vehicles.to_string()]).args([
        "--count",
        &count.to_string(),
        "--seed",
        &seed.to_string(),
    ]))?;
    std::fs::write(path, output.stdout)?;
    Ok(())
}

/// Writes to `path` the positions `sluice generate` makes with `args`, each changed by
/// `edit` (given its index) first; returns them.
pub fn generate_edited(path: &Path, args: &[&str], mut edit: impl FnMut(usize, &mut Value)) -> Result<Vec<Value>> {
    let generated = run_ok(sluice().arg("generate").args(args))?;
    let mut positions = Vec::new();
    for (i, line) in String::from_utf8(generated.stdout)?.lines().enumerate() {
        let mut position: Value = serde_json::from_str(line)?;
        edit(i, &mut position);
        positions.push(position);
    }
    std::fs::write(path, positions.iter().map(|p| format!("{p}\n")).collect::<String>())?;
    Ok(positions)
}

/// Sets the event time of the `i`th position to 2026-01-01 plus `i` times 100 ms: ten
/// minutes over 6,000 positions, so minutes and 5-minute windows close along a run.
pub fn every_100_ms(i: usize, position: &mut Value) {
    position["ts"] = (1_767_225_600_000u64 + 100 * i as u64).into();
}

/// The first of the keys `k0`, `k1`, … that sluice (and a Kafka producer's default
/// partitioner) puts in `partition` of `partitions`.
pub fn key_in_partition(partition: u32, partitions: u32) -> String {
    (0..)
        .map(|i| format!("k{i}"))
        .find(|key| sluice::source::partition_for(key.as_bytes(), partitions) == partition)
        .expect("some key lands in every partition")
}

/// Parses every line of a JSONL file (a missing file is empty).
pub fn read_jsonl(path: &Path) -> Result<Vec<Value>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).with_context(|| format!("{}: bad line {l}", path.display())))
        .collect()
}

/// The vehicle-stats summary of one vehicle, as the reference fold computes it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    /// Positions seen.
    pub count: u64,
    /// Mean of their speeds.
    pub mean_speed_kmh: f64,
    /// Highest of their speeds.
    pub max_speed_kmh: f64,
    /// Great-circle distance along the positions, in input order.
    pub distance_km: f64,
    /// Earliest timestamp (ms).
    pub first_seen: i64,
    /// Latest timestamp (ms).
    pub last_seen: i64,
    /// Latitude of the latest position in input order.
    pub last_lat: f64,
    /// Longitude of the latest position in input order.
    pub last_lon: f64,
}

/// The reference fold of vehicle-stats: every input's summary after it, in input
/// order, computed here from the specification, not from the operator's code.
pub struct Reference {
    /// Per input line (that is a valid position), the vehicle and its summary after it.
    pub after_each: Vec<(String, Summary)>,
    /// Each vehicle's final summary.
    pub last: BTreeMap<String, Summary>,
}

impl Reference {
    /// [`after_each`](Self::after_each) by vehicle: the summaries after each of its
    /// inputs, in input order, so the n-th output for a vehicle should be the n-th of its
    /// list.
    pub fn after_each_by_vehicle(&self) -> BTreeMap<&str, Vec<&Summary>> {
        let mut by_vehicle: BTreeMap<&str, Vec<&Summary>> = BTreeMap::new();
        for (vehicle, summary) in &self.after_each {
            by_vehicle.entry(vehicle).or_default().push(summary);
        }
        by_vehicle
    }

    /// Folds the JSONL positions in `input`, skipping lines that are not positions.
    pub fn fold(input: &Path) -> Result<Self> {
        let mut last: BTreeMap<String, Summary> = BTreeMap::new();
        let mut after_each = Vec::new();
        // Lines that are not UTF-8 are not records of the fleet: read past them.
        for line in std::fs::read(input)?.split(|&b| b == b'\n') {
            let Ok(p) = serde_json::from_slice::<Value>(line) else { continue };
            let (Some(id), Some(ts), Some(lat), Some(lon), Some(speed)) = (
                p["vehicle_id"].as_str(),
                p["ts"].as_i64(),
                p["lat"].as_f64(),
                p["lon"].as_f64(),
                p["speed_kmh"].as_f64(),
            ) else {
                continue;
            };
            let s = last.entry(id.to_string()).or_default();
            if s.count == 0 {
                s.first_seen = ts;
                s.last_seen = ts;
            } else {
                s.distance_km += great_circle_km((s.last_lat, s.last_lon), (lat, lon));
            }
            s.count += 1;
            s.mean_speed_kmh = (s.mean_speed_kmh * (s.count - 1) as f64 + speed) / s.count as f64;
            s.max_speed_kmh = s.max_speed_kmh.max(speed);
            s.first_seen = s.first_seen.min(ts);
            s.last_seen = s.last_seen.max(ts);
            (s.last_lat, s.last_lon) = (lat, lon);
            after_each.push((id.to_string(), s.clone()));
        }
        Ok(Reference { after_each, last })
    }
}

/// Haversine distance on a sphere of the mean Earth radius.
fn great_circle_km((lat1, lon1): (f64, f64), (lat2, lon2): (f64, f64)) -> f64 {
    let (p1, p2) = (lat1.to_radians(), lat2.to_radians());
    let h = ((p2 - p1) / 2.0).sin().powi(2) + p1.cos() * p2.cos() * ((lon2 - lon1).to_radians() / 2.0).sin().powi(2);
    2.0 * 6371.0088 * h.sqrt().asin()
}

/// Fails unless the operator's JSON summary equals `expected` (floats to 1e-9 relative).
pub fn assert_summary(actual: &Value, vehicle: &str, expected: &Summary, context: &str) {
    let close = |field: &str, want: f64| {
        let got = actual[field].as_f64().unwrap_or(f64::NAN);
        assert!(
            (got - want).abs() <= 1e-9 * want.abs().max(1.0),
            "{context}: vehicle {vehicle} {field} = {got}, reference {want}\n{actual}"
        );
    };
    assert_eq!(actual["vehicle_id"].as_str(), Some(vehicle), "{context}: {actual}");
    assert_eq!(actual["count"].as_u64(), Some(expected.count), "{context}: vehicle {vehicle} count\n{actual}");
    assert_eq!(actual["first_seen"].as_i64(), Some(expected.first_seen), "{context}: vehicle {vehicle}\n{actual}");
    assert_eq!(actual["last_seen"].as_i64(), Some(expected.last_seen), "{context}: vehicle {vehicle}\n{actual}");
    close("mean_speed_kmh", expected.mean_speed_kmh);
    close("max_speed_kmh", expected.max_speed_kmh);
    close("distance_km", expected.distance_km);
    close("last_lat", expected.last_lat);
    close("last_lon", expected.last_lon);
}

/// Fails unless the last of each vehicle's `outputs` (key and summary, in the order they
/// were written) is its final summary in `reference`; returns those last outputs.
pub fn assert_last_outputs<'a>(
    outputs: impl IntoIterator<Item = (&'a str, &'a Value)>,
    reference: &Reference,
    context: &str,
) -> BTreeMap<&'a str, &'a Value> {
    let mut last = BTreeMap::new();
    for (vehicle, output) in outputs {
        last.insert(vehicle, output);
    }
    for (vehicle, expected) in &reference.last {
        let output = last.get(vehicle.as_str()).unwrap_or_else(|| panic!("{context}: no output for vehicle {vehicle}"));
        assert_summary(output, vehicle, expected, context);
    }
    last
}

/// Fails unless the dumped state holds exactly the reference's final summaries.
pub fn assert_state_matches(state: &StateDump, reference: &Reference, context: &str) {
    assert_eq!(
        state.keys().collect::<Vec<_>>(),
        reference.last.keys().collect::<Vec<_>>(),
        "{context}: vehicles holding state"
    );
    for (vehicle, expected) in &reference.last {
        assert_summary(&state[vehicle]["summary"], vehicle, expected, context);
    }
}
