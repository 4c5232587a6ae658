//! The reference model of one lock against a real PostgreSQL, on the server's clock.
//!
//! Each schedule's time unit is 400 ms: every lease and TTL lasts a whole number of units and
//! a half, and the steps between two advances must fit in half a unit, so no deadline is near
//! a check. Twice the Redis test's unit: a call here is one PL/pgSQL function of several
//! statements (about 0.5 ms, against 0.1 to 0.2 ms for a Lua script), and with 200 ms the
//! dozens of steps (each followed by the model's comparison reads) between two advances
//! overran the 100 ms half unit in 3 of 20 runs while 16 contender processes of the fault
//! suite loaded both cores. `FAIRLOCK_MODEL_SCHEDULES=n` runs `n` random seeds, `FAIRLOCK_MODEL_SEED=s` one.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::Server;
use fairlock::conformance::{check_against_model, seeds_from_env, ModelClock, ModelConfig};

/// Seeds that once failed, kept so that they never fail again.
const REGRESSIONS: &[u64] = &[];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_agrees_with_the_model() {
    let server = Server::start();
    let backend = Arc::new(server.backend().await);
    let clock = ModelClock::Real {
        unit: Duration::from_millis(400),
    };
    let config = ModelConfig::new(clock, 150, 3);
    let fixed: Vec<u64> = (0..8).chain(REGRESSIONS.iter().copied()).collect();
    check_against_model(backend, config, &seeds_from_env(&fixed)).await;
}

/// The conformance check that waits out the resend horizon (60 s): it mostly sleeps, so it runs
/// here, beside the model's schedules, which are all shorter than the horizon.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_hand_over_stays_spent_for_the_horizon() {
    let server = Server::start();
    let backend = Arc::new(server.backend().await);
    fairlock::conformance::lapsed_hand_over_stays_spent(backend).await;
}
