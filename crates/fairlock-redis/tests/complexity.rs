//! Each lock operation runs a bounded number of Redis commands, however long the queue: the
//! scripts never walk the waiters (only `inspect` does). Counted with `INFO commandstats`,
//! which includes the commands a script runs.

mod common;

/// The most commands one operation may run, whatever the queue length: about 10 to check the
/// lock's keys before the first write and keep the ended-attempt records, the rest for the
/// operation itself (around 30 for a release that hands over, up to about 50 when it also
/// evicts a full budget of dead waiters, in batches of a constant number of commands).
const BUDGET: u64 = 56;

use common::{granted, name, owner, request, Server};
use fairlock::backend::{AcquireOutcome, LockBackend};
use fairlock_redis::RedisBackend;

/// Commands the server has run, but the `INFO` calls that read the counts.
fn commands_run(server: &Server) -> u64 {
    server
        .cli(&["INFO", "commandstats"])
        .lines()
        .filter(|line| line.starts_with("cmdstat_") && !line.starts_with("cmdstat_info:"))
        .filter_map(|line| {
            line.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// How many commands `operation` made the server run.
async fn cost<F: std::future::Future>(server: &Server, operation: F) -> u64 {
    let before = commands_run(server);
    operation.await;
    commands_run(server) - before
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_do_not_walk_the_queue() {
    let server = Server::start();
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    let lock = name();
    let holder = owner("holder");
    let holding = request(&lock, &holder, true);
    let grant = granted(&backend, &holding).await;
    const WAITERS: usize = 2000;
    let requests: Vec<_> = (0..WAITERS)
        .map(|i| request(&lock, &owner(&format!("w{i}")), true))
        .collect();
    for chunk in requests.chunks(64) {
        let joins = chunk.iter().map(|r| backend.acquire(r));
        for outcome in futures::future::join_all(joins).await {
            assert!(matches!(outcome.unwrap(), AcquireOutcome::Queued { .. }));
        }
    }

    // Joining at the back, heart-beating from the middle, and leaving from the middle.
    let newcomer = owner("newcomer");
    let join_request = request(&lock, &newcomer, true);
    let join = cost(&server, backend.acquire(&join_request)).await;
    let middle = &requests[WAITERS / 2];
    let heartbeat = cost(&server, backend.acquire(middle)).await;
    let leave = cost(
        &server,
        backend.abandon(&lock, &middle.owner, middle.attempt),
    )
    .await;
    // A non-queueing try while many wait.
    let try_request = request(&lock, &owner("try"), false);
    let busy = cost(&server, backend.acquire(&try_request)).await;
    for (what, commands) in [
        ("join", join),
        ("heartbeat", heartbeat),
        ("leave", leave),
        ("busy", busy),
    ] {
        println!("{what}: {commands} commands");
        assert!(
            commands <= BUDGET,
            "{what} ran {commands} commands with {WAITERS} waiters"
        );
    }

    // A release hands over to the head, whatever stands behind it.
    let head = backend.inspect(&lock).await.unwrap().waiters[0]
        .owner
        .clone();
    let release = cost(
        &server,
        backend.release(&lock, &holder, grant.token, holding.attempt),
    )
    .await;
    println!("release: {release} commands");
    assert!(
        release <= BUDGET,
        "release ran {release} commands with {WAITERS} waiters"
    );
    let state = backend.inspect(&lock).await.unwrap();
    assert_eq!(state.holder.unwrap().owner, head);
    // All but the head (now holding) and the leaver, plus the newcomer.
    assert_eq!(state.waiters.len(), WAITERS - 1);
}

/// Asking whether a guard still holds, and force-unlocking, read the holder without walking
/// the queue: a holder asking every second behind thousands of waiters (the CLI's fixed-lease
/// `exec` does) must not run a script as long as the queue each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_questions_do_not_walk_the_queue() {
    let server = Server::start();
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    let client = fairlock::LockClient::new(backend.clone());
    let lock = name();
    let guard = client
        .fair_lock(lock.as_str())
        .unwrap()
        .lock()
        .await
        .unwrap();
    const WAITERS: usize = 2000;
    join_many(
        &backend,
        &lock,
        WAITERS,
        std::time::Duration::from_secs(60),
        "w",
    )
    .await;
    let mut held = false;
    let asked = cost(&server, async { held = guard.is_held().await.unwrap() }).await;
    assert!(held);
    let mut holder = None;
    let read = cost(&server, async {
        holder = backend.holder(&lock).await.unwrap()
    })
    .await;
    let (holder, inspected) = (
        holder.unwrap(),
        backend.inspect(&lock).await.unwrap().holder.unwrap(),
    );
    assert_eq!(
        (
            &holder.owner,
            holder.token,
            holder.hold_count,
            holder.confirmed
        ),
        (
            &inspected.owner,
            inspected.token,
            inspected.hold_count,
            inspected.confirmed
        )
    );
    let mut freed = false;
    let forced = cost(&server, async {
        freed = client.force_unlock(lock.as_str()).await.unwrap()
    })
    .await;
    assert!(freed);
    for (what, commands) in [
        ("is_held", asked),
        ("holder", read),
        ("force_unlock", forced),
    ] {
        println!("{what}: {commands} commands");
        assert!(
            commands <= BUDGET,
            "{what} ran {commands} commands with {WAITERS} waiters"
        );
    }
    drop(guard);
}

/// How many entries the lock's queue key stores, whatever its type.
fn queue_entries(server: &Server, lock: &fairlock::LockName) -> u64 {
    let key = format!("fairlock:{{{lock}}}:q");
    let count = match server.cli(&["TYPE", &key]).as_str() {
        "list" => server.cli(&["LLEN", &key]),
        "zset" => server.cli(&["ZCARD", &key]),
        _ => return 0,
    };
    count.parse().unwrap()
}

/// Joins `count` fresh waiters (concurrently, in chunks) with this liveness TTL; their requests.
async fn join_many(
    backend: &RedisBackend,
    lock: &fairlock::LockName,
    count: usize,
    ttl: std::time::Duration,
    tag: &str,
) -> Vec<fairlock::backend::AcquireRequest> {
    let requests: Vec<_> = (0..count)
        .map(|i| {
            let mut r = request(lock, &owner(&format!("{tag}{i}")), true);
            r.waiter_ttl = ttl;
            r
        })
        .collect();
    for chunk in requests.chunks(64) {
        let joins = chunk.iter().map(|r| backend.acquire(r));
        for outcome in futures::future::join_all(joins).await {
            assert!(matches!(outcome.unwrap(), AcquireOutcome::Queued { .. }));
        }
    }
    requests
}

/// Waiters that join and give up behind a live head leave nothing for later calls to walk:
/// the hand-over after them costs what it costs with an empty queue, and the queue stores
/// only the live waiters. (With tombstones left in a list, the hand-over walked them all.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_that_leave_cost_no_later_call() {
    let server = Server::start();
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    let lock = name();
    let holder = owner("holder");
    let holding = request(&lock, &holder, true);
    let grant = granted(&backend, &holding).await;
    let long = std::time::Duration::from_secs(600);
    let head = join_many(&backend, &lock, 1, long, "head").await.remove(0);
    const CHURN: usize = 3000;
    let leavers = join_many(&backend, &lock, CHURN, long, "leaver").await;
    for chunk in leavers.chunks(64) {
        let leaves = chunk
            .iter()
            .map(|r| backend.abandon(&lock, &r.owner, r.attempt));
        for left in futures::future::join_all(leaves).await {
            left.unwrap();
        }
    }
    let last = join_many(&backend, &lock, 1, long, "last").await.remove(0);
    assert_eq!(
        queue_entries(&server, &lock),
        2,
        "only live waiters are stored"
    );

    // The holder hands over to the head, which confirms and hands over to the last waiter.
    let release = cost(
        &server,
        backend.release(&lock, &holder, grant.token, holding.attempt),
    )
    .await;
    // The head was handed the lock: its acquire confirms the grant.
    let head_grant = granted(&backend, &head).await;
    let second = cost(
        &server,
        backend.release(&lock, &head.owner, head_grant.token, head.attempt),
    )
    .await;
    for (what, commands) in [("first release", release), ("second release", second)] {
        println!("{what}: {commands} commands");
        assert!(
            commands <= BUDGET,
            "{what} ran {commands} commands after {CHURN} waiters left"
        );
    }
    let state = backend.inspect(&lock).await.unwrap();
    assert_eq!(state.holder.unwrap().owner, last.owner.as_str());
}

/// Waiters that die together (their liveness deadline passes) are evicted a bounded number
/// per call: no call walks them all, the live waiter behind them still gets the lock after a
/// bounded number of its own calls, and they are all gone from storage afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_that_die_together_cost_no_single_call_much() {
    let server = Server::start();
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    let lock = name();
    let holder = owner("holder");
    let holding = request(&lock, &holder, true);
    let grant = granted(&backend, &holding).await;
    const DEAD: usize = 3000;
    let ttl = std::time::Duration::from_secs(2);
    join_many(&backend, &lock, DEAD, ttl, "doomed").await;
    let survivor = join_many(
        &backend,
        &lock,
        1,
        std::time::Duration::from_secs(600),
        "live",
    )
    .await
    .remove(0);
    // The last of them joined before the survivor: all are dead after one TTL from now.
    tokio::time::sleep(ttl + std::time::Duration::from_millis(100)).await;

    let release = cost(
        &server,
        backend.release(&lock, &holder, grant.token, holding.attempt),
    )
    .await;
    println!("release: {release} commands");
    assert!(
        release <= BUDGET,
        "release ran {release} commands over {DEAD} dead waiters"
    );
    // The survivor asks (as the wake-up, its retry hint or its heartbeat would make it) until
    // it holds; each call is bounded, and together they evict the dead.
    let mut calls = 0;
    let mut worst = 0;
    loop {
        calls += 1;
        assert!(calls <= 200, "the survivor still waits after {calls} calls");
        let mut outcome = None;
        let commands = cost(&server, async {
            outcome = Some(backend.acquire(&survivor).await.unwrap());
        })
        .await;
        worst = worst.max(commands);
        if matches!(outcome, Some(AcquireOutcome::Granted(_))) {
            break;
        }
    }
    println!("survivor: held after {calls} calls, at most {worst} commands each");
    assert!(worst <= BUDGET, "a call ran {worst} commands");
    assert_eq!(queue_entries(&server, &lock), 0, "dead waiters are gone");
}

/// Live waiters behind more dead ones than one call clears still get the lock at wake-up
/// speed, in their order: the release that cannot reach them tells every waiter to look
/// again, and their own calls clear the dead in bounded steps. (Their heartbeat is 20 s away.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_waiters_behind_dead_ones_are_served_in_order_at_once() {
    use fairlock::{LockClient, LockOptions};
    use std::time::{Duration, Instant};

    let server = Server::start();
    let backend = std::sync::Arc::new(RedisBackend::connect(&server.url()).await.unwrap());
    let lock = name();
    let options = LockOptions::default().with_waiter_ttl(Duration::from_secs(60));
    let client = LockClient::from_arc(backend.clone())
        .with_options(options)
        .unwrap();
    let held = client
        .fair_lock(lock.as_str())
        .unwrap()
        .lock()
        .await
        .unwrap();

    const DEAD: usize = 2000;
    let ttl = Duration::from_secs(2);
    join_many(&backend, &lock, DEAD, ttl, "doomed").await;
    let (order, mut served) = tokio::sync::mpsc::unbounded_channel();
    let mut waiters = Vec::new();
    for i in 0..2 {
        let waiter = client.fair_lock(lock.as_str()).unwrap();
        let order = order.clone();
        waiters.push(tokio::spawn(async move {
            let guard = waiter.lock().await.unwrap();
            order.send(i).unwrap();
            guard.unlock().await.unwrap();
        }));
        // Queued in this order.
        while backend.inspect(&lock).await.unwrap().waiters.len() < DEAD + i + 1 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    tokio::time::sleep(ttl + Duration::from_millis(100)).await;
    assert_eq!(backend.inspect(&lock).await.unwrap().waiters.len(), 2);

    let released = Instant::now();
    held.unlock().await.unwrap();
    for waiter in waiters {
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the live waiters get the lock long before a heartbeat")
            .unwrap();
    }
    let took = released.elapsed();
    assert_eq!(served.recv().await, Some(0));
    assert_eq!(served.recv().await, Some(1));
    println!("both served {took:?} after the release");
    assert_eq!(queue_entries(&server, &lock), 0, "dead waiters are gone");
}

/// The common uncontended path checks only the keys that exist: on a lock in use (its fence
/// hash and ended-attempt records present, no hold, nobody waiting), one `EXISTS` stands for
/// the absent hold and queue keys instead of a `TYPE` each; the grant keeps its attempt's
/// spent record in the fence hash it writes anyway, so it only reads the ended-attempt records;
/// and the release sets their expiry without reading them back (Redis 7's `PEXPIREAT … GT`).
/// Exact counts, so a
/// script change that adds commands to this path is seen (issue 13: 18 and 19 before, plus
/// the script call).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_acquire_and_release_check_only_what_exists() {
    let server = Server::start();
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    let lock = name();
    let holder = owner("holder");
    // Use the lock once, so its fence hash and ended-attempt records exist, as on a lock in use.
    let first = request(&lock, &holder, true);
    let grant = granted(&backend, &first).await;
    backend
        .release(&lock, &holder, grant.token, first.attempt)
        .await
        .unwrap();

    // Each measured call comes a few milliseconds after the call before it: an ended-attempt
    // record made in the same millisecond as the latest one leaves X's expiry as it is, which
    // takes one more command to confirm (PEXPIRETIME).
    let pause = || tokio::time::sleep(std::time::Duration::from_millis(3));
    pause().await;
    let again = request(&lock, &holder, true);
    let mut grant = None;
    let acquire = cost(&server, async {
        grant = Some(granted(&backend, &again).await);
    })
    .await;
    let grant = grant.expect("measured");
    pause().await;
    let release = cost(
        &server,
        backend.release(&lock, &holder, grant.token, again.attempt),
    )
    .await;
    println!("uncontended acquire: {acquire} commands, release: {release} commands");
    // Each count includes the call itself (FCALL). The acquire: EXISTS (the slot probe with H, Q, Z,
    // W), TIME, HMGET F, ZSCORE X (also X's type check); the grant (HSET H, PEXPIRE H, and
    // HSET F with the token and the attempt's spent record); PEXPIRE F. (13 before the grant's
    // record moved from X to F: TYPE X, and ZADD, ZRANGEBYSCORE, PEXPIREAT … GT on X.)
    assert_eq!(acquire, 9, "commands of an uncontended acquire");
    // The release: EXISTS (probe, Q, Z, W), TIME, TYPE X, HMGET H (with the attempt's level),
    // HMGET F, DEL; the spent record (3), and HDEL of F's record of the grant; PEXPIRE F. (No
    // ZSCORE X: the hold shows the level is there, so no earlier copy released it.)
    assert_eq!(release, 12, "commands of a release with nobody waiting");
}

/// A release that hands over does not count the live waiters when what it read for the hand-over
/// already tells: the head was all of the queue (the queue keys go at once), or another live
/// waiter stands behind it (they stay). Nor does it read the released attempt's record: the
/// hold shows its level. Exact counts, as above (issue 13: 28 before, with the script call).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_counts_no_waiters_it_has_seen() {
    let server = Server::start();
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    for waiters in [1, 2] {
        let lock = name();
        let holder = owner("holder");
        let holding = request(&lock, &holder, true);
        let grant = granted(&backend, &holding).await;
        for i in 0..waiters {
            let waiting = request(&lock, &owner(&format!("w{i}")), true);
            let outcome = backend.acquire(&waiting).await.unwrap();
            assert!(matches!(outcome, AcquireOutcome::Queued { .. }));
        }
        // Not in the millisecond of the last spent record (see above).
        tokio::time::sleep(std::time::Duration::from_millis(3)).await;
        let release = cost(
            &server,
            backend.release(&lock, &holder, grant.token, holding.attempt),
        )
        .await;
        println!("release handing over, {waiters} waiting: {release} commands");
        assert_eq!(
            queue_entries(&server, &lock),
            waiters - 1,
            "the grantee left the queue, the others stay"
        );
        let state = backend.inspect(&lock).await.unwrap();
        assert!(state.holder.is_some_and(|h| !h.confirmed), "handed over");
        // EXISTS (probe), TIME, TYPE X; the front of the queue, read before the first write, so
        // also the type checks of Q, Z and W (ZRANGE Q, ZMSCORE Z, HMGET W); HMGET H and F, DEL
        // H; the head's entry (ZREM Z, ZREM Q, HDEL W), or, when it was the only one, the
        // queue keys whole (UNLINK); the new hold (HSET F with the grantee's spent record,
        // HSET H, PEXPIREAT H), SPUBLISH; the releaser's spent record (ZADD X, PEXPIREAT X: X
        // is new); PEXPIRE F, which outlives the last deadline the front showed (the whole
        // queue). And the call itself. (With one waiter, 21 while its entry was removed
        // field by field before the keys went; 22 before the hand-over stopped evicting and
        // the front's deadlines stood for Z's latest; 26 before the front was read in place of
        // a TYPE of each queue key, and the grantee's record went to F.)
        assert_eq!(
            release,
            if waiters == 1 { 18 } else { 20 },
            "commands of a release handing over, {waiters} waiting"
        );
    }
}

/// Joins and heartbeats on a short queue read nothing its front already showed: the front,
/// read before the first write, is the whole queue, so it gives the last ticket and the latest
/// deadline; and the head's heartbeat knows its own ticket, live, and its record as stored.
/// Exact counts, as above.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joins_and_heartbeats_on_a_short_queue_read_nothing_twice() {
    let server = Server::start();
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    let lock = name();
    granted(&backend, &request(&lock, &owner("holder"), true)).await;
    let first = request(&lock, &owner("first"), true);
    let second = request(&lock, &owner("second"), true);
    let mut counts = Vec::new();
    for (what, waiting) in [
        ("first join", &first),
        ("second join", &second),
        ("head's heartbeat", &first),
        ("second's heartbeat", &second),
    ] {
        let mut outcome = None;
        let commands = cost(&server, async {
            outcome = Some(backend.acquire(waiting).await.unwrap());
        })
        .await;
        assert!(matches!(outcome, Some(AcquireOutcome::Queued { .. })));
        println!("{what}: {commands} commands");
        counts.push(commands);
    }
    // Each: the call, TIME, EXISTS (probe), HMGET H and F, ZSCORE X; PTTL H (the head's retry
    // hint, else for the fence); PEXPIRE F.
    // The first join: the probe shows no queue key, so nothing of the queue is read. Its ticket
    // (HINCRBY F), ZADD Q, HSET W (its "@"), ZADD Z, HSET W (its record), HDEL W (no waker
    // here), PEXPIREAT of Q, Z and W at its own deadline.
    // The second: the front (ZRANGE Q, ZMSCORE Z, HMGET W), ZRANGEBYSCORE Z (evicting the
    // dead), its own entry (HGET W), then as the first.
    // The head's heartbeat: the front, ZRANGEBYSCORE Z, ZADD Z, the three PEXPIREATs.
    // The other's heartbeat: the front, ZRANGEBYSCORE Z, HGET W and ZSCORE Z (its entry), ZADD
    // Z, HSET W (its record), the three PEXPIREATs.
    // (21, 24, 20 and 20 before: ZRANGE Q, TYPE Z, TYPE W and ZRANGE Z in the first join (Z is
    // known absent now, so its own deadline is the latest); ZRANGE Q for
    // the last ticket and ZRANGE Z for the latest deadline in the second; the head's own entry
    // and record, and ZRANGE Z, in the heartbeats.)
    assert_eq!(
        counts,
        [17, 22, 16, 19],
        "first join, second join, heartbeats"
    );
}
