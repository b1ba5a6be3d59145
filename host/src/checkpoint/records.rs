//! The records a checkpoint store keeps, as JSON: the store's own manifest with the
//! identity of its job, the claim of each partition, one manifest per checkpoint naming
//! its files, and the history of restores. This module owns their format (and the
//! [`CHECKPOINT_FORMAT`] it has) and what they say of themselves; where each is kept is
//! the [`layout`](super::layout)'s, and reading, checking and writing them the
//! [`store`](super::store)'s.

use crate::checksum;
use anyhow::{Result, anyhow};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The checkpoint format this build writes and reads.
pub const CHECKPOINT_FORMAT: u32 = 1;

/// What a store was created for: a checkpoint of partition `p` only makes sense to a
/// job that hashes keys into the same number of partitions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoreManifest {
    /// The [`CHECKPOINT_FORMAT`] of the sluice that created the store.
    pub format: u32,
    /// The job's partition count.
    pub partitions: u32,
    /// The sluice version that created the store, for error messages.
    pub created_by: String,
    /// The job the store belongs to; absent in stores older than the field, which the
    /// next job to open them claims.
    #[serde(default)]
    pub job: Option<JobIdentity>,
}

/// Which job a store's checkpoints belong to: two jobs of the same partition count
/// must never restore each other's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobIdentity {
    /// The operator's name (`[operator] name`), the same across its versions.
    pub operator: String,
    /// The input it reads, where that names a job: `kafka topic <topic>`; `None` for
    /// the embedded sources, whose input may change between runs.
    pub input: Option<String>,
}

impl std::fmt::Display for JobIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "operator {}", self.operator)?;
        match &self.input {
            Some(input) => write!(f, " reading {input}"),
            None => Ok(()),
        }
    }
}

/// Who took a partition last: the only host that may write its checkpoints and
/// collect its garbage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionClaim {
    /// The claiming host's [id](crate::checkpoint::host_id): one per process.
    pub host: String,
    /// When it claimed, milliseconds since the Unix epoch (its clock).
    pub claimed_at_ms: u64,
}

/// One checkpoint of one partition. It exists once this manifest is in the store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`CHECKPOINT_FORMAT`].
    pub format: u32,
    /// The state format of the snapshot's database.
    pub state_format: u32,
    /// The partition.
    pub partition: u32,
    /// Increases by one per checkpoint of the partition.
    pub id: u64,
    /// The next source offset to process: the state reflects every record before it.
    pub offset: u64,
    /// State entries held.
    pub entries: u64,
    /// The operator version running when the checkpoint was taken: the latest to write
    /// the state (after a hot swap, older versions wrote parts of it).
    pub operator: String,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_at_ms: u64,
    /// Bytes this checkpoint uploaded (files the store did not hold yet).
    pub uploaded_bytes: u64,
    /// Every file of the snapshot.
    pub files: Vec<ManifestFile>,
}

/// One file of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ManifestFile {
    /// The file's name in the database directory.
    pub name: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its [checksum].
    pub checksum: String,
}

impl Manifest {
    /// The snapshot's size: the bytes a restore fetches.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }
}

/// Restore bandwidth measured on earlier restores from a store.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RestoreHistory {
    /// The latest restores, oldest first.
    pub samples: Vec<RestoreSample>,
}

/// One measured restore.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RestoreSample {
    /// Bytes fetched.
    pub bytes: u64,
    /// Wall-clock seconds it took.
    pub seconds: f64,
}

impl RestoreHistory {
    /// Bytes per second over the remembered restores, if any were measured. The file
    /// is the store's, so anyone with write access to it may have crafted it: samples
    /// that no restore could have measured (a time that is not a positive number) are
    /// passed over, and a bandwidth no division can use is none.
    pub fn bandwidth(&self) -> Option<f64> {
        let measured = self.samples.iter().filter(|s| s.seconds.is_finite() && s.seconds > 0.0);
        let (bytes, seconds) = measured.fold((0.0, 0.0), |(b, t), s| (b + s.bytes as f64, t + s.seconds));
        let bandwidth = bytes / seconds;
        (bandwidth.is_finite() && bandwidth > 0.0).then_some(bandwidth)
    }
}

/// Describes a local file as a manifest entry.
pub fn describe(path: &Path) -> Result<ManifestFile> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| anyhow!("{} has no UTF-8 file name", path.display()))?
        .to_string();
    let (size, checksum) = checksum::of_file(path)?;
    Ok(ManifestFile { name, size, checksum })
}
