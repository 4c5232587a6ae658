//! The conformance suite on the in-memory backend: directly, and through a wrapper that only
//! forwards (so `Arc<dyn LockBackend>` dispatch and wrappers stay honest).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use fairlock::backend::{
    AcquireOutcome, AcquireRequest, AttemptId, Capabilities, LockBackend, LockState, LockSummary,
    ReleaseOutcome, Watch,
};
use fairlock::{LockName, MemoryBackend, Owner, Result};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_backend_conforms() {
    let memory = MemoryBackend::new();
    let store = memory.clone();
    fairlock::conformance::run_all(move || {
        let handle = store.clone();
        async move { Arc::new(handle) as Arc<dyn LockBackend> }
    })
    .await;
    assert_eq!(memory.lock_count(), 0, "the suite left locks behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_backend_conforms_through_a_forwarding_wrapper() {
    let memory = MemoryBackend::new();
    let store = memory.clone();
    fairlock::conformance::run_all(move || {
        let handle = Forward(Arc::new(store.clone()));
        async move { Arc::new(handle) as Arc<dyn LockBackend> }
    })
    .await;
    assert_eq!(memory.lock_count(), 0, "the suite left locks behind");
}

/// The check that waits out the resend horizon, on Tokio's paused clock.
#[tokio::test(start_paused = true)]
async fn a_lapsed_hand_over_stays_spent_for_the_horizon() {
    let memory = MemoryBackend::new();
    fairlock::conformance::lapsed_hand_over_stays_spent(Arc::new(memory.clone())).await;
    assert_eq!(memory.lock_count(), 0, "the check left its lock behind");
}

/// A store whose clock steps by whole `step`s: every lease and TTL is rounded up to a multiple
/// of it, and it says so in its capabilities. The suite must pass it by widening only the
/// margins that depend on the clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coarse_clock_that_is_declared_conforms() {
    let memory = MemoryBackend::new();
    let store = memory.clone();
    fairlock::conformance::run_all(move || {
        let handle = Coarse {
            inner: Arc::new(store.clone()),
            step: Duration::from_millis(250),
        };
        async move { Arc::new(handle) as Arc<dyn LockBackend> }
    })
    .await;
    assert_eq!(memory.lock_count(), 0, "the suite left locks behind");
}

/// Rounds every duration it is given up to a multiple of `step`.
#[derive(Debug)]
struct Coarse {
    inner: Arc<dyn LockBackend>,
    step: Duration,
}

impl Coarse {
    fn round_up(&self, duration: Duration) -> Duration {
        let steps = duration.as_nanos().div_ceil(self.step.as_nanos());
        self.step * u32::try_from(steps).unwrap_or(u32::MAX)
    }
}

#[async_trait]
impl LockBackend for Coarse {
    async fn acquire(&self, request: &AcquireRequest) -> Result<AcquireOutcome> {
        let mut coarse = request.clone();
        coarse.lease = self.round_up(request.lease);
        coarse.waiter_ttl = self.round_up(request.waiter_ttl);
        self.inner.acquire(&coarse).await
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
        self.inner
            .extend(name, owner, token, self.round_up(lease))
            .await
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

    fn capabilities(&self) -> Capabilities {
        Capabilities::with_clock_granularity(self.step)
    }
}

/// Forwards every call to the backend it wraps.
#[derive(Debug)]
struct Forward(Arc<dyn LockBackend>);

#[async_trait]
impl LockBackend for Forward {
    async fn acquire(&self, request: &AcquireRequest) -> Result<AcquireOutcome> {
        self.0.acquire(request).await
    }

    async fn release(
        &self,
        name: &LockName,
        owner: &Owner,
        token: u64,
        attempt: AttemptId,
    ) -> Result<ReleaseOutcome> {
        self.0.release(name, owner, token, attempt).await
    }

    async fn extend(
        &self,
        name: &LockName,
        owner: &Owner,
        token: u64,
        lease: Duration,
    ) -> Result<bool> {
        self.0.extend(name, owner, token, lease).await
    }

    async fn abandon(&self, name: &LockName, owner: &Owner, attempt: AttemptId) -> Result<()> {
        self.0.abandon(name, owner, attempt).await
    }

    async fn force_release(&self, name: &LockName, token: u64) -> Result<bool> {
        self.0.force_release(name, token).await
    }

    async fn inspect(&self, name: &LockName) -> Result<LockState> {
        self.0.inspect(name).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockSummary>> {
        self.0.list(prefix).await
    }

    async fn watch(&self, name: &LockName, owner: &Owner) -> Result<Watch> {
        self.0.watch(name, owner).await
    }
}
