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
        matches!(outcome, Err(Error::Unavailable { .. })),
        "a store gone is Unavailable, not a busy lock: {outcome:?}"
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

/// `lock()` rides out a store that goes away and comes back (here a restart with append-only
/// persistence, so the queue survives): no error reaches the waiters, and they keep their
/// places in the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_ride_out_a_restart_and_keep_their_places() {
    let mut server =
        RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]).unwrap();
    let url = server.url();
    let opts = options(Duration::from_secs(10), Duration::from_secs(4));
    let holder = client(&url, opts.clone()).await.fair_lock("ride").unwrap();
    let held = holder.lock().await.unwrap();
    let (order_tx, mut order) = tokio::sync::mpsc::unbounded_channel();
    let mut waiters = Vec::new();
    for who in 0..2 {
        // A command timeout below the outage, so calls fail during it (fred would otherwise
        // hold them until the server is back).
        let backend = fairlock_redis::RedisBackend::builder(url.clone())
            .command_timeout(Duration::from_millis(300))
            .connect()
            .await
            .unwrap();
        let lock = fairlock::LockClient::new(backend)
            .with_options(opts.clone())
            .unwrap()
            .fair_lock("ride")
            .unwrap();
        let order_tx = order_tx.clone();
        waiters.push(tokio::spawn(async move {
            let guard = lock.lock().await?;
            order_tx.send(who).unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
            guard.unlock().await
        }));
        let queued = who + 1;
        bounded("queueing", Duration::from_secs(5), async {
            while holder.state().await.unwrap().waiters.len() < queued {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
    }
    // Down for a second, well inside the waiters' 4 s TTL.
    server.stop();
    tokio::time::sleep(Duration::from_secs(1)).await;
    server.restart().unwrap();
    let _ = bounded(
        "unlock after the restart",
        Duration::from_secs(15),
        held.unlock(),
    )
    .await;
    for waiter in waiters {
        bounded("waiter", Duration::from_secs(20), waiter)
            .await
            .unwrap()
            .unwrap_or_else(|err| panic!("a waiter saw the outage: {err}"));
    }
    let first = order.recv().await.unwrap();
    let second = order.recv().await.unwrap();
    assert_eq!((first, second), (0, 1), "the waiters kept their places");
}

/// A store that stays away: `lock()` returns `Unavailable` once its outage budget is spent
/// (counted from the first failed call; each call is bounded by the command timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_gives_up_after_its_outage_budget() {
    let mut server = RedisServer::start().unwrap();
    let url = server.url();
    let mut opts = options(Duration::from_secs(10), Duration::from_secs(3));
    opts.outage_budget = Duration::from_secs(1);
    let holder = client(&url, opts.clone()).await.fair_lock("gone").unwrap();
    let held = holder.lock().await.unwrap();
    let backend = fairlock_redis::RedisBackend::builder(url.clone())
        .command_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap();
    let waiter = fairlock::LockClient::new(backend)
        .with_options(opts)
        .unwrap()
        .fair_lock("gone")
        .unwrap();
    let waiting = tokio::spawn(async move { waiter.lock().await.map(drop) });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stopped = Instant::now();
    server.stop();
    let outcome = bounded("lock", Duration::from_secs(20), waiting)
        .await
        .unwrap();
    let took = stopped.elapsed();
    assert!(
        matches!(outcome, Err(Error::Unavailable { .. })),
        "{outcome:?}"
    );
    // The heartbeat (1 s), a failing call (0.5 s), the budget (1 s), and slack.
    assert!(
        took <= Duration::from_secs(5),
        "lock() gave up after {took:?}"
    );
    drop(held);
}
