//! Per-vehicle running aggregate: count, mean and max speed, distance travelled and
//! first/last seen, keeping only what the next record needs (no event buffer).
//!
//! Input: JSON `{"vehicle_id","ts","lat","lon","speed_kmh"}` keyed by vehicle id.
//! Output: the vehicle's updated summary as JSON, one per input.
//!
//! With `left_fleet_after_ms` in its `[operator.config]`, a vehicle's summary expires
//! that long (in the host's clock, event time by default) after the vehicle's last
//! position, and the operator then emits the final summary with `left_fleet_at` set:
//! the vehicle left the fleet, and its state is gone.
//!
//! A position may carry a `note`, any string (a device's last report, say): the summary
//! keeps the latest one. The group benchmark (`host/benches/group.rs`) gives each vehicle
//! a note of random text to make the state as large as it measures.
//!
//! Built with `--features v2`, it is version 2, which adds a field to the state:
//! hot-deployed over version 1, it reads the summaries version 1 wrote and carries
//! them on (see `Summary::idle_count`), and it stores them in the SDK's binary encoding
//! where version 1 writes JSON. Deploying a new version never migrates state;
//! the new version reads the old one's values, so new fields need a default.
use serde::{Deserialize, Serialize};
use sluice_guest::{Encoding, Error, Operator, Output, Record, Result, State, export_operator};
use std::sync::atomic::{AtomicU64, Ordering};

/// The config key of the "left the fleet" expiry, in milliseconds.
pub const LEFT_FLEET_AFTER_MS: &str = "left_fleet_after_ms";

/// How long after its last position a vehicle has left the fleet, in ms; 0: never.
/// Set by `init`, once per instance.
static LEFT_FLEET_AFTER: AtomicU64 = AtomicU64::new(0);

/// What is emitted when a vehicle's summary expires: the final summary, and when.
#[derive(Serialize)]
struct LeftFleet {
    left_fleet_at: u64,
    #[serde(flatten)]
    summary: Summary,
}

#[derive(Deserialize)]
struct Position {
    vehicle_id: String,
    ts: i64,
    lat: f64,
    lon: f64,
    speed_kmh: f64,
    #[serde(default)]
    note: Option<String>,
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
    /// The latest note a position carried; absent until one does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    note: Option<String>,
    /// Version 2: positions reported below [`IDLE_KMH`]. A summary version 1 wrote has
    /// no such field, and `serde(default)` reads it as 0: version 2 continues version
    /// 1's count, mean and distance, and counts idle positions from its deploy on.
    /// (Rolled back, version 1 ignores the field and drops it at its next write.)
    #[cfg(feature = "v2")]
    #[serde(default)]
    idle_count: u64,
}

/// Below this speed a vehicle counts as idle (version 2).
#[cfg(feature = "v2")]
pub const IDLE_KMH: f64 = 5.0;

/// The operator; public so native tests and benchmarks can call it.
pub struct VehicleStats;

impl Operator for VehicleStats {
    /// Version 2 stores its summaries in the SDK's binary encoding, version 1 as JSON:
    /// each reads what the other wrote, so a deploy or a rollback between them needs no
    /// migration.
    #[cfg(feature = "v2")]
    const STATE_ENCODING: Encoding = Encoding::Binary;

    fn init(config: Vec<(String, String)>) -> Result<()> {
        // Other keys are ignored: one `[operator.config]` may serve several operators.
        let Some(ms) = sluice_guest::config_value::<u64>(&config, LEFT_FLEET_AFTER_MS)? else { return Ok(()) };
        if cfg!(feature = "wit-0-1-0") {
            return Err(Error::msg(format!("{LEFT_FLEET_AFTER_MS} needs a build against WIT 0.1.2")));
        }
        LEFT_FLEET_AFTER.store(ms, Ordering::Relaxed);
        Ok(())
    }

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
        if p.note.is_some() {
            s.note = p.note;
        }
        #[cfg(feature = "v2")]
        if p.speed_kmh < IDLE_KMH {
            s.idle_count += 1;
        }
        let summary = serde_json::to_vec(&s)?;
        let left_fleet_after = LEFT_FLEET_AFTER.load(Ordering::Relaxed);
        match (Self::STATE_ENCODING, left_fleet_after) {
            // The summary is both the state and the output: serialized once for both.
            (Encoding::Json, 0) => state.put_bytes("summary", &summary),
            (Encoding::Binary, 0) => state.put("summary", &s)?,
            #[cfg(not(feature = "wit-0-1-0"))]
            (Encoding::Json, ms) => state.put_bytes_with_ttl("summary", &summary, std::time::Duration::from_millis(ms)),
            #[cfg(not(feature = "wit-0-1-0"))]
            (Encoding::Binary, ms) => state.put_with_ttl("summary", &s, std::time::Duration::from_millis(ms))?,
            #[cfg(feature = "wit-0-1-0")]
            (_, _) => unreachable!("init refuses {LEFT_FLEET_AFTER_MS} in a 0.1.0 build"),
        }
        Ok(vec![Output::new(record.key, summary)])
    }

    /// The vehicle left the fleet (or the host's `[ttl]` expired its summary): its
    /// final summary.
    fn expired(entry: sluice_guest::Expired, _state: &State<'_>) -> Result<Vec<Output>> {
        let summary: Summary = entry.value()?;
        let left = LeftFleet { left_fleet_at: entry.expired_at_ms, summary };
        Ok(vec![Output::json(entry.key, &left)?])
    }
}

/// Great-circle distance between two WGS84 positions, in kilometres.
pub fn haversine_km(lat1: f64, lon1: f64, lat2: f64, lon2: f64) -> f64 {
    let (dlat, dlon) = ((lat2 - lat1).to_radians(), (lon2 - lon1).to_radians());
    let a = (dlat / 2.0).sin().powi(2) + lat1.to_radians().cos() * lat2.to_radians().cos() * (dlon / 2.0).sin().powi(2);
    6371.0088 * 2.0 * a.sqrt().asin()
}

export_operator!(VehicleStats);

/// Native unit tests: the operator's logic against the SDK's in-memory state, no
/// sandbox, no host.
#[cfg(test)]
mod tests {
    use super::*;
    use sluice_guest::native::MemoryState;

    fn position(ts: i64, lat: f64, speed_kmh: f64) -> Record {
        let value =
            serde_json::json!({"vehicle_id": "veh-1", "ts": ts, "lat": lat, "lon": 4.0, "speed_kmh": speed_kmh});
        Record::new("veh-1", value.to_string(), ts)
    }

    #[test]
    fn a_summary_folds_each_position_into_count_mean_max_and_distance() -> Result<()> {
        let state = MemoryState::default();
        state.process::<VehicleStats>(position(1_000, 52.0, 30.0))?;
        let outputs = state.process::<VehicleStats>(position(2_000, 52.01, 60.0))?;
        let summary: serde_json::Value = serde_json::from_slice(&outputs[0].value)?;
        assert_eq!(summary["count"], 2);
        assert_eq!(summary["mean_speed_kmh"], 45.0);
        assert_eq!(summary["max_speed_kmh"], 60.0);
        assert_eq!((summary["first_seen"].clone(), summary["last_seen"].clone()), (1_000.into(), 2_000.into()));
        // 0.01° of latitude is about 1.11 km.
        let distance = summary["distance_km"].as_f64().unwrap_or_default();
        assert!((distance - 1.112).abs() < 0.001, "{distance}");
        let stored: Option<serde_json::Value> = state.get("veh-1", "summary")?;
        assert_eq!(stored, Some(summary), "the state is the summary emitted");
        assert!(stored.unwrap().get("note").is_none(), "no note until a position carries one");
        let noted = r#"{"vehicle_id":"veh-1","ts":3000,"lat":52.01,"lon":4.0,"speed_kmh":1.0,"note":"n1"}"#;
        state.process::<VehicleStats>(Record::new("veh-1", noted, 3_000))?;
        state.process::<VehicleStats>(position(4_000, 52.01, 1.0))?;
        let stored: Option<serde_json::Value> = state.get("veh-1", "summary")?;
        assert_eq!(stored.unwrap()["note"], "n1", "the latest note is kept");
        let poison = Record::new("veh-1", "not json", 3_000);
        assert!(state.process::<VehicleStats>(poison).is_err(), "a record that is not a position is rejected");
        Ok(())
    }
}
