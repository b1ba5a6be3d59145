//! Shared pieces of the end-to-end tests: locating the built `sluice` binary and
//! operators, running them, reading JSONL, and the reference fold of vehicle-stats
//! computed independently of the operator.
//!
//! `./dev.sh test` builds the binary and the operators before the tests run; the
//! tests find them next to their own executable in the cargo target directory.

use anyhow::{Context, Result, bail};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The cargo target directory the tests were built into.
pub fn target_dir() -> PathBuf {
    // <target>/debug/deps/<test-binary>
    let exe = std::env::current_exe().expect("test executable path");
    exe.ancestors().nth(3).expect("test executable lives in <target>/<profile>/deps").to_path_buf()
}

/// The `sluice` binary built alongside the tests.
pub fn sluice_bin() -> PathBuf {
    let bin = target_dir().join("debug").join("sluice");
    assert!(bin.exists(), "{} is missing: run the tests with ./dev.sh test, which builds it", bin.display());
    bin
}

/// The component of operator crate `name` (e.g. `vehicle_stats`), built for wasm32-wasip2.
pub fn operator_wasm(name: &str) -> PathBuf {
    let wasm = target_dir().join("wasm32-wasip2").join("release").join(format!("{name}.wasm"));
    assert!(wasm.exists(), "{} is missing: run the tests with ./dev.sh test, which builds operators", wasm.display());
    wasm
}

/// A `sluice` command with logging kept to warnings.
pub fn sluice() -> Command {
    let mut command = Command::new(sluice_bin());
    command.env("SLUICE_LOG", "warn");
    command
}

/// `sluice run` of `operator` with `partitions` partitions, state in `dir/state` (so
/// checkpoints in `dir/state.checkpoints`), outputs in `dir/out.jsonl` and dead
/// letters in `dir/dead.jsonl`, without the running summary; the source is the
/// caller's to add.
pub fn run_job(operator: &Path, dir: &Path, partitions: u32) -> Command {
    let mut command = sluice();
    command
        .arg("run")
        .arg("--operator")
        .arg(operator)
        .arg("--output")
        .arg(dir.join("out.jsonl"))
        .arg("--dead-letter")
        .arg(dir.join("dead.jsonl"))
        .arg("--state-dir")
        .arg(dir.join("state"))
        .args(["--partitions", &partitions.to_string(), "--report-interval", "0"]);
    command
}

/// [`run_job`] of `operator` over the JSONL file `input`.
pub fn run_file_job(operator: &Path, input: &Path, dir: &Path, partitions: u32) -> Command {
    let mut command = run_job(operator, dir, partitions);
    command.arg("--input").arg(input);
    command
}

/// [`run_job`] of vehicle-stats over the embedded generator (`vehicles`, `count`, `seed`).
pub fn run_generator_job(dir: &Path, vehicles: u32, count: u64, seed: u64, partitions: u32) -> Command {
    let mut command = run_job(&operator_wasm("vehicle_stats"), dir, partitions);
    command.args(["--vehicles", &vehicles.to_string(), "--count", &count.to_string(), "--seed", &seed.to_string()]);
    command
}

/// The checkpoint manifests of `partition` in the local checkpoint store `store`,
/// oldest first.
pub fn checkpoint_manifests(store: &Path, partition: u32) -> Result<Vec<Value>> {
    let dir = store.join(format!("partition-{partition:04}")).join("manifests");
    let mut paths: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(entries) => entries.map(|e| Ok(e?.path())).collect::<Result<_>>()?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e).with_context(|| format!("listing {}", dir.display())),
    };
    paths.retain(|p| p.extension().is_some_and(|e| e == "json"));
    paths.sort();
    paths
        .iter()
        .map(|p| serde_json::from_slice(&std::fs::read(p)?).with_context(|| format!("parsing {}", p.display())))
        .collect()
}

/// The files of `partition` in the local checkpoint store `store`: object name -> size.
pub fn checkpoint_files(store: &Path, partition: u32) -> Result<BTreeMap<String, u64>> {
    let dir = store.join(format!("partition-{partition:04}")).join("files");
    let mut files = BTreeMap::new();
    match std::fs::read_dir(&dir) {
        Ok(entries) => {
            for entry in entries {
                let entry = entry?;
                files.insert(entry.file_name().to_string_lossy().into_owned(), entry.metadata()?.len());
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("listing {}", dir.display())),
    }
    Ok(files)
}

/// The object names a manifest references (`name.checksum`, as the store names them).
pub fn manifest_objects(manifest: &Value) -> std::collections::BTreeSet<String> {
    manifest["files"]
        .as_array()
        .map(|files| {
            files
                .iter()
                .map(|f| format!("{}.{}", f["name"].as_str().unwrap_or(""), f["checksum"].as_str().unwrap_or("")))
                .collect()
        })
        .unwrap_or_default()
}

/// A loopback port nothing listens on (released again, for a server to take).
pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
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
    let started = std::time::Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if started.elapsed() > std::time::Duration::from_secs(20) {
            child.kill().ok();
            bail!("{name} did not start listening on port {port}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
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
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
    }
}

/// A Kafka-protocol broker (tansu with in-memory storage, installed by `./dev.sh test`)
/// on a free loopback port; stopped when dropped.
pub struct KafkaBroker {
    child: std::process::Child,
    /// `127.0.0.1:PORT`.
    pub bootstrap: String,
}

impl KafkaBroker {
    /// Starts the broker and waits until it accepts connections.
    pub fn start() -> Result<Self> {
        let port = free_port()?;
        let url = format!("tcp://127.0.0.1:{port}");
        let mut command = Command::new("tansu");
        command
            .args(["broker", "--storage-engine", "memory://tansu/", "--listener-url", &url])
            .args(["--advertised-listener-url", &url]);
        let child = spawn_listening(command, port)?;
        Ok(KafkaBroker { child, bootstrap: format!("127.0.0.1:{port}") })
    }

    /// Creates `topic` with `partitions` partitions.
    pub fn create_topic(&self, topic: &str, partitions: i32) -> Result<()> {
        use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
        let admin: AdminClient<rdkafka::client::DefaultClientContext> =
            rdkafka::ClientConfig::new().set("bootstrap.servers", &self.bootstrap).create()?;
        let topics = [NewTopic::new(topic, partitions, TopicReplication::Fixed(1))];
        for result in futures::executor::block_on(admin.create_topics(&topics, &AdminOptions::new()))? {
            result.map_err(|(topic, e)| anyhow::anyhow!("creating topic {topic}: {e}"))?;
        }
        Ok(())
    }

    /// Produces every line of the JSONL file `input` to `topic`, keyed by its
    /// `vehicle_id`, partitioned as Kafka's Java producer does (murmur2). One record per
    /// batch: tansu 0.6 answers a fetch that starts inside a multi-record batch with
    /// records from elsewhere in the partition, and consumers that resume mid-batch
    /// (after a restore, a pause or a rebalance) would skip records.
    pub fn produce_lines(&self, topic: &str, input: &Path) -> Result<usize> {
        use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
        let producer: ThreadedProducer<rdkafka::producer::DefaultProducerContext> = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .set("partitioner", "murmur2_random")
            .set("enable.idempotence", "true")
            .set("batch.num.messages", "1")
            .create()?;
        let text = std::fs::read_to_string(input)?;
        for line in text.lines() {
            let value: Value = serde_json::from_str(line)?;
            let key = value["vehicle_id"].as_str().context("a line without vehicle_id")?;
            let mut record = BaseRecord::to(topic).key(key).payload(line);
            while let Err((e, returned)) = producer.send(record) {
                record = returned;
                if !matches!(
                    e,
                    rdkafka::error::KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull)
                ) {
                    bail!("producing to {topic}: {e}");
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
        producer.flush(std::time::Duration::from_secs(30))?;
        Ok(text.lines().count())
    }

    /// Reads `topic` from the beginning of every partition until nothing more arrives
    /// for 2 s: key, value and headers of each, in partition order. (tansu's high
    /// watermarks trail the last batch, so "the end" is found by waiting.)
    pub fn read_topic(&self, topic: &str) -> Result<Vec<KafkaRecord>> {
        use rdkafka::Message;
        use rdkafka::consumer::{BaseConsumer, Consumer};
        use rdkafka::message::Headers;
        let consumer: BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .set("group.id", "sluice-tests-reader")
            .set("enable.auto.commit", "false")
            .create()?;
        let metadata = consumer.fetch_metadata(Some(topic), std::time::Duration::from_secs(10))?;
        let mut assignment = rdkafka::TopicPartitionList::new();
        for partition in metadata.topics().iter().flat_map(|t| t.partitions()) {
            assignment.add_partition_offset(topic, partition.id(), rdkafka::Offset::Beginning)?;
        }
        consumer.assign(&assignment)?;
        let mut last = std::time::Instant::now();
        let mut by_partition: BTreeMap<i32, Vec<KafkaRecord>> = BTreeMap::new();
        while last.elapsed() < std::time::Duration::from_secs(2) {
            let Some(message) = consumer.poll(std::time::Duration::from_millis(100)) else { continue };
            let message = message?;
            last = std::time::Instant::now();
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
        }
        Ok(by_partition.into_values().flatten().collect())
    }

    /// The offsets consumer group `group` committed for `topic`, by partition (-1: none).
    pub fn committed(&self, group: &str, topic: &str) -> Result<BTreeMap<i32, i64>> {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        let consumer: BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .create()?;
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
    /// summing to the count: each partition's offsets run from 0 without gaps).
    pub fn wait_committed(&self, group: &str, topic: &str, records: i64, timeout: std::time::Duration) -> Result<()> {
        let started = std::time::Instant::now();
        loop {
            let offsets = self.committed(group, topic)?;
            if offsets.values().map(|&o| o.max(0)).sum::<i64>() == records {
                return Ok(());
            }
            if started.elapsed() > timeout {
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

/// Sends `signal` (a name such as `TERM`) to process `pid`.
fn signal(pid: u32, signal: &str) -> Result<()> {
    run_ok(Command::new("kill").arg(format!("-{signal}")).arg(pid.to_string())).map(drop)
}

/// A `sluice` process running in the background, its stderr in a log file; killed when
/// dropped.
pub struct Host {
    child: Option<std::process::Child>,
    /// What the test calls it.
    pub name: String,
    /// Its stderr.
    pub log: PathBuf,
}

impl Host {
    /// Spawns `command` as host `name`, appending its stderr, logged at info level, to
    /// `log`.
    pub fn spawn(name: &str, command: &mut Command, log: &Path) -> Result<Self> {
        let file = std::fs::OpenOptions::new().create(true).append(true).open(log)?;
        let child = command
            .env("SLUICE_LOG", "info")
            .stdout(std::process::Stdio::null())
            .stderr(file)
            .spawn()
            .with_context(|| format!("starting host {name}"))?;
        Ok(Host { child: Some(child), name: name.to_string(), log: log.to_path_buf() })
    }

    /// Everything it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until its log holds `pattern` at least `count` times; fails if it exits
    /// first or `timeout` passes.
    pub fn wait_for(&mut self, pattern: &str, count: usize, timeout: std::time::Duration) -> Result<()> {
        let started = std::time::Instant::now();
        loop {
            let log = self.log();
            if log.matches(pattern).count() >= count {
                return Ok(());
            }
            let child = self.child.as_mut().context("host already stopped")?;
            if let Some(status) = child.try_wait()? {
                bail!("host {} exited ({status}) before logging {pattern:?} {count} times:\n{log}", self.name);
            }
            if started.elapsed() > timeout {
                bail!("host {} did not log {pattern:?} {count} times in {timeout:?}:\n{log}", self.name);
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// The address of its admin API (`http://127.0.0.1:port`), once it logs it.
    pub fn admin_url(&mut self) -> Result<String> {
        const LISTENING: &str = "admin API listening on ";
        self.wait_for(LISTENING, 1, std::time::Duration::from_secs(60))?;
        let log = self.log();
        let rest = &log[log.find(LISTENING).expect("waited for it") + LISTENING.len()..];
        Ok(rest.split_whitespace().next().unwrap_or_default().to_string())
    }

    /// Kills it with SIGKILL: no handover, no last checkpoint.
    pub fn kill_9(&mut self) -> Result<()> {
        let mut child = self.child.take().context("host already stopped")?;
        child.kill()?;
        child.wait()?;
        Ok(())
    }

    /// Stops it with SIGTERM and waits for it to exit; fails unless it exits cleanly.
    pub fn terminate(&mut self) -> Result<()> {
        let mut child = self.child.take().context("host already stopped")?;
        signal(child.id(), "TERM")?;
        let started = std::time::Instant::now();
        loop {
            if let Some(status) = child.try_wait()? {
                if !status.success() {
                    bail!("host {} exited with {status} after SIGTERM:\n{}", self.name, self.log());
                }
                return Ok(());
            }
            if started.elapsed() > std::time::Duration::from_secs(60) {
                child.kill().ok();
                bail!("host {} did not stop within 60 s of SIGTERM:\n{}", self.name, self.log());
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().ok();
            child.wait().ok();
        }
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

/// Runs `command`, failing with its stderr unless it succeeds.
pub fn run_ok(command: &mut Command) -> Result<Output> {
    let output = command.output().with_context(|| format!("running {command:?}"))?;
    if !output.status.success() {
        bail!("{command:?} failed ({}):\n{}", output.status, String::from_utf8_lossy(&output.stderr));
    }
    Ok(output)
}

/// Runs `command`, expecting it to fail; returns its stderr.
pub fn run_err(command: &mut Command) -> Result<String> {
    let output = command.output().with_context(|| format!("running {command:?}"))?;
    if output.status.success() {
        bail!("{command:?} succeeded but should have failed:\n{}", String::from_utf8_lossy(&output.stderr));
    }
    Ok(String::from_utf8_lossy(&output.stderr).into_owned())
}

/// Writes the generator's records to `path` with `sluice generate`.
pub fn generate(path: &Path, vehicles: u32, count: u64, seed: u64) -> Result<()> {
    let output = run_ok(sluice().args(["generate", "--vehicles", &vehicles.to_string()]).args([
        "--count",
        &count.to_string(),
        "--seed",
        &seed.to_string(),
    ]))?;
    std::fs::write(path, output.stdout)?;
    Ok(())
}

/// Parses every line of a JSONL file (a missing file is empty).
pub fn read_jsonl(path: &Path) -> Result<Vec<Value>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).with_context(|| format!("{}: bad line {l}", path.display())))
        .collect()
}

/// `sluice state dump` of `state_dir`: key -> name -> value.
pub fn dump_state(state_dir: &Path) -> Result<BTreeMap<String, BTreeMap<String, Value>>> {
    let output = run_ok(sluice().args(["state", "dump", "--state-dir"]).arg(state_dir))?;
    let mut state: BTreeMap<String, BTreeMap<String, Value>> = BTreeMap::new();
    for line in String::from_utf8(output.stdout)?.lines() {
        let entry: Value = serde_json::from_str(line)?;
        let key = entry["key"].as_str().context("dump line without key")?.to_string();
        let name = entry["name"].as_str().context("dump line without name")?.to_string();
        state.entry(key).or_default().insert(name, entry["value"].clone());
    }
    Ok(state)
}

/// The vehicle-stats summary of one vehicle, as the reference fold computes it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    pub count: u64,
    pub mean_speed_kmh: f64,
    pub max_speed_kmh: f64,
    pub distance_km: f64,
    pub first_seen: i64,
    pub last_seen: i64,
    pub last_lat: f64,
    pub last_lon: f64,
}

/// The reference fold of vehicle-stats: every input's summary after it, in input
/// order, computed here from the specification, not from the operator's code.
pub struct Reference {
    /// Per input line (that is a valid position), the vehicle and its summary after it.
    pub after_each: Vec<(String, Summary)>,
    /// Each vehicle's final summary.
    pub last: BTreeMap<String, Summary>,
}

impl Reference {
    /// Folds the JSONL positions in `input`, skipping lines that are not positions.
    pub fn fold(input: &Path) -> Result<Self> {
        let mut last: BTreeMap<String, Summary> = BTreeMap::new();
        let mut after_each = Vec::new();
        for line in std::fs::read_to_string(input)?.lines() {
            let Ok(p) = serde_json::from_str::<Value>(line) else { continue };
            let (Some(id), Some(ts), Some(lat), Some(lon), Some(speed)) = (
                p["vehicle_id"].as_str(),
                p["ts"].as_i64(),
                p["lat"].as_f64(),
                p["lon"].as_f64(),
                p["speed_kmh"].as_f64(),
            ) else {
                continue;
            };
            let s = last.entry(id.to_string()).or_default();
            if s.count == 0 {
                s.first_seen = ts;
                s.last_seen = ts;
            } else {
                s.distance_km += great_circle_km((s.last_lat, s.last_lon), (lat, lon));
            }
            s.count += 1;
            s.mean_speed_kmh = (s.mean_speed_kmh * (s.count - 1) as f64 + speed) / s.count as f64;
            s.max_speed_kmh = s.max_speed_kmh.max(speed);
            s.first_seen = s.first_seen.min(ts);
            s.last_seen = s.last_seen.max(ts);
            (s.last_lat, s.last_lon) = (lat, lon);
            after_each.push((id.to_string(), s.clone()));
        }
        Ok(Reference { after_each, last })
    }
}

/// Haversine distance on a sphere of the mean Earth radius.
fn great_circle_km((lat1, lon1): (f64, f64), (lat2, lon2): (f64, f64)) -> f64 {
    let (p1, p2) = (lat1.to_radians(), lat2.to_radians());
    let h = ((p2 - p1) / 2.0).sin().powi(2) + p1.cos() * p2.cos() * ((lon2 - lon1).to_radians() / 2.0).sin().powi(2);
    2.0 * 6371.0088 * h.sqrt().asin()
}

/// Fails unless the operator's JSON summary equals `expected` (floats to 1e-9 relative).
pub fn assert_summary(actual: &Value, vehicle: &str, expected: &Summary, context: &str) {
    let close = |field: &str, want: f64| {
        let got = actual[field].as_f64().unwrap_or(f64::NAN);
        assert!(
            (got - want).abs() <= 1e-9 * want.abs().max(1.0),
            "{context}: vehicle {vehicle} {field} = {got}, reference {want}\n{actual}"
        );
    };
    assert_eq!(actual["vehicle_id"].as_str(), Some(vehicle), "{context}: {actual}");
    assert_eq!(actual["count"].as_u64(), Some(expected.count), "{context}: vehicle {vehicle} count\n{actual}");
    assert_eq!(actual["first_seen"].as_i64(), Some(expected.first_seen), "{context}: vehicle {vehicle}\n{actual}");
    assert_eq!(actual["last_seen"].as_i64(), Some(expected.last_seen), "{context}: vehicle {vehicle}\n{actual}");
    close("mean_speed_kmh", expected.mean_speed_kmh);
    close("max_speed_kmh", expected.max_speed_kmh);
    close("distance_km", expected.distance_km);
    close("last_lat", expected.last_lat);
    close("last_lon", expected.last_lon);
}

/// Fails unless the dumped state holds exactly the reference's final summaries.
pub fn assert_state_matches(state: &BTreeMap<String, BTreeMap<String, Value>>, reference: &Reference, context: &str) {
    assert_eq!(
        state.keys().collect::<Vec<_>>(),
        reference.last.keys().collect::<Vec<_>>(),
        "{context}: vehicles holding state"
    );
    for (vehicle, expected) in &reference.last {
        assert_summary(&state[vehicle]["summary"], vehicle, expected, context);
    }
}
