//! The version each record of a partition is processed with when it is processed again.
//!
//! A record processed twice — after a crash, a restore from an older checkpoint, a
//! handover — must be decided the same way both times: with exactly-once outputs the
//! second run is silent, so a state that decided otherwise would no longer be the fold
//! of the outputs already committed. Which version processes a record is one of those
//! decisions. So a partition records in the [registry](crate::operator::registry) the offset of
//! each switch of versions it made — the routing that runs, not the one asked for —
//! and commits nothing past a switch until its record is in the store: the record is
//! written off the record path, retried for `[checkpoint] restore_retry_timeout` (the
//! claim on the partition checked first, so a host that lost it writes nothing), and a
//! switch that cannot be recorded costs its partition a restart from its last commit
//! ([`SwitchUnrecorded`]), never a run nobody could repeat. A partition that starts
//! reads its switches back: its records below the offset its outputs are
//! committed up to, or below its last recorded switch, are processed with the version
//! that first processed them, switching where the first run switched; from there on it
//! follows the host's [active version](super::ActiveVersion) again, recording
//! each switch.
//!
//! This module owns that plan ([`PartitionSwitches`]) and the log it is read from and
//! written to ([`SwitchLog`]). The [instance](super::VersionedInstance) carries the
//! plan out between batches; the registry owns the log's layout.

use crate::backoff::Backoff;
use crate::checkpoint::store::{CheckpointStore, ClaimedElsewhere};
use crate::lock;
use crate::operator::BasisPoints;
use crate::operator::registry::{CanaryShare, Registry, Switched};
use crate::operator::wasm::{Limits, WasmOperator};
use anyhow::{Result, anyhow};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::runtime::Handle;
use tokio::task::JoinHandle;

/// A partition's switches as [`SwitchLog::read`] read them, by the offset each took
/// effect at.
pub type RecordedSwitches = BTreeMap<u64, Switched>;

/// Where a partition's claims are checked before its switches are recorded: the job's
/// checkpoint store and this host's name in it.
pub struct Claims {
    /// The checkpoint store.
    pub store: CheckpointStore,
    /// The name this host claims partitions under.
    pub host: String,
}

/// A partition's switch log cannot be used: a record that is not one, a version it
/// names that cannot be loaded. The partition stops alone, its state as its last commit
/// left it (see [`Workers`](crate::partitions::Workers)); the host goes on.
#[derive(Debug, thiserror::Error)]
#[error(
    "partition {partition}'s switch log cannot be used ({reason}); it stops here, its state as its last commit left \
     it: repair or remove the record named, then start the host again"
)]
pub struct SwitchLogUnreadable {
    /// The partition.
    pub partition: u32,
    /// Why.
    pub reason: String,
}

/// A switch a partition made could not be recorded within `[checkpoint]
/// restore_retry_timeout`: a replay could not repeat what it processes from there, so
/// nothing since its last commit may count. Its partition starts again from there
/// (see [`Workers`](crate::partitions::Workers)).
#[derive(Debug, thiserror::Error)]
#[error(
    "recording partition {partition}'s switch to {version} at offset {offset} failed for {tried:.0?} of tries \
     ([checkpoint] restore_retry_timeout): {reason}; nothing since its last commit counts"
)]
pub struct SwitchUnrecorded {
    /// The partition.
    pub partition: u32,
    /// Where it switched.
    pub offset: u64,
    /// The version it switched to.
    pub version: String,
    /// How long it tried.
    pub tried: Duration,
    /// The last failure.
    pub reason: String,
}

/// The switches of every partition of a job, kept in its registry, and the versions
/// replays need, compiled once for all partitions.
pub struct SwitchLog {
    registry: Registry,
    limits: Limits,
    config: Vec<(String, String)>,
    runtime: Handle,
    /// Checked before a switch is recorded; `None` without checkpoints (nobody claims).
    claims: Option<Claims>,
    /// How long a switch's record is retried.
    retry_timeout: Duration,
    /// Versions compiled for replays, by name.
    compiled: Mutex<BTreeMap<String, Arc<WasmOperator>>>,
}

impl SwitchLog {
    /// The log in `registry`; versions a replay needs are compiled with `limits` and
    /// `config` (the job's sandbox), and the store is called on `runtime`. A switch is
    /// recorded only while `claims` say the partition is this host's, retried for
    /// `retry_timeout`.
    pub fn new(
        registry: Registry,
        (limits, config): (Limits, Vec<(String, String)>),
        runtime: Handle,
        claims: Option<Claims>,
        retry_timeout: Duration,
    ) -> Arc<Self> {
        Arc::new(SwitchLog { registry, limits, config, runtime, claims, retry_timeout, compiled: Mutex::default() })
    }

    /// Records that `partition` runs `switched` from `offset` on, once its claim says
    /// it is this host's; retried while the store fails, for the retry timeout. Then
    /// prunes the switches no retained checkpoint needs.
    async fn write(&self, partition: u32, offset: u64, switched: &Switched) -> Result<()> {
        let mut backoff = Backoff::new(self.retry_timeout);
        loop {
            let claimed = match &self.claims {
                Some(claims) => claims.store.check_claim(partition, &claims.host).await,
                None => Ok(()),
            };
            let failure = match claimed {
                Ok(()) => match self.registry.record_switch(partition, offset, switched).await {
                    Ok(()) => {
                        // Best effort: what is not pruned now is at the next switch.
                        if let Err(e) = self.prune(partition).await {
                            tracing::debug!(partition, "pruning the switch log: {e:#}");
                        }
                        return Ok(());
                    }
                    Err(e) => e,
                },
                Err(e) if e.is::<ClaimedElsewhere>() => return Err(e),
                Err(e) => e,
            };
            let Some(wait) = backoff.next_wait() else {
                return Err(SwitchUnrecorded {
                    partition,
                    offset,
                    version: switched.version.clone(),
                    tried: backoff.elapsed(),
                    reason: format!("{failure:#}"),
                }
                .into());
            };
            tracing::debug!(partition, "recording the switch at offset {offset}: {failure:#}; trying again");
            tokio::time::sleep(wait).await;
        }
    }

    /// Deletes the switches of `partition` older than its oldest retained checkpoint
    /// needs (the last one at or before its offset says what ran there): every state a
    /// restore, a takeover or `sluice replay` may start from is at or after that offset.
    /// Without checkpoints, nothing is pruned.
    async fn prune(&self, partition: u32) -> Result<()> {
        let Some(claims) = &self.claims else { return Ok(()) };
        let Some(&oldest) = claims.store.checkpoint_ids(partition).await?.first() else { return Ok(()) };
        let floor = claims.store.manifest(partition, oldest).await?.offset;
        let pruned = self.registry.prune_switches(partition, floor).await?;
        if pruned > 0 {
            tracing::debug!(partition, "pruned {pruned} switch records before offset {floor}");
        }
        Ok(())
    }

    /// The switches of `partition` its state from offset `resume_at` on needs: read
    /// before the partition takes over its outputs, so a log that cannot be used stops
    /// it ([`SwitchLogUnreadable`]) before it fences anyone.
    pub fn read(&self, partition: u32, resume_at: u64) -> Result<RecordedSwitches> {
        self.runtime.block_on(self.registry.switches(partition, resume_at)).map_err(|e| {
            SwitchLogUnreadable { partition, reason: format!("reading its version switches: {e:#}") }.into()
        })
    }

    /// The switches `recorded` of `partition` ([`read`](Self::read)), whose state
    /// resumes at offset `resume_at` and whose outputs are committed up to offset
    /// `covered`, its instance running `running`. Fails with [`SwitchLogUnreadable`]
    /// when a recorded version cannot be loaded.
    pub fn partition(
        self: &Arc<Self>,
        recorded: RecordedSwitches,
        partition: u32,
        (resume_at, covered): (u64, u64),
        running: &Arc<WasmOperator>,
    ) -> Result<PartitionSwitches> {
        let routing = |switched: &Switched| {
            self.routing(switched, running)
                .map_err(|e| SwitchLogUnreadable { partition, reason: format!("loading a version it ran: {e:#}") })
        };
        let until = covered.max(recorded.keys().next_back().copied().unwrap_or(0));
        let mut versions = BTreeMap::new();
        if resume_at < until {
            // Records from `resume_at` up to the first switch after it ran the versions in
            // force there: those recorded at or before it, or, with none recorded (a
            // store older than this log), the one running now.
            let first = match recorded.range(..=resume_at).next_back() {
                Some((_, switched)) => routing(switched)?,
                None => Routing { version: running.clone(), canary: None },
            };
            versions.insert(resume_at, first);
            for (&offset, switched) in recorded.range(resume_at + 1..until) {
                versions.insert(offset, routing(switched)?);
            }
        }
        Ok(PartitionSwitches {
            log: self.clone(),
            partition,
            versions,
            until,
            logged: recorded.into_values().next_back(),
            writing: None,
            unrecorded_from: None,
        })
    }

    /// What `switched` names, compiled.
    fn routing(&self, switched: &Switched, running: &Arc<WasmOperator>) -> Result<Routing> {
        let canary = match &switched.canary {
            Some(CanaryShare { version, share }) => Some((self.compiled(version, running)?, *share)),
            None => None,
        };
        Ok(Routing { version: self.compiled(&switched.version, running)?, canary })
    }

    /// `version`, compiled: `running` itself, or compiled from the registry once.
    fn compiled(&self, version: &str, running: &Arc<WasmOperator>) -> Result<Arc<WasmOperator>> {
        if running.version() == version {
            return Ok(running.clone());
        }
        let mut compiled = lock(&self.compiled);
        if let Some(operator) = compiled.get(version) {
            return Ok(operator.clone());
        }
        let bytes = self.runtime.block_on(self.registry.component(version))?;
        let origin = format!("version {version}, which a replay repeats");
        let operator =
            Arc::new(WasmOperator::compile(version, &bytes, &origin, self.limits.clone(), self.config.clone())?);
        compiled.insert(version.to_string(), operator.clone());
        Ok(operator)
    }
}

/// The versions that process a partition's records from an offset on: one version, and
/// a canary beside it taking a share of the keys.
#[derive(Clone)]
pub struct Routing {
    /// The version of every key the canary does not take.
    pub version: Arc<WasmOperator>,
    /// The canary and its share, if one ran.
    pub canary: Option<(Arc<WasmOperator>, BasisPoints)>,
}

impl Routing {
    /// As the log records it.
    pub fn switched(&self) -> Switched {
        let canary =
            self.canary.as_ref().map(|(canary, share)| CanaryShare { version: canary.version().into(), share: *share });
        Switched { version: self.version.version().to_string(), canary }
    }
}

/// One partition's switches: those its replay repeats, then those it records.
pub struct PartitionSwitches {
    log: Arc<SwitchLog>,
    partition: u32,
    /// From each offset on, the versions that first processed the records there, for
    /// the records the partition replays: the first key is the offset it resumed at.
    versions: BTreeMap<u64, Routing>,
    /// Records below it are replayed with `versions`.
    until: u64,
    /// What the log has from its last switch on, if it has any (or will have, once
    /// `writing` ends).
    logged: Option<Switched>,
    /// The records of switches being written, in order (each task awaits the one
    /// before).
    writing: Option<JoinHandle<Result<()>>>,
    /// The offset of the first switch not known to be recorded yet.
    unrecorded_from: Option<u64>,
}

impl PartitionSwitches {
    /// The versions that process the record at `offset` if the partition replays it: the
    /// ones that first did.
    pub fn replayed(&self, offset: u64) -> Option<&Routing> {
        if offset >= self.until {
            return None;
        }
        self.versions.range(..=offset).next_back().map(|(_, version)| version)
    }

    /// The first offset after `offset` whose record may be processed with another
    /// version than the record at `offset`: a batch must end before it.
    pub fn next_change(&self, offset: u64) -> Option<u64> {
        if offset >= self.until {
            return None;
        }
        Some(self.versions.range(offset + 1..).next().map_or(self.until, |(&at, _)| at))
    }

    /// Records that the partition runs `switched` from `offset` on, unless the log says
    /// so already: called once it does, before it processes anything there. The record
    /// is written off the record path; [`recorded_before`](Self::recorded_before) says
    /// when it is in the store.
    pub fn record(&mut self, offset: u64, switched: Switched) {
        if self.logged.as_ref() == Some(&switched) {
            return;
        }
        let (log, partition, previous, write) =
            (self.log.clone(), self.partition, self.writing.take(), switched.clone());
        self.writing = Some(self.log.runtime.spawn(async move {
            if let Some(previous) = previous {
                previous.await.map_err(|e| anyhow!("recording an earlier switch panicked: {e}"))??;
            }
            log.write(partition, offset, &write).await
        }));
        self.unrecorded_from.get_or_insert(offset);
        self.logged = Some(switched);
    }

    /// Waits until every switch made below `next_offset` is recorded: a commit up to
    /// `next_offset` must not count records a replay could not route as this run did.
    /// Fails with [`SwitchUnrecorded`] (or [`ClaimedElsewhere`]) when one could not be.
    pub fn recorded_before(&mut self, next_offset: u64) -> Result<()> {
        if self.unrecorded_from.is_none_or(|from| from >= next_offset) {
            return Ok(());
        }
        let writing = self.writing.take().expect("a switch unrecorded is being written");
        self.log.runtime.block_on(writing).map_err(|e| anyhow!("recording a switch panicked: {e}"))??;
        self.unrecorded_from = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::Objects;
    use anyhow::Context;

    /// Versions 1 and 2 of vehicle_stats deployed in a registry in `dir`: the log over
    /// that registry (calling it on `runtime`), version 1, and version 2 compiled as the
    /// running one.
    fn log_with_two_versions(
        dir: &std::path::Path,
        runtime: &tokio::runtime::Runtime,
    ) -> Result<(Arc<SwitchLog>, String, Arc<WasmOperator>)> {
        let registry = Registry::new(Objects::open(&dir.to_string_lossy())?, "vehicle_stats")?;
        let bytes = |name| std::fs::read(sluice_e2e::operator_wasm(name));
        let v1 = runtime.block_on(registry.deploy(&bytes("vehicle_stats")?, "test"))?.version;
        let v2_bytes = bytes("vehicle_stats_v2")?;
        let v2 = runtime.block_on(registry.deploy(&v2_bytes, "test"))?.version;
        let running = Arc::new(WasmOperator::compile(&v2, &v2_bytes, "test", Limits::default(), Vec::new())?);
        let log = SwitchLog::new(
            registry,
            (Limits::default(), Vec::new()),
            runtime.handle().clone(),
            None,
            Duration::from_secs(5),
        );
        Ok((log, v1, running))
    }

    /// `partition`'s switches in `log` for a start at `resume_at` with outputs
    /// committed up to `covered`.
    fn started(
        log: &Arc<SwitchLog>,
        partition: u32,
        resume_at: u64,
        covered: u64,
        running: &Arc<WasmOperator>,
    ) -> Result<PartitionSwitches> {
        log.partition(log.read(partition, resume_at)?, partition, (resume_at, covered), running)
    }

    fn version(switches: &PartitionSwitches, offset: u64) -> Option<&str> {
        switches.replayed(offset).map(|routing| routing.version.version())
    }

    /// `version` alone, as the log records it.
    fn only(version: &str) -> Switched {
        Switched { version: version.to_string(), canary: None }
    }

    /// A partition resuming before its last switch replays up to it with the versions
    /// recorded, or up to the offset its outputs are committed to when that is later;
    /// one resuming after both replays nothing; a switch already recorded is not
    /// written again, and records before the log began run the running version.
    #[test]
    fn a_replay_runs_the_recorded_versions_up_to_the_last_switch_or_the_committed_outputs() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let runtime = crate::objects::runtime()?;
        let (log, v1, running) = log_with_two_versions(dir.path(), &runtime)?;
        let v2 = running.version().to_string();
        let mut start = started(&log, 0, 0, 0, &running)?;
        assert_eq!(version(&start, 0), None, "an empty log replays nothing");
        start.record(0, only(&v1));
        start.record(100, only(&v2));
        start.record(100, only(&v2));
        start.recorded_before(u64::MAX)?;
        assert_eq!(runtime.block_on(log.registry.switches(0, 0))?, BTreeMap::from([(0, only(&v1)), (100, only(&v2))]));

        let before_switch = started(&log, 0, 50, 0, &running)?;
        assert_eq!((version(&before_switch, 50), version(&before_switch, 99)), (Some(v1.as_str()), Some(v1.as_str())));
        assert_eq!(version(&before_switch, 100), None, "from the last switch on, the active version");
        assert_eq!((before_switch.next_change(50), before_switch.next_change(100)), (Some(100), None));

        let covered = started(&log, 0, 50, 150, &running)?;
        assert_eq!((version(&covered, 99), version(&covered, 149)), (Some(v1.as_str()), Some(v2.as_str())));
        assert_eq!(
            (covered.next_change(50), covered.next_change(100), covered.next_change(150)),
            (Some(100), Some(150), None)
        );

        let after = started(&log, 0, 200, 150, &running)?;
        assert_eq!((version(&after, 200), after.next_change(200)), (None, None));

        // A partition whose log began after the checkpoint it resumes from.
        let mut late = started(&log, 1, 0, 0, &running)?;
        late.record(100, only(&v1));
        late.recorded_before(u64::MAX)?;
        let late = started(&log, 1, 10, 0, &running)?;
        assert_eq!((version(&late, 10), version(&late, 100)), (Some(v2.as_str()), None));
        Ok(())
    }

    /// A canary's changes are switches too: a replay repeats the canary and share that
    /// ran, and a change of share alone is recorded.
    #[test]
    fn a_replay_repeats_the_canary_that_ran() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let runtime = crate::objects::runtime()?;
        let (log, v1, running) = log_with_two_versions(dir.path(), &runtime)?;
        let v2 = running.version().to_string();
        let canary = |share| Switched { version: v1.clone(), canary: Some(CanaryShare { version: v2.clone(), share }) };
        let mut start = started(&log, 0, 0, 0, &running)?;
        start.record(0, only(&v1));
        start.record(50, canary(1000));
        start.record(80, canary(5000));
        start.record(90, canary(5000));
        start.recorded_before(91)?;
        assert_eq!(runtime.block_on(log.registry.switches(0, 0))?.len(), 3, "the same routing is not written again");
        let replay = started(&log, 0, 60, 100, &running)?;
        let routing = |offset| replay.replayed(offset).map(Routing::switched);
        assert_eq!((routing(60), routing(85), routing(100)), (Some(canary(1000)), Some(canary(5000)), None));
        assert_eq!(replay.next_change(60), Some(80));
        Ok(())
    }

    /// Pruning keeps the last switch at or before the floor and every one after; a
    /// read from an offset reads the last one at or before it and every one after.
    #[test]
    fn pruning_and_reading_keep_what_ran_at_the_offset_and_after() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let runtime = crate::objects::runtime()?;
        let (log, v1, running) = log_with_two_versions(dir.path(), &runtime)?;
        let mut start = started(&log, 0, 0, 0, &running)?;
        for (offset, version) in [(0, v1.as_str()), (10, running.version()), (20, &v1), (30, running.version())] {
            start.record(offset, only(version));
        }
        start.recorded_before(u64::MAX)?;
        let offsets =
            |from| -> Result<Vec<u64>> { Ok(runtime.block_on(log.registry.switches(0, from))?.into_keys().collect()) };
        assert_eq!(offsets(25)?, [20, 30]);
        assert_eq!(runtime.block_on(log.registry.prune_switches(0, 25))?, 2);
        assert_eq!(offsets(0)?, [20, 30], "0 and 10 pruned");
        Ok(())
    }

    #[test]
    fn a_corrupt_switch_record_is_refused_by_name() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let runtime = crate::objects::runtime()?;
        let (log, v1, running) = log_with_two_versions(dir.path(), &runtime)?;
        let mut switches = started(&log, 0, 0, 0, &running)?;
        switches.record(100, only(&v1));
        switches.recorded_before(101)?;
        let path = dir.path().join("operators/vehicle_stats/switches/partition-0000/00000000000000000100.json");
        std::fs::write(&path, std::fs::read_to_string(&path)?.replace("\"offset\": 100", "\"offset\": 7"))?;
        let err = format!("{:#}", started(&log, 0, 0, 0, &running).err().context("a corrupt record is refused")?);
        assert!(err.contains("00000000000000000100.json") && err.contains("is corrupt"), "{err}");
        Ok(())
    }
}
