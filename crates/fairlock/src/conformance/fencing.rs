//! Fencing tokens.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::sleep;

use super::support::{self, OrFail};
use crate::backend::LockBackend;
use crate::error::Error;

/// Fencing tokens strictly increase per lock over every grant: after a release, after a lease
/// ran out (and a stale release by the old holder does not free the new hold), after a force
/// release, after the lock was released and left alone (its keys cleaned up), and after a
/// lease ran out with nobody touching the lock (its keys expiring by themselves). A reentrant
/// acquisition keeps the token.
pub async fn fencing_tokens_increase(backend: Arc<dyn LockBackend>) {
    const CHECK: &str = "fencing_tokens_increase";
    let client = support::client(&backend);
    let name = support::lock_name(CHECK);
    let short = Duration::from_millis(150);
    let short_client = support::fixed_lease_client(&backend, short);
    let mut last = 0u64;
    let mut next = |token: u64, after: &str| {
        assert!(
            token > last,
            "{CHECK}: token {token} after {after} must exceed {last}"
        );
        last = token;
    };

    let a = client.fair_lock(&name).or_fail(CHECK);
    let first = a.lock().await.or_fail(CHECK);
    next(first.fencing_token(), "the first grant");
    let again = a.lock().await.or_fail(CHECK);
    assert_eq!(
        again.fencing_token(),
        first.fencing_token(),
        "{CHECK}: re-entry keeps the token"
    );
    again.unlock().await.or_fail(CHECK);
    first.unlock().await.or_fail(CHECK);

    let b = client
        .fair_lock(&name)
        .or_fail(CHECK)
        .lock()
        .await
        .or_fail(CHECK);
    next(b.fencing_token(), "a release");
    b.unlock().await.or_fail(CHECK);

    // Expiry.
    let expired = short_client
        .fair_lock(&name)
        .or_fail(CHECK)
        .lock()
        .await
        .or_fail(CHECK);
    next(expired.fencing_token(), "a release");
    support::state_where(
        &client,
        &name,
        short + support::EVENTUALLY,
        format!("{CHECK}: lease runs out"),
        |s| s.holder.is_none(),
    )
    .await;
    let d = client.fair_lock(&name).or_fail(CHECK);
    let after_expiry = d.lock().await.or_fail(CHECK);
    next(after_expiry.fencing_token(), "a lease ran out");
    let stale = expired.unlock().await;
    assert!(
        matches!(stale, Err(Error::LeaseLost { .. })),
        "{CHECK}: unlock by the expired holder: expected LeaseLost, got {stale:?}"
    );
    let state = client.state(&name).await.or_fail(CHECK);
    assert_eq!(
        state.holder.as_ref().map(|h| h.token),
        Some(after_expiry.fencing_token()),
        "{CHECK}: a stale unlock must not free the new hold: {state:?}"
    );

    // Force release.
    assert!(
        client.force_unlock(&name).await.or_fail(CHECK),
        "{CHECK}: force_unlock of a held lock"
    );
    let e = client
        .fair_lock(&name)
        .or_fail(CHECK)
        .lock()
        .await
        .or_fail(CHECK);
    next(e.fencing_token(), "a force release");
    drop(after_expiry);
    e.unlock().await.or_fail(CHECK);

    // Released and left alone: whatever the store cleans up, the counter survives.
    support::wait_clean(&client, &name, format!("{CHECK}: lock free")).await;
    let listed = client.list(&name).await.or_fail(CHECK);
    assert!(
        listed.is_empty(),
        "{CHECK}: a free lock must not be listed: {listed:?}"
    );
    sleep(Duration::from_millis(50)).await;
    let f = client
        .fair_lock(&name)
        .or_fail(CHECK)
        .lock()
        .await
        .or_fail(CHECK);
    next(f.fencing_token(), "the lock was released and cleaned up");
    f.unlock().await.or_fail(CHECK);

    // A lease that runs out untouched, so that keys with a TTL expire by themselves.
    let g = short_client
        .fair_lock(&name)
        .or_fail(CHECK)
        .lock()
        .await
        .or_fail(CHECK);
    next(g.fencing_token(), "the lock was released and cleaned up");
    sleep(short * 3).await;
    let h = client
        .fair_lock(&name)
        .or_fail(CHECK)
        .lock()
        .await
        .or_fail(CHECK);
    next(h.fencing_token(), "a lease ran out untouched");
    drop(g);
    h.unlock().await.or_fail(CHECK);
    support::wait_clean(&client, &name, format!("{CHECK}: lock free at the end")).await;
}
