//! `sluice test`: one operator component run over the records of a JSONL file in the
//! host's sandbox, over fresh or given state, and what it emits compared with what is
//! expected.
//!
//! This module owns the command's side: the job file and flags made into a driver, the
//! expected lines read, the differences and the summary printed, and the error that
//! makes the exit code 1. It does not own the run itself or how a difference is found
//! and worded: those are [`TestDriver`](sluice::test_driver::TestDriver)'s, which the
//! `sluice-test` kit shares.

use super::args::TestArgs;
use anyhow::{Context, Result, bail};
use sluice::config::{self, Config};
use sluice::operator::deploy::Sandbox;
use sluice::test_driver::{self, TestDriver};
use std::io::Write;
use std::path::{Path, PathBuf};

/// `sluice test`
pub fn test_operator(args: &TestArgs) -> Result<()> {
    let started = std::time::Instant::now();
    let mut driver = TestDriver::builder(&args.operator);
    if let Some(path) = &args.job {
        let job = Config::load(path)?;
        let sandbox = Sandbox::new(&job.operator, PathBuf::new());
        driver = driver.limits(sandbox.limits).ttl(job.ttl);
        for (name, value) in &sandbox.config {
            driver = driver.config(name, value);
        }
    }
    for pair in &args.config {
        let (name, value) = pair.split_once('=').with_context(|| format!("--config {pair:?}: expected NAME=VALUE"))?;
        driver = driver.config(name, value);
    }
    if let Some(ttl) = args.ttl {
        driver = driver.ttl(config::TtlConfig { default: Some(ttl), ..config::TtlConfig::default() });
    }
    let mut driver = driver.build()?;
    if let Some(state) = &args.state {
        driver.load_state(state)?;
    }
    let (step, records) = driver.process_file(&args.input, &args.key_field, &args.timestamp_field, args.advance_to)?;
    let mut out = std::io::stdout().lock();
    let mut differences = Vec::new();
    match &args.expect {
        Some(path) => differences.extend(test_driver::differences("output", &read_lines(path)?, &step.outputs)),
        None => step.outputs.iter().try_for_each(|line| writeln!(out, "{line}"))?,
    }
    match (&args.expect_dead_letters, &args.expect) {
        (Some(path), _) => {
            differences.extend(test_driver::differences("dead letter", &read_lines(path)?, &step.dead_letters))
        }
        (None, Some(_)) => differences.extend(test_driver::differences("dead letter", &[], &step.dead_letters)),
        (None, None) => step.dead_letters.iter().try_for_each(|line| writeln!(out, "{line}"))?,
    }
    if args.show_state {
        driver.state()?.iter().try_for_each(|line| writeln!(out, "{line}"))?;
    }
    for difference in &differences {
        eprintln!("{difference}");
    }
    if !differences.is_empty() {
        bail!("{}: {} difference(s) from the expected lines", args.operator.display(), differences.len());
    }
    eprintln!(
        "{}: {records} records, {} outputs, {} dead letters{} in {:.0} ms",
        driver.version(),
        step.outputs.len(),
        step.dead_letters.len(),
        if args.expect.is_some() { ", as expected," } else { "" },
        started.elapsed().as_secs_f64() * 1e3
    );
    Ok(())
}

/// The JSON lines of the file at `path`, blank lines skipped.
fn read_lines(path: &Path) -> Result<Vec<serde_json::Value>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let lines = text.lines().enumerate().filter(|(_, line)| !line.trim().is_empty());
    lines
        .map(|(i, line)| {
            serde_json::from_str(line).with_context(|| format!("{} line {}: not JSON", path.display(), i + 1))
        })
        .collect()
}
