//! The deployed versions of an operator, persisted in the job's store.
//!
//! Every host of a job reads the same store, so the store is where a deploy is
//! recorded and where every host learns of it: no cluster protocol of our own. The
//! history is an append-only list of numbered entries, each written with a
//! conditional put, so two deploys racing for one number cannot both win; components
//! are stored by the digest their version names, and never overwritten.
//!
//! ```text
//! <store>/operators/<name>/components/<digest>.wasm    each deployed build, once
//! <store>/operators/<name>/history/0000000003.json     entry 3: deploy or rollback
//! <store>/operators/<name>/shadow.json                  the version running as a shadow, if any
//! <store>/operators/<name>/canary.json                  the canary and its share of the keys, if any
//! <store>/operators/<name>/switches/partition-0001/00000000000000001500.json
//!                                                      partition 1 ran a version from offset 1500 on
//! ```
//!
//! A digest is a SHA-256 (64 hex digits); a build recorded before versions were named
//! by SHA-256 keeps its CRC-64 name (16 hex digits) for as long as its bytes are stored
//! under it, so histories written then stay readable and a redeploy of such a build is
//! still the same version ([`Registry::version_of`]).
//!
//! A deploy pushes a version, a rollback pops back to the one before it; the running
//! version is the top of that stack. Each partition also records the offsets where it
//! changed versions ([`Registry::record_switch`]), so that a replay of its records
//! processes each with the version that first did ([`switches`](super::versions::switches)). This module owns the layout and the history's
//! meaning; it does not validate components (the [deployer](super::deploy) does before
//! it records anything) and does not run them.
//!
//! Its errors are [`DeployError`]s, the kinds a caller of a deploy branches on: the
//! admin API answers each with its own status, and a host following the registry
//! refuses an invalid version for good but tries an unreadable store again.

use crate::checksum;
use crate::lock;
use crate::objects::{MAX_RECORD_BYTES, Objects};
use anyhow::{Context, Result, anyhow, bail};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

/// Why a deploy, a rollback or a look at an operator's versions failed.
///
/// Typed where callers branch (the admin API's status codes, whether a host tries
/// again); the reason inside stays an [`anyhow::Error`] chain for people to read.
#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    /// The component cannot run here: not a component of our world, or its `init`
    /// failed under the sandbox limits. Nothing was recorded; deploying the same build
    /// again fails the same way.
    #[error(transparent)]
    Refused(anyhow::Error),
    /// The request names an operator this job does not run.
    #[error("this job runs operator `{runs}`, not `{asked}`")]
    UnknownOperator {
        /// The operator the job runs.
        runs: String,
        /// The one the request named.
        asked: String,
    },
    /// The version deployed is the one in force already.
    #[error("{version} is already the version in force (entry {seq})")]
    AlreadyInForce {
        /// The version.
        version: String,
        /// The registry entry that put it in force.
        seq: u64,
    },
    /// A rollback with no earlier version to return to.
    #[error("{0}")]
    NothingToRollBack(String),
    /// Other writers changed the history while this request was recorded; trying
    /// again decides afresh.
    #[error("{0}")]
    Conflict(String),
    /// The store holding the registry could not be read or written, or holds a
    /// damaged record; nothing was recorded, and the same request may succeed later.
    #[error(transparent)]
    StoreUnavailable(anyhow::Error),
    /// This host failed on its side (its scratch space for trying a version out).
    #[error(transparent)]
    Internal(anyhow::Error),
}

/// What a history entry did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Made a version the running one.
    Deploy,
    /// Returned to the version that ran before the latest deploy still in force.
    Rollback,
}

/// One entry of an operator's history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Deployment {
    /// Increases by one per entry, from 1.
    pub seq: u64,
    /// Deploy or rollback.
    pub action: Action,
    /// The version running after this entry: `name@digest` (see
    /// [`version_of`](super::version_of)).
    pub version: String,
    /// When it was recorded, milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// Who recorded it and from what (a file, a host's admin API, a host's start).
    pub origin: String,
}

impl fmt::Display for Deployment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(self.at_ms));
        write!(
            f,
            "{:>4}  {at}  {:<8}  {}  ({})",
            self.seq,
            format!("{:?}", self.action).to_lowercase(),
            self.version,
            self.origin
        )
    }
}

/// A version tried out beside the one in force: a shadow (its outputs compared, never
/// sent) or a canary (it processes a share of the keys). Each kind has at most one at a
/// time, which every host of the job runs until it is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trial {
    /// A shadow deploy.
    Shadow,
    /// A canary.
    Canary,
}

impl Trial {
    /// Its name, as the record's file and messages say it.
    pub fn name(self) -> &'static str {
        match self {
            Trial::Shadow => "shadow",
            Trial::Canary => "canary",
        }
    }
}

/// A trial version, as [`Registry::start_trial`] stores it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrialRecord {
    /// Its version, `name@digest`.
    pub version: String,
    /// A canary's share of the keys, in basis points (see
    /// [`in_canary`](super::versions::in_canary)); none for a shadow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<super::BasisPoints>,
    /// When it was started (or its share last changed), milliseconds since the Unix
    /// epoch.
    pub at_ms: u64,
    /// Who started it and from what.
    pub origin: String,
}

/// A partition's switch of versions, as [`Registry::record_switch`] stores it.
#[derive(Debug, Serialize, Deserialize)]
struct SwitchRecord {
    /// The first offset the version processed.
    offset: u64,
    /// The version switched to.
    version: String,
    /// The canary beside it from there on, if one ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    canary: Option<CanaryShare>,
    /// When it was recorded, milliseconds since the Unix epoch.
    at_ms: u64,
}

/// Switch records read at once.
const PARALLEL_READS: usize = 8;

/// Of the switches recorded at `offsets`, those a partition from offset `from` on needs:
/// the last at or before `from`, and every one after.
fn needed(offsets: std::collections::BTreeSet<u64>, from: u64) -> std::collections::BTreeSet<u64> {
    let last_before = offsets.range(..=from).next_back().copied();
    offsets.into_iter().filter(|&offset| offset > from || Some(offset) == last_before).collect()
}

/// A canary as a partition ran it: its version and the share of the keys it took.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CanaryShare {
    /// The canary's version.
    pub version: String,
    /// Its share of the keys, in basis points ([`in_canary`](super::versions::in_canary)).
    pub share: super::BasisPoints,
}

/// What a partition ran from a recorded switch on: a version, and a canary beside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Switched {
    /// The version (every key the canary does not take).
    pub version: String,
    /// The canary, if one ran.
    pub canary: Option<CanaryShare>,
}

/// The versions of one operator in one store.
#[derive(Debug, Clone)]
pub struct Registry {
    store: Objects,
    name: String,
    /// Entries read so far, by number: an entry never changes once written, so a host
    /// looking every second reads only the new ones.
    read: Arc<Mutex<BTreeMap<u64, Deployment>>>,
}

/// The largest component a job deploys or reads back from its registry.
pub const MAX_COMPONENT_BYTES: u64 = 256 << 20;

/// How often a deploy retries when other deploys keep taking the next number.
const APPEND_ATTEMPTS: usize = 10;

impl Registry {
    /// The registry of operator `name` in `store`.
    pub fn new(store: Objects, name: &str) -> Result<Self> {
        if name.starts_with('.') || !name.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c)) {
            bail!(
                "operator name {name:?} (`[operator] name`, by default the file's stem): use letters, digits, `_`, \
                 `-` and `.` (not first) only"
            );
        }
        Ok(Registry { store, name: name.to_string(), read: Arc::default() })
    }

    /// The operator's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Every entry, oldest first.
    pub async fn history(&self) -> Result<Vec<Deployment>, DeployError> {
        let mut seqs: Vec<u64> = self
            .store
            .object_names(&self.folder("history"))
            .await
            .map_err(DeployError::StoreUnavailable)?
            .iter()
            .filter_map(|name| name.strip_suffix(".json")?.parse().ok())
            .collect();
        seqs.sort_unstable();
        let mut history = Vec::with_capacity(seqs.len());
        for seq in seqs {
            if let Some(entry) = lock(&self.read).get(&seq) {
                history.push(entry.clone());
                continue;
            }
            let entry = self.read_entry(seq).await.map_err(DeployError::StoreUnavailable)?;
            lock(&self.read).insert(seq, entry.clone());
            history.push(entry);
        }
        Ok(history)
    }

    /// Reads history entry `seq`, checking that it is what its name says.
    async fn read_entry(&self, seq: u64) -> Result<Deployment> {
        let path = self.entry_path(seq);
        let entry: Deployment = self.read_record(&path, "deployment").await?;
        if entry.seq != seq || !entry.version.starts_with(&format!("{}@", self.name)) {
            bail!(
                "{path} in {} is corrupt: it records entry {} of version {}, not an entry {seq} of operator {}",
                self.store.url(),
                entry.seq,
                entry.version,
                self.name
            );
        }
        Ok(entry)
    }

    /// The version running now, if any was deployed.
    pub async fn current(&self) -> Result<Option<Deployment>, DeployError> {
        Ok(in_force(&self.history().await?).pop())
    }

    /// The component of `version`, checked against the digest its name holds.
    pub async fn component(&self, version: &str) -> Result<Vec<u8>, DeployError> {
        self.read_component(version).await.map_err(DeployError::StoreUnavailable)
    }

    async fn read_component(&self, version: &str) -> Result<Vec<u8>> {
        let path = self.component_path(version);
        let bytes = self.store.get_optional(&path, MAX_COMPONENT_BYTES).await?.ok_or_else(|| {
            anyhow!("{path} is missing from {}: version {version} cannot be loaded", self.store.url())
        })?;
        if !super::names_build(version, &bytes) {
            bail!("{path} in {} is corrupt: its bytes are not the build {version} names", self.store.url());
        }
        Ok(bytes)
    }

    /// The version `component` is in this registry: its CRC-64 name if it was recorded
    /// under that before versions were named by SHA-256 and its bytes are the ones stored
    /// under it (a build made to match another's CRC-64 is not that build), else its
    /// [`version_of`](super::version_of). So a build keeps one name for good: a restart, a
    /// redeploy and a rollback find it, and its outputs name it as before.
    pub async fn version_of(&self, component: &[u8]) -> Result<String, DeployError> {
        let crc_named = format!("{}@{}", self.name, checksum::of_bytes(component));
        if self.history().await?.iter().any(|d| d.version == crc_named) {
            let stored = self
                .store
                .get_optional(&self.component_path(&crc_named), MAX_COMPONENT_BYTES)
                .await
                .map_err(DeployError::StoreUnavailable)?;
            if stored.as_deref() == Some(component) {
                return Ok(crc_named);
            }
        }
        Ok(super::version_of(&self.name, component))
    }

    /// Records `component` as the running version. The caller has validated it. A
    /// canary running ends with it; a deploy that fails leaves the canary as it was.
    pub async fn deploy(&self, component: &[u8], origin: &str) -> Result<Deployment, DeployError> {
        let version = self.version_of(component).await?;
        let already = |history: &[Deployment]| match in_force(history).pop() {
            Some(current) if current.version == version => {
                Err(DeployError::AlreadyInForce { version: version.clone(), seq: current.seq })
            }
            _ => Ok(Some((Action::Deploy, version.clone()))),
        };
        // Refused before the canary is touched: the version in force stays, and so does
        // the canary beside it.
        already(&self.history().await?)?;
        self.put_component(&version, component).await.map_err(DeployError::StoreUnavailable)?;
        // A deploy is of every key: a canary ends first, so no host runs it beside the
        // version it deploys.
        let canary = self.stop_trial(Trial::Canary).await?;
        match self.append(already, origin).await {
            Ok(deployed) => Ok(deployed.expect("always appends or fails")),
            Err(error) => {
                if let Some(canary) = canary
                    && let Err(put_back) = self.put_trial(Trial::Canary, &canary).await
                {
                    tracing::error!(
                        "the deploy of {version} failed and the canary {} it ended could not be recorded again: \
                         {put_back}; deploy it again with sluice deploy --canary",
                        canary.version
                    );
                }
                Err(error)
            }
        }
    }

    /// Records `component` as the running version unless it was ever deployed before;
    /// returns the version that runs now. A host starting with a configured file uses
    /// this: a file it has not seen is a new deploy, a known one defers to the history
    /// (a restart runs what was deployed or rolled back to since).
    pub async fn adopt(&self, component: &[u8], origin: &str) -> Result<Deployment, DeployError> {
        let version = self.version_of(component).await?;
        if !self.history().await?.iter().any(|d| d.version == version) {
            self.put_component(&version, component).await.map_err(DeployError::StoreUnavailable)?;
        }
        let adopted = self
            .append(
                |history| Ok((!history.iter().any(|d| d.version == version)).then(|| (Action::Deploy, version.clone()))),
                origin,
            )
            .await?;
        match adopted {
            Some(deployment) => Ok(deployment),
            // Only a damaged history holds versions but none in force.
            None => self
                .current()
                .await?
                .ok_or_else(|| DeployError::StoreUnavailable(anyhow!("the history of {} is empty", self.name))),
        }
    }

    /// The entry a rollback returns to: the deploy before the newest one still in force.
    pub async fn rollback_target(&self) -> Result<Deployment, DeployError> {
        self.target_in(&self.history().await?)
    }

    /// Records a rollback to `target` (what [`rollback_target`] said), unless the
    /// history moved on meanwhile.
    ///
    /// [`rollback_target`]: Registry::rollback_target
    pub async fn rollback(&self, target: &Deployment, origin: &str) -> Result<Deployment, DeployError> {
        let rolled = self
            .append(
                // The same entry, not just the same version: a rollback undoes one deploy.
                |history| match self.target_in(history)? {
                    now if now.seq == target.seq => Ok(Some((Action::Rollback, now.version))),
                    now => Err(DeployError::Conflict(format!(
                        "a rollback of {} would now return to entry {} ({}), not entry {} ({}): the history changed \
                         meanwhile; try again",
                        self.name, now.seq, now.version, target.seq, target.version
                    ))),
                },
                origin,
            )
            .await?;
        Ok(rolled.expect("always appends or fails"))
    }

    fn target_in(&self, history: &[Deployment]) -> Result<Deployment, DeployError> {
        let mut stack = in_force(history);
        match stack.len() {
            0 => Err(DeployError::NothingToRollBack(format!(
                "operator {} has no deployed version to roll back",
                self.name
            ))),
            1 => Err(DeployError::NothingToRollBack(format!(
                "operator {} runs its first version ({}); there is nothing to roll back to",
                self.name, stack[0].version
            ))),
            n => Ok(stack.swap_remove(n - 2)),
        }
    }

    /// Appends the entry `decide` asks for given the history (`None`: nothing to
    /// append), retrying when another writer took the next number first.
    async fn append(
        &self,
        decide: impl Fn(&[Deployment]) -> Result<Option<(Action, String)>, DeployError>,
        origin: &str,
    ) -> Result<Option<Deployment>, DeployError> {
        for _ in 0..APPEND_ATTEMPTS {
            let history = self.history().await?;
            let Some((action, version)) = decide(&history)? else { return Ok(None) };
            let entry = Deployment {
                seq: history.last().map_or(1, |d| d.seq + 1),
                action,
                version,
                at_ms: crate::probes::now_ms(),
                origin: origin.to_string(),
            };
            let json = serde_json::to_vec_pretty(&entry).expect("a deployment record serializes");
            if self.store.put_new(&self.entry_path(entry.seq), json).await.map_err(DeployError::StoreUnavailable)? {
                return Ok(Some(entry));
            }
        }
        Err(DeployError::Conflict(format!(
            "could not record a deployment of {}: {APPEND_ATTEMPTS} other writers got there first",
            self.name
        )))
    }

    /// Stores `component` as the object of `version`, unless it is there already. An
    /// object is never overwritten: other bytes under its name are a damaged or
    /// tampered-with store, for a person to look at.
    async fn put_component(&self, version: &str, component: &[u8]) -> Result<()> {
        let path = self.component_path(version);
        if self.store.put_new(&path, component.to_vec()).await? {
            return Ok(());
        }
        match self.store.get_optional(&path, MAX_COMPONENT_BYTES).await? {
            Some(stored) if stored == component => Ok(()),
            _ => bail!(
                "{path} in {} holds other bytes than the build {version}, and sluice never overwrites a component: \
                 if it is damaged, remove it and deploy the build again",
                self.store.url()
            ),
        }
    }

    /// Records `component` as the operator's `trial` (with a canary's `share`), in place
    /// of any other of that kind; returns the record. The component is stored like a
    /// deploy's (and a later deploy of it finds it there).
    pub async fn start_trial(
        &self,
        trial: Trial,
        component: &[u8],
        share: Option<super::BasisPoints>,
        origin: &str,
    ) -> Result<TrialRecord, DeployError> {
        let version = self.version_of(component).await?;
        self.put_component(&version, component).await.map_err(DeployError::StoreUnavailable)?;
        let record = TrialRecord { version, share, at_ms: crate::probes::now_ms(), origin: origin.to_string() };
        self.put_trial(trial, &record).await?;
        Ok(record)
    }

    /// Writes `record` as the operator's `trial`.
    async fn put_trial(&self, trial: Trial, record: &TrialRecord) -> Result<(), DeployError> {
        let json = serde_json::to_vec_pretty(record).expect("a trial record serializes");
        self.store.put_bytes(&self.trial_path(trial), json).await.map_err(DeployError::StoreUnavailable)
    }

    /// The operator's `trial`, if one runs.
    pub async fn trial(&self, trial: Trial) -> Result<Option<TrialRecord>, DeployError> {
        let path = self.trial_path(trial);
        let Some(bytes) =
            self.store.get_optional(&path, MAX_RECORD_BYTES).await.map_err(DeployError::StoreUnavailable)?
        else {
            return Ok(None);
        };
        let record: TrialRecord = serde_json::from_slice(&bytes)
            .with_context(|| format!("{path} in {} is not a sluice {} record", self.store.url(), trial.name()))
            .map_err(DeployError::StoreUnavailable)?;
        if !record.version.starts_with(&format!("{}@", self.name)) {
            return Err(DeployError::StoreUnavailable(anyhow!(
                "{path} in {} is corrupt: it names {}, not a version of operator {}",
                self.store.url(),
                record.version,
                self.name
            )));
        }
        Ok(Some(record))
    }

    /// Stops the operator's `trial`; returns the one that ran, if any.
    pub async fn stop_trial(&self, trial: Trial) -> Result<Option<TrialRecord>, DeployError> {
        let running = self.trial(trial).await?;
        if running.is_some() {
            self.store.delete(&self.trial_path(trial)).await.map_err(DeployError::StoreUnavailable)?;
        }
        Ok(running)
    }

    fn trial_path(&self, trial: Trial) -> String {
        format!("{}.json", self.folder(trial.name()))
    }

    /// Records that `partition` runs `version` from `offset` on, replacing what was
    /// recorded at that offset: a switch made there before a record was processed is
    /// undone by the next one.
    pub async fn record_switch(&self, partition: u32, offset: u64, switched: &Switched) -> Result<()> {
        let (version, canary) = (switched.version.clone(), switched.canary.clone());
        let switch = SwitchRecord { offset, version, canary, at_ms: crate::probes::now_ms() };
        let json = serde_json::to_vec_pretty(&switch).expect("a switch record serializes");
        self.store.put_bytes(&self.switch_path(partition, offset), json).await
    }

    /// The versions `partition` switched to from offset `from` on, by the offset each
    /// switch took effect at: the last switch at or before `from` (what ran there) and
    /// every one after. One listing, then those records read at once.
    pub async fn switches(&self, partition: u32, from: u64) -> Result<BTreeMap<u64, Switched>> {
        use futures::StreamExt;
        let offsets = needed(self.switch_offsets(partition).await?, from);
        let reads = offsets.into_iter().map(|offset| async move {
            let path = self.switch_path(partition, offset);
            let switch: SwitchRecord = self.read_record(&path, "switch").await?;
            if switch.offset != offset || !switch.version.starts_with(&format!("{}@", self.name)) {
                bail!(
                    "{path} in {} is corrupt: it records a switch to {} at offset {}, not one of operator {} at \
                     offset {offset}",
                    self.store.url(),
                    switch.version,
                    switch.offset,
                    self.name
                );
            }
            Ok((offset, Switched { version: switch.version, canary: switch.canary }))
        });
        futures::stream::iter(reads).buffered(PARALLEL_READS).collect::<Vec<_>>().await.into_iter().collect()
    }

    /// Deletes the switches of `partition` no state from offset `floor` on needs: all
    /// before the last one at or before it (which says what ran there). Returns how
    /// many it deleted.
    pub async fn prune_switches(&self, partition: u32, floor: u64) -> Result<usize> {
        let offsets = self.switch_offsets(partition).await?;
        let kept = needed(offsets.clone(), floor);
        let pruned: Vec<u64> = offsets.into_iter().filter(|offset| !kept.contains(offset)).collect();
        for offset in &pruned {
            self.store.delete(&self.switch_path(partition, *offset)).await?;
        }
        Ok(pruned.len())
    }

    /// The offsets of `partition`'s recorded switches, by their names: one listing.
    async fn switch_offsets(&self, partition: u32) -> Result<std::collections::BTreeSet<u64>> {
        let names = self.store.object_names(&self.switch_folder(partition)).await?;
        Ok(names.iter().filter_map(|name| name.strip_suffix(".json")?.parse::<u64>().ok()).collect())
    }

    /// Reads the JSON record at `path`, listed a moment ago, as a sluice `what` record.
    async fn read_record<T: serde::de::DeserializeOwned>(&self, path: &str, what: &str) -> Result<T> {
        let bytes = self.store.get_optional(path, MAX_RECORD_BYTES).await?.ok_or_else(|| anyhow!("{path} vanished"))?;
        serde_json::from_slice(&bytes)
            .with_context(|| format!("{path} in {} is not a sluice {what} record", self.store.url()))
    }

    fn switch_folder(&self, partition: u32) -> String {
        format!("{}/partition-{partition:04}", self.folder("switches"))
    }

    fn switch_path(&self, partition: u32, offset: u64) -> String {
        format!("{}/{offset:020}.json", self.switch_folder(partition))
    }

    fn folder(&self, what: &str) -> String {
        format!("operators/{}/{what}", self.name)
    }

    fn entry_path(&self, seq: u64) -> String {
        format!("{}/{seq:010}.json", self.folder("history"))
    }

    /// Where the component of `version` is stored: under its digest.
    fn component_path(&self, version: &str) -> String {
        format!("{}/{}.wasm", self.folder("components"), super::digest_of(version))
    }
}

/// The deploys still in force, oldest first: a deploy pushes, a rollback pops. The
/// last one runs.
pub fn in_force(history: &[Deployment]) -> Vec<Deployment> {
    let mut stack: Vec<Deployment> = Vec::new();
    for entry in history {
        match entry.action {
            Action::Deploy => stack.push(entry.clone()),
            Action::Rollback => {
                stack.pop();
                // The entry that returned to a version stands for it from now on.
                if let Some(top) = stack.last_mut() {
                    *top = entry.clone();
                }
            }
        }
    }
    stack
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry(dir: &std::path::Path) -> Registry {
        Registry::new(Objects::open(dir.to_str().unwrap()).unwrap(), "op").unwrap()
    }

    #[test]
    fn deploys_push_rollbacks_pop_and_adopting_a_known_version_changes_nothing() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let runtime = crate::objects::runtime()?;
        let registry = registry(dir.path());
        runtime.block_on(async {
            assert!(registry.rollback_target().await.is_err(), "nothing deployed");
            let v1 = registry.adopt(b"one", "start").await?;
            assert_eq!((v1.seq, v1.action), (1, Action::Deploy));
            assert_eq!(registry.adopt(b"one", "restart").await?, v1, "a known version is not deployed again");
            let first = registry.rollback_target().await.unwrap_err();
            assert!(matches!(first, DeployError::NothingToRollBack(_)) && first.to_string().contains("first version"));
            let v2 = registry.deploy(b"two", "t").await?;
            let canary = registry.start_trial(Trial::Canary, b"canary", Some(500), "t").await?;
            let again = registry.deploy(b"two", "t").await.unwrap_err();
            assert_eq!(registry.trial(Trial::Canary).await?, Some(canary), "a refused deploy keeps the canary");
            registry.stop_trial(Trial::Canary).await?;
            assert!(matches!(again, DeployError::AlreadyInForce { seq: 2, .. }), "{again:?}");
            assert!(again.to_string().contains("already the version in force (entry 2)"), "{again}");
            let v3 = registry.deploy(b"three", "t").await?;
            assert_eq!(registry.current().await?.unwrap().version, v3.version);
            let target = registry.rollback_target().await?;
            let back = registry.rollback(&target, "t").await?;
            assert_eq!((back.seq, back.action, &back.version), (4, Action::Rollback, &v2.version));
            let raced = registry.rollback(&target, "t").await.unwrap_err();
            assert!(matches!(raced, DeployError::Conflict(_)) && raced.to_string().contains("history changed"));
            assert_eq!(registry.rollback(&registry.rollback_target().await?, "t").await?.version, v1.version);
            // A restart with the first file runs what the history says: v1 after the rollbacks.
            assert_eq!(registry.adopt(b"two", "restart").await?.version, v1.version);
            assert_eq!(registry.component(&registry.current().await?.unwrap().version).await?, b"one");
            assert_eq!(registry.history().await?.len(), 5);
            Ok(())
        })
    }

    #[test]
    fn a_corrupt_component_is_refused_by_name_and_never_overwritten() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let runtime = crate::objects::runtime()?;
        let registry = registry(dir.path());
        let v1 = runtime.block_on(registry.deploy(b"one", "t"))?;
        assert_eq!(v1.version, super::super::version_of("op", b"one"));
        let object = dir.path().join(format!("operators/op/components/{}.wasm", super::super::digest_of(&v1.version)));
        std::fs::write(&object, b"two")?;
        let err = runtime.block_on(registry.component(&v1.version)).unwrap_err();
        assert!(matches!(err, DeployError::StoreUnavailable(_)), "{err:?}");
        let err = format!("{err:#}");
        assert!(err.contains("is corrupt") && err.contains("operators/op/components"), "{err}");
        // Deploying the build again leaves the object for a person to look at.
        runtime.block_on(registry.deploy(b"two", "t"))?;
        let err = format!("{:#}", runtime.block_on(registry.deploy(b"one", "t")).unwrap_err());
        assert!(err.contains("never overwrites") && err.contains(&v1.version), "{err}");
        assert_eq!(std::fs::read(&object)?, b"two");
        std::fs::remove_file(&object)?;
        runtime.block_on(registry.deploy(b"one", "t"))?;
        assert_eq!(runtime.block_on(registry.component(&v1.version))?, b"one");
        // An entry whose contents do not match its name is refused, not followed.
        let entry = dir.path().join("operators/op/history/0000000001.json");
        std::fs::write(&entry, std::fs::read_to_string(&entry)?.replace("op@", "other@"))?;
        // (A host that had read it before keeps what it read; a host reading it now:)
        let err = format!("{:#}", runtime.block_on(self::registry(dir.path()).history()).unwrap_err());
        assert!(err.contains("0000000001.json") && err.contains("is corrupt"), "{err}");
        Ok(())
    }

    /// A history written when versions were named by CRC-64 stays readable: its builds
    /// keep their names (a restart adopts the known build, a redeploy of it is the same
    /// version, a rollback returns to it) while a new build is named by SHA-256.
    #[test]
    fn builds_recorded_under_crc64_names_keep_them() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let runtime = crate::objects::runtime()?;
        let old = format!("op@{}", checksum::of_bytes(b"one"));
        let components = dir.path().join("operators/op/components");
        std::fs::create_dir_all(&components)?;
        std::fs::write(components.join(format!("{}.wasm", checksum::of_bytes(b"one"))), b"one")?;
        let entry = Deployment { seq: 1, action: Action::Deploy, version: old.clone(), at_ms: 1, origin: "old".into() };
        std::fs::create_dir_all(dir.path().join("operators/op/history"))?;
        std::fs::write(dir.path().join("operators/op/history/0000000001.json"), serde_json::to_vec(&entry)?)?;
        let registry = registry(dir.path());
        runtime.block_on(async {
            assert_eq!(registry.version_of(b"one").await?, old);
            assert_eq!(registry.adopt(b"one", "restart").await?, entry, "a known build is not deployed again");
            let v2 = registry.deploy(b"two", "t").await?;
            assert_eq!(v2.version, super::super::version_of("op", b"two"));
            assert_eq!(v2.version.len(), "op@".len() + 64);
            let back = registry.rollback(&registry.rollback_target().await?, "t").await?;
            assert_eq!(back.version, old);
            assert_eq!(registry.component(&back.version).await?, b"one", "read and checked by its CRC-64");
            let again = registry.deploy(b"one", "t").await.unwrap_err();
            assert!(matches!(again, DeployError::AlreadyInForce { seq: 3, .. }), "{again:?}");
            Ok(())
        })
    }
}
