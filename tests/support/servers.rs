//! The servers the tests start on free loopback ports: an S3-compatible store
//! ([`S3Server`], `s3s-fs`) and a Kafka-protocol broker ([`KafkaBroker`]: tansu with
//! SQLite storage in a temporary directory, or noida-db where a test needs
//! transactions), each stopped when dropped, and the Kafka client calls the tests make
//! against the broker (creating topics, producing, reading back, committed offsets).
//! `./dev.sh test` and `./dev.sh bench` install all three servers.

use crate::binary::signal;
use anyhow::{Context, Result, bail};
use rdkafka::ClientConfig;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A loopback port nothing listens on (released again, for a server to take).
pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Waits until something accepts connections on loopback `port`; fails after `timeout`.
pub fn wait_listening(port: u16, timeout: std::time::Duration) -> Result<()> {
    let started = std::time::Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if started.elapsed() > timeout {
            bail!("nothing listens on port {port} after {timeout:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Ok(())
}

/// Starts `command` (a server installed by `./dev.sh test`) quietly and waits until it
/// accepts connections on loopback `port`.
fn spawn_listening(mut command: Command, port: u16) -> Result<std::process::Child> {
    let name = command.get_program().to_string_lossy().into_owned();
    let mut child = command
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .with_context(|| format!("starting {name} (./dev.sh test and ./dev.sh bench install it)"))?;
    if let Err(e) = wait_listening(port, std::time::Duration::from_secs(20)) {
        child.kill().ok();
        return Err(e.context(format!("{name} did not start")));
    }
    Ok(child)
}

/// An S3-compatible server (`s3s-fs`, installed by `./dev.sh test`) on a free loopback
/// port, serving the bucket `sluice` from a temporary directory; stopped when dropped.
pub struct S3Server {
    child: std::process::Child,
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
    /// The bucket's directory: every object is a file under it.
    pub bucket_dir: PathBuf,
    _root: tempfile::TempDir,
}

impl S3Server {
    /// Starts the server and waits until it accepts connections.
    pub fn start() -> Result<Self> {
        let root = tempfile::tempdir()?;
        let bucket_dir = root.path().join("sluice");
        std::fs::create_dir(&bucket_dir)?;
        let port = free_port()?;
        let mut command = Command::new("s3s-fs");
        command
            .args([
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--access-key",
                "sluice",
                "--secret-key",
                "sluice-secret",
            ])
            .arg(root.path());
        let child = spawn_listening(command, port)?;
        Ok(S3Server { child, endpoint: format!("http://127.0.0.1:{port}"), bucket_dir, _root: root })
    }

    /// Sets the `AWS_*` variables that point a `sluice` command at this server.
    pub fn configure<'a>(&self, command: &'a mut Command) -> &'a mut Command {
        command
            .env("AWS_ENDPOINT", &self.endpoint)
            .env("AWS_ALLOW_HTTP", "true")
            .env("AWS_ACCESS_KEY_ID", "sluice")
            .env("AWS_SECRET_ACCESS_KEY", "sluice-secret")
            .env("AWS_REGION", "us-east-1")
    }

    /// Freezes (SIGSTOP) or thaws (SIGCONT) the server: to its clients, a store that
    /// stopped answering (connections are still accepted, requests never answered).
    pub fn freeze(&self, frozen: bool) -> Result<()> {
        signal(self.child.id(), if frozen { "STOP" } else { "CONT" })
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
    }
}

/// A Kafka-protocol broker (tansu, installed by `./dev.sh test`) on a free loopback
/// port, its log in a SQLite database in a temporary directory; stopped when dropped.
///
/// SQLite storage, not tansu's in-memory one: it keeps a row per record and serves a
/// fetch from the offset asked for, where the in-memory storage answers a fetch that
/// starts inside a multi-record batch from the next batch on, skipping the rest of the
/// batch (`tests/all/kafka_source.rs` checks the broker with a plain consumer).
pub struct KafkaBroker {
    child: std::process::Child,
    /// `127.0.0.1:PORT`.
    pub bootstrap: String,
    /// Whether [`produce`](Self::produce) writes one record per batch (in-memory storage).
    one_record_batches: bool,
    _data: tempfile::TempDir,
}

impl KafkaBroker {
    /// Starts the broker and waits until it accepts connections.
    pub fn start() -> Result<Self> {
        // tansu resolves a sqlite:// path against its working directory.
        Self::start_tansu("sqlite://tansu.db", false)
    }

    /// Starts the broker on tansu's in-memory storage, for the one test whose group
    /// changes tansu's SQLite storage cannot serve: a member joining a group while
    /// another member was just killed gets the survivors' heartbeats left unanswered
    /// until their sessions time out. [`produce`](Self::produce) then writes one record
    /// per batch, so that no fetch starts inside a batch.
    pub fn start_in_memory() -> Result<Self> {
        Self::start_tansu("memory://tansu/", true)
    }

    fn start_tansu(storage: &str, one_record_batches: bool) -> Result<Self> {
        let data = tempfile::tempdir()?;
        let port = free_port()?;
        let url = format!("tcp://127.0.0.1:{port}");
        let mut command = Command::new("tansu");
        command
            .current_dir(data.path())
            .args(["broker", "--storage-engine", storage, "--listener-url", &url])
            .args(["--advertised-listener-url", &url]);
        let child = spawn_listening(command, port)?;
        Ok(KafkaBroker { child, bootstrap: format!("127.0.0.1:{port}"), one_record_batches, _data: data })
    }

    /// Starts a broker that supports Kafka transactions — noida-db's Kafka service
    /// (installed by `./dev.sh test`), its data in a temporary directory — and waits
    /// until it accepts connections. tansu 0.6 cannot commit a transaction: it has no
    /// EndTxn, and its fetches ignore aborted transactions.
    pub fn start_transactional() -> Result<Self> {
        let data = tempfile::tempdir()?;
        let port = free_port()?;
        let mut command = Command::new("noida-db");
        command
            .args(["start", "--only", "kafka", "--host", "127.0.0.1", "--kafka-port", &port.to_string()])
            .arg("--data-dir")
            .arg(data.path());
        let child = spawn_listening(command, port)?;
        Ok(KafkaBroker { child, bootstrap: format!("127.0.0.1:{port}"), one_record_batches: false, _data: data })
    }

    /// A librdkafka client configuration pointing at this broker.
    pub fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.bootstrap);
        config
    }

    /// [`client_config`](Self::client_config) of a consumer in group `group` that commits
    /// no offsets by itself.
    pub fn consumer_config(&self, group: &str) -> ClientConfig {
        let mut config = self.client_config();
        config.set("group.id", group).set("enable.auto.commit", "false");
        config
    }

    /// Creates `topic` with `partitions` partitions.
    pub fn create_topic(&self, topic: &str, partitions: i32) -> Result<()> {
        use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
        let admin: AdminClient<rdkafka::client::DefaultClientContext> = self.client_config().create()?;
        let topics = [NewTopic::new(topic, partitions, TopicReplication::Fixed(1))];
        for result in futures::executor::block_on(admin.create_topics(&topics, &AdminOptions::new()))? {
            result.map_err(|(topic, e)| anyhow::anyhow!("creating topic {topic}: {e}"))?;
        }
        Ok(())
    }

    /// Deletes `topic`.
    pub fn delete_topic(&self, topic: &str) -> Result<()> {
        use rdkafka::admin::{AdminClient, AdminOptions};
        let admin: AdminClient<rdkafka::client::DefaultClientContext> = self.client_config().create()?;
        for result in futures::executor::block_on(admin.delete_topics(&[topic], &AdminOptions::new()))? {
            result.map_err(|(topic, e)| anyhow::anyhow!("deleting topic {topic}: {e}"))?;
        }
        Ok(())
    }

    /// Produces `records` (key and value each) to `topic` and waits until the broker has
    /// them all; returns how many there were. They are partitioned as Kafka's Java
    /// producer does (murmur2), by an idempotent producer (a retried send is neither
    /// duplicated nor reordered, so the topic holds exactly these records), in batches as
    /// librdkafka makes them (hundreds of records per produce request when records come
    /// faster than its `linger.ms`).
    pub fn produce<K: AsRef<[u8]>, V: AsRef<[u8]>>(
        &self,
        topic: &str,
        records: impl IntoIterator<Item = Result<(K, V)>>,
    ) -> Result<usize> {
        let records = records.into_iter().map(|record| record.map(|(k, v)| (k, v, None)));
        self.produce_with(self.producer_config(), topic, records)
    }

    /// The producer settings of [`produce`](Self::produce).
    fn producer_config(&self) -> ClientConfig {
        let mut config = self.client_config();
        if self.one_record_batches {
            config.set("batch.num.messages", "1");
        }
        config
    }

    /// [`produce`](Self::produce) with the producer settings of `config`, each record
    /// with its timestamp, ms since the epoch (`None`: the producer's clock, as
    /// [`produce`](Self::produce) leaves it).
    pub fn produce_with<K: AsRef<[u8]>, V: AsRef<[u8]>>(
        &self,
        mut config: ClientConfig,
        topic: &str,
        records: impl IntoIterator<Item = Result<(K, V, Option<i64>)>>,
    ) -> Result<usize> {
        use rdkafka::error::KafkaError;
        use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
        use rdkafka::types::RDKafkaErrorCode;
        let producer: ThreadedProducer<DefaultProducerContext> =
            config.set("partitioner", "murmur2_random").set("enable.idempotence", "true").create()?;
        let mut produced = 0;
        for record in records {
            let (key, value, timestamp) = record?;
            let mut record = BaseRecord::to(topic).key(key.as_ref()).payload(value.as_ref());
            if let Some(timestamp) = timestamp {
                record = record.timestamp(timestamp);
            }
            // A full queue empties as the broker acknowledges; any other error is final.
            while let Err((e, returned)) = producer.send(record) {
                record = returned;
                if !matches!(e, KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull)) {
                    bail!("producing to {topic}: {e}");
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            produced += 1;
        }
        producer.flush(std::time::Duration::from_secs(120))?;
        Ok(produced)
    }

    /// [`produce`](Self::produce)s every line of the JSONL file `input` to `topic`, keyed
    /// by its `vehicle_id`.
    pub fn produce_lines(&self, topic: &str, input: &Path) -> Result<usize> {
        self.produce_positions(topic, input, false)
    }

    /// [`produce_lines`](Self::produce_lines), each record's timestamp its line's `ts`
    /// (so a job's event time is the positions' own, as a file source reads them).
    pub fn produce_lines_at_ts(&self, topic: &str, input: &Path) -> Result<usize> {
        self.produce_positions(topic, input, true)
    }

    fn produce_positions(&self, topic: &str, input: &Path, at_ts: bool) -> Result<usize> {
        let text = std::fs::read_to_string(input)?;
        self.produce_with(
            self.producer_config(),
            topic,
            text.lines().map(|line| {
                let value: Value = serde_json::from_str(line)?;
                let key = value["vehicle_id"].as_str().context("a line without vehicle_id")?.to_string();
                let ts = if at_ts { Some(value["ts"].as_i64().context("a line without ts")?) } else { None };
                Ok((key, line, ts))
            }),
        )
    }

    /// The end (high watermark) of each partition of `topic`, by partition.
    pub fn ends(&self, topic: &str) -> Result<BTreeMap<i32, i64>> {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        let timeout = std::time::Duration::from_secs(10);
        let consumer: BaseConsumer = self.client_config().create()?;
        let metadata = consumer.fetch_metadata(Some(topic), timeout)?;
        let partitions = metadata.topics().iter().flat_map(|t| t.partitions()).map(|p| p.id());
        partitions.map(|p| Ok((p, consumer.fetch_watermarks(topic, p, timeout)?.1))).collect()
    }

    /// Reads `topic` from the beginning of every partition up to its end (its high
    /// watermark as it stands when the read starts): key, value and headers of each, in
    /// partition order, of committed transactions only (`read_committed`, librdkafka's
    /// default, whose position moves past transaction markers and aborted records).
    pub fn read_topic(&self, topic: &str) -> Result<Vec<KafkaRecord>> {
        use rdkafka::Message;
        use rdkafka::consumer::{BaseConsumer, Consumer};
        use rdkafka::message::Headers;
        let ends = self.ends(topic)?;
        let consumer: BaseConsumer = self.consumer_config("sluice-tests-reader").create()?;
        let mut assignment = rdkafka::TopicPartitionList::new();
        for &partition in ends.keys() {
            assignment.add_partition_offset(topic, partition, rdkafka::Offset::Beginning)?;
        }
        consumer.assign(&assignment)?;
        let started = std::time::Instant::now();
        let mut by_partition: BTreeMap<i32, Vec<KafkaRecord>> = BTreeMap::new();
        loop {
            if let Some(message) = consumer.poll(std::time::Duration::from_millis(100)) {
                let message = message?;
                let headers = message
                    .headers()
                    .map(|h| {
                        h.iter()
                            .map(|h| {
                                (h.key.to_string(), String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned())
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                by_partition.entry(message.partition()).or_default().push(KafkaRecord {
                    key: String::from_utf8_lossy(message.key().unwrap_or_default()).into_owned(),
                    value: serde_json::from_slice(message.payload().unwrap_or_default()).unwrap_or(Value::Null),
                    headers,
                });
                continue;
            }
            let positions = consumer.position()?;
            let behind: Vec<(i32, i64, i64)> = ends
                .iter()
                .map(|(&p, &end)| {
                    let at = positions.find_partition(topic, p).and_then(|e| e.offset().to_raw()).unwrap_or(0);
                    (p, at.max(0), end)
                })
                .filter(|&(_, at, end)| at < end)
                .collect();
            if behind.is_empty() {
                return Ok(by_partition.into_values().flatten().collect());
            }
            if started.elapsed() > std::time::Duration::from_secs(120) {
                bail!("reading {topic}: partitions (partition, position, end) not read to their end: {behind:?}");
            }
        }
    }

    /// Reads `count` records of `topic`'s `partition` from `offset` on with a plain
    /// consumer assigned there (no group): the offset and value (as text) of each, or
    /// fewer if no more arrive for 5 s.
    pub fn read_from(&self, topic: &str, partition: i32, offset: i64, count: usize) -> Result<Vec<(i64, String)>> {
        use rdkafka::Message;
        use rdkafka::consumer::{BaseConsumer, Consumer};
        let consumer: BaseConsumer = self.consumer_config("sluice-tests-reader").create()?;
        let mut assignment = rdkafka::TopicPartitionList::new();
        assignment.add_partition_offset(topic, partition, rdkafka::Offset::Offset(offset))?;
        consumer.assign(&assignment)?;
        let mut read = Vec::new();
        let mut last = std::time::Instant::now();
        while read.len() < count && last.elapsed() < std::time::Duration::from_secs(5) {
            let Some(message) = consumer.poll(std::time::Duration::from_millis(100)) else { continue };
            let message = message?;
            last = std::time::Instant::now();
            read.push((message.offset(), String::from_utf8_lossy(message.payload().unwrap_or_default()).into_owned()));
        }
        Ok(read)
    }

    /// The offsets consumer group `group` committed for `topic`, by partition (-1: none).
    pub fn committed(&self, group: &str, topic: &str) -> Result<BTreeMap<i32, i64>> {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        let consumer: BaseConsumer = self.consumer_config(group).create()?;
        let timeout = std::time::Duration::from_secs(10);
        let metadata = consumer.fetch_metadata(Some(topic), timeout)?;
        let mut partitions = rdkafka::TopicPartitionList::new();
        for partition in metadata.topics().iter().flat_map(|t| t.partitions()) {
            partitions.add_partition(topic, partition.id());
        }
        let committed = consumer.committed_offsets(partitions, timeout)?;
        Ok(committed.elements().iter().map(|e| (e.partition(), e.offset().to_raw().unwrap_or(-1))).collect())
    }

    /// Waits until `group` has committed all `records` records of `topic` (offsets
    /// summing to the count: each partition's offsets run from 0 without gaps). A look
    /// the broker fails to answer (busy under the hosts it serves) is tried again until
    /// `timeout`.
    pub fn wait_committed(&self, group: &str, topic: &str, records: i64, timeout: std::time::Duration) -> Result<()> {
        let started = std::time::Instant::now();
        loop {
            let looked = self.committed(group, topic);
            if looked.as_ref().is_ok_and(|offsets| offsets.values().map(|&o| o.max(0)).sum::<i64>() == records) {
                return Ok(());
            }
            if started.elapsed() > timeout {
                let offsets = looked?;
                bail!(
                    "group {group} has not committed the {records} records of {topic} after {timeout:?}: {offsets:?}"
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }

    /// Freezes (SIGSTOP) or thaws (SIGCONT) the broker: to its clients, a broker that
    /// stopped answering.
    pub fn freeze(&self, frozen: bool) -> Result<()> {
        signal(self.child.id(), if frozen { "STOP" } else { "CONT" })
    }
}

impl Drop for KafkaBroker {
    fn drop(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
    }
}

/// A record read back from Kafka.
#[derive(Debug, Clone)]
pub struct KafkaRecord {
    /// The key, as text.
    pub key: String,
    /// The value, parsed as JSON (`null` if it is not).
    pub value: Value,
    /// The headers, as text.
    pub headers: BTreeMap<String, String>,
}
