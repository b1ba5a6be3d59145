//! `sluice deploy` (with `--shadow` too), `rollback`, `versions` and `shadow`: an
//! operator's versions, reached through a running host's admin API or directly in the
//! job's registry (a shadow's findings only through the hosts that run it).
//!
//! With `--admin` the host validates, records and switches, and this module prints its
//! answer; with `--config` this module opens the job's registry itself, tries the
//! version out in a sandbox of the job's settings in a private scratch directory, and
//! records it, and running hosts switch within `poll_versions`. It owns that choice
//! ([`Job`]) and the commands' words; it does not own validation, the registry's
//! records or the switch, which are the library's (`sluice::operator`), nor the admin
//! API (`sluice::admin`).

use super::args::JobTarget;
use anyhow::{Context, Result, bail};
use hyper::Method;
use sluice::admin::{self, DeployAnswer, VersionsAnswer};
use sluice::config::Config;
use sluice::objects::{self, Objects};
use sluice::operator::deploy::ShadowStatus;
use sluice::operator::deploy::{self, Sandbox};
use sluice::operator::parse_share;
use sluice::operator::registry::{self, Deployment, Registry, Trial, TrialRecord};
use sluice::stats::ShadowReport;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

/// `sluice deploy`
pub fn deploy_version(name: &str, file: &Path, job: JobTarget) -> Result<()> {
    let mut out = std::io::stdout().lock();
    let component = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    let summary = match job.open(name)? {
        Job::Admin(admin) => {
            let path = format!("/operators/{name}/versions");
            admin_answer(&admin::call(&admin, Method::POST, &path, component)?)?
        }
        Job::Registry { registry, sandbox, poll_versions, .. } => {
            let runtime = objects::runtime()?;
            let version = runtime.block_on(registry.version_of(&component))?;
            sandbox.validate(&version, &component, &file.display().to_string())?;
            let origin = format!("sluice deploy {}", file.display());
            let deployment = runtime.block_on(registry.deploy(&component, &origin))?;
            recorded(&deployment, poll_versions)
        }
    };
    writeln!(out, "deployed {summary}")?;
    Ok(())
}

/// `sluice deploy --shadow` and `--canary SHARE`: `file` run as the operator's `trial`
/// (a canary taking `share` of the keys).
pub fn start_trial(name: &str, file: &Path, job: JobTarget, trial: Trial, share: Option<&str>) -> Result<()> {
    let mut out = std::io::stdout().lock();
    let component = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    let share = share.map(parse_share).transpose()?;
    let (record, note) = match job.open(name)? {
        Job::Admin(admin) => {
            let path = match share {
                Some(share) => format!("/operators/{name}/canary:{}", f64::from(share) / 100.0),
                None => format!("/operators/{name}/shadow"),
            };
            let answer = admin::call(&admin, Method::POST, &path, component)?;
            let record =
                serde_json::from_str::<TrialRecord>(&answer).with_context(|| format!("the answer of {admin}"))?;
            (record, "this host runs it from its partitions' next batch; the others follow".to_string())
        }
        Job::Registry { registry, sandbox, poll_versions, .. } => {
            let runtime = objects::runtime()?;
            let version = runtime.block_on(registry.version_of(&component))?;
            sandbox.validate(&version, &component, &file.display().to_string())?;
            let origin = format!("sluice deploy --{} {}", trial.name(), file.display());
            let record = runtime.block_on(registry.start_trial(trial, &component, share, &origin))?;
            (record, format!("running hosts start it within {}", humantime::format_duration(poll_versions)))
        }
    };
    let share =
        record.share.map_or(String::new(), |share| format!(" for {:.2}% of the keys", f64::from(share) / 100.0));
    writeln!(out, "{} {}{share} recorded; {note}", trial.name(), record.version)?;
    Ok(())
}

/// `sluice shadow promote`
pub fn promote_shadow(name: &str, job: JobTarget) -> Result<()> {
    let mut out = std::io::stdout().lock();
    let summary = match job.open(name)? {
        Job::Admin(admin) => {
            let path = format!("/operators/{name}/promote");
            admin_answer(&admin::call(&admin, Method::POST, &path, Vec::new())?)?
        }
        Job::Registry { registry, sandbox, poll_versions, .. } => {
            let runtime = objects::runtime()?;
            let shadow = runtime.block_on(registry.trial(Trial::Shadow))?;
            let shadow = shadow.with_context(|| format!("operator {name} runs no shadow"))?;
            let component = runtime.block_on(registry.component(&shadow.version))?;
            sandbox.validate(&shadow.version, &component, &format!("shadow {}", shadow.version))?;
            let deployed = runtime.block_on(registry.deploy(&component, "sluice shadow promote"));
            // A shadow of the version in force has nothing to promote: it ends all the same.
            if deployed.is_ok() || matches!(deployed, Err(registry::DeployError::AlreadyInForce { .. })) {
                runtime.block_on(registry.stop_trial(Trial::Shadow))?;
            }
            recorded(&deployed?, poll_versions)
        }
    };
    writeln!(out, "promoted the shadow: deployed {summary}")?;
    Ok(())
}

/// `sluice shadow stop`
pub fn stop_shadow(name: &str, job: JobTarget) -> Result<()> {
    let mut out = std::io::stdout().lock();
    let stopped = match job.open(name)? {
        Job::Admin(admin) => {
            let answer = admin::call(&admin, Method::DELETE, &format!("/operators/{name}/shadow"), Vec::new())?;
            serde_json::from_str::<TrialRecord>(&answer).with_context(|| format!("the answer of {admin}"))?
        }
        Job::Registry { registry, .. } => objects::runtime()?
            .block_on(registry.stop_trial(Trial::Shadow))?
            .with_context(|| format!("operator {name} runs no shadow"))?,
    };
    writeln!(out, "stopped the shadow {}", stopped.version)?;
    Ok(())
}

/// `sluice shadow status`
pub fn shadow_status(name: &str, admins: &[String]) -> Result<()> {
    let mut out = std::io::stdout().lock();
    let mut all = ShadowReport::default();
    writeln!(
        out,
        "host                  partition  compared      equal  different  only-live  only-shadow  shadow-failed  \
         writes-differ  skipped  cpu-ratio  version"
    )?;
    for admin in admins {
        let answer = admin::call(admin, Method::GET, &format!("/operators/{name}/shadow"), Vec::new())?;
        let status: ShadowStatus = serde_json::from_str(&answer).with_context(|| format!("the answer of {admin}"))?;
        for (partition, report) in &status.partitions {
            writeln!(out, "{}", status_row(admin, &partition.to_string(), report))?;
        }
        all.version = all.version.or(status.totals.version.clone());
        all.add(&status.totals);
        for (partition, report) in &status.partitions {
            if let Some(stopped) = &report.stopped {
                writeln!(out, "  partition {partition}: the shadow stopped here: {stopped}")?;
            }
            for sample in &report.samples {
                writeln!(out, "  partition {partition} {}", sample.describe())?;
            }
        }
    }
    writeln!(out, "{}", status_row("all", "", &all))?;
    Ok(())
}

/// One row of `sluice shadow status`.
fn status_row(host: &str, partition: &str, r: &ShadowReport) -> String {
    let ratio = r.cpu_ratio().map_or("-".to_string(), |ratio| format!("{ratio:.2}"));
    format!(
        "{host:<20}  {partition:>9}  {:>8}  {:>9}  {:>9}  {:>9}  {:>11}  {:>13}  {:>13}  {:>7}  {ratio:>9}  {}",
        r.compared,
        r.equal,
        r.different,
        r.only_live,
        r.only_shadow,
        r.shadow_failed,
        r.differing_writes,
        r.skipped,
        r.version.as_deref().unwrap_or("none")
    )
}

/// `sluice rollback`
pub fn roll_back(name: &str, job: JobTarget) -> Result<()> {
    let mut out = std::io::stdout().lock();
    let summary = match job.open(name)? {
        Job::Admin(admin) => {
            let path = format!("/operators/{name}/rollback");
            admin_answer(&admin::call(&admin, Method::POST, &path, Vec::new())?)?
        }
        Job::Registry { registry, sandbox, poll_versions, .. } => {
            let runtime = objects::runtime()?;
            // While a canary runs, a rollback ends it: every key returns to the version in force.
            if let Some(canary) = runtime.block_on(registry.stop_trial(Trial::Canary))? {
                writeln!(
                    out,
                    "ended the canary {}; running hosts return its keys within {}",
                    canary.version,
                    humantime::format_duration(poll_versions)
                )?;
                return Ok(());
            }
            let target = runtime.block_on(registry.rollback_target())?;
            let component = runtime.block_on(registry.component(&target.version))?;
            sandbox.validate(&target.version, &component, &format!("version {}", target.version))?;
            let deployment = runtime.block_on(registry.rollback(&target, "sluice rollback"))?;
            recorded(&deployment, poll_versions)
        }
    };
    writeln!(out, "rolled back to {summary}")?;
    Ok(())
}

/// `sluice versions`
pub fn versions(name: &str, job: JobTarget) -> Result<()> {
    let mut out = std::io::stdout().lock();
    let (history, running) = match job.open(name)? {
        Job::Admin(admin) => {
            let path = format!("/operators/{name}/versions");
            let answer: VersionsAnswer = serde_json::from_str(&admin::call(&admin, Method::GET, &path, Vec::new())?)?;
            (answer.history, Some(answer.running))
        }
        Job::Registry { registry, .. } => (objects::runtime()?.block_on(registry.history())?, None),
    };
    if history.is_empty() {
        bail!("operator {name} has no deployed versions yet (a job records its first when it starts)");
    }
    let current = registry::in_force(&history).last().map(|d| d.seq);
    writeln!(out, "  entry  recorded at               action    version                         origin")?;
    for deployment in &history {
        let mark = if Some(deployment.seq) == current { '*' } else { ' ' };
        writeln!(out, "{mark} {deployment}")?;
    }
    if let Some(running) = running {
        writeln!(out, "this host runs {running}")?;
    }
    Ok(())
}

/// What `sluice deploy` and `rollback` say after recording `deployment` in a registry.
fn recorded(deployment: &Deployment, poll_versions: Duration) -> String {
    format!(
        "{} recorded as entry {}; running hosts switch to it within {}",
        deployment.version,
        deployment.seq,
        humantime::format_duration(poll_versions)
    )
}

/// The summary of a host's answer to a deploy or rollback; an error if some of its
/// partitions did not switch.
fn admin_answer(json: &str) -> Result<String> {
    let answer: DeployAnswer = serde_json::from_str(json)?;
    if !answer.not_switched.is_empty() {
        bail!("{}", answer.summary);
    }
    Ok(answer.summary)
}

/// A job, as `sluice deploy`, `rollback` and `versions` reach it.
enum Job {
    /// Its registry, read and written directly, and how its hosts try a version out: in
    /// a directory of this process's own, removed with it.
    Registry { registry: Registry, sandbox: Box<Sandbox>, poll_versions: Duration, _scratch: tempfile::TempDir },
    /// A running host's admin API.
    Admin(String),
}

impl JobTarget {
    /// Opens the job that runs operator `name`.
    fn open(self, name: &str) -> Result<Job> {
        let (Some(path), None) = (&self.config, &self.admin) else {
            return Ok(Job::Admin(self.admin.expect("clap requires --config or --admin")));
        };
        let config = Config::load(path)?;
        let registry = Registry::new(Objects::open(&config.registry_url())?, &config.operator.name())?;
        deploy::check_name(&registry, name).with_context(|| format!("config file {}", path.display()))?;
        // Created afresh, private (mode 0700), under a random name: a predictable path in a
        // shared temporary directory could be another user's link to elsewhere.
        let scratch = tempfile::Builder::new()
            .prefix("sluice-deploy-")
            .tempdir()
            .context("creating a private directory to try the version out in")?;
        let sandbox = Box::new(Sandbox::new(&config.operator, scratch.path().join("state")));
        Ok(Job::Registry { registry, sandbox, poll_versions: config.operator.poll_versions, _scratch: scratch })
    }
}
