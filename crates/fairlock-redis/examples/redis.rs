//! Fair locking on a real Redis: two processes' worth of workers queue for one lock, take it
//! in the order they asked, and pass their fencing tokens on; then a lost lease is noticed.
//!
//! It needs a Redis 6.2+ (or Valkey) server. To start a throwaway one on the default port,
//! with nothing written to disk:
//!
//! ```sh
//! redis-server --port 6379 --save '' --appendonly no      # or: docker run --rm -p 6379:6379 redis:7
//! cargo run -p fairlock-redis --example redis
//! ```
//!
//! `REDIS_URL` names another server (`redis://user:pass@host:port/db`, `redis-cluster://...`).
//! Keys go under the prefix `fairlock-example:`, and are all gone a few minutes after the run.

use std::time::Duration;

use fairlock::{Error, LockClient, LockOptions};
use fairlock_redis::RedisBackend;
use tokio::time::{sleep, Instant};

#[tokio::main]
async fn main() -> fairlock::Result<()> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let backend = RedisBackend::builder(&url)
        .prefix("fairlock-example:")
        .connect()
        .await
        .inspect_err(|err| eprintln!("is a Redis server running? {err}"))?;
    let client = LockClient::new(backend);

    // Four workers, each its own owner, queue one after the other while the first holds the
    // lock; they get it in exactly that order, each with a larger fencing token.
    let started = Instant::now();
    let mut workers = Vec::new();
    for id in 1..=4 {
        let lock = client.fair_lock("report")?;
        workers.push(tokio::spawn(async move {
            lock.run(|lease| async move {
                println!(
                    "{:>5} ms  worker {id} holds the lock, fencing token {}",
                    started.elapsed().as_millis(),
                    lease.fencing_token()
                );
                sleep(Duration::from_millis(100)).await;
            })
            .await
        }));
        // Let this one reach the queue before the next asks.
        sleep(Duration::from_millis(20)).await;
    }
    for worker in workers {
        worker.await.expect("worker task")?;
    }

    // `try_lock` never waits and never barges: with a holder, it is refused at once.
    let holder = client.fair_lock("report")?.lock().await?;
    match client.fair_lock("report")?.try_lock().await {
        Err(Error::WouldBlock { .. }) => println!("try_lock while held: refused, not queued"),
        other => panic!("expected WouldBlock, got {other:?}"),
    }
    holder.unlock().await?;

    // A fixed 500 ms lease that the work outlives: the guard says so when the store drops it.
    let lock = client
        .fair_lock("report")?
        .with_options(LockOptions::default().with_lease(Duration::from_millis(500)))?;
    let guard = lock.lock().await?;
    tokio::select! {
        () = guard.lease_lost() => {
            println!("lease lost after ~500 ms: stop writing with token {}", guard.fencing_token());
        }
        () = sleep(Duration::from_secs(5)) => panic!("the lease outlived its 500 ms"),
    }
    match guard.unlock().await {
        Err(Error::LeaseLost { .. }) => println!("unlock after the loss reports LeaseLost"),
        other => panic!("expected LeaseLost, got {other:?}"),
    }
    Ok(())
}
