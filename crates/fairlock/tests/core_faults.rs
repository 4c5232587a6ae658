//! Faults between the core and a store, on paused time: a hand-over whose confirmation
//! stalls while a sibling guard of the same owner holds, and a nested grant whose reply and
//! clean-up are both lost. Found by review; each test failed on the code before its fix. And
//! seeded schedules of such faults against handles shared by tasks.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use fairlock::backend::{
    AcquireOutcome, AcquireRequest, AttemptId, LockBackend, LockState, LockSummary, ReleaseOutcome,
    Watch, RESEND_HORIZON,
};
use fairlock::{
    Error, FairLock, LockClient, LockGuard, LockName, LockOptions, MemoryBackend, Owner, Result,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// `MemoryBackend` with two faults, each switched on by a flag: the confirmation of a
/// hand-over (an `acquire` that does not queue, by an attempt that queued) stalls 10 s; and a
/// link that loses the next acquire's reply and then fails the abandon that follows.
#[derive(Debug, Clone, Default)]
struct Faulty {
    inner: MemoryBackend,
    queued: Arc<Mutex<HashSet<AttemptId>>>,
    stall_confirmations: Arc<AtomicBool>,
    lose_next_reply: Arc<AtomicBool>,
    /// Like `lose_next_reply`, but the loss is noticed only 900 ms later (a command timeout).
    lose_next_reply_slowly: Arc<AtomicBool>,
    fail_next_abandon: Arc<AtomicBool>,
    /// Releases fail as `Unavailable` until this instant (a store failing over).
    releases_down_until: Arc<Mutex<Option<tokio::time::Instant>>>,
    /// The next release is answered as done but never reaches the store: a release the old
    /// primary acknowledged and a failover then lost.
    lose_next_release: Arc<AtomicBool>,
    /// The next release is applied, its reply lost, and sent again by the link itself (as a
    /// Redis client re-sends after a reconnect): the caller sees only the second reply.
    resend_next_release: Arc<AtomicBool>,
    /// The next release is applied and its reply lost: the caller sees an outage, which
    /// then lasts `outage_after_lost_reply` for releases.
    lose_next_release_reply: Arc<AtomicBool>,
    outage_after_lost_reply: Arc<Mutex<Duration>>,
    /// The next force release is applied, its reply lost, and sent again by the link itself;
    /// the caller sees only the second reply, `false` (as from a store that no longer
    /// remembers the first: past the resend horizon, or one written before stores had to).
    resend_next_force_release: Arc<AtomicBool>,
    /// How many force releases reached the store.
    force_releases: Arc<AtomicUsize>,
    /// Force releases fail as `Unavailable` and never reach the store.
    force_releases_down: Arc<AtomicBool>,
    /// Every force release waits this long before it reaches the store.
    force_release_delay: Arc<Mutex<Duration>>,
    /// Force releases fail as `Unavailable` at once, and reach the store this long after (a
    /// request the client sent again after a reconnect).
    force_releases_land_late: Arc<Mutex<Option<Duration>>>,
    /// The store forgets the next hand-over by the time it is confirmed (a failover that
    /// lost the last writes): the lock is free and the attempt unknown, so the confirmation
    /// is granted a new hold. Played by freeing the hold and renaming the attempt.
    forget_next_hand_over: Arc<AtomicBool>,
    renamed: Arc<Mutex<HashMap<AttemptId, AttemptId>>>,
    /// Every acquire waits this long before it reaches the store (a slow link), so that
    /// several calls of one handle are under way together.
    acquire_delay: Arc<Mutex<Duration>>,
    /// The next acquire is delivered again after `resend_delay`, its second reply dropped (a
    /// client re-sending after a reconnect, the first copy having landed).
    resend_next_acquire: Arc<AtomicBool>,
    resend_delay: Arc<Mutex<Duration>>,
    /// Confirmations of a hand-over wait for `confirm_gate` before they reach the store.
    gate_confirmations: Arc<AtomicBool>,
    confirm_gate: Arc<tokio::sync::Notify>,
    /// Extensions are applied, and their replies wait for `extend_gate`.
    gate_extends: Arc<AtomicBool>,
    extend_gate: Arc<tokio::sync::Notify>,
    /// Every abandon waits this long before it reaches the store.
    abandon_delay: Arc<Mutex<Duration>>,
    /// Every acquire's reply comes this long after the store applied it.
    acquire_reply_delay: Arc<Mutex<Duration>>,
    /// Every release waits this long before it reaches the store.
    release_delay: Arc<Mutex<Duration>>,
    /// Once a release has reached the store, every acquire stalls 10 s (the store pauses).
    stall_acquires_after_release: Arc<AtomicBool>,
    released: Arc<AtomicBool>,
    /// The next acquire fails as `Unavailable` at once, and reaches the store this long after
    /// (a request the link held and delivered late, after later ones).
    deliver_next_acquire_late: Arc<Mutex<Option<Duration>>>,
    /// Every release's reply comes this long after the store applied it.
    release_reply_delay: Arc<Mutex<Duration>>,
    /// `Queued` replies say to come back after `Duration::MAX` (a backend's bad hint).
    endless_retry_after: Arc<AtomicBool>,
    /// Every wake-up is lost: waiters hear of the lock only at their heartbeats.
    lose_wakeups: Arc<AtomicBool>,
    /// Confirmations fail at once (a client that fails fast on a dead connection), counted.
    fail_confirmations: Arc<AtomicBool>,
    failed_confirmations: Arc<AtomicUsize>,
}

impl Faulty {
    /// The attempt as the inner store knows it.
    fn stored(&self, attempt: AttemptId) -> AttemptId {
        *self
            .renamed
            .lock()
            .unwrap()
            .get(&attempt)
            .unwrap_or(&attempt)
    }
}

fn down() -> Error {
    Error::Unavailable {
        backend: "faulty",
        endpoint: "test".into(),
        source: "link down".into(),
    }
}

#[async_trait]
impl LockBackend for Faulty {
    async fn acquire(&self, request: &AcquireRequest) -> Result<AcquireOutcome> {
        let delay = *self.acquire_delay.lock().unwrap();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        if self.stall_acquires_after_release.load(SeqCst) && self.released.load(SeqCst) {
            tokio::time::sleep(Duration::from_secs(10)).await;
        }
        let confirming = !request.queue && self.queued.lock().unwrap().contains(&request.attempt);
        if request.queue {
            self.queued.lock().unwrap().insert(request.attempt);
        } else if confirming && self.stall_confirmations.load(SeqCst) {
            tokio::time::sleep(Duration::from_secs(10)).await;
        }
        if confirming && self.fail_confirmations.load(SeqCst) {
            self.failed_confirmations.fetch_add(1, SeqCst);
            return Err(down());
        }
        if confirming && self.gate_confirmations.load(SeqCst) {
            self.confirm_gate.notified().await;
        }
        if confirming && self.forget_next_hand_over.swap(false, SeqCst) {
            if let Some(holder) = self.inner.inspect(&request.name).await?.holder {
                self.inner
                    .force_release(&request.name, holder.token)
                    .await?;
            }
            self.renamed
                .lock()
                .unwrap()
                .insert(request.attempt, AttemptId::random());
        }
        let mut request = request.clone();
        request.attempt = self.stored(request.attempt);
        if let Some(delay) = self.deliver_next_acquire_late.lock().unwrap().take() {
            let (inner, late) = (self.inner.clone(), request.clone());
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let _ = inner.acquire(&late).await;
            });
            return Err(down());
        }
        if self.resend_next_acquire.swap(false, SeqCst) {
            let (inner, again) = (self.inner.clone(), request.clone());
            let delay = *self.resend_delay.lock().unwrap();
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let _ = inner.acquire(&again).await;
            });
        }
        let outcome = self.inner.acquire(&request).await?;
        let reply_delay = *self.acquire_reply_delay.lock().unwrap();
        if !reply_delay.is_zero() {
            tokio::time::sleep(reply_delay).await;
        }
        if self.lose_next_reply.swap(false, SeqCst) {
            return Err(down());
        }
        if let AcquireOutcome::Queued { last_token, .. } = outcome {
            if self.endless_retry_after.load(SeqCst) {
                return Ok(AcquireOutcome::Queued {
                    retry_after: Some(Duration::MAX),
                    last_token,
                });
            }
        }
        if self.lose_next_reply_slowly.swap(false, SeqCst) {
            tokio::time::sleep(Duration::from_millis(900)).await;
            return Err(down());
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
        let delay = *self.release_delay.lock().unwrap();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let down_until = *self.releases_down_until.lock().unwrap();
        if down_until.is_some_and(|until| tokio::time::Instant::now() < until) {
            return Err(down());
        }
        if self.lose_next_release.swap(false, SeqCst) {
            return Ok(ReleaseOutcome::Released { remaining: 0 });
        }
        let attempt = self.stored(attempt);
        let outcome = self.inner.release(name, owner, token, attempt).await?;
        self.released.store(true, SeqCst);
        let reply_delay = *self.release_reply_delay.lock().unwrap();
        if !reply_delay.is_zero() {
            tokio::time::sleep(reply_delay).await;
        }
        if self.resend_next_release.swap(false, SeqCst) {
            return self.inner.release(name, owner, token, attempt).await;
        }
        if self.lose_next_release_reply.swap(false, SeqCst) {
            let outage = *self.outage_after_lost_reply.lock().unwrap();
            *self.releases_down_until.lock().unwrap() = Some(tokio::time::Instant::now() + outage);
            return Err(down());
        }
        Ok(outcome)
    }

    async fn extend(
        &self,
        name: &LockName,
        owner: &Owner,
        token: u64,
        lease: Duration,
    ) -> Result<bool> {
        let extended = self.inner.extend(name, owner, token, lease).await;
        if self.gate_extends.load(SeqCst) {
            self.extend_gate.notified().await;
        }
        extended
    }

    async fn abandon(&self, name: &LockName, owner: &Owner, attempt: AttemptId) -> Result<()> {
        let delay = *self.abandon_delay.lock().unwrap();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        if self.fail_next_abandon.swap(false, SeqCst) {
            return Err(down());
        }
        self.inner.abandon(name, owner, self.stored(attempt)).await
    }

    async fn force_release(&self, name: &LockName, token: u64) -> Result<bool> {
        if self.force_releases_down.load(SeqCst) {
            return Err(down());
        }
        if let Some(delay) = *self.force_releases_land_late.lock().unwrap() {
            let (inner, name) = (self.inner.clone(), name.clone());
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let _ = inner.force_release(&name, token).await;
            });
            return Err(down());
        }
        self.force_releases.fetch_add(1, SeqCst);
        let delay = *self.force_release_delay.lock().unwrap();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let freed = self.inner.force_release(name, token).await?;
        if self.resend_next_force_release.swap(false, SeqCst) {
            self.force_releases.fetch_add(1, SeqCst);
            self.inner.force_release(name, token).await?;
            return Ok(false);
        }
        Ok(freed)
    }

    async fn inspect(&self, name: &LockName) -> Result<LockState> {
        self.inner.inspect(name).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockSummary>> {
        self.inner.list(prefix).await
    }

    async fn watch(&self, name: &LockName, owner: &Owner) -> Result<Watch> {
        let watch = self.inner.watch(name, owner).await?;
        if !self.lose_wakeups.load(SeqCst) {
            return Ok(watch);
        }
        // Every wake-up lost: the watch keeps its own, unused, sender.
        drop(watch);
        let (sender, watch) = Watch::channel();
        Ok(watch.with_registration(sender))
    }
}

/// An owner (fixed 30 s lease) is handed lock "x" by another owner's release, then nests a
/// second guard on that hold: the hand-over guard, still unconfirmed, and the nested one. Also
/// returns the client, the owner's handle and a third owner's handle.
async fn handed_and_nested(
    backend: &Faulty,
) -> (LockClient, Arc<FairLock>, FairLock, LockGuard, LockGuard) {
    let client = LockClient::new(backend.clone());
    let owner = Arc::new(
        client
            .fair_lock("x")
            .unwrap()
            .with_lease(Duration::from_secs(30))
            .unwrap(),
    );
    let other = client.fair_lock("x").unwrap();
    let handed = hand_over(&client, &owner, || {}).await;
    let nested = owner.lock().await.unwrap();
    assert_eq!(nested.hold_count(), 2);
    (client, owner, other, handed, nested)
}

/// Lock "x" handed over to `owner` by another owner's release, `just_before` that release:
/// the guard made from the wake-up, not confirmed yet.
async fn hand_over(
    client: &LockClient,
    owner: &Arc<FairLock>,
    just_before: impl FnOnce(),
) -> LockGuard {
    let holder = client.fair_lock("x").unwrap();
    let held = holder.lock().await.unwrap();
    let waiting = {
        let owner = owner.clone();
        tokio::spawn(async move { owner.lock().await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    just_before();
    held.unlock().await.unwrap();
    waiting.await.unwrap().unwrap()
}

/// A guard made from a hand-over's wake-up holds its level only once confirmed. If the
/// confirmation stalls past the hand-over's life while a nested guard of the same owner keeps
/// the hold (and pushes its lease out), the hand-over guard must report its lease lost, not
/// go on without a level while another owner takes the lock.
#[tokio::test(start_paused = true)]
async fn a_hand_over_that_lapses_unconfirmed_is_reported_lost() {
    let backend = Faulty::default();
    backend.stall_confirmations.store(true, SeqCst);
    let (_client, _owner, other, handed, nested) = handed_and_nested(&backend).await;

    // The hand-over's pending level lapses (waiter TTL 5 s): its guard has no level now.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(
        handed.is_lease_lost(),
        "the hand-over guard has no level in the store but does not know it"
    );
    assert!(!nested.is_lease_lost(), "the nested guard's level is fine");
    nested.unlock().await.unwrap();
    // The store has no level left: another owner takes the lock, and the stale guard knows.
    let taken = other.try_lock().await.unwrap();
    assert!(matches!(
        handed.unlock().await,
        Err(Error::LeaseLost { .. })
    ));
    taken.unlock().await.unwrap();
}

/// The same with confirmations that fail at once: the retries stop at the hand-over's
/// deadline (not every 20 ms for as long as the store keeps failing), and the guard is lost.
#[tokio::test(start_paused = true)]
async fn confirmations_failing_at_once_stop_at_the_deadline() {
    let backend = Faulty::default();
    backend.fail_confirmations.store(true, SeqCst);
    let (_client, _owner, _other, handed, nested) = handed_and_nested(&backend).await;
    tokio::time::timeout(Duration::from_secs(6), handed.lease_lost())
        .await
        .expect("the hand-over guard was not told");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let tries = backend.failed_confirmations.load(SeqCst);
    assert!(tries > 0, "no confirmation was tried");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        backend.failed_confirmations.load(SeqCst),
        tries,
        "confirmations went on after the deadline"
    );
    assert!(!nested.is_lease_lost(), "the nested guard's level is fine");
    nested.unlock().await.unwrap();
    drop(handed);
}

/// The same, with the lapsed hand-over guard released first: its release finds no level
/// (`NotHeld`), which its own lapse explains, so the nested guard, whose level and lease are
/// fine, must not be told its lease was lost, and keeps working.
#[tokio::test(start_paused = true)]
async fn releasing_a_lapsed_hand_over_guard_leaves_its_sibling_held() {
    let backend = Faulty::default();
    backend.stall_confirmations.store(true, SeqCst);
    let (_client, _owner, other, handed, nested) = handed_and_nested(&backend).await;

    // The hand-over's pending level lapses (waiter TTL 5 s), then its guard is released.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(handed.is_lease_lost());
    assert!(matches!(
        handed.unlock().await,
        Err(Error::LeaseLost { .. })
    ));
    assert!(
        !nested.is_lease_lost(),
        "the nested guard's level and lease are fine, but it was told its lease was lost"
    );
    nested
        .extend(Duration::from_secs(30))
        .await
        .expect("the nested guard still holds the lock");
    assert!(
        other.try_lock().await.is_err(),
        "the nested guard's level keeps the lock"
    );
    nested.unlock().await.unwrap();
    other.try_lock().await.unwrap().unlock().await.unwrap();
}

/// A hand-over's confirmation answered `Busy` while the pending level surely still lives
/// (before its deadline) proves the hold itself ended (an operator freed it): every guard of
/// the hold learns its lease was lost then, not only the hand-over guard. A nested guard with
/// a fixed lease and no renewals would otherwise go on believing it holds for its whole
/// lease while another owner holds the lock.
#[tokio::test(start_paused = true)]
async fn a_confirmation_that_finds_the_hold_gone_tells_every_guard() {
    let backend = Faulty::default();
    let (client, _owner, other, handed, nested) = handed_and_nested(&backend).await;

    // Freed by an operator before the confirmation (after a tenth of the 5 s waiter TTL,
    // at most 100 ms) goes out; another owner takes the lock.
    assert!(client.force_unlock("x").await.unwrap());
    let taken = other.try_lock().await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        handed.is_lease_lost(),
        "the confirmation found the hand-over gone"
    );
    assert!(
        nested.is_lease_lost(),
        "the hold is gone (another owner holds the lock), but the nested guard was not told"
    );
    taken.unlock().await.unwrap();
}

/// A confirmation that the store answers with a grant of a new hold (it had forgotten the
/// hand-over, and the lock was free) leaves that hold to nobody: it is given back at once, not
/// left to block the lock for its whole lease.
#[tokio::test(start_paused = true)]
async fn a_confirmation_granted_a_new_hold_gives_it_back() {
    let backend = Faulty::default();
    let client = LockClient::new(backend.clone());
    let owner = Arc::new(client.fair_lock("x").unwrap());
    let other = client.fair_lock("x").unwrap();
    let handed = hand_over(&client, &owner, || {
        backend.forget_next_hand_over.store(true, SeqCst);
    })
    .await;
    let token = handed.fencing_token();

    // Past the confirmation (a tenth of the 5 s waiter TTL, at most 100 ms).
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(handed.is_lease_lost(), "its hold is gone from the store");
    let taken = other.try_lock().await.unwrap_or_else(|err| {
        panic!("the new hold the confirmation was granted was left in place: {err}")
    });
    assert!(taken.fencing_token() > token);
    taken.unlock().await.unwrap();
    drop(handed);
}

/// A nested grant whose reply is lost, and whose abandon fails once, is still given back: the
/// abandon is retried (it is harmless to repeat), so the hold does not keep a level nobody
/// holds while the outer guard's watchdog renews it.
#[tokio::test(start_paused = true)]
async fn a_lost_nested_grant_is_given_back_even_if_abandon_fails_once() {
    let backend = Faulty::default();
    let client = LockClient::new(backend.clone());
    let owner = client.fair_lock("x").unwrap();
    let other = client.fair_lock("x").unwrap();
    let outer = owner.lock().await.unwrap();
    backend.lose_next_reply.store(true, SeqCst);
    backend.fail_next_abandon.store(true, SeqCst);
    // try_lock does not retry: its lost grant must be given back by abandoning.
    assert!(owner.try_lock().await.is_err(), "the nested reply is lost");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let holder = client.state("x").await.unwrap().holder.unwrap();
    assert_eq!(
        holder.hold_count, 1,
        "one live guard, one level: {holder:?}"
    );
    outer.unlock().await.unwrap();
    other.try_lock().await.unwrap().unlock().await.unwrap();
}

/// `lock()` rides out a lost reply: it asks again as the same attempt and adopts the grant
/// the store made, one level, not two.
#[tokio::test(start_paused = true)]
async fn lock_adopts_a_grant_whose_reply_was_lost() {
    let backend = Faulty::default();
    let client = LockClient::new(backend.clone());
    let owner = client.fair_lock("x").unwrap();
    let other = client.fair_lock("x").unwrap();
    backend.lose_next_reply.store(true, SeqCst);
    let guard = owner.lock().await.unwrap();
    assert_eq!(guard.hold_count(), 1);
    let holder = client.state("x").await.unwrap().holder.unwrap();
    assert_eq!(holder.hold_count, 1, "{holder:?}");
    guard.unlock().await.unwrap();
    other.try_lock().await.unwrap().unlock().await.unwrap();
}

/// A grant whose reply is lost only after 900 ms, found again by `lock()`'s retry: most of
/// its lease had passed before the caller saw it, so it is renewed (`extend`) before use and
/// counted from that request. The guard never believes it holds longer than the store says:
/// 1.05 s after the first call (time is paused, so exactly) the hold is still there, the guard
/// knows it, and its lease ends no later than the store's.
#[tokio::test(start_paused = true)]
async fn a_late_grant_found_by_a_retry_is_renewed_before_use() {
    let backend = Faulty::default();
    let client = LockClient::new(backend.clone());
    let lease = Duration::from_secs(1);
    let owner = client.fair_lock("x").unwrap().with_lease(lease).unwrap();
    let other = client.fair_lock("x").unwrap();
    backend.lose_next_reply_slowly.store(true, SeqCst);
    let guard = owner.lock().await.unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    let refused = other.try_lock().await;
    assert!(
        matches!(refused, Err(fairlock::Error::WouldBlock { .. })),
        "the late grant was not renewed: its 1 s lease from the first call ran out: {:?}",
        refused.as_ref().map(|_| "another owner got a guard")
    );
    assert!(!guard.is_lease_lost());
    let stored = client.state("x").await.unwrap().holder.unwrap();
    let believed = guard.lease_remaining();
    assert!(
        believed <= stored.lease_remaining,
        "the guard believes {believed:?} left, the store {:?}",
        stored.lease_remaining
    );
    assert!(believed > Duration::from_millis(500), "{believed:?}");
    guard.unlock().await.unwrap();
}

/// Lock "x" of a new owner with a fixed `lease`, never renewed.
async fn held_for(client: &LockClient, lease: Duration) -> LockGuard {
    let lock = client.fair_lock("x").unwrap().with_lease(lease).unwrap();
    lock.lock().await.unwrap()
}

/// A queueing call fails, and the link delivers it late, after the retry that queued the
/// attempt: it is the call that grants (the lock fell free meanwhile), and the next heartbeat
/// only finds that grant, without lengthening its lease. The guard must count the lease from
/// the late call, not from the heartbeat: it never believes it holds longer than the store.
#[tokio::test(start_paused = true)]
async fn a_grant_made_by_a_late_delivered_call_counts_from_that_call() {
    let backend = Faulty::default();
    // The late call's clearing of the dead head would wake the waiter at once, in the same
    // instant: its call's lease would then count from there too, whichever it counted from.
    backend.lose_wakeups.store(true, SeqCst);
    let client = LockClient::new(backend.clone());
    let start = tokio::time::Instant::now();
    // Held until 10 s (never renewed), a dead waiter at the head until 11 s: the queued
    // attempt is told no time to come back, and heart-beats every second.
    let held = held_for(&client, Duration::from_secs(10)).await;
    let dead = AcquireRequest {
        name: LockName::new("x").unwrap(),
        owner: Owner::unique(),
        attempt: AttemptId::random(),
        lease: Duration::from_secs(1),
        waiter_ttl: Duration::from_secs(11),
        queue: true,
    };
    let queued = backend.inner.acquire(&dead).await.unwrap();
    assert!(
        matches!(queued, AcquireOutcome::Queued { .. }),
        "{queued:?}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let options = LockOptions::default()
        .with_lease(Duration::from_secs(2))
        .with_waiter_ttl(Duration::from_secs(3));
    let waiter = client
        .fair_lock("x")
        .unwrap()
        .with_options(options)
        .unwrap();
    // The first call lands at 11.05 s, when the lock is free and the attempt heads the queue.
    *backend.deliver_next_acquire_late.lock().unwrap() = Some(Duration::from_millis(10_550));
    let guard = waiter.lock().await.unwrap();
    let stored = client.state("x").await.unwrap().holder.unwrap();
    assert!(
        tokio::time::Instant::now() > start + Duration::from_millis(11_050),
        "granted before the late call landed"
    );
    let believed = guard.lease_remaining();
    assert!(
        believed <= stored.lease_remaining,
        "the guard believes {believed:?} left, the store {:?}",
        stored.lease_remaining
    );
    drop(held);
    guard.unlock().await.unwrap();
}

/// As above, on the hand-over path: the late call lands after the release handed the lock
/// to its attempt, and confirms the hand-over, its lease counted from then. A guard made on the
/// wake-up alone would confirm later, find the level confirmed, and count from its own call.
#[tokio::test(start_paused = true)]
async fn a_hand_over_confirmed_by_a_late_delivered_call_counts_from_that_call() {
    let backend = Faulty::default();
    let client = LockClient::new(backend.clone());
    let held = held_for(&client, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let waiter = client
        .fair_lock("x")
        .unwrap()
        .with_lease(Duration::from_secs(20))
        .unwrap();
    // A lease longer than the pending level's life (the waiter TTL), so the confirmation
    // sets it. The first call lands at 1.02 s, 20 ms after the hand-over.
    *backend.deliver_next_acquire_late.lock().unwrap() = Some(Duration::from_millis(520));
    let waiting = tokio::spawn(async move { waiter.lock().await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    held.unlock().await.unwrap();
    let guard = waiting.await.unwrap().unwrap();
    // Past the late call and any confirmation.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stored = client.state("x").await.unwrap().holder.unwrap();
    assert!(stored.confirmed, "{stored:?}");
    let believed = guard.lease_remaining();
    assert!(
        believed <= stored.lease_remaining,
        "the guard believes {believed:?} left, the store {:?}",
        stored.lease_remaining
    );
    guard.unlock().await.unwrap();
}

/// A backend's `retry_after` hint too large to add to the clock is not a panic: the waiter
/// heart-beats as usual, and gets the lock when it is released.
#[tokio::test(start_paused = true)]
async fn a_retry_after_past_the_end_of_time_is_no_panic() {
    let backend = Faulty::default();
    let client = LockClient::new(backend.clone());
    let held = client.fair_lock("x").unwrap().lock().await.unwrap();
    backend.endless_retry_after.store(true, SeqCst);
    let waiter = client.fair_lock("x").unwrap();
    let waiting = tokio::spawn(async move { waiter.lock().await.map(|guard| guard.hold_count()) });
    tokio::time::sleep(Duration::from_secs(1)).await;
    held.unlock().await.unwrap();
    let count = tokio::time::timeout(Duration::from_secs(5), waiting).await;
    assert!(matches!(count, Ok(Ok(Ok(1)))), "{count:?}");
}

/// A guard made from a hand-over's wake-up and released at once, before it needed confirming:
/// the store applies the release in time, but its reply comes after the guard's unconfirmed
/// level would have lapsed. `Released` proves the level was there when the release removed
/// it, so the unlock succeeds, as a confirmed guard's does.
#[tokio::test(start_paused = true)]
async fn a_hand_over_released_in_time_is_not_lost_for_a_slow_reply() {
    let backend = Faulty::default();
    let client = LockClient::new(backend.clone());
    let owner = Arc::new(client.fair_lock("x").unwrap());
    let guard = hand_over(&client, &owner, || {}).await;
    *backend.release_reply_delay.lock().unwrap() = Duration::from_secs(6);
    let released = guard.unlock().await;
    assert!(released.is_ok(), "{released:?}");
}

/// A guard with the watchdog that joins a hold made by a fixed-lease handle of the same owner
/// (whose own watchdog lease is 5 minutes) is renewed at its own pace: the hold's keeper was
/// made with the first handle's options, and renewed first after 100 s, long after the 30 s
/// the re-entry's lease gave: the watchdog guard lost the lock while alive.
#[tokio::test(start_paused = true)]
async fn a_watchdog_guard_joining_a_fixed_lease_hold_is_renewed() {
    let client = LockClient::new(MemoryBackend::new());
    let owner = Owner::unique();
    let fixed = client
        .fair_lock_as("x", owner.clone())
        .unwrap()
        .with_options(
            LockOptions::default()
                .with_lease(Duration::from_secs(2))
                .with_watchdog_lease(Duration::from_secs(300)),
        )
        .unwrap();
    let watched = client.fair_lock_as("x", owner).unwrap();
    let first = fixed.lock().await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let second = watched.lock().await.unwrap();
    assert_eq!(second.hold_count(), 2);
    tokio::time::sleep(Duration::from_secs(90)).await;
    assert!(
        !second.is_lease_lost(),
        "the watchdog guard lost its lease while alive"
    );
    assert!(second.is_held().await.unwrap());
    drop(first);
    second.unlock().await.unwrap();
}

/// And once such a guard is gone, the hold is renewed with the lease the guards left ask for
/// again: a 30 s watchdog guard that came and went does not leave a 5-minute one renewed with
/// 30 s leases (an outage it was set to ride out would then end the lease).
#[tokio::test(start_paused = true)]
async fn a_hold_renews_with_the_watchdog_lease_of_the_guards_left() {
    let client = LockClient::new(MemoryBackend::new());
    let owner = Owner::unique();
    let long = client
        .fair_lock_as("x", owner.clone())
        .unwrap()
        .with_options(LockOptions::default().with_watchdog_lease(Duration::from_secs(300)))
        .unwrap();
    let short = client.fair_lock_as("x", owner).unwrap();
    let first = long.lock().await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    short.lock().await.unwrap().unlock().await.unwrap();
    // Past the end of the first lease (renewals never shorten it): 400 s.
    tokio::time::sleep(Duration::from_secs(399)).await;
    let stored = client.state("x").await.unwrap().holder.unwrap();
    assert!(
        stored.lease_remaining > Duration::from_secs(150),
        "renewed with {:?} left, not the 300 s the guard left asks for",
        stored.lease_remaining
    );
    assert!(!first.is_lease_lost());
    first.unlock().await.unwrap();
}

/// `unlock()` during a store outage shorter than the outage budget (a failover of a few
/// seconds) waits for the store and releases, instead of giving up after a few quick retries
/// (about 0.75 s) and reporting the outage.
#[tokio::test(start_paused = true)]
async fn unlock_rides_out_an_outage_within_the_budget() {
    let backend = Faulty::default();
    let client = LockClient::new(backend.clone());
    let lock = client.fair_lock("failover").unwrap();
    let guard = lock.lock().await.unwrap();
    let started = tokio::time::Instant::now();
    *backend.releases_down_until.lock().unwrap() = Some(started + Duration::from_secs(3));
    guard
        .unlock()
        .await
        .expect("released once the store is back");
    assert!(started.elapsed() >= Duration::from_secs(3));
    assert!(lock.state().await.unwrap().holder.is_none());

    // Longer than the budget (30 s by default): the outage is reported.
    let guard = lock.lock().await.unwrap();
    let started = tokio::time::Instant::now();
    *backend.releases_down_until.lock().unwrap() = Some(started + Duration::from_secs(60));
    let error = guard.unlock().await.unwrap_err();
    assert!(matches!(error, Error::Unavailable { .. }), "{error}");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(30) && waited < Duration::from_secs(32),
        "{waited:?}"
    );
}

/// A release applied by the store whose reply was lost, and that the link sent again unseen
/// (fred re-sends after a reconnect): the second copy finds the hold gone. That is the
/// release having worked, not a lost lease. Failed before the store remembered releases: it
/// answered the re-send `NotHeld`, and the core, which had not retried, reported `LeaseLost`.
#[tokio::test(start_paused = true)]
async fn a_release_the_link_sent_twice_is_not_a_lost_lease() {
    let backend = Faulty::default();
    let client = LockClient::new(backend.clone());
    let lock = client.fair_lock("resent").unwrap();
    let guard = lock.lock().await.unwrap();
    backend.resend_next_release.store(true, SeqCst);
    guard
        .unlock()
        .await
        .expect("a re-sent release is a release");
    assert!(lock.state().await.unwrap().holder.is_none());
}

/// A release that finds the lease already lost, and whose reply is lost, is retried by the
/// core: the retry finds the hold gone too. The lease was lost all the same and `unlock()`
/// must say so. Failed when the core took a retried `NotHeld` as the first try's release.
#[tokio::test(start_paused = true)]
async fn a_retried_release_that_found_the_lease_lost_reports_it() {
    let backend = Faulty::default();
    let client = LockClient::new(backend.clone());
    let lock = client.fair_lock("revoked").unwrap();
    let guard = lock.lock().await.unwrap();
    // Revoked behind the watchdog's back: only the release can find out.
    let name = LockName::new("revoked").unwrap();
    assert!(backend
        .inner
        .force_release(&name, guard.fencing_token())
        .await
        .unwrap());
    backend.lose_next_release_reply.store(true, SeqCst);
    let error = guard.unlock().await.unwrap_err();
    assert!(matches!(error, Error::LeaseLost { .. }), "{error}");
}

/// A release applied by the store, whose reply was lost, and then an outage longer than the
/// store remembers releases for (`RESEND_HORIZON`, 60 s) within a longer outage budget: the
/// retry finds neither the level nor the record of its release. Whether the lease was lost is
/// unknown, so `unlock()` must not claim it was, nor tell the sibling guard of the same hold
/// (which still holds it) that it lost its lease. Found by review: failed with `LeaseLost`
/// and the sibling's lost-lease signal fired.
#[tokio::test(start_paused = true)]
async fn a_release_retried_past_the_resend_horizon_is_not_called_lost() {
    let backend = Faulty::default();
    let client = LockClient::new(backend.clone())
        .with_options(
            LockOptions::default()
                .with_lease(Duration::from_secs(600))
                .with_outage_budget(Duration::from_secs(120)),
        )
        .unwrap();
    let lock = client.fair_lock("long-outage").unwrap();
    let outer = lock.lock().await.unwrap();
    let inner = lock.lock().await.unwrap();
    *backend.outage_after_lost_reply.lock().unwrap() = Duration::from_secs(61);
    backend.lose_next_release_reply.store(true, SeqCst);
    let error = inner.unlock().await.unwrap_err();
    assert!(matches!(error, Error::Unavailable { .. }), "{error}");
    assert!(!outer.is_lease_lost(), "the sibling guard still holds");
    assert_eq!(lock.state().await.unwrap().holder.unwrap().hold_count, 1);
    outer.unlock().await.expect("the sibling releases normally");
}

/// `force_unlock` frees the hold it read, and that one only. When the link sends the force
/// release again unseen (its first reply lost), and the second copy answers `false` (a store
/// that no longer remembers the first), the lock has meanwhile gone to the waiter first in
/// line, who must keep it. Failed when
/// `force_unlock` took the answer as "the hold changed", read the lock again and freed the
/// waiter's new hold too.
#[tokio::test(start_paused = true)]
async fn a_force_unlock_sent_twice_frees_one_hold() {
    let backend = Faulty::default();
    let client = LockClient::new(backend.clone());
    let stuck = client.fair_lock("stuck").unwrap();
    let next = client.fair_lock("stuck").unwrap();
    let guard = stuck.lock().await.unwrap();
    let waiter = tokio::spawn(async move { next.lock().await });
    while stuck.state().await.unwrap().waiters.is_empty() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    backend.resend_next_force_release.store(true, SeqCst);
    client.force_unlock("stuck").await.unwrap();
    assert_eq!(
        backend.force_releases.load(SeqCst),
        2,
        "one force release, sent twice by the link, and no other"
    );
    let next_guard = waiter.await.unwrap().expect("the waiter gets the lock");
    assert_eq!(
        next_guard.fencing_token(),
        guard.fencing_token() + 1,
        "the waiter keeps the hand-over of the hold that was freed"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !next_guard.is_lease_lost(),
        "the waiter's hold was freed too"
    );
    let holder = stuck
        .state()
        .await
        .unwrap()
        .holder
        .expect("the waiter holds");
    assert_eq!(holder.token, next_guard.fencing_token());
    assert!(matches!(guard.unlock().await, Err(Error::LeaseLost { .. })));
    next_guard.unlock().await.unwrap();
}

/// A release the store lost (acknowledged by a primary that a failover then replaced) leaves
/// a level nobody holds. The owner's next acquisition must not re-enter it: that would reuse
/// the old fencing token and, renewing the lease on every re-entry, keep every other owner
/// waiting for as long as this one keeps locking. It frees the stale hold instead, which goes
/// to the owner waiting first, and queues behind it.
#[tokio::test(start_paused = true)]
async fn a_level_the_store_kept_after_a_lost_release_is_not_re_entered() {
    let backend = Faulty::default();
    let client = LockClient::new(backend.clone());
    let first = client.fair_lock("lost-release").unwrap();
    let other = client.fair_lock("lost-release").unwrap();
    let guard = first.lock().await.unwrap();
    let stale_token = guard.fencing_token();
    let waiter = tokio::spawn(hold_briefly(other));
    tokio::time::sleep(Duration::from_millis(50)).await;
    backend.lose_next_release.store(true, SeqCst);
    guard.unlock().await.unwrap();
    assert!(
        first.state().await.unwrap().holder.is_some(),
        "the release was not lost"
    );

    frees_the_stale_hold_after(&first, waiter, stale_token).await;
}

/// Another owner's `lock()` through `lock`: holds 100 ms, then unlocks; its token and when
/// it released.
async fn hold_briefly(lock: FairLock) -> (u64, tokio::time::Instant) {
    let guard = lock.lock().await.unwrap();
    let token = guard.fencing_token();
    tokio::time::sleep(Duration::from_millis(100)).await;
    guard.unlock().await.unwrap();
    (token, tokio::time::Instant::now())
}

/// `lock`'s owner, whose hold of `stale_token` has a level nobody holds, locks again: it
/// frees that hold rather than re-entering it, and gets the lock at a first level after
/// `waiter` (first in line, [`hold_briefly`]) held and released it; then the lock is free.
async fn frees_the_stale_hold_after(
    lock: &FairLock,
    waiter: tokio::task::JoinHandle<(u64, tokio::time::Instant)>,
    stale_token: u64,
) {
    let again = tokio::time::timeout(Duration::from_secs(5), lock.lock())
        .await
        .expect("the stale hold does not block its own owner")
        .unwrap();
    let acquired = tokio::time::Instant::now();
    assert_eq!(again.hold_count(), 1, "re-entered the stale level");
    let (waiter_token, waiter_released) = waiter.await.unwrap();
    assert!(
        waiter_token > stale_token && again.fencing_token() > waiter_token,
        "tokens: stale {stale_token}, waiter {waiter_token}, again {}",
        again.fencing_token()
    );
    assert!(
        acquired >= waiter_released,
        "the waiter, first in line, went first"
    );
    again.unlock().await.unwrap();
    assert!(lock.state().await.unwrap().holder.is_none());
}

/// `lock` is taken at a first level, with a token above `stale_token` (the stale level was
/// not re-entered), and is free once that is released.
async fn locks_anew(lock: &FairLock, stale_token: u64) {
    let again = lock.lock().await.unwrap();
    assert_eq!(again.hold_count(), 1, "re-entered the stale level");
    assert!(again.fencing_token() > stale_token);
    again.unlock().await.unwrap();
    assert!(lock.state().await.unwrap().holder.is_none());
}

/// The same for a release that failed for longer than the outage budget: `unlock()` reported
/// it, and the level it left is not re-entered by the owner's next acquisition.
#[tokio::test(start_paused = true)]
async fn a_level_left_by_a_failed_release_is_not_re_entered() {
    let backend = Faulty::default();
    // A lease longer than the outage budget, so the level outlives the failed release.
    let client = LockClient::new(backend.clone())
        .with_options(LockOptions::default().with_watchdog_lease(Duration::from_secs(120)))
        .unwrap();
    let lock = client.fair_lock("failed-release").unwrap();
    let guard = lock.lock().await.unwrap();
    let stale_token = guard.fencing_token();
    let started = tokio::time::Instant::now();
    *backend.releases_down_until.lock().unwrap() = Some(started + Duration::from_secs(60));
    let error = guard.unlock().await.unwrap_err();
    assert!(matches!(error, Error::Unavailable { .. }), "{error}");
    *backend.releases_down_until.lock().unwrap() = None;
    assert!(lock.state().await.unwrap().holder.is_some());

    locks_anew(&lock, stale_token).await;
}

/// The same when the guard is dropped rather than unlocked, and the next `lock()` comes at
/// once: the dropped guard's release is still on its way (and, here, lost), so the check
/// waits for it before judging the hold (found by review: it used to let the stale level be).
#[tokio::test(start_paused = true)]
async fn a_stale_level_behind_a_dropped_guard_is_not_re_entered() {
    let backend = Faulty::default();
    let client = LockClient::new(backend.clone());
    let lock = client.fair_lock("dropped").unwrap();
    let guard = lock.lock().await.unwrap();
    let stale_token = guard.fencing_token();
    backend.lose_next_release.store(true, SeqCst);
    drop(guard);
    locks_anew(&lock, stale_token).await;
}

/// A `fair_lock` handle whose owner was handed out may share it with a `fair_lock_as`
/// handle: a level held there is not stale, and must be re-entered, never freed (found by
/// review: the check freed the other handle's live hold).
#[tokio::test(start_paused = true)]
async fn a_handed_out_owner_shares_its_hold() {
    let backend = Faulty::default();
    let client = LockClient::new(backend.clone());
    let first = client.fair_lock("shared").unwrap();
    let second = client
        .fair_lock_as("shared", first.owner().clone())
        .unwrap();
    let held = second.lock().await.unwrap();
    let nested = first.lock().await.unwrap();
    assert_eq!(nested.hold_count(), 2);
    assert_eq!(nested.fencing_token(), held.fencing_token());
    assert!(held.is_held().await.unwrap(), "the shared hold was freed");
    nested.unlock().await.unwrap();
    held.unlock().await.unwrap();
}

/// A `fair_lock` handle of `name` whose owner's hold has a level nobody holds (a release the
/// store lost), and that hold's token.
async fn with_stale_hold(client: &LockClient, backend: &Faulty, name: &str) -> (FairLock, u64) {
    let lock = client.fair_lock(name).unwrap();
    let guard = lock.lock().await.unwrap();
    let stale_token = guard.fencing_token();
    backend.lose_next_release.store(true, SeqCst);
    guard.unlock().await.unwrap();
    (lock, stale_token)
}

/// Starts a `lock()` of `lock` (from [`with_stale_hold`]) that frees its stale hold with a
/// force release taking 100 ms, and returns once that force release is on its way: the
/// handle, shared, and the call, which then queues anew.
async fn freeing_the_stale_hold(
    backend: &Faulty,
    lock: FairLock,
) -> (Arc<FairLock>, tokio::task::JoinHandle<LockGuard>) {
    let lock = Arc::new(lock);
    *backend.force_release_delay.lock().unwrap() = Duration::from_millis(100);
    let freeing = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.lock().await.unwrap() })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(
        backend.force_releases.load(SeqCst),
        1,
        "the first call's force release is on its way"
    );
    (lock, freeing)
}

/// A handle whose force release of a stale hold failed remembers the hold as one to free. If
/// its owner is then handed out and a `fair_lock_as` handle re-enters that hold, its level
/// there is live: the first handle must never free the hold again, and once the failed force
/// release can no longer reach the store (the resend horizon) it re-enters it (found by
/// review: it freed the hold under the other handle's guard, and another owner took the lock).
#[tokio::test(start_paused = true)]
async fn a_hold_left_to_free_is_not_freed_once_the_owner_is_handed_out() {
    let backend = Faulty::default();
    let client = LockClient::new(backend.clone());
    let (first, stale_token) = with_stale_hold(&client, &backend, "left-to-free").await;
    let other = client.fair_lock("left-to-free").unwrap();
    backend.force_releases_down.store(true, SeqCst);
    let error = first.try_lock().await.unwrap_err();
    assert!(matches!(error, Error::Unavailable { .. }), "{error}");
    backend.force_releases_down.store(false, SeqCst);
    assert_eq!(
        first.state().await.unwrap().holder.map(|h| h.token),
        Some(stale_token),
        "the failed force release freed the hold"
    );

    let second = client
        .fair_lock_as("left-to-free", first.owner().clone())
        .unwrap();
    let held = second.lock().await.unwrap();
    assert_eq!(held.fencing_token(), stale_token);
    // Within the horizon the failed force release might still land: the first handle waits,
    // neither using the hold nor freeing it again.
    let tried = first.try_lock().await;
    assert!(
        matches!(tried, Err(Error::WouldBlock { .. })),
        "try_lock within the horizon: {tried:?}"
    );
    let waited = tokio::time::timeout(Duration::from_secs(30), first.lock()).await;
    assert!(
        waited.is_err(),
        "lock() returned within the horizon (the hold used, or freed again)"
    );
    assert!(
        held.is_held().await.unwrap(),
        "the shared hold was freed under the other handle's guard within the horizon"
    );
    // The watchdog keeps the shared hold meanwhile.
    tokio::time::sleep(RESEND_HORIZON).await;
    let nested = first.lock().await.unwrap();
    assert!(
        held.is_held().await.unwrap(),
        "the shared hold was freed under the other handle's guard"
    );
    assert_eq!(nested.fencing_token(), stale_token);
    assert!(
        matches!(other.try_lock().await, Err(Error::WouldBlock { .. })),
        "another owner took the lock while this owner's guards held it"
    );
    nested.unlock().await.unwrap();
    held.unlock().await.unwrap();
}

/// A force release that failed may still reach the store (the client sends it again after a
/// reconnect). Until the resend horizon has passed, the handle's grants of that hold are not
/// used, even once its owner is handed out: the late force release would free the hold under
/// the guard (found by review of the fix above, which used them at once).
#[tokio::test(start_paused = true)]
async fn a_hold_a_late_force_release_may_free_is_not_used_once_the_owner_is_handed_out() {
    let backend = Faulty::default();
    let client = LockClient::new(backend.clone());
    let (lock, stale_token) = with_stale_hold(&client, &backend, "lands-late").await;
    *backend.force_releases_land_late.lock().unwrap() = Some(Duration::from_secs(5));
    let error = lock.try_lock().await.unwrap_err();
    assert!(matches!(error, Error::Unavailable { .. }), "{error}");
    *backend.force_releases_land_late.lock().unwrap() = None;
    assert_eq!(
        lock.state().await.unwrap().holder.map(|h| h.token),
        Some(stale_token),
        "the failed force release landed at once"
    );

    let _ = lock.owner();
    let again = lock.lock().await.unwrap();
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(
        again.fencing_token() > stale_token,
        "re-entered the hold a late force release frees"
    );
    assert!(again.is_held().await.unwrap());
    again.unlock().await.unwrap();
    assert!(lock.state().await.unwrap().holder.is_none());
}

/// While a handle's force release of a stale hold is on its way, a grant of that hold to
/// another call of the handle is not used, even if the owner was handed out meanwhile: the
/// force release in flight would free it under that call's guard.
#[tokio::test(start_paused = true)]
async fn a_hold_being_freed_is_not_used_once_the_owner_is_handed_out() {
    let backend = Faulty::default();
    let client = LockClient::new(backend.clone());
    let (lock, stale_token) = with_stale_hold(&client, &backend, "being-freed").await;
    let (lock, first) = freeing_the_stale_hold(&backend, lock).await;
    let _ = lock.owner();
    let second = lock.lock().await.unwrap();
    let first = first.await.unwrap();
    for guard in [&first, &second] {
        assert!(
            guard.fencing_token() > stale_token,
            "a call used the hold being freed"
        );
        assert!(guard.is_held().await.unwrap());
    }
    second.unlock().await.unwrap();
    first.unlock().await.unwrap();
    assert!(lock.state().await.unwrap().holder.is_none());
}

/// A handle's force release of a stale hold that lands after a `fair_lock_as` handle of the
/// same client re-entered that hold frees it under that handle's guard: the guard learns it
/// when the force release answers, as after `force_unlock`, not at its next renewal.
#[tokio::test(start_paused = true)]
async fn a_guard_sharing_a_hold_this_client_freed_learns_it_at_once() {
    let backend = Faulty::default();
    let client = LockClient::new(backend.clone());
    let (lock, stale_token) = with_stale_hold(&client, &backend, "freed-under").await;
    let (lock, freeing) = freeing_the_stale_hold(&backend, lock).await;
    let sharing = client
        .fair_lock_as("freed-under", lock.owner().clone())
        .unwrap();
    let guard = sharing.lock().await.unwrap();
    assert_eq!(guard.fencing_token(), stale_token);
    assert!(!guard.is_lease_lost());
    let after = freeing.await.unwrap();
    assert!(after.fencing_token() > stale_token);
    assert!(
        guard.is_lease_lost(),
        "the guard of the freed hold was not told when the force release answered"
    );
    assert!(matches!(guard.unlock().await, Err(Error::LeaseLost { .. })));
    after.unlock().await.unwrap();
}

/// A stale level (a release the store lost) found while another call of the same handle is
/// under way is kept, not freed: that call may hold a level of the same hold, and freeing the
/// hold would take it from under its guard while another owner takes the lock. Two tasks share
/// the handle; both re-enter the hold, and the other owner waits until both are done and
/// the handle's next acquisition frees the stale level.
#[tokio::test(start_paused = true)]
async fn a_stale_level_found_while_another_call_holds_is_kept() {
    let backend = Faulty::default();
    let client = LockClient::new(backend.clone());
    let (shared, stale_token) = with_stale_hold(&client, &backend, "kept-stale").await;
    let shared = Arc::new(shared);
    let other = client.fair_lock("kept-stale").unwrap();
    let waiter = tokio::spawn(hold_briefly(other));
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(shared.state().await.unwrap().waiters.len(), 1);

    // Both calls are under way before either is granted: the first finds as many levels as
    // calls (the stale one and its own), the second one more, with the first's call counted.
    *backend.acquire_delay.lock().unwrap() = Duration::from_millis(10);
    let calls: Vec<_> = (0..2)
        .map(|_| {
            let shared = shared.clone();
            tokio::spawn(async move { shared.lock().await.unwrap() })
        })
        .collect();
    let mut guards = Vec::new();
    for call in calls {
        guards.push(call.await.unwrap());
    }
    *backend.acquire_delay.lock().unwrap() = Duration::ZERO;
    for guard in &guards {
        assert_eq!(
            guard.fencing_token(),
            stale_token,
            "re-entered the one hold"
        );
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !waiter.is_finished(),
        "the other owner got the lock while this owner's guards held it"
    );
    let state = shared.state().await.unwrap();
    assert_eq!(state.holder.map(|h| h.token), Some(stale_token));
    for guard in guards {
        assert!(!guard.is_lease_lost());
        guard.unlock().await.unwrap();
    }

    // The stale level is still there; the handle's next acquisition frees it, the waiter
    // first in line goes first.
    frees_the_stale_hold_after(&shared, waiter, stale_token).await;
}

/// Seeded schedules on the core with the store's faults that err on the safe side: releases
/// the store lost (a level kept), grants whose reply was lost, releases applied twice or
/// whose reply was lost, abandons that failed, force releases sent again, acquires delivered
/// again up to 200 ms later. Four owners, two of
/// them handles shared by two tasks; each task locks (waiting, with a time-out, or cancelled
/// at a random point), sometimes nests a guard, holds a while, and unlocks. However the faults
/// fall, no two owners hold at once, tokens grow from one owner to the next, every task gets
/// through its rounds, and once the leases the lost releases left have lapsed, nothing is left.
/// 64 schedules by default; `FAIRLOCK_CHAOS_SEEDS` (a count) runs more (1,000 take about 6 s),
/// and a failure names its seed, which `FAIRLOCK_CHAOS_SEED` runs alone with the core's debug
/// events printed. Freeing a stale level while another call of the handle holds (`Stale::Kept`
/// made `Free`) fails schedule 1: another owner enters while a guard holds. Not caught here,
/// since such holds lapse like the levels of lost releases: a handle re-entering a stale
/// level (its own tests above) and a store that grants a spent attempt again (the backend
/// model check and the `ForgetsSpent` mutant).
#[tokio::test(start_paused = true)]
async fn shared_handles_keep_exclusion_through_store_faults() {
    chaos_schedules("FAIRLOCK_CHAOS_SEED", false).await;
}

/// The same schedules, with owner 0's handle handed out (`owner()` read by one of its tasks
/// at a random round), force releases that take up to 100 ms, and two more faults: force
/// releases that fail without reaching the store, and force releases that fail and land up
/// to 200 ms later (sent again by the client). The invariants are those above; the handle
/// stops freeing stale holds once handed out, and its stale levels lapse with their lease.
/// 64 schedules by default; `FAIRLOCK_CHAOS_SEEDS` runs more, and
/// `FAIRLOCK_CHAOS_SHARED_SEED` one alone with the core's debug events. Not caught here: a
/// handle that uses grants of the holds it set out to free (1,000 schedules passed with that
/// check removed, and with it ended by handing the owner out, as in d0e59cd); the
/// `..._once_the_owner_is_handed_out` tests above catch it.
#[tokio::test(start_paused = true)]
async fn a_handed_out_handle_keeps_exclusion_through_store_faults() {
    chaos_schedules("FAIRLOCK_CHAOS_SHARED_SEED", true).await;
}

/// Runs the schedules `FAIRLOCK_CHAOS_SEEDS` asks for (64 by default), or the one seed
/// `one_seed` (a variable's name) names, alone with the core's debug events printed.
async fn chaos_schedules(one_seed: &str, hand_out: bool) {
    // A value that is not a number, or no schedules at all, must not pass as a check.
    let number = |variable: &str| {
        std::env::var(variable).ok().map(|value| {
            value
                .trim()
                .parse::<u64>()
                .unwrap_or_else(|_| panic!("{variable}={value:?} is not a number"))
        })
    };
    let seeds = number("FAIRLOCK_CHAOS_SEEDS").unwrap_or(64);
    assert!(seeds > 0, "FAIRLOCK_CHAOS_SEEDS=0 runs no schedule");
    if let Some(seed) = number(one_seed) {
        let _ = tracing_subscriber::fmt()
            .with_env_filter("fairlock=debug")
            .with_test_writer()
            .try_init();
        chaos_schedule(seed, hand_out).await;
        return;
    }
    for seed in 0..seeds {
        chaos_schedule(seed, hand_out).await;
    }
}

async fn chaos_schedule(seed: u64, hand_out: bool) {
    const ROUNDS: usize = 15;
    // Tasks 0 and 1 share owner 0's handle, tasks 2 and 3 owner 1's; owners 2 and 3 have one
    // task each.
    const OWNER_OF_TASK: [usize; 6] = [0, 0, 1, 1, 2, 3];
    let backend = Faulty::default();
    if hand_out {
        // Force releases take a while, so that other calls come while one is on its way.
        let mut rng = StdRng::seed_from_u64(seed ^ 0xF0CE);
        *backend.force_release_delay.lock().unwrap() = Duration::from_millis(rng.gen_range(0..100));
    }
    let client = LockClient::new(backend.clone());
    let name = format!("chaos-{seed}");
    let handles: Vec<_> = (0..4)
        .map(|_| Arc::new(client.fair_lock(&name).unwrap()))
        .collect();
    let inside = Arc::new(Mutex::new([0usize; 4]));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (task, &owner) in OWNER_OF_TASK.iter().enumerate() {
        let lock = handles[owner].clone();
        let (inside, tokens) = (inside.clone(), tokens.clone());
        let mut rng = StdRng::seed_from_u64(seed * 31 + task as u64);
        // Task 0 hands its owner out at this round, when asked to.
        let hand_out_at = (hand_out && task == 0).then(|| rng.gen_range(0..ROUNDS));
        tasks.push(tokio::spawn(async move {
            for round in 0..ROUNDS {
                if hand_out_at == Some(round) {
                    let _ = lock.owner();
                }
                let wait = Duration::from_millis(rng.gen_range(0..40));
                let guard = match rng.gen_range(0..3) {
                    0 => match lock.try_lock_for(wait).await {
                        Ok(guard) => guard,
                        // Busy at once (a zero wait), busy until the end, or the store failing
                        // at the end (a lost reply): documented outcomes.
                        Err(
                            Error::WouldBlock { .. }
                            | Error::Timeout { .. }
                            | Error::Unavailable { .. },
                        ) => continue,
                        Err(err) => panic!("seed {seed} task {task} round {round}: {err}"),
                    },
                    1 => match tokio::time::timeout(wait, lock.lock()).await {
                        Ok(guard) => guard.unwrap_or_else(|err| {
                            panic!("seed {seed} task {task} round {round}: {err}")
                        }),
                        Err(_cancelled) => continue,
                    },
                    _ => lock.lock().await.unwrap_or_else(|err| {
                        panic!("seed {seed} task {task} round {round}: {err}")
                    }),
                };
                {
                    let mut inside = inside.lock().unwrap();
                    let others: usize = (inside.iter().enumerate())
                        .filter(|&(other, _)| other != owner)
                        .map(|(_, n)| n)
                        .sum();
                    assert_eq!(
                        others, 0,
                        "seed {seed}: task {task} (owner {owner}) entered while tasks of other \
                         owners were inside: {inside:?}"
                    );
                    inside[owner] += 1;
                }
                tokens.lock().unwrap().push((owner, guard.fencing_token()));
                let nested = if rng.gen_range(0..3) == 0 {
                    Some(lock.lock().await.unwrap_or_else(|err| {
                        panic!("seed {seed} task {task} round {round}: nested: {err}")
                    }))
                } else {
                    None
                };
                tokio::time::sleep(Duration::from_millis(rng.gen_range(0..20))).await;
                if let Some(nested) = nested {
                    nested.unlock().await.unwrap_or_else(|err| {
                        panic!("seed {seed} task {task} round {round}: nested unlock: {err}")
                    });
                }
                inside.lock().unwrap()[owner] -= 1;
                guard.unlock().await.unwrap_or_else(|err| {
                    panic!("seed {seed} task {task} round {round}: unlock: {err}")
                });
            }
        }));
    }
    // The faults: one at a time, on whichever call comes next within a short window, with
    // quiet spells between (a fault left armed would fail every retry of a lone caller, an
    // outage longer than any budget, not what this schedules).
    let faults = {
        let backend = backend.clone();
        let mut rng = StdRng::seed_from_u64(seed ^ 0xFA17);
        tokio::spawn(async move {
            let flags = [
                &backend.lose_next_release,
                &backend.lose_next_reply,
                &backend.resend_next_release,
                &backend.lose_next_release_reply,
                &backend.fail_next_abandon,
                &backend.resend_next_force_release,
                &backend.resend_next_acquire,
                &backend.force_releases_down,
            ];
            // The schedules without a handed-out handle keep the faults they were written
            // with: the last one and the late force releases come only with one.
            let kinds = if hand_out {
                flags.len() + 1
            } else {
                flags.len() - 1
            };
            loop {
                tokio::time::sleep(Duration::from_millis(5 + rng.gen_range(0..60))).await;
                *backend.resend_delay.lock().unwrap() =
                    Duration::from_millis(rng.gen_range(0..200));
                match rng.gen_range(0..kinds) {
                    kind if kind < flags.len() => flags[kind].store(true, SeqCst),
                    _ => {
                        *backend.force_releases_land_late.lock().unwrap() =
                            Some(Duration::from_millis(rng.gen_range(0..200)))
                    }
                }
                tokio::time::sleep(Duration::from_millis(1 + rng.gen_range(0..30))).await;
                for flag in flags {
                    flag.store(false, SeqCst);
                }
                *backend.force_releases_land_late.lock().unwrap() = None;
            }
        })
    };
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(600), task)
            .await
            .unwrap_or_else(|_| panic!("seed {seed}: a task did not get through its rounds"))
            .unwrap_or_else(|err| std::panic::resume_unwind(err.into_panic()));
    }
    faults.abort();
    let tokens = tokens.lock().unwrap().clone();
    for pair in tokens.windows(2) {
        let ((first_owner, first), (second_owner, second)) = (pair[0], pair[1]);
        assert!(
            first < second || (first == second && first_owner == second_owner),
            "seed {seed}: tokens must grow from one owner to the next: {pair:?} (owner, token)"
        );
    }
    // Levels the lost releases left lapse with their lease; then nothing is left.
    tokio::time::sleep(Duration::from_secs(120)).await;
    let state = handles[0].state().await.unwrap();
    assert!(
        state.holder.is_none() && state.waiters.is_empty(),
        "seed {seed}: left behind: {state:?}"
    );
}

/// `try_lock_for` keeps its bound when a re-entry must be counted again: a guard of the
/// handle is dropped just before (its release on its way), the re-entry waits for that
/// release, and the store then pauses. The second count used to be sent without the
/// deadline, so the call waited out the store's pause (10 s here).
#[tokio::test(start_paused = true)]
async fn try_lock_for_keeps_its_bound_when_a_re_entry_is_counted_again() {
    let faulty = Faulty::default();
    let client = LockClient::new(faulty.clone());
    let lock = client.fair_lock("x").unwrap();
    let guard = lock.lock().await.unwrap();
    *faulty.release_delay.lock().unwrap() = Duration::from_millis(200);
    faulty.stall_acquires_after_release.store(true, SeqCst);
    drop(guard);
    let wait = Duration::from_millis(500);
    let started = tokio::time::Instant::now();
    let result = lock.try_lock_for(wait).await;
    let took = started.elapsed();
    assert!(
        took <= wait + Duration::from_millis(60),
        "try_lock_for({wait:?}) took {took:?}"
    );
    assert!(
        matches!(
            result,
            Err(Error::Timeout { .. } | Error::Unavailable { .. })
        ),
        "{:?}",
        result.map(|guard| guard.hold_count())
    );
    // The re-entry's level was given back: nobody holds.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let name = LockName::new("x").unwrap();
    assert_eq!(faulty.inner.inspect(&name).await.unwrap().holder, None);
}

/// A re-entry whose reply comes after the release of a guard dropped just before it: the
/// store counted that guard's level in the grant (2), then the release took it away, and the
/// release finished before the reply was read. The grant is the caller's own and valid; it
/// used to be judged stale (2 levels, 1 ticket) and freed, handing the lock to the waiter
/// of another owner.
#[tokio::test(start_paused = true)]
async fn a_release_that_finishes_before_the_re_entry_reply_is_not_a_stale_level() {
    let faulty = Faulty::default();
    let client = LockClient::new(faulty.clone());
    let lock = client.fair_lock("x").unwrap();
    let guard = lock.lock().await.unwrap();
    let token = guard.fencing_token();
    let other = client.fair_lock("x").unwrap();
    let waiter = tokio::spawn(async move { other.lock().await.map(|g| g.fencing_token()) });
    tokio::time::sleep(Duration::from_millis(10)).await;
    let name = LockName::new("x").unwrap();
    assert_eq!(faulty.inner.inspect(&name).await.unwrap().waiters.len(), 1);

    *faulty.acquire_reply_delay.lock().unwrap() = Duration::from_millis(100);
    *faulty.release_delay.lock().unwrap() = Duration::from_millis(20);
    drop(guard);
    let again = lock.try_lock().await.expect("the re-entry is the caller's");
    assert_eq!(again.fencing_token(), token);
    assert_eq!(again.hold_count(), 1);
    assert_eq!(faulty.force_releases.load(SeqCst), 0, "the hold was freed");
    assert!(!waiter.is_finished(), "the other owner was handed the lock");
    again.unlock().await.unwrap();
    assert!(waiter.await.unwrap().unwrap() > token);
}

/// A hand-over whose confirmation is answered just before the guard's own deadline for it,
/// and read just after (the confirming task was not run in between): `is_lease_lost` is true
/// from the deadline on and must stay so (it went back to false when that reply was read), and
/// the lost-lease signal fires.
#[tokio::test(start_paused = true)]
async fn a_confirmation_read_after_the_deadline_leaves_the_lease_lost() {
    let faulty = Faulty::default();
    let client = LockClient::new(faulty.clone());
    let holder = client.fair_lock("x").unwrap();
    let held = holder.lock().await.unwrap();
    let waiter = client.fair_lock("x").unwrap();
    let ttl = waiter.options().waiter_ttl;
    // In paused time every call of the waiter is sent at this instant, so its guard trusts
    // the hand-over until nine tenths of the TTL from now.
    let deadline = tokio::time::Instant::now() + ttl - ttl / 10;
    faulty.gate_confirmations.store(true, SeqCst);
    let waiting = tokio::spawn(async move { waiter.lock().await });
    tokio::time::sleep(Duration::from_millis(10)).await;
    held.unlock().await.unwrap();
    let guard = waiting.await.unwrap().unwrap();
    // The confirmation is answered just before the deadline and read just after it.
    answer_just_before_the_deadline(&guard, deadline, &faulty.confirm_gate).await;
    let name = LockName::new("x").unwrap();
    let stored = faulty.inner.inspect(&name).await.unwrap().holder.unwrap();
    assert!(stored.confirmed, "the store confirmed the level");
    still_lost(&guard).await;
}

/// The bound of `try_lock_for` holds over several counts of a grant, not only the first: a
/// sibling's release finishes during the first call (count again), and during the second
/// count another task of the handle re-enters and drops its guard, whose release then stalls.
/// The wait for that release must end at the caller's deadline; it was given the patience left
/// when the first count began, and the call returned 130 ms late.
#[tokio::test(start_paused = true)]
async fn try_lock_for_keeps_its_bound_over_several_counts() {
    let faulty = Faulty::default();
    let client = LockClient::new(faulty.clone());
    let lock = Arc::new(client.fair_lock("x").unwrap());
    let first = lock.lock().await.unwrap();
    // Calls reach the store 30 ms after they are sent and are answered 100 ms after that;
    // the first guard's release lands just after the caller's first call (its count: 2).
    *faulty.acquire_delay.lock().unwrap() = Duration::from_millis(30);
    *faulty.acquire_reply_delay.lock().unwrap() = Duration::from_millis(100);
    *faulty.release_delay.lock().unwrap() = Duration::from_millis(40);
    let started = tokio::time::Instant::now();
    drop(first);
    let (sibling, link) = (lock.clone(), faulty.clone());
    let other_task = tokio::spawn(async move {
        // Just after the caller sent its second count (at 130 ms), and landing before it.
        tokio::time::sleep(Duration::from_millis(131)).await;
        *link.acquire_delay.lock().unwrap() = Duration::ZERO;
        let second = sibling.lock().await.unwrap();
        *link.release_delay.lock().unwrap() = Duration::from_secs(10);
        drop(second);
    });
    let wait = Duration::from_millis(500);
    let result = lock.try_lock_for(wait).await;
    let took = started.elapsed();
    assert!(
        took <= wait + Duration::from_millis(50),
        "try_lock_for({wait:?}) took {took:?} ({:?})",
        result.map(|guard| guard.hold_count())
    );
    other_task.await.unwrap();
}

/// A grant counted again three times, a release of the handle finishing during each count
/// (another task re-entering and dropping its guard each time): the finished releases may
/// explain the count, so the caller neither uses nor force-frees the hold; it gives its own
/// level up and starts over. It used to be judged stale after the third count and the
/// hold force-released (a freed hold goes to whoever waits first).
#[tokio::test(start_paused = true)]
async fn releases_finishing_around_every_count_do_not_force_free_the_callers_hold() {
    let faulty = Faulty::default();
    let client = LockClient::new(faulty.clone());
    let lock = Arc::new(client.fair_lock("x").unwrap());
    let first = lock.lock().await.unwrap();
    let token = first.fencing_token();
    let other_task = reenter_in_every_count(&faulty, &lock, first);
    let again = lock.try_lock().await.expect("the lock is the caller's");
    assert_eq!(again.hold_count(), 1);
    assert!(again.fencing_token() >= token);
    assert_eq!(
        faulty.force_releases.load(SeqCst),
        0,
        "the caller's hold was freed"
    );
    other_task.await.unwrap();
}

/// A watchdog renewal answered just before the guard's deadline and read just after: the
/// lease has been reported lost since the deadline and must stay so (the renewal used to move
/// the deadline back past it), and the lost-lease signal fires.
#[tokio::test(start_paused = true)]
async fn a_renewal_read_after_the_deadline_leaves_the_lease_lost() {
    let (faulty, _lock, guard, deadline) = held_with_renewals_gated().await;
    // The renewal (applied at a third of the lease, so the store's lease is longer) is
    // answered just before the deadline and read just after it.
    answer_just_before_the_deadline(&guard, deadline, &faulty.extend_gate).await;
    still_lost(&guard).await;
}

/// A stale level (a release the store lost) in a hold whose count keeps changing around every
/// count of the caller's grant: the releases that finished meanwhile explain one level, not
/// two, so the stale one is still found and the hold freed, not re-entered.
#[tokio::test(start_paused = true)]
async fn a_stale_level_is_found_while_releases_finish_around_every_count() {
    let faulty = Faulty::default();
    let client = LockClient::new(faulty.clone());
    let lock = Arc::new(client.fair_lock("x").unwrap());
    let first = lock.lock().await.unwrap();
    let token = first.fencing_token();
    let lost = lock.lock().await.unwrap();
    faulty.lose_next_release.store(true, SeqCst);
    lost.unlock().await.unwrap();
    let other_task = reenter_in_every_count(&faulty, &lock, first);
    let again = lock
        .try_lock()
        .await
        .expect("the lock is free once the stale hold goes");
    assert_eq!(
        faulty.force_releases.load(SeqCst),
        1,
        "the stale hold was not freed"
    );
    assert_ne!(
        again.fencing_token(),
        token,
        "the stale level was re-entered"
    );
    assert_eq!(again.hold_count(), 1);
    other_task.await.unwrap();
}

/// A stale level, and releases of the handle that finish around every count of the caller's
/// grant without their levels being in the count (each re-entry and its release land between
/// the caller's send and its call reaching the store). Once the counts are used up the
/// finished releases could explain the extra level, or not: the caller neither re-enters it
/// (it did, allowing for them) nor frees a hold that may be its own, but starts over.
#[tokio::test(start_paused = true)]
async fn a_count_the_finished_releases_may_explain_is_neither_used_nor_freed() {
    let (faulty, lock, stale_token) = stale_level().await;
    let other_task = churn_around_counts(&faulty, &lock);
    let result = lock.try_lock().await;
    other_task.await.unwrap();
    if let Ok(guard) = &result {
        assert_ne!(
            guard.fencing_token(),
            stale_token,
            "the stale level was re-entered"
        );
    }
    // Started over, the caller found the stale level on a count nothing disturbed, and freed it.
    assert_eq!(faulty.force_releases.load(SeqCst), 1);
    drop(result);
    tokio::time::sleep(Duration::from_millis(500)).await;
    *faulty.acquire_delay.lock().unwrap() = Duration::ZERO;
    *faulty.acquire_reply_delay.lock().unwrap() = Duration::ZERO;
    let fresh = lock.try_lock().await.expect("the lock is free");
    assert_ne!(fresh.fencing_token(), stale_token);
    assert_eq!(fresh.hold_count(), 1);
}

/// The same, with a deadline near and the caller's own abandon slow: starting over, the fresh
/// attempt's count must not be judged while that abandon is still on its way (its ticket
/// counted as another call's, the stale level was kept and re-entered).
#[tokio::test(start_paused = true)]
async fn starting_over_waits_for_its_own_abandon() {
    let (faulty, lock, stale_token) = stale_level().await;
    *faulty.abandon_delay.lock().unwrap() = Duration::from_millis(200);
    let other_task = churn_around_counts(&faulty, &lock);
    let result = lock.try_lock_for(Duration::from_millis(700)).await;
    other_task.await.unwrap();
    if let Ok(guard) = &result {
        assert_ne!(
            guard.fencing_token(),
            stale_token,
            "the stale level was re-entered"
        );
    }
}

/// A handle whose hold keeps a level the store kept after a lost release, and no call of the
/// handle under way: the backend, the handle, and the hold's token.
/// A lock held with the default watchdog, whose renewals are applied and then wait for
/// `extend_gate` before they answer: (the store, the lock, its guard, the guard's deadline).
async fn held_with_renewals_gated() -> (Faulty, FairLock, LockGuard, tokio::time::Instant) {
    let faulty = Faulty::default();
    let lock = LockClient::new(faulty.clone()).fair_lock("x").unwrap();
    let guard = lock.lock().await.unwrap();
    let deadline = tokio::time::Instant::now() + lock.options().watchdog_lease;
    faulty.gate_extends.store(true, SeqCst);
    (faulty, lock, guard, deadline)
}

async fn stale_level() -> (Faulty, Arc<FairLock>, u64) {
    let faulty = Faulty::default();
    let client = LockClient::new(faulty.clone());
    let lock = Arc::new(client.fair_lock("x").unwrap());
    let first = lock.lock().await.unwrap();
    let stale_token = first.fencing_token();
    let lost = lock.lock().await.unwrap();
    faulty.lose_next_release.store(true, SeqCst);
    lost.unlock().await.unwrap();
    first.unlock().await.unwrap();
    (faulty, lock, stale_token)
}

/// From now on the caller's calls reach the store 30 ms after they are sent and are answered
/// 100 ms after that, so a caller that starts now counts at 0, 130, 260 and 390 ms; another
/// task of the handle re-enters and releases 1 ms after each, both landing before the count.
fn churn_around_counts(faulty: &Faulty, lock: &Arc<FairLock>) -> tokio::task::JoinHandle<()> {
    *faulty.acquire_delay.lock().unwrap() = Duration::from_millis(30);
    *faulty.acquire_reply_delay.lock().unwrap() = Duration::from_millis(100);
    let started = tokio::time::Instant::now();
    let (sibling, link) = (lock.clone(), faulty.clone());
    tokio::spawn(async move {
        for at in [1, 131, 261, 391] {
            tokio::time::sleep_until(started + Duration::from_millis(at)).await;
            *link.acquire_delay.lock().unwrap() = Duration::ZERO;
            *link.acquire_reply_delay.lock().unwrap() = Duration::ZERO;
            let guard = sibling.lock().await.unwrap();
            *link.acquire_delay.lock().unwrap() = Duration::from_millis(30);
            *link.acquire_reply_delay.lock().unwrap() = Duration::from_millis(100);
            guard.unlock().await.unwrap();
        }
    })
}

/// Drops `first` (its release lands 40 ms later, after the caller's first call) and from now
/// on delays the caller's calls as `churn_around_counts` does (counts at 0, 130, 260 and
/// 390 ms); another task of the handle re-enters right after each later count is sent, landing
/// before it (so its level is in the count), and drops its guard, whose release finishes
/// before the count's reply.
fn reenter_in_every_count(
    faulty: &Faulty,
    lock: &Arc<FairLock>,
    first: LockGuard,
) -> tokio::task::JoinHandle<()> {
    *faulty.acquire_delay.lock().unwrap() = Duration::from_millis(30);
    *faulty.acquire_reply_delay.lock().unwrap() = Duration::from_millis(100);
    *faulty.release_delay.lock().unwrap() = Duration::from_millis(40);
    let started = tokio::time::Instant::now();
    drop(first);
    let (sibling, link) = (lock.clone(), faulty.clone());
    tokio::spawn(async move {
        for at in [131, 261, 391] {
            tokio::time::sleep_until(started + Duration::from_millis(at)).await;
            *link.acquire_delay.lock().unwrap() = Duration::ZERO;
            *link.release_delay.lock().unwrap() = Duration::ZERO;
            let guard = sibling.lock().await.unwrap();
            *link.acquire_delay.lock().unwrap() = Duration::from_millis(30);
            drop(guard);
        }
    })
}

/// Waits until 1 ms before `deadline` (the guard's lease still held), lets the store's answer
/// gated by `gate` through, and moves the clock past the deadline before the runtime gets to
/// the task that reads it.
async fn answer_just_before_the_deadline(
    guard: &LockGuard,
    deadline: tokio::time::Instant,
    gate: &tokio::sync::Notify,
) {
    tokio::time::sleep_until(deadline - Duration::from_millis(1)).await;
    assert!(!guard.is_lease_lost());
    gate.notify_one();
    tokio::time::advance(Duration::from_millis(2)).await;
    tokio::time::sleep(Duration::from_millis(1)).await;
}

/// The guard's lease, lost at its deadline, is still lost, and its signal fired.
async fn still_lost(guard: &LockGuard) {
    assert!(
        guard.is_lease_lost(),
        "the lease came back after its deadline"
    );
    tokio::time::timeout(Duration::from_secs(1), guard.lease_lost())
        .await
        .expect("the lost-lease signal fires");
}

/// A watchdog renewal still in flight at the deadline it was sent under, after a re-entry
/// raised the hold's deadline meanwhile: the lease is not lost (it runs to the raised
/// deadline), and the renewal, answered later, still counts. The renewal used to be bounded
/// by the deadline read before it was sent, and reported the lease lost there.
#[tokio::test(start_paused = true)]
async fn a_renewal_in_flight_follows_a_deadline_a_re_entry_raised() {
    let (faulty, lock, guard, first_deadline) = held_with_renewals_gated().await;
    let lease = lock.options().watchdog_lease;
    // The renewal goes out at a third of the lease and hangs; then the holder re-enters.
    tokio::time::sleep(lease / 3 + Duration::from_millis(10)).await;
    let inner = lock.lock().await.unwrap();
    tokio::time::sleep_until(first_deadline + Duration::from_millis(10)).await;
    assert!(
        !guard.is_lease_lost(),
        "the lease was lost at the deadline before the re-entry raised it"
    );
    faulty.gate_extends.store(false, SeqCst);
    faulty.extend_gate.notify_one();
    // The keeper goes on renewing past the raised deadline.
    tokio::time::sleep(lease).await;
    assert!(
        !guard.is_lease_lost(),
        "the lease was lost after the renewal"
    );
    drop(inner);
}

/// A re-entry the store granted before a force unlock through this client, whose reply is read
/// only after it: the hold it joins was freed, and its guard must know at once, as the other
/// guards of the hold do (tokens are never reused, so a grant of that token came before).
#[tokio::test(start_paused = true)]
async fn a_grant_read_after_this_clients_force_unlock_of_its_hold_is_lost() {
    let backend = Faulty::default();
    let client = LockClient::new(backend.clone());
    let owner = Arc::new(client.fair_lock("x").unwrap());
    let first = owner.lock().await.unwrap();
    *backend.acquire_reply_delay.lock().unwrap() = Duration::from_millis(100);
    let reentry = {
        let owner = owner.clone();
        tokio::spawn(async move { owner.lock().await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    *backend.acquire_reply_delay.lock().unwrap() = Duration::ZERO;
    assert!(client.force_unlock("x").await.unwrap());
    assert!(first.is_lease_lost(), "the holding guard was not told");
    let second = reentry.await.unwrap().unwrap();
    assert_eq!(second.fencing_token(), first.fencing_token());
    assert!(
        second.is_lease_lost(),
        "the late re-entry believes it holds"
    );
    drop((first, second));
}
