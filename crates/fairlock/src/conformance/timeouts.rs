//! Bounded waits.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::support::{self, OrFail, Waiter};
use crate::backend::LockBackend;
use crate::error::Error;
use crate::options::LockOptions;

/// `try_lock_for` on a held lock fails with [`Error::Timeout`] no earlier than its wait, and
/// has left the queue by the time it returns. The waiter that queued behind it is not delayed:
/// when the holder unlocks, it gets the lock at once (within a bound far below the liveness
/// TTL, 10 s, that the timed-out waiter's place would otherwise have lasted).
pub async fn wait_timeout_leaves_queue(backend: Arc<dyn LockBackend>) {
    const CHECK: &str = "wait_timeout_leaves_queue";
    let client = support::client(&backend);
    let name = support::lock_name(CHECK);
    let held = client
        .fair_lock(&name)
        .or_fail(CHECK)
        .lock()
        .await
        .or_fail(CHECK);

    // A long TTL: had the impatient waiter's place been left behind, it would block for long.
    let impatient = support::client_with(
        &backend,
        LockOptions {
            waiter_ttl: Duration::from_secs(10),
            ..support::options()
        },
    )
    .fair_lock(&name)
    .or_fail(CHECK);
    let wait = Duration::from_millis(300);
    let impatient_owner = impatient.owner().clone();
    let started = Instant::now();
    let timing_out = tokio::spawn(async move { impatient.try_lock_for(wait).await.map(drop) });
    support::wait_queued(
        &client,
        &name,
        &impatient_owner,
        format!("{CHECK}: the bounded waiter queues"),
    )
    .await;
    let mut behind = Waiter::enqueue(CHECK, &client, client.fair_lock(&name).or_fail(CHECK)).await;

    let outcome = timing_out
        .await
        .unwrap_or_else(|e| panic!("{CHECK}: task: {e}"));
    let waited = started.elapsed();
    assert!(
        matches!(outcome, Err(Error::Timeout { .. })),
        "{CHECK}: try_lock_for({wait:?}) on a held lock: expected Timeout, got {outcome:?}"
    );
    assert!(
        waited >= wait,
        "{CHECK}: try_lock_for({wait:?}) gave up after only {waited:?}"
    );
    let state = client.state(&name).await.or_fail(CHECK);
    assert_eq!(
        support::waiter_owners(&state),
        vec![behind.owner().to_string()],
        "{CHECK}: a timed-out waiter must have left the queue when try_lock_for returns"
    );

    let released = Instant::now();
    held.unlock().await.or_fail(CHECK);
    let acquired = behind.acquired_within(support::EVENTUALLY).await;
    assert!(
        acquired.at >= released,
        "{CHECK}: the waiter got the lock before the holder released it"
    );
    behind.release().await;
    support::wait_clean(&client, &name, format!("{CHECK}: lock free at the end")).await;
}
