//! Shared helpers of the Redis tests: servers from `fairlock-testsupport`, random names.

#![allow(dead_code, unreachable_pub)]

pub mod contenders;

use std::time::Duration;

use fairlock::backend::{AcquireOutcome, AcquireRequest, AttemptId, Grant, LockBackend};
use fairlock::{LockName, Owner};
use fairlock_redis::RedisBackend;
use fairlock_testsupport::{RedisCluster, RedisServer};

/// A private `redis-server` on a free loopback port, stopped when dropped.
pub struct Server(pub RedisServer);

impl Server {
    pub fn start() -> Server {
        Server(RedisServer::start().expect("redis-server starts"))
    }

    pub fn url(&self) -> String {
        self.0.url()
    }

    /// Runs one command with `redis-cli`; its output, trimmed.
    pub fn cli(&self, args: &[&str]) -> String {
        self.0.cli(args).expect("redis-cli runs")
    }

    pub async fn backend(&self) -> RedisBackend {
        RedisBackend::connect(&self.url()).await.expect("connects")
    }

    /// Times the server ran `command` (lower case, as `INFO commandstats` names it), calls
    /// from scripts included.
    pub fn command_calls(&self, command: &str) -> u64 {
        let prefix = format!("cmdstat_{command}:calls=");
        self.cli(&["INFO", "commandstats"])
            .lines()
            .find_map(|line| line.strip_prefix(prefix.as_str()))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |calls| calls.parse().unwrap())
    }
}

/// A private 3-master Redis Cluster, stopped when dropped.
pub fn cluster() -> RedisCluster {
    RedisCluster::start(3).expect("the cluster starts")
}

/// A fresh random lock name, so tests never share state.
pub fn name() -> LockName {
    LockName::new(format!("test-{}", uuid::Uuid::new_v4().simple())).unwrap()
}

pub fn owner(id: &str) -> Owner {
    Owner::new(id).unwrap()
}

/// The first step of a fresh attempt of `owner`; send the same request again to continue the
/// attempt (heartbeat, confirm a hand-over) or to re-send it.
pub fn request(name: &LockName, owner: &Owner, queue: bool) -> AcquireRequest {
    AcquireRequest {
        name: name.clone(),
        owner: owner.clone(),
        attempt: AttemptId::random(),
        lease: Duration::from_secs(30),
        waiter_ttl: Duration::from_secs(10),
        queue,
    }
}

/// Acquires with `request`, which must be granted.
pub async fn granted(backend: &RedisBackend, request: &AcquireRequest) -> Grant {
    match backend.acquire(request).await.unwrap() {
        AcquireOutcome::Granted(grant) => grant,
        other => panic!("{} expected a grant, got {other:?}", request.owner),
    }
}

/// A backend on clients built elsewhere does not close them when dropped, so it must take its
/// own subscriptions off the subscriber, and end its tasks. Before, a channel lingering when
/// the backend was dropped stayed subscribed for as long as the user's subscriber lived (the
/// linger's unsubscribe found the backend gone), and the backend's tasks waited for the next
/// message or reconnection of that subscriber. `listing` is the `PUBSUB` subcommand that
/// lists the server's channels of the backend's pub/sub mode (`SHARDCHANNELS` or `CHANNELS`).
pub async fn dropped_backend_leaves_no_subscription_or_task(server: &Server, listing: &str) {
    use fairlock_redis::fred::interfaces::{ClientLike, PubsubInterface};
    let (pool, subscriber) = clients_of_our_own(server).await;
    // A channel of the user's own on the same subscriber, which must stay.
    subscriber.subscribe("theirs").await.unwrap();
    let alive = || {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    };
    let before = alive();
    let backend = RedisBackend::from_clients(pool.clone(), subscriber.clone(), "left:").unwrap();
    let (lock, a) = (name(), owner("a"));
    let pattern = format!("left:{{{}}}:c*", lock.as_str());
    let ours = || server.cli(&["PUBSUB", listing, &pattern]).lines().count();
    // Held and released with a watch, as `lock()` does: the channels linger after it.
    let holding = request(&lock, &a, true);
    let watch = backend.watch(&lock, &a).await.unwrap();
    let grant = granted(&backend, &holding).await;
    backend
        .release(&holding.name, &holding.owner, grant.token, holding.attempt)
        .await
        .unwrap();
    drop(watch);
    assert_eq!(ours(), 2, "the lock's channel and the backend's own");
    drop(backend);
    let started = std::time::Instant::now();
    while ours() > 0 || alive() > before {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "5 s after the drop: {} channels, {} more tasks than before the backend",
            ours(),
            alive().saturating_sub(before)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        server.cli(&["PUBSUB", "CHANNELS", "theirs"]).trim(),
        "theirs",
        "the user's own subscription went too"
    );
    assert!(subscriber.is_connected());
}

/// A pool of 2 and a subscriber connected to `server`, built as a user of
/// `RedisBackend::from_clients` would (reconnecting every 100 ms).
pub async fn clients_of_our_own(
    server: &Server,
) -> (
    fairlock_redis::fred::clients::Pool,
    fairlock_redis::fred::clients::SubscriberClient,
) {
    use fairlock_redis::fred::interfaces::ClientLike;
    use fairlock_redis::fred::types::config::{Config, ReconnectPolicy};
    use fairlock_redis::fred::types::Builder;
    let mut builder = Builder::from_config(Config::from_url(&server.url()).unwrap());
    builder.set_policy(ReconnectPolicy::new_constant(0, 100));
    let pool = builder.build_pool(2).unwrap();
    let subscriber = builder.build_subscriber_client().unwrap();
    pool.init().await.unwrap();
    subscriber.init().await.unwrap();
    (pool, subscriber)
}
