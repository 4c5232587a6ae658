//! Invalid input is refused before it reaches the store.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::support::{self, OrFail};
use crate::backend::{
    AcquireOutcome, AcquireRequest, AttemptId, Capabilities, HolderState, LockBackend, LockState,
    LockSummary, ReleaseOutcome, Watch,
};
use crate::error::{Error, Result};
use crate::name::{LockName, Owner};
use crate::options::{LockOptions, MAX_DURATION};

/// Empty and 1 MiB lock names, `list` prefixes no name can have (a NUL, 1 MiB), zero and huge leases (`Duration::MAX`, just over
/// [`MAX_DURATION`]), a zero waiter TTL, a `Duration::MAX` wait and out-of-range `extend`s
/// all fail with [`Error::InvalidArgument`], and not one call reaches the backend for them
/// (counted through a wrapper): a free lock stays free, a held lock keeps its holder, token,
/// hold count and lease signal.
pub async fn invalid_input_is_rejected(backend: Arc<dyn LockBackend>) {
    const CHECK: &str = "invalid_input_is_rejected";
    let counted = Arc::new(CountCalls {
        inner: backend.clone(),
        calls: AtomicUsize::new(0),
    });
    let dyn_counted: Arc<dyn LockBackend> = counted.clone();
    let client = support::client(&dyn_counted);
    let name = support::lock_name(CHECK);
    let huge_name = "x".repeat(1 << 20);

    let expect_invalid = |what: &str, outcome: Result<()>| {
        assert!(
            matches!(outcome, Err(Error::InvalidArgument { .. })),
            "{CHECK}: {what}: expected InvalidArgument, got {outcome:?}"
        );
    };
    let before = counted.calls();
    for bad in ["", huge_name.as_str()] {
        let shown = &bad[..bad.len().min(8)];
        expect_invalid(
            &format!("fair_lock({shown:?}...)"),
            client.fair_lock(bad).map(drop),
        );
        expect_invalid(
            &format!("state({shown:?}...)"),
            client.state(bad).await.map(drop),
        );
        expect_invalid(
            &format!("force_unlock({shown:?}...)"),
            client.force_unlock(bad).await.map(drop),
        );
        expect_invalid(
            &format!("fair_lock_as({shown:?}...)"),
            client.fair_lock_as(bad, Owner::unique()).map(drop),
        );
    }
    // No name could start with these: a prefix with a NUL, or longer than a name may be.
    for bad in ["a\0b", huge_name.as_str()] {
        let shown = &bad[..bad.len().min(8)];
        expect_invalid(
            &format!("list({shown:?}...)"),
            client.list(bad).await.map(drop),
        );
    }
    let lock = || client.fair_lock(&name).or_fail(CHECK);
    for lease in [
        Duration::ZERO,
        Duration::from_micros(999),
        Duration::MAX,
        MAX_DURATION + Duration::from_secs(1),
    ] {
        expect_invalid(
            &format!("with_lease({lease:?})"),
            lock().with_lease(lease).map(drop),
        );
    }
    for options in [
        LockOptions {
            waiter_ttl: Duration::ZERO,
            ..support::options()
        },
        LockOptions {
            watchdog_lease: Duration::ZERO,
            ..support::options()
        },
        LockOptions {
            watchdog_lease: Duration::MAX,
            ..support::options()
        },
    ] {
        expect_invalid(
            &format!("with_options({options:?})"),
            lock().with_options(options.clone()).map(drop),
        );
        expect_invalid(
            &format!("LockClient::with_options({options:?})"),
            crate::LockClient::from_arc(dyn_counted.clone())
                .with_options(options)
                .map(drop),
        );
    }
    for wait in [Duration::MAX, MAX_DURATION + Duration::from_secs(1)] {
        expect_invalid(
            &format!("try_lock_for({wait:?}) on a free lock"),
            lock().try_lock_for(wait).await.map(drop),
        );
    }
    assert_eq!(
        counted.calls(),
        before,
        "{CHECK}: invalid calls must not reach the backend"
    );
    let state = client.state(&name).await.or_fail(CHECK);
    assert!(
        state.holder.is_none() && state.waiters.is_empty(),
        "{CHECK}: the free lock was touched: {state:?}"
    );

    // A fixed lease: no watchdog renewal runs, so every backend call is counted as ours.
    let fixed = support::fixed_lease_client(&dyn_counted, Duration::from_secs(5));
    let held = fixed
        .fair_lock(&name)
        .or_fail(CHECK)
        .lock()
        .await
        .or_fail(CHECK);
    let before_state = client.state(&name).await.or_fail(CHECK);
    let before = counted.calls();
    for lease in [
        Duration::ZERO,
        Duration::MAX,
        MAX_DURATION + Duration::from_secs(1),
    ] {
        expect_invalid(&format!("extend({lease:?})"), held.extend(lease).await);
    }
    expect_invalid(
        "try_lock_for(Duration::MAX) on a held lock",
        lock().try_lock_for(Duration::MAX).await.map(drop),
    );
    assert_eq!(
        counted.calls(),
        before,
        "{CHECK}: invalid calls on a held lock must not reach the backend"
    );
    let state = client.state(&name).await.or_fail(CHECK);
    let same = |s: &LockState| {
        s.holder
            .as_ref()
            .map(|h| (h.owner.clone(), h.token, h.hold_count))
    };
    assert_eq!(
        same(&state),
        same(&before_state),
        "{CHECK}: the holder changed"
    );
    assert!(
        state.waiters.is_empty(),
        "{CHECK}: a refused wait joined the queue: {state:?}"
    );
    assert!(
        !held.is_lease_lost(),
        "{CHECK}: a refused extend must not end the lease"
    );
    held.unlock().await.or_fail(CHECK);
    support::wait_clean(&client, &name, format!("{CHECK}: lock free at the end")).await;
}

/// Forwards every call and counts them.
#[derive(Debug)]
struct CountCalls {
    inner: Arc<dyn LockBackend>,
    calls: AtomicUsize,
}

impl CountCalls {
    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn count(&self) {
        self.calls.fetch_add(1, Ordering::SeqCst);
    }
}

#[async_trait]
impl LockBackend for CountCalls {
    async fn acquire(&self, request: &AcquireRequest) -> Result<AcquireOutcome> {
        self.count();
        self.inner.acquire(request).await
    }

    async fn release(
        &self,
        name: &LockName,
        owner: &Owner,
        token: u64,
        attempt: AttemptId,
    ) -> Result<ReleaseOutcome> {
        self.count();
        self.inner.release(name, owner, token, attempt).await
    }

    async fn extend(
        &self,
        name: &LockName,
        owner: &Owner,
        token: u64,
        lease: Duration,
    ) -> Result<bool> {
        self.count();
        self.inner.extend(name, owner, token, lease).await
    }

    async fn abandon(&self, name: &LockName, owner: &Owner, attempt: AttemptId) -> Result<()> {
        self.count();
        self.inner.abandon(name, owner, attempt).await
    }

    async fn force_release(&self, name: &LockName, token: u64) -> Result<bool> {
        self.count();
        self.inner.force_release(name, token).await
    }

    async fn inspect(&self, name: &LockName) -> Result<LockState> {
        self.count();
        self.inner.inspect(name).await
    }

    async fn holder(&self, name: &LockName) -> Result<Option<HolderState>> {
        self.count();
        self.inner.holder(name).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockSummary>> {
        self.count();
        self.inner.list(prefix).await
    }

    async fn watch(&self, name: &LockName, owner: &Owner) -> Result<Watch> {
        self.count();
        self.inner.watch(name, owner).await
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }
}
