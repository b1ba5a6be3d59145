//! Restoring partitions' state from the checkpoint store, with the duration predicted
//! beforehand and measured afterwards.
//!
//! For each partition the local database wins when it is at least as new as the newest
//! checkpoint (local recovery: nothing is copied). Otherwise the newest checkpoint is
//! built in a side directory — from the files the partition's database or its standby
//! copy already holds with the same name and checksum, downloads for the rest
//! ([`assemble`]), every file checked against its manifest — the
//! database opened to confirm it holds the manifest's offset, and only then moved into
//! place; a missing or corrupt file is named and the previous checkpoint tried. Once
//! the partition's state is in place its standby copy is discarded. A
//! half-restored database is never where the job will open it. A store that fails to
//! answer is the caller's to try again ([`objects::is_unavailable`]): falling back would
//! meet the same store.
//!
//! This module owns that decision and the copying; the [state](crate::state) module
//! owns the directory layout it writes into.

use super::assemble::{self, FilesFailed, LocalFiles};
use super::bytes;
use super::events::{LOCAL_FILES_CORRUPT, LOCAL_MOVED_ASIDE, NO_RESTORE_HISTORY, RESTORE_OVER_BUDGET};
use super::records::Manifest;
use super::standby;
use super::store::CheckpointStore;
use crate::objects;
use crate::record::RestoredFrom;
use crate::state::{PartitionStore, StateDir};
use crate::stats::HostStats;
use anyhow::{Context, Result, bail};
use futures::{StreamExt, TryStreamExt};
use std::fmt;
use std::io::IsTerminal;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The bandwidth assumed until a restore from the store has been measured.
const ASSUMED_BYTES_PER_S: f64 = 100.0 * 1024.0 * 1024.0;

/// What one partition would restore from, decided without copying anything.
#[derive(Debug, Clone)]
pub struct PartitionPlan {
    /// The partition.
    pub partition: u32,
    /// The offset of the local database, if there is one it can read.
    pub local_offset: Option<u64>,
    /// Why the local database, which exists, could not be opened: a restore moves it
    /// aside (and keeps it) once a checkpoint has taken its place.
    pub local_unreadable: Option<String>,
    /// Checkpoints newer than the local state, newest first: the restore candidates.
    pub candidates: Vec<Manifest>,
    /// The newest readable checkpoint in the store, if any.
    pub newest: Option<Manifest>,
    /// The highest checkpoint id in the store, readable or not: new checkpoints
    /// number on from it.
    pub last_id: Option<u64>,
    /// Manifests that could not be read, with why.
    pub unreadable: Vec<String>,
    /// The files on this host a restore may reuse (see [`standby::local_files`]).
    pub local_files: LocalFiles,
    /// The checkpoint this host's standby copy of the partition holds.
    pub standby: Option<u64>,
}

impl PartitionPlan {
    /// The bytes a restore fetches, predicted: the newest candidate's files that no
    /// local file of the same name and size holds; 0 for local recovery.
    pub fn bytes_to_fetch(&self) -> u64 {
        self.candidates.first().map_or(0, |m| m.bytes() - self.local_files.likely_held(&m.files))
    }

    /// Where the state comes from when nothing is restored: the local state or none.
    pub fn local(&self) -> RestoredFrom {
        self.local_offset.map_or(RestoredFrom::Empty, |offset| RestoredFrom::Local { offset })
    }
}

/// A restore plan for a job, with the predicted duration.
#[derive(Debug, Clone)]
pub struct RestorePlan {
    /// One per partition, in partition order.
    pub partitions: Vec<PartitionPlan>,
    /// Restore bandwidth measured on earlier restores from this store.
    pub measured_bytes_per_s: Option<f64>,
}

impl RestorePlan {
    /// Bytes to fetch over all partitions.
    pub fn bytes_to_fetch(&self) -> u64 {
        self.partitions.iter().map(PartitionPlan::bytes_to_fetch).sum()
    }

    /// The predicted restore duration and the bandwidth it assumes.
    pub fn predicted(&self) -> (Duration, f64) {
        let bandwidth = self.measured_bytes_per_s.unwrap_or(ASSUMED_BYTES_PER_S);
        // A tiny measured bandwidth predicts longer than a Duration holds: the longest.
        let seconds = self.bytes_to_fetch() as f64 / bandwidth;
        (Duration::try_from_secs_f64(seconds).unwrap_or(Duration::MAX), bandwidth)
    }
}

impl fmt::Display for RestorePlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for p in &self.partitions {
            let local = match (p.local_offset, &p.local_unreadable) {
                (Some(offset), _) => format!("offset {offset}"),
                (None, Some(_)) => "unreadable".to_string(),
                (None, None) => "none".to_string(),
            };
            let standby = p.standby.map_or(String::new(), |id| format!("; standby copy of checkpoint {id}"));
            match (p.candidates.first(), &p.newest) {
                (Some(m), _) => writeln!(
                    f,
                    "partition {}: local state {local}{standby}; restore checkpoint {} (offset {}, {} files, {}, {} \
                     to fetch)",
                    p.partition,
                    m.id,
                    m.offset,
                    m.files.len(),
                    bytes(m.bytes()),
                    bytes(p.bytes_to_fetch())
                )?,
                (None, Some(m)) => writeln!(
                    f,
                    "partition {}: local state {local} is at least as new as checkpoint {} (offset {}): local \
                     recovery, nothing to fetch",
                    p.partition, m.id, m.offset
                )?,
                (None, None) => writeln!(f, "partition {}: local state {local}; no checkpoint", p.partition)?,
            }
            for why in &p.unreadable {
                writeln!(f, "partition {}: unreadable checkpoint: {why}", p.partition)?;
            }
        }
        let (time, bandwidth) = self.predicted();
        let basis = match self.measured_bytes_per_s {
            Some(_) => "measured on earlier restores",
            None => "assumed; no restore from this store measured yet",
        };
        write!(
            f,
            "to fetch: {}; predicted restore time {:.1}s at {}/s ({basis})",
            bytes(self.bytes_to_fetch()),
            time.as_secs_f64(),
            bytes(bandwidth as u64)
        )
    }
}

/// Decides, for each of `partitions`, what a restore from `store` would use, given the
/// local `state` (`None`: no local state at all). Without a store, only the local
/// state is looked at.
pub async fn plan(
    state: Option<&StateDir>,
    partitions: &[u32],
    store: Option<&CheckpointStore>,
) -> Result<RestorePlan> {
    let mut plans = Vec::new();
    for &partition in partitions {
        let path = state.map(|state| state.partition_path(partition)).filter(|path| path.exists());
        let open = match state.is_some_and(StateDir::is_read_only) {
            true => PartitionStore::open_read_only,
            false => PartitionStore::open,
        };
        let local = match path {
            Some(path) => Some(tokio::task::spawn_blocking(move || open(&path, partition)?.committed_offset()).await?),
            None => None,
        };
        let (local_offset, local_unreadable) = match local {
            Some(Ok(offset)) => (Some(offset), None),
            Some(Err(e)) if is_corruption(&e) => (None, Some(format!("{e:#}"))),
            // Locked by another process, of another format: not this restore's to replace.
            Some(Err(e)) => return Err(e),
            None => (None, None),
        };
        let mut manifests = Vec::new();
        let mut unreadable = Vec::new();
        let local_files = match state {
            Some(state) => standby::local_files(state, partition)?,
            None => LocalFiles::default(),
        };
        let standby = state.and_then(|state| standby::recorded(state, partition)).map(|m| m.id);
        let Some(store) = store else {
            if let Some(why) = local_unreadable {
                bail!(
                    "partition {partition}: the local state cannot be opened and there is no checkpoint store: {why}"
                );
            }
            plans.push(PartitionPlan {
                partition,
                local_offset,
                local_unreadable,
                candidates: vec![],
                newest: None,
                last_id: None,
                unreadable,
                local_files,
                standby,
            });
            continue;
        };
        let ids = store.checkpoint_ids(partition).await?;
        let last_id = ids.last().copied();
        for id in ids.into_iter().rev() {
            match store.manifest(partition, id).await {
                Ok(manifest) => manifests.push(manifest),
                Err(e) => unreadable.push(format!("checkpoint {id}: {e:#}")),
            }
        }
        let newest = manifests.first().cloned();
        let candidates = manifests.into_iter().filter(|m| local_offset.is_none_or(|local| m.offset > local)).collect();
        plans.push(PartitionPlan {
            partition,
            local_offset,
            local_unreadable,
            candidates,
            newest,
            last_id,
            unreadable,
            local_files,
            standby,
        });
    }
    // The history only informs the prediction: a store that cannot give it predicts from
    // the assumed bandwidth.
    let measured_bytes_per_s = match store {
        Some(store) => match store.restore_history().await {
            Ok(history) => history.bandwidth(),
            Err(e) => {
                tracing::warn!("{NO_RESTORE_HISTORY}: reading it failed: {e:#}");
                None
            }
        },
        None => None,
    };
    Ok(RestorePlan { partitions: plans, measured_bytes_per_s })
}

/// Whether RocksDB found a database corrupt — not locked by another process, not of
/// another format — so that a checkpoint may take its place.
fn is_corruption(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.downcast_ref::<rocksdb::Error>().is_some_and(|e| e.kind() == rocksdb::ErrorKind::Corruption))
}

/// What [`restore`] did.
#[derive(Debug, Clone)]
pub struct RestoreReport {
    /// The plan it followed.
    pub plan: RestorePlan,
    /// Where each partition's state came from, in the plan's order.
    pub restored: Vec<RestoredFrom>,
    /// How long it took.
    pub took: Duration,
}

impl RestoreReport {
    /// The bytes fetched from the store.
    pub fn fetched(&self) -> u64 {
        self.restored.iter().map(|r| if let RestoredFrom::Checkpoint { fetched, .. } = r { *fetched } else { 0 }).sum()
    }
}

/// Brings every partition of `plan` to the newest state it can have in `state`: local
/// recovery or a download from `store`. Logs the prediction (warning when it exceeds
/// `budget`, a warning also recorded in `host`'s events), progress, and the measured
/// duration, which it adds to the store's history.
pub async fn restore(
    state: &StateDir,
    store: &CheckpointStore,
    plan: RestorePlan,
    budget: Duration,
    host: &HostStats,
) -> Result<RestoreReport> {
    for why in plan.partitions.iter().flat_map(|p| p.unreadable.iter().map(move |w| (p.partition, w))) {
        tracing::warn!(partition = why.0, "skipping unreadable checkpoint: {}", why.1);
    }
    let total = plan.bytes_to_fetch();
    if total > 0 {
        let (predicted, _) = plan.predicted();
        tracing::info!("restore plan from {}:\n{plan}", store.url());
        if predicted > budget {
            let warning = format!(
                "predicted restore time {:.1}s exceeds the restore budget of {:.1}s ([checkpoint] restore_budget): \
                 this restore, and every rebalance that moves these partitions, pauses them that long. Smaller \
                 state (aggregates, TTL), more partitions or a faster store bring it down",
                predicted.as_secs_f64(),
                budget.as_secs_f64()
            );
            tracing::warn!("{warning}");
            host.record_warning(RESTORE_OVER_BUDGET, warning);
        }
    }
    let started = Instant::now();
    let progress = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let reporter = (total > 0).then(|| spawn_progress(total, progress.clone(), done.clone()));
    let restores = futures::stream::iter(plan.partitions.iter().map(|p| restore_partition(state, store, p, &progress)))
        .buffered(usize::MAX)
        .try_collect::<Vec<_>>()
        .await;
    done.store(true, Ordering::Relaxed);
    if let Some(reporter) = reporter {
        // Woken, not waited for: a small restore must not cost the reporter's tick.
        reporter.thread().unpark();
        reporter.join().ok();
    }
    let report = RestoreReport { plan, restored: restores?, took: started.elapsed() };
    let (fetched, took, plan) = (report.fetched(), report.took, &report.plan);
    if fetched > 0 {
        tracing::info!(
            "restored {} in {:.2}s ({}/s): {}",
            bytes(fetched),
            took.as_secs_f64(),
            bytes((fetched as f64 / took.as_secs_f64().max(1e-9)) as u64),
            (plan.partitions.iter().zip(&report.restored))
                .map(|(p, r)| format!("p{} {r}", p.partition))
                .collect::<Vec<_>>()
                .join(", ")
        );
        // Statistics are best effort: failing to record them fails no restore.
        if let Err(e) = store.record_restore(fetched, took).await {
            tracing::warn!("{NO_RESTORE_HISTORY}: recording this one failed: {e:#}");
        }
    }
    Ok(report)
}

/// Restores one partition as `plan` says, falling back checkpoint by checkpoint, then
/// discards its standby copy.
async fn restore_partition(
    state: &StateDir,
    store: &CheckpointStore,
    plan: &PartitionPlan,
    progress: &Arc<AtomicU64>,
) -> Result<RestoredFrom> {
    let restored = restore_newest(state, store, plan, progress).await?;
    // Unlinking: quick, whatever the copy's size.
    standby::discard(state, plan.partition)?;
    Ok(restored)
}

/// Puts the newest checkpoint of `plan` that can be restored in place, or keeps the
/// local state.
async fn restore_newest(
    state: &StateDir,
    store: &CheckpointStore,
    plan: &PartitionPlan,
    progress: &Arc<AtomicU64>,
) -> Result<RestoredFrom> {
    let partition = plan.partition;
    let mut failures = Vec::new();
    for manifest in &plan.candidates {
        let side = state.restore_path(partition);
        let built = match fetch(store, manifest, &side, &plan.local_files, progress).await {
            // A local file trusted by its recorded checksum may have been damaged since
            // (its size unchanged): built again, every local file read first, the
            // damaged ones fetched.
            Err(e) if is_corruption(&e) => {
                tracing::warn!(
                    partition,
                    "{LOCAL_FILES_CORRUPT}: checkpoint {} built from this host's files does not open ({e:#}); building \
                     it again, reading each local file before it is used",
                    manifest.id
                );
                fetch(store, manifest, &side, &plan.local_files.read_all(), progress).await
            }
            built => built,
        };
        match built {
            Ok(built) => {
                let (live, old) = (state.partition_path(partition), state.replaced_path(partition));
                if let Some(why) = &plan.local_unreadable {
                    // Never deleted: it may hold what no checkpoint does.
                    let aside = state.unreadable_path(partition);
                    tracing::warn!(
                        partition,
                        "{LOCAL_MOVED_ASIDE} to {}: {why}; restoring checkpoint {} instead",
                        aside.display(),
                        manifest.id
                    );
                    std::fs::rename(&live, &aside)
                        .with_context(|| format!("moving {} aside to {}", live.display(), aside.display()))?;
                }
                let placed = live.clone();
                tokio::task::spawn_blocking(move || replace_dir(&side, &live, &old)).await??;
                // Best effort: without the record, a later restore here reads the files.
                if let Err(e) = assemble::remember(&placed, &placed, &manifest.files) {
                    tracing::debug!(partition, "not remembering the checksums of {}: {e:#}", placed.display());
                }
                return Ok(RestoredFrom::Checkpoint {
                    id: manifest.id,
                    offset: manifest.offset,
                    bytes: manifest.bytes(),
                    fetched: built.fetched,
                    standby: built.from_standby > 0,
                });
            }
            // An older checkpoint is in the same store: the caller tries this one again.
            Err(e) if objects::is_unavailable(&e) => return Err(e),
            Err(e) => {
                tracing::error!(
                    partition,
                    "checkpoint {} (offset {}) cannot be restored: {e:#}; trying an older one",
                    manifest.id,
                    manifest.offset
                );
                failures.push(format!("checkpoint {}: {e:#}", manifest.id));
            }
        }
    }
    match plan.local_offset {
        Some(offset) if !failures.is_empty() => {
            tracing::warn!(
                partition,
                "no newer checkpoint could be restored; using the local state at offset {offset}"
            );
            Ok(RestoredFrom::Local { offset })
        }
        Some(_) => Ok(plan.local()),
        None if failures.is_empty() && plan.unreadable.is_empty() && plan.local_unreadable.is_none() => {
            Ok(plan.local())
        }
        None => bail!(
            "partition {partition}: no checkpoint in {} could be restored, and there is no local state{}; refusing \
             to start it from empty state. {}",
            store.url(),
            plan.local_unreadable.as_ref().map_or(String::new(), |why| format!(" it can read ({why})")),
            failures.iter().chain(&plan.unreadable).cloned().collect::<Vec<_>>().join("; ")
        ),
    }
}

/// [`build`]s `manifest`'s files in `side`, emptied first. The store's corrupt files are deleted from it: every checkpoint listing one is broken
/// anyway, and while it stays, later checkpoints would take it for a good copy and not
/// upload the file again.
async fn fetch(
    store: &CheckpointStore,
    manifest: &Manifest,
    side: &Path,
    local: &LocalFiles,
    progress: &Arc<AtomicU64>,
) -> Result<assemble::Assembled> {
    let dir = side.to_path_buf();
    tokio::task::spawn_blocking(move || -> Result<()> {
        if dir.exists() {
            std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
        }
        Ok(())
    })
    .await??;
    match build(store, manifest, side, local, progress).await {
        Ok(built) => Ok(built),
        Err(e) => {
            for corrupt in e.downcast_ref::<FilesFailed>().map_or(&[][..], |failed| &failed.corrupt) {
                store.delete_corrupt(corrupt).await.context("deleting a corrupt file from the store")?;
            }
            Err(e)
        }
    }
}

/// Builds `manifest`'s files in `dir` from `local` files and downloads from `store`,
/// each checked against the manifest, then opens the database there to check it holds
/// the manifest's offset; changes nothing in the store. A missing or corrupt file is a
/// [`FilesFailed`] naming it.
pub async fn build(
    store: &CheckpointStore,
    manifest: &Manifest,
    dir: &Path,
    local: &LocalFiles,
    progress: &Arc<AtomicU64>,
) -> Result<assemble::Assembled> {
    let built = assemble::assemble(store, manifest, dir, local, progress, &|| false).await?;
    let (dir, partition, offset) = (dir.to_path_buf(), manifest.partition, manifest.offset);
    tokio::task::spawn_blocking(move || -> Result<()> {
        let held = PartitionStore::open(&dir, partition)?.committed_offset()?;
        if held != offset {
            bail!("the manifest says offset {offset} but the restored state holds offset {held}");
        }
        Ok(())
    })
    .await??;
    Ok(built)
}

/// Puts the verified database at `side` where `live` is, by renames only: a crash at
/// any point leaves either the old database or the new one at `live`, or none (the
/// next start restores again); the old one is deleted only once it is out of the way.
fn replace_dir(side: &Path, live: &Path, old: &Path) -> Result<()> {
    if live.exists() {
        std::fs::rename(live, old).with_context(|| format!("moving {} aside", live.display()))?;
    }
    std::fs::rename(side, live).with_context(|| format!("moving {} to {}", side.display(), live.display()))?;
    if let Some(parent) = live.parent() {
        std::fs::File::open(parent)?.sync_all()?;
    }
    if old.exists() {
        std::fs::remove_dir_all(old).with_context(|| format!("removing older state {}", old.display()))?;
    }
    Ok(())
}

/// Reports restore progress until `done`: a redrawn bar on a terminal, a log line
/// every second otherwise.
fn spawn_progress(total: u64, progress: Arc<AtomicU64>, done: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let terminal = std::io::stderr().is_terminal();
        let started = Instant::now();
        let mut last_log = Instant::now();
        loop {
            let finished = done.load(Ordering::Relaxed);
            let fetched = progress.load(Ordering::Relaxed);
            let rate = fetched as f64 / started.elapsed().as_secs_f64().max(1e-9);
            let left = total.saturating_sub(fetched) as f64 / rate.max(1.0);
            let share = (fetched as f64 / total.max(1) as f64).min(1.0);
            let line = format!(
                "restoring {:>5.1}% {} of {} at {}/s, ~{left:.0}s left",
                share * 100.0,
                bytes(fetched),
                bytes(total),
                bytes(rate as u64)
            );
            if terminal {
                let filled = (share * 30.0) as usize;
                eprint!("\r[{}{}] {line}", "#".repeat(filled), ".".repeat(30 - filled));
                if finished {
                    eprintln!();
                }
            } else if last_log.elapsed() >= Duration::from_secs(1) {
                tracing::info!("{line}");
                last_log = Instant::now();
            }
            if finished {
                return;
            }
            std::thread::park_timeout(Duration::from_millis(100));
        }
    })
}

#[cfg(test)]
mod tests {
    //! A restore's decisions without a store: what the local state offers, what counts
    //! as corrupt, how a restored database takes the local one's place. Restores from a
    //! store — incremental, capped, falling back past corrupt files, a local file damaged
    //! since it was trusted — are `tests/all/checkpoint_restore.rs`'s.

    use super::*;
    use crate::state::Transaction;

    /// A database for partition 0 in `dir` that holds offset `offset`.
    fn database(dir: &Path, offset: u64) -> Result<()> {
        Transaction::new(PartitionStore::open(dir, 0)?, 1 << 20)?.commit(offset)
    }

    /// Without a store, the local database is all there is: its offset, or an error
    /// naming why it cannot be opened, never an empty start in its place.
    #[test]
    fn without_a_store_the_plan_is_the_local_state_or_an_error() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let state = StateDir::open(dir.path(), 1)?;
        let runtime = crate::objects::runtime()?;
        let planned = runtime.block_on(plan(Some(&state), &[0], None))?;
        assert_eq!((planned.partitions[0].local_offset, planned.bytes_to_fetch()), (None, 0), "no state yet");
        database(&state.partition_path(0), 42)?;
        let planned = runtime.block_on(plan(Some(&state), &[0], None))?;
        assert_eq!(planned.partitions[0].local(), RestoredFrom::Local { offset: 42 });
        std::fs::write(state.partition_path(0).join("CURRENT"), "garbage")?;
        let refused = runtime.block_on(plan(Some(&state), &[0], None)).expect_err("corrupt, nothing to restore");
        let said = format!("{refused:#}");
        assert!(
            said.contains("partition 0: the local state cannot be opened and there is no checkpoint store"),
            "{said}"
        );
        Ok(())
    }

    /// Corruption is RocksDB finding a database damaged; a database locked by another
    /// user is not, and is never replaced.
    #[test]
    fn only_a_damaged_database_counts_as_corrupt() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let (damaged, locked) = (dir.path().join("damaged"), dir.path().join("locked"));
        database(&damaged, 1)?;
        std::fs::write(damaged.join("CURRENT"), "garbage")?;
        let error = PartitionStore::open(&damaged, 0).err().expect("damaged");
        assert!(is_corruption(&error), "{error:#}");
        database(&locked, 1)?;
        let _open = PartitionStore::open(&locked, 0)?;
        let error = PartitionStore::open(&locked, 0).err().expect("locked by the first open");
        assert!(!is_corruption(&error), "{error:#}");
        Ok(())
    }

    /// The restored database takes the live one's place by renames, and the one it
    /// replaced is gone; with no live database, it simply moves in.
    #[test]
    fn a_restored_database_takes_the_live_ones_place() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let (side, live, old) = (dir.path().join("side"), dir.path().join("live"), dir.path().join("old"));
        for (path, text) in [(&side, "restored"), (&live, "replaced")] {
            std::fs::create_dir(path)?;
            std::fs::write(path.join("CURRENT"), text)?;
        }
        replace_dir(&side, &live, &old)?;
        assert_eq!(std::fs::read_to_string(live.join("CURRENT"))?, "restored");
        assert!(!side.exists() && !old.exists());
        std::fs::create_dir(&side)?;
        std::fs::remove_dir_all(&live)?;
        replace_dir(&side, &live, &old)?;
        assert!(live.exists() && !side.exists());
        Ok(())
    }
}
