//! Where a checkpoint store keeps what: the names of its objects.
//!
//! ```text
//! <store>/sluice-checkpoints.json                   format, partition count and identity of the job
//! <store>/sluice-job.json                           the job that claimed a store older than identities
//! <store>/restores.json                             measured restore bandwidth
//! <store>/partition-0000/claim.json                 the host that took the partition last
//! <store>/partition-0000/manifests/0000000012.json  one per checkpoint, written last
//! <store>/partition-0000/files/000042.sst.1f3a…     a file, under its name and checksum
//! <store>/operators/vehicle_stats/…                 deployed operator versions (see
//!                                                   [`registry`](crate::operator::registry))
//! ```
//!
//! Files are addressed by content (name plus checksum, [`object_name`]): a file the
//! store holds is never uploaded again. This module owns the names only; what the
//! objects hold is [`records`](super::records)', reading and writing them the
//! [`store`](super::store)'s.

use super::records::ManifestFile;

/// The store's own manifest ([`StoreManifest`](super::records::StoreManifest)).
pub(super) const STORE_MANIFEST: &str = "sluice-checkpoints.json";
/// The object a job creates to claim a store written before stores named their job,
/// before it records itself in the store's manifest.
pub const LEGACY_CLAIM: &str = "sluice-job.json";
/// The restore history ([`RestoreHistory`](super::records::RestoreHistory)).
pub(super) const RESTORES: &str = "restores.json";

/// The object name a file is stored under: its name and checksum, so a file with the
/// same name but other contents (RocksDB's MANIFEST, CURRENT) never overwrites it.
pub fn object_name(file: &ManifestFile) -> String {
    format!("{}.{}", file.name, file.checksum)
}

/// The folder of `partition`'s objects.
pub(super) fn partition_dir(partition: u32) -> String {
    format!("partition-{partition:04}")
}

/// The folder of the files `partition`'s checkpoints uploaded.
pub(super) fn files_dir(partition: u32) -> String {
    format!("{}/files", partition_dir(partition))
}

/// The object `file` of `partition` is stored as.
pub(super) fn file_path(partition: u32, file: &ManifestFile) -> String {
    format!("{}/{}", files_dir(partition), object_name(file))
}

/// The object holding `partition`'s [claim](super::records::PartitionClaim).
pub(super) fn claim_path(partition: u32) -> String {
    format!("{}/claim.json", partition_dir(partition))
}

/// The object holding the manifest of checkpoint `id` of `partition`.
pub(super) fn manifest_path(partition: u32, id: u64) -> String {
    format!("{}/manifests/{id:010}.json", partition_dir(partition))
}
