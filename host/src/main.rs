//! The `sluice` command line.

use anyhow::{Result, bail};
use clap::{Args, Parser, Subcommand};
use sluice::config::{Config, SinkConfig, SourceConfig};
use sluice::sink::Payload;
use sluice::source::generator::{Fleet, FleetOptions};
use sluice::state::StateDir;
use std::io::{ErrorKind, Write};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "sluice", version, about = "Runs stateful stream operators as sandboxed WebAssembly components")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a job: source -> operator (with keyed state) -> sink.
    Run(RunArgs),
    /// Write the fleet generator's records as JSONL to stdout.
    Generate(FleetArgs),
    /// Inspect a state directory.
    State {
        #[command(subcommand)]
        command: StateCommand,
    },
}

#[derive(Subcommand)]
enum StateCommand {
    /// Print every state entry as JSONL: partition, key, name, value.
    Dump {
        /// The state directory.
        #[arg(long)]
        state_dir: PathBuf,
    },
}

/// `sluice run`: a config file, and flags that override it.
#[derive(Args)]
struct RunArgs {
    /// TOML config file; flags below override it.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Operator component (.wasm).
    #[arg(long)]
    operator: Option<PathBuf>,
    /// Read records from this JSONL file instead of the configured source.
    #[arg(long, conflicts_with_all = ["vehicles", "count", "seed"])]
    input: Option<PathBuf>,
    #[command(flatten)]
    fleet: FleetOverrides,
    /// Records per second from the source.
    #[arg(long)]
    rate: Option<f64>,
    /// Write outputs to this JSONL file; `-` is stdout.
    #[arg(long)]
    output: Option<PathBuf>,
    /// State directory.
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Number of partitions.
    #[arg(long)]
    partitions: Option<u32>,
    /// Dead-letter JSONL file.
    #[arg(long)]
    dead_letter: Option<PathBuf>,
    /// Seconds between running-summary lines; 0 turns them off.
    #[arg(long)]
    report_interval: Option<f64>,
}

/// Generator settings that override the configured ones.
#[derive(Args)]
struct FleetOverrides {
    /// Vehicles in the generated fleet.
    #[arg(long)]
    vehicles: Option<u32>,
    /// Records to generate.
    #[arg(long)]
    count: Option<u64>,
    /// Generator seed.
    #[arg(long)]
    seed: Option<u64>,
}

/// `sluice generate`
#[derive(Args)]
struct FleetArgs {
    /// Vehicles in the fleet.
    #[arg(long, default_value_t = 100)]
    vehicles: u32,
    /// Records to generate.
    #[arg(long, default_value_t = 10_000)]
    count: u64,
    /// Seed: the same seed gives the same records.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("SLUICE_LOG").unwrap_or_else(|_| "info".into()))
        .init();
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        // `sluice state dump | head` closing the pipe early is not a failure.
        Err(error) if is_broken_pipe(&error) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Whether `error` comes from writing to a pipe whose reader has gone, directly or
/// through serde_json's writer.
fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        let kind = cause
            .downcast_ref::<std::io::Error>()
            .map(std::io::Error::kind)
            .or_else(|| cause.downcast_ref::<serde_json::Error>().and_then(serde_json::Error::io_error_kind));
        kind == Some(ErrorKind::BrokenPipe)
    })
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Run(args) => {
            let config = args.into_config()?;
            let report = sluice::job::run(&config)?;
            eprint!("{report}");
            Ok(())
        }
        Command::Generate(args) => {
            let fleet = Fleet::new(&FleetOptions { vehicles: args.vehicles, count: Some(args.count), seed: args.seed });
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            for record in fleet {
                out.write_all(&record?.value)?;
                out.write_all(b"\n")?;
            }
            Ok(out.flush()?)
        }
        Command::State { command: StateCommand::Dump { state_dir } } => {
            let manifest = StateDir::read_manifest(&state_dir)?;
            let dir = StateDir::open(&state_dir, manifest.partitions)?;
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            for partition in 0..manifest.partitions {
                let store = dir.open_partition(partition)?;
                for entry in store.entries() {
                    let entry = entry?;
                    let line = serde_json::json!({
                        "partition": partition,
                        "key": String::from_utf8_lossy(&entry.key),
                        "name": entry.name,
                        "value": Payload::of(&entry.value),
                    });
                    serde_json::to_writer(&mut out, &line)?;
                    out.write_all(b"\n")?;
                }
            }
            Ok(out.flush()?)
        }
    }
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
        if let Some(path) = self.input {
            config.source =
                SourceConfig::File { path, key_field: "vehicle_id".into(), timestamp_field: "ts".into(), rate: None };
        }
        match &mut config.source {
            SourceConfig::Generator { vehicles, count, seed, rate, .. } => {
                *vehicles = self.fleet.vehicles.unwrap_or(*vehicles);
                *count = self.fleet.count.or(*count);
                *seed = self.fleet.seed.unwrap_or(*seed);
                *rate = self.rate.or(*rate);
            }
            SourceConfig::File { rate, .. } => {
                if self.fleet.vehicles.is_some() || self.fleet.count.is_some() || self.fleet.seed.is_some() {
                    bail!("--vehicles, --count and --seed apply to the generator, but the source is a file");
                }
                *rate = self.rate.or(*rate);
            }
        }
        if let Some(output) = self.output {
            config.sink =
                if output.as_os_str() == "-" { SinkConfig::Stdout } else { SinkConfig::File { path: output } };
        }
        if let Some(dir) = self.state_dir {
            config.state.dir = dir;
        }
        if let Some(partitions) = self.partitions {
            config.state.partitions = partitions;
        }
        if let Some(path) = self.dead_letter {
            config.dead_letter.path = path;
        }
        if let Some(interval) = self.report_interval {
            config.report.interval_s = interval;
        }
        config.validate()?;
        Ok(config)
    }
}
