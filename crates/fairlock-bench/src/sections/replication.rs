//! Section 9, replication: what waiting for a replica's acknowledgement costs
//! (`RedisBackendBuilder::replicas_acked`). A primary with one replica of its own (started
//! here, on loopback), measured with and without `replicas_acked(1, …)`.

use std::time::{Duration, Instant};

use fairlock::{BoxError, LockClient};
use fairlock_redis::RedisBackend;
use fairlock_testsupport::RedisServer;

use crate::bench::Bench;
use crate::report::{Figure, Section};
use crate::stats::Samples;

pub(crate) async fn run(bench: &Bench) -> Result<Section, BoxError> {
    let primary = RedisServer::start()?;
    let port = primary.port().to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port])?;
    wait_for_replica(&primary)?;
    let rounds = bench.scale(2_000, 200);
    let handovers = bench.scale(400, 60);

    let mut section = Section::new("replication", "Replica acknowledgement (WAIT)");
    let mut medians = Vec::new();
    for acked in [0u32, 1] {
        let mut builder = RedisBackend::builder(primary.url()).pool_size(bench.config.pool_size);
        if acked > 0 {
            builder = builder.replicas_acked(acked, Duration::from_secs(1));
        }
        let client = LockClient::new(builder.connect().await?);
        let (acquire, gap) = measure(bench, &client, acked, rounds, handovers).await?;
        section.push(Figure::micros(
            format!("`lock()` acquire p50, replicas_acked = {acked}"),
            acquire.median(),
        ));
        section.push(Figure::micros(
            format!("hand-over gap p50, replicas_acked = {acked}"),
            gap.median(),
        ));
        section.push(Figure::micros(
            format!("hand-over gap p99, replicas_acked = {acked}"),
            gap.percentile(99.0),
        ));
        medians.push((acquire.median(), gap.median()));
    }
    drop(replica);
    section.note(format!(
        "a primary and one replica on loopback; {rounds} uncontended `lock()`+`unlock()` pairs, \
         and {handovers} hand-overs between two tasks of one process (each holds, then \
         releases to the other, which waits in `lock()`), with `replicas_acked(1, 1 s)` and \
         without. Acknowledgement adds a WAIT round trip to each grant and renewal (acquire \
         {:.0} → {:.0} µs) and the grantee confirms a hand-over by a call instead of trusting \
         the wake-up (gap {:.0} → {:.0} µs)",
        medians[0].0.as_secs_f64() * 1e6,
        medians[1].0.as_secs_f64() * 1e6,
        medians[0].1.as_secs_f64() * 1e6,
        medians[1].1.as_secs_f64() * 1e6,
    ));
    Ok(section)
}

/// Waits until the primary reports its replica online.
fn wait_for_replica(primary: &RedisServer) -> Result<(), BoxError> {
    let started = Instant::now();
    while !primary
        .cli(&["INFO", "replication"])?
        .lines()
        .any(|line| line.starts_with("slave0") && line.contains("state=online"))
    {
        if started.elapsed() > Duration::from_secs(20) {
            return Err("the replica did not come online within 20 s".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

async fn measure(
    bench: &Bench,
    client: &LockClient,
    acked: u32,
    rounds: usize,
    handovers: usize,
) -> Result<(Samples, Samples), BoxError> {
    let lock = client.fair_lock(&bench.lock_name(&format!("replication-{acked}")))?;
    for _ in 0..50 {
        lock.lock().await?.unlock().await?;
    }
    let mut acquire = Samples::with_capacity(rounds);
    for _ in 0..rounds {
        let asked = Instant::now();
        let guard = lock.lock().await?;
        acquire.push(asked.elapsed());
        guard.unlock().await?;
    }

    // Two tasks pass the lock back and forth: the gap runs from one's release call to the
    // other's acquisition.
    let name = bench.lock_name(&format!("replication-handover-{acked}"));
    let (released_tx, mut released_rx) = tokio::sync::mpsc::unbounded_channel::<Instant>();
    let mut gap = Samples::with_capacity(handovers);
    let mut tasks = Vec::new();
    let (acquired_tx, mut acquired_rx) = tokio::sync::mpsc::unbounded_channel::<Instant>();
    for _ in 0..2 {
        let lock = client.fair_lock(&name)?;
        let (released_tx, acquired_tx) = (released_tx.clone(), acquired_tx.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..handovers / 2 {
                let guard = lock.lock().await?;
                let _ = acquired_tx.send(Instant::now());
                tokio::time::sleep(Duration::from_millis(2)).await;
                let _ = released_tx.send(Instant::now());
                guard.unlock().await?;
            }
            Ok::<_, fairlock::Error>(())
        }));
    }
    drop((released_tx, acquired_tx));
    for task in tasks {
        task.await??;
    }
    let acquisitions: Vec<Instant> = std::iter::from_fn(|| acquired_rx.try_recv().ok()).collect();
    let releases: Vec<Instant> = std::iter::from_fn(|| released_rx.try_recv().ok()).collect();
    for (released, acquired) in releases.iter().zip(acquisitions.iter().skip(1)) {
        gap.push(acquired.saturating_duration_since(*released));
    }
    Ok((acquire, gap))
}
