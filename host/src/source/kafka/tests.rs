//! The consumer's side of rebalances against a fake owner of partitions: no broker
//! is needed, since assigning, pausing and polling an unsubscribed consumer are
//! local to librdkafka.

use super::membership::{Membership, Resuming};
use super::poll::{PollState, poll};
use super::resume::{resume_due, resume_offset};
use super::*;
use crate::backoff::Backoff;
use crate::record::{RestoredFrom, SourceRecord};
use crate::source::events::OUT_OF_RANGE;
use crate::stats::RebalanceChange;
use rdkafka::types::RDKafkaRespErr;
use std::time::Instant;

/// Partitions that record what the source asked of them.
#[derive(Default)]
struct Fake {
    count: u32,
    /// The offset each running partition's state holds.
    running: BTreeMap<u32, u64>,
    assigned: Vec<u32>,
    revoked: Vec<(u32, Stop)>,
    pushed: Vec<u64>,
    /// The next call to `started` fails, as a failed restore does.
    fail_start: bool,
}

impl Partitions for Fake {
    fn count(&self) -> u32 {
        self.count
    }
    fn assign(&mut self, partitions: &[u32]) -> Result<()> {
        self.assigned.extend(partitions);
        Ok(())
    }
    fn started(&mut self, _wait: bool) -> Result<Vec<Started>> {
        if std::mem::take(&mut self.fail_start) {
            bail!("starting partition 1: restoring: checkpoint 3 is corrupt");
        }
        Ok(Vec::new())
    }
    fn failed(&mut self) -> Result<Vec<u32>> {
        Ok(Vec::new())
    }
    fn stop_alone(&mut self, partition: u32, _error: anyhow::Error) -> Result<()> {
        self.running.remove(&partition);
        Ok(())
    }
    fn revoke(&mut self, partitions: &[u32], how: Stop) -> (Vec<(u32, u64)>, Result<()>) {
        self.revoked.extend(partitions.iter().map(|&p| (p, how)));
        let offsets = partitions.iter().filter_map(|p| Some((*p, self.running.remove(p)?))).collect();
        (offsets, Ok(()))
    }
    fn push(&mut self, record: SourceRecord, _wait: bool) -> Result<bool> {
        self.pushed.push(record.offset);
        Ok(false)
    }
    fn flush(&mut self, _wait: bool) -> Result<()> {
        Ok(())
    }
    fn backed_up(&self, _partition: u32) -> bool {
        false
    }
    fn owns(&self, partition: u32) -> bool {
        self.running.contains_key(&partition)
    }
    fn owns_any(&self) -> bool {
        !self.running.is_empty()
    }
    fn starting(&self) -> bool {
        false
    }
    fn caught_up(&self) -> bool {
        true
    }
    fn committed_offsets(&self) -> Vec<(u32, u64)> {
        self.running.iter().map(|(&p, &o)| (p, o)).collect()
    }
    fn record_lag(&self, _partition: u32, _high_watermark: u64) {}
    fn record_rebalance(&self, _change: RebalanceChange, _partitions: usize, _took: Duration) {}
    fn finish(&mut self, outcome: Result<Stop>) -> Result<Vec<(u32, u64)>> {
        outcome?;
        Ok(std::mem::take(&mut self.running).into_iter().collect())
    }
}

fn fake(count: u32, running: &[(u32, u64)]) -> Fake {
    Fake { count, running: running.iter().copied().collect(), ..Fake::default() }
}

fn options() -> KafkaOptions {
    KafkaOptions {
        // Nothing listens on the discard port: nothing here needs a broker.
        brokers: "127.0.0.1:9".into(),
        topic: "positions".into(),
        group: "sluice-test".into(),
        instance_id: None,
        group_protocol: GroupProtocol::Classic,
        properties: BTreeMap::new(),
        stop_when_idle: None,
        commits_group_offsets: true,
        offset_out_of_range: OutOfRange::Fail,
        retry_timeout: Duration::from_secs(300),
    }
}

fn consumer(owner: Fake) -> BaseConsumer<Membership<Fake>> {
    let membership = Membership::new("positions", owner, true);
    options().client_config().create_with_context(membership).expect("a consumer needs no broker to exist")
}

fn list(partitions: &[i32]) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    for &p in partitions {
        tpl.add_partition("positions", p);
    }
    tpl
}

#[test]
fn an_assignment_starts_the_partitions_and_assigns_them_paused_at_a_numeric_offset() {
    let consumer = consumer(fake(2, &[]));
    let mut tpl = list(&[0, 1]);
    consumer.context().rebalance(&consumer, RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS, &mut tpl);
    assert!(lock(&consumer.context().failure).is_none());
    assert_eq!(lock(&consumer.context().partitions).as_ref().unwrap().assigned, [0, 1]);
    let offsets: Vec<Offset> = tpl.elements().iter().map(|e| e.offset()).collect();
    assert_eq!(offsets, [Offset::Offset(0), Offset::Offset(0)], "moved to their states' offsets on resuming");
    assert_eq!(consumer.assignment().unwrap().count(), 2);
    assert!(lock(&consumer.context().assigned_at).is_some(), "idleness counts from the assignment");
}

#[test]
fn an_assignment_of_a_partition_the_job_lacks_starts_nothing_and_stops_the_poll_loop() {
    let consumer = consumer(fake(2, &[]));
    let mut tpl = list(&[1, 2]);
    consumer.context().rebalance(&consumer, RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS, &mut tpl);
    assert!(lock(&consumer.context().partitions).as_ref().unwrap().assigned.is_empty());
    let err = poll(&consumer, &options(), &AtomicBool::new(false)).expect_err("the failure surfaces");
    assert!(err.to_string().contains("topic positions has partition 2, but the job has 2 partitions"), "{err}");
}

#[test]
fn a_revocation_hands_its_partitions_over_together_and_drops_their_pending_resumes() {
    let consumer = consumer(fake(3, &[(0, 10), (1, 20)]));
    let started = |partition| Started {
        partition,
        offset: 0,
        restored_from: RestoredFrom::Empty,
        assigned: Instant::now(),
        took: Duration::ZERO,
    };
    let context = consumer.context();
    for p in [1, 2] {
        let pending = Resuming { started: started(p), backoff: Backoff::new(Duration::ZERO), due: Instant::now() };
        lock(&context.resuming).insert(p, pending);
    }
    context.rebalance(&consumer, RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS, &mut list(&[0, 1]));
    assert!(lock(&context.failure).is_none());
    let owner = lock(&context.partitions);
    assert_eq!(owner.as_ref().unwrap().revoked, [(0, Stop::Handover), (1, Stop::Handover)], "in one call");
    assert_eq!(lock(&context.resuming).keys().collect::<Vec<_>>(), [&2], "a revoked partition never resumes");
}

/// Group offsets go to the group once each as they move, and all of them again now
/// and then: a commit that failed (one sent as a rebalance began, say) is not
/// reported, and an offset that no longer moves would otherwise stay stale for good.
#[test]
fn group_offsets_are_committed_as_they_move_and_all_again_now_and_then() {
    let mut state = PollState::new(Instant::now());
    assert_eq!(state.offsets_to_commit(vec![(2, 1148), (3, 847)], false), [(2, 1148), (3, 847)]);
    assert_eq!(state.offsets_to_commit(vec![(2, 1148), (3, 900)], false), [(3, 900)], "only what moved");
    assert_eq!(state.offsets_to_commit(vec![(2, 1148), (3, 900)], false), [], "nothing moved");
    assert_eq!(state.offsets_to_commit(vec![(2, 1148), (3, 900)], true), [(2, 1148), (3, 900)], "all again");
}

#[test]
fn a_failed_restore_stops_the_poll_loop_with_its_reason() {
    let consumer = consumer(Fake { fail_start: true, ..fake(2, &[]) });
    let err = poll(&consumer, &options(), &AtomicBool::new(false)).expect_err("the failed start surfaces");
    assert!(format!("{err:#}").contains("starting partition 1: restoring"), "{err:#}");
}

#[test]
fn a_stop_ends_the_poll_loop_with_a_handover() {
    let consumer = consumer(fake(1, &[(0, 5)]));
    assert_eq!(poll(&consumer, &options(), &AtomicBool::new(true)).unwrap(), Stop::Handover);
}

/// A started partition resumes where its state is: through `resume_due`, against
/// librdkafka's mock cluster holding 100 records, a partition assigned paused at 0
/// whose state holds offset 42 is moved there — the first record the consumer fetches
/// is 42 and its position the one after — not to 0 or to the log's end.
#[test]
fn a_started_partition_resumes_at_the_offset_its_state_holds() -> Result<()> {
    use rdkafka::Message;
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let mock = rdkafka::mocking::MockCluster::new(1)?;
    mock.create_topic("positions", 1, 1)?;
    let producer: BaseProducer = ClientConfig::new().set("bootstrap.servers", mock.bootstrap_servers()).create()?;
    for i in 0..100 {
        let value = i.to_string();
        producer.send(BaseRecord::to("positions").key("k").payload(&value)).map_err(|(e, _)| e)?;
    }
    producer.flush(Duration::from_secs(10))?;

    let options = KafkaOptions { brokers: mock.bootstrap_servers(), ..options() };
    let membership = Membership::new("positions", fake(1, &[(0, 42)]), true);
    let consumer: BaseConsumer<Membership<Fake>> = options.client_config().create_with_context(membership)?;
    consumer.context().rebalance(&consumer, RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS, &mut list(&[0]));
    let started = Started {
        partition: 0,
        offset: 42,
        restored_from: RestoredFrom::Local { offset: 42 },
        assigned: Instant::now(),
        took: Duration::ZERO,
    };
    let resuming = Resuming { started, backoff: Backoff::new(options.retry_timeout), due: Instant::now() };
    let mut resuming = BTreeMap::from([(0, resuming)]);
    let mut owner = lock(&consumer.context().partitions);
    resume_due(&consumer, &options, owner.as_mut().expect("the test holds them"), &mut resuming)?;
    drop(owner);
    assert!(resuming.is_empty(), "resumed at the first try");

    let began = Instant::now();
    let first = loop {
        match consumer.poll(Duration::from_millis(100)) {
            Some(message) => break message?.offset(),
            None if began.elapsed() < Duration::from_secs(10) => continue,
            None => bail!("no record within 10 s"),
        }
    };
    assert_eq!(first, 42, "the first record fetched is the state's offset");
    let position = consumer.position()?;
    assert_eq!(position.find_partition("positions", 0).map(|p| p.offset()), Some(Offset::Offset(43)));
    Ok(())
}

/// A state inside its log resumes where it is; one at 0 starts at the earliest
/// record; one past the end is refused whatever the setting; one before the start
/// is refused, naming the range and the setting, or resumes at the start with it.
#[test]
fn a_state_outside_its_log_is_never_jumped_over_in_silence() {
    use OutOfRange::{Earliest, Fail};
    assert_eq!(resume_offset(0, 50, (10, 100), Fail).unwrap(), 50);
    assert_eq!(resume_offset(0, 100, (10, 100), Fail).unwrap(), 100, "at the end: waits for records");
    assert_eq!(resume_offset(0, 0, (10, 100), Fail).unwrap(), 10, "a state that read nothing");
    let past = resume_offset(3, 101, (0, 100), Earliest).unwrap_err().to_string();
    assert!(past.contains("partition 3: its state holds offset 101, past the end of its log (100)"), "{past}");
    let gone = resume_offset(1, 5, (10, 100), Fail).unwrap_err().to_string();
    assert!(gone.contains(OUT_OF_RANGE) && gone.contains("holds 10..100") && gone.contains("5 records"), "{gone}");
    assert!(gone.contains("offset_out_of_range = \"earliest\""), "{gone}");
    assert_eq!(resume_offset(1, 5, (10, 100), Earliest).unwrap(), 10);
}
