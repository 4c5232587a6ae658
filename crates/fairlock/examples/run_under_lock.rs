//! Running work under a lock with `FairLock::run`, on the in-memory backend: run with
//! `cargo run -p fairlock --example run_under_lock`.
//!
//! Three jobs share one lock: each runs under it in turn, passing its fencing token to the
//! store it writes to, which refuses tokens older than the newest it has seen. Then a job whose
//! lock is force-unlocked by an operator halfway is stopped at its next `.await` and told
//! `LeaseLost`: it never writes after losing the lock. Finally a job with a fixed lease that it
//! outruns is cut off when the lease ends.

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use fairlock::{Error, LockClient, MemoryBackend};
use tokio::time::{sleep, Instant};

/// A resource that accepts writes only with a fencing token at least as new as the last one.
#[derive(Default)]
struct Ledger {
    newest: AtomicU64,
}

impl Ledger {
    fn write(&self, token: u64, what: &str) -> Result<(), String> {
        let newest = self.newest.fetch_max(token, SeqCst);
        if token < newest {
            return Err(format!("refused {what:?}: token {token} < {newest}"));
        }
        println!("  ledger: {what} (token {token})");
        Ok(())
    }
}

#[tokio::main]
async fn main() -> fairlock::Result<()> {
    let client = LockClient::new(MemoryBackend::new());
    let ledger = Arc::new(Ledger::default());

    // Three jobs, each with its own handle (its own owner), take turns in the order they came.
    let mut jobs = Vec::new();
    for id in 1..=3 {
        let lock = client.fair_lock("ledger")?;
        let ledger = ledger.clone();
        jobs.push(tokio::spawn(async move {
            lock.run(|lease| async move {
                sleep(Duration::from_millis(20)).await;
                ledger.write(lease.fencing_token(), &format!("job {id}"))
            })
            .await
        }));
        sleep(Duration::from_millis(5)).await;
    }
    for job in jobs {
        job.await.expect("job task")?.expect("write accepted");
    }

    // A job whose lock an operator frees halfway: the watchdog's next renewal (every third of
    // the lease; 300 ms here) finds it gone, and `run` drops the job there.
    let lock = client.fair_lock("ledger")?.with_options(
        fairlock::LockOptions::default().with_watchdog_lease(Duration::from_millis(900)),
    )?;
    let operator = client.clone();
    let ledger_in_job = ledger.clone();
    let started = Instant::now();
    let outcome = lock
        .run(|lease| async move {
            operator.force_unlock("ledger").await.expect("force_unlock");
            println!("  job 4: the operator freed the lock; going on as if nothing happened");
            sleep(Duration::from_secs(5)).await;
            // Never reached: the job is dropped at the sleep above.
            ledger_in_job.write(lease.fencing_token(), "job 4")
        })
        .await;
    match outcome {
        Err(Error::LeaseLost { name }) => println!(
            "job 4 stopped after {} ms: lease on {name:?} lost, nothing written",
            started.elapsed().as_millis()
        ),
        other => println!("unexpected: {other:?}"),
    }

    // A fixed lease is a deadline too: the work is cut off when it ends.
    let lock = client
        .fair_lock("ledger")?
        .with_lease(Duration::from_millis(100))?;
    let outcome = lock
        .run(|_lease| async {
            sleep(Duration::from_secs(1)).await;
            "finished"
        })
        .await;
    println!(
        "job 5 with a 100 ms lease and 1 s of work: {}",
        match outcome {
            Err(Error::LeaseLost { .. }) => "cut off at the end of its lease".to_owned(),
            other => format!("unexpected: {other:?}"),
        }
    );

    let state = client.state("ledger").await?;
    println!("finally: held = {}", state.holder.is_some());
    Ok(())
}
