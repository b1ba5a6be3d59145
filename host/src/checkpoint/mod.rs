//! Checkpoints: each partition's state copied to a checkpoint store, and restored
//! from it when the local copy is gone or older.
//!
//! A checkpoint is a consistent RocksDB snapshot of one partition (RocksDB's
//! checkpoint API: a flush, then hard links to the immutable SST files) uploaded to a
//! [`CheckpointStore`] file by file, then a [`Manifest`] naming the files with their
//! sizes and checksums, the source offset the state reflects and the operator that
//! wrote it. Files are stored under their checksum, so a file the store already holds
//! is not uploaded again: consecutive checkpoints share most of their SST files, and a
//! checkpoint uploads roughly what changed. A checkpoint exists only once its manifest
//! is written, and the manifest is written last.
//!
//! - [`layout`]: where the store keeps what.
//! - [`records`]: the store's manifest, claims, checkpoint manifests and restore
//!   history, as JSON.
//! - [`store`]: claims, verified transfers and the records in and out, over the
//!   [`Objects`](crate::objects::Objects) at the store's URL.
//! - [`checkpointer`]: taking a partition's checkpoints in the background of its
//!   worker, retention and garbage collection.
//! - [`assemble`]: building a checkpoint's files in a local directory from the local
//!   files that match and downloads for the rest.
//! - [`restore`]: choosing between local recovery and a checkpoint, predicting and
//!   reporting the restore, falling back past missing or corrupt files.
//! - [`standby`]: copies of partitions other hosts own, followed from the store.
//!
//! This module does not decide when a checkpoint is due relative to records (the
//! [worker](crate::worker) asks its [`Checkpointer`] after each commit), and it never
//! writes into a database that is open.

pub mod assemble;
pub mod checkpointer;
pub(crate) mod events;
pub mod layout;
pub mod records;
pub mod restore;
pub mod standby;
pub mod store;

pub use checkpointer::{CheckpointSettings, Checkpointer};
pub use records::{JobIdentity, Manifest, ManifestFile};
pub use restore::{RestorePlan, RestoreReport};
pub use store::CheckpointStore;

use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// This process's name in partition claims: `<hostname>/<pid>/<start ms>`, so two runs
/// on one machine, or one machine's run and its restart, never share a name.
pub fn host_id() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| {
        let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname");
        let hostname = hostname.as_deref().map_or("unknown", str::trim);
        let started = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis());
        format!("{hostname}/{}/{started}", std::process::id())
    })
}

/// `n` bytes for people: B, KiB, MiB or GiB.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{n} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}
