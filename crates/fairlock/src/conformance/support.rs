//! What the checks share: fresh names, the suite's short timings, polling `state()` until an
//! eventual condition holds, and real waiters and fake owners to drive a lock.

use std::fmt::Display;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout, Instant};

use crate::backend::{AcquireOutcome, AcquireRequest, AttemptId, LockBackend, LockState};
use crate::error::Result;
use crate::lock::{FairLock, LockClient};
use crate::name::{LockName, Owner};
use crate::options::LockOptions;

/// The lease the watchdog keeps renewing in the suite (renewed every third of it).
pub(crate) const WATCHDOG_LEASE: Duration = Duration::from_millis(400);
/// The waiters' liveness TTL in the suite: they heartbeat every 200 ms.
pub(crate) const WAITER_TTL: Duration = Duration::from_millis(600);
/// How long an eventual condition (background cleanup, a waiter showing up in the queue, a
/// hand-over) may take before the check fails. Generous: a networked store on a loaded CI
/// machine must pass, and the checks that depend on it prove what they prove either way.
pub(crate) const EVENTUALLY: Duration = Duration::from_secs(3);
/// Leeway for the store's millisecond precision when comparing its clock with ours.
pub(crate) const CLOCK_SLACK: Duration = Duration::from_millis(5);

/// [`CLOCK_SLACK`] plus the step of `backend`'s clock (its declared capability): how much *later*
/// than asked a deadline may end. Only for upper bounds: a coarse store rounds up, so checks
/// that nothing ends early keep the plain [`CLOCK_SLACK`].
pub(crate) fn clock_slack(backend: &Arc<dyn LockBackend>) -> Duration {
    CLOCK_SLACK + backend.capabilities().clock_granularity
}
const POLL: Duration = Duration::from_millis(3);

/// A lock name nobody else uses: every check works on its own names and never wipes the store.
pub(crate) fn lock_name(check: &str) -> String {
    format!(
        "fairlock-conformance/{check}/{:016x}",
        rand::random::<u64>()
    )
}

/// The suite's options: a watchdog lease of [`WATCHDOG_LEASE`], waiters live [`WAITER_TTL`].
pub(crate) fn options() -> LockOptions {
    LockOptions {
        lease: None,
        watchdog_lease: WATCHDOG_LEASE,
        waiter_ttl: WAITER_TTL,
        outage_budget: Duration::from_secs(30),
    }
}

/// A client over `backend` with the suite's options.
pub(crate) fn client(backend: &Arc<dyn LockBackend>) -> LockClient {
    client_with(backend, options())
}

/// A client over `backend` whose locks have a fixed `lease` (no watchdog).
pub(crate) fn fixed_lease_client(backend: &Arc<dyn LockBackend>, lease: Duration) -> LockClient {
    client_with(
        backend,
        LockOptions {
            lease: Some(lease),
            ..options()
        },
    )
}

pub(crate) fn client_with(backend: &Arc<dyn LockBackend>, options: LockOptions) -> LockClient {
    LockClient::from_arc(backend.clone())
        .with_options(options)
        .or_fail("the suite's own lock options")
}

/// `unwrap` with the check's context in the panic message.
pub(crate) trait OrFail<T> {
    /// The value, or a panic naming `context` and the error.
    fn or_fail(self, context: impl Display) -> T;
}

impl<T> OrFail<T> for Result<T> {
    #[track_caller]
    fn or_fail(self, context: impl Display) -> T {
        match self {
            Ok(value) => value,
            Err(err) => panic!("{context}: unexpected error: {err} ({err:?})"),
        }
    }
}

/// Polls `state(name)` until `holds` is true, and returns that state; panics after `bound`.
pub(crate) async fn state_where(
    client: &LockClient,
    name: &str,
    bound: Duration,
    what: impl Display,
    holds: impl Fn(&LockState) -> bool,
) -> LockState {
    let started = Instant::now();
    loop {
        let state = client.state(name).await.or_fail(format!("{what}: state()"));
        if holds(&state) {
            return state;
        }
        if started.elapsed() >= bound {
            panic!("{what}: not the case within {bound:?}; last state: {state:?}");
        }
        sleep(POLL).await;
    }
}

/// Waits until the lock is free and has no waiters: whatever the check left is cleaned up.
pub(crate) async fn wait_clean(client: &LockClient, name: &str, what: impl Display) {
    state_where(client, name, EVENTUALLY, what, |s| {
        s.holder.is_none() && s.waiters.is_empty()
    })
    .await;
}

/// The owners of the live waiters, first in line first.
pub(crate) fn waiter_owners(state: &LockState) -> Vec<String> {
    state.waiters.iter().map(|w| w.owner.clone()).collect()
}

/// Waits until `owner` is listed among the waiters of `name`.
pub(crate) async fn wait_queued(
    client: &LockClient,
    name: &str,
    owner: &Owner,
    what: impl Display,
) {
    let owner = owner.as_str();
    state_where(client, name, EVENTUALLY, what, |s| {
        s.waiters.iter().any(|w| w.owner == owner)
    })
    .await;
}

/// The one attempt a raw caller of the suite makes: owners that call the backend directly
/// model a single attempt each, so their attempt is derived from the owner.
pub(crate) fn attempt_of(owner: &Owner) -> AttemptId {
    use std::hash::{Hash, Hasher};
    let half = |salt: u8| {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        salt.hash(&mut hasher);
        owner.as_str().hash(&mut hasher);
        u128::from(hasher.finish())
    };
    AttemptId::from_u128(half(1) << 64 | half(2))
}

/// One `acquire` call made directly on the backend, as an owner that runs no core code: after
/// the call it neither heartbeats nor leaves, like a process that died. Its attempt is
/// [`attempt_of`] the owner.
pub(crate) async fn raw_acquire(
    backend: &Arc<dyn LockBackend>,
    name: &str,
    owner: &Owner,
    lease: Duration,
    waiter_ttl: Duration,
    queue: bool,
) -> AcquireOutcome {
    raw_acquire_as(
        backend,
        name,
        owner,
        attempt_of(owner),
        lease,
        waiter_ttl,
        queue,
    )
    .await
}

/// [`raw_acquire`] for a given attempt of `owner`.
pub(crate) async fn raw_acquire_as(
    backend: &Arc<dyn LockBackend>,
    name: &str,
    owner: &Owner,
    attempt: AttemptId,
    lease: Duration,
    waiter_ttl: Duration,
    queue: bool,
) -> AcquireOutcome {
    let request = AcquireRequest {
        name: LockName::new(name).or_fail("a suite lock name"),
        owner: owner.clone(),
        attempt,
        lease,
        waiter_ttl,
        queue,
    };
    backend
        .acquire(&request)
        .await
        .or_fail(format!("acquire by {owner} ({attempt}) on {name}"))
}

/// Checks that `outcome` is [`AcquireOutcome::Queued`] and that its `last_token` is at least
/// `issued`, a token already issued for the lock (the core uses it to discard stale
/// `Wake::Granted` messages, so it must not lag behind).
#[track_caller]
pub(crate) fn expect_queued(outcome: AcquireOutcome, issued: u64, what: impl Display) {
    match outcome {
        AcquireOutcome::Queued { last_token, .. } => assert!(
            last_token >= issued,
            "{what}: Queued must report the highest token issued for the lock: it reports {last_token}, but {issued} was issued"
        ),
        other => panic!("{what}: expected Queued, got {other:?}"),
    }
}

/// What a [`Waiter`] saw when it got the lock.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Acquired {
    pub(crate) token: u64,
    pub(crate) hold_count: u32,
    /// When `lock()` returned, by the local clock.
    pub(crate) at: Instant,
}

/// A task waiting in `lock()`, holding the lock once granted until told to release it.
pub(crate) struct Waiter {
    what: String,
    owner: Owner,
    acquired: oneshot::Receiver<Acquired>,
    release: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<()>>,
}

impl Waiter {
    /// Starts `lock.lock()` in a task.
    pub(crate) fn spawn(what: impl Display, lock: FairLock) -> Self {
        let owner = lock.owner().clone();
        let (acquired_tx, acquired) = oneshot::channel();
        let (release, release_rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let guard = lock.lock().await?;
            let _ = acquired_tx.send(Acquired {
                token: guard.fencing_token(),
                hold_count: guard.hold_count(),
                at: Instant::now(),
            });
            let _ = release_rx.await;
            guard.unlock().await
        });
        Waiter {
            what: what.to_string(),
            owner,
            acquired,
            release: Some(release),
            task,
        }
    }

    /// Starts `lock.lock()` in a task and waits until the store lists it in the queue, so the
    /// next waiter started is surely behind it.
    pub(crate) async fn enqueue(what: impl Display, client: &LockClient, lock: FairLock) -> Self {
        let name = lock.name().to_string();
        let waiter = Waiter::spawn(what, lock);
        let context = format!(
            "{}: waiter {} shows up in the queue",
            waiter.what, waiter.owner
        );
        wait_queued(client, &name, &waiter.owner, context).await;
        waiter
    }

    pub(crate) fn owner(&self) -> &Owner {
        &self.owner
    }

    /// Whether the waiter holds the lock by now (without waiting).
    pub(crate) fn has_acquired(&mut self) -> bool {
        !self.acquired.is_empty()
    }

    /// Waits for the grant; panics if it does not come within `bound` or `lock()` failed.
    pub(crate) async fn acquired_within(&mut self, bound: Duration) -> Acquired {
        match timeout(bound, &mut self.acquired).await {
            Ok(Ok(acquired)) => acquired,
            Ok(Err(_)) => {
                let outcome = (&mut self.task).await;
                panic!(
                    "{}: waiter {} failed to lock: {outcome:?}",
                    self.what, self.owner
                )
            }
            Err(_) => panic!(
                "{}: waiter {} did not get the lock within {bound:?}",
                self.what, self.owner
            ),
        }
    }

    /// Lets the waiter unlock and checks that its `unlock` succeeded.
    pub(crate) async fn release(mut self) {
        if let Some(release) = self.release.take() {
            let _ = release.send(());
        }
        match (&mut self.task).await {
            Ok(Ok(())) => {}
            other => panic!(
                "{}: waiter {} failed to unlock: {other:?}",
                self.what, self.owner
            ),
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        // Only matters when a check fails halfway: do not leave a task waiting forever.
        self.task.abort();
    }
}

/// Waits for every task; re-raises the first panic with its own message.
pub(crate) async fn join_all<T: Send + 'static>(
    tasks: impl IntoIterator<Item = JoinHandle<T>>,
) -> Vec<T> {
    let mut out = Vec::new();
    for task in tasks {
        match task.await {
            Ok(value) => out.push(value),
            Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
            Err(err) => panic!("a conformance task was cancelled: {err}"),
        }
    }
    out
}
