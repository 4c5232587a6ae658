//! A Redis Cluster whose shards have replicas (3 masters, 1 replica each): the master that
//! serves a busy lock is killed with SIGKILL and the cluster promotes its replica, while
//! contenders in two processes keep taking the lock. The same checks as the Sentinel failover
//! (`sentinel.rs`), on a Cluster shard.

mod common;

use std::time::{Duration, Instant};

use common::contenders::{backends, check_failover, failover_options, Contenders, Failover};
use fairlock_testsupport::RedisCluster;

/// Without acknowledgement: no error reaches a contender (the outage is shorter than the
/// outage budget), fencing tokens keep increasing, holds overlap only where a grant the dead
/// master had not replicated was lost, and after the failover hand-overs are wake-ups again
/// (the processes subscribe to the lock's channel on the promoted replica).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contenders_ride_through_a_shard_failover() {
    let overlaps = shard_failover(None).await;
    println!("without acknowledgement: {overlaps} overlapping holds");
}

/// With every grant and renewal acknowledged by the shard's replica, which is the one the
/// cluster promotes: no two holds overlap and no lease is lost. Until the promoted master has
/// a replica again nothing can be acknowledged, so the test restarts the dead node, which
/// rejoins as the new master's replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_grants_never_overlap_across_a_shard_failover() {
    let overlaps = shard_failover(Some((1, Duration::from_millis(500)))).await;
    assert_eq!(overlaps, 0, "acknowledged holds overlapped");
}

/// Runs the scenario; how many pairs of holds overlapped.
async fn shard_failover(acks: Option<(u32, Duration)>) -> usize {
    let mut cluster = RedisCluster::start_with_replicas(3, 1).expect("the cluster starts");
    let name = common::name();
    let slot: u16 = cluster
        .cli(
            0,
            &["CLUSTER", "KEYSLOT", &format!("fairlock:{{{name}}}:h")],
        )
        .unwrap()
        .parse()
        .unwrap();
    let master = cluster.node_for_slot(slot).unwrap();
    let options = failover_options();
    let backends = backends(&cluster.url(), 2, acks).await;
    let contenders = Contenders::start(backends, 2, &name, &options, Duration::from_millis(5));

    tokio::time::sleep(Duration::from_secs(1)).await;
    let killed_at = Instant::now();
    cluster.node_mut(master).stop();
    let restart = acks.is_some();
    let (cluster, promoted_node, promoted, resumed) = tokio::task::spawn_blocking(move || {
        let promoted_node = cluster
            .wait_for_failover(slot, master, Duration::from_secs(30))
            .expect("the replica is promoted");
        let promoted = killed_at.elapsed();
        if restart {
            cluster
                .node_mut(master)
                .restart()
                .expect("the dead master restarts");
            cluster
                .wait_for_replicas(promoted_node, 1, Duration::from_secs(30))
                .expect("it rejoins as the new master's replica");
        }
        (cluster, promoted_node, promoted, Instant::now())
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let holds = contenders.finish().await;
    drop(cluster);

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
        &format!("master {master} killed, node {promoted_node} promoted"),
    )
}
