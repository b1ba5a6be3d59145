//! Outputs to Apache Kafka: every output on a topic, keyed by vehicle and traced to its
//! input by headers; pipelined batches lose no output through `kill -9`, a frozen
//! broker or a deleted topic, and a producer queue that stays full fails the job after
//! the delivery timeout; an output Kafka refuses is dead-lettered, and dead letters go
//! to a topic as the records were.

use anyhow::{Context, Result};
use serde_json::{Value, json};
use sluice::config::DEFAULT_DEAD_LETTER_PATH;
use sluice::events::{DEAD_LETTERS_BY_KIND, QUEUE_STAYED_FULL};
use sluice::record::DeadLetterKind;
use sluice::sink::kafka::DELIVERY_TIMEOUT;
use sluice_e2e::*;
use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn outputs_reach_a_kafka_topic_keyed_and_traced_to_their_inputs() -> Result<()> {
    let kafka = KafkaJob::on(KafkaBroker::shared()?).topic("vehicle-summaries", 3).start()?;
    let (broker, dir) = (&kafka.broker, kafka.dir());
    let (vehicles, count) = (200, 6_000);
    let mut job = run_generator_job(dir, vehicles, count, KAFKA_SEED, 2);
    run_ok(job.arg("--output").arg(broker.output("vehicle-summaries")))?;
    assert!(!dir.join("out.jsonl").exists(), "the last --output wins");

    let records = broker.read_topic("vehicle-summaries")?;
    assert_eq!(records.len() as u64, count, "one output per input");
    let inputs: BTreeSet<(String, String)> =
        records.iter().map(|r| (r.headers["sluice-partition"].clone(), r.headers["sluice-offset"].clone())).collect();
    assert_eq!(inputs.len() as u64, count, "each output names a distinct input");
    assert!(records.iter().all(|r| r.headers["sluice-operator"].starts_with("vehicle_stats@")), "operator header");

    let input = kafka.generate("input.jsonl", vehicles, count)?;
    let reference = Reference::fold(&input)?;
    // The summary with the highest count per vehicle is its final one (outputs are
    // at-least-once, so a count may repeat, never go missing).
    let mut last = BTreeMap::new();
    for record in &records {
        assert_eq!(record.value["vehicle_id"].as_str(), Some(record.key.as_str()), "keyed by vehicle");
        let seen = record.value["count"].as_u64().unwrap_or(0);
        let entry = last.entry(record.key.clone()).or_insert_with(|| record.value.clone());
        if seen >= entry["count"].as_u64().unwrap_or(0) {
            *entry = record.value.clone();
        }
    }
    assert_eq!(last.len(), reference.last.len());
    for (vehicle, expected) in &reference.last {
        assert_summary(&last[vehicle], vehicle, expected, "last Kafka output");
    }
    Ok(())
}

/// Batches are pipelined: a worker sends a batch's outputs and goes on with the next
/// before the broker acknowledges them, and a commit waits until every output it covers
/// is acknowledged. Outputs linger in the producer longer than a commit interval, so
/// whenever the host is killed batches are in flight and a commit that did not wait
/// would have stored state whose outputs died with the process: after the kill, each
/// vehicle's stored count has its output on the topic. Restarted, the job ends with the
/// reference fold in state and an output for every input.
#[test]
fn kill_9_with_batches_in_flight_loses_no_output_and_applies_no_record_twice() -> Result<()> {
    let kafka = KafkaJob::on(KafkaBroker::shared()?).start()?;
    let (broker, dir) = (&kafka.broker, kafka.dir());
    let job = generator_to_summaries(&kafka, "\"linger.ms\" = \"1500\"\n")?;
    let mut host = Host::spawn("host", &mut job("1000"), &dir.join("log"))?;
    // Four seconds of processing: commits (each waiting out the linger) came before.
    host.wait_for(" records/s", 4, Duration::from_secs(60))?;
    host.kill_9()?;
    let state = dump_state(&dir.join("state"))?;
    assert!(!state.is_empty(), "the first run committed state before the kill:\n{}", host.log());
    assert_outputs_cover_state(&state, &broker.read_topic("summaries")?, "after kill -9");
    assert_a_restart_completes(&kafka, job)
}

/// A delivery that fails while batches are in flight (the broker stops answering past
/// the producer's `message.timeout.ms`) stops the job before any batch after the last
/// commit commits: the state stored is covered by outputs on the topic, and a restart
/// replays the rest, so every input ends with an output.
#[test]
fn a_failed_delivery_commits_nothing_after_the_failed_batch() -> Result<()> {
    let kafka = KafkaJob::on(KafkaBroker::start()?).start()?;
    let (broker, dir) = (&kafka.broker, kafka.dir());
    let job = generator_to_summaries(&kafka, "\"message.timeout.ms\" = \"5000\"\n\"linger.ms\" = \"20\"\n")?;
    let mut host = Host::spawn("host", &mut job("1000"), &dir.join("log"))?;
    // Three seconds of processing: commits came before.
    host.wait_for(" records/s", 3, Duration::from_secs(60))?;
    broker.freeze(true)?;
    let failed = host.wait_for("Message timed out", 1, Duration::from_secs(30));
    // Thawed at once: the failure is recorded, and the deliveries still in flight do
    // not undo it.
    broker.freeze(false)?;
    failed?;
    let status = host.wait_exit(Duration::from_secs(60))?;
    assert!(!status.success(), "a failed delivery fails the job:\n{}", host.log());
    assert!(host.log().contains("sending outputs to kafka"), "the error names the sink:\n{}", host.log());
    let state = dump_state(&dir.join("state"))?;
    assert!(!state.is_empty(), "state was committed before the broker froze:\n{}", host.log());
    assert_outputs_cover_state(&state, &broker.read_topic("summaries")?, "after the failed delivery");
    // The restart is there to complete: a broker loaded by the tests beside it can hold a
    // produce request past the 5 s that made the failure above come quickly.
    set_delivery_timeout(&kafka, "60000")?;
    assert_a_restart_completes(&kafka, job)
}

/// The output topic deleted while batches are in flight: the deliveries that follow
/// fail, the job stops with an error naming the input whose output failed, and no
/// state commits past that input (its batch and every later one stay uncommitted).
#[test]
fn a_deleted_output_topic_commits_nothing_after_the_failed_batch() -> Result<()> {
    let kafka = KafkaJob::on(KafkaBroker::shared()?).start()?;
    let (broker, dir) = (&kafka.broker, kafka.dir());
    let job = generator_to_summaries(&kafka, "\"message.timeout.ms\" = \"5000\"\n\"linger.ms\" = \"20\"\n")?;
    let mut host = Host::spawn("host", &mut job("1000"), &dir.join("log"))?;
    host.wait_for(" records/s", 3, Duration::from_secs(60))?;
    broker.delete_topic("summaries")?;
    let status = host.wait_exit(Duration::from_secs(90))?;
    assert!(!status.success(), "a failed delivery fails the job:\n{}", host.log());
    let log = host.log();
    let failed = log
        .split("output of input ")
        .nth(1)
        .and_then(|rest| rest.split_once(' '))
        .and_then(|(input, _)| input.split_once('/'))
        .with_context(|| format!("the error names the input whose output failed:\n{log}"))?;
    let (partition, offset): (usize, u64) = (failed.0.parse()?, failed.1.parse()?);
    let stored = stored_offsets(&dir.join("state"), 2)?;
    assert!(stored[partition] > 0, "state was committed before the topic went:\n{log}");
    assert!(
        stored[partition] <= offset,
        "partition {partition} stored offset {} past the failed input {offset}:\n{log}",
        stored[partition]
    );
    Ok(())
}

/// A broker that stops acknowledging while the producer's queue is full (10 records,
/// deliveries allowed ten minutes, no commit due) fails the job after
/// [`DELIVERY_TIMEOUT`] with an error saying so, instead of a worker waiting for room
/// in the queue for as long as the broker stays away.
#[test]
fn a_producer_queue_that_stays_full_fails_the_job_after_the_delivery_timeout() -> Result<()> {
    let kafka = KafkaJob::on(KafkaBroker::start()?).start()?;
    let (broker, dir) = (&kafka.broker, kafka.dir());
    let properties = "\"queue.buffering.max.messages\" = \"10\"\n\"message.timeout.ms\" = \"600000\"\n\
                      [state]\ncommit_interval = \"10m\"\n";
    let job = generator_to_summaries(&kafka, properties)?;
    let mut host = Host::spawn("host", &mut job("1000"), &dir.join("log"))?;
    host.wait_for(" records/s", 2, Duration::from_secs(60))?;
    broker.freeze(true)?;
    let frozen = Instant::now();
    let exited = host.wait_exit(DELIVERY_TIMEOUT * 2);
    broker.freeze(false)?;
    let status = exited?;
    assert!(frozen.elapsed() >= DELIVERY_TIMEOUT, "failed after {:?}", frozen.elapsed());
    assert!(!status.success(), "the job fails:\n{}", host.log());
    // The worker waiting for room in the queue gives up, or, first, the other
    // partition's idle commit waiting for its outputs' acknowledgements: both after the
    // delivery timeout.
    let log = host.log();
    assert!(log.contains(QUEUE_STAYED_FULL) || log.contains("records unacknowledged after"), "{log}");
    Ok(())
}

/// An output over the producer's `message.max.bytes` costs only itself: it goes to the
/// dead letters (the output itself, marked `refused`, with Kafka's reason), and the
/// outputs of the records before and after it reach the topic; the job ends well.
#[test]
fn an_output_kafka_refuses_is_dead_lettered_and_the_partition_goes_on() -> Result<()> {
    let kafka = KafkaJob::on(KafkaBroker::shared()?).topic("out", 1).start()?;
    let (broker, dir) = (&kafka.broker, kafka.dir());
    let records = [
        json!({"vehicle_id": "k", "action": "count"}),
        json!({"vehicle_id": "k", "action": "outputs", "count": 1, "bytes": 5_000}),
        json!({"vehicle_id": "k", "action": "count"}),
    ];
    let dead = dir.join("dead.jsonl");
    let run = run_ok(probe_to_out(&kafka, &records, "")?.arg("--dead-letter").arg(&dead))?;
    let report = String::from_utf8(run.stderr)?;
    let by_kind = "0 rejected by the operator, 0 trapped or past a limit, 1 outputs refused by Kafka, 0 records";
    assert!(report.contains(&format!("{DEAD_LETTERS_BY_KIND}: {by_kind}")), "{report}");
    let outputs: Vec<Value> = broker.read_topic("out")?.into_iter().map(|r| r.value).collect();
    assert_eq!(outputs, [json!({"count": 1}), json!({"count": 2})]);
    let dead = read_jsonl(&dead)?;
    assert_eq!(dead.len(), 1, "{dead:?}");
    let reason = dead[0]["reason"].as_str().unwrap_or_default();
    assert!(dead[0]["error"] == DeadLetterKind::Refused.name() && dead[0]["offset"] == 1, "{}", dead[0]);
    assert!(reason.contains("Kafka refused this output") && reason.contains("MessageSizeTooLarge"), "{reason}");
    assert_eq!(dead[0]["value"].as_str().map(str::len), Some(5_000), "the dead letter holds the output");
    Ok(())
}

/// With `[dead_letter] topic`, dead letters are records on that topic: the failed
/// input's key and value as they were, with why and where in headers; the dead letter of
/// a refused output, too large for Kafka itself, goes without key and value and says so.
/// The outputs of the records around them are complete, and the failed records' writes
/// are not in the state.
#[test]
fn dead_letters_go_to_a_kafka_topic_as_the_records_were() -> Result<()> {
    let kafka = KafkaJob::on(KafkaBroker::shared()?).topic("out", 1).topic("dead", 1).start()?;
    let (broker, dir) = (&kafka.broker, kafka.dir());
    let records = [
        json!({"vehicle_id": "k", "action": "count"}),
        json!({"vehicle_id": "k", "action": "put-then-fail"}),
        json!({"vehicle_id": "k", "action": "put-then-panic"}),
        json!({"vehicle_id": "k", "action": "outputs", "count": 1, "bytes": 5_000}),
        json!({"vehicle_id": "k", "action": "count"}),
    ];
    let more = format!("[operator.retry]\nbackoff = \"1ms\"\n[dead_letter]\ntopic = \"{}\"\n", broker.name("dead"));
    let run = run_ok(&mut probe_to_out(&kafka, &records, &more)?)?;
    let report = String::from_utf8(run.stderr)?;
    let by_kind = "1 rejected by the operator, 1 trapped or past a limit, 1 outputs refused by Kafka, 0 records";
    assert!(report.contains(&format!("{DEAD_LETTERS_BY_KIND}: {by_kind}")), "{report}");
    let outputs: Vec<Value> = broker.read_topic("out")?.into_iter().map(|r| r.value).collect();
    assert_eq!(outputs, [json!({"count": 1}), json!({"count": 2})], "the failed records' writes are not in the state");
    let dead = broker.read_topic("dead")?;
    assert_eq!(dead.len(), 3, "{dead:?}");
    for (letter, (offset, kind, value)) in dead.iter().zip([
        (1, DeadLetterKind::Rejected, &records[1]),
        (2, DeadLetterKind::Trapped, &records[2]),
        (3, DeadLetterKind::Refused, &Value::Null),
    ]) {
        let header = |name: &str| letter.headers.get(name).map(String::as_str);
        assert_eq!((header("sluice-offset"), header("sluice-error")), (Some(&*offset.to_string()), Some(kind.name())));
        assert_eq!(header("sluice-partition"), Some("0"));
        assert!(header("sluice-operator").is_some_and(|v| v.starts_with("probe")), "{letter:?}");
        assert_eq!(&letter.value, value, "{letter:?}");
    }
    let reason = |i: usize| dead[i].headers["sluice-reason"].as_str();
    assert!(reason(0).contains("probe fails after a write"), "{}", reason(0));
    assert!(reason(1).contains("probe panics after a write"), "{}", reason(1));
    assert_eq!(dead[1].headers.get("sluice-attempts").map(String::as_str), Some("2"));
    assert!(reason(2).contains("Kafka refused this output") && reason(2).contains("MessageSizeTooLarge"));
    let dropped = dead[2].headers.get("sluice-dropped").map(String::as_str).unwrap_or_default();
    let dropped_bytes: usize = dropped.split(' ').next().unwrap_or_default().parse().unwrap_or_default();
    assert!(dropped_bytes > 5_000 && dropped.contains("key and value bytes"), "{dead:?}");
    assert_eq!(dead[2].key, "", "the key went with the value");
    assert!(!dir.join(DEFAULT_DEAD_LETTER_PATH).exists(), "no dead-letter file");
    Ok(())
}

/// A `sluice run` in `kafka`'s directory (its working directory) of the probe over
/// `records`, one partition, no checkpoints, outputs to the test's topic `out` through a
/// producer whose `message.max.bytes` is 2000; `more` is TOML added to its config.
fn probe_to_out(kafka: &KafkaJob, records: &[Value], more: &str) -> Result<Command> {
    let (broker, dir) = (&kafka.broker, kafka.dir());
    let input = dir.join("input.jsonl");
    std::fs::write(&input, records.iter().map(|r| format!("{r}\n")).collect::<String>())?;
    let config = dir.join("job.toml");
    std::fs::write(
        &config,
        format!(
            "[operator]\npath = {:?}\n[sink]\nkind = \"kafka\"\nbrokers = {:?}\ntopic = {:?}\n\
             [sink.properties]\n\"message.max.bytes\" = \"2000\"\n[state]\ndir = {:?}\npartitions = 1\n{more}",
            operator_wasm("probe"),
            broker.bootstrap,
            broker.name("out"),
            dir.join("state")
        ),
    )?;
    let mut job = sluice();
    job.current_dir(dir).arg("run").arg("--config").arg(&config).arg("--input").arg(&input).arg("--no-checkpoints");
    Ok(job)
}

/// The generator records of the pipelining tests: vehicles, and how many.
const PIPELINED: (u32, u64) = (100, 10_000);

/// The job config [`generator_to_summaries`] writes in the job's directory.
const SINK_CONFIG: &str = "kafka-sink.toml";

/// Creates the test's topic `summaries` (2 partitions) on `kafka`'s broker, and returns a `sluice
/// run` of vehicle-stats in its directory over the [`PIPELINED`] generator records at a given rate, 2
/// partitions, its outputs to `summaries` with the librdkafka producer `properties`
/// (TOML lines), a running summary every second.
fn generator_to_summaries<'a>(kafka: &'a KafkaJob, properties: &str) -> Result<impl Fn(&str) -> Command + 'a> {
    let (broker, dir) = (&kafka.broker, kafka.dir());
    broker.create_topic("summaries", 2)?;
    let config = dir.join(SINK_CONFIG);
    std::fs::write(
        &config,
        format!(
            "[operator]\npath = \"set-by-flag.wasm\"\n[sink]\nkind = \"kafka\"\nbrokers = \"set-by-flag:9092\"\n\
             topic = \"set-by-flag\"\n[sink.properties]\n{properties}"
        ),
    )?;
    Ok(move |rate: &str| {
        let (vehicles, count) = PIPELINED;
        let mut command = run_generator_job(dir, vehicles, count, KAFKA_SEED, 2);
        command.arg("--config").arg(&config).args(["--rate", rate, "--no-checkpoints", "--report-interval", "1"]);
        // Names the broker and topic; the config's producer properties stay.
        command.arg("--output").arg(broker.output("summaries"));
        command
    })
}

/// Sets `message.timeout.ms` in the config [`generator_to_summaries`] wrote for `kafka`'s
/// job to `ms`, for the job's next runs.
fn set_delivery_timeout(kafka: &KafkaJob, ms: &str) -> Result<()> {
    let config = kafka.dir().join(SINK_CONFIG);
    let text = std::fs::read_to_string(&config)?;
    let lines: Vec<String> = text
        .lines()
        .map(|line| {
            if line.starts_with("\"message.timeout.ms\"") {
                format!("\"message.timeout.ms\" = \"{ms}\"")
            } else {
                line.to_string()
            }
        })
        .collect();
    assert!(lines.iter().any(|line| line.contains(ms)), "the config sets message.timeout.ms:\n{text}");
    std::fs::write(&config, lines.join("\n"))?;
    Ok(())
}

/// Runs `job` (of `kafka`) again at full speed to its end: the state is the reference
/// fold of every record, and every input has an output on `summaries`.
fn assert_a_restart_completes(kafka: &KafkaJob, job: impl Fn(&str) -> Command) -> Result<()> {
    run_ok(&mut job("100000"))?;
    let (vehicles, count) = PIPELINED;
    let input = kafka.generate("input.jsonl", vehicles, count)?;
    let reference = Reference::fold(&input)?;
    assert_state_matches(&dump_state(&kafka.dir().join("state"))?, &reference, "after the restart");
    assert_every_input_has_an_output(&kafka.broker.read_topic("summaries")?, count, &reference)
}

/// Fails unless each vehicle's stored summary was emitted: an output on `outputs` with its
/// count. State ahead of the outputs would mean an output lost for good, because the
/// records it came from are never processed again.
fn assert_outputs_cover_state(state: &StateDump, outputs: &[KafkaRecord], context: &str) {
    let emitted: BTreeSet<(&str, u64)> =
        outputs.iter().filter_map(|r| Some((r.key.as_str(), r.value["count"].as_u64()?))).collect();
    for (vehicle, names) in state {
        let count = names["summary"]["count"].as_u64().unwrap_or_default();
        assert!(
            emitted.contains(&(vehicle.as_str(), count)),
            "{context}: vehicle {vehicle}'s stored count {count} has no output ({} outputs on the topic)",
            outputs.len()
        );
    }
}

/// Fails unless `outputs` hold an output for each of `count` inputs (by the headers naming
/// the input; duplicates allowed) and each vehicle's last output is its final summary.
fn assert_every_input_has_an_output(outputs: &[KafkaRecord], count: u64, reference: &Reference) -> Result<()> {
    let inputs: BTreeSet<(&str, &str)> =
        outputs.iter().map(|r| (r.headers["sluice-partition"].as_str(), r.headers["sluice-offset"].as_str())).collect();
    assert_eq!(inputs.len() as u64, count, "every input has an output ({} outputs, duplicates allowed)", outputs.len());
    assert_last_outputs(outputs.iter().map(|r| (r.key.as_str(), &r.value)), reference, "last output on the topic");
    Ok(())
}
