//! The Redis backend through Redis Sentinel: a primary, two replicas and three sentinels on
//! loopback ports. The backend finds the primary through the sentinels, and follows it when
//! the primary dies and a replica is promoted, wake-ups included.

mod common;

use std::time::{Duration, Instant};

use common::contenders::{
    backends, check_failover, failover_options, gaps_from, longest_stall, Contenders, Failover,
};

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

/// The primary is killed (SIGKILL) while four contenders in two processes take the lock in
/// turn: every contender goes on without an error (the outage is shorter than the outage
/// budget), fencing tokens keep increasing across the failover, and hand-overs after it are
/// wake-ups again. Without replica acknowledgement a grant the old primary had not yet
/// replicated may be lost, so two holds may overlap around the failover, but only holds that
/// began before the primary died, and their holders learn that their lease is lost (see
/// docs/redis.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contenders_ride_through_a_failover() {
    let overlaps = failover(None).await;
    println!("without acknowledgement: {overlaps} overlapping holds");
}

/// The same with every grant and renewal acknowledged by both replicas before it is reported:
/// whichever replica Sentinel promotes has every hold, so no hold is lost and no two overlap.
/// (With fewer acknowledgements than replicas Sentinel may promote one that missed a grant: it
/// picks by the replication offsets it last read, which can be seconds old.) Until
/// the new primary has two replicas again nothing can be acknowledged, so the test restarts the
/// dead node as a replica of the new primary, as an operator would.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_grants_never_overlap_across_a_failover() {
    let overlaps = failover(Some((2, Duration::from_millis(500)))).await;
    assert_eq!(overlaps, 0, "acknowledged holds overlapped");
}

/// Runs the failover scenario; how many pairs of holds overlapped (only holds that began
/// before the primary died may).
async fn failover(acks: Option<(u32, Duration)>) -> usize {
    let mut setup = sentinels();
    let options = failover_options();
    let backends = backends(&setup.url(), 2, acks).await;
    let name = common::name();
    let contenders = Contenders::start(backends, 2, &name, &options, Duration::from_millis(5));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let killed_at = Instant::now();
    let old = setup.kill_primary().unwrap();
    let restart = acks.is_some();
    let (setup, new_port, promoted, resumed) = tokio::task::spawn_blocking(move || {
        let new_port = setup
            .wait_for_new_primary(old, Duration::from_secs(30))
            .expect("a replica is promoted");
        let promoted = killed_at.elapsed();
        if restart {
            setup
                .node_on(old)
                .unwrap()
                .restart_as_replica_of(new_port)
                .expect("the old primary restarts as a replica");
            setup
                .wait_for_replicas(new_port, 2, Duration::from_secs(30))
                .expect("the new primary has two replicas again");
        }
        (setup, new_port, promoted, Instant::now())
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let holds = contenders.finish().await;
    // What the sentinels did, for a failure's diagnosis: a loaded machine can make them fail
    // over more than once.
    for sentinel in setup.sentinels() {
        for line in sentinel.log().lines().filter(|line| {
            [
                "+sdown master",
                "+odown",
                "+try-failover",
                "+switch-master",
                "-failover-abort",
            ]
            .iter()
            .any(|event| line.contains(event))
        }) {
            eprintln!("sentinel {}: {line}", sentinel.port());
        }
    }
    drop(setup);

    let run = Failover {
        killed_at,
        promoted,
        resumed,
        acknowledged: acks.is_some(),
        outage_budget: options.outage_budget,
    };
    check_failover(
        &holds,
        &run,
        &format!("primary {old} killed, {new_port} promoted"),
    )
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

/// An acknowledgement only counts on the connection its change was made on, told by the
/// connection's `CLIENT ID`: a server that refuses `CLIENT ID` (here an ACL) would make every
/// grant fail as unacknowledged, so `connect()` says so at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledgement_needs_client_id() {
    let server = common::Server::start();
    let user = [
        "ACL",
        "SETUSER",
        "noid",
        "on",
        ">secret",
        "~*",
        "&*",
        "+@all",
        "-client|id",
    ];
    assert_eq!(server.cli(&user), "OK");
    let url = format!("redis://noid:secret@127.0.0.1:{}", server.0.port());
    let error = RedisBackend::builder(url.as_str())
        .replicas_acked(1, Duration::from_millis(50))
        .connect()
        .await
        .expect_err("connect() refuses acknowledgement without CLIENT ID");
    assert!(
        matches!(
            error,
            fairlock::Error::InvalidArgument {
                what: "replicas_acked",
                ..
            }
        ),
        "{error}"
    );
    assert!(error.to_string().contains("CLIENT ID"), "{error}");
    assert!(
        !error.to_string().contains("secret"),
        "the password leaked: {error}"
    );
    // Without acknowledgement the same user is fine.
    RedisBackend::connect(&url).await.unwrap();
}

/// Two failovers in a row, the second of a primary that is alive (as Sentinel does when a
/// freshly promoted primary answers its pings late; here forced with `SENTINEL FAILOVER`).
/// The demoted primary goes on taking writes from the clients still connected to it until
/// Sentinel reconfigures it, about ten seconds later, and then drops them: releases made
/// there are lost, and the store keeps levels their handles gave up. Before the fix, a
/// handle re-entered its own stale level: it reused the old fencing token, below one already
/// handed out, and, renewing the lease at each re-entry, kept the others waiting for the
/// whole lease (60 s). Now such a hold is freed: tokens keep increasing, the lock stalls only
/// while the store is split, and no error reaches a contender. And no acknowledged hold is
/// lost: one granted by the demoted primary as it dropped its clients was, until a `WAIT`
/// sent again on a new connection no longer counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_failover_of_a_live_primary_leaves_no_stale_hold() {
    let mut setup = sentinels();
    let options = failover_options();
    let backends = backends(&setup.url(), 2, Some((2, Duration::from_millis(500)))).await;
    let name = common::name();
    let contenders = Contenders::start(backends, 2, &name, &options, Duration::from_millis(5));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let killed_at = Instant::now();
    let old = setup.kill_primary().unwrap();
    let (setup, first, second, whole) = tokio::task::spawn_blocking(move || {
        let first = setup
            .wait_for_new_primary(old, Duration::from_secs(30))
            .expect("a replica is promoted");
        setup
            .node_on(old)
            .unwrap()
            .restart_as_replica_of(first)
            .expect("the old primary restarts as a replica");
        setup
            .wait_for_replicas(first, 2, Duration::from_secs(30))
            .expect("the new primary has two replicas");
        // Grants are acknowledged again, and then the new primary is failed over in turn.
        std::thread::sleep(Duration::from_secs(1));
        let demoted = setup
            .force_failover(Duration::from_secs(30))
            .expect("the sentinels fail the live primary over");
        let second = setup
            .wait_for_new_primary(demoted, Duration::from_secs(30))
            .expect("another replica is promoted");
        setup
            .wait_for_replicas(second, 2, Duration::from_secs(30))
            .expect("the demoted primary rejoins as a replica");
        (setup, first, second, Instant::now())
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let holds = contenders.finish().await;
    drop(setup);

    for pair in holds.windows(2) {
        assert!(
            pair[1].token > pair[0].token,
            "tokens went back (a stale hold re-entered?): {pair:?}"
        );
    }
    let lost: Vec<_> = holds.iter().filter(|held| held.lost.is_some()).collect();
    let stall = longest_stall(&holds);
    let after = gaps_from(&holds, whole + Duration::from_secs(2));
    let slowest_after = after.iter().max().copied().unwrap_or_default();
    println!(
        "primary {old} killed, {first} promoted, then failed over to {second}; store whole \
         again {:?} after the kill; longest stall {stall:?}; {} holds, {} lost: {lost:?}; \
         slowest of {} hand-overs 2 s after that {slowest_after:?}",
        whole - killed_at,
        holds.len(),
        lost.len(),
        after.len()
    );
    // Grants are acknowledged by both replicas: none may be lost, not even one made on the
    // demoted primary as its clients were dropped (see
    // `a_wait_sent_again_on_a_new_connection_acknowledges_nothing`).
    assert!(lost.is_empty(), "acknowledged holds were lost: {lost:?}");
    assert!(
        stall < options.outage_budget,
        "the lock stalled {stall:?}: longer than the outage budget"
    );
    assert!(after.len() >= 20, "too few hand-overs after the failovers");
    assert!(
        slowest_after < Duration::from_millis(500),
        "hand-overs after the failovers are not wake-ups: {slowest_after:?}"
    );
}

/// `WAIT` counts the writes made on its own connection. When the connection a grant was made
/// on breaks while its `WAIT` blocks, fred sends the `WAIT` again on a new connection, maybe
/// to another server: there it waits for that server's writes, and answers for a grant it
/// never had. Here Sentinel fails a live primary over; the backend's connection still goes to
/// the demoted primary, which has no replica left, so the grant made there cannot be
/// acknowledged; its clients are then dropped (as Sentinel does when it reconfigures it) while
/// `WAIT` blocks, and the backend follows the sentinels to the new primary, whose replica
/// acknowledges at once. Before the fix that grant was handed out as acknowledged and lost
/// (one acknowledged hold per run in the double-failover test below).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_sent_again_on_a_new_connection_acknowledges_nothing() {
    let setup = sentinels();
    let backend = RedisBackend::builder(setup.url())
        .pool_size(1)
        .replicas_acked(1, Duration::from_secs(3))
        .connect()
        .await
        .unwrap();
    let client = LockClient::new(backend);
    let lock = client.fair_lock(common::name().as_str()).unwrap();
    lock.try_lock().await.unwrap().unlock().await.unwrap();

    let (mut setup, demoted) = tokio::task::spawn_blocking(move || {
        let demoted = setup
            .force_failover(Duration::from_secs(30))
            .expect("the sentinels fail the live primary over");
        let promoted = setup
            .wait_for_new_primary(demoted, Duration::from_secs(30))
            .expect("a replica is promoted");
        setup
            .wait_for_replicas(promoted, 1, Duration::from_secs(30))
            .expect("the other replica follows the new primary");
        (setup, demoted)
    })
    .await
    .unwrap();
    let old = setup.node_on(demoted).unwrap();
    assert!(
        old.cli(&["ROLE"]).unwrap().starts_with("master"),
        "the demoted primary was reconfigured already"
    );

    let attempt = tokio::spawn(async move {
        let result = lock.try_lock().await.map(|guard| guard.fencing_token());
        (lock, result)
    });
    let waiting = Instant::now();
    while !old.cli(&["CLIENT", "LIST"]).unwrap().contains("cmd=wait") {
        assert!(
            waiting.elapsed() < Duration::from_secs(2),
            "no WAIT on the demoted primary"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    old.cli(&["CLIENT", "KILL", "TYPE", "normal"]).unwrap();
    let (lock, result) = attempt.await.unwrap();
    assert!(
        matches!(result, Err(fairlock::Error::Unavailable { .. })),
        "a grant only the demoted primary had was handed out as acknowledged: {result:?}"
    );
    let state = lock.state().await.unwrap();
    assert!(
        state.holder.is_none(),
        "left held on the new primary: {state:?}"
    );
}
