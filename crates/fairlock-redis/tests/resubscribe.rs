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
use fairlock_redis::fred::interfaces::ClientLike as _;

/// The command timeout of the backends whose subscriber is killed again and again. A subscribe
/// in flight when its connection is killed can lose its reply (fred, about once in 50 runs of
/// the churn below): it then waits out this timeout, and so do the watches queued behind it.
const KILLED_TIMEOUT: Duration = Duration::from_secs(1);

/// What a watch may take with [`KILLED_TIMEOUT`]: that one command timeout, and room.
const WATCH_BOUND: Duration = Duration::from_millis(2_500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_racing_reconnects_never_fail() {
    let server = Server::start();
    let backend = fairlock_redis::RedisBackend::builder(server.url())
        .command_timeout(KILLED_TIMEOUT)
        .connect()
        .await
        .unwrap();
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
            let watch = tokio::time::timeout(WATCH_BOUND, backend.watch(&lock, &who))
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
    shard_channels_settle(
        &server,
        "channels of live watches not subscribed after reconnects",
        |listed| {
            kept.iter()
                .all(|(lock, _)| listed.contains(&format!("{{{lock}}}")))
        },
    )
    .await;
}

/// Waits until the server's shard channels (`PUBSUB SHARDCHANNELS`) are as `settled` wants
/// them, for up to 10 s; then fails, saying `what` is wrong.
async fn shard_channels_settle(server: &Server, what: &str, settled: impl Fn(&str) -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let listed = server.cli(&["PUBSUB", "SHARDCHANNELS"]);
        if settled(&listed) {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}: {listed}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Watches queued on a channel whose subscribe is failing do not each try it again in turn:
/// the k-th would wait k command timeouts before its caller could even join the queue. The
/// first failure moves the retries to the background, and the queued watches return.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_watches_do_not_each_wait_for_a_failing_subscribe() {
    const WATCHES: u32 = 5;
    let (_scripts, silent, backend, subscriber) = silent_subscriber().await;
    silent.0.pause_process().unwrap();

    let (lock, who) = (name(), owner("waiter"));
    let started = tokio::time::Instant::now();
    let watches = (0..WATCHES).map(|_| {
        let (backend, lock, who) = (backend.clone(), lock.clone(), who.clone());
        tokio::spawn(async move {
            let watch = backend.watch(&lock, &who).await;
            (watch, started.elapsed())
        })
    });
    let mut slowest = Duration::ZERO;
    let mut kept = Vec::new();
    for watch in watches.collect::<Vec<_>>() {
        let (watched, took) = watch.await.unwrap();
        kept.push(watched.expect("a watch is not failed for a subscribe that failed"));
        slowest = slowest.max(took);
    }
    silent.0.resume_process().unwrap();
    // The retries in the background subscribe the channel once the server answers again.
    let channel = format!("{{{lock}}}");
    shard_channels_settle(
        &silent,
        "the channel of live watches was never subscribed",
        |listed| listed.contains(&channel),
    )
    .await;
    drop(kept);
    // One command timeout for the first subscribe, and room for a loaded machine; the old code
    // took WATCHES command timeouts (2 s).
    assert!(
        slowest < COMMAND_TIMEOUT * 2,
        "the slowest of {WATCHES} watches took {slowest:?} (command timeout {COMMAND_TIMEOUT:?})"
    );
    let _ = subscriber.quit().await;
}

const COMMAND_TIMEOUT: Duration = Duration::from_millis(400);

/// A backend whose scripts run on one server and whose subscriber is connected to another,
/// `silent`, which a test can stop (SIGSTOP) so that subscribes hang until the command
/// timeout, while the scripts still run.
async fn silent_subscriber() -> (
    Server,
    Server,
    fairlock_redis::RedisBackend,
    fairlock_redis::fred::clients::SubscriberClient,
) {
    use fairlock_redis::fred::types::config::{Config, ReconnectPolicy};
    use fairlock_redis::fred::types::Builder;

    let (scripts, silent) = (Server::start(), Server::start());
    let build = |url: String| {
        let mut builder = Builder::from_config(Config::from_url(&url).unwrap());
        builder.set_policy(ReconnectPolicy::new_constant(0, 100));
        builder.with_performance_config(|config| config.default_command_timeout = COMMAND_TIMEOUT);
        builder
    };
    let pool = build(scripts.url()).build_pool(1).unwrap();
    let subscriber = build(silent.url()).build_subscriber_client().unwrap();
    pool.init().await.unwrap();
    subscriber.init().await.unwrap();
    let backend =
        fairlock_redis::RedisBackend::from_clients(pool, subscriber.clone(), "queued:").unwrap();
    backend.pubsub_mode().await.unwrap();
    (scripts, silent, backend, subscriber)
}

/// Watches whose callers give up while the channel's subscribe hangs (each at its own
/// deadline, one after another) do not make the next one start the subscribe over: it goes
/// on without them, and a watch behind them waits for it once, not for each of them in turn.
/// (On the code before, where the subscribe ran in the watch's own future, this failed in 1
/// of 9 runs, at 1.44 s: fred mostly fails the queued subscribes together at the first one's
/// timeout, which hides the chain.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_cancelled_during_a_subscribe_do_not_start_it_over() {
    const GIVING_UP: u32 = 4;
    let (_scripts, silent, backend, subscriber) = silent_subscriber().await;
    silent.0.pause_process().unwrap();
    let (lock, who) = (name(), owner("waiter"));
    let started = tokio::time::Instant::now();
    let mut impatient = Vec::new();
    for i in 1..=GIVING_UP {
        let (backend, lock, who) = (backend.clone(), lock.clone(), who.clone());
        impatient.push(tokio::spawn(async move {
            let patience = Duration::from_millis(300) * i;
            tokio::time::timeout(patience, backend.watch(&lock, &who))
                .await
                .is_err()
        }));
        tokio::task::yield_now().await;
    }
    let patient = backend.watch(&lock, &who).await;
    let took = started.elapsed();
    silent.0.resume_process().unwrap();
    patient.expect("a watch is not failed for a subscribe that failed");
    let mut gave_up = 0;
    for task in impatient {
        gave_up += u32::from(task.await.unwrap());
    }
    // One command timeout for the one subscribe; the old code let each impatient watch start
    // it over, so the patient one subscribed only after all four gave up (1.6 s).
    assert!(
        took < COMMAND_TIMEOUT * 2,
        "the patient watch took {took:?}; {gave_up} gave up (command timeout {COMMAND_TIMEOUT:?})"
    );
    let _ = subscriber.quit().await;
}

/// Watches come and go while the subscriber reconnects, with no linger: once they are all
/// gone, the server has no subscription left. (A resubscribe under a replaced channel entry's
/// lock could land after the new entry's unsubscribe and leave one until the next reconnect;
/// this churn did not hit that narrow window in three runs before the fix, so it guards the
/// property, not that one interleaving.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_subscription_outlives_its_watches_across_reconnects() {
    let server = Server::start();
    let backend = fairlock_redis::RedisBackend::builder(server.url())
        .subscription_linger(Duration::ZERO)
        .command_timeout(KILLED_TIMEOUT)
        .connect()
        .await
        .unwrap();
    let locks: Vec<_> = (0..6).map(|_| name()).collect();
    // Watchers on every lock come and go, each watch held for a moment...
    let churn: Vec<_> = (0..8)
        .map(|task| {
            let (backend, locks) = (backend.clone(), locks.clone());
            tokio::spawn(async move {
                let who = owner(&format!("watcher {task}"));
                for round in 0..150 {
                    let lock = &locks[(task + round) % locks.len()];
                    let watch = tokio::time::timeout(WATCH_BOUND, backend.watch(lock, &who))
                        .await
                        .unwrap_or_else(|_| panic!("round {round}: watch() hung"))
                        .unwrap();
                    tokio::time::sleep(Duration::from_micros(200 * (round % 5) as u64)).await;
                    drop(watch);
                }
            })
        })
        .collect();
    // ...while the subscriber connection is dropped again and again.
    let mut kills = 0;
    while !churn.iter().all(|task| task.is_finished()) {
        kills += server
            .cli(&["CLIENT", "KILL", "TYPE", "pubsub"])
            .trim()
            .parse::<u32>()
            .unwrap_or(0);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for task in churn {
        task.await.unwrap();
    }
    eprintln!("{kills} kills");
    assert!(kills >= 10, "only {kills} kills");
    shard_channels_settle(
        &server,
        "subscriptions left after every watch was dropped",
        |listed| listed.trim().is_empty(),
    )
    .await;
}

/// A watch made on a runtime of its own, which ends right after: when its subscribe failed,
/// the retries in the background outlive that runtime, and the channel is subscribed once the
/// server allows it again. (They ran on the watch's runtime and died with it, leaving the
/// channel marked as retried: no later watch subscribed it until a reconnect.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_subscribe_is_retried_after_the_watch_runtime_ends() {
    let server = Server::start();
    let backend = server.backend().await;
    backend.pubsub_mode().await.unwrap();
    let (lock, who) = (name(), owner("watcher"));
    // Subscribes are refused (NOPERM) until the channels are allowed again.
    assert_eq!(
        server.cli(&["ACL", "SETUSER", "default", "resetchannels"]),
        "OK"
    );
    let watch = {
        let (backend, lock, who) = (backend.clone(), lock.clone(), who.clone());
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move { backend.watch(&lock, &who).await })
        })
        .join()
        .unwrap()
        .expect("a watch is not failed for a subscribe that failed")
    };
    assert_eq!(
        server.cli(&["ACL", "SETUSER", "default", "allchannels"]),
        "OK"
    );
    let channel = format!("{{{lock}}}");
    shard_channels_settle(
        &server,
        "the channel of a live watch was never subscribed",
        |listed| listed.contains(&channel),
    )
    .await;
    drop(watch);
}

/// A watch made while its channel's unsubscribe (the linger over) waits for the subscriber to
/// reconnect waits for that unsubscribe once: about one command timeout, then its subscribe
/// goes to the background. The unsubscribe queued its two channels' commands one after the
/// other, each waiting out the timeout, so the watch waited two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_behind_a_hanging_unsubscribe_waits_one_command_timeout() {
    let (_scripts, mut silent, backend, subscriber) = silent_subscriber().await;
    let (lock, who) = (name(), owner("waiter"));
    drop(backend.watch(&lock, &who).await.unwrap());
    // Gone: the subscriber reconnects in vain, and its commands wait for it to the timeout.
    silent.0.stop();
    // The default linger (2 s, as `from_clients` has it) runs out, and its unsubscribe hangs.
    tokio::time::sleep(Duration::from_millis(2_150)).await;
    let started = tokio::time::Instant::now();
    let watch = backend.watch(&lock, &who).await;
    let took = started.elapsed();
    watch.expect("a watch is not failed for an unsubscribe that failed");
    // What is left of the unsubscribe's one timeout (250 ms), and room; the old code took
    // what was left of two (650 ms).
    assert!(
        took < COMMAND_TIMEOUT + COMMAND_TIMEOUT / 4,
        "the watch took {took:?} (command timeout {COMMAND_TIMEOUT:?})"
    );
    let _ = subscriber.quit().await;
}

/// Backends sharing a subscriber made elsewhere, each watching the same lock while the server
/// does not answer: each waits about one command timeout, as alone. Their subscribes of the
/// lock's channel take turns (so that no backend unsubscribes it from under another), and a
/// turn held across the subscribe of a backend's own channel made the k-th wait k timeouts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_sharing_a_subscriber_do_not_wait_in_turn_for_a_silent_server() {
    const BACKENDS: usize = 4;
    let (_scripts, silent, first, subscriber) = silent_subscriber().await;
    let mut backends = vec![first];
    for _ in 1..BACKENDS {
        let pool = backends[0].pool().clone();
        let backend =
            fairlock_redis::RedisBackend::from_clients(pool, subscriber.clone(), "queued:")
                .unwrap();
        backend.pubsub_mode().await.unwrap();
        backends.push(backend);
    }
    silent.0.pause_process().unwrap();
    let lock = name();
    let started = tokio::time::Instant::now();
    let watches: Vec<_> = backends
        .iter()
        .enumerate()
        .map(|(i, backend)| {
            let (backend, lock) = (backend.clone(), lock.clone());
            tokio::spawn(async move {
                let watch = backend.watch(&lock, &owner(&format!("waiter {i}"))).await;
                (watch, started.elapsed())
            })
        })
        .collect();
    let mut slowest = Duration::ZERO;
    let mut kept = Vec::new();
    for watch in watches {
        let (watched, took) = watch.await.unwrap();
        kept.push(watched.expect("a watch is not failed for a subscribe that failed"));
        slowest = slowest.max(took);
    }
    silent.0.resume_process().unwrap();
    // One command timeout, and room; taking turns across it took BACKENDS of them.
    assert!(
        slowest < COMMAND_TIMEOUT * 2,
        "the slowest of {BACKENDS} watches took {slowest:?} (command timeout {COMMAND_TIMEOUT:?})"
    );
    // Once the server answers, the retries in the background subscribe the lock's channel.
    let channel = format!("queued:{{{lock}}}:c\n");
    shard_channels_settle(
        &silent,
        "the lock's channel was never subscribed",
        |listed| format!("{listed}\n").contains(&channel),
    )
    .await;
    drop(kept);
    let _ = subscriber.quit().await;
}
