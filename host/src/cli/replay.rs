//! `sluice replay`: one partition of a job replayed from a checkpoint through a
//! version, and, given the live job's outputs, how they differ.
//!
//! This module owns the command's side: the job file and flags made into a
//! [`Replay`], the summary and the differences printed, `differences.jsonl` written,
//! and the error that makes the exit code 1 when outputs differ. The replay and the
//! comparison are `sluice::replay`'s.

use super::args::ReplayArgs;
use anyhow::{Context, Result, bail};
use sluice::config::{Config, SourceConfig};
use sluice::replay::diff::OutputDiff;
use sluice::replay::{Replay, ReplayInput};
use std::io::Write;

/// `sluice replay`
pub fn replay(args: &ReplayArgs) -> Result<()> {
    let mut out = std::io::stdout().lock();
    let job = Config::load(&args.config)?;
    let store = match (&args.store, job.checkpoint.enabled) {
        (Some(store), _) => store.clone(),
        (None, true) => job.checkpoint.store_url(&job.state.dir),
        (None, false) => bail!("{} turns checkpoints off: give the store with --store", args.config.display()),
    };
    let input = match (&args.input, &args.brokers, &args.topic, &job.source) {
        (Some(input), None, None, _) => ReplayInput::File(input.clone()),
        (None, Some(brokers), Some(topic), source) => {
            let properties = match source {
                SourceConfig::Kafka { properties, .. } => properties.clone(),
                _ => Default::default(),
            };
            ReplayInput::Kafka { brokers: brokers.clone(), topic: topic.clone(), properties }
        }
        (None, None, None, SourceConfig::File { path, .. }) => ReplayInput::File(path.clone()),
        (None, None, None, SourceConfig::Kafka { brokers, topic, properties, .. }) => {
            ReplayInput::Kafka { brokers: brokers.clone(), topic: topic.clone(), properties: properties.clone() }
        }
        (None, None, None, SourceConfig::Generator { .. }) => {
            bail!("{} reads the generator: give the records with --input", args.config.display())
        }
        _ => bail!("give the records with --input FILE, or with --brokers and --topic, not both"),
    };
    let replay = Replay {
        job,
        store,
        partition: args.partition,
        checkpoint: args.checkpoint,
        operator: args.operator.clone(),
        input,
        until: args.until,
        out: args.out.clone(),
    };
    let replayed = sluice::replay::run(&replay)?;
    let checkpoint = &replayed.checkpoint;
    writeln!(
        out,
        "replayed partition {} from checkpoint {} (offset {}) to offset {} with {}: {} records in {:.2}s into {}",
        checkpoint.partition,
        checkpoint.id,
        checkpoint.offset,
        replayed.end,
        replayed.version,
        replayed.records,
        replayed.took.as_secs_f64(),
        args.out.display()
    )?;
    for caveat in &replayed.caveats {
        writeln!(out, "note: {caveat}")?;
    }
    let Some(live) = &args.compare else { return Ok(()) };
    let diff = replayed.compare(live)?;
    write_differences(&args.out.join("differences.jsonl"), &diff)?;
    writeln!(
        out,
        "compared with {}: {} records and expiry groups, {} equal, {} different, {} only in the live outputs, {} only in \
         the replay's",
        live.display(),
        diff.compared,
        diff.equal,
        diff.different,
        diff.only_left,
        diff.only_right
    )?;
    for difference in diff.differences.iter().take(args.show) {
        let cause = difference.origin.cause.as_deref().map_or(String::new(), |cause| format!(" ({cause})"));
        let fields: Vec<String> = difference
            .fields
            .iter()
            .map(|f| format!("{} (live {}, replay {})", f.path, shown(&f.left), shown(&f.right)))
            .collect();
        writeln!(out, "  offset {}{cause}, key {}: {}", difference.origin.offset, difference.key, fields.join(", "))?;
    }
    if diff.differences.len() > args.show {
        writeln!(out, "  … {} more in differences.jsonl", diff.differences.len() - args.show)?;
    }
    if !diff.differences.is_empty() {
        bail!("the replay's outputs differ from {} for {} records", live.display(), diff.differences.len());
    }
    Ok(())
}

/// A field's value as printed: `absent` where the line has none.
fn shown(value: &Option<serde_json::Value>) -> String {
    value.as_ref().map_or("absent".to_string(), serde_json::Value::to_string)
}

/// Writes every difference of `diff` to `path`, one JSON line each.
fn write_differences(path: &std::path::Path, diff: &OutputDiff) -> Result<()> {
    let file =
        std::fs::File::create_new(path).with_context(|| format!("creating {} (it must not exist)", path.display()))?;
    let mut out = std::io::BufWriter::new(file);
    for difference in &diff.differences {
        serde_json::to_writer(&mut out, difference)?;
        out.write_all(b"\n")?;
    }
    Ok(out.flush()?)
}
