//! Leases: a fixed lease ends the hold, the watchdog keeps it, the lost-lease signal and
//! `unlock` report the loss.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{sleep, timeout, Instant};

use super::support::{self, raw_acquire_as, OrFail, Waiter};
use crate::backend::{AcquireOutcome, AttemptId, LockBackend, ReleaseOutcome};
use crate::error::Error;
use crate::name::{LockName, Owner};

/// A holder with a short fixed lease (300 ms) that is never renewed loses the lock when the
/// lease ends: the queued waiter gets it with a larger token, not before the lease could have
/// ended, and within a generous bound after. The old guard's lost-lease signal has fired and
/// its `unlock` fails with [`Error::LeaseLost`] without disturbing the new holder.
pub async fn lease_expiry_frees_lock(backend: Arc<dyn LockBackend>) {
    const CHECK: &str = "lease_expiry_frees_lock";
    let lease = Duration::from_millis(300);
    let client = support::client(&backend);
    let name = support::lock_name(CHECK);
    let holder = support::fixed_lease_client(&backend, lease)
        .fair_lock(&name)
        .or_fail(CHECK);
    let sent = Instant::now();
    let held = holder.lock().await.or_fail(format!("{CHECK}: holder lock"));
    let mut waiter = Waiter::enqueue(CHECK, &client, client.fair_lock(&name).or_fail(CHECK)).await;

    let acquired = waiter.acquired_within(lease + support::EVENTUALLY).await;
    // The store granted the holder after `sent`, so its lease lasted past `sent + lease`.
    assert!(
        acquired.at + support::CLOCK_SLACK >= sent + lease,
        "{CHECK}: the waiter got the lock {:?} after the holder asked for it, before its {lease:?} lease ended",
        acquired.at - sent
    );
    assert!(
        acquired.token > held.fencing_token(),
        "{CHECK}: the next holder's token {} must exceed the expired holder's {}",
        acquired.token,
        held.fencing_token()
    );
    assert!(
        held.is_lease_lost(),
        "{CHECK}: the expired guard must report its lease lost"
    );
    timeout(support::EVENTUALLY, held.lease_lost())
        .await
        .unwrap_or_else(|_| panic!("{CHECK}: lease_lost() of an expired guard did not complete"));
    let unlocked = held.unlock().await;
    assert!(
        matches!(unlocked, Err(Error::LeaseLost { .. })),
        "{CHECK}: unlock after the lease ran out: expected LeaseLost, got {unlocked:?}"
    );
    let state = client.state(&name).await.or_fail(CHECK);
    let intact = state
        .holder
        .as_ref()
        .is_some_and(|h| h.owner == waiter.owner().as_str() && h.token == acquired.token);
    assert!(
        intact,
        "{CHECK}: the stale unlock must not touch the new hold: {state:?}"
    );
    waiter.release().await;
    support::wait_clean(&client, &name, format!("{CHECK}: lock free at the end")).await;
}

/// With the watchdog (a 400 ms lease renewed every third), a holder keeps the lock over four
/// of its leases: other owners' `try_lock` keeps failing, a waiter keeps waiting, the state
/// shows the same holder and token, and the lost-lease signal never fires. After `unlock` the
/// waiter gets the lock.
pub async fn watchdog_keeps_lock(backend: Arc<dyn LockBackend>) {
    const CHECK: &str = "watchdog_keeps_lock";
    let client = support::client(&backend);
    let name = support::lock_name(CHECK);
    let holder = client.fair_lock(&name).or_fail(CHECK);
    let held = holder.lock().await.or_fail(format!("{CHECK}: holder lock"));
    let token = held.fencing_token();
    let mut waiter = Waiter::enqueue(CHECK, &client, client.fair_lock(&name).or_fail(CHECK)).await;
    let other = client.fair_lock(&name).or_fail(CHECK);

    let until = Instant::now() + support::WATCHDOG_LEASE * 4;
    while Instant::now() < until {
        sleep(support::WATCHDOG_LEASE / 4).await;
        let state = client.state(&name).await.or_fail(CHECK);
        let kept = state.holder.as_ref().is_some_and(|h| {
            h.owner == holder.owner().as_str() && h.token == token && h.hold_count == 1
        });
        assert!(
            kept,
            "{CHECK}: the watchdog must keep the lock held: {state:?}"
        );
        let refused = other.try_lock().await;
        assert!(
            matches!(refused, Err(Error::WouldBlock { .. })),
            "{CHECK}: try_lock by another owner while held: expected WouldBlock, got {refused:?}"
        );
        assert!(
            !waiter.has_acquired(),
            "{CHECK}: the waiter got the lock while it was kept"
        );
        assert!(
            !held.is_lease_lost(),
            "{CHECK}: the watchdog's lease was reported lost"
        );
    }
    held.unlock()
        .await
        .or_fail(format!("{CHECK}: unlock after renewals"));
    waiter.acquired_within(support::EVENTUALLY).await;
    waiter.release().await;
    support::wait_clean(&client, &name, format!("{CHECK}: lock free at the end")).await;
}

/// The lost-lease signal of a fixed lease: `extend` pushes it back (the signal does not fire
/// at the original end), and once the extended lease runs out `lease_lost()` completes,
/// `is_lease_lost()` is true and `extend` fails with [`Error::LeaseLost`]. (Force release by
/// another party is covered by [`force_release`](super::force_release).)
pub async fn lease_lost_signal(backend: Arc<dyn LockBackend>) {
    const CHECK: &str = "lease_lost_signal";
    let lease = Duration::from_millis(300);
    let name = support::lock_name(CHECK);
    let lock = support::fixed_lease_client(&backend, lease)
        .fair_lock(&name)
        .or_fail(CHECK);
    let held = lock.lock().await.or_fail(CHECK);
    let acquired = Instant::now();
    sleep(lease / 3).await;
    let extension = Duration::from_millis(500);
    let extend_sent = Instant::now();
    held.extend(extension)
        .await
        .or_fail(format!("{CHECK}: extend"));
    let early = timeout(
        (acquired + lease + lease / 3).saturating_duration_since(Instant::now()),
        held.lease_lost(),
    )
    .await;
    assert!(
        early.is_err() && !held.is_lease_lost(),
        "{CHECK}: lease_lost() fired at the original end of a lease that was extended"
    );
    timeout(support::EVENTUALLY, held.lease_lost())
        .await
        .unwrap_or_else(|_| {
            panic!("{CHECK}: lease_lost() did not fire after the extended lease ran out")
        });
    assert!(
        Instant::now() + support::CLOCK_SLACK >= extend_sent + extension,
        "{CHECK}: lease_lost() fired before the extended lease could end"
    );
    assert!(
        held.is_lease_lost(),
        "{CHECK}: is_lease_lost() after the signal"
    );
    let state = support::state_where(
        &support::client(&backend),
        &name,
        support::EVENTUALLY,
        format!("{CHECK}: the store frees the lock after the extended lease"),
        |s| s.holder.is_none(),
    )
    .await;
    assert!(
        state.waiters.is_empty(),
        "{CHECK}: nobody queued: {state:?}"
    );
    let extend = held.extend(Duration::from_secs(1)).await;
    assert!(
        matches!(extend, Err(Error::LeaseLost { .. })),
        "{CHECK}: extend after the lease ran out: expected LeaseLost, got {extend:?}"
    );
    let unlocked = held.unlock().await;
    assert!(
        matches!(unlocked, Err(Error::LeaseLost { .. })),
        "{CHECK}: unlock after the lease ran out: expected LeaseLost, got {unlocked:?}"
    );
}

/// A hold whose lease ran out is gone for its own owner too: its `extend` answers `false`
/// and revives nothing, its attempt's `acquire` delivered again answers `Busy`, and a new
/// attempt of the same owner is a new grant (a larger token, hold count 1), not a re-entry of
/// the hold it had. A store that expires lazily and matches the owner and token without the
/// lease would otherwise bring the hold back, its dead levels with it.
pub async fn expired_hold_stays_ended(backend: Arc<dyn LockBackend>) {
    const CHECK: &str = "expired_hold_stays_ended";
    let lease = Duration::from_millis(300);
    let ttl = support::WAITER_TTL;
    let client = support::client(&backend);
    let name = support::lock_name(CHECK);
    let lock_name = LockName::new(&name).or_fail(CHECK);
    let owner = Owner::unique();
    let (first, second) = (AttemptId::random(), AttemptId::random());
    let granted = raw_acquire_as(&backend, &name, &owner, first, lease, ttl, false).await;
    let AcquireOutcome::Granted(hold) = granted else {
        panic!("{CHECK}: a fresh lock must be granted, got {granted:?}");
    };
    sleep(lease + support::clock_slack(&backend)).await;
    support::state_where(&client, &name, support::EVENTUALLY, CHECK, |s| {
        s.holder.is_none()
    })
    .await;

    let extended = backend
        .extend(&lock_name, &owner, hold.token, Duration::from_secs(5))
        .await
        .or_fail(CHECK);
    assert!(
        !extended,
        "{CHECK}: extend of a hold whose lease ran out must answer false"
    );
    let resent = raw_acquire_as(&backend, &name, &owner, first, lease, ttl, false).await;
    assert_eq!(
        resent,
        AcquireOutcome::Busy,
        "{CHECK}: the expired hold's attempt asked again"
    );
    let state = client.state(&name).await.or_fail(CHECK);
    assert!(
        state.holder.is_none(),
        "{CHECK}: the expired hold came back: {state:?}"
    );
    // A long lease: the release below must find the hold however slow the store.
    let again = raw_acquire_as(
        &backend,
        &name,
        &owner,
        second,
        Duration::from_secs(30),
        ttl,
        false,
    )
    .await;
    let AcquireOutcome::Granted(new) = again else {
        panic!("{CHECK}: a new attempt of the owner on the free lock: got {again:?}");
    };
    assert!(
        new.token > hold.token && new.hold_count == 1,
        "{CHECK}: a new attempt of the owner after its hold expired must be a new grant \
         (token above {}, count 1), got {new:?}",
        hold.token
    );
    let released = backend
        .release(&lock_name, &owner, new.token, second)
        .await
        .or_fail(CHECK);
    assert_eq!(
        released,
        ReleaseOutcome::Released { remaining: 0 },
        "{CHECK}: one level to release"
    );
    support::wait_clean(&client, &name, format!("{CHECK}: lock free at the end")).await;
}
