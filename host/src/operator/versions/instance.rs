//! A partition's instance that follows the host's versions ([`VersionedInstance`]):
//! between batches it switches to the [active version](super::ActiveVersion) and its
//! [canary](super::canary) as deploys set them, or — while it processes again records a
//! first run processed — to the version that first processed them, recording each
//! switch it makes in the partition's [switch log](super::switches). It pairs a canary's
//! instance with the active version's, routing the canary's keys to it; running the
//! records is the [`WasmInstance`]'s.

use super::switches::{PartitionSwitches, RecordedSwitches, Routing, SwitchLog};
use super::{ActiveVersion, canary};
use crate::operator::wasm::{WasmInstance, WasmOperator};
use crate::operator::{BasisPoints, Expiration, Operator, Outcome, Processed, Switch};
use crate::record::SourceRecord;
use crate::state::Transaction;
use anyhow::Result;
use std::sync::Arc;
use std::time::Instant;

/// One partition's instance of the [active version](ActiveVersion), following it and the
/// partition's recorded switches.
pub struct VersionedInstance {
    instance: WasmInstance,
    /// The canary paired with the instance, and its share of the keys, if one runs here.
    canary: Option<(Arc<WasmOperator>, BasisPoints)>,
    active: Arc<ActiveVersion>,
    /// The generation of the active version this instance last followed; `None` once
    /// it must look again whatever the generation (its replay ended, its switches are
    /// to be recorded).
    generation: Option<u64>,
    /// Its partition's switches of versions: those it replays, those it records.
    switches: Option<PartitionSwitches>,
}

impl VersionedInstance {
    /// `instance` runs `active`'s version of `generation`, and follows it from now on.
    pub(super) fn new(instance: WasmInstance, active: Arc<ActiveVersion>, generation: u64) -> Self {
        VersionedInstance { instance, canary: None, active, generation: Some(generation), switches: None }
    }

    /// Runs `wanted` as the canary (a version and its share; `None`: no canary) from the
    /// next batch on: started, its share changed, or ended. A canary that cannot start
    /// here is logged, and none runs.
    pub(super) fn use_canary(&mut self, wanted: Option<(Arc<WasmOperator>, BasisPoints)>) {
        let running = self.canary.as_ref().map(|(operator, share)| (operator.version(), *share));
        if running == wanted.as_ref().map(|(operator, share)| (operator.version(), *share)) {
            return;
        }
        self.canary = None;
        let Some((operator, share)) = wanted else {
            self.instance.unpair();
            return;
        };
        match self.instance.pair(operator.clone(), canary::route(share)) {
            Ok(()) => self.canary = Some((operator, share)),
            Err(e) => {
                let partition = self.instance.state().store().partition();
                tracing::error!(partition, "canary {} could not start: {e:#}", operator.version());
            }
        }
    }
}

impl Operator for VersionedInstance {
    fn process(&mut self, record: &SourceRecord) -> Result<Outcome> {
        self.instance.process(record)
    }

    fn process_batch(&mut self, records: &[SourceRecord]) -> Result<Processed> {
        self.instance.process_batch(records)
    }

    fn expire(&mut self, offset: u64) -> Result<Vec<Expiration>> {
        self.instance.expire(offset)
    }

    fn bound_next_batch(&mut self, until: Instant) {
        self.instance.bound_next_batch(until)
    }

    fn state(&mut self) -> &mut Transaction {
        self.instance.state()
    }

    fn version(&self) -> &str {
        self.instance.version()
    }

    fn paired_version(&self) -> Option<&str> {
        self.instance.paired_version()
    }

    fn follow_deploys(&mut self, offset: u64) -> Result<Option<Switch>> {
        if let Some(first) = self.switches.as_ref().and_then(|s| s.replayed(offset)).cloned() {
            // After the replay, the active version is looked at whatever its generation.
            self.generation = None;
            self.use_canary(first.canary);
            if first.version.version() == self.instance.version() {
                return Ok(None);
            }
            return self.instance.switch_to(first.version, true).map(Some);
        }
        if self.generation == Some(self.active.generation()) {
            return Ok(None);
        }
        let (generation, next) = self.active.get();
        self.generation = Some(generation);
        self.use_canary(self.active.canary());
        // Deployed and rolled back again before this partition looked, or not.
        let switched =
            (next.version() != self.instance.version()).then(|| self.instance.switch_to(next, false)).transpose()?;
        // What runs now (a version that failed to start left the old one running, a
        // canary that failed to start none), recorded before it processes anything.
        if let Some(switches) = &mut self.switches {
            let routing = Routing { version: self.instance.operator().clone(), canary: self.canary.clone() };
            switches.record(offset, routing.switched());
        }
        Ok(switched)
    }

    fn switches_recorded(&mut self, next_offset: u64) -> Result<()> {
        match &mut self.switches {
            Some(switches) => switches.recorded_before(next_offset),
            None => Ok(()),
        }
    }

    fn next_switch(&self, offset: u64) -> Option<u64> {
        self.switches.as_ref()?.next_change(offset)
    }

    /// Replays, then records each switch beginning with the version it runs then. Fails
    /// when the log cannot be read or a version it names cannot be loaded.
    fn follow_switches(
        &mut self,
        (log, recorded): (&Arc<SwitchLog>, RecordedSwitches),
        partition: u32,
        offsets: (u64, u64),
    ) -> Result<()> {
        self.switches = Some(log.partition(recorded, partition, offsets, self.instance.operator())?);
        self.generation = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::process_each;
    use crate::operator::wasm::{Limits, WasmOperator};
    use crate::state::PartitionStore;
    use anyhow::bail;

    /// The probe's count of key `k` after the record at `offset`.
    fn count(instance: &mut VersionedInstance, offset: u64) -> Result<Vec<u8>> {
        let value = br#"{"action":"count"}"#.to_vec();
        let record =
            SourceRecord { partition: 0, offset, key: b"k".to_vec(), value, timestamp_ms: 0, headers: Vec::new() };
        match process_each(instance, &[record])?.remove(0) {
            Outcome::Emitted(outputs) => Ok(outputs[0].value.clone()),
            other => bail!("count failed: {other:?}"),
        }
    }

    #[test]
    fn a_version_that_fails_to_start_on_a_partition_leaves_it_running_the_old_one() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let probe = sluice_e2e::operator_wasm("probe");
        let limits = Limits::default();
        let good = Arc::new(WasmOperator::load(&probe, limits.clone(), Vec::new())?);
        let config = vec![("fail_init".to_string(), "true".to_string())];
        let failing = Arc::new(WasmOperator::compile("other@0", &std::fs::read(&probe)?, "test", limits, config)?);
        let active = ActiveVersion::new(good.clone());
        let mut instance = active.instantiate(0, Transaction::new(PartitionStore::open(dir.path(), 0)?, 1 << 20)?)?;
        assert_eq!(count(&mut instance, 0)?, br#"{"count":1}"#);

        // Not validated first, so it gets as far as a partition, which keeps its version.
        active.activate(failing.clone());
        let switch = instance.follow_deploys(1)?.expect("a new version is active");
        assert_eq!((switch.from.as_str(), switch.to.as_str()), (good.version(), failing.version()));
        assert!(switch.refused.as_deref().is_some_and(|r| r.contains("fail_init is set")), "{switch:?}");
        assert_eq!(instance.version(), good.version());
        assert!(instance.follow_deploys(1)?.is_none(), "a refused version is tried once");
        assert_eq!(count(&mut instance, 1)?, br#"{"count":2}"#, "the state is still there");

        active.activate(good.clone());
        assert!(instance.follow_deploys(2)?.is_none(), "already runs it");
        Ok(())
    }
}
