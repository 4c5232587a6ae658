//! Section 3, hand-over: 8 contenders on their own connections, each holding 1 ms; how long
//! the lock stays idle between one holder's release and the next holder's acquisition.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fairlock::BoxError;
use tokio::sync::Barrier;

use super::support::{self, ratio};
use crate::bench::Bench;
use crate::report::{Figure, Section};

const CONTENDERS: usize = 8;
const HOLD: Duration = Duration::from_millis(1);

pub(crate) async fn run(bench: &Bench) -> Result<Section, BoxError> {
    let per_contender = bench.scale(150, 25);
    let name = bench.lock_name("handoff");
    let locks = support::contenders(bench, &name, CONTENDERS).await?;
    // Warm every connection (and its wake-up subscription) before timing.
    for lock in &locks {
        lock.lock().await?.unlock().await?;
    }
    let barrier = Arc::new(Barrier::new(CONTENDERS));
    let mut tasks = Vec::new();
    for (who, lock) in locks.into_iter().enumerate() {
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let mut holds = Vec::with_capacity(per_contender);
            for _ in 0..per_contender {
                holds.push(support::hold_once(&lock, who, HOLD).await?);
            }
            Ok::<_, BoxError>(holds)
        }));
    }
    let started = Instant::now();
    let mut holds = Vec::new();
    for task in tasks {
        holds.extend(task.await??);
    }
    let elapsed = started.elapsed();
    support::by_acquisition(&mut holds);
    let gaps = support::handoff_gaps(&holds);
    let overlaps = support::overlaps(&holds);

    let p50 = gaps.median();
    let p99 = gaps.percentile(99.0);
    let p50_ratio = ratio(p50, bench.limit.evalsha);
    let mut section = Section::new("handoff", "8 contenders, 1 ms holds");
    section.push(Figure::micros("hand-over gap p50", p50));
    section.push(
        Figure::new("hand-over gap p50 / EVALSHA p50", p50_ratio, "x")
            .target("<= 3x", !gaps.is_empty() && p50_ratio <= 3.0),
    );
    section.push(Figure::micros("hand-over gap p99", p99).target(
        "<= 1000 µs",
        !gaps.is_empty() && p99 <= Duration::from_millis(1),
    ));
    section.push(Figure::micros("hand-over gap max", gaps.max()));
    section.push(Figure::new(
        "holds per second (1 ms hold each)",
        holds.len() as f64 / elapsed.as_secs_f64(),
        "/s",
    ));
    section.push(Figure::new("overlapping holds", overlaps as f64, "").target("0", overlaps == 0));
    section.note(format!(
        "{CONTENDERS} contenders x {per_contender} holds, each on its own backend instance, one \
         process and one monotonic clock; gap = t_acq(next) - t_rel_start(previous) over {} \
         hand-overs to a different contender that was already waiting. A hand-over costs the \
         release script's round trip plus the pub/sub wake-up's delivery",
        gaps.len()
    ));
    Ok(section)
}
