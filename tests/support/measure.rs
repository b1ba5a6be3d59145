//! Clocks for the benchmarks: wall time and the CPU time of the whole process.

use anyhow::{Context, Result};
use sluice::probes::process_cpu;
use std::time::{Duration, Instant};

/// Wall time and the CPU time of every thread of this process (RocksDB's background
/// threads included), from a start to a stop.
pub struct CpuClock {
    wall: Instant,
    cpu: Duration,
}

impl CpuClock {
    /// Starts both clocks.
    pub fn start() -> Result<Self> {
        Ok(CpuClock { wall: Instant::now(), cpu: process_cpu().context("reading /proc/self/stat")? })
    }

    /// The wall time and the CPU time since the start.
    pub fn stop(self) -> Result<(Duration, Duration)> {
        let cpu = process_cpu().context("reading /proc/self/stat")?;
        Ok((self.wall.elapsed(), cpu.saturating_sub(self.cpu)))
    }
}
