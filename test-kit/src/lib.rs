#![doc = include_str!("../../docs/operator-guide.md")]
//!
//! # The kit
//!
//! A dev-dependency for an operator's crate: [`TestDriver`] runs the built component in
//! the host's sandbox over scratch state, record by record, with the clock in the
//! test's hands; [`built_component`] finds the component `cargo build --release
//! --target wasm32-wasip2` made; [`assert_lines`] compares what it emitted with
//! expected lines as `sluice test` does; [`MemoryState`] runs the operator natively.

use anyhow::{Result, bail};
use serde_json::Value;
use std::path::{Path, PathBuf};

pub use sluice::config::TtlConfig;
pub use sluice::test_driver::{Step, TestDriver, TestDriverBuilder, differences};
pub use sluice_guest::native::MemoryState;

/// The component of `package` as `cargo build --release --target wasm32-wasip2` leaves
/// it: `<target>/wasm32-wasip2/release/<package, - as _>.wasm`, where `<target>` is
/// `CARGO_TARGET_DIR`, else the nearest `target` directory above the crate under test.
/// An error, with the command to build it, when it is not there.
pub fn built_component(package: &str) -> Result<PathBuf> {
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let crate_dir = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from);
            let start = crate_dir.map_or_else(std::env::current_dir, Ok)?;
            let found = start.ancestors().map(|dir| dir.join("target")).find(|target| target.is_dir());
            found.unwrap_or_else(|| Path::new("target").to_path_buf())
        }
    };
    let component = target.join("wasm32-wasip2/release").join(format!("{}.wasm", package.replace('-', "_")));
    if !component.exists() {
        bail!(
            "{} is not built: run `cargo build --release --target wasm32-wasip2 -p {package}` first",
            component.display()
        );
    }
    Ok(component)
}

/// Panics, listing every difference, unless `actual` lines match `expected` ones as
/// `sluice test` matches them (see [`differences`]); `what` names them ("output").
#[track_caller]
pub fn assert_lines(what: &str, expected: &[Value], actual: &[Value]) {
    let found = differences(what, expected, actual);
    assert!(found.is_empty(), "{}", found.join("\n"));
}
