//! The versions this host runs: the [`ActiveVersion`] (and the canary beside it) every
//! partition follows, and the [`ShadowVersion`] every partition's shadow runs. A deploy
//! sets them; each partition's instance reads them between batches.

use super::VersionedInstance;
use crate::operator::wasm::{WasmInstance, WasmOperator};
use crate::operator::{BasisPoints, Instantiate, Operator, Shadows};
use crate::state::Transaction;
use anyhow::Result;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The version every partition of this host runs: set by a deploy, followed by each
/// partition's [`VersionedInstance`] at its next batch boundary.
pub struct ActiveVersion {
    /// Increases with every activation, so an instance sees a change with one load.
    generation: AtomicU64,
    current: Mutex<Arc<WasmOperator>>,
    /// The canary beside it, and the share of the keys it takes.
    canary: Mutex<Option<(Arc<WasmOperator>, BasisPoints)>>,
}

impl ActiveVersion {
    /// `operator` is active.
    pub fn new(operator: Arc<WasmOperator>) -> Arc<Self> {
        Arc::new(ActiveVersion {
            generation: AtomicU64::new(0),
            current: Mutex::new(operator),
            canary: Mutex::default(),
        })
    }

    /// The active version and its generation.
    pub fn get(&self) -> (u64, Arc<WasmOperator>) {
        let current = crate::lock(&self.current);
        (self.generation.load(Ordering::Acquire), current.clone())
    }

    /// The generation of the active version: it changes with every activation.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Makes `operator` the active version for every key: a canary ends.
    pub fn activate(&self, operator: Arc<WasmOperator>) {
        let mut current = crate::lock(&self.current);
        *current = operator;
        *crate::lock(&self.canary) = None;
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// The canary, if one runs, and the share of the keys it takes.
    pub fn canary(&self) -> Option<(Arc<WasmOperator>, BasisPoints)> {
        crate::lock(&self.canary).clone()
    }

    /// Runs `canary` (a version and the share of the keys it takes, [`in_canary`]) beside
    /// the active version from each partition's next batch on, in place of any other;
    /// `None` ends it.
    ///
    /// [`in_canary`]: super::in_canary
    pub fn set_canary(&self, canary: Option<(Arc<WasmOperator>, BasisPoints)>) {
        *crate::lock(&self.canary) = canary;
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Instantiates the active version (and its canary, if one runs) for `partition`
    /// over `txn` and calls its `init`; the instance follows this version from then on.
    pub fn instantiate(self: &Arc<Self>, partition: u32, txn: Transaction) -> Result<VersionedInstance> {
        let (generation, operator) = self.get();
        let instance = WasmInstance::new(operator, partition, txn)?;
        let mut instance = VersionedInstance::new(instance, self.clone(), generation);
        instance.use_canary(self.canary());
        Ok(instance)
    }
}

/// How a worker instantiates the active version, not knowing it is WebAssembly.
impl Instantiate for Arc<ActiveVersion> {
    fn instantiate(&self, partition: u32, txn: Transaction) -> Result<Box<dyn Operator>> {
        Ok(Box::new(ActiveVersion::instantiate(self, partition, txn)?))
    }
}

/// The version this host runs as a shadow beside the active one, if any: set and
/// cleared by the [deployer](crate::operator::deploy), followed by each partition's
/// worker between batches. Each start is a version of its own: its instances never
/// switch.
#[derive(Default)]
pub struct ShadowVersion {
    /// Increases with every start and stop.
    generation: AtomicU64,
    current: Mutex<Option<Arc<ActiveVersion>>>,
}

impl ShadowVersion {
    /// Runs `operator` as the shadow from now on, in place of any other.
    pub fn start(&self, operator: Arc<WasmOperator>) {
        *crate::lock(&self.current) = Some(ActiveVersion::new(operator));
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Stops the shadow, if one runs.
    pub fn stop(&self) {
        if crate::lock(&self.current).take().is_some() {
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
    }
}

impl Shadows for ShadowVersion {
    fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    fn version(&self) -> Option<String> {
        crate::lock(&self.current).as_ref().map(|active| active.get().1.version().to_string())
    }

    fn instantiate(&self, partition: u32, txn: Transaction) -> Result<Option<Box<dyn Operator>>> {
        let Some(active) = crate::lock(&self.current).clone() else { return Ok(None) };
        Ok(Some(Box::new(active.instantiate(partition, txn)?)))
    }
}
