//! What every partition of this host starts with ([`WorkerSetup`]): the state
//! directory, the operator, the checkpoint store ([`Checkpointing`]), the destinations
//! and the bounds of a run, shared by all of them. It holds settings and handles, and
//! decides nothing.

use crate::checkpoint::{CheckpointSettings, CheckpointStore};
use crate::config::{NullKeys, TtlConfig};
use crate::operator::Instantiate;
use crate::operator::versions::switches::SwitchLog;
use crate::state::StateDir;
use crate::worker::{Cadence, Destinations};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;
use tokio::runtime::Handle;

/// Everything a partition needs to start, shared by all of them.
pub struct WorkerSetup {
    /// This host's state directory.
    pub state: StateDir,
    /// Instantiates the operator version every partition runs, switched by deploys.
    pub operator: Box<dyn Instantiate>,
    /// Where partitions record their switches of versions and read them back to replay.
    pub switches: Arc<SwitchLog>,
    /// Where each partition's shadow comes from
    /// ([`Shadows`](crate::operator::Shadows)); `None`: no shadows.
    pub shadows: Option<Arc<dyn crate::operator::Shadows>>,
    /// Where restores come from and checkpoints go; `None` when checkpoints are off.
    pub checkpoints: Option<Checkpointing>,
    /// Where outputs and dead letters go.
    pub destinations: Destinations,
    /// The runtime restores and checkpoint uploads run on.
    pub runtime: Handle,
    /// Batches a worker may have queued before the source holds its partition back.
    pub queued_batches: usize,
    /// ... and bytes of records (see [`queue`](crate::worker::queue)).
    pub queued_bytes: usize,
    /// When workers commit, and the batch time they warn at.
    pub cadence: Cadence,
    /// The memory for committed state entries each partition keeps (see
    /// [`Cache`](crate::state::Cache)).
    pub cache_bytes: usize,
    /// The memory each partition's timers may take (`[state] timers_mib`).
    pub timers_bytes: usize,
    /// When each partition's state expires.
    pub ttl: Arc<TtlConfig>,
    /// What becomes of records without a key.
    pub null_keys: NullKeys,
    /// How long a partition's start tries again while it fails transiently (the store
    /// failing to answer, its transactions fenced), `[checkpoint] restore_retry_timeout`.
    pub retry_timeout: Duration,
    /// How long a partition found claimed by another host stays stopped while the
    /// source still assigns it here before this host claims it back and starts it again
    /// (Kafka: `session.timeout.ms`, by when a member the group dropped has heard of it;
    /// a rebalance moving the partition meanwhile ends the wait). `None`: no group
    /// decides between the hosts, so it stays stopped.
    pub take_back_after: Option<Duration>,
    /// Set when the host is stopping (SIGTERM): draining partitions hand over instead.
    pub stopping: Arc<AtomicBool>,
}

/// The checkpoint store and how partitions use it.
pub struct Checkpointing {
    /// The store shared by every host of the job.
    pub store: CheckpointStore,
    /// How often and how much.
    pub settings: CheckpointSettings,
    /// A restore predicted to take longer than this is warned about.
    pub restore_budget: Duration,
}
