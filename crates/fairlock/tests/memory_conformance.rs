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

/// The core never sends a duration past `MAX_DURATION`, but the backend is public: called
/// directly with one, it answers `InvalidArgument` and changes nothing (no panic half-way
/// through, with the head waiter already taken off the queue).
#[tokio::test(start_paused = true)]
async fn durations_past_the_limit_are_refused_and_change_nothing() {
    use fairlock::backend::{AcquireOutcome, AcquireRequest, AttemptId};
    use fairlock::{Error, MAX_DURATION};
    let memory = MemoryBackend::new();
    let name = LockName::new("too-long").unwrap();
    let (holder, waiter) = (Owner::unique(), Owner::unique());
    let request = |owner: &Owner, attempt, lease| AcquireRequest {
        name: name.clone(),
        owner: owner.clone(),
        attempt,
        lease,
        waiter_ttl: Duration::from_secs(30),
        queue: true,
    };
    let second = Duration::from_secs(1);
    let first = AttemptId::random();
    let Ok(AcquireOutcome::Granted(grant)) = memory.acquire(&request(&holder, first, second)).await
    else {
        panic!("a fresh lock is granted");
    };
    let waiting = AttemptId::random();
    let queued = memory.acquire(&request(&waiter, waiting, second)).await;
    assert!(
        matches!(queued, Ok(AcquireOutcome::Queued { .. })),
        "{queued:?}"
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // The lease ran out: the head waiter's next acquire would be granted, with this lease.
    let refused = memory
        .acquire(&request(&waiter, waiting, Duration::MAX))
        .await;
    assert!(
        matches!(refused, Err(Error::InvalidArgument { .. })),
        "{refused:?}"
    );
    let extended = memory
        .extend(&name, &holder, grant.token, MAX_DURATION + second)
        .await;
    assert!(
        matches!(extended, Err(Error::InvalidArgument { .. })),
        "{extended:?}"
    );
    let state = memory.inspect(&name).await.unwrap();
    assert_eq!(
        state.waiters.len(),
        1,
        "the waiter lost its place: {state:?}"
    );
    let granted = memory.acquire(&request(&waiter, waiting, second)).await;
    assert!(
        matches!(granted, Ok(AcquireOutcome::Granted(_))),
        "{granted:?}"
    );
}

/// When dead waiters in front of a free lock are cleared, the new head is told to look again
/// (the contract's SHOULD), not left to find the lock free at its next heartbeat.
#[tokio::test(start_paused = true)]
async fn clearing_a_dead_head_of_a_free_lock_tells_the_new_head() {
    use fairlock::backend::{AcquireOutcome, AcquireRequest, AttemptId, Wake};
    let memory = MemoryBackend::new();
    let name = LockName::new("dead-head").unwrap();
    let request = |owner: &Owner, attempt, lease: u64, ttl: u64| AcquireRequest {
        name: name.clone(),
        owner: owner.clone(),
        attempt,
        lease: Duration::from_secs(lease),
        waiter_ttl: Duration::from_secs(ttl),
        queue: true,
    };
    let (holder, dead, next, last) = (
        Owner::unique(),
        Owner::unique(),
        Owner::unique(),
        Owner::unique(),
    );
    let granted = memory
        .acquire(&request(&holder, AttemptId::random(), 2, 30))
        .await;
    assert!(
        matches!(granted, Ok(AcquireOutcome::Granted(_))),
        "{granted:?}"
    );
    let mut attempts = Vec::new();
    for (owner, ttl) in [(&dead, 3), (&next, 30), (&last, 30)] {
        let attempt = AttemptId::random();
        let queued = memory.acquire(&request(owner, attempt, 30, ttl)).await;
        assert!(
            matches!(queued, Ok(AcquireOutcome::Queued { .. })),
            "{queued:?}"
        );
        attempts.push(attempt);
    }
    let mut watch = memory.watch(&name, &next).await.unwrap();
    // The lease has run out and the dead head's TTL too: the last waiter's heartbeat clears it.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let heartbeat = memory.acquire(&request(&last, attempts[2], 30, 30)).await;
    assert!(
        matches!(heartbeat, Ok(AcquireOutcome::Queued { .. })),
        "{heartbeat:?}"
    );
    let told = tokio::time::timeout(Duration::from_millis(10), watch.recv()).await;
    assert_eq!(told, Ok(Some(Wake::Recheck)), "the new head was not told");
}
