//! What a job did ([`JobReport`]), per partition and in all, and how the final report
//! prints it.

use super::events::{DEAD_LETTERS_BY_KIND, EXPIRED_REMOVED, SHADOW_COMPARED};
use crate::checkpoint;
use crate::partitions::{DispatchReport, PartitionReport, Router};
use crate::probes::{peak_rss, process_cpu};
use crate::stats::{DeadLetters, ShadowReport};
use std::fmt;
use std::time::{Duration, Instant};

/// What a job did, per partition and in all.
#[derive(Debug, Clone, PartialEq)]
pub struct JobReport {
    /// Wall-clock time from the start of the source to the last commit.
    pub elapsed: Duration,
    /// The longest a partition waited for its state before processing began (`None`:
    /// checkpoints off).
    pub restore_took: Option<Duration>,
    /// What the source read and skipped.
    pub source: DispatchReport,
    /// One entry per run of a partition on this host (a partition that moved away and
    /// back has two), in partition order.
    pub partitions: Vec<PartitionReport>,
    /// CPU time of the whole process over the same span, every thread (RocksDB's
    /// included); `None` where the system does not say.
    pub cpu: Option<Duration>,
    /// The most memory the process held resident, in bytes, when the system says.
    pub peak_rss: Option<u64>,
}

impl JobReport {
    /// What `router`'s run did since `started`, when the process had spent `cpu`.
    pub(super) fn of(router: &Router, started: Instant, cpu: Option<Duration>, checkpoints_on: bool) -> JobReport {
        let mut reports = router.partition_reports().to_vec();
        reports.sort_by_key(|r| r.partition);
        JobReport {
            elapsed: started.elapsed(),
            restore_took: checkpoints_on.then(|| reports.iter().map(|r| r.start_took).max().unwrap_or_default()),
            source: router.report(),
            partitions: reports,
            cpu: cpu.zip(process_cpu()).map(|(before, after)| after.saturating_sub(before)),
            peak_rss: peak_rss(),
        }
    }

    /// Records processed by this run, over all partitions.
    pub fn processed(&self) -> u64 {
        self.partitions.iter().map(|p| p.totals.processed).sum()
    }
}

impl fmt::Display for JobReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let processed = self.processed();
        let rate = processed as f64 / self.elapsed.as_secs_f64().max(1e-9);
        let dead: u64 = self.partitions.iter().map(|p| p.totals.dead_letters).sum();
        let keys: u64 = self.partitions.iter().filter_map(|p| p.keys).sum();
        writeln!(
            f,
            "processed {processed} records in {:.2}s ({rate:.0} records/s); {dead} dead letters; {keys} keys hold state; \
             {} records skipped (already in state)",
            self.elapsed.as_secs_f64(),
            self.source.skipped
        )?;
        let expired: u64 = self.partitions.iter().map(|p| p.totals.expired).sum();
        let ignored: u64 = self.partitions.iter().map(|p| p.totals.clock_ignored).sum();
        if expired > 0 || ignored > 0 {
            writeln!(
                f,
                "{expired}{EXPIRED_REMOVED}; {ignored} records without a usable timestamp (none, negative or too \
                 far ahead) did not move the event-time clock"
            )?;
        }
        if !self.source.gaps.is_empty() {
            let gaps: Vec<String> = self.source.gaps.iter().map(|(p, n)| format!("partition {p}: {n}")).collect();
            writeln!(f, "offset gaps (offsets the source never delivered, see the log): {}", gaps.join(", "))?;
        }
        for (version, dead) in DeadLetters::by_version(self.partitions.iter().map(|p| &p.dead_letters)) {
            writeln!(f, "{DEAD_LETTERS_BY_KIND}: {dead}, from {version}")?;
        }
        if let Some(took) = self.restore_took {
            writeln!(f, "restore took {:.3}s before processing began", took.as_secs_f64())?;
        }
        if let (Some(cpu), Some(peak)) = (self.cpu, self.peak_rss) {
            writeln!(
                f,
                "CPU time {:.2}s over every thread ({:.2} µs per record); peak memory {} (RSS)",
                cpu.as_secs_f64(),
                cpu.as_secs_f64() * 1e6 / processed.max(1) as f64,
                checkpoint::bytes(peak)
            )?;
        }
        let versions: std::collections::BTreeSet<&str> = self.partitions.iter().map(|p| p.version.as_str()).collect();
        let switches: u64 = self.partitions.iter().map(|p| p.totals.switches).sum();
        writeln!(
            f,
            "operator at the end: {}; {switches} version switches (hot swaps) over all partitions",
            versions.into_iter().collect::<Vec<_>>().join(", ")
        )?;
        self.write_shadow(f)?;
        writeln!(
            f,
            "partition  restored-from           resumed-at  committed  processed  dead-letters  keys  entries  \
             expired      due  watermark             checkpoints  checkpointed-at  uploaded  stopped"
        )?;
        for p in &self.partitions {
            writeln!(
                f,
                "{:>9}  {:<22}  {:>10}  {:>9}  {:>9}  {:>12}  {:>4}  {:>7}  {:>7}  {:>7}  {:<20}  {:>11}  {:>15}  {:>8}  \
                 {:?}",
                p.partition,
                p.restored_from.to_string(),
                p.resumed_at,
                p.totals.committed_offset,
                p.totals.processed,
                p.totals.dead_letters,
                p.keys.map_or("-".to_string(), |k| k.to_string()),
                p.totals.entries,
                p.totals.expired,
                p.totals.backlog,
                clock_time(p.totals.clock_ms),
                p.totals.checkpoints,
                p.totals.checkpoint_offset,
                checkpoint::bytes(p.totals.uploaded_bytes),
                p.stopped
            )?;
        }
        Ok(())
    }
}

impl JobReport {
    /// What the shadow found, if one ran at the end: a line in all, then each
    /// partition's first differences and why it stopped where it did.
    fn write_shadow(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut all = ShadowReport::default();
        for p in self.partitions.iter().filter(|p| p.shadow.version.is_some()) {
            all.version = all.version.or(p.shadow.version.clone());
            all.add(&p.shadow);
        }
        let Some(version) = &all.version else { return Ok(()) };
        writeln!(
            f,
            "{SHADOW_COMPARED} {version}: {} compared, {} equal, {} different, {} only live, {} only shadow; {} records \
             the shadow failed on; {} state writes differ; shadow CPU per record {} of the live version's; {} records \
             skipped (out of the shadow's time)",
            all.compared,
            all.equal,
            all.different,
            all.only_live,
            all.only_shadow,
            all.shadow_failed,
            all.differing_writes,
            all.cpu_ratio().map_or("-".to_string(), |ratio| format!("{ratio:.2}x")),
            all.skipped
        )?;
        for p in &self.partitions {
            if let Some(stopped) = &p.shadow.stopped {
                writeln!(f, "  partition {}: the shadow stopped: {stopped}", p.partition)?;
            }
            for sample in p.shadow.samples.iter().take(3) {
                writeln!(f, "  partition {} {}", p.partition, sample.describe())?;
            }
        }
        Ok(())
    }
}

/// A partition's clock as a time of day (RFC 3339, to the second), or `-` before it
/// started.
pub(super) fn clock_time(ms: u64) -> String {
    match ms {
        0 => "-".to_string(),
        ms => humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_millis(ms)).to_string(),
    }
}
