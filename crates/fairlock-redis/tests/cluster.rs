//! The Redis backend on a 3-master Cluster: locks spread over the nodes, each lock in one
//! slot, wake-ups from whichever node serves the lock.

mod common;

use std::time::Duration;

use common::{owner, request};
use fairlock::backend::{AcquireOutcome, LockBackend, ReleaseOutcome, Wake};
use fairlock::LockName;
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
    let (a, b) = (owner("a"), owner("b"));
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
