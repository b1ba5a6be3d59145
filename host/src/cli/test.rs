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
use sluice::config::{self, Config, OperatorConfig};
use sluice::operator::deploy::Sandbox;
use sluice::operator::wasm::keep_compiled;
use sluice::test_driver::{self, TestDriver};
use std::io::Write;
use std::path::{Path, PathBuf};

/// `sluice test`
pub fn test_operator(args: &TestArgs) -> Result<()> {
    let started = std::time::Instant::now();
    let job = args.job.as_deref().map(Config::load).transpose()?;
    if let Some(dir) = compiled_cache(args) {
        // A job's `[operator] compiled_cache_mib` bounds it, as in that job.
        let mib = job.as_ref().map_or_else(
            || OperatorConfig::for_path(&args.operator).compiled_cache_mib,
            |job| job.operator.compiled_cache_mib,
        );
        keep_compiled(&dir, mib << 20)?;
    }
    let mut driver = TestDriver::builder(&args.operator);
    if let Some(job) = job {
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

/// Where this run keeps compiled components: `--compiled-cache`, else the user's cache
/// directory (`$XDG_CACHE_HOME`, else `$HOME/.cache`); none with `--no-compiled-cache` or
/// without either variable.
fn compiled_cache(args: &TestArgs) -> Option<PathBuf> {
    if args.no_compiled_cache {
        return None;
    }
    let user_cache = || {
        let non_empty = |name| std::env::var_os(name).filter(|value| !value.is_empty()).map(PathBuf::from);
        non_empty("XDG_CACHE_HOME").or_else(|| non_empty("HOME").map(|home| home.join(".cache")))
    };
    args.compiled_cache.clone().or_else(|| Some(user_cache()?.join("sluice").join("compiled")))
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
