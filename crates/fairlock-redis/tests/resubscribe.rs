//! Wake-up subscriptions across reconnects of the subscriber connection.
//!
//! fred's `resubscribe_all()` sends `SUBSCRIBE`/`PSUBSCRIBE` even with nothing to subscribe,
//! and their error replies could reach a `watch()` (and so a user's `lock()`) in flight at the
//! time. The backend resubscribes its own channels one by one instead: a `watch()` racing a
//! reconnect must never fail, and every watched channel must be subscribed again.

mod common;

use std::time::Duration;

use common::{name, owner, Server};
use fairlock::backend::LockBackend;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_racing_reconnects_never_fail() {
    let server = Server::start();
    let backend = server.backend().await;
    let who = owner("watcher");
    let mut kept = Vec::new();
    let mut kills = 0;
    for round in 0..80 {
        // Drop the subscriber connection; fred reconnects at once.
        kills += server
            .cli(&["CLIENT", "KILL", "TYPE", "pubsub"])
            .trim()
            .parse::<u32>()
            .expect("CLIENT KILL answers how many it killed");
        for _ in 0..3 {
            let lock = name();
            let watch = tokio::time::timeout(Duration::from_secs(10), backend.watch(&lock, &who))
                .await
                .unwrap_or_else(|_| panic!("round {round}: watch() hung"))
                .unwrap_or_else(|err| panic!("round {round}: watch() failed: {err}"));
            kept.push((lock, watch));
        }
        // Keep a bounded number of watches alive, so channels stay subscribed across kills.
        if kept.len() > 12 {
            kept.drain(..3);
        }
    }
    // The races happened: the subscriber connection (a pubsub client once it has a
    // subscription) was killed in most rounds.
    eprintln!("{kills} kills in 80 rounds");
    assert!(kills >= 40, "only {kills} kills in 80 rounds");
    // After the last reconnect settles, every channel still watched is subscribed again.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let listed = server.cli(&["PUBSUB", "SHARDCHANNELS"]);
        let missing: Vec<&str> = kept
            .iter()
            .map(|(lock, _)| lock.as_str())
            .filter(|lock| !listed.contains(&format!("{{{lock}}}")))
            .collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "channels of live watches not subscribed after reconnects: {missing:?}\n{listed}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
