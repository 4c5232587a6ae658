//! `try_lock_for(wait)` keeps its bound whatever the store does, and says what happened:
//! `Unavailable` when the store did not answer, `Timeout` only when the lock was busy.

use std::time::Duration;

use fairlock::Error;
use fairlock_faults::redis_env::{bounded, cli, client, options};
use fairlock_testsupport::RedisServer;
use tokio::time::Instant;

/// What `try_lock_for` may take beyond its wait: its own clean-up slack (50 ms) and a loaded
/// machine's scheduling.
const SLACK: Duration = Duration::from_millis(300);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_store_costs_the_wait_and_is_reported_unavailable() {
    let server = RedisServer::start().unwrap();
    let port = server.port();
    let opts = options(Duration::from_secs(10), Duration::from_secs(3));
    let lock = client(&server.url(), opts.clone())
        .await
        .fair_lock("paused")
        .unwrap();
    // Warm the connections and scripts, so the pause is the only slow thing.
    lock.try_lock().await.unwrap().unlock().await.unwrap();
    cli(port, None, &["CLIENT", "PAUSE", "4000", "WRITE"]);
    let wait = Duration::from_secs(1);
    let started = Instant::now();
    let outcome = bounded(
        "try_lock_for",
        Duration::from_secs(10),
        lock.try_lock_for(wait),
    )
    .await;
    let took = started.elapsed();
    cli(port, None, &["CLIENT", "UNPAUSE"]);
    assert!(
        took <= wait + SLACK,
        "try_lock_for({wait:?}) took {took:?} on a paused store"
    );
    assert!(
        matches!(outcome, Err(Error::Unavailable { .. })),
        "a store that does not answer is Unavailable, not a busy lock: {outcome:?}"
    );
    // Nothing is left once the store answers again.
    let other = client(&server.url(), opts)
        .await
        .fair_lock("paused")
        .unwrap();
    let guard = bounded(
        "lock after the pause",
        Duration::from_secs(10),
        other.lock(),
    )
    .await
    .unwrap();
    guard.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_goes_away_costs_the_wait_and_is_reported_unavailable() {
    let mut server = RedisServer::start().unwrap();
    let opts = options(Duration::from_secs(10), Duration::from_secs(3));
    let url = server.url();
    let holder = client(&url, opts.clone()).await.fair_lock("gone").unwrap();
    let waiter = client(&url, opts).await.fair_lock("gone").unwrap();
    let held = holder.lock().await.unwrap();
    let wait = Duration::from_secs(2);
    let started = Instant::now();
    let waiting = tokio::spawn(async move { waiter.try_lock_for(wait).await.map(drop) });
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.stop();
    let outcome = bounded("try_lock_for", Duration::from_secs(30), waiting)
        .await
        .unwrap();
    let took = started.elapsed();
    assert!(
        took <= wait + SLACK,
        "try_lock_for({wait:?}) took {took:?} with the store gone"
    );
    assert!(
        matches!(
            outcome,
            Err(Error::Unavailable { .. }) | Err(Error::Timeout { .. })
        ),
        "{outcome:?}"
    );
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_lock_is_a_timeout() {
    let server = RedisServer::start().unwrap();
    let opts = options(Duration::from_secs(10), Duration::from_secs(3));
    let holder = client(&server.url(), opts.clone())
        .await
        .fair_lock("busy")
        .unwrap();
    let waiter = client(&server.url(), opts).await.fair_lock("busy").unwrap();
    let held = holder.lock().await.unwrap();
    let wait = Duration::from_millis(500);
    let started = Instant::now();
    let outcome = waiter.try_lock_for(wait).await;
    let took = started.elapsed();
    assert!(matches!(outcome, Err(Error::Timeout { .. })), "{outcome:?}");
    assert!(took >= wait && took <= wait + SLACK, "took {took:?}");
    held.unlock().await.unwrap();
}
