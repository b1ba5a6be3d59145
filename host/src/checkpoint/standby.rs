//! Standby copies: this host's copies of partitions other hosts own, followed from the
//! checkpoint store, so that taking one over fetches the files of the checkpoints
//! written since the copy's instead of the state.
//!
//! A copy is the files of one checkpoint in the state directory's
//! `standby/partition-NNNN/`, with the manifest they complete recorded last
//! (`sluice-standby.json`): a directory without a readable record is no copy. An update
//! builds the newest checkpoint's files in `partition-NNNN.next/` — the files the copy
//! (or the partition's own database, when this host ran it) already holds, hard-linked;
//! downloads for the rest ([`assemble`]) — records it, and puts it in
//! the copy's place. When the owner's garbage collection deletes a file mid-build, the
//! build fails and the next update starts from the newest manifest, reusing what was
//! fetched. A standby only reads the store: it never claims, writes or deletes.
//!
//! A restore of a partition this host takes over reuses its copy's files (see
//! [`restore`](super::restore)) and discards the copy once the partition runs here: its
//! files are the database's from then on. The other way round, the database of a
//! partition this host ran and no longer does is kept only while it serves: until the
//! copy holds the newest checkpoint (whose files it hard-links) or while it fits the
//! disk budget ([`drop_former`]); what a partition keeps here — copy, next copy and
//! former database — counts against the budget at its size on disk ([`kept_bytes`]). This module owns the copies and one update of
//! one copy; which partitions are followed, when, and never while one runs or starts
//! here, is the worker's (`worker::standby`).

use super::assemble::{self, LocalFiles, Origin};
use super::records::Manifest;
use super::store::CheckpointStore;
use crate::state::StateDir;
use anyhow::{Context, Result};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

/// The record of a complete copy, in its directory: the manifest of the checkpoint it
/// holds.
const RECORD: &str = "sluice-standby.json";

/// The checkpoint the standby copy of `partition` holds, if it has a complete one. A
/// record that cannot be read is no copy (logged): its files are still reused where
/// their checksums match, by the next update or restore.
pub fn recorded(state: &StateDir, partition: u32) -> Option<Manifest> {
    let path = state.standby_path(partition).join(RECORD);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!(partition, "standby copy record {} cannot be read: {e}", path.display());
            return None;
        }
    };
    match serde_json::from_slice::<Manifest>(&bytes) {
        Ok(manifest) if manifest.partition == partition => Some(manifest),
        Ok(manifest) => {
            tracing::warn!(
                partition,
                "standby copy record {} is of partition {}: not used",
                path.display(),
                manifest.partition
            );
            None
        }
        Err(e) => {
            tracing::warn!(partition, "standby copy record {} is not a checkpoint manifest: {e}", path.display());
            None
        }
    }
}

/// The local files a build for `partition` may reuse: its standby copy's (by their
/// recorded checksums; read, when the record is not), a next copy left half-built, and
/// the partition's own database.
/// Only listings: nothing is read until a file of the same name and size is wanted.
pub fn local_files(state: &StateDir, partition: u32) -> Result<LocalFiles> {
    let mut local = LocalFiles::default();
    match recorded(state, partition) {
        Some(copy) => local.add_recorded(&state.standby_path(partition), &copy.files, Origin::Standby),
        None => local.add_dir(&state.standby_path(partition), Origin::Local)?,
    }
    local.add_dir(&state.standby_next_path(partition), Origin::Local)?;
    local.add_dir(&state.partition_path(partition), Origin::Local)?;
    Ok(local)
}

/// Removes the standby copy of `partition` and any next one: the partition runs here,
/// and its database holds (hard links to) whatever they held that it needs.
pub fn discard(state: &StateDir, partition: u32) -> Result<()> {
    for dir in [state.standby_path(partition), state.standby_next_path(partition)] {
        if dir.exists() {
            std::fs::remove_dir_all(&dir).with_context(|| format!("removing standby copy {}", dir.display()))?;
        }
    }
    Ok(())
}

/// Removes every standby copy in `state`: this host keeps none.
pub fn discard_all(state: &StateDir) -> Result<()> {
    (0..state.partitions()).try_for_each(|partition| discard(state, partition))
}

/// The disk what this host keeps of `partition` while it does not run it takes: its
/// copy, a next copy half-built, and the database it ran it with, each file counted
/// once however many of them hard-link it. The caller holds the partition.
pub fn kept_bytes(state: &StateDir, partition: u32) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut seen = std::collections::HashSet::new();
    let mut dirs =
        vec![state.standby_path(partition), state.standby_next_path(partition), state.partition_path(partition)];
    let mut bytes = 0;
    while let Some(dir) = dirs.pop() {
        // A directory that is not there, or a file gone meanwhile, holds nothing.
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                dirs.push(entry.path());
            } else if seen.insert((meta.dev(), meta.ino())) {
                bytes += meta.len();
            }
        }
    }
    bytes
}

/// Removes the database of `partition`, which this host ran and no longer does, moved
/// aside first so that a crash halfway leaves a leftover the next start removes, never
/// a half-deleted database it would open. The caller holds the partition.
pub fn drop_former(state: &StateDir, partition: u32) -> Result<()> {
    let (live, aside) = (state.partition_path(partition), state.replaced_path(partition));
    if !live.exists() {
        return Ok(());
    }
    std::fs::rename(&live, &aside).with_context(|| format!("moving {} aside", live.display()))?;
    std::fs::remove_dir_all(&aside).with_context(|| format!("removing {}", aside.display()))
}

/// Removes the next copy of `partition`, when none is being built.
fn drop_next(state: &StateDir, partition: u32) -> Result<()> {
    let next = state.standby_next_path(partition);
    if next.exists() {
        std::fs::remove_dir_all(&next).with_context(|| format!("removing {}", next.display()))?;
    }
    Ok(())
}

/// Where one partition's standby copy stands after an [`update`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Followed {
    /// The newest checkpoint in the store; `None`: the store holds none.
    pub newest: Option<u64>,
    /// The checkpoint the copy holds.
    pub copy: Option<u64>,
    /// The copy's size.
    pub bytes: u64,
    /// Bytes downloaded by this update.
    pub fetched: u64,
    /// The newest checkpoint did not fit in the disk budget left, so the copy was not
    /// brought to it.
    pub over_budget: bool,
}

impl Followed {
    /// Checkpoints the copy is behind the newest (ids count up by one per checkpoint);
    /// `None` when there is no copy of an existing checkpoint.
    pub fn lag(&self) -> Option<u64> {
        match (self.newest, self.copy) {
            (None, _) => Some(0),
            (Some(newest), Some(copy)) => Some(newest.saturating_sub(copy)),
            (Some(_), None) => None,
        }
    }
}

/// Brings the standby copy of `partition` to the newest checkpoint in `store`, unless
/// that checkpoint is larger than `budget` bytes. A next copy left half-built (a crash,
/// an update that failed) is reused by the build, and removed where no build comes:
/// the copy is current, or the checkpoint does not fit. The caller holds the
/// partition: no start or worker uses it meanwhile. `stop` is asked between files (see
/// [`assemble::assemble`]); downloads add to `progress`.
pub async fn update(
    state: &StateDir,
    store: &CheckpointStore,
    partition: u32,
    budget: u64,
    progress: &Arc<AtomicU64>,
    stop: &(dyn Fn() -> bool + Sync),
) -> Result<Followed> {
    let copy = recorded(state, partition);
    let mut followed = Followed {
        newest: store.checkpoint_ids(partition).await?.last().copied(),
        copy: copy.as_ref().map(|m| m.id),
        bytes: copy.as_ref().map_or(0, Manifest::bytes),
        ..Followed::default()
    };
    let Some(newest) = followed.newest.filter(|&newest| followed.copy != Some(newest)) else {
        drop_next(state, partition)?;
        return Ok(followed);
    };
    let manifest = store.manifest(partition, newest).await?;
    if manifest.bytes() > budget {
        followed.over_budget = true;
        drop_next(state, partition)?;
        return Ok(followed);
    }
    let next = state.standby_next_path(partition);
    let local = local_files(state, partition)?;
    let built = assemble::assemble(store, &manifest, &next, &local, progress, stop).await?;
    let (live, record) = (state.standby_path(partition), manifest.clone());
    tokio::task::spawn_blocking(move || put_in_place(&next, &live, &record)).await??;
    followed.copy = Some(manifest.id);
    followed.bytes = manifest.bytes();
    followed.fetched = built.fetched;
    Ok(followed)
}

/// Records `manifest` in the complete copy at `next` and moves it to `live`, replacing
/// the copy there. A crash in between leaves no copy at `live` and a complete one at
/// `next`, which the next update reuses file by file.
fn put_in_place(next: &Path, live: &Path, manifest: &Manifest) -> Result<()> {
    let record = next.join(RECORD);
    let file = std::fs::File::create(&record).with_context(|| format!("creating {}", record.display()))?;
    serde_json::to_writer(&file, manifest)?;
    file.sync_all()?;
    std::fs::File::open(next)?.sync_all()?;
    if live.exists() {
        std::fs::remove_dir_all(live).with_context(|| format!("removing the older copy {}", live.display()))?;
    }
    std::fs::rename(next, live).with_context(|| format!("moving {} to {}", next.display(), live.display()))?;
    if let Some(parent) = live.parent() {
        std::fs::File::open(parent)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::layout::object_name;
    use crate::checkpoint::records::{self, ManifestFile};
    use crate::state::STATE_FORMAT;
    use std::collections::BTreeSet;

    /// A store in a directory, a state directory of one partition, and a way to write
    /// checkpoints of made-up files into the store.
    struct Fixture {
        dir: tempfile::TempDir,
        store: CheckpointStore,
        state: StateDir,
        runtime: tokio::runtime::Runtime,
    }

    impl Fixture {
        fn new() -> Result<Self> {
            let dir = tempfile::tempdir()?;
            let store = CheckpointStore::open(dir.path().join("store").to_str().expect("UTF-8 temp path"))?;
            let state = StateDir::open(&dir.path().join("state"), 1)?;
            Ok(Fixture { dir, store, state, runtime: crate::objects::runtime()? })
        }

        /// Uploads a file `name` of `size` bytes made of `fill`.
        fn upload(&self, name: &str, size: usize, fill: u8) -> Result<ManifestFile> {
            let local = self.dir.path().join(format!("{name}.{fill}"));
            std::fs::write(&local, vec![fill; size])?;
            let mut file = records::describe(&local)?;
            file.name = name.to_string();
            self.runtime.block_on(self.store.put_file(0, &file, local))?;
            Ok(file)
        }

        /// Writes checkpoint `id` listing `files` (uploaded or not).
        fn checkpoint(&self, id: u64, files: &[&ManifestFile]) -> Result<Manifest> {
            let manifest = Manifest {
                format: records::CHECKPOINT_FORMAT,
                state_format: STATE_FORMAT,
                partition: 0,
                id,
                offset: id * 100,
                entries: 0,
                operator: "probe@0".into(),
                created_at_ms: 0,
                uploaded_bytes: 0,
                files: files.iter().map(|&f| f.clone()).collect(),
            };
            self.runtime.block_on(self.store.put_manifest(&manifest))?;
            Ok(manifest)
        }

        fn update(&self, budget: u64) -> Result<Followed> {
            let progress = Arc::default();
            self.runtime.block_on(update(&self.state, &self.store, 0, budget, &progress, &|| false))
        }

        /// Every object in the store, with its size.
        fn listing(&self) -> Result<BTreeSet<(String, u64)>> {
            let store = self.dir.path().join("store");
            let mut found = BTreeSet::new();
            for entry in walk(&store)? {
                found.insert((entry.strip_prefix(&store)?.display().to_string(), std::fs::metadata(&entry)?.len()));
            }
            Ok(found)
        }
    }

    fn walk(dir: &Path) -> Result<Vec<std::path::PathBuf>> {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if path.is_dir() { files.extend(walk(&path)?) } else { files.push(path) }
        }
        Ok(files)
    }

    /// A copy follows the newest checkpoint, each update fetching only the files its
    /// copy lacks, and never changes the store.
    #[test]
    fn a_copy_follows_the_newest_checkpoint_fetching_only_what_it_lacks() -> Result<()> {
        let f = Fixture::new()?;
        assert_eq!(f.update(u64::MAX)?, Followed::default(), "no checkpoint yet: nothing to follow");
        let (a, b, m1) =
            (f.upload("000001.sst", 50_000, 1)?, f.upload("000002.sst", 30_000, 2)?, f.upload("MANIFEST-1", 100, 3)?);
        f.checkpoint(1, &[&a, &b, &m1])?;
        let before = f.listing()?;
        let first = f.update(u64::MAX)?;
        assert_eq!((first.copy, first.fetched, first.lag()), (Some(1), 80_100, Some(0)), "{first:?}");

        let (c, m2) = (f.upload("000003.sst", 7_000, 4)?, f.upload("MANIFEST-1", 120, 5)?);
        f.checkpoint(2, &[&a, &c, &m2])?;
        let before_second = f.listing()?;
        let second = f.update(u64::MAX)?;
        assert_eq!((second.copy, second.fetched), (Some(2), 7_120), "only the new table file and MANIFEST: {second:?}");
        assert_eq!(f.listing()?, before_second, "a standby never writes to the store");
        assert!(before.is_subset(&before_second));

        let copy = f.state.standby_path(0);
        let mut held: Vec<String> = std::fs::read_dir(&copy)?
            .map(|e| Ok(e?.file_name().to_string_lossy().into_owned()))
            .collect::<Result<_>>()?;
        held.sort();
        assert_eq!(held, ["000001.sst", "000003.sst", "MANIFEST-1", RECORD], "exactly checkpoint 2's files");
        for file in [&a, &c, &m2] {
            assert_eq!(records::describe(&copy.join(&file.name))?.checksum, file.checksum, "{}", file.name);
        }
        assert_eq!(recorded(&f.state, 0).map(|m| m.id), Some(2));
        assert_eq!(f.update(u64::MAX)?.fetched, 0, "up to date: nothing fetched");
        Ok(())
    }

    /// The owner's garbage collection deleting a file mid-build fails that build and
    /// leaves the older copy whole; the next update, from a newer checkpoint, completes
    /// and reuses what was fetched.
    #[test]
    fn a_file_collected_mid_build_leaves_the_copy_whole_and_a_newer_checkpoint_completes_it() -> Result<()> {
        let f = Fixture::new()?;
        let a = f.upload("000001.sst", 40_000, 1)?;
        f.checkpoint(1, &[&a])?;
        f.update(u64::MAX)?;
        let (b, gone) = (f.upload("000002.sst", 20_000, 2)?, f.upload("000003.sst", 10_000, 3)?);
        f.checkpoint(2, &[&a, &b, &gone])?;
        f.runtime.block_on(f.store.delete_file(0, &object_name(&gone)))?;
        let failed = f.update(u64::MAX).expect_err("a file of checkpoint 2 is gone");
        assert!(format!("{failed:#}").contains("000003.sst` is missing"), "{failed:#}");
        assert_eq!(recorded(&f.state, 0).map(|m| m.id), Some(1), "the complete older copy stays");

        let c = f.upload("000004.sst", 5_000, 4)?;
        f.checkpoint(3, &[&a, &b, &c])?;
        let followed = f.update(u64::MAX)?;
        assert_eq!(
            (followed.copy, followed.fetched),
            (Some(3), 5_000),
            "b was fetched by the failed build: {followed:?}"
        );
        Ok(())
    }

    /// A database file whose checksum this host remembered (a checkpoint uploaded it, a
    /// restore verified it) is reused without being read; a file put in its place since,
    /// under the same name and size, is read, and fetched when it differs.
    #[test]
    fn remembered_checksums_spare_reading_the_files_they_name() -> Result<()> {
        use std::io::Write;
        let f = Fixture::new()?;
        let a = f.upload("000001.sst", 40_000, 1)?;
        f.checkpoint(1, &[&a])?;
        let db = f.state.partition_path(0);
        std::fs::create_dir_all(&db)?;
        std::fs::write(db.join(&a.name), vec![1; 40_000])?;
        assemble::remember(&db, &db, std::slice::from_ref(&a))?;
        // The same inode, size and modification time, other bytes: only reading the file
        // would tell. (RocksDB never rewrites a table file.)
        let file = std::fs::OpenOptions::new().write(true).open(db.join(&a.name))?;
        let modified = file.metadata()?.modified()?;
        (&file).write_all(&[7; 10])?;
        file.set_modified(modified)?;
        assert_eq!(f.update(u64::MAX)?.fetched, 0, "reused by its remembered checksum, unread");

        discard(&f.state, 0)?;
        std::fs::remove_file(db.join(&a.name))?;
        std::fs::write(db.join(&a.name), vec![7; 40_000])?;
        assert_eq!(f.update(u64::MAX)?.fetched, 40_000, "another file under the name: read, and fetched");
        Ok(())
    }

    /// `CURRENT`, which RocksDB rewrites when it opens a database (a restore's verifying
    /// open too), is never trusted by a remembered checksum: a same-sized `CURRENT` of
    /// other bytes is read, and fetched.
    #[test]
    fn a_database_file_rocksdb_rewrites_is_read_not_trusted() -> Result<()> {
        let f = Fixture::new()?;
        let current = f.upload("CURRENT", 16, 1)?;
        f.checkpoint(1, &[&current])?;
        let db = f.state.partition_path(0);
        std::fs::create_dir_all(&db)?;
        std::fs::write(db.join("CURRENT"), vec![9; 16])?;
        assemble::remember(&db, &db, std::slice::from_ref(&current))?;
        assert_eq!(f.update(u64::MAX)?.fetched, 16, "another CURRENT of the same size: read, and fetched");
        Ok(())
    }

    /// A copy whose file was damaged after it was fetched is not trusted for that file,
    /// a record that cannot be read is no copy, and a checkpoint larger than the budget
    /// is not followed.
    #[test]
    fn damaged_copies_are_not_trusted_and_the_budget_is_kept() -> Result<()> {
        let f = Fixture::new()?;
        let (a, b) = (f.upload("000001.sst", 40_000, 1)?, f.upload("000002.sst", 20_000, 2)?);
        f.checkpoint(1, &[&a, &b])?;
        f.update(u64::MAX)?;
        let copy = f.state.standby_path(0);
        std::fs::write(copy.join("000001.sst"), vec![9; 10])?;
        let c = f.upload("000003.sst", 1_000, 3)?;
        f.checkpoint(2, &[&a, &b, &c])?;
        assert_eq!(f.update(u64::MAX)?.fetched, 41_000, "the truncated file is fetched again");

        std::fs::write(copy.join(RECORD), b"{ not a manifest")?;
        assert_eq!(recorded(&f.state, 0), None);
        let d = f.upload("000004.sst", 2_000, 4)?;
        f.checkpoint(3, &[&a, &b, &c, &d])?;
        let over = f.update(10_000)?;
        assert!(over.over_budget && over.copy.is_none() && over.lag().is_none(), "{over:?}");
        let within = f.update(u64::MAX)?;
        assert_eq!((within.copy, within.fetched), (Some(3), 2_000), "files are reused by checksum: {within:?}");
        Ok(())
    }
}
