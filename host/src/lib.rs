//! Sluice runs stateful stream operators as sandboxed WebAssembly components.
//!
//! The modules follow a record's path: a [`source`] assigns it a partition and
//! offset; that partition's [`worker`] runs the [`operator`] on it against the
//! partition's keyed [`state`]; outputs go to the [`sink`]; then state and offset
//! commit together. Every so often the worker [`checkpoint`]s its state to a
//! checkpoint store, from which a job restores when its local state is gone. A [`job`]
//! wires these from a [`config`]; new operator versions arrive through the
//! [`admin`] API or the registry in the store (see [`operator::deploy`]).

pub mod admin;
pub mod checkpoint;
pub mod checksum;
pub mod config;
pub mod job;
pub mod operator;
pub mod sink;
pub mod source;
pub mod state;
pub mod worker;
