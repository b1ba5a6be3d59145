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
use std::path::Path;

/// The probe sets a timer per key at every record, sometimes for before the key's next
/// record (it fires) and sometimes for after (the next record sets it again: it never
/// fires), and its `fired` counts each key's firings in state and emits the count:
/// after two kills and a restart, the state (timers included) and the distinct timer
/// outputs equal an uninterrupted run's. A firing lost or repeated, its write applied
/// twice, or a timer fired at another record, would show.
#[test]
fn kill_9_with_timers_that_fire_and_write_state_fires_each_once() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let input = dir.path().join("input.jsonl");
    std::fs::write(&input, probe_timer_lines(30_000))?;
    let (crashed_firings, clean_firings) = probe_killed_and_clean(dir.path(), &input, "timer")?;
    // 30,000 / 97 rounds, a third of them with the short timer: about 100 per key.
    assert!(clean_firings.len() > 9_000, "{}", clean_firings.len());
    assert_eq!(crashed_firings, clean_firings, "the same firings, each once, after kills");
    Ok(())
}

/// The probe's input for [`kill_9_with_timers_that_fire_and_write_state_fires_each_once`]:
/// `count` JSON lines over 97 keys in turn, each every 970 ms of event time, setting a
/// timer 500 ms on (it fires before the key's next record) a third of the rounds, and
/// one 2 s on (the next record sets it again first) the others.
fn probe_timer_lines(count: u64) -> String {
    const T0: i64 = 1_767_225_600_000;
    (0..count)
        .map(|i| {
            let ts = T0 + i as i64 * 10;
            let after_ms = if (i / 97).is_multiple_of(3) { 500 } else { 2_000 };
            let line = json!({"vehicle_id": format!("k{}", i % 97), "ts": ts,
                "action": "timer", "name": "t", "at_ms": ts + after_ms});
            line.to_string() + "\n"
        })
        .collect()
}

/// A state directory of format 2 — timers kept as empty values expiring at their time,
/// indexed with the expiring values — holding pending timers is migrated when a job
/// opens it, and goes on as if it never was in format 2: the probe's timers over the
/// first half of the input, the directory rewritten as format 2 wrote it, then the
/// whole input; the state (timers included) and every firing equal a run that never
/// was in format 2.
#[test]
fn state_of_format_2_with_pending_timers_is_migrated_and_each_timer_fires_once() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    let (half, whole) = (dir.join("half.jsonl"), dir.join("whole.jsonl"));
    std::fs::write(&half, probe_timer_lines(10_000))?;
    std::fs::write(&whole, probe_timer_lines(20_000))?;
    let job = |state: &str, input: &Path| {
        let mut command = run_file_job(&operator_wasm("probe"), input, dir, 2);
        command.arg("--output").arg(dir.join(format!("{state}.out.jsonl")));
        command.arg("--state-dir").arg(dir.join(state));
        command
    };
    run_ok(&mut job("migrated", &half))?;
    let pending = downgrade_timers_to_format_2(&dir.join("migrated"), 2)?;
    assert!(pending > 50, "{pending} timers pending when the directory was rewritten");
    let log = run_ok(job("migrated", &whole).env("SLUICE_LOG", "info"))?;
    let log = String::from_utf8_lossy(&log.stderr);
    assert!(log.contains("is in format 2: migrating it to 3") && log.contains("timers moved"), "{log}");
    run_ok(&mut job("clean", &whole))?;
    assert_eq!(dump_state(&dir.join("migrated"))?, dump_state(&dir.join("clean"))?, "state, timers included");
    let firings = |state: &str| -> Result<BTreeSet<String>> {
        let outputs = read_jsonl(&dir.join(format!("{state}.out.jsonl")))?;
        Ok(outputs.into_iter().filter(|o| o["cause"] == "timer").map(|o| o.to_string()).collect())
    };
    let clean = firings("clean")?;
    assert!(clean.len() > 6_000, "{}", clean.len());
    assert_eq!(firings("migrated")?, clean, "the same firings, each once");
    Ok(())
}

/// Rewrites the state directory `state` as state format 2 kept timers: each an empty
/// value under its entry key expiring at its time, with an expiry index entry, and no
/// timers' column family; format 2 recorded in the directory and in each database.
/// Returns how many timers it moved.
fn downgrade_timers_to_format_2(state: &Path, partitions: u32) -> Result<usize> {
    let manifest = state.join("sluice-state.json");
    let mut recorded: Value = serde_json::from_slice(&std::fs::read(&manifest)?)?;
    recorded["format"] = 2.into();
    std::fs::write(&manifest, serde_json::to_vec(&recorded)?)?;
    let mut moved = 0;
    for partition in 0..partitions {
        let path = state.join(format!("partition-{partition:04}"));
        let mut db = rocksdb::DB::open_cf(&rocksdb::Options::default(), &path, ["meta", "expiry", "timers"])?;
        let timers = db.cf_handle("timers").expect("opened with it");
        let timers = db.iterator_cf(timers, rocksdb::IteratorMode::Start).collect::<Result<Vec<_>, _>>()?;
        for (entry, at) in &timers {
            // The expiry header: 1, then the time, big-endian; no value after it.
            db.put(entry, [&[1u8][..], at].concat())?;
            let expiry = db.cf_handle("expiry").expect("opened with it");
            db.put_cf(expiry, [&at[..], entry].concat(), b"")?;
        }
        moved += timers.len();
        let meta = db.cf_handle("meta").expect("opened with it");
        db.put_cf(meta, b"format", 2u32.to_be_bytes())?;
        db.drop_cf("timers")?;
    }
    Ok(moved)
}

/// Timers are held in memory, bounded by `[state] timers_mib`: with 1 MiB a partition,
/// 9,000 keys each setting a timer for later fill it, and the records whose timer
/// would pass it go to the dead letters naming the limit, their writes dropped — the
/// job goes on, and the timers it holds fire once each.
#[test]
fn timers_past_timers_mib_cost_their_records_and_nothing_else() -> Result<()> {
    const T0: i64 = 1_767_225_600_000;
    let dir = tempfile::tempdir()?;
    let input = dir.path().join("input.jsonl");
    let mut lines: Vec<Value> = (0..9_000)
        .map(|i| json!({"vehicle_id": format!("k{i}"), "ts": T0, "action": "timer", "name": "t", "at_ms": T0 + 1_000}))
        .collect();
    // Another key moves the clock past every timer.
    lines.push(json!({"vehicle_id": "z", "ts": T0 + 5_000, "action": "count"}));
    std::fs::write(&input, lines.iter().map(|l| l.to_string() + "\n").collect::<String>())?;
    let config = dir.path().join("sluice.toml");
    std::fs::write(&config, "[operator]\npath = \"unused.wasm\"\n[state]\ntimers_mib = 1\n")?;
    run_ok(run_file_job(&operator_wasm("probe"), &input, dir.path(), 1).arg("--config").arg(&config))?;
    let dead = read_jsonl(&dir.path().join("dead.jsonl"))?;
    assert!(dead.len() > 500 && dead.len() < 2_000, "{} dead letters", dead.len());
    assert!(dead.iter().all(|d| d.to_string().contains("[state] timers_mib")), "{:#}", dead[0]);
    let fired = read_jsonl(&dir.path().join("out.jsonl"))?.into_iter().filter(|o| o["cause"] == "timer").count();
    assert_eq!(fired, 9_000 - dead.len(), "every timer held fired, once");
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
