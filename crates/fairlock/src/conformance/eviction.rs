//! Waiter liveness: a waiter that stops heart-beating is dropped and blocks nobody.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::support::{self, raw_acquire, OrFail, Waiter};
use crate::backend::{AcquireOutcome, LockBackend};
use crate::error::Error;
use crate::name::Owner;
use crate::options::LockOptions;

/// The liveness TTL of the dead waiters in this check.
const DEAD_TTL: Duration = Duration::from_millis(400);

/// A waiter that queued once with a 400 ms liveness TTL and never called again (a raw
/// `acquire`, like a crashed process) is evicted, at the head of the queue and in the middle:
/// - at the head, with the lock released while it is still live: the live waiter behind it
///   gets the lock, but not before the dead one's deadline (it was first in line until then);
/// - in the middle: it disappears from `state().waiters` without holding up the waiters
///   around it, is never granted the lock, and the waiter behind it is served next;
/// - at the head of a lock whose holder's lease ran out (no release, so no hand-over): the
///   live waiter behind gets the lock once the dead one's deadline has passed.
pub async fn dead_waiters_are_evicted(backend: Arc<dyn LockBackend>) {
    const CHECK: &str = "dead_waiters_are_evicted";
    let client = support::client(&backend);

    // At the head.
    let name = support::lock_name(CHECK);
    let held = client
        .fair_lock(&name)
        .or_fail(CHECK)
        .lock()
        .await
        .or_fail(CHECK);
    let dead = Owner::unique();
    let dead_sent = Instant::now();
    queue_dead(&backend, &name, &dead, DEAD_TTL, CHECK).await;
    let mut live = Waiter::enqueue(CHECK, &client, client.fair_lock(&name).or_fail(CHECK)).await;
    let state = client.state(&name).await.or_fail(CHECK);
    let owners = support::waiter_owners(&state);
    assert!(
        owners.last() == Some(&live.owner().to_string())
            && !owners[..owners.len() - 1].contains(&live.owner().to_string()),
        "{CHECK}: the live waiter queued behind the dead one: {state:?}"
    );
    held.unlock().await.or_fail(CHECK);
    let acquired = live.acquired_within(DEAD_TTL + support::EVENTUALLY).await;
    assert!(
        acquired.at + support::CLOCK_SLACK >= dead_sent + DEAD_TTL,
        "{CHECK}: the waiter behind got the lock {:?} after the dead head waiter queued, before that one's {DEAD_TTL:?} liveness ended",
        acquired.at - dead_sent
    );
    let state = client.state(&name).await.or_fail(CHECK);
    assert!(
        !support::waiter_owners(&state).contains(&dead.to_string()),
        "{CHECK}: the dead waiter is still listed: {state:?}"
    );
    live.release().await;
    support::wait_clean(
        &client,
        &name,
        format!("{CHECK}: lock free at the end (head)"),
    )
    .await;

    // In the middle.
    let name = support::lock_name(CHECK);
    let held = client
        .fair_lock(&name)
        .or_fail(CHECK)
        .lock()
        .await
        .or_fail(CHECK);
    let mut first = Waiter::enqueue(CHECK, &client, client.fair_lock(&name).or_fail(CHECK)).await;
    let dead = Owner::unique();
    queue_dead(&backend, &name, &dead, DEAD_TTL, CHECK).await;
    let mut last = Waiter::enqueue(CHECK, &client, client.fair_lock(&name).or_fail(CHECK)).await;
    held.unlock().await.or_fail(CHECK);
    first.acquired_within(support::EVENTUALLY).await;
    let expected = vec![last.owner().to_string()];
    support::state_where(
        &client,
        &name,
        DEAD_TTL + support::EVENTUALLY,
        format!("{CHECK}: the dead waiter in the middle is evicted, the live one behind stays"),
        |s| support::waiter_owners(s) == expected,
    )
    .await;
    first.release().await;
    let state = client.state(&name).await.or_fail(CHECK);
    assert!(
        state
            .holder
            .as_ref()
            .is_none_or(|h| h.owner == last.owner().as_str()),
        "{CHECK}: after the first waiter, only the live waiter behind may hold: {state:?}"
    );
    last.acquired_within(support::EVENTUALLY).await;
    last.release().await;
    support::wait_clean(
        &client,
        &name,
        format!("{CHECK}: lock free at the end (middle)"),
    )
    .await;

    // At the head of a lock whose lease ran out (1 s: the dead waiter must queue before it
    // does, a round trip or two away, on a slow store too).
    let name = support::lock_name(CHECK);
    let lease = Duration::from_secs(1);
    let expiring = support::fixed_lease_client(&backend, lease)
        .fair_lock(&name)
        .or_fail(CHECK)
        .lock()
        .await
        .or_fail(CHECK);
    let dead = Owner::unique();
    let dead_sent = Instant::now();
    queue_dead(&backend, &name, &dead, DEAD_TTL, CHECK).await;
    let mut live = Waiter::enqueue(CHECK, &client, client.fair_lock(&name).or_fail(CHECK)).await;
    let acquired = live
        .acquired_within(lease + DEAD_TTL + support::EVENTUALLY)
        .await;
    assert!(
        acquired.at + support::CLOCK_SLACK >= dead_sent + DEAD_TTL,
        "{CHECK}: the waiter behind got the expired lock {:?} after the dead head waiter queued, before that one's {DEAD_TTL:?} liveness ended",
        acquired.at - dead_sent
    );
    assert!(
        acquired.token > expiring.fencing_token(),
        "{CHECK}: token {} after the expired holder's {}",
        acquired.token,
        expiring.fencing_token()
    );
    live.release().await;
    drop(expiring);
    support::wait_clean(
        &client,
        &name,
        format!("{CHECK}: lock free at the end (head, lease ran out)"),
    )
    .await;
}

/// Queues `dead` once with a liveness TTL (and lease) of `ttl`, never to call again.
async fn queue_dead(
    backend: &Arc<dyn LockBackend>,
    name: &str,
    dead: &Owner,
    ttl: Duration,
    check: &str,
) {
    let outcome = raw_acquire(backend, name, dead, ttl, ttl, true).await;
    assert!(
        matches!(outcome, AcquireOutcome::Queued { .. }),
        "{check}: a raw waiter on a held lock: expected Queued, got {outcome:?}"
    );
}

/// How many waiters die together in [`mass_death_blocks_nobody`]: many times what a backend
/// that bounds each call's work removes in one call (the shipped ones, up to 80), so that
/// the head stays unknown for several calls after the release, the newcomer's among them.
const CROWD: usize = 1000;

/// How many of the crowd queue at once: their deaths come close together, as when many
/// processes crash at once.
const CROWD_AT_ONCE: usize = 50;

/// The crowd's liveness TTL: they must all be queued, and the live waiters behind them, before
/// the first of them dies, so that the whole crowd stands in front when the lock is released.
const CROWD_TTL: Duration = Duration::from_secs(3);

/// The live waiters' liveness TTL, and the holder's fixed lease: long, so that no heartbeat
/// or renewal (either may remove dead entries) falls between the crowd's deaths and the
/// release, and the whole crowd stands in front then, however long it took to queue.
const LIVE_TTL: Duration = Duration::from_secs(30);

/// 1,000 waiters queue once and die together (raw `acquire`s, like processes that crashed
/// at once), in front of two live waiters; then the holder releases. The first live waiter
/// gets the lock, at once or after the waiters' calls of a backend that bounds each call's
/// work have removed the dead (the contract's *crowd of dead entries*); the second, and a
/// newcomer's `try_lock` made just after the release, never before it; and none of the dead
/// is listed.
pub async fn mass_death_blocks_nobody(backend: Arc<dyn LockBackend>) {
    const CHECK: &str = "mass_death_blocks_nobody";
    let client = support::client(&backend);
    let live = support::client_with(
        &backend,
        LockOptions {
            waiter_ttl: LIVE_TTL,
            ..support::options()
        },
    );
    let name = support::lock_name(CHECK);
    let held = support::fixed_lease_client(&backend, LIVE_TTL)
        .fair_lock(&name)
        .or_fail(CHECK)
        .lock()
        .await
        .or_fail(CHECK);
    let started = Instant::now();
    for _ in 0..CROWD / CROWD_AT_ONCE {
        let calls = (0..CROWD_AT_ONCE).map(|_| {
            let (backend, name) = (backend.clone(), name.clone());
            tokio::spawn(async move {
                queue_dead(&backend, &name, &Owner::unique(), CROWD_TTL, CHECK).await;
            })
        });
        support::join_all(calls).await;
    }
    let all_dead = Instant::now() + CROWD_TTL + support::clock_slack(&backend);
    let mut first = Waiter::enqueue(CHECK, &client, live.fair_lock(&name).or_fail(CHECK)).await;
    let mut second = Waiter::enqueue(CHECK, &client, live.fair_lock(&name).or_fail(CHECK)).await;
    let queued = started.elapsed();
    assert!(
        queued < CROWD_TTL,
        "{CHECK}: queuing {CROWD} waiters and two behind them took {queued:?}, longer than the crowd's {CROWD_TTL:?} liveness: the store is too slow for this check"
    );
    tokio::time::sleep_until(all_dead).await;

    held.unlock().await.or_fail(CHECK);
    match client.fair_lock(&name).or_fail(CHECK).try_lock().await {
        Err(Error::WouldBlock { .. }) => {}
        Ok(guard) => panic!(
            "{CHECK}: a newcomer's try_lock got the lock (token {}) with two live waiters behind the dead",
            guard.fencing_token()
        ),
        Err(error) => panic!("{CHECK}: a newcomer's try_lock: expected WouldBlock, got {error}"),
    }
    first.acquired_within(support::EVENTUALLY).await;
    assert!(
        !second.has_acquired(),
        "{CHECK}: the second live waiter got the lock while the first held it"
    );
    let state = client.state(&name).await.or_fail(CHECK);
    assert!(
        state
            .holder
            .as_ref()
            .is_some_and(|h| h.owner == first.owner().as_str())
            && support::waiter_owners(&state) == vec![second.owner().to_string()],
        "{CHECK}: the first live waiter holds and only the second is listed, none of the dead: {state:?}"
    );
    first.release().await;
    second.acquired_within(support::EVENTUALLY).await;
    second.release().await;
    support::wait_clean(&client, &name, format!("{CHECK}: lock free at the end")).await;
}
