//! Lost wake-ups: [`LossyWakeups`], and the check that waiters progress without wake-ups.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::support::{self, OrFail, Waiter};
use crate::backend::{
    AcquireOutcome, AcquireRequest, AttemptId, Capabilities, HolderState, LockBackend, LockState,
    LockSummary, ReleaseOutcome, Watch,
};
use crate::error::Result;
use crate::name::{LockName, Owner};

/// A backend wrapper that loses every wake-up: it forwards every call to the backend it wraps,
/// but the [`Watch`] it returns never fires (nor closes), as if every message were lost on the
/// way. Waiters on it must make progress through their heartbeats alone.
///
/// ```
/// use std::sync::Arc;
/// use fairlock::conformance::LossyWakeups;
/// use fairlock::{LockClient, MemoryBackend};
///
/// let client = LockClient::new(LossyWakeups::new(Arc::new(MemoryBackend::new())));
/// # drop(client);
/// ```
#[derive(Debug, Clone)]
pub struct LossyWakeups {
    inner: Arc<dyn LockBackend>,
}

impl LossyWakeups {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn LockBackend>) -> Self {
        LossyWakeups { inner }
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &Arc<dyn LockBackend> {
        &self.inner
    }
}

#[async_trait]
impl LockBackend for LossyWakeups {
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

    async fn holder(&self, name: &LockName) -> Result<Option<HolderState>> {
        self.inner.holder(name).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockSummary>> {
        self.inner.list(prefix).await
    }

    async fn watch(&self, name: &LockName, owner: &Owner) -> Result<Watch> {
        // Register with the real backend (so its errors still surface), then drop every
        // wake-up it would deliver: the returned watch keeps its own, unused, sender.
        drop(self.inner.watch(name, owner).await?);
        let (sender, watch) = Watch::channel();
        Ok(watch.with_registration(sender))
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }
}

/// With every wake-up lost (through [`LossyWakeups`]), a waiter still gets the lock within
/// about one heartbeat (`waiter_ttl / 3` = 200 ms, plus 500 ms of slack) after the holder
/// releases, and after a force release. The holder uses a long fixed lease, so no
/// `retry_after` hint can stand in for the heartbeat.
pub async fn lost_wakeups_still_progress(backend: Arc<dyn LockBackend>) {
    const CHECK: &str = "lost_wakeups_still_progress";
    let lossy: Arc<dyn LockBackend> = Arc::new(LossyWakeups::new(backend.clone()));
    let lossy_client = support::client(&lossy);
    let holder_client = support::fixed_lease_client(&backend, Duration::from_secs(10));
    let bound = support::WAITER_TTL / 3 + Duration::from_millis(500);

    for force in [false, true] {
        let name = support::lock_name(CHECK);
        let held = holder_client
            .fair_lock(&name)
            .or_fail(CHECK)
            .lock()
            .await
            .or_fail(CHECK);
        let lock = lossy_client.fair_lock(&name).or_fail(CHECK);
        let mut waiter = Waiter::enqueue(CHECK, &lossy_client, lock).await;
        let released = Instant::now();
        if force {
            assert!(
                holder_client.force_unlock(&name).await.or_fail(CHECK),
                "{CHECK}: force_unlock"
            );
            drop(held);
        } else {
            held.unlock().await.or_fail(CHECK);
        }
        let how = if force { "force release" } else { "release" };
        let acquired = waiter.acquired_within(support::EVENTUALLY).await;
        let took = acquired.at - released;
        assert!(
            took <= bound,
            "{CHECK}: without wake-ups the waiter got the lock {took:?} after the {how}; its heartbeat should have found it within {bound:?}"
        );
        waiter.release().await;
        support::wait_clean(
            &holder_client,
            &name,
            format!("{CHECK}: lock free at the end"),
        )
        .await;
    }
}
