//! Shared pieces of the end-to-end tests (and of the host's benchmarks), by concern:
//!
//! - [`binary`]: locating the built `sluice` binary and operators, and running them;
//! - [`browser`]: pages as headless Chromium renders them;
//! - [`servers`]: the S3 store started on a loopback port;
//! - [`kafka_broker`]: Apache Kafka started on loopback ports, and the client calls
//!   the tests make against it;
//! - [`kafka_job`]: the jobs and hosts the Kafka tests run over such a broker;
//! - [`stores`]: reading checkpoint stores and state directories;
//! - [`reference`](mod@reference): generating and reading JSONL, and the reference fold of
//!   vehicle-stats computed independently of the operator;
//! - [`settings`]: the benchmarks' sizes from the environment;
//! - [`measure`]: the benchmarks' wall and CPU clocks.
//!
//! Everything is re-exported here, so a test needs only `use sluice_e2e::*`.

pub mod binary;
pub mod browser;
pub mod kafka_broker;
pub mod kafka_job;
pub mod measure;
pub mod reference;
pub mod servers;
pub mod settings;
pub mod stores;

pub use binary::*;
pub use browser::*;
pub use kafka_broker::*;
pub use kafka_job::*;
pub use measure::*;
pub use reference::*;
pub use servers::*;
pub use settings::*;
pub use stores::*;
