//! Deploying operator versions into a running host.
//!
//! A [`Deployer`] is a host's side of the [registry]: it validates a new component
//! before anything is recorded (a component of our world, compiled and pre-instantiated,
//! whose `init` runs under the sandbox limits), records it, and activates it in the
//! [`ActiveVersion`] every partition follows at its next batch boundary; then it waits
//! until every running partition has switched and reports how long that took and the
//! longest a partition stood still. [`Deployer::sync`], called periodically, brings
//! this host to whatever another host or `sluice deploy` recorded.
//!
//! A trial ([`Deployer::start_trial`]) validates and records a version the same way, to
//! run beside the one in force: a shadow in the [`ShadowVersion`] every partition
//! follows, its outputs compared, never sent (see the worker's shadow) — promoting it is
//! an ordinary deploy of it —; or a canary in the [`ActiveVersion`], which takes a share
//! of the keys, by a hash of the key ([`in_canary`](super::versions::in_canary)). A deploy or a
//! rollback ends a canary; stopping a trial removes its record, and every host stops it.
//!
//! A version this host cannot run is refused here and never activated: the running one
//! keeps processing. Failures are [`DeployError`]s, so callers can tell a refused
//! component from an unreadable store. This module does not decide when a partition
//! switches (its worker does, between batches) and does not store anything itself
//! (the registry does).
//!
//! [registry]: super::registry

use super::registry::{DeployError, Deployment, MAX_COMPONENT_BYTES, Registry, Trial, TrialRecord};
use super::versions::{ActiveVersion, ShadowVersion};
use super::wasm::{Limits, WasmOperator};
use super::{BasisPoints, Shadows};
use crate::backoff::Backoff;
use crate::config::{OperatorConfig, RetryPolicy};
use crate::lock;
use crate::objects::Objects;
use crate::state::{PartitionStore, Transaction};
use crate::stats::{LiveStats, ShadowReport};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::runtime::Handle;

/// How long a deploy waits for every partition to switch before it reports the ones
/// that did not (a partition switches after the batch in hand; a stuck one is logged).
const SWITCH_TIMEOUT: Duration = Duration::from_secs(10);

/// How an operator is compiled and tried out: the job's sandbox settings.
#[derive(Debug, Clone)]
pub struct Sandbox {
    /// Limits of every call.
    pub limits: Limits,
    /// What `init` is given.
    pub config: Vec<(String, String)>,
    /// Where a throwaway database lives while a version is tried out.
    pub scratch: PathBuf,
}

impl Sandbox {
    /// The sandbox `[operator]` configures, trying versions out in `scratch`.
    pub fn new(operator: &OperatorConfig, scratch: PathBuf) -> Self {
        Sandbox {
            limits: Limits::from(operator),
            config: operator.config.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            scratch,
        }
    }

    /// This sandbox for a shadow version: each failing record is called once (no
    /// retry, no backoff on the partition's thread) and never stops the partition.
    pub fn for_shadow(&self) -> Sandbox {
        let mut sandbox = self.clone();
        sandbox.limits.retry = RetryPolicy { attempts: 1, backoff: Duration::ZERO, strict: false };
        sandbox
    }

    /// Compiles `component` as `version` (what its registry names it) from `origin` and
    /// runs its `init` once over an empty scratch database (created and removed here):
    /// the checks a version passes before it runs, after its size (at most
    /// [`MAX_COMPONENT_BYTES`]). A failure of the scratch database is
    /// this host's, not the component's.
    pub fn validate(&self, version: &str, component: &[u8], origin: &str) -> Result<WasmOperator, DeployError> {
        if component.len() as u64 > MAX_COMPONENT_BYTES {
            return Err(DeployError::Refused(anyhow::anyhow!(
                "operator {origin} takes {} bytes, more than the {MAX_COMPONENT_BYTES} a job deploys",
                component.len()
            )));
        }
        let operator = WasmOperator::compile(version, component, origin, self.limits.clone(), self.config.clone())
            .map_err(DeployError::Refused)?;
        let scratch = PartitionStore::open(&self.scratch, 0)
            .and_then(|store| Transaction::new(store, 0))
            .map_err(DeployError::Internal)?;
        let started = operator.check_init(scratch).map_err(DeployError::Refused);
        std::fs::remove_dir_all(&self.scratch)
            .with_context(|| format!("removing {}", self.scratch.display()))
            .map_err(DeployError::Internal)?;
        started.map(|()| operator)
    }
}

/// What a deploy, rollback or sync did on this host.
#[derive(Debug, Clone)]
pub struct DeployReport {
    /// The registry entry now in force.
    pub deployment: Deployment,
    /// Fetching, compiling and trying out the version (zero when it was still compiled).
    pub prepared: Duration,
    /// From activation until every running partition switched.
    pub switched: Duration,
    /// Partitions that run the version now.
    pub partitions: usize,
    /// The longest one of them stood still for the switch.
    pub worst_stall: Duration,
    /// Partitions that had not switched when the deploy stopped waiting: they refused
    /// the version (see the log) or were still busy with a batch.
    pub not_switched: Vec<u32>,
}

impl fmt::Display for DeployReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (entry {}): prepared in {:.1} ms; {} partitions switched in {:.1} ms; worst stall {} µs",
            self.deployment.version,
            self.deployment.seq,
            self.prepared.as_secs_f64() * 1e3,
            self.partitions,
            self.switched.as_secs_f64() * 1e3,
            self.worst_stall.as_micros()
        )?;
        if !self.not_switched.is_empty() {
            write!(f, "; partitions {:?} did not switch (see the host's log)", self.not_switched)?;
        }
        Ok(())
    }
}

/// What a host's shadow found ([`Deployer::shadow_status`]), as `GET
/// /operators/NAME/shadow` answers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ShadowStatus {
    /// The shadow running on the host (`version`) and the partitions' counters summed
    /// (no samples).
    pub totals: ShadowReport,
    /// Each running partition's counters and samples.
    pub partitions: BTreeMap<u32, ShadowReport>,
}

/// This host's side of an operator's registry.
pub struct Deployer {
    registry: Registry,
    sandbox: Sandbox,
    active: Arc<ActiveVersion>,
    shadow: Arc<ShadowVersion>,
    live: LiveStats,
    runtime: Handle,
    /// Serialises deploys, rollbacks and syncs on this host.
    state: Mutex<Versions>,
}

/// What this host remembers between deploys.
#[derive(Default)]
struct Versions {
    /// The version active before the current one, still compiled: a rollback to it
    /// costs no compile.
    previous: Option<Arc<WasmOperator>>,
    /// Registry entries whose version this host found invalid (it keeps the running
    /// one); a deploy of the same build again is a new entry and is tried again.
    refused: BTreeSet<u64>,
    /// Trial records this host found invalid (it runs no trial of that kind meanwhile).
    refused_trials: Vec<TrialRecord>,
}

impl Deployer {
    /// The registry of operator `name` in the store at `registry_url`, and the version
    /// a host starting with the file `configured` runs, validated: the file itself when
    /// the registry never saw it (it is recorded as a deploy), else the version the
    /// registry has in force — a restart runs what was deployed or rolled back to
    /// since. The file is validated before anything is written.
    ///
    /// A store that fails to answer is tried again, after [`Backoff`]'s waits, for up to
    /// `retry_timeout`: hosts starting at once on a new store all write the component,
    /// and a write that broke off (its connection reset) may have landed or not —
    /// [`Registry::adopt`] finds out either way, so trying it again is safe.
    pub fn starting_version(
        registry_url: &str,
        name: &str,
        sandbox: &Sandbox,
        configured: &Path,
        (runtime, retry_timeout): (&Handle, Duration),
    ) -> Result<(Registry, Arc<WasmOperator>)> {
        let bytes = std::fs::read(configured).with_context(|| format!("reading operator {}", configured.display()))?;
        let registry = Registry::new(Objects::open(registry_url)?, name)?;
        let version = runtime.block_on(registry.version_of(&bytes))?;
        let operator = sandbox.validate(&version, &bytes, &configured.display().to_string())?;
        let origin = format!("configured file {} at start", configured.display());
        let mut backoff = Backoff::new(retry_timeout);
        let current = loop {
            match runtime.block_on(registry.adopt(&bytes, &origin)) {
                Err(DeployError::StoreUnavailable(e)) => {
                    let Some(wait) = backoff.next_wait() else {
                        let tried = backoff.elapsed().as_secs();
                        return Err(e.context(format!("recording the configured operator: tried for {tried} s")));
                    };
                    tracing::warn!("recording the configured operator in the registry: {e:#}; trying again");
                    std::thread::sleep(wait);
                }
                answered => break answered?,
            }
        };
        if current.version == operator.version() {
            return Ok((registry, Arc::new(operator)));
        }
        tracing::info!(
            "running {} (registry entry {}), not the configured {}: the registry's newest deploy wins",
            current.version,
            current.seq,
            configured.display()
        );
        let bytes = runtime.block_on(registry.component(&current.version))?;
        let operator = sandbox.validate(&current.version, &bytes, &format!("version {}", current.version))?;
        Ok((registry, Arc::new(operator)))
    }

    /// A deployer for `registry` that switches `active`, the version the partitions
    /// in `live` follow, and starts and stops `shadow`, the version they run beside it.
    pub fn new(
        registry: Registry,
        sandbox: Sandbox,
        (active, shadow): (Arc<ActiveVersion>, Arc<ShadowVersion>),
        live: LiveStats,
        runtime: Handle,
    ) -> Self {
        Deployer { registry, sandbox, active, shadow, live, runtime, state: Mutex::default() }
    }

    /// The registry this host follows.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The registry's history, oldest first, and the version this host runs.
    pub fn versions(&self) -> Result<(Vec<Deployment>, String), DeployError> {
        let history = self.runtime.block_on(self.registry.history())?;
        Ok((history, self.active.get().1.version().to_string()))
    }

    /// Validates `component`, records it as the newest version and switches every
    /// partition to it. An invalid component is refused and nothing changes.
    pub fn deploy(&self, component: &[u8], origin: &str) -> Result<DeployReport, DeployError> {
        let mut versions = lock(&self.state);
        let began = Instant::now();
        let version = self.runtime.block_on(self.registry.version_of(component))?;
        let operator = self.sandbox.validate(&version, component, origin)?;
        let prepared = began.elapsed();
        // Ends a canary first (see `Registry::deploy`), as the activation does here.
        let deployment = self.runtime.block_on(self.registry.deploy(component, origin))?;
        Ok(self.activate(&mut versions, Arc::new(operator), deployment, prepared))
    }

    /// Validates the version before the newest deploy still in force, records a
    /// rollback to it and switches every partition to it. While a canary runs, a
    /// rollback ends the canary instead: every key returns to the version in force.
    pub fn rollback(&self, origin: &str) -> Result<DeployReport, DeployError> {
        let mut versions = lock(&self.state);
        let began = Instant::now();
        if let Some(canary) = self.runtime.block_on(self.registry.stop_trial(Trial::Canary))? {
            self.active.set_canary(None);
            tracing::info!("canary {} ended by a rollback", canary.version);
            let current = self.runtime.block_on(self.registry.current())?;
            let deployment = current.ok_or_else(|| no_trial(&self.registry, Trial::Canary))?;
            let partitions = lock(&self.live).len();
            let (prepared, switched, worst_stall) = (began.elapsed(), Duration::ZERO, Duration::ZERO);
            return Ok(DeployReport {
                deployment,
                prepared,
                switched,
                partitions,
                worst_stall,
                not_switched: Vec::new(),
            });
        }
        let target = self.runtime.block_on(self.registry.rollback_target())?;
        let operator = self.prepare(&mut versions, &target)?;
        let deployment = match self.runtime.block_on(self.registry.rollback(&target, origin)) {
            Ok(deployment) => deployment,
            Err(e) => {
                versions.previous = Some(operator);
                return Err(e);
            }
        };
        Ok(self.activate(&mut versions, operator, deployment, began.elapsed()))
    }

    /// Validates `component`, records it as the operator's `trial` — a shadow, or a
    /// canary taking `share` of the keys — and starts it beside the version in force on
    /// this host's partitions, from their next batch (the other hosts follow through the
    /// registry). An invalid component is refused and nothing changes.
    pub fn start_trial(
        &self,
        trial: Trial,
        component: &[u8],
        share: Option<BasisPoints>,
        origin: &str,
    ) -> Result<TrialRecord, DeployError> {
        let mut versions = lock(&self.state);
        let version = self.runtime.block_on(self.registry.version_of(component))?;
        let operator = self.sandbox_for(trial).validate(&version, component, origin)?;
        let record = self.runtime.block_on(self.registry.start_trial(trial, component, share, origin))?;
        versions.refused_trials.retain(|refused| refused.version != record.version);
        self.run_trial(trial, Some((Arc::new(operator), share)));
        tracing::info!("{} {} started{} ({origin})", trial.name(), record.version, shown_share(share));
        Ok(record)
    }

    /// Stops the operator's `trial` on every host; returns the one that ran.
    pub fn stop_trial(&self, trial: Trial) -> Result<TrialRecord, DeployError> {
        let _versions = lock(&self.state);
        let stopped = self.runtime.block_on(self.registry.stop_trial(trial))?;
        self.run_trial(trial, None);
        let stopped = stopped.ok_or_else(|| no_trial(&self.registry, trial))?;
        tracing::info!("{} {} stopped", trial.name(), stopped.version);
        Ok(stopped)
    }

    /// Deploys the operator's shadow as the version in force (an ordinary deploy) and
    /// stops it as a shadow.
    pub fn promote_shadow(&self, origin: &str) -> Result<DeployReport, DeployError> {
        let shadow = self.runtime.block_on(self.registry.trial(Trial::Shadow))?;
        let shadow = shadow.ok_or_else(|| no_trial(&self.registry, Trial::Shadow))?;
        let component = self.runtime.block_on(self.registry.component(&shadow.version))?;
        // Not compared with itself while the partitions switch; a deploy that fails
        // leaves the record, which the next sync starts again.
        self.shadow.stop();
        let report = self.deploy(&component, origin)?;
        // The deploy stands: a record left behind is a warning, and `shadow stop` ends it.
        if let Err(e) = self.runtime.block_on(self.registry.stop_trial(Trial::Shadow)) {
            tracing::warn!("deployed the shadow {}, but could not remove its record: {e:#}", shadow.version);
        }
        Ok(report)
    }

    /// The sandbox a `trial` runs in: a shadow's never retries nor stops a partition.
    fn sandbox_for(&self, trial: Trial) -> Sandbox {
        match trial {
            Trial::Shadow => self.sandbox.for_shadow(),
            Trial::Canary => self.sandbox.clone(),
        }
    }

    /// Runs `running` (a version, with a canary's share) as this host's `trial`; `None`
    /// stops it.
    fn run_trial(&self, trial: Trial, running: Option<(Arc<WasmOperator>, Option<BasisPoints>)>) {
        match (trial, running) {
            (Trial::Shadow, Some((operator, _))) => self.shadow.start(operator),
            (Trial::Shadow, None) => self.shadow.stop(),
            (Trial::Canary, running) => {
                self.active.set_canary(running.map(|(operator, share)| (operator, share.unwrap_or(0))))
            }
        }
    }

    /// The version this host runs as its `trial`, with a canary's share.
    fn running_trial(&self, trial: Trial) -> Option<(String, Option<BasisPoints>)> {
        match trial {
            Trial::Shadow => self.shadow.version().map(|version| (version, None)),
            Trial::Canary => {
                self.active.canary().map(|(operator, share)| (operator.version().to_string(), Some(share)))
            }
        }
    }

    /// What the shadow found on this host's running partitions.
    pub fn shadow_status(&self) -> ShadowStatus {
        let partitions: BTreeMap<u32, ShadowReport> =
            lock(&self.live).iter().map(|(p, stats)| (*p, stats.shadow.report())).collect();
        let mut totals = ShadowReport { version: self.shadow.version(), ..ShadowReport::default() };
        partitions.values().for_each(|report| totals.add(report));
        ShadowStatus { totals, partitions }
    }

    /// Brings this host to the version the registry has in force, if it runs another
    /// one (a deploy or rollback recorded elsewhere), and to the shadow it records. A
    /// version that does not validate here is refused with an error, once per registry
    /// entry (or shadow record), and the running one stays (no shadow runs); a failure
    /// to read the store is an error and is tried again next time.
    pub fn sync(&self) -> Result<Option<DeployReport>> {
        // Each whatever the other's failure: a broken shadow record must not hold deploys.
        let deployed = self.sync_version();
        let tried = self.sync_trials();
        let report = deployed?;
        tried?;
        Ok(report)
    }

    /// The version half of [`sync`](Deployer::sync).
    fn sync_version(&self) -> Result<Option<DeployReport>> {
        let mut versions = lock(&self.state);
        let Some(current) = self.runtime.block_on(self.registry.current())? else { return Ok(None) };
        if current.version == self.active.get().1.version() || versions.refused.contains(&current.seq) {
            return Ok(None);
        }
        let began = Instant::now();
        match self.prepare(&mut versions, &current) {
            Ok(operator) => Ok(Some(self.activate(&mut versions, operator, current, began.elapsed()))),
            Err(DeployError::Refused(e)) => {
                versions.refused.insert(current.seq);
                Err(e.context(format!(
                    "refused version {} (entry {}); the running version stays",
                    current.version, current.seq
                )))
            }
            // The store or this host failed, not the version: worth trying again.
            Err(e) => Err(e.into()),
        }
    }

    /// Starts, replaces or stops this host's shadow and canary as the registry records
    /// them (a job calls it before its partitions start, so recorded trials see every
    /// record).
    pub fn sync_trials(&self) -> Result<()> {
        let shadowed = self.sync_trial(Trial::Shadow);
        self.sync_trial(Trial::Canary)?;
        shadowed
    }

    /// Brings this host's `trial` to what the registry records.
    fn sync_trial(&self, trial: Trial) -> Result<()> {
        let mut versions = lock(&self.state);
        let recorded = self.runtime.block_on(self.registry.trial(trial))?;
        let running = self.running_trial(trial);
        let Some(record) = recorded else {
            if let Some((running, _)) = running {
                tracing::info!("{} {running} stopped (recorded elsewhere)", trial.name());
                self.run_trial(trial, None);
            }
            return Ok(());
        };
        if running == Some((record.version.clone(), record.share)) || versions.refused_trials.contains(&record) {
            return Ok(());
        }
        // A canary whose share changed keeps its compiled version.
        if let (Trial::Canary, Some((operator, _))) = (trial, self.active.canary())
            && operator.version() == record.version
        {
            self.run_trial(trial, Some((operator, record.share)));
            return Ok(());
        }
        let bytes = self.runtime.block_on(self.registry.component(&record.version))?;
        let origin = format!("{} {}", trial.name(), record.version);
        match self.sandbox_for(trial).validate(&record.version, &bytes, &origin) {
            Ok(operator) => {
                let (name, share) = (trial.name(), shown_share(record.share));
                tracing::info!("{name} {}{share} started (recorded elsewhere: {})", record.version, record.origin);
                self.run_trial(trial, Some((Arc::new(operator), record.share)));
                Ok(())
            }
            Err(DeployError::Refused(e)) => {
                self.run_trial(trial, None);
                versions.refused_trials.push(record.clone());
                Err(e.context(format!("refused {} {}; none runs here", trial.name(), record.version)))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// `deployment`'s version, ready to activate: still compiled if it ran just
    /// before, else fetched and validated.
    fn prepare(&self, versions: &mut Versions, deployment: &Deployment) -> Result<Arc<WasmOperator>, DeployError> {
        if let Some(previous) = versions.previous.take_if(|p| p.version() == deployment.version) {
            return Ok(previous);
        }
        let bytes = self.runtime.block_on(self.registry.component(&deployment.version))?;
        let origin = format!("version {}", deployment.version);
        Ok(Arc::new(self.sandbox.validate(&deployment.version, &bytes, &origin)?))
    }

    /// Makes `operator` active, waits for the partitions to switch, and reports.
    fn activate(
        &self,
        versions: &mut Versions,
        operator: Arc<WasmOperator>,
        deployment: Deployment,
        prepared: Duration,
    ) -> DeployReport {
        let began = Instant::now();
        let (_, before) = self.active.get();
        // A partition's stall counts for this deploy only if it switches now.
        let switches_before: BTreeMap<u32, u64> =
            lock(&self.live).iter().map(|(p, stats)| (*p, stats.switches.load(Ordering::Relaxed))).collect();
        self.active.activate(operator);
        if before.version() != deployment.version {
            versions.previous = Some(before);
        }
        let (partitions, worst_stall, not_switched) = self.wait_switched(&deployment.version, &switches_before);
        let report =
            DeployReport { deployment, prepared, switched: began.elapsed(), partitions, worst_stall, not_switched };
        tracing::info!("deployed {report}");
        report
    }

    /// Waits until every running partition runs `version` or refused it, up to
    /// [`SWITCH_TIMEOUT`]; returns how many run it, the longest stall of those that
    /// switched since `switches_before` was counted, and the ones that do not run it.
    fn wait_switched(&self, version: &str, switches_before: &BTreeMap<u32, u64>) -> (usize, Duration, Vec<u32>) {
        let deadline = Instant::now() + SWITCH_TIMEOUT;
        loop {
            let (mut running, mut worst, mut behind, mut busy) = (0, 0, Vec::new(), false);
            for (partition, stats) in lock(&self.live).iter() {
                if *lock(&stats.version) == version {
                    running += 1;
                    if stats.switches.load(Ordering::Relaxed) > switches_before.get(partition).copied().unwrap_or(0) {
                        worst = worst.max(stats.last_switch_stall_us.load(Ordering::Relaxed));
                    }
                    continue;
                }
                let refused = lock(&stats.refused);
                busy |= refused.as_ref().is_none_or(|(v, _)| v != version);
                behind.push(*partition);
            }
            if !busy || Instant::now() >= deadline {
                return (running, Duration::from_micros(worst), behind);
            }
            // Coarse enough not to take a core from the partitions that are switching.
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Calls [`sync`](Deployer::sync) every `interval` until `done` returns true,
    /// logging what it does; an error is logged once until it changes.
    pub fn follow(&self, interval: Duration, done: impl Fn() -> bool) {
        let mut last_error = None;
        while !done() {
            match self.sync() {
                Ok(_) => last_error = None,
                Err(e) => {
                    let message = format!("{e:#}");
                    if last_error.as_ref() != Some(&message) {
                        tracing::error!("following deploys of {}: {message}", self.registry.name());
                        last_error = Some(message);
                    }
                }
            }
            let slept = Instant::now();
            while slept.elapsed() < interval && !done() {
                std::thread::sleep(interval.min(Duration::from_millis(50)));
            }
        }
    }
}

/// The error of a trial's command while none runs.
fn no_trial(registry: &Registry, trial: Trial) -> DeployError {
    DeployError::Conflict(format!("operator {} runs no {}", registry.name(), trial.name()))
}

/// A canary's share as a log line says it: ` (5.00% of the keys)`; nothing for a shadow.
fn shown_share(share: Option<BasisPoints>) -> String {
    share.map_or(String::new(), |share| format!(" ({:.2}% of the keys)", f64::from(share) / 100.0))
}

/// Refuses an operator `name` that is not the one this host runs.
pub fn check_name(registry: &Registry, name: &str) -> Result<(), DeployError> {
    if registry.name() != name {
        return Err(DeployError::UnknownOperator { runs: registry.name().to_string(), asked: name.to_string() });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::PartitionStats;

    #[test]
    fn a_deploy_stops_waiting_for_a_partition_that_refused_the_version() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let runtime = crate::objects::runtime()?;
        let store = Objects::open(dir.path().join("store").to_str().expect("UTF-8 temp path"))?;
        let limits = Limits::default();
        let probe = Arc::new(WasmOperator::load(&sluice_e2e::operator_wasm("probe"), limits.clone(), Vec::new())?);
        let sandbox = Sandbox { limits, config: Vec::new(), scratch: dir.path().join("scratch") };
        let live = LiveStats::default();
        let partition = |version: &str, switches: u64, refused: Option<&str>| {
            let stats = PartitionStats::new(0, 0, version);
            *lock(&stats.refused) = refused.map(|v| (v.to_string(), "init failed".to_string()));
            stats.switches.store(switches, Ordering::Relaxed);
            stats.last_switch_stall_us.store(100 * (switches + 1), Ordering::Relaxed);
            Arc::new(stats)
        };
        live.lock().unwrap().extend([
            (0, partition("new", 1, None)),        // switched in this deploy: its stall counts
            (1, partition("new", 0, None)),        // already ran it: its old stall does not
            (2, partition("old", 0, Some("new"))), // refused it
        ]);
        let deployer = Deployer::new(
            Registry::new(store, "probe")?,
            sandbox,
            (ActiveVersion::new(probe), Arc::default()),
            live,
            runtime.handle().clone(),
        );
        let before = BTreeMap::from([(0, 0), (1, 0), (2, 0)]);
        let started = Instant::now();
        let (running, worst, behind) = deployer.wait_switched("new", &before);
        assert!(started.elapsed() < SWITCH_TIMEOUT / 2, "did not wait for the refusal");
        assert_eq!((running, worst, behind), (2, Duration::from_micros(200), vec![2]));
        Ok(())
    }

    #[test]
    fn a_component_larger_than_a_job_deploys_is_refused_before_it_is_compiled() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let sandbox = Sandbox { limits: Limits::default(), config: Vec::new(), scratch: dir.path().join("scratch") };
        // Zeroed pages the allocator maps lazily: the test costs no memory.
        let huge = vec![0u8; MAX_COMPONENT_BYTES as usize + 1];
        let refused = sandbox.validate("op@0", &huge, "huge.wasm").err().expect("refused");
        assert!(matches!(refused, DeployError::Refused(_)), "{refused:?}");
        assert!(refused.to_string().contains("huge.wasm takes 268435457 bytes"), "{refused}");
    }
}
