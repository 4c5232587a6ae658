//! Tasks a hold costs: none until its lease keeper has work (the first renewal, or a fixed
//! lease's end), so a short hold spawns nothing and wakes no other worker thread.

use std::time::Duration;

use fairlock::{LockClient, LockOptions, MemoryBackend};
use tokio::runtime::Handle;

fn alive_tasks() -> usize {
    Handle::current().metrics().num_alive_tasks()
}

async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn holds_spawn_their_keepers_only_when_the_first_renewal_is_due() {
    let client = LockClient::new(MemoryBackend::new());
    let before = alive_tasks();
    let mut guards = Vec::new();
    for i in 0..50 {
        guards.push(
            client
                .fair_lock(&format!("job-{i}"))
                .unwrap()
                .lock()
                .await
                .unwrap(),
        );
    }
    settle().await;
    // One timer task for the client, instead of one keeper per hold.
    assert!(
        alive_tasks() <= before + 1,
        "50 fresh holds run {} tasks",
        alive_tasks() - before
    );

    // Past the first renewal (a third of the 30 s watchdog lease) every keeper runs, and past
    // the lease itself every hold is still renewed.
    tokio::time::sleep(Duration::from_secs(11)).await;
    settle().await;
    assert_eq!(alive_tasks(), before + 50);
    tokio::time::sleep(Duration::from_secs(60)).await;
    for guard in &guards {
        assert!(!guard.is_lease_lost());
        assert!(guard.lease_remaining() > Duration::from_secs(10));
    }
    for guard in guards {
        guard.unlock().await.unwrap();
    }
    settle().await;
    assert_eq!(alive_tasks(), before, "a released hold leaves no task");
}

#[tokio::test(start_paused = true)]
async fn a_short_hold_leaves_no_task_behind() {
    let client = LockClient::new(MemoryBackend::new());
    let lock = client.fair_lock("job").unwrap();
    let before = alive_tasks();
    for _ in 0..100 {
        lock.lock().await.unwrap().unlock().await.unwrap();
    }
    settle().await;
    assert!(alive_tasks() <= before + 1);
    // The client's timer task exits once nothing is due.
    tokio::time::sleep(Duration::from_secs(11)).await;
    settle().await;
    assert_eq!(alive_tasks(), before);
}

#[tokio::test(start_paused = true)]
async fn a_fixed_lease_is_flagged_lost_at_its_end_without_a_task_before() {
    let client = LockClient::new(MemoryBackend::new())
        .with_options(LockOptions::default().with_lease(Duration::from_secs(5)))
        .unwrap();
    let guard = client.fair_lock("job").unwrap().lock().await.unwrap();
    let before = alive_tasks();
    let lost = guard.lease_lost();
    let started = tokio::time::Instant::now();
    lost.await;
    assert!(started.elapsed() >= Duration::from_millis(4_990));
    assert!(started.elapsed() <= Duration::from_secs(5) + Duration::from_millis(10));
    assert!(guard.is_lease_lost());
    drop(guard);
    settle().await;
    assert!(alive_tasks() <= before);
}
