//! The conformance suite proves itself: each backend here breaks exactly one MUST of the
//! `LockBackend` contract (a mutant of `MemoryBackend`), and the whole suite must catch it,
//! with the check written for that clause among those that fail. `MemoryBackend` itself
//! passes the same suite (`memory_conformance.rs`). Adding a MUST means adding its mutant.
//!
//! A check counts as catching its mutant only when it fails on the contract, not by running
//! out of time (the runs share two threads), and a faithful wrapper run beside the mutants
//! must pass every check. Checks with no mutant of their own: `invalid_input_is_rejected`
//! (such input never reaches the store), and `lost_wakeups_still_progress`,
//! `nested_lock_after_hand_over` and `lease_lost_signal`, which check the core's waiting and
//! lease handling over the clauses the mutants here break. MUSTs without a mutant, since no
//! check of the suite could see their breach: *Clock* (the suite's instances share one host
//! clock) and *Atomicity* (a check-then-act race shows only by chance, under the contention
//! of `mutual_exclusion` and the model check).

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use fairlock::backend::{
    AcquireOutcome, AcquireRequest, AttemptId, Grant, HolderState, LockBackend, LockState,
    LockSummary, ReleaseOutcome, Wake, Watch, RESEND_HORIZON,
};
use fairlock::conformance::{lapsed_hand_over_stays_spent, run_checks_within, LossyWakeups};
use fairlock::{LockName, MemoryBackend, Owner, Result, MAX_DURATION};

/// One broken clause each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Each instance keeps its own state (in process).
    Unshared,
    /// Queue entries, grants and levels belong to the owner, not the attempt.
    PerOwner,
    /// No wake-up is ever sent.
    NoWakeups,
    /// `abandon` does nothing.
    AbandonIgnored,
    /// The grantee's `acquire` does not confirm its hand-over.
    ConfirmIgnored,
    /// Tokens decrease.
    TokensDecrease,
    /// A heartbeat sends the waiter to the tail.
    HeartbeatToTail,
    /// Spent attempts are forgotten where the owner does not hold: a re-sent acquire of an
    /// attempt that was released or abandoned counts as a new attempt (granted again on a
    /// free lock). (`SpentReenters` is the same where the owner holds.)
    ForgetsSpent,
    /// `force_release` frees whatever hold there is, not the one it names.
    ForceAnyToken,
    /// `try_lock` barges past waiters of a free lock.
    Barging,
    /// Leases never run out.
    EndlessLease,
    /// Waiters never die.
    EndlessWaiters,
    /// `inspect` always reports the holder confirmed.
    InspectConfirmed,
    /// A re-entry does not set the lease from now.
    ReentryKeepsLease,
    /// A pending grant lasts the waiter's lease instead of its liveness TTL.
    PendingLastsLease,
    /// `list` counts waiters that died.
    ListCountsDead,
    /// A hand-over reaches only the instance that made the grantee's request, whatever the
    /// owner (allowed for an `Owner::unique` owner alone).
    InstanceLocalWakeups,
    /// A release sent again after it freed the hold answers `NotHeld`: a lost lease that was
    /// not lost.
    ForgetsReleases,
    /// A release sent again after it found the hold gone answers `Released`: a lost lease
    /// hidden by a retry.
    HidesLostReleases,
    /// A force release sent again after it freed the hold answers `false`.
    ForgetsForceReleases,
    /// A force release sent again after it found nothing answers `true`.
    InventsForceReleases,
    /// An acquire sent again after it was granted answers `Busy` (as for a spent attempt),
    /// not with the grant it holds.
    ForgetsGrants,
    /// An acquire sent again after it was granted answers with the hold count of its first
    /// grant, not the hold's count now.
    StaleGrantCount,
    /// `extend` answers true and extends nothing.
    ExtendIgnored,
    /// `extend` answers true for a hold that is gone: a lost lease hidden.
    ExtendHidesLoss,
    /// An owner's new attempt on the lock it holds is refused (`Busy`): no re-entry.
    ReentryRefused,
    /// `inspect` shows nobody holding and nobody waiting.
    InspectEmpty,
    /// `list` shows no lock.
    ListEmpty,
    /// A release with two or more waiters hands over to the second: the head is sent to the
    /// tail first (as a new entry the waiter's next heartbeat finds).
    SkipsHead,
    /// With 100 or more dead queue entries of a lock, a release hands over to the second live
    /// waiter, as `SkipsHead` always does: a head search that bounds its work and, giving up
    /// in a crowd of dead entries, takes the wrong live one.
    CrowdSkipsHead,
    /// `abandon` removes a queue entry but keeps a pending grant (made to the attempt by a
    /// hand-over its caller never saw): the lock stays held until that grant lapses.
    AbandonKeepsGrant,
    /// `holder` answers that nobody holds (a holder-only read of the wrong key, say).
    HolderNone,
    /// A queued waiter's `acquire` on a free lock is granted whatever stands in front of it
    /// ("is queued" taken for "is the head"): the waiters ahead are dropped.
    QueueBarging,
    /// The first waiter of a lock stays in front until it is granted or leaves, even once
    /// dead: a lock that falls free without a hand-over (its lease ran out) waits for it.
    DeadHeadBlocks,
    /// A re-entry sets the hold's lease to its own from now, shortening it (the hold ends
    /// then: played by a force release at that time).
    ReentryShortensLease,
    /// A spent attempt of an owner that holds re-enters (the re-entry is tested before the
    /// spent attempts): a re-sent acquire adds a level nobody will release.
    SpentReenters,
    /// A heartbeat keeps the waiter's place but not its life: its deadline stays where its
    /// first `acquire` put it, so it dies and queues again at the tail.
    HeartbeatsDoNotRefresh,
    /// `Queued` reports a `last_token` above tokens issued later (a counter of another
    /// scale, say): the waiter takes its own hand-over's wake-up for a stale one.
    QueuedTokenTooHigh,
    /// `extend` of a hold whose level is a pending hand-over confirms it.
    ExtendConfirms,
    /// A hand-over's attempt is remembered for the horizon from the hand-over (played here
    /// from when it was last queued), not from when its pending level lapsed: a late acquire
    /// sent before the lapse is served as a fresh attempt. Caught by the slow check that is
    /// not in the suite (`a_lapsed_hand_over_forgotten_early_is_caught`).
    ForgetsLapsedHandOvers,
    /// An abandoned attempt is forgotten (a released one is not): its `acquire` delivered
    /// again counts as a new attempt, queued again or granted a free lock.
    ForgetsAbandoned,
    /// A new attempt of an owner whose hold expired re-enters that hold: the old token, one
    /// more level (a store that matches the owner without the lease, played by rewriting the
    /// grant the inner store makes).
    RevivesExpired,
    /// `extend` sets the lease to its own from now, shortening it (the hold ends then: played
    /// by a force release at that time, unless a later extend moved it).
    ExtendShortens,
    /// A re-entry leaves the attempt's queue entry behind (played by a leftover entry, which
    /// a later hand-over could be given).
    ReentryKeepsEntry,
    /// A re-entry into a hold with a pending level of the same owner also confirms that
    /// level: it never lapses (a store that lapses a pending level only with the hold's lease,
    /// which the re-entry lengthened).
    PendingOutlivesReentry,
    /// A re-entry into a hold with a pending level of the same owner confirms that level
    /// instead of adding its own ("the owner asked": count 1).
    ReentryConfirmsPending,
    /// No mutation: forwards every call. Run beside the mutants, it must fail no check, so a
    /// check failing from the load of the run alone is seen.
    Faithful,
}

/// The checks written for each clause: at least one of them must fail.
fn expected(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::Unshared => &["instances_share_state"],
        Kind::PerOwner => &[
            "shared_handle_counts_each_guard",
            "attempts_of_one_owner_are_independent",
        ],
        Kind::NoWakeups => &["hand_over", "force_release"],
        Kind::AbandonIgnored => &[
            "wait_timeout_leaves_queue",
            "cancelled_waits_leave_nothing",
            "lost_grant_reply_leaves_no_level",
        ],
        Kind::ConfirmIgnored => &["heartbeat_keeps_place_and_grantee_confirms"],
        Kind::TokensDecrease => &["fencing_tokens_increase", "mutual_exclusion"],
        Kind::HeartbeatToTail => &["heartbeat_keeps_place_and_grantee_confirms"],
        Kind::ForgetsSpent => &["release_by_non_owner"],
        Kind::ForceAnyToken => &["force_release"],
        Kind::Barging => &["try_lock_never_barges"],
        Kind::EndlessLease => &["lease_expiry_frees_lock"],
        Kind::EndlessWaiters => &["dead_waiters_are_evicted"],
        Kind::InspectConfirmed => &["hand_over", "heartbeat_keeps_place_and_grantee_confirms"],
        Kind::ReentryKeepsLease => &["reentry_lengthens_the_lease"],
        Kind::PendingLastsLease => &["pending_grant_lasts_the_waiter_ttl"],
        Kind::ListCountsDead => &["list_ignores_dead_waiters"],
        Kind::InstanceLocalWakeups => &["shared_owner_hears_grants_in_every_instance"],
        Kind::ForgetsReleases | Kind::HidesLostReleases => &["release_by_non_owner"],
        Kind::ForgetsForceReleases | Kind::InventsForceReleases => &["force_release"],
        Kind::ForgetsGrants => &["resends_are_harmless", "lost_grant_reply_leaves_no_level"],
        Kind::StaleGrantCount => &["lost_grant_reply_leaves_no_level"],
        Kind::ExtendIgnored => &["watchdog_keeps_lock", "lease_lost_signal"],
        // The guard itself knows when a fixed lease has run out, so `lease_lost_signal` does
        // not ask the store; an `extend` the store must refuse is checked here.
        Kind::ExtendHidesLoss => &["force_release", "release_by_non_owner"],
        Kind::ReentryRefused => &["reentrancy"],
        Kind::InspectEmpty => &["state_matches_reality"],
        Kind::ListEmpty => &["list_shows_held_and_waited"],
        Kind::SkipsHead => &["fifo_order"],
        Kind::CrowdSkipsHead => &["mass_death_blocks_nobody"],
        // `hand_over` catches it every time (its grantee leaves before confirming);
        // `cancel_at_grant_time_leaves_nothing` when one of its races lands after the grant.
        Kind::AbandonKeepsGrant => &["hand_over", "cancel_at_grant_time_leaves_nothing"],
        Kind::HolderNone => &["state_matches_reality"],
        Kind::QueueBarging => &["try_lock_never_barges"],
        Kind::DeadHeadBlocks => &["dead_waiters_are_evicted"],
        Kind::ReentryShortensLease => &["reentry_lengthens_the_lease"],
        Kind::SpentReenters => &["release_by_non_owner"],
        Kind::HeartbeatsDoNotRefresh => &["heartbeat_keeps_place_and_grantee_confirms"],
        Kind::QueuedTokenTooHigh => &["hand_over"],
        Kind::ExtendConfirms => &["heartbeat_keeps_place_and_grantee_confirms"],
        Kind::ForgetsLapsedHandOvers => &["lapsed_hand_over_stays_spent"],
        Kind::ForgetsAbandoned => &["abandoned_attempts_stay_ended"],
        Kind::RevivesExpired => &["expired_hold_stays_ended"],
        Kind::ExtendShortens => &["one_lease_per_hold"],
        Kind::ReentryKeepsEntry => &["shared_handle_counts_each_guard"],
        Kind::PendingOutlivesReentry | Kind::ReentryConfirmsPending => {
            &["pending_level_lapses_beside_a_reentry"]
        }
        Kind::Faithful => &[],
    }
}

/// A hold as the mutant that revives expired holds saw it granted: its token, hold count and
/// when its lease ends.
type SeenHold = (u64, u32, tokio::time::Instant);

/// Tokens are shown as `FLIP - token`, so they decrease.
const FLIP: u64 = u64::MAX / 2;

#[derive(Debug)]
struct Mutant {
    kind: Kind,
    inner: Arc<dyn LockBackend>,
    /// Outer attempt -> the attempt the inner backend sees (for the mutants that remap).
    attempts: Mutex<HashMap<AttemptId, AttemptId>>,
    /// The most waiters `list` ever saw per lock (for the mutant that never forgets them),
    /// shared by every instance, as a store's state would be.
    listed: Arc<Mutex<HashMap<String, usize>>>,
    /// The attempts whose requests this instance made (for the mutant that keeps hand-overs
    /// in the instance).
    local: Arc<Mutex<std::collections::HashSet<AttemptId>>>,
    /// What every instance has released and force-released, as a store would remember it
    /// (for the mutants that answer re-sent requests wrongly; the suite spreads one check's
    /// calls over several instances).
    sent: Arc<Sent>,
}

#[derive(Debug, Default)]
struct Sent {
    granted: Mutex<std::collections::HashSet<AttemptId>>,
    /// Each granted attempt's first hold count.
    counts: Mutex<HashMap<AttemptId, u32>>,
    released: Mutex<std::collections::HashSet<AttemptId>>,
    abandoned: Mutex<std::collections::HashSet<AttemptId>>,
    /// When each attempt's queue entry was made (for the mutant whose heartbeats do not
    /// move the deadline).
    joined: Mutex<HashMap<AttemptId, tokio::time::Instant>>,
    /// Each owner's last queued attempt per lock, and what it asked for.
    queued_by: Mutex<HashMap<(LockName, String), AcquireRequest>>,
    forced: Mutex<std::collections::HashSet<u64>>,
    /// Queue entries sent to the tail under a new attempt: old inner attempt -> new one.
    moved: Mutex<HashMap<AttemptId, AttemptId>>,
    /// What each inner attempt asked for (lease, waiter TTL), to queue it again.
    asked: Mutex<HashMap<AttemptId, (Duration, Duration)>>,
    /// Each lock's first queued attempt, until granted or gone; and the highest token seen.
    first_queued: Mutex<HashMap<LockName, (AttemptId, String)>>,
    last_token: Mutex<HashMap<LockName, u64>>,
    /// When each attempt was last answered `Queued`.
    last_queued: Mutex<HashMap<AttemptId, tokio::time::Instant>>,
    /// Each lock's queued attempts and when their entries die (for the mutant that goes wrong
    /// in a crowd of dead entries).
    deadlines: Mutex<HashMap<LockName, HashMap<AttemptId, tokio::time::Instant>>>,
    /// Each owner's last hold per lock.
    holds: Mutex<HashMap<(LockName, String), SeenHold>>,
    /// When the last `extend` of each hold (by token) set it to end.
    extended_to: Mutex<HashMap<u64, tokio::time::Instant>>,
}

impl Mutant {
    fn new(
        kind: Kind,
        inner: MemoryBackend,
        listed: Arc<Mutex<HashMap<String, usize>>>,
        sent: Arc<Sent>,
    ) -> Self {
        let inner: Arc<dyn LockBackend> = match kind {
            Kind::NoWakeups => Arc::new(LossyWakeups::new(Arc::new(inner))),
            _ => Arc::new(inner),
        };
        Mutant {
            kind,
            inner,
            attempts: Mutex::default(),
            listed,
            local: Arc::default(),
            sent,
        }
    }

    fn owner_attempt(owner: &Owner) -> AttemptId {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        owner.hash(&mut hasher);
        AttemptId::from_u128(u128::from(hasher.finish()))
    }

    /// The inner attempt of `attempt`.
    fn inner_attempt(&self, owner: &Owner, attempt: AttemptId) -> AttemptId {
        match self.kind {
            Kind::PerOwner => Self::owner_attempt(owner),
            Kind::HeartbeatToTail | Kind::HeartbeatsDoNotRefresh => *self
                .attempts
                .lock()
                .unwrap()
                .entry(attempt)
                .or_insert_with(AttemptId::random),
            Kind::SkipsHead | Kind::CrowdSkipsHead => {
                let moved = self.sent.moved.lock().unwrap();
                let mut current = attempt;
                while let Some(next) = moved.get(&current) {
                    current = *next;
                }
                current
            }
            _ => attempt,
        }
    }

    /// Sends the head of `name`'s queue to the tail, under a new attempt, when two or more
    /// wait: the next hand-over goes to the second.
    async fn skip_head(&self, name: &LockName) -> Result<()> {
        let state = self.inner.inspect(name).await?;
        let [head, _, ..] = state.waiters.as_slice() else {
            return Ok(());
        };
        let asked = self.sent.asked.lock().unwrap().get(&head.attempt).copied();
        let Some((lease, waiter_ttl)) = asked else {
            return Ok(());
        };
        let owner = Owner::new(head.owner.clone())?;
        self.inner.abandon(name, &owner, head.attempt).await?;
        let attempt = AttemptId::random();
        self.sent
            .moved
            .lock()
            .unwrap()
            .insert(head.attempt, attempt);
        self.sent
            .asked
            .lock()
            .unwrap()
            .insert(attempt, (lease, waiter_ttl));
        let request = AcquireRequest {
            name: name.clone(),
            owner,
            attempt,
            lease,
            waiter_ttl,
            queue: true,
        };
        self.inner.acquire(&request).await?;
        Ok(())
    }

    /// Ends `inner`'s queue entry and gives `request`'s attempt a new inner one, whose next
    /// `acquire` queues at the tail (for the mutants that move waiters back).
    async fn to_tail(&self, request: &AcquireRequest, inner: &mut AcquireRequest) -> Result<()> {
        self.inner
            .abandon(&request.name, &request.owner, inner.attempt)
            .await?;
        inner.attempt = AttemptId::random();
        self.attempts
            .lock()
            .unwrap()
            .insert(request.attempt, inner.attempt);
        Ok(())
    }

    /// Whether 100 or more queue entries of `name` died without calling again (for the mutant
    /// that goes wrong in a crowd of dead entries).
    fn crowd_of_dead(&self, name: &LockName) -> bool {
        let now = tokio::time::Instant::now();
        let deadlines = self.sent.deadlines.lock().unwrap();
        deadlines
            .get(name)
            .is_some_and(|lock| lock.values().filter(|dies| **dies <= now).count() >= 100)
    }

    /// `attempt` ended: it no longer stands first (for the mutant whose first waiter blocks),
    /// nor is it a dead queue entry (for the mutant that goes wrong in a crowd of them; one
    /// handed the lock by a wake-up may never ask again).
    fn forget_ended(&self, name: &LockName, attempt: AttemptId) {
        let mut first = self.sent.first_queued.lock().unwrap();
        if first.get(name).is_some_and(|(a, _)| *a == attempt) {
            first.remove(name);
        }
        if let Some(lock) = self.sent.deadlines.lock().unwrap().get_mut(name) {
            lock.remove(&attempt);
        }
    }

    /// After a call that may hand the lock over: the first waiter handed it (the hand-over
    /// takes it out of the queue, dead or not) no longer stands first.
    async fn note_hand_over(&self, name: &LockName) -> Result<()> {
        if self.kind != Kind::DeadHeadBlocks {
            return Ok(());
        }
        let holder = self.inner.inspect(name).await?.holder;
        let mut first = self.sent.first_queued.lock().unwrap();
        if first
            .get(name)
            .is_some_and(|(_, owner)| holder.as_ref().is_some_and(|h| h.owner == *owner))
        {
            first.remove(name);
        }
        Ok(())
    }

    /// The request `owner` last queued with on `name` (for the mutants that confirm a
    /// hand-over on its attempt's behalf).
    fn queued_request(&self, name: &LockName, owner: &Owner) -> Option<AcquireRequest> {
        self.sent
            .queued_by
            .lock()
            .unwrap()
            .get(&(name.clone(), owner.to_string()))
            .cloned()
    }

    /// Ends the hold with `token` at `end` if `still()` then says so: a lease that a mutant
    /// cut short, played by a force release.
    fn end_hold_at(
        &self,
        name: &LockName,
        token: u64,
        end: tokio::time::Instant,
        still: impl FnOnce() -> bool + Send + 'static,
    ) {
        let (store, name) = (Arc::clone(&self.inner), name.clone());
        tokio::spawn(async move {
            tokio::time::sleep_until(end).await;
            if still() {
                let _ = store.force_release(&name, token).await;
            }
        });
    }

    fn token_out(&self, token: u64) -> u64 {
        if self.kind == Kind::TokensDecrease && token != 0 {
            FLIP - token
        } else {
            token
        }
    }

    fn token_in(&self, token: u64) -> u64 {
        self.token_out(token)
    }
}

#[async_trait]
impl LockBackend for Mutant {
    async fn acquire(&self, request: &AcquireRequest) -> Result<AcquireOutcome> {
        if self.kind == Kind::ConfirmIgnored {
            // Answers the grantee of a pending hand-over as if confirmed, and confirms nothing.
            let state = self.inner.inspect(&request.name).await?;
            if let Some(holder) = state
                .holder
                .filter(|h| !h.confirmed && h.owner == request.owner.as_str())
            {
                return Ok(AcquireOutcome::Granted(Grant {
                    token: holder.token,
                    hold_count: holder.hold_count,
                }));
            }
        }
        if self.kind == Kind::InstanceLocalWakeups {
            self.local.lock().unwrap().insert(request.attempt);
        }
        if self.kind == Kind::ForgetsGrants
            && self.sent.granted.lock().unwrap().contains(&request.attempt)
        {
            return Ok(AcquireOutcome::Busy);
        }
        if self.kind == Kind::ReentryRefused
            && !self.sent.granted.lock().unwrap().contains(&request.attempt)
        {
            let holder = self.inner.inspect(&request.name).await?.holder;
            if holder.is_some_and(|h| h.owner == request.owner.as_str()) {
                return Ok(AcquireOutcome::Busy);
            }
        }
        if self.kind == Kind::DeadHeadBlocks {
            let first = self
                .sent
                .first_queued
                .lock()
                .unwrap()
                .get(&request.name)
                .map(|(attempt, _)| *attempt);
            if first.is_some_and(|first| first != request.attempt)
                && self.inner.inspect(&request.name).await?.holder.is_none()
            {
                let last_token = self
                    .sent
                    .last_token
                    .lock()
                    .unwrap()
                    .get(&request.name)
                    .copied()
                    .unwrap_or(0);
                return Ok(if request.queue {
                    AcquireOutcome::Queued {
                        retry_after: None,
                        last_token,
                    }
                } else {
                    AcquireOutcome::Busy
                });
            }
        }
        let mut inner = request.clone();
        inner.attempt = self.inner_attempt(&request.owner, request.attempt);
        let ended = self
            .sent
            .released
            .lock()
            .unwrap()
            .contains(&request.attempt)
            || self
                .sent
                .abandoned
                .lock()
                .unwrap()
                .contains(&request.attempt);
        if self.kind == Kind::ForgetsSpent && ended {
            let holder = self.inner.inspect(&request.name).await?.holder;
            if holder.is_none_or(|h| h.owner != request.owner.as_str()) {
                inner.attempt = AttemptId::random();
            }
        }
        if self.kind == Kind::ForgetsAbandoned
            && self
                .sent
                .abandoned
                .lock()
                .unwrap()
                .contains(&request.attempt)
        {
            inner.attempt = AttemptId::random();
        }
        if self.kind == Kind::SpentReenters
            && self
                .sent
                .released
                .lock()
                .unwrap()
                .contains(&request.attempt)
        {
            let holder = self.inner.inspect(&request.name).await?.holder;
            if holder.is_some_and(|h| h.owner == request.owner.as_str()) {
                // As a fresh attempt: the store re-enters it.
                inner.attempt = AttemptId::random();
            }
        }
        if self.kind == Kind::HeartbeatsDoNotRefresh && request.queue {
            let now = tokio::time::Instant::now();
            let left = {
                let mut joined = self.sent.joined.lock().unwrap();
                let first = *joined.entry(request.attempt).or_insert(now);
                let left = (first + request.waiter_ttl).saturating_duration_since(now);
                if left.is_zero() {
                    joined.insert(request.attempt, now);
                }
                left
            };
            if left.is_zero() {
                // Dead since: this call queues it again, at the tail, with a full TTL (a new
                // entry: the dead one is gone, whether or not the store evicted it yet).
                self.to_tail(request, &mut inner).await?;
            } else {
                inner.waiter_ttl = left;
            }
        }
        if matches!(self.kind, Kind::SkipsHead | Kind::CrowdSkipsHead) {
            self.sent
                .asked
                .lock()
                .unwrap()
                .insert(inner.attempt, (request.lease, request.waiter_ttl));
        }
        match self.kind {
            Kind::EndlessLease => inner.lease = MAX_DURATION,
            Kind::EndlessWaiters => inner.waiter_ttl = MAX_DURATION,
            // The queue entry (and so a hand-over) lives as long as the lease asked for.
            Kind::PendingLastsLease => inner.waiter_ttl = inner.waiter_ttl.max(inner.lease),
            Kind::ReentryKeepsLease => {
                let holder = self.inner.inspect(&request.name).await?.holder;
                if holder.is_some_and(|h| h.owner == request.owner.as_str()) {
                    // The smallest lease: the inner store keeps the current end.
                    inner.lease = Duration::from_millis(1);
                }
            }
            _ => {}
        }
        let reentering = if self.kind == Kind::ReentryShortensLease {
            let holder = self.inner.inspect(&request.name).await?.holder;
            holder.is_some_and(|h| h.owner == request.owner.as_str())
        } else {
            false
        };
        // The owner's queued request whose hand-over is pending, when this is another attempt
        // of that owner re-entering the hold.
        let pending_of_owner = if matches!(
            self.kind,
            Kind::PendingOutlivesReentry | Kind::ReentryConfirmsPending
        ) {
            let holder = self.inner.inspect(&request.name).await?.holder;
            let queued = self.queued_request(&request.name, &request.owner);
            queued.filter(|queued| {
                queued.attempt != inner.attempt
                    && holder
                        .as_ref()
                        .is_some_and(|h| !h.confirmed && h.owner == request.owner.as_str())
            })
        } else {
            None
        };
        if let (Kind::ReentryConfirmsPending, Some(mut pending)) =
            (self.kind, pending_of_owner.clone())
        {
            pending.queue = false;
            let outcome = self.inner.acquire(&pending).await?;
            return Ok(outcome);
        }
        let reentering_from_queue = if self.kind == Kind::ReentryKeepsEntry {
            let state = self.inner.inspect(&request.name).await?;
            state
                .holder
                .is_some_and(|h| h.owner == request.owner.as_str())
                && state.waiters.iter().any(|w| w.attempt == inner.attempt)
        } else {
            false
        };
        let mut outcome = self.inner.acquire(&inner).await?;
        if let (Some(mut pending), AcquireOutcome::Granted(grant)) =
            (pending_of_owner, &mut outcome)
        {
            // The pending level is confirmed with it: it will not lapse.
            pending.queue = false;
            self.inner.acquire(&pending).await?;
            grant.hold_count = self
                .inner
                .inspect(&request.name)
                .await?
                .holder
                .map_or(grant.hold_count, |h| h.hold_count);
        }
        if let (true, AcquireOutcome::Granted(_)) = (reentering_from_queue, &outcome) {
            // The entry stays behind (under another owner name, since the store re-enters
            // any attempt of the holder).
            let leftover = AcquireRequest {
                owner: Owner::new(format!("{}~entry", request.owner))?,
                attempt: AttemptId::random(),
                queue: true,
                ..inner.clone()
            };
            self.inner.acquire(&leftover).await?;
        }
        if self.kind == Kind::RevivesExpired {
            let now = tokio::time::Instant::now();
            let key = (request.name.clone(), request.owner.to_string());
            let mut holds = self.sent.holds.lock().unwrap();
            if let AcquireOutcome::Granted(grant) = &mut outcome {
                let end = now + request.lease;
                match holds.get(&key).copied() {
                    Some((token, count, ended)) if grant.hold_count == 1 && ended <= now => {
                        // The store found its expired hold and re-entered it.
                        grant.token = token;
                        grant.hold_count = count + 1;
                        holds.insert(key, (token, count + 1, end));
                    }
                    Some((token, _, ended)) if token == grant.token => {
                        holds.insert(key, (token, grant.hold_count, ended.max(end)));
                    }
                    _ => {
                        holds.insert(key, (grant.token, grant.hold_count, end));
                    }
                }
            }
        }
        if self.kind == Kind::CrowdSkipsHead {
            let mut deadlines = self.sent.deadlines.lock().unwrap();
            let lock = deadlines.entry(request.name.clone()).or_default();
            if let AcquireOutcome::Queued { .. } = outcome {
                let dies = tokio::time::Instant::now() + request.waiter_ttl;
                lock.insert(request.attempt, dies);
            } else {
                lock.remove(&request.attempt);
            }
        }
        if self.kind == Kind::ForgetsLapsedHandOvers {
            let now = tokio::time::Instant::now();
            let forgotten = {
                let mut last_queued = self.sent.last_queued.lock().unwrap();
                if matches!(outcome, AcquireOutcome::Queued { .. }) {
                    last_queued.insert(request.attempt, now);
                }
                outcome == AcquireOutcome::Busy
                    && last_queued
                        .get(&request.attempt)
                        .is_some_and(|at| *at + RESEND_HORIZON <= now)
            };
            if forgotten {
                inner.attempt = AttemptId::random();
                outcome = self.inner.acquire(&inner).await?;
            }
        }
        if matches!(
            self.kind,
            Kind::ExtendConfirms | Kind::PendingOutlivesReentry | Kind::ReentryConfirmsPending
        ) && request.queue
        {
            self.sent.queued_by.lock().unwrap().insert(
                (request.name.clone(), request.owner.to_string()),
                inner.clone(),
            );
        }
        if let (true, AcquireOutcome::Granted(grant)) = (reentering, &outcome) {
            let end = tokio::time::Instant::now() + request.lease;
            self.end_hold_at(&request.name, grant.token, end, || true);
        }
        match (self.kind, &mut outcome) {
            (Kind::HeartbeatToTail, AcquireOutcome::Queued { .. }) => {
                // Leave and join again under a new inner attempt: back to the tail.
                self.to_tail(request, &mut inner).await?;
                outcome = self.inner.acquire(&inner).await?;
            }
            (Kind::QueueBarging, AcquireOutcome::Queued { .. }) if request.queue => {
                let state = self.inner.inspect(&request.name).await?;
                if state.holder.is_none() {
                    for ahead in state
                        .waiters
                        .iter()
                        .take_while(|w| w.attempt != request.attempt)
                    {
                        let owner = Owner::new(ahead.owner.clone())?;
                        self.inner
                            .abandon(&request.name, &owner, ahead.attempt)
                            .await?;
                    }
                    outcome = self.inner.acquire(&inner).await?;
                }
            }
            (Kind::Barging, AcquireOutcome::Busy) if !request.queue => {
                let state = self.inner.inspect(&request.name).await?;
                if state.holder.is_none() {
                    if let Some(head) = state.waiters.first() {
                        let owner = Owner::new(head.owner.clone())?;
                        self.inner
                            .abandon(&request.name, &owner, head.attempt)
                            .await?;
                        outcome = self.inner.acquire(&inner).await?;
                    }
                }
            }
            _ => {}
        }
        if let (Kind::ForgetsGrants | Kind::ReentryRefused, AcquireOutcome::Granted(_)) =
            (self.kind, &outcome)
        {
            self.sent.granted.lock().unwrap().insert(request.attempt);
        }
        if self.kind == Kind::DeadHeadBlocks {
            let mut first = self.sent.first_queued.lock().unwrap();
            let mut last = self.sent.last_token.lock().unwrap();
            let seen = last.entry(request.name.clone()).or_default();
            match &outcome {
                AcquireOutcome::Queued { last_token, .. } => {
                    *seen = (*seen).max(*last_token);
                    first
                        .entry(request.name.clone())
                        .or_insert((request.attempt, request.owner.to_string()));
                }
                AcquireOutcome::Granted(grant) => {
                    *seen = (*seen).max(grant.token);
                    if first
                        .get(&request.name)
                        .is_some_and(|(attempt, _)| *attempt == request.attempt)
                    {
                        first.remove(&request.name);
                    }
                }
                AcquireOutcome::Busy => {}
            }
        }
        if let (Kind::StaleGrantCount, AcquireOutcome::Granted(grant)) = (self.kind, &mut outcome) {
            let mut counts = self.sent.counts.lock().unwrap();
            grant.hold_count = *counts.entry(request.attempt).or_insert(grant.hold_count);
        }
        Ok(match outcome {
            AcquireOutcome::Granted(grant) => AcquireOutcome::Granted(Grant {
                token: self.token_out(grant.token),
                ..grant
            }),
            AcquireOutcome::Queued {
                retry_after,
                last_token,
            } => AcquireOutcome::Queued {
                retry_after,
                last_token: if self.kind == Kind::QueuedTokenTooHigh {
                    last_token + 1000
                } else {
                    self.token_out(last_token)
                },
            },
            busy => busy,
        })
    }

    async fn release(
        &self,
        name: &LockName,
        owner: &Owner,
        token: u64,
        attempt: AttemptId,
    ) -> Result<ReleaseOutcome> {
        let inner = self.inner_attempt(owner, attempt);
        self.forget_ended(name, attempt);
        if self.kind == Kind::SkipsHead
            || (self.kind == Kind::CrowdSkipsHead && self.crowd_of_dead(name))
        {
            self.skip_head(name).await?;
        }
        let outcome = self
            .inner
            .release(name, owner, self.token_in(token), inner)
            .await?;
        self.note_hand_over(name).await?;
        let again = !self.sent.released.lock().unwrap().insert(attempt);
        Ok(match (self.kind, outcome) {
            (Kind::ForgetsReleases, ReleaseOutcome::Released { remaining: 0 }) if again => {
                ReleaseOutcome::NotHeld
            }
            (Kind::HidesLostReleases, ReleaseOutcome::NotHeld) if again => {
                ReleaseOutcome::Released { remaining: 0 }
            }
            (_, outcome) => outcome,
        })
    }

    async fn extend(
        &self,
        name: &LockName,
        owner: &Owner,
        token: u64,
        lease: Duration,
    ) -> Result<bool> {
        let lease = if self.kind == Kind::EndlessLease {
            MAX_DURATION
        } else {
            lease
        };
        if self.kind == Kind::ExtendIgnored {
            return Ok(true);
        }
        if self.kind == Kind::ExtendConfirms {
            let holder = self.inner.inspect(name).await?.holder;
            let queued = self.queued_request(name, owner);
            if let (Some(holder), Some(mut request)) = (holder, queued) {
                if !holder.confirmed && holder.owner == owner.as_str() && holder.token == token {
                    // Its attempt's own acquire, as if the extend had been it.
                    request.queue = false;
                    self.inner.acquire(&request).await?;
                }
            }
        }
        let extended = self
            .inner
            .extend(name, owner, self.token_in(token), lease)
            .await?;
        if extended && self.kind == Kind::ExtendShortens {
            let end = tokio::time::Instant::now() + lease;
            self.sent.extended_to.lock().unwrap().insert(token, end);
            let sent = Arc::clone(&self.sent);
            // Unless a later extend moved the end.
            self.end_hold_at(name, token, end, move || {
                sent.extended_to.lock().unwrap().get(&token) == Some(&end)
            });
        }
        Ok(extended || self.kind == Kind::ExtendHidesLoss)
    }

    async fn abandon(&self, name: &LockName, owner: &Owner, attempt: AttemptId) -> Result<()> {
        if self.kind == Kind::AbandonIgnored {
            return Ok(());
        }
        if self.kind == Kind::AbandonKeepsGrant {
            let holder = self.inner.inspect(name).await?.holder;
            if holder.is_some_and(|h| !h.confirmed && h.owner == owner.as_str()) {
                return Ok(());
            }
        }
        let inner = self.inner_attempt(owner, attempt);
        self.sent.abandoned.lock().unwrap().insert(attempt);
        self.forget_ended(name, attempt);
        self.inner.abandon(name, owner, inner).await?;
        self.note_hand_over(name).await
    }

    async fn force_release(&self, name: &LockName, token: u64) -> Result<bool> {
        if self.kind == Kind::ForceAnyToken {
            if let Some(holder) = self.inner.inspect(name).await?.holder {
                return self.inner.force_release(name, holder.token).await;
            }
        }
        let freed = self.inner.force_release(name, self.token_in(token)).await?;
        self.note_hand_over(name).await?;
        let again = !self.sent.forced.lock().unwrap().insert(token);
        Ok(match self.kind {
            Kind::ForgetsForceReleases if again => false,
            Kind::InventsForceReleases if again => true,
            _ => freed,
        })
    }

    async fn inspect(&self, name: &LockName) -> Result<LockState> {
        let mut state = self.inner.inspect(name).await?;
        if self.kind == Kind::InspectEmpty {
            state.holder = None;
            state.waiters.clear();
        }
        if let Some(holder) = state.holder.as_mut() {
            holder.token = self.token_out(holder.token);
            if self.kind == Kind::InspectConfirmed {
                holder.confirmed = true;
            }
        }
        Ok(state)
    }

    async fn holder(&self, name: &LockName) -> Result<Option<HolderState>> {
        if self.kind == Kind::HolderNone {
            return Ok(None);
        }
        // As `inspect` (with its mutations) shows it.
        Ok(self.inspect(name).await?.holder)
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockSummary>> {
        let mut listed = self.inner.list(prefix).await?;
        if self.kind == Kind::ListEmpty {
            listed.clear();
        }
        if self.kind == Kind::ListCountsDead {
            let mut seen = self.listed.lock().unwrap();
            for summary in &mut listed {
                let most = seen.entry(summary.name.clone()).or_default();
                *most = (*most).max(summary.waiters);
                summary.waiters = *most;
            }
        }
        Ok(listed)
    }

    async fn watch(&self, name: &LockName, owner: &Owner) -> Result<Watch> {
        let mut inner = self.inner.watch(name, owner).await?;
        if !matches!(
            self.kind,
            Kind::TokensDecrease | Kind::PerOwner | Kind::InstanceLocalWakeups
        ) {
            return Ok(inner);
        }
        // Translate what the inner backend sends: tokens, (per owner) which attempt, and
        // (instance-local) whether it is for this instance at all.
        let (sender, watch) = Watch::channel();
        let kind = self.kind;
        let local = Arc::clone(&self.local);
        tokio::spawn(async move {
            while let Some(wake) = inner.recv().await {
                if let (Kind::InstanceLocalWakeups, Wake::Granted { attempt, .. }) = (kind, wake) {
                    if !local.lock().unwrap().contains(&attempt) {
                        continue;
                    }
                }
                let wake = match (kind, wake) {
                    (Kind::TokensDecrease, Wake::Granted { attempt, grant }) => Wake::Granted {
                        attempt,
                        grant: Grant {
                            token: FLIP - grant.token,
                            ..grant
                        },
                    },
                    // The owner's only "attempt" is not any caller's: they all look again.
                    (Kind::PerOwner, Wake::Granted { .. }) => Wake::Recheck,
                    (_, wake) => wake,
                };
                if !sender.send(wake) {
                    return;
                }
            }
        });
        Ok(watch)
    }
}

/// The checks that failed against the mutant, each with why.
async fn caught(kind: Kind) -> Vec<(String, String)> {
    let store = MemoryBackend::new();
    let listed = Arc::default();
    let sent = Arc::default();
    let report = run_checks_within(
        move || {
            let handle = if kind == Kind::Unshared {
                MemoryBackend::new()
            } else {
                store.clone()
            };
            let mutant = Mutant::new(kind, handle, Arc::clone(&listed), Arc::clone(&sent));
            async move { Arc::new(mutant) as Arc<dyn LockBackend> }
        },
        Duration::from_secs(30),
    )
    .await;
    report
        .failed
        .into_iter()
        .map(|(name, why)| (name.to_owned(), why))
        .collect()
}

/// A check that failed only by running out of its time says nothing about the clause: the
/// runs share two threads, so a slow check proves load, not a catch.
fn timed_out(why: &str) -> bool {
    why.starts_with("timed out after")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mutant_is_caught_by_the_check_for_its_clause() {
    let kinds = [
        Kind::Unshared,
        Kind::PerOwner,
        Kind::NoWakeups,
        Kind::AbandonIgnored,
        Kind::ConfirmIgnored,
        Kind::TokensDecrease,
        Kind::HeartbeatToTail,
        Kind::ForgetsSpent,
        Kind::ForceAnyToken,
        Kind::Barging,
        Kind::EndlessLease,
        Kind::EndlessWaiters,
        Kind::InspectConfirmed,
        Kind::ReentryKeepsLease,
        Kind::PendingLastsLease,
        Kind::ListCountsDead,
        Kind::InstanceLocalWakeups,
        Kind::ForgetsReleases,
        Kind::HidesLostReleases,
        Kind::ForgetsForceReleases,
        Kind::InventsForceReleases,
        Kind::ForgetsGrants,
        Kind::StaleGrantCount,
        Kind::ExtendIgnored,
        Kind::ExtendHidesLoss,
        Kind::ReentryRefused,
        Kind::InspectEmpty,
        Kind::ListEmpty,
        Kind::SkipsHead,
        Kind::CrowdSkipsHead,
        Kind::AbandonKeepsGrant,
        Kind::HolderNone,
        Kind::QueueBarging,
        Kind::DeadHeadBlocks,
        Kind::ReentryShortensLease,
        Kind::SpentReenters,
        Kind::HeartbeatsDoNotRefresh,
        Kind::QueuedTokenTooHigh,
        Kind::ExtendConfirms,
        Kind::ForgetsAbandoned,
        Kind::RevivesExpired,
        Kind::ExtendShortens,
        Kind::ReentryKeepsEntry,
        Kind::PendingOutlivesReentry,
        Kind::ReentryConfirmsPending,
        Kind::Faithful,
    ];
    // All at once: the runs mostly wait (on timeouts the mutants cause), and a mutant only
    // has to fail the check written for its clause.
    let mut missed = Vec::new();
    for group in kinds.chunks(kinds.len()) {
        let runs: Vec<_> = group
            .iter()
            .map(|&kind| tokio::spawn(async move { (kind, caught(kind).await) }))
            .collect();
        for run in runs {
            let (kind, failed) = run.await.expect("mutant run");
            eprintln!("mutant {kind:?}: caught by {failed:?}");
            if kind == Kind::Faithful {
                if !failed.is_empty() {
                    missed.push(format!(
                        "the faithful wrapper failed checks (load alone?): {failed:?}"
                    ));
                }
                continue;
            }
            if !expected(kind).iter().any(|check| {
                failed
                    .iter()
                    .any(|(name, why)| name == check && !timed_out(why))
            }) {
                missed.push(format!(
                    "{kind:?}: expected one of {:?} to fail other than by timing out, \
                     failed: {failed:?}",
                    expected(kind)
                ));
            }
        }
    }
    assert!(
        missed.is_empty(),
        "mutants not caught:\n{}",
        missed.join("\n")
    );
}

/// The check that waits out the resend horizon is not in the suite: it runs here on its own,
/// on Tokio's paused clock, against its mutant and a faithful wrapper.
#[tokio::test(start_paused = true)]
async fn a_lapsed_hand_over_forgotten_early_is_caught() {
    let run = |kind| async move {
        let mutant = Mutant::new(kind, MemoryBackend::new(), Arc::default(), Arc::default());
        let check = lapsed_hand_over_stays_spent(Arc::new(mutant));
        tokio::spawn(check).await.map_err(|join| join.is_panic())
    };
    assert_eq!(
        run(Kind::Faithful).await,
        Ok(()),
        "the faithful wrapper fails it"
    );
    assert_eq!(
        run(Kind::ForgetsLapsedHandOvers).await,
        Err(true),
        "{:?} passes {:?}",
        Kind::ForgetsLapsedHandOvers,
        expected(Kind::ForgetsLapsedHandOvers)
    );
}
