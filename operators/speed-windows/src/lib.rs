//! Average and maximum speed per vehicle over event-time windows, on the SDK's windows:
//! per minute (tumbling) and over the last 5 minutes every minute (hopping), each
//! emitted once when it closes.
//!
//! Input: JSON `{"vehicle_id","ts","lat","lon","speed_kmh"}` keyed by vehicle id (as
//! vehicle-stats reads), windowed by the record's event time — the host's, which its
//! clock moves with: a file source's `ts`, a topic's record timestamp. Output, per
//! closed window: `{"vehicle_id","window","start","end","positions","mean_speed_kmh",
//! "max_speed_kmh"}`, `window` being `minute` or `5min`,
//! marked as a timer's. With `grace_ms` in its `[operator.config]` (0 by default), a
//! window closes that long after its end and takes the positions late by up to that
//! much; a position later than that for all its windows is a `late` dead letter.
use serde::{Deserialize, Serialize};
use sluice_guest::window::{Aggregate, Window, WindowSpec};
use sluice_guest::{Encoding, Operator, Output, Record, Result, State, Timer, config_value, export_operator};
use std::sync::atomic::{AtomicU64, Ordering};

/// The config key of the windows' grace, in milliseconds.
pub const GRACE_MS: &str = "grace_ms";

/// The grace, set by `init`.
static GRACE: AtomicU64 = AtomicU64::new(0);

/// The windows, with the grace in force.
fn windows() -> [WindowSpec; 2] {
    let grace = GRACE.load(Ordering::Relaxed);
    [WindowSpec::tumbling("minute", 60_000).grace(grace), WindowSpec::hopping("5min", 300_000, 60_000).grace(grace)]
}

#[derive(Deserialize)]
struct Position {
    speed_kmh: f64,
}

/// A window's positions: their count, speed sum and maximum. (Not the vehicle: that is
/// the key, which `fired` is given.)
#[derive(Default, Clone, Serialize, Deserialize)]
struct Speeds {
    positions: u64,
    sum_kmh: f64,
    max_kmh: f64,
}

impl Aggregate for Speeds {}

impl Speeds {
    fn add(&mut self, p: &Position) {
        (self.positions, self.sum_kmh, self.max_kmh) =
            (self.positions + 1, self.sum_kmh + p.speed_kmh, self.max_kmh.max(p.speed_kmh));
    }
}

/// What a closed window emits.
#[derive(Serialize)]
struct Summary<'a> {
    vehicle_id: &'a str,
    window: &'a str,
    start: u64,
    end: u64,
    positions: u64,
    mean_speed_kmh: f64,
    max_speed_kmh: f64,
}

/// The operator.
pub struct SpeedWindows;

impl Operator for SpeedWindows {
    /// The windows' entries are read and written at every position: in the binary
    /// encoding their numbers cost no decimal text (the Python and TypeScript builds
    /// write the same bytes).
    const STATE_ENCODING: Encoding = Encoding::Binary;

    fn init(config: Vec<(String, String)>) -> Result<()> {
        GRACE.store(config_value(&config, GRACE_MS)?.unwrap_or(0), Ordering::Relaxed);
        Ok(())
    }

    fn process(record: Record, state: &State<'_>) -> Result<Vec<Output>> {
        let p: Position = record.json()?;
        let [minute, five_minutes] = windows();
        // A position late for its minute may be in time for 5-minute windows, which end
        // later: only when it is late for those too is it a late record.
        match minute.add(state, record.timestamp_ms, |w: &mut Speeds| w.add(&p)) {
            Err(e) if !e.is_late() => return Err(e),
            _ => {}
        }
        five_minutes.add(state, record.timestamp_ms, |w: &mut Speeds| w.add(&p))?;
        Ok(Vec::new())
    }

    fn fired(timer: Timer, state: &State<'_>) -> Result<Vec<Output>> {
        let mut outputs = Vec::new();
        for spec in windows() {
            for window in spec.fired::<Speeds>(state, &timer)? {
                outputs.push(summary(&timer.key, spec.name, &window)?);
            }
        }
        Ok(outputs)
    }
}

fn summary(key: &[u8], name: &str, w: &Window<Speeds>) -> Result<Output> {
    let s = &w.aggregate;
    let mean_speed_kmh = if s.positions == 0 { 0.0 } else { s.sum_kmh / s.positions as f64 };
    let summary = Summary {
        vehicle_id: std::str::from_utf8(key)?,
        window: name,
        start: w.start_ms,
        end: w.end_ms,
        positions: s.positions,
        mean_speed_kmh,
        max_speed_kmh: s.max_kmh,
    };
    Output::json(key.to_vec(), &summary)
}

export_operator!(SpeedWindows);
