//! The contract between fairlock's core and a store: [`LockBackend`].
//!
//! A backend implements the eight methods of [`LockBackend`] over its store and keeps the
//! *Contract* written on the trait; the core does all the waiting. The example below is a
//! complete backend: it keeps each tenant's locks under a name prefix in a store shared by
//! several tenants (here a [`MemoryBackend`](crate::MemoryBackend)), so it shows every method
//! and what it must return. A backend for a new store has the same shape, with each method one
//! transaction of the store (see `docs/backends.md` and `MemoryBackend`'s source).
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use async_trait::async_trait;
//! use fairlock::backend::{
//!     AcquireOutcome, AcquireRequest, AttemptId, HolderState, LockBackend, LockState, LockSummary,
//!     ReleaseOutcome, Watch,
//! };
//! use fairlock::{LockClient, LockName, MemoryBackend, Owner, Result};
//!
//! /// One tenant's locks, under `prefix` in a store other tenants share.
//! #[derive(Debug)]
//! struct Tenant {
//!     store: Arc<dyn LockBackend>,
//!     prefix: String,
//! }
//!
//! impl Tenant {
//!     /// The name in the shared store. The core validated `name`; the longer name may still
//!     /// be refused, with a typed error, never a panic.
//!     fn stored(&self, name: &LockName) -> Result<LockName> {
//!         LockName::new(format!("{}{name}", self.prefix))
//!     }
//! }
//!
//! #[async_trait]
//! impl LockBackend for Tenant {
//!     async fn acquire(&self, request: &AcquireRequest) -> Result<AcquireOutcome> {
//!         let mut stored = request.clone();
//!         stored.name = self.stored(&request.name)?;
//!         self.store.acquire(&stored).await
//!     }
//!
//!     async fn release(
//!         &self,
//!         name: &LockName,
//!         owner: &Owner,
//!         token: u64,
//!         attempt: AttemptId,
//!     ) -> Result<ReleaseOutcome> {
//!         self.store.release(&self.stored(name)?, owner, token, attempt).await
//!     }
//!
//!     async fn extend(
//!         &self,
//!         name: &LockName,
//!         owner: &Owner,
//!         token: u64,
//!         lease: Duration,
//!     ) -> Result<bool> {
//!         self.store.extend(&self.stored(name)?, owner, token, lease).await
//!     }
//!
//!     async fn abandon(&self, name: &LockName, owner: &Owner, attempt: AttemptId) -> Result<()> {
//!         self.store.abandon(&self.stored(name)?, owner, attempt).await
//!     }
//!
//!     async fn force_release(&self, name: &LockName, token: u64) -> Result<bool> {
//!         self.store.force_release(&self.stored(name)?, token).await
//!     }
//!
//!     async fn inspect(&self, name: &LockName) -> Result<LockState> {
//!         let mut state = self.store.inspect(&self.stored(name)?).await?;
//!         state.name = name.to_string();
//!         Ok(state)
//!     }
//!
//!     // Optional, but forwarded so the store's own (cheaper) answer is kept.
//!     async fn holder(&self, name: &LockName) -> Result<Option<HolderState>> {
//!         self.store.holder(&self.stored(name)?).await
//!     }
//!
//!     async fn list(&self, prefix: &str) -> Result<Vec<LockSummary>> {
//!         let mut locks = self.store.list(&format!("{}{prefix}", self.prefix)).await?;
//!         for lock in &mut locks {
//!             lock.name = lock.name[self.prefix.len()..].to_owned();
//!         }
//!         Ok(locks)
//!     }
//!
//!     async fn watch(&self, name: &LockName, owner: &Owner) -> Result<Watch> {
//!         self.store.watch(&self.stored(name)?, owner).await
//!     }
//!
//!     // Optional: the shared store's clock and, for metrics, its name.
//!     fn capabilities(&self) -> fairlock::Capabilities {
//!         self.store.capabilities()
//!     }
//!
//!     fn name(&self) -> &'static str {
//!         self.store.name()
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<()> {
//! let shared: Arc<dyn LockBackend> = Arc::new(MemoryBackend::new());
//! let tenant = |prefix: &str| {
//!     LockClient::new(Tenant { store: shared.clone(), prefix: prefix.to_owned() })
//! };
//! let (a, b) = (tenant("a/"), tenant("b/"));
//! let held = a.fair_lock("report")?.lock().await?;
//! // Another tenant's lock of the same name is another lock.
//! let other = b.fair_lock("report")?.try_lock().await?;
//! assert_eq!(a.list("").await?.len(), 1);
//! other.unlock().await?;
//! held.unlock().await?;
//! # Ok(())
//! # }
//! ```
//!
//! [`Deferred`] starts work later without a task until then (for example unsubscribing a
//! wake-up channel some time after its last watch).
//!
//! Prove a backend with the conformance suite (feature `conformance`):
//! `fairlock::conformance::run_all` with a closure that opens instances of it.

use std::any::Any;
use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

pub use crate::deferred::{Deferred, DeferredTask};
use crate::error::Result;
use crate::name::{LockName, Owner};
use crate::wake_queue;

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
/// - A lock is identified by its [`LockName`]. Its state is an optional *hold* and a FIFO
///   *queue*.
/// - An *attempt* is one call of `lock()` / `try_lock*()` by one [`Owner`], named by a fresh
///   [`AttemptId`]. Every operation names the attempt it acts for, never just the owner: one
///   owner may run several attempts at once (tasks sharing a handle, nested locking).
/// - A *hold* belongs to one owner and has a *fencing token*, one *lease* (an expiry time),
///   and a set of *levels*: the attempts that hold it. Its *hold count* is the number of
///   levels. One of them may be *pending*: granted by a hand-over and not yet confirmed by its
///   attempt.
/// - A *queue entry* belongs to one attempt and has a *liveness deadline*.
/// - An attempt *ends* when it is released ([`release`](Self::release)) or abandoned
///   ([`abandon`](Self::abandon)). An attempt is *spent* once it has been granted a level (a
///   grant, a re-entry, a hand-over) or has ended; spent attempts are remembered for
///   [`RESEND_HORIZON`]. An attempt is granted a level at most once in its life.
///
/// # Contract
/// **Clock.** Every lease and liveness deadline MUST be measured by the store's own clock
/// (for Redis: `TIME` inside the script; for SQL: the server's `clock_timestamp()`). Requests
/// carry durations, never timestamps.
///
/// **Atomicity.** Each method MUST take effect wholly or not at all, as one transaction, and
/// MUST validate its input and the stored data before its first write.
///
/// **Re-sends.** A client may deliver any state-changing request again, later, after any
/// other requests by anyone (a network client re-sends after a reconnect; a request can sit
/// in a paused server). Every operation MUST be harmless when applied again:
/// - `acquire` by an attempt that already holds a confirmed level returns that grant (the
///   hold's token and its hold count as it is now, which other levels may have changed since)
///   and changes nothing; by an attempt that is queued, it refreshes the deadline (a heartbeat);
///   by an attempt that is spent and holds no level (its hold ended, it was released or
///   abandoned), it returns [`AcquireOutcome::Busy`] and changes nothing;
/// - `release` and `abandon` remove an attempt, which is gone the second time. A `release`
///   delivered again answers as its first delivery did: `Released` if that one removed the
///   attempt's level, even once the hold has ended or another owner holds the lock (the
///   level was released, not lost), and `NotHeld` if it did not. The core takes `NotHeld`
///   as a lost lease, whether or not the reply it got was to a re-send;
/// - `extend` only ever lengthens the lease of the hold with that token;
/// - `force_release` names the token it frees, which no later hold has. Delivered again, it
///   answers as its first delivery did: `true` if that one freed the hold (the core reads a
///   `false` as final and frees nothing else).
///
/// **Mutual exclusion and reentrancy.** At most one owner holds a lock. `acquire` by an
/// attempt (not spent) of the owner that holds (with a confirmed or a pending level) MUST add
/// that attempt as a level at once, without queueing, keep the token, and remove the
/// attempt's queue entry if it has one. The hold count MUST equal the number of levels: each grant,
/// re-entry or confirmation adds the level of the attempt that asked, exactly once, and each
/// `release` removes the level it names. At 0 levels the lock is free.
///
/// **One lease per hold.** All levels share the hold's lease. A grant sets it to the
/// requested lease from the store's now; a re-entry, a confirmation and
/// [`extend`](Self::extend) set it to the *later* of its current end and the requested lease
/// from now: they MUST never shorten it, since another level may rely on it. A pending level
/// also lapses on its own deadline, whatever the lease.
///
/// **Leases.** A hold whose lease has passed MUST behave as if it did not exist (the lock is
/// free), even if nobody has touched it since. Lease precision is milliseconds.
///
/// **FIFO, no barging.** An attempt of an owner that does not hold MUST be granted only if the
/// lock is free *and* no live queue entry is ahead of it. Queue entries are served in the
/// order they were created; an attempt is queued at most once; a queued attempt that calls
/// `acquire` again keeps its place (that call is its heartbeat).
///
/// **Waiter liveness.** Each queue entry's deadline is set to `waiter_ttl` from the store's
/// now each time its attempt calls `acquire`. An entry whose deadline has passed MUST be
/// treated as gone wherever it stands: it never blocks the entries behind it, it is not
/// counted or listed, and it is not granted the lock. Removal may be lazy (amortised) but the
/// effect must be immediate, except as *A crowd of dead entries* below allows. Its attempt
/// has not ended: a later `acquire` of it queues it again, at the tail.
///
/// **A crowd of dead entries.** A backend may bound the expired entries a call removes (many
/// waiters that died together could otherwise cost one call all of them). When a call has
/// used that budget without reaching a live entry at the front, the head is not known, and
/// only then: a call that frees the lock MAY leave it free instead of handing it over, and
/// MUST then send [`Wake::Recheck`] to the watches of every owner with a live entry (best
/// effort, as every wake-up); and while the lock is free, an `acquire` that queues (or keeps)
/// its attempt MAY answer [`AcquireOutcome::Queued`] with `retry_after` zero (ask again at
/// once). Each such call MUST remove at least one of the expired entries in front, so that
/// the first live entry is granted within a bounded number of calls; and FIFO holds
/// throughout: no attempt is granted while a live entry stands ahead of it.
///
/// **Hand-over.** When the lock becomes free by `release`, `abandon` or `force_release`, the
/// backend MUST (unless *A crowd of dead entries* allows otherwise) hand it to the head live queue entry as a *pending grant* (a new hold with
/// that attempt as its pending level, a fresh token, lease = the entry's `waiter_ttl`),
/// remove the entry, and send [`Wake::Granted`] with that attempt to the watches of its owner
/// (or [`Wake::Recheck`], which costs the grantee one call: a backend that wants the grant
/// confirmed before the waiter relies on it, as Redis does while waiting for replicas, sends
/// that).
/// Only that attempt's own `acquire` confirms it (it returns [`AcquireOutcome::Granted`] with
/// the same token); [`extend`](Self::extend) MUST NOT, so that another level's renewals never
/// keep a dead grantee's level alive. A pending level that is not confirmed within its
/// `waiter_ttl` MUST end by itself (the hold ends with it if it was the only level), so a dead
/// waiter never holds the lock longer than its liveness TTL; a later `acquire` of its attempt
/// then finds it spent (`Busy`), and the core goes on as a new attempt. [`AcquireOutcome::Queued`] MUST report a token at least
/// as high as every token issued for the lock so far and below every token it will issue
/// later (the lock's highest does; so does a counter shared by all locks), so the core can
/// tell a fresh hand-over from a stale one.
///
/// **Ending attempts.** [`release`](Self::release) removes the named level (pending or
/// confirmed); [`abandon`](Self::abandon) removes whatever the attempt has: its queue entry,
/// its pending or confirmed level. Both record the attempt as spent (even when it had
/// nothing), as does every grant of a level, for at least [`RESEND_HORIZON`], in storage
/// that expires by itself. A hand-over's record MUST last that long from when its pending
/// level lapses unconfirmed, not only from the hand-over: its waiter may send an `acquire`
/// until then (a heartbeat that did not hear the wake-up).
///
/// **Wake-ups may be lost.** Delivery to a [`Watch`] is best effort: a backend MAY lose
/// messages (reconnects, lag). A watch is per owner: every watch of the owner receives a
/// wake-up about any of its attempts, and the core tells its attempts apart. For an owner
/// that [`Owner::is_unique`], which acts through one backend value, "every watch" may be read
/// as every watch registered through the backend value (and its clones) that made the
/// attempt's request: a backend MAY send its wake-ups there alone. The core
/// re-checks by calling `acquire` at least every `waiter_ttl / 3` (the heartbeat), and sooner
/// when [`AcquireOutcome::Queued`] carries a `retry_after` hint, so a lost wake-up delays a
/// waiter by at most one heartbeat. A backend SHOULD give `retry_after` = the holder's
/// remaining lease to the head waiter, so a lease that simply runs out is noticed promptly.
/// When an attempt leaves the queue of a free lock, the new head SHOULD be sent
/// [`Wake::Recheck`]. [`watch`](Self::watch) MUST be registered before it returns: a wake-up
/// sent after that reaches it unless lost as above.
///
/// **Fencing tokens.** Tokens MUST strictly increase per lock name over all grants, across
/// lease expiry, force release and the lock's keys being cleaned up. Re-entry and
/// confirmation keep the hold's token. (Across a loss of the store's data, what a backend
/// guarantees must be documented; see the Redis backend.)
///
/// **Nothing left behind.** A lock that is free with no live waiters SHOULD occupy no storage
/// except what fencing needs and the records of spent attempts and force-released tokens,
/// which expire after [`RESEND_HORIZON`]. Whatever a caller left (a queued attempt, a held lock) MUST end by
/// itself within its liveness TTL or lease. The core ends every attempt it started (by
/// `release` or `abandon`, in the background if its caller is gone), so a backend need not
/// be cancel safe beyond atomicity.
///
/// **Capabilities.** A store may measure time more coarsely than milliseconds; it then rounds
/// every lease and deadline *up* (a lock is never freed, and a waiter never evicted, early) and
/// declares its step in [`LockBackend::capabilities`]. Nothing else in this contract is
/// optional.
///
/// **Errors.** Input has been validated by the core (names, owners, durations in
/// `1 ms ..= MAX_DURATION`). Map store failures to
/// [`Error::Unavailable`](crate::Error::Unavailable) (could not reach the store, or the outcome
/// is unknown), [`Error::Conflict`](crate::Error::Conflict) (foreign data at the lock's keys)
/// or [`Error::Backend`](crate::Error::Backend). Never panic on store data.
#[async_trait]
pub trait LockBackend: Send + Sync + fmt::Debug + 'static {
    /// One step of an attempt: grant, re-enter, confirm a pending grant, or (with
    /// `request.queue`) join or stay in the queue and refresh the liveness deadline.
    ///
    /// Without `request.queue` the call never changes the queue and returns
    /// [`AcquireOutcome::Busy`] where it would have queued.
    async fn acquire(&self, request: &AcquireRequest) -> Result<AcquireOutcome>;

    /// Removes the level of `attempt` (pending or confirmed) from `owner`'s hold with fencing
    /// token `token`, and ends the attempt. At 0 levels the lock is free and the head waiter
    /// is handed the lock. Returns [`ReleaseOutcome::Released`] with the levels left; also
    /// when a release of this attempt removed its level before (this one is a re-send): the
    /// levels left of that hold, or 0 once it has ended. Returns
    /// [`ReleaseOutcome::NotHeld`] when `owner` has no hold with `token` (it ended: expired,
    /// force-released) or has one without a level of the attempt, and no release of the
    /// attempt removed one: the lease was lost. Either way nothing else changes, and the
    /// attempt is recorded as spent (remembering whether a release removed its level).
    async fn release(
        &self,
        name: &LockName,
        owner: &Owner,
        token: u64,
        attempt: AttemptId,
    ) -> Result<ReleaseOutcome>;

    /// Sets the lease of `owner`'s hold with fencing token `token` to the later of its current
    /// end and `lease` from now. It does not confirm a pending level. Returns `false`,
    /// changing nothing, if `owner` does not hold the lock with that token.
    async fn extend(
        &self,
        name: &LockName,
        owner: &Owner,
        token: u64,
        lease: Duration,
    ) -> Result<bool>;

    /// Ends `attempt` whatever it has: removes its queue entry, and its level if it holds one
    /// (pending, or granted by a call whose reply never arrived), handing the lock on if that
    /// was the last level. Succeeds when the attempt had nothing.
    async fn abandon(&self, name: &LockName, owner: &Owner, attempt: AttemptId) -> Result<()>;

    /// Frees the hold with fencing token `token`, whoever holds it and whatever its count, and
    /// hands the lock on to the head waiter. Returns whether that hold existed, or was freed
    /// by a `force_release` of the same token before (this one is a re-send); the token is
    /// remembered for [`RESEND_HORIZON`], as spent attempts are.
    async fn force_release(&self, name: &LockName, token: u64) -> Result<bool>;

    /// A snapshot of the lock as the store sees it now.
    async fn inspect(&self, name: &LockName) -> Result<LockState>;

    /// The holder of the lock as the store sees it now: what [`inspect`](Self::inspect)
    /// reports as [`LockState::holder`], without the queue. `LockGuard::is_held` and
    /// `force_unlock` ask only this, so a store whose `inspect` walks the queue (its work
    /// growing with the waiters, dead ones included) should answer it without that walk. The
    /// default calls `inspect`.
    async fn holder(&self, name: &LockName) -> Result<Option<HolderState>> {
        Ok(self.inspect(name).await?.holder)
    }

    /// The locks whose names start with `prefix` that are held or have live waiters, in any
    /// order.
    async fn list(&self, prefix: &str) -> Result<Vec<LockSummary>>;

    /// Registers for wake-ups sent to any attempt of `owner` on lock `name`; dropping the
    /// [`Watch`] unregisters. Registered before it returns (see *Wake-ups may be lost*).
    async fn watch(&self, name: &LockName, owner: &Owner) -> Result<Watch>;

    /// What this store may legitimately lack (see *Capabilities*). The default is a store with
    /// a millisecond clock. A wrapper forwards its inner backend's.
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    /// A short, fixed name for the kind of store, such as `memory` or `redis`: the `backend`
    /// label of fairlock's metrics (feature `metrics`). The default is `custom`; a wrapper
    /// may forward its inner backend's or name itself.
    ///
    /// ```
    /// use fairlock::{LockBackend, MemoryBackend};
    /// assert_eq!(MemoryBackend::new().name(), "memory");
    /// ```
    fn name(&self) -> &'static str {
        "custom"
    }
}

/// What a store may legitimately lack, declared by its backend
/// ([`LockBackend::capabilities`]), so the conformance suite widens only the margins that
/// depend on it instead of weakening its checks for every backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// The step of the store's clock for leases and deadlines: each is rounded *up* to a
    /// multiple of it (never ends early). 1 ms for Redis and the memory backend; a store that
    /// keeps leases in whole seconds declares 1 s.
    pub clock_granularity: Duration,
}

impl Default for Capabilities {
    fn default() -> Self {
        Capabilities {
            clock_granularity: Duration::from_millis(1),
        }
    }
}

impl Capabilities {
    /// A store whose clock steps by `granularity` (at least 1 ms).
    pub fn with_clock_granularity(granularity: Duration) -> Self {
        Capabilities {
            clock_granularity: granularity.max(Duration::from_millis(1)),
        }
    }
}

/// How long a backend remembers a spent attempt, so that a re-sent `acquire` of it changes
/// nothing (see the contract's *Re-sends* and *Ending attempts*): from the last time its
/// attempt may have sent an `acquire` (its grant, its end, or the lapse of its hand-over).
/// A request delivered later than this after it was sent may act again; the harm is then
/// bounded by one lease or waiter TTL (and the core ends every attempt it started, which
/// records it again).
pub const RESEND_HORIZON: Duration = Duration::from_secs(60);

/// The identity of one attempt to acquire a lock (one `lock()` / `try_lock*()` call).
///
/// Random, so attempts of every process are distinct without coordination. Written as 32
/// lowercase hex digits ([`Display`](fmt::Display) and [`FromStr`](std::str::FromStr)), which
/// contain no separator a backend might use.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AttemptId(u128);

impl AttemptId {
    /// A fresh random id.
    pub fn random() -> Self {
        AttemptId(uuid::Uuid::new_v4().as_u128())
    }

    /// The id with this value (for tests and stores that keep it as a number).
    pub const fn from_u128(value: u128) -> Self {
        AttemptId(value)
    }

    /// Its value.
    pub const fn as_u128(self) -> u128 {
        self.0
    }
}

impl fmt::Display for AttemptId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl fmt::Debug for AttemptId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AttemptId({self})")
    }
}

impl std::str::FromStr for AttemptId {
    type Err = std::num::ParseIntError;

    fn from_str(text: &str) -> std::result::Result<Self, Self::Err> {
        u128::from_str_radix(text, 16).map(AttemptId)
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for AttemptId {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// The arguments of [`LockBackend::acquire`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcquireRequest {
    /// The lock.
    pub name: LockName,
    /// Who acquires.
    pub owner: Owner,
    /// Which attempt of the owner this call belongs to.
    pub attempt: AttemptId,
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
        /// The highest fencing token issued for this lock so far (0 if none), or any token
        /// between it and the next one the lock will be issued (see the contract). A
        /// [`Wake::Granted`] whose token is not above it was made before this call and is
        /// stale (that hand-over has since expired or been revoked), so the core ignores it.
        last_token: u64,
    },
    /// The lock is held by someone else or has waiters, and the request did not queue.
    Busy,
}

/// A successful acquisition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
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
///
/// This and the other snapshot types ([`HolderState`], [`WaiterState`], [`LockSummary`]) may
/// gain fields in minor releases: outside this crate, build them with their `new`
/// constructor, which will give a new field a neutral value, so a backend keeps compiling.
///
/// ```
/// use std::time::Duration;
/// use fairlock::backend::{AttemptId, HolderState, LockState, WaiterState};
///
/// let holder = HolderState::new("owner-a", 1, 42, Duration::from_secs(30), true);
/// let waiter = WaiterState::new("owner-b", AttemptId::from_u128(7), Duration::from_secs(5));
/// let state = LockState::new("billing", Some(holder), vec![waiter]);
/// assert_eq!(state.holder.unwrap().token, 42);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct LockState {
    /// The lock's name.
    pub name: String,
    /// The holder, if the lock is held.
    pub holder: Option<HolderState>,
    /// Live waiters, first in line first.
    pub waiters: Vec<WaiterState>,
}

/// The holder of a lock.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct HolderState {
    /// The holder's owner id.
    pub owner: String,
    /// How many levels it holds (pending one included).
    pub hold_count: u32,
    /// Its fencing token.
    pub token: u64,
    /// Time left on the lease, by the store's clock.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub lease_remaining: Duration,
    /// `false` while this is a pending grant the waiter has not confirmed yet.
    pub confirmed: bool,
}

/// One live waiter of a lock.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct WaiterState {
    /// The waiter's owner id.
    pub owner: String,
    /// The attempt this queue entry belongs to.
    pub attempt: AttemptId,
    /// Time left until its liveness deadline, by the store's clock.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde"))]
    pub deadline_in: Duration,
}

/// One line of [`LockBackend::list`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct LockSummary {
    /// The lock's name.
    pub name: String,
    /// The holder's owner id, if held.
    pub holder: Option<String>,
    /// The number of live waiters.
    pub waiters: usize,
}

impl LockState {
    /// The snapshot of lock `name`: its holder, if any, and its live waiters, first in line
    /// first.
    pub fn new(
        name: impl Into<String>,
        holder: Option<HolderState>,
        waiters: Vec<WaiterState>,
    ) -> Self {
        LockState {
            name: name.into(),
            holder,
            waiters,
        }
    }
}

impl HolderState {
    /// A holder: its owner id, hold count (the pending level included), fencing token, time
    /// left on its lease by the store's clock, and whether its grant is confirmed (`false`
    /// for a hand-over not yet confirmed).
    pub fn new(
        owner: impl Into<String>,
        hold_count: u32,
        token: u64,
        lease_remaining: Duration,
        confirmed: bool,
    ) -> Self {
        HolderState {
            owner: owner.into(),
            hold_count,
            token,
            lease_remaining,
            confirmed,
        }
    }
}

impl WaiterState {
    /// A live waiter: its owner id, the attempt its queue entry belongs to, and the time left
    /// until its liveness deadline by the store's clock.
    pub fn new(owner: impl Into<String>, attempt: AttemptId, deadline_in: Duration) -> Self {
        WaiterState {
            owner: owner.into(),
            attempt,
            deadline_in,
        }
    }
}

impl LockSummary {
    /// One lock of a listing: its name, its holder's owner id if held, and its number of live
    /// waiters.
    pub fn new(name: impl Into<String>, holder: Option<String>, waiters: usize) -> Self {
        LockSummary {
            name: name.into(),
            holder,
            waiters,
        }
    }
}

/// A wake-up for one waiter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wake {
    /// The lock was handed to `attempt` as a pending grant. Other attempts of the same owner
    /// take it as [`Wake::Recheck`] (they re-enter on their next `acquire`).
    Granted {
        /// The attempt the lock was handed to.
        attempt: AttemptId,
        /// The grant: its token, hold count 1.
        grant: Grant,
    },
    /// Something changed: call `acquire` again now.
    Recheck,
}

/// The receiving end of a waiter's wake-ups (see [`LockBackend::watch`]).
///
/// A backend makes one with [`Watch::channel`], keeps the [`WakeSender`] where its dispatcher
/// finds it, and can attach a registration value that is dropped with the watch (to
/// unsubscribe, for example).
pub struct Watch {
    receiver: wake_queue::Receiver,
    // Held only for its Drop: it unregisters the watch from the backend.
    _registration: Option<Box<dyn Any + Send + Sync>>,
}

impl Watch {
    /// A new watch and the sender that wakes it.
    pub fn channel() -> (WakeSender, Watch) {
        let (sender, receiver) = wake_queue::queue();
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
pub struct WakeSender(wake_queue::Sender);

impl WakeSender {
    /// Delivers `wake`; returns `false` if the watch is gone.
    pub fn send(&self, wake: Wake) -> bool {
        self.0.send(wake)
    }

    /// Whether the watch has been dropped (the sender can be discarded).
    pub fn is_closed(&self) -> bool {
        self.0.is_closed()
    }
}
