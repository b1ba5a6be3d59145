//! `[checkpoint]`: where checkpoints go, how often, how many are kept, and how a
//! restore is budgeted and retried.

use super::*;

/// `[checkpoint]`
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointConfig {
    /// Whether to checkpoint and restore at all.
    #[serde(default = "default_checkpoint_enabled")]
    pub enabled: bool,
    /// The checkpoint store: a directory, `file:///dir` or `s3://bucket/prefix`.
    /// Absent: `<state dir>.checkpoints`, a directory beside the state directory.
    pub store: Option<String>,
    /// Between the starts of a partition's checkpoints.
    #[serde(default = "default_checkpoint_interval", alias = "interval_s", deserialize_with = "duration")]
    pub interval: Duration,
    /// Checkpoints kept per partition.
    #[serde(default = "default_checkpoint_retain")]
    pub retain: usize,
    /// A restore predicted to take longer than this logs a warning.
    #[serde(default = "default_restore_budget", alias = "restore_budget_s", deserialize_with = "duration")]
    pub restore_budget: Duration,
    /// How long a partition keeps trying while something fails that should come back —
    /// the store failing to answer at its start (then the start fails), the broker at
    /// its resume, another producer fencing its transactions (then it stops alone) —
    /// the partition paused and the host in its group.
    #[serde(default = "default_restore_retry_timeout", deserialize_with = "duration")]
    pub restore_retry_timeout: Duration,
    /// Upload bandwidth cap in bytes per second; absent is unlimited.
    pub upload_bytes_per_s: Option<u64>,
}

pub(super) fn default_checkpoint_enabled() -> bool {
    true
}

pub(super) fn default_checkpoint_interval() -> Duration {
    Duration::from_secs(10)
}

pub(super) fn default_checkpoint_retain() -> usize {
    3
}

pub(super) fn default_restore_budget() -> Duration {
    Duration::from_secs(60)
}

/// Kafka Streams' `task.timeout.ms` default: a store outage this long is not a blip.
pub(super) fn default_restore_retry_timeout() -> Duration {
    Duration::from_secs(300)
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        CheckpointConfig {
            enabled: default_checkpoint_enabled(),
            store: None,
            interval: default_checkpoint_interval(),
            retain: default_checkpoint_retain(),
            restore_budget: default_restore_budget(),
            restore_retry_timeout: default_restore_retry_timeout(),
            upload_bytes_per_s: None,
        }
    }
}

impl CheckpointConfig {
    /// Checks values that parse but cannot work.
    pub fn validate(&self) -> Result<()> {
        check_duration("[checkpoint] interval", self.interval)?;
        check_duration("[checkpoint] restore_budget", self.restore_budget)?;
        check_duration("[checkpoint] restore_retry_timeout", self.restore_retry_timeout)?;
        if self.retain == 0 {
            bail!("[checkpoint] retain must be at least 1");
        }
        if self.upload_bytes_per_s == Some(0) {
            bail!("[checkpoint] upload_bytes_per_s must be positive (leave it out for no cap)");
        }
        Ok(())
    }

    /// The store URL: the configured one, or `<state_dir>.checkpoints`.
    pub fn store_url(&self, state_dir: &Path) -> String {
        self.store.clone().unwrap_or_else(|| {
            let name = state_dir.file_name().map_or("sluice-state".into(), |n| n.to_string_lossy());
            state_dir.with_file_name(format!("{name}.checkpoints")).to_string_lossy().into_owned()
        })
    }
}
