//! What several sections share: contenders on their own connections and the holds they record.

use std::time::{Duration, Instant};

use fairlock::{BoxError, FairLock, LockClient};

use crate::bench::Bench;
use crate::stats::Samples;

/// One acquisition, timed by the process's monotonic clock.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Hold {
    /// Which contender.
    pub(crate) who: usize,
    /// When it asked for the lock.
    pub(crate) t_req: Instant,
    /// When it had it.
    pub(crate) t_acq: Instant,
    /// When it started to release it.
    pub(crate) t_rel_start: Instant,
}

/// `count` handles on lock `name`, each on its own backend instance (its own connections),
/// with default settings: separate processes' worth of clients in one process and one clock.
pub(crate) async fn contenders(
    bench: &Bench,
    name: &str,
    count: usize,
) -> Result<Vec<FairLock>, BoxError> {
    let mut locks = Vec::with_capacity(count);
    for _ in 0..count {
        let client = LockClient::from_arc(bench.backend().await?);
        locks.push(client.fair_lock(name)?);
    }
    Ok(locks)
}

/// Acquires, holds for `hold`, releases; returns the timings.
pub(crate) async fn hold_once(
    lock: &FairLock,
    who: usize,
    hold: Duration,
) -> Result<Hold, BoxError> {
    let t_req = Instant::now();
    let guard = lock.lock().await?;
    let t_acq = Instant::now();
    if !hold.is_zero() {
        tokio::time::sleep(hold).await;
    }
    let t_rel_start = Instant::now();
    guard.unlock().await?;
    Ok(Hold {
        who,
        t_req,
        t_acq,
        t_rel_start,
    })
}

/// Holds sorted by acquisition time.
pub(crate) fn by_acquisition(holds: &mut [Hold]) {
    holds.sort_by_key(|hold| hold.t_acq);
}

/// How many holds began before the previous one ended (mutual exclusion violated). Expects
/// holds sorted by acquisition.
pub(crate) fn overlaps(holds: &[Hold]) -> usize {
    holds
        .windows(2)
        .filter(|pair| pair[1].t_acq < pair[0].t_rel_start)
        .count()
}

/// The hand-over gaps: for each hold taken by a *different* contender that was already waiting
/// when the previous holder started to release, `t_acq(next) - t_rel_start(previous)`.
/// Expects holds sorted by acquisition.
pub(crate) fn handoff_gaps(holds: &[Hold]) -> Samples {
    let mut gaps = Samples::with_capacity(holds.len());
    for pair in holds.windows(2) {
        let (previous, next) = (pair[0], pair[1]);
        if next.who != previous.who && next.t_req < previous.t_rel_start {
            gaps.push(next.t_acq.saturating_duration_since(previous.t_rel_start));
        }
    }
    gaps
}

/// `value / base`, for "x times the round trip".
pub(crate) fn ratio(value: Duration, base: Duration) -> f64 {
    if base.is_zero() {
        return f64::INFINITY;
    }
    value.as_secs_f64() / base.as_secs_f64()
}
