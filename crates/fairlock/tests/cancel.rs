//! Aborted futures and tasks, after the tokio `Mutex` tests, plus timing-exact checks of the
//! in-memory backend under paused time, and guards dropped where no runtime runs.

use std::time::Duration;

use fairlock::backend::{AcquireOutcome, AcquireRequest, AttemptId, LockBackend};
use fairlock::{Error, LockClient, LockName, LockOptions, MemoryBackend, Owner};
use tokio::time::{sleep, timeout, Instant};

fn client(memory: &MemoryBackend) -> LockClient {
    LockClient::new(memory.clone())
        .with_options(
            LockOptions::default()
                .with_watchdog_lease(Duration::from_secs(2))
                .with_waiter_ttl(Duration::from_secs(1)),
        )
        .unwrap()
}

/// Polls (under real or paused time) until the lock is free with nobody waiting.
async fn until_clean(client: &LockClient, name: &str) {
    for _ in 0..500 {
        let state = client.state(name).await.unwrap();
        if state.holder.is_none() && state.waiters.is_empty() {
            return;
        }
        sleep(Duration::from_millis(2)).await;
    }
    panic!("{name} still busy: {:?}", client.state(name).await.unwrap());
}

async fn until_queued(client: &LockClient, name: &str, owner: &Owner) {
    for _ in 0..500 {
        let state = client.state(name).await.unwrap();
        if state.waiters.iter().any(|w| w.owner == owner.as_str()) {
            return;
        }
        sleep(Duration::from_millis(2)).await;
    }
    panic!("{owner} never queued on {name}");
}

#[tokio::test]
async fn aborted_task_holding_the_lock_releases_it() {
    let memory = MemoryBackend::new();
    let client = client(&memory);
    let lock = client.fair_lock("holding").unwrap();
    let (held_tx, held_rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let _guard = lock.lock().await.unwrap();
        held_tx.send(()).unwrap();
        std::future::pending::<()>().await;
    });
    held_rx.await.unwrap();
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    until_clean(&client, "holding").await;
    let next = client.fair_lock("holding").unwrap().lock().await.unwrap();
    next.unlock().await.unwrap();
    assert_eq!(memory.lock_count(), 0);
}

#[tokio::test]
async fn future_dropped_while_waiting_leaves_the_queue() {
    let memory = MemoryBackend::new();
    let client = client(&memory);
    let held = client.fair_lock("waiting").unwrap().lock().await.unwrap();
    let waiter = client.fair_lock("waiting").unwrap();
    {
        let mut wait = std::pin::pin!(waiter.lock());
        // Poll until it is queued, then drop it.
        let queued = async {
            loop {
                if !client.state("waiting").await.unwrap().waiters.is_empty() {
                    break;
                }
                sleep(Duration::from_millis(1)).await;
            }
        };
        tokio::select! {
            result = &mut wait => panic!("got the lock while it is held: {result:?}"),
            () = queued => {}
        }
    }
    until_queued_gone(&client, "waiting").await;
    held.unlock().await.unwrap();
    until_clean(&client, "waiting").await;
    // The dropped waiter left no place behind: a fresh try_lock succeeds at once.
    waiter.try_lock().await.unwrap().unlock().await.unwrap();
    assert_eq!(memory.lock_count(), 0);
}

async fn until_queued_gone(client: &LockClient, name: &str) {
    for _ in 0..500 {
        if client.state(name).await.unwrap().waiters.is_empty() {
            return;
        }
        sleep(Duration::from_millis(2)).await;
    }
    panic!("a dropped waiter stayed queued on {name}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aborted_waiting_task_leaves_nothing_and_the_next_waiter_proceeds() {
    let memory = MemoryBackend::new();
    let client = client(&memory);
    let held = client.fair_lock("abort").unwrap().lock().await.unwrap();
    let doomed = client.fair_lock("abort").unwrap();
    let doomed_owner = doomed.owner().clone();
    let task = tokio::spawn(async move { doomed.lock().await.map(drop) });
    until_queued(&client, "abort", &doomed_owner).await;
    let next = client.fair_lock("abort").unwrap();
    let next_owner = next.owner().clone();
    let next_task = tokio::spawn(async move { next.lock().await });
    until_queued(&client, "abort", &next_owner).await;

    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    let started = Instant::now();
    held.unlock().await.unwrap();
    // Far below the doomed waiter's 1 s TTL: its place did not hold anyone up.
    let guard = timeout(Duration::from_millis(500), next_task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(started.elapsed() < Duration::from_millis(500));
    guard.unlock().await.unwrap();
    until_clean(&client, "abort").await;
    assert_eq!(memory.lock_count(), 0);
}

#[test]
fn lock_outside_a_runtime_is_an_error() {
    let client = LockClient::new(MemoryBackend::new());
    let lock = client.fair_lock("no-runtime").unwrap();
    let result = futures::executor::block_on(lock.lock());
    assert!(matches!(result, Err(Error::NoRuntime)), "{result:?}");
}

#[test]
fn guard_dropped_on_a_thread_without_a_runtime_is_released_on_its_own_runtime() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let memory = MemoryBackend::new();
    let client = client(&memory);
    let guard =
        runtime.block_on(async { client.fair_lock("thread").unwrap().lock().await.unwrap() });
    std::thread::spawn(move || drop(guard))
        .join()
        .expect("dropping a guard must not panic");
    runtime.block_on(until_clean(&client, "thread"));
    assert_eq!(memory.lock_count(), 0);
}

#[test]
fn guard_outliving_its_runtime_drops_quietly_and_ends_with_its_lease() {
    let memory = MemoryBackend::new();
    let client = LockClient::new(memory.clone());
    let guard = {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let lock = client
            .fair_lock("orphan")
            .unwrap()
            .with_lease(Duration::from_millis(100))
            .unwrap();
        runtime.block_on(lock.lock()).unwrap()
    };
    std::thread::spawn(move || drop(guard))
        .join()
        .expect("dropping a guard must not panic");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        sleep(Duration::from_millis(150)).await;
        until_clean(&client, "orphan").await;
    });
    assert_eq!(memory.lock_count(), 0);
}

fn request(name: &str, owner: &Owner, lease: Duration, waiter_ttl: Duration) -> AcquireRequest {
    AcquireRequest {
        name: LockName::new(name).unwrap(),
        owner: owner.clone(),
        attempt: AttemptId::random(),
        lease,
        waiter_ttl,
        queue: true,
    }
}

#[tokio::test(start_paused = true)]
async fn waiter_is_evicted_exactly_at_its_ttl() {
    let memory = MemoryBackend::new();
    let client = client(&memory);
    // A fixed lease: `advance` jumps over time without letting a watchdog run.
    let held = client
        .fair_lock("ttl")
        .unwrap()
        .with_lease(Duration::from_secs(60))
        .unwrap();
    let held = held.lock().await.unwrap();
    let dead = Owner::unique();
    let ttl = Duration::from_secs(3);
    let outcome = memory
        .acquire(&request("ttl", &dead, ttl, ttl))
        .await
        .unwrap();
    assert!(
        matches!(outcome, AcquireOutcome::Queued { .. }),
        "{outcome:?}"
    );
    tokio::time::advance(ttl - Duration::from_millis(1)).await;
    let state = client.state("ttl").await.unwrap();
    assert_eq!(
        state.waiters.len(),
        1,
        "still live 1 ms before its deadline: {state:?}"
    );
    assert_eq!(state.waiters[0].deadline_in, Duration::from_millis(1));
    tokio::time::advance(Duration::from_millis(1)).await;
    let state = client.state("ttl").await.unwrap();
    assert!(state.waiters.is_empty(), "gone at its deadline: {state:?}");
    held.unlock().await.unwrap();
    assert_eq!(memory.lock_count(), 0);
}

#[tokio::test(start_paused = true)]
async fn lease_ends_exactly_and_the_waiter_takes_over_at_once() {
    let memory = MemoryBackend::new();
    let client = client(&memory);
    let lease = Duration::from_secs(10);
    let start = Instant::now();
    let held = client
        .fair_lock("lease")
        .unwrap()
        .with_lease(lease)
        .unwrap()
        .lock()
        .await
        .unwrap();
    let waiter = client.fair_lock("lease").unwrap();
    // The waiter's heartbeat is every 333 ms; the store's retry_after hint (the lease left)
    // wakes it exactly when the lease ends.
    let guard = waiter.lock().await.unwrap();
    assert_eq!(
        start.elapsed(),
        lease,
        "the head waiter acquires exactly when the lease ends"
    );
    assert!(guard.fencing_token() > held.fencing_token());
    assert!(held.is_lease_lost());
    assert!(matches!(held.unlock().await, Err(Error::LeaseLost { .. })));
    guard.unlock().await.unwrap();
    assert_eq!(memory.lock_count(), 0);
}

#[tokio::test(start_paused = true)]
async fn watchdog_keeps_a_lock_for_an_hour() {
    let memory = MemoryBackend::new();
    let client = LockClient::new(memory.clone());
    let guard = client.fair_lock("hour").unwrap().lock().await.unwrap();
    sleep(Duration::from_secs(3600)).await;
    assert!(!guard.is_lease_lost());
    let holder = client.state("hour").await.unwrap().holder.unwrap();
    assert_eq!(holder.token, guard.fencing_token());
    assert!(
        holder.lease_remaining > Duration::from_secs(15),
        "{holder:?}"
    );
    guard.unlock().await.unwrap();
    assert_eq!(memory.lock_count(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_grant_to_a_dead_waiter_lapses_after_its_ttl() {
    let memory = MemoryBackend::new();
    let client = client(&memory);
    let held = client.fair_lock("lapse").unwrap().lock().await.unwrap();
    let dead = Owner::unique();
    let dead_ttl = Duration::from_secs(2);
    let outcome = memory
        .acquire(&request("lapse", &dead, dead_ttl, dead_ttl))
        .await
        .unwrap();
    assert!(
        matches!(outcome, AcquireOutcome::Queued { .. }),
        "{outcome:?}"
    );
    let live = client.fair_lock("lapse").unwrap();
    let live_owner = live.owner().clone();
    let waiting = tokio::spawn(async move {
        let guard = live.lock().await?;
        Ok::<_, Error>((Instant::now(), guard))
    });
    until_queued(&client, "lapse", &live_owner).await;
    let released = Instant::now();
    held.unlock().await.unwrap();
    let state = client.state("lapse").await.unwrap();
    let pending = state.holder.as_ref().unwrap();
    assert!(
        pending.owner == dead.as_str() && !pending.confirmed,
        "{state:?}"
    );
    let (acquired, guard) = waiting.await.unwrap().unwrap();
    assert_eq!(
        acquired - released,
        dead_ttl,
        "the pending grant lasts exactly the waiter TTL"
    );
    guard.unlock().await.unwrap();
    assert_eq!(memory.lock_count(), 0);
}
