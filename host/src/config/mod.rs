//! The job's configuration: a TOML file, then command-line overrides.
//!
//! This module owns parsing and validating configuration and nothing else: every
//! error names the file and, for TOML errors, the line and column. Unknown keys are
//! errors, so a typo never silently falls back to a default. Durations are a number
//! of seconds or a string such as `"500ms"`, `"10s"` or `"1m"`, all read by
//! [`parse_duration`]; the settings' older names with an `_s` suffix still work.
//!
//! Each section is a room of its own — `operator`, `source`, `sink` (with `[dead_letter]`),
//! `state` (with `[ttl]`), `checkpoint`, `report` (with `[admin]`), and `duration` for
//! the values of every section — holding its types, defaults and `validate`; the
//! rules between sections are [`Config::validate`]'s. Every setting, its default and what
//! it does are in one annotated reference, [`REFERENCE`] (`config/reference.toml`, which
//! `sluice config --reference` prints), which tests hold to the defaults here.

use anyhow::{Context, Result, bail};
use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

mod checkpoint;
mod duration;
mod operator;
mod reference;
mod report;
mod sink;
mod source;
mod state;

pub use checkpoint::*;
pub use duration::*;
pub use operator::*;
pub use reference::*;
pub use report::*;
pub use sink::*;
pub use source::*;
pub use state::*;

/// A whole job.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The operator to run.
    pub operator: OperatorConfig,
    /// Where records come from.
    #[serde(default)]
    pub source: SourceConfig,
    /// Where outputs go.
    #[serde(default)]
    pub sink: SinkConfig,
    /// Where state lives.
    #[serde(default)]
    pub state: StateConfig,
    /// When state expires.
    #[serde(default)]
    pub ttl: TtlConfig,
    /// Where records the operator could not process go.
    #[serde(default)]
    pub dead_letter: DeadLetterConfig,
    /// Checkpoints of the state to a checkpoint store, and restores from it.
    #[serde(default)]
    pub checkpoint: CheckpointConfig,
    /// The running summary.
    #[serde(default)]
    pub report: ReportConfig,
    /// The admin HTTP API.
    #[serde(default)]
    pub admin: AdminConfig,
}

impl Config {
    /// A job running the operator at `path` with every other setting at its default.
    pub fn for_operator(path: &Path) -> Self {
        Config {
            operator: OperatorConfig::for_path(path),
            source: SourceConfig::default(),
            sink: SinkConfig::default(),
            state: StateConfig::default(),
            ttl: TtlConfig::default(),
            dead_letter: DeadLetterConfig::default(),
            checkpoint: CheckpointConfig::default(),
            report: ReportConfig::default(),
            admin: AdminConfig::default(),
        }
    }

    /// Where the operator's deployed versions are recorded: the checkpoint store, which
    /// every host of the job shares; with checkpoints off, `versions` in the state
    /// directory (this host only).
    pub fn registry_url(&self) -> String {
        match self.checkpoint.enabled {
            true => self.checkpoint.store_url(&self.state.dir),
            false => self.state.dir.join("versions").to_string_lossy().into_owned(),
        }
    }

    /// Reads and validates the config file at `path`.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading config file {}", path.display()))?;
        let config: Config = toml::from_str(&text).map_err(|e| {
            anyhow::anyhow!("config file {} is not a valid sluice config: {}", path.display(), e.to_string().trim_end())
        })?;
        config.validate().with_context(|| format!("config file {}", path.display()))?;
        Ok(config)
    }

    /// Checks values that parse but cannot work.
    pub fn validate(&self) -> Result<()> {
        self.operator.validate()?;
        self.source.validate()?;
        self.state.validate()?;
        self.ttl.validate()?;
        self.checkpoint.validate()?;
        self.report.validate()?;
        self.admin.validate()?;
        // The rules between sections.
        if let (Some(path), Some(topic)) = (&self.dead_letter.path, &self.dead_letter.topic) {
            bail!(
                "[dead_letter] names both a file ({}) and a topic ({topic:?}): dead letters go to one of them",
                path.display()
            );
        }
        if let (Some(topic), SinkConfig::File { .. } | SinkConfig::Stdout) = (&self.dead_letter.topic, &self.sink) {
            bail!("[dead_letter] topic = {topic:?} needs a Kafka sink: dead letters go through its producer");
        }
        if let SinkConfig::Kafka { brokers, properties, guarantee: Guarantee::ExactlyOnce, .. } = &self.sink {
            let SourceConfig::Kafka { brokers: source_brokers, .. } = &self.source else {
                bail!(
                    "[sink] guarantee = \"exactly-once\" needs a Kafka source: each transaction records the input \
                     offset it covers in the source's consumer group"
                );
            };
            if brokers != source_brokers {
                bail!(
                    "[sink] guarantee = \"exactly-once\" needs the sink on the source's cluster: [sink] brokers \
                     {brokers:?} differ from [source] brokers {source_brokers:?} (a transaction commits the input \
                     offsets to the source's consumer group through the sink's brokers)"
                );
            }
            let timeout_ms = properties.get("transaction.timeout.ms").map_or(Ok(60_000), |ms| {
                ms.parse::<u64>()
                    .with_context(|| format!("[sink.properties] transaction.timeout.ms = {ms:?} is not a number"))
            })?;
            if self.state.commit_interval.as_millis() * 2 > timeout_ms as u128 {
                bail!(
                    "[state] commit_interval ({:?}) must be under half of the sink's transaction.timeout.ms \
                     ({timeout_ms} ms): a transaction stays open a commit interval and more, and the broker aborts \
                     one open longer",
                    self.state.commit_interval
                );
            }
        }
        Ok(())
    }
}

/// The largest size in MiB a setting takes: its bytes fit every counter with room to
/// spare.
pub const MAX_MIB: u64 = 1 << 24;

/// Fails unless each of `sizes` (a setting's name and its size in MiB) is at most
/// [`MAX_MIB`].
fn check_mib(sizes: &[(&str, u64)]) -> Result<()> {
    match sizes.iter().find(|&&(_, mib)| mib > MAX_MIB) {
        Some((name, mib)) => bail!("{name} = {mib} is more than {MAX_MIB} MiB (16 TiB), more than any host has"),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Under KIP-848's consumer protocol the broker owns the session timeout, the
    /// heartbeat and the assignment: librdkafka refuses those properties, so the config
    /// does first, naming the property and where its setting lives.
    #[test]
    fn the_consumer_group_protocol_refuses_what_the_broker_sets() {
        let kafka = |settings: &str| -> Config {
            toml::from_str(&format!(
                "[operator]\npath = \"op.wasm\"\n[source]\nkind = \"kafka\"\nbrokers = \"b:9092\"\ntopic = \"t\"\n{settings}"
            ))
            .unwrap()
        };
        let classic = kafka("[source.properties]\n\"session.timeout.ms\" = \"6000\"\n");
        assert!(matches!(classic.source, SourceConfig::Kafka { group_protocol: GroupProtocol::Classic, .. }));
        classic.validate().unwrap();
        kafka("group_protocol = \"consumer\"\n").validate().unwrap();
        for (name, instead) in [
            ("session.timeout.ms", "group.consumer.session.timeout.ms"),
            ("heartbeat.interval.ms", "group.consumer.heartbeat.interval.ms"),
            ("partition.assignment.strategy", "the broker assigns"),
        ] {
            let config = kafka(&format!("group_protocol = \"consumer\"\n[source.properties]\n{name:?} = \"1\"\n"));
            let err = config.validate().unwrap_err().to_string();
            assert!(err.contains(name) && err.contains(instead), "{err}");
        }
        let err = kafka("[source.properties]\n\"group.protocol\" = \"consumer\"\n").validate().unwrap_err().to_string();
        assert!(err.contains("set [source] group_protocol"), "{err}");
        let misspelt = "[operator]\npath = \"op.wasm\"\n[source]\nkind = \"kafka\"\nbrokers = \"b\"\ntopic = \"t\"\n\
                        group_protocol = \"kip848\"\n";
        let err = toml::from_str::<Config>(misspelt).unwrap_err().to_string();
        assert!(err.contains("classic") && err.contains("consumer"), "the choices are named: {err}");
    }

    #[test]
    fn a_minimal_config_takes_defaults() {
        let config: Config = toml::from_str("[operator]\npath = \"op.wasm\"\n").unwrap();
        assert_eq!(config.state.partitions, 4);
        assert_eq!(config.sink, SinkConfig::Stdout);
        config.validate().unwrap();
    }

    /// Exactly-once outputs need a Kafka source, whose group records the offsets
    /// their transactions cover; a misspelt guarantee names the choices.
    #[test]
    fn exactly_once_outputs_need_a_kafka_source() {
        let sink = "[sink]\nkind = \"kafka\"\nbrokers = \"b:9092\"\ntopic = \"out\"\nguarantee = \"exactly-once\"\n";
        let generator: Config = toml::from_str(&format!("[operator]\npath = \"op.wasm\"\n{sink}")).unwrap();
        let err = generator.validate().unwrap_err().to_string();
        assert!(err.contains("needs a Kafka source"), "{err}");
        let kafka: Config = toml::from_str(&format!(
            "[operator]\npath = \"op.wasm\"\n{sink}[source]\nkind = \"kafka\"\nbrokers = \"b:9092\"\ntopic = \"in\"\n"
        ))
        .unwrap();
        kafka.validate().unwrap();
        let mut elsewhere = kafka.clone();
        let SourceConfig::Kafka { brokers, .. } = &mut elsewhere.source else { unreachable!() };
        *brokers = "other:9092".into();
        let err = elsewhere.validate().unwrap_err().to_string();
        assert!(err.contains("needs the sink on the source's cluster"), "{err}");
        let mut slow = kafka.clone();
        slow.state.commit_interval = Duration::from_secs(31);
        let err = slow.validate().unwrap_err().to_string();
        assert!(err.contains("under half of the sink's transaction.timeout.ms (60000 ms)"), "{err}");
        let misspelt = toml::from_str::<Config>(&format!(
            "[operator]\npath = \"op.wasm\"\n{}",
            sink.replace("exactly-once", "exactly_once")
        ));
        let err = misspelt.unwrap_err().to_string();
        assert!(err.contains("at-least-once") && err.contains("exactly-once"), "{err}");
    }

    /// `standby` is "none", "all" or a number of hosts; anything else is refused with
    /// what it may be.
    #[test]
    fn standby_is_none_all_or_a_number_of_hosts() {
        use crate::config::Standby;
        let standby = |value: &str| {
            toml::from_str::<Config>(&format!("[operator]\npath = \"op.wasm\"\n[checkpoint]\nstandby = {value}\n"))
                .map(|config| config.checkpoint.standby)
                .map_err(|e| e.to_string())
        };
        assert_eq!(standby("\"none\""), Ok(Standby::None));
        assert_eq!(standby("\"all\""), Ok(Standby::All));
        assert_eq!(standby("2"), Ok(Standby::Hosts(2)));
        for (bad, says) in [("0", "1 or more"), ("-1", "1 or more"), ("\"some\"", "\"none\", \"all\" or a number")] {
            let err = standby(bad).expect_err(bad);
            assert!(err.contains("[checkpoint] standby") && err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn the_default_checkpoint_store_sits_beside_the_state_directory() {
        let checkpoint = CheckpointConfig::default();
        assert_eq!(checkpoint.store_url(Path::new("out/state")), "out/state.checkpoints");
        assert_eq!(checkpoint.store_url(Path::new("out/state/")), "out/state.checkpoints");
        let configured = CheckpointConfig { store: Some("s3://b/p".into()), ..CheckpointConfig::default() };
        assert_eq!(configured.store_url(Path::new("out/state")), "s3://b/p");
    }

    #[test]
    fn durations_are_seconds_or_strings_with_units_under_new_and_old_names() {
        let config: Config = toml::from_str(
            "[operator]\npath = \"op.wasm\"\npoll_versions_s = 0.25\n[checkpoint]\ninterval = \"500ms\"\n\
             restore_budget_s = 90\n[report]\ninterval = \"1m 30s\"\n[source]\nkind = \"generator\"\nduration = 2\n",
        )
        .unwrap();
        assert_eq!(config.operator.poll_versions, Duration::from_millis(250));
        assert_eq!(config.checkpoint.interval, Duration::from_millis(500));
        assert_eq!(config.checkpoint.restore_budget, Duration::from_secs(90));
        assert_eq!(config.report.interval, Duration::from_secs(90));
        assert!(
            matches!(config.source, SourceConfig::Generator { duration: Some(d), .. } if d == Duration::from_secs(2))
        );
        let kafka: Config = toml::from_str(
            "[operator]\npath = \"op.wasm\"\n[source]\nkind = \"kafka\"\nbrokers = \"b:9092\"\ntopic = \"t\"\n\
             stop_when_idle_s = \"10s\"\n",
        )
        .unwrap();
        assert!(
            matches!(kafka.source, SourceConfig::Kafka { stop_when_idle: Some(d), .. } if d == Duration::from_secs(10))
        );
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration(" 1.5 "), Ok(Duration::from_millis(1500)));
    }

    #[test]
    fn a_bad_duration_is_an_error_naming_the_setting() {
        for (setting, expected) in [
            ("[checkpoint]\ninterval_s = -1", "-1 is not a duration: durations are 0 or more seconds"),
            ("[report]\ninterval = \"soon\"", "\"soon\" is not a duration"),
            ("[checkpoint]\nrestore_budget = \"-5s\"", "\"-5s\" is not a duration"),
            ("[checkpoint]\ninterval = nan", "NaN is not a duration"),
            ("[checkpoint]\ninterval = true", "expected a duration: a number of seconds or a string"),
        ] {
            let text = format!("[operator]\npath = \"op.wasm\"\n{setting}\n");
            let err = toml::from_str::<Config>(&text).unwrap_err().to_string();
            let line = setting.lines().last().unwrap();
            assert!(err.contains(expected) && err.contains(line), "{setting}: {err}");
        }
        for (setting, expected) in [
            ("memory_limit_mib = 17592186044416", "[operator] memory_limit_mib = 17592186044416 is more than"),
            ("[state]\ncache_mib = 17592186044416", "[state] cache_mib = 17592186044416 is more than"),
            ("[source]\nkind = \"generator\"\nrate = 1e-300", "[source] rate must be at least 0.001"),
            ("[source]\nkind = \"generator\"\nrate = nan", "[source] rate must be at least 0.001"),
        ] {
            let config = toml::from_str::<Config>(&format!("[operator]\npath = \"op.wasm\"\n{setting}\n")).unwrap();
            let err = config.validate().unwrap_err().to_string();
            assert!(err.contains(expected), "{setting}: {err}");
        }
        let zero = toml::from_str::<Config>("[operator]\npath = \"op.wasm\"\npoll_versions = 0\n").unwrap();
        assert!(zero.validate().unwrap_err().to_string().contains("poll_versions must be more than 0"));
        let zero =
            toml::from_str::<Config>("[operator]\npath = \"op.wasm\"\n[state]\nrocksdb_memory_mib = 0\n").unwrap();
        assert!(zero.validate().unwrap_err().to_string().contains("rocksdb_memory_mib must be at least 1"));
    }

    #[test]
    fn ttls_are_durations_by_name_and_out_of_range_ones_are_refused() {
        let text = "[operator]\npath = \"op.wasm\"\n[ttl]\ndefault = \"7d\"\n[ttl.names]\nsummary = 90\n";
        let config = toml::from_str::<Config>(text).unwrap();
        assert_eq!(config.ttl.default, Some(Duration::from_secs(7 * 86_400)));
        assert_eq!(config.ttl.names["summary"], Ttl(Duration::from_secs(90)));
        config.validate().unwrap();
        for (ttl, expected) in [
            ("\"0s\"", "[ttl.names] summary = 0ns is under 1 ms"),
            ("0.0005", "[ttl.names] summary = 500µs is under 1 ms"),
            ("18446744073709552", "[ttl.names] summary = 18446744073709552s is more than 18446744073709551s"),
        ] {
            let text = format!("[operator]\npath = \"op.wasm\"\n[ttl.names]\nsummary = {ttl}\n");
            let err = toml::from_str::<Config>(&text).unwrap().validate().unwrap_err().to_string();
            assert!(err.contains(expected), "{ttl}: {err}");
        }
        let shortest = "[operator]\npath = \"op.wasm\"\n[ttl]\ndefault = \"1ms\"\n";
        toml::from_str::<Config>(shortest).unwrap().validate().unwrap();
    }

    /// Dead letters go to a file or to a topic of a Kafka sink, never both.
    #[test]
    fn a_dead_letter_topic_needs_a_kafka_sink_and_no_file() {
        let config = |more: &str| toml::from_str::<Config>(&format!("[operator]\npath = \"op.wasm\"\n{more}")).unwrap();
        let kafka = "[sink]\nkind = \"kafka\"\nbrokers = \"b:9092\"\ntopic = \"out\"\n";
        let on_kafka = config(&format!("{kafka}[dead_letter]\ntopic = \"dead\"\n"));
        on_kafka.validate().unwrap();
        assert_eq!(on_kafka.dead_letter.topic.as_deref(), Some("dead"));
        assert_eq!(config("").dead_letter.path(), Path::new(DEFAULT_DEAD_LETTER_PATH));
        let both = config(&format!("{kafka}[dead_letter]\ntopic = \"dead\"\npath = \"dead.jsonl\"\n"));
        let err = both.validate().unwrap_err().to_string();
        assert!(err.contains("names both a file (dead.jsonl) and a topic (\"dead\")"), "{err}");
        let on_file = config("[dead_letter]\ntopic = \"dead\"\n");
        let err = on_file.validate().unwrap_err().to_string();
        assert!(err.contains("[dead_letter] topic = \"dead\" needs a Kafka sink"), "{err}");
    }

    /// `[admin] host_names` are names alone: one with a port or a scheme would never
    /// match a request's `Host`.
    #[test]
    fn admin_host_names_are_names_alone() {
        let config = |names: &str| {
            toml::from_str::<Config>(&format!("[operator]\npath = \"op.wasm\"\n[admin]\nhost_names = {names}\n"))
                .unwrap()
        };
        config(r#"["devbox", "devbox.internal", "dev-1"]"#).validate().unwrap();
        for bad in ["devbox:9464", "http://devbox", ""] {
            let err = config(&format!("[{bad:?}]")).validate().unwrap_err().to_string();
            assert!(err.contains(&format!("[admin] host_names: {bad:?} is not a host name")), "{err}");
        }
    }

    #[test]
    fn a_typo_is_an_error_not_a_default() {
        let err = toml::from_str::<Config>("[operator]\npath = \"op.wasm\"\n[state]\npartitons = 3\n").unwrap_err();
        assert!(err.to_string().contains("partitons"), "{err}");
    }
}
