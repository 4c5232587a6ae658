//! fairlock's conformance suite, through the real core, on standalone Redis.

mod common;

use std::sync::Arc;

use common::Server;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn standalone_redis_keeps_the_fairlock_contract() {
    let server = Server::start();
    let backend = fairlock_redis::RedisBackend::builder(server.url())
        .pool_size(8)
        .connect()
        .await
        .unwrap();
    fairlock::conformance::run_all(Arc::new(backend)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_cluster_keeps_the_fairlock_contract() {
    let cluster = common::cluster();
    let backend = fairlock_redis::RedisBackend::builder(cluster.url())
        .pool_size(8)
        .connect()
        .await
        .unwrap();
    fairlock::conformance::run_all(Arc::new(backend)).await;
}
