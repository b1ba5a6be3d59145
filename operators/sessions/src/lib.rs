//! Per-user sessions closed by inactivity: a user's events extend their open session,
//! and a session with no event for `gap_ms` (its `[operator.config]`; 30 minutes by
//! default) of event time closes, and is emitted then, by the expiry callback.
//!
//! Input: JSON `{"user","ts","page"}` keyed by user (`[source] key_field = "user"`).
//! Output: one line per closed session, `{"user","start","end","events","pages"}`,
//! marked as an expiry's (`"cause":"expiry"` in a file sink's lines); nothing per event.
//!
//! The state shape: one running summary per user, written with a TTL of the gap at every
//! event, so the host expires it exactly when the user has been inactive for the gap,
//! and calls `expired` with the last summary, which becomes the closed session.
use serde::{Deserialize, Serialize};
use sluice_guest::{Expired, Operator, Output, Record, Result, State, config_value, export_operator};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The config key of the inactivity gap, in milliseconds.
pub const GAP_MS: &str = "gap_ms";

/// The gap when the config gives none: 30 minutes.
const DEFAULT_GAP_MS: u64 = 30 * 60 * 1000;

/// The gap, set by `init`.
static GAP: AtomicU64 = AtomicU64::new(DEFAULT_GAP_MS);

#[derive(Deserialize)]
struct Event {
    user: String,
    ts: i64,
    page: String,
}

/// A user's open session, and the closed session emitted when it expires.
#[derive(Serialize, Deserialize)]
struct Session {
    user: String,
    /// Event time of its first and last event.
    start: i64,
    end: i64,
    /// Its events, and the distinct pages they visited (few: a session is short).
    events: u64,
    pages: Vec<String>,
}

/// The operator.
pub struct Sessions;

impl Operator for Sessions {
    fn init(config: Vec<(String, String)>) -> Result<()> {
        if let Some(ms) = config_value(&config, GAP_MS)? {
            GAP.store(ms, Ordering::Relaxed);
        }
        Ok(())
    }

    fn process(record: Record, state: &State<'_>) -> Result<Vec<Output>> {
        let event: Event = record.json()?;
        let mut session = state.get::<Session>("session")?.unwrap_or_else(|| Session {
            user: event.user,
            start: event.ts,
            end: event.ts,
            events: 0,
            pages: Vec::new(),
        });
        session.start = session.start.min(event.ts);
        session.end = session.end.max(event.ts);
        session.events += 1;
        if !session.pages.contains(&event.page) {
            session.pages.push(event.page);
        }
        state.put_with_ttl("session", &session, Duration::from_millis(GAP.load(Ordering::Relaxed)))?;
        Ok(Vec::new())
    }

    /// The user was inactive for the gap: the session is closed.
    fn expired(entry: Expired, _state: &State<'_>) -> Result<Vec<Output>> {
        let session: Session = entry.value()?;
        Ok(vec![Output::json(entry.key, &session)?])
    }
}

export_operator!(Sessions);
