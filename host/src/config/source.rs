//! `[source]`: the embedded generator, a JSONL file or a Kafka topic, with their defaults
//! and checks.

use super::*;

/// `[source]`
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum SourceConfig {
    /// The embedded fleet generator.
    Generator {
        /// Number of vehicles (distinct keys).
        #[serde(default = "default_vehicles")]
        vehicles: u32,
        /// Records to produce; absent with no `duration` is unbounded.
        count: Option<u64>,
        /// Wall-clock time to run for.
        #[serde(default, alias = "duration_s", deserialize_with = "optional_duration")]
        duration: Option<Duration>,
        /// Records per second; absent is as fast as possible.
        rate: Option<f64>,
        /// Seed: the same seed gives the same records.
        #[serde(default)]
        seed: u64,
        /// Every this many records a vehicle leaves for good and a new one joins.
        churn: Option<u64>,
    },
    /// A JSONL file, one record per line.
    File {
        /// The file.
        path: PathBuf,
        /// The JSON field holding the record key.
        #[serde(default = "default_key_field")]
        key_field: String,
        /// The JSON field holding the event time (ms since the epoch).
        #[serde(default = "default_timestamp_field")]
        timestamp_field: String,
        /// Records per second; absent is as fast as possible.
        rate: Option<f64>,
        /// The longest line read as a record; a longer one is skipped, logged, so one
        /// line cannot make the host hold a file's worth of memory.
        #[serde(default = "default_max_line_bytes")]
        max_line_bytes: usize,
    },
    /// A Kafka topic, consumed as a member of a consumer group.
    Kafka {
        /// Bootstrap servers, `host:port[,host:port…]`.
        brokers: String,
        /// The topic; the job's partitions are its partitions.
        topic: String,
        /// The consumer group.
        #[serde(default = "default_group")]
        group: String,
        /// Static membership (`group.instance.id`).
        instance_id: Option<String>,
        /// The consumer group protocol: classic or KIP-848's.
        #[serde(default)]
        group_protocol: GroupProtocol,
        /// librdkafka consumer properties, passed through (they win over sluice's).
        #[serde(default)]
        properties: BTreeMap<String, String>,
        /// Stop once no record arrived for this long; absent runs until killed.
        #[serde(default, alias = "stop_when_idle_s", deserialize_with = "optional_duration")]
        stop_when_idle: Option<Duration>,
        /// What a partition whose state's offset is older than its log's earliest
        /// retained record does.
        #[serde(default)]
        offset_out_of_range: OutOfRange,
        /// What becomes of a record without a key.
        #[serde(default)]
        null_keys: NullKeys,
    },
}

/// `[source] group_protocol`: how the members of a Kafka source's group are assigned
/// partitions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GroupProtocol {
    /// The classic protocol: the members agree on an assignment (cooperative-sticky)
    /// through the group coordinator; the session timeout is the member's
    /// `session.timeout.ms`.
    #[default]
    Classic,
    /// KIP-848's (Kafka 4.0 and later): the broker assigns, and owns the session
    /// timeout (`group.consumer.session.timeout.ms`) and heartbeat interval.
    Consumer,
}

impl GroupProtocol {
    /// The librdkafka consumer properties the broker sets under this protocol, which
    /// librdkafka refuses in `[source] properties`, each with what to do instead.
    pub fn refused_properties(self) -> &'static [(&'static str, &'static str)] {
        match self {
            GroupProtocol::Classic => &[],
            GroupProtocol::Consumer => &[
                ("session.timeout.ms", "the broker's group.consumer.session.timeout.ms sets it"),
                ("heartbeat.interval.ms", "the broker's group.consumer.heartbeat.interval.ms sets it"),
                ("partition.assignment.strategy", "the broker assigns (group.consumer.assignors)"),
                ("group.protocol.type", "it is the classic protocol's"),
            ],
        }
    }
}

/// `[source] null_keys`: what becomes of a Kafka record without a key. Keyed state is
/// scoped to the key's bytes, so keyless records — which producers spread over every
/// partition — would share one state per partition with each other and with empty keys.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NullKeys {
    /// To the dead letters (kind `null-key`), the operator not called.
    #[default]
    DeadLetter,
    /// To the operator, with an empty key and the `sluice-null-key` header: for
    /// operators that keep no state for such records.
    Operator,
}

/// `[source] offset_out_of_range`: what a partition does when the records after its
/// state's offset are gone (retention deleted them while the job was down, a restore
/// from an old checkpoint). A state offset past the log's end always stops its
/// partition.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutOfRange {
    /// Stop the partition alone, naming it, the state's offset and the log's range.
    #[default]
    Fail,
    /// Resume at the earliest retained record; the gap is logged and counted.
    Earliest,
}

/// `[source] group` of a Kafka source when unset.
fn default_group() -> String {
    "sluice".into()
}

/// `[source] vehicles` of the generator when unset.
fn default_vehicles() -> u32 {
    1000
}

impl SourceConfig {
    /// What to do with records without a key: the Kafka source's setting; the other
    /// sources have no such records.
    pub fn null_keys(&self) -> NullKeys {
        match self {
            SourceConfig::Kafka { null_keys, .. } => *null_keys,
            SourceConfig::Generator { .. } | SourceConfig::File { .. } => NullKeys::default(),
        }
    }

    /// Checks values that parse but cannot work.
    pub fn validate(&self) -> Result<()> {
        let duration = match self {
            SourceConfig::Generator { duration, .. } => duration.map(|d| ("[source] duration", d)),
            SourceConfig::Kafka { stop_when_idle, .. } => stop_when_idle.map(|d| ("[source] stop_when_idle", d)),
            SourceConfig::File { .. } => None,
        };
        if let Some((setting, duration)) = duration {
            check_duration(setting, duration)?;
        }
        if let SourceConfig::Kafka { group_protocol, properties, .. } = self {
            if properties.contains_key("group.protocol") {
                bail!(
                    "[source.properties] \"group.protocol\": set [source] group_protocol (\"classic\" or \"consumer\") instead"
                );
            }
            let refused = group_protocol.refused_properties().iter().find(|(name, _)| properties.contains_key(*name));
            if let Some((name, instead)) = refused {
                bail!(
                    "[source.properties] {name:?} does not apply with [source] group_protocol = \"consumer\": {instead}"
                );
            }
        }
        if let SourceConfig::Generator { vehicles, .. } = self {
            check_vehicles("[source] vehicles", *vehicles)?;
        }
        let rate = match self {
            SourceConfig::Generator { vehicles: 0, .. } => bail!("[source] vehicles must be at least 1"),
            SourceConfig::File { max_line_bytes: 0, .. } => bail!("[source] max_line_bytes must be at least 1"),
            SourceConfig::Generator { rate, .. } | SourceConfig::File { rate, .. } => *rate,
            SourceConfig::Kafka { stop_when_idle, .. } => {
                if stop_when_idle.is_some_and(|idle| idle.is_zero()) {
                    bail!("[source] stop_when_idle must be more than 0");
                }
                None
            }
        };
        if rate.is_some_and(|r| r.is_nan() || r < MIN_RATE) {
            bail!("[source] rate must be at least {MIN_RATE} records per second (one record every 1000 s)");
        }
        Ok(())
    }

    /// A JSONL file source at `path` with the default key and timestamp fields.
    pub fn file(path: PathBuf) -> Self {
        SourceConfig::File {
            path,
            key_field: default_key_field(),
            timestamp_field: default_timestamp_field(),
            rate: None,
            max_line_bytes: default_max_line_bytes(),
        }
    }
}

/// The longest line a file source (and `sluice test`) reads by default.
pub fn default_max_line_bytes() -> usize {
    16 << 20
}

/// The JSON field a file source (and `sluice test`) takes a record's key from by default.
pub fn default_key_field() -> String {
    "vehicle_id".into()
}

/// The JSON field a file source (and `sluice test`) takes a record's event time from by
/// default.
pub fn default_timestamp_field() -> String {
    "ts".into()
}

impl Default for SourceConfig {
    fn default() -> Self {
        SourceConfig::Generator {
            vehicles: default_vehicles(),
            count: Some(100_000),
            duration: None,
            rate: None,
            seed: 0,
            churn: None,
        }
    }
}

/// The most vehicles the embedded generator simulates (`[source] vehicles`, `sluice
/// generate --vehicles`): it holds each in memory, about 100 bytes a vehicle.
pub const MAX_VEHICLES: u32 = 1 << 24;

/// Fails, naming `setting`, when the generator is asked for more than [`MAX_VEHICLES`].
pub fn check_vehicles(setting: &str, vehicles: u32) -> Result<()> {
    if vehicles > MAX_VEHICLES {
        bail!("{setting} = {vehicles} is more than {MAX_VEHICLES}: the generator holds every vehicle in memory");
    }
    Ok(())
}

/// The slowest `[source] rate`, records per second.
pub const MIN_RATE: f64 = 0.001;
