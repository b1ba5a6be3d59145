//! Timers in the state: a timer `name` of a key is an entry of that key under a name
//! reserved for the host ([`entry_name`]), empty, expiring at the timer's time. So it is
//! indexed, swept, committed, checkpointed, restored and handed over exactly as a value
//! under a TTL is — fired exactly once, in time order with the expiries — and this
//! module owns only the naming. What a fired timer does is the operator layer's.

use super::Expired;

/// What the names of the state entries that hold timers begin with. Operators' state
/// names may not ([`is_reserved`]): a NUL is no name's first character in practice.
const TIMER_PREFIX: &str = "\u{0}timer:";

/// The state entry name holding the timer `name`.
pub(super) fn entry_name(name: &str) -> String {
    format!("{TIMER_PREFIX}{name}")
}

/// Whether an operator's state name is one reserved for the host's timers.
pub fn is_reserved(name: &str) -> bool {
    name.starts_with('\u{0}')
}

/// The name of the timer a state entry `name` holds, when it holds one.
pub fn timer_of(name: &str) -> Option<&str> {
    name.strip_prefix(TIMER_PREFIX)
}

impl Expired {
    /// The timer's name, when the entry held a timer (which fired) rather than a value.
    pub fn timer(&self) -> Option<&str> {
        timer_of(&self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timers_entry_is_reserved_and_names_the_timer_back() {
        let expired = Expired { key: b"k".to_vec(), name: entry_name("close"), value: Vec::new(), expired_at_ms: 5 };
        assert!(is_reserved(&expired.name));
        assert_eq!(expired.timer(), Some("close"));
        let value = Expired { name: "close".into(), ..expired };
        assert!(!is_reserved(&value.name));
        assert_eq!(value.timer(), None);
    }
}
