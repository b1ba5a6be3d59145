//! Where the build put what the tests and the host's benchmarks run — the `sluice`
//! binary and the operator components — and running them: `sluice` commands and jobs, in the
//! foreground ([`run_ok`], [`run_err`]) or as a background [`Host`].
//!
//! `./dev.sh test` builds the binary and the operators before the tests run (`./dev.sh
//! bench` the operators before the benchmarks); both are found in the cargo target
//! directory the running test or benchmark was built into.

use anyhow::{Context, Result, bail};
use sluice::admin::TOKEN_VARIABLE;
use sluice::events::{EXPIRED_REMOVED, LISTENING};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The cargo target directory the running test or benchmark was built into.
pub fn target_dir() -> PathBuf {
    // <target>/<profile>/deps/<test-or-bench-binary>
    let exe = std::env::current_exe().expect("test executable path");
    exe.ancestors().nth(3).expect("test executable lives in <target>/<profile>/deps").to_path_buf()
}

/// The `sluice` binary built alongside the tests, or the one `SLUICE_BIN` names.
pub fn sluice_bin() -> PathBuf {
    // The benchmarks run the release build (`./dev.sh bench` names it).
    let bin = std::env::var_os("SLUICE_BIN").map_or_else(|| target_dir().join("debug").join("sluice"), PathBuf::from);
    assert!(bin.exists(), "{} is missing: run the tests with ./dev.sh test, which builds it", bin.display());
    bin
}

/// The component of operator crate `name` (e.g. `vehicle_stats`), built for wasm32-wasip2
/// (`vehicle_stats_v2`: version 2 of vehicle-stats, which `./dev.sh` keeps under its own
/// name).
pub fn operator_wasm(name: &str) -> PathBuf {
    let wasm = target_dir().join("wasm32-wasip2").join("release").join(format!("{name}.wasm"));
    assert!(
        wasm.exists(),
        "{} is missing: run the tests with ./dev.sh test and the benchmarks with ./dev.sh bench, which build the \
         operators",
        wasm.display()
    );
    wasm
}

/// The admin token the tests' hosts require and their `sluice deploy`s present.
pub const ADMIN_TOKEN: &str = "sluice-tests-token";

/// A `sluice` command with logging kept to warnings, and [`ADMIN_TOKEN`] in its
/// environment (a host requires it, a client presents it).
pub fn sluice() -> Command {
    let mut command = Command::new(sluice_bin());
    command.env("SLUICE_LOG", "warn").env(TOKEN_VARIABLE, ADMIN_TOKEN);
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

/// Runs `command`, failing with its stderr unless it succeeds.
pub fn run_ok(command: &mut Command) -> Result<Output> {
    let output = command.output().with_context(|| format!("running {command:?}"))?;
    if !output.status.success() {
        bail!("{command:?} failed ({}):\n{}", output.status, String::from_utf8_lossy(&output.stderr));
    }
    Ok(output)
}

/// Runs `command` with its stdout a pipe whose reader has gone (as `| head -0` leaves
/// it), expecting it to end quietly and successfully, as Unix tools do; returns its
/// stderr.
pub fn run_into_closed_pipe(command: &mut Command) -> Result<String> {
    let mut child = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("running {command:?}"))?;
    drop(child.stdout.take());
    let output = child.wait_with_output()?;
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    if !output.status.success() || !stderr.is_empty() {
        bail!("{command:?} into a closed pipe ended with {}:\n{stderr}", output.status);
    }
    Ok(stderr)
}

/// Runs `command`, expecting it to fail; returns its stderr.
pub fn run_err(command: &mut Command) -> Result<String> {
    let output = command.output().with_context(|| format!("running {command:?}"))?;
    if output.status.success() {
        bail!("{command:?} succeeded but should have failed:\n{}", String::from_utf8_lossy(&output.stderr));
    }
    Ok(String::from_utf8_lossy(&output.stderr).into_owned())
}

/// The peak resident memory a run's final report (its stderr) gives, in MiB.
pub fn reported_peak_mib(report: &str) -> Option<f64> {
    let peak = report.lines().find_map(|line| line.split_once("peak memory ")).map(|(_, rest)| rest)?;
    let (number, unit) = peak.strip_suffix(" (RSS)")?.split_once(' ')?;
    let scale = match unit {
        "B" => 1.0 / (1 << 20) as f64,
        "KiB" => 1.0 / 1024.0,
        "MiB" => 1.0,
        "GiB" => 1024.0,
        _ => return None,
    };
    Some(number.parse::<f64>().ok()? * scale)
}

/// The count of expired state entries a run's final report (its stderr) gives; 0 if it
/// Every mention in a run's output of a partition restored from a checkpoint (the
/// restore's log line, the report's table, a Kafka resume's line), in order: how
/// (`standby`, `incremental`, `full`), the bytes fetched and the checkpoint's size.
pub fn reported_restores(report: &str) -> Vec<(String, u64, u64)> {
    let mut found = Vec::new();
    for line in report.lines() {
        let Some(at) = line.find("checkpoint ").and_then(|at| line[at..].find(" (").map(|b| at + b + 2)) else {
            continue;
        };
        let words: Vec<&str> = line[at..].split([' ', ':', ')']).filter(|w| !w.is_empty()).collect();
        if let [path, "fetched", fetched, "B", "of", bytes, "B", ..] = words[..]
            && let (Ok(fetched), Ok(bytes)) = (fetched.parse(), bytes.parse())
        {
            found.push((path.to_string(), fetched, bytes));
        }
    }
    found
}

/// gives none.
pub fn reported_expired(report: &str) -> u64 {
    let count = report.lines().find_map(|line| line.split_once(EXPIRED_REMOVED).map(|(count, _)| count));
    count.and_then(|count| count.parse().ok()).unwrap_or(0)
}

/// The partitions a running host's admin API at `admin` (`http://…`) says run there,
/// each with the offset its state holds (`GET /partitions`).
pub fn running_partitions(admin: &str) -> Result<std::collections::BTreeMap<u32, u64>> {
    let answer = sluice::admin::call(admin, hyper::Method::GET, "/partitions", Vec::new())?;
    let answer: sluice::metrics::partitions::PartitionsAnswer = serde_json::from_str(&answer)?;
    Ok(answer.partitions.iter().map(|p| (p.partition, p.committed_offset)).collect())
}

/// Sends `signal` (a name such as `TERM`) to process `pid`.
pub(crate) fn signal(pid: u32, signal: &str) -> Result<()> {
    run_ok(Command::new("kill").arg(format!("-{signal}")).arg(pid.to_string())).map(drop)
}

/// The samples of metric `name` in a `GET /metrics` answer's `text`: labels and value.
pub fn metric_samples(text: &str, name: &str) -> Vec<(std::collections::BTreeMap<String, String>, f64)> {
    let samples = sluice::metrics::parse(text).into_iter().filter(|sample| sample.name == name);
    samples.map(|sample| (sample.labels, sample.value)).collect()
}

/// The sum of metric `name`'s samples in a `GET /metrics` answer's `text`.
pub fn metric_sum(text: &str, name: &str) -> f64 {
    metric_samples(text, name).iter().map(|(_, value)| value).sum()
}

/// A `sluice` process running in the background, its stderr in a log file; killed when
/// dropped.
pub struct Host {
    child: Option<std::process::Child>,
    /// What the test calls it.
    pub name: String,
    /// Its stderr.
    pub log: PathBuf,
    /// How many admin addresses `log` held before this process started: a host started
    /// again appends to the log of the one before.
    listening_before: usize,
}

impl Host {
    /// Spawns `command` as host `name`, appending its stderr, logged at info level, to
    /// `log`.
    pub fn spawn(name: &str, command: &mut Command, log: &Path) -> Result<Self> {
        let listening_before = std::fs::read_to_string(log).unwrap_or_default().matches(LISTENING).count();
        let file = std::fs::OpenOptions::new().create(true).append(true).open(log)?;
        let child = command
            .env("SLUICE_LOG", "info")
            .stdout(std::process::Stdio::null())
            .stderr(file)
            .spawn()
            .with_context(|| format!("starting host {name}"))?;
        Ok(Host { child: Some(child), name: name.to_string(), log: log.to_path_buf(), listening_before })
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

    /// The address of its admin API (`http://127.0.0.1:port`), once it logs it: this
    /// process's, not that of a host before it that wrote the same log.
    pub fn admin_url(&mut self) -> Result<String> {
        self.wait_for(LISTENING, self.listening_before + 1, std::time::Duration::from_secs(60))?;
        let log = self.log();
        let (at, _) = log.match_indices(LISTENING).nth(self.listening_before).expect("waited for it");
        let rest = &log[at + LISTENING.len()..];
        Ok(rest.split_whitespace().next().unwrap_or_default().to_string())
    }

    /// Waits until it exits by itself and returns how; fails after `timeout`.
    pub fn wait_exit(&mut self, timeout: std::time::Duration) -> Result<std::process::ExitStatus> {
        let child = self.child.as_mut().context("host already stopped")?;
        let started = std::time::Instant::now();
        loop {
            if let Some(status) = child.try_wait()? {
                self.child = None;
                return Ok(status);
            }
            if started.elapsed() > timeout {
                bail!("host {} still runs after {timeout:?}:\n{}", self.name, self.log());
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
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
