//! A Kafka message as the record the host processes ([`source_record`]).

use crate::record::{NULL_KEY_HEADER, SourceRecord, TOMBSTONE_HEADER};
use rdkafka::Message;
use rdkafka::message::BorrowedMessage;

/// The record `message` carries, at the broker's partition and offset, with its
/// headers; a missing key or value (a tombstone) is empty and marked by a header. Headers
/// of the marks' names that the record itself carries are dropped (so the marks are the
/// source's alone); the second value says whether there were any.
pub(super) fn source_record(message: &BorrowedMessage<'_>) -> (SourceRecord, bool) {
    use rdkafka::message::Headers;
    let mut headers: Vec<(String, Vec<u8>)> = message
        .headers()
        .map(|headers| {
            headers
                .iter()
                .map(|h| (String::from_utf8_lossy(h.key.as_bytes()).into_owned(), h.value.unwrap_or_default().to_vec()))
                .collect()
        })
        .unwrap_or_default();
    let carried = headers.len();
    headers.retain(|(name, _)| name != NULL_KEY_HEADER && name != TOMBSTONE_HEADER);
    let reserved = headers.len() < carried;
    let marks = [(message.key().is_none(), NULL_KEY_HEADER), (message.payload().is_none(), TOMBSTONE_HEADER)];
    headers.extend(marks.into_iter().filter(|(missing, _)| *missing).map(|(_, name)| (name.to_string(), Vec::new())));
    let record = SourceRecord {
        partition: message.partition() as u32,
        offset: message.offset() as u64,
        key: message.key().unwrap_or_default().to_vec(),
        value: message.payload().unwrap_or_default().to_vec(),
        timestamp_ms: message.timestamp().to_millis().unwrap_or(0),
        headers,
    };
    (record, reserved)
}
