//! Clauses of the contract seen from the store's side, each checked on its own: a re-entry
//! lengthens the lease, a pending grant lasts the waiter's TTL (not the lease), `list` does not
//! count dead waiters, and re-sent requests are harmless ([`Resend`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rand::Rng;
use tokio::time::sleep;

use super::support::{self, raw_acquire, raw_acquire_as, OrFail};
use crate::backend::{
    AcquireOutcome, AcquireRequest, AttemptId, Capabilities, HolderState, LockBackend, LockState,
    LockSummary, ReleaseOutcome, Watch,
};
use crate::error::{Error, Result};
use crate::name::{LockName, Owner};

/// A re-entry sets the hold's lease to the requested one from now when that is later than its
/// current end, and never shortens it: a hold granted with a short lease and re-entered with
/// a long one lasts the long one; re-entered again with a lease shorter than what is left, it
/// still lasts the long one.
pub async fn reentry_lengthens_the_lease(backend: Arc<dyn LockBackend>) {
    const CHECK: &str = "reentry_lengthens_the_lease";
    let client = support::client(&backend);
    let name = support::lock_name(CHECK);
    let owner = Owner::unique();
    let short = Duration::from_millis(300);
    let long = Duration::from_secs(5);
    let ttl = support::WAITER_TTL;
    let (first, second) = (AttemptId::random(), AttemptId::random());
    let AcquireOutcome::Granted(grant) =
        raw_acquire_as(&backend, &name, &owner, first, short, ttl, false).await
    else {
        panic!("{CHECK}: a fresh lock must be granted");
    };
    let outcome = raw_acquire_as(&backend, &name, &owner, second, long, ttl, false).await;
    assert!(
        matches!(outcome, AcquireOutcome::Granted(g) if g.token == grant.token && g.hold_count == 2),
        "{CHECK}: re-entry: {outcome:?}"
    );
    let state = client.state(&name).await.or_fail(CHECK);
    let left = state.holder.as_ref().map(|h| h.lease_remaining);
    assert!(
        left.is_some_and(|left| left > short * 2),
        "{CHECK}: a re-entry with a {long:?} lease must lengthen a {short:?} one: {state:?}"
    );
    sleep(short + Duration::from_millis(200)).await;
    let state = client.state(&name).await.or_fail(CHECK);
    assert!(
        state
            .holder
            .as_ref()
            .is_some_and(|h| h.token == grant.token),
        "{CHECK}: the hold must outlive its first, shorter lease: {state:?}"
    );
    let third = AttemptId::random();
    let brief = Duration::from_millis(50);
    let outcome = raw_acquire_as(&backend, &name, &owner, third, brief, ttl, false).await;
    assert!(
        matches!(outcome, AcquireOutcome::Granted(g) if g.token == grant.token && g.hold_count == 3),
        "{CHECK}: re-entry with a {brief:?} lease: {outcome:?}"
    );
    sleep(brief + Duration::from_millis(250)).await;
    let other = raw_acquire(&backend, &name, &Owner::unique(), long, ttl, false).await;
    assert_eq!(
        other,
        AcquireOutcome::Busy,
        "{CHECK}: a re-entry with a {brief:?} lease must not shorten the hold's {long:?} one"
    );
    let state = client.state(&name).await.or_fail(CHECK);
    assert!(
        state
            .holder
            .as_ref()
            .is_some_and(|h| h.token == grant.token && h.lease_remaining > short * 2),
        "{CHECK}: the hold keeps the longer lease after a shorter re-entry: {state:?}"
    );
    let lock_name = LockName::new(&name).or_fail(CHECK);
    for attempt in [third, second, first] {
        backend
            .release(&lock_name, &owner, grant.token, attempt)
            .await
            .or_fail(CHECK);
    }
    support::wait_clean(&client, &name, format!("{CHECK}: clean at the end")).await;
}

/// A hand-over to a waiter that never confirms it lasts that waiter's liveness TTL, not the
/// lease it asked for: then the lock is free again, and the waiter's attempt is spent (a late
/// `acquire` of it is refused with `Busy` and changes nothing).
pub async fn pending_grant_lasts_the_waiter_ttl(backend: Arc<dyn LockBackend>) {
    const CHECK: &str = "pending_grant_lasts_the_waiter_ttl";
    let ttl = Duration::from_millis(400);
    let (name, dead) = lapsing_hand_over(&backend, ttl, CHECK).await;
    sleep(ttl + Duration::from_millis(200) + support::clock_slack(&backend)).await;
    let client = support::client(&backend);
    let state = client.state(&name).await.or_fail(CHECK);
    assert!(
        state.holder.is_none(),
        "{CHECK}: an unconfirmed hand-over must end after the waiter's TTL: {state:?}"
    );
    late_acquire_is_spent(&backend, &name, &dead, ttl, CHECK).await;
}

/// A pending level lapses on its own deadline also beside other levels: another attempt of
/// the grantee's owner re-entering the handed-over hold (a nested `lock()`, a sharer of the
/// owner) adds a level of its own (hold count 2) without confirming the pending one, and once
/// the waiter's TTL has passed the pending level is gone (count 1, the re-entered level holding
/// on its own lease) and its attempt is spent. Otherwise a dead waiter's level would live as
/// long as its owner's other guards renew the hold, and its release never come.
pub async fn pending_level_lapses_beside_a_reentry(backend: Arc<dyn LockBackend>) {
    const CHECK: &str = "pending_level_lapses_beside_a_reentry";
    // Long enough that the re-entry lands before the pending level lapses, on a slow store.
    let ttl = Duration::from_secs(2);
    let long = Duration::from_secs(5);
    let (name, dead) = lapsing_hand_over(&backend, ttl, CHECK).await;
    let other = AttemptId::random();
    let reentered = raw_acquire_as(&backend, &name, &dead, other, long, ttl, false).await;
    let AcquireOutcome::Granted(grant) = reentered else {
        panic!("{CHECK}: the owner of a pending hold re-enters it, got {reentered:?}");
    };
    assert_eq!(
        grant.hold_count, 2,
        "{CHECK}: a re-entry into a pending hold adds a level of its own, not a confirmation"
    );
    sleep(ttl + Duration::from_millis(200) + support::clock_slack(&backend)).await;
    let client = support::client(&backend);
    let state = client.state(&name).await.or_fail(CHECK);
    assert!(
        state
            .holder
            .as_ref()
            .is_some_and(|h| h.owner == dead.as_str() && h.token == grant.token && h.hold_count == 1),
        "{CHECK}: after the waiter's TTL the pending level must be gone, the re-entered one left: {state:?}"
    );
    let late = raw_acquire(&backend, &name, &dead, long, ttl, true).await;
    assert_eq!(
        late,
        AcquireOutcome::Busy,
        "{CHECK}: the attempt of the lapsed pending level is spent"
    );
    let lock_name = LockName::new(&name).or_fail(CHECK);
    let released = backend
        .release(&lock_name, &dead, grant.token, other)
        .await
        .or_fail(CHECK);
    assert_eq!(
        released,
        ReleaseOutcome::Released { remaining: 0 },
        "{CHECK}: the re-entered level was the last"
    );
    support::wait_clean(&client, &name, format!("{CHECK}: clean at the end")).await;
}

/// **Slow: it takes [`RESEND_HORIZON`](crate::backend::RESEND_HORIZON) and a few seconds**, so
/// [`run_all`](super::run_all) does not run it: run it in a test of its own. The attempt of a
/// hand-over that lapsed unconfirmed stays spent for the resend horizon from the lapse, not
/// only from the hand-over: the waiter may send an `acquire` until its pending level lapses,
/// and that request may arrive a horizon later. A horizon after the hand-over, before one
/// after the lapse, a late `acquire` of the attempt is refused with `Busy`.
pub async fn lapsed_hand_over_stays_spent(backend: Arc<dyn LockBackend>) {
    const CHECK: &str = "lapsed_hand_over_stays_spent";
    // Seconds on either side of the horizon from the hand-over, for unsynchronised clocks.
    let ttl = Duration::from_secs(4);
    let (name, dead) = lapsing_hand_over(&backend, ttl, CHECK).await;
    sleep(crate::backend::RESEND_HORIZON + ttl / 2).await;
    late_acquire_is_spent(&backend, &name, &dead, ttl, CHECK).await;
}

/// A lock handed over to a waiter (the second owner returned) that never confirms, with
/// `ttl` as its waiter TTL: the hand-over has just been made.
async fn lapsing_hand_over(
    backend: &Arc<dyn LockBackend>,
    ttl: Duration,
    check: &str,
) -> (String, Owner) {
    let client = support::client(backend);
    let name = support::lock_name(check);
    let long = Duration::from_secs(30);
    let (holder, dead) = (Owner::unique(), Owner::unique());
    let AcquireOutcome::Granted(held) =
        raw_acquire(backend, &name, &holder, long, long, false).await
    else {
        panic!("{check}: a fresh lock must be granted");
    };
    let outcome = raw_acquire(backend, &name, &dead, long, ttl, true).await;
    support::expect_queued(outcome, held.token, format!("{check}: queue"));
    super::fifo::release_raw(backend, &name, &holder, held.token, check).await;
    let state = client.state(&name).await.or_fail(check);
    let Some(pending) = state.holder.as_ref().filter(|h| h.owner == dead.as_str()) else {
        panic!("{check}: the release must hand the lock to the waiter: {state:?}");
    };
    assert!(
        !pending.confirmed && pending.lease_remaining <= ttl + support::clock_slack(backend),
        "{check}: a pending grant lasts the waiter's TTL ({ttl:?}), not its lease ({long:?}): {state:?}"
    );
    (name, dead)
}

/// After `dead`'s hand-over lapsed: a late `acquire` of its attempt is `Busy` and changes
/// nothing; then the attempt is abandoned and the lock must be left clean.
async fn late_acquire_is_spent(
    backend: &Arc<dyn LockBackend>,
    name: &str,
    dead: &Owner,
    ttl: Duration,
    check: &str,
) {
    let client = support::client(backend);
    let late = raw_acquire(backend, name, dead, Duration::from_secs(30), ttl, true).await;
    assert_eq!(
        late,
        AcquireOutcome::Busy,
        "{check}: the attempt of a lapsed hand-over is spent"
    );
    let state = client.state(name).await.or_fail(check);
    assert!(
        state.holder.is_none() && state.waiters.is_empty(),
        "{check}: a spent attempt's acquire must change nothing: {state:?}"
    );
    let lock_name = LockName::new(name).or_fail(check);
    backend
        .abandon(&lock_name, dead, support::attempt_of(dead))
        .await
        .or_fail(check);
    support::wait_clean(&client, name, format!("{check}: clean at the end")).await;
}

/// `list` counts live waiters only: a waiter that stopped heart-beating stops being counted
/// once its TTL has passed, and a lock with nothing but dead waiters is not listed.
pub async fn list_ignores_dead_waiters(backend: Arc<dyn LockBackend>) {
    const CHECK: &str = "list_ignores_dead_waiters";
    let client = support::client(&backend);
    let name = support::lock_name(CHECK);
    let long = Duration::from_secs(30);
    let ttl = Duration::from_millis(300);
    let (holder, dead) = (Owner::unique(), Owner::unique());
    let AcquireOutcome::Granted(held) =
        raw_acquire(&backend, &name, &holder, long, long, false).await
    else {
        panic!("{CHECK}: a fresh lock must be granted");
    };
    let outcome = raw_acquire(&backend, &name, &dead, long, ttl, true).await;
    support::expect_queued(outcome, held.token, format!("{CHECK}: queue"));
    let waiters = |list: &[LockSummary]| list.iter().find(|s| s.name == name).map(|s| s.waiters);
    let listed = client.list(&name).await.or_fail(CHECK);
    assert_eq!(
        waiters(&listed),
        Some(1),
        "{CHECK}: one live waiter: {listed:?}"
    );
    sleep(ttl + Duration::from_millis(200) + support::clock_slack(&backend)).await;
    let listed = client.list(&name).await.or_fail(CHECK);
    assert_eq!(
        waiters(&listed),
        Some(0),
        "{CHECK}: a dead waiter must not be counted: {listed:?}"
    );
    super::fifo::release_raw(&backend, &name, &holder, held.token, CHECK).await;
    let listed = client.list(&name).await.or_fail(CHECK);
    assert_eq!(
        waiters(&listed),
        None,
        "{CHECK}: a free lock with only dead waiters is not listed: {listed:?}"
    );
    support::wait_clean(&client, &name, format!("{CHECK}: clean at the end")).await;
}

/// A wrapper that delivers state-changing requests again, later: each `acquire`, `release`,
/// `extend`, `abandon` and `force_release` is, with probability `chance`, sent a second time
/// after a random delay below `max_delay`, as a client does after a reconnect or as a paused
/// server runs a request late. A backend that keeps the contract is unaffected; run any check
/// or workload through it.
///
/// Two ways a caller sees such a request:
/// - [`Resend::new`]: the caller gets the first copy's reply at once, and the second copy
///   lands later, its reply dropped (a request that sat in a paused server, or a client that
///   sent it twice);
/// - [`Resend::answering_late`]: the first copy is applied but its reply is lost, and the
///   caller waits for the second copy and gets *its* reply, as from a client that re-sends
///   after a reconnect (fred does, up to `max_command_attempts`). So the backend's answer to a
///   request it has already applied reaches the core.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use fairlock::conformance::Resend;
/// use fairlock::{LockClient, MemoryBackend};
///
/// let resending = Resend::new(Arc::new(MemoryBackend::new()), 0.5, Duration::from_millis(20));
/// let client = LockClient::new(resending);
/// # drop(client);
/// ```
#[derive(Debug, Clone)]
pub struct Resend {
    inner: Arc<dyn LockBackend>,
    chance: f64,
    max_delay: Duration,
    answer_late: bool,
    resent: Arc<AtomicUsize>,
}

impl Resend {
    /// Wraps `inner`, re-sending each state-changing request with probability `chance`
    /// (clamped to 0..=1; NaN is 0) after up to `max_delay`; the caller gets the first copy's
    /// reply.
    pub fn new(inner: Arc<dyn LockBackend>, chance: f64, max_delay: Duration) -> Self {
        Resend {
            inner,
            // NaN (which `clamp` keeps) counts as never.
            chance: if chance.is_nan() {
                0.0
            } else {
                chance.clamp(0.0, 1.0)
            },
            max_delay,
            answer_late: false,
            resent: Arc::default(),
        }
    }

    /// Wraps `inner` like [`Resend::new`], but a request that is re-sent answers with the
    /// second copy's reply: the caller waits for it, and the first copy's reply is lost. If
    /// the caller stops waiting, the second copy is delivered all the same, as a client's
    /// re-send is.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use fairlock::conformance::Resend;
    /// use fairlock::MemoryBackend;
    ///
    /// let late = Resend::answering_late(Arc::new(MemoryBackend::new()), 0.5, Duration::from_millis(20));
    /// # drop(late);
    /// ```
    pub fn answering_late(inner: Arc<dyn LockBackend>, chance: f64, max_delay: Duration) -> Self {
        Resend {
            answer_late: true,
            ..Resend::new(inner, chance, max_delay)
        }
    }

    /// How many requests were sent again so far.
    pub fn resent(&self) -> usize {
        self.resent.load(Ordering::Relaxed)
    }

    /// Delivers `call` once, and with probability `chance` once more after a random delay:
    /// in the background ([`Resend::new`]), or awaited for its reply
    /// ([`Resend::answering_late`]).
    async fn deliver<T, F, Fut>(&self, call: F) -> Result<T>
    where
        T: Send + 'static,
        F: Fn(Arc<dyn LockBackend>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<T>> + Send + 'static,
    {
        let first = call(self.inner.clone()).await;
        let delay = {
            let mut rng = rand::thread_rng();
            if !rng.gen_bool(self.chance) {
                return first;
            }
            self.max_delay.mul_f64(rng.gen::<f64>())
        };
        let inner = self.inner.clone();
        let resent = self.resent.clone();
        let again = tokio::spawn(async move {
            sleep(delay).await;
            resent.fetch_add(1, Ordering::Relaxed);
            call(inner).await
        });
        if !self.answer_late || first.is_err() {
            // The caller has its reply (or, when the first copy failed, its error, as a client
            // sees a failed request whose re-send it does not wait for); the second copy lands
            // in the background.
            return first;
        }
        match again.await {
            Ok(reply) => reply,
            Err(join) => match join.try_into_panic() {
                Ok(panic) => std::panic::resume_unwind(panic),
                // Only when the runtime shuts down: the reply never came.
                Err(_cancelled) => Err(Error::Unavailable {
                    backend: "resend",
                    endpoint: "the re-sent request".into(),
                    source: "cancelled before its reply came".into(),
                }),
            },
        }
    }
}

#[async_trait]
impl LockBackend for Resend {
    async fn acquire(&self, request: &AcquireRequest) -> Result<AcquireOutcome> {
        let request = request.clone();
        self.deliver(move |inner| {
            let request = request.clone();
            async move { inner.acquire(&request).await }
        })
        .await
    }

    async fn release(
        &self,
        name: &LockName,
        owner: &Owner,
        token: u64,
        attempt: AttemptId,
    ) -> Result<ReleaseOutcome> {
        let (name, owner) = (name.clone(), owner.clone());
        self.deliver(move |inner| {
            let (name, owner) = (name.clone(), owner.clone());
            async move { inner.release(&name, &owner, token, attempt).await }
        })
        .await
    }

    async fn extend(
        &self,
        name: &LockName,
        owner: &Owner,
        token: u64,
        lease: Duration,
    ) -> Result<bool> {
        let (name, owner) = (name.clone(), owner.clone());
        self.deliver(move |inner| {
            let (name, owner) = (name.clone(), owner.clone());
            async move { inner.extend(&name, &owner, token, lease).await }
        })
        .await
    }

    async fn abandon(&self, name: &LockName, owner: &Owner, attempt: AttemptId) -> Result<()> {
        let (name, owner) = (name.clone(), owner.clone());
        self.deliver(move |inner| {
            let (name, owner) = (name.clone(), owner.clone());
            async move { inner.abandon(&name, &owner, attempt).await }
        })
        .await
    }

    async fn force_release(&self, name: &LockName, token: u64) -> Result<bool> {
        let name = name.clone();
        self.deliver(move |inner| {
            let name = name.clone();
            async move { inner.force_release(&name, token).await }
        })
        .await
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

/// Through [`Resend`] (half of all requests delivered again up to 30 ms later), contended
/// locking with nested guards, `try_lock`, timeouts, cancellations and holds long enough for
/// a watchdog renewal keeps mutual exclusion, nested guards on one hold and increasing
/// tokens, no held guard is told its lease was lost, and the lock is left clean (no level, no
/// waiter) once the re-sends have landed. Two of the tasks share one handle (one owner), as
/// a handle may be shared: they may hold together, and exclusion is checked between owners.
/// Run twice: with the caller getting the first copy's reply ([`Resend::new`]), and the
/// second copy's ([`Resend::answering_late`]), so that every answer the backend gives a
/// request it already applied reaches the core.
pub async fn resends_are_harmless(backend: Arc<dyn LockBackend>) {
    let max_delay = Duration::from_millis(30);
    for (resending, check) in [
        (
            Resend::new(backend.clone(), 0.5, max_delay),
            "resends_are_harmless",
        ),
        (
            Resend::answering_late(backend.clone(), 0.5, max_delay),
            "resends_are_harmless (answering late)",
        ),
    ] {
        resend_workload(&backend, resending, max_delay, check).await;
    }
}

/// The workload of [`resends_are_harmless`] through `resending`, on a lock of its own.
async fn resend_workload(
    backend: &Arc<dyn LockBackend>,
    resending: Resend,
    max_delay: Duration,
    check: &'static str,
) {
    const TASKS: usize = 6;
    const ROUNDS: usize = 12;
    // Tasks 4 and 5 share one handle; the others have one each.
    const OWNER_OF_TASK: [usize; TASKS] = [0, 1, 2, 3, 4, 4];
    let resend_client = support::client(&(Arc::new(resending.clone()) as Arc<dyn LockBackend>));
    let client = support::client(backend);
    let name = support::lock_name("resends_are_harmless");
    let handles: Vec<_> = (0..=OWNER_OF_TASK[TASKS - 1])
        .map(|_| Arc::new(resend_client.fair_lock(&name).or_fail(check)))
        .collect();
    // How many tasks of each owner are inside, changed under one lock so that an owner's
    // entry and exit never race with another owner's check.
    let inside = Arc::new(Mutex::new(vec![0usize; handles.len()]));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (task, &owner) in OWNER_OF_TASK.iter().enumerate() {
        let lock = handles[owner].clone();
        let (inside, tokens) = (inside.clone(), tokens.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..ROUNDS {
                let asked = tokio::time::Instant::now();
                let guard = match round % 4 {
                    0 => match lock.try_lock_for(Duration::from_millis(20)).await {
                        Ok(guard) => guard,
                        Err(Error::Timeout { .. }) => continue,
                        Err(err) => panic!("{check}: task {task}: try_lock_for: {err}"),
                    },
                    1 => {
                        // A wait cancelled at a random point (or granted before that).
                        let wait = Duration::from_millis(rand::thread_rng().gen_range(0..10));
                        match tokio::time::timeout(wait, lock.lock()).await {
                            Ok(guard) => guard.or_fail(format!("{check}: task {task}: lock")),
                            Err(_cancelled) => continue,
                        }
                    }
                    _ => lock
                        .lock()
                        .await
                        .or_fail(format!("{check}: task {task}: lock")),
                };
                {
                    let mut inside = inside.lock().unwrap();
                    let others: usize = (inside.iter().enumerate())
                        .filter(|&(other, _)| other != owner)
                        .map(|(_, n)| n)
                        .sum();
                    assert_eq!(
                        others, 0,
                        "{check}: task {task} (owner {owner}) entered while {others} tasks of \
                         other owners were inside: {inside:?}"
                    );
                    inside[owner] += 1;
                }
                tokens.lock().unwrap().push((owner, guard.fencing_token()));
                let nested = lock
                    .lock()
                    .await
                    .or_fail(format!("{check}: task {task}: nested"));
                // The same hold, one more level. (Not always exactly one more than the outer
                // guard saw: a level of this owner's cancelled wait may still be there, until
                // its abandon lands in the background.)
                assert!(
                    nested.fencing_token() == guard.fencing_token() && nested.hold_count() >= 2,
                    "{check}: task {task}: a nested guard is another level of the same hold: \
                     outer token {} count {}, nested token {} count {}",
                    guard.fencing_token(),
                    guard.hold_count(),
                    nested.fencing_token(),
                    nested.hold_count()
                );
                tokio::task::yield_now().await;
                // Awaited, so that the next round starts from a released hold.
                nested
                    .unlock()
                    .await
                    .or_fail(format!("{check}: task {task}: nested unlock"));
                if round == 6 {
                    // Held past a watchdog renewal and (after a hand-over) the confirmation,
                    // so their requests are re-sent too.
                    sleep(support::WATCHDOG_LEASE / 3 + Duration::from_millis(20)).await;
                    // Its lease runs at least the watchdog lease from `asked` (and a hand-over
                    // longer): only a machine stalled past that may have let it run out.
                    assert!(
                        !guard.is_lease_lost() || asked.elapsed() >= support::WATCHDOG_LEASE,
                        "{check}: task {task}: a guard held for {:?} was told its lease was lost",
                        asked.elapsed()
                    );
                }
                inside.lock().unwrap()[owner] -= 1;
                guard
                    .unlock()
                    .await
                    .or_fail(format!("{check}: task {task}: unlock"));
            }
        }));
    }
    support::join_all(tasks).await;
    // Strictly increasing from holder to holder. The same owner may enter twice with one
    // token: a cancelled wait's level can still hold its hold (its abandon is in the
    // background), and the next round re-enters that hold; and the tasks sharing a handle
    // hold together.
    let tokens = tokens.lock().unwrap().clone();
    for pair in tokens.windows(2) {
        let ((first_owner, first), (second_owner, second)) = (pair[0], pair[1]);
        assert!(
            first < second || (first == second && first_owner == second_owner),
            "{check}: tokens must increase from holder to holder: {pair:?} (owner, token)"
        );
    }
    // The last re-sends land within `max_delay`; after them, nothing may be left.
    sleep(max_delay * 2).await;
    support::wait_clean(
        &client,
        &name,
        format!("{check}: clean once the re-sends landed"),
    )
    .await;
    assert!(resending.resent() > 0, "{check}: nothing was re-sent");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryBackend;

    fn memory() -> Arc<dyn LockBackend> {
        Arc::new(MemoryBackend::new())
    }

    #[tokio::test]
    async fn a_chance_that_is_not_a_number_never_resends() {
        let never = Resend::answering_late(memory(), f64::NAN, Duration::from_millis(1));
        let client = crate::LockClient::new(never.clone());
        let guard = client.fair_lock("x").unwrap().lock().await.unwrap();
        guard.unlock().await.unwrap();
        assert_eq!(never.resent(), 0);
    }

    /// A re-entry's first copy makes the count 2; the outer level is released before the
    /// second copy lands, which answers with the hold's count then: 1. The caller gets that
    /// (through `Resend::new` it would get 2).
    #[tokio::test(start_paused = true)]
    async fn answering_late_returns_the_second_copys_reply() {
        let backend = memory();
        let late = Resend::answering_late(backend.clone(), 1.0, Duration::from_millis(50));
        assert_eq!(late.name(), "memory", "metrics name the wrapped backend");
        let late: Arc<dyn LockBackend> = Arc::new(late);
        let name = LockName::new("x").unwrap();
        let owner = Owner::unique();
        let (outer, inner) = (AttemptId::random(), AttemptId::random());
        let lease = Duration::from_secs(5);
        let AcquireOutcome::Granted(grant) =
            raw_acquire_as(&backend, "x", &owner, outer, lease, lease, false).await
        else {
            panic!("a free lock is granted");
        };
        let reentry = {
            let (late, owner) = (late.clone(), owner.clone());
            tokio::spawn(async move {
                raw_acquire_as(&late, "x", &owner, inner, lease, lease, false).await
            })
        };
        // The first copy lands at once; the second waits for the (paused) clock.
        while backend
            .inspect(&name)
            .await
            .unwrap()
            .holder
            .is_none_or(|h| h.hold_count < 2)
        {
            tokio::task::yield_now().await;
        }
        let released = backend.release(&name, &owner, grant.token, outer).await;
        assert_eq!(released.unwrap(), ReleaseOutcome::Released { remaining: 1 });
        match reentry.await.unwrap() {
            AcquireOutcome::Granted(again) => {
                assert_eq!((again.token, again.hold_count), (grant.token, 1));
            }
            other => panic!("the re-entry holds its level: {other:?}"),
        }
    }
}
