//! How many connections the admin API keeps open ([`Connections`]): a stranger's closes
//! after its first answer, at most [`MAX_CONNECTIONS`] of them are open at once (a new
//! one closes the oldest), and at most [`MAX_TRUSTED_CONNECTIONS`] that presented the
//! token stay open for more requests.

use super::{MAX_CONNECTIONS, MAX_TRUSTED_CONNECTIONS};
use crate::lock;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::task::{AbortHandle, JoinHandle};

/// The API's open connections: how many presented the token, and the others, oldest
/// first, each with the handle that closes it.
#[derive(Default)]
pub(super) struct Connections {
    strangers: VecDeque<(u64, AbortHandle)>,
    trusted: usize,
    opened: u64,
}

impl Connections {
    /// Gives a new connection its [`Slot`] and has `serve` start serving it, closing the
    /// oldest connection without the token first if [`MAX_CONNECTIONS`] are open; whether
    /// it closed one.
    pub(super) fn admit(this: &Arc<Mutex<Self>>, serve: impl FnOnce(Arc<Slot>) -> JoinHandle<()>) -> bool {
        let mut open = lock(this);
        let oldest = if open.strangers.len() >= MAX_CONNECTIONS { open.strangers.pop_front() } else { None };
        open.opened += 1;
        let id = open.opened;
        // Started under the lock, so its slot is listed before the task can give it up.
        let task = serve(Arc::new(Slot { id, trusted: AtomicBool::new(false), connections: this.clone() }));
        open.strangers.push_back((id, task.abort_handle()));
        drop(open);
        // Outside the lock, which the closed connection's slot takes as it is given up.
        oldest.map(|(_, task)| task.abort()).is_some()
    }
}

/// One connection's place among the [`Connections`], given up when its task ends or is
/// aborted (the task owns it).
pub(super) struct Slot {
    id: u64,
    trusted: AtomicBool,
    connections: Arc<Mutex<Connections>>,
}

impl Slot {
    /// Moves the connection, which presented the token, among the trusted ones, if fewer
    /// than [`MAX_TRUSTED_CONNECTIONS`] are; whether it is one now (it may stay open).
    pub(super) fn trust(&self) -> bool {
        if self.trusted.load(Ordering::Acquire) {
            return true;
        }
        let mut open = lock(&self.connections);
        // Not listed any more: closed for a newer connection, on its way out.
        let Some(at) = open.strangers.iter().position(|(id, _)| *id == self.id) else { return false };
        if open.trusted >= MAX_TRUSTED_CONNECTIONS {
            return false;
        }
        open.strangers.remove(at);
        open.trusted += 1;
        self.trusted.store(true, Ordering::Release);
        true
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = lock(&self.connections);
        if *self.trusted.get_mut() {
            open.trusted -= 1;
        } else {
            open.strangers.retain(|(id, _)| *id != self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection's task that never ends on its own, handing its slot out.
    fn open(connections: &Arc<Mutex<Connections>>, slots: &mut Vec<Arc<Slot>>) -> bool {
        Connections::admit(connections, |slot| {
            slots.push(slot.clone());
            tokio::spawn(async move {
                let _slot = slot;
                std::future::pending::<()>().await
            })
        })
    }

    /// Strangers beyond [`MAX_CONNECTIONS`] close the oldest stranger; a connection that
    /// presented the token leaves the strangers, up to [`MAX_TRUSTED_CONNECTIONS`], and
    /// frees its place when it ends.
    #[tokio::test]
    async fn strangers_make_way_and_the_trusted_are_bounded() {
        let connections = Arc::new(Mutex::new(Connections::default()));
        let mut slots = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            assert!(!open(&connections, &mut slots), "room for {MAX_CONNECTIONS}");
        }
        assert!(open(&connections, &mut slots), "one more closes the oldest");
        tokio::task::yield_now().await;
        assert!(!slots[0].trust(), "a closed connection is trusted no more");
        assert_eq!(lock(&connections).strangers.len(), MAX_CONNECTIONS);

        for slot in &slots[1..=MAX_TRUSTED_CONNECTIONS] {
            assert!(slot.trust());
        }
        assert!(slots[1].trust(), "trusted once, trusted still");
        assert!(!open(&connections, &mut slots), "the trusted leave room for strangers");
        assert!(!slots[MAX_TRUSTED_CONNECTIONS + 1].trust(), "at most {MAX_TRUSTED_CONNECTIONS} trusted");
        assert_eq!(lock(&connections).trusted, MAX_TRUSTED_CONNECTIONS);
        let strangers = lock(&connections).strangers.len();
        assert_eq!(strangers, 1, "the trusted left the strangers");
    }
}
