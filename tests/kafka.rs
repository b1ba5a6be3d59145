//! The Kafka sink against a real Kafka-protocol broker (tansu): every output arrives
//! on the topic, keyed by vehicle, traced to its input by headers, and each vehicle's
//! last output is its reference summary.

use anyhow::Result;
use sluice_tests::*;
use std::collections::{BTreeMap, BTreeSet};

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
