//! `FairLock::run` (and `try_run`, `try_run_for`): the work runs under the lock, is dropped
//! when the lease is lost, and the lock is released however the call ends. Plus the guard's
//! `lease_remaining`, `is_held` and `lease()`. All on paused time, so every instant is exact.

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use fairlock::{Error, LockClient, LockOptions, MemoryBackend};
use tokio::sync::oneshot;
use tokio::time::{sleep, timeout, Instant};

fn client(memory: &MemoryBackend) -> LockClient {
    LockClient::new(memory.clone())
        .with_options(
            LockOptions::default()
                .with_watchdog_lease(Duration::from_secs(3))
                .with_waiter_ttl(Duration::from_secs(1)),
        )
        .unwrap()
}

/// Polls until the lock is free with nobody waiting and nothing left in the store.
async fn until_clean(client: &LockClient, memory: &MemoryBackend, name: &str) {
    for _ in 0..500 {
        let state = client.state(name).await.unwrap();
        if state.holder.is_none() && state.waiters.is_empty() && memory.lock_count() == 0 {
            return;
        }
        sleep(Duration::from_millis(2)).await;
    }
    panic!("{name} still busy: {:?}", client.state(name).await.unwrap());
}

/// Sets its flag when dropped: tells whether the work future was dropped.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, SeqCst);
    }
}

#[tokio::test(start_paused = true)]
async fn completed_work_returns_its_value_and_releases() {
    let memory = MemoryBackend::new();
    let client = client(&memory);
    let lock = client.fair_lock("run").unwrap();
    let inspector = client.clone();
    let (token, held_inside) = lock
        .run(|lease| async move {
            sleep(Duration::from_secs(10)).await; // outlives three watchdog periods
            let holder = inspector.state("run").await.unwrap().holder.unwrap();
            (lease.fencing_token(), holder.token)
        })
        .await
        .unwrap();
    assert_eq!(
        token, held_inside,
        "the work ran while its hold was the store's"
    );
    // Released by the time `run` returns, not in the background.
    assert!(client.state("run").await.unwrap().holder.is_none());
    assert_eq!(memory.lock_count(), 0);
}

/// A force unlock through the work's own client is known to its guards at once; through
/// another (another process: the CLI, say), at the holder's next renewal.
#[tokio::test(start_paused = true)]
async fn a_force_unlock_drops_the_work_and_returns_lease_lost() {
    for same_client in [true, false] {
        force_unlock_drops_the_work(same_client).await;
    }
}

async fn force_unlock_drops_the_work(same_client: bool) {
    let memory = MemoryBackend::new();
    let client = client(&memory);
    let operator = if same_client {
        client.clone()
    } else {
        self::client(&memory)
    };
    let lock = client.fair_lock("forced").unwrap();
    let dropped = Arc::new(AtomicBool::new(false));
    let flag = DropFlag(dropped.clone());
    let (started_tx, started_rx) = oneshot::channel();
    let task = tokio::spawn(async move {
        lock.run(|_lease| async move {
            let _flag = flag;
            started_tx.send(()).unwrap();
            std::future::pending::<()>().await
        })
        .await
    });
    started_rx.await.unwrap();
    let forced_at = Instant::now();
    assert!(operator.force_unlock("forced").await.unwrap());
    let result = task.await.unwrap();
    assert!(
        matches!(&result, Err(Error::LeaseLost { name }) if name == "forced"),
        "{result:?}"
    );
    assert!(dropped.load(SeqCst), "the work was dropped");
    if same_client {
        assert_eq!(forced_at.elapsed(), Duration::ZERO, "{same_client}");
    } else {
        // The watchdog's next renewal (every lease / 3 = 1 s) is what finds the hold gone.
        assert!(forced_at.elapsed() > Duration::ZERO);
        assert!(forced_at.elapsed() <= Duration::from_secs(1));
    }
    until_clean(&client, &memory, "forced").await;
}

#[tokio::test(start_paused = true)]
async fn a_fixed_lease_that_ends_stops_the_work_exactly_then() {
    let memory = MemoryBackend::new();
    let client = client(&memory);
    let lock = client
        .fair_lock("fixed")
        .unwrap()
        .with_lease(Duration::from_secs(2))
        .unwrap();
    let dropped = Arc::new(AtomicBool::new(false));
    let flag = DropFlag(dropped.clone());
    let start = Instant::now();
    let result = lock
        .run(|_lease| async move {
            let _flag = flag;
            sleep(Duration::from_secs(60)).await;
            "finished"
        })
        .await;
    assert!(matches!(result, Err(Error::LeaseLost { .. })), "{result:?}");
    assert!(dropped.load(SeqCst));
    assert_eq!(
        start.elapsed(),
        Duration::from_secs(2),
        "stopped at the lease's end"
    );
    until_clean(&client, &memory, "fixed").await;
}

#[tokio::test(start_paused = true)]
async fn work_that_completes_after_its_hold_ended_unnoticed_is_lease_lost() {
    let memory = MemoryBackend::new();
    let client = client(&memory);
    let lock = client.fair_lock("unnoticed").unwrap();
    let operator = client.clone();
    // The hold is freed during the work and the work ends before any renewal could notice:
    // only the release's answer tells, and the value must not be reported as done under lock.
    let result = lock
        .run(|_lease| async move {
            operator.force_unlock("unnoticed").await.unwrap();
            7
        })
        .await;
    assert!(matches!(result, Err(Error::LeaseLost { .. })), "{result:?}");
    until_clean(&client, &memory, "unnoticed").await;
}

#[tokio::test(start_paused = true)]
async fn the_lease_handed_to_the_work_reports_the_hold() {
    let memory = MemoryBackend::new();
    let client = client(&memory);
    let lock = client
        .fair_lock("lease")
        .unwrap()
        .with_lease(Duration::from_secs(10))
        .unwrap();
    let kept = lock
        .run(|lease| async move {
            assert_eq!(lease.name().as_str(), "lease");
            assert_eq!(lease.hold_count(), 1);
            assert_eq!(lease.lease_remaining(), Duration::from_secs(10));
            sleep(Duration::from_secs(4)).await;
            assert_eq!(lease.lease_remaining(), Duration::from_secs(6));
            assert!(!lease.is_lease_lost());
            lease
        })
        .await
        .unwrap();
    // Kept past the run: it does not keep the hold, and says so.
    assert!(kept.is_lease_lost());
    assert_eq!(kept.lease_remaining(), Duration::ZERO);
    timeout(Duration::from_millis(1), kept.lease_lost())
        .await
        .expect("a lease outliving its guard reads as lost");
    assert_eq!(memory.lock_count(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_panicking_work_releases_the_lock() {
    let memory = MemoryBackend::new();
    let client = client(&memory);
    let lock = client.fair_lock("panic").unwrap();
    let task = tokio::spawn(async move {
        lock.run(|_lease| async {
            sleep(Duration::from_millis(5)).await;
            panic!("the work failed");
        })
        .await
    });
    assert!(task.await.unwrap_err().is_panic());
    until_clean(&client, &memory, "panic").await;
}

/// Dropping `run` at every instant of its life: while it waits, while the work runs, as the
/// work ends and while it releases. Each time the lock ends up free with nothing left.
#[tokio::test(start_paused = true)]
async fn dropping_run_at_any_point_leaves_the_lock_released() {
    let memory = MemoryBackend::new();
    let client = client(&memory);
    let ms = Duration::from_millis;
    // The lock is held by another owner for the first 50 ms, and the work takes 100 ms.
    for cut in [0, 1, 25, 50, 51, 100, 149, 150, 151, 200] {
        let name = format!("drop-{cut}");
        let blocker = client.fair_lock(&name).unwrap().lock().await.unwrap();
        tokio::spawn(async move {
            sleep(ms(50)).await;
            blocker.unlock().await.unwrap();
        });
        let lock = client.fair_lock(&name).unwrap();
        let dropped = Arc::new(AtomicBool::new(false));
        let flag = DropFlag(dropped.clone());
        let run = lock.run(|_lease| async move {
            let _flag = flag;
            sleep(ms(100)).await;
        });
        let outcome = timeout(ms(cut), run).await;
        match cut {
            0..=149 => assert!(outcome.is_err(), "cut at {cut} ms: {outcome:?}"),
            // The work ends as the time runs out: the release runs on the caller's task, and
            // this store answers at once, so it may finish in the same poll, or be cut.
            150 => {
                if let Ok(result) = outcome {
                    result.unwrap();
                }
            }
            _ => outcome.unwrap().unwrap(),
        }
        until_clean(&client, &memory, &name).await;
        if cut > 50 {
            assert!(
                dropped.load(SeqCst),
                "cut at {cut} ms: the work was dropped"
            );
        }
    }
}

/// The same, cut after every number of polls rather than at instants: with a store that
/// answers at once, each poll is one step of the acquisition, the work or the release (the
/// runtime gets a turn between polls, for the tasks `run` starts).
#[tokio::test(start_paused = true)]
async fn dropping_run_after_any_number_of_polls_leaves_the_lock_released() {
    let memory = MemoryBackend::new();
    let client = client(&memory);
    let lock = client.fair_lock("polls").unwrap();
    let mut completed = false;
    for polls in 0..40 {
        let mut run = Box::pin(lock.run(|_lease| async {
            for _ in 0..5 {
                tokio::task::yield_now().await;
            }
        }));
        for _ in 0..polls {
            if futures::poll!(run.as_mut()).is_ready() {
                completed = true;
                break;
            }
            // Let the tasks it spawned (the release) have their turn.
            tokio::task::yield_now().await;
        }
        drop(run);
        until_clean(&client, &memory, "polls").await;
    }
    assert!(completed, "some cut came after the end");
}

#[tokio::test(start_paused = true)]
async fn try_run_never_waits_and_try_run_for_waits_its_bound() {
    let memory = MemoryBackend::new();
    let client = client(&memory);
    let held = client.fair_lock("try").unwrap().lock().await.unwrap();
    let lock = client.fair_lock("try").unwrap();
    let ran = Arc::new(AtomicBool::new(false));

    let flag = ran.clone();
    let result = lock
        .try_run(|_| async move { flag.store(true, SeqCst) })
        .await;
    assert!(
        matches!(result, Err(Error::WouldBlock { .. })),
        "{result:?}"
    );

    let start = Instant::now();
    let flag = ran.clone();
    let result = lock
        .try_run_for(Duration::from_secs(2), |_| async move {
            flag.store(true, SeqCst)
        })
        .await;
    assert!(matches!(result, Err(Error::Timeout { .. })), "{result:?}");
    assert_eq!(start.elapsed(), Duration::from_secs(2));
    assert!(!ran.load(SeqCst), "the work never ran without the lock");

    held.unlock().await.unwrap();
    assert_eq!(lock.try_run(|_| async { 1 }).await.unwrap(), 1);
    let got = lock
        .try_run_for(Duration::from_secs(2), |_| async { 2 })
        .await
        .unwrap();
    assert_eq!(got, 2);
    until_clean(&client, &memory, "try").await;
}

#[tokio::test(start_paused = true)]
async fn run_re_enters_a_lock_its_owner_holds() {
    let memory = MemoryBackend::new();
    let client = client(&memory);
    let lock = client.fair_lock("nested").unwrap();
    let outer = lock.lock().await.unwrap();
    let count = lock.run(|lease| async move { lease.hold_count() }).await;
    assert_eq!(count.unwrap(), 2);
    // The run released its level only.
    let holder = client.state("nested").await.unwrap().holder.unwrap();
    assert_eq!(holder.hold_count, 1);
    assert!(outer.is_held().await.unwrap());
    outer.unlock().await.unwrap();
    assert_eq!(memory.lock_count(), 0);
}

#[tokio::test(start_paused = true)]
async fn lease_remaining_counts_down_a_fixed_lease_and_stays_up_with_the_watchdog() {
    let memory = MemoryBackend::new();
    let client = client(&memory);
    let fixed = client
        .fair_lock("fixed")
        .unwrap()
        .with_lease(Duration::from_secs(5))
        .unwrap()
        .lock()
        .await
        .unwrap();
    assert_eq!(fixed.lease_remaining(), Duration::from_secs(5));
    sleep(Duration::from_secs(2)).await;
    assert_eq!(fixed.lease_remaining(), Duration::from_secs(3));
    fixed.extend(Duration::from_secs(10)).await.unwrap();
    assert_eq!(fixed.lease_remaining(), Duration::from_secs(10));
    sleep(Duration::from_secs(10)).await;
    assert_eq!(fixed.lease_remaining(), Duration::ZERO);
    assert!(fixed.is_lease_lost());
    drop(fixed);

    // The watchdog renews the 3 s lease every second.
    let renewed = client.fair_lock("renewed").unwrap().lock().await.unwrap();
    for _ in 0..20 {
        sleep(Duration::from_millis(350)).await;
        let left = renewed.lease_remaining();
        assert!(
            left >= Duration::from_secs(2) && left <= Duration::from_secs(3),
            "{left:?}"
        );
    }
    renewed.unlock().await.unwrap();
    until_clean(&client, &memory, "renewed").await;
}

#[tokio::test(start_paused = true)]
async fn is_held_asks_the_store_for_this_very_hold() {
    let memory = MemoryBackend::new();
    let client = client(&memory);
    let lock = client.fair_lock("held").unwrap();
    let first = lock.lock().await.unwrap();
    assert!(first.is_held().await.unwrap());
    assert!(!first.is_lease_lost());

    // Freed by an operator elsewhere (another client) and taken again by the same owner
    // before any renewal: the owner holds, but under another token, so the first guard's
    // hold is not held.
    assert!(self::client(&memory).force_unlock("held").await.unwrap());
    let second = lock.lock().await.unwrap();
    assert!(second.fencing_token() > first.fencing_token());
    assert!(!first.is_lease_lost(), "nothing has noticed yet");
    assert!(!first.is_held().await.unwrap());
    assert!(first.is_lease_lost(), "is_held flagged the loss");
    timeout(Duration::from_millis(1), first.lease_lost())
        .await
        .expect("the lost-lease signal fired");
    assert!(second.is_held().await.unwrap());
    assert!(matches!(first.unlock().await, Err(Error::LeaseLost { .. })));
    second.unlock().await.unwrap();
    until_clean(&client, &memory, "held").await;
}

#[test]
fn holder_and_waiter_states_are_at_the_crate_root() {
    fn named(_: Option<&fairlock::HolderState>, _: &[fairlock::WaiterState]) {}
    let state = fairlock::LockState::new("x", None, vec![]);
    named(state.holder.as_ref(), &state.waiters);
    let attempt: fairlock::AttemptId = "2a".parse().unwrap();
    assert_eq!(attempt.as_u128(), 42);
}

/// A nested guard's lease reads lost as soon as that guard is dropped, while the outer guard
/// still holds and the nested guard's release is still on its way to the store.
#[tokio::test(start_paused = true)]
async fn a_dropped_nested_guards_lease_is_lost_before_its_release_lands() {
    let memory = MemoryBackend::new();
    let client = client(&memory);
    let lock = client.fair_lock("nested-lease").unwrap();
    let outer = lock.lock().await.unwrap();
    let inner = lock.lock().await.unwrap();
    let lease = inner.lease();
    drop(inner);
    // Nothing has run since: the release is only spawned.
    assert!(
        lease.is_lease_lost(),
        "the dropped guard's lease still reads held"
    );
    assert_eq!(lease.lease_remaining(), Duration::ZERO);
    assert!(
        timeout(Duration::ZERO, lease.lease_lost()).await.is_ok(),
        "the lost-lease signal waits for the release"
    );
    assert!(!outer.is_lease_lost());
    outer.unlock().await.unwrap();
    until_clean(&client, &memory, "nested-lease").await;
}

/// The lost-lease signal needs no timer of the runtime that awaits it: polled on a runtime
/// without a time driver, it waits (or completes once the guard is gone), and never panics.
#[test]
fn the_lost_lease_signal_needs_no_timer() {
    let memory = MemoryBackend::new();
    let acquiring = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let without_timers = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let guard = acquiring.block_on(async {
        let lock = client(&memory).fair_lock("no-timer").unwrap();
        lock.lock().await.unwrap()
    });
    let lease = guard.lease();
    let pending = without_timers
        .block_on(async { futures::poll!(std::pin::pin!(guard.lease_lost())).is_pending() });
    assert!(pending, "the signal fired for a live lease");
    acquiring.block_on(guard.unlock()).unwrap();
    let fired = without_timers
        .block_on(async { futures::poll!(std::pin::pin!(lease.lease_lost())).is_ready() });
    assert!(fired, "the signal missed the released guard");
}
