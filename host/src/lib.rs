//! Sluice runs stateful stream operators as sandboxed WebAssembly components.
//!
//! The modules follow a record's path: a [`source`] produces it at its partition and
//! offset; the [`partitions`] this host runs route it to that partition's [`worker`],
//! which runs the [`operator`] on it against the partition's keyed [`state`]; outputs go to the
//! [`sink`]; then state and offset commit together. Every so often the worker
//! [`checkpoint`]s its state to a checkpoint store, from which a job restores when its
//! local state is gone. A [`job`] wires these from a [`config`]; new operator versions
//! arrive through the [`admin`] API or the registry in the store (see
//! [`operator::deploy`]); the admin API also serves the host's [`metrics`]. The
//! [`test_driver`] runs one operator outside a job, record by record, for `sluice test`;
//! [`replay`] replays a partition from a checkpoint through any version (`sluice replay`)
//! and compares two runs' outputs;
//! [`scaffold`] writes a new operator crate. The phrases the host logs that tests look for
//! are each component's `events`, all re-exported by [`events`].
//!
//! The layers point one way: each module imports only modules before it in
//!
//! ```text
//! record, backoff, bandwidth, log_rate, objects, kafka, probes → stats, config, checksum, lines → state
//!     → checkpoint → operator → sink → source → worker → partitions
//!     → metrics, warnings, test_driver, replay
//!     → admin → job, scaffold → events
//! ```
//!
//! [`record`] (the data every layer shares), [`backoff`] (the schedule of retries after
//! transient failures), [`bandwidth`] (a cap on bytes per second), [`log_rate`] (log
//! lines within a rate), [`objects`] (the object store at a URL, under checkpoints and
//! the operator registry), [`kafka`] (the
//! settings every Kafka client starts from) and [`probes`] (the clocks, CPU time and
//! memory of the process) are the leaves;
//! [`stats`] holds live counters; [`lines`] writes the JSON lines of the sinks and of a
//! state dump. [`events`] is last because it re-exports every component's phrases: nothing
//! in the library imports it.
//! A test in this crate fails on an import against the chain.

pub mod admin;
pub mod backoff;
pub mod bandwidth;
pub mod checkpoint;
pub mod checksum;
pub mod config;
pub mod events;
pub mod job;
pub mod kafka;
pub mod lines;
pub mod log_rate;
pub mod metrics;
pub mod objects;
pub mod operator;
pub mod partitions;
pub mod probes;
pub mod record;
pub mod replay;
pub mod scaffold;
pub mod sink;
pub mod source;
pub mod state;
pub mod stats;
pub mod test_driver;
pub mod warnings;
pub mod worker;

#[cfg(test)]
mod layers;

/// A crash for tests: with `SLUICE_KILL_AT=<point>:<n>` in its environment, the
/// process kills itself with SIGKILL, as `kill -9` would, the n-th time it passes
/// `point` (n = 1 when left out), so a test can crash it at an exact step of a protocol
/// (the worker's points: [`worker::BEFORE_SEND`] and the constants after it). Without
/// the variable a pass costs a load and a branch.
pub fn kill_point(point: &str) {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static AT: OnceLock<Option<(String, u64)>> = OnceLock::new();
    static PASSED: AtomicU64 = AtomicU64::new(0);
    let at = AT.get_or_init(|| {
        let at = std::env::var("SLUICE_KILL_AT").ok()?;
        let (name, n) = at.split_once(':').unwrap_or((&at, "1"));
        Some((name.to_string(), n.parse().unwrap_or(1)))
    });
    if let Some((name, n)) = at
        && name == point
        && PASSED.fetch_add(1, Ordering::Relaxed) + 1 == *n
    {
        tracing::warn!("SLUICE_KILL_AT: killed at {point} ({n})");
        let killed = std::process::Command::new("kill").args(["-9", &std::process::id().to_string()]).status();
        panic!("SLUICE_KILL_AT: kill -9 of this process failed: {killed:?}");
    }
}

/// `duration` in whole milliseconds, saturating at `u64::MAX` (584 million years)
/// where `as u64` would wrap: a far-off duration stays far off.
pub fn millis(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// `duration` in whole microseconds, saturating at `u64::MAX` like [`millis`].
pub fn micros(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

/// Locks `mutex`. The host's locks guard plain data and no code panics while holding
/// one, so a poisoned lock is a bug to surface, not a condition to handle.
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().expect("no panics under this lock")
}
