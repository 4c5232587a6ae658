//! Wake-ups around dead queue entries, errors that are not outages, and what a Cluster slot
//! migration may cost. Each test came from an adversarial review of the sorted-set queue and
//! of slot-migration handling, and failed on the code it reviewed.

mod common;

use std::time::{Duration, Instant};

use common::{name, owner, request, Server};
use fairlock::backend::{AcquireOutcome, AcquireRequest, LockBackend, Wake, Watch};
use fairlock_redis::RedisBackend;

fn with_ttl(mut request: AcquireRequest, ttl_ms: u64) -> AcquireRequest {
    request.waiter_ttl = Duration::from_millis(ttl_ms);
    request
}

fn with_lease(mut request: AcquireRequest, lease_ms: u64) -> AcquireRequest {
    request.lease = Duration::from_millis(lease_ms);
    request
}

async fn queued(backend: &RedisBackend, request: &AcquireRequest) -> Option<Duration> {
    match backend.acquire(request).await.unwrap() {
        AcquireOutcome::Queued { retry_after, .. } => retry_after,
        other => panic!("{} expected to queue, got {other:?}", request.owner),
    }
}

async fn wake_within(watch: &mut Watch, ms: u64) -> Option<Wake> {
    tokio::time::timeout(Duration::from_millis(ms), watch.recv())
        .await
        .ok()
        .flatten()
}

/// When the live head (b) of a free lock gives up while a dead entry (d) still stands in front
/// of it, the next live waiter (c) is told to look (it was not when only the raw first entry
/// and the head search's own drops counted as "the front changed").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_head_abandoning_behind_a_dead_entry_wakes_the_next() {
    let server = Server::start();
    let backend = server.backend().await;
    let (lock, a, d, b, c) = (name(), owner("a"), owner("d"), owner("b"), owner("c"));
    let holding = with_lease(request(&lock, &a, true), 200);
    assert!(matches!(
        backend.acquire(&holding).await.unwrap(),
        AcquireOutcome::Granted(_)
    ));
    queued(&backend, &with_ttl(request(&lock, &d, true), 100)).await; // dies
    let b_request = request(&lock, &b, true);
    queued(&backend, &b_request).await;
    queued(&backend, &request(&lock, &c, true)).await;
    let mut watch_c = backend.watch(&lock, &c).await.unwrap();
    // a's lease runs out, d dies: b is the live head of a free lock. b gives up.
    tokio::time::sleep(Duration::from_millis(300)).await;
    backend.abandon(&lock, &b, b_request.attempt).await.unwrap();
    let wake = wake_within(&mut watch_c, 2000).await;
    assert_eq!(
        wake,
        Some(Wake::Recheck),
        "c is the live head of a free lock and was not told"
    );
}

/// A newcomer whose call evicts the dead head (d) of a free lock tells the live waiter behind
/// it (b), which was not the head at its last call and would otherwise wait for its heartbeat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_that_clears_a_dead_head_wakes_the_live_one() {
    let server = Server::start();
    let backend = server.backend().await;
    let (lock, a, d, b, e) = (name(), owner("a"), owner("d"), owner("b"), owner("e"));
    let holding = with_lease(request(&lock, &a, true), 200);
    assert!(matches!(
        backend.acquire(&holding).await.unwrap(),
        AcquireOutcome::Granted(_)
    ));
    queued(&backend, &with_ttl(request(&lock, &d, true), 100)).await;
    let b_request = request(&lock, &b, true);
    assert_eq!(queued(&backend, &b_request).await, None, "b is not head");
    let mut watch_b = backend.watch(&lock, &b).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A newcomer finds the lock free, clears d and queues behind b.
    queued(&backend, &request(&lock, &e, true)).await;
    let wake = wake_within(&mut watch_b, 2000).await;
    assert_eq!(
        wake,
        Some(Wake::Recheck),
        "b heads a free lock and was not told"
    );
}

/// A user whose ACL does not cover the lock's keys gets the permission error at once, not a
/// 2 s retry reported as `Unavailable` (which the core would ride out as an outage): only the
/// Cluster's refusals become TRYAGAIN.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permission_error_is_not_an_outage() {
    let server = Server::start();
    let setuser = [
        "ACL", "SETUSER", "locker", "on", ">pw", "~other:*", "&*", "+@all",
    ];
    assert_eq!(server.cli(&setuser), "OK");
    let url = server.url();
    let host = url.trim_start_matches("redis://");
    let backend = RedisBackend::connect(&format!("redis://locker:pw@{host}"))
        .await
        .expect("connects");
    let lock = name();
    let started = Instant::now();
    let outcome = backend.acquire(&request(&lock, &owner("a"), true)).await;
    let took = started.elapsed();
    println!("{outcome:?} after {took:?}");
    assert!(
        !matches!(outcome, Err(fairlock::Error::Unavailable { .. })),
        "a permission error reported as an outage after {took:?}: {outcome:?}"
    );
    // And it is the permission error, at once (Redis 7.0 words it "can't access"; later
    // versions answer NOPERM).
    let shown = format!("{outcome:?}");
    assert!(
        matches!(outcome, Err(fairlock::Error::Backend { .. }))
            && (shown.contains("can't access") || shown.contains("NOPERM")),
        "expected the permission error: {outcome:?}"
    );
    assert!(took < Duration::from_secs(1), "took {took:?}");
}

fn connections_received(cluster: &fairlock_testsupport::RedisCluster) -> u64 {
    (0..3)
        .map(|i| {
            let info = cluster.cli(i, &["INFO", "stats"]).unwrap();
            info.lines()
                .find_map(|line| line.strip_prefix("total_connections_received:"))
                .unwrap()
                .trim()
                .parse::<u64>()
                .unwrap()
        })
        .sum()
}

/// A process with a waiter on a quiet Cluster opens no connections: its periodic check of the
/// slot map goes over an existing one (fred 10.1 opens a new connection for every
/// `sync_cluster()`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_on_a_quiet_cluster_opens_no_connections() {
    let cluster = common::cluster();
    let backend = RedisBackend::connect(&cluster.url()).await.unwrap();
    let lock = name();
    let (a, b) = (owner("a"), owner("b"));
    assert!(matches!(
        backend.acquire(&request(&lock, &a, true)).await.unwrap(),
        AcquireOutcome::Granted(_)
    ));
    let _watch = backend.watch(&lock, &b).await.unwrap();
    queued(&backend, &request(&lock, &b, true)).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = connections_received(&cluster);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let opened = connections_received(&cluster) - before;
    // The cli calls themselves open 3 connections per count.
    println!("{opened} connections in 5 s (3 of them redis-cli)");
    assert!(opened <= 3, "{opened} new connections in 5 quiet seconds");
}

/// While the lock's slot is open for migration (IMPORTING/MIGRATING, for 3 s) but its keys have
/// not moved: renewals still work (`extend` touches only the hold, which is still there), and
/// retries of the refused scripts do not open a connection each (fred 10.1 opens one per
/// `sync_cluster()`; refreshes are limited to one per client per 250 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_marked_migrating_keeps_locks_whose_keys_have_not_moved() {
    use std::sync::Arc;
    let cluster = Arc::new(common::cluster());
    let backend = Arc::new(RedisBackend::connect(&cluster.url()).await.unwrap());
    let lock = name();
    let a = owner("a");
    let holding = request(&lock, &a, true);
    let AcquireOutcome::Granted(grant) = backend.acquire(&holding).await.unwrap() else {
        panic!("granted");
    };
    let slot = cluster
        .cli(
            0,
            &["CLUSTER", "KEYSLOT", &format!("fairlock:{{{lock}}}:h")],
        )
        .unwrap();
    let from = cluster.node_for_slot(slot.parse().unwrap()).unwrap();
    let to = (from + 1) % 3;
    let (from_id, to_id) = (cluster.node_id(from).unwrap(), cluster.node_id(to).unwrap());
    let before = connections_received(&cluster);
    assert_eq!(
        cluster
            .cli(to, &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &from_id])
            .unwrap(),
        "OK"
    );
    assert_eq!(
        cluster
            .cli(from, &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &to_id])
            .unwrap(),
        "OK"
    );
    let started = Instant::now();
    let mut renewals = Vec::new();
    for _ in 0..20 {
        let (backend, lock, a) = (backend.clone(), lock.clone(), a.clone());
        renewals.push(tokio::spawn(async move {
            let mut failures = 0;
            while started.elapsed() < Duration::from_secs(3) {
                match backend
                    .extend(&lock, &a, grant.token, Duration::from_secs(30))
                    .await
                {
                    Ok(true) => {}
                    other => {
                        failures += 1;
                        if failures == 1 {
                            println!("renewal failed after {:?}: {other:?}", started.elapsed());
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            failures
        }));
    }
    let mut failures = 0;
    for renewal in renewals {
        failures += renewal.await.unwrap();
    }
    let opened = connections_received(&cluster) - before;
    for node in [to, from] {
        cluster
            .cli(node, &["CLUSTER", "SETSLOT", &slot, "STABLE"])
            .unwrap();
    }
    println!("{failures} failed renewals; {opened} connections opened in 3 s (6 by redis-cli)");
    assert!(opened < 50, "{opened} connections opened in 3 s");
    assert_eq!(
        failures, 0,
        "renewals failed while the lock's keys never left the node"
    );
}

/// Tickets keep FIFO order when F (with the ticket counter) is lost while the queue lives,
/// also after the highest ticket left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tickets_stay_ordered_after_the_fence_is_lost() {
    let server = Server::start();
    let backend = server.backend().await;
    let lock = name();
    let f = format!("fairlock:{{{}}}:f", lock.as_str());
    assert!(matches!(
        backend
            .acquire(&request(&lock, &owner("h"), true))
            .await
            .unwrap(),
        AcquireOutcome::Granted(_)
    ));
    let w1 = request(&lock, &owner("w1"), true);
    queued(&backend, &w1).await;
    let w2 = request(&lock, &owner("w2"), true);
    queued(&backend, &w2).await;
    backend.abandon(&lock, &w2.owner, w2.attempt).await.unwrap();
    server.cli(&["DEL", &f]);
    queued(&backend, &request(&lock, &owner("w3"), true)).await;
    server.cli(&["DEL", &f]);
    queued(&backend, &request(&lock, &owner("w4"), true)).await;
    let order: Vec<String> = backend
        .inspect(&lock)
        .await
        .unwrap()
        .waiters
        .iter()
        .map(|w| w.owner.as_str().to_owned())
        .collect();
    assert_eq!(order, ["w1", "w3", "w4"]);
}
