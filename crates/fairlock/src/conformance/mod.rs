//! The backend conformance suite: checks that a [`LockBackend`] keeps its contract, run
//! through the real core ([`LockClient`](crate::LockClient), guards, waiting, watchdog), so
//! they prove what users rely on.
//!
//! Enable the `conformance` feature in your backend crate's dev-dependencies and call
//! [`run_all`] from a test on a multi-thread runtime:
//!
//! ```toml
//! [dev-dependencies]
//! fairlock = { version = "0.1", features = ["conformance"] }
//! tokio = { version = "1", features = ["macros", "rt-multi-thread"] }
//! ```
//!
//! ```no_run
//! use std::sync::Arc;
//! use fairlock::{LockBackend, MemoryBackend}; // your backend here
//!
//! #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
//! async fn conformance() {
//!     let store = MemoryBackend::new();
//!     // Opens another instance of the same store each time (for a networked store: a new
//!     // client with its own connections).
//!     fairlock::conformance::run_all(move || {
//!         let handle = store.clone();
//!         async move { Arc::new(handle) as Arc<dyn LockBackend> }
//!     })
//!     .await;
//! }
//! ```
//!
//! [`run_all`] opens several instances and spreads the owners of every check over them
//! ([`Spread`]), so a backend whose instances do not share state fails. It runs every check,
//! each in its own task with a timeout, and then panics listing each failed check and why;
//! [`run_checks`] returns the same [`Report`] instead. Every check is also public on its own,
//! named for the behaviour it proves, so a failure can be rerun alone; its future is `Send`. A
//! check panics with a message that names it and what was seen.
//!
//! # What the suite assumes
//! - **Shared stores.** Each check uses fresh random lock names under
//!   `fairlock-conformance/<check>/`, never wipes the store, and leaves nothing behind but
//!   what fencing needs. It may run against a store others use, and several runs may share it.
//! - **Real time and networks.** The suite runs on real time (it cannot assume a paused
//!   clock) with short leases (150-500 ms) and waiter TTLs (400-600 ms), so [`run_all`]
//!   takes seconds (about 7 s on the in-memory backend). Bounds on timing are generous, so a
//!   store with a 100 µs round trip and lagging pub/sub passes: a check asserts that
//!   something happened *by* a deadline only when the contract promises it (a wake-up is
//!   sent; a lost one is made up for by the next heartbeat), and polls `state()` for up to a
//!   few seconds for eventual conditions such as background cleanup.
//! - **Wrappers.** Run the suite through every wrapper you ship too. [`LossyWakeups`] is a
//!   wrapper that loses every wake-up, for checking that waiters still progress on
//!   heartbeats alone (the suite uses it in [`lost_wakeups_still_progress`]; [`hand_over`]
//!   and [`force_release`] fail on it, since they check that wake-ups are sent).
//! - **Versioning.** The suite is versioned with this crate and checks the contract of the
//!   same version: a newer fairlock may add checks or tighten them as the contract is
//!   clarified, and [`run_all`] picks them up. Test against the fairlock version you support.
//!
//! # The checks
//! | check | proves |
//! |---|---|
//! | [`mutual_exclusion`] | 16 owners × 20 acquisitions never overlap; tokens increase in grant order |
//! | [`reentrancy`] | re-entry counts up and keeps the token; each guard releases one level |
//! | [`shared_handle_counts_each_guard`] | two tasks sharing a handle get one level each when the lock reaches them, and leave the queue |
//! | [`nested_lock_after_hand_over`] | a nested `lock()` right after a hand-over is a second level, not the confirmation |
//! | [`attempts_of_one_owner_are_independent`] | one attempt's timeout never costs another attempt of the owner its place |
//! | [`one_lease_per_hold`] | a nested guard's `extend` never shortens the hold's lease, and counts for every guard |
//! | [`lost_grant_reply_leaves_no_level`] | a grant whose reply was lost (through [`LostReplies`]) leaves no phantom level; asked again, a granted attempt answers with the hold's current count |
//! | [`reentry_lengthens_the_lease`] | a re-entry sets the lease from now when that is later; one with a shorter lease leaves it as it is |
//! | [`pending_grant_lasts_the_waiter_ttl`] | an unconfirmed hand-over ends after the waiter's TTL, not its lease; its attempt is then spent |
//! | [`pending_level_lapses_beside_a_reentry`] | a re-entry into a pending hold adds a level without confirming it, and the pending level still lapses after the waiter's TTL |
//! | [`list_ignores_dead_waiters`] | `list` counts live waiters only |
//! | [`resends_are_harmless`] | with half the requests delivered again later (through [`Resend`]), the caller getting the first copy's reply or the second's, exclusion, counts and tokens hold (two of the tasks sharing one handle), a guard held past a renewal keeps its lease, and nothing is left |
//! | [`fifo_order`] | waiters are listed and granted in exactly the order they queued |
//! | [`try_lock_never_barges`] | `try_lock` fails while held with waiters, and when a lease ran out under a live waiter; nor does a second waiter barge then |
//! | [`hand_over`] | a release wakes the head waiter and hands it the lock (pending grant) or leaves it free for it |
//! | [`heartbeat_keeps_place_and_grantee_confirms`] | a heartbeat keeps the waiter's place, and keeps it alive past its first TTL; only the grantee's `acquire` confirms a hand-over (not `extend`), which then lasts its lease |
//! | [`wait_timeout_leaves_queue`] | `try_lock_for` times out, leaves the queue, and delays no one |
//! | [`lease_expiry_frees_lock`] | an unrenewed lease ends the hold; the waiter proceeds, not earlier |
//! | [`watchdog_keeps_lock`] | the watchdog keeps a lock over several leases |
//! | [`lease_lost_signal`] | `extend` postpones the lost-lease signal, which fires when the lease ends |
//! | [`expired_hold_stays_ended`] | a hold whose lease ran out stays gone for its owner too: `extend` answers false, its attempt's `acquire` again is `Busy`, a new attempt is a new grant |
//! | [`dead_waiters_are_evicted`] | a waiter that stops heart-beating blocks nobody, at the head or in the middle, also of a lock whose lease ran out |
//! | [`mass_death_blocks_nobody`] | 1,000 waiters that died together in front of two live ones: the first live one gets the lock, never the second or a newcomer before it, and no dead one is listed |
//! | [`force_release`] | force release frees the lock, hands it to the head waiter, reports whether it was held |
//! | [`release_by_non_owner`] | release/extend with the wrong owner or token is refused and changes nothing; re-sent releases answer as the first did; an ended attempt's acquire changes nothing, also while its owner still holds |
//! | [`abandoned_attempts_stay_ended`] | an abandoned attempt's `acquire` delivered again (also of one abandoned before it called) is `Busy` and changes nothing, while held and once free |
//! | [`fencing_tokens_increase`] | tokens increase across holders, expiry, force release and cleanup |
//! | [`cancelled_waits_leave_nothing`] | waits dropped at random times leave no waiter and no hold |
//! | [`cancel_at_grant_time_leaves_nothing`] | a wait dropped as the lock is handed to it gives the lock back |
//! | [`lost_wakeups_still_progress`] | with every wake-up lost, a waiter gets the lock within a heartbeat |
//! | [`state_matches_reality`] | `state()` shows holder, count, token, lease and waiters as they are; `holder()` agrees |
//! | [`list_shows_held_and_waited`] | `list(prefix)` shows held and waited locks, not free ones |
//! | [`invalid_input_is_rejected`] | bad names, durations and waits fail with `InvalidArgument` and touch nothing |
//! | [`instances_share_state`] | separately opened instances share their locks (run by [`run_checks`], which opens them) |
//! | [`shared_owner_hears_grants_in_every_instance`] | an owner waiting through several instances hears of its grants in each (likewise) |
//!
//! One check is not in the suite, since it waits out the resend horizon (60 s):
//! [`lapsed_hand_over_stays_spent`] proves that a hand-over that lapsed unconfirmed keeps its
//! attempt spent for the horizon from the lapse. Run it in a test of its own (it mostly
//! sleeps: beside a long test, it costs little time).
//!
//! Beside the suite, [`check_against_model`] runs seeded random schedules of several owners
//! and attempts (with re-sent requests, cancellations and expiries) against a reference model
//! of one lock, and names the first disagreement with its seed; see `docs/backends.md`.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::info;

use crate::backend::LockBackend;

mod attempts;
mod cancel;
mod clauses;
mod eviction;
mod exclusion;
mod fencing;
mod fifo;
mod instances;
mod introspection;
mod invalid;
mod leases;
mod lossy;
mod model;
mod release;
mod support;
mod timeouts;

pub use attempts::{
    attempts_of_one_owner_are_independent, lost_grant_reply_leaves_no_level,
    nested_lock_after_hand_over, one_lease_per_hold, shared_handle_counts_each_guard, LostReplies,
};
pub use cancel::{cancel_at_grant_time_leaves_nothing, cancelled_waits_leave_nothing};
pub use clauses::{
    lapsed_hand_over_stays_spent, list_ignores_dead_waiters, pending_grant_lasts_the_waiter_ttl,
    pending_level_lapses_beside_a_reentry, reentry_lengthens_the_lease, resends_are_harmless,
    Resend,
};
pub use eviction::{dead_waiters_are_evicted, mass_death_blocks_nobody};
pub use exclusion::{mutual_exclusion, reentrancy};
pub use fencing::fencing_tokens_increase;
pub use fifo::{
    fifo_order, hand_over, heartbeat_keeps_place_and_grantee_confirms, try_lock_never_barges,
};
pub use instances::{
    instances_share_state, shared_owner_hears_grants_in_every_instance, OpenBackend, Spread,
};
pub use introspection::{list_shows_held_and_waited, state_matches_reality};
pub use invalid::invalid_input_is_rejected;
pub use leases::{
    expired_hold_stays_ended, lease_expiry_frees_lock, lease_lost_signal, watchdog_keeps_lock,
};
pub use lossy::{lost_wakeups_still_progress, LossyWakeups};
pub use model::{check_against_model, seeds_from_env, ModelClock, ModelConfig};
pub use release::{abandoned_attempts_stay_ended, force_release, release_by_non_owner};
pub use timeouts::wait_timeout_leaves_queue;

/// How long one check may take before it counts as failed (hung).
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(120);

/// How many instances [`run_all`] opens and spreads owners over.
pub const INSTANCES: usize = 3;

/// The outcome of [`run_checks`]: each check's name, and why it failed if it did.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct Report {
    /// Checks that passed.
    pub passed: Vec<&'static str>,
    /// Checks that failed, with their panic message (or "timed out").
    pub failed: Vec<(&'static str, String)>,
}

impl Report {
    /// Panics with every failure if any check failed.
    ///
    /// # Panics
    /// If a check failed.
    #[track_caller]
    pub fn assert_passed(&self) {
        if !self.failed.is_empty() {
            let lines: Vec<String> = self
                .failed
                .iter()
                .map(|(check, why)| format!("- {check}: {why}"))
                .collect();
            panic!(
                "{} of {} fairlock conformance checks failed:\n{}",
                self.failed.len(),
                self.failed.len() + self.passed.len(),
                lines.join("\n")
            );
        }
    }
}

/// The future of one check.
pub type CheckFuture = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// One check: it runs on the backend it is given and panics on a violation.
pub type Check = fn(Arc<dyn LockBackend>) -> CheckFuture;

/// Every check of the suite that runs on one backend, by name, as functions of the backend
/// they run on. Not listed: [`instances_share_state`] and
/// [`shared_owner_hears_grants_in_every_instance`], which open instances themselves (they
/// take an [`OpenBackend`]); [`run_checks`] runs them too.
pub fn checks() -> Vec<(&'static str, Check)> {
    macro_rules! list {
        ($($check:ident),* $(,)?) => {
            vec![$((stringify!($check), (|backend| Box::pin($check(backend))) as Check)),*]
        };
    }
    list!(
        mutual_exclusion,
        reentrancy,
        shared_handle_counts_each_guard,
        nested_lock_after_hand_over,
        attempts_of_one_owner_are_independent,
        one_lease_per_hold,
        lost_grant_reply_leaves_no_level,
        reentry_lengthens_the_lease,
        pending_grant_lasts_the_waiter_ttl,
        pending_level_lapses_beside_a_reentry,
        list_ignores_dead_waiters,
        resends_are_harmless,
        fifo_order,
        try_lock_never_barges,
        hand_over,
        heartbeat_keeps_place_and_grantee_confirms,
        wait_timeout_leaves_queue,
        lease_expiry_frees_lock,
        watchdog_keeps_lock,
        lease_lost_signal,
        expired_hold_stays_ended,
        dead_waiters_are_evicted,
        mass_death_blocks_nobody,
        force_release,
        release_by_non_owner,
        abandoned_attempts_stay_ended,
        fencing_tokens_increase,
        cancelled_waits_leave_nothing,
        cancel_at_grant_time_leaves_nothing,
        lost_wakeups_still_progress,
        state_matches_reality,
        list_shows_held_and_waited,
        invalid_input_is_rejected,
    )
}

/// Runs every check and reports each one's outcome, without stopping at the first failure.
///
/// It opens [`INSTANCES`] instances with `open` and runs each check through a [`Spread`] of
/// them, so contenders, hand-overs and wake-ups cross instances as they cross processes; and
/// it checks that separately opened instances share their locks
/// ([`instances_share_state`]) and that an owner waiting through several of them hears of its
/// grants in each ([`shared_owner_hears_grants_in_every_instance`]). Each check runs in its own task, bounded by
/// [`CHECK_TIMEOUT`]. Call it inside a multi-thread Tokio runtime.
pub async fn run_checks(open: impl OpenBackend) -> Report {
    run_checks_within(open, CHECK_TIMEOUT).await
}

/// [`run_checks`] with another bound on each check (a check that takes longer fails).
pub async fn run_checks_within(open: impl OpenBackend, per_check: Duration) -> Report {
    let open: Arc<dyn OpenBackend> = Arc::new(open);
    let mut instances = Vec::with_capacity(INSTANCES);
    for _ in 0..INSTANCES {
        instances.push(open.open().await);
    }
    let spread: Arc<dyn LockBackend> = Arc::new(Spread::new(instances));
    let mut report = Report::default();
    let run = |name: &'static str, future: CheckFuture| async move {
        let started = Instant::now();
        let task = tokio::spawn(future);
        let abort = task.abort_handle();
        let outcome = match tokio::time::timeout(per_check, task).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(join)) if join.is_panic() => Err(panic_message(join.into_panic())),
            Ok(Err(join)) => Err(format!("the check's task ended: {join}")),
            Err(_) => {
                abort.abort();
                Err(format!("timed out after {per_check:?}"))
            }
        };
        info!(
            check = name,
            elapsed_ms = started.elapsed().as_millis() as u64,
            ok = outcome.is_ok(),
            "fairlock conformance check"
        );
        (name, outcome)
    };
    let mut outcomes = vec![
        run(
            "instances_share_state",
            Box::pin(instances_share_state(open.clone())),
        )
        .await,
        run(
            "shared_owner_hears_grants_in_every_instance",
            Box::pin(shared_owner_hears_grants_in_every_instance(open.clone())),
        )
        .await,
    ];
    for (name, check) in checks() {
        outcomes.push(run(name, check(spread.clone())).await);
    }
    for (name, outcome) in outcomes {
        match outcome {
            Ok(()) => report.passed.push(name),
            Err(why) => report.failed.push((name, why)),
        }
    }
    report
}

/// Runs every check ([`run_checks`]) and panics listing every check that failed.
///
/// # Panics
/// If any check failed.
pub async fn run_all(open: impl OpenBackend) {
    run_checks(open).await.assert_passed();
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(message) => *message,
        Err(payload) => match payload.downcast::<&'static str>() {
            Ok(message) => (*message).to_owned(),
            Err(_) => "a panic without a message".to_owned(),
        },
    }
}
