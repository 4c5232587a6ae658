//! The Redis backend against a real `redis-server`, at the level of the `LockBackend` trait.

mod common;

use std::time::Duration;

use common::{name, owner, request, Server};
use fairlock::backend::{
    AcquireOutcome, AcquireRequest, Grant, LockBackend, ReleaseOutcome, Wake, Watch,
};
use fairlock::{Error, LockName};
use fairlock_redis::RedisBackend;

async fn granted(backend: &RedisBackend, request: &AcquireRequest) -> Grant {
    match backend.acquire(request).await.unwrap() {
        AcquireOutcome::Granted(grant) => grant,
        other => panic!("{} expected a grant, got {other:?}", request.owner),
    }
}

async fn queued(backend: &RedisBackend, request: &AcquireRequest) -> Option<Duration> {
    match backend.acquire(request).await.unwrap() {
        AcquireOutcome::Queued { retry_after, .. } => retry_after,
        other => panic!("{} expected to queue, got {other:?}", request.owner),
    }
}

async fn next_wake(watch: &mut Watch) -> Wake {
    tokio::time::timeout(Duration::from_secs(5), watch.recv())
        .await
        .expect("a wake-up within 5 s")
        .expect("the watch is open")
}

fn with_ttl(mut request: AcquireRequest, ttl_ms: u64) -> AcquireRequest {
    request.waiter_ttl = Duration::from_millis(ttl_ms);
    request
}

/// Keys left under this lock's tag, found with `redis-cli --scan`.
fn keys_of(server: &Server, name: &LockName) -> Vec<String> {
    let pattern = format!("fairlock:{{{}}}*", name.as_str());
    let mut keys: Vec<String> = server
        .cli(&["--scan", "--pattern", &pattern])
        .lines()
        .map(str::to_owned)
        .collect();
    keys.sort();
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_in_fifo_order_through_hand_over() {
    let server = Server::start();
    let backend = server.backend().await;
    let lock = name();
    let (a, b, c, d) = (owner("a"), owner("b"), owner("c"), owner("d"));
    let first = granted(&backend, &request(&lock, &a, true)).await;
    assert_eq!(first.hold_count, 1);

    let mut watches = Vec::new();
    for waiter in [&b, &c, &d] {
        watches.push(backend.watch(&lock, waiter).await.unwrap());
        queued(&backend, &request(&lock, waiter, true)).await;
    }
    let state = backend.inspect(&lock).await.unwrap();
    let order: Vec<&str> = state.waiters.iter().map(|w| w.owner.as_str()).collect();
    assert_eq!(order, ["b", "c", "d"]);

    let mut holder = (a.clone(), first.token);
    for (waiter, watch) in [&b, &c, &d].into_iter().zip(watches.iter_mut()) {
        let released = backend.release(&lock, &holder.0, holder.1).await.unwrap();
        assert_eq!(released, ReleaseOutcome::Released { remaining: 0 });
        let Wake::Granted(grant) = next_wake(watch).await else {
            panic!("{waiter} expected a hand-over");
        };
        assert!(grant.token > holder.1, "tokens grow");
        let pending = backend.inspect(&lock).await.unwrap().holder.unwrap();
        assert_eq!(
            (pending.owner.as_str(), pending.confirmed),
            (waiter.as_str(), false)
        );
        // Confirming by acquire keeps the count at 1 and the token.
        let confirmed = granted(&backend, &request(&lock, waiter, true)).await;
        assert_eq!(confirmed, grant);
        assert!(
            backend
                .inspect(&lock)
                .await
                .unwrap()
                .holder
                .unwrap()
                .confirmed
        );
        holder = (waiter.clone(), grant.token);
    }
    backend.release(&lock, &holder.0, holder.1).await.unwrap();
    assert_eq!(keys_of(&server, &lock), [format!("fairlock:{{{lock}}}:f")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentrant_acquire_keeps_the_token_and_counts() {
    let server = Server::start();
    let backend = server.backend().await;
    let (lock, a) = (name(), owner("a"));
    let first = granted(&backend, &request(&lock, &a, false)).await;
    let second = granted(&backend, &request(&lock, &a, false)).await;
    assert_eq!(
        second,
        Grant {
            token: first.token,
            hold_count: 2
        }
    );

    let wrong = backend.release(&lock, &a, first.token + 1).await.unwrap();
    assert_eq!(wrong, ReleaseOutcome::NotHeld);
    let other = backend
        .release(&lock, &owner("b"), first.token)
        .await
        .unwrap();
    assert_eq!(other, ReleaseOutcome::NotHeld);
    assert_eq!(
        backend
            .inspect(&lock)
            .await
            .unwrap()
            .holder
            .unwrap()
            .hold_count,
        2
    );

    let one = backend.release(&lock, &a, first.token).await.unwrap();
    assert_eq!(one, ReleaseOutcome::Released { remaining: 1 });
    let zero = backend.release(&lock, &a, first.token).await.unwrap();
    assert_eq!(zero, ReleaseOutcome::Released { remaining: 0 });
    let again = backend.release(&lock, &a, first.token).await.unwrap();
    assert_eq!(again, ReleaseOutcome::NotHeld);
    assert!(!backend
        .extend(&lock, &a, first.token, Duration::from_secs(1))
        .await
        .unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nobody_barges_past_waiters() {
    let server = Server::start();
    let backend = server.backend().await;
    let (lock, a, b, c) = (name(), owner("a"), owner("b"), owner("c"));
    let grant = granted(&backend, &request(&lock, &a, false)).await;
    assert_eq!(
        backend.acquire(&request(&lock, &b, false)).await.unwrap(),
        AcquireOutcome::Busy
    );
    assert!(
        backend.inspect(&lock).await.unwrap().waiters.is_empty(),
        "Busy never queues"
    );

    queued(&backend, &request(&lock, &b, true)).await;
    // The holder's lease runs out: the lock is free, but b is first in line.
    backend
        .extend(&lock, &a, grant.token, Duration::from_millis(1))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        backend.acquire(&request(&lock, &c, false)).await.unwrap(),
        AcquireOutcome::Busy
    );
    queued(&backend, &request(&lock, &c, true)).await;
    granted(&backend, &request(&lock, &b, false)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_owner_keeps_its_place_and_is_queued_once() {
    let server = Server::start();
    let backend = server.backend().await;
    let (lock, a, b, c) = (name(), owner("a"), owner("b"), owner("c"));
    granted(&backend, &request(&lock, &a, true)).await;
    queued(&backend, &request(&lock, &b, true)).await;
    queued(&backend, &request(&lock, &c, true)).await;
    queued(&backend, &request(&lock, &b, true)).await;
    let state = backend.inspect(&lock).await.unwrap();
    let order: Vec<&str> = state.waiters.iter().map(|w| w.owner.as_str()).collect();
    assert_eq!(order, ["b", "c"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_holder_leaves_the_lock_to_the_head_waiter() {
    let server = Server::start();
    let backend = server.backend().await;
    let (lock, a, b) = (name(), owner("a"), owner("b"));
    let mut short = request(&lock, &a, true);
    short.lease = Duration::from_millis(300);
    granted(&backend, &short).await;
    let retry_after = queued(&backend, &request(&lock, &b, true))
        .await
        .expect("b is head");
    assert!(retry_after <= Duration::from_millis(300), "{retry_after:?}");
    tokio::time::sleep(retry_after + Duration::from_millis(20)).await;
    let grant = granted(&backend, &request(&lock, &b, true)).await;
    assert_eq!(grant.hold_count, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_grant_lasts_only_the_waiter_ttl() {
    let server = Server::start();
    let backend = server.backend().await;
    let (lock, a, b) = (name(), owner("a"), owner("b"));
    let grant = granted(&backend, &request(&lock, &a, true)).await;
    queued(&backend, &with_ttl(request(&lock, &b, true), 200)).await;
    backend.release(&lock, &a, grant.token).await.unwrap();
    let pending = backend
        .inspect(&lock)
        .await
        .unwrap()
        .holder
        .expect("handed to b");
    assert_eq!(pending.owner, "b");
    assert!(!pending.confirmed);
    assert!(pending.lease_remaining <= Duration::from_millis(200));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(backend.inspect(&lock).await.unwrap().holder, None);
    assert_eq!(keys_of(&server, &lock), [format!("fairlock:{{{lock}}}:f")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_waiters_never_block_wherever_they_stand() {
    let server = Server::start();
    let backend = server.backend().await;
    let lock = name();
    let (a, dead_head, b, dead_middle, c) = (
        owner("a"),
        owner("dead-head"),
        owner("b"),
        owner("dead-middle"),
        owner("c"),
    );
    let grant = granted(&backend, &request(&lock, &a, true)).await;
    queued(&backend, &with_ttl(request(&lock, &dead_head, true), 150)).await;
    queued(&backend, &request(&lock, &b, true)).await;
    queued(&backend, &with_ttl(request(&lock, &dead_middle, true), 150)).await;
    queued(&backend, &request(&lock, &c, true)).await;
    tokio::time::sleep(Duration::from_millis(250)).await;

    let state = backend.inspect(&lock).await.unwrap();
    let order: Vec<&str> = state.waiters.iter().map(|w| w.owner.as_str()).collect();
    assert_eq!(order, ["b", "c"], "expired waiters are not counted");

    let mut watch_b = backend.watch(&lock, &b).await.unwrap();
    backend.release(&lock, &a, grant.token).await.unwrap();
    let Wake::Granted(to_b) = next_wake(&mut watch_b).await else {
        panic!("b is next")
    };
    let mut watch_c = backend.watch(&lock, &c).await.unwrap();
    backend.release(&lock, &b, to_b.token).await.unwrap();
    let Wake::Granted(to_c) = next_wake(&mut watch_c).await else {
        panic!("c is next")
    };
    assert!(to_c.token > to_b.token);
    // A dead waiter that comes back has lost its place: it queues at the end.
    queued(&backend, &request(&lock, &dead_head, true)).await;
    let state = backend.inspect(&lock).await.unwrap();
    assert_eq!(state.holder.unwrap().owner, "c");
    assert_eq!(state.waiters.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaving_the_queue_gives_back_a_pending_grant() {
    let server = Server::start();
    let backend = server.backend().await;
    let (lock, a, b, c) = (name(), owner("a"), owner("b"), owner("c"));
    let grant = granted(&backend, &request(&lock, &a, true)).await;
    queued(&backend, &request(&lock, &b, true)).await;
    queued(&backend, &request(&lock, &c, true)).await;
    let mut watch_c = backend.watch(&lock, &c).await.unwrap();
    backend.release(&lock, &a, grant.token).await.unwrap();
    assert_eq!(
        backend.inspect(&lock).await.unwrap().holder.unwrap().owner,
        "b"
    );
    backend.leave_queue(&lock, &b).await.unwrap();
    let Wake::Granted(to_c) = next_wake(&mut watch_c).await else {
        panic!("c is next")
    };
    assert!(backend
        .extend(&lock, &c, to_c.token, Duration::from_secs(5))
        .await
        .unwrap());
    let holder = backend.inspect(&lock).await.unwrap().holder.unwrap();
    assert_eq!((holder.owner.as_str(), holder.confirmed), ("c", true));
    // Leaving when not queued is fine and changes nothing.
    backend.leave_queue(&lock, &b).await.unwrap();
    assert_eq!(
        backend.inspect(&lock).await.unwrap().holder.unwrap().owner,
        "c"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_frees_and_hands_over() {
    let server = Server::start();
    let backend = server.backend().await;
    let (lock, a, b) = (name(), owner("a"), owner("b"));
    assert!(!backend.force_release(&lock).await.unwrap());
    let first = granted(&backend, &request(&lock, &a, true)).await;
    granted(&backend, &request(&lock, &a, true)).await;
    queued(&backend, &request(&lock, &b, true)).await;
    let mut watch_b = backend.watch(&lock, &b).await.unwrap();
    assert!(backend.force_release(&lock).await.unwrap());
    let Wake::Granted(to_b) = next_wake(&mut watch_b).await else {
        panic!("b is next")
    };
    assert!(to_b.token > first.token);
    assert_eq!(
        backend.release(&lock, &a, first.token).await.unwrap(),
        ReleaseOutcome::NotHeld
    );
    assert!(backend.force_release(&lock).await.unwrap());
    assert!(!backend.force_release(&lock).await.unwrap());
    assert_eq!(keys_of(&server, &lock), [format!("fairlock:{{{lock}}}:f")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_locks_leave_only_the_fence_key() {
    let server = Server::start();
    let backend = server.backend().await;
    let (lock, a, b) = (name(), owner("a"), owner("b"));
    let grant = granted(&backend, &request(&lock, &a, true)).await;
    queued(&backend, &request(&lock, &b, true)).await;
    assert!(keys_of(&server, &lock).len() > 2);
    backend.leave_queue(&lock, &b).await.unwrap();
    backend.release(&lock, &a, grant.token).await.unwrap();
    assert_eq!(keys_of(&server, &lock), [format!("fairlock:{{{lock}}}:f")]);
    // Waiters that die leave nothing either, once their deadline passes.
    let other = name();
    let grant = granted(&backend, &request(&other, &a, true)).await;
    queued(&backend, &with_ttl(request(&other, &b, true), 100)).await;
    backend.release(&other, &a, grant.token).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        keys_of(&server, &other),
        [format!("fairlock:{{{other}}}:f")]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_are_reloaded_after_script_flush() {
    let server = Server::start();
    let backend = server.backend().await;
    let (lock, a) = (name(), owner("a"));
    let grant = granted(&backend, &request(&lock, &a, true)).await;
    assert_eq!(server.cli(&["SCRIPT", "FLUSH"]), "OK");
    let again = granted(&backend, &request(&lock, &a, true)).await;
    assert_eq!(again.hold_count, 2);
    assert_eq!(server.cli(&["SCRIPT", "FLUSH"]), "OK");
    backend.release(&lock, &a, grant.token).await.unwrap();
    assert_eq!(
        backend
            .inspect(&lock)
            .await
            .unwrap()
            .holder
            .unwrap()
            .hold_count,
        1
    );
}

/// The script text exactly as the backend builds it.
fn script(operation: &str) -> String {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../lua/");
    let read = |file: &str| std::fs::read_to_string(format!("{dir}{file}")).unwrap();
    format!(
        "{}\n{}",
        read("prelude.lua"),
        read(&format!("{operation}.lua"))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_request_is_applied_once() {
    let server = Server::start();
    let lock = name();
    let tag = lock.as_str();
    let keys: Vec<String> = ["h", "q", "z", "w", "f", "c"]
        .iter()
        .map(|suffix| format!("fairlock:{{{tag}}}:{suffix}"))
        .collect();
    let eval = |operation: &str, args: &[&str]| {
        let body = script(operation);
        let mut command = vec!["EVAL", body.as_str(), "6"];
        command.extend(keys.iter().map(String::as_str));
        command.extend_from_slice(args);
        server.cli(&command)
    };
    let first = eval("acquire", &["a", "30000", "5000", "1", "req-1", tag]);
    assert!(first.starts_with("G ") && first.ends_with(" 1"), "{first}");
    // fred re-sends the same command after a reconnect: same id, same reply, no re-entry.
    assert_eq!(
        eval("acquire", &["a", "30000", "5000", "1", "req-1", tag]),
        first
    );
    let token = first.split(' ').nth(1).unwrap();
    let second = eval("acquire", &["a", "30000", "5000", "1", "req-2", tag]);
    assert!(second.ends_with(" 2"), "{second}");
    assert_eq!(eval("release", &["a", token, "req-3"]), "R 1");
    assert_eq!(eval("release", &["a", token, "req-3"]), "R 1");
    assert_eq!(server.cli(&["HGET", &keys[0], "c"]), "1");
    assert_eq!(eval("release", &["a", token, "req-4"]), "R 0");
    assert_eq!(eval("release", &["a", token, "req-4"]), "R 0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_data_is_a_conflict() {
    let server = Server::start();
    let backend = server.backend().await;
    let lock = name();
    server.cli(&["SET", &format!("fairlock:{{{lock}}}:h"), "not a lock"]);
    let err = backend
        .acquire(&request(&lock, &owner("a"), true))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Conflict { name, .. } if name == lock.as_str()),
        "{err}"
    );
    let err = backend.inspect(&lock).await.unwrap_err();
    assert!(matches!(err, Error::Conflict { .. }), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_unavailable_and_named() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let started = std::time::Instant::now();
    let err = RedisBackend::builder(format!("redis://user:secret@127.0.0.1:{port}"))
        .connect_timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5), "bounded");
    let endpoint = format!("127.0.0.1:{port}");
    assert!(
        matches!(&err, Error::Unavailable { backend: "redis", endpoint: e, .. } if *e == endpoint),
        "{err}"
    );
    assert!(!err.to_string().contains("secret"), "{err}");
}

/// The clients connected to `server`, not counting the `redis-cli` that asks.
fn clients_of(server: &Server) -> usize {
    server.cli(&["CLIENT", "LIST"]).lines().count() - 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_connect_leaves_no_connection_behind() {
    let server = Server::start();
    // A stopped server accepts TCP connections (the kernel does) but never answers, so
    // `connect` hangs halfway, with fred's connection tasks already running.
    server.0.pause_process().unwrap();
    let connect = RedisBackend::builder(server.url())
        .connect_timeout(Duration::from_secs(30))
        .connect();
    assert!(tokio::time::timeout(Duration::from_millis(300), connect)
        .await
        .is_err());
    server.0.resume_process().unwrap();
    // Before the fix the abandoned clients reconnected and stayed; now they quit.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let clients = clients_of(&server);
        if clients == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{clients} connections left: {}",
            server.cli(&["CLIENT", "LIST"])
        );
    }
    // Stays at zero: nothing reconnects later.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(clients_of(&server), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_growing_after_the_server_loses_its_data() {
    let server = Server::start();
    let backend = server.backend().await;
    let (lock, a) = (name(), owner("a"));
    let before = granted(&backend, &request(&lock, &a, true)).await;
    // This server is private to the test: wiping it is what a restart without persistence does.
    assert_eq!(server.cli(&["FLUSHALL"]), "OK");
    let after = granted(&backend, &request(&lock, &owner("b"), true)).await;
    assert!(after.token > before.token, "{after:?} after {before:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_names_work_and_list_finds_them() {
    let server = Server::start();
    let backend = server.backend().await;
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    let names: Vec<LockName> = ["{braced}", "a}", "#hash", "spaced name:x", "größe\nline"]
        .iter()
        .map(|n| LockName::new(format!("odd-{suffix}-{n}")).unwrap())
        .collect();
    let a = owner("a");
    for (i, lock) in names.iter().enumerate() {
        granted(&backend, &request(lock, &a, true)).await;
        if i % 2 == 0 {
            queued(&backend, &request(lock, &owner("b"), true)).await;
        }
    }
    let mut listed = backend.list(&format!("odd-{suffix}-")).await.unwrap();
    listed.sort_by(|x, y| x.name.cmp(&y.name));
    let mut expected: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    expected.sort();
    assert_eq!(
        listed.iter().map(|s| s.name.clone()).collect::<Vec<_>>(),
        expected
    );
    for summary in &listed {
        assert_eq!(summary.holder.as_deref(), Some("a"));
    }
    assert!(backend.list("nothing-like-this-").await.unwrap().is_empty());
}

/// How many `SSUBSCRIBE` commands the server has run.
fn ssubscribe_calls(server: &Server) -> u64 {
    let stats = server.cli(&["INFO", "commandstats"]);
    stats
        .lines()
        .find_map(|line| line.strip_prefix("cmdstat_ssubscribe:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |calls| calls.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_share_one_subscription_per_lock_and_drop_it() {
    let server = Server::start();
    let backend = RedisBackend::builder(server.url())
        .subscription_linger(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    let lock = name();
    let channel = format!("fairlock:{{{lock}}}:c");
    let subscribers = || server.cli(&["PUBSUB", "SHARDNUMSUB", &channel]);
    let first = backend.watch(&lock, &owner("a")).await.unwrap();
    let second = backend.watch(&lock, &owner("b")).await.unwrap();
    assert_eq!(subscribers(), format!("{channel}\n1"));
    assert_eq!(
        ssubscribe_calls(&server),
        1,
        "one subscription for both watches"
    );
    drop(first);
    drop(second);
    // Within the linger, watching again reuses the subscription.
    let third = backend.watch(&lock, &owner("c")).await.unwrap();
    assert_eq!(ssubscribe_calls(&server), 1, "the subscription lingered");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(subscribers(), format!("{channel}\n1"), "c still watches");
    drop(third);
    let started = std::time::Instant::now();
    while subscribers() != format!("{channel}\n0") {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "never unsubscribed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_told_to_recheck_after_the_subscriber_reconnects() {
    let server = Server::start();
    let backend = server.backend().await;
    let lock = name();
    let mut watch = backend.watch(&lock, &owner("a")).await.unwrap();
    // Kill every client connection but this redis-cli's; fred reconnects.
    server.cli(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    assert_eq!(next_wake(&mut watch).await, Wake::Recheck);
    // And the subscription is back: a hand-over still reaches the waiter.
    let (a, b) = (owner("a"), owner("b"));
    let grant = granted(&backend, &request(&lock, &b, true)).await;
    queued(&backend, &request(&lock, &a, true)).await;
    let started = std::time::Instant::now();
    let channel = format!("fairlock:{{{lock}}}:c");
    while server.cli(&["PUBSUB", "SHARDNUMSUB", &channel]) != format!("{channel}\n1") {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "never resubscribed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    backend.release(&lock, &b, grant.token).await.unwrap();
    loop {
        match next_wake(&mut watch).await {
            Wake::Recheck => continue,
            Wake::Granted(to_a) => {
                assert!(to_a.token > grant.token);
                break;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_loses_holds_but_tokens_keep_growing() {
    let mut server = Server::start();
    let backend = server.backend().await;
    let (lock, a, b) = (name(), owner("a"), owner("b"));
    let before = granted(&backend, &request(&lock, &a, true)).await;
    let mut watch = backend.watch(&lock, &b).await.unwrap();
    // No persistence: data and cached scripts are gone after this.
    server.0.restart().unwrap();
    assert_eq!(
        next_wake(&mut watch).await,
        Wake::Recheck,
        "waiters look again after a reconnect"
    );
    let after = granted(&backend, &request(&lock, &b, true)).await;
    assert!(after.token > before.token, "{after:?} after {before:?}");
    assert_eq!(
        backend.release(&lock, &a, before.token).await.unwrap(),
        ReleaseOutcome::NotHeld
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_goes_away_makes_calls_unavailable() {
    let mut server = Server::start();
    let backend = RedisBackend::builder(server.url())
        .command_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap();
    let lock = name();
    granted(&backend, &request(&lock, &owner("a"), true)).await;
    server.0.stop();
    let started = std::time::Instant::now();
    let err = backend
        .acquire(&request(&lock, &owner("b"), true))
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "bounded by the command timeout"
    );
    let endpoint = format!("127.0.0.1:{}", server.0.port());
    assert!(
        matches!(&err, Error::Unavailable { endpoint: e, .. } if *e == endpoint),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_work_and_never_show() {
    const SECRET: &str = "s3cret-for-this-test";
    let server =
        Server(fairlock_testsupport::RedisServer::start_with(&["--requirepass", SECRET]).unwrap());
    let url = format!("redis://:{SECRET}@127.0.0.1:{}", server.0.port());
    let backend = RedisBackend::connect(&url).await.unwrap();
    granted(&backend, &request(&name(), &owner("a"), true)).await;
    let shown = format!("{backend:?} {:?}", RedisBackend::builder(url));
    assert!(!shown.contains(SECRET), "{shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_on_clients_built_elsewhere() {
    use fairlock_redis::fred::clients::SubscriberClient;
    use fairlock_redis::fred::interfaces::ClientLike;
    use fairlock_redis::fred::types::config::{Config, ReconnectPolicy};
    use fairlock_redis::fred::types::Builder;
    let server = Server::start();
    let config = Config::from_url(&server.url()).unwrap();
    let mut builder = Builder::from_config(config);
    builder.set_policy(ReconnectPolicy::new_constant(0, 100));
    let pool = builder.build_pool(2).unwrap();
    let subscriber = builder.build_subscriber_client().unwrap();
    pool.init().await.unwrap();
    subscriber.init().await.unwrap();
    let backend = RedisBackend::from_clients(pool, subscriber, "mine:").unwrap();
    assert_eq!(backend.prefix(), "mine:");
    let (lock, a, b) = (name(), owner("a"), owner("b"));
    let grant = granted(&backend, &request(&lock, &a, true)).await;
    queued(&backend, &request(&lock, &b, true)).await;
    let mut watch = backend.watch(&lock, &b).await.unwrap();
    backend.release(&lock, &a, grant.token).await.unwrap();
    assert!(matches!(next_wake(&mut watch).await, Wake::Granted(_)));
    let keys = server.cli(&["--scan", "--pattern", &format!("mine:{{{lock}}}*")]);
    assert!(keys.contains(&format!("mine:{{{lock}}}:h")), "{keys}");
    assert!(matches!(
        RedisBackend::from_clients(
            backend.pool().clone(),
            SubscriberClient::new(Config::default(), None, None, None),
            "{bad}"
        ),
        Err(Error::InvalidArgument { .. })
    ));
}

#[test]
fn the_backend_is_a_shareable_trait_object() {
    fn shareable<T: Send + Sync + 'static>() {}
    shareable::<RedisBackend>();
    let _erase: fn(RedisBackend) -> std::sync::Arc<dyn LockBackend> = |b| std::sync::Arc::new(b);
}
