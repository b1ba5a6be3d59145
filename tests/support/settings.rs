//! The sizes the host's benchmarks take from `SLUICE_BENCH_*` environment variables.

use anyhow::{Result, anyhow};
use std::env::VarError;
use std::fmt::Display;
use std::str::FromStr;

/// Environment variable `name` parsed, or `default` where it is unset; fails naming the
/// variable where its value does not parse.
pub fn bench_setting<T: FromStr>(name: &str, default: T) -> Result<T>
where
    T::Err: Display,
{
    match std::env::var(name) {
        Ok(value) => value.parse().map_err(|e| anyhow!("{name}={value}: {e}")),
        Err(VarError::NotPresent) => Ok(default),
        Err(e) => Err(anyhow!("{name}: {e}")),
    }
}
