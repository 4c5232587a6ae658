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
