//! Cancellation: futures dropped while waiting, and at the very moment of the grant.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tokio::time::{sleep, timeout};

use super::support::{self, OrFail};
use crate::backend::LockBackend;

/// `lock()` and `try_lock_for()` futures dropped after random short times (0-30 ms, by
/// `tokio::time::timeout` and by aborting the task that polls them) while another owner holds
/// the lock never return a guard, and leave nothing behind: once the background cleanup is
/// done the queue is empty and the holder unchanged; after the holder unlocks, the lock is
/// free and a fresh `try_lock` succeeds. Then, on the free lock, `lock()` and `try_lock()`
/// futures dropped after one or two polls (often with their `acquire` still in flight)
/// leave it free within 2 s, although a grant kept by mistake would last its 5 s lease.
pub async fn cancelled_waits_leave_nothing(backend: Arc<dyn LockBackend>) {
    const CHECK: &str = "cancelled_waits_leave_nothing";
    const ROUNDS: usize = 24;
    let client = support::client(&backend);
    let name = support::lock_name(CHECK);
    let holder = client.fair_lock(&name).or_fail(CHECK);
    let held = holder.lock().await.or_fail(CHECK);

    for round in 0..ROUNDS {
        let delay = Duration::from_micros(rand::thread_rng().gen_range(0..30_000));
        let lock = client.fair_lock(&name).or_fail(CHECK);
        match round % 3 {
            0 => {
                let outcome = timeout(delay, lock.lock()).await;
                assert!(
                    outcome.is_err(),
                    "{CHECK}: lock() returned while another owner holds: {outcome:?}"
                );
            }
            1 => {
                let outcome = timeout(delay, lock.try_lock_for(Duration::from_secs(10))).await;
                assert!(
                    outcome.is_err(),
                    "{CHECK}: try_lock_for() returned while another owner holds: {outcome:?}"
                );
            }
            _ => {
                let task = tokio::spawn(async move { lock.lock().await.map(drop) });
                sleep(delay).await;
                task.abort();
                let outcome = task.await;
                assert!(
                    outcome.as_ref().is_err_and(|e| e.is_cancelled()),
                    "{CHECK}: a task in lock() finished while another owner holds: {outcome:?}"
                );
            }
        }
    }
    sleep(SETTLE).await;
    let owner = holder.owner().as_str();
    let token = held.fencing_token();
    support::state_where(
        &client,
        &name,
        support::EVENTUALLY,
        format!("{CHECK}: every cancelled waiter has left the queue"),
        |s| {
            s.waiters.is_empty()
                && s.holder
                    .as_ref()
                    .is_some_and(|h| h.owner == owner && h.token == token)
        },
    )
    .await;
    held.unlock()
        .await
        .or_fail(format!("{CHECK}: holder unlock"));
    support::wait_clean(&client, &name, format!("{CHECK}: nothing left behind")).await;
    let fresh = client.fair_lock(&name).or_fail(CHECK).try_lock().await;
    fresh
        .or_fail(format!("{CHECK}: try_lock after the cancelled waits"))
        .unlock()
        .await
        .or_fail(CHECK);

    // On a free lock, drop `lock()` and `try_lock()` after one or two polls: the `acquire`
    // call is often still in flight and grants after its caller left. That grant must be
    // given back, not kept until its 5 s lease ends.
    let client = support::client_with(&backend, long_lived());
    for round in 0..ROUNDS {
        let lock = client.fair_lock(&name).or_fail(CHECK);
        let polls = rand::thread_rng().gen_range(1..=2);
        if round % 2 == 0 {
            poll_then_drop(lock.lock(), polls).await;
        } else {
            poll_then_drop(lock.try_lock(), polls).await;
        }
        // Let a call still in flight land first, or the lock would look free before it.
        sleep(SETTLE).await;
        support::state_where(
            &client,
            &name,
            CLEANUP_BOUND,
            format!("{CHECK}: round {round}: a grant to a dropped future is given back"),
            |s| s.holder.is_none() && s.waiters.is_empty(),
        )
        .await;
    }
    sleep(SETTLE * 10).await;
    support::wait_clean(&client, &name, format!("{CHECK}: lock free at the end")).await;
}

/// Far longer than one round trip to the store: a call sent before it has landed after it.
const SETTLE: Duration = Duration::from_millis(10);

/// Polls `future` up to `polls` times, yielding in between, then drops it.
async fn poll_then_drop<F: Future>(future: F, polls: usize) {
    let mut future = pin!(future);
    for poll in 1..=polls {
        if futures::poll!(future.as_mut()).is_ready() || poll == polls {
            return;
        }
        tokio::task::yield_now().await;
    }
}

/// Options under which a grant or queue place leaked to a gone caller would outlive
/// [`CLEANUP_BOUND`] by far, so that the checks see the leak.
fn long_lived() -> crate::LockOptions {
    crate::LockOptions {
        waiter_ttl: Duration::from_secs(5),
        watchdog_lease: Duration::from_secs(5),
        lease: None,
        outage_budget: Duration::from_secs(30),
    }
}

/// How long the background cleanup of a cancelled call may take.
const CLEANUP_BOUND: Duration = Duration::from_secs(2);

/// A waiter's future is dropped in the same instant as the holder releases (the release and
/// the abort of the waiting task started together, with 0-3 yields or a few dozen µs between
/// them, many times): whichever wins, afterwards nobody holds the lock and nobody waits, once
/// the background cleanup is done. A grant that reached a dropped future was given back, not
/// kept until its lease or liveness TTL ran out (the bound is well below the waiter TTL used
/// here), and a fresh `try_lock` succeeds.
pub async fn cancel_at_grant_time_leaves_nothing(backend: Arc<dyn LockBackend>) {
    const CHECK: &str = "cancel_at_grant_time_leaves_nothing";
    const ROUNDS: usize = 30;
    let client = support::client_with(&backend, long_lived());
    let name = support::lock_name(CHECK);

    for round in 0..ROUNDS {
        let held = client
            .fair_lock(&name)
            .or_fail(CHECK)
            .lock()
            .await
            .or_fail(CHECK);
        let waiter = client.fair_lock(&name).or_fail(CHECK);
        let waiter_owner = waiter.owner().clone();
        let task = tokio::spawn(async move { waiter.lock().await.map(drop) });
        support::wait_queued(
            &client,
            &name,
            &waiter_owner,
            format!("{CHECK}: round {round}"),
        )
        .await;

        let (yields, micros) = {
            let mut rng = rand::thread_rng();
            (rng.gen_range(0..4), rng.gen_range(0..60))
        };
        let unlock = tokio::spawn(held.unlock());
        if round % 2 == 0 {
            for _ in 0..yields {
                tokio::task::yield_now().await;
            }
        } else {
            sleep(Duration::from_micros(micros)).await;
        }
        task.abort();
        let unlocked = unlock
            .await
            .unwrap_or_else(|e| panic!("{CHECK}: unlock task: {e}"));
        unlocked.or_fail(format!("{CHECK}: round {round}: holder unlock"));
        // Either the waiter got the lock (its guard was dropped) or it was cancelled.
        let _ = task.await;
        support::state_where(
            &client,
            &name,
            CLEANUP_BOUND,
            format!("{CHECK}: round {round}: no holder and no waiter after the cancelled grant"),
            |s| s.holder.is_none() && s.waiters.is_empty(),
        )
        .await;
    }
    let fresh = client.fair_lock(&name).or_fail(CHECK).try_lock().await;
    fresh
        .or_fail(format!("{CHECK}: try_lock after the cancelled grants"))
        .unlock()
        .await
        .or_fail(CHECK);
    support::wait_clean(&client, &name, format!("{CHECK}: lock free at the end")).await;
}
