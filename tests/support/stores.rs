//! What a job leaves on disk, read the way the tests check it: the local checkpoint
//! store's manifests and files, the state directory through `sluice state dump` and as
//! stored, and the offset stored with each partition's state.

use crate::binary::{run_ok, sluice};
use anyhow::{Context, Result};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The checkpoint manifests of `partition` in the local checkpoint store `store`,
/// oldest first; one a running job deletes while it is listed is left out.
pub fn checkpoint_manifests(store: &Path, partition: u32) -> Result<Vec<Value>> {
    let dir = store.join(format!("partition-{partition:04}")).join("manifests");
    let mut paths: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(entries) => entries.map(|e| Ok(e?.path())).collect::<Result<_>>()?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e).with_context(|| format!("listing {}", dir.display())),
    };
    paths.retain(|p| p.extension().is_some_and(|e| e == "json"));
    paths.sort();
    let mut manifests = Vec::new();
    for path in paths {
        // A running job's retention may delete a manifest between the listing and the read.
        match std::fs::read(&path) {
            Ok(bytes) => {
                manifests.push(serde_json::from_slice(&bytes).with_context(|| format!("parsing {}", path.display()))?)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }
    Ok(manifests)
}

/// The bytes of the files `manifest` lists: what restoring its checkpoint downloads.
pub fn manifest_bytes(manifest: &Value) -> u64 {
    manifest["files"].as_array().map_or(0, |files| files.iter().filter_map(|f| f["size"].as_u64()).sum())
}

/// [`manifest_bytes`] of `partition`'s newest checkpoint in the local checkpoint store
/// `store`.
pub fn newest_checkpoint_bytes(store: &Path, partition: u32) -> Result<u64> {
    let newest = checkpoint_manifests(store, partition)?.pop().context("a checkpoint of the partition")?;
    Ok(manifest_bytes(&newest))
}

/// The files of `partition` in the local checkpoint store `store`: object name -> size.
/// A file a running job deletes while it is listed is left out.
pub fn checkpoint_files(store: &Path, partition: u32) -> Result<BTreeMap<String, u64>> {
    let dir = store.join(format!("partition-{partition:04}")).join("files");
    let mut files = BTreeMap::new();
    match std::fs::read_dir(&dir) {
        Ok(entries) => {
            for entry in entries {
                let entry = entry?;
                match entry.metadata() {
                    Ok(metadata) => {
                        files.insert(entry.file_name().to_string_lossy().into_owned(), metadata.len());
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e).with_context(|| format!("reading {}", entry.path().display())),
                }
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("listing {}", dir.display())),
    }
    Ok(files)
}

/// The object names a manifest references (`name.checksum`, as the store names them).
pub fn manifest_objects(manifest: &Value) -> BTreeSet<String> {
    manifest["files"]
        .as_array()
        .map(|files| {
            files
                .iter()
                .map(|f| format!("{}.{}", f["name"].as_str().unwrap_or(""), f["checksum"].as_str().unwrap_or("")))
                .collect()
        })
        .unwrap_or_default()
}

/// The lines of `sluice state dump` of `state_dir` (entry, value and expiry each),
/// sorted: equal for two directories holding the same state.
pub fn dump_state_lines(state_dir: &Path) -> Result<Vec<String>> {
    let output = run_ok(sluice().args(["state", "dump", "--state-dir"]).arg(state_dir))?;
    let mut lines: Vec<String> = String::from_utf8(output.stdout)?.lines().map(str::to_string).collect();
    lines.sort();
    Ok(lines)
}

/// A partition's values as stored, in key order: record key, name and the operator's
/// bytes (the expiry header read off); timers left out.
pub type StoredEntries = Vec<(Vec<u8>, String, Vec<u8>)>;

/// The operators' bytes in `state_dir`, as stored, by partition: what `state dump`
/// decodes, byte for byte.
pub fn stored_values(state_dir: &Path) -> Result<Vec<StoredEntries>> {
    let mut partitions = Vec::new();
    for partition in 0.. {
        let path = state_dir.join(format!("partition-{partition:04}"));
        if !path.exists() {
            break;
        }
        let store = sluice::state::PartitionStore::open_read_only(&path, partition)?;
        let mut entries = Vec::new();
        for entry in store.entries() {
            let entry = entry?;
            if !sluice::state::is_reserved(&entry.name) {
                entries.push((entry.key, entry.name, entry.value));
            }
        }
        partitions.push(entries);
    }
    Ok(partitions)
}

/// What `sluice state dump` shows: key -> name -> value.
pub type StateDump = BTreeMap<String, BTreeMap<String, Value>>;

/// `sluice state dump` of `state_dir`.
pub fn dump_state(state_dir: &Path) -> Result<StateDump> {
    let output = run_ok(sluice().args(["state", "dump", "--state-dir"]).arg(state_dir))?;
    let mut state = StateDump::new();
    for line in String::from_utf8(output.stdout)?.lines() {
        let entry: Value = serde_json::from_str(line)?;
        let key = entry["key"].as_str().context("dump line without key")?.to_string();
        let name = entry["name"].as_str().context("dump line without name")?.to_string();
        state.entry(key).or_default().insert(name, entry["value"].clone());
    }
    Ok(state)
}

/// The offset stored with the state of each of the `partitions` partitions in
/// `state_dir`: the next record each would process.
pub fn stored_offsets(state_dir: &Path, partitions: u32) -> Result<Vec<u64>> {
    let state = sluice::state::StateDir::open_read_only(state_dir)?;
    (0..partitions).map(|p| state.open_partition(p)?.committed_offset()).collect()
}
