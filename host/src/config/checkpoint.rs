//! `[checkpoint]`: where checkpoints go, how often, how many are kept, and how a
//! restore is budgeted and retried.

use super::*;

/// `[checkpoint]`
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CheckpointConfig {
    /// Whether to checkpoint and restore at all.
    pub enabled: bool,
    /// The checkpoint store: a directory, `file:///dir` or `s3://bucket/prefix`.
    /// Absent: `<state dir>.checkpoints`, a directory beside the state directory.
    pub store: Option<String>,
    /// Between the starts of a partition's checkpoints.
    #[serde(alias = "interval_s", deserialize_with = "duration")]
    pub interval: Duration,
    /// Checkpoints kept per partition.
    pub retain: usize,
    /// A restore predicted to take longer than this logs a warning.
    #[serde(alias = "restore_budget_s", deserialize_with = "duration")]
    pub restore_budget: Duration,
    /// How long a partition keeps trying while something fails that should come back —
    /// the store failing to answer at its start (then the start fails), the broker at
    /// its resume, another producer fencing its transactions (then it stops alone) —
    /// the partition paused and the host in its group.
    #[serde(deserialize_with = "duration")]
    pub restore_retry_timeout: Duration,
    /// Upload bandwidth cap in bytes per second; absent is unlimited.
    pub upload_bytes_per_s: Option<u64>,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        CheckpointConfig {
            enabled: true,
            store: None,
            interval: Duration::from_secs(10),
            retain: 3,
            restore_budget: Duration::from_secs(60),
            // Kafka Streams' `task.timeout.ms` default: a store outage this long is not a blip.
            restore_retry_timeout: Duration::from_secs(300),
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
