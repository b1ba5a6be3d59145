//! `sluice checkpoints list`, `verify` and `estimate`: a checkpoint store, inspected
//! from outside a job.
//!
//! This module owns the commands: the store opened (it must already hold checkpoints),
//! the tables and verdicts printed, and the errors that make the exit code 1. It does
//! not own the store's layout, its manifests or verification
//! (`sluice::checkpoint::CheckpointStore`), nor the restore plan an estimate prints
//! (`sluice::checkpoint::restore`).

use super::args::{CheckpointsCommand, StoreArgs};
use anyhow::{Result, anyhow, bail};
use sluice::checkpoint::{self, CheckpointStore, bytes};
use sluice::state::StateDir;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};
use tokio::runtime::Runtime;

/// `sluice checkpoints …`
pub fn checkpoints(command: CheckpointsCommand) -> Result<()> {
    let runtime = sluice::objects::runtime()?;
    match command {
        CheckpointsCommand::List { store, partition } => list_checkpoints(&runtime, &store.open(&runtime)?, partition),
        CheckpointsCommand::Verify { store, partition, checkpoint } => {
            verify_checkpoint(&runtime, &store.open(&runtime)?.0, partition, checkpoint)
        }
        CheckpointsCommand::Estimate { store, state_dir } => {
            estimate_restore(&runtime, &store.open(&runtime)?, state_dir.as_deref())
        }
    }
}

impl StoreArgs {
    /// Opens the store and reads how many partitions its checkpoints are of.
    fn open(&self, runtime: &Runtime) -> Result<(CheckpointStore, u32)> {
        let store = CheckpointStore::open_existing(&self.store)?;
        match runtime.block_on(store.store_manifest())? {
            Some(manifest) => Ok((store, manifest.partitions)),
            None => bail!("{} holds no checkpoints (no sluice-checkpoints.json)", self.store),
        }
    }
}

/// `sluice checkpoints list`
fn list_checkpoints(runtime: &Runtime, (store, partitions): &(CheckpointStore, u32), only: Option<u32>) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "partition  checkpoint      offset    entries  files        size    uploaded  created                 operator"
    )?;
    for partition in (0..*partitions).filter(|p| only.is_none_or(|only| only == *p)) {
        for id in runtime.block_on(store.checkpoint_ids(partition))? {
            match runtime.block_on(store.manifest(partition, id)) {
                Ok(m) => writeln!(
                    out,
                    "{partition:>9}  {id:>10}  {:>10}  {:>9}  {:>5}  {:>10}  {:>10}  {}  {}",
                    m.offset,
                    m.entries,
                    m.files.len(),
                    bytes(m.bytes()),
                    bytes(m.uploaded_bytes),
                    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(m.created_at_ms)),
                    m.operator
                )?,
                Err(e) => writeln!(out, "{partition:>9}  {id:>10}  unreadable: {e:#}")?,
            }
        }
    }
    Ok(())
}

/// `sluice checkpoints verify`
fn verify_checkpoint(runtime: &Runtime, store: &CheckpointStore, partition: u32, id: Option<u64>) -> Result<()> {
    let mut out = std::io::stdout().lock();
    let id = match id {
        Some(id) => id,
        None => *runtime
            .block_on(store.checkpoint_ids(partition))?
            .last()
            .ok_or_else(|| anyhow!("partition {partition} has no checkpoints in {}", store.url()))?,
    };
    let manifest = runtime.block_on(store.manifest(partition, id))?;
    let mut bad = 0;
    for file in &manifest.files {
        match runtime.block_on(store.verify(partition, file)) {
            Ok(()) => writeln!(out, "ok   {} ({})", file.name, bytes(file.size))?,
            Err(e) => {
                bad += 1;
                writeln!(out, "BAD  {e:#}")?;
            }
        }
    }
    if bad > 0 {
        bail!(
            "checkpoint {id} of partition {partition}: {bad} of {} files are missing or corrupt",
            manifest.files.len()
        );
    }
    writeln!(
        out,
        "checkpoint {id} of partition {partition} (offset {}): all {} files verified",
        manifest.offset,
        manifest.files.len()
    )?;
    Ok(())
}

/// `sluice checkpoints estimate`
fn estimate_restore(
    runtime: &Runtime,
    (store, partitions): &(CheckpointStore, u32),
    state_dir: Option<&Path>,
) -> Result<()> {
    let mut out = std::io::stdout().lock();
    // A directory a job has yet to write (missing or empty) holds no local state.
    let written = |dir: &&Path| std::fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_some());
    let state = match state_dir.filter(written) {
        Some(dir) => Some(StateDir::open_read_only(dir)?),
        None => None,
    };
    if let Some(state) = &state
        && state.partitions() != *partitions
    {
        bail!(
            "state directory {} holds {} partitions but the store's checkpoints are of {partitions}",
            state_dir.expect("opened").display(),
            state.partitions()
        );
    }
    let all: Vec<u32> = (0..*partitions).collect();
    writeln!(out, "{}", runtime.block_on(checkpoint::restore::plan(state.as_ref(), &all, Some(store)))?)?;
    Ok(())
}
