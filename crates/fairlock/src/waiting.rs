//! Waiting for a lock: the one acquire loop every backend shares, and what cancelling it undoes.
//!
//! The loop: one `acquire` that does not queue (the uncontended case ends there, in one round
//! trip); if that is refused, register for wake-ups (before queueing, so no wake-up between
//! the check and the registration is missed), then call `acquire` until granted. Between
//! calls it waits for a wake-up, the backend's `retry_after` hint, or the heartbeat
//! (`waiter_ttl / 3`), whichever comes first; each call refreshes the waiter's liveness deadline, so a lost wake-up costs at
//! most one heartbeat.
//!
//! A handle that had to wait less than a second ago skips the call that does not queue: its lock
//! is likely still contended, and its wake-up registration likely still stands.
//!
//! Each call of `lock()` / `try_lock*()` is one attempt with its own [`AttemptId`]: its queue
//! entry, pending grant and level belong to it, not to the owner, so attempts of one owner
//! never affect each other.
//!
//! Cancellation: an attempt that ends without a guard (dropped, timed out, failed) is
//! abandoned in the background: the store removes whatever it has (queue entry, pending
//! grant, or a level granted by a call whose reply never came) and remembers that it ended,
//! so a request of it that arrives later changes nothing. So an `acquire` call needs no task
//! of its own: dropping it halfway is undone the same way.
//!
//! Memory: a waiting caller's future lives as long as it waits, and a process may have tens of
//! thousands of them, so what it holds while it waits is kept small. A future is as large as
//! its largest state, so the steps that last a moment (a call to the store, giving up after a
//! timeout, a pause in an outage) are boxed: they take their memory when they run, not for
//! the whole wait. `tests/future_size.rs` keeps the bound.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, timeout_at, Instant};
use tracing::{debug, info_span, warn, Instrument};

use crate::backend::{AcquireOutcome, AcquireRequest, AttemptId, Grant, Wake};
use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::levels::{LevelTicket, Stale};
use crate::lock::LockShared;
use crate::telemetry::{acquire_outcome, Acquiring, Waiting};

/// How long a caller is prepared to wait.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Wait {
    /// Try once; never queue.
    No,
    /// Wait as long as it takes.
    Forever,
    /// Wait at most this long.
    AtMost(Duration),
}

/// A wait that ends while a call to the store has gone unanswered this long (or a quarter of
/// the wait, if that is longer: a slow but healthy store is not a failed one) is reported as
/// the store's failure ([`Error::Unavailable`]), not as a busy lock ([`Error::Timeout`]).
// 250 ms: on a loaded 2-core machine a healthy store took over 100 ms to answer now and then
// (cancel_storm.rs failed 1 run in 3 with 100 ms).
const STORE_SILENCE: Duration = Duration::from_millis(250);

/// How much longer than its `wait` a `try_lock_for` that timed out may take, to leave the queue
/// before it returns; past that, leaving goes on in the background.
pub(crate) const TIMEOUT_SLACK: Duration = Duration::from_millis(50);

/// A pending hand-over is trusted without a round trip only if this much of its guaranteed
/// life is left; otherwise the waiter confirms it with `acquire` first. Covers clock-rate drift.
const HANDOVER_MARGIN_DIVISOR: u32 = 10;

pub(crate) async fn acquire(shared: &Arc<LockShared>, wait: Wait) -> Result<LockGuard> {
    let runtime = Handle::try_current().map_err(|_| Error::NoRuntime)?;
    let started = Instant::now();
    let deadline = match wait {
        Wait::No | Wait::AtMost(Duration::ZERO) | Wait::Forever => None,
        Wait::AtMost(wait) => Some(started + wait),
    };
    let waits = !matches!(wait, Wait::No | Wait::AtMost(Duration::ZERO));
    // The attempt lives here, not in `acquire_inner`'s future, which borrows it: one copy of
    // it in the waiting future, not two (an async fn keeps its arguments apart from its
    // locals).
    let mut attempt = Attempt::new(shared.clone(), runtime, started, deadline);
    let span = info_span!(
        "fairlock.acquire",
        lock = %shared.name,
        owner = %shared.owner,
        attempt = %attempt.id,
        token = tracing::field::Empty
    );
    // Counted as `cancelled` if this future is dropped before the outcome is known.
    let acquiring = Acquiring::start(&shared.meter, started);
    let result = acquire_inner(&mut attempt, waits)
        .instrument(span.clone())
        .await;
    acquiring.finish(acquire_outcome(
        &result,
        result.as_ref().ok().map(LockGuard::hold_count),
    ));
    let _enter = span.enter();
    match &result {
        Ok(guard) => {
            span.record("token", guard.fencing_token());
            debug!(
                waited_us = started.elapsed().as_micros() as u64,
                token = guard.fencing_token(),
                hold_count = guard.hold_count(),
                "acquired"
            )
        }
        Err(err) => {
            debug!(waited_us = started.elapsed().as_micros() as u64, error = %err, "not acquired")
        }
    }
    result
}

/// The acquire loop, for `attempt`; `waits`: the caller is prepared to queue.
async fn acquire_inner(attempt: &mut Attempt, waits: bool) -> Result<LockGuard> {
    let shared = &attempt.shared.clone();

    // First a call that never queues: a free lock with nobody waiting is granted in one round
    // trip, without registering for wake-ups. Only a caller that must wait registers, and it
    // does so before the call that queues it, so no wake-up can slip between the two. A
    // caller that waits rides out a store that fails transiently, within its outage budget.
    //
    // Except when a call through this handle had to wait a moment ago: the lock is then likely
    // still contended, so the call that does not queue would most likely be refused, and the
    // wake-up registration most likely still stands (backends keep it a while after its last
    // waiter). Registering and queueing at once then saves a call per acquisition; a lock that
    // turned free meanwhile is granted by the queueing call all the same.
    let skip_try = waits && waited_recently(shared);
    // A grant found stale (see `levels.rs`) is not used: a call that does not wait tries
    // once more, as a fresh attempt.
    let mut stale_tries = 0;
    if !skip_try {
        loop {
            let first = loop {
                // The failure is taken out of a block, so the call's result is not kept
                // across the pause (see "Memory").
                let err = {
                    let Some(result) = attempt.call_before(false).await else {
                        return attempt.timed_out().await;
                    };
                    match result {
                        Err(err) if waits && is_outage(&err) => err,
                        other => break other?,
                    }
                };
                if let Some(end) = attempt
                    .ride_out(err, Some("the store failed; trying again"))
                    .await
                {
                    return end;
                }
            };
            attempt.failing = false;
            attempt.outage.succeeded();
            if let (AcquireOutcome::Granted(grant), proven) = first {
                let Some(stale) = unusable(attempt, grant, waits).await else {
                    return attempt.timed_out().await;
                };
                if let Some(grant) = stale? {
                    let until = proven + shared.options.effective_lease();
                    return Ok(attempt.hold(grant, until, false));
                }
                // Freed (or not to be used yet). A waiting caller queues now, behind those the
                // hold went to.
                stale_tries += 1;
                if !waits && stale_tries == 1 {
                    continue;
                }
            }
            if !waits {
                return Err(Error::WouldBlock {
                    name: shared.name.to_string(),
                });
            }
            break;
        }
    }

    // From here on the caller waits: counted in `fairlock_waiting` until it returns.
    let _waiting = Waiting::start(&shared.meter);
    let mut watch = loop {
        let err = {
            let watching = shared.backend.watch(&shared.name, &shared.owner);
            let watched = match attempt.deadline {
                None => watching.await,
                // Boxed: a moment's step (see "Memory" in the module docs).
                Some(deadline) => match Box::pin(timeout_at(deadline, watching)).await {
                    Ok(watched) => watched,
                    Err(_elapsed) => return attempt.timed_out().await,
                },
            };
            match watched {
                Ok(watch) => break watch,
                Err(err) if is_outage(&err) => err,
                Err(err) => return Err(err),
            }
        };
        if let Some(end) = attempt.ride_out(err, None).await {
            return end;
        }
    };
    attempt.failing = false;
    attempt.outage.succeeded();
    let mut watch_open = true;
    let mut renewed = 0;
    // Whether a call of this wait was queued (or refused, without `skip_try`): a grant after
    // that is a hand-over found by looking again, not a free lock.
    let mut waited = !skip_try;
    loop {
        let sent = Instant::now();
        // In a block of its own, so the outcome is not kept while waiting (see "Memory").
        let (retry_after, last_token) = {
            let Some(outcome) = attempt.call_before(true).await else {
                return attempt.timed_out().await;
            };
            let outcome = match outcome {
                // The store failed: try again soon as the same attempt, so the place in the queue
                // is kept if the store is back within the waiter TTL.
                Err(err) if is_outage(&err) => {
                    if let Some(end) = attempt
                        .ride_out(err, Some("the store failed while waiting; trying again"))
                        .await
                    {
                        return end;
                    }
                    continue;
                }
                other => other?,
            };
            // A spent attempt right after a failed call is the backend having ended it (a grant
            // it could not stand behind, e.g. unacknowledged by replicas): still the same outage,
            // and no sign of a backend refusing fresh attempts.
            let after_outage = attempt.failing;
            attempt.failing = false;
            if !(after_outage && matches!(outcome, (AcquireOutcome::Busy, _))) {
                attempt.outage.succeeded();
            }
            match outcome {
                (AcquireOutcome::Granted(grant), proven) => {
                    let grant = match unusable(attempt, grant, waits).await {
                        None => return attempt.timed_out().await,
                        Some(Ok(Some(grant))) => grant,
                        // Freed (or not to be used yet): ask anew, behind those a freed hold
                        // went to.
                        Some(Ok(None)) => continue,
                        Some(Err(err)) => return Err(err),
                    };
                    if waited {
                        if grant.hold_count == 1 {
                            shared.meter.handover("recheck");
                        }
                        note_wait(shared);
                    }
                    return Ok(attempt.hold(
                        grant,
                        proven + shared.options.effective_lease(),
                        false,
                    ));
                }
                (
                    AcquireOutcome::Queued {
                        retry_after,
                        last_token,
                    },
                    _,
                ) => (retry_after, last_token),
                // This attempt is spent: a grant made to it ended before we took it (a hand-over
                // that lapsed, a grant whose reply was lost and whose lease ran out). Go on as a
                // fresh attempt, at the tail of the queue.
                (AcquireOutcome::Busy, _) => {
                    if !after_outage {
                        renewed += 1;
                    }
                    if renewed > MAX_RENEWALS {
                        // A fresh attempt cannot be spent: the backend breaks its contract.
                        return Err(Error::Backend {
                            backend: "fairlock",
                            source: "the backend refused fresh attempts to queue".into(),
                        });
                    }
                    attempt.renew();
                    continue;
                }
            }
        };
        renewed = 0;
        waited = true;
        note_wait(shared);
        let mut next_check = sent + heartbeat(shared);
        if let Some(back_at) = retry_after.and_then(|after| Instant::now().checked_add(after)) {
            next_check = next_check.min(back_at);
        }
        // Our place is kept by the store until at least `sent + ttl`, and a hand-over made to
        // us lasts `ttl` from when it was made, which is later still.
        let ttl = shared.options.waiter_ttl;
        let handover_safe_until = sent + ttl - ttl / HANDOVER_MARGIN_DIVISOR;
        // One timer for both: the next check, or the deadline if that comes first.
        let timer = attempt
            .deadline
            .map_or(next_check, |deadline| deadline.min(next_check));
        let timed_out = attempt
            .deadline
            .is_some_and(|deadline| deadline < next_check);
        loop {
            tokio::select! {
                biased;
                wake = watch.recv(), if watch_open => match wake {
                    // Handed to another attempt of our owner: we can re-enter now.
                    Some(Wake::Granted { attempt: other, .. }) if other != attempt.id => break,
                    // A token not above `last_token` is from a hand-over made before our
                    // last call, which would have been granted then: it was revoked since.
                    Some(Wake::Granted { grant, .. }) if grant.token <= last_token => {}
                    Some(Wake::Granted { grant, .. }) => {
                        // Unless a call of ours may still land: it could confirm the
                        // hand-over, counting the lease from then, and only our own
                        // `acquire` knows how to count from that call.
                        if Instant::now() < handover_safe_until
                            && attempt.unknown_since.is_none()
                        {
                            shared.meter.handover("wakeup");
                            note_wait(shared);
                            return Ok(attempt.hold(grant, handover_safe_until, true));
                        }
                        // Too old to trust without asking: `acquire` confirms it if still ours.
                        break;
                    }
                    Some(Wake::Recheck) => break,
                    None => watch_open = false,
                },
                () = sleep_until(timer) => {
                    if timed_out {
                        return attempt.timed_out().await;
                    }
                    break;
                }
            }
        }
    }
}

/// How long a grant that may include a stale level waits for the handle's releases and
/// abandons on their way before it is judged (see `levels.rs`).
const FINISHING_PATIENCE: Duration = Duration::from_secs(1);

/// How many times a grant is counted again because tickets of the handle were dropped around
/// its call (a release or abandon finished) or releases were on their way; each count is one
/// more call, and another task of the handle would have to end a call during each. Past that
/// a grant those may explain is not used (see `unusable`).
const RECOUNTS: usize = 3;

/// The grant to use, or `Ok(None)` if `grant`, just made to `attempt`, must not be used: its
/// hold includes a level of this handle's owner that nobody will release (see `levels.rs`).
/// Then, if the attempt is the handle's only call, frees that hold (it goes to the owner
/// waiting first) and renews the attempt, and the caller queues anew. A grant with a stale
/// level found while other calls of the handle are under way is used (freeing it would take
/// their levels too). A handed-out owner's grant of a hold this handle set out to free is
/// neither used nor freed while a force release of it may still land: the attempt is renewed
/// and, after a pause, the caller asks anew (`Stale::Wait`).
/// Waiting callers ride out a failing store within the outage budget, others do not; no
/// caller waits past the attempt's deadline (`None` when it is reached: the caller times
/// out). Boxed: it runs once per grant (see "Memory" in the module docs).
fn unusable(
    attempt: &mut Attempt,
    grant: Grant,
    waits: bool,
) -> BoxedStep<'_, Option<Result<Option<Grant>>>> {
    Box::pin(async move {
        let shared = &attempt.shared.clone();
        let deadline = attempt.deadline;
        let mut grant = grant;
        let mut recounts = 0;
        let stale = loop {
            // What is left of the wait, each time: a later pass must not wait past it.
            let waited = shared
                .levels
                .recount(grant.hold_count, attempt.finishing_patience())
                .await;
            if !waited || recounts == RECOUNTS {
                // Tickets dropped since the call was sent may have taken their levels away
                // after the store counted them: counted again, as often as allowed; past
                // that, a count they may explain is neither used nor freed (`Unsure`).
                let may_recount = recounts < RECOUNTS;
                match shared.levels.check(
                    grant.token,
                    grant.hold_count,
                    attempt.dropped_at_send,
                    may_recount,
                ) {
                    Stale::Recount => {}
                    stale => break stale,
                }
            }
            recounts += 1;
            // Count again now that the handle's releases are done: the same attempt asked
            // again gets the same grant and the hold's current count (the store changes
            // nothing). Within the deadline like every call of the attempt.
            match attempt.call_before(false).await? {
                Ok((AcquireOutcome::Granted(again), _)) if again.token == grant.token => {
                    grant = again
                }
                // The grant ended meanwhile, or the store failed: queue anew.
                _ => {
                    attempt.renew();
                    return Some(Ok(None));
                }
            }
        };
        match stale {
            Stale::No => Some(Ok(Some(grant))),
            // (`Recount` comes only while allowed, and the loop then counts again.)
            Stale::Unsure | Stale::Recount => {
                debug!(
                    token = grant.token,
                    hold_count = grant.hold_count,
                    "calls of this handle keep ending around its counts; starting over"
                );
                // The fresh attempt's first count must not find this one's level, or its
                // abandon on the way (a ticket still counted): wait for it, within the wait.
                attempt.renew_awaiting_cleanup().await;
                Some(Ok(None))
            }
            Stale::Wait => {
                debug!(
                    token = grant.token,
                    "a force release of this handle may still free this hold; asking again later"
                );
                attempt.renew_awaiting_cleanup().await;
                if waits && !pause_before(DOOMED_RECHECK, deadline).await {
                    return None;
                }
                Some(Ok(None))
            }
            Stale::Kept => {
                debug!(
                    token = grant.token,
                    hold_count = grant.hold_count,
                    "the hold has a level nobody will release; other calls are under way, so it stays"
                );
                Some(Ok(Some(grant)))
            }
            Stale::Free(freeing) => {
                warn!(
                    lock = %shared.name,
                    owner = %shared.owner,
                    token = grant.token,
                    hold_count = grant.hold_count,
                    "fairlock: the hold has a level this handle no longer has (a release or abandon \
                     the store lost or never got); freeing that hold instead of re-entering it"
                );
                // The attempt's own level goes with the hold; its id is spent.
                attempt.renew();
                let budget = if waits {
                    shared.options.outage_budget
                } else {
                    Duration::ZERO
                };
                let releasing = retry_within(budget, || {
                    shared.backend.force_release(&shared.name, grant.token)
                });
                let freed = before(deadline, releasing).await?;
                // Answered, the hold is gone; otherwise the force release may still land
                // (see `levels.rs`).
                if let Ok(was_freed) = freed {
                    freeing.answered();
                    if was_freed {
                        // Guards of this client that re-entered the hold meanwhile (handles
                        // sharing the owner) learn it now, as after `force_unlock`.
                        shared
                            .holds
                            .revoke(&shared.name, shared.owner.as_str(), grant.token);
                    }
                }
                // A failure is returned as it is: the token stays doomed (with the owner handed
                // out, unused for the resend horizon), so retrying would only find the same
                // hold again while the store refuses to free it.
                Some(freed.map(|_| None))
            }
        }
    })
}

/// `step`'s output, or `None` if `deadline` passes first.
async fn before<F: Future>(deadline: Option<Instant>, step: F) -> Option<F::Output> {
    match deadline {
        None => Some(step.await),
        Some(deadline) => timeout_at(deadline, step).await.ok(),
    }
}

/// How long a call waits before asking again for a hold a force release of its handle may
/// still free (see `Stale::Wait`).
const DOOMED_RECHECK: Duration = Duration::from_secs(1);

/// How often a waiter calls the store again without a wake-up: its heartbeat.
fn heartbeat(shared: &LockShared) -> Duration {
    shared.options.waiter_ttl / 3
}

/// How long after a call through a handle had to wait the next call through it registers and
/// queues at once, skipping the call that does not queue. Shorter than the Redis backend's
/// wake-up linger (2 s by default), so the registration usually costs no round trip.
const RECENT_WAIT: Duration = Duration::from_secs(1);

fn waited_recently(shared: &LockShared) -> bool {
    let last = *shared.last_wait.lock().unwrap_or_else(|p| p.into_inner());
    last.is_some_and(|at| at.elapsed() < RECENT_WAIT)
}

fn note_wait(shared: &LockShared) {
    *shared.last_wait.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
}

/// How many times in a row a waiting call may find its attempt spent before the backend is
/// deemed broken (a fresh attempt is never spent).
const MAX_RENEWALS: u32 = 3;

/// A grant whose reply took longer than this share of the lease is confirmed with an `extend`
/// before it is handed out (see [`acquire_fresh`]).
const LATE_GRANT_DIVISOR: u32 = 3;

/// `acquire`, returning with the outcome the moment from which a grant's lease is counted
/// locally (the guard's deadline is that moment plus the lease).
///
/// That moment is when the request was sent: the store may have granted it at once and the
/// reply been slow. So a reply that took long (a store paused, restarted or unreachable for a
/// while, its client holding the request until it could be sent) would give a guard whose
/// lease had run out, or nearly, before the caller even saw it: `lease_lost()` would fire at
/// once although the store had just granted a full lease. Instead, a late grant is renewed
/// with `extend` first, and counted from that request. If the store no longer has it, the outcome
/// is "look again" (queued, with nothing to wait for); if the store cannot be asked, the error
/// is returned and abandoning the attempt gives the grant back.
async fn acquire_fresh(
    shared: &LockShared,
    request: &AcquireRequest,
    unknown_since: Option<Instant>,
) -> Result<(AcquireOutcome, Instant)> {
    // A grant found by this call may have been made by an earlier call of the attempt whose
    // reply never came (the store answers a repeated call with the same grant and does not
    // lengthen it): its lease is counted from that earlier call.
    let sent = unknown_since.unwrap_or_else(Instant::now);
    let outcome = shared.backend.acquire(request).await?;
    let AcquireOutcome::Granted(grant) = outcome else {
        return Ok((outcome, sent));
    };
    if sent.elapsed() <= request.lease / LATE_GRANT_DIVISOR {
        return Ok((AcquireOutcome::Granted(grant), sent));
    }
    let resent = Instant::now();
    let extended = shared
        .backend
        .extend(&shared.name, &shared.owner, grant.token, request.lease)
        .await;
    match extended {
        Ok(true) => {
            debug!(token = grant.token, "a late grant was renewed before use");
            Ok((AcquireOutcome::Granted(grant), resent))
        }
        Ok(false) => {
            debug!(
                token = grant.token,
                "a late grant had already ended; looking again"
            );
            let again = AcquireOutcome::Queued {
                retry_after: Some(Duration::ZERO),
                last_token: grant.token,
            };
            Ok((again, sent))
        }
        // The attempt is abandoned on the way out, which gives the grant back.
        Err(err) => Err(err),
    }
}

/// One caller's attempt in progress, and what must be undone if it ends without a guard.
struct Attempt {
    shared: Arc<LockShared>,
    runtime: Handle,
    id: AttemptId,
    /// When the caller called.
    started: Instant,
    /// When the caller gives up, if it does.
    deadline: Option<Instant>,
    /// How long the store has been failing, for a caller that rides it out.
    outage: Outage,
    /// A call was sent: the store may know this attempt (queued, pending, or granted by a
    /// call whose reply we never saw), so ending without a guard must abandon it.
    sent: bool,
    /// When the call in flight was sent, while one is.
    calling_since: Option<Instant>,
    /// The last call failed transiently (the store is down or failing over).
    failing: bool,
    /// When the earliest call whose outcome is unknown (it failed or was given up) was sent:
    /// a grant found by any later call of the attempt may be its (it may land after them),
    /// and its lease started then.
    unknown_since: Option<Instant>,
    finished: bool,
    /// Counts this attempt among the levels the handle may have, until it and its clean-up
    /// (or its guard and release) are done with the store.
    ticket: LevelTicket,
    /// How many of the handle's tickets had been dropped when the last call was sent (see
    /// `OwnLevels::check`).
    dropped_at_send: u64,
}

impl Attempt {
    fn new(
        shared: Arc<LockShared>,
        runtime: Handle,
        started: Instant,
        deadline: Option<Instant>,
    ) -> Self {
        Attempt {
            outage: Outage::new(shared.options.outage_budget, heartbeat(&shared)),
            ticket: shared.levels.register(),
            dropped_at_send: 0,
            shared,
            runtime,
            id: AttemptId::random(),
            started,
            deadline,
            sent: false,
            calling_since: None,
            failing: false,
            unknown_since: None,
            finished: false,
        }
    }

    /// One `acquire` call, with the moment the request that proves a grant's lease was sent
    /// (see [`acquire_fresh`]). If this future is dropped halfway, abandoning the attempt
    /// undoes whatever the call did.
    async fn call(&mut self, queue: bool) -> Result<(AcquireOutcome, Instant)> {
        let request = AcquireRequest {
            name: self.shared.name.clone(),
            owner: self.shared.owner.clone(),
            attempt: self.id,
            lease: self.shared.options.effective_lease(),
            waiter_ttl: self.shared.options.waiter_ttl,
            queue,
        };
        self.sent = true;
        self.dropped_at_send = self.shared.levels.dropped();
        let sent = Instant::now();
        self.calling_since = Some(sent);
        // If this future is dropped here, `calling_since` stays: the outcome is unknown.
        let outcome = acquire_fresh(&self.shared, &request, self.unknown_since).await;
        self.calling_since = None;
        match &outcome {
            // The call may or may not have been applied: a grant it made counts from now on.
            Err(err) if is_outage(err) => {
                self.unknown_since.get_or_insert(sent);
            }
            // Kept for the rest of the attempt, whatever later calls answer: the unknown
            // call may still reach the store after them and make the grant they find.
            _ => {}
        }
        outcome
    }

    /// [`Attempt::call`], given up (`None`) if the deadline passes first. Boxed (see
    /// "Memory" in the module docs).
    fn call_before(
        &mut self,
        queue: bool,
    ) -> BoxedStep<'_, Option<Result<(AcquireOutcome, Instant)>>> {
        Box::pin(async move {
            match self.deadline {
                None => Some(self.call(queue).await),
                Some(deadline) => {
                    let outcome = timeout_at(deadline, self.call(queue)).await.ok();
                    if outcome.is_none() {
                        // Given up in flight: its outcome is unknown.
                        if let Some(sent) = self.calling_since {
                            self.unknown_since.get_or_insert(sent);
                        }
                    }
                    outcome
                }
            }
        })
    }

    /// We hold the lock now, surely until `until`: the guard ends the attempt from here on.
    /// `confirm`: the grant is a hand-over the store has not seen confirmed yet.
    fn hold(&mut self, grant: Grant, until: Instant, confirm: bool) -> LockGuard {
        self.finished = true;
        LockGuard::new(
            self.shared.clone(),
            grant,
            self.id,
            until,
            confirm,
            self.runtime.clone(),
            self.ticket.clone(),
        )
    }

    /// Gives up this attempt's id (in the background) and goes on under a fresh one.
    fn renew(&mut self) {
        drop(self.renew_after_cleanup());
    }

    /// How long to wait for the handle's releases and abandons on their way: at most
    /// [`FINISHING_PATIENCE`], and never past the deadline.
    fn finishing_patience(&self) -> Duration {
        self.deadline.map_or(FINISHING_PATIENCE, |deadline| {
            FINISHING_PATIENCE.min(deadline.saturating_duration_since(Instant::now()))
        })
    }

    /// [`renew`](Self::renew), then waits for the old attempt's clean-up (its abandon, which
    /// keeps its ticket counted until done) as long as [`finishing_patience`] allows.
    ///
    /// [`finishing_patience`]: Self::finishing_patience
    async fn renew_awaiting_cleanup(&mut self) {
        if let Some(cleanup) = self.renew_after_cleanup() {
            let _ = tokio::time::timeout(self.finishing_patience(), cleanup).await;
        }
    }

    /// [`renew`](Self::renew), returning the old attempt's clean-up, to wait for.
    fn renew_after_cleanup(&mut self) -> Option<JoinHandle<()>> {
        let cleanup = self.start_cleanup();
        // The clean-up keeps the old ticket until it is done.
        self.ticket = self.shared.levels.register();
        self.id = AttemptId::random();
        self.sent = false;
        self.unknown_since = None;
        self.finished = false;
        tracing::Span::current().record("attempt", tracing::field::display(self.id));
        cleanup
    }

    /// A call failed transiently (the store is unreachable or failing over): pauses before
    /// the next try, logging `log` if given. Returns what the caller must return instead, if
    /// anything: the error once the store has failed for the whole outage budget, or the
    /// time-out if the deadline comes first. Boxed (see "Memory" in the module docs).
    fn ride_out(
        &mut self,
        err: Error,
        log: Option<&'static str>,
    ) -> BoxedStep<'_, Option<Result<LockGuard>>> {
        Box::pin(async move {
            self.failing = true;
            let Some(pause) = self.outage.failed() else {
                return Some(Err(err));
            };
            if let Some(message) = log {
                debug!(error = %err, ?pause, "{message}");
            }
            drop(err);
            if pause_before(pause, self.deadline).await {
                None
            } else {
                Some(self.timed_out().await)
            }
        })
    }

    /// The wait ran out: ends the attempt, and says why. Boxed: it runs once, at the end (see
    /// "Memory" in the module docs).
    fn timed_out(&mut self) -> BoxedStep<'_, Result<LockGuard>> {
        Box::pin(async move {
            // The wait ended while the store had not answered a call for a while: it is the
            // store that failed, not the lock that was busy.
            let wait = self.deadline.map_or(Duration::ZERO, |d| {
                d.saturating_duration_since(self.started)
            });
            let silence = STORE_SILENCE.max(wait / 4);
            let silent = self
                .calling_since
                .map(|since| since.elapsed())
                .filter(|silent| *silent >= silence)
                .or(self.failing.then_some(Duration::ZERO));
            // Leave the queue before reporting, so the caller usually sees a clean state; but a
            // slow store must not stretch the caller's bound by more than a small slack: the
            // clean-up goes on in the background.
            if let Some(cleanup) = self.start_cleanup() {
                let _ = tokio::time::timeout(TIMEOUT_SLACK, cleanup).await;
            }
            let name = &self.shared.name;
            match silent {
                Some(silent) => Err(Error::Unavailable {
                    backend: "fairlock",
                    endpoint: "the lock store".to_owned(),
                    source: if silent.is_zero() {
                        format!(
                            "the store was failing when the wait for lock {:?} ended",
                            name.as_str()
                        )
                    } else {
                        format!(
                            "no answer for {silent:?} when the wait for lock {:?} ended",
                            name.as_str()
                        )
                    }
                    .into(),
                }),
                None => Err(Error::Timeout {
                    name: name.to_string(),
                    waited: self.started.elapsed(),
                }),
            }
        })
    }

    fn start_cleanup(&mut self) -> Option<JoinHandle<()>> {
        if self.finished || !self.sent {
            return None;
        }
        self.finished = true;
        let shared = self.shared.clone();
        let attempt = self.id;
        let ticket = self.ticket.clone();
        let finishing = shared.levels.finishing();
        let span =
            info_span!("fairlock.abandon", lock = %shared.name, owner = %shared.owner, %attempt);
        Some(
            self.runtime.spawn(
                async move {
                    // Removes our queue entry, a hand-over made to us that we never took, or a
                    // grant whose reply we never saw; a request of ours still on its way will
                    // find the attempt ended and change nothing.
                    let abandoned = retry_within(Duration::ZERO, || {
                        shared.backend.abandon(&shared.name, &shared.owner, attempt)
                    })
                    .await;
                    if let Err(err) = abandoned {
                        warn!(
                            lock = %shared.name,
                            owner = %shared.owner,
                            %attempt,
                            error = %err,
                            "fairlock abandoning failed; what the attempt left ends with its TTL or lease"
                        );
                    }
                    drop(ticket);
                    drop(finishing);
                }
                .instrument(span),
            ),
        )
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        drop(self.start_cleanup());
    }
}

/// A waiting caller's view of a failing store: how long it has failed, and the next pause.
struct Outage {
    budget: Duration,
    cap: Duration,
    since: Option<Instant>,
    pause: Duration,
}

impl Outage {
    fn new(budget: Duration, heartbeat: Duration) -> Self {
        Outage {
            budget,
            // Never pause longer than a heartbeat: the place in the queue lasts a waiter TTL.
            cap: heartbeat.clamp(Duration::from_millis(10), Duration::from_secs(1)),
            since: None,
            pause: FIRST_RETRY_PAUSE,
        }
    }

    /// A call failed transiently: the pause before the next try, or `None` once the store
    /// has failed for the whole budget.
    fn failed(&mut self) -> Option<Duration> {
        let since = *self.since.get_or_insert_with(Instant::now);
        if since.elapsed() >= self.budget {
            return None;
        }
        let pause = self.pause.min(self.cap);
        self.pause = (self.pause * 2).min(self.cap);
        Some(pause)
    }

    fn succeeded(&mut self) {
        self.since = None;
        self.pause = FIRST_RETRY_PAUSE;
    }
}

/// Sleeps `pause`, or until `deadline` if that is sooner; whether the deadline is still ahead.
async fn pause_before(pause: Duration, deadline: Option<Instant>) -> bool {
    let until = Instant::now() + pause;
    match deadline {
        Some(deadline) if deadline <= until => {
            sleep_until(deadline).await;
            false
        }
        _ => {
            sleep_until(until).await;
            true
        }
    }
}

/// A step of the wait that lasts a moment, boxed so that the waiting future does not carry its
/// state for the whole wait.
type BoxedStep<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// How often a call that is harmless to repeat (`release`, `abandon`) is tried when the store
/// fails transiently, and the first pause between tries (doubling).
const RETRIES: u32 = 5;
const FIRST_RETRY_PAUSE: Duration = Duration::from_millis(50);

/// Runs `call` until it succeeds, fails for good, or the store has failed for `budget`
/// (an outage, such as a failover, is ridden out as `lock()` rides it out; pauses double up to
/// 1 s), trying at least [`RETRIES`] times (with a zero budget: just those, about 0.75 s of
/// pauses in all). Only for calls that are harmless when applied twice.
pub(crate) async fn retry_within<T, F, Fut>(budget: Duration, mut call: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut outage = Outage::new(budget, Duration::from_secs(1));
    let mut tries = 1;
    loop {
        // The pause is worked out in a statement of its own, so the error is gone before the
        // sleep (see "Memory" above).
        let pause = match call().await {
            Err(err) if is_outage(&err) => {
                let pause = match outage.failed() {
                    Some(pause) => pause,
                    // A budget shorter than the few quick retries still gets those.
                    None if tries < RETRIES => FIRST_RETRY_PAUSE * 2u32.pow(tries - 1),
                    None => return Err(err),
                };
                debug!(error = %err, tries, ?pause, "the store failed; trying again");
                pause
            }
            other => return other,
        };
        // Boxed: `unlock()` awaits this, and seldom pauses.
        Box::pin(tokio::time::sleep(pause)).await;
        tries += 1;
    }
}

/// Whether `err` is the store being unreachable or its answer unknown (worth riding out), as
/// opposed to a refusal that will not change by asking again.
pub(crate) fn is_outage(err: &Error) -> bool {
    matches!(err, Error::Unavailable { .. })
}
