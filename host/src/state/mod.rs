//! Keyed operator state: one RocksDB instance per partition under a state directory.
//!
//! This module owns the on-disk layout of a state directory, its format version, and
//! the encoding of state entries. [`StateDir`] checks that a directory was written by
//! a compatible sluice and with the same partition count before anything is opened
//! for writing; [`PartitionStore`] is one partition's database with the offset its
//! state reflects; [`Transaction`] stages a batch of records' writes so that state and
//! offset commit in one RocksDB write batch, and reads committed entries through a
//! [`Cache`] under a byte budget, and removes expired entries ([`TtlConfig`](crate::config::TtlConfig), in the
//! partition's event time, its [`Clock`]) in the order its sweep (`sweep.rs`) finds them due,
//! and fires timers (`timer.rs`: in memory, over a column family of their own) in time
//! order with them. [`limit_memory`] bounds
//! RocksDB's own memory across every partition of the process.
//!
//! Besides the partitions' databases, a state directory holds `snapshots/` (checkpoint
//! snapshots being uploaded), `partition-NNNN.restoring` (a checkpoint being restored),
//! `partition-NNNN.replaced` (the database a restore replaced) and `scratch/` (an
//! operator's trial start), all removed when the directory is opened, and `standby/`
//! (copies of partitions other hosts own) and `compiled/` (compiled operator
//! components, the sandbox's), which are kept.
//!
//! It does not decide *when* to commit (the [worker](crate::worker) does) and knows
//! nothing about operators beyond the current record's key.

mod cache;
mod expiry;
mod partition;
mod sweep;
mod timer;
mod transaction;

pub use cache::Cache;
pub use expiry::{Clock, CommittedClock};
pub use partition::{PartitionStore, StateEntry, limit_memory};
pub use sweep::Expired;
pub use timer::{is_reserved, timer_of};
pub use transaction::Transaction;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// A table keyed by encoded entry keys (record keys, which the input chooses): hashed
/// with foldhash, seeded per process, at a fraction of SipHash's cost per lookup.
type EntryMap<V> = std::collections::HashMap<Vec<u8>, V, foldhash::fast::RandomState>;

/// The state format this build writes and reads. Bump it whenever the layout or the
/// entry encoding changes, so an older or newer sluice refuses the directory instead
/// of misreading it. Format 2 put an expiry header before every value; format 3 keeps
/// timers in a column family of their own instead of as empty expiring values. A
/// format-1 or format-2 directory is migrated when opened.
pub const STATE_FORMAT: u32 = 3;

/// The older formats a directory is migrated from when opened.
const MIGRATED_FORMATS: [u32; 2] = [1, 2];

/// The file at the root of a state directory that records its format.
pub const MANIFEST_FILE: &str = "sluice-state.json";

/// What a state directory was written with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StateManifest {
    /// The [`STATE_FORMAT`] of the sluice that created the directory.
    pub format: u32,
    /// How many partitions the keys were hashed into. A different count would send
    /// keys to partitions that do not hold their state.
    pub partitions: u32,
    /// The sluice version that created the directory, for error messages.
    pub created_by: String,
}

/// A state directory: a manifest and one RocksDB database per partition.
#[derive(Debug)]
pub struct StateDir {
    root: PathBuf,
    manifest: StateManifest,
    /// A lock on [`LOCK_FILE`], held while the directory is open: exclusive for a job,
    /// so no one removes another's snapshots or restores; shared for a reader, so no
    /// job runs under it. `None`: read-only over a directory no job has locked yet.
    _lock: Option<std::fs::File>,
    /// Opened by [`open_read_only`](StateDir::open_read_only): partitions open
    /// read-only, nothing is created.
    read_only: bool,
}

/// The file a process locks while it has the state directory open.
const LOCK_FILE: &str = "sluice.lock";

impl StateDir {
    /// Opens the state directory at `root` for a job with `partitions` partitions,
    /// creating it when it does not exist. Fails, touching nothing, when the directory
    /// was written by an incompatible format or with another partition count.
    pub fn open(root: &Path, partitions: u32) -> Result<Self> {
        let manifest_path = root.join(MANIFEST_FILE);
        let manifest = if manifest_path.exists() {
            let mut manifest = Self::read_manifest(root)?;
            if MIGRATED_FORMATS.contains(&manifest.format) && manifest.partitions == partitions {
                // From now on an older sluice refuses the directory; each partition is
                // migrated when it is opened.
                tracing::info!(
                    "state directory {} is in format {}: migrating it to {STATE_FORMAT}",
                    root.display(),
                    manifest.format
                );
                manifest.format = STATE_FORMAT;
                Self::write_manifest(root, &manifest)?;
            }
            if manifest.format != STATE_FORMAT {
                bail!(
                    "{} says the state directory was written in state format {} (by sluice {}); this sluice {} reads \
                     format {} only. Use a matching sluice or a new state directory; nothing was changed",
                    manifest_path.display(),
                    manifest.format,
                    manifest.created_by,
                    env!("CARGO_PKG_VERSION"),
                    STATE_FORMAT
                );
            }
            if manifest.partitions != partitions {
                bail!(
                    "state directory {} holds {} partitions but the job asks for {partitions}; keys would hash to \
                     partitions that do not hold their state. Run with partitions = {} or a new state directory",
                    root.display(),
                    manifest.partitions,
                    manifest.partitions
                );
            }
            manifest
        } else {
            if root.exists() && std::fs::read_dir(root)?.next().is_some() {
                bail!(
                    "state directory {} is not empty but has no {MANIFEST_FILE}: it was not written by sluice; \
                     refusing to write into it",
                    root.display()
                );
            }
            std::fs::create_dir_all(root).with_context(|| format!("creating state directory {}", root.display()))?;
            let manifest =
                StateManifest { format: STATE_FORMAT, partitions, created_by: env!("CARGO_PKG_VERSION").to_string() };
            Self::write_manifest(root, &manifest)?;
            manifest
        };
        let lock_path = root.join(LOCK_FILE);
        let lock = std::fs::File::create(&lock_path).with_context(|| format!("creating {}", lock_path.display()))?;
        if let Err(e) = lock.try_lock() {
            bail!("state directory {} is in use by another process ({}: {e})", root.display(), lock_path.display());
        }
        let dir = StateDir { root: root.to_path_buf(), manifest, _lock: Some(lock), read_only: false };
        dir.remove_leftovers()?;
        Ok(dir)
    }

    /// Opens the existing state directory at `root` to read it alone (`sluice state
    /// dump`, `status --state-dir`, `checkpoints estimate`): it writes nothing — no
    /// manifest, no migration, no lock file, no leftover removed, no database created —
    /// and fails, naming the directory, when it is not in this build's format or a job
    /// has it open.
    pub fn open_read_only(root: &Path) -> Result<Self> {
        let manifest = Self::read_manifest(root)?;
        if manifest.format != STATE_FORMAT {
            bail!(
                "state directory {} is in state format {} (written by sluice {}); this sluice reads format {} only \
                 without writing (a job it runs migrates formats {MIGRATED_FORMATS:?} at its start); nothing was \
                 changed",
                root.display(),
                manifest.format,
                manifest.created_by,
                STATE_FORMAT
            );
        }
        let lock_path = root.join(LOCK_FILE);
        let lock = match std::fs::File::open(&lock_path) {
            Ok(lock) => Some(lock),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e).with_context(|| format!("opening {}", lock_path.display())),
        };
        if let Some(Err(e)) = lock.as_ref().map(std::fs::File::try_lock_shared) {
            bail!("state directory {} is in use by another process ({}: {e})", root.display(), lock_path.display());
        }
        Ok(StateDir { root: root.to_path_buf(), manifest, _lock: lock, read_only: true })
    }

    /// Whether the directory was opened by [`open_read_only`](StateDir::open_read_only).
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// Removes what a killed run can leave behind: snapshots that were uploading,
    /// half-restored databases and replaced ones. None is ever opened as state.
    fn remove_leftovers(&self) -> Result<()> {
        let leftovers = (0..self.partitions())
            .flat_map(|p| [self.restore_path(p), self.replaced_path(p)])
            .chain([self.root.join("snapshots"), self.scratch_path()]);
        for path in leftovers.filter(|p| p.exists()) {
            std::fs::remove_dir_all(&path).with_context(|| format!("removing leftover {}", path.display()))?;
        }
        Ok(())
    }

    /// Replaces the manifest of the directory at `root` with `manifest`, atomically.
    fn write_manifest(root: &Path, manifest: &StateManifest) -> Result<()> {
        let tmp = root.join(format!("{MANIFEST_FILE}.tmp"));
        std::fs::write(&tmp, serde_json::to_vec_pretty(manifest)?)?;
        std::fs::rename(&tmp, root.join(MANIFEST_FILE)).with_context(|| format!("writing {}", tmp.display()))
    }

    /// Reads the manifest of an existing state directory without opening anything.
    pub fn read_manifest(root: &Path) -> Result<StateManifest> {
        let path = root.join(MANIFEST_FILE);
        let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_slice(&bytes).with_context(|| format!("{} is not a sluice state manifest", path.display()))
    }

    /// The partition count recorded in the manifest.
    pub fn partitions(&self) -> u32 {
        self.manifest.partitions
    }

    /// The directory of partition `partition`'s database.
    pub fn partition_path(&self, partition: u32) -> PathBuf {
        self.root.join(format!("partition-{partition:04}"))
    }

    /// Where partition `partition`'s database is restored before it replaces the live
    /// one: the same file system, so the move is a rename.
    pub fn restore_path(&self, partition: u32) -> PathBuf {
        self.root.join(format!("partition-{partition:04}.restoring"))
    }

    /// Where partition `partition`'s previous database waits to be deleted once a
    /// restored one has taken its place.
    pub fn replaced_path(&self, partition: u32) -> PathBuf {
        self.root.join(format!("partition-{partition:04}.replaced"))
    }

    /// Where partition `partition`'s database goes when it cannot be opened and a
    /// checkpoint takes its place: kept, never deleted, named by when it was moved.
    pub fn unreadable_path(&self, partition: u32) -> PathBuf {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        self.root.join(format!("partition-{partition:04}.unreadable-{}", now.as_secs()))
    }

    /// Where partition `partition`'s checkpoint snapshots are staged while they upload
    /// (hard links into the live database, so on the same file system).
    pub fn snapshot_path(&self, partition: u32) -> PathBuf {
        self.root.join("snapshots").join(format!("partition-{partition:04}"))
    }

    /// Where this host keeps its standby copy of partition `partition` — the files of
    /// one checkpoint, followed from the store while another host owns the partition
    /// (see `checkpoint::standby`): on the database's file system, so a takeover
    /// hard-links them. Kept across runs: a host warms up from it.
    pub fn standby_path(&self, partition: u32) -> PathBuf {
        self.root.join("standby").join(format!("partition-{partition:04}"))
    }

    /// Where partition `partition`'s next standby copy is built before it replaces the
    /// one at [`standby_path`](Self::standby_path). Kept across runs too: what it holds
    /// is reused.
    pub fn standby_next_path(&self, partition: u32) -> PathBuf {
        self.root.join("standby").join(format!("partition-{partition:04}.next"))
    }

    /// Where the sandbox keeps compiled operator components (see
    /// [`keep_compiled`](crate::operator::wasm::keep_compiled)).
    pub fn compiled_path(&self) -> PathBuf {
        self.root.join("compiled")
    }

    /// Where a throwaway database lives while an operator is tried out.
    pub fn scratch_path(&self) -> PathBuf {
        self.root.join("scratch")
    }

    /// Opens partition `partition`'s database, creating it on first use; read-only
    /// (and failing when it does not exist) in a directory opened read-only.
    pub fn open_partition(&self, partition: u32) -> Result<PartitionStore> {
        match self.read_only {
            true => PartitionStore::open_read_only(&self.partition_path(partition), partition),
            false => PartitionStore::open(&self.partition_path(partition), partition),
        }
    }
}
