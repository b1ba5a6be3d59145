//! `sluice state dump`: every entry of a state directory, as JSONL on stdout.
//!
//! This module owns only the command: it opens the directory read-only, so a running
//! host's state can be dumped, and writes each entry in the line
//! `sluice::lines::state_line` makes of it (the line `sluice test --state` reads back).
//! It does not own the state or the line.

use anyhow::Result;
use sluice::state::StateDir;
use std::io::Write;
use std::path::Path;

/// `sluice state dump`
pub fn dump_state(state_dir: &Path) -> Result<()> {
    let dir = StateDir::open_read_only(state_dir)?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    // A partition never started here has no database, so no entries.
    for partition in (0..dir.partitions()).filter(|&p| dir.partition_path(p).exists()) {
        dir.open_partition(partition)?.dump(&mut out)?;
    }
    Ok(out.flush()?)
}
