//! Timers (`State::set_timer`, the `fired` callback) and the SDK's windows on them,
//! through the real binary: each timer fires once, at the same record, however the run
//! is interrupted by `kill -9`; timers set from `fired` never multiply past
//! `[operator.limits] timers_per_callback`; speed-windows' windows equal a reference's.
//! (How timers fire within a batch — time order, cancelling, setting again, a failing
//! or trapping `fired` — is `host/src/operator/wasm/tests.rs`'s.)

use crate::state_ttl::probe_killed_and_clean;
use anyhow::Result;
use serde_json::{Value, json};
use sluice_e2e::*;
use std::collections::{BTreeMap, BTreeSet};

/// The probe sets a timer per key at every record, sometimes for before the key's next
/// record (it fires) and sometimes for after (the next record sets it again: it never
/// fires), and its `fired` counts each key's firings in state and emits the count:
/// after two kills and a restart, the state (timers included) and the distinct timer
/// outputs equal an uninterrupted run's. A firing lost or repeated, its write applied
/// twice, or a timer fired at another record, would show.
#[test]
fn kill_9_with_timers_that_fire_and_write_state_fires_each_once() -> Result<()> {
    let dir = tempfile::tempdir()?;
    const T0: i64 = 1_767_225_600_000;
    let input = dir.path().join("input.jsonl");
    let lines: Vec<String> = (0..30_000u64)
        .map(|i| {
            // 97 keys in turn, each every 970 ms of event time: a timer 500 ms on fires
            // before the key's next record, one 2 s on is set again by it first.
            let ts = T0 + i as i64 * 10;
            let after_ms = if (i / 97).is_multiple_of(3) { 500 } else { 2_000 };
            serde_json::json!({"vehicle_id": format!("k{}", i % 97), "ts": ts,
                "action": "timer", "name": "t", "at_ms": ts + after_ms})
            .to_string()
        })
        .collect();
    std::fs::write(&input, lines.join("\n") + "\n")?;
    let (crashed_firings, clean_firings) = probe_killed_and_clean(dir.path(), &input, "timer")?;
    // 30,000 / 97 rounds, a third of them with the short timer: about 100 per key.
    assert!(clean_firings.len() > 9_000, "{}", clean_firings.len());
    assert_eq!(crashed_firings, clean_firings, "the same firings, each once, after kills");
    Ok(())
}

/// A `fired` that sets two timers (the probe's `double`) would double the key's timers
/// at every firing — 2^n pending after n firings, from one record. Under the default
/// `timers_per_callback = 1` its second timer traps the call: a dead letter names the
/// limit, its writes (the first timer too) are dropped, and nothing fires again. With 2
/// allowed, the same six seconds fire 1 + 2 + … + 32 = 63 timers: the limit is what
/// keeps timers bounded by what records set.
#[test]
fn timers_set_from_fired_never_multiply_past_timers_per_callback() -> Result<()> {
    const T0: i64 = 1_767_225_600_000;
    let dir = tempfile::tempdir()?;
    let input = dir.path().join("input.jsonl");
    let mut lines =
        vec![json!({"vehicle_id": "a", "ts": T0, "action": "timer", "name": "double", "at_ms": T0 + 1_000})];
    // Another key moves the clock six seconds on.
    lines.extend((1..=60).map(|i| json!({"vehicle_id": "z", "ts": T0 + i * 100, "action": "count"})));
    std::fs::write(&input, lines.iter().map(|l| l.to_string() + "\n").collect::<String>())?;
    let run = |limit: Option<usize>| -> Result<(usize, Vec<Value>)> {
        let out = dir.path().join(format!("{limit:?}"));
        let mut command = run_file_job(&operator_wasm("probe"), &input, &out, 1);
        if let Some(limit) = limit {
            std::fs::create_dir_all(&out)?;
            let config = out.join("sluice.toml");
            let toml =
                format!("[operator]\npath = \"unused.wasm\"\n[operator.limits]\ntimers_per_callback = {limit}\n");
            std::fs::write(&config, toml)?;
            command.arg("--config").arg(config);
        }
        run_ok(&mut command)?;
        let fired = read_jsonl(&out.join("out.jsonl"))?.into_iter().filter(|o| o["cause"] == "timer").count();
        Ok((fired, read_jsonl(&out.join("dead.jsonl"))?))
    };
    let (fired, dead) = run(None)?;
    assert_eq!(fired, 0, "the firing that set two timers failed");
    assert_eq!(dead.len(), 1, "{dead:#?}");
    let reason = dead[0].to_string();
    assert!(reason.contains("timers_per_callback = 1"), "the dead letter names the limit: {reason}");
    let (fired, dead) = run(Some(2))?;
    assert_eq!((fired, dead.len()), (63, 0), "timers doubling every second for six seconds");
    Ok(())
}

/// speed-windows (the SDK's tumbling and hopping windows, a grace of 30 s) over
/// positions that arrive out of order — most a little behind the newest, some minutes
/// behind — in one partition: every window the clock closed is emitted once, with the
/// count, mean and maximum of the positions a reference written here assigns it, and
/// the positions late for every 5-minute window are exactly the `late` dead letters.
#[test]
fn speed_windows_over_out_of_order_positions_equal_the_reference() -> Result<()> {
    const T0: i64 = 1_767_225_600_000;
    const GRACE: i64 = 30_000;
    let dir = tempfile::tempdir()?;
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move |bound: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % bound
    };
    // (vehicle, ts, speed) in arrival order: 5 vehicles, one position a second.
    let positions: Vec<(String, i64, f64)> = (0..4_000i64)
        .map(|i| {
            let behind = match next(100) {
                0..=84 => 0,
                85..=97 => next(40_000) as i64,
                _ => 600_000,
            };
            (format!("veh-{}", next(5)), T0 + i * 1_000 - behind, next(1_300) as f64 / 10.0)
        })
        .collect();
    let input = dir.path().join("input.jsonl");
    let lines: Vec<String> = positions
        .iter()
        .map(|(v, ts, speed)| {
            json!({"vehicle_id": v, "ts": ts, "lat": 0.0, "lon": 0.0, "speed_kmh": speed}).to_string()
        })
        .collect();
    std::fs::write(&input, lines.join("\n") + "\n")?;
    let config = dir.path().join("job.toml");
    let path = |name: &str| dir.path().join(name);
    std::fs::write(
        &config,
        format!(
            "[operator]\npath = {:?}\n[operator.config]\ngrace_ms = \"{GRACE}\"\n[source]\nkind = \"file\"\npath = {:?}\n\
             [sink]\nkind = \"file\"\npath = {:?}\n[state]\ndir = {:?}\npartitions = 1\n[dead_letter]\npath = {:?}\n",
            operator_wasm("speed_windows"),
            input,
            path("out.jsonl"),
            path("state"),
            path("dead.jsonl"),
        ),
    )?;
    run_ok(sluice().arg("run").arg("--config").arg(&config))?;

    // The reference: a position goes to each window holding it that is still open (its
    // end + grace not reached by the clock, the position's own time included); a window
    // is emitted once the clock reaches its end + grace.
    type Key = (String, &'static str, i64);
    let mut windows: BTreeMap<Key, (u64, f64, f64)> = BTreeMap::new();
    let (mut clock, mut late) = (0i64, Vec::new());
    for (vehicle, ts, speed) in &positions {
        clock = clock.max(*ts);
        let mut five_minutes = false;
        for (name, size) in [("minute", 60_000), ("5min", 300_000)] {
            let last = ts - ts.rem_euclid(60_000);
            for start in (0..size / 60_000).map(|i| last - i * 60_000) {
                if clock < start + size + GRACE {
                    five_minutes |= name == "5min";
                    let w = windows.entry((vehicle.clone(), name, start)).or_insert((0, 0.0, 0.0));
                    *w = (w.0 + 1, w.1 + speed, w.2.max(*speed));
                }
            }
        }
        if !five_minutes {
            late.push(json!({"vehicle_id": vehicle, "ts": ts}));
        }
    }
    let size = |name: &str| if name == "minute" { 60_000 } else { 300_000 };
    // Each window as emitted, but its mean speed, which is compared within a rounding:
    // the guest keeps the sum in JSON state, whose floats serde_json reads back within
    // an ulp, not exactly.
    let expected: BTreeMap<String, f64> = windows
        .iter()
        .filter(|((_, name, start), _)| start + size(name) + GRACE <= clock)
        .map(|((vehicle, name, start), (count, sum, max))| {
            let end = start + size(name);
            let window = json!({"vehicle_id": vehicle, "window": name, "start": start, "end": end,
                "positions": count, "max_speed_kmh": max});
            (window.to_string(), sum / *count as f64)
        })
        .collect();

    let outputs = read_jsonl(&dir.path().join("out.jsonl"))?;
    assert!(outputs.iter().all(|o| o["cause"] == "timer"), "every window is emitted by its timer");
    let emitted: Vec<(String, f64)> = outputs
        .into_iter()
        .map(|mut o| {
            let mean = o["value"].as_object_mut().and_then(|v| v.remove("mean_speed_kmh")).and_then(|m| m.as_f64());
            (o["value"].to_string(), mean.unwrap_or(f64::NAN))
        })
        .collect();
    let distinct: BTreeSet<&String> = emitted.iter().map(|(window, _)| window).collect();
    assert_eq!((emitted.len(), distinct.len()), (expected.len(), expected.len()), "each window once");
    for (window, mean) in &emitted {
        let expected_mean = expected.get(window).unwrap_or_else(|| panic!("emitted, not expected: {window}"));
        assert!(
            (mean - expected_mean).abs() <= expected_mean.abs() * 1e-12,
            "{window}: mean {mean}, not {expected_mean}"
        );
    }
    let dead = read_jsonl(&dir.path().join("dead.jsonl"))?;
    assert!(dead.iter().all(|d| d["error"] == "late"), "{dead:#?}");
    let dead: Vec<Value> =
        dead.iter().map(|d| json!({"vehicle_id": d["value"]["vehicle_id"], "ts": d["value"]["ts"]})).collect();
    assert!(late.len() > 10, "the input has late positions");
    assert_eq!(dead, late, "the late positions, exactly");
    Ok(())
}
