//! Hosts sharing a Kafka consumer group (tansu): three hosts share the partitions and a
//! checkpoint store through `kill -9` and a graceful stop; a slow operator is warned
//! about and not evicted; a static member's restart moves no partitions, and one fenced
//! by another of its `instance_id` ends its run (on noida-db, which fences it).

use anyhow::Result;
use sluice::events::{
    ASSIGNED, CLAIMED_ELSEWHERE, LAG, MEMBER_FAILED, OFFSETS_JUMP, RESUMED, REVOKED, SLOW_BATCH, STOPPED,
};
use sluice_e2e::*;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

#[test]
fn three_hosts_share_the_partitions_through_kill_9_and_a_graceful_stop() -> Result<()> {
    let kafka = KafkaJob::on(KafkaBroker::start_in_memory()?).topic("positions", 6).topic("summaries", 3).start()?;
    let (broker, dir) = (&kafka.broker, kafka.dir());
    let (vehicles, total) = (300, 48_000usize);
    let all = kafka.generate("all.jsonl", vehicles, total as u64)?;
    let chunks = split_lines(&all, 4)?;
    let store = dir.join("store");
    let properties = "[source.properties]\n\"session.timeout.ms\" = \"6000\"\n\"heartbeat.interval.ms\" = \"500\"\n";
    let config = kafka.source(&format!("group = \"fleet\"\n{properties}"))?;
    let output = format!("kafka://{}/summaries", broker.bootstrap);
    let host = |name: &str| -> Result<Host> {
        let flags =
            ["--checkpoint-interval", "1", "--report-interval", "1", "--output", &output, "--admin", "127.0.0.1:0"];
        kafka.host(name, 6, &config, Some(&store), &flags)
    };
    let minute = Duration::from_secs(60);

    broker.produce_lines("positions", &chunks[0])?;
    let mut a = host("a")?;
    let admin_a = a.admin_url()?;
    a.wait_for(RESUMED, 6, minute)?;
    let mut b = host("b")?;
    b.wait_for(RESUMED, 1, minute)?;
    let mut c = host("c")?;
    c.wait_for(RESUMED, 1, minute)?;

    // kill -9 under load: b's partitions wait for its session to time out, then
    // restore from the shared store on a and c.
    let admin_c = c.admin_url()?;
    std::thread::scope(|scope| -> Result<()> {
        let loader = scope.spawn(|| broker.produce_lines("positions", &chunks[1]));
        std::thread::sleep(Duration::from_millis(500));
        b.kill_9()?;
        loader.join().expect("the producer thread").map(drop)
    })?;
    let every_partition: BTreeSet<u32> = (0..6).collect();
    let running = |admin: &str| running_partitions(admin).unwrap_or_default();
    let started = Instant::now();
    while running(&admin_a).into_keys().chain(running(&admin_c).into_keys()).collect::<BTreeSet<_>>() != every_partition
    {
        assert!(started.elapsed() < minute, "nobody took over b's partitions:\n{}\n{}", a.log(), c.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut b = host("b")?;
    b.wait_for(RESUMED, 1, minute)?;
    let admin_b = b.admin_url()?;

    // A graceful stop under load: c hands its partitions over.
    std::thread::scope(|scope| -> Result<()> {
        let loader = scope.spawn(|| broker.produce_lines("positions", &chunks[2]));
        std::thread::sleep(Duration::from_millis(300));
        c.terminate()?;
        loader.join().expect("the producer thread").map(drop)
    })?;
    assert!(c.log().contains(&handed_over()), "c handed its partitions over:\n{}", c.log());
    broker.produce_lines("positions", &chunks[3])?;
    // Caught up when a and b together run every partition and every state they list
    // stands at its partition's end. Not the group's committed offsets: b committed those
    // before its kill -9, ahead of every state in the store. tansu's group can give a
    // partition to two members at once (docs/development.md): the one whose claim in the store
    // was taken stops at its next checkpoint, so no state behind the end stays listed.
    let ends = broker.ends("positions")?;
    let at_end = |(p, offset): (u32, u64)| ends.get(&(p as i32)).is_some_and(|&end| end as u64 == offset);
    let started = Instant::now();
    loop {
        let (on_a, on_b) = (running(&admin_a), running(&admin_b));
        let owned: BTreeSet<u32> = on_a.keys().chain(on_b.keys()).copied().collect();
        if owned == every_partition && on_a.clone().into_iter().chain(on_b.clone()).all(at_end) {
            break;
        }
        let logs =
            || format!("a: {on_a:?}, b: {on_b:?}, ends: {ends:?}\nhost logs:\n{}\n{}\n{}", a.log(), b.log(), c.log());
        assert!(started.elapsed() < Duration::from_secs(120), "the states never reached the end: {}", logs());
        std::thread::sleep(Duration::from_millis(200));
    }
    a.terminate()?;
    b.terminate()?;

    for host in [&a, &b, &c] {
        assert!(!host.log().contains(OFFSETS_JUMP), "host {} skipped records:\n{}", host.name, host.log());
        assert!(host.log().contains(LAG), "host {} reports its partitions' lag:\n{}", host.name, host.log());
    }
    println!("how long each rebalance paused each partition (per host log):");
    for host in [&a, &b, &c] {
        let log = host.log();
        let rebalancing = [ASSIGNED, REVOKED, RESUMED, STOPPED, CLAIMED_ELSEWHERE];
        for line in log.lines().filter(|l| rebalancing.iter().any(|r| l.contains(r))) {
            println!("  {}: {}", host.name, line.split_once(" INFO ").map_or(line, |(_, rest)| rest));
        }
    }

    // Every input produced an output; the last output per vehicle is its final summary.
    let reference = Reference::fold(&all)?;
    let outputs = broker.read_topic("summaries")?;
    let inputs: BTreeSet<(String, String)> =
        outputs.iter().map(|r| (r.headers["sluice-partition"].clone(), r.headers["sluice-offset"].clone())).collect();
    assert_eq!(inputs.len(), total, "every input has an output ({} outputs, duplicates allowed)", outputs.len());
    let last = outputs.iter().map(|r| (r.key.as_str(), &r.value));
    assert_last_outputs(last, &reference, "last output on the summaries topic");

    // The store holds every partition's final state: a fresh host restores it all and
    // has nothing left to process.
    let check = dir.join("check");
    // A group of its own: the old one may still be settling after its members left, and
    // where a partition starts comes from the store, not from a group's offsets.
    let config = kafka.source("group = \"fleet-check\"\nstop_when_idle_s = 2\n")?;
    let run = run_ok(
        run_job(&operator_wasm("vehicle_stats"), &check, 6)
            .arg("--config")
            .arg(&config)
            .arg("--checkpoint-store")
            .arg(&store),
    )?;
    let report = String::from_utf8_lossy(&run.stderr);
    assert!(report.contains("processed 0 records"), "{report}");
    let from_store = report.lines().filter(|l| l.split_whitespace().nth(1) == Some("checkpoint")).count();
    assert_eq!(from_store, 6, "every partition came from the store:\n{report}");
    assert_state_matches(&dump_state(&check.join("state"))?, &reference, "restored from the shared store");
    Ok(())
}

#[test]
fn a_slow_operator_is_warned_about_and_its_host_is_not_evicted() -> Result<()> {
    let kafka = KafkaJob::on(KafkaBroker::start()?).topic("positions", 1).start()?;
    let (broker, dir) = (&kafka.broker, kafka.dir());
    // ~0.5 s per record, 8 records per batch: batches of seconds, past the 2 s session
    // timeout and max.poll.interval.ms, yet the poll loop goes on beside them.
    let input = dir.join("work.jsonl");
    let lines: Vec<String> =
        (0..16).map(|i| format!(r#"{{"vehicle_id":"v{}","action":"work","iterations":1000000000}}"#, i % 2)).collect();
    std::fs::write(&input, lines.join("\n") + "\n")?;
    broker.produce_lines("positions", &input)?;
    let config = dir.join("slow.toml");
    std::fs::write(
        &config,
        format!(
            "[operator]\npath = \"set-by-flag.wasm\"\ncall_timeout_ms = 10000\n[state]\ncommit_every = 8\n\
             [source]\nkind = \"kafka\"\nbrokers = \"{}\"\ntopic = \"positions\"\nstop_when_idle_s = 3\n\
             [source.properties]\n\"session.timeout.ms\" = \"2000\"\n\"heartbeat.interval.ms\" = \"500\"\n\
             \"max.poll.interval.ms\" = \"2000\"\n",
            broker.bootstrap
        ),
    )?;
    let run = run_ok(run_job(&operator_wasm("probe"), dir, 1).arg("--config").arg(&config).env("SLUICE_LOG", "info"))?;
    let log = String::from_utf8_lossy(&run.stderr);
    assert!(log.contains(&format!("reaches 1000 ms, {SLOW_BATCH}")), "the slow-batch warning:\n{log}");
    assert_eq!(log.matches(&format!("{ASSIGNED} [0]")).count(), 1, "assigned once, never evicted:\n{log}");
    assert!(!log.contains("lost"), "{log}");
    let outputs = read_jsonl(&dir.join("out.jsonl"))?;
    assert_eq!(outputs.len(), 16, "every record processed once");
    Ok(())
}

#[test]
fn a_static_member_restarted_within_its_session_timeout_moves_no_partitions() -> Result<()> {
    let kafka = KafkaJob::on(KafkaBroker::start()?).topic("positions", 4).start()?;
    let (broker, dir) = (&kafka.broker, kafka.dir());
    let all = kafka.generate("all.jsonl", 100, 8_000)?;
    let chunks = split_lines(&all, 2)?;
    broker.produce_lines("positions", &chunks[0])?;
    let host = |name: &str| -> Result<Host> {
        let home = dir.join(name);
        std::fs::create_dir_all(&home)?;
        let settings = format!(
            "group = \"static\"\ninstance_id = \"{name}\"\n[source.properties]\n\"session.timeout.ms\" = \"20000\"\n"
        );
        let config = positions_source(&home, &broker.bootstrap, &settings)?;
        kafka.host(name, 4, &config, Some(&dir.join("store")), &[])
    };
    let minute = Duration::from_secs(60);
    // Both join the group's first generation (tansu waits ~3 s for members to gather).
    let (mut a, mut b) = (host("a")?, host("b")?);
    a.wait_for(RESUMED, 1, minute)?;
    b.wait_for(RESUMED, 1, minute)?;
    broker.wait_committed("static", "positions", 4_000, minute)?;
    let owned = |log: &str| -> BTreeSet<String> {
        log.lines()
            .filter(|l| l.contains(RESUMED))
            .filter_map(|l| l.split("partition=").nth(1))
            .map(|p| p.trim().to_string())
            .collect()
    };
    let before_b = b.log().matches("rebalance ").count();

    // A graceful stop and an immediate restart under the same instance id.
    a.terminate()?;
    let a_before: BTreeSet<String> = owned(&a.log()).difference(&owned(&b.log())).cloned().collect();
    let log_len = a.log().len();
    let resumed_before = a.log().matches(RESUMED).count();
    let mut a = host("a")?;
    a.wait_for(RESUMED, resumed_before + a_before.len(), minute)?;
    let a_after = owned(&a.log()[log_len..]);
    broker.produce_lines("positions", &chunks[1])?;
    broker.wait_committed("static", "positions", 8_000, minute)?;
    assert_eq!(a_after, a_before, "a got its own partitions back:\n{}", a.log());
    assert_eq!(b.log().matches("rebalance ").count(), before_b, "b saw no rebalance:\n{}", b.log());
    a.terminate()?;
    b.terminate()?;
    Ok(())
}

/// A static member fenced by another that joined with its `instance_id` is dead — its
/// consumer fails for good — and its host ends with that error, naming the setting,
/// rather than idle on forever; the newcomer runs the partition. On noida-db, which
/// fences the older of two static members of one id (tansu 0.6 never answers
/// `FENCED_INSTANCE_ID`).
#[test]
fn a_static_member_fenced_by_another_with_its_instance_id_ends_its_run() -> Result<()> {
    let kafka = KafkaJob::on(KafkaBroker::start_transactional()?).topic("positions", 1).start()?;
    let broker = &kafka.broker;
    let input = kafka.generate("positions.jsonl", 10, 100)?;
    broker.produce_lines("positions", &input)?;
    let settings = "group = \"twins\"\ninstance_id = \"twin\"\n[source.properties]\n\
                    \"heartbeat.interval.ms\" = \"500\"\n\"session.timeout.ms\" = \"6000\"\n";
    let config = kafka.source(settings)?;
    let minute = Duration::from_secs(60);
    let mut first = kafka.host("first", 1, &config, None, &["--no-checkpoints"])?;
    first.wait_for(RESUMED, 1, minute)?;
    let mut second = kafka.host("second", 1, &config, None, &["--no-checkpoints"])?;
    let status = first.wait_exit(minute)?;
    assert!(!status.success(), "the fenced member's run failed:\n{}", first.log());
    let log = first.log();
    assert!(log.contains(MEMBER_FAILED) && log.contains("instance_id = \"twin\""), "{log}");
    second.wait_for(RESUMED, 1, minute)?;
    second.terminate()?;
    Ok(())
}
