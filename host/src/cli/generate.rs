//! `sluice generate`: the fleet generator's records, as JSONL on stdout.
//!
//! This module owns only the command: the generator and its records are the library's
//! (`sluice::source::generator`), as a `generator` source of a job reads them.

use super::args::FleetArgs;
use anyhow::Result;
use sluice::config;
use sluice::source::generator::{Fleet, FleetOptions};
use std::io::Write;

/// `sluice generate`
pub fn generate(args: &FleetArgs) -> Result<()> {
    config::check_vehicles("--vehicles", args.vehicles)?;
    let options = FleetOptions { vehicles: args.vehicles, count: Some(args.count), seed: args.seed, churn: args.churn };
    let fleet = Fleet::new(&options);
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for record in fleet {
        out.write_all(&record?.value)?;
        out.write_all(b"\n")?;
    }
    Ok(out.flush()?)
}
