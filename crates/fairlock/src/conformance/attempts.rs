//! Each `lock()` call is its own attempt: several attempts of one owner, a handle shared by
//! tasks, nested locking right after a hand-over, a lost grant reply, and one lease per hold.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::sleep;

use super::support::{self, OrFail, Waiter};
use crate::backend::{
    AcquireOutcome, AcquireRequest, AttemptId, Capabilities, HolderState, LockBackend, LockState,
    LockSummary, ReleaseOutcome, Watch,
};
use crate::error::{Error, Result};
use crate::name::{LockName, Owner};

/// Checks that another owner cannot take the lock now.
async fn still_excluded(client: &crate::LockClient, name: &str, what: &str) {
    let other = client.fair_lock(name).or_fail(what);
    match other.try_lock().await {
        Err(Error::WouldBlock { .. }) => {}
        Ok(guard) => {
            drop(guard);
            panic!("{what}: another owner took the lock while a guard of the holder was live");
        }
        Err(err) => panic!("{what}: try_lock by another owner: unexpected error {err}"),
    }
}

/// One handle shared by two tasks (`Arc<FairLock>`), both waiting behind another owner: when
/// the lock reaches them each gets its own level (hold counts 1 and 2, one token, neither left
/// in the queue), and the first unlock leaves the lock held for the second guard.
pub async fn shared_handle_counts_each_guard(backend: Arc<dyn LockBackend>) {
    const CHECK: &str = "shared_handle_counts_each_guard";
    let client = support::client(&backend);
    let name = support::lock_name(CHECK);
    let holder = client.fair_lock(&name).or_fail(CHECK);
    let shared = Arc::new(client.fair_lock(&name).or_fail(CHECK));
    let held = holder.lock().await.or_fail(format!("{CHECK}: holder"));

    let mut tasks = Vec::new();
    for _ in 0..2 {
        let shared = shared.clone();
        tasks.push(tokio::spawn(async move { shared.lock().await }));
    }
    support::state_where(&client, &name, support::EVENTUALLY, CHECK, |s| {
        s.waiters.len() == 2
    })
    .await;
    held.unlock()
        .await
        .or_fail(format!("{CHECK}: holder unlock"));

    let mut guards = Vec::new();
    for task in tasks {
        let guard = tokio::time::timeout(support::EVENTUALLY, task)
            .await
            .unwrap_or_else(|_| panic!("{CHECK}: a task of the shared handle never got the lock"))
            .expect("task")
            .or_fail(format!("{CHECK}: lock() through the shared handle"));
        guards.push(guard);
    }
    let mut counts: Vec<u32> = guards.iter().map(|g| g.hold_count()).collect();
    counts.sort_unstable();
    assert_eq!(
        counts,
        vec![1, 2],
        "{CHECK}: two guards of one owner must be two levels"
    );
    assert_eq!(
        guards[0].fencing_token(),
        guards[1].fencing_token(),
        "{CHECK}: one hold, one token"
    );
    let state = client.state(&name).await.or_fail(CHECK);
    assert_eq!(
        state.holder.as_ref().map(|h| h.hold_count),
        Some(2),
        "{CHECK}: the store must count both guards: {state:?}"
    );
    // The second guard's attempt re-entered from the queue: its entry must be gone, or it
    // would be handed the lock again when it reaches the front.
    assert!(
        state.waiters.is_empty(),
        "{CHECK}: a re-entry must take its attempt out of the queue: {state:?}"
    );
    let second = guards.pop().expect("two guards");
    guards
        .pop()
        .expect("two guards")
        .unlock()
        .await
        .or_fail(format!("{CHECK}: first unlock"));
    still_excluded(&client, &name, CHECK).await;
    assert!(!second.is_lease_lost(), "{CHECK}: the second guard's lease");
    second
        .unlock()
        .await
        .or_fail(format!("{CHECK}: second unlock"));
    support::wait_clean(&client, &name, format!("{CHECK}: clean at the end")).await;
}

/// A nested `lock()` made at once after a `lock()` that returned on a hand-over is a second
/// level, not the confirmation of the first: dropping the inner guard keeps the lock.
pub async fn nested_lock_after_hand_over(backend: Arc<dyn LockBackend>) {
    const CHECK: &str = "nested_lock_after_hand_over";
    let client = support::client(&backend);
    let name = support::lock_name(CHECK);
    let holder = client.fair_lock(&name).or_fail(CHECK);
    let lock = Arc::new(client.fair_lock(&name).or_fail(CHECK));
    let held = holder.lock().await.or_fail(format!("{CHECK}: holder"));
    let waiting = {
        let lock = lock.clone();
        tokio::spawn(async move {
            let outer = lock.lock().await?;
            let inner = lock.lock().await?;
            Ok::<_, Error>((outer, inner))
        })
    };
    support::wait_queued(&client, &name, lock.owner(), CHECK).await;
    held.unlock()
        .await
        .or_fail(format!("{CHECK}: holder unlock"));
    let (outer, inner) = tokio::time::timeout(support::EVENTUALLY, waiting)
        .await
        .unwrap_or_else(|_| panic!("{CHECK}: the waiter never got the lock"))
        .expect("task")
        .or_fail(format!("{CHECK}: outer and inner lock()"));
    assert_eq!(
        (outer.hold_count(), inner.hold_count()),
        (1, 2),
        "{CHECK}: hold counts"
    );
    inner
        .unlock()
        .await
        .or_fail(format!("{CHECK}: inner unlock"));
    still_excluded(&client, &name, CHECK).await;
    let state = client.state(&name).await.or_fail(CHECK);
    assert_eq!(
        state.holder.as_ref().map(|h| h.hold_count),
        Some(1),
        "{CHECK}: the outer level remains: {state:?}"
    );
    outer
        .unlock()
        .await
        .or_fail(format!("{CHECK}: outer unlock"));
    support::wait_clean(&client, &name, format!("{CHECK}: clean at the end")).await;
}

/// Two attempts of one owner wait; the later one times out. The earlier one keeps its place
/// in the queue (ahead of an owner that queued after it) and gets the lock first.
pub async fn attempts_of_one_owner_are_independent(backend: Arc<dyn LockBackend>) {
    const CHECK: &str = "attempts_of_one_owner_are_independent";
    let client = support::client(&backend);
    let name = support::lock_name(CHECK);
    let holder = client.fair_lock(&name).or_fail(CHECK);
    let held = holder.lock().await.or_fail(format!("{CHECK}: holder"));
    let owner = client.fair_lock(&name).or_fail(CHECK);
    let owner_too = client
        .fair_lock_as(&name, owner.owner().clone())
        .or_fail(CHECK);
    let mut first = Waiter::enqueue(CHECK, &client, owner).await;
    let impatient = tokio::spawn(async move {
        owner_too
            .try_lock_for(Duration::from_millis(300))
            .await
            .map(drop)
    });
    support::state_where(&client, &name, support::EVENTUALLY, CHECK, |s| {
        s.waiters.len() == 2
    })
    .await;
    let later = client.fair_lock(&name).or_fail(CHECK);
    let mut later = Waiter::enqueue(CHECK, &client, later).await;
    match impatient.await.expect("task") {
        Err(Error::Timeout { .. }) => {}
        other => panic!("{CHECK}: the impatient attempt should time out, got {other:?}"),
    }
    held.unlock()
        .await
        .or_fail(format!("{CHECK}: holder unlock"));
    first.acquired_within(support::EVENTUALLY).await;
    assert!(
        !later.has_acquired(),
        "{CHECK}: an owner queued later got the lock first"
    );
    first.release().await;
    later.acquired_within(support::EVENTUALLY).await;
    later.release().await;
    support::wait_clean(&client, &name, format!("{CHECK}: clean at the end")).await;
}

/// Guards of one hold share one lease: a nested guard's `extend` never cuts the lease under
/// the outer guard, and an extension made through one guard keeps the other's lease signal
/// quiet.
pub async fn one_lease_per_hold(backend: Arc<dyn LockBackend>) {
    const CHECK: &str = "one_lease_per_hold";
    let lease = Duration::from_millis(600);
    let client = support::fixed_lease_client(&backend, lease);
    let name = support::lock_name(CHECK);
    let lock = client.fair_lock(&name).or_fail(CHECK);
    let outer = lock.lock().await.or_fail(format!("{CHECK}: outer"));
    let inner = lock.lock().await.or_fail(format!("{CHECK}: inner"));
    // A shorter extension through the inner guard must not shorten the hold's lease.
    inner
        .extend(Duration::from_millis(20))
        .await
        .or_fail(format!("{CHECK}: inner extend"));
    sleep(Duration::from_millis(100)).await;
    still_excluded(&client, &name, CHECK).await;
    assert!(!outer.is_lease_lost(), "{CHECK}: outer lease");

    // A longer extension through the inner guard counts for the outer guard too.
    inner
        .extend(Duration::from_secs(3))
        .await
        .or_fail(format!("{CHECK}: inner extend"));
    sleep(lease + Duration::from_millis(200)).await;
    let state = client.state(&name).await.or_fail(CHECK);
    assert!(state.holder.is_some(), "{CHECK}: still held: {state:?}");
    assert!(
        !outer.is_lease_lost(),
        "{CHECK}: the outer guard reported its lease lost although the hold was extended"
    );
    drop(inner);
    outer
        .unlock()
        .await
        .or_fail(format!("{CHECK}: outer unlock"));
    support::wait_clean(&client, &name, format!("{CHECK}: clean at the end")).await;
}

/// Wraps a backend and loses the reply of the next `acquire` that grants: the store applied
/// it, the caller gets [`Error::Unavailable`], as when a connection drops after a request was
/// sent. For checking that a grant nobody saw is never left behind as a phantom level.
#[derive(Debug)]
pub struct LostReplies {
    inner: Arc<dyn LockBackend>,
    armed: std::sync::atomic::AtomicBool,
}

impl LostReplies {
    /// Wraps `inner`; the next granting `acquire`'s reply will be lost.
    pub fn new(inner: Arc<dyn LockBackend>) -> Self {
        LostReplies {
            inner,
            armed: std::sync::atomic::AtomicBool::new(true),
        }
    }

    /// Loses the reply of the next granting `acquire` again.
    pub fn arm(&self) {
        self.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

#[async_trait::async_trait]
impl LockBackend for LostReplies {
    async fn acquire(&self, request: &AcquireRequest) -> Result<AcquireOutcome> {
        let outcome = self.inner.acquire(request).await?;
        if matches!(outcome, AcquireOutcome::Granted(_))
            && self.armed.swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            return Err(Error::Unavailable {
                backend: "lost-replies",
                endpoint: "the reply was lost on purpose".into(),
                source: "connection dropped after the request was sent".into(),
            });
        }
        Ok(outcome)
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
        self.inner.watch(name, owner).await
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }
}

/// A grant whose reply was lost leaves no phantom level: a failed `try_lock()` gives it back,
/// the owner's next `lock()` holds once (hold count 1), and after its unlock another owner
/// gets the lock at once, not after the lease; a `lock()` whose reply is lost asks again and
/// adopts the grant as one level. An attempt that asks again gets its grant with the hold's
/// count as it is now (the core counts a re-entry again this way).
pub async fn lost_grant_reply_leaves_no_level(backend: Arc<dyn LockBackend>) {
    const CHECK: &str = "lost_grant_reply_leaves_no_level";
    // A long fixed lease: a phantom level would keep the lock for all of it.
    let lease = Duration::from_secs(30);
    let lossy = Arc::new(LostReplies::new(backend.clone()));
    let lossy_client = crate::LockClient::from_arc(lossy.clone())
        .with_options(crate::LockOptions {
            lease: Some(lease),
            ..support::options()
        })
        .or_fail(CHECK);
    let client = support::client(&backend);
    let name = support::lock_name(CHECK);
    let lock = lossy_client.fair_lock(&name).or_fail(CHECK);

    // `try_lock` does not retry: the lost reply surfaces.
    match lock.try_lock().await {
        Err(Error::Unavailable { .. }) => {}
        other => panic!("{CHECK}: the lost reply should surface as Unavailable, got {other:?}"),
    }
    // The failed attempt is abandoned in the background, which gives its grant back.
    support::wait_clean(
        &client,
        &name,
        format!("{CHECK}: the unseen grant is given back"),
    )
    .await;

    let guard = lock.lock().await.or_fail(format!("{CHECK}: lock again"));
    assert_eq!(
        guard.hold_count(),
        1,
        "{CHECK}: no phantom level under the new guard"
    );
    guard.unlock().await.or_fail(format!("{CHECK}: unlock"));
    let other = client.fair_lock(&name).or_fail(CHECK);
    let taken = other.try_lock().await.or_fail(format!(
        "{CHECK}: another owner takes the released lock at once"
    ));
    taken.unlock().await.or_fail(CHECK);

    // `lock()` rides out a lost reply: it asks again as the same attempt and adopts the
    // grant, one level.
    lossy.arm();
    let adopted = lock
        .lock()
        .await
        .or_fail(format!("{CHECK}: lock with a lost reply"));
    assert_eq!(
        adopted.hold_count(),
        1,
        "{CHECK}: an adopted grant is one level"
    );
    adopted.unlock().await.or_fail(CHECK);
    support::wait_clean(
        &client,
        &name,
        format!("{CHECK}: clean after the adopted grant"),
    )
    .await;

    // Same when the lost reply is a re-entry: the owner holds, a nested try_lock's reply is
    // lost.
    let outer = lock.lock().await.or_fail(format!("{CHECK}: outer"));
    lossy.arm();
    assert!(
        matches!(lock.try_lock().await, Err(Error::Unavailable { .. })),
        "{CHECK}: the nested try_lock's lost reply surfaces"
    );
    support::state_where(&client, &name, support::EVENTUALLY, CHECK, |s| {
        s.holder.as_ref().is_some_and(|h| h.hold_count == 1)
    })
    .await;
    outer
        .unlock()
        .await
        .or_fail(format!("{CHECK}: outer unlock"));
    support::wait_clean(
        &client,
        &name,
        format!("{CHECK}: clean before the re-asked re-entry"),
    )
    .await;

    // Asked again, a granted attempt answers with the hold's count now, not as first granted:
    // a re-entry (count 2) asks again after the outer level was released (count 1).
    let owner = Owner::unique();
    let (first, second) = (AttemptId::random(), AttemptId::random());
    let ttl = support::WAITER_TTL;
    let AcquireOutcome::Granted(grant) =
        support::raw_acquire_as(&backend, &name, &owner, first, lease, ttl, false).await
    else {
        panic!("{CHECK}: a free lock must be granted");
    };
    let reentered =
        support::raw_acquire_as(&backend, &name, &owner, second, lease, ttl, false).await;
    assert!(
        matches!(reentered, AcquireOutcome::Granted(g) if g.token == grant.token && g.hold_count == 2),
        "{CHECK}: a re-entry is the second level of the hold: {reentered:?}"
    );
    let lock_name = LockName::new(&name).or_fail(CHECK);
    let released = backend
        .release(&lock_name, &owner, grant.token, first)
        .await
        .or_fail(format!("{CHECK}: release the outer level"));
    assert_eq!(
        released,
        ReleaseOutcome::Released { remaining: 1 },
        "{CHECK}"
    );
    let again = support::raw_acquire_as(&backend, &name, &owner, second, lease, ttl, false).await;
    assert!(
        matches!(again, AcquireOutcome::Granted(g) if g.token == grant.token && g.hold_count == 1),
        "{CHECK}: the re-entry asked again holds its level, and the hold has 1 level now: \
         {again:?}"
    );
    let released = backend
        .release(&lock_name, &owner, grant.token, second)
        .await
        .or_fail(format!("{CHECK}: release the re-entry"));
    assert_eq!(
        released,
        ReleaseOutcome::Released { remaining: 0 },
        "{CHECK}"
    );
    support::wait_clean(&client, &name, format!("{CHECK}: clean at the end")).await;
}
