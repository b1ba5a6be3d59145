//! One partition of large, incompressible state and its checkpoints, built through the
//! library rather than a job (a job would take minutes to write GiBs): what the benches
//! that restore large state share (each includes it as `mod large_state`).

use anyhow::Result;
use sluice::checkpoint::{CheckpointSettings, CheckpointStore, Checkpointer, restore};
use sluice::record::RestoredFrom;
use sluice::state::{StateDir, Transaction};
use sluice::stats::PartitionStats;
use std::path::Path;
use std::time::Duration;
use tokio::runtime::Runtime;

/// The size of every value written.
pub const VALUE_BYTES: u64 = 1024;

/// Writes a fresh incompressible value of [`VALUE_BYTES`] under each of `keys` in
/// partition 0 of `state` (`seed` chooses the bytes), committing every 4,096 keys, each
/// commit one offset on from the partition's committed offset.
pub fn write_values(state: &StateDir, keys: impl Iterator<Item = u64>, seed: u64) -> Result<()> {
    let partition = state.open_partition(0)?;
    let mut offset = partition.committed_offset()?;
    let mut txn = Transaction::new(partition, 0)?;
    let mut random = seed | 1;
    let mut value = vec![0u8; VALUE_BYTES as usize];
    let mut pending = 0;
    for key in keys {
        txn.scope(format!("vehicle-{key:09}").as_bytes());
        for chunk in value.chunks_mut(8) {
            random ^= random << 13;
            random ^= random >> 7;
            random ^= random << 17;
            chunk.copy_from_slice(&random.to_le_bytes());
        }
        txn.put("summary", value.clone());
        txn.end_record(true);
        pending += 1;
        if pending == 4096 {
            offset += 1;
            txn.commit(offset)?;
            pending = 0;
        }
    }
    txn.commit(offset + 1)?;
    Ok(())
}

/// Takes a checkpoint of partition 0 of `state` into `store`, numbered on from the
/// store's, keeping the newest `retain`.
pub fn checkpoint(runtime: &Runtime, state: &StateDir, store: &CheckpointStore, retain: usize) -> Result<()> {
    let plan = runtime.block_on(restore::plan(Some(state), &[0], Some(store)))?;
    let partition = state.open_partition(0)?;
    let settings = CheckpointSettings {
        interval: Duration::ZERO,
        retain,
        upload_bytes_per_s: None,
        host: sluice::checkpoint::host_id().to_string(),
    };
    let restored = RestoredFrom::Local { offset: partition.committed_offset()? };
    let mut checkpointer = Checkpointer::new(
        store.clone(),
        runtime.handle().clone(),
        &plan.partitions[0],
        &restored,
        settings,
        state.snapshot_path(0),
        "bench".into(),
    );
    checkpointer.finish(&partition, &PartitionStats::new(0, 0, "bench"))
}

/// The bytes of the files under `dir`.
pub fn dir_bytes(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() { dir_bytes(&entry.path())? } else { meta.len() };
    }
    Ok(total)
}
