//! `sluice config --reference`: the annotated configuration reference on stdout.
//!
//! This module owns only the command; the reference, and what it says, is
//! `sluice::config`'s.

use anyhow::Result;

/// `sluice config --reference`
pub fn print_reference() -> Result<()> {
    Ok(sluice::config::write_reference(std::io::stdout().lock())?)
}
