//! `SCRIPT FLUSH` over and over while contenders lock and unlock.
//!
//! What is promised (docs/redis.md, *Scripts*): a script sent by SHA that meets `NOSCRIPT` did
//! not run, and the backend sends its body with `EVAL` instead; so a flush is invisible to
//! callers: no error, no lost or doubled step, FIFO and mutual exclusion intact.

use std::time::Duration;

use fairlock::FairLock;
use fairlock_faults::holds::{Hold, Holds};
use fairlock_faults::redis_env::{bounded, cli, client, info_field, options, Injector};
use fairlock_testsupport::RedisServer;
use tokio::time::{sleep, Instant};

const CONTENDERS: usize = 5;
const ROUNDS: usize = 10;
const CALL_LIMIT: Duration = Duration::from_secs(10);

/// Times `EVAL` ran: each is a `NOSCRIPT` fallback, since the backend otherwise uses `EVALSHA`.
fn evals(port: u16) -> u64 {
    info_field(port, "commandstats", "cmdstat_eval:", "calls")
}

async fn until_waiters(lock: &FairLock, count: usize) {
    bounded("queueing", CALL_LIMIT, async {
        while lock.state().await.unwrap().waiters.len() < count {
            sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_during_contention_is_transparent() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let port = server.port();
    let opts = options(Duration::from_secs(10), Duration::from_secs(3));
    let flusher = Injector::every(Duration::from_millis(30), move || {
        assert_eq!(cli(port, None, &["SCRIPT", "FLUSH"]), "OK");
    });

    // Free-for-all contention: every call must succeed, holds never overlap.
    let holds = Holds::new();
    let mut tasks = Vec::new();
    for who in 0..CONTENDERS {
        let lock = client(&url, opts.clone())
            .await
            .fair_lock("flushed")
            .unwrap();
        let holds = holds.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let guard = bounded("lock()", CALL_LIMIT, lock.lock())
                    .await
                    .unwrap_or_else(|err| panic!("contender {who}: {err}"));
                let start = Instant::now();
                sleep(Duration::from_millis(3)).await;
                holds.push(Hold {
                    who,
                    token: guard.fencing_token(),
                    start,
                    end: Instant::now(),
                });
                bounded("unlock()", CALL_LIMIT, guard.unlock())
                    .await
                    .unwrap_or_else(|err| panic!("contender {who}: unlock: {err}"));
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let exclusive = holds.assert_exclusive();
    assert_eq!(exclusive.len(), CONTENDERS * ROUNDS);

    // FIFO: waiters queued one after another behind a holder are granted in that order.
    let mut fifo_rounds = 0;
    for _ in 0..4 {
        let first = client(&url, opts.clone()).await.fair_lock("fifo").unwrap();
        let held = bounded("lock()", CALL_LIMIT, first.lock()).await.unwrap();
        let order = Holds::new();
        let mut waiters = Vec::new();
        for who in 0..CONTENDERS {
            let lock = client(&url, opts.clone()).await.fair_lock("fifo").unwrap();
            let order = order.clone();
            waiters.push(tokio::spawn(async move {
                let guard = bounded("lock()", CALL_LIMIT, lock.lock()).await.unwrap();
                let start = Instant::now();
                sleep(Duration::from_millis(2)).await;
                order.push(Hold {
                    who,
                    token: guard.fencing_token(),
                    start,
                    end: Instant::now(),
                });
                guard.unlock().await.unwrap();
            }));
            until_waiters(&first, who + 1).await;
        }
        held.unlock().await.unwrap();
        for waiter in waiters {
            bounded("a FIFO waiter", CALL_LIMIT, waiter).await.unwrap();
        }
        let granted: Vec<usize> = order.assert_exclusive().iter().map(|h| h.who).collect();
        assert_eq!(granted, (0..CONTENDERS).collect::<Vec<_>>(), "FIFO order");
        fifo_rounds += 1;
    }

    let flushes = flusher.stop();
    let fallbacks = evals(port);
    eprintln!(
        "{} contended holds and {fifo_rounds} FIFO rounds of {CONTENDERS} under {flushes} \
         SCRIPT FLUSHes; {fallbacks} EVAL fallbacks after NOSCRIPT",
        exclusive.len()
    );
    // The fault really bit: scripts were reloaded after flushes, many times.
    assert!(flushes >= 10, "only {flushes} flushes");
    assert!(fallbacks >= 10, "only {fallbacks} EVAL fallbacks");
}
