//! The least work any design of speed-windows' job can do, for the benchmarks' floor
//! (docs/benchmarks.md#windows): not a window operator, a measuring instrument.
//!
//! speed-windows emits, per vehicle, a minute's window and the 5 minutes' window ending
//! at each minute boundary its positions fall before. However windows are kept (an
//! entry per window, per spec, or slices shared by both specs), a position is read into
//! state once, and each minute boundary with a position in the 5 minutes before it takes
//! a timer's firing and its outputs. This operator does only that: one state entry per
//! vehicle (a running count, sum and maximum of speeds, and its latest position's time),
//! one timer per vehicle at the next minute boundary, re-armed for the next boundary
//! while a 5 minutes' window ending there holds a position, and per firing the outputs
//! speed-windows makes there — in speed-windows' shape, from the running aggregate rather
//! than from windows merged (what slices would merge is not counted: a floor). On
//! positions in time order per vehicle it makes as many outputs as speed-windows.
use serde::{Deserialize, Serialize};
use sluice_guest::{Encoding, Operator, Output, Record, Result, State, Timer, export_operator};

const MINUTE_MS: u64 = 60_000;
const FIVE_MINUTES_MS: u64 = 300_000;

#[derive(Deserialize)]
struct Position {
    speed_kmh: f64,
}

/// A vehicle's running aggregate and its latest position's time.
#[derive(Default, Serialize, Deserialize)]
struct Speeds {
    positions: u64,
    sum_kmh: f64,
    max_kmh: f64,
    last_ms: u64,
}

/// What a firing emits, in speed-windows' shape.
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
pub struct WindowFloor;

impl Operator for WindowFloor {
    /// The cheaper encoding, as speed-windows': a floor spends no more than it must.
    const STATE_ENCODING: Encoding = Encoding::Binary;

    fn process(record: Record, state: &State<'_>) -> Result<Vec<Output>> {
        let p: Position = record.json()?;
        let at_ms = u64::try_from(record.timestamp_ms)?;
        let mut s: Speeds = state.get("speeds")?.unwrap_or_default();
        (s.positions, s.sum_kmh, s.max_kmh) = (s.positions + 1, s.sum_kmh + p.speed_kmh, s.max_kmh.max(p.speed_kmh));
        s.last_ms = s.last_ms.max(at_ms);
        state.put("speeds", &s)?;
        state.set_timer("boundary", (at_ms / MINUTE_MS + 1) * MINUTE_MS);
        Ok(Vec::new())
    }

    fn fired(timer: Timer, state: &State<'_>) -> Result<Vec<Output>> {
        let Some(s) = state.get::<Speeds>("speeds")? else { return Ok(Vec::new()) };
        // Every boundary the clock has passed, from the timer's: the clock may have
        // jumped past several, and a timer set for one it has reached would trap.
        let (mut end, now) = (timer.at_ms, state.now());
        let mut outputs = Vec::new();
        while end <= now.max(timer.at_ms) && end <= s.last_ms + FIVE_MINUTES_MS {
            if s.last_ms + MINUTE_MS >= end {
                outputs.push(summary(&timer.key, "minute", end - MINUTE_MS, end, &s)?);
            }
            outputs.push(summary(&timer.key, "5min", end.saturating_sub(FIVE_MINUTES_MS), end, &s)?);
            end += MINUTE_MS;
        }
        // The 5 minutes' window ending at the next boundary still holds the latest position.
        if end <= s.last_ms + FIVE_MINUTES_MS {
            state.set_timer("boundary", end);
        }
        Ok(outputs)
    }
}

fn summary(key: &[u8], window: &str, start: u64, end: u64, s: &Speeds) -> Result<Output> {
    let mean_speed_kmh = if s.positions == 0 { 0.0 } else { s.sum_kmh / s.positions as f64 };
    let summary = Summary {
        vehicle_id: std::str::from_utf8(key)?,
        window,
        start,
        end,
        positions: s.positions,
        mean_speed_kmh,
        max_speed_kmh: s.max_kmh,
    };
    Output::json(key.to_vec(), &summary)
}

export_operator!(WindowFloor);

/// Native unit tests: the firings and outputs speed-windows makes for the same positions.
#[cfg(test)]
mod tests {
    use super::*;
    use sluice_guest::native::MemoryState;

    fn position(ts: i64) -> Record {
        let value = serde_json::json!({"vehicle_id": "veh-1", "ts": ts, "speed_kmh": 50.0});
        Record::new("veh-1", value.to_string(), ts)
    }

    fn windows(outputs: &[Output]) -> Vec<(String, u64)> {
        outputs
            .iter()
            .map(|o| {
                let v: serde_json::Value = serde_json::from_slice(&o.value).unwrap();
                (v["window"].as_str().unwrap().to_string(), v["end"].as_u64().unwrap())
            })
            .collect()
    }

    #[test]
    fn a_position_closes_its_minute_and_the_five_windows_of_five_minutes_holding_it() -> Result<()> {
        let state = MemoryState::default();
        state.process::<WindowFloor>(position(61_000))?;
        let outputs = state.fire_until::<WindowFloor>(1_000_000)?;
        let expected = [("minute", 120_000), ("5min", 120_000), ("5min", 180_000), ("5min", 240_000)]
            .into_iter()
            .chain([("5min", 300_000), ("5min", 360_000)])
            .map(|(w, end)| (w.to_string(), end))
            .collect::<Vec<_>>();
        assert_eq!(windows(&outputs), expected);
        assert!(state.timers("veh-1").is_empty(), "no firing once no window holds a position");
        Ok(())
    }

    #[test]
    fn a_later_position_takes_over_the_boundary_timer() -> Result<()> {
        let state = MemoryState::default();
        state.process::<WindowFloor>(position(61_000))?;
        assert_eq!(
            windows(&state.fire_until::<WindowFloor>(120_000)?),
            [("minute".into(), 120_000), ("5min".into(), 120_000)]
        );
        state.process::<WindowFloor>(position(150_000))?;
        let outputs = state.fire_until::<WindowFloor>(180_000)?;
        assert_eq!(windows(&outputs), [("minute".into(), 180_000), ("5min".into(), 180_000)]);
        assert_eq!(state.timers("veh-1"), [("boundary".to_string(), 240_000)]);
        Ok(())
    }
}
