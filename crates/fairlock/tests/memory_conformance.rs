//! The conformance suite on the in-memory backend: directly, and through a wrapper that only
//! forwards (so `Arc<dyn LockBackend>` dispatch and wrappers stay honest).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use fairlock::backend::{
    AcquireOutcome, AcquireRequest, AttemptId, LockBackend, LockState, LockSummary, ReleaseOutcome,
    Watch,
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
