//! The end-to-end tests, one binary: each module a feature, tested through the real
//! `sluice` binary, real files, real servers and `kill -9`. One binary links wasmtime,
//! RocksDB and librdkafka once, where a binary per file linked them once each.

mod bad_input;
mod checkpoint;
mod crash;
mod end_to_end;
mod hot_swap;
mod kafka;
mod sandbox;
mod setup;
