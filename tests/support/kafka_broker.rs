//! Apache Kafka as the tests run it: [`KafkaBroker`], a test's handle on a KRaft cluster
//! of one node or three on free loopback ports (each node broker and controller in one
//! JVM, started by `dev/kafka/broker.sh` from the jars `./dev.sh` set-up installs); and
//! the Kafka client calls the tests make against it (creating topics, producing, reading
//! back, committed offsets).
//!
//! Most tests share one single-node cluster per test process ([`KafkaBroker::shared`]),
//! isolated by name: each handle prefixes the topics and groups it is given with a prefix
//! of its own ([`KafkaBroker::name`]), so a test names `positions` and reads `t7-positions`.
//! A test that freezes or kills nodes starts a cluster of its own ([`KafkaBroker::start`],
//! [`KafkaBroker::start_cluster`]), whose names are as given.
//!
//! A cluster says on stderr what it is and where its logs are when it starts — a test's
//! output, which `cargo test` shows when the test fails (a failing test's handle says it
//! again). A cluster of its own stops and loses its data when its test's handle is
//! dropped; the shared one runs until the test process ends. Logs stay (under the
//! system's temporary directory, `sluice-kafka/`) until the next test run that starts a
//! broker. A node is killed with the thread that started it (`PR_SET_PDEATHSIG`), so a
//! test run that is itself killed leaves no broker behind; the shared cluster is started
//! from a thread that lives as long as the process.

use crate::binary::signal;
use crate::servers::free_port;
use anyhow::{Context, Result, bail};
use rdkafka::ClientConfig;
use serde_json::Value;
use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The Kafka version `./dev.sh` installs (dev/kafka/pom.xml), named in failures.
pub const KAFKA_VERSION: &str = "4.4.0";

/// How long a cluster may take to start: its JVMs start while other tests run.
const START_TIMEOUT: Duration = Duration::from_secs(90);

/// How long after its last heartbeat a member of a test group is dropped, under either
/// protocol: the test broker's for KIP-848 groups, what
/// [`group_settings`](crate::group_settings) sets for classic ones.
pub const SESSION_TIMEOUT: Duration = Duration::from_secs(6);

/// Settings every test broker runs with, on top of `dev/kafka/broker.sh`'s: group
/// timeouts short enough for a test to wait out. Classic groups take session timeouts
/// from 1 s on (Kafka's floor is 6 s); KIP-848 (`consumer`) groups time a member out
/// after [`SESSION_TIMEOUT`] with heartbeats every second (Kafka's defaults are 45 s
/// and 5 s, and their floors as long). A node alone never fences itself: frozen
/// (SIGSTOP) past `broker.session.timeout.ms` (9 s by default), a one-node cluster's
/// controller would fence its own broker on thawing, and its partitions would stay
/// offline until it registered again — tens of seconds under load. A node of a larger
/// cluster keeps Kafka's 9 s, the time a dead node's partitions wait for new leaders.
fn test_settings(nodes: usize) -> Vec<String> {
    let mut settings = vec![
        "group.min.session.timeout.ms=1000".into(),
        "group.consumer.min.session.timeout.ms=1000".into(),
        format!("group.consumer.session.timeout.ms={}", SESSION_TIMEOUT.as_millis()),
        "group.consumer.min.heartbeat.interval.ms=500".into(),
        "group.consumer.heartbeat.interval.ms=1000".into(),
    ];
    if nodes == 1 {
        settings.push("broker.session.timeout.ms=600000".into());
    }
    settings
}

/// A test's handle on an Apache Kafka cluster (KRaft) on loopback: the cluster's
/// address, and the prefix of the topics and groups this test names.
pub struct KafkaBroker {
    cluster: Arc<Cluster>,
    /// `127.0.0.1:PORT[,127.0.0.1:PORT…]`: every node's client listener.
    pub bootstrap: String,
    /// What [`name`](Self::name) puts before a topic or group name: empty on a cluster
    /// of the test's own.
    prefix: String,
}

/// The nodes of a cluster; stopped when dropped, its logs kept.
struct Cluster {
    nodes: Vec<Node>,
    /// `127.0.0.1:PORT[,127.0.0.1:PORT…]`: every node's client listener.
    bootstrap: String,
    /// Kafka's cluster id: 16 bytes in URL-safe base64 without padding.
    cluster_id: String,
    /// The nodes' directories (`node-ID`: properties, `server.log`, `data/`).
    dir: PathBuf,
}

/// One node of a [`Cluster`].
struct Node {
    id: u32,
    port: u16,
    controller_port: u16,
    /// `None` until started, and once stopped.
    child: Option<Child>,
}

impl KafkaBroker {
    /// A handle on the one-node cluster this test process shares, started by the first
    /// call (which waits until it answers; a later call made meanwhile waits too), with
    /// a prefix no other handle of the process has.
    pub fn shared() -> Result<Self> {
        static SHARED: std::sync::OnceLock<std::result::Result<Arc<Cluster>, String>> = std::sync::OnceLock::new();
        static HANDLES: AtomicU32 = AtomicU32::new(0);
        let cluster = SHARED.get_or_init(|| {
            // A node dies with the thread that started it: this one never ends.
            let (started, cluster) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                started.send(Cluster::start(1).map(Arc::new).map_err(|e| format!("{e:#}"))).ok();
                loop {
                    std::thread::park();
                }
            });
            cluster.recv().unwrap_or_else(|e| Err(e.to_string()))
        });
        let cluster = cluster.clone().map_err(|e| anyhow::anyhow!("the shared broker did not start: {e}"))?;
        let prefix = format!("t{}-", HANDLES.fetch_add(1, Ordering::Relaxed));
        Ok(KafkaBroker { bootstrap: cluster.bootstrap.clone(), cluster, prefix })
    }

    /// Starts a one-node cluster of this test's own and waits until it answers.
    pub fn start() -> Result<Self> {
        Self::start_cluster(1)
    }

    /// Starts a cluster of `nodes` nodes of this test's own (a static quorum of them
    /// all, every topic replicated to three at most) and waits until every node answers.
    pub fn start_cluster(nodes: u32) -> Result<Self> {
        let cluster = Arc::new(Cluster::start(nodes)?);
        Ok(KafkaBroker { bootstrap: cluster.bootstrap.clone(), cluster, prefix: String::new() })
    }

    /// The name the cluster knows this test's topic or group `name` by.
    pub fn name(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// `kafka://BOOTSTRAP/TOPIC`: the `--output` of a job writing to this test's `topic`.
    pub fn output(&self, topic: &str) -> String {
        format!("kafka://{}/{}", self.bootstrap, self.name(topic))
    }

    /// The node leading this test's `topic`'s `partition`, by its index (0, 1, 2 for
    /// nodes 1, 2, 3).
    pub fn leader(&self, topic: &str, partition: i32) -> Result<usize> {
        self.cluster.leader(&self.name(topic), partition)
    }

    /// The node coordinating this test's consumer `group`, by its index: the leader of
    /// the `__consumer_offsets` partition Kafka hashes the group's name to (Java's
    /// `String.hashCode`, made positive, modulo the topic's partitions). That topic
    /// exists once any group was looked up.
    pub fn group_coordinator(&self, group: &str) -> Result<usize> {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        const OFFSETS: &str = "__consumer_offsets";
        let consumer: BaseConsumer = self.client_config().create()?;
        let metadata = consumer.fetch_metadata(Some(OFFSETS), Duration::from_secs(10))?;
        let partitions = metadata.topics().iter().map(|t| t.partitions().len()).sum::<usize>() as i32;
        anyhow::ensure!(partitions > 0, "{OFFSETS} does not exist yet: no group was looked up");
        let hash = self.name(group).encode_utf16().fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(i32::from(c)));
        self.cluster.leader(OFFSETS, (hash & i32::MAX) % partitions)
    }

    /// Kills node `i` (SIGKILL), as a machine dies: its clients' connections break and
    /// the others take its partitions' leadership over. Only on a cluster of the test's own.
    pub fn kill_node(&self, i: usize) -> Result<()> {
        self.own_cluster()?;
        let child = self.cluster.nodes[i].child.as_ref().context("the node is not running")?;
        signal(child.id(), "KILL")
    }

    /// Freezes (SIGSTOP) or thaws (SIGCONT) every node: to its clients, a cluster that
    /// stopped answering. Only on a cluster of the test's own.
    pub fn freeze(&self, frozen: bool) -> Result<()> {
        self.own_cluster()?;
        for child in self.cluster.nodes.iter().filter_map(|n| n.child.as_ref()) {
            signal(child.id(), if frozen { "STOP" } else { "CONT" })?;
        }
        Ok(())
    }

    /// Fails on the shared cluster, which other tests are using.
    fn own_cluster(&self) -> Result<()> {
        if !self.prefix.is_empty() {
            bail!("{self} is shared with other tests: start a cluster of the test's own to stop its nodes");
        }
        Ok(())
    }
}

impl Cluster {
    /// Starts a cluster of `nodes` nodes and waits until every node answers.
    fn start(nodes: u32) -> Result<Self> {
        let dir = logs_dir()?;
        let nodes: Vec<Node> = (1..=nodes)
            .map(|id| Ok(Node { id, port: free_port()?, controller_port: free_port()?, child: None }))
            .collect::<Result<_>>()?;
        let bootstrap = nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect::<Vec<_>>().join(",");
        let cluster_id = random_cluster_id();
        let mut cluster = Cluster { nodes, bootstrap, cluster_id, dir };
        let started = Instant::now();
        for i in 0..cluster.nodes.len() {
            cluster.start_node(i)?;
        }
        cluster.wait_ready(cluster.nodes.len())?;
        eprintln!(
            "{cluster}, started in {:.1} s; its logs: {}/node-*/server.log",
            started.elapsed().as_secs_f64(),
            cluster.dir.display()
        );
        Ok(cluster)
    }

    fn dir(&self) -> &Path {
        &self.dir
    }

    /// Node `i`'s directory: its properties, `server.log` and data.
    fn node_dir(&self, i: usize) -> PathBuf {
        self.dir().join(format!("node-{}", self.nodes[i].id))
    }

    /// Starts node `i`.
    fn start_node(&mut self, i: usize) -> Result<()> {
        let voters = match self.nodes.len() {
            1 => "standalone".to_string(),
            _ => self
                .nodes
                .iter()
                .map(|n| format!("{}@127.0.0.1:{}", n.id, n.controller_port))
                .collect::<Vec<_>>()
                .join(","),
        };
        let node = &self.nodes[i];
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../dev/kafka/broker.sh");
        let output = std::fs::File::create(self.dir().join(format!("node-{}.out", node.id)))?;
        let mut command = Command::new(&script);
        command
            .arg(self.node_dir(i))
            .args([node.id.to_string(), node.port.to_string(), node.controller_port.to_string()])
            .args([self.cluster_id.clone(), voters])
            .args(test_settings(self.nodes.len()))
            .stdin(Stdio::null())
            .stdout(output.try_clone()?)
            .stderr(output);
        // The JVM (broker.sh execs it) dies with the test process, whatever ends it.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn().with_context(|| format!("starting {}", script.display()))?;
        self.nodes[i].child = Some(child);
        Ok(())
    }

    /// Waits until the cluster's metadata lists `nodes` brokers, failing with the
    /// output of a node that exited.
    fn wait_ready(&mut self, nodes: usize) -> Result<()> {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        let started = Instant::now();
        let consumer: BaseConsumer = client_config(&self.bootstrap).create()?;
        loop {
            for node in &mut self.nodes {
                if let Some(status) = node.child.as_mut().map(|c| c.try_wait()).transpose()?.flatten() {
                    let out =
                        std::fs::read_to_string(self.dir.join(format!("node-{}.out", node.id))).unwrap_or_default();
                    bail!(
                        "Apache Kafka {KAFKA_VERSION} at {}: node {} exited ({status}) while starting:\n{out}",
                        self.bootstrap,
                        node.id
                    );
                }
            }
            let listed = consumer.fetch_metadata(None, Duration::from_secs(1)).map(|m| m.brokers().len());
            if listed.as_ref().is_ok_and(|&listed| listed >= nodes) {
                return Ok(());
            }
            if started.elapsed() > START_TIMEOUT {
                bail!("{self} did not answer with {nodes} nodes after {START_TIMEOUT:?}: {listed:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The node leading `topic`'s `partition`, by its index.
    fn leader(&self, topic: &str, partition: i32) -> Result<usize> {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        let consumer: BaseConsumer = client_config(&self.bootstrap).create()?;
        let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
        let leader = metadata
            .topics()
            .iter()
            .flat_map(|t| t.partitions())
            .find(|p| p.id() == partition)
            .with_context(|| format!("{topic} has no partition {partition}"))?
            .leader();
        self.nodes.iter().position(|n| n.id as i32 == leader).with_context(|| format!("no node {leader}"))
    }
}

/// A librdkafka client configuration pointing at `bootstrap`.
fn client_config(bootstrap: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", bootstrap);
    config
}

impl KafkaBroker {
    /// A librdkafka client configuration pointing at this broker.
    pub fn client_config(&self) -> ClientConfig {
        client_config(&self.bootstrap)
    }

    /// [`client_config`](Self::client_config) of a consumer in this test's group `group`
    /// that commits no offsets by itself.
    pub fn consumer_config(&self, group: &str) -> ClientConfig {
        let mut config = self.client_config();
        config.set("group.id", self.name(group)).set("enable.auto.commit", "false");
        config
    }

    /// Creates this test's `topic` with `partitions` partitions.
    pub fn create_topic(&self, topic: &str, partitions: i32) -> Result<()> {
        use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
        let admin: AdminClient<rdkafka::client::DefaultClientContext> = self.client_config().create()?;
        let topic = self.name(topic);
        let replicas = self.cluster.nodes.len().min(3) as i32;
        let topics = [NewTopic::new(&topic, partitions, TopicReplication::Fixed(replicas))];
        for result in futures::executor::block_on(admin.create_topics(&topics, &AdminOptions::new()))? {
            result.map_err(|(topic, e)| anyhow::anyhow!("creating topic {topic}: {e}"))?;
        }
        Ok(())
    }

    /// Deletes this test's `topic`.
    pub fn delete_topic(&self, topic: &str) -> Result<()> {
        use rdkafka::admin::{AdminClient, AdminOptions};
        let admin: AdminClient<rdkafka::client::DefaultClientContext> = self.client_config().create()?;
        let topic = self.name(topic);
        for result in futures::executor::block_on(admin.delete_topics(&[&topic], &AdminOptions::new()))? {
            result.map_err(|(topic, e)| anyhow::anyhow!("deleting topic {topic}: {e}"))?;
        }
        Ok(())
    }

    /// Produces `records` (key and value each) to this test's `topic` and waits until the broker has
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
        self.produce_with(self.client_config(), topic, records)
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
        let topic = &self.name(topic);
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
            self.client_config(),
            topic,
            text.lines().map(|line| {
                let value: Value = serde_json::from_str(line)?;
                let key = value["vehicle_id"].as_str().context("a line without vehicle_id")?.to_string();
                let ts = if at_ts { Some(value["ts"].as_i64().context("a line without ts")?) } else { None };
                Ok((key, line, ts))
            }),
        )
    }

    /// The end (high watermark) of each partition of this test's `topic`, by partition.
    pub fn ends(&self, topic: &str) -> Result<BTreeMap<i32, i64>> {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        let timeout = std::time::Duration::from_secs(10);
        let consumer: BaseConsumer = self.client_config().create()?;
        let topic = &self.name(topic);
        let metadata = consumer.fetch_metadata(Some(topic), timeout)?;
        let partitions = metadata.topics().iter().flat_map(|t| t.partitions()).map(|p| p.id());
        partitions.map(|p| Ok((p, consumer.fetch_watermarks(topic, p, timeout)?.1))).collect()
    }

    /// Reads this test's `topic` from the beginning of every partition up to its end (its high
    /// watermark as it stands when the read starts): key, value and headers of each, in
    /// partition order, of committed transactions only (`read_committed`, librdkafka's
    /// default, whose position moves past transaction markers and aborted records).
    pub fn read_topic(&self, topic: &str) -> Result<Vec<KafkaRecord>> {
        use rdkafka::Message;
        use rdkafka::message::Headers;
        let mut by_partition: BTreeMap<i32, Vec<KafkaRecord>> = BTreeMap::new();
        self.read_each(topic, |message| {
            let headers = message
                .headers()
                .map(|h| {
                    h.iter()
                        .map(|h| (h.key.to_string(), String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned()))
                        .collect()
                })
                .unwrap_or_default();
            by_partition.entry(message.partition()).or_default().push(KafkaRecord {
                key: String::from_utf8_lossy(message.key().unwrap_or_default()).into_owned(),
                value: serde_json::from_slice(message.payload().unwrap_or_default()).unwrap_or(Value::Null),
                headers,
            });
        })?;
        Ok(by_partition.into_values().flatten().collect())
    }

    /// How many records of committed transactions this test's `topic` holds, read as
    /// [`read_topic`](Self::read_topic) reads them (without keeping them).
    pub fn count_records(&self, topic: &str) -> Result<u64> {
        let mut count = 0;
        self.read_each(topic, |_| count += 1)?;
        Ok(count)
    }

    /// Calls `each` with every record of this test's `topic`, as
    /// [`read_topic`](Self::read_topic) reads them; fails if the read stops moving for
    /// 120 s.
    fn read_each(&self, topic: &str, mut each: impl FnMut(&rdkafka::message::BorrowedMessage<'_>)) -> Result<()> {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        let ends = self.ends(topic)?;
        let consumer: BaseConsumer = self.consumer_config("sluice-tests-reader").create()?;
        let topic = &self.name(topic);
        let mut assignment = rdkafka::TopicPartitionList::new();
        for &partition in ends.keys() {
            assignment.add_partition_offset(topic, partition, rdkafka::Offset::Beginning)?;
        }
        consumer.assign(&assignment)?;
        let mut moved = std::time::Instant::now();
        loop {
            if let Some(message) = consumer.poll(std::time::Duration::from_millis(100)) {
                let Some(message) = delivered(message)? else { continue };
                each(&message);
                moved = std::time::Instant::now();
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
                return Ok(());
            }
            if moved.elapsed() > std::time::Duration::from_secs(120) {
                bail!("reading {topic}: partitions (partition, position, end) not read to their end: {behind:?}");
            }
        }
    }

    /// Reads `count` records of this test's `topic`'s `partition` from `offset` on with a plain
    /// consumer assigned there (no group): the offset and value (as text) of each, or
    /// fewer if no more arrive for 5 s.
    pub fn read_from(&self, topic: &str, partition: i32, offset: i64, count: usize) -> Result<Vec<(i64, String)>> {
        use rdkafka::Message;
        use rdkafka::consumer::{BaseConsumer, Consumer};
        let consumer: BaseConsumer = self.consumer_config("sluice-tests-reader").create()?;
        let mut assignment = rdkafka::TopicPartitionList::new();
        assignment.add_partition_offset(&self.name(topic), partition, rdkafka::Offset::Offset(offset))?;
        consumer.assign(&assignment)?;
        let mut read = Vec::new();
        let mut last = std::time::Instant::now();
        while read.len() < count && last.elapsed() < std::time::Duration::from_secs(5) {
            let Some(message) = consumer.poll(std::time::Duration::from_millis(100)) else { continue };
            let Some(message) = delivered(message)? else { continue };
            last = std::time::Instant::now();
            read.push((message.offset(), String::from_utf8_lossy(message.payload().unwrap_or_default()).into_owned()));
        }
        Ok(read)
    }

    /// The offsets this test's consumer group `group` committed for its `topic`, by
    /// partition (-1: none).
    pub fn committed(&self, group: &str, topic: &str) -> Result<BTreeMap<i32, i64>> {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        let consumer: BaseConsumer = self.consumer_config(group).create()?;
        let topic = &self.name(topic);
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
}

impl std::fmt::Display for Cluster {
    /// "Apache Kafka 4.4.0, 1 node at 127.0.0.1:PORT".
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let nodes = self.nodes.len();
        write!(
            f,
            "Apache Kafka {KAFKA_VERSION}, {nodes} node{} at {}",
            if nodes == 1 { "" } else { "s" },
            self.bootstrap
        )
    }
}

impl std::fmt::Display for KafkaBroker {
    /// "Apache Kafka 4.4.0, 1 node at 127.0.0.1:PORT, shared (this test's names begin
    /// t7-)": what a failing test ran against.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.cluster)?;
        if !self.prefix.is_empty() {
            write!(f, ", shared (this test's names begin {})", self.prefix)?;
        }
        Ok(())
    }
}

impl Drop for KafkaBroker {
    /// Says, when its test fails, what the test ran against and where its logs are.
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("the test ran against {self}; its logs: {}/node-*/server.log", self.cluster.dir.display());
        }
    }
}

impl Drop for Cluster {
    /// Stops every node and removes their data; their logs stay.
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                child.kill().ok();
                child.wait().ok();
            }
            std::fs::remove_dir_all(self.dir.join(format!("node-{}", node.id)).join("data")).ok();
        }
    }
}

/// A new directory for a cluster's nodes under `sluice-kafka/` in the system's temporary
/// directory, named after this process; the first call of a process removes what runs
/// of processes no longer alive left there.
fn logs_dir() -> Result<PathBuf> {
    static CLEARED: std::sync::Once = std::sync::Once::new();
    static CLUSTERS: AtomicU32 = AtomicU32::new(0);
    let root = std::env::temp_dir().join("sluice-kafka");
    CLEARED.call_once(|| {
        for entry in std::fs::read_dir(&root).into_iter().flatten().flatten() {
            let pid = entry.file_name().to_string_lossy().split('-').next().and_then(|p| p.parse::<u32>().ok());
            if pid.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists()) {
                std::fs::remove_dir_all(entry.path()).ok();
            }
        }
    });
    let n = CLUSTERS.fetch_add(1, Ordering::Relaxed);
    let dir = root.join(format!("{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
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

/// The message a poll gave, `None` for the broken connection to a node that died
/// (librdkafka reports it, and reconnects or fetches from the partition's new leader by
/// itself), or the error.
fn delivered<M>(polled: rdkafka::error::KafkaResult<M>) -> Result<Option<M>> {
    use rdkafka::error::KafkaError;
    use rdkafka::types::RDKafkaErrorCode;
    match polled {
        Ok(message) => Ok(Some(message)),
        Err(KafkaError::MessageConsumption(RDKafkaErrorCode::BrokerTransportFailure)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// A new random cluster id, as Kafka writes them: 16 bytes in URL-safe base64 without
/// padding (22 characters).
fn random_cluster_id() -> String {
    use base64::Engine;
    use std::hash::{BuildHasher, Hasher};
    let mut bytes = [0u8; 16];
    for half in bytes.chunks_mut(8) {
        // RandomState is seeded from the operating system's randomness.
        let random = std::collections::hash_map::RandomState::new().build_hasher().finish();
        half.copy_from_slice(&random.to_le_bytes());
    }
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}
