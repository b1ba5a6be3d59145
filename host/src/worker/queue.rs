//! A partition's queue: the batches its router handed over that its worker has not
//! taken yet, bounded in batches and in bytes.
//!
//! A bound in records alone lets records' sizes choose the host's memory (65,536 queued
//! records of 16 MiB lines are 1 TiB), so the queue also holds at most `[state]
//! queued_mib` of records' bytes — except one batch, however large, when it is empty:
//! a record is never too big to pass. The bytes of a batch are given back the moment
//! the worker takes it, or when the queue goes away with it, so a worker that ends never
//! leaves its router waiting.
//!
//! It does not batch records (the partitions' `router` does) or process them.

use crate::lock;
use crate::record::SourceRecord;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SendError, SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// A queue of at most `batches` batches and `bytes` bytes of records (see the module).
pub fn bounded(batches: usize, bytes: usize) -> (QueueSender, QueueReceiver) {
    let (sender, receiver) = std::sync::mpsc::sync_channel(batches);
    let held = Arc::new(Held { bytes: Mutex::new(0), freed: Condvar::new(), limit: bytes });
    (QueueSender { sender, held }, QueueReceiver { receiver })
}

/// The bytes of records in a queue, and the bound on them.
struct Held {
    bytes: Mutex<usize>,
    freed: Condvar,
    limit: usize,
}

impl Held {
    /// Whether `bytes` more fit: always into an empty queue.
    fn fits(&self, held: usize, bytes: usize) -> bool {
        held == 0 || held.saturating_add(bytes) <= self.limit
    }
}

/// A batch in a queue; its bytes are given back when it leaves the queue.
struct Queued {
    records: Vec<SourceRecord>,
    bytes: usize,
    held: Arc<Held>,
}

impl Queued {
    fn take(mut self) -> Vec<SourceRecord> {
        std::mem::take(&mut self.records)
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        *lock(&self.held.bytes) -= self.bytes;
        self.held.freed.notify_all();
    }
}

/// The router's end of a partition's queue.
pub struct QueueSender {
    sender: SyncSender<Queued>,
    held: Arc<Held>,
}

impl QueueSender {
    /// Queues `batch` if there is room for it now, else gives it back; a queue whose
    /// worker ended takes it and drops it.
    pub fn try_send(&self, batch: Vec<SourceRecord>) -> Result<(), TrySendError<Vec<SourceRecord>>> {
        let bytes = batch.iter().map(SourceRecord::bytes).sum();
        {
            let mut held = lock(&self.held.bytes);
            if !self.held.fits(*held, bytes) {
                return Err(TrySendError::Full(batch));
            }
            *held += bytes;
        }
        self.sender.try_send(Queued { records: batch, bytes, held: self.held.clone() }).map_err(|e| match e {
            TrySendError::Full(queued) => TrySendError::Full(queued.take()),
            TrySendError::Disconnected(queued) => TrySendError::Disconnected(queued.take()),
        })
    }

    /// Queues `batch`, waiting for room; fails (dropping it) once the worker has ended.
    pub fn send(&self, batch: Vec<SourceRecord>) -> Result<(), SendError<Vec<SourceRecord>>> {
        let bytes = batch.iter().map(SourceRecord::bytes).sum();
        {
            let mut held = lock(&self.held.bytes);
            while !self.held.fits(*held, bytes) {
                held = self.held.freed.wait(held).unwrap_or_else(|e| e.into_inner());
            }
            *held += bytes;
        }
        self.sender.send(Queued { records: batch, bytes, held: self.held.clone() }).map_err(|e| SendError(e.0.take()))
    }
}

/// The worker's end of a partition's queue.
pub struct QueueReceiver {
    receiver: Receiver<Queued>,
}

impl QueueReceiver {
    /// The next batch, waiting at most `timeout` for one.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Vec<SourceRecord>, RecvTimeoutError> {
        self.receiver.recv_timeout(timeout).map(Queued::take)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(records: usize, bytes: usize) -> Vec<SourceRecord> {
        let record = SourceRecord {
            partition: 0,
            offset: 0,
            key: Vec::new(),
            value: vec![0; bytes],
            timestamp_ms: 0,
            headers: Vec::new(),
        };
        vec![record; records]
    }

    #[test]
    fn a_queue_takes_batches_while_their_bytes_fit_and_any_batch_when_empty() {
        let (sender, receiver) = bounded(8, 100);
        assert!(sender.try_send(batch(1, 60)).is_ok());
        assert!(matches!(sender.try_send(batch(1, 60)), Err(TrySendError::Full(b)) if b.len() == 1));
        assert!(sender.try_send(batch(2, 20)).is_ok(), "60 + 40 bytes fit in 100");
        receiver.recv_timeout(Duration::ZERO).unwrap();
        receiver.recv_timeout(Duration::ZERO).unwrap();
        assert!(sender.try_send(batch(1, 1_000)).is_ok(), "an empty queue takes a batch past the bound");
    }

    #[test]
    fn a_sender_waiting_for_room_is_released_when_the_worker_goes_away() {
        let (sender, receiver) = bounded(8, 100);
        sender.send(batch(1, 100)).unwrap();
        let waiting = std::thread::spawn(move || sender.send(batch(1, 100)).is_err());
        std::thread::sleep(Duration::from_millis(50));
        drop(receiver);
        assert!(waiting.join().unwrap(), "the send fails once no worker takes it");
    }
}
