//! Waiter liveness: a waiter that stops heart-beating is dropped and blocks nobody.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::support::{self, raw_acquire, OrFail, Waiter};
use crate::backend::{AcquireOutcome, LockBackend};
use crate::name::Owner;

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
    queue_dead(&backend, &name, &dead, CHECK).await;
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
    queue_dead(&backend, &name, &dead, CHECK).await;
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
    queue_dead(&backend, &name, &dead, CHECK).await;
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

async fn queue_dead(backend: &Arc<dyn LockBackend>, name: &str, dead: &Owner, check: &str) {
    let outcome = raw_acquire(backend, name, dead, DEAD_TTL, DEAD_TTL, true).await;
    assert!(
        matches!(outcome, AcquireOutcome::Queued { .. }),
        "{check}: a raw waiter on a held lock: expected Queued, got {outcome:?}"
    );
}
