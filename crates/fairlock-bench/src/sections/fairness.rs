//! Section 4, fairness: strict FIFO when contenders arrive 10 ms apart, and equal shares
//! when they loop for seconds.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fairlock::{BoxError, LockClient};
use tokio::sync::Barrier;

use super::support::{self, Hold};
use crate::bench::Bench;
use crate::report::{Figure, Section};
use crate::stats::{inversions, jain_index, kendall_tau};

const CONTENDERS: usize = 8;
const ARRIVAL_GAP: Duration = Duration::from_millis(10);
const HOLD: Duration = Duration::from_millis(1);

pub(crate) async fn run(bench: &Bench) -> Result<Section, BoxError> {
    let mut section = Section::new("fairness", "FIFO order and equal shares");
    fifo(bench, &mut section).await?;
    sustained(bench, &mut section).await?;
    Ok(section)
}

/// A holder keeps the lock while 8 contenders ask for it 10 ms apart; then the order in which
/// they got it is compared with the order in which they asked.
async fn fifo(bench: &Bench, section: &mut Section) -> Result<(), BoxError> {
    let repetitions = bench.scale(6, 2);
    let mut per_repetition = Vec::with_capacity(repetitions);
    let mut worst_tau = 1.0f64;
    for repetition in 0..repetitions {
        let name = bench.lock_name(&format!("fifo-{repetition}"));
        let holder = LockClient::from_arc(bench.backend().await?).fair_lock(&name)?;
        let locks = support::contenders(bench, &name, CONTENDERS).await?;
        let guard = holder.lock().await?;
        let mut tasks = Vec::new();
        for (who, lock) in locks.into_iter().enumerate() {
            let arrival = tokio::time::Instant::now() + ARRIVAL_GAP * who as u32;
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep_until(arrival).await;
                support::hold_once(&lock, who, HOLD).await
            }));
        }
        tokio::time::sleep(ARRIVAL_GAP * CONTENDERS as u32 + Duration::from_millis(50)).await;
        guard.unlock().await?;
        let mut holds: Vec<Hold> = Vec::new();
        for task in tasks {
            holds.push(task.await??);
        }
        let mut by_request = holds.clone();
        by_request.sort_by_key(|hold| hold.t_req);
        support::by_acquisition(&mut holds);
        let order: Vec<usize> = holds
            .iter()
            .map(|hold| {
                by_request
                    .iter()
                    .position(|asked| asked.who == hold.who)
                    .unwrap_or(0)
            })
            .collect();
        per_repetition.push(inversions(&order));
        worst_tau = worst_tau.min(kendall_tau(&order));
    }
    let total: usize = per_repetition.iter().sum();
    let worst = per_repetition.iter().copied().max().unwrap_or(0);
    section.push(
        Figure::new(
            format!("FIFO inversions, worst of {repetitions} repetitions"),
            worst as f64,
            "",
        )
        .target("0 in every repetition", worst == 0),
    );
    section.push(Figure::new("FIFO inversions, total", total as f64, ""));
    section.push(Figure::new(
        "Kendall tau (request vs acquisition order), worst",
        worst_tau,
        "",
    ));
    section.note(format!(
        "FIFO: per repetition a holder keeps the lock while {CONTENDERS} contenders (own backend \
         each) call `lock()` {} ms apart, then releases; inversions per repetition: {per_repetition:?}",
        ARRIVAL_GAP.as_millis()
    ));
    Ok(())
}

/// 8 contenders loop (acquire, hold 1 ms, release) for a few seconds.
async fn sustained(bench: &Bench, section: &mut Section) -> Result<(), BoxError> {
    let duration = bench.scale(Duration::from_secs(3), Duration::from_secs(1));
    let name = bench.lock_name("sustained");
    let locks = support::contenders(bench, &name, CONTENDERS).await?;
    for lock in &locks {
        lock.lock().await?.unlock().await?;
    }
    let barrier = Arc::new(Barrier::new(CONTENDERS + 1));
    let mut tasks = Vec::new();
    for (who, lock) in locks.into_iter().enumerate() {
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let deadline = Instant::now() + duration;
            let mut holds = Vec::new();
            while Instant::now() < deadline {
                holds.push(support::hold_once(&lock, who, HOLD).await?);
            }
            Ok::<_, BoxError>(holds)
        }));
    }
    barrier.wait().await;
    let mut counts = Vec::with_capacity(CONTENDERS);
    let mut holds = Vec::new();
    for task in tasks {
        let mine = task.await??;
        counts.push(mine.len() as u64);
        holds.extend(mine);
    }
    support::by_acquisition(&mut holds);
    let jain = jain_index(&counts);
    let longest_wait = holds
        .iter()
        .map(|hold| hold.t_acq - hold.t_req)
        .max()
        .unwrap_or_default();
    let overlaps = support::overlaps(&holds);
    section.push(
        Figure::new(
            format!("Jain's index over {} s", duration.as_secs()),
            jain,
            "",
        )
        .target(">= 0.999", jain >= 0.999),
    );
    section.push(Figure::micros("longest single wait", longest_wait));
    section.push(Figure::new("overlapping holds", overlaps as f64, "").target("0", overlaps == 0));
    section.note(format!(
        "sustained: {CONTENDERS} contenders loop `lock()`, 1 ms hold, `unlock()` for {} s; \
         acquisitions per contender: {counts:?}. With FIFO every contender waits for the 7 \
         others, so the longest wait is about 7 hold+hand-over cycles",
        duration.as_secs()
    ));
    Ok(())
}
