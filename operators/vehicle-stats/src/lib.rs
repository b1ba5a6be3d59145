//! Per-vehicle running aggregate: count, mean and max speed, distance travelled and
//! first/last seen, keeping only what the next record needs (no event buffer).
//!
//! Input: JSON `{"vehicle_id","ts","lat","lon","speed_kmh"}` keyed by vehicle id.
//! Output: the vehicle's updated summary as JSON, one per input.
use serde::{Deserialize, Serialize};
use sluice_guest::{Operator, Output, Record, Result, State, export_operator};

#[derive(Deserialize)]
struct Position {
    vehicle_id: String,
    ts: i64,
    lat: f64,
    lon: f64,
    speed_kmh: f64,
}

/// The state kept per vehicle, and the summary emitted for it.
#[derive(Default, Serialize, Deserialize)]
struct Summary {
    vehicle_id: String,
    count: u64,
    mean_speed_kmh: f64,
    max_speed_kmh: f64,
    distance_km: f64,
    first_seen: i64,
    last_seen: i64,
    last_lat: f64,
    last_lon: f64,
}

/// The operator; public so native tests and benchmarks can call it.
pub struct VehicleStats;

impl Operator for VehicleStats {
    fn process(record: Record, state: &State<'_>) -> Result<Vec<Output>> {
        let p: Position = record.json()?;
        let mut s: Summary = state.get("summary")?.unwrap_or_default();
        if s.count == 0 {
            (s.vehicle_id, s.first_seen, s.last_seen) = (p.vehicle_id, p.ts, p.ts);
        } else {
            s.distance_km += haversine_km(s.last_lat, s.last_lon, p.lat, p.lon);
        }
        s.count += 1;
        s.mean_speed_kmh += (p.speed_kmh - s.mean_speed_kmh) / s.count as f64;
        s.max_speed_kmh = s.max_speed_kmh.max(p.speed_kmh);
        (s.first_seen, s.last_seen) = (s.first_seen.min(p.ts), s.last_seen.max(p.ts));
        (s.last_lat, s.last_lon) = (p.lat, p.lon);
        state.put("summary", &s)?;
        Ok(vec![Output::json(record.key, &s)?])
    }
}

/// Great-circle distance between two WGS84 positions, in kilometres.
pub fn haversine_km(lat1: f64, lon1: f64, lat2: f64, lon2: f64) -> f64 {
    let (dlat, dlon) = ((lat2 - lat1).to_radians(), (lon2 - lon1).to_radians());
    let a = (dlat / 2.0).sin().powi(2) + lat1.to_radians().cos() * lat2.to_radians().cos() * (dlon / 2.0).sin().powi(2);
    6371.0088 * 2.0 * a.sqrt().asin()
}

export_operator!(VehicleStats);
