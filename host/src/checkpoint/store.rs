//! The checkpoint store: how checkpoints get in and out of the [`Objects`] at the
//! store's URL (a local directory or S3-compatible object storage), verified.
//!
//! A file uploaded by a checkpoint that never finished is garbage, found and deleted by
//! the next checkpoint's collection.
//!
//! Each host that takes a partition first writes its [`PartitionClaim`]; a host whose
//! claim was overwritten (it was evicted from its group without knowing yet) writes no
//! manifest and deletes nothing of that partition ([`CheckpointStore::check_claim`]), so
//! it cannot collect files the new owner restores or references.
//!
//! This module owns claims, verification and the store's side of each record; where
//! objects are is the [`layout`](super::layout)'s, what the records hold the
//! [`records`](super::records)'; it does not decide what to upload, keep or restore.

use super::layout::{
    LEGACY_CLAIM, RESTORES, STORE_MANIFEST, claim_path, file_path, files_dir, manifest_path, partition_dir,
};
use super::records::{
    CHECKPOINT_FORMAT, JobIdentity, Manifest, ManifestFile, PartitionClaim, RestoreHistory, RestoreSample,
    StoreManifest,
};
use crate::bandwidth::Bandwidth;
use crate::checksum::Checksum;
use crate::objects::{MAX_RECORD_BYTES, Objects};
use anyhow::{Context, Result, anyhow, bail};
use futures::StreamExt;
use object_store::{GetResult, GetResultPayload};
use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

/// An uploaded file as the store lists it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StoredFile {
    /// Its size in bytes.
    pub size: u64,
    /// When the store wrote it (the store's clock, like a manifest's).
    pub written: SystemTime,
}

/// Restores remembered for predicting the next one.
const RESTORE_SAMPLES: usize = 20;

/// A host checked its claim on a partition and found another host's: it no longer owns
/// the partition, whatever its consumer still believes.
#[derive(Debug, thiserror::Error)]
#[error(
    "partition {partition} was claimed by host {} at {} ms since the epoch; this host ({host}) no longer owns it \
     (evicted from its group?), so it writes no checkpoint of it and deletes nothing",
    claim.host,
    claim.claimed_at_ms
)]
pub struct ClaimedElsewhere {
    /// The partition.
    pub partition: u32,
    /// This host.
    pub host: String,
    /// The claim found.
    pub claim: PartitionClaim,
}

/// A checkpoint store: the checkpoints' layout over the [`Objects`] at a URL. Cheap to
/// clone; every clone talks to the same store.
#[derive(Clone)]
pub struct CheckpointStore {
    objects: Objects,
    /// The cap every download through this store (and its clones) shares.
    download_cap: Option<Arc<Bandwidth>>,
}

impl std::fmt::Debug for CheckpointStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckpointStore").field("url", &self.objects.url()).finish()
    }
}

impl CheckpointStore {
    /// Opens a store that exists, to read it ([`Objects::open_existing`]).
    pub fn open_existing(url: &str) -> Result<Self> {
        Ok(CheckpointStore { objects: Objects::open_existing(url)?, download_cap: None })
    }

    /// Opens the store at `url` ([`Objects::open`]).
    pub fn open(url: &str) -> Result<Self> {
        Ok(CheckpointStore { objects: Objects::open(url)?, download_cap: None })
    }

    /// This store with its downloads — of every clone, restores and standby copies
    /// together — capped at `bytes_per_s` (`[checkpoint] download_bytes_per_s`).
    pub fn with_download_cap(mut self, bytes_per_s: Option<u64>) -> Self {
        self.download_cap = bytes_per_s.map(|cap| Arc::new(Bandwidth::new(cap)));
        self
    }

    /// The URL the store was opened with.
    pub fn url(&self) -> &str {
        self.objects.url()
    }

    /// The store's own manifest, if the store has been used.
    pub async fn store_manifest(&self) -> Result<Option<StoreManifest>> {
        let Some(bytes) = self.objects.get_optional(STORE_MANIFEST, MAX_RECORD_BYTES).await? else { return Ok(None) };
        let manifest: StoreManifest = serde_json::from_slice(&bytes).with_context(|| {
            format!("{STORE_MANIFEST} in checkpoint store {} is not a sluice store manifest", self.url())
        })?;
        if manifest.format != CHECKPOINT_FORMAT {
            bail!(
                "checkpoint store {} holds checkpoint format {} (written by sluice {}); this sluice reads format \
                 {CHECKPOINT_FORMAT}",
                self.url(),
                manifest.format,
                manifest.created_by
            );
        }
        Ok(Some(manifest))
    }

    /// Fails unless the store holds checkpoints of `partitions` partitions, or none yet;
    /// writes nothing. Returns what the store says of itself.
    pub async fn check_partitions(&self, partitions: u32) -> Result<Option<StoreManifest>> {
        match self.store_manifest().await? {
            Some(manifest) if manifest.partitions != partitions => bail!(
                "checkpoint store {} holds {} partitions but the job asks for {partitions}; keys would hash to \
                 partitions whose checkpoints do not hold their state. Use partitions = {} or another store",
                self.url(),
                manifest.partitions,
                manifest.partitions
            ),
            manifest => Ok(manifest),
        }
    }

    /// Checks that the store belongs to `job`, with `partitions` partitions, and claims
    /// it for that job when it is new (or older than job identities). Either claim is a
    /// conditional create — of the store's manifest, or for an older store of its
    /// [`LEGACY_CLAIM`] — so of two jobs starting on one such store at once exactly one
    /// owns it and the other is refused as any other job would be.
    pub async fn claim(&self, partitions: u32, job: &JobIdentity) -> Result<()> {
        let manifest = match self.check_partitions(partitions).await? {
            Some(StoreManifest { job: Some(owner), .. }) if owner != *job => bail!(
                "checkpoint store {} belongs to another job ({owner}), not this one ({job}): restoring its \
                 checkpoints would start from state this job never wrote. Give this job a store of its own",
                self.url()
            ),
            Some(StoreManifest { job: Some(_), .. }) => return Ok(()),
            Some(manifest) => {
                let claim = serde_json::to_vec_pretty(job)?;
                if !self.objects.put_new(LEGACY_CLAIM, claim).await? {
                    let bytes = self.objects.get_optional(LEGACY_CLAIM, MAX_RECORD_BYTES).await?;
                    let owner: JobIdentity = serde_json::from_slice(&bytes.unwrap_or_default())
                        .with_context(|| format!("{LEGACY_CLAIM} in {} is not a sluice job claim", self.url()))?;
                    // This job's own claim, from a start that stopped before the manifest.
                    if owner != *job {
                        bail!(
                            "checkpoint store {} was claimed by another job ({owner}), not this one ({job}): \
                             restoring its checkpoints would start from state this job never wrote. Give this job \
                             a store of its own",
                            self.url()
                        );
                    }
                }
                StoreManifest { job: Some(job.clone()), ..manifest }
            }
            None => {
                let manifest = StoreManifest {
                    format: CHECKPOINT_FORMAT,
                    partitions,
                    created_by: env!("CARGO_PKG_VERSION").to_string(),
                    job: Some(job.clone()),
                };
                if self.objects.put_new(STORE_MANIFEST, serde_json::to_vec_pretty(&manifest)?).await? {
                    return Ok(());
                }
                // Another job created it between the look and the create: judge its claim.
                return Box::pin(self.claim(partitions, job)).await;
            }
        };
        self.objects.put_bytes(STORE_MANIFEST, serde_json::to_vec_pretty(&manifest)?).await
    }

    /// Records that `host` owns `partition` from now on: the host that took it before
    /// (if it still runs) stops checkpointing and collecting it.
    pub async fn claim_partition(&self, partition: u32, host: &str) -> Result<()> {
        let claim = PartitionClaim { host: host.to_string(), claimed_at_ms: crate::probes::now_ms() };
        self.objects.put_bytes(&claim_path(partition), serde_json::to_vec_pretty(&claim)?).await
    }

    /// Fails with [`ClaimedElsewhere`] unless `host` holds the newest claim on
    /// `partition` (or nobody claimed it: a store older than claims).
    pub async fn check_claim(&self, partition: u32, host: &str) -> Result<()> {
        let path = claim_path(partition);
        let Some(bytes) = self.objects.get_optional(&path, MAX_RECORD_BYTES).await? else { return Ok(()) };
        let claim: PartitionClaim =
            serde_json::from_slice(&bytes).with_context(|| format!("{path} is not a sluice partition claim"))?;
        if claim.host != host {
            return Err(ClaimedElsewhere { partition, host: host.to_string(), claim }.into());
        }
        Ok(())
    }

    /// The ids of `partition`'s checkpoints, oldest first.
    pub async fn checkpoint_ids(&self, partition: u32) -> Result<Vec<u64>> {
        Ok(self.manifests_written(partition).await?.into_keys().collect())
    }

    /// The checkpoints of `partition` by id, with when the store wrote each manifest.
    pub async fn manifests_written(&self, partition: u32) -> Result<BTreeMap<u64, SystemTime>> {
        let mut written = BTreeMap::new();
        for meta in self.objects.list(&format!("{}/manifests", partition_dir(partition))).await? {
            let id: Option<u64> = meta.location.filename().and_then(|name| name.strip_suffix(".json")?.parse().ok());
            if let Some(id) = id {
                written.insert(id, meta.last_modified.into());
            }
        }
        Ok(written)
    }

    /// Reads the manifest of checkpoint `id` of `partition`.
    pub async fn manifest(&self, partition: u32, id: u64) -> Result<Manifest> {
        let path = manifest_path(partition, id);
        let bytes =
            self.objects.get_optional(&path, MAX_RECORD_BYTES).await?.ok_or_else(|| anyhow!("{path} is missing"))?;
        let manifest: Manifest =
            serde_json::from_slice(&bytes).with_context(|| format!("{path} is not a sluice checkpoint manifest"))?;
        if let Some(bad) =
            manifest.files.iter().find(|f| f.name.is_empty() || f.name.contains(['/', '\\']) || f.name.starts_with('.'))
        {
            bail!("{path} lists a file named {:?}, which is not a database file name", bad.name);
        }
        if manifest.format != CHECKPOINT_FORMAT || manifest.partition != partition || manifest.id != id {
            bail!(
                "{path} describes checkpoint {} of partition {} in format {}, not checkpoint {id} of partition \
                 {partition} in format {CHECKPOINT_FORMAT}",
                manifest.id,
                manifest.partition,
                manifest.format
            );
        }
        Ok(manifest)
    }

    /// Writes `manifest`, making its checkpoint exist. Every file it lists must be in
    /// the store already.
    pub async fn put_manifest(&self, manifest: &Manifest) -> Result<()> {
        let path = manifest_path(manifest.partition, manifest.id);
        // Never over another host's checkpoint of the same number: after a rebalance
        // the old owner's last upload and the new owner's first may race.
        if !self.objects.put_new(&path, serde_json::to_vec_pretty(manifest)?).await? {
            bail!(
                "checkpoint {} of partition {} already exists in {}: another host wrote it (this one may no longer \
                 own the partition)",
                manifest.id,
                manifest.partition,
                self.url()
            );
        }
        Ok(())
    }

    /// Deletes checkpoint `id` of `partition` (its manifest; files are collected later).
    pub async fn delete_manifest(&self, partition: u32, id: u64) -> Result<()> {
        self.objects.delete(&manifest_path(partition, id)).await
    }

    /// The files `partition`'s checkpoints have uploaded, with their sizes, keyed by
    /// object name relative to the partition's files folder.
    pub async fn files(&self, partition: u32) -> Result<HashMap<String, StoredFile>> {
        let mut files = HashMap::new();
        for meta in self.objects.list(&files_dir(partition)).await? {
            if let Some(name) = meta.location.filename() {
                files.insert(name.to_string(), StoredFile { size: meta.size, written: meta.last_modified.into() });
            }
        }
        Ok(files)
    }

    /// Uploads the local file at `local` as `file` of `partition`; returns its size.
    pub async fn put_file(&self, partition: u32, file: &ManifestFile, local: PathBuf) -> Result<u64> {
        let bytes = tokio::task::spawn_blocking(move || {
            std::fs::read(&local).with_context(|| format!("reading {}", local.display()))
        })
        .await??;
        let path = file_path(partition, file);
        self.objects.upload(&path, bytes).await?;
        Ok(file.size)
    }

    /// Deletes what uploads killed part-way left in a directory store (the local file
    /// system writes `<object>#<n>` and renames it when complete; listings hide these).
    /// Object stores have no such leftovers. Returns how many it deleted.
    pub async fn remove_partial_uploads(&self, partition: u32) -> Result<usize> {
        let Some(root) = self.objects.local_root() else { return Ok(0) };
        let dir = root.join(files_dir(partition));
        tokio::task::spawn_blocking(move || -> Result<usize> {
            let entries = match std::fs::read_dir(&dir) {
                Ok(entries) => entries,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
                Err(e) => return Err(e).with_context(|| format!("listing {}", dir.display())),
            };
            let mut removed = 0;
            for entry in entries {
                let path = entry?.path();
                let name = path.file_name().unwrap_or_default().to_string_lossy();
                let partial =
                    name.rsplit_once('#').is_some_and(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
                if partial {
                    std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
                    removed += 1;
                }
            }
            Ok(removed)
        })
        .await?
    }

    /// Deletes the uploaded file `object` (a name from [`files`](Self::files)).
    pub async fn delete_file(&self, partition: u32, object: &str) -> Result<()> {
        self.objects.delete(&format!("{}/{object}", files_dir(partition))).await
    }

    /// Downloads `file` of `partition` to `dest`, adding bytes to `progress` as they
    /// arrive, under the store's download cap, and checks its size and checksum against
    /// the manifest. The error names the file and says whether it is missing or corrupt
    /// ([`CorruptFile`]); a corrupt object stays in the store, for the caller to judge.
    pub async fn download(
        &self,
        partition: u32,
        file: &ManifestFile,
        dest: PathBuf,
        progress: Arc<AtomicU64>,
    ) -> Result<()> {
        let (path, found) = self.get_file(partition, file).await?;
        let mut out = VerifiedFile::create(&dest, progress)?;
        let cap = self.download_cap.clone();
        match found.payload {
            GetResultPayload::File(mut source, _) => {
                out = tokio::task::spawn_blocking(move || -> Result<VerifiedFile> {
                    let mut buffer = vec![0; 1 << 20];
                    loop {
                        let n = source.read(&mut buffer)?;
                        if n == 0 {
                            return Ok(out);
                        }
                        out.write(&buffer[..n])?;
                        if let Some(cap) = &cap {
                            std::thread::sleep(cap.reserve(n as u64));
                        }
                    }
                })
                .await??;
            }
            GetResultPayload::Stream(mut chunks) => {
                while let Some(chunk) = chunks.next().await {
                    let chunk = chunk.with_context(|| format!("downloading {path}"))?;
                    out.write(&chunk)?;
                    if let Some(cap) = &cap {
                        tokio::time::sleep(cap.reserve(chunk.len() as u64)).await;
                    }
                }
            }
        }
        let (size, checksum) = tokio::task::spawn_blocking(move || out.finish()).await??;
        check_file(file, &path, size, &checksum)
    }

    /// Deletes the object of a [`CorruptFile`]: every checkpoint listing it is broken
    /// anyway, and while it stays, later checkpoints would take it for a good copy and
    /// not upload the file again.
    pub async fn delete_corrupt(&self, corrupt: &CorruptFile) -> Result<()> {
        self.objects.delete(&corrupt.object).await
    }

    /// Reads `file` of `partition` and checks it against the manifest without keeping
    /// it; the error says whether it is missing or corrupt.
    pub async fn verify(&self, partition: u32, file: &ManifestFile) -> Result<()> {
        let (path, found) = self.get_file(partition, file).await?;
        let mut checksum = Checksum::new();
        let mut chunks = found.into_stream();
        while let Some(chunk) = chunks.next().await {
            checksum.update(&chunk.with_context(|| format!("reading {path}"))?);
        }
        check_file(file, &path, checksum.len(), &checksum.hex())
    }

    /// Starts reading `file` of `partition`; returns its object path too.
    async fn get_file(&self, partition: u32, file: &ManifestFile) -> Result<(String, GetResult)> {
        let path = file_path(partition, file);
        match self.objects.get_stream(&path).await? {
            Some(found) => Ok((path, found)),
            None => bail!("file `{}` is missing from the store (object {path})", file.name),
        }
    }

    /// The restores measured from this store so far.
    pub async fn restore_history(&self) -> Result<RestoreHistory> {
        match self.objects.get_optional(RESTORES, MAX_RECORD_BYTES).await? {
            // The history only informs predictions: a damaged one starts afresh.
            Some(bytes) => Ok(serde_json::from_slice(&bytes).unwrap_or_default()),
            None => Ok(RestoreHistory::default()),
        }
    }

    /// Adds a measured restore to the history.
    pub async fn record_restore(&self, bytes: u64, took: Duration) -> Result<()> {
        let mut history = self.restore_history().await?;
        history.samples.push(RestoreSample { bytes, seconds: took.as_secs_f64() });
        let excess = history.samples.len().saturating_sub(RESTORE_SAMPLES);
        history.samples.drain(..excess);
        self.objects.put_bytes(RESTORES, serde_json::to_vec_pretty(&history)?).await
    }
}

/// A file read from the store whose size or checksum is not its manifest's.
#[derive(Debug, thiserror::Error)]
#[error(
    "file `{name}` is corrupt (object {object}): {size} bytes with checksum {checksum}, the manifest says \
     {expected_size} bytes with checksum {expected_checksum}"
)]
pub struct CorruptFile {
    /// The file's name in the manifest.
    pub name: String,
    /// The object it was read from.
    pub object: String,
    /// The bytes read.
    pub size: u64,
    /// Their checksum.
    pub checksum: String,
    /// The manifest's size.
    pub expected_size: u64,
    /// The manifest's checksum.
    pub expected_checksum: String,
}

/// Compares what was read of `file` (at object `path`) with its manifest entry.
fn check_file(file: &ManifestFile, path: &str, size: u64, checksum: &str) -> Result<()> {
    if size != file.size || checksum != file.checksum {
        return Err(CorruptFile {
            name: file.name.clone(),
            object: path.to_string(),
            size,
            checksum: checksum.to_string(),
            expected_size: file.size,
            expected_checksum: file.checksum.clone(),
        }
        .into());
    }
    Ok(())
}

/// A file being downloaded: written, counted and checksummed as it goes.
struct VerifiedFile {
    file: std::fs::File,
    path: PathBuf,
    checksum: Checksum,
    progress: Arc<AtomicU64>,
}

impl VerifiedFile {
    fn create(path: &Path, progress: Arc<AtomicU64>) -> Result<Self> {
        let file = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
        Ok(VerifiedFile { file, path: path.to_path_buf(), checksum: Checksum::new(), progress })
    }

    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.file.write_all(bytes).with_context(|| format!("writing {}", self.path.display()))?;
        self.checksum.update(bytes);
        self.progress.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Makes the file durable and returns its size and checksum.
    fn finish(self) -> Result<(u64, String)> {
        self.file.sync_all().with_context(|| format!("syncing {}", self.path.display()))?;
        Ok((self.checksum.len(), self.checksum.hex()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_number_is_written_once() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let store = CheckpointStore::open(dir.path().to_str().expect("UTF-8 temp path"))?;
        let manifest = Manifest {
            format: CHECKPOINT_FORMAT,
            state_format: crate::state::STATE_FORMAT,
            partition: 0,
            id: 7,
            offset: 100,
            entries: 0,
            operator: "probe@0".into(),
            created_at_ms: 0,
            uploaded_bytes: 0,
            files: Vec::new(),
        };
        let runtime = crate::objects::runtime()?;
        runtime.block_on(store.put_manifest(&manifest))?;
        let again = runtime.block_on(store.put_manifest(&Manifest { offset: 50, ..manifest }));
        let err = format!("{:#}", again.expect_err("a second checkpoint 7 is refused"));
        assert!(err.contains("checkpoint 7 of partition 0 already exists"), "{err}");
        assert_eq!(runtime.block_on(store.manifest(0, 7))?.offset, 100, "the first one stands");
        Ok(())
    }

    /// A store written before stores named their job is claimed by a conditional
    /// create too: a job that finds another's claim (it won the create and has not
    /// recorded itself in the manifest yet) is refused; the claimer itself, starting
    /// again after stopping in between, goes on.
    #[test]
    fn of_two_jobs_claiming_a_store_older_than_identities_one_owns_it() -> Result<()> {
        let runtime = crate::objects::runtime()?;
        let dir = tempfile::tempdir()?;
        let store = CheckpointStore::open(dir.path().to_str().expect("UTF-8 temp path"))?;
        let legacy = StoreManifest { format: CHECKPOINT_FORMAT, partitions: 4, created_by: "0.1.0".into(), job: None };
        std::fs::write(dir.path().join(STORE_MANIFEST), serde_json::to_vec(&legacy)?)?;
        let (a, b) =
            (JobIdentity { operator: "a".into(), input: None }, JobIdentity { operator: "b".into(), input: None });
        std::fs::write(dir.path().join(LEGACY_CLAIM), serde_json::to_vec(&a)?)?;
        let err = format!("{:#}", runtime.block_on(store.claim(4, &b)).expect_err("a claimed it first"));
        assert!(err.contains("was claimed by another job (operator a)"), "{err}");
        assert_eq!(runtime.block_on(store.store_manifest())?.and_then(|m| m.job), None, "b wrote nothing");
        runtime.block_on(store.claim(4, &a))?;
        assert_eq!(runtime.block_on(store.store_manifest())?.and_then(|m| m.job), Some(a));
        Ok(())
    }

    /// Two new jobs claiming one new store at the same moment: exactly one owns it, the
    /// other is refused, every time (with an unconditional put both would go on, each
    /// believing the store its own, and restore each other's checkpoints later).
    #[test]
    fn of_two_jobs_claiming_a_new_store_at_once_exactly_one_owns_it() -> Result<()> {
        let runtime = crate::objects::runtime()?;
        let job = |operator: &str| JobIdentity { operator: operator.into(), input: None };
        for round in 0..50 {
            let dir = tempfile::tempdir()?;
            let store = CheckpointStore::open(dir.path().to_str().expect("UTF-8 temp path"))?;
            let (a, b) = (job("a"), job("b"));
            let (a, b) = runtime.block_on(async { tokio::join!(store.claim(4, &a), store.claim(4, &b)) });
            let refused = [&a, &b].iter().filter(|r| r.is_err()).count();
            assert_eq!(refused, 1, "round {round}: {a:?} {b:?}");
            let err = format!("{:#}", a.err().or(b.err()).expect("one was refused"));
            assert!(err.contains("belongs to another job"), "{err}");
        }
        Ok(())
    }
}
