//! The user API: [`LockClient`] (a backend plus defaults) and [`FairLock`] (one owner's handle
//! on one lock).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::{LockBackend, LockState, LockSummary};
use crate::error::Result;
use crate::guard::{Lease, LockGuard};
use crate::lease::Holds;
use crate::levels::OwnLevels;
use crate::name::{LockName, Owner};
use crate::options::{check_max, LockOptions};
use crate::telemetry::Meter;
use crate::waiting::{self, Wait};

/// Entry point: a backend and the default [`LockOptions`] for the locks made from it.
///
/// Cheap to clone (it holds an `Arc`). Every call needs a Tokio runtime.
///
/// ```
/// use fairlock::{LockClient, MemoryBackend};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> fairlock::Result<()> {
/// let client = LockClient::new(MemoryBackend::new());
/// let lock = client.fair_lock("nightly-report")?;
/// let guard = lock.lock().await?;
/// println!("holding with fencing token {}", guard.fencing_token());
/// guard.unlock().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct LockClient {
    backend: Arc<dyn LockBackend>,
    /// What the core calls: the backend, wrapped to count its errors with feature `metrics`.
    store: Arc<dyn LockBackend>,
    /// Label metrics with the lock's name.
    lock_label: bool,
    options: LockOptions,
    /// The holds of this client's guards: guards of one hold share its lease.
    holds: Arc<Holds>,
}

impl LockClient {
    /// A client over `backend` with default options.
    pub fn new(backend: impl LockBackend) -> Self {
        Self::from_arc(Arc::new(backend))
    }

    /// A client over a shared backend (chosen at run time, for example).
    pub fn from_arc(backend: Arc<dyn LockBackend>) -> Self {
        LockClient {
            store: store(&backend, false),
            backend,
            lock_label: false,
            options: LockOptions::default(),
            holds: Arc::default(),
        }
    }

    /// Whether the metrics of locks made from now on carry a `lock` label with the lock's
    /// name (off by default). Only for a small, fixed set of names: every name is a series
    /// of each metric in the metrics backend. Has an effect with the `metrics` feature only;
    /// see `docs/observability.md`.
    ///
    /// ```
    /// use fairlock::{LockClient, MemoryBackend};
    /// let client = LockClient::new(MemoryBackend::new()).with_lock_name_in_metrics(true);
    /// # drop(client);
    /// ```
    pub fn with_lock_name_in_metrics(mut self, enabled: bool) -> Self {
        self.lock_label = enabled;
        self.store = store(&self.backend, enabled);
        self
    }

    /// Sets the default options of locks made from now on.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) if an option is out of range.
    pub fn with_options(mut self, options: LockOptions) -> Result<Self> {
        options.validate()?;
        self.options = options;
        Ok(self)
    }

    /// The default options.
    pub fn options(&self) -> &LockOptions {
        &self.options
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<dyn LockBackend> {
        &self.backend
    }

    /// A handle on lock `name` with a fresh, unique [`Owner`]: acquisitions through this handle
    /// are reentrant with each other and exclusive with every other handle.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a bad name.
    pub fn fair_lock(&self, name: &str) -> Result<FairLock> {
        self.handle(name, Owner::unique(), true)
    }

    /// A handle on lock `name` acting as `owner`. Every handle with the same owner (in any
    /// process) is the same holder: their acquisitions are reentrant with each other, and
    /// the guards they hold share one lease.
    ///
    /// Since a level of a shared owner may belong to any of its handles, a level whose
    /// release the store lost (a failover) is re-entered by the owner's next acquisitions and
    /// lives as long as they renew the hold. Handles from [`fair_lock`](Self::fair_lock)
    /// free such a level instead (see [`FairLock`]), so take a `fair_lock` handle's owner
    /// only through its `owner()`, which tells it: an owner rebuilt with [`Owner::new`] from
    /// an id read elsewhere (`state()`, a log line) would let that handle take a level of
    /// yours for its own stale one, and free the hold under you.
    ///
    /// An owner from [`Owner::unique`] (such as a `fair_lock` handle's
    /// [`owner`](FairLock::owner)) is taken to act through one backend value: share it only
    /// with clients of this client's backend, or its attempts elsewhere may hear of a grant
    /// to the owner only at their next heartbeat. [`Owner::new`] with its id makes one that
    /// may act anywhere.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a bad name.
    pub fn fair_lock_as(&self, name: &str, owner: Owner) -> Result<FairLock> {
        self.handle(name, owner, false)
    }

    /// A handle as `owner`; `exclusive`: no other handle acts as that owner.
    fn handle(&self, name: &str, owner: Owner, exclusive: bool) -> Result<FairLock> {
        let name = LockName::new(name)?;
        let meter = Meter::new(
            self.backend.name(),
            self.lock_label.then_some(name.as_str()),
        );
        Ok(FairLock {
            shared: Arc::new(LockShared {
                backend: self.store.clone(),
                name,
                owner,
                options: self.options.clone(),
                holds: self.holds.clone(),
                levels: OwnLevels::new(exclusive),
                meter,
                last_wait: std::sync::Mutex::new(None),
            }),
        })
    }

    /// Frees lock `name` whoever holds it (an operator's tool); the head waiter gets it next.
    /// Returns whether the hold it found was force-released. The holder's guards report their
    /// lease lost: at once if they were acquired through this client (or a handle it made),
    /// otherwise at their next renewal, [`extend`](LockGuard::extend) or
    /// [`is_held`](LockGuard::is_held).
    ///
    /// It reads the current hold and frees exactly that one (named by its fencing token), so
    /// the request, even if delivered again later, never frees a hold made after it. `true`
    /// when that hold was freed by this call, or by another force release of the same hold
    /// in the last minute (two operators at once: both are told `true`; a re-send by the
    /// client after a lost reply is answered as its first copy was). `false` when the lock
    /// was free, or when the hold read ended by itself before the release reached the store
    /// (the lock may be held again by then: look with [`state`](Self::state)).
    ///
    /// # Cancel safety
    /// The store applies it atomically; if cancelled, it may or may not have been applied.
    pub async fn force_unlock(&self, name: &str) -> Result<bool> {
        force_release(&self.store, &self.holds, &LockName::new(name)?).await
    }

    /// A snapshot of lock `name`: holder, hold count, lease left, fencing token and waiters.
    ///
    /// # Cancel safety
    /// Cancel safe; it only reads.
    pub async fn state(&self, name: &str) -> Result<LockState> {
        self.store.inspect(&LockName::new(name)?).await
    }

    /// Locks whose names start with `prefix` that are held or waited for (`""`: every lock).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a prefix no lock name
    /// can start with: longer than [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) bytes, or containing
    /// a NUL byte.
    ///
    /// # Cancel safety
    /// Cancel safe; it only reads.
    pub async fn list(&self, prefix: &str) -> Result<Vec<LockSummary>> {
        crate::name::check_prefix(prefix)?;
        self.store.list(prefix).await
    }
}

/// The backend the core calls: `backend` itself, or with feature `metrics` a wrapper that
/// counts its errors.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
fn store(backend: &Arc<dyn LockBackend>, by_lock: bool) -> Arc<dyn LockBackend> {
    #[cfg(feature = "metrics")]
    return Arc::new(crate::telemetry::Metered {
        inner: backend.clone(),
        by_lock,
    });
    #[cfg(not(feature = "metrics"))]
    backend.clone()
}

/// Frees the current hold of `name`, if any: the one read, and no other. `false` from the
/// store is final, not a hold that changed meanwhile to be read again: a re-sent force
/// release whose first copy freed the hold may answer `false` (a store that forgot it, past
/// the resend horizon), and the lock may by then have gone to the next waiter, who must keep
/// it.
async fn force_release(
    backend: &Arc<dyn LockBackend>,
    holds: &Holds,
    name: &LockName,
) -> Result<bool> {
    let Some(holder) = backend.holder(name).await? else {
        return Ok(false);
    };
    let freed = backend.force_release(name, holder.token).await?;
    if freed {
        holds.revoke(name, &holder.owner, holder.token);
    }
    Ok(freed)
}

/// What a handle and its guards share.
#[derive(Debug)]
pub(crate) struct LockShared {
    pub(crate) backend: Arc<dyn LockBackend>,
    pub(crate) name: LockName,
    pub(crate) owner: Owner,
    pub(crate) options: LockOptions,
    pub(crate) holds: Arc<Holds>,
    /// The levels this handle's owner may have in the store (shared with `with_options`).
    pub(crate) levels: Arc<OwnLevels>,
    /// The labels of this handle's metrics.
    pub(crate) meter: Meter,
    /// When a call through this handle last had to wait (see `waiting.rs`).
    pub(crate) last_wait: std::sync::Mutex<Option<tokio::time::Instant>>,
}

/// One owner's handle on one fair lock.
///
/// **Guarantees.** Mutual exclusion between owners; owners are granted the lock in the order
/// they started waiting (FIFO), and nobody barges past the queue, not even `try_lock`. The
/// same owner acquiring again while it holds the lock re-enters it at once (each guard
/// releases one level). Every hold carries a fencing token greater than all earlier holds'.
/// Holds end with their lease: by default a watchdog renews a 30 s lease for as long as the
/// guard lives, so a crashed process blocks others for at most 30 s.
///
/// The handle is one owner: calls through it from different tasks at once are reentrant with
/// each other, so give each task its own handle ([`LockClient::fair_lock`]) unless you mean to
/// share the critical section. Each call is its own attempt: when the lock reaches the owner,
/// every waiting call gets its own level (the hold count is the number of live guards), and a
/// call that times out or is cancelled never takes another call's place or grant. It is
/// deliberately not `Clone`.
///
/// A level this handle gave up but the store kept (a release that a failover lost, or that
/// failed for longer than the outage budget) is never re-entered: re-entering it would reuse
/// its old fencing token and keep other owners waiting for as long as this handle keeps
/// locking. The next acquisition through the handle that finds it, when no other call of
/// the handle is under way, frees that hold (the owner waiting first gets the lock) and
/// queues behind the owners already waiting. (Handles from
/// [`LockClient::fair_lock_as`] share their owner, so they cannot tell.)
#[derive(Debug)]
pub struct FairLock {
    shared: Arc<LockShared>,
}

impl FairLock {
    /// Replaces this handle's options.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) if an option is out of range.
    pub fn with_options(self, options: LockOptions) -> Result<Self> {
        options.validate()?;
        Ok(FairLock {
            shared: Arc::new(LockShared {
                backend: self.shared.backend.clone(),
                name: self.shared.name.clone(),
                owner: self.shared.owner.clone(),
                options,
                holds: self.shared.holds.clone(),
                levels: self.shared.levels.clone(),
                meter: self.shared.meter.clone(),
                last_wait: std::sync::Mutex::new(None),
            }),
        })
    }

    /// Uses a fixed `lease` instead of the watchdog: the lock expires `lease` after each
    /// acquisition unless extended with [`LockGuard::extend`].
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a lease below 1 ms or
    /// above [`MAX_DURATION`](crate::MAX_DURATION).
    pub fn with_lease(self, lease: Duration) -> Result<Self> {
        let mut options = self.shared.options.clone();
        options.lease = Some(lease);
        self.with_options(options)
    }

    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.shared.name
    }

    /// The owner this handle acquires as.
    ///
    /// Reading it counts as sharing the owner (it may be passed to
    /// [`LockClient::fair_lock_as`]): from then on the handle re-enters a level the store
    /// kept after a lost release instead of freeing it (see [`FairLock`]), as handles that
    /// share an owner do; a hold it set out to free before, once none of its force releases
    /// can still reach the store within the resend horizon (a minute after one ended without
    /// an answer; until then its calls wait). The same holds for the guard's and the lease's
    /// `owner()`.
    pub fn owner(&self) -> &Owner {
        // It may now be shared through `fair_lock_as`: stop checking grants (see `levels.rs`).
        self.shared.levels.shared_out();
        &self.shared.owner
    }

    /// This handle's options.
    pub fn options(&self) -> &LockOptions {
        &self.shared.options
    }

    /// Waits for the lock, in FIFO order, for as long as it takes.
    ///
    /// While waiting, the handle heartbeats every `waiter_ttl / 3` to keep its place; if the
    /// process dies, the place is dropped after `waiter_ttl`. A wake-up that is lost is made up
    /// for by the next heartbeat.
    ///
    /// A store that fails transiently (a dropped connection, a failover) is ridden out: the
    /// call is retried with a capped back-off as the same attempt, so the caller keeps its
    /// place if the store is back within the waiter TTL of its last successful heartbeat
    /// (otherwise it queues again, at the tail).
    ///
    /// # Errors
    /// [`Error::Unavailable`](crate::Error::Unavailable) once the store has failed for the
    /// whole [`outage_budget`](crate::LockOptions::outage_budget) (30 s by default; each
    /// failing call may itself take up to the backend's command timeout); other backend
    /// errors at once (the caller then has left the queue).
    ///
    /// # Cancel safety
    /// Dropping the future at any point leaves nothing behind: the caller leaves the queue, and
    /// a grant that arrives after the drop is given back, in a background task. Like
    /// `tokio::sync::Mutex::lock`, cancelling loses the caller's place in the queue.
    ///
    /// # Examples
    /// ```
    /// # use fairlock::{LockClient, MemoryBackend};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> fairlock::Result<()> {
    /// let client = LockClient::new(MemoryBackend::new());
    /// let lock = client.fair_lock("jobs")?;
    /// let outer = lock.lock().await?;
    /// let inner = lock.lock().await?; // same owner: re-entered at once
    /// assert_eq!(inner.hold_count(), 2);
    /// assert_eq!(inner.fencing_token(), outer.fencing_token());
    /// inner.unlock().await?;
    /// outer.unlock().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn lock(&self) -> Result<LockGuard> {
        waiting::acquire(&self.shared, Wait::Forever).await
    }

    /// Acquires the lock only if that needs no waiting: it is free and nobody is queued, or
    /// this owner already holds it. Never joins the queue.
    ///
    /// Its calls to the store (usually one) are each bounded by the backend's own command
    /// timeout, not by a deadline of its own: for a bound of your choosing against a slow
    /// store, use [`try_lock_for`](Self::try_lock_for) with a short `wait`.
    ///
    /// # Errors
    /// [`Error::WouldBlock`](crate::Error::WouldBlock) if another owner holds it or anyone
    /// waits for it; backend errors.
    ///
    /// # Cancel safety
    /// If dropped while the request is in flight, a grant that arrives is given back.
    pub async fn try_lock(&self) -> Result<LockGuard> {
        waiting::acquire(&self.shared, Wait::No).await
    }

    /// Waits at most `wait` for the lock, in FIFO order, then gives up and leaves the queue
    /// (without delaying the waiters behind). A zero `wait` is [`try_lock`](Self::try_lock).
    ///
    /// With a `wait` above zero it returns within `wait` plus about 50 ms, whatever the store
    /// does: a call in flight at the deadline is given up, and leaving the queue goes on in the
    /// background if the store is slow to answer. A zero `wait` makes the calls `try_lock`
    /// makes (usually one), each bounded by the backend's own command timeout (10 s by
    /// default for Redis).
    ///
    /// # Errors
    /// [`Error::Timeout`](crate::Error::Timeout) when `wait` ran out while the lock was busy;
    /// [`Error::Unavailable`](crate::Error::Unavailable) when it ran out while the store was
    /// failing or had not answered for the longer of 250 ms and a quarter of `wait` (paused,
    /// unreachable);
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) if `wait` is above
    /// [`MAX_DURATION`](crate::MAX_DURATION); backend errors.
    ///
    /// # Cancel safety
    /// As for [`lock`](Self::lock).
    pub async fn try_lock_for(&self, wait: Duration) -> Result<LockGuard> {
        check_max("wait", wait)?;
        waiting::acquire(&self.shared, Wait::AtMost(wait)).await
    }

    /// Runs `work` under the lock: waits for it like [`lock`](Self::lock), runs the future
    /// that `work` returns, and releases the lock when it is done, whatever happens.
    ///
    /// If the lease is lost while the future runs (renewal failed until the lease ran out, a
    /// fixed lease ended, an operator force-unlocked it), the future is **dropped** at its next
    /// `.await` and `run` returns [`Error::LeaseLost`](crate::Error::LeaseLost), the way
    /// node-redlock's `using` hands an abort signal and etcd's `Session.Done()` is watched, but
    /// without the work having to check. A lease that runs out is dropped by its local
    /// deadline, which never comes after the store's, so the work never goes on while another
    /// owner may hold the lock that way. A force unlock is known at once when made through
    /// this client, and otherwise only at the next renewal (a third of the watchdog lease) or
    /// [`LockGuard::is_held`]: until then the next owner may already hold the lock, which is
    /// what the fencing token is for. The closure gets a [`Lease`]: the fencing token to pass to the resource you
    /// protect, and the lease's signal and time left.
    ///
    /// ```
    /// # use fairlock::{LockClient, MemoryBackend};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> fairlock::Result<()> {
    /// let client = LockClient::new(MemoryBackend::new());
    /// let lock = client.fair_lock("nightly-report")?;
    /// let rows = lock
    ///     .run(|lease| async move {
    ///         // The critical section: write with the fencing token, so that a store that
    ///         // saw a later token refuses a stale writer.
    ///         println!("writing the report with token {}", lease.fencing_token());
    ///         42
    ///     })
    ///     .await?;
    /// assert_eq!(rows, 42);
    /// assert!(lock.state().await?.holder.is_none()); // released
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// Dropping the future stops the work, and only at an `.await`: code that blocks the
    /// thread, or a task the work spawned, goes on (give such tasks the [`Lease`] and let them
    /// watch [`Lease::lease_lost`]). With a fixed lease ([`with_lease`](Self::with_lease)) the
    /// work must end within it, since the [`Lease`] cannot extend it: that makes `run` a
    /// deadline too.
    ///
    /// The lock is released with [`LockGuard::unlock`] once the work is done, and `run` returns
    /// when the store has answered. If the store then says the lease had ended,
    /// the result is [`Error::LeaseLost`](crate::Error::LeaseLost) and the work's value is
    /// dropped: the work may have overlapped another holder. If the release fails otherwise
    /// (the store is unreachable), the work did run under the lock: its value is returned and
    /// the failure only logged, and the store frees the lock when its lease ends. If the work
    /// panics, the panic goes on up and the lock is released in the background.
    ///
    /// # Errors
    /// As [`lock`](Self::lock); [`Error::LeaseLost`](crate::Error::LeaseLost) as above.
    ///
    /// # Cancel safety
    /// Dropping the future at any point leaves the lock released (or never taken): while
    /// waiting, as for [`lock`](Self::lock); while the work runs, the work is dropped and the
    /// lock released in the background; while releasing, the release is sent again from a
    /// background task.
    pub async fn run<F, Fut, T>(&self, work: F) -> Result<T>
    where
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = T>,
    {
        self.lock().await?.run(work).await
    }

    /// [`run`](Self::run) if the lock can be had without waiting, as
    /// [`try_lock`](Self::try_lock).
    ///
    /// ```
    /// # use fairlock::{Error, LockClient, MemoryBackend};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> fairlock::Result<()> {
    /// let client = LockClient::new(MemoryBackend::new());
    /// let held = client.fair_lock("cron")?.lock().await?;
    /// let other = client.fair_lock("cron")?;
    /// let skipped = other.try_run(|_lease| async { "ran" }).await;
    /// assert!(matches!(skipped, Err(Error::WouldBlock { .. })));
    /// held.unlock().await?;
    /// assert_eq!(other.try_run(|_lease| async { "ran" }).await?, "ran");
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`try_lock`](Self::try_lock) and [`run`](Self::run).
    ///
    /// # Cancel safety
    /// As for [`run`](Self::run).
    pub async fn try_run<F, Fut, T>(&self, work: F) -> Result<T>
    where
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = T>,
    {
        self.try_lock().await?.run(work).await
    }

    /// [`run`](Self::run) after waiting at most `wait` for the lock, as
    /// [`try_lock_for`](Self::try_lock_for). Only the wait is bounded, not the work.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use fairlock::{LockClient, MemoryBackend};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> fairlock::Result<()> {
    /// let client = LockClient::new(MemoryBackend::new());
    /// let lock = client.fair_lock("cron")?;
    /// let token = lock
    ///     .try_run_for(Duration::from_secs(1), |lease| async move { lease.fencing_token() })
    ///     .await?;
    /// assert!(token > 0);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`try_lock_for`](Self::try_lock_for) and [`run`](Self::run).
    ///
    /// # Cancel safety
    /// As for [`run`](Self::run).
    pub async fn try_run_for<F, Fut, T>(&self, wait: Duration, work: F) -> Result<T>
    where
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = T>,
    {
        self.try_lock_for(wait).await?.run(work).await
    }

    /// Frees this lock whoever holds it. See [`LockClient::force_unlock`].
    ///
    /// # Cancel safety
    /// If cancelled, it may or may not have been applied.
    pub async fn force_unlock(&self) -> Result<bool> {
        force_release(&self.shared.backend, &self.shared.holds, &self.shared.name).await
    }

    /// A snapshot of this lock. See [`LockClient::state`].
    ///
    /// # Cancel safety
    /// Cancel safe; it only reads.
    pub async fn state(&self) -> Result<LockState> {
        self.shared.backend.inspect(&self.shared.name).await
    }
}
