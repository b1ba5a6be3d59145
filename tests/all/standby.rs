//! Standby copies through the real binary, Apache Kafka and a shared store, under both
//! group protocols: a host that joins a group brings its copies up to date before it
//! joins and resumes what it is given from them; when it is killed, the other host
//! takes its partition over from its own copy, fetching at most a checkpoint's new
//! files, and ends with state equal to the fold and an output for every input —
//! exactly one under exactly-once outputs, as a `read_committed` consumer reads them.

use anyhow::{Context, Result};
use sluice::events::{ASSIGNED, RESUMED, WARMED_UP};
use sluice_e2e::*;
use std::time::{Duration, Instant};

/// The checkpoint the standby copy of `partition` holds on the host whose admin API is at
/// `admin`, as its status answer says (`GET /partitions`).
fn standby_copy(admin: &str, partition: u32) -> Result<Option<u64>> {
    let answer = sluice::admin::call(admin, hyper::Method::GET, "/partitions", Vec::new())?;
    let answer: sluice::metrics::partitions::PartitionsAnswer = serde_json::from_str(&answer)?;
    Ok(answer.host.standby.get(&partition).and_then(|copy| copy.checkpoint))
}

/// Waits up to a minute for `done`, naming `what` and showing `logs` if it never is.
fn wait_until(what: &str, mut done: impl FnMut() -> Result<bool>, logs: impl Fn() -> String) -> Result<()> {
    let started = Instant::now();
    while !done()? {
        assert!(started.elapsed() < Duration::from_secs(60), "{what} never happened:\n{}", logs());
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// The takeover, its outputs written `guarantee` (`at-least-once`, `exactly-once`).
fn a_standby_takes_over_a_killed_owner(protocol: GroupProtocol, guarantee: &str) -> Result<()> {
    let kafka = KafkaJob::on(KafkaBroker::shared()?).topic("positions", 2).topic("summaries", 1).start()?;
    let (broker, dir) = (&kafka.broker, kafka.dir());
    let (vehicles, total) = (3_000, 12_000usize);
    let all = kafka.generate("all.jsonl", vehicles, total as u64)?;
    let chunks = split_lines(&all, 3)?;
    let store = dir.join("store");
    let sink = format!(
        "[checkpoint]\nstandby_poll = \"300ms\"\n[sink]\nkind = \"kafka\"\nbrokers = \"{}\"\ntopic = {:?}\n\
         guarantee = \"{guarantee}\"\n",
        broker.bootstrap,
        broker.name("summaries")
    );
    let config = kafka.source("warm", &group_settings(protocol, &sink))?;
    let output = broker.output("summaries");
    let host = |name: &str| -> Result<Host> {
        // The flag names where outputs go; the config, how (`guarantee`).
        let flags =
            ["--checkpoint-interval", "1", "--report-interval", "1", "--output", &output, "--admin", "127.0.0.1:0"];
        kafka.host(name, 2, &config, Some(&store), &flags)
    };
    let minute = Duration::from_secs(60);
    let newest = |p: u32| checkpoint_manifests(&store, p).map(|mut m| m.pop());

    broker.produce_lines("positions", &chunks[0])?;
    let mut a = host("a")?;
    a.wait_for(RESUMED, 2, minute)?;
    let ends = broker.ends("positions")?;
    let checkpointed = |p: u32| -> Result<bool> {
        Ok(newest(p)?.is_some_and(|m| m["offset"].as_i64() == ends.get(&(p as i32)).copied()))
    };
    wait_until(
        "a checkpointing both partitions at their end",
        || Ok(checkpointed(0)? && checkpointed(1)?),
        || a.log(),
    )?;

    // b warms its copies up before it joins, and resumes the partition it is given from
    // its copy.
    let mut b = host("b")?;
    b.wait_for(RESUMED, 1, minute)?;
    let log_b = b.log();
    let (warmed, assigned) = (log_b.find(WARMED_UP), log_b.find(ASSIGNED));
    assert!(warmed.is_some() && warmed < assigned, "b warmed up before it joined:\n{log_b}");
    assert!(log_b.contains("2 copies current"), "both partitions had a copy:\n{log_b}");
    let resumes = reported_restores(&log_b);
    assert_eq!(resumes.first().map(|r| r.0.as_str()), Some("standby"), "b resumed from its copy:\n{log_b}");

    let (admin_a, admin_b) = (a.admin_url()?, b.admin_url()?);
    let on_b = running_partitions(&admin_b)?;
    assert_eq!(on_b.len(), 1, "b runs one partition: {on_b:?}\n{log_b}");
    let moved = *on_b.keys().next().expect("one");
    wait_until("a handing b's partition over", || Ok(!running_partitions(&admin_a)?.contains_key(&moved)), || a.log())?;
    let handed = offsets_logged(&a.log(), &handed_over(), moved).first().copied();
    assert!(handed.is_some(), "a handed partition {moved} over:\n{}", a.log());
    assert_eq!(
        offsets_logged(&log_b, RESUMED, moved).first().copied(),
        handed,
        "b resumed where a handed over, replaying nothing"
    );

    // More records; b checkpoints them and a's copy follows. Then b dies.
    broker.produce_lines("positions", &chunks[1])?;
    let ends = broker.ends("positions")?;
    wait_until(
        "a's copy holding b's newest checkpoint at the end",
        || {
            let newest = newest(moved)?.context("b checkpointed")?;
            let at_end = newest["offset"].as_i64() == ends.get(&(moved as i32)).copied();
            Ok(at_end && standby_copy(&admin_a, moved)? == newest["id"].as_u64())
        },
        || format!("{}\n{}", a.log(), b.log()),
    )?;
    assert!(a.log().contains("1 standby copies, ≤ 0 behind"), "a's running summary shows its copy:\n{}", a.log());
    let former = dir.join(format!("a/state/partition-{moved:04}"));
    assert!(!former.exists(), "a's database of the partition it handed over went once its copy was current");
    b.kill_9()?;
    broker.produce_lines("positions", &chunks[2])?;
    a.wait_for(RESUMED, 3, minute)?;
    let log_a = a.log();
    let (path, fetched, bytes) = reported_restores(&log_a).pop().context("a restored b's partition")?;
    let largest_checkpoint = checkpoint_manifests(&store, moved)?
        .iter()
        .map(|m| m["uploaded_bytes"].as_u64().unwrap_or(0))
        .max()
        .unwrap_or(0);
    assert_eq!(path, "standby", "{log_a}");
    assert!(fetched <= largest_checkpoint, "fetched {fetched} of {bytes} bytes, more than a checkpoint:\n{log_a}");
    println!("takeover of a killed owner's partition from a standby copy: fetched {fetched} of {bytes} bytes");

    let ends = broker.ends("positions")?;
    let at_end = || -> Result<bool> {
        let on_a = running_partitions(&admin_a)?;
        Ok(on_a.len() == 2 && on_a.into_iter().all(|(p, o)| ends.get(&(p as i32)) == Some(&(o as i64))))
    };
    wait_until("a running both partitions at their end", at_end, || a.log())?;
    a.terminate()?;

    let reference = Reference::fold(&all)?;
    let outputs = broker.read_topic("summaries")?;
    let mut per_input: std::collections::BTreeMap<(&str, &str), usize> = std::collections::BTreeMap::new();
    for r in &outputs {
        *per_input.entry((&r.headers["sluice-partition"], &r.headers["sluice-offset"])).or_default() += 1;
    }
    assert_eq!(per_input.len(), total, "every input has an output ({} outputs)", outputs.len());
    if guarantee == "exactly-once" {
        let repeated: Vec<_> = per_input.iter().filter(|(_, n)| **n > 1).take(5).collect();
        assert!(repeated.is_empty(), "inputs with more than one committed output, e.g. {repeated:?}");
    }
    assert_last_outputs(outputs.iter().map(|r| (r.key.as_str(), &r.value)), &reference, "last outputs");
    assert_state_matches(&dump_state(&dir.join("a/state"))?, &reference, "a's state after the takeover");
    Ok(())
}

/// What a host keeps of the partitions it does not run stays within `[checkpoint]
/// standby_max_bytes`, at its size on disk: with a budget of one byte, the database of
/// the partition it handed over and a copy left half-built (planted) are removed, not
/// kept beside the partitions it runs.
#[test]
fn a_former_database_and_a_half_built_copy_stay_within_the_standby_budget() -> Result<()> {
    let kafka = KafkaJob::on(KafkaBroker::shared()?).topic("positions", 2).start()?;
    let (broker, dir) = (&kafka.broker, kafka.dir());
    let all = kafka.generate("all.jsonl", 500, 4_000)?;
    let store = dir.join("store");
    let budget = "[checkpoint]\nstandby_poll = \"300ms\"\nstandby_max_bytes = 1\n";
    let config = kafka.source("budget", &group_settings(GroupProtocol::Classic, budget))?;
    let host = |name: &str| -> Result<Host> {
        kafka.host(name, 2, &config, Some(&store), &["--checkpoint-interval", "1", "--admin", "127.0.0.1:0"])
    };
    broker.produce_lines("positions", &all)?;
    let mut a = host("a")?;
    a.wait_for(RESUMED, 2, Duration::from_secs(60))?;
    let half_built = dir.join("a/state/standby/partition-0000.next");
    std::fs::create_dir_all(&half_built)?;
    std::fs::write(half_built.join("000777.sst"), vec![7u8; 1 << 20])?;
    let mut b = host("b")?;
    b.wait_for(RESUMED, 1, Duration::from_secs(60))?;
    let admin_a = a.admin_url()?;
    let not_run_here = || -> Result<Vec<std::path::PathBuf>> {
        let running = running_partitions(&admin_a)?;
        let mut kept: Vec<_> = (0..2u32)
            .filter(|p| !running.contains_key(p))
            .map(|p| dir.join(format!("a/state/partition-{p:04}")))
            .filter(|path| path.exists())
            .collect();
        kept.extend(std::fs::read_dir(dir.join("a/state/standby"))?.flatten().map(|entry| entry.path()));
        Ok(kept)
    };
    wait_until(
        "a keeping nothing of the partition it handed over",
        || Ok(running_partitions(&admin_a)?.len() == 1 && not_run_here()?.is_empty()),
        || format!("{:?}\n{}", not_run_here(), a.log()),
    )?;
    b.terminate()?;
    a.terminate()?;
    Ok(())
}

mod a_standby_takes_over_a_killed_owner_fetching_at_most_a_checkpoint {
    use super::*;

    #[test]
    fn classic() -> Result<()> {
        a_standby_takes_over_a_killed_owner(GroupProtocol::Classic, "at-least-once")
    }

    #[test]
    fn consumer() -> Result<()> {
        a_standby_takes_over_a_killed_owner(GroupProtocol::Consumer, "at-least-once")
    }

    #[test]
    fn classic_exactly_once() -> Result<()> {
        a_standby_takes_over_a_killed_owner(GroupProtocol::Classic, "exactly-once")
    }

    #[test]
    fn consumer_exactly_once() -> Result<()> {
        a_standby_takes_over_a_killed_owner(GroupProtocol::Consumer, "exactly-once")
    }
}
