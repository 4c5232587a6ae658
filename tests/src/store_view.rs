//! What the store says about a lock, read from the test process while contenders run.

use std::time::{Duration, Instant};

use fairlock::{LockClient, LockState};
use fairlock_postgres::PostgresBackend;
use fairlock_redis::RedisBackend;

/// How often a deadline loop asks the store again.
const POLL: Duration = Duration::from_millis(10);

/// Whether `url` names a PostgreSQL server (`postgres://` or `postgresql://`), not Redis.
pub fn is_postgres(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// A client for reading lock states (the test never locks through it), on Redis or, for a
/// `postgres://` URL, PostgreSQL.
///
/// # Panics
/// If the server cannot be reached.
pub async fn observer(url: &str) -> LockClient {
    if is_postgres(url) {
        let backend = PostgresBackend::connect(url)
            .await
            .unwrap_or_else(|e| panic!("observer cannot connect to {url}: {e}"));
        return LockClient::new(backend);
    }
    let backend = RedisBackend::connect(url)
        .await
        .unwrap_or_else(|e| panic!("observer cannot connect to {url}: {e}"));
    LockClient::new(backend)
}

/// Waits until the live waiters of `name` are exactly `owners`, in that order.
///
/// # Panics
/// If that is not so by `deadline` (with the last state seen), or on a store error.
pub async fn wait_for_waiters(
    client: &LockClient,
    name: &str,
    owners: &[&str],
    deadline: Instant,
) -> LockState {
    loop {
        let state = client.state(name).await.expect("inspect");
        let waiting: Vec<&str> = state.waiters.iter().map(|w| w.owner.as_str()).collect();
        if waiting == owners {
            return state;
        }
        assert!(
            Instant::now() < deadline,
            "waiters of {name} never became {owners:?}; last state: {state:?}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// The earliest moment the current hold of `name` can end by the store's lease: the moment
/// the question was sent plus the lease the store reported. The store read its clock after
/// the question was sent and the reported lease is rounded down, so the real expiry is no
/// earlier (a later renewal only moves it later). Also returns the state.
///
/// # Panics
/// If the lock is not held, or on a store error.
pub async fn lease_floor(client: &LockClient, name: &str) -> (Instant, LockState) {
    let sent = Instant::now();
    let state = client.state(name).await.expect("inspect");
    let holder = state
        .holder
        .as_ref()
        .unwrap_or_else(|| panic!("{name} is not held: {state:?}"));
    (sent + holder.lease_remaining, state)
}
