//! The queue behind a [`Watch`](crate::backend::Watch): wake-ups from a backend's dispatcher
//! to one waiting call, in order, none lost.
//!
//! Every waiting call has one, so it is kept small: one allocation of about 100 bytes, and a
//! buffer only once a wake-up arrives. Tokio's unbounded `mpsc` channel, used before, allocates
//! a block of 32 slots and a cache-padded header up front, about 2 KB per waiter for a queue
//! that seldom holds more than one wake-up.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Poll, Waker};

use crate::backend::Wake;

#[derive(Debug)]
struct State {
    queue: VecDeque<Wake>,
    /// The receiver's task, while it waits in `recv`.
    waker: Option<Waker>,
    /// Live senders: `recv` ends (`None`) once the queue is empty and none is left.
    senders: usize,
    receiver_dropped: bool,
}

type Shared = Arc<Mutex<State>>;

fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    // Every operation leaves the state consistent, so a panic elsewhere cannot corrupt it.
    shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A new queue: its sending and receiving ends.
pub(crate) fn queue() -> (Sender, Receiver) {
    let shared = Arc::new(Mutex::new(State {
        queue: VecDeque::new(),
        waker: None,
        senders: 1,
        receiver_dropped: false,
    }));
    (Sender(shared.clone()), Receiver(shared))
}

/// The sending end; cloning it adds a sender.
#[derive(Debug)]
pub(crate) struct Sender(Shared);

impl Sender {
    /// Queues `wake`; `false` if the receiver is gone.
    pub(crate) fn send(&self, wake: Wake) -> bool {
        let waker = {
            let mut state = lock(&self.0);
            if state.receiver_dropped {
                return false;
            }
            state.queue.push_back(wake);
            state.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
        true
    }

    /// Whether the receiver is gone.
    pub(crate) fn is_closed(&self) -> bool {
        lock(&self.0).receiver_dropped
    }
}

impl Clone for Sender {
    fn clone(&self) -> Self {
        lock(&self.0).senders += 1;
        Sender(self.0.clone())
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        let waker = {
            let mut state = lock(&self.0);
            state.senders -= 1;
            // The last sender wakes the receiver, so that `recv` can end.
            if state.senders == 0 {
                state.waker.take()
            } else {
                None
            }
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

/// The receiving end.
#[derive(Debug)]
pub(crate) struct Receiver(Shared);

impl Receiver {
    /// The next wake-up, or `None` once every sender is gone and the queue is empty.
    /// Cancel safe: a wake-up is only taken off the queue when it is returned.
    pub(crate) async fn recv(&mut self) -> Option<Wake> {
        poll_fn(|cx| {
            let mut state = lock(&self.0);
            if let Some(wake) = state.queue.pop_front() {
                return Poll::Ready(Some(wake));
            }
            if state.senders == 0 {
                return Poll::Ready(None);
            }
            match &mut state.waker {
                Some(waker) if waker.will_wake(cx.waker()) => {}
                slot => *slot = Some(cx.waker().clone()),
            }
            Poll::Pending
        })
        .await
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let mut state = lock(&self.0);
        state.receiver_dropped = true;
        // Senders may outlive the receiver for a while (until the dispatcher prunes them):
        // free what is queued now.
        state.queue = VecDeque::new();
        state.waker = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Grant;

    fn granted(token: u64) -> Wake {
        Wake::Granted {
            attempt: crate::backend::AttemptId::from_u128(u128::from(token)),
            grant: Grant {
                token,
                hold_count: 1,
            },
        }
    }

    #[tokio::test]
    async fn delivers_in_order_then_ends_when_every_sender_is_gone() {
        let (sender, mut receiver) = queue();
        let second = sender.clone();
        assert!(sender.send(granted(1)));
        assert!(second.send(Wake::Recheck));
        assert!(sender.send(granted(2)));
        drop(sender);
        assert_eq!(receiver.recv().await, Some(granted(1)));
        assert_eq!(receiver.recv().await, Some(Wake::Recheck));
        assert_eq!(receiver.recv().await, Some(granted(2)));
        let waiting = tokio::spawn(async move { receiver.recv().await });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "a sender is left");
        drop(second);
        assert_eq!(waiting.await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_waiting_receiver_is_woken() {
        let (sender, mut receiver) = queue();
        let waiting = tokio::spawn(async move { receiver.recv().await });
        tokio::task::yield_now().await;
        assert!(sender.send(Wake::Recheck));
        assert_eq!(waiting.await.unwrap(), Some(Wake::Recheck));
    }

    #[tokio::test]
    async fn a_cancelled_recv_loses_nothing() {
        let (sender, mut receiver) = queue();
        let cancelled =
            tokio::time::timeout(std::time::Duration::from_millis(5), receiver.recv()).await;
        assert!(cancelled.is_err());
        assert!(sender.send(granted(3)));
        assert_eq!(receiver.recv().await, Some(granted(3)));
    }

    #[test]
    fn senders_see_the_receiver_go() {
        let (sender, receiver) = queue();
        assert!(!sender.is_closed());
        drop(receiver);
        assert!(sender.is_closed());
        assert!(!sender.send(Wake::Recheck));
    }
}
