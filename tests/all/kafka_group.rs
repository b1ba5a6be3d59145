//! Hosts sharing a Kafka consumer group on Apache Kafka, each test under both group
//! protocols (classic and KIP-848's consumer protocol): three hosts share the
//! partitions and a checkpoint store through `kill -9` and a graceful stop, never
//! running a partition twice; an operator slower than `max.poll.interval.ms` is warned
//! about and its host is not evicted, where a consumer that stops polling is; a static
//! member's restart moves no partitions, and of two members with one `instance_id` one
//! ends its run, naming the setting.

use anyhow::{Context, Result};
use sluice::events::{
    ASSIGNED, CLAIMED_ELSEWHERE, LAG, MEMBER_FAILED, OFFSETS_JUMP, RESUMED, REVOKED, SLOW_BATCH, STOPPED,
};
use sluice_e2e::*;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// Three hosts share six partitions and a checkpoint store, under load, through a
/// `kill -9` and a graceful stop: no partition ever runs on two hosts at once (none
/// finds its partition claimed by another host in the store); the killed host's
/// partitions move once its session has timed out (the takeover is measured); the
/// stopped host's partitions resume exactly where it handed them over; every input has
/// an output, and the store ends with every partition's final state.
fn three_hosts_share_the_partitions_through_kill_9_and_a_graceful_stop(protocol: GroupProtocol) -> Result<()> {
    let kafka = KafkaJob::on(KafkaBroker::shared()?).topic("positions", 6).topic("summaries", 3).start()?;
    let (broker, dir) = (&kafka.broker, kafka.dir());
    let (vehicles, total) = (300, 48_000usize);
    let all = kafka.generate("all.jsonl", vehicles, total as u64)?;
    let chunks = split_lines(&all, 4)?;
    let store = dir.join("store");
    let config = kafka.source("fleet", &group_settings(protocol, ""))?;
    let output = broker.output("summaries");
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
    let mut killed_at = Instant::now();
    std::thread::scope(|scope| -> Result<()> {
        let loader = scope.spawn(|| broker.produce_lines("positions", &chunks[1]));
        std::thread::sleep(Duration::from_millis(500));
        b.kill_9()?;
        killed_at = Instant::now();
        loader.join().expect("the producer thread").map(drop)
    })?;
    let every_partition: BTreeSet<u32> = (0..6).collect();
    let running = |admin: &str| running_partitions(admin).unwrap_or_default();
    while running(&admin_a).into_keys().chain(running(&admin_c).into_keys()).collect::<BTreeSet<_>>() != every_partition
    {
        assert!(killed_at.elapsed() < minute, "nobody took over b's partitions:\n{}\n{}", a.log(), c.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    let takeover = killed_at.elapsed();
    println!(
        "{protocol:?}: b's partitions ran again on a and c {takeover:?} after its kill -9 (session timeout {SESSION_TIMEOUT:?})"
    );
    // The group learns of the death only when b's session times out, counted from its
    // last heartbeat (at most a second before the kill).
    assert!(
        takeover >= SESSION_TIMEOUT - Duration::from_secs(1),
        "taken over in {takeover:?}, before b's session timed out"
    );
    let mut b = host("b")?;
    b.wait_for(RESUMED, 1, minute)?;
    let admin_b = b.admin_url()?;

    // A graceful stop under load: c hands its partitions over, and each resumes on a or
    // b at exactly the offset c handed it over at.
    let (a_before, b_before) = (a.log().len(), b.log().len());
    let mut stopped_at = Instant::now();
    std::thread::scope(|scope| -> Result<()> {
        let loader = scope.spawn(|| broker.produce_lines("positions", &chunks[2]));
        std::thread::sleep(Duration::from_millis(300));
        stopped_at = Instant::now();
        c.terminate()?;
        loader.join().expect("the producer thread").map(drop)
    })?;
    let c_log = c.log();
    let handed: Vec<(u32, u64)> =
        (0..6).filter_map(|p| offsets_logged(&c_log, &handed_over(), p).last().map(|&o| (p, o))).collect();
    assert!(!handed.is_empty(), "c handed its partitions over:\n{c_log}");
    for &(p, offset) in &handed {
        let resumed = || -> Vec<u64> {
            let (log_a, log_b) = (a.log(), b.log());
            [offsets_logged(&log_a[a_before..], RESUMED, p), offsets_logged(&log_b[b_before..], RESUMED, p)].concat()
        };
        let started = Instant::now();
        while resumed().is_empty() {
            assert!(started.elapsed() < minute, "partition {p} never resumed after c's stop");
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(resumed(), [offset], "partition {p} resumed once, where c handed it over:\n{c_log}");
    }
    let handover_took = stopped_at.elapsed();
    let (log_a, log_b) = (a.log(), b.log());
    let paused: Vec<u64> = log_a[a_before..]
        .lines()
        .chain(log_b[b_before..].lines())
        .filter_map(|l| l.split("after ").nth(1)?.split(" ms paused").next()?.parse().ok())
        .collect();
    println!(
        "{protocol:?}: c's {} partitions resumed on a and b within {handover_took:?} of its SIGTERM, each paused \
         (ms, from its assignment) {paused:?}",
        handed.len()
    );
    broker.produce_lines("positions", &chunks[3])?;
    // Caught up when a and b together run every partition and every state they list
    // stands at its partition's end. Not the group's committed offsets: b committed those
    // before its kill -9, ahead of every state in the store.
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
        let log = host.log();
        assert!(!log.contains(OFFSETS_JUMP), "host {} skipped records:\n{log}", host.name);
        assert!(log.contains(LAG), "host {} reports its partitions' lag:\n{log}", host.name);
        assert!(!log.contains(CLAIMED_ELSEWHERE), "host {} ran a partition another host ran:\n{log}", host.name);
    }
    println!("how long each rebalance paused each partition (per host log):");
    for host in [&a, &b, &c] {
        let log = host.log();
        let rebalancing = [ASSIGNED, REVOKED, RESUMED, STOPPED];
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
    // A group of its own: where a partition starts comes from the store, not from a
    // group's offsets.
    let config = kafka.source("fleet-check", &format!("stop_when_idle_s = 2\n{}", group_settings(protocol, "")))?;
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

for_each_group_protocol!(three_hosts_share_the_partitions_through_kill_9_and_a_graceful_stop);

/// The seed's feedback loop, on Kafka's own group coordinator: an operator spends
/// longer than `max.poll.interval.ms` on each of a few records (within its CPU
/// deadline). Its host warns about the slow batches and is neither evicted nor
/// rebalanced: one assignment, one group generation, every record processed once —
/// the poll loop goes on beside the worker. A plain consumer with the same settings
/// that stops polling for as long is evicted (so the settings do bite).
fn a_slow_operator_is_warned_about_and_its_host_is_not_evicted(protocol: GroupProtocol) -> Result<()> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let kafka = KafkaJob::on(KafkaBroker::shared()?).topic("positions", 1).start()?;
    let (broker, dir) = (&kafka.broker, kafka.dir());
    // librdkafka's floor for a classic member: max.poll.interval.ms ≥ session.timeout.ms.
    let max_poll = SESSION_TIMEOUT;
    let max_poll_setting = format!("\"max.poll.interval.ms\" = \"{}\"\n", max_poll.as_millis());
    // Three records of billions of iterations each (seconds of CPU, past
    // max.poll.interval.ms), then quick ones.
    let input = dir.join("work.jsonl");
    let lines: Vec<String> = (0..6)
        .map(|i| {
            let iterations: u64 = if i < 3 { 30_000_000_000 } else { 1 };
            format!(r#"{{"vehicle_id":"v{}","action":"work","iterations":{iterations}}}"#, i % 2)
        })
        .collect();
    std::fs::write(&input, lines.join("\n") + "\n")?;
    broker.produce_lines("positions", &input)?;
    let config = dir.join("slow.toml");
    std::fs::write(
        &config,
        format!(
            "[operator]\npath = \"set-by-flag.wasm\"\ncall_timeout_ms = 60000\n[state]\ncommit_every = 1\n\
             [source]\nkind = \"kafka\"\nbrokers = \"{}\"\ntopic = {:?}\ngroup = {:?}\nstop_when_idle_s = 3\n{}",
            broker.bootstrap,
            broker.name("positions"),
            broker.name("slow"),
            group_settings(protocol, &max_poll_setting)
        ),
    )?;
    let run = run_ok(run_job(&operator_wasm("probe"), dir, 1).arg("--config").arg(&config).env("SLUICE_LOG", "info"))?;
    let log = String::from_utf8_lossy(&run.stderr);
    let warning =
        log.lines().find(|l| l.contains(SLOW_BATCH)).with_context(|| format!("the slow-batch warning:\n{log}"))?;
    let slowest: f64 = warning
        .split(" ms reaches")
        .next()
        .and_then(|head| head.rsplit("max ").next())
        .and_then(|ms| ms.parse().ok())
        .with_context(|| format!("the slowest batch in: {warning}"))?;
    assert!(slowest > max_poll.as_secs_f64() * 1e3, "a batch outlasted max.poll.interval.ms: {warning}");
    // The rebalances: the first assignment, and the revocation as the job stops.
    let rebalances: Vec<&str> = log.lines().filter(|l| l.contains("(generation ")).collect();
    assert_eq!(rebalances.len(), 2, "assigned once, never evicted, revoked at the stop:\n{log}");
    assert!(rebalances[0].contains(&format!("{ASSIGNED} [0]")), "{log}");
    let generations: BTreeSet<&str> =
        log.lines().filter_map(|l| l.split("(generation ").nth(1)?.split(')').next()).collect();
    assert_eq!(generations.len(), 1, "one group generation all along: {generations:?}\n{log}");
    assert!(!log.contains("lost"), "{log}");
    let outputs = read_jsonl(&dir.join("out.jsonl"))?;
    assert_eq!(outputs.len(), 6, "every record processed once");
    println!(
        "{protocol:?}: the slowest batch took {slowest:.0} ms against max.poll.interval.ms {max_poll:?}; generation {generations:?} throughout"
    );

    // A consumer that stops polling for longer than max.poll.interval.ms is evicted.
    let mut settings = broker.consumer_config("slow-control");
    settings.set("group.protocol", if protocol == GroupProtocol::Classic { "classic" } else { "consumer" });
    settings.set("max.poll.interval.ms", max_poll.as_millis().to_string());
    if protocol == GroupProtocol::Classic {
        settings.set("session.timeout.ms", SESSION_TIMEOUT.as_millis().to_string());
    }
    let consumer: BaseConsumer = settings.create()?;
    consumer.subscribe(&[&broker.name("positions")])?;
    let started = Instant::now();
    while consumer.assignment()?.count() == 0 {
        assert!(started.elapsed() < Duration::from_secs(30), "the control consumer was never assigned");
        consumer.poll(Duration::from_millis(100));
    }
    std::thread::sleep(max_poll + Duration::from_secs(2));
    let evicted = (0..50).find_map(|_| match consumer.poll(Duration::from_millis(100)) {
        Some(Err(e)) if e.to_string().contains("poll interval") => Some(e.to_string()),
        _ => None,
    });
    assert!(evicted.is_some(), "a consumer that stopped polling was not evicted");
    Ok(())
}

for_each_group_protocol!(a_slow_operator_is_warned_about_and_its_host_is_not_evicted);

/// A static member stopped gracefully and started again within its session timeout
/// gets its own partitions back, and the other member sees no rebalance.
fn a_static_member_restarted_within_its_session_timeout_moves_no_partitions(protocol: GroupProtocol) -> Result<()> {
    let kafka = KafkaJob::on(KafkaBroker::shared()?).topic("positions", 4).start()?;
    let (broker, dir) = (&kafka.broker, kafka.dir());
    let all = kafka.generate("all.jsonl", 100, 8_000)?;
    let chunks = split_lines(&all, 2)?;
    broker.produce_lines("positions", &chunks[0])?;
    let host = |name: &str| -> Result<Host> {
        let home = dir.join(name);
        std::fs::create_dir_all(&home)?;
        let settings = format!("instance_id = \"{name}\"\n{}", group_settings(protocol, ""));
        let (positions, group) = (broker.name("positions"), broker.name("static"));
        let config = positions_source(&home, &broker.bootstrap, &positions, &group, &settings)?;
        kafka.host(name, 4, &config, Some(&dir.join("store")), &[])
    };
    let minute = Duration::from_secs(60);
    // b joins once a runs every partition, and takes two of them.
    let mut a = host("a")?;
    a.wait_for(RESUMED, 4, minute)?;
    let mut b = host("b")?;
    b.wait_for(RESUMED, 2, minute)?;
    let committed = broker.wait_committed("static", "positions", 4_000, minute);
    committed.with_context(|| format!("host logs:\n{}\n{}", a.log(), b.log()))?;
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

for_each_group_protocol!(a_static_member_restarted_within_its_session_timeout_moves_no_partitions);

/// Of two members of one `instance_id`, one is dead — its consumer fails for good —
/// and its host ends with that error, naming the setting, rather than idle on
/// forever; the other runs the partition. A classic group fences the member that was
/// there first; a KIP-848 group refuses the newcomer.
fn a_static_member_whose_instance_id_another_holds_ends_its_run(protocol: GroupProtocol) -> Result<()> {
    let kafka = KafkaJob::on(KafkaBroker::shared()?).topic("positions", 1).start()?;
    let broker = &kafka.broker;
    let input = kafka.generate("positions.jsonl", 10, 100)?;
    broker.produce_lines("positions", &input)?;
    let config = kafka.source("twins", &format!("instance_id = \"twin\"\n{}", group_settings(protocol, "")))?;
    let minute = Duration::from_secs(60);
    let mut first = kafka.host("first", 1, &config, None, &["--no-checkpoints"])?;
    first.wait_for(RESUMED, 1, minute)?;
    let second = kafka.host("second", 1, &config, None, &["--no-checkpoints"])?;
    let (mut dead, mut alive) = match protocol {
        GroupProtocol::Classic => (first, second),
        GroupProtocol::Consumer => (second, first),
    };
    let status = dead.wait_exit(minute)?;
    assert!(!status.success(), "the refused member's run failed:\n{}", dead.log());
    let log = dead.log();
    assert!(log.contains(MEMBER_FAILED) && log.contains("instance_id = \"twin\""), "{log}");
    alive.wait_for(RESUMED, 1, minute)?;
    alive.terminate()?;
    Ok(())
}

for_each_group_protocol!(a_static_member_whose_instance_id_another_holds_ends_its_run);
