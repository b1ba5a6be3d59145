//! `sluice run`: a job's config, from its file (or an operator alone) with the command
//! line's overrides applied, run to its end, and its report written to stderr.
//!
//! This module owns how the flags of `sluice run` override a config file: which flag
//! replaces which setting (most stand for one setting each, a table of one line a
//! flag), how `--input` and `--output` make a source and a sink, and which flags the
//! configured source refuses. It does not own the flags themselves
//! ([`args`](super::args)), the config's rules (`Config::validate`, which runs last) or
//! the job (`sluice::job`).

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
            config.sink = match output.to_str().filter(|o| o.starts_with("kafka://")) {
                Some(url) => {
                    let (brokers, topic) = super::args::kafka_topic("--output", url)?;
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
        // The flags that each stand for one setting: given, they replace the file's.
        set(&mut config.operator.path, self.operator);
        set(&mut config.state.dir, self.state_dir);
        set(&mut config.state.partitions, self.partitions);
        set(&mut config.dead_letter.path, self.dead_letter.map(Some));
        set(&mut config.report.interval, self.report_interval);
        set(&mut config.checkpoint.store, self.checkpoint_store.map(Some));
        set(&mut config.checkpoint.interval, self.checkpoint_interval);
        set(&mut config.state.commit_interval, self.commit_interval);
        set(&mut config.state.cache_mib, self.cache_mib);
        set(&mut config.state.rocksdb_memory_mib, self.rocksdb_memory_mib);
        set(&mut config.ttl.default, self.ttl.map(Some));
        set(&mut config.checkpoint.enabled, self.no_checkpoints.then_some(false));
        set(&mut config.admin.listen, self.admin.map(Some));
        config.validate()?;
        Ok(config)
    }
}

/// Puts `flag`, if given, in place of `setting`.
fn set<T>(setting: &mut T, flag: Option<T>) {
    if let Some(value) = flag {
        *setting = value;
    }
}
