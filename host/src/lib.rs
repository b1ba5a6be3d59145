//! Sluice runs stateful stream operators as sandboxed WebAssembly components.
//!
//! The modules follow a record's path: a [`source`] assigns it a partition and
//! offset; that partition's [`worker`] runs the [`operator`] on it against the
//! partition's keyed [`state`]; outputs go to the [`sink`]; then state and offset
//! commit together. A [`job`] wires these from a [`config`].

pub mod config;
pub mod job;
pub mod operator;
pub mod sink;
pub mod source;
pub mod state;
pub mod worker;
