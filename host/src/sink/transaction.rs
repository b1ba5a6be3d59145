//! Exactly-once outputs to Kafka (`[sink] guarantee = "exactly-once"`): each
//! partition's outputs go through a transactional producer of its own, one transaction
//! per state commit, and each transaction also commits, to the source's consumer group,
//! the input offset it covers.
//!
//! The protocol of one partition (docs/exactly-once.md argues it):
//! 1. At start, the producer's `init_transactions` under the partition's
//!    [`transactional_id`] fences every earlier producer of that id — an owner that was
//!    revoked or evicted can no longer commit — and aborts its open transaction; so does
//!    one under the partition's [`legacy_transactional_id`] first, which a host of an
//!    older sluice would use. Then the group's committed offset C of the partition is
//!    read: every input below C has its outputs in a committed transaction.
//! 2. Outputs of inputs below C are dropped: the state, which its restore placed at an
//!    offset S ≤ C, is rebuilt by processing S..C again without emitting anything. The
//!    rest are produced in the open transaction.
//! 3. A commit of the state at offset N first commits the transaction together with the
//!    group offset N, then the state (the [worker](crate::worker) does), and the next
//!    transaction begins.
//!
//! A partition that stops without committing — it failed, stopped alone, or was lost —
//! drops its [`PartitionTransaction`], which aborts the transaction it left open: its
//! outputs are never to be seen, and until a transaction ends `read_committed`
//! consumers of the partitions it wrote to read nothing after it, however many other
//! partitions commit. A fenced producer aborts nothing: its transactions are the new
//! owner's, and the error says [`Fenced`].
//!
//! This module does not decide when to commit, and does not consume.

use super::events::{ABORTED, COMMIT_FAILED, COVERED, FENCED, REPLAYED_SILENTLY};
use super::kafka::{check_topic, headers, producer_config, refuses_the_record, send_dead_letter, send_waiting};
use crate::kafka::client_config;
use crate::record::{DeadLetter, Origin, Output};
use anyhow::{Context, Result, anyhow};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerGroupMetadata};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long fencing, reading the group's offset, and committing a transaction may take.
const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(60);
/// How much longer than [`TRANSACTION_TIMEOUT`] a commit is waited for before it is
/// given up: librdkafka (2.12) can wait in `send_offsets_to_transaction` past its
/// timeout, for good, when the group coordinator's node left the cluster (its issues
/// 5456 and 5511: a coordinator request to a node it decommissioned is never retried).
const COMMIT_GRACE: Duration = Duration::from_secs(5);
/// How long aborting a transaction may hold up its partition's stop: past it, the
/// broker's own timeout aborts the transaction.
const ABORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where exactly-once outputs go, and the consumer group that records which inputs
/// they cover.
pub struct TransactionalSink {
    brokers: String,
    topic: String,
    properties: BTreeMap<String, String>,
    input: InputGroup,
    name: String,
}

/// The source's topic and consumer group, as the transactions commit offsets to it.
pub struct InputGroup {
    /// Bootstrap servers of the source.
    pub brokers: String,
    /// The input topic.
    pub topic: String,
    /// The consumer group.
    pub group: String,
    /// The source's librdkafka properties (security settings, say).
    pub properties: BTreeMap<String, String>,
}

impl TransactionalSink {
    /// Outputs to `topic` of `brokers` (producer `properties` passed through), in
    /// transactions that commit input offsets to `input`'s group; `topic` must exist.
    pub fn open(brokers: &str, topic: &str, properties: &BTreeMap<String, String>, input: InputGroup) -> Result<Self> {
        check_topic(brokers, properties, topic, "[sink]")?;
        Ok(TransactionalSink {
            brokers: brokers.into(),
            topic: topic.into(),
            properties: properties.clone(),
            name: format!("kafka {brokers} topic {topic} (exactly-once)"),
            input,
        })
    }

    /// Where this sink writes, for messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A producer of transactions under `id` that fenced every earlier one.
    fn take_over(&self, id: &str) -> Result<ThreadedProducer<TransactionReports>> {
        let producer: ThreadedProducer<TransactionReports> = producer_config(&self.brokers, &self.properties)
            .set("transactional.id", id)
            .create_with_context(TransactionReports)
            .with_context(|| format!("creating a transactional Kafka producer for {}", self.brokers))?;
        producer
            .init_transactions(TRANSACTION_TIMEOUT)
            .with_context(|| format!("taking over the transactions of {id} (fencing earlier owners)"))?;
        Ok(producer)
    }

    /// Takes over `partition`, whose state is at `state_offset`: fences every earlier
    /// producer of its transactions, learns which inputs' outputs are committed
    /// already, and opens a transaction.
    pub fn begin(&self, partition: u32, state_offset: u64) -> Result<PartitionTransaction> {
        let input = &self.input;
        // Before the offset is read, so that an older sluice's host still running the
        // partition (an upgrade under way) can no longer commit past it.
        drop(self.take_over(&legacy_transactional_id(&input.group, &input.topic, partition))?);
        let id = transactional_id(&input.group, &input.topic, partition);
        let producer = self.take_over(&id)?;
        // Not subscribed: it only reads the group's offset and names the group to the
        // transactions. Read committed, whatever the source's properties say: an offset
        // of a transaction still open is not a transaction's yet.
        let consumer: BaseConsumer = client_config(&input.brokers, &[("group.id", &input.group)], &input.properties)
            .set("isolation.level", "read_committed")
            .set("enable.auto.commit", "false")
            .create()
            .context("creating a Kafka consumer")?;
        let group = consumer.group_metadata().context("the consumer has no group metadata")?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&input.topic, partition as i32);
        let committed = consumer.committed_offsets(tpl, TRANSACTION_TIMEOUT).with_context(|| {
            format!("reading group {}'s offset of {} partition {partition}", input.group, input.topic)
        })?;
        let element = committed.elements().into_iter().next().context("the group's answer lacks the partition")?;
        element.error().with_context(|| format!("reading group {}'s offset of partition {partition}", input.group))?;
        let covered = match element.offset() {
            Offset::Offset(offset) if offset > 0 => offset as u64,
            _ => 0,
        };
        producer.begin_transaction().with_context(|| format!("beginning a transaction of {id}"))?;
        if covered > state_offset {
            tracing::info!(
                partition,
                "{COVERED} {covered}, state at {state_offset}: records {state_offset}..{covered} are \
                 {REPLAYED_SILENTLY} (transactional.id {id})"
            );
        } else {
            tracing::info!(partition, "{COVERED} {covered} (transactional.id {id})");
        }
        Ok(PartitionTransaction {
            producer: Arc::new(producer),
            group: Arc::new(group),
            input: (input.topic.clone(), partition),
            topic: self.topic.clone(),
            name: format!("{} as {id}", self.name),
            covered,
            open: false,
        })
    }
}

/// The `transactional.id` of `partition`'s producer in a job reading `topic` in consumer
/// group `group`: the same on every host of the job, so a new owner fences the old one,
/// and another for every other job and partition. `sluice:<group's bytes>:<group>:<topic>:<partition>`:
/// the length says where the group ends, and the partition (digits) follows the last
/// `:`. It never equals a [`legacy_transactional_id`], all of which start `sluice-`.
pub fn transactional_id(group: &str, topic: &str, partition: u32) -> String {
    format!("sluice:{}:{group}:{topic}:{partition}", group.len())
}

/// The `transactional.id` sluice gave `partition`'s producer before [`transactional_id`]:
/// `sluice-<group>-<topic>-<partition>`, which two jobs could share (group `a-b` with
/// topic `c`, group `a` with topic `b-c`) and then fence each other over and over. A
/// partition's new owner fences it too, so no older host goes on committing.
pub fn legacy_transactional_id(group: &str, topic: &str, partition: u32) -> String {
    format!("sluice-{group}-{topic}-{partition}")
}

/// One partition's transactional producer and its open transaction.
pub struct PartitionTransaction {
    /// Shared with the thread a commit runs on, which keeps it if the commit never
    /// returns ([`COMMIT_GRACE`]).
    producer: Arc<ThreadedProducer<TransactionReports>>,
    group: Arc<ConsumerGroupMetadata>,
    /// The input topic and partition whose offsets the transactions commit.
    input: (String, u32),
    topic: String,
    name: String,
    /// Inputs below this offset have their outputs in a committed transaction.
    covered: u64,
    /// Whether the open transaction holds outputs.
    open: bool,
}

impl PartitionTransaction {
    /// Produces `outputs` (made by operator `version`) in the open transaction, but for
    /// those of inputs whose outputs a committed transaction already holds. The dead
    /// letters of outputs the producer refuses for themselves go into `refused`.
    pub fn send(&mut self, outputs: &[(Origin, Output)], version: &str, refused: &mut Vec<DeadLetter>) -> Result<()> {
        for (origin, output) in outputs.iter().filter(|(origin, _)| origin.offset >= self.covered) {
            let record = BaseRecord::to(output.topic.as_deref().unwrap_or(&self.topic))
                .key(&output.key[..])
                .payload(&output.value[..])
                .headers(headers(origin, version));
            match send_waiting(&self.producer, record) {
                Ok(()) => self.open = true,
                Err(error) if refuses_the_record(&error) => refused.push(super::refused(origin, output, &error)),
                Err(error) => return Err(self.failure("producing to", error.code(), error.to_string())),
            }
        }
        Ok(())
    }

    /// Produces `dead` (of operator `version`) to `topic` in the open transaction, but
    /// for those of inputs a committed transaction already covers.
    pub fn send_dead_letters(&mut self, topic: &str, dead: &[DeadLetter], version: &str) -> Result<()> {
        for dead in dead.iter().filter(|dead| dead.origin.offset >= self.covered) {
            match send_dead_letter(&self.producer, topic, dead, version, || ()) {
                Ok(()) => self.open = true,
                Err(error) => return Err(self.failure("producing a dead letter to", error.code(), error.to_string())),
            }
        }
        Ok(())
    }

    /// The offset below which every input's outputs are in committed transactions.
    pub fn covered(&self) -> u64 {
        self.covered
    }

    /// The producer's fatal error, if it had one (fenced, above all), without waiting.
    pub fn check(&self) -> Result<()> {
        match self.producer.client().fatal_error() {
            Some((code, reason)) => Err(self.described("producing to", Some(code), reason)),
            None => Ok(()),
        }
    }

    /// Commits the open transaction with `next_offset` as the group's offset of the
    /// input partition, and opens the next; nothing when it holds no outputs and the
    /// group has that offset already. A failure (this producer fenced by a newer owner
    /// above all) is the error; the transaction is aborted where it still can be, and
    /// where a commit timed out without an answer it may have committed: the next start
    /// reads which. A failure other than fencing (the broker unreachable, the
    /// transaction coordinator moving to another broker) is a [`CommitFailed`].
    pub fn commit(&mut self, next_offset: u64) -> Result<()> {
        if !self.open && next_offset <= self.covered {
            return Ok(());
        }
        // A producer already fenced fails now, not after the commit's timeout.
        self.check()?;
        let next_offset = next_offset.max(self.covered);
        let mut offsets = TopicPartitionList::new();
        offsets.add_partition_offset(&self.input.0, self.input.1 as i32, Offset::Offset(next_offset as i64))?;
        let committed = match self.commit_waiting(offsets) {
            Ok(committed) => committed,
            // The producer is the commit's thread's now: nothing more is asked of it.
            Err(no_answer) => {
                self.open = false;
                return Err(CommitFailed(format!("committing the transaction of {}: {no_answer:#}", self.name)).into());
            }
        };
        if let Err(e) = committed {
            let failure = self.failure("committing the transaction of", e.rdkafka_error_code(), e.to_string());
            // Open with the offsets if not with outputs.
            self.open = true;
            self.abort();
            return Err(match failure.downcast::<Fenced>() {
                Ok(fenced) => fenced.into(),
                Err(failure) => CommitFailed(format!("{failure:#}")).into(),
            });
        }
        self.covered = next_offset;
        self.open = false;
        self.producer.begin_transaction().with_context(|| format!("beginning a transaction of {}", self.name))
    }

    /// Sends `offsets` to the open transaction and commits it, within
    /// [`TRANSACTION_TIMEOUT`] in all, on a thread of its own: past
    /// [`COMMIT_GRACE`] more without librdkafka's answer, the error, and the thread
    /// keeps the producer, dropping it if the call ever returns. A new owner's start,
    /// this host's included, fences that producer meanwhile.
    fn commit_waiting(&self, offsets: TopicPartitionList) -> Result<KafkaResult<()>> {
        let (producer, group) = (self.producer.clone(), self.group.clone());
        let began = Instant::now();
        let commit = move || {
            producer
                .send_offsets_to_transaction(&offsets, &group, TRANSACTION_TIMEOUT)
                .and_then(|()| producer.commit_transaction(TRANSACTION_TIMEOUT.saturating_sub(began.elapsed())))
        };
        let name = format!("sluice-commit-p{}", self.input.1);
        answered_within(name, TRANSACTION_TIMEOUT + COMMIT_GRACE, commit).context(
            "librdkafka, which can wait for good when the group coordinator's node left the cluster (its issues 5456 \
             and 5511), is given up on, and this producer with it",
        )
    }

    /// Aborts the open transaction if it holds anything, unless this producer is fenced
    /// (the new owner's start aborted it already). Else it would hold back what
    /// `read_committed` consumers of its output partitions see until the broker's
    /// `transaction.timeout.ms`. A failure is only logged: the broker's timeout aborts
    /// it then.
    fn abort(&mut self) {
        if !std::mem::take(&mut self.open) || self.producer.client().fatal_error().is_some() {
            return;
        }
        match self.producer.abort_transaction(ABORT_TIMEOUT) {
            Ok(()) => tracing::info!(partition = self.input.1, "{ABORTED} ({})", self.name),
            Err(e) => tracing::warn!(partition = self.input.1, "aborting the open transaction of {}: {e}", self.name),
        }
    }

    /// The error of `doing` on this producer that failed for `reason` with librdkafka's
    /// `code`: the producer's fatal error instead where it had one (after one librdkafka
    /// fails every call alike), and what a fenced producer means.
    fn failure(&self, doing: &str, code: Option<RDKafkaErrorCode>, reason: String) -> anyhow::Error {
        match self.producer.client().fatal_error() {
            Some((code, reason)) => self.described(doing, Some(code), reason),
            None => self.described(doing, code, reason),
        }
    }

    /// The error of `doing` on this producer for `reason` with librdkafka's `code`: a
    /// [`Fenced`] one when another producer took over its transactional id.
    fn described(&self, doing: &str, code: Option<RDKafkaErrorCode>, reason: String) -> anyhow::Error {
        use RDKafkaErrorCode::{Fenced as FencedCode, InvalidProducerEpoch, ProducerFenced};
        let what = format!("{doing} {}: {reason}", self.name);
        match code {
            Some(FencedCode | ProducerFenced | InvalidProducerEpoch) => Fenced(what).into(),
            _ => anyhow!("{what}"),
        }
    }
}

/// Runs `call` on a thread named `name` and returns its answer, or an error if none
/// came within `limit`: the thread is then left to end, if ever, on its own.
fn answered_within<T: Send + 'static>(
    name: String,
    limit: Duration,
    call: impl FnOnce() -> T + Send + 'static,
) -> Result<T> {
    let (answer, answered) = std::sync::mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name(name)
        .spawn(move || answer.send(call()).ok())
        .context("starting a thread for a call to librdkafka")?;
    answered.recv_timeout(limit).map_err(|_| anyhow!("no answer in {}s", limit.as_secs_f64()))
}

impl Drop for PartitionTransaction {
    /// A partition that stops without committing aborts what it left open.
    fn drop(&mut self) {
        self.abort();
    }
}

/// A partition's producer was fenced: another producer took over its `transactional.id`
/// — the partition's next owner's start, as a rule — and this one can never commit
/// again. Its partition stops alone (see [`Workers`](crate::partitions::Workers)).
#[derive(Debug, thiserror::Error)]
#[error("{0}: {FENCED}")]
pub struct Fenced(String);

/// A partition's transaction did not commit for a reason other than fencing — a broker
/// lost, the transaction coordinator moving — so nothing since the partition's last
/// commit committed, and a new producer may well succeed. Its partition starts again
/// from its last commit, like a [`Fenced`] one (see [`Workers`](crate::partitions::Workers)),
/// rather than stopping the host.
#[derive(Debug, thiserror::Error)]
#[error("{0}: {COMMIT_FAILED}")]
pub struct CommitFailed(String);

/// Logs the transactional producer's client errors; deliveries are settled by the
/// transaction's commit.
struct TransactionReports;

impl ClientContext for TransactionReports {
    fn error(&self, error: KafkaError, reason: &str) {
        tracing::warn!("Kafka producer: {error}: {reason}");
    }
}

impl ProducerContext for TransactionReports {
    type DeliveryOpaque = ();

    fn delivery(&self, _: &rdkafka::message::DeliveryResult<'_>, _: ()) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call that answers in time gives its answer; one that never does (it waits on
    /// a channel no one sends on, as librdkafka waits for a coordinator that is gone)
    /// is an error once the limit passed, its thread left waiting.
    #[test]
    fn a_call_that_never_answers_is_given_up_after_its_limit() {
        let limit = Duration::from_millis(200);
        let answer = answered_within("answers".into(), limit, || 7).expect("answered");
        assert_eq!(answer, 7);
        let (_never_sent, never) = std::sync::mpsc::channel::<()>();
        let began = Instant::now();
        let stuck = answered_within("stuck".into(), limit, move || never.recv().is_ok());
        let waited = began.elapsed();
        assert!(stuck.expect_err("no answer").to_string().contains("no answer in 0.2s"));
        assert!(waited >= limit && waited < limit * 10, "given up after {waited:?}");
    }

    /// Every id reads back as the one group, topic and partition it was made of (so no
    /// two share one), where the earlier ids of group `a-b` reading `c` and group `a`
    /// reading `b-c` were one; and no id is an earlier one.
    #[test]
    fn transactional_ids_tell_every_group_topic_and_partition_apart() {
        let read = |id: &str| -> (String, String, u32) {
            let rest = id.strip_prefix("sluice:").expect("the prefix");
            let (length, rest) = rest.split_once(':').expect("the group's length");
            let (group, rest) = rest.split_at(length.parse().expect("a length"));
            let (topic, partition) = rest[1..].rsplit_once(':').expect("the partition");
            (group.to_string(), topic.to_string(), partition.parse().expect("a partition"))
        };
        assert_eq!(legacy_transactional_id("a-b", "c", 0), legacy_transactional_id("a", "b-c", 0));
        let cases =
            [("a-b", "c", 0), ("a", "b-c", 0), ("a:1", "b", 7), ("a", "1:b", 7), ("", "t", 12), ("grüße", "t.x_y", 3)];
        for (group, topic, partition) in cases {
            let id = transactional_id(group, topic, partition);
            assert_eq!(read(&id), (group.to_string(), topic.to_string(), partition), "{id}");
            assert!(!id.starts_with("sluice-"), "{id} could be an earlier id");
        }
    }
}
