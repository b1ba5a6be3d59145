//! Standby copies through the real binary, Apache Kafka and a shared store, under both
//! group protocols: a host that joins a group brings its copies up to date before it
//! joins and resumes what it is given from them; when it is killed, the other host
//! takes its partition over from its own copy, fetching at most a checkpoint's new
//! files, and ends with state equal to the fold and an output for every input —
//! exactly one under exactly-once outputs, as a `read_committed` consumer reads them.

use anyhow::{Context, Result};
use sluice::events::{ASSIGNED, RESUMED, WARMED_UP};
use sluice_e2e::*;
use std::collections::BTreeMap;
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

/// A takeover's restore goes before standby downloads, under the download cap they
/// share: host a runs all eight partitions when host b joins, its copies not begun
/// (`standby_warm_up = "0s"`), and is given four to restore under a cap that makes the
/// restore last seconds, while its follower would copy a's four. No download of a copy's
/// file starts while the restore runs (those in flight when it began finish); the copies
/// are made after it. A file is written as its download starts, whole (it is under the
/// 1 MiB a download reads at once), and then waits its turn at the cap: its time says
/// when its download started.
#[test]
fn a_takeovers_restore_goes_before_standby_downloads() -> Result<()> {
    const PARTITIONS: u32 = 8;
    let kafka = KafkaJob::on(KafkaBroker::shared()?).topic("positions", PARTITIONS as i32).start()?;
    let (broker, dir) = (&kafka.broker, kafka.dir());
    let all = kafka.generate("all.jsonl", 16_000, 32_000)?;
    broker.produce_lines("positions", &all)?;
    let store = dir.join("store");
    let minute = Duration::from_secs(60);
    // A checkpoint of each partition in the store.
    let seed = kafka.source("seed", "stop_when_idle_s = 2\n")?;
    let mut command = run_job(&operator_wasm("vehicle_stats"), &dir.join("seed"), PARTITIONS);
    run_ok(command.arg("--config").arg(&seed).arg("--checkpoint-store").arg(&store))?;
    let state_bytes: u64 = (0..PARTITIONS).map(|p| newest_checkpoint_bytes(&store, p)).sum::<Result<u64>>()?;
    // A partition takes about 4 s to download at this cap: b's restore of half the
    // state about 16 s.
    let cap = (state_bytes / 32).max(1);
    // The consumer protocol: the quicker join, the less b's follower copies before it.
    let a_settings = group_settings(GroupProtocol::Consumer, "[checkpoint]\nstandby = \"none\"\n");
    let a_config = kafka.source("priority", &a_settings)?;
    let mut a = kafka.host("a", PARTITIONS, &a_config, Some(&store), &[])?;
    a.wait_for(RESUMED, PARTITIONS as usize, minute)?;
    let b_settings = group_settings(
        GroupProtocol::Consumer,
        &format!(
            "[checkpoint]\ndownload_bytes_per_s = {cap}\nstandby = \"all\"\nstandby_warm_up = \"0s\"\n\
             standby_poll = \"300ms\"\n"
        ),
    );
    std::fs::create_dir_all(dir.join("b"))?;
    let (positions, group) = (broker.name("positions"), broker.name("priority"));
    let b_config = positions_source(&dir.join("b"), &broker.bootstrap, &positions, &group, &b_settings)?;
    let mut b = kafka.host("b", PARTITIONS, &b_config, Some(&store), &["--admin", "127.0.0.1:0"])?;
    let admin = b.admin_url()?;
    b.wait_for(RESUMED, 4, Duration::from_secs(180))?;
    let running = running_partitions(&admin)?;
    let followed: Vec<u32> = (0..PARTITIONS).filter(|p| !running.contains_key(p)).collect();
    assert_eq!(followed.len(), 4, "b runs {running:?}:\n{}", b.log());
    wait_until(
        "b's copies of a's partitions, after the restore",
        || {
            for &p in &followed {
                if standby_copy(&admin, p)?.is_none() {
                    return Ok(false);
                }
            }
            Ok(true)
        },
        || b.log(),
    )?;
    let restores = restores(&admin)?;
    let restoring_ms: u64 = restores.iter().map(|(start, end)| end - start).sum();
    assert!(restoring_ms >= 4_000, "b restored for seconds under the cap: {restores:?}\n{}", b.log());
    let mut started = Vec::new();
    // Each copy's record is written at its end, not downloaded.
    let downloaded =
        files_under(&dir.join("b/state/standby"))?.into_iter().filter(|f| !f.ends_with("sluice-standby.json"));
    for file in downloaded {
        let modified = std::fs::metadata(&file)?.modified()?.duration_since(std::time::UNIX_EPOCH)?.as_millis();
        if restores.iter().any(|&(start, end)| (u128::from(start)..u128::from(end)).contains(&modified)) {
            started.push(file);
        }
    }
    assert!(started.is_empty(), "copies' downloads started while b restored {restores:?}: {started:?}\n{}", b.log());
    b.terminate()?;
    a.terminate()?;
    Ok(())
}

/// From the start to the end of each restore that fetched anything, as the timeline of
/// the host whose admin API is at `admin` shows them (ms since the epoch).
fn restores(admin: &str) -> Result<Vec<(u64, u64)>> {
    let timeline = sluice::admin::call(admin, hyper::Method::GET, "/timeline", Vec::new())?;
    let timeline: serde_json::Value = serde_json::from_str(&timeline)?;
    let entries = timeline["entries"].as_array().context("the timeline's entries")?;
    let restores = entries.iter().filter(|e| e["kind"] == "restore" && e["bytes"].as_u64().is_some_and(|b| b > 0));
    Ok(restores
        .map(|e| {
            let (end, took_s) = (e["at_ms"].as_u64().unwrap_or(0), e["took_s"].as_f64().unwrap_or(0.0));
            (end.saturating_sub((took_s * 1e3) as u64), end)
        })
        .collect())
}

/// Every file under `dir`, recursively.
fn files_under(dir: &std::path::Path) -> Result<Vec<std::path::PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        match path.is_dir() {
            true => files.extend(files_under(&path)?),
            false => files.push(path),
        }
    }
    Ok(files)
}

/// The hosts keeping a standby copy of each partition, by partition, as the status
/// answers of the hosts at `admins` say: copies holding a checkpoint only.
fn standby_hosts(admins: &[(&str, String)]) -> Result<BTreeMap<u32, Vec<String>>> {
    let mut hosts: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for (name, admin) in admins {
        let answer = sluice::admin::call(admin, hyper::Method::GET, "/partitions", Vec::new())?;
        let answer: sluice::metrics::partitions::PartitionsAnswer = serde_json::from_str(&answer)?;
        for (&p, copy) in &answer.host.standby {
            if copy.checkpoint.is_some() {
                hosts.entry(p).or_default().push(name.to_string());
            }
        }
    }
    Ok(hosts)
}

/// `standby = 1` on three hosts of a group with six partitions: each partition's copy is
/// kept by exactly one host, never its owner — six copies in all where "all" keeps twelve
/// — as every host reads the group's description alike. When one host is killed, the
/// copies are chosen again between the two left, each partition still followed by the
/// host that does not run it, and the killed host's partitions resume on them.
fn each_partition_is_followed_by_n_hosts(protocol: GroupProtocol) -> Result<()> {
    let kafka = KafkaJob::on(KafkaBroker::shared()?).topic("positions", 6).start()?;
    let (broker, dir) = (&kafka.broker, kafka.dir());
    broker.produce_lines("positions", &kafka.generate("all.jsonl", 600, 6_000)?)?;
    let store = dir.join("store");
    let settings = "[checkpoint]\nstandby = 1\nstandby_poll = \"300ms\"\n";
    let config = kafka.source("chosen", &group_settings(protocol, settings))?;
    let host = |name: &str| -> Result<Host> {
        kafka.host(name, 6, &config, Some(&store), &["--checkpoint-interval", "1", "--admin", "127.0.0.1:0"])
    };
    let mut hosts = vec![host("a")?, host("b")?, host("c")?];
    let mut admins = Vec::new();
    for (host, name) in hosts.iter_mut().zip(["a", "b", "c"]) {
        admins.push((name, host.admin_url()?));
    }
    let logs = |hosts: &[Host]| hosts.iter().map(Host::log).collect::<Vec<_>>().join("\n");
    // Each partition followed by exactly one host, which does not run it, and every
    // partition running on one of `admins`.
    let followed_once = |admins: &[(&str, String)]| -> Result<bool> {
        let copies = standby_hosts(admins)?;
        let mut running = BTreeMap::new();
        for (name, admin) in admins {
            running.extend(running_partitions(admin)?.into_keys().map(|p| (p, name.to_string())));
        }
        Ok(running.len() == 6
            && (0..6).all(|p| copies.get(&p).is_some_and(|on| on.len() == 1 && Some(&on[0]) != running.get(&p))))
    };
    wait_until(
        "each partition followed by one host other than its owner",
        || followed_once(&admins),
        || format!("{:?}\n{}", standby_hosts(&admins), logs(&hosts)),
    )?;
    let killed = hosts.pop().expect("c");
    let moved: Vec<u32> = running_partitions(&admins[2].1)?.into_keys().collect();
    let mut killed = killed;
    let logged_before: Vec<usize> = hosts.iter().map(|h| h.log().len()).collect();
    killed.kill_9()?;
    admins.pop();
    wait_until(
        "the copies chosen again between a and b",
        || followed_once(&admins),
        || format!("{:?}\n{}", standby_hosts(&admins), logs(&hosts)),
    )?;
    let restores_since = hosts.iter().zip(&logged_before).flat_map(|(h, &at)| reported_restores(&h.log()[at..]));
    let warm = restores_since.filter(|(path, _, _)| path == "standby").count();
    println!("standby = 1, three hosts, c killed: {warm} of c's {} partitions resumed from a copy", moved.len());
    for host in &mut hosts {
        host.terminate()?;
    }
    Ok(())
}

mod each_partition_is_followed_by_n_hosts_other_than_its_owner {
    use super::*;

    #[test]
    fn classic() -> Result<()> {
        each_partition_is_followed_by_n_hosts(GroupProtocol::Classic)
    }

    #[test]
    fn consumer() -> Result<()> {
        each_partition_is_followed_by_n_hosts(GroupProtocol::Consumer)
    }
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
