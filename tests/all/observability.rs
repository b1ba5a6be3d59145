//! What a host tells the people who run it, through the real binary: its log (plain in
//! files, coloured on terminals, JSON when asked), the warnings that name their
//! settings, the metrics a scrape during a Kafka run reports and `sluice status` over
//! two hosts, and the status page as headless Chromium renders it, a deploy on its
//! timeline.

use crate::hot_swap::{PacedJob, named_version};
use anyhow::Result;
use serde_json::Value;
use sluice::events::{REBALANCING_OFTEN, RESUMED};
use sluice_e2e::*;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

/// The log as a platform team reads it: no escape sequences in a file or a pipe, colours
/// on a terminal unless `NO_COLOR` is set, one JSON object a line with `--log-format
/// json` (running summary included, partitions as fields), and a running summary of an
/// 8-partition job that lists only the partitions worth attention.
#[test]
fn logs_are_plain_in_files_coloured_on_terminals_and_json_when_asked() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let job = |name: &str| {
        let home = dir.path().join(name);
        let mut command = run_generator_job(&home, 200, 12_000, 11, 8);
        command.args(["--rate", "4000", "--report-interval", "0.3"]).env("SLUICE_LOG", "info");
        command
    };
    let piped = String::from_utf8(run_ok(&mut job("piped"))?.stderr)?;
    assert!(!piped.contains('\x1b'), "escape sequences in a pipe:\n{piped}");
    let summaries: Vec<&str> = piped.split("sluice::summary").skip(1).collect();
    assert!(!summaries.is_empty(), "{piped}");
    for summary in &summaries {
        let lines: Vec<&str> = summary.lines().skip(1).take_while(|l| l.starts_with("  p")).collect();
        assert!(lines.len() <= 4, "8 partitions, only those worth attention:\n{summary}");
    }
    assert!(summaries.iter().any(|s| s.contains("(slowest") || s.contains("largest")), "{piped}");
    // A summary counts the partitions running when it is written: the first may come
    // while some of the eight are still opening their state.
    assert!(summaries.iter().any(|s| s.contains("8 partitions")), "{piped}");

    // `script` gives the job a terminal.
    let on_terminal = |no_color: bool| -> Result<String> {
        let command = job(if no_color { "plain" } else { "terminal" });
        let words = std::iter::once(command.get_program()).chain(command.get_args());
        let line: Vec<String> = words.map(|w| format!("'{}'", w.to_string_lossy())).collect();
        let mut script = std::process::Command::new("script");
        script.args(["-qec", &format!("{} 2>&1", line.join(" ")), "/dev/null"]);
        script.envs(command.get_envs().filter_map(|(key, value)| Some((key, value?))));
        if no_color {
            script.env("NO_COLOR", "1");
        }
        Ok(String::from_utf8_lossy(&run_ok(&mut script)?.stdout).into_owned())
    };
    assert!(on_terminal(false)?.contains("\x1b["), "colours on a terminal");
    assert!(!on_terminal(true)?.contains("\x1b["), "NO_COLOR is respected");

    let json = String::from_utf8(run_ok(job("json").arg("--log-format").arg("json"))?.stderr)?;
    let events: Vec<Value> =
        json.lines().filter(|l| l.starts_with('{')).map(serde_json::from_str).collect::<Result<_, _>>()?;
    assert!(events.iter().all(|e| e["level"].is_string() && e["message"].is_string()), "{json}");
    assert!(events.iter().any(|e| e["target"] == "sluice::summary"), "{json}");
    assert!(events.iter().any(|e| e["partition"].is_u64()), "partitions as fields:\n{json}");
    let report = json.lines().skip_while(|l| l.starts_with('{')).collect::<Vec<_>>();
    assert!(report.iter().all(|l| !l.starts_with('{')), "only the final report follows the events:\n{json}");
    Ok(())
}

/// Warnings say what is wrong and the setting that tunes it: one partition holding most
/// of the state and taking most of the time, and records failing into the dead letters
/// (the probe over a paced file); then checkpoints falling behind once the store fails.
#[test]
fn warnings_name_skew_failing_records_and_checkpoints_behind_with_their_settings() -> Result<()> {
    use sluice::events::{CHECKPOINTS_BEHIND, DEAD_LETTERS_RISING, SKEWED_STATE, SKEWED_TIME};
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    let keys_in = |partition: u32| {
        (0..).map(|i| format!("v{i}")).filter(move |k| sluice::source::partition_for(k.as_bytes(), 4) == partition)
    };
    let record = |key: &str, action: serde_json::Value| {
        let mut line = action;
        line["vehicle_id"] = key.into();
        line.to_string()
    };
    let mut hot = Vec::new();
    for (i, key) in keys_in(0).take(3000).enumerate() {
        hot.push(record(&key, serde_json::json!({"action": "count"})));
        // Batches holding one take tens of ms, past the 10 ms below which no skew is
        // called, with room on a fast core.
        if i % 25 == 0 {
            hot.push(record(&key, serde_json::json!({"action": "work", "iterations": 100_000_000})));
        }
        if i % 10 == 0 {
            hot.push(record(&key, serde_json::json!({"action": "put-then-fail"})));
        }
    }
    let cold: Vec<String> = (1..4)
        .flat_map(|p| keys_in(p).take(20).collect::<Vec<_>>())
        .flat_map(|key| (0..5).map(move |_| key.clone()))
        .map(|key| record(&key, serde_json::json!({"action": "count"})))
        .collect();
    // The cold records spread over the whole run, between the hot ones.
    let (mut lines, step) = (Vec::new(), hot.len() / cold.len());
    for (i, line) in hot.iter().enumerate() {
        lines.push(line.clone());
        if i % step == 0 {
            lines.extend(cold.get(i / step).cloned());
        }
    }
    let input = dir.join("skewed.jsonl");
    std::fs::write(&input, lines.join("\n") + "\n")?;
    // At 300 records/s the run lasts over 12 s, so the warnings are checked (every
    // 5 s) at least twice, the second time with partition 0's state well past the
    // 1,000 entries below which no state skew is called, however slowly it processes.
    let run = run_ok(run_file_job(&operator_wasm("probe"), &input, dir, 4).args(["--rate", "300"]))?;
    let log = String::from_utf8_lossy(&run.stderr);
    for warning in [SKEWED_STATE, SKEWED_TIME] {
        assert!(log.contains(&format!("{warning}: partition 0")) && log.contains("skew_ratio"), "{warning}:\n{log}");
    }
    assert!(log.contains(DEAD_LETTERS_RISING) && log.contains("dead_letter_ratio"), "{log}");

    // One vehicle: one partition busy, the other idle, its state held by its last
    // checkpoint however old that is. Every 0.3 s a checkpoint: none behind until the
    // store fails.
    let store = dir.join("store");
    let home = dir.join("behind");
    let mut job = run_generator_job(&home, 1, 60_000, 11, 2);
    job.args(["--rate", "1000", "--checkpoint-interval", "0.3", "--report-interval", "0.5"]).arg("--checkpoint-store");
    let mut host = Host::spawn("behind", job.arg(&store), &dir.join("behind.log"))?;
    host.wait_for("sluice::summary", 1, std::time::Duration::from_secs(60))?;
    std::thread::sleep(sluice::warnings::CHECK_EVERY + std::time::Duration::from_secs(1));
    assert!(!host.log().contains(CHECKPOINTS_BEHIND), "{}", host.log());
    std::fs::rename(&store, dir.join("store.away"))?;
    std::fs::write(&store, "not a directory")?;
    host.wait_for(CHECKPOINTS_BEHIND, 1, std::time::Duration::from_secs(30))?;
    host.kill_9()?;
    assert!(host.log().contains("checkpoint_age_intervals = 3"), "{}", host.log());
    Ok(())
}

/// `GET /metrics` during a 4-partition run says what the run did: the records
/// processed, the state entries (one per vehicle), a lag of 0 once caught up, the
/// partitions assigned and restored; a second host joining makes the first count a
/// rebalance that revoked partitions, past `rebalances_per_hour` = 1, a warning that
/// `sluice status` shows with every partition of the two hosts; a deploy changes every
/// partition's version label.
#[test]
fn metrics_scraped_during_a_run_match_what_it_did() -> Result<()> {
    use sluice::metrics::families::*;
    let kafka = KafkaJob::on(KafkaBroker::shared()?).topic("positions", 4).start()?;
    let (broker, dir) = (&kafka.broker, kafka.dir());
    let (vehicles, count) = (100, 4_000);
    let all = kafka.generate("all.jsonl", vehicles, count)?;
    broker.produce_lines("positions", &all)?;
    let config = kafka.source("metrics", "[report]\nrebalances_per_hour = 1\n")?;
    let store = dir.join("store");
    let flags = ["--admin", "127.0.0.1:0", "--checkpoint-interval", "1"];
    let host = |name: &str| kafka.host(name, 4, &config, Some(&store), &flags);
    let minute = Duration::from_secs(60);
    let mut a = host("a")?;
    let admin = a.admin_url()?;
    broker.wait_committed("metrics", "positions", count as i64, minute)?;
    let scrape = || sluice::admin::call(&admin, hyper::Method::GET, "/metrics", Vec::new());
    // The lag follows librdkafka's statistics, which come every second.
    let started = Instant::now();
    let mut metrics = scrape()?;
    let caught_up = |metrics: &str| {
        metric_samples(metrics, &CONSUMER_LAG.sample()).len() == 4 && metric_sum(metrics, &CONSUMER_LAG.sample()) == 0.0
    };
    while !caught_up(&metrics) && started.elapsed() < minute {
        std::thread::sleep(Duration::from_millis(200));
        metrics = scrape()?;
    }
    assert_eq!(metric_sum(&metrics, &RECORDS_PROCESSED.sample()), count as f64, "{metrics}");
    assert_eq!(metric_sum(&metrics, &OUTPUTS.sample()), count as f64, "an output per record: {metrics}");
    assert_eq!(metric_sum(&metrics, &STATE_ENTRIES.sample()), vehicles as f64, "{metrics}");
    assert!(metric_sum(&metrics, &STATE_BYTES.sample()) > 0.0, "{metrics}");
    // Each vehicle's first read found nothing cached and went to RocksDB.
    assert!(metric_sum(&metrics, &STATE_CACHE_MISSES.sample()) >= vehicles as f64, "{metrics}");
    assert_eq!(metric_samples(&metrics, &CONSUMER_LAG.sample()).len(), 4, "{metrics}");
    assert_eq!(metric_sum(&metrics, &CONSUMER_LAG.sample()), 0.0, "{metrics}");
    assert_eq!(metric_sum(&metrics, &PARTITIONS_ASSIGNED.sample()), 4.0, "{metrics}");
    assert_eq!(metric_sum(&metrics, &PARTITIONS_RUNNING.sample()), 4.0, "{metrics}");
    assert_eq!(metric_sum(&metrics, &MAX_POLL_INTERVAL.sample()), 300.0, "{metrics}");
    assert!(metric_sum(&metrics, &RESTORE_DURATION.count()) >= 1.0, "{metrics}");
    let rebalances = metric_sum(&metrics, &REBALANCE_DURATION.count());
    assert!(rebalances >= 1.0, "{metrics}");
    assert!(metric_sum(&metrics, &BATCH_DURATION.count()) >= 4.0, "{metrics}");
    assert_eq!(
        metric_sum(&metrics, &CHECKPOINT_DURATION.count()),
        metric_sum(&metrics, &CHECKPOINTS.sample()),
        "a duration per checkpoint: {metrics}"
    );

    let mut b = host("b")?;
    b.wait_for(RESUMED, 1, minute)?;
    let metrics = scrape()?;
    assert!(metric_sum(&metrics, &REBALANCE_DURATION.count()) > rebalances, "{metrics}");
    assert!(metric_sum(&metrics, &PARTITIONS_REVOKED.sample()) >= 1.0, "{metrics}");
    assert!(metric_sum(&metrics, &PARTITIONS_RUNNING.sample()) < 4.0, "{metrics}");
    a.wait_for(REBALANCING_OFTEN, 1, minute)?;
    assert!(a.log().contains("rebalances_per_hour = 1"), "{}", a.log());
    let status = run_ok(sluice().arg("status").args(["--admin", &admin, "--admin", &b.admin_url()?]))?;
    let status = String::from_utf8(status.stdout)?;
    let rows = status.lines().filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit())).count();
    assert_eq!(rows, 4, "every partition once, on the host that runs it:\n{status}");
    assert!(status.contains(&format!("{admin}: ")) && status.contains(REBALANCING_OFTEN), "{status}");

    let versions = |metrics: &str| -> BTreeSet<String> {
        metric_samples(metrics, &PARTITION_OPERATOR_INFO.sample())
            .into_iter()
            .map(|(labels, _)| labels["version"].clone())
            .collect()
    };
    let before = versions(&metrics);
    run_ok(
        sluice().arg("deploy").arg("vehicle_stats").arg(operator_wasm("vehicle_stats_v2")).arg("--admin").arg(&admin),
    )?;
    let after = versions(&scrape()?);
    assert!(after.len() == 1 && after != before, "{before:?} then {after:?}");
    b.terminate()?;
    a.terminate()?;
    Ok(())
}

/// The status page at `GET /`, as Chromium renders it during a run: a row per partition
/// whose numbers grow while the job runs, totals, and — after a deploy — the new
/// version in every row and the switch on the timeline; then a shadow's section. It leaves a screenshot in
/// cargo's test directory (`status-page.png`, the one docs/observability.md shows).
#[test]
fn the_status_page_shows_the_partitions_live_and_a_deploy_on_its_timeline() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    let PacedJob { mut host, admin, .. } =
        PacedJob::start(dir, (100, 60_000), 2_000, &operator_wasm("vehicle_stats"), "")?;
    let profile = dir.join("chromium");
    std::thread::sleep(Duration::from_secs(2));
    let before = rendered_dom(&admin, &profile)?;
    let mut deploy = sluice();
    deploy.arg("deploy").arg("vehicle_stats").arg(operator_wasm("vehicle_stats_v2")).arg("--admin").arg(&admin);
    let answer = String::from_utf8(run_ok(&mut deploy)?.stdout)?;
    let v2 = named_version(&answer);
    std::thread::sleep(Duration::from_secs(1));
    let after = rendered_dom(&admin, &profile)?;

    for page in [&before, &after] {
        let updates = page.split("data-updates=\"").nth(1).and_then(|rest| rest.split('"').next()?.parse().ok());
        let updates: u32 = updates.unwrap_or(0);
        assert!(updates >= 2 && !page.contains("data-error"), "the page read the host every second:\n{page}");
    }
    let (rows_before, rows_after) = (page_rows(&before), page_rows(&after));
    assert_eq!(rows_before.keys().copied().collect::<Vec<_>>(), [0, 1, 2, 3], "{before}");
    assert_eq!(rows_after.keys().copied().collect::<Vec<_>>(), [0, 1, 2, 3], "{after}");
    let number = |text: &str| text.replace(',', "").parse::<u64>().unwrap_or(0);
    let processed = |rows: &BTreeMap<u32, BTreeMap<String, String>>| -> u64 {
        rows.values().map(|row| number(&row["processed"])).sum()
    };
    assert!(processed(&rows_before) > 0 && processed(&rows_after) > processed(&rows_before), "{before}\n{after}");
    let total = |page: &str| text_after(page, "data-total=\"records processed\"").map(|t| number(&t));
    assert!(total(&after) > total(&before), "the totals follow the run too");
    assert!(rows_after.values().all(|row| row["version"] == v2), "every partition runs {v2}:\n{after}");
    assert!(rows_before.values().all(|row| row["version"] != v2), "{before}");
    // The generator's event times begin on 2026-01-01; nothing expires in this job.
    let watermarks = rows_after.values().all(|row| row["watermark"].starts_with("2026-01-01T") && row["due"] == "0");
    assert!(
        watermarks,
        "each partition's watermark and timers due:
{after}"
    );
    let switch = text_after(&after, "data-kind=\"switch\"").unwrap_or_default();
    assert!(switch.contains("4 partitions from") && switch.contains(&v2), "on the timeline:\n{after}");

    // A shadow of version 1 beside version 2: its section shows each partition's
    // comparison and the field version 2 adds.
    let mut shadow = sluice();
    shadow.arg("deploy").arg("vehicle_stats").arg(operator_wasm("vehicle_stats")).arg("--shadow");
    run_ok(shadow.arg("--admin").arg(&admin))?;
    std::thread::sleep(Duration::from_secs(2));
    let shadowed = rendered_dom(&admin, &profile)?;
    let shadow_rows = shadowed.matches("<tr data-shadow-partition=\"").count();
    assert!(shadow_rows == 4 && !shadowed.contains("<div id=\"shadow\" hidden"), "{shadowed}");
    // Samples are records' keys and values: a page without the token says where they are.
    let samples = shadowed.split("<ul id=\"shadow-samples\"><li>").nth(1).unwrap_or_default();
    let sample = samples.split("</li>").next().unwrap_or_default();
    assert!(sample.contains("show with the admin token"), "{shadowed}");

    let png = Path::new(env!("CARGO_TARGET_TMPDIR")).join("status-page.png");
    screenshot(&admin, &profile, (1400, 1200), &png)?;
    assert!(std::fs::metadata(&png)?.len() > 10_000, "a screenshot with something on it");
    host.kill_9()
}

/// The partition rows of the status page's `html`: partition -> field -> text.
fn page_rows(html: &str) -> BTreeMap<u32, BTreeMap<String, String>> {
    let rows = html.split("<tr data-partition=\"").skip(1).map(|row| {
        let row = &row[..row.find("</tr>").unwrap_or(row.len())];
        let partition = row.split('"').next().and_then(|p| p.parse().ok()).unwrap_or(u32::MAX);
        let cells = row.split("<td data-field=\"").skip(1).filter_map(|cell| {
            let (field, rest) = cell.split_once('"')?;
            let text = rest.split_once('>')?.1.split('<').next()?;
            Some((field.to_string(), text.to_string()))
        });
        (partition, cells.collect())
    });
    rows.collect()
}
