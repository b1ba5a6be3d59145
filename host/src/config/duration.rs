//! Durations in a config: a number of seconds or a string such as `"500ms"`, `"10s"` or
//! `"1m"`, read by [`parse_duration`], and the bound every duration setting is checked
//! against.

use super::*;

/// The longest duration a setting takes: its milliseconds fit the u64 that clocks,
/// expiries and deadlines count in (2^64 - 1 ms, about 584 million years). A longer one
/// would wrap where it becomes milliseconds, or overflow where it is added to a time.
pub const MAX_DURATION: Duration = Duration::from_millis(u64::MAX);

/// Fails, naming `setting`, when `duration` is longer than [`MAX_DURATION`].
pub(super) fn check_duration(setting: &str, duration: Duration) -> Result<()> {
    if duration > MAX_DURATION {
        bail!(
            "{setting} = {}s is more than {}s (2^64 - 1 ms, about 584 million years), the longest duration sluice \
             counts",
            duration.as_secs(),
            MAX_DURATION.as_secs()
        );
    }
    Ok(())
}

/// Reads a duration as the config and the command line write it: a number of seconds
/// (`2.5`), or a number with units as [`humantime`] reads it (`"500ms"`, `"10s"`,
/// `"1m"`, `"1h 30m"`). Negative, infinite and unreadable values are errors.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    match text.trim().parse::<f64>() {
        Ok(seconds) => duration_of_seconds(seconds),
        Err(_) => humantime::parse_duration(text.trim()).map_err(|e| {
            format!("{text:?} is not a duration ({e}): write a number of seconds or e.g. \"500ms\", \"10s\", \"1m\"")
        }),
    }
}

pub(super) fn duration_of_seconds(seconds: f64) -> Result<Duration, String> {
    if seconds < 0.0 {
        return Err(format!("{seconds} is not a duration: durations are 0 or more seconds"));
    }
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{seconds} is not a duration: {e}"))
}

/// A duration setting, through [`parse_duration`]: TOML gives a number or a string.
pub(super) fn duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    struct DurationVisitor;

    impl Visitor<'_> for DurationVisitor {
        type Value = Duration;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a duration: a number of seconds or a string such as \"500ms\", \"10s\" or \"1m\"")
        }

        fn visit_i64<E: de::Error>(self, seconds: i64) -> Result<Duration, E> {
            duration_of_seconds(seconds as f64).map_err(E::custom)
        }

        fn visit_u64<E: de::Error>(self, seconds: u64) -> Result<Duration, E> {
            Ok(Duration::from_secs(seconds))
        }

        fn visit_f64<E: de::Error>(self, seconds: f64) -> Result<Duration, E> {
            duration_of_seconds(seconds).map_err(E::custom)
        }

        fn visit_str<E: de::Error>(self, text: &str) -> Result<Duration, E> {
            parse_duration(text).map_err(E::custom)
        }
    }

    deserializer.deserialize_any(DurationVisitor)
}

/// An optional duration setting: absent is `None` (with `#[serde(default)]`).
pub(super) fn optional_duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Duration>, D::Error> {
    duration(deserializer).map(Some)
}
