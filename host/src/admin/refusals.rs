//! The admin API's log of refusals ([`Refusals`]), bounded so that a stranger's
//! requests cannot flood the host's log.

use super::events::REFUSALS_COUNTED;
use super::{REFUSAL_LINE_BYTES, REFUSAL_LOG_WINDOW, REFUSALS_LOGGED};
use crate::lock;
use std::sync::Mutex;
use std::time::Instant;

/// The API's log of refusals, bounded: at most [`REFUSALS_LOGGED`] lines one by one per
/// [`REFUSAL_LOG_WINDOW`], and one counting the rest.
pub(super) struct Refusals(Mutex<RefusalWindow>);

struct RefusalWindow {
    began: Instant,
    logged: u64,
    counted: u64,
}

impl Refusals {
    pub(super) fn new() -> Self {
        Refusals(Mutex::new(RefusalWindow { began: Instant::now(), logged: 0, counted: 0 }))
    }

    /// Logs `line`, cut at [`REFUSAL_LINE_BYTES`], as a warning, unless the window's
    /// lines are spent: then counts it.
    pub(super) fn note(&self, line: &str) {
        let mut window = lock(&self.0);
        window.roll();
        if window.logged < REFUSALS_LOGGED {
            window.logged += 1;
            tracing::warn!("admin API: {}", &line[..line.floor_char_boundary(REFUSAL_LINE_BYTES)]);
        } else {
            window.counted += 1;
        }
    }

    /// Ends the window if it is over, logging how many it counted.
    pub(super) fn roll(&self) {
        lock(&self.0).roll();
    }
}

impl RefusalWindow {
    fn roll(&mut self) {
        if self.began.elapsed() < REFUSAL_LOG_WINDOW {
            return;
        }
        if self.counted > 0 {
            tracing::warn!(
                "admin API: {} {REFUSALS_COUNTED} (at most {REFUSALS_LOGGED} per {REFUSAL_LOG_WINDOW:?} are)",
                self.counted
            );
        }
        *self = RefusalWindow { began: Instant::now(), logged: 0, counted: 0 };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Past [`REFUSALS_LOGGED`] in a window, refusals are counted, not logged; a window
    /// over starts again.
    #[test]
    fn refusals_beyond_the_windows_lines_are_counted() {
        let refusals = Refusals::new();
        for n in 0..REFUSALS_LOGGED + 3 {
            refusals.note(&format!("refusal {n} {}", "é".repeat(REFUSAL_LINE_BYTES)));
        }
        let (logged, counted) = {
            let window = lock(&refusals.0);
            (window.logged, window.counted)
        };
        assert_eq!((logged, counted), (REFUSALS_LOGGED, 3));
        lock(&refusals.0).began -= REFUSAL_LOG_WINDOW + Duration::from_millis(1);
        refusals.roll();
        let window = lock(&refusals.0);
        assert_eq!((window.logged, window.counted), (0, 0), "a new window");
    }
}
