//! `FUNCTION FLUSH` (Redis 7, where the scripts run as functions) and `SCRIPT FLUSH` (where they
//! run by SHA: here, a user whose ACL refuses `FUNCTION LOAD`) over and over while contenders
//! lock and unlock.
//!
//! What is promised (docs/redis.md, *Scripts*): a call that meets a missing function or script
//! (`Function not found`, `NOSCRIPT`) did not run, and the backend loads the library or sends
//! the script's body instead; so a flush is invisible to callers: no error, no lost or doubled
//! step, FIFO and mutual exclusion intact.

use std::time::Duration;

use fairlock::FairLock;
use fairlock_faults::holds::{Hold, Holds};
use fairlock_faults::redis_env::{bounded, cli, client, info_field, options, Injector};
use fairlock_testsupport::RedisServer;
use tokio::time::{sleep, Instant};

const CONTENDERS: usize = 5;
const ROUNDS: usize = 10;
const CALL_LIMIT: Duration = Duration::from_secs(10);

/// Times the server ran `command` (as `INFO commandstats` names it).
fn calls(port: u16, command: &str) -> u64 {
    info_field(
        port,
        "commandstats",
        &format!("cmdstat_{command}:"),
        "calls",
    )
}

async fn until_waiters(lock: &FairLock, count: usize) {
    bounded("queueing", CALL_LIMIT, async {
        while lock.state().await.unwrap().waiters.len() < count {
            sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// Contenders on `url` lock and unlock freely, then in FIFO rounds, while `flush` runs every
/// 30 ms; every call succeeds, holds never overlap, FIFO holds. Returns how many flushes ran.
async fn contend_while_flushing(port: u16, url: &str, flush: &'static [&'static str]) -> u64 {
    let opts = options(Duration::from_secs(10), Duration::from_secs(3));
    let flusher = Injector::every(Duration::from_millis(30), move || {
        assert_eq!(cli(port, None, flush), "OK");
    });
    let url = url.to_owned();

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
    eprintln!(
        "{} contended holds and {fifo_rounds} FIFO rounds of {CONTENDERS} under {flushes} \
         {flush:?}",
        exclusive.len()
    );
    assert!(flushes >= 10, "only {flushes} flushes");
    flushes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn function_flush_during_contention_is_transparent() {
    let server = RedisServer::start().unwrap();
    let port = server.port();
    contend_while_flushing(port, &server.url(), &["FUNCTION", "FLUSH"]).await;
    // The fault really bit: the library was loaded again after flushes, many times, and no
    // call went by SHA.
    let loads = calls(port, "function|load");
    assert!(loads >= 10, "only {loads} library loads");
    assert_eq!(calls(port, "evalsha") + calls(port, "eval"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_during_contention_is_transparent() {
    let server = RedisServer::start().unwrap();
    let port = server.port();
    // A user that may do everything but load functions: the backend runs its scripts by SHA.
    assert_eq!(
        cli(
            port,
            None,
            &[
                "ACL",
                "SETUSER",
                "scripts",
                "on",
                ">secret",
                "~*",
                "&*",
                "+@all",
                "-function"
            ],
        ),
        "OK"
    );
    let url = format!("redis://scripts:secret@127.0.0.1:{port}");
    contend_while_flushing(port, &url, &["SCRIPT", "FLUSH"]).await;
    // The fault really bit: scripts were sent again after NOSCRIPT, many times.
    let fallbacks = calls(port, "eval");
    assert!(fallbacks >= 10, "only {fallbacks} EVAL fallbacks");
    // Each backend's first call found no function, and was refused the load.
    assert_eq!(
        cli(port, None, &["FUNCTION", "LIST"]),
        "",
        "no library was loaded"
    );
}
