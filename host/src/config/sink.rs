//! `[sink]` and `[dead_letter]`: where outputs and failed records go.

use super::*;

/// `[sink]`
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum SinkConfig {
    /// A JSONL file, appended to.
    File {
        /// The file.
        path: PathBuf,
    },
    /// Standard output.
    #[default]
    Stdout,
    /// Records on a Kafka topic, through an idempotent producer.
    Kafka {
        /// Bootstrap servers, `host:port[,host:port…]`.
        brokers: String,
        /// The topic of outputs that do not name their own.
        topic: String,
        /// librdkafka producer properties, passed through (they win over sluice's).
        #[serde(default)]
        properties: BTreeMap<String, String>,
        /// Whether a crash may repeat outputs.
        #[serde(default)]
        guarantee: Guarantee,
    },
}

/// `[sink] guarantee`: what a consumer of the outputs sees after a crash.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Guarantee {
    /// The outputs of records processed since the last commit are sent again.
    #[default]
    AtLeastOnce,
    /// Outputs go out in Kafka transactions tied to the state's commits: a consumer
    /// reading `read_committed` sees each exactly once. Needs a Kafka source, whose
    /// consumer group records the input offset each transaction covers.
    ExactlyOnce,
}

/// `[dead_letter]`: a JSONL file, or a Kafka topic of the sink's cluster.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeadLetterConfig {
    /// The JSONL file dead letters are appended to; absent: [`DEFAULT_DEAD_LETTER_PATH`]
    /// unless `topic` is set.
    pub path: Option<PathBuf>,
    /// The Kafka topic dead letters are produced to, through the sink's producer
    /// (a Kafka sink only).
    pub topic: Option<String>,
}

/// Where dead letters go when `[dead_letter]` names nothing.
pub const DEFAULT_DEAD_LETTER_PATH: &str = "dead-letter.jsonl";

impl DeadLetterConfig {
    /// The dead-letter file, when dead letters go to one.
    pub fn path(&self) -> &Path {
        self.path.as_deref().unwrap_or(Path::new(DEFAULT_DEAD_LETTER_PATH))
    }
}
