//! Log lines the host writes on behalf of others — an operator's own lines, the traps of
//! its records — within a rate, so that what a guest does cannot flood the host's log;
//! and text from outside made safe to put in a log line.
//!
//! A leaf: it imports nothing of the host. It does not decide what is logged, only how
//! much of it and in what form.

use std::time::{Duration, Instant};

/// A budget of log lines and bytes per second: lines past it are dropped and counted,
/// and the count is reported with the next line written.
#[derive(Debug)]
pub struct LogRate {
    lines_per_s: u64,
    bytes_per_s: u64,
    /// When the current second began, and its lines and bytes written so far.
    second: Instant,
    lines: u64,
    bytes: u64,
    /// Lines dropped this second...
    dropped_now: u64,
    /// ... and since the last line written.
    dropped: u64,
}

/// What [`LogRate::admit`] says of a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admitted {
    /// Write it, after saying that `dropped` lines were not (0: none).
    Yes {
        /// Lines dropped since the last line written.
        dropped: u64,
    },
    /// Drop it; `first` says it is the first dropped this second, which the caller
    /// warns about (naming its settings).
    No {
        /// Whether it is the first line dropped this second.
        first: bool,
    },
}

impl LogRate {
    /// At most `lines_per_s` lines of at most `bytes_per_s` bytes together per second.
    pub fn new(lines_per_s: u64, bytes_per_s: u64) -> Self {
        LogRate { lines_per_s, bytes_per_s, second: Instant::now(), lines: 0, bytes: 0, dropped_now: 0, dropped: 0 }
    }

    /// Whether a line of `bytes` fits this second's budget.
    pub fn admit(&mut self, bytes: usize) -> Admitted {
        if self.second.elapsed() >= Duration::from_secs(1) {
            (self.second, self.lines, self.bytes, self.dropped_now) = (Instant::now(), 0, 0, 0);
        }
        let bytes = bytes as u64;
        if self.lines < self.lines_per_s && self.bytes.saturating_add(bytes) <= self.bytes_per_s {
            self.lines += 1;
            self.bytes += bytes;
            return Admitted::Yes { dropped: std::mem::take(&mut self.dropped) };
        }
        self.dropped += 1;
        self.dropped_now += 1;
        Admitted::No { first: self.dropped_now == 1 }
    }
}

/// `text` as one log line: control characters (a newline above all, which would let a
/// guest forge a line of the host's) escaped as `\n`, `\u{1b}`.
pub fn one_line(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return text.into();
    }
    let mut line = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => line.push_str("\\n"),
            '\r' => line.push_str("\\r"),
            '\t' => line.push_str("\\t"),
            c if c.is_control() => line.extend(c.escape_unicode()),
            c => line.push(c),
        }
    }
    line.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_past_the_rate_are_dropped_counted_and_reported_once() {
        let mut rate = LogRate::new(2, 1_000);
        assert_eq!(rate.admit(10), Admitted::Yes { dropped: 0 });
        assert_eq!(rate.admit(10), Admitted::Yes { dropped: 0 });
        assert_eq!(rate.admit(10), Admitted::No { first: true });
        assert_eq!(rate.admit(10), Admitted::No { first: false });
        rate.second -= Duration::from_secs(1);
        assert_eq!(rate.admit(10), Admitted::Yes { dropped: 2 });
        assert_eq!(rate.admit(2_000), Admitted::No { first: true }, "past the bytes");
    }

    #[test]
    fn a_line_cannot_hold_a_newline_or_an_escape_sequence() {
        assert_eq!(one_line("plain ünïcödé"), "plain ünïcödé");
        assert_eq!(one_line("a\nINFO forged\r\t\u{1b}[31m"), "a\\nINFO forged\\r\\t\\u{1b}[31m");
    }
}
