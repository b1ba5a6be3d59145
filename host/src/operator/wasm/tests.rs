use super::batch::run_length;
use super::*;
use crate::state::PartitionStore;
use std::sync::atomic::Ordering;

/// A record asking the probe to do `action` (a JSON object's fields) for `key`.
fn probe_record(offset: u64, key: &str, action: &str) -> SourceRecord {
    let value = format!("{{{action}}}").into_bytes();
    SourceRecord { partition: 0, offset, key: key.as_bytes().to_vec(), value, timestamp_ms: 0, headers: Vec::new() }
}

/// Has the probe do `action` for the record at `offset`, one call per record.
fn call(instance: &mut WasmInstance, offset: u64, action: &str) -> Result<Outcome> {
    let record = probe_record(offset, "k", &format!(r#""action":"{action}""#));
    Ok(crate::operator::process_each(instance, &[record])?.remove(0))
}

fn probe(limits: Limits, dir: &Path) -> Result<WasmInstance> {
    let probe = Arc::new(WasmOperator::load(&sluice_e2e::operator_wasm("probe"), limits, Vec::new())?);
    let txn = Transaction::new(PartitionStore::open(dir, 0)?, 1 << 20)?;
    let instance = WasmInstance::new(probe, 0, txn)?;
    assert!(instance.operator.exports.process_batch.is_some(), "the probe is built against 0.1.1 and takes batches");
    Ok(instance)
}

/// Each outcome in one line: the output, or how the record failed and the first
/// line of why.
fn outcome_lines(outcomes: &[Outcome]) -> Vec<String> {
    let first_line = |reason: &str| reason.lines().next().unwrap_or_default().to_string();
    outcomes
        .iter()
        .map(|outcome| match outcome {
            Outcome::Emitted(outputs) => String::from_utf8_lossy(&outputs[0].value).into_owned(),
            Outcome::Rejected(reason) => format!("rejected: {}", first_line(reason)),
            Outcome::Late(reason) => format!("late: {}", first_line(reason)),
            Outcome::Trapped { reason, .. } => format!("trapped: {}", first_line(reason)),
            Outcome::NullKey => "no key".to_string(),
        })
        .collect()
}

/// Each expiration of `processed` in one line: the key, the offset of the record it
/// came before, the time, and the outcome's line.
fn expiration_lines(processed: &Processed) -> Vec<(String, u64, u64, String)> {
    processed
        .expirations
        .iter()
        .map(|e| {
            let key = String::from_utf8_lossy(&e.entry.key).into_owned();
            (key, e.offset, e.entry.expired_at_ms, outcome_lines(std::slice::from_ref(&e.outcome)).remove(0))
        })
        .collect()
}

#[test]
fn a_batched_call_costs_a_failing_or_trapping_record_only_its_own_writes() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut instance = probe(
        Limits { call_timeout: Some(Duration::from_millis(300)), memory_bytes: 16 << 20, ..Limits::default() },
        dir.path(),
    )?;
    let actions = [
        ("a", "count"),
        ("a", "count"),
        ("a", "put-then-panic"),
        ("b", "count"),
        ("a", "count"),
        ("a", "put-then-fail"),
        ("a", "spin"),
        ("a", "count"),
        ("b", "count"),
        ("a", "hog"),
        ("a", "count"),
    ];
    let records: Vec<SourceRecord> = (0..)
        .zip(actions)
        .map(|(offset, (key, action))| probe_record(offset, key, &format!(r#""action":"{action}""#)))
        .collect();
    let outcomes = instance.process_batch(&records)?.outcomes;
    let lines = outcome_lines(&outcomes);
    // Each count is one more than the last good record of its key left: no record
    // ran twice, and no failed record's write (a count of 1,000,000) was seen.
    let expected = [
        r#"{"count":1}"#,
        r#"{"count":2}"#,
        "trapped: panicked at ",
        r#"{"count":1}"#,
        r#"{"count":3}"#,
        "rejected: probe fails after a write",
        "trapped: call exceeded its CPU deadline of 300ms",
        r#"{"count":4}"#,
        r#"{"count":2}"#,
        "trapped: operator exceeded its memory limit of 16 MiB",
        r#"{"count":5}"#,
    ];
    assert_eq!(lines.len(), expected.len(), "{lines:#?}");
    for (line, expected) in lines.iter().zip(expected) {
        assert!(line.starts_with(expected), "{line:?} is not {expected:?} in {lines:#?}");
    }
    Ok(())
}

#[test]
fn a_call_past_one_of_its_limits_fails_naming_it_and_keeps_none_of_its_writes() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let per_call = OperatorLimits {
        outputs_per_record: 10,
        output_bytes_per_record: 1_000,
        writes_per_record: 5,
        written_bytes_per_record: 1_500,
        reads_per_record: 20,
        state_value_bytes: 500,
        state_name_bytes: 16,
        output_topics: vec!["alerts".into()],
        ..OperatorLimits::default()
    };
    let mut instance = probe(Limits { per_call, ..Limits::default() }, dir.path())?;
    let passed = |limit: &str| format!("trapped: operator passed its limit [operator.limits] {limit}");
    let cases = [
        (r#""action":"count""#, r#"{"count":1}"#.to_string()),
        (r#""action":"outputs","count":10,"bytes":10"#, r#""oooooooooo""#.to_string()),
        (r#""action":"outputs","count":11,"bytes":1"#, passed("outputs_per_record = 10 (reached 11)")),
        (r#""action":"outputs","count":1,"bytes":1000"#, passed("output_bytes_per_record = 1000")),
        (r#""action":"outputs","count":1,"bytes":1,"topic":"alerts""#, r#""o""#.to_string()),
        (
            r#""action":"outputs","count":1,"bytes":1,"topic":"positions""#,
            r#"trapped: operator sent an output to topic "positions", which [operator.limits] output_topics"#
                .to_string(),
        ),
        // Four writes and the count's: five.
        (r#""action":"writes","count":4,"bytes":100"#, r#"{"count":2}"#.to_string()),
        (r#""action":"writes","count":5,"bytes":10"#, passed("writes_per_record = 5 (reached 6)")),
        (r#""action":"writes","count":1,"bytes":500"#, passed("state_value_bytes = 500")),
        (r#""action":"writes","count":4,"bytes":450"#, passed("written_bytes_per_record = 1500")),
        (r#""action":"name","bytes":17"#, passed("state_name_bytes = 16 (reached 17)")),
        // Twenty reads and the count's.
        (r#""action":"reads","count":20"#, passed("reads_per_record = 20 (reached 21)")),
        (r#""action":"count""#, r#"{"count":3}"#.to_string()),
    ];
    let records: Vec<SourceRecord> =
        (0..).zip(&cases).map(|(offset, (action, _))| probe_record(offset, "a", action)).collect();
    let lines = outcome_lines(&instance.process_batch(&records)?.outcomes);
    assert_eq!(lines.len(), cases.len(), "{lines:#?}");
    for (line, (action, expected)) in lines.iter().zip(&cases) {
        assert!(line.starts_with(expected.as_str()), "{action}: {line:?} is not {expected:?}");
    }
    // None of the failed records' writes stand.
    instance.state().scope(b"a");
    assert!(instance.state().get("w0")?.is_some(), "the good record's write stands");
    assert_eq!(instance.state().get("w4")?, None);
    instance.state().end_record(false);
    Ok(())
}

/// A record at event time `timestamp_ms` asking the probe to do `action`.
fn timed(offset: u64, key: &str, timestamp_ms: i64, action: &str) -> SourceRecord {
    SourceRecord { timestamp_ms, ..probe_record(offset, key, action) }
}

/// An event time for the tests of callbacks.
const T0: i64 = 1_700_000_000_000;

/// The limits of the tests of callbacks: time and memory for the probe to spare.
fn callback_limits() -> Limits {
    Limits { call_timeout: Some(Duration::from_secs(5)), memory_bytes: 16 << 20, ..Limits::default() }
}

/// The probe's action setting the timer `name` for `at`.
fn timer(name: &str, at: i64) -> String {
    format!(r#""action":"timer","name":"{name}","at_ms":{at}"#)
}

#[test]
fn expired_runs_before_the_record_that_reaches_the_expiry_scoped_to_its_key() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut instance = probe(callback_limits(), dir.path())?;
    let remember = |name: &str| format!(r#""action":"remember","name":"{name}","value":"v-{name}","ttl_ms":1000"#);
    let records = [
        timed(0, "a", T0, &remember("n")),
        timed(1, "b", T0, &remember("fail-n")),
        timed(2, "c", T0, &remember("trap-n")),
        timed(3, "z", T0 + 999, r#""action":"count""#),
        // Reaches T0 + 1000: the three expire before it, in one batched call.
        timed(4, "z", T0 + 1_000, r#""action":"count""#),
        timed(5, "a", T0 + 1_000, r#""action":"peek","name":"expiries""#),
        timed(6, "b", T0 + 1_000, r#""action":"peek","name":"expiries""#),
        timed(7, "a", T0 + 1_000, r#""action":"peek","name":"n""#),
    ];
    let processed = instance.process_batch(&records)?;
    assert_eq!(processed.outcomes.len(), records.len());
    let expirations = expiration_lines(&processed);
    let at = (T0 + 1_000) as u64;
    assert_eq!(expirations.len(), 3, "{expirations:#?}");
    assert_eq!(
        expirations[0],
        ("a".into(), 4, at, format!(r#"{{"at":{at},"expired":"n","expiries":1,"value":"v-n"}}"#))
    );
    assert_eq!(expirations[1], ("b".into(), 4, at, "rejected: probe fails on the expiry of fail-n".to_string()));
    assert!(expirations[2].3.starts_with("trapped: panicked at "), "{expirations:#?}");
    match &processed.expirations[2].outcome {
        Outcome::Trapped { reason, .. } => {
            assert!(reason.contains("probe panics on the expiry of trap-n"), "{reason}")
        }
        other => bail!("{other:?}"),
    }
    // The handler's write stands for `a` and is gone for `b`; the entries are gone.
    let lines = outcome_lines(&processed.outcomes[5..]);
    assert_eq!(
        lines,
        [r#"{"name":"expiries","value":1}"#, r#"{"name":"expiries","value":null}"#, r#"{"name":"n","value":null}"#]
    );
    instance.state().commit(8)?;
    assert_eq!(instance.state().expired(), 3);
    Ok(())
}

#[test]
fn a_timer_fires_once_before_the_record_that_reaches_it_scoped_to_its_key() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut instance = probe(callback_limits(), dir.path())?;
    let records = [
        timed(0, "a", T0, &timer("close", T0 + 1_000)),
        // Cancelled before it comes due; set again for later, then earlier: one firing.
        timed(1, "b", T0, &timer("gone", T0 + 1_000)),
        timed(2, "b", T0, r#""action":"cancel-timer","name":"gone""#),
        timed(3, "c", T0, &timer("moved", T0 + 5_000)),
        timed(4, "c", T0, &timer("moved", T0 + 900)),
        timed(5, "d", T0, &timer("fail-t", T0 + 900)),
        timed(6, "z", T0 + 899, r#""action":"count""#),
        // Reaches T0 + 900, then T0 + 1000: the timers fire before them, in time order.
        timed(7, "z", T0 + 900, r#""action":"count""#),
        timed(8, "z", T0 + 1_000, r#""action":"count""#),
        timed(9, "a", T0 + 1_000, r#""action":"peek","name":"fireds""#),
        timed(10, "d", T0 + 1_000, r#""action":"peek","name":"fireds""#),
        // A time the clock has passed, set from `process`: it fires before the next record.
        timed(11, "e", T0 + 1_000, &timer("late", T0)),
        timed(12, "z", T0 + 1_000, r#""action":"count""#),
    ];
    let processed = instance.process_batch(&records)?;
    assert_eq!(processed.outcomes.len(), records.len());
    let fired = |name: &str, at: i64| format!(r#"{{"at":{at},"fired":"{name}","fireds":1}}"#);
    assert_eq!(
        expiration_lines(&processed),
        [
            ("c".to_string(), 7, (T0 + 900) as u64, fired("moved", T0 + 900)),
            ("d".to_string(), 7, (T0 + 900) as u64, "rejected: probe fails on the timer fail-t".to_string()),
            ("a".to_string(), 8, (T0 + 1_000) as u64, fired("close", T0 + 1_000)),
            ("e".to_string(), 12, T0 as u64, fired("late", T0)),
        ]
    );
    assert!(processed.expirations.iter().all(|e| e.origin(0).cause == crate::record::Cause::Timer));
    // The firing's write stands for `a` and is gone for `d`, whose `fired` failed.
    assert_eq!(
        outcome_lines(&processed.outcomes[9..11]),
        [r#"{"name":"fireds","value":1}"#, r#"{"name":"fireds","value":null}"#]
    );
    // Committed and reopened, nothing fires again.
    instance.state().commit(13)?;
    let later = [timed(13, "z", T0 + 10_000, r#""action":"count""#)];
    assert!(instance.process_batch(&later)?.expirations.is_empty());
    Ok(())
}

#[test]
fn a_timer_set_again_from_fired_must_be_for_later_and_a_state_name_may_not_be_a_timers() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut instance = probe(callback_limits(), dir.path())?;
    let records = [
        timed(0, "a", T0, &timer("again", T0 + 1_000)),
        timed(1, "b", T0, &timer("past", T0 + 1_000)),
        timed(2, "c", T0, r#""action":"put-bytes","name":"\u0000timer:again","text":"x""#),
        timed(3, "z", T0 + 1_000, r#""action":"count""#),
        timed(4, "z", T0 + 2_500, r#""action":"count""#),
    ];
    let processed = instance.process_batch(&records)?;
    let lines = expiration_lines(&processed);
    assert_eq!(lines.len(), 3, "{lines:#?}");
    assert_eq!(lines[0].3, r#"{"at":1700000001000,"fired":"again","fireds":1}"#);
    assert!(
        lines[1].3.starts_with("trapped: timers.set of \"past\" at 1700000001000 from `expired` or `fired`"),
        "{lines:#?}"
    );
    // Set again a second later, it fires again.
    assert_eq!((lines[2].1, lines[2].3.as_str()), (4, r#"{"at":1700000002000,"fired":"again","fireds":2}"#));
    let refused = outcome_lines(&processed.outcomes[2..3]).remove(0);
    assert!(refused.starts_with("trapped: state or timer name \"\\0timer:again\" begins with NUL"), "{refused}");
    Ok(())
}

#[test]
fn finish_outside_a_batched_call_traps_and_moves_nothing() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut instance = probe(
        Limits { call_timeout: Some(Duration::from_secs(1)), memory_bytes: 16 << 20, ..Limits::default() },
        dir.path(),
    )?;
    // A batch ran before: had its keys been kept, `finish` would move to one.
    instance
        .process_batch(&[probe_record(0, "a", r#""action":"count""#), probe_record(1, "b", r#""action":"count""#)])?;
    let live = instance.live();
    // As inside `process`: a record in hand, no batch running.
    live.store.data_mut().in_record = true;
    live.store.data_mut().txn.scope(b"k");
    let trap = finish(live.store.as_context_mut(), (Ok(GuestOutputs::Lifted(Vec::new())),)).unwrap_err();
    assert!(trap.to_string().contains("batch.finish called outside `process-batch`"), "{trap}");
    assert!(live.store.data().batch.outcomes.is_empty(), "no outcome recorded");
    Ok(())
}

#[test]
fn a_batch_larger_than_the_memory_cap_is_split_into_calls_that_fit() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut instance = probe(
        Limits { call_timeout: Some(Duration::from_secs(5)), memory_bytes: 16 << 20, ..Limits::default() },
        dir.path(),
    )?;
    // 24 MiB of inputs: more than the guest's whole memory, so in one call they
    // would trap while being copied in.
    let padding = "x".repeat(1 << 20);
    let records: Vec<SourceRecord> = (0..24)
        .map(|offset| probe_record(offset, "k", &format!(r#""action":"count","padding":"{padding}""#)))
        .collect();
    assert_eq!(run_length(&records, 16 << 20 >> 3), 1, "a run holds what an eighth of the cap holds");
    let expected: Vec<String> = (1..=24).map(|count| format!(r#"{{"count":{count}}}"#)).collect();
    assert_eq!(outcome_lines(&instance.process_batch(&records)?.outcomes), expected);
    Ok(())
}

#[test]
fn the_deadline_bounds_each_record_of_a_batched_call_not_the_call() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let timeout = Duration::from_secs(1);
    let limits =
        Limits { call_timeout: Some(timeout), instructions: None, memory_bytes: 16 << 20, ..Limits::default() };
    let mut instance = probe(limits, dir.path())?;
    let work =
        |offset, iterations: u64| probe_record(offset, "k", &format!(r#""action":"work","iterations":{iterations}"#));
    // How many iterations take a tenth of the deadline here: ten times the margin
    // for a loaded machine.
    let started = Instant::now();
    instance.process_batch(&[work(0, 20_000_000)])?;
    let iterations = (20_000_000.0 * (timeout / 10).as_secs_f64() / started.elapsed().as_secs_f64()) as u64;

    let records: Vec<SourceRecord> = (1..=20).map(|offset| work(offset, iterations)).collect();
    let started = Instant::now();
    let lines = outcome_lines(&instance.process_batch(&records)?.outcomes);
    assert!(started.elapsed() > timeout, "the call must outlast one record's deadline for this test to mean anything");
    let expected: Vec<String> = (2..=21).map(|count| format!(r#"{{"count":{count}}}"#)).collect();
    assert_eq!(lines, expected);
    Ok(())
}

/// The deadline counts the thread's CPU time, not the wall clock: a record that
/// needs half its deadline of CPU finishes though its thread gets a quarter of a
/// core (three busy threads share its core), taking twice the deadline in wall time.
#[test]
fn a_record_within_its_cpu_deadline_is_not_stopped_on_a_loaded_host() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let timeout = Duration::from_millis(400);
    let limits = Limits { call_timeout: Some(timeout), memory_bytes: 16 << 20, ..Limits::default() };
    let mut instance = probe(limits, dir.path())?;
    let work =
        |offset, iterations: u64| probe_record(offset, "k", &format!(r#""action":"work","iterations":{iterations}"#));
    let cpu = thread_cpu();
    instance.process_batch(&[work(0, 20_000_000)])?;
    let iterations = (20_000_000.0 * (timeout / 2).as_secs_f64() / (thread_cpu() - cpu).as_secs_f64()) as u64;

    let pin_to_first_core = || {
        // SAFETY: a zeroed cpu_set_t is an empty set; the calls only read it.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(0, &mut set);
            assert_eq!(libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set), 0);
        }
    };
    pin_to_first_core();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (outcomes, took) = std::thread::scope(|scope| {
        for _ in 0..3 {
            scope.spawn(|| {
                pin_to_first_core();
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            });
        }
        let started = Instant::now();
        let outcomes = instance.process_batch(&[work(1, iterations)]);
        stop.store(true, Ordering::Relaxed);
        (outcomes, started.elapsed())
    });
    let lines = outcome_lines(&outcomes?.outcomes);
    assert!(took > timeout, "the record must outlast its deadline in wall time for this test to mean anything");
    assert_eq!(lines, [r#"{"count":2}"#]);
    Ok(())
}

/// The instruction limit is what a replay reproduces: a record past it fails on
/// every attempt, one within it never does, however loaded the machine — and, like
/// the deadline, it bounds each record of a batched call, not the call.
#[test]
fn the_instruction_limit_bounds_each_record_the_same_way_every_time() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let limits = Limits {
        call_timeout: Some(Duration::from_secs(60)),
        instructions: Some(10_000_000),
        memory_bytes: 16 << 20,
        ..Limits::default()
    };
    let mut instance = probe(limits, dir.path())?;
    let work =
        |offset, iterations: u64| probe_record(offset, "k", &format!(r#""action":"work","iterations":{iterations}"#));
    let trapped = |outcomes: &[Outcome]| {
        matches!(&outcomes[0], Outcome::Trapped { reason, .. } if reason.starts_with(
            "operator passed its limit [operator] instructions_per_call = 10000000"
        ))
    };
    // The fewest iterations, to a factor of two, that pass the limit.
    let mut too_many = 1;
    while !trapped(&instance.process_batch(&[work(0, too_many)])?.outcomes) {
        too_many *= 2;
    }
    for attempt in 0..3 {
        assert!(trapped(&instance.process_batch(&[work(attempt, too_many)])?.outcomes), "attempt {attempt}");
        let within = instance.process_batch(&[work(attempt, too_many / 4)])?.outcomes;
        assert!(matches!(&within[0], Outcome::Emitted(_)), "attempt {attempt}: {within:?}");
    }
    // Twenty records of a quarter each: five times the limit in one call.
    let records: Vec<SourceRecord> = (10..30).map(|offset| work(offset, too_many / 4)).collect();
    let outcomes = instance.process_batch(&records)?.outcomes;
    assert!(outcomes.iter().all(|o| matches!(o, Outcome::Emitted(_))), "{:#?}", outcome_lines(&outcomes));
    Ok(())
}

fn count(instance: &mut WasmInstance, offset: u64) -> Result<Vec<u8>> {
    match call(instance, offset, "count")? {
        Outcome::Emitted(outputs) => Ok(outputs[0].value.clone()),
        other => bail!("count failed: {other:?}"),
    }
}

/// A leaky operator's instance fills up and traps at the memory cap on a record a
/// fresh instance handles: with a retry that record is processed once, in the fresh
/// instance, its count following the last; without, it fails after one call and
/// its key's count skips it. Either way the records after it go on.
#[test]
fn a_record_that_traps_once_is_processed_exactly_once_by_its_retry() -> Result<()> {
    for (attempts, batched) in [(2, true), (2, false), (1, true)] {
        let dir = tempfile::tempdir()?;
        let retry = RetryPolicy { attempts, backoff: Duration::from_millis(1), strict: false };
        let mut instance = probe(Limits { memory_bytes: 16 << 20, retry, ..Limits::default() }, dir.path())?;
        let leak = |offset| probe_record(offset, "k", r#""action":"leak","kib":3072"#);
        let records: Vec<SourceRecord> = (0..8).map(leak).collect();
        let outcomes = match batched {
            true => instance.process_batch(&records)?.outcomes,
            false => records.iter().map(|r| instance.process_batch(std::slice::from_ref(r))).try_fold(
                Vec::new(),
                |mut all, processed| {
                    all.extend(processed?.outcomes);
                    anyhow::Ok(all)
                },
            )?,
        };
        let lines = outcome_lines(&outcomes);
        let trapped: Vec<u32> = outcomes
            .iter()
            .filter_map(|o| match o {
                Outcome::Trapped { attempts, .. } => Some(*attempts),
                _ => None,
            })
            .collect();
        if attempts == 2 {
            let expected: Vec<String> = (1..=8).map(|count| format!(r#"{{"count":{count}}}"#)).collect();
            assert_eq!(lines, expected, "batched: {batched}");
        } else {
            assert_eq!(trapped, [1], "{lines:#?}");
            let counts = lines.iter().filter(|line| line.starts_with(r#"{"count""#)).count();
            assert_eq!(counts, 7, "{lines:#?}");
            assert!(lines.last().is_some_and(|l| l == r#"{"count":7}"#), "{lines:#?}");
        }
        assert!(instance.replaced >= 1, "the leak must fill the instance for this test to mean anything");
    }
    Ok(())
}

/// A batch ends at the record that takes its outputs past `output_bytes_per_batch`,
/// or its time past `time_per_batch_ms`: the outcomes are a prefix, and the rest runs
/// as the next batch, its first record in a fresh call.
#[test]
fn a_batch_ends_early_at_its_output_or_time_bound() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let per_call = OperatorLimits { output_bytes_per_batch: 2_500, ..OperatorLimits::default() };
    let mut instance = probe(Limits { per_call, ..Limits::default() }, dir.path())?;
    let output = |offset| probe_record(offset, "k", r#""action":"outputs","count":1,"bytes":1000"#);
    let records: Vec<SourceRecord> = (0..10).map(output).collect();
    // 1,001 bytes a record (key and value): the third passes 2,500.
    assert_eq!(instance.process_batch(&records)?.outcomes.len(), 3);
    assert_eq!(instance.process_batch(&records[3..])?.outcomes.len(), 3);

    let per_call = OperatorLimits { time_per_batch_ms: 50, ..OperatorLimits::default() };
    let dir = tempfile::tempdir()?;
    let mut instance = probe(Limits { per_call, ..Limits::default() }, dir.path())?;
    let work = |offset| probe_record(offset, "w", r#""action":"work","iterations":30000000"#);
    let records: Vec<SourceRecord> = (0..10).map(work).collect();
    let started = Instant::now();
    let outcomes = instance.process_batch(&records)?.outcomes;
    assert!(outcomes.len() < records.len(), "{:?} for {} records", started.elapsed(), outcomes.len());
    let expected: Vec<String> = (1..=outcomes.len()).map(|count| format!(r#"{{"count":{count}}}"#)).collect();
    assert_eq!(outcome_lines(&outcomes), expected);
    Ok(())
}

/// In strict mode a record that still traps after its attempts stops the partition:
/// the batch is an error naming the record's offset and the setting.
#[test]
fn strict_mode_makes_a_record_that_keeps_trapping_an_error() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let retry = RetryPolicy { attempts: 2, backoff: Duration::from_millis(1), strict: true };
    let mut instance = probe(Limits { memory_bytes: 16 << 20, retry, ..Limits::default() }, dir.path())?;
    let records = [probe_record(0, "k", r#""action":"count""#), probe_record(1, "k", r#""action":"hog""#)];
    let error = instance.process_batch(&records).expect_err("strict mode stops at the hog").to_string();
    assert!(error.starts_with("the record at offset 1 failed in 2 call(s), and [operator.retry] strict"), "{error}");
    assert!(error.contains("memory limit of 16 MiB"), "{error}");
    Ok(())
}

#[test]
fn a_trap_is_explained_by_what_the_host_recorded_in_that_call() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut instance = probe(
        Limits { call_timeout: Some(Duration::from_secs(5)), memory_bytes: 16 << 20, ..Limits::default() },
        dir.path(),
    )?;
    let expected = [
        ("hog", "operator exceeded its memory limit of 16 MiB"),
        // A cause explains only the call it was recorded in, not the next trap.
        ("put-then-panic", "panicked at "),
        ("read-env", "operator called `wasi:cli/environment@"),
        ("read-fs", "operator called `wasi:filesystem/"),
    ];
    for (offset, (action, reason)) in (0..).zip(expected) {
        match call(&mut instance, offset, action)? {
            Outcome::Trapped { reason: why, .. } => assert!(why.starts_with(reason), "{action}: {why}"),
            other => bail!("{action} did not trap: {other:?}"),
        }
    }
    assert_eq!(count(&mut instance, 4)?, br#"{"count":1}"#, "a fresh instance carries on, the panic's write gone");
    Ok(())
}
