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
    /// the partition paused and the host in its group; and how long a starting host
    /// keeps trying to record its configured operator in the store's registry.
    #[serde(deserialize_with = "duration")]
    pub restore_retry_timeout: Duration,
    /// Upload bandwidth cap in bytes per second; absent is unlimited.
    pub upload_bytes_per_s: Option<u64>,
    /// Cap on all of this host's downloads from the store (restores and standby
    /// copies together) in bytes per second; absent is unlimited.
    pub download_bytes_per_s: Option<u64>,
    /// Which partitions this host keeps standby copies of.
    pub standby: Standby,
    /// The disk the standby copies may take, in bytes.
    pub standby_max_bytes: u64,
    /// Between two looks at the store for newer checkpoints of the partitions followed.
    #[serde(deserialize_with = "duration")]
    pub standby_poll: Duration,
    /// The longest a starting host brings its standby copies up to date before it
    /// joins its group.
    #[serde(deserialize_with = "duration")]
    pub standby_warm_up: Duration,
}

/// `[checkpoint] standby`: which partitions a host of a Kafka group keeps warm copies
/// of, followed from the checkpoint store, so that taking one over fetches the newest
/// checkpoints' new files instead of the state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "StandbyValue")]
pub enum Standby {
    /// None: a partition that moves here is restored from the store (reusing whatever
    /// of its files this host's disk still holds).
    None,
    /// Every partition this host does not run: whichever host survives or takes over,
    /// it is warm. Downloads every checkpoint's new files once per host.
    All,
    /// `standby = N`: each partition is followed by N hosts of the group other than
    /// its owner, the same ones on every host (rendezvous hashing over the group's
    /// members as Kafka describes them), chosen again as members come and go. Every
    /// checkpoint is downloaded N times in all, however many hosts there are.
    Hosts(u32),
}

/// `standby` as written: a name or a number of hosts.
#[derive(Deserialize)]
#[serde(untagged)]
enum StandbyValue {
    Hosts(i64),
    Named(String),
}

impl TryFrom<StandbyValue> for Standby {
    type Error = String;

    fn try_from(value: StandbyValue) -> std::result::Result<Self, String> {
        match value {
            StandbyValue::Named(name) if name == "none" => Ok(Standby::None),
            StandbyValue::Named(name) if name == "all" => Ok(Standby::All),
            StandbyValue::Hosts(n) if n >= 1 => {
                u32::try_from(n).map(Standby::Hosts).map_err(|_| format!("[checkpoint] standby = {n}: too many hosts"))
            }
            StandbyValue::Hosts(n) => {
                Err(format!("[checkpoint] standby = {n}: a number of hosts is 1 or more (\"none\" keeps no copies)"))
            }
            StandbyValue::Named(other) => Err(format!(
                "[checkpoint] standby = {other:?}: expected \"none\", \"all\" or a number of hosts (1 or more)"
            )),
        }
    }
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
            download_bytes_per_s: None,
            standby: Standby::All,
            standby_max_bytes: 10 << 30,
            standby_poll: Duration::from_secs(10),
            standby_warm_up: Duration::from_secs(300),
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
        check_duration("[checkpoint] standby_poll", self.standby_poll)?;
        for (name, cap) in [("upload", self.upload_bytes_per_s), ("download", self.download_bytes_per_s)] {
            if cap == Some(0) {
                bail!("[checkpoint] {name}_bytes_per_s must be positive (leave it out for no cap)");
            }
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
