//! The command line's grammar: every command, flag and help text of `sluice`, as clap
//! derives them.
//!
//! What a flag means is written here once, in its doc comment, which is also its
//! `--help`. This module owns the shapes the command line parses into and nothing else: what a
//! command does with them is its own module's (`run`, `test`, `versions`, …), and how
//! `sluice run`'s flags override a config file is [`run`](super::run)'s.

use clap::{Args, Parser, Subcommand};
use sluice::config;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser)]
#[command(name = "sluice", version, about = "Runs stateful stream operators as sandboxed WebAssembly components")]
// A flag given twice takes its last value, so scripts can append overrides.
#[command(args_override_self = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// How log lines are written to stderr: `text` (coloured only on a terminal without
    /// `NO_COLOR` set) or `json`, one object a line. Levels come from `SLUICE_LOG`.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// `--log-format`.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// `sluice new operator --lang`.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum Lang {
    Rust,
    Python,
    #[value(name = "typescript")]
    TypeScript,
}

impl From<Lang> for sluice::scaffold::Language {
    fn from(lang: Lang) -> Self {
        match lang {
            Lang::Rust => sluice::scaffold::Language::Rust,
            Lang::Python => sluice::scaffold::Language::Python,
            Lang::TypeScript => sluice::scaffold::Language::TypeScript,
        }
    }
}

#[derive(Subcommand)]
pub enum Command {
    /// Run a job: source -> operator (with keyed state) -> sink.
    Run(Box<RunArgs>),
    /// Write the fleet generator's records as JSONL to stdout, or produce them to a Kafka
    /// topic.
    Generate(GenerateArgs),
    /// Run an operator component over the records of a JSONL file in the host's sandbox,
    /// over fresh (or given) state, one record at a time, and compare what it emits with
    /// what is expected: a readable difference and exit code 1 when they differ.
    Test(Box<TestArgs>),
    /// Replay one partition of a job from a checkpoint through a version, as its host
    /// would have processed it, into a directory of outputs, dead letters and final
    /// state; with `--compare`, report how its outputs differ from the live job's (exit
    /// code 1 when they do).
    Replay(Box<ReplayArgs>),
    /// Create things: `sluice new operator NAME` writes a new operator crate.
    New {
        #[command(subcommand)]
        command: NewCommand,
    },
    /// Inspect a state directory.
    State {
        #[command(subcommand)]
        command: StateCommand,
    },
    /// Inspect a checkpoint store.
    Checkpoints {
        #[command(subcommand)]
        command: CheckpointsCommand,
    },
    /// Deploy a new version of an operator into the running hosts of its job: validated
    /// first, then switched to between two batches, state kept, nothing restarted.
    Deploy {
        /// The operator's name (`[operator] name`; by default the configured file's stem).
        name: String,
        /// The new version's component (.wasm).
        file: PathBuf,
        #[command(flatten)]
        job: JobTarget,
        /// Run it as a shadow beside the version in force instead: on the same records,
        /// its outputs compared with the live ones and never sent, its state writes
        /// never committed (`sluice shadow status`, `promote`, `stop`).
        #[arg(long, conflicts_with = "canary")]
        shadow: bool,
        /// Run it as a canary instead: it processes this share of the keys (e.g. 5%),
        /// chosen by a hash of the key, so raising the share only adds keys; the rest
        /// stay on the version in force. A full deploy or `sluice rollback` ends it.
        #[arg(long, value_name = "SHARE")]
        canary: Option<String>,
    },
    /// A shadow deploy's findings, and its end: `status`, `promote`, `stop`.
    Shadow {
        #[command(subcommand)]
        command: ShadowCommand,
    },
    /// Return an operator to the version that ran before its newest deploy.
    Rollback {
        /// The operator's name.
        name: String,
        #[command(flatten)]
        job: JobTarget,
    },
    /// List an operator's deployed versions, with when and how each was deployed.
    Versions {
        /// The operator's name.
        name: String,
        #[command(flatten)]
        job: JobTarget,
    },
    /// Show a job's partitions as a table: of running hosts (owner, offset, lag,
    /// entries, batch p99, checkpoint age, version, then each host's rebalances, latest
    /// restore and warnings, from their metrics), or of a state directory and checkpoint
    /// store when no host runs.
    #[command(group = clap::ArgGroup::new("target").required(true).args(["admin", "state_dir"]))]
    Status {
        /// A running host's admin API (`http://host:port`); repeat it for every host of
        /// the job.
        #[arg(long)]
        admin: Vec<String>,
        /// A state directory no host runs on.
        #[arg(long, conflicts_with = "admin")]
        state_dir: Option<PathBuf>,
        /// With `--state-dir`: the job's checkpoint store, for each partition's newest
        /// checkpoint.
        #[arg(long, requires = "state_dir")]
        store: Option<String>,
    },
    /// Describe a job's config file.
    Config {
        /// Print the annotated reference: every setting at its default, with what it
        /// does.
        #[arg(long, required = true)]
        reference: bool,
    },
}

#[derive(Subcommand)]
pub enum NewCommand {
    /// A new operator, ready to build and test. In Rust, a crate: the SDK, the
    /// wasm32-wasip2 build, a native unit test, a test of the built component in the
    /// sandbox through `sluice test` and its fixtures, and a README. In Python, a
    /// project: the app, the SDK and the world, build.sh (componentize-py), test.sh
    /// (`sluice test` over its fixtures) and a README; in TypeScript, the same with a
    /// tsconfig.json, build.sh running tsc and componentize-js.
    Operator {
        /// The crate's name (lowercase letters, digits, - and _).
        name: String,
        /// Where to write it; default `./NAME`.
        #[arg(long)]
        dir: Option<PathBuf>,
        /// The SDK crate (`sluice-guest`) to depend on by path: a checkout's `guest-sdk`,
        /// or a copy; default the SDK of this binary's version, from the registry.
        #[arg(long)]
        sdk: Option<PathBuf>,
        /// The language it is written in.
        #[arg(long, value_enum, default_value = "rust")]
        lang: Lang,
    },
}

/// `sluice test`
#[derive(Args)]
pub struct TestArgs {
    /// The operator component (.wasm).
    pub operator: PathBuf,
    /// The input records, one JSON object per line, read as a file source reads them;
    /// a line `{"$advance_to": MS}` moves the event-time clock to MS there instead.
    #[arg(long)]
    pub input: PathBuf,
    /// The expected outputs, one JSON line each, in order: each field given must match
    /// the output's (`key`, `value`, `topic`, `cause`…; a `value` object's fields
    /// likewise), fields left out are not compared. Without it, the outputs are printed.
    #[arg(long)]
    pub expect: Option<PathBuf>,
    /// The expected dead letters, likewise (`key`, `error`, `reason`…). With `--expect`
    /// and without this, any dead letter is a difference.
    #[arg(long)]
    pub expect_dead_letters: Option<PathBuf>,
    /// State to start from, as `sluice state dump` writes it (`key`, `name`, `value`).
    #[arg(long)]
    pub state: Option<PathBuf>,
    /// A job's config file: its `[operator]` limits and config and its `[ttl]` apply,
    /// as in that job (without it, a job's defaults).
    #[arg(long)]
    pub job: Option<PathBuf>,
    /// `name=value` for the operator's `[operator.config]` (after the job's); repeat it
    /// for more.
    #[arg(long = "config", value_name = "NAME=VALUE")]
    pub config: Vec<String>,
    /// The JSON field holding a record's key.
    #[arg(long, default_value_t = config::default_key_field())]
    pub key_field: String,
    /// The JSON field holding a record's event time, ms since the epoch.
    #[arg(long, default_value_t = config::default_timestamp_field())]
    pub timestamp_field: String,
    /// The host's TTL for state entries without one of their own, in event time: e.g.
    /// 10m, 7d.
    #[arg(long, value_parser = config::parse_duration)]
    pub ttl: Option<Duration>,
    /// After the last record, move the event-time clock to this time (ms since the
    /// epoch), expiring what comes due by then.
    #[arg(long)]
    pub advance_to: Option<i64>,
    /// Print the state after the run, as `sluice state dump` does.
    #[arg(long)]
    pub show_state: bool,
    /// Where compiled components are kept between runs, so a build tested before is read
    /// back in milliseconds instead of compiled again (seconds for a Python or TypeScript
    /// component): by default `$XDG_CACHE_HOME/sluice/compiled`, else
    /// `$HOME/.cache/sluice/compiled`. Machine code the host runs: give a directory only
    /// you can write.
    #[arg(long, value_name = "DIR")]
    pub compiled_cache: Option<PathBuf>,
    /// Compile the component at every run and keep nothing.
    #[arg(long, conflicts_with = "compiled_cache")]
    pub no_compiled_cache: bool,
}

/// `sluice replay`
#[derive(Args)]
pub struct ReplayArgs {
    /// The job's config file: its sandbox, TTL policy, batches and commits apply as in
    /// the job, and its checkpoint store and source file unless given below.
    #[arg(long)]
    pub config: PathBuf,
    /// The partition to replay.
    #[arg(long)]
    pub partition: u32,
    /// The checkpoint to start from; default the partition's newest.
    #[arg(long)]
    pub checkpoint: Option<u64>,
    /// The version to run (.wasm); default the version the checkpoint names, from the
    /// job's registry.
    #[arg(long)]
    pub operator: Option<PathBuf>,
    /// The JSONL file the job read; default the config's source (its file, or its
    /// Kafka topic).
    #[arg(long)]
    pub input: Option<PathBuf>,
    /// The Kafka brokers to read the partition from (with --topic), from the
    /// checkpoint's offset; default the config's source.
    #[arg(long, requires = "topic")]
    pub brokers: Option<String>,
    /// The Kafka topic the job read (with --brokers).
    #[arg(long, requires = "brokers")]
    pub topic: Option<String>,
    /// The checkpoint store; default the config's.
    #[arg(long)]
    pub store: Option<String>,
    /// Replay the records before this offset only; default to the end of the input.
    #[arg(long)]
    pub until: Option<u64>,
    /// A new (or empty) directory for the replay's outputs.jsonl, dead-letters.jsonl,
    /// state.jsonl, state/ and, with --compare, differences.jsonl.
    #[arg(long)]
    pub out: PathBuf,
    /// The outputs the live job wrote (a JSONL file as its file sink writes): each
    /// record's outputs are compared with the replay's.
    #[arg(long)]
    pub compare: Option<PathBuf>,
    /// How many differences to print (all are in differences.jsonl).
    #[arg(long, default_value_t = 10)]
    pub show: usize,
}

#[derive(Subcommand)]
pub enum ShadowCommand {
    /// What the shadow found on each running host: records compared, equal, different,
    /// emitted by one version only, state writes that differ, CPU per record against the
    /// live version's, and the first differences.
    Status {
        /// A running host's admin API (`http://host:port`); repeat it for every host of
        /// the job.
        #[arg(long, required = true)]
        admin: Vec<String>,
        /// The operator's name.
        name: String,
    },
    /// Deploy the shadow as the version in force (an ordinary deploy), and stop it.
    Promote {
        /// The operator's name.
        name: String,
        #[command(flatten)]
        job: JobTarget,
    },
    /// Stop the shadow on every host.
    Stop {
        /// The operator's name.
        name: String,
        #[command(flatten)]
        job: JobTarget,
    },
}

/// Which job a deploy, rollback or versions command talks to.
#[derive(Args)]
#[group(required = true, multiple = false)]
pub struct JobTarget {
    /// The job's config file: the version is validated here under the job's sandbox
    /// settings and recorded in the job's registry (its checkpoint store); running
    /// hosts switch within `poll_versions`.
    #[arg(long, short)]
    pub config: Option<PathBuf>,
    /// A running host's admin API (`http://host:port`): the host validates and records
    /// the version and answers once its partitions have switched; the others follow.
    #[arg(long)]
    pub admin: Option<String>,
}

#[derive(Subcommand)]
pub enum CheckpointsCommand {
    /// List each partition's checkpoints: offset, entries, files, size, bytes uploaded.
    List {
        #[command(flatten)]
        store: StoreArgs,
        /// Only this partition.
        #[arg(long)]
        partition: Option<u32>,
    },
    /// Read every file of a checkpoint and check it against the manifest.
    Verify {
        #[command(flatten)]
        store: StoreArgs,
        /// The partition.
        #[arg(long)]
        partition: u32,
        /// The checkpoint id; default the newest.
        #[arg(long)]
        checkpoint: Option<u64>,
    },
    /// Say what a start with this state directory would restore, and how long it
    /// should take given the bandwidth of earlier restores.
    Estimate {
        #[command(flatten)]
        store: StoreArgs,
        /// The local state directory (absent or missing: a new machine).
        #[arg(long)]
        state_dir: Option<PathBuf>,
    },
}

/// Which checkpoint store.
#[derive(Args)]
pub struct StoreArgs {
    /// The checkpoint store: a directory, file:///dir or s3://bucket/prefix.
    #[arg(long)]
    pub store: String,
}

#[derive(Subcommand)]
pub enum StateCommand {
    /// Print every state entry as JSONL: partition, key, name, value.
    Dump {
        /// The state directory.
        #[arg(long)]
        state_dir: PathBuf,
    },
}

/// `sluice run`: a config file, and flags that override it.
#[derive(Args)]
pub struct RunArgs {
    /// TOML config file; flags below override it.
    #[arg(long, short)]
    pub config: Option<PathBuf>,
    /// Operator component (.wasm).
    #[arg(long)]
    pub operator: Option<PathBuf>,
    /// Read records from this JSONL file instead of the configured source.
    #[arg(long, conflicts_with_all = ["vehicles", "count", "seed", "churn"])]
    pub input: Option<PathBuf>,
    #[command(flatten)]
    pub fleet: FleetOverrides,
    /// Records per second from the source.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Write outputs to this JSONL file; `-` is stdout; `kafka://host:port/topic` is a
    /// Kafka topic (with the config's `[sink.properties]` and `guarantee`, if it names a
    /// Kafka sink).
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// State directory.
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Number of partitions.
    #[arg(long)]
    pub partitions: Option<u32>,
    /// Dead-letter JSONL file.
    #[arg(long)]
    pub dead_letter: Option<PathBuf>,
    /// Time between running-summary lines: seconds, or e.g. 500ms; 0 turns them off.
    #[arg(long, value_parser = config::parse_duration)]
    pub report_interval: Option<Duration>,
    /// The longest processed records wait for their state commit: seconds, or e.g.
    /// 500ms, 10s.
    #[arg(long, value_parser = config::parse_duration)]
    pub commit_interval: Option<Duration>,
    /// Memory for committed state entries kept per partition, MiB; 0 keeps none.
    #[arg(long)]
    pub cache_mib: Option<usize>,
    /// Memory RocksDB may use for all partitions together (memtables and blocks), MiB.
    #[arg(long)]
    pub rocksdb_memory_mib: Option<usize>,
    /// The TTL of state entries without one of their own, in event time: e.g. 10m, 7d.
    #[arg(long, value_parser = config::parse_duration)]
    pub ttl: Option<Duration>,
    /// Checkpoint store: a directory, file:///dir or s3://bucket/prefix.
    #[arg(long)]
    pub checkpoint_store: Option<String>,
    /// Time between a partition's checkpoints: seconds, or e.g. 10s, 1m.
    #[arg(long, value_parser = config::parse_duration)]
    pub checkpoint_interval: Option<Duration>,
    /// Neither checkpoint nor restore from a checkpoint store.
    #[arg(long, conflicts_with_all = ["checkpoint_store", "checkpoint_interval"])]
    pub no_checkpoints: bool,
    /// Serve the admin HTTP API (deploy, rollback, versions) on this `host:port`.
    #[arg(long)]
    pub admin: Option<String>,
}

/// Generator settings that override the configured ones.
#[derive(Args)]
pub struct FleetOverrides {
    /// Vehicles in the generated fleet.
    #[arg(long)]
    pub vehicles: Option<u32>,
    /// Records to generate.
    #[arg(long)]
    pub count: Option<u64>,
    /// Generator seed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Every this many records a generated vehicle leaves for good and a new one joins.
    #[arg(long)]
    pub churn: Option<u64>,
}

impl FleetOverrides {
    /// Whether any generator setting is given.
    pub fn any(&self) -> bool {
        self.vehicles.is_some() || self.count.is_some() || self.seed.is_some() || self.churn.is_some()
    }
}

/// `sluice generate`
#[derive(Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub fleet: FleetArgs,
    /// Produce the records to this Kafka topic (`kafka://host:port[,host:port]/topic`),
    /// keyed by vehicle and timestamped with their `ts`, instead of writing them to
    /// stdout.
    #[arg(long, value_name = "URL")]
    pub to: Option<String>,
}

/// The embedded fleet generator's settings.
#[derive(Args)]
pub struct FleetArgs {
    /// Vehicles in the fleet.
    #[arg(long, default_value_t = 100)]
    pub vehicles: u32,
    /// Records to generate.
    #[arg(long, default_value_t = 10_000)]
    pub count: u64,
    /// Seed: the same seed gives the same records.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Every this many records a vehicle leaves for good and a new one joins.
    #[arg(long)]
    pub churn: Option<u64>,
}

/// The brokers and topic of a `kafka://host:port[,host:port]/topic` URL given to `flag`.
pub fn kafka_topic<'a>(flag: &str, url: &'a str) -> anyhow::Result<(&'a str, &'a str)> {
    url.strip_prefix("kafka://")
        .and_then(|rest| rest.split_once('/'))
        .filter(|(brokers, topic)| !brokers.is_empty() && !topic.is_empty())
        .ok_or_else(|| anyhow::anyhow!("{flag} {url:?}: expected kafka://host:port[,host:port]/topic"))
}
