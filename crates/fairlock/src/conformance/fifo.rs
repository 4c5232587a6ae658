//! Fairness: grants in queue order, no barging, and the hand-over to the head waiter.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::timeout;

use super::support::{self, raw_acquire, OrFail, Waiter};
use crate::backend::{AcquireOutcome, LockBackend, ReleaseOutcome, Wake};
use crate::error::Error;
use crate::name::{LockName, Owner};

/// Waiters enqueued one by one (each confirmed in `state().waiters` before the next starts)
/// are listed in that order and granted the lock in exactly that order, each with a larger
/// fencing token than the one before.
pub async fn fifo_order(backend: Arc<dyn LockBackend>) {
    const CHECK: &str = "fifo_order";
    const WAITERS: usize = 6;
    let client = support::client(&backend);
    let name = support::lock_name(CHECK);
    let holder = client.fair_lock(&name).or_fail(CHECK);
    let held = holder.lock().await.or_fail(format!("{CHECK}: holder lock"));

    let mut waiters = Vec::new();
    for i in 0..WAITERS {
        let lock = client.fair_lock(&name).or_fail(CHECK);
        waiters.push(Waiter::enqueue(format!("{CHECK} #{i}"), &client, lock).await);
    }
    let state = client.state(&name).await.or_fail(CHECK);
    let expected: Vec<String> = waiters.iter().map(|w| w.owner().to_string()).collect();
    assert_eq!(
        support::waiter_owners(&state),
        expected,
        "{CHECK}: state().waiters must list the waiters in the order they were queued"
    );

    let mut last_token = held.fencing_token();
    held.unlock()
        .await
        .or_fail(format!("{CHECK}: holder unlock"));
    for (i, mut waiter) in waiters.into_iter().enumerate() {
        let acquired = waiter.acquired_within(support::EVENTUALLY).await;
        assert!(
            acquired.token > last_token,
            "{CHECK}: waiter #{i} got token {} after {last_token}",
            acquired.token
        );
        last_token = acquired.token;
        // Nobody further back may have been granted meanwhile: that is checked by each later
        // waiter getting a larger token than this one, and by exclusion (it is still held).
        let state = client.state(&name).await.or_fail(CHECK);
        assert_eq!(
            state.holder.as_ref().map(|h| h.owner.as_str()),
            Some(waiter.owner().as_str()),
            "{CHECK}: waiter #{i} is next in line and must be the one holding: {state:?}"
        );
        waiter.release().await;
    }
    support::wait_clean(&client, &name, format!("{CHECK}: lock free at the end")).await;
}

/// `try_lock` by a new owner fails with `WouldBlock` and joins no queue when the lock is held
/// and has waiters, and also when the holder's lease has run out but a live waiter is still
/// queued (the lock is free, yet the waiter comes first). A raw `acquire` without `queue`
/// answers `Busy` in both cases. Nor does a waiter queued behind the first barge on the free
/// lock: its own `acquire` (a heartbeat, here before the head's) keeps it queued.
pub async fn try_lock_never_barges(backend: Arc<dyn LockBackend>) {
    const CHECK: &str = "try_lock_never_barges";
    let client = support::client(&backend);

    // Held, with a waiter queued.
    let name = support::lock_name(CHECK);
    let holder = client.fair_lock(&name).or_fail(CHECK);
    let held = holder.lock().await.or_fail(CHECK);
    let mut waiter = Waiter::enqueue(CHECK, &client, client.fair_lock(&name).or_fail(CHECK)).await;
    let barger = client.fair_lock(&name).or_fail(CHECK);
    for attempt in [
        barger.try_lock().await,
        barger.try_lock_for(Duration::ZERO).await,
    ] {
        assert!(
            matches!(attempt, Err(Error::WouldBlock { .. })),
            "{CHECK}: try_lock on a held lock with a waiter: expected WouldBlock, got {attempt:?}"
        );
    }
    let raw = raw_acquire(
        &backend,
        &name,
        barger.owner(),
        support::WATCHDOG_LEASE,
        support::WAITER_TTL,
        false,
    )
    .await;
    assert_eq!(
        raw,
        AcquireOutcome::Busy,
        "{CHECK}: acquire without queue on a held lock"
    );
    let state = client.state(&name).await.or_fail(CHECK);
    assert_eq!(
        support::waiter_owners(&state),
        vec![waiter.owner().to_string()],
        "{CHECK}: a refused try_lock must not join the queue"
    );
    held.unlock().await.or_fail(CHECK);
    waiter.acquired_within(support::EVENTUALLY).await;
    let attempt = barger.try_lock().await;
    assert!(
        matches!(attempt, Err(Error::WouldBlock { .. })),
        "{CHECK}: try_lock while the former waiter holds: expected WouldBlock, got {attempt:?}"
    );
    waiter.release().await;
    let free = barger
        .try_lock()
        .await
        .or_fail(format!("{CHECK}: try_lock on a free lock"));
    free.unlock().await.or_fail(CHECK);

    // The holder's lease ran out while a live waiter is queued: still no barging. The waiter
    // is a raw owner with a long liveness TTL that does not call again until we say so.
    let name = support::lock_name(CHECK);
    let lease = Duration::from_millis(300);
    let expiring = support::fixed_lease_client(&backend, lease)
        .fair_lock(&name)
        .or_fail(CHECK);
    let expired = expiring.lock().await.or_fail(CHECK);
    let queued = Owner::unique();
    let behind = Owner::unique();
    let long_ttl = Duration::from_secs(5);
    for waiter in [&queued, &behind] {
        let outcome = raw_acquire(&backend, &name, waiter, lease, long_ttl, true).await;
        let what = format!("{CHECK}: acquire with queue on a held lock");
        support::expect_queued(outcome, expired.fencing_token(), what);
    }
    let state = support::state_where(
        &client,
        &name,
        lease + support::EVENTUALLY,
        format!("{CHECK}: the holder's {lease:?} lease runs out"),
        |s| s.holder.is_none(),
    )
    .await;
    assert_eq!(
        support::waiter_owners(&state),
        vec![queued.to_string(), behind.to_string()],
        "{CHECK}: the waiters are still queued after the lease ran out"
    );
    let barger = client.fair_lock(&name).or_fail(CHECK);
    let attempt = barger.try_lock().await;
    assert!(
        matches!(attempt, Err(Error::WouldBlock { .. })),
        "{CHECK}: try_lock on an expired lock with a live waiter: expected WouldBlock, got {attempt:?}"
    );
    let raw = raw_acquire(&backend, &name, barger.owner(), lease, long_ttl, false).await;
    assert_eq!(
        raw,
        AcquireOutcome::Busy,
        "{CHECK}: acquire without queue with a live waiter"
    );
    let second = raw_acquire(&backend, &name, &behind, lease, long_ttl, true).await;
    assert!(
        matches!(second, AcquireOutcome::Queued { .. }),
        "{CHECK}: the second waiter's heartbeat on the free lock, the first still live: expected Queued, got {second:?}"
    );
    let granted = raw_acquire(&backend, &name, &queued, lease, long_ttl, true).await;
    let AcquireOutcome::Granted(grant) = granted else {
        panic!("{CHECK}: the head waiter of a free lock must be granted it, got {granted:?}");
    };
    assert!(
        grant.token > expired.fencing_token(),
        "{CHECK}: the waiter's token {} must exceed the expired holder's {}",
        grant.token,
        expired.fencing_token()
    );
    release_raw(&backend, &name, &queued, grant.token, CHECK).await;
    // The second is next: handed the lock, or free for it.
    let next = raw_acquire(&backend, &name, &behind, lease, long_ttl, true).await;
    let AcquireOutcome::Granted(next) = next else {
        panic!("{CHECK}: the second waiter, now first, must be granted the lock, got {next:?}");
    };
    release_raw(&backend, &name, &behind, next.token, CHECK).await;
    drop(expired);
    support::wait_clean(&client, &name, format!("{CHECK}: lock free at the end")).await;
}

/// The hand-over protocol, driven with raw calls. When the holder releases with a waiter
/// queued, the waiter's registered [`Watch`](crate::backend::Watch) gets a wake-up (within a
/// generous 2 s: delivery is best effort, but a backend must send one), and the lock is
/// either a pending grant to that waiter (`confirmed: false`, hold count 1, a larger token) or
/// free for it. The waiter's next `acquire` returns hold count 1 (not an increment) and, for a
/// pending grant, the same token, and confirms it. A pending grantee that leaves the queue
/// instead passes the lock on to the next waiter.
pub async fn hand_over(backend: Arc<dyn LockBackend>) {
    const CHECK: &str = "hand_over";
    let client = support::client(&backend);
    let name = support::lock_name(CHECK);
    let lock_name = LockName::new(&name).or_fail(CHECK);
    let lease = Duration::from_secs(5);
    let ttl = Duration::from_secs(3);
    let [holder, first, second] = [Owner::unique(), Owner::unique(), Owner::unique()];

    let AcquireOutcome::Granted(held) =
        raw_acquire(&backend, &name, &holder, lease, ttl, true).await
    else {
        panic!("{CHECK}: a fresh lock must be granted");
    };
    let mut reported = 0;
    for waiter in [&first, &second] {
        let outcome = raw_acquire(&backend, &name, waiter, lease, ttl, true).await;
        if let AcquireOutcome::Queued { last_token, .. } = outcome {
            reported = reported.max(last_token);
        }
        support::expect_queued(
            outcome,
            held.token,
            format!("{CHECK}: queue behind the holder"),
        );
    }
    let mut watch = backend.watch(&lock_name, &first).await.or_fail(CHECK);
    release_raw(&backend, &name, &holder, held.token, CHECK).await;
    let wake = timeout(Duration::from_secs(2), watch.recv()).await;
    assert!(
        matches!(wake, Ok(Some(Wake::Granted { .. } | Wake::Recheck))),
        "{CHECK}: the head waiter's watch got no wake-up within 2s of the release: {wake:?}"
    );

    // The head waiter confirms.
    let state = client.state(&name).await.or_fail(CHECK);
    let pending = pending_grant(&state, &first, held.token, CHECK);
    if let (Ok(Some(Wake::Granted { grant: woken, .. })), Some(pending)) = (wake, pending) {
        assert_eq!(
            woken.token, pending,
            "{CHECK}: Wake::Granted carries the pending grant's token"
        );
        assert_eq!(
            woken.hold_count, 1,
            "{CHECK}: a pending grant has hold count 1"
        );
    }
    let outcome = raw_acquire(&backend, &name, &first, lease, ttl, true).await;
    let AcquireOutcome::Granted(grant) = outcome else {
        panic!("{CHECK}: the head waiter of a released lock must be granted it, got {outcome:?}");
    };
    assert_eq!(
        grant.hold_count, 1,
        "{CHECK}: confirming a hand-over is not a re-entry"
    );
    assert!(
        grant.token > held.token,
        "{CHECK}: the grantee's token must exceed the holder's"
    );
    // Queued's last_token is below every token issued after it (the core drops a wake-up
    // whose token is not above it, taking it for one from before its call).
    assert!(
        grant.token > reported,
        "{CHECK}: Queued reported last_token {reported}, not below the token {} granted after it",
        grant.token
    );
    if let Some(pending) = pending {
        assert_eq!(
            grant.token, pending,
            "{CHECK}: confirming keeps the pending grant's token"
        );
    }
    let state = client.state(&name).await.or_fail(CHECK);
    let confirmed = state.holder.as_ref().is_some_and(|h| {
        h.owner == first.as_str() && h.confirmed && h.hold_count == 1 && h.token == grant.token
    });
    assert!(
        confirmed,
        "{CHECK}: after confirming, the grantee holds once: {state:?}"
    );
    assert_eq!(
        support::waiter_owners(&state),
        vec![second.to_string()],
        "{CHECK}: queue after the hand-over"
    );

    // A pending grantee that leaves the queue passes the lock on.
    let third = Owner::unique();
    let outcome = raw_acquire(&backend, &name, &third, lease, ttl, true).await;
    support::expect_queued(
        outcome,
        grant.token,
        format!("{CHECK}: queue behind the grantee"),
    );
    release_raw(&backend, &name, &first, grant.token, CHECK).await;
    backend
        .abandon(&lock_name, &second, support::attempt_of(&second))
        .await
        .or_fail(format!("{CHECK}: abandon"));
    let state = client.state(&name).await.or_fail(CHECK);
    assert!(
        state.holder.as_ref().is_none_or(|h| h.owner == third.as_str() && !h.confirmed),
        "{CHECK}: after the grantee left, the lock is free or pending for the next waiter: {state:?}"
    );
    assert!(
        !support::waiter_owners(&state).contains(&second.to_string()),
        "{CHECK}: the waiter that left is still queued: {state:?}"
    );
    let outcome = raw_acquire(&backend, &name, &third, lease, ttl, true).await;
    let AcquireOutcome::Granted(last) = outcome else {
        panic!("{CHECK}: the next waiter must get the lock the grantee gave up, got {outcome:?}");
    };
    assert!(
        last.token > grant.token,
        "{CHECK}: tokens increase over hand-overs"
    );
    release_raw(&backend, &name, &third, last.token, CHECK).await;
    support::wait_clean(&client, &name, format!("{CHECK}: lock free at the end")).await;
}

/// The token of a pending grant to `waiter`, if the lock is one; panics if the lock is held
/// by anyone else or the grant's shape is wrong.
fn pending_grant(
    state: &crate::LockState,
    waiter: &Owner,
    previous: u64,
    check: &str,
) -> Option<u64> {
    let holder = state.holder.as_ref()?;
    assert!(
        holder.owner == waiter.as_str() && !holder.confirmed && holder.hold_count == 1 && holder.token > previous,
        "{check}: after a release the lock must be free or a pending grant (hold count 1, new token) to the head waiter {waiter}: {state:?}"
    );
    Some(holder.token)
}

pub(crate) async fn release_raw(
    backend: &Arc<dyn LockBackend>,
    name: &str,
    owner: &Owner,
    token: u64,
    check: &str,
) {
    let lock_name = LockName::new(name).or_fail(check);
    let outcome = backend
        .release(&lock_name, owner, token, support::attempt_of(owner))
        .await
        .or_fail(check);
    assert!(
        matches!(outcome, ReleaseOutcome::Released { .. }),
        "{check}: release by the holder {owner} with its token {token}: got {outcome:?}"
    );
}

/// A queued attempt that calls `acquire` again (its heartbeat) keeps its place: it is not
/// moved behind the attempts queued after it, and heartbeats keep it alive past its first
/// TTL. A hand-over is confirmed by its attempt's own
/// `acquire` (the state shows it confirmed, and it outlives the waiter's TTL), never by an
/// `extend` of the hold, which only lengthens the lease.
pub async fn heartbeat_keeps_place_and_grantee_confirms(backend: Arc<dyn LockBackend>) {
    const CHECK: &str = "heartbeat_keeps_place_and_grantee_confirms";
    let client = support::client(&backend);
    let name = support::lock_name(CHECK);
    let lock_name = LockName::new(&name).or_fail(CHECK);
    let long = Duration::from_secs(30);
    let ttl = support::WAITER_TTL;
    let [holder, first, second] = [Owner::unique(), Owner::unique(), Owner::unique()];
    let AcquireOutcome::Granted(held) =
        raw_acquire(&backend, &name, &holder, long, long, false).await
    else {
        panic!("{CHECK}: a fresh lock must be granted");
    };
    for waiter in [&first, &second] {
        let outcome = raw_acquire(&backend, &name, waiter, long, ttl, true).await;
        support::expect_queued(outcome, held.token, format!("{CHECK}: queue"));
    }
    // The first waiter's heartbeat.
    let outcome = raw_acquire(&backend, &name, &first, long, ttl, true).await;
    support::expect_queued(outcome, held.token, format!("{CHECK}: heartbeat"));
    let state = client.state(&name).await.or_fail(CHECK);
    assert_eq!(
        support::waiter_owners(&state),
        vec![first.to_string(), second.to_string()],
        "{CHECK}: a heartbeat must keep the waiter's place"
    );

    // The hand-over goes to the first waiter. An `extend` of the hold does not confirm it;
    // the waiter's own `acquire` does.
    release_raw(&backend, &name, &holder, held.token, CHECK).await;
    let state = client.state(&name).await.or_fail(CHECK);
    let Some(pending) = state.holder.as_ref().filter(|h| h.owner == first.as_str()) else {
        panic!("{CHECK}: the release must hand the lock to the head waiter: {state:?}");
    };
    assert!(
        !pending.confirmed,
        "{CHECK}: a hand-over starts unconfirmed: {state:?}"
    );
    let token = pending.token;
    let extended = backend
        .extend(&lock_name, &first, token, long)
        .await
        .or_fail(CHECK);
    assert!(extended, "{CHECK}: extend of the hold by its owner");
    let state = client.state(&name).await.or_fail(CHECK);
    assert!(
        state.holder.as_ref().is_some_and(|h| !h.confirmed),
        "{CHECK}: extend must not confirm a pending level (only its attempt does): {state:?}"
    );
    let outcome = raw_acquire(&backend, &name, &first, long, ttl, true).await;
    assert!(
        matches!(outcome, AcquireOutcome::Granted(g) if g.token == token && g.hold_count == 1),
        "{CHECK}: the grantee's acquire confirms its hand-over: {outcome:?}"
    );
    let state = client.state(&name).await.or_fail(CHECK);
    assert!(
        state
            .holder
            .as_ref()
            .is_some_and(|h| h.owner == first.as_str() && h.confirmed && h.token == token),
        "{CHECK}: the grantee's acquire must confirm the hand-over: {state:?}"
    );
    // Confirmed, it lasts its lease, not the waiter's TTL.
    tokio::time::sleep(ttl + ttl / 2).await;
    let state = client.state(&name).await.or_fail(CHECK);
    assert!(
        state.holder.as_ref().is_some_and(|h| h.token == token),
        "{CHECK}: a confirmed hand-over must last its lease, not the waiter TTL: {state:?}"
    );
    release_raw(&backend, &name, &first, token, CHECK).await;
    backend
        .abandon(&lock_name, &second, support::attempt_of(&second))
        .await
        .or_fail(CHECK);
    let state = client.state(&name).await.or_fail(CHECK);
    if let Some(h) = state.holder.as_ref() {
        // The second waiter's hand-over, which it gave back by abandoning: nothing.
        panic!("{CHECK}: left behind: {h:?}");
    }
    support::wait_clean(&client, &name, format!("{CHECK}: clean at the end")).await;
    heartbeats_keep_waiters_alive(&backend, &client, CHECK).await;
}

/// Heartbeats every quarter of the TTL (1 s here: a stall of 750 ms is tolerated) keep two
/// waiters queued for about two TTLs, in their order: each moves its waiter's deadline. (The second joins half a TTL after the first, so
/// a store whose heartbeats left the first deadline in place would have the first die, and
/// queue again behind the second, in a round where the second is still live.)
async fn heartbeats_keep_waiters_alive(
    backend: &Arc<dyn LockBackend>,
    client: &crate::LockClient,
    check: &str,
) {
    let name = support::lock_name(check);
    let lock_name = LockName::new(&name).or_fail(check);
    let long = Duration::from_secs(30);
    let ttl = Duration::from_secs(1);
    let [holder, first, second] = [Owner::unique(), Owner::unique(), Owner::unique()];
    let AcquireOutcome::Granted(held) =
        raw_acquire(backend, &name, &holder, long, long, false).await
    else {
        panic!("{check}: a fresh lock must be granted");
    };
    let outcome = raw_acquire(backend, &name, &first, long, ttl, true).await;
    support::expect_queued(outcome, held.token, format!("{check}: queue"));
    tokio::time::sleep(ttl / 2).await;
    for round in 0..7 {
        for waiter in [&first, &second] {
            let outcome = raw_acquire(backend, &name, waiter, long, ttl, true).await;
            support::expect_queued(outcome, held.token, format!("{check}: heartbeat"));
        }
        let state = client.state(&name).await.or_fail(check);
        assert_eq!(
            support::waiter_owners(&state),
            vec![first.to_string(), second.to_string()],
            "{check}: heartbeats every {:?} (TTL {ttl:?}) must keep both waiters queued in their places (round {round})",
            ttl / 4
        );
        tokio::time::sleep(ttl / 4).await;
    }
    for waiter in [&first, &second] {
        backend
            .abandon(&lock_name, waiter, support::attempt_of(waiter))
            .await
            .or_fail(check);
    }
    release_raw(backend, &name, &holder, held.token, check).await;
    support::wait_clean(
        client,
        &name,
        format!("{check}: clean after the heartbeats"),
    )
    .await;
}
