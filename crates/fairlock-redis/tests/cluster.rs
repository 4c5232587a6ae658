//! The Redis backend on a 3-master Cluster: locks spread over the nodes, each lock in one
//! slot, wake-ups from whichever node serves the lock.

mod common;

use std::time::Duration;

use common::{owner, request};
use fairlock::backend::{AcquireOutcome, LockBackend, ReleaseOutcome, Wake};
use fairlock::{LockName, Owner};
use fairlock_redis::RedisBackend;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_over_and_list_work_on_every_node() {
    let cluster = common::cluster();
    let backend = RedisBackend::connect(&cluster.url()).await.unwrap();
    let run = uuid::Uuid::new_v4().simple().to_string();
    let names: Vec<LockName> = (0..12)
        .map(|i| {
            LockName::new(format!(
                "cluster-{run}-{i}{}",
                if i % 3 == 0 { "{x}" } else { "" }
            ))
            .unwrap()
        })
        .collect();
    // b from `Owner::unique`: its hand-overs go on the backend's own channel of each lock,
    // which must be subscribed on the lock's node, whichever it is.
    let (a, b) = (owner("a"), Owner::unique());
    let mut holds = Vec::new();
    for name in &names {
        let holding = request(name, &a, true);
        let AcquireOutcome::Granted(grant) = backend.acquire(&holding).await.unwrap() else {
            panic!("a gets {name}");
        };
        let waiting = request(name, &b, true);
        assert!(matches!(
            backend.acquire(&waiting).await.unwrap(),
            AcquireOutcome::Queued { .. }
        ));
        holds.push((holding, grant.token, waiting));
    }
    for (index, port) in cluster.ports().into_iter().enumerate() {
        let keys: u64 = cluster.cli(index, &["DBSIZE"]).unwrap().parse().unwrap();
        assert!(keys > 0, "node {port} serves none of the 12 locks");
    }
    assert_eq!(
        backend
            .list(&format!("cluster-{run}-"))
            .await
            .unwrap()
            .len(),
        names.len()
    );

    for (holding, token, waiting) in holds {
        let name = &holding.name;
        let mut watch = backend.watch(name, &b).await.unwrap();
        let released = backend
            .release(name, &a, token, holding.attempt)
            .await
            .unwrap();
        assert_eq!(released, ReleaseOutcome::Released { remaining: 0 });
        let wake = tokio::time::timeout(Duration::from_secs(5), watch.recv()).await;
        let Ok(Some(Wake::Granted { attempt, grant })) = wake else {
            panic!("b was not told about {name}: {wake:?}");
        };
        assert_eq!(attempt, waiting.attempt);
        assert!(backend
            .extend(name, &b, grant.token, Duration::from_secs(5))
            .await
            .unwrap());
        let released = backend
            .release(name, &b, grant.token, waiting.attempt)
            .await
            .unwrap();
        assert_eq!(released, ReleaseOutcome::Released { remaining: 0 });
    }
    assert!(backend
        .list(&format!("cluster-{run}-"))
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restart_loses_its_locks_but_not_token_order() {
    let mut cluster = common::cluster();
    let backend = RedisBackend::connect(&cluster.url()).await.unwrap();
    let lock = common::name();
    let (a, b) = (owner("a"), owner("b"));
    let holding = request(&lock, &a, true);
    let AcquireOutcome::Granted(before) = backend.acquire(&holding).await.unwrap() else {
        panic!("a gets the lock");
    };
    let mut watch = backend.watch(&lock, &b).await.unwrap();
    let node = cluster
        .node_for_key(&format!("fairlock:{{{lock}}}:h"))
        .unwrap();
    // The node comes back with its slots but without data or cached scripts.
    cluster.node_mut(node).restart().unwrap();
    let wake = tokio::time::timeout(Duration::from_secs(10), watch.recv()).await;
    assert!(matches!(wake, Ok(Some(Wake::Recheck))), "{wake:?}");
    let started = std::time::Instant::now();
    let waiting = request(&lock, &b, true);
    let after = loop {
        // The cluster may need a moment to agree the node is back.
        match backend.acquire(&waiting).await {
            Ok(AcquireOutcome::Granted(grant)) => break grant,
            outcome => {
                assert!(started.elapsed() < Duration::from_secs(10), "{outcome:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert!(after.token > before.token, "{after:?} after {before:?}");
    let released = backend
        .release(&lock, &a, before.token, holding.attempt)
        .await
        .unwrap();
    assert_eq!(released, ReleaseOutcome::NotHeld);
}

/// A busy lock whose slot moves to another node while contenders in two processes (two
/// backends, each with its own subscriber) keep taking it: no error reaches `lock()`,
/// `unlock()` or the watchdog's renewals, no two holds overlap, and soon after the move
/// hand-overs are back at wake-up speed (the old node unsubscribed every process from the
/// lock's channel; a process that has not noticed waits for a heartbeat, 10 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_busy_lock_survives_the_migration_of_its_slot() {
    use std::sync::Arc;
    use std::time::Instant;

    use common::contenders::{gaps_from, Contenders};
    use fairlock::LockOptions;

    let cluster = Arc::new(common::cluster());
    let lock = common::name();
    let slot: u16 = cluster
        .cli(
            0,
            &["CLUSTER", "KEYSLOT", &format!("fairlock:{{{lock}}}:h")],
        )
        .unwrap()
        .parse()
        .unwrap();
    let from = cluster.node_for_slot(slot).unwrap();
    let to = (from + 1) % 3;
    let options = LockOptions::default()
        .with_watchdog_lease(Duration::from_secs(3))
        .with_waiter_ttl(Duration::from_secs(30));
    let mut backends = Vec::new();
    for _process in 0..2 {
        backends.push(RedisBackend::connect(&cluster.url()).await.unwrap());
    }
    let contenders = Contenders::start(backends, 2, &lock, &options, Duration::from_millis(5));

    tokio::time::sleep(Duration::from_secs(1)).await;
    let moving = cluster.clone();
    tokio::task::spawn_blocking(move || moving.migrate_slot(slot, to, Duration::from_millis(1500)))
        .await
        .unwrap()
        .expect("the slot moves");
    assert_eq!(cluster.node_for_slot(slot).unwrap(), to);
    let moved = Instant::now();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let holds = contenders.finish().await;

    for held in &holds {
        assert!(held.lost.is_none(), "a hold was lost: {held:?}");
    }
    for pair in holds.windows(2) {
        assert!(
            pair[1].acquired >= pair[0].released,
            "two holds overlap: {pair:?}"
        );
        assert!(pair[1].token > pair[0].token, "tokens went back: {pair:?}");
    }
    // After the move, and the moment a process takes to notice it (it re-reads the slot map
    // every second while it has waiters), hand-overs are wake-ups again, not re-checks.
    let gaps = gaps_from(&holds, moved + Duration::from_millis(1500));
    let slowest = gaps.iter().max().copied().unwrap_or_default();
    println!(
        "{} holds, {} after the move; slowest hand-over after it {slowest:?}",
        holds.len(),
        gaps.len()
    );
    assert!(
        gaps.len() >= 20,
        "too few hand-overs after the move: {}",
        gaps.len()
    );
    assert!(
        slowest < Duration::from_millis(500),
        "a hand-over after the move took {slowest:?}: a wake-up was lost"
    );
}
