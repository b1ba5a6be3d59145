//! What the benchmarks that run whole jobs share (each includes it as `mod common`).

use sluice::config::{Config, SinkConfig, SourceConfig};
use sluice_e2e::operator_wasm;
use std::path::Path;

/// A job of vehicle-stats over `source` that writes everything under `dir` (outputs to
/// `dir/out.jsonl`, dead letters to `dir/dead.jsonl`, state to `dir/state`), without the
/// running summary.
pub fn job_config(dir: &Path, source: SourceConfig) -> Config {
    let mut config = Config::for_operator(&operator_wasm("vehicle_stats"));
    config.source = source;
    config.sink = SinkConfig::File { path: dir.join("out.jsonl") };
    config.dead_letter.path = Some(dir.join("dead.jsonl"));
    config.state.dir = dir.join("state");
    config.report.interval = std::time::Duration::ZERO;
    config
}
