//! Which version processes a record.
//!
//! A host runs one [`ActiveVersion`] of its operator, set by deploys, and perhaps a
//! [`canary`] beside it that takes a share of the keys ([`in_canary`]),
//! and a [`ShadowVersion`] whose outputs are compared and never sent. Each partition's
//! [`VersionedInstance`] follows them between batches — unless it processes again
//! records a first run processed: then it switches where that run switched, as the
//! partition's [`switches`] log says, so a replay decides as the first run did.
//!
//! This module decides what runs; it does not run it (the [sandbox](super::wasm)
//! does), keep the versions' components and history (the [registry](super::registry))
//! or validate a new version and set it here (the [deployer](super::deploy)).

mod active;
pub mod canary;
mod instance;
pub mod switches;

pub use active::{ActiveVersion, ShadowVersion};
pub use canary::in_canary;
pub use instance::VersionedInstance;
