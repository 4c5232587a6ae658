//! Mutual exclusion between owners, and reentrancy within one owner.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::sleep;

use super::support::{self, join_all, OrFail};
use crate::backend::LockBackend;
use crate::error::Error;
use crate::name::Owner;

/// Many owners contend for one lock (16 tasks × 20 acquisitions): never two inside the
/// critical section at once, and the fencing tokens, read inside it, strictly increase in the
/// order the critical sections ran.
pub async fn mutual_exclusion(backend: Arc<dyn LockBackend>) {
    const CHECK: &str = "mutual_exclusion";
    const TASKS: usize = 16;
    const ROUNDS: usize = 20;
    let client = support::client(&backend);
    let name = support::lock_name(CHECK);
    let inside = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(Mutex::new(Vec::with_capacity(TASKS * ROUNDS)));

    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let lock = client.fair_lock(&name).or_fail(CHECK);
        let inside = inside.clone();
        let tokens = tokens.clone();
        tasks.push(tokio::spawn(async move {
            for round in 0..ROUNDS {
                let guard = lock.lock().await.or_fail(format!("{CHECK}: task {task} lock"));
                let others = inside.fetch_add(1, Ordering::SeqCst);
                assert_eq!(
                    others, 0,
                    "{CHECK}: task {task} entered the critical section while {others} other owner(s) were inside"
                );
                tokens.lock().unwrap().push(guard.fencing_token());
                // Stay inside across an await point, so that an overlap would be seen.
                if round % 2 == 0 {
                    tokio::task::yield_now().await;
                } else {
                    sleep(Duration::from_micros(200)).await;
                }
                inside.fetch_sub(1, Ordering::SeqCst);
                guard.unlock().await.or_fail(format!("{CHECK}: task {task} unlock"));
            }
        }));
    }
    join_all(tasks).await;

    let tokens = tokens.lock().unwrap().clone();
    assert_eq!(
        tokens.len(),
        TASKS * ROUNDS,
        "{CHECK}: every acquisition ran"
    );
    for pair in tokens.windows(2) {
        assert!(
            pair[0] < pair[1],
            "{CHECK}: fencing tokens must strictly increase from holder to holder, got {} then {}",
            pair[0],
            pair[1]
        );
    }
    support::wait_clean(&client, &name, format!("{CHECK}: lock free at the end")).await;
}

/// The same owner acquires again while holding (`lock`, `try_lock`, `try_lock_for`, and a
/// second handle with the same [`Owner`]): each returns at once with the next hold count and
/// the same fencing token, other owners stay excluded, and each guard releases exactly one
/// level (by `unlock` or by drop) until the last frees the lock.
pub async fn reentrancy(backend: Arc<dyn LockBackend>) {
    const CHECK: &str = "reentrancy";
    let client = support::client(&backend);
    let name = support::lock_name(CHECK);
    let lock = client.fair_lock(&name).or_fail(CHECK);
    let same_owner = client
        .fair_lock_as(&name, lock.owner().clone())
        .or_fail(CHECK);
    let other = client.fair_lock(&name).or_fail(CHECK);

    let first = lock.lock().await.or_fail(format!("{CHECK}: first lock"));
    let token = first.fencing_token();
    assert_eq!(
        first.hold_count(),
        1,
        "{CHECK}: a first grant has hold count 1"
    );
    let second = lock
        .lock()
        .await
        .or_fail(format!("{CHECK}: reentrant lock"));
    let third = lock
        .try_lock()
        .await
        .or_fail(format!("{CHECK}: reentrant try_lock"));
    let fourth = lock
        .try_lock_for(Duration::from_millis(100))
        .await
        .or_fail(format!("{CHECK}: reentrant try_lock_for"));
    let fifth = same_owner.lock().await.or_fail(format!(
        "{CHECK}: lock through another handle of the same owner"
    ));
    for (guard, count) in [(&second, 2), (&third, 3), (&fourth, 4), (&fifth, 5)] {
        assert_eq!(
            guard.hold_count(),
            count,
            "{CHECK}: hold count of re-entry {count}"
        );
        assert_eq!(
            guard.fencing_token(),
            token,
            "{CHECK}: a reentrant acquisition keeps the fencing token"
        );
    }
    expect_held(&client, &name, lock.owner(), 5, token, CHECK).await;
    let refused = other.try_lock().await;
    assert!(
        matches!(refused, Err(Error::WouldBlock { .. })),
        "{CHECK}: another owner's try_lock while held: expected WouldBlock, got {refused:?}"
    );

    second
        .unlock()
        .await
        .or_fail(format!("{CHECK}: unlock re-entry 2"));
    expect_held(&client, &name, lock.owner(), 4, token, CHECK).await;
    fifth
        .unlock()
        .await
        .or_fail(format!("{CHECK}: unlock re-entry 5"));
    expect_held(&client, &name, lock.owner(), 3, token, CHECK).await;
    drop(third);
    let owner = lock.owner().as_str();
    support::state_where(
        &client,
        &name,
        support::EVENTUALLY,
        format!("{CHECK}: dropping a reentrant guard releases one level"),
        |s| {
            s.holder
                .as_ref()
                .is_some_and(|h| h.owner == owner && h.hold_count == 2)
        },
    )
    .await;
    fourth
        .unlock()
        .await
        .or_fail(format!("{CHECK}: unlock re-entry 4"));
    expect_held(&client, &name, lock.owner(), 1, token, CHECK).await;
    let refused = other.try_lock().await;
    assert!(
        matches!(refused, Err(Error::WouldBlock { .. })),
        "{CHECK}: still held at hold count 1: expected WouldBlock, got {refused:?}"
    );

    first
        .unlock()
        .await
        .or_fail(format!("{CHECK}: last unlock"));
    let state = client.state(&name).await.or_fail(CHECK);
    assert!(
        state.holder.is_none(),
        "{CHECK}: the last level released frees the lock: {state:?}"
    );
    let next = other
        .try_lock()
        .await
        .or_fail(format!("{CHECK}: try_lock once free"));
    assert!(
        next.fencing_token() > token,
        "{CHECK}: the next holder's token {} must exceed {token}",
        next.fencing_token()
    );
    next.unlock().await.or_fail(CHECK);
}

async fn expect_held(
    client: &crate::LockClient,
    name: &str,
    owner: &Owner,
    hold_count: u32,
    token: u64,
    check: &str,
) {
    let state = client.state(name).await.or_fail(check);
    let holder = state
        .holder
        .as_ref()
        .unwrap_or_else(|| panic!("{check}: expected the lock held, state: {state:?}"));
    assert!(
        holder.owner == owner.as_str() && holder.hold_count == hold_count && holder.token == token,
        "{check}: expected {owner} holding {hold_count} level(s) with token {token}, state: {state:?}"
    );
}
