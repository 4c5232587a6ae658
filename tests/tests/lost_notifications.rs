//! Wake-ups lost to a pub/sub connection that keeps being killed.
//!
//! The bound (docs/design.md, *Waiting*, and `FairLock::lock`): a lost wake-up costs a waiter
//! at most one heartbeat, `waiter_ttl / 3`, because each heartbeat is an `acquire` that also
//! confirms a hand-over made to it. So with `CLIENT KILL TYPE pubsub` every 50-100 ms, every
//! hand-over must still complete within a heartbeat (plus a round trip and scheduling), and
//! well within the waiter TTL, after which a waiter that never heard would be dropped.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fairlock::FairLock;
use fairlock_faults::holds::{Hold, Holds};
use fairlock_faults::redis_env::{bounded, cli, client, options, Injector};
use fairlock_testsupport::RedisServer;
use rand::Rng;
use tokio::time::{sleep, Instant};

/// Waiter TTL: heartbeats every 200 ms.
const WAITER_TTL: Duration = Duration::from_millis(600);
const HEARTBEAT: Duration = Duration::from_millis(200);
/// What a hand-over may take beyond one heartbeat: the confirming round trip, the release's
/// round trip (a hold's recorded end is when `unlock` was called) and a loaded machine's
/// scheduling. Still well below the waiter TTL, so a waiter that lost its wake-up and had
/// no heartbeat would not pass.
const SLACK: Duration = Duration::from_millis(300);
const CONTENDERS: usize = 6;
const ROUNDS: usize = 8;

async fn contender(lock: FairLock, who: usize, holds: Holds) {
    for _ in 0..ROUNDS {
        // Every acquisition must complete: at worst each hand-over ahead costs a heartbeat.
        let guard = bounded("lock()", Duration::from_secs(20), lock.lock())
            .await
            .unwrap_or_else(|err| panic!("contender {who}: {err}"));
        let start = Instant::now();
        let hold_for = Duration::from_millis(rand::thread_rng().gen_range(5..25));
        sleep(hold_for).await;
        assert!(!guard.is_lease_lost(), "contender {who} lost its lease");
        holds.push(Hold {
            who,
            token: guard.fencing_token(),
            start,
            end: Instant::now(),
        });
        bounded("unlock()", Duration::from_secs(10), guard.unlock())
            .await
            .unwrap_or_else(|err| panic!("contender {who}: unlock: {err}"));
        // Let the others queue first, so every acquisition is a hand-over.
        sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_subscriptions_cost_at_most_a_heartbeat() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    assert_eq!(WAITER_TTL / 3, HEARTBEAT);
    let opts = options(Duration::from_secs(10), WAITER_TTL);
    let port = server.port();
    let killed = Arc::new(AtomicU64::new(0));
    let counted = killed.clone();
    let killer = Injector::every(Duration::from_millis(70), move || {
        let count = cli(port, None, &["CLIENT", "KILL", "TYPE", "pubsub"]);
        counted.fetch_add(count.parse().unwrap_or(0), Ordering::Relaxed);
    });

    let holds = Holds::new();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for who in 0..CONTENDERS {
        let lock = client(&url, opts.clone()).await.fair_lock("busy").unwrap();
        tasks.push(tokio::spawn(contender(lock, who, holds.clone())));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let elapsed = started.elapsed();
    let kills = killer.stop();
    let killed = killed.load(Ordering::Relaxed);

    let sorted = holds.assert_exclusive();
    assert_eq!(
        sorted.len(),
        CONTENDERS * ROUNDS,
        "every acquisition completed"
    );
    let gaps = holds.gaps();
    let worst = gaps.iter().max().copied().unwrap_or_default();
    let slow = gaps
        .iter()
        .filter(|gap| **gap > Duration::from_millis(30))
        .count();
    eprintln!(
        "{} hand-overs in {elapsed:?} under {kills} CLIENT KILL TYPE pubsub ({killed} connections killed): worst gap \
         {worst:?}, {slow} gaps over 30 ms (lost wake-ups made up by a heartbeat or a \
         re-check), median {:?}",
        gaps.len(),
        {
            let mut g = gaps.clone();
            g.sort();
            g[g.len() / 2]
        }
    );
    assert!(
        worst <= HEARTBEAT + SLACK,
        "a hand-over took {worst:?}, more than a heartbeat ({HEARTBEAT:?}) + {SLACK:?}"
    );
    // The fault really happened: subscriptions were killed, again and again, while waiters
    // waited.
    assert!(
        killed >= 10,
        "only {killed} subscriber connections were killed"
    );
}
