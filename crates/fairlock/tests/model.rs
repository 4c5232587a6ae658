//! The reference model of one lock against `MemoryBackend`, on paused Tokio time.
//!
//! `FAIRLOCK_MODEL_SCHEDULES=n cargo test -p fairlock --test model` runs `n` random seeds
//! instead of the fixed set; a failure prints its seed, which then joins `REGRESSIONS`.

use std::sync::Arc;
use std::time::Duration;

use fairlock::conformance::{check_against_model, seeds_from_env, ModelClock, ModelConfig};
use fairlock::MemoryBackend;

/// Seeds that once failed, kept so that they never fail again.
const REGRESSIONS: &[u64] = &[2_957_970_756];

fn config() -> ModelConfig {
    let clock = ModelClock::Paused {
        unit: Duration::from_secs(1),
    };
    ModelConfig::new(clock, 300, 3)
}

#[tokio::test(start_paused = true)]
async fn memory_backend_agrees_with_the_model() {
    let fixed: Vec<u64> = (0..200).chain(REGRESSIONS.iter().copied()).collect();
    let seeds = seeds_from_env(&fixed);
    let memory = MemoryBackend::new();
    check_against_model(Arc::new(memory.clone()), config(), &seeds).await;
    assert_eq!(memory.lock_count(), 0, "schedules left locks behind");
}
