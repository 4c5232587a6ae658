//! Contenders that take one lock in turn until told to stop, recording every hold: the shared
//! load of the failover and slot-migration tests.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fairlock::{LockClient, LockName, LockOptions};
use fairlock_redis::RedisBackend;
use tokio::task::JoinHandle;

/// One hold as a contender saw it.
#[derive(Clone, Copy, Debug)]
pub struct Held {
    pub token: u64,
    pub acquired: Instant,
    pub released: Instant,
    /// Whether the guard reported its lease lost before it was released, or `unlock()` found
    /// it lost (the store no longer had the hold, e.g. after a failover lost it).
    pub lease_lost: bool,
}

/// Contenders running in the background; [`finish`](Self::finish) stops them.
pub struct Contenders {
    stop: Arc<AtomicBool>,
    holds: Arc<Mutex<Vec<Held>>>,
    tasks: Vec<JoinHandle<fairlock::Result<()>>>,
}

impl Contenders {
    /// Starts `per_backend` contenders on each backend (one backend stands for one process:
    /// its own pool and subscriber), each looping `lock()`, a hold of `hold`, `unlock()`.
    pub fn start(
        backends: Vec<RedisBackend>,
        per_backend: usize,
        name: &LockName,
        options: &LockOptions,
        hold: Duration,
    ) -> Contenders {
        let stop = Arc::new(AtomicBool::new(false));
        let holds = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for backend in backends {
            let client = LockClient::new(backend)
                .with_options(options.clone())
                .unwrap();
            for _ in 0..per_backend {
                let lock = client.fair_lock(name.as_str()).unwrap();
                let (stop, holds) = (stop.clone(), holds.clone());
                tasks.push(tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let guard = lock.lock().await?;
                        let acquired = Instant::now();
                        tokio::time::sleep(hold).await;
                        let token = guard.fencing_token();
                        let lost_before = guard.is_lease_lost();
                        let released = Instant::now();
                        let lease_lost = match guard.unlock().await {
                            Ok(()) => lost_before,
                            Err(fairlock::Error::LeaseLost { .. }) => true,
                            Err(error) => return Err(error),
                        };
                        holds.lock().unwrap().push(Held {
                            token,
                            acquired,
                            released,
                            lease_lost,
                        });
                    }
                    Ok(())
                }));
            }
        }
        Contenders { stop, holds, tasks }
    }

    /// Stops the contenders, waits for each to finish its turn, asserts that none met an
    /// error (a lease found lost is recorded in [`Held::lease_lost`] instead), and returns every hold in the order they were acquired.
    pub async fn finish(self) -> Vec<Held> {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.await
                .unwrap()
                .expect("no error reaches the contenders");
        }
        let mut holds = self.holds.lock().unwrap().clone();
        holds.sort_by_key(|held| held.acquired);
        holds
    }
}

/// The gaps between one release and the next acquisition, for hand-overs whose release came
/// at or after `from`.
pub fn gaps_from(holds: &[Held], from: Instant) -> Vec<Duration> {
    holds
        .windows(2)
        .filter(|pair| pair[0].released >= from)
        .map(|pair| pair[1].acquired.saturating_duration_since(pair[0].released))
        .collect()
}

/// The longest time the lock stood free between two holds.
pub fn longest_stall(holds: &[Held]) -> Duration {
    holds
        .windows(2)
        .map(|pair| pair[1].acquired.saturating_duration_since(pair[0].released))
        .max()
        .unwrap_or_default()
}

/// Checks the holds of a run in which the store failed over at `failed_at`: fencing tokens
/// strictly increase in the order of acquisition, and any two holds that overlap, or a lease
/// found lost, began before the failover (a grant the old primary had not replicated is lost
/// with it, so its holder learns that its lease is lost and the next holder may overlap it;
/// nothing granted after the failover may). Returns how many pairs overlapped.
pub fn overlaps_across_failover(holds: &[Held], failed_at: Instant) -> usize {
    for held in holds {
        assert!(
            !held.lease_lost || held.acquired < failed_at,
            "a hold granted after the failover lost its lease: {held:?}"
        );
    }
    let mut overlaps = 0;
    for pair in holds.windows(2) {
        assert!(
            pair[1].token > pair[0].token,
            "tokens went back across the failover: {pair:?}"
        );
        if pair[1].acquired < pair[0].released {
            overlaps += 1;
            assert!(
                pair[0].acquired < failed_at,
                "holds that both began after the failover overlap: {pair:?}"
            );
        }
    }
    overlaps
}
