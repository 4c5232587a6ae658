//! The reference model of one lock against a real `redis-server`, on the server's clock.
//!
//! Each schedule's time unit is 200 ms: every lease and TTL lasts a whole number of units and
//! a half, and the steps between two advances take a few milliseconds, so no deadline is near
//! a check. `FAIRLOCK_MODEL_SCHEDULES=n` runs `n` random seeds, `FAIRLOCK_MODEL_SEED=s` one.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::Server;
use fairlock::conformance::{check_against_model, seeds_from_env, ModelClock, ModelConfig};
use fairlock_redis::RedisBackend;

/// Seeds that once failed, kept so that they never fail again.
const REGRESSIONS: &[u64] = &[];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_agrees_with_the_model() {
    let server = Server::start();
    let backend = Arc::new(server.backend().await);
    let clock = ModelClock::Real {
        unit: Duration::from_millis(200),
    };
    let config = ModelConfig::new(clock, 150, 3);
    let fixed: Vec<u64> = (0..8).chain(REGRESSIONS.iter().copied()).collect();
    check_against_model(backend, config, &seeds_from_env(&fixed)).await;
}

/// The same with a fence margin of half a unit: the fence hash of a lock left idle expires
/// between two steps, unless it still keeps the record of a grant (the attempt stays spent for
/// the resend horizon, longer than any schedule), and tokens must keep growing without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_with_a_short_fence_margin_agrees_with_the_model() {
    let server = Server::start();
    let backend = RedisBackend::builder(server.url())
        .fence_margin(Duration::from_millis(100))
        .connect()
        .await
        .unwrap();
    let clock = ModelClock::Real {
        unit: Duration::from_millis(200),
    };
    let config = ModelConfig::new(clock, 150, 3);
    let fixed: Vec<u64> = (100..104).collect();
    check_against_model(Arc::new(backend), config, &seeds_from_env(&fixed)).await;
}

/// The conformance check that waits out the resend horizon (60 s): it mostly sleeps, so it runs
/// here, beside the model's schedules, which are all shorter than the horizon.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_hand_over_stays_spent_for_the_horizon() {
    let server = Server::start();
    let backend = Arc::new(server.backend().await);
    fairlock::conformance::lapsed_hand_over_stays_spent(backend).await;
}
