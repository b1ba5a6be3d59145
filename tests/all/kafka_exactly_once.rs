//! Exactly-once outputs (`[sink] guarantee = "exactly-once"`) on Apache Kafka, what
//! they rely on of Kafka's transactions checked first (a `read_committed` consumer skips
//! aborted records; a zombie is fenced): outputs survive `kill -9` at every step of a
//! commit, and the death of the partitions' leader in a three-node cluster; a silent
//! replay runs the version whose outputs it does not send again; a fenced partition
//! stops alone and takes its transactions back; one that stops alone aborts its open
//! transaction; two jobs whose earlier transactional ids were one keep their own; a host
//! of an earlier version is fenced; dead letters are in the transactions.

use anyhow::{Context, Result};
use serde_json::{Value, json};
use sluice::events::{ABORTED, COVERED, FENCED, REPLAYED_SILENTLY, RESTARTING, STOPPED_ALONE};
use sluice::record::DeadLetterKind;
use sluice::sink::transaction::{legacy_transactional_id, transactional_id};
use sluice::worker::{AFTER_SEND, BEFORE_SEND, OUTPUTS_COMMITTED, STATE_COMMITTED};
use sluice_e2e::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Kafka does what the exactly-once tests rely on (checked with plain librdkafka
/// clients, no sluice involved): a `read_committed` consumer sees the records
/// of committed transactions only, with gaps in their offsets where markers and aborted
/// records are, and a producer whose `transactional.id` another producer took over can
/// no longer commit.
#[test]
fn kafka_hides_aborted_records_from_read_committed_consumers_and_fences_zombies() -> Result<()> {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let broker = KafkaBroker::shared()?;
    broker.create_topic("transactions", 1)?;
    let (transactions, id) = (broker.name("transactions"), broker.name("check"));
    let timeout = Duration::from_secs(30);
    let producer = || -> Result<BaseProducer> {
        let producer: BaseProducer = broker.client_config().set("transactional.id", &id).create()?;
        producer.init_transactions(timeout)?;
        Ok(producer)
    };
    let send = |producer: &BaseProducer, value: &str| -> Result<()> {
        producer.begin_transaction()?;
        producer.send(BaseRecord::<str, str>::to(&transactions).payload(value)).map_err(|(e, _)| e)?;
        producer.flush(timeout)?;
        Ok(())
    };
    let first = producer()?;
    send(&first, "committed")?;
    first.commit_transaction(timeout)?;
    send(&first, "aborted")?;
    first.abort_transaction(timeout)?;
    send(&first, "fenced")?;
    let successor = producer()?;
    assert!(first.commit_transaction(timeout).is_err(), "a producer whose id was taken over committed");
    send(&successor, "committed too")?;
    successor.commit_transaction(timeout)?;
    // What a `read_committed` consumer sees, and at which offsets: the offsets between
    // (a commit marker, the aborted and fenced records and their abort markers) are
    // never delivered, the evidence that a jump in offsets is legitimate on a topic
    // written in transactions.
    let read = broker.read_from("transactions", 0, 0, 10)?;
    assert_eq!(read, [(0, "committed".to_string()), (6, "committed too".to_string())]);
    Ok(())
}

/// Exactly-once outputs (`[sink] guarantee = "exactly-once"`): the host is killed with `kill -9` at each
/// step of a commit — a batch processed but not sent; sent but not committed; its
/// transaction committed but not its state; its state committed — then restarted. A
/// `read_committed` consumer sees exactly one output per input, each vehicle's last
/// one its final summary, and the state is the reference fold.
#[test]
fn exactly_once_outputs_survive_kill_9_at_every_step_of_the_commit_protocol() -> Result<()> {
    use std::os::unix::process::ExitStatusExt;
    let kafka = KafkaJob::on(KafkaBroker::shared()?).start()?;
    let (broker, dir) = (&kafka.broker, kafka.dir());
    let (vehicles, count) = (100, 3_000);
    let input = kafka.generate("input.jsonl", vehicles, count)?;
    let reference = Reference::fold(&input)?;
    for point in [BEFORE_SEND, AFTER_SEND, OUTPUTS_COMMITTED, STATE_COMMITTED] {
        let home = dir.join(point);
        let (positions, summaries) = (format!("positions-{point}"), format!("summaries-{point}"));
        broker.create_topic(&positions, 2)?;
        broker.create_topic(&summaries, 2)?;
        broker.produce_lines(&positions, &input)?;
        // A static member: the same `instance_id` replaces the killed one at once,
        // where a new member would wait for the killed one's session to time out.
        let settings = "stop_when_idle = \"2s\"\ninstance_id = \"eos-host\"";
        let job = exactly_once_job(&home, broker, &format!("eos-{positions}"), &positions, &summaries, settings)?;
        // The third pass: records and commits came before it, more come after.
        let killed = job().env("SLUICE_KILL_AT", format!("{point}:3")).output()?;
        let log = String::from_utf8_lossy(&killed.stderr);
        assert_eq!(killed.status.signal(), Some(9), "killed at {point}:\n{log}");
        let restarted = run_ok(job().env("SLUICE_LOG", "info"))?;
        let log = String::from_utf8_lossy(&restarted.stderr);
        let context = format!("killed at {point}, restarted");
        assert_each_input_has_one_output(&broker.read_topic(&summaries)?, count, &reference, &context);
        assert_state_matches(&dump_state(&home.join("state"))?, &reference, &context);
        // A kill between a transaction's commit and its state's leaves records whose
        // outputs are committed and whose state is not. (A kill at another point may too:
        // the other partition's worker can be between the two at that moment.)
        if point == OUTPUTS_COMMITTED {
            assert!(log.contains(REPLAYED_SILENTLY), "killed at {point}:\n{log}");
        }
    }
    Ok(())
}

/// A three-node cluster loses the leader of the job's input partitions mid-run (`kill
/// -9` of that node, while records are produced), which is also its group's coordinator:
/// the job goes on once leadership moves to surviving nodes, and a `read_committed`
/// consumer sees exactly one output per input; the state is the reference fold. Every
/// topic is replicated to the three nodes and written to two at least
/// (`min.insync.replicas`), so nothing acknowledged is lost. A transaction's commit
/// to the dead coordinator is one librdkafka can wait on for good: it is given up after
/// its timeout, and the partition starts again.
#[test]
fn exactly_once_outputs_stay_exactly_once_when_the_partitions_leader_dies() -> Result<()> {
    let broker = KafkaBroker::start_cluster(3)?;
    broker.create_topic("positions", 2)?;
    broker.create_topic("summaries", 2)?;
    let dir = tempfile::tempdir()?;
    let (vehicles, count) = (200, 20_000);
    let input = dir.path().join("input.jsonl");
    generate(&input, vehicles, count, KAFKA_SEED)?;
    let halves = split_lines(&input, 2)?;
    broker.produce_lines("positions", &halves[0])?;
    let home = dir.path().join("host");
    let leader = broker.leader("positions", 0)?;
    let minute = Duration::from_secs(60);
    let started = std::time::Instant::now();
    let group = loop {
        // The first lookup of a group creates the topic that says where groups live.
        let _ = broker.committed("eos-failover", "positions");
        let mut names = (0..64).map(|i| format!("eos-failover-{i}"));
        if let Some(group) = names.find(|g| broker.group_coordinator(g).is_ok_and(|node| node == leader)) {
            break group;
        }
        assert!(started.elapsed() < minute, "no group is coordinated by node {}", leader + 1);
        std::thread::sleep(Duration::from_millis(200));
    };
    let group = group.as_str();
    let mut host = {
        let job = exactly_once_job(&home, &broker, group, "positions", "summaries", "")?;
        Host::spawn("host", &mut job(), &home.join("log"))?
    };
    // A lookup the group coordinator is not ready to answer counts as nothing committed.
    while !broker.committed(group, "positions").is_ok_and(|c| c.values().any(|&offset| offset > 0)) {
        assert!(started.elapsed() < minute, "the job committed nothing:\n{}", host.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    let killed_at = std::time::Instant::now();
    std::thread::scope(|scope| -> Result<()> {
        let loader = scope.spawn(|| broker.produce_lines("positions", &halves[1]));
        std::thread::sleep(Duration::from_millis(300));
        broker.kill_node(leader)?;
        loader.join().expect("the producer thread").map(drop)
    })?;
    // Every record was acknowledged by the surviving replicas, so a new leader was elected;
    // a metadata lookup may still reach the dead node or name it for a moment.
    let moved = || broker.leader("positions", 0).is_ok_and(|now| now != leader);
    while !moved() {
        assert!(killed_at.elapsed() < minute, "partition 0's leadership moved off node {}", leader + 1);
        std::thread::sleep(Duration::from_millis(200));
    }
    let committed = broker.wait_committed(group, "positions", count as i64, Duration::from_secs(180));
    committed.with_context(|| format!("the host's log:\n{}", host.log()))?;
    println!("node {} killed: every record committed {:?} later", leader + 1, killed_at.elapsed());
    host.terminate()?;
    let reference = Reference::fold(&input)?;
    let context = format!("the leader (node {}) killed", leader + 1);
    assert_each_input_has_one_output(&broker.read_topic("summaries")?, count, &reference, &context);
    assert_state_matches(&dump_state(&home.join("state"))?, &reference, &context);
    Ok(())
}

/// A silent replay runs the version whose outputs it does not send again: a host
/// running version 1 with exactly-once outputs is killed between a transaction's commit
/// and its state's, and version 2 is deployed while no host runs. The restart processes
/// the records whose outputs are committed with version 1, switching to it at the offset
/// its state resumes at, and takes version 2 on at the offset the outputs are committed
/// up to; every input has one output, those past that offset by version 2.
#[test]
fn a_silent_replay_runs_the_version_whose_outputs_it_does_not_send_again() -> Result<()> {
    use sluice::events::REPLAYED_WITH;
    let kafka = KafkaJob::on(KafkaBroker::shared()?).topic("positions", 2).topic("summaries", 2).start()?;
    let (broker, dir) = (&kafka.broker, kafka.dir());
    let (vehicles, count) = (100, 3_000);
    let input = kafka.generate("input.jsonl", vehicles, count)?;
    broker.produce_lines("positions", &input)?;
    // Under the name of the job's operator, which the file's stem gives.
    let v1_file = dir.join("vehicle_stats.wasm");
    std::fs::copy(operator_wasm("vehicle_stats"), &v1_file)?;
    let config = dir.join("job.toml");
    let brokers = &broker.bootstrap;
    let (positions, summaries, group) = (broker.name("positions"), broker.name("summaries"), broker.name("eos-replay"));
    std::fs::write(
        &config,
        format!(
            "[operator]\npath = {v1_file:?}\n[source]\nkind = \"kafka\"\nbrokers = \"{brokers}\"\ntopic = \"{positions}\"\n\
             group = \"{group}\"\nstop_when_idle = \"2s\"\ninstance_id = \"replay-host\"\n[source.properties]\n\
             \"session.timeout.ms\" = \"6000\"\n\"heartbeat.interval.ms\" = \"500\"\n[sink]\nkind = \"kafka\"\n\
             brokers = \"{brokers}\"\ntopic = \"{summaries}\"\nguarantee = \"exactly-once\"\n[state]\ndir = {:?}\n\
             partitions = 2\nbatch_records = 100\ncommit_every = 500\n[dead_letter]\npath = {:?}\n[report]\ninterval_s = 0\n",
            dir.join("state"),
            dir.join("dead.jsonl"),
        ),
    )?;
    let job = || {
        let mut command = sluice();
        command.arg("run").arg("--config").arg(&config);
        command
    };
    let killed = job().env("SLUICE_KILL_AT", format!("{OUTPUTS_COMMITTED}:3")).output()?;
    assert!(!killed.status.success(), "killed: {}", String::from_utf8_lossy(&killed.stderr));
    let deployed = run_ok(
        sluice().arg("deploy").arg("vehicle_stats").arg(operator_wasm("vehicle_stats_v2")).arg("--config").arg(&config),
    )?;
    let v2 = String::from_utf8_lossy(&deployed.stdout)
        .split_whitespace()
        .find(|w| w.starts_with("vehicle_stats@"))
        .unwrap_or_default()
        .to_string();
    let restarted = run_ok(job().env("SLUICE_LOG", "info"))?;
    let log = String::from_utf8_lossy(&restarted.stderr);

    // `outputs committed up to offset N, state at S: records S..N are processed again
    // without outputs (…) partition=P`
    let silent: Vec<(String, u64, u64)> = log
        .lines()
        .filter(|line| line.contains(REPLAYED_SILENTLY))
        .map(|line| {
            let number =
                |after: &str| line.split(after).nth(1)?.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok();
            let partition = line.rsplit("partition=").next().unwrap_or_default().trim().to_string();
            (partition, number("state at ").unwrap_or(0), number(&format!("{COVERED} ")).unwrap_or(0))
        })
        .collect();
    assert!(!silent.is_empty(), "a kill between the commits leaves records to replay silently:\n{log}");
    let switches: Vec<&str> = log.lines().filter(|line| line.contains("switched from")).collect();
    for (partition, state_at, covered) in &silent {
        let in_partition = |line: &&&str| line.ends_with(&format!("partition={partition}"));
        let to_v1 = switches.iter().filter(in_partition).find(|l| l.contains(REPLAYED_WITH));
        let to_v1 = to_v1.with_context(|| format!("partition {partition} replays with version 1:\n{log}"))?;
        assert!(
            to_v1.contains(&format!("from {v2} to ")) && to_v1.contains(&format!("at offset {state_at} (")),
            "{to_v1}"
        );
        let to_v2 = switches.iter().filter(in_partition).find(|l| l.contains(&format!("to {v2} at offset {covered},")));
        assert!(to_v2.is_some(), "partition {partition} takes version 2 on at offset {covered}:\n{log}");
    }
    let outputs = broker.read_topic("summaries")?;
    assert_each_input_has_one_output(&outputs, count, &Reference::fold(&input)?, "killed between the commits");
    for (partition, _, covered) in &silent {
        let past: Vec<&KafkaRecord> = outputs
            .iter()
            .filter(|r| r.headers["sluice-partition"] == *partition)
            .filter(|r| r.headers["sluice-offset"].parse::<u64>().is_ok_and(|offset| offset >= *covered))
            .collect();
        assert!(past.iter().all(|r| r.headers["sluice-operator"] == v2), "partition {partition} past {covered}");
    }
    Ok(())
}

/// A fenced partition costs only itself, and takes its transactions back: while a host
/// runs, a producer takes over partition 0's transactions, as a zombie's late start would
/// (or the partition's next owner's, when this host is the zombie). More records come,
/// less than a batch per partition: partition 0's next commit fails naming the fencing,
/// nothing it produced since its last commit becomes visible, and partition 0 alone
/// stops; partition 1 goes on. Partition 0 starts again after a backoff, fencing the
/// other producer, and in the end every input has exactly one output.
#[test]
fn a_fenced_partition_stops_alone_and_takes_its_transactions_back() -> Result<()> {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let kafka = KafkaJob::on(KafkaBroker::shared()?).topic("positions", 2).topic("summaries", 2).start()?;
    let (broker, dir) = (&kafka.broker, kafka.dir());
    let (vehicles, count, last) = (50, 1_010, 10);
    let all = kafka.generate("all.jsonl", vehicles, count)?;
    let text = std::fs::read_to_string(&all)?;
    let lines: Vec<&str> = text.lines().collect();
    let (first, rest) = (dir.join("first.jsonl"), dir.join("rest.jsonl"));
    std::fs::write(&first, lines[..(count - last) as usize].join("\n") + "\n")?;
    std::fs::write(&rest, lines[(count - last) as usize..].join("\n") + "\n")?;
    broker.produce_lines("positions", &first)?;
    let job = exactly_once_job(dir, broker, "eos-positions", "positions", "summaries", "")?;
    let mut host = Host::spawn("host", &mut job(), &dir.join("log"))?;
    broker.wait_committed("eos-positions", "positions", (count - last) as i64, Duration::from_secs(60))?;

    let id = transactional_id(&broker.name("eos-positions"), &broker.name("positions"), 0);
    let successor: BaseProducer = broker.client_config().set("transactional.id", &id).create()?;
    successor.init_transactions(Duration::from_secs(30))?;
    broker.produce_lines("positions", &rest)?;
    host.wait_for(FENCED, 1, Duration::from_secs(60))?;
    host.wait_for(RESTARTING, 1, Duration::from_secs(10))?;
    let caught_up = broker.wait_committed("eos-positions", "positions", count as i64, Duration::from_secs(60));
    caught_up.with_context(|| format!("host log:\n{}", host.log()))?;
    host.terminate()?;
    let log = host.log();
    assert!(log.contains("partition 0 stopped") && !log.contains("partition 1 stopped"), "{log}");
    let reference = Reference::fold(&all)?;
    assert_each_input_has_one_output(&broker.read_topic("summaries")?, count, &reference, "after the fencing");
    assert_state_matches(&dump_state(&dir.join("state"))?, &reference, "after the fencing");
    // Its start took the transactions back: the other producer can no longer commit.
    successor.begin_transaction()?;
    successor.send(BaseRecord::<str, str>::to(&broker.name("summaries")).payload("stale")).map_err(|(e, _)| e)?;
    let committed =
        successor.flush(Duration::from_secs(30)).and_then(|()| successor.commit_transaction(Duration::from_secs(30)));
    assert!(committed.is_err(), "the other producer was not fenced");
    Ok(())
}

/// A partition that stops alone aborts the transaction it left open: partition 0 sends
/// the outputs of two records in its open transaction (commits come every 20 s, the
/// broker's transaction timeout is 10 min), then meets a record that traps in strict
/// mode and stops. Partition 1 writes to the same output partition and goes on
/// committing; a `read_committed` reader, which reads nothing past a transaction still
/// open, reads all of partition 1's outputs at once, and none of partition 0's.
#[test]
fn a_partition_that_stops_alone_aborts_its_open_transaction() -> Result<()> {
    let kafka = KafkaJob::on(KafkaBroker::shared()?).topic("positions", 2).topic("summaries", 1).start()?;
    let (broker, dir) = (&kafka.broker, kafka.dir());
    let (stopping, going) = (key_in_partition(0, 2), key_in_partition(1, 2));
    let record =
        |key: &str, action: &str| Ok((key.to_string(), json!({"vehicle_id": key, "action": action}).to_string()));
    let counts = |key: &str, n: usize| (0..n).map(|_| record(key, "count")).collect::<Vec<_>>();
    let mut first = counts(&stopping, 2);
    first.push(record(&stopping, "hog"));
    broker.produce("positions", first)?;
    let config = dir.join("job.toml");
    let brokers = &broker.bootstrap;
    let (positions, summaries, group) = (broker.name("positions"), broker.name("summaries"), broker.name("eos-abort"));
    std::fs::write(
        &config,
        format!(
            "[operator]\npath = {:?}\n[operator.retry]\nstrict = true\nbackoff = \"1ms\"\n[source]\nkind = \"kafka\"\n\
             brokers = \"{brokers}\"\ntopic = \"{positions}\"\ngroup = \"{group}\"\n[sink]\nkind = \"kafka\"\n\
             brokers = \"{brokers}\"\ntopic = \"{summaries}\"\nguarantee = \"exactly-once\"\n[sink.properties]\n\
             \"transaction.timeout.ms\" = \"600000\"\n[state]\ndir = {:?}\npartitions = 2\nbatch_records = 1\n\
             commit_interval = \"20s\"\n[report]\ninterval = 0\n",
            operator_wasm("probe"),
            dir.join("state")
        ),
    )?;
    let mut command = sluice();
    command.arg("run").arg("--config").arg(&config).arg("--no-checkpoints").arg("--dead-letter").arg(dir.join("dead"));
    let mut host = Host::spawn("host", &mut command, &dir.join("log"))?;
    host.wait_for(STOPPED_ALONE, 1, Duration::from_secs(60))?;
    broker.produce("positions", counts(&going, 5))?;
    broker.wait_committed("eos-abort", "positions", 5, Duration::from_secs(60))?;
    let outputs = broker.read_topic("summaries")?;
    let log = host.log();
    let keys: Vec<&str> = outputs.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, [going.as_str(); 5], "partition 1's outputs, none of partition 0's:\n{log}");
    assert!(log.contains(ABORTED), "{log}");
    Ok(())
}

/// Two exactly-once jobs whose transactional ids sluice once wrote alike
/// (`sluice-<group>-<topic>-<partition>`: group `eos-t` reading `u-v`, group `eos-t-u`
/// reading `v`) run side by side, both holding their partitions' transactions before the
/// records come: neither fences the other, and each gives every input of its own exactly
/// one output.
#[test]
fn exactly_once_jobs_whose_group_and_topic_names_run_together_keep_their_own_transactions() -> Result<()> {
    // A broker of its own: the shared one's prefixes would keep the names from running together.
    let kafka = KafkaJob::on(KafkaBroker::start()?).start()?;
    let (broker, dir) = (&kafka.broker, kafka.dir());
    let (vehicles, count) = (50, 2_000);
    let input = kafka.generate("input.jsonl", vehicles, count)?;
    let jobs = [("eos-t", "u-v", "out-a"), ("eos-t-u", "v", "out-b")];
    assert_eq!(legacy_transactional_id("eos-t", "u-v", 0), legacy_transactional_id("eos-t-u", "v", 0));
    let mut hosts = Vec::new();
    for (group, positions, summaries) in jobs {
        broker.create_topic(positions, 2)?;
        broker.create_topic(summaries, 2)?;
        let home = dir.join(group);
        let job = exactly_once_job(&home, broker, group, positions, summaries, "")?;
        hosts.push(Host::spawn(group, &mut job(), &home.join("log"))?);
    }
    for host in &mut hosts {
        host.wait_for(COVERED, 2, Duration::from_secs(60))?;
    }
    for (group, positions, _) in jobs {
        broker.produce_lines(positions, &input)?;
        let committed = broker.wait_committed(group, positions, count as i64, Duration::from_secs(60));
        committed.with_context(|| hosts.iter().map(|h| h.log()).collect::<Vec<_>>().join("\n"))?;
    }
    for host in &mut hosts {
        host.terminate()?;
    }
    let reference = Reference::fold(&input)?;
    for (group, _, summaries) in jobs {
        assert_each_input_has_one_output(&broker.read_topic(summaries)?, count, &reference, group);
    }
    Ok(())
}

/// An upgrade from a sluice that named transactional ids
/// `sluice-<group>-<topic>-<partition>`: a host of it still running both partitions,
/// each with a transaction open and an output in it, is fenced when this version takes
/// them over. Its transactions can no longer commit and their outputs never become
/// visible; this version gives every input exactly one output.
#[test]
fn an_older_sluice_still_running_a_partition_is_fenced_when_this_version_takes_it() -> Result<()> {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let kafka = KafkaJob::on(KafkaBroker::shared()?).topic("positions", 2).topic("summaries", 2).start()?;
    let (broker, dir) = (&kafka.broker, kafka.dir());
    let (vehicles, count) = (50, 1_000);
    let input = kafka.generate("input.jsonl", vehicles, count)?;
    broker.produce_lines("positions", &input)?;
    let timeout = Duration::from_secs(30);
    let mut older = Vec::new();
    for partition in 0..2 {
        let id = legacy_transactional_id(&broker.name("eos-positions"), &broker.name("positions"), partition);
        let producer: BaseProducer = broker.client_config().set("transactional.id", &id).create()?;
        producer.init_transactions(timeout)?;
        producer.begin_transaction()?;
        let summaries = broker.name("summaries");
        let record = BaseRecord::<str, str>::to(&summaries).key("older").payload("{}").partition(partition as i32);
        producer.send(record).map_err(|(e, _)| e)?;
        producer.flush(timeout)?;
        older.push(producer);
    }
    let job = exactly_once_job(dir, broker, "eos-positions", "positions", "summaries", "stop_when_idle = \"2s\"")?;
    run_ok(&mut job())?;
    for producer in &older {
        assert!(producer.commit_transaction(timeout).is_err(), "the older host's transaction committed");
    }
    let visible = broker.read_topic("summaries")?;
    assert!(visible.iter().all(|r| r.key != "older"), "an output of the older host became visible");
    assert_each_input_has_one_output(&visible, count, &Reference::fold(&input)?, "after the takeover");
    Ok(())
}

/// Under exactly-once outputs, dead letters on a topic are in the partition's
/// transactions: a `read_committed` consumer sees each once, also after a second run
/// that, its state gone, processes the same records again (silently: a committed
/// transaction holds their outputs and dead letters).
#[test]
fn exactly_once_dead_letters_are_in_the_transactions() -> Result<()> {
    let kafka =
        KafkaJob::on(KafkaBroker::shared()?).topic("positions", 1).topic("summaries", 1).topic("dead", 1).start()?;
    let (broker, dir) = (&kafka.broker, kafka.dir());
    let record = |action: &str| Ok(("k", json!({"vehicle_id": "k", "action": action}).to_string()));
    broker.produce("positions", ["count", "put-then-fail", "count"].map(record))?;
    let config = dir.join("job.toml");
    let brokers = &broker.bootstrap;
    let (positions, summaries, group) = (broker.name("positions"), broker.name("summaries"), broker.name("eos-dead"));
    let dead = broker.name("dead");
    std::fs::write(
        &config,
        format!(
            "[operator]\npath = {:?}\n[source]\nkind = \"kafka\"\nbrokers = \"{brokers}\"\ntopic = \"{positions}\"\n\
             group = \"{group}\"\nstop_when_idle = \"2s\"\n[sink]\nkind = \"kafka\"\nbrokers = \"{brokers}\"\n\
             topic = \"{summaries}\"\nguarantee = \"exactly-once\"\n[dead_letter]\ntopic = \"{dead}\"\n[state]\n\
             dir = {:?}\npartitions = 1\n[report]\ninterval = 0\n",
            operator_wasm("probe"),
            dir.join("state")
        ),
    )?;
    let run =
        || run_ok(sluice().env("SLUICE_LOG", "info").arg("run").arg("--config").arg(&config).arg("--no-checkpoints"));
    run()?;
    std::fs::remove_dir_all(dir.join("state"))?;
    let again = String::from_utf8(run()?.stderr)?;
    assert!(again.contains(REPLAYED_SILENTLY), "{again}");
    let dead = broker.read_topic("dead")?;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].headers["sluice-offset"], "1");
    assert_eq!(dead[0].headers["sluice-error"], DeadLetterKind::Rejected.name());
    let outputs: Vec<Value> = broker.read_topic("summaries")?.into_iter().map(|r| r.value).collect();
    assert_eq!(outputs, [json!({"count": 1}), json!({"count": 2})]);
    Ok(())
}

/// A `sluice run` of vehicle-stats in `dir` from the test's topic `positions` to its
/// `summaries` on `broker`, exactly once, in the test's consumer group `group`, with `more`
/// `[source]` settings; small batches and frequent commits, so a run passes many of each.
fn exactly_once_job<'a>(
    dir: &'a Path,
    broker: &'a KafkaBroker,
    group: &str,
    positions: &str,
    summaries: &'a str,
    more: &str,
) -> Result<impl Fn() -> Command + 'a> {
    std::fs::create_dir_all(dir)?;
    let config = dir.join("exactly-once.toml");
    let brokers = &broker.bootstrap;
    let (group, positions, summaries_name) = (broker.name(group), broker.name(positions), broker.name(summaries));
    std::fs::write(
        &config,
        format!(
            "[operator]\npath = \"set-by-flag.wasm\"\n[source]\nkind = \"kafka\"\nbrokers = \"{brokers}\"\n\
             topic = \"{positions}\"\ngroup = \"{group}\"\n{more}\n[source.properties]\n\
             \"session.timeout.ms\" = \"6000\"\n\"heartbeat.interval.ms\" = \"500\"\n[sink]\nkind = \"kafka\"\nbrokers = \"{brokers}\"\n\
             topic = \"{summaries_name}\"\nguarantee = \"exactly-once\"\n[state]\nbatch_records = 100\ncommit_every = 500\n"
        ),
    )?;
    Ok(move || {
        let mut command = run_job(&operator_wasm("vehicle_stats"), dir, 2);
        command.arg("--config").arg(&config).arg("--output").arg(broker.output(summaries));
        command
    })
}

/// Fails unless `outputs` hold exactly one output for each of `count` inputs (by the
/// headers naming the input) and each vehicle's last output is its final summary.
fn assert_each_input_has_one_output(outputs: &[KafkaRecord], count: u64, reference: &Reference, context: &str) {
    let mut seen: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    for r in outputs {
        *seen.entry((r.headers["sluice-partition"].as_str(), r.headers["sluice-offset"].as_str())).or_default() += 1;
    }
    let repeated: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).take(5).collect();
    assert!(repeated.is_empty(), "{context}: inputs with more than one output, e.g. {repeated:?}");
    assert_eq!(seen.len() as u64, count, "{context}: inputs with an output");
    assert_last_outputs(outputs.iter().map(|r| (r.key.as_str(), &r.value)), reference, context);
}
