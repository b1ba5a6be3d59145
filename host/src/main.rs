//! The `sluice` command line.

use anyhow::{Context, Result, anyhow, bail};
use clap::Parser;
use cli::args::{
    CheckpointsCommand, Cli, Command, FleetArgs, JobTarget, LogFormat, NewCommand, RunArgs, StateCommand, StoreArgs,
    TestArgs,
};
use hyper::Method;
use sluice::admin::{self, DeployAnswer, VersionsAnswer};
use sluice::checkpoint::{self, CheckpointStore, bytes};
use sluice::config::{self, Config, SinkConfig, SourceConfig};
use sluice::metrics;
use sluice::operator::deploy::{self, Sandbox};
use sluice::operator::registry::{self, Deployment, Registry};
use sluice::source::generator::{Fleet, FleetOptions};
use sluice::state::StateDir;
use sluice::stats;
use sluice::test_driver::{self, TestDriver};
use std::io::{ErrorKind, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, UNIX_EPOCH};
use tokio::runtime::Runtime;

mod cli;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let log = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("SLUICE_LOG").unwrap_or_else(|_| "info".into()));
    match cli.log_format {
        // Escape sequences only where a terminal shows them, never in a file or a pipe.
        LogFormat::Text => {
            log.with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none()).init()
        }
        LogFormat::Json => log.json().flatten_event(true).with_current_span(true).with_span_list(false).init(),
    }
    match run(cli) {
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
        Command::Run(args) => run_job(*args),
        Command::Generate(args) => generate(&args),
        Command::Checkpoints { command } => checkpoints(command),
        Command::Deploy { name, file, job } => deploy_version(&name, &file, job),
        Command::Rollback { name, job } => roll_back(&name, job),
        Command::Versions { name, job } => versions(&name, job),
        Command::Status { state_dir: Some(state_dir), store, .. } => stored_status(&state_dir, store.as_deref()),
        Command::Status { admin, .. } => status(&admin),
        Command::State { command: StateCommand::Dump { state_dir } } => dump_state(&state_dir),
        Command::Test(args) => test_operator(&args),
        Command::New { command: NewCommand::Operator { name, dir, sluice } } => {
            let dir = dir.unwrap_or_else(|| PathBuf::from(&name));
            let sluice = sluice.unwrap_or_else(sluice::scaffold::built_from);
            let written = sluice::scaffold::new_operator(&name, &dir, &sluice)?;
            eprintln!(
                "wrote {} files into {}; next: cd {} && cargo build --release --target wasm32-wasip2 && cargo test",
                written.len(),
                dir.display(),
                dir.display()
            );
            Ok(())
        }
    }
}

/// `sluice run`
fn run_job(args: RunArgs) -> Result<()> {
    let config = args.into_config()?;
    let report = sluice::job::run(&config)?;
    eprint!("{report}");
    Ok(())
}

/// `sluice test`
fn test_operator(args: &TestArgs) -> Result<()> {
    let started = std::time::Instant::now();
    let mut driver = TestDriver::builder(&args.operator);
    if let Some(path) = &args.job {
        let job = Config::load(path)?;
        let sandbox = Sandbox::new(&job.operator, PathBuf::new());
        driver = driver.limits(sandbox.limits).ttl(job.ttl);
        for (name, value) in &sandbox.config {
            driver = driver.config(name, value);
        }
    }
    for pair in &args.config {
        let (name, value) = pair.split_once('=').with_context(|| format!("--config {pair:?}: expected NAME=VALUE"))?;
        driver = driver.config(name, value);
    }
    if let Some(ttl) = args.ttl {
        driver = driver.ttl(config::TtlConfig { default: Some(ttl), ..config::TtlConfig::default() });
    }
    let mut driver = driver.build()?;
    if let Some(state) = &args.state {
        driver.load_state(state)?;
    }
    let (step, records) = driver.process_file(&args.input, &args.key_field, &args.timestamp_field, args.advance_to)?;
    let mut out = std::io::stdout().lock();
    let mut differences = Vec::new();
    match &args.expect {
        Some(path) => differences.extend(test_driver::differences("output", &read_lines(path)?, &step.outputs)),
        None => step.outputs.iter().try_for_each(|line| writeln!(out, "{line}"))?,
    }
    match (&args.expect_dead_letters, &args.expect) {
        (Some(path), _) => {
            differences.extend(test_driver::differences("dead letter", &read_lines(path)?, &step.dead_letters))
        }
        (None, Some(_)) => differences.extend(test_driver::differences("dead letter", &[], &step.dead_letters)),
        (None, None) => step.dead_letters.iter().try_for_each(|line| writeln!(out, "{line}"))?,
    }
    if args.show_state {
        driver.state()?.iter().try_for_each(|line| writeln!(out, "{line}"))?;
    }
    for difference in &differences {
        eprintln!("{difference}");
    }
    if !differences.is_empty() {
        bail!("{}: {} difference(s) from the expected lines", args.operator.display(), differences.len());
    }
    eprintln!(
        "{}: {records} records, {} outputs, {} dead letters{} in {:.0} ms",
        driver.version(),
        step.outputs.len(),
        step.dead_letters.len(),
        if args.expect.is_some() { ", as expected," } else { "" },
        started.elapsed().as_secs_f64() * 1e3
    );
    Ok(())
}

/// The JSON lines of the file at `path`, blank lines skipped.
fn read_lines(path: &Path) -> Result<Vec<serde_json::Value>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let lines = text.lines().enumerate().filter(|(_, line)| !line.trim().is_empty());
    lines
        .map(|(i, line)| {
            serde_json::from_str(line).with_context(|| format!("{} line {}: not JSON", path.display(), i + 1))
        })
        .collect()
}

/// `sluice generate`
fn generate(args: &FleetArgs) -> Result<()> {
    config::check_vehicles("--vehicles", args.vehicles)?;
    let options = FleetOptions { vehicles: args.vehicles, count: Some(args.count), seed: args.seed, churn: args.churn };
    let fleet = Fleet::new(&options);
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for record in fleet {
        out.write_all(&record?.value)?;
        out.write_all(b"\n")?;
    }
    Ok(out.flush()?)
}

/// `sluice deploy`
fn deploy_version(name: &str, file: &Path, job: JobTarget) -> Result<()> {
    let component = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    let summary = match job.open(name)? {
        Job::Admin(admin) => {
            let path = format!("/operators/{name}/versions");
            admin_answer(&admin::call(&admin, Method::POST, &path, component)?)?
        }
        Job::Registry { registry, sandbox, poll_versions, .. } => {
            let runtime = checkpoint::runtime()?;
            let version = runtime.block_on(registry.version_of(&component))?;
            sandbox.validate(&version, &component, &file.display().to_string())?;
            let origin = format!("sluice deploy {}", file.display());
            let deployment = runtime.block_on(registry.deploy(&component, &origin))?;
            recorded(&deployment, poll_versions)
        }
    };
    println!("deployed {summary}");
    Ok(())
}

/// `sluice rollback`
fn roll_back(name: &str, job: JobTarget) -> Result<()> {
    let summary = match job.open(name)? {
        Job::Admin(admin) => {
            let path = format!("/operators/{name}/rollback");
            admin_answer(&admin::call(&admin, Method::POST, &path, Vec::new())?)?
        }
        Job::Registry { registry, sandbox, poll_versions, .. } => {
            let runtime = checkpoint::runtime()?;
            let target = runtime.block_on(registry.rollback_target())?;
            let component = runtime.block_on(registry.component(&target.version))?;
            sandbox.validate(&target.version, &component, &format!("version {}", target.version))?;
            let deployment = runtime.block_on(registry.rollback(&target, "sluice rollback"))?;
            recorded(&deployment, poll_versions)
        }
    };
    println!("rolled back to {summary}");
    Ok(())
}

/// `sluice versions`
fn versions(name: &str, job: JobTarget) -> Result<()> {
    let (history, running) = match job.open(name)? {
        Job::Admin(admin) => {
            let path = format!("/operators/{name}/versions");
            let answer: VersionsAnswer = serde_json::from_str(&admin::call(&admin, Method::GET, &path, Vec::new())?)?;
            (answer.history, Some(answer.running))
        }
        Job::Registry { registry, .. } => (checkpoint::runtime()?.block_on(registry.history())?, None),
    };
    if history.is_empty() {
        bail!("operator {name} has no deployed versions yet (a job records its first when it starts)");
    }
    let current = registry::in_force(&history).last().map(|d| d.seq);
    println!("  entry  recorded at               action    version                         origin");
    for deployment in &history {
        let mark = if Some(deployment.seq) == current { '*' } else { ' ' };
        println!("{mark} {deployment}");
    }
    if let Some(running) = running {
        println!("this host runs {running}");
    }
    Ok(())
}

/// `sluice status`
fn status(hosts: &[String]) -> Result<()> {
    println!(
        "{:>9}  {:<24}  {:>10}  {:>8}  {:>9}  {:>10}  {:>10}  {:>14}  version",
        "partition", "host", "offset", "lag", "entries", "bytes", "batch-p99", "checkpoint-age"
    );
    let (mut footers, mut unreachable) = (Vec::new(), 0);
    for host in hosts {
        let scraped = admin::call(host, Method::GET, admin::METRICS_PATH, Vec::new());
        let samples = match scraped {
            Ok(text) => metrics::parse(&text),
            // One host down must not hide the others.
            Err(e) => {
                footers.push(format!("{host}: unreachable: {e:#}"));
                unreachable += 1;
                continue;
            }
        };
        let value = |name: &str, partition: Option<&str>| {
            let found =
                samples.iter().find(|s| s.name == name && partition.is_none_or(|p| s.label("partition") == Some(p)));
            found.map(|s| s.value)
        };
        let partitions: Vec<&str> = samples
            .iter()
            .filter(|s| s.name == "sluice_committed_offset")
            .filter_map(|s| s.label("partition"))
            .collect();
        for p in partitions {
            let shown = |name: &str| value(name, Some(p)).map_or("-".to_string(), |v| format!("{v}"));
            let version =
                samples.iter().find(|s| s.name == "sluice_partition_operator_info" && s.label("partition") == Some(p));
            println!(
                "{p:>9}  {host:<24}  {:>10}  {:>8}  {:>9}  {:>10}  {:>10}  {:>14}  {}",
                shown("sluice_committed_offset"),
                shown("sluice_consumer_lag_records"),
                shown("sluice_state_entries"),
                value("sluice_state_bytes", Some(p)).map_or("-".to_string(), |b| bytes(b as u64)),
                batch_p99(&samples, p).map_or("-".to_string(), |s| format!("≤{:.1}ms", s * 1e3)),
                value("sluice_checkpoint_age_seconds", Some(p)).map_or("-".to_string(), |s| format!("{s:.0}s")),
                version.and_then(|s| s.label("version")).unwrap_or("-")
            );
        }
        let warnings: Vec<&str> =
            samples.iter().filter(|s| s.name == "sluice_warning").filter_map(|s| s.label("kind")).collect();
        footers.push(format!(
            "{host}: {} rebalances; latest restore {:.2}s (predicted {:.2}s); warnings: {}",
            value("sluice_rebalances_total", None).unwrap_or(0.0),
            value("sluice_restore_last_seconds", None).unwrap_or(0.0),
            value("sluice_restore_predicted_seconds", None).unwrap_or(0.0),
            if warnings.is_empty() { "none".to_string() } else { warnings.join(", ") }
        ));
    }
    for footer in footers {
        println!("{footer}");
    }
    if unreachable > 0 {
        bail!("{unreachable} of {} hosts did not answer", hosts.len());
    }
    Ok(())
}

/// `sluice status --state-dir`: each partition's offset and entries as its state holds
/// them, and its newest checkpoint in `store`.
fn stored_status(state_dir: &Path, store: Option<&str>) -> Result<()> {
    let dir = StateDir::open_read_only(state_dir)?;
    let store = store.map(CheckpointStore::open_existing).transpose()?;
    let runtime = checkpoint::runtime()?;
    println!("{:>9}  {:>10}  {:>9}  newest checkpoint", "partition", "offset", "entries");
    for p in 0..dir.partitions() {
        // A partition never started here has no database.
        let local = match dir.partition_path(p).exists() {
            true => dir.open_partition(p).and_then(|s| Ok((s.committed_offset()?, s.committed_entries()?))),
            false => Ok((0, 0)),
        };
        let (offset, entries) = match local {
            Ok((offset, entries)) => (offset.to_string(), entries.to_string()),
            Err(e) => (format!("unreadable: {e:#}"), "-".to_string()),
        };
        let newest = match &store {
            Some(store) => match runtime.block_on(store.checkpoint_ids(p))?.last() {
                Some(&id) => {
                    let m = runtime.block_on(store.manifest(p, id))?;
                    let age = (stats::now_ms().saturating_sub(m.created_at_ms)) as f64 / 1e3;
                    format!("{id} at offset {}, {age:.0}s old, {}, by {}", m.offset, bytes(m.bytes()), m.operator)
                }
                None => "none".to_string(),
            },
            None => "- (no --store)".to_string(),
        };
        println!("{p:>9}  {offset:>10}  {entries:>9}  {newest}");
    }
    Ok(())
}

/// The upper bound of the histogram bucket that holds the 99th percentile of
/// `partition`'s batch times, in seconds.
fn batch_p99(samples: &[metrics::Sample], partition: &str) -> Option<f64> {
    let buckets: Vec<(f64, f64)> = samples
        .iter()
        .filter(|s| s.name == "sluice_batch_duration_seconds_bucket" && s.label("partition") == Some(partition))
        .filter_map(|s| Some((s.label("le")?.parse().ok()?, s.value)))
        .collect();
    let count = buckets.iter().map(|&(_, n)| n).fold(0.0, f64::max);
    (count > 0.0).then(|| buckets.iter().find(|&&(_, n)| n >= count * 0.99).map(|&(le, _)| le)).flatten()
}

/// `sluice state dump`
fn dump_state(state_dir: &Path) -> Result<()> {
    let dir = StateDir::open_read_only(state_dir)?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    // A partition never started here has no database, so no entries.
    for partition in (0..dir.partitions()).filter(|&p| dir.partition_path(p).exists()) {
        let store = dir.open_partition(partition)?;
        for entry in store.entries() {
            let line = sluice::sink::state_line(partition, &entry?);
            serde_json::to_writer(&mut out, &line)?;
            out.write_all(b"\n")?;
        }
    }
    Ok(out.flush()?)
}

/// What `sluice deploy` and `rollback` say after recording `deployment` in a registry.
fn recorded(deployment: &Deployment, poll_versions: Duration) -> String {
    format!(
        "{} recorded as entry {}; running hosts switch to it within {}",
        deployment.version,
        deployment.seq,
        humantime::format_duration(poll_versions)
    )
}

/// The summary of a host's answer to a deploy or rollback; an error if some of its
/// partitions did not switch.
fn admin_answer(json: &str) -> Result<String> {
    let answer: DeployAnswer = serde_json::from_str(json)?;
    if !answer.not_switched.is_empty() {
        bail!("{}", answer.summary);
    }
    Ok(answer.summary)
}

/// A job, as `sluice deploy`, `rollback` and `versions` reach it.
enum Job {
    /// Its registry, read and written directly, and how its hosts try a version out: in
    /// a directory of this process's own, removed with it.
    Registry { registry: Registry, sandbox: Box<Sandbox>, poll_versions: Duration, _scratch: tempfile::TempDir },
    /// A running host's admin API.
    Admin(String),
}

impl JobTarget {
    /// Opens the job that runs operator `name`.
    fn open(self, name: &str) -> Result<Job> {
        let (Some(path), None) = (&self.config, &self.admin) else {
            return Ok(Job::Admin(self.admin.expect("clap requires --config or --admin")));
        };
        let config = Config::load(path)?;
        let registry = Registry::new(CheckpointStore::open(&config.registry_url())?, &config.operator.name())?;
        deploy::check_name(&registry, name).with_context(|| format!("config file {}", path.display()))?;
        // Created afresh, private (mode 0700), under a random name: a predictable path in a
        // shared temporary directory could be another user's link to elsewhere.
        let scratch = tempfile::Builder::new()
            .prefix("sluice-deploy-")
            .tempdir()
            .context("creating a private directory to try the version out in")?;
        let sandbox = Box::new(Sandbox::new(&config.operator, scratch.path().join("state")));
        Ok(Job::Registry { registry, sandbox, poll_versions: config.operator.poll_versions, _scratch: scratch })
    }
}

/// `sluice checkpoints …`
fn checkpoints(command: CheckpointsCommand) -> Result<()> {
    let runtime = checkpoint::runtime()?;
    match command {
        CheckpointsCommand::List { store, partition } => list_checkpoints(&runtime, &store.open(&runtime)?, partition),
        CheckpointsCommand::Verify { store, partition, checkpoint } => {
            verify_checkpoint(&runtime, &store.open(&runtime)?.0, partition, checkpoint)
        }
        CheckpointsCommand::Estimate { store, state_dir } => {
            estimate_restore(&runtime, &store.open(&runtime)?, state_dir.as_deref())
        }
    }
}

impl StoreArgs {
    /// Opens the store and reads how many partitions its checkpoints are of.
    fn open(&self, runtime: &Runtime) -> Result<(CheckpointStore, u32)> {
        let store = CheckpointStore::open_existing(&self.store)?;
        match runtime.block_on(store.store_manifest())? {
            Some(manifest) => Ok((store, manifest.partitions)),
            None => bail!("{} holds no checkpoints (no sluice-checkpoints.json)", self.store),
        }
    }
}

/// `sluice checkpoints list`
fn list_checkpoints(runtime: &Runtime, (store, partitions): &(CheckpointStore, u32), only: Option<u32>) -> Result<()> {
    println!(
        "partition  checkpoint      offset    entries  files        size    uploaded  created                 operator"
    );
    for partition in (0..*partitions).filter(|p| only.is_none_or(|only| only == *p)) {
        for id in runtime.block_on(store.checkpoint_ids(partition))? {
            match runtime.block_on(store.manifest(partition, id)) {
                Ok(m) => println!(
                    "{partition:>9}  {id:>10}  {:>10}  {:>9}  {:>5}  {:>10}  {:>10}  {}  {}",
                    m.offset,
                    m.entries,
                    m.files.len(),
                    bytes(m.bytes()),
                    bytes(m.uploaded_bytes),
                    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(m.created_at_ms)),
                    m.operator
                ),
                Err(e) => println!("{partition:>9}  {id:>10}  unreadable: {e:#}"),
            }
        }
    }
    Ok(())
}

/// `sluice checkpoints verify`
fn verify_checkpoint(runtime: &Runtime, store: &CheckpointStore, partition: u32, id: Option<u64>) -> Result<()> {
    let id = match id {
        Some(id) => id,
        None => *runtime
            .block_on(store.checkpoint_ids(partition))?
            .last()
            .ok_or_else(|| anyhow!("partition {partition} has no checkpoints in {}", store.url()))?,
    };
    let manifest = runtime.block_on(store.manifest(partition, id))?;
    let mut bad = 0;
    for file in &manifest.files {
        match runtime.block_on(store.verify(partition, file)) {
            Ok(()) => println!("ok   {} ({})", file.name, bytes(file.size)),
            Err(e) => {
                bad += 1;
                println!("BAD  {e:#}");
            }
        }
    }
    if bad > 0 {
        bail!(
            "checkpoint {id} of partition {partition}: {bad} of {} files are missing or corrupt",
            manifest.files.len()
        );
    }
    println!(
        "checkpoint {id} of partition {partition} (offset {}): all {} files verified",
        manifest.offset,
        manifest.files.len()
    );
    Ok(())
}

/// `sluice checkpoints estimate`
fn estimate_restore(
    runtime: &Runtime,
    (store, partitions): &(CheckpointStore, u32),
    state_dir: Option<&Path>,
) -> Result<()> {
    // A directory a job has yet to write (missing or empty) holds no local state.
    let written = |dir: &&Path| std::fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_some());
    let state = match state_dir.filter(written) {
        Some(dir) => Some(StateDir::open_read_only(dir)?),
        None => None,
    };
    if let Some(state) = &state
        && state.partitions() != *partitions
    {
        bail!(
            "state directory {} holds {} partitions but the store's checkpoints are of {partitions}",
            state_dir.expect("opened").display(),
            state.partitions()
        );
    }
    let all: Vec<u32> = (0..*partitions).collect();
    println!("{}", runtime.block_on(checkpoint::restore::plan(state.as_ref(), &all, Some(store)))?);
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
