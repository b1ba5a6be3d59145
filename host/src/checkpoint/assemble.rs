//! Building a checkpoint's files in a local directory: each file from a local copy
//! that matches it by name, size and checksum, from the store otherwise.
//!
//! A restore and a standby copy ([`standby`](super::standby)) are both built this way,
//! so a host fetches what it lacks, not the state: a database one checkpoint behind
//! the newest shares all but that checkpoint's new table files with it. RocksDB never
//! changes a table file (`*.sst`, `*.blob`) once written, so a matching one is
//! hard-linked — no bytes copied, no space used twice; the other files (`CURRENT`,
//! `MANIFEST-*`, `OPTIONS-*`) are small and RocksDB appends to or replaces them, so
//! they are copied.
//!
//! A local file is trusted by its checksum: one recorded when it was downloaded and
//! verified (a standby copy's record) is checked by size only, which keeps a warm
//! takeover from reading the state; so is a database's file whose checksum this host
//! computed when a checkpoint uploaded it or a restore verified it ([`remember`]: by
//! name, size, inode and modification time, in the database's directory); any other (a copy left
//! half-built, a database's files no checkpoint of this host saw) is read to compute
//! its checksum first — still a local read instead of a download. Nothing here writes
//! to the store.
//!
//! This module owns neither where the directory is (a restore's side directory, a
//! standby's next copy) nor what becomes of it once complete.

use super::records::{Manifest, ManifestFile};
use super::store::{CheckpointStore, CorruptFile};
use crate::checksum;
use crate::objects;
use anyhow::{Context, Result};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

/// Files downloaded at once per directory built.
const PARALLEL_DOWNLOADS: usize = 4;

/// The record, in a database's directory, of the checksums this host computed of its
/// files ([`remember`]). RocksDB leaves files it does not name alone, and a restore that
/// replaces the directory takes the record with it.
const REMEMBERED: &str = "sluice-checksums.json";

/// A file whose checksum this host computed, as [`REMEMBERED`] lists it: the inode and
/// the modification time tell it from another file given the same name and size later,
/// or from the file written to since.
#[derive(Debug, Serialize, Deserialize)]
struct RememberedFile {
    name: String,
    size: u64,
    inode: u64,
    modified_ns: i64,
    checksum: String,
}

/// Whether the file named `name` is a table file (`*.sst`, `*.blob`), which RocksDB
/// never changes once written.
fn is_table(name: &str) -> bool {
    name.ends_with(".sst") || name.ends_with(".blob")
}

/// What identifies a file's bytes on this host without reading them.
fn identity(name: &str, meta: &std::fs::Metadata) -> (String, u64, u64, i64) {
    let modified_ns = meta.mtime().saturating_mul(1_000_000_000).saturating_add(meta.mtime_nsec());
    (name.to_string(), meta.len(), meta.ino(), modified_ns)
}

/// Where a reused file came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// A standby copy of the partition (see [`standby`](super::standby)).
    Standby,
    /// A database or half-built copy on this host: the partition's own, or a standby
    /// copy's next one.
    Local,
}

/// One local file that may stand in for a checkpoint's file.
#[derive(Debug, Clone)]
struct LocalFile {
    path: PathBuf,
    size: u64,
    /// Recorded when it was downloaded and verified; `None`: read it to know.
    checksum: Option<String>,
    origin: Origin,
}

/// The local files a directory may be built from, by name.
#[derive(Debug, Clone, Default)]
pub struct LocalFiles {
    by_name: HashMap<String, Vec<LocalFile>>,
}

impl LocalFiles {
    /// Adds the files of `dir`, a copy complete for `files` whose checksums were
    /// verified when they were downloaded.
    pub fn add_recorded(&mut self, dir: &Path, files: &[ManifestFile], origin: Origin) {
        for file in files {
            let local = LocalFile {
                path: dir.join(&file.name),
                size: file.size,
                checksum: Some(file.checksum.clone()),
                origin,
            };
            self.by_name.entry(file.name.clone()).or_default().push(local);
        }
    }

    /// Adds every file in `dir`, if it exists; their checksums are those [`remember`]ed
    /// for them, or read when wanted.
    pub fn add_dir(&mut self, dir: &Path, origin: Origin) -> Result<()> {
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e).with_context(|| format!("listing {}", dir.display())),
        };
        // A record that cannot be read remembers nothing: the files are read instead.
        let remembered: HashMap<(String, u64, u64, i64), String> = std::fs::read(dir.join(REMEMBERED))
            .ok()
            .and_then(|bytes| serde_json::from_slice::<Vec<RememberedFile>>(&bytes).ok())
            .into_iter()
            .flatten()
            .map(|f| ((f.name, f.size, f.inode, f.modified_ns), f.checksum))
            .collect();
        for entry in entries {
            let entry = entry?;
            let (Ok(name), Ok(meta)) = (entry.file_name().into_string(), entry.metadata()) else { continue };
            if meta.is_file() {
                let checksum = remembered.get(&identity(&name, &meta)).cloned();
                let local = LocalFile { path: entry.path(), size: meta.len(), checksum, origin };
                self.by_name.entry(name).or_default().push(local);
            }
        }
        Ok(())
    }

    /// The same files, each read to compute its checksum before it stands in for a
    /// checkpoint's: none trusted by a checksum recorded for it. For a build a recorded
    /// checksum misled — a file damaged since without its size changing, which RocksDB
    /// then finds corrupt.
    pub fn read_all(&self) -> LocalFiles {
        let mut read = self.clone();
        read.by_name.values_mut().flatten().for_each(|local| local.checksum = None);
        read
    }

    /// The bytes of `files` these local files likely hold: those with a file of the
    /// same name and size (a prediction: checksums are not read).
    pub fn likely_held(&self, files: &[ManifestFile]) -> u64 {
        let held = |f: &&ManifestFile| {
            self.by_name.get(&f.name).is_some_and(|locals| {
                locals.iter().any(|l| l.size == f.size && l.checksum.as_ref().is_none_or(|c| *c == f.checksum))
            })
        };
        files.iter().filter(held).map(|f| f.size).sum()
    }

    /// Puts `file` at `dest` from a local file that matches it; where it came from, or
    /// `None` when none does.
    fn place(&self, file: &ManifestFile, dest: &Path) -> Result<Option<Origin>> {
        for local in self.by_name.get(&file.name).into_iter().flatten() {
            if !local.holds(file)? {
                continue;
            }
            if !(is_table(&file.name) && std::fs::hard_link(&local.path, dest).is_ok()) {
                std::fs::copy(&local.path, dest)
                    .with_context(|| format!("copying {} to {}", local.path.display(), dest.display()))?;
                std::fs::File::open(dest)?.sync_all()?;
            }
            return Ok(Some(local.origin));
        }
        Ok(None)
    }
}

impl LocalFile {
    /// Whether this file holds `file`'s bytes: by the checksum recorded for it and its
    /// size now, or, with none recorded, by reading it.
    fn holds(&self, file: &ManifestFile) -> Result<bool> {
        let size = std::fs::metadata(&self.path).map(|m| m.len()).ok();
        match &self.checksum {
            Some(recorded) if *recorded != file.checksum => Ok(false),
            Some(_) if size != Some(file.size) => {
                if self.origin == Origin::Standby {
                    tracing::warn!(
                        "standby copy file {} is missing or damaged ({size:?} bytes; {} recorded when it was \
                         fetched): fetching it again",
                        self.path.display(),
                        file.size
                    );
                }
                Ok(false)
            }
            Some(_) => Ok(true),
            None => Ok(size == Some(file.size) && checksum::of_file(&self.path)?.1 == file.checksum),
        }
    }
}

/// Records in database directory `db` the checksums of the table files of `files`,
/// which this host computed or verified, for the files of the same names in `links` —
/// `db` itself, or a checkpoint's snapshot of hard links into it — so that a later build
/// reuses them without reading them while they are the same files, untouched
/// ([`LocalFiles::add_dir`]). Files missing from `links` are left out, and so are the
/// others (`CURRENT`, `MANIFEST-*`, `OPTIONS-*`): RocksDB rewrites them in place when it
/// opens the database (a restore's verifying open among them), keeping their name and
/// even their size, so a checksum recorded for one may not be its bytes by then.
pub fn remember(db: &Path, links: &Path, files: &[ManifestFile]) -> Result<()> {
    let remembered: Vec<RememberedFile> = files
        .iter()
        .filter(|f| is_table(&f.name))
        .filter_map(|f| {
            let meta = std::fs::metadata(links.join(&f.name)).ok()?;
            let (name, size, inode, modified_ns) = identity(&f.name, &meta);
            (size == f.size).then(|| RememberedFile { name, size, inode, modified_ns, checksum: f.checksum.clone() })
        })
        .collect();
    let (record, tmp) = (db.join(REMEMBERED), db.join(format!("{REMEMBERED}.tmp")));
    std::fs::write(&tmp, serde_json::to_vec(&remembered)?).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &record).with_context(|| format!("writing {}", record.display()))
}

/// What [`assemble`] did: bytes by where they came from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Assembled {
    /// Downloaded from the store.
    pub fetched: u64,
    /// Reused from a standby copy.
    pub from_standby: u64,
    /// Reused from other local files (already in the directory, or a database's own).
    pub from_local: u64,
}

/// Files of the store that a build could not use.
#[derive(Debug, thiserror::Error)]
#[error("{} of {total} files failed: {}", failures.len(), failures.join("; "))]
pub struct FilesFailed {
    /// The files the manifest lists.
    pub total: usize,
    /// Every failure, described: the operator fixing the store needs the whole list.
    pub failures: Vec<String>,
    /// Of those, the files found corrupt.
    pub corrupt: Vec<CorruptFile>,
}

/// Building was given up: the caller's `stop` said so between two files.
#[derive(Debug, thiserror::Error)]
#[error("building the copy was given up")]
pub struct Interrupted;

/// Makes `dir` hold exactly `manifest`'s files: those already there and matching are
/// kept, others come from `local` when it holds them, the rest are downloaded from
/// `store` (adding to `progress`). `stop` is asked before each file; when it says so the
/// build ends in [`Interrupted`], leaving what it built for a next try to reuse. A
/// missing or corrupt file in the store fails the build ([`FilesFailed`]).
pub async fn assemble(
    store: &CheckpointStore,
    manifest: &Manifest,
    dir: &Path,
    local: &LocalFiles,
    progress: &Arc<AtomicU64>,
    stop: &(dyn Fn() -> bool + Sync),
) -> Result<Assembled> {
    // In place rather than on a blocking thread, to ask `stop` between files: reading
    // local files to checksum them can take seconds. (The runtime is multi-threaded.)
    let (mut assembled, missing) = tokio::task::block_in_place(|| place_local(&manifest.files, dir, local, stop))?;
    let downloads = missing.iter().map(|file| async move {
        if stop() {
            return Err(Interrupted.into());
        }
        store.download(manifest.partition, file, dir.join(&file.name), progress.clone()).await
    });
    let results: Vec<Result<()>> =
        futures::stream::iter(downloads).buffer_unordered(PARALLEL_DOWNLOADS).collect().await;
    let mut failures: Vec<anyhow::Error> = results.into_iter().filter_map(Result::err).collect();
    if let Some(first) = failures.iter().position(|e| objects::is_unavailable(e) || e.is::<Interrupted>()) {
        return Err(failures.swap_remove(first));
    }
    if !failures.is_empty() {
        let described = failures.iter().map(|e| format!("{e:#}")).collect();
        let corrupt = failures.into_iter().filter_map(|e| e.downcast::<CorruptFile>().ok()).collect();
        return Err(FilesFailed { total: manifest.files.len(), failures: described, corrupt }.into());
    }
    assembled.fetched = missing.iter().map(|f| f.size).sum();
    Ok(assembled)
}

/// The blocking half of [`assemble`]: keeps what `dir` holds of `files`, places what
/// `local` holds, removes everything else; returns the bytes placed and the files left
/// to download.
fn place_local(
    files: &[ManifestFile],
    dir: &Path,
    local: &LocalFiles,
    stop: &dyn Fn() -> bool,
) -> Result<(Assembled, Vec<ManifestFile>)> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut already = LocalFiles::default();
    already.add_dir(dir, Origin::Local)?;
    let wanted: HashMap<&str, &ManifestFile> = files.iter().map(|f| (f.name.as_str(), f)).collect();
    for (name, found) in &already.by_name {
        // A file that cannot be read is not kept: it is fetched again.
        let keep = wanted.get(name.as_str()).is_some_and(|f| found[0].holds(f).unwrap_or(false));
        if !keep {
            std::fs::remove_file(&found[0].path).with_context(|| format!("removing {}", found[0].path.display()))?;
        }
    }
    let mut assembled = Assembled::default();
    let mut missing = Vec::new();
    for file in files {
        if stop() {
            return Err(Interrupted.into());
        }
        let dest = dir.join(&file.name);
        let origin = match dest.exists() {
            true => Some(Origin::Local),
            false => local.place(file, &dest)?,
        };
        match origin {
            Some(Origin::Standby) => assembled.from_standby += file.size,
            Some(Origin::Local) => assembled.from_local += file.size,
            None => missing.push(file.clone()),
        }
    }
    Ok((assembled, missing))
}

#[cfg(test)]
mod tests {
    //! What a build takes from local files, without a store: a build that downloads is
    //! `restore`'s tests' and `tests/all/checkpoint_restore.rs`'s.

    use super::*;

    /// `name` holding `bytes` in `dir`, and the manifest's entry for it.
    fn file(dir: &Path, name: &str, bytes: &[u8]) -> Result<ManifestFile> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join(name), bytes)?;
        Ok(ManifestFile { name: name.to_string(), size: bytes.len() as u64, checksum: checksum::of_bytes(bytes) })
    }

    /// Overwrites `path` in place with as many other bytes, its modification time kept:
    /// damage its size and time do not show.
    fn damage(path: &Path) -> Result<()> {
        let file = std::fs::OpenOptions::new().write(true).open(path)?;
        let modified = file.metadata()?.modified()?;
        std::io::Write::write_all(&mut &file, &vec![0xff; file.metadata()?.len() as usize])?;
        file.set_modified(modified)?;
        Ok(())
    }

    fn never() -> bool {
        false
    }

    /// A standby copy's file is trusted by its recorded checksum and its size — a table
    /// file linked, not copied — one whose size changed is not; [`LocalFiles::read_all`]
    /// reads every file first, so a damaged one of the right size is refused too.
    #[test]
    fn a_recorded_file_is_trusted_by_its_size_until_every_file_is_read() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let copy = dir.path().join("copy");
        let table = file(&copy, "000009.sst", b"table bytes")?;
        let shrunk = file(&copy, "000010.sst", b"more table bytes")?;
        let options = file(&copy, "OPTIONS-000007", b"options")?;
        let files = [table.clone(), shrunk.clone(), options.clone()];
        let mut local = LocalFiles::default();
        local.add_recorded(&copy, &files, Origin::Standby);
        std::fs::write(copy.join("000010.sst"), b"short")?;
        damage(&copy.join("000009.sst"))?;

        let built = dir.path().join("built");
        let (assembled, missing) = place_local(&files, &built, &local, &never)?;
        assert_eq!(missing, std::slice::from_ref(&shrunk), "a size that changed is fetched again");
        assert_eq!(assembled.from_standby, table.size + options.size);
        let linked =
            std::fs::metadata(built.join("000009.sst"))?.ino() == std::fs::metadata(copy.join("000009.sst"))?.ino();
        assert!(linked, "a table file is linked");
        let copied = std::fs::metadata(built.join("OPTIONS-000007"))?.ino()
            != std::fs::metadata(copy.join("OPTIONS-000007"))?.ino();
        assert!(copied, "RocksDB rewrites the others: copied");

        let again = dir.path().join("again");
        let (assembled, missing) = place_local(&files, &again, &local.read_all(), &never)?;
        assert_eq!(missing, [table, shrunk], "read, the damaged file is fetched too");
        assert_eq!(assembled.from_standby, options.size);
        Ok(())
    }

    /// A database's table file whose checksum this host [`remember`]ed is trusted while
    /// it is the same file, untouched; once written to, it is read (and refused when it
    /// no longer holds the checkpoint's bytes). Files without a record are read.
    #[test]
    fn a_remembered_file_is_trusted_while_untouched() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let db = dir.path().join("db");
        let table = file(&db, "000012.sst", b"a table")?;
        let current = file(&db, "CURRENT", b"MANIFEST-000005\n")?;
        remember(&db, &db, &[table.clone(), current.clone()])?;
        let record: serde_json::Value = serde_json::from_slice(&std::fs::read(db.join(REMEMBERED))?)?;
        assert_eq!(record.as_array().map(Vec::len), Some(1), "only table files are remembered: {record}");

        let mut local = LocalFiles::default();
        local.add_dir(&db, Origin::Local)?;
        let trusted = local.by_name["000012.sst"][0].checksum.clone();
        assert_eq!(trusted, Some(table.checksum.clone()), "remembered, trusted without a read");
        assert_eq!(local.by_name["CURRENT"][0].checksum, None, "read when wanted");
        let (assembled, missing) =
            place_local(&[table.clone(), current.clone()], &dir.path().join("a"), &local, &never)?;
        assert!(missing.is_empty() && assembled.from_local == table.size + current.size);

        // Written to since (a new modification time): no longer the remembered file.
        std::thread::sleep(std::time::Duration::from_millis(10));
        std::fs::write(db.join("000012.sst"), b"b table")?;
        let mut local = LocalFiles::default();
        local.add_dir(&db, Origin::Local)?;
        assert_eq!(local.by_name["000012.sst"][0].checksum, None);
        let (_, missing) = place_local(std::slice::from_ref(&table), &dir.path().join("b"), &local, &never)?;
        assert_eq!(missing, [table], "read, it no longer holds the checkpoint's bytes");
        Ok(())
    }

    /// A directory built before keeps the files that match, drops the others, and a
    /// build asked to stop ends between two files.
    #[test]
    fn a_half_built_directory_keeps_what_matches_and_a_build_stops_when_told() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let built = dir.path().join("built");
        let kept = file(&built, "000001.sst", b"kept")?;
        file(&built, "000002.sst", b"stale")?;
        let wanted = ManifestFile { name: "000003.sst".into(), size: 3, checksum: checksum::of_bytes(b"new") };
        let (assembled, missing) =
            place_local(&[kept.clone(), wanted.clone()], &built, &LocalFiles::default(), &never)?;
        assert_eq!((assembled.from_local, missing), (kept.size, vec![wanted.clone()]));
        assert!(!built.join("000002.sst").exists(), "a file no longer wanted is removed");
        let stopped = place_local(&[kept, wanted], &built, &LocalFiles::default(), &|| true);
        assert!(stopped.expect_err("told to stop").is::<Interrupted>());
        Ok(())
    }
}
