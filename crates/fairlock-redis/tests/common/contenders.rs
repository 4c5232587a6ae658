//! Contenders that take one lock in turn until told to stop, recording every hold: the shared
//! load of the failover and slot-migration tests.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fairlock::{LockClient, LockGuard, LockName, LockOptions};
use fairlock_redis::RedisBackend;
use tokio::task::JoinHandle;

/// One hold as a contender saw it.
#[derive(Clone, Copy, Debug)]
pub struct Held {
    /// Which contender held it (in start order).
    pub contender: usize,
    pub token: u64,
    pub acquired: Instant,
    pub released: Instant,
    /// How the hold was found lost, if it was: the store no longer listed it when its holder
    /// was done (`is_held()`, asked again through an outage), the guard reported its lease
    /// lost, or `unlock()` found it lost. A failover that loses a grant shows here, even where
    /// the holds are too short for the next one to overlap it.
    pub lost: Option<&'static str>,
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
                let contender = tasks.len();
                let lock = client.fair_lock(name.as_str()).unwrap();
                let (stop, holds) = (stop.clone(), holds.clone());
                tasks.push(tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let guard = lock.lock().await?;
                        let acquired = Instant::now();
                        tokio::time::sleep(hold).await;
                        let token = guard.fencing_token();
                        // The hold's work ends here; what follows only asks whether it was kept.
                        let released = Instant::now();
                        let lost = if !held_through_outages(&guard).await? {
                            Some("is_held() said no")
                        } else if guard.is_lease_lost() {
                            Some("the guard reported its lease lost")
                        } else {
                            None
                        };
                        let lost = match guard.unlock().await {
                            Ok(()) => lost,
                            Err(fairlock::Error::LeaseLost { .. }) => {
                                lost.or(Some("unlock() found it lost"))
                            }
                            Err(error) => return Err(error),
                        };
                        holds.lock().unwrap().push(Held {
                            contender,
                            token,
                            acquired,
                            released,
                            lost,
                        });
                    }
                    Ok(())
                }));
            }
        }
        Contenders { stop, holds, tasks }
    }

    /// Stops the contenders, waits for each to finish its turn, asserts that none met an
    /// error (a hold found lost is recorded in [`Held::lost`] instead), and returns every hold in the order they were acquired.
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

/// The options of the failover tests: the lease outlasts even a slow failover (on a loaded
/// machine one has taken over 10 s), since a lease that ran out while the store was away
/// would rightly be reported lost.
pub fn failover_options() -> LockOptions {
    LockOptions::default()
        .with_watchdog_lease(Duration::from_secs(60))
        .with_waiter_ttl(Duration::from_secs(30))
}

/// `processes` backends on `url`, each standing for a process of its own, with
/// `replicas_acked(replicas, timeout)` when `acks` is given.
pub async fn backends(
    url: &str,
    processes: usize,
    acks: Option<(u32, Duration)>,
) -> Vec<RedisBackend> {
    let mut backends = Vec::new();
    for _ in 0..processes {
        let mut builder = RedisBackend::builder(url);
        if let Some((replicas, timeout)) = acks {
            builder = builder.replicas_acked(replicas, timeout);
        }
        backends.push(builder.connect().await.unwrap());
    }
    backends
}

/// `guard.is_held()`, asked again while the store is unavailable (for at most 30 s).
async fn held_through_outages(guard: &LockGuard) -> fairlock::Result<bool> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match guard.is_held().await {
            Err(fairlock::Error::Unavailable { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            answer => return answer,
        }
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

/// What a failover test saw of the store: when the (lock's) primary was killed, how long the
/// promotion took, and when the replicas acknowledgement needs were back.
pub struct Failover {
    pub killed_at: Instant,
    pub promoted: Duration,
    pub resumed: Instant,
    /// Whether grants were acknowledged by replicas: then no hold may be lost.
    pub acknowledged: bool,
    pub outage_budget: Duration,
}

/// Checks the holds of a run in which the store failed over, prints what it saw after
/// `label`, and returns how many pairs of holds overlapped:
/// - fencing tokens strictly increase in the order of acquisition;
/// - a hold may overlap the next one, or be lost, only if it was granted before the promotion
///   (by the old primary, whose unreplicated grants die with it; its last replies can reach
///   a contender after the kill), and with acknowledgement none may be lost at all;
/// - the kill did stall the lock (else the run proved nothing), for less than the outage
///   budget, and from 2 s after the store was whole again hand-overs are wake-ups.
pub fn check_failover(holds: &[Held], run: &Failover, label: &str) -> usize {
    let mut overlaps = 0;
    for pair in holds.windows(2) {
        assert!(
            pair[1].token > pair[0].token,
            "tokens went back across the failover: {pair:?}"
        );
        if pair[1].acquired < pair[0].released {
            overlaps += 1;
            assert!(
                pair[0].acquired < run.killed_at,
                "holds that both began after the failover overlap: {pair:?}"
            );
        }
    }
    let lost: Vec<(Duration, Held)> = holds
        .iter()
        .filter(|held| held.lost.is_some())
        .map(|held| {
            (
                held.acquired.saturating_duration_since(run.killed_at),
                *held,
            )
        })
        .collect();
    for (_, held) in &lost {
        assert!(
            held.acquired < run.killed_at,
            "a hold granted after the failover was lost: {held:?}"
        );
    }
    assert!(
        !run.acknowledged || lost.is_empty(),
        "acknowledged holds were lost (time after the kill, hold): {lost:?}"
    );
    let stall = longest_stall(holds);
    let after = gaps_from(holds, run.resumed + Duration::from_secs(2));
    let slowest_after = after.iter().max().copied().unwrap_or_default();
    println!(
        "{label}: promoted after {:?}, store whole again after {:?}; longest stall {stall:?}; \
         {} holds, {overlaps} overlapping, {} lost; {} hand-overs from 2 s after that, slowest \
         {slowest_after:?}",
        run.promoted,
        run.resumed - run.killed_at,
        holds.len(),
        lost.len(),
        after.len()
    );
    assert!(
        stall >= Duration::from_secs(1),
        "the lock never stalled: was its primary killed?"
    );
    assert!(
        stall < run.outage_budget,
        "the stall outlasted the outage budget"
    );
    assert!(
        after.len() >= 20,
        "too few hand-overs after the failover: {}",
        after.len()
    );
    assert!(
        slowest_after < Duration::from_millis(500),
        "hand-overs after the failover are not wake-ups: {slowest_after:?}"
    );
    overlaps
}
