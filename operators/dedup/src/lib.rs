//! Drops repeated events: the first record of each id within a window passes, the
//! others are dropped, and the window's state expires on its own.
//!
//! Input: any record keyed by its event id (`[source] key_field = "id"`). Output: the
//! record's value, unchanged, the first time its id is seen within `window_ms` (its
//! `[operator.config]`; 10 minutes by default) of event time.
//!
//! The state shape: one small marker per id, written with a TTL of the window
//! (`put_with_ttl`), so the host removes it when the window closes — state holds only
//! the ids of the last window, however many ids ever came. A repeat does not extend the
//! window: it is counted from the id's first record, and a repeat writes nothing.
use serde::{Deserialize, Serialize};
use sluice_guest::{Operator, Output, Record, Result, State, config_value, export_operator};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The config key of the window, in milliseconds.
pub const WINDOW_MS: &str = "window_ms";

/// The window when the config gives none: 10 minutes.
const DEFAULT_WINDOW_MS: u64 = 10 * 60 * 1000;

/// The window, set by `init`.
static WINDOW: AtomicU64 = AtomicU64::new(DEFAULT_WINDOW_MS);

/// What is kept per id while its window is open.
#[derive(Serialize, Deserialize)]
struct Seen {
    /// The event time of the id's first record.
    first_at: i64,
}

/// The operator.
pub struct Dedup;

impl Operator for Dedup {
    fn init(config: Vec<(String, String)>) -> Result<()> {
        if let Some(ms) = config_value(&config, WINDOW_MS)? {
            WINDOW.store(ms, Ordering::Relaxed);
        }
        Ok(())
    }

    fn process(record: Record, state: &State<'_>) -> Result<Vec<Output>> {
        // A repeat is dropped and writes nothing: the window keeps the end its first
        // record gave it.
        if state.get::<Seen>("seen")?.is_some() {
            return Ok(Vec::new());
        }
        let seen = Seen { first_at: record.timestamp_ms };
        state.put_with_ttl("seen", &seen, Duration::from_millis(WINDOW.load(Ordering::Relaxed)))?;
        Ok(vec![Output::new(record.key, record.value)])
    }
}

export_operator!(Dedup);
