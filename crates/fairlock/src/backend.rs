//! The contract between fairlock's core and a store: [`LockBackend`].

use std::any::Any;
use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use serde::Serialize;
use tokio::sync::mpsc;

use crate::error::Result;
use crate::name::{LockName, Owner};

/// A store that keeps the state of fair locks: the atomic steps of a lock's state machine.
///
/// The core ([`LockClient`](crate::LockClient) and friends) does all waiting, heart-beating,
/// lease renewal and cancellation on top of these few operations, once, for every backend.
/// A backend only has to make each operation atomic and keep the contract below. Run
/// `conformance::run_all` (feature `conformance`) to check it.
///
/// Implementations are used as `Arc<dyn LockBackend>`, so the trait is object safe.
///
/// # Terms
/// - A lock is identified by its [`LockName`]. Its state is: an optional *holder* (an
///   [`Owner`], a *hold count* ≥ 1, a *fencing token*, a *lease*), and a FIFO *queue* of
///   waiting owners, each with a *liveness deadline*.
/// - A *grant* makes an owner the holder with hold count 1 and a fresh fencing token.
/// - A *pending grant* is a grant the store made on a waiter's behalf while handing the lock
///   over (see *Hand-over*). It has not been confirmed by the waiter yet.
///
/// # Contract
/// **Clock.** Every lease and liveness deadline MUST be measured by the store's own clock
/// (for Redis: `TIME` inside the script). Requests carry durations, never timestamps, and a
/// backend MUST NOT use the caller's clock for deadlines kept in a shared store.
///
/// **Atomicity.** Each method MUST take effect wholly or not at all, and at most once: a
/// backend whose client re-sends commands after a reconnect MUST make the re-sent call a no-op
/// (e.g. with a request id) or not re-send it.
///
/// **Reentrancy.** [`acquire`](Self::acquire) by the current holder MUST increment the hold
/// count, keep the fencing token, set the lease to the requested one from now, and never queue.
/// [`release`](Self::release) by the holder MUST decrement it; at 0 the lock is free.
///
/// **FIFO, no barging.** A new owner MUST be granted the lock only if it is free *and* no live
/// waiter is queued ahead of it. Waiters are granted in the order they were first queued. A
/// queued owner that calls `acquire` again keeps its place (that call is its heartbeat). An
/// owner is queued at most once per lock.
///
/// **Leases.** A lock whose lease has passed MUST behave as free (its holder is gone), even if
/// nobody has touched it since. Lease precision is milliseconds.
///
/// **Waiter liveness.** Each queued owner has a liveness deadline, set to `waiter_ttl` from
/// the store's now each time it calls `acquire`. A waiter whose deadline has passed MUST be
/// treated as gone wherever it stands in the queue: it never blocks the owners behind it, it
/// is not counted, and it is not granted the lock. Removal may be lazy (amortised) but the
/// effect must be immediate.
///
/// **Hand-over.** When the lock becomes free by [`release`](Self::release) or
/// [`force_release`](Self::force_release), the backend MUST either
/// - hand it to the head live waiter as a *pending grant* (hold count 1, a fresh token) and
///   send [`Wake::Granted`] to that waiter's [`Watch`], or
/// - leave it free and send [`Wake::Recheck`] to the head waiter's `Watch`.
///
/// [`AcquireOutcome::Queued`] MUST report the highest token issued for the lock so far, so
/// the waiter can tell a fresh hand-over from one that was revoked before it looked.
/// A pending grant MUST expire `waiter_ttl` after it was made unless the waiter confirms it
/// first, so a dead waiter never holds the lock longer than its liveness TTL. The waiter
/// confirms it by `acquire` (which then returns [`AcquireOutcome::Granted`] with hold count 1
/// and the same token, not an increment) or by [`extend`](Self::extend) with that token;
/// either sets the requested lease from now. [`leave_queue`](Self::leave_queue) by the
/// grantee of a pending grant MUST release it (handing it on as above).
///
/// **Wake-ups may be lost.** Delivery to a [`Watch`] is best effort: a backend MAY lose
/// messages (reconnects, lag). The core re-checks by calling `acquire` at least every
/// `waiter_ttl / 3` (the heartbeat), and sooner when [`AcquireOutcome::Queued`] carries a
/// `retry_after` hint, so a lost wake-up delays a waiter by at most one heartbeat. A backend
/// SHOULD give `retry_after` = the holder's remaining lease to the head waiter, so a lease
/// that simply runs out is noticed promptly without a wake-up.
/// [`watch`](Self::watch) MUST be registered before it returns: a wake-up sent after that
/// reaches it unless lost as above.
///
/// **Fencing tokens.** Tokens MUST strictly increase per lock name over all grants, across
/// lease expiry, force release and the lock's keys being cleaned up. A reentrant acquisition
/// and a confirmed pending grant keep the holder's token. (Across a loss of the store's data,
/// what a backend guarantees must be documented; see the Redis backend.)
///
/// **Nothing left behind.** A lock that is free with no live waiters SHOULD occupy no storage
/// except what fencing needs, and whatever a caller left (a queued waiter, a held lock) MUST
/// end by itself within its liveness TTL or lease. Cancelled calls: the core runs every
/// state-changing call to completion in a background task and undoes its effect if its caller
/// has gone, so a backend need not be cancel safe beyond atomicity; where even that cleanup
/// cannot run (the process died), the TTLs above bound what remains.
///
/// **Errors.** Map store failures to [`Error::Unavailable`](crate::Error::Unavailable) (could
/// not reach the store), [`Error::Conflict`](crate::Error::Conflict) (foreign data at the
/// lock's keys) or [`Error::Backend`](crate::Error::Backend). Never panic on store data.
#[async_trait]
pub trait LockBackend: Send + Sync + fmt::Debug + 'static {
    /// One attempt to acquire: grant, re-enter, confirm a pending grant, or (with
    /// `request.queue`) join or stay in the queue and refresh the liveness deadline.
    ///
    /// Without `request.queue` the call never changes the queue and returns
    /// [`AcquireOutcome::Busy`] where it would have queued.
    async fn acquire(&self, request: &AcquireRequest) -> Result<AcquireOutcome>;

    /// Releases one level of `owner`'s hold, if `owner` holds the lock with fencing token
    /// `token` (pending or confirmed). At hold count 0 the lock is free and the head waiter
    /// is handed the lock or woken. Anyone else gets [`ReleaseOutcome::NotHeld`] and nothing
    /// changes.
    async fn release(&self, name: &LockName, owner: &Owner, token: u64) -> Result<ReleaseOutcome>;

    /// Sets the lease of `owner`'s hold with fencing token `token` to `lease` from now (and
    /// confirms it if it is a pending grant). Returns `false`, changing nothing, if `owner`
    /// does not hold the lock with that token.
    async fn extend(
        &self,
        name: &LockName,
        owner: &Owner,
        token: u64,
        lease: Duration,
    ) -> Result<bool>;

    /// Removes `owner` from the queue (a waiter gives up), and releases a pending grant made
    /// to `owner`. Succeeds when `owner` was not queued.
    async fn leave_queue(&self, name: &LockName, owner: &Owner) -> Result<()>;

    /// Frees the lock whoever holds it, whatever the hold count, and hands it on to (or wakes)
    /// the head waiter. Returns whether it was held.
    async fn force_release(&self, name: &LockName) -> Result<bool>;

    /// A snapshot of the lock as the store sees it now.
    async fn inspect(&self, name: &LockName) -> Result<LockState>;

    /// The locks whose names start with `prefix` that are held or have live waiters, in any
    /// order.
    async fn list(&self, prefix: &str) -> Result<Vec<LockSummary>>;

    /// Registers for wake-ups sent to `owner` about lock `name`; dropping the [`Watch`]
    /// unregisters. Registered before it returns (see *Wake-ups may be lost*).
    async fn watch(&self, name: &LockName, owner: &Owner) -> Result<Watch>;
}

/// The arguments of [`LockBackend::acquire`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcquireRequest {
    /// The lock.
    pub name: LockName,
    /// Who acquires.
    pub owner: Owner,
    /// The lease to set if granted (or re-entered, or confirmed): at least 1 ms.
    pub lease: Duration,
    /// The liveness TTL of the caller's place in the queue: at least 1 ms.
    pub waiter_ttl: Duration,
    /// Join (or stay in) the queue when the lock cannot be granted now.
    pub queue: bool,
}

/// The result of [`LockBackend::acquire`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AcquireOutcome {
    /// The caller holds the lock.
    Granted(Grant),
    /// The caller is queued (only when the request asked to queue).
    Queued {
        /// When it is worth checking again (e.g. the holder's remaining lease, given to the
        /// head waiter). `None`: wait for a wake-up or the next heartbeat.
        retry_after: Option<Duration>,
        /// The highest fencing token issued for this lock so far (0 if none). A
        /// [`Wake::Granted`] whose token is not above it was made before this call and is
        /// stale (that hand-over has since expired or been revoked), so the core ignores it.
        last_token: u64,
    },
    /// The lock is held by someone else or has waiters, and the request did not queue.
    Busy,
}

/// A successful acquisition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Grant {
    /// The fencing token of this hold: strictly greater than any earlier hold's.
    pub token: u64,
    /// The hold count after this acquisition: 1 for a first grant, more when re-entered.
    pub hold_count: u32,
}

/// The result of [`LockBackend::release`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// One level was released; `remaining` levels are still held (0: the lock is free or
    /// handed on).
    Released {
        /// The hold count left.
        remaining: u32,
    },
    /// The caller did not hold the lock with that token. Nothing changed.
    NotHeld,
}

/// A snapshot of one lock, from [`LockBackend::inspect`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LockState {
    /// The lock's name.
    pub name: String,
    /// The holder, if the lock is held.
    pub holder: Option<HolderState>,
    /// Live waiters, first in line first.
    pub waiters: Vec<WaiterState>,
}

/// The holder of a lock.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HolderState {
    /// The holder's owner id.
    pub owner: String,
    /// How many times it holds the lock.
    pub hold_count: u32,
    /// Its fencing token.
    pub token: u64,
    /// Time left on the lease, by the store's clock.
    #[serde(with = "humantime_serde")]
    pub lease_remaining: Duration,
    /// `false` while this is a pending grant the waiter has not confirmed yet.
    pub confirmed: bool,
}

/// One live waiter of a lock.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WaiterState {
    /// The waiter's owner id.
    pub owner: String,
    /// Time left until its liveness deadline, by the store's clock.
    #[serde(with = "humantime_serde")]
    pub deadline_in: Duration,
}

/// One line of [`LockBackend::list`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LockSummary {
    /// The lock's name.
    pub name: String,
    /// The holder's owner id, if held.
    pub holder: Option<String>,
    /// The number of live waiters.
    pub waiters: usize,
}

/// A wake-up for one waiter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wake {
    /// The lock was handed to this waiter as a pending grant with this token.
    Granted(Grant),
    /// Something changed: call `acquire` again now.
    Recheck,
}

/// The receiving end of a waiter's wake-ups (see [`LockBackend::watch`]).
///
/// A backend makes one with [`Watch::channel`], keeps the [`WakeSender`] where its dispatcher
/// finds it, and can attach a registration value that is dropped with the watch (to
/// unsubscribe, for example).
pub struct Watch {
    receiver: mpsc::UnboundedReceiver<Wake>,
    // Held only for its Drop: it unregisters the watch from the backend.
    _registration: Option<Box<dyn Any + Send + Sync>>,
}

impl Watch {
    /// A new watch and the sender that wakes it.
    pub fn channel() -> (WakeSender, Watch) {
        let (sender, receiver) = mpsc::unbounded_channel();
        (
            WakeSender(sender),
            Watch {
                receiver,
                _registration: None,
            },
        )
    }

    /// Attaches a value that lives as long as the watch; its `Drop` can unregister it.
    pub fn with_registration(mut self, registration: impl Any + Send + Sync) -> Self {
        self._registration = Some(Box::new(registration));
        self
    }

    /// Waits for the next wake-up. `None` when every sender is gone: the caller then relies on
    /// its heartbeat alone.
    ///
    /// # Cancel safety
    /// Cancel safe: a wake-up is never lost by dropping this future.
    pub async fn recv(&mut self) -> Option<Wake> {
        self.receiver.recv().await
    }
}

impl fmt::Debug for Watch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watch").finish_non_exhaustive()
    }
}

/// Sends wake-ups to one [`Watch`].
#[derive(Clone, Debug)]
pub struct WakeSender(mpsc::UnboundedSender<Wake>);

impl WakeSender {
    /// Delivers `wake`; returns `false` if the watch is gone.
    pub fn send(&self, wake: Wake) -> bool {
        self.0.send(wake).is_ok()
    }

    /// Whether the watch has been dropped (the sender can be discarded).
    pub fn is_closed(&self) -> bool {
        self.0.is_closed()
    }
}
