//! Operators in TypeScript, through the real binary: vehicle-stats written in TypeScript
//! (`operators/vehicle-stats-ts` over the TypeScript SDK, `guest-sdk-ts`, compiled by tsc
//! and built by componentize-js with every WASI feature off) writes the state and the
//! outputs the Rust build writes, byte for byte, its TTLs and `expired` callbacks
//! included; run as the canary of the Rust build for half the keys, it takes exactly
//! those and changes no byte of the outputs or the state; a running job is deployed from
//! the Rust build to it and rolled back, each vehicle's count going on one by one.

use crate::languages::{
    assert_canary_over_rust_changes_no_byte, assert_swap_from_rust_and_back, assert_vehicle_stats_agree,
};
use anyhow::Result;

#[test]
fn vehicle_stats_in_typescript_writes_what_the_rust_build_writes_byte_for_byte() -> Result<()> {
    assert_vehicle_stats_agree("vehicle_stats_ts")
}

/// A TypeScript build as the canary of the Rust build for half the keys: see
/// [`assert_canary_over_rust_changes_no_byte`].
#[test]
fn a_typescript_canary_over_the_rust_build_takes_its_keys_and_changes_no_byte() -> Result<()> {
    assert_canary_over_rust_changes_no_byte("vehicle_stats_ts")
}

#[test]
fn a_running_job_swaps_from_rust_to_typescript_and_back_and_every_count_goes_on() -> Result<()> {
    assert_swap_from_rust_and_back("vehicle_stats_ts")
}
