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
    let mut tokens = Vec::new();
    for name in &names {
        let AcquireOutcome::Granted(grant) =
            backend.acquire(&request(name, &a, true)).await.unwrap()
        else {
            panic!("a gets {name}");
        };
        tokens.push(grant.token);
        assert!(matches!(
            backend.acquire(&request(name, &b, true)).await.unwrap(),
            AcquireOutcome::Queued { .. }
        ));
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

    for (name, token) in names.iter().zip(tokens) {
        let mut watch = backend.watch(name, &b).await.unwrap();
        let released = backend.release(name, &a, token).await.unwrap();
        assert_eq!(released, ReleaseOutcome::Released { remaining: 0 });
        let wake = tokio::time::timeout(Duration::from_secs(5), watch.recv()).await;
        let Ok(Some(Wake::Granted(grant))) = wake else {
            panic!("b was not told about {name}: {wake:?}");
        };
        assert!(backend
            .extend(name, &b, grant.token, Duration::from_secs(5))
            .await
            .unwrap());
        backend.release(name, &b, grant.token).await.unwrap();
    }
    assert!(backend
        .list(&format!("cluster-{run}-"))
        .await
        .unwrap()
        .is_empty());
}
