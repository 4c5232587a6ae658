//! Compile-time promises: the user-facing types and the futures of their async methods are
//! `Send` (so they work in `tokio::spawn`), and guards and `lease_lost()` are `'static` (so
//! they can move into spawned tasks on their own). A broken promise fails to compile.

use std::future::Future;
use std::time::Duration;

use fairlock::{FairLock, Lease, LockClient, LockGuard, MemoryBackend};

fn send_sync<T: Send + Sync>() {}
fn send<T: Send>(value: T) -> T {
    value
}
fn send_static<T: Send + 'static>(value: T) -> T {
    value
}

#[test]
fn types_are_send_and_sync() {
    send_sync::<LockGuard>();
    send_sync::<Lease>();
    send_sync::<FairLock>();
    send_sync::<LockClient>();
    send_sync::<MemoryBackend>();
    send_sync::<fairlock::Error>();
}

/// Builds every future without polling it, except those it awaits to get the next value.
#[tokio::test]
async fn futures_are_send() {
    let memory = MemoryBackend::new();
    let client = LockClient::new(memory.clone());
    let lock = client.fair_lock("bounds").unwrap();
    drop(send(lock.try_lock()));
    drop(send(lock.try_lock_for(Duration::from_millis(1))));
    drop(send(client.state("bounds")));
    drop(send(client.force_unlock("bounds")));
    drop(send(lock.run(|lease| async move { lease.fencing_token() })));
    drop(send(lock.try_run(|_| async {})));
    drop(send(
        lock.try_run_for(Duration::from_millis(1), |_| async {}),
    ));
    let guard = send_static(send(lock.lock()).await.unwrap());
    drop(send(guard.extend(Duration::from_secs(1))));
    drop(send(guard.is_held()));
    let lease = send_static(guard.lease());
    drop(send_static(lease.lease_lost()));
    let lost = send_static(guard.lease_lost());
    let spawned = tokio::spawn(async move { guard.unlock().await });
    send_static::<Result<(), fairlock::Error>>(spawned.await.unwrap()).unwrap();
    lost.await; // the guard is gone, so this completes
    assert_eq!(memory.lock_count(), 0);
}

/// `lock()` futures can be held across `.await` in a task that the multi-thread runtime moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_future_runs_in_a_spawned_task() {
    fn spawnable<F: Future + Send + 'static>(future: F) -> F {
        future
    }
    let client = LockClient::new(MemoryBackend::new());
    let lock = client.fair_lock("bounds-spawned").unwrap();
    let task = tokio::spawn(spawnable(async move {
        let guard = lock.lock().await?;
        let token = guard.fencing_token();
        guard.unlock().await.map(|()| token)
    }));
    assert!(task.await.unwrap().unwrap() > 0);
}
