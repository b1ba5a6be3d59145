//! A partition's checkpointer: snapshots its database on the worker's thread, uploads
//! the snapshot in the background, and keeps the store to the last N checkpoints.
//!
//! Taking the snapshot is the only part on the record path: RocksDB flushes the
//! memtable and hard-links the live files into a staging directory (milliseconds).
//! Uploading runs on the checkpoint runtime while the worker goes on processing. While
//! an upload is in flight no new checkpoint starts; the next one starts at the first
//! commit (or idle tick of the worker) after it finished, so a slow store lowers the
//! checkpoint rate instead of piling up snapshots.

use super::assemble;
use super::bytes;
use super::layout::object_name;
use super::records::{self, Manifest, ManifestFile};
use super::restore::PartitionPlan;
use super::store::{CheckpointStore, ClaimedElsewhere};
use crate::bandwidth::Bandwidth;
use crate::lock;
use crate::record::RestoredFrom;
use crate::state::{PartitionStore, STATE_FORMAT};
use crate::stats::PartitionStats;
use anyhow::{Context, Result};
use futures::{StreamExt, TryStreamExt};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::runtime::Handle;
use tokio::task::JoinHandle;

/// Files uploaded at once when the upload is not rate-limited.
const PARALLEL_UPLOADS: usize = 4;

/// How a partition is checkpointed.
#[derive(Debug, Clone)]
pub struct CheckpointSettings {
    /// Time between the starts of two checkpoints.
    pub interval: Duration,
    /// Checkpoints kept per partition; older ones and files only they use are deleted.
    pub retain: usize,
    /// Upload bandwidth cap in bytes/s, so checkpoints do not starve the job's own I/O.
    pub upload_bytes_per_s: Option<u64>,
    /// The name this host claims partitions under ([`host_id`](super::host_id)): a
    /// checkpoint is written, and garbage collected, only while the claim is its own.
    pub host: String,
}

/// Checkpoints one partition. Owned by the partition's worker.
pub struct Checkpointer {
    store: CheckpointStore,
    runtime: Handle,
    partition: u32,
    settings: CheckpointSettings,
    staging: PathBuf,
    operator: String,
    next_id: u64,
    /// The offset of the newest checkpoint taken (or found in the store).
    checkpointed_offset: Option<u64>,
    started: Instant,
    /// The upload in flight: it ends in its manifest and how long it took.
    in_flight: Option<JoinHandle<Result<(Manifest, Duration)>>>,
    /// Checksums of SST files already read, by name and size: SST files never change,
    /// so each is read once per process, not once per checkpoint.
    sst_checksums: Arc<Mutex<HashMap<(String, u64), String>>>,
}

impl Checkpointer {
    /// A checkpointer for `plan`'s partition whose snapshots are staged in `staging`
    /// (on the database's file system: snapshots are hard links), numbering on from the
    /// checkpoints the plan found. `restored` says what the partition's state is now.
    pub fn new(
        store: CheckpointStore,
        runtime: Handle,
        plan: &PartitionPlan,
        restored: &RestoredFrom,
        settings: CheckpointSettings,
        staging: PathBuf,
        operator: String,
    ) -> Self {
        Checkpointer {
            store,
            runtime,
            partition: plan.partition,
            settings,
            staging,
            operator,
            next_id: plan.last_id.map_or(1, |id| id + 1),
            // Only a usable checkpoint at the state's own offset makes a new one redundant.
            checkpointed_offset: match restored {
                RestoredFrom::Checkpoint { offset, .. } => Some(*offset),
                RestoredFrom::Local { offset } => plan.newest.as_ref().map(|m| m.offset).filter(|o| o == offset),
                RestoredFrom::Empty => None,
            },
            started: Instant::now(),
            in_flight: None,
            sst_checksums: Arc::default(),
        }
    }

    /// Called by the worker after every commit and while idle: collects a finished
    /// upload and starts a checkpoint when one is due, none is in flight and the state
    /// moved since the last one. A failure is logged and counted, and the next
    /// checkpoint tries again, except one that found the partition claimed by another
    /// host ([`ClaimedElsewhere`]): that one is returned, for the partition is no longer
    /// this host's to process.
    pub fn checkpoint_if_due(&mut self, state: &PartitionStore, stats: &PartitionStats) -> Result<()> {
        if self.in_flight.as_ref().is_some_and(JoinHandle::is_finished) {
            let waited = self.wait(stats);
            self.count_failure(waited, stats)?;
        }
        if self.in_flight.is_none() && self.started.elapsed() >= self.settings.interval {
            // A snapshot that fails (a full disk, say) costs this checkpoint, not the job.
            let started = self.start(state, stats);
            self.count_failure(started, stats)?;
        }
        Ok(())
    }

    /// Whether [`checkpoint_if_due`](Self::checkpoint_if_due) would start a checkpoint
    /// now: the worker commits first, so the checkpoint holds what it processed.
    pub fn is_due(&self) -> bool {
        self.started.elapsed() >= self.settings.interval && self.in_flight.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Names `version` as the operator whose state the next checkpoints hold (the
    /// worker switched to it).
    pub fn set_operator(&mut self, version: &str) {
        self.operator = version.to_string();
    }

    /// Waits for the upload in flight, then takes and uploads a last checkpoint if the
    /// state moved since the newest one, so the store holds the newest state. Only the
    /// last checkpoint's failure is an error.
    pub fn finish(&mut self, state: &PartitionStore, stats: &PartitionStats) -> Result<()> {
        let waited = self.wait(stats);
        self.count_failure(waited, stats)?;
        self.start(state, stats)?;
        self.wait(stats)
    }

    /// Logs and counts a checkpoint that failed, which the next one tries again; returns
    /// the failure if it was the partition's claim taken by another host.
    fn count_failure(&self, result: Result<()>, stats: &PartitionStats) -> Result<()> {
        let Err(e) = result else { return Ok(()) };
        if e.is::<ClaimedElsewhere>() {
            return Err(e);
        }
        stats.checkpoint_failures.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(partition = self.partition, "checkpoint failed: {e:#}");
        Ok(())
    }

    /// Snapshots `state` and starts uploading it, unless the newest checkpoint already
    /// holds this offset (then it is as good as new: `stats` say so).
    fn start(&mut self, state: &PartitionStore, stats: &PartitionStats) -> Result<()> {
        self.started = Instant::now();
        let offset = state.committed_offset()?;
        if self.checkpointed_offset == Some(offset) {
            stats.checkpoint_at_ms.store(crate::probes::now_ms(), Ordering::Relaxed);
            return Ok(());
        }
        let id = self.next_id;
        let dir = self.staging.join(format!("{id:010}"));
        if dir.exists() {
            std::fs::remove_dir_all(&dir).with_context(|| format!("removing stale snapshot {}", dir.display()))?;
        }
        std::fs::create_dir_all(&self.staging)?;
        state.snapshot(&dir)?;
        let upload = Upload {
            store: self.store.clone(),
            settings: self.settings.clone(),
            manifest: Manifest {
                format: records::CHECKPOINT_FORMAT,
                state_format: STATE_FORMAT,
                partition: self.partition,
                id,
                offset,
                entries: state.committed_entries()?,
                operator: self.operator.clone(),
                created_at_ms: crate::probes::now_ms(),
                uploaded_bytes: 0,
                files: Vec::new(),
            },
            dir,
            db: state.path().to_path_buf(),
            sst_checksums: self.sst_checksums.clone(),
        };
        self.next_id += 1;
        self.checkpointed_offset = Some(offset);
        self.in_flight = Some(self.runtime.spawn(upload.run()));
        Ok(())
    }

    /// Waits for the upload in flight, if any, and records its outcome.
    fn wait(&mut self, stats: &PartitionStats) -> Result<()> {
        let Some(upload) = self.in_flight.take() else { return Ok(()) };
        let result = self.runtime.block_on(upload).context("checkpoint upload task failed");
        match result.and_then(|r| r) {
            Ok((manifest, took)) => {
                stats.checkpoints.fetch_add(1, Ordering::Relaxed);
                stats.checkpoint_seconds.observe(took.as_secs_f64());
                stats.checkpoint_offset.store(manifest.offset, Ordering::Relaxed);
                stats.checkpoint_at_ms.store(crate::probes::now_ms(), Ordering::Relaxed);
                stats.uploaded_bytes.fetch_add(manifest.uploaded_bytes, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                // The store may or may not hold it; the next checkpoint decides afresh.
                self.checkpointed_offset = None;
                Err(e.context(format!("checkpoint of partition {} to {}", self.partition, self.store.url())))
            }
        }
    }
}

impl Drop for Checkpointer {
    /// A checkpointer dropped with an upload in flight — its partition was lost to
    /// another host, or its worker failed — cancels the upload: the store may already
    /// belong to the partition's next owner, and a manifest is written only at the end.
    fn drop(&mut self) {
        if let Some(upload) = self.in_flight.take() {
            upload.abort();
        }
    }
}

/// One checkpoint on its way to the store.
struct Upload {
    store: CheckpointStore,
    settings: CheckpointSettings,
    /// The manifest to write, files still empty.
    manifest: Manifest,
    /// The local snapshot.
    dir: PathBuf,
    /// The database it is a snapshot of.
    db: PathBuf,
    sst_checksums: Arc<Mutex<HashMap<(String, u64), String>>>,
}

impl Upload {
    /// Uploads the files the store lacks, writes the manifest, deletes what retention
    /// lets go, and removes the local snapshot whatever happened.
    async fn run(mut self) -> Result<(Manifest, Duration)> {
        let result = self.upload().await;
        let dir = self.dir.clone();
        tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir)).await?.ok();
        let took = result?;
        let (partition, settings) = (self.manifest.partition, &self.settings);
        let collected = collect_garbage(&self.store, partition, settings.retain, &settings.host).await;
        if let Err(e) = collected {
            tracing::warn!(partition = self.manifest.partition, "checkpoint garbage collection failed: {e:#}");
        }
        Ok((self.manifest, took))
    }

    /// Uploads the snapshot's files the store lacks, then the manifest; returns how long
    /// that took.
    async fn upload(&mut self) -> Result<Duration> {
        let started = Instant::now();
        let (dir, checksums) = (self.dir.clone(), self.sst_checksums.clone());
        let db = self.db.clone();
        let files = tokio::task::spawn_blocking(move || -> Result<Vec<ManifestFile>> {
            let files = describe_snapshot(&dir, &checksums)?;
            // Best effort: without the record, a later restore here reads the files.
            if let Err(e) = assemble::remember(&db, &dir, &files) {
                tracing::debug!("not remembering the checksums of {}: {e:#}", db.display());
            }
            Ok(files)
        })
        .await??;
        let partition = self.manifest.partition;
        let stored = self.store.files(partition).await?;
        let missing: Vec<&ManifestFile> =
            files.iter().filter(|f| stored.get(&object_name(f)).map(|s| s.size) != Some(f.size)).collect();
        let total: u64 = files.iter().map(|f| f.size).sum();
        let uploading: u64 = missing.iter().map(|f| f.size).sum();
        tracing::debug!(
            partition,
            checkpoint = self.manifest.id,
            offset = self.manifest.offset,
            "checkpoint uploading {} of {} files ({} of {})",
            missing.len(),
            files.len(),
            bytes(uploading),
            bytes(total)
        );
        let cap = self.settings.upload_bytes_per_s.map(Bandwidth::new);
        let parallel = if cap.is_some() { 1 } else { PARALLEL_UPLOADS };
        let uploads: Vec<_> =
            missing.iter().map(|&file| self.store.put_file(partition, file, self.dir.join(&file.name))).collect();
        let mut uploads = futures::stream::iter(uploads).buffer_unordered(parallel);
        while let Some(size) = uploads.try_next().await? {
            // Sleep after each file until what was sent is back under the cap.
            if let Some(cap) = &cap {
                tokio::time::sleep(cap.reserve(size)).await;
            }
        }
        drop(uploads);
        self.manifest.files = files;
        self.manifest.uploaded_bytes = uploading;
        // A host that lost the partition without knowing must not add a checkpoint the
        // new owner did not write (nor collect, below, what the new owner restores).
        self.store.check_claim(partition, &self.settings.host).await?;
        self.store.put_manifest(&self.manifest).await?;
        // One a partition per interval: the running summary counts them at info.
        tracing::debug!(
            partition,
            checkpoint = self.manifest.id,
            offset = self.manifest.offset,
            "checkpoint complete in {:.3}s: uploaded {} of {}",
            started.elapsed().as_secs_f64(),
            bytes(uploading),
            bytes(total)
        );
        Ok(started.elapsed())
    }
}

/// The manifest entries of every file in the snapshot at `dir`.
fn describe_snapshot(dir: &Path, sst_checksums: &Mutex<HashMap<(String, u64), String>>) -> Result<Vec<ManifestFile>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading snapshot {}", dir.display()))? {
        let path = entry?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy().into_owned();
        let size = std::fs::metadata(&path)?.len();
        let cached = lock(sst_checksums).get(&(name.clone(), size)).cloned();
        let file = match cached {
            Some(checksum) => ManifestFile { name, size, checksum },
            None => {
                let file = records::describe(&path)?;
                if file.name.ends_with(".sst") {
                    lock(sst_checksums).insert((file.name.clone(), file.size), file.checksum.clone());
                }
                file
            }
        };
        files.push(file);
    }
    files.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(files)
}

/// Deletes all but the newest `retain` checkpoints of `partition`, then every file no
/// remaining checkpoint lists and the store wrote before the newest manifest. Returns
/// how many files it deleted. Deletes nothing unless `host` holds the partition's
/// claim, checked before the manifests go and before each file does.
pub async fn collect_garbage(store: &CheckpointStore, partition: u32, retain: usize, host: &str) -> Result<usize> {
    store.check_claim(partition, host).await?;
    let written = store.manifests_written(partition).await?;
    // A file written after the newest manifest may belong to a checkpoint another host
    // is uploading right now (after a rebalance): only older ones can be orphans.
    let Some(&newest) = written.values().max() else { return Ok(0) };
    let ids: Vec<u64> = written.into_keys().collect();
    let (expired, kept) = ids.split_at(ids.len().saturating_sub(retain.max(1)));
    for &id in expired {
        store.delete_manifest(partition, id).await?;
    }
    let mut referenced = HashSet::new();
    for &id in kept {
        // A kept manifest that cannot be read might still reference files: keep all.
        let manifest = store.manifest(partition, id).await.context("keeping every file")?;
        referenced.extend(manifest.files.iter().map(object_name));
    }
    store.check_claim(partition, host).await?;
    let mut deleted = store.remove_partial_uploads(partition).await?;
    for (object, file) in store.files(partition).await? {
        if !referenced.contains(&object) && file.written < newest {
            // A new owner's checkpoint may reference this very file from now on.
            store.check_claim(partition, host).await?;
            store.delete_file(partition, &object).await?;
            deleted += 1;
        }
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Checkpoint `id` of partition 0, at offset `id`, listing `files`.
    fn manifest(id: u64, files: Vec<ManifestFile>) -> Manifest {
        Manifest {
            format: records::CHECKPOINT_FORMAT,
            state_format: STATE_FORMAT,
            partition: 0,
            id,
            offset: id,
            entries: 0,
            operator: "probe@0".into(),
            created_at_ms: 0,
            uploaded_bytes: 0,
            files,
        }
    }

    #[test]
    fn garbage_collection_spares_files_newer_than_the_newest_checkpoint() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let store = CheckpointStore::open(dir.path().join("store").to_str().expect("UTF-8 temp path"))?;
        let runtime = crate::objects::runtime()?;
        let upload = |name: &str| -> Result<ManifestFile> {
            let local = dir.path().join(name);
            std::fs::write(&local, name.repeat(10))?;
            let file = records::describe(&local)?;
            runtime.block_on(store.put_file(0, &file, local))?;
            Ok(file)
        };
        let checkpoint = |id: u64, files: Vec<ManifestFile>| runtime.block_on(store.put_manifest(&manifest(id, files)));
        let pause = || std::thread::sleep(Duration::from_millis(20));
        let kept = upload("000001.sst")?;
        checkpoint(1, vec![kept.clone()])?;
        pause();
        // Another host's checkpoint 2, files uploaded, manifest not yet written.
        let in_flight = object_name(&upload("000002.sst")?);
        assert_eq!(runtime.block_on(collect_garbage(&store, 0, 1, "a"))?, 0, "nothing newer than checkpoint 1 goes");
        pause();
        checkpoint(2, vec![kept])?;
        assert_eq!(runtime.block_on(collect_garbage(&store, 0, 1, "a"))?, 1, "now it is an orphan");
        let left = runtime.block_on(store.files(0))?;
        assert!(!left.contains_key(&in_flight) && left.len() == 1, "{left:?}");
        Ok(())
    }

    /// Host `a` was evicted without knowing it, and `b` claimed partition 0 to restore
    /// checkpoint 1: `a`'s next checkpoint would expire checkpoint 1 (retain 1) and
    /// collect its files under `b`'s restore. Fenced by `b`'s claim, `a` writes no
    /// manifest and deletes nothing.
    #[test]
    fn a_host_whose_partition_was_claimed_by_another_writes_and_deletes_nothing() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let store = CheckpointStore::open(dir.path().join("store").to_str().expect("UTF-8 temp path"))?;
        let runtime = crate::objects::runtime()?;
        let settings = |host: &str| CheckpointSettings {
            interval: Duration::ZERO,
            retain: 1,
            upload_bytes_per_s: None,
            host: host.to_string(),
        };
        let checkpoint = |host: &str, id: u64, file: &str| -> Result<Manifest> {
            let snapshot = dir.path().join(format!("snapshot-{id}"));
            std::fs::create_dir_all(&snapshot)?;
            std::fs::write(snapshot.join(file), file.repeat(10))?;
            let upload = Upload {
                store: store.clone(),
                settings: settings(host),
                manifest: manifest(id, Vec::new()),
                dir: snapshot,
                db: dir.path().to_path_buf(),
                sst_checksums: Arc::default(),
            };
            runtime.block_on(upload.run()).map(|(manifest, _)| manifest)
        };
        runtime.block_on(store.claim_partition(0, "a"))?;
        let restored = checkpoint("a", 1, "000001.sst")?;
        runtime.block_on(store.claim_partition(0, "b"))?;

        let refused = checkpoint("a", 2, "000002.sst").expect_err("a's claim was taken");
        assert!(refused.downcast_ref::<crate::checkpoint::store::ClaimedElsewhere>().is_some(), "{refused:#}");
        let collected = runtime.block_on(collect_garbage(&store, 0, 1, "a")).expect_err("nor may a collect");
        assert!(format!("{collected:#}").contains("claimed by host b"), "{collected:#}");
        assert_eq!(runtime.block_on(store.checkpoint_ids(0))?, [1], "b's restore still finds checkpoint 1");
        let files = runtime.block_on(store.files(0))?;
        assert!(restored.files.iter().all(|f| files.contains_key(&object_name(f))), "{files:?}");

        checkpoint("b", 2, "000002.sst")?;
        assert_eq!(runtime.block_on(store.checkpoint_ids(0))?, [2], "the owner's checkpoints and collection go on");
        Ok(())
    }
}
