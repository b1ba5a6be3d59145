//! What a rebalance may cost (tansu): a checkpoint store that fails at an assignment
//! keeps the partition paused and the host in its group until the store answers; a
//! revocation neither waits for a restore from a frozen store nor hands its partitions
//! over one after another; a broker failing a partition's resume costs that partition a
//! pause.

use anyhow::{Context, Result};
use sluice::events::{ASSIGNED, JOB_STARTED, RESUME_RETRY, RESUMED, REVOKED, STORE_RETRY};
use sluice_e2e::*;
use std::time::Duration;

/// The checkpoint store fails (its directory replaced by a file) just as host `b` joins
/// `a`'s group: `b` keeps the partition it is given paused, stays in the group and says
/// so, trying the store again with backoff, while `a` hands the partition over without
/// its last checkpoint and goes on with the other. Once the store answers, `b` restores
/// the partition and processes on, and the store ends up with every record's state.
#[test]
fn a_store_outage_at_an_assignment_keeps_the_host_in_its_group_until_the_store_answers() -> Result<()> {
    let kafka = KafkaJob::on(KafkaBroker::start_in_memory()?).topic("positions", 2).start()?;
    let (broker, dir) = (&kafka.broker, kafka.dir());
    let all = kafka.generate("all.jsonl", 100, 4_000)?;
    let chunks = split_lines(&all, 2)?;
    let (store, away) = (dir.join("store"), dir.join("store.away"));
    let config = kafka.source("group = \"outage\"\n")?;
    let host = |name: &str| kafka.host(name, 2, &config, Some(&store), &["--checkpoint-interval", "1"]);
    let minute = Duration::from_secs(60);
    broker.produce_lines("positions", &chunks[0])?;
    let mut a = host("a")?;
    a.wait_for(RESUMED, 2, minute)?;
    broker.wait_committed("outage", "positions", 2_000, minute)?;

    // b has checked the store at its start; its assignment comes seconds later.
    let mut b = host("b")?;
    b.wait_for(JOB_STARTED, 1, minute)?;
    std::fs::rename(&store, &away)?;
    std::fs::write(&store, "not a directory")?;
    b.wait_for(STORE_RETRY, 2, minute)?;
    assert!(!b.log().contains(RESUMED), "b resumed a partition without its state:\n{}", b.log());
    std::fs::remove_file(&store)?;
    std::fs::rename(&away, &store)?;
    b.wait_for(RESUMED, 1, minute)?;
    broker.produce_lines("positions", &chunks[1])?;
    let caught_up = broker.wait_committed("outage", "positions", 4_000, minute);
    caught_up.with_context(|| format!("host logs:\n{}\n{}", a.log(), b.log()))?;
    b.terminate()?;
    a.terminate()?;

    let check = dir.join("check");
    let config = kafka.source("group = \"outage-check\"\nstop_when_idle_s = 2\n")?;
    let mut command = run_job(&operator_wasm("vehicle_stats"), &check, 2);
    run_ok(command.arg("--config").arg(&config).arg("--checkpoint-store").arg(&store))?;
    assert_state_matches(&dump_state(&check.join("state"))?, &Reference::fold(&all)?, "restored after the outage");
    Ok(())
}

/// A revocation does not wait for a restore: host b restores both partitions from an S3
/// store that stopped answering (frozen) when host c joins the group, and hands one of
/// them over at once, giving its restore up, rather than hold its poll loop until the
/// store answers — longer than `max.poll.interval.ms` (10 s here), after which b would
/// be evicted and the group would rebalance again, restoring again. c, which keeps its
/// state apart, runs its partition while the store is still frozen; once the store
/// answers, b resumes the one it kept, and the group reads the topic to its end.
#[test]
fn a_revocation_does_not_wait_for_a_restore_from_a_store_that_stopped_answering() -> Result<()> {
    let kafka = KafkaJob::on(KafkaBroker::start()?).topic("positions", 2).start()?;
    let (broker, dir) = (&kafka.broker, kafka.dir());
    let s3 = S3Server::start()?;
    let all = kafka.generate("all.jsonl", 100, 2_000)?;
    broker.produce_lines("positions", &all)?;
    let properties = "[source.properties]\n\"max.poll.interval.ms\" = \"10000\"\n\"session.timeout.ms\" = \"6000\"\n\
                      \"heartbeat.interval.ms\" = \"500\"\n";
    let minute = Duration::from_secs(60);
    // b must be assigned its partitions after the store froze. Its assignment mostly
    // comes seconds after its start, but the broker may answer its join at once, before
    // the test can freeze the store (in one full run, all of three tries): such a try
    // tested nothing, and the next one runs in a group, state directories and store
    // prefix of its own.
    const TRIES: usize = 8;
    for attempt in 1..=TRIES {
        let group = format!("restoring-{attempt}");
        let config = kafka.source(&format!("group = \"{group}\"\n{properties}"))?;
        let mut command = run_job(&operator_wasm("vehicle_stats"), &dir.join(format!("b{attempt}")), 2);
        let store = format!("s3://sluice/checkpoints-{attempt}");
        command.arg("--config").arg(&config).args(["--checkpoint-store", &store]);
        let mut b = Host::spawn("b", s3.configure(&mut command), &dir.join(format!("b{attempt}.log")))?;
        // b has checked the store at its start.
        b.wait_for(JOB_STARTED, 1, minute)?;
        let frozen_at = humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string();
        s3.freeze(true)?;
        b.wait_for(ASSIGNED, 1, minute)?;
        // Log lines start with their time, in the same format: as text, earlier is less.
        let log = b.log();
        let assigned_at = log.lines().find(|line| line.contains(ASSIGNED)).and_then(|l| l.split_whitespace().next());
        if assigned_at.is_none_or(|at| at < frozen_at.as_str()) {
            let early = format!("b was assigned ({assigned_at:?}) before the store froze ({frozen_at})");
            anyhow::ensure!(attempt < TRIES, "{early} in each of {TRIES} tries");
            println!("try {attempt}: {early}; again");
            s3.freeze(false)?;
            b.terminate()?;
            continue;
        }
        let mut command = run_job(&operator_wasm("vehicle_stats"), &dir.join(format!("c{attempt}")), 2);
        let c_log = dir.join(format!("c{attempt}.log"));
        let mut c = Host::spawn("c", command.arg("--config").arg(&config).arg("--no-checkpoints"), &c_log)?;
        let revoked = b.wait_for(REVOKED, 1, Duration::from_secs(30));
        let resumed = c.wait_for(RESUMED, 1, Duration::from_secs(30));
        let b_resumed_frozen = b.log().contains(RESUMED);
        s3.freeze(false)?;
        revoked.context("b's revocation waited for the frozen store")?;
        resumed?;
        assert!(!b_resumed_frozen, "b resumed a partition its store never restored:\n{}", b.log());
        b.wait_for(RESUMED, 1, minute)?;
        broker.wait_committed(&group, "positions", 2_000, minute)?;
        b.terminate()?;
        c.terminate()?;
        assert!(!b.log().contains("lost ("), "b was never evicted:\n{}", b.log());
        return Ok(());
    }
    unreachable!("the last try ends in an error or runs to the end")
}

/// A revocation hands its partitions over all at once, so it takes as long as its
/// slowest handover, not their sum: host a owns six partitions, each of whose last
/// checkpoint takes about a second to upload (`upload_bytes_per_s`), when host b joins
/// and takes three; a's revocation takes well under the sum of the three handovers it
/// logs.
#[test]
fn a_revocation_hands_its_partitions_over_at_once() -> Result<()> {
    let kafka = KafkaJob::on(KafkaBroker::start()?).topic("positions", 6).start()?;
    let (broker, dir) = (&kafka.broker, kafka.dir());
    let all = kafka.generate("all.jsonl", 300, 3_000)?;
    broker.produce_lines("positions", &all)?;
    // No checkpoint until the handover's last one, each tens of KiB at 16 KiB/s.
    let more = "group = \"together\"\n[checkpoint]\ninterval = \"1h\"\nupload_bytes_per_s = 16384\n";
    let config = kafka.source(more)?;
    let store = dir.join("store");
    let host = |name: &str| kafka.host(name, 6, &config, Some(&store), &[]);
    let minute = Duration::from_secs(60);
    let mut a = host("a")?;
    a.wait_for(RESUMED, 6, minute)?;
    broker.wait_committed("together", "positions", 3_000, minute)?;
    let mut b = host("b")?;
    a.wait_for(REVOKED, 1, minute)?;
    b.wait_for(RESUMED, 3, minute)?;
    let log = a.log();
    let ms = |line: &str, after: &str| -> Option<f64> {
        let rest = &line[line.find(after)? + after.len()..];
        rest.split_whitespace().next()?.parse().ok()
    };
    let revoked = log.lines().find(|l| l.contains(REVOKED)).context("a logged its revocation")?;
    let took = ms(revoked, "] in ").with_context(|| format!("the revocation's time: {revoked}"))?;
    let handovers: Vec<f64> = log.lines().filter_map(|l| ms(l, &format!("{} in ", handed_over()))).collect();
    assert_eq!(handovers.len(), 3, "three partitions handed over:\n{log}");
    let sum: f64 = handovers.iter().sum();
    println!("revocation of 3 partitions: {took:.0} ms; their handovers: {handovers:?} ms");
    assert!(handovers.iter().all(|&h| h >= 500.0), "each upload takes its time: {handovers:?}\n{log}");
    assert!(took < sum * 2.0 / 3.0, "the revocation took {took:.0} ms, its handovers {handovers:?}:\n{log}");
    b.terminate()?;
    a.terminate()?;
    Ok(())
}

/// A broker that cannot tell where a partition's log is when it resumes costs that
/// partition a pause, not the host: the partition's folder in the store is a file, so
/// its restore fails and waits (a host alone in its group is assigned the partition at
/// once, so the store is broken before the host starts, where only the partition's
/// restore reads); the broker stops answering (frozen) and the folder comes back, so the
/// restore completes and the resume's query of the log's offsets times out. The host says
/// so, tries again with backoff, and resumes once the broker answers, reading every record.
#[test]
fn a_broker_failing_a_partitions_resume_costs_it_a_pause() -> Result<()> {
    let kafka = KafkaJob::on(KafkaBroker::start()?).topic("positions", 1).start()?;
    let (broker, dir) = (&kafka.broker, kafka.dir());
    let all = kafka.generate("all.jsonl", 20, 500)?;
    broker.produce_lines("positions", &all)?;
    let store = dir.join("store");
    let partition_folder = store.join("partition-0000");
    std::fs::create_dir_all(&store)?;
    std::fs::write(&partition_folder, "not a directory")?;
    let config = kafka.source("group = \"resume\"\n")?;
    let minute = Duration::from_secs(60);
    let mut host = kafka.host("host", 1, &config, Some(&store), &[])?;
    host.wait_for(STORE_RETRY, 1, minute)?;
    broker.freeze(true)?;
    std::fs::remove_file(&partition_folder)?;
    let retried = host.wait_for(RESUME_RETRY, 1, minute);
    broker.freeze(false)?;
    retried?;
    host.wait_for(RESUMED, 1, minute)?;
    broker.wait_committed("resume", "positions", 500, minute)?;
    host.terminate()?;
    assert_state_matches(&dump_state(&dir.join("host/state"))?, &Reference::fold(&all)?, "after the resume");
    Ok(())
}
