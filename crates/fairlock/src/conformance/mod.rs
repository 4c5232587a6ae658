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
//! ```
//!
//! ```no_run
//! use std::sync::Arc;
//! use fairlock::MemoryBackend; // your backend here
//!
//! #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
//! async fn conformance() {
//!     fairlock::conformance::run_all(Arc::new(MemoryBackend::new())).await;
//! }
//! ```
//!
//! Every check is also public on its own, named for the behaviour it proves, so a failure can
//! be rerun alone. A check panics with a message that names it and what was seen.
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
//! | [`shared_handle_counts_each_guard`] | two tasks sharing a handle get one level each when the lock reaches them |
//! | [`nested_lock_after_hand_over`] | a nested `lock()` right after a hand-over is a second level, not the confirmation |
//! | [`attempts_of_one_owner_are_independent`] | one attempt's timeout never costs another attempt of the owner its place |
//! | [`one_lease_per_hold`] | a nested guard's `extend` never shortens the hold's lease, and counts for every guard |
//! | [`lost_grant_reply_leaves_no_level`] | a grant whose reply was lost (through [`LostReplies`]) leaves no phantom level |
//! | [`fifo_order`] | waiters are listed and granted in exactly the order they queued |
//! | [`try_lock_never_barges`] | `try_lock` fails while held with waiters, and when a lease ran out under a live waiter |
//! | [`hand_over`] | a release wakes the head waiter and hands it the lock (pending grant) or leaves it free for it |
//! | [`wait_timeout_leaves_queue`] | `try_lock_for` times out, leaves the queue, and delays no one |
//! | [`lease_expiry_frees_lock`] | an unrenewed lease ends the hold; the waiter proceeds, not earlier |
//! | [`watchdog_keeps_lock`] | the watchdog keeps a lock over several leases |
//! | [`lease_lost_signal`] | `extend` postpones the lost-lease signal, which fires when the lease ends |
//! | [`dead_waiters_are_evicted`] | a waiter that stops heart-beating blocks nobody, at the head or in the middle |
//! | [`force_release`] | force release frees the lock, hands it to the head waiter, reports whether it was held |
//! | [`release_by_non_owner`] | release/extend with the wrong owner or token is refused and changes nothing |
//! | [`fencing_tokens_increase`] | tokens increase across holders, expiry, force release and cleanup |
//! | [`cancelled_waits_leave_nothing`] | waits dropped at random times leave no waiter and no hold |
//! | [`cancel_at_grant_time_leaves_nothing`] | a wait dropped as the lock is handed to it gives the lock back |
//! | [`lost_wakeups_still_progress`] | with every wake-up lost, a waiter gets the lock within a heartbeat |
//! | [`state_matches_reality`] | `state()` shows holder, count, token, lease and waiters as they are |
//! | [`list_shows_held_and_waited`] | `list(prefix)` shows held and waited locks, not free ones |
//! | [`invalid_input_is_rejected`] | bad names, durations and waits fail with `InvalidArgument` and touch nothing |

use std::sync::Arc;

use tokio::time::Instant;
use tracing::info;

use crate::backend::LockBackend;

mod attempts;
mod cancel;
mod eviction;
mod exclusion;
mod fencing;
mod fifo;
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
pub use eviction::dead_waiters_are_evicted;
pub use exclusion::{mutual_exclusion, reentrancy};
pub use fencing::fencing_tokens_increase;
pub use fifo::{fifo_order, hand_over, try_lock_never_barges};
pub use introspection::{list_shows_held_and_waited, state_matches_reality};
pub use invalid::invalid_input_is_rejected;
pub use leases::{lease_expiry_frees_lock, lease_lost_signal, watchdog_keeps_lock};
pub use lossy::{lost_wakeups_still_progress, LossyWakeups};
pub use model::{check_against_model, seeds_from_env, ModelClock, ModelConfig};
pub use release::{force_release, release_by_non_owner};
pub use timeouts::wait_timeout_leaves_queue;

/// Runs every check of the suite on `backend`, one after the other; panics at the first
/// violation. Call it from a test on a multi-thread Tokio runtime (see the [module
/// docs](self)).
pub async fn run_all(backend: Arc<dyn LockBackend>) {
    macro_rules! run {
        ($($check:ident),* $(,)?) => {$(
            let started = Instant::now();
            $check(backend.clone()).await;
            info!(check = stringify!($check), elapsed_ms = started.elapsed().as_millis() as u64, "fairlock conformance check passed");
        )*};
    }
    run!(
        mutual_exclusion,
        reentrancy,
        shared_handle_counts_each_guard,
        nested_lock_after_hand_over,
        attempts_of_one_owner_are_independent,
        one_lease_per_hold,
        lost_grant_reply_leaves_no_level,
        fifo_order,
        try_lock_never_barges,
        hand_over,
        wait_timeout_leaves_queue,
        lease_expiry_frees_lock,
        watchdog_keeps_lock,
        lease_lost_signal,
        dead_waiters_are_evicted,
        force_release,
        release_by_non_owner,
        fencing_tokens_increase,
        cancelled_waits_leave_nothing,
        cancel_at_grant_time_leaves_nothing,
        lost_wakeups_still_progress,
        state_matches_reality,
        list_shows_held_and_waited,
        invalid_input_is_rejected,
    );
}
