//! Which pub/sub wakes waiters. Redis 6.2, the oldest supported Redis, has no sharded pub/sub:
//! the backend detects that when it connects and uses classic `PUBLISH`/`SUBSCRIBE`; Redis 7
//! gets sharded pub/sub. The 6.2 server is the `redis-server` that `scripts/install-deps.sh`
//! installs (see `fairlock_testsupport::redis62_server`); without it these tests fail, never
//! skip.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{name, Server};
use fairlock::{LockBackend, LockClient, LockOptions};
use fairlock_redis::{PubsubMode, RedisBackend};
use fairlock_testsupport::{redis62_server, RedisCluster, RedisServer};

fn start_62() -> Server {
    Server(RedisServer::start_binary(redis62_server(), &[]).expect("redis-server 6.2 starts"))
}

/// Opens a new `RedisBackend` on `url` each time.
fn opener(url: String) -> impl fairlock::conformance::OpenBackend {
    move || {
        let url = url.clone();
        async move {
            let backend = RedisBackend::builder(url)
                .pool_size(4)
                .connect()
                .await
                .expect("connect to the test server");
            Arc::new(backend) as Arc<dyn LockBackend>
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_6_2_keeps_the_fairlock_contract() {
    let server = start_62();
    let backend = server.backend().await;
    assert_eq!(backend.pubsub_mode().await.unwrap(), PubsubMode::Classic);
    fairlock::conformance::run_all(opener(server.url())).await;
    assert!(
        server.command_calls("publish") > 0 && server.command_calls("subscribe") > 0,
        "the suite's waiters were woken through classic pub/sub"
    );
}

/// The same on Redis 6.2, whose channels are classic ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_backend_on_redis_6_2_clients_leaves_no_subscription_or_task() {
    common::dropped_backend_leaves_no_subscription_or_task(&start_62(), "CHANNELS").await;
}

/// Options under which only a wake-up can hand the lock over quickly: a waiter heartbeats
/// every 20 s, and the holder's lease (when the head waiter would look again) is 30 s.
fn slow_polling() -> LockOptions {
    LockOptions::default()
        .with_waiter_ttl(Duration::from_secs(60))
        .with_lease(Duration::from_secs(30))
}

/// A holder on one backend and a waiter on another (as two processes): the waiter must get
/// the lock within a second of the unlock, which only a published wake-up can do. Returns
/// both clients, still connected.
async fn hand_over_is_woken(url: &str) -> (LockClient, LockClient) {
    let hand_over = HandOver::queue(url).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    hand_over.release_wakes_the_waiter("").await
}

/// A waiter queued behind a holder, each on a backend of its own (as two processes), with
/// [`slow_polling`] options.
struct HandOver {
    holder: LockClient,
    waiter: LockClient,
    lock: fairlock::LockName,
    guard: fairlock::LockGuard,
    waiting: tokio::task::JoinHandle<fairlock::Result<fairlock::LockGuard>>,
}

impl HandOver {
    /// Returns once the waiter is queued (and so subscribed).
    async fn queue(url: &str) -> HandOver {
        let connect = || async {
            LockClient::new(RedisBackend::connect(url).await.expect("connects"))
                .with_options(slow_polling())
                .unwrap()
        };
        let (holder, waiter) = (connect().await, connect().await);
        let lock = name();
        let guard = holder
            .fair_lock(lock.as_str())
            .unwrap()
            .lock()
            .await
            .unwrap();
        let waiting = {
            let lock = waiter.fair_lock(lock.as_str()).unwrap();
            tokio::spawn(async move { lock.lock().await })
        };
        let queued = Instant::now();
        while holder
            .state(lock.as_str())
            .await
            .unwrap()
            .waiters
            .is_empty()
        {
            assert!(queued.elapsed() < Duration::from_secs(5), "never queued");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        HandOver {
            holder,
            waiter,
            lock,
            guard,
            waiting,
        }
    }

    /// The holder unlocks: the waiter must get the lock within a second, which only a
    /// published wake-up can do (`case` names the case in a failure). Returns both clients.
    async fn release_wakes_the_waiter(self, case: &str) -> (LockClient, LockClient) {
        let token = self.guard.fencing_token();
        let released = Instant::now();
        self.guard.unlock().await.unwrap();
        let next = tokio::time::timeout(Duration::from_secs(5), self.waiting)
            .await
            .expect("the waiter was not woken (it would have waited for its heartbeat)")
            .unwrap()
            .unwrap();
        let took = released.elapsed();
        assert!(next.fencing_token() > token);
        assert!(
            took < Duration::from_secs(1),
            "{case}hand-over took {took:?}: not a wake-up"
        );
        next.unlock().await.unwrap();
        (self.holder, self.waiter)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_on_redis_6_2_is_woken_at_once() {
    let server = start_62();
    let _clients = hand_over_is_woken(&server.url()).await;
    assert!(
        server.command_calls("publish") > 0,
        "published with PUBLISH"
    );
    assert!(
        server.command_calls("subscribe") > 0,
        "subscribed with SUBSCRIBE"
    );
    // The subscription ends with the last watch (after the default 2 s linger), by UNSUBSCRIBE.
    let started = Instant::now();
    while server.command_calls("unsubscribe") == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "never unsubscribed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(server.cli(&["PUBSUB", "CHANNELS"]), "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_on_a_redis_6_2_cluster_is_woken_at_once() {
    let cluster = RedisCluster::start_binary(redis62_server(), 3, &[]).expect("the cluster starts");
    let backend = RedisBackend::connect(&cluster.url()).await.unwrap();
    assert_eq!(backend.pubsub_mode().await.unwrap(), PubsubMode::Classic);
    hand_over_is_woken(&cluster.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_7_uses_sharded_pubsub() {
    let server = Server::start();
    let backend = server.backend().await;
    assert_eq!(backend.pubsub_mode().await.unwrap(), PubsubMode::Sharded);
    hand_over_is_woken(&server.url()).await;
    assert!(server.command_calls("spublish") > 0);
    assert_eq!(server.command_calls("publish"), 0);
    assert_eq!(server.command_calls("subscribe"), 0);
}

/// A user refused `COMMAND` is told the mode by `INFO server`; one refused both gets classic
/// pub/sub, which works on every server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detection_falls_back_when_commands_are_refused() {
    let server = Server::start();
    for (user, refused, mode) in [
        ("no-command", "-command", PubsubMode::Sharded),
        ("no-command-no-info", "-command -info", PubsubMode::Classic),
    ] {
        let mut setuser = vec!["ACL", "SETUSER", user, "on", ">pw", "~*", "&*", "+@all"];
        setuser.extend(refused.split(' '));
        assert_eq!(server.cli(&setuser), "OK");
        let url = format!("redis://{user}:pw@127.0.0.1:{}", server.0.port());
        let backend = RedisBackend::connect(&url).await.unwrap();
        assert_eq!(backend.pubsub_mode().await.unwrap(), mode, "{user}");
        hand_over_is_woken(&url).await;
    }
    assert!(server.command_calls("publish") > 0 && server.command_calls("spublish") > 0);
}

/// A watch must be subscribed on the server when `watch()` returns: the waiter registers
/// before the call that queues it so that no wake-up slips between the two. fred answers a
/// classic `SUBSCRIBE` as soon as it is written (its confirmation arrives out of band), so a
/// hand-over published right after could reach the server first and be lost; the conformance
/// suite's `hand_over` check saw that about once in twenty runs on Redis 6.2. Here many
/// fresh channels in a row: each release must wake the head waiter's watch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_classic_watch_is_subscribed_when_it_returns() {
    use fairlock::backend::{AcquireOutcome, Wake};

    let server = start_62();
    let backend = RedisBackend::builder(server.url())
        .pool_size(4)
        .connect()
        .await
        .unwrap();
    assert_eq!(backend.pubsub_mode().await.unwrap(), PubsubMode::Classic);
    for round in 0..1000 {
        let lock = name();
        let (holder, waiter) = (common::owner("holder"), common::owner("waiter"));
        let held = common::request(&lock, &holder, false);
        let AcquireOutcome::Granted(grant) = backend.acquire(&held).await.unwrap() else {
            panic!("a fresh lock is granted");
        };
        let queued = backend
            .acquire(&common::request(&lock, &waiter, true))
            .await
            .unwrap();
        assert!(
            matches!(queued, AcquireOutcome::Queued { .. }),
            "{queued:?}"
        );
        let mut watch = backend.watch(&lock, &waiter).await.unwrap();
        backend
            .release(&lock, &holder, grant.token, held.attempt)
            .await
            .unwrap();
        let wake = tokio::time::timeout(Duration::from_secs(2), watch.recv()).await;
        assert!(
            matches!(wake, Ok(Some(Wake::Granted { .. } | Wake::Recheck))),
            "round {round}: the hand-over's wake-up was lost: {wake:?}"
        );
    }
}

/// A backend made with `from_clients` (a pool of one and a subscriber, each command timing
/// out after `command_timeout`) on a server stopped before the backend starts detecting its
/// pub/sub mode; resume it with `server.0.resume_process()`.
async fn detecting_on_a_stopped_server(
    command_timeout: Duration,
    prefix: &str,
) -> (
    Server,
    fairlock_redis::fred::clients::Pool,
    fairlock_redis::fred::clients::SubscriberClient,
    RedisBackend,
) {
    use fairlock_redis::fred::interfaces::ClientLike;
    use fairlock_redis::fred::types::config::{Config, ReconnectPolicy};
    use fairlock_redis::fred::types::Builder;

    let server = Server::start();
    let mut builder = Builder::from_config(Config::from_url(&server.url()).unwrap());
    builder.set_policy(ReconnectPolicy::new_constant(0, 100));
    builder.with_performance_config(|config| config.default_command_timeout = command_timeout);
    let pool = builder.build_pool(1).unwrap();
    let subscriber = builder.build_subscriber_client().unwrap();
    pool.init().await.unwrap();
    subscriber.init().await.unwrap();
    server.0.pause_process().unwrap();
    let backend = RedisBackend::from_clients(pool.clone(), subscriber.clone(), prefix).unwrap();
    (server, pool, subscriber, backend)
}

/// Callers queued behind a detection that fails share its failure: none asks the server
/// again in turn, which made the k-th wait k command timeouts while the server was away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_queued_behind_a_failing_detection_share_its_failure() {
    use fairlock_redis::fred::interfaces::ClientLike;

    const COMMAND_TIMEOUT: Duration = Duration::from_millis(400);
    const CALLERS: u32 = 5;
    // Stopped before the backend starts detecting: every detection hangs to its timeout.
    let (server, pool, subscriber, backend) =
        detecting_on_a_stopped_server(COMMAND_TIMEOUT, "queued:").await;
    let started = Instant::now();
    let callers: Vec<_> = (0..CALLERS)
        .map(|_| {
            let backend = backend.clone();
            tokio::spawn(async move { (backend.pubsub_mode().await, started.elapsed()) })
        })
        .collect();
    let mut slowest = Duration::ZERO;
    for caller in callers {
        let (mode, took) = caller.await.unwrap();
        assert!(
            matches!(mode, Err(fairlock::Error::Unavailable { .. })),
            "{mode:?}"
        );
        slowest = slowest.max(took);
    }
    server.0.resume_process().unwrap();
    // The background detection's one timeout, shared; the old code took one more per caller
    // (2.4 s).
    assert!(
        slowest < COMMAND_TIMEOUT * 2,
        "the slowest of {CALLERS} callers took {slowest:?} (command timeout {COMMAND_TIMEOUT:?})"
    );
    // Once the server answers, the next caller detects.
    assert_eq!(backend.pubsub_mode().await.unwrap(), PubsubMode::Sharded);
    let _ = subscriber.quit().await;
    let _ = pool.quit().await;
}

/// A process's classic subscriptions live on one node of a Cluster (fred sends them where
/// the subscriber's id hashes to), and a classic message reaches every node that is part of
/// the cluster. When that node leaves (its slots resharded away, then `del-node`), a process
/// still watching must subscribe again on a node that is in: here its waiter must still be
/// woken at once, whether the node it left is shut down or keeps running on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_after_its_subscriptions_node_leaves_a_6_2_cluster() {
    for shut_down in [true, false] {
        waiter_outlives_its_subscriptions_node(shut_down).await;
    }
}

async fn waiter_outlives_its_subscriptions_node(shut_down: bool) {
    let mut cluster =
        RedisCluster::start_binary(redis62_server(), 3, &[]).expect("the cluster starts");
    let hand_over = HandOver::queue(&cluster.url()).await;
    let lock = &hand_over.lock;
    // The node holding the waiter's subscriptions: the one that lists channels.
    let started = Instant::now();
    let subscribed_on = loop {
        let listing: Vec<usize> = (0..3)
            .filter(|i| !cluster.cli(*i, &["PUBSUB", "CHANNELS"]).unwrap().is_empty())
            .collect();
        if let [node] = listing[..] {
            break node;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "subscribed on {listing:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Its slots go to the node of the lock's keys (the lock's slot moves there first if it
    // was on the leaving node).
    let key = format!("fairlock:{{{lock}}}:h");
    let lock_node = cluster.node_for_key(&key).unwrap();
    let to = if lock_node == subscribed_on {
        (subscribed_on + 1) % 3
    } else {
        lock_node
    };
    println!(
        "shut down: {shut_down}; ports {:?}; subscribed on node {subscribed_on}, the lock on node {lock_node}",
        cluster.ports()
    );
    let gone = tokio::task::block_in_place(|| {
        if lock_node == subscribed_on {
            let slot: u16 = cluster
                .cli(0, &["CLUSTER", "KEYSLOT", &key])
                .unwrap()
                .parse()
                .unwrap();
            cluster.migrate_slot(slot, to, Duration::ZERO).unwrap();
        }
        cluster
            .remove_node(subscribed_on, to)
            .expect("the node leaves")
    });
    // Kept running (until the end of this function) or shut down now.
    let _gone = if shut_down {
        drop(gone);
        None
    } else {
        assert_ne!(
            gone.cli(&["PUBSUB", "CHANNELS"]).unwrap(),
            "",
            "still subscribed there"
        );
        Some(gone)
    };
    // Time to notice (the slot map is read every second while a lock is watched).
    tokio::time::sleep(Duration::from_secs(3)).await;
    hand_over
        .release_wakes_the_waiter(&format!("shut down: {shut_down}: "))
        .await;
}

/// `pubsub_mode` is cancel safe: a caller dropped while the detection waits for a stopped
/// server leaves nothing behind, and the next caller has the mode once the server answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_mode_detection_leaves_the_next_one_free() {
    use fairlock_redis::fred::interfaces::ClientLike;

    // Stopped before the backend starts detecting: the detection waits for the server.
    let (server, pool, subscriber, backend) =
        detecting_on_a_stopped_server(Duration::from_secs(30), "dropped:").await;
    let dropped = tokio::time::timeout(Duration::from_millis(200), backend.pubsub_mode()).await;
    assert!(
        dropped.is_err(),
        "the detection answered a stopped server: {dropped:?}"
    );
    server.0.resume_process().unwrap();
    let mode = tokio::time::timeout(Duration::from_secs(10), backend.pubsub_mode())
        .await
        .expect("a detection after a dropped one is not stuck behind it");
    assert_eq!(mode.unwrap(), PubsubMode::Sharded);
    let _ = subscriber.quit().await;
    let _ = pool.quit().await;
}
