//! `state()` and `list()` tell the truth.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::support::{self, raw_acquire, OrFail, Waiter};
use crate::backend::{AcquireOutcome, HolderState, LockBackend, LockState, LockSummary};
use crate::name::{LockName, Owner};

/// `state()` of a held lock with waiters shows the holder's owner, hold count, token and a
/// confirmed hold, a `lease_remaining` between what is left of the lease by our clock and the
/// full lease, and the waiters in queue order, each with a liveness deadline within its TTL.
/// A free lock and a lock never used show no holder and no waiters; `name` is the lock's.
pub async fn state_matches_reality(backend: Arc<dyn LockBackend>) {
    const CHECK: &str = "state_matches_reality";
    let lease = Duration::from_secs(5);
    let client = support::client(&backend);
    let name = support::lock_name(CHECK);
    let holder = support::fixed_lease_client(&backend, lease)
        .fair_lock(&name)
        .or_fail(CHECK);
    let outer = holder.lock().await.or_fail(CHECK);
    let sent = Instant::now();
    let inner = holder.lock().await.or_fail(CHECK);
    let first = Waiter::enqueue(CHECK, &client, client.fair_lock(&name).or_fail(CHECK)).await;
    let second = Waiter::enqueue(CHECK, &client, client.fair_lock(&name).or_fail(CHECK)).await;

    let state = client.state(&name).await.or_fail(CHECK);
    let since = sent.elapsed();
    assert_eq!(state.name, name, "{CHECK}: the state names its lock");
    let held = state
        .holder
        .as_ref()
        .unwrap_or_else(|| panic!("{CHECK}: a held lock shows a holder: {state:?}"));
    assert_eq!(held.owner, holder.owner().as_str(), "{CHECK}: holder owner");
    assert_eq!(held.hold_count, 2, "{CHECK}: hold count after a re-entry");
    assert_eq!(held.token, outer.fencing_token(), "{CHECK}: holder token");
    assert!(
        held.confirmed,
        "{CHECK}: a hold taken by acquire is confirmed: {state:?}"
    );
    // The re-entry set the lease to 5 s after the store saw it, which was after `sent`.
    assert!(
        held.lease_remaining <= lease && held.lease_remaining + since + support::clock_slack(&backend) >= lease,
        "{CHECK}: lease_remaining {:?} must be within {lease:?} and no less than {:?} ({since:?} after the re-entry)",
        held.lease_remaining,
        lease.saturating_sub(since)
    );
    assert_eq!(
        support::waiter_owners(&state),
        vec![first.owner().to_string(), second.owner().to_string()],
        "{CHECK}: waiters in queue order"
    );
    same_holder(&backend, &name, &state, "held, with waiters").await;
    for waiter in &state.waiters {
        assert!(
            !waiter.deadline_in.is_zero()
                && waiter.deadline_in <= support::WAITER_TTL + support::clock_slack(&backend),
            "{CHECK}: a live waiter's deadline is in (0, {:?}]: {state:?}",
            support::WAITER_TTL
        );
    }

    inner.unlock().await.or_fail(CHECK);
    let state = client.state(&name).await.or_fail(CHECK);
    assert_eq!(
        state.holder.as_ref().map(|h| h.hold_count),
        Some(1),
        "{CHECK}: one level released: {state:?}"
    );
    assert_eq!(
        state.waiters.len(),
        2,
        "{CHECK}: still two waiters: {state:?}"
    );
    drop(first);
    drop(second);
    outer.unlock().await.or_fail(CHECK);
    support::wait_clean(
        &client,
        &name,
        format!("{CHECK}: the lock is free once all left"),
    )
    .await;
    let state = client.state(&name).await.or_fail(CHECK);
    same_holder(&backend, &name, &state, "free").await;
    let never = support::lock_name(CHECK);
    let state = client.state(&never).await.or_fail(CHECK);
    assert!(
        state.name == never && state.holder.is_none() && state.waiters.is_empty(),
        "{CHECK}: a lock never used: {state:?}"
    );
    same_holder(&backend, &never, &state, "never used").await;
}

/// `holder()` answers what `inspect()` showed as the holder (read again: the lease left may
/// differ by the time between the two reads, the rest must not).
async fn same_holder(backend: &Arc<dyn LockBackend>, name: &str, state: &LockState, when: &str) {
    const CHECK: &str = "state_matches_reality";
    let lock = LockName::new(name).or_fail(CHECK);
    let holder = backend.holder(&lock).await.or_fail(CHECK);
    let key = |h: &HolderState| (h.owner.clone(), h.hold_count, h.token, h.confirmed);
    assert_eq!(
        holder.as_ref().map(key),
        state.holder.as_ref().map(key),
        "{CHECK}: holder() must answer what inspect() shows as the holder ({when})"
    );
}

/// `list(prefix)` returns exactly the locks under the prefix that are held or have live
/// waiters: a held one (holder, no waiters), a held one with a waiter, and one whose lease ran
/// out while a waiter is queued (no holder, one waiter). Not a released lock, not one whose
/// lease ran out untouched, not a lock never used, not a held lock outside the prefix. Once
/// everything is released, it is empty.
pub async fn list_shows_held_and_waited(backend: Arc<dyn LockBackend>) {
    const CHECK: &str = "list_shows_held_and_waited";
    let client = support::client(&backend);
    let base = support::lock_name(CHECK);
    let prefix = format!("{base}/in/");
    let lease = Duration::from_millis(200);
    let long = Duration::from_secs(5);
    let [holder, waiter, expiring, queued] = [(); 4].map(|()| Owner::unique());
    let at = |suffix: &str| format!("{prefix}{suffix}");

    let outside = client
        .fair_lock(&format!("{base}/out"))
        .or_fail(CHECK)
        .lock()
        .await
        .or_fail(CHECK);
    let released = client
        .fair_lock(&at("released"))
        .or_fail(CHECK)
        .lock()
        .await
        .or_fail(CHECK);
    released.unlock().await.or_fail(CHECK);
    let mut grants = Vec::new();
    // "lapsed" first: its lease ends before that of "expired", which is waited for below.
    for (suffix, owner, lease, queue) in [
        ("lapsed", &expiring, lease, false),
        ("held", &holder, long, false),
        ("waited", &holder, long, false),
        ("waited", &waiter, long, true),
        ("expired", &expiring, lease, false),
        ("expired", &queued, long, true),
    ] {
        let outcome = raw_acquire(&backend, &at(suffix), owner, lease, long, queue).await;
        match outcome {
            AcquireOutcome::Granted(grant) if !queue => {
                grants.push((at(suffix), owner.clone(), grant.token))
            }
            AcquireOutcome::Queued { .. } if queue => {}
            other => panic!("{CHECK}: setting up {suffix} for {owner}: got {other:?}"),
        }
    }
    // Wait on "expired" only: "lapsed" must not be touched before `list`, as a store may keep
    // the keys of a lapsed lease until the next call.
    support::state_where(
        &client,
        &at("expired"),
        lease + support::EVENTUALLY,
        format!("{CHECK}: lease runs out"),
        |s| s.holder.is_none(),
    )
    .await;

    let listed: BTreeMap<String, LockSummary> = client
        .list(&prefix)
        .await
        .or_fail(CHECK)
        .into_iter()
        .map(|summary| (summary.name.clone(), summary))
        .collect();
    let expected: BTreeMap<String, LockSummary> = [
        ("held", Some(&holder), 0),
        ("waited", Some(&holder), 1),
        ("expired", None, 1),
    ]
    .into_iter()
    .map(|(suffix, holder, waiters)| {
        let summary = LockSummary {
            name: at(suffix),
            holder: holder.map(Owner::to_string),
            waiters,
        };
        (at(suffix), summary)
    })
    .collect();
    assert_eq!(listed, expected, "{CHECK}: list({prefix:?})");

    for (name, owner, token) in grants {
        let lock_name = LockName::new(&name).or_fail(CHECK);
        // The expired hold is gone already; the others are released here.
        let _ = backend
            .release(&lock_name, &owner, token, support::attempt_of(&owner))
            .await
            .or_fail(CHECK);
    }
    // The hand-over of "waited" went to the raw waiter; it and the queued raw owner leave.
    for (suffix, owner) in [("waited", &waiter), ("expired", &queued)] {
        let lock_name = LockName::new(at(suffix)).or_fail(CHECK);
        backend
            .abandon(&lock_name, owner, support::attempt_of(owner))
            .await
            .or_fail(CHECK);
    }
    outside.unlock().await.or_fail(CHECK);
    let deadline = Instant::now() + support::EVENTUALLY;
    loop {
        let listed = client.list(&prefix).await.or_fail(CHECK);
        if listed.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{CHECK}: list({prefix:?}) after everything was released: {listed:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
