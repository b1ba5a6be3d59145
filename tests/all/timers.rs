//! Timers (`State::set_timer`, the `fired` callback) through the real binary: each
//! timer fires once, at the same record, however the run is interrupted by `kill -9`.
//! (How timers fire within a batch — time order, cancelling, setting again, a failing
//! or trapping `fired` — is `host/src/operator/wasm/tests.rs`'s.)

use crate::state_ttl::probe_killed_and_clean;
use anyhow::Result;

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
