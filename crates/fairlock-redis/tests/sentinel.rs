//! The Redis backend through Redis Sentinel: a primary, two replicas and three sentinels on
//! loopback ports. The backend finds the primary through the sentinels, and follows it when
//! the primary dies and a replica is promoted, wake-ups included.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fairlock::{LockClient, LockOptions};
use fairlock_redis::RedisBackend;
use fairlock_testsupport::RedisSentinels;

fn sentinels() -> RedisSentinels {
    RedisSentinels::start(2, 3).expect("the sentinel setup starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_work_through_sentinel() {
    let setup = sentinels();
    let backend = RedisBackend::connect(&setup.url()).await.unwrap();
    let client = LockClient::new(backend);
    let lock = client.fair_lock(common::name().as_str()).unwrap();
    let guard = lock.lock().await.unwrap();
    // A waiter is woken by the hand-over (its heartbeat is 10 s away).
    let waiter_lock = client
        .fair_lock(lock.name().as_str())
        .unwrap()
        .with_options(LockOptions::default().with_waiter_ttl(Duration::from_secs(30)))
        .unwrap();
    let waiter = tokio::spawn(async move { waiter_lock.lock().await.map(|g| g.fencing_token()) });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let first = guard.fencing_token();
    let released = Instant::now();
    guard.unlock().await.unwrap();
    let second = tokio::time::timeout(Duration::from_secs(3), waiter)
        .await
        .expect("woken, not left to its heartbeat")
        .unwrap()
        .unwrap();
    assert!(second > first);
    println!("hand-over through sentinel in {:?}", released.elapsed());
}

/// One hold as a contender saw it.
#[derive(Clone, Copy, Debug)]
struct Held {
    token: u64,
    acquired: Instant,
    released: Instant,
}

/// The primary is killed (SIGKILL) while four contenders in two processes take the lock in
/// turn: every contender goes on without an error (the outage is shorter than the outage
/// budget), fencing tokens keep increasing across the failover, and hand-overs after it are
/// wake-ups again. Without replica acknowledgement a grant the old primary had not yet
/// replicated may be lost, so two holds may overlap around the failover, but only holds that
/// began before the primary died (see docs/redis.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contenders_ride_through_a_failover() {
    let overlaps = failover(None).await;
    println!("without acknowledgement: {overlaps} overlapping holds");
}

/// The same with every grant and renewal acknowledged by a replica before it is reported: no
/// two holds overlap, across the failover too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_grants_never_overlap_across_a_failover() {
    let overlaps = failover(Some((1, Duration::from_millis(500)))).await;
    assert_eq!(overlaps, 0, "acknowledged holds overlapped");
}

/// Runs the failover scenario; how many pairs of holds overlapped (only holds that began
/// before the primary died may).
async fn failover(acks: Option<(u32, Duration)>) -> usize {
    let mut setup = sentinels();
    // The lease outlasts the failover (a holder's lease that ran out while the store was away
    // would rightly be reported lost).
    let options = LockOptions::default()
        .with_watchdog_lease(Duration::from_secs(10))
        .with_waiter_ttl(Duration::from_secs(30));
    let name = common::name();
    let stop = Arc::new(AtomicBool::new(false));
    let holds = Arc::new(Mutex::new(Vec::<Held>::new()));
    let mut contenders = Vec::new();
    for _process in 0..2 {
        let mut builder = RedisBackend::builder(setup.url());
        if let Some((replicas, timeout)) = acks {
            builder = builder.replicas_acked(replicas, timeout);
        }
        let backend = builder.connect().await.unwrap();
        let client = LockClient::new(backend)
            .with_options(options.clone())
            .unwrap();
        for _ in 0..2 {
            let lock = client.fair_lock(name.as_str()).unwrap();
            let (stop, holds) = (stop.clone(), holds.clone());
            contenders.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let guard = lock.lock().await?;
                    let acquired = Instant::now();
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    let token = guard.fencing_token();
                    let released = Instant::now();
                    guard.unlock().await?;
                    holds.lock().unwrap().push(Held {
                        token,
                        acquired,
                        released,
                    });
                }
                Ok::<_, fairlock::Error>(())
            }));
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let killed_at = Instant::now();
    let old = setup.kill_primary().unwrap();
    let new = tokio::task::spawn_blocking(move || {
        let port = setup.wait_for_new_primary(old, Duration::from_secs(30));
        (setup, port)
    })
    .await
    .unwrap();
    let (setup, new_port) = (new.0, new.1.expect("a replica is promoted"));
    let promoted = killed_at.elapsed();
    tokio::time::sleep(Duration::from_secs(4)).await;
    stop.store(true, Ordering::Relaxed);
    for contender in contenders {
        contender
            .await
            .unwrap()
            .expect("no error reaches the contenders");
    }
    drop(setup);

    let mut holds = holds.lock().unwrap().clone();
    holds.sort_by_key(|held| held.acquired);
    let mut overlaps = 0;
    for pair in holds.windows(2) {
        assert!(
            pair[1].token > pair[0].token,
            "tokens went back across the failover: {pair:?}"
        );
        if pair[1].acquired < pair[0].released {
            overlaps += 1;
            assert!(
                pair[0].acquired < killed_at,
                "holds that both began after the primary died overlap: {pair:?}"
            );
        }
    }
    let stall = holds
        .windows(2)
        .map(|pair| pair[1].acquired.saturating_duration_since(pair[0].released))
        .max()
        .unwrap_or_default();
    let after: Vec<Duration> = holds
        .windows(2)
        .filter(|pair| pair[0].released > killed_at + promoted + Duration::from_secs(2))
        .map(|pair| pair[1].acquired.saturating_duration_since(pair[0].released))
        .collect();
    let slowest_after = after.iter().max().copied().unwrap_or_default();
    println!(
        "primary {old} killed; {new_port} promoted after {promoted:?}; longest stall {stall:?}; \
         {} holds, {overlaps} overlapping; {} hand-overs from 2 s after the promotion, slowest {slowest_after:?}",
        holds.len(),
        after.len()
    );
    if acks.is_none() {
        assert!(after.len() >= 20, "too few hand-overs after the failover");
        assert!(
            slowest_after < Duration::from_millis(500),
            "hand-overs after the failover are not wake-ups: {slowest_after:?}"
        );
    }
    // With acknowledgement, no grant is handed out until a replica of the new primary has
    // caught up with it (Sentinel re-points the surviving replica, which then resynchronises):
    // the stall includes that, up to 19 s in 1 run of 20 on a loaded machine, so only
    // exclusion and the absence of errors are asserted then.
    overlaps
}

/// A backend that asks for an acknowledgement no replica can give (a server without
/// replicas) never hands out a grant: `try_lock` fails as `Unavailable`, and the lock is left
/// free, not held by a grant nobody was told of.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unacknowledged_grant_is_not_handed_out() {
    let server = common::Server::start();
    let backend = RedisBackend::builder(server.url())
        .replicas_acked(1, Duration::from_millis(50))
        .connect()
        .await
        .unwrap();
    let client = LockClient::new(backend);
    let lock = client.fair_lock(common::name().as_str()).unwrap();
    let error = lock.try_lock().await.unwrap_err();
    assert!(
        matches!(error, fairlock::Error::Unavailable { .. }),
        "{error}"
    );
    assert!(
        error
            .to_string()
            .contains("acknowledged by 0 of the 1 replicas"),
        "{error}"
    );
    let state = lock.state().await.unwrap();
    assert!(state.holder.is_none(), "left held: {state:?}");
}
