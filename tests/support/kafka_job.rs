//! What the Kafka tests share: the seed of their generated positions, the config of a
//! job reading topic `positions`, hosts of such a job, and the inputs split to be
//! produced in parts.

use crate::binary::{Host, operator_wasm, run_job};
use anyhow::Result;
use sluice::record::Stop;
use sluice::worker::STOPPED;
use std::path::{Path, PathBuf};

/// The seed of the positions the Kafka tests generate.
pub const KAFKA_SEED: u64 = 5;

/// Splits the lines of `path` into `n` files of (nearly) equal length beside it.
pub fn split_lines(path: &Path, n: usize) -> Result<Vec<PathBuf>> {
    let text = std::fs::read_to_string(path)?;
    let lines: Vec<&str> = text.lines().collect();
    let mut files = Vec::new();
    for (i, chunk) in lines.chunks(lines.len().div_ceil(n)).enumerate() {
        let file = path.with_extension(format!("{i}.jsonl"));
        std::fs::write(&file, chunk.join("\n") + "\n")?;
        files.push(file);
    }
    Ok(files)
}

/// Writes `dir/kafka-source.toml`: a Kafka source reading topic `positions` from
/// `brokers`, with `more` source settings; the operator comes from `--operator`.
pub fn positions_source(dir: &Path, brokers: &str, more: &str) -> Result<PathBuf> {
    let config = dir.join("kafka-source.toml");
    std::fs::write(
        &config,
        format!(
            "[operator]\npath = \"set-by-flag.wasm\"\n[source]\nkind = \"kafka\"\nbrokers = \"{brokers}\"\n\
             topic = \"positions\"\n{more}"
        ),
    )?;
    Ok(config)
}

/// Spawns host `name`: vehicle-stats over `partitions` partitions in `dir/name` (its log
/// in `dir/name/log`), configured by `config`, checkpointing to `store` when given (else
/// beside its state), with `flags` after.
pub fn spawn_host(
    dir: &Path,
    name: &str,
    partitions: u32,
    config: &Path,
    store: Option<&Path>,
    flags: &[&str],
) -> Result<Host> {
    let home = dir.join(name);
    std::fs::create_dir_all(&home)?;
    let mut command = run_job(&operator_wasm("vehicle_stats"), &home, partitions);
    command.arg("--config").arg(config);
    if let Some(store) = store {
        command.arg("--checkpoint-store").arg(store);
    }
    Host::spawn(name, command.args(flags), &home.join("log"))
}

/// What a host logs when a partition of it hands over in a graceful stop.
pub fn handed_over() -> String {
    format!("{STOPPED} ({:?})", Stop::Handover)
}
