//! What a rebalance may cost, on Apache Kafka under both group protocols: a checkpoint
//! store that fails at an assignment keeps the partition paused and the host in its
//! group until the store answers; a revocation neither waits for a restore under way
//! nor hands its partitions over one after another; a broker failing a partition's
//! resume costs that partition a pause.

use anyhow::{Context, Result};
use sluice::events::{ASSIGNED, RESUME_RETRY, RESUMED, REVOKED, STORE_RETRY};
use sluice_e2e::*;
use std::time::Duration;

/// The checkpoint store fails for both partitions (their folders replaced by files)
/// before host `b` joins `a`'s group: `b` keeps the partition it is given paused, stays
/// in the group and says so, trying the store again with backoff, while `a` hands the
/// partition over without its last checkpoint and goes on with the other. Once the
/// store answers, `b` restores the partition and processes on, and the store ends up
/// with every record's state.
fn a_store_outage_at_an_assignment_keeps_the_host_in_its_group_until_the_store_answers(
    protocol: GroupProtocol,
) -> Result<()> {
    let kafka = KafkaJob::on(KafkaBroker::shared()?).topic("positions", 2).start()?;
    let (broker, dir) = (&kafka.broker, kafka.dir());
    let all = kafka.generate("all.jsonl", 100, 4_000)?;
    let chunks = split_lines(&all, 2)?;
    let store = dir.join("store");
    let config = kafka.source("outage", &group_settings(protocol, ""))?;
    let host = |name: &str| kafka.host(name, 2, &config, Some(&store), &["--checkpoint-interval", "1"]);
    let minute = Duration::from_secs(60);
    broker.produce_lines("positions", &chunks[0])?;
    let mut a = host("a")?;
    a.wait_for(RESUMED, 2, minute)?;
    broker.wait_committed("outage", "positions", 2_000, minute)?;

    // The store's root still answers b's start; each partition's folder does not.
    let folders: Vec<_> = (0..2).map(|p| store.join(format!("partition-{p:04}"))).collect();
    for folder in &folders {
        std::fs::rename(folder, folder.with_extension("away"))?;
        std::fs::write(folder, "not a directory")?;
    }
    let mut b = host("b")?;
    b.wait_for(STORE_RETRY, 2, minute)?;
    assert!(!b.log().contains(RESUMED), "b resumed a partition without its state:\n{}", b.log());
    for folder in &folders {
        std::fs::remove_file(folder)?;
        std::fs::rename(folder.with_extension("away"), folder)?;
    }
    b.wait_for(RESUMED, 1, minute)?;
    broker.produce_lines("positions", &chunks[1])?;
    let caught_up = broker.wait_committed("outage", "positions", 4_000, minute);
    caught_up.with_context(|| format!("host logs:\n{}\n{}", a.log(), b.log()))?;
    b.terminate()?;
    a.terminate()?;

    let check = dir.join("check");
    let config = kafka.source("outage-check", &format!("stop_when_idle_s = 2\n{}", group_settings(protocol, "")))?;
    let mut command = run_job(&operator_wasm("vehicle_stats"), &check, 2);
    run_ok(command.arg("--config").arg(&config).arg("--checkpoint-store").arg(&store))?;
    assert_state_matches(&dump_state(&check.join("state"))?, &Reference::fold(&all)?, "restored after the outage");
    Ok(())
}

for_each_group_protocol!(a_store_outage_at_an_assignment_keeps_the_host_in_its_group_until_the_store_answers);

/// A revocation does not wait for a restore: host b (keeping no standby copies)
/// restores both partitions from a store it may read only slowly (`download_bytes_per_s`: tens of seconds for their
/// checkpoints) when host c joins the group, and hands one of them over at once, giving
/// its restore up, rather than hold its poll loop until the restore ends — longer than
/// `max.poll.interval.ms` would allow, after which b would be evicted and the group
/// would rebalance again, restoring again. c, which keeps its state apart, runs its
/// partition while b still restores the other; b then resumes the one it kept, and the
/// group reads the topic to its end.
fn a_revocation_does_not_wait_for_a_restore_under_way(protocol: GroupProtocol) -> Result<()> {
    let kafka = KafkaJob::on(KafkaBroker::shared()?).topic("positions", 2).start()?;
    let (broker, dir) = (&kafka.broker, kafka.dir());
    let all = kafka.generate("all.jsonl", 2_000, 4_000)?;
    broker.produce_lines("positions", &all)?;
    let store = dir.join("store");
    let minute = Duration::from_secs(60);
    // a leaves a checkpoint of each partition in the store.
    let config = kafka.source("seed", &format!("stop_when_idle_s = 2\n{}", group_settings(protocol, "")))?;
    let mut seed = run_job(&operator_wasm("vehicle_stats"), &dir.join("a"), 2);
    run_ok(seed.arg("--config").arg(&config).arg("--checkpoint-store").arg(&store))?;
    let checkpoint_bytes = newest_checkpoint_bytes(&store, 0)? + newest_checkpoint_bytes(&store, 1)?;
    // Both restores together take about 20 s at this cap.
    let cap = (checkpoint_bytes / 20).max(1);
    let properties = format!(
        "\"max.poll.interval.ms\" = \"10000\"\n[checkpoint]\ndownload_bytes_per_s = {cap}\nstandby = \"none\"\n"
    );
    let config = kafka.source("restoring", &group_settings(protocol, &properties))?;
    let mut b = kafka.host("b", 2, &config, Some(&store), &[])?;
    b.wait_for(ASSIGNED, 1, minute)?;
    let mut c = kafka.host("c", 2, &config, None, &["--no-checkpoints"])?;
    let revoked = b.wait_for(REVOKED, 1, Duration::from_secs(15));
    let resumed = c.wait_for(RESUMED, 1, Duration::from_secs(15));
    let b_resumed_early = b.log().contains(RESUMED);
    revoked.with_context(|| format!("b's revocation waited for its restore:\n{}", b.log()))?;
    resumed?;
    assert!(!b_resumed_early, "b's restores of {checkpoint_bytes} bytes at {cap} bytes/s ended early:\n{}", b.log());
    b.wait_for(RESUMED, 1, minute)?;
    broker.wait_committed("restoring", "positions", 4_000, minute)?;
    b.terminate()?;
    c.terminate()?;
    assert!(!b.log().contains("lost ("), "b was never evicted:\n{}", b.log());
    Ok(())
}

for_each_group_protocol!(a_revocation_does_not_wait_for_a_restore_under_way);

/// A revocation hands its partitions over all at once, so it takes as long as its
/// slowest handover, not their sum: host a owns six partitions, each of whose last
/// checkpoint takes about a second to upload (`upload_bytes_per_s`), when host b joins
/// and takes three; a's revocation takes well under the sum of the three handovers it
/// logs.
fn a_revocation_hands_its_partitions_over_at_once(protocol: GroupProtocol) -> Result<()> {
    let kafka = KafkaJob::on(KafkaBroker::shared()?).topic("positions", 6).start()?;
    let (broker, dir) = (&kafka.broker, kafka.dir());
    let all = kafka.generate("all.jsonl", 300, 3_000)?;
    broker.produce_lines("positions", &all)?;
    // No checkpoint until the handover's last one, each tens of KiB at 16 KiB/s.
    let more = "[checkpoint]\ninterval = \"1h\"\nupload_bytes_per_s = 16384\n";
    let config = kafka.source("together", &group_settings(protocol, more))?;
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

for_each_group_protocol!(a_revocation_hands_its_partitions_over_at_once);

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
    let config = kafka.source("resume", "")?;
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
