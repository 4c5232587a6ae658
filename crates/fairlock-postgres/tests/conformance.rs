//! fairlock's conformance suite, through the real core, on a real PostgreSQL: several
//! `PostgresBackend` instances (each with its own pool and listening connection, as separate
//! processes have) share one database, and the suite spreads owners over them.

mod common;

use std::sync::Arc;

use common::Server;
use fairlock::LockBackend;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_keeps_the_fairlock_contract() {
    let server = Server::start();
    let url = server.url();
    fairlock::conformance::run_all(move || {
        let url = url.clone();
        async move {
            let backend = fairlock_postgres::PostgresBackend::builder(url)
                .pool_size(4)
                .connect()
                .await
                .expect("connect to the test server");
            Arc::new(backend) as Arc<dyn LockBackend>
        }
    })
    .await;
}
