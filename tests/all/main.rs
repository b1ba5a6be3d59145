//! The end-to-end tests, in one binary: each module a feature, tested through the real
//! `sluice` binary, real files, real servers and `kill -9`. One binary links wasmtime,
//! RocksDB and librdkafka once, where a binary per file linked them once each. A module
//! that borrows another's job (a crash test's, a hot swap's) imports it from there; what
//! no one feature owns is in the support library (`tests/support/`).

mod admin_api;
mod bad_input;
mod canary;
mod checkpoint_restore;
mod crash_recovery;
mod end_to_end;
mod hot_swap;
mod kafka_exactly_once;
mod kafka_group;
mod kafka_rebalance;
mod kafka_sink;
mod kafka_source;
mod languages;
mod observability;
mod python;
mod replay;
mod sandbox;
mod sandbox_limits;
mod setup;
mod shadow;
mod standby;
mod state_ttl;
mod test_driver;
mod timers;
mod typescript;
