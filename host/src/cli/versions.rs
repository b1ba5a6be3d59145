//! `sluice deploy`, `rollback` and `versions`: an operator's versions, reached through a
//! running host's admin API or directly in the job's registry.
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
use sluice::operator::deploy::{self, Sandbox};
use sluice::operator::registry::{self, Deployment, Registry};
use std::path::Path;
use std::time::Duration;

/// `sluice deploy`
pub fn deploy_version(name: &str, file: &Path, job: JobTarget) -> Result<()> {
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
    println!("deployed {summary}");
    Ok(())
}

/// `sluice rollback`
pub fn roll_back(name: &str, job: JobTarget) -> Result<()> {
    let summary = match job.open(name)? {
        Job::Admin(admin) => {
            let path = format!("/operators/{name}/rollback");
            admin_answer(&admin::call(&admin, Method::POST, &path, Vec::new())?)?
        }
        Job::Registry { registry, sandbox, poll_versions, .. } => {
            let runtime = objects::runtime()?;
            let target = runtime.block_on(registry.rollback_target())?;
            let component = runtime.block_on(registry.component(&target.version))?;
            sandbox.validate(&target.version, &component, &format!("version {}", target.version))?;
            let deployment = runtime.block_on(registry.rollback(&target, "sluice rollback"))?;
            recorded(&deployment, poll_versions)
        }
    };
    println!("rolled back to {summary}");
    Ok(())
}

/// `sluice versions`
pub fn versions(name: &str, job: JobTarget) -> Result<()> {
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
    println!("  entry  recorded at               action    version                         origin");
    for deployment in &history {
        let mark = if Some(deployment.seq) == current { '*' } else { ' ' };
        println!("{mark} {deployment}");
    }
    if let Some(running) = running {
        println!("this host runs {running}");
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
