//! Kafka against a real Kafka-protocol broker (tansu): the sink puts every output on
//! a topic, keyed by vehicle and traced to its input by headers; the source feeds a
//! job from a consumer group and starts each partition at the offset stored with its
//! state, not at the group's committed offset.

use anyhow::Result;
use sluice_tests::*;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const SEED: u64 = 5;

#[test]
fn outputs_reach_a_kafka_topic_keyed_and_traced_to_their_inputs() -> Result<()> {
    let broker = KafkaBroker::start()?;
    broker.create_topic("vehicle-summaries", 3)?;
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    let (vehicles, count) = (200, 6_000);
    let mut job = run_generator_job(dir, vehicles, count, SEED, 2);
    run_ok(job.arg("--output").arg(format!("kafka://{}/vehicle-summaries", broker.bootstrap)))?;
    assert!(!dir.join("out.jsonl").exists(), "the last --output wins");

    let records = broker.read_topic("vehicle-summaries", count as usize)?;
    assert_eq!(records.len() as u64, count, "one output per input");
    let inputs: BTreeSet<(String, String)> =
        records.iter().map(|r| (r.headers["sluice-partition"].clone(), r.headers["sluice-offset"].clone())).collect();
    assert_eq!(inputs.len() as u64, count, "each output names a distinct input");

    let input = dir.join("input.jsonl");
    generate(&input, vehicles, count, SEED)?;
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

#[test]
fn a_kafka_source_starts_each_partition_at_the_offset_stored_with_its_state() -> Result<()> {
    let broker = KafkaBroker::start()?;
    broker.create_topic("positions", 3)?;
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    let config = positions_source(dir, &broker.bootstrap, "group = \"vehicle-stats\"\nstop_when_idle_s = 2\n")?;
    let job = || {
        let mut command = run_job(&operator_wasm("vehicle_stats"), dir, 3);
        command.arg("--config").arg(&config).arg("--no-checkpoints");
        command
    };
    let err = run_err(run_job(&operator_wasm("vehicle_stats"), dir, 2).arg("--config").arg(&config))?;
    assert!(err.contains("topic positions has 3 partitions but the job has 2"), "{err}");
    assert!(!dir.join("state").exists(), "refused before any state was written");

    let (vehicles, first, total) = (150, 4_000, 6_000usize);
    let all = dir.join("all.jsonl");
    generate(&all, vehicles, total as u64, SEED)?;
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
fn an_unreachable_broker_or_a_missing_topic_is_named_before_any_state_is_written() -> Result<()> {
    let broker = KafkaBroker::start()?;
    let closed = free_port()?;
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    for (brokers, expected) in [
        (format!("127.0.0.1:{closed}"), format!("reading metadata of topic positions from 127.0.0.1:{closed}")),
        (broker.bootstrap.clone(), format!("topic positions does not exist on {}", broker.bootstrap)),
    ] {
        let config = positions_source(dir, &brokers, "")?;
        let err = run_err(run_job(&operator_wasm("vehicle_stats"), dir, 3).arg("--config").arg(&config))?;
        assert!(err.contains(&expected), "{err}");
        assert!(!dir.join("state").exists(), "refused before any state was written");
    }
    Ok(())
}

/// Writes `dir/kafka-source.toml`: a Kafka source reading topic `positions` from
/// `brokers`, with `more` source settings; the operator comes from `--operator`.
fn positions_source(dir: &Path, brokers: &str, more: &str) -> Result<PathBuf> {
    let config = dir.join("kafka-source.toml");
    std::fs::write(
        &config,
        format!(
            "[operator]\npath = \"set-by-flag.wasm\"\n[source]\nkind = \"kafka\"\nbrokers = \"{brokers}\"\n\
             topic = \"positions\"\n{more}"
        ),
    )?;
    Ok(config)
}
