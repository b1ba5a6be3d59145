//! What a partition's shadow found: how its outputs compared with the live version's
//! record by record, what it cost, and the first differences ([`ShadowStats`]).

use crate::lock;
use serde::{Deserialize, Serialize};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// The differences a partition keeps as samples: the first ones of each shadow run.
pub const SHADOW_SAMPLES: usize = 10;
/// The most bytes of a sample's key, and of each output or field value it shows: a
/// sample tells what differs, it does not hold the records (a status page polls it).
const SAMPLE_TEXT_BYTES: usize = 1024;
/// The most outputs of each side, and fields, a sample shows.
const SAMPLE_ITEMS: usize = 8;

/// A partition's shadow counters, counted by its worker while a shadow runs; reset
/// when another shadow starts.
#[derive(Debug, Default)]
pub struct ShadowStats {
    /// The shadow version running here, if one does.
    pub version: Mutex<Option<String>>,
    /// Records (and groups of expiries or timers before one) whose outputs were
    /// compared.
    pub compared: AtomicU64,
    /// Of those, equal: as many outputs, each with the same key, topic and value, or
    /// the same dead letter.
    pub equal: AtomicU64,
    /// Both versions emitted, differently (or one emitted and the other dead-lettered).
    pub different: AtomicU64,
    /// Only the live version emitted outputs.
    pub only_live: AtomicU64,
    /// Only the shadow emitted outputs.
    pub only_shadow: AtomicU64,
    /// Records the shadow failed on (trapped, past a limit) where the live version
    /// did not.
    pub shadow_failed: AtomicU64,
    /// State entries the shadow wrote otherwise than the live version between two
    /// commits (another value, or a write only one made), summed over commits.
    pub differing_writes: AtomicU64,
    /// Times the shadow's writes since the last commit passed `[state]
    /// commit_dirty_mib` and it started over from the committed state before the commit.
    pub early_resets: AtomicU64,
    /// Records the shadow had no time for (its share of the live version's time spent),
    /// or skipped until the next commit after that: not compared.
    pub skipped: AtomicU64,
    /// Records both processed, for the CPU times below.
    pub records: AtomicU64,
    /// The live version's CPU time on those records' batches, ns.
    pub live_cpu_ns: AtomicU64,
    /// The shadow's, ns.
    pub shadow_cpu_ns: AtomicU64,
    /// Why the shadow stopped on this partition while the live version went on.
    pub stopped: Mutex<Option<String>>,
    /// The first [`SHADOW_SAMPLES`] differences.
    pub samples: Mutex<Vec<ShadowSample>>,
}

/// One origin whose outputs differed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShadowSample {
    /// The offset of the record (or of the record the expiries came before).
    pub offset: u64,
    /// `expiry` or `timer` for an expiry's or a timer's outputs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
    /// The record's key, as text (lossy).
    pub key: String,
    /// What the live version emitted: each output's value as text (lossy), or the dead
    /// letter's kind and reason.
    pub live: Vec<String>,
    /// What the shadow emitted, likewise.
    pub shadow: Vec<String>,
    /// The fields that differ (`{"path", "left" (live), "right" (shadow)}`), when both
    /// emitted as many JSON values; else empty.
    pub fields: serde_json::Value,
}

impl ShadowSample {
    /// This sample cut to what it takes to tell the difference: its key and each value
    /// to `SAMPLE_TEXT_BYTES`, each side's outputs and the fields to `SAMPLE_ITEMS`,
    /// each cut saying how much it left out. However large the records, ten samples of
    /// every partition stay a few hundred KiB.
    pub fn bounded(mut self) -> Self {
        fn cut(text: &mut String) {
            if text.len() > SAMPLE_TEXT_BYTES {
                let left_out = text.len() - text.floor_char_boundary(SAMPLE_TEXT_BYTES);
                text.truncate(text.floor_char_boundary(SAMPLE_TEXT_BYTES));
                text.push_str(&format!("… ({left_out} bytes more)"));
            }
        }
        fn few(items: &mut Vec<String>) {
            if items.len() > SAMPLE_ITEMS {
                let more = items.len() - SAMPLE_ITEMS;
                items.truncate(SAMPLE_ITEMS);
                items.push(format!("… ({more} more)"));
            }
            items.iter_mut().for_each(cut);
        }
        cut(&mut self.key);
        few(&mut self.live);
        few(&mut self.shadow);
        if let Some(fields) = self.fields.as_array_mut() {
            fields.truncate(SAMPLE_ITEMS);
            for value in fields.iter_mut().filter_map(|f| f.as_object_mut()).flat_map(|f| f.values_mut()) {
                let mut text = value.to_string();
                if text.len() > SAMPLE_TEXT_BYTES {
                    cut(&mut text);
                    *value = text.into();
                }
            }
        }
        self
    }

    /// One line for people: `offset 12 (expiry), key "veh-1": value.idle_count (live
    /// absent, shadow 0)`, or both sides' outputs where no field can be named.
    pub fn describe(&self) -> String {
        let cause = self.cause.as_deref().map_or(String::new(), |cause| format!(" ({cause})"));
        let fields: Vec<String> = (self.fields.as_array().into_iter().flatten())
            .map(|field| {
                let side = |name: &str| field.get(name).map_or("absent".to_string(), ToString::to_string);
                let path = field["path"].as_str().filter(|path| !path.is_empty()).unwrap_or("value");
                format!("{path} (live {}, shadow {})", side("left"), side("right"))
            })
            .collect();
        let what = match fields.is_empty() {
            true => format!("live {:?}, shadow {:?}", self.live, self.shadow),
            false => fields.join(", "),
        };
        format!("offset {}{cause}, key {:?}: {what}", self.offset, self.key)
    }
}

/// [`ShadowStats`] read at one moment, as `sluice shadow status`, the metrics and the
/// status page show them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ShadowReport {
    /// The shadow version, if one runs here.
    pub version: Option<String>,
    /// See [`ShadowStats`].
    pub compared: u64,
    /// See [`ShadowStats::equal`].
    pub equal: u64,
    /// See [`ShadowStats::different`].
    pub different: u64,
    /// See [`ShadowStats::only_live`].
    pub only_live: u64,
    /// See [`ShadowStats::only_shadow`].
    pub only_shadow: u64,
    /// See [`ShadowStats::shadow_failed`].
    pub shadow_failed: u64,
    /// See [`ShadowStats::differing_writes`].
    pub differing_writes: u64,
    /// See [`ShadowStats::early_resets`].
    #[serde(default)]
    pub early_resets: u64,
    /// See [`ShadowStats::skipped`].
    #[serde(default)]
    pub skipped: u64,
    /// See [`ShadowStats::records`].
    pub records: u64,
    /// See [`ShadowStats::live_cpu_ns`].
    pub live_cpu_ns: u64,
    /// See [`ShadowStats::shadow_cpu_ns`].
    pub shadow_cpu_ns: u64,
    /// See [`ShadowStats::stopped`].
    pub stopped: Option<String>,
    /// See [`ShadowStats::samples`].
    pub samples: Vec<ShadowSample>,
}

impl ShadowStats {
    /// Starts counting for shadow `version` (`None`: none runs) afresh.
    pub fn reset(&self, version: Option<String>) {
        for counter in self.counters() {
            counter.store(0, Ordering::Relaxed);
        }
        *lock(&self.version) = version;
        *lock(&self.stopped) = None;
        lock(&self.samples).clear();
    }

    /// Keeps `sample`, [bounded](ShadowSample::bounded), if fewer than
    /// [`SHADOW_SAMPLES`] are kept; `sample` is called only then.
    pub fn sample(&self, sample: impl FnOnce() -> ShadowSample) {
        let mut samples = lock(&self.samples);
        if samples.len() < SHADOW_SAMPLES {
            samples.push(sample().bounded());
        }
    }

    /// The counters as they are now.
    pub fn report(&self) -> ShadowReport {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        ShadowReport {
            version: lock(&self.version).clone(),
            compared: load(&self.compared),
            equal: load(&self.equal),
            different: load(&self.different),
            only_live: load(&self.only_live),
            only_shadow: load(&self.only_shadow),
            shadow_failed: load(&self.shadow_failed),
            differing_writes: load(&self.differing_writes),
            early_resets: load(&self.early_resets),
            skipped: load(&self.skipped),
            records: load(&self.records),
            live_cpu_ns: load(&self.live_cpu_ns),
            shadow_cpu_ns: load(&self.shadow_cpu_ns),
            stopped: lock(&self.stopped).clone(),
            samples: lock(&self.samples).clone(),
        }
    }

    fn counters(&self) -> [&AtomicU64; 12] {
        [
            &self.early_resets,
            &self.skipped,
            &self.compared,
            &self.equal,
            &self.different,
            &self.only_live,
            &self.only_shadow,
            &self.shadow_failed,
            &self.differing_writes,
            &self.records,
            &self.live_cpu_ns,
            &self.shadow_cpu_ns,
        ]
    }
}

impl ShadowReport {
    /// Adds `other`'s counters to these (for a job's totals); the version and samples
    /// stay these.
    pub fn add(&mut self, other: &ShadowReport) {
        self.compared += other.compared;
        self.equal += other.equal;
        self.different += other.different;
        self.only_live += other.only_live;
        self.only_shadow += other.only_shadow;
        self.shadow_failed += other.shadow_failed;
        self.differing_writes += other.differing_writes;
        self.early_resets += other.early_resets;
        self.skipped += other.skipped;
        self.records += other.records;
        self.live_cpu_ns += other.live_cpu_ns;
        self.shadow_cpu_ns += other.shadow_cpu_ns;
    }

    /// The shadow's CPU per record over the live version's; `None` before a record.
    pub fn cpu_ratio(&self) -> Option<f64> {
        (self.live_cpu_ns > 0).then(|| self.shadow_cpu_ns as f64 / self.live_cpu_ns as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sample of huge records keeps a bounded part of each, saying what it left out.
    #[test]
    fn a_sample_of_huge_records_is_bounded() {
        let huge = "x".repeat(1 << 20);
        let field = serde_json::json!({"path": "value", "left": huge, "right": 1});
        let sample = ShadowSample {
            offset: 1,
            cause: None,
            key: huge.clone(),
            live: vec![huge.clone(); 100],
            shadow: vec![],
            fields: serde_json::Value::Array(vec![field; 100]),
        }
        .bounded();
        let size = serde_json::to_string(&sample).expect("serializes").len();
        assert!(size < 64 << 10, "{size} bytes");
        assert!(sample.key.ends_with(&format!("… ({} bytes more)", (1 << 20) - SAMPLE_TEXT_BYTES)));
        assert_eq!(sample.live.last().map(String::as_str), Some("… (92 more)"));
    }
}
