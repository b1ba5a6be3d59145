//! A Kafka source against Apache Kafka, what it relies on of the broker checked first
//! (a fetch from inside a batch, as every resume asks, yields every record from there): each
//! partition starts at the offset stored with its state, not at the group's committed
//! offset; an unreachable broker or a missing topic is named at the start; headers,
//! tombstones and null keys reach the operator, headers forging the source's marks
//! dropped; a state past the end of a recreated topic stops its partition alone; a
//! broker that stops answering is reconnected to; a partition whose worker fails is
//! paused while the others go on.

use anyhow::{Context, Result};
use serde_json::{Value, json};
use sluice::events::{PARTITIONS_ADDED, RESERVED_HEADER, STOPPED_ALONE};
use sluice::record::{DeadLetterKind, NULL_KEY_HEADER, TOMBSTONE_HEADER};
use sluice_e2e::*;
use std::time::Duration;

/// A fetch from an offset inside a multi-record batch, as every resume after a
/// restore, a pause or a handover asks, yields every record from that offset on: a
/// plain consumer (no sluice involved) assigned inside and at the edges of batches of
/// 100 gets exactly those records. (Kafka answers with the whole batch; the client
/// drops what comes before the offset.)
#[test]
fn a_fetch_from_inside_a_batch_yields_every_record_from_its_offset() -> Result<()> {
    let broker = KafkaBroker::shared()?;
    broker.create_topic("batched", 1)?;
    let mut producer = broker.client_config();
    // 1,000 records sent at once, 100 to a produce request.
    producer.set("batch.num.messages", "100").set("linger.ms", "1000");
    broker.produce_with(producer, "batched", (0..1_000).map(|i| Ok((format!("k{i}"), i.to_string(), None))))?;
    for start in [0, 37, 99, 100, 101, 555, 999] {
        let read = broker.read_from("batched", 0, start, 1_000 - start as usize)?;
        let expected: Vec<(i64, String)> = (start..1_000).map(|i| (i, i.to_string())).collect();
        assert_eq!(read.first(), expected.first(), "the first record of a fetch at offset {start}");
        assert_eq!(read, expected, "every record from offset {start} on");
    }
    Ok(())
}

#[test]
fn a_kafka_source_starts_each_partition_at_the_offset_stored_with_its_state() -> Result<()> {
    let kafka = KafkaJob::on(KafkaBroker::shared()?).topic("positions", 3).start()?;
    let (broker, dir) = (&kafka.broker, kafka.dir());
    let config = kafka.source("vehicle-stats", "stop_when_idle_s = 2\n")?;
    let job = || {
        let mut command = run_job(&operator_wasm("vehicle_stats"), dir, 3);
        command.arg("--config").arg(&config).arg("--no-checkpoints");
        command
    };
    let err = run_err(run_job(&operator_wasm("vehicle_stats"), dir, 2).arg("--config").arg(&config))?;
    let positions = broker.name("positions");
    assert!(err.contains(&format!("topic {positions} has 3 partitions but the job has 2")), "{err}");
    assert!(err.contains(PARTITIONS_ADDED), "what to do if partitions were added: {err}");
    assert!(!dir.join("state").exists(), "refused before any state was written");

    let (vehicles, first, total) = (150, 4_000, 6_000usize);
    let all = kafka.generate("all.jsonl", vehicles, total as u64)?;
    let text = std::fs::read_to_string(&all)?;
    let lines: Vec<&str> = text.lines().collect();
    let (head, tail) = lines.split_at(first);
    let (head_path, tail_path) = (dir.join("head.jsonl"), dir.join("tail.jsonl"));
    std::fs::write(&head_path, head.join("\n") + "\n")?;
    std::fs::write(&tail_path, tail.join("\n") + "\n")?;

    broker.produce_lines("positions", &head_path)?;
    run_ok(&mut job())?;
    assert_eq!(read_jsonl(&dir.join("out.jsonl"))?.len(), first, "every record consumed once");
    assert_state_matches(&dump_state(&dir.join("state"))?, &Reference::fold(&head_path)?, "after the first run");

    broker.produce_lines("positions", &tail_path)?;
    run_ok(&mut job())?;
    assert_eq!(read_jsonl(&dir.join("out.jsonl"))?.len(), total, "the restart read only the new records");
    let reference = Reference::fold(&all)?;
    assert_state_matches(&dump_state(&dir.join("state"))?, &reference, "after the restart");

    // The group has committed offsets at the end of the topic; state that is empty
    // again must start at 0 anyway, because the offset lives with the state.
    std::fs::remove_dir_all(dir.join("state"))?;
    run_ok(&mut job())?;
    assert_eq!(read_jsonl(&dir.join("out.jsonl"))?.len(), 2 * total, "empty state re-read the whole topic");
    assert_state_matches(&dump_state(&dir.join("state"))?, &reference, "rebuilt from the topic");
    Ok(())
}

#[test]
fn an_unreachable_broker_or_a_missing_topic_is_named_at_the_start() -> Result<()> {
    let kafka = KafkaJob::on(KafkaBroker::shared()?).start()?;
    let (broker, dir) = (&kafka.broker, kafka.dir());
    let closed = free_port()?;
    let (positions, group) = (broker.name("positions"), broker.name("named"));
    for (brokers, expected) in [
        (format!("127.0.0.1:{closed}"), format!("reading metadata of topic {positions} from 127.0.0.1:{closed}")),
        (broker.bootstrap.clone(), format!("topic {positions} does not exist on {}", broker.bootstrap)),
    ] {
        let config = positions_source(dir, &brokers, &positions, &group, "")?;
        let err = run_err(run_job(&operator_wasm("vehicle_stats"), dir, 3).arg("--config").arg(&config))?;
        assert!(err.contains(&expected), "{err}");
        assert!(!dir.join("state").exists(), "refused before any state was written");
    }
    // Topics written to are checked at the start too: producers never create one.
    broker.create_topic("out", 1)?;
    let (out, missing) = (broker.name("out"), broker.name("missing"));
    for (sink_topic, dead_topic, expected) in [
        (&missing, &out, format!("[sink] topic {missing} does not exist on {}", broker.bootstrap)),
        (&out, &missing, format!("[dead_letter] topic {missing} does not exist on {}", broker.bootstrap)),
    ] {
        let config = dir.join("sink.toml");
        let settings = format!(
            "[operator]\npath = {:?}\n[sink]\nkind = \"kafka\"\nbrokers = \"{}\"\ntopic = \"{sink_topic}\"\n\
             [dead_letter]\ntopic = \"{dead_topic}\"\n[state]\ndir = {:?}\n",
            operator_wasm("vehicle_stats"),
            broker.bootstrap,
            dir.join("state")
        );
        std::fs::write(&config, settings)?;
        let err = run_err(sluice().arg("run").arg("--config").arg(&config).args(["--count", "10"]))?;
        assert!(err.contains(&expected), "{err}");
    }
    Ok(())
}

/// What Kafka carries reaches the operator: its headers, and a tombstone (no value)
/// marked by `sluice-tombstone`. A record without a key goes to the dead letters by
/// default, its state would be every keyless record's; with `null_keys = "operator"` it
/// reaches the operator, its key empty and marked by `sluice-null-key`. The marks are the
/// source's alone: records that carry headers of those names themselves (an empty key
/// and value with both) have them dropped, warned about, and pass for nothing.
#[test]
fn headers_tombstones_and_null_keys_reach_the_operator() -> Result<()> {
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let kafka = KafkaJob::on(KafkaBroker::shared()?).topic("positions", 1).start()?;
    let broker = &kafka.broker;
    let positions = broker.name("positions");
    let producer: BaseProducer = broker.client_config().create()?;
    let traced = OwnedHeaders::new()
        .insert(Header { key: "trace", value: Some("abc") })
        .insert(Header { key: "span", value: Some("1") });
    producer.send(BaseRecord::<str, str>::to(&positions).key("k").headers(traced)).map_err(|(e, _)| e)?;
    producer.send(BaseRecord::<str, str>::to(&positions).payload("")).map_err(|(e, _)| e)?;
    producer.send(BaseRecord::<str, str>::to(&positions).key("").payload("")).map_err(|(e, _)| e)?;
    let forged = OwnedHeaders::new()
        .insert(Header { key: NULL_KEY_HEADER, value: Some("") })
        .insert(Header { key: TOMBSTONE_HEADER, value: Some("") })
        .insert(Header { key: "trace", value: Some("def") });
    let forged = BaseRecord::<str, str>::to(&positions).key("").payload("").headers(forged);
    producer.send(forged).map_err(|(e, _)| e)?;
    producer.flush(Duration::from_secs(30))?;
    let tombstone = json!({"empty": true, "headers": {"trace": "abc", "span": "1", TOMBSTONE_HEADER: ""}});
    let empty_key = json!({"empty": true, "headers": {}});
    let unmarked = json!({"empty": true, "headers": {"trace": "def"}});
    /// A run's outputs as (key, value), and its dead letters.
    type Run = (Vec<(Value, Value)>, Vec<Value>);
    let run = |name: &str, more: &str| -> Result<Run> {
        let dir = kafka.dir().join(name);
        std::fs::create_dir_all(&dir)?;
        let config = kafka.source(name, &format!("stop_when_idle = \"2s\"\n{more}"))?;
        let run =
            run_ok(run_job(&operator_wasm("probe"), &dir, 1).arg("--config").arg(&config).arg("--no-checkpoints"))?;
        let log = String::from_utf8_lossy(&run.stderr);
        assert!(log.contains(&format!("the record at offset 3 {RESERVED_HEADER}")), "{log}");
        let outputs = read_jsonl(&dir.join("out.jsonl"))?.into_iter().map(|o| (o["key"].clone(), o["value"].clone()));
        let dead = if dir.join("dead.jsonl").exists() { read_jsonl(&dir.join("dead.jsonl"))? } else { Vec::new() };
        Ok((outputs.collect(), dead))
    };

    let (outputs, dead) = run("refused", "")?;
    let forged = (json!(""), unmarked);
    assert_eq!(outputs, [(json!("k"), tombstone.clone()), (json!(""), empty_key.clone()), forged.clone()]);
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert!(dead[0]["error"] == DeadLetterKind::NullKey.name() && dead[0]["offset"] == 1, "{}", dead[0]);

    let (outputs, dead) = run("passed", "null_keys = \"operator\"\n")?;
    let keyless = json!({"empty": true, "headers": {NULL_KEY_HEADER: ""}});
    assert_eq!(outputs, [(json!("k"), tombstone), (json!(""), keyless), (json!(""), empty_key), forged]);
    assert!(dead.is_empty(), "{dead:?}");
    Ok(())
}

/// A state whose offset its log no longer holds is never jumped over in silence (as
/// librdkafka's `auto.offset.reset` would): the topic deleted and recreated shorter for
/// partition 0 (longer for partition 1), partition 0 stops alone, naming its state's
/// offset and the log's end, whatever `offset_out_of_range` says, its state untouched;
/// partition 1 goes on with its new records. (A log whose head retention deleted is the
/// unit tests' `resume_offset`.)
#[test]
fn a_state_past_the_end_of_a_recreated_topic_stops_its_partition_alone_untouched() -> Result<()> {
    let kafka = KafkaJob::on(KafkaBroker::shared()?).start()?;
    let (broker, dir) = (&kafka.broker, kafka.dir());
    let (short, long) = (key_in_partition(0, 2), key_in_partition(1, 2));
    let produce = |records: &[(&str, usize)]| -> Result<()> {
        broker.create_topic("positions", 2)?;
        let count = |key: &str| Ok((key.to_string(), json!({"vehicle_id": key, "action": "count"}).to_string()));
        broker.produce("positions", records.iter().flat_map(|&(key, n)| (0..n).map(move |_| count(key))))?;
        Ok(())
    };
    produce(&[(&short, 50), (&long, 50)])?;
    let more = "stop_when_idle = \"2s\"\noffset_out_of_range = \"earliest\"\n";
    let config = kafka.source("recreated", more)?;
    let job = || {
        let mut job = run_job(&operator_wasm("probe"), dir, 2);
        job.arg("--config").arg(&config).arg("--no-checkpoints");
        job
    };
    run_ok(&mut job())?;
    assert_eq!(stored_offsets(&dir.join("state"), 2)?, [50, 50]);
    broker.delete_topic("positions")?;
    produce(&[(&short, 20), (&long, 80)])?;
    let err = run_err(&mut job())?;
    assert!(err.contains("partition 0: its state holds offset 50, past the end of its log (20)"), "{err}");
    assert_eq!(stored_offsets(&dir.join("state"), 2)?, [50, 80], "partition 0 untouched, partition 1 went on");
    Ok(())
}

#[test]
fn a_broker_that_stops_answering_is_logged_and_the_host_resumes_when_it_returns() -> Result<()> {
    let kafka = KafkaJob::on(KafkaBroker::start()?).topic("positions", 2).start()?;
    let (broker, dir) = (&kafka.broker, kafka.dir());
    let all = kafka.generate("all.jsonl", 100, 6_000)?;
    let chunks = split_lines(&all, 2)?;
    broker.produce_lines("positions", &chunks[0])?;
    let settings = "[source.properties]\n\"socket.timeout.ms\" = \"2000\"\n\
                    \"session.timeout.ms\" = \"15000\"\n\"heartbeat.interval.ms\" = \"500\"\n";
    let config = kafka.source("frozen", settings)?;
    let mut command = run_job(&operator_wasm("vehicle_stats"), dir, 2);
    command.arg("--config").arg(&config);
    let mut host = Host::spawn("host", &mut command, &dir.join("log"))?;
    broker.wait_committed("frozen", "positions", 3_000, Duration::from_secs(60))?;

    // Frozen until librdkafka names the problem, thawed within the session timeout.
    broker.freeze(true)?;
    let frozen = host.wait_for("Timed out", 1, Duration::from_secs(10));
    broker.freeze(false)?;
    frozen?;
    broker.produce_lines("positions", &chunks[1])?;
    let caught_up = broker.wait_committed("frozen", "positions", 6_000, Duration::from_secs(60));
    caught_up.with_context(|| format!("host log:\n{}", host.log()))?;
    host.terminate()?;
    assert_state_matches(&dump_state(&dir.join("state"))?, &Reference::fold(&all)?, "after the broker came back");
    assert!(read_jsonl(&dir.join("out.jsonl"))?.len() >= 6_000, "every record has an output");
    Ok(())
}

/// A partition whose worker fails (here: strict mode and a record that keeps trapping)
/// stops alone on a Kafka source too: it is paused, the other partition goes on
/// consuming — records produced after the failure included — and the host stops only
/// when the topic is idle, naming the stopped partition and why.
#[test]
fn a_partition_that_fails_is_paused_and_the_others_go_on() -> Result<()> {
    const EACH: u64 = 300;
    let kafka = KafkaJob::on(KafkaBroker::shared()?).topic("positions", 2).start()?;
    let (broker, dir) = (&kafka.broker, kafka.dir());
    let (failing, healthy) = (key_in_partition(0, 2), key_in_partition(1, 2));
    let record =
        |key: &str, action: &str| Ok((key.to_string(), json!({"vehicle_id": key, "action": action}).to_string()));
    let first = std::iter::once(record(&failing, "hog")).chain((0..EACH / 2).map(|_| record(&healthy, "count")));
    broker.produce("positions", first)?;
    let more = "stop_when_idle_s = 3\n[operator.retry]\nstrict = true\nbackoff = \"1ms\"\n";
    let config = kafka.source("alone", more)?;
    let mut job = run_job(&operator_wasm("probe"), dir, 2);
    let mut host = Host::spawn("host", job.arg("--config").arg(&config).arg("--no-checkpoints"), &dir.join("log"))?;
    host.wait_for(STOPPED_ALONE, 1, Duration::from_secs(60))?;
    let rest = (EACH / 2..EACH).flat_map(|_| [record(&failing, "count"), record(&healthy, "count")]);
    broker.produce("positions", rest)?;
    assert!(!host.wait_exit(Duration::from_secs(60))?.success(), "the run ends in the partition's error");
    let log = host.log();
    assert!(log.contains("partition 0 stopped") && log.contains("the record at offset 0 failed in 2 call(s)"), "{log}");
    let outputs = read_jsonl(&dir.join("out.jsonl"))?;
    let counts = |key: &str| -> Vec<u64> {
        outputs.iter().filter(|o| o["key"] == key).filter_map(|o| o["value"]["count"].as_u64()).collect()
    };
    let healthy_counts = counts(&healthy);
    assert!(healthy_counts.iter().copied().eq(1..=EACH), "partition 1: {} of {EACH}", healthy_counts.len());
    assert_eq!(counts(&failing), Vec::<u64>::new());
    Ok(())
}
