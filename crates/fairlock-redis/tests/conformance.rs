//! fairlock's conformance suite, through the real core, on standalone Redis and on a Cluster:
//! several `RedisBackend` instances (each with its own connections and subscriber, as separate
//! processes have) share one server, and the suite spreads owners over them.

mod common;

use std::sync::Arc;

use common::Server;
use fairlock::LockBackend;

/// Opens a new `RedisBackend` on `url` each time.
fn opener(url: String) -> impl fairlock::conformance::OpenBackend {
    move || {
        let url = url.clone();
        async move {
            let backend = fairlock_redis::RedisBackend::builder(url)
                .pool_size(4)
                .connect()
                .await
                .expect("connect to the test server");
            Arc::new(backend) as Arc<dyn LockBackend>
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn standalone_redis_keeps_the_fairlock_contract() {
    let server = Server::start();
    fairlock::conformance::run_all(opener(server.url())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_cluster_keeps_the_fairlock_contract() {
    let cluster = common::cluster();
    fairlock::conformance::run_all(opener(cluster.url())).await;
}
