//! One partition of a topic read from an offset on ([`PartitionReader`]), outside any
//! group: what `sluice replay` runs again. Only the replay uses it.

use super::record::source_record;
use super::{METADATA_TIMEOUT, POLL_TIMEOUT};
use crate::kafka::client_config;
use crate::record::SourceRecord;
use anyhow::{Context, Result, bail};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The records of one partition of a topic from an offset on, as this source reads
/// them (headers kept, null keys and tombstones marked): what `sluice replay` runs
/// again. A consumer of no group's, assigned the partition, committing nothing; it
/// ends at `until`, or at the end the broker reported when reading began.
pub struct PartitionReader {
    consumer: BaseConsumer,
    topic: String,
    partition: u32,
    /// The offset the next record has at least.
    next: u64,
    /// Reading ends before this offset.
    end: u64,
}

/// How long a [`PartitionReader`] waits for a record it knows exists.
const READ_TIMEOUT: Duration = Duration::from_secs(30);

impl PartitionReader {
    /// Reads `partition` of `topic` at `brokers` (with the source's `properties`) from
    /// offset `from` up to `until` (exclusive), or to the partition's end now. Fails,
    /// naming the partition, when the log no longer holds `from`. It belongs to no
    /// group and commits nothing, whatever the properties say: a replay runs beside
    /// the live job and must not move its group's offsets.
    pub fn open(
        (brokers, topic, properties): (&str, &str, &BTreeMap<String, String>),
        partition: u32,
        from: u64,
        until: Option<u64>,
    ) -> Result<Self> {
        let mut config = client_config(brokers, &[], properties);
        for (name, value) in [
            ("group.id", "sluice-replay"),
            ("enable.auto.commit", "false"),
            ("enable.auto.offset.store", "false"),
            ("enable.partition.eof", "false"),
            ("auto.offset.reset", "error"),
        ] {
            config.set(name, value);
        }
        let consumer: BaseConsumer = config.create().context("creating a Kafka consumer")?;
        let (low, high) = consumer
            .fetch_watermarks(topic, partition as i32, METADATA_TIMEOUT)
            .with_context(|| format!("reading the offsets of {topic}/{partition} at {brokers}"))?;
        let (low, high) = (low.max(0) as u64, high.max(0) as u64);
        if from < low {
            bail!("{topic}/{partition} at {brokers} no longer holds offset {from}: its log starts at {low}");
        }
        let mut assignment = TopicPartitionList::new();
        assignment.add_partition_offset(topic, partition as i32, Offset::Offset(from as i64))?;
        consumer.assign(&assignment).with_context(|| format!("reading {topic}/{partition} from offset {from}"))?;
        let end = until.map_or(high, |until| until.min(high));
        Ok(PartitionReader { consumer, topic: topic.to_string(), partition, next: from, end })
    }

    /// The offset the consumer fetches next, once it fetched something.
    fn fetch_position(&self) -> Option<u64> {
        let position = self.consumer.position().ok()?;
        match position.find_partition(&self.topic, self.partition as i32)?.offset() {
            Offset::Offset(offset) => u64::try_from(offset).ok(),
            _ => None,
        }
    }
}

impl Iterator for PartitionReader {
    type Item = Result<SourceRecord>;

    fn next(&mut self) -> Option<Self::Item> {
        let waiting = Instant::now();
        while self.next < self.end {
            match self.consumer.poll(POLL_TIMEOUT) {
                Some(Ok(message)) => {
                    let (record, _) = source_record(&message);
                    self.next = record.offset + 1;
                    return (record.offset < self.end).then_some(Ok(record));
                }
                Some(Err(e)) => return Some(Err(e).context(format!("reading {}/{}", self.topic, self.partition))),
                // Past the last record: what is left before the end are offsets the broker
                // delivers no record for (transaction markers).
                None if self.fetch_position().is_some_and(|position| position >= self.end) => return None,
                None if waiting.elapsed() > READ_TIMEOUT => {
                    let (topic, partition, next) = (&self.topic, self.partition, self.next);
                    return Some(Err(anyhow::anyhow!(
                        "{topic}/{partition}: no record at offset {next} or after within {READ_TIMEOUT:?}"
                    )));
                }
                None => {}
            }
        }
        None
    }
}
