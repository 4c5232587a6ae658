//! Releasing: force release by an operator, and releases that must be refused.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::timeout;

use super::support::{self, raw_acquire, raw_acquire_as, OrFail, Waiter};
use crate::backend::{AcquireOutcome, AttemptId, LockBackend, ReleaseOutcome};
use crate::error::Error;
use crate::name::{LockName, Owner};

/// `force_unlock` frees a lock held at hold count 2 and returns `true`; the head waiter gets
/// it next (with a larger token); the old holder's lost-lease signal fires (its watchdog finds
/// it no longer holds) and both its guards' `unlock` fail with [`Error::LeaseLost`] without
/// touching the new hold. A `force_release` delivered again answers as the first did (`true`
/// after it freed the hold, `false` for a token it did not find) and frees nothing more. On a free lock, or one never used, it returns `false`. The head
/// waiter's [`Watch`](crate::backend::Watch) gets a wake-up (within a generous 2 s).
pub async fn force_release(backend: Arc<dyn LockBackend>) {
    const CHECK: &str = "force_release";
    let client = support::client(&backend);
    let name = support::lock_name(CHECK);
    let holder = client.fair_lock(&name).or_fail(CHECK);
    let outer = holder.lock().await.or_fail(CHECK);
    let inner = holder.lock().await.or_fail(CHECK);
    let mut waiter = Waiter::enqueue(CHECK, &client, client.fair_lock(&name).or_fail(CHECK)).await;

    // A force release that names another hold's token frees nothing.
    let lock_name = LockName::new(&name).or_fail(CHECK);
    let stale = outer.fencing_token().wrapping_sub(1);
    for send in ["first", "re-sent"] {
        let freed = backend
            .force_release(&lock_name, stale)
            .await
            .or_fail(CHECK);
        let state = client.state(&name).await.or_fail(CHECK);
        assert!(
            !freed && state.holder.as_ref().map(|h| h.token) == Some(outer.fencing_token()),
            "{CHECK}: force_release with another token ({send}) must free nothing: {state:?}"
        );
    }
    let was_held = client
        .force_unlock(&name)
        .await
        .or_fail(format!("{CHECK}: force_unlock"));
    assert!(
        was_held,
        "{CHECK}: force_unlock of a held lock must return true"
    );
    let acquired = waiter.acquired_within(support::EVENTUALLY).await;
    assert!(
        acquired.token > outer.fencing_token(),
        "{CHECK}: the head waiter's token {} must exceed the force-released holder's {}",
        acquired.token,
        outer.fencing_token()
    );
    assert_eq!(
        acquired.hold_count, 1,
        "{CHECK}: the next holder starts at hold count 1"
    );
    // Sent again (its first reply lost): it answers as it did, and the new hold stays.
    let again = backend
        .force_release(&lock_name, outer.fencing_token())
        .await
        .or_fail(CHECK);
    assert!(
        again,
        "{CHECK}: a force_release re-sent after it freed the hold must answer true"
    );
    timeout(support::EVENTUALLY, outer.lease_lost())
        .await
        .unwrap_or_else(|_| {
            panic!("{CHECK}: lease_lost() did not fire after the lock was force-released")
        });
    timeout(support::EVENTUALLY, inner.lease_lost()).await.unwrap_or_else(|_| {
        panic!("{CHECK}: the lease_lost() of the re-entered guard did not fire after force release")
    });
    for guard in [inner, outer] {
        let unlocked = guard.unlock().await;
        assert!(
            matches!(unlocked, Err(Error::LeaseLost { .. })),
            "{CHECK}: unlock after force release: expected LeaseLost, got {unlocked:?}"
        );
    }
    let state = client.state(&name).await.or_fail(CHECK);
    let intact = state.holder.as_ref().is_some_and(|h| {
        h.owner == waiter.owner().as_str() && h.token == acquired.token && h.hold_count == 1
    });
    assert!(
        intact,
        "{CHECK}: the old holder's unlocks must not touch the new hold: {state:?}"
    );
    waiter.release().await;
    support::wait_clean(&client, &name, format!("{CHECK}: lock free")).await;

    let was_held = client.force_unlock(&name).await.or_fail(CHECK);
    assert!(
        !was_held,
        "{CHECK}: force_unlock of a free lock must return false"
    );

    // The head waiter is woken (or handed the lock), not left to its heartbeat.
    let lock_name = LockName::new(&name).or_fail(CHECK);
    let [holder, head] = [Owner::unique(), Owner::unique()];
    let long = Duration::from_secs(5);
    let granted = raw_acquire(&backend, &name, &holder, long, long, true).await;
    let AcquireOutcome::Granted(held) = granted else {
        panic!("{CHECK}: a free lock: got {granted:?}");
    };
    let queued = raw_acquire(&backend, &name, &head, long, long, true).await;
    support::expect_queued(
        queued,
        held.token,
        format!("{CHECK}: queue behind the holder"),
    );
    let mut watch = backend.watch(&lock_name, &head).await.or_fail(CHECK);
    assert!(
        client.force_unlock(&name).await.or_fail(CHECK),
        "{CHECK}: force_unlock of a held lock"
    );
    let wake = timeout(Duration::from_secs(2), watch.recv()).await;
    assert!(
        matches!(wake, Ok(Some(_))),
        "{CHECK}: the head waiter's watch got no wake-up within 2s of the force release: {wake:?}"
    );
    let granted = raw_acquire(&backend, &name, &head, long, long, true).await;
    let AcquireOutcome::Granted(grant) = granted else {
        panic!("{CHECK}: the head waiter must get a force-released lock, got {granted:?}");
    };
    super::fifo::release_raw(&backend, &name, &head, grant.token, CHECK).await;
    support::wait_clean(&client, &name, format!("{CHECK}: lock free")).await;
    let never_used = support::lock_name(CHECK);
    let was_held = client.force_unlock(&never_used).await.or_fail(CHECK);
    assert!(
        !was_held,
        "{CHECK}: force_unlock of a lock never used must return false"
    );
    support::wait_clean(&client, &never_used, format!("{CHECK}: nothing created")).await;
}

/// Release and extend by anyone but the holder with its token are refused and change nothing:
/// another owner, the holder with a wrong token, an attempt of the holder that holds no level,
/// `abandon` by an attempt that is not queued. A release names its level: releasing one level
/// leaves the others, and the same release delivered again (a re-send) changes nothing and
/// answers as the first did: `Released`, also once the hold is gone and another owner holds
/// the lock (the first freed it: the caller lost nothing), and `NotHeld` when the first found
/// the hold gone (force-released).
pub async fn release_by_non_owner(backend: Arc<dyn LockBackend>) {
    const CHECK: &str = "release_by_non_owner";
    let client = support::client(&backend);
    let name = support::lock_name(CHECK);
    let lock_name = LockName::new(&name).or_fail(CHECK);
    let lease = Duration::from_secs(5);
    let [holder, stranger] = [Owner::unique(), Owner::unique()];
    let [outer, inner] = [AttemptId::random(), AttemptId::random()];
    let ttl = support::WAITER_TTL;

    let granted = raw_acquire_as(&backend, &name, &holder, outer, lease, ttl, false).await;
    let AcquireOutcome::Granted(first) = granted else {
        panic!("{CHECK}: a fresh lock must be granted, got {granted:?}");
    };
    let granted = raw_acquire_as(&backend, &name, &holder, inner, lease, ttl, false).await;
    assert!(
        matches!(granted, AcquireOutcome::Granted(g) if g.token == first.token && g.hold_count == 2),
        "{CHECK}: re-entry by another attempt of the holder: got {granted:?}"
    );
    let before = client.state(&name).await.or_fail(CHECK);
    let token = first.token;
    let wrong = [
        (&stranger, token, AttemptId::random()),
        (&holder, token.wrapping_add(1), AttemptId::random()),
        (&holder, token.wrapping_sub(1), AttemptId::random()),
        (&holder, token, AttemptId::random()),
    ];
    for (owner, token, attempt) in wrong {
        let released = backend
            .release(&lock_name, owner, token, attempt)
            .await
            .or_fail(CHECK);
        assert_eq!(
            released,
            ReleaseOutcome::NotHeld,
            "{CHECK}: release by {owner} ({attempt}) with token {token} of a lock held by {holder} with token {}",
            first.token
        );
        if owner != &holder || token != first.token {
            let extended = backend
                .extend(&lock_name, owner, token, lease * 2)
                .await
                .or_fail(CHECK);
            assert!(
                !extended,
                "{CHECK}: extend by {owner} with token {token} must be refused"
            );
        }
    }
    backend
        .abandon(&lock_name, &stranger, AttemptId::random())
        .await
        .or_fail(format!("{CHECK}: abandon by a non-waiter"));
    let after = client.state(&name).await.or_fail(CHECK);
    assert_eq!(
        (
            after
                .holder
                .as_ref()
                .map(|h| (&h.owner, h.hold_count, h.token, h.confirmed)),
            &after.waiters
        ),
        (
            before
                .holder
                .as_ref()
                .map(|h| (&h.owner, h.hold_count, h.token, h.confirmed)),
            &before.waiters
        ),
        "{CHECK}: refused calls must change nothing"
    );
    let remaining = after
        .holder
        .as_ref()
        .map(|h| h.lease_remaining)
        .unwrap_or_default();
    assert!(
        remaining <= lease,
        "{CHECK}: a refused extend must not lengthen the lease: {after:?}"
    );

    // Each release removes its own level, once: the same release again changes nothing.
    let expected = [
        (outer, ReleaseOutcome::Released { remaining: 1 }),
        (outer, ReleaseOutcome::Released { remaining: 1 }),
        (inner, ReleaseOutcome::Released { remaining: 0 }),
        // The hold is gone, but by this very release: a re-send must not report it lost.
        (inner, ReleaseOutcome::Released { remaining: 0 }),
    ];
    for (i, (attempt, want)) in expected.into_iter().enumerate() {
        let released = backend
            .release(&lock_name, &holder, token, attempt)
            .await
            .or_fail(CHECK);
        assert_eq!(
            released, want,
            "{CHECK}: release of level {attempt} (the second time: a re-send)"
        );
        if i == 1 {
            // The owner still holds (the other level): a re-sent acquire of the released
            // attempt is still that of an ended attempt, not a re-entry.
            for queue in [false, true] {
                let resent =
                    raw_acquire_as(&backend, &name, &holder, outer, lease, ttl, queue).await;
                assert_eq!(
                    resent,
                    AcquireOutcome::Busy,
                    "{CHECK}: an acquire of a released attempt while its owner still holds must change nothing"
                );
            }
            let state = client.state(&name).await.or_fail(CHECK);
            assert!(
                state.holder.as_ref().is_some_and(|h| h.hold_count == 1)
                    && state.waiters.is_empty(),
                "{CHECK}: a re-sent acquire of a released attempt re-entered: {state:?}"
            );
        }
    }
    let state = client.state(&name).await.or_fail(CHECK);
    assert!(
        state.holder.is_none() && state.waiters.is_empty(),
        "{CHECK}: lock free: {state:?}"
    );
    // Another owner holds the lock now: the release re-sent once more still answers as it did,
    // and leaves the new hold alone.
    let granted = raw_acquire(&backend, &name, &stranger, lease, ttl, false).await;
    let AcquireOutcome::Granted(other) = granted else {
        panic!("{CHECK}: a free lock must be granted, got {granted:?}");
    };
    let resent = backend
        .release(&lock_name, &holder, token, inner)
        .await
        .or_fail(CHECK);
    assert_eq!(
        resent,
        ReleaseOutcome::Released { remaining: 0 },
        "{CHECK}: a release re-sent after another owner took the lock it freed"
    );
    let state = client.state(&name).await.or_fail(CHECK);
    assert!(
        state
            .holder
            .as_ref()
            .is_some_and(|h| h.owner == stranger.as_str() && h.token == other.token),
        "{CHECK}: a re-sent release must leave the next hold alone: {state:?}"
    );
    super::fifo::release_raw(&backend, &name, &stranger, other.token, CHECK).await;
    // A re-sent acquire of an ended attempt changes nothing.
    let resent = raw_acquire_as(&backend, &name, &holder, outer, lease, ttl, true).await;
    assert_eq!(
        resent,
        AcquireOutcome::Busy,
        "{CHECK}: an acquire of an attempt that ended must change nothing"
    );
    let state = client.state(&name).await.or_fail(CHECK);
    assert!(
        state.holder.is_none() && state.waiters.is_empty(),
        "{CHECK}: a re-sent acquire of a released attempt took the lock: {state:?}"
    );

    // A new hold: a release with the previous hold's token is refused.
    let single_attempt = AttemptId::random();
    let granted = raw_acquire_as(&backend, &name, &holder, single_attempt, lease, ttl, false).await;
    let AcquireOutcome::Granted(single) = granted else {
        panic!("{CHECK}: a free lock must be granted, got {granted:?}");
    };
    assert!(
        single.token > token,
        "{CHECK}: a new hold by the same owner gets a new token"
    );
    let stale = backend
        .release(&lock_name, &holder, token, AttemptId::random())
        .await
        .or_fail(CHECK);
    assert_eq!(
        stale,
        ReleaseOutcome::NotHeld,
        "{CHECK}: a release with the previous hold's token"
    );
    let released = backend
        .release(&lock_name, &holder, single.token, single_attempt)
        .await
        .or_fail(CHECK);
    assert_eq!(
        released,
        ReleaseOutcome::Released { remaining: 0 },
        "{CHECK}: release"
    );

    // A release that finds its hold gone (force-released) answers NotHeld, and so does every
    // re-send of it: the lease was lost, and a retry must not hide that.
    let lost_attempt = AttemptId::random();
    let granted = raw_acquire_as(&backend, &name, &holder, lost_attempt, lease, ttl, false).await;
    let AcquireOutcome::Granted(lost) = granted else {
        panic!("{CHECK}: a free lock must be granted, got {granted:?}");
    };
    let freed = backend
        .force_release(&lock_name, lost.token)
        .await
        .or_fail(CHECK);
    assert!(freed, "{CHECK}: force_release of the hold");
    for send in ["first", "re-sent"] {
        let released = backend
            .release(&lock_name, &holder, lost.token, lost_attempt)
            .await
            .or_fail(CHECK);
        assert_eq!(
            released,
            ReleaseOutcome::NotHeld,
            "{CHECK}: the {send} release of a force-released hold"
        );
    }
    support::wait_clean(&client, &name, format!("{CHECK}: lock free at the end")).await;
}

/// An abandoned attempt stays ended: its `acquire` delivered again (a re-send that sat in the
/// network, or a heartbeat sent just before the caller gave up) answers `Busy` and changes
/// nothing, whether it asks to queue or not, while another owner holds and once the lock is
/// free. So does that of an attempt abandoned before any call of it reached the store (the
/// contract records it spent all the same): otherwise a request sent before a cancellation
/// and delivered after it would queue the attempt again, or take a free lock nobody will
/// release before its lease ends.
pub async fn abandoned_attempts_stay_ended(backend: Arc<dyn LockBackend>) {
    const CHECK: &str = "abandoned_attempts_stay_ended";
    let client = support::client(&backend);
    let name = support::lock_name(CHECK);
    let lock_name = LockName::new(&name).or_fail(CHECK);
    let lease = Duration::from_secs(5);
    let ttl = support::WAITER_TTL;
    let [holder, waiter, early] = [Owner::unique(), Owner::unique(), Owner::unique()];
    let (queued, unsent) = (AttemptId::random(), AttemptId::random());

    let granted = raw_acquire(&backend, &name, &holder, lease, ttl, false).await;
    let AcquireOutcome::Granted(hold) = granted else {
        panic!("{CHECK}: a fresh lock must be granted, got {granted:?}");
    };
    let joined = raw_acquire_as(&backend, &name, &waiter, queued, lease, ttl, true).await;
    assert!(
        matches!(joined, AcquireOutcome::Queued { .. }),
        "{CHECK}: a waiter behind a holder is queued, got {joined:?}"
    );
    backend
        .abandon(&lock_name, &waiter, queued)
        .await
        .or_fail(format!("{CHECK}: abandon"));
    backend
        .abandon(&lock_name, &early, unsent)
        .await
        .or_fail(format!("{CHECK}: abandon of an attempt that never called"));
    let resend = |phase: &'static str| {
        let (backend, name, client) = (backend.clone(), name.clone(), client.clone());
        let (waiter, early) = (waiter.clone(), early.clone());
        async move {
            for (owner, attempt) in [(&waiter, queued), (&early, unsent)] {
                for queue in [true, false] {
                    let resent =
                        raw_acquire_as(&backend, &name, owner, attempt, lease, ttl, queue).await;
                    assert_eq!(
                        resent,
                        AcquireOutcome::Busy,
                        "{CHECK}: {phase}: an acquire (queue: {queue}) of an abandoned attempt must change nothing"
                    );
                }
            }
            let state = client.state(&name).await.or_fail(CHECK);
            assert!(
                state.waiters.is_empty(),
                "{CHECK}: {phase}: an abandoned attempt queued again: {state:?}"
            );
            state
        }
    };
    let state = resend("while held").await;
    assert!(
        state.holder.as_ref().is_some_and(|h| h.token == hold.token),
        "{CHECK}: the hold is untouched: {state:?}"
    );
    super::fifo::release_raw(&backend, &name, &holder, hold.token, CHECK).await;
    let state = resend("once free").await;
    assert!(
        state.holder.is_none(),
        "{CHECK}: an abandoned attempt took the free lock: {state:?}"
    );
    support::wait_clean(&client, &name, format!("{CHECK}: lock free at the end")).await;
}
