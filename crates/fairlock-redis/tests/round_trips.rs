//! What the user API costs in Redis commands: an uncontended `lock()` is one function call and
//! subscribes to nothing; only a caller that has to wait subscribes to wake-ups (the lock's
//! channel and its backend's channel of the lock).

mod common;

use std::time::Duration;

use common::Server;
use fairlock::LockClient;
use fairlock_redis::RedisBackend;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_caller_that_waits_subscribes() {
    let server = Server::start();
    let client = LockClient::new(RedisBackend::connect(&server.url()).await.unwrap());
    let name = common::name();
    let holder = client.fair_lock(name.as_str()).unwrap();
    let waiter = client.fair_lock(name.as_str()).unwrap();

    // On Redis 7 the scripts run as functions of fairlock's library. The server's first call
    // finds no such function, loads the library (once) and calls again.
    let warm_up = client.fair_lock(common::name().as_str()).unwrap();
    warm_up.lock().await.unwrap().unlock().await.unwrap();
    assert_eq!(
        server.command_calls("function|load"),
        1,
        "the library is loaded once"
    );
    assert_eq!(
        server.command_calls("fcall"),
        3,
        "acquire (twice: before and after the load), release"
    );
    let scripts = server.command_calls("fcall");
    let guard = holder.lock().await.unwrap();
    assert_eq!(
        server.command_calls("fcall") - scripts,
        1,
        "one acquire function call"
    );
    assert_eq!(server.command_calls("evalsha"), 0, "no script by SHA");
    for subscribe in ["ssubscribe", "subscribe", "psubscribe"] {
        assert_eq!(
            server.command_calls(subscribe),
            0,
            "free lock: no subscription ({subscribe})"
        );
    }

    let waiting = tokio::spawn(async move { waiter.lock().await.map(|g| g.fencing_token()) });
    let started = std::time::Instant::now();
    while server.command_calls("ssubscribe") == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the waiter never subscribed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let token = guard.fencing_token();
    guard.unlock().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .unwrap()
        .unwrap();
    assert!(next.unwrap() > token);
    assert_eq!(
        server.command_calls("ssubscribe"),
        2,
        "once each: the lock's channel and the backend's own"
    );
}
