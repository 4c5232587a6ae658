//! A Redis restart without persistence while locks are held and waited for.
//!
//! What docs/redis.md promises for it: every hold and queue is gone; holders find out at their
//! next renewal (their lost-lease signal fires), waiters re-queue at their next heartbeat, and
//! fencing tokens keep increasing because a token is `max(last + 1, server time in µs)`, so the
//! loss of the fence key does not reset them. Mutual exclusion is broken for a while (the old
//! holder believes it holds until it finds out), which the tokens cover. These tests check
//! exactly that, and that no call hangs.

use std::time::Duration;

use fairlock::{Error, FairLock, LockGuard};
use fairlock_faults::holds::{Hold, Holds};
use fairlock_faults::redis_env::{bounded, cli, client, lasting_keys, options};
use fairlock_testsupport::RedisServer;
use tokio::time::{sleep, Instant};

/// The watchdog lease of every holder: renewed every 500 ms.
const LEASE: Duration = Duration::from_millis(1500);
/// The waiters' liveness TTL: a heartbeat every 200 ms.
const WAITER_TTL: Duration = Duration::from_millis(600);
/// No single call may take longer than this, faults included.
const CALL_LIMIT: Duration = Duration::from_secs(15);
/// Contenders queued behind the holder when the server goes away.
const WAITERS: usize = 4;
/// Acquisitions each waiter makes once the server is back.
const ROUNDS: usize = 3;

/// The server's clock in µs, by `TIME`.
fn server_micros(server: &RedisServer) -> u64 {
    let time = cli(server.port(), None, &["TIME"]);
    let mut parts = time.lines().map(|part| part.trim().parse::<u64>().unwrap());
    parts.next().unwrap() * 1_000_000 + parts.next().unwrap()
}

/// Waits (bounded) until `lock` lists `count` waiters.
async fn until_waiters(lock: &FairLock, count: usize) {
    bounded("queueing", CALL_LIMIT, async {
        while lock.state().await.unwrap().waiters.len() < count {
            sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// Holds `guard` for a moment and releases it, recording the hold.
async fn hold(guard: LockGuard, who: usize, holds: &Holds) {
    let start = Instant::now();
    tokio::select! {
        _ = guard.lease_lost() => panic!("contender {who} lost a lease it held for 20 ms"),
        _ = sleep(Duration::from_millis(20)) => {}
    }
    holds.push(Hold {
        who,
        token: guard.fencing_token(),
        start,
        end: Instant::now(),
    });
    bounded("unlock", CALL_LIMIT, guard.unlock())
        .await
        .unwrap_or_else(|err| panic!("contender {who}: unlock after the restart: {err}"));
}

/// One waiter: `ROUNDS` acquisitions, each bounded; stops at the first error, which must be a
/// typed "the store is unreachable or failed" error. Returns how many it made, and the error.
async fn waiter(lock: FairLock, who: usize, holds: Holds) -> (usize, Option<Error>) {
    for round in 0..ROUNDS {
        match bounded("a waiter's lock()", CALL_LIMIT, lock.lock()).await {
            Ok(guard) => hold(guard, who, &holds).await,
            Err(err) => {
                assert!(
                    matches!(err, Error::Unavailable { .. } | Error::Backend { .. }),
                    "contender {who}: not a typed store error: {err:?}"
                );
                return (round, Some(err));
            }
        }
    }
    (ROUNDS, None)
}

/// Holds of two locks and a queue behind one, then the server restarts (down for `outage`).
/// Prints what it observed.
async fn restart_under_contention(outage: Duration) {
    let mut server = RedisServer::start().unwrap();
    let url = server.url();
    let opts = options(LEASE, WAITER_TTL);
    let contended = client(&url, opts.clone())
        .await
        .fair_lock("contended")
        .unwrap();
    let quiet = client(&url, opts.clone()).await.fair_lock("quiet").unwrap();
    let held = contended.lock().await.unwrap();
    let quiet_held = quiet.lock().await.unwrap();

    let holds = Holds::new();
    let mut waiters = Vec::new();
    for who in 0..WAITERS {
        let lock = client(&url, opts.clone())
            .await
            .fair_lock("contended")
            .unwrap();
        waiters.push(tokio::spawn(waiter(lock, who, holds.clone())));
        until_waiters(&contended, who + 1).await;
    }
    let tokens_before = [held.fencing_token(), quiet_held.fencing_token()];
    let before_micros = server_micros(&server);

    let down = Instant::now();
    tokio::task::block_in_place(|| {
        server.stop();
        std::thread::sleep(outage);
        server.restart().unwrap();
    });
    let up = Instant::now();
    let after_micros = server_micros(&server);
    if outage > LEASE + Duration::from_millis(500) {
        // Renewals failed all along: the local deadline alone must have fired the signal,
        // before the server came back.
        assert!(held.is_lease_lost() && quiet_held.is_lease_lost());
    }
    assert!(after_micros > before_micros, "the server's clock went back");

    // Both holders find out. Their local deadline is at most one lease after their last
    // renewal, which was before the server went down; usually the next renewal (a third of
    // the lease) tells them sooner. The margin covers timer and scheduling delays.
    for (name, guard) in [("contended", &held), ("quiet", &quiet_held)] {
        bounded(
            &format!("the lost-lease signal of {name}"),
            LEASE + Duration::from_secs(1),
            guard.lease_lost(),
        )
        .await;
        assert!(guard.is_lease_lost());
    }
    let lost_after = down.elapsed();

    let mut acquired = 0;
    let mut errors = Vec::new();
    for task in waiters {
        let (rounds, error) = task.await.unwrap();
        acquired += rounds;
        errors.extend(error);
    }
    let holds = holds.assert_exclusive();
    for hold in &holds {
        assert!(
            hold.start >= down,
            "a waiter acquired while A still held: {hold:?}"
        );
        assert!(
            tokens_before.iter().all(|before| hold.token > *before),
            "token {} after the restart is not above {tokens_before:?}",
            hold.token
        );
        // The rule that keeps them growing: no token is below the server's clock.
        assert!(
            hold.token >= after_micros,
            "{hold:?} below TIME {after_micros}"
        );
    }
    assert!(
        !holds.is_empty(),
        "no waiter acquired after the restart: {errors:?}"
    );
    if outage.is_zero() {
        // A quick restart is ridden out: the waiters' calls reconnect and retry.
        assert!(
            errors.is_empty() && acquired == WAITERS * ROUNDS,
            "every waiter must make its {ROUNDS} acquisitions across a quick restart: \
             {acquired} of {}, errors {errors:?}",
            WAITERS * ROUNDS
        );
    }

    // The old holders' guards: their release must not touch anyone's new hold.
    let newcomer = client(&url, opts.clone())
        .await
        .fair_lock("contended")
        .unwrap();
    let fresh = bounded("a fresh lock()", Duration::from_secs(1), newcomer.lock())
        .await
        .unwrap();
    let err = held.unlock().await.unwrap_err();
    assert!(matches!(err, Error::LeaseLost { .. }), "{err:?}");
    let state = newcomer.state().await.unwrap().holder.unwrap();
    assert_eq!(
        (state.owner.as_str(), state.token),
        (newcomer.owner().as_str(), fresh.fencing_token())
    );
    assert!(fresh.fencing_token() > tokens_before[0]);
    fresh.unlock().await.unwrap();
    let quiet_again = client(&url, opts).await.fair_lock("quiet").unwrap();
    let quiet_fresh = quiet_again.try_lock().await.unwrap();
    assert!(quiet_fresh.fencing_token() > tokens_before[1]);
    let err = quiet_held.unlock().await.unwrap_err();
    assert!(matches!(err, Error::LeaseLost { .. }), "{err:?}");
    assert_eq!(
        quiet_again.state().await.unwrap().holder.unwrap().token,
        quiet_fresh.fencing_token()
    );
    quiet_fresh.unlock().await.unwrap();

    // Nothing is left behind but the fence keys (and spent-attempt records, which expire).
    let keys = lasting_keys(server.port());
    assert_eq!(keys, ["fairlock:{contended}:f", "fairlock:{quiet}:f"]);

    let first = holds.first().map(|h| h.start - up);
    eprintln!(
        "outage {outage:?}: restart took {:?}; lost-lease signals within {lost_after:?} of \
         going down; {acquired} acquisitions after it (first {first:?} after the server was \
         back), {} typed errors {errors:?}; tokens {tokens_before:?} before, {:?} after",
        up - down,
        errors.len(),
        holds.iter().map(|h| h.token).collect::<Vec<_>>(),
    );
}

/// A quick restart: the waiters' calls ride it out (the client reconnects and retries), so
/// every waiter acquires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quick_restart_loses_holds_but_waiters_acquire_and_tokens_grow() {
    restart_under_contention(Duration::ZERO).await;
}

/// Down for longer than the lease: renewals fail with errors until the local deadline, and
/// the lost-lease signal must fire on that deadline alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_longer_than_the_lease_is_noticed_by_the_deadline() {
    restart_under_contention(LEASE + Duration::from_millis(500)).await;
}
