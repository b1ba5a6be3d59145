//! The set-up the Kafka tests share: [`KafkaJob`], a broker with the topics a test names
//! and a scratch directory for its jobs, which writes the config of a job reading the
//! test's topic `positions`, spawns hosts of it and generates the positions to produce.
//! Jobs of another shape (exactly-once, a sink alone) are their module's.

use crate::binary::{Host, operator_wasm, run_job};
use crate::kafka_broker::{KafkaBroker, SESSION_TIMEOUT};
use crate::reference::generate;
use anyhow::Result;
pub use sluice::config::GroupProtocol;
use sluice::events::STOPPED;
use sluice::record::Stop;
use std::path::{Path, PathBuf};

/// The seed of the positions the Kafka tests generate.
pub const KAFKA_SEED: u64 = 5;

/// A Kafka test's broker, with the topics it created, and a scratch directory (removed
/// when the job is dropped) for the state, outputs, configs and logs of its hosts. Built
/// by [`KafkaJob::on`] a broker, then [`topic`](KafkaJobBuilder::topic) for each topic and
/// [`start`](KafkaJobBuilder::start).
pub struct KafkaJob {
    /// The broker the job reads and writes.
    pub broker: KafkaBroker,
    scratch: tempfile::TempDir,
}

/// The topics a [`KafkaJob`] creates on its broker before it starts.
pub struct KafkaJobBuilder {
    broker: KafkaBroker,
    topics: Vec<(String, i32)>,
}

impl KafkaJob {
    /// A job on `broker`.
    pub fn on(broker: KafkaBroker) -> KafkaJobBuilder {
        KafkaJobBuilder { broker, topics: Vec::new() }
    }

    /// The scratch directory.
    pub fn dir(&self) -> &Path {
        self.scratch.path()
    }

    /// Writes `count` generated positions of `vehicles` vehicles ([`KAFKA_SEED`]) to
    /// `name` in the scratch directory, and returns its path.
    pub fn generate(&self, name: &str, vehicles: u32, count: u64) -> Result<PathBuf> {
        let path = self.dir().join(name);
        generate(&path, vehicles, count, KAFKA_SEED)?;
        Ok(path)
    }

    /// Writes the config of a job reading the test's topic `positions` of this broker as
    /// a member of the test's group `group`, with `more` source settings
    /// ([`positions_source`] in the scratch directory).
    pub fn source(&self, group: &str, more: &str) -> Result<PathBuf> {
        let broker = &self.broker;
        positions_source(self.dir(), &broker.bootstrap, &broker.name("positions"), &broker.name(group), more)
    }

    /// Spawns host `name`: vehicle-stats over `partitions` partitions in the scratch
    /// directory's `name` (its log in `name/log`), configured by `config`, checkpointing
    /// to `store` when given (else beside its state), with `flags` after.
    pub fn host(
        &self,
        name: &str,
        partitions: u32,
        config: &Path,
        store: Option<&Path>,
        flags: &[&str],
    ) -> Result<Host> {
        let home = self.dir().join(name);
        std::fs::create_dir_all(&home)?;
        let mut command = run_job(&operator_wasm("vehicle_stats"), &home, partitions);
        command.arg("--config").arg(config);
        if let Some(store) = store {
            command.arg("--checkpoint-store").arg(store);
        }
        Host::spawn(name, command.args(flags), &home.join("log"))
    }
}

impl KafkaJobBuilder {
    /// Creates topic `name` with `partitions` partitions when the job starts.
    pub fn topic(mut self, name: &str, partitions: i32) -> Self {
        self.topics.push((name.to_string(), partitions));
        self
    }

    /// Creates the topics, and the scratch directory.
    pub fn start(self) -> Result<KafkaJob> {
        for (topic, partitions) in &self.topics {
            self.broker.create_topic(topic, *partitions)?;
        }
        Ok(KafkaJob { broker: self.broker, scratch: tempfile::tempdir()? })
    }
}

/// Splits the lines of `path` into `n` files of (nearly) equal length beside it.
pub fn split_lines(path: &Path, n: usize) -> Result<Vec<PathBuf>> {
    let text = std::fs::read_to_string(path)?;
    let lines: Vec<&str> = text.lines().collect();
    let mut files = Vec::new();
    for (i, chunk) in lines.chunks(lines.len().div_ceil(n)).enumerate() {
        let file = path.with_extension(format!("{i}.jsonl"));
        std::fs::write(&file, chunk.join("\n") + "\n")?;
        files.push(file);
    }
    Ok(files)
}

/// Writes `dir/kafka-source.toml`: a Kafka source reading `topic` from `brokers` as a
/// member of consumer group `group`, with `more` source settings; the operator comes
/// from `--operator`.
pub fn positions_source(dir: &Path, brokers: &str, topic: &str, group: &str, more: &str) -> Result<PathBuf> {
    let config = dir.join("kafka-source.toml");
    std::fs::write(
        &config,
        format!(
            "[operator]\npath = \"set-by-flag.wasm\"\n[source]\nkind = \"kafka\"\nbrokers = \"{brokers}\"\n\
             topic = \"{topic}\"\ngroup = \"{group}\"\n{more}"
        ),
    )?;
    Ok(config)
}

/// What a host logs when a partition of it hands over in a graceful stop.
pub fn handed_over() -> String {
    format!("{STOPPED} ({:?})", Stop::Handover)
}

/// `[source]` settings of a consumer group member under `protocol`, then `properties`
/// (lines of `[source.properties]`, and any tables after). A member is dropped
/// [`SESSION_TIMEOUT`] after its last heartbeat: a classic member sets it (heartbeats
/// every 0.5 s); a KIP-848 member takes the test broker's (heartbeats every second),
/// which librdkafka refuses to let it set.
pub fn group_settings(protocol: GroupProtocol, properties: &str) -> String {
    let session = SESSION_TIMEOUT.as_millis();
    match protocol {
        GroupProtocol::Classic => format!(
            "group_protocol = \"classic\"\n[source.properties]\n\"session.timeout.ms\" = \
             \"{session}\"\n\"heartbeat.interval.ms\" = \"500\"\n{properties}"
        ),
        GroupProtocol::Consumer => format!("group_protocol = \"consumer\"\n[source.properties]\n{properties}"),
    }
}

/// Runs the test function `name(protocol: GroupProtocol) -> Result<()>` once per
/// consumer group protocol, as the tests `name::classic` and `name::consumer`.
#[macro_export]
macro_rules! for_each_group_protocol {
    ($name:ident) => {
        mod $name {
            #[test]
            fn classic() -> anyhow::Result<()> {
                super::$name($crate::GroupProtocol::Classic)
            }

            #[test]
            fn consumer() -> anyhow::Result<()> {
                super::$name($crate::GroupProtocol::Consumer)
            }
        }
    };
}

/// The offsets in the lines of `log` with `phrase` about `partition`, in order: the
/// number after each one's `at offset`.
pub fn offsets_logged(log: &str, phrase: &str, partition: u32) -> Vec<u64> {
    let about = format!("partition={partition}");
    log.lines()
        .filter(|l| l.contains(phrase) && l.ends_with(&about))
        .filter_map(|l| l.split("at offset ").nth(1)?.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
        .collect()
}
