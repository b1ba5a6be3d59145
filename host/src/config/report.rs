//! `[report]` and `[admin]`: the running summary and its warnings' thresholds, and the
//! admin HTTP API.

use super::*;

/// `[report]`
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReportConfig {
    /// Between running-summary lines; 0 turns them off.
    #[serde(alias = "interval_s", deserialize_with = "duration")]
    pub interval: Duration,
    /// Warn when the largest partition's state (or slowest partition's batch p99) is
    /// this many times the median partition's.
    pub skew_ratio: f64,
    /// Warn when a partition's newest checkpoint is older than this many checkpoint
    /// intervals.
    pub checkpoint_age_intervals: u32,
    /// Warn when this member took part in more rebalances than this in the last hour.
    pub rebalances_per_hour: u32,
    /// Warn when more than this share of the records processed went to the dead
    /// letters (over the last check's window).
    pub dead_letter_ratio: f64,
}

impl Default for ReportConfig {
    fn default() -> Self {
        ReportConfig {
            interval: Duration::from_secs(2),
            skew_ratio: 4.0,
            checkpoint_age_intervals: 3,
            rebalances_per_hour: 12,
            dead_letter_ratio: 0.01,
        }
    }
}

/// `[admin]`
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// `host:port` the admin HTTP API listens on; absent: no API. Beyond loopback it
    /// needs a token.
    pub listen: Option<String>,
    /// A file holding the bearer token deploys and rollbacks must present (and, beyond
    /// loopback, every request); absent: the `SLUICE_ADMIN_TOKEN` environment variable,
    /// else no token, and the API only answers questions.
    pub token_file: Option<PathBuf>,
    /// Names this host is reached by, besides IP addresses and `localhost`: on loopback
    /// a question without the token is answered only if its `Host` is one of these (a
    /// page of a site that points its name at 127.0.0.1 is refused).
    #[serde(default)]
    pub host_names: Vec<String>,
}

impl ReportConfig {
    /// Checks values that parse but cannot work.
    pub fn validate(&self) -> Result<()> {
        check_duration("[report] interval", self.interval)?;
        if !(self.skew_ratio >= 1.0 && self.skew_ratio.is_finite()) {
            bail!("[report] skew_ratio = {} must be a number of at least 1", self.skew_ratio);
        }
        if !(self.dead_letter_ratio > 0.0 && self.dead_letter_ratio <= 1.0) {
            bail!("[report] dead_letter_ratio = {} must be more than 0 and at most 1", self.dead_letter_ratio);
        }
        if self.checkpoint_age_intervals == 0 || self.rebalances_per_hour == 0 {
            bail!("[report] checkpoint_age_intervals and rebalances_per_hour must be at least 1");
        }
        Ok(())
    }
}

impl AdminConfig {
    /// Checks values that parse but cannot work.
    pub fn validate(&self) -> Result<()> {
        let not_a_name =
            |name: &&String| name.is_empty() || !name.chars().all(|c| c.is_alphanumeric() || "-.".contains(c));
        if let Some(name) = self.host_names.iter().find(not_a_name) {
            bail!("[admin] host_names: {name:?} is not a host name (give the name alone: no scheme, port or path)");
        }
        Ok(())
    }
}
