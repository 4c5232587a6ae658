//! Releasing: force release by an operator, and releases that must be refused.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::timeout;

use super::support::{self, raw_acquire, OrFail, Waiter};
use crate::backend::{AcquireOutcome, LockBackend, ReleaseOutcome};
use crate::error::Error;
use crate::name::{LockName, Owner};

/// `force_unlock` frees a lock held at hold count 2 and returns `true`; the head waiter gets
/// it next (with a larger token); the old holder's lost-lease signal fires (its watchdog finds
/// it no longer holds) and both its guards' `unlock` fail with [`Error::LeaseLost`] without
/// touching the new hold. On a free lock, or one never used, it returns `false`. The head
/// waiter's [`Watch`](crate::backend::Watch) gets a wake-up (within a generous 2 s).
pub async fn force_release(backend: Arc<dyn LockBackend>) {
    const CHECK: &str = "force_release";
    let client = support::client(&backend);
    let name = support::lock_name(CHECK);
    let holder = client.fair_lock(&name).or_fail(CHECK);
    let outer = holder.lock().await.or_fail(CHECK);
    let inner = holder.lock().await.or_fail(CHECK);
    let mut waiter = Waiter::enqueue(CHECK, &client, client.fair_lock(&name).or_fail(CHECK)).await;

    let was_held = client
        .force_unlock(&name)
        .await
        .or_fail(format_args!("{CHECK}: force_unlock"));
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
    support::wait_clean(&client, &name, format_args!("{CHECK}: lock free")).await;

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
        format_args!("{CHECK}: queue behind the holder"),
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
    support::wait_clean(&client, &name, format_args!("{CHECK}: lock free")).await;
    let never_used = support::lock_name(CHECK);
    let was_held = client.force_unlock(&never_used).await.or_fail(CHECK);
    assert!(
        !was_held,
        "{CHECK}: force_unlock of a lock never used must return false"
    );
    support::wait_clean(
        &client,
        &never_used,
        format_args!("{CHECK}: nothing created"),
    )
    .await;
}

/// Release and extend by anyone but the holder with its token are refused and change nothing:
/// another owner with the right token, the holder with a wrong token, `leave_queue` by an
/// owner that is not queued. A release after the last level (a second `unlock` of the same
/// hold) is `NotHeld`, at hold count 1 and after a re-entry.
pub async fn release_by_non_owner(backend: Arc<dyn LockBackend>) {
    const CHECK: &str = "release_by_non_owner";
    let client = support::client(&backend);
    let name = support::lock_name(CHECK);
    let lock_name = LockName::new(&name).or_fail(CHECK);
    let lease = Duration::from_secs(5);
    let [holder, stranger] = [Owner::unique(), Owner::unique()];

    let granted = raw_acquire(&backend, &name, &holder, lease, support::WAITER_TTL, false).await;
    let AcquireOutcome::Granted(first) = granted else {
        panic!("{CHECK}: a fresh lock must be granted, got {granted:?}");
    };
    let granted = raw_acquire(&backend, &name, &holder, lease, support::WAITER_TTL, false).await;
    assert!(
        matches!(granted, AcquireOutcome::Granted(g) if g.token == first.token && g.hold_count == 2),
        "{CHECK}: re-entry by the holder: got {granted:?}"
    );
    let before = client.state(&name).await.or_fail(CHECK);
    let token = first.token;
    let wrong = [
        (&stranger, token),
        (&holder, token.wrapping_add(1)),
        (&holder, token.wrapping_sub(1)),
    ];
    for (owner, token) in wrong {
        let released = backend
            .release(&lock_name, owner, token)
            .await
            .or_fail(CHECK);
        assert_eq!(
            released,
            ReleaseOutcome::NotHeld,
            "{CHECK}: release by {owner} with token {token} of a lock held by {holder} with token {}",
            first.token
        );
        let extended = backend
            .extend(&lock_name, owner, token, lease * 2)
            .await
            .or_fail(CHECK);
        assert!(
            !extended,
            "{CHECK}: extend by {owner} with token {token} must be refused"
        );
    }
    backend
        .leave_queue(&lock_name, &stranger)
        .await
        .or_fail(format_args!("{CHECK}: leave_queue by a non-waiter"));
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

    for expected in [1, 0] {
        let released = backend
            .release(&lock_name, &holder, token)
            .await
            .or_fail(CHECK);
        assert_eq!(
            released,
            ReleaseOutcome::Released {
                remaining: expected
            },
            "{CHECK}: release by the holder"
        );
    }
    let again = backend
        .release(&lock_name, &holder, token)
        .await
        .or_fail(CHECK);
    assert_eq!(
        again,
        ReleaseOutcome::NotHeld,
        "{CHECK}: a release after the last level"
    );
    let state = client.state(&name).await.or_fail(CHECK);
    assert!(
        state.holder.is_none() && state.waiters.is_empty(),
        "{CHECK}: lock free: {state:?}"
    );

    // Single level: the second release of the same hold is refused.
    let granted = raw_acquire(&backend, &name, &holder, lease, support::WAITER_TTL, false).await;
    let AcquireOutcome::Granted(single) = granted else {
        panic!("{CHECK}: a free lock must be granted, got {granted:?}");
    };
    assert!(
        single.token > token,
        "{CHECK}: a new hold by the same owner gets a new token"
    );
    let stale = backend
        .release(&lock_name, &holder, token)
        .await
        .or_fail(CHECK);
    assert_eq!(
        stale,
        ReleaseOutcome::NotHeld,
        "{CHECK}: a release with the previous hold's token"
    );
    let released = backend
        .release(&lock_name, &holder, single.token)
        .await
        .or_fail(CHECK);
    assert_eq!(
        released,
        ReleaseOutcome::Released { remaining: 0 },
        "{CHECK}: release"
    );
    let again = backend
        .release(&lock_name, &holder, single.token)
        .await
        .or_fail(CHECK);
    assert_eq!(
        again,
        ReleaseOutcome::NotHeld,
        "{CHECK}: the second release of one hold"
    );
    support::wait_clean(
        &client,
        &name,
        format_args!("{CHECK}: lock free at the end"),
    )
    .await;
}
