//! What a record may make the host spend, through the real binary with the `probe`
//! operator and components written by hand: CPU and memory capped per call, the cap
//! covering every memory and table of an instance; output, state and log bounds that
//! cost only the record that passes them; batches cut at their output bound; aliased
//! outputs and huge reasons; an expiry storm cut into batches by time; a batch's writes
//! ended at `commit_dirty_mib`; and a partition's queue held to `queued_mib`.

use crate::sandbox::{run_probe_with, sandbox_job};
use anyhow::{Context, Result};
use serde_json::{Value, json};
use sluice::events::{DEAD_LETTERS_BY_KIND, LOG_LINES_DROPPED};
use sluice_e2e::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A `sluice run` of `operator` in `dir` over the log `records` (as [`run_probe`] takes
/// them) with a memory cap of `memory_mib` per instance and `config` (TOML tables) added,
/// as the attack tests run one: outputs to `out.jsonl`, dead letters to `dead.jsonl`,
/// only errors logged (the report is printed whatever the level).
fn attack_job(dir: &Path, operator: &Path, memory_mib: u32, records: &[Value], config: &str) -> Result<Command> {
    let mut command = sandbox_job(dir, operator, records, "")?;
    let config_file = dir.join("attack.toml");
    std::fs::write(
        &config_file,
        format!(
            "[operator]\npath = {operator:?}\nmemory_limit_mib = {memory_mib}\n{config}\n[report]\ninterval_s = 0\n"
        ),
    )?;
    command.arg("--config").arg(&config_file).arg("--state-dir").arg(dir.join("state")).env("SLUICE_LOG", "error");
    Ok(command)
}

/// The `cabi_realloc` of the components written by hand: a bump allocator from `start`
/// (`$next`, which a component may reset), freeing nothing.
fn bump_realloc(start: u32) -> String {
    format!(
        r#"(global $next (mut i32) (i32.const {start}))
          (func (export "cabi_realloc") (param i32 i32) (param $align i32) (param $size i32) (result i32)
            (local $at i32)
            (local.set $at (i32.and (i32.add (global.get $next) (i32.sub (local.get $align) (i32.const 1)))
                                    (i32.sub (i32.const 0) (local.get $align))))
            (global.set $next (i32.add (local.get $at) (local.get $size)))
            (local.get $at))"#
    )
}

/// A component of the `operator` world written by hand in WebAssembly text, for what a
/// Rust operator cannot do: `memories` linear memories of `pages` 64 KiB pages each,
/// and a `process` that grows a table by `grow_slots` for each record whose value is
/// longer than 40 bytes. It emits nothing. Written to `dir/<name>.wasm`.
fn handmade_operator(dir: &Path, name: &str, memories: usize, pages: u32, grow_slots: u32) -> Result<PathBuf> {
    let more_memories: String = (1..memories).map(|_| format!("(memory {pages})")).collect();
    // `init` and `process` answer with the zeroed bytes at 16: `ok`, an empty list.
    // Lists the host passes in are bump-allocated from 4096, and freed after each call.
    let realloc = bump_realloc(4096);
    let wat = format!(
        r#"(module
          (memory (export "memory") {pages})
          {more_memories}
          (table $slots 1 funcref)
          {realloc}
          (func (export "init") (param i32 i32) (result i32) (i32.const 16))
          (func (export "process") (param i32 i32 i32) (param $value_len i32) (param i64 i32 i64 i32 i32) (result i32)
            (if (i32.gt_u (local.get $value_len) (i32.const 40))
              (then (drop (table.grow $slots (ref.null func) (i32.const {grow_slots})))))
            (global.set $next (i32.const 4096))
            (i32.const 16)))"#
    );
    let mut module = wat::parse_str(&wat)?;
    let mut resolve = wit_parser::Resolve::default();
    let package = resolve.push_file(Path::new(env!("CARGO_MANIFEST_DIR")).join("../wit/operator.wit"))?;
    let world = resolve.select_world(&[package], Some("operator"))?;
    wit_component::embed_component_metadata(&mut module, &resolve, world, wit_component::StringEncoding::UTF8)?;
    let component = wit_component::ComponentEncoder::default().module(&module)?.validate(true).encode()?;
    let path = dir.join(format!("{name}.wasm"));
    std::fs::write(&path, component)?;
    Ok(path)
}

/// A component written by hand for what no Rust operator can do: return outputs that
/// all point at one region of its memory. For a record whose key starts with `A` it
/// returns 1,000 outputs whose keys are each the whole 32 MiB region (so lifting them
/// as wasmtime's own types would copy 32 GiB); for one whose key starts with `R`, an
/// error whose reason is the whole region; for any other, one output echoing the
/// record's key and value. Built for the 0.1.0 `operator` world (a `process` per
/// record, the reply returned) or, with `batched`, the `batched-operator` world (a
/// `process-batch` that reports each reply through the `batch.finish` import).
/// Written to `dir/<name>.wasm`.
pub(crate) fn aliasing_operator(dir: &Path, name: &str, batched: bool) -> Result<PathBuf> {
    // Layout: the reply at 16, the echo's output record at 64, the 1,000 aliased
    // records at 1024, inputs bump-allocated from 64 KiB, the region at 1 MiB.
    const REGION: u32 = 1 << 20;
    const REGION_LEN: u32 = 32 << 20;
    let pages = (REGION + REGION_LEN) >> 16;
    let reply = format!(
        r#"
          (func $reply (param $kp i32) (param $kl i32) (param $vp i32) (param $vl i32)
            (local $i i32) (local $rec i32)
            (if (i32.eq (i32.load8_u (local.get $kp)) (i32.const 65))
              (then
                (loop $fill
                  (local.set $rec (i32.add (i32.const 1024) (i32.mul (local.get $i) (i32.const 28))))
                  (i32.store (local.get $rec) (i32.const {REGION}))
                  (i32.store offset=4 (local.get $rec) (i32.const {REGION_LEN}))
                  (i32.store offset=8 (local.get $rec) (i32.const {REGION}))
                  (i32.store offset=12 (local.get $rec) (i32.const 0))
                  (i32.store8 offset=16 (local.get $rec) (i32.const 0))
                  (local.set $i (i32.add (local.get $i) (i32.const 1)))
                  (br_if $fill (i32.lt_u (local.get $i) (i32.const 1000))))
                (i32.store8 (i32.const 16) (i32.const 0))
                (i32.store (i32.const 20) (i32.const 1024))
                (i32.store (i32.const 24) (i32.const 1000))
                (return)))
            (if (i32.eq (i32.load8_u (local.get $kp)) (i32.const 82))
              (then
                (i32.store8 (i32.const 16) (i32.const 1))
                (i32.store (i32.const 20) (i32.const {REGION}))
                (i32.store (i32.const 24) (i32.const {REGION_LEN}))
                (return)))
            (i32.store (i32.const 64) (local.get $kp))
            (i32.store (i32.const 68) (local.get $kl))
            (i32.store (i32.const 72) (local.get $vp))
            (i32.store (i32.const 76) (local.get $vl))
            (i32.store8 (i32.const 80) (i32.const 0))
            (i32.store8 (i32.const 16) (i32.const 0))
            (i32.store (i32.const 20) (i32.const 64))
            (i32.store (i32.const 24) (i32.const 1)))"#
    );
    // An input record in a list: key and value pointer/length pairs first (48 bytes).
    let (imports, batch, world, wit) = match batched {
        false => ("", "", "operator", "../wit/0.1.0/operator.wit"),
        true => (
            r#"(import "sluice:operator/batch@0.1.2" "finish" (func $finish (param i32 i32 i32)))"#,
            r#"
          (func (export "process-batch") (param $ptr i32) (param $len i32)
            (local $i i32) (local $in i32)
            (block $done
              (loop $each
                (br_if $done (i32.ge_u (local.get $i) (local.get $len)))
                (local.set $in (i32.add (local.get $ptr) (i32.mul (local.get $i) (i32.const 48))))
                (call $reply (i32.load (local.get $in)) (i32.load offset=4 (local.get $in))
                             (i32.load offset=8 (local.get $in)) (i32.load offset=12 (local.get $in)))
                (call $finish (i32.load8_u (i32.const 16)) (i32.load (i32.const 20)) (i32.load (i32.const 24)))
                (local.set $i (i32.add (local.get $i) (i32.const 1)))
                (br $each)))
            (global.set $next (i32.const 65536)))"#,
            "batched-operator",
            "../wit/operator.wit",
        ),
    };
    let realloc = bump_realloc(65536);
    let wat = format!(
        r#"(module
          {imports}
          (memory (export "memory") {pages})
          {realloc}
          (func (export "init") (param i32 i32) (result i32) (i32.const 0))
          {reply}
          (func (export "process") (param $kp i32) (param $kl i32) (param $vp i32) (param $vl i32)
                                   (param i64 i32 i64 i32 i32) (result i32)
            (call $reply (local.get $kp) (local.get $kl) (local.get $vp) (local.get $vl))
            (global.set $next (i32.const 65536))
            (i32.const 16))
          {batch})"#
    );
    let mut module = wat::parse_str(&wat)?;
    let mut resolve = wit_parser::Resolve::default();
    let package = resolve.push_file(Path::new(env!("CARGO_MANIFEST_DIR")).join(wit))?;
    let world = resolve.select_world(&[package], Some(world))?;
    wit_component::embed_component_metadata(&mut module, &resolve, world, wit_component::StringEncoding::UTF8)?;
    let component = wit_component::ComponentEncoder::default().module(&module)?.validate(true).encode()?;
    let path = dir.join(format!("{name}.wasm"));
    std::fs::write(&path, component)?;
    Ok(path)
}

/// A spin passes the CPU deadline (or, where instructions are counted, the instruction
/// limit), a growing heap the memory cap; each costs its record only.
#[test]
fn cpu_and_memory_limits_stop_runaway_calls() -> Result<()> {
    let records = [json!({"action": "spin"}), json!({"action": "hog"}), json!({"action": "count"})];
    for (config, cpu) in [
        ("", "exceeded its CPU deadline of 300ms ([operator] call_timeout_ms)"),
        ("instructions_per_call = 1000000000", "passed its limit [operator] instructions_per_call = 1000000000"),
    ] {
        let dir = tempfile::tempdir()?;
        let (outputs, dead, _) = run_probe_with(dir.path(), &records, config)?;
        assert_eq!(outputs, vec![json!({"count": 1})], "{config}");
        assert_eq!(dead.len(), 2, "{config}: {dead:?}");
        assert!(dead[0]["reason"].as_str().unwrap().contains(cpu), "{config}: {}", dead[0]);
        assert!(dead[1]["reason"].as_str().unwrap().contains("memory limit of 16 MiB"), "{config}: {}", dead[1]);
        // Each was called again on a fresh instance, as `[operator.retry]` says by default.
        assert!(dead.iter().all(|d| d["attempts"] == 2), "{config}: {dead:?}");
    }
    Ok(())
}

/// Batches that end early at `output_bytes_per_batch` lose and repeat nothing: every
/// record's output is written once, in order.
#[test]
fn batches_cut_at_their_output_bound_lose_and_repeat_nothing() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let records: Vec<Value> = (0..40).map(|_| json!({"action": "outputs", "count": 1, "bytes": 1000})).collect();
    let bound = "[operator.limits]\noutput_bytes_per_batch = 3000";
    run_ok(&mut sandbox_job(dir.path(), &operator_wasm("probe"), &records, bound)?)?;
    let offsets: Vec<u64> =
        read_jsonl(&dir.path().join("out.jsonl"))?.iter().filter_map(|o| o["offset"].as_u64()).collect();
    assert_eq!(offsets, (0..40).collect::<Vec<_>>());
    Ok(())
}

/// A record that tries to make the host hold without bound — many or large outputs,
/// many or large state writes, a long name, many reads, an output to a topic not
/// allowed — costs that record only: it
/// goes to the dead letters naming the `[operator.limits]` setting it passed (the
/// defaults, but for the reads), its key's state stays as the record before left it, and
/// the records after it are processed. A flood of log lines is cut to the rate, with a
/// warning; a huge line is cut to its length.
#[test]
fn a_record_that_passes_a_limit_costs_that_record_only() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let attacks = [
        (json!({"action": "outputs", "count": 5_000, "bytes": 0}), "outputs_per_record = 1000 (reached 5000)"),
        (json!({"action": "outputs", "count": 1, "bytes": 2_000_000}), "output_bytes_per_record = 1048576"),
        (json!({"action": "writes", "count": 1_001, "bytes": 0}), "writes_per_record = 1000"),
        (json!({"action": "writes", "count": 1, "bytes": 2_000_000}), "state_value_bytes = 1048576"),
        (json!({"action": "writes", "count": 20, "bytes": 1_000_000}), "written_bytes_per_record = 16777216"),
        (json!({"action": "name", "bytes": 257}), "state_name_bytes = 256 (reached 257)"),
        (json!({"action": "reads", "count": 100}), "reads_per_record = 50 (reached 51)"),
    ];
    let foreign = json!({"action": "outputs", "count": 1, "bytes": 1, "topic": "another-teams-topic"});
    let mut records = vec![json!({"action": "count"})];
    for attack in attacks.iter().map(|(attack, _)| attack).chain([&foreign]) {
        records.extend([attack.clone(), json!({"action": "count"})]);
    }
    // The long line first: the flood uses up the second's lines.
    records.extend([
        json!({"action": "log", "count": 1, "bytes": 100_000}),
        json!({"action": "log", "count": 1_000, "bytes": 10}),
    ]);
    let (outputs, dead, log) = run_probe_with(dir.path(), &records, "[operator.limits]\nreads_per_record = 50\n")?;
    let counts: Vec<Value> = (1..=attacks.len() + 4).map(|count| json!({"count": count})).collect();
    assert_eq!(outputs, counts, "one count per good record: no failed record's write stands");
    assert_eq!(dead.len(), attacks.len() + 1, "{dead:#?}");
    let reason = dead[attacks.len()]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains(r#"topic "another-teams-topic", which [operator.limits] output_topics"#), "{reason}");
    for (letter, (attack, limit)) in dead.iter().zip(&attacks) {
        let reason = letter["reason"].as_str().unwrap_or_default();
        let expected = format!("operator passed its limit [operator.limits] {limit}");
        assert!(letter["error"] == "trapped" && reason.starts_with(&expected), "{attack}: {letter}");
    }
    let flood = log.lines().filter(|line| line.contains("llllllllll") && !line.contains("bytes cut")).count();
    assert!((1..=100).contains(&flood), "{flood} lines of the flood logged, past log_lines_per_s = 100");
    assert!(log.contains(LOG_LINES_DROPPED), "the dropped lines are warned about:\n{log}");
    let by_kind = format!(
        "{DEAD_LETTERS_BY_KIND}: 0 rejected by the operator, 8 trapped or past a limit, 0 outputs refused by Kafka, \
         0 records without a key, 0 late for their windows, from probe@"
    );
    assert!(log.contains(&by_kind), "the report counts the dead letters by kind and operator version:\n{log}");
    assert!(log.contains("more bytes cut: [operator.limits] log_line_bytes"), "a huge line is cut");
    // The host's memory stays bounded through all of it (the report's peak RSS; each
    // attack alone would hold tens of MiB or more without its limit).
    let peak = reported_peak_mib(&log);
    eprintln!("peak memory of the attacked host: {peak:?} MiB");
    assert!(peak.is_some_and(|mib| mib < 512.0), "peak memory {peak:?} MiB");
    Ok(())
}

/// An operator that returns, for one record, a thousand outputs all pointing at one
/// 32 MiB region of its memory — 32 GiB if the host copied them before checking — or a
/// 32 MiB reason for each of many records, costs those records only, in either world
/// (a reply per `process` call, or through `batch.finish`): each goes to the dead
/// letters, its reason naming the limit or cut to `reason_bytes`, every other record of
/// both partitions is processed, and the host's peak memory stays within what its
/// configuration bounds, plus a fixed margin for the binary itself.
#[test]
fn aliased_outputs_and_huge_reasons_cost_their_records_and_no_host_memory() -> Result<()> {
    for batched in [false, true] {
        let dir = tempfile::tempdir()?;
        let dir = dir.path();
        let operator = aliasing_operator(dir, "aliaser", batched)?;
        let keys = ["k0", "k1", "k2", "k3", "Aliased", "k4", "Reason1", "k5", "Reason2"];
        // Two hundred reasons make a batch that would hold 6 GiB of them.
        let mut records: Vec<Value> = (0..400).map(|i| json!({"vehicle_id": keys[i % keys.len()], "i": i})).collect();
        records.extend((0..200).map(|i| json!({"vehicle_id": format!("Reason-{i}")})));
        records.push(json!({"vehicle_id": "k-last"}));
        let config = "[state]\npartitions = 2\nrocksdb_memory_mib = 32\ncache_mib = 1\n\
                      [operator.limits]\noutput_bytes_per_batch = 8388608\n";
        let run = run_ok(&mut attack_job(dir, &operator, 40, &records, config)?)?;
        let report = String::from_utf8(run.stderr)?;
        let outputs = read_jsonl(&dir.join("out.jsonl"))?;
        let dead = read_jsonl(&dir.join("dead.jsonl"))?;
        let good = records.iter().filter(|r| r["vehicle_id"].as_str().is_some_and(|k| k.starts_with('k'))).count();
        assert_eq!(outputs.len(), good, "batched: {batched}: every other record echoed");
        assert_eq!(dead.len(), records.len() - good, "batched: {batched}");
        for letter in &dead {
            let (key, reason) =
                (letter["key"].as_str().unwrap_or_default(), letter["reason"].as_str().unwrap_or_default());
            if key.starts_with('A') {
                let limit = "operator passed its limit [operator.limits] output_bytes_per_record = 1048576 \
                     (reached 33554432000)";
                assert!(letter["error"] == "trapped" && reason.starts_with(limit), "{letter}");
            } else {
                assert_eq!(letter["error"], "rejected", "{letter}");
                assert!(reason.len() < 4200 && reason.ends_with("more bytes cut: [operator.limits] reason_bytes)"));
            }
        }
        // The instance's 33 MiB, RocksDB's 32, a batch's 8 of outputs and reasons,
        // and 150 for the binary, its runtime and the file sinks' buffers.
        let peak = reported_peak_mib(&report).context("the report gives the peak memory")?;
        eprintln!("batched: {batched}: peak memory {peak:.0} MiB");
        assert!(peak < 33.0 + 32.0 + 8.0 + 150.0, "batched: {batched}: peak memory {peak:.0} MiB");
    }
    Ok(())
}

/// 100,000 state entries come due at one record (its timestamp two hours past theirs):
/// their expiries — each an `expired` call and an output — are cut into batches under
/// `time_per_batch_ms` like records, so a SIGTERM in the middle of them stops the host
/// within about one batch's time; the next run goes on where it stopped, and every
/// entry expires exactly once, before that record. The host's memory stays bounded.
#[test]
fn an_expiry_storm_is_cut_into_batches_and_a_stop_in_its_middle_waits_one_batch() -> Result<()> {
    storm(
        |i, ts| json!({"vehicle_id": format!("v{i}"), "ts": ts, "action": "remember", "name": "log-n", "value": i, "ttl_ms": 3_600_000}),
        "expiry",
        "expired log-n",
    )
}

/// The same with 100,000 timers due at one record, each a `fired` call and an output.
#[test]
fn a_timer_storm_is_cut_into_batches_and_a_stop_in_its_middle_waits_one_batch() -> Result<()> {
    storm(
        |i, ts| json!({"vehicle_id": format!("v{i}"), "ts": ts, "action": "timer", "name": "log-t", "at_ms": ts + 3_600_000}),
        "timer",
        "fired log-t",
    )
}

/// A storm of 100,000 callbacks of `cause` due at one record: `record(i, ts)` is the
/// record at `ts` of key `i` that sets one up, and the probe logs `logged` for each.
fn storm(record: impl Fn(usize, i64) -> Value, cause: &str, logged: &str) -> Result<()> {
    const T0: i64 = 1_700_000_000_000;
    const ENTRIES: usize = 100_000;
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    let mut records: Vec<Value> = (0..ENTRIES).map(|i| record(i, T0)).collect();
    records.push(json!({"vehicle_id": "v-last", "ts": T0 + 7_200_000, "action": "count"}));
    // A sweep limit that would take them all at once: the time bound cuts them.
    let config = "[state]\npartitions = 1\nrocksdb_memory_mib = 64\ncache_mib = 8\n\
                  [ttl]\nsweep_limit = 1000000\n[operator.limits]\ntime_per_batch_ms = 200\n";
    let job = || -> Result<Command> {
        let mut job = attack_job(dir, &operator_wasm("probe"), 16, &records, config)?;
        job.arg("--no-checkpoints");
        Ok(job)
    };
    let mut host = Host::spawn("storm", &mut job()?, &dir.join("first.log"))?;
    host.wait_for(logged, 1, std::time::Duration::from_secs(300))?;
    let stopping = std::time::Instant::now();
    host.terminate()?;
    let stopped_in = stopping.elapsed();
    let first = read_jsonl(&dir.join("out.jsonl"))?;
    let stormed_first = first.iter().filter(|o| o["cause"] == cause).count();
    eprintln!("SIGTERM during the storm: stopped in {stopped_in:?}, after {stormed_first} of {ENTRIES} callbacks");
    assert!(stormed_first < ENTRIES, "the stop came in the middle of the storm");
    // One batch (200 ms) and the host's own stop, with room for a loaded debug build.
    assert!(stopped_in < std::time::Duration::from_millis(200 + 2_500), "stopped in {stopped_in:?}");

    // The job removes its last outputs before it runs: the two runs' together.
    let run = run_ok(&mut job()?)?;
    let outputs: Vec<Value> = first.into_iter().chain(read_jsonl(&dir.join("out.jsonl"))?).collect();
    let stormed: Vec<&Value> = outputs.iter().filter(|o| o["cause"] == cause).collect();
    let keys: std::collections::BTreeSet<&str> = stormed.iter().filter_map(|o| o["key"].as_str()).collect();
    assert_eq!((stormed.len(), keys.len()), (ENTRIES, ENTRIES), "each callback once");
    let last = outputs.iter().position(|o| o["key"] == "v-last").context("the last record was processed")?;
    assert!(outputs[..last].iter().filter(|o| o["cause"] == cause).count() == ENTRIES, "all before it");
    // The instance's 16 MiB, RocksDB's 64, the cache's 8 and a batch's outputs (200 ms of
    // them), and 150 for the binary and its runtime.
    let report = String::from_utf8(run.stderr)?;
    let peak = reported_peak_mib(&report).with_context(|| format!("the report gives the peak memory:\n{report}"))?;
    eprintln!("peak memory through the storm's second half: {peak:.0} MiB");
    assert!(peak < 16.0 + 64.0 + 8.0 + 64.0 + 150.0, "peak memory {peak:.0} MiB");
    Ok(())
}

/// Records that each write `written_bytes_per_record` (16 MiB) of state end their batch
/// once it holds `[state] commit_dirty_mib`, so a batch never stages more than that and
/// one record's writes: the host's memory stays bounded by the setting, not by
/// `batch_records` times the writes, and every record's writes are committed.
#[test]
fn a_batch_of_maximal_writes_ends_at_commit_dirty_mib() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    let records: Vec<Value> = (0..40)
        .map(|i| json!({"vehicle_id": format!("w{i}"), "action": "writes", "count": 16, "bytes": 1_000_000}))
        .collect();
    let config = "[state]\npartitions = 1\ncommit_dirty_mib = 32\nrocksdb_memory_mib = 32\ncache_mib = 1\n";
    let run = run_ok(&mut attack_job(dir, &operator_wasm("probe"), 32, &records, config)?)?;
    let outputs = read_jsonl(&dir.join("out.jsonl"))?;
    assert_eq!(outputs.len(), 40, "every record processed");
    let state = dump_state_lines(&dir.join("state"))?;
    assert_eq!(state.len(), 40 * 17, "every write committed (16 values and a count a record)");
    // The batch's writes, the write batch of its commit and the memtable it lands in,
    // each at most `commit_dirty_mib` and one record's writes; RocksDB's 32, the
    // instance's 32, and 150 for the binary: without the bound one batch stages all
    // 640 MiB, three times over.
    let peak = reported_peak_mib(&String::from_utf8(run.stderr)?).context("the report gives the peak memory")?;
    eprintln!("peak memory writing 640 MiB of state: {peak:.0} MiB");
    assert!(peak < 3.0 * (32.0 + 16.0) + 32.0 + 32.0 + 150.0, "peak memory {peak:.0} MiB");
    Ok(())
}

/// A partition's queue is bounded by bytes, not only by records: 400 records of 1 MiB
/// each, read far faster than a slow operator takes them, would all wait in memory
/// under the default `queued_records` (65,536). With `[state] queued_mib = 8` a batch
/// ends at 2 MiB and the source waits once 8 MiB are queued, so the host's peak stays
/// near its base whatever the input, and every record is processed.
#[test]
fn a_partition_s_queue_holds_at_most_queued_mib_of_records() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    let pad = "x".repeat(1 << 20);
    let records: Vec<Value> = (0..400)
        .map(|i| json!({"vehicle_id": format!("q{i}"), "action": "work", "iterations": 2_000_000, "pad": pad}))
        .collect();
    let config = "[state]\nqueued_mib = 8\nrocksdb_memory_mib = 32\ncache_mib = 1\n";
    let run = run_ok(&mut attack_job(dir, &operator_wasm("probe"), 32, &records, config)?)?;
    assert_eq!(read_jsonl(&dir.join("out.jsonl"))?.len(), 400, "every record processed");
    // The queue's 8 MiB, the batch being processed (2 MiB) and the one the router
    // fills, the instance's 32 (a record is copied in), RocksDB's 32, and 150 for the
    // binary: without the bound the 400 MiB wait in the queue.
    let peak = reported_peak_mib(&String::from_utf8(run.stderr)?).context("the report gives the peak memory")?;
    eprintln!("peak memory queueing 400 MiB of records: {peak:.0} MiB");
    assert!(peak < 8.0 + 2.0 * 2.0 + 32.0 + 32.0 + 150.0, "peak memory {peak:.0} MiB");
    Ok(())
}

/// The memory cap is the whole instance's, not one memory's. Components written by hand
/// (a Rust one has one memory and fixed tables): one with five linear memories, more
/// than an instance may have, and one whose three memories are each under the cap but
/// together past it, are refused before the job starts, naming why; one whose table
/// grows past the cap fails that record only.
#[test]
fn the_memory_cap_covers_every_memory_and_table_of_an_instance() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    let many = handmade_operator(dir, "many-memories", 5, 1, 0)?;
    let err = run_err(&mut sandbox_job(dir, &many, &[json!({})], "")?)?;
    assert!(err.contains("many-memories.wasm") && err.contains("memory count too high at 5"), "{err}");
    // Three of 6 MiB under a cap of 16 MiB.
    let large = handmade_operator(dir, "large-memories", 3, 96, 0)?;
    let err = run_err(&mut sandbox_job(dir, &large, &[json!({})], "")?)?;
    assert!(err.contains("large-memories.wasm") && err.contains("past its cap of 16777216"), "{err}");
    // 4M slots of 8 bytes: 32 MiB.
    let table = handmade_operator(dir, "table-growth", 1, 1, 4 << 20)?;
    let records = [json!({"a": 1}), json!({"padding": "long enough to grow the table"}), json!({"a": 2})];
    run_ok(&mut sandbox_job(dir, &table, &records, "")?)?;
    let dead = read_jsonl(&dir.join("dead.jsonl"))?;
    assert_eq!(dead.len(), 1, "only the record that grew the table: {dead:?}");
    let reason = dead[0]["reason"].as_str().unwrap_or_default();
    assert!(dead[0]["offset"] == 1 && reason.starts_with("operator exceeded its memory limit of 16 MiB"), "{reason}");
    Ok(())
}
