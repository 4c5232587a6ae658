//! Several instances of one store: how the suite opens them, and [`Spread`], which routes each
//! owner to its own instance, as separate processes would use the store.

use std::future::Future;
use std::hash::{Hash, Hasher};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::support::{self, OrFail};
use crate::backend::{
    AcquireOutcome, AcquireRequest, AttemptId, Capabilities, HolderState, LockBackend, LockState,
    LockSummary, ReleaseOutcome, Watch,
};
use crate::error::Result;
use crate::name::{LockName, Owner};

/// Opens a new instance of the store under test: a new client with its own connections, as
/// another process would have. Every instance must see the same locks.
///
/// Implemented for every `Fn() -> impl Future<Output = Arc<dyn LockBackend>>`, so a closure
/// does:
///
/// ```
/// use std::sync::Arc;
/// use fairlock::{LockBackend, MemoryBackend};
///
/// let store = MemoryBackend::new();
/// // Each clone is another handle on the same locks.
/// let open = move || {
///     let handle = store.clone();
///     async move { Arc::new(handle) as Arc<dyn LockBackend> }
/// };
/// # fn is_open(_: impl fairlock::conformance::OpenBackend) {}
/// # is_open(open);
/// ```
pub trait OpenBackend: Send + Sync + 'static {
    /// A new instance.
    fn open(&self) -> Pin<Box<dyn Future<Output = Arc<dyn LockBackend>> + Send + '_>>;
}

impl<F, Fut> OpenBackend for F
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Arc<dyn LockBackend>> + Send + 'static,
{
    fn open(&self) -> Pin<Box<dyn Future<Output = Arc<dyn LockBackend>> + Send + '_>> {
        Box::pin(self())
    }
}

/// A backend made of several instances of one store: every call for an owner goes to that
/// owner's instance (chosen by a hash of the owner), and reads go round the instances. So
/// waiters, holders and their wake-ups live on different instances, and a check passes only if
/// the instances share the lock state and deliver each other's wake-ups.
#[derive(Debug)]
pub struct Spread {
    instances: Vec<Arc<dyn LockBackend>>,
    next: AtomicUsize,
}

impl Spread {
    /// Spreads over `instances` (at least one).
    ///
    /// # Panics
    /// If `instances` is empty.
    pub fn new(instances: Vec<Arc<dyn LockBackend>>) -> Self {
        assert!(!instances.is_empty(), "Spread needs at least one instance");
        Spread {
            instances,
            next: AtomicUsize::new(0),
        }
    }

    fn of(&self, owner: &Owner) -> &Arc<dyn LockBackend> {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        owner.hash(&mut hasher);
        let at = (hasher.finish() % self.instances.len() as u64) as usize;
        &self.instances[at]
    }

    fn any(&self) -> &Arc<dyn LockBackend> {
        let at = self.next.fetch_add(1, Ordering::Relaxed) % self.instances.len();
        &self.instances[at]
    }
}

#[async_trait]
impl LockBackend for Spread {
    async fn acquire(&self, request: &AcquireRequest) -> Result<AcquireOutcome> {
        self.of(&request.owner).acquire(request).await
    }

    async fn release(
        &self,
        name: &LockName,
        owner: &Owner,
        token: u64,
        attempt: AttemptId,
    ) -> Result<ReleaseOutcome> {
        self.of(owner).release(name, owner, token, attempt).await
    }

    async fn extend(
        &self,
        name: &LockName,
        owner: &Owner,
        token: u64,
        lease: Duration,
    ) -> Result<bool> {
        self.of(owner).extend(name, owner, token, lease).await
    }

    async fn abandon(&self, name: &LockName, owner: &Owner, attempt: AttemptId) -> Result<()> {
        self.of(owner).abandon(name, owner, attempt).await
    }

    async fn force_release(&self, name: &LockName, token: u64) -> Result<bool> {
        self.any().force_release(name, token).await
    }

    async fn inspect(&self, name: &LockName) -> Result<LockState> {
        self.any().inspect(name).await
    }

    async fn holder(&self, name: &LockName) -> Result<Option<HolderState>> {
        self.any().holder(name).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockSummary>> {
        self.any().list(prefix).await
    }

    async fn watch(&self, name: &LockName, owner: &Owner) -> Result<Watch> {
        self.of(owner).watch(name, owner).await
    }

    fn capabilities(&self) -> Capabilities {
        self.instances[0].capabilities()
    }

    fn name(&self) -> &'static str {
        self.instances[0].name()
    }
}

/// Two instances opened separately see each other's locks: a hold made through one is seen,
/// refused and handed over through the other, and a waiter on the other is woken by the
/// release.
pub async fn instances_share_state(open: Arc<dyn OpenBackend>) {
    const CHECK: &str = "instances_share_state";
    let first = open.open().await;
    let second = open.open().await;
    let one = support::client(&first);
    let two = support::client(&second);
    let name = support::lock_name(CHECK);
    let held = one
        .fair_lock(&name)
        .or_fail(CHECK)
        .lock()
        .await
        .or_fail(format!("{CHECK}: lock through the first instance"));
    let state = two.state(&name).await.or_fail(CHECK);
    assert!(
        state.holder.as_ref().map(|h| h.token) == Some(held.fencing_token()),
        "{CHECK}: a second instance must see the hold made through the first: {state:?}"
    );
    assert!(
        two.fair_lock(&name)
            .or_fail(CHECK)
            .try_lock()
            .await
            .is_err(),
        "{CHECK}: a second instance granted a lock held through the first"
    );
    let mut waiter =
        support::Waiter::enqueue(CHECK, &two, two.fair_lock(&name).or_fail(CHECK)).await;
    held.unlock().await.or_fail(CHECK);
    let got = waiter.acquired_within(support::EVENTUALLY).await;
    assert!(
        got.token > 0,
        "{CHECK}: the waiter on the second instance gets the lock"
    );
    waiter.release().await;
    support::wait_clean(&one, &name, format!("{CHECK}: clean at the end")).await;
}

/// An owner of the caller's choosing ([`Owner::new`]) may wait through several instances at
/// once, as a job whose steps run in several processes would: a hand-over to its attempt in
/// one instance must reach its watches in the others too, so that its attempt there re-enters
/// at once, not at its next heartbeat (the contract: every watch of the owner hears of any of
/// its attempts; only an [`Owner::unique`] owner's may stay in the instance that made the
/// request).
pub async fn shared_owner_hears_grants_in_every_instance(open: Arc<dyn OpenBackend>) {
    const CHECK: &str = "shared_owner_hears_grants_in_every_instance";
    // A heartbeat every 10 s: the second attempt can only make it in time by a wake-up.
    let options = crate::LockOptions {
        waiter_ttl: Duration::from_secs(30),
        ..support::options()
    };
    let holding = support::client(&open.open().await);
    let here = support::client_with(&open.open().await, options.clone());
    let there = support::client_with(&open.open().await, options);
    let name = support::lock_name(CHECK);
    let shared = Owner::new(format!("job-{:016x}", rand::random::<u64>())).or_fail(CHECK);
    let held = holding
        .fair_lock(&name)
        .or_fail(CHECK)
        .lock()
        .await
        .or_fail(format!("{CHECK}: the holder locks"));
    let mut first = support::Waiter::enqueue(
        format!("{CHECK}: the first attempt"),
        &holding,
        here.fair_lock_as(&name, shared.clone()).or_fail(CHECK),
    )
    .await;
    let mut second = support::Waiter::spawn(
        format!("{CHECK}: the second attempt"),
        there.fair_lock_as(&name, shared.clone()).or_fail(CHECK),
    );
    support::state_where(
        &holding,
        &name,
        support::EVENTUALLY,
        format!("{CHECK}: both attempts of {shared} queue"),
        |state| {
            state
                .waiters
                .iter()
                .filter(|w| w.owner == shared.as_str())
                .count()
                == 2
        },
    )
    .await;
    held.unlock()
        .await
        .or_fail(format!("{CHECK}: the holder unlocks"));
    let to_first = first.acquired_within(support::EVENTUALLY).await;
    let to_second = second.acquired_within(support::EVENTUALLY).await;
    assert_eq!(
        to_first.token, to_second.token,
        "{CHECK}: the second attempt re-enters the first's hold"
    );
    first.release().await;
    second.release().await;
    support::wait_clean(&holding, &name, format!("{CHECK}: clean at the end")).await;
}
