//! A deterministic fleet of vehicles reporting their positions.
//!
//! The same [`FleetOptions`] always produce the same records in the same order, so a
//! restarted job regenerates the log and resumes each partition at the offset stored
//! with its state, exactly as it would re-read a Kafka topic.
//!
//! With churn, vehicles leave the fleet and new ones join in their place, so the
//! number of distinct vehicles seen grows without bound while the fleet's size stays:
//! the workload whose state must expire.

use crate::record::RawRecord;
use anyhow::Result;

/// Event time of the first record: 2026-01-01T00:00:00Z.
const START_MS: i64 = 1_767_225_600_000;
/// Event time between consecutive records of the fleet.
const STEP_MS: i64 = 10;

/// The fleet to simulate.
#[derive(Debug, Clone, PartialEq)]
pub struct FleetOptions {
    /// Number of vehicles (distinct keys).
    pub vehicles: u32,
    /// Records to produce; `None` is unbounded.
    pub count: Option<u64>,
    /// Seed of the pseudo-random sequence.
    pub seed: u64,
    /// Every this many records one vehicle, at random, leaves the fleet for good and
    /// a new one joins; `None`: the fleet never changes.
    pub churn: Option<u64>,
}

/// An iterator over the fleet's position reports: JSON
/// `{"vehicle_id","ts","lat","lon","speed_kmh"}` keyed by vehicle id.
pub struct Fleet {
    rng: SplitMix64,
    vehicles: Vec<Vehicle>,
    produced: u64,
    count: Option<u64>,
    churn: Option<u64>,
    /// Vehicles that ever joined: the next one's number.
    joined: u64,
}

struct Vehicle {
    id: String,
    lat: f64,
    lon: f64,
    heading_rad: f64,
    speed_kmh: f64,
    last_ms: i64,
}

impl Fleet {
    /// A fleet whose vehicles start spread around Amsterdam.
    pub fn new(options: &FleetOptions) -> Self {
        let mut rng = SplitMix64(options.seed);
        let vehicles = (0..options.vehicles.max(1)).map(|i| Vehicle::new(u64::from(i), START_MS, &mut rng)).collect();
        let (count, churn) = (options.count, options.churn.filter(|&every| every > 0));
        Fleet { rng, vehicles, produced: 0, count, churn, joined: u64::from(options.vehicles.max(1)) }
    }

    /// Vehicles that ever reported or will first report next: the fleet's size plus
    /// those that left.
    pub fn distinct_vehicles(&self) -> u64 {
        self.joined
    }
}

impl Vehicle {
    /// Vehicle number `number`, joining at `now_ms` somewhere around Amsterdam.
    fn new(number: u64, now_ms: i64, rng: &mut SplitMix64) -> Self {
        Vehicle {
            id: format!("veh-{number:05}"),
            lat: 52.37 + (rng.unit() - 0.5),
            lon: 4.90 + (rng.unit() - 0.5),
            heading_rad: rng.unit() * std::f64::consts::TAU,
            speed_kmh: rng.unit() * 90.0,
            last_ms: now_ms,
        }
    }
}

impl Iterator for Fleet {
    type Item = Result<RawRecord>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.count.is_some_and(|count| self.produced >= count) {
            return None;
        }
        let ts = START_MS + self.produced as i64 * STEP_MS;
        if self.churn.is_some_and(|every| self.produced > 0 && self.produced.is_multiple_of(every)) {
            let leaving = (self.rng.next_u64() % self.vehicles.len() as u64) as usize;
            self.vehicles[leaving] = Vehicle::new(self.joined, ts, &mut self.rng);
            self.joined += 1;
        }
        self.produced += 1;
        let index = (self.rng.next_u64() % self.vehicles.len() as u64) as usize;
        let (turn, accel) = (self.rng.unit() - 0.5, self.rng.unit() - 0.5);
        let v = &mut self.vehicles[index];
        let hours = (ts - v.last_ms) as f64 / 3_600_000.0;
        let km = v.speed_kmh * hours;
        v.lat += km / 111.2 * v.heading_rad.cos();
        v.lon += km / (111.2 * v.lat.to_radians().cos()) * v.heading_rad.sin();
        v.heading_rad += turn;
        v.speed_kmh = (v.speed_kmh + accel * 20.0).clamp(0.0, 130.0);
        v.last_ms = ts;
        let value = format!(
            r#"{{"vehicle_id":"{}","ts":{ts},"lat":{:.6},"lon":{:.6},"speed_kmh":{:.2}}}"#,
            v.id, v.lat, v.lon, v.speed_kmh
        );
        Some(Ok(RawRecord { key: v.id.clone().into_bytes(), value: value.into_bytes(), timestamp_ms: ts }))
    }
}

/// SplitMix64: tiny, fast and fixed here forever, so a seed's records never change
/// with a dependency upgrade.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A uniform float in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(seed: u64) -> Vec<Vec<u8>> {
        Fleet::new(&FleetOptions { vehicles: 10, count: Some(50), seed, churn: None })
            .map(|r| r.unwrap().value)
            .collect()
    }

    #[test]
    fn with_churn_vehicles_leave_and_new_ones_join_while_the_fleet_keeps_its_size() {
        let mut fleet = Fleet::new(&FleetOptions { vehicles: 10, count: Some(10_000), seed: 1, churn: Some(100) });
        let keys: Vec<Vec<u8>> = fleet.by_ref().map(|r| r.unwrap().key).collect();
        assert_eq!(fleet.distinct_vehicles(), 10 + 99, "one joins every 100 records after the first");
        let distinct: std::collections::HashSet<&Vec<u8>> = keys.iter().collect();
        assert!(distinct.len() > 100, "{}", distinct.len());
        // The last 1,000 records come from at most the 10 vehicles of the fleet then.
        let recent: std::collections::HashSet<&Vec<u8>> = keys[9_000..].iter().collect();
        assert!(recent.len() <= 10 + 10, "{}", recent.len());
        // Without churn, the records are what they always were.
        let plain = Fleet::new(&FleetOptions { vehicles: 10, count: Some(50), seed: 7, churn: None });
        assert_eq!(plain.map(|r| r.unwrap().value).collect::<Vec<_>>(), values(7));
    }

    #[test]
    fn the_same_seed_gives_the_same_records() {
        assert_eq!(values(7), values(7));
        assert_ne!(values(7), values(8));
        assert_eq!(values(7).len(), 50);
    }
}
