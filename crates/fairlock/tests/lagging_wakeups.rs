//! Wake-ups that arrive late. A networked backend dispatches a pub/sub message to whichever
//! watches of that (lock, owner) are registered when the message *arrives*, so a late
//! `Wake::Granted` for a hand-over the owner already took (and released) can reach the same
//! owner's next wait. The core must not take it for a new grant.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use fairlock::backend::{
    AcquireOutcome, AcquireRequest, AttemptId, LockBackend, LockState, LockSummary, ReleaseOutcome,
    WakeSender, Watch,
};
use fairlock::{LockClient, LockName, LockOptions, MemoryBackend, Owner, Result};
use tokio::time::{sleep, timeout};

/// The watches registered per (lock, owner), as a pub/sub dispatcher keeps them.
type Registry = Arc<Mutex<HashMap<(LockName, Owner), Vec<WakeSender>>>>;

/// Delivers every wake-up `delay` late, to the watches registered at delivery time.
#[derive(Debug)]
struct LaggingWakeups {
    inner: MemoryBackend,
    delay: Duration,
    watches: Registry,
}

#[async_trait]
impl LockBackend for LaggingWakeups {
    async fn acquire(&self, request: &AcquireRequest) -> Result<AcquireOutcome> {
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
        let key = (name.clone(), owner.clone());
        let (sender, watch) = Watch::channel();
        let first = {
            let mut watches = self.watches.lock().unwrap();
            let senders = watches.entry(key.clone()).or_default();
            senders.push(sender);
            senders.len() == 1
        };
        if first {
            // One "subscription" per (lock, owner), dispatching late to the watches of then.
            let mut subscription = self.inner.watch(name, owner).await?;
            let (watches, delay) = (self.watches.clone(), self.delay);
            tokio::spawn(async move {
                while let Some(wake) = subscription.recv().await {
                    sleep(delay).await;
                    if let Some(senders) = watches.lock().unwrap().get_mut(&key) {
                        senders.retain(|s| s.send(wake));
                    }
                }
            });
        }
        Ok(watch)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_grant_wake_up_is_not_taken_for_a_new_grant() {
    let memory = MemoryBackend::new();
    let backend = LaggingWakeups {
        inner: memory.clone(),
        delay: Duration::from_millis(400),
        watches: Arc::default(),
    };
    let client = LockClient::new(backend)
        .with_options(
            LockOptions::default()
                .with_watchdog_lease(Duration::from_secs(5))
                // Heartbeats every 100 ms: they find hand-overs long before the late wake-ups.
                .with_waiter_ttl(Duration::from_millis(300)),
        )
        .unwrap();
    let name = "late";
    let held = client.fair_lock(name).unwrap().lock().await.unwrap();
    let owner = client.fair_lock(name).unwrap();
    let first_wait = tokio::spawn(async move {
        let guard = owner.lock().await.unwrap();
        (owner, guard)
    });
    wait_for_waiters(&client, name, 1).await;
    let other = client.fair_lock(name).unwrap();
    let other_wait = tokio::spawn(async move { other.lock().await.unwrap() });
    wait_for_waiters(&client, name, 2).await;

    // The hand-over to `owner` is found by its heartbeat; its wake-up is still on the way.
    held.unlock().await.unwrap();
    let (owner, first) = timeout(Duration::from_millis(300), first_wait)
        .await
        .unwrap()
        .unwrap();
    first.unlock().await.unwrap();
    let other_guard = timeout(Duration::from_millis(300), other_wait)
        .await
        .unwrap()
        .unwrap();

    // `owner` waits again while `other` holds; the late wake-up of its first grant arrives.
    let second = timeout(Duration::from_millis(800), owner.lock()).await;
    let state = client.state(name).await.unwrap();
    assert!(
        second.is_err(),
        "owner took a late wake-up for a grant while another owner holds the lock: {second:?}, {state:?}"
    );
    other_guard.unlock().await.unwrap();
    let again = owner.lock().await.unwrap();
    again.unlock().await.unwrap();
    for _ in 0..100 {
        if memory.lock_count() == 0 {
            return;
        }
        sleep(Duration::from_millis(5)).await;
    }
    panic!("locks left behind: {}", memory.lock_count());
}

async fn wait_for_waiters(client: &LockClient, name: &str, count: usize) {
    for _ in 0..200 {
        if client.state(name).await.unwrap().waiters.len() == count {
            return;
        }
        sleep(Duration::from_millis(2)).await;
    }
    panic!("{name} never had {count} waiters");
}
