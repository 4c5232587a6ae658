//! [`LockGuard`]: proof of holding a lock, released on drop.

use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::time::{sleep, timeout_at, Instant};
use tracing::{debug, info_span, warn, Instrument};

use crate::backend::{
    AcquireOutcome, AcquireRequest, AttemptId, Grant, ReleaseOutcome, RESEND_HORIZON,
};
use crate::deferred::DeferredTask;
use crate::error::{Error, Result};
use crate::lease::Hold;
use crate::levels::{Finishing, LevelTicket};
use crate::lock::LockShared;
use crate::name::{LockName, Owner};
use crate::options::check_lease;
use crate::telemetry::LostReason;
use crate::waiting::retry_within;

/// One level of a held lock. Dropping it releases that level.
///
/// The guard owns everything it needs (`Send + 'static`), so it can move into spawned tasks.
/// All guards of one hold in this process (nested locking, tasks sharing a handle) share one
/// lease, as the store does: one keeper task renews it while any of them uses the watchdog,
/// or watches the fixed lease, and raises [`lease_lost`](Self::lease_lost) for all of them if
/// the lease ends before they do.
///
/// **Dropping** the guard releases the lock in the background: the release is spawned on the
/// Tokio runtime the lock was acquired on, so `drop` never blocks and never panics, even on a
/// thread with no runtime. If that runtime has already shut down, no release can run; the
/// renewal stopped with it, so the store frees the lock when its lease ends (at most one
/// lease, 30 s by default); [`is_lease_lost`](Self::is_lease_lost) turns true then, but
/// [`lease_lost`](Self::lease_lost), which that runtime's keeper task raises, completes only
/// once the guard is dropped. Prefer [`unlock`](Self::unlock) to learn whether the release
/// succeeded.
#[must_use = "the lock is released as soon as the guard is dropped"]
#[derive(Debug)]
pub struct LockGuard {
    shared: Arc<LockShared>,
    grant: Grant,
    /// The level this guard is: the attempt that acquired it.
    attempt: AttemptId,
    hold: Arc<Hold>,
    /// What is known of this guard's own level beyond the hold's lease.
    level: Arc<Level>,
    /// Confirms a hand-over this guard was made from (see [`confirm_hand_over`]), until done.
    confirming: Option<DeferredTask>,
    runtime: Handle,
    released: bool,
    /// Counts this level among the handle's until its release is done (see `levels.rs`).
    ticket: LevelTicket,
}

impl LockGuard {
    /// A guard for `grant`, made by `attempt`, whose lease surely lasts until `deadline`
    /// (local clock). `confirm`: the grant is a hand-over the store has not seen confirmed.
    pub(crate) fn new(
        shared: Arc<LockShared>,
        grant: Grant,
        attempt: AttemptId,
        deadline: Instant,
        confirm: bool,
        runtime: Handle,
        ticket: LevelTicket,
    ) -> Self {
        let hold = shared.holds.join(&shared, grant.token, deadline, &runtime);
        let level = Arc::new(Level {
            lost: watch::Sender::new(false),
            let_go: watch::Sender::new(false),
            unconfirmed_until: watch::Sender::new(confirm.then_some(deadline)),
        });
        let confirming = confirm.then(|| {
            let span = info_span!(
                "fairlock.confirm",
                lock = %shared.name,
                owner = %shared.owner,
                token = grant.token,
                %attempt
            );
            // Never more than a quarter of what is left of the pending level's trusted life:
            // a wake-up that came late leaves the confirmation (and its retries) less time.
            let left = deadline.saturating_duration_since(Instant::now());
            let delay = confirm_delay(shared.options.waiter_ttl).min(left / 4);
            shared.holds.deferred.spawn_at(
                &runtime,
                Instant::now() + delay,
                confirm_hand_over(
                    shared.clone(),
                    hold.clone(),
                    level.clone(),
                    grant.token,
                    attempt,
                    deadline,
                )
                .instrument(span),
            )
        });
        shared.meter.guards(1.0);
        LockGuard {
            shared,
            grant,
            attempt,
            hold,
            level,
            confirming,
            runtime,
            released: false,
            ticket,
        }
    }

    /// The fencing token of this hold: strictly greater than that of every earlier holder of
    /// this lock. Pass it to the resource you protect and let it reject smaller tokens, so a
    /// holder that lost its lease (paused, partitioned) cannot do harm.
    pub fn fencing_token(&self) -> u64 {
        self.grant.token
    }

    /// The hold count this acquisition produced: 1 for the first, 2 for a reentrant one, ...
    pub fn hold_count(&self) -> u32 {
        self.grant.hold_count
    }

    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.shared.name
    }

    /// The owner holding the lock. Reading it counts as sharing the owner: see
    /// [`FairLock::owner`](crate::FairLock::owner).
    pub fn owner(&self) -> &Owner {
        // It may now be shared through `fair_lock_as`: stop checking grants (see `levels.rs`).
        self.shared.levels.shared_out();
        &self.shared.owner
    }

    /// Whether the lease is known to be lost. See [`lease_lost`](Self::lease_lost).
    pub fn is_lease_lost(&self) -> bool {
        self.hold.is_lost() || self.level.is_lost()
    }

    /// How long the lease surely lasts from now if it is not renewed again: a local estimate,
    /// from the moment the last successful grant or renewal was *sent* plus its lease (see
    /// [`lease_lost`](Self::lease_lost)), not a reading of the store. Zero once the lease is
    /// known lost. The store's own figure is at least this long (if both clocks run at the same
    /// rate) and is in [`FairLock::state`](crate::FairLock::state).
    ///
    /// With the watchdog it stays between about two thirds of
    /// [`watchdog_lease`](crate::LockOptions::watchdog_lease) and all of it while renewals
    /// succeed; with a fixed lease it counts down to zero unless [`extend`](Self::extend)ed.
    /// Like Redisson's `remainTimeToLive`, but it costs no round trip.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use fairlock::{LockClient, MemoryBackend};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> fairlock::Result<()> {
    /// let client = LockClient::new(MemoryBackend::new());
    /// let lock = client.fair_lock("export")?.with_lease(Duration::from_secs(10))?;
    /// let guard = lock.lock().await?;
    /// let left = guard.lease_remaining();
    /// assert!(left > Duration::from_secs(9) && left <= Duration::from_secs(10));
    /// guard.unlock().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn lease_remaining(&self) -> Duration {
        remaining(&self.hold, &self.level)
    }

    /// Asks the store whether it still lists this guard's hold: the lock is held by this
    /// guard's owner under its fencing token (and this guard's own level is not known to have
    /// lapsed). Like Redisson's `isHeldByCurrentThread`, but exact about *which* hold: a later
    /// hold of the same owner (after this one was lost) has another token and does not count.
    ///
    /// If the store says no, the lease is flagged lost: [`lease_lost`](Self::lease_lost) fires
    /// for every guard of the hold. A `true` is a snapshot; only the fencing token protects a
    /// resource against a holder that lost its lease just after asking.
    ///
    /// ```
    /// # use fairlock::{LockClient, MemoryBackend};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> fairlock::Result<()> {
    /// let client = LockClient::new(MemoryBackend::new());
    /// let guard = client.fair_lock("export")?.lock().await?;
    /// assert!(guard.is_held().await?);
    /// client.force_unlock("export").await?; // an operator frees it
    /// assert!(!guard.is_held().await?);
    /// assert!(guard.is_lease_lost());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// Backend errors (the answer is then unknown; nothing is flagged).
    ///
    /// # Cancel safety
    /// Cancel safe; it only reads.
    pub async fn is_held(&self) -> Result<bool> {
        if self.is_lease_lost() {
            return Ok(false);
        }
        let shared = &self.shared;
        let holder = shared.backend.holder(&shared.name).await?;
        let listed = holder.is_some_and(|holder| {
            holder.owner == shared.owner.as_str() && holder.token == self.grant.token
        });
        if !listed {
            // Tokens are never reused: a hold the store no longer has is over for good.
            self.hold.mark_lost(LostReason::Revoked);
        }
        Ok(listed && !self.is_lease_lost())
    }

    /// A view of this guard's lease that can be moved into other tasks: its fencing token,
    /// time left and lost-lease signal. It does not keep the lock: once this guard is gone
    /// (released or dropped), it reports the lease lost, even while other guards of the same
    /// hold (re-entries) still hold it.
    ///
    /// ```
    /// # use fairlock::{LockClient, MemoryBackend};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> fairlock::Result<()> {
    /// # let client = LockClient::new(MemoryBackend::new());
    /// let guard = client.fair_lock("export")?.lock().await?;
    /// let lease = guard.lease();
    /// let worker = tokio::spawn(async move {
    ///     tokio::select! {
    ///         _ = lease.lease_lost() => Err("lease lost"),
    ///         _ = async { /* work fenced with lease.fencing_token() */ } => Ok(()),
    ///     }
    /// });
    /// worker.await.unwrap().unwrap();
    /// guard.unlock().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn lease(&self) -> Lease {
        Lease {
            shared: self.shared.clone(),
            grant: self.grant,
            hold: Arc::downgrade(&self.hold),
            level: Arc::downgrade(&self.level),
        }
    }

    /// A future that completes when the lease is lost: renewal failed until the lease ran out,
    /// the store no longer lists this owner as holder (expired, force-released: seen at the
    /// next renewal, `extend` or [`is_held`](Self::is_held), or at once for a force unlock
    /// through this guard's own client; a fixed lease has no renewals, so call `is_held` now
    /// and then to learn of it before the lease ends), or a fixed lease ended
    /// without [`extend`](Self::extend). It also completes once the guard is gone. Race your
    /// critical section against it to stop in time:
    ///
    /// ```
    /// # use fairlock::{LockClient, MemoryBackend};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> fairlock::Result<()> {
    /// # let client = LockClient::new(MemoryBackend::new());
    /// let guard = client.fair_lock("payments")?.lock().await?;
    /// tokio::select! {
    ///     _ = guard.lease_lost() => eprintln!("lease lost, stopping"),
    ///     _ = async { /* the critical section */ } => {}
    /// }
    /// guard.unlock().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// The signal is computed without the client's clock reaching the store: the local
    /// deadline is the moment the last successful grant or renewal was *sent* plus its lease,
    /// which ends no later than the store's lease if both clocks run at the same rate.
    ///
    /// # Cancel safety
    /// Cancel safe; it only observes.
    pub fn lease_lost(&self) -> impl Future<Output = ()> + Send + 'static {
        lost_signal(Some((&self.hold, &self.level)))
    }

    /// Makes the lease last at least `lease` from now, by the store's clock. The lease belongs
    /// to the whole hold (every guard of this owner on this lock), so this never shortens it:
    /// another guard may rely on it. With a watchdog, renewals go on as before.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a lease below 1 ms or above
    /// [`MAX_DURATION`](crate::MAX_DURATION); [`Error::LeaseLost`] if the store no longer
    /// lists this hold, or its answer came only after the lease had run out by the local
    /// clock (the lost-lease signal fires too); backend errors.
    ///
    /// # Cancel safety
    /// If cancelled, the extension may or may not have been applied; the guard stays valid.
    pub async fn extend(&self, lease: Duration) -> Result<()> {
        check_lease("lease", lease)?;
        if self.is_lease_lost() {
            return Err(Error::LeaseLost {
                name: self.shared.name.to_string(),
            });
        }
        let sent = Instant::now();
        let shared = &self.shared;
        let extended = shared
            .backend
            .extend(&shared.name, &shared.owner, self.grant.token, lease)
            .await?;
        if extended {
            // Applied, but maybe answered past the local deadline: then the lease has been
            // reported lost since, and stays so.
            if !self.hold.extended(sent, lease, LostReason::Expired) {
                return Err(Error::LeaseLost {
                    name: shared.name.to_string(),
                });
            }
            Ok(())
        } else {
            self.hold.mark_lost(LostReason::Revoked);
            Err(Error::LeaseLost {
                name: shared.name.to_string(),
            })
        }
    }

    /// Releases this level of the lock and reports how it went.
    ///
    /// While the store is unreachable (a failover, a dropped connection) the release is tried
    /// again for up to [`LockOptions::outage_budget`](crate::LockOptions::outage_budget), so
    /// this can take that long.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if the lock was no longer held under this guard's token (it
    /// expired or was force-released: another owner may have held it meanwhile);
    /// [`Error::Unavailable`] after the store failed for the whole outage budget, and other
    /// backend errors, in which case the store frees the lock when its lease ends. Also
    /// [`Error::Unavailable`] when a try that found the level gone came more than 30 s after
    /// the first (half of [`RESEND_HORIZON`](crate::backend::RESEND_HORIZON)): the store may
    /// have forgotten that an earlier try released it, so whether the lease was lost is
    /// unknown.
    ///
    /// # Cancel safety
    /// The release runs on the caller's task (no task hop on the way to the store). If this
    /// future is dropped before it completes, the release is sent again from a background
    /// task on the runtime the lock was acquired on: releasing is harmless to repeat, so the
    /// lock is released all the same.
    pub async fn unlock(self) -> Result<()> {
        // This guard's share of the hold ends now, not when the reply comes. Both copies of
        // the release are made in a block, so the guard is not kept, and neither is a copy
        // that was only borrowed (see "Memory" in `waiting.rs`).
        let (release, copy) = {
            let mut guard = self;
            let release = guard.end_level();
            (release.clone(), release)
        };
        // Until the release has run to completion, dropping this future re-sends it.
        let mut unfinished = Unfinished(Some(copy));
        let result = release.run().await;
        unfinished.0 = None;
        result
    }

    /// Runs `work` while this guard holds, then releases it (see
    /// [`FairLock::run`](crate::FairLock::run)).
    pub(crate) async fn run<F, Fut, T>(self, work: F) -> Result<T>
    where
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = T>,
    {
        let lost = self.lease_lost();
        let work = work(self.lease());
        // The work future is dropped at the end of this block, before the lock is released:
        // it must never run while another owner may hold the lock.
        let done = {
            tokio::pin!(lost, work);
            tokio::select! {
                biased;
                () = &mut lost => None,
                value = &mut work => Some(value),
            }
        };
        match done {
            Some(value) if !self.is_lease_lost() => match self.unlock().await {
                Ok(()) => Ok(value),
                Err(err @ Error::LeaseLost { .. }) => Err(err),
                // Logged by the release; the lock ends with its lease.
                Err(_) => Ok(value),
            },
            _ => {
                let err = Error::LeaseLost {
                    name: self.shared.name.to_string(),
                };
                // Released in the background, like any dropped guard.
                drop(self);
                Err(err)
            }
        }
    }

    /// Ends this guard's part of the hold locally; what is left is the store's release.
    fn end_level(&mut self) -> Release {
        self.released = true;
        self.level.let_go.send_replace(true);
        // What the confirmation finds out no longer matters once the level is released.
        if let Some(confirming) = self.confirming.take() {
            confirming.abort();
        }
        if self.shared.options.lease.is_none() {
            self.hold.watchdog_left(self.shared.options.watchdog_lease);
        }
        self.shared.meter.guards(-1.0);
        Release {
            shared: self.shared.clone(),
            token: self.grant.token,
            attempt: self.attempt,
            level: self.level.clone(),
            hold: Arc::downgrade(&self.hold),
            runtime: self.runtime.clone(),
            ticket: self.ticket.clone(),
            finishing: Arc::new(self.shared.levels.finishing()),
            first_sent: Instant::now(),
            lost_before: self.level.is_lost(),
        }
    }
}

/// How long after a release was first sent a `NotHeld` answer still means a lost lease. The
/// store remembers a release that removed its level for [`RESEND_HORIZON`] from when it was
/// applied, so a later try could find that record gone; half of it leaves room for how long
/// a try takes on either side.
const NOT_HELD_IS_KNOWN_WITHIN: Duration = Duration::from_secs(RESEND_HORIZON.as_secs() / 2);

/// A guard's release in the store, ready to send (or to send again).
#[derive(Clone, Debug)]
struct Release {
    shared: Arc<LockShared>,
    token: u64,
    attempt: AttemptId,
    level: Arc<Level>,
    hold: Weak<Hold>,
    runtime: Handle,
    /// Kept until the release is done: until then the level may still be in the store.
    ticket: LevelTicket,
    /// Marks the release as on its way from the moment the guard let go (see `levels.rs`).
    finishing: Arc<Finishing>,
    /// When the first try went out (a re-send after a dropped `unlock` keeps it).
    first_sent: Instant,
    /// The guard's own level was known lost (or lapsed) when it let go.
    lost_before: bool,
}

impl Release {
    /// Sends the release in a background task (a dropped guard, or a dropped `unlock`).
    fn spawn(self) {
        let runtime = self.runtime.clone();
        drop(runtime.spawn(async move {
            // The outcome is only traced: a failed release ends with the lease.
            let _ = self.run().await;
        }));
    }

    /// Releases the level in the store, riding out a transient outage.
    async fn run(self) -> Result<()> {
        let Release {
            shared,
            token,
            attempt,
            level,
            hold,
            ticket,
            finishing,
            first_sent,
            lost_before,
            ..
        } = self;
        let span = info_span!(
            "fairlock.release",
            lock = %shared.name,
            owner = %shared.owner,
            token,
            %attempt
        );
        async move {
            // Harmless to repeat, so an outage is ridden out within the outage budget, as
            // `lock()` does (a failover takes seconds): a level left behind would live as
            // long as a sibling guard renews the hold.
            let outcome = retry_within(shared.options.outage_budget, || {
                shared
                    .backend
                    .release(&shared.name, &shared.owner, token, attempt)
            })
            .await;
            // Done with the store: the level is gone, or left to its lease.
            drop(ticket);
            drop(finishing);
            // A try whose reply was lost may have released the last level, so the next finds
            // the hold gone: the store remembers that release and answers `Released` again
            // (the contract's *Re-sends*), so `NotHeld` is a lost lease. Not once the store
            // may have forgotten an earlier try: then the outcome is unknown.
            match outcome {
                Ok(ReleaseOutcome::NotHeld)
                    if first_sent.elapsed() >= NOT_HELD_IS_KNOWN_WITHIN && !level.is_lost() =>
                {
                    warn!(
                        lock = %shared.name,
                        owner = %shared.owner,
                        token,
                        "fairlock release: the store no longer has the level, and an earlier \
                         try may have released it; whether the lease was lost is unknown"
                    );
                    Err(Error::Unavailable {
                        backend: "fairlock",
                        endpoint: "the lock store".to_owned(),
                        source: format!(
                            "the release of lock {:?} was first sent {:?} ago, and the store \
                             remembers releases for {RESEND_HORIZON:?}: whether it released \
                             the level or the lease had ended is unknown",
                            shared.name.as_str(),
                            first_sent.elapsed()
                        )
                        .into(),
                    })
                }
                // This guard's hand-over had lapsed (as far as it knew) before it let go: its
                // lease was lost whatever the store answers. A `NotHeld` is that lapse (the
                // level is gone) and says nothing of the hold, which sibling guards may still
                // have. A `Released` for a level live when the guard let go proves it was
                // still there, however late the reply.
                Ok(ReleaseOutcome::Released { .. }) if lost_before => {
                    debug!(
                        ?outcome,
                        "this guard's hand-over had lapsed before its release"
                    );
                    Err(Error::LeaseLost {
                        name: shared.name.to_string(),
                    })
                }
                Ok(ReleaseOutcome::NotHeld) if level.is_lost() => {
                    debug!(
                        ?outcome,
                        "this guard's hand-over had lapsed before its release"
                    );
                    Err(Error::LeaseLost {
                        name: shared.name.to_string(),
                    })
                }
                Ok(ReleaseOutcome::Released { remaining }) => {
                    debug!(remaining, "released");
                    Ok(())
                }
                Ok(ReleaseOutcome::NotHeld) => {
                    debug!("release found the lease already lost");
                    // Sibling guards of the hold learn it too (and it is counted once).
                    if let Some(hold) = hold.upgrade() {
                        hold.mark_lost(LostReason::Revoked);
                    }
                    Err(Error::LeaseLost {
                        name: shared.name.to_string(),
                    })
                }
                Err(err) => {
                    warn!(
                        lock = %shared.name,
                        owner = %shared.owner,
                        token,
                        error = %err,
                        "fairlock release failed; the lock ends with its lease"
                    );
                    Err(err)
                }
            }
        }
        .instrument(span)
        .await
    }
}

/// A release that `unlock` started on the caller's task and has not seen through: if the
/// caller drops it halfway, it is sent again in the background.
struct Unfinished(Option<Release>);

impl Drop for Unfinished {
    fn drop(&mut self) {
        if let Some(release) = self.0.take() {
            release.spawn();
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if !self.released {
            self.end_level().spawn();
        }
    }
}

/// What a guard knows of its own level, apart from the hold's lease: a guard made from a
/// hand-over's wake-up holds a pending level until its confirmation lands, and that level can
/// lapse on its own while sibling guards keep the hold.
#[derive(Debug)]
struct Level {
    /// The level is known (or must be assumed) gone. Never goes back.
    lost: watch::Sender<bool>,
    /// The guard let go of it (released or dropped): its leases read lost at once, while
    /// the release (which keeps this level) may still be on its way. Never goes back.
    let_go: watch::Sender<bool>,
    /// While unconfirmed: the local instant the pending level surely lasts until.
    unconfirmed_until: watch::Sender<Option<Instant>>,
}

impl Level {
    fn is_lost(&self) -> bool {
        *self.lost.borrow()
            || self
                .unconfirmed_until
                .borrow()
                .is_some_and(|until| Instant::now() >= until)
    }

    fn mark_lost(&self, shared: &LockShared, token: u64, why: &str) {
        if !self.lost.send_replace(true) {
            let reason = LostReason::HandoverLapsed;
            warn!(
                lock = %shared.name,
                owner = %shared.owner,
                token,
                reason = %reason.label(),
                "fairlock lease lost: {why}"
            );
            shared.meter.lease_lost(reason.label());
        }
    }
}

/// Confirms a hand-over that a guard was made from on the wake-up alone: its attempt's own
/// `acquire` turns the pending level into a confirmed one and lengthens the hold's lease. If
/// the pending level lapsed first (the wake-up or this call came too late), the store answers
/// that the attempt is spent, and this guard's lease is flagged lost: it has no level, whatever
/// its sibling guards of the same hold have. Transient errors are retried until `deadline`,
/// when the pending level may lapse and the guard is flagged lost the same way. A grant of
/// another hold (a store that forgot the hand-over, with the lock free) flags the hold lost
/// and gives the new hold back at once.
///
/// It starts after [`confirm_delay`] (a deferred task: see [`crate::deferred`]): a guard
/// released before then needs no confirmation (the release removes the pending level as it
/// would a confirmed one, and this task never starts), so a short critical section after a
/// hand-over costs no extra call to the store, and no task.
async fn confirm_hand_over(
    shared: Arc<LockShared>,
    hold: Arc<Hold>,
    level: Arc<Level>,
    token: u64,
    attempt: AttemptId,
    deadline: Instant,
) {
    let lease = shared.options.effective_lease();
    let request = AcquireRequest {
        name: shared.name.clone(),
        owner: shared.owner.clone(),
        attempt,
        lease,
        waiter_ttl: shared.options.waiter_ttl,
        queue: false,
    };
    // A confirmation that is retried may have been applied by the first try (which is not
    // applied again): the lease it set counts from that first try.
    let first_sent = Instant::now();
    loop {
        match timeout_at(deadline, shared.backend.acquire(&request)).await {
            Ok(Ok(AcquireOutcome::Granted(grant))) if grant.token == token => {
                // Confirmed; but a reply read only once the guard's deadline had passed
                // (`timeout_at` polls the call first) comes too late: `is_lease_lost` has
                // said true since then, and must not go back. Decided under the watch's lock,
                // which `Level::is_lost` reads the clock under too. The store's level then
                // ends with this guard's release.
                let in_time = level.unconfirmed_until.send_if_modified(|until| {
                    let in_time = Instant::now() < deadline;
                    if in_time {
                        *until = None;
                    }
                    in_time
                });
                if in_time {
                    debug!(lock = %shared.name, owner = %shared.owner, token, "hand-over confirmed");
                    let _ = hold.extended(first_sent, lease, LostReason::Expired);
                } else {
                    level.mark_lost(
                        &shared,
                        token,
                        "the hand-over was confirmed only after the guard's deadline",
                    );
                }
                return;
            }
            Ok(Ok(AcquireOutcome::Granted(stray))) => {
                // A grant of a new hold: the store had forgotten the hand-over (a failover
                // that lost the last writes) and the lock was free. The hand-over's hold is
                // gone, and nobody holds the new one: it is given back now, not left to
                // block the lock for its whole lease. In a task of its own, so that releasing
                // this guard (which aborts this one) does not stop it.
                hold.mark_lost(LostReason::Revoked);
                drop(tokio::spawn(give_back(
                    shared.clone(),
                    stray.token,
                    attempt,
                )));
                return;
            }
            Ok(Ok(_)) if Instant::now() < deadline => {
                // The pending level surely lives until `deadline` (the store counts its life
                // from later), so it did not lapse: the hold itself ended (force released),
                // and every guard of it learns so now, not at its next renewal or deadline.
                hold.mark_lost(LostReason::Revoked);
                return;
            }
            Ok(Ok(_)) => {
                level.mark_lost(
                    &shared,
                    token,
                    "the hand-over lapsed before it was confirmed",
                );
                return;
            }
            // A call that fails at once never lets `timeout_at` see the deadline: checked here.
            Ok(Err(err)) if Instant::now() < deadline => {
                debug!(lock = %shared.name, owner = %shared.owner, token, error = %err, "confirming a hand-over failed; retrying");
                sleep(Duration::from_millis(20)).await;
            }
            Ok(Err(_)) | Err(_) => {
                level.mark_lost(
                    &shared,
                    token,
                    "the hand-over could not be confirmed in time",
                );
                return;
            }
        }
    }
}

/// Releases the level `attempt` was granted in the hold of `token`, which no guard holds,
/// riding out an outage as a guard's release does.
async fn give_back(shared: Arc<LockShared>, token: u64, attempt: AttemptId) {
    let released = retry_within(shared.options.outage_budget, || {
        shared
            .backend
            .release(&shared.name, &shared.owner, token, attempt)
    })
    .await;
    match released {
        Ok(outcome) => {
            debug!(lock = %shared.name, owner = %shared.owner, token, ?outcome, "gave back a hold granted to a confirmation")
        }
        Err(err) => {
            warn!(lock = %shared.name, owner = %shared.owner, token, error = %err, "fairlock could not give back a hold granted to a confirmation; it ends with its lease")
        }
    }
}

/// How long a guard made from a hand-over waits before confirming it (see
/// [`confirm_hand_over`]): a tenth of the waiter TTL (the pending level's life), at most
/// 100 ms, so nearly all of the level's life is left for the confirmation and its retries.
fn confirm_delay(waiter_ttl: Duration) -> Duration {
    (waiter_ttl / 10).min(Duration::from_millis(100))
}

/// What is left of a lease by the local clock: the hold's deadline, or the pending level's if
/// sooner; zero once lost.
fn remaining(hold: &Hold, level: &Level) -> Duration {
    if lease_ended(hold, level) {
        return Duration::ZERO;
    }
    let mut until = hold.deadline();
    if let Some(unconfirmed) = *level.unconfirmed_until.borrow() {
        until = until.min(unconfirmed);
    }
    until.saturating_duration_since(Instant::now())
}

/// Whether a lease of this level is over: the hold or the level lost, or the guard let go.
fn lease_ended(hold: &Hold, level: &Level) -> bool {
    hold.is_lost() || level.is_lost() || *level.let_go.borrow()
}

/// Completes when the hold or the level is lost, or when either is gone or let go (the guard
/// is released, which ends its lease too). `None`: already gone. Only watches, no timer: the
/// keeper flags a lease that ran out, and a timer here would tie the signal to a runtime
/// with a time driver.
fn lost_signal(
    parts: Option<(&Arc<Hold>, &Arc<Level>)>,
) -> impl Future<Output = ()> + Send + 'static {
    let receivers = parts.map(|(hold, level)| {
        (
            hold.lost_receiver(),
            level.lost.subscribe(),
            level.let_go.subscribe(),
        )
    });
    async move {
        let Some((mut hold_lost, mut level_lost, mut let_go)) = receivers else {
            return;
        };
        // An error means the guard is gone, which also ends the lease.
        tokio::select! {
            _ = hold_lost.wait_for(|lost| *lost) => {}
            _ = level_lost.wait_for(|lost| *lost) => {}
            _ = let_go.wait_for(|gone| *gone) => {}
        }
    }
}

/// A view of one guard's lease: its fencing token, the time left and the lost-lease signal,
/// without the power to release or extend it. Cheap to clone, `Send + 'static`: it can go
/// into spawned tasks. It is what [`FairLock::run`](crate::FairLock::run) hands its closure,
/// and [`LockGuard::lease`] makes one.
///
/// It does not keep the lock or the lease alive: once its guard is gone (released or dropped),
/// it reports the lease lost, even while other guards of the same hold still hold it.
///
/// ```
/// # use fairlock::{LockClient, MemoryBackend};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> fairlock::Result<()> {
/// let client = LockClient::new(MemoryBackend::new());
/// let guard = client.fair_lock("export")?.lock().await?;
/// let lease = guard.lease();
/// assert_eq!(lease.fencing_token(), guard.fencing_token());
/// assert!(!lease.is_lease_lost());
/// guard.unlock().await?;
/// assert!(lease.is_lease_lost());
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Lease {
    shared: Arc<LockShared>,
    grant: Grant,
    hold: Weak<Hold>,
    level: Weak<Level>,
}

impl Lease {
    fn parts(&self) -> Option<(Arc<Hold>, Arc<Level>)> {
        Some((self.hold.upgrade()?, self.level.upgrade()?))
    }

    /// The fencing token of the hold. See [`LockGuard::fencing_token`].
    pub fn fencing_token(&self) -> u64 {
        self.grant.token
    }

    /// The hold count the guard's acquisition produced. See [`LockGuard::hold_count`].
    pub fn hold_count(&self) -> u32 {
        self.grant.hold_count
    }

    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.shared.name
    }

    /// The owner holding the lock. Reading it counts as sharing the owner: see
    /// [`FairLock::owner`](crate::FairLock::owner).
    pub fn owner(&self) -> &Owner {
        // It may now be shared through `fair_lock_as`: stop checking grants (see `levels.rs`).
        self.shared.levels.shared_out();
        &self.shared.owner
    }

    /// Whether the lease is known to be lost, or the guard is gone. See
    /// [`LockGuard::is_lease_lost`].
    pub fn is_lease_lost(&self) -> bool {
        self.parts()
            .is_none_or(|(hold, level)| lease_ended(&hold, &level))
    }

    /// The local estimate of the lease left; zero once lost or the guard is gone. See
    /// [`LockGuard::lease_remaining`].
    pub fn lease_remaining(&self) -> Duration {
        self.parts()
            .map_or(Duration::ZERO, |(hold, level)| remaining(&hold, &level))
    }

    /// Completes when the lease is lost or the guard is gone. See [`LockGuard::lease_lost`].
    ///
    /// # Cancel safety
    /// Cancel safe; it only observes.
    pub fn lease_lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let parts = self.parts();
        lost_signal(parts.as_ref().map(|(hold, level)| (hold, level)))
    }
}
