//! What the core asks the store, call by call, on paused time: a short hold after a hand-over
//! needs no confirmation, a longer one is confirmed, and a handle that had to wait a moment
//! ago queues in one call instead of first asking without queueing.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use fairlock::backend::{
    AcquireOutcome, AcquireRequest, AttemptId, LockBackend, LockState, LockSummary, ReleaseOutcome,
    Watch,
};
use fairlock::{LockClient, LockName, MemoryBackend, Owner, Result};

/// `MemoryBackend` that records every `acquire` as (owner, queue).
#[derive(Debug, Clone, Default)]
struct Counting {
    inner: MemoryBackend,
    acquires: Arc<Mutex<Vec<(Owner, bool)>>>,
}

impl Counting {
    /// `acquire` calls of `owner` so far, as (calls that did not queue, calls that did).
    fn acquires_of(&self, owner: &Owner) -> (usize, usize) {
        let calls = self.acquires.lock().unwrap();
        let of = |queue: bool| {
            calls
                .iter()
                .filter(|c| c.0 == *owner && c.1 == queue)
                .count()
        };
        (of(false), of(true))
    }
}

#[async_trait]
impl LockBackend for Counting {
    async fn acquire(&self, request: &AcquireRequest) -> Result<AcquireOutcome> {
        self.acquires
            .lock()
            .unwrap()
            .push((request.owner.clone(), request.queue));
        self.inner.acquire(request).await
    }

    async fn release(
        &self,
        name: &LockName,
        owner: &Owner,
        token: u64,
        attempt: AttemptId,
    ) -> Result<ReleaseOutcome> {
        self.inner.release(name, owner, token, attempt).await
    }

    async fn extend(
        &self,
        name: &LockName,
        owner: &Owner,
        token: u64,
        lease: Duration,
    ) -> Result<bool> {
        self.inner.extend(name, owner, token, lease).await
    }

    async fn abandon(&self, name: &LockName, owner: &Owner, attempt: AttemptId) -> Result<()> {
        self.inner.abandon(name, owner, attempt).await
    }

    async fn force_release(&self, name: &LockName, token: u64) -> Result<bool> {
        self.inner.force_release(name, token).await
    }

    async fn inspect(&self, name: &LockName) -> Result<LockState> {
        self.inner.inspect(name).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockSummary>> {
        self.inner.list(prefix).await
    }

    async fn watch(&self, name: &LockName, owner: &Owner) -> Result<Watch> {
        self.inner.watch(name, owner).await
    }
}

/// `waiter` waits for the lock `holder` holds and gets it by hand-over; returns its guard.
async fn hand_over(
    holder: &fairlock::FairLock,
    waiter: &Arc<fairlock::FairLock>,
) -> fairlock::LockGuard {
    let held = holder.lock().await.unwrap();
    let waiting = {
        let waiter = waiter.clone();
        tokio::spawn(async move { waiter.lock().await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    held.unlock().await.unwrap();
    waiting.await.unwrap().unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_short_hold_after_a_hand_over_sends_no_confirmation() {
    let backend = Counting::default();
    let client = LockClient::new(backend.clone());
    let holder = client.fair_lock("short").unwrap();
    let waiter = Arc::new(client.fair_lock("short").unwrap());

    let guard = hand_over(&holder, &waiter).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    guard.unlock().await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The confirmation would be a call that does not queue, after the first one.
    assert_eq!(
        backend.acquires_of(waiter.owner()).0,
        1,
        "a hold released within the confirmation delay needs no confirmation"
    );
    let state = client.state("short").await.unwrap();
    assert!(state.holder.is_none(), "released: {state:?}");
}

#[tokio::test(start_paused = true)]
async fn a_longer_hold_after_a_hand_over_is_confirmed() {
    let backend = Counting::default();
    let client = LockClient::new(backend.clone());
    let holder = client.fair_lock("long").unwrap();
    let waiter = Arc::new(client.fair_lock("long").unwrap());

    let guard = hand_over(&holder, &waiter).await;
    let state = client.state("long").await.unwrap();
    assert!(
        state.holder.as_ref().is_some_and(|h| !h.confirmed),
        "a hand-over starts unconfirmed: {state:?}"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let state = client.state("long").await.unwrap();
    assert!(
        state.holder.as_ref().is_some_and(|h| h.confirmed),
        "confirmed after the delay (at most 100 ms): {state:?}"
    );
    assert!(!guard.is_lease_lost());
    guard.unlock().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_handle_that_just_waited_queues_in_one_call() {
    let backend = Counting::default();
    let client = LockClient::new(backend.clone());
    let holder = client.fair_lock("again").unwrap();
    let waiter = Arc::new(client.fair_lock("again").unwrap());

    let guard = hand_over(&holder, &waiter).await;
    guard.unlock().await.unwrap();

    // Contended again at once: no call that does not queue, and the lock still comes in turn.
    let (tries, queued) = backend.acquires_of(waiter.owner());
    let guard = hand_over(&holder, &waiter).await;
    let (tries_after, queued_after) = backend.acquires_of(waiter.owner());
    assert_eq!(tries_after, tries, "no call that does not queue");
    assert!(queued_after > queued, "it queued");
    guard.unlock().await.unwrap();

    // Free and long after the last wait: one call that does not queue, as on a fresh handle.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let guard = waiter.lock().await.unwrap();
    assert_eq!(
        backend.acquires_of(waiter.owner()),
        (tries_after + 1, queued_after),
        "an uncontended lock() is one call that does not queue"
    );
    guard.unlock().await.unwrap();

    // Free but right after a wait: the queueing call grants it at once.
    let guard = hand_over(&holder, &waiter).await;
    guard.unlock().await.unwrap();
    let (tries, queued) = backend.acquires_of(waiter.owner());
    let guard = waiter.lock().await.unwrap();
    assert_eq!(guard.hold_count(), 1);
    assert_eq!(backend.acquires_of(waiter.owner()), (tries, queued + 1));
    guard.unlock().await.unwrap();
}
