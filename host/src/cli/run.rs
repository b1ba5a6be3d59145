//! `sluice run`: a job's config, from its file (or an operator alone) with the command
//! line's overrides applied, run to its end, and its report written to stderr.
//!
//! This module owns how the flags of `sluice run` override a config file: which flag
//! replaces which setting, and which flags a source or a sink refuses. It does not own
//! the flags themselves ([`args`](super::args)), the config's rules (`Config::validate`,
//! which runs last) or the job (`sluice::job`).

use super::args::RunArgs;
use anyhow::{Result, bail};
use sluice::config::{Config, SinkConfig, SourceConfig};

/// `sluice run`
pub fn run_job(args: RunArgs) -> Result<()> {
    let config = args.into_config()?;
    let report = sluice::job::run(&config)?;
    eprint!("{report}");
    Ok(())
}

impl RunArgs {
    /// The config file (or defaults) with this command line's overrides applied.
    fn into_config(self) -> Result<Config> {
        let mut config = match (&self.config, &self.operator) {
            (Some(path), _) => Config::load(path)?,
            (None, Some(operator)) => Config::for_operator(operator),
            (None, None) => bail!("no operator: pass --operator FILE.wasm or --config FILE with an [operator] path"),
        };
        if let Some(path) = self.operator {
            config.operator.path = path;
        }
        // A file source of the config keeps its fields and rate; any other becomes one.
        if let Some(input) = self.input {
            match &mut config.source {
                SourceConfig::File { path, .. } => *path = input,
                source => *source = SourceConfig::file(input),
            }
        }
        match &mut config.source {
            SourceConfig::Generator { vehicles, count, seed, rate, churn, .. } => {
                *vehicles = self.fleet.vehicles.unwrap_or(*vehicles);
                *count = self.fleet.count.or(*count);
                *seed = self.fleet.seed.unwrap_or(*seed);
                *churn = self.fleet.churn.or(*churn);
                *rate = self.rate.or(*rate);
            }
            SourceConfig::File { rate, .. } => {
                if self.fleet.any() {
                    bail!("--vehicles, --count, --seed and --churn apply to the generator, but the source is a file");
                }
                *rate = self.rate.or(*rate);
            }
            SourceConfig::Kafka { .. } => {
                if self.fleet.any() {
                    bail!("--vehicles, --count, --seed and --churn apply to the generator, but the source is Kafka");
                }
                if self.rate.is_some() {
                    bail!("--rate paces the embedded sources; a Kafka source runs at the topic's pace");
                }
            }
        }
        if let Some(output) = self.output {
            config.sink = match output.to_str().and_then(|o| o.strip_prefix("kafka://")) {
                Some(kafka) => {
                    let Some((brokers, topic)) = kafka.split_once('/').filter(|(b, t)| !b.is_empty() && !t.is_empty())
                    else {
                        bail!("--output {kafka:?}: expected kafka://host:port[,host:port]/topic");
                    };
                    // The config's producer properties and guarantee stay: the flag names
                    // where, not how.
                    let (properties, guarantee) = match &mut config.sink {
                        SinkConfig::Kafka { properties, guarantee, .. } => (std::mem::take(properties), *guarantee),
                        _ => Default::default(),
                    };
                    SinkConfig::Kafka { brokers: brokers.into(), topic: topic.into(), properties, guarantee }
                }
                None if output.as_os_str() == "-" => SinkConfig::Stdout,
                None => SinkConfig::File { path: output },
            };
        }
        if let Some(dir) = self.state_dir {
            config.state.dir = dir;
        }
        if let Some(partitions) = self.partitions {
            config.state.partitions = partitions;
        }
        if let Some(path) = self.dead_letter {
            config.dead_letter.path = Some(path);
        }
        if let Some(interval) = self.report_interval {
            config.report.interval = interval;
        }
        if let Some(store) = self.checkpoint_store {
            config.checkpoint.store = Some(store);
        }
        if let Some(interval) = self.checkpoint_interval {
            config.checkpoint.interval = interval;
        }
        if let Some(interval) = self.commit_interval {
            config.state.commit_interval = interval;
        }
        if let Some(cache) = self.cache_mib {
            config.state.cache_mib = cache;
        }
        if let Some(memory) = self.rocksdb_memory_mib {
            config.state.rocksdb_memory_mib = memory;
        }
        if let Some(ttl) = self.ttl {
            config.ttl.default = Some(ttl);
        }
        if self.no_checkpoints {
            config.checkpoint.enabled = false;
        }
        if let Some(listen) = self.admin {
            config.admin.listen = Some(listen);
        }
        config.validate()?;
        Ok(config)
    }
}
