//! The reference model of one lock against `MemoryBackend`, on paused Tokio time.
//!
//! `FAIRLOCK_MODEL_SCHEDULES=n cargo test -p fairlock --test model` runs `n` random seeds
//! instead of the fixed set; a failure prints its seed, which then joins `REGRESSIONS`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use fairlock::backend::{
    AcquireOutcome, AcquireRequest, AttemptId, LockBackend, LockState, LockSummary, ReleaseOutcome,
    Watch,
};
use fairlock::conformance::{check_against_model, seeds_from_env, ModelClock, ModelConfig};
use fairlock::{LockName, MemoryBackend, Owner, Result};

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

/// The contract lets `Queued.last_token` be any token between the lock's last one and its
/// next, so a store may hand out tokens from one counter shared by every lock (as
/// `MemoryBackend` does). With another lock granted before every acquire, its reports are
/// above the lock's own last token: the model must accept that, and still hold them to the
/// bounds.
#[tokio::test(start_paused = true)]
async fn a_token_counter_shared_by_every_lock_agrees_with_the_model() {
    let mut backend = Stalls::new(0, Duration::ZERO);
    backend.side_grants = true;
    let memory = backend.inner.clone();
    let seeds: Vec<u64> = (0..40).collect();
    check_against_model(Arc::new(backend), config(), &seeds).await;
    assert_eq!(memory.lock_count(), 0, "schedules left locks behind");
}

/// The bounds still hold: a store whose `Queued` replies report a `last_token` below the
/// lock's last grant (a counter that restarted) fails the check.
#[tokio::test(start_paused = true)]
#[should_panic(expected = "Queued reported last token 0 after grant")]
async fn a_last_token_below_the_last_grant_fails_the_check() {
    let mut backend = Stalls::new(0, Duration::ZERO);
    backend.zero_last_token = true;
    let seeds: Vec<u64> = (0..40).collect();
    check_against_model(Arc::new(backend), config(), &seeds).await;
}

/// `MemoryBackend`, except that the third acquire of each of the first `schedules` schedules
/// (each on its own lock name) stalls for two units: what a loaded machine does to a
/// real-clock run now and then. With `side_grants`, another lock is granted and released
/// before every acquire (tokens come from one counter for all locks); with
/// `zero_last_token`, every `Queued` reports `last_token` 0.
#[derive(Debug)]
struct Stalls {
    inner: MemoryBackend,
    /// Acquires seen per lock name, in the order the names came.
    seen: Mutex<Vec<(LockName, u32)>>,
    schedules: usize,
    stall: Duration,
    side_grants: bool,
    zero_last_token: bool,
}

impl Stalls {
    fn new(schedules: usize, stall: Duration) -> Stalls {
        Stalls {
            inner: MemoryBackend::new(),
            seen: Mutex::new(Vec::new()),
            schedules,
            stall,
            side_grants: false,
            zero_last_token: false,
        }
    }

    async fn maybe_stall(&self, name: &LockName) {
        let stall = {
            let mut seen = self.seen.lock().unwrap();
            let index = match seen.iter().position(|(seen, _)| seen == name) {
                Some(index) => index,
                None => {
                    seen.push((name.clone(), 0));
                    seen.len() - 1
                }
            };
            seen[index].1 += 1;
            index < self.schedules && seen[index].1 == 3
        };
        if stall {
            tokio::time::sleep(self.stall).await;
        }
    }
}

#[async_trait]
impl LockBackend for Stalls {
    async fn acquire(&self, request: &AcquireRequest) -> Result<AcquireOutcome> {
        self.maybe_stall(&request.name).await;
        if self.side_grants {
            let side = AcquireRequest {
                name: LockName::new("model-side-lock").unwrap(),
                owner: Owner::unique(),
                attempt: AttemptId::random(),
                queue: false,
                ..request.clone()
            };
            if let AcquireOutcome::Granted(grant) = self.inner.acquire(&side).await? {
                self.inner
                    .release(&side.name, &side.owner, grant.token, side.attempt)
                    .await?;
            }
        }
        match self.inner.acquire(request).await? {
            AcquireOutcome::Queued { retry_after, .. } if self.zero_last_token => {
                Ok(AcquireOutcome::Queued {
                    retry_after,
                    last_token: 0,
                })
            }
            outcome => Ok(outcome),
        }
    }

    async fn release(
        &self,
        name: &LockName,
        owner: &Owner,
        token: u64,
        attempt: AttemptId,
    ) -> Result<ReleaseOutcome> {
        self.inner.release(name, owner, token, attempt).await
    }

    async fn extend(
        &self,
        name: &LockName,
        owner: &Owner,
        token: u64,
        lease: Duration,
    ) -> Result<bool> {
        self.inner.extend(name, owner, token, lease).await
    }

    async fn abandon(&self, name: &LockName, owner: &Owner, attempt: AttemptId) -> Result<()> {
        self.inner.abandon(name, owner, attempt).await
    }

    async fn force_release(&self, name: &LockName, token: u64) -> Result<bool> {
        self.inner.force_release(name, token).await
    }

    async fn inspect(&self, name: &LockName) -> Result<LockState> {
        self.inner.inspect(name).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockSummary>> {
        self.inner.list(prefix).await
    }

    async fn watch(&self, name: &LockName, owner: &Owner) -> Result<Watch> {
        self.inner.watch(name, owner).await
    }
}

const UNIT: Duration = Duration::from_millis(100);

fn real_clock() -> ModelConfig {
    ModelConfig::new(ModelClock::Real { unit: UNIT }, 30, 3)
}

/// A real-clock schedule the machine stalled under proves nothing: it is run again on a fresh
/// lock name and the seed passes, rather than failing the check (as it did before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_real_clock_schedule_is_run_again() {
    let backend = Arc::new(Stalls::new(1, UNIT * 2));
    check_against_model(backend.clone(), real_clock(), &[7]).await;
    assert_eq!(backend.seen.lock().unwrap().len(), 2, "run exactly twice");
}

/// A machine that stalls every attempt still fails the check, naming the stall.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "the machine stalled under seed 7")]
async fn a_machine_that_always_stalls_fails_the_check() {
    let backend = Arc::new(Stalls::new(usize::MAX, UNIT * 2));
    check_against_model(backend, real_clock(), &[7]).await;
}
