//! Section 6, many locks: acquire+release throughput of 1 to 256 tasks on distinct locks
//! through one backend instance, next to a trivial `EVALSHA` loop at the same concurrency on
//! a raw fred pool of the same size.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fairlock::{BoxError, LockClient};
use fred::prelude::{ClientLike, LuaInterface};
use tokio::sync::Barrier;

use crate::bench::Bench;
use crate::report::{Figure, Section};

pub(crate) async fn run(bench: &Bench) -> Result<Section, BoxError> {
    let duration = bench.scale(Duration::from_millis(1500), Duration::from_millis(400));
    let pool_size = bench.config.pool_size;
    let client = LockClient::from_arc(bench.backend().await?);
    let pool = bench.fred_pool(pool_size).await?;
    let sha: String = pool.next().script_load("return 1").await?;
    let mut section = Section::new("many-locks", "Distinct locks, one backend");
    for tasks in [1usize, 16, 64, 256] {
        let before = bench.script_stats().await?;
        let pairs = lock_pairs_per_s(bench, &client, tasks, duration, Acquire::Lock).await?;
        let between = bench.script_stats().await?;
        let scripts = evalsha_per_s(&pool, &sha, tasks, duration).await?;
        let after = bench.script_stats().await?;
        if tasks == 64 {
            let per_call = |from: (u64, u64), to: (u64, u64)| {
                (to.1 - from.1) as f64 / (to.0 - from.0).max(1) as f64
            };
            section.push(Figure::new(
                "64 tasks: server time per lock script call",
                per_call(before, between),
                "µs",
            ));
            section.push(Figure::new(
                "64 tasks: server time per trivial EVALSHA",
                per_call(between, after),
                "µs",
            ));
            section.push(Figure::new(
                "64 tasks: lock script calls per pair",
                (between.0 - before.0) as f64 / (pairs * duration.as_secs_f64()).max(1.0),
                "",
            ));
        }
        let share = pairs / scripts;
        section.push(Figure::new(
            format!("{tasks} tasks: acquire+release pairs/s"),
            pairs,
            "/s",
        ));
        section.push(Figure::new(
            format!("{tasks} tasks: trivial EVALSHA/s"),
            scripts,
            "/s",
        ));
        let figure = Figure::new(format!("{tasks} tasks: pairs/s / EVALSHA/s"), share, "x");
        section.push(if tasks == 64 {
            figure.target(">= 0.5x", share >= 0.5)
        } else {
            figure
        });
        if tasks == 64 {
            let try_pairs =
                lock_pairs_per_s(bench, &client, tasks, duration, Acquire::TryLock).await?;
            section.push(Figure::new(
                "64 tasks: `try_lock()`+release pairs/s (no wake-up subscription)",
                try_pairs,
                "/s",
            ));
        }
    }
    section.note(format!(
        "each task loops `lock()`+`unlock()` on its own lock for {:.1} s; one backend with a pool \
         of {pool_size} connections (`--pool-size`), and a raw fred pool of {pool_size} for the \
         EVALSHA loop. A pair is at least 2 script calls, so 0.5x is the ideal",
        duration.as_secs_f64()
    ));
    let _ = pool.quit().await;
    Ok(section)
}

/// How each pair acquires.
#[derive(Clone, Copy, Debug)]
enum Acquire {
    /// `lock()`: registers for wake-ups, then acquires.
    Lock,
    /// `try_lock()`: one acquire call, never waits.
    TryLock,
}

async fn lock_pairs_per_s(
    bench: &Bench,
    client: &LockClient,
    tasks: usize,
    duration: Duration,
    how: Acquire,
) -> Result<f64, BoxError> {
    let barrier = Arc::new(Barrier::new(tasks));
    let mut handles = Vec::with_capacity(tasks);
    for task in 0..tasks {
        let lock = client.fair_lock(&bench.lock_name(&format!("many-{how:?}-{tasks}-{task}")))?;
        let barrier = barrier.clone();
        handles.push(tokio::spawn(async move {
            lock.lock().await?.unlock().await?;
            barrier.wait().await;
            let deadline = Instant::now() + duration;
            let mut pairs = 0u64;
            while Instant::now() < deadline {
                let guard = match how {
                    Acquire::Lock => lock.lock().await?,
                    Acquire::TryLock => lock.try_lock().await?,
                };
                guard.unlock().await?;
                pairs += 1;
            }
            Ok::<_, BoxError>(pairs)
        }));
    }
    let mut total = 0;
    for handle in handles {
        total += handle.await??;
    }
    Ok(total as f64 / duration.as_secs_f64())
}

async fn evalsha_per_s(
    pool: &fred::prelude::Pool,
    sha: &str,
    tasks: usize,
    duration: Duration,
) -> Result<f64, BoxError> {
    let barrier = Arc::new(Barrier::new(tasks));
    let mut handles = Vec::with_capacity(tasks);
    for _ in 0..tasks {
        let pool = pool.clone();
        let sha = sha.to_string();
        let barrier = barrier.clone();
        handles.push(tokio::spawn(async move {
            barrier.wait().await;
            let deadline = Instant::now() + duration;
            let mut calls = 0u64;
            while Instant::now() < deadline {
                let _: i64 = pool
                    .evalsha(sha.as_str(), Vec::<String>::new(), Vec::<String>::new())
                    .await?;
                calls += 1;
            }
            Ok::<_, BoxError>(calls)
        }));
    }
    let mut total = 0;
    for handle in handles {
        total += handle.await??;
    }
    Ok(total as f64 / duration.as_secs_f64())
}
