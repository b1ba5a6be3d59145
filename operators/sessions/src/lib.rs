//! Per-user sessions closed by inactivity, on the SDK's session windows: a user's events
//! extend their open session, and a session with no event for `gap_ms` (its
//! `[operator.config]`; 30 minutes by default) of event time closes and is emitted.
//!
//! Input: JSON `{"user","ts","page"}` keyed by user (`[source] key_field = "user"`).
//! Output: one line per closed session, `{"user","start","end","events","pages"}`
//! (`start` and `end`: its first and last event), marked as a timer's (`"cause":"timer"`
//! in a file sink's lines); nothing per event. An event behind the clock by more than the
//! gap, for a session already closed, is a `late` dead letter.
use serde::{Deserialize, Serialize};
use sluice_guest::window::{Aggregate, WindowSpec};
use sluice_guest::{Operator, Output, Record, Result, State, Timer, config_value, export_operator};
use std::sync::atomic::{AtomicU64, Ordering};

/// The config key of the inactivity gap, in milliseconds.
pub const GAP_MS: &str = "gap_ms";

/// The gap, set by `init`: 30 minutes unless the config says.
static GAP: AtomicU64 = AtomicU64::new(30 * 60 * 1000);

/// The session windows of the gap in force.
fn sessions() -> WindowSpec {
    WindowSpec::session("session", GAP.load(Ordering::Relaxed))
}

#[derive(Deserialize)]
struct Event {
    user: String,
    ts: i64,
    page: String,
}

/// A session: what is emitted when it closes.
#[derive(Default, Clone, Serialize, Deserialize)]
struct Session {
    user: String,
    /// Event time of its first and last event.
    start: i64,
    end: i64,
    /// Its events, and the distinct pages they visited (few: a session is short).
    events: u64,
    pages: Vec<String>,
}

impl Aggregate for Session {
    /// Sessions an event bridges become one (and a new session is its first event).
    fn merge(&mut self, other: Self) {
        if self.events == 0 {
            return *self = other;
        }
        (self.start, self.end, self.events) =
            (self.start.min(other.start), self.end.max(other.end), self.events + other.events);
        self.pages.extend(other.pages.into_iter().filter(|page| !self.pages.contains(page)).collect::<Vec<_>>());
    }
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
        let one = Session { user: event.user, start: event.ts, end: event.ts, events: 1, pages: vec![event.page] };
        sessions().add(state, event.ts, |session: &mut Session| session.merge(one.clone()))?;
        Ok(Vec::new())
    }

    /// The user was inactive for the gap: the session is closed.
    fn fired(timer: Timer, state: &State<'_>) -> Result<Vec<Output>> {
        let closed = sessions().fired::<Session>(state, &timer)?;
        closed.into_iter().map(|window| Output::json(timer.key.clone(), &window.aggregate)).collect()
    }
}

export_operator!(Sessions);
