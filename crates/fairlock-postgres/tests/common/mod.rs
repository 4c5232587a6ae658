//! Shared helpers of the PostgreSQL tests: a throwaway cluster from `fairlock-testsupport`,
//! random names.

#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use fairlock::backend::{AcquireRequest, AttemptId};
use fairlock::{LockName, Owner};
use fairlock_postgres::PostgresBackend;
use fairlock_testsupport::PostgresServer;

/// A private PostgreSQL cluster on a free loopback port, stopped when dropped.
pub struct Server(pub PostgresServer);

impl Server {
    pub fn start() -> Server {
        Server(PostgresServer::start().expect("postgres starts"))
    }

    pub fn url(&self) -> String {
        self.0.url()
    }

    /// Runs SQL with `psql` as the superuser; its output, trimmed.
    pub fn psql(&self, sql: &str) -> String {
        self.0.psql(sql).expect("psql runs")
    }

    pub async fn backend(&self) -> PostgresBackend {
        PostgresBackend::builder(self.url())
            .pool_size(4)
            .connect()
            .await
            .expect("connects")
    }
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
