//! What every Kafka client of the host shares: the Kafka source's consumer, the Kafka
//! sink's producer, the exactly-once sink's transactional producers and the consumers
//! that look up topics and group offsets all start from [`client_config`].
//!
//! This module owns only how a client's settings are put together; what each client
//! sets is its own module's ([`source::kafka`](crate::source::kafka),
//! [`sink::kafka`](crate::sink::kafka), [`sink::transaction`](crate::sink::transaction)).

use rdkafka::config::ClientConfig;
use std::collections::BTreeMap;

/// A librdkafka client configuration for `brokers`: sluice's `defaults`, then the
/// user's `properties` (from `[source]` or `[sink]`), which win.
pub fn client_config(brokers: &str, defaults: &[(&str, &str)], properties: &BTreeMap<String, String>) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", brokers);
    for (name, value) in defaults.iter().copied().chain(properties.iter().map(|(k, v)| (k.as_str(), v.as_str()))) {
        config.set(name, value);
    }
    config
}
