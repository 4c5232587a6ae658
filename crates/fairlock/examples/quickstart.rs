//! fairlock in one screen, on the embedded in-memory backend: run with
//! `cargo run --example quickstart`.
//!
//! Five workers queue for one lock and get it in the order they asked; the holder re-enters
//! it; a `try_lock` is refused because people are waiting; a bounded wait times out and leaves
//! the queue; and an operator's `force_unlock` hands the lock to the next in line.

use std::time::Duration;

use fairlock::{Error, LockClient, MemoryBackend};
use tokio::time::sleep;

#[tokio::main]
async fn main() -> fairlock::Result<()> {
    let client = LockClient::new(MemoryBackend::new());
    let name = "invoice-run";

    // The first holder takes the lock, then re-enters it (same handle = same owner).
    let first = client.fair_lock(name)?;
    let outer = first.lock().await?;
    let inner = first.lock().await?;
    println!(
        "holder   took the lock (token {}), re-entered it: hold count {}",
        outer.fencing_token(),
        inner.hold_count()
    );

    // Five workers queue up, 20 ms apart, each with its own handle (its own owner).
    let mut workers = Vec::new();
    for id in 1..=5 {
        let lock = client.fair_lock(name)?;
        workers.push(tokio::spawn(async move {
            let guard = lock.lock().await?;
            println!("worker {id} acquired (token {})", guard.fencing_token());
            sleep(Duration::from_millis(30)).await;
            guard.unlock().await
        }));
        sleep(Duration::from_millis(20)).await;
    }
    let waiting = client.state(name).await?.waiters.len();
    println!("holder   sees {waiting} workers waiting in line");

    // Nobody barges: try_lock is refused while workers wait.
    match client.fair_lock(name)?.try_lock().await {
        Err(Error::WouldBlock { .. }) => {
            println!("try_lock refused: the lock is held and has waiters")
        }
        other => println!("unexpected: {other:?}"),
    }

    // A bounded wait gives up and leaves the queue without holding anyone up.
    let impatient = client.fair_lock(name)?;
    match impatient.try_lock_for(Duration::from_millis(50)).await {
        Err(Error::Timeout { waited, .. }) => {
            println!("impatient gave up after {} ms", waited.as_millis())
        }
        other => println!("unexpected: {other:?}"),
    }

    // The holder releases one level and still holds the lock...
    inner.unlock().await?;
    let holder = client.state(name).await?.holder.expect("still held");
    println!(
        "holder   released one level, hold count now {}",
        holder.hold_count
    );

    // ...then hangs. An operator frees it; the first worker in line gets it.
    let was_held = client.force_unlock(name).await?;
    println!("operator force_unlock: was held = {was_held}");
    for worker in workers {
        worker.await.expect("worker task")?;
    }

    // The old holder's guard learns that its lease is gone at its next contact with the store
    // (the watchdog checks every third of the lease; here an explicit extend).
    if let Err(Error::LeaseLost { .. }) = outer.extend(Duration::from_secs(30)).await {
        println!(
            "holder   extend refused, lease-lost signal raised: {}",
            outer.is_lease_lost()
        );
    }
    match outer.unlock().await {
        Err(Error::LeaseLost { .. }) => println!("holder   unlock reports the lease was lost"),
        other => println!("unexpected: {other:?}"),
    }
    let state = client.state(name).await?;
    println!(
        "finally: held = {}, waiters = {}",
        state.holder.is_some(),
        state.waiters.len()
    );
    Ok(())
}
